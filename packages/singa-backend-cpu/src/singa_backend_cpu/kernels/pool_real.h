/* Pooling kernels on sg_real planes (instantiated by pool.c, see real.h).
 *
 * The row kernels (max_taps, sum_taps, max_tile, sum_tile) take the taps (i, j) of the windows one at a time, in the
 * window's scan order, each in one loop over many outputs at once, without bounds checks, which the compiler
 * vectorises. Max pooling with stride 2 (2x2 / 2 of training CNNs, 3x3 / 2 of AlexNet and SqueezeNet, 3x3 / 2 with
 * padding 1 of ResNet's stem) reads its rows in place with AVX-512 or AVX2 in float32 (max_stride2: pool.c's
 * pool_pairs_f32 and pool_stride2_f32). Otherwise the forward pass feeds the row kernels one of four ways, chosen per call (pool.c:
 * plan_open):
 *  - small planes: a vector's width of them side by side, one a lane, padding filled in (lanes_unit);
 *  - most other shapes: phase copies, the input split by row and column position mod the strides, padding filled in,
 *    in which every window lies inside and every tap is one contiguous run over all outputs (phase_unit);
 *  - otherwise (windows nearly as large as the plane, windows with no element inside, large strides) a plane's outputs
 *    are split by how many of their window's taps lie inside the input. Output rows [RA, RB) have every tap row inside
 *    and output columns [A, B) every tap column, so the windows of that rectangle have all their taps inside: the row
 *    kernels run along each output row (input strided by the stride), or along the whole rectangle as one run (stride 1
 *    with OW == W: flat). The other columns of those rows each run down the rows (input strided by sh * W) over their
 *    inside taps, the same kernels again; only the few rows above RA and below RB scan their edge windows one by one
 *    (max_plane, avg_plane);
 *  - planes too narrow for those go POOL_GROUP at a time, window by window (max_group, avg_group).
 * Every path visits a window's taps in the same order, so an output does not depend on which path computed it. The
 * gradient of max pooling scatters dy to the forward's winners; that of averages adds each output's share to its
 * window's taps, a tap at a time over a row of outputs (spread), in the order of the outputs. */

/* Max of one window, taps [i0, i1) x [j0, j1) in scan order: the first maximum wins; a NaN beats everything and the
 * first NaN stays. *at gets the winner's flat index in the plane, -1 (and *best 0) for a window with no tap inside. */
static inline void SG_R(max_window)(const pgeom *q, const sg_real *xp, int64_t i0, int64_t i1, int64_t j0, int64_t j1,
                                    int64_t hbase, int64_t wbase, sg_real *best_out, int64_t *at_out) {
    sg_real best = 0;
    SG_R(pbits) bits = 0;
    int64_t bi = -1;
    for (int64_t i = i0; i < i1; i++) {
        const int64_t row = (hbase + i * q->dh) * q->W;
        for (int64_t j = j0; j < j1; j++) {
            const int64_t at = row + wbase + j * q->dw;
            const sg_real v = xp[at];
            SG_R(pbits) vbits;
            memcpy(&vbits, &v, sizeof v);
            /* selects of integers, which compile to conditional moves: on real data the comparison is a coin toss,
             * and a branch (what a select of floats becomes) mispredicts */
            const int take = (bi < 0) | (v > best) | ((v != v) & (best == best));
            bits = take ? vbits : bits;
            bi = take ? at : bi;
            memcpy(&best, &bits, sizeof best);
        }
    }
    *best_out = bi < 0 ? 0 : best;
    *at_out = bi;
}

/* The same rule as max_window for n outputs at once, taps [i0, i1) x [j0, j1) in scan order: tap (i, j) of output o
 * reads base[(i - i0) * di + (j - j0) * dj + o * SW]. y[o] gets the maximum and, when t is given, t[o] the winning
 * tap's offset from the window's corner, i * di + j * dj. `take` is true when v is larger than the best so far, or v
 * is a NaN and the best is not: !(v <= b) holds for v > b and for an unordered pair, (b == b) rules out a NaN best. */
POOL_INLINE void SG_R(max_taps)(const sg_real *base, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t di,
                                int64_t dj, int64_t n, sg_real *restrict y, SG_R(ptap) *restrict t, const int64_t SW) {
    for (int64_t i = i0; i < i1; i++) {
        for (int64_t j = j0; j < j1; j++) {
            const sg_real *restrict s = base + (i - i0) * di + (j - j0) * dj;
            const SG_R(ptap) tt = (SG_R(ptap))(i * di + j * dj);
            if (i == i0 && j == j0) {
                for (int64_t o = 0; o < n; o++) y[o] = s[o * SW];
                if (t)
                    for (int64_t o = 0; o < n; o++) t[o] = tt;
            } else if (t) {
                for (int64_t o = 0; o < n; o++) {
                    const sg_real v = s[o * SW], b = y[o];
                    const int take = !(v <= b) & (b == b);
                    y[o] = take ? v : b;
                    t[o] = take ? tt : t[o];
                }
            } else {
                for (int64_t o = 0; o < n; o++) {
                    const sg_real v = s[o * SW], b = y[o];
                    y[o] = !(v <= b) & (b == b) ? v : b;
                }
            }
        }
    }
}

/* Sums in double of n windows, addressed as in max_taps, taps in scan order (as every path's sums). */
POOL_INLINE void SG_R(sum_taps)(const sg_real *base, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t di,
                                int64_t dj, int64_t n, double *restrict acc, const int64_t SW) {
    for (int64_t o = 0; o < n; o++) acc[o] = 0.0;
    for (int64_t i = i0; i < i1; i++) {
        for (int64_t j = j0; j < j1; j++) {
            const sg_real *restrict s = base + (i - i0) * di + (j - j0) * dj;
            for (int64_t o = 0; o < n; o++) acc[o] += (double)s[o * SW];
        }
    }
}

/* Scratch of one thread for the forward kernels: L entries of each (pool_forward). */
typedef struct {
    SG_R(ptap) *t;
    sg_real *vals, *buf;
    double *acc;
    const double *rdiv; /* phase copies' averages: 1 / the divisor of output (oh, c) at oh * QW + c (shared) */
} SG_R(pscratch);

/* Whether the interior rows [RA, RB) go through the row kernels (the rest, one window at a time). */
static inline int SG_R(pool_runs)(const pplan *P) { return P->RB - P->RA >= POOL_VEC_MIN; }

