"""Helpers shared by the operator handlers: moving values between host and device, dtypes, attributes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx import TensorProto as TP

from singa import autograd, ops
from singa import dtypes as sdt
from singa.tensor import Tensor
from singa_onnx import onnx_types as ot

FLOATS = frozenset(sdt.FLOATS + (sdt.float64,))
INTS = frozenset(sdt.INTS)


def is_host(v: Any) -> bool:
    return isinstance(v, np.ndarray)


def device(node) -> Any:
    return node.rt.device


def onnx_type_of(v: Any) -> int | None:
    if isinstance(v, np.ndarray):
        return ot.from_np(v.dtype) if v.dtype != object else TP.STRING
    if isinstance(v, Tensor):
        return ot.singa_to_onnx_type(v.dtype)
    return None


def in_type(node, i: int, v: Any = None) -> int | None:
    """The ONNX type of input i (declared/inferred, else read off the value)."""
    t = node.in_types[i] if i < len(node.in_types) else None
    if t:
        return t
    return onnx_type_of(v)


def out_type(node, i: int = 0, default: int | None = None) -> int | None:
    t = node.out_types[i] if i < len(node.out_types) else None
    return t or default


def host_to_tensor(arr: np.ndarray, dev, code: int | None = None) -> Tensor:
    """A device tensor holding host data, in its storage type (or `code`)."""
    arr, code = host_array(arr, dev, code)
    t = ops.from_numpy(arr, dev, code)
    t.requires_grad = False
    return t


def host_array(arr: np.ndarray, dev, code: int | None = None) -> tuple[np.ndarray, int]:
    """(host data converted to what a device tensor of SINGA dtype `code` holds, C-contiguous; code), with code
    defaulting to the storage type of arr's dtype on `dev`."""
    arr = np.asarray(arr)
    if code is None:
        if arr.dtype == object:
            raise TypeError("string data cannot be moved to a device")
        code = ot.storage(ot.from_np(arr.dtype), dev)
    npd = sdt.to_numpy_dtype(code)
    if arr.dtype != npd:
        if npd.kind in "iu" and arr.dtype.kind == "f":
            arr = np.trunc(arr)
        elif arr.dtype.kind == "V":  # ml_dtypes (bfloat16, float8, int4 ...): through float32 / int64
            arr = arr.astype(np.float32 if npd.kind == "f" else np.int64)
        arr = arr.astype(npd)
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
    return arr, code


def tensor(node, v: Any, code: int | None = None, slot: Any = None) -> Tensor:
    """v as a device tensor (cast to SINGA dtype `code` when given). Host constants that come back unchanged at each
    run (initializers, Constant nodes) are copied to the device once per node and input `slot`."""
    if isinstance(v, Tensor):
        if code is not None and v.dtype != code:
            return autograd.cast(v, code) if v.dtype in FLOATS and code in FLOATS else ops.cast(v, code)
        return v
    if v is None:
        raise ValueError("a required input is missing")
    arr = v if isinstance(v, np.ndarray) else np.asarray(v)
    dev = device(node)
    if slot is not None:
        key = (slot, code)
        hit = node.scratch.get(key)
        if hit is not None and hit[0] is arr and hit[1].device is dev:
            return hit[1]
        t = host_to_tensor(arr, dev, code)
        node.scratch[key] = (arr, t)
        return t
    return host_to_tensor(arr, dev, code)


def inputs_as_tensors(node, inputs: Sequence[Any], code: int | None = None, first_slot: int = 0) -> list:
    """Every present input as a device tensor; host inputs take the dtype of the first device input (ONNX gives the
    operands of one operator one type), or `code`. `first_slot` is the ONNX input index of inputs[0]."""
    if code is None:
        like = next((v for v in inputs if isinstance(v, Tensor)), None)
        if like is not None:
            code = like.dtype
    return [None if v is None else tensor(node, v, code, slot=first_slot + i) for i, v in enumerate(inputs)]


