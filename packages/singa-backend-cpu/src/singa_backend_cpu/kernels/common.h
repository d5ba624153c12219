/* Shared definitions of the CPU kernels: dtype codes, float16 conversion, thread splitting, a vectorisable expf.
 *
 * Every kernel takes raw `char *` buffers plus element offsets, the way the Python side holds them (cffi handles), and
 * returns an SG_* status code where it can fail. Buffers are never assumed to be aligned beyond their element size.
 * Floating-point kernels are written once for float and double (real.h); float16 is computed through float copies.
 */
#ifndef SINGA_CPU_COMMON_H
#define SINGA_CPU_COMMON_H

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

#include "api.h"

typedef _Float16 sg_half;

/* dtype codes: the same numbers as singa.dtypes */
enum { SG_F32 = 0, SG_F16 = 1, SG_I32 = 2, SG_I64 = 3, SG_BOOL = 4, SG_F64 = 5 };

static inline int sg_itemsize(int dtype) {
    switch (dtype) {
    case SG_F16: return 2;
    case SG_I64: case SG_F64: return 8;
    case SG_BOOL: return 1;
    default: return 4;
    }
}

static inline int sg_is_float(int dtype) { return dtype == SG_F32 || dtype == SG_F16 || dtype == SG_F64; }

/* status codes returned to Python (table.py turns them into exceptions) */
enum { SG_OK = 0, SG_ENOMEM = 1, SG_EDTYPE = 2, SG_EINDEX = 3, SG_EVALUE = 4 };

/* Below these many elements a loop stays on the calling thread: waking the pool costs more than it saves. */
#define SG_PAR_CHEAP 65536
#define SG_PAR_COSTLY 8192

/* Elements per block when float16 data is converted to float for computing (fits L1 with a few operands). */
#define SG_BLK 512

/* Threads the kernels use: set by sg_set_num_threads (memory.c) for every calling thread alike, unlike
 * omp_set_num_threads, which only changes the caller's own setting. 0 until set: then OpenMP's default. */
extern int sg_nthreads;
/* Non-zero in the one thread whose OpenMP workers sg_pin_workers pinned (memory.c): before its kernels fork, it moves
 * off a worker's CPU should the scheduler have put it there. */
extern __thread int sg_pin_owner;
void sg_keep_apart(void);
static inline int sg_max_threads(void) {
    if (sg_pin_owner) sg_keep_apart();
    return sg_nthreads > 0 ? sg_nthreads : omp_get_max_threads();
}

static inline int64_t sg_min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t sg_max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Start of thread t's share of n items split over T threads, rounded to 16 items so threads never share a cache line. */
static inline int64_t sg_chunk(int64_t n, int t, int T) {
    if (t >= T) return n;
    int64_t c = (int64_t)((__int128)n * t / T);
    return t == 0 ? 0 : (c & ~(int64_t)15);
}

/* Threads worth using for `work` items when each thread should get at least `grain` of them. */
static inline int sg_threads_for(int64_t work, int64_t grain) {
    if (work < 2 * grain) return 1;
    int T = sg_max_threads();
    int64_t useful = work / grain;
    return useful < T ? (int)useful : T;
}

/* Chunk of a split loop: about 8 per thread, never below half the loop's parallel threshold, whole cache lines. */
static inline int64_t sg_dyn_chunk(int64_t n, int T, int64_t thresh) {
    int64_t c = n / (8 * (int64_t)T);
    if (c < thresh / 2) c = thresh / 2;
    return (c + 63) & ~(int64_t)63;
}

/* Run CALL over [lo_, hi_) ranges of n items: on this thread when small, else in chunks handed out to the OpenMP pool
 * as threads come free, so that a thread the OS has descheduled does not hold up the whole loop (element-wise results
 * do not depend on which thread computes them). */
