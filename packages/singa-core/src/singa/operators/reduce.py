"""Autograd reductions: `ReduceSum`, `ReduceMean` and `GlobalAveragePool`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from singa import ops
from singa.autograd_engine import Operator, _expand, _ints
from singa.tensor import Tensor

# -- reductions -----------------------------------------------------------------------------------------------------


def _reduce_axes(axes: Any, nd: int) -> tuple | None:
    if axes is None:
        return None
    axes = _ints(axes)
    return tuple(sorted(a % nd for a in axes)) if axes else None


class ReduceSum(Operator):
    def __init__(self, axes: Sequence[int] | None = None, keepdims: int = 1) -> None:
        super().__init__()
        self.axes = axes
        self.keepdims = keepdims

    def _count(self, x_shape: tuple, axes: tuple) -> int:
        return 1

    def _reduce(self, x: Tensor, axes: tuple | None) -> Tensor:
        return ops.sum(x, axes, keepdims=True)

    def forward(self, x: Tensor) -> Tensor:
        axes = _reduce_axes(self.axes, len(x.shape))
        self.x_shape = x.shape
        self.full_axes = tuple(range(len(x.shape))) if axes is None else axes
        y = self._reduce(x, axes)
        if not self.keepdims:
            y = ops.squeeze(y, self.full_axes) if self.full_axes else y
        return y

    def backward(self, dy: Tensor) -> Tensor:
        kshape = tuple(1 if i in self.full_axes else d for i, d in enumerate(self.x_shape))
        g = ops.reshape(dy, kshape)
        n = self._count(self.x_shape, self.full_axes)
        if n != 1:
            g = ops.mul(g, 1.0 / n)
        return _expand(g, self.x_shape)


def reduce_sum(x: Tensor, axes: Sequence[int] | None = None, keepdims: int = 1) -> Tensor:
    return ReduceSum(axes, keepdims)(x)[0]


class ReduceMean(ReduceSum):
    def _count(self, x_shape: tuple, axes: tuple) -> int:
        return math.prod(x_shape[a] for a in axes)

    def _reduce(self, x: Tensor, axes: tuple | None) -> Tensor:
        return ops.mean(x, axes, keepdims=True)


def reduce_mean(x: Tensor, axes: Sequence[int] | None = None, keepdims: int = 1) -> Tensor:
    return ReduceMean(axes, keepdims)(x)[0]


class GlobalAveragePool(Operator):
    """Mean over the spatial axes, kept as size-1 axes (channels_first: axes 2...; channels_last: 1...-2)."""

    def __init__(self, data_format: str = "channels_first") -> None:
        super().__init__()
        if data_format not in ("channels_first", "channels_last"):
            raise ValueError(f"globalaveragepool: data_format must be 'channels_first' or 'channels_last', got "
                             f"{data_format!r}")
        self.data_format = data_format

    def forward(self, x: Tensor) -> Tensor:
        nd = len(x.shape)
        axes = tuple(range(2, nd)) if self.data_format == "channels_first" else tuple(range(1, nd - 1))
        self.x_shape = x.shape
        self.count = math.prod(x.shape[a] for a in axes)
        return ops.mean(x, axes, keepdims=True)

    def backward(self, dy: Tensor) -> Tensor:
        return _expand(ops.mul(dy, 1.0 / self.count), self.x_shape)


def globalaveragepool(x: Tensor, data_format: str = "channels_first") -> Tensor:
    return GlobalAveragePool(data_format)(x)[0]
