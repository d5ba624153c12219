/* 2-D max and average pooling (NCHW) and their gradients. Each work-item handles one row: a row of outputs in the
 * forward pass, a row of input elements in the backward pass, so the index arithmetic is paid once per row.
 *
 * The backward pass gathers, for each input element, from the windows that cover it, so no two work-items write the
 * same element and no atomics are needed; windows are visited in the forward's row-major order, so float sums come
 * out in the CPU backend's order. When windows do not overlap (stride >= extent, the common 2x2/2 case) each input
 * element has at most one window and sg_pool_bwd_disjoint writes the gradient from the outputs' side instead.
 * Defined by singa.gpu.table: T, LD, ST, and CT, the type values are computed in (float for float16 and float32,
 * double for float64). */

typedef struct {
    long N, C, H, W, OH, OW, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw;
} sg_pool;

/* the output index o with o * s == t (t the tap's offset into the padded input), or -1 when there is none in [0, n) */
inline long sg_out_index(long t, long s, long n) {
    if (t < 0) return -1;
    long o = t;
    if (s != 1) { /* skips two 64-bit divisions in the common stride-1 case */
        if (t % s) return -1;
        o = t / s;
    }
    return o < n ? o : -1;
}

/* positions of the window of (oh, ow) inside the input, and inside the declared padding */
inline void sg_window_counts(const sg_pool *q, long oh, long ow, long *inside, long *padded) {
    long rin = 0, rpad = 0, cin = 0, cpad = 0;
    for (long i = 0; i < q->kh; i++) {
        const long h = oh * q->sh - q->pt + i * q->dh;
        rin += h >= 0 && h < q->H;
        rpad += h >= -q->pt && h < q->H + q->pb;
    }
    for (long j = 0; j < q->kw; j++) {
        const long w = ow * q->sw - q->pl + j * q->dw;
        cin += w >= 0 && w < q->W;
        cpad += w >= -q->pl && w < q->W + q->pr;
    }
    *inside = rin * cin;
    *padded = rpad * cpad;
}

/* h*W+w of the window's first maximum (the first NaN wins), -1 for a window with no element in the input */
inline long sg_window_argmax(const sg_pool *q, __global const T *x, long base, long oh, long ow, CT *best_out) {
    CT best = 0.0f;
    long bi = -1;
    for (long i = 0; i < q->kh; i++) {
        const long h = oh * q->sh - q->pt + i * q->dh;
        if (h < 0 || h >= q->H) continue;
        for (long j = 0; j < q->kw; j++) {
            const long w = ow * q->sw - q->pl + j * q->dw;
            if (w < 0 || w >= q->W) continue;
            const CT v = LD(x, base + h * q->W + w);
            if (bi < 0 || v > best || (v != v && best == best)) {
                best = v;
                bi = h * q->W + w;
            }
        }
    }
    *best_out = bi < 0 ? 0.0f : best;
    return bi;
}

/* one work-item per (plane, oh) */
__kernel void sg_pool_fwd(const sg_pool q, const int mode_avg, const int count_pad, __global const T *x,
                          const long xo, __global T *y, const long yo, __global long *idx, const long io,
                          const int with_idx) {
    const long t = get_global_id(0);
    if (t >= q.N * q.C * q.OH) return;
    const long oh = t % q.OH, p = t / q.OH;
    const long base = xo + p * q.H * q.W;
    for (long ow = 0; ow < q.OW; ow++) {
        const long o = t * q.OW + ow;
        if (!mode_avg) {
            CT best;
            const long bi = sg_window_argmax(&q, x, base, oh, ow, &best);
            ST(y, yo + o, best);
            if (with_idx) idx[io + o] = bi;
            continue;
        }
        long inside, padded;
        sg_window_counts(&q, oh, ow, &inside, &padded);
        sg_acc s = 0;
        for (long a = 0; a < q.kh; a++) {
            const long h = oh * q.sh - q.pt + a * q.dh;
            if (h < 0 || h >= q.H) continue;
            for (long b = 0; b < q.kw; b++) {
                const long w = ow * q.sw - q.pl + b * q.dw;
                if (w >= 0 && w < q.W) s += LD(x, base + h * q.W + w);
            }
        }
        ST(y, yo + o, inside == 0 ? 0.0f : (CT)(s / (sg_acc)(count_pad ? padded : inside)));
        if (with_idx) idx[io + o] = -1;
    }
}

