/* Softmax and log-softmax along one axis (x seen as (outer, len, inner)), their gradients (softmax_real.h, float32
 * and float64), and the softmax cross-entropy loss with integer labels or probability targets. float32 exponentials
 * use the vectorisable sg_vexpf, sums accumulate in double; the loss itself is computed in double. float16 goes
 * through float32 copies. */
#include "common.h"

#define INNER_BLOCK 1024 /* columns of an inner > 1 softmax handled together */

#define SG_REAL_TEMPLATE "softmax_real.h"
#include "real.h"

int sg_softmax(int dtype, int log, const char *x, int64_t xo, char *y, int64_t yo, int64_t outer, int64_t len,
               int64_t inner) {
    if (!sg_is_float(dtype)) return SG_EDTYPE;
    const int64_t n = outer * len * inner;
    if (n == 0) return SG_OK;
    if (dtype == SG_F64) {
        softmax_all_f64((const double *)x + xo, (double *)y + yo, outer, len, inner, log);
        return SG_OK;
    }
    const int isz = sg_itemsize(dtype);
    int own;
    float *fx = sg_as_f32(x + xo * isz, dtype, n, &own);
    float *fy = dtype == SG_F32 ? (float *)y + yo : (float *)malloc((size_t)n * sizeof(float));
    int err = fx && fy ? SG_OK : SG_ENOMEM;
    if (!err) softmax_all_f32(fx, fy, outer, len, inner, log);
    if (dtype != SG_F32 && fy) {
        if (!err) sg_f2h(fy, (sg_half *)y + yo, n);
        free(fy);
    }
    if (own) free(fx);
    return err;
}

int sg_softmax_backward(int dtype, int log, const char *dy, int64_t dyo, const char *y, int64_t yo, char *dx,
                        int64_t dxo, int64_t outer, int64_t len, int64_t inner) {
    if (!sg_is_float(dtype)) return SG_EDTYPE;
    const int64_t n = outer * len * inner;
    if (n == 0) return SG_OK;
    if (dtype == SG_F64) {
        softmax_backward_f64((const double *)dy + dyo, (const double *)y + yo, (double *)dx + dxo, outer, len, inner,
                             log);
        return SG_OK;
    }
    const int isz = sg_itemsize(dtype);
    int own_dy, own_y;
    float *fdy = sg_as_f32(dy + dyo * isz, dtype, n, &own_dy);
    float *fy = sg_as_f32(y + yo * isz, dtype, n, &own_y);
    float *fdx = dtype == SG_F32 ? (float *)dx + dxo : (float *)malloc((size_t)n * sizeof(float));
    int err = fdy && fy && fdx ? SG_OK : SG_ENOMEM;
    if (!err) softmax_backward_f32(fdy, fy, fdx, outer, len, inner, log);
    if (dtype != SG_F32 && fdx) {
        if (!err) sg_f2h(fdx, (sg_half *)dx + dxo, n);
        free(fdx);
    }
    if (own_dy) free(fdy);
    if (own_y) free(fy);
    return err;
}

/* -- softmax cross-entropy ------------------------------------------------------------------------------------- */

/* label of row n; -1 (and *bad = the label) when out of [0, C): a class label never counts from the end */
static int64_t label_of(int tdtype, const char *t, int64_t n, int64_t C, int64_t *bad) {
    const int64_t v = tdtype == SG_I32 ? ((const int32_t *)t)[n] : ((const int64_t *)t)[n];
    if (v < 0 || v >= C) {
        *bad = v;
        return -1;
    }
    return v;
}

int64_t sg_find_label_outside(int tdtype, const char *t, int64_t to, int64_t n, int64_t classes) {
    if (tdtype == SG_I32) {
        const int32_t *p = (const int32_t *)t + to;
        for (int64_t i = 0; i < n; i++)
            if (p[i] < 0 || p[i] >= classes) return i;
    } else {
        const int64_t *p = (const int64_t *)t + to;
        for (int64_t i = 0; i < n; i++)
            if (p[i] < 0 || p[i] >= classes) return i;
    }
    return -1;
}

