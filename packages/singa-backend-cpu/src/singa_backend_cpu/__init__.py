"""SINGA's CPU backend: C kernels compiled at install time (cffi), OpenMP threads, oneDNN (x86-64 Linux) and OpenBLAS
for matrix products.

Installed, it registers itself as the `cpu` backend through the `singa.backends` entry point; `singa.device` finds it.

Threads: one pool. `set_num_threads(n)` sets the OpenMP threads every kernel (oneDNN's too) uses and keeps OpenBLAS at
one thread: the products and convolutions OpenBLAS computes are split over the OpenMP threads, each calling it on its
own part, so two libraries never keep two sets of spinning workers on the same cores. The default is
SINGA_NUM_THREADS, else OMP_NUM_THREADS, else every core this process may run on. A count above
MAX_THREADS_PER_CORE threads per core is capped there with a warning (tens of thousands of OpenMP threads exhaust the
process before any kernel runs); an environment value that is not a positive integer is ignored with a warning.

Placement: when the threads are as many as the CPUs this process may use (the default), each OpenMP worker is pinned
to a CPU of its own and the thread that set the count keeps off those CPUs before each kernel (kernels/memory.c), so
that the scheduler never leaves two of them on one CPU; SINGA_CPU_PIN=0 leaves placement to the operating system.
"""

from __future__ import annotations

import operator
import os
import warnings

from singa import hookimpl
from singa_backend_cpu.backend import CpuBackend
from singa_backend_cpu.device import CpuDevice, ffi, lib

__all__ = ["CpuBackend", "CpuDevice", "get_num_threads", "set_num_threads", "singa_backend"]


MAX_THREADS_PER_CORE = 4
PIN_SETTING = "SINGA_CPU_PIN"
_pinned: list[int] = []  # the CPU of each pinned thread (the caller's first), empty when none is


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
    n = _capped(n, f"set_num_threads({n})")
    lib.sg_set_num_threads(n)
    _place_threads(n)


def _place_threads(n: int) -> None:
    """Pin each of the `n` threads' workers to a CPU of its own when they are as many as the process's CPUs (several
    processes sized so then share the CPUs evenly; fewer threads leave the scheduler room, and are left to it)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux: the scheduler places them
        return
    pin = n > 1 and n == len(cpus) and os.environ.get(PIN_SETTING, "").strip() != "0"
    if not pin and not _pinned:
        return
    every = ffi.new("int[]", cpus)
    if _pinned:  # first free the workers pinned before (a team of their count), then pin the new team
        lib.sg_pin_workers(ffi.NULL, len(_pinned), every, len(cpus))
        _pinned.clear()
    if pin and lib.sg_pin_workers(every, n, every, len(cpus)) == 0:  # thread t on cpus[t]
        _pinned.extend(cpus)


if hasattr(os, "register_at_fork"):  # a forked child has none of the pinned workers (memory.c forgets them too)
    os.register_at_fork(after_in_child=_pinned.clear)


def placement() -> str:
    """Where the threads run, in words (for `python -m singa info`)."""
    if _pinned:
        return (f"each OpenMP worker on a CPU of its own ({', '.join(map(str, _pinned[1:]))}), the calling thread "
                f"kept on the others ({PIN_SETTING}=0 turns this off)")
    if os.environ.get(PIN_SETTING, "").strip() == "0":
        why = f"{PIN_SETTING}=0"
    else:
        why = "one thread" if get_num_threads() < 2 else "the threads are not as many as the process's CPUs"
    return f"left to the operating system ({why})"


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
