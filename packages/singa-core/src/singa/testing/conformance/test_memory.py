"""fill, copy, cast and where: the kernels that take views of any strides, outputs included (fill, copy)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from singa import dtypes
from singa.backend import View, contiguous_strides
from singa.testing import helpers as H

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")

COVERS = {"fill", "copy", "cast", "where"}

ALL = H.ALL_DTYPES


def _value(dtype):
    return {dtypes.bool_: True, dtypes.int32: -7, dtypes.int64: 2 ** 40 + 3}.get(dtype, 2.75)


def _strided_target(device, dtype, shape, gen):
    """A stepped view into a buffer of known contents: (view, buffer contents before, mask of the view's elements)."""
    big_shape = tuple(max(2 * d, 1) for d in shape)
    total = int(np.prod(big_shape)) + 4
    before = H.draw(gen, (total,), dtype, -50, 50)
    base = H.upload(device, before)
    sel = tuple(slice(0, 2 * d, 2) for d in shape)
    strides = tuple(2 * s for s in contiguous_strides(big_shape))
    view = View(base.buffer, dtype, shape, strides, offset=3)
    mask = np.zeros(total, bool)
    region = mask[3:3 + int(np.prod(big_shape))].reshape(big_shape)
    region[sel] = True
    return view, before, mask


@pytest.mark.parametrize("dtype", ALL, ids=dtypes.name)
def test_fill(device, dtype):
    H.require(device, dtype)
    gen = H.rng("fill", dtype)
    value = _value(dtype)
    for shape in [(3, 4, 5), (), (0, 4), (1031,)]:
        out = H.empty(device, shape, dtype)
        device.table["fill"](out, value=value)
        H.assert_close(H.download(device, out), np.full(shape, value), dtype, what=f"fill {shape}")
    # strided output: only the view's elements change
    view, before, mask = _strided_target(device, dtype, (3, 4), gen)
    device.table["fill"](view, value=value)
    after = H.read_buffer(device, view, 0, before.size)
    want = np.where(mask, np.array(value).astype(H.np_dtype(dtype)), before)
    H.assert_close(after, want, dtype, what="fill into a stepped view (elements outside it must not change)")


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64], ids=dtypes.name)
def test_fill_float_values(device, dtype):
    H.require(device, dtype)
    out = H.empty(device, (4,), dtype)
    for v in (0.1, -3.0e38, np.inf, -0.0, 1 / 3):
        device.table["fill"](out, value=v)
        H.assert_close(H.download(device, out), np.full(4, v, H.np_dtype(dtype)), dtype, rtol=0, atol=0,
                       what=f"fill {v}")
    device.table["fill"](out, value=float("nan"))
    assert np.isnan(H.download(device, out)).all(), "fill NaN"


@pytest.mark.parametrize("dtype", ALL, ids=dtypes.name)
def test_copy(device, dtype):
    H.require(device, dtype)
    gen = H.rng("copy", dtype)
    shape = (3, 4, 5)
    x = H.draw(gen, shape, dtype, -50, 50)
    for kind in H.LAYOUTS:
        out = H.empty(device, shape, dtype)
        device.table["copy"](out, H.layout(device, x, kind))
        H.assert_close(H.download(device, out), x, dtype, rtol=0, atol=0, what=f"copy from {kind}")
    row = H.draw(gen, (1, 4, 1), dtype, -50, 50)
    out = H.empty(device, shape, dtype)
    device.table["copy"](out, H.broadcast(device, row, shape))
    H.assert_close(H.download(device, out), np.broadcast_to(row, shape), dtype, rtol=0, atol=0,
                   what="copy from a broadcast view (expand)")
    for s in [(), (0, 3), (1031,)]:
        v = H.draw(gen, s, dtype, -50, 50)
        out = H.empty(device, s, dtype)
        device.table["copy"](out, H.upload(device, v, offset=2))
        H.assert_close(H.download(device, out), v, dtype, rtol=0, atol=0, what=f"copy {s}")


@pytest.mark.parametrize("dtype", ALL, ids=dtypes.name)
def test_copy_into_strided_output(device, dtype):
    H.require(device, dtype)
    gen = H.rng("copy-strided", dtype)
    x = H.draw(gen, (3, 4), dtype, -50, 50)
    view, before, mask = _strided_target(device, dtype, (3, 4), gen)
    device.table["copy"](view, H.transposed(device, x))
    after = H.read_buffer(device, view, 0, before.size)
    want = before.copy()
    want[mask] = x.reshape(-1)
    H.assert_close(after, want, dtype, rtol=0, atol=0, what="transposed -> stepped (outside must not change)")


@pytest.mark.parametrize("dtype", ALL, ids=dtypes.name)
def test_copy_concat_halves(device, dtype):
    # concat along axis 1 = two copies into column blocks of one output
    H.require(device, dtype)
    gen = H.rng("concat", dtype)
    a, b = H.draw(gen, (3, 2), dtype, -50, 50), H.draw(gen, (3, 5), dtype, -50, 50)
    out = H.empty(device, (3, 7), dtype)
    device.table["copy"](View(out.buffer, dtype, (3, 2), (7, 1), 0), H.upload(device, a))
    device.table["copy"](View(out.buffer, dtype, (3, 5), (7, 1), 2), H.upload(device, b, offset=1))
    H.assert_close(H.download(device, out), np.concatenate([a, b], axis=1), dtype, rtol=0, atol=0, what="concat")


