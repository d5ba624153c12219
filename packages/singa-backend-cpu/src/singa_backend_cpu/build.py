"""Builds the CPU backend's kernels with cffi when the package is built (setup.py); nothing is compiled at import.

Every kernel (kernels/*.c and the element-wise code that codegen.py renders from singa.expressions.TABLE) is compiled
into one extension module per vector path, `singa_backend_cpu._kernels_<path>`, linked against scipy-openblas32's
OpenBLAS: on x86-64 `baseline` (-march=x86-64), `avx2` (-march=x86-64-v3) and `avx512` (-march=x86-64-v4), so that
one wheel runs on any x86-64 CPU at the speed of the widest path it supports; elsewhere one `baseline` module for the
compiler's default target. isa.py lists the paths and chooses one at import. `SINGA_CPU_NATIVE=1` builds a single
`_kernels_native` with -march=native instead: faster to build and tuned for this machine, but not portable. A tiny
`_cpu_level` module (cpu_level.c, baseline flags) tells which paths the CPU runs.

Flags of every path: `-O3 -g0 -fopenmp -fwrapv -fno-math-errno -fno-trapping-math -std=gnu11` (integer overflow wraps
like numpy; no errno or FP-trap bookkeeping, which only blocks vectorisation; never -ffast-math: NaN and inf keep
their meaning) plus the path's -march/-mtune.

`BuildExt` compiles the C files of each module in parallel, one compiler per core, printing each file as it starts
(`pip install -v` shows these lines). `Sdist` adds the rendered element-wise code to the source distribution, which
therefore builds without singa-core's sources next to it.
"""

from __future__ import annotations

import functools
import glob
import importlib
import importlib.util
import json
import os
import sys
import time
import types
from concurrent.futures import ThreadPoolExecutor

import scipy_openblas32
from cffi import FFI
from setuptools.command.build_ext import build_ext
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join(HERE, "kernels")
PROJECT = os.path.normpath(os.path.join(HERE, "..", ".."))
# In a source distribution: the element-wise C code and its cffi declarations, rendered when the sdist was made.
RENDERED = os.path.join(PROJECT, "rendered")
RENDERED_FILES = ("elementwise.c", "elementwise.cdef")
BASE_FLAGS = ["-O3", "-g0", "-fopenmp", "-fwrapv", "-fno-math-errno", "-fno-trapping-math", "-std=gnu11"]


def _load_by_path(name: str, filename: str) -> types.ModuleType:
    """A module of this package loaded from its file: importing the package would load the kernels being built."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, filename))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


isa = _load_by_path("singa_backend_cpu_isa", "isa.py")


def _expressions():
    """singa.expressions: from the singa-core sources next to this package in a checkout (the table these sources go
    with, whatever singa-core is installed), else from the installed singa-core."""
    src = os.path.normpath(os.path.join(PROJECT, "..", "singa-core", "src", "singa"))
    if os.path.isfile(os.path.join(src, "expressions.py")):
        # expressions needs only numpy and singa.dtypes: import the two under a stand-in `singa` package, without
        # singa/__init__ and its imports (pluggy), which a build environment may lack
        for name in [m for m in sys.modules if m == "singa" or m.startswith("singa.")]:
            del sys.modules[name]
        package = types.ModuleType("singa")
        package.__path__ = [src]
        sys.modules["singa"] = package
        return importlib.import_module("singa.expressions")
    try:
        from singa import expressions
    except ImportError:
        raise RuntimeError("building singa-backend-cpu needs singa-core's expression table: build it from the SINGA "
                           "repository (next to packages/singa-core), from its source distribution (which carries "
                           "the rendered kernels), or with singa-core installed and --no-build-isolation") from None
    return expressions


@functools.cache
def rendered() -> tuple[str, str]:
    """(C source, cffi cdef) of the generated kernels: from the sdist's copy when there is one, else rendered now."""
    files = [os.path.join(RENDERED, f) for f in RENDERED_FILES]
    if all(os.path.isfile(f) for f in files):
        texts = []
        for name in files:
            with open(name) as f:
                texts.append(f.read())
        return texts[0], texts[1]
    return _load_by_path("singa_backend_cpu_codegen", "codegen.py").render(_expressions().TABLE)


def _relative(path: str) -> str:
    # setuptools wants extension sources relative to the project (the directory setup.py runs in)
    return os.path.relpath(path)


