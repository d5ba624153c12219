/* im2col + gemm convolution kernels on sg_real data (instantiated by conv.c, see real.h). */

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

static int SG_R(conv_forward)(const geometry *q, const sg_real *x, const sg_real *w, const sg_real *b, sg_real *y) {
    const int err = SG_R(im2col_run)(q, SG_R(forward_images), !is_pointwise(q) || chunk_images(q) > 1, x, w, y, 0);
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
    return SG_R(im2col_run)(q, SG_R(backward_weight_images), 1, dy, x, dw, nw);
}