/* log-sum-exp of a row, in double (float32 rows exponentiate with the vectorisable sg_vexpf, summed in double) */
static double row_lse(const char *x, int dtype, int64_t C) {
    if (dtype == SG_F32) {
        const float *p = (const float *)x;
        float mf = -INFINITY;
        for (int64_t c = 0; c < C; c++) mf = p[c] > mf ? p[c] : mf;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int64_t c = 0; c < C; c++) s += (double)sg_vexpf(p[c] - mf);
        return (double)mf + log(s);
    }
    double m = -INFINITY;
    for (int64_t c = 0; c < C; c++) {
        const double v = sg_ldf(x, dtype, c);
        m = v > m ? v : m;
    }
    double s = 0.0;
    for (int64_t c = 0; c < C; c++) s += exp(sg_ldf(x, dtype, c) - m);
    return m + log(s);
}

/* float32 logits with class labels, the common case, go through blocks of whole rows of at most XENT_BLOCK logits:
 * the shifted logits of a block are exponentiated in one vectorised loop, so that short rows (10 classes) fill the
 * vectors too (a loop per row of 10 ran its exponentials one by one: 100 ns a row). Longer rows take row_lse. */
#define XENT_BLOCK 1024

/* lse[r] of `rows` rows of C logits (rows * C <= XENT_BLOCK); e receives each row's exp(x - max) */
static void lse_block_f32(const float *x, int64_t rows, int64_t C, double *lse, float *e) {
    for (int64_t r = 0; r < rows; r++) {
        const float *p = x + r * C;
        float m = -INFINITY;
        for (int64_t c = 0; c < C; c++) m = p[c] > m ? p[c] : m;
        lse[r] = m;
        for (int64_t c = 0; c < C; c++) e[r * C + c] = p[c] - m;
    }
    const int64_t n = rows * C;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) e[i] = sg_vexpf(e[i]);
    for (int64_t r = 0; r < rows; r++) {
        double s = 0.0;
        for (int64_t c = 0; c < C; c++) s += (double)e[r * C + c];
        lse[r] += log(s);
    }
}

/* the loss (dloss NULL) or its gradient for float32 logits x (N, C) with validated labels, C <= XENT_BLOCK */
static void xent_labels_f32(const float *x, int tdtype, const char *t, const float *dloss, float *out, int64_t N,
                            int64_t C) {
    const int64_t R = XENT_BLOCK / C, blocks = (N + R - 1) / R;
    const int T = sg_threads_for(N * C, 1 << 13);
#pragma omp parallel for schedule(static) num_threads(T) if (T > 1)
    for (int64_t b = 0; b < blocks; b++) {
        float e[XENT_BLOCK];
        double lse[XENT_BLOCK];
        const int64_t r0 = b * R, rows = N - r0 < R ? N - r0 : R;
        const float *xb = x + r0 * C;
        lse_block_f32(xb, rows, C, lse, e);
        if (!dloss) {
            for (int64_t r = 0; r < rows; r++) {
                int64_t unused;
                out[r0 + r] = (float)(lse[r] - (double)xb[r * C + label_of(tdtype, t, r0 + r, C, &unused)]);
            }
            continue;
        }
        /* d/dx of -log softmax(x)[label] is softmax(x) - onehot(label), times dloss */
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < C; c++) e[r * C + c] = (float)((double)xb[r * C + c] - lse[r]);
        const int64_t n = rows * C;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) e[i] = sg_vexpf(e[i]);
        for (int64_t r = 0; r < rows; r++) {
            const double g = dloss[r0 + r];
            float *d = out + (r0 + r) * C;
            for (int64_t c = 0; c < C; c++) d[c] = (float)((double)e[r * C + c] * g);
            int64_t unused;
            const int64_t label = label_of(tdtype, t, r0 + r, C, &unused);
            d[label] = (float)(expm1((double)xb[r * C + label] - lse[r]) * g); /* p - 1 without cancellation */
        }
    }
}

static int check_target(int dtype, int tdtype) {
    if (!sg_is_float(dtype)) return SG_EDTYPE;
    if (tdtype != SG_I32 && tdtype != SG_I64 && !sg_is_float(tdtype)) return SG_EDTYPE;
    return SG_OK;
}

