"""matmul: transposes, batch broadcasting, alpha/beta accumulation, integer, float16 and float64 dtypes, single-row and
single-column products, empty dimensions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from singa import dtypes
from singa.testing import helpers as H

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")

COVERS = {"matmul"}


def _matmul_case(device, dtype, gen, B, Ba, Bb, m, n, k, trans_a, trans_b, alpha, beta, what, offset=False):
    """One product; with `offset`, a starts inside its buffer and out is written in place into part of a buffer."""
    a = H.draw(gen, (Ba, k, m) if trans_a else (Ba, m, k), dtype, -3, 3)
    b = H.draw(gen, (Bb, n, k) if trans_b else (Bb, k, n), dtype, -3, 3)
    out = H.empty(device, (B, m, n), dtype, offset=4 if offset else 0)  # starts as NaN: beta == 0 must not read it
    c0 = np.zeros((B, m, n))
    if beta != 0:
        c0 = H.draw(gen, (B, m, n), dtype, -3, 3)
        device.write(out, c0)
    A = a.astype(np.float64).transpose(0, 2, 1) if trans_a else a.astype(np.float64)
    Bm = b.astype(np.float64).transpose(0, 2, 1) if trans_b else b.astype(np.float64)
    want = alpha * np.matmul(A, Bm) + beta * c0.astype(np.float64)
    scale = abs(alpha) * np.matmul(np.abs(A), np.abs(Bm)) + abs(beta) * np.abs(c0.astype(np.float64))
    av = H.upload(device, a, offset=3) if offset else H.upload(device, a)
    device.table["matmul"](out, av, H.upload(device, b), trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
    H.assert_close(H.download(device, out), want, dtype, scale=scale,
                   what=f"matmul [{dtypes.name(dtype)}] {what} B={B} Ba={Ba} Bb={Bb} m={m} n={n} k={k} "
                        f"trans_a={trans_a} trans_b={trans_b} alpha={alpha} beta={beta}")


@pytest.mark.parametrize("dtype", H.NUMERIC_DTYPES, ids=dtypes.name)
@pytest.mark.parametrize(("trans_a", "trans_b"), list(itertools.product([False, True], repeat=2)),
                         ids=lambda t: "T" if t else "N")
def test_matmul(device, dtype, trans_a, trans_b):
    H.require(device, dtype)
    gen = H.rng("matmul", dtype, trans_a, trans_b)
    floats = dtypes.is_float(dtype)
    scalars = [(1.0, 0.0), (0.5, 2.0) if floats else (2.0, 1.0), (1.0, 1.0)]
    checks = H.Checks()
    for i, ((Ba, Bb), (alpha, beta)) in enumerate(itertools.product([(3, 3), (1, 3), (3, 1), (1, 1)], scalars)):
        B = max(Ba, Bb) if (Ba, Bb) != (1, 1) else 1
        m, n, k = (int(v) for v in gen.integers(1, 8, 3))
        with checks(f"Ba={Ba} Bb={Bb} alpha={alpha} beta={beta}"):
            _matmul_case(device, dtype, gen, B, Ba, Bb, m, n, k, trans_a, trans_b, alpha, beta, "", offset=bool(i % 3))
    with checks("larger than a tile"):
        _matmul_case(device, dtype, gen, 2, 2, 2, 67, 45, 129, trans_a, trans_b, 1.0, 0.0, "larger than a tile")
    with checks("1x1x1"):
        _matmul_case(device, dtype, gen, 1, 1, 1, 1, 1, 1, trans_a, trans_b, 1.0, 0.0, "1x1x1")
    checks.done()


@pytest.mark.parametrize("dtype", H.NUMERIC_DTYPES, ids=dtypes.name)
@pytest.mark.parametrize(("trans_a", "trans_b"), list(itertools.product([False, True], repeat=2)),
                         ids=lambda t: "T" if t else "N")
def test_matmul_vector(device, dtype, trans_a, trans_b):
    """Products with a single output row (m == 1) or column (n == 1), i.e. matrix-vector products, which a backend may
    compute apart from the general case: alone, batched and broadcast, with alpha/beta, and long enough for a backend
    to split one over several threads."""
    H.require(device, dtype)
    gen = H.rng("matmul-vector", dtype, trans_a, trans_b)
    floats = dtypes.is_float(dtype)
    scalars = [(1.0, 0.0), (0.5, 2.0) if floats else (2.0, 1.0)]
    small = [(1, 37, 23, "one row"), (29, 1, 23, "one column"), (1, 1, 41, "one dot product")]
    # past 2 million multiply-adds, so that the CPU backend splits them over threads; floats only, where the products
    # take their own path
    large = [(1, 300, 7000, "one long row"), (300, 1, 7000, "one long column")] if floats else []
    batches = [(1, 1, 1), (3, 3, 3), (3, 3, 1), (3, 1, 3)]  # (B, Ba, Bb)
    cases = [(shape, bat, sc) for shape in small for bat in batches for sc in scalars]
    cases += [(shape, bat, sc) for shape in large for bat in [(1, 1, 1), (3, 3, 1)] for sc in scalars]
    checks = H.Checks()
    for i, ((m, n, k, what), (B, Ba, Bb), (alpha, beta)) in enumerate(cases):
        with checks(f"{what} B={B} Ba={Ba} Bb={Bb} alpha={alpha} beta={beta}"):
            _matmul_case(device, dtype, gen, B, Ba, Bb, m, n, k, trans_a, trans_b, alpha, beta, what,
                         offset=bool(i % 2))
    checks.done()


@pytest.mark.parametrize("dtype", H.NUMERIC_DTYPES, ids=dtypes.name)
def test_matmul_empty(device, dtype):
    H.require(device, dtype)
    gen = H.rng("matmul-empty", dtype)
    checks = H.Checks()
    for tb in (False, True):
        # k == 0: the product is zero, so out = beta * out
        for args in [(2, 2, 1, 3, 4, 0, False, tb, 1.0, 0.0, "empty k"),
                     (2, 2, 1, 3, 4, 0, True, tb, 1.0, 1.0, "empty k, accumulate"),
                     (2, 2, 2, 0, 4, 3, False, tb, 1.0, 0.0, "empty m"),
                     (2, 1, 2, 3, 0, 3, False, tb, 1.0, 0.0, "empty n"),
                     (0, 0, 0, 3, 4, 5, False, tb, 1.0, 0.0, "empty batch"),
                     (0, 1, 0, 3, 4, 5, True, tb, 1.0, 0.0, "empty batch, a broadcast")]:
            with checks(f"{args[-1]} trans_b={tb}"):
                _matmul_case(device, dtype, gen, *args)
    checks.done()
