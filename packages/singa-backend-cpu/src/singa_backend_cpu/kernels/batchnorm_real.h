/* Batch normalisation of sg_real data, x seen as (N, C, S) (instantiated by batchnorm.c, see real.h). Threads own
 * disjoint ranges of channels; statistics accumulate in double. */

/* sum over (n, s) of x for channels [c0, c1), into acc[c]; one compiled body for bn_train and bn_apply, whose means
 * must agree to the last bit */
__attribute__((noinline)) static void SG_R(channel_sum)(const sg_real *x, int64_t N, int64_t C, int64_t S, int64_t c0, int64_t c1,
                              double *acc) {
    for (int64_t c = c0; c < c1; c++) acc[c] = 0.0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = c0; c < c1; c++) {
            const sg_real *p = x + (n * C + c) * S;
            double s = 0.0;
#pragma omp simd reduction(+ : s)
            for (int64_t i = 0; i < S; i++) s += p[i];
            acc[c] += s;
        }
}
static void SG_R(channel_sqdev)(const sg_real *x, int64_t N, int64_t C, int64_t S, int64_t c0, int64_t c1,
                                const double *mean, double *acc) {
    for (int64_t c = c0; c < c1; c++) acc[c] = 0.0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = c0; c < c1; c++) {
            const sg_real *p = x + (n * C + c) * S;
            const double m = mean[c];
            double s = 0.0;
#pragma omp simd reduction(+ : s)
            for (int64_t i = 0; i < S; i++) {
                const double d = p[i] - m;
                s += d * d;
            }
            acc[c] += s;
        }
}
/* y = (x - m[c]) * a[c] + b[c]; the difference in double, so that a mean far from zero costs no digits. With `relu`,
 * the rounded result goes through the relu kernel's expression (negatives to 0, NaN stays). */
static void SG_R(channel_affine)(const sg_real *x, sg_real *y, int64_t N, int64_t C, int64_t S, int64_t c0,
                                 int64_t c1, const double *m, const double *a, const double *b, int relu) {
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = c0; c < c1; c++) {
            const sg_real *p = x + (n * C + c) * S;
            sg_real *q = y + (n * C + c) * S;
            const double mc = m[c], ac = a[c], bc = b[c];
            if (relu) {
#pragma omp simd
                for (int64_t i = 0; i < S; i++) {
                    const sg_real v = (sg_real)(((double)p[i] - mc) * ac + bc);
                    q[i] = v < 0 ? 0 : v;
                }
            } else {
#pragma omp simd
                for (int64_t i = 0; i < S; i++) q[i] = (sg_real)(((double)p[i] - mc) * ac + bc);
            }
        }
}

/* y = act(affine) over all channels, split over the threads by channels, or by samples when there are few */
static void SG_R(affine_all)(const sg_real *x, sg_real *y, int64_t N, int64_t C, int64_t S, const double *m,
                             const double *a, const double *off, int relu) {
    const int T = CHANNEL_THREADS(N, C, S);
    if (C >= T) {
#pragma omp parallel num_threads(T) if (T > 1)
        {
            CHANNEL_RANGE();
            SG_R(channel_affine)(x, y, N, C, S, c0, c1, m, a, off, relu);
        }
    } else {
#pragma omp parallel for schedule(static) num_threads(T) if (T > 1)
        for (int64_t i = 0; i < N; i++)
            SG_R(channel_affine)(x + i * C * S, y + i * C * S, 1, C, S, 0, C, m, a, off, relu);
    }
}

