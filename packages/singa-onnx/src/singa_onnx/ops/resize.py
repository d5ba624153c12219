"""Resize / Upsample, GridSample, RoiAlign.

Resize is separable: along each resized axis the output is a fixed linear map of the input (nearest, linear, cubic,
with or without antialiasing), so it runs as one matrix product per axis with a host-built interpolation matrix.
That is exact to ONNX's definition, works for every rank and mode, and trains (autograd.matmul).
"""

from __future__ import annotations

import math

import numpy as np

from singa import autograd, ops
from singa import dtypes as sdt
from singa.tensor import Tensor
from singa_onnx.ops._common import FLOATS, const_like, floats, host_to_tensor, ints, norm_axis, tensor
from singa_onnx.registry import register

# -- interpolation coefficients (ONNX's definitions) ------------------------------------------------------------------


def _nearest(mode: str):
    def f(ratio: float, scale: float) -> np.ndarray:
        if float(ratio).is_integer():
            return np.array([0.0, 1.0])
        if mode == "round_prefer_floor":
            return np.array([ratio <= 0.5, ratio > 0.5], dtype=np.float64)
        if mode == "round_prefer_ceil":
            return np.array([ratio < 0.5, ratio >= 0.5], dtype=np.float64)
        if mode == "floor":
            return np.array([1.0, 0.0])
        return np.array([0.0, 1.0])

    return f


def _linear(antialias: bool):
    def f(ratio: float, scale: float) -> np.ndarray:
        if not antialias:
            return np.array([1 - ratio, ratio])
        s = min(scale, 1.0)
        start = int(np.floor(-1 / s) + 1)
        args = (np.arange(start, start + 2 - 2 * start) - ratio) * s
        c = np.clip(1 - np.abs(args), 0, 1)
        return c / c.sum()

    return f


def _cubic(a: float, antialias: bool):
    def kernel(x: float) -> float:
        x = abs(x)
        if x <= 1:
            return (a + 2) * x**3 - (a + 3) * x**2 + 1
        if x < 2:
            return a * x**3 - 5 * a * x**2 + 8 * a * x - 4 * a
        return 0.0

    def f(ratio: float, scale: float) -> np.ndarray:
        if not antialias:
            return np.array([kernel(ratio + 1), kernel(ratio), kernel(1 - ratio), kernel(2 - ratio)])
        s = min(scale, 1.0)
        i0 = int(np.floor(-2 / s) + 1)
        c = np.array([kernel(s * (i - ratio)) for i in range(i0, 2 - i0)])
        return c / c.sum()

    return f


