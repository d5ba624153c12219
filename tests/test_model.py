"""singa.model.Model: compile, modes, graph mode against eager mode, checkpoints.

Graph mode must give eager mode's numbers (same model, weights and data; sequential and dependency-scheduled
replays) while replaying the recorded kernels without running Python autograd, and with a lower memory peak.
"""

from __future__ import annotations

import gc
import json
import os
import warnings
import zipfile

import numpy as np
import pytest
from helpers import CNN, MLP, run_threads

from singa import autograd, checkpoint, device, graph, layer, model, opt, tensor
from singa.tensor import Tensor

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")

RTOL = 1e-5


@pytest.fixture(scope="module")
def dev():
    return device.get_default_device()


# -- the seed's Model API example (docs: autograd.md; its MLP is helpers.MLP), as printed ------------------------------


def test_seed_example_runs_as_printed(dev, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    batch_size, IMG_SIZE, num_classes, num_train_batch = 16, 4, 10, 4
    rng = np.random.default_rng(0)

    # create a model instance
    model_ = MLP()
    # initialize optimizer and attach it to the model
    sgd = opt.SGD(lr=0.005, momentum=0.9, weight_decay=1e-5)
    model_.set_optimizer(sgd)
    # input and target placeholders for the model (the page's placeholders are images for its CNN; the MLP it
    # prints takes rows, so the images come flattened)
    tx = tensor.Tensor((batch_size, IMG_SIZE * IMG_SIZE), dev, tensor.float32)
    ty = tensor.Tensor((batch_size, num_classes), dev, tensor.int32)
    # compile the model before training
    model_.compile([tx], is_train=True, use_graph=True, sequential=False)

    # train the model iteratively
    for b in range(num_train_batch):  # noqa: B007 - as printed
        # generate the next mini-batch
        x = rng.standard_normal((batch_size, IMG_SIZE * IMG_SIZE)).astype(np.float32)
        y = np.eye(num_classes, dtype=np.int32)[rng.integers(0, num_classes, batch_size)]  # one-hot, as ty

        # Copy the data into input tensors
        tx.copy_from_numpy(x)
        ty.copy_from_numpy(y)

        # Training with one batch
        out, loss = model_(tx, ty)
        assert out.shape == (batch_size, num_classes)
        assert np.isfinite(loss.to_numpy()).all()
    assert model_.graph_summary() is not None

    # define the path to save the checkpoint
    checkpointpath = "checkpoint.zip"

    # save a checkpoint
    model_.save_states(fpath=checkpointpath)

    # load a checkpoint
    if os.path.exists(checkpointpath):
        model_.load_states(fpath=checkpointpath)
    assert os.listdir(".") == ["checkpoint.zip"]


# -- data for the comparisons (models: helpers.MLP and helpers.CNN) ---------------------------------------------------


def _cnn_data(n, batch=4, size=8, classes=5, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, 1, size, size)).astype(np.float32),
             rng.integers(0, classes, batch).astype(np.int32)) for _ in range(n)]


def _mlp_data(n, batch=8, features=12, classes=10, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, features)).astype(np.float32),
             rng.integers(0, classes, batch).astype(np.int32)) for _ in range(n)]


def _train(dev, make_model, make_opt, data, use_graph, sequential=False):
    dev.set_rand_seed(123)  # same initial weights and dropout masks in every mode
    m = make_model()
    m.optimizer = make_opt()
    x0, y0 = data[0]
    tx = Tensor(x0.shape, dev, tensor.float32)
    ty = Tensor(y0.shape, dev, tensor.int32)
    m.compile([tx], is_train=True, use_graph=use_graph, sequential=sequential)
    losses = []
    for x, y in data:
        tx.copy_from_numpy(x)
        ty.copy_from_numpy(y)
        out, loss = m(tx, ty)
        losses.append(float(loss.to_numpy()[0]))
    return m, np.array(losses)


def _assert_same(m_a, m_b, rtol=RTOL):
    sa, sb = m_a.get_states(), m_b.get_states()
    assert sa.keys() == sb.keys()
    for k in sa:
        np.testing.assert_allclose(sb[k].to_numpy(), sa[k].to_numpy(), rtol=rtol, atol=1e-6, err_msg=k)


