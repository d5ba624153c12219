/* Softmax and log-softmax along one axis of x seen as (outer, len, inner), their gradients, and (the program built
 * with SG_SCE) the softmax cross-entropy loss. Long rows (inner == 1) get one work-group each with trees in local
 * memory; otherwise one work-item walks one (o, j) column. The arithmetic follows the CPU backend: x - max in CT,
 * exp in CT, sums in sg_acc, log-softmax as (x - m) - (CT)log(sum). Defined by singa.gpu.table: T, LD, ST and CT, the
 * compute type (float for float16 and float32, double for float64). */

#ifndef SG_SCE
inline CT sg_group_max(CT v, SG_LOCAL sg_acc *tmp) {
    const int lid = get_local_id(0), wg = get_local_size(0);
    tmp[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = wg / 2; s > 0; s >>= 1) {
        if (lid < s) tmp[lid] = fmax(tmp[lid], tmp[lid + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const CT r = (CT)tmp[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

inline sg_acc sg_group_sum(sg_acc v, SG_LOCAL sg_acc *tmp) {
    const int lid = get_local_id(0), wg = get_local_size(0);
    tmp[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = wg / 2; s > 0; s >>= 1) {
        if (lid < s) tmp[lid] += tmp[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const sg_acc r = tmp[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

/* one work-group per row of len elements (inner == 1) */
__kernel void sg_softmax_rows(const long len, const int log_, __global const T *x, const long xo, __global T *y,
                              const long yo, SG_LOCAL_ARG(sg_acc, tmp)) {
    SG_LOCAL_INIT(sg_acc, tmp);
    const long row = get_group_id(0);
    const int lid = get_local_id(0), wg = get_local_size(0);
    const long base = row * len;
    CT m = -INFINITY;
    for (long r = lid; r < len; r += wg) m = fmax(m, (CT)LD(x, xo + base + r));
    m = sg_group_max(m, tmp);
    sg_acc s = 0;
    for (long r = lid; r < len; r += wg) s += exp((CT)LD(x, xo + base + r) - m);
    s = sg_group_sum(s, tmp);
    if (log_) {
        const CT ls = (CT)log(s);
        for (long r = lid; r < len; r += wg) ST(y, yo + base + r, ((CT)LD(x, xo + base + r) - m) - ls);
    } else {
        const CT inv = (CT)(1 / s);
        for (long r = lid; r < len; r += wg) ST(y, yo + base + r, exp((CT)LD(x, xo + base + r) - m) * inv);
    }
}

/* one work-item per (o, j) column */
__kernel void sg_softmax_cols(const long outer, const long len, const long inner, const int log_,
                              __global const T *x, const long xo, __global T *y, const long yo) {
    const long i = get_global_id(0);
    if (i >= outer * inner) return;
    const long base = (i / inner) * len * inner + i % inner;
    CT m = -INFINITY;
    for (long r = 0; r < len; r++) m = fmax(m, (CT)LD(x, xo + base + r * inner));
    sg_acc s = 0;
    for (long r = 0; r < len; r++) s += exp((CT)LD(x, xo + base + r * inner) - m);
    if (log_) {
        const CT ls = (CT)log(s);
        for (long r = 0; r < len; r++) ST(y, yo + base + r * inner, ((CT)LD(x, xo + base + r * inner) - m) - ls);
    } else {
        const CT inv = (CT)(1 / s);
        for (long r = 0; r < len; r++) ST(y, yo + base + r * inner, exp((CT)LD(x, xo + base + r * inner) - m) * inv);
    }
}

/* softmax: dx = y (dy - sum(dy y)); log-softmax: dx = dy - exp(y) sum(dy) */
__kernel void sg_softmax_bwd_rows(const long len, const int log_, __global const T *dy, const long dyo,
                                  __global const T *y, const long yo, __global T *dx, const long dxo,
                                  SG_LOCAL_ARG(sg_acc, tmp)) {
    SG_LOCAL_INIT(sg_acc, tmp);
    const long base = get_group_id(0) * len;
    const int lid = get_local_id(0), wg = get_local_size(0);
    sg_acc s = 0;
    for (long r = lid; r < len; r += wg) {
        const CT g = LD(dy, dyo + base + r);
        s += log_ ? (sg_acc)g : (sg_acc)g * LD(y, yo + base + r);
    }
    s = sg_group_sum(s, tmp);
    for (long r = lid; r < len; r += wg) {
        const CT g = LD(dy, dyo + base + r), p = LD(y, yo + base + r);
        ST(dx, dxo + base + r, log_ ? (sg_acc)g - (sg_acc)exp(p) * s : (sg_acc)p * ((sg_acc)g - s));
    }
}

__kernel void sg_softmax_bwd_cols(const long outer, const long len, const long inner, const int log_,
                                  __global const T *dy, const long dyo, __global const T *y, const long yo,
                                  __global T *dx, const long dxo) {
    const long i = get_global_id(0);
    if (i >= outer * inner) return;
    const long base = (i / inner) * len * inner + i % inner;
    sg_acc s = 0;
    for (long r = 0; r < len; r++) {
        const CT g = LD(dy, dyo + base + r * inner);
        s += log_ ? (sg_acc)g : (sg_acc)g * LD(y, yo + base + r * inner);
    }
    for (long r = 0; r < len; r++) {
        const long k = base + r * inner;
        const CT g = LD(dy, dyo + k), p = LD(y, yo + k);
        ST(dx, dxo + k, log_ ? (sg_acc)g - (sg_acc)exp(p) * s : (sg_acc)p * ((sg_acc)g - s));
    }
}

#else
/* -- softmax cross-entropy: one work-item per row; targets are TT, labels when TT_LABELS ---------------------------- */

inline sg_acc sg_row_lse(__global const T *x, long base, long C) {
    sg_acc m = -INFINITY;
    for (long c = 0; c < C; c++) m = fmax(m, (sg_acc)LD(x, base + c));
    sg_acc s = 0;
    for (long c = 0; c < C; c++) s += exp((sg_acc)LD(x, base + c) - m);
    return m + log(s);
}

#if TT_LABELS
inline long sg_label(__global const TT *t, long i, long C) {
    return t[i]; /* in [0, C): checked by the host before the launch */
}
#endif

__kernel void sg_sce(const long N, const long C, __global const T *x, const long xo, __global const TT *t,
                     const long to, __global T *loss, const long lo) {
    const long n = get_global_id(0);
    if (n >= N) return;
    const long base = xo + n * C;
    const sg_acc lse = C ? sg_row_lse(x, base, C) : (sg_acc)NAN;
#if TT_LABELS
    const sg_acc l = lse - LD(x, base + sg_label(t, to + n, C));
#else
    sg_acc st = 0, stx = 0;
    for (long c = 0; c < C; c++) {
        const sg_acc tc = LDT(t, to + n * C + c);
        st += tc;
        stx += tc * LD(x, base + c);
    }
    const sg_acc l = C ? st * lse - stx : 0;
#endif
    ST(loss, lo + n, l);
}

__kernel void sg_sce_bwd(const long N, const long C, __global const T *dloss, const long dlo, __global const T *x,
                         const long xo, __global const TT *t, const long to, __global T *dx, const long dxo) {
    const long n = get_global_id(0);
    if (n >= N) return;
    const long base = xo + n * C;
    const sg_acc lse = sg_row_lse(x, base, C), g = LD(dloss, dlo + n);
#if TT_LABELS
    const long label = sg_label(t, to + n, C);
    const sg_acc st = 1;
#else
    sg_acc st = 0;
    for (long c = 0; c < C; c++) st += LDT(t, to + n * C + c);
#endif
    for (long c = 0; c < C; c++) {
        const sg_acc p = exp((sg_acc)LD(x, base + c) - lse);
#if TT_LABELS
        const sg_acc tc = c == label ? 1 : 0;
#else
        const sg_acc tc = LDT(t, to + n * C + c);
#endif
        ST(dx, dxo + n * C + c, (p * st - tc) * g);
    }
}
#endif
