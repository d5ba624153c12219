/* Reductions over any set of axes of a contiguous input, and argmax/argmin along one axis.
 *
 * The axes are first merged into alternating groups of reduced and kept axes (a contiguous input makes any run of
 * neighbouring axes with the same role one axis). The innermost group is walked as rows: a reduced innermost group
 * collapses each row to one value, a kept one adds the row element-wise into a row of accumulators. Accumulators are
 * double for float inputs (float16 included) and int64 for integers and bool, so float32 sums of millions of elements
 * stay accurate. The float rows are in reduce_real.h (float32 and float64). Threads split the outermost kept group, or the innermost one, or the chunks of a full reduction.
 */
#include "common.h"

enum { OP_SUM = 0, OP_MEAN = 1, OP_MAX = 2, OP_MIN = 3, OP_PROD = 4 };
#define MAX_GROUPS 64
#define RED_GRAIN 32768 /* elements per thread below which a reduction stays serial */
#define FULL_CHUNK 65536 /* elements per partial result of a full reduction */

typedef struct {
    int ng;
    int64_t size[MAX_GROUPS];
    int64_t xs[MAX_GROUPS]; /* stride in x, elements */
    int64_t as[MAX_GROUPS]; /* stride in the accumulators (0 for a reduced group) */
    int red[MAX_GROUPS];
} layout;

/* -- rows of float data (float32 and float64, float16 converted in blocks) into double accumulators ---------- */
static double fcombine(int op, double a, double v) {
    switch (op) {
    case OP_MAX: return (v > a || v != v || a != a) ? (a != a ? a : v) : a;
    case OP_MIN: return (v < a || v != v || a != a) ? (a != a ? a : v) : a;
    case OP_PROD: return a * v;
    default: return a + v;
    }
}

#define SG_REAL_TEMPLATE "reduce_real.h"
#include "real.h"

/* -- rows of integer data into int64 accumulators --------------------------------------------------------------- */
static int64_t icombine(int op, int64_t a, int64_t v) {
    switch (op) {
    case OP_MAX: return v > a ? v : a;
    case OP_MIN: return v < a ? v : a;
    case OP_PROD: return a * v;
    default: return a + v;
    }
}
#define INT_ROWS(SUF, T)                                                                                            \
    static int64_t irow_##SUF(int op, const T *p, int64_t n) {                                                       \
        int64_t s;                                                                                                   \
        switch (op) {                                                                                                \
        case OP_MAX:                                                                                                 \
            s = INT64_MIN;                                                                                           \
            _Pragma("omp simd reduction(max : s)") for (int64_t i = 0; i < n; i++) s = p[i] > s ? p[i] : s;          \
            return s;                                                                                                \
        case OP_MIN:                                                                                                 \
            s = INT64_MAX;                                                                                           \
            _Pragma("omp simd reduction(min : s)") for (int64_t i = 0; i < n; i++) s = p[i] < s ? p[i] : s;          \
            return s;                                                                                                \
        case OP_PROD:                                                                                                \
            s = 1;                                                                                                   \
            for (int64_t i = 0; i < n; i++) s *= p[i];                                                               \
            return s;                                                                                                \
        default:                                                                                                     \
            s = 0;                                                                                                   \
            _Pragma("omp simd reduction(+ : s)") for (int64_t i = 0; i < n; i++) s += p[i];                          \
            return s;                                                                                                \
        }                                                                                                            \
    }                                                                                                                \
    static void iacc_##SUF(int op, int64_t *a, const T *p, int64_t n, int64_t reps, int64_t stride) {               \
        for (int64_t r = 0; r < reps; r++, p += stride) {                                                            \
            switch (op) {                                                                                            \
            case OP_MAX:                                                                                             \
                _Pragma("omp simd") for (int64_t i = 0; i < n; i++) a[i] = p[i] > a[i] ? p[i] : a[i];                \
                break;                                                                                               \
            case OP_MIN:                                                                                             \
                _Pragma("omp simd") for (int64_t i = 0; i < n; i++) a[i] = p[i] < a[i] ? p[i] : a[i];                \
                break;                                                                                               \
            case OP_PROD:                                                                                            \
                _Pragma("omp simd") for (int64_t i = 0; i < n; i++) a[i] *= p[i];                                    \
                break;                                                                                               \
            default:                                                                                                 \
                _Pragma("omp simd") for (int64_t i = 0; i < n; i++) a[i] += p[i];                                    \
            }                                                                                                        \
        }                                                                                                            \
    }