CASES = {
    "mlp-sgd": (MLP, lambda: opt.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4), _mlp_data(6)),
    "mlp-adam-schedule": (MLP, lambda: opt.Adam(opt.ExponentialDecay(0.01, 2, 0.9, staircase=True)), _mlp_data(6)),
    "cnn-sgd-nesterov": (CNN, lambda: opt.SGD(lr=0.05, momentum=0.9, nesterov=True), _cnn_data(5)),
    "cnn-rmsprop": (lambda: CNN(dropout=0.0), lambda: opt.RMSProp(0.01), _cnn_data(5)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_graph_equals_eager(dev, case):
    make_model, make_opt, data = CASES[case]
    m_e, l_e = _train(dev, make_model, make_opt, data, use_graph=False)
    assert m_e.graph_summary() is None
    for seq in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("error", graph.GraphWarning)  # graph mode must really be used
            m_g, l_g = _train(dev, make_model, make_opt, data, use_graph=True, sequential=seq)
        assert m_g.graph_summary() is not None
        np.testing.assert_allclose(l_g, l_e, rtol=RTOL)
        _assert_same(m_e, m_g)  # parameters, BatchNorm running statistics
        np.testing.assert_allclose(m_g.optimizer.step_counter.to_numpy(), len(data))
    assert len(set(np.round(l_e, 5))) > 1


def test_replay_runs_no_python(dev, monkeypatch):
    calls = {"forward": 0}

    class Counting(MLP):
        def forward(self, inputs):
            calls["forward"] += 1
            return super().forward(inputs)

    data = _mlp_data(4)
    m = Counting()
    m.optimizer = opt.SGD(0.1)
    tx, ty = Tensor((8, 12), dev), Tensor((8,), dev, tensor.int32)
    m.compile([tx], use_graph=True)
    outs = []
    for i, (x, y) in enumerate(data):
        tx.copy_from_numpy(x)
        ty.copy_from_numpy(y)
        if i == 1:  # recorded: from now on neither layers nor autograd may run
            monkeypatch.setattr(autograd, "backward", lambda *a, **k: pytest.fail("autograd ran in a replay"))
        outs.append(m(tx, ty))
    assert calls["forward"] == 2  # compile + the recorded step
    assert all(o[0] is outs[0][0] and o[1] is outs[0][1] for o in outs)  # the same tensors, rewritten


def test_other_input_tensors_are_copied_in(dev):
    data = _mlp_data(4)
    m_e, l_e = _train(dev, MLP, lambda: opt.SGD(0.1, momentum=0.5), data, use_graph=False)
    dev.set_rand_seed(123)
    m = MLP()
    m.optimizer = opt.SGD(0.1, momentum=0.5)
    m.compile([Tensor((8, 12), dev)], use_graph=True)
    losses = []
    for x, y in data:  # fresh tensors at every step
        out, loss = m(Tensor(data=x, device=dev), Tensor(data=y, device=dev))
        losses.append(float(loss.to_numpy()[0]))
    np.testing.assert_allclose(losses, l_e, rtol=RTOL)
    _assert_same(m_e, m)


def test_different_shape_runs_eagerly_with_a_warning(dev):
    data = _mlp_data(3) + _mlp_data(1, batch=5, seed=9) + _mlp_data(2, seed=3)
    m_e, l_e = _train(dev, MLP, lambda: opt.SGD(0.1), [data[0]], use_graph=False)
    # train both by hand with fresh tensors (the placeholders' shape changes)
    results = []
    for use_graph in (False, True):
        dev.set_rand_seed(123)
        m = MLP()
        m.optimizer = opt.SGD(0.1, momentum=0.9)
        m.compile([Tensor((8, 12), dev)], use_graph=use_graph)
        ls = []
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for x, y in data:
                ls.append(float(m(Tensor(data=x, device=dev), Tensor(data=y, device=dev))[1].to_numpy()[0]))
        results.append((m, np.array(ls), [x for x in w if issubclass(x.category, graph.GraphWarning)]))
    (m0, l0, w0), (m1, l1, w1) = results
    assert not w0
    assert len(w1) == 1
    assert "shape (5, 12)" in str(w1[0].message)
    assert w1[0].filename == __file__  # points at the caller
    np.testing.assert_allclose(l1, l0, rtol=RTOL)
    _assert_same(m0, m1)
    assert m1.graph_summary() is not None  # graph mode resumes after the odd batch


def test_host_read_in_step_falls_back_to_eager(dev):
    class Peeking(MLP):
        def train_one_batch(self, x, y):
            out, loss = super().train_one_batch(x, y)
            self.last = float(loss.to_numpy()[0])  # a host read inside the step
            return out, loss

    data = _mlp_data(4)
    m_e, l_e = _train(dev, Peeking, lambda: opt.SGD(0.1), data, use_graph=False)
    with pytest.warns(graph.GraphWarning, match=r"graph mode is off.*read on the host.*test_model\.py"):
        m_g, l_g = _train(dev, Peeking, lambda: opt.SGD(0.1), data, use_graph=True)
    np.testing.assert_allclose(l_g, l_e, rtol=RTOL)
    assert m_g.last == pytest.approx(l_e[-1], rel=RTOL)
    assert m_g.graph_summary() is None


def test_changed_non_tensor_argument_runs_eagerly(dev):
    class Scaled(MLP):
        def train_one_batch(self, x, y, scale=1.0):
            out = autograd.mul(self.forward(x), Tensor(data=np.float32(scale), device=x.device, requires_grad=False))
            loss = self.softmax_cross_entropy(out, y)
            self.optimizer(loss)
            return out, loss

    data = _mlp_data(3)
    runs = []
    for use_graph in (False, True):
        dev.set_rand_seed(1)
        m = Scaled()
        m.optimizer = opt.SGD(0.1)
        tx, ty = Tensor((8, 12), dev), Tensor((8,), dev, tensor.int32)
        m.compile([tx], use_graph=use_graph)
        ls = []
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for i, (x, y) in enumerate(data):
                tx.copy_from_numpy(x)
                ty.copy_from_numpy(y)
                ls.append(float(m(tx, ty, scale=1.0 + (i == 2))[1].to_numpy()[0]))
        runs.append((ls, [x for x in w if issubclass(x.category, graph.GraphWarning)]))
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=RTOL)
    assert len(runs[1][1]) == 1
    assert "differs from the value" in str(runs[1][1][0].message)


