"""ONNX export (`singa_onnx.frontend.to_onnx`): every exportable operator and layer, the seeds' models and a ResNet
block are recorded, exported, checked with `onnx.checker.check_model(full_check=True)`, run in onnxruntime and
compared with SINGA's own inference-mode outputs for the same inputs; where the export has a symbolic batch, again at
another batch size. Then the errors: unsupported operators (class and position), unrecorded outputs, and the
batch-size analysis."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import MLP

from singa import autograd, device, layer, model, opt, tensor

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
frontend = pytest.importorskip("singa_onnx.frontend")
to_onnx = frontend.to_onnx
errors = pytest.importorskip("singa_onnx.errors")

from onnx_helpers import EarlierOnnxCNN  # noqa: E402

DEV = device.get_default_device()
RNG = np.random.default_rng(2024)


def T(a, dtype=None, **kw) -> tensor.Tensor:
    a = np.asarray(a) if dtype is None else np.asarray(a, dtype=dtype)
    return tensor.Tensor(device=DEV, data=a, **kw)


def rn(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def uni(lo, hi):
    return lambda *shape: RNG.uniform(lo, hi, shape).astype(np.float32)


def halves(*shape) -> np.ndarray:
    """Values with many exact .5 fractions (the rounding rules differ there)."""
    return (RNG.integers(-6, 7, shape) + RNG.choice([0.5, 0.25, 0.0], shape)).astype(np.float32)


def as_list(y) -> list:
    if isinstance(y, tensor.Tensor):
        return [y]
    out = []
    for e in y:
        out.extend(as_list(e))
    return out


def host(y) -> np.ndarray:
    return y.to_numpy() if isinstance(y, tensor.Tensor) else np.asarray(y)


def ort_run(m, arrays) -> list[np.ndarray]:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return sess.run(None, dict(zip(names, arrays)))


def is_dynamic(m) -> bool:
    return any(d.dim_param == frontend.BATCH_DIM for i in m.graph.input for d in i.type.tensor_type.shape.dim)


def compare(outs, refs, rtol, atol) -> None:
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        assert o.shape == r.shape, (o.shape, r.shape)
        if r.dtype.kind in "iub":
            np.testing.assert_array_equal(o, r)
        else:
            np.testing.assert_allclose(o, r, rtol=rtol, atol=atol)


def check(fn, make_inputs, n: int = 4, other_n: int | None = 7, dynamic: bool | None = None, rtol: float = 1e-4,
          atol: float = 1e-5, opset: int | None = None, **export_kw):
    """Record fn on inputs of batch n, export, check, and compare onnxruntime with SINGA in inference mode (and at
    batch other_n when the export has a symbolic batch). Returns the model."""
    arrays = make_inputs(n)
    xs = [T(a) for a in arrays]
    autograd.training = True
    ys = as_list(fn(*xs))
    m = to_onnx(xs, ys, opset_version=opset, **export_kw)
    onnx.checker.check_model(m, full_check=True)
    autograd.training = False
    compare(ort_run(m, arrays), [y.to_numpy() for y in as_list(fn(*xs))], rtol, atol)
    if dynamic is not None:
        assert is_dynamic(m) == dynamic, m.doc_string
    if is_dynamic(m) and other_n:
        arrays = make_inputs(other_n)
        compare(ort_run(m, arrays), [y.to_numpy() for y in as_list(fn(*[T(a) for a in arrays]))], rtol, atol)
    return m


def one(gen, *shape):
    return lambda n: [gen(n, *shape)]


def op_types(m) -> list[str]:
    return [nd.op_type for nd in m.graph.node]


# -- element-wise operators of one input ------------------------------------------------------------------------------

UNARY = [
    ("relu", autograd.relu, rn), ("identity", autograd.identity, rn), ("sigmoid", autograd.sigmoid, rn),
    ("tanh", autograd.tanh, rn), ("cos", autograd.cos, rn), ("cosh", autograd.cosh, rn),
    ("acos", autograd.acos, uni(-0.9, 0.9)), ("acosh", autograd.acosh, uni(1.1, 3)), ("sin", autograd.sin, rn),
    ("sinh", autograd.sinh, rn), ("asin", autograd.asin, uni(-0.9, 0.9)), ("asinh", autograd.asinh, rn),
    ("tan", autograd.tan, uni(-1.2, 1.2)), ("atan", autograd.atan, rn), ("atanh", autograd.atanh, uni(-0.9, 0.9)),
    ("abs", autograd.abs, rn), ("exp", autograd.exp, rn), ("log", autograd.log, uni(0.1, 4)),
    ("sqrt", autograd.sqrt, uni(0.1, 4)), ("softplus", autograd.softplus, rn), ("softsign", autograd.softsign, rn),
    ("negative", autograd.negative, rn), ("reciprocal", autograd.reciprocal, uni(0.5, 3)), ("erf", autograd.erf, rn),
    ("gelu", autograd.gelu, rn), ("gelu_tanh", autograd.gelu_tanh, rn),
    ("sign", autograd.sign, halves), ("ceil", autograd.ceil, halves),
    ("floor", autograd.floor, halves), ("round", autograd.round, halves), ("rounde", autograd.rounde, halves),
    ("elu", lambda x: autograd.elu(x, 0.7), rn), ("selu", lambda x: autograd.selu(x, 1.5, 1.1), rn),
    ("leakyrelu", lambda x: autograd.leakyrelu(x, 0.1), rn),
    ("hardsigmoid", lambda x: autograd.hardsigmoid(x, 0.3, 0.4), rn),
    ("clip", lambda x: autograd.clip(x, -0.5, 0.7), rn), ("clip_min", lambda x: autograd.clip(x, -0.2), rn),
    ("clip_max", lambda x: autograd.clip(x, None, 0.3), rn),
    ("softmax", autograd.softmax, rn), ("softmax_axis_last", lambda x: autograd.softmax(x, -1), rn),
    ("softmax_axis0", lambda x: autograd.softmax(x, 0), rn), ("log_softmax", autograd.log_softmax, rn),
    ("log_softmax_axis2", lambda x: autograd.log_softmax(x, 2), rn),
    ("cast_int32", lambda x: autograd.cast(x, "int32"), uni(-9.9, 9.9)),
    ("cast_back", lambda x: autograd.cast(autograd.cast(x, tensor.int32), tensor.float32), uni(-9.9, 9.9)),
    ("dropout", lambda x: autograd.dropout(x, ratio=0.3), rn),
]


@pytest.mark.parametrize(("fn", "gen"), [pytest.param(f, g, id=name) for name, f, g in UNARY])
def test_unary(fn, gen) -> None:
    check(fn, one(gen, 3, 5), dynamic=True)


def test_gelu_native_from_opset_20() -> None:
    assert "Gelu" not in op_types(check(autograd.gelu, one(rn, 6)))
    assert "Gelu" in op_types(check(autograd.gelu, one(rn, 6), opset=20))


def test_gelu_tanh_native_from_opset_20() -> None:
    assert "Tanh" in op_types(check(autograd.gelu_tanh, one(rn, 6)))
    exported = op_types(check(autograd.gelu_tanh, one(rn, 6), opset=20))
    assert "Gelu" in exported
    assert "Tanh" not in exported


def test_round_goes_half_away_from_zero() -> None:
    x = np.array([[-2.5, -1.5, -0.5, 0.5, 1.5, 2.5]], np.float32)
    check(autograd.round, lambda n: [x], other_n=None)
    check(autograd.rounde, lambda n: [x], other_n=None)


# -- element-wise operators of several inputs ------------------------------------------------------------------------

BINARY = [
    ("add", autograd.add, rn, rn), ("sub", autograd.sub, rn, rn), ("mul", autograd.mul, rn, rn),
    ("div", autograd.div, rn, uni(0.5, 2)), ("pow", autograd.pow, uni(0.5, 2), rn),
    ("less", autograd.less, halves, halves), ("greater", autograd.greater, halves, halves),
    ("equal", autograd.equal, halves, halves), ("and", autograd._and, halves, halves),
    ("or", autograd._or, halves, halves), ("xor", autograd._xor, halves, halves),
    ("max", autograd.max, rn, rn), ("min", autograd.min, rn, rn),
]


@pytest.mark.parametrize(("fn", "ga", "gb"), [pytest.param(f, a, b, id=name) for name, f, a, b in BINARY])
def test_binary(fn, ga, gb) -> None:
    check(fn, lambda n: [ga(n, 3, 4), gb(n, 3, 4)], dynamic=True)


@pytest.mark.parametrize("fn", [autograd.add, autograd.mul, autograd.sub, autograd.div, autograd.max],
                         ids=["add", "mul", "sub", "div", "max"])
def test_binary_broadcasting_with_a_parameter(fn) -> None:
    w = T(uni(0.5, 2)(3, 1), stores_grad=True)
    m = check(lambda x: fn(x, w), one(rn, 3, 4), dynamic=True)
    assert len(m.graph.initializer) == 1


def test_not() -> None:
    check(autograd._not, one(halves, 5), dynamic=True)


def test_comparisons_of_bool_and_int_tensors() -> None:
    check(autograd._and, lambda n: [RNG.random((n, 3)) > 0.5, RNG.random((n, 3)) > 0.5])
    check(autograd.equal, lambda n: [RNG.integers(0, 3, (n, 4)).astype(np.int32), RNG.integers(0, 3, (n, 4))
                                     .astype(np.int32)])


@pytest.mark.parametrize("fn", [autograd.sum, autograd.mean], ids=["sum", "mean"])
def test_variadic(fn) -> None:
    check(lambda a, b, c: fn(a, b, c), lambda n: [rn(n, 3), rn(n, 3), rn(1, 3)], dynamic=True)


def test_prelu() -> None:
    slope = T(uni(0.05, 0.3)(3, 1, 1), stores_grad=True)
    check(lambda x: autograd.prelu(x, slope), one(rn, 3, 4, 4), dynamic=True)


def test_where_with_a_fixed_condition() -> None:
    cond = RNG.random((1, 5)) > 0.5
    check(lambda a, b: autograd.where(a, b, cond), lambda n: [rn(n, 5), rn(n, 5)], dynamic=True)


def test_where_with_a_condition_computed_in_the_graph() -> None:
    def fn(a, b):
        return autograd.where(a, b, autograd.greater(a, b))

    m = check(fn, lambda n: [rn(n, 5), rn(n, 5)], dynamic=True)
    assert {"Greater", "Where"} <= set(op_types(m))


def test_where_condition_as_graph_input() -> None:
    arrays = [rn(4, 3), rn(4, 3), RNG.random((4, 3)) > 0.5]
    a, b, c = T(arrays[0]), T(arrays[1]), T(arrays[2])
    autograd.training = True
    y = autograd.where(a, b, c)
    m = to_onnx([a, b, c], [y])
    onnx.checker.check_model(m, full_check=True)
    np.testing.assert_array_equal(ort_run(m, arrays)[0], np.where(arrays[2], arrays[0], arrays[1]))


# -- linear algebra ----------------------------------------------------------------------------------------------------


def test_matmul_2d_and_batched() -> None:
    w = T(rn(5, 3), stores_grad=True)
    check(lambda x: autograd.matmul(x, w), one(rn, 5), dynamic=True)
    check(autograd.matmul, lambda n: [rn(n, 2, 5), rn(n, 5, 3)], dynamic=True)


def test_add_bias_both_axes() -> None:
    b = T(rn(5), stores_grad=True)
    check(lambda x: autograd.add_bias(x, b, axis=0), one(rn, 5), dynamic=True)
    b2 = T(rn(1, 5), stores_grad=True)  # the seed's (1, n) bias
    check(lambda x: autograd.add_bias(x, b2, axis=0), one(rn, 5), dynamic=True)
    rows = T(rn(4), stores_grad=True)  # one bias per row fixes the batch size
    m = check(lambda x: autograd.add_bias(x, rows, axis=1), one(rn, 5), dynamic=False)
    assert "bias per row" in m.doc_string


@pytest.mark.parametrize(("ta", "tb"), [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_gemm(ta, tb) -> None:
    B = T(rn(*((3, 6) if tb else (6, 3))), stores_grad=True)
    C = T(rn(1, 3), stores_grad=True)
    make = one(rn, 6) if not ta else (lambda n: [rn(6, n)])
    check(lambda a: autograd.gemm(a, B, C, 0.7, 1.3, ta, tb), make, dynamic=not ta or None, other_n=None if ta else 7)


def test_gemm_and_linear_layers() -> None:
    g = layer.Gemm(4, alpha=0.5, beta=2.0)
    check(g, one(rn, 6), dynamic=True)
    lin = layer.Linear(3)
    check(lin, one(rn, 2, 6), dynamic=True)  # 3-D input: matmul + broadcast add
    fused = layer.Linear(3)
    check(fused, one(rn, 6), dynamic=True)  # 2-D input: one MatmulBias operator, exported as MatMul and Add
    nob = layer.Linear(3, bias=False)
    check(nob, one(rn, 6), dynamic=True)


def test_cossim() -> None:
    check(autograd.cossim, lambda n: [rn(n, 6), rn(n, 6)], dynamic=True)


# -- shape and layout ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("shape", "dynamic"), [((4, -1), True), ((-1, 15), True), ((4, 3, 5), True),
                                                ((0, 5, 3), True), ((3, 4, 5), False), ((60,), False)],
                         ids=["batch_first", "minus1", "explicit", "zero", "batch_moved", "all"])
def test_reshape(shape, dynamic) -> None:
    m = check(lambda x: autograd.reshape(x, shape), one(rn, 3, 5), other_n=None, dynamic=dynamic)
    if dynamic:  # a batch size written into the shape (4 here) stands for "the batch" in the export
        x = rn(7, 3, 5)
        want = x.reshape([7 if s == 4 else s for s in shape]) if shape[0] != 0 else x.reshape(7, 5, 3)
        np.testing.assert_array_equal(ort_run(m, [x])[0], want)


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
def test_flatten(axis) -> None:
    check(lambda x: autograd.flatten(x, axis), one(rn, 2, 3, 2), dynamic=True)


def test_squeeze_unsqueeze() -> None:
    check(lambda x: autograd.squeeze(x, [1, 3]), one(rn, 1, 3, 1), dynamic=True)
    check(lambda x: autograd.squeeze(x), one(rn, 1, 3, 1), dynamic=True)
    check(lambda x: autograd.unsqueeze(x, [1, -1]), one(rn, 3), dynamic=True)
    check(lambda x: autograd.unsqueeze(x, 0), one(rn, 3), dynamic=True)
    check(lambda x: autograd.squeeze(x, 0), lambda n: [rn(1, 3)], dynamic=False)


@pytest.mark.parametrize("perm", [None, (0, 2, 1), (2, 0, 1), (-1, 0, 1)])
def test_transpose(perm) -> None:
    check(lambda x: autograd.transpose(x, perm), one(rn, 3, 5), dynamic=True)


def test_concat() -> None:
    w = T(rn(1, 2), stores_grad=True)
    check(lambda a, b: autograd.cat([a, b, a], 1), lambda n: [rn(n, 3), rn(n, 2)], dynamic=True)
    check(lambda a: autograd.cat([a, w], 0), one(rn, 2), dynamic=True)
    wb = T(rn(4, 2), stores_grad=True)
    check(lambda a: autograd.cat([a, wb], 1), one(rn, 3), dynamic=False)  # parameter rows fix the batch


def test_split() -> None:
    check(lambda x: autograd.split(x, 1, [2, 3, 1]), one(rn, 6), dynamic=True)
    check(lambda x: autograd.split(x, -1, None, num_output=3), one(rn, 2, 7), dynamic=True)
    check(lambda x: autograd.split(x, 0, [1, 3]), lambda n: [rn(4, 5)], dynamic=False)


def test_slice() -> None:
    check(lambda x: autograd.slice(x, [1, 0], [4, 5], [2, 1]), one(rn, 5, 6), dynamic=True)
    check(lambda x: autograd.slice(x, [-1], [-6], [2], [-2]), one(rn, 3, 6), dynamic=True)
    check(lambda x: autograd.slice(x, [0], [1], [0]), lambda n: [rn(4, 3)], dynamic=False)


def test_expand_and_tile() -> None:
    # the batch size (4) written into the target shape becomes 1 ("keep the input's size") in the export
    m = check(lambda x: autograd.expand(x, [4, 2, 3]), one(rn, 1, 3), other_n=None, dynamic=True)
    x = rn(7, 1, 3)
    np.testing.assert_array_equal(ort_run(m, [x])[0], np.broadcast_to(x, (7, 2, 3)))
    m = check(lambda x: autograd.expand(x, [2, 4, 2, 3]), one(rn, 1, 3), other_n=None, dynamic=True)
    np.testing.assert_array_equal(ort_run(m, [x])[0], np.broadcast_to(x, (2, 7, 2, 3)))
    check(lambda x: autograd.expand(x, [4, 3]), lambda n: [rn(4, 1, 3)], dynamic=False)  # this 4 is not the batch
    check(lambda x: autograd.tile(x, [2, 3]), one(rn, 3), dynamic=True)
    check(lambda x: autograd.tile(x, [2]), one(rn, 3), dynamic=True)
    check(lambda x: autograd.tile(x, [2, 1, 3]), one(rn, 3), dynamic=True)


@pytest.mark.parametrize(("mode", "pads"), [("constant", [0, 1, 2, 0, 2, 1]), ("reflect", [0, 2, 1, 0, 1, 2]),
                                            ("edge", [0, 1, 0, 0, 3, 2]), ("constant", [0, -1, 1, 0, 1, -1])],
                         ids=["constant", "reflect", "edge", "crop"])
def test_pad(mode, pads) -> None:
    check(lambda x: autograd.pad(x, mode, pads, 0.5), one(rn, 4, 5), dynamic=True)


def test_upsample() -> None:
    check(lambda x: autograd.upsample(x, "nearest", [1, 1, 2, 3]), one(rn, 2, 3, 2), dynamic=True)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_and_back(mode) -> None:
    check(lambda x: autograd.depth_to_space(x, 2, mode), one(rn, 8, 2, 3), dynamic=True)
    check(lambda x: autograd.space_to_depth(x, 2, mode), one(rn, 2, 4, 6), dynamic=True)


def test_shape_and_constant_of_shape() -> None:
    check(autograd.shape, one(rn, 3, 2), dynamic=True)
    check(lambda x: autograd.constant_of_shape(autograd.shape(x), 1.5), one(rn, 3), dynamic=True)
    value = np.array([7], np.int32)
    check(lambda x: autograd.constant_of_shape(autograd.shape(x), value), one(rn, 2), dynamic=True)


def test_nonzero() -> None:
    check(autograd.nonzero, lambda n: [(RNG.random((n, 4)) > 0.5).astype(np.float32)], dynamic=True)


@pytest.mark.parametrize(("fn", "axes", "keep"), [
    (autograd.reduce_sum, [1], 1), (autograd.reduce_sum, [0, 2], 0), (autograd.reduce_sum, None, 0),
    (autograd.reduce_mean, [-1], 1), (autograd.reduce_mean, [1, 2], 0), (autograd.reduce_mean, None, 1)])
@pytest.mark.parametrize("opset", [13, 18])
def test_reductions(fn, axes, keep, opset) -> None:
    check(lambda x: fn(x, axes, keep), one(rn, 3, 4), opset=opset)


@pytest.mark.parametrize("fmt", ["channels_first", "channels_last"])
def test_global_average_pool(fmt) -> None:
    check(lambda x: autograd.globalaveragepool(x, fmt), one(rn, 3, 4, 5), dynamic=True)


# -- indexing --------------------------------------------------------------------------------------------------------


def test_gather() -> None:
    check(lambda x: autograd.gather(x, 1, [2, 0, -1, 2]), one(rn, 5), dynamic=True)
    check(lambda x: autograd.gather(x, 2, np.array([[0, 1], [1, 1]])), one(rn, 3, 2), dynamic=True)
    check(lambda x: autograd.gather(x, 0, [0.0, 2.0]), lambda n: [rn(3, 4)], other_n=None)  # float indices


def test_gather_indices_as_graph_input() -> None:
    x, idx = rn(5, 3), np.array([4, 0, 2], np.int64)
    tx, ti = T(x), T(idx)
    autograd.training = True
    m = to_onnx([tx, ti], [autograd.gather(tx, 0, ti)])
    onnx.checker.check_model(m, full_check=True)
    np.testing.assert_array_equal(ort_run(m, [x, idx])[0], x[idx])


def test_scatter_elements() -> None:
    idx = np.array([[1, 0, 2], [0, 2, 1]])
    upd = rn(2, 3)
    check(lambda x: autograd.scatter_elements(x, idx, upd, 0), lambda n: [rn(3, 3)], other_n=None)
    check(lambda x: autograd.scatter_elements(x, idx, upd, 1), lambda n: [rn(2, 4)], other_n=None)


def test_onehot() -> None:
    ids = lambda n: [RNG.integers(-4, 4, (n, 3)).astype(np.int64)]  # noqa: E731
    check(lambda i: autograd.onehot(-1, i, 4, [0.0, 1.0]), ids, dynamic=True)
    check(lambda i: autograd.onehot(1, i, 4, np.array([2, 5], np.int64)), ids, dynamic=True)
    check(lambda i: autograd.onehot(1, i, 4, [-1.0, 3.0]), lambda n: [RNG.integers(0, 4, (n,)).astype(np.float32)],
          dynamic=True)


def test_embedding_layer() -> None:
    emb = layer.Embedding(10, 4)
    check(emb, lambda n: [RNG.integers(0, 10, (n, 3)).astype(np.int32)], dynamic=True)
    check(emb, lambda n: [RNG.integers(0, 10, (n, 3)).astype(np.float32)], dynamic=True)  # SINGA's float ids


# -- losses ------------------------------------------------------------------------------------------------------------


def loss_case(loss, target, n: int = 4, C: int = 5, x_gen=rn):
    """Export x -> loss(x, target) with the target held by the operator (a constant of the model)."""
    x = x_gen(n, C)
    t = target(n, C)
    return check(lambda tx: loss(tx, T(t)), lambda _: [x], other_n=None)


def test_softmax_cross_entropy() -> None:
    m = loss_case(autograd.softmax_cross_entropy, lambda n, c: RNG.integers(0, c, n).astype(np.int32))
    assert "SoftmaxCrossEntropyLoss" in op_types(m)
    loss_case(autograd.softmax_cross_entropy, lambda n, c: np.eye(c, dtype=np.int32)[RNG.integers(0, c, n)])
    loss_case(autograd.softmax_cross_entropy, lambda n, c: RNG.integers(0, c, n).astype(np.float32))
    p = RNG.random((4, 5)).astype(np.float32)
    loss_case(autograd.softmax_cross_entropy, lambda n, c: p / p.sum(1, keepdims=True))


def test_softmax_cross_entropy_with_the_target_as_input() -> None:
    # the target passed among the inputs becomes a graph input: the loss of any batch
    def make(n):
        return [rn(n, 5), RNG.integers(0, 5, n).astype(np.int32)]

    m = check(lambda x, t: autograd.softmax_cross_entropy(x, t), make, dynamic=True)
    assert len(m.graph.input) == 2


def test_other_losses() -> None:
    probs = uni(0.05, 0.95)
    loss_case(autograd.cross_entropy, lambda n, c: np.eye(c, dtype=np.float32)[RNG.integers(0, c, n)], x_gen=probs)
    loss_case(autograd.cross_entropy, lambda n, c: RNG.integers(0, c, n).astype(np.int32), x_gen=probs)
    loss_case(autograd.binary_cross_entropy, lambda n, c: (RNG.random((n, c)) > 0.5).astype(np.float32),
              x_gen=probs)
    loss_case(autograd.mse_loss, lambda n, c: rn(n, c))
    check(lambda p, q: autograd.ranking_loss(p, q, 0.3), lambda n: [rn(n, 1), rn(n, 1)], dynamic=True)
    check(lambda p, q: autograd.mse_loss(p, q), lambda n: [rn(n, 3, 2), rn(n, 3, 2)], dynamic=True)


# -- convolution, pooling, normalisation ----------------------------------------------------------------------------


@pytest.mark.parametrize(("kw", "shape"), [
    ({"stride": (1, 1), "padding": (0, 0, 0, 0)}, (3, 7, 7)),
    ({"stride": (2, 1), "padding": (1, 2, 0, 1)}, (3, 8, 7)),
    ({"stride": (1, 2), "padding": (2, 2, 2, 2), "dilation": (2, 3)}, (3, 9, 9)),
    ({"stride": (1, 1), "padding": (1, 1, 1, 1), "group": 3}, (6, 5, 5)),
], ids=["plain", "strided_asymmetric_pads", "dilated", "grouped"])
@pytest.mark.parametrize("bias", [True, False])
def test_conv2d(kw, shape, bias) -> None:
    group = kw.get("group", 1)
    W = T(rn(6, shape[0] // group, 3, 3), stores_grad=True)
    b = T(rn(6), stores_grad=True) if bias else None
    check(lambda x: autograd.conv2d(x, W, b, **kw), one(rn, *shape), n=2, other_n=3, dynamic=True)


@pytest.mark.parametrize("pad_mode", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_conv2d_layer_pad_modes(pad_mode) -> None:
    conv = layer.Conv2d(4, (3, 2), stride=2, pad_mode=pad_mode, activation="RELU")
    check(conv, one(rn, 2, 7, 6), n=2, other_n=3, dynamic=True)


def test_separable_conv2d() -> None:
    check(layer.SeparableConv2d(5, 3, padding=1, bias=True), one(rn, 4, 6, 6), n=2, other_n=3, dynamic=True)


POOLS = [
    ({"kernel_size": 2}, (8, 8)),
    ({"kernel_size": 3, "stride": 2, "ceil_mode": True}, (6, 7)),
    ({"kernel_size": 2, "stride": 2, "padding": (1, 1, 1, 1), "ceil_mode": True}, (5, 5)),
    ({"kernel_size": (3, 2), "stride": (2, 1), "padding": (1, 0, 1, 1)}, (7, 6)),
    ({"kernel_size": 3, "stride": 1, "padding": 1, "count_include_pad": False}, (5, 6)),
    ({"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False}, (6, 6)),
    ({"kernel_size": 2, "stride": 1, "dilation": (2, 2)}, (7, 7)),
]


@pytest.mark.parametrize(("kw", "hw"), POOLS, ids=["plain", "ceil", "ceil_padded", "asymmetric", "exclude_pad",
                                                   "ceil_exclude_pad", "dilated"])
@pytest.mark.parametrize("is_max", [True, False], ids=["max", "avg"])
def test_pooling(kw, hw, is_max) -> None:
    m = check(lambda x: autograd.pooling_2d(x, is_max=is_max, **kw), one(rn, 3, *hw), dynamic=True)
    if not is_max and "dilation" in kw:
        assert m.opset_import[0].version == 19  # AveragePool's dilations came with opset 19


def test_average_pool_dilation_refused_by_an_explicit_older_opset() -> None:
    with pytest.raises(frontend.UnsupportedExportError, match="needs opset 19"):
        check(lambda x: autograd.pooling_2d(x, 2, 1, is_max=False, dilation=(2, 2)), one(rn, 1, 6, 6), opset=18)


@pytest.mark.parametrize("cls", [layer.MaxPool1d, layer.AvgPool1d])
def test_pool1d_layers(cls) -> None:
    check(cls(3, 2, padding=1), one(rn, 3, 11), dynamic=True)


@pytest.mark.parametrize("shape", [(3, 5, 4), (6,)], ids=["4d", "2d"])
def test_batchnorm_inference_form(shape) -> None:
    bn = layer.BatchNorm2d(momentum=0.8, eps=1e-3)
    autograd.training = True
    for _ in range(3):  # running statistics away from their initial values
        bn(T(rn(8, *shape) * 2 + 1))
    m = check(bn, one(rn, *shape), dynamic=True)
    node = next(nd for nd in m.graph.node if nd.op_type == "BatchNormalization")
    assert math.isclose(next(a.f for a in node.attribute if a.name == "epsilon"), 1e-3, rel_tol=1e-6)
    names = {i.name for i in m.graph.initializer}
    assert {"running_mean", "running_var", "scale", "bias"} <= names


# -- recurrent layers ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kw", "batch_first"), [({}, False), ({"nonlinearity": "relu", "num_layers": 2}, True),
                                                 ({"bidirectional": True}, False)],
                         ids=["tanh", "relu_stacked", "bidirectional"])
def test_rnn(kw, batch_first) -> None:
    rnn = layer.RNN(3, 4, batch_first=batch_first, **kw)
    shape = (2, 5, 3) if batch_first else (5, 2, 3)
    m = check(lambda x: rnn(x), lambda n: [rn(*shape)], dynamic=False)  # unrolled over the recorded steps
    assert "Tanh" in op_types(m) or "Relu" in op_types(m)


@pytest.mark.parametrize("kw", [{}, {"num_layers": 2, "bidirectional": True}], ids=["one_layer", "stacked_bidir"])
def test_lstm(kw) -> None:
    lstm = layer.LSTM(3, 4, **kw)
    L = kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1)
    h0, c0 = T(rn(L, 2, 4)), T(rn(L, 2, 4))
    check(lambda x: lstm(x, (h0, c0)), lambda n: [rn(4, 2, 3)], dynamic=False)


# -- constants ---------------------------------------------------------------------------------------------------------


def test_constant_tensors_become_constant_nodes() -> None:
    c = T(np.float32(2.5), requires_grad=False)
    m = check(lambda x: autograd.mul(autograd.add(x, c), c), one(rn, 3), dynamic=True)
    assert not m.graph.initializer
    assert "Constant" in op_types(m)


def test_python_numbers_export_while_the_operator_holds_them() -> None:
    # Mul keeps its operands for backward, so the constant made from 3.0 is alive until backward runs
    check(lambda x: autograd.mul(x, 3.0), one(rn, 3), dynamic=True)


def test_a_number_operand_exports_as_a_constant() -> None:
    x = T(rn(2, 3))
    autograd.training = True
    y = autograd.add(x, 1.0)  # the constant 1.0 is held by its Dummy creator, so the exporter still finds it
    check_model = to_onnx([x], [y])
    assert any(n.op_type in ("Constant", "Add") for n in check_model.graph.node)
    import onnxruntime as ort

    sess = ort.InferenceSession(check_model.SerializeToString(), providers=["CPUExecutionProvider"])
    xv = tensor.to_numpy(x)
    np.testing.assert_allclose(sess.run(None, {sess.get_inputs()[0].name: xv})[0], xv + 1.0, rtol=1e-6)


@pytest.mark.parametrize("opset", [None, 13], ids=["LayerNormalization", "decomposed"])
def test_layer_norm(opset) -> None:
    scale, bias = T(rn(5), stores_grad=True), T(rn(5), stores_grad=True)
    check(lambda x: autograd.layer_norm(x, scale, bias), one(rn, 5), opset=opset)
    check(lambda x: autograd.layer_norm(x, None, bias, axis=1), one(rn, 3, 5), opset=opset)  # two axes, no scale
    check(lambda x: autograd.layer_norm(x, scale), one(rn, 2, 5), opset=opset)  # no bias


# -- models ----------------------------------------------------------------------------------------------------------


def test_seed_mlp_from_raw_operators() -> None:
    """autograd.md's first example: parameters as plain tensors, matmul + add_bias + relu, trained with SGD."""
    w0 = T(rn(2, 3) * 0.1, requires_grad=True, stores_grad=True)
    b0 = T(np.zeros((1, 3), np.float32), requires_grad=True, stores_grad=True)
    w1 = T(rn(3, 2) * 0.1, requires_grad=True, stores_grad=True)
    b1 = T(np.zeros((1, 2), np.float32), requires_grad=True, stores_grad=True)
    data = rn(16, 2)
    label = (data[:, 0] * data[:, 1] > 0).astype(np.int32)
    inputs, target = T(data), T(label)
    sgd = opt.SGD(0.05)
    autograd.training = True

    def forward(x):
        x = autograd.relu(autograd.add_bias(autograd.matmul(x, w0), b0))
        return autograd.add_bias(autograd.matmul(x, w1), b1)

    for _ in range(5):
        y = forward(inputs)
        loss = autograd.softmax_cross_entropy(y, target)
        for p, g in autograd.backward(loss):
            sgd.update(p, g)
    # exported after backward has run: the operators' settings and recorded shapes survive it
    m = to_onnx([inputs], [y])
    onnx.checker.check_model(m, full_check=True)
    assert is_dynamic(m)
    assert len(m.graph.initializer) == 4
    autograd.training = False
    compare(ort_run(m, [data]), [forward(inputs).to_numpy()], 1e-4, 1e-5)
    # the loss with the target as a second input
    autograd.training = True
    loss = autograd.softmax_cross_entropy(forward(inputs), target)
    m2 = to_onnx([inputs, target], [loss])
    onnx.checker.check_model(m2, full_check=True)
    np.testing.assert_allclose(ort_run(m2, [data, label])[0], loss.to_numpy(), rtol=1e-5)


