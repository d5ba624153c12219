"""SINGA's CPU backend: C kernels compiled at install time (cffi), OpenMP threads, OpenBLAS for matrix products.

Installed, it registers itself as the `cpu` backend through the `singa.backends` entry point; `singa.device` finds it.

Threads: one pool. `set_num_threads(n)` sets the OpenMP threads every kernel uses and keeps OpenBLAS at one thread:
matrix products and convolutions are split over the OpenMP threads, each calling OpenBLAS on its own part, so the
two libraries never keep two sets of spinning workers on the same cores. The default is SINGA_NUM_THREADS, else
OMP_NUM_THREADS, else every core this process may run on.
"""

from __future__ import annotations

import os

from singa import hookimpl
from singa_backend_cpu.backend import CpuBackend
from singa_backend_cpu.device import CpuDevice, lib

__all__ = ["CpuBackend", "CpuDevice", "get_num_threads", "set_num_threads", "singa_backend"]


def set_num_threads(n: int) -> None:
    """Use `n` threads for every kernel (OpenMP; OpenBLAS runs single-threaded inside them)."""
    n = int(n)
    if n < 1:
        raise ValueError(f"set_num_threads: need at least 1 thread, got {n}")
    lib.sg_set_num_threads(n)


def get_num_threads() -> int:
    return int(lib.sg_get_num_threads())


def _default_threads() -> int:
    for var in ("SINGA_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(var, "").split(",")[0].strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


set_num_threads(_default_threads())


@hookimpl
def singa_backend() -> CpuBackend:
    return CpuBackend()
