"""Sampling and detection operators: GridSample, RoiAlign, NonMaxSuppression, DeformConv; transformer helpers
(RotaryEmbedding, CausalConvWithState).

Sampling is done on the device: coordinates are tensor arithmetic, pixels are fetched with flat gathers (so the
sampled data keeps its gradient) and blended with per-corner weights. Box selection (NonMaxSuppression) is a sequential
greedy choice with a data-dependent output size: the boxes and scores are read back and the choice made on the host.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from singa import autograd, ops
from singa import dtypes as sdt
from singa.tensor import Tensor
from singa_onnx.ops._common import FLOATS, const_like, host, host_to_tensor, inputs_as_tensors, tensor
from singa_onnx.ops.indexing import gather_elements
from singa_onnx.registry import register


def _f(x: Tensor, v: float) -> Tensor:
    return const_like(x, v)


def _reflect(v: Tensor, lo: float, hi: float) -> Tensor:
    """Fold coordinates into [lo, hi] by reflecting off the nearer border, repeatedly."""
    rng = hi - lo
    if rng <= 0:
        return ops.full(v.shape, lo, v.dtype, v.device)
    below = ops.lt(v, _f(v, lo))
    above = ops.gt(v, _f(v, hi))
    dx = ops.where(below, ops.sub(_f(v, lo), v), ops.sub(v, _f(v, hi)))
    n = ops.floor(ops.div(dx, _f(v, rng)))
    r = ops.sub(dx, ops.mul(n, _f(v, rng)))
    even = ops.eq(ops.mod(n, _f(v, 2.0)), _f(v, 0.0))
    from_lo = ops.add(_f(v, lo), r)
    from_hi = ops.sub(_f(v, hi), r)
    low_fix = ops.where(even, from_lo, from_hi)
    high_fix = ops.where(even, from_hi, from_lo)
    return ops.where(below, low_fix, ops.where(above, high_fix, v))


def _keys_cubic(t: Tensor, a: float = -0.75) -> list[Tensor]:
    """Keys cubic weights of the 4 taps at offsets -1, 0, 1, 2 for fractional position t."""
    def k(x):
        x = ops.abs(x)
        x2 = ops.mul(x, x)
        x3 = ops.mul(x2, x)
        near = ops.add(ops.sub(ops.mul(x3, _f(x, a + 2)), ops.mul(x2, _f(x, a + 3))), _f(x, 1.0))
        far = ops.add(ops.sub(ops.add(ops.mul(x3, _f(x, a)), ops.mul(x, _f(x, 8 * a))), ops.mul(x2, _f(x, 5 * a))),
                      _f(x, -4 * a))
        return ops.where(ops.le(x, _f(x, 1.0)), near, ops.where(ops.lt(x, _f(x, 2.0)), far, _f(x, 0.0)))

    return [k(ops.add(t, _f(t, 1.0))), k(t), k(ops.sub(_f(t, 1.0), t)), k(ops.sub(_f(t, 2.0), t))]


@register("GridSample")
def grid_sample(node, inputs, opset):
    X, grid = inputs_as_tensors(node, inputs[:2])
    mode = node.attr("mode", "linear" if opset >= 20 else "bilinear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    padding = node.attr("padding_mode", "zeros")
    align = bool(node.attr("align_corners", 0))
    N, C = X.shape[:2]
    dims = list(X.shape[2:])
    nd = len(dims)
    out = list(grid.shape[1:-1])
    Q = math.prod(out)
    g = ops.reshape(ops.contiguous(grid), (N, Q, nd))
    borders = [(0.0, d - 1.0) if align else (-0.5, d - 0.5) for d in dims]
    coords = []
    for i, L in enumerate(dims):
        n = ops.reshape(ops.contiguous(ops.getitem(g, (slice(None), slice(None), nd - 1 - i))), (N, Q))
        x = ops.mul(ops.add(n, _f(n, 1.0)), _f(n, (L - 1) / 2.0)) if align else ops.div(
            ops.sub(ops.mul(ops.add(n, _f(n, 1.0)), _f(n, float(L))), _f(n, 1.0)), _f(n, 2.0))
        if mode == "nearest":
            x = ops.round(x)
        lo, hi = borders[i]
        if padding == "border":
            x = ops.clip(x, 0.0, L - 1.0)
        elif padding == "reflection":
            x = _reflect(x, lo, hi)
        coords.append(x)
    strides = [math.prod(dims[i + 1:]) for i in range(nd)]
    flat = autograd.reshape(X, [N, C, math.prod(dims)]) if X.dtype in FLOATS else ops.reshape(X, (N, C, -1))

    def fetch(idx_per_dim: list[Tensor]) -> tuple[Tensor, Tensor]:
        """(values (N, C, Q), validity (N, 1, Q)) of integer-valued float coordinates, padding_mode applied."""
        valid = None
        lin = None
        for i, (v, L) in enumerate(zip(idx_per_dim, dims)):
            if padding == "zeros":
                ok = ops.logical_and(ops.ge(v, _f(v, 0.0)), ops.le(v, _f(v, L - 1.0)))
                valid = ok if valid is None else ops.logical_and(valid, ok)
                v = ops.clip(v, 0.0, L - 1.0)
            elif padding == "border":
                v = ops.clip(v, 0.0, L - 1.0)
            else:
                v = ops.clip(ops.floor(ops.abs(_reflect(v, *borders[i]))), 0.0, L - 1.0)
            term = ops.mul(ops.cast(v, sdt.int64), ops.full((), strides[i], sdt.int64, v.device))
            lin = term if lin is None else ops.add(lin, term)
        idx = ops.copy(ops.broadcast_to(ops.reshape(lin, (N, 1, Q)), (N, C, Q)))
        vals = gather_elements(flat, idx, 2)
        return vals, valid

    if mode == "nearest":
        vals, valid = fetch(coords)
        y = vals if valid is None else autograd.mul(vals, ops.cast(ops.reshape(valid, (N, 1, Q)), X.dtype))
    else:
        base = [ops.floor(c) for c in coords]
        frac = [ops.sub(c, b) for c, b in zip(coords, base)]
        if mode == "linear":
            offs = [0, 1]
            wts = [[ops.sub(_f(t, 1.0), t), t] for t in frac]
        else:
            offs = [-1, 0, 1, 2]
            wts = [_keys_cubic(t) for t in frac]
        y = None
        for combo in itertools.product(range(len(offs)), repeat=nd):
            idx = [ops.add(b, _f(b, float(offs[k]))) for b, k in zip(base, combo)]
            vals, valid = fetch(idx)
            w = None
            for i, k in enumerate(combo):
                w = wts[i][k] if w is None else ops.mul(w, wts[i][k])
            if valid is not None:
                w = ops.mul(w, ops.cast(valid, w.dtype))
            term = autograd.mul(vals, ops.reshape(w, (N, 1, Q)))
            y = term if y is None else autograd.add(y, term)
    return autograd.reshape(y, [N, C] + out) if X.dtype in FLOATS else ops.reshape(y, [N, C] + out)


# -- RoiAlign ---------------------------------------------------------------------------------------------------------


@register("RoiAlign")
def roi_align(node, inputs, opset):
    X = tensor(node, inputs[0], slot=0)
    rois = host(inputs[1]).astype(np.float64)
    bidx = host(inputs[2]).astype(np.int64)
    mode = node.attr("mode", "avg")
    oh, ow = node.attr("output_height", 1), node.attr("output_width", 1)
    ratio = node.attr("sampling_ratio", 0)
    scale = node.attr("spatial_scale", 1.0)
    half = node.attr("coordinate_transformation_mode", "half_pixel" if opset >= 16 else "output_half_pixel")
    offset = 0.5 if half == "half_pixel" else 0.0
    N, C, H, W = X.shape
    R = rois.shape[0]
    # per ROI and output cell: the bilinear taps (flat index, weight) of every sample point, built on the host
    # from the (small) ROI table, then one weighted gather on the device
    taps: list[list[list[tuple[int, float]]]] = []
    max_taps = 1
    for r in range(R):
        x1, y1, x2, y2 = rois[r] * scale - offset
        rw, rh = x2 - x1, y2 - y1
        if half != "half_pixel":
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / oh, rw / ow
        gh = ratio if ratio > 0 else math.ceil(rh / oh)
        gw = ratio if ratio > 0 else math.ceil(rw / ow)
        cells = []
        for ph in range(oh):
            for pw in range(ow):
                pts = []
                for iy in range(gh):
                    yy = y1 + ph * bh + (iy + 0.5) * bh / gh
                    for ix in range(gw):
                        xx = x1 + pw * bw + (ix + 0.5) * bw / gw
                        pts.append(_bilinear_taps(yy, xx, H, W))
                cells.append(pts)
                max_taps = max(max_taps, len(pts))
        taps.append(cells)
    S = max_taps
    idx = np.zeros((R, oh * ow, S, 4), dtype=np.int64)
    wt = np.zeros((R, oh * ow, S, 4), dtype=np.float32)
    used = np.zeros((R, oh * ow, S), dtype=bool)
    for r in range(R):
        base = bidx[r] * C * H * W
        for q, pts in enumerate(taps[r]):
            for s, corners in enumerate(pts):
                used[r, q, s] = True
                for k, (p, w) in enumerate(corners):
                    idx[r, q, s, k] = base + p
                    wt[r, q, s, k] = w
    flatX = autograd.reshape(X, [N * C * H * W]) if X.dtype in FLOATS else ops.reshape(X, (-1,))
    # channel c of the ROI's image lives at base + c * H * W
    ch = np.arange(C, dtype=np.int64).reshape(1, C, 1, 1, 1) * (H * W)
    full_idx = host_to_tensor(idx[:, None] + ch, X.device, sdt.int64)  # (R, C, Q, S, 4)
    vals = autograd.gather(flatX, 0, full_idx)
    w = host_to_tensor(wt[:, None], X.device, X.dtype)
    if mode == "avg":
        per_pt = autograd.reduce_sum(autograd.mul(vals, w), [4], 0)  # (R, C, Q, S)
        cnt = np.maximum(used.sum(axis=2), 1).astype(np.float32)[:, None, :]
        y = autograd.div(autograd.reduce_sum(per_pt, [3], 0), host_to_tensor(cnt, X.device, X.dtype))
    else:
        # ONNX's max mode: the largest weighted corner value over the samples of a cell
        wv = ops.mul(vals, w)
        mask = host_to_tensor(np.broadcast_to(used[:, None, :, :, None], wv.shape).copy(), X.device, sdt.bool_)
        wv = ops.where(mask, wv, const_like(wv, -np.inf))
        y = ops.max(wv, (3, 4))
    return autograd.reshape(y, [R, C, oh, ow]) if X.dtype in FLOATS else ops.reshape(y, (R, C, oh, ow))


def _bilinear_taps(y: float, x: float, H: int, W: int) -> list[tuple[int, float]]:
    if y < -1.0 or y > H or x < -1.0 or x > W:
        return [(0, 0.0)] * 4
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = int(y), int(x)
    if y0 >= H - 1:
        y0 = y1 = H - 1
        y = float(y0)
    else:
        y1 = y0 + 1
    if x0 >= W - 1:
        x0 = x1 = W - 1
        x = float(x0)
    else:
        x1 = x0 + 1
    ly, lx = y - y0, x - x0
    hy, hx = 1 - ly, 1 - lx
    return [(y0 * W + x0, hy * hx), (y0 * W + x1, hy * lx), (y1 * W + x0, ly * hx), (y1 * W + x1, ly * lx)]


# -- NonMaxSuppression -------------------------------------------------------------------------------------------------


@register("NonMaxSuppression", static=(2, 3, 4))
def non_max_suppression(node, inputs, opset):
    boxes = host(inputs[0]).astype(np.float64)
    scores = host(inputs[1]).astype(np.float64)
    max_out = int(host(inputs[2]).reshape(-1)[0]) if len(inputs) > 2 and inputs[2] is not None else 0
    iou_thr = float(host(inputs[3]).reshape(-1)[0]) if len(inputs) > 3 and inputs[3] is not None else 0.0
    score_thr = float(host(inputs[4]).reshape(-1)[0]) if len(inputs) > 4 and inputs[4] is not None else None
    center = node.attr("center_point_box", 0)
    if center:
        cx, cy, w, h = (boxes[..., i] for i in range(4))
        corners = np.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], axis=-1)
    else:
        y1, x1, y2, x2 = (boxes[..., i] for i in range(4))
        corners = np.stack([np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)], -1)
    out = []
    for b in range(scores.shape[0]):
        bx = corners[b]
        area = (bx[:, 2] - bx[:, 0]) * (bx[:, 3] - bx[:, 1])
        for c in range(scores.shape[1]):
            s = scores[b, c]
            cand = [i for i in np.argsort(-s, kind="stable") if score_thr is None or s[i] > score_thr]
            kept: list[int] = []
            for i in cand:
                if max_out and len(kept) >= max_out:
                    break
                ok = True
                for j in kept:
                    ih = max(0.0, min(bx[i, 2], bx[j, 2]) - max(bx[i, 0], bx[j, 0]))
                    iw = max(0.0, min(bx[i, 3], bx[j, 3]) - max(bx[i, 1], bx[j, 1]))
                    inter = ih * iw
                    union = area[i] + area[j] - inter
                    if union > 0 and inter / union > iou_thr:
                        ok = False
                        break
                if ok:
                    kept.append(int(i))
            out.extend([b, c, i] for i in kept)
    return host_to_tensor(np.asarray(out, dtype=np.int64).reshape(-1, 3), node.rt.device)


# -- DeformConv -------------------------------------------------------------------------------------------------------


@register("DeformConv")
def deform_conv(node, inputs, opset):
    X, W, offset = inputs_as_tensors(node, inputs[:3])
    B = inputs[3] if len(inputs) > 3 else None
    mask = inputs[4] if len(inputs) > 4 else None
    N, C, H, Wd = X.shape
    K, Cg, kh, kw = W.shape
    group = node.attr("group", 1)
    ogroups = node.attr("offset_group", 1)
    sh, sw = node.attr("strides") or [1, 1]
    dh, dw = node.attr("dilations") or [1, 1]
    pt, pl, pb, pr = node.attr("pads") or [0, 0, 0, 0]
    oh = (H + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (Wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    Q = oh * ow
    # sampling positions of every (offset group, tap, output pixel)
    off = ops.reshape(ops.contiguous(offset), (N, ogroups, kh * kw, 2, Q))
    oy = np.arange(oh) * sh - pt
    ox = np.arange(ow) * sw - pl
    ky, kx = np.meshgrid(np.arange(kh) * dh, np.arange(kw) * dw, indexing="ij")
    base_y = np.broadcast_to((ky.reshape(-1, 1) + np.repeat(oy, ow).reshape(1, -1)), (kh * kw, Q))
    base_x = np.broadcast_to((kx.reshape(-1, 1) + np.tile(ox, oh).reshape(1, -1)), (kh * kw, Q))
    py = ops.add(ops.getitem(off, (slice(None), slice(None), slice(None), 0)),
                 host_to_tensor(base_y.astype(np.float32), X.device, X.dtype))
    px = ops.add(ops.getitem(off, (slice(None), slice(None), slice(None), 1)),
                 host_to_tensor(base_x.astype(np.float32), X.device, X.dtype))  # (N, G, T, Q)
    cpg = C // ogroups
    flat = ops.reshape(X, (N, ogroups, cpg, H * Wd))
    y0, x0 = ops.floor(py), ops.floor(px)
    ly, lx = ops.sub(py, y0), ops.sub(px, x0)
    T = kh * kw
    cols = None
    for dy, dx in ((0, 0), (0, 1), (1, 0), (1, 1)):
        yy, xx = ops.add(y0, _f(y0, float(dy))), ops.add(x0, _f(x0, float(dx)))
        ok = ops.logical_and(ops.logical_and(ops.ge(yy, _f(yy, 0.0)), ops.le(yy, _f(yy, H - 1.0))),
                             ops.logical_and(ops.ge(xx, _f(xx, 0.0)), ops.le(xx, _f(xx, Wd - 1.0))))
        wy = ly if dy else ops.sub(_f(ly, 1.0), ly)
        wx = lx if dx else ops.sub(_f(lx, 1.0), lx)
        w = ops.mul(ops.mul(wy, wx), ops.cast(ok, X.dtype))
        lin = ops.add(ops.mul(ops.cast(ops.clip(yy, 0.0, H - 1.0), sdt.int64), ops.full((), Wd, sdt.int64, X.device)),
                      ops.cast(ops.clip(xx, 0.0, Wd - 1.0), sdt.int64))  # (N, G, T, Q)
        idx = ops.copy(ops.broadcast_to(ops.reshape(lin, (N, ogroups, 1, T * Q)), (N, ogroups, cpg, T * Q)))
        v = gather_elements(flat, idx, 3)  # (N, G, cpg, T*Q)
        term = ops.mul(v, ops.reshape(w, (N, ogroups, 1, T * Q)))
        cols = term if cols is None else ops.add(cols, term)
    if mask is not None:
        m = ops.reshape(tensor(node, mask, X.dtype, slot=4), (N, ogroups, 1, T * Q))
        cols = ops.mul(cols, m)
    cols = ops.reshape(cols, (N, C, T, Q))  # channel-major, like im2col
    cols = ops.reshape(cols, (N, group, (C // group) * T, Q))
    Wg = ops.reshape(W, (group, K // group, Cg * T))
    y = ops.matmul(ops.unsqueeze(Wg, 0), cols)  # (N, group, K/g, Q)
    y = ops.reshape(y, (N, K, oh, ow))
    if B is not None:
        y = ops.add(y, ops.reshape(tensor(node, B, X.dtype, slot=3), (1, K, 1, 1)))
    return y


# -- transformer helpers --------------------------------------------------------------------------------------------


@register("RotaryEmbedding")
def rotary_embedding(node, inputs, opset):
    x, cos, sin = inputs_as_tensors(node, inputs[:3])
    pos = inputs[3] if len(inputs) > 3 else None
    interleaved = node.attr("interleaved", 0)
    shape = list(x.shape)
    if len(shape) == 4:
        x = autograd.transpose(x, [0, 2, 1, 3])  # (B, S, heads, D)
    else:
        heads = node.attr("num_heads")
        x = autograd.reshape(x, [shape[0], shape[1], heads, shape[2] // heads])
    D = x.shape[3]
    rd = node.attr("rotary_embedding_dim", 0) or D
    if pos is not None:
        idx = tensor(node, pos, sdt.int64, slot=3)
        cos, sin = autograd.gather(cos, 0, idx), autograd.gather(sin, 0, idx)
    cos, sin = autograd.unsqueeze(cos, [2]), autograd.unsqueeze(sin, [2])
    rot = autograd.slice(x, [0], [rd], [3])
    if interleaved:
        x1 = autograd.slice(rot, [0], [rd], [3], [2])
        x2 = autograd.slice(rot, [1], [rd], [3], [2])
    else:
        x1 = autograd.slice(rot, [0], [rd // 2], [3])
        x2 = autograd.slice(rot, [rd // 2], [rd], [3])
    real = autograd.sub(autograd.mul(cos, x1), autograd.mul(sin, x2))
    imag = autograd.add(autograd.mul(sin, x1), autograd.mul(cos, x2))
    if interleaved:
        rot = autograd.reshape(autograd.cat([autograd.unsqueeze(real, [4]), autograd.unsqueeze(imag, [4])], 4),
                               list(rot.shape))
    else:
        rot = autograd.cat([real, imag], 3)
    y = autograd.cat([rot, autograd.slice(x, [rd], [D], [3])], 3) if rd < D else rot
    if len(shape) == 4:
        return autograd.transpose(y, [0, 2, 1, 3])
    return autograd.reshape(y, shape)


@register("CausalConvWithState")
def causal_conv_with_state(node, inputs, opset):
    x, w = inputs_as_tensors(node, inputs[:2])
    b = inputs[2] if len(inputs) > 2 else None
    past = inputs[3] if len(inputs) > 3 else None
    N, C, L = x.shape
    k = w.shape[2]
    if past is None:
        pad = ops.full((N, C, k - 1), 0, x.dtype, x.device)
    else:
        pad = tensor(node, past, x.dtype, slot=3)
    padded = autograd.cat([pad, x], 2) if k > 1 else x
    from singa_onnx.ops.nn import conv_nd

    bias = tensor(node, b, x.dtype, slot=2) if b is not None else None
    y = conv_nd(padded, w, bias, [1], [0, 0], [1], C)
    if node.attr("activation", "none") in ("silu", "swish"):
        y = autograd.mul(y, autograd.sigmoid(y))
    T = padded.shape[2]
    state = autograd.slice(padded, [T - (k - 1)], [T], [2]) if k > 1 else ops.full((N, C, 0), 0, x.dtype, x.device)
    return y, state
