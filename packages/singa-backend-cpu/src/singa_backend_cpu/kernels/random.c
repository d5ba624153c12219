/* Counter-based random numbers: Philox4x32-10 exactly as singa.primitives.PHILOX_DOC fixes it, so every backend draws
 * the same numbers. Draw c of a stream is word c % 4 of Philox(counter = c / 4, key = seed); the float draw is
 * (word >> 8) * 2^-24. Values are computed in double and rounded once into the output dtype; float64 output keeps those
 * 24-bit draws as they are, as singa.fallback does. */
#include "common.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u
#define LANES 64 /* counters per batch, computed side by side so the rounds vectorise */

/* words of counters ctr0 .. ctr0 + LANES - 1, word-interleaved per counter: w[4 * lane + k] */
static void philox_batch(uint64_t ctr0, uint32_t key0, uint32_t key1, uint32_t *w) {
    uint32_t c0[LANES], c1[LANES], c2[LANES], c3[LANES];
    for (int l = 0; l < LANES; l++) {
        const uint64_t c = ctr0 + (uint64_t)l;
        c0[l] = (uint32_t)c;
        c1[l] = (uint32_t)(c >> 32);
        c2[l] = 0;
        c3[l] = 0;
    }
    uint32_t k0 = key0, k1 = key1;
    for (int r = 0; r < 10; r++) {
#pragma omp simd
        for (int l = 0; l < LANES; l++) {
            const uint64_t p0 = (uint64_t)PHILOX_M0 * c0[l], p1 = (uint64_t)PHILOX_M1 * c2[l];
            const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[l] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3[l] ^ k1;
            c1[l] = (uint32_t)p1;
            c3[l] = (uint32_t)p0;
            c0[l] = n0;
            c2[l] = n2;
        }
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    for (int l = 0; l < LANES; l++) {
        w[4 * l] = c0[l];
        w[4 * l + 1] = c1[l];
        w[4 * l + 2] = c2[l];
        w[4 * l + 3] = c3[l];
    }
}

/* out[j] = word of draw first + j, for j < n */
static void philox_words(uint64_t seed, uint64_t first, int64_t n, uint32_t *out) {
    uint32_t w[4 * LANES];
    const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    int64_t done = 0;
    while (done < n) {
        const uint64_t draw = first + (uint64_t)done;
        const uint64_t ctr = draw / 4;
        const int64_t skip = (int64_t)(draw % 4);
        philox_batch(ctr, k0, k1, w);
        const int64_t take = sg_min64(4 * LANES - skip, n - done);
        memcpy(out + done, w + skip, (size_t)take * sizeof(uint32_t));
        done += take;
    }
}

void sg_philox_u32(uint64_t seed, uint64_t offset, int64_t n, uint32_t *out) {
    if (n > 0) philox_words(seed, offset, n, out);
}

static inline double unit(uint32_t r) { return (double)(r >> 8) * (1.0 / 16777216.0); }

static inline void store_value(int dtype, char *out, int64_t i, double v) {
    switch (dtype) {
    case SG_F32: ((float *)out)[i] = (float)v; break;
    case SG_F16: ((sg_half *)out)[i] = (sg_half)v; break;
    case SG_F64: ((double *)out)[i] = v; break;
    case SG_I32: ((int32_t *)out)[i] = (int32_t)v; break;
    case SG_I64: ((int64_t *)out)[i] = (int64_t)v; break;
    default: ((uint8_t *)out)[i] = v != 0;
    }
}

enum { DIST_UNIFORM, DIST_NORMAL, DIST_BERNOULLI };

/* elements [lo, hi) of a distribution; `per` draws per element */
static void fill_range(int dist, int dtype, char *out, int64_t lo, int64_t hi, double a, double b, uint64_t seed,
                       uint64_t offset) {
    enum { CHUNK = 512 };
    uint32_t words[2 * CHUNK];
    const int per = dist == DIST_NORMAL ? 2 : 1;
    for (int64_t s = lo; s < hi; s += CHUNK) {
        const int64_t m = sg_min64(CHUNK, hi - s);
        philox_words(seed, offset + (uint64_t)(s * per), m * per, words);
        for (int64_t i = 0; i < m; i++) {
            double v;
            if (dist == DIST_UNIFORM) {
                v = a + (b - a) * unit(words[i]);
            } else if (dist == DIST_NORMAL) {
                const double u0 = unit(words[2 * i]), u1 = unit(words[2 * i + 1]);
                v = a + b * (sqrt(-2.0 * log(1.0 - u0)) * cos(2.0 * M_PI * u1));
            } else {
                v = unit(words[i]) < a ? 1.0 : 0.0;
            }
            store_value(dtype, out, s + i, v);
        }
    }
}

static int run(int dist, int dtype, char *out, int64_t oo, int64_t n, double a, double b, uint64_t seed,
               uint64_t offset) {
    if (dtype < SG_F32 || dtype > SG_F64) return SG_EDTYPE;
    if (dist != DIST_BERNOULLI && !sg_is_float(dtype)) return SG_EDTYPE;
    if (n <= 0) return SG_OK;
    out += oo * sg_itemsize(dtype);
    const int T = sg_threads_for(n, dist == DIST_NORMAL ? 4096 : 16384);
    if (T < 2) {
        fill_range(dist, dtype, out, 0, n, a, b, seed, offset);
        return SG_OK;
    }
#pragma omp parallel num_threads(T)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        fill_range(dist, dtype, out, sg_chunk(n, t, nt), sg_chunk(n, t + 1, nt), a, b, seed, offset);
    }
    return SG_OK;
}

int sg_random_uniform(int dtype, char *out, int64_t oo, int64_t n, double low, double high, uint64_t seed,
                      uint64_t offset) {
    return run(DIST_UNIFORM, dtype, out, oo, n, low, high, seed, offset);
}

int sg_random_normal(int dtype, char *out, int64_t oo, int64_t n, double mean, double std, uint64_t seed,
                     uint64_t offset) {
    return run(DIST_NORMAL, dtype, out, oo, n, mean, std, seed, offset);
}

int sg_random_bernoulli(int dtype, char *out, int64_t oo, int64_t n, double p, uint64_t seed, uint64_t offset) {
    return run(DIST_BERNOULLI, dtype, out, oo, n, p, 0.0, seed, offset);
}
