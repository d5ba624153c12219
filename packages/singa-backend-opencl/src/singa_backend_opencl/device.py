"""The OpenCL device: cl_mem buffers from the core's MemoryPool, one in-order command queue, kernels from table.py.

Every command goes to one in-order queue, so a kernel always sees the results of the commands issued before it and a
buffer handed back to the pool can be reused at once: whatever touches it next is queued after its last user. Host
reads block (the data is complete when `read` returns) and host writes block too, since the caller's numpy array may
be gone as soon as we return. `synchronize()` is clFinish.

Device capabilities decide the dtypes: float32, int32, int64 and bool always; float16 where the device can convert
it (vload_half / vstore_half are core OpenCL C on full-profile devices; cl_khr_fp16 is not needed because float16 is
computed in float32, as the contract allows); float64 where the device has cl_khr_fp64 (SINGA_OPENCL_FP64=0 turns it
off). A kernel handed a dtype its device lacks raises `UnsupportedDtypeError` naming the device and the missing
extension.
"""

from __future__ import annotations

import os
import struct
import threading

import numpy as np

from singa import dtypes
from singa.backend import Device
from singa_backend_opencl import build, cl
from singa_backend_opencl.cl import ffi

_NULL = ffi.NULL
_PTR = ffi.sizeof("cl_mem")


class UnsupportedDtypeError(TypeError):
    """A dtype the device cannot compute (float16 without half conversions, float64 without cl_khr_fp64)."""


class ClBuffer:
    """A raw device allocation: the cl_mem, and the bytes of its pointer as clSetKernelArg wants them."""

    __slots__ = ("mem", "arg", "nbytes")

    def __init__(self, mem, nbytes: int):
        self.mem = mem
        self.arg = int(ffi.cast("uintptr_t", mem)).to_bytes(_PTR, "little")
        self.nbytes = nbytes

    def __repr__(self) -> str:
        return f"ClBuffer({self.nbytes} bytes)"


class DeviceInfo:
    """What the backend knows about one OpenCL device before opening it."""

    def __init__(self, platform_id, device_id):
        self.platform_id = platform_id
        self.device_id = device_id
        self.platform_name = cl.platform_str(platform_id, cl.CL_PLATFORM_NAME)
        self.platform_version = cl.platform_str(platform_id, cl.CL_PLATFORM_VERSION)
        self.name = cl.device_str(device_id, cl.CL_DEVICE_NAME)
        self.vendor = cl.device_str(device_id, cl.CL_DEVICE_VENDOR)
        self.driver = cl.device_str(device_id, cl.CL_DRIVER_VERSION)
        self.version = cl.device_str(device_id, cl.CL_DEVICE_VERSION)
        self.profile = cl.device_str(device_id, cl.CL_DEVICE_PROFILE)
        self.extensions = set(cl.device_str(device_id, cl.CL_DEVICE_EXTENSIONS).split())
        self.type = cl.device_int(device_id, cl.CL_DEVICE_TYPE)
        self.compute_units = cl.device_int(device_id, cl.CL_DEVICE_MAX_COMPUTE_UNITS, "cl_uint")
        self.max_work_group = cl.device_int(device_id, cl.CL_DEVICE_MAX_WORK_GROUP_SIZE, "size_t")
        self.global_mem = cl.device_int(device_id, cl.CL_DEVICE_GLOBAL_MEM_SIZE)
        self.max_alloc = cl.device_int(device_id, cl.CL_DEVICE_MAX_MEM_ALLOC_SIZE)
        self.local_mem = cl.device_int(device_id, cl.CL_DEVICE_LOCAL_MEM_SIZE)
        self.max_param = cl.device_int(device_id, cl.CL_DEVICE_MAX_PARAMETER_SIZE, "size_t")

    @property
    def kind(self) -> str:
        for bit, word in ((cl.CL_DEVICE_TYPE_GPU, "GPU"), (cl.CL_DEVICE_TYPE_ACCELERATOR, "accelerator"),
                          (cl.CL_DEVICE_TYPE_CPU, "CPU")):
            if self.type & bit:
                return word
        return "device"

    def fp16_missing(self) -> str | None:
        """None when float16 works, else why not. SINGA_OPENCL_FP16=0 turns it off (to test the error path)."""
        if os.environ.get("SINGA_OPENCL_FP16", "").strip() == "0":
            return "float16 is turned off by SINGA_OPENCL_FP16=0"
        if "cl_khr_fp16" in self.extensions or self.profile == "FULL_PROFILE":
            return None
        return f"the device lacks cl_khr_fp16 and is an {self.profile} device (no half conversions)"

    def fp64(self) -> bool:
        return "cl_khr_fp64" in self.extensions and os.environ.get("SINGA_OPENCL_FP64", "").strip() != "0"


