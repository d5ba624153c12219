"""The backend contract: what a device plugin subclasses.

A backend plugin provides one `Backend` (found through the `singa.backends` entry point, see `hookspecs`), which creates
`Device` objects. A Device owns opaque device buffers, handed out by a caching `MemoryPool`, moves bytes between host and
device, and carries a kernel table: the primitives documented in `singa.primitives`, keyed by name. Kernels the backend
does not implement are filled in from `singa.fallback` (host numpy code, one warning per kernel and device).

Kernels never see a Tensor's Python API, only objects with the *view* attributes below (a Tensor is one):

    buffer   the Buffer holding the elements (opaque to the core: `buffer.handle` is whatever the backend allocated)
    dtype    a singa.dtypes code
    shape    tuple of ints
    strides  tuple of ints, in elements (0 for a broadcast axis)
    offset   int, in elements, from the start of the buffer
"""

from __future__ import annotations

import functools
import itertools
import weakref
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import numpy as np

from singa import dtypes
from singa.fallback_policy import FallbackError, FallbackWarning  # noqa: F401 - their documented home is here too


class Buffer:
    """A block of device memory. Returned to its pool when the last reference goes away."""

    __slots__ = ("handle", "nbytes", "device", "_size_class", "_pool", "__weakref__")

    def __init__(self, handle: Any, nbytes: int, device: Device, size_class: int):
        self.handle = handle
        self.nbytes = nbytes
        self.device = device
        self._size_class = size_class
        self._pool = device.pool

    def __del__(self):
        # inlined MemoryPool.release: this runs once per temporary tensor, on the per-op hot path
        pool = self._pool
        cls = self._size_class
        pool.bytes_in_use -= cls
        pool.bytes_cached += cls
        free = pool._cache.get(cls)
        if free is None:
            pool._cache.setdefault(cls, []).append(self.handle)  # setdefault: another thread may add the list too
        else:
            free.append(self.handle)

    def __repr__(self) -> str:
        return f"Buffer({self.nbytes} bytes on {self.device})"


# -- constant buffers: a promise that lets a backend keep what it derives from a buffer's bytes ---------------------

_constants: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_tokens = itertools.count(1)


def declare_constant(buffers: Iterable[Buffer]) -> None:
    """Promise that the bytes of `buffers` do not change until `release_constant` is called on them (or they are
    freed). A backend may then keep what it derives from them, e.g. convolution weights in the layout its library
    prefers, under the token `constant_token` gives; nothing checks the promise. singa_onnx declares the weights of
    an inference plan, which a user must `refresh()` after writing into anyway."""
    for b in buffers:
        _constants[b] = next(_tokens)


def release_constant(buffers: Iterable[Buffer]) -> None:
    """End the promise of `declare_constant`: the buffers may be written again (a later declaration gets a new
    token, so nothing derived under the old one is reused)."""
    for b in buffers:
        _constants.pop(b, None)


def constant_token(buffer: Buffer) -> int:
    """The token of a buffer declared constant (a positive int, new at each declaration), else 0."""
    return _constants.get(buffer, 0)


class View:
    """A view without a Tensor around it (used by the core and the fallback for temporaries)."""

    __slots__ = ("buffer", "dtype", "shape", "strides", "offset")

    def __init__(self, buffer: Buffer, dtype: int, shape: tuple, strides: tuple | None = None, offset: int = 0):
        self.buffer = buffer
        self.dtype = dtype
        self.shape = tuple(shape)
        self.strides = contiguous_strides(self.shape) if strides is None else tuple(strides)
        self.offset = offset


_new_object = object.__new__


def make_view(buffer: Buffer, dtype: int, shape: tuple, strides: tuple, offset: int) -> View:
    """View(...) without the constructor's conversions: `shape` and `strides` must already be tuples of ints (the
    per-op hot paths build them so)."""
    v = _new_object(View)
    v.buffer = buffer
    v.dtype = dtype
    v.shape = shape
    v.strides = strides
    v.offset = offset
    return v


