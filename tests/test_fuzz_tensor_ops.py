"""Property test of the tensor operators: random shapes, strides (transposed, sliced, reversed views), dtypes and
values (nan, inf, integer extremes included), each result checked against numpy, or a clean error when numpy's answer
is outside SINGA's documented rules (mixed dtypes, shapes that do not broadcast, a dtype the operator does not take).

The rules checked are the documented ones (singa.ops): no implicit promotion between tensors; integer `/` truncates
toward zero and `//`, `%` follow Python, division by zero giving 0; comparisons give 0/1 in the operands' dtype;
integer arithmetic wraps. References are computed in float64 (floats) or exact Python integers (ints).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from singa import device, ops, tensor

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

FLOATS = (np.float32, np.float16)
INTS = (np.int32, np.int64)
NUMERIC = FLOATS + INTS
ALL = NUMERIC + (np.bool_,)
CLEAN = (TypeError, ValueError, IndexError)


@pytest.fixture(scope="module")
def dev():
    return device.get_default_device()


# -- data: values, then a view of them with other strides -------------------------------------------------------


def _elements(dtype, special: bool):
    dt = np.dtype(dtype)
    if dt.kind == "f":
        width = 16 if dt == np.float16 else 32
        if special:
            return st.floats(width=width, allow_nan=True, allow_infinity=True)
        return st.floats(-100, 100, width=width)
    if dt.kind == "b":
        return st.booleans()
    info = np.iinfo(dt)
    if special:
        return st.one_of(st.integers(info.min, info.max), st.sampled_from([info.min, info.max, 0, -1, 1]))
    return st.integers(-1000, 1000)


@st.composite
def viewed(draw, dtype, shape, special):
    """(numpy array of `shape`, recipe) where the recipe rebuilds the same values as a strided view of a bigger tensor:
    a transpose, a reversed or stepped slice, or the plain tensor."""
    kind = draw(st.sampled_from(["plain", "transposed", "sliced", "reversed"])) if shape else "plain"
    if kind == "transposed":
        perm = draw(st.permutations(range(len(shape))))
        base_shape = tuple(shape[p] for p in np.argsort(perm))
        base = draw(hnp.arrays(dtype, base_shape, elements=_elements(dtype, special), fill=st.nothing()))
        return np.transpose(base, perm), ("transpose", base, tuple(perm))
    if kind == "sliced":
        base = draw(hnp.arrays(dtype, tuple(2 * d + 1 for d in shape), elements=_elements(dtype, special),
                               fill=st.nothing()))
        key = tuple(slice(1, 1 + 2 * d, 2) for d in shape)
        return base[key], ("slice", base, key)
    if kind == "reversed":
        base = draw(hnp.arrays(dtype, shape, elements=_elements(dtype, special), fill=st.nothing()))
        key = tuple(slice(None, None, -1) for _ in shape)
        return base[key], ("slice", base, key)
    arr = draw(hnp.arrays(dtype, shape, elements=_elements(dtype, special), fill=st.nothing()))
    return arr, ("plain", arr, None)


def _build(recipe, dev):
    kind, base, arg = recipe
    t = tensor.Tensor(data=np.array(base, order="C"), device=dev)  # keeps int64 (from_numpy narrows it, as SINGA)
    if kind == "transpose":
        return t.transpose(arg)
    if kind == "slice":
        return t[arg]
    return t


# -- references -----------------------------------------------------------------------------------------------------


def _wrap(values, dtype) -> np.ndarray:
    """Exact Python integers wrapped to a fixed-width integer dtype (two's complement), as the kernels compute."""
    bits = np.dtype(dtype).itemsize * 8
    out = [((int(v) + (1 << (bits - 1))) % (1 << bits)) - (1 << (bits - 1)) for v in np.ravel(values)]
    return np.array(out, dtype=np.int64).astype(dtype).reshape(np.shape(values))


def _int_binary(fn: Callable[[int, int], int]):
    def ref(a, b):
        a, b = np.broadcast_arrays(a, b)
        return _wrap(np.frompyfunc(lambda x, y: fn(int(x), int(y)), 2, 1)(a, b), a.dtype)
    return ref


def _trunc_div(x: int, y: int) -> int:
    if y == 0:
        return 0
    q = abs(x) // abs(y)
    return q if (x >= 0) == (y > 0) else -q


def _floor_div(x: int, y: int) -> int:
    return 0 if y == 0 else x // y


def _py_mod(x: int, y: int) -> int:
    return 0 if y == 0 else x % y


@dataclass
class Binary:
    name: str
    fn: Callable
    float_ref: Callable | None
    int_ref: Callable | None
    dtypes: tuple
    special: bool = True  # nan / inf / integer extremes in the operands
    compare: bool = False


def _f(fn):
    return lambda a, b: fn(a.astype(np.float64), b.astype(np.float64))


BINARY = [
    Binary("add", operator.add, _f(np.add), _int_binary(operator.add), NUMERIC),
    Binary("sub", operator.sub, _f(np.subtract), _int_binary(operator.sub), NUMERIC),
    Binary("mul", operator.mul, _f(np.multiply), _int_binary(operator.mul), NUMERIC),
    Binary("div", operator.truediv, _f(np.divide), _int_binary(_trunc_div), NUMERIC),
    Binary("floor_divide", operator.floordiv, _f(np.floor_divide), _int_binary(_floor_div), NUMERIC),
    Binary("mod", operator.mod, _f(np.mod), _int_binary(_py_mod), NUMERIC),
    Binary("pow", operator.pow, _f(np.power), None, FLOATS, special=False),
    Binary("lt", operator.lt, _f(np.less), _f(np.less), NUMERIC, compare=True),
    Binary("le", operator.le, _f(np.less_equal), _f(np.less_equal), NUMERIC, compare=True),
    Binary("gt", operator.gt, _f(np.greater), _f(np.greater), NUMERIC, compare=True),
    Binary("ge", operator.ge, _f(np.greater_equal), _f(np.greater_equal), NUMERIC, compare=True),
    Binary("eq", operator.eq, _f(np.equal), _f(np.equal), ALL, compare=True),
    Binary("ne", operator.ne, _f(np.not_equal), _f(np.not_equal), ALL, compare=True),
]


def _close(got: np.ndarray, want: np.ndarray, dtype, what: str, scale: np.ndarray | float = 1.0) -> None:
    """got (dtype) against a float64 / exact reference: bit-exact for integers and bools, within a few units of the
    dtype's precision (relative, or absolute on `scale`) for floats; nan where nan, inf where inf."""
    dt = np.dtype(dtype)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, numpy {want.shape}"
    if dt.kind != "f":
        assert np.array_equal(got, want.astype(dt)), f"{what}: {got} != numpy {want}"
        return
    got = got.astype(np.float64)
    eps = float(np.finfo(dt).eps)
    limit = float(np.finfo(dt).max)
    want = np.where(np.abs(want) > limit * (1 + eps), np.copysign(np.inf, want), want)  # overflows to inf in dtype
    finite = np.isfinite(want)
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"{what}: nan at other places: {got} vs numpy {want}"
    inf = ~finite & ~np.isnan(want)
    assert np.array_equal(got[inf], want[inf]), f"{what}: infinities differ: {got} vs numpy {want}"
    tol = 8 * eps * (np.abs(want) + np.abs(scale)) + float(np.finfo(dt).tiny)  # below tiny: subnormal, or 0
    bad = finite & ~(np.abs(got - want) <= tol)
    near_limit = finite & (np.abs(want) > limit * (1 - 8 * eps))  # rounding decides between max and inf
    bad &= ~near_limit
    assert not bad.any(), f"{what}: {got[bad]} vs numpy {want[bad]}"


def _attempt(fn: Callable) -> tuple:
    """(result, None) or (None, the exception)."""
    try:
        return fn(), None
    except Exception as exc:  # noqa: BLE001 - judged by _judge
        return None, exc


def _judge(what: str, valid: bool, exc: BaseException | None, *needles: str) -> None:
    """A valid call must succeed; an invalid one must raise a clean error (TypeError, ValueError or IndexError) whose
    message names the operation, a shape, a dtype or an axis."""
    if valid:
        assert exc is None, f"{what} raised {type(exc).__name__}: {exc}"
        return
    assert exc is not None, f"{what} did not raise"
    assert isinstance(exc, CLEAN), f"{what}: {type(exc).__name__}: {exc}"
    msg = str(exc)
    assert msg, f"{what}: an error without a message"
    assert any(n in msg for n in needles), f"{what}: the error names none of {needles}: {msg}"


def _dtype_name(dt) -> str:
    return {"float32": "float32", "float16": "float16", "int32": "int32", "int64": "int64", "bool": "bool"}[
        np.dtype(dt).name]


_KIND = {"b": 0, "i": 1, "u": 1, "f": 2}


def _promoted(da: np.dtype, db: np.dtype) -> np.dtype | None:
    """The dtype a binary operator computes in, or None when the dtypes do not combine."""
    if da == db:
        return da
    ka, kb = _KIND[da.kind], _KIND[db.kind]
    if ka == kb:
        return None
    return da if ka > kb else db


@st.composite
def binary_case(draw, op):
    da = draw(st.sampled_from(ALL))
    db = da if draw(st.integers(0, 5)) else draw(st.sampled_from(ALL))  # mostly one dtype, sometimes mixed
    if draw(st.integers(0, 7)):
        sa, sb = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4)).input_shapes
    else:  # any two shapes: most do not broadcast
        sa = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
        sb = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
    special = op.special and draw(st.booleans())
    a = draw(viewed(da, sa, special))
    b = draw(viewed(db, sb, special))
    scalar = draw(st.sampled_from([None, "left", "right"])) if da == db else None
    return op, a, b, scalar


