"""Shape and layout operators: Reshape, Flatten, (Un)Squeeze, Transpose, Concat, Split, Slice, Expand, Tile, Pad,
Shape, Size, Constant*, Range, DepthToSpace/SpaceToDepth, Trilu, EyeLike, CenterCropPad."""

from __future__ import annotations

import math

import numpy as np

from singa import autograd, ops
from singa import dtypes as sdt
from singa.tensor import Tensor
from singa_onnx import onnx_types as ot
from singa_onnx.ops._common import (
    FLOATS,
    const_like,
    host,
    host_to_tensor,
    inputs_as_tensors,
    ints,
    norm_axis,
    out_type,
    scalar,
    shape_of,
    tensor,
    zeros_like,
)
from singa_onnx.registry import register


def _grad_ok(x: Tensor) -> bool:
    return x.dtype in FLOATS


# -- Reshape / Flatten / Squeeze / Unsqueeze -------------------------------------------------------------------------


def _target_shape(in_shape: tuple, shape: list[int], allowzero: bool) -> list[int]:
    out = []
    for i, s in enumerate(shape):
        if s == 0 and not allowzero:
            if i >= len(in_shape):
                raise ValueError(f"Reshape: 0 at position {i} copies a dimension the input {in_shape} does not have")
            out.append(in_shape[i])
        else:
            out.append(s)
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        n = math.prod(in_shape)
        out[out.index(-1)] = n // known if known else 0
    return out


def _host_reshape(node, inputs, opset):
    x = inputs[0]
    shape = node.attr("shape") if opset < 5 else ints(inputs[1])
    return x.reshape(_target_shape(x.shape, list(shape), bool(node.attr("allowzero", 0))))


@register("Reshape", static=(1,), host=_host_reshape)
def reshape(node, inputs, opset):
    x = tensor(node, inputs[0])
    shape = list(node.attr("shape")) if opset < 5 else ints(inputs[1])
    target = _target_shape(x.shape, shape, bool(node.attr("allowzero", 0)))
    if _grad_ok(x) and 0 not in target:
        return autograd.reshape(x, target)
    return ops.reshape(x, target)


def _host_flatten(node, inputs, opset):
    x = inputs[0]
    ax = node.attr("axis", 1)
    ax = ax + x.ndim if ax < 0 else ax
    return x.reshape(math.prod(x.shape[:ax]), math.prod(x.shape[ax:]))


@register("Flatten", host=_host_flatten)
def flatten(node, inputs, opset):
    x = tensor(node, inputs[0])
    ax = node.attr("axis", 1)
    ax = ax + len(x.shape) if ax < 0 else ax  # ONNX: a negative axis counts from the rank
    return autograd.flatten(x, ax) if _grad_ok(x) else ops.flatten(x, ax)


def _squeeze_axes(node, inputs, opset, nd):
    axes = node.attr("axes") if opset < 13 else (ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None
                                                  else None)
    return None if axes is None else [norm_axis(a, nd) for a in axes]


def _host_squeeze(node, inputs, opset):
    x = inputs[0]
    axes = _squeeze_axes(node, inputs, opset, x.ndim)
    return np.squeeze(x, axis=None if axes is None else tuple(axes))


@register("Squeeze", static=(1,), host=_host_squeeze)
def squeeze(node, inputs, opset):
    x = tensor(node, inputs[0])
    axes = _squeeze_axes(node, inputs, opset, len(x.shape))
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    if not axes:
        return autograd.identity(x) if _grad_ok(x) else x
    return autograd.squeeze(x, axes) if _grad_ok(x) else ops.squeeze(x, axes)


def _unsqueeze_axes(node, inputs, opset):
    return list(node.attr("axes")) if opset < 13 else ints(inputs[1])


def _host_unsqueeze(node, inputs, opset):
    x = inputs[0]
    axes = _unsqueeze_axes(node, inputs, opset)
    nd = x.ndim + len(axes)
    return np.expand_dims(x, tuple(sorted(a % nd for a in axes)))


@register("Unsqueeze", static=(1,), host=_host_unsqueeze)
def unsqueeze(node, inputs, opset):
    x = tensor(node, inputs[0])
    axes = _unsqueeze_axes(node, inputs, opset)
    nd = len(x.shape) + len(axes)
    axes = sorted(a % nd for a in axes)
    return autograd.unsqueeze(x, axes) if _grad_ok(x) else ops.unsqueeze(x, axes)


def _host_transpose(node, inputs, opset):
    return np.transpose(inputs[0], node.attr("perm"))


@register("Transpose", host=_host_transpose)
def transpose(node, inputs, opset):
    x = tensor(node, inputs[0])
    perm = node.attr("perm")
    perm = list(range(len(x.shape) - 1, -1, -1)) if perm is None else list(perm)
    return autograd.transpose(x, perm) if _grad_ok(x) else ops.transpose(x, perm)


