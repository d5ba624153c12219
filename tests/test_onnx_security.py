"""Hostile ONNX files and inputs: external data never read from outside the model's folder, whatever tensor carries it;
bad offsets and lengths named; inputs checked against the declared dtypes and shapes at `run`.

Layout of each test's folder: model/ (the model and its legitimate data files), cwd/ (the working directory, holding
`secret.bin`) and outside/secret.bin. A model that reached either secret would return its values, 1..4 as float32.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from singa import device, tensor
from singa_onnx import InvalidInputError, InvalidModelError, SONNXModel, prepare

SECRET = np.arange(1, 5, dtype=np.float32)
OPSET = [helper.make_opsetid("", 17)]


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    for d in ("model", "cwd", "outside"):
        (tmp_path / d).mkdir()
    for d in ("cwd", "outside"):
        (tmp_path / d / "secret.bin").write_bytes(SECRET.tobytes())
    (tmp_path / "model" / "weights.bin").write_bytes(np.full(4, 7, np.float32).tobytes())
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path


def _external(t: TensorProto, location: str, **extra: str) -> TensorProto:
    t.data_location = TensorProto.EXTERNAL
    t.ClearField("raw_data")
    t.ClearField("float_data")
    entries = {"location": location, **extra}
    for k, v in entries.items():
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


def _value(name: str = "w") -> TensorProto:
    return numpy_helper.from_array(np.zeros(4, np.float32), name)


def _out() -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])


def _model(graph, functions=()) -> onnx.ModelProto:
    opsets = OPSET + ([helper.make_opsetid("local", 1)] if functions else [])
    return helper.make_model(graph, opset_imports=opsets, functions=list(functions))


# Every place a tensor can carry external data, as a model whose output is that tensor's value.
def initializer_model(loc, **kw):
    return _model(helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [], [_out()],
                                    initializer=[_external(_value(), loc, **kw)]))


def sparse_initializer_model(loc, **kw):
    sp = helper.make_sparse_tensor(_external(_value("w"), loc, **kw),
                                   numpy_helper.from_array(np.arange(4, dtype=np.int64), "w_idx"), [4])
    g = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [], [_out()])
    g.sparse_initializer.append(sp)
    return _model(g)


def constant_model(loc, **kw):
    node = helper.make_node("Constant", [], ["y"], value=_external(_value("c"), loc, **kw))
    return _model(helper.make_graph([node], "g", [], [_out()]))


def sparse_constant_model(loc, **kw):
    sp = helper.make_sparse_tensor(_external(_value("c"), loc, **kw),
                                   numpy_helper.from_array(np.arange(4, dtype=np.int64), "c_idx"), [4])
    node = helper.make_node("Constant", [], ["y"], sparse_value=sp)
    return _model(helper.make_graph([node], "g", [], [_out()]))


def function_constant_model(loc, **kw):
    body = [helper.make_node("Constant", [], ["c"], value=_external(_value("c"), loc, **kw)),
            helper.make_node("Identity", ["c"], ["out"])]
    fn = helper.make_function("local", "leak", [], ["out"], body, OPSET)
    node = helper.make_node("leak", [], ["y"], domain="local")
    return _model(helper.make_graph([node], "g", [], [_out()]), [fn])


def subgraph_constant_model(loc, **kw):
    branch = helper.make_graph([helper.make_node("Constant", [], ["b"], value=_external(_value("c"), loc, **kw))],
                               "then", [], [helper.make_tensor_value_info("b", TensorProto.FLOAT, [4])])
    other = helper.make_graph([helper.make_node("Constant", [], ["b2"], value=_value("z"))],
                              "else", [], [helper.make_tensor_value_info("b2", TensorProto.FLOAT, [4])])
    cond = numpy_helper.from_array(np.array(True), "cond")
    node = helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=other)
    return _model(helper.make_graph([node], "g", [], [_out()], initializer=[cond]))


def function_subgraph_model(loc, **kw):
    """A Constant inside an If inside a model-local function."""
    branch = helper.make_graph([helper.make_node("Constant", [], ["b"], value=_external(_value("c"), loc, **kw))],
                               "then", [], [helper.make_tensor_value_info("b", TensorProto.FLOAT, [4])])
    other = helper.make_graph([helper.make_node("Constant", [], ["b2"], value=_value("z"))],
                              "else", [], [helper.make_tensor_value_info("b2", TensorProto.FLOAT, [4])])
    body = [helper.make_node("Constant", [], ["t"], value=numpy_helper.from_array(np.array(True), "t")),
            helper.make_node("If", ["t"], ["out"], then_branch=branch, else_branch=other)]
    fn = helper.make_function("local", "leak", [], ["out"], body, OPSET)
    node = helper.make_node("leak", [], ["y"], domain="local")
    return _model(helper.make_graph([node], "g", [], [_out()]), [fn])


CARRIERS = [initializer_model, sparse_initializer_model, constant_model, sparse_constant_model,
            function_constant_model, subgraph_constant_model, function_subgraph_model]


def _save(sandbox, m) -> str:
    path = sandbox / "model" / "model.onnx"
    path.write_bytes(m.SerializeToString())
    return str(path)


def _run(model, **kw):
    return prepare(model, device.get_default_device(), **kw).run([])[0]


@pytest.mark.parametrize("carrier", CARRIERS, ids=lambda f: f.__name__)
def test_external_data_inside_the_model_folder_is_read(sandbox, carrier):
    path = _save(sandbox, carrier("weights.bin"))
    assert np.array_equal(_run(path), np.full(4, 7, np.float32))
    m = onnx.load(path, load_external_data=False)
    assert np.array_equal(_run(m, base_dir=str(sandbox / "model")), np.full(4, 7, np.float32))
    assert np.array_equal(_run(m.SerializeToString(), base_dir=str(sandbox / "model")), np.full(4, 7, np.float32))


@pytest.mark.parametrize("carrier", CARRIERS, ids=lambda f: f.__name__)
@pytest.mark.parametrize(("location", "message"), [
    ("secret.bin", "does not exist"),  # resolved against the working directory before the fix
    ("../outside/secret.bin", "leaves the model's folder"),
    ("../cwd/secret.bin", "leaves the model's folder"),
    ("{abs}", "is absolute"),
    ("link.bin", "leaves the model's folder"),  # a symbolic link inside the folder that points outside
    (".", "leaves the model's folder"),
    ("sub", "is not a regular file"),
    ("fifo", "is not a regular file"),  # opening a FIFO would block forever
])
def test_external_data_outside_the_model_folder_is_refused(sandbox, carrier, location, message):
    (sandbox / "model" / "link.bin").symlink_to(sandbox / "outside" / "secret.bin")
    (sandbox / "model" / "sub").mkdir()
    if hasattr(os, "mkfifo"):
        os.mkfifo(sandbox / "model" / "fifo")
    elif location == "fifo":
        pytest.skip("no FIFOs here")
    location = location.replace("{abs}", str(sandbox / "outside" / "secret.bin"))
    path = _save(sandbox, carrier(location))
    with pytest.raises(InvalidModelError, match=message) as exc:
        _run(path)
    assert "tensor " in str(exc.value)
    with pytest.raises(InvalidModelError, match=message):
        SONNXModel(path)


@pytest.mark.parametrize("carrier", CARRIERS, ids=lambda f: f.__name__)
def test_models_without_a_folder_refuse_external_data(sandbox, carrier):
    m = carrier("secret.bin")
    for model in (m, m.SerializeToString()):
        with pytest.raises(InvalidModelError, match="has no folder: pass the model as a path, or base_dir"):
            _run(model)


@pytest.mark.parametrize("carrier", [initializer_model, sparse_initializer_model, function_constant_model],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize(("extra", "message"), [
    ({"offset": "-4"}, r"offset '-4' for file .*weights.bin' is not a non-negative integer"),
    ({"offset": "1.5"}, r"offset '1.5' .* is not a non-negative integer"),
    ({"offset": "abc"}, r"offset 'abc' .* is not a non-negative integer"),
    ({"length": "-16"}, r"length '-16' .* is not a non-negative integer"),
    ({"offset": "17"}, r"offset 17 is past the end of .*weights.bin' \(16 bytes\)"),
    ({"offset": "4", "length": "16"}, r"offset 4 \+ length 16 is past the end of .*weights.bin'"),
    ({"length": str(10**15)}, r"length 1000000000000000 is past the end"),  # no petabyte buffer either
    ({"length": "8"}, r"8 bytes of external data in .*weights.bin', its dims \[4\] and type need 16"),
    ({"offset": "8"}, r"8 bytes of external data .* need 16"),
])
def test_bad_offsets_and_lengths_name_the_tensor_and_the_file(sandbox, carrier, extra, message):
    path = _save(sandbox, carrier("weights.bin", **extra))
    with pytest.raises(InvalidModelError, match=r"tensor '[wc]'.*" + message):
        _run(path)


def test_offset_and_length_select_the_bytes(sandbox):
    data = np.arange(10, dtype=np.float32)
    (sandbox / "model" / "weights.bin").write_bytes(data.tobytes())
    path = _save(sandbox, sparse_initializer_model("weights.bin", offset="8", length="16"))
    assert np.array_equal(_run(path), data[2:6])


# -- inputs at run: declared dtype kind, static dims, symbolic dims bound once per run -------------------------------


def _input_model():
    """y = a + b[0] with a (N, 3) float, b (N, 3) float, n (1,) int64 (unused by y), declared shapes."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 3])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 3])
    n = helper.make_tensor_value_info("n", TensorProto.INT64, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    z = helper.make_tensor_value_info("z", TensorProto.INT64, [1])
    g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"]), helper.make_node("Identity", ["n"], ["z"])],
                          "g", [a, b, n], [y, z])
    return helper.make_model(g, opset_imports=OPSET)


