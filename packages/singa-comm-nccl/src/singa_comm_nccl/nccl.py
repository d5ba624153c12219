"""cffi (ABI mode) bindings of the NCCL 2 API subset this communicator uses.

Nothing is compiled: the declarations below are matched against `libnccl.so.2` at import time, found in NVIDIA's
`nvidia-nccl-cu13` wheel (site-packages/nvidia/nccl/lib), else through the system's loader; SINGA_NCCL_LIBRARY names
another file. When no library loads, `lib` is None and `load_error` says why; the communicator then reports it instead
of failing `import singa`. NCCL loads without a GPU (it opens the CUDA driver only when a communicator is created).
"""

from __future__ import annotations

import importlib.util
import os

from cffi import FFI

from singa import dtypes

ffi = FFI()
ffi.cdef("""
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct ncclComm *ncclComm_t;
typedef int ncclResult_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef void *cudaStream_t;

ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
const char *ncclGetErrorString(ncclResult_t result);
const char *ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
""")

UNIQUE_ID_BYTES = 128
SUCCESS, IN_PROGRESS = 0, 7
SUM = 0
INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, FLOAT32, FLOAT64 = 0, 1, 2, 3, 4, 5, 6, 7, 8
# SINGA dtype -> NCCL type for sums; bool is never summed (broadcasts and gathers move bytes as UINT8)
DTYPES = {dtypes.float32: FLOAT32, dtypes.float16: FLOAT16, dtypes.float64: FLOAT64, dtypes.int32: INT32,
          dtypes.int64: INT64}

RESULTS = {0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError",
           4: "ncclInvalidArgument", 5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress",
           8: "ncclTimeout"}


class NcclError(RuntimeError):
    """An NCCL call failed; the message names the call, the rank, NCCL's result and its last error."""

    def __init__(self, code: int, what: str, detail: str = ""):
        self.code = code
        text = ffi.string(lib.ncclGetErrorString(code)).decode(errors="replace") if lib is not None else ""
        extra = f"; {detail}" if detail else ""
        super().__init__(f"{what} failed: {RESULTS.get(code, 'unknown result')} ({code}): {text}{extra}")


def check(code: int, what: str, comm=None) -> None:
    if code != SUCCESS:
        detail = ""
        if comm is not None and lib is not None:
            detail = ffi.string(lib.ncclGetLastError(comm)).decode(errors="replace")
        raise NcclError(code, what, detail)


def candidates() -> list[str]:
    """Where libnccl.so.2 is looked for, in order."""
    override = os.environ.get("SINGA_NCCL_LIBRARY")
    if override:
        return [override]
    out = []
    spec = importlib.util.find_spec("nvidia")  # the namespace package NVIDIA's wheels install into
    if spec is not None and spec.submodule_search_locations:
        for base in spec.submodule_search_locations:
            path = os.path.join(base, "nccl", "lib", "libnccl.so.2")
            if os.path.isfile(path):
                out.append(path)
    out.append("libnccl.so.2")
    return out


def _load():
    errors = []
    for name in candidates():
        try:
            return ffi.dlopen(name), name, None
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    return None, None, ("NCCL could not be loaded (" + "; ".join(errors) + "); install it with "
                        "`pip install nvidia-nccl-cu13` (a dependency of singa-comm-nccl on Linux)")


lib, path, load_error = _load()


def version() -> str | None:
    """NCCL's version as 'major.minor.patch', or None without the library."""
    if lib is None:
        return None
    v = ffi.new("int *")
    check(lib.ncclGetVersion(v), "ncclGetVersion")
    code = v[0]  # major * 10000 + minor * 100 + patch since NCCL 2.9
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


def unique_id() -> bytes:
    """A fresh ncclUniqueId (rank 0 makes it; every rank of the communicator must receive the same bytes)."""
    if lib is None:
        raise NcclError(-1, "ncclGetUniqueId", load_error)
    uid = ffi.new("ncclUniqueId *")
    check(lib.ncclGetUniqueId(uid), "ncclGetUniqueId")
    return bytes(ffi.buffer(uid))
