"""Vector paths: the kernels are built once per x86-64 level, and the widest one this CPU runs is loaded at import.

A wheel must run on any x86-64 CPU, so nothing in it may assume more than the baseline (SSE2); the hot loops are
worth several times more with AVX2+FMA or AVX-512. Every kernel is therefore compiled into one extension module per
path (`_kernels_baseline`, `_kernels_avx2`, `_kernels_avx512`; one `_kernels_baseline` on other architectures),
and `choose()` picks one from what the CPU and the OS support (`_cpu_level`, cpuid and xgetbv in cpu_level.c).

A local build may instead tune for its own machine: `SINGA_CPU_NATIVE=1` at build time compiles a single
`_kernels_native` with `-march=native`, which is then always chosen (it runs only on CPUs like the one that built it).
`SINGA_CPU_ISA=baseline|avx2|avx512|native` at run time forces a path that is built and that this CPU runs, e.g. to
test the narrower paths on a wide machine.

This module is also read by build.py (by path, before the package exists), so it imports nothing of the package at
module level.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform

FORCE_VARIABLE = "SINGA_CPU_ISA"
NATIVE_VARIABLE = "SINGA_CPU_NATIVE"
NATIVE = "native"


class Path:
    """One build of the kernels: its name, the x86-64 level it needs, its compiler flags, what it adds."""

    def __init__(self, name: str, level: int, flags: list[str], summary: str):
        self.name, self.level, self.flags, self.summary = name, level, flags, summary


# -mtune=generic: a wheel runs on every vendor's CPUs, so it is tuned for none in particular. Its vector width for
# x86-64-v4 is 256 bits; -mprefer-vector-width=512 makes the compiled loops use the AVX-512 registers the path exists
# for (exp, erf and tanh loops single-threaded on an Intel Xeon, model 207: 0.75x the time)
X86_64 = [
    Path("baseline", 0, ["-march=x86-64", "-mtune=generic"], "x86-64: SSE2"),
    Path("avx2", 3, ["-march=x86-64-v3", "-mtune=generic"], "x86-64-v3: AVX2, FMA, F16C"),
    Path("avx512", 4, ["-march=x86-64-v4", "-mtune=generic", "-mprefer-vector-width=512"],
         "x86-64-v4: AVX-512 F, BW, CD, DQ, VL; 512-bit vectors"),
]
# Other architectures: the compiler's default target (on arm64 that includes NEON)
OTHER = [Path("baseline", 0, [], f"{platform.machine() or 'this architecture'}: the compiler's default target")]
NATIVE_PATH = Path(NATIVE, 99, ["-march=native"], "-march=native: tuned for the CPU that built it")


def is_x86_64(machine: str | None = None) -> bool:
    return (machine or platform.machine()).lower() in ("x86_64", "amd64")


def known_paths(machine: str | None = None) -> list[Path]:
    """Every path that can be built on this architecture, narrowest first, the native one last."""
    return [*(X86_64 if is_x86_64(machine) else OTHER), NATIVE_PATH]


def build_paths(machine: str | None = None) -> list[Path]:
    """The paths a build compiles: the portable set, or only the native one when SINGA_CPU_NATIVE=1."""
    if os.environ.get(NATIVE_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on"):
        return [NATIVE_PATH]
    return X86_64 if is_x86_64(machine) else OTHER


def by_name(name: str) -> Path:
    for p in known_paths():
        if p.name == name:
            return p
    raise KeyError(name)


def module_name(name: str) -> str:
    return f"singa_backend_cpu._kernels_{name}"


def built() -> list[str]:
    """The paths this install has a kernel module for, narrowest first."""
    return [p.name for p in known_paths() if importlib.util.find_spec(module_name(p.name)) is not None]


def cpu_level() -> int:
    """0, 3 or 4: the highest x86-64 level this CPU and OS run (0 on other architectures)."""
    from singa_backend_cpu import _cpu_level

    return int(_cpu_level.lib.sg_cpu_level())


def runs_here(name: str) -> bool:
    """Whether this CPU runs the path's instructions; a native build runs on the machine that built it."""
    return name == NATIVE or by_name(name).level <= cpu_level()


def choose() -> str:
    """The path to load: SINGA_CPU_ISA when set (it must be built and run here), else the widest one that runs."""
    have = built()
    forced = os.environ.get(FORCE_VARIABLE, "").strip().lower()
    if forced:
        if forced not in [p.name for p in known_paths()]:
            raise RuntimeError(f"{FORCE_VARIABLE}={forced}: unknown vector path; this architecture has "
                               f"{', '.join(p.name for p in known_paths())}")
        if forced not in have:
            raise RuntimeError(f"{FORCE_VARIABLE}={forced}: this install of singa-backend-cpu has no {forced} kernels "
                               f"(it has: {', '.join(have) or 'none'}; SINGA_CPU_NATIVE=1 at build time builds only "
                               "the native path)")
        if not runs_here(forced):
            raise RuntimeError(f"{FORCE_VARIABLE}={forced}: this CPU cannot run the {forced} kernels "
                               f"({by_name(forced).summary}); its widest path is {widest_supported()}")
        return forced
    runnable = [name for name in have if runs_here(name)]
    if not runnable:
        raise RuntimeError(f"singa-backend-cpu: no kernel module that this CPU runs (built: "
                           f"{', '.join(have) or 'none'}); reinstall the package")
    return runnable[-1]


def widest_supported() -> str:
    """The widest portable path this CPU runs, whether built or not (for messages and `singa info`)."""
    level = cpu_level()
    fits = [p.name for p in known_paths() if p.name != NATIVE and p.level <= level]
    return fits[-1]


def load(name: str):
    """The kernel module of path `name` (its `ffi` and `lib`)."""
    return importlib.import_module(module_name(name))
