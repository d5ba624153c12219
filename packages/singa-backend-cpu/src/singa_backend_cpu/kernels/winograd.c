/* float32 3x3 stride-1 convolutions by Winograd's minimal filtering, F(4x4, 3x3) (Lavin and Gray, "Fast Algorithms
 * for Convolutional Neural Networks", 2016): each 4x4 tile of an output plane comes from the 6x6 input patch under it
 * as Y = A^T [ sum_c (G g_kc G^T) .* (B^T d_c B) ] A, so the channel sums are 36 matrix products of a quarter of the
 * direct method's multiply-adds (36 per tile and channel pair against 144). oneDNN 3.x dropped its float32 Winograd
 * kernels; on ResNet's 64- and 128-channel 3x3 layers this takes 0.4-0.7x the time of its direct ones (Intel Xeon,
 * AVX-512; docs/performance.md).
 *
 * The tiles are cut into chunks that threads take whole: a chunk's transformed inputs V[36][tiles][C] and products
 * M[36][tiles][K] stay in the thread's L2 between the three stages (input transform, the 36 products through
 * sg_gemm_f32_on_thread, output transform). Those products are small (tiles x C times C x K, C and K 16-256): oneDNN's
 * sgemm, where it is loaded, runs them without OpenBLAS's packing of both operands on every call, which took twice the
 * products' own time at 16-64 channels (AMD EPYC Zen 3, AVX2: 1x16x55x55 -> 64 1.0 -> 0.45 ms, ResNet's 64-256
 * channel layers 10-35% faster). Transforms work on VW channels at a time, one vector of the path's widest registers
 * (GCC's vector extension: 16 floats in AVX-512's, 8 in AVX2's or two SSE ones; 16-float vectors on the AVX2 path
 * were lowered to 128-bit pieces and stack traffic, at 3x the time); C and K must be multiples of 16. x and y are
 * either in channel blocks of 16 or 8 (N, C/16, H, W, 16 or N, C/8, H, W, 8: oneDNN's layouts with AVX-512 and with
 * AVX2), read and written where they lie, or NCHW: then the six input rows under a tile row are converted into
 * blocks of VW channels once for all its tiles, and its four output rows back, by VW x VW vector transposes.
 *
 * Rounding: the transforms add terms of up to 8x the inputs' size, so results differ from a direct convolution's by
 * a few units in the 6th significant digit (measured ~1e-5 of the output's largest element on ResNet layers), as
 * with cuDNN's and NNPACK's Winograd kernels; SINGA_WINOGRAD=0 turns the path off.
 */
#include "winograd.h"
#include "vec.h"

static int enabled = 1;
void sg_set_winograd(int on) { enabled = on != 0; }
int sg_get_winograd(void) { return enabled; }

static int64_t tiles_of(int64_t n) { return (n + 3) / 4; }

int sg_winograd_shape(const sg_wino *g) {
    if (!enabled || g->C < 16 || g->K < 16 || g->C % 16 || g->K % 16 || g->OH < 4 || g->OW < 4) return 0;
    /* worth it where the tiles' products are at most half the direct method's (plane edges waste tile parts) */
    return tiles_of(g->OH) * tiles_of(g->OW) * 36 * 2 <= g->OH * g->OW * 9;
}

int sg_winograd_fits(const sg_wino *g) {
    /* ... and where the transformed weights U (36 C K floats, written and then streamed through once per chunk) are
     * at most 4x the activations: past that (ResNet's 256-channel 14x14 and 512-channel 7x7 layers at batch 1) the
     * pass is memory-bound and direct kernels win, unless U is kept from call to call (constant weights:
     * sg_winograd_run's callers). 128 channels at 28x28, batch 1 (2.9x): 0.2 ms transform + 0.66 ms run against
     * oneDNN's 1.8 ms direct (AMD EPYC Zen 3, AVX2). */
    return sg_winograd_shape(g) && 36 * g->C * g->K <= 4 * g->N * (g->C * g->H * g->W + g->K * g->OH * g->OW);
}

