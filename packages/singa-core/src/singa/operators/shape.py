"""Autograd operators of shape and layout: reshape, flatten, (un)squeeze, transpose, concat, split, slice, expand,
tile, pad, upsample, depth/space moves, and the gradient-free `Shape`, `ConstantOfShape` and `NonZero`."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

import numpy as np

from singa import dtypes as _dt
from singa import ops
from singa.autograd_engine import Operator, _ints, _NoGrad, _zeros, back_broadcast
from singa.tensor import Tensor

# -- shape and layout -----------------------------------------------------------------------------------------------


class _Reshaping(Operator):
    """An operator whose output is `_reshape(x)`, x's elements in another shape: backward reshapes dy back."""

    def _reshape(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        self.x_shape = x.shape
        return self._reshape(x)

    def backward(self, dy: Tensor) -> Tensor:
        return ops.reshape(dy, self.x_shape)


class Reshape(_Reshaping):
    """ONNX Reshape: 0 keeps the input's dimension, -1 is inferred."""

    def __init__(self, shape: Any) -> None:
        super().__init__()
        self.shape = shape

    def _reshape(self, x: Tensor) -> Tensor:
        shape = [x.shape[i] if s == 0 and i < len(x.shape) else s for i, s in enumerate(_ints(self.shape))]
        return ops.reshape(x, shape)


def reshape(x: Tensor, shape: Any) -> Tensor:
    return Reshape(shape)(x)[0]


class Flatten(_Reshaping):
    """(prod(shape[:axis]), prod(shape[axis:])) (ONNX Flatten)."""

    def __init__(self, axis: int = 1) -> None:
        super().__init__()
        self.axis = axis

    def _reshape(self, x: Tensor) -> Tensor:
        return ops.flatten(x, self.axis)


def flatten(x: Tensor, axis: int = 1) -> Tensor:
    return Flatten(axis)(x)[0]


class Squeeze(_Reshaping):
    """Drop the given size-1 axes (all of them when axis is empty)."""

    def __init__(self, axis: Any = []) -> None:  # noqa: B006 - SINGA's signature; never mutated
        super().__init__()
        self.axis = axis

    def _reshape(self, x: Tensor) -> Tensor:
        axis = self.axis
        if isinstance(axis, (list, tuple)) and not axis:
            axis = None
        return ops.squeeze(x, axis)


def squeeze(x: Tensor, axis: Any = []) -> Tensor:  # noqa: B006 - SINGA's signature; never mutated
    return Squeeze(axis)(x)[0]


class Unsqueeze(_Reshaping):
    """Insert size-1 axes at the given positions of the output."""

    def __init__(self, axis: Any) -> None:
        super().__init__()
        self.axis = axis

    def _reshape(self, x: Tensor) -> Tensor:
        axis = self.axis if isinstance(self.axis, (int, np.integer)) else list(self.axis)
        return ops.unsqueeze(x, axis)


def unsqueeze(x: Tensor, axis: Any = -1) -> Tensor:
    return Unsqueeze(axis)(x)[0]


class Transpose(Operator):
    """Permute the axes (reverse them when perm is None); a view."""

    def __init__(self, perm: Sequence[int] | None) -> None:
        super().__init__()
        self.perm = perm

    def forward(self, x: Tensor) -> Tensor:
        nd = len(x.shape)
        perm = tuple(range(nd - 1, -1, -1)) if self.perm is None else tuple(int(p) % nd for p in self.perm)
        self.inverse = tuple(np.argsort(perm))
        return ops.transpose(x, perm)

    def backward(self, dy: Tensor) -> Tensor:
        return ops.transpose(dy, self.inverse)


def transpose(x: Tensor, shape: Sequence[int] | None = None) -> Tensor:
    return Transpose(shape)(x)[0]


class Concat(Operator):
    def __init__(self, axis: int = 0) -> None:
        super().__init__()
        self.axis = axis

    def forward(self, *xs: Tensor) -> Tensor:
        y = ops.concat(xs, self.axis)
        self.sizes = [x.shape[self.axis] for x in xs]
        return y

    def backward(self, dy: Tensor) -> tuple:
        ax = self.axis % len(dy.shape)
        out, pos = [], 0
        for s in self.sizes:
            out.append(ops.slice(dy, [pos], [pos + s], [ax]))
            pos += s
        return tuple(out)


def cat(xs: Sequence[Tensor], axis: int = 0) -> Tensor:
    return Concat(axis)(*xs)[0]


class Split(Operator):
    """Split along axis into pieces of the sizes in `parts` (or num_output near-equal pieces)."""

    def __init__(self, axis: int, parts: Any, num_output: int | None = None) -> None:
        super().__init__()
        self.axis = axis
        self.parts = parts
        self.num_output = num_output

    def forward(self, x: Tensor) -> tuple:
        ax = self.axis % len(x.shape)
        d = x.shape[ax]
        parts = self.parts
        if parts is None or isinstance(parts, (int, np.integer)):
            n = int(parts if parts is not None else self.num_output)
            step = -(-d // n)  # ONNX: equal pieces, the last one smaller when d is not divisible
            parts = [builtins.min(step, d - i * step) for i in range(n)]
        parts = [int(p) for p in parts]
        if builtins.sum(parts) != d:
            raise ValueError(f"split: parts {parts} do not add up to the size {d} of axis {ax} in shape {x.shape}")
        self.ax = ax
        outs, pos = [], 0
        for p in parts:
            outs.append(ops.slice(x, [pos], [pos + p], [ax]))
            pos += p
        return tuple(outs)

    def backward(self, *dys: Tensor) -> Tensor:
        return ops.concat(dys, self.ax)


def split(x: Tensor, axis: int, parts: Any, num_output: int | None = None) -> tuple:
    return Split(axis, parts, num_output)(x)


class Slice(Operator):
    """ONNX Slice (ends clamp, negative steps allowed)."""

    def __init__(self, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int] | None = None,
                 steps: Sequence[int] | None = None) -> None:
        super().__init__()
        self.starts = starts
        self.ends = ends
        self.axes = axes
        self.steps = steps

    def _args(self) -> tuple:
        return tuple(None if v is None else _ints(v) for v in (self.starts, self.ends, self.axes, self.steps))

    def forward(self, x: Tensor) -> Tensor:
        self.x_shape = x.shape
        return ops.slice(x, *self._args())

    def backward(self, dy: Tensor) -> Tensor:
        dx = _zeros(self.x_shape, dy)
        ops.assign(ops.slice(dx, *self._args()), dy)
        return dx


def slice(x: Tensor, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int] | None = None,
          steps: Sequence[int] | None = None) -> Tensor:
    return Slice(starts, ends, axes, steps)(x)[0]


