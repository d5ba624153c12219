"""The argument checks of the hand-written primitives, once for every backend.

Each function validates the views and parameters one primitive receives (see `singa.primitives`) and returns what a
kernel needs to run it: the sizes of a matrix product, a convolution's or a pooling's geometry, the (outer, length,
inner) split of an axis... A backend's table calls the check, then launches its own kernel; the error messages name
the backend, the kernel and its views (`kernel_args.describe`) and say what is wrong, identically on every backend.
`backend` arguments are the backend's name (`cpu`, `opencl`, `cuda`).

Dtype checks stay with the backends (each knows which dtypes its kernels take); everything about shapes and
parameters is here.
"""

from __future__ import annotations

import math

from singa import dtypes
from singa.backend import is_contiguous
from singa.kernel_args import describe, dtype_error, norm_axis, padding4, pair, shape_error, split

# -- matrix product -----------------------------------------------------------------------------------------------


def _batched(shape: tuple) -> tuple[int, int, int]:
    if len(shape) < 2:
        raise ValueError("matrices need at least 2 dimensions")
    return math.prod(shape[:-2]), shape[-2], shape[-1]


_MATMUL_DIMS: dict = {}  # what matmul_dims returned for a key of everything it reads (a model repeats its products)


def matmul_dims(backend: str, views: tuple, trans_a, trans_b, out_strides: tuple) -> tuple[int, int, int, int, int,
                                                                                             int]:
    """(batch, ba, bb, m, n, k) of matmul(out, a, b): a is (ba, m, k) (or (ba, k, m) transposed), b (bb, k, n), out
    (batch, m, n) with ba, bb in {1, batch}; `out_strides` are the contiguous strides out must have."""
    out, a, b = views
    key = (a.shape, b.shape, out.shape, out.strides, bool(trans_a), bool(trans_b), out_strides)
    dims = _MATMUL_DIMS.get(key)
    if dims is None:
        dims = _matmul_dims(backend, views, trans_a, trans_b, out_strides)
        if len(_MATMUL_DIMS) >= 4096:
            _MATMUL_DIMS.clear()
        _MATMUL_DIMS[key] = dims
    return dims


def _matmul_dims(backend: str, views: tuple, trans_a, trans_b, out_strides: tuple) -> tuple:
    out, a, b = views
    try:
        ba, ar, ac = _batched(a.shape)
        bb, br, bc = _batched(b.shape)
        batch, m, n = _batched(out.shape)
    except ValueError as exc:
        raise shape_error(backend, "matmul", views, str(exc)) from None
    am, ak = (ac, ar) if trans_a else (ar, ac)
    bk, bn = (bc, br) if trans_b else (br, bc)
    if am != m or bn != n or ak != bk or ba not in (1, batch) or bb not in (1, batch):
        raise shape_error(backend, "matmul", views, f"shapes do not match for trans_a={bool(trans_a)}, "
                                                    f"trans_b={bool(trans_b)}")
    if out.strides != out_strides:
        raise shape_error(backend, "matmul", views, "the output must be contiguous")
    return batch, ba, bb, m, n, ak


# -- convolution and pooling --------------------------------------------------------------------------------------


class ConvGeometry:
    """The sizes of a 2-D convolution: x (N, C, H, W), w (K, C/G, kh, kw), y (N, K, OH, OW), with stride (sh, sw),
    dilation (dh, dw), padding (pt, pl, pb, pr) and G groups; plus derived sizes the kernels use."""

    def __init__(self, backend: str, name: str, x_shape, w_shape, y_shape, stride, padding, dilation, groups,
                 views: tuple):
        if len(x_shape) != 4 or len(w_shape) != 4 or len(y_shape) != 4:
            raise shape_error(backend, name, views, "x, w and y must be 4-D (NCHW, KCHW)")
        self.N, self.C, self.H, self.W = x_shape
        self.K, cg, self.kh, self.kw = w_shape
        self.G = int(groups)
        if self.G < 1 or cg * self.G != self.C or self.K % self.G or tuple(y_shape[:2]) != (self.N, self.K):
            raise shape_error(backend, name, views, f"channels do not match with groups={self.G}")
        self.sh, self.sw = pair(stride, "stride")
        self.dh, self.dw = pair(dilation, "dilation")
        if min(self.sh, self.sw, self.dh, self.dw) < 1:
            raise shape_error(backend, name, views, "stride and dilation must be at least 1")
        self.pt, self.pl, self.pb, self.pr = padding4(padding)
        if min(self.pt, self.pl, self.pb, self.pr) < 0:
            raise shape_error(backend, name, views, "padding must not be negative")
        self.OH, self.OW = y_shape[2], y_shape[3]
        self.Cg, self.Kg = cg, self.K // self.G
        self.ckk = cg * self.kh * self.kw  # one group's unfolded rows
        self.rows = self.C * self.kh * self.kw  # every group's unfolded rows
        self.ohw = self.OH * self.OW
        self.hw = self.H * self.W
        self.pointwise = (self.kh == self.kw == self.sh == self.sw == 1 and self.pt == self.pl == 0
                          and self.OH == self.H and self.OW == self.W)

    def as_list(self) -> list[int]:
        """n, c, h, w, k, kh, kw, oh, ow, sh, sw, pt, pl, pb, pr, dh, dw, groups (the CPU kernels' int64 array)."""
        return [self.N, self.C, self.H, self.W, self.K, self.kh, self.kw, self.OH, self.OW, self.sh, self.sw, self.pt,
                self.pl, self.pb, self.pr, self.dh, self.dw, self.G]


