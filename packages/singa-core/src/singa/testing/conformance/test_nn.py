"""Batch normalisation, softmax / log-softmax and softmax cross-entropy, forward and backward.

Gradients are checked twice: against the closed forms in float64, and against central finite differences of a
float64 reference forward written here, so a wrong closed form in both the kernel and this file cannot agree.
"""

from __future__ import annotations

import numpy as np
import pytest

from singa import dtypes
from singa.testing import helpers as H
from singa.testing.conformance.references import (
    bn_axes,
    bn_forward,
    log_softmax_ref,
    numeric_grad,
    onehot,
    per_channel,
    sce_ref,
    softmax_ref,
)

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")

COVERS = {"batchnorm_train", "batchnorm_infer", "batchnorm_backward", "softmax", "log_softmax", "softmax_backward",
          "log_softmax_backward", "softmax_cross_entropy", "softmax_cross_entropy_backward"}

F32 = dtypes.float32


# -- batch normalisation ----------------------------------------------------------------------------------------------


BN_SHAPES = [(4, 3, 5, 6), (8, 5), (2, 3, 1, 1)]


@pytest.mark.parametrize("shape", BN_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_batchnorm_train(device, shape):
    gen = H.rng("bn-train", shape)
    C = shape[1]
    x = (gen.normal(1.5, 2.0, shape)).astype(np.float32)
    scale, bias = H.draw(gen, (C,), F32, 0.5, 2), H.draw(gen, (C,), F32, -1, 1)
    rm0, rv0 = H.draw(gen, (C,), F32, -1, 1), H.draw(gen, (C,), F32, 0.5, 2)
    momentum, eps = 0.9, 1e-5
    y, rm, rv, sm, si = (H.empty(device, s, F32) for s in (shape, (C,), (C,), (C,), (C,)))
    device.write(rm, rm0)
    device.write(rv, rv0)
    device.table["batchnorm_train"](y, rm, rv, sm, si, H.upload(device, x, offset=2), H.upload(device, scale),
                                    H.upload(device, bias), momentum=momentum, eps=eps)
    want_y, mean, var, invstd = bn_forward(x.astype(np.float64), scale, bias, eps)
    m = x.size // C
    H.assert_close(H.download(device, y), want_y, F32, rtol=1e-4, atol=1e-5, what="batchnorm_train y")
    H.assert_close(H.download(device, sm), mean, F32, scale=np.abs(x).mean(axis=bn_axes(x)), what="saved_mean")
    H.assert_close(H.download(device, si), invstd, F32, rtol=1e-4, what="saved_invstd = 1/sqrt(biased var + eps)")
    H.assert_close(H.download(device, rm), momentum * rm0 + (1 - momentum) * mean, F32, rtol=1e-4, atol=1e-5,
                   what="running_mean = momentum * running_mean + (1 - momentum) * mean")
    H.assert_close(H.download(device, rv), momentum * rv0 + (1 - momentum) * var * m / max(m - 1, 1), F32,
                   rtol=1e-4, atol=1e-5, what="running_var (unbiased batch variance)")


@pytest.mark.parametrize("shape", BN_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_batchnorm_infer(device, shape):
    gen = H.rng("bn-infer", shape)
    C = shape[1]
    x = H.draw(gen, shape, F32)
    scale, bias, mean = H.draw(gen, (C,), F32, 0.5, 2), H.draw(gen, (C,), F32, -1, 1), H.draw(gen, (C,), F32, -1, 1)
    var = H.draw(gen, (C,), F32, 0.1, 3)
    eps = 1e-3
    y = H.empty(device, shape, F32)
    device.table["batchnorm_infer"](y, H.upload(device, x, offset=1), H.upload(device, scale), H.upload(device, bias),
                                    H.upload(device, mean), H.upload(device, var), eps=eps)
    mean_, var_, scale_, bias_ = (per_channel(v, x) for v in (mean, var, scale, bias))
    want = (x.astype(np.float64) - mean_) / np.sqrt(var_ + eps) * scale_ + bias_
    H.assert_close(H.download(device, y), want, F32, rtol=1e-5, atol=1e-5, what="batchnorm_infer")


@pytest.mark.parametrize("shape", [(3, 2, 2, 3), (6, 3)], ids=lambda s: "x".join(map(str, s)))
def test_batchnorm_backward(device, shape):
    gen = H.rng("bn-bwd", shape)
    C = shape[1]
    eps = 1e-3
    x = gen.normal(0.5, 1.5, shape).astype(np.float32)
    scale, bias = H.draw(gen, (C,), F32, 0.5, 2), H.draw(gen, (C,), F32, -1, 1)
    dy = H.draw(gen, shape, F32, -1, 1)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    _, mean, _, invstd = bn_forward(x64, scale, bias, eps)

    dx, dscale, dbias = H.empty(device, shape, F32), H.empty(device, (C,), F32), H.empty(device, (C,), F32)
    device.table["batchnorm_backward"](dx, dscale, dbias, H.upload(device, dy), H.upload(device, x, offset=3),
                                       H.upload(device, scale), H.upload(device, mean.astype(np.float32)),
                                       H.upload(device, invstd.astype(np.float32)))

    def loss_x(xx):
        return np.sum(bn_forward(xx, scale, bias, eps)[0] * dy64)

    num_dx = numeric_grad(loss_x, x64)
    num_ds = numeric_grad(lambda s: np.sum(bn_forward(x64, s, bias, eps)[0] * dy64), scale.astype(np.float64))
    num_db = numeric_grad(lambda b: np.sum(bn_forward(x64, scale, b, eps)[0] * dy64), bias.astype(np.float64))
    H.assert_close(H.download(device, dx), num_dx, F32, rtol=1e-3, atol=1e-4, what="batchnorm_backward dx")
    H.assert_close(H.download(device, dscale), num_ds, F32, rtol=1e-3, atol=1e-4, what="batchnorm_backward dscale")
    H.assert_close(H.download(device, dbias), num_db, F32, rtol=1e-3, atol=1e-4, what="batchnorm_backward dbias")


# -- softmax ----------------------------------------------------------------------------------------------------------


SOFTMAX_CASES = [((3, 4, 5), a) for a in range(3)] + [((7,), 0), ((4, 1), 1), ((0, 5), 1), ((2, 300), 1)]


def _sm_id(case):
    return f"{'x'.join(map(str, case[0]))}-axis{case[1]}"


@pytest.mark.parametrize("dtype", dtypes.FLOATS, ids=dtypes.name)
@pytest.mark.parametrize("case", SOFTMAX_CASES, ids=_sm_id)
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_forward(device, name, case, dtype):
    shape, axis = case
    gen = H.rng(name, case, dtype)
    ref = softmax_ref if name == "softmax" else log_softmax_ref
    for what, offset in (("", 0.0), (" shifted by +100: exp overflows float32 unless x - max is used", 100.0)):
        x = (H.draw(gen, shape, F32, -4, 4) + offset).astype(H.np_dtype(dtype))
        out = H.empty(device, shape, dtype)
        xv = H.unit_axis_strides(device, x) if 1 in shape else H.upload(device, x, offset=1)
        device.table[name](out, xv, axis=axis)
        want = ref(x.astype(np.float64), axis)
        # float32 log_softmax may round x - (max + log(sum)) at the magnitude of x, not of the result
        scale = np.abs(x.astype(np.float64)).max(initial=0) if name == "log_softmax" and dtype == F32 else None
        H.assert_close(H.download(device, out), want, dtype, scale=scale, what=f"{name} {_sm_id(case)}{what}")


@pytest.mark.parametrize("case", SOFTMAX_CASES, ids=_sm_id)
@pytest.mark.parametrize("name", ["softmax_backward", "log_softmax_backward"])
def test_softmax_backward(device, name, case):
    shape, axis = case
    gen = H.rng(name, case)
    x = H.draw(gen, shape, F32, -3, 3).astype(np.float64)
    dy = H.draw(gen, shape, F32, -1, 1).astype(np.float64)
    fwd = softmax_ref if name == "softmax_backward" else log_softmax_ref
    y = fwd(x, axis).astype(np.float32)
    dx = H.empty(device, shape, F32)
    device.table[name](dx, H.upload(device, dy.astype(np.float32)), H.upload(device, y, offset=2), axis=axis)
    got = H.download(device, dx)
    y64 = y.astype(np.float64)
    if name == "softmax_backward":
        want = y64 * (dy - (dy * y64).sum(axis=axis, keepdims=True))
    else:
        want = dy - np.exp(y64) * dy.sum(axis=axis, keepdims=True)
    scale = np.abs(dy).sum(axis=axis, keepdims=True) + np.abs(dy)
    H.assert_close(got, want, F32, scale=scale, what=f"{name} {_sm_id(case)} (closed form)")
    if x.size and x.size <= 60:
        num = numeric_grad(lambda xx: np.sum(fwd(xx, axis) * dy), x)
        H.assert_close(got, num, F32, rtol=1e-4, atol=1e-5, what=f"{name} {_sm_id(case)} vs finite differences")


# -- softmax cross-entropy --------------------------------------------------------------------------------------------


def _sce_targets(kind, gen, N, C):
    if kind == "probabilities":
        t = gen.random((N, C)) ** 2
        return (t / t.sum(axis=1, keepdims=True)).astype(np.float32)
    labels = gen.integers(0, C, N)
    labels[:2] = [0, C - 1]
    return labels.astype(np.int32 if kind == "int32" else np.int64)


@pytest.mark.parametrize("kind", ["int32", "int64", "probabilities"])
def test_softmax_cross_entropy(device, kind):
    gen = H.rng("sce", kind)
    N, C = 6, 7
    t = _sce_targets(kind, gen, N, C)
    tdt = dtypes.from_numpy_dtype(t.dtype)
    for what, offset, spread in (("", 0.0, 3.0), (" large logits (stability)", 100.0, 40.0)):
        x = (gen.uniform(-spread, spread, (N, C)) + offset).astype(np.float32)
        loss = H.empty(device, (N,), F32)
        device.table["softmax_cross_entropy"](loss, H.upload(device, x, offset=1), H.upload(device, t, tdt))
        want = sce_ref(x.astype(np.float64), t)
        H.assert_close(H.download(device, loss), want, F32, scale=np.abs(x).max(), atol=1e-5,
                       what=f"softmax_cross_entropy {kind}{what}")

        dloss = H.draw(gen, (N,), F32, 0.5, 2)
        dx = H.empty(device, (N, C), F32)
        device.table["softmax_cross_entropy_backward"](dx, H.upload(device, dloss), H.upload(device, x),
                                                       H.upload(device, t, tdt))
        x64 = x.astype(np.float64)
        want_dx = (softmax_ref(x64, 1) - onehot(t, C)) * dloss.astype(np.float64)[:, None]
        got = H.download(device, dx)
        H.assert_close(got, want_dx, F32, atol=1e-6, what=f"softmax_cross_entropy_backward {kind}{what}")
        if not offset:
            num = numeric_grad(lambda xx, d=dloss: np.sum(sce_ref(xx, t) * d), x64)
            H.assert_close(got, num, F32, rtol=1e-4, atol=1e-5,
                           what=f"softmax_cross_entropy_backward {kind} vs finite differences")
