"""What backend kernel tables share, so that every backend reads the primitives' parameters alike and words its
errors alike: parameter normalisation, view layouts (contiguous strides, merged axes), the bits of a fill value, and
the errors that name the kernel, its views and what is wrong. `backend` arguments are the backend's name (`cpu`,
`opencl`), which starts every message."""

from __future__ import annotations

import math
import struct

from singa import dtypes
from singa.backend import contiguous_strides


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


# -- view layouts -------------------------------------------------------------------------------------------------

# shape -> layout(shape); the fast paths read it directly (`LAYOUTS.get(shape) or layout(shape)`)
LAYOUTS: dict[tuple, tuple[tuple, int]] = {}


def layout(shape: tuple) -> tuple[tuple, int]:
    """(contiguous strides, element count) of a shape, memoised: the fast paths look it up on every call."""
    lay = LAYOUTS.get(shape)
    if lay is None:
        lay = (contiguous_strides(shape), math.prod(shape))
        if len(LAYOUTS) < 8192:
            LAYOUTS[shape] = lay
    return lay


_COALESCED: dict = {}


def coalesce(shape: tuple, strides: list) -> tuple[list, list]:
    """Drop size-1 axes and merge neighbours that every operand walks as one axis: (dims, strides per operand).
    Memoised (a replayed graph asks for the same layouts at every step); callers must not modify the lists."""
    key = (shape, *strides)
    try:
        hit = _COALESCED.get(key)
    except TypeError:  # a list among them: not a key
        return _coalesce(shape, strides)
    if hit is None:
        hit = _coalesce(shape, strides)
        if len(_COALESCED) < 8192:
            _COALESCED[key] = hit
    return hit


def _coalesce(shape: tuple, strides: list) -> tuple[list, list]:
    dims: list = []
    merged: list = [[] for _ in strides]
    for axis, size in enumerate(shape):
        if size == 1:
            continue
        if dims and all(st[axis] * size == m[-1] for st, m in zip(strides, merged)):
            dims[-1] *= size
            for st, m in zip(strides, merged):
                m[-1] = st[axis]
            continue
        dims.append(size)
        for st, m in zip(strides, merged):
            m.append(st[axis])
    return dims, merged


# -- element bits for fill and pad --------------------------------------------------------------------------------

_FLOAT_MAX = {dtypes.float32: 3.4028234663852886e38, dtypes.float16: 65504.0, dtypes.float64: math.inf}
_FLOAT_FORMATS = {dtypes.float32: ("<f", "<I"), dtypes.float16: ("<e", "<H"), dtypes.float64: ("<d", "<Q")}


def element_bits(dtype: int, value) -> int:
    """The bit pattern of `value` converted to `dtype` the way numpy converts it (floats round, ints truncate)."""
    if dtype in _FLOAT_FORMATS:
        fmt, ufmt = _FLOAT_FORMATS[dtype]
        v = float(value)
        if math.isfinite(v) and abs(v) > _FLOAT_MAX[dtype]:
            try:
                return struct.unpack(ufmt, struct.pack(fmt, v))[0]
            except OverflowError:  # beyond the largest finite value after rounding: infinity, like numpy
                v = math.copysign(math.inf, v)
        return struct.unpack(ufmt, struct.pack(fmt, v))[0]
    if dtype == dtypes.bool_:
        return 1 if value else 0
    v = value if isinstance(value, int) else float(value)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"cannot convert {value!r} to {dtypes.name(dtype)}")
        v = int(v)  # toward zero
    return v & ((1 << (8 * dtypes.itemsize(dtype))) - 1)


# -- errors -------------------------------------------------------------------------------------------------------


def describe(v) -> str:
    """A view as `float32[2, 3]` (or None)."""
    return "None" if v is None else f"{dtypes.name(v.dtype)}{list(v.shape)}"


def dtype_error(backend: str, name: str, views: tuple, supported) -> Exception:
    """The error for views whose dtypes kernel `name` does not take; a dtype the device cannot hold at all is
    explained by the device's own `dtype_error(kernel, dtype)` where it has one."""
    dev = next((v.buffer.device for v in views if v is not None), None)
    explain = getattr(dev, "dtype_error", None)
    for v in views:
        if v is not None and explain is not None and v.dtype not in dev.dtypes:
            return explain(name, v.dtype)
    names = ", ".join(dtypes.name(d) for d in supported)
    args = ", ".join(describe(v) for v in views)
    return TypeError(f"{backend} kernel {name}({args}): unsupported dtypes (inputs may be {names})")


def shape_error(backend: str, name: str, views: tuple, what: str) -> ValueError:
    return ValueError(f"{backend} kernel {name}({', '.join(describe(v) for v in views)}): {what}")


def elementwise_out_dtypes(entry) -> list:
    """The output dtype of a table entry's kernel per input dtype code (bool for comparisons)."""
    return [dtypes.bool_ if entry.out_bool else dt for dt in range(8)]


def elementwise_error(backend: str, name: str, views: tuple, supported, out_dtypes: list) -> Exception:
    """Why an element-wise kernel's fast checks refused (out, inputs...): the dtype or shape error to raise."""
    first = views[1]
    shape = views[0].shape
    if (first.dtype not in supported or any(v.dtype != first.dtype for v in views[2:])
            or views[0].dtype != out_dtypes[first.dtype]):
        return dtype_error(backend, name, views, supported)
    if any(v.shape != shape for v in views[1:]):
        return shape_error(backend, name, views, "inputs must arrive broadcast to the output's shape")
    return dtype_error(backend, name, views, supported)  # a dtype the device itself lacks (float16 without fp16)