class Expand(Operator):
    """ONNX Expand: broadcast x and `shape` together."""

    def __init__(self, shape: Sequence[int]) -> None:
        super().__init__()
        self.shape = shape

    def forward(self, x: Tensor) -> Tensor:
        self.x_shape = x.shape
        return ops.copy(ops.expand(x, _ints(self.shape)))

    def backward(self, dy: Tensor) -> Tensor:
        return back_broadcast(dy.shape, self.x_shape, dy)


def expand(x: Tensor, shape: Sequence[int]) -> Tensor:
    return Expand(shape)(x)[0]


class Tile(Operator):
    """ONNX Tile (numpy.tile for as many repeats as axes). With fewer repeats than x has axes they apply to the
    leading axes, the rest repeated once, as SINGA's Tile does (numpy would apply them to the trailing axes)."""

    def __init__(self, repeats: Sequence[int] | int) -> None:
        super().__init__()
        self.repeats = repeats

    def forward(self, x: Tensor) -> Tensor:
        reps = _ints(self.repeats)
        if len(reps) < len(x.shape):
            reps += [1] * (len(x.shape) - len(reps))
        self.reps = reps
        self.x_shape = x.shape
        return ops.tile(x, reps)

    def backward(self, dy: Tensor) -> Tensor:
        nd = builtins.max(len(self.reps), len(self.x_shape))
        reps = [1] * (nd - len(self.reps)) + self.reps
        shape = (1,) * (nd - len(self.x_shape)) + tuple(self.x_shape)
        inter = [v for r, d in zip(reps, shape) for v in (r, d)]
        g = ops.sum(ops.reshape(dy, inter), tuple(range(0, 2 * nd, 2)))
        return ops.reshape(g, self.x_shape)


