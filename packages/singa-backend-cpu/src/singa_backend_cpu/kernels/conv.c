/* 2-D convolution (NCHW, cross-correlation) and its gradients, as im2col + gemm (conv_real.h, float32 and float64).
 *
 * For each group, a chunk of `nb` images is unfolded into col (Cg*kh*kw, nb*OH*OW); the forward product is then
 * w_g (Kg, Cg*kh*kw) @ col, the data gradient col2im(w_g^T @ dy_g), the weight gradient dy_g @ col^T summed over the
 * chunks. Small images are batched into one chunk so that gemm gets a wide enough matrix; large ones go one by one
 * and write straight into the output. Threads own ranges of images (one-thread products inside, per-thread scratch
 * and, for dw, per-thread sums); with fewer images than threads the unfolding and the products are split instead.
 * Depthwise convolutions (one input channel per group) skip all that: direct kernels over whole planes (dwplan below).
 * float16 is computed through float32 copies.
 */
#include "common.h"
#include "winograd.h"
#include "vec.h"

#define COL_BUDGET (1 << 21) /* elements in one col buffer (8 MiB of float32) */
#define WIDE_ENOUGH 1024     /* columns beyond which batching images buys gemm nothing more */

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

/* How the work is spread: `T` threads each own a contiguous range of images, with one-thread products inside; or,
 * with fewer images than threads, one range whose unfolding and products are split over the threads instead. */
static int image_threads(const geometry *q) {
    const int T = sg_threads_for(q->N * q->K * q->ohw * (q->ckk > 0 ? q->ckk : 1), 1 << 18);
    return q->N >= T ? T : 1;
}

/* -- depthwise: one input channel per group ----------------------------------------------------------------------
 * Direct kernels (conv_real.h: dw_*) instead of im2col and a gemm of one row per group. The input plane is copied into
 * its zero-padded form split by stride phase: phase plane (a, b) holds the padded plane's rows a, a + sh, ... and
 * columns b, b + sw, ..., PHs rows of pitch PWs. Tap (i, j) of output (oh, ow) is then element (oh + ri, ow + cj) of
 * phase plane ((i dh) % sh, (j dw) % sw), with ri = (i dh) / sh and cj = (j dw) / sw: every tap is a stride-1 run, and
 * an output plane, taken as OH rows of pitch PWs (the columns from OW on are computed and dropped), is one flat run of
 * outputs o, each the sum over the taps t of w_t * phases[o + off_t] (dw_correlate).
 * The data gradient is such a correlation too, of dy with the taps of each phase of dx: the padded position
 * (ihp sh + a, iwp sw + b) gets w_ij * dy(ihp - ri, iwp - cj) from the taps with (i dh) % sh = a and (j dw) % sw = b,
 * so dy is laid out with R = max ri zero rows above, Cc = max cj zero columns on the left, pitch Q. The weight gradient
 * is the dot product of dy (pitch PWs, zero from column OW on) with each tap's run of the phase planes. */
typedef struct {
    int64_t kk;            /* taps per output channel, kh * kw */
    int64_t PHs, PWs, PS;  /* phase planes: rows, pitch, elements from one plane to the next */
    int64_t *xoff;         /* kk: tap t = i * kw + j's offset in the phase planes */
    unsigned char *used;   /* sh * sw: phase planes that some tap reads (the others are never filled) */
    int64_t R, Cc, Q;      /* data gradient: dy below R zero rows and right of Cc zero columns, pitch Q */
    int64_t UH, UW;        /* dx phase rows [0, UH) and columns [0, UW) (the first min(OH, UH) rows of dy are read) */
    int64_t DS;            /* elements per laid-out dy plane */
    int64_t *pstart;       /* sh * sw + 1: phase ab = a * sw + b's taps are [pstart[ab], pstart[ab + 1]) of: */
    int64_t *doff, *didx;  /* Kg * kk: offset in the Kg laid-out dy planes, weight index m * kk + t in the group */
} dwplan;

/* Output elements per pass of the direct kernels' flat runs: their buffers stay in the L1 cache. */
#define DW_CHUNK 1024
/* Bytes of outputs one block of the correlation keeps in registers (conv_real.h: dw_block). */
#define DW_BLOCK_BYTES 256

/* The direct kernels take the convolutions with one input channel per group and more than one group. One group of
 * one channel stays with im2col: there one gemm computes all K filters, which was twice as fast at 64 images of
 * 28 x 28 with 32 filters of 5 x 5, and the direct weight gradient, split over channels, would run on one thread.
 * Paddings are never negative (table.py), checked anyway. */
