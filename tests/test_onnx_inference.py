"""SingaRep's optimised inference (singa_onnx.optimize, singa_onnx.inference): folded graphs agree with the graph as
imported and with onnxruntime, recorded runs replay bit for bit, and the optimised graph never outlives the tensors
it was built from (re-training, replaced or rewritten tensors)."""

from __future__ import annotations

import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto as TP  # noqa: E402
from onnx import helper  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

from singa import autograd, device, model, opt, sonnx, tensor  # noqa: E402
from singa.backend import contiguous_strides  # noqa: E402

RNG = np.random.default_rng(0)


def make_model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m


def vi(name, shape, t=TP.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def ort_run(m, feeds):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def arr(*shape, scale=1.0, positive=False):
    a = RNG.random(shape) + 0.5 if positive else RNG.standard_normal(shape)
    return (a * scale).astype(np.float32)


def bn_inits(prefix, c):
    return [nh.from_array(arr(c, positive=True), f"{prefix}.s"), nh.from_array(arr(c, scale=0.1), f"{prefix}.b"),
            nh.from_array(arr(c, scale=0.1), f"{prefix}.m"), nh.from_array(arr(c, positive=True), f"{prefix}.v")]


def bn_node(x, y, prefix, **kw):
    return helper.make_node("BatchNormalization", [x] + [f"{prefix}.{k}" for k in "sbmv"], [y], **kw)


def conv_bn_affine():
    """Conv -> BN -> Mul(Unsqueeze(w)) -> Add(Unsqueeze(b)) -> Relu -> BN -> Mul -> Add -> Relu -> 1x1 Conv -> BN, the
    shapes of densenet's and inception_v2's blocks; Unsqueeze opset 9 (attribute axes)."""
    inits = [nh.from_array(arr(8, 3, 3, 3, scale=0.3), "W1"), nh.from_array(arr(8, scale=0.1), "B1"),
             nh.from_array(arr(8, positive=True), "w1"), nh.from_array(arr(8, scale=0.1), "b1"),
             nh.from_array(arr(8, positive=True), "w2"), nh.from_array(arr(8, scale=0.1), "b2"),
             nh.from_array(arr(6, 8, 1, 1, scale=0.3), "W2")]
    inits += bn_inits("bn1", 8) + bn_inits("bn2", 8) + bn_inits("bn3", 6)
    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]),
             bn_node("c1", "n1", "bn1", epsilon=1e-3),
             helper.make_node("Unsqueeze", ["w1"], ["w1u"], axes=[1, 2]),
             helper.make_node("Mul", ["n1", "w1u"], ["m1"]),
             helper.make_node("Unsqueeze", ["b1"], ["b1u"], axes=[1, 2]),
             helper.make_node("Add", ["b1u", "m1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["r1"]),
             bn_node("r1", "n2", "bn2"),
             helper.make_node("Unsqueeze", ["w2"], ["w2u"], axes=[1, 2]),
             helper.make_node("Mul", ["n2", "w2u"], ["m2"]),
             helper.make_node("Unsqueeze", ["b2"], ["b2u"], axes=[1, 2]),
             helper.make_node("Add", ["m2", "b2u"], ["a2"]),
             helper.make_node("Relu", ["a2"], ["r2"]),
             helper.make_node("Conv", ["r2", "W2"], ["c2"]),
             bn_node("c2", "y", "bn3")]
    return make_model(nodes, [vi("x", ["N", 3, 8, 8])], [vi("y", ["N", 6, 8, 8])], inits, opset=9)


def both(m, dev, feeds):
    """(optimised outputs of three runs, outputs of the graph as imported)."""
    rep = sonnx.prepare(m, dev)
    runs = [rep.run(feeds) for _ in range(3)]
    plain = sonnx.prepare(m, dev, optimize=False).run(feeds)
    return rep, runs, plain


@pytest.fixture
def dev():
    return device.get_default_device()


pytestmark = pytest.mark.usefixtures("evaluating")  # inference by default (conftest.py restores the flag)


# -- folding -------------------------------------------------------------------------------------------------------


def residual_block(tail: str = "Relu"):
    """x -> Conv -> Relu -> Conv -> Add(x) -> Relu (ResNet's basic block; `tail`: Add or Sum, with or without the
    last Relu)."""
    inits = [nh.from_array(arr(4, 4, 3, 3, scale=0.3), "W1"), nh.from_array(arr(4, scale=0.1), "B1"),
             nh.from_array(arr(4, 4, 3, 3, scale=0.3), "W2")]
    add = "Sum" if tail.startswith("Sum") else "Add"
    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "W2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node(add, ["x", "c2"], ["s" if tail.endswith("Relu") else "y"])]
    if tail.endswith("Relu"):
        nodes.append(helper.make_node("Relu", ["s"], ["y"]))
    return make_model(nodes, [vi("x", ["N", 4, 6, 6])], [vi("y", ["N", 4, 6, 6])], inits)


@pytest.mark.parametrize("tail", ["Relu", "SumRelu", "Add"])
def test_conv_add_relu_run_as_fused_convolutions(dev, tail):
    m = residual_block(tail)
    x = arr(2, 4, 6, 6)
    rep, runs, plain = both(m, dev, [x])
    prog = rep.inference_plan().program
    assert [n.op_type for n in prog.nodes] == ["FusedConv", "FusedConv"]
    assert [n.attrs["activation"] for n in prog.nodes] == ["Relu", "Relu" if tail.endswith("Relu") else ""]
    assert prog.nodes[1].inputs[3] == "x"  # the block's input is the residual
    want = ort_run(m, {"x": x})[0]
    for got in runs + [plain]:
        np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-5)


