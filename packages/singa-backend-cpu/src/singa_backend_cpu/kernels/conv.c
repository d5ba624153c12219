/* 2-D convolution (NCHW, cross-correlation) and its gradients, as im2col + sgemm.
 *
 * For each group, a chunk of `nb` images is unfolded into col (Cg*kh*kw, nb*OH*OW); the forward product is then
 * w_g (Kg, Cg*kh*kw) @ col, the data gradient col2im(w_g^T @ dy_g), the weight gradient dy_g @ col^T summed over the
 * chunks. Small images are batched into one chunk so that sgemm gets a wide enough matrix; large ones go one by one
 * and write straight into the output. Threads own ranges of images (one-thread products inside, per-thread scratch
 * and, for dw, per-thread sums); with fewer images than threads the unfolding and the products are split instead.
 * float16 is computed through float32 copies.
 */
#include "common.h"

#define COL_BUDGET (1 << 21) /* floats in one col buffer (8 MiB) */
#define WIDE_ENOUGH 1024     /* columns beyond which batching images buys sgemm nothing more */

typedef struct {
    int64_t N, C, H, W, K, kh, kw, OH, OW, sh, sw, pt, pl, pb, pr, dh, dw, G;
    int64_t Cg, Kg, ckk, ohw, hw;
} geometry;

static int read_geometry(const int64_t *g, geometry *q) {
    q->N = g[0]; q->C = g[1]; q->H = g[2]; q->W = g[3]; q->K = g[4]; q->kh = g[5]; q->kw = g[6];
    q->OH = g[7]; q->OW = g[8]; q->sh = g[9]; q->sw = g[10]; q->pt = g[11]; q->pl = g[12]; q->pb = g[13];
    q->pr = g[14]; q->dh = g[15]; q->dw = g[16]; q->G = g[17];
    if (q->G < 1 || q->C % q->G || q->K % q->G || q->sh < 1 || q->sw < 1 || q->dh < 1 || q->dw < 1) return SG_EVALUE;
    q->Cg = q->C / q->G;
    q->Kg = q->K / q->G;
    q->ckk = q->Cg * q->kh * q->kw;
    q->ohw = q->OH * q->OW;
    q->hw = q->H * q->W;
    return SG_OK;
}

/* images per chunk and whether col is needed at all (a 1x1, stride-1, unpadded kernel reads x as it is) */
static int64_t chunk_images(const geometry *q) {
    if (q->ohw >= WIDE_ENOUGH || q->N <= 1) return 1;
    int64_t nb = WIDE_ENOUGH / (q->ohw > 0 ? q->ohw : 1) + 1;
    const int64_t fit = COL_BUDGET / (q->ckk * q->ohw > 0 ? q->ckk * q->ohw : 1);
    if (nb > fit) nb = fit;
    if (nb > q->N) nb = q->N;
    return nb < 1 ? 1 : nb;
}
static int is_pointwise(const geometry *q) {
    return q->kh == 1 && q->kw == 1 && q->sh == 1 && q->sw == 1 && q->pt == 0 && q->pl == 0 && q->OH == q->H &&
           q->OW == q->W;
}

/* [lo, hi) of output columns whose input column ow*s - pad + j*d lies inside [0, W) */
static void valid_range(int64_t out_len, int64_t in_len, int64_t s, int64_t pad, int64_t off, int64_t *lo,
                        int64_t *hi) {
    const int64_t first = pad - off; /* need o*s >= first */
    int64_t a = first <= 0 ? 0 : (first + s - 1) / s;
    const int64_t last = in_len - 1 + pad - off; /* need o*s <= last */
    int64_t b = last < 0 ? 0 : last / s + 1;
    if (a > out_len) a = out_len;
    if (b > out_len) b = out_len;
    if (b < a) b = a;
    *lo = a;
    *hi = b;
}

/* Threads for a loop of `work` elements: none when the caller is already one of several threads (par = 0). */
static int inner_threads(int par, int64_t work) { return par ? sg_threads_for(work, 1 << 15) : 1; }