class OpenclDevice(Device):
    backend_name = "opencl"

    def __init__(self, id: int, info: DeviceInfo):
        self.info = info
        err = ffi.new("cl_int *")
        props = ffi.new("cl_context_properties[]",
                        [cl.CL_CONTEXT_PLATFORM, int(ffi.cast("intptr_t", info.platform_id)), 0])
        self._device_ids = ffi.new("cl_device_id[1]", [info.device_id])
        self.context = cl.lib.clCreateContext(props, 1, self._device_ids, _NULL, _NULL, err)
        cl.check(err[0], f"clCreateContext({info.name})")
        # kept as a one-element array: CLBlast takes the queue by pointer
        self.queue_ptr = ffi.new("cl_command_queue *")
        self.queue_ptr[0] = cl.lib.clCreateCommandQueue(self.context, info.device_id, 0, err)
        cl.check(err[0], f"clCreateCommandQueue({info.name})")
        self.queue = self.queue_ptr[0]
        super().__init__(id)

        self.fp64 = info.fp64()
        self.fp16_reason = info.fp16_missing()
        self.int64_atomics = "cl_khr_int64_base_atomics" in info.extensions
        self.dtypes = (tuple(d for d in dtypes.ALL if d != dtypes.float16 or self.fp16_reason is None)
                       + ((dtypes.float64,) if self.fp64 else ()))
        # one work-group size for every 1-D launch: PoCL compiles a kernel once per local size, so it never varies
        self.wg = 1 << (int(min(256, info.max_work_group)).bit_length() - 1)  # a power of two: trees halve it
        self.build_options = " ".join(o for o, on in (("-DSG_FP64", self.fp64),
                                                      ("-DSG_INT64_ATOMICS", self.int64_atomics)) if on)
        self.cache_key = "|".join((info.name, info.vendor, info.driver, info.platform_name, info.platform_version,
                                   info.version))
        self._programs: dict[str, build.Program] = {}
        self._kernels: dict[tuple, object] = {}
        self._small_wg: dict = {}
        self._scratch: dict[tuple[str, int], object] = {}
        # a kernel's arguments are state of the kernel object: setting them and enqueueing is one step per thread
        self._launch_lock = threading.Lock()
        from singa_backend_opencl.table import kernels

        self.kernels = kernels

    # -- memory ---------------------------------------------------------------------------------------------------
    def _raw_alloc(self, nbytes: int) -> ClBuffer:
        if nbytes > self.info.max_alloc:
            raise MemoryError(f"{self.name}: {nbytes} bytes is more than one buffer may hold on {self.info.name} "
                              f"(CL_DEVICE_MAX_MEM_ALLOC_SIZE = {self.info.max_alloc})")
        err = ffi.new("cl_int *")
        mem = cl.lib.clCreateBuffer(self.context, cl.CL_MEM_READ_WRITE, nbytes, _NULL, err)
        cl.check(err[0], f"clCreateBuffer({nbytes} bytes on {self.name})")
        return ClBuffer(mem, nbytes)

    def _raw_free(self, handle: ClBuffer) -> None:
        cl.lib.clReleaseMemObject(handle.mem)

    def _copy_from_host(self, handle: ClBuffer, byte_offset: int, host: np.ndarray) -> None:
        if host.nbytes:
            cl.check(cl.lib.clEnqueueWriteBuffer(self.queue, handle.mem, cl.CL_TRUE, byte_offset, host.nbytes,
                                                 ffi.from_buffer(host), 0, _NULL, _NULL), "clEnqueueWriteBuffer")

    def _copy_to_host(self, handle: ClBuffer, byte_offset: int, host: np.ndarray) -> None:
        if host.nbytes:
            cl.check(cl.lib.clEnqueueReadBuffer(self.queue, handle.mem, cl.CL_TRUE, byte_offset, host.nbytes,
                                                ffi.from_buffer(host, require_writable=True), 0, _NULL, _NULL),
                     "clEnqueueReadBuffer")

    def _copy_on_device(self, dst: ClBuffer, dst_off: int, src: ClBuffer, src_off: int, nbytes: int) -> None:
        if nbytes <= 0 or (dst is src and dst_off == src_off):
            return
        if dst is src and dst_off < src_off + nbytes and src_off < dst_off + nbytes:
            # clEnqueueCopyBuffer refuses overlapping ranges of one buffer (CL_MEM_COPY_OVERLAP): go through a copy
            tmp = self.alloc(nbytes)
            self._copy_on_device(tmp.handle, 0, src, src_off, nbytes)
            self._copy_on_device(dst, dst_off, tmp.handle, 0, nbytes)
            return
        cl.check(cl.lib.clEnqueueCopyBuffer(self.queue, src.mem, dst.mem, src_off, dst_off, nbytes, 0, _NULL, _NULL),
                 "clEnqueueCopyBuffer")

    def synchronize(self) -> None:
        cl.check(cl.lib.clFinish(self.queue), "clFinish")

    def description(self) -> str:
        i = self.info
        mem = i.global_mem / (1 << 30)
        caps = ", ".join(x for x, on in (("fp64", self.fp64), ("fp16" if "cl_khr_fp16" in i.extensions
                                                                   else "half storage", self.fp16_reason is None))
                         if on)
        return (f"{self.name} ({i.name}, {i.kind}, {i.compute_units} compute units, {mem:.1f} GiB; {i.platform_name} "
                f"{i.driver}; {caps})")

    # -- programs and launches --------------------------------------------------------------------------------------
    def program(self, name: str) -> build.Program:
        """The program `name` (see table.SOURCES), built on first use."""
        prog = self._programs.get(name)
        if prog is None:
            from singa_backend_opencl.table import source_of

            source = build.read_source("common.cl") + "\n" + source_of(name, self)
            # rendered expressions are C shared with other languages: `a != a` (the NaN test) on integers is meant
            options = self.build_options + (" -w" if name.startswith("ew:") else "")
            handle = build.build_program(self.context, self.info.device_id, f"{self.name} ({self.info.name})",
                                         self.cache_key, name, source, options.strip())
            prog = self._programs[name] = build.Program(name, handle)
        return prog

    def kernel(self, program: str, name: str):
        """The kernel `name` of `program` (programs of one family share kernel names)."""
        k = self._kernels.get((program, name))
        if k is None:
            k = self._kernels[(program, name)] = self.program(program).kernel(name)
            size = ffi.new("size_t *")
            cl.check(cl.lib.clGetKernelWorkGroupInfo(k, self.info.device_id, cl.CL_KERNEL_WORK_GROUP_SIZE,
                                                     ffi.sizeof("size_t"), size, _NULL), "clGetKernelWorkGroupInfo")
            if size[0] < self.wg:  # a kernel too heavy for the usual group (registers, on a GPU): a smaller power of 2
                self._small_wg[k] = 1 << (int(size[0]).bit_length() - 1)
        return k

    def group_size(self, kernel) -> int:
        """The work-group size `launch` uses for `kernel` (kernels with __local arrays size them by it)."""
        return self._small_wg.get(kernel, self.wg)

    def launch(self, kernel, n: int, args, local: int | None = None) -> None:
        """Run `kernel` over n work-items (rounded up to whole work-groups of `local`, default self.wg).

        `args` are the kernel's arguments in order: bytes (a scalar or struct packed to its C layout, or a buffer's
        `arg`), or an int for that many bytes of __local memory.
        """
        setarg = cl.lib.clSetKernelArg
        wg = local or self._small_wg.get(kernel, self.wg)
        total = -(-n // wg) * wg
        with self._launch_lock:
            for i, a in enumerate(args):
                code = setarg(kernel, i, a, _NULL) if type(a) is int else setarg(kernel, i, len(a), a)
                if code:
                    raise cl.CLError(code, f"clSetKernelArg({i}) on {self.name}")
            code = cl.lib.clEnqueueNDRangeKernel(self.queue, kernel, 1, _NULL, [total], [wg], 0, _NULL, _NULL)
        if code:
            raise cl.CLError(code, f"clEnqueueNDRangeKernel on {self.name}")

    def launch_nd(self, kernel, global_size: tuple, local_size: tuple, args) -> None:
        """An N-d launch; `global_size` must already be a multiple of `local_size` in each dimension."""
        setarg = cl.lib.clSetKernelArg
        with self._launch_lock:
            for i, a in enumerate(args):
                code = setarg(kernel, i, len(a), a)
                if code:
                    raise cl.CLError(code, f"clSetKernelArg({i}) on {self.name}")
            code = cl.lib.clEnqueueNDRangeKernel(self.queue, kernel, len(global_size), _NULL, list(global_size),
                                                 list(local_size), 0, _NULL, _NULL)
        if code:
            raise cl.CLError(code, f"clEnqueueNDRangeKernel on {self.name}")

    def fill_bytes(self, handle: ClBuffer, byte_offset: int, pattern: bytes, nbytes: int) -> None:
        """Repeat `pattern` (1, 2, 4 or 8 bytes) over nbytes at byte_offset (both multiples of its size)."""
        if nbytes > 0:
            cl.check(cl.lib.clEnqueueFillBuffer(self.queue, handle.mem, pattern, len(pattern), byte_offset, nbytes, 0,
                                                _NULL, _NULL), "clEnqueueFillBuffer")

    def scratch(self, name: str, nbytes: int):
        """A small buffer the device keeps for flags and counters (a Buffer from the pool, reused), one per thread:
        two threads checking indices at once must not share a flag."""
        key = (name, threading.get_ident())
        buf = self._scratch.get(key)
        if buf is None or buf.nbytes < nbytes:
            buf = self._scratch[key] = self.alloc(nbytes)
        return buf

    def dtype_error(self, kernel: str, dtype: int) -> UnsupportedDtypeError:
        if dtype == dtypes.float16 and self.fp16_reason:
            why = self.fp16_reason
        elif dtype == dtypes.float64:
            why = ("the device lacks cl_khr_fp64" if "cl_khr_fp64" not in self.info.extensions
                   else "float64 is turned off by SINGA_OPENCL_FP64=0")
        else:
            why = "the kernel does not take it"
        return UnsupportedDtypeError(f"opencl kernel {kernel}: dtype {dtypes.name(dtype)} is not supported on "
                                     f"{self.name} ({self.info.name}): {why}")


I64 = struct.Struct("<q").pack
I32 = struct.Struct("<i").pack
U32 = struct.Struct("<I").pack
F32 = struct.Struct("<f").pack
F64 = struct.Struct("<d").pack