@pytest.mark.parametrize("use_graph", [False, True], ids=["eager", "graph"])
def test_seed_mlp_model(use_graph) -> None:
    m = MLP(perceptron_size=16, num_classes=4)
    m.set_optimizer(opt.SGD(lr=0.05, momentum=0.9, weight_decay=1e-5))
    tx = tensor.Tensor((8, 10), DEV, tensor.float32)
    ty = tensor.Tensor((8,), DEV, tensor.int32)
    m.compile([tx], is_train=True, use_graph=use_graph, sequential=False)
    for _ in range(3):
        tx.copy_from_numpy(rn(8, 10))
        ty.copy_from_numpy(RNG.integers(0, 4, 8).astype(np.int32))
        m(tx, ty)
    # in graph mode the replayed step carries no autograd graph: record a forward for the export
    exported = check(m.forward, one(rn, 10), n=8, dynamic=True)
    names = {i.name for i in exported.graph.initializer}
    assert names == {"linear1.W", "linear1.b", "linear2.W", "linear2.b"}


def test_seed_cnn_from_autograd_md() -> None:
    """autograd.md's 'Operation + Layer' CNN: conv, relu, batchnorm, two parallel convolutions concatenated, average
    pooling, flatten and linear, recorded with the loss as SINGA records a training step."""
    conv1 = autograd.Conv2d(1, 8, 3, padding=1, bias=False)
    bn1 = autograd.BatchNorm2d(8)
    pooling1 = autograd.MaxPool2d(3, 1, padding=1)
    conv21 = autograd.Conv2d(8, 4, 3, padding=1)
    conv22 = autograd.Conv2d(8, 4, 3, padding=1)
    bn2 = autograd.BatchNorm2d(8)
    linear = autograd.Linear(8 * 10 * 10, 10)
    pooling2 = autograd.AvgPool2d(3, 1, padding=1)

    def forward(x):
        y = bn1(autograd.relu(conv1(x)))
        y = pooling1(y)
        y = autograd.cat((conv21(y), conv22(y)), 1)
        y = pooling2(bn2(autograd.relu(y)))
        return linear(autograd.flatten(y))

    x = rn(4, 1, 10, 10)
    t = RNG.integers(0, 10, 4).astype(np.int32)
    autograd.training = True
    tx = T(x)
    y = forward(tx)
    loss = autograd.softmax_cross_entropy(y, T(t))
    sgd = opt.SGD(0.01)
    for p, g in autograd.backward(loss):
        sgd.update(p, g)
    m = to_onnx([tx], [y])
    onnx.checker.check_model(m, full_check=True)
    assert op_types(m).count("BatchNormalization") == 2
    autograd.training = False
    compare(ort_run(m, [x]), [forward(tx).to_numpy()], 1e-4, 1e-5)
    x2 = rn(6, 1, 10, 10)
    compare(ort_run(m, [x2]), [forward(T(x2)).to_numpy()], 1e-4, 1e-5)


