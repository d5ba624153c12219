"""Element-wise kernels: every entry of singa.expressions.TABLE, every dtype it declares (and float64 where it declares
float32, on devices that declare float64), every layout.

The reference is the entry's own `ref` evaluated in float64 (int64 for integer dtypes) on the very values the device
received, so the only error allowed is the device's rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from singa import dtypes
from singa.expressions import TABLE
from singa.testing import helpers as H

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")

COVERS = set(TABLE)

UNARY = sorted(n for n, e in TABLE.items() if e.arity == 1)
BINARY = sorted(n for n, e in TABLE.items() if e.arity == 2)

# Parameter values per entry (float dtypes, integer dtypes). Comparison thresholds are exact in float16 so that the
# kernel's precision for the parameter cannot change the answer; integer dtypes get integral parameters, since the
# contract leaves float parameters on integer data to C's conversion rules.
PARAMS = {
    "leakyrelu": ({"alpha": 0.1}, None),
    "elu": ({"alpha": 0.7}, None),
    "selu": ({"alpha": 1.6732632423543772, "beta": 1.0507009873554805}, None),
    "hardsigmoid": ({"alpha": 0.2, "beta": 0.5}, None),
    "clip": ({"alpha": -1.25, "beta": 1.5}, {"alpha": -2.0, "beta": 3.0}),
    "add_scalar": ({"alpha": 1.7}, {"alpha": 3.0}),
    "mul_scalar": ({"alpha": -2.3}, {"alpha": -3.0}),
    "rsub_scalar": ({"alpha": 1.25}, {"alpha": 4.0}),
    "div_scalar": ({"alpha": 1.5}, None),
    "rdiv_scalar": ({"alpha": 2.5}, None),
    "pow_scalar": ({"alpha": 2.5}, None),
    "rpow_scalar": ({"alpha": 1.7}, None),
    "lt_scalar": ({"alpha": 0.5}, {"alpha": 1.0}),
    "le_scalar": ({"alpha": 0.5}, {"alpha": 1.0}),
    "gt_scalar": ({"alpha": 0.5}, {"alpha": 1.0}),
    "ge_scalar": ({"alpha": -1.5}, {"alpha": -2.0}),
    "eq_scalar": ({"alpha": 1.5}, {"alpha": 2.0}),
    "axpby": ({"alpha": 0.75, "beta": -1.3}, None),
}


def params_for(entry, dtype) -> dict:
    if not entry.params:
        return {}
    floats, ints = PARAMS.get(entry.name, (None, None))
    if floats is None:  # an entry added to the table after this suite: generic values
        floats = dict(zip(entry.params, (0.5, 1.5)))
    if dtype in dtypes.INTS:
        return ints if ints is not None else {k: float(round(v)) for k, v in floats.items()}
    return floats


def cases(entry):
    return [(entry.name, dt) for dt in entry.kernel_dtypes]


def _ids(case):
    return f"{case[0]}-{dtypes.name(case[1])}"


def values(entry, dtype, gen, shape, params=None) -> np.ndarray:
    """Inputs from the entry's domain; about a third snapped to a half-integer grid (ties, zeros, rounding halves)."""
    if dtype == dtypes.bool_:
        return gen.random(shape) < 0.5
    if dtype in dtypes.INTS:
        return H.draw(gen, shape, dtype, -9, 9)
    lo, hi = entry.domain
    x = gen.uniform(lo, hi, shape)
    snap = gen.random(shape) < 0.35
    x = np.where(snap, np.clip(np.round(x * 2) / 2, lo, hi), x)
    for v in (params or {}).values():  # the comparison thresholds themselves
        x = np.where(gen.random(shape) < 0.1, v, x)
    return x.astype(H.np_dtype(dtype))


def reference(entry, dtype, arrays, params) -> tuple[np.ndarray, int]:
    """The entry's ref in float64 (int64 for ints) and the output dtype."""
    if dtypes.is_float(dtype):
        wide = [a.astype(np.float64) for a in arrays]
    elif dtype in dtypes.INTS:
        wide = [a.astype(np.int64) for a in arrays]
    else:
        wide = list(arrays)
    with np.errstate(all="ignore"):
        want = np.asarray(entry.ref(*wide, **{k: np.float64(v) for k, v in params.items()}))
    out_dtype = dtypes.bool_ if entry.out_bool else dtype
    if out_dtype in dtypes.INTS and np.issubdtype(want.dtype, np.floating):
        want = np.trunc(want)  # C's float -> int conversion
    return want, out_dtype


