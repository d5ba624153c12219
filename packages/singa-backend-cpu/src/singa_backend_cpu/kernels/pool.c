/* 2-D max and average pooling (NCHW) and their gradients; planes (or groups of small ones) are the tasks spread over
 * the threads. The kernels are in pool_real.h (float32 and float64); float16 goes through float32 copies. */
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

/* Everything a call needs about its windows, computed once: the per-axis taps, and along the width the output columns
 * [A, B) whose every tap lies inside [0, W) (the interior, where the row kernels of pool_real.h run over contiguous
 * output columns with no bounds checks) and the output columns [ja[j], jb[j]) whose tap j lies inside [0, W). */
typedef struct {
    taps tr, tc;
    int64_t A, B, *ja, *jb;
    int vec;        /* interior wide enough for the row kernels; else every window is scanned on its own */
    int64_t RA, RB; /* output rows whose every tap row lies inside [0, H) */
    int flat;       /* stride 1 and OW == W: the interior rows are one run for the row kernels (pool_real.h) */
    /* Lanes (pool_real.h: lanes_unit): planes of at most POOL_LANES_MAX padded positions (PH x PW covers every window
     * from (-pt, -pl)) go LN at a time (64 bytes of values), one plane a lane; tap k at toff[k] from its output. */
    int lanes;
    int64_t PH, PW, LN;
    /* Phase copies (pool_real.h: phase_unit): the input, padding filled in, split by row position mod sh and column
     * position mod sw into phase blocks of QR rows x QW columns, in which output (r, ow) of a unit is position
     * r * QW + ow and its tap k position r * QW + ow + toff[k]: every window lies inside, every tap is one run. A unit
     * is PG whole planes (RC == OH) or RC output rows of one plane; its blocks hold QR = RC + exth rows a plane. */
    int phase;
    int64_t QW, QR, RC, PG, BS, exth, nph;
    int64_t *toff;              /* per tap k = i * kw + j: its offset in the blocks */
    int64_t *pa, *pb, *c0, *c1;  /* per block used: its row and column phase, its columns inside the input */
    double *cpad, *cin; /* per output column: taps inside the padding, inside the input (the divisors' factors) */
} pplan;

/* Interior columns below which the row kernels' per-tap loop set-up costs more than they save. */
#define POOL_VEC_MIN 4
/* Outputs per pass of the row kernels over a flat run (pool_real.h): their scratch stays in the L1 cache. */
#define POOL_FLAT_CHUNK 1024
/* Small planes computed together (pool_real.h: max_group, avg_group). */
#define POOL_GROUP 4
/* Padded planes of at most this many positions go through the lanes: a vector's width of them is 32 KiB. */
#define POOL_LANES_MAX 512
/* Elements of phase blocks per unit (phase_unit): about this many, so that a unit's blocks stay in the L1/L2 cache. */
#define POOL_PHASE_CHUNK 4096
/* Phase copies are taken when their outputs (including the columns and rows computed in vain) are at most this many
 * times the real ones: not for windows nearly as large as the plane, whose copies would be mostly waste. */
#define POOL_PHASE_WASTE 4
/* Stride-1 planes larger than this go through the flat runs of max_plane / avg_plane instead (measured faster). */
#define POOL_PHASE_FLAT 512
/* Strides up to this: a larger one leaves most of the sh * sw phases unused. */
#define POOL_PHASE_STRIDE 4

static void plan_free(pplan *p) {
    free(p->tr.lo);
    free(p->tc.lo);
    free(p->ja);
    free(p->toff);
    free(p->cpad);
}

/* The phase copies of pplan, where they pay: every window with an element inside (a max over padding alone would be
 * -inf), strides up to POOL_PHASE_STRIDE, rows of at least POOL_VEC_MIN (a row's copy has a set-up cost), little
 * waste. */
