"""The OpenCL kernel table: {primitive name: callable} for every name in `singa.primitives.names()`.

Each callable follows singa.primitives' convention, `kernels[name](out_views..., input_views..., **params)`, finds the
device from its first view's buffer, and launches OpenCL kernels on it with the views' cl_mem buffers and element
offsets as arguments. Kernel sources are the programs of `source_of`: the element-wise ones rendered by codegen.py from
singa.expressions (one program per entry and dtype, so a model only compiles what it uses), the others from
kernels/*.cl with a few `#define`s choosing the element types. Matrix products of float32 (and float16, through
float32 copies) go to CLBlast; everything else runs in this backend's own kernels.

Element-wise kernels keep a fast path for the common case (every operand contiguous with the output's shape): one
launch, nothing allocated. Other layouts have their axes merged where the memory allows, then go to the strided
kernel with the shape and strides passed by value (an `sg_dims` struct); layouts of more than SG_MAXD merged axes are
split into several launches.
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Callable

from singa import dtypes, expressions, kernel_args
from singa.backend import View
from singa_backend_opencl import clblast, codegen
from singa_backend_opencl.device import F32 as PF32
from singa_backend_opencl.device import F64 as PF64
from singa_backend_opencl.device import I32, I64
from singa_backend_opencl.device import U32 as PU32

F32, F16, I32_, I64_, BOOL = dtypes.float32, dtypes.float16, dtypes.int32, dtypes.int64, dtypes.bool_
SUFFIX = {F32: "float32", F16: "float16", I32_: "int32", I64_: "int64", BOOL: "bool"}
ITEMSIZE = {dt: dtypes.itemsize(dt) for dt in SUFFIX}
FLOATS = (F32, F16)
MAXD = 8  # SG_MAXD of kernels/common.cl
_DIMS = struct.Struct(f"<q{MAXD}q{4 * MAXD}q")  # sg_dims
_INT_MAX = 2 ** 31 - 1
_U64 = (1 << 64) - 1

# -- program sources ------------------------------------------------------------------------------------------------

_MACRO = {F32: "F32", F16: "F16", I32_: "I32", I64_: "I64", BOOL: "BOOL"}
_STORAGE = {F32: "float", F16: "half", I32_: "int", I64_: "long", BOOL: "uchar"}
_BITS = codegen.BITS


def _types(dtype: int, t: str = "T", ld: str = "LD", st: str = "ST", from_acc: bool = False) -> str:
    """Macros naming a dtype's storage type, load and store; `from_acc`: stores round once from sg_acc."""
    m = _MACRO[dtype]
    store = f"SG_ST_{m}_ACC" if from_acc and dtype == F16 else f"SG_ST_{m}"
    return f"#define {t} {_STORAGE[dtype]}\n#define {ld} SG_LD_{m}\n#define {st} {store}\n"


_BY_NAME = {name: dt for dt, name in SUFFIX.items()}


def _dt(name: str) -> int:
    return _BY_NAME[name]


_ATOMICS = """
inline void sg_atomic_add_f32(__global float *p, long d, float v) {
    __global volatile uint *w = (__global volatile uint *)(p + d);
    uint old = *w, assumed;
    do {  /* a CAS loop on the 32-bit word: float atomic add is not core OpenCL 1.2 */
        assumed = old;
        old = atomic_cmpxchg(w, assumed, as_uint(as_float(assumed) + v));
    } while (old != assumed);
}
inline void sg_atomic_add_f16(__global half *p, long d, float v) {
    /* the 32-bit word holding the element (buffers start 4-byte aligned; little-endian halves) */
    __global volatile uint *w = (__global volatile uint *)((__global uchar *)p + ((2 * d) & ~3L));
    const uint shift = ((2 * d) & 2) ? 16 : 0;
    uint old = *w, assumed;
    do {
        assumed = old;
        ushort bits = (ushort)(assumed >> shift), sum;
        vstore_half_rte(vload_half(0, (const half *)&bits) + v, 0, (half *)&sum);
        old = atomic_cmpxchg(w, assumed, (assumed & ~(0xFFFFu << shift)) | ((uint)sum << shift));
    } while (old != assumed);
}
#define sg_atomic_add_i32(p, d, v) atomic_add((__global volatile int *)(p) + (d), (v))
#ifdef SG_INT64_ATOMICS
#define sg_atomic_add_i64(p, d, v) atom_add((__global volatile long *)(p) + (d), (v))
#endif
"""


def _src_ew(dev, name: str, dt: str) -> str:
    return codegen.elementwise_source(expressions.TABLE[name], dev.fp64, (_dt(dt),))


def _src_reduce(dev, tin: str, tout: str) -> str:
    tin_, tout_ = _dt(tin), _dt(tout)
    return (_types(tin_, "TIN", "LD", "LD_UNUSED") + _types(tout_, "TOUT", "LD_OUT_UNUSED", "ST", from_acc=True)
            + f"#define IS_FLOAT {int(tin_ in FLOATS)}\n" + _read("reduce.cl"))


def _src_arg(dev, tin: str) -> str:
    head = _types(_dt(tin), "TIN", "LD", "ST_UNUSED")
    return head + f"#define IS_FLOAT {int(_dt(tin) in FLOATS)}\n#define SG_ARG\n" + _read("reduce.cl")


def _src_gemm(dev, dt: str) -> str:
    d = _dt(dt)
    return _types(d) + f"#define ACC {'float' if d in FLOATS else 'long'}\n" + _read("gemm.cl")


def _src_scatter(dev, dt: str, idt: str) -> str:
    d = _dt(dt)
    suffix = {F32: "f32", F16: "f16", I32_: "i32", I64_: "i64"}[d]
    atomic = "" if d != I64_ or dev.int64_atomics else "#define SG_NO_ATOMIC\n"
    return (_ATOMICS + _types(d) + f"#define TNAME {suffix}\n#define TI {_STORAGE[_dt(idt)]}\n{atomic}"
            f"#define SG_ATOMIC_ADD(p, d, v) sg_atomic_add_{suffix}(p, d, v)\n" + _read("indexing.cl"))


def _src_sce(dev, dt: str, tdt: str) -> str:
    t = _dt(tdt)
    labels = t in (I32_, I64_)
    head = _types(_dt(dt)) + f"#define SG_SCE\n#define TT_LABELS {int(labels)}\n"
    head += f"#define TT {_STORAGE[t]}\n" if labels else _types(t, "TT", "LDT", "STT")
    return head + _read("softmax.cl")


def _read(name: str) -> str:
    from singa_backend_opencl import build

    return build.read_source(name)


_SOURCES: dict[str, Callable] = {
    "ew": _src_ew,
    "cast": lambda dev, s, d: codegen.cast_source(((_dt(s), _dt(d)),)),
    "mem": lambda dev, op, size: codegen.memory_source(op, int(size)),
    "reduce": _src_reduce,
    "arg": _src_arg,
    "gemm": _src_gemm,
    "conv": lambda dev: _read("conv.cl"),
    "pool": lambda dev, dt: _types(_dt(dt)) + _read("pool.cl"),
    "bn": lambda dev, dt: _types(_dt(dt)) + _read("batchnorm.cl"),
    "softmax": lambda dev, dt: _types(_dt(dt)) + _read("softmax.cl"),
    "sce": _src_sce,
    "index": lambda dev, idt: f"#define TI {_STORAGE[_dt(idt)]}\n" + _read("indexing.cl"),
    "gather": lambda dev, size, idt: f"#define E {_BITS[int(size)]}\n#define TI {_STORAGE[_dt(idt)]}\n"
                                     + _read("indexing.cl"),
    "pad": lambda dev, size: f"#define E {_BITS[int(size)]}\n#define TI int\n" + _read("indexing.cl"),
    "scatter": _src_scatter,
    "random": lambda dev, dt: _types(_dt(dt), "TOUT", "LD", "ST", from_acc=True) + _read("random.cl"),
}


def source_of(program: str, dev) -> str:
    """The OpenCL C source (without common.cl) of a program such as 'ew:add:float32' or 'pool:float16'."""
    kind, *parts = program.split(":")
    return _SOURCES[kind](dev, *parts)


# -- helpers ------------------------------------------------------------------------------------------------------

_layouts = kernel_args.LAYOUTS
_layout = kernel_args.layout
_coalesce = kernel_args.coalesce
_describe = kernel_args.describe
_element_bits = kernel_args.element_bits
_out_dtypes = kernel_args.elementwise_out_dtypes


