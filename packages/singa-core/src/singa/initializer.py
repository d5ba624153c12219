"""Initial values for parameter tensors (SINGA's `initializer` module).

Every function fills its tensor in place (and returns it) from the tensor's own device generator
(`Tensor.gaussian` / `Tensor.uniform`), so `device.set_rand_seed(n)` makes the values reproducible on any backend.
`orthogonal` draws its Gaussian matrix the same way and orthogonalises it on the host (numpy QR), which is fine for
one-off initial values.

Fans are computed from the tensor's shape, as Keras and SINGA do:

* 2-D, a Linear weight (in, out): fan_in = in, fan_out = out;
* 3-D to 5-D, a convolution weight (out, in, k...) (channels first): fan_in = in * prod(k),
  fan_out = out * prod(k);
* any other rank: fan_in = fan_out = sqrt(size).

The "normal" variants draw from an untruncated Gaussian with std = sqrt(scale / fan) (Keras truncates; the device
generators have no truncated normal, and the variance is what matters).
"""

from __future__ import annotations

import math

import numpy as np

from singa.tensor import Tensor

__all__ = [
    "eye", "orthogonal", "lecun_uniform", "glorot_normal", "glorot_uniform", "he_normal", "lecun_normal",
    "he_uniform", "gaussian", "uniform", "xavier", "glorot", "msra", "compute_fans",
]


def _check(op: str, t: Tensor) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"initializer.{op}: expected a singa Tensor, got {type(t).__name__}")
    if t.size() == 0:
        raise ValueError(f"initializer.{op}: tensor of shape {t.shape} has no elements")


def compute_fans(shape: tuple) -> tuple[float, float]:
    """(fan_in, fan_out) of a weight of this shape (see the module docstring for the convention)."""
    shape = tuple(shape)
    if len(shape) == 2:
        return float(shape[0]), float(shape[1])
    if len(shape) in (3, 4, 5):
        receptive = math.prod(shape[2:])
        return float(shape[1] * receptive), float(shape[0] * receptive)
    side = math.sqrt(math.prod(shape))
    return side, side


def _fan(t: Tensor, mode: str) -> float:
    fan_in, fan_out = compute_fans(t.shape)
    if mode == "fan_in":
        return fan_in
    if mode == "fan_out":
        return fan_out
    return (fan_in + fan_out) / 2.0


def _variance_scaling(op: str, t: Tensor, scale: float, mode: str, distribution: str) -> Tensor:
    """Zero-mean values of variance scale / fan: a Gaussian, or a uniform on [-limit, limit] of the same variance."""
    _check(op, t)
    var = scale / max(_fan(t, mode), 1.0)
    if distribution == "normal":
        return t.gaussian(0.0, math.sqrt(var))
    limit = math.sqrt(3.0 * var)  # Var(U(-a, a)) = a^2 / 3
    return t.uniform(-limit, limit)


def eye(t: Tensor) -> Tensor:
    """The identity matrix (t must be 2-D; a non-square t gets ones on its main diagonal)."""
    _check("eye", t)
    if len(t.shape) != 2:
        raise ValueError(f"initializer.eye: expected a 2-D tensor, got shape {t.shape}")
    t.copy_from_numpy(np.eye(t.shape[0], t.shape[1], dtype=np.float64))
    return t


def orthogonal(t: Tensor, gain: float = 1.0) -> Tensor:
    """A (semi-)orthogonal matrix times `gain` (Saxe et al. 2013).

    t is viewed as a matrix (shape[0], prod(shape[1:])): the rows are orthonormal when there are no more rows than
    columns, otherwise the columns are. 1-D tensors are not matrices and are refused.
    """
    _check("orthogonal", t)
    if len(t.shape) < 2:
        raise ValueError(f"initializer.orthogonal: needs at least 2 dimensions, got shape {t.shape}")
    rows = t.shape[0]
    cols = t.size() // rows
    # The random matrix comes from the device generator so that set_rand_seed governs it like every initializer.
    a = Tensor((max(rows, cols), min(rows, cols)), t.device, t.dtype).gaussian(0.0, 1.0)
    q, r = np.linalg.qr(a.to_numpy().astype(np.float64))
    # Fixing the signs by R's diagonal makes Q uniformly distributed (Mezzadri 2007), not biased by the QR routine.
    d = np.sign(np.diag(r))
    d[d == 0] = 1.0
    q = q * d
    if rows < cols:
        q = q.T
    t.copy_from_numpy(gain * q.reshape(t.shape))
    return t


