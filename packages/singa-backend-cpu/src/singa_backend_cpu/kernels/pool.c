/* 2-D max and average pooling (NCHW) and their gradients; one (n, c) plane per task. The kernels are in pool_real.h
 * (float32 and float64); float16 goes through float32 copies. */
#include "common.h"

enum { POOL_MAX = 0, POOL_AVG = 1 };

typedef struct {
    int64_t N, C, H, W, OH, OW, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw;
} pgeom;

static int read_pgeom(const int64_t *g, pgeom *q) {
    q->N = g[0]; q->C = g[1]; q->H = g[2]; q->W = g[3]; q->OH = g[4]; q->OW = g[5]; q->kh = g[6]; q->kw = g[7];
    q->sh = g[8]; q->sw = g[9]; q->pt = g[10]; q->pl = g[11]; q->pb = g[12]; q->pr = g[13]; q->dh = g[14];
    q->dw = g[15];
    return (q->sh < 1 || q->sw < 1 || q->dh < 1 || q->dw < 1) ? SG_EVALUE : SG_OK;
}

/* Window positions along one axis: for output o, kernel taps [lo[o], hi[o]) land inside [0, len) (evenly spaced taps:
 * the inside ones are one run), and `padded[o]` taps inside the declared padding [-pad_lo, len + pad_hi). Computed
 * once per call, so that the window loops below carry no bounds checks. */
typedef struct {
    int64_t *lo, *hi, *padded;
} taps;

static int taps_open(taps *t, int64_t out_len, int64_t len, int64_t k, int64_t s, int64_t pad_lo, int64_t pad_hi,
                     int64_t d) {
    t->lo = (int64_t *)malloc((size_t)(3 * (out_len > 0 ? out_len : 1)) * sizeof(int64_t));
    if (!t->lo) return SG_ENOMEM;
    t->hi = t->lo + out_len;
    t->padded = t->hi + out_len;
    for (int64_t o = 0; o < out_len; o++) {
        int64_t a = k, b = 0, p = 0;
        for (int64_t i = 0; i < k; i++) {
            const int64_t h = o * s - pad_lo + i * d;
            if (h >= 0 && h < len) {
                if (a == k) a = i;
                b = i + 1;
            }
            p += h >= -pad_lo && h < len + pad_hi;
        }
        t->lo[o] = a == k ? 0 : a;
        t->hi[o] = b;
        t->padded[o] = p;
    }
    return SG_OK;
}

static int open_taps(const pgeom *q, taps *tr, taps *tc) {
    tc->lo = NULL;
    if (taps_open(tr, q->OH, q->H, q->kh, q->sh, q->pt, q->pb, q->dh)) return SG_ENOMEM;
    if (taps_open(tc, q->OW, q->W, q->kw, q->sw, q->pl, q->pr, q->dw)) {
        free(tr->lo);
        return SG_ENOMEM;
    }
    return SG_OK;
}

#define SG_REAL_TEMPLATE "pool_real.h"
#include "real.h"

int sg_pool2d(int dtype, int mode, int count_include_pad, const char *x, int64_t xo, char *y, int64_t yo, char *idx,
              int64_t io, const int64_t *geom) {
    pgeom q;
    int err = read_pgeom(geom, &q);
    if (err) return err;
    if (!sg_is_float(dtype)) return SG_EDTYPE;
    if (mode != POOL_MAX && mode != POOL_AVG) return SG_EVALUE;
    const int64_t isz = sg_itemsize(dtype), ny = q.N * q.C * q.OH * q.OW;
    if (ny == 0) return SG_OK;
    taps tr, tc;
    if (open_taps(&q, &tr, &tc)) return SG_ENOMEM;
    int64_t *ip = idx ? (int64_t *)idx + io : NULL;
    if (dtype == SG_F64) {
        pool_forward_f64(&q, mode, count_include_pad, (const double *)x + xo, (double *)y + yo, ip, &tr, &tc);
    } else {
        int ox;
        float *fx = sg_as_f32(x + xo * isz, dtype, q.N * q.C * q.H * q.W, &ox);
        float *fy = dtype == SG_F32 ? (float *)(y + yo * isz) : (float *)malloc((size_t)ny * sizeof(float));
        if (!fx || !fy)
            err = SG_ENOMEM;
        else
            pool_forward_f32(&q, mode, count_include_pad, fx, fy, ip, &tr, &tc);
        if (dtype == SG_F16 && fy) {
            if (!err) sg_f2h(fy, (sg_half *)(y + yo * isz), ny);
            free(fy);
        }
        if (ox) free(fx);
    }
    free(tr.lo);
    free(tc.lo);
    return err;
}

int sg_pool2d_backward(int dtype, int mode, int count_include_pad, const char *dy, int64_t dyo, const char *x,
                       int64_t xo, const char *idx, int64_t io, char *dx, int64_t dxo, const int64_t *geom) {
    pgeom q;
    int err = read_pgeom(geom, &q);
    if (err) return err;
    if (!sg_is_float(dtype)) return SG_EDTYPE;
    if (mode != POOL_MAX && mode != POOL_AVG) return SG_EVALUE;
    const int64_t isz = sg_itemsize(dtype), nx = q.N * q.C * q.H * q.W;
    if (nx == 0) return SG_OK;
    const int need_x = mode == POOL_MAX && !idx;
    if (need_x && !x) return SG_EVALUE;
    taps tr, tc;
    if (open_taps(&q, &tr, &tc)) return SG_ENOMEM;
    const int64_t *ip = idx ? (const int64_t *)idx + io : NULL;
    if (dtype == SG_F64) {
        pool_backward_f64(&q, mode, count_include_pad, (const double *)dy + dyo, need_x ? (const double *)x + xo : NULL,
                          ip, (double *)dx + dxo, &tr, &tc);
    } else {
        int ody, ox = 0;
        float *fdy = sg_as_f32(dy + dyo * isz, dtype, q.N * q.C * q.OH * q.OW, &ody);
        float *fx = need_x ? sg_as_f32(x + xo * isz, dtype, nx, &ox) : NULL;
        float *fdx = dtype == SG_F32 ? (float *)(dx + dxo * isz) : (float *)malloc((size_t)nx * sizeof(float));
        if (!fdy || (need_x && !fx) || !fdx)
            err = SG_ENOMEM;
        else
            pool_backward_f32(&q, mode, count_include_pad, fdy, fx, ip, fdx, &tr, &tc);
        if (dtype == SG_F16 && fdx) {
            if (!err) sg_f2h(fdx, (sg_half *)(dx + dxo * isz), nx);
            free(fdx);
        }
        if (ody) free(fdy);
        if (ox) free(fx);
    }
    free(tr.lo);
    free(tc.lo);
    return err;
}
