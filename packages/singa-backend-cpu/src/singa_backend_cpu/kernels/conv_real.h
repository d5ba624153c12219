/* Convolution kernels on sg_real data (instantiated by conv.c, see real.h): im2col + gemm, and direct depthwise. */

/* col rows of images [n0, n0 + nb), group g: row (c, i, j), column (image, oh, ow) */
static void SG_R(im2col)(const geometry *q, const sg_real *x, int64_t n0, int64_t nb, int64_t g, sg_real *col,
                         int par) {
    const int64_t rows = q->ckk, ld = nb * q->ohw;
    const int T = inner_threads(par, rows * ld);
#pragma omp parallel for collapse(2) schedule(static) num_threads(T) if (T > 1)
    for (int64_t img = 0; img < nb; img++) {
        for (int64_t row = 0; row < rows; row++) {
            const int64_t c = row / (q->kh * q->kw), i = (row / q->kw) % q->kh, j = row % q->kw;
            const sg_real *plane = x + ((n0 + img) * q->C + g * q->Cg + c) * q->hw;
            sg_real *dst = col + row * ld + img * q->ohw;
            int64_t lo, hi;
            valid_range(q->OW, q->W, q->sw, q->pl, j * q->dw, &lo, &hi);
            for (int64_t oh = 0; oh < q->OH; oh++) {
                sg_real *d = dst + oh * q->OW;
                const int64_t ih = oh * q->sh - q->pt + i * q->dh;
                if (ih < 0 || ih >= q->H) {
                    memset(d, 0, (size_t)q->OW * sizeof(sg_real));
                    continue;
                }
                const sg_real *src = plane + ih * q->W - q->pl + j * q->dw;
                for (int64_t ow = 0; ow < lo; ow++) d[ow] = 0;
                if (q->sw == 1)
                    memcpy(d + lo, src + lo, (size_t)(hi - lo) * sizeof(sg_real));
                else
                    for (int64_t ow = lo; ow < hi; ow++) d[ow] = src[ow * q->sw];
                for (int64_t ow = hi; ow < q->OW; ow++) d[ow] = 0;
            }
        }
    }
}