def run(device, entry, dtype, views, arrays, shape, params, what):
    want, out_dtype = reference(entry, dtype, arrays, params)
    out = H.empty(device, shape, out_dtype)
    device.table[entry.name](out, *views, **params)
    H.assert_close(H.download(device, out), np.broadcast_to(want, shape), out_dtype,
                   what=f"{entry.name} [{dtypes.name(dtype)}] {what}")


def unary_layouts(gen):
    shape = tuple(int(d) for d in gen.integers(2, 6, 3))
    for kind in H.LAYOUTS:
        yield kind, shape, kind
    yield "broadcast (stride 0 on axes 0 and 2)", shape, "broadcast"
    yield "size-1 axis with a meaningless stride", (shape[0], 1, shape[2]), "unit-axis-strides"
    yield "0-d", (), "contiguous"
    yield "empty (zero-length axis)", (2, 0, 3), "contiguous"
    yield "long odd length", (1031,), "offset"


@pytest.mark.parametrize("case", [c for n in UNARY for c in cases(TABLE[n])], ids=_ids)
def test_unary(device, case):
    name, dtype = case
    H.require(device, dtype)
    entry = TABLE[name]
    gen = H.rng("unary", name, dtype)
    params = params_for(entry, dtype)
    checks = H.Checks()
    for what, shape, kind in unary_layouts(gen):
        if kind == "broadcast":
            x = values(entry, dtype, gen, (1, shape[1], 1), params)
            view = H.broadcast(device, x, shape)
        else:
            x = values(entry, dtype, gen, shape, params)
            view = H.layout(device, x, kind)
        with checks(what):
            run(device, entry, dtype, [view], [np.broadcast_to(x, shape)], shape, params, what)
    checks.done()


# Which axes of a 2-D output each input broadcasts (stride 0): all 16 combinations.
PATTERNS = [(), (0,), (1,), (0, 1)]


def _shrink(shape, axes):
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def binary_layouts(entry, dtype, gen):
    """(description, out shape, [(array, view kind or broadcast shape)] for a and b)."""
    shape = tuple(int(d) for d in gen.integers(2, 6, 2))
    for pa in PATTERNS:
        for pb in PATTERNS:
            a = values(entry, dtype, gen, _shrink(shape, pa))
            b = values(entry, dtype, gen, _shrink(shape, pb))
            yield f"broadcast a over {pa}, b over {pb}", shape, [(a, "broadcast"), (b, "broadcast")]
    s3 = tuple(int(d) for d in gen.integers(2, 6, 3))
    a = values(entry, dtype, gen, s3)
    b = values(entry, dtype, gen, s3)
    yield "a transposed, b stepped", s3, [(a, "transposed"), (b, "stepped")]
    yield "a offset, b contiguous", s3, [(a, "offset"), (b, "contiguous")]
    s1 = (s3[0], 1, s3[2])
    yield "size-1 axes with meaningless strides", s1, [
        (values(entry, dtype, gen, s1), "unit-axis-strides"), (values(entry, dtype, gen, s1), "unit-axis-strides")]
    yield "a stepped, b transposed", s3, [(a, "stepped"), (b, "transposed")]
    b = a.copy()
    b.reshape(-1)[::3] = values(entry, dtype, gen, b.reshape(-1)[::3].shape)
    yield "a == b mostly (ties)", s3, [(a, "contiguous"), (b, "offset")]
    yield "3-d outer broadcast", (s3[0], s3[1], s3[2]), [
        (values(entry, dtype, gen, (s3[0], 1, s3[2])), "broadcast"),
        (values(entry, dtype, gen, (1, s3[1], 1)), "broadcast")]
    yield "0-d", (), [(values(entry, dtype, gen, ()), "contiguous"), (values(entry, dtype, gen, ()), "contiguous")]
    yield "0-d broadcast to a matrix", shape, [
        (values(entry, dtype, gen, ()), "broadcast"), (values(entry, dtype, gen, shape), "transposed")]
    yield "empty (zero-length axis)", (3, 0), [
        (values(entry, dtype, gen, (3, 0)), "contiguous"), (values(entry, dtype, gen, (1, 0)), "broadcast")]
    yield "long odd length", (1031,), [
        (values(entry, dtype, gen, (1031,)), "offset"), (values(entry, dtype, gen, (1031,)), "contiguous")]