def test_onnx_seed_export_example(tmp_path) -> None:
    """The earlier ONNX docs' MNIST example: train with raw autograd, then `sonnx.to_onnx([x], [y])` with the last
    batch and its output; onnx.save / onnx.load round trip."""

    cnn = EarlierOnnxCNN()
    autograd.training = True
    sgd = opt.SGD(lr=0.001)
    for _ in range(2):
        x_batch = T(rn(8, 1, 28, 28))
        output_batch = cnn.forward(x_batch)
        loss = autograd.softmax_cross_entropy(output_batch, T(np.eye(10, dtype=np.float32)[RNG.integers(0, 10, 8)]))
        for p, gp in autograd.backward(loss):
            sgd.update(p, gp)
        sgd.step()
    onnx_model = to_onnx([x_batch], [output_batch])
    onnx.save(onnx_model, str(tmp_path / "mnist.onnx"))
    loaded = onnx.load(str(tmp_path / "mnist.onnx"))
    onnx.checker.check_model(loaded, full_check=True)
    autograd.training = False
    x = rn(5, 1, 28, 28)
    compare(ort_run(loaded, [x]), [cnn.forward(T(x)).to_numpy()], 1e-4, 1e-5)


class ResBlock(model.Model):
    """A ResNet basic block with a strided 1x1 projection shortcut, global average pooling and a classifier."""

    def __init__(self):
        super().__init__()
        self.conv1 = layer.Conv2d(8, 3, stride=2, padding=1, bias=False)
        self.bn1 = layer.BatchNorm2d()
        self.relu = layer.ReLU()
        self.conv2 = layer.Conv2d(8, 3, padding=1, bias=False)
        self.bn2 = layer.BatchNorm2d()
        self.down = layer.Conv2d(8, 1, stride=2, bias=False)
        self.bn_down = layer.BatchNorm2d()
        self.add = layer.Add()
        self.pool = layer.AvgPool2d(4)
        self.flatten = layer.Flatten()
        self.fc = layer.Linear(5)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        y = self.relu(self.add(y, self.bn_down(self.down(x))))
        return self.fc(self.flatten(self.pool(y)))

    def train_one_batch(self, x, t):
        out = self.forward(x)
        loss = self.loss(out, t)
        self.optimizer(loss)
        return out, loss

    def set_optimizer(self, optimizer):
        self.optimizer = optimizer