def _cast_source(dtype, gen, shape):
    """Values that exercise each conversion rule: fractions of both signs (truncation), zeros (bool), small ints."""
    if dtype == dtypes.bool_:
        return gen.random(shape) < 0.5
    if dtype in dtypes.INTS:
        return gen.integers(-300, 301, shape).astype(H.np_dtype(dtype))
    x = gen.uniform(-300, 300, shape)
    x.reshape(-1)[::5] = 0.0
    x.reshape(-1)[1::7] = gen.uniform(-0.99, 0.99, x.reshape(-1)[1::7].shape)  # truncate to 0 but are true
    x.reshape(-1)[2::9] = -0.0
    return x.astype(H.np_dtype(dtype))


def _cast_reference(x: np.ndarray, to: int) -> np.ndarray:
    if to == dtypes.bool_:
        return x != 0
    if to in dtypes.INTS:
        return np.trunc(x.astype(np.float64)).astype(H.np_dtype(to)) if x.dtype.kind == "f" else x.astype(
            H.np_dtype(to))
    return x.astype(H.np_dtype(to))  # rounded to nearest, as C converts (float64 -> float32 rounds)


@pytest.mark.parametrize("src", ALL, ids=dtypes.name)
@pytest.mark.parametrize("dst", ALL, ids=dtypes.name)
def test_cast(device, src, dst):
    H.require(device, src, dst)
    gen = H.rng("cast", src, dst)
    shape = (4, 6)
    x = _cast_source(src, gen, shape)
    want = _cast_reference(x, dst)
    # float -> float16 rounds; allow a whole float16 ulp so the rounding mode is not under test
    tol = {"rtol": 1e-3, "atol": 0} if dst == dtypes.float16 else {"rtol": 0, "atol": 0}
    checks = H.Checks()
    for kind in ("contiguous", "transposed", "stepped"):
        with checks(kind):
            out = H.empty(device, shape, dst)
            device.table["cast"](out, H.layout(device, x, kind))
            H.assert_close(H.download(device, out), want, dst,
                           what=f"cast {dtypes.name(src)} -> {dtypes.name(dst)} from {kind}", **tol)
    for s in [(), (0, 2)]:
        v = _cast_source(src, gen, s)
        with checks(f"shape {s}"):
            out = H.empty(device, s, dst)
            device.table["cast"](out, H.upload(device, v))
            H.assert_close(H.download(device, out), _cast_reference(v, dst), dst, what=f"cast {s}", **tol)
    checks.done()


@pytest.mark.parametrize("dtype", ALL, ids=dtypes.name)
def test_where(device, dtype):
    H.require(device, dtype)
    gen = H.rng("where", dtype)
    shape = (4, 5)
    # every mix of operands read along the rows, broadcast along them (axis 1) or broadcast whole
    for pc, pa, pb in itertools.product(((), (0,), (1,)), ((), (1,), (0, 1)), ((), (0,), (1,))):
        cond = gen.random(tuple(1 if i in pc else d for i, d in enumerate(shape))) < 0.5
        a = H.draw(gen, tuple(1 if i in pa else d for i, d in enumerate(shape)), dtype, -50, 50)
        b = H.draw(gen, tuple(1 if i in pb else d for i, d in enumerate(shape)), dtype, -50, 50)
        out = H.empty(device, shape, dtype)
        device.table["where"](out, H.broadcast(device, cond, shape), H.broadcast(device, a, shape),
                              H.broadcast(device, b, shape))
        H.assert_close(H.download(device, out), np.broadcast_to(np.where(cond, a, b), shape), dtype, rtol=0, atol=0,
                       what=f"where: cond over {pc}, a over {pa}, b over {pb}")
    s3 = (3, 4, 2)
    cond, a, b = gen.random(s3) < 0.5, H.draw(gen, s3, dtype, -50, 50), H.draw(gen, s3, dtype, -50, 50)
    out = H.empty(device, s3, dtype)
    device.table["where"](out, H.stepped(device, cond), H.transposed(device, a), H.upload(device, b, offset=3))
    H.assert_close(H.download(device, out), np.where(cond, a, b), dtype, rtol=0, atol=0, what="where, strided")
    for s in [(), (0, 3)]:
        cond, a, b = gen.random(s) < 0.5, H.draw(gen, s, dtype, -50, 50), H.draw(gen, s, dtype, -50, 50)
        out = H.empty(device, s, dtype)
        device.table["where"](out, H.upload(device, cond), H.upload(device, a), H.upload(device, b))
        H.assert_close(H.download(device, out), np.where(cond, a, b), dtype, rtol=0, atol=0, what=f"where {s}")
