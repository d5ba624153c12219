/* 2-D max and average pooling (NCHW) and their gradients; one (n, c) plane per task, float16 through float32. */
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

static void pool_forward_f32(const pgeom *q, int mode, int cip, const float *x, float *y, int64_t *idx,
                             const taps *tr, const taps *tc) {
    const int64_t planes = q->N * q->C, ohw = q->OH * q->OW, W = q->W;
    const int T = sg_threads_for(planes * ohw * q->kh * q->kw, 1 << 14);
#pragma omp parallel for schedule(static) num_threads(T) if (T > 1)
    for (int64_t p = 0; p < planes; p++) {
        const float *xp = x + p * q->H * W;
        float *yp = y + p * ohw;
        int64_t *ip = idx ? idx + p * ohw : NULL;
        for (int64_t oh = 0; oh < q->OH; oh++) {
            const int64_t i0 = tr->lo[oh], i1 = tr->hi[oh], hbase = oh * q->sh - q->pt;
            for (int64_t ow = 0; ow < q->OW; ow++) {
                const int64_t j0 = tc->lo[ow], j1 = tc->hi[ow], wbase = ow * q->sw - q->pl, o = oh * q->OW + ow;
                if (mode == POOL_MAX) {
                    float best = 0.0f;
                    int64_t bi = -1;
                    for (int64_t i = i0; i < i1; i++) {
                        const int64_t row = (hbase + i * q->dh) * W;
                        for (int64_t j = j0; j < j1; j++) {
                            const int64_t at = row + wbase + j * q->dw;
                            const float v = xp[at];
                            /* first maximum wins; a NaN beats everything and the first NaN stays. Written as
                             * selects: on real data the comparison is a coin toss, and a branch mispredicts */
                            const int take = (bi < 0) | (v > best) | ((v != v) & (best == best));
                            best = take ? v : best;
                            bi = take ? at : bi;
                        }
                    }
                    yp[o] = bi < 0 ? 0.0f : best;
                    if (ip) ip[o] = bi;
                } else {
                    double sum = 0.0;
                    for (int64_t i = i0; i < i1; i++) {
                        const float *row = xp + (hbase + i * q->dh) * W + wbase;
                        for (int64_t j = j0; j < j1; j++) sum += row[j * q->dw];
                    }
                    const int64_t inside = (i1 - i0) * (j1 - j0);
                    const int64_t div = cip ? tr->padded[oh] * tc->padded[ow] : inside;
                    yp[o] = inside == 0 ? 0.0f : (float)(sum / (double)div);
                    if (ip) ip[o] = -1; /* average windows have no winner */
                }
            }
        }
    }
}

