"""Signal processing (DFT, STFT, MelWeightMatrix), random generators, BitCast.

A DFT along one axis is a matrix product with a host-built cos / sin matrix (real and imaginary parts kept separate),
so it runs on the device and trains; STFT gathers its frames first.
"""

from __future__ import annotations

import numpy as np

from singa import autograd, ops
from singa import dtypes as sdt
from singa.tensor import Tensor
from singa_onnx import onnx_types as ot
from singa_onnx.ops._common import host, host_to_tensor, in_type, norm_axis, scalar, tensor
from singa_onnx.registry import register


def _dft_last(x: Tensor, L: int, inverse: bool, onesided: bool) -> Tensor:
    """DFT over axis -2 of x (..., n, 1|2); returns (..., K, 2) or, for an inverse one-sided DFT, (..., L, 1)."""
    n = x.shape[-2]
    complex_in = x.shape[-1] == 2
    xr = autograd.reshape(autograd.slice(x, [0], [1], [len(x.shape) - 1]), list(x.shape[:-1]))
    xi = autograd.reshape(autograd.slice(x, [1], [2], [len(x.shape) - 1]), list(x.shape[:-1])) if complex_in \
        else None
    dev, dt = x.device, x.dtype
    if inverse and onesided:
        m = L // 2 + 1
        k = np.arange(n)[:, None]
        t = np.arange(L)[None, :]
        th = 2 * np.pi * k * t / L
        c = np.where((k == 0) | ((L % 2 == 0) & (k == L // 2)), 1.0, 2.0) * (k < m)
        cr = host_to_tensor((c * np.cos(th) / L).astype(np.float32), dev, dt)
        ci = host_to_tensor((-c * np.sin(th) / L).astype(np.float32), dev, dt)
        y = autograd.matmul(xr, cr)
        if xi is not None:
            y = autograd.add(y, autograd.matmul(xi, ci))
        return autograd.unsqueeze(y, [len(y.shape) - 1 + 1])
    K = L // 2 + 1 if onesided and not inverse else L
    rows = np.arange(n)[:, None]
    cols = np.arange(K)[None, :]
    th = 2 * np.pi * rows * cols / L
    keep = (rows < L).astype(np.float64)  # input past the DFT length is truncated
    sign = 1.0 if inverse else -1.0
    scale = 1.0 / L if inverse else 1.0
    cos = host_to_tensor((np.cos(th) * keep * scale).astype(np.float32), dev, dt)
    sin = host_to_tensor((sign * np.sin(th) * keep * scale).astype(np.float32), dev, dt)
    # (xr + i xi)(cos + i sin)
    yr = autograd.matmul(xr, cos)
    yi = autograd.matmul(xr, sin)
    if xi is not None:
        yr = autograd.sub(yr, autograd.matmul(xi, sin))
        yi = autograd.add(yi, autograd.matmul(xi, cos))
    last = len(yr.shape)
    return autograd.cat([autograd.unsqueeze(yr, [last]), autograd.unsqueeze(yi, [last])], last)


@register("DFT", static=(1, 2))
def dft(node, inputs, opset):
    x = tensor(node, inputs[0])
    nd = len(x.shape)
    if opset >= 20:
        ax = int(scalar(inputs[2])) if len(inputs) > 2 and inputs[2] is not None else -2
    else:
        ax = node.attr("axis", 1)
    ax = norm_axis(ax, nd)
    inverse, onesided = bool(node.attr("inverse", 0)), bool(node.attr("onesided", 0))
    if len(inputs) > 1 and inputs[1] is not None and host(inputs[1]).size:
        L = int(scalar(inputs[1]))
    else:
        L = 2 * (x.shape[ax] - 1) if inverse and onesided else x.shape[ax]
    perm = [i for i in range(nd - 1) if i != ax] + [ax, nd - 1]
    inv = list(np.argsort(perm))
    y = _dft_last(autograd.transpose(x, perm), L, inverse, onesided)
    return autograd.transpose(y, inv)


@register("STFT", static=(1, 3))
def stft(node, inputs, opset):
    x = tensor(node, inputs[0], slot=0)  # (B, T, 1|2)
    step = int(scalar(inputs[1]))
    window = inputs[2] if len(inputs) > 2 else None
    flen = inputs[3] if len(inputs) > 3 else None
    if flen is not None:
        flen = int(scalar(flen))
    elif window is not None:
        flen = int(host(window).shape[0]) if not isinstance(window, Tensor) else window.shape[0]
    else:
        flen = x.shape[1]
    T = x.shape[1]
    frames = 1 + (T - flen) // step
    idx = (np.arange(frames)[:, None] * step + np.arange(flen)[None, :]).astype(np.int64)
    fr = autograd.gather(x, 1, host_to_tensor(idx, x.device, sdt.int64))  # (B, frames, flen, C)
    if window is not None:
        w = tensor(node, window, x.dtype, slot=2)
        fr = autograd.mul(fr, autograd.reshape(w, [1, 1, flen, 1]))
    return _dft_last(fr, flen, False, bool(node.attr("onesided", 1)))


@register("MelWeightMatrix", static=(0, 1, 2, 3, 4))
def mel_weight_matrix(node, inputs, opset):
    # a constant generator (like Range or EyeLike): the filterbank is built once from five scalars
    bins, L, rate = (int(scalar(v)) for v in inputs[:3])
    lo, hi = (float(scalar(v)) for v in inputs[3:5])
    spec = L // 2 + 1

    def to_mel(f):
        return 2595 * np.log1p(f / 700) / np.log(10)

    edges_mel = to_mel(lo) + np.arange(bins + 2) * (to_mel(hi) - to_mel(lo)) / (bins + 2)
    edges = ((L + 1) * (700 * np.expm1(edges_mel / 2595 * np.log(10)))) // rate
    edges = edges.astype(int)
    w = np.zeros((spec, bins))
    for i in range(bins):
        a, c, b = edges[i], edges[i + 1], edges[i + 2]
        if c == a:
            w[c, i] = 1
        else:
            for j in range(a, c + 1):
                w[j, i] = (j - a) / (c - a)
        if b > c:
            for j in range(c, b):
                w[j, i] = (b - j) / (b - c)
    t = node.attr("output_datatype", 1)
    return w.astype(ot.np_dtype(t))


# -- random ---------------------------------------------------------------------------------------------------------


def _seeded(node):
    seed = node.attr("seed")
    if seed is not None:
        node.rt.device.set_rand_seed(int(seed))


def _random_tensor(node, shape, t, kind: str) -> Tensor:
    _seeded(node)
    code = ot.storage(t) if t else sdt.float32
    y = ops.empty(tuple(shape), code if code in (sdt.float32, sdt.float16) else sdt.float32, node.rt.device)
    if kind == "uniform":
        ops.random_uniform(y, node.attr("low", 0.0), node.attr("high", 1.0))
    else:
        ops.random_normal(y, node.attr("mean", 0.0), node.attr("scale", 1.0))
    return y if y.dtype == code else ops.cast(y, code)


@register("RandomUniform")
def random_uniform(node, inputs, opset):
    return _random_tensor(node, node.attr("shape"), node.attr("dtype", 1), "uniform")


@register("RandomNormal")
def random_normal(node, inputs, opset):
    return _random_tensor(node, node.attr("shape"), node.attr("dtype", 1), "normal")


@register("RandomUniformLike")
def random_uniform_like(node, inputs, opset):
    x = inputs[0]
    return _random_tensor(node, x.shape, node.attr("dtype") or in_type(node, 0, x), "uniform")


@register("RandomNormalLike")
def random_normal_like(node, inputs, opset):
    x = inputs[0]
    return _random_tensor(node, x.shape, node.attr("dtype") or in_type(node, 0, x), "normal")


@register("Bernoulli")
def bernoulli(node, inputs, opset):
    p = tensor(node, inputs[0])
    _seeded(node)
    u = ops.random_uniform(ops.empty(p.shape, sdt.float32, p.device))
    pf = p if p.dtype == sdt.float32 else ops.cast(p, sdt.float32)
    t = node.attr("dtype") or in_type(node, 0, inputs[0])
    return ops.cast(ops.lt(u, pf), ot.storage(t))


@register("Multinomial")
def multinomial(node, inputs, opset):
    logits = tensor(node, inputs[0])  # (B, classes), unnormalised log-probabilities
    n = node.attr("sample_size", 1)
    _seeded(node)
    p = ops.softmax(logits if logits.dtype == sdt.float32 else ops.cast(logits, sdt.float32), -1)
    cdf = host(p).cumsum(axis=-1)
    u = host(ops.random_uniform(ops.empty((p.shape[0], n), sdt.float32, p.device)))
    idx = np.minimum((u[:, :, None] > cdf[:, None, :]).sum(-1), p.shape[1] - 1)
    t = node.attr("dtype", 6)
    return host_to_tensor(idx.astype(ot.np_dtype(t)), p.device)


# -- BitCast --------------------------------------------------------------------------------------------------------


@register("BitCast")
def bitcast(node, inputs, opset):
    # reinterpreting memory has no arithmetic equivalent: the bytes are read, viewed as the new type and written back
    x = inputs[0]
    src = in_type(node, 0, x)
    arr = ot.wrap_host(host(x), src)
    out = arr.view(ot.np_dtype(node.attr("to")))
    return out if isinstance(x, np.ndarray) else host_to_tensor(out, node.rt.device)
