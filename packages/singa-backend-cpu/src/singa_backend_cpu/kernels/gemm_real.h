/* Products of sg_real matrices through OpenBLAS, split over the OpenMP threads (instantiated by gemm.c, see real.h). */

/* One block of C on the calling thread. A single row (m == 1) or column (n == 1) of C is a matrix-vector product, and
 * goes to BLAS gemv, which streams the matrix once at memory speed: OpenBLAS's gemm runs such a product about 4 times
 * slower (on the 2-core development machine, one thread, 1 x 9216 @ (4096 x 9216)^T took 30 ms through sgemm and
 * 7.5 ms through sgemv). gemv has gemm's alpha / beta meaning, including that beta == 0 never reads C. sg_gemm splits
 * such a product over the threads like any other (by C's columns for a row, by its rows for a column): each block
 * stays a row or column, and a second core adds memory bandwidth (4.3 ms for the same product on two threads). */
static void SG_R(gemm1)(int ta, int tb, int64_t m, int64_t n, int64_t k, sg_real alpha, const sg_real *a, int64_t lda,
                        const sg_real *b, int64_t ldb, sg_real beta, sg_real *c, int64_t ldc) {
    if (m == 1) { /* c = op(B)^T a: a's k entries lie 1 apart, or lda apart when A is stored k x 1 */
        SG_R(blas_gemv)(CblasRowMajor, tb ? CblasNoTrans : CblasTrans, (blasint)(tb ? n : k), (blasint)(tb ? k : n),
                        alpha, b, (blasint)ldb, a, (blasint)(ta ? lda : 1), beta, c, 1);
        return;
    }
    if (n == 1) { /* c = op(A) b: b's k entries lie ldb apart, or 1 apart when B is stored 1 x k; c's lie ldc apart */
        SG_R(blas_gemv)(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, (blasint)(ta ? k : m), (blasint)(ta ? m : k),
                        alpha, a, (blasint)lda, b, (blasint)(tb ? 1 : ldb), beta, c, (blasint)ldc);
        return;
    }
    SG_R(blas_gemm)(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)m,
                    (blasint)n, (blasint)k, alpha, a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

void SG_R(sg_gemm)(int ta, int tb, int64_t m, int64_t n, int64_t k, sg_real alpha, const sg_real *a, int64_t lda,
                   const sg_real *b, int64_t ldb, sg_real beta, sg_real *c, int64_t ldc, int may_split) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) { /* BLAS wants k >= 1; the product is empty */
        for (int64_t i = 0; i < m; i++) {
            sg_real *row = c + i * ldc;
            for (int64_t j = 0; j < n; j++) row[j] = beta == 0 ? 0 : beta * row[j];
        }
        return;
    }
    int T = may_split ? sg_max_threads() : 1;
    if (2.0 * (double)m * (double)n * (double)k < GEMM_PAR_FLOPS) T = 1;
    if (T < 2) {
        SG_R(gemm1)(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
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
                SG_R(gemm1)(ta, tb, m, hi - lo, k, alpha, a, lda, tb ? b + lo * ldb : b + lo, ldb, beta, c + lo, ldc);
            else
                SG_R(gemm1)(ta, tb, hi - lo, n, k, alpha, ta ? a + lo : a + lo * lda, lda, b, ldb, beta,
                            c + lo * ldc, ldc);
        }
    }
}

/* One product of the batch: the outside GEMM where one is set (gemm.c) and `outside`, else sg_gemm. */
static void SG_R(mm1)(int ta, int tb, int64_t m, int64_t n, int64_t k, sg_real alpha, const sg_real *a, int64_t lda,
                      const sg_real *b, int64_t ldb, sg_real beta, sg_real *c, int64_t ldc, int may_split,
                      int outside) {
    if (outside && m > 0 && n > 0 && SG_R(outside_gemm)(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
        return;
    SG_R(sg_gemm)(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, may_split);
}

static void SG_R(mm)(const sg_real *a, int64_t sa, int64_t lda, const sg_real *b, int64_t sb, int64_t ldb, sg_real *c,
                     int64_t batch, int64_t batch_a, int64_t batch_b, int64_t m, int64_t n, int64_t k, int ta, int tb,
                     sg_real alpha, sg_real beta, int outside) {
    if (batch_a == 1) sa = 0;
    if (batch_b == 1) sb = 0;
    if (batch > 1 && batch_a == batch && batch_b == 1 && !ta && sa == m * lda) {
        /* a stack of evenly spaced row-major matrices times one matrix is one taller product */
        SG_R(mm1)(ta, tb, batch * m, n, k, alpha, a, lda, b, ldb, beta, c, n, 1, outside);
        return;
    }
    const double item_flops = 2.0 * (double)m * (double)n * (double)(k > 0 ? k : 1);
    const int T = sg_max_threads();
    if (batch >= 2 * T && T > 1 && (double)batch * item_flops >= GEMM_PAR_FLOPS) {
        /* many matrices: whole products per thread */
#pragma omp parallel for schedule(static) num_threads(T)
        for (int64_t i = 0; i < batch; i++)
            SG_R(mm1)(ta, tb, m, n, k, alpha, a + i * sa, lda, b + i * sb, ldb, beta, c + i * m * n, n, 0, outside);
        return;
    }
    for (int64_t i = 0; i < batch; i++)
        SG_R(mm1)(ta, tb, m, n, k, alpha, a + i * sa, lda, b + i * sb, ldb, beta, c + i * m * n, n, 1, outside);
}