def test_resnet_block() -> None:
    net = ResBlock()
    net.set_optimizer(opt.SGD(lr=0.05, momentum=0.9))
    tx, ty = tensor.Tensor((6, 3, 8, 8), DEV), tensor.Tensor((6,), DEV, tensor.int32)
    net.compile([tx], is_train=True, use_graph=False)
    for _ in range(3):
        tx.copy_from_numpy(rn(6, 3, 8, 8))
        ty.copy_from_numpy(RNG.integers(0, 5, 6).astype(np.int32))
        net(tx, ty)
    m = check(net.forward, one(rn, 3, 8, 8), n=6, other_n=2, dynamic=True)
    names = {i.name for i in m.graph.initializer}
    assert {"conv1.W", "bn1.scale", "bn1.running_mean", "bn_down.running_var", "fc.W"} <= names
    assert op_types(m).count("Add") == 2  # the shortcut and the classifier's bias


@pytest.mark.parametrize("opset", [13, 17, 18, 20, 21])
def test_opsets(opset) -> None:
    net = ResBlock()
    tx = tensor.Tensor((2, 3, 8, 8), DEV)
    net.compile([tx], is_train=False)
    m = check(net.forward, one(rn, 3, 8, 8), n=2, other_n=3, opset=opset, dynamic=True)
    assert m.opset_import[0].version == opset
    assert m.ir_version == onnx.helper.find_min_ir_version_for(list(m.opset_import))


