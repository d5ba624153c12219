"""Element-wise operations of `singa.ops`: `binary` and `unary` (with the dtype rule `singa.ops`' docstring states),
the arithmetic, comparison, logical and math functions made from them, activations, `axpby`, `sgd_momentum`,
`clip`, `floor_divide` and `where`."""

from __future__ import annotations

import builtins
import math
from typing import Any

import numpy as np

from singa import dtypes as _dt
from singa.expressions import TABLE as _TABLE
from singa.ops_core import (
    _FLOATS,
    _INTS,
    _ITEMSIZE,
    _LEFT_SCALAR,
    _META,
    _NOPARAMS,
    _RIGHT_SCALAR,
    _TABLES,
    SCALAR_TYPES,
    _array_operand,
    _bview,
    _const,
    _empty,
    _entry_dtypes,
    _meta,
    _new,
    _promote,
    _run,
    _same_device,
    _same_dtype,
    _scalar,
    _supported,
    _table,
    _tensor,
    bool_,
    broadcast_shapes,
    cast,
    float32,
    int32,
)
from singa.tensor import Tensor

# -- element-wise -------------------------------------------------------------------------------------------------


def binary(name: str, a: Any, b: Any, out: Tensor | None = None, alpha: float = 0.0, beta: float = 0.0) -> Tensor:
    """A binary entry of the expression table with numpy broadcasting; either operand may be a scalar or array.
    `alpha`/`beta` are its float parameters, if any (axpby)."""
    entry = _TABLE.get(name)
    if entry is None or entry.arity != 2:
        raise ValueError(f"unknown binary element-wise operation {name!r}")
    at, bt = isinstance(a, Tensor), isinstance(b, Tensor)
    if not (at and bt):
        if not (at or bt):
            raise TypeError(f"{name}: needs a Tensor operand, got {type(a).__name__} and {type(b).__name__}")
        t, s = (a, b) if at else (b, a)
        if isinstance(s, np.ndarray):
            s = _array_operand(name, s, t, promote=True)
        elif isinstance(s, SCALAR_TYPES):
            if isinstance(s, (float, np.floating)) and t.dtype not in _FLOATS:
                t = cast(t, float32)  # SINGA: a float scalar makes an integer (or bool) operation float
            elif t.dtype == bool_ and not isinstance(s, (bool, np.bool_)) and s not in (0, 1):
                t = cast(t, int32)  # bool * 2 counts: an integer result
            _supported(name, t.dtype, _entry_dtypes(entry))
            v = _scalar(name, s, t.dtype)
            odt = bool_ if entry.out_bool else t.dtype
            if t.dtype in _FLOATS:
                if at:
                    k = _RIGHT_SCALAR.get(name)
                    if k is not None:
                        return _run(name, k[0], odt, t.shape, t.device, (t,), {"alpha": -v if k[1] else v}, out)
                else:
                    k = _LEFT_SCALAR.get(name)
                    if k is not None:
                        return _run(name, k, odt, t.shape, t.device, (t,), {"alpha": v}, out)
            s = _const(name, v, t.dtype, t.device)
        else:
            raise TypeError(f"{name}: unsupported operand type {type(s).__name__} "
                            "(expected a Tensor, a number or a numpy array)")
        a, b = (t, s) if at else (s, t)
    _same_device(name, a, b)
    if a.dtype != b.dtype:
        a, b = _promote(name, a, b)
    _supported(name, a.dtype, _entry_dtypes(entry))
    shape = a.shape if a.shape == b.shape else broadcast_shapes(name, a.shape, b.shape)
    odt = bool_ if entry.out_bool else a.dtype
    params = {"alpha": float(alpha), "beta": float(beta)} if entry.params else _NOPARAMS
    return _run(name, name, odt, shape, a.device, (_bview(a, shape), _bview(b, shape)), params, out)


