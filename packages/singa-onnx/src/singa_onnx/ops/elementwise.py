"""Element-wise arithmetic and activations (numpy broadcasting), through singa's autograd operators."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP

from singa import autograd, ops
from singa import dtypes as sdt
from singa.tensor import Tensor
from singa_onnx import onnx_types as ot
from singa_onnx.ops._common import (
    FLOATS,
    INTS,
    const_like,
    full,
    host,
    in_type,
    inputs_as_tensors,
    out_type,
    tensor,
    wrap_int,
    zeros_like,
)
from singa_onnx.registry import register

# -- host versions (shape arithmetic of exported models) ---------------------------------------------------------


def _host_div(a, b):
    if a.dtype.kind in "iu":
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.trunc(a.astype(np.float64) / np.where(b == 0, 1, b))
        return np.where(b == 0, 0, q).astype(np.result_type(a, b))
    return np.divide(a, b)


_HOST_BINARY = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": _host_div,
}


def _host_binary(node, inputs, opset):
    a, b = inputs
    r = _HOST_BINARY[node.op_type](a, b)
    return r.astype(a.dtype, copy=False)


# -- binary arithmetic ---------------------------------------------------------------------------------------------


def _pair(node, inputs):
    a, b = inputs_as_tensors(node, inputs)
    return a, b


@register(("Add", "Sub", "Mul", "Div"), host=_host_binary)
def binary(node, inputs, opset):
    a, b = _pair(node, inputs)
    fn = {"Add": autograd.add, "Sub": autograd.sub, "Mul": autograd.mul, "Div": autograd.div}[node.op_type]
    if a.dtype in INTS and node.op_type != "Div":
        y = getattr(ops, {"Add": "add", "Sub": "sub", "Mul": "mul"}[node.op_type])(a, b)
        return wrap_int(y, out_type(node, 0, in_type(node, 0)))
    if a.dtype == sdt.bool_:
        raise TypeError(f"{node.op_type} is not defined for bool tensors")
    return fn(a, b)


@register("Pow")
def pow_(node, inputs, opset):
    x, y = inputs
    x = tensor(node, x, slot=0)
    if x.dtype in FLOATS:
        y = tensor(node, y, x.dtype, slot=1)
        return autograd.pow(x, y)
    # integer base: computed in float (exact for the magnitudes integer powers can hold), then back to x's type
    xf = ops.cast(x, sdt.float32)
    yf = tensor(node, y, sdt.float32, slot=1)
    r = ops.pow(xf, yf)
    return ops.cast(ops.round(r), x.dtype)


def _host_mod(node, inputs, opset):
    a, b = inputs
    if a.dtype.kind not in "iu":
        return _device_via(node, inputs, mod)
    with np.errstate(divide="ignore"):
        fn = np.fmod if node.attr("fmod", 0) else np.mod
        return np.where(b == 0, 0, fn(a, np.where(b == 0, 1, b))).astype(a.dtype)


def _device_via(node, inputs, handler):
    return handler(node, [tensor(node, v) for v in inputs], node.opset)


@register("Mod", host=_host_mod)
def mod(node, inputs, opset):
    a, b = _pair(node, inputs)
    if node.attr("fmod", 0):
        return ops.fmod(a, b)
    return ops.mod(a, b)


@register("PRelu")
def prelu(node, inputs, opset):
    x, slope = _pair(node, inputs)
    if slope.shape and x.shape and len(slope.shape) == 1 and len(x.shape) > 1 and slope.shape[0] == x.shape[1] \
            and slope.shape[0] != x.shape[-1] and opset < 7:
        # opset 6 broadcast the slope over channels (axis 1)
        slope = autograd.reshape(slope, [slope.shape[0]] + [1] * (len(x.shape) - 2))
    return autograd.prelu(x, slope)


# -- variadic ------------------------------------------------------------------------------------------------------


def _host_variadic(node, inputs, opset):
    xs = [v for v in inputs if v is not None]
    fn = {"Max": np.maximum, "Min": np.minimum, "Sum": np.add}.get(node.op_type)
    if fn is None or xs[0].dtype.kind not in "iu":
        return _device_via(node, xs, variadic)
    y = xs[0]
    for x in xs[1:]:
        y = fn(y, x)
    return np.asarray(y).astype(xs[0].dtype)


@register(("Max", "Min", "Sum", "Mean"), host=_host_variadic)
def variadic(node, inputs, opset):
    xs = [v for v in inputs_as_tensors(node, inputs) if v is not None]
    if len(xs) == 1:
        return autograd.identity(xs[0])
    if node.op_type == "Max":
        return autograd.max(*xs)
    if node.op_type == "Min":
        return autograd.min(*xs)
    if node.op_type == "Sum":
        if xs[0].dtype in INTS:
            y = xs[0]
            for x in xs[1:]:
                y = ops.add(y, x)
            return y
        return autograd.sum(*xs)
    return autograd.mean(*xs)


# -- unary ---------------------------------------------------------------------------------------------------------

_UNARY = {
    "Abs": autograd.abs, "Neg": autograd.negative, "Reciprocal": autograd.reciprocal, "Floor": autograd.floor,
    "Ceil": autograd.ceil, "Round": autograd.rounde, "Sqrt": autograd.sqrt, "Exp": autograd.exp, "Log": autograd.log,
    "Sin": autograd.sin, "Cos": autograd.cos, "Tan": autograd.tan, "Asin": autograd.asin, "Acos": autograd.acos,
    "Atan": autograd.atan, "Sinh": autograd.sinh, "Cosh": autograd.cosh, "Asinh": autograd.asinh,
    "Acosh": autograd.acosh, "Atanh": autograd.atanh, "Sigmoid": autograd.sigmoid, "Tanh": autograd.tanh,
    "Relu": autograd.relu, "Softplus": autograd.softplus, "Softsign": autograd.softsign, "Sign": autograd.sign,
    "Erf": autograd.erf,
}
# integer inputs: plain ops (no gradient to carry)
_INT_UNARY = {"Abs": ops.abs, "Neg": ops.neg, "Sign": ops.sign, "Relu": ops.relu}


def _host_unary(node, inputs, opset):
    x = inputs[0]
    fn = {"Abs": np.abs, "Neg": np.negative, "Floor": np.floor, "Ceil": np.ceil, "Sqrt": np.sqrt, "Sign": np.sign,
          "Reciprocal": np.reciprocal, "Exp": np.exp, "Log": np.log}.get(node.op_type)
    if fn is None or x.dtype == object:
        return _unary_device(node, [tensor(node, x)])
    return np.asarray(fn(x)).astype(x.dtype, copy=False)


def _unary_device(node, inputs):
    x = tensor(node, inputs[0], slot=0)
    if x.dtype in INTS:
        fn = _INT_UNARY.get(node.op_type)
        if fn is None:
            if node.op_type in ("Floor", "Ceil", "Round"):
                return x
            raise TypeError(f"{node.op_type} is not defined for integer tensors")
        return fn(x)
    return _UNARY[node.op_type](x)


@register(tuple(_UNARY), host=_host_unary)
def unary(node, inputs, opset):
    return _unary_device(node, inputs)


@register("Identity")
def identity(node, inputs, opset):
    x = inputs[0]
    if isinstance(x, Tensor):
        return autograd.identity(x) if x.dtype in FLOATS else x
    return x


@register("LeakyRelu")
def leaky_relu(node, inputs, opset):
    return autograd.leakyrelu(tensor(node, inputs[0]), node.attr("alpha", 0.01))


@register("Elu")
def elu(node, inputs, opset):
    return autograd.elu(tensor(node, inputs[0]), node.attr("alpha", 1.0))


@register("Selu")
def selu(node, inputs, opset):
    return autograd.selu(tensor(node, inputs[0]), node.attr("alpha", 1.67326319217681884765625),
                         node.attr("gamma", 1.05070102214813232421875))


@register("Celu")
def celu(node, inputs, opset):
    x = tensor(node, inputs[0])
    alpha = node.attr("alpha", 1.0)
    # alpha * elu(x / alpha): x for x > 0, alpha * (exp(x / alpha) - 1) otherwise
    return autograd.mul(autograd.elu(autograd.mul(x, const_like(x, 1.0 / alpha))), const_like(x, alpha))


@register("ThresholdedRelu")
def thresholded_relu(node, inputs, opset):
    x = tensor(node, inputs[0])
    return autograd.where(x, zeros_like(x), ops.gt(x, node.attr("alpha", 1.0)))


@register("HardSigmoid")
def hard_sigmoid(node, inputs, opset):
    return autograd.hardsigmoid(tensor(node, inputs[0]), node.attr("alpha", 0.2), node.attr("beta", 0.5))


@register("HardSwish")
def hard_swish(node, inputs, opset):
    x = tensor(node, inputs[0])
    return autograd.mul(x, autograd.hardsigmoid(x, 1.0 / 6.0, 0.5))


@register("Mish")
def mish(node, inputs, opset):
    x = tensor(node, inputs[0])
    return autograd.mul(x, autograd.tanh(autograd.softplus(x)))


@register("Swish")
def swish(node, inputs, opset):
    x = tensor(node, inputs[0])
    alpha = node.attr("alpha", 1.0)
    z = x if alpha == 1.0 else autograd.mul(x, const_like(x, alpha))
    return autograd.mul(x, autograd.sigmoid(z))


@register("Gelu")
def gelu(node, inputs, opset):
    x = tensor(node, inputs[0])
    approximate = node.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ValueError(f"Gelu: approximate={approximate!r}, expected 'none' or 'tanh'")
    return autograd.gelu_tanh(x) if approximate == "tanh" else autograd.gelu(x)


@register("Shrink")
def shrink(node, inputs, opset):
    x = tensor(node, inputs[0])
    lambd, bias = node.attr("lambd", 0.5), node.attr("bias", 0.0)
    if x.dtype in INTS:
        lambd_c, bias_c = lambd, int(bias)
    else:
        lambd_c, bias_c = lambd, bias
    hi = ops.gt(x, lambd_c) if x.dtype in FLOATS else ops.gt(ops.cast(x, sdt.float32), lambd_c)
    lo = ops.lt(x, -lambd_c) if x.dtype in FLOATS else ops.lt(ops.cast(x, sdt.float32), -lambd_c)
    down = autograd.sub(x, const_like(x, bias_c)) if x.dtype in FLOATS else ops.sub(x, const_like(x, bias_c))
    up = autograd.add(x, const_like(x, bias_c)) if x.dtype in FLOATS else ops.add(x, const_like(x, bias_c))
    if x.dtype in FLOATS:
        return autograd.where(down, autograd.where(up, zeros_like(x), lo), hi)
    return ops.where(hi, down, ops.where(lo, up, 0))


@register("Clip")
def clip(node, inputs, opset):
    x = tensor(node, inputs[0])
    if opset < 11:
        lo, hi = node.attr("min", None), node.attr("max", None)
    else:
        lo = inputs[1] if len(inputs) > 1 else None
        hi = inputs[2] if len(inputs) > 2 else None
        if isinstance(lo, Tensor) or isinstance(hi, Tensor):
            # bounds computed by the model: clamp with tensor max/min (they broadcast and carry gradients)
            y = x
            if lo is not None:
                y = autograd.max(y, tensor(node, lo, x.dtype))
            if hi is not None:
                y = autograd.min(y, tensor(node, hi, x.dtype))
            return y
        lo = None if lo is None else host(lo).reshape(-1)[0].item()
        hi = None if hi is None else host(hi).reshape(-1)[0].item()
    if lo is not None and hi is not None and lo > hi:
        lo = hi  # numpy.clip (and ONNX): every value becomes max
    if x.dtype in INTS:
        return ops.clip(x, lo, hi)
    return autograd.clip(x, lo, hi)


@register(("IsNaN", "IsInf"))
def is_special(node, inputs, opset):
    x = tensor(node, inputs[0])
    if x.dtype not in FLOATS:
        return full(x.shape, False, sdt.bool_, x.device)
    if node.op_type == "IsNaN":
        return ops.isnan(x)
    r = ops.isinf(x)
    if not node.attr("detect_positive", 1):
        r = ops.logical_and(r, ops.lt(x, 0))
    if not node.attr("detect_negative", 1):
        r = ops.logical_and(r, ops.gt(x, 0))
    return r


# -- bit operations (integers; composed from arithmetic, there are no bit kernels) ----------------------------------


def _pow2(x: Tensor, k: Tensor) -> Tensor:
    """2 ** k for non-negative integer tensors k, in k's dtype (exact up to 2**62)."""
    f = ops.pow(const_like(ops.cast(k, sdt.float32), 2.0), ops.cast(k, sdt.float32))
    return ops.cast(ops.round(f), x.dtype)