def _dtype_error(name: str, views: tuple, supported) -> Exception:
    return kernel_args.dtype_error("opencl", name, views, supported)


def _shape_error(name: str, views: tuple, what: str) -> ValueError:
    return kernel_args.shape_error("opencl", name, views, what)


def _check_device(name: str, dt: int, dev) -> None:
    if dt not in dev.dtypes:
        raise dev.dtype_error(name, dt)


def _pack_dims(dims: list, strides: list) -> bytes:
    pad = [0] * (MAXD - len(dims))
    flat = []
    for k in range(4):
        flat += (list(strides[k]) + pad) if k < len(strides) else [0] * MAXD
    return _DIMS.pack(len(dims), *dims, *pad, *flat)


def _run_layout(dev, program: str, symbol: str, shape: tuple, views: tuple, extra: tuple) -> None:
    """An element-wise kernel pair (`symbol`_c / _s) over views of any strides, all of `shape`; `extra` are the
    trailing kernel arguments (packed)."""
    n = math.prod(shape)
    if n == 0:
        return
    dims, strides = _coalesce(shape, [v.strides for v in views])
    handles = [v.buffer.handle.arg for v in views]
    offsets = [v.offset for v in views]
    if not dims or (len(dims) == 1 and all(s[0] == 1 for s in strides)):
        args = [I64(n)]
        for h, o in zip(handles, offsets):
            args += (h, I64(o))
        dev.launch(dev.kernel(program, symbol + "_c"), n, (*args, *extra))
        return
    kern = dev.kernel(program, symbol + "_s")
    lead, dims = dims[:-MAXD], dims[-MAXD:]  # more axes than a walk holds: one launch per leading index
    inner = [s[-MAXD:] for s in strides]
    packed = _pack_dims(dims, inner)
    m = math.prod(dims)
    for idx in itertools.product(*(range(d) for d in lead)):
        args = [I64(m), packed]
        for h, o, st in zip(handles, offsets, strides):
            args += (h, I64(o + sum(i * s for i, s in zip(idx, st))))
        dev.launch(kern, m, (*args, *extra))


def _contiguous(v):
    """The view itself when contiguous, else a contiguous copy on the same device."""
    if v is None:
        return None
    cs, n = _layout(v.shape)
    if v.strides == cs or n <= 1:
        return v
    copy = View(v.buffer.device.alloc(n * ITEMSIZE[v.dtype]), v.dtype, v.shape)
    _copy(copy, v)
    return copy


def _new(dev, shape: tuple, dtype: int) -> View:
    return View(dev.alloc(max(math.prod(shape), 1) * ITEMSIZE[dtype]), dtype, shape)


_pair = kernel_args.pair
_padding4 = kernel_args.padding4
_split = kernel_args.split


def _norm_axis(axis: int, ndim: int, name: str) -> int:
    return kernel_args.norm_axis(axis, ndim, name, "opencl")


def _acc(dev, value: float) -> bytes:
    """A float kernel argument of type sg_acc."""
    return PF64(value) if dev.fp64 else PF32(value)


_BITS_FMT = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}


# -- element-wise -------------------------------------------------------------------------------------------------


def _reject(name: str, views: tuple, supported, out_dtypes: list) -> None:
    """Raise the error that explains why the fast checks refused these views."""
    raise kernel_args.elementwise_error("opencl", name, views, supported, out_dtypes)


def _param_packers(entry) -> list:
    """Per dtype code: (pack for float params on a device with fp64, pack without)."""
    out = [None] * 8
    for dt in entry.dtypes:
        out[dt] = (PF32, PF32) if dt in FLOATS else (PF64, PF32)
    return out


def _make_binary(entry: expressions.Elementwise) -> Callable:
    name, supported = entry.name, entry.dtypes
    programs = [None] * 8
    symbols = [None] * 8
    for dt in supported:
        programs[dt] = f"ew:{name}:{SUFFIX[dt]}"
        symbols[dt] = f"sg_ew_{name}_{SUFFIX[dt]}"
    out_dtypes = _out_dtypes(entry)
    layouts = _layouts

    def kernel(out, a, b):
        shape = out.shape
        dt = a.dtype
        prog = programs[dt]
        dev = out.buffer.device
        if (prog is None or b.dtype != dt or out.dtype != out_dtypes[dt] or a.shape != shape or b.shape != shape
                or dt not in dev.dtypes):
            _reject(name, (out, a, b), supported, out_dtypes)
        cs, n = layouts.get(shape) or _layout(shape)
        if a.strides == cs and b.strides == cs and out.strides == cs:
            if n:
                dev.launch(dev.kernel(prog, symbols[dt] + "_c"), n,
                           (I64(n), out.buffer.handle.arg, I64(out.offset), a.buffer.handle.arg, I64(a.offset),
                            b.buffer.handle.arg, I64(b.offset)))
            return
        _run_layout(dev, prog, symbols[dt], shape, (out, a, b), ())

    packers = _param_packers(entry)

    def kernel_params(out, a, b, alpha=0.0, beta=0.0):  # entries with params (axpby): big operands, no fast path
        dt = a.dtype
        prog = programs[dt]
        dev = out.buffer.device
        if (prog is None or b.dtype != dt or out.dtype != out_dtypes[dt] or a.shape != out.shape
                or b.shape != out.shape or dt not in dev.dtypes):
            _reject(name, (out, a, b), supported, out_dtypes)
        pack = packers[dt][0 if dev.fp64 else 1]
        _run_layout(dev, prog, symbols[dt], out.shape, (out, a, b), (pack(alpha), pack(beta)))

    if entry.takes_params:
        kernel = kernel_params
    kernel.__name__ = name
    return kernel


def _make_unary(entry: expressions.Elementwise) -> Callable:
    name, supported = entry.name, entry.dtypes
    programs = [None] * 8
    symbols = [None] * 8
    for dt in supported:
        programs[dt] = f"ew:{name}:{SUFFIX[dt]}"
        symbols[dt] = f"sg_ew_{name}_{SUFFIX[dt]}"
    packers = _param_packers(entry)
    out_dtypes = _out_dtypes(entry)
    layouts = _layouts

    def kernel(out, x, alpha=0.0, beta=0.0):
        shape = out.shape
        dt = x.dtype
        prog = programs[dt]
        dev = out.buffer.device
        if prog is None or out.dtype != out_dtypes[dt] or x.shape != shape or dt not in dev.dtypes:
            _reject(name, (out, x), supported, out_dtypes)
        pack = packers[dt][0 if dev.fp64 else 1]
        params = (pack(alpha), pack(beta))
        cs, n = layouts.get(shape) or _layout(shape)
        if x.strides == cs and out.strides == cs:
            if n:
                dev.launch(dev.kernel(prog, symbols[dt] + "_c"), n,
                           (I64(n), out.buffer.handle.arg, I64(out.offset), x.buffer.handle.arg, I64(x.offset),
                            *params))
            return
        _run_layout(dev, prog, symbols[dt], shape, (out, x), params)

    kernel.__name__ = name
    return kernel


# -- memory: fill, copy, cast, where ------------------------------------------------------------------------------


def _fill(out, value) -> None:
    dev = out.buffer.device
    _check_device("fill", out.dtype, dev)
    size = ITEMSIZE[out.dtype]
    bits = _element_bits(out.dtype, value)
    pattern = struct.pack(_BITS_FMT[size], bits)
    cs, n = _layout(out.shape)
    if out.strides == cs or n <= 1:
        dev.fill_bytes(out.buffer.handle, out.offset * size, pattern, n * size)
        return
    _run_layout(dev, f"mem:fill:{size}", f"sg_fill_{size}", out.shape, (out,), (pattern,))


def _copy(out, x) -> None:
    if out.dtype != x.dtype:
        raise _dtype_error("copy", (out, x), (x.dtype,))
    if out.shape != x.shape:
        raise _shape_error("copy", (out, x), "shapes differ")
    dev = out.buffer.device
    cs, n = _layout(out.shape)
    size = ITEMSIZE[x.dtype]
    if (out.strides == cs and x.strides == cs) or n == 1:
        if n:
            dev._copy_on_device(out.buffer.handle, out.offset * size, x.buffer.handle, x.offset * size, n * size)
        return
    dims, strides = _coalesce(out.shape, [out.strides, x.strides])
    if len(dims) == 1 and strides[0][0] == strides[1][0] == 1:
        dev._copy_on_device(out.buffer.handle, out.offset * size, x.buffer.handle, x.offset * size, n * size)
        return
    _run_layout(dev, f"mem:copy:{size}", f"sg_copy_{size}", out.shape, (out, x), ())


