"""Autograd losses (SINGA's: a tensor of shape (1,), averaged over the batch): softmax cross-entropy, cross-entropy,
binary cross-entropy, mean square error and the ranking loss."""

from __future__ import annotations

from typing import Any

import numpy as np

from singa import dtypes as _dt
from singa import ops
from singa.autograd_engine import _INTS, Operator, _expand, _full, _loss_shape, _scalar_grad, back_broadcast, training
from singa.tensor import Tensor

# -- losses (SINGA's: a tensor of shape (1,), averaged over the batch) ------------------------------------------------


def _class_target(x: Tensor, t: Any) -> Tensor:
    """Targets for x (N, C): int labels (N,) stay labels; one-hot / probabilities (N, C) take x's dtype; float
    labels of shape (N,) (as SINGA scripts sometimes pass) become int labels."""
    if not isinstance(t, Tensor):
        t = ops.from_numpy(np.asarray(t), x.device)
    N, C = x.shape
    if t.shape == (N, C) and not (C == 1 and t.dtype in _INTS):
        return t if t.dtype == x.dtype else ops.cast(t, x.dtype)
    if t.shape in ((N,), (N, 1)):
        t = ops.reshape(t, (N,))
        if t.dtype in _INTS:
            return t  # checked by the loss that reads them (ops.softmax_cross_entropy, _dense_target)
        ops.check_labels("loss target", t, C)  # before the cast, which would truncate 2.5 and -0.5
        return ops.cast(t, _dt.int64)
    raise ValueError(f"target of shape {t.shape} does not match predictions of shape {x.shape} (expected ({N},) "
                     f"labels or ({N}, {C}) one-hot / probabilities)")


def _dense_target(x: Tensor, t: Any) -> Tensor:
    """Targets as x-shaped, x-dtype values (labels become one-hot)."""
    if not isinstance(t, Tensor):
        t = ops.from_numpy(np.asarray(t), x.device)
    if len(x.shape) == 2 and t.shape != x.shape:
        t = _class_target(x, t)
        if t.dtype in _INTS:
            ops.check_labels("loss target", t, x.shape[1])
            ar = ops.from_numpy(np.arange(x.shape[1], dtype=np.int64).reshape(1, -1), x.device, _dt.int64)
            return ops.cast(ops.eq(ops.unsqueeze(ops.cast(t, _dt.int64), 1), ar), x.dtype)
        return t
    if t.shape != x.shape:
        t = _expand(t, x.shape)
    return t if t.dtype == x.dtype else ops.cast(t, x.dtype)


def _batch(x: Tensor) -> int:
    """N, the number of samples a loss averages over: x's first dimension (1 for a 0-d x)."""
    return x.shape[0] if x.shape else 1


class _Loss(Operator):
    """A loss of predictions x against targets t, as a (1,) tensor. Both of SINGA's forms: the target given at
    construction (`MeanSquareError(t)(x)`, SINGA 4) or as a second input (`MeanSquareError()(x, t)`, SINGA 3, whose
    backward then returns (dx, None)). `_loss(x, t)` returns the loss and what `_grad(dy)` needs (kept as
    `self.saved` while training), with t converted by `_target`."""

    _target = staticmethod(_dense_target)

    def __init__(self, t: Any = None) -> None:
        super().__init__()
        self.t = t

    def _loss(self, x: Tensor, t: Tensor) -> tuple:
        raise NotImplementedError

    def _grad(self, dy: Any) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor, t: Tensor | None = None) -> Tensor:
        target = self.t if t is None else t
        if target is None:
            raise ValueError(f"{type(self).__name__}: no target; give it to the constructor ({type(self).__name__}(t)"
                             f"(x)) or as the second input ({type(self).__name__}()(x, t))")
        loss, saved = self._loss(x, self._target(x, target))
        if training:
            self.saved = saved
        return _loss_shape(loss)

    def backward(self, dy: Any = 1.0) -> Tensor | tuple:
        dx = self._grad(dy)
        return (dx, None) if len(self.src) > 1 else dx