INT_ROWS(i32, int32_t)
INT_ROWS(i64, int64_t)
INT_ROWS(u8, uint8_t)

/* One row of n elements at element offset `off` of x reduced into acc[0] (reps is 1 then), or `reps` rows of n,
 * `stride` elements apart, accumulated into acc[0..n). */
static void do_row(int op, int dtype, const char *x, int64_t off, int64_t n, void *acc, int reduce, int64_t reps,
                   int64_t stride) {
    switch (dtype) {
    case SG_F32:
        if (reduce)
            *(double *)acc = fcombine(op, *(double *)acc, frow_f32(op, (const float *)x + off, n));
        else
            facc_f32(op, (double *)acc, (const float *)x + off, n, reps, stride);
        return;
    case SG_F64:
        if (reduce)
            *(double *)acc = fcombine(op, *(double *)acc, frow_f64(op, (const double *)x + off, n));
        else
            facc_f64(op, (double *)acc, (const double *)x + off, n, reps, stride);
        return;
    case SG_F16: {
        float t[SG_BLK];
        for (int64_t r = 0; r < reps; r++) {
            const sg_half *p = (const sg_half *)x + off + r * stride;
            for (int64_t s = 0; s < n; s += SG_BLK) {
                const int64_t m = sg_min64(SG_BLK, n - s);
                sg_h2f(p + s, t, m);
                if (reduce)
                    *(double *)acc = fcombine(op, *(double *)acc, frow_f32(op, t, m));
                else
                    facc_f32(op, (double *)acc + s, t, m, 1, 0);
            }
        }
        return;
    }
    case SG_I32:
        if (reduce)
            *(int64_t *)acc = icombine(op, *(int64_t *)acc, irow_i32(op, (const int32_t *)x + off, n));
        else
            iacc_i32(op, (int64_t *)acc, (const int32_t *)x + off, n, reps, stride);
        return;
    case SG_I64:
        if (reduce)
            *(int64_t *)acc = icombine(op, *(int64_t *)acc, irow_i64(op, (const int64_t *)x + off, n));
        else
            iacc_i64(op, (int64_t *)acc, (const int64_t *)x + off, n, reps, stride);
        return;
    default:
        if (reduce)
            *(int64_t *)acc = icombine(op, *(int64_t *)acc, irow_u8(op, (const uint8_t *)x + off, n));
        else
            iacc_u8(op, (int64_t *)acc, (const uint8_t *)x + off, n, reps, stride);
    }
}

/* Every row whose group `split` index lies in [glo, ghi), restricted to [ilo, ihi) of the innermost group. A kept
 * innermost group takes the reduced group around it in one call (do_row's reps): short rows, such as the 8 or 16
 * channels of a blocked layout's pixel, would otherwise cost a walk of the groups each. */
