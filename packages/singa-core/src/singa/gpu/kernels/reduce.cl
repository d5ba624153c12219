/* Reductions of a contiguous input seen as (outer, len, inner), and argmax/argmin along one axis.
 *
 * table.py merges the reduced axes into `len` (copying the input into that order first when reduced axes are not
 * neighbours) and picks the parallel shape:
 *   sg_red_<op>_cols  one work-item per output (o, j), walking the len axis: inner > 1, or short rows;
 *   sg_red_<op>_rows  one work-group per (row, segment), a tree in local memory; `split` segments per row write
 *                     partial accumulators that sg_red_<op>_final combines (long rows, few of them);
 *   sg_red_<op>_mid   x (A, K, B) reduced over A and B (a bias gradient over N, H, W): one work-group per k.
 * Accumulators are sg_acc (double where the device has it, as on the CPU backend) for float inputs and long for
 * integers and bool. Defined by table.py: TIN, LD (load), TOUT and ST (store into the output dtype), IS_FLOAT, and
 * SG_ARG for the argmax/argmin program instead of the reductions.
 */
#if IS_FLOAT
typedef sg_acc acc_t;
#define ACC_MAX INFINITY
#define ACC_MIN (-INFINITY)
#else
typedef long acc_t;
#define ACC_MAX LONG_MAX
#define ACC_MIN LONG_MIN
#endif

#ifndef SG_ARG
/* combine a value into an accumulator; float max/min let a NaN win and keep it */
inline acc_t sg_sum(acc_t a, acc_t v) { return a + v; }
inline acc_t sg_prod(acc_t a, acc_t v) { return a * v; }
#if IS_FLOAT
inline acc_t sg_max(acc_t a, acc_t v) { return (a != a) ? a : ((v > a || v != v) ? v : a); }
inline acc_t sg_min(acc_t a, acc_t v) { return (a != a) ? a : ((v < a || v != v) ? v : a); }
#else
inline acc_t sg_max(acc_t a, acc_t v) { return v > a ? v : a; }
inline acc_t sg_min(acc_t a, acc_t v) { return v < a ? v : a; }
#endif

/* the output value of an accumulator over `count` elements */
#define FINISH_PLAIN(v, count) (v)
#if IS_FLOAT
#define FINISH_MEAN(v, count) ((v) / (sg_acc)(count))
#else
/* integer means truncate toward zero (C division); an empty one is 0 */
#define FINISH_MEAN(v, count) ((count) == 0 ? 0 : (v) / (count))
#endif