@pytest.mark.parametrize("op", BINARY, ids=lambda o: o.name)
@SETTINGS
@given(data=st.data())
def test_binary_operators(dev, op, data):
    op, (a, ra), (b, rb), scalar = data.draw(binary_case(op))
    ta, tb = _build(ra, dev), _build(rb, dev)
    if scalar == "right" and b.size:
        tb = b.reshape(-1)[0].item()
        b = np.asarray(b.reshape(-1)[0])
    elif scalar == "left" and a.size:
        ta = a.reshape(-1)[0].item()
        a = np.asarray(a.reshape(-1)[0])
    try:
        shape = np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        shape = None
    # SINGA's promotion (issue 13): tensors of different kinds compute in the higher kind's dtype (bool < int <
    # float); the same kind at different widths is an error. A scalar operand has the tensor's dtype here.
    dtype = _promoted(a.dtype, b.dtype)
    valid = shape is not None and dtype is not None and dtype.type in op.dtypes
    if dtype is not None:
        a, b = a.astype(dtype), b.astype(dtype)
    what = f"{op.name}({a.dtype}{a.shape} {ra[0]}, {b.dtype}{b.shape} {rb[0]})"
    r, exc = _attempt(lambda: op.fn(ta, tb))
    _judge(what, valid, exc, op.name, str(a.shape), str(b.shape), _dtype_name(a.dtype), _dtype_name(b.dtype))
    if exc is not None:
        return
    assert isinstance(r, tensor.Tensor)
    got = tensor.to_numpy(r)
    assert got.dtype == dtype, f"{what}: result dtype {got.dtype}, expected {dtype}"
    ref = op.float_ref if dtype.kind == "f" or op.compare else op.int_ref
    want = ref(np.broadcast_to(a, shape), np.broadcast_to(b, shape))
    if op.compare:
        want = want.astype(dtype)
    _close(got, np.asarray(want, np.float64) if dtype.kind == "f" else np.asarray(want), dtype, what)


