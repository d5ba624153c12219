/* Floating-point kernels are written once and compiled for float (float32) and double (float64).
 *
 * A family keeps them in <family>_real.h, in terms of
 *     sg_real      the element type
 *     SG_R(name)   `name` with the type's suffix: name_f32 or name_f64
 * and its .c file, after the type-independent helpers, instantiates both:
 *     #define SG_REAL_TEMPLATE "conv_real.h"
 *     #include "real.h"
 * What differs between the types is an SG_R()-named function or macro too (sg_exp_f32 / sg_exp_f64 in common.h,
 * blas_gemm_f32 / blas_gemm_f64 in gemm.c). float16 data goes through the float32 instance on converted copies.
 * No include guard: each inclusion instantiates SG_REAL_TEMPLATE again.
 */
#define sg_real float
#define SG_R(name) name##_f32
#include SG_REAL_TEMPLATE
#undef sg_real
#undef SG_R

#define sg_real double
#define SG_R(name) name##_f64
#include SG_REAL_TEMPLATE
#undef sg_real
#undef SG_R

#undef SG_REAL_TEMPLATE
