"""cffi (ABI mode) bindings of cuBLAS from the nvidia-cublas wheel, and the row-major batched GEMM the table uses.

Loaded on first use (`get()`); a missing wheel raises `libs.MissingLibrary` naming it. Device pointers are declared
as 64-bit integers (the same registers as pointers on every 64-bit ABI), so a call passes the CUdeviceptr as it is.

cuBLAS is column-major: a row-major C (m x n) = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T,
which is the same memory. float32 products use FMA kernels unless TF32 is switched on (`SINGA_CUDA_TF32=1` or
`device.set_tf32(True)`: about 3 more digits lost per product, several times faster); float16 products run on the
tensor cores and accumulate in float32; float64 products are exact IEEE.
"""

from __future__ import annotations

from cffi import FFI

from singa_backend_cuda import libs

ffi = FFI()
ffi.cdef("""
typedef int cublasStatus_t;
typedef struct cublasContext *cublasHandle_t;
cublasStatus_t cublasCreate_v2(cublasHandle_t *handle);
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle);
cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int *version);
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, void *stream);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, int mode);
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, uint64_t workspace, size_t bytes);
const char *cublasGetStatusString(cublasStatus_t status);
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, int transa, int transb, int m, int n, int k,
    const void *alpha, uint64_t A, int Atype, int lda, long long strideA, uint64_t B, int Btype, int ldb,
    long long strideB, const void *beta, uint64_t C, int Ctype, int ldc, long long strideC, int batchCount,
    int computeType, int algo);
""")

SONAME = "libcublas.so.13"
OP_N, OP_T = 0, 1
R_32F, R_64F, R_16F = 0, 1, 2
COMPUTE_32F, COMPUTE_32F_FAST_TF32, COMPUTE_64F = 68, 77, 70
DEFAULT_MATH, TF32_TENSOR_OP_MATH = 0, 3
GEMM_DEFAULT = -1
WORKSPACE = 32 << 20  # given to cuBLAS so that it never allocates inside a captured CUDA graph

_lib = None


class CublasError(RuntimeError):
    """A cuBLAS call failed."""


def get():
    global _lib
    if _lib is None:
        _lib, _ = libs.load(SONAME, ffi)
    return _lib


def check(status: int, what: str) -> None:
    if status != 0:
        text = ffi.string(get().cublasGetStatusString(status)).decode()
        raise CublasError(f"{what} failed: {text} ({status})")


class Handle:
    """A cuBLAS handle bound to one device's stream, with its own workspace."""

    def __init__(self, stream: int, workspace_ptr: int, tf32: bool):
        lib = get()
        h = ffi.new("cublasHandle_t *")
        check(lib.cublasCreate_v2(h), "cublasCreate")
        self.handle = h[0]
        check(lib.cublasSetStream_v2(self.handle, ffi.cast("void *", stream)), "cublasSetStream")
        check(lib.cublasSetWorkspace_v2(self.handle, workspace_ptr, WORKSPACE), "cublasSetWorkspace")
        self.tf32 = None
        self.set_tf32(tf32)

    def set_tf32(self, on: bool) -> None:
        if on != self.tf32:
            check(get().cublasSetMathMode(self.handle, TF32_TENSOR_OP_MATH if on else DEFAULT_MATH),
                  "cublasSetMathMode")
            self.tf32 = on

    def version(self) -> int:
        v = ffi.new("int *")
        check(get().cublasGetVersion_v2(self.handle, v), "cublasGetVersion")
        return v[0]

    def gemm(self, dtype: str, ta: bool, tb: bool, m: int, n: int, k: int, alpha: float, a: int, sa: int, b: int,
             sb: int, beta: float, c: int, batch: int) -> None:
        """Row-major C_i = alpha op(A_i) op(B_i) + beta C_i for i < batch. a, b, c are device addresses of the first
        matrices; A_i starts sa elements after A_{i-1} (0 broadcasts one matrix), B_i likewise, C_i are contiguous
        (m, n) blocks. `dtype` is float16, float32 or float64."""
        if dtype == "float64":
            ab_type, scalar, compute = R_64F, "double *", COMPUTE_64F
        else:
            ab_type = R_32F if dtype == "float32" else R_16F
            scalar = "float *"
            compute = COMPUTE_32F_FAST_TF32 if dtype == "float32" and self.tf32 else COMPUTE_32F
        lda, ldb = (m if ta else k), (k if tb else n)
        status = get().cublasGemmStridedBatchedEx(
            self.handle, OP_T if tb else OP_N, OP_T if ta else OP_N, n, m, k, ffi.new(scalar, alpha), b, ab_type,
            ldb, sb, a, ab_type, lda, sa, ffi.new(scalar, beta), c, ab_type, n, m * n, batch, compute, GEMM_DEFAULT)
        check(status, f"cublasGemmStridedBatchedEx({dtype}, m={m}, n={n}, k={k}, batch={batch}, trans_a={ta}, "
                      f"trans_b={tb})")

    def close(self) -> None:
        if self.handle is not None:
            get().cublasDestroy_v2(self.handle)
            self.handle = None