# -- naming, inputs and outputs --------------------------------------------------------------------------------------


def test_parameter_names_are_unique_and_shared_parameters_exported_once() -> None:
    l1, l2 = layer.Linear(4), layer.Linear(4)  # two root layers: both call their weight "W"
    w = T(rn(4, 4), stores_grad=True)
    m = check(lambda x: autograd.matmul(l2(autograd.matmul(l1(x), w)), w), one(rn, 3), dynamic=True)
    names = [i.name for i in m.graph.initializer]
    assert len(names) == len(set(names)) == 5
    assert {"W", "W_1", "b", "b_1"} <= set(names)


def test_several_outputs_an_input_as_output_and_an_intermediate_input() -> None:
    a, b = rn(3, 4), rn(3, 4)
    ta, tb = T(a), T(b)
    autograd.training = True
    h = autograd.mul(ta, tb)
    y1 = autograd.relu(h)
    y2 = autograd.sigmoid(h)
    m = to_onnx([ta, tb], [y1, y2, ta, y1])
    onnx.checker.check_model(m, full_check=True)
    outs = ort_run(m, [a, b])
    np.testing.assert_allclose(outs[0], np.maximum(a * b, 0), rtol=1e-6)
    np.testing.assert_allclose(outs[1], 1 / (1 + np.exp(-a * b)), rtol=1e-5)
    np.testing.assert_array_equal(outs[2], a)
    np.testing.assert_array_equal(outs[3], outs[0])
    # an intermediate tensor given as the input cuts the graph there
    m2 = to_onnx([h], [y2])
    assert op_types(m2) == ["Sigmoid"]
    np.testing.assert_allclose(ort_run(m2, [a])[0], 1 / (1 + np.exp(-a)), rtol=1e-5)