/* r = G g over three vectors g[0], g[s], g[2 s], written to r[0], r[rs], ..., r[5 rs] */
static inline void weight_rows(const vec *g, int s, vec *r, int rs) {
    const vec g0 = g[0], g1 = g[s], g2 = g[2 * s], even = g0 + g2;
    r[0] = 0.25f * g0;
    r[rs] = (even + g1) * (-1.f / 6);
    r[2 * rs] = (even - g1) * (-1.f / 6);
    r[3 * rs] = g0 * (1.f / 24) + g1 * (1.f / 12) + g2 * (1.f / 6);
    r[4 * rs] = g0 * (1.f / 24) - g1 * (1.f / 12) + g2 * (1.f / 6);
    r[5 * rs] = g2;
}

/* U[36][Ci][Ko] = G g G^T of each 3x3 kernel g, VW output channels at a time: from w (Ko, Ci, 3, 3) as is (forward),
 * or with `flip` from w (Ci, Ko, 3, 3) turned by 180 degrees (the data gradient's convolution: dy's channels in, x's
 * out). */
void sg_winograd_weights(const float *w, float *u, int64_t ci_n, int64_t ko_n, int flip) {
    const int64_t blocks = ci_n * (ko_n / VW);
    const int T = sg_threads_for(blocks * VW, 4096);
#pragma omp parallel for num_threads(T) schedule(static)
    for (int64_t blk = 0; blk < blocks; blk++) {
        const int64_t ci = blk / (ko_n / VW), ko0 = blk % (ko_n / VW) * VW;
        vec g[9], t[18], r[6];
        float *gf = (float *)g;
        for (int l = 0; l < VW; l++) {
            const float *src = w + (flip ? ci * ko_n + ko0 + l : (ko0 + l) * ci_n + ci) * 9;
            for (int e = 0; e < 9; e++) gf[e * VW + l] = src[flip ? 8 - e : e];
        }
        for (int j = 0; j < 3; j++) weight_rows(g + j, 3, t + j, 3); /* t (6 x 3) = G g */
        for (int i = 0; i < 6; i++) {                                /* row i of t G^T */
            weight_rows(t + i * 3, 1, r, 1);
            for (int j = 0; j < 6; j++) *(vec_u *)(u + ((i * 6 + j) * ci_n + ci) * ko_n + ko0) = r[j]; /* any u */
        }
    }
}

/* r = B^T d over six vectors d[0], d[s], ..., written to r[0], r[rs], ... */
static inline void input_rows(const vec *d, int s, vec *r, int rs) {
    const vec d0 = d[0], d1 = d[s], d2 = d[2 * s], d3 = d[3 * s], d4 = d[4 * s], d5 = d[5 * s];
    r[0] = 4.f * d0 - 5.f * d2 + d4;
    r[rs] = d3 + d4 - 4.f * (d1 + d2);
    r[2 * rs] = 4.f * (d1 - d2) + d4 - d3;
    r[3 * rs] = 2.f * (d3 - d1) + d4 - d2;
    r[4 * rs] = 2.f * (d1 - d3) + d4 - d2;
    r[5 * rs] = 4.f * d1 - 5.f * d3 + d5;
}

/* o = A^T m over six vectors m[0], m[s], ..., written to o[0], o[os], ..., o[3 os] */
static inline void output_rows(const vec *m, int s, vec *o, int os) {
    const vec m0 = m[0], m1 = m[s], m2 = m[2 * s], m3 = m[3 * s], m4 = m[4 * s], m5 = m[5 * s];
    const vec p = m1 + m2, q = m1 - m2, a = m3 + m4, b = m3 - m4;
    o[0] = m0 + p + a;
    o[os] = q + 2.f * b;
    o[2 * os] = p + 4.f * a;
    o[3 * os] = q + 8.f * b + m5;
}

/* NCHW input rows ih0 .. ih0 + 5 of one image (x_img: C planes of H x W) as a strip in blocks of VW channels,
 * (C/VW, 6, W, VW), rows outside the image zero: what the tiles of one tile row read, converted once for them all. */
