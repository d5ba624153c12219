"""Batch normalisation, layer normalisation, softmax / log-softmax and softmax cross-entropy, forward and backward.

Gradients are checked twice: against the closed forms in float64, and against central finite differences of a
float64 reference forward written here, so a wrong closed form in both the kernel and this file cannot agree.
float32 results are held to the bounds written below for each check; float64 results to the suite's own bounds
(helpers.FLOAT_TOL) against the closed forms, and to what central differences can resolve (FD_TOL_F64) against them.
"""

from __future__ import annotations

import numpy as np
import pytest

from singa import dtypes
from singa.testing import helpers as H
from singa.testing.conformance.references import (
    bn_axes,
    bn_backward_ref,
    bn_forward,
    log_softmax_ref,
    numeric_grad,
    onehot,
    per_channel,
    sce_ref,
    softmax_ref,
)

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")

COVERS = {"batchnorm_train", "batchnorm_infer", "batchnorm_apply", "batchnorm_backward", "layer_norm", "softmax",
          "log_softmax", "softmax_backward", "log_softmax_backward", "softmax_cross_entropy",
          "softmax_cross_entropy_backward"}

F32 = dtypes.float32
DTYPES = (F32, dtypes.float64)  # batch norm, softmax gradients and the loss (softmax itself: every float dtype)
FD_TOL_F64 = {"rtol": 1e-6, "atol": 1e-7}  # central differences with eps 1e-6: about 1e-9 of rounding


def _tol(dtype, rtol, atol=None) -> dict:
    """A bound written for float32 results; float64 results keep the suite's (helpers.FLOAT_TOL)."""
    if dtype != F32:
        return {}
    return {"rtol": rtol} if atol is None else {"rtol": rtol, "atol": atol}


def _fd_tol(dtype, rtol, atol) -> dict:
    """The bound of a comparison with central differences: float32's as written, float64's FD_TOL_F64."""
    return {"rtol": rtol, "atol": atol} if dtype == F32 else FD_TOL_F64


# -- batch normalisation ----------------------------------------------------------------------------------------------