def _make_binary(name: str):
    entry = _TABLE[name]
    ok = _entry_dtypes(entry)
    out_bool = entry.out_bool
    right = _RIGHT_SCALAR.get(name)
    sname, negate = right if right is not None else (None, False)

    def op(a: Any, b: Any, out: Tensor | None = None) -> Tensor:
        # Fast paths for the shapes of training loops; anything unusual falls through to `binary`, which is the
        # reference behaviour (these only skip checks that cannot fail for the cases they accept).
        if a.__class__ is Tensor:
            shape = a.shape
            dt = a.dtype
            dev = a.device
            bc = b.__class__
            if bc is Tensor:
                if b.dtype != dt or b.device is not dev or dt not in ok:
                    return binary(name, a, b, out)
                if b.shape != shape:
                    nb = len(b.shape)
                    if not nb or nb > len(shape) or b.shape != shape[-nb:] or (out is not None and out is not a):
                        return binary(name, a, b, out)
                    if out is a and (out_bool or b.buffer is a.buffer
                                     or a.strides != (_META.get(shape) or _meta(shape))[0]):
                        return binary(name, a, b, out)
                    b = _bview(b, shape)  # b repeated over a's leading axes (a bias added to every row)
                alpha = None
            elif (bc is float or bc is int) and sname is not None and dt in _FLOATS:
                alpha = -float(b) if negate else float(b)  # tensor OP python scalar: the scalar kernel
            else:
                return binary(name, a, b, out)
            strides, n = _META.get(shape) or _meta(shape)
            if out is None:
                odt = bool_ if out_bool else dt
                r = _new(Tensor)
                r.buffer = dev.alloc(n * _ITEMSIZE[odt])
                r.dtype = odt
                r.shape = shape
                r.strides = strides
                r.offset = 0
                r.device = dev
                r.requires_grad = True
                r.stores_grad = False
                r.creator = None
                r.name = None
            elif out is a and not out_bool and a.strides == strides and (alpha is not None or b.buffer is not a.buffer):
                r = a  # in place (`a += b`): a is plainly contiguous and b does not overlap it
            else:
                return binary(name, a, b, out)
            if n:  # direct calls: a star-args call costs more than the checks above
                if alpha is None:
                    (_TABLES.get(dev) or _table(dev))[name](r, a, b)
                else:
                    (_TABLES.get(dev) or _table(dev))[sname](r, a, alpha=alpha)
            return r
        return binary(name, a, b, out)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"Element-wise `{entry.expr}` with numpy broadcasting (expressions table entry {name!r})."
    return op


def unary(name: str, x: Tensor, alpha: float = 0.0, beta: float = 0.0, out: Tensor | None = None) -> Tensor:
    """A unary entry of the expression table; `alpha`/`beta` are its float parameters, if any."""
    entry = _TABLE.get(name)
    if entry is None or entry.arity != 1:
        raise ValueError(f"unknown unary element-wise operation {name!r}")
    _tensor(name, x)
    _supported(name, x.dtype, _entry_dtypes(entry))
    params = {"alpha": float(alpha), "beta": float(beta)} if entry.params else _NOPARAMS
    return _run(name, name, bool_ if entry.out_bool else x.dtype, x.shape, x.device, (x,), params, out)


def _make_unary(name: str):
    entry = _TABLE[name]
    ok = _entry_dtypes(entry)
    out_bool = entry.out_bool

    def op(x: Tensor, out: Tensor | None = None) -> Tensor:
        if out is None and x.__class__ is Tensor and x.dtype in ok:
            dev = x.device
            r = _empty(x.shape, bool_ if out_bool else x.dtype, dev)
            if _META[x.shape][1]:
                (_TABLES.get(dev) or _table(dev))[name](r, x)
            return r
        return unary(name, x, out=out)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"Element-wise `{entry.expr}` (expressions table entry {name!r})."
    return op


add = _make_binary("add")
sub = _make_binary("sub")
mul = _make_binary("mul")
div = _make_binary("div")
pow = _make_binary("pow")
maximum = _make_binary("maximum")
minimum = _make_binary("minimum")
fmod = _make_binary("fmod")
mod = _make_binary("mod")
prelu = _make_binary("prelu")
logical_and = _make_binary("logical_and")
logical_or = _make_binary("logical_or")
logical_xor = _make_binary("logical_xor")
lt = _make_binary("lt")
le = _make_binary("le")
gt = _make_binary("gt")
ge = _make_binary("ge")
eq = _make_binary("eq")
ne = _make_binary("ne")
relu_grad = _make_binary("relu_grad")
sigmoid_grad = _make_binary("sigmoid_grad")
tanh_grad = _make_binary("tanh_grad")

abs = _make_unary("abs")
neg = _make_unary("neg")
sign = _make_unary("sign")
relu = _make_unary("relu")
exp = _make_unary("exp")
log = _make_unary("log")
sqrt = _make_unary("sqrt")
square = _make_unary("square")
reciprocal = _make_unary("reciprocal")
sigmoid = _make_unary("sigmoid")
tanh = _make_unary("tanh")
sin = _make_unary("sin")
cos = _make_unary("cos")
tan = _make_unary("tan")
asin = _make_unary("asin")
acos = _make_unary("acos")
atan = _make_unary("atan")
sinh = _make_unary("sinh")
cosh = _make_unary("cosh")
asinh = _make_unary("asinh")
acosh = _make_unary("acosh")
atanh = _make_unary("atanh")
erf = _make_unary("erf")
floor = _make_unary("floor")
ceil = _make_unary("ceil")
round = _make_unary("round")
softplus = _make_unary("softplus")
softsign = _make_unary("softsign")
gelu = _make_unary("gelu")
gelu_tanh = _make_unary("gelu_tanh")
isnan = _make_unary("isnan")
isinf = _make_unary("isinf")
logical_not = _make_unary("logical_not")


