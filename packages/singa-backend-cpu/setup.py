# Only here for cffi: `cffi_modules` builds singa_backend_cpu._kernels (see src/singa_backend_cpu/build.py).
from setuptools import setup

setup(cffi_modules=["src/singa_backend_cpu/build.py:ffibuilder"])