def _source_coords(ctm: str, out_int: int, scale: float, in_w: int, roi):
    y = np.arange(out_int, dtype=np.float64)
    out_w = scale * in_w
    extrap = None
    if ctm == "align_corners":
        x = np.zeros(out_int) if out_w == 1 else y * (in_w - 1) / (out_w - 1)
    elif ctm == "asymmetric":
        x = y / scale
    elif ctm == "tf_crop_and_resize":
        r0, r1 = roi
        x = np.full(out_int, (r1 - r0) * (in_w - 1) / 2) if out_w == 1 else y * (r1 - r0) * (in_w - 1) / (out_w - 1)
        x = x + r0 * (in_w - 1)
        extrap = (x < 0) | (x > in_w - 1)
    elif ctm == "pytorch_half_pixel":
        x = np.full(out_int, -0.5) if out_w == 1 else (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel_symmetric":
        adj = out_int / out_w
        x = in_w / 2 * (1 - adj) + (y + 0.5) / scale - 0.5
    else:
        raise ValueError(f"unknown coordinate_transformation_mode {ctm!r}")
    return x, extrap


def interp_matrix(in_w: int, out_int: int, scale: float, coeffs, ctm: str, roi, exclude_outside: bool):
    """(M, extrapolated rows): out = M @ in along one axis, M of shape (out_int, in_w)."""
    x, extrap = _source_coords(ctm, out_int, scale, in_w, roi)
    xi = np.floor(x)
    ratios = np.where(x == xi, 1.0, x - xi)
    c = np.stack([coeffs(float(r), scale) for r in ratios]) if out_int else np.zeros((0, 2))
    n = c.shape[1]
    pad = int(np.ceil(n / 2))
    xp = x + pad
    pp = np.floor(xp)
    frac = xp - pp
    if n % 2 == 0:
        off = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        base = -((n - 1) // 2)
        off = np.where(frac <= 0.5, base, base + 1)
    idx = (pp + off).astype(np.int64)[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        c = np.where((idx < 0) | (idx >= in_w), 0.0, c)
        s = c.sum(axis=1, keepdims=True)
        c = c / np.where(s == 0, 1.0, s)
    clamped = np.clip(idx, 0, in_w - 1)  # ONNX reads past the edges as the edge value
    M = np.zeros((out_int, in_w))
    rows = np.repeat(np.arange(out_int), n)
    np.add.at(M, (rows, clamped.reshape(-1)), c.reshape(-1))
    return M, extrap


def resize_tensor(x: Tensor, out_sizes, scales, axes, coeffs, ctm, roi, exclude_outside, extrapolation_value):
    """x resized along `axes` (sizes and scales given per axis)."""
    floats_ = x.dtype in FLOATS
    y = x if floats_ else ops.cast(x, sdt.float32)
    nd = len(x.shape)
    for a, o, s in zip(axes, out_sizes, scales):
        r = None if roi is None else (roi[a], roi[a + nd])
        in_w = y.shape[a]
        if o == in_w and math.isclose(s, 1.0) and (r is None or (math.isclose(r[0], 0) and math.isclose(r[1], 1))):
            continue
        M, extrap = interp_matrix(in_w, o, s, coeffs, ctm, r, exclude_outside)
        Mt = host_to_tensor(M.T.astype(np.float32), y.device, y.dtype)  # (in, out)
        perm = [i for i in range(nd) if i != a] + [a]
        inv = list(np.argsort(perm))
        z = autograd.matmul(autograd.transpose(y, perm), Mt)
        y = autograd.transpose(z, inv)
        if extrap is not None and extrap.any():
            shp = [1] * nd
            shp[a] = o
            mask = host_to_tensor(extrap.reshape(shp), y.device, sdt.bool_)
            y = autograd.where(const_like(y, extrapolation_value), y, mask)
    if not floats_:
        info = np.iinfo(sdt.to_numpy_dtype(x.dtype))
        y = ops.cast(ops.clip(ops.round(y), float(info.min), float(info.max)), x.dtype)
    return y


def _coeff_fn(node, mode):
    if mode == "nearest":
        return _nearest(node.attr("nearest_mode", "round_prefer_floor"))
    antialias = bool(node.attr("antialias", 0))
    if mode == "linear" or mode == "bilinear":
        return _linear(antialias)
    if mode in ("cubic", "bicubic"):
        return _cubic(node.attr("cubic_coeff_a", -0.75), antialias)
    raise ValueError(f"unknown Resize mode {mode!r}")


@register("Resize", static=(1, 2, 3))
def resize(node, inputs, opset):
    x = tensor(node, inputs[0])
    nd = len(x.shape)
    mode = node.attr("mode", "nearest")
    if opset < 11:
        scales = floats(inputs[1])
        sizes = None
        roi = None
        ctm = "asymmetric"
        coeffs = _nearest("floor") if mode == "nearest" else _coeff_fn(node, mode)
    else:
        roi = floats(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else []
        scales = floats(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else []
        sizes = ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else []
        sizes = sizes or None
        scales = scales or None
        ctm = node.attr("coordinate_transformation_mode", "half_pixel")
        coeffs = _coeff_fn(node, mode)
    axes = node.attr("axes")
    axes = list(range(nd)) if axes is None else [norm_axis(a, nd) for a in axes]
    if roi:
        full_roi = [0.0] * nd + [1.0] * nd
        k = len(axes)
        if len(roi) == 2 * nd and k != nd:
            full_roi = list(roi)
        else:
            for i, a in enumerate(axes):
                full_roi[a], full_roi[a + nd] = roi[i], roi[i + k]
        roi = full_roi
    else:
        roi = None
    if sizes is not None:
        sc = [sizes[i] / x.shape[a] for i, a in enumerate(axes)]
        policy = node.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            s = min(sc) if policy == "not_larger" else max(sc)
            sc = [s] * len(axes)
            sizes = [int(s * x.shape[a] + 0.5) for a in axes]
        out = list(sizes)
    else:
        sc = list(scales) if len(scales) == len(axes) else [scales[a] for a in axes]
        out = [int(s * x.shape[a]) for s, a in zip(sc, axes)]
    return resize_tensor(x, out, sc, axes, coeffs, ctm, roi, bool(node.attr("exclude_outside", 0)),
                         node.attr("extrapolation_value", 0.0))


@register("Upsample", static=(1,))
def upsample(node, inputs, opset):
    x = tensor(node, inputs[0])
    scales = list(node.attr("scales")) if opset < 9 else floats(inputs[1])
    mode = node.attr("mode", "nearest")
    nd = len(x.shape)
    if mode == "nearest" and all(float(s).is_integer() for s in scales) and x.dtype in FLOATS:
        return autograd.upsample(x, "nearest", scales)
    coeffs = _nearest("floor") if mode == "nearest" else _linear(False)
    out = [int(s * d) for s, d in zip(scales, x.shape)]
    return resize_tensor(x, out, scales, list(range(nd)), coeffs, "asymmetric", None, False, 0.0)
