"""The kernel table that GPU backends share: every primitive but the matrix product and convolution.

The OpenCL and CUDA backends (and any backend whose device speaks OpenCL C or CUDA C++) compile the same kernel
sources: the element-wise programs rendered by `singa.gpu.codegen` from singa.expressions, and the hand-written
families in `singa/gpu/kernels/*.cl`, written in the common subset of OpenCL C and CUDA C++ that a backend's
*prelude* completes (its `kernels/common.cl` or `kernels/prelude.cuh`: work-item indices, barriers, atomics, half
conversions, `SG_LOCAL_ARG` / `SG_LOCAL_INIT` for work-group scratch memory). A fix to a kernel lands in every GPU
backend, and both are tested by the same conformance suite (the OpenCL one on PoCL, on any machine).

Each callable follows singa.primitives' convention, `kernels[name](out_views..., input_views..., **params)`, finds the
device from its first view's buffer and launches kernels on it through the device's launch interface:

    dev.kernel(program, name)          a compiled kernel; programs are named like 'ew:add:float32' or 'pool:float16'
                                       and built by the device from `source_of(program, dev)` after its prelude
    dev.launch(kernel, n, args, local=None)
                                       n work-items in groups of `local` (default dev.wg); `args` are the kernel's
                                       parameters as packed bytes, in order; an int is the byte size of a
                                       work-group array (an SG_LOCAL_ARG parameter)
    dev.launch_nd(kernel, global_size, local_size, args)
    dev.group_size(kernel)             the work-group size `launch` uses for that kernel
    dev.fill_bytes(handle, byte_offset, pattern, nbytes), dev.scratch(name, nbytes), dev._copy_on_device(...)
    dev.fp64, dev.int64_atomics        accumulate in double; 64-bit atomic adds exist
    dev.info.compute_units             how many work-groups run at once (sizes the split of long reductions)

A buffer handle's `arg` is its device address as kernel-parameter bytes. Backends add `_matmul` and the
`_conv2d*` kernels (their BLAS and convolution libraries) and call `assemble(globals())`.

Element-wise kernels keep a fast path for the common case (every operand contiguous with the output's shape): one
launch, nothing allocated. Other layouts have their axes merged where the memory allows, then go to the strided
kernel with the shape and strides passed by value (an `sg_dims` struct); layouts of more than SG_MAXD merged axes are
split into several launches.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from singa import dtypes, expressions, kernel_args, kernel_checks, kernel_table
from singa.backend import View
from singa.gpu import codegen

I64 = struct.Struct("<q").pack
I32 = struct.Struct("<i").pack
PU32 = struct.Struct("<I").pack
PF32 = struct.Struct("<f").pack
PF64 = struct.Struct("<d").pack
KERNELS = Path(__file__).resolve().parent / "kernels"

F32, F16, I32_, I64_, BOOL, F64 = (dtypes.float32, dtypes.float16, dtypes.int32, dtypes.int64, dtypes.bool_,
                                   dtypes.float64)
# float64 has kernels like every dtype; a device computes it only where it declares it (CUDA does; OpenCL devices
# without cl_khr_fp64 do not)
SUFFIX = {F32: "float32", F16: "float16", I32_: "int32", I64_: "int64", BOOL: "bool", F64: "float64"}
ITEMSIZE = {dt: dtypes.itemsize(dt) for dt in SUFFIX}
FLOATS = (F32, F16, F64)
MAXD = 8  # SG_MAXD of the preludes
_DIMS = struct.Struct(f"<q{MAXD}q{4 * MAXD}q")  # sg_dims
_INT_MAX = 2 ** 31 - 1
_U64 = (1 << 64) - 1

# -- program sources ------------------------------------------------------------------------------------------------

_MACRO = {F32: "F32", F16: "F16", I32_: "I32", I64_: "I64", BOOL: "BOOL", F64: "F64"}
_STORAGE = {F32: "float", F16: "half", I32_: "int", I64_: "long", BOOL: "uchar", F64: "double"}
_BITS = codegen.BITS


def _types(dtype: int, t: str = "T", ld: str = "LD", st: str = "ST", from_acc: bool = False) -> str:
    """Macros naming a dtype's storage type, load and store; `from_acc`: stores round once from sg_acc. For the main
    type T also CT, the type its values are computed in, and V, that of batch normalisation's per-channel vectors."""
    m = _MACRO[dtype]
    store = f"SG_ST_{m}_ACC" if from_acc and dtype == F16 else f"SG_ST_{m}"
    head = f"#define {t} {_STORAGE[dtype]}\n#define {ld} SG_LD_{m}\n#define {st} {store}\n"
    if t == "T":
        real = "double" if dtype == F64 else "float"
        head += f"#define CT {real}\n#define V {real}\n"
    return head


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


