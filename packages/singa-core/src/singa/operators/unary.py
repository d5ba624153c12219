"""Autograd operators of one input: element-wise math and activations (`ReLU`, `Sigmoid`, `Exp`, `Clip`, `Elu`, ...),
softmax and log-softmax, and `Cast`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from singa import ops
from singa.autograd_engine import _FLOATS, Operator, _is_float, _Plain, _to_dtype, _zeros, training
from singa.tensor import Tensor

# -- element-wise, one input ----------------------------------------------------------------------------------------


class _Unary(_Plain):
    """One-input element-wise operator: forward is the `singa.ops` function named `_op` (or `_fn`, where a class
    overrides it); backward is `_grad(dy, x, y)`; `_keep` says which of x and y forward saves for it."""

    _op = ""
    _keep = "x"

    def _fn(self, x: Tensor) -> Tensor:
        return getattr(ops, self._op)(x)

    def _grad(self, dy: Tensor, x: Tensor | None, y: Tensor | None) -> Tensor | None:
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        y = self._fn(x)
        if training:
            if "x" in self._keep:
                self.input = x
            if "y" in self._keep:
                self.output = y
        return y

    def backward(self, dy: Tensor) -> Tensor | None:
        return self._grad(dy, getattr(self, "input", None), getattr(self, "output", None))


class _Flat(_Unary):
    """A piecewise-constant function: the gradient is zero almost everywhere (SINGA returns zeros)."""

    _keep = ""

    def _grad(self, dy, x, y):
        return _zeros(dy.shape, dy)


def _forward_a(self, a: Tensor) -> Tensor:  # forward with SINGA's argument name `a` (Abs, Exp, Sign)
    return _Unary.forward(self, a)


def _unary(name: str, op: str | Callable, grad: Callable | None = None, *, keep: str | None = None,
           doc: str | None = None, base: type = _Unary, arg: str = "x") -> tuple[type, Callable]:
    """The operator class `name` and its function (`name` in lower case), which applies a new instance to a tensor.

    Forward is the `singa.ops` function named `op` (or `op` itself, a function of x); backward is grad(dy, x, y),
    where forward saves x, y or both as `keep` says (x when None; a `_Flat` base saves nothing and needs no grad).
    `arg` is the argument's name in forward and in the function, as SINGA spells it."""
    ns: dict = {"__module__": __name__, "__qualname__": name, "__doc__": doc}
    if isinstance(op, str):
        ns["_op"] = op
    else:
        ns["_fn"] = staticmethod(op)
    if grad is not None:
        ns["_grad"] = staticmethod(grad)
    if keep is not None:
        ns["_keep"] = keep
    if arg == "a":
        ns["forward"] = _forward_a
    elif arg != "x":
        raise ValueError(f"_unary: argument name {arg!r} (x or a)")
    cls = type(name, (base,), ns)

    if arg == "a":
        def function(a: Tensor) -> Tensor:
            return cls()(a)[0]
    else:
        def function(x: Tensor) -> Tensor:
            return cls()(x)[0]

    function.__name__ = function.__qualname__ = name.lower()
    function.__module__ = __name__
    return cls, function


def _gelu_grad(dy: Tensor, x: Tensor, y: Tensor | None) -> Tensor:
    # d/dx x * Phi(x) = Phi(x) + x * phi(x)
    cdf = ops.mul(ops.add(ops.erf(ops.mul(x, math.sqrt(0.5))), 1), 0.5)
    pdf = ops.mul(ops.exp(ops.mul(ops.square(x), -0.5)), 1 / math.sqrt(2 * math.pi))
    return ops.mul(dy, ops.add(cdf, ops.mul(x, pdf)))


def _gelu_tanh_grad(dy: Tensor, x: Tensor, y: Tensor | None) -> Tensor:
    # y = x/2 (1 + t), t = tanh(c (x + a x^3)): dy/dx = (1 + t)/2 + x/2 (1 - t^2) c (1 + 3 a x^2)
    c, a = math.sqrt(2 / math.pi), 0.044715
    x2 = ops.square(x)
    t = ops.tanh(ops.mul(ops.mul(x, ops.add(ops.mul(x2, a), 1.0)), c))
    slope = ops.mul(ops.mul(ops.sub(1.0, ops.square(t)), ops.add(ops.mul(x2, 3 * a * c), c)), ops.mul(x, 0.5))
    return ops.mul(dy, ops.add(ops.mul(ops.add(t, 1.0), 0.5), slope))


def _round_half_away(x: Tensor) -> Tensor:
    return ops.mul(ops.sign(x), ops.floor(ops.add(ops.abs(x), 0.5)))


