/* Batch normalisation over axes (0, 2, 3) of x seen as (N, C, S). One work-group per channel computes the statistics
 * with a tree in local memory (two passes: the mean, then the squared deviations from it, in sg_acc); a second kernel
 * applies them element-wise. Per-channel vectors are V here (float, or double for float64 data: singa.gpu.table
 * converts float16 ones); x, y, dy, dx are T through LD/ST. `coef` holds three sg_acc per channel for the
 * element-wise pass. */

inline sg_acc sg_group_sum(sg_acc v, SG_LOCAL sg_acc *tmp) {
    const int lid = get_local_id(0), wg = get_local_size(0);
    tmp[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = wg / 2; s > 0; s >>= 1) {
        if (lid < s) tmp[lid] += tmp[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const sg_acc r = tmp[0];
    barrier(CLK_LOCAL_MEM_FENCE); /* tmp is reused by the next sum */
    return r;
}

/* element e of channel c in (N, C, S) */
#define SG_AT(c, e) ((((e) / S) * C + (c)) * S + (e) % S)

__kernel void sg_bn_stats(const long N, const long C, const long S, __global const T *x, const long xo,
                          __global const V *scale, __global const V *bias, __global V *rmean,
                          __global V *rvar, __global V *smean, __global V *sinvstd,
                          const sg_acc momentum, const sg_acc eps, __global sg_acc *coef, SG_LOCAL_ARG(sg_acc, tmp)) {
    SG_LOCAL_INIT(sg_acc, tmp);
    const long c = get_group_id(0), M = N * S;
    const int lid = get_local_id(0), wg = get_local_size(0);
    sg_acc s = 0;
    for (long e = lid; e < M; e += wg) s += LD(x, xo + SG_AT(c, e));
    const sg_acc mean = M ? sg_group_sum(s, tmp) / (sg_acc)M : (sg_acc)NAN;
    s = 0;
    for (long e = lid; e < M; e += wg) {
        const sg_acc d = LD(x, xo + SG_AT(c, e)) - mean;
        s += d * d;
    }
    const sg_acc ss = sg_group_sum(s, tmp);
    if (lid == 0) {
        const sg_acc var = M ? ss / (sg_acc)M : (sg_acc)NAN;
        const sg_acc inv = 1 / sqrt(var + eps);
        const sg_acc unbiased = var * (sg_acc)M / (sg_acc)(M > 1 ? M - 1 : 1);
        smean[c] = (V)mean;
        sinvstd[c] = (V)inv;
        rmean[c] = (V)(momentum * rmean[c] + (1 - momentum) * mean);
        rvar[c] = (V)(momentum * rvar[c] + (1 - momentum) * unbiased);
        /* y from the statistics as saved, so that sg_bn_apply_saved recomputes it bit for bit (the backward reads
         * the same values) */
        coef[3 * c] = smean[c];
        coef[3 * c + 1] = (sg_acc)sinvstd[c] * scale[c];
        coef[3 * c + 2] = bias[c];
    }
}

/* the one expression of both element-wise passes below */
inline sg_acc sg_bn_affine(const sg_acc x, const sg_acc m, const sg_acc a, const sg_acc b) { return (x - m) * a + b; }

/* y = (x - coef0) * coef1 + coef2, per channel */
__kernel void sg_bn_apply(const long n, const long C, const long S, __global const T *x, const long xo,
                          __global T *y, const long yo, __global const sg_acc *coef) {
    const long i = get_global_id(0);
    if (i >= n) return;
    const long c = (i / S) % C;
    ST(y, yo + i, sg_bn_affine(LD(x, xo + i), coef[3 * c], coef[3 * c + 1], coef[3 * c + 2]));
}

/* batchnorm_apply: sg_bn_stats' coefficients again from the saved statistics, then sg_bn_apply's map; relu != 0:
 * negatives to 0 (NaN stays, as in the relu kernel) */
__kernel void sg_bn_apply_saved(const long n, const long C, const long S, __global const T *x, const long xo,
                                __global T *y, const long yo, __global const V *scale, __global const V *bias,
                                __global const V *smean, __global const V *sinvstd, const int relu) {
    const long i = get_global_id(0);
    if (i >= n) return;
    const long c = (i / S) % C;
    sg_acc v = sg_bn_affine(LD(x, xo + i), smean[c], (sg_acc)sinvstd[c] * scale[c], bias[c]);
    if (relu && v < 0) v = 0;
    ST(y, yo + i, v);
}

__kernel void sg_bn_infer(const long n, const long C, const long S, __global const T *x, const long xo,
                          __global T *y, const long yo, __global const V *scale, __global const V *bias,
                          __global const V *mean, __global const V *var, const sg_acc eps) {
    const long i = get_global_id(0);
    if (i >= n) return;
    const long c = (i / S) % C;
    const sg_acc a = scale[c] / sqrt((sg_acc)var[c] + eps);
    ST(y, yo + i, ((sg_acc)LD(x, xo + i) - mean[c]) * a + bias[c]);
}

/* dscale = sum dy * xhat, dbias = sum dy; coef = the three factors of dx = k1 dy + k2 (x - mean) + k3 */
__kernel void sg_bn_bwd_stats(const long N, const long C, const long S, __global const T *dy, const long dyo,
                              __global const T *x, const long xo, __global const V *scale,
                              __global const V *smean, __global const V *sinvstd, __global V *dscale,
                              __global V *dbias, __global sg_acc *coef, SG_LOCAL_ARG(sg_acc, tmp)) {
    SG_LOCAL_INIT(sg_acc, tmp);
    const long c = get_group_id(0), M = N * S;
    const int lid = get_local_id(0), wg = get_local_size(0);
    const sg_acc m = smean[c], inv = sinvstd[c];
    sg_acc sg = 0, sgx = 0;
    for (long e = lid; e < M; e += wg) {
        const long k = SG_AT(c, e);
        const sg_acc g = LD(dy, dyo + k);
        sg += g;
        sgx += g * ((sg_acc)LD(x, xo + k) - m);
    }
    const sg_acc db = sg_group_sum(sg, tmp);
    const sg_acc ds = sg_group_sum(sgx, tmp) * inv;
    if (lid == 0) {
        dscale[c] = (V)ds;
        dbias[c] = (V)db;
        const sg_acc k = scale[c] * inv / (sg_acc)(M ? M : 1);
        coef[3 * c] = k * (sg_acc)M;
        coef[3 * c + 1] = -k * inv * ds;
        coef[3 * c + 2] = -k * db;
    }
}

__kernel void sg_bn_bwd_dx(const long n, const long C, const long S, __global const T *dy, const long dyo,
                           __global const T *x, const long xo, __global T *dx, const long dxo,
                           __global const V *smean, __global const sg_acc *coef) {
    const long i = get_global_id(0);
    if (i >= n) return;
    const long c = (i / S) % C;
    ST(dx, dxo + i, coef[3 * c] * LD(dy, dyo + i) + coef[3 * c + 1] * ((sg_acc)LD(x, xo + i) - smean[c])
                        + coef[3 * c + 2]);
}

/* Layer normalisation of the rows of x (rows, cols), one work-group per row, two passes as above. flags bit 0: scale
 * is given, bit 1: bias is given (an absent one's argument is another buffer, never read). mean and invstd are V. */
__kernel void sg_layer_norm(const long cols, __global const T *x, const long xo, __global T *y, const long yo,
                            __global V *mean, __global V *invstd, __global const V *scale, __global const V *bias,
                            const int flags, const sg_acc eps, SG_LOCAL_ARG(sg_acc, tmp)) {
    SG_LOCAL_INIT(sg_acc, tmp);
    const long r = get_group_id(0), base = r * cols;
    const int lid = get_local_id(0), wg = get_local_size(0);
    sg_acc s = 0;
    for (long j = lid; j < cols; j += wg) s += LD(x, xo + base + j);
    const sg_acc m = sg_group_sum(s, tmp) / (sg_acc)cols;
    s = 0;
    for (long j = lid; j < cols; j += wg) {
        const sg_acc d = LD(x, xo + base + j) - m;
        s += d * d;
    }
    const sg_acc inv = 1 / sqrt(sg_group_sum(s, tmp) / (sg_acc)cols + eps);
    for (long j = lid; j < cols; j += wg) {
        sg_acc v = ((sg_acc)LD(x, xo + base + j) - m) * inv;
        if (flags & 1) v *= scale[j];
        if (flags & 2) v += bias[j];
        ST(y, yo + base + j, v);
    }
    if (lid == 0) {
        mean[r] = (V)m;
        invstd[r] = (V)inv;
    }
}
