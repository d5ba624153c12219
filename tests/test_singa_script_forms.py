"""SINGA scripts' argument forms and behaviours (issue 13, items 4 and 6), each checked against numpy (float64) or
against the other form of the same call.

- losses: SINGA 4's `MeanSquareError(t)(x)` and SINGA 3's `MeanSquareError()(x, t)` (likewise CrossEntropy,
  BinaryCrossEntropy, SoftMaxCrossEntropy), `mse_loss(x, t)`; the target shapes SINGA takes;
- `onehot(axis, indices, depth, values)` with numpy or Tensor arguments;
- RNN / LSTM initial states in SINGA's shapes (2-D, broadcasting like any operand);
- invalid inputs raise errors that SINGA's `except AssertionError` and our `except ValueError` both catch;
- `autograd.tile` with fewer repeats than axes (SINGA's leading-axes rule);
- graph mode never calls a model's `get_states()` before its first forward;
- `from singa import singa_wrap` and its build flags;
- `layer.CudnnRNN` (SINGA's cuDNN RNN class; the generic RNN on backends without a fused one) against torch.
"""

from __future__ import annotations

import numpy as np
import pytest

from singa import autograd, device, layer, model, opt, plugins
from singa.tensor import Tensor

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")

DEV = device.get_default_device()
RNG = np.random.default_rng(13)


def T(a, **kw) -> Tensor:
    return Tensor(device=DEV, data=np.asarray(a), **kw)


def P(a) -> Tensor:
    """A parameter: its gradient is handed out by backward."""
    return Tensor(device=DEV, data=np.asarray(a, np.float32), requires_grad=True, stores_grad=True)


def _loss_and_grad(loss: Tensor, x: Tensor) -> tuple[float, np.ndarray]:
    return float(loss.to_numpy()[0]), autograd.gradients(loss)[x].to_numpy()


# -- losses ----------------------------------------------------------------------------------------------------------


def test_mse_both_forms_and_singas_value(training):
    x = np.array([4.3, 5.4, 3.3, 3.6, 5.7, 6.0], np.float32).reshape(3, 2)
    t = np.array([4.4, 5.3, 3.2, 3.7, 5.4, 6.3], np.float32).reshape(3, 2)
    want = ((x.astype(np.float64) - t) ** 2).sum() / (2 * 3)  # SINGA's: sum of squares / (2 N)
    got = []
    for call in (lambda xt, tt: autograd.mse_loss(xt, tt), lambda xt, tt: autograd.MeanSquareError(tt)(xt)[0],
                 lambda xt, tt: autograd.MeanSquareError()(xt, tt)[0], lambda xt, tt: layer.MeanSquareError()(xt, tt)):
        xt = P(x)
        loss = call(xt, T(t))
        assert loss.shape == (1,)
        got.append(_loss_and_grad(loss, xt))
    for lv, g in got:
        assert lv == pytest.approx(want, rel=1e-5)
        np.testing.assert_allclose(g, (x - t) / 3, rtol=1e-5, atol=1e-7)
    # SINGA 3's backward of the two-input form returns (dx, None)
    xt = P(x)
    op = autograd.MeanSquareError()
    op(xt, T(t))
    dx, dt = op.backward()
    assert dt is None
    np.testing.assert_allclose(dx.to_numpy(), (x - t) / 3, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("cls", [autograd.CrossEntropy, autograd.BinaryCrossEntropy, autograd.SoftMaxCrossEntropy])
def test_loss_constructor_and_input_forms_agree(training, cls):
    p = RNG.uniform(0.05, 0.95, (4, 3)).astype(np.float32)
    t = np.eye(3, dtype=np.float32)[[0, 2, 1, 2]]
    x0 = P(p)
    ref = _loss_and_grad(cls(T(t))(x0)[0], x0)
    xt = P(p)
    b = cls()(xt, T(t))[0]
    got = _loss_and_grad(b, xt)
    assert got[0] == pytest.approx(ref[0], rel=1e-6)
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-6)
    with pytest.raises(ValueError, match="no target"):
        cls()(P(p))