/* col rows of images [n0, n0 + nb), group g: row (c, i, j), column (image, oh, ow) */
static void im2col(const geometry *q, const float *x, int64_t n0, int64_t nb, int64_t g, float *col, int par) {
    const int64_t rows = q->ckk, ld = nb * q->ohw;
    const int T = inner_threads(par, rows * ld);
#pragma omp parallel for collapse(2) schedule(static) num_threads(T) if (T > 1)
    for (int64_t img = 0; img < nb; img++) {
        for (int64_t row = 0; row < rows; row++) {
            const int64_t c = row / (q->kh * q->kw), i = (row / q->kw) % q->kh, j = row % q->kw;
            const float *plane = x + ((n0 + img) * q->C + g * q->Cg + c) * q->hw;
            float *dst = col + row * ld + img * q->ohw;
            int64_t lo, hi;
            valid_range(q->OW, q->W, q->sw, q->pl, j * q->dw, &lo, &hi);
            for (int64_t oh = 0; oh < q->OH; oh++) {
                float *d = dst + oh * q->OW;
                const int64_t ih = oh * q->sh - q->pt + i * q->dh;
                if (ih < 0 || ih >= q->H) {
                    memset(d, 0, (size_t)q->OW * sizeof(float));
                    continue;
                }
                const float *src = plane + ih * q->W - q->pl + j * q->dw;
                for (int64_t ow = 0; ow < lo; ow++) d[ow] = 0.0f;
                if (q->sw == 1)
                    memcpy(d + lo, src + lo, (size_t)(hi - lo) * sizeof(float));
                else
                    for (int64_t ow = lo; ow < hi; ow++) d[ow] = src[ow * q->sw];
                for (int64_t ow = hi; ow < q->OW; ow++) d[ow] = 0.0f;
            }
        }
    }
}

/* dx[images, group g] += fold of col; one thread per (image, channel) plane, so no two threads add to one element */
static void col2im(const geometry *q, const float *col, int64_t n0, int64_t nb, int64_t g, float *dx, int par) {
    const int64_t ld = nb * q->ohw, kk = q->kh * q->kw;
    const int T = inner_threads(par, q->ckk * ld);
#pragma omp parallel for collapse(2) schedule(static) num_threads(T) if (T > 1)
    for (int64_t img = 0; img < nb; img++) {
        for (int64_t c = 0; c < q->Cg; c++) {
            float *plane = dx + ((n0 + img) * q->C + g * q->Cg + c) * q->hw;
            for (int64_t r = 0; r < kk; r++) {
                const int64_t i = r / q->kw, j = r % q->kw;
                const float *src = col + (c * kk + r) * ld + img * q->ohw;
                int64_t lo, hi;
                valid_range(q->OW, q->W, q->sw, q->pl, j * q->dw, &lo, &hi);
                for (int64_t oh = 0; oh < q->OH; oh++) {
                    const int64_t ih = oh * q->sh - q->pt + i * q->dh;
                    if (ih < 0 || ih >= q->H) continue;
                    float *d = plane + ih * q->W - q->pl + j * q->dw;
                    const float *sv = src + oh * q->OW;
                    if (q->sw == 1) {
#pragma omp simd
                        for (int64_t ow = lo; ow < hi; ow++) d[ow] += sv[ow];
                    } else {
                        for (int64_t ow = lo; ow < hi; ow++) d[ow * q->sw] += sv[ow];
                    }
                }
            }
        }
    }
}

/* Copy between y-layout (image, channel block of `rows`, ohw) and the chunk layout (rows, nb * ohw). */
static void chunk_gather(const geometry *q, const float *y, int64_t nchan, int64_t c0, int64_t rows, int64_t n0,
                         int64_t nb, float *t) {
    for (int64_t img = 0; img < nb; img++)
        for (int64_t r = 0; r < rows; r++)
            memcpy(t + r * nb * q->ohw + img * q->ohw, y + ((n0 + img) * nchan + c0 + r) * q->ohw,
                   (size_t)q->ohw * sizeof(float));
}
static void chunk_scatter(const geometry *q, const float *t, int64_t nchan, int64_t c0, int64_t rows, int64_t n0,
                          int64_t nb, float *y) {
    for (int64_t img = 0; img < nb; img++)
        for (int64_t r = 0; r < rows; r++)
            memcpy(y + ((n0 + img) * nchan + c0 + r) * q->ohw, t + r * nb * q->ohw + img * q->ohw,
                   (size_t)q->ohw * sizeof(float));
}

/* Per-thread scratch: col (ckk, nb * ohw) and, when images are batched, a (Kg, nb * ohw) staging block. */
typedef struct {
    float *col, *tmp;
} scratch;

static int scratch_open(const geometry *q, int64_t nb, int need_col, scratch *s) {
    s->col = need_col ? (float *)malloc((size_t)(q->ckk * nb * q->ohw) * sizeof(float)) : NULL;
    s->tmp = nb > 1 ? (float *)malloc((size_t)(q->Kg * nb * q->ohw) * sizeof(float)) : NULL;
    return (need_col && !s->col) || (nb > 1 && !s->tmp) ? SG_ENOMEM : SG_OK;
}
static void scratch_close(scratch *s) {
    free(s->col);
    free(s->tmp);
}

