/* gather / scatter_add along one axis (x seen as (outer, len, inner)), N-d padding, and the index check they share.
 * Defined by table.py: for gather and pad, E (an unsigned type of the item size: elements are moved, never read);
 * for scatter_add, T/LD/ST/TNAME of the element type; TI, the index type (int or long), for the index kernels. */

#ifdef TI
/* flag[0] = the smallest position holding an index outside [lo, len) (the flag starts at INT_MAX); lo is -len for
   indices that may count from the end, 0 for class labels */
__kernel void sg_check_indices(const long count, const long lo, const long len, __global const TI *idx, const long io,
                               __global volatile int *flag) {
    const long j = get_global_id(0);
    if (j >= count) return;
    const long v = idx[io + j];
    if (v < lo || v >= len) atomic_min(flag, (int)min(j, (long)INT_MAX));
}
#endif

#ifdef E
__kernel void sg_gather(const long outer, const long len, const long inner, const long count,
                        __global const E *x, const long xo, __global const TI *idx, const long io,
                        __global E *out, const long oo) {
    const long i = get_global_id(0);
    if (i >= outer * count * inner) return;
    const long k = i % inner, j = (i / inner) % count, o = i / (inner * count);
    long a = idx[io + j];
    if (a < 0) a += len;
    out[oo + i] = x[xo + (o * len + a) * inner + k];
}

/* every dimension of the input and the output, and the padding in front, at most SG_PAD_MAXD of them */
#define SG_PAD_MAXD 16
typedef struct {
    long nd, xs[SG_PAD_MAXD], os[SG_PAD_MAXD], before[SG_PAD_MAXD];
} sg_pads;

/* source index of output position o along an axis of length n padded by `before`, or -1 for the constant */
inline long sg_pad_source(int mode, long o, long n, long before) {
    long i = o - before;
    if (i >= 0 && i < n) return i;
    if (mode == 0) return -1;
    if (mode == 2) return i < 0 ? 0 : n - 1;
    if (n == 1) return 0;
    const long period = 2 * (n - 1); /* reflect without repeating the edge, as often as the padding needs */
    i %= period;
    if (i < 0) i += period;
    return i < n ? i : period - i;
}

__kernel void sg_pad(const long total, const sg_pads d, const int mode, const E value, __global const E *x,
                     const long xo, __global E *out, const long oo) {
    const long i = get_global_id(0);
    if (i >= total) return;
    long r = i, src = 0, stride = 1;
    for (int k = (int)d.nd - 1; k >= 0; k--) {
        const long c = r % d.os[k];
        r /= d.os[k];
        const long s = sg_pad_source(mode, c, d.xs[k], d.before[k]);
        if (s < 0) {
            out[oo + i] = value;
            return;
        }
        src += s * stride;
        stride *= d.xs[k];
    }
    out[oo + i] = x[xo + src];
}
#endif

#ifdef TNAME
/* deterministic: one work-item per (o, k) column adds the updates in index order, like the CPU backend */
__kernel void sg_scatter_cols(const long outer, const long len, const long inner, const long count,
                              __global T *out, const long oo, __global const TI *idx, const long io,
                              __global const T *upd, const long uo) {
    const long i = get_global_id(0);
    if (i >= outer * inner) return;
    const long o = i / inner, k = i % inner;
    for (long j = 0; j < count; j++) {
        long a = idx[io + j];
        if (a < 0) a += len;
        const long d = oo + (o * len + a) * inner + k;
        ST(out, d, LD(out, d) + LD(upd, uo + (o * count + j) * inner + k));
    }
}

#ifndef SG_NO_ATOMIC
/* one work-item per update element, added atomically: for few output columns and many updates */
__kernel void sg_scatter_atomic(const long outer, const long len, const long inner, const long count,
                                __global T *out, const long oo, __global const TI *idx, const long io,
                                __global const T *upd, const long uo) {
    const long i = get_global_id(0);
    if (i >= outer * count * inner) return;
    const long k = i % inner, j = (i / inner) % count, o = i / (inner * count);
    long a = idx[io + j];
    if (a < 0) a += len;
    const long d = oo + (o * len + a) * inner + k;
    SG_ATOMIC_ADD(out, d, LD(upd, uo + i));
}
#endif
#endif
