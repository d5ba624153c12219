"""cffi (ABI mode) bindings of the OpenCL 1.2 API subset this backend uses, loaded through the ICD loader.

Nothing is compiled: the declarations below are matched against `libOpenCL.so.1` at import time. When the loader is
missing, `lib` is None and `load_error` says why; the backend then reports no devices instead of failing `import singa`.

`clSetKernelArg` and `clEnqueueFillBuffer` take their values as `const char *`, so a `bytes` object (from
`struct.pack`) can be handed over without allocating a cdata: OpenCL copies the value during the call. Buffers keep
the bytes of their `cl_mem` pointer for the same reason (`device.ClBuffer.arg`).
"""

from __future__ import annotations

import ctypes.util
import os

from cffi import FFI

ffi = FFI()
ffi.cdef("""
typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef uint64_t cl_ulong;
typedef cl_uint cl_bool;
typedef cl_ulong cl_bitfield;
typedef cl_bitfield cl_device_type;
typedef cl_uint cl_platform_info;
typedef cl_uint cl_device_info;
typedef cl_bitfield cl_command_queue_properties;
typedef intptr_t cl_context_properties;
typedef cl_bitfield cl_mem_flags;
typedef cl_uint cl_program_info;
typedef cl_uint cl_program_build_info;
typedef cl_uint cl_kernel_work_group_info;
typedef cl_uint cl_profiling_info;

typedef struct _cl_platform_id *cl_platform_id;
typedef struct _cl_device_id *cl_device_id;
typedef struct _cl_context *cl_context;
typedef struct _cl_command_queue *cl_command_queue;
typedef struct _cl_mem *cl_mem;
typedef struct _cl_program *cl_program;
typedef struct _cl_kernel *cl_kernel;
typedef struct _cl_event *cl_event;

cl_int clGetPlatformIDs(cl_uint num_entries, cl_platform_id *platforms, cl_uint *num_platforms);
cl_int clGetPlatformInfo(cl_platform_id platform, cl_platform_info param_name, size_t param_value_size,
                         void *param_value, size_t *param_value_size_ret);
cl_int clGetDeviceIDs(cl_platform_id platform, cl_device_type device_type, cl_uint num_entries,
                      cl_device_id *devices, cl_uint *num_devices);
cl_int clGetDeviceInfo(cl_device_id device, cl_device_info param_name, size_t param_value_size, void *param_value,
                       size_t *param_value_size_ret);

cl_context clCreateContext(const cl_context_properties *properties, cl_uint num_devices, const cl_device_id *devices,
                           void *pfn_notify, void *user_data, cl_int *errcode_ret);
cl_int clReleaseContext(cl_context context);
cl_command_queue clCreateCommandQueue(cl_context context, cl_device_id device, cl_command_queue_properties properties,
                                      cl_int *errcode_ret);
cl_int clReleaseCommandQueue(cl_command_queue command_queue);
cl_int clFinish(cl_command_queue command_queue);
cl_int clFlush(cl_command_queue command_queue);

cl_mem clCreateBuffer(cl_context context, cl_mem_flags flags, size_t size, void *host_ptr, cl_int *errcode_ret);
cl_int clReleaseMemObject(cl_mem memobj);
cl_int clEnqueueReadBuffer(cl_command_queue command_queue, cl_mem buffer, cl_bool blocking_read, size_t offset,
                           size_t size, void *ptr, cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                           cl_event *event);
cl_int clEnqueueWriteBuffer(cl_command_queue command_queue, cl_mem buffer, cl_bool blocking_write, size_t offset,
                            size_t size, const void *ptr, cl_uint num_events_in_wait_list,
                            const cl_event *event_wait_list, cl_event *event);
cl_int clEnqueueCopyBuffer(cl_command_queue command_queue, cl_mem src_buffer, cl_mem dst_buffer, size_t src_offset,
                           size_t dst_offset, size_t size, cl_uint num_events_in_wait_list,
                           const cl_event *event_wait_list, cl_event *event);
cl_int clEnqueueFillBuffer(cl_command_queue command_queue, cl_mem buffer, const char *pattern, size_t pattern_size,
                           size_t offset, size_t size, cl_uint num_events_in_wait_list,
                           const cl_event *event_wait_list, cl_event *event);

cl_program clCreateProgramWithSource(cl_context context, cl_uint count, const char **strings, const size_t *lengths,
                                     cl_int *errcode_ret);
cl_program clCreateProgramWithBinary(cl_context context, cl_uint num_devices, const cl_device_id *device_list,
                                     const size_t *lengths, const unsigned char **binaries, cl_int *binary_status,
                                     cl_int *errcode_ret);
cl_int clBuildProgram(cl_program program, cl_uint num_devices, const cl_device_id *device_list, const char *options,
                      void *pfn_notify, void *user_data);
cl_int clGetProgramInfo(cl_program program, cl_program_info param_name, size_t param_value_size, void *param_value,
                        size_t *param_value_size_ret);
cl_int clGetProgramBuildInfo(cl_program program, cl_device_id device, cl_program_build_info param_name,
                             size_t param_value_size, void *param_value, size_t *param_value_size_ret);
cl_int clReleaseProgram(cl_program program);

cl_kernel clCreateKernel(cl_program program, const char *kernel_name, cl_int *errcode_ret);
cl_int clReleaseKernel(cl_kernel kernel);
cl_int clSetKernelArg(cl_kernel kernel, cl_uint arg_index, size_t arg_size, const char *arg_value);
cl_int clGetKernelWorkGroupInfo(cl_kernel kernel, cl_device_id device, cl_kernel_work_group_info param_name,
                                size_t param_value_size, void *param_value, size_t *param_value_size_ret);
cl_int clEnqueueNDRangeKernel(cl_command_queue command_queue, cl_kernel kernel, cl_uint work_dim,
                              const size_t *global_work_offset, const size_t *global_work_size,
                              const size_t *local_work_size, cl_uint num_events_in_wait_list,
                              const cl_event *event_wait_list, cl_event *event);
cl_int clWaitForEvents(cl_uint num_events, const cl_event *event_list);
cl_int clReleaseEvent(cl_event event);
cl_int clGetEventProfilingInfo(cl_event event, cl_profiling_info param_name, size_t param_value_size,
                               void *param_value, size_t *param_value_size_ret);
""")

