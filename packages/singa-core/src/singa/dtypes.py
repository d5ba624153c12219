"""Data types. SINGA's integer codes are kept (float32=0, float16=1, int32=2); ONNX adds int64 and bool."""

from __future__ import annotations

import numpy as np

float32 = 0
float16 = 1
int32 = 2
int64 = 3
bool_ = 4
float64 = 5  # optional: only devices that list it in Device.dtypes (the host fallback does; used for gradient checks)

ALL = (float32, float16, int32, int64, bool_)
OPTIONAL = (float64,)
FLOATS = (float32, float16)
INTS = (int32, int64)
NUMERIC = FLOATS + INTS

_NUMPY = {
    float32: np.dtype(np.float32),
    float16: np.dtype(np.float16),
    int32: np.dtype(np.int32),
    int64: np.dtype(np.int64),
    bool_: np.dtype(np.bool_),
    float64: np.dtype(np.float64),
}
_FROM_NUMPY = {v: k for k, v in _NUMPY.items()}
_NAMES = {
    float32: "float32",
    float16: "float16",
    int32: "int32",
    int64: "int64",
    bool_: "bool",
    float64: "float64",
}
_ITEMSIZE = {k: v.itemsize for k, v in _NUMPY.items()}


def to_numpy_dtype(dtype: int) -> np.dtype:
    return _NUMPY[dtype]


def from_numpy_dtype(dtype) -> int:
    """Map a numpy dtype to a SINGA dtype; float64 host data maps to float64 (callers usually narrow it)."""
    try:
        return _FROM_NUMPY[np.dtype(dtype)]
    except KeyError:
        raise TypeError(
            f"numpy dtype {np.dtype(dtype)} has no SINGA equivalent; use one of "
            + ", ".join(_NAMES[d] for d in ALL)
        ) from None


def name(dtype: int) -> str:
    return _NAMES.get(dtype, f"<unknown dtype {dtype!r}>")


def itemsize(dtype: int) -> int:
    return _ITEMSIZE[dtype]


def is_float(dtype: int) -> bool:
    return dtype in FLOATS or dtype == float64


def promote(a: int, b: int) -> int:
    """Result type of a binary operation, following numpy's rules for these five types."""
    if a == b:
        return a
    return from_numpy_dtype(np.promote_types(_NUMPY[a], _NUMPY[b]))
