/* The OpenCL prelude: prepended to every program of the OpenCL backend (device.py), before the sources it shares
 * with the other GPU backends (singa/gpu/kernels/*.cl and the element-wise programs of singa.gpu.codegen), which are
 * written in the common subset of OpenCL C and CUDA C++ completed by the macros below.
 *
 * Buffers are whole cl_mem objects; every kernel takes the element offset of each view as a `long` argument instead
 * of a sub-buffer (sub-buffers must start on CL_DEVICE_MEM_BASE_ADDR_ALIGN, views start anywhere).
 * float16 lives in memory as `half` and is computed in float through vload_half / vstore_half_rte, which are core
 * OpenCL C (no cl_khr_fp16 needed). SG_FP64 is defined when the device has cl_khr_fp64: accumulators, random numbers
 * and float parameters of integer kernels then use double like the CPU backend; otherwise float.
 */
#ifdef SG_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef double sg_acc;  /* accumulator of float reductions and float parameters of integer kernels */
#else
typedef float sg_acc;
#endif
#ifdef SG_INT64_ATOMICS
#pragma OPENCL EXTENSION cl_khr_int64_base_atomics : enable
#endif

/* work-group memory: a helper's pointer parameter, a kernel's scratch array sized at launch (a __local parameter,
 * named by SG_LOCAL_ARG and made usable by SG_LOCAL_INIT at the top of the body), a fixed-size array in a kernel */
#define SG_LOCAL __local
#define SG_LOCAL_ARG(T, name) __local T *name
#define SG_LOCAL_INIT(T, name)
#define SG_SHARED __local
#define SG_REQD_WG(x, y, z) __attribute__((reqd_work_group_size(x, y, z)))