# The operators without parameters: class, function = _unary(name, forward, gradient (dy, x, y), what it keeps).
# ReLU keeps its output (y > 0 exactly where x > 0), so that the input (often a batch-norm output) dies at once.
ReLU, relu = _unary("ReLU", "relu", lambda dy, x, y: ops.relu_grad(dy, y), keep="y")
Identity, identity = _unary("Identity", lambda x: x, lambda dy, x, y: dy, keep="")
Sigmoid, sigmoid = _unary("Sigmoid", "sigmoid", lambda dy, x, y: ops.sigmoid_grad(dy, y), keep="y")
Tanh, tanh = _unary("Tanh", "tanh", lambda dy, x, y: ops.tanh_grad(dy, y), keep="y")
Cos, cos = _unary("Cos", "cos", lambda dy, x, y: ops.neg(ops.mul(dy, ops.sin(x))))
Cosh, cosh = _unary("Cosh", "cosh", lambda dy, x, y: ops.mul(dy, ops.sinh(x)))
# acos' = -1 / sqrt(1 - x^2)
Acos, acos = _unary("Acos", "acos", lambda dy, x, y: ops.neg(ops.div(dy, ops.sqrt(ops.sub(1, ops.square(x))))))
Acosh, acosh = _unary("Acosh", "acosh", lambda dy, x, y: ops.div(dy, ops.sqrt(ops.sub(ops.square(x), 1))))
Sin, sin = _unary("Sin", "sin", lambda dy, x, y: ops.mul(dy, ops.cos(x)))
Sinh, sinh = _unary("Sinh", "sinh", lambda dy, x, y: ops.mul(dy, ops.cosh(x)))
Asin, asin = _unary("Asin", "asin", lambda dy, x, y: ops.div(dy, ops.sqrt(ops.sub(1, ops.square(x)))))
Asinh, asinh = _unary("Asinh", "asinh", lambda dy, x, y: ops.div(dy, ops.sqrt(ops.add(ops.square(x), 1))))
Tan, tan = _unary("Tan", "tan", lambda dy, x, y: ops.mul(dy, ops.add(ops.square(y), 1)), keep="y")
Atan, atan = _unary("Atan", "atan", lambda dy, x, y: ops.div(dy, ops.add(ops.square(x), 1)))
Atanh, atanh = _unary("Atanh", "atanh", lambda dy, x, y: ops.div(dy, ops.sub(1, ops.square(x))))
Abs, abs = _unary("Abs", "abs", lambda dy, x, y: ops.mul(dy, ops.sign(x)), arg="a")
Exp, exp = _unary("Exp", "exp", lambda dy, x, y: ops.mul(dy, y), keep="y", arg="a")
Log, log = _unary("Log", "log", lambda dy, x, y: ops.div(dy, x))
Sqrt, sqrt = _unary("Sqrt", "sqrt", lambda dy, x, y: ops.div(ops.mul(dy, 0.5), y), keep="y")
SoftPlus, softplus = _unary("SoftPlus", "softplus", lambda dy, x, y: ops.mul(dy, ops.sigmoid(x)))
SoftSign, softsign = _unary("SoftSign", "softsign", lambda dy, x, y: ops.div(dy, ops.square(ops.add(ops.abs(x), 1))))
Negative, negative = _unary("Negative", "neg", lambda dy, x, y: ops.neg(dy), keep="")
Reciprocal, reciprocal = _unary("Reciprocal", "reciprocal", lambda dy, x, y: ops.neg(ops.mul(dy, ops.square(y))),
                                keep="y")
Erf, erf = _unary("Erf", "erf",
                  lambda dy, x, y: ops.mul(dy, ops.mul(ops.exp(ops.neg(ops.square(x))), 2.0 / math.sqrt(math.pi))))
Gelu, gelu = _unary("Gelu", "gelu", _gelu_grad, doc="x * Phi(x) (the exact, erf-based GELU).")
GeluTanh, gelu_tanh = _unary("GeluTanh", "gelu_tanh", _gelu_tanh_grad,
                             doc="x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): GELU's tanh approximation "
                                 "(PyTorch's gelu(approximate='tanh'), GPT-2's).")
Sign, sign = _unary("Sign", "sign", base=_Flat, arg="a")
Ceil, ceil = _unary("Ceil", "ceil", base=_Flat)
Floor, floor = _unary("Floor", "floor", base=_Flat)
Round, round = _unary("Round", _round_half_away, base=_Flat,
                      doc="Round half away from zero (SINGA's Round; Rounde rounds half to even).")
Rounde, rounde = _unary("Rounde", "round", base=_Flat, doc="Round half to even (ONNX Round).")