@pytest.fixture(scope="module")
def rep():
    return prepare(_input_model(), device.get_default_device())


def _ok(n: int = 2):
    rng = np.random.default_rng(0)
    return [rng.standard_normal((n, 3)).astype(np.float32), rng.standard_normal((n, 3)).astype(np.float32),
            np.array([5], np.int64)]


def test_good_inputs_run_at_any_value_of_a_symbolic_dim(rep):
    for n in (1, 2, 5):
        a, b, k = _ok(n)
        y, z = rep.run([a, b, k])
        np.testing.assert_allclose(y, a + b, rtol=1e-6)
        assert z.tolist() == [5]
    a, b, k = _ok()
    y, _ = rep.run([a.astype(np.float64), b, k.astype(np.int32)])  # same kind: converted, as numpy same_kind casts
    np.testing.assert_allclose(y, a + b, rtol=1e-6)


@pytest.mark.parametrize(("change", "message"), [
    (lambda a, b, k: (a[:, :2], b, k), (r"input 'a': shape \(2, 2\) does not match the declared \(N, 3\) "
                                        r"\(dimension 1 is 2, not 3\)")),
    (lambda a, b, k: (a, b[:1], k), (r"input 'b': shape \(1, 3\) does not match the declared \(N, 3\): "
                                     r"dimension 0 \('N'\) is 1, but input 'a' made 'N' 2")),
    (lambda a, b, k: (a[None], b, k), (r"input 'a': shape \(1, 2, 3\) has 3 dimension\(s\), the model declares "
                                       r"\(N, 3\)")),
    (lambda a, b, k: (a, b, np.array([5, 6])), r"input 'n': shape \(2,\) does not match the declared \(1,\)"),
    (lambda a, b, k: (a, b, np.array([5.5])), r"input 'n': float64 data for a INT64 input"),
    (lambda a, b, k: (a.astype(np.int32), b, k), None),  # int into float widens: allowed
    (lambda a, b, k: (a > 0, b, k), None),
    (lambda a, b, k: (a.astype(str), b, k), r"input 'a': <U\d+ data for a FLOAT input"),
    (lambda a, b, k: (a, b), r"the model takes 3 input\(s\) \['a', 'b', 'n'\], got 2"),
])
def test_bad_inputs_name_the_input_and_both_shapes(rep, change, message):
    args = change(*_ok())
    if message is None:
        rep.run(list(args))
        return
    with pytest.raises(InvalidInputError, match=message):
        rep.run(list(args))


def test_tensor_inputs_are_checked_too(rep):
    dev = device.get_default_device()
    a, b, k = _ok()
    with pytest.raises(InvalidInputError, match=r"input 'n': float32 data for a INT64 input"):
        rep.run([tensor.from_numpy(a, dev), tensor.from_numpy(b, dev), tensor.from_numpy(np.array([5.0], np.float32),
                                                                                          dev)])
    with pytest.raises(InvalidInputError, match=r"'N'\) is 1, but input 'a' made 'N' 2"):
        rep.run({"a": tensor.from_numpy(a, dev), "b": tensor.from_numpy(b[:1], dev), "n": k})
    with pytest.raises(InvalidInputError, match=r"'N'\) is 1, but input 'a' made 'N' 2"):
        SONNXModel(_input_model()).forward(tensor.from_numpy(a, dev), tensor.from_numpy(b[:1], dev),
                                           tensor.from_numpy(k, dev))
