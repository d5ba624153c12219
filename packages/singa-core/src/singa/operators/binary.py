"""Autograd operators of two or more inputs, element-wise with numpy broadcasting: arithmetic (`Add`, `Mul`, `Pow`,
`PRelu`, ...), comparisons and logic, the n-ary `Sum`, `Mean`, `Max`, `Min`, and `Where`."""

from __future__ import annotations

from typing import Any

import numpy as np

from singa import dtypes as _dt
from singa import ops
from singa.autograd_engine import Operator, _NoGrad, _Plain, back_broadcast, training
from singa.tensor import Tensor

# -- element-wise, two or more inputs (numpy broadcasting) ----------------------------------------------------------


class _Binary(_Plain):
    """Two-input element-wise operator with numpy broadcasting: forward is the `singa.ops` function named `_op`;
    while training it keeps `_save(a, b, y)` as `self.input` for backward (by default the three shapes)."""

    _op = "add"

    @staticmethod
    def _save(a: Tensor, b: Tensor, y: Tensor) -> tuple:
        return a.shape, b.shape, y.shape

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        y = getattr(ops, self._op)(a, b)
        if training:
            self.input = self._save(a, b, y)
        return y


class Add(_Binary):
    _op = "add"

    def backward(self, dy: Tensor) -> tuple:
        sa, sb, sy = self.input
        return back_broadcast(sy, sa, dy), back_broadcast(sy, sb, dy)


def add(a: Tensor, b: Tensor) -> Tensor:
    return Add()(a, b)[0]


class Sub(_Binary):
    _op = "sub"

    def backward(self, dy: Tensor) -> tuple:
        sa, sb, sy = self.input
        db = self._grad_for(1, sy, sb, lambda: ops.neg(dy))
        return back_broadcast(sy, sa, dy), db


def sub(a: Tensor, b: Tensor) -> Tensor:
    return Sub()(a, b)[0]


class Mul(_Binary):
    _op = "mul"
    _save = staticmethod(lambda a, b, y: (a, b))

    def backward(self, dy: Tensor) -> tuple:
        a, b = self.input
        return (self._grad_for(0, dy.shape, a.shape, lambda: ops.mul(dy, b)),
                self._grad_for(1, dy.shape, b.shape, lambda: ops.mul(dy, a)))


def mul(x: Tensor, y: Tensor) -> Tensor:
    return Mul()(x, y)[0]


class Div(_Binary):
    _op = "div"
    _save = staticmethod(lambda a, b, y: (b, y, a.shape))

    def backward(self, dy: Tensor) -> tuple:
        b, y, a_shape = self.input
        da = ops.div(dy, b)
        # d(a/b)/db = -a / b^2 = -(dy / b) * y
        return (self._grad_for(0, dy.shape, a_shape, lambda: da),
                self._grad_for(1, dy.shape, b.shape, lambda: ops.neg(ops.mul(da, y))))


def div(a: Tensor, b: Tensor) -> Tensor:
    return Div()(a, b)[0]


class Pow(_Binary):
    _op = "pow"
    _save = staticmethod(lambda a, b, y: (a, b, y))

    def backward(self, dy: Tensor) -> tuple:
        a, b, y = self.input
        # d/da = b * a^(b-1) (not y * b / a, which fails at a = 0); d/db = a^b * ln(a)
        return (self._grad_for(0, dy.shape, a.shape, lambda: ops.mul(dy, ops.mul(b, ops.pow(a, ops.sub(b, 1))))),
                self._grad_for(1, dy.shape, b.shape, lambda: ops.mul(dy, ops.mul(y, ops.log(a)))))


def pow(a: Tensor, b: Tensor) -> Tensor:
    return Pow()(a, b)[0]


class PRelu(_Binary):
    """y = x for x >= 0, slope * x otherwise (slope broadcasts against x)."""

    _op = "prelu"
    _save = staticmethod(lambda x, slope, y: (x, slope))

    def forward(self, x: Tensor, slope: Tensor) -> Tensor:  # SINGA's argument names
        return super().forward(x, slope)

    def backward(self, dy: Tensor) -> tuple:
        x, slope = self.input
        neg = ops.lt(x, 0)
        return (self._grad_for(0, dy.shape, x.shape, lambda: ops.where(neg, ops.mul(dy, slope), dy)),
                self._grad_for(1, dy.shape, slope.shape, lambda: ops.where(neg, ops.mul(dy, x), 0)))


def prelu(x: Tensor, slope: Tensor) -> Tensor:
    return PRelu()(x, slope)[0]


def _bool_like(r: Tensor, x: Tensor) -> Tensor:
    """A boolean result as bool for a bool x, else as 0/1 in x's dtype (like Tensor's own operators)."""
    return r if x.dtype == _dt.bool_ else ops.cast(r, x.dtype)


def _as_bool(t: Tensor) -> Tensor:
    return t if t.dtype == _dt.bool_ else ops.cast(t, _dt.bool_)


class _Compare(_Binary):
    """A comparison: 0/1 in the operands' dtype (bool for bool operands), like Tensor's own operators. No gradient."""

    _op = "lt"

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return _bool_like(getattr(ops, self._op)(x, y), x)

    def backward(self, dy: Tensor) -> tuple:
        return None, None


class Less(_Compare):
    _op = "lt"


def less(x: Tensor, y: Tensor) -> Tensor:
    return Less()(x, y)[0]