@pytest.mark.parametrize("case", [c for n in BINARY for c in cases(TABLE[n])], ids=_ids)
def test_binary(device, case):
    name, dtype = case
    H.require(device, dtype)
    entry = TABLE[name]
    gen = H.rng("binary", name, dtype)
    params = params_for(entry, dtype)
    checks = H.Checks()
    for what, shape, inputs in binary_layouts(entry, dtype, gen):
        views = [H.broadcast(device, arr, shape) if kind == "broadcast" else H.layout(device, arr, kind)
                 for arr, kind in inputs]
        arrays = [np.broadcast_to(arr, shape) for arr, _ in inputs]
        with checks(what):
            run(device, entry, dtype, views, arrays, shape, params, what)
    checks.done()


@pytest.mark.parametrize("name", BINARY)
def test_binary_broadcast_3d(device, name):
    # all 64 ways for two 3-d inputs to broadcast (stride 0) over any subset of the axes, first declared dtype
    entry = TABLE[name]
    dtype = entry.dtypes[0]
    gen = H.rng("binary-3d", name)
    shape = (3, 2, 4)
    subsets = [tuple(i for i in range(3) if m >> i & 1) for m in range(8)]
    checks = H.Checks()
    for pa in subsets:
        for pb in subsets:
            a = values(entry, dtype, gen, _shrink(shape, pa))
            b = values(entry, dtype, gen, _shrink(shape, pb))
            what = f"a broadcast over {pa}, b over {pb}"
            with checks(what):
                run(device, entry, dtype, [H.broadcast(device, a, shape), H.broadcast(device, b, shape)],
                    [np.broadcast_to(a, shape), np.broadcast_to(b, shape)], shape, params_for(entry, dtype), what)
    checks.done()


def _same_dtype_cases(names):
    return [c for n in names if not TABLE[n].out_bool for c in cases(TABLE[n])]


@pytest.mark.parametrize("case", _same_dtype_cases(UNARY), ids=_ids)
def test_unary_in_place(device, case):
    # `x.relu_()`-style calls: the core passes the input view itself as the output (here, part of a larger buffer)
    name, dtype = case
    H.require(device, dtype)
    entry = TABLE[name]
    gen = H.rng("unary-in-place", name, dtype)
    params = params_for(entry, dtype)
    x = values(entry, dtype, gen, (4, 5), params)
    out = H.empty(device, x.shape, dtype, offset=3)
    device.write(out, x)
    device.table[name](out, out, **params)
    want, _ = reference(entry, dtype, [x], params)
    H.assert_close(H.download(device, out), want, dtype, what=f"{name} [{dtypes.name(dtype)}] in place, at offset 3")


@pytest.mark.parametrize("case", _same_dtype_cases(BINARY), ids=_ids)
def test_binary_in_place(device, case):
    # `a += b`: out is the very view of a (or of b, or of both), starting inside a larger buffer
    name, dtype = case
    H.require(device, dtype)
    entry = TABLE[name]
    gen = H.rng("binary-in-place", name, dtype)
    shape = (3, 7)
    checks = H.Checks()
    for which in ("a", "b", "both"):
        a, b = values(entry, dtype, gen, shape), values(entry, dtype, gen, (1, 7))
        out = H.empty(device, shape, dtype, offset=2)
        if which == "a":
            device.write(out, a)
            args, arrays = (out, H.broadcast(device, b, shape)), (a, np.broadcast_to(b, shape))
        elif which == "b":
            a, b = values(entry, dtype, gen, (1, 7)), values(entry, dtype, gen, shape)
            device.write(out, b)
            args, arrays = (H.broadcast(device, a, shape), out), (np.broadcast_to(a, shape), b)
        else:
            a = values(entry, dtype, gen, shape)
            device.write(out, a)
            args, arrays = (out, out), (a, a)
        with checks(f"out is {which}"):
            params = params_for(entry, dtype)
            device.table[name](out, *args, **params)
            want, _ = reference(entry, dtype, list(arrays), params)
            H.assert_close(H.download(device, out), want, dtype,
                           what=f"{name} [{dtypes.name(dtype)}] in place (out is {which}, at offset 2)")
    checks.done()


SPECIAL_VALUES = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -2.0, np.nan])