def real_types(dt: str) -> str:
    """The T/LD/ST/CT/V macros of a float32 or float64 program (a backend's own programs of one real dtype)."""
    return _types(_dt(dt))


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
    acc = "double" if d == F64 else "float" if d in FLOATS else "long"
    return _types(d) + f"#define ACC {acc}\n" + _read("gemm.cl")


def _src_scatter(dev, dt: str, idt: str) -> str:
    d = _dt(dt)
    suffix = {F32: "f32", F16: "f16", I32_: "i32", I64_: "i64", F64: "f64"}[d]
    atomic = "" if (d != I64_ or dev.int64_atomics) and d != F64 else "#define SG_NO_ATOMIC\n"
    return (_ATOMICS + _types(d) + f"#define TNAME {suffix}\n#define TI {_STORAGE[_dt(idt)]}\n{atomic}"
            f"#define SG_ATOMIC_ADD(p, d, v) sg_atomic_add_{suffix}(p, d, v)\n" + _read("indexing.cl"))


def _src_sce(dev, dt: str, tdt: str) -> str:
    t = _dt(tdt)
    labels = t in (I32_, I64_)
    head = _types(_dt(dt)) + f"#define SG_SCE\n#define TT_LABELS {int(labels)}\n"
    head += f"#define TT {_STORAGE[t]}\n" if labels else _types(t, "TT", "LDT", "STT")
    return head + _read("softmax.cl")


def read_source(name: str) -> str:
    """A kernel family's source from singa/gpu/kernels."""
    return (KERNELS / name).read_text()


_read = read_source