class SoftMaxCrossEntropy(_Loss):
    """mean over the batch of -sum(t * log_softmax(x)); x (N, C) logits, t int labels or (N, C) probabilities."""

    @staticmethod
    def _target(x: Tensor, t: Any) -> Tensor:
        if len(x.shape) != 2:
            raise ValueError(f"softmax_cross_entropy: x must be (N, C) logits, got shape {x.shape}")
        return _class_target(x, t)

    def _loss(self, x: Tensor, t: Tensor) -> tuple:
        return ops.mean(ops.softmax_cross_entropy(x, t)), (x, t)

    def _grad(self, dy: Any = 1.0) -> Tensor:
        x, t = self.saved
        n = x.shape[0]
        g = ops.mul(ops.broadcast_to(_scalar_grad(dy, x), (n,)), 1.0 / n)
        return ops.softmax_cross_entropy_backward(g, x, t, labels_checked=True)  # the forward checked t


def softmax_cross_entropy(x: Tensor, t: Any) -> Tensor:
    return SoftMaxCrossEntropy(t)(x)[0]


class CrossEntropy(_Loss):
    """-sum(t * log(x)) / N for probabilities x (N, C); t one-hot / probabilities or int labels."""

    def _loss(self, x: Tensor, t: Tensor) -> tuple:
        n = _batch(x)
        return ops.mul(ops.sum(ops.mul(t, ops.log(x))), -1.0 / n), (x, t, n)

    def _grad(self, dy: Any = 1.0) -> Tensor:
        x, t, n = self.saved
        return ops.mul(ops.div(t, x), ops.mul(_scalar_grad(dy, x), -1.0 / n))


def cross_entropy(x: Tensor, t: Any) -> Tensor:
    return CrossEntropy(t)(x)[0]


class BinaryCrossEntropy(_Loss):
    """-sum(t log(x + 1e-4) + (1 - t) log(1 - x + 1e-4)) / N for probabilities x (SINGA keeps the 1e-4 guard)."""

    _EPS = 1e-4

    def _loss(self, x: Tensor, t: Tensor) -> tuple:
        n = _batch(x)
        pos = ops.mul(t, ops.log(ops.add(x, self._EPS)))
        neg = ops.mul(ops.sub(1, t), ops.log(ops.sub(1 + self._EPS, x)))
        return ops.mul(ops.sum(ops.add(pos, neg)), -1.0 / n), (x, t, n)

    def _grad(self, dy: Any = 1.0) -> Tensor:
        x, t, n = self.saved
        g = ops.sub(ops.div(ops.sub(1, t), ops.sub(1 + self._EPS, x)), ops.div(t, ops.add(x, self._EPS)))
        return ops.mul(g, ops.mul(_scalar_grad(dy, x), 1.0 / n))


def binary_cross_entropy(x: Tensor, t: Any) -> Tensor:
    return BinaryCrossEntropy(t)(x)[0]


class MeanSquareError(_Loss):
    """sum((x - t)^2) / (2 N) (SINGA's definition; N is the batch size)."""

    def _loss(self, x: Tensor, t: Tensor) -> tuple:
        err = ops.sub(x, t)
        n = _batch(x)
        return ops.mul(ops.sum(ops.square(err)), 0.5 / n), (err, n)

    def _grad(self, dy: Any = 1.0) -> Tensor:
        err, n = self.saved
        return ops.mul(err, ops.mul(_scalar_grad(dy, err), 1.0 / n))


def mse_loss(x: Tensor, t: Any) -> Tensor:
    return MeanSquareError(t)(x)[0]


class RankingLoss(Operator):
    """sum(max(0, M - pos + neg)) / N: a margin ranking loss over N pairs of scores."""

    def __init__(self, M: float = 0.2) -> None:
        super().__init__()
        self.M = M

    def forward(self, pos: Tensor, neg: Tensor) -> Tensor:
        val = ops.add(ops.sub(neg, pos), self.M)
        n = _batch(pos)
        if training:
            self.saved = (ops.gt(val, 0), n, pos.shape, neg.shape, _full((), 0, pos))
        return _loss_shape(ops.mul(ops.sum(ops.relu(val)), 1.0 / n))

    def backward(self, dy: Any = 1.0) -> tuple:
        active, n, sp, sn, like = self.saved
        g = ops.where(active, ops.mul(_scalar_grad(dy, like), 1.0 / n), 0)
        return back_broadcast(g.shape, sp, ops.neg(g)), back_broadcast(g.shape, sn, g)


def ranking_loss(pos: Tensor, neg: Tensor, M: float = 0.2) -> Tensor:
    return RankingLoss(M)(pos, neg)[0]
