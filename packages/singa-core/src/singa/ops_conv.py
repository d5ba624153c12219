"""Convolution and pooling of `singa.ops` (NCHW): `conv2d` and its two backward passes, `pool2d`, `pool2d_backward`
and the geometry helpers (`_pair`, `_pads4`, `pool_output_shape`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from singa.kernel_checks import FUSED_ACTIVATIONS as _FUSED_ACTIVATIONS
from singa.ops_core import (
    _FLOATS,
    _contiguous_input,
    _empty,
    _name,
    _run,
    _same_device,
    _same_dtype,
    _shape_arg,
    _supported,
    _table,
    _tensor,
    fill,
    int64,
)
from singa.tensor import Tensor

# -- convolution and pooling (NCHW) -------------------------------------------------------------------------------


def _pair(op: str, v: Any, what: str, minimum: int) -> tuple:
    t = (int(v), int(v)) if isinstance(v, (int, np.integer)) else tuple(int(e) for e in v)
    if len(t) != 2 or any(e < minimum for e in t):
        raise ValueError(f"{op}: {what} must be an int or a pair of ints >= {minimum}, got {v!r}")
    return t


def _pads4(op: str, p: Any) -> tuple:
    """(top, left, bottom, right) from an int, (ph, pw) or four values."""
    t = (int(p),) * 4 if isinstance(p, (int, np.integer)) else tuple(int(e) for e in p)
    if len(t) == 2:
        t = (t[0], t[1], t[0], t[1])
    if len(t) != 4 or any(e < 0 for e in t):
        raise ValueError(f"{op}: padding must be an int, (ph, pw) or (top, left, bottom, right) >= 0, got {p!r}")
    return t


def _conv_geometry(op: str, xs: tuple, ws: tuple, stride, padding, dilation, groups: int) -> tuple:
    if len(xs) != 4:
        raise ValueError(f"{op}: input must be 4-D (N, C, H, W), got shape {xs}")
    if len(ws) != 4:
        raise ValueError(f"{op}: weight must be 4-D (K, C/groups, kh, kw), got shape {ws}")
    stride = _pair(op, stride, "stride", 1)
    dilation = _pair(op, dilation, "dilation", 1)
    padding = _pads4(op, padding)
    groups = int(groups)
    N, C, H, W = xs
    K, Cg, kh, kw = ws
    if groups < 1 or Cg * groups != C or K % groups:
        raise ValueError(f"{op}: input {xs} and weight {ws} do not match with groups={groups} (need C = "
                         f"weight.shape[1] * groups and K divisible by groups)")
    oh = (H + padding[0] + padding[2] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (W + padding[1] + padding[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    if oh <= 0 or ow <= 0:
        raise ValueError(f"{op}: kernel {(kh, kw)} with dilation {dilation} does not fit input {xs} with padding "
                         f"{padding}")
    return (N, K, oh, ow), {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}


def _float_pair(op: str, a: Tensor, b: Tensor) -> None:
    _same_device(op, a, b)
    _same_dtype(op, a, b)
    _supported(op, a.dtype, _FLOATS)


def conv2d(x: Tensor, w: Tensor, b: Tensor | None = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
           groups: int = 1, *, residual: Tensor | None = None, activation: str = "none",
           blocks: tuple[int, int] = (0, 0)) -> Tensor:
    """2-D cross-correlation: x (N, C, H, W), w (K, C/groups, kh, kw), b (K,) -> (N, K, OH, OW).
    padding: int, (ph, pw) or (top, left, bottom, right). `residual` (the output's shape) is added and `activation`
    ('none' or 'relu') applied in the same call (the conv2d_fused kernel: one pass where the backend fuses them).
    `blocks` (bx, bout), each 0 or the device's `channel_block`: x, and the output with the residual, hold their
    elements in channel blocks (N, C/B, H, W, B) instead of NCHW (their shapes stay NCHW; for code that keeps such
    tensors to itself, as the ONNX inference plan does between convolutions).
    Not differentiable with a residual or an activation: autograd composes those steps itself."""
    op = "conv2d"
    _tensor(op, x, "x")
    _tensor(op, w, "w")
    _float_pair(op, x, w)
    oshape, params = _conv_geometry(op, x.shape, w.shape, stride, padding, dilation, groups)
    if b is not None:
        _tensor(op, b, "b")
        _float_pair(op, x, b)
        if b.shape != (w.shape[0],):
            raise ValueError(f"conv2d: bias shape {b.shape} does not match the {w.shape[0]} kernels of weight "
                             f"{w.shape}")
        b = _contiguous_input(b)
    operands = (_contiguous_input(x), _contiguous_input(w), b)
    if blocks != (0, 0):
        block = x.device.channel_block
        if block <= 0 or any(v not in (0, block) for v in blocks) or (blocks[0] and x.shape[1] % block) or (
                blocks[1] and oshape[1] % block):
            raise ValueError(f"conv2d: blocks {blocks} for x {x.shape} -> {oshape} on {x.device.name}, whose channel "
                             f"block is {block}: each must be 0 or {block}, dividing the channels")
    elif residual is None and activation == "none":
        return _run(op, "conv2d", x.dtype, oshape, x.device, operands, params, None)
    if activation not in _FUSED_ACTIVATIONS:
        raise ValueError(f"conv2d: activation {activation!r}, expected one of {_FUSED_ACTIVATIONS}")
    if residual is not None:
        _tensor(op, residual, "residual")
        _float_pair(op, x, residual)
        if residual.shape != oshape:
            raise ValueError(f"conv2d: residual shape {residual.shape} does not match the output {oshape}")
        residual = _contiguous_input(residual)
    params = {**params, "activation": activation}
    if blocks != (0, 0):
        params["blocks"] = tuple(blocks)
    return _run(op, "conv2d_fused", x.dtype, oshape, x.device, operands + (residual,), params, None)


def conv2d_backward_data(dy: Tensor, w: Tensor, x_shape: Sequence[int], stride: Any = 1, padding: Any = 0,
                         dilation: Any = 1, groups: int = 1) -> Tensor:
    """Gradient of conv2d with respect to x (of shape x_shape)."""
    op = "conv2d_backward_data"
    _tensor(op, dy, "dy")
    _tensor(op, w, "w")
    _float_pair(op, dy, w)
    xs = _shape_arg(op, x_shape)
    oshape, params = _conv_geometry(op, xs, w.shape, stride, padding, dilation, groups)
    if dy.shape != oshape:
        raise ValueError(f"{op}: dy shape {dy.shape} does not match the conv2d output {oshape} for input {xs} and "
                         f"weight {w.shape}")
    return _run(op, op, dy.dtype, xs, dy.device, (_contiguous_input(dy), _contiguous_input(w)), params, None)


def conv2d_backward_weight(dy: Tensor, x: Tensor, w_shape: Sequence[int], stride: Any = 1, padding: Any = 0,
                           dilation: Any = 1, groups: int = 1) -> Tensor:
    """Gradient of conv2d with respect to w (of shape w_shape)."""
    op = "conv2d_backward_weight"
    _tensor(op, dy, "dy")
    _tensor(op, x, "x")
    _float_pair(op, dy, x)
    ws = _shape_arg(op, w_shape)
    oshape, params = _conv_geometry(op, x.shape, ws, stride, padding, dilation, groups)
    if dy.shape != oshape:
        raise ValueError(f"{op}: dy shape {dy.shape} does not match the conv2d output {oshape} for input {x.shape} "
                         f"and weight {ws}")
    return _run(op, op, dy.dtype, ws, dy.device, (_contiguous_input(dy), _contiguous_input(x)), params, None)


def _pool_len(n: int, k: int, s: int, p0: int, p1: int, d: int, ceil_mode: bool) -> int:
    span = n + p0 + p1 - d * (k - 1) - 1
    if span < 0:
        return 0
    o = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (o - 1) * s >= n + p0:  # the last window must start inside the input or its leading padding
        o -= 1
    return o


def pool_output_shape(x_shape: Sequence[int], kernel: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                      ceil_mode: bool = False) -> tuple:
    """(N, C, OH, OW) of pool2d (PyTorch's rule for ceil_mode)."""
    op = "pool2d"
    xs = tuple(x_shape)
    if len(xs) != 4:
        raise ValueError(f"{op}: input must be 4-D (N, C, H, W), got shape {xs}")
    k = _pair(op, kernel, "kernel", 1)
    s = k if stride is None else _pair(op, stride, "stride", 1)
    p = _pads4(op, padding)
    d = _pair(op, dilation, "dilation", 1)
    oh = _pool_len(xs[2], k[0], s[0], p[0], p[2], d[0], ceil_mode)
    ow = _pool_len(xs[3], k[1], s[1], p[1], p[3], d[1], ceil_mode)
    if oh <= 0 or ow <= 0:
        raise ValueError(f"{op}: kernel {k} with dilation {d} does not fit input {xs} with padding {p}")
    return (xs[0], xs[1], oh, ow)


def _pool_params(op: str, kernel, stride, padding, dilation, mode, count_include_pad) -> dict:
    if mode not in ("max", "avg"):
        raise ValueError(f"{op}: mode must be 'max' or 'avg', got {mode!r}")
    k = _pair(op, kernel, "kernel", 1)
    return {"kernel": k, "stride": k if stride is None else _pair(op, stride, "stride", 1),
            "padding": _pads4(op, padding), "dilation": _pair(op, dilation, "dilation", 1), "mode": mode,
            "count_include_pad": bool(count_include_pad)}


def pool2d(x: Tensor, kernel: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1, mode: str = "max",
           ceil_mode: bool = False, count_include_pad: bool = True,
           return_indices: bool = False, blocks: int = 0) -> Tensor | tuple[Tensor, Tensor | None]:
    """2-D max or average pooling of x (N, C, H, W); stride defaults to the kernel. With return_indices (max only),
    returns (y, indices) where indices (int64) feed pool2d_backward. `blocks`: 0, or the device's `channel_block`
    with x and y in channel blocks (see conv2d; no indices then)."""
    op = "pool2d"
    _tensor(op, x)
    _supported(op, x.dtype, _FLOATS)
    params = _pool_params(op, kernel, stride, padding, dilation, mode, count_include_pad)
    if blocks:
        block = x.device.channel_block
        if blocks != block or len(x.shape) != 4 or x.shape[1] % block or return_indices:
            raise ValueError(f"pool2d: blocks {blocks} for x {x.shape} on {x.device.name}, whose channel block is "
                             f"{block}: it must be {block or 'unused'}, dividing the channels, without indices")
        params["blocks"] = blocks
    oshape = pool_output_shape(x.shape, params["kernel"], params["stride"], params["padding"], params["dilation"],
                               ceil_mode)
    dev = x.device
    y = _empty(oshape, x.dtype, dev)
    idx = _empty(oshape, int64, dev) if return_indices and mode == "max" else None
    if math.prod(oshape):
        _table(dev)["pool2d"](y, idx, _contiguous_input(x), **params)
    if return_indices:
        return y, idx
    return y


def pool2d_backward(dy: Tensor, x: Tensor, indices: Tensor | None = None, kernel: Any = 2, stride: Any = None,
                    padding: Any = 0, dilation: Any = 1, mode: str = "max", count_include_pad: bool = True) -> Tensor:
    """Gradient of pool2d with respect to x (max uses `indices` from the forward when given)."""
    op = "pool2d_backward"
    _tensor(op, dy, "dy")
    _tensor(op, x, "x")
    _float_pair(op, dy, x)
    params = _pool_params(op, kernel, stride, padding, dilation, mode, count_include_pad)
    if len(x.shape) != 4 or len(dy.shape) != 4 or dy.shape[:2] != x.shape[:2]:
        raise ValueError(f"{op}: dy {dy.shape} and x {x.shape} must be 4-D with the same (N, C)")
    if indices is not None:
        _tensor(op, indices, "indices")
        if indices.shape != dy.shape or indices.dtype != int64:
            raise ValueError(f"{op}: indices {indices.shape} {_name(indices.dtype)} must be int64 of dy's shape "
                             f"{dy.shape}")
        _same_device(op, dy, indices)
        indices = _contiguous_input(indices)
    dx = _empty(x.shape, x.dtype, x.device)
    if math.prod(x.shape):
        if math.prod(dy.shape):
            _table(x.device)["pool2d_backward"](dx, _contiguous_input(dy), _contiguous_input(x), indices, **params)
        else:
            fill(dx, 0)
    return dx
