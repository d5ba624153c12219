/* Counter-based random numbers: Philox4x32-10 exactly as singa.primitives.PHILOX_DOC fixes it, so that every
 * backend draws the same numbers. Draw c of stream `seed` is word c % 4 of Philox(counter = c / 4, key = seed), and
 * the float draw is (word >> 8) * 2^-24, exact in float. One work-item per output element; values are computed in
 * sg_acc (double where the device has it, like the CPU backend) and rounded once into the output. Defined by
 * table.py: TOUT, ST. */

inline uint sg_philox_word(const ulong seed, const ulong draw) {
    const ulong ctr = draw >> 2;
    uint c0 = (uint)ctr, c1 = (uint)(ctr >> 32), c2 = 0, c3 = 0;
    uint k0 = (uint)seed, k1 = (uint)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        const uint hi0 = mul_hi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const uint hi1 = mul_hi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        const uint n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c1 = lo1;
        c3 = lo0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    const uint w = (uint)(draw & 3);
    return w == 0 ? c0 : w == 1 ? c1 : w == 2 ? c2 : c3;
}

inline sg_acc sg_unit(uint r) { return (sg_acc)(r >> 8) * (sg_acc)(1.0f / 16777216.0f); }

__kernel void sg_philox_u32(const long n, const ulong seed, const ulong offset, __global uint *out) {
    const long i = get_global_id(0);
    if (i < n) out[i] = sg_philox_word(seed, offset + (ulong)i);
}

__kernel void sg_random_uniform(const long n, __global TOUT *out, const long oo, const sg_acc low, const sg_acc high,
                                const ulong seed, const ulong offset) {
    const long i = get_global_id(0);
    if (i < n) ST(out, oo + i, low + (high - low) * sg_unit(sg_philox_word(seed, offset + (ulong)i)));
}

#ifdef SG_FP64
#define SG_TWO_PI (2.0 * M_PI)
#else
#define SG_TWO_PI (2.0f * M_PI_F)
#endif

/* Box-Muller on draws 2i and 2i + 1 */
__kernel void sg_random_normal(const long n, __global TOUT *out, const long oo, const sg_acc mean, const sg_acc std,
                               const ulong seed, const ulong offset) {
    const long i = get_global_id(0);
    if (i >= n) return;
    const sg_acc u0 = sg_unit(sg_philox_word(seed, offset + 2 * (ulong)i));
    const sg_acc u1 = sg_unit(sg_philox_word(seed, offset + 2 * (ulong)i + 1));
    ST(out, oo + i, mean + std * (sqrt(-2 * log(1 - u0)) * cos(SG_TWO_PI * u1)));
}

__kernel void sg_random_bernoulli(const long n, __global TOUT *out, const long oo, const sg_acc p, const ulong seed,
                                  const ulong offset) {
    const long i = get_global_id(0);
    if (i < n) ST(out, oo + i, sg_unit(sg_philox_word(seed, offset + (ulong)i)) < p ? 1 : 0);
}
