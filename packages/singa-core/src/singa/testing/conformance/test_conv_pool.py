"""conv2d and its two backward kernels, pool2d and its backward.

References are direct summations over output positions and kernel taps in float64, written from the definitions in
singa.primitives. The backward kernels are also checked against the forward through the adjoint identities
<conv(x, w), dy> = <x, conv_backward_data(dy, w)> = <w, conv_backward_weight(dy, x)> and by finite differences.
"""

from __future__ import annotations

import numpy as np
import pytest

from singa import dtypes
from singa.backend import View
from singa.testing import helpers as H
from singa.testing.conformance.references import (
    conv_backward_data_ref,
    conv_backward_weight_ref,
    conv_out_hw,
    conv_ref,
    pool_backward_ref,
    pool_out_hw,
    pool_ref,
)

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")

COVERS = {"conv2d", "conv2d_fused", "conv2d_backward_data", "conv2d_backward_weight", "pool2d", "pool2d_backward"}

F32 = dtypes.float32


# (N, C, H, W), (K, kh, kw), stride, padding (top, left, bottom, right), dilation, groups, bias
CONV_CASES = [
    ((2, 3, 7, 7), (4, 3, 3), (1, 1), (0, 0, 0, 0), (1, 1), 1, True),
    ((2, 3, 6, 7), (5, 3, 3), (2, 1), (1, 0, 2, 1), (1, 1), 1, False),  # asymmetric padding, uneven stride
    ((1, 2, 9, 8), (3, 3, 2), (1, 2), (2, 2, 2, 2), (2, 3), 1, True),  # dilation
    ((2, 4, 7, 6), (6, 3, 2), (2, 2), (1, 1, 0, 0), (1, 1), 2, True),  # groups
    ((2, 3, 5, 5), (6, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 3, False),  # depthwise, multiplier 2
    ((3, 4, 6, 5), (2, 1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1, True),  # 1x1
    ((1, 2, 3, 3), (2, 5, 5), (1, 1), (2, 2, 2, 2), (1, 1), 1, True),  # kernel larger than the input
    ((2, 2, 8, 8), (3, 2, 2), (3, 3), (0, 1, 1, 0), (1, 1), 1, False),  # stride > kernel: untouched inputs
]

# Depthwise: one input channel per group (the CPU backend's direct kernels), channel multiplier K / groups 1 to 3.
DEPTHWISE_CASES = [
    ((1, 4, 9, 9), (4, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 4, True),  # batch 1
    ((5, 3, 10, 9), (6, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 3, False),  # batch 5, multiplier 2, stride 2
    ((2, 4, 11, 12), (4, 5, 5), (1, 1), (2, 2, 2, 2), (1, 1), 4, True),  # 5x5
    ((5, 2, 12, 11), (4, 5, 5), (2, 2), (2, 1, 2, 3), (1, 1), 2, True),  # 5x5, stride 2, asymmetric padding
    ((1, 3, 10, 11), (3, 3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 3, False),  # dilation 2
    ((2, 4, 9, 13), (8, 3, 5), (2, 1), (0, 2, 1, 1), (1, 2), 4, True),  # 3x5, uneven stride and dilation
    ((2, 3, 7, 8), (9, 2, 1), (1, 3), (1, 0, 0, 2), (2, 1), 3, False),  # 2x1, multiplier 3, stride 3 > kernel
    ((3, 2, 6, 5), (2, 1, 1), (2, 2), (0, 0, 1, 1), (1, 1), 2, True),  # 1x1
    ((1, 2, 3, 3), (2, 5, 5), (1, 1), (2, 2, 2, 2), (1, 1), 2, False),  # kernel larger than the input
    ((2, 3, 30, 37), (3, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 3, True),  # planes longer than a few vectors
    ((1, 2, 33, 30), (4, 3, 3), (2, 2), (1, 0, 1, 1), (1, 1), 2, False),  # the same at stride 2
]


def _conv_id(case):
    (n, c, h, w), (k, kh, kw), s, p, d, g, b = case
    pads = "".join(map(str, p))
    return f"x{n}x{c}x{h}x{w}-w{k}x{kh}x{kw}-s{s[0]}{s[1]}-p{pads}-d{d[0]}{d[1]}-g{g}-{'b' if b else 'nob'}"


def _conv_setup(case, dtype, gen):
    (N, C, H_, W), (K, kh, kw), stride, padding, dilation, groups, bias = case
    oh, ow = conv_out_hw(H_, W, kh, kw, stride, padding, dilation)
    x = H.draw(gen, (N, C, H_, W), dtype, -2, 2)
    w = H.draw(gen, (K, C // groups, kh, kw), dtype, -1, 1)
    b = H.draw(gen, (K,), dtype, -1, 1) if bias else None
    params = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    return x, w, b, oh, ow, params


def _conv(device, x, w, b, oh, ow, params, dtype, offset=False):
    out = H.empty(device, (x.shape[0], w.shape[0], oh, ow), dtype)
    bv = None if b is None else H.upload(device, b)
    # size-1 axes of w (depthwise: C/groups == 1) get a meaningless stride: the view is still contiguous
    device.table["conv2d"](out, H.upload(device, x, offset=5 if offset else 0), H.unit_axis_strides(device, w), bv,
                           **params)
    return H.download(device, out)


@pytest.mark.parametrize("dtype", H.FLOAT_DTYPES, ids=dtypes.name)
@pytest.mark.parametrize("case", CONV_CASES + DEPTHWISE_CASES, ids=_conv_id)
def test_conv2d(device, case, dtype):
    H.require(device, dtype)
    gen = H.rng("conv", case, dtype)
    x, w, b, oh, ow, params = _conv_setup(case, dtype, gen)
    want = conv_ref(x, w, b, oh, ow, **params)
    scale = conv_ref(np.abs(x), np.abs(w), None if b is None else np.abs(b), oh, ow, **params)
    got = _conv(device, x, w, b, oh, ow, params, dtype, offset=True)
    H.assert_close(got, want, dtype, scale=scale, what=f"conv2d {_conv_id(case)}")


@pytest.mark.parametrize("dtype", H.FLOAT_DTYPES, ids=dtypes.name)
@pytest.mark.parametrize("post", [("residual", "relu"), ("residual", "none"), (None, "relu"), (None, "none")],
                         ids=lambda p: f"{p[0] or 'no-residual'}-{p[1]}")
@pytest.mark.parametrize("case", CONV_CASES + DEPTHWISE_CASES[:3], ids=_conv_id)
def test_conv2d_fused(device, case, post, dtype):
    # relu(conv2d + residual), built by the core from conv2d, add and relu where the backend does not fuse them
    H.require(device, dtype)
    gen = H.rng("conv_fused", case, post, dtype)
    x, w, b, oh, ow, params = _conv_setup(case, dtype, gen)
    shape = (x.shape[0], w.shape[0], oh, ow)
    r = H.draw(gen, shape, dtype, -3, 3) if post[0] else None
    want = conv_ref(x, w, b, oh, ow, **params) + (0 if r is None else r.astype(np.float64))
    scale = conv_ref(np.abs(x), np.abs(w), None if b is None else np.abs(b), oh, ow, **params)
    scale = scale + (0 if r is None else np.abs(r.astype(np.float64)))
    if post[1] == "relu":
        want = np.maximum(want, 0)
    out = H.empty(device, shape, dtype)
    device.table["conv2d_fused"](out, H.upload(device, x, offset=3), H.unit_axis_strides(device, w),
                                 None if b is None else H.upload(device, b),
                                 None if r is None else H.upload(device, r, offset=2), activation=post[1], **params)
    H.assert_close(H.download(device, out), want, dtype, scale=scale, what=f"conv2d_fused {_conv_id(case)} {post}")


def test_conv2d_fused_refuses_what_it_cannot_do(device):
    gen = H.rng("conv_fused_errors")
    x, w, b, oh, ow, params = _conv_setup(CONV_CASES[0], F32, gen)
    shape = (x.shape[0], w.shape[0], oh, ow)
    out = H.empty(device, shape, F32)
    xv, wv = H.upload(device, x), H.upload(device, w)
    with pytest.raises(ValueError, match="activation"):
        device.table["conv2d_fused"](out, xv, wv, None, None, activation="gelu", **params)
    with pytest.raises(ValueError, match="residual"):  # another shape
        device.table["conv2d_fused"](out, xv, wv, None, H.upload(device, np.zeros((1,) + shape[1:], np.float32)),
                                     activation="relu", **params)
    n = int(np.prod(shape))
    wide = H.empty(device, (2 * n,), F32)
    shifted = (View(wide.buffer, F32, shape, offset=0), View(wide.buffer, F32, shape, offset=n // 2))
    with pytest.raises(ValueError, match="overlap"):  # part of the output
        device.table["conv2d_fused"](shifted[1], xv, wv, None, shifted[0], activation="relu", **params)
    if "conv2d_fused" in type(device).shares_output_with:
        return  # the output itself is allowed: test_conv2d_fused_over_its_residual
    with pytest.raises(ValueError, match="overlap"):  # the output itself
        device.table["conv2d_fused"](out, xv, wv, None, out, activation="relu", **params)


@pytest.mark.parametrize("case", CONV_CASES[:3], ids=_conv_id)
def test_conv2d_fused_over_its_residual(device, case):
    # Device.shares_output_with: the residual given as the output's very view is added where it lies
    if "conv2d_fused" not in type(device).shares_output_with:
        pytest.skip("the device keeps conv2d_fused's output apart from its inputs (refusal tested above)")
    assert type(device).shares_output_with["conv2d_fused"] == "residual"
    gen = H.rng("conv_fused_shared", case)
    x, w, b, oh, ow, params = _conv_setup(case, F32, gen)
    shape = (x.shape[0], w.shape[0], oh, ow)
    r = H.draw(gen, shape, F32, -3, 3)
    want = np.maximum(conv_ref(x, w, b, oh, ow, **params) + r.astype(np.float64), 0)
    scale = conv_ref(np.abs(x), np.abs(w), None if b is None else np.abs(b), oh, ow, **params) + np.abs(r)
    out = H.upload(device, r, offset=2)
    device.table["conv2d_fused"](out, H.upload(device, x), H.upload(device, w),
                                 None if b is None else H.upload(device, b), out, activation="relu", **params)
    H.assert_close(H.download(device, out), want, F32, scale=scale, what=f"conv2d_fused over its residual {case}")


@pytest.mark.parametrize("dtype", H.FLOAT_DTYPES, ids=dtypes.name)
@pytest.mark.parametrize("case", CONV_CASES + DEPTHWISE_CASES, ids=_conv_id)
def test_conv2d_backward(device, case, dtype):
    H.require(device, dtype)
    gen = H.rng("conv-bwd", case, dtype)
    x, w, _, oh, ow, params = _conv_setup(case, dtype, gen)
    dy = H.draw(gen, (x.shape[0], w.shape[0], oh, ow), dtype, -1, 1)

    dx = H.empty(device, x.shape, dtype)
    device.table["conv2d_backward_data"](dx, H.upload(device, dy, offset=2), H.unit_axis_strides(device, w), **params)
    dx = H.download(device, dx)
    dw = H.empty(device, w.shape, dtype)
    device.table["conv2d_backward_weight"](dw, H.upload(device, dy), H.upload(device, x, offset=2), **params)
    dw = H.download(device, dw)

    ady, aw, ax = np.abs(dy), np.abs(w), np.abs(x)
    H.assert_close(dx, conv_backward_data_ref(dy, w, x.shape, **params), dtype,
                   scale=conv_backward_data_ref(ady, aw, x.shape, **params),
                   what=f"conv2d_backward_data {_conv_id(case)}")
    H.assert_close(dw, conv_backward_weight_ref(dy, x, w.shape, **params), dtype,
                   scale=conv_backward_weight_ref(ady, ax, w.shape, **params),
                   what=f"conv2d_backward_weight {_conv_id(case)}")

    # Adjoint identities, against the device's own forward: the three inner products are one number.
    y = _conv(device, x, w, None, oh, ow, params, dtype)
    lhs = np.sum(y.astype(np.float64) * dy)
    mag = np.sum(conv_ref(ax, aw, None, oh, ow, **params) * ady)
    rtol, atol = H.tolerance(dtype)[0] * 10, min(1e-6, H.tolerance(dtype)[1])
    for name, rhs in (("<x, backward_data(dy)>", np.sum(x.astype(np.float64) * dx)),
                      ("<w, backward_weight(dy)>", np.sum(w.astype(np.float64) * dw))):
        assert abs(lhs - rhs) <= rtol * mag + atol, f"<conv(x, w), dy> = {lhs} but {name} = {rhs} ({_conv_id(case)})"


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64], ids=dtypes.name)
@pytest.mark.parametrize("stride", [1, 2])
def test_conv2d_depthwise_non_finite(device, stride, dtype):
    """An infinity or a NaN in x or dy reaches exactly the outputs and gradients whose sums take it in."""
    H.require(device, dtype)
    case = ((2, 3, 9, 10), (6, 3, 3), (stride, stride), (1, 1, 1, 1), (1, 1), 3, False)
    gen = H.rng("conv-dw-nonfinite", stride, dtype)
    x, w, _, oh, ow, params = _conv_setup(case, dtype, gen)
    dy = H.draw(gen, (2, 6, oh, ow), dtype, -1, 1)
    x[0, 1, 4, 9] = np.inf  # the last column: read by the right edge of the windows only
    x[1, 2, 0, 3] = -np.inf
    x[1, 0, 8, 0] = np.nan
    dy[0, 4, 2, 3] = np.inf  # an output whose window lies inside x (padding is zeros: inf * 0 is left open)
    got = _conv(device, x, w, None, oh, ow, params, dtype)
    with np.errstate(invalid="ignore"):
        H.assert_close(got, conv_ref(x, w, None, oh, ow, **params), dtype,
                       scale=conv_ref(np.abs(x), np.abs(w), None, oh, ow, **params), what="conv2d, non-finite x")
        dx = H.empty(device, x.shape, dtype)
        device.table["conv2d_backward_data"](dx, H.upload(device, dy), H.upload(device, w), **params)
        H.assert_close(H.download(device, dx), conv_backward_data_ref(dy, w, x.shape, **params), dtype,
                       scale=conv_backward_data_ref(np.abs(dy), np.abs(w), x.shape, **params),
                       what="conv2d_backward_data, non-finite dy")
        dw = H.empty(device, w.shape, dtype)
        device.table["conv2d_backward_weight"](dw, H.upload(device, dy), H.upload(device, x), **params)
        H.assert_close(H.download(device, dw), conv_backward_weight_ref(dy, x, w.shape, **params), dtype,
                       scale=conv_backward_weight_ref(np.abs(dy), np.abs(x), w.shape, **params),
                       what="conv2d_backward_weight, non-finite x and dy")


def test_conv2d_backward_finite_differences(device):
    case = ((1, 2, 4, 5), (3, 2, 2), (2, 1), (1, 0, 0, 1), (1, 2), 1, False)
    gen = H.rng("conv-fd")
    x, w, _, oh, ow, params = _conv_setup(case, F32, gen)
    dy = H.draw(gen, (1, 3, oh, ow), F32, -1, 1).astype(np.float64)

    def loss(xx, ww):
        return float(np.sum(_conv(device, xx.astype(np.float32), ww.astype(np.float32), None, oh, ow, params, F32)
                            * dy))

    dx = H.empty(device, x.shape, F32)
    device.table["conv2d_backward_data"](dx, H.upload(device, dy.astype(np.float32)), H.upload(device, w), **params)
    dw = H.empty(device, w.shape, F32)
    device.table["conv2d_backward_weight"](dw, H.upload(device, dy.astype(np.float32)), H.upload(device, x), **params)
    eps = 0.25  # the loss is linear in x and in w: the central difference is exact up to rounding
    for arr, grad, name in ((x, H.download(device, dx), "x"), (w, H.download(device, dw), "w")):
        num = np.zeros(arr.shape)
        for idx in np.ndindex(arr.shape):
            hi, lo = arr.astype(np.float64), arr.astype(np.float64)
            hi[idx] += eps
            lo[idx] -= eps
            num[idx] = (loss(hi, w) - loss(lo, w)) / (2 * eps) if name == "x" else \
                (loss(x, hi) - loss(x, lo)) / (2 * eps)
        H.assert_close(grad, num, F32, rtol=1e-4, atol=1e-4,
                       what=f"conv2d gradient w.r.t. {name} vs finite differences")


def test_conv2d_empty_batch(device):
    x = np.zeros((0, 2, 5, 5), np.float32)
    w = H.draw(H.rng("conv-empty"), (3, 2, 3, 3), F32)
    params = {"stride": (1, 1), "padding": (1, 1, 1, 1), "dilation": (1, 1), "groups": 1}
    assert _conv(device, x, w, None, 5, 5, params, F32).shape == (0, 3, 5, 5)
    dw = H.empty(device, w.shape, F32)
    device.table["conv2d_backward_weight"](dw, H.upload(device, np.zeros((0, 3, 5, 5), np.float32)),
                                           H.upload(device, x), **params)
    H.assert_close(H.download(device, dw), np.zeros(w.shape), F32, what="conv2d_backward_weight of an empty batch")


# -- pooling ----------------------------------------------------------------------------------------------------------


# (N, C, H, W), kernel, stride, padding, dilation, ceil mode
POOL_CASES = [
    ((2, 3, 6, 6), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), False),
    ((2, 2, 7, 7), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False),
    ((1, 3, 8, 10), (3, 2), (2, 3), (0, 0, 0, 0), (1, 1), True),  # ceil: last windows run past the input
    ((2, 2, 10, 9), (3, 3), (2, 2), (1, 0, 1, 1), (1, 1), True),  # asymmetric padding + ceil
    ((1, 2, 9, 10), (2, 3), (1, 2), (1, 1, 1, 1), (2, 2), True),  # dilation + ceil
    ((2, 2, 5, 5), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), False),  # overlapping windows
    ((1, 1, 4, 4), (1, 1), (1, 1), (1, 1, 1, 1), (1, 1), False),  # windows entirely in the padding
]


def _pool_id(case):
    (n, c, h, w), k, s, p, d, ceil = case
    pads = "".join(map(str, p))
    return f"x{n}x{c}x{h}x{w}-k{k[0]}{k[1]}-s{s[0]}{s[1]}-p{pads}-d{d[0]}{d[1]}{'-ceil' if ceil else ''}"


def _pool_setup(case, dtype, gen):
    shape, kernel, stride, padding, dilation, ceil = case
    oh, ow = pool_out_hw(shape[2], shape[3], kernel, stride, padding, dilation, ceil)
    # distinct values, so the max of every window is unique and the indices well defined
    x = (gen.permutation(int(np.prod(shape))).reshape(shape) * 0.25 - 3).astype(H.np_dtype(dtype))
    if dtype == dtypes.float16:
        x = (gen.permutation(int(np.prod(shape))).reshape(shape) * 0.125 - 30).astype(np.float16)  # exact, < 512
    return x, (oh, ow), {"kernel": kernel, "stride": stride, "padding": padding, "dilation": dilation}


def _pool(device, x, ohw, params, mode, cip, dtype, with_indices):
    out = H.empty(device, x.shape[:2] + ohw, dtype)
    ind = H.empty(device, x.shape[:2] + ohw, dtypes.int64) if with_indices else None
    device.table["pool2d"](out, ind, H.upload(device, x, offset=3), mode=mode, count_include_pad=cip, **params)
    return H.download(device, out), (H.download(device, ind) if with_indices else None)


@pytest.mark.parametrize("dtype", H.FLOAT_DTYPES, ids=dtypes.name)
@pytest.mark.parametrize("case", POOL_CASES, ids=_pool_id)
def test_pool2d_max(device, case, dtype):
    H.require(device, dtype)
    x, ohw, params = _pool_setup(case, dtype, H.rng("maxpool", case, dtype))
    want, want_idx = pool_ref(x, *ohw, mode="max", count_include_pad=False, **params)
    for with_indices in (True, False):
        got, idx = _pool(device, x, ohw, params, "max", False, dtype, with_indices)
        H.assert_close(got, want, dtype, what=f"pool2d max {_pool_id(case)} (empty windows give 0)")
        if with_indices:
            H.assert_close(idx, want_idx, dtypes.int64, what=f"pool2d max indices {_pool_id(case)} (empty windows -1)")
    # backward, with the forward's indices and without them
    dy = H.draw(H.rng("maxpool-dy", case), x.shape[:2] + ohw, dtype, -1, 1)
    want_dx = pool_backward_ref(dy, x.shape, want_idx, mode="max", count_include_pad=False, **params)
    for with_indices in (True, False):
        dx = H.empty(device, x.shape, dtype)
        iv = H.upload(device, want_idx) if with_indices else None
        device.table["pool2d_backward"](dx, H.upload(device, dy), H.upload(device, x), iv, mode="max",
                                        count_include_pad=False, **params)
        H.assert_close(H.download(device, dx), want_dx, dtype, scale=pool_backward_ref(
            np.abs(dy), x.shape, want_idx, mode="max", count_include_pad=False, **params),
            what=f"pool2d_backward max {_pool_id(case)} indices={'given' if with_indices else 'None'}")


@pytest.mark.parametrize("cip", [True, False], ids=["count_include_pad", "exclude_pad"])
@pytest.mark.parametrize("dtype", H.FLOAT_DTYPES, ids=dtypes.name)
@pytest.mark.parametrize("case", POOL_CASES, ids=_pool_id)
def test_pool2d_avg(device, case, dtype, cip):
    if not cip and case[1] == (1, 1) and any(case[3]):
        pytest.skip("an avg window with no element inside the input and no padding counted: the contract leaves "
                    "0/0 open")
    H.require(device, dtype)
    x, ohw, params = _pool_setup(case, dtype, H.rng("avgpool", case, dtype))
    want, _ = pool_ref(x, *ohw, mode="avg", count_include_pad=cip, **params)
    got, _ = _pool(device, x, ohw, params, "avg", cip, dtype, False)
    scale, _ = pool_ref(np.abs(x), *ohw, mode="avg", count_include_pad=cip, **params)
    H.assert_close(got, want, dtype, scale=scale, what=f"pool2d avg {_pool_id(case)} count_include_pad={cip}")

    dy = H.draw(H.rng("avgpool-dy", case), x.shape[:2] + ohw, dtype, -1, 1)
    dx = H.empty(device, x.shape, dtype)
    device.table["pool2d_backward"](dx, H.upload(device, dy), H.upload(device, x), None, mode="avg",
                                    count_include_pad=cip, **params)
    dx = H.download(device, dx)
    H.assert_close(dx, pool_backward_ref(dy, x.shape, None, mode="avg", count_include_pad=cip, **params), dtype,
                   scale=pool_backward_ref(np.abs(dy), x.shape, None, mode="avg", count_include_pad=cip, **params),
                   what=f"pool2d_backward avg {_pool_id(case)} count_include_pad={cip}")
    # avg pooling is linear: <pool(x), dy> = <x, pool_backward(dy)>
    lhs, rhs = np.sum(got.astype(np.float64) * dy), np.sum(x.astype(np.float64) * dx)
    mag = np.sum(scale * np.abs(dy))
    atol = min(1e-6, H.tolerance(dtype)[1])
    assert abs(lhs - rhs) <= 10 * H.tolerance(dtype)[0] * mag + atol, f"adjoint identity: {lhs} != {rhs}"


@pytest.mark.parametrize("mode", ["max", "avg"])
def test_pool2d_backward_finite_differences(device, mode):
    case = ((1, 2, 6, 5), (3, 2), (2, 2), (1, 0, 1, 1), (1, 1), True)
    x, ohw, params = _pool_setup(case, F32, H.rng("pool-fd", mode))
    dy = H.draw(H.rng("pool-fd-dy", mode), (1, 2) + ohw, F32, -1, 1).astype(np.float64)

    def loss(xx):
        return float(np.sum(_pool(device, xx.astype(np.float32), ohw, params, mode, True, F32, False)[0] * dy))

    dx = H.empty(device, x.shape, F32)
    device.table["pool2d_backward"](dx, H.upload(device, dy.astype(np.float32)), H.upload(device, x), None,
                                    mode=mode, count_include_pad=True, **params)
    eps = 0.03125  # values are 0.25 apart: a perturbation this small never changes a window's winner
    num = np.zeros(x.shape)
    for idx in np.ndindex(x.shape):
        hi, lo = x.astype(np.float64), x.astype(np.float64)
        hi[idx] += eps
        lo[idx] -= eps
        num[idx] = (loss(hi) - loss(lo)) / (2 * eps)
    H.assert_close(H.download(device, dx), num, F32, rtol=1e-3, atol=1e-3,
                   what=f"pool2d_backward {mode} vs finite differences")
