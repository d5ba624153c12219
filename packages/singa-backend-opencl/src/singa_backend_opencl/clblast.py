"""cffi (ABI mode) bindings of the CLBlast GEMM routines (Debian's libclblast1), on the OpenCL types of `cl.py`.

Only the matrix products are bound: single and double precision plain, batched (an offset per matrix, so a broadcast
operand is the same offset repeated) and strided-batched, plus the half-precision product for devices with
cl_khr_fp16. When the library is missing, `lib` is None and `load_error` says why; the backend then multiplies with
its own kernel.
"""

from __future__ import annotations

import ctypes.util
import os

from cffi import FFI

from singa_backend_opencl import cl

ffi = FFI()
ffi.include(cl.ffi)
ffi.cdef("""
typedef int CLBlastStatusCode;
typedef int CLBlastLayout;
typedef int CLBlastTranspose;
typedef uint16_t cl_half;

CLBlastStatusCode CLBlastSgemm(const CLBlastLayout layout, const CLBlastTranspose a_transpose,
                               const CLBlastTranspose b_transpose, const size_t m, const size_t n, const size_t k,
                               const float alpha, const cl_mem a_buffer, const size_t a_offset, const size_t a_ld,
                               const cl_mem b_buffer, const size_t b_offset, const size_t b_ld, const float beta,
                               cl_mem c_buffer, const size_t c_offset, const size_t c_ld, cl_command_queue *queue,
                               cl_event *event);
CLBlastStatusCode CLBlastHgemm(const CLBlastLayout layout, const CLBlastTranspose a_transpose,
                               const CLBlastTranspose b_transpose, const size_t m, const size_t n, const size_t k,
                               const cl_half alpha, const cl_mem a_buffer, const size_t a_offset, const size_t a_ld,
                               const cl_mem b_buffer, const size_t b_offset, const size_t b_ld, const cl_half beta,
                               cl_mem c_buffer, const size_t c_offset, const size_t c_ld, cl_command_queue *queue,
                               cl_event *event);
CLBlastStatusCode CLBlastSgemmBatched(const CLBlastLayout layout, const CLBlastTranspose a_transpose,
                                      const CLBlastTranspose b_transpose, const size_t m, const size_t n,
                                      const size_t k, const float *alphas, const cl_mem a_buffer,
                                      const size_t *a_offsets, const size_t a_ld, const cl_mem b_buffer,
                                      const size_t *b_offsets, const size_t b_ld, const float *betas,
                                      cl_mem c_buffer, const size_t *c_offsets, const size_t c_ld,
                                      const size_t batch_count, cl_command_queue *queue, cl_event *event);
CLBlastStatusCode CLBlastSgemmStridedBatched(const CLBlastLayout layout, const CLBlastTranspose a_transpose,
                                             const CLBlastTranspose b_transpose, const size_t m, const size_t n,
                                             const size_t k, const float alpha, const cl_mem a_buffer,
                                             const size_t a_offset, const size_t a_ld, const size_t a_stride,
                                             const cl_mem b_buffer, const size_t b_offset, const size_t b_ld,
                                             const size_t b_stride, const float beta, cl_mem c_buffer,
                                             const size_t c_offset, const size_t c_ld, const size_t c_stride,
                                             const size_t batch_count, cl_command_queue *queue, cl_event *event);
CLBlastStatusCode CLBlastDgemm(const CLBlastLayout layout, const CLBlastTranspose a_transpose,
                               const CLBlastTranspose b_transpose, const size_t m, const size_t n, const size_t k,
                               const double alpha, const cl_mem a_buffer, const size_t a_offset, const size_t a_ld,
                               const cl_mem b_buffer, const size_t b_offset, const size_t b_ld, const double beta,
                               cl_mem c_buffer, const size_t c_offset, const size_t c_ld, cl_command_queue *queue,
                               cl_event *event);
CLBlastStatusCode CLBlastDgemmBatched(const CLBlastLayout layout, const CLBlastTranspose a_transpose,
                                      const CLBlastTranspose b_transpose, const size_t m, const size_t n,
                                      const size_t k, const double *alphas, const cl_mem a_buffer,
                                      const size_t *a_offsets, const size_t a_ld, const cl_mem b_buffer,
                                      const size_t *b_offsets, const size_t b_ld, const double *betas,
                                      cl_mem c_buffer, const size_t *c_offsets, const size_t c_ld,
                                      const size_t batch_count, cl_command_queue *queue, cl_event *event);
CLBlastStatusCode CLBlastDgemmStridedBatched(const CLBlastLayout layout, const CLBlastTranspose a_transpose,
                                             const CLBlastTranspose b_transpose, const size_t m, const size_t n,
                                             const size_t k, const double alpha, const cl_mem a_buffer,
                                             const size_t a_offset, const size_t a_ld, const size_t a_stride,
                                             const cl_mem b_buffer, const size_t b_offset, const size_t b_ld,
                                             const size_t b_stride, const double beta, cl_mem c_buffer,
                                             const size_t c_offset, const size_t c_ld, const size_t c_stride,
                                             const size_t batch_count, cl_command_queue *queue, cl_event *event);
CLBlastStatusCode CLBlastClearCache(void);
""")

ROW_MAJOR = 101
NO_TRANS, TRANS = 111, 112

STATUS = {
    -1024: "not implemented", -1017: "invalid dimension", -1016: "invalid leading dimension of A",
    -1015: "invalid leading dimension of B", -1014: "invalid leading dimension of C",
    -1011: "buffer of A too small", -1010: "buffer of B too small", -1009: "buffer of C too small",
    -2049: "invalid batch count", -2046: "not enough local memory", -2045: "no half precision on this device",
    -2044: "no double precision on this device", -2041: "device not in the tuning database",
    -2040: "unknown error", -2039: "unexpected error",
}


class CLBlastError(RuntimeError):
    def __init__(self, code: int, what: str):
        self.code = code
        reason = STATUS.get(code) or cl.ERRORS.get(code) or "error"
        super().__init__(f"CLBlast {what} failed: {reason} ({code})")


def check(code: int, what: str) -> None:
    if code != 0:
        if code in (-4, -6):
            raise MemoryError(f"CLBlast {what}: out of device memory ({code})")
        raise CLBlastError(code, what)


def _load():
    override = os.environ.get("SINGA_CLBLAST_LIBRARY")
    if override == "":  # explicitly disabled: the backend's own GEMM kernel does the products
        return None, "disabled by SINGA_CLBLAST_LIBRARY=''"
    names = [override] if override else ["libclblast.so.1", "libclblast.so"]
    found = ctypes.util.find_library("clblast")
    if not override and found and found not in names:
        names.append(found)
    errors = []
    for name in names:
        try:
            return ffi.dlopen(name), None
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    return None, ("CLBlast could not be loaded (" + "; ".join(errors)
                  + "); install it with `apt-get install libclblast1`")


lib, load_error = (None, cl.load_error) if cl.lib is None else _load()