/* Max of output row oh: the windows one by one, then the interior columns [A, B) through the row kernels. */
static void SG_R(max_row)(const pgeom *q, const pplan *P, const sg_real *xp, int64_t oh, sg_real *yr, int64_t *ir,
                          SG_R(ptap) *t) {
    const int64_t i0 = P->tr.lo[oh], i1 = P->tr.hi[oh], hbase = oh * q->sh - q->pt;
    const int vec = P->vec && i0 < i1;
    for (int64_t ow = 0; ow < q->OW; ow++) {
        if (vec && ow == P->A) ow = P->B;
        if (ow >= q->OW) break;
        int64_t at;
        SG_R(max_window)(q, xp, i0, i1, P->tc.lo[ow], P->tc.hi[ow], hbase, ow * q->sw - q->pl, yr + ow, &at);
        if (ir) ir[ow] = at;
    }
    if (!vec) return;
    const int64_t A = P->A, n = P->B - A, corner = hbase * q->W + A * q->sw - q->pl;
    SG_R(ptap) *tv = ir ? t : NULL;
    POOL_BY_STRIDE(q->sw, SG_R(max_taps)(xp + corner + i0 * q->dh * q->W, i0, i1, 0, q->kw, q->dh * q->W,
                                         q->dw, n, yr + A, tv, SW));
    if (ir)
        for (int64_t o = 0; o < n; o++) ir[A + o] = corner + o * q->sw + t[o];
}

/* Max of column ow over the interior rows, as one run down the rows. */
static void SG_R(max_column)(const pgeom *q, const pplan *P, const sg_real *xp, int64_t ow, sg_real *yp, int64_t *ip,
                             const SG_R(pscratch) *S) {
    const int64_t j0 = P->tc.lo[ow], j1 = P->tc.hi[ow], OW = q->OW, RA = P->RA, n = P->RB - RA;
    if (j0 >= j1) { /* no tap column inside: empty windows */
        for (int64_t o = 0; o < n; o++) {
            yp[(RA + o) * OW + ow] = 0;
            if (ip) ip[(RA + o) * OW + ow] = -1;
        }
        return;
    }
    const int64_t step = q->sh * q->W, corner = (RA * q->sh - q->pt) * q->W + ow * q->sw - q->pl;
    SG_R(max_taps)(xp + corner + j0 * q->dw, 0, q->kh, j0, j1, q->dh * q->W, q->dw, n, S->vals,
                   ip ? S->t : NULL, step);
    for (int64_t o = 0; o < n; o++) yp[(RA + o) * OW + ow] = S->vals[o];
    if (ip)
        for (int64_t o = 0; o < n; o++) ip[(RA + o) * OW + ow] = corner + o * step + S->t[o];
}

/* Max pooling of one plane. Flat: the window of output o = oh * W + ow has its corner at input o + corner, so the
 * interior rectangle is one run from (RA, A) to (RB - 1, B - 1), taken in chunks of POOL_FLAT_CHUNK outputs; its edge
 * columns there read the neighbouring rows' elements, and are computed again by the column runs afterwards. */
static void SG_R(max_plane)(const pgeom *q, const pplan *P, const sg_real *xp, sg_real *yp, int64_t *ip,
                            const SG_R(pscratch) *S) {
    const int64_t OW = q->OW, runs = SG_R(pool_runs)(P);
    for (int64_t oh = 0; oh < q->OH; oh++)
        if (!runs || oh < P->RA || oh >= P->RB)
            SG_R(max_row)(q, P, xp, oh, yp + oh * OW, ip ? ip + oh * OW : NULL, S->t);
    if (!runs) return;
    if (P->flat) {
        const int64_t o0 = P->RA * OW + P->A, o1 = (P->RB - 1) * OW + P->B, corner = -q->pt * q->W - q->pl;
        for (int64_t s = o0; s < o1; s += POOL_FLAT_CHUNK) {
            const int64_t n = sg_min64(POOL_FLAT_CHUNK, o1 - s);
            SG_R(max_taps)(xp + s + corner, 0, q->kh, 0, q->kw, q->dh * q->W, q->dw, n, yp + s,
                           ip ? S->t : NULL, 1);
            if (ip)
                for (int64_t o = 0; o < n; o++) ip[s + o] = s + o + corner + S->t[o];
        }
    } else if (P->vec) {
        const int64_t A = P->A, n = P->B - A;
        for (int64_t oh = P->RA; oh < P->RB; oh++) {
            const int64_t corner = (oh * q->sh - q->pt) * q->W + A * q->sw - q->pl;
            int64_t *ir = ip ? ip + oh * OW : NULL;
            POOL_BY_STRIDE(q->sw, SG_R(max_taps)(xp + corner, 0, q->kh, 0, q->kw, q->dh * q->W, q->dw, n,
                                                 yp + oh * OW + A, ir ? S->t : NULL, SW));
            if (ir)
                for (int64_t o = 0; o < n; o++) ir[A + o] = corner + o * q->sw + S->t[o];
        }
    }
    for (int64_t ow = 0; ow < OW; ow++) {
        if (P->vec && ow == P->A) ow = P->B;
        if (ow >= OW) break;
        SG_R(max_column)(q, P, xp, ow, yp, ip, S);
    }
}

/* Average of output row oh: the windows one by one, then the interior columns through the row kernels. Interior
 * windows have all kw columns inside the input, hence inside the padding: their divisor is the row's. */
static void SG_R(avg_row)(const pgeom *q, const pplan *P, int cip, const sg_real *xp, int64_t oh, sg_real *yr,
                          double *acc) {
    const int64_t i0 = P->tr.lo[oh], i1 = P->tr.hi[oh], hbase = oh * q->sh - q->pt;
    const int vec = P->vec && i0 < i1;
    for (int64_t ow = 0; ow < q->OW; ow++) {
        if (vec && ow == P->A) ow = P->B;
        if (ow >= q->OW) break;
        const int64_t j0 = P->tc.lo[ow], j1 = P->tc.hi[ow], wbase = ow * q->sw - q->pl;
        double sum = 0.0;
        for (int64_t i = i0; i < i1; i++) {
            const int64_t at = (hbase + i * q->dh) * q->W + wbase;
            for (int64_t j = j0; j < j1; j++) sum += xp[at + j * q->dw];
        }
        const int64_t inside = (i1 - i0) * (j1 - j0);
        const int64_t div = cip ? P->tr.padded[oh] * P->tc.padded[ow] : inside;
        yr[ow] = inside == 0 ? 0 : (sg_real)(sum * (1.0 / (double)div));
    }
    if (!vec) return;
    const int64_t A = P->A, n = P->B - A, first = (hbase + i0 * q->dh) * q->W + A * q->sw - q->pl;
    POOL_BY_STRIDE(q->sw, SG_R(sum_taps)(xp + first, i0, i1, 0, q->kw, q->dh * q->W, q->dw, n, acc, SW));
    const double div = (double)((cip ? P->tr.padded[oh] : i1 - i0) * q->kw);
    const double rdiv = 1.0 / div;
    for (int64_t o = 0; o < n; o++) yr[A + o] = (sg_real)(acc[o] * rdiv);
}

