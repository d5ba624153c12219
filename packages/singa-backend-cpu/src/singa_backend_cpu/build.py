"""cffi API-mode builder of `singa_backend_cpu._kernels`, run by setup.py (`cffi_modules`) when the package is built.

It compiles kernels/*.c and the element-wise code that codegen.py renders from singa.expressions.TABLE into one
extension, linked against scipy-openblas32's OpenBLAS. Nothing is compiled at import time.

Compiler flags: `-O3 -g0 -fopenmp -fwrapv -fno-math-errno -fno-trapping-math` always (integer overflow wraps like numpy;
no errno or FP-trap bookkeeping, which only blocks vectorisation; never -ffast-math: NaN and inf keep their meaning),
plus `-march=native` unless the environment variable SINGA_CPU_CFLAGS is set, in which case its words replace
`-march=native` (e.g. SINGA_CPU_CFLAGS="-march=x86-64-v3" for a wheel that runs on other machines, or "" for the
compiler's default target).
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shlex
import sys
import types

import scipy_openblas32
from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join(HERE, "kernels")
BASE_FLAGS = ["-O3", "-g0", "-fopenmp", "-fwrapv", "-fno-math-errno", "-fno-trapping-math", "-std=gnu11"]


def _expressions():
    """singa.expressions, from the installed singa-core or, in pip's isolated build, from the sibling source tree."""
    try:
        from singa import expressions

        return expressions
    except ImportError:
        pass
    src = os.path.normpath(os.path.join(HERE, "..", "..", "..", "singa-core", "src"))
    if not os.path.isfile(os.path.join(src, "singa", "expressions.py")):
        raise RuntimeError("building singa-backend-cpu needs singa-core: install it first and build with "
                           "--no-build-isolation, or build from the SINGA repository next to packages/singa-core")
    sys.path.insert(0, src)
    for name in [m for m in sys.modules if m == "singa" or m.startswith("singa.")]:
        del sys.modules[name]
    try:
        from singa import expressions

        return expressions
    except ImportError:
        # singa/__init__ imports pluggy, which the build environment lacks; expressions only needs numpy and dtypes,
        # so stand in an empty package for `singa` and import the two modules alone
        for name in [m for m in sys.modules if m == "singa" or m.startswith("singa.")]:
            del sys.modules[name]
        package = types.ModuleType("singa")
        package.__path__ = [os.path.join(src, "singa")]
        sys.modules["singa"] = package
        from singa import expressions

        return expressions


def _codegen():
    """codegen.py loaded by path: importing the package itself would try to load the extension being built."""
    spec = importlib.util.spec_from_file_location("singa_backend_cpu_codegen", os.path.join(HERE, "codegen.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def compile_flags() -> list[str]:
    arch = os.environ.get("SINGA_CPU_CFLAGS")
    return BASE_FLAGS + (shlex.split(arch) if arch is not None else ["-march=native"])


def _relative(path: str) -> str:
    # setuptools wants extension sources relative to the project (the directory setup.py runs in)
    return os.path.relpath(path)


def make_builder() -> FFI:
    generated_c, generated_cdef = _codegen().render(_expressions().TABLE)
    flags = compile_flags()
    with open(os.path.join(KERNELS, "api.h")) as f:
        api = f.read()
    builder = FFI()
    builder.cdef(api + generated_cdef + """
        const char *sg_build_flags(void);
        char *scipy_openblas_get_config(void);
        int scipy_openblas_get_num_threads(void);
    """)
    source = (
        generated_c
        + '\n#include "cblas.h"\n'
        + f"const char *sg_build_flags(void) {{ return {json.dumps(' '.join(flags))}; }}\n"
    )
    builder.set_source(
        "singa_backend_cpu._kernels",
        source,
        sources=[_relative(p) for p in sorted(glob.glob(os.path.join(KERNELS, "*.c")))],
        include_dirs=[KERNELS, scipy_openblas32.get_include_dir()],
        library_dirs=[scipy_openblas32.get_lib_dir()],
        libraries=[scipy_openblas32.get_library()],
        extra_compile_args=flags,
        # OpenBLAS is found next to us in site-packages; device.py also preloads it, for editable installs
        extra_link_args=["-fopenmp", "-Wl,-rpath,$ORIGIN/../scipy_openblas32/lib"],
    )
    return builder


ffibuilder = make_builder()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