static void run_rows(const layout *L, int op, int dtype, const char *x, char *acc, int accsize, int split,
                     int64_t glo, int64_t ghi, int64_t ilo, int64_t ihi) {
    const int last = L->ng - 1, fold = last >= 1 && !L->red[last]; /* groups alternate: last - 1 is reduced */
    const int top = fold ? last - 2 : last - 1;                       /* the innermost group walked */
    const int64_t reps = fold ? L->size[last - 1] : 1, stride = fold ? L->xs[last - 1] : 0;
    int64_t idx[MAX_GROUPS], lo[MAX_GROUPS], hi[MAX_GROUPS];
    int64_t xoff = ilo, aoff = L->red[last] ? 0 : ilo;
    for (int g = 0; g <= top; g++) {
        lo[g] = g == split ? glo : 0;
        hi[g] = g == split ? ghi : L->size[g];
        if (lo[g] >= hi[g]) return;
        idx[g] = lo[g];
        xoff += lo[g] * L->xs[g];
        aoff += lo[g] * L->as[g];
    }
    for (;;) {
        do_row(op, dtype, x, xoff, ihi - ilo, acc + aoff * accsize, L->red[last], reps, stride);
        int g = top;
        for (; g >= 0; g--) {
            if (++idx[g] < hi[g]) {
                xoff += L->xs[g];
                aoff += L->as[g];
                break;
            }
            xoff -= (hi[g] - 1 - lo[g]) * L->xs[g];
            aoff -= (hi[g] - 1 - lo[g]) * L->as[g];
            idx[g] = lo[g];
        }
        if (g < 0) return;
    }
}

static void store(int op, int in_float, const char *acc, int64_t i, int out_dtype, char *out, int64_t count) {
    if (in_float) {
        double v = ((const double *)acc)[i];
        if (op == OP_MEAN) v = v / (double)count;
        switch (out_dtype) {
        case SG_F32: ((float *)out)[i] = (float)v; break;
        case SG_F16: ((sg_half *)out)[i] = (sg_half)v; break;
        case SG_F64: ((double *)out)[i] = v; break;
        case SG_I32: ((int32_t *)out)[i] = (int32_t)v; break;
        case SG_I64: ((int64_t *)out)[i] = (int64_t)v; break;
        default: ((uint8_t *)out)[i] = v != 0;
        }
    } else {
        int64_t v = ((const int64_t *)acc)[i];
        if (op == OP_MEAN) v = v / count; /* integer mean truncates toward zero (primitives.reduce_mean) */
        switch (out_dtype) {
        case SG_F32: ((float *)out)[i] = (float)v; break;
        case SG_F16: ((sg_half *)out)[i] = (sg_half)v; break;
        case SG_F64: ((double *)out)[i] = (double)v; break;
        case SG_I32: ((int32_t *)out)[i] = (int32_t)v; break;
        case SG_I64: ((int64_t *)out)[i] = v; break;
        default: ((uint8_t *)out)[i] = v != 0;
        }
    }
}