def test_lazy_layer_inside_the_step_is_recorded_again(dev):
    class Late(MLP):
        def __init__(self):
            super().__init__()
            self.head = layer.Linear(10)

        def train_one_batch(self, x, y):
            out = self.head(self.forward(x))  # head is first called here, not in compile
            loss = self.softmax_cross_entropy(out, y)
            self.optimizer(loss)
            return out, loss

    data = _mlp_data(5)
    m_e, l_e = _train(dev, Late, lambda: opt.SGD(0.1, momentum=0.9), data, use_graph=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", graph.GraphWarning)
        m_g, l_g = _train(dev, Late, lambda: opt.SGD(0.1, momentum=0.9), data, use_graph=True)
    np.testing.assert_allclose(l_g, l_e, rtol=RTOL)
    _assert_same(m_e, m_g)
    assert m_g.graph_summary() is not None


def test_new_optimizer_settings_are_recorded_again(dev):
    data = _mlp_data(6)
    runs = []
    for use_graph in (False, True):
        dev.set_rand_seed(5)
        m = MLP()
        m.optimizer = opt.SGD(0.1, momentum=0.9)
        tx, ty = Tensor((8, 12), dev), Tensor((8,), dev, tensor.int32)
        m.compile([tx], use_graph=use_graph)
        ls = []
        for i, (x, y) in enumerate(data):
            if i == 3:
                m.optimizer.momentum = 0.5  # a plain setting: the recorded step baked 0.9 in
            tx.copy_from_numpy(x)
            ty.copy_from_numpy(y)
            ls.append(float(m(tx, ty)[1].to_numpy()[0]))
        runs.append((m, ls))
    np.testing.assert_allclose(runs[1][1], runs[0][1], rtol=RTOL)
    _assert_same(runs[0][0], runs[1][0])


def test_half_precision_graph_equals_eager(dev):
    data = [(x.astype(np.float16), y) for x, y in _mlp_data(4)]
    results = []
    for use_graph in (False, True):
        dev.set_rand_seed(3)
        m = MLP()
        m.optimizer = opt.SGD(0.05, momentum=0.9)
        tx, ty = Tensor((8, 12), dev, tensor.float16), Tensor((8,), dev, tensor.int32)
        m.compile([tx], use_graph=use_graph)
        ls = []
        for x, y in data:
            tx.copy_from_numpy(x)
            ty.copy_from_numpy(y)
            ls.append(float(m(tx, ty)[1].to_numpy()[0]))
        assert m.linear1.W.dtype == tensor.float16
        results.append((m, ls))
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-3)
    _assert_same(results[0][0], results[1][0], rtol=1e-3)


def test_graph_peak_memory_is_lower(dev):
    """Activations over 1 MiB: eager allocates each rounded up to a power of two; the planned arena packs them."""
    data = _cnn_data(4, batch=64, size=28, classes=10, seed=4)

    def make_model():
        return CNN(channels=6, dropout=0.0, num_classes=10)

    peaks = {use_graph: _steady_peak(dev, make_model, lambda: opt.SGD(0.05, momentum=0.9), data, use_graph)
             for use_graph in (False, True)}
    assert peaks[True] < 0.9 * peaks[False], peaks


def _steady_peak(dev, make_model, make_opt, data, use_graph):
    """The device pool's peak bytes in use over the steps after the first (the recording one in graph mode), above
    what was in use before the model."""
    gc.collect()
    dev.set_rand_seed(0)
    m = make_model()
    m.optimizer = make_opt()
    tx, ty = Tensor(data[0][0].shape, dev), Tensor(data[0][1].shape, dev, tensor.int32)
    base = dev.pool.bytes_in_use
    m.compile([tx], use_graph=use_graph)
    for i, (x, y) in enumerate(data):
        if i == 1:
            dev.pool.reset_peak()
        tx.copy_from_numpy(x)
        ty.copy_from_numpy(y)
        m(tx, ty)
    return dev.pool.peak_bytes - base