int sg_softmax_cross_entropy(int dtype, const char *x, int64_t xo, int tdtype, const char *t, int64_t to,
                             char *loss, int64_t lo, int64_t N, int64_t C, int64_t *bad) {
    int err = check_target(dtype, tdtype);
    if (err) return err;
    const int fs = sg_itemsize(dtype), labels = tdtype == SG_I32 || tdtype == SG_I64;
    x += xo * fs;
    t += to * sg_itemsize(tdtype);
    loss += lo * fs;
    if (labels) /* validate first, so that a bad label leaves the output alone */
        for (int64_t n = 0; n < N; n++)
            if (label_of(tdtype, t, n, C, bad) < 0) return SG_EINDEX;
    if (dtype == SG_F32 && labels && C > 0 && C <= XENT_BLOCK) {
        xent_labels_f32((const float *)x, tdtype, t, NULL, (float *)loss, N, C);
        return SG_OK;
    }
    const int T = sg_threads_for(N * C, 1 << 13);
#pragma omp parallel for schedule(static) num_threads(T) if (T > 1)
    for (int64_t n = 0; n < N; n++) {
        const char *row = x + n * C * fs;
        const double lse = C ? row_lse(row, dtype, C) : NAN;
        double l;
        if (labels) {
            int64_t unused;
            l = lse - sg_ldf(row, dtype, label_of(tdtype, t, n, C, &unused));
        } else { /* -sum t (x - lse) */
            double st = 0.0, stx = 0.0;
            for (int64_t c = 0; c < C; c++) {
                const double tc = sg_ldf(t, tdtype, n * C + c);
                st += tc;
                stx += tc * sg_ldf(row, dtype, c);
            }
            l = C ? st * lse - stx : 0.0;
        }
        sg_stf(loss, dtype, n, l);
    }
    return SG_OK;
}

int sg_softmax_cross_entropy_backward(int dtype, const char *dloss, int64_t dlo, const char *x, int64_t xo,
                                      int tdtype, const char *t, int64_t to, char *dx, int64_t dxo, int64_t N,
                                      int64_t C, int64_t *bad) {
    int err = check_target(dtype, tdtype);
    if (err) return err;
    const int fs = sg_itemsize(dtype), labels = tdtype == SG_I32 || tdtype == SG_I64;
    x += xo * fs;
    dloss += dlo * fs;
    t += to * sg_itemsize(tdtype);
    dx += dxo * fs;
    if (labels)
        for (int64_t n = 0; n < N; n++)
            if (label_of(tdtype, t, n, C, bad) < 0) return SG_EINDEX;
    if (dtype == SG_F32 && labels && C > 0 && C <= XENT_BLOCK) {
        xent_labels_f32((const float *)x, tdtype, t, (const float *)dloss, (float *)dx, N, C);
        return SG_OK;
    }
    const int T = sg_threads_for(N * C, 1 << 13);
#pragma omp parallel for schedule(static) num_threads(T) if (T > 1)
    for (int64_t n = 0; n < N; n++) {
        const char *row = x + n * C * fs;
        const double lse = row_lse(row, dtype, C), g = sg_ldf(dloss, dtype, n);
        /* d/dx of -sum t log softmax(x) is softmax(x) * sum(t) - t */
        double st = 1.0;
        int64_t label = -1;
        if (labels) {
            int64_t unused;
            label = label_of(tdtype, t, n, C, &unused);
        } else {
            st = 0.0;
            for (int64_t c = 0; c < C; c++) st += sg_ldf(t, tdtype, n * C + c);
        }
        if (dtype == SG_F32 && labels) { /* the common case: float32 logits, class labels */
            const float *xr = (const float *)row;
            float *dr = (float *)dx + n * C;
#pragma omp simd
            for (int64_t c = 0; c < C; c++) dr[c] = (float)((double)sg_vexpf((float)(xr[c] - lse)) * g);
            dr[label] = (float)(expm1((double)xr[label] - lse) * g); /* p - 1 without cancellation near p = 1 */
            continue;
        }
        for (int64_t c = 0; c < C; c++) {
            const double p = exp(sg_ldf(row, dtype, c) - lse);
            const double tc = labels ? (c == label ? 1.0 : 0.0) : sg_ldf(t, tdtype, n * C + c);
            sg_stf(dx, dtype, n * C + c, (p * st - tc) * g);
        }
    }
    return SG_OK;
}
