/* Batched matrix products: float32 and float64 through OpenBLAS sgemm / dgemm, or sgemv / dgemv for a single row or
 * column (gemm_real.h), float16 through float32 copies, integers with plain loops. Operands are (batch, rows, cols)
 * arrays, float32 and float64 ones with any batch stride and row stride (attention's heads read where they lie), the
 * others contiguous; a batch count of 1 broadcasts that operand over the batch. */
#include "common.h"
#include "cblas.h" /* scipy-openblas32's header: every symbol carries the scipy_ prefix */

#define GEMM_PAR_FLOPS 4.0e6 /* below this a product stays on one thread */
#define blas_gemm_f32 scipy_cblas_sgemm
#define blas_gemm_f64 scipy_cblas_dgemm
#define blas_gemv_f32 scipy_cblas_sgemv
#define blas_gemv_f64 scipy_cblas_dgemv

/* An outside float32 GEMM with oneDNN's dnnl_sgemm signature (row-major; returns 0 on success), set from Python where
 * oneDNN is loaded (sg_set_sgemm). Its JIT kernels and blocking are MKL's: on small and mid-size products (a 64 x 784
 * times 784 x 256 layer, K = 64 weight gradients) it took 0.6x the time of OpenBLAS split over the threads. It runs on
 * the same OpenMP pool, with the calling thread's team size, and on one thread inside a parallel region. */
typedef int (*sg_sgemm_fn)(char, char, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *,
                           int64_t, float, float *, int64_t);
static sg_sgemm_fn outside_sgemm;

void sg_set_sgemm(void *fn) { outside_sgemm = (sg_sgemm_fn)fn; }

/* 1 where the outside GEMM computed c; 0 to take the OpenBLAS path */
static int outside_gemm_f32(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                            int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    sg_sgemm_fn f = outside_sgemm;
    if (!f || k <= 0) return 0;
    if (!omp_in_parallel()) { /* a Python thread's own team size may still be the environment's */
        const int T = sg_max_threads();
        if (omp_get_max_threads() != T) omp_set_num_threads(T);
    }
    return f(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) == 0;
}

void sg_gemm_f32_on_thread(int64_t m, int64_t n, int64_t k, const float *a, const float *b, float *c) {
    if (m > 0 && n > 0 && outside_gemm_f32(0, 0, m, n, k, 1.f, a, k, b, n, 0.f, c, n)) return;
    sg_gemm_f32(0, 0, m, n, k, 1.f, a, k, b, n, 0.f, c, n, 0);
}

void sg_gemm_f32_team(int64_t m, int64_t n, int64_t k, const float *a, const float *b, float *c) {
    if (m > 0 && n > 0 && outside_gemm_f32(0, 0, m, n, k, 1.f, a, k, b, n, 0.f, c, n)) return;
    sg_gemm_f32(0, 0, m, n, k, 1.f, a, k, b, n, 0.f, c, n, 1);
}

/* float64 has no outside GEMM: always OpenBLAS */
#define outside_gemm_f64(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) 0

#define SG_REAL_TEMPLATE "gemm_real.h"
#include "real.h"

static int mm_f16(const sg_half *a, const sg_half *b, sg_half *c, int64_t batch, int64_t batch_a, int64_t batch_b,
                  int64_t m, int64_t n, int64_t k, int ta, int tb, float alpha, float beta) {
    const int64_t na = batch_a * m * k, nb = batch_b * k * n, nc = batch * m * n;
    float *fa = (float *)malloc((size_t)(na + nb + nc + 1) * sizeof(float));
    if (!fa) return SG_ENOMEM;
    float *fb = fa + na, *fc = fb + nb;
    sg_h2f(a, fa, na);
    sg_h2f(b, fb, nb);
    if (beta != 0.0f) sg_h2f(c, fc, nc);
    mm_f32(fa, m * k, ta ? m : k, fb, k * n, tb ? k : n, fc, batch, batch_a, batch_b, m, n, k, ta, tb, alpha, beta, 1);
    sg_f2h(fc, c, nc);
    free(fa);
    return SG_OK;
}