class _TrainResNet(model.Model):
    """A stem conv-BN-ReLU, a residual block with an identity shortcut and one with a projection (1x1 conv + BN,
    stride 2), global average pooling, a linear layer: what graph_recompute rewrites in a ResNet."""

    def __init__(self, channels=8):
        super().__init__()
        c = channels
        self.stem = [layer.Conv2d(c, 3, padding=1, bias=False), layer.BatchNorm2d(), layer.ReLU()]
        self.a = [layer.Conv2d(c, 3, padding=1, bias=False), layer.BatchNorm2d(), layer.ReLU(),
                  layer.Conv2d(c, 3, padding=1, bias=False), layer.BatchNorm2d()]
        self.b = [layer.Conv2d(2 * c, 3, stride=2, padding=1, bias=False), layer.BatchNorm2d(), layer.ReLU(),
                  layer.Conv2d(2 * c, 3, padding=1, bias=False), layer.BatchNorm2d()]
        self.proj = [layer.Conv2d(2 * c, 1, stride=2, bias=False), layer.BatchNorm2d()]
        self.add_a, self.add_b, self.relu_a, self.relu_b = layer.Add(), layer.Add(), layer.ReLU(), layer.ReLU()
        self.flat, self.fc, self.loss = layer.Flatten(), layer.Linear(5), layer.SoftMaxCrossEntropy()
        for name, layers in (("stem", self.stem), ("a", self.a), ("b", self.b), ("proj", self.proj)):
            for i, lyr in enumerate(layers):
                setattr(self, f"{name}{i}", lyr)

    @staticmethod
    def _seq(layers, x):
        for lyr in layers:
            x = lyr(x)
        return x

    def forward(self, x):
        x = self._seq(self.stem, x)
        x = self.relu_a(self.add_a(self._seq(self.a, x), x))
        x = self.relu_b(self.add_b(self._seq(self.b, x), self._seq(self.proj, x)))
        return self.fc(self.flat(autograd.globalaveragepool(x)))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def test_graph_recomputes_batchnorm_relu_outputs_exactly(dev, monkeypatch):
    """Where the device has its own batchnorm_apply, a training graph recomputes each BatchNorm (+ Add) + ReLU output
    the backward reads instead of keeping it from the forward: the replayed steps compute exactly what eager steps
    do (bit for bit, both schedules), and the steady-state peak memory drops below the graph's without it."""
    if "batchnorm_apply" not in dev.kernels:
        pytest.skip(f"{dev.name} has no batchnorm_apply of its own: graph mode keeps the activations there")
    data = _cnn_data(4, batch=16, size=16, classes=5, seed=3)
    data = [(np.repeat(x, 3, axis=1), y) for x, y in data]

    def make_opt():
        return opt.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4)

    m_e, l_e = _train(dev, _TrainResNet, make_opt, data, use_graph=False)
    for seq in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("error", graph.GraphWarning)
            m_g, l_g = _train(dev, _TrainResNet, make_opt, data, use_graph=True, sequential=seq)
        np.testing.assert_array_equal(l_g, l_e)
        sa, sb = m_e.get_states(), m_g.get_states()
        for k in sa:
            np.testing.assert_array_equal(sb[k].to_numpy(), sa[k].to_numpy(), err_msg=k)
        names = [c.name for c in m_g._step_graph.graph.calls]
        # one each for the stem's ReLU, block a's two and block b's first; two for block b's output, whose Add
        # reads the projection's BatchNorm too (the pooling's backward reads that output)
        assert names.count("batchnorm_apply") == 6, names

    peaks = {}
    for recompute in (False, True):
        monkeypatch.setattr(graph, "_RECOMPUTE", recompute)
        peaks[recompute] = _steady_peak(dev, _TrainResNet, make_opt, data, use_graph=True)
    assert peaks[True] < peaks[False], peaks


# -- modes ------------------------------------------------------------------------------------------------------------


def test_train_eval_and_call(dev):
    m = MLP()
    m.optimizer = opt.SGD(0.1)
    tx = Tensor((8, 12), dev)
    m.compile([tx], is_train=False)
    assert not m.training
    assert not autograd.training
    assert m.initialized
    assert m.device is dev
    assert set(m.get_params()) == {"linear1.W", "linear1.b", "linear2.W", "linear2.b"}
    out = m(tx)  # eval: forward
    assert out.shape == (8, 10)
    m.train()
    assert m.training
    assert autograd.training
    out, loss = m(tx, Tensor(data=np.zeros(8, np.int32), device=dev))
    assert loss.shape == (1,)
    m.eval()
    assert not m.training
    assert not autograd.training
    with pytest.raises(TypeError, match="list of Tensors"):
        m.compile([np.zeros((8, 12))])