def test_frontend_class_api() -> None:
    x, W = T(rn(2, 3, 5, 5)), T(rn(4, 3, 3, 3), stores_grad=True)
    autograd.training = True
    y = autograd.relu(autograd.conv2d(x, W, padding=1))
    g = frontend.SingaFrontend.singa_to_onnx_graph([x], [y], model_name="net")
    assert g.name == "net"
    assert [n.op_type for n in g.node] == ["Conv", "Relu"]
    m = frontend.SingaFrontend.singa_to_onnx_model([x], [y])
    onnx.checker.check_model(m, full_check=True)
    nodes = frontend.SingaFrontend.singa_op_to_onnx_node(y.creator)
    assert [n.op_type for n in nodes] == ["Relu"]
    r = autograd.reshape(y, (2, -1))
    nodes = frontend.SingaFrontend.handle_special_ops(r.creator, ["in"], ["out"])
    assert [n.op_type for n in nodes] == ["Constant", "Reshape"]  # standalone: the shape as a Constant node
    assert {"_Conv2d", "_Pooling2d", "_BatchNorm2d", "SoftMaxCrossEntropy"} <= set(frontend.exportable_operators())


# -- errors ------------------------------------------------------------------------------------------------------------


class Cube(autograd.Operator):
    def forward(self, x):
        return x * x * x

    def backward(self, dy):
        return dy