/* Average pooling of one plane, laid out as max_plane's. The interior rows have all kh rows inside the input (and the
 * padding): a window's divisor is kh times its column's. */
static void SG_R(avg_plane)(const pgeom *q, const pplan *P, int cip, const sg_real *xp, sg_real *yp,
                            const SG_R(pscratch) *S) {
    const int64_t OW = q->OW, runs = SG_R(pool_runs)(P), kh = q->kh;
    double *acc = S->acc;
    for (int64_t oh = 0; oh < q->OH; oh++)
        if (!runs || oh < P->RA || oh >= P->RB) SG_R(avg_row)(q, P, cip, xp, oh, yp + oh * OW, acc);
    if (!runs) return;
    const double rdiv = 1.0 / (double)(kh * q->kw);
    if (P->flat) {
        const int64_t o0 = P->RA * OW + P->A, o1 = (P->RB - 1) * OW + P->B, corner = -q->pt * q->W - q->pl;
        for (int64_t s = o0; s < o1; s += POOL_FLAT_CHUNK) {
            const int64_t n = sg_min64(POOL_FLAT_CHUNK, o1 - s);
            SG_R(sum_taps)(xp + s + corner, 0, kh, 0, q->kw, q->dh * q->W, q->dw, n, acc, 1);
            for (int64_t o = 0; o < n; o++) yp[s + o] = (sg_real)(acc[o] * rdiv);
        }
    } else if (P->vec) {
        const int64_t A = P->A, n = P->B - A;
        for (int64_t oh = P->RA; oh < P->RB; oh++) {
            const int64_t corner = (oh * q->sh - q->pt) * q->W + A * q->sw - q->pl;
            POOL_BY_STRIDE(q->sw, SG_R(sum_taps)(xp + corner, 0, kh, 0, q->kw, q->dh * q->W, q->dw, n, acc, SW));
            sg_real *yr = yp + oh * OW + A;
            for (int64_t o = 0; o < n; o++) yr[o] = (sg_real)(acc[o] * rdiv);
        }
    }
    const int64_t RA = P->RA, n = P->RB - RA, step = q->sh * q->W;
    for (int64_t ow = 0; ow < OW; ow++) {
        if (P->vec && ow == P->A) ow = P->B;
        if (ow >= OW) break;
        const int64_t j0 = P->tc.lo[ow], j1 = P->tc.hi[ow];
        if (j0 >= j1) {
            for (int64_t o = 0; o < n; o++) yp[(RA + o) * OW + ow] = 0;
            continue;
        }
        const int64_t corner = (RA * q->sh - q->pt) * q->W + ow * q->sw - q->pl;
        SG_R(sum_taps)(xp + corner + j0 * q->dw, 0, kh, j0, j1, q->dh * q->W, q->dw, n, acc, step);
        const double d = (double)(kh * (cip ? P->tc.padded[ow] : j1 - j0));
        const double rd = 1.0 / d;
        for (int64_t o = 0; o < n; o++) yp[(RA + o) * OW + ow] = (sg_real)(acc[o] * rd);
    }
}

/* Planes per dynamically scheduled chunk: about 8 chunks a thread, so that a descheduled thread does not hold up the
 * rest (a plane's results do not depend on the thread computing it). */
static inline int64_t SG_R(pool_chunk)(int64_t planes, int T) {
    const int64_t c = planes / (8 * (int64_t)T);
    return c < 1 ? 1 : c;
}

/* The same rule as max_taps over taps at any offsets, in order, for m outputs: tap k of output o reads
 * base[off[k] + o]; t[o] gets the winning tap's number k. */
POOL_INLINE void SG_R(max_tile)(const sg_real *base, const int64_t *off, int64_t taps, int64_t m, sg_real *restrict y,
                                SG_R(ptap) *restrict t) {
    const sg_real *restrict s0 = base + off[0];
    for (int64_t o = 0; o < m; o++) y[o] = s0[o];
    if (t)
        for (int64_t o = 0; o < m; o++) t[o] = 0;
    for (int64_t k = 1; k < taps; k++) {
        const sg_real *restrict s = base + off[k];
        const SG_R(ptap) tk = (SG_R(ptap))k;
        if (t) {
            for (int64_t o = 0; o < m; o++) {
                const sg_real v = s[o], b = y[o];
                const int take = !(v <= b) & (b == b);
                y[o] = take ? v : b;
                t[o] = take ? tk : t[o];
            }
        } else {
            for (int64_t o = 0; o < m; o++) {
                const sg_real v = s[o], b = y[o];
                y[o] = !(v <= b) & (b == b) ? v : b;
            }
        }
    }
}

/* Sums in double of m outputs, taps as in max_tile, in order. */
POOL_INLINE void SG_R(sum_tile)(const sg_real *base, const int64_t *off, int64_t taps, int64_t m,
                                double *restrict acc) {
    for (int64_t o = 0; o < m; o++) acc[o] = 0.0;
    for (int64_t k = 0; k < taps; k++) {
        const sg_real *restrict s = base + off[k];
        for (int64_t o = 0; o < m; o++) acc[o] += (double)s[o];
    }
}

/* Outputs per tile of max_list and sum_list: every tap passes over a tile while it is in the L1 cache, instead of over
 * all n outputs, which would take the outputs through the L2 cache once a tap (measured best of 64 to 1024). */
#define POOL_TILE 512

/* max_tile over n outputs, a tile at a time (one call site with a variable length: GCC 12 leaves the double sums of
 * a constant-length tile unvectorised). */