#define SG_SPLIT(n, thresh, CALL)                                                                   \
    do {                                                                                            \
        int64_t n_ = (n);                                                                           \
        int T_ = n_ < (thresh) ? 1 : sg_max_threads();                                              \
        if (T_ < 2) {                                                                               \
            int64_t lo_ = 0, hi_ = n_;                                                              \
            CALL;                                                                                   \
        } else {                                                                                    \
            const int64_t ch_ = sg_dyn_chunk(n_, T_, (thresh)), nc_ = (n_ + ch_ - 1) / ch_;         \
            _Pragma("omp parallel for schedule(dynamic, 1) num_threads(T_)")                        \
            for (int64_t c_ = 0; c_ < nc_; c_++) {                                                  \
                int64_t lo_ = c_ * ch_, hi_ = sg_min64(n_, lo_ + ch_);                              \
                CALL;                                                                               \
            }                                                                                       \
        }                                                                                           \
    } while (0)

/* -- the strided element-wise driver (elementwise.c) ------------------------------------------------------------
 * A kernel over operands of any strides is a row function applied along the innermost axis: p[k] points at operand
 * k's first element of the row (operand 0 is the output), st[k] is its stride in elements there, ctx the kernel's
 * parameters. The driver walks the outer axes and spreads rows over threads when there are at least `thresh` elements.
 * dims: shape[ndim], then the strides[ndim] of each of the nops operands, in elements.
 */
typedef void (*sg_row_fn)(int64_t n, char *const *p, const int64_t *st, const void *ctx);
void sg_strided_run(int nops, const int *itemsizes, int ndim, const int64_t *dims, char *const *base, sg_row_fn row,
                    const void *ctx, int64_t thresh);

/* -- float32 and float64 products (gemm.c, gemm_real.h) ---------------------------------------------------------
 * Row-major C = alpha op(A) op(B) + beta C through OpenBLAS sgemm / dgemm (sgemv / dgemv when a block is one row or
 * column: gemm reaches a quarter of the memory speed there). OpenBLAS is kept at one thread and this
 * backend splits products over its own OpenMP threads instead: one pool for every kernel, so that OpenBLAS's workers
 * and OpenMP's never compete for the cores (on a busy machine that competition made each mid-sized product wait for a
 * scheduler slice). `may_split` = 0 when the caller already runs on one of several threads. */
void sg_gemm_f32(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                 const float *b, int64_t ldb, float beta, float *c, int64_t ldc, int may_split);
/* c (m x n) = a (m x k) @ b (k x n), row-major and dense, on the calling thread (a parallel region's member): the
 * outside GEMM (gemm.c's sg_set_sgemm: oneDNN's sgemm) where one is set, else OpenBLAS. */
void sg_gemm_f32_on_thread(int64_t m, int64_t n, int64_t k, const float *a, const float *b, float *c);
/* the same product split over the threads (the caller runs outside any parallel region) */
void sg_gemm_f32_team(int64_t m, int64_t n, int64_t k, const float *a, const float *b, float *c);
void sg_gemm_f64(int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha, const double *a, int64_t lda,
                 const double *b, int64_t ldb, double beta, double *c, int64_t ldc, int may_split);

/* -- float16 <-> float in bulk (GCC 12 does not vectorise _Float16 conversions itself) ------------------------- */
static inline void sg_h2f(const sg_half *src, float *dst, int64_t n) {
    int64_t i = 0;
#ifdef __F16C__
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
    for (; i < n; i++) dst[i] = (float)src[i];
}

static inline void sg_f2h(const float *src, sg_half *dst, int64_t n) {
    int64_t i = 0;
#ifdef __F16C__
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < n; i++) dst[i] = (sg_half)src[i];
}

/* A float copy of n elements of a float32 or float16 buffer; float32 input is returned as is (owned = 0). */
static inline float *sg_as_f32(const char *p, int dtype, int64_t n, int *owned) {
    if (dtype == SG_F32) {
        *owned = 0;
        return (float *)p;
    }
    float *t = (float *)malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    *owned = 1;
    if (t) sg_h2f((const sg_half *)p, t, n);
    return t;
}