static void rows_to_strip(const float *x_img, int64_t C, int64_t H, int64_t W, int64_t ih0, float *strip) {
    for (int64_t c0 = 0; c0 < C; c0 += VW)
        for (int i = 0; i < 6; i++) {
            float *dst = strip + (c0 * 6 + i * VW) * W;
            const int64_t ih = ih0 + i;
            if (ih < 0 || ih >= H) {
                memset(dst, 0, (size_t)(W * VW) * sizeof(float));
                continue;
            }
            const float *src = x_img + (c0 * H + ih) * W;
            int64_t w0 = 0;
            for (; w0 + VW <= W; w0 += VW) {
                vec r[VW];
                for (int l = 0; l < VW; l++) r[l] = *(const vec_u *)(src + l * H * W + w0);
                transpose(r);
                for (int p = 0; p < VW; p++) *(vec_u *)(dst + (w0 + p) * VW) = r[p];
            }
            for (; w0 < W; w0++)
                for (int l = 0; l < VW; l++) dst[w0 * VW + l] = src[l * H * W + w0];
        }
}

/* Output columns lo .. hi - 1 of rows oh0 .. oh0 + rows - 1 of one image from a strip in blocks of VW channels
 * (K/VW, 4, OW, VW) to NCHW (y_img: K planes of OH x OW), plus the residual (r_img, NCHW, may be y_img), then ReLU. */
static void strip_to_rows(const float *strip, int64_t K, int64_t OH, int64_t OW, int64_t oh0, int rows, int64_t lo,
                          int64_t hi, float *y_img, const float *r_img, int relu) {
    for (int64_t k0 = 0; k0 < K; k0 += VW)
        for (int i = 0; i < rows; i++) {
            const float *src = strip + (k0 * 4 + i * VW) * OW;
            const int64_t row = (k0 * OH + oh0 + i) * OW;
            int64_t w0 = lo;
            for (; w0 + VW <= hi; w0 += VW) {
                vec v[VW];
                for (int p = 0; p < VW; p++) v[p] = *(const vec_u *)(src + (w0 + p) * VW);
                transpose(v);
                for (int l = 0; l < VW; l++) {
                    const int64_t at = row + l * OH * OW + w0;
                    if (r_img) v[l] += *(const vec_u *)(r_img + at);
                    if (relu) v[l] = relu_of(v[l]);
                    *(vec_u *)(y_img + at) = v[l];
                }
            }
            for (; w0 < hi; w0++)
                for (int l = 0; l < VW; l++) {
                    const int64_t at = row + l * OH * OW + w0;
                    float v = src[w0 * VW + l];
                    if (r_img) v += r_img[at];
                    if (relu && !(v > 0.f)) v = v != v ? v : 0.f; /* NaN stays NaN, as relu(NaN) */
                    y_img[at] = v;
                }
        }
}

/* The VW channels at p: one load where they lie together (half == 0), or two halves `half` floats apart (VW 16 on
 * operands in blocks of 8: the second half is in the next block's plane). */
static inline vec load_vw(const float *p, int64_t half) {
    if (!half) return *(const vec_u *)p;
    vec v;
    memcpy(&v, p, VW / 2 * sizeof(float));
    memcpy((float *)&v + VW / 2, p + half, VW / 2 * sizeof(float));
    return v;
}

static inline void store_vw(float *p, int64_t half, vec v) {
    if (!half) {
        *(vec_u *)p = v;
        return;
    }
    memcpy(p, &v, VW / 2 * sizeof(float));
    memcpy(p + half, (float *)&v + VW / 2, VW / 2 * sizeof(float));
}

/* Where VW channels from c0 lie in an image of C planes of hw pixels in channel blocks of blk (16 or 8; or VW: a
 * strip): their first pixel's offset, and load_vw's `half`. */
static inline int64_t group_at(int64_t c0, int blk, int64_t hw, int64_t *half) {
    *half = VW > blk ? blk * hw : 0;
    return (c0 - c0 % blk) * hw + c0 % blk;
}

/* The 6x6 patch whose corner is pixel (ih0, iw0) of a plane (rows x W) of VW-channel groups blk floats apart, the
 * group's second half `half` floats on where it has one, zero outside. */