# -- unary operators --------------------------------------------------------------------------------------------------


@dataclass
class Unary:
    name: str
    fn: Callable
    ref: Callable  # float64 for floats
    int_ref: Callable | None
    dtypes: tuple


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


UNARY = [
    Unary("neg", operator.neg, np.negative, lambda a: _wrap(-a.astype(object), a.dtype), NUMERIC),
    Unary("abs", abs, np.abs, lambda a: _wrap(np.abs(a.astype(object)), a.dtype), NUMERIC),
    Unary("exp", tensor.exp, np.exp, None, FLOATS),
    Unary("log", tensor.log, np.log, None, FLOATS),
    Unary("sqrt", tensor.sqrt, np.sqrt, None, FLOATS),
    Unary("square", tensor.square, np.square, lambda a: _wrap(a.astype(object) ** 2, a.dtype), NUMERIC),
    Unary("tanh", tensor.tanh, np.tanh, None, FLOATS),
    Unary("sigmoid", tensor.sigmoid, _sigmoid, None, FLOATS),
    Unary("sign", tensor.sign, np.sign, np.sign, NUMERIC),
    Unary("relu", tensor.relu, lambda x: np.where(x > 0, x, np.where(np.isnan(x), x, 0.0)).astype(np.float64),
          lambda a: np.maximum(a, 0), NUMERIC),
    Unary("ceil", tensor.ceil, np.ceil, None, FLOATS),
    Unary("floor", tensor.floor, np.floor, None, FLOATS),
]


