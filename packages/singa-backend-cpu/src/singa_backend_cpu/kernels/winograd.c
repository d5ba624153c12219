/* float32 3x3 stride-1 convolutions by Winograd's minimal filtering, F(4x4, 3x3) (Lavin and Gray, "Fast Algorithms
 * for Convolutional Neural Networks", 2016): each 4x4 tile of an output plane comes from the 6x6 input patch under it
 * as Y = A^T [ sum_c (G g_kc G^T) .* (B^T d_c B) ] A, so the channel sums are 36 matrix products of a quarter of the
 * direct method's multiply-adds (36 per tile and channel pair against 144). oneDNN 3.x dropped its float32 Winograd
 * kernels; on ResNet's 3x3 layers this runs in 0.4-0.8x the time of its direct ones (docs/performance.md).
 *
 * The tiles are cut into chunks that threads take whole: a chunk's transformed inputs V[36][tiles][C] and products
 * M[36][tiles][K] stay in the thread's L2 between the three stages (input transform, the 36 products through
 * sg_gemm_f32, output transform). Transforms work on 16 channels at a time, as one 16-float vector (GCC's vector
 * extension: AVX-512, two AVX2 or four SSE registers, whatever the path's -march has), which is also why C and K must
 * be multiples of 16. x and y are either NCHW (16 channels gathered per pixel) or in 16-channel blocks
 * (N, C/16, H, W, 16), which are loaded as they lie.
 *
 * Rounding: the transforms add terms of up to 8x the inputs' size, so results differ from a direct convolution's by
 * a few units in the 6th significant digit (measured ~1e-5 of the output's largest element on ResNet layers), as
 * with cuDNN's and NNPACK's Winograd kernels; SINGA_WINOGRAD=0 turns the path off.
 */
#include "winograd.h"

#pragma GCC diagnostic ignored "-Wpsabi" /* 64-byte vectors passed between static functions on the narrower paths */

typedef float vec __attribute__((vector_size(64), aligned(64)));
typedef float vec_u __attribute__((vector_size(64), aligned(4))); /* an unaligned load or store */
typedef int32_t mask __attribute__((vector_size(64)));