static int is_depthwise(const geometry *q) {
    return q->Cg == 1 && q->G > 1 && q->pt >= 0 && q->pl >= 0 && q->pb >= 0 && q->pr >= 0;
}

static void dw_plan_close(dwplan *p) { free(p->xoff); }

static int dw_plan_open(const geometry *q, dwplan *p) {
    const int64_t kk = q->kh * q->kw, nph = q->sh * q->sw, nt = q->Kg * kk;
    p->kk = kk;
    p->xoff = (int64_t *)malloc((size_t)(kk + nph + 1 + 2 * nt) * sizeof(int64_t) + (size_t)nph);
    if (!p->xoff) return SG_ENOMEM;
    p->pstart = p->xoff + kk;
    p->doff = p->pstart + nph + 1;
    p->didx = p->doff + nt;
    p->used = (unsigned char *)(p->didx + nt);
    /* forward and weight gradient: the padded extent that the outputs read, split by phase */
    const int64_t PH = (q->OH - 1) * q->sh + (q->kh - 1) * q->dh + 1;
    const int64_t PW = (q->OW - 1) * q->sw + (q->kw - 1) * q->dw + 1;
    p->PHs = (PH + q->sh - 1) / q->sh;
    p->PWs = (PW + q->sw - 1) / q->sw;
    p->PS = (p->PHs + 1) * p->PWs; /* a spare row: the dropped columns of the last rows read a little past the end */
    memset(p->used, 0, (size_t)nph);
    for (int64_t i = 0; i < q->kh; i++)
        for (int64_t j = 0; j < q->kw; j++) {
            const int64_t ph = (i * q->dh % q->sh) * q->sw + j * q->dw % q->sw;
            p->xoff[i * q->kw + j] = ph * p->PS + (i * q->dh / q->sh) * p->PWs + j * q->dw / q->sw;
            p->used[ph] = 1;
        }
    /* data gradient */
    p->R = (q->kh - 1) * q->dh / q->sh;
    p->Cc = (q->kw - 1) * q->dw / q->sw;
    p->UH = (q->pt + q->H + q->sh - 1) / q->sh;
    p->UW = (q->pl + q->W + q->sw - 1) / q->sw;
    p->Q = p->Cc + sg_max64(q->OW, p->UW);
    p->DS = (p->UH + p->R + 1) * p->Q;
    int64_t at = 0;
    for (int64_t a = 0; a < q->sh; a++)
        for (int64_t b = 0; b < q->sw; b++) {
            p->pstart[a * q->sw + b] = at;
            for (int64_t m = 0; m < q->Kg; m++)
                for (int64_t i = 0; i < q->kh; i++)
                    for (int64_t j = 0; j < q->kw; j++) {
                        if (i * q->dh % q->sh != a || j * q->dw % q->sw != b) continue;
                        p->doff[at] = m * p->DS + (p->R - i * q->dh / q->sh) * p->Q + p->Cc - j * q->dw / q->sw;
                        p->didx[at++] = m * kk + i * q->kw + j;
                    }
        }
    p->pstart[nph] = at;
    return SG_OK;
}

/* Threads for `items` planes or channels of a depthwise call */
static int dw_threads(const geometry *q, int64_t items) {
    const int T = sg_threads_for(q->N * q->K * q->ohw * q->kh * q->kw, 1 << 17);
    return items < T ? (int)sg_max64(items, 1) : T;
}

/* One dense row-major product c (m x n) = a (m x k) @ b (k x n) on the calling thread (conv_real.h's pointwise
 * groups): float32 through the outside GEMM where one is set (oneDNN's sgemm), else OpenBLAS. */
#define gemm_on_thread_f32(m, n, k, a, b, c) sg_gemm_f32_on_thread(m, n, k, a, b, c)
#define gemm_on_thread_f64(m, n, k, a, b, c) sg_gemm_f64(0, 0, m, n, k, 1.0, a, k, b, n, 0.0, c, n, 0)

#define SG_REAL_TEMPLATE "conv_real.h"
#include "real.h"

/* The Winograd form g of q's convolution (forward), or of its data gradient's (dy's K channels in, C out, padded by
 * 2 - pt, 2 - pl: a stride-1 3x3 convolution of dy with the turned weights), and whether sg_winograd_conv should run
 * it (sg_winograd_fits); -1 where q is no stride-1 3x3 convolution. */