static int phase_open(const pgeom *q, pplan *p, int empty) {
    const int64_t kk = q->kh * q->kw;
    p->phase = 0;
    p->exth = (q->kh - 1) * q->dh / q->sh;
    p->QW = q->OW + (q->kw - 1) * q->dw / q->sw;
    const int64_t plane_rows = q->OH + p->exth;
    if (empty || q->sh > POOL_PHASE_STRIDE || q->sw > POOL_PHASE_STRIDE || p->QW < POOL_VEC_MIN ||
        plane_rows * p->QW > POOL_PHASE_WASTE * q->OH * q->OW)
        return SG_OK;
    p->toff = (int64_t *)malloc((size_t)(kk + 4 * q->sh * q->sw) * sizeof(int64_t));
    if (!p->toff) {
        plan_free(p);
        return SG_ENOMEM;
    }
    p->pa = p->toff + kk;
    p->pb = p->pa + q->sh * q->sw;
    p->c0 = p->pb + q->sh * q->sw;
    p->c1 = p->c0 + q->sh * q->sw;
    /* the phases some tap reads, in row-major order: each a block */
    int used[POOL_PHASE_STRIDE * POOL_PHASE_STRIDE] = {0};
    int64_t slot[POOL_PHASE_STRIDE * POOL_PHASE_STRIDE];
    for (int64_t i = 0; i < q->kh; i++)
        for (int64_t j = 0; j < q->kw; j++) used[i * q->dh % q->sh * q->sw + j * q->dw % q->sw] = 1;
    p->nph = 0;
    for (int64_t a = 0; a < q->sh; a++)
        for (int64_t b = 0; b < q->sw; b++) {
            if (!used[a * q->sw + b]) continue;
            p->pa[p->nph] = a;
            p->pb[p->nph] = b;
            /* the block's columns c whose element c * sw + b - pl lies inside [0, W): [c0, c1) */
            const int64_t c0 = sg_min64(p->QW, q->pl > b ? (q->pl - b + q->sw - 1) / q->sw : 0);
            p->c0[p->nph] = c0;
            const int64_t end = q->W + q->pl > b ? (q->W + q->pl - b + q->sw - 1) / q->sw : 0;
            p->c1[p->nph] = sg_max64(c0, sg_min64(p->QW, end));
            slot[a * q->sw + b] = p->nph++;
        }
    if (q->sh == 1 && q->sw == 1 && plane_rows * p->QW > POOL_PHASE_FLAT) /* the flat runs read x where it is */
        return SG_OK;
    const int64_t plane = p->nph * plane_rows * p->QW;
    /* windows that do not overlap read each element once: the copy pays only where it lets small planes go several
     * at a time (measured: 2x2/2 on 28x28 and 14x14 planes faster through copies, on 56x56 and 112x112 slower) */
    if (p->nph == kk && 2 * plane > POOL_PHASE_CHUNK)
        return SG_OK;
    if (plane <= POOL_PHASE_CHUNK) { /* whole planes, several a unit */
        p->PG = sg_max64(1, POOL_PHASE_CHUNK / plane);
        p->RC = q->OH;
    } else {
        p->PG = 1;
        p->RC = sg_min64(q->OH, sg_max64(1, POOL_PHASE_CHUNK / (p->nph * p->QW) - p->exth));
    }
    p->QR = p->RC + p->exth;
    p->BS = p->PG * p->QR * p->QW;
    for (int64_t i = 0; i < q->kh; i++)
        for (int64_t j = 0; j < q->kw; j++) {
            const int64_t k = i * q->kw + j, a = i * q->dh % q->sh, b = j * q->dw % q->sw;
            p->toff[k] = slot[a * q->sw + b] * p->BS + i * q->dh / q->sh * p->QW + j * q->dw / q->sw;
        }
    p->phase = 1;
    return SG_OK;
}