/* Scalar load/store of one element of a float32, float16 or float64 buffer (per-channel parameters and the like);
 * a store rounds once, from double into the buffer's dtype. */
static inline double sg_ldf(const char *p, int dtype, int64_t i) {
    switch (dtype) {
    case SG_F16: return (double)((const sg_half *)p)[i];
    case SG_F64: return ((const double *)p)[i];
    default: return (double)((const float *)p)[i];
    }
}

static inline void sg_stf(char *p, int dtype, int64_t i, double v) {
    switch (dtype) {
    case SG_F16: ((sg_half *)p)[i] = (sg_half)v; break;
    case SG_F64: ((double *)p)[i] = v; break;
    default: ((float *)p)[i] = (float)v;
    }
}

/* -- expf that the compiler can vectorise -------------------------------------------------------------------------
 * glibc's expf is a scalar call, so loops over it never vectorise without -ffast-math. This is the classic
 * Cody-Waite reduction x = k ln2 + r with a degree-6 polynomial for e^r (max error about 1 ulp over the whole range),
 * scaled by 2^k in two steps so that subnormal results are rounded once. inf, -inf, NaN and overflow behave like expf.
 */
/* e^v = sg_exp_reduced(v, &k) * 2^k for v in [-104, 89], k integral: the reduction and the polynomial, shared by
 * sg_vexpf and the helpers that scale by 2^k themselves */