# -- constants (OpenCL 1.2 cl.h) ------------------------------------------------------------------------------------
CL_SUCCESS = 0
CL_PLATFORM_PROFILE, CL_PLATFORM_VERSION, CL_PLATFORM_NAME, CL_PLATFORM_VENDOR, CL_PLATFORM_EXTENSIONS = range(
    0x0900, 0x0905)
CL_DEVICE_TYPE_DEFAULT, CL_DEVICE_TYPE_CPU, CL_DEVICE_TYPE_GPU, CL_DEVICE_TYPE_ACCELERATOR = 1, 2, 4, 8
CL_DEVICE_TYPE_ALL = 0xFFFFFFFF
CL_DEVICE_TYPE = 0x1000
CL_DEVICE_MAX_COMPUTE_UNITS = 0x1002
CL_DEVICE_MAX_WORK_GROUP_SIZE = 0x1004
CL_DEVICE_MAX_CLOCK_FREQUENCY = 0x100C
CL_DEVICE_MAX_MEM_ALLOC_SIZE = 0x1010
CL_DEVICE_MAX_PARAMETER_SIZE = 0x1017
CL_DEVICE_GLOBAL_MEM_SIZE = 0x101F
CL_DEVICE_LOCAL_MEM_SIZE = 0x1023
CL_DEVICE_NAME = 0x102B
CL_DEVICE_VENDOR = 0x102C
CL_DRIVER_VERSION = 0x102D
CL_DEVICE_PROFILE = 0x102E
CL_DEVICE_VERSION = 0x102F
CL_DEVICE_EXTENSIONS = 0x1030
CL_DEVICE_OPENCL_C_VERSION = 0x103D
CL_CONTEXT_PLATFORM = 0x1084
CL_QUEUE_PROFILING_ENABLE = 1 << 1
CL_MEM_READ_WRITE = 1 << 0
CL_PROGRAM_BINARY_SIZES = 0x1165
CL_PROGRAM_BINARIES = 0x1166
CL_PROGRAM_BUILD_LOG = 0x1183
CL_KERNEL_WORK_GROUP_SIZE = 0x11B0
CL_PROFILING_COMMAND_START, CL_PROFILING_COMMAND_END = 0x1282, 0x1283
CL_TRUE, CL_FALSE = 1, 0

ERRORS = {
    -1: "CL_DEVICE_NOT_FOUND", -2: "CL_DEVICE_NOT_AVAILABLE", -3: "CL_COMPILER_NOT_AVAILABLE",
    -4: "CL_MEM_OBJECT_ALLOCATION_FAILURE", -5: "CL_OUT_OF_RESOURCES", -6: "CL_OUT_OF_HOST_MEMORY",
    -7: "CL_PROFILING_INFO_NOT_AVAILABLE", -8: "CL_MEM_COPY_OVERLAP", -11: "CL_BUILD_PROGRAM_FAILURE",
    -12: "CL_MAP_FAILURE", -13: "CL_MISALIGNED_SUB_BUFFER_OFFSET", -14: "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST",
    -15: "CL_COMPILE_PROGRAM_FAILURE", -17: "CL_LINK_PROGRAM_FAILURE", -30: "CL_INVALID_VALUE",
    -31: "CL_INVALID_DEVICE_TYPE", -32: "CL_INVALID_PLATFORM", -33: "CL_INVALID_DEVICE", -34: "CL_INVALID_CONTEXT",
    -35: "CL_INVALID_QUEUE_PROPERTIES", -36: "CL_INVALID_COMMAND_QUEUE", -37: "CL_INVALID_HOST_PTR",
    -38: "CL_INVALID_MEM_OBJECT", -42: "CL_INVALID_BINARY", -43: "CL_INVALID_BUILD_OPTIONS",
    -44: "CL_INVALID_PROGRAM", -45: "CL_INVALID_PROGRAM_EXECUTABLE", -46: "CL_INVALID_KERNEL_NAME",
    -47: "CL_INVALID_KERNEL_DEFINITION", -48: "CL_INVALID_KERNEL", -49: "CL_INVALID_ARG_INDEX",
    -50: "CL_INVALID_ARG_VALUE", -51: "CL_INVALID_ARG_SIZE", -52: "CL_INVALID_KERNEL_ARGS",
    -53: "CL_INVALID_WORK_DIMENSION", -54: "CL_INVALID_WORK_GROUP_SIZE", -55: "CL_INVALID_WORK_ITEM_SIZE",
    -56: "CL_INVALID_GLOBAL_OFFSET", -57: "CL_INVALID_EVENT_WAIT_LIST", -58: "CL_INVALID_EVENT",
    -59: "CL_INVALID_OPERATION", -61: "CL_INVALID_BUFFER_SIZE", -63: "CL_INVALID_GLOBAL_WORK_SIZE",
    -64: "CL_INVALID_PROPERTY", -1001: "CL_PLATFORM_NOT_FOUND_KHR (the ICD loader found no OpenCL platform)",
}


