/* Batched matrix products: float32 through OpenBLAS sgemm, float16 through float32 copies, integers with plain loops.
 * Operands are contiguous (batch, rows, cols) arrays; a batch count of 1 broadcasts that operand over the batch. */
#include "common.h"
#include "cblas.h" /* scipy-openblas32's header: every symbol carries the scipy_ prefix */

#define GEMM_PAR_FLOPS 4.0e6 /* below this a product stays on one thread */

static void sgemm1(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                   const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    scipy_cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)m,
                      (blasint)n, (blasint)k, alpha, a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

void sg_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
              const float *b, int64_t ldb, float beta, float *c, int64_t ldc, int may_split) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) { /* BLAS wants k >= 1; the product is empty */
        for (int64_t i = 0; i < m; i++) {
            float *row = c + i * ldc;
            for (int64_t j = 0; j < n; j++) row[j] = beta == 0.0f ? 0.0f : beta * row[j];
        }
        return;
    }
    int T = may_split ? sg_max_threads() : 1;
    if (2.0 * (double)m * (double)n * (double)k < GEMM_PAR_FLOPS) T = 1;
    if (T < 2) {
        sgemm1(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    /* each thread takes a block of C's columns (or rows, when C is taller than wide) */
    const int by_cols = n >= m;
#pragma omp parallel num_threads(T)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t len = by_cols ? n : m, lo = sg_chunk(len, t, nt), hi = sg_chunk(len, t + 1, nt);
        if (hi > lo) {
            if (by_cols)
                sgemm1(ta, tb, m, hi - lo, k, alpha, a, lda, tb ? b + lo * ldb : b + lo, ldb, beta, c + lo, ldc);
            else
                sgemm1(ta, tb, hi - lo, n, k, alpha, ta ? a + lo : a + lo * lda, lda, b, ldb, beta, c + lo * ldc,
                       ldc);
        }
    }
}

static void mm_f32(const float *a, const float *b, float *c, int64_t batch, int64_t batch_a, int64_t batch_b,
                   int64_t m, int64_t n, int64_t k, int ta, int tb, float alpha, float beta) {
    const int64_t lda = ta ? m : k, ldb = tb ? k : n;
    if (batch > 1 && batch_a == batch && batch_b == 1 && !ta) {
        /* a stack of row-major matrices times one matrix is one taller product */
        sg_sgemm(ta, tb, batch * m, n, k, alpha, a, lda, b, ldb, beta, c, n, 1);
        return;
    }
    const double item_flops = 2.0 * (double)m * (double)n * (double)(k > 0 ? k : 1);
    const int T = sg_max_threads();
    if (batch >= 2 * T && T > 1 && (double)batch * item_flops >= GEMM_PAR_FLOPS) {
        /* many matrices: whole products per thread */
#pragma omp parallel for schedule(static) num_threads(T)
        for (int64_t i = 0; i < batch; i++)
            sg_sgemm(ta, tb, m, n, k, alpha, a + (batch_a == 1 ? 0 : i * m * k), lda,
                     b + (batch_b == 1 ? 0 : i * k * n), ldb, beta, c + i * m * n, n, 0);
        return;
    }
    for (int64_t i = 0; i < batch; i++)
        sg_sgemm(ta, tb, m, n, k, alpha, a + (batch_a == 1 ? 0 : i * m * k), lda, b + (batch_b == 1 ? 0 : i * k * n),
                 ldb, beta, c + i * m * n, n, 1);
}

static int mm_f16(const sg_half *a, const sg_half *b, sg_half *c, int64_t batch, int64_t batch_a, int64_t batch_b,
                  int64_t m, int64_t n, int64_t k, int ta, int tb, float alpha, float beta) {
    const int64_t na = batch_a * m * k, nb = batch_b * k * n, nc = batch * m * n;
    float *fa = (float *)malloc((size_t)(na + nb + nc + 1) * sizeof(float));
    if (!fa) return SG_ENOMEM;
    float *fb = fa + na, *fc = fb + nb;
    sg_h2f(a, fa, na);
    sg_h2f(b, fb, nb);
    if (beta != 0.0f) sg_h2f(c, fc, nc);
    mm_f32(fa, fb, fc, batch, batch_a, batch_b, m, n, k, ta, tb, alpha, beta);
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

int sg_matmul(int dtype, const char *a, int64_t ao, const char *b, int64_t bo, char *out, int64_t oo, int64_t batch,
              int64_t batch_a, int64_t batch_b, int64_t m, int64_t n, int64_t k, int trans_a, int trans_b,
              double alpha, double beta) {
    if (batch == 0 || m == 0 || n == 0) return SG_OK;
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || batch * m > INT32_MAX) return SG_EVALUE;
    switch (dtype) {
    case SG_F32:
        mm_f32((const float *)a + ao, (const float *)b + bo, (float *)out + oo, batch, batch_a, batch_b, m, n, k,
               trans_a, trans_b, (float)alpha, (float)beta);
        return SG_OK;
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
