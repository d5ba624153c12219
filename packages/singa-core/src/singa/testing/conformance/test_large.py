"""Sizes large enough that a backend splits the work over threads, blocks or vector lanes (a few hundred thousand
elements), where races, chunk boundaries and tails live. The small-shape modules cover the semantics."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from singa import dtypes
from singa.expressions import TABLE
from singa.testing import helpers as H
from singa.testing.conformance.references import (
    conv_backward_data_ref,
    conv_backward_weight_ref,
    conv_ref,
    draws_uniform_fast,
    log_softmax_ref,
    pool_backward_ref,
    pool_ref,
    softmax_ref,
)

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")

COVERS: set = set()  # every kernel here has its semantics tested elsewhere

F32 = dtypes.float32
F64 = dtypes.float64
N_LARGE = 300_007  # odd, so no thread's share is a round number


def _entry_ref(name, *xs):
    wide = [x.astype(np.int64 if x.dtype.kind == "i" else np.float64) for x in xs]
    with np.errstate(all="ignore"):
        return np.asarray(TABLE[name].ref(*wide))


@pytest.mark.parametrize("dtype", H.NUMERIC_DTYPES, ids=dtypes.name)
def test_large_elementwise(device, dtype):
    H.require(device, dtype)
    gen = H.rng("large-ew", dtype)
    checks = H.Checks()
    x = H.draw(gen, (N_LARGE,), dtype, -9, 9)
    for name in ("exp", "neg", "tanh", "relu", "abs"):
        if dtype not in TABLE[name].kernel_dtypes:
            continue
        with checks(name):
            out = H.empty(device, x.shape, dtype)
            device.table[name](out, H.upload(device, x, offset=3))
            H.assert_close(H.download(device, out), _entry_ref(name, x), dtype, what=f"{name} of {x.size}")
    a, b = H.draw(gen, (600, 701), dtype, -9, 9), H.draw(gen, (1, 701), dtype, 1, 3)
    for name in ("add", "mul", "div", "maximum"):
        with checks(f"{name} broadcast"):
            out = H.empty(device, a.shape, dtype)
            device.table[name](out, H.transposed(device, a), H.broadcast(device, b, a.shape))
            H.assert_close(H.download(device, out), _entry_ref(name, a, np.broadcast_to(b, a.shape)), dtype,
                           what=f"{name} (600, 701) transposed x row broadcast")
    with checks("lt"):
        out = H.empty(device, a.shape, dtypes.bool_)
        device.table["lt"](out, H.upload(device, a), H.stepped(device, a[::-1]))
        H.assert_close(H.download(device, out), a < a[::-1], dtypes.bool_, what="lt (600, 701)")
    checks.done()


def test_large_memory(device):
    gen = H.rng("large-mem")
    checks = H.Checks()
    big = H.draw(gen, (3_000_001,), F32)  # 12 MB: past any memcpy splitting threshold
    with checks("copy 12 MB"):
        out = H.empty(device, big.shape, F32)
        device.table["copy"](out, H.upload(device, big, offset=1))
        H.assert_close(H.download(device, out), big, F32, rtol=0, atol=0, what="copy 12 MB")
    with checks("fill 12 MB"):
        out = H.empty(device, big.shape, F32)
        device.table["fill"](out, value=-1.25)
        H.assert_close(H.download(device, out), np.full(big.shape, -1.25), F32, rtol=0, atol=0, what="fill 12 MB")
    m = H.draw(gen, (700, 900), F32)
    with checks("copy transposed"):
        out = H.empty(device, m.shape, F32)
        device.table["copy"](out, H.transposed(device, m))
        H.assert_close(H.download(device, out), m, F32, rtol=0, atol=0, what="copy of a transposed (700, 900)")
    for dst in (dtypes.int32, dtypes.float16):
        with checks(f"cast to {dtypes.name(dst)}"):
            out = H.empty(device, m.shape, dst)
            src = m * np.float32(100)
            device.table["cast"](out, H.upload(device, src))
            want = np.trunc(src.astype(np.float64)) if dst == dtypes.int32 else src.astype(np.float64)
            H.assert_close(H.download(device, out), want, dst, rtol=1e-3 if dst == dtypes.float16 else 0,
                           atol=0, what=f"cast (700, 900) to {dtypes.name(dst)}")
    with checks("where"):
        cond = gen.random(m.shape) < 0.5
        out = H.empty(device, m.shape, F32)
        device.table["where"](out, H.upload(device, cond), H.upload(device, m), H.broadcast(device, m[:1], m.shape))
        H.assert_close(H.download(device, out), np.where(cond, m, m[:1]), F32, rtol=0, atol=0, what="where")
    checks.done()


@pytest.mark.parametrize("dtype", [F32, dtypes.float16, F64, dtypes.int64], ids=dtypes.name)
def test_large_reductions(device, dtype):
    H.require(device, dtype)
    gen = H.rng("large-red", dtype)
    x = H.draw(gen, (1024, 701), dtype, -9, 9)
    w = x.astype(np.float64)
    checks = H.Checks()
    for axes in [(0,), (1,), (0, 1)]:
        for name, want, scale in (("reduce_sum", w.sum(axis=axes), np.abs(w).sum(axis=axes)),
                                  ("reduce_max", w.max(axis=axes), None),
                                  ("reduce_min", w.min(axis=axes), None)):
            with checks(f"{name} axes {axes}"):
                out = H.empty(device, want.shape, dtype)
                device.table[name](out, H.upload(device, x), axes=axes)
                H.assert_close(H.download(device, out), want, dtype, scale=scale,
                               what=f"{name} of (1024, 701) over {axes}")
        with checks(f"argmax axis {axes[0]}"):
            want = np.argmax(x, axis=axes[0])
            out = H.empty(device, want.shape, dtypes.int64)
            device.table["argmax"](out, H.upload(device, x), axis=axes[0])
            H.assert_close(H.download(device, out), want, dtypes.int64, what=f"argmax axis {axes[0]} (first of ties)")
    checks.done()


@pytest.mark.parametrize("dtype", [F32, F64], ids=dtypes.name)
def test_large_matmul(device, dtype):
    H.require(device, dtype)
    gen = H.rng("large-mm")
    checks = H.Checks()
    for ta, tb in ((False, False), (True, False), (False, True), (True, True)):
        m, n, k = 129, 97, 203
        a = H.draw(gen, (2, k, m) if ta else (2, m, k), dtype)
        b = H.draw(gen, (1, n, k) if tb else (1, k, n), dtype)
        A = a.astype(np.float64).transpose(0, 2, 1) if ta else a.astype(np.float64)
        B = b.astype(np.float64).transpose(0, 2, 1) if tb else b.astype(np.float64)
        with checks(f"trans_a={ta} trans_b={tb}"):
            out = H.empty(device, (2, m, n), dtype)
            device.table["matmul"](out, H.upload(device, a), H.upload(device, b), trans_a=ta, trans_b=tb,
                                   alpha=1.0, beta=0.0)
            H.assert_close(H.download(device, out), A @ B, dtype, scale=np.abs(A) @ np.abs(B),
                           what=f"matmul 2x{m}x{n}x{k} trans_a={ta} trans_b={tb}")
    checks.done()


@functools.lru_cache(maxsize=1)
def _conv_pool_data():
    """Inputs and float64 references (the direct summations take a second or two: computed once for all devices)."""
    gen = H.rng("large-conv")
    x = H.draw(gen, (8, 8, 32, 32), F32, -1, 1)
    w = H.draw(gen, (16, 4, 3, 3), F32, -1, 1)
    b = H.draw(gen, (16,), F32)
    dy = H.draw(gen, (8, 16, 32, 32), F32, -1, 1)
    p = {"stride": (1, 1), "padding": (1, 1, 1, 1), "dilation": (1, 1), "groups": 2}
    ax, aw, ady = np.abs(x), np.abs(w), np.abs(dy)
    refs = {
        "conv2d": (conv_ref(x, w, b, 32, 32, **p), conv_ref(ax, aw, np.abs(b), 32, 32, **p)),
        "conv2d_backward_data": (conv_backward_data_ref(dy, w, x.shape, **p),
                                 conv_backward_data_ref(ady, aw, x.shape, **p)),
        "conv2d_backward_weight": (conv_backward_weight_ref(dy, x, w.shape, **p),
                                   conv_backward_weight_ref(ady, ax, w.shape, **p)),
    }
    xp = (gen.permutation(8 * 16 * 32 * 32).reshape(8, 16, 32, 32) * 1e-3).astype(np.float32)  # distinct values
    pp = {"kernel": (3, 3), "stride": (1, 1), "padding": (1, 1, 1, 1), "dilation": (1, 1)}
    g = H.draw(gen, (8, 16, 32, 32), F32, -1, 1)
    pools = {}
    for mode in ("max", "avg"):
        want, idx = pool_ref(xp, 32, 32, mode=mode, count_include_pad=False, **pp)
        pools[mode] = (want, idx, pool_backward_ref(g, xp.shape, idx, mode=mode, count_include_pad=False, **pp))
    return x, w, b, dy, p, refs, xp, pp, g, pools


@pytest.mark.parametrize("dtype", [F32, F64], ids=dtypes.name)
def test_large_conv_pool(device, dtype):
    H.require(device, dtype)
    x, w, b, dy, p, refs, xp, pp, g, pools = _conv_pool_data()
    checks = H.Checks()
    with checks("conv2d"):
        out = H.empty(device, (8, 16, 32, 32), dtype)
        device.table["conv2d"](out, H.upload(device, x, dtype), H.upload(device, w, dtype), H.upload(device, b, dtype),
                               **p)
        H.assert_close(H.download(device, out), refs["conv2d"][0], dtype, scale=refs["conv2d"][1],
                       what="conv2d (8, 8, 32, 32)")
    with checks("conv2d_backward_data"):
        dx = H.empty(device, x.shape, dtype)
        device.table["conv2d_backward_data"](dx, H.upload(device, dy, dtype), H.upload(device, w, dtype), **p)
        want, scale = refs["conv2d_backward_data"]
        H.assert_close(H.download(device, dx), want, dtype, scale=scale, what="conv2d_backward_data")
    with checks("conv2d_backward_weight"):
        dw = H.empty(device, w.shape, dtype)
        device.table["conv2d_backward_weight"](dw, H.upload(device, dy, dtype), H.upload(device, x, dtype), **p)
        want, scale = refs["conv2d_backward_weight"]
        H.assert_close(H.download(device, dw), want, dtype, scale=scale, what="conv2d_backward_weight")
    for mode, (want, idx, want_dx) in pools.items():
        with checks(f"pool2d {mode}"):
            out = H.empty(device, want.shape, dtype)
            ind = H.empty(device, want.shape, dtypes.int64) if mode == "max" else None
            device.table["pool2d"](out, ind, H.upload(device, xp, dtype), mode=mode, count_include_pad=False, **pp)
            H.assert_close(H.download(device, out), want, dtype, what=f"pool2d {mode} (8, 16, 32, 32)")
            if ind is not None:
                H.assert_close(H.download(device, ind), idx, dtypes.int64, what="pool2d max indices")
        with checks(f"pool2d_backward {mode}"):
            dx = H.empty(device, xp.shape, dtype)
            device.table["pool2d_backward"](dx, H.upload(device, g, dtype), H.upload(device, xp, dtype),
                                            H.upload(device, idx) if mode == "max" else None, mode=mode,
                                            count_include_pad=False, **pp)
            H.assert_close(H.download(device, dx), want_dx, dtype, scale=9, what=f"pool2d_backward {mode}")
    checks.done()


@pytest.mark.parametrize("dtype", [F32, F64], ids=dtypes.name)
def test_large_nn(device, dtype):
    H.require(device, dtype)
    f32 = dtype == F32  # float32 results get the bounds written here; float64 ones the suite's own
    gen = H.rng("large-nn")
    checks = H.Checks()
    x = H.draw(gen, (96, 1031), F32, -5, 5).astype(H.np_dtype(dtype))
    for axis in (0, 1):
        for name, ref in (("softmax", softmax_ref), ("log_softmax", log_softmax_ref)):
            with checks(f"{name} axis {axis}"):
                out = H.empty(device, x.shape, dtype)
                device.table[name](out, H.upload(device, x), axis=axis)
                H.assert_close(H.download(device, out), ref(x.astype(np.float64), axis), dtype,
                               scale=5 if name == "log_softmax" else None, what=f"{name} (96, 1031) axis {axis}")
    labels = gen.integers(0, 1031, 96)
    with checks("softmax_cross_entropy"):
        loss = H.empty(device, (96,), dtype)
        device.table["softmax_cross_entropy"](loss, H.upload(device, x), H.upload(device, labels.astype(np.int64)))
        want = -log_softmax_ref(x.astype(np.float64), 1)[np.arange(96), labels]
        H.assert_close(H.download(device, loss), want, dtype, scale=10, what="softmax_cross_entropy (96, 1031)")
    xb = gen.normal(0.3, 2.0, (32, 16, 16, 16)).astype(H.np_dtype(dtype))
    scale, bias = np.ones(16, H.np_dtype(dtype)), np.zeros(16, H.np_dtype(dtype))
    with checks("batchnorm_train"):
        y, rm, rv, sm, si = (H.empty(device, s, dtype) for s in (xb.shape, (16,), (16,), (16,), (16,)))
        device.write(rm, np.zeros(16, H.np_dtype(dtype)))
        device.write(rv, np.ones(16, H.np_dtype(dtype)))
        device.table["batchnorm_train"](y, rm, rv, sm, si, H.upload(device, xb), H.upload(device, scale),
                                        H.upload(device, bias), momentum=0.9, eps=1e-5)
        w = xb.astype(np.float64)
        mean, var = w.mean(axis=(0, 2, 3)), w.var(axis=(0, 2, 3))
        H.assert_close(H.download(device, sm), mean, dtype, scale=2,
                       what="batchnorm_train saved_mean (32, 16, 16, 16)")
        H.assert_close(H.download(device, si), 1 / np.sqrt(var + 1e-5), dtype, rtol=1e-4 if f32 else None,
                       what="saved_invstd")
        H.assert_close(H.download(device, y), (w - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5), dtype,
                       rtol=1e-4 if f32 else None, atol=1e-4 if f32 else None, what="batchnorm_train y")
    checks.done()


@pytest.mark.parametrize("dtype", [F32, F64], ids=dtypes.name)
def test_large_indexing(device, dtype):
    H.require(device, dtype)
    gen = H.rng("large-idx")
    checks = H.Checks()
    x = H.draw(gen, (2000, 301), dtype)
    idx = gen.integers(-2000, 2000, 777)
    with checks("gather"):
        out = H.empty(device, (777, 301), dtype)
        device.table["gather"](out, H.upload(device, x), H.upload(device, idx.astype(np.int64)), axis=0)
        H.assert_close(H.download(device, out), x[np.where(idx < 0, idx + 2000, idx)], dtype, rtol=0, atol=0,
                       what="gather 777 rows of (2000, 301)")
    with checks("scatter_add, heavy collisions"):
        # 20000 rows of updates into 7 rows: threads that split the updates collide on every output element
        idx = gen.integers(0, 7, 20_000)
        upd = gen.integers(-4, 5, (20_000, 64)).astype(H.np_dtype(dtype))  # small integers: every order sums exactly
        out = H.empty(device, (7, 64), dtype)
        device.write(out, np.zeros((7, 64), H.np_dtype(dtype)))
        device.table["scatter_add"](out, H.upload(device, idx.astype(np.int64)), H.upload(device, upd), axis=0)
        want = np.zeros((7, 64))
        for r in range(7):
            want[r] = upd[idx == r].sum(axis=0)
        H.assert_close(H.download(device, out), want, dtype, rtol=0, atol=0, what="scatter_add lost updates")
    with checks("pad reflect"):
        m = H.draw(gen, (500, 600), dtype)
        out = H.empty(device, (507, 611), dtype)
        device.table["pad"](out, H.upload(device, m), pads=(3, 5, 4, 6), mode="reflect", value=0.0)
        H.assert_close(H.download(device, out), np.pad(m, ((3, 4), (5, 6)), mode="reflect"), dtype, rtol=0, atol=0,
                       what="pad reflect (500, 600)")
    checks.done()


@pytest.mark.parametrize("dtype", [F32, F64], ids=dtypes.name)
def test_large_random(device, dtype):
    H.require(device, dtype)
    n = 1_000_003
    seed, offset = 0xDEADBEEF12345, 10
    checks = H.Checks()
    with checks("random_uniform"):
        out = H.empty(device, (n,), dtype)
        device.table["random_uniform"](out, low=0.0, high=1.0, seed=seed, offset=offset)
        H.assert_close(H.download(device, out), draws_uniform_fast(seed, offset, n), dtype, rtol=0, atol=0,
                       what="random_uniform, 1M draws")
    with checks("random_normal"):
        out = H.empty(device, (n // 2,), dtype)
        device.table["random_normal"](out, mean=0.0, std=1.0, seed=seed, offset=offset)
        u = draws_uniform_fast(seed, offset, 2 * (n // 2))
        want = np.sqrt(-2 * np.log1p(-u[0::2])) * np.cos(2 * np.pi * u[1::2])
        tol = {"rtol": 1e-5, "atol": 3e-5} if dtype == F32 else {}
        H.assert_close(H.download(device, out), want, dtype, **tol, what="random_normal, 500k")
    with checks("random_bernoulli"):
        out = H.empty(device, (n,), dtypes.bool_)
        device.table["random_bernoulli"](out, p=0.25, seed=seed, offset=offset)
        H.assert_close(H.download(device, out), draws_uniform_fast(seed, offset, n) < 0.25, dtypes.bool_,
                       what="random_bernoulli, 1M")
    checks.done()