@pytest.mark.parametrize("fn", [autograd.softmax_cross_entropy, autograd.cross_entropy], ids=["softmax_xent", "xent"])
def test_cross_entropy_target_shapes(training, fn):
    logits = RNG.standard_normal((4, 3)).astype(np.float32)
    x = logits if fn is autograd.softmax_cross_entropy else \
        np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    labels = np.array([2, 0, 1, 1])
    onehot = np.eye(3)[labels]
    # the reference, float64: the mean over the batch of -log p[label]
    p = np.exp(logits.astype(np.float64))
    p /= p.sum(1, keepdims=True)
    want = -np.log(p[np.arange(4), labels]).mean()
    for t in (labels.astype(np.int32), labels, labels.reshape(4, 1).astype(np.int32), labels.astype(np.float32),
              onehot.astype(np.float32), onehot.astype(np.int32), [2, 0, 1, 1], onehot.tolist()):
        xt = P(x)
        tt = T(t) if isinstance(t, np.ndarray) else t
        loss = fn(xt, tt)
        assert float(loss.to_numpy()[0]) == pytest.approx(want, rel=1e-5), (np.asarray(t).dtype, np.shape(t))


# -- onehot ---------------------------------------------------------------------------------------------------------


def test_onehot_with_numpy_or_tensor_arguments():
    idx = np.array([[0, 2], [1, -1]])
    want = np.where(np.arange(3) == np.where(idx < 0, idx + 3, idx)[..., None], 5.0, -1.0)
    forms = [(idx, 3, np.array([-1.0, 5.0])), (T(idx.astype(np.int32)), np.array([3]), [-1.0, 5.0]),
             (idx.astype(np.float32), T(np.array([3], np.int64)), T(np.array([-1.0, 5.0], np.float32))),
             (idx.tolist(), 3.0, (-1, 5))]
    for indices, depth, values in forms:
        y = autograd.onehot(-1, indices, depth, values)
        assert isinstance(y, Tensor)
        np.testing.assert_array_equal(y.to_numpy(), want)
    y = autograd.onehot(0, idx, 3, np.array([0.0, 1.0]))
    np.testing.assert_array_equal(y.to_numpy(), np.moveaxis(want == 5.0, -1, 0).astype(np.float32))


# -- RNN / LSTM initial states -------------------------------------------------------------------------------------


def _lstm_ref(xs, h, c, lstm):
    """numpy LSTM with SINGA's per-gate parameters (float64)."""
    g = {k: lstm.__dict__[k].to_numpy().astype(np.float64) for k in lstm.get_params()}
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    outs = []
    for x in xs:
        z = {q: x @ g[f"Wx_{q}"] + g[f"Bx_{q}"] + h @ g[f"Wh_{q}"] + g[f"Bh_{q}"] for q in "ifog"}
        c = sig(z["f"]) * c + sig(z["i"]) * np.tanh(z["g"])
        h = sig(z["o"]) * np.tanh(c)
        outs.append(h)
    return outs, h, c


def test_lstm_states_in_singas_shapes(training):
    """SINGA's LSTM takes a list of (batch, input) steps and 2-D states that broadcast like any operand (its own
    tests pass c0 of shape (batch, 1))."""
    xs = [RNG.standard_normal((2, 3)).astype(np.float32) for _ in range(3)]
    h0 = np.zeros((2, 2), np.float32)
    c0 = RNG.random((2, 1)).astype(np.float32)
    lstm = layer.LSTM(3, 2)
    hs, h, c = lstm([T(x) for x in xs], (T(h0), T(c0)))
    assert [y.shape for y in hs] == [(2, 2)] * 3
    assert h.shape == c.shape == (2, 2)
    ref, rh, rc = _lstm_ref(xs, h0.astype(np.float64), np.broadcast_to(c0, (2, 2)).astype(np.float64), lstm)
    for y, r in zip(hs, ref):
        np.testing.assert_allclose(y.to_numpy(), r, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c.to_numpy(), rc, rtol=1e-5, atol=1e-6)
    loss = autograd.softmax_cross_entropy(hs[0], T(RNG.random((2, 2)).astype(np.float32)))
    for y in hs[1:]:
        loss = autograd.add(loss, autograd.softmax_cross_entropy(y, T(RNG.random((2, 2)).astype(np.float32))))
    for p, g in autograd.backward(loss):
        assert g.shape == p.shape


