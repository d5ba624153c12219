"""The CPU kernel table: {primitive name: callable} for every name in `singa.primitives.names()`.

Each callable follows singa.primitives' convention, `kernels[name](out_views..., input_views..., **params)`, and calls
C code in `_kernels` with the views' buffer handles (`char *`) and element offsets. Element-wise kernels keep a fast
path for the common case (every operand contiguous with the output's shape): one C call, nothing allocated. Other
layouts have their axes merged where the memory allows, then go to the strided C entry point.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

from singa import dtypes, expressions, kernel_args, kernel_checks, kernel_table
from singa.backend import View, channel_split
from singa_backend_cpu import blocked, onednn
from singa_backend_cpu.device import ffi, lib

F32, F16, I32, I64, BOOL, F64 = (dtypes.float32, dtypes.float16, dtypes.int32, dtypes.int64, dtypes.bool_,
                                 dtypes.float64)
SUFFIX = {F32: "float32", F16: "float16", I32: "int32", I64: "int64", BOOL: "bool", F64: "float64"}
ITEMSIZE = {dt: dtypes.itemsize(dt) for dt in SUFFIX}
FLOATS = (F32, F16, F64)
_NULL = ffi.NULL

# -- helpers ------------------------------------------------------------------------------------------------------

_layout = kernel_args.layout
_element_bits = kernel_args.element_bits
_describe = kernel_args.describe
_run_layout = kernel_table.run_layout
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


def _contiguous(v):
    return kernel_table.contiguous(v, _copy)


# -- element-wise -------------------------------------------------------------------------------------------------


def _functions(pattern: str, dts) -> list:
    """C entry points indexed by dtype code (None where the dtype is not supported; room for unknown codes)."""
    fns = [None] * 8
    for dt in dts:
        fns[dt] = getattr(lib, pattern.format(SUFFIX[dt]))
    return fns


def _make_elementwise(entry: expressions.Elementwise) -> Callable:
    supported = entry.kernel_dtypes
    return kernel_table.elementwise_kernel("cpu", entry, _functions(f"sg_ew_{entry.name}_{{}}_c", supported),
                                           _functions(f"sg_ew_{entry.name}_{{}}_s", supported))


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


def _bind_fill(out, value) -> Callable[[], None]:
    """_fill's call as a zero-argument launch for a graph replay (the seed of a backward, a zeroed buffer)."""
    return kernel_table.bind_layout(_FILL_C[ITEMSIZE[out.dtype]], _FILL_S[ITEMSIZE[out.dtype]], out.shape, (out,),
                                    (_element_bits(out.dtype, value),))


_fill.bind = _bind_fill


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


def _bind_copy(out, x):
    """Graph replay's launch of a copy (checked when recorded): one memcpy, or the strided copy kernel."""
    size = ITEMSIZE[x.dtype]
    cs, n = _layout(out.shape)
    if out.strides == cs and x.strides == cs:
        return functools.partial(lib.sg_memcopy, out.buffer.handle, out.offset * size, x.buffer.handle,
                                 x.offset * size, n * size)
    return kernel_table.bind_layout(_COPY_C[size], _COPY_S[size], out.shape, (out, x))


_copy.bind = _bind_copy


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

    def dims_of(out, x, axes):
        nd = len(x.shape)
        reduced, _ = kernel_checks.reduce_axes("cpu", name, out, x, axes)
        return ffi.new("int64_t[]", list(x.shape) + [1 if d in reduced else 0 for d in range(nd)] or [0])

    def fail(status, out, x, axes):
        _check(status, name, (out, x), f"axes {tuple(axes)}" + (" (an empty reduction has no extreme)"
                                                                if status == 4 else ""))

    def kernel(out, x, axes=()):
        x = _contiguous(x)
        status = lib.sg_reduce(op, x.dtype, x.buffer.handle, x.offset, out.dtype, out.buffer.handle, out.offset,
                               len(x.shape), dims_of(out, x, axes))
        if status:
            fail(status, out, x, axes)

    def bind(out, x, axes=()) -> Callable[[], None] | None:
        """kernel's call as a zero-argument launch for a graph replay (None where x needs a contiguous copy)."""
        if x.strides != _layout(x.shape)[0]:
            return None
        args = (op, x.dtype, x.buffer.handle, x.offset, out.dtype, out.buffer.handle, out.offset, len(x.shape),
                dims_of(out, x, axes))
        launch = lib.sg_reduce

        def run() -> None:
            status = launch(*args)
            if status:
                fail(status, out, x, axes)

        return run

    kernel.__name__ = name
    kernel.bind = bind
    return kernel


def _make_arg(name: str, want_max: int) -> Callable:
    def kernel(out, x, axis=0):
        x = _contiguous(x)
        if out.dtype != I64:
            raise _dtype_error(name, (out, x), (I64,))
        axis, outer, length, inner = kernel_checks.arg_split("cpu", name, x, axis)
        status = lib.sg_argreduce(want_max, x.dtype, x.buffer.handle, x.offset, out.buffer.handle, out.offset, outer,
                                  length, inner)
        _check(status, name, (out, x), f"axis {axis} is empty" if status == 4 else "")

    kernel.__name__ = name
    return kernel


# -- matrix product -----------------------------------------------------------------------------------------------