@st.composite
def unary_case(draw, op):
    dt = draw(st.sampled_from(ALL))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4))
    return op, draw(viewed(dt, shape, draw(st.booleans())))


@pytest.mark.parametrize("op", UNARY, ids=lambda o: o.name)
@SETTINGS
@given(data=st.data())
def test_unary_operators(dev, op, data):
    op, (a, ra) = data.draw(unary_case(op))
    t = _build(ra, dev)
    what = f"{op.name}({a.dtype}{a.shape} {ra[0]})"
    r, exc = _attempt(lambda: op.fn(t))
    _judge(what, a.dtype.type in op.dtypes, exc, op.name, _dtype_name(a.dtype))
    if exc is not None:
        return
    got = tensor.to_numpy(r)
    assert got.dtype == a.dtype, f"{what}: dtype {got.dtype}"
    if a.dtype.kind == "f":
        with np.errstate(all="ignore"):
            want = op.ref(a.astype(np.float64))
        _close(got, want, a.dtype, what)
    else:
        _close(got, np.asarray(op.int_ref(a)), a.dtype, what)


# -- reductions, matrix products, casts, layout ----------------------------------------------------------------------


@st.composite
def reduction_case(draw, name):
    dt = draw(st.sampled_from(ALL))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4))
    axis = draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1),
                          st.sets(st.integers(0, len(shape) - 1), min_size=1).map(tuple),
                          st.just(len(shape))))  # the last one is out of range
    keep = draw(st.booleans())
    return name, draw(viewed(dt, shape, False)), axis, keep


@pytest.mark.parametrize("name", ["sum", "max", "min", "mean", "prod"])
@SETTINGS
@given(data=st.data())
def test_reductions(dev, name, data):
    name, (a, ra), axis, keep = data.draw(reduction_case(name))
    t = _build(ra, dev)
    what = f"{name}({a.dtype}{a.shape} {ra[0]}, axis={axis}, keepdims={keep})"
    supported = {"sum": ALL, "max": NUMERIC, "min": NUMERIC, "mean": FLOATS, "prod": NUMERIC}[name]
    bad_axis = axis is not None and any(not -a.ndim <= ax < a.ndim for ax in np.atleast_1d(axis))
    r, exc = _attempt(lambda: getattr(ops, name)(t, axis, keepdims=keep))
    _judge(what, not bad_axis and a.dtype.type in supported, exc, name, "axis", _dtype_name(a.dtype))
    if exc is not None:
        return
    got = tensor.to_numpy(r)
    if a.dtype.kind == "f":
        want = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean, "prod": np.prod}[name](
            a.astype(np.float64), axis=axis, keepdims=keep)
        scale = np.sum(np.abs(a.astype(np.float64)), axis=axis, keepdims=keep) if name in ("sum", "mean") else 0.0
        if name == "mean":
            scale = scale / max(1, a.size // max(1, np.asarray(want).size))
        _close(got, np.asarray(want), a.dtype, what, scale=scale * 4)
    else:
        fn = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}[name]
        want = fn(a.astype(object) if name in ("sum", "prod") else a, axis=axis, keepdims=keep)
        out_dt = got.dtype
        if name in ("sum", "prod") and a.dtype.kind != "b":
            want = _wrap(np.asarray(want), a.dtype)
        _close(got, np.asarray(want).astype(out_dt), out_dt, what)


