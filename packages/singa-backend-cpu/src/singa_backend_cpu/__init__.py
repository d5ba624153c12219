"""SINGA's CPU backend: C kernels compiled at install time (cffi), OpenMP threads, oneDNN (x86-64 Linux) and OpenBLAS
for matrix products.

Installed, it registers itself as the `cpu` backend through the `singa.backends` entry point; `singa.device` finds it.

Threads: one pool. `set_num_threads(n)` sets the OpenMP threads every kernel (oneDNN's too) uses and keeps OpenBLAS at
one thread: the products and convolutions OpenBLAS computes are split over the OpenMP threads, each calling it on its
own part, so two libraries never keep two sets of spinning workers on the same cores. The default is
SINGA_NUM_THREADS, else OMP_NUM_THREADS, else every core this process may run on. A count above
MAX_THREADS_PER_CORE threads per core is capped there with a warning (tens of thousands of OpenMP threads exhaust the
process before any kernel runs); an environment value that is not a positive integer is ignored with a warning.
"""

from __future__ import annotations

import operator
import os
import warnings

from singa import hookimpl
from singa_backend_cpu.backend import CpuBackend
from singa_backend_cpu.device import CpuDevice, lib

__all__ = ["CpuBackend", "CpuDevice", "get_num_threads", "set_num_threads", "singa_backend"]


MAX_THREADS_PER_CORE = 4


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _capped(n: int, source: str) -> int:
    cap = MAX_THREADS_PER_CORE * _cores()
    if n > cap:
        warnings.warn(f"singa cpu backend: {source} asks for {n} threads, more than {MAX_THREADS_PER_CORE} per core "
                      f"({_cores()} cores); using {cap}", RuntimeWarning, stacklevel=3)
        return cap
    return n


def set_num_threads(n: int) -> None:
    """Use `n` threads for every kernel (OpenMP; OpenBLAS runs single-threaded inside them); at most
    MAX_THREADS_PER_CORE per core (more is capped, with a warning)."""
    if isinstance(n, bool):
        raise TypeError("set_num_threads: the thread count must be an integer, got a bool")
    try:
        n = operator.index(n)
    except TypeError:
        raise TypeError(f"set_num_threads: the thread count must be an integer, got {n!r}") from None
    if n < 1:
        raise ValueError(f"set_num_threads: need at least 1 thread, got {n}")
    lib.sg_set_num_threads(_capped(n, f"set_num_threads({n})"))


def get_num_threads() -> int:
    return int(lib.sg_get_num_threads())


def _default_threads() -> int:
    for var in ("SINGA_NUM_THREADS", "OMP_NUM_THREADS"):
        raw = os.environ.get(var, "")
        value = raw.split(",")[0].strip()  # OMP_NUM_THREADS may list one count per nesting level
        if not value:
            continue
        if value.isascii() and value.isdigit() and int(value) > 0:
            return _capped(int(value), f"{var}={raw}")
        warnings.warn(f"singa cpu backend: {var}={raw!r} is not a positive integer; ignored", RuntimeWarning,
                      stacklevel=2)
    return _cores()


set_num_threads(_default_threads())


@hookimpl
def singa_backend() -> CpuBackend:
    return CpuBackend()