def test_a_convolution_read_twice_is_not_fused(dev):
    inits = [nh.from_array(arr(4, 3, 3, 3, scale=0.3), "W")]
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Add", ["r", "c"], ["y"])]
    m = make_model(nodes, [vi("x", [2, 3, 6, 6])], [vi("y", [2, 4, 6, 6])], inits)
    x = arr(2, 3, 6, 6)
    rep, runs, plain = both(m, dev, [x])
    prog = rep.inference_plan().program
    assert [n.op_type for n in prog.nodes] == ["FusedConv", "Relu", "Add"]
    assert prog.nodes[0].attrs["activation"] == ""
    np.testing.assert_allclose(runs[-1][0], ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-5)


def fire_and_residual(c=32, head="GlobalAveragePool"):
    """SqueezeNet's fire module and ResNet's projection block in one graph, with poolings and an odd-width tail:
    Conv-Relu -> [1x1 Conv-Relu, 3x3 Conv-Relu] -> Concat -> Relu -> Conv + 1x1 Conv shortcut -> Relu -> `head`
    (GlobalAveragePool, or an AveragePool to 1x1) -> g; the concatenation's Relu also -> MaxPool (ceil mode) -> Conv
    (20 channels, not whole blocks) -> y."""
    inits = [nh.from_array(arr(c, 3, 3, 3, scale=0.3), "W0"), nh.from_array(arr(c, scale=0.1), "B0"),
             nh.from_array(arr(c, c, 1, 1, scale=0.2), "We1"), nh.from_array(arr(c, c, 3, 3, scale=0.1), "We3"),
             nh.from_array(arr(2 * c, 2 * c, 3, 3, scale=0.05), "W2"),
             nh.from_array(arr(2 * c, c, 1, 1, scale=0.2), "Ws"), nh.from_array(arr(20, 2 * c, 3, 3, scale=0.05), "W3")]
    nodes = [helper.make_node("Conv", ["x", "W0", "B0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "We1"], ["e1"]), helper.make_node("Relu", ["e1"], ["re1"]),
             helper.make_node("Conv", ["r0", "We3"], ["e3"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["e3"], ["re3"]),
             helper.make_node("Concat", ["re1", "re3"], ["cat"], axis=1),
             helper.make_node("Relu", ["cat"], ["rcat"]),
             helper.make_node("Conv", ["rcat", "W2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["r0", "Ws"], ["sc"]),
             helper.make_node("Add", ["c2", "sc"], ["s"]), helper.make_node("Relu", ["s"], ["rs"]),
             helper.make_node("GlobalAveragePool", ["rs"], ["g"]) if head == "GlobalAveragePool" else
             helper.make_node("AveragePool", ["rs"], ["g"], kernel_shape=[8, 8]),
             helper.make_node("MaxPool", ["rcat"], ["p"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
             helper.make_node("Conv", ["p", "W3"], ["y"], pads=[1, 1, 1, 1])]
    return make_model(nodes, [vi("x", ["N", 3, 8, 8])], [vi("y", ["N", 20, 4, 4]), vi("g", ["N", 2 * c, 1, 1])],
                      inits)


def blocked_values_of_runs(m, dev, x) -> set:
    """The values the inference plan of model m (input "x") keeps in channel blocks, after checking its recorded and
    replayed runs and the graph as imported against onnxruntime, and the replay against the recorded run."""
    rep, runs, plain = both(m, dev, [x])
    want = ort_run(m, {"x": x})
    for got in runs + [plain]:
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(runs[1][0], runs[2][0])  # the replay computes what the recorded run did
    return rep.inference_plan().blocked()


@pytest.mark.parametrize(("batch", "head"), [(1, "GlobalAveragePool"), (3, "GlobalAveragePool"), (2, "AveragePool")])
def test_activations_between_convolutions_stay_in_channel_blocks(dev, batch, head):
    # the device's channel-blocked layout (oneDNN's on x86) between convolutions, Relu, Add and Concat; NCHW for the
    # graph's outputs, what MaxPool reads and a convolution whose channels are not whole blocks
    blocked = blocked_values_of_runs(fire_and_residual(head=head), dev, arr(batch, 3, 8, 8))
    if dev.channel_block == 0:  # no blocked layout on this device (no oneDNN): nothing changes
        assert blocked == set()
        return
    # r0 feeds three convolutions; the residual sum (read by the pooling to 1x1) and the shortcut it adds; the
    # concatenation, its inputs, its Relu and that one's pooling; not y (an output, and 20 channels)
    assert blocked == {"r0", "rs", "sc", "re1", "re3", "cat", "rcat", "p"}, blocked


@pytest.mark.parametrize("batch", [1, 2])
def test_grouped_convolutions_run_on_nchw_and_depthwise_ones_in_channel_blocks(dev, batch):
    # a ShuffleNet unit: grouped 1x1 Conv-Relu (4 groups of 16 channels: whole blocks of 8 or 16), channel shuffle,
    # depthwise 3x3, grouped 1x1 + residual -> Relu; then a plain Conv-Relu -> GlobalAveragePool and, on the side,
    # a depthwise Conv-Relu -> Conv. oneDNN's blocked grouped kernels are slow (see singa_onnx.layout): no value a
    # grouped convolution reads or writes is blocked; depthwise and plain convolutions keep theirs.
    c, g = 64, 4
    inits = [nh.from_array(arr(c, 3, 3, 3, scale=0.3), "W0"), nh.from_array(arr(c, c // g, 1, 1, scale=0.2), "Wg1"),
             nh.from_array(np.array([0, g, c // g, 8, 8], np.int64), "split"),
             nh.from_array(np.array([0, c, 8, 8], np.int64), "merge"),
             nh.from_array(arr(c, 1, 3, 3, scale=0.3), "Wd"), nh.from_array(arr(c, scale=0.1), "Bd"),
             nh.from_array(arr(c, c // g, 1, 1, scale=0.2), "Wg2"), nh.from_array(arr(c, c, 3, 3, scale=0.05), "W3"),
             nh.from_array(arr(c, 1, 3, 3, scale=0.3), "Wd2"), nh.from_array(arr(8, c, 1, 1, scale=0.2), "W4")]
    nodes = [helper.make_node("Conv", ["x", "W0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "Wg1"], ["a"], group=g), helper.make_node("Relu", ["a"], ["ra"]),
             helper.make_node("Reshape", ["ra", "split"], ["s5"]),
             helper.make_node("Transpose", ["s5"], ["t5"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["t5", "merge"], ["s"]),
             helper.make_node("Conv", ["s", "Wd", "Bd"], ["d"], pads=[1, 1, 1, 1], group=c),
             helper.make_node("Conv", ["d", "Wg2"], ["e"], group=g), helper.make_node("Add", ["e", "r0"], ["u"]),
             helper.make_node("Relu", ["u"], ["y2"]),
             helper.make_node("Conv", ["y2", "W3"], ["c3"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c3"], ["rc3"]), helper.make_node("GlobalAveragePool", ["rc3"], ["gp"]),
             helper.make_node("Conv", ["rc3", "Wd2"], ["d2"], pads=[1, 1, 1, 1], group=c),
             helper.make_node("Relu", ["d2"], ["rd2"]), helper.make_node("Conv", ["rd2", "W4"], ["y"])]
    m = make_model(nodes, [vi("x", ["N", 3, 8, 8])], [vi("y", ["N", 8, 8, 8]), vi("gp", ["N", c, 1, 1])], inits)
    blocked = blocked_values_of_runs(m, dev, arr(batch, 3, 8, 8))
    if dev.channel_block == 0:
        assert blocked == set()
        return
    assert blocked == {"rc3", "rd2"}, blocked


def test_attention_scale_folds_into_the_product(dev):
    # MatMul -> Div by a scalar constant (attention's 1 / sqrt(d)) and Mul(constant, MatMul) run as FusedMatMul with
    # that alpha; a Div of a constant by the product, a per-column divisor and a product also read elsewhere do not
    inits = [nh.from_array(np.array(8.0, np.float32), "c"), nh.from_array(np.array([0.5], np.float32), "h"),
             nh.from_array(arr(6, positive=True), "col")]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Div", ["s", "c"], ["sd"]),
             helper.make_node("Softmax", ["sd"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "k"], ["o1"]), helper.make_node("Mul", ["h", "o1"], ["y1"]),
             helper.make_node("MatMul", ["q", "kt"], ["s2"]), helper.make_node("Div", ["c", "s2"], ["y2"]),
             helper.make_node("MatMul", ["q", "kt"], ["s3"]), helper.make_node("Div", ["s3", "col"], ["y3"]),
             helper.make_node("MatMul", ["q", "kt"], ["s4"]), helper.make_node("Div", ["s4", "c"], ["y4a"]),
             helper.make_node("Relu", ["s4"], ["y4b"])]
    shapes = {"y1": [2, 3, 6, 5], "y2": [2, 3, 6, 6], "y3": [2, 3, 6, 6], "y4a": [2, 3, 6, 6], "y4b": [2, 3, 6, 6]}
    m = make_model(nodes, [vi("q", [2, 3, 6, 5]), vi("k", [2, 3, 6, 5])], [vi(n, s) for n, s in shapes.items()], inits)
    q, k = arr(2, 3, 6, 5), arr(2, 3, 6, 5)
    rep, runs, plain = both(m, dev, {"q": q, "k": k})
    fused = [n for n in rep.inference_plan().program.nodes if n.op_type == "FusedMatMul"]
    assert sorted(n.outputs[0] for n in fused) == ["sd", "y1"]
    assert sorted(n.attrs["alpha"] for n in fused) == [0.125, 0.5]
    want = ort_run(m, {"q": q, "k": k})
    for got in runs + [plain]:
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("ta", "tb", "alpha"), [(0, 0, 0.5), (1, 0, 2.0), (0, 1, -1.5), (1, 1, 1.0)])
def test_onnxruntime_fused_matmul_imports(dev, ta, tb, alpha):
    # com.microsoft FusedMatMul as onnxruntime's optimiser saves it: alpha * op(A) @ op(B), batched
    a_shape = [2, 4, 3] if ta else [2, 3, 4]
    b_shape = [2, 5, 4] if tb else [2, 4, 5]
    node = helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft", alpha=alpha, transA=ta,
                            transB=tb)
    g = helper.make_graph([node], "m", [vi("a", a_shape), vi("b", b_shape)], [vi("y", [2, 3, 5])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 9
    a, b = arr(*a_shape), arr(*b_shape)
    want = ort_run(m, {"a": a, "b": b})[0]
    for optimize in (True, False):
        got = sonnx.prepare(m, dev, optimize=optimize).run({"a": a, "b": b})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset", [11, 13])
def test_identity_and_inference_dropout_are_left_out(dev, opset):
    # SqueezeNet's Dropout before its last convolution, an Identity before it: the convolution reads their input,
    # which stays in channel blocks; a Dropout whose mask is read, one in training mode and an Identity giving a graph
    # output stay in the program
    c = 16
    inits = [nh.from_array(arr(c, 3, 3, 3, scale=0.3), "W0"), nh.from_array(arr(c, c, 1, 1, scale=0.2), "W1"),
             nh.from_array(arr(c, 3, 1, 1, scale=0.2), "W2")]
    drop = ["ratio", "off"] if opset >= 13 else []
    if opset >= 13:
        inits += [nh.from_array(np.array(0.5, np.float32), "ratio"), nh.from_array(np.array(False), "off"),
                  nh.from_array(np.array(True), "on")]
    nodes = [helper.make_node("Conv", ["x", "W0"], ["c0"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Identity", ["r0"], ["i0"]),
             helper.make_node("Dropout", ["i0"] + drop, ["d0", "unread_mask"]),
             helper.make_node("Dropout", ["d0"], ["d1"]),
             helper.make_node("Conv", ["d1", "W1"], ["c1"]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("GlobalAveragePool", ["r1"], ["g"]), helper.make_node("Identity", ["r1"], ["r1_out"]),
             helper.make_node("Dropout", ["x"], ["d2", "mask"]), helper.make_node("Conv", ["d2", "W2"], ["y"])]
    outputs = [vi("g", ["N", c, 1, 1]), vi("y", ["N", c, 8, 8]), vi("mask", ["N", 3, 8, 8], TP.BOOL),
               vi("r1_out", ["N", c, 8, 8])]
    if opset >= 13:  # training_mode a constant true: random, so only its sum is an output
        nodes += [helper.make_node("Dropout", ["x", "ratio", "on"], ["t"]),
                  helper.make_node("ReduceSum", ["t"], ["ts"], keepdims=0)]
        outputs.append(vi("ts", []))
    m = make_model(nodes, [vi("x", ["N", 3, 8, 8])], outputs, inits, opset=opset)
    x = arr(2, 3, 8, 8)
    rep, runs, plain = both(m, dev, [x])
    kinds = [n.op_type for n in rep.inference_plan().program.nodes]
    assert kinds.count("Identity") == 1, kinds
    assert kinds.count("Dropout") == 1 + (opset >= 13), kinds
    want = ort_run(m, {"x": x})
    for got in runs + [plain]:
        for k in (0, 1, 3):
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4)
        # all true outside training (onnx.reference; onnxruntime's opset-11 kernel gives all false)
        assert got[2].dtype == np.bool_
        assert got[2].shape == x.shape
        assert got[2].all()
    if opset >= 13:  # half the elements dropped, the others doubled
        assert np.isfinite(runs[-1][4])
        assert abs(runs[-1][4] - np.sum(x, dtype=np.float64)) > 1e-3
    # r1 is read by the Identity that stays
    assert rep.inference_plan().blocked() == ({"r0"} if dev.channel_block else set())


@pytest.mark.parametrize(("activation", "params"), [("Relu", []), ("", []), ("LeakyRelu", [0.2]), ("Tanh", []),
                                                    ("Sigmoid", []), ("Clip", [-0.5, 0.7]),
                                                    ("HardSigmoid", [0.3, 0.4])])
@pytest.mark.parametrize("with_z", [False, True], ids=["no-z", "z"])
def test_onnxruntime_fused_conv_imports(dev, activation, params, with_z):
    # com.microsoft FusedConv, as onnxruntime's optimiser saves it: Y = activation(Conv(X, W, B) + Z)
    inits = [nh.from_array(arr(5, 3, 3, 3, scale=0.3), "W"), nh.from_array(arr(5, scale=0.1), "B")]
    attrs = {"pads": [1, 0, 1, 2], "strides": [1, 2]}
    if activation:
        attrs["activation"] = activation
    if params:
        attrs["activation_params"] = params
    node = helper.make_node("FusedConv", ["x", "W", "B"] + (["z"] if with_z else []), ["y"], domain="com.microsoft",
                            **attrs)
    g = helper.make_graph([node], "m", [vi("x", ["N", 3, 7, 7])] + ([vi("z", ["N", 5, 7, 4])] if with_z else []),
                          [vi("y", ["N", 5, 7, 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 9
    feeds = {"x": arr(2, 3, 7, 7)} | ({"z": arr(2, 5, 7, 4)} if with_z else {})
    want = ort_run(m, feeds)[0]
    rep, runs, plain = both(m, dev, list(feeds.values()))
    for got in runs + [plain]:
        np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-5)



def test_batchnorm_and_channel_affine_fold_into_convolutions(dev):
    m = conv_bn_affine()
    x = arr(2, 3, 8, 8)
    rep, runs, plain = both(m, dev, [x])
    prog = rep.inference_plan().program
    assert [n.op_type for n in prog.nodes] == ["FusedConv", "BatchNormalization", "Relu", "FusedConv"]
    want = ort_run(m, {"x": x})[0]
    for got in runs:
        np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(got[0], runs[0][0])  # replays: bit for bit
    np.testing.assert_allclose(plain[0], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["shared", "training_mode", "not_per_channel", "other_axis"])
def test_what_is_not_folded_still_computes_the_same(dev, case):
    inits = [nh.from_array(arr(4, 3, 3, 3, scale=0.3), "W")] + bn_inits("bn", 4)
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1])]
    outputs = [vi("y", [2, 4, 6, 6])]
    opset = 17
    if case == "shared":  # the convolution's output is read twice: BN stays
        nodes += [bn_node("c", "n", "bn"), helper.make_node("Add", ["n", "c"], ["y"])]
    elif case == "training_mode":  # batch statistics: not a fixed affine map
        nodes += [helper.make_node("BatchNormalization", ["c"] + [f"bn.{k}" for k in "sbmv"], ["y", "rm", "rv"],
                                   training_mode=1)]
        outputs += [vi("rm", [4]), vi("rv", [4])]
        opset = 15
    elif case == "not_per_channel":  # a constant that varies along the width
        inits.append(nh.from_array(arr(1, 1, 1, 6), "k"))
        nodes += [helper.make_node("Mul", ["c", "k"], ["y"])]
    else:  # one value per row, broadcast over channels: not a channel scale
        inits.append(nh.from_array(arr(6, 1), "k"))
        nodes += [helper.make_node("Add", ["c", "k"], ["y"])]
    m = make_model(nodes, [vi("x", [2, 3, 6, 6])], outputs, inits, opset=opset)
    x = arr(2, 3, 6, 6)
    rep, runs, plain = both(m, dev, [x])
    assert len(rep.inference_plan().program.nodes) == len(nodes)
    want = ort_run(m, {"x": x})
    for got in runs + [plain]:
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_constant_subgraphs_fold_and_constant_outputs_are_not_shared(dev):
    inits = [nh.from_array(np.array([2, 3], np.int64), "shape"), nh.from_array(arr(6), "v")]
    nodes = [helper.make_node("Reshape", ["v", "shape"], ["v2"]),
             helper.make_node("Transpose", ["v2"], ["vt"]),
             helper.make_node("Add", ["x", "vt"], ["y"]),
             helper.make_node("Mul", ["vt", "vt"], ["c"])]
    m = make_model(nodes, [vi("x", [3, 2])], [vi("y", [3, 2]), vi("c", [3, 2])], inits)
    x = arr(3, 2)
    rep = sonnx.prepare(m, dev)
    y, c = rep.run([x])
    assert [n.op_type for n in rep.inference_plan().program.nodes] == ["Add"]
    want = ort_run(m, {"x": x})
    np.testing.assert_allclose(y, want[0], rtol=1e-6)
    np.testing.assert_allclose(c, want[1], rtol=1e-6)
    c[...] = 0  # the caller's copy
    for _ in range(3):
        np.testing.assert_allclose(rep.run([x])[1], want[1], rtol=1e-6)


# -- recorded runs ----------------------------------------------------------------------------------------------------


def test_recorded_runs_follow_shapes_and_keep_results_apart(dev):
    m = conv_bn_affine()
    rep = sonnx.prepare(m, dev)
    plan = None
    results = []
    for n in (1, 2, 1, 2, 1, 2, 3):
        x = arr(n, 3, 8, 8)
        got = rep.run([x])[0]
        np.testing.assert_allclose(got, ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-5)
        results.append((x, got))
        plan = rep.inference_plan()
    assert plan.graphs() == 2  # batch 1 and 2 recorded on their second run; batch 3 ran once
    for x, got in results:  # earlier results were not overwritten by later replays
        np.testing.assert_allclose(got, ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_tensor_inputs_give_independent_tensor_outputs(dev):
    m = conv_bn_affine()
    rep = sonnx.prepare(m, dev)
    xs = [arr(2, 3, 8, 8) for _ in range(4)]
    outs = [rep.run([tensor.Tensor(device=dev, data=x)])[0] for x in xs]
    assert all(isinstance(o, tensor.Tensor) for o in outs)
    assert rep.inference_plan().graphs() == 1
    for x, o in zip(xs, outs):
        np.testing.assert_allclose(tensor.to_numpy(o), ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-5)
    # a strided input tensor is copied into the recorded one
    big = tensor.Tensor(device=dev, data=np.concatenate(xs[:2], axis=3))
    view = big[:, :, :, 8:]
    np.testing.assert_allclose(tensor.to_numpy(rep.run([view])[0]), ort_run(m, {"x": xs[1]})[0], rtol=1e-4,
                               atol=1e-5)


def test_data_dependent_shapes_run_eagerly_every_time(dev):
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Transpose", ["nz"], ["y"])]
    m = make_model(nodes, [vi("x", [4])], [vi("y", ["n", 1], TP.INT64)])
    rep = sonnx.prepare(m, dev)
    for _ in range(4):
        x = (RNG.random(4) > 0.5).astype(np.float32)
        np.testing.assert_array_equal(rep.run([x])[0], np.transpose(np.nonzero(x)))
    assert rep.inference_plan().graphs() == 0


def test_reshape_by_an_input_shape_tensor(dev):
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"])]
    m = make_model(nodes, [vi("x", [6]), vi("s", [2], TP.INT64)], [vi("y", ["a", "b"])])
    rep = sonnx.prepare(m, dev)
    x = arr(6)
    for s in ([2, 3], [3, 2], [2, 3], [6, 1], [3, 2]):
        np.testing.assert_array_equal(rep.run([x, np.array(s, np.int64)])[0], x.reshape(s))


# -- the optimised graph follows the tensors ------------------------------------------------------------------------


def test_retraining_then_inference_uses_the_new_weights(dev):
    m = conv_bn_affine()
    rep = sonnx.prepare(m, dev)
    x = arr(2, 3, 8, 8)
    for _ in range(3):
        before = rep.run([x])[0]
    assert rep.inference_plan() is not None
    for t in rep.tensor_map.values():
        t.requires_grad = t.stores_grad = True
    sgd = opt.SGD(lr=0.05)
    tx = tensor.Tensor(device=dev, data=x)
    autograd.training = True
    try:
        for _ in range(2):
            y = rep.run([tx])[0]
            loss = autograd.mse_loss(y, tensor.Tensor(device=dev, data=np.zeros(y.shape, np.float32)))
            for p, g in autograd.backward(loss):
                sgd.update(p, g)
    finally:
        autograd.training = False
    assert rep.inference_plan() is None  # trainable: the graph as imported runs
    trained_plain = rep.run([x])[0]
    for t in rep.tensor_map.values():
        t.requires_grad = t.stores_grad = False
    for _ in range(3):
        np.testing.assert_allclose(rep.run([x])[0], trained_plain, rtol=1e-4, atol=1e-5)
    assert not np.allclose(trained_plain, before, rtol=1e-3)


def test_replaced_and_rewritten_tensors(dev):
    m = conv_bn_affine()
    rep = sonnx.prepare(m, dev)
    x = arr(1, 3, 8, 8)
    for _ in range(3):
        rep.run([x])
    w = tensor.to_numpy(rep.tensor_map["W1"]) * 2
    rep.tensor_map["W1"] = tensor.Tensor(device=dev, data=w)  # another tensor: noticed
    m2 = onnx.ModelProto()
    m2.CopyFrom(m)
    for t in m2.graph.initializer:
        if t.name == "W1":
            t.CopyFrom(nh.from_array(w, "W1"))
    want = ort_run(m2, {"x": x})[0]
    for _ in range(3):
        np.testing.assert_allclose(rep.run([x])[0], want, rtol=1e-4, atol=1e-5)
    rep.tensor_map["W1"].copy_from_numpy(w / 2)  # written in place: refresh() says so
    rep.refresh()
    for _ in range(3):
        np.testing.assert_allclose(rep.run([x])[0], ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_inside_a_recorded_model_step_the_rep_runs_eagerly(dev):
    m = conv_bn_affine()
    rep = sonnx.prepare(m, dev)

    class Net(model.Model):
        def forward(self, x):
            return rep.run([x])[0]

        def train_one_batch(self, x):
            return self.forward(x)

    net = Net()
    x = arr(2, 3, 8, 8)
    tx = tensor.Tensor(device=dev, data=x)
    net.compile([tx], is_train=True, use_graph=True, sequential=True)
    for _ in range(3):
        xi = arr(2, 3, 8, 8)
        tx.copy_from_numpy(xi)
        out = net(tx)
        np.testing.assert_allclose(tensor.to_numpy(out), ort_run(m, {"x": xi})[0], rtol=1e-4, atol=1e-5)


# -- handlers rewritten for speed ------------------------------------------------------------------------------------


def _lrn_reference(x, size, alpha, beta, bias):
    c_n = x.shape[1]
    sq = np.zeros(x.shape)
    for c in range(c_n):
        lo, hi = max(0, c - (size - 1) // 2), min(c_n - 1, c + size // 2)
        sq[:, c] = np.sum(x[:, lo:hi + 1].astype(np.float64) ** 2, axis=1)
    return x / (bias + alpha / size * sq) ** beta


@pytest.mark.parametrize(("shape", "size", "beta"), [((2, 7, 5, 5), 5, 0.75), ((1, 4, 6), 4, 0.5),
                                                   ((2, 5, 3, 3), 1, 1.0), ((2, 6, 4, 4), 2, 0.6),
                                                   ((1, 3, 2, 2), 7, 0.75)])
def test_lrn_channel_window_sums_and_powers(dev, shape, size, beta):
    m = make_model([helper.make_node("LRN", ["x"], ["y"], size=size, alpha=1e-2, beta=beta, bias=2.0)],
                   [vi("x", list(shape))], [vi("y", list(shape))])
    x = arr(*shape, scale=5.0)
    want = _lrn_reference(x, size, 1e-2, beta, 2.0)
    for optimize in (False, True):
        got = sonnx.prepare(m, dev, optimize=optimize).run([x])[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_lrn_gradient(dev):
    shape = (2, 6, 3, 3)
    m = make_model([helper.make_node("LRN", ["x"], ["y"], size=3, alpha=0.5, beta=0.75, bias=1.0)],
                   [vi("x", list(shape))], [vi("y", list(shape))])
    rep = sonnx.prepare(m, dev)
    x = RNG.standard_normal(shape)
    r = RNG.standard_normal(shape)
    eps = 1e-3
    num = np.zeros(shape)
    for i in np.ndindex(shape):
        d = np.zeros(shape)
        d[i] = eps
        num[i] = np.sum((_lrn_reference(x + d, 3, 0.5, 0.75, 1.0) - _lrn_reference(x - d, 3, 0.5, 0.75, 1.0)) * r) / (
            2 * eps)
    tx = tensor.Tensor(device=dev, data=x.astype(np.float32))
    tx.requires_grad = tx.stores_grad = True
    autograd.training = True
    y = rep.run([tx])[0]
    loss = autograd.reduce_sum(autograd.mul(y, tensor.Tensor(device=dev, data=r.astype(np.float32))), None, 0)
    grads = {id(p): g for p, g in autograd.backward(loss)}
    np.testing.assert_allclose(tensor.to_numpy(grads[id(tx)]), num, rtol=1e-3, atol=1e-4)


def fc_stack():
    """Flatten -> Gemm (transB=1, as exporters write a linear layer) -> Relu -> Gemm (alpha, beta) -> MatMul by a
    one-column weight: at batch 1 every product has a single output row (and the last one a single column too)."""
    inits = [nh.from_array(arr(32, 48, scale=0.2), "W1"), nh.from_array(arr(32, scale=0.1), "b1"),
             nh.from_array(arr(32, 24, scale=0.2), "W2"), nh.from_array(arr(24, scale=0.1), "b2"),
             nh.from_array(arr(24, 1, scale=0.2), "W3")]
    nodes = [helper.make_node("Flatten", ["x"], ["f"]),
             helper.make_node("Gemm", ["f", "W1", "b1"], ["g1"], transB=1),
             helper.make_node("Relu", ["g1"], ["r1"]),
             helper.make_node("Gemm", ["r1", "W2", "b2"], ["g2"], alpha=0.5, beta=2.0),
             helper.make_node("MatMul", ["g2", "W3"], ["y"])]
    return make_model(nodes, [vi("x", ["N", 3, 4, 4])], [vi("y", ["N", 1])], inits)


def test_fully_connected_layers_read_their_weights_in_place(dev):
    m = fc_stack()
    rep = sonnx.prepare(m, dev)
    for n in (1, 1, 1, 3, 3, 3):  # batch 1: single-row products; batch 3: the last one a single column
        x = arr(n, 3, 4, 4)
        runs = [rep.run([x])[0] for _ in range(3)]
        for got in runs:
            np.testing.assert_allclose(got, ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-5)
            np.testing.assert_array_equal(got, runs[0])
    plan = rep.inference_plan()
    calls = [c for r in plan._graphs.values() if r is not None for c in r.graph.calls]
    assert plan.graphs() == 2
    # the transposed weight is handed to the product with a transpose flag, not copied at every run
    assert not [c.name for c in calls if c.kind != "kernel" or c.name == "copy"]
    products = [c for c in calls if c.name == "matmul"]
    assert len(products) == 6
    for c in products:
        for spec in c.specs:
            shape, strides = spec[3], spec[4]
            assert strides == contiguous_strides(shape), (c.params, shape, strides)
    assert [c.params["trans_b"] for c in products] == [True, False, False] * 2
    assert [c.specs[2][3][1:] for c in products[:3]] == [(32, 48), (32, 24), (24, 1)]  # the weights as stored


# -- onnx's own cases, each run three times: eager, recorded, replayed ----------------------------------------------


def _replay_backend():
    from singa_onnx import SingaBackend

    class Thrice:
        def __init__(self, rep):
            self.rep = rep

        def run(self, inputs, **kwargs):
            first = self.rep.run(inputs, **kwargs)
            for _ in range(2):
                again = self.rep.run(inputs, **kwargs)
                for a, b in zip(first, again):
                    if isinstance(a, np.ndarray) and a.dtype != object:
                        np.testing.assert_array_equal(a, b)
            return again

    class Backend(SingaBackend):
        @classmethod
        def prepare(cls, model, device="CPU", **kwargs):
            return Thrice(SingaBackend.prepare(model, device, **kwargs))

    return Backend


def _suite():
    import onnx.backend.test as backend_test

    from singa_onnx.conformance import excluded

    bt = backend_test.BackendTest(_replay_backend(), __name__)
    for pattern, _ in excluded(device.get_device("cpu")):
        bt.exclude(pattern)
    for pattern in (r"bernoulli", r"dropout", r"random", r"multinomial"):  # fresh draws at every run
        bt.exclude(pattern)
    cases = bt.test_cases
    # every model case, and the node cases of the operators the rewrites and recordings touch
    node_ops = re.compile(r"^test_(conv|batchnorm|maxpool|averagepool|globalaveragepool|lrn|relu|add|mul|sum|gemm|"
                          r"matmul|concat|reshape|flatten|softmax|unsqueeze|transpose|constant|shape|range|if|loop|"
                          r"scan|nonzero|sequence)")
    for cls_name, cls in cases.items():
        for name in [n for n in vars(cls) if n.startswith("test_")]:
            if ("Node" in cls_name and not node_ops.search(name)) or not name.endswith("_cpu"):
                delattr(cls, name)
    return {f"{k}Replayed": type(f"{k}Replayed", (v,), {"__module__": __name__}) for k, v in cases.items()}


globals().update(_suite())


def _reset_onednn():
    try:
        from singa_backend_cpu import onednn
    except ImportError:
        return
    onednn.reset()


@pytest.mark.parametrize("setting", ["1", "auto"])
def test_conv_weights_are_constant_while_the_plan_lives(dev, monkeypatch, setting):
    """The inference plan declares its convolution weights constant (a backend may keep them in its library's
    layout: the CPU backend keeps oneDNN-reordered copies); refresh() and training end that, and weights written in
    place and refreshed are the ones used."""
    from singa.backend import constant_token

    monkeypatch.setenv("SINGA_ONEDNN", setting)
    _reset_onednn()
    w = arr(32, 16, 3, 3, scale=0.2)
    m = make_model([helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1])], [vi("x", ["N", 16, 12, 12])],
                   [vi("y", ["N", 32, 12, 12])], [nh.from_array(w, "W")])
    rep = sonnx.prepare(m, dev)
    x = arr(2, 16, 12, 12)
    for _ in range(4):  # eager, recorded, replayed twice
        np.testing.assert_allclose(rep.run([x])[0], ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-4)
    weight = rep.tensor_map["W"]
    assert constant_token(weight.buffer) > 0
    w2 = arr(32, 16, 3, 3, scale=0.2)
    weight.copy_from_numpy(w2)
    rep.refresh()
    assert constant_token(weight.buffer) == 0
    m2 = make_model([helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1])], [vi("x", ["N", 16, 12, 12])],
                    [vi("y", ["N", 32, 12, 12])], [nh.from_array(w2, "W")])
    want = ort_run(m2, {"x": x})[0]
    for _ in range(4):
        np.testing.assert_allclose(rep.run([x])[0], want, rtol=1e-4, atol=1e-4)
    weight.requires_grad = weight.stores_grad = True  # being trained: the plan is dropped, the promise ended
    rep.inference_plan()
    assert constant_token(weight.buffer) == 0
    _reset_onednn()


def _gelu_model(form: str, erf_is_output: bool = False):
    """x -> MatMul -> GELU in one of the spellings exporters write -> y."""
    c = lambda name, v: helper.make_node("Constant", [], [name], value=nh.from_array(np.array(v, np.float32)))  # noqa: E731
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"])]
    if form == "div":
        nodes += [c("s", 1.4142135381698608), helper.make_node("Div", ["h", "s"], ["d"])]
    else:
        nodes += [c("s", 0.7071067690849304), helper.make_node("Mul", ["s", "h"], ["d"])]
    nodes += [helper.make_node("Erf", ["d"], ["e"]), c("one", 1.0), helper.make_node("Add", ["one", "e"], ["a"]),
              c("half", 0.5)]
    if form == "half-first":
        nodes += [helper.make_node("Mul", ["h", "half"], ["hh"]), helper.make_node("Mul", ["hh", "a"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["h", "a"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y"])]
    outs = [vi("y", ["N", 16])] + ([vi("e", ["N", 16])] if erf_is_output else [])
    return make_model(nodes, [vi("x", ["N", 8])], outs, [nh.from_array(arr(8, 16), "W")])


def _gelu_tanh_model(form: str, cube_is_output: bool = False):
    """x -> MatMul -> tanh-GELU as PyTorch ('torch': x * (x * x), (h * (1 + t)) * 0.5) or Hugging Face's gelu_new
    ('pow': Pow(x, 3), (0.5 * h) * (1 + t)) export it -> y."""
    c = lambda name, v: helper.make_node("Constant", [], [name], value=nh.from_array(np.array(v, np.float32)))  # noqa: E731
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"])]
    if form == "pow":
        nodes += [c("three", 3.0), helper.make_node("Pow", ["h", "three"], ["cube"])]
    else:
        nodes += [helper.make_node("Mul", ["h", "h"], ["sq"]), helper.make_node("Mul", ["h", "sq"], ["cube"])]
    nodes += [c("a", 0.044715), helper.make_node("Mul", ["a", "cube"], ["ac"]),
              helper.make_node("Add", ["h", "ac"], ["inner"]), c("k", 0.7978845834732056),
              helper.make_node("Mul", ["k", "inner"], ["u"]), helper.make_node("Tanh", ["u"], ["t"]),
              c("one", 1.0), helper.make_node("Add", ["one", "t"], ["p"]), c("half", 0.5)]
    if form == "pow":
        nodes += [helper.make_node("Mul", ["half", "h"], ["hh"]), helper.make_node("Mul", ["hh", "p"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["h", "p"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y"])]
    outs = [vi("y", ["N", 16])] + ([vi("cube", ["N", 16])] if cube_is_output else [])
    return make_model(nodes, [vi("x", ["N", 8])], outs, [nh.from_array(arr(8, 16), "W")])


GELU_FORMS = [("erf", "div"), ("erf", "mul"), ("erf", "half-first"), ("tanh", "torch"), ("tanh", "pow")]


def _gelu_any(kind: str, form: str, part_is_output: bool = False):
    return _gelu_model(form, part_is_output) if kind == "erf" else _gelu_tanh_model(form, part_is_output)


@pytest.mark.parametrize(("kind", "form"), GELU_FORMS, ids=[f"{k}-{f}" for k, f in GELU_FORMS])
def test_gelu_spelled_out_runs_as_one_node(dev, kind, form):
    m = _gelu_any(kind, form)
    rep = sonnx.prepare(m, dev)
    x = arr(5, 8, scale=2.0)
    want = ort_run(m, {"x": x})[0]
    for _ in range(3):
        np.testing.assert_allclose(rep.run([x])[0], want, rtol=1e-5, atol=1e-6)
    plan = rep.inference_plan().program.nodes
    assert [n.op_type for n in plan] == ["MatMul", "Gelu"], [n.op_type for n in plan]
    assert plan[1].attrs.get("approximate") == ("none" if kind == "erf" else "tanh")


@pytest.mark.parametrize("kind", ["erf", "tanh"])
def test_gelu_whose_parts_are_read_elsewhere_is_left_as_it_is(dev, kind):
    m = _gelu_any(kind, "div" if kind == "erf" else "torch", part_is_output=True)
    rep = sonnx.prepare(m, dev)
    x = arr(5, 8, scale=2.0)
    want = ort_run(m, {"x": x})
    for _ in range(3):
        for g, w in zip(rep.run([x]), want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert ("Erf" if kind == "erf" else "Tanh") in [n.op_type for n in rep.inference_plan().program.nodes]




def test_autograd_on_keeps_the_plan_unless_a_gradient_flows_in(dev):
    """A training script leaves autograd on: inference of frozen tensors on inputs autograd does not follow (numpy,
    a plain Tensor) still replays the plan, with the same results; an input that requires a gradient runs the graph as
    imported, and its gradient arrives."""
    m = conv_bn_affine()
    rep = sonnx.prepare(m, dev)
    x = arr(2, 3, 8, 8)
    want = ort_run(m, {"x": x})[0]
    autograd.training = True
    try:
        for _ in range(4):
            np.testing.assert_allclose(rep.run([x])[0], want, rtol=1e-4, atol=1e-5)
        plan = rep.inference_plan()
        assert plan is not None
        assert plan.graphs() == 1  # the input shape's run was recorded, and replayed since
        tx = tensor.Tensor(device=dev, data=x)
        np.testing.assert_allclose(tensor.to_numpy(rep.run([tx])[0]), want, rtol=1e-4, atol=1e-5)
        tx.requires_grad = tx.stores_grad = True
        y = rep.run({"x": tx})[0]
        assert y.requires_grad
        loss = autograd.mse_loss(y, tensor.Tensor(device=dev, data=np.zeros(y.shape, np.float32)))
        grads = autograd.gradients(loss)
    finally:
        autograd.training = False
    np.testing.assert_allclose(tensor.to_numpy(y), want, rtol=1e-4, atol=1e-5)
    dx = tensor.to_numpy(grads[tx])
    assert dx.shape == x.shape
    assert np.all(np.isfinite(dx))
    assert np.any(dx != 0)


def test_threads_sharing_a_rep_take_turns(dev):
    # a plan's recorded runs share their buffers: runs from several threads must not interleave inside them
    from helpers import run_threads

    m = fire_and_residual()
    rep = sonnx.prepare(m, dev)
    xs = [arr(2, 3, 8, 8) for _ in range(4)]
    want = [ort_run(m, {"x": x}) for x in xs]
    errors: list = []

    def work(i: int) -> None:
        for _ in range(15):
            got = rep.run([xs[i]])
            if not all(np.allclose(g, w, rtol=1e-4, atol=1e-4) for g, w in zip(got, want[i])):
                errors.append(i)

    assert run_threads(work, 4) == []
    assert errors == []