def test_unsupported_operators_are_all_named_with_their_positions() -> None:
    x = T(rn(2, 3))
    autograd.training = True
    y = Cube()(autograd.relu(Cube()(x)[0]))[0]
    with pytest.raises(frontend.UnsupportedExportError) as err:
        to_onnx([x], [y])
    msg = str(err.value)
    assert "operator 1 of 3 (Cube" in msg
    assert "operator 3 of 3 (Cube" in msg
    assert [p[0] for p in err.value.problems] == [1, 3]
    assert isinstance(err.value, errors.UnsupportedOperatorError)  # the importer's error type covers export too


class DropNet(model.Model):
    """conv -> batch norm -> relu -> dropout -> flatten -> linear: what differs between training and inference."""

    def __init__(self):
        super().__init__()
        self.conv = layer.Conv2d(4, 3, padding=1)
        self.bn = layer.BatchNorm2d()
        self.relu = layer.ReLU()
        self.drop = layer.Dropout(0.5)
        self.flatten = layer.Flatten()
        self.fc = layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc(self.flatten(self.drop(self.relu(self.bn(self.conv(x))))))

    def train_one_batch(self, x, t):
        out = self.forward(x)
        loss = self.loss(out, t)
        self.optimizer(loss)
        return out, loss


def test_export_after_eval_is_the_inference_graph() -> None:
    """SINGA's usual flow: train, m.eval(), y = m.forward(x), sonnx.to_onnx([x], [y]); training is never switched on
    for the export."""
    net = DropNet()
    net.optimizer = opt.SGD(lr=0.1, momentum=0.9)
    tx, ty = tensor.Tensor((4, 2, 5, 5), DEV), tensor.Tensor((4,), DEV, tensor.int32)
    net.compile([tx], is_train=True)
    for _ in range(3):
        tx.copy_from_numpy(rn(4, 2, 5, 5) * 2 + 1)  # running statistics far from (0, 1)
        ty.copy_from_numpy(RNG.integers(0, 3, 4).astype(np.int32))
        net(tx, ty)
    net.eval()
    x = rn(4, 2, 5, 5)
    xt = T(x)
    y = net.forward(xt)
    m = to_onnx([xt], [y])
    assert autograd.training is False
    onnx.checker.check_model(m, full_check=True)
    types = op_types(m)
    assert "BatchNormalization" in types
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in m.graph.initializer}
    np.testing.assert_array_equal(inits["bn.running_mean"], net.bn.running_mean.to_numpy().reshape(-1))
    assert np.abs(inits["bn.running_mean"]).max() > 0.1  # trained statistics, not the initial zeros
    # onnxruntime computes what SINGA's inference computes: running statistics, dropout as identity
    for batch in (4, 7):
        xb = rn(batch, 2, 5, 5)
        np.testing.assert_allclose(ort_run(m, [xb])[0], net.forward(T(xb)).to_numpy(), rtol=1e-4, atol=1e-5)
    # and the same weights computed by hand in numpy (float64): conv, BN with running stats, relu, no dropout
    W, b = net.conv.W.to_numpy().astype(np.float64), net.conv.b.to_numpy().astype(np.float64)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    conv = np.zeros((4, 4, 5, 5))
    for i in range(5):
        for j in range(5):
            conv[:, :, i, j] = np.einsum("nchw,kchw->nk", xp[:, :, i:i + 3, j:j + 3], W)
    conv += b.reshape(1, -1, 1, 1)
    rm, rv = (net.bn.running_mean.to_numpy().reshape(1, -1, 1, 1), net.bn.running_var.to_numpy().reshape(1, -1, 1, 1))
    sc, sh = net.bn.scale.to_numpy().reshape(1, -1, 1, 1), net.bn.bias.to_numpy().reshape(1, -1, 1, 1)
    h = np.maximum((conv - rm) / np.sqrt(rv + 1e-5) * sc + sh, 0).reshape(4, -1)
    want = h @ net.fc.W.to_numpy().astype(np.float64) + net.fc.b.to_numpy()
    np.testing.assert_allclose(ort_run(m, [x])[0], want, rtol=1e-4, atol=1e-4)


