"""oneDNN as a kernel provider: float32 matrix products (its sgemm, called from the C kernels: see install_sgemm) and
convolutions (forward and both gradients) through Intel's deep-learning kernel library, the one PyTorch and
TensorFlow use on CPUs, where it beats the backend's own kernels.

The library comes from the `onednn-cpu-gomp` wheel (x86-64 Linux only: a dependency with a platform marker) and is
reached through cffi in ABI mode, so nothing here is compiled. It runs on GNU OpenMP, the runtime the backend's own
kernels use: one thread pool in the process, sized by the same `set_num_threads`.

Three providers can run a convolution: oneDNN with the operands reordered into the blocked layouts it prefers and
back (its direct kernels; for a forward convolution, NHWC and its brgemm-based kernels instead where those are
clearly faster, measured once per shape), oneDNN reading and writing NCHW where it lies (its GEMM-based kernels),
and the backend's own C kernel. `SINGA_ONEDNN` picks, read when a shape is first seen:
  - `auto` (default): for each new shape, time each provider (three turns each) and keep the fastest, the blocked
    layout unless another is 10% faster (once per process);
  - `1`: oneDNN, blocked where it builds (results reproducible run to run); `nchw`: oneDNN on NCHW;
  - `0`: never (the backend's own kernels, as on machines without the wheel).

Tensors stay plain NCHW for the rest of the backend. A plan (one per shape, layout and thread) holds the primitives
and reorders; its temporary buffers live in one per-thread arena, reused by every plan, so memory grows with the
largest convolution, not with their number.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import importlib.metadata
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import cffi

from singa.backend import constant_token
from singa.kernel_args import describe
from singa_backend_cpu.kept import KeptCopies

SETTING = "SINGA_ONEDNN"
MODES = ("auto", "1", "nchw", "0")
DISTRIBUTION = "onednn-cpu-gomp"

# The part of oneDNN 3's C API (oneapi/dnnl/dnnl.h) this module uses. Enumerations are ints: their values below are
# from dnnl_types.h and fixed by oneDNN's ABI for every 3.x release.
_CDEF = """
typedef int dnnl_status_t;
typedef int64_t dnnl_dims_t[12];
typedef struct dnnl_engine *dnnl_engine_t;
typedef struct dnnl_stream *dnnl_stream_t;
typedef struct dnnl_memory_desc *dnnl_memory_desc_t;
typedef const struct dnnl_memory_desc *const_dnnl_memory_desc_t;
typedef struct dnnl_memory *dnnl_memory_t;
typedef struct dnnl_primitive_desc *dnnl_primitive_desc_t;
typedef struct dnnl_primitive *dnnl_primitive_t;
typedef struct { int arg; dnnl_memory_t memory; } dnnl_exec_arg_t;
typedef struct { int major; int minor; int patch; const char *hash; unsigned cpu_runtime; unsigned gpu_runtime; }
    dnnl_version_t;

const dnnl_version_t *dnnl_version(void);
dnnl_status_t dnnl_engine_create(dnnl_engine_t *engine, int kind, size_t index);
dnnl_status_t dnnl_stream_create(dnnl_stream_t *stream, dnnl_engine_t engine, unsigned flags);
dnnl_status_t dnnl_stream_wait(dnnl_stream_t stream);
dnnl_status_t dnnl_stream_destroy(dnnl_stream_t stream);
dnnl_status_t dnnl_memory_desc_create_with_tag(dnnl_memory_desc_t *md, int ndims, const dnnl_dims_t dims,
                                               int data_type, int tag);
dnnl_status_t dnnl_memory_desc_destroy(dnnl_memory_desc_t md);
int dnnl_memory_desc_equal(const_dnnl_memory_desc_t lhs, const_dnnl_memory_desc_t rhs);
size_t dnnl_memory_desc_get_size(const_dnnl_memory_desc_t md);
dnnl_status_t dnnl_memory_create(dnnl_memory_t *memory, const_dnnl_memory_desc_t md, dnnl_engine_t engine,
                                 void *handle);
dnnl_status_t dnnl_memory_set_data_handle(dnnl_memory_t memory, void *handle);
dnnl_status_t dnnl_memory_destroy(dnnl_memory_t memory);
dnnl_status_t dnnl_convolution_forward_primitive_desc_create(
    dnnl_primitive_desc_t *pd, dnnl_engine_t engine, int prop_kind, int alg_kind, const_dnnl_memory_desc_t src,
    const_dnnl_memory_desc_t weights, const_dnnl_memory_desc_t bias, const_dnnl_memory_desc_t dst,
    const dnnl_dims_t strides, const dnnl_dims_t dilates, const dnnl_dims_t padding_l, const dnnl_dims_t padding_r,
    const void *attr);
dnnl_status_t dnnl_convolution_backward_data_primitive_desc_create(
    dnnl_primitive_desc_t *pd, dnnl_engine_t engine, int alg_kind, const_dnnl_memory_desc_t diff_src,
    const_dnnl_memory_desc_t weights, const_dnnl_memory_desc_t diff_dst, const dnnl_dims_t strides,
    const dnnl_dims_t dilates, const dnnl_dims_t padding_l, const dnnl_dims_t padding_r,
    const dnnl_primitive_desc_t hint_fwd_pd, const void *attr);
dnnl_status_t dnnl_convolution_backward_weights_primitive_desc_create(
    dnnl_primitive_desc_t *pd, dnnl_engine_t engine, int alg_kind, const_dnnl_memory_desc_t src,
    const_dnnl_memory_desc_t diff_weights, const_dnnl_memory_desc_t diff_bias, const_dnnl_memory_desc_t diff_dst,
    const dnnl_dims_t strides, const dnnl_dims_t dilates, const dnnl_dims_t padding_l, const dnnl_dims_t padding_r,
    const dnnl_primitive_desc_t hint_fwd_pd, const void *attr);
dnnl_status_t dnnl_pooling_forward_primitive_desc_create(
    dnnl_primitive_desc_t *pd, dnnl_engine_t engine, int prop_kind, int alg_kind, const_dnnl_memory_desc_t src,
    const_dnnl_memory_desc_t dst, const dnnl_dims_t strides, const dnnl_dims_t kernel, const dnnl_dims_t dilation,
    const dnnl_dims_t padding_l, const dnnl_dims_t padding_r, const void *attr);
dnnl_status_t dnnl_reorder_primitive_desc_create(
    dnnl_primitive_desc_t *pd, const_dnnl_memory_desc_t src, dnnl_engine_t src_engine,
    const_dnnl_memory_desc_t dst, dnnl_engine_t dst_engine, const void *attr);
const_dnnl_memory_desc_t dnnl_primitive_desc_query_md(const dnnl_primitive_desc_t pd, int what, int index);
dnnl_status_t dnnl_primitive_desc_query(const dnnl_primitive_desc_t pd, int what, int index, void *result);
dnnl_status_t dnnl_primitive_desc_destroy(dnnl_primitive_desc_t pd);
dnnl_status_t dnnl_primitive_create(dnnl_primitive_t *primitive, const dnnl_primitive_desc_t pd);
dnnl_status_t dnnl_primitive_execute(const dnnl_primitive_t primitive, dnnl_stream_t stream, int nargs,
                                     const dnnl_exec_arg_t *args);