static void SG_R(max_list)(const sg_real *base, const int64_t *off, int64_t taps, int64_t n, sg_real *y,
                           SG_R(ptap) *t) {
    for (int64_t o = 0; o < n; o += POOL_TILE)
        SG_R(max_tile)(base + o, off, taps, sg_min64(POOL_TILE, n - o), y + o, t ? t + o : NULL);
}

static void SG_R(sum_list)(const sg_real *base, const int64_t *off, int64_t taps, int64_t n, double *acc) {
    for (int64_t o = 0; o < n; o += POOL_TILE) SG_R(sum_tile)(base + o, off, taps, sg_min64(POOL_TILE, n - o), acc + o);
}

/* d[o] = s[o * SW] for o in [0, n): one phase of an input row. */
POOL_INLINE void SG_R(gather)(sg_real *restrict d, const sg_real *restrict s, int64_t n, const int64_t SW) {
    if (SW == 1) { /* short rows: memcpy's overlapping moves, not the compiler's loop with its element-wise tail */
        memcpy(d, s, (size_t)n * sizeof(sg_real));
        return;
    }
#if defined(__AVX512F__)
    if (sizeof(sg_real) == sizeof(float) && SW == 2) {
        pool_gather2_f32((float *)d, (const float *)s, n);
        return;
    }
#endif
    for (int64_t o = 0; o < n; o++) d[o] = s[o * SW];
}

/* The flat index in the plane xp of output (oh, ow)'s winning tap k (taps numbered i * kw + j): where the winner is a
 * -inf of the padding (it came first and an element tied it), the window itself is scanned for its first maximum. */
static inline int64_t SG_R(winner_index)(const pgeom *q, const pplan *P, const sg_real *xp, int64_t oh, int64_t ow,
                                         int64_t k) {
    const int64_t hb = oh * q->sh - q->pt, wb = ow * q->sw - q->pl;
    const int64_t h = hb + k / q->kw * q->dh, w = wb + k % q->kw * q->dw;
    if (h >= 0 && h < q->H && w >= 0 && w < q->W) return h * q->W + w;
    sg_real v;
    int64_t at;
    SG_R(max_window)(q, xp, P->tr.lo[oh], P->tr.hi[oh], P->tc.lo[ow], P->tc.hi[ow], hb, wb, &v, &at);
    return at;
}

/* Output rows [oh0, oh0 + R) of np planes (np <= PG; R == OH when PG > 1) through phase copies (pool.c: pplan):
 * the phase blocks are filled from the input, -inf around it for max pooling (it never beats an element; where it ties
 * with a -inf element first, the index is looked for again), 0 for averages (an exact no-op in the sums, which never
 * are -0); then every output of the unit is one run of the row kernels over the taps in scan order (a few columns and,
 * between planes, rows computed in vain), with no edges to treat apart and no strided loads. */
static void SG_R(phase_unit)(const pgeom *q, const pplan *P, int mode, const sg_real *x, int64_t np,
                             int64_t oh0, int64_t R, sg_real *y, int64_t *ip, const SG_R(pscratch) *S) {
    const int64_t H = q->H, W = q->W, QW = P->QW, QR = P->QR, OW = q->OW, hw = H * W, ohw = q->OH * OW,
                  rows = R + P->exth, taps = q->kh * q->kw, sh = q->sh, sw = q->sw, nph = P->nph, BS = P->BS;
    const sg_real fill = mode == POOL_MAX ? -INFINITY : 0;
    sg_real *buf = S->buf;
    /* each block's input offset at row 0 and its columns c whose element c * sw + b - pl lies inside [0, W): [c0, c1),
     * in locals that the row copies (memcpy: stores of any type) cannot clobber, so they stay in registers */
    int64_t row0[POOL_PHASE_STRIDE * POOL_PHASE_STRIDE], shift[POOL_PHASE_STRIDE * POOL_PHASE_STRIDE],
        c0[POOL_PHASE_STRIDE * POOL_PHASE_STRIDE], c1[POOL_PHASE_STRIDE * POOL_PHASE_STRIDE];
    for (int64_t s = 0; s < nph; s++) {
        row0[s] = oh0 * sh + P->pa[s] - q->pt;
        c0[s] = P->c0[s];
        c1[s] = P->c1[s];
        shift[s] = c0[s] * sw + P->pb[s] - q->pl;
    }
    /* rows in the input's order (blocks by row phase first: pool.c), an input row's phases while it is in the cache */
    for (int64_t g = 0; g < np; g++)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t s = 0; s < nph; s++) {
                const int64_t h = row0[s] + r * sh, a = c0[s], b = c1[s];
                sg_real *d = buf + s * BS + (g * QR + r) * QW;
                int64_t c = 0;
                if (h >= 0 && h < H && a < b) {
                    for (; c < a; c++) d[c] = fill;
                    const sg_real *xr = x + g * hw + h * W + shift[s];
                    POOL_BY_STRIDE(sw, SG_R(gather)(d + a, xr, b - a, SW));
                    c = b;
                }
                for (; c < QW; c++) d[c] = fill;
            }
    const int64_t n = ((np - 1) * QR + R - 1) * QW + OW; /* the unit's last output, plus one */
    if (mode == POOL_AVG) { /* sums, then each plane's outputs divided as one run (rows of a few outputs would not
                              * fill a vector), the divisors laid out as the outputs */
        SG_R(sum_list)(buf, P->toff, taps, n, S->acc);
        const double *rdiv = S->rdiv + oh0 * QW;
        for (int64_t g = 0; g < np; g++) {
            const int64_t o = g * QR * QW, len = (R - 1) * QW + OW;
            const double *restrict acc = S->acc + o;
            sg_real *restrict v = S->vals + o;
            for (int64_t i = 0; i < len; i++) v[i] = (sg_real)(acc[i] * rdiv[i]);
        }
    } else {
        SG_R(max_list)(buf, P->toff, taps, n, S->vals, ip ? S->t : NULL);
    }
    for (int64_t g = 0; g < np; g++)
        for (int64_t r = 0; r < R; r++) {
            const int64_t o = (g * QR + r) * QW, oh = oh0 + r;
            memcpy(y + g * ohw + oh * OW, S->vals + o, (size_t)OW * sizeof(sg_real));
            if (!ip) continue;
            for (int64_t ow = 0; ow < OW; ow++)
                ip[g * ohw + oh * OW + ow] = SG_R(winner_index)(q, P, x + g * hw, oh, ow, S->t[o + ow]);
        }
}

