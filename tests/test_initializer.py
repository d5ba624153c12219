"""singa.initializer: each fill checked statistically against its formula, on the default device.

Tensors are large (~10^5 values), so the sample std is within ~0.3% of the true one: the 3% tolerances below catch
any wrong factor (sqrt(2), fan_in instead of fan_avg, ...) while a correct implementation fails with negligible
probability. Shapes are chosen so that fan_in, fan_out and their mean differ by more than 25%.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from singa import device, initializer, tensor

DEV = device.get_default_device()
DENSE = (500, 125)  # Linear weight (in, out): fan_in 500, fan_out 125
CONV = (64, 32, 5, 5)  # conv weight (out, in, kh, kw): fan_in 800, fan_out 1600


def _t(shape, dtype=tensor.float32) -> tensor.Tensor:
    return tensor.Tensor(shape, DEV, dtype)


def _fans(shape) -> tuple[float, float]:
    if len(shape) == 2:
        return shape[0], shape[1]
    rf = math.prod(shape[2:])
    return shape[1] * rf, shape[0] * rf


def _check_normal(a: np.ndarray, std: float) -> None:
    a = a.astype(np.float64).ravel()
    assert abs(a.mean()) < 5 * std / math.sqrt(a.size)
    assert a.std() == pytest.approx(std, rel=0.03)
    # a Gaussian, not a uniform of the same variance: about 4.6% of values beyond 2 std (a uniform has none)
    assert 0.035 < np.mean(np.abs(a) > 2 * std) < 0.057


def _check_uniform(a: np.ndarray, limit: float) -> None:
    a = a.astype(np.float64).ravel()
    assert a.min() >= -limit
    assert a.max() <= limit
    assert a.min() < -0.99 * limit
    assert a.max() > 0.99 * limit
    assert abs(a.mean()) < 5 * limit / math.sqrt(3 * a.size)
    assert a.std() == pytest.approx(limit / math.sqrt(3), rel=0.03)


def _fan(shape, mode: str) -> float:
    fi, fo = _fans(shape)
    return {"in": fi, "out": fo, "avg": (fi + fo) / 2}[mode]


NORMALS = [  # (function, scale, fan mode): std = sqrt(scale / fan)
    (initializer.lecun_normal, 1.0, "in"),
    (initializer.glorot_normal, 1.0, "avg"),
    (initializer.he_normal, 2.0, "in"),
    (initializer.glorot, 1.0, "avg"),
    (initializer.msra, 2.0, "in"),
]
UNIFORMS = [  # limit = sqrt(3 * scale / fan)
    (initializer.lecun_uniform, 1.0, "in"),
    (initializer.glorot_uniform, 1.0, "avg"),
    (initializer.he_uniform, 2.0, "in"),
    (initializer.xavier, 1.0, "avg"),
]


@pytest.mark.parametrize("shape", [DENSE, CONV], ids=["dense", "conv"])
@pytest.mark.parametrize(("fn", "scale", "mode"), NORMALS, ids=[f[0].__name__ for f in NORMALS])
def test_normal_initializers(fn, scale, mode, shape) -> None:
    t = _t(shape)
    out = fn(t)
    assert out is t
    assert t.shape == shape
    assert t.dtype == tensor.float32
    assert t.device is DEV
    _check_normal(t.to_numpy(), math.sqrt(scale / _fan(shape, mode)))


@pytest.mark.parametrize("shape", [DENSE, CONV], ids=["dense", "conv"])
@pytest.mark.parametrize(("fn", "scale", "mode"), UNIFORMS, ids=[f[0].__name__ for f in UNIFORMS])
def test_uniform_initializers(fn, scale, mode, shape) -> None:
    t = _t(shape)
    assert fn(t) is t
    _check_uniform(t.to_numpy(), math.sqrt(3 * scale / _fan(shape, mode)))


def test_explicit_formulas_on_the_shapes() -> None:
    # the same numbers written out, so that a shared mistake in _fans above cannot hide one in compute_fans
    _check_normal(initializer.he_normal(_t(DENSE)).to_numpy(), math.sqrt(2 / 500))
    _check_normal(initializer.glorot_normal(_t(DENSE)).to_numpy(), math.sqrt(2 / 625))
    _check_uniform(initializer.glorot_uniform(_t(DENSE)).to_numpy(), math.sqrt(6 / 625))
    _check_normal(initializer.he_normal(_t(CONV)).to_numpy(), math.sqrt(2 / (32 * 25)))
    _check_uniform(initializer.lecun_uniform(_t(CONV)).to_numpy(), math.sqrt(3 / (32 * 25)))


def test_compute_fans() -> None:
    assert initializer.compute_fans((3, 7)) == (3, 7)
    assert initializer.compute_fans((8, 4, 3, 2)) == (4 * 6, 8 * 6)
    assert initializer.compute_fans((8, 4, 5)) == (20, 40)
    assert initializer.compute_fans((16,)) == (4, 4)


@pytest.mark.parametrize(("fan_in", "fan_out", "var"), [(300, 100, 2 * 2 / 400), (300, 0, 2 / 300),
                                                          (0, 100, 2 / 100)])
def test_gaussian_with_explicit_fans(fan_in, fan_out, var) -> None:
    t = _t((400, 300))
    assert initializer.gaussian(t, fan_in, fan_out) is t
    _check_normal(t.to_numpy(), math.sqrt(var))


@pytest.mark.parametrize(("fan_in", "fan_out", "var"), [(300, 100, 2 / 400), (300, 0, 1 / 300)])
def test_uniform_with_explicit_fans(fan_in, fan_out, var) -> None:
    t = _t((400, 300))
    initializer.uniform(t, fan_in, fan_out)
    _check_uniform(t.to_numpy(), math.sqrt(3 * var))


def test_eye() -> None:
    t = _t((4, 4))
    t.set_value(5.0)
    assert initializer.eye(t) is t
    np.testing.assert_array_equal(t.to_numpy(), np.eye(4, dtype=np.float32))
    r = initializer.eye(_t((3, 5)))
    np.testing.assert_array_equal(r.to_numpy(), np.eye(3, 5, dtype=np.float32))
    with pytest.raises(ValueError, match="2-D"):
        initializer.eye(_t((2, 2, 2)))


@pytest.mark.parametrize("shape", [(6, 6), (4, 9), (9, 4), (8, 3, 2, 2), (2, 3, 3, 3)])
@pytest.mark.parametrize("gain", [1.0, 2.5])
def test_orthogonal(shape, gain) -> None:
    t = _t(shape)
    assert initializer.orthogonal(t, gain) is t
    m = t.to_numpy().astype(np.float64).reshape(shape[0], -1)
    rows, cols = m.shape
    gram = m @ m.T if rows <= cols else m.T @ m
    np.testing.assert_allclose(gram, gain**2 * np.eye(min(rows, cols)), atol=1e-5 * gain**2)
    assert not np.allclose(m, gain * np.eye(rows, cols))  # random, not the identity


def test_orthogonal_rejects_vectors() -> None:
    with pytest.raises(ValueError, match="2 dimensions"):
        initializer.orthogonal(_t((5,)))


ALL = [initializer.he_normal, initializer.glorot_uniform, initializer.lecun_normal, initializer.he_uniform,
       initializer.lecun_uniform, initializer.glorot_normal, initializer.xavier, initializer.glorot,
       initializer.msra, initializer.orthogonal]


@pytest.mark.parametrize("fn", ALL, ids=[f.__name__ for f in ALL])
def test_seeded_generator_makes_fills_reproducible(fn) -> None:
    def draw(seed: int) -> np.ndarray:
        DEV.set_rand_seed(seed)
        return fn(_t((20, 30))).to_numpy()

    a, b, c = draw(11), draw(11), draw(12)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    # consecutive fills without reseeding differ (the generator advances)
    DEV.set_rand_seed(11)
    first, second = fn(_t((20, 30))).to_numpy(), fn(_t((20, 30))).to_numpy()
    assert not np.allclose(first, second)


def test_half_precision_tensor() -> None:
    t = _t((400, 250), tensor.float16)
    initializer.he_normal(t)
    assert t.dtype == tensor.float16
    _check_normal(t.to_numpy(), math.sqrt(2 / 400))


def test_bad_input() -> None:
    with pytest.raises(TypeError, match="Tensor"):
        initializer.he_normal(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="fan_in and fan_out"):
        initializer.gaussian(_t((2, 2)), 0, 0)
    with pytest.raises(ValueError, match="no elements"):
        initializer.glorot_uniform(_t((0, 3)))
