"""Convolution, pooling, softmax, dropout and LRN.

The device kernels are 2-D (NCHW). 1-D inputs run as (N, C, L, 1). 3-D (and higher) convolutions are sums of 2-D
convolutions over the kernel's depth taps, each tap a strided slice of the input folded into the batch; 3-D max pooling
is the maximum of 2-D poolings over the depth taps; average and Lp pooling of any rank are depthwise convolutions
with a ones kernel, divided by a window count computed the same way. Everything is built from autograd operators, so
these layers train.
"""

from __future__ import annotations

import math

import numpy as np

from singa import autograd, ops
from singa import dtypes as sdt
from singa.tensor import Tensor
from singa_onnx.ops._common import (
    FLOATS,
    const_like,
    full,
    host_to_tensor,
    inputs_as_tensors,
    norm_axis,
    scalar,
    spatial_pads,
    tensor,
)
from singa_onnx.registry import register

# -- convolution ----------------------------------------------------------------------------------------------------


def _conv2d(x, w, b, strides, pads, dils, group):
    """pads in ONNX order (begins then ends) for the two spatial axes."""
    return autograd.conv2d(x, w, b, tuple(strides), (pads[0], pads[1], pads[2], pads[3]), tuple(dils), group)


def _pointwise(x: Tensor, w: Tensor, b: Tensor | None, strides) -> Tensor:
    """A 1x1x... convolution of 3 or more spatial axes as one matrix product W (K, C) @ x (N, C, positions) (2-D
    ones go to the conv2d kernel, whose own 1x1 path with the bias added in is as fast or faster)."""
    if any(s != 1 for s in strides):
        nd = len(x.shape)
        x = autograd.slice(x, [0] * (nd - 2), list(x.shape[2:]), list(range(2, nd)), list(strides))
    N, C = x.shape[:2]
    spatial = list(x.shape[2:])
    K = w.shape[0]
    y = autograd.matmul(autograd.reshape(w, [K, C]), autograd.reshape(x, [N, C, math.prod(spatial)]))
    if b is not None:
        y = autograd.add(y, autograd.reshape(b, [K, 1]))
    return autograd.reshape(y, [N, K] + spatial)


def conv_nd(x: Tensor, w: Tensor, b: Tensor | None, strides, pads, dils, group: int) -> Tensor:
    """ONNX Conv for 1-D, 2-D and higher spatial ranks on the 2-D kernel."""
    nsp = len(x.shape) - 2
    if nsp == 2:
        return _conv2d(x, w, b, strides, pads, dils, group)
    if nsp == 1:
        N, C, L = x.shape
        x4 = autograd.reshape(x, [N, C, L, 1])
        w4 = autograd.reshape(w, list(w.shape) + [1])
        y = _conv2d(x4, w4, b, [strides[0], 1], [pads[0], 0, pads[1], 0], [dils[0], 1], group)
        return autograd.reshape(y, list(y.shape[:3]))
    if group == 1 and all(k == 1 for k in w.shape[2:]) and not any(pads) and x.dtype in FLOATS:
        return _pointwise(x, w, b, strides)
    # higher rank: sum over the taps of the first spatial axis of (nsp-1)-D convolutions
    N, C, D = x.shape[:3]
    K, kD = w.shape[0], w.shape[2]
    s, d = strides[0], dils[0]
    p0, p1 = pads[0], pads[nsp]
    if p0 or p1:
        zp = [0] * (2 * len(x.shape))
        zp[2], zp[2 + len(x.shape)] = p0, p1
        x = autograd.pad(x, "constant", zp, 0.0)
    Dp = x.shape[2]
    OD = (Dp - d * (kD - 1) - 1) // s + 1
    rest = list(x.shape[3:])
    sub_pads = list(pads[1:nsp]) + list(pads[nsp + 1:])
    acc = None
    for kd in range(kD):
        start = kd * d
        xs = autograd.slice(x, [start], [start + (OD - 1) * s + 1], [2], [s])  # (N, C, OD, ...)
        perm = [0, 2, 1] + list(range(3, len(x.shape)))
        xs = autograd.reshape(autograd.transpose(xs, perm), [N * OD, C] + rest)
        wk = autograd.reshape(autograd.slice(w, [kd], [kd + 1], [2]), [K, w.shape[1]] + list(w.shape[3:]))
        y = conv_nd(xs, wk, None, strides[1:], sub_pads, dils[1:], group)
        acc = y if acc is None else autograd.add(acc, y)
    out_rest = list(acc.shape[2:])
    y = autograd.reshape(acc, [N, OD, K] + out_rest)
    y = autograd.transpose(y, [0, 2, 1] + list(range(3, 3 + len(out_rest))))
    if b is not None:
        y = autograd.add(y, autograd.reshape(b, [1, K] + [1] * (nsp)))
    return y