def test_graph_toggle(dev):
    data = _mlp_data(3)
    m, _ = _train(dev, MLP, lambda: opt.SGD(0.1), data, use_graph=True)
    assert m.graph_summary() is not None
    m.graph(False)
    assert m.graph_summary() is None
    assert not m.graph_mode
    m.graph(True, sequential=True)
    assert m.graph_mode
    assert m.sequential


# -- graph mode in evaluation ------------------------------------------------------------------------------------------


class _ResidualNet(model.Model):
    """conv-BN-ReLU; conv-BN, Add of the shortcut, ReLU; 2x2 max pool; a conv whose output is returned as well as
    normalised."""

    def __init__(self, channels=8, side=False):
        super().__init__()
        self.side = side  # also return sigmoid of the first activation: a reader that needs it NCHW
        self.conv1 = layer.Conv2d(channels, 3, padding=1, bias=False)
        self.bn1 = layer.BatchNorm2d()
        self.relu1 = layer.ReLU()
        self.conv2 = layer.Conv2d(channels, 3, padding=1)
        self.bn2 = layer.BatchNorm2d()
        self.add = layer.Add()
        self.relu2 = layer.ReLU()
        self.pool = layer.MaxPool2d(2, 2)
        self.conv3 = layer.Conv2d(6, 1)
        self.bn3 = layer.BatchNorm2d()

    def forward(self, x):
        y = self.relu1(self.bn1(self.conv1(x)))
        z = self.relu2(self.add(self.bn2(self.conv2(y)), y))
        c = self.conv3(self.pool(z))
        return (self.bn3(c), c, autograd.sigmoid(y)) if self.side else (self.bn3(c), c)


def _conv64(x, w, b, pad):
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, w.shape[2:], axis=(2, 3))
    y = np.einsum("nchwij,kcij->nkhw", win, w)
    return y if b is None else y + b.reshape(1, -1, 1, 1)