def lecun_uniform(t: Tensor) -> Tensor:
    """Uniform on [-limit, limit], limit = sqrt(3 / fan_in) (LeCun 1998)."""
    return _variance_scaling("lecun_uniform", t, 1.0, "fan_in", "uniform")


def lecun_normal(t: Tensor) -> Tensor:
    """Gaussian, std = sqrt(1 / fan_in)."""
    return _variance_scaling("lecun_normal", t, 1.0, "fan_in", "normal")


def glorot_uniform(t: Tensor) -> Tensor:
    """Uniform on [-limit, limit], limit = sqrt(6 / (fan_in + fan_out)) (Glorot and Bengio 2010)."""
    return _variance_scaling("glorot_uniform", t, 1.0, "fan_avg", "uniform")


def glorot_normal(t: Tensor) -> Tensor:
    """Gaussian, std = sqrt(2 / (fan_in + fan_out))."""
    return _variance_scaling("glorot_normal", t, 1.0, "fan_avg", "normal")


def he_uniform(t: Tensor) -> Tensor:
    """Uniform on [-limit, limit], limit = sqrt(6 / fan_in) (He et al. 2015)."""
    return _variance_scaling("he_uniform", t, 2.0, "fan_in", "uniform")


def he_normal(t: Tensor) -> Tensor:
    """Gaussian, std = sqrt(2 / fan_in)."""
    return _variance_scaling("he_normal", t, 2.0, "fan_in", "normal")


def _explicit_fans(op: str, fan_in: float, fan_out: float) -> float:
    """SINGA's rule for given fans: 2 / (fan_in + fan_out) with both, 1 / fan with only one of them."""
    if fan_in < 0 or fan_out < 0 or fan_in + fan_out <= 0:
        raise ValueError(f"initializer.{op}: fan_in and fan_out must be >= 0 and not both 0, got {fan_in}, {fan_out}")
    avg = 2.0 if fan_in > 0 and fan_out > 0 else 1.0
    return avg / (fan_in + fan_out)


def gaussian(t: Tensor, fan_in: float = 0, fan_out: float = 0) -> Tensor:
    """Gaussian with std = sqrt(2 * v), v = 2 / (fan_in + fan_out), or 1 / fan when only one fan is given (SINGA;
    with one fan this is He initialisation)."""
    _check("gaussian", t)
    return t.gaussian(0.0, math.sqrt(2.0 * _explicit_fans("gaussian", fan_in, fan_out)))


def uniform(t: Tensor, fan_in: float = 0, fan_out: float = 0) -> Tensor:
    """Uniform on [-limit, limit], limit = sqrt(3 * v) with v as in `gaussian` (SINGA)."""
    _check("uniform", t)
    limit = math.sqrt(3.0 * _explicit_fans("uniform", fan_in, fan_out))
    return t.uniform(-limit, limit)


def xavier(t: Tensor) -> Tensor:
    """SINGA's older name: uniform on +-sqrt(6 / (fan_in + fan_out)), as glorot_uniform."""
    return glorot_uniform(t)


def glorot(t: Tensor) -> Tensor:
    """SINGA's older name: Gaussian with std = sqrt(2 / (fan_in + fan_out)), as glorot_normal."""
    return glorot_normal(t)


def msra(t: Tensor) -> Tensor:
    """SINGA's older name: Gaussian with std = sqrt(2 / fan_in), as he_normal."""
    return he_normal(t)