SOURCES: dict[str, Callable] = {
    "ew": _src_ew,
    "cast": lambda dev, s, d: codegen.cast_source(((_dt(s), _dt(d)),)),
    "mem": lambda dev, op, size: codegen.memory_source(op, int(size)),
    "reduce": _src_reduce,
    "arg": _src_arg,
    "gemm": _src_gemm,
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


def program_names() -> list[str]:
    """Every program the shared table can ask a device for (a backend's compile check builds them all)."""
    names = [f"ew:{e.name}:{SUFFIX[dt]}" for e in expressions.TABLE.values() for dt in e.kernel_dtypes]
    names += [f"cast:{s}:{d}" for s in SUFFIX.values() for d in SUFFIX.values() if s != d]
    names += [f"mem:{op}:{size}" for op in ("fill", "copy", "where") for size in (1, 2, 4, 8)]
    names += [f"reduce:{s}:{d}" for s in SUFFIX.values() for d in SUFFIX.values()]
    names += [f"{kind}:{SUFFIX[dt]}" for kind in ("arg", "gemm", "random") for dt in SUFFIX]
    names += [f"{kind}:{SUFFIX[dt]}" for kind in ("pool", "bn", "softmax") for dt in FLOATS]
    names += [f"sce:{SUFFIX[dt]}:{SUFFIX[t]}" for dt in FLOATS for t in (I32_, I64_, *FLOATS)]
    names += [f"index:{SUFFIX[i]}" for i in (I32_, I64_)]
    names += [f"gather:{size}:{SUFFIX[i]}" for size in (1, 2, 4, 8) for i in (I32_, I64_)]
    names += [f"pad:{size}" for size in (1, 2, 4, 8)]
    names += [f"scatter:{SUFFIX[dt]}:{SUFFIX[i]}" for dt in (F32, F16, I32_, I64_, F64) for i in (I32_, I64_)]
    return names


def source_of(program: str, dev, sources: dict | None = None) -> str:
    """The source (without the device's prelude, with kernels/dtypes.cl) of a program such as 'ew:add:float32' or
    'pool:float16'; `sources` are a backend's own program kinds, looked up first."""
    kind, *parts = program.split(":")
    fn = (sources or {}).get(kind) or SOURCES[kind]
    return _read("dtypes.cl") + "\n" + fn(dev, *parts)


# -- helpers ------------------------------------------------------------------------------------------------------

_layout = kernel_args.layout
_describe = kernel_args.describe
_element_bits = kernel_args.element_bits


def backend_of(views: tuple) -> str:
    """The backend name that starts error messages: that of the first view's device."""
    return next(v for v in views if v is not None).buffer.device.backend_name


def _dtype_error(name: str, views: tuple, supported) -> Exception:
    return kernel_args.dtype_error(backend_of(views), name, views, supported)


def _shape_error(name: str, views: tuple, what: str) -> ValueError:
    return kernel_args.shape_error(backend_of(views), name, views, what)


def _check_device(name: str, dt: int, dev) -> None:
    if dt not in dev.dtypes:
        raise dev.dtype_error(name, dt)


def _pack_dims(nd: int, flat: list, nops: int) -> bytes:
    """An sg_dims struct from kernel_table's layout list (nd sizes, then nd strides per operand)."""
    pad = [0] * (MAXD - nd)
    words = flat[:nd] + pad
    for k in range(4):
        words += (flat[nd * (k + 1):nd * (k + 2)] + pad) if k < nops else [0] * MAXD
    return _DIMS.pack(nd, *words)


def _launchers(program: str, symbol: str, nviews: int, pack_params: Callable | None = None) -> tuple:
    """kernel_table launchers of the kernel pair `symbol`_c / `symbol`_s of `program` over `nviews` views; the
    trailing arguments are passed as they are, or through `pack_params(dev, values)`."""
    def args_of(dev, args) -> list:
        out = []
        for i in range(nviews):
            out += (args[2 * i].arg, I64(args[2 * i + 1]))
        extra = args[2 * nviews:]
        return out + list(pack_params(dev, extra) if pack_params is not None and extra else extra)

    def contig(dev, n, *args):
        dev.launch(dev.kernel(program, symbol + "_c"), n, (I64(n), *args_of(dev, args)))

    def strided(dev, nd, flat, *args):
        m = math.prod(flat[:nd])
        dev.launch(dev.kernel(program, symbol + "_s"), m, (I64(m), _pack_dims(nd, flat, nviews), *args_of(dev, args)))

    return contig, strided


_LAUNCHERS: dict[tuple, tuple] = {}


def _run_layout(dev, program: str, symbol: str, shape: tuple, views: tuple, extra: tuple) -> None:
    """An element-wise kernel pair (`symbol`_c / _s) over views of any strides, all of `shape`; `extra` are the
    trailing kernel arguments (packed)."""
    key = (program, symbol, len(views))
    pair = _LAUNCHERS.get(key)
    if pair is None:
        pair = _LAUNCHERS[key] = _launchers(program, symbol, len(views))
    kernel_table.run_layout(*pair, shape, views, extra, device=dev, max_dims=MAXD)


def _contiguous(v):
    return kernel_table.contiguous(v, _copy)


def _new(dev, shape: tuple, dtype: int) -> View:
    return View(dev.alloc(max(math.prod(shape), 1) * ITEMSIZE[dtype]), dtype, shape)


def _acc(dev, value: float) -> bytes:
    """A float kernel argument of type sg_acc."""
    return PF64(value) if dev.fp64 else PF32(value)


_BITS_FMT = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}


