"""setuptools' entry point, here for cffi: the kernel modules and the parallel compiler come from build.py."""

import importlib.util
import os

from setuptools import setup

BUILD_FILE = "src/singa_backend_cpu/build.py"
_spec = importlib.util.spec_from_file_location("singa_backend_cpu_build", os.path.join(os.path.dirname(
    os.path.abspath(__file__)), BUILD_FILE))
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)

setup(cffi_modules=build.cffi_modules(BUILD_FILE), cmdclass={"build_ext": build.BuildExt, "sdist": build.Sdist})