static int SG_R(bn_train)(const sg_real *x, sg_real *y, int64_t N, int64_t C, int64_t S, chan scale, chan bias,
                          chan rmean, chan rvar, chan smean, chan sinvstd, double momentum, double eps) {
    const int64_t M = N * S;
    double *mean = (double *)malloc((size_t)(4 * C + 1) * sizeof(double)), *var = mean + C, *a = var + C,
           *off = a + C;
    if (!mean) return SG_ENOMEM;
    const int T = CHANNEL_THREADS(N, C, S);
#pragma omp parallel num_threads(T) if (T > 1)
    {
        CHANNEL_RANGE();
        SG_R(channel_sum)(x, N, C, S, c0, c1, mean);
        for (int64_t c = c0; c < c1; c++) mean[c] = M ? mean[c] / (double)M : NAN;
        SG_R(channel_sqdev)(x, N, C, S, c0, c1, mean, var);
        for (int64_t c = c0; c < c1; c++) {
            const double v = M ? var[c] / (double)M : NAN;
            const double inv = 1.0 / sqrt(v + eps);
            const double unbiased = v * (double)M / (double)(M > 1 ? M - 1 : 1);
            chan_st(smean, c, mean[c]);
            chan_st(sinvstd, c, inv);
            chan_st(rmean, c, momentum * chan_ld(rmean, c) + (1.0 - momentum) * mean[c]);
            chan_st(rvar, c, momentum * chan_ld(rvar, c) + (1.0 - momentum) * unbiased);
            /* y from the double mean (a mean far from zero costs no digits) and the saved invstd, rounded to its
             * dtype: bn_apply recomputes the same mean and reads that invstd, so it gives y bit for bit. An invstd
             * narrower than the data (float16, or float32 of float64 data) is too coarse: y keeps the double one. */
            const int narrow = sg_itemsize(sinvstd.dt) < (int)sizeof(sg_real);
            a[c] = (narrow ? inv : chan_ld(sinvstd, c)) * chan_ld(scale, c);
            off[c] = chan_ld(bias, c);
        }
        SG_R(channel_affine)(x, y, N, C, S, c0, c1, mean, a, off, 0);
    }
    free(mean);
    return SG_OK;
}

static int SG_R(bn_infer)(const sg_real *x, sg_real *y, int64_t N, int64_t C, int64_t S, chan scale, chan bias,
                          chan mean, chan var, double eps) {
    double *m = (double *)malloc((size_t)(3 * C + 1) * sizeof(double)), *a = m + C, *off = a + C;
    if (!m) return SG_ENOMEM;
    for (int64_t c = 0; c < C; c++) {
        m[c] = chan_ld(mean, c);
        a[c] = chan_ld(scale, c) / sqrt(chan_ld(var, c) + eps);
        off[c] = chan_ld(bias, c);
    }
    SG_R(affine_all)(x, y, N, C, S, m, a, off, 0);
    free(m);
    return SG_OK;
}

/* bn_train's y (and relu of it) again: its double mean recomputed by the same code (the saved one is rounded), its
 * saved invstd, into the same channel_affine. smean is not read: the mean is x's. */
static int SG_R(bn_apply)(const sg_real *x, sg_real *y, int64_t N, int64_t C, int64_t S, chan scale, chan bias,
                          chan sinvstd, int relu) {
    const int64_t M = N * S;
    double *m = (double *)malloc((size_t)(3 * C + 1) * sizeof(double)), *a = m + C, *off = a + C;
    if (!m) return SG_ENOMEM;
    const int T = CHANNEL_THREADS(N, C, S);
#pragma omp parallel num_threads(T) if (T > 1)
    {
        CHANNEL_RANGE();
        SG_R(channel_sum)(x, N, C, S, c0, c1, m);
        for (int64_t c = c0; c < c1; c++) {
            m[c] = M ? m[c] / (double)M : NAN;
            a[c] = chan_ld(sinvstd, c) * chan_ld(scale, c);
            off[c] = chan_ld(bias, c);
        }
    }
    SG_R(affine_all)(x, y, N, C, S, m, a, off, relu);
    free(m);
    return SG_OK;
}