/* The plan of a call on values of `size` bytes. */
static int plan_open(const pgeom *q, pplan *p, size_t size) {
    p->tr.lo = p->tc.lo = NULL;
    p->toff = NULL;
    p->cpad = NULL;
    p->ja = (int64_t *)malloc((size_t)(2 * q->kw + 1) * sizeof(int64_t));
    if (!p->ja || taps_open(&p->tr, q->OH, q->H, q->kh, q->sh, q->pt, q->pb, q->dh) ||
        taps_open(&p->tc, q->OW, q->W, q->kw, q->sw, q->pl, q->pr, q->dw)) {
        plan_free(p);
        return SG_ENOMEM;
    }
    p->jb = p->ja + q->kw;
    p->A = 0;
    p->B = q->OW;
    for (int64_t j = 0; j < q->kw; j++) { /* tap j's column increases with ow: its inside columns are one run */
        int64_t a = -1, b = -1;
        for (int64_t ow = 0; ow < q->OW; ow++) {
            const int64_t w = ow * q->sw - q->pl + j * q->dw;
            if (w >= 0 && w < q->W) {
                if (a < 0) a = ow;
                b = ow + 1;
            }
        }
        p->ja[j] = a < 0 ? 0 : a;
        p->jb[j] = a < 0 ? 0 : b;
        p->A = sg_max64(p->A, p->ja[j]);
        p->B = sg_min64(p->B, p->jb[j]);
    }
    if (p->B < p->A) p->B = p->A;
    /* the row kernels keep a tap's offset from its window's corner in an int32 for float32 */
    const int small = (q->kh - 1) * q->dh * q->W + (q->kw - 1) * q->dw < INT32_MAX;
    p->vec = small && p->B - p->A >= POOL_VEC_MIN;
    p->RA = 0;
    p->RB = -1;
    for (int64_t oh = 0; oh < q->OH; oh++) /* one run, as the interior columns */
        if (small && p->tr.lo[oh] == 0 && p->tr.hi[oh] == q->kh) {
            if (p->RB < 0) p->RA = oh;
            p->RB = oh + 1;
        }
    if (p->RB < p->RA) p->RB = p->RA;
    p->flat = p->vec && q->sh == 1 && q->sw == 1 && q->OW == q->W && p->RB - p->RA >= 2;
    int empty = 0;
    for (int64_t oh = 0; oh < q->OH; oh++) empty |= p->tr.lo[oh] >= p->tr.hi[oh];
    for (int64_t ow = 0; ow < q->OW; ow++) empty |= p->tc.lo[ow] >= p->tc.hi[ow];
    p->cpad = (double *)malloc((size_t)(2 * q->OW + 1) * sizeof(double));
    if (!p->cpad) {
        plan_free(p);
        return SG_ENOMEM;
    }
    p->cin = p->cpad + q->OW;
    for (int64_t ow = 0; ow < q->OW; ow++) {
        p->cpad[ow] = (double)p->tc.padded[ow];
        p->cin[ow] = (double)(p->tc.hi[ow] - p->tc.lo[ow]);
    }
    /* small planes: several side by side in vector lanes (pool_real.h: lanes_unit) */
    p->PH = (q->OH - 1) * q->sh + (q->kh - 1) * q->dh + 1;
    p->PW = (q->OW - 1) * q->sw + (q->kw - 1) * q->dw + 1;
    p->lanes = p->PH * p->PW <= POOL_LANES_MAX && small;
    p->phase = 0;
    if (!p->lanes) return phase_open(q, p, empty);
    p->LN = (int64_t)(64 / size);
    p->toff = (int64_t *)malloc((size_t)(q->kh * q->kw) * sizeof(int64_t));
    if (!p->toff) {
        plan_free(p);
        return SG_ENOMEM;
    }
    for (int64_t i = 0; i < q->kh; i++)
        for (int64_t j = 0; j < q->kw; j++) p->toff[i * q->kw + j] = (i * q->dh * p->PW + j * q->dw) * p->LN;
    return SG_OK;
}

/* The max row kernels' winning taps, as offsets from the window's corner: as wide as the data, so that a vector of
 * them and one of values have the same number of lanes. */
typedef int32_t ptap_f32;
typedef int64_t ptap_f64;
/* The bits of a value, for selects the compiler keeps free of branches. */
typedef uint32_t pbits_f32;
typedef uint64_t pbits_f64;

/* Row kernels are written for a stride SW; these instantiate them for strides 1 and 2 as constants, so that the
 * compiler vectorises the strided loads, and for any other stride as a variable. */
#define POOL_BY_STRIDE(sw, CALL)   \
    do {                           \
        if ((sw) == 1) {           \
            const int64_t SW = 1;  \
            CALL;                  \
        } else if ((sw) == 2) {    \
            const int64_t SW = 2;  \
            CALL;                  \
        } else {                   \
            const int64_t SW = sw; \
            CALL;                  \
        }                          \
    } while (0)

#define POOL_INLINE static inline __attribute__((always_inline))

#if defined(__AVX512F__)
/* d[o] = s[2 * o] for o < n in float32, 16 at a time with masks for the last ones: pooling's rows are short (13 to
 * 112), and the compiler's loop would take most of them one element at a time. Reads no element past s[2n - 2]. */
