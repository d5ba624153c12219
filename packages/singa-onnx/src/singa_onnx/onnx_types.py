"""ONNX element types and how SINGA stores them.

SINGA devices hold float32, float16, int32, int64 and bool. Every other ONNX numeric type is stored in the nearest wider
one (uint8/int8/int16/uint16 in int32, uint32/uint64 in int64, double in float32) and converted back to the declared
ONNX type when results leave the model as numpy arrays. Strings never go to a device: they stay numpy arrays on the
host. Types with no exact carrier here (float8, float4, int4/int2, complex) are reported as unsupported.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from singa import dtypes as sdt

F = TensorProto
_STORAGE = {
    F.FLOAT: sdt.float32,
    F.DOUBLE: sdt.float32,
    F.FLOAT16: sdt.float16,
    F.BFLOAT16: sdt.float32,  # every bfloat16 value is a float32 value
    F.INT8: sdt.int32,
    F.UINT8: sdt.int32,
    F.INT16: sdt.int32,
    F.UINT16: sdt.int32,
    F.INT32: sdt.int32,
    F.UINT32: sdt.int64,
    F.INT64: sdt.int64,
    F.UINT64: sdt.int64,
    F.BOOL: sdt.bool_,
    F.FLOAT8E4M3FN: sdt.float32,
    F.FLOAT8E4M3FNUZ: sdt.float32,
    F.FLOAT8E5M2: sdt.float32,
    F.FLOAT8E5M2FNUZ: sdt.float32,
    F.FLOAT8E8M0: sdt.float32,
    F.FLOAT4E2M1: sdt.float32,
    F.INT4: sdt.int32,
    F.UINT4: sdt.int32,
    F.INT2: sdt.int32,
    F.UINT2: sdt.int32,
}
# (mantissa bits, smallest normal exponent, largest finite value, has inf, keeps -0) of the small float formats
SMALL_FLOATS = {
    F.FLOAT8E4M3FN: (3, -6, 448.0, False, True),
    F.FLOAT8E4M3FNUZ: (3, -7, 240.0, False, False),
    F.FLOAT8E5M2: (2, -14, 57344.0, True, True),
    F.FLOAT8E5M2FNUZ: (2, -15, 57344.0, False, False),
    F.FLOAT4E2M1: (1, 0, 6.0, False, True),
}
FLOAT_TYPES = frozenset({F.FLOAT, F.DOUBLE, F.FLOAT16, F.BFLOAT16, F.FLOAT8E8M0} | set(SMALL_FLOATS))
INT_TYPES = frozenset({F.INT8, F.UINT8, F.INT16, F.UINT16, F.INT32, F.UINT32, F.INT64, F.UINT64, F.INT4, F.UINT4,
                       F.INT2, F.UINT2})
UNSIGNED = frozenset({F.UINT8, F.UINT16, F.UINT32, F.UINT64, F.UINT4, F.UINT2})
# integer types narrower than their carrier: results are wrapped to their range where ONNX defines wrap-around
NARROW_INTS = {F.INT8: 8, F.UINT8: 8, F.INT16: 16, F.UINT16: 16, F.UINT32: 32, F.INT4: 4, F.UINT4: 4, F.INT2: 2,
               F.UINT2: 2}


def name(t: int | None) -> str:
    if t is None:
        return "unknown"
    try:
        return TensorProto.DataType.Name(t)
    except ValueError:
        return f"type {t}"


def supported(t: int | None) -> bool:
    return t is None or t in _STORAGE or t == F.STRING


def storage(t: int | None, device=None) -> int:
    """The SINGA dtype that carries ONNX type t (float32 when unknown). Doubles stay float64 on a `device` that
    declares float64 kernels."""
    if t is None:
        return sdt.float32
    if t == F.DOUBLE and device is not None and sdt.float64 in device.dtypes:
        return sdt.float64
    try:
        return _STORAGE[t]
    except KeyError:
        raise TypeError(f"ONNX type {name(t)} has no SINGA representation") from None


def np_dtype(t: int) -> np.dtype:
    """numpy dtype of ONNX type t (ml_dtypes types for bfloat16 and friends)."""
    return np.dtype(helper.tensor_dtype_to_np_dtype(t))


def from_np(dtype: np.dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def onnx_type_to_singa_type(onnx_type: int) -> int:
    """SINGA's name for the mapping: the SINGA dtype code that holds ONNX elem type `onnx_type`."""
    return storage(onnx_type)


def singa_to_onnx_type(code: int) -> int:
    return {sdt.float32: F.FLOAT, sdt.float16: F.FLOAT16, sdt.int32: F.INT32, sdt.int64: F.INT64,
            sdt.bool_: F.BOOL, sdt.float64: F.DOUBLE}[code]


def storage_np(t: int | None) -> np.dtype:
    return sdt.to_numpy_dtype(storage(t))


def wrap_host(arr: np.ndarray, t: int | None) -> np.ndarray:
    """Host data converted to ONNX type t, integers wrapping modulo their width as C casts do."""
    if t is None or t == F.STRING:
        return arr
    want = np_dtype(t)
    if arr.dtype == want:
        return arr
    if want.kind in "iu" and arr.dtype.kind in "iub":
        return arr.astype(np.int64).astype(want)
    if want.kind in "iu" and arr.dtype.kind == "f":
        return np.trunc(arr).astype(np.int64).astype(want)
    return arr.astype(want)