def _residual_net_reference(states, x):
    """_ResidualNet's evaluation forward in float64 numpy."""
    st = {k: v.astype(np.float64) for k, v in states.items()}

    def bn(v, name):
        mean, var, scale, bias = (st[f"{name}.{k}"].reshape(1, -1, 1, 1)
                                  for k in ("running_mean", "running_var", "scale", "bias"))
        return (v - mean) / np.sqrt(var + 1e-5) * scale + bias

    x = x.astype(np.float64)
    y = np.maximum(bn(_conv64(x, st["conv1.W"], None, 1), "bn1"), 0)
    z = np.maximum(bn(_conv64(y, st["conv2.W"], st["conv2.b"], 1), "bn2") + y, 0)
    n, ch, h, w = z.shape
    p = z.reshape(n, ch, h // 2, 2, w // 2, 2).max(axis=(3, 5))
    c = _conv64(p, st["conv3.W"], st["conv3.b"], 0)
    return bn(c, "bn3"), c, 1 / (1 + np.exp(-y))


def _randomize(m, rng, names=None):
    """Random parameters and running statistics (positive variances); returns them as numpy arrays."""
    out = {}
    for name, t in m.get_states().items():
        if names is None or name in names:
            v = rng.standard_normal(t.shape).astype(np.float32) * 0.5
            if name.endswith("running_var"):
                v = np.abs(v) + 0.5
            t.copy_from_numpy(v)
        out[name] = tensor.to_numpy(t)
    return out


def _evaluated(dev, shape, seed=0, channels=8, side=False):
    rng = np.random.default_rng(seed)
    m = _ResidualNet(channels, side)
    tx = Tensor(shape, dev)
    m.compile([tx], is_train=False, use_graph=True)
    return m, _randomize(m, rng), rng


def _names(m, i=0):
    return [c.name for c in m._eval_graphs[i].graph.calls]


@pytest.mark.parametrize(("shape", "channels", "fused", "side"), [
    ((2, 4, 6, 6), 8, 2, False), ((2, 4, 6, 6), 16, 2, False), ((2, 4, 6, 6), 16, 2, True),
    ((1, 4, 2, 2), 8, 0, False)])
def test_evaluation_graph_matches_float64(dev, shape, channels, fused, side):
    """Recorded, then replayed: each convolution + BatchNorm (+ Add) (+ ReLU) chain is one conv2d_fused on weights
    folded at the replay; chains whose weights outweigh the activation (the 2x2 input) keep their calls, and so does
    the convolution whose output is returned. Where the device has channel blocks and the channels fill them, the
    activations between the convolutions stay blocked, through the Add, the ReLU and the pooling, unless another
    call reads them (`side`: a sigmoid of the first activation, joined by the Add to the rest)."""
    m, states, rng = _evaluated(dev, shape, channels=channels, side=side)
    for _ in range(3):
        x = rng.standard_normal(shape).astype(np.float32)
        got = m(tensor.from_numpy(x).to_device(dev))
        assert len(got) == (3 if side else 2)
        for g, w in zip(got, _residual_net_reference(states, x)):
            np.testing.assert_allclose(tensor.to_numpy(g), w, rtol=1e-4, atol=1e-4)
    assert len(m._eval_graphs) == 1
    calls = m._eval_graphs[0].graph.calls
    convs = [c for c in calls if c.name in ("conv2d", "conv2d_fused")]
    assert len(convs) == 3
    assert [c.params.get("activation") for c in convs].count("relu") == fused
    assert [c.name for c in calls].count("batchnorm_infer") == 3 + fused  # two folds per chain, the unfolded ones
    block = dev.channel_block
    blocked = bool(fused and block and channels % block == 0 and not side)
    want = [(0, block), (block, block), (block, 0)] if blocked else [(0, 0)] * 3
    assert [c.params.get("blocks", (0, 0)) for c in convs] == want
    assert [c.params.get("blocks", 0) for c in calls if c.name == "pool2d"] == [block if blocked else 0]


def test_evaluation_graph_refolds_changed_parameters(dev):
    """The fold reads the parameters at every replay: weights and running statistics written between two
    evaluations (a training step, a loaded checkpoint, a user's copy) are what the next one uses."""
    shape = (2, 4, 6, 6)
    m, _, rng = _evaluated(dev, shape)
    x = rng.standard_normal(shape).astype(np.float32)
    tx = tensor.from_numpy(x).to_device(dev)
    m(tx)
    m(tx)
    states = _randomize(m, rng, names={"conv2.W", "conv2.b", "bn2.running_var", "bn1.scale", "bn1.running_mean"})
    got = m(tx)
    for g, w in zip(got, _residual_net_reference(states, x)):
        np.testing.assert_allclose(tensor.to_numpy(g), w, rtol=1e-4, atol=1e-4)
    assert "conv2d_fused" in _names(m)


def test_evaluation_outputs_and_inputs_stay_the_callers(dev):
    """Outputs are new tensors at each call and the caller's inputs are never written; each input signature gets
    its graph, kept and reused."""
    m, states, rng = _evaluated(dev, (2, 4, 6, 6))
    xs = [rng.standard_normal(s).astype(np.float32) for s in ((2, 4, 6, 6), (2, 4, 6, 6), (3, 4, 4, 4))]
    txs = [tensor.from_numpy(x).to_device(dev) for x in xs]
    outs = [m(t)[0] for t in txs] + [m(t)[0] for t in txs]
    assert len(m._eval_graphs) == 2
    for i, (o, t) in enumerate(zip(outs, txs + txs)):
        x = xs[i % 3]
        np.testing.assert_array_equal(tensor.to_numpy(t), x)
        np.testing.assert_allclose(tensor.to_numpy(o), _residual_net_reference(states, x)[0], rtol=1e-4, atol=1e-4)
    m.graph(False)
    assert m._eval_graphs == []
    np.testing.assert_allclose(tensor.to_numpy(m(txs[0])[0]), tensor.to_numpy(outs[0]), rtol=1e-5, atol=1e-6)


def test_evaluation_from_several_threads_gets_each_its_own_outputs(dev):
    """Threads sharing a model in evaluation: one replays at a time, the others run the forward eagerly; nobody
    reads another's outputs out of the graph's buffers."""
    m, states, rng = _evaluated(dev, (2, 4, 6, 6), channels=16)
    xs = [rng.standard_normal((2, 4, 6, 6)).astype(np.float32) for _ in range(4)]
    want = [_residual_net_reference(states, x)[0] for x in xs]
    errors: list = []

    def work(i: int) -> None:
        autograd.training = False  # per thread, as in torch: a new thread starts with the default
        for _ in range(10):
            got = tensor.to_numpy(m(tensor.from_numpy(xs[i], dev))[0])
            if not np.allclose(got, want[i], rtol=1e-4, atol=1e-4):
                errors.append(i)

    assert run_threads(work, 4) == []
    assert errors == []
    assert len(m._eval_graphs) == 1


def test_evaluation_reading_the_host_runs_eagerly(dev):
    class Peeking(_ResidualNet):
        def forward(self, x):
            out, c = super().forward(x)
            self.peak = float(tensor.to_numpy(c).max())  # a host read inside forward
            return out, c

    rng = np.random.default_rng(1)
    m = Peeking()
    m.compile([Tensor((2, 4, 6, 6), dev)], is_train=False, use_graph=True)
    states = _randomize(m, rng)
    x = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    with pytest.warns(graph.GraphWarning, match=r"does not cover this model's forward.*read on the host"):
        first = m(tensor.from_numpy(x).to_device(dev))
    second = m(tensor.from_numpy(x).to_device(dev))
    want = _residual_net_reference(states, x)
    for got in (first, second):
        np.testing.assert_allclose(tensor.to_numpy(got[1]), want[1], rtol=1e-4, atol=1e-4)
    assert m._eval_graphs == []
    assert m.peak == pytest.approx(want[1].max(), rel=1e-4)


# -- checkpoints ------------------------------------------------------------------------------------------------------


def _trained(dev, n=3, make_opt=lambda: opt.Adam(0.01), use_graph=True):
    return _train(dev, MLP, make_opt, _mlp_data(n), use_graph=use_graph)[0]


def test_checkpoint_round_trip(dev, tmp_path):
    m = _trained(dev)
    path = tmp_path / "ck.zip"
    aux = {"epoch": 7, "note": "hi", "hist": [1.5, 2.5], "arr": np.arange(4, dtype=np.int64),
           "t": Tensor(data=np.ones((2, 2), np.float32), device=dev)}
    m.save_states(str(path), aux_states=aux)
    m2 = MLP()
    m2.optimizer = opt.Adam(0.01)
    m2.compile([Tensor((8, 12), dev)])
    got = m2.load_states(path)
    _assert_same(m, m2, rtol=0)
    assert got["epoch"] == 7
    assert got["note"] == "hi"
    assert got["hist"] == [1.5, 2.5]
    np.testing.assert_array_equal(got["arr"], np.arange(4))
    assert isinstance(got["t"], Tensor)
    assert np.array_equal(got["t"].to_numpy(), np.ones((2, 2)))
    # the optimizer's moments and step counter came along
    s1, s2 = m.optimizer.get_states(), m2.optimizer.get_states()
    assert s1.keys() == s2.keys() == {"step_counter", "m", "v"}  # SINGA's keys for Adam
    assert s1["step_counter"] == s2["step_counter"] > 0
    for group in ("m", "v"):
        assert s1[group].keys() == s2[group].keys()
        assert "linear1.W" in s1[group]
        for k in s1[group]:
            np.testing.assert_array_equal(np.asarray(s1[group][k]), np.asarray(s2[group][k]))


def test_checkpoint_format_is_npy_and_json(dev, tmp_path):
    m = _trained(dev, n=1)
    path = tmp_path / "ck.zip"
    m.save_states(path)
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        manifest = json.loads(zf.read("manifest.json"))
        assert all(n == "manifest.json" or n.endswith(".npy") for n in names)
        assert manifest["format"] == model.CHECKPOINT_FORMAT
        assert manifest["version"] == model.CHECKPOINT_VERSION
        entries = {e["name"]: e for e in manifest["arrays"] if e["section"] == "states"}
        assert entries["linear1.W"]["dtype"] == "float32"
        assert entries["linear1.W"]["shape"] == [12, 100]
        for e in manifest["arrays"]:
            with zf.open(e["file"]) as f:
                a = np.load(f, allow_pickle=False)  # never pickle
            assert str(a.dtype) == e["dtype"]
            assert list(a.shape) == e["shape"]


def test_resume_from_checkpoint_equals_uninterrupted(dev, tmp_path):
    data = _mlp_data(6)
    make_opt = lambda: opt.SGD(0.05, momentum=0.9, dampening=0.1)  # noqa: E731
    m_full, l_full = _train(dev, MLP, make_opt, data, use_graph=True)
    m_a, l_a = _train(dev, MLP, make_opt, data[:3], use_graph=True)
    m_a.save_states(tmp_path / "ck.zip")
    m_b = MLP()
    m_b.optimizer = make_opt()
    tx, ty = Tensor((8, 12), dev), Tensor((8,), dev, tensor.int32)
    m_b.compile([tx], use_graph=True)
    m_b.load_states(tmp_path / "ck.zip")
    l_b = []
    for x, y in data[3:]:
        tx.copy_from_numpy(x)
        ty.copy_from_numpy(y)
        l_b.append(float(m_b(tx, ty)[1].to_numpy()[0]))
    np.testing.assert_allclose(np.concatenate([l_a, l_b]), l_full, rtol=RTOL)
    _assert_same(m_full, m_b)


def test_load_after_recording_keeps_the_graph_valid(dev, tmp_path):
    data = _mlp_data(4)
    m_ref = _trained(dev, n=2, make_opt=lambda: opt.SGD(0.1))
    m_ref.save_states(tmp_path / "ref.zip")
    m, _ = _train(dev, MLP, lambda: opt.SGD(0.1), data, use_graph=True)
    buffers = {k: t.buffer for k, t in m.get_states().items()}
    m.load_states(tmp_path / "ref.zip")
    assert all(t.buffer is buffers[k] for k, t in m.get_states().items())  # loaded in place
    _assert_same(m_ref, m, rtol=0)


def test_failed_save_keeps_the_previous_checkpoint(dev, tmp_path, monkeypatch):
    m = _trained(dev, n=1)
    path = tmp_path / "ck.zip"
    m.save_states(path, aux_states={"epoch": 1})
    before = path.read_bytes()

    m2 = _trained(dev, n=3)
    calls = {"n": 0}
    real = checkpoint._write_array

    def failing(f, arr):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full (simulated)")
        real(f, arr)

    monkeypatch.setattr(checkpoint, "_write_array", failing)
    with pytest.raises(OSError, match="simulated"):
        m2.save_states(path, aux_states={"epoch": 3})
    assert calls["n"] == 3  # it did fail mid-way
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["ck.zip"]  # no temporary left behind
    monkeypatch.undo()

    with pytest.raises(TypeError, match="aux state 'bad'"):
        m2.save_states(path, aux_states={"bad": object()})
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["ck.zip"]
    m3 = MLP()
    m3.optimizer = opt.Adam(0.01)
    m3.compile([Tensor((8, 12), dev)])
    assert m3.load_states(path) == {"epoch": 1}
    _assert_same(m, m3, rtol=0)


def test_load_errors_name_the_problems(dev, tmp_path):
    m = _trained(dev, n=1)
    path = tmp_path / "ck.zip"
    m.save_states(path)

    class Other(MLP):
        def __init__(self):
            super().__init__(perceptron_size=50)
            self.linear3 = layer.Linear(10)

        def forward(self, inputs):
            return self.linear3(super().forward(inputs))

    o = Other()
    o.compile([Tensor((8, 12), dev)])
    before = {k: t.to_numpy() for k, t in o.get_states().items()}
    with pytest.raises(ValueError, match=r"missing from the checkpoint: linear3\.W, linear3\.b") as exc:
        o.load_states(path)
    msg = str(exc.value)
    assert "linear1.W: checkpoint shape (12, 100), model shape (12, 50)" in msg
    assert all(np.array_equal(t.to_numpy(), before[k]) for k, t in o.get_states().items())  # nothing changed

    class Smaller(model.Model):
        def __init__(self):
            super().__init__()
            self.linear1 = layer.Linear(100)

        def forward(self, x):
            return self.linear1(x)

    s = Smaller()
    s.compile([Tensor((8, 12), dev)])
    with pytest.raises(ValueError, match=r"not in the model: linear2\.W, linear2\.b"):
        s.load_states(path)
    with pytest.raises(RuntimeError, match="compile"):
        MLP().load_states(path)
    (tmp_path / "junk.zip").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a zip"):
        m.load_states(tmp_path / "junk.zip")


def test_version_1_checkpoints_keep_loading(dev, tmp_path):
    """Format 1 named optimizer states '<param>/<state>' with the old state names; they load into SINGA's groups."""
    m = MLP()
    m.optimizer = opt.SGD(lr=0.05, momentum=0.9)
    data = _mlp_data(2)
    tx, ty = Tensor(data[0][0].shape, dev), Tensor(data[0][1].shape, dev, tensor.int32)
    m.compile([tx], use_graph=False)
    for x, y in data:
        tx.copy_from_numpy(x)
        ty.copy_from_numpy(y)
        m(tx, ty)
    v2 = tmp_path / "v2.zip"
    m.save_states(v2)
    with zipfile.ZipFile(v2) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    manifest = json.loads(members["manifest.json"])
    assert manifest["version"] == model.CHECKPOINT_VERSION == 2
    for e in manifest["arrays"]:
        if e.pop("group", None) == "moments":  # rewrite as version 1 wrote it
            e["name"] = e["name"].split("/", 1)[1] + "/momentum"
    manifest["version"] = 1
    members["manifest.json"] = json.dumps(manifest).encode()
    v1 = tmp_path / "v1.zip"
    with zipfile.ZipFile(v1, "w") as zf:
        for n, b in members.items():
            zf.writestr(n, b)
    m2 = MLP()
    m2.optimizer = opt.SGD(lr=0.05, momentum=0.9)
    m2.compile([tx], use_graph=False)
    m2.load_states(v1)
    s1, s2 = m.optimizer.get_states(), m2.optimizer.get_states()
    assert s2["step_counter"] == s1["step_counter"] == 2.0
    assert sorted(s2["moments"]) == sorted(s1["moments"]) == ["linear1.W", "linear1.b", "linear2.W", "linear2.b"]
    for k, t in s1["moments"].items():
        np.testing.assert_array_equal(np.asarray(s2["moments"][k]), t.to_numpy())