static int winograd_form(const geometry *q, int data_gradient, sg_wino *g) {
    if (q->kh != 3 || q->kw != 3 || q->sh != 1 || q->sw != 1 || q->dh != 1 || q->dw != 1 || q->G != 1) return -1;
    if (data_gradient)
        *g = (sg_wino){q->N, q->K, q->OH, q->OW, q->C, q->H, q->W, 2 - q->pt, 2 - q->pl};
    else
        *g = (sg_wino){q->N, q->C, q->H, q->W, q->K, q->OH, q->OW, q->pt, q->pl};
    return sg_winograd_fits(g);
}

int sg_conv2d_winograd(const int64_t *geom, int data_gradient) {
    geometry q;
    sg_wino g;
    return read_geometry(geom, &q) == SG_OK && winograd_form(&q, data_gradient, &g) > 0;
}

/* The forward Winograd form g of geom, for callers that keep the transformed weights: whether it has one. */
static int kept_weights_form(const int64_t *geom, sg_wino *g) {
    geometry q;
    return read_geometry(geom, &q) == SG_OK && winograd_form(&q, 0, g) >= 0 && sg_winograd_shape(g);
}

int sg_winograd_usable(const int64_t *geom) {
    sg_wino g;
    return kept_weights_form(geom, &g);
}

int sg_winograd_transform(const char *w, int64_t wo, char *u, const int64_t *geom) {
    sg_wino g;
    if (!kept_weights_form(geom, &g)) return SG_EVALUE;
    sg_winograd_weights((const float *)w + wo, (float *)u, g.C, g.K, 0);
    return SG_OK;
}

int sg_winograd_forward(const char *x, int64_t xo, const char *u, const char *b, int64_t bo, const char *r, int64_t ro,
                        char *y, int64_t yo, const int64_t *geom, int relu, int blocked) {
    sg_wino g;
    if (!kept_weights_form(geom, &g) || (blocked != 0 && blocked != 8 && blocked != 16)) return SG_EVALUE;
    return sg_winograd_run(&g, (const float *)x + xo, (const float *)u, b ? (const float *)b + bo : NULL,
                           r ? (const float *)r + ro : NULL, relu, (float *)y + yo, blocked);
}

/* float16: run the float32 kernels on converted copies; float32 and float64 data are used in place */
static int to_f32(const char *p, int dtype, int64_t n, float **out, int *owned) {
    *out = sg_as_f32(p, dtype, n, owned);
    return *out ? SG_OK : SG_ENOMEM;
}

int sg_conv2d(int dtype, const char *x, int64_t xo, const char *w, int64_t wo, const char *b, int64_t bo, char *y,
              int64_t yo, const int64_t *geom) {
    geometry q;
    int err = read_geometry(geom, &q);
    if (err) return err;
    if (!sg_is_float(dtype)) return SG_EDTYPE;
    const int64_t isz = sg_itemsize(dtype), ny = q.N * q.K * q.ohw;
    if (ny == 0) return SG_OK;
    if (q.ckk == 0) { /* nothing to correlate: the bias alone */
        for (int64_t i = 0; i < ny; i++)
            sg_stf(y + yo * isz, dtype, i, b ? sg_ldf(b + bo * isz, dtype, (i / q.ohw) % q.K) : 0.0);
        return SG_OK;
    }
    if (dtype == SG_F64)
        return conv_forward_f64(&q, (const double *)x + xo, (const double *)w + wo, b ? (const double *)b + bo : NULL,
                                (double *)y + yo);
    float *fx, *fw, *fb = NULL, *fy;
    int ox, ow_, ob = 0, oy = 0;
    if ((err = to_f32(x + xo * isz, dtype, q.N * q.C * q.hw, &fx, &ox))) return err;
    if ((err = to_f32(w + wo * isz, dtype, q.K * q.ckk, &fw, &ow_))) { if (ox) free(fx); return err; }
    if (b && (err = to_f32(b + bo * isz, dtype, q.K, &fb, &ob))) goto done;
    fy = dtype == SG_F32 ? (float *)(y + yo * isz) : (float *)malloc((size_t)ny * sizeof(float));
    oy = dtype != SG_F32;
    if (!fy) { err = SG_ENOMEM; goto done; }
    sg_wino wg;
    err = winograd_form(&q, 0, &wg) > 0 ? sg_winograd_conv(&wg, fx, fw, 0, fb, NULL, 0, fy, 0)
                                    : conv_forward_f32(&q, fx, fw, fb, fy);
    if (oy) { if (!err) sg_f2h(fy, (sg_half *)(y + yo * isz), ny); free(fy); }
done:
    if (ox) free(fx);
    if (ow_) free(fw);
    if (ob) free(fb);
    return err;
}

