/* Rows of sg_real data into double accumulators (instantiated by reduce.c, see real.h). */

static double SG_R(frow_sum)(const sg_real *p, int64_t n) {
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += (double)p[i];
    return s;
}
static double SG_R(frow_prod)(const sg_real *p, int64_t n) {
    double s = 1;
#pragma omp simd reduction(* : s)
    for (int64_t i = 0; i < n; i++) s *= (double)p[i];
    return s;
}
static double SG_R(frow_max)(const sg_real *p, int64_t n) {
    sg_real m = -INFINITY;
    int bad = 0;
#pragma omp simd reduction(max : m) reduction(| : bad)
    for (int64_t i = 0; i < n; i++) {
        const sg_real v = p[i];
        m = v > m ? v : m;
        bad |= v != v;
    }
    return bad ? NAN : (double)m;
}
static double SG_R(frow_min)(const sg_real *p, int64_t n) {
    sg_real m = INFINITY;
    int bad = 0;
#pragma omp simd reduction(min : m) reduction(| : bad)
    for (int64_t i = 0; i < n; i++) {
        const sg_real v = p[i];
        m = v < m ? v : m;
        bad |= v != v;
    }
    return bad ? NAN : (double)m;
}
static double SG_R(frow)(int op, const sg_real *p, int64_t n) {
    switch (op) {
    case OP_MAX: return SG_R(frow_max)(p, n);
    case OP_MIN: return SG_R(frow_min)(p, n);
    case OP_PROD: return SG_R(frow_prod)(p, n);
    default: return SG_R(frow_sum)(p, n);
    }
}
/* `reps` rows of n, `stride` elements apart, added element-wise into a[0..n) (the op's switch taken once). */
static void SG_R(facc)(int op, double *a, const sg_real *p, int64_t n, int64_t reps, int64_t stride) {
    if ((op == OP_SUM || op == OP_MEAN) && n <= 64 && n % 8 == 0) {
        /* short rows (a blocked layout's 8 or 16 channels): 8 sums held in registers over all the rows */
        for (int64_t i0 = 0; i0 < n; i0 += 8) {
            double t[8];
            for (int i = 0; i < 8; i++) t[i] = a[i0 + i];
            const sg_real *q = p + i0;
            for (int64_t r = 0; r < reps; r++, q += stride)
                for (int i = 0; i < 8; i++) t[i] += (double)q[i];
            for (int i = 0; i < 8; i++) a[i0 + i] = t[i];
        }
        return;
    }
    for (int64_t r = 0; r < reps; r++, p += stride) {
        switch (op) {
        case OP_MAX:
#pragma omp simd
            for (int64_t i = 0; i < n; i++) {
                const double v = p[i];
                a[i] = (v > a[i] || v != v) ? v : a[i];
            }
            break;
        case OP_MIN:
#pragma omp simd
            for (int64_t i = 0; i < n; i++) {
                const double v = p[i];
                a[i] = (v < a[i] || v != v) ? v : a[i];
            }
            break;
        case OP_PROD:
#pragma omp simd
            for (int64_t i = 0; i < n; i++) a[i] *= (double)p[i];
            break;
        default:
#pragma omp simd
            for (int64_t i = 0; i < n; i++) a[i] += (double)p[i];
        }
    }
}