def _cast(out, x) -> None:
    if out.shape != x.shape:
        raise _shape_error("cast", (out, x), "shapes differ")
    if out.dtype == x.dtype:
        _copy(out, x)
        return
    dev = out.buffer.device
    if x.dtype not in SUFFIX or out.dtype not in SUFFIX or x.dtype not in dev.dtypes or out.dtype not in dev.dtypes:
        raise _dtype_error("cast", (out, x), tuple(d for d in SUFFIX if d in dev.dtypes))
    src, dst = SUFFIX[x.dtype], SUFFIX[out.dtype]
    _run_layout(dev, f"cast:{src}:{dst}", f"sg_cast_{src}_{dst}", out.shape, (out, x), ())


def _where(out, cond, a, b) -> None:
    if cond.dtype != BOOL or a.dtype != out.dtype or b.dtype != out.dtype:
        raise TypeError(f"opencl kernel where({_describe(out)}, {_describe(cond)}, {_describe(a)}, {_describe(b)}): "
                        "cond must be bool and a, b of the output's dtype")
    shape = out.shape
    if cond.shape != shape or a.shape != shape or b.shape != shape:
        raise _shape_error("where", (out, cond, a, b), "inputs must arrive broadcast to the output's shape")
    dev = out.buffer.device
    _check_device("where", out.dtype, dev)
    size = ITEMSIZE[out.dtype]
    _run_layout(dev, f"mem:where:{size}", f"sg_where_{size}", shape, (out, cond, a, b), ())


# -- reductions ---------------------------------------------------------------------------------------------------

_REDUCE_OPS = {"reduce_sum": "sum", "reduce_mean": "mean", "reduce_max": "max", "reduce_min": "min",
               "reduce_prod": "prod"}


def _reduction_shape(x, reduced: set) -> tuple:
    """(view, outer, len, inner) with the reduced elements of each output at stride `inner`, or (x, A, K, B, "mid")
    for x seen as (A, K, B) reduced over A and B. Neighbouring axes of one role merge; other layouts of the reduced
    axes are gathered behind the kept ones by a copy."""
    groups: list = []
    for d, s in enumerate(x.shape):
        if s == 1:
            continue
        r = d in reduced
        if groups and groups[-1][1] == r:
            groups[-1][0] *= s
        else:
            groups.append([s, r])
    roles = [r for _, r in groups]
    sizes = [s for s, _ in groups]
    if roles in ([], [True], [False], [False, True]):
        return x, math.prod(s for s, r in groups if not r), math.prod(s for s, r in groups if r), 1
    if roles == [True, False]:
        return x, 1, sizes[0], sizes[1]
    if roles == [False, True, False]:
        return x, sizes[0], sizes[1], sizes[2]
    if roles == [True, False, True]:
        return x, sizes[0], sizes[1], sizes[2], "mid"
    order = [d for d in range(len(x.shape)) if d not in reduced] + sorted(reduced)
    shape = tuple(x.shape[d] for d in order)
    moved = View(x.buffer, x.dtype, shape, tuple(x.strides[d] for d in order), x.offset)
    packed = _new(x.buffer.device, shape, x.dtype)
    _copy(packed, moved)
    kept = math.prod(x.shape[d] for d in range(len(x.shape)) if d not in reduced)
    return packed, kept, math.prod(x.shape[d] for d in reduced), 1


def _acc_size(dev, dtype: int) -> int:
    return 8 if dtype not in FLOATS or dev.fp64 else 4


