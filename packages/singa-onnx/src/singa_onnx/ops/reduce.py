"""Reductions (ReduceSum ... ReduceLogSumExp) and ArgMax / ArgMin."""

from __future__ import annotations

import math

import numpy as np

from singa import autograd, ops
from singa import dtypes as sdt
from singa.tensor import Tensor
from singa_onnx.ops._common import FLOATS, INTS, const_like, full, ints, norm_axis, reduce_axes, tensor
from singa_onnx.registry import register

# The opset from which each reduction takes its axes as an input instead of an attribute.
_AXES_INPUT_SINCE = {"ReduceSum": 13}
_DEFAULT_AXES_INPUT_SINCE = 18


class _Extreme(autograd.Operator):
    """max / min over axes (keepdims); the gradient goes to the elements equal to the result."""

    def __init__(self, axes: tuple, kind: str) -> None:
        super().__init__()
        self.axes = axes
        self.kind = kind

    def forward(self, x: Tensor) -> Tensor:
        y = (ops.max if self.kind == "max" else ops.min)(x, self.axes, keepdims=True)
        if autograd.training:
            self.saved = (x, y)
        return y

    def backward(self, dy: Tensor) -> Tensor:
        x, y = self.saved
        hit = ops.cast(ops.eq(x, y), x.dtype)
        count = ops.sum(hit, self.axes, keepdims=True)
        return ops.div(ops.mul(hit, dy), count)


class _Prod(autograd.Operator):
    """product over axes (keepdims); d/dx = y / x (inputs with zeros get no gradient through this formula)."""

    def __init__(self, axes: tuple) -> None:
        super().__init__()
        self.axes = axes

    def forward(self, x: Tensor) -> Tensor:
        y = ops.prod(x, self.axes, keepdims=True)
        if autograd.training:
            self.saved = (x, y)
        return y

    def backward(self, dy: Tensor) -> Tensor:
        x, y = self.saved
        return ops.div(ops.mul(dy, y), x)


def _axes(node, inputs, opset, nd):
    """(axes tuple, noop): the reduced axes, or noop=True when an empty axes list means identity."""
    since = _AXES_INPUT_SINCE.get(node.op_type, _DEFAULT_AXES_INPUT_SINCE)
    if opset < since:
        axes = node.attr("axes")
    else:
        axes = ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
        if axes is not None and not axes:
            axes = None
    if axes is None:
        if node.attr("noop_with_empty_axes", 0) and opset >= since:
            return (), True
        return tuple(range(nd)), False
    return reduce_axes(axes, nd), False


_EMPTY = {"ReduceSum": 0.0, "ReduceMean": math.nan, "ReduceMax": -math.inf, "ReduceMin": math.inf, "ReduceProd": 1.0,
          "ReduceL1": 0.0, "ReduceL2": 0.0, "ReduceSumSquare": 0.0, "ReduceLogSum": -math.inf,
          "ReduceLogSumExp": -math.inf}


def _squeeze(y: Tensor, axes: tuple, keep: bool) -> Tensor:
    if keep or not axes:
        return y
    return autograd.squeeze(y, list(axes)) if y.dtype in FLOATS else ops.squeeze(y, axes)


def _sum(x, axes):
    return autograd.reduce_sum(x, list(axes), 1) if x.dtype in FLOATS else ops.sum(x, axes, keepdims=True)


