"""Gather / scatter family, OneHot, NonZero, Compress, Unique, ReverseSequence.

Element-wise gathers are one flat `gather` over linear positions (so they carry gradients through singa's Gather).
Scatters with a reduction read the (integer) indices back to the host to split repeated positions into rounds; each
round is then a duplicate-free scatter, applied in order, which gives every reduction (and "last write wins") exactly.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from singa import autograd, ops
from singa import dtypes as sdt
from singa.tensor import Tensor
from singa_onnx.ops._common import (
    FLOATS,
    host,
    host_to_tensor,
    ints,
    norm_axis,
    scalar,
    tensor,
)
from singa_onnx.registry import register


def _wrap(idx: Tensor, n: int) -> Tensor:
    if idx.dtype != sdt.int64:
        idx = ops.cast(idx, sdt.int64)
    return ops.where(ops.lt(idx, 0), ops.add(idx, ops.full((), n, sdt.int64, idx.device)), idx)


def _strides(shape) -> list[int]:
    return [math.prod(shape[i + 1:]) for i in range(len(shape))]


def _flat_gather(x: Tensor, lin: Tensor) -> Tensor:
    flat = ops.reshape(ops.contiguous(x), (-1,)) if x.dtype not in FLOATS else autograd.reshape(x, [-1])
    if x.dtype in FLOATS:
        return autograd.gather(flat, 0, lin)
    return ops.gather(flat, lin, 0)


def gather_elements(x: Tensor, idx: Any, axis: int) -> Tensor:
    """ONNX GatherElements: out[p] = x[p with coordinate `axis` replaced by idx[p]]."""
    dev = x.device
    idx = idx if isinstance(idx, Tensor) else host_to_tensor(np.asarray(idx), dev, sdt.int64)
    nd = len(x.shape)
    idx = _wrap(idx, x.shape[axis])
    st = _strides(x.shape)
    lin = ops.mul(idx, ops.full((), st[axis], sdt.int64, dev))
    for i in range(nd):
        if i != axis and idx.shape[i] > 1:
            shp = [1] * nd
            shp[i] = idx.shape[i]
            lin = ops.add(lin, host_to_tensor((np.arange(idx.shape[i]) * st[i]).reshape(shp), dev, sdt.int64))
    return _flat_gather(x, ops.contiguous(lin))


def _host_gather(node, inputs, opset):
    x, idx = inputs
    ax = norm_axis(node.attr("axis", 0), x.ndim)
    idx = np.where(idx < 0, idx + x.shape[ax], idx)
    return np.take(x, idx, axis=ax)


@register("Gather", host=_host_gather)
def gather(node, inputs, opset):
    x = tensor(node, inputs[0], slot=0)
    ax = norm_axis(node.attr("axis", 0), len(x.shape))
    idx = inputs[1]
    idx = tensor(node, idx, sdt.int64, slot=1) if not isinstance(idx, Tensor) else idx
    if x.dtype in FLOATS:
        return autograd.gather(x, ax, idx)
    return ops.gather(x, idx, ax)


@register("GatherElements")
def gather_elements_op(node, inputs, opset):
    x = tensor(node, inputs[0], slot=0)
    return gather_elements(x, tensor(node, inputs[1], sdt.int64, slot=1), norm_axis(node.attr("axis", 0),
                                                                                     len(x.shape)))


@register("GatherND")
def gather_nd(node, inputs, opset):
    x = tensor(node, inputs[0], slot=0)
    idx = tensor(node, inputs[1], sdt.int64, slot=1)
    b = node.attr("batch_dims", 0)
    k = idx.shape[-1]
    dshape = x.shape
    inner = dshape[b:b + k]
    rest = dshape[b + k:]
    B = math.prod(dshape[:b])
    P = math.prod(inner)
    R = math.prod(rest)
    dev = x.device
    lin = None
    for j, (d, s) in enumerate(zip(inner, _strides(inner))):
        c = _wrap(ops.getitem(idx, (Ellipsis, j)), d)
        term = ops.mul(c, ops.full((), s, sdt.int64, dev))
        lin = term if lin is None else ops.add(lin, term)
    if lin is None:
        lin = ops.full(idx.shape[:-1], 0, sdt.int64, dev)
    if b:
        bshape = idx.shape[:b]
        boff = np.arange(B).reshape(bshape + (1,) * (len(idx.shape) - 1 - b)) * P
        lin = ops.add(lin, host_to_tensor(boff, dev, sdt.int64))
    x2 = autograd.reshape(x, [B * P, R]) if x.dtype in FLOATS else ops.reshape(ops.contiguous(x), (B * P, R))
    y = autograd.gather(x2, 0, ops.contiguous(lin)) if x.dtype in FLOATS else ops.gather(x2, ops.contiguous(lin), 0)
    shape = list(idx.shape[:-1]) + list(rest)
    return autograd.reshape(y, shape) if x.dtype in FLOATS else ops.reshape(y, shape)


# -- scatters -------------------------------------------------------------------------------------------------------


def _scatter_flat(x: Tensor, lin: np.ndarray, upd: Tensor, reduction: str) -> Tensor:
    """x with updates written at flat positions `lin` (host ints), applying `reduction` for repeated positions."""
    n = math.prod(x.shape)
    dev = x.device
    flat = ops.reshape(ops.contiguous(x), (n,))
    updf = ops.reshape(ops.contiguous(upd), (-1,))
    lin = lin.reshape(-1).astype(np.int64)
    # the k-th occurrence of each position goes to round k
    order = np.argsort(lin, kind="stable")
    rank = np.empty_like(order)
    sorted_lin = lin[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_lin)) + 1]
    first = np.zeros(len(lin), dtype=np.int64)
    first[starts] = starts
    first = np.maximum.accumulate(first)
    rank[order] = np.arange(len(lin)) - first
    y = flat
    for r in range(int(rank.max()) + 1 if len(lin) else 0):
        sel = np.flatnonzero(rank == r)
        pos = host_to_tensor(lin[sel], dev, sdt.int64)
        vals = ops.gather(updf, host_to_tensor(sel, dev, sdt.int64), 0)
        hit = np.zeros(n, dtype=bool)
        hit[lin[sel]] = True
        mask = host_to_tensor(hit, dev, sdt.bool_)
        placed = ops.scatter_add(ops.full((n,), 0, x.dtype, dev), pos, vals, 0)
        if reduction == "add":
            new = ops.add(y, placed)
        elif reduction == "mul":
            new = ops.mul(y, placed)
        elif reduction == "max":
            new = ops.maximum(y, placed)
        elif reduction == "min":
            new = ops.minimum(y, placed)
        else:
            new = placed
        y = ops.where(mask, new, y)
    return ops.reshape(y, x.shape)


def _elements_lin(shape, idx: np.ndarray, axis: int) -> np.ndarray:
    idx = np.where(idx < 0, idx + shape[axis], idx)
    st = _strides(shape)
    grids = np.meshgrid(*[np.arange(d) for d in idx.shape], indexing="ij")
    lin = np.zeros(idx.shape, dtype=np.int64)
    for i in range(len(shape)):
        lin += (idx if i == axis else grids[i]) * st[i]
    return lin


@register(("ScatterElements", "Scatter"))
def scatter_elements(node, inputs, opset):
    x = tensor(node, inputs[0], slot=0)
    idx = host(inputs[1]).astype(np.int64)
    upd = tensor(node, inputs[2], x.dtype, slot=2)
    ax = norm_axis(node.attr("axis", 0), len(x.shape))
    return _scatter_flat(x, _elements_lin(x.shape, idx, ax), upd, node.attr("reduction", "none"))


@register("ScatterND")
def scatter_nd(node, inputs, opset):
    x = tensor(node, inputs[0], slot=0)
    idx = host(inputs[1]).astype(np.int64)
    upd = tensor(node, inputs[2], x.dtype, slot=2)
    k = idx.shape[-1]
    inner = x.shape[:k]
    R = math.prod(x.shape[k:])
    base = np.zeros(idx.shape[:-1], dtype=np.int64)
    for j, (d, s) in enumerate(zip(inner, _strides(inner))):
        c = idx[..., j]
        base += np.where(c < 0, c + d, c) * s
    lin = base[..., None] * R + np.arange(R)
    return _scatter_flat(x, lin, upd, node.attr("reduction", "none"))


@register("TensorScatter")
def tensor_scatter(node, inputs, opset):
    cache = tensor(node, inputs[0], slot=0)  # (B, ..., max_seq, ...)
    upd = tensor(node, inputs[1], cache.dtype, slot=1)
    nd = len(cache.shape)
    ax = norm_axis(node.attr("axis", -2), nd)
    B = cache.shape[0]
    S = upd.shape[ax]
    idx = host(inputs[2]).astype(np.int64) if len(inputs) > 2 and inputs[2] is not None else np.zeros(B, np.int64)
    circular = node.attr("mode", "linear") == "circular"
    # positions along `ax` per batch entry, broadcast over the other axes
    pos = idx[:, None] + np.arange(S)[None, :]
    if circular:
        pos = pos % cache.shape[ax]
    shp = [1] * nd
    shp[0], shp[ax] = B, S
    full_idx = np.broadcast_to(pos.reshape(shp), upd.shape)
    return _scatter_flat(cache, _elements_lin(cache.shape, np.ascontiguousarray(full_idx), ax), upd, "none")


@register("OneHot", static=(1, 2))
def one_hot(node, inputs, opset):
    idx = tensor(node, inputs[0], slot=0)
    depth = int(scalar(inputs[1]))
    values = host(inputs[2])
    return autograd.onehot(node.attr("axis", -1), idx, depth, values)


@register("NonZero")
def nonzero(node, inputs, opset):
    x = tensor(node, inputs[0])
    if not x.shape:
        x = ops.reshape(x, (1,))
        r = autograd.nonzero(x)
        return ops.getitem(r, (slice(0, 0),))
    return autograd.nonzero(x)


@register("Compress")
def compress(node, inputs, opset):
    x = tensor(node, inputs[0], slot=0)
    cond = host(inputs[1]).astype(bool).reshape(-1)
    ax = node.attr("axis")
    if ax is None:
        x = autograd.reshape(x, [-1]) if x.dtype in FLOATS else ops.reshape(x, (-1,))
        ax = 0
    ax = norm_axis(ax, len(x.shape))
    keep = np.flatnonzero(cond[: x.shape[ax]])
    idx = host_to_tensor(keep, x.device, sdt.int64)
    return autograd.gather(x, ax, idx) if x.dtype in FLOATS else ops.gather(x, idx, ax)


@register("Unique")
def unique(node, inputs, opset):
    # output sizes depend on the data: computed on the host, as every framework's unique synchronises
    x = host(inputs[0])
    ax = node.attr("axis")
    srt = node.attr("sorted", 1)
    if ax is None:
        flat = x.reshape(-1)
        y, first, inv, counts = np.unique(flat, return_index=True, return_inverse=True, return_counts=True)
    else:
        ax = norm_axis(ax, x.ndim)
        y, first, inv, counts = np.unique(x, axis=ax, return_index=True, return_inverse=True, return_counts=True)
    inv = inv.reshape(-1)
    if not srt:
        order = np.argsort(first, kind="stable")
        remap = np.empty_like(order)
        remap[order] = np.arange(len(order))
        y = y[order] if ax is None else np.take(y, order, axis=ax)
        first, counts, inv = first[order], counts[order], remap[inv]
    dev = node.rt.device
    t = node.in_types[0]
    y_t = host_to_tensor(y, dev) if t is None or y.dtype != object else y
    return (y_t, host_to_tensor(first.astype(np.int64), dev), host_to_tensor(inv.astype(np.int64), dev),
            host_to_tensor(counts.astype(np.int64), dev))


@register("ReverseSequence")
def reverse_sequence(node, inputs, opset):
    x = tensor(node, inputs[0], slot=0)
    lens = ints(inputs[1])
    bax, tax = node.attr("batch_axis", 1), node.attr("time_axis", 0)
    T = x.shape[tax]
    t = np.arange(T)
    table = np.stack([np.where(t < n, n - 1 - t, t) for n in lens], axis=0)  # (batch, time)
    if bax > tax:
        table = table.T
    shp = [1] * len(x.shape)
    shp[bax], shp[tax] = x.shape[bax], T
    idx = np.broadcast_to(table.reshape(shp), x.shape)
    return gather_elements(x, np.ascontiguousarray(idx), tax)