/* How the work is spread: `T` threads each own a contiguous range of images, with one-thread products inside; or,
 * with fewer images than threads, one range whose unfolding and products are split over the threads instead. */
static int image_threads(const geometry *q) {
    const int T = sg_threads_for(q->N * q->K * q->ohw * (q->ckk > 0 ? q->ckk : 1), 1 << 18);
    return q->N >= T ? T : 1;
}

/* -- forward ---------------------------------------------------------------------------------------------------- */
static void forward_images(const geometry *q, const float *x, const float *w, float *y, int64_t lo, int64_t hi,
                           int64_t nb, scratch *s, int par) {
    const int direct = is_pointwise(q);
    for (int64_t n0 = lo; n0 < hi; n0 += nb) {
        const int64_t cnt = sg_min64(nb, hi - n0), ld = cnt * q->ohw;
        for (int64_t g = 0; g < q->G; g++) {
            const float *wg = w + g * q->Kg * q->ckk;
            const float *B = s->col;
            int64_t ldb = ld;
            if (direct && cnt == 1) {
                B = x + (n0 * q->C + g * q->Cg) * q->hw;
                ldb = q->hw;
            } else {
                im2col(q, x, n0, cnt, g, s->col, par);
            }
            if (cnt == 1) {
                sg_sgemm(0, 0, q->Kg, q->ohw, q->ckk, 1.0f, wg, q->ckk, B, ldb, 0.0f,
                         y + (n0 * q->K + g * q->Kg) * q->ohw, q->ohw, par);
            } else {
                sg_sgemm(0, 0, q->Kg, ld, q->ckk, 1.0f, wg, q->ckk, B, ldb, 0.0f, s->tmp, ld, par);
                chunk_scatter(q, s->tmp, q->K, g * q->Kg, q->Kg, n0, cnt, y);
            }
        }
    }
}

static int conv_forward_f32(const geometry *q, const float *x, const float *w, const float *b, float *y) {
    const int T = image_threads(q);
    const int need_col = !is_pointwise(q) || chunk_images(q) > 1;
    int err = SG_OK;
#pragma omp parallel num_threads(T) if (T > 1)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t lo = q->N * t / nt, hi = q->N * (t + 1) / nt;
        const int64_t nb = sg_min64(chunk_images(q), sg_max64(hi - lo, 1));
        scratch s;
        if (scratch_open(q, nb, need_col || nb > 1, &s)) {
#pragma omp atomic write
            err = SG_ENOMEM;
        } else {
            forward_images(q, x, w, y, lo, hi, nb, &s, nt == 1);
        }
        scratch_close(&s);
    }
    if (err || !b) return err;
    const int TB = sg_threads_for(q->N * q->K * q->ohw, 1 << 15);
#pragma omp parallel for collapse(2) schedule(static) num_threads(TB) if (TB > 1)
    for (int64_t n = 0; n < q->N; n++)
        for (int64_t k = 0; k < q->K; k++) {
            float *p = y + (n * q->K + k) * q->ohw;
            const float bk = b[k];
#pragma omp simd
            for (int64_t i = 0; i < q->ohw; i++) p[i] += bk;
        }
    return SG_OK;
}

/* -- gradient with respect to x --------------------------------------------------------------------------------- */
static void backward_data_images(const geometry *q, const float *dy, const float *w, float *dx, int64_t lo, int64_t hi,
                                 int64_t nb, scratch *s, int par) {
    const int direct = is_pointwise(q);
    for (int64_t n0 = lo; n0 < hi; n0 += nb) {
        const int64_t cnt = sg_min64(nb, hi - n0), ld = cnt * q->ohw;
        if (!direct) memset(dx + n0 * q->C * q->hw, 0, (size_t)(cnt * q->C * q->hw) * sizeof(float));
        for (int64_t g = 0; g < q->G; g++) {
            const float *wg = w + g * q->Kg * q->ckk;
            const float *D = dy + (n0 * q->K + g * q->Kg) * q->ohw;
            int64_t ldd = q->ohw;
            if (cnt > 1) {
                chunk_gather(q, dy, q->K, g * q->Kg, q->Kg, n0, cnt, s->tmp);
                D = s->tmp;
                ldd = ld;
            }
            if (direct && cnt == 1) { /* dx_g = w_g^T @ dy_g, nothing to fold */
                sg_sgemm(1, 0, q->ckk, q->ohw, q->Kg, 1.0f, wg, q->ckk, D, ldd, 0.0f,
                         dx + (n0 * q->C + g * q->Cg) * q->hw, q->hw, par);
                continue;
            }
            sg_sgemm(1, 0, q->ckk, ld, q->Kg, 1.0f, wg, q->ckk, D, ldd, 0.0f, s->col, ld, par);
            if (direct)
                chunk_scatter(q, s->col, q->C, g * q->Cg, q->Cg, n0, cnt, dx);
            else
                col2im(q, s->col, n0, cnt, g, dx, par);
        }
    }
}