/* [lo, hi) of conv2d_fused's post-op pass, one loop per case (a select inside one vectorised loop became masked
 * loads from r, which with r NULL took 10x the pass's time). */
#define POST_LOOP(EXPR, RELU)                                                                                       \
    _Pragma("omp simd") for (int64_t i = lo; i < hi; i++) {                                                        \
        const __typeof__(*y) v = EXPR;                                                                             \
        y[i] = RELU ? (v < 0 ? 0 : v) : v;                                                                         \
    }
#define POST_RANGE(SUF, T)                                                                                          \
    static void post_range_##SUF(int64_t lo, int64_t hi, T *y, const T *t, const T *r, int relu) {                 \
        if (r && relu)                                                                                             \
            POST_LOOP(t[i] + r[i], 1)                                                                              \
        else if (r)                                                                                                \
            POST_LOOP(t[i] + r[i], 0)                                                                              \
        else if (relu)                                                                                             \
            POST_LOOP(t[i], 1)                                                                                     \
        else                                                                                                       \
            POST_LOOP(t[i], 0)                                                                                     \
    }
POST_RANGE(f32, float)
POST_RANGE(f64, double)

int sg_conv2d_post(int dtype, char *y, int64_t yo, const char *t, int64_t to, const char *r, int64_t ro, int64_t n,
                   int relu) {
    if (dtype == SG_F32) {
        float *yy = (float *)y + yo;
        const float *tt = (const float *)t + to, *rr = r ? (const float *)r + ro : NULL;
        SG_SPLIT(n, SG_PAR_CHEAP, post_range_f32(lo_, hi_, yy, tt, rr, relu));
    } else if (dtype == SG_F64) {
        double *yy = (double *)y + yo;
        const double *tt = (const double *)t + to, *rr = r ? (const double *)r + ro : NULL;
        SG_SPLIT(n, SG_PAR_CHEAP, post_range_f64(lo_, hi_, yy, tt, rr, relu));
    } else {
        return SG_EDTYPE;
    }
    return SG_OK;
}

