"""Shape and indexing operations of `singa.ops`: views (transpose, reshape, squeeze, broadcast, expand, slice,
`getitem`/`setitem`), concatenation, padding, gather, scatter-add, repeat and tile."""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from singa.backend import Device, View
from singa.ops_core import (
    _INTS,
    _META,
    _as_strided,
    _axes,
    _axis,
    _bview,
    _contig,
    _contiguous_input,
    _empty,
    _hazard,
    _meta,
    _name,
    _run,
    _same_device,
    _same_dtype,
    _shape_arg,
    _table,
    _tensor,
    _wrap,
    assign,
    broadcast_shapes,
    copy,
    from_numpy,
    int64,
    is_contiguous,
)
from singa.tensor import Tensor

# -- views --------------------------------------------------------------------------------------------------------


def transpose(x: Tensor, axes: Sequence[int] | None = None) -> Tensor:
    """A view with permuted axes (reversed when None)."""
    _tensor("transpose", x)
    nd = len(x.shape)
    if axes is None:
        perm = tuple(range(nd - 1, -1, -1))
    else:
        try:
            perm = tuple(int(a) + nd if int(a) < 0 else int(a) for a in axes)
        except TypeError:
            raise TypeError(f"transpose: axes must be a sequence of ints, got {axes!r}") from None
        if sorted(perm) != list(range(nd)):
            raise ValueError(f"transpose: axes {tuple(axes)} are not a permutation of the {nd} axes of shape "
                             f"{x.shape}")
    return _as_strided(x, tuple(x.shape[a] for a in perm), tuple(x.strides[a] for a in perm), x.offset)


def swapaxes(x: Tensor, a: int, b: int) -> Tensor:
    if x.__class__ is Tensor and len(x.shape) == 2 and a in (-1, 1, -2, 0) and b in (-1, 1, -2, 0) and a % 2 != b % 2:
        (r, c), (sr, sc) = x.shape, x.strides  # a matrix transposed (every matrix product's gradient)
        return _wrap(x.buffer, x.dtype, (c, r), (sc, sr), x.offset, x.device)
    nd = len(x.shape)
    a, b = _axis("swapaxes", a, nd, x.shape), _axis("swapaxes", b, nd, x.shape)
    perm = list(range(nd))
    perm[a], perm[b] = b, a
    return transpose(x, perm)


