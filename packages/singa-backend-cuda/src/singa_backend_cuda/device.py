"""The CUDA device: device memory from the core's caching MemoryPool, one stream, kernels launched from table.py.

Every command goes to one non-blocking stream of the device's primary context (the one PyTorch and other libraries
share), so a kernel always sees the results of the commands issued before it, and a block handed back to the pool can
be reused at once: whatever touches it next is queued after its last user. Launches are asynchronous; host reads wait
for the stream (`read` returns complete data), host writes go through a pinned staging buffer (the caller's array
may be gone as soon as we return). `synchronize()` waits for the stream and reports a deferred error, if any.

Graph mode (singa.graph) replays a recorded training step; `capture` turns that replay into a CUDA Graph by stream
capture, so a replayed step is one launch from Python. Memory that kernels allocate while being captured comes from
a pool of the graph's own, alive as long as the graph, since the graph uses those addresses at every launch.

Threads may share the device. Everything that puts work on the stream holds `stream_lock` (a re-entrant lock) while
it does, and a capture holds it from beginning to end: another thread's kernels must never land in the graph being
recorded, so they wait the few milliseconds a capture takes. Capture state (its pool, "capturing") belongs to the
capturing thread alone, as do the pending index checks: a thread's bad gather is reported to that thread.

Checks of index values (class labels, gather and scatter indices) run on the device and are reported at the next
synchronisation, as PyTorch's device-side asserts are: the check kernel lowers a flag to the first bad position, and
the next host read (or `synchronize()`) reads the flags back and raises the error, naming the kernel, its views and
the value. Nothing waits for the GPU in between, so eager steps keep the host and the device busy at once.

Errors name the CUDA call and its error string; a failed launch names the kernel, its grid and its program; an
asynchronous fault (an illegal address, say) surfaces at the next synchronisation with the last kernels launched.
Out of device memory raises MemoryError after the pool has given its cached blocks back to the driver once.
"""

from __future__ import annotations

import collections
import os
import struct
import threading
import weakref

import numpy as np

from singa import dtypes
from singa.backend import Buffer, Device, MemoryPool, View
from singa_backend_cuda import build, cublas, cuda, cudnn
from singa_backend_cuda.cuda import ffi

_NULL = ffi.NULL
_STAGING = 8 << 20  # bytes of pinned memory for host copies (larger ones go in pieces, or pageable for writes)
_tls = threading.local()  # the context current on this thread
I64 = struct.Struct("<q").pack
FLAG_SLOTS = 256  # eager index checks in flight between two synchronisations
_CLEAR = 2 ** 31 - 1  # a check flag with no bad position
_CLEAR_BYTES = struct.pack("<i", _CLEAR)


class CudaBuffer:
    """A raw device allocation: its address, and the address as kernel-parameter bytes."""

    __slots__ = ("ptr", "arg", "nbytes")

    def __init__(self, ptr: int, nbytes: int):
        self.ptr = ptr
        self.arg = I64(ptr)
        self.nbytes = nbytes

    def __repr__(self) -> str:
        return f"CudaBuffer(0x{self.ptr:x}, {self.nbytes} bytes)"


class DeviceInfo:
    """What the backend knows about one CUDA device before opening it."""

    def __init__(self, ordinal: int):
        handle = ffi.new("CUdevice *")
        cuda.check(cuda.lib.cuDeviceGet(handle, ordinal), f"cuDeviceGet({ordinal})")
        self.ordinal = ordinal
        self.handle = handle[0]
        self.name = cuda.device_name(self.handle)
        self.cc = (cuda.attribute(self.handle, "cc_major"), cuda.attribute(self.handle, "cc_minor"))
        self.compute_units = cuda.attribute(self.handle, "multiprocessors")
        self.global_mem = cuda.total_memory(self.handle)
        self.max_threads = cuda.attribute(self.handle, "max_threads_per_block")
        self.shared_per_block = cuda.attribute(self.handle, "max_shared_per_block")
        self.pci = f"{cuda.attribute(self.handle, 'pci_bus'):02x}:{cuda.attribute(self.handle, 'pci_device'):02x}"