static void load_patch(const float *plane, int blk, int64_t half, int64_t rows, int64_t W, int64_t ih0, int64_t iw0,
                       vec d[36]) {
    const int inside = ih0 >= 0 && ih0 + 6 <= rows && iw0 >= 0 && iw0 + 6 <= W;
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 6; j++) {
            const int64_t ih = ih0 + i, iw = iw0 + j;
            d[i * 6 + j] = inside || (ih >= 0 && ih < rows && iw >= 0 && iw < W)
                               ? load_vw(plane + (ih * W + iw) * blk, half) : (vec){0};
        }
}

/* Output tile o[4][4] at pixel (oh0, ow0) of a plane (rows x OW, laid out as load_patch's), plus the residual's plane
 * rp (may be NULL, may be the plane itself: each element is read before it is written), then ReLU; the parts past the
 * plane's edge dropped. */
static void store_tile(float *plane, const float *rp, int relu, int blk, int64_t half, int64_t rows, int64_t OW,
                       int64_t oh0, int64_t ow0, const vec o[16]) {
    const int ni = rows - oh0 < 4 ? (int)(rows - oh0) : 4, nj = OW - ow0 < 4 ? (int)(OW - ow0) : 4;
    for (int i = 0; i < ni; i++)
        for (int j = 0; j < nj; j++) {
            const int64_t at = ((oh0 + i) * OW + ow0 + j) * blk;
            vec v = o[i * 4 + j];
            if (rp) v += load_vw(rp + at, half);
            if (relu) v = relu_of(v);
            store_vw(plane + at, half, v);
        }
}

/* A thread's scratch: V and M of a chunk (tc tiles), and for NCHW operands the strips of one tile row. */
typedef struct {
    float *v, *m, *in, *out;
} scratch;

/* Tiles t0 .. t0 + tn - 1 (of tc at most) through the three stages. Operands in channel blocks (blocked: 16 or 8)
 * are read and written where they lie; NCHW ones (0) go through strips of one tile row in blocks of VW channels
 * (rows_to_strip, strip_to_rows). */
static void run_chunk(const sg_wino *g, const float *x, const float *u, const float *b, const float *r, int relu,
                      float *y, int blocked, int64_t t0, int64_t tn, int64_t tc, const scratch *sc) {
    const int64_t C = g->C, K = g->K, H = g->H, W = g->W, OH = g->OH, OW = g->OW;
    const int64_t TH = tiles_of(OH), TW = tiles_of(OW);
    int64_t strip_of = -1; /* the tile row (n TH + ty) in sc->in */
    for (int64_t tt = 0; tt < tn; tt++) { /* input transform: V[xi][tt][c] */
        const int64_t t = t0 + tt, n = t / (TH * TW), ty = t % (TH * TW) / TW, tx = t % TW;
        if (!blocked && strip_of != t / TW) {
            rows_to_strip(x + n * C * H * W, C, H, W, ty * 4 - g->pt, sc->in);
            strip_of = t / TW;
        }
        for (int64_t c0 = 0; c0 < C; c0 += VW) {
            vec d[36], s[36], row[6];
            if (blocked) {
                int64_t half; /* set by group_at before load_patch reads it (a separate statement: argument order
                               * is unspecified) */
                const int64_t at = n * C * H * W + group_at(c0, blocked, H * W, &half);
                load_patch(x + at, blocked, half, H, W, ty * 4 - g->pt, tx * 4 - g->pl, d);
            } else {
                load_patch(sc->in + c0 * 6 * W, VW, 0, 6, W, 0, tx * 4 - g->pl, d);
            }
            for (int j = 0; j < 6; j++) input_rows(d + j, 6, s + j, 6);
            for (int i = 0; i < 6; i++) {
                input_rows(s + i * 6, 1, row, 1);
                for (int j = 0; j < 6; j++) *(vec *)(sc->v + ((i * 6 + j) * tc + tt) * C + c0) = row[j];
            }
        }
    }
    for (int xi = 0; xi < 36; xi++) /* M[xi] (tn x K) = V[xi] (tn x C) @ U[xi] (C x K), on this thread */
        sg_gemm_f32_on_thread(tn, K, C, sc->v + xi * tc * C, u + xi * C * K, sc->m + xi * tc * K);
    int64_t row_of = -1, lo = 0, hi = 0; /* the tile row in sc->out and its columns written */
    for (int64_t tt = 0; tt <= tn; tt++) { /* output transform; one more turn to hand over the last strip */
        const int64_t t = t0 + tt, n = t / (TH * TW), ty = t % (TH * TW) / TW, tx = t % TW;
        if (!blocked && row_of >= 0 && (tt == tn || row_of != t / TW)) {
            const int64_t pn = row_of / TH, pty = row_of % TH;
            strip_to_rows(sc->out, K, OH, OW, pty * 4, (int)sg_min64(4, OH - pty * 4), lo, hi, y + pn * K * OH * OW,
                          r ? r + pn * K * OH * OW : NULL, relu);
            row_of = -1;
        }
        if (tt == tn) break;
        if (!blocked && row_of < 0) {
            row_of = t / TW;
            lo = tx * 4;
        }
        hi = sg_min64(OW, tx * 4 + 4);
        for (int64_t k0 = 0; k0 < K; k0 += VW) {
            vec m[36], s[24], o[16];
            for (int xi = 0; xi < 36; xi++) m[xi] = *(const vec *)(sc->m + (xi * tc + tt) * K + k0);
            for (int j = 0; j < 6; j++) output_rows(m + j, 6, s + j, 6);
            const vec bias = b ? *(const vec_u *)(b + k0) : (vec){0};
            for (int i = 0; i < 4; i++) {
                output_rows(s + i * 6, 1, o + i * 4, 1);
                for (int j = 0; j < 4; j++) o[i * 4 + j] += bias;
            }
            if (blocked) {
                int64_t half;
                const int64_t at = n * K * OH * OW + group_at(k0, blocked, OH * OW, &half);
                store_tile(y + at, r ? r + at : NULL, relu, blocked, half, OH, OW, ty * 4, tx * 4, o);
            } else {
                store_tile(sc->out + k0 * 4 * OW, NULL, 0, VW, 0, sg_min64(4, OH - ty * 4), OW, 0, tx * 4, o);
            }
        }
    }
}