def _conv_attrs(node, x_shape, w_shape):
    nsp = len(x_shape) - 2
    kernel = list(node.attr("kernel_shape") or w_shape[2:])
    strides = list(node.attr("strides") or [1] * nsp)
    dils = list(node.attr("dilations") or [1] * nsp)
    return kernel, strides, dils


def _repeated_filter(node, w) -> bool:
    """Whether a constant (non-trainable, host) weight holds K copies of one filter; checked once per array."""
    if not isinstance(w, np.ndarray) or w.ndim < 3 or w.shape[0] < 2:
        return False
    hit = node.scratch.get("repeated")
    if hit is not None and hit[0] is w:
        return hit[1]
    same = bool(np.all(w == w[:1]))
    node.scratch["repeated"] = (w, same)
    return same


@register("Conv")
def conv(node, inputs, opset):
    x, w, b = (list(inputs_as_tensors(node, inputs)) + [None])[:3]
    kernel, strides, dils = _conv_attrs(node, x.shape, w.shape)
    pads = spatial_pads(node, x.shape[2:], kernel, strides, dils)
    if b is not None and b.shape != (w.shape[0],):
        b = autograd.reshape(b, [w.shape[0]])
    group = node.attr("group", 1)
    if group == 1 and _repeated_filter(node, inputs[1]):
        # K copies of one constant filter: convolve once and repeat the channel. Besides the saved work, every
        # channel is then bitwise equal, as it is mathematically (BLAS rounds rows differently otherwise).
        K = w.shape[0]
        y = conv_nd(x, ops.getitem(w, (slice(0, 1),)), None, strides, pads, dils, 1)
        y = autograd.expand(y, [y.shape[0], K] + list(y.shape[2:]))
        if b is not None:
            y = autograd.add(y, autograd.reshape(b, [1, K] + [1] * (len(y.shape) - 2)))
        return y
    return conv_nd(x, w, b, strides, pads, dils, group)


# com.microsoft FusedConv (onnxruntime's contrib operator, which singa_onnx's inference optimiser writes too):
# Y = activation(Conv(X, W, B) + Z), Z optional, activation_params as onnxruntime reads them
_MS = "com.microsoft"
_ACTIVATIONS = {
    "Relu": lambda y, p: autograd.relu(y),
    "Tanh": lambda y, p: autograd.tanh(y),
    "Sigmoid": lambda y, p: autograd.sigmoid(y),
    "LeakyRelu": lambda y, p: autograd.leakyrelu(y, p[0] if p else 0.01),
    "Clip": lambda y, p: autograd.clip(y, p[0] if p else None, p[1] if len(p) > 1 else None),
    "HardSigmoid": lambda y, p: autograd.hardsigmoid(y, p[0] if p else 0.2, p[1] if len(p) > 1 else 0.5),
}