def _make_reduce(name: str) -> Callable:
    op = _REDUCE_OPS[name]

    def kernel(out, x, axes=()):
        dev = out.buffer.device
        if x.dtype not in SUFFIX or out.dtype not in SUFFIX or x.dtype not in dev.dtypes \
                or out.dtype not in dev.dtypes:
            raise _dtype_error(name, (out, x), tuple(SUFFIX))
        x = _contiguous(x)
        nd = len(x.shape)
        reduced = {_norm_axis(int(a), nd, name) for a in axes}
        kept = tuple(s for d, s in enumerate(x.shape) if d not in reduced)
        n_out = math.prod(kept)
        if math.prod(out.shape) != n_out:
            raise _shape_error(name, (out, x), f"output must hold shape {kept}")
        if n_out == 0:
            return
        count = math.prod(x.shape[d] for d in reduced)
        if count == 0 and op in ("max", "min"):
            raise _shape_error(name, (out, x), f"axes {tuple(axes)} (an empty reduction has no extreme)")
        view, outer, length, inner, *mid = _reduction_shape(x, reduced)
        prog = f"reduce:{SUFFIX[x.dtype]}:{SUFFIX[out.dtype]}"
        xh, oh = view.buffer.handle.arg, out.buffer.handle.arg
        if mid:
            kern = dev.kernel(prog, f"sg_red_{op}_mid")
            wg = dev.group_size(kern)
            dev.launch(kern, length * wg, (I64(outer), I64(length), I64(inner), xh, I64(view.offset), oh,
                                           I64(out.offset), wg * _acc_size(dev, x.dtype)))
            return
        if inner == 1 and length >= 256:
            kern = dev.kernel(prog, f"sg_red_{op}_rows")
            wg = dev.group_size(kern)
            # segments per row: enough work-groups to fill the device, each still a few rounds of work-items
            split = max(1, min(-(-length // (4 * wg)), -(-4 * dev.info.compute_units // outer), 1024))
            asz = _acc_size(dev, x.dtype)
            part = dev.alloc(outer * split * asz) if split > 1 else None
            dev.launch(kern, outer * split * wg,
                       (I64(length), I64(split), xh, I64(view.offset), oh, I64(out.offset),
                        (part or out.buffer).handle.arg, wg * asz))
            if split > 1:
                dev.launch(dev.kernel(prog, f"sg_red_{op}_final"), outer,
                           (I64(outer), I64(length), I64(split), part.handle.arg, oh, I64(out.offset)))
            return
        dev.launch(dev.kernel(prog, f"sg_red_{op}_cols"), outer * inner,
                   (I64(outer), I64(length), I64(inner), xh, I64(view.offset), oh, I64(out.offset)))

    kernel.__name__ = name
    return kernel


def _make_arg(name: str) -> Callable:
    def kernel(out, x, axis=0):
        dev = out.buffer.device
        if out.dtype != I64_ or x.dtype not in SUFFIX or x.dtype not in dev.dtypes:
            raise _dtype_error(name, (out, x), (I64_,))
        x = _contiguous(x)
        axis = _norm_axis(int(axis), len(x.shape), name)
        outer, length, inner = _split(x.shape, axis) if x.shape else (1, 1, 1)
        if outer * inner == 0:
            return
        if length == 0:
            raise _shape_error(name, (out, x), f"axis {axis} is empty")
        dev.launch(dev.kernel(f"arg:{SUFFIX[x.dtype]}", f"sg_{name}"), outer * inner,
                   (I64(outer), I64(length), I64(inner), x.buffer.handle.arg, I64(x.offset), out.buffer.handle.arg,
                    I64(out.offset)))

    kernel.__name__ = name
    return kernel


# -- matrix products ----------------------------------------------------------------------------------------------


def _as_batched(shape: tuple) -> tuple[int, int, int]:
    if len(shape) < 2:
        raise ValueError("matrices need at least 2 dimensions")
    return math.prod(shape[:-2]), shape[-2], shape[-1]


def _sgemm(dev, a, b, c, m: int, n: int, k: int, ta: bool, tb: bool, alpha: float, beta: float,
           offsets: list) -> None:
    """float32 products C_i = alpha op(A_i) op(B_i) + beta C_i of (a offset, b offset, c offset) triples, on the
    ClBuffers a, b, c with natural leading dimensions (row-major)."""
    lda, ldb, ldc = (m if ta else k), (k if tb else n), n
    lib = clblast.lib
    if lib is None:  # the backend's own kernel, one product at a time
        kern = dev.kernel("gemm:float32", "sg_gemm")
        for ao, bo, co in offsets:
            _own_gemm(dev, kern, a, ao, b, bo, c, co, 1, 1, 1, m, n, k, ta, tb, alpha, beta)
        return
    tra = clblast.TRANS if ta else clblast.NO_TRANS
    trb = clblast.TRANS if tb else clblast.NO_TRANS
    q = dev.queue_ptr
    if len(offsets) == 1:
        ao, bo, co = offsets[0]
        clblast.check(lib.CLBlastSgemm(clblast.ROW_MAJOR, tra, trb, m, n, k, alpha, a.mem, ao, lda, b.mem, bo, ldb,
                                       beta, c.mem, co, ldc, q, clblast.ffi.NULL), f"Sgemm {m}x{n}x{k}")
        return
    steps = [tuple(y - x for x, y in zip(offsets[i], offsets[i + 1])) for i in range(len(offsets) - 1)]
    if all(s == steps[0] for s in steps) and min(steps[0]) >= 0:
        (ao, bo, co), (sa, sb, sc) = offsets[0], steps[0]
        clblast.check(lib.CLBlastSgemmStridedBatched(clblast.ROW_MAJOR, tra, trb, m, n, k, alpha, a.mem, ao, lda, sa,
                                                     b.mem, bo, ldb, sb, beta, c.mem, co, ldc, sc, len(offsets), q,
                                                     clblast.ffi.NULL), f"SgemmStridedBatched {m}x{n}x{k}")
        return
    count = len(offsets)
    ffi = clblast.ffi
    clblast.check(lib.CLBlastSgemmBatched(
        clblast.ROW_MAJOR, tra, trb, m, n, k, ffi.new("float[]", [alpha] * count), a.mem,
        ffi.new("size_t[]", [o[0] for o in offsets]), lda, b.mem, ffi.new("size_t[]", [o[1] for o in offsets]), ldb,
        ffi.new("float[]", [beta] * count), c.mem, ffi.new("size_t[]", [o[2] for o in offsets]), ldc, count, q,
        ffi.NULL), f"SgemmBatched {m}x{n}x{k} x{count}")


_TILE = 16


def _own_gemm(dev, kern, a, ao, b, bo, c, co, batch, ba, bb, m, n, k, ta, tb, alpha, beta) -> None:
    gx, gy = -(-n // _TILE) * _TILE, -(-m // _TILE) * _TILE
    dev.launch_nd(kern, (gx, gy, batch), (_TILE, _TILE, 1),
                  (I64(m), I64(n), I64(k), I64(ba), I64(bb), a.arg, I64(ao), b.arg, I64(bo), c.arg, I64(co),
                   I32(1 if ta else 0), I32(1 if tb else 0), _acc(dev, alpha), _acc(dev, beta)))


def _matmul(out, a, b, trans_a=False, trans_b=False, alpha=1.0, beta=0.0) -> None:
    views = (out, a, b)
    dev = out.buffer.device
    if not (a.dtype == b.dtype == out.dtype) or a.dtype not in (F32, F16, I32_, I64_) or a.dtype not in dev.dtypes:
        raise _dtype_error("matmul", views, (F32, F16, I32_, I64_))
    a, b = _contiguous(a), _contiguous(b)
    try:
        ba, ar, ac = _as_batched(a.shape)
        bb, br, bc = _as_batched(b.shape)
        batch, m, n = _as_batched(out.shape)
    except ValueError as exc:
        raise _shape_error("matmul", views, str(exc)) from None
    am, ak = (ac, ar) if trans_a else (ar, ac)
    bk, bn = (bc, br) if trans_b else (br, bc)
    if am != m or bn != n or ak != bk or ba not in (1, batch) or bb not in (1, batch):
        raise _shape_error("matmul", views, f"shapes do not match for trans_a={bool(trans_a)}, "
                                            f"trans_b={bool(trans_b)}")
    if out.strides != _layout(out.shape)[0]:
        raise _shape_error("matmul", views, "the output must be contiguous")
    if batch == 0 or m == 0 or n == 0:
        return
    k = ak
    dt = a.dtype
    if k == 0:  # no products to sum: out = beta * out
        if beta == 0:
            _fill(out, 0)
        else:
            kernels["mul_scalar"](out, out, alpha=beta)
        return
    ta, tb = bool(trans_a), bool(trans_b)
    if dt in FLOATS and clblast.lib is not None:
        if dt == F16:  # through float32 copies: CLBlast's half product would also accumulate in half
            fa, fb, fo = _new(dev, a.shape, F32), _new(dev, b.shape, F32), _new(dev, out.shape, F32)
            _cast(fa, a)
            _cast(fb, b)
            if beta != 0:
                _cast(fo, out)
            _matmul_f32(dev, fa, fb, fo, batch, ba, bb, m, n, k, ta, tb, alpha, beta)
            _cast(out, fo)
            return
        _matmul_f32(dev, a, b, out, batch, ba, bb, m, n, k, ta, tb, alpha, beta)
        return
    _own_gemm(dev, dev.kernel(f"gemm:{SUFFIX[dt]}", "sg_gemm"), a.buffer.handle, a.offset, b.buffer.handle, b.offset,
              out.buffer.handle, out.offset, batch, ba, bb, m, n, k, ta, tb, alpha, beta)


def _matmul_f32(dev, a, b, out, batch, ba, bb, m, n, k, ta, tb, alpha, beta) -> None:
    ah, bh, ch = a.buffer.handle, b.buffer.handle, out.buffer.handle
    if batch > 1 and ba == batch and bb == 1 and not ta:
        # a stack of row-major matrices times one matrix is one taller product
        _sgemm(dev, ah, bh, ch, batch * m, n, k, ta, tb, alpha, beta, [(a.offset, b.offset, out.offset)])
        return
    offsets = [(a.offset + (0 if ba == 1 else i * m * k), b.offset + (0 if bb == 1 else i * k * n),
                out.offset + i * m * n) for i in range(batch)]
    _sgemm(dev, ah, bh, ch, m, n, k, ta, tb, alpha, beta, offsets)


# -- convolution --------------------------------------------------------------------------------------------------

_CONV = struct.Struct("<16q")  # sg_conv of kernels/conv.cl
COL_BUDGET = 1 << 24  # floats in one unfolded chunk (64 MiB)


class _Geometry:
    def __init__(self, name, x_shape, w_shape, y_shape, stride, padding, dilation, groups, views):
        if len(x_shape) != 4 or len(w_shape) != 4 or len(y_shape) != 4:
            raise _shape_error(name, views, "x, w and y must be 4-D (NCHW, KCHW)")
        self.N, self.C, self.H, self.W = x_shape
        self.K, cg, self.kh, self.kw = w_shape
        self.G = int(groups)
        if self.G < 1 or cg * self.G != self.C or self.K % self.G or tuple(y_shape[:2]) != (self.N, self.K):
            raise _shape_error(name, views, f"channels do not match with groups={self.G}")
        self.sh, self.sw = _pair(stride, "stride")
        self.dh, self.dw = _pair(dilation, "dilation")
        if min(self.sh, self.sw, self.dh, self.dw) < 1:
            raise _shape_error(name, views, "stride and dilation must be at least 1")
        self.pt, self.pl, self.pb, self.pr = _padding4(padding)
        self.OH, self.OW = y_shape[2], y_shape[3]
        self.Cg, self.Kg = cg, self.K // self.G
        self.ckk = cg * self.kh * self.kw
        self.rows = self.C * self.kh * self.kw
        self.ohw = self.OH * self.OW
        self.hw = self.H * self.W
        self.pointwise = (self.kh == self.kw == self.sh == self.sw == 1 and self.pt == self.pl == 0
                          and self.OH == self.H and self.OW == self.W)
        self.packed = _CONV.pack(self.N, self.C, self.H, self.W, self.K, self.kh, self.kw, self.OH, self.OW, self.sh,
                                 self.sw, self.pt, self.pl, self.dh, self.dw, self.G)

    def chunk(self, per_image: int) -> int:
        return max(1, min(self.N, COL_BUDGET // max(per_image, 1)))


def _conv_args(name: str, dts, views) -> None:
    dev = views[0].buffer.device
    dt = views[0].dtype
    if dt not in FLOATS or any(v is not None and v.dtype != dt for v in views) or dt not in dev.dtypes:
        raise _dtype_error(name, views, FLOATS)


def _as_f32(v):
    """float32 view of a float view (a converted copy for float16)."""
    if v is None or v.dtype == F32:
        return v
    f = _new(v.buffer.device, v.shape, F32)
    _cast(f, v)
    return f


def _conv2d(out, x, w, b=None, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1) -> None:
    views = (out, x, w, b)
    _conv_args("conv2d", FLOATS, views)
    x, w, b = _contiguous(x), _contiguous(w), _contiguous(b)
    g = _Geometry("conv2d", x.shape, w.shape, out.shape, stride, padding, dilation, groups, views)
    if g.N * g.K * g.ohw == 0:
        return
    if out.dtype == F16:
        y = _new(out.buffer.device, out.shape, F32)
        _conv2d_f32(g, y, _as_f32(x), _as_f32(w), _as_f32(b))
        _cast(out, y)
        return
    _conv2d_f32(g, out, x, w, b)


def _conv2d_f32(g: _Geometry, y, x, w, b) -> None:
    dev = y.buffer.device
    if g.ckk == 0:  # nothing to correlate: the bias alone
        if b is None:
            _fill(y, 0.0)
        else:
            _conv_bias(dev, g, y, b, 1)
        return
    nb = g.chunk(g.rows * g.ohw)
    col = None if g.pointwise else dev.alloc(nb * g.rows * g.ohw * 4)
    for n0 in range(0, g.N, nb):
        cnt = min(nb, g.N - n0)
        if g.pointwise:  # x itself is the unfolded matrix
            src, base = x.buffer.handle, x.offset + n0 * g.C * g.hw
        else:
            _im2col(dev, g, x, n0, cnt, col, g.rows * g.ohw, g.ohw)
            src, base = col.handle, 0
        offsets = [(w.offset + gi * g.Kg * g.ckk, base + (i * g.rows + gi * g.ckk) * g.ohw,
                    y.offset + ((n0 + i) * g.K + gi * g.Kg) * g.ohw) for i in range(cnt) for gi in range(g.G)]
        _sgemm(dev, w.buffer.handle, src, y.buffer.handle, g.Kg, g.ohw, g.ckk, False, False, 1.0, 0.0, offsets)
    if b is not None:
        _conv_bias(dev, g, y, b, 0)


def _conv_bias(dev, g: _Geometry, y, b, set_: int) -> None:
    rows = g.N * g.K
    dev.launch(dev.kernel("conv", "sg_conv_bias"), rows, (I64(rows), I64(g.K), I64(g.ohw), y.buffer.handle.arg,
                                                          I64(y.offset), b.buffer.handle.arg, I64(b.offset),
                                                          I32(set_)))


def _im2col(dev, g: _Geometry, x, n0: int, nb: int, col, col_sn: int, col_sr: int) -> None:
    total = nb * g.rows * g.OH  # one work-item per output row of each unfolded row
    dev.launch(dev.kernel("conv", "sg_im2col"), total,
               (g.packed, I64(n0), I64(nb), x.buffer.handle.arg, I64(x.offset), col.handle.arg, I64(0), I64(col_sn),
                I64(col_sr)))


def _conv2d_backward_data(dx, dy, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1) -> None:
    views = (dx, dy, w)
    _conv_args("conv2d_backward_data", FLOATS, views)
    dy, w = _contiguous(dy), _contiguous(w)
    g = _Geometry("conv2d_backward_data", dx.shape, w.shape, dy.shape, stride, padding, dilation, groups, views)
    if g.N * g.C * g.hw == 0:
        return
    if g.ohw == 0 or g.K == 0 or g.kh * g.kw == 0:
        _fill(dx, 0.0)
        return
    if dx.dtype == F16:
        f = _new(dx.buffer.device, dx.shape, F32)
        _conv_bwd_data_f32(g, f, _as_f32(dy), _as_f32(w))
        _cast(dx, f)
        return
    _conv_bwd_data_f32(g, dx, dy, w)


def _conv_bwd_data_f32(g: _Geometry, dx, dy, w) -> None:
    dev = dx.buffer.device
    nb = g.chunk(g.rows * g.ohw)
    col = None if g.pointwise else dev.alloc(nb * g.rows * g.ohw * 4)
    for n0 in range(0, g.N, nb):
        cnt = min(nb, g.N - n0)
        # column gradient of image i, group gi: w_g^T (ckk, Kg) @ dy_(i, g) (Kg, ohw); pointwise: dx itself
        target, base = (dx.buffer.handle, dx.offset + n0 * g.C * g.hw) if g.pointwise else (col.handle, 0)
        offsets = [(w.offset + gi * g.Kg * g.ckk, dy.offset + ((n0 + i) * g.K + gi * g.Kg) * g.ohw,
                    base + (i * g.rows + gi * g.ckk) * g.ohw) for i in range(cnt) for gi in range(g.G)]
        _sgemm(dev, w.buffer.handle, dy.buffer.handle, target, g.ckk, g.ohw, g.Kg, True, False, 1.0, 0.0, offsets)
        if not g.pointwise:
            total = cnt * g.C * g.H  # one work-item per row of dx
            dev.launch(dev.kernel("conv", "sg_col2im"), total,
                       (g.packed, I64(n0), I64(cnt), col.handle.arg, I64(0), I64(g.rows * g.ohw), I64(g.ohw),
                        dx.buffer.handle.arg, I64(dx.offset)))


def _conv2d_backward_weight(dw, dy, x, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1) -> None:
    views = (dw, dy, x)
    _conv_args("conv2d_backward_weight", FLOATS, views)
    dy, x = _contiguous(dy), _contiguous(x)
    g = _Geometry("conv2d_backward_weight", x.shape, dw.shape, dy.shape, stride, padding, dilation, groups, views)
    if g.K * g.ckk == 0:
        return
    if g.N == 0 or g.ohw == 0:
        _fill(dw, 0.0)
        return
    if dw.dtype == F16:
        f = _new(dw.buffer.device, dw.shape, F32)
        _conv_bwd_weight_f32(g, f, _as_f32(dy), _as_f32(x))
        _cast(dw, f)
        return
    _conv_bwd_weight_f32(g, dw, dy, x)


def _conv_bwd_weight_f32(g: _Geometry, dw, dy, x) -> None:
    dev = dw.buffer.device
    nb = g.chunk((g.rows + g.K) * g.ohw)
    col = dev.alloc(nb * g.rows * g.ohw * 4)
    dyt = dev.alloc(nb * g.K * g.ohw * 4) if nb > 1 else None
    for n0 in range(0, g.N, nb):
        cnt = min(nb, g.N - n0)
        L = cnt * g.ohw
        # unfolded rows (C*kh*kw, images * ohw), so group gi's block is the contiguous (ckk, L) at gi * ckk * L
        _im2col(dev, g, x, n0, cnt, col, g.ohw, L)
        if cnt > 1:  # dy of the chunk as (K, images * ohw)
            dev.launch(dev.kernel("conv", "sg_batch_to_rows"), g.K * cnt,
                       (I64(g.K), I64(g.ohw), I64(n0), I64(cnt), dy.buffer.handle.arg, I64(dy.offset),
                        dyt.handle.arg))
            dsrc, dbase = dyt.handle, 0
        else:
            dsrc, dbase = dy.buffer.handle, dy.offset + n0 * g.K * g.ohw
        # dw_g (Kg, ckk) (+)= dy_g (Kg, L) @ col_g^T (L, ckk)
        offsets = [(dbase + gi * g.Kg * L, gi * g.ckk * L, dw.offset + gi * g.Kg * g.ckk) for gi in range(g.G)]
        _sgemm(dev, dsrc, col.handle, dw.buffer.handle, g.Kg, g.ckk, L, False, True, 1.0, 0.0 if n0 == 0 else 1.0,
               offsets)


# -- pooling ------------------------------------------------------------------------------------------------------

_POOL = struct.Struct("<16q")
_POOL_MODES = {"max": 0, "avg": 1, "average": 1}


def _pool_geometry(name, x_shape, y_shape, kernel, stride, padding, dilation, mode, views) -> bytes:
    if len(x_shape) != 4 or len(y_shape) != 4 or tuple(x_shape[:2]) != tuple(y_shape[:2]):
        raise _shape_error(name, views, "x and the output must be 4-D NCHW with the same N and C")
    if mode not in _POOL_MODES:
        raise ValueError(f"opencl kernel {name}: mode must be 'max' or 'avg', got {mode!r}")
    kh, kw = _pair(kernel, "kernel")
    sh, sw = _pair(stride if stride is not None else (kh, kw), "stride")
    dh, dw = _pair(dilation, "dilation")
    if min(sh, sw, dh, dw) < 1:
        raise _shape_error(name, views, "stride and dilation must be at least 1")
    pt, pl, pb, pr = _padding4(padding)
    n, c, h, w = x_shape
    return _POOL.pack(n, c, h, w, y_shape[2], y_shape[3], kh, kw, sh, sw, pt, pl, pb, pr, dh, dw)


def _pool2d(out, indices, x, kernel=(2, 2), stride=None, padding=(0, 0, 0, 0), dilation=(1, 1), mode="max",
            count_include_pad=False) -> None:
    views = (out, indices, x)
    dev = out.buffer.device
    if x.dtype not in FLOATS or out.dtype != x.dtype or x.dtype not in dev.dtypes:
        raise _dtype_error("pool2d", views, FLOATS)
    if indices is not None and (indices.dtype != I64_ or indices.shape != out.shape):
        raise _shape_error("pool2d", views, "indices must be int64 of the output's shape")
    x = _contiguous(x)
    geom = _pool_geometry("pool2d", x.shape, out.shape, kernel, stride, padding, dilation, mode, views)
    if math.prod(out.shape) == 0:
        return
    ind = indices if indices is not None else out  # any buffer: the kernel does not touch it without with_idx
    rows = out.shape[0] * out.shape[1] * out.shape[2]
    dev.launch(dev.kernel(f"pool:{SUFFIX[x.dtype]}", "sg_pool_fwd"), rows,
               (geom, I32(_POOL_MODES[mode]), I32(1 if count_include_pad else 0), x.buffer.handle.arg, I64(x.offset),
                out.buffer.handle.arg, I64(out.offset), ind.buffer.handle.arg, I64(ind.offset),
                I32(indices is not None)))


def _pool2d_backward(dx, dy, x, indices, kernel=(2, 2), stride=None, padding=(0, 0, 0, 0), dilation=(1, 1),
                     mode="max", count_include_pad=False) -> None:
    views = (dx, dy, x, indices)
    dev = dx.buffer.device
    if dy.dtype not in FLOATS or dx.dtype != dy.dtype or dy.dtype not in dev.dtypes:
        raise _dtype_error("pool2d_backward", views, FLOATS)
    if mode == "max" and indices is None and (x is None or x.dtype != dy.dtype):
        raise _shape_error("pool2d_backward", views, "max pooling needs the forward's indices or its input x")
    dy, x, indices = _contiguous(dy), _contiguous(x), _contiguous(indices)
    geom = _pool_geometry("pool2d_backward", dx.shape, dy.shape, kernel, stride, padding, dilation, mode, views)
    if math.prod(dx.shape) == 0:
        return
    xv = x if x is not None else dy
    iv = indices if indices is not None else dy
    args = (geom, I32(_POOL_MODES[mode]), I32(1 if count_include_pad else 0), dy.buffer.handle.arg, I64(dy.offset),
            xv.buffer.handle.arg, I64(xv.offset), iv.buffer.handle.arg, I64(iv.offset), I32(indices is not None),
            dx.buffer.handle.arg, I64(dx.offset))
    prog = f"pool:{SUFFIX[dy.dtype]}"
    _, _, _, _, _, _, kh, kw, sh, sw = _POOL.unpack(geom)[:10]
    dh, dw = _POOL.unpack(geom)[14:]
    if sh >= (kh - 1) * dh + 1 and sw >= (kw - 1) * dw + 1:
        # disjoint windows: each input element has at most one, so its gradient is written from the output's side
        _fill(dx, 0.0)
        dev.launch(dev.kernel(prog, "sg_pool_bwd_disjoint"), dy.shape[0] * dy.shape[1] * dy.shape[2], args)
        return
    dev.launch(dev.kernel(prog, "sg_pool_bwd"), dx.shape[0] * dx.shape[1] * dx.shape[2], args)


# -- batch normalisation ------------------------------------------------------------------------------------------


def _bn_dims(name: str, x, views) -> tuple[int, int, int]:
    if len(x.shape) < 2:
        raise _shape_error(name, views, "x must be (N, C) or (N, C, ...)")
    return x.shape[0], x.shape[1], math.prod(x.shape[2:])


def _float_views(name: str, views: tuple, x) -> None:
    dev = x.buffer.device
    if x.dtype not in FLOATS or any(v.dtype not in FLOATS or v.dtype not in dev.dtypes for v in views):
        raise _dtype_error(name, views, FLOATS)


class _Vec:
    """A per-channel vector as contiguous float32 (converted when it is float16); `done()` writes an output back."""

    def __init__(self, v, read: bool = True):
        self.view = v
        self.f = v if v.dtype == F32 and v.strides == _layout(v.shape)[0] else None
        if self.f is None:
            self.f = _new(v.buffer.device, v.shape, F32)
            if read:
                _cast(self.f, v)

    @property
    def arg(self) -> bytes:
        return self.f.buffer.handle.arg

    @property
    def off(self) -> bytes:
        return I64(self.f.offset)

    def done(self) -> None:
        if self.f is not self.view:
            _cast(self.view, self.f)


def _vec_args(*vecs) -> list:
    """Kernel arguments of per-channel vectors: the kernels take them at offset 0, so offset views are copied."""
    out = []
    for v in vecs:
        if v.f.offset:
            moved = _new(v.f.buffer.device, v.f.shape, F32)
            _copy(moved, v.f)
            v.f = moved
        out.append(v.arg)
    return out


def _batchnorm_train(y, running_mean, running_var, saved_mean, saved_invstd, x, scale, bias, momentum=0.9,
                     eps=1e-5) -> None:
    views = (y, running_mean, running_var, saved_mean, saved_invstd, x, scale, bias)
    _float_views("batchnorm_train", views, x)
    x = _contiguous(x)
    n, c, s = _bn_dims("batchnorm_train", x, views)
    dev = x.buffer.device
    if c == 0:
        return
    sc, bi, rm, rv = _Vec(scale), _Vec(bias), _Vec(running_mean), _Vec(running_var)
    sm, si = _Vec(saved_mean, read=False), _Vec(saved_invstd, read=False)
    coef = dev.alloc(3 * c * _acc_size(dev, F32))
    kern = dev.kernel(f"bn:{SUFFIX[x.dtype]}", "sg_bn_stats")
    wg = dev.group_size(kern)
    dev.launch(kern, c * wg,
               (I64(n), I64(c), I64(s), x.buffer.handle.arg, I64(x.offset), *_vec_args(sc, bi, rm, rv, sm, si),
                _acc(dev, momentum), _acc(dev, eps), coef.handle.arg, wg * _acc_size(dev, F32)))
    for v in (rm, rv, sm, si):
        v.done()
    total = n * c * s
    if total:
        dev.launch(dev.kernel(f"bn:{SUFFIX[x.dtype]}", "sg_bn_apply"), total,
                   (I64(total), I64(c), I64(s), x.buffer.handle.arg, I64(x.offset), y.buffer.handle.arg,
                    I64(y.offset), coef.handle.arg))


def _batchnorm_infer(y, x, scale, bias, mean, var, eps=1e-5) -> None:
    views = (y, x, scale, bias, mean, var)
    _float_views("batchnorm_infer", views, x)
    x = _contiguous(x)
    n, c, s = _bn_dims("batchnorm_infer", x, views)
    total = n * c * s
    if total == 0:
        return
    dev = x.buffer.device
    dev.launch(dev.kernel(f"bn:{SUFFIX[x.dtype]}", "sg_bn_infer"), total,
               (I64(total), I64(c), I64(s), x.buffer.handle.arg, I64(x.offset), y.buffer.handle.arg, I64(y.offset),
                *_vec_args(_Vec(scale), _Vec(bias), _Vec(mean), _Vec(var)), _acc(dev, eps)))


def _batchnorm_backward(dx, dscale, dbias, dy, x, scale, saved_mean, saved_invstd) -> None:
    views = (dx, dscale, dbias, dy, x, scale, saved_mean, saved_invstd)
    _float_views("batchnorm_backward", views, x)
    if dy.dtype != x.dtype or dx.dtype != x.dtype:
        raise _dtype_error("batchnorm_backward", views, FLOATS)
    x, dy = _contiguous(x), _contiguous(dy)
    n, c, s = _bn_dims("batchnorm_backward", x, views)
    if c == 0:
        return
    dev = x.buffer.device
    sc, sm, si = _Vec(scale), _Vec(saved_mean), _Vec(saved_invstd)
    ds, db = _Vec(dscale, read=False), _Vec(dbias, read=False)
    coef = dev.alloc(3 * c * _acc_size(dev, F32))
    prog = f"bn:{SUFFIX[x.dtype]}"
    sc_a, sm_a, si_a, ds_a, db_a = _vec_args(sc, sm, si, ds, db)
    kern = dev.kernel(prog, "sg_bn_bwd_stats")
    wg = dev.group_size(kern)
    dev.launch(kern, c * wg,
               (I64(n), I64(c), I64(s), dy.buffer.handle.arg, I64(dy.offset), x.buffer.handle.arg, I64(x.offset),
                sc_a, sm_a, si_a, ds_a, db_a, coef.handle.arg, wg * _acc_size(dev, F32)))
    ds.done()
    db.done()
    total = n * c * s
    if total:
        dev.launch(dev.kernel(prog, "sg_bn_bwd_dx"), total,
                   (I64(total), I64(c), I64(s), dy.buffer.handle.arg, I64(dy.offset), x.buffer.handle.arg,
                    I64(x.offset), dx.buffer.handle.arg, I64(dx.offset), sm_a, coef.handle.arg))


# -- softmax and losses -------------------------------------------------------------------------------------------

_ROWS_MIN = 64  # rows at least this long get a work-group each


def _softmax_split(x, axis, name) -> tuple[int, int, int]:
    if not x.shape:  # a 0-d softmax is over one element
        return 1, 1, 1
    return _split(x.shape, _norm_axis(int(axis), len(x.shape), name))


def _make_softmax(name: str, log: int) -> Callable:
    def kernel(out, x, axis=-1):
        views = (out, x)
        dev = out.buffer.device
        if x.dtype not in FLOATS or out.dtype != x.dtype or x.dtype not in dev.dtypes:
            raise _dtype_error(name, views, FLOATS)
        x = _contiguous(x)
        outer, length, inner = _softmax_split(x, axis, name)
        if outer * length * inner == 0:
            return
        prog = f"softmax:{SUFFIX[x.dtype]}"
        if inner == 1 and length >= _ROWS_MIN:
            kern = dev.kernel(prog, "sg_softmax_rows")
            wg = dev.group_size(kern)
            dev.launch(kern, outer * wg,
                       (I64(length), I32(log), x.buffer.handle.arg, I64(x.offset), out.buffer.handle.arg,
                        I64(out.offset), wg * _acc_size(dev, F32)))
            return
        dev.launch(dev.kernel(prog, "sg_softmax_cols"), outer * inner,
                   (I64(outer), I64(length), I64(inner), I32(log), x.buffer.handle.arg, I64(x.offset),
                    out.buffer.handle.arg, I64(out.offset)))

    kernel.__name__ = name
    return kernel


def _make_softmax_backward(name: str, log: int) -> Callable:
    def kernel(dx, dy, y, axis=-1):
        views = (dx, dy, y)
        dev = dx.buffer.device
        if dy.dtype not in FLOATS or y.dtype != dy.dtype or dx.dtype != dy.dtype or dy.dtype not in dev.dtypes:
            raise _dtype_error(name, views, FLOATS)
        dy, y = _contiguous(dy), _contiguous(y)
        outer, length, inner = _softmax_split(y, axis, name)
        if outer * length * inner == 0:
            return
        prog = f"softmax:{SUFFIX[y.dtype]}"
        args = (dy.buffer.handle.arg, I64(dy.offset), y.buffer.handle.arg, I64(y.offset), dx.buffer.handle.arg,
                I64(dx.offset))
        if inner == 1 and length >= _ROWS_MIN:
            kern = dev.kernel(prog, "sg_softmax_bwd_rows")
            wg = dev.group_size(kern)
            dev.launch(kern, outer * wg,
                       (I64(length), I32(log), *args, wg * _acc_size(dev, F32)))
            return
        dev.launch(dev.kernel(prog, "sg_softmax_bwd_cols"), outer * inner,
                   (I64(outer), I64(length), I64(inner), I32(log), *args))

    kernel.__name__ = name
    return kernel


def _first_bad_index(dev, idx, count: int, length: int, lo: int | None = None) -> int | None:
    """The first index of `idx` outside [lo, length) (lo = -length by default: indices may count from the end), or
    None. Reads a flag back: a synchronising call, so that the error is raised by the kernel call that caused it,
    before any output is touched."""
    if count == 0:
        return None
    flag = dev.scratch("index-flag", 4)
    dev.fill_bytes(flag.handle, 0, PU32(_INT_MAX), 4)
    dev.launch(dev.kernel(f"index:{SUFFIX[idx.dtype]}", "sg_check_indices"), count,
               (I64(count), I64(-length if lo is None else lo), I64(length), idx.buffer.handle.arg, I64(idx.offset),
                flag.handle.arg))
    pos = int(dev.read(View(flag, I32_, ())))
    if pos == _INT_MAX:
        return None
    return int(dev.read(View(idx.buffer, idx.dtype, (), offset=idx.offset + pos)))


def _xent_check(name: str, x, target, views) -> tuple[int, int]:
    dev = x.buffer.device
    if x.dtype not in FLOATS or len(x.shape) != 2 or x.dtype not in dev.dtypes:
        raise _shape_error(name, views, "x must be a float (N, C) matrix") if x.dtype in dev.dtypes else \
            _dtype_error(name, views, FLOATS)
    n, c = x.shape
    if target.dtype in (I32_, I64_):
        if math.prod(target.shape) != n:
            raise _shape_error(name, views, "integer targets must hold N labels")
        bad = _first_bad_index(dev, target, n, c, lo=0)  # class labels never count from the end
        if bad is not None:
            raise IndexError(f"opencl kernel {name}({', '.join(_describe(v) for v in views)}): label {bad} with "
                             f"{c} classes")
    elif target.dtype in FLOATS and target.dtype in dev.dtypes:
        if tuple(target.shape) != (n, c):
            raise _shape_error(name, views, "probability targets must have x's shape")
    else:
        raise _dtype_error(name, views, (I32_, I64_) + FLOATS)
    return n, c


def _softmax_cross_entropy(loss, x, target) -> None:
    views = (loss, x, target)
    x, target = _contiguous(x), _contiguous(target)
    n, c = _xent_check("softmax_cross_entropy", x, target, views)
    if loss.dtype != x.dtype:
        raise _dtype_error("softmax_cross_entropy", views, FLOATS)
    if n == 0:
        return
    dev = x.buffer.device
    dev.launch(dev.kernel(f"sce:{SUFFIX[x.dtype]}:{SUFFIX[target.dtype]}", "sg_sce"), n,
               (I64(n), I64(c), x.buffer.handle.arg, I64(x.offset), target.buffer.handle.arg, I64(target.offset),
                loss.buffer.handle.arg, I64(loss.offset)))


def _softmax_cross_entropy_backward(dx, dloss, x, target) -> None:
    views = (dx, dloss, x, target)
    x, target, dloss = _contiguous(x), _contiguous(target), _contiguous(dloss)
    n, c = _xent_check("softmax_cross_entropy_backward", x, target, views)
    if dloss.dtype != x.dtype or dx.dtype != x.dtype:
        raise _dtype_error("softmax_cross_entropy_backward", views, FLOATS)
    if n * c == 0:
        return
    dev = x.buffer.device
    dev.launch(dev.kernel(f"sce:{SUFFIX[x.dtype]}:{SUFFIX[target.dtype]}", "sg_sce_bwd"), n,
               (I64(n), I64(c), dloss.buffer.handle.arg, I64(dloss.offset), x.buffer.handle.arg, I64(x.offset),
                target.buffer.handle.arg, I64(target.offset), dx.buffer.handle.arg, I64(dx.offset)))


# -- indexing -----------------------------------------------------------------------------------------------------


def _gather(out, x, indices, axis=0) -> None:
    views = (out, x, indices)
    dev = out.buffer.device
    if indices.dtype not in (I32_, I64_) or out.dtype != x.dtype or x.dtype not in dev.dtypes:
        raise _dtype_error("gather", views, (I32_, I64_))
    x, indices = _contiguous(x), _contiguous(indices)
    axis = _norm_axis(int(axis), len(x.shape), "gather")
    expect = x.shape[:axis] + tuple(indices.shape) + x.shape[axis + 1:]
    if tuple(out.shape) != expect:
        raise _shape_error("gather", views, f"the output must have shape {expect}")
    outer, length, inner = _split(x.shape, axis)
    count = math.prod(indices.shape)
    bad = _first_bad_index(dev, indices, count, length)
    if bad is not None:
        raise IndexError(f"opencl kernel gather({', '.join(_describe(v) for v in views)}): index {bad} on axis "
                         f"{axis} of length {length}")
    total = outer * count * inner
    if total == 0:
        return
    dev.launch(dev.kernel(f"gather:{ITEMSIZE[x.dtype]}:{SUFFIX[indices.dtype]}", "sg_gather"), total,
               (I64(outer), I64(length), I64(inner), I64(count), x.buffer.handle.arg, I64(x.offset),
                indices.buffer.handle.arg, I64(indices.offset), out.buffer.handle.arg, I64(out.offset)))


# Below this many output columns (outer * inner) scatter_add spreads the updates over work-items with atomic adds;
# from it on, one work-item per column adds its updates in order (deterministic, and the CPU backend's order).
SCATTER_ATOMIC_BELOW = 2048


def _scatter_add(out, indices, updates, axis=0) -> None:
    views = (out, indices, updates)
    dev = out.buffer.device
    if indices.dtype not in (I32_, I64_) or updates.dtype != out.dtype or out.dtype not in (F32, F16, I32_, I64_) \
            or out.dtype not in dev.dtypes:
        raise _dtype_error("scatter_add", views, (I32_, I64_))
    indices, updates = _contiguous(indices), _contiguous(updates)
    axis = _norm_axis(int(axis), len(out.shape), "scatter_add")
    expect = out.shape[:axis] + tuple(indices.shape) + out.shape[axis + 1:]
    if tuple(updates.shape) != expect:
        raise _shape_error("scatter_add", views, f"updates must have shape {expect}")
    outer, length, inner = _split(out.shape, axis)
    count = math.prod(indices.shape)
    bad = _first_bad_index(dev, indices, count, length)
    if bad is not None:
        raise IndexError(f"opencl kernel scatter_add({', '.join(_describe(v) for v in views)}): index {bad} on axis "
                         f"{axis} of length {length}")
    if outer * inner * count == 0:
        return
    target = out if out.strides == _layout(out.shape)[0] else _contiguous(out)
    args = (I64(outer), I64(length), I64(inner), I64(count), target.buffer.handle.arg, I64(target.offset),
            indices.buffer.handle.arg, I64(indices.offset), updates.buffer.handle.arg, I64(updates.offset))
    prog = f"scatter:{SUFFIX[out.dtype]}:{SUFFIX[indices.dtype]}"
    atomic = outer * inner < SCATTER_ATOMIC_BELOW and count > 1 and (out.dtype != I64_ or dev.int64_atomics)
    if atomic:
        dev.launch(dev.kernel(prog, "sg_scatter_atomic"), outer * count * inner, args)
    else:
        dev.launch(dev.kernel(prog, "sg_scatter_cols"), outer * inner, args)
    if target is not out:
        _copy(out, target)


_PAD_MODES = {"constant": 0, "reflect": 1, "edge": 2}
PAD_MAXD = 16
_PADS = struct.Struct(f"<q{3 * PAD_MAXD}q")


def _pad(out, x, pads, mode="constant", value=0.0) -> None:
    views = (out, x)
    dev = out.buffer.device
    if out.dtype != x.dtype or x.dtype not in dev.dtypes:
        raise _dtype_error("pad", views, (x.dtype,))
    if mode not in _PAD_MODES:
        raise ValueError(f"opencl kernel pad: mode must be 'constant', 'reflect' or 'edge', got {mode!r}")
    x = _contiguous(x)
    nd = len(x.shape)
    pads = [int(p) for p in pads]
    if len(pads) != 2 * nd or min(pads, default=0) < 0:
        raise _shape_error("pad", views, f"pads must be {2 * nd} non-negative numbers, got {pads}")
    expect = tuple(s + pads[d] + pads[d + nd] for d, s in enumerate(x.shape))
    if tuple(out.shape) != expect:
        raise _shape_error("pad", views, f"the output must have shape {expect}")
    total = math.prod(expect)
    if total == 0:
        return
    if math.prod(x.shape) == 0 and mode != "constant":
        raise _shape_error("pad", views, f"mode {mode!r} needs a non-empty input")
    if nd > PAD_MAXD:
        raise _shape_error("pad", views, f"at most {PAD_MAXD} dimensions")
    if math.prod(x.shape) == 0:  # nothing to copy: all constant
        _fill(out, value)
        return
    size = ITEMSIZE[x.dtype]
    fill = [0] * (PAD_MAXD - nd)
    packed = _PADS.pack(nd, *x.shape, *fill, *expect, *fill, *pads[:nd], *fill)
    dev.launch(dev.kernel(f"pad:{size}", "sg_pad"), total,
               (I64(total), packed, I32(_PAD_MODES[mode]), struct.pack(_BITS_FMT[size], _element_bits(x.dtype, value)),
                x.buffer.handle.arg, I64(x.offset), out.buffer.handle.arg, I64(out.offset)))


# -- random numbers -----------------------------------------------------------------------------------------------

_Q = struct.Struct("<Q").pack


def _random_out(name: str, out, allowed) -> int:
    dev = out.buffer.device
    if out.dtype not in allowed or out.dtype not in dev.dtypes:
        raise _dtype_error(name, (out,), allowed)
    cs, n = _layout(out.shape)
    if out.strides != cs and n > 1:
        raise _shape_error(name, (out,), "the output must be contiguous")
    return n


def _random(name: str, out, a: float, b: float | None, seed: int, offset: int, allowed) -> None:
    n = _random_out(name, out, allowed)
    if n == 0:
        return
    dev = out.buffer.device
    params = (_acc(dev, a),) if b is None else (_acc(dev, a), _acc(dev, b))
    dev.launch(dev.kernel(f"random:{SUFFIX[out.dtype]}", f"sg_{name}"), n,
               (I64(n), out.buffer.handle.arg, I64(out.offset), *params, _Q(int(seed) & _U64),
                _Q(int(offset) & _U64)))


def _random_uniform(out, low=0.0, high=1.0, seed=0, offset=0) -> None:
    _random("random_uniform", out, low, high, seed, offset, FLOATS)


def _random_normal(out, mean=0.0, std=1.0, seed=0, offset=0) -> None:
    _random("random_normal", out, mean, std, seed, offset, FLOATS)


def _random_bernoulli(out, p=0.5, seed=0, offset=0) -> None:
    _random("random_bernoulli", out, p, None, seed, offset, tuple(SUFFIX))


def philox_u32(device, seed: int, offset: int, n: int) -> list[int]:
    """The generator's raw 32-bit draws offset .. offset + n - 1, computed on `device` (for tests)."""
    buf = device.alloc(max(n, 1) * 4)
    if n:
        device.launch(device.kernel("random:float32", "sg_philox_u32"), n,
                      (I64(n), _Q(int(seed) & _U64), _Q(int(offset) & _U64), buf.handle.arg))
    return [int(v) for v in device.read(View(buf, I32_, (n,))).view("uint32")]


# -- the table ----------------------------------------------------------------------------------------------------


def build() -> dict[str, Callable]:
    table: dict[str, Callable] = {}
    for entry in expressions.TABLE.values():
        table[entry.name] = _make_unary(entry) if entry.arity == 1 else _make_binary(entry)
    table.update({
        "fill": _fill, "copy": _copy, "cast": _cast, "where": _where,
        **{name: _make_reduce(name) for name in _REDUCE_OPS},
        "argmax": _make_arg("argmax"), "argmin": _make_arg("argmin"),
        "matmul": _matmul,
        "conv2d": _conv2d, "conv2d_backward_data": _conv2d_backward_data,
        "conv2d_backward_weight": _conv2d_backward_weight,
        "pool2d": _pool2d, "pool2d_backward": _pool2d_backward,
        "batchnorm_train": _batchnorm_train, "batchnorm_infer": _batchnorm_infer,
        "batchnorm_backward": _batchnorm_backward,
        "softmax": _make_softmax("softmax", 0), "log_softmax": _make_softmax("log_softmax", 1),
        "softmax_backward": _make_softmax_backward("softmax_backward", 0),
        "log_softmax_backward": _make_softmax_backward("log_softmax_backward", 1),
        "softmax_cross_entropy": _softmax_cross_entropy,
        "softmax_cross_entropy_backward": _softmax_cross_entropy_backward,
        "gather": _gather, "scatter_add": _scatter_add, "pad": _pad,
        "random_uniform": _random_uniform, "random_normal": _random_normal, "random_bernoulli": _random_bernoulli,
    })
    return table


kernels: dict[str, Callable] = build()