static inline void pool_gather2_f32(float *restrict d, const float *restrict s, int64_t n) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    for (int64_t o = 0; o < n; o += 16) {
        const int64_t m = sg_min64(16, n - o), need = 2 * m - 1; /* elements read: s[2o .. 2o + need) */
        const __mmask16 lo = need >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << need) - 1);
        const __mmask16 hi = need > 16 ? (__mmask16)((1u << (need - 16)) - 1) : 0;
        const __m512 a = _mm512_maskz_loadu_ps(lo, s + 2 * o), b = _mm512_maskz_loadu_ps(hi, s + 2 * o + 16);
        _mm512_mask_storeu_ps(d + o, (__mmask16)((1u << m) - 1), _mm512_permutex2var_ps(a, even, b));
    }
}
#endif

#if defined(__AVX512F__)
/* The in-place stride-2 max pooling of float32 rows (pool_real.h: max_stride2), 16 outputs a vector. */

/* One more tap v of 16 windows, at offset `off` from their corners, under max_window's rule: v is taken when
 * !(v <= best) and best is not a NaN (the first maximum wins, a NaN beats everything and the first NaN stays). */
static inline void pool_take16(__m512 *best, __m512i *t, __m512 v, int64_t off) {
    const __mmask16 take = _mm512_cmp_ps_mask(v, *best, _CMP_NLE_UQ) & _mm512_cmp_ps_mask(*best, *best, _CMP_EQ_OQ);
    *best = _mm512_mask_mov_ps(*best, take, v);
    *t = _mm512_mask_mov_epi32(*t, take, _mm512_set1_epi32((int)off));
}

/* Outputs o .. o + m of a row: the maxima, and (ix given) their flat indices, the corner of output o + l being at
 * at + 2 (o + l) and t the winning taps' offsets from the corners. */
static inline void pool_store16(float *restrict y, int64_t *restrict ix, int64_t o, int64_t m, __m512 best,
                                __m512i t, int64_t at) {
    _mm512_mask_storeu_ps(y + o, (__mmask16)((1u << m) - 1), best);
    if (!ix) return;
    const __m512i base = _mm512_add_epi64(_mm512_set1_epi64(at + 2 * o), _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14));
    const __m512i i0 = _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(t)), base);
    const __m512i i1 = _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(t, 1)),
                                        _mm512_add_epi64(base, _mm512_set1_epi64(16)));
    _mm512_mask_storeu_epi64(ix + o, (__mmask8)(m >= 8 ? 0xFF : (1u << m) - 1), i0);
    if (m > 8) _mm512_mask_storeu_epi64(ix + o + 8, (__mmask8)((1u << (m - 8)) - 1), i1);
}

/* 2x2 windows: rows r0 and r1 of the input, n outputs, 16 at a time from the even and odd columns of one pair of
 * loads a row (permutes), with masks for the last ones; reads no element past r0[2n - 1]. `at` is r0[0]'s flat index
 * in the plane, W the row length. */
static inline void pool_pairs_f32(const float *restrict r0, const float *restrict r1, int64_t n, float *restrict y,
                                  int64_t *restrict ix, int64_t at, int64_t W) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for (int64_t o = 0; o < n; o += 16) {
        const int64_t m = sg_min64(16, n - o), need = 2 * m;
        const __mmask16 lo = need >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << need) - 1);
        const __mmask16 hi = need > 16 ? (__mmask16)((1u << (need - 16)) - 1) : 0;
        const __m512 a0 = _mm512_maskz_loadu_ps(lo, r0 + 2 * o), b0 = _mm512_maskz_loadu_ps(hi, r0 + 2 * o + 16);
        const __m512 a1 = _mm512_maskz_loadu_ps(lo, r1 + 2 * o), b1 = _mm512_maskz_loadu_ps(hi, r1 + 2 * o + 16);
        __m512 best = _mm512_permutex2var_ps(a0, even, b0);
        __m512i t = _mm512_setzero_si512();
        pool_take16(&best, &t, _mm512_permutex2var_ps(a0, odd, b0), 1);
        pool_take16(&best, &t, _mm512_permutex2var_ps(a1, even, b1), W);
        pool_take16(&best, &t, _mm512_permutex2var_ps(a1, odd, b1), W + 1);
        pool_store16(y, ix, o, m, best, t, at);
    }
}

