"""Normalisation: BatchNormalization and LayerNormalization (SINGA's kernels, any rank), Instance/Group/RMS
normalisation, LpNormalization, MeanVarianceNormalization (composed from autograd operators, so they train)."""

from __future__ import annotations

import math

from singa import autograd, ops
from singa.tensor import Tensor
from singa_onnx.ops._common import const_like, inputs_as_tensors, norm_axis, tensor
from singa_onnx.registry import register


def _per_channel(t: Tensor, nd: int) -> Tensor:
    return autograd.reshape(t, [-1] + [1] * (nd - 2)) if nd > 2 else t


def _moments(x: Tensor, axes: list[int]) -> tuple[Tensor, Tensor, Tensor]:
    """(mean, centred x, biased variance), keepdims."""
    mean = autograd.reduce_mean(x, axes, 1)
    d = autograd.sub(x, mean)
    var = autograd.reduce_mean(autograd.mul(d, d), axes, 1)
    return mean, d, var


def _inv_std(var: Tensor, eps: float) -> Tensor:
    return autograd.reciprocal(autograd.sqrt(autograd.add(var, const_like(var, eps))))


@register("BatchNormalization", states=(3, 4))
def batch_norm(node, inputs, opset):
    x, scale, bias, mean, var = inputs_as_tensors(node, inputs[:5])
    eps = node.attr("epsilon", 1e-5)
    momentum = node.attr("momentum", 0.9)
    nd = len(x.shape)
    training_mode = node.attr("training_mode", 0) if opset >= 14 else (
        len([o for o in node.outputs if o]) > 1 and not node.attr("is_test", 0))
    if training_mode:
        # ONNX's training mode: batch statistics (biased variance), running statistics returned as new outputs
        axes = [0] + list(range(2, nd))
        bmean, d, bvar = _moments(x, axes)
        y = autograd.add(autograd.mul(autograd.mul(d, _inv_std(bvar, eps)), _per_channel(scale, nd)),
                         _per_channel(bias, nd))
        bm = ops.reshape(bmean, mean.shape)
        bv = ops.reshape(bvar, var.shape)
        run_mean = ops.add(ops.mul(mean, momentum), ops.mul(bm, 1 - momentum))
        run_var = ops.add(ops.mul(var, momentum), ops.mul(bv, 1 - momentum))
        if opset >= 14:
            return y, run_mean, run_var
        return y, run_mean, run_var, bm, bv
    if autograd.training and not node.rt.training:
        # gradients wanted, statistics frozen (a feature extractor under new layers): running statistics, composed
        inv = ops.reciprocal(ops.sqrt(ops.add(var, const_like(var, eps))))
        y = autograd.mul(autograd.sub(x, _per_channel(mean, nd)), _per_channel(inv, nd))
        return autograd.add(autograd.mul(y, _per_channel(scale, nd)), _per_channel(bias, nd))
    # SINGA's kernel: batch statistics (and running-statistics updates) while training, else the running ones
    if nd == 2 or nd == 4:
        return autograd.batchnorm_2d(x, scale, bias, mean, var, momentum, eps)
    # other ranks: normalise per channel on an (N, C, rest, 1) view
    shape = list(x.shape)
    x4 = autograd.reshape(x, [shape[0], shape[1], math.prod(shape[2:]), 1])
    y = autograd.batchnorm_2d(x4, scale, bias, mean, var, momentum, eps)
    return autograd.reshape(y, shape)


@register("InstanceNormalization")
def instance_norm(node, inputs, opset):
    x, scale, bias = inputs_as_tensors(node, inputs[:3])
    nd = len(x.shape)
    _, d, var = _moments(x, list(range(2, nd)))
    y = autograd.mul(d, _inv_std(var, node.attr("epsilon", 1e-5)))
    return autograd.add(autograd.mul(y, _per_channel(scale, nd)), _per_channel(bias, nd))


@register("LayerNormalization")
def layer_norm(node, inputs, opset):
    ts = inputs_as_tensors(node, list(inputs) + [None] * (3 - len(inputs)))
    x, scale, bias = ts[:3]
    ax = norm_axis(node.attr("axis", -1), len(x.shape))
    vecs = [t for t in (scale, bias) if t is not None]
    op = autograd.LayerNorm(ax, float(node.attr("epsilon", 1e-5)), scale is not None, bias is not None)
    y, mean, inv = op(x, *vecs)  # one layer_norm kernel
    outs = [y]
    if len(node.outputs) > 1 and node.outputs[1]:
        outs.append(mean)
    if len(node.outputs) > 2 and node.outputs[2]:
        if len(outs) == 1:
            outs.append(None)
        outs.append(inv)
    return tuple(outs) if len(outs) > 1 else y


@register("RMSNormalization")
def rms_norm(node, inputs, opset):
    x, scale = inputs_as_tensors(node, inputs[:2])
    nd = len(x.shape)
    ax = norm_axis(node.attr("axis", -1), nd)
    ms = autograd.reduce_mean(autograd.mul(x, x), list(range(ax, nd)), 1)
    return autograd.mul(autograd.mul(x, _inv_std(ms, node.attr("epsilon", 1e-5))), scale)


@register("GroupNormalization")
def group_norm(node, inputs, opset):
    x, scale, bias = inputs_as_tensors(node, inputs[:3])
    G = node.attr("num_groups")
    shape = list(x.shape)
    N, C = shape[:2]
    nd = len(shape)
    xg = autograd.reshape(x, [N, G, -1])
    _, d, var = _moments(xg, [2])
    y = autograd.reshape(autograd.mul(d, _inv_std(var, node.attr("epsilon", 1e-5))), shape)
    if opset < 21 and scale.shape == (G,) and G != C:
        # opset 18 gave one scale / bias per group
        scale = autograd.reshape(autograd.expand(autograd.reshape(scale, [G, 1]), [G, C // G]), [C])
        bias = autograd.reshape(autograd.expand(autograd.reshape(bias, [G, 1]), [G, C // G]), [C])
    return autograd.add(autograd.mul(y, _per_channel(scale, nd)), _per_channel(bias, nd))


@register("LpNormalization")
def lp_norm(node, inputs, opset):
    x = tensor(node, inputs[0])
    ax = norm_axis(node.attr("axis", -1), len(x.shape))
    p = node.attr("p", 2)
    if p == 1:
        n = autograd.reduce_sum(autograd.abs(x), [ax], 1)
    else:
        n = autograd.sqrt(autograd.reduce_sum(autograd.mul(x, x), [ax], 1))
    # an all-zero slice stays zero (not 0 / 0)
    zero = ops.eq(n, const_like(n, 0))
    safe = autograd.where(const_like(n, 1), n, zero)
    return autograd.div(x, safe)


@register("MeanVarianceNormalization")
def mvn(node, inputs, opset):
    x = tensor(node, inputs[0])
    axes = list(node.attr("axes", [0, 2, 3]))
    mean = autograd.reduce_mean(x, axes, 1)
    ex2 = autograd.reduce_mean(autograd.mul(x, x), axes, 1)
    std = autograd.sqrt(autograd.sub(ex2, autograd.mul(mean, mean)))
    return autograd.div(autograd.sub(x, mean), autograd.add(std, const_like(x, 1e-9)))