def kernel_builder(path_name: str) -> FFI:
    """The cffi builder of `singa_backend_cpu._kernels_<path_name>`."""
    path = isa.by_name(path_name)
    generated_c, generated_cdef = rendered()
    flags = BASE_FLAGS + path.flags
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
        isa.module_name(path.name),
        source,
        sources=[_relative(p) for p in sorted(glob.glob(os.path.join(KERNELS, "*.c")))],
        # setuptools rebuilds a module only when a source or one of these is newer than it: without the headers, an
        # edit to a *_real.h alone left the old module in place
        depends=[_relative(p) for p in sorted(glob.glob(os.path.join(KERNELS, "*.h")))],
        include_dirs=[KERNELS, scipy_openblas32.get_include_dir()],
        library_dirs=[scipy_openblas32.get_lib_dir()],
        libraries=[scipy_openblas32.get_library()],
        extra_compile_args=flags,
        # OpenBLAS is found next to us in site-packages; device.py also preloads it, for editable installs
        extra_link_args=["-fopenmp", "-Wl,-rpath,$ORIGIN/../scipy_openblas32/lib"],
    )
    return builder


def cpu_level_builder() -> FFI:
    """The cffi builder of `singa_backend_cpu._cpu_level`: CPU feature detection, compiled for the baseline."""
    builder = FFI()
    builder.cdef("int sg_cpu_level(void);")
    flags = ["-O2", "-g0"] + isa.known_paths()[0].flags
    builder.set_source("singa_backend_cpu._cpu_level", "int sg_cpu_level(void);",
                       sources=[_relative(os.path.join(HERE, "cpu_level.c"))], extra_compile_args=flags,
                       # it calls nothing in libc, but auditwheel tells a wheel's libc from each module's needs
                       extra_link_args=["-Wl,--no-as-needed", "-lc"])
    return builder


# setup.py's cffi_modules name these: one builder per path that can be built, and the CPU detector
for _path in isa.known_paths():
    globals()[f"kernels_{_path.name}"] = functools.partial(kernel_builder, _path.name)


def cffi_modules(build_file: str) -> list[str]:
    """setup.py's `cffi_modules`: the detector and the kernel module of every path this build compiles."""
    return [f"{build_file}:cpu_level_builder"] + [f"{build_file}:kernels_{p.name}" for p in isa.build_paths()]


def _jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _say(line: str) -> None:
    # one write per line: the compiling threads print at the same time
    sys.stdout.write(f"singa-backend-cpu: {line}\n")
    sys.stdout.flush()


class BuildExt(build_ext):
    """build_ext that compiles an extension's C files in parallel and names each one as it starts.

    Every kernel module compiles the same C files with other flags, so each module gets its own folder of objects.
    """

    def run(self):
        paths = [p.name for p in isa.build_paths()]
        _say(f"compiling the kernels for the vector paths {', '.join(paths)}, {_jobs()} files at a time")
        # setuptools never empties build/lib (nor an editable install's source folder): a module of a path this build
        # does not make (from a native build before a portable one, say) would be installed too, and chosen at import
        outputs = [os.path.join(self.build_lib, "singa_backend_cpu")] + ([HERE] if self.inplace else [])
        for stale in [f for d in outputs for f in glob.glob(os.path.join(d, "_kernels_*"))]:
            if not any(os.path.basename(stale).startswith(f"_kernels_{name}.") for name in paths):
                os.remove(stale)
        super().run()

    def build_extension(self, ext):
        label = ext.name.rsplit(".", 1)[-1]
        compiler = self.compiler
        serial = compiler.compile
        jobs = _jobs()

        def compile_parallel(sources, output_dir=None, **kwargs):
            def one(source):
                full = os.path.abspath(source)
                shown = os.path.relpath(full, HERE) if full.startswith(HERE + os.sep) else os.path.basename(full)
                _say(f"[{label}] compiling {shown}")
                return serial([source], output_dir=output_dir, **kwargs)

            with ThreadPoolExecutor(jobs) as pool:
                return [obj for objs in pool.map(one, sources) for obj in objs]

        temp = self.build_temp
        start = time.perf_counter()
        compiler.compile = compile_parallel
        self.build_temp = os.path.join(temp, label)
        try:
            super().build_extension(ext)
        finally:
            self.build_temp = temp
            compiler.compile = serial
        _say(f"[{label}] built in {time.perf_counter() - start:.0f} s")


class Sdist(sdist):
    """sdist that carries the element-wise kernels rendered from singa-core's expression table (see `rendered`)."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        target = os.path.join(base_dir, os.path.relpath(RENDERED, PROJECT))
        os.makedirs(target, exist_ok=True)
        for name, text in zip(RENDERED_FILES, rendered()):
            with open(os.path.join(target, name), "w") as f:
                f.write(text)