static int conv_backward_data_f32(const geometry *q, const float *dy, const float *w, float *dx) {
    const int T = image_threads(q);
    int err = SG_OK;
#pragma omp parallel num_threads(T) if (T > 1)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t lo = q->N * t / nt, hi = q->N * (t + 1) / nt;
        const int64_t nb = sg_min64(chunk_images(q), sg_max64(hi - lo, 1));
        scratch s;
        if (scratch_open(q, nb, 1, &s)) {
#pragma omp atomic write
            err = SG_ENOMEM;
        } else {
            backward_data_images(q, dy, w, dx, lo, hi, nb, &s, nt == 1);
        }
        scratch_close(&s);
    }
    return err;
}

/* -- gradient with respect to w: each thread sums its images into its own copy of dw, then the copies are added -- */
static void backward_weight_images(const geometry *q, const float *dy, const float *x, float *dw, int64_t lo,
                                   int64_t hi, int64_t nb, scratch *s, int par) {
    const int direct = is_pointwise(q);
    for (int64_t n0 = lo; n0 < hi; n0 += nb) {
        const int64_t cnt = sg_min64(nb, hi - n0), ld = cnt * q->ohw;
        for (int64_t g = 0; g < q->G; g++) {
            const float *D = dy + (n0 * q->K + g * q->Kg) * q->ohw;
            int64_t ldd = q->ohw;
            if (cnt > 1) {
                chunk_gather(q, dy, q->K, g * q->Kg, q->Kg, n0, cnt, s->tmp);
                D = s->tmp;
                ldd = ld;
            }
            const float *B = s->col;
            int64_t ldb = ld;
            if (direct && cnt == 1) {
                B = x + (n0 * q->C + g * q->Cg) * q->hw;
                ldb = q->hw;
            } else {
                im2col(q, x, n0, cnt, g, s->col, par);
            }
            sg_sgemm(0, 1, q->Kg, q->ckk, ld, 1.0f, D, ldd, B, ldb, n0 == lo ? 0.0f : 1.0f, dw + g * q->Kg * q->ckk,
                     q->ckk, par);
        }
    }
}

static int conv_backward_weight_f32(const geometry *q, const float *dy, const float *x, float *dw) {
    const int64_t nw = q->K * q->ckk;
    if (q->N == 0 || q->ohw == 0) {
        memset(dw, 0, (size_t)nw * sizeof(float));
        return SG_OK;
    }
    const int T = image_threads(q);
    float *partial = T > 1 ? (float *)malloc((size_t)(nw * (T - 1)) * sizeof(float)) : NULL;
    if (T > 1 && !partial) return SG_ENOMEM;
    int err = SG_OK;
#pragma omp parallel num_threads(T) if (T > 1)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t lo = q->N * t / nt, hi = q->N * (t + 1) / nt;
        const int64_t nb = sg_min64(chunk_images(q), sg_max64(hi - lo, 1));
        float *mine = t == 0 ? dw : partial + (t - 1) * nw;
        scratch s;
        if (scratch_open(q, nb, 1, &s)) {
#pragma omp atomic write
            err = SG_ENOMEM;
        } else if (hi > lo) {
            backward_weight_images(q, dy, x, mine, lo, hi, nb, &s, nt == 1);
        } else {
            memset(mine, 0, (size_t)nw * sizeof(float));
        }
        scratch_close(&s);
#pragma omp barrier
        /* add the other threads' sums into dw, each thread a slice of it */
        const int64_t a = sg_chunk(nw, t, nt), e = sg_chunk(nw, t + 1, nt);
        for (int u = 1; u < nt; u++) {
            const float *p = partial + (u - 1) * nw;
#pragma omp simd
            for (int64_t i = a; i < e; i++) dw[i] += p[i];
        }
    }
    free(partial);
    return err;
}

/* float16: run the float32 kernel on converted copies */
static int to_f32(const char *p, int dtype, int64_t n, float **out, int *owned) {
    *out = sg_as_f32(p, dtype, n, owned);
    return *out ? SG_OK : SG_ENOMEM;
}

