"""Reductions of `singa.ops`: sum, mean, max, min, prod, argmax and argmin."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from singa.ops_core import (
    _FLOATS,
    _META,
    _NUMERIC,
    _TABLES,
    _as_strided,
    _axes,
    _axis,
    _contiguous_input,
    _empty,
    _meta,
    _supported,
    _table,
    _tensor,
    bool_,
    cast,
    copy,
    int64,
)
from singa.ops_shape import reshape
from singa.tensor import Tensor

# -- reductions ---------------------------------------------------------------------------------------------------


def _reduce(op: str, kname: str, x: Tensor, axis: Any, keepdims: bool, allowed, empty_value: Any) -> Tensor:
    if not keepdims and x.__class__ is Tensor and x.dtype in allowed and (axis is None or axis.__class__ is int):
        shape = x.shape
        nd = len(shape)
        strides, n = _META.get(shape) or _meta(shape)
        if n and nd and x.strides == strides and (axis is None or -nd <= axis < nd):  # a bias gradient, a mean
            if axis is None:
                axes, oshape = tuple(range(nd)), ()
            else:
                axis %= nd
                axes, oshape = (axis,), shape[:axis] + shape[axis + 1:]
            dev = x.device
            r = _empty(oshape, x.dtype, dev)
            (_TABLES.get(dev) or _table(dev))[kname](r, x, axes=axes)
            return r
    _tensor(op, x)
    _supported(op, x.dtype, allowed)
    axes = _axes(op, axis, x.shape)
    shape = x.shape
    oshape = tuple(d for i, d in enumerate(shape) if i not in axes)
    dev = x.device
    if not axes:
        r = copy(x)
    else:
        r = _empty(oshape, x.dtype, dev)
        if math.prod(oshape):
            if math.prod(shape[i] for i in axes) == 0:
                if empty_value is None:
                    raise ValueError(f"{op}: zero-size reduction over axes {axes} of shape {shape}")
                _table(dev)["fill"](r, value=empty_value)
            else:
                _table(dev)[kname](r, _contiguous_input(x), axes=axes)
    if keepdims:
        kshape = tuple(1 if i in axes else d for i, d in enumerate(shape))
        r = _as_strided(r, kshape, _meta(kshape)[0], 0)
    return r


def sum(x: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    """Sum over axes (all when None); bool sums count as int64, float16 accumulates in float32."""
    if isinstance(x, Tensor) and x.dtype == bool_:
        x = cast(x, int64)
    return _reduce("sum", "reduce_sum", x, axis, keepdims, _NUMERIC, 0)


def mean(x: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    """Mean over axes (float dtypes; an empty reduction gives NaN)."""
    return _reduce("mean", "reduce_mean", x, axis, keepdims, _FLOATS, math.nan)


def max(x: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    return _reduce("max", "reduce_max", x, axis, keepdims, _NUMERIC, None)


def min(x: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    return _reduce("min", "reduce_min", x, axis, keepdims, _NUMERIC, None)


def prod(x: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    return _reduce("prod", "reduce_prod", x, axis, keepdims, _NUMERIC, 1)


def _arg(op: str, x: Tensor, axis: int | None, keepdims: bool) -> Tensor:
    _tensor(op, x)
    _supported(op, x.dtype, _NUMERIC)
    shape = x.shape
    if axis is None:
        xx = reshape(x, (math.prod(shape),))
        a = 0
        oshape = ()
        kshape = (1,) * len(shape)
    else:
        a = _axis(op, axis, len(shape), shape)
        xx = x
        oshape = shape[:a] + shape[a + 1:]
        kshape = shape[:a] + (1,) + shape[a + 1:]
    if xx.shape[a] == 0:
        raise ValueError(f"{op}: zero-size reduction over axis {a} of shape {xx.shape}")
    r = _empty(oshape, int64, x.device)
    if math.prod(oshape):
        _table(x.device)[op](r, _contiguous_input(xx), axis=a)
    return _as_strided(r, kshape, _meta(kshape)[0], 0) if keepdims else r


def argmax(x: Tensor, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """int64 index of the first maximum (over the flattened tensor when axis is None)."""
    return _arg("argmax", x, axis, keepdims)


def argmin(x: Tensor, axis: int | None = None, keepdims: bool = False) -> Tensor:
    return _arg("argmin", x, axis, keepdims)