POOL_MODES = {"max": 0, "avg": 1, "average": 1}


class PoolGeometry:
    """The sizes of a 2-D pooling: x (N, C, H, W), y (N, C, OH, OW), window (kh, kw), stride (sh, sw; the window by
    default), padding (pt, pl, pb, pr), dilation (dh, dw), `mode_code` 0 for max, 1 for averages."""

    def __init__(self, backend: str, name: str, x_shape, y_shape, kernel, stride, padding, dilation, mode,
                 views: tuple):
        if len(x_shape) != 4 or len(y_shape) != 4 or tuple(x_shape[:2]) != tuple(y_shape[:2]):
            raise shape_error(backend, name, views, "x and the output must be 4-D NCHW with the same N and C")
        if mode not in POOL_MODES:
            raise ValueError(f"{backend} kernel {name}: mode must be 'max' or 'avg', got {mode!r}")
        self.mode_code = POOL_MODES[mode]
        self.kh, self.kw = pair(kernel, "kernel")
        self.sh, self.sw = pair(stride if stride is not None else (self.kh, self.kw), "stride")
        self.dh, self.dw = pair(dilation, "dilation")
        if min(self.sh, self.sw, self.dh, self.dw) < 1 or min(self.kh, self.kw) < 1:
            raise shape_error(backend, name, views, "window, stride and dilation must be at least 1")
        self.pt, self.pl, self.pb, self.pr = padding4(padding)
        self.N, self.C, self.H, self.W = x_shape
        self.OH, self.OW = y_shape[2], y_shape[3]

    @property
    def disjoint(self) -> bool:
        """Whether windows never overlap (each input element has at most one)."""
        return self.sh >= (self.kh - 1) * self.dh + 1 and self.sw >= (self.kw - 1) * self.dw + 1

    def as_list(self) -> list[int]:
        """n, c, h, w, oh, ow, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw (the kernels' int64 array)."""
        return [self.N, self.C, self.H, self.W, self.OH, self.OW, self.kh, self.kw, self.sh, self.sw, self.pt, self.pl,
                self.pb, self.pr, self.dh, self.dw]


FUSED_ACTIVATIONS = ("none", "relu")


def conv_fused_args(backend: str, out, residual, activation: str, may_share: bool = False) -> None:
    """conv2d_fused's own arguments: a known activation, and a residual of the output's shape and dtype whose
    elements do not overlap the output's (both contiguous; the geometry is ConvGeometry's), unless `may_share` (the
    backend lists conv2d_fused in Device.shares_output_with) and the residual is the output's very bytes."""
    if activation not in FUSED_ACTIVATIONS:
        raise ValueError(f"{backend} kernel conv2d_fused: activation {activation!r}, expected one of "
                         f"{FUSED_ACTIVATIONS}")
    if residual is None:
        return
    views = (out, residual)
    if tuple(residual.shape) != tuple(out.shape) or residual.dtype != out.dtype:
        raise shape_error(backend, "conv2d_fused", views, "the residual must have the output's shape and dtype")
    if residual.buffer is out.buffer:  # views of one block (a graph's arena): their elements must not overlap
        if may_share and residual.offset == out.offset:
            return
        n = math.prod(out.shape)
        if residual.offset < out.offset + n and out.offset < residual.offset + n:
            raise shape_error(backend, "conv2d_fused", views, "the residual may not overlap the output")