/* kh x kw windows whose corners are at input row r and columns 2 ow (flat index `at` for the first output), tap rows
 * [i0, i1) inside the input (the others in the padding above or below), every tap column inside: ri is tap row i0;
 * n outputs, 16 at a time, tap (i, j) of 16 outputs every other element of row i from column 2o + j (two masked
 * loads and a permute), so no load reaches past the last tap. */
static inline void pool_stride2_f32(const float *ri, int64_t W, int64_t i0, int64_t i1, int64_t kw, int64_t n,
                                    float *restrict y, int64_t *restrict ix, int64_t at) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    int64_t o = 0;
    /* 32 outputs at a time while whole: two independent chains of compares hide each other's latency */
    for (; o + 32 <= n; o += 32) {
        __m512 best0 = _mm512_setzero_ps(), best1 = _mm512_setzero_ps();
        __m512i t0 = _mm512_set1_epi32((int)(i0 * W)), t1 = t0;
        for (int64_t i = i0; i < i1; i++) {
            for (int64_t j = 0; j < kw; j++) {
                const float *s = ri + (i - i0) * W + 2 * o + j;
                const __m512 v0 = _mm512_permutex2var_ps(_mm512_loadu_ps(s), even, _mm512_loadu_ps(s + 16));
                const __m512 v1 = _mm512_permutex2var_ps(_mm512_loadu_ps(s + 32), even,
                                                         _mm512_maskz_loadu_ps((__mmask16)0x7FFF, s + 48));
                if (i == i0 && j == 0) {
                    best0 = v0;
                    best1 = v1;
                } else {
                    pool_take16(&best0, &t0, v0, i * W + j);
                    pool_take16(&best1, &t1, v1, i * W + j);
                }
            }
        }
        pool_store16(y, ix, o, 16, best0, t0, at);
        pool_store16(y, ix, o + 16, 16, best1, t1, at);
    }
    for (; o < n; o += 16) {
        const int64_t m = sg_min64(16, n - o), need = 2 * m - 1; /* elements of a tap's run: s[0 .. need) */
        const __mmask16 lo = need >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << need) - 1);
        const __mmask16 hi = need > 16 ? (__mmask16)((1u << (need - 16)) - 1) : 0;
        __m512 best = _mm512_setzero_ps();
        __m512i t = _mm512_set1_epi32((int)(i0 * W)); /* the first tap's offset, until another wins */
        for (int64_t i = i0; i < i1; i++) {
            for (int64_t j = 0; j < kw; j++) {
                const float *s = ri + (i - i0) * W + 2 * o + j;
                const __m512 v = _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(lo, s), even,
                                                        _mm512_maskz_loadu_ps(hi, s + 16));
                if (i == i0 && j == 0)
                    best = v;
                else
                    pool_take16(&best, &t, v, i * W + j);
            }
        }
        pool_store16(y, ix, o, m, best, t, at);
    }
}
#endif

#if defined(__AVX2__) && !defined(__AVX512F__)
/* The same in-place stride-2 max pooling with AVX2, 8 outputs a vector: the even (or odd) elements of 16 consecutive
 * ones from two loads, a shuffle and a lane permute; masked loads (which never touch the lanes they leave out) for the
 * last outputs of a row. Masked loads and stores are for row ends only: on AMD Zen 3 a plane that does not fit the
 * caches (VGG's 64 x 224 x 224) read through masked loads took 3.5x the time of plain ones. */
#define POOL_STRIDE2 8

/* lanes [0, k) of 8 (k may be <= 0 or >= 8) */
static inline __m256i pool_lanes8(int64_t k) {
    const int32_t kk = (int32_t)(k < 0 ? 0 : k > 8 ? 8 : k);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(kk), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* elements 0, 2, .., 14 (odd: 1, 3, .., 15) of the 16 that a and b hold */
static inline __m256 pool_even8(__m256 a, __m256 b) {
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))),
                                                  _MM_SHUFFLE(3, 1, 2, 0)));
}
static inline __m256 pool_odd8(__m256 a, __m256 b) {
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))),
                                                  _MM_SHUFFLE(3, 1, 2, 0)));
}