def tile(x: Tensor, repeats: Sequence[int] | int) -> Tensor:
    return Tile(repeats)(x)[0]


class Pad(Operator):
    """ONNX Pad: pads = (begin_0, ..., begin_n-1, end_0, ..., end_n-1); modes constant, reflect, edge."""

    def __init__(self, mode: str, pads: Sequence[int], constant: float = 0.0) -> None:
        super().__init__()
        self.mode = mode
        self.pads = pads
        self.constant = constant

    def forward(self, x: Tensor) -> Tensor:
        self.x_shape = x.shape
        self.p = [int(p) for p in self.pads]
        return ops.pad(x, self.p, self.mode, self.constant)

    def backward(self, dy: Tensor) -> Tensor:
        pads, nd = self.p, len(self.x_shape)
        if self.mode == "constant":
            # the adjoint of zero-padding is cropping (and of cropping, zero-padding): the same pads negated
            return ops.pad(dy, [-p for p in pads])
        # reflect / edge: each output position reads one input position per axis; sum the gradient back there
        crop = [builtins.max(-p, 0) for p in pads]
        inner = [self.x_shape[i] - crop[i] - crop[i + nd] for i in range(nd)]
        g = dy
        for i in range(nd):
            p0, p1 = builtins.max(pads[i], 0), builtins.max(pads[i + nd], 0)
            if not (p0 or p1):
                continue
            d = inner[i]
            pos = np.arange(-p0, d + p1)
            if self.mode == "edge":
                src = np.clip(pos, 0, d - 1)
            else:
                src = np.abs(pos)
                src = np.where(src > d - 1, 2 * (d - 1) - src, src)
            idx = ops.from_numpy(src.astype(np.int64), dy.device, _dt.int64)
            target = _zeros(g.shape[:i] + (d,) + g.shape[i + 1:], g)
            g = ops.scatter_add(target, idx, g, i)
        return ops.pad(g, crop) if builtins.any(crop) else g


def pad(x: Tensor, mode: str, pads: Sequence[int], constant: float = 0.0) -> Tensor:
    return Pad(mode, pads, constant)(x)[0]


class UpSample(Operator):
    """Nearest-neighbour upsampling by integer scales per axis."""

    def __init__(self, mode: str, scales: Sequence[float]) -> None:
        super().__init__()
        self.mode = mode
        self.scales = scales

    def forward(self, x: Tensor) -> Tensor:
        if self.mode != "nearest":
            raise ValueError(f"upsample: only mode 'nearest' is supported, got {self.mode!r}")
        scales = [float(s) for s in np.asarray(self.scales).reshape(-1)]
        if len(scales) != len(x.shape) or builtins.any(s < 1 or not s.is_integer() for s in scales):
            raise ValueError(f"upsample: scales {scales} must be one integer >= 1 per axis of shape {x.shape}")
        self.s = [int(s) for s in scales]
        self.x_shape = x.shape
        y = x
        for ax, s in enumerate(self.s):
            if s > 1:
                y = ops.repeat(y, s, ax)
        return y

    def backward(self, dy: Tensor) -> Tensor:
        inter = [v for d, s in zip(self.x_shape, self.s) for v in (d, s)]
        g = ops.sum(ops.reshape(dy, inter), tuple(range(1, 2 * len(self.s), 2)))
        return ops.reshape(g, self.x_shape)


def upsample(x: Tensor, mode: str, scales: Sequence[float]) -> Tensor:
    return UpSample(mode, scales)(x)[0]


def _depth_to_space(x: Tensor, b: int, mode: str) -> Tensor:
    N, C, H, W = x.shape
    c = C // (b * b)
    if C % (b * b):
        raise ValueError(f"depth_to_space: channels {C} of shape {x.shape} are not divisible by blocksize^2 = {b * b}")
    if mode == "DCR":  # channel index = (b1 * b + b2) * c + c0
        t = ops.transpose(ops.reshape(x, (N, b, b, c, H, W)), (0, 3, 4, 1, 5, 2))
    elif mode == "CRD":  # channel index = c0 * b * b + b1 * b + b2
        t = ops.transpose(ops.reshape(x, (N, c, b, b, H, W)), (0, 1, 4, 2, 5, 3))
    else:
        raise ValueError(f"depth_to_space: mode must be 'DCR' or 'CRD', got {mode!r}")
    return ops.reshape(t, (N, c, H * b, W * b))