@pytest.mark.parametrize("dtype", H.FLOAT_DTYPES, ids=dtypes.name)
@pytest.mark.parametrize("name", [n for n in UNARY if set(H.FLOAT_DTYPES) & set(TABLE[n].dtypes)])
def test_unary_special_values(device, name, dtype):
    # NaN in, NaN out (relu, sign and hardsigmoid included, as in numpy and PyTorch); infinities and signed zeros
    # as the reference has them
    H.require(device, dtype)
    entry = TABLE[name]
    if dtype not in entry.kernel_dtypes:
        pytest.skip(f"{name} does not take {dtypes.name(dtype)}")
    x = SPECIAL_VALUES.astype(H.np_dtype(dtype))
    params = params_for(entry, dtype)
    run(device, entry, dtype, [H.upload(device, x)], [x], x.shape, params, "NaN, inf and signed zeros")


@pytest.mark.parametrize("dtype", H.FLOAT_DTYPES, ids=dtypes.name)
@pytest.mark.parametrize("name", ["maximum", "minimum", "lt", "le", "gt", "ge", "eq", "ne"])
def test_binary_nan(device, name, dtype):
    # maximum/minimum propagate NaN from either side (contract); comparisons with NaN are false, `ne` true.
    H.require(device, dtype)
    entry = TABLE[name]
    a = np.array([np.nan, 1.0, np.nan, -np.inf, 2.0, np.inf]).astype(H.np_dtype(dtype))
    b = np.array([1.0, np.nan, np.nan, 3.0, np.inf, np.inf]).astype(H.np_dtype(dtype))
    run(device, entry, dtype, [H.upload(device, a), H.upload(device, b)], [a, b], a.shape, {}, "NaN and inf")


@pytest.mark.parametrize("dtype", H.FLOAT_DTYPES, ids=dtypes.name)
@pytest.mark.parametrize("name", ["div", "fmod", "mod"])
def test_float_division_signs(device, name, dtype):
    # The table's test domain is positive; the sign rules (fmod: the dividend's, mod: the divisor's) need both signs.
    H.require(device, dtype)
    entry = TABLE[name]
    gen = H.rng("signs", name, dtype)
    a = (gen.uniform(0.5, 7.0, 64) * gen.choice([-1.0, 1.0], 64)).astype(H.np_dtype(dtype))
    b = (gen.uniform(0.5, 3.0, 64) * gen.choice([-1.0, 1.0], 64)).astype(H.np_dtype(dtype))
    run(device, entry, dtype, [H.upload(device, a), H.upload(device, b)], [a, b], a.shape, {}, "mixed signs")


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64], ids=dtypes.name)
def test_round_half_to_even(device, dtype):
    H.require(device, dtype)
    below_half = np.nextafter(H.np_dtype(dtype).type(0.5), H.np_dtype(dtype).type(0))  # rounds to 0, not up
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, -3.5, below_half], H.np_dtype(dtype))
    out = H.empty(device, x.shape, dtype)
    device.table["round"](out, H.upload(device, x))
    H.assert_close(H.download(device, out), np.array([-2, -2, -0, 0, 2, 2, 4, -4, 0]), dtype,
                   rtol=0, atol=0, what="round")


# Integer entries whose numpy reference is exact on the whole int64 range (no float parameters, no overflow at +-2**60).
WIDE_INT64 = ["add", "sub", "neg", "abs", "relu", "sign", "maximum", "minimum", "fmod", "mod",
              "lt", "le", "gt", "ge", "eq", "ne"]


@pytest.mark.parametrize("name", [n for n in WIDE_INT64 if n in TABLE and dtypes.int64 in TABLE[n].dtypes])
def test_int64_beyond_float_precision(device, name):
    # Values above 2**53 catch a kernel that computes int64 through double (or int32).
    entry = TABLE[name]
    gen = H.rng("wide", name)
    n = 64
    a = gen.integers(-(2 ** 60), 2 ** 60, n, dtype=np.int64)
    b = a + gen.integers(-3, 4, n, dtype=np.int64)  # near-ties that only exact arithmetic tells apart
    b[::4] = gen.integers(-(2 ** 40), 2 ** 40, n // 4, dtype=np.int64) | 1
    args = [a] if entry.arity == 1 else [a, b]
    views = [H.upload(device, v) for v in args]
    run(device, entry, dtypes.int64, views, args, (n,), {}, "int64 beyond 2**53")
