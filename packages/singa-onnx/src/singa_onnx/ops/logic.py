"""Comparisons, logical operators and Where (bool results; no gradients except through Where's branches)."""

from __future__ import annotations

import numpy as np

from singa import autograd, ops
from singa import dtypes as sdt
from singa_onnx.ops._common import FLOATS, inputs_as_tensors, tensor
from singa_onnx.registry import register

_CMP = {"Equal": "eq", "Less": "lt", "Greater": "gt", "LessOrEqual": "le", "GreaterOrEqual": "ge"}
_NP_CMP = {"Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
           "GreaterOrEqual": np.greater_equal, "And": np.logical_and, "Or": np.logical_or,
           "Xor": np.logical_xor}


def _host_cmp(node, inputs, opset):
    return np.asarray(_NP_CMP[node.op_type](inputs[0], inputs[1]))


@register(tuple(_CMP), host=_host_cmp)
def compare(node, inputs, opset):
    a, b = inputs_as_tensors(node, inputs)
    if a.dtype == sdt.bool_ and node.op_type != "Equal":
        a, b = ops.cast(a, sdt.int32), ops.cast(b, sdt.int32)
    return getattr(ops, _CMP[node.op_type])(a, b)


@register(("And", "Or", "Xor"), host=_host_cmp)
def logical(node, inputs, opset):
    a, b = inputs_as_tensors(node, inputs, sdt.bool_)
    return {"And": ops.logical_and, "Or": ops.logical_or, "Xor": ops.logical_xor}[node.op_type](a, b)


def _host_not(node, inputs, opset):
    return np.logical_not(inputs[0])


@register("Not", host=_host_not)
def logical_not(node, inputs, opset):
    return ops.logical_not(tensor(node, inputs[0], sdt.bool_))


def _host_where(node, inputs, opset):
    c, x, y = inputs
    return np.where(c, x, y).astype(x.dtype if x.dtype != object else object)


@register("Where", host=_host_where)
def where(node, inputs, opset):
    c, x, y = inputs
    c = tensor(node, c, sdt.bool_, slot=0)
    x, y = inputs_as_tensors(node, [x, y], first_slot=1)
    if x.dtype in FLOATS:
        return autograd.where(x, y, c)
    return ops.where(c, x, y)
