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

/* The window of output (oh, ow): how many of its positions are inside the input and inside the declared padding. */
static void window_counts(const pgeom *q, int64_t oh, int64_t ow, int64_t *inside, int64_t *padded) {
    int64_t rin = 0, rpad = 0, cin = 0, cpad = 0;
    for (int64_t i = 0; i < q->kh; i++) {
        const int64_t h = oh * q->sh - q->pt + i * q->dh;
        rin += h >= 0 && h < q->H;
        rpad += h >= -q->pt && h < q->H + q->pb;
    }
    for (int64_t j = 0; j < q->kw; j++) {
        const int64_t w = ow * q->sw - q->pl + j * q->dw;
        cin += w >= 0 && w < q->W;
        cpad += w >= -q->pl && w < q->W + q->pr;
    }
    *inside = rin * cin;
    *padded = rpad * cpad;
}

/* Index h*W+w of the first maximum of the window (a NaN wins, the first one), -1 for an empty window. */
static inline int64_t window_argmax(const pgeom *q, const float *x, int64_t oh, int64_t ow, float *best_out) {
    float best = 0.0f;
    int64_t bi = -1;
    for (int64_t i = 0; i < q->kh; i++) {
        const int64_t h = oh * q->sh - q->pt + i * q->dh;
        if (h < 0 || h >= q->H) continue;
        for (int64_t j = 0; j < q->kw; j++) {
            const int64_t w = ow * q->sw - q->pl + j * q->dw;
            if (w < 0 || w >= q->W) continue;
            const float v = x[h * q->W + w];
            if (bi < 0 || v > best || (v != v && best == best)) {
                best = v;
                bi = h * q->W + w;
            }
        }
    }
    *best_out = bi < 0 ? 0.0f : best;
    return bi;
}

static void pool_forward_f32(const pgeom *q, int mode, int cip, const float *x, float *y, int64_t *idx) {
    const int64_t planes = q->N * q->C, ohw = q->OH * q->OW;
    const int T = sg_threads_for(planes * ohw * q->kh * q->kw, 1 << 14);
#pragma omp parallel for schedule(static) num_threads(T) if (T > 1)
    for (int64_t p = 0; p < planes; p++) {
        const float *xp = x + p * q->H * q->W;
        float *yp = y + p * ohw;
        for (int64_t oh = 0; oh < q->OH; oh++) {
            for (int64_t ow = 0; ow < q->OW; ow++) {
                const int64_t o = oh * q->OW + ow;
                if (mode == POOL_MAX) {
                    float best;
                    const int64_t bi = window_argmax(q, xp, oh, ow, &best);
                    yp[o] = best;
                    if (idx) idx[p * ohw + o] = bi;
                    continue;
                }
                int64_t inside, padded;
                window_counts(q, oh, ow, &inside, &padded);
                double s = 0.0;
                for (int64_t i = 0; i < q->kh; i++) {
                    const int64_t h = oh * q->sh - q->pt + i * q->dh;
                    if (h < 0 || h >= q->H) continue;
                    for (int64_t j = 0; j < q->kw; j++) {
                        const int64_t w = ow * q->sw - q->pl + j * q->dw;
                        if (w >= 0 && w < q->W) s += xp[h * q->W + w];
                    }
                }
                const int64_t div = cip ? padded : inside;
                yp[o] = inside == 0 ? 0.0f : (float)(s / (double)div);
                if (idx) idx[p * ohw + o] = -1; /* average windows have no winner */
            }
        }
    }
}

static void pool_backward_f32(const pgeom *q, int mode, int cip, const float *dy, const float *x, const int64_t *idx,
                              float *dx) {
    const int64_t planes = q->N * q->C, ohw = q->OH * q->OW, hw = q->H * q->W;
    const int T = sg_threads_for(planes * ohw * q->kh * q->kw, 1 << 14);
#pragma omp parallel for schedule(static) num_threads(T) if (T > 1)
    for (int64_t p = 0; p < planes; p++) {
        float *dxp = dx + p * hw;
        const float *dyp = dy + p * ohw;
        memset(dxp, 0, (size_t)hw * sizeof(float));
        for (int64_t oh = 0; oh < q->OH; oh++) {
            for (int64_t ow = 0; ow < q->OW; ow++) {
                const int64_t o = oh * q->OW + ow;
                if (mode == POOL_MAX) {
                    int64_t bi;
                    if (idx) {
                        bi = idx[p * ohw + o];
                    } else {
                        float unused;
                        bi = window_argmax(q, x + p * hw, oh, ow, &unused);
                    }
                    if (bi >= 0 && bi < hw) dxp[bi] += dyp[o];
                    continue;
                }
                int64_t inside, padded;
                window_counts(q, oh, ow, &inside, &padded);
                if (inside == 0) continue;
                const float g = (float)((double)dyp[o] / (double)(cip ? padded : inside));
                for (int64_t i = 0; i < q->kh; i++) {
                    const int64_t h = oh * q->sh - q->pt + i * q->dh;
                    if (h < 0 || h >= q->H) continue;
                    for (int64_t j = 0; j < q->kw; j++) {
                        const int64_t w = ow * q->sw - q->pl + j * q->dw;
                        if (w >= 0 && w < q->W) dxp[h * q->W + w] += g;
                    }
                }
            }
        }
    }
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
    if (!fx || !fy) err = SG_ENOMEM;
    else pool_forward_f32(&q, mode, count_include_pad, fx, fy, idx ? (int64_t *)idx + io : NULL);
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
    if (!fdy || (need_x && !fx) || !fdx) err = SG_ENOMEM;
    else pool_backward_f32(&q, mode, count_include_pad, fdy, fx, idx ? (const int64_t *)idx + io : NULL, fdx);
    if (dtype != SG_F32 && fdx) {
        if (!err) sg_f2h(fdx, (sg_half *)(dx + dxo * isz), nx);
        free(fdx);
    }
    if (ody) free(fdy);
    if (ox) free(fx);
    return err;
}