static inline float sg_exp_reduced(float v, float *k) {
    /* round to nearest with the 1.5 * 2^23 trick (exact for |v| < 2^22; vectorises, unlike rintf without SSE4.1) */
    const float kv = (v * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = v - kv * 0.693359375f;
    r = r + kv * 2.12194440e-4f;
    const float r2 = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    *k = kv;
    return p * r2 + r + 1.0f;
}

static inline float sg_vexpf(float x) {
    float xc = x > 89.0f ? 89.0f : x;
    xc = xc < -104.0f ? -104.0f : xc;
    xc = xc != xc ? 0.0f : xc;
    float k;
    const float p = sg_exp_reduced(xc, &k);
    const int32_t ki = (int32_t)k;
    const int32_t k1 = ki >> 1, k2 = ki - k1;
    union { int32_t i; float f; } s1, s2;
    s1.i = (k1 + 127) << 23;
    s2.i = (k2 + 127) << 23;
    float res = (p * s1.f) * s2.f;
    res = x < -103.972084f ? 0.0f : res;
    return x != x ? x : res;
}

/* -- erff that the compiler can vectorise -------------------------------------------------------------------------
 * glibc's erff is a scalar call (about 4 ns an element: GELU-heavy models spent a fifth of their time in it). Two
 * least-squares fits in float64, evaluated in float32: erf(x) = x P(x^2) for |x| < 0.921875 (degree 6 in x^2), and
 * erf(x) = 1 - exp(Q(|x|)) above, Q (degree 10) fitting log(erfc(x)) up to 3.9375, where erf rounds to 1 in float32.
 * Max error 2.4 ulp (relative 1.8e-7) over the float32 range, checked against math.erf in the CPU kernel tests.
 */
static inline float sg_verff(float x) {
    const float a = x < 0.0f ? -x : x;
    const float t = a * a;
    float p = 8.3650086312e-05f;
    p = p * t + -8.1413949613e-04f;
    p = p * t + 5.2009057841e-03f;
    p = p * t + -2.6859341780e-02f;
    p = p * t + 1.1283694350e-01f;
    p = p * t + -3.7612633650e-01f;
    p = p * t + 1.1283791666e+00f;
    float q = -5.7482502936e-08f;
    q = q * a + 1.3691623976e-06f;
    q = q * a + -1.2710593780e-05f;
    q = q * a + 4.0960657756e-05f;
    q = q * a + 2.5884514152e-04f;
    q = q * a + -3.8819447239e-03f;
    q = q * a + 2.4878363280e-02f;
    q = q * a + -1.0826757960e-01f;
    q = q * a + -6.3318840538e-01f;
    q = q * a + -1.1296415258e+00f;
    q = q * a + 2.0717326522e-04f;
    const float small = a * p;
    const float big = 1.0f - sg_vexpf(q);
    const float r = a < 0.921875f ? small : (a < 3.9375f ? big : 1.0f);
    return x != x ? x : copysignf(r, x);
}

/* -- GELU that the compiler can vectorise --------------------------------------------------------------------------
 * gelu(x) = x Phi(x), with Phi(x) = erfc(-x/sqrt2) / 2 from one erfc of a = |x|/sqrt2: erfc(a) = t exp(P(t) - a^2),
 * t = 1 / (1 + a/2) (the Chebyshev fit of Numerical Recipes' erfcc, relative error under 1.2e-7 for every a >= 0).
 * Phi = 1 - erfc/2 for x >= 0 and erfc/2 below, so the negative tail keeps its relative precision, which
 * 0.5 x (1 + erf(x/sqrt2)) loses to cancellation (8e-5 relative near x = -6 through sg_verff, 4e-6 here). The exp
 * argument is never positive, so its 2^k needs no overflow care; below -87 (x under -13.1) the tail is flushed to a
 * signed 0: the results there are under 2e-38, at the edge of the subnormals. 1.7x as fast as the erf form (two
 * polynomials and a full expf, both computed for every element).
 */
static inline float sg_vgeluf(float x) {
    const float a = (x < 0.0f ? -x : x) * 0.70710678118654752f;
    const float t = 1.0f / (1.0f + 0.5f * a);
    float p = 0.17087277f;
    p = p * t - 0.82215223f;
    p = p * t + 1.48851587f;
    p = p * t - 1.13520398f;
    p = p * t + 0.27886807f;
    p = p * t - 0.18628806f;
    p = p * t + 0.09678418f;
    p = p * t + 0.37409196f;
    p = p * t + 1.00002368f;
    p = p * t - 1.26551223f;
    float v = p - a * a;
    const int gone = v < -87.0f;
    v = gone ? -87.0f : v;
    float k; /* e^v = q 2^k, 2^k in one step (k >= -126) */
    const float q = sg_exp_reduced(v, &k);
    union { int32_t i; float f; } s;
    s.i = ((int32_t)k + 127) << 23;
    const float h = gone ? 0.0f : (0.5f * t * q) * s.f; /* erfc(a) / 2 */
    return x * (x < 0.0f ? h : 1.0f - h);
}

/* -- tanhf that the compiler can vectorise ------------------------------------------------------------------------
 * glibc's tanhf is a scalar call (GPT-2's GELU spends most of its time there). tanh(x) = x P(x^2) for |x| < 0.625
 * (P of degree 5, a least-squares fit in float64), else 1 - 2 / (exp(2|x|) + 1) with sg_vexpf; the sign restored.
 * Max error about 2 ulp, checked against numpy's float64 tanh in the CPU kernel tests.
 */
static inline float sg_vtanhf(float x) {
    const float a = x < 0.0f ? -x : x;
    const float t = a * a;
    float p = -5.6523590724e-03f;
    p = p * t + 2.0583502860e-02f;
    p = p * t + -5.3718494286e-02f;
    p = p * t + 1.3331091354e-01f;
    p = p * t + -3.3333258744e-01f;
    p = p * t + 9.9999999594e-01f;
    const float small = a * p;
    const float e = sg_vexpf(a < 44.0f ? 2.0f * a : 88.0f);
    const float big = 1.0f - 2.0f / (e + 1.0f);
    const float r = a < 0.625f ? small : big;
    return x != x ? x : copysignf(r, x);
}

/* exp as the kernels written once per type (real.h) call it: SG_R(sg_exp) */
static inline float sg_exp_f32(float x) { return sg_vexpf(x); }
static inline double sg_exp_f64(double x) { return exp(x); }

#endif