@register("FusedConv", domain=_MS)
def fused_conv(node, inputs, opset):
    activation = node.attr("activation", "") or ""
    if activation and activation not in _ACTIVATIONS:
        raise ValueError(f"FusedConv: activation {activation!r}, expected one of {sorted(_ACTIVATIONS)}")
    z = tensor(node, inputs[3]) if len(inputs) > 3 and inputs[3] is not None else None
    x, w, b = (list(inputs_as_tensors(node, inputs[:3])) + [None])[:3]
    kernel, strides, dils = _conv_attrs(node, x.shape, w.shape)
    pads = spatial_pads(node, x.shape[2:], kernel, strides, dils)
    if b is not None and b.shape != (w.shape[0],):
        b = autograd.reshape(b, [w.shape[0]])
    group = node.attr("group", 1)
    if not autograd.training and len(x.shape) == 4 and activation in ("", "Relu") and x.dtype in FLOATS:
        spatial = tuple((x.shape[2 + i] + pads[i] + pads[2 + i] - dils[i] * (w.shape[2 + i] - 1) - 1) // strides[i] + 1
                        for i in range(2))
        if z is None or (tuple(z.shape) == (x.shape[0], w.shape[0]) + spatial and z.dtype == x.dtype):
            # one kernel (conv2d_fused) where nothing is trained; values the plan keeps in channel blocks stay so
            blocks = (_block_of(node, node.inputs[0]), _block_of(node, node.outputs[0]))
            return ops.conv2d(x, w, b, tuple(strides), tuple(pads), tuple(dils), group, residual=z,
                              activation="relu" if activation else "none", blocks=blocks)
    y = conv_nd(x, w, b, strides, pads, dils, group)
    if z is not None:
        y = autograd.add(y, z)
    return _ACTIVATIONS[activation](y, list(node.attr("activation_params") or [])) if activation else y


class _ConvTranspose2d(autograd.Operator):
    """The adjoint of conv2d in its input, with zero padding: out (N, C_out, s*(H-1)+d*(k-1)+1, ...).

    W is (C_in, C_out/groups, kh, kw), as ONNX and conv2d's weight both lay it out."""

    def __init__(self, stride, dilation, groups):
        super().__init__()
        self.stride = tuple(stride)
        self.dilation = tuple(dilation)
        self.groups = groups

    def _geom(self):
        return {"stride": self.stride, "padding": 0, "dilation": self.dilation, "groups": self.groups}

    def forward(self, x, W):
        N, _, H, Wd = x.shape
        kh, kw = W.shape[2:]
        out = (N, W.shape[1] * self.groups, self.stride[0] * (H - 1) + self.dilation[0] * (kh - 1) + 1,
               self.stride[1] * (Wd - 1) + self.dilation[1] * (kw - 1) + 1)
        y = ops.conv2d_backward_data(x, W, out, **self._geom())
        if autograd.training:
            self.input = (x, W)
        return y

    def backward(self, dy):
        x, W = self.input
        dx = ops.conv2d(dy, W, None, **self._geom()) if self._input_needs_grad(0) else None
        dW = ops.conv2d_backward_weight(x, dy, W.shape, **self._geom()) if self._input_needs_grad(1) else None
        return dx, dW


def _interleave(t: Tensor, axis: int, s: int) -> Tensor:
    """Spread t along `axis` with s-1 zeros between consecutive entries (length (n-1)*s+1)."""
    if s == 1:
        return t
    n = t.shape[axis]
    z = autograd.unsqueeze(t, [axis + 1])
    zeros = full(z.shape, 0, t.dtype, t.device)
    parts = [z] + [zeros] * (s - 1)
    y = autograd.cat(parts, axis + 1)
    shape = list(t.shape)
    shape[axis] = n * s
    y = autograd.reshape(y, shape)
    return autograd.slice(y, [0], [(n - 1) * s + 1], [axis])


def conv_transpose_full(x: Tensor, w: Tensor, strides, dils, group: int) -> Tensor:
    """ConvTranspose without padding, any spatial rank."""
    nsp = len(x.shape) - 2
    if nsp == 2:
        return _ConvTranspose2d(strides, dils, group)(x, w)[0]
    if nsp == 1:
        N, C, L = x.shape
        y = _ConvTranspose2d([strides[0], 1], [dils[0], 1], group)(
            autograd.reshape(x, [N, C, L, 1]), autograd.reshape(w, list(w.shape) + [1]))[0]
        return autograd.reshape(y, list(y.shape[:3]))
    N, C, D = x.shape[:3]
    kD = w.shape[2]
    s, d = strides[0], dils[0]
    FD = s * (D - 1) + d * (kD - 1) + 1
    rest = list(x.shape[3:])
    xs = autograd.reshape(autograd.transpose(x, [0, 2, 1] + list(range(3, len(x.shape)))), [N * D, C] + rest)
    acc = None
    for kd in range(kD):
        wk = autograd.reshape(autograd.slice(w, [kd], [kd + 1], [2]), list(w.shape[:2]) + list(w.shape[3:]))
        y = conv_transpose_full(xs, wk, strides[1:], dils[1:], group)  # (N*D, Cout, ...)
        Cout = y.shape[1]
        orest = list(y.shape[2:])
        y = autograd.transpose(autograd.reshape(y, [N, D, Cout] + orest), [0, 2, 1] + list(range(3, 3 + len(orest))))
        y = _interleave(y, 2, s)  # depth (D-1)*s+1
        before = kd * d
        after = FD - before - y.shape[2]
        zp = [0] * (2 * len(y.shape))
        zp[2], zp[2 + len(y.shape)] = before, after
        y = autograd.pad(y, "constant", zp, 0.0)
        acc = y if acc is None else autograd.add(acc, y)
    return acc