def test_rnn_state_of_singas_shape(training):
    xs = [RNG.standard_normal((2, 3)).astype(np.float32) for _ in range(2)]
    rnn = layer.RNN(3, 4)
    for h0 in (np.zeros((2, 4), np.float32), np.zeros((1, 4), np.float32), np.zeros((4,), np.float32)):
        hs, h = rnn([T(x) for x in xs], T(h0))
        assert h.shape == (2, 4)
        w = {k: rnn.__dict__[k].to_numpy().astype(np.float64) for k in ("Wx", "Wh", "b")}
        hr = np.zeros((2, 4))
        for x in xs:
            hr = np.tanh(x @ w["Wx"] + hr @ w["Wh"] + w["b"])
        np.testing.assert_allclose(h.to_numpy(), hr, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="h0 must have shape"):
        rnn([T(x) for x in xs], T(np.zeros((3, 4), np.float32)))


# -- error types ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [
    lambda: autograd.add(T(np.ones((2, 3), np.float32)), T(np.ones((4,), np.float32))),  # cannot broadcast
    lambda: autograd.matmul(T(np.ones((2, 3), np.float32)), T(np.ones((4, 5), np.float32))),
    lambda: autograd.reshape(T(np.ones((2, 3), np.float32)), (4, 2)),
    lambda: autograd.softmax_cross_entropy(T(np.ones((2, 3), np.float32)), T(np.array([0, 1, 2]))),
    lambda: autograd.exp(T(np.ones(2, np.int32))),  # a dtype the operator does not take
    lambda: layer.Conv2d(2, 3)(T(np.ones((2, 3), np.float32))),  # a layer's own check
    lambda: layer.LSTM(3, 2)([T(np.ones((2, 4), np.float32))]),
], ids=["broadcast", "matmul", "reshape", "target", "dtype", "conv-rank", "lstm-size"])
def test_invalid_inputs_are_both_assertion_and_value_errors(bad):
    with pytest.raises(AssertionError) as info:  # what SINGA's scripts catch (its operators assert)
        bad()
    assert isinstance(info.value, ValueError)  # and what ours document (TypeError for a dtype is one too)


# -- tile --------------------------------------------------------------------------------------------------------------


def test_tile_with_fewer_repeats_than_axes_pads_as_singa(training):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = P(a)
    y = autograd.tile(x, [2])  # SINGA repeats the leading axis: (4, 3); numpy.tile would give (2, 6)
    np.testing.assert_array_equal(y.to_numpy(), np.concatenate([a, a], 0))
    np.testing.assert_array_equal(autograd.tile(x, 3).to_numpy(), np.concatenate([a] * 3, 0))
    np.testing.assert_array_equal(autograd.tile(x, [2, 2]).to_numpy(), np.tile(a, [2, 2]))
    np.testing.assert_array_equal(autograd.tile(x, [2, 1, 2]).to_numpy(), np.tile(a, [2, 1, 2]))
    w = RNG.standard_normal((4, 3)).astype(np.float32)
    g = autograd.gradients(autograd.reduce_sum(autograd.mul(y, T(w)), None, 0))[x].to_numpy()
    np.testing.assert_allclose(g, w[:2] + w[2:], rtol=1e-6)


# -- graph mode and a model's own get_states ----------------------------------------------------------------------


class _StatesBeforeForwardFail(model.Model):
    """A model whose get_states() only works once its layers exist (as a user's override may)."""

    def __init__(self):
        super().__init__()
        self.fc = layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc(x)

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss

    def get_states(self):
        return {"fc.W": self.fc.W, "fc.b": self.fc.b}  # AttributeError before the first forward


def test_graph_mode_never_asks_for_states_before_the_first_forward():
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    y = np.array([0, 1, 2, 1], np.int32)
    losses = {}
    for use_graph in (False, True):
        DEV.SetRandSeed(4)
        m = _StatesBeforeForwardFail()
        m.optimizer = opt.SGD(0.1)
        m.graph(use_graph)  # graph mode without compile: the first step itself creates the parameters
        m.train()
        tx, ty = T(x), T(y)
        losses[use_graph] = [float(m(tx, ty)[1].to_numpy()[0]) for _ in range(4)]
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-6)
    assert losses[True][-1] < losses[True][0]