BN_SHAPES = [(4, 3, 5, 6), (8, 5), (2, 3, 1, 1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtypes.name)
@pytest.mark.parametrize("shape", BN_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_batchnorm_train(device, shape, dtype):
    H.require(device, dtype)
    gen = H.rng("bn-train", shape)
    C = shape[1]
    x = (gen.normal(1.5, 2.0, shape)).astype(H.np_dtype(dtype))
    scale, bias = H.draw(gen, (C,), dtype, 0.5, 2), H.draw(gen, (C,), dtype, -1, 1)
    rm0, rv0 = H.draw(gen, (C,), dtype, -1, 1), H.draw(gen, (C,), dtype, 0.5, 2)
    momentum, eps = 0.9, 1e-5
    y, rm, rv, sm, si = (H.empty(device, s, dtype) for s in (shape, (C,), (C,), (C,), (C,)))
    device.write(rm, rm0)
    device.write(rv, rv0)
    device.table["batchnorm_train"](y, rm, rv, sm, si, H.upload(device, x, offset=2), H.upload(device, scale),
                                    H.upload(device, bias), momentum=momentum, eps=eps)
    want_y, mean, var, invstd = bn_forward(x.astype(np.float64), scale, bias, eps)
    m = x.size // C
    H.assert_close(H.download(device, y), want_y, dtype, **_tol(dtype, 1e-4, 1e-5), what="batchnorm_train y")
    H.assert_close(H.download(device, sm), mean, dtype, scale=np.abs(x).mean(axis=bn_axes(x)), what="saved_mean")
    H.assert_close(H.download(device, si), invstd, dtype, **_tol(dtype, 1e-4),
                   what="saved_invstd = 1/sqrt(biased var + eps)")
    H.assert_close(H.download(device, rm), momentum * rm0 + (1 - momentum) * mean, dtype, **_tol(dtype, 1e-4, 1e-5),
                   what="running_mean = momentum * running_mean + (1 - momentum) * mean")
    H.assert_close(H.download(device, rv), momentum * rv0 + (1 - momentum) * var * m / max(m - 1, 1), dtype,
                   **_tol(dtype, 1e-4, 1e-5), what="running_var (unbiased batch variance)")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtypes.name)
@pytest.mark.parametrize("shape", BN_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_batchnorm_infer(device, shape, dtype):
    H.require(device, dtype)
    gen = H.rng("bn-infer", shape)
    C = shape[1]
    x = H.draw(gen, shape, dtype)
    scale, bias = H.draw(gen, (C,), dtype, 0.5, 2), H.draw(gen, (C,), dtype, -1, 1)
    mean, var = H.draw(gen, (C,), dtype, -1, 1), H.draw(gen, (C,), dtype, 0.1, 3)
    eps = 1e-3
    y = H.empty(device, shape, dtype)
    device.table["batchnorm_infer"](y, H.upload(device, x, offset=1), H.upload(device, scale), H.upload(device, bias),
                                    H.upload(device, mean), H.upload(device, var), eps=eps)
    mean_, var_, scale_, bias_ = (per_channel(v, x) for v in (mean, var, scale, bias))
    want = (x.astype(np.float64) - mean_) / np.sqrt(var_ + eps) * scale_ + bias_
    H.assert_close(H.download(device, y), want, dtype, **_tol(dtype, 1e-5, 1e-5), what="batchnorm_infer")


@pytest.mark.parametrize("activation", ["none", "relu"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtypes.name)
@pytest.mark.parametrize("shape", BN_SHAPES + [(16, 64, 9, 9)], ids=lambda s: "x".join(map(str, s)))
def test_batchnorm_apply(device, shape, dtype, activation):
    """batchnorm_train's affine map again from its saved statistics: close to the float64 formula everywhere, and
    equal to batchnorm_train's y (relu'd by the relu kernel) bit for bit where the backend has its own kernel (graph
    mode recomputes training activations with it there). A mean far from zero (x around 40) and a NaN input, which
    must stay NaN through the ReLU."""
    H.require(device, dtype)
    gen = H.rng("bn-apply", shape)
    C = shape[1]
    x = gen.normal(40.0, 3.0, shape).astype(H.np_dtype(dtype))
    x.flat[x.size // 2] = np.nan
    scale, bias = H.draw(gen, (C,), dtype, -2, 2), H.draw(gen, (C,), dtype, -1, 1)
    y, rm, rv, sm, si = (H.empty(device, s, dtype) for s in (shape, (C,), (C,), (C,), (C,)))
    device.write(rm, np.zeros(C, H.np_dtype(dtype)))
    device.write(rv, np.ones(C, H.np_dtype(dtype)))
    xd, sd, bd = H.upload(device, x, offset=3), H.upload(device, scale), H.upload(device, bias)
    device.table["batchnorm_train"](y, rm, rv, sm, si, xd, sd, bd, momentum=0.9, eps=1e-5)
    got = H.empty(device, shape, dtype)
    device.table["batchnorm_apply"](got, xd, sd, bd, sm, si, activation=activation)
    mean, invstd = H.download(device, sm).astype(np.float64), H.download(device, si).astype(np.float64)
    want = (x.astype(np.float64) - per_channel(mean, x)) * per_channel(invstd * scale, x) + per_channel(bias, x)
    relu = (lambda a: np.where(a < 0, 0, a)) if activation == "relu" else (lambda a: a)
    out = H.download(device, got)
    H.assert_close(out, relu(want), dtype, **_tol(dtype, 1e-5, 1e-5), what=f"batchnorm_apply ({activation})")
    if "batchnorm_apply" in device.kernels:
        same = relu(H.download(device, y))
        assert np.array_equal(out, same, equal_nan=True), (
            f"{device.name} batchnorm_apply ({activation}) differs from batchnorm_train's y: "
            f"{np.count_nonzero(~((out == same) | (np.isnan(out) & np.isnan(same))))} of {out.size} elements")


# -- layer normalisation --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, dtypes.float64, dtypes.float16], ids=dtypes.name)
@pytest.mark.parametrize("given", ["scale+bias", "scale", "bias", "neither"])
@pytest.mark.parametrize("shape", [(5, 7), (3, 1), (2, 1000), (130, 24)], ids=lambda s: "x".join(map(str, s)))
def test_layer_norm(device, shape, given, dtype):
    """Each row normalised with its own mean and biased variance, then scaled and shifted; a large common offset
    (rows around 50) checks that the variance is taken of the deviations, not as E[x^2] - E[x]^2."""
    H.require(device, dtype)
    gen = H.rng("layer-norm", shape, given)
    rows, cols = shape
    x = (gen.normal(50.0, 2.0, shape) * gen.uniform(0.5, 2, (rows, 1))).astype(H.np_dtype(dtype))
    scale = H.draw(gen, (cols,), dtype, 0.5, 2) if "scale" in given else None
    bias = H.draw(gen, (cols,), dtype, -1, 1) if "bias" in given else None
    eps = 1e-3
    y, mean, invstd = H.empty(device, shape, dtype), H.empty(device, (rows,), dtype), H.empty(device, (rows,), dtype)
    device.table["layer_norm"](y, mean, invstd, H.upload(device, x, offset=3),
                               None if scale is None else H.upload(device, scale, offset=1),
                               None if bias is None else H.upload(device, bias, offset=2), eps=eps)
    x64 = x.astype(np.float64)
    m = x64.mean(axis=1)
    inv = 1 / np.sqrt(((x64 - m[:, None]) ** 2).mean(axis=1) + eps)
    want = (x64 - m[:, None]) * inv[:, None]
    if scale is not None:
        want = want * scale.astype(np.float64)
    if bias is not None:
        want = want + bias.astype(np.float64)
    tol = {"rtol": 1e-2, "atol": 1e-2} if dtype == dtypes.float16 else _tol(dtype, 1e-5, 1e-5)
    H.assert_close(H.download(device, y), want, dtype, **tol, what="layer_norm y")
    H.assert_close(H.download(device, mean), m, dtype, **_tol(dtype, 1e-6), what="layer_norm mean")
    H.assert_close(H.download(device, invstd), inv, dtype, **({"rtol": 1e-2} if dtype == dtypes.float16 else
                                                            _tol(dtype, 1e-4)), what="layer_norm invstd")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtypes.name)
@pytest.mark.parametrize("shape", [(3, 2, 2, 3), (6, 3)], ids=lambda s: "x".join(map(str, s)))
def test_batchnorm_backward(device, shape, dtype):
    H.require(device, dtype)
    gen = H.rng("bn-bwd", shape)
    C = shape[1]
    eps = 1e-3
    x = gen.normal(0.5, 1.5, shape).astype(H.np_dtype(dtype))
    scale, bias = H.draw(gen, (C,), dtype, 0.5, 2), H.draw(gen, (C,), dtype, -1, 1)
    dy = H.draw(gen, shape, dtype, -1, 1)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    _, mean, _, invstd = bn_forward(x64, scale, bias, eps)
    mean, invstd = mean.astype(H.np_dtype(dtype)), invstd.astype(H.np_dtype(dtype))  # as the forward saved them

    dx, dscale, dbias = H.empty(device, shape, dtype), H.empty(device, (C,), dtype), H.empty(device, (C,), dtype)
    device.table["batchnorm_backward"](dx, dscale, dbias, H.upload(device, dy), H.upload(device, x, offset=3),
                                       H.upload(device, scale), H.upload(device, mean), H.upload(device, invstd))
    got_dx, got_ds, got_db = (H.download(device, v) for v in (dx, dscale, dbias))
    closed = bn_backward_ref(dy64, x64, scale, mean.astype(np.float64), invstd.astype(np.float64))
    for got, (want, mag), what in zip((got_dx, got_ds, got_db), closed, ("dx", "dscale", "dbias")):
        H.assert_close(got, want, dtype, scale=mag, what=f"batchnorm_backward {what} (closed form)")

    def loss_x(xx):
        return np.sum(bn_forward(xx, scale, bias, eps)[0] * dy64)

    num_dx = numeric_grad(loss_x, x64)
    num_ds = numeric_grad(lambda s: np.sum(bn_forward(x64, s, bias, eps)[0] * dy64), scale.astype(np.float64))
    num_db = numeric_grad(lambda b: np.sum(bn_forward(x64, scale, b, eps)[0] * dy64), bias.astype(np.float64))
    tol = _fd_tol(dtype, 1e-3, 1e-4)
    H.assert_close(got_dx, num_dx, dtype, **tol, what="batchnorm_backward dx vs finite differences")
    H.assert_close(got_ds, num_ds, dtype, **tol, what="batchnorm_backward dscale vs finite differences")
    H.assert_close(got_db, num_db, dtype, **tol, what="batchnorm_backward dbias vs finite differences")


# -- softmax ----------------------------------------------------------------------------------------------------------


SOFTMAX_CASES = [((3, 4, 5), a) for a in range(3)] + [((7,), 0), ((4, 1), 1), ((0, 5), 1), ((2, 300), 1)]


def _sm_id(case):
    return f"{'x'.join(map(str, case[0]))}-axis{case[1]}"


@pytest.mark.parametrize("dtype", H.FLOAT_DTYPES, ids=dtypes.name)
@pytest.mark.parametrize("case", SOFTMAX_CASES, ids=_sm_id)
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_forward(device, name, case, dtype):
    H.require(device, dtype)
    shape, axis = case
    gen = H.rng(name, case, dtype)
    ref = softmax_ref if name == "softmax" else log_softmax_ref
    for what, offset in (("", 0.0), (" shifted by +100: exp overflows float32 unless x - max is used", 100.0)):
        x = (H.draw(gen, shape, F32, -4, 4) + offset).astype(H.np_dtype(dtype))
        out = H.empty(device, shape, dtype)
        xv = H.unit_axis_strides(device, x) if 1 in shape else H.upload(device, x, offset=1)
        device.table[name](out, xv, axis=axis)
        want = ref(x.astype(np.float64), axis)
        # log_softmax may round x - (max + log(sum)) at the magnitude of x, not of the result
        scale = np.abs(x.astype(np.float64)).max(initial=0) if name == "log_softmax" and dtype != dtypes.float16 \
            else None
        H.assert_close(H.download(device, out), want, dtype, scale=scale, what=f"{name} {_sm_id(case)}{what}")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtypes.name)
@pytest.mark.parametrize("case", SOFTMAX_CASES, ids=_sm_id)
@pytest.mark.parametrize("name", ["softmax_backward", "log_softmax_backward"])
def test_softmax_backward(device, name, case, dtype):
    H.require(device, dtype)
    shape, axis = case
    gen = H.rng(name, case)
    x = H.draw(gen, shape, dtype, -3, 3).astype(np.float64)
    dy = H.draw(gen, shape, dtype, -1, 1).astype(np.float64)
    fwd = softmax_ref if name == "softmax_backward" else log_softmax_ref
    y = fwd(x, axis).astype(H.np_dtype(dtype))
    dx = H.empty(device, shape, dtype)
    device.table[name](dx, H.upload(device, dy, dtype), H.upload(device, y, offset=2), axis=axis)
    got = H.download(device, dx)
    y64 = y.astype(np.float64)
    if name == "softmax_backward":
        want = y64 * (dy - (dy * y64).sum(axis=axis, keepdims=True))
    else:
        want = dy - np.exp(y64) * dy.sum(axis=axis, keepdims=True)
    scale = np.abs(dy).sum(axis=axis, keepdims=True) + np.abs(dy)
    H.assert_close(got, want, dtype, scale=scale, what=f"{name} {_sm_id(case)} (closed form)")
    if x.size and x.size <= 60:
        num = numeric_grad(lambda xx: np.sum(fwd(xx, axis) * dy), x)
        H.assert_close(got, num, dtype, **_fd_tol(dtype, 1e-4, 1e-5),
                       what=f"{name} {_sm_id(case)} vs finite differences")


# -- softmax cross-entropy --------------------------------------------------------------------------------------------


def _sce_targets(kind, gen, N, C, dtype):
    if kind == "probabilities":
        t = gen.random((N, C)) ** 2
        return (t / t.sum(axis=1, keepdims=True)).astype(H.np_dtype(dtype))
    labels = gen.integers(0, C, N)
    labels[:2] = [0, C - 1]
    return labels.astype(np.int32 if kind == "int32" else np.int64)


# (N, C): a few rows; rows past one block of a kernel that exponentiates whole rows together (10 classes, the digits'),
# and past a threaded split; rows longer than such a block; a single class
SCE_SHAPES = [(6, 7), (300, 10), (2100, 10), (3, 1100), (5, 1)]


@pytest.mark.parametrize("shape", SCE_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtypes.name)
@pytest.mark.parametrize("kind", ["int32", "int64", "probabilities"])
def test_softmax_cross_entropy(device, kind, dtype, shape):
    H.require(device, dtype)
    gen = H.rng("sce", kind, shape)
    N, C = shape
    t = _sce_targets(kind, gen, N, C, dtype)
    tdt = dtypes.from_numpy_dtype(t.dtype)
    for what, offset, spread in (("", 0.0, 3.0), (" large logits (stability)", 100.0, 40.0)):
        x = (gen.uniform(-spread, spread, (N, C)) + offset).astype(H.np_dtype(dtype))
        loss = H.empty(device, (N,), dtype)
        device.table["softmax_cross_entropy"](loss, H.upload(device, x, offset=1), H.upload(device, t, tdt))
        want = sce_ref(x.astype(np.float64), t)
        H.assert_close(H.download(device, loss), want, dtype, scale=np.abs(x).max(), **_tol(dtype, 1e-5, 1e-5),
                       what=f"softmax_cross_entropy {kind}{what}")

        dloss = H.draw(gen, (N,), dtype, 0.5, 2)
        dx = H.empty(device, (N, C), dtype)
        device.table["softmax_cross_entropy_backward"](dx, H.upload(device, dloss), H.upload(device, x),
                                                       H.upload(device, t, tdt))
        x64 = x.astype(np.float64)
        want_dx = (softmax_ref(x64, 1) - onehot(t, C)) * dloss.astype(np.float64)[:, None]
        got = H.download(device, dx)
        H.assert_close(got, want_dx, dtype, **_tol(dtype, 1e-5, 1e-6),
                       what=f"softmax_cross_entropy_backward {kind}{what}")
        if not offset and x.size <= 60:
            num = numeric_grad(lambda xx, d=dloss: np.sum(sce_ref(xx, t) * d), x64)
            H.assert_close(got, num, dtype, **_fd_tol(dtype, 1e-4, 1e-5),
                           what=f"softmax_cross_entropy_backward {kind} vs finite differences")