def _infer_shape(op: str, shape: Any, n: int, old: tuple) -> tuple:
    shape = _shape_arg(op, shape)
    if shape.count(-1) > 1:
        raise ValueError(f"{op}: only one dimension can be -1, got {shape}")
    if any(d < -1 for d in shape):
        raise ValueError(f"{op}: negative dimension in {shape}")
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or n % known:
            raise ValueError(f"{op}: cannot reshape {old} ({n} elements) to {shape}")
        shape = tuple(n // known if d == -1 else d for d in shape)
    if math.prod(shape) != n:
        raise ValueError(f"{op}: cannot reshape {old} ({n} elements) to {shape} ({math.prod(shape)} elements)")
    return shape


def _reshape_strides(old: tuple, ostrides: tuple, new: tuple) -> tuple | None:
    """Strides that give `new` over the same elements without a copy, or None (numpy's no-copy reshape rule)."""
    o = [(d, s) for d, s in zip(old, ostrides) if d != 1]
    nn = list(new)
    out = [0] * len(nn)
    i = j = 0  # i walks o, j walks nn
    while j < len(nn) and nn[j] == 1:
        j += 1
    while i < len(o) and j < len(nn):
        # gather one group of old axes and new axes with the same number of elements
        i0, j0 = i, j
        po, pn = o[i][0], nn[j]
        while po != pn:
            if po < pn:
                i += 1
                po *= o[i][0]
            else:
                j += 1
                pn *= nn[j]
        for k in range(i0, i):  # the old group must be one strided run
            if o[k][1] != o[k + 1][0] * o[k + 1][1]:
                return None
        s = o[i][1]
        for k in range(j, j0 - 1, -1):
            if nn[k] == 1:
                continue
            out[k] = s
            s *= nn[k]
        i += 1
        j += 1
        while j < len(nn) and nn[j] == 1:
            j += 1
    # size-1 axes of the new shape: any stride works; use the row-major one so contiguous stays contiguous
    s = 1
    for k in range(len(nn) - 1, -1, -1):
        if nn[k] == 1:
            out[k] = s
        else:
            s = out[k] * nn[k]
    return tuple(out)


def reshape(x: Tensor, shape: Sequence[int] | int) -> Tensor:
    """A view of the new shape when the layout allows it (always for contiguous x), else a reshaped copy."""
    if x.__class__ is Tensor and shape.__class__ is tuple:  # a shape of ints seen before, over contiguous x
        new = _META.get(shape)
        if new is not None:
            old = _META.get(x.shape) or _meta(x.shape)
            if new[1] == old[1] and x.strides == old[0] and all(d.__class__ is int for d in shape):
                return _wrap(x.buffer, x.dtype, shape, new[0], x.offset, x.device)
    _tensor("reshape", x)
    n = math.prod(x.shape)
    shape = _infer_shape("reshape", shape, n, x.shape)
    if shape == x.shape:
        return _as_strided(x, shape, x.strides, x.offset)
    if _contig(x.shape, x.strides):
        return _as_strided(x, shape, (_META.get(shape) or _meta(shape))[0], x.offset)
    if n:
        strides = _reshape_strides(x.shape, x.strides, shape)
        if strides is not None:
            return _as_strided(x, shape, strides, x.offset)
    c = copy(x)
    return _as_strided(c, shape, _meta(shape)[0], 0)


def flatten(x: Tensor, axis: int = 1) -> Tensor:
    """2-D: (prod(shape[:axis]), prod(shape[axis:])) (ONNX Flatten)."""
    nd = len(x.shape)
    if not -nd <= axis <= nd:
        raise ValueError(f"flatten: axis {axis} is out of range for shape {x.shape}")
    if axis < 0:  # ONNX: a negative axis counts from the end, so -1 keeps the last axis apart
        axis += nd
    return reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))


def squeeze(x: Tensor, axis: int | Sequence[int] | None = None) -> Tensor:
    """Drop size-1 axes (all of them when axis is None): a view."""
    _tensor("squeeze", x)
    if axis is None:
        axes = tuple(i for i, d in enumerate(x.shape) if d == 1)
    else:
        axes = _axes("squeeze", axis, x.shape)
        for a in axes:
            if x.shape[a] != 1:
                raise ValueError(f"squeeze: axis {a} of shape {x.shape} has size {x.shape[a]}, not 1")
    keep = [i for i in range(len(x.shape)) if i not in axes]
    return _as_strided(x, tuple(x.shape[i] for i in keep), tuple(x.strides[i] for i in keep), x.offset)


def unsqueeze(x: Tensor, axis: int | Sequence[int]) -> Tensor:
    """Insert size-1 axes at the given positions of the result: a view."""
    _tensor("unsqueeze", x)
    axes = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    nd = len(x.shape) + len(axes)
    pos = sorted(_axis("unsqueeze", a, nd, x.shape) for a in axes)
    if len(set(pos)) != len(pos):
        raise ValueError(f"unsqueeze: repeated axis in {axes}")
    shape, strides = list(x.shape), list(x.strides)
    for p in pos:
        inner = strides[p] * shape[p] if p < len(shape) else 1
        shape.insert(p, 1)
        strides.insert(p, inner)
    return _as_strided(x, tuple(shape), tuple(strides), x.offset)


def broadcast_to(x: Tensor, shape: Sequence[int]) -> Tensor:
    """numpy.broadcast_to: a stride-0 view of the given shape."""
    _tensor("broadcast_to", x)
    shape = _shape_arg("broadcast_to", shape)
    if len(shape) < len(x.shape) or broadcast_shapes("broadcast_to", x.shape, shape) != shape:
        raise ValueError(f"broadcast_to: cannot broadcast shape {x.shape} to {shape}")
    v = _bview(x, shape)
    return _as_strided(x, shape, v.strides, x.offset)