# -- Concat / Split / Slice ------------------------------------------------------------------------------------------


def _host_concat(node, inputs, opset):
    xs = [x for x in inputs if x is not None]
    return np.concatenate(xs, axis=node.attr("axis", 0 if opset < 4 else None))


@register("Concat", host=_host_concat)
def concat(node, inputs, opset):
    xs = [x for x in inputs_as_tensors(node, inputs) if x is not None]
    ax = norm_axis(node.attr("axis", 1 if opset < 4 else 0), len(xs[0].shape))
    if len(xs) == 1:
        return autograd.identity(xs[0]) if _grad_ok(xs[0]) else xs[0]
    return autograd.cat(xs, ax) if _grad_ok(xs[0]) else ops.concat(xs, ax)


def _split_parts(node, inputs, opset, d: int) -> list[int]:
    n_out = len(node.outputs)
    if opset < 13:
        parts = node.attr("split")
        if parts is None and opset < 2 and len(inputs) > 1 and inputs[1] is not None:
            parts = ints(inputs[1])
    else:
        parts = ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
    if parts:
        return [int(p) for p in parts]
    n = node.attr("num_outputs", n_out)
    step = -(-d // n)
    return [min(step, d - i * step) for i in range(n)]


def _host_split(node, inputs, opset):
    x = inputs[0]
    ax = norm_axis(node.attr("axis", 0), x.ndim)
    parts = _split_parts(node, inputs, opset, x.shape[ax])
    return tuple(np.split(x, np.cumsum(parts)[:-1], axis=ax))


@register("Split", static=(1,), host=_host_split)
def split(node, inputs, opset):
    x = tensor(node, inputs[0])
    ax = norm_axis(node.attr("axis", 0), len(x.shape))
    parts = _split_parts(node, inputs, opset, x.shape[ax])
    if _grad_ok(x):
        return tuple(autograd.split(x, ax, parts))
    outs, pos = [], 0
    for p in parts:
        outs.append(ops.slice(x, [pos], [pos + p], [ax]))
        pos += p
    return tuple(outs)


def _slice_args(node, inputs, opset, nd):
    if opset < 10:
        starts, ends = list(node.attr("starts")), list(node.attr("ends"))
        axes = node.attr("axes")
        steps = None
    else:
        starts, ends = ints(inputs[1]), ints(inputs[2])
        axes = ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else None
        steps = ints(inputs[4]) if len(inputs) > 4 and inputs[4] is not None else None
    axes = list(range(len(starts))) if axes is None else [norm_axis(a, nd) for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    return starts, ends, axes, steps


def _key(shape, starts, ends, axes, steps):
    key = [slice(None)] * len(shape)
    for s, e, a, st in zip(starts, ends, axes, steps):
        key[a] = slice(int(s), int(e), int(st))
    return tuple(key)


def _host_slice(node, inputs, opset):
    x = inputs[0]
    return x[_key(x.shape, *_slice_args(node, inputs, opset, x.ndim))]


@register("Slice", static=(1, 2, 3, 4), host=_host_slice)
def slice_(node, inputs, opset):
    x = tensor(node, inputs[0])
    starts, ends, axes, steps = _slice_args(node, inputs, opset, len(x.shape))
    if _grad_ok(x):
        return autograd.slice(x, starts, ends, axes, steps)
    return ops.getitem(x, _key(x.shape, starts, ends, axes, steps))


# -- Expand / Tile / Pad ---------------------------------------------------------------------------------------------


def _host_expand(node, inputs, opset):
    x = inputs[0]
    shape = np.broadcast_shapes(x.shape, tuple(ints(inputs[1])))
    return np.broadcast_to(x, shape).copy()


@register("Expand", static=(1,), host=_host_expand)
def expand(node, inputs, opset):
    x = tensor(node, inputs[0])
    shape = ints(inputs[1])
    if _grad_ok(x):
        return autograd.expand(x, shape)
    return ops.copy(ops.expand(x, shape))


def _host_tile(node, inputs, opset):
    return np.tile(inputs[0], ints(inputs[1]))


@register("Tile", static=(1,), host=_host_tile)
def tile(node, inputs, opset):
    x = tensor(node, inputs[0])
    if opset < 6:
        reps = [1] * len(x.shape)
        reps[int(scalar(inputs[2]))] = int(scalar(inputs[1]))
    else:
        reps = ints(inputs[1])
    return autograd.tile(x, reps) if _grad_ok(x) else ops.tile(x, reps)


def _wrap_pad(x: Tensor, pads: list[int]) -> Tensor:
    """Circular padding, axis by axis, from slices of x (crops first for negative pads)."""
    nd = len(x.shape)
    grad = _grad_ok(x)
    cat = autograd.cat if grad else ops.concat

    def sl(t, a, s, e):
        return autograd.slice(t, [s], [e], [a]) if grad else ops.slice(t, [s], [e], [a])

    for a in range(nd):
        p0, p1 = pads[a], pads[a + nd]
        d = x.shape[a]
        if p0 < 0:
            x, d, p0 = sl(x, a, -p0, d), d + p0, 0
        if p1 < 0:
            x, d, p1 = sl(x, a, 0, d + p1), d + p1, 0
        if not (p0 or p1):
            continue
        reps = -(-max(p0, p1) // d) if d else 0
        big = cat([x] * (2 * reps + 1), a) if reps else x
        x = sl(big, a, reps * d - p0, reps * d + d + p1)
    return x


@register("Pad", static=(1, 2, 3))
def pad(node, inputs, opset):
    x = tensor(node, inputs[0])
    nd = len(x.shape)
    mode = node.attr("mode", "constant")
    if opset < 11:
        pads = list(node.attr("pads" if opset >= 2 else "paddings"))
        value = node.attr("value", 0.0)
    else:
        pads = ints(inputs[1])
        value = scalar(inputs[2]) if len(inputs) > 2 and inputs[2] is not None and host(inputs[2]).size else 0
        axes = ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else None
        if axes is not None:
            full = [0] * (2 * nd)
            k = len(axes)
            for i, a in enumerate(axes):
                a = norm_axis(a, nd)
                full[a], full[a + nd] = pads[i], pads[i + k]
            pads = full
    if mode == "wrap":
        return _wrap_pad(x, pads)
    if x.dtype not in FLOATS:
        if mode == "constant" and value != 0:
            # the pad kernel's fill value is a float: pad with zeros, then write the value where the mask says so
            mask = ops.pad(ops.full(x.shape, 1, x.dtype, x.device), pads, "constant", 0.0)
            return ops.where(ops.eq(mask, 0), const_like(x, value), ops.pad(x, pads, mode, 0.0))
        return ops.pad(x, pads, mode, float(value))
    return autograd.pad(x, mode, pads, float(value))


# -- Shape / Size / constants ----------------------------------------------------------------------------------------


def _shape_value(node, x, opset):
    shp = np.asarray(shape_of(x), dtype=np.int64)
    if opset >= 15:
        nd = len(shp)
        start = node.attr("start", 0)
        end = node.attr("end", nd)
        start = min(max(start + nd if start < 0 else start, 0), nd)
        end = min(max(end + nd if end < 0 else end, 0), nd)
        shp = shp[start:end]
    return shp


@register("Shape")
def shape(node, inputs, opset):
    # shapes are host data: shape arithmetic downstream stays on the host
    return _shape_value(node, inputs[0], opset)


@register("Size")
def size(node, inputs, opset):
    return np.asarray(math.prod(shape_of(inputs[0])), dtype=np.int64)


@register("Constant")
def constant(node, inputs, opset):
    a = node.attrs
    if "value" in a:
        return np.asarray(a["value"])
    if "sparse_value" in a:
        return np.asarray(a["sparse_value"])
    if "value_float" in a:
        return np.asarray(a["value_float"], dtype=np.float32)
    if "value_floats" in a:
        return np.asarray(a["value_floats"], dtype=np.float32)
    if "value_int" in a:
        return np.asarray(a["value_int"], dtype=np.int64)
    if "value_ints" in a:
        return np.asarray(a["value_ints"], dtype=np.int64)
    if "value_string" in a:
        return np.asarray(a["value_string"], dtype=object)
    if "value_strings" in a:
        return np.asarray(a["value_strings"], dtype=object)
    raise ValueError("Constant without a value attribute")


def _cos_value(node):
    v = node.attr("value")
    if v is None:
        return np.zeros((), np.float32)
    return np.asarray(v).reshape(-1)[:1].reshape(())


def _host_constant_of_shape(node, inputs, opset):
    v = _cos_value(node)
    return np.full(tuple(ints(inputs[0])), v, dtype=v.dtype)


@register("ConstantOfShape", static=(0,), host=_host_constant_of_shape)
def constant_of_shape(node, inputs, opset):
    return _host_constant_of_shape(node, [host(inputs[0])], opset)


def _range_values(start, limit, delta):
    n = max(math.ceil((float(limit) - float(start)) / float(delta)), 0)
    dt = np.asarray(start).dtype
    return (np.asarray(start) + np.arange(n, dtype=np.float64 if dt.kind == "f" else np.int64)
            * np.asarray(delta)).astype(dt)


def _host_range(node, inputs, opset):
    return _range_values(*(np.asarray(v).reshape(()) for v in inputs))


@register("Range", static=(0, 1, 2), host=_host_range)
def range_(node, inputs, opset):
    vals = [host(v).reshape(()) for v in inputs]
    t = out_type(node, 0)
    r = _range_values(*vals)
    if t is not None:
        r = r.astype(ot.np_dtype(t))
    return tensor(node, r)


@register("EyeLike")
def eye_like(node, inputs, opset):
    x = inputs[0]
    shp = shape_of(x)
    t = node.attr("dtype") or (node.in_types[0] if node.in_types[0] else ot.from_np(host(x).dtype))
    e = np.eye(shp[0], shp[1], k=node.attr("k", 0), dtype=ot.np_dtype(t))
    return tensor(node, e)


# -- DepthToSpace / SpaceToDepth / Trilu / CenterCropPad ---------------------------------------------------------------


@register("DepthToSpace")
def depth_to_space(node, inputs, opset):
    x = tensor(node, inputs[0])
    b, mode = node.attr("blocksize"), node.attr("mode", "DCR")
    if _grad_ok(x):
        return autograd.depth_to_space(x, b, mode)
    return autograd._depth_to_space(x, b, mode)


@register("SpaceToDepth")
def space_to_depth(node, inputs, opset):
    x = tensor(node, inputs[0])
    b, mode = node.attr("blocksize"), node.attr("mode", "DCR")
    if _grad_ok(x):
        return autograd.space_to_depth(x, b, mode)
    return autograd._space_to_depth(x, b, mode)


@register("Trilu", static=(1,))
def trilu(node, inputs, opset):
    x = tensor(node, inputs[0])
    k = int(scalar(inputs[1])) if len(inputs) > 1 and inputs[1] is not None else 0
    n, m = x.shape[-2:]
    keep = np.triu(np.ones((n, m), bool), k) if node.attr("upper", 1) else np.tril(np.ones((n, m), bool), k)
    mask = host_to_tensor(keep, x.device, sdt.bool_)
    if _grad_ok(x):
        return autograd.where(x, zeros_like(x), mask)
    return ops.where(mask, x, 0)


@register("CenterCropPad", static=(1,))
def center_crop_pad(node, inputs, opset):
    x = tensor(node, inputs[0])
    target = ints(inputs[1])
    nd = len(x.shape)
    axes = node.attr("axes") or list(range(len(target)))
    axes = [norm_axis(a, nd) for a in axes]
    key = [slice(None)] * nd
    pads = [0] * (2 * nd)
    for a, t in zip(axes, target):
        d = x.shape[a]
        if t < d:
            s = (d - t) // 2
            key[a] = slice(s, s + t)
        elif t > d:
            pads[a] = (t - d) // 2
            pads[a + nd] = t - d - (t - d) // 2
    y = ops.getitem(x, tuple(key)) if not _grad_ok(x) else autograd.slice(
        x, [k.start or 0 for k in key], [k.stop if k.stop is not None else x.shape[i] for i, k in enumerate(key)],
        list(range(nd)))
    if any(pads):
        y = autograd.pad(y, "constant", pads, 0.0) if _grad_ok(y) else ops.pad(y, pads)
    return y


@register("Col2Im", static=(1, 2))
def col2im(node, inputs, opset):
    x = tensor(node, inputs[0])  # (N, C * prod(block), L)
    image = ints(inputs[1])
    block = ints(inputs[2])
    nd = len(image)
    dil = node.attr("dilations") or [1] * nd
    pads = node.attr("pads") or [0] * (2 * nd)
    strides = node.attr("strides") or [1] * nd
    N, CK, L = x.shape
    kprod = math.prod(block)
    C = CK // kprod
    padded = [image[i] + pads[i] + pads[i + nd] for i in range(nd)]
    counts = [(padded[i] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(nd)]
    # every (channel, kernel offset, block position) lands at one padded-image position: scatter-add them there
    pos = np.zeros((kprod,) + tuple(counts), dtype=np.int64)
    for kidx, koff in enumerate(np.ndindex(*block)):
        grid = np.meshgrid(*[np.arange(c) * strides[i] + koff[i] * dil[i] for i, c in enumerate(counts)],
                           indexing="ij")
        lin = np.zeros(tuple(counts), dtype=np.int64)
        for i in range(nd):
            lin = lin * padded[i] + grid[i]
        pos[kidx] = lin
    total = math.prod(padded)
    idx = host_to_tensor(pos.reshape(-1), x.device, sdt.int64)
    cols = ops.reshape(ops.contiguous(ops.transpose(ops.reshape(x, (N, C, kprod * L)), (2, 0, 1))),
                       (kprod * L, N * C))
    out = ops.scatter_add(ops.full((total, N * C), 0, x.dtype, x.device), idx, cols, 0)
    img = ops.reshape(ops.transpose(out, (1, 0)), [N, C] + padded)
    key = [slice(None), slice(None)] + [slice(pads[i], pads[i] + image[i]) for i in range(nd)]
    return ops.copy(ops.getitem(img, tuple(key)))
