"""The CPU device: 64-byte aligned host blocks from the C allocator, copies with memmove, kernels from table.py.

The kernels come from the module of the vector path isa.choose() picks (the widest this CPU runs, or SINGA_CPU_ISA).
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import scipy_openblas32

from singa import dtypes
from singa.backend import Device, is_contiguous, numel
from singa_backend_cpu import isa

# How long an idle OpenMP thread busy-waits for the next parallel region before sleeping. libgomp's default (300,000
# spins, about a millisecond or more) keeps a core busy long after the work ends, which a shared machine pays for; too
# short a spin puts the workers to sleep between back-to-back kernels, and waking a sleeping CPU is slow in a virtual
# machine (tens of microseconds each: a replayed ShuffleNet of 76 kernels took 6.4-7.7 ms at 1,000 spins and 3.9-5.3 ms
# at 20,000 on a 2-vCPU Xeon, whose PAUSE takes about 14 ns: 20,000 spins are about 0.3 ms there).
# libgomp reads it once, when the extension loads it; a user's own setting wins.
DEFAULT_GOMP_SPINCOUNT = "20000"


def _load_kernels():
    """(vector path, ffi, lib) of the kernel module isa.choose() picks, with scipy-openblas32's library loaded first,
    its symbols global.

    The extension's rpath ($ORIGIN/../scipy_openblas32/lib) finds OpenBLAS in a normal install; an editable install
    keeps the extension in the source tree, where only this preload does.
    """
    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = DEFAULT_GOMP_SPINCOUNT
    path = os.path.join(scipy_openblas32.get_lib_dir(), scipy_openblas32.get_library(fullname=True))
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)  # stays loaded for the life of the process
    vector_path = isa.choose()
    kernels = isa.load(vector_path)
    return vector_path, kernels.ffi, kernels.lib


# Every kernel module has the same functions: table.py and the rest only ever see the chosen one as `ffi, lib`.
VECTOR_PATH, ffi, lib = _load_kernels()


def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc; absent on musl and other C libraries
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _malloc_trim()


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


class CpuDevice(Device):
    backend_name = "cpu"
    dtypes = dtypes.ALL + (dtypes.float64,)  # every kernel computes float64 where it computes float32
    host_memory = True  # buffers are blocks of this process's memory: MPI reads and writes them in place
    # oneDNN's sum post-op adds what the output holds: a residual already there is not copied (see table._conv_forward)
    shares_output_with = {"conv2d_fused": "residual"}

    def __init__(self, id: int = 0):
        super().__init__(id)
        from singa_backend_cpu.table import kernels

        self.kernels = kernels

    @property
    def channel_block(self) -> int:  # type: ignore[override]
        """oneDNN's channel block where it runs the convolutions (conv2d_fused's `blocks`), else 0."""
        from singa_backend_cpu import onednn

        return onednn.channel_block()

    def _raw_alloc(self, nbytes: int):
        handle = lib.sg_alloc(nbytes)
        if handle == ffi.NULL:
            raise MemoryError(f"cpu:{self.id}: cannot allocate {nbytes} bytes of host memory")
        return handle

    def _raw_free(self, handle) -> None:
        lib.sg_free(handle)

    def _copy_from_host(self, handle, byte_offset: int, host: np.ndarray) -> None:
        lib.sg_memcopy(handle, byte_offset, ffi.from_buffer(host), 0, host.nbytes)

    def _copy_to_host(self, handle, byte_offset: int, host: np.ndarray) -> None:
        lib.sg_memcopy(ffi.from_buffer(host, require_writable=True), 0, handle, byte_offset, host.nbytes)

    def _copy_on_device(self, dst, dst_off: int, src, src_off: int, nbytes: int) -> None:
        lib.sg_memcopy(dst, dst_off, src, src_off, nbytes)

    def host_buffer(self, view):
        """The bytes of a contiguous view, writable, without a copy (valid while the view's buffer lives)."""
        isz = dtypes.itemsize(view.dtype)
        n = 1
        for d in view.shape:
            n *= d
        return ffi.buffer(ffi.cast("char *", view.buffer.handle) + view.offset * isz, n * isz)

    def find_label_outside(self, view, classes: int) -> int:
        """A scan of the labels where they lie (the default copies them to the host for numpy: tens of microseconds
        of a small model's step)."""
        if view.dtype not in (dtypes.int32, dtypes.int64) or not is_contiguous(view):
            return super().find_label_outside(view, classes)
        return lib.sg_find_label_outside(view.dtype, view.buffer.handle, view.offset, numel(view.shape), classes)

    def synchronize(self) -> None:
        """Kernels run synchronously on the calling thread (and its OpenMP team): nothing to wait for."""

    def trim(self) -> None:
        """glibc keeps freed blocks below its mmap threshold (which grows to 32 MiB as large blocks are freed) in the
        heap: malloc_trim gives the free pages back."""
        if _MALLOC_TRIM is not None:
            _MALLOC_TRIM(0)

    def description(self) -> str:
        return (f"{self.name} ({_cpu_model()}, {os.cpu_count()} logical cores, {lib.sg_get_num_threads()} threads; "
                f"OpenBLAS {scipy_openblas32.__version__})")