static int SG_R(bn_backward)(const sg_real *dy, const sg_real *x, sg_real *dx, int64_t N, int64_t C, int64_t S,
                             chan scale, chan smean, chan sinvstd, chan dscale, chan dbias) {
    const int64_t M = N * S;
    double *db = (double *)malloc((size_t)(2 * C + 1) * sizeof(double)), *ds = db + C;
    if (!db) return SG_ENOMEM;
    const int T = CHANNEL_THREADS(N, C, S);
#pragma omp parallel num_threads(T) if (T > 1)
    {
        CHANNEL_RANGE();
        for (int64_t c = c0; c < c1; c++) ds[c] = db[c] = 0.0;
        for (int64_t i = 0; i < N; i++)
            for (int64_t c = c0; c < c1; c++) {
                const sg_real *g = dy + (i * C + c) * S, *p = x + (i * C + c) * S;
                const double m = chan_ld(smean, c);
                double sg = 0.0, sgx = 0.0;
#pragma omp simd reduction(+ : sg, sgx)
                for (int64_t k = 0; k < S; k++) {
                    sg += g[k];
                    sgx += g[k] * (p[k] - m);
                }
                db[c] += sg;
                ds[c] += sgx;
            }
        for (int64_t c = c0; c < c1; c++) {
            ds[c] *= chan_ld(sinvstd, c); /* sum dy * xhat */
            chan_st(dscale, c, ds[c]);
            chan_st(dbias, c, db[c]);
        }
        for (int64_t i = 0; i < N; i++)
            for (int64_t c = c0; c < c1; c++) {
                const sg_real *g = dy + (i * C + c) * S, *p = x + (i * C + c) * S;
                sg_real *q = dx + (i * C + c) * S;
                const double inv = chan_ld(sinvstd, c), m = chan_ld(smean, c);
                /* dx = scale * inv / M * (M dy - db - xhat ds) = k1 dy + k2 (x - mean) + k3 */
                const double k = chan_ld(scale, c) * inv / (double)(M ? M : 1);
                const double k1 = k * (double)M, k2 = -k * inv * ds[c], k3 = -k * db[c];
#pragma omp simd
                for (int64_t j = 0; j < S; j++) q[j] = (sg_real)(k1 * g[j] + k2 * ((double)p[j] - m) + k3);
            }
    }
    free(db);
    return SG_OK;
}

/* Layer normalisation of the rows of x (rows, cols): statistics in double, two passes (mean, then squared deviations)
 * as for batch normalisation; the rows are split over the threads. scale and bias may be NULL (1 and 0). */
static void SG_R(layer_norm)(const sg_real *x, sg_real *y, sg_real *mean, sg_real *invstd, int64_t rows,
                             int64_t cols, const sg_real *scale, const sg_real *bias, double eps) {
    const int T = sg_threads_for(rows * cols, 1 << 12);
#pragma omp parallel for schedule(static) num_threads(T) if (T > 1)
    for (int64_t r = 0; r < rows; r++) {
        const sg_real *xr = x + r * cols;
        sg_real *yr = y + r * cols;
        double s = 0, q = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < cols; j++) s += xr[j];
        const double m = s / (double)cols;
#pragma omp simd reduction(+ : q)
        for (int64_t j = 0; j < cols; j++) {
            const double d = xr[j] - m;
            q += d * d;
        }
        const double inv = 1.0 / sqrt(q / (double)cols + eps);
        const sg_real mr = (sg_real)m, ir = (sg_real)inv;
        if (scale && bias) {
#pragma omp simd
            for (int64_t j = 0; j < cols; j++) yr[j] = (xr[j] - mr) * ir * scale[j] + bias[j];
        } else if (scale) {
#pragma omp simd
            for (int64_t j = 0; j < cols; j++) yr[j] = (xr[j] - mr) * ir * scale[j];
        } else if (bias) {
#pragma omp simd
            for (int64_t j = 0; j < cols; j++) yr[j] = (xr[j] - mr) * ir + bias[j];
        } else {
#pragma omp simd
            for (int64_t j = 0; j < cols; j++) yr[j] = (xr[j] - mr) * ir;
        }
        mean[r] = mr;
        invstd[r] = ir;
    }
}