class Greater(_Compare):
    _op = "gt"


def greater(x: Tensor, y: Tensor) -> Tensor:
    return Greater()(x, y)[0]


class Equal(_Compare):
    _op = "eq"


def equal(x: Tensor, y: Tensor) -> Tensor:
    return Equal()(x, y)[0]


class _Logical(_Binary):
    """Logical operators: bool operands give bool; numbers are read as x != 0 and give 0/1 in their dtype."""

    _op = "logical_and"

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return _bool_like(getattr(ops, self._op)(_as_bool(a), _as_bool(b)), a)

    def backward(self, dy: Tensor) -> tuple:
        return None, None


class And(_Logical):
    _op = "logical_and"


class Or(_Logical):
    _op = "logical_or"


class Xor(_Logical):
    _op = "logical_xor"


class Not(_NoGrad):
    def forward(self, x: Tensor) -> Tensor:
        return _bool_like(ops.logical_not(_as_bool(x)), x)


def _and(a: Tensor, b: Tensor) -> Tensor:
    return And()(a, b)[0]


def _or(a: Tensor, b: Tensor) -> Tensor:
    return Or()(a, b)[0]


def _xor(a: Tensor, b: Tensor) -> Tensor:
    return Xor()(a, b)[0]


def _not(x: Tensor) -> Tensor:
    return Not()(x)[0]


class Sum(_Plain):
    """Element-wise sum of any number of tensors (broadcasting)."""

    def _combine(self, xs: tuple) -> Tensor:
        y = xs[0]
        for x in xs[1:]:
            y = ops.add(y, x)
        return y

    def forward(self, *l: Tensor) -> Tensor:  # noqa: E741 - SINGA's parameter name
        if not l:
            raise ValueError(f"{type(self).__name__}: needs at least one tensor")
        self.shapes = [x.shape for x in l]
        return self._combine(l)

    def _scale(self, dy: Tensor) -> Tensor:
        return dy

    def backward(self, dy: Tensor) -> tuple:
        g = self._scale(dy)
        return tuple(back_broadcast(dy.shape, s, g) for s in self.shapes)


def sum(*l: Tensor) -> Tensor:  # noqa: E741 - SINGA's parameter name
    return Sum()(*l)[0]


class Mean(Sum):
    """Element-wise mean of any number of tensors (broadcasting)."""

    def _combine(self, xs: tuple) -> Tensor:
        return ops.mul(super()._combine(xs), 1.0 / len(xs))

    def _scale(self, dy: Tensor) -> Tensor:
        return ops.mul(dy, 1.0 / len(self.shapes))


def mean(*l: Tensor) -> Tensor:  # noqa: E741 - SINGA's parameter name
    return Mean()(*l)[0]


def add_all(*xs: Tensor) -> Tensor:
    """Sum of the tensors, as a chain of recorded additions."""
    if not xs:
        raise ValueError("add_all: needs at least one tensor")
    y = xs[0]
    for x in xs[1:]:
        y = add(y, x)
    return y


class Max(_Plain):
    """Element-wise maximum of any number of tensors (broadcasting); a tie sends the gradient to the first."""

    _pick = "maximum"

    def forward(self, *x: Tensor) -> Tensor:
        if not x:
            raise ValueError(f"{type(self).__name__}: needs at least one tensor")
        m = x[0]
        pick = getattr(ops, self._pick)
        for t in x[1:]:
            m = pick(m, t)
        if training:
            self.input = (tuple(x), m)
        return m

    def backward(self, dy: Tensor) -> tuple:
        xs, m = self.input
        taken = None
        out = []
        for i, x in enumerate(xs):
            hit = ops.eq(x, m)
            if hit.shape != m.shape:
                hit = ops.copy(ops.broadcast_to(hit, m.shape))
            if taken is not None:
                hit = ops.logical_and(hit, ops.logical_not(taken))
            taken = hit if taken is None else ops.logical_or(taken, hit)
            out.append(back_broadcast(m.shape, x.shape, ops.where(hit, dy, 0)) if self._input_needs_grad(i) else None)
        return tuple(out)


def max(*l: Tensor) -> Tensor:  # noqa: E741 - SINGA's parameter name
    return Max()(*l)[0]


class Min(Max):
    """Element-wise minimum of any number of tensors (broadcasting)."""

    _pick = "minimum"


def min(*l: Tensor) -> Tensor:  # noqa: E741 - SINGA's parameter name
    return Min()(*l)[0]


class Where(Operator):
    """condition ? a : b, broadcasting all three; condition is fixed at construction (no gradient)."""

    def __init__(self, condition: Any) -> None:
        super().__init__()
        self.condition = condition

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        cond = self.condition
        if not isinstance(cond, Tensor):
            cond = ops.from_numpy(np.asarray(cond, dtype=bool), a.device, _dt.bool_)
        cond = _as_bool(cond)
        y = ops.where(cond, a, b)
        if training:
            self.input = (cond, a.shape, b.shape)
        return y

    def backward(self, dy: Tensor) -> tuple:
        cond, sa, sb = self.input
        return (self._grad_for(0, dy.shape, sa, lambda: ops.where(cond, dy, 0)),
                self._grad_for(1, dy.shape, sb, lambda: ops.where(cond, 0, dy)))


def where(x: Tensor, y: Tensor, condition: Any) -> Tensor:
    return Where(condition)(x, y)[0]
