/* The vectors of the hand-vectorised float32 kernels (winograd.c, conv.c's blocked unfolding): VW floats, one
 * AVX-512 register (16) or one AVX register (8; two SSE ones on the baseline path), in GCC's vector extension. */
#ifndef SINGA_CPU_VEC_H
#define SINGA_CPU_VEC_H

#include <stdint.h>

#pragma GCC diagnostic ignored "-Wpsabi" /* 32-byte vectors passed between static functions on the SSE path */

#ifdef __AVX512F__
#define VW 16
#else
#define VW 8
#endif
typedef float vec __attribute__((vector_size(VW * 4), aligned(VW * 4)));
typedef float vec_u __attribute__((vector_size(VW * 4), aligned(4))); /* an unaligned load or store */
typedef int32_t mask __attribute__((vector_size(VW * 4)));

/* max(v, 0) lane by lane, NaN kept (as the relu kernel) */
static inline vec relu_of(vec v) { return (vec)((mask)v & ((v > 0.f) | (v != v))); }

/* r[p][l] = r[l][p] over VW vectors: log2(VW) rounds that swap ever smaller off-diagonal blocks. */
static inline void transpose(vec r[VW]) {
#if VW == 16
    static const mask lo[4] = {{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
                               {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
                               {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
                               {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}};
    static const mask hi[4] = {{8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31},
                               {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31},
                               {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
                               {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}};
#else
    static const mask lo[3] = {{0, 1, 2, 3, 8, 9, 10, 11}, {0, 1, 8, 9, 4, 5, 12, 13}, {0, 8, 2, 10, 4, 12, 6, 14}};
    static const mask hi[3] = {{4, 5, 6, 7, 12, 13, 14, 15}, {2, 3, 10, 11, 6, 7, 14, 15}, {1, 9, 3, 11, 5, 13, 7, 15}};
#endif
    for (int round = 0, s = VW / 2; s > 0; round++, s /= 2)
        for (int i = 0; i < VW; i++)
            if (!(i & s)) {
                const vec a = r[i], b = r[i + s];
                r[i] = __builtin_shuffle(a, b, lo[round]);
                r[i + s] = __builtin_shuffle(a, b, hi[round]);
            }
}

#endif