#define REDUCE_KERNELS(NAME, COMBINE, IDENTITY, FINISH)                                                            \
__kernel void sg_red_##NAME##_cols(const long outer, const long len, const long inner,                            \
                                   __global const TIN *x, const long xo, __global TOUT *out, const long oo) {      \
    const long i = get_global_id(0);                                                                             \
    if (i >= outer * inner) return;                                                                              \
    const long o = i / inner, j = i % inner;                                                                     \
    __global const TIN *p = x + xo + o * len * inner + j;                                                        \
    acc_t a = IDENTITY;                                                                                          \
    for (long r = 0; r < len; r++) a = COMBINE(a, (acc_t)LD(p, r * inner));                                      \
    ST(out, oo + i, FINISH(a, len));                                                                             \
}                                                                                                                \
/* rows of `len` elements; work-group g handles segment g % split of row g / split */                            \
__kernel void sg_red_##NAME##_rows(const long len, const long split, __global const TIN *x, const long xo,       \
                                   __global TOUT *out, const long oo, __global acc_t *part,                      \
                                   SG_LOCAL_ARG(acc_t, tmp)) {                                                   \
    SG_LOCAL_INIT(acc_t, tmp);                                                                                   \
    const long g = get_group_id(0), row = g / split, seg = g % split;                                            \
    const int lid = get_local_id(0), wg = get_local_size(0);                                                     \
    const long per = (len + split - 1) / split, lo = seg * per, hi = min(len, lo + per);                         \
    __global const TIN *p = x + xo + row * len;                                                                  \
    acc_t a = IDENTITY;                                                                                          \
    for (long r = lo + lid; r < hi; r += wg) a = COMBINE(a, (acc_t)LD(p, r));                                    \
    tmp[lid] = a;                                                                                                \
    barrier(CLK_LOCAL_MEM_FENCE);                                                                                \
    for (int s = wg / 2; s > 0; s >>= 1) {                                                                       \
        if (lid < s) tmp[lid] = COMBINE(tmp[lid], tmp[lid + s]);                                                 \
        barrier(CLK_LOCAL_MEM_FENCE);                                                                            \
    }                                                                                                            \
    if (lid == 0) {                                                                                              \
        if (split == 1) ST(out, oo + row, FINISH(tmp[0], len));                                                  \
        else part[g] = tmp[0];                                                                                   \
    }                                                                                                            \
}                                                                                                                \
/* x (A, K, B) reduced over A and B: one work-group per k; each work-item steps through the A*B elements */      \
__kernel void sg_red_##NAME##_mid(const long A, const long K, const long B, __global const TIN *x, const long xo,  \
                                  __global TOUT *out, const long oo, SG_LOCAL_ARG(acc_t, tmp)) {                 \
    SG_LOCAL_INIT(acc_t, tmp);                                                                                   \
    const long k = get_group_id(0);                                                                              \
    const int lid = get_local_id(0), wg = get_local_size(0);                                                     \
    const long di = wg / B, db = wg % B;                                                                         \
    long i = lid / B, b = lid % B;                                                                               \
    acc_t a = IDENTITY;                                                                                          \
    for (; i < A; i += di, b += db) {                                                                            \
        if (b >= B) { b -= B; i++; if (i >= A) break; }                                                          \
        a = COMBINE(a, (acc_t)LD(x, xo + (i * K + k) * B + b));                                                  \
    }                                                                                                            \
    tmp[lid] = a;                                                                                                \
    barrier(CLK_LOCAL_MEM_FENCE);                                                                                \
    for (int s = wg / 2; s > 0; s >>= 1) {                                                                       \
        if (lid < s) tmp[lid] = COMBINE(tmp[lid], tmp[lid + s]);                                                 \
        barrier(CLK_LOCAL_MEM_FENCE);                                                                            \
    }                                                                                                            \
    if (lid == 0) ST(out, oo + k, FINISH(tmp[0], A * B));                                                        \
}                                                                                                                \
__kernel void sg_red_##NAME##_final(const long rows, const long len, const long split,                           \
                                    __global const acc_t *part, __global TOUT *out, const long oo) {             \
    const long row = get_global_id(0);                                                                           \
    if (row >= rows) return;                                                                                     \
    acc_t a = IDENTITY;                                                                                          \
    for (long s = 0; s < split; s++) a = COMBINE(a, part[row * split + s]);                                      \
    ST(out, oo + row, FINISH(a, len));                                                                           \
}

REDUCE_KERNELS(sum, sg_sum, 0, FINISH_PLAIN)
REDUCE_KERNELS(mean, sg_sum, 0, FINISH_MEAN)
REDUCE_KERNELS(max, sg_max, ACC_MIN, FINISH_PLAIN)
REDUCE_KERNELS(min, sg_min, ACC_MAX, FINISH_PLAIN)
REDUCE_KERNELS(prod, sg_prod, 1, FINISH_PLAIN)

#else
/* index of the first extreme along len; a NaN counts as the extreme (numpy's rule) */
#define ARG_KERNEL(NAME, BETTER)                                                                                   \
__kernel void sg_##NAME(const long outer, const long len, const long inner, __global const TIN *x,               \
                        const long xo, __global long *out, const long oo) {                                      \
    const long i = get_global_id(0);                                                                             \
    if (i >= outer * inner) return;                                                                              \
    const long o = i / inner, j = i % inner;                                                                     \
    __global const TIN *p = x + xo + o * len * inner + j;                                                        \
    acc_t best = (acc_t)LD(p, 0);                                                                                \
    long bi = 0;                                                                                                 \
    for (long r = 1; r < len && best == best; r++) {                                                             \
        const acc_t v = (acc_t)LD(p, r * inner);                                                                 \
        if (v != v || BETTER(v, best)) { best = v; bi = r; }                                                     \
    }                                                                                                            \
    out[oo + i] = bi;                                                                                            \
}
#define GREATER(a, b) ((a) > (b))
#define LESS(a, b) ((a) < (b))
ARG_KERNEL(argmax, GREATER)
ARG_KERNEL(argmin, LESS)
#endif