static void pool_backward_f32(const pgeom *q, int mode, int cip, const float *dy, const float *x, const int64_t *idx,
                              float *dx, const taps *tr, const taps *tc) {
    const int64_t planes = q->N * q->C, ohw = q->OH * q->OW, hw = q->H * q->W, W = q->W;
    const int T = sg_threads_for(planes * ohw * q->kh * q->kw, 1 << 14);
#pragma omp parallel for schedule(static) num_threads(T) if (T > 1)
    for (int64_t p = 0; p < planes; p++) {
        float *dxp = dx + p * hw;
        const float *dyp = dy + p * ohw;
        memset(dxp, 0, (size_t)hw * sizeof(float));
        if (mode == POOL_MAX && idx) { /* scatter to the forward's winners */
            const int64_t *ip = idx + p * ohw;
            for (int64_t o = 0; o < ohw; o++) {
                const int64_t at = ip[o];
                if (at >= 0 && at < hw) dxp[at] += dyp[o];
            }
            continue;
        }
        const float *xp = x ? x + p * hw : NULL;
        for (int64_t oh = 0; oh < q->OH; oh++) {
            const int64_t i0 = tr->lo[oh], i1 = tr->hi[oh], hbase = oh * q->sh - q->pt;
            for (int64_t ow = 0; ow < q->OW; ow++) {
                const int64_t j0 = tc->lo[ow], j1 = tc->hi[ow], wbase = ow * q->sw - q->pl;
                const float g = dyp[oh * q->OW + ow];
                if (mode == POOL_MAX) { /* no indices: find the winner again */
                    float best = 0.0f;
                    int64_t bi = -1;
                    for (int64_t i = i0; i < i1; i++)
                        for (int64_t j = j0; j < j1; j++) {
                            const int64_t at = (hbase + i * q->dh) * W + wbase + j * q->dw;
                            const float v = xp[at];
                            const int take = (bi < 0) | (v > best) | ((v != v) & (best == best));
                            best = take ? v : best;
                            bi = take ? at : bi;
                        }
                    if (bi >= 0) dxp[bi] += g;
                    continue;
                }
                const int64_t inside = (i1 - i0) * (j1 - j0);
                if (inside == 0) continue;
                const float share = (float)((double)g / (double)(cip ? tr->padded[oh] * tc->padded[ow] : inside));
                for (int64_t i = i0; i < i1; i++) {
                    float *row = dxp + (hbase + i * q->dh) * W + wbase;
                    for (int64_t j = j0; j < j1; j++) row[j * q->dw] += share;
                }
            }
        }
    }
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

int sg_pool2d(int dtype, int mode, int count_include_pad, const char *x, int64_t xo, char *y, int64_t yo, char *idx,
              int64_t io, const int64_t *geom) {
    pgeom q;
    int err = read_pgeom(geom, &q);
    if (err) return err;
    if (dtype != SG_F32 && dtype != SG_F16) return SG_EDTYPE;
    if (mode != POOL_MAX && mode != POOL_AVG) return SG_EVALUE;
    const int64_t isz = dtype == SG_F32 ? 4 : 2, ny = q.N * q.C * q.OH * q.OW;
    if (ny == 0) return SG_OK;
    int ox;
    float *fx = sg_as_f32(x + xo * isz, dtype, q.N * q.C * q.H * q.W, &ox);
    float *fy = dtype == SG_F32 ? (float *)(y + yo * isz) : (float *)malloc((size_t)ny * sizeof(float));
    taps tr, tc;
    if (!fx || !fy || open_taps(&q, &tr, &tc)) {
        err = SG_ENOMEM;
    } else {
        pool_forward_f32(&q, mode, count_include_pad, fx, fy, idx ? (int64_t *)idx + io : NULL, &tr, &tc);
        free(tr.lo);
        free(tc.lo);
    }
    if (dtype != SG_F32 && fy) {
        if (!err) sg_f2h(fy, (sg_half *)(y + yo * isz), ny);
        free(fy);
    }
    if (ox) free(fx);
    return err;
}

int sg_pool2d_backward(int dtype, int mode, int count_include_pad, const char *dy, int64_t dyo, const char *x,
                       int64_t xo, const char *idx, int64_t io, char *dx, int64_t dxo, const int64_t *geom) {
    pgeom q;
    int err = read_pgeom(geom, &q);
    if (err) return err;
    if (dtype != SG_F32 && dtype != SG_F16) return SG_EDTYPE;
    if (mode != POOL_MAX && mode != POOL_AVG) return SG_EVALUE;
    const int64_t isz = dtype == SG_F32 ? 4 : 2, nx = q.N * q.C * q.H * q.W;
    if (nx == 0) return SG_OK;
    const int need_x = mode == POOL_MAX && !idx;
    if (need_x && !x) return SG_EVALUE;
    int ody, ox = 0;
    float *fdy = sg_as_f32(dy + dyo * isz, dtype, q.N * q.C * q.OH * q.OW, &ody);
    float *fx = need_x ? sg_as_f32(x + xo * isz, dtype, nx, &ox) : NULL;
    float *fdx = dtype == SG_F32 ? (float *)(dx + dxo * isz) : (float *)malloc((size_t)nx * sizeof(float));
    taps tr, tc;
    if (!fdy || (need_x && !fx) || !fdx || open_taps(&q, &tr, &tc)) {
        err = SG_ENOMEM;
    } else {
        pool_backward_f32(&q, mode, count_include_pad, fdy, fx, idx ? (const int64_t *)idx + io : NULL, fdx, &tr, &tc);
        free(tr.lo);
        free(tc.lo);
    }
    if (dtype != SG_F32 && fdx) {
        if (!err) sg_f2h(fdx, (sg_half *)(dx + dxo * isz), nx);
        free(fdx);
    }
    if (ody) free(fdy);
    if (ox) free(fx);
    return err;
}
