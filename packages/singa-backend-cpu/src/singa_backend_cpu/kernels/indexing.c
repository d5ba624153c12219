/* gather / scatter_add along one axis (x seen as (outer, axis_len, inner)) and N-d padding. gather and pad only move
 * elements, so they work per item size; scatter_add adds in the element's type. */
#include "common.h"

static int64_t index_at(int idt, const char *idx, int64_t j) {
    return idt == SG_I32 ? ((const int32_t *)idx)[j] : ((const int64_t *)idx)[j];
}

/* every index within [-len, len), else *bad = the first offender */
static int check_indices(int idt, const char *idx, int64_t count, int64_t len, int64_t *bad) {
    if (idt != SG_I32 && idt != SG_I64) return SG_EDTYPE;
    for (int64_t j = 0; j < count; j++) {
        const int64_t v = index_at(idt, idx, j);
        if (v < -len || v >= len) {
            *bad = v;
            return SG_EINDEX;
        }
    }
    return SG_OK;
}

/* copy one element of `size` bytes */
static inline void put(char *d, const char *s, int size) {
    switch (size) {
    case 1: *d = *s; break;
    case 2: memcpy(d, s, 2); break;
    case 4: memcpy(d, s, 4); break;
    case 8: memcpy(d, s, 8); break;
    default: memcpy(d, s, (size_t)size);
    }
}

int sg_gather(int itemsize, const char *x, int64_t xo, int idt, const char *idx, int64_t io, char *out, int64_t oo,
              int64_t outer, int64_t axis_len, int64_t inner, int64_t count, int64_t *bad) {
    const int isz_idx = idt == SG_I32 ? 4 : 8;
    idx += io * isz_idx;
    const int err = check_indices(idt, idx, count, axis_len, bad);
    if (err) return err;
    x += xo * itemsize;
    out += oo * itemsize;
    const int64_t rows = outer * count, row_bytes = inner * itemsize;
    const int T = sg_threads_for(rows * inner, 1 << 15);
#pragma omp parallel for schedule(static) num_threads(T) if (T > 1)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r / count, j = r % count;
        int64_t a = index_at(idt, idx, j);
        if (a < 0) a += axis_len;
        const char *src = x + (o * axis_len + a) * row_bytes;
        char *dst = out + r * row_bytes;
        if (inner == 1)
            put(dst, src, itemsize);
        else
            memcpy(dst, src, (size_t)row_bytes);
    }
    return SG_OK;
}

#define SCATTER(T, LOAD, STORE)                                                                                     \
    do {                                                                                                            \
        T *o_ = (T *)out;                                                                                           \
        const T *u_ = (const T *)upd;                                                                               \
        _Pragma("omp parallel for schedule(static) num_threads(nt) if (nt > 1)") for (int64_t p = 0; p < parts;    \
                                                                                    p++) {                          \
            const int64_t o = by_outer ? p : 0, o_end = by_outer ? p + 1 : outer;                                   \
            const int64_t i0 = by_outer ? 0 : sg_chunk(inner, (int)p, (int)parts);                                  \
            const int64_t i1 = by_outer ? inner : sg_chunk(inner, (int)p + 1, (int)parts);                          \
            for (int64_t oo_ = o; oo_ < o_end; oo_++)                                                               \
                for (int64_t j = 0; j < count; j++) {                                                               \
                    int64_t a = index_at(idt, idx, j);                                                              \
                    if (a < 0) a += axis_len;                                                                       \
                    T *d = o_ + (oo_ * axis_len + a) * inner;                                                       \
                    const T *s = u_ + (oo_ * count + j) * inner;                                                    \
                    for (int64_t i = i0; i < i1; i++) d[i] = STORE(LOAD(d[i]) + LOAD(s[i]));                        \
                }                                                                                                   \
        }                                                                                                           \
    } while (0)
#define ID(v) (v)
#define HALF_LOAD(v) ((float)(v))
#define HALF_STORE(v) ((sg_half)(v))

