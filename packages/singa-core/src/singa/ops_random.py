"""Random numbers of `singa.ops`, from the device's counter-based generator (`device.set_rand_seed`): uniform, normal
and Bernoulli fills."""

from __future__ import annotations

import math

from singa.ops_core import _ALL, _FLOATS, _empty, _supported, _table, _tensor, assign, is_contiguous
from singa.tensor import Tensor

# -- random numbers (the device's counter-based generator: device.set_rand_seed) ----------------------------------


def _random(op: str, kname: str, x: Tensor, draws_per_element: int, params: dict, allowed) -> Tensor:
    _tensor(op, x)
    _supported(op, x.dtype, allowed)
    n = math.prod(x.shape)
    if not n:
        return x
    dev = x.device
    target = x if is_contiguous(x) else _empty(x.shape, x.dtype, dev)
    offset = dev.next_rng_offset(n * draws_per_element)
    _table(dev)[kname](target, seed=dev.seed, offset=offset, **params)
    if target is not x:
        assign(x, target)
    return x


def random_uniform(x: Tensor, low: float = 0.0, high: float = 1.0) -> Tensor:
    """Fill x in place with uniform values in [low, high); returns x."""
    return _random("random_uniform", "random_uniform", x, 1, {"low": float(low), "high": float(high)}, _FLOATS)


def random_normal(x: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill x in place with normal values; returns x."""
    return _random("random_normal", "random_normal", x, 2, {"mean": float(mean), "std": float(std)}, _FLOATS)


def random_bernoulli(x: Tensor, p: float) -> Tensor:
    """Fill x in place with 1 (probability p) or 0; returns x."""
    if not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"random_bernoulli: p must be in [0, 1], got {p}")
    return _random("random_bernoulli", "random_bernoulli", x, 1, {"p": float(p)}, _ALL)