class CudaDevice(Device):
    backend_name = "cuda"
    dtypes = (*dtypes.ALL, dtypes.float64)  # IEEE double (at a fraction of float32's rate on consumer GPUs)

    def __init__(self, id: int, info: DeviceInfo):
        self.info = info
        ctx = ffi.new("CUcontext *")
        cuda.check(cuda.lib.cuDevicePrimaryCtxRetain(ctx, info.handle), f"cuDevicePrimaryCtxRetain({info.name})")
        self.ctx = ctx[0]
        self.activate()
        s = ffi.new("CUstream *")
        cuda.check(cuda.lib.cuStreamCreate(s, cuda.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        self._stream = s[0]
        self.stream = int(ffi.cast("uintptr_t", s[0]))  # for other libraries (NCCL, cuBLAS, cuDNN)
        super().__init__(id)
        self.fp64 = True  # accumulators and integer kernels' float parameters are double (see prelude.cuh)
        self.int64_atomics = True
        self.wg = 256
        self.arch = build.target_arch(*info.cc)
        self.tf32 = os.environ.get("SINGA_CUDA_TF32", "").strip() == "1"
        self._functions: dict[tuple, object] = {}
        self._names: dict[object, str] = {}
        self._modules: dict[str, object] = {}  # program -> CUmodule
        self._small_wg: dict = {}
        self._scratch: dict[tuple[str, int], Buffer] = {}
        self.stream_lock = threading.RLock()  # held by whatever enqueues on the stream (see the module docstring)
        self._extra = ffi.new("void *[5]")
        self._extra_size = ffi.new("size_t *")
        self._extra[0] = ffi.cast("void *", cuda.CU_LAUNCH_PARAM_BUFFER_POINTER)
        self._extra[2] = ffi.cast("void *", cuda.CU_LAUNCH_PARAM_BUFFER_SIZE)
        self._extra[3] = self._extra_size
        self._extra[4] = ffi.cast("void *", cuda.CU_LAUNCH_PARAM_END)
        self._recent: collections.deque = collections.deque(maxlen=8)  # names of the last kernels launched
        self._stage = None  # pinned staging buffer, made on first use
        self._stage_event = None
        self._stage_pending = False
        self._blas = None
        self._dnn = None
        self._conv_plans: dict[tuple, cudnn.Plan] = {}
        self._rnn_plans: dict[tuple, object] = {}
        self._workspace: Buffer | None = None
        # stream capture (see `capture`): the capturing thread, the graph's own pool, what the graph keeps
        self._capture_owner: int | None = None
        self._capture_pool: MemoryPool | None = None
        self._capture_keep: list = []
        self._capture_checks: list = []
        self._checks = threading.local()  # each thread's pending index checks (see `_thread_checks`)
        self.capture_error: str | None = None  # why the last capture failed
        from singa_backend_cuda.table import kernels

        self.kernels = kernels

    # -- context ----------------------------------------------------------------------------------------------------
    def activate(self) -> None:
        """Make this device's context current on the calling thread (every entry point does)."""
        if getattr(_tls, "ctx", None) != self.ctx:
            cuda.check(cuda.lib.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
            _tls.ctx = self.ctx

    # -- memory ---------------------------------------------------------------------------------------------------
    def _raw_alloc(self, nbytes: int) -> CudaBuffer:
        self.activate()
        p = ffi.new("CUdeviceptr *")
        code = cuda.lib.cuMemAlloc_v2(p, nbytes)
        if code == cuda.CUDA_ERROR_OUT_OF_MEMORY:
            free, total = ffi.new("size_t *"), ffi.new("size_t *")
            cuda.lib.cuMemGetInfo_v2(free, total)
            raise MemoryError(f"{self.name} ({self.info.name}): out of device memory allocating {nbytes} bytes "
                              f"({free[0] >> 20} MiB free of {total[0] >> 20} MiB; this process holds "
                              f"{self.pool.bytes_in_use >> 20} MiB in tensors)")
        cuda.check(code, f"cuMemAlloc({nbytes} bytes on {self.name})")
        return CudaBuffer(int(p[0]), nbytes)

    def alloc(self, nbytes: int) -> Buffer:
        """From the device's pool, or, in the thread capturing a graph, from the graph's own."""
        pool = self._capture_pool
        if pool is None or self._capture_owner != threading.get_ident():
            return super().alloc(nbytes)
        handle, cls = pool.acquire(nbytes)
        buf = Buffer(handle, nbytes, self, cls)
        buf._pool = pool
        return buf

    @property
    def capturing(self) -> bool:
        """Whether the calling thread is recording a CUDA graph."""
        return self._capture_owner == threading.get_ident()

    def _raw_free(self, handle: CudaBuffer) -> None:
        self.activate()
        cuda.check(cuda.lib.cuMemFree_v2(handle.ptr), f"cuMemFree on {self.name}")

    def _staging(self):
        if self._stage is None:
            p = ffi.new("void **")
            cuda.check(cuda.lib.cuMemHostAlloc(p, _STAGING, cuda.CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc")
            self._stage = p[0]
            e = ffi.new("CUevent *")
            cuda.check(cuda.lib.cuEventCreate(e, cuda.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
            self._stage_event = e[0]
        return self._stage

    def _copy_from_host(self, handle: CudaBuffer, byte_offset: int, host: np.ndarray) -> None:
        n = host.nbytes
        if not n:
            return
        self.activate()
        dst = handle.ptr + byte_offset
        with self.stream_lock:
            if self.capturing:  # a constant of a captured step: its own pinned copy, read at every launch
                p = ffi.new("void **")
                cuda.check(cuda.lib.cuMemHostAlloc(p, n, cuda.CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc")
                self._capture_keep.append(_Pinned(p[0]))
                ffi.memmove(p[0], ffi.from_buffer(host), n)
                cuda.check(cuda.lib.cuMemcpyHtoDAsync_v2(dst, p[0], n, self._stream), "cuMemcpyHtoDAsync (captured)")
                return
            if n > _STAGING:  # pageable: the driver copies it out before returning
                cuda.check(cuda.lib.cuMemcpyHtoDAsync_v2(dst, ffi.from_buffer(host), n, self._stream),
                           f"cuMemcpyHtoDAsync({n} bytes to {self.name})")
                return
            stage = self._staging()
            if self._stage_pending:  # the previous copy out of the staging buffer must be done
                cuda.check(cuda.lib.cuEventSynchronize(self._stage_event), "cuEventSynchronize")
            ffi.memmove(stage, ffi.from_buffer(host), n)
            cuda.check(cuda.lib.cuMemcpyHtoDAsync_v2(dst, stage, n, self._stream),
                       f"cuMemcpyHtoDAsync({n} bytes to {self.name})")
            cuda.check(cuda.lib.cuEventRecord(self._stage_event, self._stream), "cuEventRecord")
            self._stage_pending = True

    def _copy_to_host(self, handle: CudaBuffer, byte_offset: int, host: np.ndarray) -> None:
        n = host.nbytes
        if not n:
            return
        if self.capturing:
            raise RuntimeError(f"{self.name}: a host read of device data inside a captured CUDA graph")
        self.activate()
        out = ffi.from_buffer(host, require_writable=True)
        with self.stream_lock:
            stage = self._staging()
            for start in range(0, n, _STAGING):
                m = min(_STAGING, n - start)
                cuda.check(cuda.lib.cuMemcpyDtoHAsync_v2(stage, handle.ptr + byte_offset + start, m, self._stream),
                           f"cuMemcpyDtoHAsync({m} bytes from {self.name})")
                self._sync_stream()
                ffi.memmove(out + start, stage, m)
            self._stage_pending = False
            self._run_checks()

    def _copy_on_device(self, dst: CudaBuffer, dst_off: int, src: CudaBuffer, src_off: int, nbytes: int) -> None:
        if nbytes <= 0 or (dst is src and dst_off == src_off):
            return
        if dst is src and dst_off < src_off + nbytes and src_off < dst_off + nbytes:  # overlapping: through a copy
            tmp = self.alloc(nbytes)
            self._copy_on_device(tmp.handle, 0, src, src_off, nbytes)
            self._copy_on_device(dst, dst_off, tmp.handle, 0, nbytes)
            return
        self.activate()
        with self.stream_lock:
            cuda.check(cuda.lib.cuMemcpyDtoDAsync_v2(dst.ptr + dst_off, src.ptr + src_off, nbytes, self._stream),
                       f"cuMemcpyDtoDAsync({nbytes} bytes on {self.name})")

    def fill_bytes(self, handle: CudaBuffer, byte_offset: int, pattern: bytes, nbytes: int) -> None:
        """Repeat `pattern` (1, 2, 4 or 8 bytes) over nbytes at byte_offset (both multiples of its size)."""
        if nbytes <= 0:
            return
        self.activate()
        dst = handle.ptr + byte_offset
        size = len(pattern)
        if size == 8 and pattern[:4] == pattern[4:]:
            pattern, size = pattern[:4], 4
        if size in (1, 2, 4):
            value = int.from_bytes(pattern, "little")
            memset = {1: cuda.lib.cuMemsetD8Async, 2: cuda.lib.cuMemsetD16Async, 4: cuda.lib.cuMemsetD32Async}[size]
            with self.stream_lock:
                cuda.check(memset(dst, value, nbytes // size, self._stream), f"cuMemsetD{8 * size}Async")
        else:  # 8-byte values: the shared fill kernel
            n = nbytes // 8
            self.launch(self.kernel("mem:fill:8", "sg_fill_8_c"), n, (I64(n), handle.arg, I64(byte_offset // 8),
                                                                      pattern))

    def scratch(self, name: str, nbytes: int) -> Buffer:
        """A small buffer the device keeps for flags and counters, one per thread (two threads counting at once must
        not share a counter); a fresh one while capturing (see `capture`)."""
        if self.capturing:
            return self.alloc(nbytes)
        key = (name, threading.get_ident())
        buf = self._scratch.get(key)
        if buf is None or buf.nbytes < nbytes:
            buf = self._scratch[key] = self.alloc(nbytes)
        return buf

    def empty_cache(self) -> None:
        """Give the pool's cached blocks back to the driver."""
        self.synchronize()
        self.pool.empty_cache()

    # -- synchronisation ------------------------------------------------------------------------------------------
    def _sync_stream(self) -> None:
        code = cuda.lib.cuStreamSynchronize(self._stream)
        if code:
            raise cuda.CudaError(code, f"a kernel on {self.name} failed (the last launched: "
                                       f"{', '.join(self._recent) or 'none'}); cuStreamSynchronize")

    def synchronize(self) -> None:
        if self.capturing:
            raise RuntimeError(f"{self.name}: synchronize() inside a captured CUDA graph")
        self.activate()
        with self.stream_lock:
            self._sync_stream()
            self._run_checks()

    def description(self) -> str:
        i = self.info
        return (f"{self.name} ({i.name}, compute capability {i.cc[0]}.{i.cc[1]}, {i.compute_units} SMs, "
                f"{i.global_mem / (1 << 30):.1f} GiB; driver CUDA {cuda.version_text(cuda.driver_version())}; "
                f"kernels for sm_{self.arch})")

    # -- programs and launches --------------------------------------------------------------------------------------
    def kernel(self, program: str, name: str):
        """The CUfunction `name` of `program` (built by NVRTC on first use, see build.py)."""
        key = (program, name)
        fn = self._functions.get(key)
        if fn is None:
            fn = self._load(program, name)
        return fn

    def _load(self, program: str, name: str):
        from singa_backend_cuda.table import source_of

        self.activate()
        mod = self._modules.get(program)
        if mod is None:
            cubin = build.compile_program(program, source_of(program, self), self.arch)
            m = ffi.new("CUmodule *")
            cuda.check(cuda.lib.cuModuleLoadData(m, ffi.from_buffer(cubin)),
                       f"cuModuleLoadData({program!r} for sm_{self.arch})")
            mod = self._modules[program] = m[0]
        f = ffi.new("CUfunction *")
        cuda.check(cuda.lib.cuModuleGetFunction(f, mod, name.encode()), f"cuModuleGetFunction({name!r} in "
                                                                         f"{program!r})")
        fn = f[0]
        most = ffi.new("int *")
        cuda.check(cuda.lib.cuFuncGetAttribute(most, cuda.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn),
                   "cuFuncGetAttribute")
        if most[0] < self.wg:  # a kernel too heavy for the usual block (registers): a smaller power of two
            self._small_wg[fn] = 1 << (int(most[0]).bit_length() - 1)
        self._functions[(program, name)] = fn
        self._names[fn] = f"{name} ({program})"
        return fn

    def group_size(self, kernel) -> int:
        return self._small_wg.get(kernel, self.wg)

    @staticmethod
    def _pack(args) -> tuple[bytes, int]:
        """The kernel parameters as one buffer, each aligned to its size (up to 8), and the dynamic shared memory:
        an int argument is the byte size of a work-group array (passed as an 8-byte parameter too)."""
        if all(type(a) is bytes and len(a) == 8 for a in args):  # the common case: pointers, longs, doubles
            return b"".join(args), 0
        parts = []
        off = shared = 0
        for a in args:
            if type(a) is int:
                shared += a
                a = I64(a)
            size = len(a)
            align = 8 if size % 8 == 0 else 4 if size % 4 == 0 else 2 if size % 2 == 0 else 1
            pad = -off % align
            if pad:
                parts.append(bytes(pad))
                off += pad
            parts.append(a)
            off += size
        return b"".join(parts), shared

    def _launch(self, kernel, grid: tuple, block: tuple, args) -> None:
        buf, shared = self._pack(args)
        self.activate()
        with self.stream_lock:  # the launch-parameter block is shared too
            self._extra_size[0] = len(buf)
            keep = ffi.from_buffer(buf)
            self._extra[1] = keep
            code = cuda.lib.cuLaunchKernel(kernel, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared,
                                           self._stream, _NULL, self._extra)
            self._recent.append(self._names.get(kernel, "?"))
        if code:
            words = ", ".join(hex(w) for w in struct.unpack(f"<{min(len(buf) // 8, 12)}Q", buf[:8 * min(len(buf) // 8,
                                                                                                       12)]))
            raise cuda.CudaError(code, f"cuLaunchKernel({self._names.get(kernel, '?')}, grid {grid}, block {block}, "
                                       f"{shared} bytes shared, arguments [{words}{', ...' if len(buf) > 96 else ''}]"
                                       f" on {self.name})")

    def launch(self, kernel, n: int, args, local: int | None = None) -> None:
        """Run `kernel` over n work-items, in blocks of `local` (default the kernel's group size)."""
        wg = local or self._small_wg.get(kernel, self.wg)
        blocks = -(-n // wg)
        if blocks:
            self._launch(kernel, (blocks, 1, 1), (wg, 1, 1), args)

    def launch_nd(self, kernel, global_size: tuple, local_size: tuple, args) -> None:
        """An N-d launch; `global_size` must already be a multiple of `local_size` in each dimension."""
        g = tuple(global_size) + (1,) * (3 - len(global_size))
        loc = tuple(local_size) + (1,) * (3 - len(local_size))
        grid = tuple(a // b for a, b in zip(g, loc))
        if min(grid) > 0:
            self._launch(kernel, grid, loc, args)

    def dtype_error(self, kernel: str, dtype: int) -> TypeError:
        return TypeError(f"cuda kernel {kernel}: dtype {dtypes.name(dtype)} is not supported on {self.name} "
                         f"({self.info.name}): the kernel does not take it")

    # -- libraries ----------------------------------------------------------------------------------------------------
    def set_tf32(self, on: bool) -> None:
        """Let float32 matrix products and convolutions use TF32 tensor cores (faster, ~1e-3 relative error)."""
        self.tf32 = bool(on)
        self._conv_plans.clear()
        if self._blas is not None:
            self._blas.set_tf32(self.tf32)

    def blas(self) -> cublas.Handle:
        if self._blas is None:
            self.activate()
            ws = self.persistent_alloc(cublas.WORKSPACE)
            self._blas_ws = ws  # kept: cuBLAS writes there inside every product
            self._blas = cublas.Handle(self.stream, ws.handle.ptr, self.tf32)
        return self._blas

    def dnn(self) -> cudnn.Handle:
        if self._dnn is None:
            self.activate()
            self._dnn = cudnn.Handle(self.stream)
        return self._dnn

    def workspace(self, nbytes: int) -> Buffer:
        """Scratch memory for cuDNN, grown on demand (a fresh block while capturing)."""
        if self.capturing:
            return self.alloc(max(nbytes, 1))
        if self._workspace is None or self._workspace.nbytes < nbytes:
            self._workspace = None
            self._workspace = self.alloc(max(nbytes, 1))
        return self._workspace

    def conv_plan(self, key: tuple, make) -> tuple[cudnn.Plan, bool]:
        """(the plan of convolution `key`, whether it is new: its algorithm still to be found)."""
        plan = self._conv_plans.get(key)
        if plan is not None:
            return plan, False
        plan = self._conv_plans[key] = make()
        return plan, True

    def rnn_operator(self, spec, seq_lengths=None):
        """cuDNN's RNN for `spec` (see singa_backend_cuda.rnn), or None for the generic one: with dropout while
        training (cuDNN's draws are not ours), or when SINGA_CUDNN_RNN=0."""
        from singa import autograd
        from singa_backend_cuda.rnn import CudnnRNN

        if os.environ.get("SINGA_CUDNN_RNN", "").strip() == "0" or (spec.dropout > 0 and autograd.training):
            return None
        return CudnnRNN(self, spec, seq_lengths)

    def rnn_plan(self, spec, dtype: int, T: int, B: int, lengths: tuple):
        """The cuDNN descriptors of one RNN shape, made once."""
        from singa_backend_cuda.rnn import Plan

        key = (spec, dtype, T, B, lengths)
        plan = self._rnn_plans.get(key)
        if plan is None:
            plan = self._rnn_plans[key] = Plan(self, spec, dtype, T, B, lengths)
        return plan

    def find_limit(self) -> int:
        """Bytes of workspace an algorithm search may use: a quarter of the free memory, at most 1 GiB."""
        free, total = ffi.new("size_t *"), ffi.new("size_t *")
        cuda.check(cuda.lib.cuMemGetInfo_v2(free, total), "cuMemGetInfo")
        return int(min(free[0] // 4, 1 << 30))

    # -- CUDA graphs --------------------------------------------------------------------------------------------------
    def capture(self, run):
        """Record the kernels `run` launches into a CUDA Graph and return a callable that launches it (None when
        SINGA_CUDA_GRAPHS=0, or when the work cannot be captured: the caller then replays in Python)."""
        if os.environ.get("SINGA_CUDA_GRAPHS", "").strip() == "0":
            return None
        with self.stream_lock:  # no other thread's work may enter the graph
            return self._capture(run)

    def _capture(self, run):
        self.synchronize()
        own_pool = self._capture_pool = MemoryPool(self._raw_alloc, self._raw_free)
        self._capture_owner = threading.get_ident()
        self._capture_keep, self._capture_checks = [], []
        graph = ffi.new("CUgraph *")
        try:
            cuda.check(cuda.lib.cuStreamBeginCapture_v2(self._stream, cuda.CU_STREAM_CAPTURE_MODE_RELAXED),
                       "cuStreamBeginCapture")
            try:
                run()
            finally:
                end = cuda.lib.cuStreamEndCapture(self._stream, graph)
            cuda.check(end, "cuStreamEndCapture")
        except Exception as exc:  # noqa: BLE001 - anything the capture cannot hold: replay in Python instead
            if graph[0] != _NULL:
                cuda.lib.cuGraphDestroy(graph[0])
            self.capture_error = f"{type(exc).__name__}: {exc}"
            return None
        finally:
            self._capture_owner = self._capture_pool = None
        exe = ffi.new("CUgraphExec *")
        cuda.check(cuda.lib.cuGraphInstantiateWithFlags(exe, graph[0], 0), "cuGraphInstantiate")
        for check in self._capture_checks:  # flags start clear, outside the graph
            check.reset()
        return _CapturedStep(self, graph[0], exe[0], own_pool, self._capture_keep, self._capture_checks).launch

    def deferred_flag(self, error):
        """An int32 flag (as a buffer: its `handle.arg` is what the check kernel takes) that a check kernel lowers to
        the first bad position; the next synchronisation reads it and raises `error(position)`. Eager flags are
        slots of one buffer, cleared in the stream as they are handed out; a captured graph's flags are its own,
        outside the graph's memory (which its temporaries reuse at every launch), cleared after each report."""
        if self.capturing:
            flag = self.persistent_alloc(4)
            self._capture_checks.append(_Check(self, flag, error))
            return flag
        mine = self._thread_checks()
        if len(mine.errors) == FLAG_SLOTS:
            self.synchronize()  # reports and frees every slot
        if mine.flags is None:
            mine.flags = self.alloc(4 * FLAG_SLOTS)
        handle = CudaBuffer(mine.flags.handle.ptr + 4 * len(mine.errors), 4)
        self.fill_bytes(handle, 0, _CLEAR_BYTES, 4)
        mine.errors.append(error)
        return _Slot(handle)

    def _thread_checks(self) -> _ThreadChecks:
        """The calling thread's pending checks: its flag slots and the graphs it launched."""
        mine = getattr(self._checks, "mine", None)
        if mine is None:
            mine = self._checks.mine = _ThreadChecks()
        return mine

    def persistent_alloc(self, nbytes: int) -> Buffer:
        """A block from the device's own pool even while capturing (memory that outlives the captured work)."""
        return super().alloc(nbytes)

    def _run_checks(self) -> None:
        """After a synchronisation: report the calling thread's first failed check (eager flags, then those of the
        graphs it launched)."""
        mine = self._thread_checks()
        eager, mine.errors = mine.errors, []
        if eager:
            flags = np.empty(len(eager), np.int32)
            cuda.check(cuda.lib.cuMemcpyDtoH_v2(ffi.from_buffer(flags, require_writable=True), mine.flags.handle.ptr,
                                                flags.nbytes), "cuMemcpyDtoH (check flags)")
            for pos, error in zip(flags.tolist(), eager):
                if pos != _CLEAR:
                    mine.graphs = {}
                    raise error(pos)
        pending, mine.graphs = mine.graphs, {}
        for check in pending.values():
            check.verify()


class _ThreadChecks:
    """One thread's checks in flight: `errors[i]` builds the error of flag slot i of `flags` (FLAG_SLOTS int32s,
    read back in one copy); `graphs` holds the checks of the captured graphs launched since its last
    synchronisation."""

    __slots__ = ("flags", "errors", "graphs")

    def __init__(self):
        self.flags: Buffer | None = None
        self.errors: list = []
        self.graphs: dict[int, _Check] = {}


class _Pinned:
    """Pinned host memory freed with its owner."""

    def __init__(self, ptr):
        self.ptr = ptr

    def __del__(self):
        if cuda.lib is not None:
            cuda.lib.cuMemFreeHost(self.ptr)


class _Slot:
    """One eager check flag: a slot of the device's flag buffer, shaped like a Buffer for the kernel tables."""

    __slots__ = ("handle",)

    def __init__(self, handle: CudaBuffer):
        self.handle = handle


class _Check:
    """A deferred device-side check of a captured graph (see CudaDevice.deferred_flag)."""

    def __init__(self, dev: CudaDevice, flag: Buffer, error):
        self.dev, self.flag, self.error = dev, flag, error

    def reset(self) -> None:
        self.dev.fill_bytes(self.flag.handle, 0, _CLEAR_BYTES, 4)

    def verify(self) -> None:
        pos = int(self.dev.read(View(self.flag, dtypes.int32, ())))
        if pos != _CLEAR:
            self.reset()
            exc = self.error(pos)
            note = "found on the GPU in a step replayed as a CUDA graph, reported at the next synchronisation"
            exc.args = (f"{exc.args[0]} ({note})", *exc.args[1:])
            raise exc


class _CapturedStep:
    """An instantiated CUDA graph with the memory its kernels use; `launch` runs it on the device's stream."""

    def __init__(self, dev: CudaDevice, graph, exe, pool: MemoryPool, keep: list, checks: list):
        self.dev = weakref.proxy(dev)
        self.graph, self.exe, self.pool, self.keep, self.checks = graph, exe, pool, keep, checks

    def launch(self) -> None:
        dev = self.dev
        dev.activate()
        with dev.stream_lock:
            cuda.check(cuda.lib.cuGraphLaunch(self.exe, dev._stream), "cuGraphLaunch")
        dev._recent.append("a captured step (CUDA graph)")
        graphs = dev._thread_checks().graphs
        for check in self.checks:
            graphs[id(check)] = check

    def __del__(self):
        try:
            if cuda.lib is not None:
                cuda.lib.cuGraphExecDestroy(self.exe)
                cuda.lib.cuGraphDestroy(self.graph)
                self.pool.empty_cache()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the driver frees everything anyway
            pass