int sg_conv2d_backward_data(int dtype, const char *dy, int64_t dyo, const char *w, int64_t wo, char *dx, int64_t dxo,
                            const int64_t *geom) {
    geometry q;
    int err = read_geometry(geom, &q);
    if (err) return err;
    if (!sg_is_float(dtype)) return SG_EDTYPE;
    const int64_t isz = sg_itemsize(dtype), nx = q.N * q.C * q.hw;
    if (nx == 0) return SG_OK;
    char *dxp = dx + dxo * isz;
    if (q.ohw == 0 || q.K == 0 || q.kh * q.kw == 0) {
        memset(dxp, 0, (size_t)(nx * isz));
        return SG_OK;
    }
    if (dtype == SG_F64)
        return conv_backward_data_f64(&q, (const double *)dy + dyo, (const double *)w + wo, (double *)dxp);
    float *fdy, *fw, *fdx;
    int ody, ow_;
    if ((err = to_f32(dy + dyo * isz, dtype, q.N * q.K * q.ohw, &fdy, &ody))) return err;
    if ((err = to_f32(w + wo * isz, dtype, q.K * q.ckk, &fw, &ow_))) { if (ody) free(fdy); return err; }
    fdx = dtype == SG_F32 ? (float *)dxp : (float *)malloc((size_t)nx * sizeof(float));
    if (!fdx) {
        err = SG_ENOMEM;
    } else {
        sg_wino wg;
        err = winograd_form(&q, 1, &wg) > 0 ? sg_winograd_conv(&wg, fdy, fw, 1, NULL, NULL, 0, fdx, 0)
                                        : conv_backward_data_f32(&q, fdy, fw, fdx);
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
    if (!sg_is_float(dtype)) return SG_EDTYPE;
    const int64_t isz = sg_itemsize(dtype), nw = q.K * q.ckk;
    if (nw == 0) return SG_OK;
    char *dwp = dw + dwo * isz;
    if (dtype == SG_F64)
        return conv_backward_weight_f64(&q, (const double *)dy + dyo, (const double *)x + xo, (double *)dwp);
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

/* -- channel-blocked forward convolution as unfolding + GEMM --------------------------------------------------------
 * For small images (7x7 and 14x14 at batch 1) a single wide GEMM beats oneDNN's direct AVX2 kernels: 512 -> 512 3x3
 * at 7x7 took 2.0 ms as W (512 x 4608) @ col (4608 x 49) through oneDNN's sgemm against 3.0 ms for its blocked
 * jit:avx2 convolution (AMD EPYC Zen 3, 2 threads). The unfolding reads x's blocks, the GEMM writes (K, images * OH *
 * OW), and the fold adds bias and residual, applies ReLU and writes y's blocks. Both passes move VW channels x VW
 * pixels at a time through an in-register transpose (vec.h; blocks that are multiples of VW): element by element
 * they took 2.5x longer. */
/* col's B rows of channels cb*B + l and tap (i, j), `step` apart, from tile (ohw, B): tile[p][l] -> row l, p */
static void tile_to_rows(const float *tile, int64_t ohw, int64_t B, float *dst, int64_t step) {
    int64_t p = 0;
    if (B % VW == 0)
        for (; p + VW <= ohw; p += VW)
            for (int64_t l0 = 0; l0 < B; l0 += VW) {
                vec v[VW];
                for (int t = 0; t < VW; t++) v[t] = *(const vec_u *)(tile + (p + t) * B + l0);
                transpose(v);
                for (int t = 0; t < VW; t++) *(vec_u *)(dst + (l0 + t) * step + p) = v[t];
            }
    for (; p < ohw; p++)
        for (int64_t l = 0; l < B; l++) dst[l * step + p] = tile[p * B + l];
}

/* col (C kh kw, cnt OH OW), rows in w's (c, i, j) order, from images n0 .. n0 + cnt - 1 of blocked x: each tap of a
 * channel block gathered pixel-major (B floats a pixel, zeros outside the image), then turned into B rows */
static int unfold_blocked(const geometry *q, const float *x, int64_t n0, int64_t cnt, int64_t B, float *col) {
    const int64_t CB = q->C / B, ld = cnt * q->ohw, taps = q->kh * q->kw, items = cnt * CB * taps;
    const int T = sg_threads_for(q->ckk * ld, 1 << 14);
    int err = SG_OK;
#pragma omp parallel num_threads(T) if (T > 1)
    {
        float *tile = (float *)malloc((size_t)(q->ohw * B) * sizeof(float));
        if (!tile) {
#pragma omp atomic write
            err = SG_ENOMEM;
        }
#pragma omp for schedule(static)
        for (int64_t it = 0; it < items; it++) {
            if (!tile) continue;
            const int64_t n = it / (CB * taps), cb = it / taps % CB, i = it % taps / q->kw, j = it % q->kw;
            const float *xb = x + ((n0 + n) * CB + cb) * q->hw * B;
            int64_t lo, hi;
            valid_range(q->OW, q->W, q->sw, q->pl, j * q->dw, &lo, &hi);
            for (int64_t oh = 0; oh < q->OH; oh++) {
                const int64_t ih = oh * q->sh - q->pt + i * q->dh;
                float *d = tile + oh * q->OW * B;
                if (ih < 0 || ih >= q->H) {
                    memset(d, 0, (size_t)(q->OW * B) * sizeof(float));
                    continue;
                }
                if (lo > 0) memset(d, 0, (size_t)(lo * B) * sizeof(float));
                if (hi < q->OW) memset(d + hi * B, 0, (size_t)((q->OW - hi) * B) * sizeof(float));
                const float *row = xb + (ih * q->W + j * q->dw - q->pl) * B;
                if (q->sw == 1) {
                    if (hi > lo) memcpy(d + lo * B, row + lo * B, (size_t)((hi - lo) * B) * sizeof(float));
                } else {
                    for (int64_t ow = lo; ow < hi; ow++) memcpy(d + ow * B, row + ow * q->sw * B, (size_t)B * sizeof(float));
                }
            }
            tile_to_rows(tile, q->ohw, B, col + ((cb * B) * taps + i * q->kw + j) * ld + n * q->ohw, taps * ld);
        }
        free(tile);
    }
    return err;
}

/* y's blocks of images n0 .. n0 + cnt - 1 from t (K, cnt OH OW): + bias, + r, ReLU (NaN kept) */
static void fold_blocked(const geometry *q, const float *t, int64_t n0, int64_t cnt, int64_t B, const float *bias,
                         const float *r, float *y, int relu) {
    const int64_t KB = q->K / B, ld = cnt * q->ohw, items = cnt * KB;
    const int T = sg_threads_for(q->K * ld, 1 << 14);
#pragma omp parallel for schedule(static) num_threads(T) if (T > 1)
    for (int64_t it = 0; it < items; it++) {
        const int64_t n = it / KB, kb = it % KB, at = ((n0 + n) * KB + kb) * q->ohw * B;
        const float *tk = t + kb * B * ld + n * q->ohw; /* row l of the block: tk + l * ld */
        float *yb = y + at;
        const float *rb = r ? r + at : NULL;
        int64_t p = 0;
        if (B % VW == 0)
            for (; p + VW <= q->ohw; p += VW)
                for (int64_t l0 = 0; l0 < B; l0 += VW) {
                    vec v[VW], add = {0};
                    for (int u = 0; u < VW; u++) v[u] = *(const vec_u *)(tk + (l0 + u) * ld + p);
                    transpose(v); /* v[u]: the VW channels of pixel p + u */
                    if (bias) add = *(const vec_u *)(bias + kb * B + l0);
                    for (int u = 0; u < VW; u++) {
                        vec o = v[u] + add;
                        if (rb) o += *(const vec_u *)(rb + (p + u) * B + l0);
                        if (relu) o = relu_of(o);
                        *(vec_u *)(yb + (p + u) * B + l0) = o;
                    }
                }
        for (; p < q->ohw; p++)
            for (int64_t l = 0; l < B; l++) {
                float v = tk[l * ld + p] + (bias ? bias[kb * B + l] : 0.f);
                if (rb) v += rb[p * B + l];
                yb[p * B + l] = relu && v < 0.f ? 0.f : v; /* NaN kept */
            }
    }
}

/* The calling thread's scratch for col and the product, kept between calls up to KEPT_FLOATS (the small images
 * this path wins on need ~1 MB): allocated anew at each call, the 1 MB of a 7x7 layer came back from the system as
 * fresh pages, their faults a third of the unfolding's time. Larger needs are allocated per call. */
#define KEPT_FLOATS ((size_t)1 << 20)
static __thread float *kept_scratch;
static __thread size_t kept_floats;

static float *scratch_of(size_t n) {
    if (n > KEPT_FLOATS) return (float *)malloc(n * sizeof(float));
    if (n > kept_floats) {
        free(kept_scratch);
        kept_scratch = (float *)malloc(KEPT_FLOATS * sizeof(float));
        kept_floats = kept_scratch ? KEPT_FLOATS : 0;
    }
    return n <= kept_floats ? kept_scratch : NULL;
}

int sg_conv2d_gemm_blocked(const char *x, int64_t xo, const char *w, int64_t wo, const char *b, int64_t bo,
                           const char *r, int64_t ro, char *y, int64_t yo, const int64_t *geom, int relu, int block) {
    geometry q;
    int err = read_geometry(geom, &q);
    if (err) return err;
    if (q.G != 1 || block < 1 || q.C % block || q.K % block) return SG_EVALUE;
    if (q.N == 0 || q.K == 0 || q.ohw == 0) return SG_OK;
    const float *X = (const float *)x + xo, *Wt = (const float *)w + wo;
    const float *bias = b ? (const float *)b + bo : NULL, *R = r ? (const float *)r + ro : NULL;
    float *Y = (float *)y + yo;
    const int64_t nb = chunk_images(&q);
    const size_t need = (size_t)(sg_max64(q.ckk, 1) + q.K) * (size_t)(nb * q.ohw);
    float *col = scratch_of(need);
    if (!col) return SG_ENOMEM;
    float *t = col + sg_max64(q.ckk, 1) * nb * q.ohw;
    for (int64_t n0 = 0; n0 < q.N; n0 += nb) {
        const int64_t cnt = sg_min64(nb, q.N - n0);
        if (q.ckk > 0) {
            if ((err = unfold_blocked(&q, X, n0, cnt, block, col))) break;
            sg_gemm_f32_team(q.K, cnt * q.ohw, q.ckk, Wt, col, t);
        } else {
            memset(t, 0, (size_t)(q.K * cnt * q.ohw) * sizeof(float));
        }
        fold_blocked(&q, t, n0, cnt, block, bias, R, Y, relu);
    }
    if (need > KEPT_FLOATS) free(col);
    return err;
}