class Clip(_Unary):
    """Clamp to [min, max] (None leaves that side open); the gradient passes where x is inside the interval."""

    def __init__(self, min: float | None, max: float | None) -> None:
        super().__init__()
        self.min = min
        self.max = max

    def _fn(self, x):
        return ops.clip(x, self.min, self.max)

    def _grad(self, dy, x, y):
        inside = None
        if self.min is not None:
            inside = ops.ge(x, self.min)
        if self.max is not None:
            upper = ops.le(x, self.max)
            inside = upper if inside is None else ops.logical_and(inside, upper)
        return dy if inside is None else ops.where(inside, dy, 0)


def clip(x: Tensor, min: float | None = None, max: float | None = None) -> Tensor:
    return Clip(min, max)(x)[0]


class Elu(_Unary):
    _keep = "xy"

    def __init__(self, alpha: float = 1.0) -> None:
        super().__init__()
        self.alpha = alpha

    def _fn(self, x):
        return ops.elu(x, self.alpha)

    def _grad(self, dy, x, y):
        # d/dx = 1 for x > 0, alpha * exp(x) = y + alpha otherwise
        return ops.where(ops.gt(x, 0), dy, ops.mul(dy, ops.add(y, self.alpha)))


def elu(x: Tensor, alpha: float = 1) -> Tensor:
    return Elu(alpha)(x)[0]


class SeLU(_Unary):
    _keep = "xy"

    def __init__(self, alpha: float = 1.67326, gamma: float = 1.0507) -> None:
        super().__init__()
        self.alpha = alpha
        self.gamma = gamma

    def _fn(self, x):
        return ops.selu(x, self.alpha, self.gamma)

    def _grad(self, dy, x, y):
        # gamma for x > 0; gamma * alpha * exp(x) = y + gamma * alpha otherwise
        return ops.where(ops.gt(x, 0), ops.mul(dy, self.gamma), ops.mul(dy, ops.add(y, self.gamma * self.alpha)))


def selu(x: Tensor, alpha: float = 1.67326, gamma: float = 1.0507) -> Tensor:
    return SeLU(alpha, gamma)(x)[0]


class LeakyRelu(_Unary):
    def __init__(self, a: float) -> None:
        super().__init__()
        self.a = a

    def _fn(self, x):
        return ops.leakyrelu(x, self.a)

    def _grad(self, dy, x, y):
        return ops.where(ops.ge(x, 0), dy, ops.mul(dy, self.a))


def leakyrelu(x: Tensor, a: float = 0.01) -> Tensor:
    return LeakyRelu(a)(x)[0]


class HardSigmoid(_Unary):
    """y = clip(alpha * x + gamma, 0, 1)."""

    def __init__(self, alpha: float = 0.2, gamma: float = 0.5) -> None:
        super().__init__()
        self.alpha = alpha
        self.gamma = gamma

    def _fn(self, x):
        return ops.hardsigmoid(x, self.alpha, self.gamma)

    def _grad(self, dy, x, y):
        z = ops.add(ops.mul(x, self.alpha), self.gamma)
        inside = ops.logical_and(ops.gt(z, 0), ops.lt(z, 1))
        return ops.where(inside, ops.mul(dy, self.alpha), 0)


def hardsigmoid(x: Tensor, alpha: float = 0.2, gamma: float = 0.5) -> Tensor:
    return HardSigmoid(alpha, gamma)(x)[0]


class _SoftMaxLike(Operator):
    """Softmax or log-softmax along `axis`: `_op` forward, `_op`_backward from the saved output."""

    _op = "softmax"

    def __init__(self, axis: int = 1) -> None:
        super().__init__()
        self.axis = axis

    def forward(self, x: Tensor) -> Tensor:
        y = getattr(ops, self._op)(x, self.axis)
        if training:
            self.output = y
        return y

    def backward(self, dy: Tensor) -> Tensor:
        return getattr(ops, self._op + "_backward")(dy, self.output, self.axis)


class SoftMax(_SoftMaxLike):
    _op = "softmax"


def softmax(x: Tensor, axis: int = 1) -> Tensor:
    return SoftMax(axis)(x)[0]


class LogSoftmax(_SoftMaxLike):
    _op = "log_softmax"


def log_softmax(x: Tensor, axis: int = 1) -> Tensor:
    return LogSoftmax(axis)(x)[0]


class Cast(Operator):
    def __init__(self, to: Any) -> None:
        super().__init__()
        self.to = to

    def forward(self, x: Tensor) -> Tensor:
        self.src_dtype = x.dtype
        return ops.cast(x, _to_dtype(self.to))

    def backward(self, dy: Tensor) -> Tensor | None:
        if self.src_dtype not in _FLOATS or not _is_float(dy):
            return None
        return ops.cast(dy, self.src_dtype)


def cast(x: Tensor, to: Any) -> Tensor:
    return Cast(to)(x)[0]
