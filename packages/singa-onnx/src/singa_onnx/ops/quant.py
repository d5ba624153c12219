"""Quantisation (QuantizeLinear, DequantizeLinear, QLinearMatMul, QLinearConv) computed in float32 with ONNX's
round-half-to-even and saturation, and the preview training operators (Adagrad, Momentum, Adam)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP

from singa import dtypes as sdt
from singa import ops
from singa.tensor import Tensor
from singa_onnx import onnx_types as ot
from singa_onnx.ops._common import const_like, in_type, norm_axis, scalar, tensor
from singa_onnx.registry import register

_RANGE = {TP.UINT8: (0, 255), TP.INT8: (-128, 127), TP.UINT16: (0, 65535), TP.INT16: (-32768, 32767),
          TP.INT32: (-2**31, 2**31 - 1), TP.UINT32: (0, 2**32 - 1), TP.INT4: (-8, 7), TP.UINT4: (0, 15),
          TP.INT2: (-2, 1), TP.UINT2: (0, 3)}


def _param(node, v, x: Tensor, axis: int, block: int, slot: int) -> Tensor:
    """A scale / zero point (float32) shaped to broadcast against x: per tensor, per axis or per block."""
    p = tensor(node, v, sdt.float32, slot=slot)
    nd = len(x.shape)
    if p.size() == 1 and not (block and len(p.shape) == nd):
        return ops.reshape(p, ())
    if block:
        ax = norm_axis(axis, nd)
        p = ops.repeat(p, block, ax)
        return ops.getitem(p, tuple(slice(0, x.shape[ax]) if i == ax else slice(None) for i in range(nd)))
    ax = norm_axis(axis, nd)
    shp = [1] * nd
    shp[ax] = p.size()
    return ops.reshape(p, shp)


def quantize(x: Tensor, scale: Tensor, zp: Tensor | None, t: int, saturate: bool = True) -> Tensor:
    if t in ot.SMALL_FLOATS:
        from singa_onnx.ops.cast import round_small_float

        y = ops.div(x, scale)
        return round_small_float(y if zp is None else ops.add(y, zp), t, saturate)
    y = ops.round(ops.div(x, scale))
    if zp is not None:
        y = ops.add(y, zp)
    lo, hi = _RANGE[t]
    y = ops.clip(y, float(lo), float(hi))
    return ops.cast(y, ot.storage(t))


@register("QuantizeLinear")
def quantize_linear(node, inputs, opset):
    x = tensor(node, inputs[0], slot=0)
    xf = x if x.dtype == sdt.float32 else ops.cast(x, sdt.float32)
    axis, block = node.attr("axis", 1), node.attr("block_size", 0)
    scale = _param(node, inputs[1], xf, axis, block, 1)
    zp_v = inputs[2] if len(inputs) > 2 else None
    t = node.attr("output_dtype", 0) or (in_type(node, 2, zp_v) if zp_v is not None else TP.UINT8)
    zp = _param(node, zp_v, xf, axis, block, 2) if zp_v is not None else None
    if t not in _RANGE and t not in ot.SMALL_FLOATS:
        raise TypeError(f"QuantizeLinear to {ot.name(t)} is not supported")
    return quantize(xf, scale, zp, t, bool(node.attr("saturate", 1)))


@register("DequantizeLinear")
def dequantize_linear(node, inputs, opset):
    x = tensor(node, inputs[0], slot=0)
    xf = ops.cast(x, sdt.float32)
    axis, block = node.attr("axis", 1), node.attr("block_size", 0)
    scale = _param(node, inputs[1], xf, axis, block, 1)
    if len(inputs) > 2 and inputs[2] is not None:
        xf = ops.sub(xf, _param(node, inputs[2], xf, axis, block, 2))
    y = ops.mul(xf, scale)
    t = node.attr("output_dtype", 0) or in_type(node, 1, inputs[1]) or TP.FLOAT
    code = ot.storage(t)
    return y if code == sdt.float32 else ops.cast(y, code)


def _deq(node, inputs, i, slot):
    """inputs[i], [i+1], [i+2] = (q, scale, zero point) as a float tensor."""
    q = ops.cast(tensor(node, inputs[i], slot=slot), sdt.float32)
    scale = tensor(node, inputs[i + 1], sdt.float32, slot=slot + 1)
    zp = tensor(node, inputs[i + 2], sdt.float32, slot=slot + 2)
    return q, scale, zp


@register("QLinearMatMul")
def qlinear_matmul(node, inputs, opset):
    a, sa, za = _deq(node, inputs, 0, 0)
    b, sb, zb = _deq(node, inputs, 3, 3)
    if za.size() > 1 and len(a.shape) >= 2:
        za, sa = ops.reshape(za, (-1, 1)), ops.reshape(sa, (-1, 1))
    # integer-valued products, exact in float32 for 8-bit inputs; scaled once at the end
    acc = ops.matmul(ops.sub(a, za), ops.sub(b, zb))
    sy = tensor(node, inputs[6], sdt.float32, slot=6)
    zy = tensor(node, inputs[7], sdt.float32, slot=7)
    y = ops.div(ops.mul(acc, ops.mul(sa, sb)), sy)
    return quantize(y, const_like(y, 1.0), zy, in_type(node, 7, inputs[7]) or TP.UINT8)


@register("QLinearConv")
def qlinear_conv(node, inputs, opset):
    from singa_onnx.ops._common import spatial_pads
    from singa_onnx.ops.nn import _conv_attrs, conv_nd

    x, sx, zx = _deq(node, inputs, 0, 0)
    w, sw, zw = _deq(node, inputs, 3, 3)
    if zw.size() > 1:
        zw = ops.reshape(zw, [-1] + [1] * (len(w.shape) - 1))
    if sw.size() > 1:
        sw = ops.reshape(sw, [1, -1] + [1] * (len(x.shape) - 2))
    kernel, strides, dils = _conv_attrs(node, x.shape, w.shape)
    pads = spatial_pads(node, x.shape[2:], kernel, strides, dils)
    acc = conv_nd(ops.sub(x, zx), ops.sub(w, zw), None, strides, pads, dils, node.attr("group", 1))
    if len(inputs) > 8 and inputs[8] is not None:
        bias = ops.cast(tensor(node, inputs[8], slot=8), sdt.float32)
        acc = ops.add(acc, ops.reshape(bias, [1, -1] + [1] * (len(x.shape) - 2)))
    sy = tensor(node, inputs[6], sdt.float32, slot=6)
    zy = tensor(node, inputs[7], sdt.float32, slot=7)
    y = ops.div(ops.mul(acc, ops.mul(sx, sw)), sy)
    return quantize(y, const_like(y, 1.0), zy, in_type(node, 7, inputs[7]) or TP.UINT8)


# -- ai.onnx.preview.training ---------------------------------------------------------------------------------------

_TRAINING = "ai.onnx.preview.training"


def _groups(node, inputs, per: int):
    n = (len(inputs) - 2) // per
    r = float(scalar(inputs[0]))
    t = int(scalar(inputs[1]))
    cols = [[tensor(node, inputs[2 + k * n + i]) for k in range(per)] for i in range(n)]
    return r, t, cols


@register("Adagrad", domain=_TRAINING)
def adagrad(node, inputs, opset):
    r, t, cols = _groups(node, inputs, 3)
    eps, decay, norm = node.attr("epsilon", 0.0), node.attr("decay_factor", 0.0), node.attr("norm_coefficient", 0.0)
    rr = r / (1 + t * decay)
    xs, hs = [], []
    for x, g, h in cols:
        g = ops.add(ops.mul(x, norm), g)
        h_new = ops.add(h, ops.mul(g, g))
        xs.append(ops.sub(x, ops.mul(ops.div(g, ops.add(ops.sqrt(h_new), eps)), rr)))
        hs.append(h_new)
    return tuple(xs + hs)


@register("Momentum", domain=_TRAINING)
def momentum(node, inputs, opset):
    r, t, cols = _groups(node, inputs, 3)
    alpha, beta, norm = node.attr("alpha"), node.attr("beta"), node.attr("norm_coefficient")
    nesterov = node.attr("mode", "standard") == "nesterov"
    b = beta if t > 0 else 1.0
    xs, vs = [], []
    for x, g, v in cols:
        g = ops.add(ops.mul(x, norm), g)
        v_new = ops.add(ops.mul(v, alpha), ops.mul(g, b))
        step = ops.add(g, ops.mul(v_new, alpha)) if nesterov else v_new
        xs.append(ops.sub(x, ops.mul(step, r)))
        vs.append(v_new)
    return tuple(xs + vs)


@register("Adam", domain=_TRAINING)
def adam(node, inputs, opset):
    r, t, cols = _groups(node, inputs, 4)
    alpha, beta = node.attr("alpha", 0.9), node.attr("beta", 0.999)
    eps, norm, post = node.attr("epsilon", 1e-6), node.attr("norm_coefficient", 0.0), node.attr(
        "norm_coefficient_post", 0.0)
    ra = r * np.sqrt(1 - beta**t) / (1 - alpha**t) if t > 0 else r
    xs, vs, hs = [], [], []
    for x, g, v, h in cols:
        g = ops.add(ops.mul(x, norm), g)
        v_new = ops.add(ops.mul(v, alpha), ops.mul(g, 1 - alpha))
        h_new = ops.add(ops.mul(h, beta), ops.mul(ops.mul(g, g), 1 - beta))
        x_new = ops.sub(x, ops.mul(ops.div(v_new, ops.add(ops.sqrt(h_new), eps)), float(ra)))
        xs.append(ops.mul(x_new, 1 - post))
        vs.append(v_new)
        hs.append(h_new)
    return tuple(xs + vs + hs)


@register("Gradient", domain=_TRAINING)
def gradient(node, inputs, opset):
    """d y / d x for the named xs, by re-running the nodes between them and y under singa's autograd."""
    from singa import autograd
    from singa_onnx.runtime import _Scope, run_node

    prog = node.program
    xs, y = list(node.attr("xs")), node.attr("y")
    pos = prog.nodes.index(node)
    needed, chosen = {y}, []
    for n in reversed(prog.nodes[:pos]):
        if any(o in needed for o in n.outputs):
            chosen.append(n)
            needed.update(i for i in n.inputs if i)
    leaves = {}
    for name, v in zip(xs, inputs):
        t = ops.copy(tensor(node, v))
        t.requires_grad, t.stores_grad = True, True
        leaves[name] = t
    prev = autograd.training
    autograd.training = True
    try:
        scope = _Scope(dict(leaves), node.scope)
        for n in reversed(chosen):
            outs = run_node(n, [scope.get(i) if i else None for i in n.inputs], node.rt, scope)
            scope.vals.update((o, v) for o, v in zip(n.outputs, outs) if o)
        grads = {id(p): g for p, g in autograd.backward(scope.get(y))}
    finally:
        autograd.training = prev
    return tuple(grads.get(id(leaves[name]), ops.full(leaves[name].shape, 0, leaves[name].dtype,
                                                       leaves[name].device)) for name in xs)