def _reduce(op: str, x: Tensor, axes: tuple) -> Tensor:
    """op over `axes`, keeping them as size-1 axes."""
    if op == "ReduceSum":
        return _sum(x, axes)
    if op == "ReduceMean":
        if x.dtype in INTS:
            s = ops.sum(x, axes, keepdims=True)
            return ops.div(s, const_like(s, math.prod(x.shape[a] for a in axes)))
        return autograd.reduce_mean(x, list(axes), 1)
    if op in ("ReduceMax", "ReduceMin"):
        kind = "max" if op == "ReduceMax" else "min"
        if x.dtype == sdt.bool_:
            return ops.cast((ops.max if kind == "max" else ops.min)(ops.cast(x, sdt.int32), axes, keepdims=True),
                            sdt.bool_)
        if x.dtype in FLOATS:
            return _Extreme(axes, kind)(x)[0]
        return (ops.max if kind == "max" else ops.min)(x, axes, keepdims=True)
    if op == "ReduceProd":
        return _Prod(axes)(x)[0] if x.dtype in FLOATS else ops.prod(x, axes, keepdims=True)
    if op == "ReduceL1":
        return _sum(autograd.abs(x) if x.dtype in FLOATS else ops.abs(x), axes)
    if op == "ReduceSumSquare":
        return _sum(autograd.mul(x, x) if x.dtype in FLOATS else ops.mul(x, x), axes)
    if op == "ReduceL2":
        if x.dtype in INTS:
            s = ops.sum(ops.mul(x, x), axes, keepdims=True)
            return ops.cast(ops.floor(ops.sqrt(ops.cast(s, sdt.float32))), x.dtype)
        return autograd.sqrt(_sum(autograd.mul(x, x), axes))
    if op == "ReduceLogSum":
        return autograd.log(_sum(x, axes))
    if op == "ReduceLogSumExp":
        m = ops.max(x, axes, keepdims=True)
        m = ops.where(ops.isinf(m), ops.full((), 0, m.dtype, m.device), m)  # all -inf rows: log(0) = -inf
        m.requires_grad = False
        return autograd.add(autograd.log(_sum(autograd.exp(autograd.sub(x, m)), axes)), m)
    raise ValueError(op)


def _host_reduce(node, inputs, opset):
    x = inputs[0]
    axes, noop = _axes(node, inputs, opset, x.ndim)
    if noop:
        return x
    keep = bool(node.attr("keepdims", 1))
    fn = {"ReduceSum": np.sum, "ReduceProd": np.prod, "ReduceMax": np.max, "ReduceMin": np.min}.get(node.op_type)
    if fn is None or x.size == 0:
        return _reduce_device(node, [tensor(node, x)] + list(inputs[1:]), opset)
    return np.asarray(fn(x, axis=axes, keepdims=keep)).astype(x.dtype)


def _reduce_device(node, inputs, opset):
    x = tensor(node, inputs[0])
    axes, noop = _axes(node, inputs, opset, len(x.shape))
    if noop:
        return autograd.identity(x) if x.dtype in FLOATS else x
    keep = bool(node.attr("keepdims", 1))
    if not x.shape:
        return autograd.identity(x) if x.dtype in FLOATS else x
    if any(x.shape[a] == 0 for a in axes):
        value = _EMPTY[node.op_type]
        if x.dtype == sdt.bool_:
            value = {math.inf: True, -math.inf: False}.get(value, False)
        elif x.dtype in INTS:
            info = np.iinfo(sdt.to_numpy_dtype(x.dtype))
            value = {math.inf: info.max, -math.inf: info.min}.get(value, 0 if math.isnan(value) else value)
        kshape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        return _squeeze(full(kshape, value, x.dtype, x.device), axes, keep)
    return _squeeze(_reduce(node.op_type, x, axes), axes, keep)


@register(("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"), static=(1,), host=_host_reduce)
def reduce(node, inputs, opset):
    return _reduce_device(node, inputs, opset)


@register(("ArgMax", "ArgMin"))
def arg_extreme(node, inputs, opset):
    x = tensor(node, inputs[0])
    if x.dtype == sdt.bool_:
        x = ops.cast(x, sdt.int32)
    nd = len(x.shape)
    ax = norm_axis(node.attr("axis", 0), nd)
    keep = bool(node.attr("keepdims", 1))
    fn = ops.argmax if node.op_type == "ArgMax" else ops.argmin
    if node.attr("select_last_index", 0):
        n = x.shape[ax]
        flipped = ops.getitem(x, tuple(slice(None, None, -1) if i == ax else slice(None) for i in range(nd)))
        idx = fn(flipped, ax, keepdims=keep)
        return ops.sub(ops.full((), n - 1, idx.dtype, idx.device), idx)
    return fn(x, ax, keepdims=keep)
