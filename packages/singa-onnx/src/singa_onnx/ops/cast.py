"""Cast and CastLike."""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto as TP

from singa import autograd, ops
from singa import dtypes as sdt
from singa.tensor import Tensor
from singa_onnx import onnx_types as ot
from singa_onnx.ops._common import FLOATS, const_like, in_type, tensor, wrap_int
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


def _pow2(e: Tensor) -> Tensor:
    return ops.pow(const_like(e, 2.0), e)


def _floor_log2(a: Tensor) -> Tensor:
    """floor(log2(a)) for a > 0, exact at powers of two (the float log is corrected by one step either way)."""
    e = ops.floor(ops.mul(ops.log(a), 1.0 / math.log(2.0)))
    e = ops.where(ops.ge(a, _pow2(ops.add(e, 1.0))), ops.add(e, 1.0), e)
    return ops.where(ops.lt(a, _pow2(e)), ops.sub(e, 1.0), e)


def round_small_float(x: Tensor, t: int, saturate: bool = True) -> Tensor:
    """x (float32) rounded to the nearest value of 8/4-bit float type t (ties to even), saturating or overflowing as
    ONNX's Cast says; the result stays in float32, exactly representable in t."""
    mant, emin, fmax, has_inf, keeps_negzero = ot.SMALL_FLOATS[t]
    finite = ops.logical_not(ops.logical_or(ops.isnan(x), ops.isinf(x)))
    a = ops.where(finite, ops.abs(x), const_like(x, 0.0))  # inf and NaN are placed after the rounding
    tiny = ops.full((), 2.0 ** (emin - mant - 2), x.dtype, x.device)
    e = ops.maximum(_floor_log2(ops.maximum(a, tiny)), const_like(a, float(emin)))
    q = _pow2(ops.sub(e, float(mant)))
    r = ops.mul(ops.round(ops.div(a, q)), q)
    if t == TP.FLOAT4E2M1:
        saturate = True  # the format has neither inf nor NaN: every overflow clamps
    big = ops.logical_or(ops.gt(r, const_like(r, fmax)), ops.isinf(x))
    r = ops.where(big, const_like(r, fmax if saturate else (math.inf if has_inf else math.nan)), r)
    r = ops.where(ops.isnan(x), const_like(r, math.nan), r)
    y = ops.where(ops.lt(x, const_like(x, 0.0)), ops.neg(r), r)
    if not keeps_negzero:
        y = ops.where(ops.eq(y, const_like(y, 0.0)), const_like(y, 0.0), y)
    return y


def round_e8m0(x: Tensor, saturate: bool, mode: str) -> Tensor:
    """x as a power of two (FLOAT8E8M0: 2^-127 ... 2^127, no sign), rounding the exponent up, down or to nearest."""
    a = ops.abs(x)
    tiny = ops.full((), 2.0 ** -126, x.dtype, x.device)
    e = _floor_log2(ops.maximum(a, tiny))
    p = _pow2(e)
    if mode == "up":
        e = ops.where(ops.gt(a, p), ops.add(e, 1.0), e)
    elif mode == "nearest":
        e = ops.where(ops.ge(a, ops.mul(p, 1.5)), ops.add(e, 1.0), e)
    e = ops.clip(e, -127.0, 127.0) if saturate else e
    y = _pow2(e)
    bad = ops.logical_or(ops.isnan(x), ops.isinf(x))
    if not saturate:
        bad = ops.logical_or(bad, ops.gt(e, const_like(e, 127.0)))
    y = ops.where(bad, const_like(y, math.nan), y)
    return ops.where(ops.eq(a, const_like(a, 0.0)), const_like(y, 2.0 ** -127), y)


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
        if dst not in ot.SMALL_FLOATS and dst != TP.FLOAT8E8M0:
            return ot.wrap_host(x, dst)
        x = tensor(node, x)
    code = ot.storage(dst, x.device)
    if dst in ot.SMALL_FLOATS or dst == TP.FLOAT8E8M0:
        xf = x if x.dtype == sdt.float32 else ops.cast(x, sdt.float32)
        saturate = bool(node.attr("saturate", 1))
        if dst == TP.FLOAT8E8M0:
            return round_e8m0(xf, saturate, node.attr("round_mode", "up"))
        return round_small_float(xf, dst, saturate)
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