/* pool_take16's rule for 8 windows; the winners' offsets only where `track` (indices asked for) */
static inline __attribute__((always_inline)) void pool_take8(__m256 *best, __m256i *t, __m256 v, int64_t off,
                                                             int track) {
    const __m256 take = _mm256_and_ps(_mm256_cmp_ps(v, *best, _CMP_NLE_UQ), _mm256_cmp_ps(*best, *best, _CMP_EQ_OQ));
    *best = _mm256_blendv_ps(*best, v, take);
    if (track)
        *t = _mm256_castps_si256(
            _mm256_blendv_ps(_mm256_castsi256_ps(*t), _mm256_castsi256_ps(_mm256_set1_epi32((int)off)), take));
}

/* `need` elements from s (plain loads for a whole vector, masked ones, which never touch the other lanes, else) */
static inline __m256 pool_load8(const float *s, int64_t need) {
    return need >= 8 ? _mm256_loadu_ps(s) : _mm256_maskload_ps(s, pool_lanes8(need));
}

/* pool_store16 for outputs o .. o + m (m <= 8) */
static inline void pool_store8(float *restrict y, int64_t *restrict ix, int64_t o, int64_t m, __m256 best, __m256i t,
                               int64_t at) {
    if (m >= 8)
        _mm256_storeu_ps(y + o, best);
    else
        _mm256_maskstore_ps(y + o, pool_lanes8(m), best);
    if (!ix) return;
    const __m256i base = _mm256_add_epi64(_mm256_set1_epi64x(at + 2 * o), _mm256_setr_epi64x(0, 2, 4, 6));
    const __m256i i0 = _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(t)), base);
    const __m256i i1 = _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_extracti128_si256(t, 1)),
                                        _mm256_add_epi64(base, _mm256_set1_epi64x(8)));
    if (m >= 8) {
        _mm256_storeu_si256((__m256i *)(ix + o), i0);
        _mm256_storeu_si256((__m256i *)(ix + o + 4), i1);
        return;
    }
    const __m256i idx4 = _mm256_setr_epi64x(0, 1, 2, 3);
    _mm256_maskstore_epi64((long long *)(ix + o), _mm256_cmpgt_epi64(_mm256_set1_epi64x(m), idx4), i0);
    if (m > 4)
        _mm256_maskstore_epi64((long long *)(ix + o + 4), _mm256_cmpgt_epi64(_mm256_set1_epi64x(m - 4), idx4), i1);
}

/* pool_pairs_f32 with AVX2 */
static inline __attribute__((always_inline)) void pool_pairs_f32(const float *restrict r0, const float *restrict r1, int64_t n, float *restrict y,
                                  int64_t *restrict ix, int64_t at, int64_t W) {
    for (int64_t o = 0; o < n; o += 8) {
        const int64_t m = sg_min64(8, n - o), need = 2 * m;
        const __m256 a0 = pool_load8(r0 + 2 * o, need), b0 = pool_load8(r0 + 2 * o + 8, need - 8);
        const __m256 a1 = pool_load8(r1 + 2 * o, need), b1 = pool_load8(r1 + 2 * o + 8, need - 8);
        __m256 best = pool_even8(a0, b0);
        __m256i t = _mm256_setzero_si256();
        pool_take8(&best, &t, pool_odd8(a0, b0), 1, ix != NULL);
        pool_take8(&best, &t, pool_even8(a1, b1), W, ix != NULL);
        pool_take8(&best, &t, pool_odd8(a1, b1), W + 1, ix != NULL);
        pool_store8(y, ix, o, m, best, t, at);
    }
}

/* pool_stride2_f32 with AVX2: tap (i, j) of 8 outputs is every other element of row i from column 2o + j. Inlined
 * where called, so that a call without indices (ix NULL) drops their bookkeeping. */