/* Planes [0, np) of at most G = P->LN (a vector's width: pool.c), side by side: position (r, c) of the padded plane
 * (PH x PW, from (-pt, -pl)) holds plane g's element at buf[(r * PW + c) * G + g], the fill value (as phase_unit's)
 * outside the input and in the unused lanes. An output's taps are then its window's, in scan order, each G lanes at
 * offset toff[k] from the output's corner: the row kernels run over the G lanes of an output (of a row of outputs at
 * stride 1, whose lanes are one run), a vector op a tap for G planes at once, however small the planes. */
static void SG_R(lanes_unit)(const pgeom *q, const pplan *P, int mode, int cip, const sg_real *x, int64_t np,
                             sg_real *y, int64_t *ip, const SG_R(pscratch) *S) {
    const int64_t G = P->LN, H = q->H, W = q->W, PW = P->PW, OH = q->OH, OW = q->OW, hw = H * W, ohw = OH * OW,
                  kw = q->kw, pt = q->pt, pl = q->pl, taps = q->kh * kw, sw = q->sw;
    const sg_real fill = mode == POOL_MAX ? -INFINITY : 0;
    sg_real *buf = S->buf;
    for (int64_t i = 0; i < P->PH * PW * G; i++) buf[i] = fill;
    const int64_t h1 = sg_min64(H, P->PH - pt), w1 = sg_min64(W, PW - pl); /* input rows and columns a window reads */
    for (int64_t g = 0; g < np; g++)
        for (int64_t h = 0; h < h1; h++) {
            const sg_real *xr = x + g * hw + h * W;
            sg_real *d = buf + ((h + pt) * PW + pl) * G + g;
            for (int64_t w = 0; w < w1; w++) d[w * G] = xr[w];
        }
    const double *cf = cip ? P->cpad : P->cin;
    SG_R(ptap) *t = ip ? S->t : NULL;
    for (int64_t oh = 0; oh < OH; oh++) {
        const sg_real *row = buf + oh * q->sh * PW * G;
        /* the row's outputs, lanes innermost: S->vals (max) or S->acc (sums) at ow * G + g */
        if (mode == POOL_MAX) {
            if (sw == 1)
                SG_R(max_tile)(row, P->toff, taps, OW * G, S->vals, t);
            else
                for (int64_t ow = 0; ow < OW; ow++)
                    SG_R(max_tile)(row + ow * sw * G, P->toff, taps, G, S->vals + ow * G, t ? t + ow * G : NULL);
        } else {
            /* sums output by output, the lanes' doubles in registers across the taps (a pass a tap over the row's
             * doubles, as max_tile does, measured slower: each tap's load-add-store goes through L1) */
            enum { GC = 64 / sizeof(sg_real) }; /* == G: pool.c's plan_open */
            for (int64_t ow = 0; ow < OW; ow++) {
                const sg_real *base = row + ow * sw * G;
                double a[GC];
                for (int g = 0; g < GC; g++) a[g] = 0.0;
                for (int64_t k = 0; k < taps; k++) {
                    const sg_real *restrict s = base + P->toff[k];
                    for (int g = 0; g < GC; g++) a[g] += (double)s[g];
                }
                for (int g = 0; g < GC; g++) S->acc[ow * G + g] = a[g];
            }
        }
        const int row_empty = P->tr.lo[oh] >= P->tr.hi[oh];
        const double rf = (double)(cip ? P->tr.padded[oh] : P->tr.hi[oh] - P->tr.lo[oh]);
        for (int64_t ow = 0; ow < OW; ow++) {
            const int64_t o = oh * OW + ow;
            if (row_empty || P->tc.lo[ow] >= P->tc.hi[ow]) { /* no tap inside: 0, and no winner */
                for (int64_t g = 0; g < np; g++) {
                    y[g * ohw + o] = 0;
                    if (ip) ip[g * ohw + o] = -1;
                }
            } else if (mode == POOL_AVG) {
                const double r = 1.0 / (rf * cf[ow]);
                for (int64_t g = 0; g < np; g++) y[g * ohw + o] = (sg_real)(S->acc[ow * G + g] * r);
            } else {
                for (int64_t g = 0; g < np; g++) y[g * ohw + o] = S->vals[ow * G + g];
                for (int64_t g = 0; ip && g < np; g++)
                    ip[g * ohw + o] = SG_R(winner_index)(q, P, x + g * hw, oh, ow, t[ow * G + g]);
            }
        }
    }
}

/* POOL_GROUP planes at once, window by window: for planes small enough that every window is scanned on its own. A
 * window's maximum or sum is a chain of dependent steps, kept in scan order; the planes' chains are independent, so
 * their latencies overlap. Same steps, same order, same results as max_window / avg_row. */
static void SG_R(max_group)(const pgeom *q, const pplan *P, const sg_real *xp, int64_t hw, sg_real *yp, int64_t *ip,
                            int64_t ohw) {
    for (int64_t oh = 0; oh < q->OH; oh++) {
        const int64_t i0 = P->tr.lo[oh], i1 = P->tr.hi[oh], hbase = oh * q->sh - q->pt;
        for (int64_t ow = 0; ow < q->OW; ow++) {
            const int64_t j0 = P->tc.lo[ow], j1 = P->tc.hi[ow], wbase = ow * q->sw - q->pl, o = oh * q->OW + ow;
            sg_real best[POOL_GROUP];
            SG_R(pbits) bits[POOL_GROUP];
            int64_t bi[POOL_GROUP];
            for (int g = 0; g < POOL_GROUP; g++) {
                best[g] = 0;
                bits[g] = 0;
                bi[g] = -1;
            }
            for (int64_t i = i0; i < i1; i++) {
                const int64_t row = (hbase + i * q->dh) * q->W;
                for (int64_t j = j0; j < j1; j++) {
                    const int64_t at = row + wbase + j * q->dw;
                    for (int g = 0; g < POOL_GROUP; g++) {
                        const sg_real v = xp[g * hw + at];
                        SG_R(pbits) vbits;
                        memcpy(&vbits, &v, sizeof v);
                        const int take = (bi[g] < 0) | (v > best[g]) | ((v != v) & (best[g] == best[g]));
                        bits[g] = take ? vbits : bits[g];
                        bi[g] = take ? at : bi[g];
                        memcpy(&best[g], &bits[g], sizeof best[g]);
                    }
                }
            }
            for (int g = 0; g < POOL_GROUP; g++) {
                yp[g * ohw + o] = bi[g] < 0 ? 0 : best[g];
                if (ip) ip[g * ohw + o] = bi[g];
            }
        }
    }
}

