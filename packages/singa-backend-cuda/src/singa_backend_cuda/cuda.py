"""cffi (ABI mode) bindings of the CUDA driver API subset this backend uses, loaded from the NVIDIA driver.

Nothing is compiled: the declarations below are matched against `libcuda.so.1` (installed with the NVIDIA driver,
never from a wheel) at import time. When the library is missing, `lib` is None and `load_error` says why; the backend
then reports no devices instead of failing `import singa`. Symbols carry the `_v2` suffixes that cuda.h maps its
names to.

Kernels are launched with their arguments packed into one buffer (`CU_LAUNCH_PARAM_BUFFER_POINTER`), so a launch
from Python is one `struct.pack` and one call, with no per-argument allocation.
"""

from __future__ import annotations

import os

from cffi import FFI

ffi = FFI()
ffi.cdef("""
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef unsigned long long CUdeviceptr;

CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *version);
CUresult cuGetErrorName(CUresult error, const char **str);
CUresult cuGetErrorString(CUresult error, const char **str);

CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext *pctx);
CUresult cuMemGetInfo_v2(size_t *free, size_t *total);

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags);
CUresult cuMemFreeHost(void *p);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream);
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, CUstream stream);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char uc, size_t n, CUstream stream);
CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short us, size_t n, CUstream stream);
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int ui, size_t n, CUstream stream);

CUresult cuStreamCreate(CUstream *stream, unsigned int flags);
CUresult cuStreamDestroy_v2(CUstream stream);
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuEventCreate(CUevent *event, unsigned int flags);
CUresult cuEventDestroy_v2(CUevent event);
CUresult cuEventRecord(CUevent event, CUstream stream);
CUresult cuEventSynchronize(CUevent event);
CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end);

CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleUnload(CUmodule module);
CUresult cuModuleGetFunction(CUfunction *func, CUmodule module, const char *name);
CUresult cuFuncGetAttribute(int *pi, int attrib, CUfunction func);
CUresult cuFuncSetAttribute(CUfunction func, int attrib, int value);
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params,
                        void **extra);

CUresult cuStreamBeginCapture_v2(CUstream stream, int mode);
CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream);
CUresult cuGraphExecDestroy(CUgraphExec exec);
CUresult cuGraphDestroy(CUgraph graph);
""")

# -- constants (cuda.h) ------------------------------------------------------------------------------------------------
CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NO_DEVICE = 100
CU_STREAM_NON_BLOCKING = 1
CU_EVENT_DEFAULT = 0
CU_EVENT_DISABLE_TIMING = 2
CU_MEMHOSTALLOC_PORTABLE = 1
CU_STREAM_CAPTURE_MODE_RELAXED = 2
CU_LAUNCH_PARAM_END, CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE = 0, 1, 2
CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
ATTR = {
    "max_threads_per_block": 1,
    "max_shared_per_block": 8,
    "clock_khz": 13,
    "multiprocessors": 16,
    "pci_bus": 33,
    "pci_device": 34,
    "memory_clock_khz": 36,
    "memory_bus_width": 37,
    "l2_bytes": 38,
    "cc_major": 75,
    "cc_minor": 76,
    "max_shared_per_block_optin": 97,
}
# the oldest driver this backend runs on: its kernels are compiled by NVRTC 13 (CUDA 13 needs driver 580 or newer)
MIN_DRIVER = 13000


class CudaError(RuntimeError):
    """A CUDA driver call failed; `code` is the CUresult."""

    def __init__(self, code: int, what: str):
        self.code = code
        super().__init__(f"{what} failed: {error_text(code)}")


def error_text(code: int) -> str:
    """`NAME (code): description` of a CUresult."""
    if lib is None:
        return f"CUresult {code}"
    name, text = ffi.new("const char **"), ffi.new("const char **")
    n = ffi.string(name[0]).decode() if lib.cuGetErrorName(code, name) == 0 and name[0] != ffi.NULL else "?"
    t = ffi.string(text[0]).decode() if lib.cuGetErrorString(code, text) == 0 and text[0] != ffi.NULL else ""
    return f"{n} ({code}){': ' + t if t else ''}"


def check(code: int, what: str) -> None:
    if code != CUDA_SUCCESS:
        if code == CUDA_ERROR_OUT_OF_MEMORY:  # the pool empties its cache and retries on MemoryError
            raise MemoryError(f"{what} failed: {error_text(code)}")
        raise CudaError(code, what)


def _load():
    override = os.environ.get("SINGA_CUDA_DRIVER_LIBRARY")
    names = [override] if override else ["libcuda.so.1", "libcuda.so"]
    errors = []
    for name in names:
        try:
            return ffi.dlopen(name), None
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    return None, ("the NVIDIA driver library could not be loaded (" + "; ".join(errors) + "): install the NVIDIA "
                  "driver (libcuda.so.1 comes with it, not from pip)")


lib, load_error = _load()


def driver_version() -> int:
    """The driver's CUDA version as 1000 * major + 10 * minor (0 without a driver)."""
    if lib is None:
        return 0
    v = ffi.new("int *")
    return v[0] if lib.cuDriverGetVersion(v) == 0 else 0


def version_text(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


_init_error: str | None = None
_initialised = False


def init() -> str | None:
    """cuInit once; None when the driver answers, else why there is no usable CUDA device."""
    global _initialised, _init_error
    if _initialised:
        return _init_error
    _initialised = True
    if lib is None:
        _init_error = load_error
        return _init_error
    v = driver_version()
    if v and v < MIN_DRIVER:
        _init_error = (f"the NVIDIA driver supports CUDA {version_text(v)}, this backend needs CUDA "
                       f"{version_text(MIN_DRIVER)} or newer (driver 580+): update the driver")
        return _init_error
    code = lib.cuInit(0)
    if code == CUDA_ERROR_NO_DEVICE:
        _init_error = "the NVIDIA driver is installed but reports no CUDA device"
    elif code != CUDA_SUCCESS:
        _init_error = f"cuInit failed: {error_text(code)}"
    return _init_error


def device_count() -> int:
    if init() is not None:
        return 0
    n = ffi.new("int *")
    check(lib.cuDeviceGetCount(n), "cuDeviceGetCount")
    return n[0]


def attribute(dev: int, name: str) -> int:
    out = ffi.new("int *")
    check(lib.cuDeviceGetAttribute(out, ATTR[name], dev), f"cuDeviceGetAttribute({name})")
    return out[0]


def device_name(dev: int) -> str:
    buf = ffi.new("char[]", 256)
    check(lib.cuDeviceGetName(buf, 256, dev), "cuDeviceGetName")
    return ffi.string(buf).decode(errors="replace")


def total_memory(dev: int) -> int:
    out = ffi.new("size_t *")
    check(lib.cuDeviceTotalMem_v2(out, dev), "cuDeviceTotalMem")
    return out[0]