static inline __attribute__((always_inline)) void pool_stride2_f32(const float *ri, int64_t W, int64_t i0, int64_t i1, int64_t kw, int64_t n,
                                    float *restrict y, int64_t *restrict ix, int64_t at) {
    int64_t o = 0;
    /* 16 outputs at a time while whole: two independent chains of compares hide each other's latency. A tap's run
     * is 31 elements; the 32nd, read by the plain loads, belongs to the row's next outputs (o + 16 < n) */
    for (; o + 16 < n; o += 16) {
        __m256 best0 = _mm256_setzero_ps(), best1 = _mm256_setzero_ps();
        __m256i t0 = _mm256_set1_epi32((int)(i0 * W)), t1 = t0;
        for (int64_t i = i0; i < i1; i++) {
            for (int64_t j = 0; j < kw; j++) {
                const float *s = ri + (i - i0) * W + 2 * o + j;
                const __m256 v0 = pool_even8(_mm256_loadu_ps(s), _mm256_loadu_ps(s + 8));
                const __m256 v1 = pool_even8(_mm256_loadu_ps(s + 16), _mm256_loadu_ps(s + 24));
                if (i == i0 && j == 0) {
                    best0 = v0;
                    best1 = v1;
                } else {
                    pool_take8(&best0, &t0, v0, i * W + j, ix != NULL);
                    pool_take8(&best1, &t1, v1, i * W + j, ix != NULL);
                }
            }
        }
        pool_store8(y, ix, o, 8, best0, t0, at);
        pool_store8(y, ix, o + 8, 8, best1, t1, at);
    }
    for (; o < n; o += 8) {
        const int64_t m = sg_min64(8, n - o), need = 2 * m - 1; /* elements of a tap's run: s[0 .. need) */
        __m256 best = _mm256_setzero_ps();
        __m256i t = _mm256_set1_epi32((int)(i0 * W)); /* the first tap's offset, until another wins */
        for (int64_t i = i0; i < i1; i++) {
            for (int64_t j = 0; j < kw; j++) {
                const float *s = ri + (i - i0) * W + 2 * o + j;
                const __m256 v = pool_even8(pool_load8(s, need), pool_load8(s + 8, need - 8));
                if (i == i0 && j == 0)
                    best = v;
                else
                    pool_take8(&best, &t, v, i * W + j, ix != NULL);
            }
        }
        pool_store8(y, ix, o, m, best, t, at);
    }
}
#elif defined(__AVX512F__)
#define POOL_STRIDE2 16
#endif

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
    pplan pl;
    if (plan_open(&q, &pl, dtype == SG_F64 ? sizeof(double) : sizeof(float))) return SG_ENOMEM;
    int64_t *ip = idx ? (int64_t *)idx + io : NULL;
    if (dtype == SG_F64) {
        err = pool_forward_f64(&q, mode, count_include_pad, (const double *)x + xo, (double *)y + yo, ip, &pl);
    } else {
        int ox;
        float *fx = sg_as_f32(x + xo * isz, dtype, q.N * q.C * q.H * q.W, &ox);
        float *fy = dtype == SG_F32 ? (float *)(y + yo * isz) : (float *)malloc((size_t)ny * sizeof(float));
        if (!fx || !fy)
            err = SG_ENOMEM;
        else
            err = pool_forward_f32(&q, mode, count_include_pad, fx, fy, ip, &pl);
        if (dtype == SG_F16 && fy) {
            if (!err) sg_f2h(fy, (sg_half *)(y + yo * isz), ny);
            free(fy);
        }
        if (ox) free(fx);
    }
    plan_free(&pl);
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
    pplan pl;
    if (plan_open(&q, &pl, dtype == SG_F64 ? sizeof(double) : sizeof(float))) return SG_ENOMEM;
    const int64_t *ip = idx ? (const int64_t *)idx + io : NULL;
    if (dtype == SG_F64) {
        err = pool_backward_f64(&q, mode, count_include_pad, (const double *)dy + dyo,
                                need_x ? (const double *)x + xo : NULL, ip, (double *)dx + dxo, &pl);
    } else {
        int ody, ox = 0;
        float *fdy = sg_as_f32(dy + dyo * isz, dtype, q.N * q.C * q.OH * q.OW, &ody);
        float *fx = need_x ? sg_as_f32(x + xo * isz, dtype, nx, &ox) : NULL;
        float *fdx = dtype == SG_F32 ? (float *)(dx + dxo * isz) : (float *)malloc((size_t)nx * sizeof(float));
        if (!fdy || (need_x && !fx) || !fdx)
            err = SG_ENOMEM;
        else
            err = pool_backward_f32(&q, mode, count_include_pad, fdy, fx, ip, fdx, &pl);
        if (dtype == SG_F16 && fdx) {
            if (!err) sg_f2h(fdx, (sg_half *)(dx + dxo * isz), nx);
            free(fdx);
        }
        if (ody) free(fdy);
        if (ox) free(fx);
    }
    plan_free(&pl);
    return err;
}
