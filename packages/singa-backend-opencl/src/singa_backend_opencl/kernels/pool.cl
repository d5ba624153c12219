/* 2-D max and average pooling (NCHW) and their gradients, one work-item per output (forward) or per input element
 * (backward). The backward pass gathers from the windows that cover each input element instead of scattering into
 * it, so no two work-items write the same element and no atomics are needed; windows are visited in the forward's
 * row-major order, so float sums come out in the CPU backend's order. Defined by table.py: T, LD, ST (float32 or
 * float16 through float). */

typedef struct {
    long N, C, H, W, OH, OW, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw;
} sg_pool;

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
inline long sg_window_argmax(const sg_pool *q, __global const T *x, long base, long oh, long ow, float *best_out) {
    float best = 0.0f;
    long bi = -1;
    for (long i = 0; i < q->kh; i++) {
        const long h = oh * q->sh - q->pt + i * q->dh;
        if (h < 0 || h >= q->H) continue;
        for (long j = 0; j < q->kw; j++) {
            const long w = ow * q->sw - q->pl + j * q->dw;
            if (w < 0 || w >= q->W) continue;
            const float v = LD(x, base + h * q->W + w);
            if (bi < 0 || v > best || (v != v && best == best)) {
                best = v;
                bi = h * q->W + w;
            }
        }
    }
    *best_out = bi < 0 ? 0.0f : best;
    return bi;
}

__kernel void sg_pool_fwd(const sg_pool q, const int mode_avg, const int count_pad, __global const T *x,
                          const long xo, __global T *y, const long yo, __global long *idx, const long io,
                          const int with_idx) {
    const long i = get_global_id(0);
    const long ohw = q.OH * q.OW;
    if (i >= q.N * q.C * ohw) return;
    const long p = i / ohw, o = i % ohw, oh = o / q.OW, ow = o % q.OW;
    const long base = xo + p * q.H * q.W;
    if (!mode_avg) {
        float best;
        const long bi = sg_window_argmax(&q, x, base, oh, ow, &best);
        ST(y, yo + i, best);
        if (with_idx) idx[io + i] = bi;
        return;
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
    ST(y, yo + i, inside == 0 ? 0.0f : (float)(s / (sg_acc)(count_pad ? padded : inside)));
    if (with_idx) idx[io + i] = -1;
}

__kernel void sg_pool_bwd(const sg_pool q, const int mode_avg, const int count_pad, __global const T *dy,
                          const long dyo, __global const T *x, const long xo, __global const long *idx,
                          const long io, const int with_idx, __global T *dx, const long dxo) {
    const long i = get_global_id(0);
    const long hw = q.H * q.W, ohw = q.OH * q.OW;
    if (i >= q.N * q.C * hw) return;
    const long p = i / hw, e = i % hw, h = e / q.W, w = e % q.W;
    float sum = 0.0f;
    /* taps in decreasing order visit windows in increasing (oh, ow) order */
    for (long a = q.kh - 1; a >= 0; a--) {
        const long th = h + q.pt - a * q.dh;
        if (th < 0 || th % q.sh) continue;
        const long oh = th / q.sh;
        if (oh >= q.OH) continue;
        for (long b = q.kw - 1; b >= 0; b--) {
            const long tw = w + q.pl - b * q.dw;
            if (tw < 0 || tw % q.sw) continue;
            const long ow = tw / q.sw;
            if (ow >= q.OW) continue;
            const long o = oh * q.OW + ow;
            const float g = LD(dy, dyo + p * ohw + o);
            if (!mode_avg) {
                long bi;
                if (with_idx) {
                    bi = idx[io + p * ohw + o];
                } else {
                    float unused;
                    bi = sg_window_argmax(&q, x, xo + p * hw, oh, ow, &unused);
                }
                if (bi == e) sum += g;
            } else {
                long inside, padded;
                sg_window_counts(&q, oh, ow, &inside, &padded);
                if (inside) sum += (float)((sg_acc)g / (sg_acc)(count_pad ? padded : inside));
            }
        }
    }
    ST(dx, dxo + i, sum);
}
