/* Softmax, log-softmax and their gradients on sg_real data (instantiated by softmax.c, see real.h). */

/* one softmax row with unit stride */
static void SG_R(softmax_row)(const sg_real *x, sg_real *y, int64_t len, int log_) {
    sg_real m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t i = 0; i < len; i++) m = x[i] > m ? x[i] : m;
    double s = 0.0;
    if (log_) {
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < len; i++) s += SG_R(sg_exp)(x[i] - m);
        const sg_real ls = (sg_real)log(s); /* (x - m) - log s: x - m is exact near the maximum */
#pragma omp simd
        for (int64_t i = 0; i < len; i++) y[i] = (x[i] - m) - ls;
    } else {
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < len; i++) {
            const sg_real e = SG_R(sg_exp)(x[i] - m);
            y[i] = e;
            s += e;
        }
        const sg_real r = (sg_real)(1.0 / s);
#pragma omp simd
        for (int64_t i = 0; i < len; i++) y[i] *= r;
    }
}

/* columns [c0, c1) of one (len, inner) slab */
static void SG_R(softmax_cols)(const sg_real *x, sg_real *y, int64_t len, int64_t inner, int64_t c0, int64_t c1,
                               int log_, sg_real *m, double *s) {
    const int64_t w = c1 - c0;
    for (int64_t j = 0; j < w; j++) { m[j] = -INFINITY; s[j] = 0.0; }
    for (int64_t r = 0; r < len; r++) {
        const sg_real *p = x + r * inner + c0;
#pragma omp simd
        for (int64_t j = 0; j < w; j++) m[j] = p[j] > m[j] ? p[j] : m[j];
    }
    for (int64_t r = 0; r < len; r++) {
        const sg_real *p = x + r * inner + c0;
        sg_real *q = y + r * inner + c0;
#pragma omp simd
        for (int64_t j = 0; j < w; j++) {
            const sg_real e = SG_R(sg_exp)(p[j] - m[j]);
            if (!log_) q[j] = e;
            s[j] += e;
        }
    }
    for (int64_t j = 0; j < w; j++) s[j] = log_ ? log(s[j]) : 1.0 / s[j];
    for (int64_t r = 0; r < len; r++) {
        const sg_real *p = x + r * inner + c0;
        sg_real *q = y + r * inner + c0;
        if (log_) {
            for (int64_t j = 0; j < w; j++) q[j] = (p[j] - m[j]) - (sg_real)s[j];
        } else {
            for (int64_t j = 0; j < w; j++) q[j] = (sg_real)(q[j] * s[j]);
        }
    }
}

static void SG_R(softmax_all)(const sg_real *x, sg_real *y, int64_t outer, int64_t len, int64_t inner, int log_) {
    const int64_t blocks = (inner + INNER_BLOCK - 1) / INNER_BLOCK, tasks = outer * blocks;
    const int T = sg_threads_for(outer * len * inner, 1 << 14);
#pragma omp parallel num_threads(T) if (T > 1)
    {
        sg_real m[INNER_BLOCK];
        double s[INNER_BLOCK];
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tasks; t++) {
            const int64_t o = t / blocks, b = t % blocks;
            const sg_real *xs = x + o * len * inner;
            sg_real *ys = y + o * len * inner;
            if (inner == 1)
                SG_R(softmax_row)(xs, ys, len, log_);
            else
                SG_R(softmax_cols)(xs, ys, len, inner, b * INNER_BLOCK, sg_min64(inner, (b + 1) * INNER_BLOCK), log_,
                                   m, s);
        }
    }
}

/* softmax: dx = y (dy - sum(dy y)); log-softmax: dx = dy - exp(y) sum(dy) */
static void SG_R(softmax_backward)(const sg_real *dy, const sg_real *y, sg_real *dx, int64_t outer, int64_t len,
                                   int64_t inner, int log_) {
    const int64_t blocks = (inner + INNER_BLOCK - 1) / INNER_BLOCK, tasks = outer * blocks;
    const int T = sg_threads_for(outer * len * inner, 1 << 14);
#pragma omp parallel num_threads(T) if (T > 1)
    {
        double s[INNER_BLOCK];
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tasks; t++) {
            const int64_t o = t / blocks, b = t % blocks;
            const int64_t c0 = b * INNER_BLOCK, w = sg_min64(inner, c0 + INNER_BLOCK) - c0;
            const int64_t base = o * len * inner + c0;
            for (int64_t j = 0; j < w; j++) s[j] = 0.0;
            for (int64_t r = 0; r < len; r++) {
                const sg_real *g = dy + base + r * inner, *p = y + base + r * inner;
                if (log_)
                    for (int64_t j = 0; j < w; j++) s[j] += g[j];
                else
                    for (int64_t j = 0; j < w; j++) s[j] += (double)g[j] * p[j];
            }
            for (int64_t r = 0; r < len; r++) {
                const sg_real *g = dy + base + r * inner, *p = y + base + r * inner;
                sg_real *q = dx + base + r * inner;
                if (log_)
                    for (int64_t j = 0; j < w; j++) q[j] = (sg_real)(g[j] - SG_R(sg_exp)(p[j]) * s[j]);
                else
                    for (int64_t j = 0; j < w; j++) q[j] = (sg_real)(p[j] * (g[j] - s[j]));
            }
        }
    }
}