def test_eval_outputs_record_their_creators() -> None:
    lin = layer.Linear(3)
    x = T(rn(2, 4))
    autograd.training = False
    y = lin(x)
    assert y.creator is not None  # SINGA: the topology is recorded whatever the training flag
    m = to_onnx([x], [y])
    np.testing.assert_allclose(ort_run(m, [x.to_numpy()])[0], y.to_numpy(), rtol=1e-5, atol=1e-6)


def test_outputs_without_a_graph_say_what_to_pass() -> None:
    x = T(rn(2, 4))
    with pytest.raises(ValueError, match="not produced by autograd operators") as info:
        to_onnx([x], [T(rn(2, 3))])
    assert "training" not in str(info.value).split("(in train")[0]  # never asks to switch training on


def test_inputs_as_singa_takes_them() -> None:
    """Graph inputs take the given tensors in order; non-Tensor entries (shape lists, numbers) are ignored with a
    warning; a given tensor that is not in the graph stands for the graph's data leaf by position."""
    lin = layer.Linear(3)
    a = rn(2, 4)
    x = T(a)
    autograd.training = False
    y = lin(x)
    with pytest.warns(UserWarning, match=r"inputs\[1\] \(int\), inputs\[2\] \(int\), inputs\[3\] \(float\) "
                      r"not a singa Tensor, ignored"):
        m = to_onnx([x, [2, 4], 1.5], [y])  # (a shape list counts as its entries)
    assert len(m.graph.input) == 1
    np.testing.assert_allclose(ort_run(m, [a])[0], y.to_numpy(), rtol=1e-5, atol=1e-6)
    placeholder = tensor.Tensor((2, 4), DEV)  # another tensor of the same shape (a script's PlaceHolder)
    m = to_onnx([placeholder], [y])
    assert [i.name for i in m.graph.input] == ["input"]
    np.testing.assert_allclose(ort_run(m, [a])[0], y.to_numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"inputs\[0\] \(float32 \(3, 4\)\) is not in the graph"):
        to_onnx([tensor.Tensor((3, 4), DEV)], [y])
    with pytest.warns(UserWarning, match=r"inputs\[1\] \(shape \(5,\)\) not used by the graph"):
        m = to_onnx([x, tensor.Tensor((5,), DEV)], [y])
    assert len(m.graph.input) == 1


def test_two_inputs_keep_the_given_order() -> None:
    a, b = rn(3, 4), rn(3, 4)
    ta, tb = T(a), T(b)
    autograd.training = False
    two = T(np.float32(2.0), requires_grad=False)  # a constant the script keeps
    y = autograd.sub(ta, autograd.mul(tb, two))
    m = to_onnx([tb, ta], [y])
    assert [i.name for i in m.graph.input] == ["input_0", "input_1"]
    np.testing.assert_allclose(ort_run(m, [b, a])[0], a - 2 * b, rtol=1e-6)


def test_singa3_two_input_loss_exports() -> None:
    x, t = rn(5, 3), rn(5, 3)
    tx, tt = T(x), T(t)
    autograd.training = False
    loss = autograd.MeanSquareError()(tx, tt)[0]
    m = to_onnx([tx, tt], [loss])
    np.testing.assert_allclose(ort_run(m, [x, t])[0], [((x - t) ** 2).sum() / 10], rtol=1e-5)


def test_bad_arguments() -> None:
    x = T(rn(2, 4))
    autograd.training = True
    y = autograd.relu(x)
    with pytest.warns(UserWarning, match="not a singa Tensor, ignored"):  # as SINGA: non-Tensor inputs ignored
        to_onnx([x.to_numpy()], [y])
    with pytest.raises(TypeError, match="not a singa Tensor"):
        to_onnx([x], [y.to_numpy()])
    with pytest.raises(ValueError, match="at least 13"):
        to_onnx([x], [y], opset_version=11)


def test_dynamic_batch_options() -> None:
    fn = lambda x: autograd.reshape(x, (3, 4, 5))  # noqa: E731 - moves the batch (4) off the first axis
    x = T(rn(4, 3, 5))
    autograd.training = True
    y = fn(x)
    m = to_onnx([x], [y])
    assert not is_dynamic(m)
    assert "reshape" in m.doc_string
    with pytest.raises(ValueError, match="dynamic_batch=True"):
        to_onnx([x], [y], dynamic_batch=True)
    z = autograd.relu(x)
    assert is_dynamic(to_onnx([x], [z], dynamic_batch=True))
    static = to_onnx([x], [z], dynamic_batch=False)
    assert not is_dynamic(static)
    assert [d.dim_value for d in static.graph.input[0].type.tensor_type.shape.dim] == [4, 3, 5]


# -- round trip through the importer ---------------------------------------------------------------------------------


def _lstm_model():
    lstm, fc = layer.LSTM(3, 5), layer.Linear(2)

    def fn(x):
        y, _ = lstm(x)
        return fc(autograd.reshape(y, (-1, 5)))

    return fn, lambda n: [rn(4, 2, 3)]


def _cnn_model():
    net = ResBlock()
    net.compile([tensor.Tensor((2, 3, 8, 8), DEV)], is_train=False)
    return net.forward, one(rn, 3, 8, 8)


def _mlp_model():
    net = MLP(perceptron_size=16, num_classes=4)
    net.compile([tensor.Tensor((2, 10), DEV)], is_train=False)
    return net.forward, one(rn, 10)


@pytest.mark.parametrize("build", [_mlp_model, _cnn_model, _lstm_model], ids=["mlp", "resnet_block", "lstm"])
def test_round_trip_through_the_importer(build) -> None:
    """What to_onnx writes, singa_onnx reads back (both API generations) and computes the same outputs from."""
    sonnx = pytest.importorskip("singa_onnx")
    fn, make = build()
    arrays = make(4)
    xs = [T(a) for a in arrays]
    autograd.training = True
    m = to_onnx(xs, as_list(fn(*xs)))
    autograd.training = False
    ref = [y.to_numpy() for y in as_list(fn(*xs))]
    rep = sonnx.prepare(m, device=DEV)
    compare([host(y) for y in rep.run(xs)], ref, 1e-4, 1e-5)
    imported = sonnx.SONNXModel(m)
    imported.compile(xs, is_train=False, use_graph=False, sequential=True)
    compare([host(y) for y in imported.forward(*xs)], ref, 1e-4, 1e-5)