def expand(x: Tensor, shape: Sequence[int]) -> Tensor:
    """ONNX Expand: broadcast x and `shape` together (either may have the 1s); a stride-0 view."""
    _tensor("expand", x)
    shape = broadcast_shapes("expand", x.shape, _shape_arg("expand", shape))
    return _as_strided(x, shape, _bview(x, shape).strides, x.offset)


def slice(x: Tensor, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int] | None = None,
          steps: Sequence[int] | None = None) -> Tensor:
    """ONNX Slice (ends clamp, negative steps allowed): a view."""
    nd = len(x.shape)
    axes = list(range(len(starts))) if axes is None else list(axes)
    steps = [1] * len(starts) if steps is None else list(steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError(f"slice: starts {list(starts)}, ends {list(ends)}, axes {axes} and steps {steps} "
                         "differ in length")
    key = [builtins.slice(None)] * nd
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise ValueError("slice: step cannot be 0")
        key[_axis("slice", a, nd, x.shape)] = builtins.slice(int(s), int(e), int(st))
    return getitem(x, tuple(key))


def _index_array(op: str, idx: Any, dev: Device) -> Tensor:
    if isinstance(idx, Tensor):
        if idx.dtype not in _INTS:
            raise TypeError(f"{op}: indices must be int32 or int64, got {_name(idx.dtype)}")
        return idx
    arr = np.asarray(idx)
    if arr.dtype == np.bool_:
        raise TypeError(f"{op}: boolean mask indices are not supported (use where)")
    if arr.size == 0:
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{op}: indices must be integers, got {arr.dtype}")
    return from_numpy(arr.astype(np.int64), dev, int64)


def getitem(x: Tensor, key: Any) -> Tensor:
    """Indexing: ints, slices, None and ... give a view; an integer array (list, ndarray, Tensor) gathers axis 0."""
    if not isinstance(key, tuple):
        if isinstance(key, (list, np.ndarray, Tensor)):
            return gather(x, _index_array("getitem", key, x.device), 0)
        key = (key,)
    nd = len(x.shape)
    used = 0
    for k in key:
        if isinstance(k, (list, np.ndarray, Tensor)):
            raise TypeError("getitem: array indices inside a tuple are not supported; use gather")
        if isinstance(k, (bool, np.bool_)):
            raise TypeError("getitem: boolean indices are not supported")
        if k is not None and k is not Ellipsis:
            used += 1
    if used > nd:
        raise IndexError(f"too many indices for a tensor of shape {x.shape}: {used} indices")
    if builtins.sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    shape, strides = [], []
    offset = x.offset
    ax = 0
    for k in key:
        if k is None:
            shape.append(1)
            strides.append(0)
        elif k is Ellipsis:
            for _ in range(nd - used):
                shape.append(x.shape[ax])
                strides.append(x.strides[ax])
                ax += 1
        elif isinstance(k, (int, np.integer)):
            d = x.shape[ax]
            i = int(k)
            if not -d <= i < d:
                raise IndexError(f"index {i} is out of bounds for axis {ax} with size {d} (shape {x.shape})")
            offset += (i % d) * x.strides[ax]
            ax += 1
        elif isinstance(k, builtins.slice):
            d = x.shape[ax]
            start, stop, step = k.indices(d)
            n = len(range(start, stop, step))
            if n:
                offset += start * x.strides[ax]
            shape.append(n)
            strides.append(x.strides[ax] * step)
            ax += 1
        else:
            raise TypeError(f"getitem: unsupported index {k!r} of type {type(k).__name__}")
    shape.extend(x.shape[ax:])
    strides.extend(x.strides[ax:])
    return _as_strided(x, tuple(shape), tuple(strides), offset)


def setitem(x: Tensor, key: Any, value: Any) -> None:
    """x[key] = value for basic indices (value broadcast, scalar or numpy array)."""
    if isinstance(key, (list, np.ndarray, Tensor)):
        raise TypeError("setitem: assignment through array indices is not supported; use scatter_add")
    assign(getitem(x, key), value)


# -- concatenation, padding, indexing -----------------------------------------------------------------------------


def concat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join tensors along an existing axis: each is copied into its slice of the result."""
    op = "concat"
    ts = list(tensors)
    if not ts:
        raise ValueError("concat: needs at least one tensor")
    first = ts[0]
    for t in ts:
        _tensor(op, t)
        _same_device(op, first, t)
        _same_dtype(op, first, t)
    nd = len(first.shape)
    if nd == 0:
        raise ValueError("concat: 0-d tensors cannot be concatenated (unsqueeze them first)")
    ax = _axis(op, axis, nd, first.shape)
    for t in ts:
        if len(t.shape) != nd or any(d != e for i, (d, e) in enumerate(zip(first.shape, t.shape)) if i != ax):
            raise ValueError(f"concat: shapes {first.shape} and {t.shape} differ outside axis {ax}")
    oshape = first.shape[:ax] + (builtins.sum(t.shape[ax] for t in ts),) + first.shape[ax + 1:]
    dev = first.device
    r = _empty(oshape, first.dtype, dev)
    kernel = _table(dev)["copy"]
    pos = 0
    for t in ts:
        if math.prod(t.shape):
            kernel(View(r.buffer, r.dtype, t.shape, r.strides, pos * r.strides[ax]), t)
        pos += t.shape[ax]
    return r


def pad(x: Tensor, pads: Sequence[int], mode: str = "constant", value: float = 0.0) -> Tensor:
    """ONNX Pad: pads = (begin_0, ..., begin_n-1, end_0, ..., end_n-1); negative pads crop. Modes: constant,
    reflect, edge."""
    op = "pad"
    _tensor(op, x)
    nd = len(x.shape)
    pads = [int(p) for p in pads]
    if len(pads) != 2 * nd:
        raise ValueError(f"pad: expected {2 * nd} pad values for shape {x.shape}, got {len(pads)}")
    if mode not in ("constant", "reflect", "edge"):
        raise ValueError(f"pad: mode must be 'constant', 'reflect' or 'edge', got {mode!r}")
    if any(p < 0 for p in pads):  # crop first: a view
        key = tuple(builtins.slice(builtins.max(-pads[i], 0), x.shape[i] - builtins.max(-pads[i + nd], 0))
                    for i in range(nd))
        x = getitem(x, key)
        pads = [builtins.max(p, 0) for p in pads]
    for i in range(nd):
        d, p0, p1 = x.shape[i], pads[i], pads[i + nd]
        if mode == "reflect" and builtins.max(p0, p1) >= d and (p0 or p1):
            raise ValueError(f"pad: reflect padding ({p0}, {p1}) must be smaller than the size {d} of axis {i} in "
                             f"shape {x.shape}")
        if mode == "edge" and d == 0 and (p0 or p1):
            raise ValueError(f"pad: edge padding of the empty axis {i} in shape {x.shape}")
    oshape = tuple(x.shape[i] + pads[i] + pads[i + nd] for i in range(nd))
    params = {"pads": tuple(pads), "mode": mode, "value": float(value)}
    return _run(op, "pad", x.dtype, oshape, x.device, (_contiguous_input(x),), params, None)


def gather(x: Tensor, indices: Any, axis: int = 0) -> Tensor:
    """ONNX Gather / numpy.take: out.shape = x.shape[:axis] + indices.shape + x.shape[axis+1:]."""
    op = "gather"
    _tensor(op, x)
    idx = _index_array(op, indices, x.device)
    _same_device(op, x, idx)
    if not x.shape:
        raise ValueError("gather: cannot gather from a 0-d tensor")
    ax = _axis(op, axis, len(x.shape), x.shape)
    oshape = x.shape[:ax] + idx.shape + x.shape[ax + 1:]
    if x.shape[ax] == 0 and math.prod(idx.shape):
        raise IndexError(f"gather: cannot take indices from the empty axis {ax} of shape {x.shape}")
    return _run(op, "gather", x.dtype, oshape, x.device, (_contiguous_input(x), _contiguous_input(idx)),
                {"axis": ax}, None)


def scatter_add(target: Tensor, indices: Any, updates: Tensor, axis: int = 0) -> Tensor:
    """The adjoint of gather, in place: target[..., indices[j], ...] += updates[..., j, ...]; returns target."""
    op = "scatter_add"
    _tensor(op, target, "target")
    _tensor(op, updates, "updates")
    idx = _index_array(op, indices, target.device)
    _same_device(op, target, updates)
    _same_device(op, target, idx)
    _same_dtype(op, target, updates)
    if not target.shape:
        raise ValueError("scatter_add: target cannot be 0-d")
    ax = _axis(op, axis, len(target.shape), target.shape)
    want = target.shape[:ax] + idx.shape + target.shape[ax + 1:]
    if updates.shape != want:
        raise ValueError(f"scatter_add: updates shape {updates.shape} does not match {want} (target "
                         f"{target.shape}, indices {idx.shape}, axis {ax})")
    if not math.prod(updates.shape):
        return target
    ins = (_contiguous_input(idx), _contiguous_input(updates))
    kernel = _table(target.device)["scatter_add"]
    if is_contiguous(target) and not _hazard(target, ins):
        kernel(target, *ins, axis=ax)
    else:
        tmp = copy(target)
        kernel(tmp, *ins, axis=ax)
        assign(target, tmp)
    return target


def repeat(x: Tensor, repeats: int | Sequence[int], axis: int | None = None) -> Tensor:
    """numpy.repeat: each element repeated along axis (flattened first when axis is None)."""
    op = "repeat"
    _tensor(op, x)
    if axis is None:
        x = reshape(x, (math.prod(x.shape),))
        axis = 0
    if not x.shape:
        x = reshape(x, (1,))
    ax = _axis(op, axis, len(x.shape), x.shape)
    d = x.shape[ax]
    if isinstance(repeats, (int, np.integer)):
        r = int(repeats)
        if r < 0:
            raise ValueError(f"repeat: repeats must be non-negative, got {r}")
        # view with a stride-0 axis after `ax`, copied, then merged: no index array needed
        v = _as_strided(x, x.shape[:ax + 1] + (r,) + x.shape[ax + 1:], x.strides[:ax + 1] + (0,) + x.strides[ax + 1:],
                        x.offset)
        return reshape(copy(v), x.shape[:ax] + (d * r,) + x.shape[ax + 1:])
    reps = [int(n) for n in repeats]
    if len(reps) != d or any(n < 0 for n in reps):
        raise ValueError(f"repeat: repeats {reps} must be {d} non-negative counts for axis {ax} of shape {x.shape}")
    return gather(x, np.repeat(np.arange(d, dtype=np.int64), reps), ax)


def tile(x: Tensor, repeats: Sequence[int]) -> Tensor:
    """numpy.tile / ONNX Tile, as one copy of a stride-0 view."""
    _tensor("tile", x)
    reps = [int(r) for r in ([repeats] if isinstance(repeats, (int, np.integer)) else repeats)]
    if any(r < 0 for r in reps):
        raise ValueError(f"tile: repeats must be non-negative, got {reps}")
    nd = builtins.max(len(reps), len(x.shape))
    reps = [1] * (nd - len(reps)) + reps
    shape = (1,) * (nd - len(x.shape)) + x.shape
    strides = (0,) * (nd - len(x.shape)) + x.strides
    vshape, vstrides = [], []
    for r, d, s in zip(reps, shape, strides):
        vshape += [r, d]
        vstrides += [0, s]
    v = _as_strided(x, tuple(vshape), tuple(vstrides), x.offset)
    return reshape(copy(v), tuple(r * d for r, d in zip(reps, shape)))
