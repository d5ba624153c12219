"""ONNX import (singa_onnx, reachable as singa.sonnx): API behaviour, errors, training, and the places where Apache
SINGA's sonnx fails. Numbers are checked against onnxruntime."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto as TP  # noqa: E402
from onnx import helper  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402
from onnx_helpers import EarlierOnnxCNN, SeedSONNXModel, sgd_step  # noqa: E402

from singa import (  # noqa: E402
    autograd,
    device,
    graph,
    layer,
    model,
    opt,
    sonnx,
    tensor,
)

RNG = np.random.default_rng(0)


def make_model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9  # what the installed onnxruntime accepts
    return m


def vi(name, shape, t=TP.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def ort_run(m, feeds):
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def cnn(classes=10, seed=0):
    """Conv -> BatchNorm -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> Relu -> Softmax, dynamic batch."""
    rng = np.random.default_rng(seed)
    inits = [nh.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "conv.W"),
             nh.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "conv.b"),
             nh.from_array(rng.random(8).astype(np.float32) + 0.5, "bn.scale"),
             nh.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "bn.bias"),
             nh.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "bn.mean"),
             nh.from_array(rng.random(8).astype(np.float32) + 0.5, "bn.var"),
             nh.from_array(rng.standard_normal((8, classes)).astype(np.float32) * 0.5, "fc.W"),
             nh.from_array(np.zeros(classes, np.float32), "fc.b")]
    nodes = [helper.make_node("Conv", ["x", "conv.W", "conv.b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["b"],
                              epsilon=1e-3, name="bn"),
             helper.make_node("Relu", ["b"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc.W", "fc.b"], ["logits"], name="fc"),
             helper.make_node("Relu", ["logits"], ["rl"], name="relu2"),
             helper.make_node("Softmax", ["rl"], ["y"], axis=1, name="softmax")]
    return make_model(nodes, [vi("x", ["N", 3, 8, 8])], [vi("y", ["N", classes])], inits)


@pytest.fixture
def dev():
    return device.get_default_device()


@pytest.fixture(autouse=True)
def _inference_by_default(evaluating):
    """Every test starts with autograd off (as a script does) and leaves it as it found it (conftest.py)."""


# -- prepare / run ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["device", "CPU", "cpu"])
def test_prepare_accepts_device_objects_and_names(dev, spec):
    m = cnn()
    x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    rep = sonnx.prepare(m, device=dev if spec == "device" else spec)  # Apache SINGA segfaults on a Device object
    (y,) = rep.run([x])
    np.testing.assert_allclose(y, ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-6)


def test_run_on_singa_tensors_returns_tensors(dev):
    m = cnn()
    x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    rep = sonnx.prepare(m, device=dev)
    out = rep.run([tensor.Tensor(device=dev, data=x)])  # Apache SINGA raises here
    assert isinstance(out, list)
    assert isinstance(out[0], tensor.Tensor)
    assert out[0].device is dev
    np.testing.assert_allclose(tensor.to_numpy(out[0]), ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-6)
    # a dict by input name, numpy in -> numpy out
    (y,) = rep.run({"x": x})
    assert isinstance(y, np.ndarray)
    assert y.dtype == np.float32


def test_dynamic_batch_sizes(dev):
    m = cnn()
    rep = sonnx.prepare(m, device=dev)
    for n in (1, 5, 8):
        x = RNG.standard_normal((n, 3, 8, 8)).astype(np.float32)
        np.testing.assert_allclose(rep.run([x])[0], ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-6)


def _chain():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="n1"), helper.make_node("Neg", ["a"], ["b"], name="n2"),
             helper.make_node("Exp", ["b"], ["c"], name="n3"), helper.make_node("Sigmoid", ["c"], ["y"], name="n4")]
    return make_model(nodes, [vi("x", [2, 3])], [vi("y", [2, 3])])


def test_last_layers_counts_as_singas_code(dev):
    """SINGA's SingaRep: -1 (and -2) run every node, -k leaves out the last k - 2 nodes, a non-negative k is the
    index of the last node run (the seed's transfer learning passes -3 to drop a zoo model's final Gemm)."""
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    rep = sonnx.prepare(_chain(), device=dev)  # Relu -> Neg -> Exp -> Sigmoid
    a = np.maximum(x, 0)
    b = -a
    c = np.exp(b)
    y = 1 / (1 + np.exp(-c))
    np.testing.assert_allclose(rep.run([x])[0], y, rtol=1e-6)
    for k, want in ((-1, y), (-2, y), (-3, c), (-4, b), (-5, a), (0, a), (1, b), (2, c), (3, y)):
        np.testing.assert_allclose(rep.run([x], last_layers=k)[0], want, rtol=1e-6, err_msg=str(k))
    for bad in (-6, 4, 1.5, True):
        with pytest.raises(ValueError, match="last_layers"):
            rep.run([x], last_layers=bad)
    # the same on the Model API
    mdl = sonnx.SONNXModel(_chain())
    mdl.eval()
    np.testing.assert_allclose(tensor.to_numpy(mdl.forward(tensor.from_numpy(x), last_layers=-3)[0]), c, rtol=1e-6)


def test_aux_output_returns_named_values(dev):
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    rep = sonnx.prepare(_chain(), device=dev)
    y, a = rep.run([x], aux_output=["a"])
    np.testing.assert_allclose(a, np.maximum(x, 0))


# -- where Apache SINGA's operators fall short ----------------------------------------------------------------------


@pytest.mark.parametrize("group", [2, 6])
def test_grouped_convolution_on_cpu(dev, group):
    w = RNG.standard_normal((6, 6 // group, 3, 3)).astype(np.float32)
    m = make_model([helper.make_node("Conv", ["x", "w"], ["y"], group=group, pads=[1, 1, 1, 1],
                                     dilations=[1, 1], strides=[1, 1])],
                   [vi("x", [2, 6, 7, 7])], [vi("y", [2, 6, 7, 7])], [nh.from_array(w, "w")])
    x = RNG.standard_normal((2, 6, 7, 7)).astype(np.float32)
    np.testing.assert_allclose(sonnx.prepare(m, dev).run([x])[0], ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_batchnorm_epsilon(dev):
    C = 4
    inits = [nh.from_array(RNG.random(C).astype(np.float32) + 0.5, n) for n in ("s", "b", "m", "v")]
    m = make_model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=0.5)],
                   [vi("x", [2, C, 3, 3])], [vi("y", [2, C, 3, 3])], inits)
    x = RNG.standard_normal((2, C, 3, 3)).astype(np.float32)
    np.testing.assert_allclose(sonnx.prepare(m, dev).run([x])[0], ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_range_cumsum_layernorm(dev):
    nodes = [helper.make_node("Range", ["start", "limit", "delta"], ["r"]),
             helper.make_node("CumSum", ["x", "axis"], ["cs"], exclusive=1, reverse=1),
             helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1, epsilon=1e-3)]
    inits = [nh.from_array(np.array(1.5, np.float32), "start"), nh.from_array(np.array(7.0, np.float32), "limit"),
             nh.from_array(np.array(0.75, np.float32), "delta"), nh.from_array(np.array(1, np.int64), "axis"),
             nh.from_array(RNG.random(5).astype(np.float32), "g"), nh.from_array(RNG.random(5).astype(np.float32), "b")]
    m = make_model(nodes, [vi("x", [3, 5])], [vi("r", ["n"]), vi("cs", [3, 5]), vi("ln", [3, 5])], inits)
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    for got, want in zip(sonnx.prepare(m, dev).run([x]), ort_run(m, {"x": x})):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("op", "attrs"), [
    ("MaxPool", {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [1, 0, 1, 0, 1, 1], "ceil_mode": 1}),
    ("AveragePool", {"kernel_shape": [3, 2, 2], "pads": [1, 1, 0, 1, 0, 1], "count_include_pad": 0}),
    ("MaxPool", {"kernel_shape": [3], "strides": [2], "dilations": [2]}),
    ("AveragePool", {"kernel_shape": [3], "pads": [1, 1], "count_include_pad": 1}),
])
def test_1d_3d_pooling(dev, op, attrs):
    nd = len(attrs["kernel_shape"])
    shape = [2, 3] + [7] * nd
    m = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], [vi("x", shape)],
                   [vi("y", [f"d{i}" for i in range(len(shape))])], opset=19)
    x = RNG.standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(sonnx.prepare(m, dev).run([x])[0], ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_3d_convolution(dev):
    w = RNG.standard_normal((4, 2, 2, 3, 3)).astype(np.float32)
    m = make_model([helper.make_node("Conv", ["x", "w"], ["y"], group=2, pads=[1, 0, 1, 0, 1, 1],
                                     strides=[2, 1, 1], dilations=[1, 2, 1])],
                   [vi("x", [1, 4, 6, 7, 5])], [vi("y", ["n", "c", "d", "h", "w"])], [nh.from_array(w, "w")])
    x = RNG.standard_normal((1, 4, 6, 7, 5)).astype(np.float32)
    np.testing.assert_allclose(sonnx.prepare(m, dev).run([x])[0], ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-5)


# -- errors at prepare time -----------------------------------------------------------------------------------------


def test_every_unsupported_operator_is_reported_at_prepare():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok"),
             helper.make_node("NoSuchOpA", ["a"], ["b"], name="first_bad", domain="com.example"),
             helper.make_node("NoSuchOpB", ["b"], ["y"], name="second_bad", domain="com.example")]
    g = helper.make_graph(nodes, "m", [vi("x", [2])], [vi("y", [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    with pytest.raises(sonnx.UnsupportedOperatorError) as err:
        sonnx.prepare(m, "cpu")
    msg = str(err.value)
    for word in ("first_bad", "NoSuchOpA", "second_bad", "NoSuchOpB"):
        assert word in msg
    assert [p[0] for p in err.value.problems] == ["first_bad", "second_bad"]


def test_malformed_model_gets_the_checkers_message():
    m = make_model([helper.make_node("Relu", ["missing"], ["y"], name="r")], [vi("x", [2])], [vi("y", [2])])
    with pytest.raises(sonnx.InvalidModelError, match=r"onnx\.checker"):
        sonnx.prepare(m, "cpu")
    with pytest.raises(sonnx.InvalidModelError):
        sonnx.prepare(b"not a model", "cpu")


def test_external_data_is_confined_to_the_model_folder(tmp_path):
    m = cnn()
    x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    want = ort_run(m, {"x": x})[0]
    path = tmp_path / "model.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin",
                    size_threshold=0)  # (this moves m's initializers out too)
    np.testing.assert_allclose(sonnx.prepare(str(path), "cpu").run([x])[0], want, rtol=1e-4, atol=1e-6)
    # the same file moved outside the folder and referenced with '..': refused, not read
    outside = tmp_path.parent / f"{tmp_path.name}-weights.bin"
    (tmp_path / "weights.bin").rename(outside)
    escaping = onnx.load(str(path), load_external_data=False)
    for t in escaping.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = f"../{outside.name}"
    with pytest.raises(sonnx.InvalidModelError, match="leaves the model's folder"):
        sonnx.prepare(escaping, "cpu", base_dir=str(tmp_path))
    outside.unlink()


# -- training: parameters, names, optimizers ------------------------------------------------------------------------


def _linear_onnx(seed):
    rng = np.random.default_rng(seed)
    inits = [nh.from_array(rng.standard_normal((4, 2)).astype(np.float32), "W"),
             nh.from_array(rng.standard_normal(2).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])]
    return make_model(nodes, [vi("x", ["N", 4])], [vi("y", ["N", 2])], inits)


def _momentum_reference(params, grads_fn, steps, lr, mom):
    vel = [np.zeros_like(p) for p in params]
    for _ in range(steps):
        gs = grads_fn(params)
        for i, g in enumerate(gs):
            vel[i] = mom * vel[i] + g
            params[i] = params[i] - lr * vel[i]
    return params


class _TwoImports(model.Model):
    def __init__(self, m1, m2):
        super().__init__()
        self.a = sonnx.SONNXModel(m1)
        self.b = sonnx.SONNXModel(m2)

    def forward(self, x1, x2):
        return autograd.add(self.a.forward(x1)[0], self.b.forward(x2)[0])

    def train_one_batch(self, x1, x2, t):
        y = self.forward(x1, x2)
        loss = autograd.mse_loss(y, t)
        self.optimizer(loss)
        return y, loss


@pytest.mark.parametrize("use_graph", [False, True])
def test_colliding_initializer_names_train_independently(dev, use_graph):
    """Two imported models whose initializers are both named W and b, trained with momentum in one model."""
    m1, m2 = _linear_onnx(1), _linear_onnx(2)
    x1, x2 = (RNG.standard_normal((5, 4)).astype(np.float32) for _ in range(2))
    t = RNG.standard_normal((5, 2)).astype(np.float32)
    net = _TwoImports(m1, m2)
    net.optimizer = opt.SGD(lr=0.05, momentum=0.9)
    tx1, tx2, tt = (tensor.Tensor(device=dev, data=v) for v in (x1, x2, t))
    net.compile([tx1, tx2], is_train=True, use_graph=use_graph, sequential=True)
    assert sorted(net.get_params()) == ["a.sonnx.W", "a.sonnx.b", "b.sonnx.W", "b.sonnx.b"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", graph.GraphWarning)
        for _ in range(4):
            net(tx1, tx2, tt)
    assert len({st.name for st in net.optimizer._states.values()}) == 4  # one momentum buffer per parameter

    def grads(p):
        wa, ba, wb, bb = p
        g = (x1 @ wa + ba + x2 @ wb + bb - t) / len(t)  # SINGA's mse: sum((y - t)^2) / (2 N)
        return [x1.T @ g, g.sum(0), x2.T @ g, g.sum(0)]

    init = [nh.to_array(i) for mm in (m1, m2) for i in mm.graph.initializer]
    want = _momentum_reference([p.copy() for p in init], grads, 4, 0.05, 0.9)
    got = [tensor.to_numpy(net.get_params()[k]) for k in ("a.sonnx.W", "a.sonnx.b", "b.sonnx.W", "b.sonnx.b")]
    for g_, w_ in zip(got, want):
        np.testing.assert_allclose(g_, w_, rtol=1e-4, atol=1e-5)


def test_two_reps_with_the_same_names_share_one_optimizer(dev):
    reps = [sonnx.prepare(_linear_onnx(s), dev) for s in (3, 4)]
    for r in reps:
        for tns in r.tensor_map.values():
            tns.requires_grad = tns.stores_grad = True
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    t = RNG.standard_normal((3, 2)).astype(np.float32)
    sgd = opt.SGD(lr=0.1, momentum=0.5)
    tx = tensor.Tensor(device=dev, data=x)
    autograd.training = True
    try:
        for _ in range(3):
            y = autograd.add(reps[0].run([tx])[0], reps[1].run([tx])[0])
            loss = autograd.mse_loss(y, tensor.Tensor(device=dev, data=t))
            for p, g in autograd.backward(loss):
                sgd.update(p, g)
            sgd.step()
    finally:
        autograd.training = False
    assert len(sgd._states) == 4
    assert len({s.name for s in sgd._states.values()}) == 4

    def grads(p):
        g = (x @ p[0] + p[1] + x @ p[2] + p[3] - t) / len(t)
        return [x.T @ g, g.sum(0), x.T @ g, g.sum(0)]

    init = [nh.to_array(i) for s in (3, 4) for i in _linear_onnx(s).graph.initializer]
    want = _momentum_reference([p.copy() for p in init], grads, 3, 0.1, 0.5)
    got = [tensor.to_numpy(r.tensor_map[k]) for r in reps for k in ("W", "b")]
    for g_, w_ in zip(got, want):
        np.testing.assert_allclose(g_, w_, rtol=1e-4, atol=1e-5)


def test_checkpoint_round_trip(dev, tmp_path):
    m = sonnx.SONNXModel(cnn())
    x = tensor.Tensor(device=dev, data=RNG.standard_normal((2, 3, 8, 8)).astype(np.float32))
    m.compile([x], is_train=False)
    before = tensor.to_numpy(m.forward(x)[0])
    m.save_states(str(tmp_path / "ckpt.zip"))
    m2 = sonnx.SONNXModel(cnn(seed=5))
    m2.compile([x], is_train=False)
    m2.load_states(str(tmp_path / "ckpt.zip"))
    np.testing.assert_allclose(tensor.to_numpy(m2.forward(x)[0]), before, rtol=1e-6)


# -- the seed's examples (docs: "ONNX"), as written apart from device creation and data -----------------------------


class MyModel(SeedSONNXModel):  # train_one_batch and set_optimizer: onnx_helpers.SeedSONNXModel
    def __init__(self, onnx_model):
        super().__init__(onnx_model)

    def forward(self, *x):
        y = super().forward(*x)
        return y[0]


class TransferModel(SeedSONNXModel):
    def __init__(self, onnx_model):
        super().__init__(onnx_model)
        self.linear = layer.Linear(1000, 3)

    def forward(self, *x):
        # cut off after the last third layer and append a linear layer
        y = super().forward(*x, last_layers=-3)[0]
        y = self.linear(y)
        return y  # noqa: RET504 - the seed's code as written


def test_seed_inference_with_graph(dev):
    onnx_model = cnn()
    data = RNG.standard_normal((4, 3, 8, 8)).astype(np.float32)
    x = tensor.PlaceHolder(data.shape, device=dev)
    model_ = MyModel(onnx_model)
    model_.compile([x], is_train=False, use_graph=True, sequential=True)
    x = tensor.Tensor(device=dev, data=data)
    y = model_.forward(x)
    np.testing.assert_allclose(tensor.to_numpy(y), ort_run(onnx_model, {"x": data})[0], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("cls", [MyModel, TransferModel])
def test_seed_retraining_and_transfer_learning_in_graph_mode(dev, cls):
    classes = 1000 if cls is TransferModel else 10
    onnx_model = cnn(classes)
    n = 8
    data = RNG.standard_normal((n, 3, 8, 8)).astype(np.float32)
    labels = RNG.integers(0, 3, n).astype(np.int32)
    tx = tensor.Tensor((n, 3, 8, 8), dev, tensor.float32)
    ty = tensor.Tensor((n,), dev, tensor.int32)
    model_ = cls(onnx_model)
    sgd = opt.SGD(lr=0.005 if cls is MyModel else 0.05, momentum=0.9, weight_decay=1e-5)
    model_.set_optimizer(sgd)
    model_.compile([tx], is_train=True, use_graph=True, sequential=True)
    losses = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", graph.GraphWarning)  # the step must replay as a graph
        for _ in range(15):
            tx.copy_from_numpy(data)
            ty.copy_from_numpy(labels)
            _, loss = model_(tx, ty, "fp32", None)
            losses.append(float(tensor.to_numpy(loss)[0]))
    assert model_.graph_summary() is not None
    assert losses[-1] < losses[0]
    assert any(k.startswith("sonnx.") for k in model_.get_params())


def test_seed_earlier_api_full_example(dev):
    """The earlier edition's MNIST example: export, prepare/run inference, re-training, transfer learning."""
    if not hasattr(sonnx, "to_onnx"):
        pytest.skip("export (singa_onnx.frontend) is not installed")

    train_x = RNG.random((16, 1, 28, 28)).astype(np.float32)
    train_y = np.eye(10, dtype=np.float32)[RNG.integers(0, 10, 16)]
    cnn_ = EarlierOnnxCNN()
    prev = autograd.training
    try:
        autograd.training = True
        x = tensor.Tensor(device=dev, data=train_x)
        target = tensor.Tensor(device=dev, data=train_y)
        y = cnn_.forward(x)
        sgd_step(y, target, 0.001)
        onnx_model = sonnx.to_onnx([x], [y])

        sg_ir = sonnx.prepare(onnx_model, device=dev)

        class Infer:
            def __init__(self, sg_ir):
                self.sg_ir = sg_ir
                for idx, tens in sg_ir.tensor_map.items():
                    tens.requires_grad = True
                    tens.stores_grad = True
                    sg_ir.tensor_map[idx] = tens

            def forward(self, x):
                return sg_ir.run([x])[0]

        autograd.training = False
        infer = Infer(sg_ir)
        np.testing.assert_allclose(tensor.to_numpy(infer.forward(x)), tensor.to_numpy(cnn_.forward(x)), rtol=1e-4,
                                   atol=1e-5)
        # re-training: the imported tensors are updated
        autograd.training = True
        before = {k: tensor.to_numpy(v).copy() for k, v in sg_ir.tensor_map.items()}
        for _ in range(2):
            sgd_step(infer.forward(x), target, 0.01)
        assert all(not np.array_equal(before[k], tensor.to_numpy(v)) for k, v in sg_ir.tensor_map.items())

        # transfer learning: the earlier edition passed -1 to reach the 500-feature layer; SINGA's later code (which
        # this follows: -1 and -2 keep every node) reaches it with -3, dropping the final Gemm
        class Trans:
            def __init__(self, sg_ir, last_layers):
                self.sg_ir = sg_ir
                self.last_layers = last_layers
                self.append_linear1 = autograd.Linear(500, 128, bias=False)
                self.append_linear2 = autograd.Linear(128, 32, bias=False)
                self.append_linear3 = autograd.Linear(32, 10, bias=False)

            def forward(self, x):
                y = sg_ir.run([x], last_layers=self.last_layers)[0]
                y = self.append_linear1(y)
                y = autograd.relu(y)
                y = self.append_linear2(y)
                y = autograd.relu(y)
                y = self.append_linear3(y)
                y = autograd.relu(y)
                return y  # noqa: RET504 - the seed's code as written

        trans = Trans(sg_ir, -3)
        n = sgd_step(trans.forward(x), target, 0.07)
        assert n == len(sg_ir.tensor_map) - 1 + 3  # linear2.W is cut off
    finally:
        autograd.training = prev
