"""Normalisation, softmax and losses of `singa.ops`: batch normalisation (train, infer, backward), layer
normalisation, softmax and log-softmax with their backward passes, label checks and softmax cross-entropy."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from singa import graph as _graph
from singa.backend import View
from singa.ops_conv import _float_pair
from singa.ops_core import (
    _FLOATS,
    _INTS,
    _NOPARAMS,
    SCALAR_TYPES,
    _as_strided,
    _axis,
    _contiguous_input,
    _empty,
    _run,
    _same_device,
    _same_dtype,
    _supported,
    _table,
    _tensor,
    assign,
    copy,
    fill,
    is_contiguous,
)
from singa.ops_shape import broadcast_to, reshape
from singa.tensor import Tensor

# -- normalisation, softmax, losses -------------------------------------------------------------------------------


def _bn_check(op: str, x: Tensor, **per_channel: Tensor) -> None:
    _tensor(op, x, "x")
    _supported(op, x.dtype, _FLOATS)
    if len(x.shape) not in (2, 4):
        raise ValueError(f"{op}: x must be (N, C) or (N, C, H, W), got shape {x.shape}")
    C = x.shape[1]
    for what, t in per_channel.items():
        _tensor(op, t, what)
        _same_device(op, x, t)
        _same_dtype(op, x, t)
        if t.shape != (C,):
            raise ValueError(f"{op}: {what} shape {t.shape} does not match the {C} channels of x {x.shape}")


def batchnorm_train(x: Tensor, scale: Tensor, bias: Tensor, running_mean: Tensor, running_var: Tensor,
                    momentum: float = 0.9, eps: float = 1e-5) -> tuple:
    """Batch normalisation with batch statistics over (N, H, W); updates running_mean/var in place
    (r = momentum * r + (1 - momentum) * batch). Returns (y, saved_mean, saved_invstd) for the backward."""
    op = "batchnorm_train"
    _bn_check(op, x, scale=scale, bias=bias, running_mean=running_mean, running_var=running_var)
    if math.prod(x.shape) == 0:
        raise ValueError(f"{op}: cannot compute batch statistics of an empty batch {x.shape}")
    dev = x.device
    C = x.shape[1]
    y = _empty(x.shape, x.dtype, dev)
    saved_mean = _empty((C,), x.dtype, dev)
    saved_invstd = _empty((C,), x.dtype, dev)
    rm = running_mean if is_contiguous(running_mean) else copy(running_mean)
    rv = running_var if is_contiguous(running_var) else copy(running_var)
    _table(dev)[op](y, rm, rv, saved_mean, saved_invstd, _contiguous_input(x), _contiguous_input(scale),
                  _contiguous_input(bias), momentum=float(momentum), eps=float(eps))
    if rm is not running_mean:
        assign(running_mean, rm)
    if rv is not running_var:
        assign(running_var, rv)
    return y, saved_mean, saved_invstd


def batchnorm_infer(x: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor, eps: float = 1e-5) -> Tensor:
    """y = (x - mean) / sqrt(var + eps) * scale + bias, per channel."""
    op = "batchnorm_infer"
    _bn_check(op, x, scale=scale, bias=bias, mean=mean, var=var)
    ins = tuple(_contiguous_input(t) for t in (x, scale, bias, mean, var))
    return _run(op, op, x.dtype, x.shape, x.device, ins, {"eps": float(eps)}, None)


def batchnorm_backward(dy: Tensor, x: Tensor, scale: Tensor, saved_mean: Tensor, saved_invstd: Tensor) -> tuple:
    """Gradients (dx, dscale, dbias) of batchnorm_train."""
    op = "batchnorm_backward"
    _bn_check(op, x, scale=scale, saved_mean=saved_mean, saved_invstd=saved_invstd)
    _tensor(op, dy, "dy")
    _same_device(op, x, dy)
    _same_dtype(op, x, dy)
    if dy.shape != x.shape:
        raise ValueError(f"{op}: dy shape {dy.shape} does not match x {x.shape}")
    dev = x.device
    C = x.shape[1]
    dx = _empty(x.shape, x.dtype, dev)
    dscale = _empty((C,), x.dtype, dev)
    dbias = _empty((C,), x.dtype, dev)
    if math.prod(x.shape):
        _table(dev)[op](dx, dscale, dbias, *(_contiguous_input(t) for t in (dy, x, scale, saved_mean, saved_invstd)))
    return dx, dscale, dbias


def layer_norm(x: Tensor, scale: Tensor | None = None, bias: Tensor | None = None, axis: int = -1,
               eps: float = 1e-5) -> tuple:
    """Layer normalisation over the axes from `axis` to the last: (y, mean, invstd), y of x's shape, mean and
    invstd = 1 / sqrt(var + eps) of shape x.shape[:axis] (the biased variance, as ONNX LayerNormalization and
    torch.nn.LayerNorm). `scale` and `bias` broadcast to x.shape[axis:] (None: 1 and 0)."""
    op = "layer_norm"
    _tensor(op, x, "x")
    _supported(op, x.dtype, _FLOATS)
    nd = len(x.shape)
    if nd == 0:
        raise ValueError(f"{op}: x must have at least one axis, got a 0-d tensor")
    ax = _axis(op, axis, nd, x.shape)
    lead, norm = x.shape[:ax], x.shape[ax:]
    rows, cols = math.prod(lead), math.prod(norm)
    vecs = []
    for what, t in (("scale", scale), ("bias", bias)):
        if t is not None:
            _tensor(op, t, what)
            _same_device(op, x, t)
            _same_dtype(op, x, t)
            if t.shape != norm:
                try:
                    t = broadcast_to(t, norm)
                except ValueError:
                    raise ValueError(f"{op}: {what} of shape {t.shape} does not broadcast to the normalised shape "
                                     f"{norm} of x {x.shape} (axis {axis})") from None
            t = _contiguous_input(t)
            t = _as_strided(t, (cols,), (1,), t.offset)
        vecs.append(t)
    dev = x.device
    y = _empty(x.shape, x.dtype, dev)
    mean, invstd = _empty(lead, x.dtype, dev), _empty(lead, x.dtype, dev)
    if rows and cols:
        xc = _contiguous_input(x)
        dt = x.dtype
        _table(dev)[op](View(y.buffer, dt, (rows, cols), (cols, 1), 0), View(mean.buffer, dt, (rows,), (1,), 0),
                        View(invstd.buffer, dt, (rows,), (1,), 0),
                        View(xc.buffer, dt, (rows, cols), (cols, 1), xc.offset), *vecs, eps=float(eps))
    elif rows:  # nothing to normalise: NaN statistics, as a mean over no elements
        fill(mean, math.nan)
        fill(invstd, math.nan)
    return y, mean, invstd


def _softmax_like(op: str, kname: str, x: Tensor, axis: int) -> Tensor:
    _tensor(op, x)
    _supported(op, x.dtype, _FLOATS)
    ax = _axis(op, axis, len(x.shape), x.shape)
    return _run(op, kname, x.dtype, x.shape, x.device, (_contiguous_input(x),), {"axis": ax}, None)


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    return _softmax_like("softmax", "softmax", x, axis)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    return _softmax_like("log_softmax", "log_softmax", x, axis)


def _softmax_grad(op: str, dy: Tensor, y: Tensor, axis: int) -> Tensor:
    _tensor(op, dy, "dy")
    _tensor(op, y, "y")
    _float_pair(op, dy, y)
    if dy.shape != y.shape:
        raise ValueError(f"{op}: dy shape {dy.shape} does not match y {y.shape}")
    ax = _axis(op, axis, len(y.shape), y.shape)
    return _run(op, op, y.dtype, y.shape, y.device, (_contiguous_input(dy), _contiguous_input(y)), {"axis": ax},
                None)


def softmax_backward(dy: Tensor, y: Tensor, axis: int = -1) -> Tensor:
    """dx from dy and the softmax output y."""
    return _softmax_grad("softmax_backward", dy, y, axis)


def log_softmax_backward(dy: Tensor, y: Tensor, axis: int = -1) -> Tensor:
    """dx from dy and the log-softmax output y."""
    return _softmax_grad("log_softmax_backward", dy, y, axis)


def check_labels(op: str, labels: Tensor, classes: int) -> None:
    """Class labels must be whole numbers in [0, classes): else an error naming the first bad label and its position
    (no wrapping of -1 to the last class, no truncation of 2.5). Integer labels are checked by the device
    (`Device.find_label_outside`: a copy to the host and numpy, or the backend's own scan), float ones on the host; in
    a step recorded for graph mode the check is part of the graph and runs at every replay (`graph.host_check`), before
    any kernel of the step, on every backend."""
    _tensor(op, labels, "labels")

    def check(view: Any) -> None:
        dev = view.buffer.device
        if view.dtype in _INTS:
            i = dev.find_label_outside(view, classes)
            if i >= 0:
                v = int(dev.read(view).reshape(-1)[i])
                raise IndexError(f"{op}: label {v} at position {i} is outside [0, {classes}) ({classes} classes)")
            return
        arr = dev.read(view).reshape(-1)
        if arr.dtype.kind == "f":
            whole = np.isfinite(arr) & (np.floor(arr) == arr)
            if not whole.all():
                i = int(np.argmin(whole))
                raise ValueError(f"{op}: label {arr[i].item()!r} at position {i} is not a whole number (class labels "
                                 f"are integers in [0, {classes}))")
        bad = (arr < 0) | (arr >= classes)
        if bad.any():
            i = int(np.argmax(bad))
            v = arr[i].item()
            raise IndexError(f"{op}: label {int(v) if float(v).is_integer() else v} at position {i} is outside "
                             f"[0, {classes}) ({classes} classes)")

    _graph.host_check(f"{op}:check_labels", check, labels)


def _xent_check(op: str, x: Tensor, target: Tensor, labels: bool = True) -> Tensor:
    _tensor(op, x, "x")
    _tensor(op, target, "target")
    _supported(op, x.dtype, _FLOATS)
    _same_device(op, x, target)
    if len(x.shape) != 2:
        raise ValueError(f"{op}: x must be 2-D (N, C), got shape {x.shape}")
    N, C = x.shape
    if target.dtype in _INTS:
        if target.shape == (N, 1):
            target = reshape(target, (N,))
        if target.shape != (N,):
            raise ValueError(f"{op}: label target shape {target.shape} does not match x {x.shape} (expected ({N},))")
        if labels:
            check_labels(op, target, C)
    else:
        _same_dtype(op, x, target)
        if target.shape != (N, C):
            raise ValueError(f"{op}: target shape {target.shape} does not match x {x.shape} (expected ({N},) "
                             f"int labels or ({N}, {C}) distributions)")
    return _contiguous_input(target)


def softmax_cross_entropy(x: Tensor, target: Tensor) -> Tensor:
    """Per-row loss -sum(t * log_softmax(x)) of x (N, C); target: int labels (N,) or distributions (N, C)."""
    op = "softmax_cross_entropy"
    target = _xent_check(op, x, target)
    return _run(op, op, x.dtype, (x.shape[0],), x.device, (_contiguous_input(x), target), _NOPARAMS, None)


def softmax_cross_entropy_backward(dloss: Any, x: Tensor, target: Tensor, *, labels_checked: bool = False) -> Tensor:
    """dx = (softmax(x) - t) * dloss[:, None]; dloss is (N,) or a number. `labels_checked`: the caller's forward
    checked these very labels (check_labels), unchanged since; autograd's loss passes it, which saves a host read of
    the labels per step."""
    op = "softmax_cross_entropy_backward"
    target = _xent_check(op, x, target, labels=not labels_checked)
    N = x.shape[0]
    if isinstance(dloss, SCALAR_TYPES):
        dloss = fill(_empty((N,), x.dtype, x.device), dloss)
    _tensor(op, dloss, "dloss")
    _same_device(op, x, dloss)
    _same_dtype(op, x, dloss)
    if dloss.shape != (N,):
        raise ValueError(f"{op}: dloss shape {dloss.shape} does not match the {N} rows of x {x.shape}")
    return _run(op, op, x.dtype, x.shape, x.device, (_contiguous_input(dloss), _contiguous_input(x), target),
                _NOPARAMS, None)