# -- element-wise -------------------------------------------------------------------------------------------------


def _param_packer(dt: int) -> Callable:
    """Packs (alpha, beta) for kernels of input dtype dt: float for float data, else sg_acc (double with fp64)."""
    if dt in (F32, F16):
        return lambda dev, values: [PF32(v) for v in values]
    if dt == F64:
        return lambda dev, values: [PF64(v) for v in values]
    return lambda dev, values: [(PF64 if dev.fp64 else PF32)(v) for v in values]


def make_elementwise(backend: str) -> Callable[[expressions.Elementwise], Callable]:
    """The element-wise factory of a GPU backend named `backend` (the name starts its error messages)."""
    def make(entry: expressions.Elementwise) -> Callable:
        contig, strided = [None] * 8, [None] * 8
        nviews = entry.arity + 1
        for dt in entry.kernel_dtypes:
            contig[dt], strided[dt] = _launchers(f"ew:{entry.name}:{SUFFIX[dt]}", f"sg_ew_{entry.name}_{SUFFIX[dt]}",
                                                 nviews, _param_packer(dt))
        return kernel_table.elementwise_kernel(backend, entry, contig, strided, with_device=True, max_dims=MAXD,
                                               check_device_dtypes=True)

    return make


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
    dims, strides = kernel_args.coalesce(out.shape, [out.strides, x.strides])
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
        raise TypeError(f"{backend_of((out,))} kernel where({_describe(out)}, {_describe(cond)}, {_describe(a)}, "
                        f"{_describe(b)}): cond must be bool and a, b of the output's dtype")
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
        reduced, kept = kernel_checks.reduce_axes(backend_of((out,)), name, out, x, axes)
        if math.prod(kept) == 0:
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
        axis, outer, length, inner = kernel_checks.arg_split(backend_of((x,)), name, x, axis)
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


def matmul_setup(out, a, b, trans_a, trans_b, alpha, beta, allowed: tuple) -> tuple | None:
    """What every GPU matmul starts with: the dtype check (`allowed` dtypes), contiguous inputs and the sizes;
    None when nothing is left to compute (an empty output, or k = 0 handled here as out = beta * out), else
    (a, b, batch, ba, bb, m, n, k)."""
    views = (out, a, b)
    dev = out.buffer.device
    if not (a.dtype == b.dtype == out.dtype) or a.dtype not in allowed or a.dtype not in dev.dtypes:
        raise _dtype_error("matmul", views, allowed)
    a, b = _contiguous(a), _contiguous(b)
    batch, ba, bb, m, n, k = kernel_checks.matmul_dims(backend_of(views), (out, a, b), trans_a, trans_b,
                                                       _layout(out.shape)[0])
    if batch == 0 or m == 0 or n == 0:
        return None
    if k == 0:  # no products to sum: out = beta * out
        if beta == 0:
            _fill(out, 0)
        else:
            dev.table["mul_scalar"](out, out, alpha=beta)
        return None
    return a, b, batch, ba, bb, m, n, k


_TILE = 16