def axpby(alpha: float, a: Tensor, beta: float, b: Tensor, out: Tensor | None = None) -> Tensor:
    """alpha * a + beta * b in one pass over memory (numpy broadcasting; float dtypes). `out` may be `a` or `b`
    itself: `axpby(m, buf, 1.0, g, out=buf)` is an in-place momentum update."""
    if a.__class__ is Tensor and b.__class__ is Tensor:  # an optimizer's update: same-shape float operands
        shape, dt, dev = a.shape, a.dtype, a.device
        if b.shape == shape and b.dtype == dt and b.device is dev and dt in _FLOATS:
            strides, n = _META.get(shape) or _meta(shape)
            if out is None:
                r = _empty(shape, dt, dev)
            elif (out is a or out is b) and out.strides == strides and (a is b or a.buffer is not b.buffer):
                r = out  # in place: the other operand is the same view or lies in another buffer
            else:
                r = None
            if r is not None:
                if n:
                    (_TABLES.get(dev) or _table(dev))["axpby"](r, a, b, alpha=float(alpha), beta=float(beta))
                return r
    _tensor("axpby", a)
    _tensor("axpby", b)
    return binary("axpby", a, b, out, alpha, beta)


def sgd_momentum(w: Tensor, buf: Tensor, g: Tensor, lr: float, momentum: float) -> None:
    """SGD's momentum rule in place, one pass where the backend fuses it: buf = momentum * buf + g, then
    w = w - lr * buf. w, buf and g: one float dtype and shape on one device, contiguous, w and buf distinct."""
    for name, t in (("w", w), ("buf", buf), ("g", g)):
        _tensor("sgd_momentum", t, name)
    _same_device("sgd_momentum", w, buf)
    _same_device("sgd_momentum", w, g)
    (_TABLES.get(w.device) or _table(w.device))["sgd_momentum"](w, buf, g, lr=float(lr), momentum=float(momentum))


def leakyrelu(x: Tensor, alpha: float = 0.01, out: Tensor | None = None) -> Tensor:
    return unary("leakyrelu", x, alpha, out=out)


def elu(x: Tensor, alpha: float = 1.0, out: Tensor | None = None) -> Tensor:
    return unary("elu", x, alpha, out=out)


def selu(x: Tensor, alpha: float = 1.67326, gamma: float = 1.0507, out: Tensor | None = None) -> Tensor:
    return unary("selu", x, alpha, gamma, out=out)


def hardsigmoid(x: Tensor, alpha: float = 0.2, beta: float = 0.5, out: Tensor | None = None) -> Tensor:
    return unary("hardsigmoid", x, alpha, beta, out=out)


def clip(x: Tensor, min: float | None = None, max: float | None = None, out: Tensor | None = None) -> Tensor:
    """Clamp to [min, max]; None leaves that side open."""
    lo = -math.inf if min is None else min
    hi = math.inf if max is None else max
    if x.dtype in _INTS:  # bounds must stay exact for integers
        info = np.iinfo(_dt.to_numpy_dtype(x.dtype))
        lo, hi = builtins.max(lo, info.min), builtins.min(hi, info.max)
        lo, hi = math.ceil(lo), math.floor(hi)
    return unary("clip", x, lo, hi, out=out)


def floor_divide(a: Any, b: Any, out: Tensor | None = None) -> Tensor:
    """Python's `//` (numpy's floor_divide): floor(a / b) without rounding the quotient first; integers exact, x // 0
    gives 0."""
    return binary("floor_divide", a, b, out)


def where(cond: Tensor, a: Any, b: Any, out: Tensor | None = None) -> Tensor:
    """cond ? a : b with broadcasting; cond is bool (other dtypes mean cond != 0); a or b may be scalars."""
    op = "where"
    _tensor(op, cond, "cond")
    if cond.dtype != bool_:
        cond = cast(cond, bool_)
    at, bt = isinstance(a, Tensor), isinstance(b, Tensor)
    if not (at or bt):
        raise TypeError(f"{op}: needs a Tensor for a or b (their dtype fixes the result's), got "
                        f"{type(a).__name__} and {type(b).__name__}")
    like = a if at else b
    a = a if at else (_array_operand(op, a, like) if isinstance(a, np.ndarray) else _const(op, a, like.dtype,
                                                                                             like.device))
    b = b if bt else (_array_operand(op, b, like) if isinstance(b, np.ndarray) else _const(op, b, like.dtype,
                                                                                             like.device))
    _same_device(op, cond, a)
    _same_device(op, a, b)
    _same_dtype(op, a, b)
    shape = broadcast_shapes(op, broadcast_shapes(op, cond.shape, a.shape), b.shape)
    ins = (_bview(cond, shape), _bview(a, shape), _bview(b, shape))
    return _run(op, "where", a.dtype, shape, a.device, ins, _NOPARAMS, out)
