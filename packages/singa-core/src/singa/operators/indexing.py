"""Autograd operators of indexing: `Gather`, `ScatterElements`, `OneHot` and `Embedding`."""

from __future__ import annotations

import builtins
import math
from typing import Any

import numpy as np

from singa import dtypes as _dt
from singa import ops
from singa.autograd_engine import (
    _INTS,
    Operator,
    _as_index,
    _full,
    _ints,
    _NoGrad,
    _Plain,
    _wrap_negative,
    _zeros,
    training,
)
from singa.tensor import Tensor

# -- indexing -------------------------------------------------------------------------------------------------------


class Gather(Operator):
    """ONNX Gather / numpy.take along `axis`; the gradient is scattered (and summed) back."""

    def __init__(self, axis: int, indices: Any) -> None:
        super().__init__()
        self.axis = axis
        self.indices = indices

    def forward(self, x: Tensor) -> Tensor:
        idx = _as_index(self.indices, x.device)
        self.ax = self.axis % len(x.shape)
        y = ops.gather(x, idx, self.ax)
        if training:
            self.saved = (_wrap_negative(idx, x.shape[self.ax]), x.shape)
        return y

    def backward(self, dy: Tensor) -> Tensor:
        idx, x_shape = self.saved
        return ops.scatter_add(_zeros(x_shape, dy), idx, dy, self.ax)


def gather(x: Tensor, axis: int, indices: Any) -> Tensor:
    return Gather(axis, indices)(x)[0]


class ScatterElements(Operator):
    """ONNX ScatterElements: a copy of x with x[..., indices[p], ...] = updates[p] along `axis` (p over indices).

    Done as a flat scatter over linear positions; the gradient passes to x where nothing was overwritten."""

    def __init__(self, indices: Any, updates: Any, axis: int = 0) -> None:
        super().__init__()
        self.indices = indices
        self.updates = updates
        self.axis = axis

    def forward(self, x: Tensor) -> Tensor:
        nd = len(x.shape)
        ax = self.axis % nd
        idx = _as_index(self.indices, x.device)
        if len(idx.shape) != nd or builtins.any(i > d for i, d in zip(idx.shape, x.shape)):
            raise ValueError(f"scatter_elements: indices of shape {idx.shape} do not fit data of shape {x.shape}")
        upd = self.updates
        if not isinstance(upd, Tensor):
            upd = ops.from_numpy(np.asarray(upd), x.device, x.dtype)
        if upd.dtype != x.dtype:
            upd = ops.cast(upd, x.dtype)
        if upd.shape != idx.shape:
            raise ValueError(f"scatter_elements: updates of shape {upd.shape} differ from indices {idx.shape}")
        idx = _wrap_negative(ops.cast(idx, _dt.int64), x.shape[ax])
        # linear position of each update: sum over axes of coordinate * stride, coordinate along `ax` from indices
        strides = [math.prod(x.shape[i + 1:]) for i in range(nd)]
        lin = ops.mul(idx, strides[ax])
        for i in range(nd):
            if i != ax:
                shp = [1] * nd
                shp[i] = idx.shape[i]
                coord = ops.from_numpy((np.arange(idx.shape[i], dtype=np.int64) * strides[i]).reshape(shp),
                                       x.device, _dt.int64)
                lin = ops.add(lin, coord)
        lin = ops.reshape(ops.contiguous(lin), (-1,))
        n = math.prod(x.shape)
        hits = ops.scatter_add(_zeros((n,), x), lin, _full(lin.shape, 1, x), 0)
        keep = ops.reshape(ops.eq(hits, 0), x.shape)
        placed = ops.scatter_add(_zeros((n,), x), lin, ops.reshape(ops.contiguous(upd), (-1,)), 0)
        y = ops.where(keep, x, ops.reshape(placed, x.shape))
        if training:
            self.keep = keep
        return y

    def backward(self, dy: Tensor) -> Tensor:
        return ops.where(self.keep, dy, 0)


def scatter_elements(x: Tensor, indices: Any, updates: Any, axis: int = 0) -> Tensor:
    return ScatterElements(indices, updates, axis)(x)[0]


class OneHot(_NoGrad):
    """ONNX OneHot: a new axis of size depth at `axis`, values[1] where it equals the index, values[0] elsewhere."""

    def __init__(self, axis: int, depth: Any, values: Any) -> None:
        super().__init__()
        self.axis = axis
        self.depth = depth
        self.values = values

    def forward(self, indices: Tensor) -> Tensor:
        depth = _ints(self.depth)[0]
        vals = ops.to_numpy(self.values) if isinstance(self.values, Tensor) else np.asarray(self.values)
        vals = vals.reshape(-1)
        if vals.size != 2:
            raise ValueError(f"onehot: values must be (off, on), got {vals}")
        # the output takes the values' dtype (ONNX); numpy's default float64 becomes float32, other ints int64
        npdt = vals.dtype
        if npdt == np.float64:
            npdt = np.dtype(np.float32)
        elif npdt.kind in "iu" and npdt not in (np.dtype(np.int32), np.dtype(np.int64)):
            npdt = np.dtype(np.int64)
        code = _dt.from_numpy_dtype(npdt)
        dev = indices.device
        idx = indices if indices.dtype in _INTS else ops.cast(indices, _dt.int64)
        idx = _wrap_negative(idx, depth)
        nd = len(idx.shape) + 1
        ax = self.axis % nd
        shp = [1] * nd
        shp[ax] = depth
        ar = ops.from_numpy(np.arange(depth, dtype=np.int64).reshape(shp), dev, _dt.int64)
        if idx.dtype != _dt.int64:
            idx = ops.cast(idx, _dt.int64)
        hit = ops.eq(ops.unsqueeze(idx, ax), ar)
        on = ops.full((), vals[1].item(), code, dev)
        off = ops.full((), vals[0].item(), code, dev)
        return ops.where(hit, on, off)


def onehot(axis: int, indices: Any, depth: Any, values: Any) -> Tensor:
    """SINGA's argument order; indices, depth and values may each be a Tensor, a numpy array or a number/list
    (numpy indices go to the device of a Tensor among depth and values, else the default device)."""
    if not isinstance(indices, Tensor):
        like = next((v for v in (depth, values) if isinstance(v, Tensor)), None)
        indices = ops.from_numpy(np.asarray(indices), like.device if like is not None else None)
    return OneHot(axis, depth, values)(indices)[0]


class Embedding(_Plain):
    """w[x]: rows of the table w (V, D) picked by the integer ids in x; the table gets a scattered gradient."""

    def forward(self, x: Tensor, w: Tensor) -> Tensor:
        idx = _as_index(x, w.device)
        y = ops.gather(w, idx, 0)
        if training:
            self.saved = (_wrap_negative(idx, w.shape[0]), w.shape)
        return y

    def backward(self, dy: Tensor) -> tuple:
        idx, w_shape = self.saved
        return None, ops.scatter_add(_zeros(w_shape, dy), idx, dy, 0)


def embedding(x: Tensor, w: Tensor) -> Tensor:
    return Embedding()(x, w)[0]
