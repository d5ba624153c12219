"""Argument normalisation shared by backend kernel tables (so every backend reads the primitives' parameters alike)."""

from __future__ import annotations

import math


def pair(value, name: str) -> tuple[int, int]:
    """An int or an (h, w) pair, as (h, w)."""
    if isinstance(value, int):
        return value, value
    value = tuple(int(x) for x in value)
    if len(value) != 2:
        raise ValueError(f"{name} must be an int or a pair, got {value}")
    return value


def padding4(value) -> tuple[int, int, int, int]:
    """(top, left, bottom, right); an int or a symmetric (h, w) pair are accepted too."""
    if isinstance(value, int):
        return value, value, value, value
    value = tuple(int(x) for x in value)
    if len(value) == 2:
        return value[0], value[1], value[0], value[1]
    if len(value) != 4:
        raise ValueError(f"padding must be (top, left, bottom, right), got {value}")
    return value


def norm_axis(axis: int, ndim: int, name: str, backend: str) -> int:
    """A non-negative axis; `backend` and `name` (the kernel) go into the error message."""
    if not -ndim <= axis < max(ndim, 1):
        raise ValueError(f"{backend} kernel {name}: axis {axis} is out of range for {ndim} dimensions")
    return axis % ndim if ndim else 0


def split(shape: tuple, axis: int) -> tuple[int, int, int]:
    """(outer, length, inner) of an axis."""
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