dnnl_status_t dnnl_primitive_destroy(dnnl_primitive_t primitive);
typedef struct dnnl_primitive_attr *dnnl_primitive_attr_t;
typedef struct dnnl_post_ops *dnnl_post_ops_t;
dnnl_status_t dnnl_primitive_attr_create(dnnl_primitive_attr_t *attr);
dnnl_status_t dnnl_primitive_attr_destroy(dnnl_primitive_attr_t attr);
dnnl_status_t dnnl_primitive_attr_set_post_ops(dnnl_primitive_attr_t attr, const struct dnnl_post_ops *post_ops);
dnnl_status_t dnnl_post_ops_create(dnnl_post_ops_t *post_ops);
dnnl_status_t dnnl_post_ops_destroy(dnnl_post_ops_t post_ops);
dnnl_status_t dnnl_post_ops_append_sum(dnnl_post_ops_t post_ops, float scale, int32_t zero_point, int data_type);
dnnl_status_t dnnl_post_ops_append_eltwise(dnnl_post_ops_t post_ops, int alg_kind, float alpha, float beta);
dnnl_status_t dnnl_sgemm(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                         int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
"""

F32 = 3  # dnnl_f32
TAG_ANY, TAG_A, TAG_ABCD, TAG_ABCDE = 1, 2, 5, 6
TAG_BLOCKED = {16: 78, 8: 102}  # channel blocks of B: dnnl_aBcd16b, dnnl_aBcd8b (N, C/B, H, W, B)
TAG_ACDB = 22  # dnnl_acdb: channels last (N, H, W, C), the activation layout of oneDNN's brgemm-based kernels
FORWARD_TRAINING, FORWARD_INFERENCE, BACKWARD_DATA, BACKWARD_WEIGHTS = 64, 96, 160, 192
POOLING_MAX, POOLING_AVG_INCLUDE, POOLING_AVG_EXCLUDE = 0x1FF, 0x2FF, 0x3FF
CONVOLUTION_DIRECT = 1
ELTWISE_RELU, DATA_TYPE_UNDEF = 0x20, 0
ENGINE_CPU, STREAM_DEFAULT = 1, 1
Q_IMPL_INFO = 8
Q_SRC, Q_DIFF_SRC, Q_WEIGHTS, Q_DIFF_WEIGHTS, Q_DST, Q_DIFF_DST = 129, 130, 131, 132, 133, 134
ARG_SRC, ARG_DST, ARG_WEIGHTS, ARG_BIAS = 1, 17, 33, 41
ARG_DIFF_SRC, ARG_DIFF_DST, ARG_DIFF_WEIGHTS = 129, 145, 161
_STATUS = {1: "out of memory", 2: "invalid arguments", 3: "unimplemented", 4: "iterator ends", 5: "runtime error",
           6: "not required", 7: "invalid graph", 8: "invalid graph op", 9: "invalid shape", 10: "invalid data type"}
_ALIGN = 64
NO_POST = (False, False)  # conv2d_fused's post-ops (residual, relu): none


class OneDnnError(RuntimeError):
    """A oneDNN call failed; the message names the call, the status and the operation."""


def _find_library() -> str | None:
    """libdnnl.so.3 from the onednn-cpu-gomp wheel (its files say where pip put it), else a system-wide oneDNN 3."""
    try:
        files = importlib.metadata.distribution(DISTRIBUTION).files or ()
    except importlib.metadata.PackageNotFoundError:
        files = ()
    for f in files:
        if f.name == "libdnnl.so.3":
            path = os.path.realpath(f.locate())
            if os.path.exists(path):
                return path
    return ctypes.util.find_library("dnnl")


# Found, and the declarations parsed, when the backend is imported: loading the library on the first convolution must
# not read files or import modules then (a sandboxed process may be running an untrusted model by that time).
_PATH = _find_library()
_FFI = cffi.FFI()
_FFI.cdef(_CDEF)


class _Library:
    """The loaded library, its CPU engine and version (one per process)."""

    def __init__(self) -> None:
        path = _PATH
        if path is None:
            raise OSError(f"oneDNN is not installed (pip install {DISTRIBUTION}; x86-64 Linux only)")
        self.path = path
        self.ffi = _FFI
        self.lib = self.ffi.dlopen(path)
        v = self.lib.dnnl_version()
        self.version = (v.major, v.minor, v.patch)
        if v.major != 3:
            raise OSError(f"oneDNN {v.major}.{v.minor} at {path}: this backend speaks oneDNN 3's C API")
        engine = self.ffi.new("dnnl_engine_t *")
        self.check(self.lib.dnnl_engine_create(engine, ENGINE_CPU, 0), "dnnl_engine_create", "engine")
        self.engine = engine[0]

    def check(self, status: int, call: str, what: str) -> None:
        if status:
            message = f"oneDNN {call} failed for {what}: {_STATUS.get(status, f'status {status}')}"
            raise MemoryError(message) if status == 1 else OneDnnError(message)


_library: _Library | None = None
_load_error: str | None = None
_load_lock = threading.Lock()


def library() -> _Library | None:
    """The loaded library, or None where it cannot be loaded (`status()` says why)."""
    global _library, _load_error
    if _library is None and _load_error is None:
        with _load_lock:
            if _library is None and _load_error is None:
                try:
                    _library = _Library()
                except (OSError, AttributeError) as e:
                    _load_error = str(e)
    return _library


def mode() -> str:
    """SINGA_ONEDNN's value ('auto' when unset); an unknown value is an error that names the variable."""
    raw = os.environ.get(SETTING, "auto").strip().lower() or "auto"
    aliases = {"on": "1", "true": "1", "yes": "1", "off": "0", "false": "0", "no": "0"}
    value = aliases.get(raw, raw)
    if value not in MODES:
        raise ValueError(f"{SETTING}={raw!r}: expected auto, 1, nchw or 0")
    return value


def in_use() -> bool:
    """oneDNN is installed and not turned off (SINGA_ONEDNN=0)."""
    return library() is not None and mode() != "0"


_sgemm_on = False


def install_sgemm(set_sgemm: Callable[[int], None]) -> bool:
    """Hand oneDNN's dnnl_sgemm (row-major float32 GEMM) to the C kernels' matrix products: `set_sgemm(address)`,
    unless oneDNN is not loaded or SINGA_ONEDNN is 0 (an unknown value leaves it off here; the first convolution
    names it). Called once, when the kernel table loads; True when installed."""
    global _sgemm_on
    try:
        off = mode() == "0"
    except ValueError:
        off = True
    lib = None if off else library()
    if lib is not None:
        set_sgemm(int(lib.ffi.cast("uintptr_t", lib.lib.dnnl_sgemm)))
        _sgemm_on = True
    return _sgemm_on


def status() -> str:
    """One line for `python -m singa info`."""
    lib = library()
    if lib is None:
        return f"not used: {_load_error}"
    with _choice_lock:
        used = sum(1 for c in _choices.values() if c != OWN)
        total = len(_choices)
    return (f"oneDNN {'.'.join(map(str, lib.version))} ({lib.path}); {SETTING}={mode()}; float32 matrix products "
            f"({'on' if _sgemm_on else 'off'}) and convolutions ({used} of {total} shapes seen so far run on it)")


# -- plans --------------------------------------------------------------------------------------------------------


class _Plan:
    """The primitives of one operation on one shape: reorders in, the operation, reorders out.

    `user` are the memory objects of the caller's tensors (their handles are set per call); `temps` the ones oneDNN
    wants in another layout, placed in the thread's arena at `offsets` (total `arena_bytes`).
    """

    def __init__(self, lib: _Library, what: str) -> None:
        self.lib, self.what = lib, what
        self.keep: list[Any] = []  # descriptors, primitives and memories the plan owns
        self.user: list[Any] = []
        self.user_bytes: list[int] = []  # the size of each of `user` (scratch operands for timing a plan)
        self.temps: list[Any] = []
        self.offsets: list[int] = []
        self.arena_bytes = 0
        self.steps: list[tuple[Any, Any, int]] = []
        self.impl = ""
        self.tail = False  # conv2d_fused's post-ops left to the caller's tail() (set by _plan)
        # the reorder of the weights into oneDNN's layout (forward only): skipped for weights declared constant,
        # whose reordered copy is kept (see `run`)
        self.weight_step = -1
        self.weight_temp = None
        self.weight_bytes = 0
        self.residual_bytes = 0  # conv2d_fused: bytes of the residual `run` copies into the output first (last operand)

    # building

    def md(self, dims, tag: int):
        ffi, lib = self.lib.ffi, self.lib.lib
        out = ffi.new("dnnl_memory_desc_t *")
        d = ffi.new("dnnl_dims_t", list(dims))
        self.lib.check(lib.dnnl_memory_desc_create_with_tag(out, len(dims), d, F32, tag),
                       "dnnl_memory_desc_create_with_tag", self.what)
        return ffi.gc(out[0], lib.dnnl_memory_desc_destroy)

    def pd(self, create: Callable, *args):
        ffi = self.lib.ffi
        out = ffi.new("dnnl_primitive_desc_t *")
        self.lib.check(create(out, *args), create.__name__, self.what)
        return ffi.gc(out[0], self.lib.lib.dnnl_primitive_desc_destroy)

    def post_ops(self, post: tuple):
        """Primitive attributes with oneDNN post-ops for `post` = (residual, relu): dst = relu(conv + dst), the
        residual having been copied into dst first; NULL for none."""
        ffi, lib = self.lib.ffi, self.lib.lib
        residual, relu = post
        if not (residual or relu):
            return ffi.NULL
        attr = ffi.new("dnnl_primitive_attr_t *")
        self.lib.check(lib.dnnl_primitive_attr_create(attr), "dnnl_primitive_attr_create", self.what)
        attr = ffi.gc(attr[0], lib.dnnl_primitive_attr_destroy)
        ops_ = ffi.new("dnnl_post_ops_t *")
        self.lib.check(lib.dnnl_post_ops_create(ops_), "dnnl_post_ops_create", self.what)
        ops_ = ffi.gc(ops_[0], lib.dnnl_post_ops_destroy)
        if residual:
            self.lib.check(lib.dnnl_post_ops_append_sum(ops_, 1.0, 0, DATA_TYPE_UNDEF), "dnnl_post_ops_append_sum",
                           self.what)
        if relu:
            self.lib.check(lib.dnnl_post_ops_append_eltwise(ops_, ELTWISE_RELU, 0.0, 0.0),
                           "dnnl_post_ops_append_eltwise", self.what)
        self.lib.check(lib.dnnl_primitive_attr_set_post_ops(attr, ops_), "dnnl_primitive_attr_set_post_ops",
                       self.what)
        self.keep.append(attr)
        return attr

    def _memory(self, md, handle=None):
        ffi, lib = self.lib.ffi, self.lib.lib
        out = ffi.new("dnnl_memory_t *")
        self.lib.check(lib.dnnl_memory_create(out, md, self.lib.engine, ffi.NULL if handle is None else handle),
                       "dnnl_memory_create", self.what)
        mem = ffi.gc(out[0], lib.dnnl_memory_destroy)
        self.keep.append(md)
        return mem

    def user_memory(self, md):
        mem = self._memory(md)
        self.user.append(mem)
        self.user_bytes.append(int(self.lib.lib.dnnl_memory_desc_get_size(md)))
        return mem

    def output_first(self) -> None:
        """Move the last user memory made (the operation's output) to the front: callers pass the output first."""
        self.user.insert(0, self.user.pop())
        self.user_bytes.insert(0, self.user_bytes.pop())

    def temp_memory(self, md):
        mem = self._memory(md)
        self.temps.append(mem)
        self.offsets.append(self.arena_bytes)
        size = int(self.lib.lib.dnnl_memory_desc_get_size(md))
        self.arena_bytes += (size + _ALIGN - 1) // _ALIGN * _ALIGN
        return mem

    def step(self, pd, args: list[tuple[int, Any]]) -> None:
        ffi, lib = self.lib.ffi, self.lib.lib
        prim = ffi.new("dnnl_primitive_t *")
        self.lib.check(lib.dnnl_primitive_create(prim, pd), "dnnl_primitive_create", self.what)
        arr = ffi.new("dnnl_exec_arg_t[]", len(args))
        for i, (arg, mem) in enumerate(args):
            arr[i].arg, arr[i].memory = arg, mem
        self.keep.extend((pd, arr))
        self.steps.append((ffi.gc(prim[0], lib.dnnl_primitive_destroy), arr, len(args)))

    def reorder(self, src_mem, src_md, dst_mem, dst_md) -> None:
        lib = self.lib
        pd = self.pd(lib.lib.dnnl_reorder_primitive_desc_create, src_md, lib.engine, dst_md, lib.engine,
                     lib.ffi.NULL)
        self.step(pd, [(ARG_SRC, src_mem), (ARG_DST, dst_mem)])

    def operand_in(self, user_md, want_md):
        """Memory the operation reads: the caller's own if the layout is the one oneDNN chose, else a reordered copy."""
        user = self.user_memory(user_md)
        if self.lib.lib.dnnl_memory_desc_equal(user_md, want_md):
            return user
        temp = self.temp_memory(want_md)
        self.reorder(user, user_md, temp, want_md)
        return temp

    def operand_out(self, user_md, got_md, after: list):
        """Memory the operation writes; a layout other than the caller's is reordered into it after the operation."""
        user = self.user_memory(user_md)
        if self.lib.lib.dnnl_memory_desc_equal(user_md, got_md):
            return user
        temp = self.temp_memory(got_md)
        after.append((temp, got_md, user, user_md))
        return temp

    def describe(self, pd) -> None:
        out = self.lib.ffi.new("const char **")
        if not self.lib.lib.dnnl_primitive_desc_query(pd, Q_IMPL_INFO, 0, out):
            self.impl = self.lib.ffi.string(out[0]).decode()

    # running

    def run(self, addresses: list[int], thread: _ThreadState, constant: tuple | None = None,
            pointers: list | None = None, kept_at: tuple[int, bool] | None = None) -> None:
        """Run on the operands at `addresses` (`pointers`: the same as `void *`, made once by a bound launch);
        `constant`: (key, buffer) when the weights' buffer is declared constant (singa.backend.declare_constant):
        their reordered copy is made once per key and reused. `kept_at` (without `constant`): (address of
        weight_bytes for the reordered weights, whether they are there already), a caller's own kept copy."""
        ffi, lib = self.lib.ffi, self.lib.lib
        for mem, ptr in zip(self.user, pointers or [ffi.cast("void *", a) for a in addresses]):
            lib.dnnl_memory_set_data_handle(mem, ptr)
        if self.temps:
            base = thread.arena(self.arena_bytes)
            for mem, off in zip(self.temps, self.offsets):
                lib.dnnl_memory_set_data_handle(mem, ffi.cast("void *", base + off))
        skip, made, block = -1, False, None
        if constant is not None and self.weight_step >= 0:
            block, addr, made = _constant_weights(constant, self.weight_bytes)  # `block` lives through the run
            lib.dnnl_memory_set_data_handle(self.weight_temp, ffi.cast("void *", addr))
            if not made:
                skip = self.weight_step
        elif kept_at is not None and self.weight_step >= 0:
            lib.dnnl_memory_set_data_handle(self.weight_temp, ffi.cast("void *", kept_at[0]))
            if kept_at[1]:
                skip = self.weight_step
        if self.residual_bytes and addresses[0] != addresses[-1]:  # the same: a graph planned the output over it
            _copy_bytes(addresses[0], addresses[-1], self.residual_bytes)
        stream = thread.stream
        for i, (prim, args, n) in enumerate(self.steps):
            if i == skip:
                continue
            st = lib.dnnl_primitive_execute(prim, stream, n, args)
            if st:
                self.lib.check(st, "dnnl_primitive_execute", self.what)
        lib.dnnl_stream_wait(stream)
        if made:
            _keep_weights(constant, block, addr)


def _copy_bytes(dst: int, src: int, nbytes: int) -> None:
    """The backend's parallel memcpy between two addresses."""
    from singa_backend_cpu.device import ffi, lib

    lib.sg_memcopy(ffi.cast("char *", dst), 0, ffi.cast("char *", src), 0, nbytes)


class _ThreadState(threading.local):
    """A thread's stream, plans and arena: oneDNN streams and the memory objects a plan re-points are not shared."""

    def __init__(self) -> None:
        self._stream = None
        self.plans: dict[tuple, _Plan] = {}
        self.omp_threads = 0  # the OpenMP team size this thread was given for oneDNN (0: not yet)
        self._arena = None
        self._arena_bytes = 0
        self._arena_base = 0

    @property
    def stream(self):
        if self._stream is None:
            lib = library()
            out = lib.ffi.new("dnnl_stream_t *")
            lib.check(lib.lib.dnnl_stream_create(out, lib.engine, STREAM_DEFAULT), "dnnl_stream_create", "stream")
            self._stream = lib.ffi.gc(out[0], lib.lib.dnnl_stream_destroy)
        return self._stream

    def arena(self, nbytes: int) -> int:
        """The address of at least `nbytes` of scratch memory, 64-byte aligned (grown, never shrunk)."""
        if nbytes > self._arena_bytes:
            lib = library()
            self._arena = None  # free the old block first
            self._arena = lib.ffi.new("char[]", nbytes + _ALIGN)
            addr = int(lib.ffi.cast("uintptr_t", self._arena))
            self._arena_base = (addr + _ALIGN - 1) // _ALIGN * _ALIGN
            self._arena_bytes = nbytes
        return self._arena_base


_thread = _ThreadState()


def _conv_dims(g) -> dict[str, list]:
    x = [g.N, g.C, g.H, g.W]
    w = [g.K, g.Cg, g.kh, g.kw] if g.G == 1 else [g.G, g.Kg, g.Cg, g.kh, g.kw]
    y = [g.N, g.K, g.OH, g.OW]
    return {"x": x, "w": w, "y": y, "strides": [g.sh, g.sw], "dilates": [g.dh - 1, g.dw - 1],
            "pad_l": [g.pt, g.pl], "pad_r": [g.pb, g.pr]}


def _forward_pd(plan: _Plan, g, bias: bool, blocked: bool, post: tuple = NO_POST, tags: tuple | None = None,
                prop: int = FORWARD_TRAINING):
    """The forward primitive descriptor; `tags`: the activations' (x, y) layouts, else oneDNN's pick (`blocked`)
    or the caller's NCHW; `prop`: FORWARD_INFERENCE admits kernels that FORWARD_TRAINING does not (oneDNN 3.2's
    brgemm-based float32 convolutions), with the same results: a convolution keeps nothing for its backward."""
    d, lib = _conv_dims(g), plan.lib
    ffi = lib.ffi
    wtag = TAG_ABCD if g.G == 1 else TAG_ABCDE
    act = TAG_ANY if blocked else TAG_ABCD
    x_tag, y_tag = tags or (act, act)
    b_any = plan.md([g.K], TAG_ANY) if bias else ffi.NULL
    pd = plan.pd(lib.lib.dnnl_convolution_forward_primitive_desc_create, lib.engine, prop,
                 CONVOLUTION_DIRECT, plan.md(d["x"], x_tag), plan.md(d["w"], TAG_ANY), b_any,
                 plan.md(d["y"], y_tag), ffi.new("dnnl_dims_t", d["strides"]), ffi.new("dnnl_dims_t", d["dilates"]),
                 ffi.new("dnnl_dims_t", d["pad_l"]), ffi.new("dnnl_dims_t", d["pad_r"]), plan.post_ops(post))
    return pd, d, wtag, act


def _conv_plan(kind: str, g, bias: bool, blocked: bool, post: tuple = NO_POST, blocks: tuple = (0, 0),
               channels_last: bool = False) -> _Plan:
    """A plan for convolution `kind`; `blocked`: activations in the layout oneDNN prefers (reordered from and to
    NCHW around the operation), else read and written as NCHW where they are (oneDNN's GEMM-based kernels);
    `post` (conv2d_fused): (residual, relu), oneDNN's sum and ReLU post-ops; `blocks` (forward only): the caller's
    x and y (with the residual) in channel blocks of that size (0: NCHW), run in that layout where oneDNN can;
    `channels_last` (forward only): the activations reordered to and from NHWC for oneDNN's brgemm-based kernels
    (OneDnnError where none builds for the shape)."""
    lib = library()
    plan = _Plan(lib, f"{kind} of x {g.N}x{g.C}x{g.H}x{g.W}, w {g.K}x{g.Cg}x{g.kh}x{g.kw}, groups {g.G}")
    user = tuple(TAG_BLOCKED[b] if b else TAG_ABCD for b in blocks)  # the caller's layouts of x and y
    fwd = None
    if channels_last:
        fwd, d, wtag, act = _forward_pd(plan, g, bias, True, post, (TAG_ACDB, TAG_ACDB), FORWARD_INFERENCE)
        plan.describe(fwd)
        if not plan.impl.startswith(("brg", "brdgmm")):
            raise OneDnnError(f"oneDNN has no brgemm-based kernel for {plan.what} (its pick: {plan.impl})")
    elif blocks != (0, 0):
        try:  # the kernels for the caller's layout, so that nothing is reordered; else oneDNN's pick and reorders
            fwd, d, wtag, act = _forward_pd(plan, g, bias, blocked, post,
                                            tuple(t if b else TAG_ANY for t, b in zip(user, blocks)))
            plan.describe(fwd)
            if plan.impl.startswith("ref"):  # its reference code (e.g. groups of 28 channels): slower than reorders
                fwd = None
        except OneDnnError:
            fwd = None
    if fwd is None:
        fwd, d, wtag, act = _forward_pd(plan, g, bias, blocked, post)
    ffi, q = lib.ffi, lib.lib.dnnl_primitive_desc_query_md
    dims = [ffi.new("dnnl_dims_t", d[k]) for k in ("strides", "dilates", "pad_l", "pad_r")]
    after: list = []
    if kind in ("conv2d", "conv2d_fused"):
        pd = fwd
        x = plan.operand_in(plan.md(d["x"], user[0]), q(pd, Q_SRC, 0))
        steps = len(plan.steps)
        w_want = q(pd, Q_WEIGHTS, 0)
        w = plan.operand_in(plan.md(d["w"], wtag), w_want)
        if len(plan.steps) > steps:  # the weights are reordered: a copy that constant weights can keep
            plan.weight_step, plan.weight_temp = steps, w
            plan.weight_bytes = int(lib.lib.dnnl_memory_desc_get_size(w_want))
        args = [(ARG_SRC, x), (ARG_WEIGHTS, w)]
        if bias:
            args.append((ARG_BIAS, plan.user_memory(plan.md([g.K], TAG_A))))
        y_md = plan.md(d["y"], user[1])
        dst = plan.operand_out(y_md, q(pd, Q_DST, 0), after)
        args.append((ARG_DST, dst))
        plan.output_first()  # y's memory first, as the caller passes it (out, x, w, b, residual)
        if post[0]:  # the sum post-op adds what dst holds: the residual, copied (reordered) there first
            residual = plan.user_memory(y_md)
            if dst is plan.user[0]:  # the same layout: a parallel memcpy (oneDNN's own copy is its slow generic one)
                plan.residual_bytes = int(lib.lib.dnnl_memory_desc_get_size(y_md))
            else:
                plan.reorder(residual, y_md, dst, q(pd, Q_DST, 0))
    elif kind == "conv2d_backward_data":
        pd = plan.pd(lib.lib.dnnl_convolution_backward_data_primitive_desc_create, lib.engine, CONVOLUTION_DIRECT,
                     plan.md(d["x"], act), plan.md(d["w"], TAG_ANY), plan.md(d["y"], act), *dims, fwd,
                     ffi.NULL)
        # the caller's order: dx (written), dy, w
        dx_user_md = plan.md(d["x"], TAG_ABCD)
        dy = plan.operand_in(plan.md(d["y"], TAG_ABCD), q(pd, Q_DIFF_DST, 0))
        w = plan.operand_in(plan.md(d["w"], wtag), q(pd, Q_WEIGHTS, 0))
        dx = plan.operand_out(dx_user_md, q(pd, Q_DIFF_SRC, 0), after)
        plan.output_first()  # dx's memory first, as the caller passes it
        args = [(ARG_DIFF_DST, dy), (ARG_WEIGHTS, w), (ARG_DIFF_SRC, dx)]
    elif kind == "conv2d_backward_weight":
        pd = plan.pd(lib.lib.dnnl_convolution_backward_weights_primitive_desc_create, lib.engine,
                     CONVOLUTION_DIRECT, plan.md(d["x"], act), plan.md(d["w"], TAG_ANY), ffi.NULL,
                     plan.md(d["y"], act), *dims, fwd, ffi.NULL)
        dy = plan.operand_in(plan.md(d["y"], TAG_ABCD), q(pd, Q_DIFF_DST, 0))
        x = plan.operand_in(plan.md(d["x"], TAG_ABCD), q(pd, Q_SRC, 0))
        dw = plan.operand_out(plan.md(d["w"], wtag), q(pd, Q_DIFF_WEIGHTS, 0), after)
        plan.output_first()  # dw first
        args = [(ARG_DIFF_DST, dy), (ARG_SRC, x), (ARG_DIFF_WEIGHTS, dw)]
    else:
        raise ValueError(f"oneDNN provider: no plan for {kind!r}")
    plan.step(pd, args)
    plan.describe(pd)
    for temp, temp_md, user, user_md in after:
        plan.reorder(temp, temp_md, user, user_md)
    plan.keep.append(fwd)
    return plan


# -- reordered copies of constant weights ------------------------------------------------------------------------

_weights = KeptCopies()  # key -> (block, aligned address) of the reordered weights


def _constant_weights(constant: tuple, nbytes: int) -> tuple[Any, int, bool]:
    """(block, its aligned address, whether it is new) for the reordered weights of `constant` = (key, buffer,
    token). A new block is this run's to fill and `_keep_weights` publishes it afterwards."""
    kept = _weights.get(*constant)
    if kept is not None:
        return kept[0], kept[1], False
    ffi = library().ffi
    block = ffi.new("char[]", nbytes + _ALIGN)
    return block, (int(ffi.cast("uintptr_t", block)) + _ALIGN - 1) // _ALIGN * _ALIGN, True


def _keep_weights(constant: tuple, block: Any, addr: int) -> None:
    _weights.put(*constant, (block, addr))


# -- the choice between oneDNN and the backend's own kernel -------------------------------------------------------

OWN, BLOCKED, PLAIN = "own", "onednn", "onednn-nchw"  # the providers a shape can be given
ROUNDS = 3  # timed turns per provider when a shape is first met (SINGA_ONEDNN=auto)
MARGIN = 0.1  # how much faster than oneDNN's blocked layout another provider must be to be chosen
_choices: dict[tuple, str] = {}  # shape key -> provider (decided once per process)
_choice_lock = threading.RLock()  # re-entered: _decide builds plans, whose forward layout is decided under it


def _best_of(fn: Callable[[], None], runs: int = 2) -> float:
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def conv(kind: str, g, views: tuple, addresses: list[int], ours: Callable[[], None],
         weights: Any = None, bias: bool = False, post: tuple = NO_POST, tail: Callable[[], None] | None = None
         ) -> None:
    """Run convolution `kind` (conv2d, conv2d_fused, conv2d_backward_data, conv2d_backward_weight) on geometry `g`:
    through oneDNN where it is installed, chosen and able, else `ours()`. `addresses` are the operands' data
    addresses in the kernel's argument order (out first); `views` name them in errors; `weights`: the forward's
    weight view, whose reordered copy is kept while its buffer is declared constant; `bias`: the forward has one;
    `post`: conv2d_fused's (residual, relu), run as oneDNN post-ops in the blocked layout and by `tail()` (the
    backend's add and relu kernels) after oneDNN's NCHW kernels, whose post-ops are slow."""
    key = (kind, tuple(g.as_list()), bias, post)
    provider = _choices.get(key)
    if provider is None:
        provider, wrote = _decide(kind, g, key, addresses, ours, tail,
                                  weights is not None and constant_token(weights.buffer) != 0)
        if wrote:
            return  # the output is written, by the provider chosen
    if provider == OWN:
        ours()
        return
    plan = _plan(kind, g, key, provider == BLOCKED, _aligned_threads())
    _execute(plan, kind, views, addresses, weights, (key, provider))
    if plan.tail:
        tail()


_unbuildable: set[tuple] = set()  # conv_blocked keys oneDNN refused


def conv_blocked(kind: str, g, views: tuple, addresses: list[int], blocks: tuple, weights: Any = None,
                 bias: bool = False, post: tuple = NO_POST) -> bool:
    """Run forward convolution `kind` as `conv` does, with x and y (and the residual) in channel blocks per
    `blocks` (0 or channel_block() each); False, having done nothing, where oneDNN is not in use or cannot run it
    (the caller converts the layouts around its NCHW path then)."""
    key = (kind, tuple(g.as_list()), bias, post, blocks)
    if channel_block() == 0 or key in _unbuildable:
        return False
    try:
        plan = _plan(kind, g, key, True, _aligned_threads())
    except OneDnnError:
        _unbuildable.add(key)
        return False
    _execute(plan, kind, views, addresses, weights, (key, BLOCKED))
    return True


def fastest_over_blocked(g, bias: bool, post: tuple, blocks: tuple, others: dict[str, Callable[[], None]],
                         kept_weights: bool = False) -> str | None:
    """The fastest of `others` (other kernels' runs of this forward convolution on scratch operands, by name) where
    it is clearly (MARGIN) faster than oneDNN's conv2d_fused plan for operands in channel blocks `blocks`, else None;
    the plan runs on zeroed operands of its own, all in turns, reordering its weights once where `kept_weights` (the
    real ones are declared constant, and their reordered copy kept). Where oneDNN cannot build the plan: the
    fastest."""
    if not others:
        return None
    key = ("conv2d_fused", tuple(g.as_list()), bias, post, blocks)
    with _choice_lock:
        runs = dict(others)
        with contextlib.suppress(OneDnnError):  # unbuildable: ours are the only ones
            runs[BLOCKED] = _on_scratch(_plan("conv2d_fused", g, key, True, _aligned_threads()), kept_weights)
        times = _timed_in_turns(runs)
    best = min(others, key=times.get)
    return best if BLOCKED not in times or times[best] < (1.0 - MARGIN) * times[BLOCKED] else None


def chosen(kind: str, g, bias: bool = False, post: tuple = NO_POST) -> str | None:
    """The provider `conv` settled on for this convolution (OWN, BLOCKED or PLAIN), None before its first call."""
    return _choices.get((kind, tuple(g.as_list()), bias, post))


def channels_last(kind: str, g, bias: bool = False, post: tuple = NO_POST) -> bool:
    """Whether the blocked provider runs this forward convolution on NCHW operands channels last (NHWC)."""
    with _choice_lock:
        return bool(_channels_last.get((kind, tuple(g.as_list()), bias, post)))


def bound_conv(kind: str, g, views: tuple, addresses: list[int], slow: Callable[[], None], weights: Any = None,
               bias: bool = False, post: tuple = NO_POST, blocks: tuple = (0, 0),
               tail: Callable[[], None] | None = None) -> Callable[[], None] | None:
    """A replayed graph's launch of forward convolution `kind` on fixed operands (see Graph's `bind`): the oneDNN
    plan it ran on when recorded, run on the same addresses without the per-call lookups (~17 us of Python per
    call), then `tail` where the plan leaves the post-ops to it (oneDNN's NCHW kernels). None where no plan is
    settled: oneDNN not chosen for the shape, or our own kernel."""
    if blocks != (0, 0):
        key = (kind, tuple(g.as_list()), bias, post, blocks)
        blocked, provider = True, BLOCKED
    else:
        key = (kind, tuple(g.as_list()), bias, post)
        provider = _choices.get(key)
        blocked = provider == BLOCKED
        if provider not in (BLOCKED, PLAIN):
            return None
    threads = _threads()
    return _bound((key, blocked, threads), threads, kind, views, addresses, slow, weights, (key, provider), tail)


def bound_pool(views: tuple, x_shape: tuple, y_shape: tuple, x_addr: int, y_addr: int, block: int, kernel: tuple,
               stride: tuple, padding: tuple, dilation: tuple, mode: str, count_include_pad: bool,
               slow: Callable[[], None]) -> Callable[[], None] | None:
    """pool's launch on fixed operands, as bound_conv's; None where it has no oneDNN plan."""
    key = ("pool2d", tuple(x_shape), tuple(y_shape), block, kernel, stride, padding, dilation, mode,
           count_include_pad)
    threads = _threads()
    return _bound((key, threads), threads, "pool2d", views, [y_addr, x_addr], slow)


def _bound(pkey: tuple, threads: int, kind: str, views: tuple, addresses: list[int], slow: Callable[[], None],
           weights: Any = None, ckey: tuple = (), tail: Callable[[], None] | None = None) -> Callable[[], None] | None:
    """The launch of this thread's plan `pkey` on `addresses`: it goes the whole way (`slow`) when called from
    another thread or after the thread count changed, since plans belong to one thread and one team size."""
    plan = _thread.plans.get(pkey)
    if plan is None or _thread.omp_threads != threads:
        return None
    weights = weights if weights is not None and plan.weight_step >= 0 else None
    after = tail if plan.tail else None
    pointers = [plan.lib.ffi.cast("void *", a) for a in addresses]
    fast = _Launch.make(plan, addresses, None if weights is None else _constant(weights, ckey))

    def launch() -> None:
        nonlocal fast
        if _thread.plans.get(pkey) is not plan or _threads() != threads:
            slow()
        elif fast is not None and fast.still_constant():
            fast.run(kind, views)
        else:  # weights declared again: reordered anew (and kept), then launched from C again
            constant = None if weights is None else _constant(weights, ckey)
            _run(plan, kind, views, addresses, constant, pointers)
            fast = _Launch.make(plan, addresses, constant)
        if after is not None:
            after()

    return launch


class _Launch:
    """`_Plan.run` on fixed addresses as one C call (sg_onednn_launch): the memory objects, their handles, the
    primitives and their arguments gathered once. With constant weights it points the weights' memory at their kept
    reordered copy (holding it) and leaves out the reorder, for as long as the weights stay declared with that token."""

    def __init__(self, plan: _Plan, handles: list[tuple[Any, int, bool]], steps: list, residual: tuple,
                 kept: tuple | None) -> None:
        from singa_backend_cpu.device import ffi, lib

        dffi, dlib = plan.lib.ffi, plan.lib.lib

        def address(cdata: Any) -> int:
            return int(dffi.cast("uintptr_t", cdata))

        self.plan, self.lib, self.kept = plan, lib, kept
        self.arena_bytes = plan.arena_bytes
        c = self.struct = ffi.new("sg_onednn_launch_t *")
        c.set_handle = ffi.cast("void *", address(dlib.dnnl_memory_set_data_handle))
        c.execute = ffi.cast("void *", address(dlib.dnnl_primitive_execute))
        c.wait = ffi.cast("void *", address(dlib.dnnl_stream_wait))
        c.stream = ffi.cast("void *", address(_thread.stream))
        self.arrays = [  # kept alive with the struct that points at them
            ffi.new("void *[]", [ffi.cast("void *", address(m)) for m, _, _ in handles]),
            ffi.new("intptr_t[]", [h for _, h, _ in handles]),
            ffi.new("char[]", bytes(int(a) for _, _, a in handles)),
            ffi.new("void *[]", [ffi.cast("void *", address(p)) for p, _, _ in steps]),
            ffi.new("int[]", [n for _, _, n in steps]),
            ffi.new("void *[]", [ffi.cast("void *", address(a)) for _, a, _ in steps]),
        ]
        c.nmem, c.nsteps = len(handles), len(steps)
        c.mems, c.handles, c.in_arena, c.primitives, c.nargs, c.args = self.arrays
        dst, src, nbytes = residual
        c.residual_dst, c.residual_src = ffi.cast("char *", dst), ffi.cast("char *", src)
        c.residual_bytes = nbytes
        self.failed = ffi.new("int *")

    @classmethod
    def make(cls, plan: _Plan, addresses: list[int], constant: tuple | None) -> _Launch | None:
        """The launch of `plan` on `addresses`; None where its constant weights have no kept copy yet."""
        handles = [(m, a, False) for m, a in zip(plan.user, addresses)]
        handles += [(m, off, True) for m, off in zip(plan.temps, plan.offsets)]
        steps, kept = plan.steps, None
        if constant is not None:
            _, buffer, token = constant
            entry = _weights.get(*constant)
            if entry is None:
                return None
            handles.append((plan.weight_temp, entry[1], False))
            steps = [s for i, s in enumerate(steps) if i != plan.weight_step]
            kept = (weakref.ref(buffer), token, entry[0])
        shared = addresses[0] == addresses[-1]  # a graph planned the output over the residual: nothing to copy
        residual = (addresses[0], addresses[-1], plan.residual_bytes) if plan.residual_bytes and not shared \
            else (0, 0, 0)
        return cls(plan, handles, steps, residual, kept)

    def still_constant(self) -> bool:
        """Whether the kept weights (if any) are still those of the declared buffer."""
        if self.kept is None:
            return True
        buffer = self.kept[0]()
        return buffer is not None and constant_token(buffer) == self.kept[1]

    def run(self, kind: str, views: tuple) -> None:
        arena = _thread.arena(self.arena_bytes) if self.arena_bytes else 0
        status = self.lib.sg_onednn_launch(self.struct, arena, self.failed)
        if status:
            call = "dnnl_memory_set_data_handle" if self.failed[0] < 0 else "dnnl_primitive_execute"
            try:
                self.plan.lib.check(status, call, self.plan.what)
            except OneDnnError as exc:
                raise _named(exc, kind, views) from None


def _aligned_threads() -> int:
    """The backend's thread count, made this thread's OpenMP team size for oneDNN."""
    threads = _threads()
    if _thread.omp_threads != threads:
        # oneDNN sizes its OpenMP team from the calling thread's setting, which a new Python thread inherits from the
        # environment, not from set_num_threads: align it with the backend's count (results depend on the split)
        _kernels().sg_set_num_threads(threads)
        _thread.omp_threads = threads
    return threads


def _execute(plan: _Plan, kind: str, views: tuple, addresses: list[int], weights: Any, key: tuple) -> None:
    """Run `plan` on `addresses`, reusing the reordered weights while their buffer is declared constant."""
    _run(plan, kind, views, addresses,
         _constant(weights, key) if weights is not None and plan.weight_step >= 0 else None)


def _constant(weights: Any, key: tuple) -> tuple | None:
    """plan.run's `constant` for the weights view: None unless its buffer is declared constant."""
    token = constant_token(weights.buffer)
    return ((*key, token, weights.offset), weights.buffer, token) if token else None


def _run(plan: _Plan, kind: str, views: tuple, addresses: list[int], constant: tuple | None,
         pointers: list | None = None) -> None:
    try:
        plan.run(addresses, _thread, constant, pointers)
    except (OneDnnError, MemoryError) as exc:
        raise _named(exc, kind, views) from None


def _named(exc: Exception, kind: str, views: tuple) -> Exception:
    """`exc` again, its message led by the kernel and its operands."""
    return type(exc)(f"cpu kernel {kind}({', '.join(describe(v) for v in views if v is not None)}): {exc}")


def pool(views: tuple, x_shape: tuple, y_shape: tuple, x_addr: int, y_addr: int, block: int, kernel: tuple,
         stride: tuple, padding: tuple, dilation: tuple, mode: str, count_include_pad: bool) -> bool:
    """float32 pool2d (no indices) with oneDNN's pooling, on x and y in channel blocks of `block` (0: NCHW, used for
    average pooling where oneDNN has a JIT kernel for it, which takes a third to half of our time; our max pooling
    keeps its NaN and signed-zero rules there); False, having done nothing, where oneDNN is not in use, has no JIT
    kernel for NCHW, or its semantics differ: average pooling counting the padding whose windows run past the
    declared padding (ceil mode), where oneDNN would count that part too."""
    key = ("pool2d", tuple(x_shape), tuple(y_shape), block, kernel, stride, padding, dilation, mode,
           count_include_pad)
    if key in _unbuildable:
        return False
    if block:
        if channel_block() != block:
            return False
    elif not in_use():
        return False
    threads = _aligned_threads()
    plan = _thread.plans.get((key, threads))
    if plan is None:
        lib = library()
        (pt, pl, pb, pr), k, s, d = padding, kernel, stride, dilation
        ends = []  # the bottom and right padding oneDNN needs for the output size the caller chose
        for n, o, kk, ss, dd, begin, end in ((x_shape[2], y_shape[2], k[0], s[0], d[0], pt, pb),
                                             (x_shape[3], y_shape[3], k[1], s[1], d[1], pl, pr)):
            reach = (kk - 1) * dd + 1
            ends.append(end if (n + begin + end - reach) // ss + 1 == o else (o - 1) * ss + reach - n - begin)
        if mode == "avg" and count_include_pad and tuple(ends) != (pb, pr):
            _unbuildable.add(key)
            return False
        alg = POOLING_MAX if mode == "max" else POOLING_AVG_INCLUDE if count_include_pad else POOLING_AVG_EXCLUDE
        plan = _Plan(lib, f"pool2d of x {'x'.join(map(str, x_shape))}")
        ffi, tag = lib.ffi, TAG_BLOCKED[block] if block else TAG_ABCD
        x_md, y_md = plan.md(x_shape, tag), plan.md(y_shape, tag)
        try:
            pd = plan.pd(lib.lib.dnnl_pooling_forward_primitive_desc_create, lib.engine, FORWARD_INFERENCE, alg,
                         x_md, y_md, ffi.new("dnnl_dims_t", list(s)), ffi.new("dnnl_dims_t", list(k)),
                         ffi.new("dnnl_dims_t", [d[0] - 1, d[1] - 1]), ffi.new("dnnl_dims_t", [pt, pl]),
                         ffi.new("dnnl_dims_t", ends), ffi.NULL)
        except OneDnnError:
            _unbuildable.add(key)
            return False
        plan.describe(pd)
        if not block and not plan.impl.startswith("jit"):
            # NCHW averages have JIT kernels with AVX-512 only: elsewhere oneDNN's pick is its plain C loop
            # (simple_nchw), 8x our kernel's time (AMD EPYC Zen 3, AVX2: 2.4 ms against 0.3 on 192x28x28)
            _unbuildable.add(key)
            return False
        y_mem = plan.user_memory(y_md)  # y first, as the addresses come
        plan.step(pd, [(ARG_SRC, plan.user_memory(x_md)), (ARG_DST, y_mem)])
        _thread.plans[(key, threads)] = plan
    _execute(plan, "pool2d", views, [y_addr, x_addr], None, ())
    return True


_block: int | None = None


def channel_block() -> int:
    """The channel block of the activation layout oneDNN picks for convolutions on this CPU (16 with AVX-512, 8
    with AVX2: dnnl_aBcd16b / aBcd8b), found once by asking it for a typical layer; 0 where oneDNN is not in use
    (absent, SINGA_ONEDNN=0 or nchw) or picks another layout."""
    global _block
    if _block is not None:  # found once (reset() forgets it, for a changed setting)
        return _block
    try:
        if library() is None or mode() in ("0", "nchw"):
            _block = 0
            return 0
    except ValueError:
        return 0
    from singa.kernel_checks import ConvGeometry

    g = ConvGeometry("cpu", "conv2d", (1, 64, 14, 14), (64, 64, 3, 3), (1, 64, 14, 14), 1, 1, 1, 1, ())
    plan = _Plan(library(), "channel block probe")
    pd = _forward_pd(plan, g, False, True)[0]
    got = library().lib.dnnl_primitive_desc_query_md(pd, Q_DST, 0)
    _block = next((b for b, tag in TAG_BLOCKED.items()
                   if library().lib.dnnl_memory_desc_equal(got, plan.md([1, 64, 14, 14], tag))), 0)
    return _block


def _kernels():
    from singa_backend_cpu.device import lib

    return lib


def _threads() -> int:
    """The backend's thread count (set_num_threads / SINGA_NUM_THREADS), the same in every thread."""
    return int(_kernels().sg_get_num_threads())


def _plan(kind: str, g, key: tuple, blocked: bool, threads: int) -> _Plan:
    """This thread's plan for `key` in one layout (made on first use; the choice was made with it, so it builds)."""
    # oneDNN sizes a primitive's work split for the OpenMP thread count at its creation: a plan per count
    pkey = (key, blocked, threads)
    plan = _thread.plans.get(pkey)
    if plan is None:
        post = key[3] if blocked else NO_POST  # oneDNN's NCHW kernels with post-ops are slower than without
        blocks = key[4] if len(key) > 4 else (0, 0)
        if blocked and blocks == (0, 0) and kind in ("conv2d", "conv2d_fused"):
            plan = _blocked_forward(kind, g, key, post)
        else:
            plan = _conv_plan(kind, g, key[2], blocked, post, blocks)
        plan.tail = post != key[3]
        _thread.plans[pkey] = plan
    return plan


_channels_last: dict[tuple, bool] = {}  # forward key -> whether its blocked plan runs on NHWC (decided once)


def _blocked_forward(kind: str, g, key: tuple, post: tuple) -> _Plan:
    """The blocked provider's forward plan for NCHW operands (`key`): reordered to oneDNN's channel blocks for its
    `jit` direct kernels, or to channels last (NHWC) for its brgemm-based kernels where those are faster for the
    shape (small batches: ~1.15x at batch 1 on ResNet's 56x56 and 28x28 layers with AVX-512, reorders included).
    Callers that keep their activations in channel blocks (conv_blocked) are not offered NHWC: a reorder each way
    costs most of the gain."""
    def plan(channels_last: bool) -> _Plan:
        return _conv_plan(kind, g, key[2], True, post, channels_last=channels_last)

    with _choice_lock:
        nhwc = _channels_last.get(key)
        if nhwc is None:
            nhwc, picked = _choose_channels_last(plan)
            _channels_last[key] = nhwc
            return picked
    return plan(nhwc)


def _choose_channels_last(plan: Callable[[bool], _Plan]) -> tuple[bool, _Plan]:
    """(whether to run channels last, the plan for that choice): under SINGA_ONEDNN=auto, the two plans timed in
    turns on zeroed scratch operands, NHWC only when clearly faster; otherwise never (`1` promises the same kernels
    on every run)."""
    default = plan(False)
    if mode() != "auto":
        return False, default
    try:
        other = plan(True)
    except OneDnnError:
        return False, default
    times = _timed_in_turns({False: _on_scratch(default), True: _on_scratch(other)})
    if times[True] < (1.0 - MARGIN) * times[False]:
        return True, other
    return False, default


def _kept_locally(plan: _Plan, keep: bool) -> Callable[[], tuple[int, bool] | None]:
    """`kept_at` for successive timed runs of `plan`: with `keep` (the real weights are declared constant, so in use
    their reordered copy is kept), a copy of the timing's own, reordered into at the first run and reused after, as
    in the calls timed for; else None (each run reorders)."""
    if not keep or plan.weight_step < 0:
        return lambda: None
    ffi = plan.lib.ffi
    block = ffi.new("char[]", plan.weight_bytes + _ALIGN)
    at, filled = (int(ffi.cast("uintptr_t", block)) + _ALIGN - 1) // _ALIGN * _ALIGN, [False]

    def kept_at() -> tuple[int, bool]:
        now = (at, filled[0])
        filled[0] = True
        return now

    kept_at.block = block  # alive as long as the function
    return kept_at


def _on_scratch(plan: _Plan, keep_weights: bool = False) -> Callable[[], None]:
    """A run of `plan` on zeroed operands of its own, its weights reordered once with `keep_weights`
    (_kept_locally)."""
    ffi = plan.lib.ffi
    buffers = [ffi.new("char[]", max(n, 1)) for n in plan.user_bytes]
    addresses = [int(ffi.cast("uintptr_t", b)) for b in buffers]
    kept_at = _kept_locally(plan, keep_weights)

    def run() -> None:
        plan.run(addresses, _thread, kept_at=kept_at())

    run.operands = buffers  # alive as long as the run
    return run


def _timed_in_turns(runs: dict) -> dict:
    """Each run's best time over ROUNDS turns, after a first run each (oneDNN finishes its just-in-time code, caches
    warm up); the runs take turns, so that a change of load hits them alike."""
    for run in runs.values():
        run()
    times = dict.fromkeys(runs, float("inf"))
    for _ in range(ROUNDS):
        for name, run in runs.items():
            times[name] = min(times[name], _best_of(run, 1))
    return times


# -- float32 products: oneDNN's sgemm or OpenBLAS, chosen per shape --------------------------------------------------

PRODUCT_CHOICE_FLOPS = 2e6  # smaller products stay on oneDNN's sgemm unmeasured (its small-product kernels win)
_products: dict[tuple, bool] = {}  # (batch, batch_a, batch_b, m, n, k, trans_a, trans_b) -> OpenBLAS chosen


def product(key: tuple, run: Callable[[int], None]) -> None:
    """Run float32 product `key` ((batch, batch_a, batch_b, m, n, k, trans_a, trans_b); out = op(a) @ op(b), beta 0)
    through `run(openblas)`: oneDNN's sgemm (0) unless OpenBLAS split over our threads (1) was clearly (MARGIN)
    faster when the shape was first met, the two timed in turns on that call's own operands (each run writes the same
    output). oneDNN's sgemm is the faster of the two on most shapes, but not on all: with AVX2 (AMD EPYC Zen 3) a
    128 x 256 @ 256 x 1024 product (a transformer's feed-forward layer) took it 0.8-0.9 ms against OpenBLAS's 0.5,
    depending on where the operands lie. SINGA_ONEDNN=1 keeps oneDNN's."""
    chosen = _products.get(key)
    if chosen is None:
        with _choice_lock:
            chosen = _products.get(key)
            if chosen is None:
                chosen = False
                if mode() != "1":
                    times = _timed_in_turns({False: lambda: run(0), True: lambda: run(1)})
                    chosen = times[True] < (1.0 - MARGIN) * times[False]
                _products[key] = chosen
    run(1 if chosen else 0)


def product_openblas(key: tuple) -> int:
    """1 where `product` settled on OpenBLAS for this shape, else 0 (oneDNN's sgemm, or not met yet)."""
    return 1 if _products.get(key) else 0


def _candidates(kind: str, g, key: tuple) -> dict[str, _Plan]:
    """The oneDNN plans that build for `key` (none where oneDNN is absent or turned off); oneDNN refuses some
    shapes (e.g. padding past what the output needs), and our own kernel runs those."""
    found = {}
    if not in_use():
        return found
    threads = _threads()
    for provider, blocked in ((BLOCKED, True), (PLAIN, False)):
        try:
            found[provider] = _plan(kind, g, key, blocked, threads)
        except OneDnnError:
            continue
    return found


def _decide(kind: str, g, key: tuple, addresses: list[int], ours: Callable[[], None],
            tail: Callable[[], None] | None, kept_weights: bool = False) -> tuple[str, bool]:
    """(the provider of `key` from now on, whether this call's output is already written by it): with
    SINGA_ONEDNN=1 oneDNN in its preferred layout where it builds, with 0 our own kernel, else the fastest of two runs
    each, measured by the first thread to meet the shape while the others wait for its choice; oneDNN's plans
    reorder the weights once where `kept_weights` (declared constant: in use their reordered copy is kept)."""
    with _choice_lock:
        if key in _choices:  # another thread decided while this one waited
            return _choices[key], False
        plans = _candidates(kind, g, key)
        if not plans:
            provider, wrote = OWN, False
        elif mode() in ("1", "nchw"):
            order = (BLOCKED, PLAIN) if mode() == "1" else (PLAIN, BLOCKED)
            provider, wrote = next(p for p in order if p in plans), False
        else:
            def runner(p: _Plan) -> Callable[[], None]:
                kept_at = _kept_locally(p, kept_weights)
                return lambda: (p.run(addresses, _thread, kept_at=kept_at()), tail() if p.tail else None)

            runs: dict[str, Callable[[], None]] = {n: runner(p) for n, p in plans.items()}
            runs[OWN] = ours
            times = _timed_in_turns(runs)
            # the blocked layout unless another is clearly faster: a near tie is noise, and blocked scales better
            provider = min(times, key=times.get)
            if BLOCKED in times and times[provider] > (1.0 - MARGIN) * times[BLOCKED]:
                provider = BLOCKED
            if provider != OWN:
                runs[provider]()  # the output is the chosen provider's, as on later calls
            wrote = True
        _choices[key] = provider
        return provider, wrote


def reset() -> None:
    """Forget every choice, this thread's plans and the kept weights (tests change SINGA_ONEDNN between cases)."""
    global _block
    with _choice_lock:
        _choices.clear()
        _channels_last.clear()
        _products.clear()
    _unbuildable.clear()
    _block = None
    _weights.clear()
    _thread.plans.clear()


def choices() -> dict[tuple, str]:
    """A copy of the choices made so far: {(kind, geometry, bias, post-ops): "own", "onednn" or "onednn-nchw"}."""
    with _choice_lock:
        return dict(_choices)