def own_gemm(dev, kern, a, ao, b, bo, c, co, batch, ba, bb, m, n, k, ta, tb, alpha, beta) -> None:
    """out[i] = alpha op(a[i]) op(b[i]) + beta out[i] with the portable kernel of gemm.cl (`kern`, from program
    'gemm:<dtype>'): integer products, and every product where the device has no BLAS."""
    gx, gy = -(-n // _TILE) * _TILE, -(-m // _TILE) * _TILE
    dev.launch_nd(kern, (gx, gy, batch), (_TILE, _TILE, 1),
                  (I64(m), I64(n), I64(k), I64(ba), I64(bb), a.arg, I64(ao), b.arg, I64(bo), c.arg, I64(co),
                   I32(1 if ta else 0), I32(1 if tb else 0), _acc(dev, alpha), _acc(dev, beta)))


# -- pooling ------------------------------------------------------------------------------------------------------

_POOL = struct.Struct("<16q")


def _pool_geometry(name, x_shape, y_shape, kernel, stride, padding, dilation, mode, views):
    g = kernel_checks.PoolGeometry(backend_of(views), name, x_shape, y_shape, kernel, stride, padding, dilation, mode,
                                   views)
    return g, _POOL.pack(*g.as_list())


def _pool2d(out, indices, x, kernel=(2, 2), stride=None, padding=(0, 0, 0, 0), dilation=(1, 1), mode="max",
            count_include_pad=False) -> None:
    views = (out, indices, x)
    dev = out.buffer.device
    if x.dtype not in FLOATS or out.dtype != x.dtype or x.dtype not in dev.dtypes:
        raise _dtype_error("pool2d", views, FLOATS)
    kernel_checks.pool_indices(backend_of(views), views, indices, out)
    x = _contiguous(x)
    g, geom = _pool_geometry("pool2d", x.shape, out.shape, kernel, stride, padding, dilation, mode, views)
    if math.prod(out.shape) == 0:
        return
    ind = indices if indices is not None else out  # any buffer: the kernel does not touch it without with_idx
    rows = out.shape[0] * out.shape[1] * out.shape[2]
    dev.launch(dev.kernel(f"pool:{SUFFIX[x.dtype]}", "sg_pool_fwd"), rows,
               (geom, I32(g.mode_code), I32(1 if count_include_pad else 0), x.buffer.handle.arg, I64(x.offset),
                out.buffer.handle.arg, I64(out.offset), ind.buffer.handle.arg, I64(ind.offset),
                I32(indices is not None)))


def _pool2d_backward(dx, dy, x, indices, kernel=(2, 2), stride=None, padding=(0, 0, 0, 0), dilation=(1, 1),
                     mode="max", count_include_pad=False) -> None:
    views = (dx, dy, x, indices)
    dev = dx.buffer.device
    if dy.dtype not in FLOATS or dx.dtype != dy.dtype or dy.dtype not in dev.dtypes:
        raise _dtype_error("pool2d_backward", views, FLOATS)
    kernel_checks.pool_backward_source(backend_of(views), views, mode, indices, x, dy.dtype)
    dy, x, indices = _contiguous(dy), _contiguous(x), _contiguous(indices)
    g, geom = _pool_geometry("pool2d_backward", dx.shape, dy.shape, kernel, stride, padding, dilation, mode, views)
    if math.prod(dx.shape) == 0:
        return
    xv = x if x is not None else dy
    iv = indices if indices is not None else dy
    args = (geom, I32(g.mode_code), I32(1 if count_include_pad else 0), dy.buffer.handle.arg, I64(dy.offset),
            xv.buffer.handle.arg, I64(xv.offset), iv.buffer.handle.arg, I64(iv.offset), I32(indices is not None),
            dx.buffer.handle.arg, I64(dx.offset))
    prog = f"pool:{SUFFIX[dy.dtype]}"
    if g.disjoint:
        # disjoint windows: each input element has at most one, so its gradient is written from the output's side
        _fill(dx, 0.0)
        dev.launch(dev.kernel(prog, "sg_pool_bwd_disjoint"), dy.shape[0] * dy.shape[1] * dy.shape[2], args)
        return
    dev.launch(dev.kernel(prog, "sg_pool_bwd"), dx.shape[0] * dx.shape[1] * dx.shape[2], args)


# -- batch normalisation ------------------------------------------------------------------------------------------


def _bn_dims(name: str, x, views) -> tuple[int, int, int]:
    return kernel_checks.bn_dims(backend_of(views), name, x, views)


def _float_views(name: str, views: tuple, x) -> None:
    dev = x.buffer.device
    if x.dtype not in FLOATS or any(v.dtype not in FLOATS or v.dtype not in dev.dtypes for v in views):
        raise _dtype_error(name, views, FLOATS)


def _vec_dtype(x) -> int:
    """The dtype of batch normalisation's per-channel vectors (V in batchnorm.cl) for data x."""
    return F64 if x.dtype == F64 else F32


class _Vec:
    """A per-channel vector as contiguous `dtype` (V of batchnorm.cl: float32, or float64 for float64 data; converted
    when it is another dtype); `done()` writes an output back."""

    def __init__(self, v, dtype: int, read: bool = True):
        self.view = v
        self.f = v if v.dtype == dtype and v.strides == _layout(v.shape)[0] else None
        if self.f is None:
            self.f = _new(v.buffer.device, v.shape, dtype)
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
            moved = _new(v.f.buffer.device, v.f.shape, v.f.dtype)
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
    vt = _vec_dtype(x)
    sc, bi, rm, rv = _Vec(scale, vt), _Vec(bias, vt), _Vec(running_mean, vt), _Vec(running_var, vt)
    sm, si = _Vec(saved_mean, vt, read=False), _Vec(saved_invstd, vt, read=False)
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


def _bn_map(name: str, symbol: str, y, x, vectors: tuple, last: Callable[[Any], bytes]) -> None:
    """y = a per-channel affine map of x: kernel `symbol` of batchnorm.cl over every element, given the four
    per-channel `vectors` and a last argument `last(device)`."""
    views = (y, x, *vectors)
    x = _contiguous(x)
    n, c, s = _bn_dims(name, x, views)
    total = n * c * s
    if total == 0:
        return
    dev = x.buffer.device
    # the converted or moved copies stay referenced until the launch is queued: freed earlier, another thread could
    # take and overwrite their memory before the kernel reads it
    vecs = [_Vec(v, _vec_dtype(x)) for v in vectors]
    dev.launch(dev.kernel(f"bn:{SUFFIX[x.dtype]}", symbol), total,
               (I64(total), I64(c), I64(s), x.buffer.handle.arg, I64(x.offset), y.buffer.handle.arg, I64(y.offset),
                *_vec_args(*vecs), last(dev)))


def _batchnorm_infer(y, x, scale, bias, mean, var, eps=1e-5) -> None:
    _float_views("batchnorm_infer", (y, x, scale, bias, mean, var), x)
    _bn_map("batchnorm_infer", "sg_bn_infer", y, x, (scale, bias, mean, var), lambda dev: _acc(dev, eps))


def _batchnorm_apply(y, x, scale, bias, saved_mean, saved_invstd, activation="none") -> None:
    views = (y, x, scale, bias, saved_mean, saved_invstd)
    _float_views("batchnorm_apply", views, x)
    if activation not in ("none", "relu"):
        raise ValueError(f"{backend_of(views)} kernel batchnorm_apply: activation {activation!r}, expected 'none' or "
                         "'relu'")
    relu = I32(1 if activation == "relu" else 0)
    _bn_map("batchnorm_apply", "sg_bn_apply_saved", y, x, (scale, bias, saved_mean, saved_invstd), lambda dev: relu)


def _layer_norm(y, mean, invstd, x, scale=None, bias=None, eps=1e-5) -> None:
    views = (y, mean, invstd, x, scale, bias)
    present = tuple(v for v in views if v is not None)
    _float_views("layer_norm", present, x)
    if any(v.dtype != x.dtype for v in present):
        raise _dtype_error("layer_norm", views, FLOATS)
    rows, cols = kernel_checks.layer_norm_dims(backend_of(present), views)
    if not rows or not cols:
        return
    x = _contiguous(x)
    dev = x.buffer.device
    vt = _vec_dtype(x)
    stats = [_Vec(mean, vt, read=False), _Vec(invstd, vt, read=False)]
    given = [_Vec(v, vt) for v in (scale, bias) if v is not None]
    args = _vec_args(*stats, *given)
    stand_in = x.buffer.handle.arg
    sc = args[2] if scale is not None else stand_in
    bi = args[-1] if bias is not None else stand_in
    kern = dev.kernel(f"bn:{SUFFIX[x.dtype]}", "sg_layer_norm")
    wg = dev.group_size(kern)
    dev.launch(kern, rows * wg,
               (I64(cols), x.buffer.handle.arg, I64(x.offset), y.buffer.handle.arg, I64(y.offset), args[0], args[1],
                sc, bi, I32((scale is not None) | (bias is not None) << 1), _acc(dev, eps),
                wg * _acc_size(dev, F32)))
    for v in stats:
        v.done()


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
    vt = _vec_dtype(x)
    sc, sm, si = _Vec(scale, vt), _Vec(saved_mean, vt), _Vec(saved_invstd, vt)
    ds, db = _Vec(dscale, vt, read=False), _Vec(dbias, vt, read=False)
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
    return kernel_checks.softmax_split(backend_of((x,)), name, x, axis)


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


def _check_indices(dev, idx, count: int, length: int, error: Callable[[int], Exception],
                   lo: int | None = None) -> None:
    """Raise error(value) for the first index of `idx` outside [lo, length) (lo = -length by default: indices may
    count from the end; class labels pass 0). The check kernel lowers a flag to
    the first bad position. A device with `deferred_flag(error)` (CUDA) hands out a flag that it reads back at the
    next synchronisation, as the conformance suite allows an asynchronous device to; otherwise the flag is read back
    at once, so that the error comes from the kernel call that caused it, before any output is touched."""
    if count == 0:
        return

    def value_at(pos: int) -> int:
        return int(dev.read(View(idx.buffer, idx.dtype, (), offset=idx.offset + pos)))

    deferred = getattr(dev, "deferred_flag", None)
    if deferred is not None:
        flag = deferred(lambda pos: error(value_at(pos)))
    else:
        flag = dev.scratch("index-flag", 4)
        dev.fill_bytes(flag.handle, 0, PU32(_INT_MAX), 4)
    dev.launch(dev.kernel(f"index:{SUFFIX[idx.dtype]}", "sg_check_indices"), count,
               (I64(count), I64(-length if lo is None else lo), I64(length), idx.buffer.handle.arg, I64(idx.offset),
                flag.handle.arg))
    if deferred is not None:
        return
    pos = int(dev.read(View(flag, I32_, ())))
    if pos != _INT_MAX:
        raise error(value_at(pos))


def _xent_check(name: str, x, target, views) -> tuple[int, int]:
    dev = x.buffer.device
    for v in (x, target):
        if v.dtype not in dev.dtypes:
            raise _dtype_error(name, views, FLOATS)
    n, c = kernel_checks.xent_dims(backend_of(views), name, x, target, views, FLOATS, (I32_, I64_))
    if target.dtype in (I32_, I64_):
        # class labels never count from the end
        _check_indices(dev, target, n, c, lambda bad: kernel_checks.label_error(backend_of(views), name, views, bad, c),
                       lo=0)
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
    axis, outer, length, inner, count = kernel_checks.gather_dims(backend_of(views), out, x, indices, axis)
    _check_indices(dev, indices, count, length,
                   lambda bad: kernel_checks.index_error(backend_of(views), "gather", views, bad, axis, length))
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
    if indices.dtype not in (I32_, I64_) or updates.dtype != out.dtype or out.dtype not in (F32, F16, I32_, I64_, F64) \
            or out.dtype not in dev.dtypes:
        raise _dtype_error("scatter_add", views, (I32_, I64_))
    indices, updates = _contiguous(indices), _contiguous(updates)
    axis, outer, length, inner, count = kernel_checks.scatter_dims(backend_of(views), out, indices, updates, axis)
    _check_indices(dev, indices, count, length,
                   lambda bad: kernel_checks.index_error(backend_of(views), "scatter_add", views, bad, axis, length))
    if outer * inner * count == 0:
        return
    target = out if out.strides == _layout(out.shape)[0] else _contiguous(out)
    args = (I64(outer), I64(length), I64(inner), I64(count), target.buffer.handle.arg, I64(target.offset),
            indices.buffer.handle.arg, I64(indices.offset), updates.buffer.handle.arg, I64(updates.offset))
    prog = f"scatter:{SUFFIX[out.dtype]}:{SUFFIX[indices.dtype]}"
    atomic = (outer * inner < SCATTER_ATOMIC_BELOW and count > 1 and (out.dtype != I64_ or dev.int64_atomics)
              and out.dtype != F64)  # no float64 atomic add in the common subset
    if atomic:
        dev.launch(dev.kernel(prog, "sg_scatter_atomic"), outer * count * inner, args)
    else:
        dev.launch(dev.kernel(prog, "sg_scatter_cols"), outer * inner, args)
    if target is not out:
        _copy(out, target)


PAD_MAXD = 16
_PADS = struct.Struct(f"<q{3 * PAD_MAXD}q")


def _pad(out, x, pads, mode="constant", value=0.0) -> None:
    views = (out, x)
    dev = out.buffer.device
    if out.dtype != x.dtype or x.dtype not in dev.dtypes:
        raise _dtype_error("pad", views, (x.dtype,))
    x = _contiguous(x)
    nd = len(x.shape)
    pads, expect = kernel_checks.pad_dims(backend_of(views), out, x, pads, mode)
    total = math.prod(expect)
    if total == 0:
        return
    if nd > PAD_MAXD:
        raise _shape_error("pad", views, f"at most {PAD_MAXD} dimensions")
    if math.prod(x.shape) == 0:  # nothing to copy: all constant
        _fill(out, value)
        return
    size = ITEMSIZE[x.dtype]
    fill = [0] * (PAD_MAXD - nd)
    packed = _PADS.pack(nd, *x.shape, *fill, *expect, *fill, *pads[:nd], *fill)
    dev.launch(dev.kernel(f"pad:{size}", "sg_pad"), total,
               (I64(total), packed, I32(kernel_checks.PAD_MODES[mode]),
                struct.pack(_BITS_FMT[size], _element_bits(x.dtype, value)), x.buffer.handle.arg, I64(x.offset),
                out.buffer.handle.arg, I64(out.offset)))


# -- random numbers -----------------------------------------------------------------------------------------------

_Q = struct.Struct("<Q").pack


def _random_out(name: str, out, allowed) -> int:
    dev = out.buffer.device
    if out.dtype not in allowed or out.dtype not in dev.dtypes:
        raise _dtype_error(name, (out,), allowed)
    cs, n = _layout(out.shape)
    return kernel_checks.random_count(backend_of((out,)), name, out, cs, n)


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

_reduce_sum = _make_reduce("reduce_sum")
_reduce_mean = _make_reduce("reduce_mean")
_reduce_max = _make_reduce("reduce_max")
_reduce_min = _make_reduce("reduce_min")
_reduce_prod = _make_reduce("reduce_prod")
_argmax = _make_arg("argmax")
_argmin = _make_arg("argmin")
_softmax = _make_softmax("softmax", 0)
_log_softmax = _make_softmax("log_softmax", 1)
_softmax_backward = _make_softmax_backward("softmax_backward", 0)
_log_softmax_backward = _make_softmax_backward("log_softmax_backward", 1)



def assemble(backend: str, namespace: dict) -> dict[str, Callable]:
    """The kernel table of a GPU backend: the shared kernels above, with the backend's own `_<primitive>`
    functions from `namespace` (its table module's globals: `_matmul`, `_conv2d`...) taking precedence."""
    return kernel_table.assemble(make_elementwise(backend), {**globals(), **namespace})