@register("BitShift")
def bit_shift(node, inputs, opset):
    x, y = _pair(node, inputs)
    t = in_type(node, 0, inputs[0])
    width = _bits(t, x.dtype)
    shape = ops.broadcast_shapes("BitShift", x.shape, y.shape)
    x, y = ops.copy(ops.broadcast_to(x, shape)), ops.copy(ops.broadcast_to(y, shape))
    valid = ops.logical_and(ops.ge(y, const_like(y, 0)), ops.lt(y, const_like(y, width)))
    k = ops.clip(y, 0, min(width - 1, 62))
    if node.attr("direction") == "LEFT":
        r = wrap_int(ops.mul(x, _pow2(x, k)), t)
        return ops.where(valid, r, const_like(x, 0))
    # right shifts are floor divisions by 2**y (arithmetic for signed types); past the width: the sign fill
    r = ops.floor_divide(x, _pow2(x, k))
    fill = ops.where(ops.lt(x, const_like(x, 0)), const_like(x, -1), const_like(x, 0))
    return ops.where(valid, r, fill)


def _bits(t: int | None, code: int) -> int:
    return {TP.INT8: 8, TP.UINT8: 8, TP.INT16: 16, TP.UINT16: 16, TP.INT32: 32, TP.UINT32: 32}.get(
        t, 32 if code == sdt.int32 else 64)


