"""singa.layer: forward values against numpy references (float64), lazy parameter creation, hierarchical names,
parameter/state round trips, batch-size and image-size changes between calls, and gradients reaching every
parameter (with finite-difference checks of the recurrent layers, which are composed from autograd operators)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import conv_ref

from singa import autograd, device, layer, tensor

DEV = device.get_default_device()
RNG = np.random.default_rng(1234)


def T(a, dtype=np.float32, grad: bool = False) -> tensor.Tensor:
    return tensor.Tensor(device=DEV, data=np.asarray(a, dtype=dtype), requires_grad=grad)


def N(t) -> np.ndarray:
    return t.to_numpy().astype(np.float64)


def randn(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# -- numpy references -------------------------------------------------------------------------------------------------


def pool_ref(x, k, s, pads=(0, 0, 0, 0), is_max=True, ceil_mode=False, count_include_pad=True) -> np.ndarray:
    x = np.asarray(x, np.float64)
    n, c, h, w = x.shape
    pt, pl, pb, pr = pads

    def size(length, kk, ss, p0, p1):
        span = length + p0 + p1 - kk
        o = (-(-span // ss) if ceil_mode else span // ss) + 1
        if ceil_mode and (o - 1) * ss >= length + p0:
            o -= 1
        return o

    oh, ow = size(h, k[0], s[0], pt, pb), size(w, k[1], s[1], pl, pr)
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            h0, w0 = i * s[0] - pt, j * s[1] - pl
            h1, w1 = min(h0 + k[0], h + pb), min(w0 + k[1], w + pr)
            win = x[:, :, max(h0, 0):min(h1, h), max(w0, 0):min(w1, w)]
            if is_max:
                out[:, :, i, j] = win.max(axis=(2, 3))
            else:
                div = (h1 - h0) * (w1 - w0) if count_include_pad else win.shape[2] * win.shape[3]
                out[:, :, i, j] = win.sum(axis=(2, 3)) / div
    return out


def bn_ref(x, scale, bias, mean, var, eps=1e-5) -> np.ndarray:
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * scale.reshape(shape) + \
        bias.reshape(shape)


def bn_axes(x) -> tuple:
    return (0,) if x.ndim == 2 else (0, 2, 3)


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def same_pads_ref(mode, size, k, s):
    """Independent restatement of ONNX auto_pad for one axis: (begin, end)."""
    out = math.ceil(size / s)
    total = max((out - 1) * s + k - size, 0)
    if mode == "SAME_UPPER":
        return total // 2, total - total // 2
    return total - total // 2, total // 2


def params_np(lyr) -> dict[str, np.ndarray]:
    return {k: N(v) for k, v in lyr.get_params().items()}


def grads_by_param(loss) -> dict[int, tensor.Tensor]:
    return {id(p): g for p, g in autograd.backward(loss)}


def scalar(loss) -> float:
    return float(np.asarray(loss.to_numpy()).reshape(-1)[0])


# -- Layer machinery ----------------------------------------------------------------------------------------------


class Block(layer.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.conv = layer.Conv2d(4, 3, padding=1)
        self.bn = layer.BatchNorm2d()

    def forward(self, x):
        return autograd.relu(self.bn(self.conv(x)))


class Net(layer.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.block1 = Block()
        self.pool = layer.MaxPool2d(2)
        self.flat = layer.Flatten()
        self.linear1 = layer.Linear(5)
        self.linear2 = layer.Linear(3, bias=False)

    def forward(self, x):
        y = self.flat(self.pool(self.block1(x)))
        return self.linear2(autograd.relu(self.linear1(y)))


NET_PARAMS = {"block1.conv.W": (4, 2, 3, 3), "block1.conv.b": (4,), "block1.bn.scale": (4,),
              "block1.bn.bias": (4,), "linear1.W": (4 * 3 * 3, 5), "linear1.b": (5,), "linear2.W": (5, 3)}
NET_STATES = {"block1.bn.running_mean": (4,), "block1.bn.running_var": (4,)}


def test_parameters_are_created_lazily_from_the_input() -> None:
    lin = layer.Linear(4)
    assert lin.get_params() == {}
    with pytest.raises(AttributeError, match="first call"):
        lin.W  # noqa: B018
    x = T(randn(3, 7))
    lin(x)
    W, b = lin.W, lin.b
    assert W.shape == (7, 4)
    assert b.shape == (4,)
    for p in (W, b):
        assert p.requires_grad
        assert p.stores_grad
        assert p.device is x.device
        assert p.dtype == tensor.float32
    assert lin.get_params() == {"W": W, "b": b}
    assert W.name == "W"
    np.testing.assert_array_equal(N(b), 0)
    lin(T(randn(5, 7)))  # a second call creates nothing new
    assert lin.W is W
    assert lin.b is b


def test_hierarchical_names_of_params_and_states(training) -> None:
    net = Net()
    net(T(randn(2, 2, 6, 6)))
    params = net.get_params()
    assert {k: v.shape for k, v in params.items()} == NET_PARAMS
    for name, p in params.items():
        assert p.name == name
        assert p.requires_grad
        assert p.stores_grad
    states = net.get_states()
    assert {k: v.shape for k, v in states.items()} == {**NET_PARAMS, **NET_STATES}
    for name in NET_STATES:
        assert states[name].name == name
        assert not states[name].requires_grad
        assert not states[name].stores_grad
    assert net.block1.get_params().keys() == {k for k in NET_PARAMS if k.startswith("block1.")}
    assert net.linear1.name == "linear1"
    assert isinstance(net.block1.conv, layer.Conv2d)


def test_set_and_get_params_and_states_round_trip(training) -> None:
    net = Net()
    x = T(randn(2, 2, 6, 6))
    net(x)
    new = {k: RNG.standard_normal(v.shape).astype(np.float32) for k, v in net.get_states().items()}
    new["block1.bn.running_var"] = np.abs(new["block1.bn.running_var"]) + 0.5
    net.set_states(new)
    for k, v in net.get_states().items():
        np.testing.assert_array_equal(v.to_numpy(), new[k])
    # set_params takes Tensors too, and a partial dict leaves the rest alone
    w = T(randn(5, 3))
    net.set_params({"linear2.W": w})
    np.testing.assert_array_equal(net.linear2.W.to_numpy(), w.to_numpy())
    assert net.linear2.W is not w
    np.testing.assert_array_equal(net.linear1.W.to_numpy(), new["linear1.W"])
    # a second network loads the first one's states and computes the same function
    other = Net()
    other(x)
    other.set_states({k: v.to_numpy() for k, v in net.get_states().items()})
    autograd.training = False
    np.testing.assert_allclose(N(other(x)), N(net(x)), rtol=1e-6)


def test_set_params_errors() -> None:
    lin = layer.Linear(3)
    lin(T(randn(2, 4)))
    with pytest.raises(KeyError, match="linear_W"):
        lin.set_params({"linear_W": np.zeros((4, 3))})
    with pytest.raises(ValueError, match=r"\(4, 3\)"):
        lin.set_params({"W": np.zeros((3, 4))})
    lin.set_params({"b": np.ones((1, 3))})  # size-1 axes may differ
    np.testing.assert_array_equal(lin.b.to_numpy(), np.ones(3))


def test_register_layers_and_attribute_handling() -> None:
    class Seq(layer.Layer):
        def __init__(self, *layers) -> None:
            super().__init__()
            self.register_layers(*layers)

        def forward(self, x):
            for lyr in self._layers.values():
                x = lyr(x)
            return x

    s = Seq(layer.Linear(4), layer.ReLU(), layer.Linear(2))
    s(T(randn(3, 5)))
    assert set(s.get_params()) == {"Linear_0.W", "Linear_0.b", "Linear_2.W", "Linear_2.b"}
    d = Seq({"enc": layer.Linear(3), "dec": layer.Linear(5)})
    d(T(randn(2, 5)))
    assert set(d.get_params()) == {"enc.W", "enc.b", "dec.W", "dec.b"}
    del d.dec
    assert set(d.get_params()) == {"enc.W", "enc.b"}
    d.enc = 3  # replacing a sublayer by a plain value unregisters it
    assert d.get_params() == {}
    assert d.enc == 3


def test_device_and_dtype_checks() -> None:
    lin = layer.Linear(2)
    lin(T(randn(3, 4)))
    h = tensor.Tensor((2,), DEV, tensor.float16)
    lin.dtype_check(lin.W, h)
    assert h.dtype == tensor.float32
    others = [d for d in device.list_devices() if d is not DEV]
    moved = T(randn(2))
    moved.to_device(others[0] if others else DEV)
    lin.device_check(lin.W, moved)
    assert moved.device is DEV


def test_half_precision_input_creates_half_parameters() -> None:
    lin = layer.Linear(3)
    x = randn(4, 5)
    y = lin(T(x, np.float16))
    assert lin.W.dtype == tensor.float16
    assert y.dtype == tensor.float16
    np.testing.assert_allclose(N(y), x @ N(lin.W) + N(lin.b), rtol=2e-2, atol=2e-2)


# -- dense layers -------------------------------------------------------------------------------------------------


def test_linear_forward_and_legacy_signature() -> None:
    x = randn(6, 4)
    lin = layer.Linear(3)
    y = lin(T(x))
    p = params_np(lin)
    np.testing.assert_allclose(N(y), x @ p["W"] + p["b"], rtol=1e-5, atol=1e-5)
    old = layer.Linear(4, 3, False)  # SINGA's older (in, out, bias)
    old(T(x))
    assert old.W.shape == (4, 3)
    assert old.get_params().keys() == {"W"}
    with pytest.raises(ValueError, match="in_features=5"):
        layer.Linear(5, 3)(T(x))
    with pytest.raises(ValueError, match="input features"):
        lin(T(randn(6, 5)))


def test_linear_initial_weights_follow_singas_scale() -> None:
    lin = layer.Linear(300)
    lin(T(randn(2, 500)))
    w = N(lin.W)
    assert w.std() == pytest.approx(math.sqrt(2.0 / 800), rel=0.03)


@pytest.mark.parametrize(("transA", "transB"), [(False, True), (False, False), (True, True), (True, False)])
def test_gemm(transA, transB) -> None:
    a = randn(4, 6) if not transA else randn(6, 4)
    g = layer.Gemm(5, alpha=0.5, beta=2.0, transA=transA, transB=transB)
    g(T(a))
    p = params_np(g)
    assert p["W"].shape == ((5, 6) if transB else (6, 5))
    assert p["b"].shape == (1, 5)
    bias = RNG.standard_normal((1, 5)).astype(np.float32)
    g.set_params({"b": bias})
    y = g(T(a))
    A = a.T if transA else a
    B = p["W"].T if transB else p["W"]
    np.testing.assert_allclose(N(y), 0.5 * A @ B + 2.0 * bias, rtol=1e-5, atol=1e-5)


def test_embedding() -> None:
    ids = np.array([[0, 3, 2], [4, 4, 1]], np.int32)
    emb = layer.Embedding(5, 3)
    y = emb(T(ids, np.int32))
    assert emb.W.shape == (5, 3)
    assert emb.W.dtype == tensor.float32
    np.testing.assert_allclose(N(y), N(emb.W)[ids], rtol=1e-6)
    table = randn(5, 3)
    pre = layer.Embedding(5, 3).from_pretrained(table, freeze=True)
    assert not pre.W.requires_grad
    assert not pre.W.stores_grad
    np.testing.assert_array_equal(N(pre(T(ids, np.int32))), table[ids])
    with pytest.raises(ValueError, match=r"\(5, 3\)"):
        layer.Embedding(5, 3).from_pretrained(randn(4, 3))
    uni = layer.Embedding(500, 40, initializer="uniform")
    uni(T([[1]], np.int32))
    w = N(uni.W)
    assert w.min() >= -1
    assert w.max() <= 1
    assert w.std() == pytest.approx(1 / math.sqrt(3), rel=0.03)


# -- convolution ---------------------------------------------------------------------------------------------------


CONV_CASES = [  # (in_channels, kwargs, input spatial size)
    (3, {"nb_kernels": 4, "kernel_size": 3}, (7, 6)),
    (3, {"nb_kernels": 5, "kernel_size": (3, 2), "stride": 2, "padding": 1}, (8, 7)),
    (2, {"nb_kernels": 3, "kernel_size": 3, "stride": (1, 2), "padding": (2, 1), "dilation": 2}, (9, 9)),
    (4, {"nb_kernels": 6, "kernel_size": 3, "group": 2, "padding": (0, 1, 2, 1)}, (6, 5)),
    (4, {"nb_kernels": 4, "kernel_size": 2, "group": 4, "bias": False}, (5, 5)),
    (2, {"nb_kernels": 3, "kernel_size": 3, "padding": 1, "activation": "RELU"}, (5, 4)),
]


@pytest.mark.parametrize(("cin", "kw", "hw"), CONV_CASES)
def test_conv2d_forward(cin, kw, hw) -> None:
    x = randn(3, cin, *hw)
    conv = layer.Conv2d(**kw)
    y = conv(T(x))
    p = params_np(conv)
    group = kw.get("group", 1)
    k = kw["kernel_size"] if isinstance(kw["kernel_size"], tuple) else (kw["kernel_size"],) * 2
    assert p["W"].shape == (kw["nb_kernels"], cin // group) + k
    assert ("b" in p) == kw.get("bias", True)
    pad = kw.get("padding", 0)
    pads = (pad,) * 4 if isinstance(pad, int) else (pad * 2 if len(pad) == 2 else pad)
    st = kw.get("stride", 1)
    dil = kw.get("dilation", 1)
    ref = conv_ref(x, p["W"], p.get("b"), st if isinstance(st, tuple) else (st, st), pads, (dil, dil), group)
    if kw.get("activation") == "RELU":
        ref = np.maximum(ref, 0)
        assert (ref == 0).any()
    np.testing.assert_allclose(N(y), ref, rtol=1e-4, atol=1e-4)


def test_conv2d_legacy_signature_and_checks() -> None:
    conv = layer.Conv2d(3, 8, 3, 1, 1, bias=False)  # (in, out, kernel, stride, padding)
    x = randn(2, 3, 5, 5)
    y = conv(T(x))
    assert conv.W.shape == (8, 3, 3, 3)
    assert y.shape == (2, 8, 5, 5)
    np.testing.assert_allclose(N(y), conv_ref(x, N(conv.W), pads=(1, 1, 1, 1)), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="in_channels=4"):
        layer.Conv2d(4, 8, 3)(T(x))
    with pytest.raises(ValueError, match="input channels"):
        conv(T(randn(2, 4, 5, 5)))
    with pytest.raises(ValueError, match="pad_mode"):
        layer.Conv2d(4, 3, pad_mode="SAME")
    with pytest.raises(ValueError, match="group"):
        layer.Conv2d(5, 3, group=2)


def test_conv2d_initial_weights_follow_singas_scale() -> None:
    conv = layer.Conv2d(64, 3)
    conv(T(randn(1, 32, 3, 3)))
    assert N(conv.W).std() == pytest.approx(math.sqrt(2.0 / (32 * 9 + 64)), rel=0.03)


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize(("k", "s"), [(3, 1), (4, 1), (3, 2), (2, 2), (5, 3)])
def test_conv2d_same_padding_every_call(mode, k, s) -> None:
    conv = layer.Conv2d(3, k, stride=s, pad_mode=mode, padding=7)  # padding is ignored in SAME modes
    for h, w in [(7, 8), (10, 5), (4, 4)]:
        x = randn(2, 2, h, w)
        y = conv(T(x))
        assert y.shape == (2, 3, math.ceil(h / s), math.ceil(w / s))
        (t, b_), (l_, r) = same_pads_ref(mode, h, k, s), same_pads_ref(mode, w, k, s)
        ref = conv_ref(x, N(conv.W), N(conv.b), (s, s), (t, l_, b_, r))
        np.testing.assert_allclose(N(y), ref, rtol=1e-4, atol=1e-4)


def test_same_upper_and_lower_differ_on_odd_totals() -> None:
    x = randn(1, 1, 6, 6)
    outs = {}
    for mode in ("SAME_UPPER", "SAME_LOWER"):
        conv = layer.Conv2d(1, 2, pad_mode=mode, bias=False)  # total padding 1 per axis
        conv(T(x))
        conv.set_params({"W": np.ones((1, 1, 2, 2), np.float32)})
        outs[mode] = N(conv(T(x)))
    # SAME_UPPER pads after (bottom/right): the last output sums only the last row/column
    np.testing.assert_allclose(outs["SAME_UPPER"][0, 0, -1, -1], x[0, 0, -1, -1], rtol=1e-6)
    np.testing.assert_allclose(outs["SAME_LOWER"][0, 0, 0, 0], x[0, 0, 0, 0], rtol=1e-6)


def test_conv2d_valid_pad_mode() -> None:
    conv = layer.Conv2d(2, 3, padding=2, pad_mode="VALID")
    x = randn(1, 2, 6, 5)
    y = conv(T(x))
    np.testing.assert_allclose(N(y), conv_ref(x, N(conv.W), N(conv.b)), rtol=1e-4, atol=1e-4)


def test_separable_conv2d() -> None:
    sep = layer.SeparableConv2d(5, 3, stride=1, padding=1, bias=True)
    x = randn(2, 3, 6, 6)
    y = sep(T(x))
    p = params_np(sep)
    assert {k: v.shape for k, v in p.items()} == {"depthwise_conv.W": (3, 1, 3, 3), "depthwise_conv.b": (3,),
                                                  "point_conv.W": (5, 3, 1, 1), "point_conv.b": (5,)}
    mid = conv_ref(x, p["depthwise_conv.W"], p["depthwise_conv.b"], pads=(1, 1, 1, 1), group=3)
    np.testing.assert_allclose(N(y), conv_ref(mid, p["point_conv.W"], p["point_conv.b"]), rtol=1e-4, atol=1e-4)


# -- batch normalisation -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(8, 3, 4, 5), (16, 6)])
def test_batchnorm_train_then_eval(shape) -> None:
    bn = layer.BatchNorm2d(momentum=0.8)
    x = randn(*shape) * 3 + 1
    prev = autograd.training
    try:
        autograd.training = True
        y = bn(T(x))
        c = shape[1]
        assert {k: v.shape for k, v in bn.get_states().items()} == {
            "scale": (c,), "bias": (c,), "running_mean": (c,), "running_var": (c,)}
        assert set(bn.get_params()) == {"scale", "bias"}
        ax = bn_axes(x)
        mean, var = x.astype(np.float64).mean(axis=ax), x.astype(np.float64).var(axis=ax)
        np.testing.assert_allclose(N(y), bn_ref(x, np.ones(c), np.zeros(c), mean, var), rtol=1e-4, atol=1e-4)
        m = x.size // c
        np.testing.assert_allclose(N(bn.running_mean), 0.2 * mean, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(N(bn.running_var), 0.8 + 0.2 * var * m / (m - 1), rtol=1e-4)
        scale, bias = randn(c), randn(c)
        bn.set_params({"scale": scale, "bias": bias})
        autograd.training = False
        x2 = randn(*((5,) + shape[1:]))  # another batch size
        y2 = bn(T(x2))
        ref = bn_ref(x2, scale, bias, N(bn.running_mean), N(bn.running_var))
        np.testing.assert_allclose(N(y2), ref, rtol=1e-4, atol=1e-4)
    finally:
        autograd.training = prev


# -- layer normalisation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("shape", "normalized", "affine", "bias"), [
    ((4, 10), 10, True, True), ((2, 3, 8), (3, 8), True, True), ((5, 6), 6, True, False), ((3, 2, 6), 6, False, True)])
def test_layer_norm_values_and_gradients(shape, normalized, affine, bias) -> None:
    """Forward against float64 numpy; gradients of sum(y * w) against central finite differences of that reference,
    for the input and both parameters."""
    ln = layer.LayerNorm(normalized, eps=1e-3, elementwise_affine=affine, bias=bias)
    k = 1 if isinstance(normalized, int) else len(normalized)
    axes = tuple(range(len(shape) - k, len(shape)))
    x = (randn(*shape) * 2 + 5).astype(np.float64)
    w = randn(*shape).astype(np.float64)
    nshape = shape[-k:]
    scale, shift = randn(*nshape).astype(np.float64), randn(*nshape).astype(np.float64)

    def ref(x, scale, shift):
        m = x.mean(axis=axes, keepdims=True)
        y = (x - m) / np.sqrt(((x - m) ** 2).mean(axis=axes, keepdims=True) + 1e-3)
        return y * (scale if affine else 1) + (shift if bias and affine else 0)

    prev = autograd.training
    try:
        autograd.training = True
        tx = T(x, grad=True)
        tx.stores_grad = True
        y = ln(tx)
        params = ln.get_params()
        assert set(params) == ({"scale"} if affine else set()) | ({"bias"} if affine and bias else set())
        ln.set_params({k_: v.astype(np.float32) for k_, v in (("scale", scale), ("bias", shift)) if k_ in params})
        y = ln(tx)
        np.testing.assert_allclose(N(y), ref(x, scale, shift), rtol=1e-4, atol=1e-4)
        loss = autograd.sum(autograd.mul(y, T(w)))
        grads = {id(p): N(g) for p, g in autograd.backward(loss)}
    finally:
        autograd.training = prev

    def fd(i, arr):
        g = np.zeros_like(arr)
        args = [x.astype(np.float32).astype(np.float64), scale.astype(np.float32).astype(np.float64),
                shift.astype(np.float32).astype(np.float64)]
        for idx in np.ndindex(arr.shape):
            for sgn in (1, -1):
                a = [v.copy() for v in args]
                a[i][idx] += sgn * 1e-5
                g[idx] += sgn * (ref(*a) * w).sum() / 2e-5
        return g

    np.testing.assert_allclose(grads[id(tx)], fd(0, x), rtol=2e-3, atol=2e-3)
    if affine:
        np.testing.assert_allclose(grads[id(ln.scale)], fd(1, scale), rtol=2e-3, atol=2e-3)
    if affine and bias:
        np.testing.assert_allclose(grads[id(ln.bias)], fd(2, shift), rtol=2e-3, atol=2e-3)


def test_layer_norm_checks_the_input_shape() -> None:
    with pytest.raises(ValueError, match=r"LayerNorm: expects inputs ending in \(6,\)"):
        layer.LayerNorm(6)(T(randn(2, 5)))
    with pytest.raises(ValueError, match="positive"):
        layer.LayerNorm((0,))


def test_batchnorm_legacy_channels_check() -> None:
    with pytest.raises(ValueError, match="3 channels"):
        layer.BatchNorm2d(3)(T(randn(2, 4, 2, 2)))
    with pytest.raises(ValueError, match="momentum"):
        layer.BatchNorm2d(momentum=1.5)


# -- pooling ---------------------------------------------------------------------------------------------------------


POOL_CASES = [  # (class, args, kwargs, pads for the reference, input spatial size)
    (layer.MaxPool2d, (2,), {}, (0, 0, 0, 0), (6, 8)),
    (layer.MaxPool2d, (3, 1), {"padding": 1}, (1, 1, 1, 1), (5, 6)),
    (layer.MaxPool2d, ((3, 2), (2, 1)), {"padding": (1, 0)}, (1, 0, 1, 0), (7, 5)),
    (layer.MaxPool2d, (3, 2), {"ceil_mode": True}, (0, 0, 0, 0), (8, 6)),
    (layer.AvgPool2d, (2,), {}, (0, 0, 0, 0), (6, 4)),
    (layer.AvgPool2d, (3, 2), {"padding": 1}, (1, 1, 1, 1), (7, 7)),
    (layer.AvgPool2d, (3, 2), {"padding": 1, "count_include_pad": False}, (1, 1, 1, 1), (7, 6)),
    (layer.Pooling2d, (2, 2, 0, False), {}, (0, 0, 0, 0), (4, 6)),
]


@pytest.mark.parametrize(("cls", "args", "kwargs", "pads", "hw"), POOL_CASES)
def test_pooling2d_forward(cls, args, kwargs, pads, hw) -> None:
    pool = cls(*args, **kwargs)
    x = randn(3, 2, *hw)
    y = pool(T(x))
    k = pool.kernel_size
    ref = pool_ref(x, k, pool.stride, pads, pool.is_max, kwargs.get("ceil_mode", False),
                   kwargs.get("count_include_pad", True))
    assert y.shape == ref.shape
    np.testing.assert_allclose(N(y), ref, rtol=1e-5, atol=1e-5)


def test_pooling_stride_defaults_to_kernel() -> None:
    assert layer.MaxPool2d(3).stride == (3, 3)
    assert layer.AvgPool2d((2, 3)).stride == (2, 3)
    assert layer.MaxPool1d(4).stride == (1, 4)


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("is_max", [True, False])
def test_pooling_same_pad_mode(mode, is_max) -> None:
    pool = layer.Pooling2d(2, 1, is_max=is_max, pad_mode=mode)
    for h, w in [(5, 6), (3, 3)]:
        x = randn(2, 3, h, w)
        y = pool(T(x))
        assert y.shape == (2, 3, h, w)
        (t, b_), (l_, r) = same_pads_ref(mode, h, 2, 1), same_pads_ref(mode, w, 2, 1)
        np.testing.assert_allclose(N(y), pool_ref(x, (2, 2), (1, 1), (t, l_, b_, r), is_max), rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize("cls", [layer.MaxPool1d, layer.AvgPool1d])
def test_pooling1d(cls) -> None:
    pool = cls(3, 2, padding=1)
    x = randn(2, 4, 9)
    y = pool(T(x))
    ref = pool_ref(x[:, :, None, :], (1, 3), (1, 2), (0, 1, 0, 1), cls is layer.MaxPool1d)
    assert y.shape == (2, 4, ref.shape[3])
    np.testing.assert_allclose(N(y), ref[:, :, 0, :], rtol=1e-5, atol=1e-5)
    y4 = pool(T(x[:, :, None, :]))  # SINGA's 4-D (N, C, 1, L) form
    np.testing.assert_allclose(N(y4), ref, rtol=1e-5, atol=1e-5)


# -- batch-size changes ---------------------------------------------------------------------------------------------


class SmallCNN(layer.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = layer.Conv2d(4, 3, padding=1)
        self.bn1 = layer.BatchNorm2d()
        self.relu = layer.ReLU()
        self.pool = layer.MaxPool2d(2)
        self.conv2 = layer.Conv2d(6, 3, pad_mode="SAME_UPPER", stride=2)
        self.flat = layer.Flatten()
        self.fc = layer.Linear(3)

    def forward(self, x):
        y = self.pool(self.relu(self.bn1(self.conv1(x))))
        return self.fc(self.flat(self.relu(self.conv2(y))))


def small_cnn_ref(net: SmallCNN, x: np.ndarray, train: bool) -> np.ndarray:
    p = {k: N(v) for k, v in net.get_states().items()}
    y = conv_ref(x, p["conv1.W"], p["conv1.b"], pads=(1, 1, 1, 1))
    if train:
        mean, var = y.mean(axis=(0, 2, 3)), y.var(axis=(0, 2, 3))
    else:
        mean, var = p["bn1.running_mean"], p["bn1.running_var"]
    y = np.maximum(bn_ref(y, p["bn1.scale"], p["bn1.bias"], mean, var), 0)
    y = pool_ref(y, (2, 2), (2, 2))
    t, b_ = same_pads_ref("SAME_UPPER", y.shape[2], 3, 2)
    l_, r = same_pads_ref("SAME_UPPER", y.shape[3], 3, 2)
    y = np.maximum(conv_ref(y, p["conv2.W"], p["conv2.b"], (2, 2), (t, l_, b_, r)), 0)
    return y.reshape(y.shape[0], -1) @ p["fc.W"] + p["fc.b"]


def test_train_at_batch_32_then_evaluate_at_batch_7() -> None:
    net = SmallCNN()
    labels = np.eye(3, dtype=np.float32)
    prev = autograd.training
    try:
        autograd.training = True
        for _ in range(3):
            x = randn(32, 2, 10, 10)
            t = labels[RNG.integers(0, 3, 32)]
            loss = autograd.softmax_cross_entropy(net(T(x)), T(t))
            for p, g in autograd.backward(loss):
                p -= g * 0.05
        rm = N(net.bn1.running_mean)
        assert np.abs(rm).max() > 0  # the running statistics moved
        autograd.training = False
        x7 = randn(7, 2, 10, 10)
        y7 = net(T(x7))
        assert y7.shape == (7, 3)
        np.testing.assert_allclose(N(y7), small_cnn_ref(net, x7, train=False), rtol=1e-3, atol=1e-4)
        np.testing.assert_array_equal(N(net.bn1.running_mean), rm)  # evaluation leaves them alone
        # odd image size too, and training mode with batch-7 statistics
        x5 = randn(5, 2, 11, 13)  # pooled to 5x6: SAME totals 2 and 1 (odd) in conv2
        np.testing.assert_allclose(N(net(T(x5))), small_cnn_ref(net, x5, train=False), rtol=1e-3, atol=1e-4)
        autograd.training = True
        x7b = randn(7, 2, 10, 10)
        np.testing.assert_allclose(N(net(T(x7b))), small_cnn_ref(net, x7b, train=True), rtol=1e-3, atol=1e-4)
    finally:
        autograd.training = prev


# -- recurrent layers ---------------------------------------------------------------------------------------------


def rnn_ref(p: dict, xs: np.ndarray, h0: np.ndarray, num_layers: int, bidirectional: bool, act, bias: bool):
    """xs (seq, batch, in), h0 (L*D, batch, H) -> outputs (seq, batch, D*H), h_n (L*D, batch, H)."""
    D = 2 if bidirectional else 1
    inp = xs.astype(np.float64)
    hn = []
    for layer_i in range(num_layers):
        outs = []
        for d in range(D):
            sfx = "" if (layer_i == 0 and d == 0) else f"_l{layer_i}" + ("_reverse" if d else "")
            h = h0[layer_i * D + d].astype(np.float64)
            out = [None] * len(inp)
            for t in (range(len(inp)) if d == 0 else reversed(range(len(inp)))):
                z = inp[t] @ p["Wx" + sfx] + h @ p["Wh" + sfx] + (p["b" + sfx] if bias else 0)
                h = act(z)
                out[t] = h
            outs.append(np.stack(out))
            hn.append(h)
        inp = np.concatenate(outs, axis=2)
    return inp, np.stack(hn)


def lstm_ref(p: dict, xs: np.ndarray, h0: np.ndarray, c0: np.ndarray, num_layers: int, bidirectional: bool):
    D = 2 if bidirectional else 1
    inp = xs.astype(np.float64)
    hn, cn = [], []
    for layer_i in range(num_layers):
        outs = []
        for d in range(D):
            sfx = "" if (layer_i == 0 and d == 0) else f"_l{layer_i}" + ("_reverse" if d else "")
            h, c = h0[layer_i * D + d].astype(np.float64), c0[layer_i * D + d].astype(np.float64)
            out = [None] * len(inp)

            def gate(g, x, h, sfx=sfx):
                return x @ p[f"Wx_{g}{sfx}"] + p[f"Bx_{g}{sfx}"] + h @ p[f"Wh_{g}{sfx}"] + p[f"Bh_{g}{sfx}"]

            for t in (range(len(inp)) if d == 0 else reversed(range(len(inp)))):
                x = inp[t]
                i, f, o = sigmoid(gate("i", x, h)), sigmoid(gate("f", x, h)), sigmoid(gate("o", x, h))
                g = np.tanh(gate("g", x, h))
                c = f * c + i * g
                h = o * np.tanh(c)
                out[t] = h
            outs.append(np.stack(out))
            hn.append(h)
            cn.append(c)
        inp = np.concatenate(outs, axis=2)
    return inp, np.stack(hn), np.stack(cn)


def randomise(lyr, scale: float = 0.5) -> None:
    """Non-zero biases too, so that a bias mix-up cannot hide."""
    lyr.set_params({k: RNG.uniform(-scale, scale, v.shape).astype(np.float32) for k, v in lyr.get_params().items()})


@pytest.mark.parametrize(("num_layers", "bidirectional", "batch_first", "nonlinearity"),
                         [(1, False, False, "tanh"), (2, False, True, "relu"), (2, True, False, "tanh"),
                          (1, True, True, "relu")])
def test_rnn_forward(num_layers, bidirectional, batch_first, nonlinearity) -> None:
    L, D, H, seq, batch, n_in = num_layers, 2 if bidirectional else 1, 4, 5, 3, 6
    rnn = layer.RNN(n_in, H, num_layers=L, nonlinearity=nonlinearity, batch_first=batch_first,
                    bidirectional=bidirectional)
    xs = randn(seq, batch, n_in)
    h0 = randn(L * D, batch, H)
    x_in = xs.transpose(1, 0, 2) if batch_first else xs
    rnn(T(x_in), T(h0))
    randomise(rnn)
    out, hn = rnn(T(x_in), T(h0))
    p = params_np(rnn)
    expected = {"Wx", "Wh", "b"}
    if L > 1:
        expected |= {"Wx_l1", "Wh_l1", "b_l1"}
    if D == 2:
        expected |= {n + s for n in ("Wx", "Wh", "b") for s in ["_l0_reverse"] + (["_l1_reverse"] if L > 1 else [])}
    assert set(p) == expected
    assert p["Wx"].shape == (n_in, H)
    assert p["Wh"].shape == (H, H)
    assert p["b"].shape == (H,)
    if L > 1:
        assert p["Wx_l1"].shape == (D * H, H)
    act = np.tanh if nonlinearity == "tanh" else (lambda z: np.maximum(z, 0))
    ref_out, ref_h = rnn_ref(p, xs, h0, L, bidirectional, act, True)
    if batch_first:
        ref_out = ref_out.transpose(1, 0, 2)
    assert out.shape == ref_out.shape
    assert hn.shape == (L * D, batch, H)
    np.testing.assert_allclose(N(out), ref_out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(N(hn), ref_h, rtol=1e-4, atol=1e-5)


def test_rnn_singa_list_form_and_defaults() -> None:
    rnn = layer.RNN(3, 4, bias=False)
    steps = [randn(2, 3) for _ in range(4)]
    h0 = randn(2, 4)
    outs, h = rnn([T(s) for s in steps], T(h0))
    assert isinstance(outs, list)
    assert len(outs) == 4
    assert h.shape == (2, 4)
    p = params_np(rnn)
    assert set(p) == {"Wx", "Wh"}
    ref_out, ref_h = rnn_ref(p, np.stack(steps), h0[None], 1, False, np.tanh, False)
    for o, r in zip(outs, ref_out):
        np.testing.assert_allclose(N(o), r, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(N(h), ref_h[0], rtol=1e-4, atol=1e-5)
    # h0 omitted: zeros; step_forward is one step of the recurrence
    outs0, _ = rnn([T(s) for s in steps])
    ref0, _ = rnn_ref(p, np.stack(steps), np.zeros((1, 2, 4)), 1, False, np.tanh, False)
    np.testing.assert_allclose(N(outs0[-1]), ref0[-1], rtol=1e-4, atol=1e-5)
    one = rnn.step_forward(T(steps[0]), T(h0), rnn.Wx, rnn.Wh, None)
    np.testing.assert_allclose(N(one), np.tanh(steps[0] @ p["Wx"] + h0 @ p["Wh"]), rtol=1e-5, atol=1e-6)
    # another batch size on the next call
    out5, h5 = rnn(T(randn(6, 5, 3)))
    assert out5.shape == (6, 5, 4)
    assert h5.shape == (1, 5, 4)
    with pytest.raises(ValueError, match="3"):
        rnn(T(randn(4, 2, 5)))


@pytest.mark.parametrize(("num_layers", "bidirectional", "batch_first"),
                         [(1, False, False), (2, True, True), (2, False, False)])
def test_lstm_forward(num_layers, bidirectional, batch_first) -> None:
    L, D, H, seq, batch, n_in = num_layers, 2 if bidirectional else 1, 3, 4, 2, 5
    lstm = layer.LSTM(n_in, H, num_layers=L, batch_first=batch_first, bidirectional=bidirectional)
    xs = randn(seq, batch, n_in)
    h0, c0 = randn(L * D, batch, H), randn(L * D, batch, H)
    x_in = xs.transpose(1, 0, 2) if batch_first else xs
    lstm(T(x_in), (T(h0), T(c0)))
    randomise(lstm)
    out, (hn, cn) = lstm(T(x_in), (T(h0), T(c0)))
    p = params_np(lstm)
    assert len(p) == 16 * L * D
    assert p["Wx_i"].shape == (n_in, H)
    assert p["Wh_g"].shape == (H, H)
    assert p["Bh_o"].shape == (H,)
    ref_out, ref_h, ref_c = lstm_ref(p, xs, h0, c0, L, bidirectional)
    if batch_first:
        ref_out = ref_out.transpose(1, 0, 2)
    np.testing.assert_allclose(N(out), ref_out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(N(hn), ref_h, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(N(cn), ref_c, rtol=1e-4, atol=1e-5)


def test_lstm_singa_list_form() -> None:
    lstm = layer.LSTM(3, 2)
    steps = [randn(4, 3) for _ in range(3)]
    h0, c0 = randn(4, 2), randn(4, 2)
    lstm([T(s) for s in steps], (T(h0), T(c0)))
    randomise(lstm)
    outs, h, c = lstm([T(s) for s in steps], (T(h0), T(c0)))  # SINGA returns (outputs, h, c)
    ref_out, ref_h, ref_c = lstm_ref(params_np(lstm), np.stack(steps), h0[None], c0[None], 1, False)
    assert len(outs) == 3
    assert h.shape == (4, 2)
    assert c.shape == (4, 2)
    np.testing.assert_allclose(N(outs[1]), ref_out[1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(N(h), ref_h[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(N(c), ref_c[0], rtol=1e-4, atol=1e-5)
    h1, c1 = lstm.step_forward(T(steps[0]), T(h0), T(c0))
    np.testing.assert_allclose(N(h1), ref_out[0], rtol=1e-4, atol=1e-5)


# -- layers without parameters ------------------------------------------------------------------------------------


def test_simple_layers() -> None:
    x, y = randn(4, 6), randn(4, 6)
    np.testing.assert_allclose(N(layer.ReLU()(T(x))), np.maximum(x, 0))
    np.testing.assert_allclose(N(layer.Sigmoid()(T(x))), sigmoid(x.astype(np.float64)), rtol=1e-5)
    np.testing.assert_allclose(N(layer.Add()(T(x), T(y))), x + y, rtol=1e-6)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(N(layer.SoftMax()(T(x))), e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    z = randn(2, 3, 4, 5)
    assert layer.Flatten()(T(z)).shape == (2, 60)
    np.testing.assert_array_equal(N(layer.Flatten(2)(T(z))), z.reshape(6, 20))
    np.testing.assert_array_equal(N(layer.Cat(1)([T(x), T(y)])), np.concatenate([x, y], 1))
    np.testing.assert_array_equal(N(layer.Reshape()(T(z), (6, 20))), z.reshape(6, 20))


def test_loss_layers() -> None:
    x = randn(5, 4)
    labels = RNG.integers(0, 4, 5)
    onehot = np.eye(4, dtype=np.float32)[labels]
    lsm = x - x.max(axis=1, keepdims=True)
    lsm = lsm - np.log(np.exp(lsm).sum(axis=1, keepdims=True))
    assert scalar(layer.SoftMaxCrossEntropy()(T(x), T(onehot))) == pytest.approx(-lsm[range(5), labels].mean(),
                                                                                  rel=1e-5)
    t = randn(5, 4)
    assert scalar(layer.MeanSquareError()(T(x), T(t))) == pytest.approx(((x - t) ** 2).sum() / (2 * 5), rel=1e-5)
    prob = sigmoid(x.astype(np.float64))
    target = (RNG.random((5, 4)) > 0.5).astype(np.float32)
    # SINGA's definition guards the logarithms with 1e-4
    bce = -(target * np.log(prob + 1e-4) + (1 - target) * np.log(1 - prob + 1e-4)).sum() / 5
    assert scalar(layer.BinaryCrossEntropy()(T(prob), T(target))) == pytest.approx(bce, rel=1e-4)
    sm = np.exp(lsm)
    assert scalar(layer.CrossEntropy()(T(sm), T(onehot))) == pytest.approx(-lsm[range(5), labels].mean(), rel=1e-4)


def test_dropout_layer() -> None:
    x = np.ones((200, 100), np.float32)
    d = layer.Dropout(0.3)
    prev = autograd.training
    try:
        autograd.training = False
        np.testing.assert_array_equal(N(d(T(x))), x)
        autograd.training = True
        y = N(d(T(x)))
        kept = y != 0
        assert kept.mean() == pytest.approx(0.7, abs=0.02)
        np.testing.assert_allclose(y[kept], 1 / 0.7, rtol=1e-5)
    finally:
        autograd.training = prev
    with pytest.raises(ValueError, match="ratio"):
        layer.Dropout(1.0)


# -- gradients ------------------------------------------------------------------------------------------------------


def _loss(y, target):
    return autograd.mse_loss(y, target)


GRAD_CASES = {
    "linear": (lambda: layer.Linear(3), (4, 5)),
    "gemm": (lambda: layer.Gemm(3, transB=True), (4, 5)),
    "conv": (lambda: layer.Conv2d(4, 3, stride=2, group=2, pad_mode="SAME_LOWER"), (2, 2, 5, 5)),
    "separable": (lambda: layer.SeparableConv2d(3, 3, padding=1, bias=True), (2, 2, 4, 4)),
    "batchnorm": (lambda: layer.BatchNorm2d(), (4, 3, 2, 2)),
    "net": (Net, (3, 2, 6, 6)),
}


@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_backward_yields_every_parameter(case, training) -> None:
    make, shape = GRAD_CASES[case]
    lyr = make()
    x = T(randn(*shape))
    y = lyr(x)
    y = autograd.flatten(y) if len(y.shape) > 2 else y
    grads = grads_by_param(_loss(y, T(randn(*y.shape))))
    params = lyr.get_params()
    assert set(grads) == {id(p) for p in params.values()}
    for name, p in params.items():
        g = N(grads[id(p)])
        assert g.shape == p.shape, name
        assert np.isfinite(g).all(), name
        assert np.abs(g).max() > 0, name


def test_embedding_gradient_and_freeze(training) -> None:
    ids = T(np.array([[0, 2], [2, 1]]), np.int32)
    emb = layer.Embedding(4, 3)
    y = emb(ids)
    target = randn(2, 2, 3)
    g = grads_by_param(_loss(autograd.reshape(y, (2, 6)), T(target.reshape(2, 6))))
    gw = N(g[id(emb.W)])
    assert gw.shape == (4, 3)
    np.testing.assert_array_equal(gw[3], 0)  # row 3 was never looked up
    assert np.abs(gw[2]).max() > 0
    frozen = layer.Embedding(4, 3).from_pretrained(randn(4, 3))
    assert grads_by_param(_loss(autograd.reshape(frozen(ids), (2, 6)), T(target.reshape(2, 6)))) == {}


def _fd_check(lyr, run, n_checks: int = 1) -> None:
    """Compare backward's gradients with central differences at n_checks random elements of every parameter."""
    prev = autograd.training
    autograd.training = True
    loss = run()
    grads = grads_by_param(loss)
    autograd.training = False
    params = lyr.get_params()
    assert set(grads) == {id(p) for p in params.values()}
    eps = 1e-2
    for name, p in params.items():
        base = p.to_numpy().copy()
        g = N(grads[id(p)]).reshape(-1)
        for idx in RNG.choice(base.size, size=min(n_checks, base.size), replace=False):
            vals = []
            for sign in (1, -1):
                pert = base.copy().reshape(-1)
                pert[idx] += sign * eps
                p.copy_from_numpy(pert.reshape(base.shape))
                vals.append(scalar(run()))
            p.copy_from_numpy(base)
            fd = (vals[0] - vals[1]) / (2 * eps)
            assert g[idx] == pytest.approx(fd, rel=3e-2, abs=2e-3), f"{name}[{idx}]"
    autograd.training = prev


