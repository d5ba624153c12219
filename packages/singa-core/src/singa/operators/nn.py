"""Autograd operators of neural-network layers: `Dropout`, convolution (`_Conv2d`), pooling (`_Pooling2d`), batch
normalisation (`_BatchNorm2d`) and `LayerNorm`."""

from __future__ import annotations

from typing import Any

import numpy as np

from singa import ops
from singa.autograd_engine import Operator, _zeros, training
from singa.tensor import Tensor

# -- regularisation -------------------------------------------------------------------------------------------------


class Dropout(Operator):
    """Zero each element with probability `ratio` and scale the rest by 1 / (1 - ratio) while training.

    The mask comes from the device's counter-based generator (device.set_rand_seed), so runs are reproducible and
    identical across backends; `seed` is kept for SINGA's signature. Identity when not training."""

    def __init__(self, seed: int = 0, ratio: float = 0.5) -> None:
        super().__init__()
        self.seed = seed
        self.ratio = ratio

    def forward(self, x: Tensor) -> Tensor:
        if not training or self.ratio <= 0:
            self.mask = None
            return x
        if self.ratio >= 1:
            self.mask = _zeros(x.shape, x)
        else:
            keep = ops.random_bernoulli(ops.empty(x.shape, x.dtype, x.device), 1.0 - self.ratio)
            self.mask = ops.mul(keep, 1.0 / (1.0 - self.ratio))
        return ops.mul(x, self.mask)

    def backward(self, dy: Tensor) -> Tensor:
        mask = getattr(self, "mask", None)
        return dy if mask is None else ops.mul(dy, mask)


def dropout(x: Tensor, seed: int = 0, ratio: float = 0.5) -> Tensor:
    return Dropout(seed, ratio)(x)[0]


# -- convolution, pooling, normalisation ----------------------------------------------------------------------------


def _pads4(padding: Any) -> tuple:
    """(top, left, bottom, right) from an int, (ph, pw) or four values."""
    if isinstance(padding, (int, np.integer)):
        return (int(padding),) * 4
    p = tuple(int(v) for v in padding)
    if len(p) == 2:
        return (p[0], p[1], p[0], p[1])
    if len(p) != 4:
        raise ValueError(f"padding must be an int, (ph, pw) or (top, left, bottom, right), got {padding!r}")
    return p


def _pair(v: Any) -> tuple:
    return (int(v), int(v)) if isinstance(v, (int, np.integer)) else tuple(int(e) for e in v)


class _Conv2d(Operator):
    """2-D cross-correlation of x (N, C, H, W) with W (K, C/group, kh, kw), plus an optional bias (K,)."""

    def __init__(self, stride: Any = (1, 1), padding: Any = (0, 0, 0, 0), dilation: Any = (1, 1),
                 group: int = 1) -> None:
        super().__init__()
        self.stride = _pair(stride)
        self.padding = _pads4(padding)
        self.dilation = _pair(dilation)
        self.group = int(group)

    def _geom(self) -> dict:
        return {"stride": self.stride, "padding": self.padding, "dilation": self.dilation, "groups": self.group}

    def forward(self, x: Tensor, W: Tensor, b: Tensor | None = None) -> Tensor:
        if b is not None and b.shape != (W.shape[0],):
            b = ops.reshape(b, (W.shape[0],))
        y = ops.conv2d(x, W, b, **self._geom())
        if training:
            self.input = (x, W)
        return y

    def backward(self, dy: Tensor) -> tuple:
        x, W = self.input
        geom = self._geom()
        dx = ops.conv2d_backward_data(dy, W, x.shape, **geom) if self._input_needs_grad(0) else None
        dW = ops.conv2d_backward_weight(dy, x, W.shape, **geom) if self._input_needs_grad(1) else None
        if len(self.src) < 3:
            return dx, dW
        return dx, dW, ops.sum(dy, (0, 2, 3))


def conv2d(x: Tensor, W: Tensor, b: Tensor | None = None, stride: Any = (1, 1), padding: Any = (0, 0, 0, 0),
           dilation: Any = (1, 1), group: int = 1) -> Tensor:
    op = _Conv2d(stride, padding, dilation, group)
    return (op(x, W) if b is None else op(x, W, b))[0]


class _Pooling2d(Operator):
    """Max or average pooling of x (N, C, H, W); padding (top, left, bottom, right); PyTorch's ceil_mode rule."""

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = (0, 0, 0, 0), is_max: bool = True,
                 ceil_mode: bool = False, dilation: Any = (1, 1), count_include_pad: bool = True) -> None:
        super().__init__()
        self.kernel_size = _pair(kernel_size)
        self.stride = self.kernel_size if stride is None else _pair(stride)
        self.padding = _pads4(padding)
        self.is_max = is_max
        self.ceil_mode = ceil_mode
        self.dilation = _pair(dilation)
        self.count_include_pad = count_include_pad

    def _params(self) -> dict:
        return {"kernel": self.kernel_size, "stride": self.stride, "padding": self.padding,
                "dilation": self.dilation, "mode": "max" if self.is_max else "avg",
                "count_include_pad": self.count_include_pad}

    def forward(self, x: Tensor) -> Tensor:
        p = self._params()
        if self.is_max and training:
            y, idx = ops.pool2d(x, ceil_mode=self.ceil_mode, return_indices=True, **p)
        else:
            y, idx = ops.pool2d(x, ceil_mode=self.ceil_mode, **p), None
        if training:
            self.input = (x, idx)
        return y

    def backward(self, dy: Tensor) -> Tensor:
        x, idx = self.input
        return ops.pool2d_backward(dy, x, idx, **self._params())


