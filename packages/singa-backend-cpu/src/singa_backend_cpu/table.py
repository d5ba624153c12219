"""The CPU kernel table: {primitive name: callable} for every name in `singa.primitives.names()`.

Each callable follows singa.primitives' convention, `kernels[name](out_views..., input_views..., **params)`, and calls
C code in `_kernels` with the views' buffer handles (`char *`) and element offsets. Element-wise kernels keep a fast
path for the common case (every operand contiguous with the output's shape): one C call, nothing allocated. Other
layouts have their axes merged where the memory allows, then go to the strided C entry point.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from singa import dtypes, expressions, kernel_args
from singa.backend import View
from singa_backend_cpu.device import ffi, lib

F32, F16, I32, I64, BOOL, F64 = (dtypes.float32, dtypes.float16, dtypes.int32, dtypes.int64, dtypes.bool_,
                                 dtypes.float64)
SUFFIX = {F32: "float32", F16: "float16", I32: "int32", I64: "int64", BOOL: "bool", F64: "float64"}
ITEMSIZE = {dt: dtypes.itemsize(dt) for dt in SUFFIX}
FLOATS = (F32, F16, F64)
_NULL = ffi.NULL

# -- helpers ------------------------------------------------------------------------------------------------------

_layouts = kernel_args.LAYOUTS
_layout = kernel_args.layout
_coalesce = kernel_args.coalesce
_element_bits = kernel_args.element_bits
_out_dtypes = kernel_args.elementwise_out_dtypes
_describe = kernel_args.describe
_STATUS = {1: MemoryError, 2: TypeError, 3: IndexError, 4: ValueError}


def _check(status: int, name: str, views: tuple, detail: str = "") -> None:
    if status:
        args = ", ".join(_describe(v) for v in views)
        kind = {1: "out of memory", 2: "unsupported dtype", 3: "index out of range", 4: "invalid arguments"}[status]
        raise _STATUS[status](f"cpu kernel {name}({args}): {kind}{': ' + detail if detail else ''}")


def _dtype_error(name: str, views: tuple, supported) -> Exception:
    return kernel_args.dtype_error("cpu", name, views, supported)


def _shape_error(name: str, views: tuple, what: str) -> ValueError:
    return kernel_args.shape_error("cpu", name, views, what)


def _run_layout(contig: Callable, strided: Callable, shape: tuple, views: tuple, extra: tuple) -> None:
    """Run an element-wise C kernel over views of any strides (all of `shape`); `extra` are trailing C arguments."""
    n = math.prod(shape)
    if n == 0:
        return
    dims, strides = _coalesce(shape, [v.strides for v in views])
    args = []
    for v in views:
        args += (v.buffer.handle, v.offset)
    if not dims or (len(dims) == 1 and all(s[0] == 1 for s in strides)):
        contig(n, *args, *extra)
        return
    packed = ffi.new("int64_t[]", dims + [s for st in strides for s in st])
    strided(len(dims), packed, *args, *extra)


def _contiguous(v):
    """The view itself when contiguous, else a contiguous copy on the same device (kernels outside the element-wise
    family read plain row-major data; the core normally hands them that already)."""
    if v is None:
        return None
    cs, n = _layout(v.shape)
    if v.strides == cs or n <= 1:
        return v
    copy = View(v.buffer.device.alloc(n * ITEMSIZE[v.dtype]), v.dtype, v.shape)
    _copy(copy, v)
    return copy


_pair = kernel_args.pair
_padding4 = kernel_args.padding4
_split = kernel_args.split


def _norm_axis(axis: int, ndim: int, name: str) -> int:
    return kernel_args.norm_axis(axis, ndim, name, "cpu")


# -- element-wise -------------------------------------------------------------------------------------------------


def _functions(pattern: str, dts) -> list:
    """C entry points indexed by dtype code (None where the dtype is not supported; room for unknown codes)."""
    fns = [None] * 8
    for dt in dts:
        fns[dt] = getattr(lib, pattern.format(SUFFIX[dt]))
    return fns


def _reject(name: str, views: tuple, supported, out_dtypes: list) -> None:
    """Raise the error that explains why the fast checks refused these views."""
    raise kernel_args.elementwise_error("cpu", name, views, supported, out_dtypes)


# Both factories below keep the hot path to a handful of attribute reads, tuple compares and one C call: this is
# what a Python loop of small operations pays per call.


def _make_binary(entry: expressions.Elementwise) -> Callable:
    name, supported = entry.name, entry.kernel_dtypes
    contig = _functions(f"sg_ew_{name}_{{}}_c", supported)
    strided = _functions(f"sg_ew_{name}_{{}}_s", supported)
    out_dtypes = _out_dtypes(entry)
    layouts = _layouts

    def kernel(out, a, b):
        shape = out.shape
        dt = a.dtype
        fn = contig[dt]
        if fn is None or b.dtype != dt or out.dtype != out_dtypes[dt] or a.shape != shape or b.shape != shape:
            _reject(name, (out, a, b), supported, out_dtypes)
        cs, n = layouts.get(shape) or _layout(shape)
        if a.strides == cs and b.strides == cs and out.strides == cs:
            if n:
                fn(n, out.buffer.handle, out.offset, a.buffer.handle, a.offset, b.buffer.handle, b.offset)
            return
        _run_layout(fn, strided[dt], shape, (out, a, b), ())

    def kernel_params(out, a, b, alpha=0.0, beta=0.0):  # entries with params (axpby): big operands, no fast path
        dt = a.dtype
        if contig[dt] is None or b.dtype != dt or out.dtype != out_dtypes[dt] or a.shape != out.shape or \
                b.shape != out.shape:
            _reject(name, (out, a, b), supported, out_dtypes)
        _run_layout(contig[dt], strided[dt], out.shape, (out, a, b), (alpha, beta))

    if entry.takes_params:
        kernel = kernel_params
    kernel.__name__ = name
    return kernel


def _make_unary(entry: expressions.Elementwise) -> Callable:
    name, supported = entry.name, entry.kernel_dtypes
    contig = _functions(f"sg_ew_{name}_{{}}_c", supported)
    strided = _functions(f"sg_ew_{name}_{{}}_s", supported)
    out_dtypes = _out_dtypes(entry)
    layouts = _layouts

    def kernel(out, x, alpha=0.0, beta=0.0):
        shape = out.shape
        dt = x.dtype
        fn = contig[dt]
        if fn is None or out.dtype != out_dtypes[dt] or x.shape != shape:
            _reject(name, (out, x), supported, out_dtypes)
        cs, n = layouts.get(shape) or _layout(shape)
        if x.strides == cs and out.strides == cs:
            if n:
                fn(n, out.buffer.handle, out.offset, x.buffer.handle, x.offset, alpha, beta)
            return
        _run_layout(fn, strided[dt], shape, (out, x), (alpha, beta))

    kernel.__name__ = name
    return kernel


# -- memory: fill, copy, cast, where ------------------------------------------------------------------------------

_FILL_C = {s: getattr(lib, f"sg_fill_{s}_c") for s in (1, 2, 4, 8)}
_FILL_S = {s: getattr(lib, f"sg_fill_{s}_s") for s in (1, 2, 4, 8)}
_COPY_S = {s: getattr(lib, f"sg_copy_{s}_s") for s in (1, 2, 4, 8)}
_COPY_C = {s: getattr(lib, f"sg_copy_{s}_c") for s in (1, 2, 4, 8)}
_WHERE_C = {s: getattr(lib, f"sg_where_{s}_c") for s in (1, 2, 4, 8)}
_WHERE_S = {s: getattr(lib, f"sg_where_{s}_s") for s in (1, 2, 4, 8)}
_CAST_C = {(s, d): getattr(lib, f"sg_cast_{SUFFIX[s]}_{SUFFIX[d]}_c") for s in SUFFIX for d in SUFFIX}
_CAST_S = {(s, d): getattr(lib, f"sg_cast_{SUFFIX[s]}_{SUFFIX[d]}_s") for s in SUFFIX for d in SUFFIX}


def _fill(out, value) -> None:
    size = ITEMSIZE[out.dtype]
    bits = _element_bits(out.dtype, value)
    cs, n = _layout(out.shape)
    if out.strides == cs:
        if n:
            _FILL_C[size](n, out.buffer.handle, out.offset, bits)
        return
    _run_layout(_FILL_C[size], _FILL_S[size], out.shape, (out,), (bits,))


def _copy(out, x) -> None:
    if out.dtype != x.dtype:
        raise _dtype_error("copy", (out, x), (x.dtype,))
    if out.shape != x.shape:
        raise _shape_error("copy", (out, x), "shapes differ")
    cs, n = _layout(out.shape)
    size = ITEMSIZE[x.dtype]
    if out.strides == cs and x.strides == cs:
        if n:
            lib.sg_memcopy(out.buffer.handle, out.offset * size, x.buffer.handle, x.offset * size, n * size)
        return
    _run_layout(_COPY_C[size], _COPY_S[size], out.shape, (out, x), ())


def _cast(out, x) -> None:
    if out.shape != x.shape:
        raise _shape_error("cast", (out, x), "shapes differ")
    if out.dtype == x.dtype:
        _copy(out, x)
        return
    key = (x.dtype, out.dtype)
    if key not in _CAST_C:
        raise _dtype_error("cast", (out, x), tuple(SUFFIX))
    cs, n = _layout(out.shape)
    if out.strides == cs and x.strides == cs:
        if n:
            _CAST_C[key](n, out.buffer.handle, out.offset, x.buffer.handle, x.offset)
        return
    _run_layout(_CAST_C[key], _CAST_S[key], out.shape, (out, x), ())


def _where(out, cond, a, b) -> None:
    if cond.dtype != BOOL or a.dtype != out.dtype or b.dtype != out.dtype:
        raise TypeError(f"cpu kernel where({_describe(out)}, {_describe(cond)}, {_describe(a)}, {_describe(b)}): "
                        "cond must be bool and a, b of the output's dtype")
    shape = out.shape
    if cond.shape != shape or a.shape != shape or b.shape != shape:
        raise _shape_error("where", (out, cond, a, b), "inputs must arrive broadcast to the output's shape")
    size = ITEMSIZE[out.dtype]
    cs, n = _layout(shape)
    if out.strides == cs and cond.strides == cs and a.strides == cs and b.strides == cs:
        if n:
            _WHERE_C[size](n, out.buffer.handle, out.offset, cond.buffer.handle, cond.offset, a.buffer.handle,
                           a.offset, b.buffer.handle, b.offset)
        return
    _run_layout(_WHERE_C[size], _WHERE_S[size], shape, (out, cond, a, b), ())


# -- reductions ---------------------------------------------------------------------------------------------------

_REDUCE_OPS = {"reduce_sum": 0, "reduce_mean": 1, "reduce_max": 2, "reduce_min": 3, "reduce_prod": 4}


def _make_reduce(name: str) -> Callable:
    op = _REDUCE_OPS[name]

    def kernel(out, x, axes=()):
        x = _contiguous(x)
        nd = len(x.shape)
        reduced = {_norm_axis(int(a), nd, name) for a in axes}
        kept = tuple(s for d, s in enumerate(x.shape) if d not in reduced)
        if math.prod(out.shape) != math.prod(kept):
            raise _shape_error(name, (out, x), f"output must hold shape {kept}")
        dims = ffi.new("int64_t[]", list(x.shape) + [1 if d in reduced else 0 for d in range(nd)] or [0])
        status = lib.sg_reduce(op, x.dtype, x.buffer.handle, x.offset, out.dtype, out.buffer.handle, out.offset, nd,
                               dims)
        _check(status, name, (out, x), f"axes {tuple(axes)}" + (" (an empty reduction has no extreme)"
                                                                if status == 4 else ""))

    kernel.__name__ = name
    return kernel


def _make_arg(name: str, want_max: int) -> Callable:
    def kernel(out, x, axis=0):
        x = _contiguous(x)
        if out.dtype != I64:
            raise _dtype_error(name, (out, x), (I64,))
        axis = _norm_axis(int(axis), len(x.shape), name)
        outer, length, inner = _split(x.shape, axis) if x.shape else (1, 1, 1)
        status = lib.sg_argreduce(want_max, x.dtype, x.buffer.handle, x.offset, out.buffer.handle, out.offset, outer,
                                  length, inner)
        _check(status, name, (out, x), f"axis {axis} is empty" if status == 4 else "")

    kernel.__name__ = name
    return kernel


# -- matrix product -----------------------------------------------------------------------------------------------


def _as_batched(shape: tuple) -> tuple[int, int, int]:
    if len(shape) < 2:
        raise ValueError("matrices need at least 2 dimensions")
    return math.prod(shape[:-2]), shape[-2], shape[-1]


def _matmul(out, a, b, trans_a=False, trans_b=False, alpha=1.0, beta=0.0) -> None:
    views = (out, a, b)
    if not (a.dtype == b.dtype == out.dtype):
        raise _dtype_error("matmul", views, FLOATS + (I32, I64))
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
    status = lib.sg_matmul(a.dtype, a.buffer.handle, a.offset, b.buffer.handle, b.offset, out.buffer.handle,
                           out.offset, batch, ba, bb, m, n, ak, 1 if trans_a else 0, 1 if trans_b else 0,
                           alpha, beta)
    _check(status, "matmul", views)


# -- convolution and pooling --------------------------------------------------------------------------------------


def _conv_geometry(name: str, x_shape, w_shape, y_shape, stride, padding, dilation, groups, views) -> object:
    if len(x_shape) != 4 or len(w_shape) != 4 or len(y_shape) != 4:
        raise _shape_error(name, views, "x, w and y must be 4-D (NCHW, KCHW)")
    n, c, h, w = x_shape
    k, cg, kh, kw = w_shape
    groups = int(groups)
    if groups < 1 or c != cg * groups or k % groups or y_shape[:2] != (n, k):
        raise _shape_error(name, views, f"channels do not match with groups={groups}")
    sh, sw = _pair(stride, "stride")
    dh, dw = _pair(dilation, "dilation")
    pt, pl, pb, pr = _padding4(padding)
    return ffi.new("int64_t[]", [n, c, h, w, k, kh, kw, y_shape[2], y_shape[3], sh, sw, pt, pl, pb, pr, dh, dw,
                                 groups])


def _conv2d(out, x, w, b=None, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1) -> None:
    views = (out, x, w, b)
    if x.dtype not in FLOATS or w.dtype != x.dtype or out.dtype != x.dtype or (b is not None and b.dtype != x.dtype):
        raise _dtype_error("conv2d", views, FLOATS)
    x, w, b = _contiguous(x), _contiguous(w), _contiguous(b)
    geom = _conv_geometry("conv2d", x.shape, w.shape, out.shape, stride, padding, dilation, groups, views)
    bh, bo = (b.buffer.handle, b.offset) if b is not None else (_NULL, 0)
    status = lib.sg_conv2d(x.dtype, x.buffer.handle, x.offset, w.buffer.handle, w.offset, bh, bo, out.buffer.handle,
                           out.offset, geom)
    _check(status, "conv2d", views)


def _conv2d_backward_data(dx, dy, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1) -> None:
    views = (dx, dy, w)
    if dy.dtype not in FLOATS or w.dtype != dy.dtype or dx.dtype != dy.dtype:
        raise _dtype_error("conv2d_backward_data", views, FLOATS)
    dy, w = _contiguous(dy), _contiguous(w)
    geom = _conv_geometry("conv2d_backward_data", dx.shape, w.shape, dy.shape, stride, padding, dilation, groups,
                          views)
    status = lib.sg_conv2d_backward_data(dy.dtype, dy.buffer.handle, dy.offset, w.buffer.handle, w.offset,
                                         dx.buffer.handle, dx.offset, geom)
    _check(status, "conv2d_backward_data", views)


def _conv2d_backward_weight(dw, dy, x, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1) -> None:
    views = (dw, dy, x)
    if dy.dtype not in FLOATS or x.dtype != dy.dtype or dw.dtype != dy.dtype:
        raise _dtype_error("conv2d_backward_weight", views, FLOATS)
    dy, x = _contiguous(dy), _contiguous(x)
    geom = _conv_geometry("conv2d_backward_weight", x.shape, dw.shape, dy.shape, stride, padding, dilation, groups,
                          views)
    status = lib.sg_conv2d_backward_weight(dy.dtype, dy.buffer.handle, dy.offset, x.buffer.handle, x.offset,
                                           dw.buffer.handle, dw.offset, geom)
    _check(status, "conv2d_backward_weight", views)


_POOL_MODES = {"max": 0, "avg": 1, "average": 1}


def _pool_geometry(name, x_shape, y_shape, kernel, stride, padding, dilation, mode, views):
    if len(x_shape) != 4 or len(y_shape) != 4 or x_shape[:2] != y_shape[:2]:
        raise _shape_error(name, views, "x and the output must be 4-D NCHW with the same N and C")
    if mode not in _POOL_MODES:
        raise ValueError(f"cpu kernel {name}: mode must be 'max' or 'avg', got {mode!r}")
    kh, kw = _pair(kernel, "kernel")
    sh, sw = _pair(stride if stride is not None else (kh, kw), "stride")
    dh, dw = _pair(dilation, "dilation")
    pt, pl, pb, pr = _padding4(padding)
    n, c, h, w = x_shape
    return ffi.new("int64_t[]", [n, c, h, w, y_shape[2], y_shape[3], kh, kw, sh, sw, pt, pl, pb, pr, dh, dw])


def _pool2d(out, indices, x, kernel=(2, 2), stride=None, padding=(0, 0, 0, 0), dilation=(1, 1), mode="max",
            count_include_pad=False) -> None:
    views = (out, indices, x)
    if x.dtype not in FLOATS or out.dtype != x.dtype:
        raise _dtype_error("pool2d", views, FLOATS)
    if indices is not None and (indices.dtype != I64 or indices.shape != out.shape):
        raise _shape_error("pool2d", views, "indices must be int64 of the output's shape")
    x = _contiguous(x)
    geom = _pool_geometry("pool2d", x.shape, out.shape, kernel, stride, padding, dilation, mode, views)
    ih, io = (indices.buffer.handle, indices.offset) if indices is not None else (_NULL, 0)
    status = lib.sg_pool2d(x.dtype, _POOL_MODES[mode], 1 if count_include_pad else 0, x.buffer.handle, x.offset,
                           out.buffer.handle, out.offset, ih, io, geom)
    _check(status, "pool2d", views)


def _pool2d_backward(dx, dy, x, indices, kernel=(2, 2), stride=None, padding=(0, 0, 0, 0), dilation=(1, 1),
                     mode="max", count_include_pad=False) -> None:
    views = (dx, dy, x, indices)
    if dy.dtype not in FLOATS or dx.dtype != dy.dtype:
        raise _dtype_error("pool2d_backward", views, FLOATS)
    if mode == "max" and indices is None and (x is None or x.dtype != dy.dtype):
        raise _shape_error("pool2d_backward", views, "max pooling needs the forward's indices or its input x")
    dy, x, indices = _contiguous(dy), _contiguous(x), _contiguous(indices)
    geom = _pool_geometry("pool2d_backward", dx.shape, dy.shape, kernel, stride, padding, dilation, mode, views)
    xh, xo = (x.buffer.handle, x.offset) if x is not None else (_NULL, 0)
    ih, io = (indices.buffer.handle, indices.offset) if indices is not None else (_NULL, 0)
    status = lib.sg_pool2d_backward(dy.dtype, _POOL_MODES[mode], 1 if count_include_pad else 0, dy.buffer.handle,
                                    dy.offset, xh, xo, ih, io, dx.buffer.handle, dx.offset, geom)
    _check(status, "pool2d_backward", views)


# -- batch normalisation ------------------------------------------------------------------------------------------


def _bn_dims(name: str, x, views) -> tuple[int, int, int]:
    if len(x.shape) < 2:
        raise _shape_error(name, views, "x must be (N, C) or (N, C, ...)")
    return x.shape[0], x.shape[1], math.prod(x.shape[2:])


def _vec(v) -> tuple:
    """(dtype, handle, offset) of a per-channel vector"""
    v = _contiguous(v)
    return v.dtype, v.buffer.handle, v.offset


def _float_views(name: str, views: tuple, x) -> None:
    if x.dtype not in FLOATS or any(v.dtype not in FLOATS for v in views):
        raise _dtype_error(name, views, FLOATS)


def _batchnorm_train(y, running_mean, running_var, saved_mean, saved_invstd, x, scale, bias, momentum=0.9,
                     eps=1e-5) -> None:
    views = (y, running_mean, running_var, saved_mean, saved_invstd, x, scale, bias)
    _float_views("batchnorm_train", views, x)
    x = _contiguous(x)
    n, c, s = _bn_dims("batchnorm_train", x, views)
    for v in (running_mean, running_var, saved_mean, saved_invstd):
        if v.strides != _layout(v.shape)[0]:
            raise _shape_error("batchnorm_train", views, "statistics outputs must be contiguous")
    status = lib.sg_batchnorm_train(x.dtype, x.buffer.handle, x.offset, y.buffer.handle, y.offset, n, c, s,
                                    *_vec(scale), *_vec(bias), *_vec(running_mean), *_vec(running_var),
                                    *_vec(saved_mean), *_vec(saved_invstd), momentum, eps)
    _check(status, "batchnorm_train", views)


def _batchnorm_infer(y, x, scale, bias, mean, var, eps=1e-5) -> None:
    views = (y, x, scale, bias, mean, var)
    _float_views("batchnorm_infer", views, x)
    x = _contiguous(x)
    n, c, s = _bn_dims("batchnorm_infer", x, views)
    status = lib.sg_batchnorm_infer(x.dtype, x.buffer.handle, x.offset, y.buffer.handle, y.offset, n, c, s,
                                    *_vec(scale), *_vec(bias), *_vec(mean), *_vec(var), eps)
    _check(status, "batchnorm_infer", views)


def _batchnorm_backward(dx, dscale, dbias, dy, x, scale, saved_mean, saved_invstd) -> None:
    views = (dx, dscale, dbias, dy, x, scale, saved_mean, saved_invstd)
    _float_views("batchnorm_backward", views, x)
    if dy.dtype != x.dtype or dx.dtype != x.dtype:
        raise _dtype_error("batchnorm_backward", views, FLOATS)
    x, dy = _contiguous(x), _contiguous(dy)
    n, c, s = _bn_dims("batchnorm_backward", x, views)
    status = lib.sg_batchnorm_backward(x.dtype, dy.buffer.handle, dy.offset, x.buffer.handle, x.offset,
                                       dx.buffer.handle, dx.offset, n, c, s, *_vec(scale), *_vec(saved_mean),
                                       *_vec(saved_invstd), *_vec(dscale), *_vec(dbias))
    _check(status, "batchnorm_backward", views)


# -- softmax and losses -------------------------------------------------------------------------------------------


def _make_softmax(name: str, log: int) -> Callable:
    def kernel(out, x, axis=-1):
        views = (out, x)
        if x.dtype not in FLOATS or out.dtype != x.dtype:
            raise _dtype_error(name, views, FLOATS)
        x = _contiguous(x)
        if not x.shape:  # a 0-d softmax is over one element
            outer, length, inner = 1, 1, 1
        else:
            outer, length, inner = _split(x.shape, _norm_axis(int(axis), len(x.shape), name))
        status = lib.sg_softmax(x.dtype, log, x.buffer.handle, x.offset, out.buffer.handle, out.offset, outer,
                                length, inner)
        _check(status, name, views)

    kernel.__name__ = name
    return kernel


def _make_softmax_backward(name: str, log: int) -> Callable:
    def kernel(dx, dy, y, axis=-1):
        views = (dx, dy, y)
        if dy.dtype not in FLOATS or y.dtype != dy.dtype or dx.dtype != dy.dtype:
            raise _dtype_error(name, views, FLOATS)
        dy, y = _contiguous(dy), _contiguous(y)
        if not y.shape:
            outer, length, inner = 1, 1, 1
        else:
            outer, length, inner = _split(y.shape, _norm_axis(int(axis), len(y.shape), name))
        status = lib.sg_softmax_backward(dy.dtype, log, dy.buffer.handle, dy.offset, y.buffer.handle, y.offset,
                                         dx.buffer.handle, dx.offset, outer, length, inner)
        _check(status, name, views)

    kernel.__name__ = name
    return kernel


def _xent_check(name: str, x, target, views) -> tuple[int, int]:
    if x.dtype not in FLOATS or len(x.shape) != 2:
        raise _shape_error(name, views, "x must be a float (N, C) matrix")
    n, c = x.shape
    if target.dtype in (I32, I64):
        if math.prod(target.shape) != n:
            raise _shape_error(name, views, "integer targets must hold N labels")
    elif target.dtype in FLOATS:
        if tuple(target.shape) != (n, c):
            raise _shape_error(name, views, "probability targets must have x's shape")
    else:
        raise _dtype_error(name, views, (I32, I64) + FLOATS)
    return n, c


def _softmax_cross_entropy(loss, x, target) -> None:
    views = (loss, x, target)
    x, target = _contiguous(x), _contiguous(target)
    n, c = _xent_check("softmax_cross_entropy", x, target, views)
    bad = ffi.new("int64_t *")
    status = lib.sg_softmax_cross_entropy(x.dtype, x.buffer.handle, x.offset, target.dtype, target.buffer.handle,
                                          target.offset, loss.buffer.handle, loss.offset, n, c, bad)
    _check(status, "softmax_cross_entropy", views, f"label {bad[0]} with {c} classes" if status == 3 else "")


def _softmax_cross_entropy_backward(dx, dloss, x, target) -> None:
    views = (dx, dloss, x, target)
    x, target, dloss = _contiguous(x), _contiguous(target), _contiguous(dloss)
    n, c = _xent_check("softmax_cross_entropy_backward", x, target, views)
    if dloss.dtype != x.dtype or dx.dtype != x.dtype:
        raise _dtype_error("softmax_cross_entropy_backward", views, FLOATS)
    bad = ffi.new("int64_t *")
    status = lib.sg_softmax_cross_entropy_backward(x.dtype, dloss.buffer.handle, dloss.offset, x.buffer.handle,
                                                   x.offset, target.dtype, target.buffer.handle, target.offset,
                                                   dx.buffer.handle, dx.offset, n, c, bad)
    _check(status, "softmax_cross_entropy_backward", views,
           f"label {bad[0]} with {c} classes" if status == 3 else "")


# -- indexing -----------------------------------------------------------------------------------------------------


def _gather(out, x, indices, axis=0) -> None:
    views = (out, x, indices)
    if indices.dtype not in (I32, I64) or out.dtype != x.dtype:
        raise _dtype_error("gather", views, (I32, I64))
    x, indices = _contiguous(x), _contiguous(indices)
    axis = _norm_axis(int(axis), len(x.shape), "gather")
    expect = x.shape[:axis] + tuple(indices.shape) + x.shape[axis + 1:]
    if tuple(out.shape) != expect:
        raise _shape_error("gather", views, f"the output must have shape {expect}")
    outer, length, inner = _split(x.shape, axis)
    bad = ffi.new("int64_t *")
    status = lib.sg_gather(ITEMSIZE[x.dtype], x.buffer.handle, x.offset, indices.dtype, indices.buffer.handle,
                           indices.offset, out.buffer.handle, out.offset, outer, length, inner,
                           math.prod(indices.shape), bad)
    _check(status, "gather", views, f"index {bad[0]} on axis {axis} of length {length}" if status == 3 else "")


def _scatter_add(out, indices, updates, axis=0) -> None:
    views = (out, indices, updates)
    if indices.dtype not in (I32, I64) or updates.dtype != out.dtype:
        raise _dtype_error("scatter_add", views, (I32, I64))
    indices, updates = _contiguous(indices), _contiguous(updates)
    axis = _norm_axis(int(axis), len(out.shape), "scatter_add")
    expect = out.shape[:axis] + tuple(indices.shape) + out.shape[axis + 1:]
    if tuple(updates.shape) != expect:
        raise _shape_error("scatter_add", views, f"updates must have shape {expect}")
    outer, length, inner = _split(out.shape, axis)
    bad = ffi.new("int64_t *")
    status = lib.sg_scatter_add(out.dtype, out.buffer.handle, out.offset, indices.dtype, indices.buffer.handle,
                                indices.offset, updates.buffer.handle, updates.offset, outer, length, inner,
                                math.prod(indices.shape), bad)
    _check(status, "scatter_add", views, f"index {bad[0]} on axis {axis} of length {length}" if status == 3 else "")


_PAD_MODES = {"constant": 0, "reflect": 1, "edge": 2}


def _pad(out, x, pads, mode="constant", value=0.0) -> None:
    views = (out, x)
    if out.dtype != x.dtype:
        raise _dtype_error("pad", views, (x.dtype,))
    if mode not in _PAD_MODES:
        raise ValueError(f"cpu kernel pad: mode must be 'constant', 'reflect' or 'edge', got {mode!r}")
    x = _contiguous(x)
    nd = len(x.shape)
    pads = [int(p) for p in pads]
    if len(pads) != 2 * nd or min(pads, default=0) < 0:
        raise _shape_error("pad", views, f"pads must be {2 * nd} non-negative numbers, got {pads}")
    expect = tuple(s + pads[d] + pads[d + nd] for d, s in enumerate(x.shape))
    if tuple(out.shape) != expect:
        raise _shape_error("pad", views, f"the output must have shape {expect}")
    dims = ffi.new("int64_t[]", list(x.shape) + list(out.shape) + pads[:nd] or [0])
    status = lib.sg_pad(ITEMSIZE[x.dtype], _PAD_MODES[mode], x.buffer.handle, x.offset, out.buffer.handle,
                        out.offset, nd, dims, _element_bits(x.dtype, value))
    _check(status, "pad", views, f"mode {mode!r} needs a non-empty input" if status == 4 else "")


# -- random numbers -----------------------------------------------------------------------------------------------

_U64 = (1 << 64) - 1


def _random_out(name: str, out, allowed) -> int:
    if out.dtype not in allowed:
        raise _dtype_error(name, (out,), allowed)
    cs, n = _layout(out.shape)
    if out.strides != cs:
        raise _shape_error(name, (out,), "the output must be contiguous")
    return n


def _random_uniform(out, low=0.0, high=1.0, seed=0, offset=0) -> None:
    n = _random_out("random_uniform", out, FLOATS)
    _check(lib.sg_random_uniform(out.dtype, out.buffer.handle, out.offset, n, low, high, int(seed) & _U64,
                                 int(offset) & _U64), "random_uniform", (out,))


def _random_normal(out, mean=0.0, std=1.0, seed=0, offset=0) -> None:
    n = _random_out("random_normal", out, FLOATS)
    _check(lib.sg_random_normal(out.dtype, out.buffer.handle, out.offset, n, mean, std, int(seed) & _U64,
                                int(offset) & _U64), "random_normal", (out,))


def _random_bernoulli(out, p=0.5, seed=0, offset=0) -> None:
    n = _random_out("random_bernoulli", out, tuple(SUFFIX))
    _check(lib.sg_random_bernoulli(out.dtype, out.buffer.handle, out.offset, n, p, int(seed) & _U64,
                                   int(offset) & _U64), "random_bernoulli", (out,))


def philox_u32(seed: int, offset: int, n: int) -> list[int]:
    """The generator's raw 32-bit draws offset .. offset + n - 1 (for tests and for other backends to compare)."""
    buf = ffi.new("uint32_t[]", max(n, 1))
    lib.sg_philox_u32(int(seed) & _U64, int(offset) & _U64, n, buf)
    return list(buf)[:n]


# -- the table ----------------------------------------------------------------------------------------------------


def build() -> dict[str, Callable]:
    table: dict[str, Callable] = {}
    for entry in expressions.TABLE.values():
        table[entry.name] = _make_unary(entry) if entry.arity == 1 else _make_binary(entry)
    table.update({
        "fill": _fill, "copy": _copy, "cast": _cast, "where": _where,
        **{name: _make_reduce(name) for name in _REDUCE_OPS},
        "argmax": _make_arg("argmax", 1), "argmin": _make_arg("argmin", 0),
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