int sg_scatter_add(int dtype, char *out, int64_t oo, int idt, const char *idx, int64_t io, const char *upd,
                   int64_t uo, int64_t outer, int64_t axis_len, int64_t inner, int64_t count, int64_t *bad) {
    const int isz_idx = idt == SG_I32 ? 4 : 8;
    idx += io * isz_idx;
    const int err = check_indices(idt, idx, count, axis_len, bad);
    if (err) return err;
    const int isz = sg_itemsize(dtype);
    out += oo * isz;
    upd += uo * isz;
    /* threads own whole outer slices, or slices of the inner axis: never the same output element */
    const int T = sg_threads_for(outer * count * inner, 1 << 15);
    const int by_outer = outer >= T;
    const int64_t parts = by_outer ? outer : T;
    const int nt = T;
    switch (dtype) {
    case SG_F32: SCATTER(float, ID, ID); break;
    case SG_F16: SCATTER(sg_half, HALF_LOAD, HALF_STORE); break;
    case SG_F64: SCATTER(double, ID, ID); break;
    case SG_I32: SCATTER(int32_t, ID, ID); break;
    case SG_I64: SCATTER(int64_t, ID, ID); break;
    default: return SG_EDTYPE;
    }
    return SG_OK;
}

enum { PAD_CONSTANT = 0, PAD_REFLECT = 1, PAD_EDGE = 2 };

/* source index of output position o along an axis of length n padded by `before`, or -1 for the constant */
static int64_t pad_source(int mode, int64_t o, int64_t n, int64_t before) {
    int64_t i = o - before;
    if (i >= 0 && i < n) return i;
    if (mode == PAD_CONSTANT) return -1;
    if (mode == PAD_EDGE) return i < 0 ? 0 : n - 1;
    if (n == 1) return 0;
    const int64_t period = 2 * (n - 1); /* reflect without repeating the edge, as often as the padding needs */
    i %= period;
    if (i < 0) i += period;
    return i < n ? i : period - i;
}

int sg_pad(int itemsize, int mode, const char *x, int64_t xo, char *out, int64_t oo, int ndim, const int64_t *dims,
           uint64_t value_bits) {
    const int64_t *xs = dims, *os = dims + ndim, *before = dims + 2 * ndim;
    x += xo * itemsize;
    out += oo * itemsize;
    int64_t nout = 1, nin = 1, total_map = 0;
    for (int d = 0; d < ndim; d++) {
        nout *= os[d];
        nin *= xs[d];
        total_map += os[d];
    }
    if (nout == 0) return SG_OK;
    if (nin == 0 && mode != PAD_CONSTANT) return SG_EVALUE;
    char value[8];
    memcpy(value, &value_bits, 8); /* little-endian: the low bytes are the element */
    if (ndim == 0) {
        put(out, x, itemsize);
        return SG_OK;
    }
    int64_t *map = (int64_t *)malloc((size_t)total_map * sizeof(int64_t));
    int64_t *start = (int64_t *)malloc((size_t)ndim * sizeof(int64_t)), *xstride = start;
    if (!map || !start) {
        free(map);
        free(start);
        return SG_ENOMEM;
    }
    int64_t pos = 0;
    for (int d = 0; d < ndim; d++) {
        for (int64_t o = 0; o < os[d]; o++) map[pos + o] = nin == 0 ? -1 : pad_source(mode, o, xs[d], before[d]);
        pos += os[d];
    }
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        xstride[d] = s;
        s *= xs[d];
    }
    const int64_t inner = os[ndim - 1], rows = nout / inner;
    const int64_t *last_map = map + total_map - inner;
    const int T = sg_threads_for(nout, 1 << 15);
#pragma omp parallel for schedule(static) num_threads(T) if (T > 1)
    for (int64_t r = 0; r < rows; r++) {
        /* the source row of output row r, or none when an outer axis lands in the constant border */
        int64_t rem = r, src = 0, mpos = total_map - inner;
        int outside = 0;
        for (int d = ndim - 2; d >= 0; d--) {
            const int64_t od = rem % os[d];
            rem /= os[d];
            mpos -= os[d];
            const int64_t m = map[mpos + od];
            if (m < 0) outside = 1;
            else src += m * xstride[d];
        }
        char *dst = out + r * inner * itemsize;
        if (outside) {
            for (int64_t j = 0; j < inner; j++) put(dst + j * itemsize, value, itemsize);
            continue;
        }
        const char *srow = x + src * itemsize;
        for (int64_t j = 0; j < inner; j++) {
            const int64_t m = last_map[j];
            put(dst + j * itemsize, m < 0 ? value : srow + m * itemsize, itemsize);
        }
    }
    free(map);
    free(start);
    return SG_OK;
}
