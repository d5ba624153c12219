"""Element-wise kernels as one table of expressions, rendered by every backend into its own language.

Each entry is a C expression over the inputs `x` (unary) or `a`, `b` (binary) and the float parameters `alpha`, `beta`
(every unary kernel takes them; a binary one only when its entry names `params`: see `Elementwise.takes_params`).
The expression language is the common subset of C99 (with <tgmath.h>), CUDA C++ and OpenCL C: arithmetic, comparisons,
`?:`, and the type-generic math functions exp log sqrt sin cos tan asin acos atan sinh cosh tanh asinh acosh atanh erf
floor ceil rint fabs pow fmod. Backends compute float16 in float32 and round once when storing; integer types compute
in their own type (`int_expr` replaces `expr` for them where C's integer semantics differ).

`ref` is the numpy definition, used by the host fallback and, in float64, by the conformance suite as the reference.
A fix to an expression lands in every backend at their next build; a new entry gives every backend a new kernel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from singa import dtypes as dt

_FLOAT_LITERAL = re.compile(r"(?<![\w.])((?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)[fF]\b")


@dataclass(frozen=True)
class Elementwise:
    name: str
    arity: int  # 1: x -> out, 2: (a, b) -> out
    expr: str
    ref: Callable
    dtypes: tuple = dt.FLOATS  # input dtypes the kernel is defined for
    out_bool: bool = False  # True: the output dtype is bool whatever the input
    int_expr: str | None = None
    params: tuple = ()  # names of the float parameters it reads, in order (alpha, beta)
    doc: str = ""
    # sample domain for tests: (low, high) of values that keep the function finite and well-conditioned
    domain: tuple = field(default=(-3.0, 3.0))

    @property
    def kernel_dtypes(self) -> tuple:
        """The input dtypes its kernels take: those declared, plus float64 wherever float32 is (a device that declares
        float64 computes every float32 entry in double precision too)."""
        extra = (dt.float64,) if dt.float32 in self.dtypes and dt.float64 not in self.dtypes else ()
        return tuple(self.dtypes) + extra

    @property
    def takes_params(self) -> bool:
        """Whether its kernels take (alpha, beta) as the last arguments: every unary entry, and a binary entry that
        reads a parameter (`name(out, a, b, alpha=0.0, beta=0.0)`)."""
        return self.arity == 1 or bool(self.params)

    def expression(self, dtype: int) -> str:
        """The expression as a kernel of input dtype `dtype` computes it: `int_expr` for integers where given, and
        for float64 the float literals widened (`0.70710678f` would cost a double its last 29 bits)."""
        if dtype in dt.INTS + (dt.bool_,) and self.int_expr is not None:
            return self.int_expr
        if dtype == dt.float64:
            return _FLOAT_LITERAL.sub(r"\1", self.expr)
        return self.expr


def _erf(x):
    # numpy has no erf; math.erf vectorised keeps the reference exact in float64
    import math

    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype) if x.size else x.copy()


def _sign(x):
    return np.sign(x)


def _pymod(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        if np.issubdtype(a.dtype, np.integer):
            bad = (b == 0) | (b == -1)
            out = np.where(bad, 0, np.mod(a, np.where(bad, 1, b)))
            return out.astype(a.dtype)
        return np.mod(a, b)


def _cdiv(a, b):
    # C semantics: integer division truncates toward zero; division by zero yields 0 for integers (never a trap)
    if np.issubdtype(a.dtype, np.integer):
        safe = np.where((b == 0) | (b == -1), 1, b)
        q = a // safe  # floor division, exact; then round toward zero where the signs differ
        q = np.where(((a - q * safe) != 0) & ((a < 0) != (safe < 0)), q + 1, q)
        with np.errstate(over="ignore"):
            q = np.where(b == -1, -a, q)  # wraps for the minimum integer, as the C expression does
        return np.where(b == 0, 0, q).astype(a.dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        return a / b


def _floordiv(a, b):
    # Python's //: numpy's floor_divide for floats; for integers exact, x // 0 == 0 and x // -1 == -x (wrapping)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if np.issubdtype(a.dtype, np.integer):
            safe = np.where((b == 0) | (b == -1), 1, b)
            q = np.where(b == -1, -a, np.floor_divide(a, safe))
            return np.where(b == 0, 0, q).astype(a.dtype)
        return np.floor_divide(a, b)


# floor((a - fmod(a, b)) / b) as numpy computes it (npy_divmod): exact where floor(a / b) would round the quotient
# first (1e-6 // -34 is -1, not -0; large quotients keep their last integer)
_FLOORDIV_Q = "((a - fmod(a, b)) / b - ((fmod(a, b) != 0 && ((fmod(a, b) < 0) != (b < 0))) ? 1 : 0))"
_FLOORDIV = (f"(b == 0 ? a / b : ({_FLOORDIV_Q} != 0 ? ({_FLOORDIV_Q} - floor({_FLOORDIV_Q}) > 0.5 ? "
             f"floor({_FLOORDIV_Q}) + 1 : floor({_FLOORDIV_Q})) : 0 * (a / b)))")


def _cfmod(a, b):
    if np.issubdtype(a.dtype, np.integer):
        safe = np.where((b == 0) | (b == -1), 1, b)
        return np.where((b == 0) | (b == -1), 0, np.fmod(a, safe)).astype(a.dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.fmod(a, b)


def _hardsigmoid(x, alpha, beta):
    return np.clip(alpha * x + beta, 0, 1)


SQRT1_2 = "0.70710678118654752440"
TWO_SQRT2_PI = "1.59576912160573071176"  # 2 sqrt(2 / pi): the tanh GELU as x * sigmoid(2u)

NUMERIC = dt.NUMERIC
E = Elementwise

UNARY = [
    E("abs", 1, "fabs(x)", lambda x: np.abs(x), NUMERIC, int_expr="(x < 0 ? -x : x)"),
    E("neg", 1, "-x", lambda x: -x, NUMERIC),
    E("sign", 1, "(x != x ? x : (x > 0) - (x < 0))", _sign, NUMERIC, int_expr="((x > 0) - (x < 0))"),  # NaN: NaN
    E("relu", 1, "(x < 0 ? 0 : x)", lambda x: np.maximum(x, 0), NUMERIC),  # NaN stays NaN
    E("exp", 1, "exp(x)", np.exp),
    E("log", 1, "log(x)", np.log, domain=(0.1, 5.0)),
    E("sqrt", 1, "sqrt(x)", np.sqrt, domain=(0.0, 5.0)),
    E("square", 1, "x * x", np.square, NUMERIC),
    E("reciprocal", 1, "1 / x", np.reciprocal, domain=(0.5, 3.0)),
    E("sigmoid", 1, "1 / (1 + exp(-x))", lambda x: 1 / (1 + np.exp(-x))),
    E("tanh", 1, "tanh(x)", np.tanh),
    E("sin", 1, "sin(x)", np.sin),
    E("cos", 1, "cos(x)", np.cos),
    E("tan", 1, "tan(x)", np.tan, domain=(-1.2, 1.2)),
    E("asin", 1, "asin(x)", np.arcsin, domain=(-0.95, 0.95)),
    E("acos", 1, "acos(x)", np.arccos, domain=(-0.95, 0.95)),
    E("atan", 1, "atan(x)", np.arctan),
    E("sinh", 1, "sinh(x)", np.sinh),
    E("cosh", 1, "cosh(x)", np.cosh),
    E("asinh", 1, "asinh(x)", np.arcsinh),
    E("acosh", 1, "acosh(x)", np.arccosh, domain=(1.1, 5.0)),
    E("atanh", 1, "atanh(x)", np.arctanh, domain=(-0.9, 0.9)),
    E("erf", 1, "erf(x)", _erf),
    E("floor", 1, "floor(x)", np.floor),
    E("ceil", 1, "ceil(x)", np.ceil),
    E("round", 1, "rint(x)", np.rint, doc="round half to even (ONNX Round)"),
    E("softplus", 1, "(x > 20 ? x : log(1 + exp(x)))", lambda x: np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))),
    E("softsign", 1, "x / (1 + fabs(x))", lambda x: x / (1 + np.abs(x))),
    E("gelu", 1, f"0.5f * x * (1 + erf(x * {SQRT1_2}f))", lambda x: 0.5 * x * (1 + _erf(x * np.sqrt(0.5)))),
    # x/2 (1 + tanh u) written as x / (1 + exp(-2u)): the same function without 1 + tanh's cancellation for x < 0,
    # and without leaning on tanh(-inf) being exactly -1 (some OpenCL libraries give -0.99999994)
    E("gelu_tanh", 1, f"x / (1 + exp(-{TWO_SQRT2_PI}f * (x + 0.044715f * x * x * x)))",
      lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))),
      doc="GELU's tanh approximation (PyTorch's gelu(approximate='tanh'), GPT-2's)"),
    E("isnan", 1, "(x != x)", np.isnan, out_bool=True),
    E("isinf", 1, "(fabs(x) == INFINITY)", np.isinf, out_bool=True),
    E("logical_not", 1, "!x", np.logical_not, (dt.bool_,), out_bool=True),
    # parametrised
    E("leakyrelu", 1, "(x >= 0 ? x : alpha * x)", lambda x, alpha: np.where(x >= 0, x, alpha * x), params=("alpha",)),
    E("elu", 1, "(x > 0 ? x : alpha * (exp(x) - 1))", lambda x, alpha: np.where(x > 0, x, alpha * (np.exp(x) - 1)), params=("alpha",)),
    E(
        "selu", 1, "(x > 0 ? beta * x : beta * alpha * (exp(x) - 1))",
        lambda x, alpha, beta: np.where(x > 0, beta * x, beta * alpha * (np.exp(x) - 1)), params=("alpha", "beta"),
        doc="alpha, gamma = alpha, beta",
    ),
    E("hardsigmoid", 1, "(alpha * x + beta < 0 ? 0 : (alpha * x + beta > 1 ? 1 : alpha * x + beta))", _hardsigmoid,
      params=("alpha", "beta")),  # comparisons, not fmin/fmax, so that NaN stays NaN
    E("clip", 1, "(x < alpha ? alpha : (x > beta ? beta : x))", lambda x, alpha, beta: np.minimum(np.maximum(x, alpha), beta), NUMERIC, params=("alpha", "beta"),
      doc="min, max = alpha, beta"),
    E("add_scalar", 1, "x + alpha", lambda x, alpha: x + alpha, NUMERIC, params=("alpha",)),
    E("mul_scalar", 1, "x * alpha", lambda x, alpha: x * alpha, NUMERIC, params=("alpha",)),
    E("rsub_scalar", 1, "alpha - x", lambda x, alpha: alpha - x, NUMERIC, params=("alpha",)),
    E("div_scalar", 1, "x / alpha", lambda x, alpha: x / alpha, params=("alpha",)),
    E("rdiv_scalar", 1, "alpha / x", lambda x, alpha: alpha / x, params=("alpha",), domain=(0.5, 3.0)),
    E("pow_scalar", 1, "pow(x, alpha)", lambda x, alpha: np.power(x, alpha), params=("alpha",), domain=(0.1, 3.0)),
    E("rpow_scalar", 1, "pow(alpha, x)", lambda x, alpha: np.power(alpha, x), params=("alpha",)),
    E("lt_scalar", 1, "(x < alpha)", lambda x, alpha: x < alpha, NUMERIC, out_bool=True, params=("alpha",)),
    E("le_scalar", 1, "(x <= alpha)", lambda x, alpha: x <= alpha, NUMERIC, out_bool=True, params=("alpha",)),
    E("gt_scalar", 1, "(x > alpha)", lambda x, alpha: x > alpha, NUMERIC, out_bool=True, params=("alpha",)),
    E("ge_scalar", 1, "(x >= alpha)", lambda x, alpha: x >= alpha, NUMERIC, out_bool=True, params=("alpha",)),
    E("eq_scalar", 1, "(x == alpha)", lambda x, alpha: x == alpha, NUMERIC, out_bool=True, params=("alpha",)),
]


def _fmax(a, b):
    return np.maximum(a, b)  # numpy propagates NaN from either side, as the expression does


BINARY = [
    E("add", 2, "a + b", np.add, NUMERIC),
    E("sub", 2, "a - b", np.subtract, NUMERIC),
    E("mul", 2, "a * b", np.multiply, NUMERIC),
    # integer division guards b == 0 and b == -1 (INT_MIN / -1 traps on x86; x / -1 is -x, wrapping)
    E("div", 2, "a / b", _cdiv, NUMERIC, int_expr="(b == 0 ? 0 : (b == -1 ? -a : a / b))", domain=(0.5, 3.0)),
    E("pow", 2, "pow(a, b)", np.power, domain=(0.1, 3.0)),
    E("maximum", 2, "((a > b || a != a) ? a : b)", _fmax, NUMERIC),
    E("minimum", 2, "((a < b || a != a) ? a : b)", np.minimum, NUMERIC),
    E("fmod", 2, "fmod(a, b)", _cfmod, NUMERIC, int_expr="((b == 0 || b == -1) ? 0 : a % b)", domain=(0.5, 3.0),
      doc="C fmod: the result has the sign of the dividend"),
    E("mod", 2, "(fmod(a, b) != 0 && ((fmod(a, b) < 0) != (b < 0)) ? fmod(a, b) + b : fmod(a, b))", _pymod, NUMERIC,
      int_expr="((b == 0 || b == -1) ? 0 : ((a % b != 0 && ((a % b < 0) != (b < 0))) ? a % b + b : a % b))", domain=(0.5, 3.0),
      doc="Python modulo: the result has the sign of the divisor"),
    E("floor_divide", 2, _FLOORDIV, _floordiv, NUMERIC, domain=(0.5, 3.0),
      int_expr="(b == 0 ? 0 : (b == -1 ? -a : a / b - ((a % b != 0 && ((a % b < 0) != (b < 0))) ? 1 : 0)))",
      doc="Python floor division: floor(a / b) computed exactly (numpy's floor_divide)"),
    E("prelu", 2, "(a < 0 ? b * a : a)", lambda a, b: np.where(a < 0, b * a, a), doc="a: input, b: slope"),
    E("logical_and", 2, "(a && b)", np.logical_and, (dt.bool_,), out_bool=True),
    E("logical_or", 2, "(a || b)", np.logical_or, (dt.bool_,), out_bool=True),
    E("logical_xor", 2, "(!a != !b)", np.logical_xor, (dt.bool_,), out_bool=True),
    E("lt", 2, "(a < b)", np.less, NUMERIC, out_bool=True),
    E("le", 2, "(a <= b)", np.less_equal, NUMERIC, out_bool=True),
    E("gt", 2, "(a > b)", np.greater, NUMERIC, out_bool=True),
    E("ge", 2, "(a >= b)", np.greater_equal, NUMERIC, out_bool=True),
    E("eq", 2, "(a == b)", np.equal, NUMERIC + (dt.bool_,), out_bool=True),
    E("ne", 2, "(a != b)", np.not_equal, NUMERIC + (dt.bool_,), out_bool=True),
    # parametrised: a linear combination in one pass (optimizer updates, tensor.axpy)
    E("axpby", 2, "alpha * a + beta * b", lambda a, b, alpha, beta: alpha * a + beta * b, params=("alpha", "beta"),
      doc="out = alpha * a + beta * b"),
    # gradients that are one expression (a: upstream gradient dy, b: the forward input x or output y)
    E("relu_grad", 2, "(b > 0 ? a : 0)", lambda a, b: np.where(b > 0, a, 0).astype(a.dtype), doc="b = x"),
    E("sigmoid_grad", 2, "a * b * (1 - b)", lambda a, b: a * b * (1 - b), doc="b = y"),
    E("tanh_grad", 2, "a * (1 - b * b)", lambda a, b: a * (1 - b * b), doc="b = y"),
]

TABLE: dict[str, Elementwise] = {e.name: e for e in UNARY + BINARY}