def sgd_args(backend: str, w, buf, g, floats: tuple) -> int:
    """sgd_momentum's views: one dtype of `floats` (the backend's) and one shape, contiguous, no two overlapping (the
    update writes w and buf). Returns the element count."""
    views = (w, buf, g)
    if w.dtype not in floats or buf.dtype != w.dtype or g.dtype != w.dtype:
        raise dtype_error(backend, "sgd_momentum", views, floats)
    shape = tuple(w.shape)
    if tuple(buf.shape) != shape or tuple(g.shape) != shape:
        raise shape_error(backend, "sgd_momentum", views, "w, buf and g must have one shape")
    n = math.prod(shape)
    if not all(is_contiguous(v) for v in views):
        raise shape_error(backend, "sgd_momentum", views, "w, buf and g must be contiguous")
    for a, b in ((w, buf), (w, g), (buf, g)):
        if n and a.buffer is b.buffer and a.offset < b.offset + n and b.offset < a.offset + n:
            raise shape_error(backend, "sgd_momentum", views, "w, buf and g may not overlap")
    return n


def pool_indices(backend: str, views: tuple, indices, out) -> None:
    """pool2d's optional indices output: int64 of the output's shape."""
    if indices is not None and (indices.dtype != dtypes.int64 or tuple(indices.shape) != tuple(out.shape)):
        raise shape_error(backend, "pool2d", views, "indices must be int64 of the output's shape")


def pool_backward_source(backend: str, views: tuple, mode: str, indices, x, dtype: int) -> None:
    """Max pooling's gradient needs the forward's indices or its input."""
    if mode == "max" and indices is None and (x is None or x.dtype != dtype):
        raise shape_error(backend, "pool2d_backward", views, "max pooling needs the forward's indices or its input x")


# -- batch normalisation, softmax and losses ----------------------------------------------------------------------


def bn_dims(backend: str, name: str, x, views: tuple) -> tuple[int, int, int]:
    """(N, C, spatial size) of batch normalisation's x: (N, C) or (N, C, ...)."""
    if len(x.shape) < 2:
        raise shape_error(backend, name, views, "x must be (N, C) or (N, C, ...)")
    return x.shape[0], x.shape[1], math.prod(x.shape[2:])


def layer_norm_dims(backend: str, views: tuple) -> tuple[int, int]:
    """(rows, cols) of layer_norm(y, mean, invstd, x, scale, bias): x and y (rows, cols), mean and invstd (rows,),
    scale and bias (cols,) or None."""
    y, mean, invstd, x, scale, bias = views
    if len(x.shape) != 2 or y.shape != x.shape:
        raise shape_error(backend, "layer_norm", views, "x and y must be (rows, cols) matrices of one shape")
    rows, cols = x.shape
    if mean.shape != (rows,) or invstd.shape != (rows,):
        raise shape_error(backend, "layer_norm", views, f"mean and invstd must be ({rows},)")
    if any(v is not None and v.shape != (cols,) for v in (scale, bias)):
        raise shape_error(backend, "layer_norm", views, f"scale and bias must be ({cols},) or None")
    return rows, cols


def softmax_split(backend: str, name: str, x, axis) -> tuple[int, int, int]:
    """(outer, length, inner) of a softmax's axis; a 0-d softmax is over one element."""
    if not x.shape:
        return 1, 1, 1
    return split(x.shape, norm_axis(int(axis), len(x.shape), name, backend))


def xent_dims(backend: str, name: str, x, target, views: tuple, floats: tuple, labels: tuple) -> tuple[int, int]:
    """(N, C) of softmax_cross_entropy(_backward): x is a float (N, C) matrix; target N labels (a dtype of `labels`)
    or an (N, C) float matrix of x's dtype. Raises TypeError for a target of another dtype."""
    if x.dtype not in floats or len(x.shape) != 2:
        raise shape_error(backend, name, views, "x must be a float (N, C) matrix")
    n, c = x.shape
    if target.dtype in labels:
        if math.prod(target.shape) != n:
            raise shape_error(backend, name, views, "integer targets must hold N labels")
    elif target.dtype in floats:
        if tuple(target.shape) != (n, c):
            raise shape_error(backend, name, views, "probability targets must have x's shape")
    else:
        raise dtype_error(backend, name, views, labels + floats)
    return n, c