# -- singa_wrap -------------------------------------------------------------------------------------------------------


def test_singa_wrap_flags_follow_what_is_installed():
    from singa import singa_wrap

    reg = plugins.registry()
    cuda = reg.backends.get("cuda")
    assert singa_wrap.USE_CUDA is bool(cuda is not None and cuda.device_count() > 0)
    opencl = reg.backends.get("opencl")
    assert singa_wrap.USE_OPENCL is bool(opencl is not None and opencl.device_count() > 0)
    try:
        import mpi4py  # noqa: F401
        have_mpi = True
    except ImportError:
        have_mpi = False
    assert singa_wrap.USE_DIST is (have_mpi or bool(reg.communicators))
    assert singa_wrap.USE_PYTHON3 is True
    assert isinstance(singa_wrap.USE_DNNL, bool)
    if singa_wrap.USE_CUDA:  # a script's usual guard
        assert device.get_num_gpus() > 0
    with pytest.raises(AttributeError, match=r"SWIG.*singa\.tensor"):
        singa_wrap.Tensor  # noqa: B018
    with pytest.raises(AttributeError, match="GpuConvForward"):
        singa_wrap.GpuConvForward  # noqa: B018
    assert not hasattr(singa_wrap, "CpuConvForward")


def test_singa_wrap_use_cuda_with_a_cuda_plugin(monkeypatch):
    """USE_CUDA is asked of the plugin registry: a backend named 'cuda' with at least one device."""
    from singa import singa_wrap
    from singa.backend import Backend

    class FakeCuda(Backend):
        name = "cuda"

        def __init__(self, n):
            self.n = n

        def device_count(self):
            return self.n

    reg = plugins.registry()
    for n, want in ((0, False), (2, True)):
        monkeypatch.setitem(reg.backends, "cuda", FakeCuda(n))
        assert singa_wrap.USE_CUDA is want


# -- layer.CudnnRNN against torch.nn (the same flat weight layout: cuDNN's canonical one) ----------------------------

try:
    import torch
except ImportError:  # the other tests still run
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch.nn's RNNs are the reference")


def _torch_rnn(mode, n_in, H, L, bidir, bias):
    cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}.get(mode)
    if cls is None:
        return torch.nn.RNN(n_in, H, L, nonlinearity=mode, bias=bias, bidirectional=bidir).double()
    return cls(n_in, H, L, bias=bias, bidirectional=bidir).double()


def _load_torch(net, spec, W):
    w = W.to_numpy().astype(np.float64)
    names = {"w_ih": "weight_ih", "w_hh": "weight_hh", "b_ih": "bias_ih", "b_hh": "bias_hh"}
    with torch.no_grad():
        for layer_, d, name, off, shape in spec.layout():
            p = getattr(net, f"{names[name]}_l{layer_}" + ("_reverse" if d else ""))
            p.copy_(torch.from_numpy(w[off:off + int(np.prod(shape))].reshape(shape)))


def _torch_grad(net, spec):
    names = {"w_ih": "weight_ih", "w_hh": "weight_hh", "b_ih": "bias_ih", "b_hh": "bias_hh"}
    return np.concatenate([getattr(net, f"{names[n]}_l{la}" + ("_reverse" if d else "")).grad.numpy().reshape(-1)
                           for la, d, n, _, _ in spec.layout()])


CASES = [("lstm", 1, False, True), ("gru", 2, True, True), ("tanh", 2, False, True), ("relu", 1, True, False),
         ("lstm", 2, True, False)]


@needs_torch
@pytest.mark.parametrize(("mode", "L", "bidir", "bias"), CASES, ids=[f"{m}-L{n}-{'bi' if b else 'uni'}"
                                                                      + ("" if c else "-nobias") for m, n, b, c in
                                                                      CASES])