int sg_conv2d(int dtype, const char *x, int64_t xo, const char *w, int64_t wo, const char *b, int64_t bo, char *y,
              int64_t yo, const int64_t *geom) {
    geometry q;
    int err = read_geometry(geom, &q);
    if (err) return err;
    if (dtype != SG_F32 && dtype != SG_F16) return SG_EDTYPE;
    const int64_t isz = dtype == SG_F32 ? 4 : 2, ny = q.N * q.K * q.ohw;
    if (ny == 0) return SG_OK;
    if (q.ckk == 0) { /* nothing to correlate: the bias alone */
        for (int64_t i = 0; i < ny; i++)
            sg_stf(y + yo * isz, dtype, i, b ? sg_ldf(b + bo * isz, dtype, (i / q.ohw) % q.K) : 0.0f);
        return SG_OK;
    }
    float *fx, *fw, *fb = NULL, *fy;
    int ox, ow_, ob = 0, oy = 0;
    if ((err = to_f32(x + xo * isz, dtype, q.N * q.C * q.hw, &fx, &ox))) return err;
    if ((err = to_f32(w + wo * isz, dtype, q.K * q.ckk, &fw, &ow_))) { if (ox) free(fx); return err; }
    if (b && (err = to_f32(b + bo * isz, dtype, q.K, &fb, &ob))) goto done;
    fy = dtype == SG_F32 ? (float *)(y + yo * isz) : (float *)malloc((size_t)ny * sizeof(float));
    oy = dtype != SG_F32;
    if (!fy) { err = SG_ENOMEM; goto done; }
    err = conv_forward_f32(&q, fx, fw, fb, fy);
    if (oy) { if (!err) sg_f2h(fy, (sg_half *)(y + yo * isz), ny); free(fy); }
done:
    if (ox) free(fx);
    if (ow_) free(fw);
    if (ob) free(fb);
    return err;
}

int sg_conv2d_backward_data(int dtype, const char *dy, int64_t dyo, const char *w, int64_t wo, char *dx, int64_t dxo,
                            const int64_t *geom) {
    geometry q;
    int err = read_geometry(geom, &q);
    if (err) return err;
    if (dtype != SG_F32 && dtype != SG_F16) return SG_EDTYPE;
    const int64_t isz = dtype == SG_F32 ? 4 : 2, nx = q.N * q.C * q.hw;
    if (nx == 0) return SG_OK;
    char *dxp = dx + dxo * isz;
    if (q.ohw == 0 || q.K == 0 || q.kh * q.kw == 0) {
        memset(dxp, 0, (size_t)(nx * isz));
        return SG_OK;
    }
    float *fdy, *fw, *fdx;
    int ody, ow_;
    if ((err = to_f32(dy + dyo * isz, dtype, q.N * q.K * q.ohw, &fdy, &ody))) return err;
    if ((err = to_f32(w + wo * isz, dtype, q.K * q.ckk, &fw, &ow_))) { if (ody) free(fdy); return err; }
    fdx = dtype == SG_F32 ? (float *)dxp : (float *)malloc((size_t)nx * sizeof(float));
    if (!fdx) {
        err = SG_ENOMEM;
    } else {
        err = conv_backward_data_f32(&q, fdy, fw, fdx);
        if (dtype != SG_F32) { if (!err) sg_f2h(fdx, (sg_half *)dxp, nx); free(fdx); }
    }
    if (ody) free(fdy);
    if (ow_) free(fw);
    return err;
}

int sg_conv2d_backward_weight(int dtype, const char *dy, int64_t dyo, const char *x, int64_t xo, char *dw,
                              int64_t dwo, const int64_t *geom) {
    geometry q;
    int err = read_geometry(geom, &q);
    if (err) return err;
    if (dtype != SG_F32 && dtype != SG_F16) return SG_EDTYPE;
    const int64_t isz = dtype == SG_F32 ? 4 : 2, nw = q.K * q.ckk;
    if (nw == 0) return SG_OK;
    char *dwp = dw + dwo * isz;
    float *fdy, *fx, *fdw;
    int ody, ox;
    if ((err = to_f32(dy + dyo * isz, dtype, q.N * q.K * q.ohw, &fdy, &ody))) return err;
    if ((err = to_f32(x + xo * isz, dtype, q.N * q.C * q.hw, &fx, &ox))) { if (ody) free(fdy); return err; }
    fdw = dtype == SG_F32 ? (float *)dwp : (float *)malloc((size_t)nw * sizeof(float));
    if (!fdw) {
        err = SG_ENOMEM;
    } else {
        err = conv_backward_weight_f32(&q, fdy, fx, fdw);
        if (dtype != SG_F32) { if (!err) sg_f2h(fdw, (sg_half *)dwp, nw); free(fdw); }
    }
    if (ody) free(fdy);
    if (ox) free(fx);
    return err;
}