int sg_reduce(int op, int in_dtype, const char *x, int64_t xo, int out_dtype, char *out, int64_t oo, int ndim,
              const int64_t *dims) {
    if (in_dtype < SG_F32 || in_dtype > SG_F64 || out_dtype < SG_F32 || out_dtype > SG_F64) return SG_EDTYPE;
    if (ndim > MAX_GROUPS) return SG_EVALUE;
    const int in_float = sg_is_float(in_dtype);
    x += xo * sg_itemsize(in_dtype);
    out += oo * sg_itemsize(out_dtype);

    /* merge axes into groups; size-1 axes play no part */
    layout L = {0};
    int64_t n_out = 1, count = 1;
    for (int d = 0; d < ndim; d++) {
        const int64_t s = dims[d];
        const int r = dims[ndim + d] != 0;
        if (r) count *= s; else n_out *= s;
        if (s == 1) continue;
        if (L.ng > 0 && L.red[L.ng - 1] == r) {
            L.size[L.ng - 1] *= s;
        } else {
            L.size[L.ng] = s;
            L.red[L.ng] = r;
            L.ng++;
        }
    }
    if (n_out == 0) return SG_OK;
    if (count == 0 && (op == OP_MAX || op == OP_MIN)) return SG_EVALUE;
    if (L.ng == 0) { /* 0-d, or every axis of size 1: one element, reduced on its own */
        L.size[0] = 1;
        L.red[0] = 1;
        L.ng = 1;
    }

    const int accsize = 8;
    char *acc = (char *)malloc((size_t)n_out * accsize);
    if (!acc) return SG_ENOMEM;
    for (int64_t i = 0; i < n_out; i++) {
        if (in_float) {
            double *a = (double *)acc;
            a[i] = op == OP_PROD ? 1.0 : op == OP_MAX ? -INFINITY : op == OP_MIN ? INFINITY : 0.0;
        } else {
            int64_t *a = (int64_t *)acc;
            a[i] = op == OP_PROD ? 1 : op == OP_MAX ? INT64_MIN : op == OP_MIN ? INT64_MAX : 0;
        }
    }

    if (count > 0 && L.ng > 0) {
        int64_t xs = 1, as = 1;
        for (int g = L.ng - 1; g >= 0; g--) {
            L.xs[g] = xs;
            L.as[g] = L.red[g] ? 0 : as;
            xs *= L.size[g];
            if (!L.red[g]) as *= L.size[g];
        }
        const int64_t total = xs;
        const int last = L.ng - 1;
        int split = -1; /* the outermost kept group that is not the innermost one */
        for (int g = 0; g < last; g++)
            if (!L.red[g]) { split = g; break; }

        if (L.ng == 1 && L.red[0]) {
            /* full reduction: fixed-size chunks, handed to threads as they come free, each reduced on its own and
             * the partials combined in chunk order, so the result has the same bits for any thread count */
            const int64_t nc = (total + FULL_CHUNK - 1) / FULL_CHUNK;
            char *part = nc > 1 ? (char *)malloc((size_t)nc * accsize) : NULL;
            if (nc > 1 && !part) {
                free(acc);
                return SG_ENOMEM;
            }
            if (nc == 1) {
                do_row(op, in_dtype, x, 0, total, acc, 1, 1, 0);
            } else {
                const int T = sg_threads_for(total, RED_GRAIN);
#pragma omp parallel for schedule(dynamic, 1) num_threads(T) if (T > 1)
                for (int64_t c = 0; c < nc; c++) {
                    memcpy(part + c * accsize, acc, accsize);
                    do_row(op, in_dtype, x, c * FULL_CHUNK, sg_min64(FULL_CHUNK, total - c * FULL_CHUNK),
                           part + c * accsize, 1, 1, 0);
                }
                for (int64_t c = 0; c < nc; c++) {
                    if (in_float)
                        *(double *)acc = fcombine(op, *(double *)acc, *(double *)(part + c * accsize));
                    else
                        *(int64_t *)acc = icombine(op, *(int64_t *)acc, *(int64_t *)(part + c * accsize));
                }
                free(part);
            }
        } else if (split >= 0) { /* threads own disjoint slices of the outermost kept group */
            const int T = sg_threads_for(total, RED_GRAIN);
            const int64_t extent = L.size[split];
            if (T < 2 || extent < 2) {
                run_rows(&L, op, in_dtype, x, acc, accsize, -1, 0, 0, 0, L.size[last]);
            } else {
#pragma omp parallel num_threads(T)
                {
                    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
                    run_rows(&L, op, in_dtype, x, acc, accsize, split, extent * t / nt, extent * (t + 1) / nt, 0,
                             L.size[last]);
                }
            }
        } else { /* only the innermost group is kept: threads own slices of it */
            const int T = sg_threads_for(total, RED_GRAIN);
            const int64_t inner = L.size[last];
            if (T < 2 || inner < 64) {
                run_rows(&L, op, in_dtype, x, acc, accsize, -1, 0, 0, 0, inner);
            } else {
#pragma omp parallel num_threads(T)
                {
                    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
                    const int64_t lo = sg_chunk(inner, t, nt), hi = sg_chunk(inner, t + 1, nt);
                    if (hi > lo) run_rows(&L, op, in_dtype, x, acc, accsize, -1, 0, 0, lo, hi);
                }
            }
        }
    }
    for (int64_t i = 0; i < n_out; i++) store(op, in_float, acc, i, out_dtype, out, count);
    free(acc);
    return SG_OK;
}