static void SG_R(avg_group)(const pgeom *q, const pplan *P, int cip, const sg_real *xp, int64_t hw, sg_real *yp,
                            int64_t ohw) {
    for (int64_t oh = 0; oh < q->OH; oh++) {
        const int64_t i0 = P->tr.lo[oh], i1 = P->tr.hi[oh], hbase = oh * q->sh - q->pt;
        for (int64_t ow = 0; ow < q->OW; ow++) {
            const int64_t j0 = P->tc.lo[ow], j1 = P->tc.hi[ow], wbase = ow * q->sw - q->pl, o = oh * q->OW + ow;
            double sum[POOL_GROUP];
            for (int g = 0; g < POOL_GROUP; g++) sum[g] = 0.0;
            for (int64_t i = i0; i < i1; i++) {
                const int64_t row = (hbase + i * q->dh) * q->W;
                for (int64_t j = j0; j < j1; j++) {
                    const int64_t at = row + wbase + j * q->dw;
                    for (int g = 0; g < POOL_GROUP; g++) sum[g] += xp[g * hw + at];
                }
            }
            const int64_t inside = (i1 - i0) * (j1 - j0);
            const int64_t div = cip ? P->tr.padded[oh] * P->tc.padded[ow] : inside;
            const double rdiv = 1.0 / (double)div;
            for (int g = 0; g < POOL_GROUP; g++) yp[g * ohw + o] = inside == 0 ? 0 : (sg_real)(sum[g] * rdiv);
        }
    }
}

#if defined(POOL_STRIDE2)
/* Max pooling with stride 2 and dilation 1 (2x2 / 2 of most training CNNs, 3x3 / 2 of AlexNet and SqueezeNet, and with
 * padding 1 ResNet's and ShuffleNet's stems). float32: each output row reads its input rows in place, 16 outputs a
 * vector with AVX-512, 8 with AVX2 (pool.c: pool_pairs_f32, pool_stride2_f32), no plan and no copies; rows whose windows reach into the padding above or
 * below leave those tap rows out, and the few outputs whose windows reach past the left or right edge scan them one
 * by one (max_window). Every output visits its taps in the same order as on the other paths. Elsewhere (float64,
 * CPUs without AVX2, windows at most half inside) the general paths below. */
static int SG_R(stride2_fits)(const pgeom *q) {
    if (sizeof(sg_real) != sizeof(float) || q->sh != 2 || q->sw != 2 || q->dh != 1 || q->dw != 1 ||
        q->kh * q->kw < 2 || q->kh * q->W >= ((int64_t)1 << 31) || q->pt >= q->kh || q->pl >= q->kw)
        return 0;
    /* output columns [A, B) have every tap column inside; most of each row must be. Short rows go here too, as one
     * masked vector: 2x2 windows from 4 outputs (an MNIST CNN's 24x24 and 8x8 planes: 3-5x faster than the small-plane
     * paths), other windows from 8 (a 3x3 window over 6 columns ran slower here without indices) */
    const int64_t A = (q->pl + 1) / 2, B = sg_min64(q->OW, (q->W - q->kw + q->pl) / 2 + 1);
#if POOL_STRIDE2 == 8
    /* with AVX2, planes past 128 KiB stream from memory, where the general paths measured faster (AMD EPYC Zen 3,
     * VGG's 2x2 / 2 on 64 x 224 x 224: 1.4 ms against 2.1; 3x3 / 2 on 112 x 112 planes: 0.5-0.6x of their time) */
    if (q->H * q->W * (int64_t)sizeof(float) > ((int64_t)128 << 10)) return 0;
#endif
    return B - A >= (q->kh == 2 && q->kw == 2 ? 4 : 8) && 2 * (B - A) >= q->OW;
}

static void SG_R(max_stride2)(const pgeom *q, const sg_real *x, sg_real *y, int64_t *idx) {
    const int64_t H = q->H, W = q->W, OH = q->OH, OW = q->OW, rows = q->N * q->C * OH;
    const int64_t A = (q->pl + 1) / 2, B = sg_min64(OW, (W - q->kw + q->pl) / 2 + 1);
    const int T = sg_threads_for(rows * OW * q->kh * q->kw, 1 << 15);
#pragma omp parallel for num_threads(T) if (T > 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t oh = r % OH, top = 2 * oh - q->pt;                 /* the windows' first row */
        const int64_t i0 = sg_max64(0, -top), i1 = sg_min64(q->kh, H - top); /* their tap rows inside */
        const sg_real *xp = x + r / OH * H * W;
        sg_real *yr = y + r * OW;
        int64_t *ir = idx ? idx + r * OW : NULL;
        const int64_t a = i1 > i0 ? A : OW, b = i1 > i0 ? B : OW; /* a row wholly in the padding (ceil mode) */
        for (int64_t ow = 0; ow < OW; ow++) {
            if (ow == a) ow = b;
            if (ow >= OW) break;
            const int64_t left = 2 * ow - q->pl;
            sg_real best;
            int64_t at;
            SG_R(max_window)(q, xp, i0, i1, sg_max64(0, -left), sg_min64(q->kw, W - left), top, left, &best, &at);
            yr[ow] = best;
            if (ir) ir[ow] = at;
        }
        if (a == OW) continue;
        const int64_t at = top * W + 2 * A - q->pl;
        const float *ri = (const float *)(xp + (top + i0) * W + 2 * A - q->pl);
        const int pairs = q->kh == 2 && q->kw == 2 && i0 == 0 && i1 == 2; /* both taps of a row from one pair of loads */
        if (pairs && ir)
            pool_pairs_f32(ri, ri + W, B - A, (float *)yr + A, ir + A, at, W);
        else if (pairs)
            pool_pairs_f32(ri, ri + W, B - A, (float *)yr + A, NULL, at, W); /* inlined without the indices' work */
        else if (ir)
            pool_stride2_f32(ri, W, i0, i1, q->kw, B - A, (float *)yr + A, ir + A, at);
        else
            pool_stride2_f32(ri, W, i0, i1, q->kw, B - A, (float *)yr + A, NULL, at);
    }
}
#endif

