"""Random numbers: the Philox4x32-10 stream of singa.primitives.PHILOX_DOC, reproduced here from the document and
checked against Random123's known answers, then compared draw for draw with the device."""

from __future__ import annotations

import math

import numpy as np
import pytest

from singa import dtypes
from singa.testing import helpers as H
from singa.testing.conformance.references import (
    KNOWN_ANSWERS,
    draws_u32,
    draws_uniform,
    draws_uniform_fast,
    normal_reference,
    philox4x32_10,
)

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")

COVERS = {"random_uniform", "random_normal", "random_bernoulli"}


@pytest.mark.parametrize(("counter", "key", "want"), KNOWN_ANSWERS)
def test_reference_philox_known_answers(counter, key, want):
    assert philox4x32_10(counter, key) == want


def test_reference_stream_layout():
    # draw c uses block c // 4 (64-bit, low word first) and word c % 4; the key is (seed low, seed high)
    seed = (7 << 32) | 3
    blk = (1 << 32) + 5
    assert draws_u32(seed, 4 * blk + 2, 3) == [*philox4x32_10((5, 1, 0, 0), (3, 7))[2:],
                                                philox4x32_10((6, 1, 0, 0), (3, 7))[0]]


@pytest.mark.parametrize(("seed", "offset", "n"), [(0, 0, 9), (5, 3, 17), (2 ** 40 + 9, 4 * (2 ** 32 - 1) + 2, 11)])
def test_reference_fast_matches_scalar(seed, offset, n):
    assert np.array_equal(draws_uniform_fast(seed, offset, n), draws_uniform(seed, offset, n))


# seeds over 32 bits use both key words; offsets not a multiple of 4 start inside a block
STREAMS = [(0, 0), (42, 6), (0x1234_5678_9ABC_DEF0, 4 * (1 << 32) + 1)]


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64], ids=dtypes.name)
@pytest.mark.parametrize(("seed", "offset"), STREAMS)
def test_random_uniform(device, seed, offset, dtype):
    H.require(device, dtype)
    n = 1003
    u = draws_uniform(seed, offset, n)
    out = H.empty(device, (n,), dtype)
    device.table["random_uniform"](out, low=0.0, high=1.0, seed=seed, offset=offset)
    # (r >> 8) * 2**-24 is exact in float32 (and float64): the stream must match bit for bit
    H.assert_close(H.download(device, out), u, dtype, rtol=0, atol=0, what="random_uniform [0, 1)")


@pytest.mark.parametrize("dtype", H.FLOAT_DTYPES, ids=dtypes.name)
@pytest.mark.parametrize(("seed", "offset"), STREAMS)
def test_random_uniform_range(device, seed, offset, dtype):
    # float64 output keeps the 24-bit draws: low + (high - low) * u, in double, with nothing rounded away
    H.require(device, dtype)
    shape = (17, 59) if dtype == dtypes.float32 else (1003,)
    out = H.empty(device, shape, dtype)
    device.table["random_uniform"](out, low=-2.0, high=3.0, seed=seed, offset=offset)
    want = (-2.0 + 5.0 * draws_uniform(seed, offset, int(np.prod(shape)))).reshape(shape)
    atol = {dtypes.float32: 2e-6, dtypes.float16: 5e-3}.get(dtype)
    H.assert_close(H.download(device, out), want, dtype, atol=atol,
                   what=f"random_uniform [-2, 3) {dtypes.name(dtype)} {shape}")


def test_random_uniform_empty_and_scalar(device):
    out = H.empty(device, (0, 4), dtypes.float32)
    device.table["random_uniform"](out, low=0.0, high=1.0, seed=1, offset=0)
    assert H.download(device, out).shape == (0, 4)
    out = H.empty(device, (), dtypes.float32)
    device.table["random_uniform"](out, low=0.0, high=1.0, seed=1, offset=9)
    assert float(H.download(device, out)) == draws_uniform(1, 9, 1)[0]


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64], ids=dtypes.name)
@pytest.mark.parametrize(("seed", "offset"), STREAMS)
def test_random_normal_stream(device, seed, offset, dtype):
    H.require(device, dtype)
    n = 501
    out = H.empty(device, (3, 167), dtype)
    device.table["random_normal"](out, mean=0.5, std=2.0, seed=seed, offset=offset)
    # float32 log and cos of 2*pi*u: absolute error grows with sqrt(-2 ln(1-u)) <= 5.8
    tol = {"rtol": 1e-5, "atol": 5e-5} if dtype == dtypes.float32 else {}
    H.assert_close(H.download(device, out).reshape(-1), normal_reference(seed, offset, n, 0.5, 2.0),
                   dtype, **tol, what="random_normal vs Box-Muller on the Philox stream")


def test_random_normal_moments_and_determinism(device):
    n = 200_000
    out = H.empty(device, (n,), dtypes.float32)
    device.table["random_normal"](out, mean=-1.0, std=3.0, seed=2024, offset=0)
    x = H.download(device, out).astype(np.float64)
    assert np.isfinite(x).all()
    se = 3.0 / math.sqrt(n)
    assert abs(x.mean() + 1.0) < 5 * se, f"mean {x.mean()}"
    assert abs(x.std() - 3.0) < 5 * 3.0 / math.sqrt(2 * n), f"std {x.std()}"
    z = (x + 1.0) / 3.0
    assert abs(np.mean(z ** 3)) < 5 * math.sqrt(15 / n), "skewness"
    assert abs(np.mean(z ** 4) - 3) < 5 * math.sqrt(96 / n), "kurtosis"
    again = H.empty(device, (n,), dtypes.float32)
    device.table["random_normal"](again, mean=-1.0, std=3.0, seed=2024, offset=0)
    assert np.array_equal(H.download(device, again), x.astype(np.float32)), "same seed and offset, other numbers"
    other = H.empty(device, (n,), dtypes.float32)
    device.table["random_normal"](other, mean=-1.0, std=3.0, seed=2024, offset=2 * n)
    assert np.mean(H.download(device, other) == x.astype(np.float32)) < 1e-3, "a later offset repeats the stream"


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.float64, dtypes.int32, dtypes.bool_],
                         ids=dtypes.name)
@pytest.mark.parametrize("p", [0.375, 0.8125])  # exact in binary: u < p cannot depend on p's precision
def test_random_bernoulli(device, dtype, p):
    H.require(device, dtype)
    n = 4099
    seed, offset = 77, 13
    out = H.empty(device, (n,), dtype)
    device.table["random_bernoulli"](out, p=p, seed=seed, offset=offset)
    got = H.download(device, out)
    want = draws_uniform(seed, offset, n) < p
    H.assert_close(got, want.astype(H.np_dtype(dtype)), dtype, rtol=0, atol=0, what=f"random_bernoulli p={p}")
    rate = float(np.mean(got.astype(np.float64)))
    assert abs(rate - p) < 5 * math.sqrt(p * (1 - p) / n), f"rate {rate} for p={p}"