def _space_to_depth(x: Tensor, b: int, mode: str) -> Tensor:
    N, C, H, W = x.shape
    if H % b or W % b:
        raise ValueError(f"space_to_depth: spatial size {x.shape[2:]} is not divisible by blocksize {b}")
    t = ops.reshape(x, (N, C, H // b, b, W // b, b))
    if mode == "DCR":
        t = ops.transpose(t, (0, 3, 5, 1, 2, 4))
    elif mode == "CRD":
        t = ops.transpose(t, (0, 1, 3, 5, 2, 4))
    else:
        raise ValueError(f"space_to_depth: mode must be 'DCR' or 'CRD', got {mode!r}")
    return ops.reshape(t, (N, C * b * b, H // b, W // b))


class _BlockMove(Operator):
    """DepthToSpace and SpaceToDepth: `_there` moves blocks of blocksize x blocksize, `_back` (the other) undoes it."""

    def __init__(self, blocksize: int, mode: str = "DCR") -> None:
        super().__init__()
        self.blocksize = blocksize
        self.mode = mode

    def forward(self, x: Tensor) -> Tensor:
        return self._there(x, int(self.blocksize), self.mode)

    def backward(self, dy: Tensor) -> Tensor:
        return self._back(dy, int(self.blocksize), self.mode)


class DepthToSpace(_BlockMove):
    _there, _back = staticmethod(_depth_to_space), staticmethod(_space_to_depth)


def depth_to_space(x: Tensor, blocksize: int, mode: str = "DCR") -> Tensor:
    return DepthToSpace(blocksize, mode)(x)[0]


class SpaceToDepth(_BlockMove):
    _there, _back = staticmethod(_space_to_depth), staticmethod(_depth_to_space)


def space_to_depth(x: Tensor, blocksize: int, mode: str = "DCR") -> Tensor:
    return SpaceToDepth(blocksize, mode)(x)[0]


class Shape(_NoGrad):
    """The input's shape as a 1-D int64 tensor."""

    def forward(self, x: Tensor) -> Tensor:
        return ops.from_numpy(np.asarray(x.shape, dtype=np.int64).reshape(len(x.shape)), x.device, _dt.int64)


def shape(x: Tensor) -> Tensor:
    return Shape()(x)[0]


class ConstantOfShape(_NoGrad):
    """A tensor of the shape held by the 1-D integer input, filled with `value` (float32 for a Python number)."""

    def __init__(self, value: Any = 0.0) -> None:
        super().__init__()
        self.value = value

    def forward(self, x: Tensor) -> Tensor:
        shp = tuple(_ints(x))
        v = self.value
        if isinstance(v, Tensor):
            v = ops.to_numpy(v)
        if isinstance(v, np.ndarray):
            dt = np.float32 if v.dtype == np.float64 else v.dtype
            code, v = _dt.from_numpy_dtype(dt), v.reshape(-1)[0].item()
        else:
            code = _dt.float32
        return ops.full(shp, v, code, x.device)


def constant_of_shape(x: Tensor, value: Any = 0) -> Tensor:
    return ConstantOfShape(value)(x)[0]


class NonZero(_NoGrad):
    """Indices (int64, shape (ndim, nnz)) of the non-zero elements.

    The output's size depends on the data, so the mask is read back to the host here (like every framework's
    nonzero, it synchronises the device)."""

    def forward(self, x: Tensor) -> Tensor:
        idx = np.array(np.nonzero(ops.to_numpy(ops.ne(x, 0))), dtype=np.int64).reshape(len(x.shape), -1)
        return ops.from_numpy(idx, x.device, _dt.int64)


def nonzero(x: Tensor) -> Tensor:
    return NonZero()(x)[0]