static int SG_R(pool_forward)(const pgeom *q, int mode, int cip, const sg_real *x, sg_real *y, int64_t *idx,
                              const pplan *P) {
#if defined(POOL_STRIDE2)
    if (mode == POOL_MAX && SG_R(stride2_fits)(q)) {
        SG_R(max_stride2)(q, x, y, idx);
        return SG_OK;
    }
#endif
    const int64_t planes = q->N * q->C, ohw = q->OH * q->OW, hw = q->H * q->W;
    const int T = sg_threads_for(planes * ohw * q->kh * q->kw, 1 << 15);
    /* units of work: phase copies (PG planes, or RC rows of a plane), single planes, or groups of POOL_GROUP small
     * planes */
    const int64_t G = P->lanes    ? P->LN
                      : P->phase  ? P->PG
                      : !P->vec && !SG_R(pool_runs)(P) ? POOL_GROUP
                                                        : 1;
    const int64_t per_plane = P->phase ? (q->OH + P->RC - 1) / P->RC : 1, units = (planes + G - 1) / G * per_plane;
    const int64_t chunk = SG_R(pool_chunk)(units, T);
    /* each thread's scratch: L tap numbers, values and doubles, and LB values of phase blocks */
    const int64_t L = sg_max64(sg_max64(sg_max64(q->OW, q->OH), POOL_FLAT_CHUNK),
                               P->lanes ? P->LN * q->OW : P->phase ? P->BS : 0);
    const int64_t LB = P->lanes ? P->LN * P->PH * P->PW : P->phase ? P->nph * P->BS : 0;
    const size_t per = ((size_t)L * (sizeof(int64_t) + sizeof(sg_real) + sizeof(double)) +
                        (size_t)LB * sizeof(sg_real) + 63) / 64 * 64;
    /* the phase copies' divisors for averages, (rows inside or padded) x (columns inside or padded), as reciprocals
     * (every path multiplies by 1 / divisor, the same number: a vector division costs several multiplications) */
    const int avg_phase = P->phase && mode == POOL_AVG;
    double *rdiv = avg_phase ? (double *)malloc((size_t)(q->OH * P->QW) * sizeof(double)) : NULL;
    char *scratch = (char *)malloc((size_t)T * per);
    if (!scratch || (avg_phase && !rdiv)) {
        free(scratch);
        free(rdiv);
        return SG_ENOMEM;
    }
    if (avg_phase) {
        const double *cf = cip ? P->cpad : P->cin;
        for (int64_t oh = 0; oh < q->OH; oh++) {
            const double rf = (double)(cip ? P->tr.padded[oh] : P->tr.hi[oh] - P->tr.lo[oh]);
            for (int64_t c = 0; c < P->QW; c++) rdiv[oh * P->QW + c] = c < q->OW ? 1.0 / (rf * cf[c]) : 1.0;
        }
    }
#pragma omp parallel num_threads(T) if (T > 1)
    {
        char *mine = scratch + (size_t)omp_get_thread_num() * per;
        SG_R(pscratch) S;
        S.acc = (double *)mine;
        S.t = (SG_R(ptap) *)(mine + (size_t)L * sizeof(double));
        S.vals = (sg_real *)(mine + (size_t)L * (sizeof(double) + sizeof(int64_t)));
        S.buf = S.vals + L;
        S.rdiv = rdiv;
#pragma omp for schedule(dynamic, chunk)
        for (int64_t u = 0; u < units; u++) {
            const int64_t p0 = u / per_plane * G, np = sg_min64(G, planes - p0);
            /* the unit's output rows [oh0, oh0 + R) of each of its planes */
            const int64_t oh0 = P->phase ? u % per_plane * P->RC : 0;
            const int64_t R = P->phase ? sg_min64(P->RC, q->OH - oh0) : q->OH;
            if (P->lanes) {
                int64_t *ip = idx && mode == POOL_MAX ? idx + p0 * ohw : NULL;
                SG_R(lanes_unit)(q, P, mode, cip, x + p0 * hw, np, y + p0 * ohw, ip, &S);
            } else if (P->phase) {
                int64_t *ip = idx && mode == POOL_MAX ? idx + p0 * ohw : NULL;
                SG_R(phase_unit)(q, P, mode, x + p0 * hw, np, oh0, R, y + p0 * ohw, ip, &S);
            } else if (np == POOL_GROUP && G == POOL_GROUP) {
                if (mode == POOL_MAX)
                    SG_R(max_group)(q, P, x + p0 * hw, hw, y + p0 * ohw, idx ? idx + p0 * ohw : NULL, ohw);
                else
                    SG_R(avg_group)(q, P, cip, x + p0 * hw, hw, y + p0 * ohw, ohw);
            } else {
                for (int64_t p = p0; p < p0 + np; p++) {
                    if (mode == POOL_MAX)
                        SG_R(max_plane)(q, P, x + p * hw, y + p * ohw, idx ? idx + p * ohw : NULL, &S);
                    else
                        SG_R(avg_plane)(q, P, cip, x + p * hw, y + p * ohw, &S);
                }
            }
            if (mode == POOL_AVG && idx) /* average windows have no winner */
                for (int64_t p = p0; p < p0 + np; p++)
                    for (int64_t o = p * ohw + oh0 * q->OW; o < p * ohw + (oh0 + R) * q->OW; o++) idx[o] = -1;
        }
    }
    free(scratch);
    free(rdiv);
    return SG_OK;
}

/* dx[o * SW] += s[o] for o in [0, n): one tap's share of the output columns whose tap lies inside. */
POOL_INLINE void SG_R(spread)(sg_real *restrict d, const sg_real *restrict s, int64_t n, const int64_t SW) {
    for (int64_t o = 0; o < n; o++) d[o * SW] += s[o];
}

/* The gradient of average pooling for POOL_GROUP planes at once, window by window (planes too narrow for the row
 * kernels): each output's share added to its window's taps, outputs in order, as in pool_backward. */
