/* The CUDA prelude: prepended to every program of the CUDA backend (build.py), before the sources it shares with the
 * other GPU backends (the .cl files of singa/gpu/kernels and the element-wise programs of singa.gpu.codegen). Those are written in
 * the common subset of OpenCL C and CUDA C++; this file gives the OpenCL names their CUDA meaning. NVRTC compiles it
 * with -default-device, so the helpers' plain `inline` functions are device functions. No CUDA header is included:
 * float16 conversions are single PTX instructions, and the math functions are NVRTC's built-ins.
 *
 * Work-items are CUDA threads, work-groups blocks; `get_global_id(d)` counts across the grid as OpenCL does (the
 * launcher rounds the grid up to whole blocks and every kernel checks its range). Kernel parameters arrive packed
 * in one buffer (CU_LAUNCH_PARAM_BUFFER_POINTER) laid out like the OpenCL arguments, each aligned to its size.
 */
#define __kernel extern "C" __global__
#define __global
#define __constant const
#define SG_LOCAL
/* a scratch array sized at launch: a dummy 8-byte parameter (the launcher passes its byte size, which is also the
 * launch's dynamic shared memory), made into a pointer to that memory at the top of the kernel */
#define SG_LOCAL_ARG(T, name) const long long name##_bytes
#define SG_LOCAL_INIT(T, name) extern __shared__ long long sg_smem_[]; T *name = (T *)sg_smem_
#define SG_SHARED __shared__
#define SG_REQD_WG(x, y, z)
#define CLK_LOCAL_MEM_FENCE 1
#define barrier(flags) __syncthreads()

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef unsigned short half; /* float16 is stored as bits and computed in float, as on the OpenCL backend */

inline long get_global_id(int d) {
    return d == 0 ? (long)blockIdx.x * blockDim.x + threadIdx.x
                  : d == 1 ? (long)blockIdx.y * blockDim.y + threadIdx.y : (long)blockIdx.z * blockDim.z + threadIdx.z;
}
inline long get_group_id(int d) { return d == 0 ? blockIdx.x : d == 1 ? blockIdx.y : blockIdx.z; }
inline int get_local_id(int d) { return d == 0 ? threadIdx.x : d == 1 ? threadIdx.y : threadIdx.z; }
inline int get_local_size(int d) { return d == 0 ? blockDim.x : d == 1 ? blockDim.y : blockDim.z; }

#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
#define INT_MAX 2147483647
#define LONG_MAX 9223372036854775807L
#define LONG_MIN (-LONG_MAX - 1L)
#define M_PI 3.14159265358979323846
#define M_PI_F 3.14159265358979323846f

/* float16 <-> float / double: round to nearest even, one rounding (cvt.rn) */
inline float sg_h2f(ushort h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
inline ushort sg_f2h(float f) {
    ushort h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
inline ushort sg_d2h(double d) {
    ushort h;
    asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d));
    return h;
}
inline float vload_half(long i, const half *p) { return sg_h2f(p[i]); }
inline void vstore_half_rte(float v, long i, half *p) { p[i] = sg_f2h(v); }
inline void vstore_half_rte(double v, long i, half *p) { p[i] = sg_d2h(v); }

inline uint mul_hi(uint a, uint b) { return __umulhi(a, b); }
inline uint as_uint(float f) { return __float_as_uint(f); }
inline float as_float(uint u) { return __uint_as_float(u); }
#define atomic_cmpxchg(p, cmp, val) atomicCAS((unsigned int *)(p), (cmp), (val))
#define atomic_add(p, v) atomicAdd((int *)(p), (v))
#define atom_add(p, v) atomicAdd((unsigned long long *)(p), (unsigned long long)(v))
#define atomic_min(p, v) atomicMin((int *)(p), (v))

/* the GPU's double precision is exact IEEE: accumulators and the float parameters of integer kernels are double,
 * as on the CPU backend */
#define SG_FP64 1
#define SG_INT64_ATOMICS 1
typedef double sg_acc;

