"""Reductions over every set of axes of a 3-d input, and argmax/argmin with ties."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from singa import dtypes
from singa.testing import helpers as H

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")

COVERS = {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin"}

NUMERIC = H.NUMERIC_DTYPES
SHAPE = (3, 4, 5)
AXES = [c for r in range(4) for c in itertools.combinations(range(3), r)]  # (), (0,), ..., (0, 1, 2)


def _inputs(name, dtype, gen, shape):
    if name == "reduce_prod":
        if dtype in dtypes.INTS:  # no overflow: |product| <= 2**24 over at most 24 elements, else +-1
            choices = [-2, -1, 1, 1, 2] if int(np.prod(shape)) <= 24 else [-1, 1]
            return gen.choice(choices, shape).astype(H.np_dtype(dtype))
        return (gen.uniform(0.7, 1.3, shape) * gen.choice([-1, 1], shape)).astype(H.np_dtype(dtype))
    if name == "reduce_mean" and dtype in dtypes.INTS:
        # non-negative: the contract does not say whether integer means floor or truncate
        return H.draw(gen, shape, dtype, 0, 20)
    x = H.draw(gen, shape, dtype, -9, 9)
    if name in ("reduce_max", "reduce_min") and dtypes.is_float(dtype):
        x = np.where(gen.random(shape) < 0.3, np.round(x), x).astype(x.dtype)  # ties
    return x


def _reference(name, x, axes):
    w = x.astype(np.float64)
    if name == "reduce_sum":
        return w.sum(axis=axes), np.abs(w).sum(axis=axes)
    if name == "reduce_mean":
        n = int(np.prod([x.shape[a] for a in axes]))
        with np.errstate(all="ignore"):
            mean = w.sum(axis=axes) / n if n else np.full(np.sum(w, axis=axes).shape, np.nan)
        if x.dtype.kind == "i":
            mean = np.floor(mean)
        return mean, np.abs(w).sum(axis=axes) / max(n, 1)
    if name == "reduce_max":
        return w.max(axis=axes), None
    if name == "reduce_min":
        return w.min(axis=axes), None
    if name == "reduce_prod":
        return w.prod(axis=axes), None
    raise AssertionError(name)


def _check(device, name, x, axes, dtype, what, layout="contiguous"):
    want, scale = _reference(name, x, axes)
    out = H.empty(device, want.shape, dtype)
    device.table[name](out, H.layout(device, x, layout), axes=tuple(axes))
    H.assert_close(H.download(device, out), want, dtype, scale=scale, what=f"{name} [{dtypes.name(dtype)}] {what}")


@pytest.mark.parametrize("dtype", NUMERIC, ids=dtypes.name)
@pytest.mark.parametrize("name", ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod"])
def test_reduce(device, name, dtype):
    H.require(device, dtype)
    gen = H.rng(name, dtype)
    shape = (2, 3, 4) if name == "reduce_prod" else SHAPE
    cases = [(shape, axes) for axes in AXES] + [((), ()), ((700,), (0,)), ((0, 4), (1,)), ((3, 1, 4), (1,)),
                                                  ((3, 1, 4), (0, 2))]
    if name not in ("reduce_max", "reduce_min") and not (name == "reduce_mean" and dtype in dtypes.INTS):
        cases.append(((0, 4), (0,)))  # empty reduction: sum 0, prod 1, mean NaN
    checks = H.Checks()
    for i, (s, axes) in enumerate(cases):
        x = _inputs(name, dtype, gen, s)
        # inputs are contiguous by contract, but may start at an offset into their buffer
        kind = "unit-axis-strides" if 1 in s else "offset" if i % 2 else "contiguous"
        with checks(f"shape {s} axes {axes} {kind}"):
            _check(device, name, x, axes, dtype, f"shape {s} axes={axes} {kind}", layout=kind)
    checks.done()


@pytest.mark.parametrize("dtype", H.FLOAT_DTYPES, ids=dtypes.name)
@pytest.mark.parametrize("name", ["reduce_max", "reduce_min"])
def test_reduce_nan_propagates(device, name, dtype):
    H.require(device, dtype)
    x = H.draw(H.rng("nan", name, dtype), (3, 4), dtype)
    x[1, 2] = np.nan
    for axes in [(0,), (1,), (0, 1)]:
        _check(device, name, x, axes, dtype, f"NaN at (1, 2), axes={axes}")


def test_reduce_sum_float16_accumulates_in_float32(device):
    # Summed in float16, 4096 ones stop growing at 2048.
    _check(device, "reduce_sum", np.ones(4096, np.float16), (0,), dtypes.float16, "4096 ones")
    _check(device, "reduce_mean", np.ones((2, 4096), np.float16), (1,), dtypes.float16, "mean of 4096 ones")


@pytest.mark.parametrize("dtype", NUMERIC, ids=dtypes.name)
@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_arg_reduce(device, name, dtype):
    H.require(device, dtype)
    gen = H.rng(name, dtype)
    ref = np.argmax if name == "argmax" else np.argmin
    checks = H.Checks()
    for shape in [SHAPE, (1, 7), (300,)]:
        # few distinct values: ties everywhere, and the first index must win
        x = gen.integers(0, 3, shape).astype(H.np_dtype(dtype))
        for axis in range(len(shape)):
            want = ref(x, axis=axis)
            with checks(f"shape {shape} axis {axis}"):
                out = H.empty(device, want.shape, dtypes.int64)
                device.table[name](out, H.layout(device, x, "offset" if axis % 2 else "contiguous"), axis=axis)
                H.assert_close(H.download(device, out), want, dtypes.int64,
                               what=f"{name} [{dtypes.name(dtype)}] shape {shape} axis {axis} (ties: first index)")
    checks.done()
    x = H.draw(gen, (5, 6), dtype, -100, 100)
    x[:, -1] = 1000 if name == "argmax" else -1000  # winner in the last position
    out = H.empty(device, (5,), dtypes.int64)
    device.table[name](out, H.upload(device, x), axis=1)
    H.assert_close(H.download(device, out), np.full(5, 5), dtypes.int64, what=f"{name} winner last")
    out = H.empty(device, (0,), dtypes.int64)
    device.table[name](out, H.upload(device, np.zeros((0, 3), H.np_dtype(dtype))), axis=1)
    H.assert_close(H.download(device, out), np.zeros(0, np.int64), dtypes.int64, what=f"{name} empty output")