@st.composite
def matmul_case(draw):
    dt = draw(st.sampled_from(ALL))
    m, k, n = (draw(st.integers(0, 5)) for _ in range(3))
    batch = draw(st.sampled_from([(), (2,), (1, 3)]))
    k2 = k if draw(st.integers(0, 5)) else draw(st.integers(0, 5))
    return draw(viewed(dt, batch + (m, k), False)), draw(viewed(dt, batch + (k2, n), False))


@settings(SETTINGS, max_examples=200)
@given(matmul_case())
def test_matmul(dev, case):
    (a, ra), (b, rb) = case
    what = f"matmul({a.dtype}{a.shape} {ra[0]}, {b.dtype}{b.shape} {rb[0]})"
    r, exc = _attempt(lambda: _build(ra, dev) @ _build(rb, dev))
    _judge(what, a.shape[-1] == b.shape[-2] and a.dtype != np.bool_, exc, "matmul", str(a.shape),
           _dtype_name(a.dtype))
    if exc is not None:
        return
    got = tensor.to_numpy(r)
    if a.dtype.kind == "f":
        want = np.matmul(a.astype(np.float64), b.astype(np.float64))
        scale = np.matmul(np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64)))
        _close(got, want, a.dtype, what, scale=scale * (4 if a.dtype == np.float32 else 16))
    else:
        _close(got, _wrap(np.matmul(a.astype(object), b.astype(object)), a.dtype), a.dtype, what)


@st.composite
def cast_case(draw):
    src = draw(st.sampled_from(ALL))
    dst = draw(st.sampled_from(ALL))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
    # float -> int is defined for values the integer type holds (the kernels truncate toward zero)
    special = not (np.dtype(src).kind == "f" and np.dtype(dst).kind in "iu") and draw(st.booleans())
    return draw(viewed(src, shape, special)), dst


@settings(SETTINGS, max_examples=300)
@given(cast_case())
def test_casts(dev, case):
    (a, ra), dst = case
    got = tensor.to_numpy(_build(ra, dev).as_type(np.dtype(dst)))
    what = f"cast({a.dtype}{a.shape} {ra[0]} -> {np.dtype(dst)})"
    if np.dtype(dst).kind == "f":
        with np.errstate(over="ignore"):
            _close(got, a.astype(np.float64), dst, what)
    elif np.dtype(dst).kind == "b":
        assert np.array_equal(got, a != 0), what
    else:
        want = np.trunc(a.astype(np.float64)) if a.dtype.kind == "f" else a
        _close(got, _wrap(np.asarray(want).astype(object), dst) if a.dtype.kind != "f" else want.astype(dst), dst,
               what)


LAYOUT = ["reshape", "transpose", "getitem", "concat", "repeat", "clone", "iadd"]


@st.composite
def layout_case(draw, kind):
    dt = draw(st.sampled_from(ALL))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=4))
    a = draw(viewed(dt, shape, False))
    if kind == "reshape":
        n = int(np.prod(shape))
        target = draw(st.sampled_from([(n,), (-1,), (1, n), (n, -1) if n else (0, 1), (n + 1,)]))
        return kind, a, target
    if kind == "transpose":
        return kind, a, tuple(draw(st.permutations(range(len(shape)))))
    if kind == "getitem":
        key = tuple(draw(st.one_of(st.integers(-d - 1, d), st.slices(max(d, 1)))) for d in shape)
        return kind, a, key
    if kind == "concat":
        axis = draw(st.integers(-len(shape), len(shape)))
        other = list(shape)
        if -len(shape) <= axis < len(shape):
            other[axis] = draw(st.integers(0, 3))
        return kind, a, (axis, draw(viewed(dt, tuple(other), False)))
    if kind == "repeat":
        return kind, a, (draw(st.integers(0, 3)), draw(st.one_of(st.none(), st.integers(-len(shape), len(shape)))))
    if kind == "iadd":
        return kind, a, draw(viewed(dt, draw(hnp.broadcastable_shapes(shape, max_dims=len(shape), min_side=0)), False))
    return kind, a, None