def host(v: Any) -> np.ndarray:
    """v as a numpy array (device data is read back)."""
    if isinstance(v, Tensor):
        return ops.to_numpy(v)
    return np.asarray(v)


def ints(v: Any) -> list[int]:
    if v is None:
        return []
    return [int(e) for e in host(v).reshape(-1)]


def floats(v: Any) -> list[float]:
    if v is None:
        return []
    return [float(e) for e in host(v).reshape(-1)]


def scalar(v: Any) -> Any:
    a = host(v).reshape(-1)
    if a.size != 1:
        raise ValueError(f"expected a single value, got shape {host(v).shape}")
    return a[0].item()


def shape_of(v: Any) -> tuple:
    if isinstance(v, (Tensor, np.ndarray)):
        return tuple(v.shape)
    raise TypeError(f"expected a tensor, got {type(v).__name__}")


def ndim(v: Any) -> int:
    return len(shape_of(v))


def norm_axis(axis: int, nd: int) -> int:
    if not -nd <= axis < max(nd, 1):
        raise ValueError(f"axis {axis} is out of range for rank {nd}")
    return axis % nd if nd else 0


def const_like(x: Tensor, value: Any) -> Tensor:
    """A 0-d constant in x's dtype on x's device (no gradient)."""
    t = ops.full((), value, x.dtype, x.device)
    t.requires_grad = False
    return t


def full(shape: Sequence[int], value: Any, code: int, dev) -> Tensor:
    t = ops.full(tuple(int(d) for d in shape), value, code, dev)
    t.requires_grad = False
    return t


def zeros_like(x: Tensor) -> Tensor:
    return full(x.shape, 0, x.dtype, x.device)


def arange(n: int, dev, code: int = sdt.int64, shape: Sequence[int] | None = None) -> Tensor:
    a = np.arange(n)
    if shape is not None:
        a = a.reshape(shape)
    return host_to_tensor(a, dev, code)


def wrap_int(x: Tensor, t: int | None) -> Tensor:
    """Integers reduced to the range of ONNX type t (two's complement wrap-around), for narrow types."""
    bits = ot.NARROW_INTS.get(t)
    if bits is None or x.dtype not in INTS:
        return x
    span = 1 << bits
    lo = 0 if t in ot.UNSIGNED else -(span // 2)
    code = x.dtype
    if bits == 32 and code == sdt.int32:
        return x
    r = ops.mod(ops.sub(x, const_like(x, lo)), const_like(x, span))
    return ops.add(r, const_like(x, lo)) if lo else r


def to_code(node, t: int) -> int:
    return ot.storage(t)


def reduce_axes(axes: Sequence[int] | None, nd: int) -> tuple:
    if axes is None:
        return tuple(range(nd))
    return tuple(sorted({norm_axis(int(a), nd) for a in axes}))


def numel(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape)


def same_pads(in_shape: Sequence[int], kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
              mode: str) -> list[int]:
    """ONNX auto_pad SAME_UPPER / SAME_LOWER: pads (begins then ends) so that out = ceil(in / stride)."""
    begins, ends = [], []
    for n, k, s, d in zip(in_shape, kernel, strides, dilations):
        out = -(-n // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
        small, big = total // 2, total - total // 2
        if mode == "SAME_UPPER":
            begins.append(small)
            ends.append(big)
        else:
            begins.append(big)
            ends.append(small)
    return begins + ends


def spatial_pads(node, in_spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                 dilations: Sequence[int]) -> list[int]:
    """Pads (begins then ends) from `pads` / `auto_pad`."""
    nd = len(kernel)
    mode = node.attr("auto_pad", "NOTSET")
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        return same_pads(in_spatial, kernel, strides, dilations, mode)
    if mode == "VALID":
        return [0] * (2 * nd)
    pads = list(node.attr("pads", [0] * (2 * nd)))
    if len(pads) != 2 * nd:
        raise ValueError(f"pads {pads} must have {2 * nd} values")
    return pads