/* Integer products accumulate a row of the output in int64 (wrapping like numpy on overflow). */
#define INT_MM(SUF, T)                                                                                              \
    static int mm_##SUF(const T *a, const T *b, T *c, int64_t batch, int64_t batch_a, int64_t batch_b, int64_t m,   \
                        int64_t n, int64_t k, int ta, int tb, double alpha, double beta) {                          \
        const int plain = alpha == 1.0 && beta == 0.0;                                                              \
        const int T_ = sg_threads_for(batch * m * n * (k > 0 ? k : 1), 1 << 16);                                    \
        int err = SG_OK;                                                                                            \
        _Pragma("omp parallel num_threads(T_) if (T_ > 1)") {                                                       \
            int64_t *acc = (int64_t *)malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));                            \
            if (!acc) {                                                                                             \
                _Pragma("omp atomic write") err = SG_ENOMEM;                                                        \
            } else {                                                                                                \
                _Pragma("omp for schedule(static)") for (int64_t br = 0; br < batch * m; br++) {                    \
                    const int64_t i = br / m, r = br % m;                                                           \
                    const T *A = a + (batch_a == 1 ? 0 : i * m * k);                                                \
                    const T *B = b + (batch_b == 1 ? 0 : i * k * n);                                                \
                    T *C = c + br * n;                                                                              \
                    memset(acc, 0, (size_t)n * sizeof(int64_t));                                                    \
                    for (int64_t p = 0; p < k; p++) {                                                               \
                        const int64_t av = ta ? A[p * m + r] : A[r * k + p];                                        \
                        if (tb) {                                                                                   \
                            for (int64_t j = 0; j < n; j++) acc[j] += av * B[j * k + p];                            \
                        } else {                                                                                    \
                            const T *Bp = B + p * n;                                                                \
                            _Pragma("omp simd") for (int64_t j = 0; j < n; j++) acc[j] += av * Bp[j];               \
                        }                                                                                           \
                    }                                                                                               \
                    if (plain) {                                                                                    \
                        for (int64_t j = 0; j < n; j++) C[j] = (T)acc[j];                                           \
                    } else {                                                                                        \
                        for (int64_t j = 0; j < n; j++)                                                             \
                            C[j] = (T)(alpha * (double)acc[j] + (beta != 0.0 ? beta * (double)C[j] : 0.0));         \
                    }                                                                                               \
                }                                                                                                   \
                free(acc);                                                                                          \
            }                                                                                                       \
        }                                                                                                           \
        return err;                                                                                                 \
    }
INT_MM(i32, int32_t)
INT_MM(i64, int64_t)

int sg_matmul(int dtype, const char *a, int64_t ao, int64_t stride_a, int64_t ld_a, const char *b, int64_t bo,
              int64_t stride_b, int64_t ld_b, char *out, int64_t oo, int64_t batch, int64_t batch_a, int64_t batch_b,
              int64_t m, int64_t n, int64_t k, int trans_a, int trans_b, double alpha, double beta, int openblas) {
    if (batch == 0 || m == 0 || n == 0) return SG_OK;
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || batch * m > INT32_MAX) return SG_EVALUE;
    const int64_t ar = trans_a ? k : m, ac = trans_a ? m : k, br = trans_b ? n : k, bc = trans_b ? k : n;
    const int64_t min_ld_a = ac > 1 ? ac : 1, min_ld_b = bc > 1 ? bc : 1; /* BLAS wants ld >= 1 */
    if (ld_a < min_ld_a || ld_b < min_ld_b || ld_a > INT32_MAX || ld_b > INT32_MAX) return SG_EVALUE;
    const int packed = ld_a == min_ld_a && ld_b == min_ld_b && (batch_a == 1 || stride_a == ar * ac) &&
                       (batch_b == 1 || stride_b == br * bc);
    switch (dtype) {
    case SG_F32:
        mm_f32((const float *)a + ao, stride_a, ld_a, (const float *)b + bo, stride_b, ld_b, (float *)out + oo, batch,
               batch_a, batch_b, m, n, k, trans_a, trans_b, (float)alpha, (float)beta, !openblas);
        return SG_OK;
    case SG_F64:
        mm_f64((const double *)a + ao, stride_a, ld_a, (const double *)b + bo, stride_b, ld_b, (double *)out + oo,
               batch, batch_a, batch_b, m, n, k, trans_a, trans_b, alpha, beta, 0);
        return SG_OK;
    default:
        break;
    }
    if (!packed) return SG_EVALUE;
    switch (dtype) {
    case SG_F16:
        return mm_f16((const sg_half *)a + ao, (const sg_half *)b + bo, (sg_half *)out + oo, batch, batch_a, batch_b,
                      m, n, k, trans_a, trans_b, (float)alpha, (float)beta);
    case SG_I32:
        return mm_i32((const int32_t *)a + ao, (const int32_t *)b + bo, (int32_t *)out + oo, batch, batch_a, batch_b,
                      m, n, k, trans_a, trans_b, alpha, beta);
    case SG_I64:
        return mm_i64((const int64_t *)a + ao, (const int64_t *)b + bo, (int64_t *)out + oo, batch, batch_a, batch_b,
                      m, n, k, trans_a, trans_b, alpha, beta);
    default:
        return SG_EDTYPE;
    }
}