def contiguous_strides(shape: tuple) -> tuple:
    strides = []
    s = 1
    for d in reversed(shape):
        strides.append(s)
        s *= d
    return tuple(reversed(strides))


def channel_split(view, block: int, blocked: bool) -> View:
    """The 5-D view (N, C/block, block, H, W) of a contiguous 4-D view (N, C, H, W): of its elements laid out as NCHW,
    or with `blocked` as channel blocks (N, C/block, H, W, block), the layout `Device.channel_block` names. A copy
    between the two converts one layout into the other."""
    N, C, H, W = view.shape
    if block <= 0 or C % block:
        raise ValueError(f"{C} channels do not split into blocks of {block}")
    hw = H * W
    strides = (C * hw, hw * block, 1, W * block, block) if blocked else (C * hw, block * hw, hw, W, 1)
    return make_view(view.buffer, view.dtype, (N, C // block, block, H, W), strides, view.offset)


_UNSIGNED = {4: np.uint32, 8: np.uint64}


def is_contiguous(view) -> bool:
    s = 1
    for d, st in zip(reversed(view.shape), reversed(view.strides)):
        if d != 1 and st != s:
            return False
        s *= d
    return True


def numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class MemoryPool:
    """A caching allocator over a device's raw alloc/free, with the counters every backend reports.

    Sizes are rounded up to a size class (multiples of 512 bytes up to 1 MiB; above, eight classes per power of two,
    so at most 1/8 is wasted where powers of two would waste up to half) and freed blocks are kept per class for reuse; `empty_cache()` gives them back to the device. The pool relies on the GIL for its
    bookkeeping, which keeps allocation cheap enough for the per-operation hot path: a block changes hands in one
    list operation (`pop` / `append`), so threads sharing a device never get the same block; the byte counters are
    plain attributes, exact in one thread and approximate while several threads allocate at once.
    """

    def __init__(self, raw_alloc: Callable[[int], Any], raw_free: Callable[[Any], None]):
        self._raw_alloc = raw_alloc
        self._raw_free = raw_free
        self._cache: dict[int, list] = {}
        self.bytes_in_use = 0
        self.peak_bytes = 0
        self.bytes_cached = 0
        self.num_allocs = 0  # calls to the device's raw allocator
        self.num_requests = 0  # allocations served, from the cache or not

    @staticmethod
    def size_class(nbytes: int) -> int:
        if nbytes <= (1 << 20):
            return ((nbytes + 511) & ~511) or 512
        step = 1 << ((nbytes - 1).bit_length() - 4)
        return (nbytes + step - 1) & -step

    def acquire(self, nbytes: int) -> tuple[Any, int]:
        if nbytes <= 1048576:  # size_class, inlined: this is the per-operation hot path
            cls = (nbytes + 511) & ~511 or 512
        else:
            step = 1 << ((nbytes - 1).bit_length() - 4)
            cls = (nbytes + step - 1) & -step
        self.num_requests += 1
        try:
            handle = self._cache[cls].pop()  # one atomic step: threads may share the pool
            self.bytes_cached -= cls
        except (KeyError, IndexError):
            handle = self._fresh(cls)
        used = self.bytes_in_use + cls
        self.bytes_in_use = used
        if used > self.peak_bytes:
            self.peak_bytes = used
        return handle, cls

    def _fresh(self, cls: int) -> Any:
        try:
            handle = self._raw_alloc(cls)
        except MemoryError:  # give cached blocks back to the device and try once more
            self.empty_cache()
            handle = self._raw_alloc(cls)
        self.num_allocs += 1
        return handle

    def release(self, handle: Any, cls: int) -> None:
        self.bytes_in_use -= cls
        self.bytes_cached += cls
        self._cache.setdefault(cls, []).append(handle)

    def empty_cache(self) -> None:
        """Give every cached block back to the device. Each block is taken with one atomic `pop`, so a thread
        allocating meanwhile never gets a block that is being freed."""
        for cls, handles in list(self._cache.items()):
            while True:
                try:
                    h = handles.pop()
                except IndexError:
                    break
                self.bytes_cached -= cls
                self._raw_free(h)

    def reset_peak(self) -> None:
        self.peak_bytes = self.bytes_in_use

    def stats(self) -> dict[str, int]:
        return {
            "bytes_in_use": self.bytes_in_use,
            "peak_bytes": self.peak_bytes,
            "bytes_cached": self.bytes_cached,
            "num_allocs": self.num_allocs,
            "num_requests": self.num_requests,
        }


class Device:
    """One hardware device of a backend. Subclasses fill in the raw memory methods and `kernels`.

    Subclass contract (same order in every backend's device.py):
      backend_name   class attribute, the backend's name ("cpu", "opencl", ...)
      dtypes         class attribute, the dtypes it supports (default dtypes.ALL; float64 is optional)
      kernels        class or instance dict {primitive name: callable}; see singa.primitives for each signature
      _raw_alloc(nbytes) -> handle, _raw_free(handle)
      _copy_from_host(handle, byte_offset, host: numpy array (C-contiguous))   host -> device
      _copy_to_host(handle, byte_offset, host: numpy array (C-contiguous))     device -> host, fills `host`
      _copy_on_device(dst_handle, dst_byte_offset, src_handle, src_byte_offset, nbytes)
      synchronize()
    and, only where the buffers are memory of this process (host_memory = True, the CPU backend):
      host_buffer(view)   a writable buffer over a contiguous view's own bytes (MPI then works on it in place)
    """

    backend_name: ClassVar[str] = "?"
    # True when buffers are this process's host memory and host_buffer() exposes them (communicators skip copies)
    host_memory: ClassVar[bool] = False
    kernels: dict[str, Callable] = {}
    # dtypes its kernels compute; a device adds dtypes.float64 only if every kernel it has (or the fallback) handles it
    dtypes: ClassVar[tuple] = dtypes.ALL
    _graph: Any = None  # singa.device_graph.DeviceGraph, made by the first graph call
    # B > 0: the device's conv2d_fused also takes `blocks`, reading x and writing out (and the residual) in channel
    # blocks (N, C/B, H, W, B), the layout its library runs fastest (see channel_split); the ONNX inference plan then
    # keeps the activations between convolutions in it. 0: NCHW only, and `blocks` is never passed.
    channel_block: int = 0
    # {kernel: input}: kernels that also run with their output in the very bytes of that input (the same view); a
    # replayed graph then plans the output over the input where the input dies at that call. conv2d_fused's
    # residual is the one use: oneDNN's sum post-op adds what the output holds, so nothing is copied there first.
    # Empty: an output never overlaps an input of a non-element-wise kernel.
    shares_output_with: ClassVar[dict[str, str]] = {}

    def __init__(self, id: int = 0):
        self.id = id
        self.pool = MemoryPool(self._raw_alloc, self._raw_free)
        self.seed = 0
        self.rng_offset = 0
        self.verbosity = 0
        self._table = None

    # -- identity -------------------------------------------------------------------------------------------------
    @property
    def id(self) -> DeviceId:
        """The device's index within its backend: an int that is also callable, as SINGA's `dev.id()` method."""
        return self._id

    @id.setter
    def id(self, value: int) -> None:
        self._id = DeviceId(value)

    @property
    def name(self) -> str:
        return f"{self.backend_name}:{self.id}"

    def __repr__(self) -> str:
        return f"<Device {self.name}>"

    def id_(self) -> int:
        return int(self.id)

    # SINGA spelling
    def id_str(self) -> str:
        return self.name

    def lang(self) -> str:
        return self.backend_name

    def description(self) -> str:
        """One line for `python -m singa info`; backends override with hardware details."""
        return self.name

    # -- memory ---------------------------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Buffer:
        pool = self.pool
        if nbytes <= 1048576:  # small blocks: MemoryPool.acquire inlined, this is the per-op hot path
            cls = ((nbytes + 511) & ~511) or 512
            free = pool._cache.get(cls)
            if free:
                try:
                    handle = free.pop()
                except IndexError:  # another thread took the last one since the test above
                    handle, cls = pool.acquire(nbytes)
                    return Buffer(handle, nbytes, self, cls)
                pool.num_requests += 1
                pool.bytes_cached -= cls
                used = pool.bytes_in_use + cls
                pool.bytes_in_use = used
                if used > pool.peak_bytes:
                    pool.peak_bytes = used
                return Buffer(handle, nbytes, self, cls)
        handle, cls = pool.acquire(nbytes)
        return Buffer(handle, nbytes, self, cls)

    def _raw_alloc(self, nbytes: int) -> Any:
        raise NotImplementedError

    def _raw_free(self, handle: Any) -> None:
        raise NotImplementedError

    def _copy_from_host(self, handle: Any, byte_offset: int, host: np.ndarray) -> None:
        raise NotImplementedError

    def _copy_to_host(self, handle: Any, byte_offset: int, host: np.ndarray) -> None:
        raise NotImplementedError

    def _copy_on_device(self, dst: Any, dst_off: int, src: Any, src_off: int, nbytes: int) -> None:
        raise NotImplementedError

    def synchronize(self) -> None:
        pass

    def host_buffer(self, view) -> memoryview:
        """A writable buffer over the bytes of a contiguous view, for devices whose memory is host memory."""
        raise NotImplementedError(f"{self.name}: device memory is not host memory (host_memory is False)")

    def find_label_outside(self, view, classes: int) -> int:
        """The position of the first element of an int32/int64 view of class labels outside [0, classes), or -1.
        Training with a class-label loss asks it once per step (ops.check_labels); a backend may override it to
        answer without copying the labels to the host."""
        arr = self.read(view).reshape(-1)
        # one pass: seen as unsigned, a negative label is larger than any class count
        if not arr.size or arr.view(_UNSIGNED[arr.dtype.itemsize]).max() < classes:
            return -1
        return int(np.argmax((arr < 0) | (arr >= classes)))

    def Sync(self) -> None:  # SINGA spelling
        self.synchronize()

    def host(self) -> Device:
        """The host device (the CPU backend's), where SINGA keeps host-side tensors."""
        if self.backend_name == "cpu":
            return self
        from singa import device

        return device.get_device("cpu")

    def Reset(self) -> None:
        """SINGA's Device::Reset: stop and forget the graph, wait for the device, restore the profiling settings
        (verbosity 0, 5 warm-up iterations) and forget the profiled times."""
        from singa import profiling

        if self._graph is not None:
            self._graph.reset()
        self.synchronize()
        self.verbosity = 0
        p = profiling.profiler(self)
        p.reset()
        p.skip_iterations = profiling.DEFAULT_SKIP

    @staticmethod
    def EnableLazyAlloc(enable: bool) -> None:
        """Accepted for compatibility: every backend here allocates on first write through its pool."""

    def trim(self) -> None:
        """Return memory the device's allocator keeps after frees to the system, where it keeps any (the CPU backend:
        glibc's malloc_trim). Graph mode calls it after giving the recording step's cached blocks back, before it
        allocates its planned arena, so that the process does not hold both. Default: nothing."""

    def capture(self, run: Callable[[], None]) -> Callable[[], None] | None:
        """Record the device work that `run` launches into a graph the device replays in one call (CUDA Graphs),
        and return that replay; `run` is called once to record and its work is *not* executed. None (this default)
        when the device has no such facility: graph mode then replays the recorded kernels from Python."""
        return None

    def memory_stats(self) -> dict[str, int]:
        return self.pool.stats()

    # -- host transfers of views (used by tensors and by the fallback) --------------------------------------------
    def write(self, view, host: np.ndarray) -> None:
        """Copy a host array (any layout, already of the view's dtype and shape) into a contiguous view."""
        host = np.ascontiguousarray(host, dtype=dtypes.to_numpy_dtype(view.dtype))
        if host.size:
            self._copy_from_host(view.buffer.handle, view.offset * host.itemsize, host.reshape(-1))

    def read(self, view) -> np.ndarray:
        """Return a new host array holding the view's elements (any strides)."""
        npdt = dtypes.to_numpy_dtype(view.dtype)
        n = numel(view.shape)
        if n == 0:
            return np.empty(view.shape, npdt)
        lo, hi = _span(view)
        span = np.empty(hi - lo, npdt)
        self._copy_to_host(view.buffer.handle, lo * npdt.itemsize, span)
        if is_contiguous(view):
            return span.reshape(view.shape)
        rel = view.offset - lo
        strided = np.lib.stride_tricks.as_strided(
            span[rel:], view.shape, tuple(s * npdt.itemsize for s in view.strides), writeable=False
        )
        return np.ascontiguousarray(strided)

    def write_strided(self, view, host: np.ndarray) -> None:
        """Copy a host array into a view of any strides (read-modify-write of the spanned range)."""
        if is_contiguous(view):
            self.write(view, host)
            return
        npdt = dtypes.to_numpy_dtype(view.dtype)
        if numel(view.shape) == 0:
            return
        lo, hi = _span(view)
        span = np.empty(hi - lo, npdt)
        self._copy_to_host(view.buffer.handle, lo * npdt.itemsize, span)
        rel = view.offset - lo
        strided = np.lib.stride_tricks.as_strided(
            span[rel:], view.shape, tuple(s * npdt.itemsize for s in view.strides)
        )
        strided[...] = host
        self._copy_from_host(view.buffer.handle, lo * npdt.itemsize, span)

    def copy_view(self, dst, src) -> None:
        """Copy the elements of a contiguous view into a contiguous view of this device (same dtype)."""
        nbytes = numel(src.shape) * dtypes.itemsize(src.dtype)
        if nbytes == 0:
            return
        isz = dtypes.itemsize(src.dtype)
        if src.buffer.device is self:
            self._copy_on_device(dst.buffer.handle, dst.offset * isz, src.buffer.handle, src.offset * isz, nbytes)
        else:  # another device: through the host
            self.write(dst, src.buffer.device.read(src))

    # -- kernels --------------------------------------------------------------------------------------------------
    @property
    def table(self) -> dict[str, Callable]:
        """The kernel table: the backend's kernels; the composed primitives it lacks built from them
        (singa.composed); host fallbacks for the rest of the primitive set."""
        if self._table is None:
            from singa import composed, fallback, primitives

            own = {}
            for name in primitives.names():
                fn = self.kernels.get(name)
                if fn is None and name not in primitives.COMPOSED:
                    fn = fallback.make(self, name)
                if fn is not None:
                    own[name] = fn
            # in primitives.names() order, the composed ones built from the others (plain functions: see composed)
            self._table = {name: own[name] if name in own else composed.BUILDERS[name](own)
                           for name in primitives.names()}
        return self._table

    def missing_kernels(self) -> list[str]:
        """The primitives that run through the host fallback here (the composed ones never do)."""
        from singa import primitives

        return [n for n in primitives.names() if n not in self.kernels and n not in primitives.COMPOSED]

    def composed_kernels(self) -> list[str]:
        """The primitives `Device.table` builds from this backend's other kernels (see singa.composed)."""
        from singa import primitives

        return [n for n in primitives.names() if n not in self.kernels and n in primitives.COMPOSED]

    # -- fused operators a backend may provide ----------------------------------------------------------------------
    def rnn_operator(self, spec: Any, seq_lengths: Any = None) -> Any:
        """A fused RNN (cuDNN's, say) for `spec` (a singa.rnn.RNNSpec): an autograd Operator computing what
        singa.rnn.forward computes (see that module for its call and weight layout), or None for that generic path,
        which is what the base class gives."""
        return None

    # -- random numbers -------------------------------------------------------------------------------------------
    def set_rand_seed(self, seed: int) -> None:
        """Seed the device's counter-based generator (see primitives: random_*)."""
        self.seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        self.rng_offset = 0

    SetRandSeed = set_rand_seed

    def next_rng_offset(self, n: int) -> int:
        """Reserve `n` draws of the generator; returns the offset of the first (a multiple of 4)."""
        off = self.rng_offset
        self.rng_offset += (n + 3) & ~3
        return off

    # -- SINGA's graph calls (singa.device_graph): what SINGA's Model does to run train_one_batch as a graph ---------
    # While a step is being recorded, the recorder shadows EnableGraph and graph_enabled on the instance: there
    # EnableGraph(False) pauses the recording and EnableGraph(True) resumes it.
    def _graph_state(self):
        if self._graph is None:
            from singa import device_graph

            self._graph = device_graph.DeviceGraph(self)
        return self._graph

    def EnableGraph(self, enable: bool) -> None:
        """True: record the operations that follow (they still run now); False outside a recording: nothing."""
        self._graph_state().enable(bool(enable))

    def graph_enabled(self) -> bool:
        """Whether operations are being recorded now (False outside a recording)."""
        return False

    def RunGraph(self, serial: bool = False) -> None:
        """Finish a recording (its step has run), else replay the recorded graph: in program order when serial,
        otherwise scheduled by dependencies (same results)."""
        self._graph_state().run(serial)

    def ResetGraph(self) -> None:
        """Forget the recorded graph (and any recording in progress)."""
        if self._graph is not None:
            self._graph.reset()

    # -- SINGA's verbosity / time profiling of graph-mode steps (kept in singa.profiling) ---------------------------
    def SetVerbosity(self, verbosity: int) -> None:
        self.verbosity = verbosity

    def SetSkipIteration(self, skip: int) -> None:
        from singa import profiling

        profiling.set_skip_iteration(self, skip)

    def PrintTimeProfiling(self) -> None:
        from singa import profiling

        profiling.print_time_profiling(self)

    def export_chrome_trace(self, path) -> None:
        """Write the profiled steps as Chrome trace JSON (chrome://tracing, Perfetto)."""
        from singa import profiling

        profiling.export_chrome_trace(self, path)


class DeviceId(int):
    """A device index that can be called: `dev.id` is the index and `dev.id()` (SINGA's method) returns it too."""

    def __call__(self) -> int:
        return int(self)


def _span(view) -> tuple[int, int]:
    lo = hi = view.offset
    for d, s in zip(view.shape, view.strides):
        if d == 0:
            return view.offset, view.offset
        if s > 0:
            hi += (d - 1) * s
        else:
            lo += (d - 1) * s
    return lo, hi + 1


class DistributionVersion:
    """The `version` of a plugin class: the installed version of its `distribution` ("0+unknown" when it runs from
    a source tree without metadata). A plugin may set `version` itself instead."""

    def __get__(self, obj: Any, owner: type) -> str:
        return _distribution_version(owner.distribution)


@functools.cache
def _distribution_version(distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except (PackageNotFoundError, ValueError):
        return "0+unknown"


class Backend:
    """What a `singa.backends` plugin returns from its `singa_backend` hook.

    name          the name users select with SINGA_DEVICE ("cpu", "cuda", "opencl", or a plugin's own)
    distribution  the pip distribution that provides it, for error messages and `python -m singa info`
    version       that distribution's version (found from `distribution` unless the plugin sets it)
    """

    name: str = "?"
    distribution: str = "?"
    version = DistributionVersion()

    def device_count(self) -> int:
        return 1

    def create_device(self, index: int = 0) -> Device:
        raise NotImplementedError

    def info(self) -> dict[str, str]:
        """Extra facts for `python -m singa info` (library versions, thread counts...)."""
        return {}