/* dx[images, group g] += fold of col; one thread per (image, channel) plane, so no two threads add to one element */
static void SG_R(col2im)(const geometry *q, const sg_real *col, int64_t n0, int64_t nb, int64_t g, sg_real *dx,
                         int par) {
    const int64_t ld = nb * q->ohw, kk = q->kh * q->kw;
    const int T = inner_threads(par, q->ckk * ld);
#pragma omp parallel for collapse(2) schedule(static) num_threads(T) if (T > 1)
    for (int64_t img = 0; img < nb; img++) {
        for (int64_t c = 0; c < q->Cg; c++) {
            sg_real *plane = dx + ((n0 + img) * q->C + g * q->Cg + c) * q->hw;
            for (int64_t r = 0; r < kk; r++) {
                const int64_t i = r / q->kw, j = r % q->kw;
                const sg_real *src = col + (c * kk + r) * ld + img * q->ohw;
                int64_t lo, hi;
                valid_range(q->OW, q->W, q->sw, q->pl, j * q->dw, &lo, &hi);
                for (int64_t oh = 0; oh < q->OH; oh++) {
                    const int64_t ih = oh * q->sh - q->pt + i * q->dh;
                    if (ih < 0 || ih >= q->H) continue;
                    sg_real *d = plane + ih * q->W - q->pl + j * q->dw;
                    const sg_real *sv = src + oh * q->OW;
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
static void SG_R(chunk_gather)(const geometry *q, const sg_real *y, int64_t nchan, int64_t c0, int64_t rows,
                               int64_t n0, int64_t nb, sg_real *t) {
    for (int64_t img = 0; img < nb; img++)
        for (int64_t r = 0; r < rows; r++)
            memcpy(t + r * nb * q->ohw + img * q->ohw, y + ((n0 + img) * nchan + c0 + r) * q->ohw,
                   (size_t)q->ohw * sizeof(sg_real));
}
static void SG_R(chunk_scatter)(const geometry *q, const sg_real *t, int64_t nchan, int64_t c0, int64_t rows,
                                int64_t n0, int64_t nb, sg_real *y) {
    for (int64_t img = 0; img < nb; img++)
        for (int64_t r = 0; r < rows; r++)
            memcpy(y + ((n0 + img) * nchan + c0 + r) * q->ohw, t + r * nb * q->ohw + img * q->ohw,
                   (size_t)q->ohw * sizeof(sg_real));
}

/* Per-thread scratch: col (ckk, nb * ohw) and, when images are batched, a (Kg, nb * ohw) staging block. */
typedef struct {
    sg_real *col, *tmp;
} SG_R(scratch);

static int SG_R(scratch_open)(const geometry *q, int64_t nb, int need_col, SG_R(scratch) *s) {
    s->col = need_col ? (sg_real *)malloc((size_t)(q->ckk * nb * q->ohw) * sizeof(sg_real)) : NULL;
    s->tmp = nb > 1 ? (sg_real *)malloc((size_t)(q->Kg * nb * q->ohw) * sizeof(sg_real)) : NULL;
    return (need_col && !s->col) || (nb > 1 && !s->tmp) ? SG_ENOMEM : SG_OK;
}
static void SG_R(scratch_close)(SG_R(scratch) *s) {
    free(s->col);
    free(s->tmp);
}

/* -- the per-thread driver ----------------------------------------------------------------------------------- */
/* A worker computes items [lo, hi) of a call (images, planes or channels) into `out` on scratch of its own; `par`
 * says that it is the only thread, so that it may split its own loops. It returns an SG_* status. */
typedef int (*SG_R(range_fn))(const void *ctx, int64_t lo, int64_t hi, sg_real *out, int par);

/* Items [0, n) as T contiguous ranges, one per thread. nsum == 0: the workers write disjoint parts of out. nsum > 0:
 * each thread sums its items into nsum elements of its own (thread 0 into out, a thread with no items zeroes its
 * copy), which are then added into out in thread order, each thread a slice of it: the same sums for the same T. */
static int SG_R(over_threads)(int T, int64_t n, int64_t nsum, SG_R(range_fn) fn, const void *ctx, sg_real *out) {
    sg_real *partial = nsum && T > 1 ? (sg_real *)malloc((size_t)(nsum * (T - 1)) * sizeof(sg_real)) : NULL;
    if (nsum && T > 1 && !partial) return SG_ENOMEM;
    int err = SG_OK;
#pragma omp parallel num_threads(T) if (T > 1)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
        sg_real *mine = nsum && t > 0 ? partial + (t - 1) * nsum : out;
        int e = SG_OK;
        if (nsum && hi <= lo)
            memset(mine, 0, (size_t)nsum * sizeof(sg_real));
        else
            e = fn(ctx, lo, hi, mine, nt == 1);
        if (e) {
#pragma omp atomic write
            err = e;
        }
        if (nsum && nt > 1) {
#pragma omp barrier
            const int64_t a = sg_chunk(nsum, t, nt), b = sg_chunk(nsum, t + 1, nt);
            for (int u = 1; u < nt; u++) {
                const sg_real *p = partial + (u - 1) * nsum;
#pragma omp simd
                for (int64_t i = a; i < b; i++) out[i] += p[i];
            }
        }
    }
    free(partial);
    return err;
}

/* -- im2col + gemm: the per-range workers ------------------------------------------------------------------------ */
/* Images [lo, hi) in chunks of nb, operands a and b (x and w, dy and w, dy and x), into out. */
typedef void (*SG_R(images_fn))(const geometry *q, const sg_real *a, const sg_real *b, sg_real *out, int64_t lo,
                                int64_t hi, int64_t nb, SG_R(scratch) *s, int par);

typedef struct {
    const geometry *q;
    const sg_real *a, *b;
    SG_R(images_fn) run;
    int need_col;
} SG_R(im2col_job);

static int SG_R(im2col_range)(const void *ctx, int64_t lo, int64_t hi, sg_real *out, int par) {
    const SG_R(im2col_job) *j = (const SG_R(im2col_job) *)ctx;
    const int64_t nb = sg_min64(chunk_images(j->q), sg_max64(hi - lo, 1));
    SG_R(scratch) s;
    const int err = SG_R(scratch_open)(j->q, nb, j->need_col || nb > 1, &s);
    if (!err) j->run(j->q, j->a, j->b, out, lo, hi, nb, &s, par);
    SG_R(scratch_close)(&s);
    return err;
}

/* The images spread over image_threads(q) threads; nsum as over_threads (the weight gradient's per-thread sums). */
static int SG_R(im2col_run)(const geometry *q, SG_R(images_fn) run, int need_col, const sg_real *a, const sg_real *b,
                            sg_real *out, int64_t nsum) {
    const SG_R(im2col_job) j = {q, a, b, run, need_col};
    return SG_R(over_threads)(image_threads(q), q->N, nsum, SG_R(im2col_range), &j, out);
}

/* -- depthwise: direct kernels (the layout is described in conv.c, dwplan) ------------------------------------- */
/* The direct kernels' vectors, in GCC's vector extension: 32 bytes (one AVX register, or two SSE ones). */
typedef sg_real SG_R(dwvec) __attribute__((vector_size(32)));

/* dst[o] = init + sum over taps t of wt[t] * src[off[t] + o], taps in order, for the V vectors of outputs from dst:
 * the V sums stay in registers while the taps go by, one load and one fused multiply-add per tap and vector. */
static inline __attribute__((always_inline)) void SG_R(dw_block)(const sg_real *src, const int64_t *off,
                                                                 const sg_real *wt, int64_t nt, sg_real init,
                                                                 sg_real *dst, const int V) {
    const int L = (int)(sizeof(SG_R(dwvec)) / sizeof(sg_real));
    SG_R(dwvec) acc[8];
#pragma GCC unroll 8
    for (int v = 0; v < V; v++) acc[v] = (SG_R(dwvec)){0} + init;
    for (int64_t t = 0; t < nt; t++) {
        const sg_real *s = src + off[t];
        const sg_real wv = wt[t];
#pragma GCC unroll 8
        for (int v = 0; v < V; v++) {
            SG_R(dwvec) x;
            memcpy(&x, s + v * L, sizeof x); /* an unaligned load */
            acc[v] += wv * x;
        }
    }
#pragma GCC unroll 8
    for (int v = 0; v < V; v++) memcpy(dst + v * L, &acc[v], sizeof acc[v]);
}

/* dw_block over a run of n outputs, in blocks of 8 vectors (fewer for short runs); the last block ends at n, over
 * outputs that the one before computed already (the same sums, written again), so that no short block is needed. */
static void SG_R(dw_correlate)(const sg_real *src, const int64_t *off, const sg_real *wt, int64_t nt, sg_real init,
                               sg_real *dst, int64_t n) {
    const int64_t L = (int64_t)(sizeof(SG_R(dwvec)) / sizeof(sg_real));
#define SG_DW_BLOCKS(V)                                                                        \
    do {                                                                                       \
        int64_t o = 0;                                                                         \
        for (; o + (V) * L <= n; o += (V) * L) SG_R(dw_block)(src + o, off, wt, nt, init, dst + o, V); \
        if (o < n) SG_R(dw_block)(src + n - (V) * L, off, wt, nt, init, dst + n - (V) * L, V);      \
    } while (0)
    if (n >= 8 * L) {
        SG_DW_BLOCKS(8);
    } else if (n >= 4 * L) {
        SG_DW_BLOCKS(4);
    } else if (n >= L) {
        SG_DW_BLOCKS(1);
    } else {
        for (int64_t o = 0; o < n; o++) {
            sg_real sum = init;
            for (int64_t t = 0; t < nt; t++) sum += wt[t] * src[off[t] + o];
            dst[o] = sum;
        }
    }
#undef SG_DW_BLOCKS
}

/* acc[t] += sum over o in [0, n) of d[o] * src[off[t] + o], t in [0, nt): four taps per pass over d, in chunks whose
 * sums are added in double */
static void SG_R(dw_dots)(const sg_real *d, const sg_real *src, const int64_t *off, int64_t nt, int64_t n,
                          double *acc) {
    for (int64_t o0 = 0; o0 < n; o0 += DW_CHUNK) {
        const int64_t len = sg_min64(DW_CHUNK, n - o0);
        const sg_real *restrict dd = d + o0;
        for (int64_t t = 0; t < nt; t += 4) {
            const sg_real *restrict p0 = src + off[t] + o0;
            const sg_real *restrict p1 = src + off[sg_min64(t + 1, nt - 1)] + o0;
            const sg_real *restrict p2 = src + off[sg_min64(t + 2, nt - 1)] + o0;
            const sg_real *restrict p3 = src + off[sg_min64(t + 3, nt - 1)] + o0;
            sg_real s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
            for (int64_t o = 0; o < len; o++) {
                const sg_real v = dd[o];
                s0 += v * p0[o];
                s1 += v * p1[o];
                s2 += v * p2[o];
                s3 += v * p3[o];
            }
            acc[t] += s0;
            if (t + 1 < nt) acc[t + 1] += s1;
            if (t + 2 < nt) acc[t + 2] += s2;
            if (t + 3 < nt) acc[t + 3] += s3;
        }
    }
}

/* Copy plane x (H, W) into the phase planes ph, whose padding is zero from the start (calloc) and never written. At
 * stride 2 across, each row goes to its two column phases in one pass. */
static void SG_R(dw_split)(const geometry *q, const dwplan *p, const sg_real *x, sg_real *ph) {
    for (int64_t a = 0; a < q->sh; a++) {
        int64_t r0, r1;
        valid_range(p->PHs, q->H, q->sh, q->pt, a, &r0, &r1);
        const int both = q->sw == 2 && p->used[a * 2] && p->used[a * 2 + 1];
        for (int64_t b = 0; b < q->sw; b++) {
            if (!p->used[a * q->sw + b]) continue;
            sg_real *plane = ph + (a * q->sw + b) * p->PS;
            int64_t c0, c1, o0 = 0, o1 = 0; /* columns [c0, c1) inside x; [o0, o1) of them done with phase b + 1 */
            valid_range(p->PWs, q->W, q->sw, q->pl, b, &c0, &c1);
            if (both && b == 0) {
                int64_t d0, d1;
                valid_range(p->PWs, q->W, 2, q->pl, 1, &d0, &d1);
                o0 = sg_min64(sg_max64(c0, d0), c1);
                o1 = sg_max64(o0, sg_min64(c1, d1));
            } else if (both) {
                continue;
            }
            for (int64_t r = r0; r < r1; r++) {
                const sg_real *restrict src = x + (r * q->sh - q->pt + a) * q->W - q->pl + b;
                sg_real *restrict d = plane + r * p->PWs;
                if (q->sw == 1) {
                    memcpy(d + c0, src + c0, (size_t)(c1 - c0) * sizeof(sg_real));
                } else if (q->sw == 2) {
                    sg_real *restrict d1 = d + p->PS; /* phase b + 1, when both */
                    for (int64_t c = c0; c < o0; c++) d[c] = src[2 * c];
#pragma omp simd
                    for (int64_t c = o0; c < o1; c++) {
                        d[c] = src[2 * c];
                        d1[c] = src[2 * c + 1];
                    }
                    for (int64_t c = sg_max64(o1, c0); c < c1; c++) d[c] = src[2 * c];
                    if (both) { /* phase 1's columns outside [o0, o1) */
                        int64_t e0, e1;
                        valid_range(p->PWs, q->W, 2, q->pl, 1, &e0, &e1);
                        for (int64_t c = e0; c < sg_min64(e1, o0); c++) d1[c] = src[2 * c + 1];
                        for (int64_t c = sg_max64(e0, o1); c < e1; c++) d1[c] = src[2 * c + 1];
                    }
                } else {
                    for (int64_t c = c0; c < c1; c++) d[c] = src[c * q->sw];
                }
            }
        }
    }
}

/* Whether the n elements from x are all finite: the sum of v - v is 0, or a NaN once an infinity or a NaN went by */
static int SG_R(dw_finite)(const sg_real *x, int64_t n) {
    sg_real z = 0;
#pragma omp simd reduction(+ : z)
    for (int64_t i = 0; i < n; i++) z += x[i] - x[i];
    return z == 0;
}

typedef struct {
    const geometry *q;
    const dwplan *p;
    const sg_real *a, *b, *bias;
} SG_R(dw_job);

/* rows x cols outputs, row r at src + r * pitch, into dst (rows of cols): one flat run when pitch == cols, else runs
 * of whole rows through buf (`chunk` rows of pitch), of which each row's first cols are kept */
static void SG_R(dw_plane)(const sg_real *src, const int64_t *off, const sg_real *wt, int64_t nt, sg_real init,
                           sg_real *dst, int64_t rows, int64_t cols, int64_t pitch, int64_t chunk, sg_real *buf) {
    if (pitch == cols) {
        SG_R(dw_correlate)(src, off, wt, nt, init, dst, rows * cols);
        return;
    }
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        const int64_t nr = sg_min64(chunk, rows - r0);
        SG_R(dw_correlate)(src + r0 * pitch, off, wt, nt, init, buf, (nr - 1) * pitch + cols);
        for (int64_t r = 0; r < nr; r++)
            memcpy(dst + (r0 + r) * cols, buf + r * pitch, (size_t)cols * sizeof(sg_real));
    }
}

/* forward, input planes [lo, hi) (plane n * C + c): each one split once, then its Kg output planes */
static int SG_R(dw_forward_range)(const void *ctx, int64_t lo, int64_t hi, sg_real *y, int par) {
    const SG_R(dw_job) *j = (const SG_R(dw_job) *)ctx;
    const geometry *q = j->q;
    const dwplan *p = j->p;
    (void)par;
    const int64_t nph = q->sh * q->sw, chunk = sg_max64(1, DW_CHUNK / p->PWs);
    sg_real *ph = (sg_real *)calloc((size_t)(nph * p->PS + chunk * p->PWs), sizeof(sg_real));
    if (!ph) return SG_ENOMEM;
    sg_real *buf = ph + nph * p->PS;
    for (int64_t pi = lo; pi < hi; pi++) {
        const int64_t n = pi / q->C, c = pi % q->C;
        SG_R(dw_split)(q, p, j->a + pi * q->hw, ph);
        for (int64_t m = 0; m < q->Kg; m++) {
            const int64_t k = c * q->Kg + m;
            SG_R(dw_plane)(ph, p->xoff, j->b + k * p->kk, p->kk, j->bias ? j->bias[k] : 0,
                           y + (n * q->K + k) * q->ohw, q->OH, q->OW, p->PWs, chunk, buf);
        }
    }
    free(ph);
    return SG_OK;
}

/* the weights of phase ab's taps, for channel c's group */
static void SG_R(dw_phase_weights)(const dwplan *p, const sg_real *wg, int64_t ab, sg_real *wb) {
    for (int64_t t = p->pstart[ab]; t < p->pstart[ab + 1]; t++) wb[t - p->pstart[ab]] = wg[p->didx[t]];
}

/* data gradient, planes [lo, hi) of dx: the Kg planes of dy laid out, then each phase of dx as a correlation, a few
 * rows at a time; at stride 2 across, the two column phases of those rows are computed whole, then interleaved */
static int SG_R(dw_data_range)(const void *ctx, int64_t lo, int64_t hi, sg_real *dx, int par) {
    const SG_R(dw_job) *j = (const SG_R(dw_job) *)ctx;
    const geometry *q = j->q;
    const dwplan *p = j->p;
    (void)par;
    const int64_t chunk = sg_max64(1, DW_CHUNK / p->Q), kk = p->kk, rows = sg_min64(q->OH, p->UH), Q = p->Q;
    const int64_t nbuf = q->sw == 2 ? 2 : 1;
    sg_real *dyb = (sg_real *)calloc((size_t)(q->Kg * p->DS + nbuf * chunk * Q + q->Kg * kk), sizeof(sg_real));
    if (!dyb) return SG_ENOMEM;
    sg_real *buf = dyb + q->Kg * p->DS, *wb = buf + nbuf * chunk * Q;
    for (int64_t pi = lo; pi < hi; pi++) {
        const int64_t n = pi / q->C, c = pi % q->C;
        sg_real *dxp = dx + pi * q->hw;
        for (int64_t m = 0; m < q->Kg; m++) {
            const sg_real *src = j->a + (n * q->K + c * q->Kg + m) * q->ohw;
            sg_real *dst = dyb + m * p->DS + p->R * Q + p->Cc;
            for (int64_t oh = 0; oh < rows; oh++)
                memcpy(dst + oh * Q, src + oh * q->OW, (size_t)q->OW * sizeof(sg_real));
        }
        const sg_real *wg = j->b + c * q->Kg * kk;
        for (int64_t a = 0; a < q->sh; a++) {
            int64_t r0, r1;
            valid_range(p->UH, q->H, q->sh, q->pt, a, &r0, &r1);
            for (int64_t r = r0; r < r1; r += chunk) {
                const int64_t nr = sg_min64(chunk, r1 - r);
                if (q->sw == 2) {
                    for (int64_t b = 0; b < 2; b++) {
                        const int64_t ab = a * 2 + b;
                        SG_R(dw_phase_weights)(p, wg, ab, wb);
                        SG_R(dw_correlate)(dyb + r * Q, p->doff + p->pstart[ab], wb, p->pstart[ab + 1] - p->pstart[ab],
                                           0, buf + b * chunk * Q, (nr - 1) * Q + p->UW);
                    }
                    /* input column iw is padded column iw + pl: phase (iw + pl) % 2, element (iw + pl) / 2 */
                    const int64_t e = q->pl & 1, half = q->W / 2;
                    for (int64_t u = 0; u < nr; u++) {
                        sg_real *restrict d = dxp + ((r + u) * q->sh + a - q->pt) * q->W;
                        const sg_real *restrict E = buf + e * chunk * Q + u * Q + (q->pl >> 1);
                        const sg_real *restrict O = buf + (1 - e) * chunk * Q + u * Q + ((q->pl + 1) >> 1);
#pragma omp simd
                        for (int64_t v = 0; v < half; v++) {
                            d[2 * v] = E[v];
                            d[2 * v + 1] = O[v];
                        }
                        if (q->W & 1) d[q->W - 1] = E[half];
                    }
                    continue;
                }
                for (int64_t b = 0; b < q->sw; b++) {
                    const int64_t ab = a * q->sw + b;
                    int64_t c0, c1;
                    valid_range(Q, q->W, q->sw, q->pl, b, &c0, &c1);
                    if (c0 >= c1) continue;
                    SG_R(dw_phase_weights)(p, wg, ab, wb);
                    const int64_t ncol = c1 - c0, iw0 = c0 * q->sw + b - q->pl;
                    SG_R(dw_correlate)(dyb + r * Q + c0, p->doff + p->pstart[ab], wb, p->pstart[ab + 1] - p->pstart[ab],
                                       0, buf, (nr - 1) * Q + ncol);
                    for (int64_t u = 0; u < nr; u++) {
                        sg_real *restrict d = dxp + ((r + u) * q->sh + a - q->pt) * q->W + iw0;
                        const sg_real *restrict s = buf + u * Q;
                        if (q->sw == 1)
                            memcpy(d, s, (size_t)ncol * sizeof(sg_real));
                        else
                            for (int64_t v = 0; v < ncol; v++) d[v * q->sw] = s[v];
                    }
                }
            }
        }
    }
    free(dyb);
    return SG_OK;
}

/* weight gradient, channels [lo, hi) (groups): all images of each, summed in double in image order */
static int SG_R(dw_weight_range)(const void *ctx, int64_t lo, int64_t hi, sg_real *dw, int par) {
    const SG_R(dw_job) *j = (const SG_R(dw_job) *)ctx;
    const geometry *q = j->q;
    const dwplan *p = j->p;
    (void)par;
    const int64_t nph = q->sh * q->sw, kk = p->kk, nw = q->Kg * kk, PWs = p->PWs;
    sg_real *ph = (sg_real *)calloc((size_t)(nph * p->PS + (q->OH + 1) * PWs), sizeof(sg_real));
    double *acc = (double *)malloc((size_t)nw * sizeof(double));
    if (!ph || !acc) {
        free(ph);
        free(acc);
        return SG_ENOMEM;
    }
    sg_real *dyb = ph + nph * p->PS; /* dy with pitch PWs: zero from column OW on */
    for (int64_t c = lo; c < hi; c++) {
        memset(acc, 0, (size_t)nw * sizeof(double));
        for (int64_t n = 0; n < q->N; n++) {
            /* The flat runs multiply the dropped columns' zeros of dy by elements of x that those outputs do not
             * read: 0 * inf would make a NaN there, so a plane with an infinity or a NaN goes row by row instead. */
            const sg_real *xp = j->b + (n * q->C + c) * q->hw;
            const int finite = SG_R(dw_finite)(xp, q->hw);
            SG_R(dw_split)(q, p, xp, ph);
            for (int64_t m = 0; m < q->Kg; m++) {
                const sg_real *src = j->a + (n * q->K + c * q->Kg + m) * q->ohw;
                for (int64_t oh = 0; oh < q->OH; oh++)
                    memcpy(dyb + oh * PWs, src + oh * q->OW, (size_t)q->OW * sizeof(sg_real));
                if (finite)
                    SG_R(dw_dots)(dyb, ph, p->xoff, kk, (q->OH - 1) * PWs + q->OW, acc + m * kk);
                else
                    for (int64_t oh = 0; oh < q->OH; oh++)
                        SG_R(dw_dots)(dyb + oh * PWs, ph + oh * PWs, p->xoff, kk, q->OW, acc + m * kk);
            }
        }
        for (int64_t i = 0; i < nw; i++) dw[c * nw + i] = (sg_real)acc[i];
    }
    free(ph);
    free(acc);
    return SG_OK;
}

/* which: 0 forward (a = x, b = w, bias), 1 data gradient (a = dy, b = w), 2 weight gradient (a = dy, b = x) */
static int SG_R(dw_run)(const geometry *q, int which, const sg_real *a, const sg_real *b, const sg_real *bias,
                        sg_real *out) {
    dwplan p;
    if (dw_plan_open(q, &p)) return SG_ENOMEM;
    const SG_R(dw_job) j = {q, &p, a, b, bias};
    const int64_t items = which == 2 ? q->C : q->N * q->C;
    const SG_R(range_fn) fn = which == 0 ? SG_R(dw_forward_range) : which == 1 ? SG_R(dw_data_range)
                                                                                : SG_R(dw_weight_range);
    const int err = SG_R(over_threads)(dw_threads(q, items), items, 0, fn, &j, out);
    dw_plan_close(&p);
    return err;
}

/* -- forward ---------------------------------------------------------------------------------------------------- */
static void SG_R(forward_images)(const geometry *q, const sg_real *x, const sg_real *w, sg_real *y, int64_t lo,
                                 int64_t hi, int64_t nb, SG_R(scratch) *s, int par) {
    const int direct = is_pointwise(q);
    for (int64_t n0 = lo; n0 < hi; n0 += nb) {
        const int64_t cnt = sg_min64(nb, hi - n0), ld = cnt * q->ohw;
        for (int64_t g = 0; g < q->G; g++) {
            const sg_real *wg = w + g * q->Kg * q->ckk;
            const sg_real *B = s->col;
            int64_t ldb = ld;
            if (direct && cnt == 1) {
                B = x + (n0 * q->C + g * q->Cg) * q->hw;
                ldb = q->hw;
            } else {
                SG_R(im2col)(q, x, n0, cnt, g, s->col, par);
            }
            if (cnt == 1) {
                SG_R(sg_gemm)(0, 0, q->Kg, q->ohw, q->ckk, 1, wg, q->ckk, B, ldb, 0,
                              y + (n0 * q->K + g * q->Kg) * q->ohw, q->ohw, par);
            } else {
                SG_R(sg_gemm)(0, 0, q->Kg, ld, q->ckk, 1, wg, q->ckk, B, ldb, 0, s->tmp, ld, par);
                SG_R(chunk_scatter)(q, s->tmp, q->K, g * q->Kg, q->Kg, n0, cnt, y);
            }
        }
    }
}

/* A grouped pointwise convolution with fewer images than threads (ShuffleNet's 1x1 layers at batch 1): whole
 * (image, group) products per thread, where splitting each small product over the threads (the images path) cost
 * twice the time (4 groups of 136 channels at 7x7: 0.17 ms against oneDNN's 0.13 on NCHW). */
static int SG_R(pointwise_groups)(const geometry *q, const sg_real *x, const sg_real *w, sg_real *y) {
    const int64_t items = q->N * q->G;
    const int T = (int)sg_min64(sg_threads_for(q->N * q->K * q->ohw * q->ckk, 1 << 18), items);
#pragma omp parallel for schedule(static) num_threads(T) if (T > 1)
    for (int64_t i = 0; i < items; i++) {
        const int64_t n = i / q->G, g = i % q->G;
        SG_R(gemm_on_thread)(q->Kg, q->ohw, q->Cg, w + g * q->Kg * q->Cg, x + (n * q->C + g * q->Cg) * q->hw,
                             y + (n * q->K + g * q->Kg) * q->ohw);
    }
    return SG_OK;
}

static int SG_R(conv_forward)(const geometry *q, const sg_real *x, const sg_real *w, const sg_real *b, sg_real *y) {
    if (is_depthwise(q)) return SG_R(dw_run)(q, 0, x, w, b, y);
    const int pointwise = is_pointwise(q);
    const int err = pointwise && q->G > 1 && image_threads(q) == 1
                        ? SG_R(pointwise_groups)(q, x, w, y)
                        : SG_R(im2col_run)(q, SG_R(forward_images), !pointwise || chunk_images(q) > 1, x, w, y, 0);
    if (err || !b) return err;
    const int TB = sg_threads_for(q->N * q->K * q->ohw, 1 << 15);
#pragma omp parallel for collapse(2) schedule(static) num_threads(TB) if (TB > 1)
    for (int64_t n = 0; n < q->N; n++)
        for (int64_t k = 0; k < q->K; k++) {
            sg_real *p = y + (n * q->K + k) * q->ohw;
            const sg_real bk = b[k];
#pragma omp simd
            for (int64_t i = 0; i < q->ohw; i++) p[i] += bk;
        }
    return SG_OK;
}

/* -- gradient with respect to x --------------------------------------------------------------------------------- */
static void SG_R(backward_data_images)(const geometry *q, const sg_real *dy, const sg_real *w, sg_real *dx,
                                       int64_t lo, int64_t hi, int64_t nb, SG_R(scratch) *s, int par) {
    const int direct = is_pointwise(q);
    for (int64_t n0 = lo; n0 < hi; n0 += nb) {
        const int64_t cnt = sg_min64(nb, hi - n0), ld = cnt * q->ohw;
        if (!direct) memset(dx + n0 * q->C * q->hw, 0, (size_t)(cnt * q->C * q->hw) * sizeof(sg_real));
        for (int64_t g = 0; g < q->G; g++) {
            const sg_real *wg = w + g * q->Kg * q->ckk;
            const sg_real *D = dy + (n0 * q->K + g * q->Kg) * q->ohw;
            int64_t ldd = q->ohw;
            if (cnt > 1) {
                SG_R(chunk_gather)(q, dy, q->K, g * q->Kg, q->Kg, n0, cnt, s->tmp);
                D = s->tmp;
                ldd = ld;
            }
            if (direct && cnt == 1) { /* dx_g = w_g^T @ dy_g, nothing to fold */
                SG_R(sg_gemm)(1, 0, q->ckk, q->ohw, q->Kg, 1, wg, q->ckk, D, ldd, 0,
                              dx + (n0 * q->C + g * q->Cg) * q->hw, q->hw, par);
                continue;
            }
            SG_R(sg_gemm)(1, 0, q->ckk, ld, q->Kg, 1, wg, q->ckk, D, ldd, 0, s->col, ld, par);
            if (direct)
                SG_R(chunk_scatter)(q, s->col, q->C, g * q->Cg, q->Cg, n0, cnt, dx);
            else
                SG_R(col2im)(q, s->col, n0, cnt, g, dx, par);
        }
    }
}

static int SG_R(conv_backward_data)(const geometry *q, const sg_real *dy, const sg_real *w, sg_real *dx) {
    if (is_depthwise(q)) return SG_R(dw_run)(q, 1, dy, w, NULL, dx);
    return SG_R(im2col_run)(q, SG_R(backward_data_images), 1, dy, w, dx, 0);
}

/* -- gradient with respect to w: each thread sums its images into its own copy of dw, then the copies are added -- */
static void SG_R(backward_weight_images)(const geometry *q, const sg_real *dy, const sg_real *x, sg_real *dw,
                                         int64_t lo, int64_t hi, int64_t nb, SG_R(scratch) *s, int par) {
    const int direct = is_pointwise(q);
    for (int64_t n0 = lo; n0 < hi; n0 += nb) {
        const int64_t cnt = sg_min64(nb, hi - n0), ld = cnt * q->ohw;
        for (int64_t g = 0; g < q->G; g++) {
            const sg_real *D = dy + (n0 * q->K + g * q->Kg) * q->ohw;
            int64_t ldd = q->ohw;
            if (cnt > 1) {
                SG_R(chunk_gather)(q, dy, q->K, g * q->Kg, q->Kg, n0, cnt, s->tmp);
                D = s->tmp;
                ldd = ld;
            }
            const sg_real *B = s->col;
            int64_t ldb = ld;
            if (direct && cnt == 1) {
                B = x + (n0 * q->C + g * q->Cg) * q->hw;
                ldb = q->hw;
            } else {
                SG_R(im2col)(q, x, n0, cnt, g, s->col, par);
            }
            SG_R(sg_gemm)(0, 1, q->Kg, q->ckk, ld, 1, D, ldd, B, ldb, n0 == lo ? 0 : 1, dw + g * q->Kg * q->ckk,
                          q->ckk, par);
        }
    }
}

static int SG_R(conv_backward_weight)(const geometry *q, const sg_real *dy, const sg_real *x, sg_real *dw) {
    const int64_t nw = q->K * q->ckk;
    if (q->N == 0 || q->ohw == 0) {
        memset(dw, 0, (size_t)nw * sizeof(sg_real));
        return SG_OK;
    }
    if (is_depthwise(q)) return SG_R(dw_run)(q, 2, dy, x, NULL, dw);
    return SG_R(im2col_run)(q, SG_R(backward_weight_images), 1, dy, x, dw, nw);
}