def pooling_2d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = (0, 0, 0, 0), is_max: bool = True,
               ceil_mode: bool = False, dilation: Any = (1, 1), count_include_pad: bool = True) -> Tensor:
    return _Pooling2d(kernel_size, stride, padding, is_max, ceil_mode, dilation, count_include_pad)(x)[0]


class _BatchNorm2d(Operator):
    """Batch normalisation over every axis but 1 of x (N, C) or (N, C, H, W).

    While training it uses the batch statistics and updates running_mean / running_var in place
    (r = momentum * r + (1 - momentum) * batch); otherwise it normalises with the running statistics."""

    def __init__(self, running_mean: Tensor, running_var: Tensor, momentum: float = 0.9, eps: float = 1e-5,
                 name: str | None = None) -> None:
        super().__init__(name)
        self.running_mean = running_mean
        self.running_var = running_var
        self.momentum = momentum
        self.eps = eps

    def forward(self, x: Tensor, scale: Tensor, bias: Tensor) -> Tensor:
        C = x.shape[1]
        scale = scale if scale.shape == (C,) else ops.reshape(scale, (C,))
        bias = bias if bias.shape == (C,) else ops.reshape(bias, (C,))
        rm = self.running_mean if self.running_mean.shape == (C,) else ops.reshape(self.running_mean, (C,))
        rv = self.running_var if self.running_var.shape == (C,) else ops.reshape(self.running_var, (C,))
        if not training:
            return ops.batchnorm_infer(x, scale, bias, rm, rv, self.eps)
        y, mean, invstd = ops.batchnorm_train(x, scale, bias, rm, rv, self.momentum, self.eps)
        self.saved = (x, scale, mean, invstd)
        return y

    def backward(self, dy: Tensor) -> tuple:
        x, scale, mean, invstd = self.saved
        return ops.batchnorm_backward(dy, x, scale, mean, invstd)


def batchnorm_2d(x: Tensor, scale: Tensor, bias: Tensor, running_mean: Tensor, running_var: Tensor,
                 momentum: float = 0.9, eps: float = 1e-5) -> Tensor:
    return _BatchNorm2d(running_mean, running_var, momentum, eps)(x, scale, bias)[0]


class LayerNorm(Operator):
    """Layer normalisation over the axes from `axis` to the last (one `layer_norm` kernel forward). Outputs y, and
    the mean and invstd = 1 / sqrt(var + eps) with the normalised axes kept as 1 (ONNX LayerNormalization's optional
    outputs); only y carries a gradient. Inputs: x, then scale and bias where `has_scale` / `has_bias` say."""

    def __init__(self, axis: int = -1, eps: float = 1e-5, has_scale: bool = True, has_bias: bool = True) -> None:
        super().__init__()
        self.axis, self.eps = axis, eps
        self.has_scale, self.has_bias = has_scale, has_bias

    def forward(self, x: Tensor, *vecs: Tensor) -> tuple:
        if len(vecs) != self.has_scale + self.has_bias:
            raise ValueError(f"layer_norm: expected {self.has_scale + self.has_bias} of scale and bias, got "
                             f"{len(vecs)}")
        scale = vecs[0] if self.has_scale else None
        bias = vecs[-1] if self.has_bias else None
        y, mean, invstd = ops.layer_norm(x, scale, bias, self.axis, self.eps)
        ax = self.axis % len(x.shape)
        kept = x.shape[:ax] + (1,) * (len(x.shape) - ax)
        mean, invstd = ops.reshape(mean, kept), ops.reshape(invstd, kept)
        if training:
            self.saved = (x, scale, mean, invstd)
        return y, mean, invstd

    def backward(self, dy: Tensor, _dmean: Tensor, _dinvstd: Tensor) -> tuple:
        x, scale, mean, invstd = self.saved
        ax = self.axis % len(x.shape)
        axes = tuple(range(ax, len(x.shape)))
        xhat = ops.mul(ops.sub(x, mean), invstd)
        g = ops.mul(dy, scale) if scale is not None else dy
        # dx = invstd * (g - mean(g) - xhat * mean(g * xhat)) over the normalised axes
        mg = ops.mean(g, axes, keepdims=True)
        mgx = ops.mean(ops.mul(g, xhat), axes, keepdims=True)
        dx = ops.mul(ops.sub(ops.sub(g, mg), ops.mul(xhat, mgx)), invstd) if self._input_needs_grad(0) else None
        lead = tuple(range(ax))
        grads = [dx]
        if self.has_scale:
            grads.append(ops.sum(ops.mul(dy, xhat), lead) if lead else ops.mul(dy, xhat))
        if self.has_bias:
            grads.append(ops.sum(dy, lead) if lead else dy)
        return tuple(grads)


def layer_norm(x: Tensor, scale: Tensor | None = None, bias: Tensor | None = None, axis: int = -1,
               eps: float = 1e-5) -> Tensor:
    """Normalise over the axes from `axis` to the last (mean 0, variance 1, the biased variance), then scale and
    shift (scale and bias broadcast to x.shape[axis:]; None: 1 and 0)."""
    vecs = [t for t in (scale, bias) if t is not None]
    return LayerNorm(axis, eps, scale is not None, bias is not None)(x, *vecs)[0]