@register(("BitwiseAnd", "BitwiseOr", "BitwiseXor"))
def bitwise(node, inputs, opset):
    a, b = _pair(node, inputs)
    t = in_type(node, 0, inputs[0])
    shape = ops.broadcast_shapes("bitwise", a.shape, b.shape)
    a, b = ops.broadcast_to(a, shape), ops.broadcast_to(b, shape)
    nbits = _bits(t, a.dtype)
    signed = t not in ot.UNSIGNED
    two = const_like(a, 2)
    acc = full(shape, 0, a.dtype, a.device)
    ca, cb = a, b  # floor-divided by 2 at each step: the low bit is then the Python modulo 2
    for k in range(nbits):
        ba, bb = ops.mod(ca, two), ops.mod(cb, two)
        if node.op_type == "BitwiseAnd":
            bit = ops.mul(ba, bb)
        elif node.op_type == "BitwiseOr":
            bit = ops.sub(ops.add(ba, bb), ops.mul(ba, bb))
        else:
            bit = ops.mod(ops.add(ba, bb), two)
        weight = -(1 << k) if signed and k == nbits - 1 else (1 << k)
        if weight >= 2**63:
            weight -= 2**64  # the top bit of a uint64 carried in int64
        acc = ops.add(acc, ops.mul(bit, const_like(a, weight)))
        ca, cb = ops.floor_divide(ca, two), ops.floor_divide(cb, two)
    return wrap_int(acc, t)


@register("BitwiseNot")
def bitwise_not(node, inputs, opset):
    x = tensor(node, inputs[0])
    t = in_type(node, 0, inputs[0])
    if t in ot.UNSIGNED:
        top = (1 << _bits(t, x.dtype)) - 1
        if top >= 2**63:
            return ops.sub(const_like(x, -1), x)  # two's complement in the int64 carrier
        return ops.sub(const_like(x, top), x)
    return ops.sub(const_like(x, -1), x)