@pytest.mark.parametrize("kind", LAYOUT)
@SETTINGS
@given(data=st.data())
def test_layout_operators(dev, kind, data):
    kind, (a, ra), arg = data.draw(layout_case(kind))
    t = _build(ra, dev)
    what = f"{kind}({a.dtype}{a.shape} {ra[0]}, {arg if kind != 'concat' else arg[0]})"
    try:
        if kind == "reshape":
            want = a.reshape(arg)
        elif kind == "transpose":
            want = np.transpose(a, arg)
        elif kind == "getitem":
            a[arg]  # an index out of range raises here, as it must in singa
            # SINGA keeps the axis an integer selects (size 1), where numpy drops it
            want = a[tuple(slice(i % d, i % d + 1) if isinstance(i, int) else i for i, d in zip(arg, a.shape))]
        elif kind == "concat":
            want = np.concatenate([a, arg[1][0]], arg[0])
        elif kind == "repeat":
            want = np.repeat(a, arg[0], arg[1])
        elif kind == "iadd":
            if a.dtype == np.bool_:
                raise TypeError("bool arithmetic")
            if np.broadcast_shapes(a.shape, arg[0].shape) != a.shape:
                raise ValueError("in place: the result must keep the target's shape")
            want = _wrap(a.astype(object) + arg[0].astype(object), a.dtype) if a.dtype.kind in "iu" else \
                (a.astype(np.float64) + arg[0].astype(np.float64))
        else:
            want = a.copy()
        valid = True
    except (ValueError, IndexError, TypeError, np.exceptions.AxisError):
        valid = False
    def call():
        if kind == "reshape":
            return t.reshape(arg)
        if kind == "transpose":
            return t.transpose(arg)
        if kind == "getitem":
            return t[arg]
        if kind == "concat":
            return tensor.concatenate([t, _build(arg[1][1], dev)], arg[0])
        if kind == "repeat":
            return tensor.repeat(t, arg[0], arg[1])
        if kind == "iadd":
            r = t
            r += _build(arg[1], dev)
            return r
        return t.clone()

    r, exc = _attempt(call)
    _judge(what, valid, exc, kind, "shape", "axis", "index", "dtype", str(a.shape), _dtype_name(a.dtype), "repeat",
           "concat", "bool")
    if exc is not None:
        return
    got = tensor.to_numpy(r)
    if kind == "iadd" and a.dtype.kind == "f":
        _close(got, want, a.dtype, what)
    else:
        assert got.shape == want.shape, f"{what}: shape {got.shape} vs numpy {want.shape}"
        assert np.array_equal(got, want, equal_nan=a.dtype.kind == "f"), f"{what}: {got} vs numpy {want}"


@pytest.mark.parametrize(("dtype", "a", "b"), [
    (np.float16, [1e-6, 6e-8, -3e-5, 7, -7, 1e4], [-34, -34, 7, 2, 2, 3]),  # found by the property test: 1e-6 // -34
    (np.float32, [1e-40, -1e-40, 1e8 + 4, 16777217, 5, -5], [-3, 3, 3, 0.1, 0, 0]),
    (np.int32, [-2**31, -2**31, 2**31 - 1, 7, -7, 0], [3, -1, -2, 0, 2, -3]),
    (np.int64, [-2**63, 2**63 - 1, -2**63, 9, -9, 1], [7, -7, -1, -2, 4, 0]),
])
def test_floor_divide_does_not_round_the_quotient_first(dev, dtype, a, b):
    a, b = np.array(a, dtype), np.array(b, dtype)
    got = tensor.to_numpy(tensor.Tensor(data=a, device=dev) // tensor.Tensor(data=b, device=dev))
    if np.dtype(dtype).kind == "f":
        with np.errstate(all="ignore"):
            want = np.floor_divide(a, b)
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_array_equal(got, _int_binary(_floor_div)(a, b))
