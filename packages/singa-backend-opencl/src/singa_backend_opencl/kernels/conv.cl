/* Convolution helpers around the GEMM (table.py drives them; T is float or double: float16 goes through float32
 * copies).
 *
 * The unfolded matrix of a chunk of images has one row per (channel, tap) over every group, r = c * kh * kw + i * kw
 * + j, and one column per output position p = oh * OW + ow. Where it lives is given by two strides: `col_sn` between
 * images and `col_sr` between rows, so one kernel writes both layouts the products need: per image (rows, OH*OW)
 * blocks for the batched forward and data-gradient products, and (rows, images * OH*OW) for the weight gradient.
 * col2im gathers every tap that reads an input element (no atomics: each work-item owns its elements of dx).
 * Each work-item handles a whole row of output positions (or of input elements), so the index arithmetic (64-bit
 * divisions, slow on CPUs) is paid once per row rather than once per element.
 */

typedef struct {
    long N, C, H, W, K, kh, kw, OH, OW, sh, sw, pt, pl, dh, dw, G;
} sg_conv;

/* one work-item per (image, unfolded row, oh): the OW columns of that output row */
__kernel void sg_im2col(const sg_conv q, const long n0, const long nb, __global const T *x, const long xo,
                        __global T *col, const long co, const long col_sn, const long col_sr) {
    const long t = get_global_id(0);
    const long kk = q.kh * q.kw, rows = q.C * kk;
    if (t >= nb * rows * q.OH) return;
    const long oh = t % q.OH, r = (t / q.OH) % rows, img = t / (q.OH * rows);
    const long c = r / kk, a = (r % kk) / q.kw, b = r % q.kw;
    const long h = oh * q.sh - q.pt + a * q.dh;
    __global T *dst = col + co + img * col_sn + r * col_sr + oh * q.OW;
    if (h < 0 || h >= q.H) {
        for (long ow = 0; ow < q.OW; ow++) dst[ow] = 0.0f;
        return;
    }
    __global const T *src = x + xo + ((n0 + img) * q.C + c) * q.H * q.W + h * q.W;
    const long w0 = b * q.dw - q.pl;
    for (long ow = 0; ow < q.OW; ow++) {
        const long w = w0 + ow * q.sw;
        dst[ow] = (w >= 0 && w < q.W) ? src[w] : 0.0f;
    }
}

/* one work-item per (image, channel, h): that row of dx, gathered from the column gradient */
__kernel void sg_col2im(const sg_conv q, const long n0, const long nb, __global const T *col, const long co,
                        const long col_sn, const long col_sr, __global T *dx, const long dxo) {
    const long t = get_global_id(0);
    const long kk = q.kh * q.kw;
    if (t >= nb * q.C * q.H) return;
    const long h = t % q.H, c = (t / q.H) % q.C, img = t / (q.H * q.C);
    __global T *dst = dx + dxo + ((n0 + img) * q.C + c) * q.H * q.W + h * q.W;
    __global const T *src = col + co + img * col_sn + c * kk * col_sr;
    for (long w = 0; w < q.W; w++) dst[w] = 0.0f;
    /* taps in the CPU backend's order (i, then j), so each element's sum is added up the same way */
    for (long a = 0; a < q.kh; a++) {
        const long th = h + q.pt - a * q.dh;
        if (th < 0 || (q.sh != 1 && th % q.sh)) continue;
        const long oh = q.sh == 1 ? th : th / q.sh;
        if (oh >= q.OH) continue;
        for (long b = 0; b < q.kw; b++) {
            __global const T *row = src + (a * q.kw + b) * col_sr + oh * q.OW;
            const long off = q.pl - b * q.dw; /* tw = w + off must be ow * sw */
            if (q.sw == 1) {
                const long lo = max(0L, -off), hi = min(q.W, q.OW - off);
                for (long w = lo; w < hi; w++) dst[w] += row[w + off];
            } else {
                for (long w = 0; w < q.W; w++) {
                    const long tw = w + off;
                    if (tw < 0 || tw >= q.OW * q.sw || tw % q.sw) continue;
                    dst[w] += row[tw / q.sw];
                }
            }
        }
    }
}

/* rows of the images n0 .. n0 + nb - 1 of y (N, K, P) into (K, nb * P): one work-item per (k, image) */
__kernel void sg_batch_to_rows(const long K, const long P, const long n0, const long nb, __global const T *y,
                               const long yo, __global T *out) {
    const long t = get_global_id(0);
    if (t >= K * nb) return;
    const long img = t % nb, k = t / nb;
    __global const T *src = y + yo + ((n0 + img) * K + k) * P;
    __global T *dst = out + (k * nb + img) * P;
    for (long p = 0; p < P; p++) dst[p] = src[p];
}

/* y[n, k, :] += b[k] (or = b[k] when `set`, for an empty correlation): one work-item per (n, k) */
__kernel void sg_conv_bias(const long rows, const long K, const long ohw, __global T *y, const long yo,
                           __global const T *b, const long bo, const int set) {
    const long t = get_global_id(0);
    if (t >= rows) return;
    const T v = b[bo + t % K];
    __global T *p = y + yo + t * ohw;
    for (long i = 0; i < ohw; i++) p[i] = set ? v : p[i] + v;
}
