/* Convolution helpers around the GEMM (table.py drives them; float32 only, float16 goes through float32 copies).
 *
 * The unfolded matrix of a chunk of images has one row per (channel, tap) over every group, r = c * kh * kw + i * kw
 * + j, and one column per output position p = oh * OW + ow. Where it lives is given by two strides: `col_sn` between
 * images and `col_sr` between rows, so one kernel writes both layouts the products need: per image (rows, OH*OW)
 * blocks for the batched forward and data-gradient products, and (rows, images * OH*OW) for the weight gradient.
 * col2im gathers every tap that reads an input element (no atomics: each work-item owns one element of dx).
 */

typedef struct {
    long N, C, H, W, K, kh, kw, OH, OW, sh, sw, pt, pl, dh, dw, G;
} sg_conv;

__kernel void sg_im2col(const sg_conv q, const long n0, const long nb, __global const float *x, const long xo,
                        __global float *col, const long co, const long col_sn, const long col_sr) {
    const long i = get_global_id(0);
    const long ohw = q.OH * q.OW, kk = q.kh * q.kw, rows = q.C * kk;
    if (i >= nb * rows * ohw) return;
    const long p = i % ohw, t = i / ohw, r = t % rows, img = t / rows;
    const long c = r / kk, a = (r % kk) / q.kw, b = r % q.kw;
    const long h = (p / q.OW) * q.sh - q.pt + a * q.dh, w = (p % q.OW) * q.sw - q.pl + b * q.dw;
    float v = 0.0f;
    if (h >= 0 && h < q.H && w >= 0 && w < q.W) v = x[xo + ((n0 + img) * q.C + c) * q.H * q.W + h * q.W + w];
    col[co + img * col_sn + r * col_sr + p] = v;
}

/* dx of images n0 .. n0 + nb - 1 from the column gradient (layout as in sg_im2col) */
__kernel void sg_col2im(const sg_conv q, const long n0, const long nb, __global const float *col, const long co,
                        const long col_sn, const long col_sr, __global float *dx, const long dxo) {
    const long i = get_global_id(0);
    const long hw = q.H * q.W, kk = q.kh * q.kw;
    if (i >= nb * q.C * hw) return;
    const long e = i % hw, c = (i / hw) % q.C, img = i / (hw * q.C), h = e / q.W, w = e % q.W;
    float s = 0.0f;
    for (long a = 0; a < q.kh; a++) {
        const long th = h + q.pt - a * q.dh;
        if (th < 0 || th % q.sh) continue;
        const long oh = th / q.sh;
        if (oh >= q.OH) continue;
        for (long b = 0; b < q.kw; b++) {
            const long tw = w + q.pl - b * q.dw;
            if (tw < 0 || tw % q.sw) continue;
            const long ow = tw / q.sw;
            if (ow >= q.OW) continue;
            s += col[co + img * col_sn + (c * kk + a * q.kw + b) * col_sr + oh * q.OW + ow];
        }
    }
    dx[dxo + ((n0 + img) * q.C + c) * hw + e] = s;
}

/* y[n, k, :] += b[k] (or = b[k] when `set`, for an empty correlation) */
__kernel void sg_conv_bias(const long n, const long K, const long ohw, __global float *y, const long yo,
                           __global const float *b, const long bo, const int set) {
    const long i = get_global_id(0);
    if (i >= n) return;
    const float v = b[bo + (i / ohw) % K];
    y[yo + i] = set ? v : y[yo + i] + v;
}