/* max(v, 0) lane by lane, NaN kept (as the relu kernel) */
static inline vec relu_of(vec v) { return (vec)((mask)v & ((v > 0.f) | (v != v))); }

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
     * no larger than the activations: past that (ResNet's 512-channel 4x4 layers) the pass is memory-bound and direct
     * kernels win, unless U is kept from call to call (constant weights: sg_winograd_run's callers) */
    return sg_winograd_shape(g) && 36 * g->C * g->K <= g->N * (g->C * g->H * g->W + g->K * g->OH * g->OW);
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

/* U[36][Ci][Ko] = G g G^T of each 3x3 kernel g, 16 output channels at a time: from w (Ko, Ci, 3, 3) as is (forward),
 * or with `flip` from w (Ci, Ko, 3, 3) turned by 180 degrees (the data gradient's convolution: dy's channels in, x's
 * out). */
void sg_winograd_weights(const float *w, float *u, int64_t ci_n, int64_t ko_n, int flip) {
    const int64_t blocks = ci_n * (ko_n / 16);
    const int T = sg_threads_for(blocks * 16, 4096);
#pragma omp parallel for num_threads(T) schedule(static)
    for (int64_t blk = 0; blk < blocks; blk++) {
        const int64_t ci = blk / (ko_n / 16), ko0 = blk % (ko_n / 16) * 16;
        vec g[9], t[18], r[6];
        float *gf = (float *)g;
        for (int l = 0; l < 16; l++) {
            const float *src = w + (flip ? ci * ko_n + ko0 + l : (ko0 + l) * ci_n + ci) * 9;
            for (int e = 0; e < 9; e++) gf[e * 16 + l] = src[flip ? 8 - e : e];
        }
        for (int j = 0; j < 3; j++) weight_rows(g + j, 3, t + j, 3); /* t (6 x 3) = G g */
        for (int i = 0; i < 6; i++) {                                /* row i of t G^T */
            weight_rows(t + i * 3, 1, r, 1);
            for (int j = 0; j < 6; j++) *(vec_u *)(u + ((i * 6 + j) * ci_n + ci) * ko_n + ko0) = r[j]; /* u: any float alignment */
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

/* The 6x6 patch of 16 channels (c0..c0+15) of image n whose corner is input pixel (ih0, iw0), zero outside. */
static void load_patch(const sg_wino *g, const float *x, int blocked, int64_t n, int64_t c0, int64_t ih0, int64_t iw0,
                       vec d[36]) {
    const int64_t H = g->H, W = g->W;
    const int inside = ih0 >= 0 && ih0 + 6 <= H && iw0 >= 0 && iw0 + 6 <= W;
    if (blocked) {
        const float *xb = x + (n * g->C + c0) * H * W; /* block c0 / 16 of image n: (H, W, 16) */
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 6; j++) {
                const int64_t ih = ih0 + i, iw = iw0 + j;
                d[i * 6 + j] = inside || (ih >= 0 && ih < H && iw >= 0 && iw < W)
                                   ? *(const vec_u *)(xb + (ih * W + iw) * 16) : (vec){0};
            }
        return;
    }
    float *df = (float *)d;
    const float *xc = x + (n * g->C + c0) * H * W;
    for (int l = 0; l < 16; l++) {
        const float *p = xc + l * H * W;
        if (inside) {
            p += ih0 * W + iw0;
            for (int i = 0; i < 6; i++)
                for (int j = 0; j < 6; j++) df[(i * 6 + j) * 16 + l] = p[i * W + j];
        } else {
            for (int i = 0; i < 6; i++)
                for (int j = 0; j < 6; j++) {
                    const int64_t ih = ih0 + i, iw = iw0 + j;
                    df[(i * 6 + j) * 16 + l] = ih >= 0 && ih < H && iw >= 0 && iw < W ? p[ih * W + iw] : 0.f;
                }
        }
    }
}

/* Output tile o[4][4] (16 channels k0.. each) of image n at output pixel (oh0, ow0): plus the residual r (y's layout;
 * may be y itself: each element is read before it is written), then ReLU; the parts past the plane's edge dropped. */
static void store_tile(const sg_wino *g, float *y, const float *r, int relu, int blocked, int64_t n, int64_t k0,
                       int64_t oh0, int64_t ow0, vec o[16]) {
    const int64_t OH = g->OH, OW = g->OW;
    const int ni = OH - oh0 < 4 ? (int)(OH - oh0) : 4, nj = OW - ow0 < 4 ? (int)(OW - ow0) : 4;
    const int64_t base = (n * g->K + k0) * OH * OW;
    if (blocked) {
        for (int i = 0; i < ni; i++)
            for (int j = 0; j < nj; j++) {
                const int64_t at = base + ((oh0 + i) * OW + ow0 + j) * 16;
                vec v = o[i * 4 + j];
                if (r) v += *(const vec_u *)(r + at);
                if (relu) v = relu_of(v);
                *(vec_u *)(y + at) = v;
            }
        return;
    }
    const float *of = (const float *)o;
    for (int l = 0; l < 16; l++)
        for (int i = 0; i < ni; i++)
            for (int j = 0; j < nj; j++) {
                const int64_t at = base + l * OH * OW + (oh0 + i) * OW + ow0 + j;
                float v = of[(i * 4 + j) * 16 + l];
                if (r) v += r[at];
                if (relu && !(v > 0.f)) v = v != v ? v : 0.f; /* NaN stays NaN, as relu(NaN) */
                y[at] = v;
            }
}

/* Tiles t0 .. t0 + tn - 1 (of tc at most) through the three stages, in the thread's vb (V) and mb (M). */
static void run_chunk(const sg_wino *g, const float *x, const float *u, const float *b, const float *r, int relu,
                      float *y, int blocked, int64_t t0, int64_t tn, int64_t tc, float *vb, float *mb) {
    const int64_t C = g->C, K = g->K, TH = tiles_of(g->OH), TW = tiles_of(g->OW);
    for (int64_t tt = 0; tt < tn; tt++) { /* input transform: V[xi][tt][c] */
        const int64_t t = t0 + tt, n = t / (TH * TW), ty = t % (TH * TW) / TW, tx = t % TW;
        for (int64_t c0 = 0; c0 < C; c0 += 16) {
            vec d[36], s[36], row[6];
            load_patch(g, x, blocked, n, c0, ty * 4 - g->pt, tx * 4 - g->pl, d);
            for (int j = 0; j < 6; j++) input_rows(d + j, 6, s + j, 6);
            for (int i = 0; i < 6; i++) {
                input_rows(s + i * 6, 1, row, 1);
                for (int j = 0; j < 6; j++) *(vec *)(vb + ((i * 6 + j) * tc + tt) * C + c0) = row[j];
            }
        }
    }
    for (int xi = 0; xi < 36; xi++) /* M[xi] (tn x K) = V[xi] (tn x C) @ U[xi] (C x K), on this thread */
        sg_gemm_f32(0, 0, tn, K, C, 1.f, vb + xi * tc * C, C, u + xi * C * K, K, 0.f, mb + xi * tc * K, K, 0);
    for (int64_t tt = 0; tt < tn; tt++) { /* output transform */
        const int64_t t = t0 + tt, n = t / (TH * TW), ty = t % (TH * TW) / TW, tx = t % TW;
        for (int64_t k0 = 0; k0 < K; k0 += 16) {
            vec m[36], s[24], o[16];
            for (int xi = 0; xi < 36; xi++) m[xi] = *(const vec *)(mb + (xi * tc + tt) * K + k0);
            for (int j = 0; j < 6; j++) output_rows(m + j, 6, s + j, 6);
            const vec bias = b ? *(const vec_u *)(b + k0) : (vec){0};
            for (int i = 0; i < 4; i++) {
                output_rows(s + i * 6, 1, o + i * 4, 1);
                for (int j = 0; j < 4; j++) o[i * 4 + j] += bias;
            }
            store_tile(g, y, r, relu, blocked, n, k0, ty * 4, tx * 4, o);
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
    int err = SG_OK;
#pragma omp parallel num_threads((int)sg_min64(threads, chunks))
    {
        float *vb = (float *)aligned_alloc(64, (size_t)(36 * tc * C) * sizeof(float));
        float *mb = (float *)aligned_alloc(64, (size_t)(36 * tc * K) * sizeof(float));
#pragma omp for schedule(static)
        for (int64_t ch = 0; ch < chunks; ch++) {
            if (vb && mb) {
                run_chunk(g, x, u, b, r, relu, y, blocked, ch * tc, sg_min64(tc, T - ch * tc), tc, vb, mb);
            } else {
#pragma omp atomic write
                err = SG_ENOMEM;
            }
        }
        free(vb);
        free(mb);
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