static void SG_R(avg_back_group)(const pgeom *q, const pplan *P, int cip, const sg_real *dyp, int64_t ohw,
                                 sg_real *dxp, int64_t hw) {
    memset(dxp, 0, (size_t)(POOL_GROUP * hw) * sizeof(sg_real));
    for (int64_t oh = 0; oh < q->OH; oh++) {
        const int64_t i0 = P->tr.lo[oh], i1 = P->tr.hi[oh], hbase = oh * q->sh - q->pt;
        for (int64_t ow = 0; ow < q->OW; ow++) {
            const int64_t j0 = P->tc.lo[ow], j1 = P->tc.hi[ow], inside = (i1 - i0) * (j1 - j0);
            if (inside == 0) continue;
            const int64_t div = cip ? P->tr.padded[oh] * P->tc.padded[ow] : inside, o = oh * q->OW + ow;
            sg_real share[POOL_GROUP];
            for (int g = 0; g < POOL_GROUP; g++) share[g] = (sg_real)((double)dyp[g * ohw + o] / (double)div);
            for (int64_t i = i0; i < i1; i++) {
                const int64_t row = (hbase + i * q->dh) * q->W + ow * q->sw - q->pl;
                for (int64_t j = j0; j < j1; j++)
                    for (int g = 0; g < POOL_GROUP; g++) dxp[g * hw + row + j * q->dw] += share[g];
            }
        }
    }
}

/* The gradient of average pooling for one plane: dxp (H * W) from dyp (OH * OW); share: the thread's scratch of OW
 * values. Each output's share, dy / divisor, is added to its window's taps. A dx element gets its shares in the order
 * of the outputs (rows, then columns): within a row, taps j from the last, whose output columns come first. */
static void SG_R(avg_back_plane)(const pgeom *q, const pplan *P, int cip, const sg_real *dyp, sg_real *dxp,
                                 sg_real *share) {
    const int64_t W = q->W, OW = q->OW;
    memset(dxp, 0, (size_t)(q->H * W) * sizeof(sg_real));
    for (int64_t oh = 0; oh < q->OH; oh++) {
        const int64_t i0 = P->tr.lo[oh], i1 = P->tr.hi[oh], hbase = oh * q->sh - q->pt;
        if (i0 >= i1) continue;
        const sg_real *g = dyp + oh * OW;
        if (!P->vec) { /* narrow rows: window by window, in the same order */
            for (int64_t ow = 0; ow < OW; ow++) {
                const int64_t j0 = P->tc.lo[ow], j1 = P->tc.hi[ow], inside = (i1 - i0) * (j1 - j0);
                if (inside == 0) continue;
                const int64_t div = cip ? P->tr.padded[oh] * P->tc.padded[ow] : inside;
                const sg_real sh = (sg_real)((double)g[ow] / (double)div);
                for (int64_t i = i0; i < i1; i++) {
                    const int64_t at = (hbase + i * q->dh) * W + ow * q->sw - q->pl;
                    for (int64_t j = j0; j < j1; j++) dxp[at + j * q->dw] += sh;
                }
            }
            continue;
        }
        for (int64_t ow = 0; ow < OW; ow++) {
            const int64_t inside = (i1 - i0) * (P->tc.hi[ow] - P->tc.lo[ow]);
            const int64_t div = cip ? P->tr.padded[oh] * P->tc.padded[ow] : inside;
            share[ow] = inside == 0 ? 0 : (sg_real)((double)g[ow] / (double)div);
        }
        for (int64_t i = i0; i < i1; i++) {
            sg_real *row = dxp + (hbase + i * q->dh) * W;
            for (int64_t j = q->kw - 1; j >= 0; j--) {
                const int64_t a = P->ja[j], n = P->jb[j] - a;
                if (n <= 0) continue;
                sg_real *d = row + a * q->sw + j * q->dw - q->pl;
                POOL_BY_STRIDE(q->sw, SG_R(spread)(d, share + a, n, SW));
            }
        }
    }
}

static int SG_R(pool_backward)(const pgeom *q, int mode, int cip, const sg_real *dy, const sg_real *x,
                               const int64_t *idx, sg_real *dx, const pplan *P) {
    const int64_t planes = q->N * q->C, ohw = q->OH * q->OW, hw = q->H * q->W, OW = q->OW;
    int64_t *found = NULL;
    if (mode == POOL_MAX && !idx) { /* no indices: find the winners again with the forward pass */
        found = (int64_t *)malloc((size_t)(planes * ohw) * sizeof(int64_t));
        sg_real *y = (sg_real *)malloc((size_t)(planes * ohw) * sizeof(sg_real));
        int err = found && y ? SG_R(pool_forward)(q, POOL_MAX, cip, x, y, found, P) : SG_ENOMEM;
        free(y);
        if (err) {
            free(found);
            return err;
        }
        idx = found;
    }
    const int T = sg_threads_for(planes * ohw * q->kh * q->kw, 1 << 15);
    if (mode == POOL_MAX) { /* scatter to the forward's winners */
        const int64_t chunk = SG_R(pool_chunk)(planes, T);
#pragma omp parallel for schedule(dynamic, chunk) num_threads(T) if (T > 1)
        for (int64_t p = 0; p < planes; p++) {
            sg_real *dxp = dx + p * hw;
            const sg_real *dyp = dy + p * ohw;
            const int64_t *ip = idx + p * ohw;
            memset(dxp, 0, (size_t)hw * sizeof(sg_real));
            for (int64_t o = 0; o < ohw; o++) {
                const int64_t at = ip[o];
                if (at >= 0 && at < hw) dxp[at] += dyp[o];
            }
        }
        free(found);
        return SG_OK;
    }
    /* units of work: single planes, or groups of POOL_GROUP planes too narrow for the row kernels */
    const int64_t G = !P->vec ? POOL_GROUP : 1, units = (planes + G - 1) / G;
    const int64_t chunk = SG_R(pool_chunk)(units, T);
    /* each thread's scratch: OW shares */
    const size_t per = (size_t)(OW > 0 ? OW : 1) * sizeof(sg_real);
    char *scratch = (char *)malloc((size_t)T * per);
    if (!scratch) return SG_ENOMEM;
#pragma omp parallel num_threads(T) if (T > 1)
    {
        sg_real *mine = (sg_real *)(scratch + (size_t)omp_get_thread_num() * per);
#pragma omp for schedule(dynamic, chunk)
        for (int64_t u = 0; u < units; u++) {
            const int64_t p0 = u * G, np = sg_min64(G, planes - p0);
            if (np == POOL_GROUP && G == POOL_GROUP) {
                SG_R(avg_back_group)(q, P, cip, dy + p0 * ohw, ohw, dx + p0 * hw, hw);
                continue;
            }
            for (int64_t p = p0; p < p0 + np; p++) SG_R(avg_back_plane)(q, P, cip, dy + p * ohw, dx + p * hw, mine);
        }
    }
    free(scratch);
    return SG_OK;
}