def test_rnn_gradients_match_finite_differences() -> None:
    rnn = layer.RNN(3, 4, num_layers=2, bidirectional=True, batch_first=True)
    x, h0 = T(randn(2, 5, 3)), T(randn(4, 2, 4))
    target = T(randn(2, 40))
    rnn(x, h0)
    randomise(rnn)

    def run():
        out, h = rnn(x, h0)
        return autograd.add(_loss(autograd.reshape(out, (2, 40)), target), _loss(autograd.reshape(h, (4, 8)),
                                                                               T(np.zeros((4, 8), np.float32))))

    _fd_check(rnn, run)


def test_lstm_gradients_match_finite_differences() -> None:
    lstm = layer.LSTM(3, 2, num_layers=2, bidirectional=True)
    x, h0, c0 = T(randn(4, 2, 3)), T(randn(4, 2, 2)), T(randn(4, 2, 2))
    target = T(randn(2, 16))
    lstm(x, (h0, c0))
    randomise(lstm)

    def run():
        out, (h, c) = lstm(x, (h0, c0))
        y = autograd.reshape(autograd.transpose(out, (1, 0, 2)), (2, 16))
        return autograd.add(_loss(y, target), _loss(autograd.reshape(c, (4, 4)), T(np.ones((4, 4), np.float32))))

    _fd_check(lstm, run)
