/* Optimizer updates in one kernel over a parameter's memory. SGD's momentum rule as two axpby passes reads the
 * momentum buffer from memory twice; here the weights read it from L1. float32 computes in float, as axpby does. */
#include <float.h>

#include "common.h"

#define SGD_BLOCK 512 /* elements: the buffer's new values are still in L1 when the weights read them */

/* The two passes block by block: each loop streams two inputs, as axpby does (one loop over all five streams ran
 * slower than the two axpby on a training step's cold operands).
 * A buffer element whose gradient stays exactly 0 (the weights of an image's always-blank border pixels) decays as
 * momentum^k and turns subnormal after about 850 steps at 0.9, from which point every update of it takes the CPU's
 * slow subnormal path (an MLP's first-layer update ran 5x slower). Below the smallest normal number it is flushed to
 * 0: the weight step it would have made, lr * 1e-38, is below any normal weight's resolution. */
#define SGD_LOOP(T, TINY)                                                                                           \
    for (int64_t b0 = lo; b0 < hi; b0 += SGD_BLOCK) {                                                               \
        const int64_t b1 = b0 + SGD_BLOCK < hi ? b0 + SGD_BLOCK : hi;                                               \
        _Pragma("omp simd") for (int64_t i = b0; i < b1; i++) {                                                     \
            const T b = mom * buf[i] + g[i];                                                                        \
            buf[i] = (b < TINY && b > -TINY) ? (T)0 : b;                                                            \
        }                                                                                                           \
        _Pragma("omp simd") for (int64_t i = b0; i < b1; i++) w[i] = w[i] + neg_lr * buf[i];                        \
    }

static void sgd_f32(float *restrict w, float *restrict buf, const float *restrict g, float neg_lr, float mom,
                    int64_t lo, int64_t hi) {
    SGD_LOOP(float, FLT_MIN)
}

static void sgd_f64(double *restrict w, double *restrict buf, const double *restrict g, double neg_lr, double mom,
                    int64_t lo, int64_t hi) {
    SGD_LOOP(double, DBL_MIN)
}

int sg_sgd_momentum(int dtype, char *w, int64_t wo, char *buf, int64_t bo, const char *g, int64_t go, int64_t n,
                    double lr, double momentum) {
    if (dtype == SG_F32) {
        float *W = (float *)w + wo, *B = (float *)buf + bo;
        const float *G = (const float *)g + go;
        const float nl = (float)-lr, m = (float)momentum;
        SG_SPLIT(n, SG_PAR_CHEAP, sgd_f32(W, B, G, nl, m, lo_, hi_));
        return SG_OK;
    }
    if (dtype == SG_F64) {
        double *W = (double *)w + wo, *B = (double *)buf + bo;
        const double *G = (const double *)g + go;
        SG_SPLIT(n, SG_PAR_CHEAP, sgd_f64(W, B, G, -lr, momentum, lo_, hi_));
        return SG_OK;
    }
    return SG_EDTYPE;
}