def test_cudnn_rnn_matches_torch(training, mode, L, bidir, bias):
    B, Tn, F, H = 3, 4, 5, 6
    D = 2 if bidir else 1
    x = RNG.standard_normal((B, Tn, F)).astype(np.float32)  # batch first, SINGA's default
    h0 = RNG.standard_normal((L * D, B, H)).astype(np.float32) * 0.5
    c0 = RNG.standard_normal((L * D, B, H)).astype(np.float32) * 0.5
    r = RNG.standard_normal((B, Tn, D * H)).astype(np.float32)
    net = layer.CudnnRNN(H, num_layers=L, bias=bias, bidirectional=bidir, rnn_mode=mode)
    xt = T(x)
    y = net(xt, T(h0), T(c0) if mode == "lstm" else None)
    assert y.shape == (B, Tn, D * H)
    assert list(net.get_params()) == ["W"]
    assert net.W.shape == (net.spec.weight_size(),)
    grads = autograd.gradients(autograd.reduce_sum(autograd.mul(y, T(r)), None, 0))

    tnet = _torch_rnn(mode, F, H, L, bidir, bias)
    _load_torch(tnet, net.spec, net.W)
    tx = torch.from_numpy(x.astype(np.float64).transpose(1, 0, 2))
    th = torch.from_numpy(h0.astype(np.float64))
    if mode == "lstm":
        ty, (thy, tcy) = tnet(tx, (th, torch.from_numpy(c0.astype(np.float64))))
    else:
        ty, thy = tnet(tx, th)
    (ty.permute(1, 0, 2) * torch.from_numpy(r.astype(np.float64))).sum().backward()
    np.testing.assert_allclose(y.to_numpy(), ty.detach().numpy().transpose(1, 0, 2), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(net.hy.to_numpy(), thy.detach().numpy(), rtol=1e-4, atol=1e-5)
    if mode == "lstm":
        np.testing.assert_allclose(net.cy.to_numpy(), tcy.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grads[net.W].to_numpy(), _torch_grad(tnet, net.spec), rtol=1e-3, atol=1e-4)


@needs_torch
@pytest.mark.parametrize("bidir", [False, True], ids=["uni", "bi"])
def test_cudnn_rnn_masks_and_last_step_match_torch_packed_sequences(training, bidir):
    B, Tn, F, H = 4, 5, 3, 4
    D = 2 if bidir else 1
    lengths = np.array([5, 2, 4, 1])
    x = RNG.standard_normal((Tn, B, F)).astype(np.float32)
    net = layer.CudnnRNN(H, batch_first=False, bidirectional=bidir, rnn_mode="gru", use_mask=True,
                         return_sequences=True)
    y = net(T(x), seq_lengths=T(lengths.astype(np.int32)))
    last = layer.CudnnRNN(H, batch_first=False, bidirectional=bidir, rnn_mode="gru", use_mask=True,
                          return_sequences=False)
    last(T(x), seq_lengths=lengths)
    last.W.copy_data(net.W)
    y_last = last(T(x), seq_lengths=lengths)
    assert y_last.shape == (B, D * H)

    tnet = _torch_rnn("gru", F, H, 1, bidir, True)
    _load_torch(tnet, net.spec, net.W)
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.from_numpy(x.astype(np.float64)), lengths,
                                                     enforce_sorted=False)
    out, th = tnet(packed)
    ty, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=Tn)
    ty = ty.detach().numpy()
    np.testing.assert_allclose(y.to_numpy(), ty, rtol=1e-4, atol=1e-5)  # zeros past each length
    np.testing.assert_allclose(net.hy.to_numpy(), th.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(y_last.to_numpy(), ty[lengths - 1, np.arange(B)], rtol=1e-4, atol=1e-5)


def test_cudnn_rnn_takes_singas_arguments():
    net = layer.CudnnRNN(8, "relu", 2, True, True, 0.0, False, "vanilla", False, True)  # positional, as SINGA's
    assert net.rnn_mode == "relu"
    assert layer.CudnnRNN(4, rnn_mode="LSTM").rnn_mode == "lstm"
    with pytest.raises(ValueError, match="rnn_mode"):
        layer.CudnnRNN(4, rnn_mode="transformer")
    y = net(T(RNG.standard_normal((2, 3, 5)).astype(np.float32)))
    assert y.shape == (2, 3, 8)
    with pytest.raises(ValueError, match="seq_lengths"):
        layer.CudnnRNN(4, use_mask=True)(T(np.ones((2, 3, 5), np.float32)))
    assert DEV.rnn_operator(net.spec) is None or callable(DEV.rnn_operator(net.spec))


class _FakeFused:
    """What a backend's fused RNN looks like to the core: called as op(x, hx, cx, W) -> (y, hy, cy)."""

    def __init__(self, spec, lengths, scale=1.0):
        self.spec, self.lengths, self.scale, self.calls = spec, lengths, scale, 0

    def __call__(self, x, hx, cx, w):
        from singa import rnn

        self.calls += 1
        y, hy, cy = rnn.forward(self.spec, x, hx, cx, w, self.lengths)
        return (autograd.mul(y, self.scale) if self.scale != 1.0 else y), hy, cy


def test_a_backends_fused_rnn_is_used_and_checked(monkeypatch, training):
    """How the CUDA backend plugs cuDNN in: Device.rnn_operator returns the fused operator, CudnnRNN calls it, and
    the conformance suite compares it with the generic RNN (a wrong one fails there)."""
    from singa.testing.conformance import test_fused

    made = []

    def rnn_operator(spec, seq_lengths=None):
        made.append(_FakeFused(spec, seq_lengths))
        return made[-1]

    monkeypatch.setattr(DEV, "rnn_operator", rnn_operator)
    x = T(RNG.standard_normal((2, 3, 5)).astype(np.float32))
    net = layer.CudnnRNN(4, rnn_mode="gru", bidirectional=True)
    y = net(x)
    assert len(made) == 1
    assert made[0].calls == 1
    monkeypatch.setattr(DEV, "rnn_operator", lambda spec, seq_lengths=None: None)
    np.testing.assert_array_equal(net(x).to_numpy(), y.to_numpy())  # the generic path gives the same
    spec = test_fused.SPECS[0]
    monkeypatch.setattr(DEV, "rnn_operator", rnn_operator)
    test_fused.test_fused_rnn_matches_the_generic_one(DEV, spec, True)
    monkeypatch.setattr(DEV, "rnn_operator", lambda s, seq_lengths=None: _FakeFused(s, seq_lengths, 1.01))
    with pytest.raises(AssertionError, match="Not equal to tolerance"):
        test_fused.test_fused_rnn_matches_the_generic_one(DEV, spec, False)


# -- backward twice: SINGA's GAN example back-propagates a loss itself, then calls the optimizer on the same loss -----


class _Gan(model.Model):
    def __init__(self):
        super().__init__()
        self.gen_fc = layer.Linear(6)
        self.gen_act = layer.Sigmoid()
        self.dis_fc = layer.Linear(1)
        self.dis_act = layer.Sigmoid()
        self.bce = layer.BinaryCrossEntropy()

    def forward(self, x):
        return self.dis_act(self.dis_fc(self.gen_act(self.gen_fc(x))))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.bce(out, y)
        first = {}
        for p, g in autograd.backward(loss):  # only the generator's parameters, by name
            first[p.name] = g.to_numpy().copy()
            if "gen" in p.name:
                self.optimizer.apply(p.name, p, g)
        self.optimizer(loss)  # the second backward over the same graph
        return out, loss, first


def test_backward_then_optimizer_on_the_same_loss():
    DEV.SetRandSeed(9)
    x = T(RNG.standard_normal((4, 3)).astype(np.float32))
    y = T(np.array([[1.0], [0.0], [1.0], [0.0]], np.float32))
    m = _Gan()
    m.optimizer = opt.SGD(0.5)
    m.compile([x], is_train=True)
    before = {k: v.to_numpy().copy() for k, v in m.get_params().items()}
    out, loss, first = m(x, y)
    assert sorted(first) == sorted(before)
    after = {k: v.to_numpy() for k, v in m.get_params().items()}
    # the discriminator's output layer: updated once by opt(loss) with the same gradient as the first backward
    # (its gradient does not depend on the generator's weights, which apply() changed in between)
    for k in ("dis_fc.W", "dis_fc.b"):
        np.testing.assert_allclose(after[k], before[k] - 0.5 * first[k], rtol=1e-5, atol=1e-6)
    for k in ("gen_fc.W", "gen_fc.b"):  # the generator: updated twice, both times with the same gradient (what
        # reaches it flows through the discriminator, which apply() left alone)
        np.testing.assert_allclose(after[k], before[k] - 2 * 0.5 * first[k], rtol=1e-5, atol=1e-6)
    assert m.optimizer.step_counter.to_numpy()[0] == 1