@register("ConvTranspose")
def conv_transpose(node, inputs, opset):
    x, w, b = (list(inputs_as_tensors(node, inputs)) + [None])[:3]
    nsp = len(x.shape) - 2
    kernel, strides, dils = _conv_attrs(node, x.shape, w.shape)
    group = node.attr("group", 1)
    opad = list(node.attr("output_padding") or [0] * nsp)
    full_len = [strides[i] * (x.shape[2 + i] - 1) + dils[i] * (kernel[i] - 1) + 1 for i in range(nsp)]
    out_shape = node.attr("output_shape")
    mode = node.attr("auto_pad", "NOTSET")
    pads = node.attr("pads")
    if out_shape is not None:
        out_shape = list(out_shape)[-nsp:]
    if mode in ("SAME_UPPER", "SAME_LOWER") or (pads is None and out_shape is not None):
        target = out_shape or [x.shape[2 + i] * strides[i] for i in range(nsp)]
        total = [full_len[i] + opad[i] - target[i] for i in range(nsp)]
        if mode == "SAME_UPPER":
            pads = [t // 2 for t in total] + [t - t // 2 for t in total]
        else:
            pads = [t - t // 2 for t in total] + [t // 2 for t in total]
        opad = [0] * nsp  # folded into the pads above
    elif pads is None or mode == "VALID":
        pads = [0] * (2 * nsp)
    pads = list(pads)
    y = conv_transpose_full(x, w, strides, dils, group)
    # padding crops the full result; output_padding adds zeros at the end (negative values do the opposite)
    zp = [0, 0] + [-pads[i] for i in range(nsp)] + [0, 0] + [-pads[nsp + i] + opad[i] for i in range(nsp)]
    if any(zp):
        y = autograd.pad(y, "constant", zp, 0.0)
    if out_shape is not None and list(y.shape[2:]) != out_shape:
        extra = [0, 0] + [0] * nsp + [0, 0] + [out_shape[i] - y.shape[2 + i] for i in range(nsp)]
        y = autograd.pad(y, "constant", extra, 0.0)
    if b is not None:
        y = autograd.add(y, autograd.reshape(b, [1, y.shape[1]] + [1] * nsp))
    return y


@register("ConvInteger")
def conv_integer(node, inputs, opset):
    x = ops.cast(tensor(node, inputs[0], slot=0), sdt.float32)
    w = ops.cast(tensor(node, inputs[1], slot=1), sdt.float32)
    if len(inputs) > 2 and inputs[2] is not None:
        x = ops.sub(x, tensor(node, inputs[2], sdt.float32, slot=2))
    if len(inputs) > 3 and inputs[3] is not None:
        zw = tensor(node, inputs[3], sdt.float32, slot=3)
        if zw.shape and zw.shape[0] == w.shape[0]:
            zw = ops.reshape(zw, [w.shape[0]] + [1] * (len(w.shape) - 1))
        w = ops.sub(w, zw)
    kernel, strides, dils = _conv_attrs(node, x.shape, w.shape)
    pads = spatial_pads(node, x.shape[2:], kernel, strides, dils)
    y = conv_nd(x, w, None, strides, pads, dils, node.attr("group", 1))
    return ops.cast(ops.round(y), sdt.int32)


# -- pooling --------------------------------------------------------------------------------------------------------


def _pool_len(n, k, s, p0, p1, d, ceil_mode):
    span = n + p0 + p1 - d * (k - 1) - 1
    o = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (o - 1) * s >= n + p0:
        o -= 1
    return o


def _pool_attrs(node, x):
    nsp = len(x.shape) - 2
    kernel = list(node.attr("kernel_shape"))
    strides = list(node.attr("strides") or [1] * nsp)
    dils = list(node.attr("dilations") or [1] * nsp)
    pads = spatial_pads(node, x.shape[2:], kernel, strides, dils)
    return nsp, kernel, strides, dils, pads


def _ones_conv(x: Tensor, kernel, strides, pads, dils) -> Tensor:
    """Window sums of every channel: a depthwise convolution with a ones kernel (any spatial rank)."""
    C = x.shape[1]
    w = full([C, 1] + list(kernel), 1, x.dtype, x.device)
    return conv_nd(x, w, None, strides, pads, dils, C)


def _window_sums(x, kernel, strides, pads, dils, ceil_mode):
    """(sums over each window of x zero-padded by `pads`, the padded input, the extra end padding ceil mode adds)."""
    nsp = len(kernel)
    extra = []
    for i in range(nsp):
        n = x.shape[2 + i]
        o = _pool_len(n, kernel[i], strides[i], pads[i], pads[i + nsp], dils[i], ceil_mode)
        need = (o - 1) * strides[i] + dils[i] * (kernel[i] - 1) + 1
        extra.append(max(need - (n + pads[i] + pads[i + nsp]), 0))
    full_pads = list(pads[:nsp]) + [pads[nsp + i] + extra[i] for i in range(nsp)]
    return _ones_conv(x, kernel, strides, full_pads, dils), extra


def _avg_pool_generic(x, kernel, strides, pads, dils, ceil_mode, include_pad):
    nsp = len(kernel)
    sums, extra = _window_sums(x, kernel, strides, pads, dils, ceil_mode)
    # the divisor: how many window positions hold real input (or declared padding, with count_include_pad)
    ones = full((1, 1) + tuple(x.shape[2:]), 1, x.dtype, x.device)
    if include_pad:
        zp = [0, 0] + list(pads[:nsp]) + [0, 0] + list(pads[nsp:])
        ones = ops.pad(ones, zp, "constant", 1.0)
        mpads = [0] * nsp + list(extra)
    else:
        mpads = list(pads[:nsp]) + [pads[nsp + i] + extra[i] for i in range(nsp)]
    counts = _ones_conv(ones, kernel, strides, mpads, dils)
    counts.requires_grad = False
    return autograd.div(sums, counts)


def _max_pool_2d(x, kernel, strides, pads, dils, ceil_mode):
    return autograd.pooling_2d(x, tuple(kernel), tuple(strides), (pads[0], pads[1], pads[2], pads[3]), True,
                               bool(ceil_mode), tuple(dils))


def max_pool_nd(x, kernel, strides, pads, dils, ceil_mode):
    nsp = len(kernel)
    if nsp == 2:
        return _max_pool_2d(x, kernel, strides, pads, dils, ceil_mode)
    if nsp == 1:
        N, C, L = x.shape
        y = _max_pool_2d(autograd.reshape(x, [N, C, L, 1]), [kernel[0], 1], [strides[0], 1],
                         [pads[0], 0, pads[1], 0], [dils[0], 1], ceil_mode)
        return autograd.reshape(y, list(y.shape[:3]))
    # depth taps of (nsp-1)-D poolings, combined by an element-wise maximum
    N, C, D = x.shape[:3]
    k, s, d = kernel[0], strides[0], dils[0]
    p0, p1 = pads[0], pads[nsp]
    OD = _pool_len(D, k, s, p0, p1, d, ceil_mode)
    need = (OD - 1) * s + d * (k - 1) + 1
    end = max(need - D - p0, 0)
    if p0 or end:
        zp = [0] * (2 * len(x.shape))
        zp[2], zp[2 + len(x.shape)] = p0, end
        x = autograd.pad(x, "constant", zp, float("-inf"))
    rest = list(x.shape[3:])
    sub_pads = list(pads[1:nsp]) + list(pads[nsp + 1:])
    taps = []
    for kd in range(k):
        xs = autograd.slice(x, [kd * d], [kd * d + (OD - 1) * s + 1], [2], [s])
        xs = autograd.reshape(autograd.transpose(xs, [0, 2, 1] + list(range(3, len(x.shape)))), [N * OD, C] + rest)
        taps.append(max_pool_nd(xs, kernel[1:], strides[1:], sub_pads, dils[1:], ceil_mode))
    y = taps[0] if len(taps) == 1 else autograd.max(*taps)
    orest = list(y.shape[2:])
    y = autograd.reshape(y, [N, OD, C] + orest)
    return autograd.transpose(y, [0, 2, 1] + list(range(3, 3 + len(orest))))


def _max_pool_indices(node, x, kernel, strides, pads, dils, ceil_mode):
    """MaxPool's second output: flat indices over the whole input (row- or column-major per storage_order)."""
    nsp = len(kernel)
    if nsp > 2:
        raise NotImplementedError("MaxPool indices for 3-D inputs")
    x4 = x if nsp == 2 else ops.reshape(x, x.shape + (1,))
    k = list(kernel) + ([1] if nsp == 1 else [])
    st = list(strides) + ([1] if nsp == 1 else [])
    dl = list(dils) + ([1] if nsp == 1 else [])
    pp = [pads[0], pads[1], pads[2], pads[3]] if nsp == 2 else [pads[0], 0, pads[1], 0]
    _, idx = ops.pool2d(x4, tuple(k), tuple(st), tuple(pp), tuple(dl), "max", bool(ceil_mode), True, True)
    N, C, H, W = x4.shape
    if node.attr("storage_order", 0) and nsp == 2:
        hh = ops.floor_divide(idx, ops.full((), W, sdt.int64, x.device))
        ww = ops.mod(idx, ops.full((), W, sdt.int64, x.device))
        idx = ops.add(ops.mul(ww, ops.full((), H, sdt.int64, x.device)), hh)
    base = np.arange(N * C, dtype=np.int64).reshape(N, C, 1, 1) * (H * W)
    idx = ops.add(idx, host_to_tensor(base, x.device, sdt.int64))
    return ops.reshape(idx, idx.shape[:3]) if nsp == 1 else idx


def _blocked_pool(node, x, mode: str):
    """Pooling of a value the inference plan keeps in channel blocks (singa_onnx.layout), in that layout."""
    _, kernel, strides, dils, pads = _pool_attrs(node, x)
    return ops.pool2d(x, tuple(kernel), tuple(strides), tuple(pads), tuple(dils), mode,
                      bool(node.attr("ceil_mode", 0)), bool(node.attr("count_include_pad", 0)), blocks=node.rt.block)


def _block_of(node, name: str) -> int:
    """The channel block the running inference plan keeps value `name` in (singa_onnx.layout), else 0 (NCHW)."""
    rt = node.rt
    return rt.block if rt is not None and name in rt.blocked else 0


@register("MaxPool")
def max_pool(node, inputs, opset):
    x = tensor(node, inputs[0])
    if _block_of(node, node.inputs[0]):
        return _blocked_pool(node, x, "max")
    nsp, kernel, strides, dils, pads = _pool_attrs(node, x)
    ceil_mode = node.attr("ceil_mode", 0)
    if x.dtype not in FLOATS:  # int8 / uint8 max pooling: exact in float32
        y = max_pool_nd(ops.cast(x, sdt.float32), kernel, strides, pads, dils, ceil_mode)
        y = ops.cast(y, x.dtype)
    else:
        y = max_pool_nd(x, kernel, strides, pads, dils, ceil_mode)
    if len(node.outputs) > 1 and node.outputs[1]:
        return y, _max_pool_indices(node, x if x.dtype in FLOATS else ops.cast(x, sdt.float32), kernel, strides,
                                    pads, dils, ceil_mode)
    return y


@register("AveragePool")
def average_pool(node, inputs, opset):
    x = tensor(node, inputs[0])
    if _block_of(node, node.inputs[0]):
        return _blocked_pool(node, x, "avg")
    nsp, kernel, strides, dils, pads = _pool_attrs(node, x)
    ceil_mode = node.attr("ceil_mode", 0)
    include = bool(node.attr("count_include_pad", 0))
    if nsp == 2:
        return autograd.pooling_2d(x, tuple(kernel), tuple(strides), (pads[0], pads[1], pads[2], pads[3]), False,
                                   bool(ceil_mode), tuple(dils), include)
    if nsp == 1:
        N, C, L = x.shape
        y = autograd.pooling_2d(autograd.reshape(x, [N, C, L, 1]), (kernel[0], 1), (strides[0], 1),
                                (pads[0], 0, pads[1], 0), False, bool(ceil_mode), (dils[0], 1), include)
        return autograd.reshape(y, list(y.shape[:3]))
    return _avg_pool_generic(x, kernel, strides, pads, dils, ceil_mode, include)


@register("LpPool")
def lp_pool(node, inputs, opset):
    x = tensor(node, inputs[0])
    nsp, kernel, strides, dils, pads = _pool_attrs(node, x)
    p = node.attr("p", 2)
    xp = autograd.pow(autograd.abs(x), const_like(x, float(p)))
    sums, _ = _window_sums(xp, kernel, strides, pads, dils, node.attr("ceil_mode", 0))
    return autograd.pow(sums, const_like(x, 1.0 / p))


@register("GlobalAveragePool")
def global_average_pool(node, inputs, opset):
    x = tensor(node, inputs[0])
    block = _block_of(node, node.inputs[0])
    if block:
        # x in channel blocks (N, C/B, H, W, B) (singa_onnx.layout): the means over H*W of each block's columns are
        # the (N, C) means in channel order, which is (N, C, 1, 1) in either layout
        n, c, h, w = x.shape
        means = ops.mean(ops.reshape(x, (n, c // block, h * w, block)), axis=2)
        return ops.reshape(means, (n, c, 1, 1))
    return autograd.globalaveragepool(x)


@register("GlobalMaxPool")
def global_max_pool(node, inputs, opset):
    from singa_onnx.ops.reduce import _Extreme

    x = tensor(node, inputs[0])
    return _Extreme(tuple(range(2, len(x.shape))), "max")(x)[0]


@register("GlobalLpPool")
def global_lp_pool(node, inputs, opset):
    x = tensor(node, inputs[0])
    p = float(node.attr("p", 2))
    s = autograd.reduce_sum(autograd.pow(autograd.abs(x), const_like(x, p)), list(range(2, len(x.shape))), 1)
    return autograd.pow(s, const_like(x, 1.0 / p))


@register("MaxUnpool", static=(2,))
def max_unpool(node, inputs, opset):
    x = tensor(node, inputs[0], slot=0)
    idx = tensor(node, inputs[1], sdt.int64, slot=1)
    nsp = len(x.shape) - 2
    kernel = list(node.attr("kernel_shape"))
    strides = list(node.attr("strides") or [1] * nsp)
    pads = list(node.attr("pads") or [0] * (2 * nsp))
    inferred = list(x.shape[:2]) + [(x.shape[2 + i] - 1) * strides[i] + kernel[i] - pads[i] - pads[nsp + i]
                                    for i in range(nsp)]
    n = math.prod(inferred)
    flat = ops.scatter_add(ops.full((n,), 0, x.dtype, x.device), ops.reshape(ops.contiguous(idx), (-1,)),
                           ops.reshape(ops.contiguous(x), (-1,)), 0)
    y = ops.reshape(flat, inferred)
    if len(inputs) > 2 and inputs[2] is not None:
        from singa_onnx.ops._common import ints

        out = ints(inputs[2])
        # the indices address the inferred shape; a given output shape pads (or crops) at the end
        y = ops.pad(y, [0] * len(out) + [o - d for o, d in zip(out, inferred)])
    return y


# -- softmax family -------------------------------------------------------------------------------------------------


def _softmax_like(node, inputs, opset, fn):
    x = tensor(node, inputs[0])
    nd = len(x.shape)
    if opset < 13:
        ax = norm_axis(node.attr("axis", 1), nd) if nd else 0
        shape = list(x.shape)
        x2 = autograd.reshape(x, [math.prod(shape[:ax]), math.prod(shape[ax:])])
        return autograd.reshape(fn(x2, 1), shape)
    if nd == 0:
        return autograd.reshape(fn(autograd.reshape(x, [1]), 0), [])
    return fn(x, norm_axis(node.attr("axis", -1), nd))


@register("Softmax")
def softmax(node, inputs, opset):
    return _softmax_like(node, inputs, opset, autograd.softmax)


@register("LogSoftmax")
def log_softmax(node, inputs, opset):
    return _softmax_like(node, inputs, opset, autograd.log_softmax)


@register("Hardmax")
def hardmax(node, inputs, opset):
    x = tensor(node, inputs[0])
    shape = list(x.shape)
    nd = len(shape)
    if opset < 13:
        ax = norm_axis(node.attr("axis", 1), nd)
        x = ops.reshape(x, (math.prod(shape[:ax]), math.prod(shape[ax:])))
        ax = 1
    else:
        ax = norm_axis(node.attr("axis", -1), nd)
    am = ops.argmax(x, ax, keepdims=True)
    shp = [1] * len(x.shape)
    shp[ax] = x.shape[ax]
    ar = host_to_tensor(np.arange(x.shape[ax]).reshape(shp), x.device, sdt.int64)
    y = ops.cast(ops.eq(am, ar), x.dtype)
    return ops.reshape(y, shape)


# -- Dropout / LRN --------------------------------------------------------------------------------------------------


@register("Dropout", static=(1, 2))
def dropout(node, inputs, opset):
    x = tensor(node, inputs[0])
    if opset < 12:
        ratio = node.attr("ratio", 0.5)
        training = node.rt.training and not node.attr("is_test", 0)
    else:
        ratio = float(scalar(inputs[1])) if len(inputs) > 1 and inputs[1] is not None else 0.5
        mode = bool(scalar(inputs[2])) if len(inputs) > 2 and inputs[2] is not None else False
        training = mode or node.rt.training
    want_mask = len(node.outputs) > 1 and node.outputs[1]
    if not training or ratio == 0:
        y = autograd.identity(x) if x.dtype in FLOATS else x
        if want_mask:
            return y, full(x.shape, True, sdt.bool_, x.device)
        return y
    keep = ops.random_bernoulli(ops.empty(x.shape, x.dtype, x.device), 1.0 - ratio)
    scale = ops.mul(keep, 1.0 / (1.0 - ratio)) if ratio < 1 else keep
    scale.requires_grad = False
    y = autograd.mul(x, scale)
    if want_mask:
        return y, ops.cast(keep, sdt.bool_)
    return y


def _pow_const(t: Tensor, p: float) -> Tensor:
    """t ** p for a constant exponent; the common ones through square roots (a fraction of pow's time)."""
    if p == 1:
        return t
    if p == 0.5:
        return autograd.sqrt(t)
    if p == 0.75:  # LRN's usual beta: t^(1/2) * t^(1/4)
        r = autograd.sqrt(t)
        return autograd.mul(r, autograd.sqrt(r))
    return autograd.pow(t, const_like(t, p))


@register("LRN")
def lrn(node, inputs, opset):
    x = tensor(node, inputs[0])
    size = int(node.attr("size"))
    alpha, beta, bias = node.attr("alpha", 1e-4), node.attr("beta", 0.75), node.attr("bias", 1.0)
    shape = list(x.shape)
    nd, C = len(shape), shape[1]
    sq = autograd.mul(x, x)
    # sum of squares over the channels c - lo ... c + hi: `size` shifted channel slices of the zero-padded squares
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    s = sq
    if size > 1:
        zp = [0] * (2 * nd)
        zp[1], zp[nd + 1] = lo, hi
        padded = autograd.pad(sq, "constant", zp, 0.0)
        s = autograd.slice(padded, [0], [C], [1])
        for i in range(1, size):
            s = autograd.add(s, autograd.slice(padded, [i], [i + C], [1]))
    t = autograd.add(autograd.mul(s, const_like(x, alpha / size)), const_like(x, bias))
    return autograd.div(x, _pow_const(t, float(beta)))