def label_error(backend: str, name: str, views: tuple, label: int, classes: int) -> IndexError:
    return IndexError(f"{backend} kernel {name}({', '.join(describe(v) for v in views)}): label {label} with "
                      f"{classes} classes")


def index_error(backend: str, name: str, views: tuple, index: int, axis: int, length: int) -> IndexError:
    return IndexError(f"{backend} kernel {name}({', '.join(describe(v) for v in views)}): index {index} on axis "
                      f"{axis} of length {length}")


# -- reductions -----------------------------------------------------------------------------------------------------


def reduce_axes(backend: str, name: str, out, x, axes) -> tuple[set, tuple]:
    """(the reduced axes as a set of non-negative ints, the kept shape); out must hold the kept elements."""
    nd = len(x.shape)
    reduced = {norm_axis(int(a), nd, name, backend) for a in axes}
    kept = tuple(s for d, s in enumerate(x.shape) if d not in reduced)
    if math.prod(out.shape) != math.prod(kept):
        raise shape_error(backend, name, (out, x), f"output must hold shape {kept}")
    return reduced, kept


def arg_split(backend: str, name: str, x, axis) -> tuple[int, int, int, int]:
    """(axis, outer, length, inner) of argmax/argmin along `axis` (a 0-d x is one element)."""
    axis = norm_axis(int(axis), len(x.shape), name, backend)
    outer, length, inner = split(x.shape, axis) if x.shape else (1, 1, 1)
    return axis, outer, length, inner


# -- indexing -------------------------------------------------------------------------------------------------------


def gather_dims(backend: str, out, x, indices, axis) -> tuple[int, int, int, int, int]:
    """(axis, outer, length, inner, count) of gather: out.shape = x.shape[:axis] + indices.shape + x.shape[axis+1:]."""
    views = (out, x, indices)
    axis = norm_axis(int(axis), len(x.shape), "gather", backend)
    expect = x.shape[:axis] + tuple(indices.shape) + x.shape[axis + 1:]
    if tuple(out.shape) != expect:
        raise shape_error(backend, "gather", views, f"the output must have shape {expect}")
    return (axis, *split(x.shape, axis), math.prod(indices.shape))


def scatter_dims(backend: str, out, indices, updates, axis) -> tuple[int, int, int, int, int]:
    """(axis, outer, length, inner, count) of scatter_add into out along `axis`."""
    views = (out, indices, updates)
    axis = norm_axis(int(axis), len(out.shape), "scatter_add", backend)
    expect = out.shape[:axis] + tuple(indices.shape) + out.shape[axis + 1:]
    if tuple(updates.shape) != expect:
        raise shape_error(backend, "scatter_add", views, f"updates must have shape {expect}")
    return (axis, *split(out.shape, axis), math.prod(indices.shape))


PAD_MODES = {"constant": 0, "reflect": 1, "edge": 2}


def pad_dims(backend: str, out, x, pads, mode) -> tuple[list[int], tuple]:
    """(pads as ints, the padded shape) of ONNX Pad; the mode must be known and the output of the padded shape."""
    views = (out, x)
    if mode not in PAD_MODES:
        raise ValueError(f"{backend} kernel pad: mode must be 'constant', 'reflect' or 'edge', got {mode!r}")
    nd = len(x.shape)
    pads = [int(p) for p in pads]
    if len(pads) != 2 * nd or min(pads, default=0) < 0:
        raise shape_error(backend, "pad", views, f"pads must be {2 * nd} non-negative numbers, got {pads}")
    expect = tuple(s + pads[d] + pads[d + nd] for d, s in enumerate(x.shape))
    if tuple(out.shape) != expect:
        raise shape_error(backend, "pad", views, f"the output must have shape {expect}")
    if mode != "constant" and math.prod(x.shape) == 0 and math.prod(expect) != 0:
        raise shape_error(backend, "pad", views, f"mode {mode!r} needs a non-empty input")
    return pads, expect


# -- random numbers -------------------------------------------------------------------------------------------------


def random_count(backend: str, name: str, out, contiguous_strides: tuple, n: int) -> int:
    """The element count of a random kernel's output, which must be contiguous."""
    if out.strides != contiguous_strides and n > 1:
        raise shape_error(backend, name, (out,), "the output must be contiguous")
    return n