/* -- argmax / argmin: the first extreme along the axis; a NaN counts as the extreme (numpy's rule) ------------------ */
#define ARG_FUNCS(SUF, T, LOAD, CT)                                                                                 \
    static void arg_##SUF(int want_max, const T *x, int64_t len, int64_t inner, int64_t *out, CT *best) {             \
        if (inner == 1) {                                                                                            \
            CT b = LOAD(x[0]);                                                                                       \
            int64_t bi = 0;                                                                                          \
            if (b == b) {                                                                                            \
                for (int64_t r = 1; r < len; r++) {                                                                  \
                    const CT v = LOAD(x[r]);                                                                         \
                    if (v != v) { bi = r; break; }                                                                   \
                    if (want_max ? v > b : v < b) { b = v; bi = r; }                                                 \
                }                                                                                                    \
            }                                                                                                        \
            out[0] = bi;                                                                                             \
            return;                                                                                                  \
        }                                                                                                            \
        for (int64_t i = 0; i < inner; i++) { best[i] = LOAD(x[i]); out[i] = 0; }                                   \
        for (int64_t r = 1; r < len; r++) {                                                                          \
            const T *row = x + r * inner;                                                                            \
            if (want_max) {                                                                                          \
                for (int64_t i = 0; i < inner; i++) {                                                                \
                    const CT v = LOAD(row[i]);                                                                       \
                    if (best[i] == best[i] && (v > best[i] || v != v)) { best[i] = v; out[i] = r; }                 \
                }                                                                                                    \
            } else {                                                                                                 \
                for (int64_t i = 0; i < inner; i++) {                                                                \
                    const CT v = LOAD(row[i]);                                                                       \
                    if (best[i] == best[i] && (v < best[i] || v != v)) { best[i] = v; out[i] = r; }                 \
                }                                                                                                    \
            }                                                                                                        \
        }                                                                                                            \
    }
#define LOAD_PLAIN(v) (v)
#define LOAD_HALF(v) ((float)(v))
ARG_FUNCS(f32, float, LOAD_PLAIN, float)
ARG_FUNCS(f16, sg_half, LOAD_HALF, float)
ARG_FUNCS(f64, double, LOAD_PLAIN, double)
ARG_FUNCS(i32, int32_t, LOAD_PLAIN, int32_t)
ARG_FUNCS(i64, int64_t, LOAD_PLAIN, int64_t)
ARG_FUNCS(u8, uint8_t, LOAD_PLAIN, int)

int sg_argreduce(int want_max, int dtype, const char *x, int64_t xo, char *out, int64_t oo, int64_t outer,
                 int64_t len, int64_t inner) {
    if (dtype < SG_F32 || dtype > SG_F64) return SG_EDTYPE;
    if (outer == 0 || inner == 0) return SG_OK;
    if (len == 0) return SG_EVALUE;
    x += xo * sg_itemsize(dtype);
    int64_t *o = (int64_t *)out + oo;
    const int T = sg_threads_for(outer * len * inner, RED_GRAIN);
    int err = SG_OK;
#pragma omp parallel num_threads(T) if (T > 1)
    {
        int64_t *best = (int64_t *)malloc((size_t)(inner > 1 ? inner : 1) * sizeof(int64_t));
        if (!best) {
#pragma omp atomic write
            err = SG_ENOMEM;
        } else {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < outer; r++) {
                const int64_t base = r * len * inner;
                int64_t *orow = o + r * inner;
                switch (dtype) {
                case SG_F32: arg_f32(want_max, (const float *)x + base, len, inner, orow, (float *)best); break;
                case SG_F16: arg_f16(want_max, (const sg_half *)x + base, len, inner, orow, (float *)best); break;
                case SG_F64: arg_f64(want_max, (const double *)x + base, len, inner, orow, (double *)best); break;
                case SG_I32: arg_i32(want_max, (const int32_t *)x + base, len, inner, orow, (int32_t *)best); break;
                case SG_I64: arg_i64(want_max, (const int64_t *)x + base, len, inner, orow, best); break;
                default: arg_u8(want_max, (const uint8_t *)x + base, len, inner, orow, (int *)best);
                }
            }
            free(best);
        }
    }
    return err;
}