int sg_winograd_run(const sg_wino *g, const float *x, const float *u, const float *b, const float *r, int relu,
                    float *y, int blocked) {
    const int64_t C = g->C, K = g->K, T = g->N * tiles_of(g->OH) * tiles_of(g->OW);
    const int threads = sg_max_threads();
    /* chunks: V and M of one within ~1.5 MiB (a core's L2 on the x86 parts we run on), at least 8 tiles for the
     * products, and a whole number per thread so that none waits for another's last chunk */
    const int64_t fit = sg_max64(8, sg_min64((3 << 19) / (144 * (C + K)), 96));
    int64_t chunks = (T + fit - 1) / fit;
    chunks = sg_min64(T, (chunks + threads - 1) / threads * threads);
    const int64_t tc = (T + chunks - 1) / chunks;
    chunks = (T + tc - 1) / tc;
    const size_t strips = blocked ? 0 : (size_t)(C * 6 * g->W + K * 4 * g->OW);
    int err = SG_OK;
#pragma omp parallel num_threads((int)sg_min64(threads, chunks))
    {
        float *block = (float *)aligned_alloc(64, ((size_t)(36 * tc * (C + K)) + strips) * sizeof(float));
        const scratch sc = {block, block + 36 * tc * C, block + 36 * tc * (C + K),
                            block + 36 * tc * (C + K) + C * 6 * g->W};
#pragma omp for schedule(static)
        for (int64_t ch = 0; ch < chunks; ch++) {
            if (block) {
                run_chunk(g, x, u, b, r, relu, y, blocked, ch * tc, sg_min64(tc, T - ch * tc), tc, &sc);
            } else {
#pragma omp atomic write
                err = SG_ENOMEM;
            }
        }
        free(block);
    }
    return err;
}

int sg_winograd_conv(const sg_wino *g, const float *x, const float *w, int flip, const float *b, const float *r,
                     int relu, float *y, int blocked) {
    float *u = (float *)malloc((size_t)(36 * g->C * g->K) * sizeof(float));
    if (!u) return SG_ENOMEM;
    sg_winograd_weights(w, u, g->C, g->K, flip);
    const int err = sg_winograd_run(g, x, u, b, r, relu, y, blocked);
    free(u);
    return err;
}
