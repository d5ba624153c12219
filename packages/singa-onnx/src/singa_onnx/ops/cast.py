"""Cast and CastLike."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP

from singa import autograd, ops
from singa import dtypes as sdt
from singa.tensor import Tensor
from singa_onnx import onnx_types as ot
from singa_onnx.ops._common import FLOATS, in_type, tensor, wrap_int
from singa_onnx.registry import register


def _float_to_string(a: np.ndarray) -> np.ndarray:
    # the reference's spelling: shortest round-trip repr of the float32 value, ONNX's INF / NaN names
    out = []
    for v in a.reshape(-1):
        f = float(v)
        if np.isnan(f):
            out.append("NaN")
        elif np.isinf(f):
            out.append("INF" if f > 0 else "-INF")
        else:
            out.append(repr(np.float32(f)).replace("np.float32(", "").rstrip(")") if a.dtype == np.float32
                       else repr(f))
    return np.asarray(out, dtype=object).reshape(a.shape)


def cast_value(node, x, src: int | None, dst: int):
    """x (Tensor or host array) converted to ONNX type dst."""
    if dst == TP.STRING or src == TP.STRING or (isinstance(x, np.ndarray) and x.dtype == object):
        a = np.asarray(x) if not isinstance(x, Tensor) else ops.to_numpy(x)
        if dst == TP.STRING:
            if a.dtype.kind == "f":
                return _float_to_string(a)
            return a.astype(str).astype(object)
        return np.asarray([float(s) if ot.np_dtype(dst).kind == "f" else int(s) for s in a.reshape(-1)],
                          dtype=ot.np_dtype(dst)).reshape(a.shape)
    if isinstance(x, np.ndarray):
        return ot.wrap_host(x, dst)
    code = ot.storage(dst, x.device)
    if x.dtype in FLOATS and code in FLOATS:
        return autograd.cast(x, code) if x.dtype != code else x
    if x.dtype in FLOATS and code in sdt.INTS and dst in ot.UNSIGNED:
        # negative floats into unsigned types wrap (what C and numpy do for in-range magnitudes)
        y = ops.cast(x, sdt.int64)
        return wrap_int(ops.cast(y, code) if code != sdt.int64 else y, dst)
    y = ops.cast(x, code) if x.dtype != code else x
    if code in sdt.INTS:
        y = wrap_int(y, dst)
    return y


@register("Cast")
def cast(node, inputs, opset):
    x = inputs[0]
    dst = node.attr("to")
    src = in_type(node, 0, x)
    if not isinstance(x, (Tensor, np.ndarray)):
        x = tensor(node, x)
    return cast_value(node, x, src, dst)


@register("CastLike")
def cast_like(node, inputs, opset):
    x, like = inputs
    dst = in_type(node, 1, like)
    return cast_value(node, x, in_type(node, 0, x), dst)