/* the gradient of output (p, oh, ow) for the input element e of its plane (0 when e is not what it read) */
inline CT sg_pool_grad(const sg_pool *q, int mode_avg, int count_pad, __global const T *dy, long dyo,
                          __global const T *x, long xo, __global const long *idx, long io, int with_idx, long p,
                          long oh, long ow, long e) {
    const long o = p * q->OH * q->OW + oh * q->OW + ow;
    const CT g = LD(dy, dyo + o);
    if (!mode_avg) {
        long bi;
        if (with_idx) {
            bi = idx[io + o];
        } else {
            CT unused;
            bi = sg_window_argmax(q, x, xo + p * q->H * q->W, oh, ow, &unused);
        }
        return bi == e ? g : 0.0f;
    }
    long inside, padded;
    sg_window_counts(q, oh, ow, &inside, &padded);
    return inside ? (CT)((sg_acc)g / (sg_acc)(count_pad ? padded : inside)) : 0.0f;
}

/* one work-item per (plane, h): a row of dx, gathered from every window that covers its elements */
__kernel void sg_pool_bwd(const sg_pool q, const int mode_avg, const int count_pad, __global const T *dy,
                          const long dyo, __global const T *x, const long xo, __global const long *idx,
                          const long io, const int with_idx, __global T *dx, const long dxo) {
    const long t = get_global_id(0);
    if (t >= q.N * q.C * q.H) return;
    const long h = t % q.H, p = t / q.H;
    for (long w = 0; w < q.W; w++) {
        const long e = h * q.W + w;
        CT sum = 0.0f;
        /* taps in decreasing order visit windows in increasing (oh, ow) order */
        for (long a = q.kh - 1; a >= 0; a--) {
            const long oh = sg_out_index(h + q.pt - a * q.dh, q.sh, q.OH);
            if (oh < 0) continue;
            for (long b = q.kw - 1; b >= 0; b--) {
                const long ow = sg_out_index(w + q.pl - b * q.dw, q.sw, q.OW);
                if (ow < 0) continue;
                sum += sg_pool_grad(&q, mode_avg, count_pad, dy, dyo, x, xo, idx, io, with_idx, p, oh, ow, e);
            }
        }
        ST(dx, dxo + p * q.H * q.W + e, sum);
    }
}

/* windows that do not overlap: one work-item per (plane, oh) writes its windows' elements of dx (zeroed before) */
__kernel void sg_pool_bwd_disjoint(const sg_pool q, const int mode_avg, const int count_pad, __global const T *dy,
                                   const long dyo, __global const T *x, const long xo, __global const long *idx,
                                   const long io, const int with_idx, __global T *dx, const long dxo) {
    const long t = get_global_id(0);
    if (t >= q.N * q.C * q.OH) return;
    const long oh = t % q.OH, p = t / q.OH;
    for (long ow = 0; ow < q.OW; ow++) {
        for (long a = 0; a < q.kh; a++) {
            const long h = oh * q.sh - q.pt + a * q.dh;
            if (h < 0 || h >= q.H) continue;
            for (long b = 0; b < q.kw; b++) {
                const long w = ow * q.sw - q.pl + b * q.dw;
                if (w < 0 || w >= q.W) continue;
                const long e = h * q.W + w;
                ST(dx, dxo + p * q.H * q.W + e,
                   sg_pool_grad(&q, mode_avg, count_pad, dy, dyo, x, xo, idx, io, with_idx, p, oh, ow, e));
            }
        }
    }
}
