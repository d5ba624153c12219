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

#define SG_MAXD 8 /* dimensions of a strided walk; table.py splits longer layouts */

/* a strided element-wise layout: the shape, then each operand's strides in elements (operand 0 is the output) */
typedef struct {
    long nd;
    long shape[SG_MAXD];
    long st[4][SG_MAXD];
} sg_dims;

/* element access by dtype: float16 through the core conversion built-ins, bool as uchar 0/1 */
#define SG_LD_F32(p, i) ((p)[i])
#define SG_ST_F32(p, i, v) ((p)[i] = (float)(v))
#define SG_LD_F16(p, i) vload_half((i), (p))
#define SG_ST_F16(p, i, v) vstore_half_rte((float)(v), (i), (p))
/* rounded once from the accumulator type (double with cl_khr_fp64), like the CPU backend's (_Float16)double */
#define SG_ST_F16_ACC(p, i, v) vstore_half_rte((sg_acc)(v), (i), (p))
#define SG_LD_F64(p, i) ((p)[i]) /* float64 programs are built only for devices with cl_khr_fp64 */
#define SG_ST_F64(p, i, v) ((p)[i] = (double)(v))
#define SG_LD_I32(p, i) ((p)[i])
#define SG_ST_I32(p, i, v) ((p)[i] = (int)(v))
#define SG_LD_I64(p, i) ((p)[i])
#define SG_ST_I64(p, i, v) ((p)[i] = (long)(v))
#define SG_LD_BOOL(p, i) ((int)((p)[i] != 0))
#define SG_ST_BOOL(p, i, v) ((p)[i] = (uchar)((v) != 0))

/* work-group memory: a helper's pointer parameter, a kernel's scratch array sized at launch (a __local parameter,
 * named by SG_LOCAL_ARG and made usable by SG_LOCAL_INIT at the top of the body), a fixed-size array in a kernel */
#define SG_LOCAL __local
#define SG_LOCAL_ARG(T, name) __local T *name
#define SG_LOCAL_INIT(T, name)
#define SG_SHARED __local
#define SG_REQD_WG(x, y, z) __attribute__((reqd_work_group_size(x, y, z)))