# float32 products: oneDNN's sgemm where it is loaded and SINGA_ONEDNN is not 0 (read once, here), else OpenBLAS
SGEMM = "onednn" if onednn.install_sgemm(lambda address: lib.sg_set_sgemm(ffi.cast("void *", address))) else "openblas"
# our own float32 3x3 stride-1 convolutions by Winograd F(4x4, 3x3) where they fit (kernels/winograd.c), unless
# SINGA_WINOGRAD=0 asks for the direct kernels' rounding
WINOGRAD = os.environ.get("SINGA_WINOGRAD", "1").strip() != "0"
lib.sg_set_winograd(WINOGRAD)


def _matmul(out, a, b, trans_a=False, trans_b=False, alpha=1.0, beta=0.0) -> None:
    views = (out, a, b)
    if not (a.dtype == b.dtype == out.dtype):
        raise _dtype_error("matmul", views, FLOATS + (I32, I64))
    parts = _outer_parts(views, trans_a, trans_b)
    if parts is not None:
        for part in parts:
            _matmul(*part, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
        return
    sa, sb = _matrix_strides(a), _matrix_strides(b)
    if sa is None:
        a = _contiguous(a)
        sa = _matrix_strides(a)
    if sb is None:
        b = _contiguous(b)
        sb = _matrix_strides(b)
    args, key = _matmul_call((out, a, b), sa, sb, trans_a, trans_b, alpha, beta)

    def run(openblas: int) -> None:
        status = lib.sg_matmul(*args, openblas)
        if status:
            _check(status, "matmul", views)

    if key is None:
        run(0)
    else:
        onednn.product(key, run)


_matmul.strided_operands = True  # see _matrix_strides and _outer_parts


def _outer_parts(views: tuple, trans_a, trans_b, may_copy: bool = True) -> list[tuple] | None:
    """A product whose a or b has two batch axes of their own strides (B1, B2, rows, cols): attention's heads of a
    batch of sequences) as B1 products of (B2, rows, cols) operands, [(out, a, b), ...]; None for any other; [] where
    that takes a contiguous copy and not `may_copy` (a bound launch must read the operands themselves)."""
    out, a, b = views
    if not any(len(v.shape) == 4 and v.strides != _layout(v.shape)[0] for v in (a, b)):
        return None
    kernel_checks.matmul_dims("cpu", views, trans_a, trans_b, _layout(out.shape)[0])  # errors name the whole call
    outer, inner = next(v.shape[:2] for v in (a, b) if len(v.shape) == 4 and v.strides != _layout(v.shape)[0])

    def split_alike(v):  # the other operand's batch in (outer, inner) too, or one axis
        if len(v.shape) == 4 and v.shape[:2] != (outer, inner):
            plain = v.strides == _layout(v.shape)[0]
            if not plain and not may_copy:
                return None
            c = v if plain else _contiguous(v)
            return View(c.buffer, c.dtype, (outer * inner,) + c.shape[2:], None, c.offset)
        return v

    a, b = split_alike(a), split_alike(b)
    if a is None or b is None:
        return []
    m, n = out.shape[-2:]

    def part(v, o: int):
        if len(v.shape) == 4:
            return View(v.buffer, v.dtype, v.shape[1:], v.strides[1:], v.offset + o * v.strides[0])
        if v.shape[0] == 1:  # broadcast over the batch
            return v
        return View(v.buffer, v.dtype, (inner,) + v.shape[1:], v.strides, v.offset + o * inner * v.strides[0])

    return [(View(out.buffer, out.dtype, (inner, m, n), None, out.offset + o * inner * m * n), part(a, o), part(b, o))
            for o in range(outer)]


def _matrix_strides(v) -> tuple[int, int] | None:
    """(batch stride, row stride) of a (batch, rows, cols) matmul operand that sg_matmul reads where it lies: float32
    and float64 matrices whose rows are contiguous and do not overlap (attention's heads of a (seq, heads * dim)
    tensor: rows heads * dim apart); other dtypes contiguous only. None where the operand needs a contiguous copy."""
    rows, cols = v.shape[-2:]
    if v.strides == _layout(v.shape)[0]:
        return rows * cols, max(cols, 1)
    if v.dtype not in (F32, F64) or len(v.shape) not in (2, 3):
        return None
    batch, sb = (v.shape[0], v.strides[0]) if len(v.shape) == 3 else (1, 0)
    sr, sc = v.strides[-2:]
    if (sc != 1 and cols > 1) or batch * rows * cols == 0:
        return None
    sr = sr if rows > 1 else max(cols, 1)
    if sr < max(cols, 1) or (batch > 1 and sb < 0):
        return None
    return sb, sr


def _matmul_call(views: tuple, sa: tuple, sb: tuple, trans_a, trans_b, alpha, beta) -> tuple[tuple, tuple | None]:
    """sg_matmul's arguments for (out, a, b) but its last (openblas), out contiguous and a, b read with their
    _matrix_strides `sa`, `sb`, and the shape key by which onednn.product chooses the provider of a float32 product;
    None where there is no choice: oneDNN's sgemm not installed, other dtypes, small products, or beta != 0 (a product
    that accumulates into its output cannot be run twice to time it)."""
    out, a, b = views
    batch, ba, bb, m, n, k = kernel_checks.matmul_dims("cpu", views, trans_a, trans_b, _layout(out.shape)[0])
    args = (a.dtype, a.buffer.handle, a.offset, *sa, b.buffer.handle, b.offset, *sb,
            out.buffer.handle, out.offset, batch, ba, bb, m, n, k, 1 if trans_a else 0, 1 if trans_b else 0, alpha,
            beta)
    if SGEMM != "onednn" or out.dtype != F32 or beta != 0.0 or 2.0 * batch * m * n * k < onednn.PRODUCT_CHOICE_FLOPS:
        return args, None
    return args, (batch, ba, bb, m, n, k, bool(trans_a), bool(trans_b))


def _bind_matmul(out, a, b, trans_a=False, trans_b=False, alpha=1.0, beta=0.0) -> Callable[[], None] | None:
    """_matmul's call as a zero-argument launch for a graph replay (None where an operand needs a contiguous copy)."""
    if out.strides != _layout(out.shape)[0] or not (a.dtype == b.dtype == out.dtype):
        return None
    parts = _outer_parts((out, a, b), trans_a, trans_b, may_copy=False)
    if parts is not None:
        launches = [_bind_matmul(*p, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta) for p in parts]
        if not launches or any(f is None for f in launches):
            return None

        def run_parts() -> None:
            for f in launches:
                f()

        return run_parts
    sa, sb = _matrix_strides(a), _matrix_strides(b)
    if sa is None or sb is None:
        return None
    views = (out, a, b)
    args, key = _matmul_call(views, sa, sb, trans_a, trans_b, alpha, beta)
    return _checked(lib.sg_matmul, args + (0 if key is None else onednn.product_openblas(key),), "matmul", views)


def _checked(launch, args: tuple, name: str, views: tuple) -> Callable[[], None]:
    """A zero-argument call of C entry point `launch` on `args` (a bound launch) that raises kernel `name`'s error,
    naming `views`, when it fails."""
    def run() -> None:
        status = launch(*args)
        if status:
            _check(status, name, views)

    return run


_matmul.bind = _bind_matmul


# -- convolution and pooling --------------------------------------------------------------------------------------


_geometries: dict[tuple, kernel_checks.ConvGeometry] = {}  # checked geometries (a replayed graph meets the same ones)


def _conv_geometry(name: str, x_shape, w_shape, y_shape, stride, padding, dilation, groups, views):
    key = (name, tuple(x_shape), tuple(w_shape), tuple(y_shape), *(v if isinstance(v, int) else tuple(v)
                                                                    for v in (stride, padding, dilation, groups)))
    g = _geometries.get(key)
    if g is None:
        g = kernel_checks.ConvGeometry("cpu", name, x_shape, w_shape, y_shape, stride, padding, dilation, groups,
                                       views)
        if len(_geometries) > 4096:
            _geometries.clear()
        _geometries[key] = g
    return g


def _address(v) -> int:
    """The address of a contiguous view's first element (oneDNN takes plain pointers)."""
    return int(ffi.cast("uintptr_t", v.buffer.handle)) + v.offset * ITEMSIZE[v.dtype]


# float32 convolutions go through onednn.conv, which runs oneDNN where it is installed and wins for the shape, and
# the C kernel (`ours`) otherwise; other dtypes always run the C kernel.


def _conv2d(out, x, w, b=None, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1) -> None:
    _conv_forward("conv2d", out, x, w, b, None, "none", stride, padding, dilation, groups)


def _conv2d_fused(out, x, w, b=None, residual=None, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1,
                  activation="none", blocks=(0, 0)) -> None:
    kernel_checks.conv_fused_args("cpu", out, residual, activation, may_share=True)
    _conv_forward("conv2d_fused", out, x, w, b, residual, activation, stride, padding, dilation, groups, blocks)


def _bind_conv2d(out, x, w, b=None, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    return _bind_conv_forward("conv2d", out, x, w, b, None, "none", stride, padding, dilation, groups, (0, 0),
                              lambda: _conv2d(out, x, w, b, stride, padding, dilation, groups))


def _bind_conv2d_fused(out, x, w, b=None, residual=None, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                       groups=1, activation="none", blocks=(0, 0)):
    return _bind_conv_forward("conv2d_fused", out, x, w, b, residual, activation, stride, padding, dilation, groups,
                              tuple(blocks), lambda: _conv2d_fused(out, x, w, b, residual, stride, padding, dilation,
                                                                   groups, activation, blocks))


def _shares_output(out, residual) -> bool:
    """True where the residual is the output's very view (Device.shares_output_with: a replayed graph plans it so)."""
    return residual is not None and residual.buffer is out.buffer and residual.offset == out.offset


def _new_like(v):
    """A new contiguous view of v's shape and dtype, on v's device."""
    return View(v.buffer.device.alloc(_layout(v.shape)[1] * ITEMSIZE[v.dtype]), v.dtype, v.shape)


def _stash(v):
    """A new contiguous view holding a copy of v's elements."""
    t = _new_like(v)
    _copy(t, v)
    return t


def _bind_conv_forward(name, out, x, w, b, residual, activation, stride, padding, dilation, groups, blocks, slow,
                       dest=None):
    """Graph replay's launch of a forward convolution, worked out once: the oneDNN plan it runs on
    (onednn.bound_conv), or our own kernel with its arguments made; None where the call must go the whole way.
    `dest`: where the post-ops leave the result (default out)."""
    if _shares_output(out, residual) and blocks == (0, 0):
        g = _conv_geometry(name, x.shape, w.shape, out.shape, stride, padding, dilation, groups,
                           (out, x, w, b, residual))
        if onednn.chosen(name, g, b is not None, (True, activation == "relu")) != onednn.BLOCKED:
            # our kernel and oneDNN's NCHW plans add the residual after writing the output: they write a scratch
            # output instead, and the post-op pass leaves act(scratch + residual) where the residual lies
            return _bind_conv_forward(name, _new_like(out), x, w, b, residual, activation, stride, padding,
                                      dilation, groups, blocks, slow, dest=out)
    views = (out, x, w, b, residual)
    if x.dtype not in FLOATS or any(v is not None and (v.dtype != x.dtype or v.strides != _layout(v.shape)[0])
                                    for v in views):
        return None
    if activation not in ("none", "relu") or (activation == "relu" and name != "conv2d_fused"):
        return None
    g = _conv_geometry(name, x.shape, w.shape, out.shape, stride, padding, dilation, groups, views)
    post = (residual is not None, activation == "relu")
    if blocks == (0, 0) and (x.dtype != F32 or onednn.chosen(name, g, b is not None, post) == onednn.OWN):
        return _bind_own_conv(name, g, views, post[1], dest)
    if x.dtype != F32:
        return None
    if blocks != (0, 0):
        launch = blocked.bound(g, out, x, w, b, residual, post[1], blocks)
        if launch is not None:
            return launch
    operands = [v for v in views if v is not None]
    return onednn.bound_conv(name, g, views, [_address(v) for v in operands], slow, weights=w, bias=b is not None,
                             post=post, blocks=blocks, tail=_post_ops(out, residual, post[1], dest))


def _post_ops(out, residual, relu: bool, dest=None) -> Callable[[], None]:
    """conv2d_fused's residual add and ReLU on the written output, into `dest` (default out; it may be the
    residual): a residual and ReLU in one pass of sg_conv2d_post for contiguous float32 and float64, else the add
    and relu kernels."""
    dest = out if dest is None else dest
    if residual is None and not relu and dest is out:
        return lambda: None
    if residual is not None and out.dtype in (F32, F64) and all(v.strides == _layout(v.shape)[0]
                                                                 for v in (out, residual, dest)):
        n = _layout(out.shape)[1]
        args = (out.dtype, dest.buffer.handle, dest.offset, out.buffer.handle, out.offset, residual.buffer.handle,
                residual.offset, n, int(relu))
        post = lib.sg_conv2d_post

        def one_pass() -> None:
            _check(post(*args), "conv2d_fused", (dest, out, residual))

        return one_pass
    add, act = kernels["add"], kernels["relu"]

    def tail() -> None:
        src = out
        if residual is not None:
            add(dest, src, residual)
            src = dest
        if relu:
            act(dest, src)
        elif src is not dest:
            _copy(dest, src)

    return tail


def _bind_own_conv(name, g, views, relu: bool, dest=None):
    """The launch of our own forward convolution kernel on fixed views (as `ours` in _conv_forward); `dest`: see
    _post_ops."""
    out, x, w, b, residual = views
    args = (x.dtype, x.buffer.handle, x.offset, w.buffer.handle, w.offset,
            *((b.buffer.handle, b.offset) if b is not None else (_NULL, 0)), out.buffer.handle, out.offset,
            ffi.new("int64_t[]", g.as_list()))
    conv, tail = lib.sg_conv2d, _post_ops(out, residual, relu, dest)

    def launch() -> None:
        _check(conv(*args), name, views)
        tail()

    return launch


_conv2d.bind = _bind_conv2d
_conv2d_fused.bind = _bind_conv2d_fused


def _conv_forward(name, out, x, w, b, residual, activation, stride, padding, dilation, groups, blocks=(0, 0)) -> None:
    """conv2d, and conv2d_fused: oneDNN adds the residual and applies ReLU as post-ops of the convolution (one pass
    over the output); our own kernel runs them as the add and relu kernels after it. `blocks`: see _conv_blocked."""
    views = (out, x, w, b, residual)
    if (x.dtype not in FLOATS or w.dtype != x.dtype or out.dtype != x.dtype
            or any(v is not None and v.dtype != x.dtype for v in (b, residual))):
        raise _dtype_error(name, views, FLOATS)
    x, w, b, residual = _contiguous(x), _contiguous(w), _contiguous(b), _contiguous(residual)
    g = _conv_geometry(name, x.shape, w.shape, out.shape, stride, padding, dilation, groups, views)
    relu = activation == "relu"
    if blocks != (0, 0):
        _conv_blocked(name, out, x, w, b, residual, activation, g, views, tuple(blocks))
        return
    if _shares_output(out, residual):  # oneDNN's sum post-op could take it there, but ours and the NCHW plans cannot
        residual = _stash(residual)
    tail = _post_ops(out, residual, relu)

    def ours() -> None:
        bh, bo = (b.buffer.handle, b.offset) if b is not None else (_NULL, 0)
        status = lib.sg_conv2d(x.dtype, x.buffer.handle, x.offset, w.buffer.handle, w.offset, bh, bo,
                               out.buffer.handle, out.offset, ffi.new("int64_t[]", g.as_list()))
        _check(status, name, views)
        tail()

    if x.dtype != F32 or out.strides != _layout(out.shape)[0]:
        ours()
        return
    operands = [v for v in (out, x, w, b, residual) if v is not None]
    onednn.conv(name, g, views, [_address(v) for v in operands], ours, weights=w, bias=b is not None,
                post=(residual is not None, relu), tail=tail)


def _conv_blocked(name, out, x, w, b, residual, activation, g, views, blocks) -> None:
    """conv2d_fused with x (blocks[0]) and out with the residual (blocks[1]) in channel blocks of
    onednn.channel_block(): oneDNN reads and writes them where they lie; where it cannot run the shape, the operands
    are converted to NCHW and back around the NCHW path (backend.channel_split views, the copy kernel)."""
    block = onednn.channel_block()
    if (block == 0 or out.strides != _layout(out.shape)[0] or any(v not in (0, block) for v in blocks)
            or (blocks[0] and g.C % block) or (blocks[1] and g.K % block)):
        raise _shape_error(name, views, f"blocks {blocks}: each must be 0 or this device's channel block "
                                        f"{block or '(none: oneDNN is not in use)'}, dividing the channels")
    if x.dtype == F32:
        if blocked.conv_blocked(g, out, x, w, b, residual, activation == "relu", blocks):
            return
        operands = [v for v in (out, x, w, b, residual) if v is not None]
        if onednn.conv_blocked(name, g, views, [_address(v) for v in operands], blocks, weights=w,
                               bias=b is not None, post=(residual is not None, activation == "relu")):
            return
    bx, by = blocks
    xp = _unblocked(x, bx) if bx else x
    rp = _unblocked(residual, by) if by and residual is not None else residual
    op = _unblocked(out, by, fill=False) if by else out
    _conv_forward(name, op, xp, w, b, rp, activation, (g.sh, g.sw), (g.pt, g.pl, g.pb, g.pr), (g.dh, g.dw), g.G)
    if by:
        _copy(channel_split(out, by, True), channel_split(op, by, False))


def _unblocked(v, block: int, fill: bool = True):
    """A new NCHW view of v's shape; with `fill`, holding v's elements, which are in channel blocks of `block`."""
    t = _new_like(v)
    if fill:
        _copy(channel_split(t, block, False), channel_split(v, block, True))
    return t


def _conv2d_backward_data(dx, dy, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1) -> None:
    views = (dx, dy, w)
    if dy.dtype not in FLOATS or w.dtype != dy.dtype or dx.dtype != dy.dtype:
        raise _dtype_error("conv2d_backward_data", views, FLOATS)
    dy, w = _contiguous(dy), _contiguous(w)
    g = _conv_geometry("conv2d_backward_data", dx.shape, w.shape, dy.shape, stride, padding, dilation, groups, views)

    def ours() -> None:
        status = lib.sg_conv2d_backward_data(dy.dtype, dy.buffer.handle, dy.offset, w.buffer.handle, w.offset,
                                             dx.buffer.handle, dx.offset, ffi.new("int64_t[]", g.as_list()))
        _check(status, "conv2d_backward_data", views)

    if dy.dtype != F32 or dx.strides != _layout(dx.shape)[0]:
        ours()
        return
    onednn.conv("conv2d_backward_data", g, views, [_address(v) for v in (dx, dy, w)], ours)


def _conv2d_backward_weight(dw, dy, x, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1) -> None:
    views = (dw, dy, x)
    if dy.dtype not in FLOATS or x.dtype != dy.dtype or dw.dtype != dy.dtype:
        raise _dtype_error("conv2d_backward_weight", views, FLOATS)
    dy, x = _contiguous(dy), _contiguous(x)
    g = _conv_geometry("conv2d_backward_weight", x.shape, dw.shape, dy.shape, stride, padding, dilation, groups,
                       views)

    def ours() -> None:
        status = lib.sg_conv2d_backward_weight(dy.dtype, dy.buffer.handle, dy.offset, x.buffer.handle, x.offset,
                                               dw.buffer.handle, dw.offset, ffi.new("int64_t[]", g.as_list()))
        _check(status, "conv2d_backward_weight", views)

    if dy.dtype != F32 or dw.strides != _layout(dw.shape)[0]:
        ours()
        return
    onednn.conv("conv2d_backward_weight", g, views, [_address(v) for v in (dw, dy, x)], ours)


def _pool_geometry(name, x_shape, y_shape, kernel, stride, padding, dilation, mode, views):
    g = kernel_checks.PoolGeometry("cpu", name, x_shape, y_shape, kernel, stride, padding, dilation, mode, views)
    return g.mode_code, ffi.new("int64_t[]", g.as_list())


def _pool2d(out, indices, x, kernel=(2, 2), stride=None, padding=(0, 0, 0, 0), dilation=(1, 1), mode="max",
            count_include_pad=False, blocks=0) -> None:
    views = (out, indices, x)
    if x.dtype not in FLOATS or out.dtype != x.dtype:
        raise _dtype_error("pool2d", views, FLOATS)
    kernel_checks.pool_indices("cpu", views, indices, out)
    x = _contiguous(x)
    code, geom = _pool_geometry("pool2d", x.shape, out.shape, kernel, stride, padding, dilation, mode, views)
    args = (kernel, stride or kernel, padding, dilation, mode, count_include_pad)
    if blocks:
        block = onednn.channel_block()
        if (blocks != block or indices is not None or out.strides != _layout(out.shape)[0]
                or x.shape[1] % block):
            raise _shape_error("pool2d", views, f"blocks {blocks}: must be this device's channel block "
                                                f"{block or '(none: oneDNN is not in use)'}, dividing the channels, "
                                                "without indices")
        if x.dtype == F32 and onednn.pool(views, x.shape, out.shape, _address(x), _address(out), block, *args):
            return
        op = _unblocked(out, block, fill=False)
        _pool2d(op, None, _unblocked(x, block), *args)
        _copy(channel_split(out, block, True), channel_split(op, block, False))
        return
    if (_nchw_pool_on_onednn(mode, indices, x) and out.strides == _layout(out.shape)[0]
            and onednn.pool(views, x.shape, out.shape, _address(x), _address(out), 0, *args)):
        return
    ih, io = (indices.buffer.handle, indices.offset) if indices is not None else (_NULL, 0)
    status = lib.sg_pool2d(x.dtype, code, 1 if count_include_pad else 0, x.buffer.handle, x.offset,
                           out.buffer.handle, out.offset, ih, io, geom)
    _check(status, "pool2d", views)


def _nchw_pool_on_onednn(mode: str, indices, x) -> bool:
    """An NCHW pooling oneDNN may run: float32 averages (our max pooling keeps its NaN and signed-zero rules)."""
    return mode == "avg" and indices is None and x.dtype == F32


def _bind_pool2d(out, indices, x, kernel=(2, 2), stride=None, padding=(0, 0, 0, 0), dilation=(1, 1), mode="max",
                 count_include_pad=False, blocks=0):
    """Graph replay's launch of a pooling: the oneDNN plan the recording ran (onednn.bound_pool: channel blocks, and
    float32 NCHW average pooling), or our own kernel with its arguments made; None where the call must go the whole
    way."""
    views = (out, indices, x)
    if x.dtype not in FLOATS or any(v is not None and v.strides != _layout(v.shape)[0] for v in views):
        return None

    def slow() -> None:
        _pool2d(out, indices, x, kernel, stride, padding, dilation, mode, count_include_pad, blocks)

    if blocks and x.dtype != F32:
        return None
    if blocks or _nchw_pool_on_onednn(mode, indices, x):  # the plan the recording ran, if any
        bound = onednn.bound_pool(views, x.shape, out.shape, _address(x), _address(out), blocks, kernel,
                                  stride or kernel, padding, dilation, mode, count_include_pad, slow)
        if bound is not None or blocks:
            return bound
    code, geom = _pool_geometry("pool2d", x.shape, out.shape, kernel, stride, padding, dilation, mode, views)
    args = (x.dtype, code, 1 if count_include_pad else 0, x.buffer.handle, x.offset, out.buffer.handle, out.offset,
            *((indices.buffer.handle, indices.offset) if indices is not None else (_NULL, 0)), geom)
    pool = lib.sg_pool2d

    def launch() -> None:
        _check(pool(*args), "pool2d", views)

    return launch


_pool2d.bind = _bind_pool2d


def _pool2d_backward(dx, dy, x, indices, kernel=(2, 2), stride=None, padding=(0, 0, 0, 0), dilation=(1, 1),
                     mode="max", count_include_pad=False) -> None:
    views = (dx, dy, x, indices)
    if dy.dtype not in FLOATS or dx.dtype != dy.dtype:
        raise _dtype_error("pool2d_backward", views, FLOATS)
    kernel_checks.pool_backward_source("cpu", views, mode, indices, x, dy.dtype)
    dy, x, indices = _contiguous(dy), _contiguous(x), _contiguous(indices)
    code, geom = _pool_geometry("pool2d_backward", dx.shape, dy.shape, kernel, stride, padding, dilation, mode, views)
    xh, xo = (x.buffer.handle, x.offset) if x is not None else (_NULL, 0)
    ih, io = (indices.buffer.handle, indices.offset) if indices is not None else (_NULL, 0)
    status = lib.sg_pool2d_backward(dy.dtype, code, 1 if count_include_pad else 0, dy.buffer.handle,
                                    dy.offset, xh, xo, ih, io, dx.buffer.handle, dx.offset, geom)
    _check(status, "pool2d_backward", views)


# -- batch normalisation ------------------------------------------------------------------------------------------


def _bn_dims(name: str, x, views) -> tuple[int, int, int]:
    return kernel_checks.bn_dims("cpu", name, x, views)


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


def _batchnorm_apply(y, x, scale, bias, saved_mean, saved_invstd, activation="none") -> None:
    views = (y, x, scale, bias, saved_mean, saved_invstd)
    _float_views("batchnorm_apply", views, x)
    if activation not in ("none", "relu"):
        raise ValueError(f"cpu kernel batchnorm_apply: activation {activation!r}, expected 'none' or 'relu'")
    x = _contiguous(x)
    n, c, s = _bn_dims("batchnorm_apply", x, views)
    status = lib.sg_batchnorm_apply(x.dtype, x.buffer.handle, x.offset, y.buffer.handle, y.offset, n, c, s,
                                    *_vec(scale), *_vec(bias), *_vec(saved_mean), *_vec(saved_invstd),
                                    1 if activation == "relu" else 0)
    _check(status, "batchnorm_apply", views)


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


def _layer_norm(y, mean, invstd, x, scale=None, bias=None, eps=1e-5) -> None:
    s, b = (None if v is None else _contiguous(v) for v in (scale, bias))
    _layer_norm_launch((y, mean, invstd, x, scale, bias), y, mean, invstd, _contiguous(x), s, b, eps)()


def _bind_layer_norm(y, mean, invstd, x, scale=None, bias=None, eps=1e-5) -> Callable[[], None] | None:
    """The normalisation as a zero-argument launch for a graph replay (None where an input needs a contiguous copy:
    the kernel makes it at each call)."""
    views = (y, mean, invstd, x, scale, bias)
    if any(v is not None and v.strides != _layout(v.shape)[0] for v in views):
        return None
    return _layer_norm_launch(views, *views, eps)


def _layer_norm_launch(views: tuple, y, mean, invstd, x, s, b, eps) -> Callable[[], None]:
    """sg_layer_norm on contiguous x, s, b as a zero-argument launch; errors name the caller's `views`."""
    present = [v for v in views if v is not None]
    if x.dtype not in FLOATS or any(v.dtype != x.dtype for v in present):
        raise _dtype_error("layer_norm", views, FLOATS)
    rows, cols = kernel_checks.layer_norm_dims("cpu", views)
    args = (x.dtype, x.buffer.handle, x.offset, y.buffer.handle, y.offset, mean.buffer.handle, mean.offset,
            invstd.buffer.handle, invstd.offset, ffi.NULL if s is None else s.buffer.handle,
            0 if s is None else s.offset, ffi.NULL if b is None else b.buffer.handle, 0 if b is None else b.offset,
            rows, cols, eps)
    return _checked(lib.sg_layer_norm, args, "layer_norm", views)


_layer_norm.bind = _bind_layer_norm


# -- softmax and losses -------------------------------------------------------------------------------------------


def _make_softmax(name: str, log: int) -> Callable:
    def launch(views: tuple, out, x, axis) -> Callable[[], None]:
        """sg_softmax on contiguous x as a zero-argument launch; errors name the caller's `views`."""
        if x.dtype not in FLOATS or out.dtype != x.dtype:
            raise _dtype_error(name, views, FLOATS)
        outer, length, inner = kernel_checks.softmax_split("cpu", name, x, axis)
        args = (x.dtype, log, x.buffer.handle, x.offset, out.buffer.handle, out.offset, outer, length, inner)
        return _checked(lib.sg_softmax, args, name, views)

    def kernel(out, x, axis=-1):
        launch((out, x), out, _contiguous(x), axis)()

    def bind(out, x, axis=-1) -> Callable[[], None] | None:
        if x.strides != _layout(x.shape)[0]:
            return None
        return launch((out, x), out, x, axis)

    kernel.__name__ = name
    kernel.bind = bind
    return kernel


def _make_softmax_backward(name: str, log: int) -> Callable:
    def launch(views: tuple, dx, dy, y, axis) -> Callable[[], None]:
        """sg_softmax_backward on contiguous dy and y as a zero-argument launch."""
        if dy.dtype not in FLOATS or y.dtype != dy.dtype or dx.dtype != dy.dtype:
            raise _dtype_error(name, views, FLOATS)
        outer, length, inner = kernel_checks.softmax_split("cpu", name, y, axis)
        args = (dy.dtype, log, dy.buffer.handle, dy.offset, y.buffer.handle, y.offset, dx.buffer.handle, dx.offset,
                outer, length, inner)
        return _checked(lib.sg_softmax_backward, args, name, views)

    def kernel(dx, dy, y, axis=-1):
        launch((dx, dy, y), dx, _contiguous(dy), _contiguous(y), axis)()

    def bind(dx, dy, y, axis=-1) -> Callable[[], None] | None:
        if any(v.strides != _layout(v.shape)[0] for v in (dy, y)):
            return None
        return launch((dx, dy, y), dx, dy, y, axis)

    kernel.__name__ = name
    kernel.bind = bind
    return kernel


def _xent_check(name: str, x, target, views) -> tuple[int, int]:
    return kernel_checks.xent_dims("cpu", name, x, target, views, FLOATS, (I32, I64))


def _softmax_cross_entropy(loss, x, target) -> None:
    _xent_loss_launch((loss, x, target), loss, _contiguous(x), _contiguous(target))()


def _softmax_cross_entropy_backward(dx, dloss, x, target) -> None:
    _xent_grad_launch((dx, dloss, x, target), dx, _contiguous(dloss), _contiguous(x), _contiguous(target))()


def _bind_softmax_cross_entropy(loss, x, target) -> Callable[[], None] | None:
    """The loss as a zero-argument launch for a graph replay (None where an input needs a contiguous copy)."""
    if any(v.strides != _layout(v.shape)[0] for v in (loss, x, target)):
        return None
    return _xent_loss_launch((loss, x, target), loss, x, target)


def _bind_softmax_cross_entropy_backward(dx, dloss, x, target) -> Callable[[], None] | None:
    if any(v.strides != _layout(v.shape)[0] for v in (dx, dloss, x, target)):
        return None
    return _xent_grad_launch((dx, dloss, x, target), dx, dloss, x, target)


def _xent_loss_launch(views: tuple, loss, x, target) -> Callable[[], None]:
    """The loss of contiguous x and target as a zero-argument launch (the kernel's call, or a replay's); errors name
    the caller's `views`."""
    n, c = _xent_check("softmax_cross_entropy", x, target, views)
    return _bound_xent(lib.sg_softmax_cross_entropy, "softmax_cross_entropy", views, c,
                       (x.dtype, x.buffer.handle, x.offset, target.dtype, target.buffer.handle, target.offset,
                        loss.buffer.handle, loss.offset, n, c))


def _xent_grad_launch(views: tuple, dx, dloss, x, target) -> Callable[[], None]:
    """The loss's gradient of contiguous dloss, x and target as a zero-argument launch (as _xent_loss_launch)."""
    n, c = _xent_check("softmax_cross_entropy_backward", x, target, views)
    if dloss.dtype != x.dtype or dx.dtype != x.dtype:
        raise _dtype_error("softmax_cross_entropy_backward", views, FLOATS)
    return _bound_xent(lib.sg_softmax_cross_entropy_backward, "softmax_cross_entropy_backward", views, c,
                       (x.dtype, dloss.buffer.handle, dloss.offset, x.buffer.handle, x.offset, target.dtype,
                        target.buffer.handle, target.offset, dx.buffer.handle, dx.offset, n, c))


def _bound_xent(launch, name: str, views: tuple, classes: int, args: tuple) -> Callable[[], None]:
    bad = ffi.new("int64_t *")
    args = args + (bad,)

    def run() -> None:
        status = launch(*args)
        if status:
            _check(status, name, views, f"label {bad[0]} with {classes} classes" if status == 3 else "")

    return run


_softmax_cross_entropy.bind = _bind_softmax_cross_entropy
_softmax_cross_entropy_backward.bind = _bind_softmax_cross_entropy_backward


# -- indexing -----------------------------------------------------------------------------------------------------


def _gather(out, x, indices, axis=0) -> None:
    _gather_launch((out, x, indices), out, _contiguous(x), _contiguous(indices), axis)()


def _bind_gather(out, x, indices, axis=0) -> Callable[[], None] | None:
    """The gather as a zero-argument launch for a graph replay (an embedding lookup: ~50 us of per-call Python
    before); None where an operand needs a contiguous copy (the kernel makes it at each call). The indices are
    checked at each launch, as they may change between replays."""
    views = (out, x, indices)
    if any(v.strides != _layout(v.shape)[0] for v in views):
        return None
    return _gather_launch(views, *views, axis)


def _gather_launch(views: tuple, out, x, indices, axis) -> Callable[[], None]:
    """sg_gather on contiguous x and indices as a zero-argument launch; errors name the caller's `views`."""
    if indices.dtype not in (I32, I64) or out.dtype != x.dtype:
        raise _dtype_error("gather", views, (I32, I64))
    axis, outer, length, inner, count = kernel_checks.gather_dims("cpu", out, x, indices, axis)
    bad = ffi.new("int64_t *")
    args = (ITEMSIZE[x.dtype], x.buffer.handle, x.offset, indices.dtype, indices.buffer.handle, indices.offset,
            out.buffer.handle, out.offset, outer, length, inner, count, bad)
    gather = lib.sg_gather

    def run() -> None:
        status = gather(*args)
        if status:
            _check(status, "gather", views, f"index {bad[0]} on axis {axis} of length {length}" if status == 3 else "")

    return run


_gather.bind = _bind_gather


def _scatter_add(out, indices, updates, axis=0) -> None:
    views = (out, indices, updates)
    if indices.dtype not in (I32, I64) or updates.dtype != out.dtype:
        raise _dtype_error("scatter_add", views, (I32, I64))
    indices, updates = _contiguous(indices), _contiguous(updates)
    axis, outer, length, inner, count = kernel_checks.scatter_dims("cpu", out, indices, updates, axis)
    bad = ffi.new("int64_t *")
    status = lib.sg_scatter_add(out.dtype, out.buffer.handle, out.offset, indices.dtype, indices.buffer.handle,
                                indices.offset, updates.buffer.handle, updates.offset, outer, length, inner, count,
                                bad)
    _check(status, "scatter_add", views, f"index {bad[0]} on axis {axis} of length {length}" if status == 3 else "")


def _pad(out, x, pads, mode="constant", value=0.0) -> None:
    views = (out, x)
    if out.dtype != x.dtype:
        raise _dtype_error("pad", views, (x.dtype,))
    x = _contiguous(x)
    pads, _ = kernel_checks.pad_dims("cpu", out, x, pads, mode)
    nd = len(x.shape)
    dims = ffi.new("int64_t[]", list(x.shape) + list(out.shape) + pads[:nd] or [0])
    status = lib.sg_pad(ITEMSIZE[x.dtype], kernel_checks.PAD_MODES[mode], x.buffer.handle, x.offset, out.buffer.handle,
                        out.offset, nd, dims, _element_bits(x.dtype, value))
    _check(status, "pad", views, f"mode {mode!r} needs a non-empty input" if status == 4 else "")


# -- optimizer updates --------------------------------------------------------------------------------------------

_SGD_DTYPES = (F32, F64)


def _sgd_momentum(w, buf, g, lr=0.0, momentum=0.0) -> None:
    n = kernel_checks.sgd_args("cpu", w, buf, g, _SGD_DTYPES)
    if n:
        lib.sg_sgd_momentum(w.dtype, w.buffer.handle, w.offset, buf.buffer.handle, buf.offset, g.buffer.handle,
                            g.offset, n, float(lr), float(momentum))


def _bind_sgd_momentum(w, buf, g, lr=0.0, momentum=0.0) -> Callable[[], None]:
    """The update as a zero-argument launch for a graph replay (the views were checked when it was recorded)."""
    n = kernel_checks.sgd_args("cpu", w, buf, g, _SGD_DTYPES)
    return functools.partial(lib.sg_sgd_momentum, w.dtype, w.buffer.handle, w.offset, buf.buffer.handle, buf.offset,
                             g.buffer.handle, g.offset, n, float(lr), float(momentum))


_sgd_momentum.bind = _bind_sgd_momentum


# -- random numbers -----------------------------------------------------------------------------------------------

_U64 = (1 << 64) - 1


def _random_out(name: str, out, allowed) -> int:
    if out.dtype not in allowed:
        raise _dtype_error(name, (out,), allowed)
    cs, n = _layout(out.shape)
    return kernel_checks.random_count("cpu", name, out, cs, n)


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

_reduce_sum = _make_reduce("reduce_sum")
_reduce_mean = _make_reduce("reduce_mean")
_reduce_max = _make_reduce("reduce_max")
_reduce_min = _make_reduce("reduce_min")
_reduce_prod = _make_reduce("reduce_prod")
_argmax = _make_arg("argmax", 1)
_argmin = _make_arg("argmin", 0)
_softmax = _make_softmax("softmax", 0)
_log_softmax = _make_softmax("log_softmax", 1)
_softmax_backward = _make_softmax_backward("softmax_backward", 0)
_log_softmax_backward = _make_softmax_backward("log_softmax_backward", 1)

kernels: dict[str, Callable] = kernel_table.assemble(_make_elementwise, globals())