class CLError(RuntimeError):
    """An OpenCL call returned an error code."""

    def __init__(self, code: int, what: str):
        self.code = code
        super().__init__(f"{what} failed: {ERRORS.get(code, 'unknown error')} ({code})")


def check(code: int, what: str) -> None:
    if code != CL_SUCCESS:
        if code in (-4, -6):  # allocation failures: the pool frees its cache and retries on MemoryError
            raise MemoryError(f"{what} failed: {ERRORS[code]} ({code})")
        raise CLError(code, what)


def _candidates() -> list[str]:
    override = os.environ.get("SINGA_OPENCL_LIBRARY")
    if override:
        return [override]
    names = ["libOpenCL.so.1", "libOpenCL.so"]
    found = ctypes.util.find_library("OpenCL")
    if found and found not in names:
        names.append(found)
    return names


def _load():
    errors = []
    for name in _candidates():
        try:
            return ffi.dlopen(name), None
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    return None, ("the OpenCL ICD loader could not be loaded (" + "; ".join(errors) + "); install it, e.g. "
                  "`apt-get install ocl-icd-libopencl1 pocl-opencl-icd`")


lib, load_error = _load()


# -- small helpers around the info queries ----------------------------------------------------------------------------


def platforms() -> list:
    """Every platform the ICD loader knows; [] when there is none (or no loader)."""
    if lib is None:
        return []
    n = ffi.new("cl_uint *")
    code = lib.clGetPlatformIDs(0, ffi.NULL, n)
    if code == -1001 or n[0] == 0:  # CL_PLATFORM_NOT_FOUND_KHR: loader present, no ICD installed
        return []
    check(code, "clGetPlatformIDs")
    ids = ffi.new("cl_platform_id[]", n[0])
    check(lib.clGetPlatformIDs(n[0], ids, ffi.NULL), "clGetPlatformIDs")
    return [ids[i] for i in range(n[0])]


def platform_str(pid, param: int) -> str:
    size = ffi.new("size_t *")
    check(lib.clGetPlatformInfo(pid, param, 0, ffi.NULL, size), "clGetPlatformInfo")
    buf = ffi.new("char[]", size[0] + 1)
    check(lib.clGetPlatformInfo(pid, param, size[0], buf, ffi.NULL), "clGetPlatformInfo")
    return ffi.string(buf).decode(errors="replace").strip()


def devices(pid, kind: int = CL_DEVICE_TYPE_ALL) -> list:
    n = ffi.new("cl_uint *")
    code = lib.clGetDeviceIDs(pid, kind, 0, ffi.NULL, n)
    if code == -1 or n[0] == 0:  # CL_DEVICE_NOT_FOUND
        return []
    check(code, "clGetDeviceIDs")
    ids = ffi.new("cl_device_id[]", n[0])
    check(lib.clGetDeviceIDs(pid, kind, n[0], ids, ffi.NULL), "clGetDeviceIDs")
    return [ids[i] for i in range(n[0])]


def device_str(did, param: int) -> str:
    size = ffi.new("size_t *")
    check(lib.clGetDeviceInfo(did, param, 0, ffi.NULL, size), "clGetDeviceInfo")
    buf = ffi.new("char[]", size[0] + 1)
    check(lib.clGetDeviceInfo(did, param, size[0], buf, ffi.NULL), "clGetDeviceInfo")
    return ffi.string(buf).decode(errors="replace").strip()


def device_int(did, param: int, ctype: str = "cl_ulong") -> int:
    out = ffi.new(f"{ctype} *")
    check(lib.clGetDeviceInfo(did, param, ffi.sizeof(ctype), out, ffi.NULL), "clGetDeviceInfo")
    return int(out[0])
