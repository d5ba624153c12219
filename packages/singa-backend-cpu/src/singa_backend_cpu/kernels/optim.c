/* Optimizer updates in one pass over a parameter's memory. SGD's momentum rule as two axpby passes reads the momentum
 * buffer from memory twice; here the weights read it from L1. float32 computes in float, as axpby does. */
#include "common.h"

#define SGD_BLOCK 512 /* elements: the buffer's new values are still in L1 when the weights read them */

/* the two passes block by block: each loop streams two inputs, as axpby does (one loop over all five streams ran
 * slower than the two axpby on a training step's cold operands) */
#define SGD_LOOP(T)                                                                                                 \
    for (int64_t b0 = lo; b0 < hi; b0 += SGD_BLOCK) {                                                               \
        const int64_t b1 = b0 + SGD_BLOCK < hi ? b0 + SGD_BLOCK : hi;                                               \
        _Pragma("omp simd") for (int64_t i = b0; i < b1; i++) buf[i] = mom * buf[i] + g[i];                         \
        _Pragma("omp simd") for (int64_t i = b0; i < b1; i++) w[i] = w[i] + neg_lr * buf[i];                        \
    }

static void sgd_f32(float *restrict w, float *restrict buf, const float *restrict g, float neg_lr, float mom,
                    int64_t lo, int64_t hi) {
    SGD_LOOP(float)
}

static void sgd_f64(double *restrict w, double *restrict buf, const double *restrict g, double neg_lr, double mom,
                    int64_t lo, int64_t hi) {
    SGD_LOOP(double)
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
