"""Corpus-driven fuzzing of the ONNX loader: valid models are mutated (truncated, bit-flipped, bytes overwritten,
tensor or input dims changed, external data made hostile) and loaded and run in a worker process
(tests/onnx_fuzz_worker.py). Every outcome must be a result or one of singa_onnx's errors; a crash (the worker dies), a
hang (no answer within TIMEOUT seconds), a file opened outside the model's folder or secret bytes in an output fail.

The corpus: models built here to carry every place a tensor can sit (initializers, sparse initializers, Constant nodes
in subgraphs and model-local functions) and the small models of the onnx wheel's own test data (simple,
pytorch-operator) that singa runs as they are.
"""

from __future__ import annotations

import glob
import json
import os
import select
import subprocess
import sys

import numpy as np
import onnx
import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from singa import device

TIMEOUT = 30.0
ADDRESS_SPACE = 4 << 30  # what the worker may map beyond what it maps once started (RLIMIT_AS)
SECRET = np.array([3.25, -1.5e7, 42.0625, 7.75e-3], np.float32)
OPSET = [helper.make_opsetid("", 17)]
ALLOWED = {"singa_onnx.errors.InvalidModelError", "singa_onnx.errors.UnsupportedOperatorError",
           "singa_onnx.errors.NodeError", "singa_onnx.errors.InvalidInputError"}
HERE = os.path.dirname(os.path.abspath(__file__))


# -- the corpus -------------------------------------------------------------------------------------------------------


def _f32(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _mlp():
    inits = [numpy_helper.from_array(_f32((8, 6), 1), "w1"), numpy_helper.from_array(_f32((6,), 2), "b1"),
             numpy_helper.from_array(_f32((6, 3), 3), "w2"), numpy_helper.from_array(_f32((3,), 4), "b2")]
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["z"]), helper.make_node("Softmax", ["z"], ["y"], axis=1)]
    g = helper.make_graph(nodes, "mlp", [_vi("x", TensorProto.FLOAT, ["N", 8])],
                          [_vi("y", TensorProto.FLOAT, ["N", 3])],
                          initializer=inits)
    return helper.make_model(g, opset_imports=OPSET), {"x": _f32((2, 8), 5)}


def _cnn():
    inits = [numpy_helper.from_array(_f32((4, 1, 3, 3), 1), "w"), numpy_helper.from_array(_f32((4,), 2), "cb"),
             numpy_helper.from_array(np.abs(_f32((4,), 3)) + 0.5, "scale"),
             numpy_helper.from_array(_f32((4,), 4), "bias"),
             numpy_helper.from_array(_f32((4,), 5), "mean"), numpy_helper.from_array(np.abs(_f32((4,), 6)) + 1, "var"),
             numpy_helper.from_array(np.array([0, -1], np.int64), "shape"),
             numpy_helper.from_array(_f32((36, 2), 7), "fc")]
    nodes = [helper.make_node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Reshape", ["p", "shape"], ["flat"]),
             helper.make_node("MatMul", ["flat", "fc"], ["y"])]
    g = helper.make_graph(nodes, "cnn", [_vi("x", TensorProto.FLOAT, ["N", 1, 6, 6])],
                          [_vi("y", TensorProto.FLOAT, ["N", 2])], initializer=inits)
    return helper.make_model(g, opset_imports=OPSET), {"x": _f32((2, 1, 6, 6), 8)}


def _control():
    """If (on the sign of a sum) with a Constant in each branch, and a Loop whose trip count is an input."""
    tc, ec = numpy_helper.from_array(_f32((3,), 1), "tc"), numpy_helper.from_array(_f32((3,), 2), "ec")
    then = helper.make_graph([helper.make_node("Constant", [], ["t"], value=tc),
                              helper.make_node("Add", ["x", "t"], ["o1"])], "then", [],
                             [_vi("o1", TensorProto.FLOAT, [3])])
    other = helper.make_graph([helper.make_node("Constant", [], ["e"], value=ec),
                               helper.make_node("Mul", ["x", "e"], ["o2"])], "else", [],
                              [_vi("o2", TensorProto.FLOAT, [3])])
    body = helper.make_graph([helper.make_node("Add", ["acc", "x"], ["acc_out"]),
                              helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
                             [_vi("i", TensorProto.INT64, []), _vi("cond_in", TensorProto.BOOL, []),
                              _vi("acc", TensorProto.FLOAT, [3])],
                             [_vi("cond_out", TensorProto.BOOL, []), _vi("acc_out", TensorProto.FLOAT, [3])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
             helper.make_node("Loop", ["n", "true", "y"], ["z"], body=body)]
    inits = [numpy_helper.from_array(np.array(0, np.float32), "zero"), numpy_helper.from_array(np.array(True), "true")]
    g = helper.make_graph(nodes, "control", [_vi("x", TensorProto.FLOAT, [3]), _vi("n", TensorProto.INT64, [])],
                          [_vi("z", TensorProto.FLOAT, [3])], initializer=inits)
    return helper.make_model(g, opset_imports=OPSET), {"x": _f32((3,), 3), "n": np.array(3, np.int64)}


def _function_and_sparse():
    """A model-local function holding a Constant, a sparse initializer and a Constant with a sparse value."""
    body = [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(_f32((4,), 1), "k")),
            helper.make_node("Mul", ["a", "k"], ["m"]), helper.make_node("Add", ["m", "b"], ["out"])]
    fn = helper.make_function("local", "scaled_add", ["a", "b"], ["out"], body, OPSET)
    sp = helper.make_sparse_tensor(numpy_helper.from_array(_f32((2,), 2), "sp"),
                                   numpy_helper.from_array(np.array([1, 3], np.int64), "sp_idx"), [4])
    sv = helper.make_sparse_tensor(numpy_helper.from_array(_f32((1,), 3), "sv"),
                                   numpy_helper.from_array(np.array([2], np.int64), "sv_idx"), [4])
    nodes = [helper.make_node("scaled_add", ["x", "sp"], ["f"], domain="local"),
             helper.make_node("Constant", [], ["c"], sparse_value=sv),
             helper.make_node("Add", ["f", "c"], ["g"]),
             helper.make_node("Gather", ["g", "idx"], ["y"])]
    g = helper.make_graph(nodes, "fs", [_vi("x", TensorProto.FLOAT, [4])], [_vi("y", TensorProto.FLOAT, [3])],
                          initializer=[numpy_helper.from_array(np.array([3, 0, 2], np.int64), "idx")])
    g.sparse_initializer.append(sp)
    m = helper.make_model(g, opset_imports=OPSET + [helper.make_opsetid("local", 1)], functions=[fn])
    return m, {"x": _f32((4,), 4)}


def _shapes():
    inits = [numpy_helper.from_array(np.array([2, 3, 4], np.int64), "to"),
             numpy_helper.from_array(np.array([0, 1], np.int64), "starts"),
             numpy_helper.from_array(np.array([2, 3], np.int64), "ends"),
             numpy_helper.from_array(np.array([1, 2], np.int64), "axes"),
             numpy_helper.from_array(np.array([2, 1, 1], np.int64), "reps")]
    nodes = [helper.make_node("Reshape", ["x", "to"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 1]),
             helper.make_node("Slice", ["t", "starts", "ends", "axes"], ["s"]),
             helper.make_node("Tile", ["s", "reps"], ["tl"]),
             helper.make_node("Concat", ["tl", "tl"], ["y"], axis=0)]
    g = helper.make_graph(nodes, "shapes", [_vi("x", TensorProto.FLOAT, [24])],
                          [_vi("y", TensorProto.FLOAT, ["a", "b", "c"])],
                          initializer=inits)
    return helper.make_model(g, opset_imports=OPSET), {"x": _f32((24,), 9)}


def _wheel_models() -> list:
    root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
    out = []
    folders = glob.glob(os.path.join(root, "simple", "*")) + glob.glob(os.path.join(root, "pytorch-operator", "*"))
    for folder in sorted(folders):
        path = os.path.join(folder, "model.onnx")
        if not os.path.isfile(path) or os.path.getsize(path) > 100_000:
            continue
        m = onnx.load(path)
        given = {i.name for i in m.graph.initializer}
        names = [i.name for i in m.graph.input if i.name not in given]
        feeds = {}
        for i, name in enumerate(names):
            pb = os.path.join(folder, "test_data_set_0", f"input_{i}.pb")
            if not os.path.isfile(pb):
                feeds = None
                break
            t = TensorProto()
            with open(pb, "rb") as f:
                t.ParseFromString(f.read())
            feeds[name] = numpy_helper.to_array(t)
        if feeds is not None:
            out.append((os.path.basename(folder), m, feeds))
    return out


def _runs(model, feeds) -> bool:
    from singa_onnx import prepare

    try:
        prepare(model, device.get_default_device()).run(feeds)
    except Exception:  # noqa: BLE001 - such models are left out of the corpus
        return False
    return True


@pytest.fixture(scope="module")
def corpus():
    built = [("mlp", *_mlp()), ("cnn", *_cnn()), ("control", *_control()),
             ("function_and_sparse", *_function_and_sparse()), ("shapes", *_shapes())]
    for name, m, feeds in built:
        assert _runs(m, feeds), f"the corpus model {name} does not run unmutated"
    wheel = [(n, m, f) for n, m, f in _wheel_models() if _runs(m, f)]
    assert len(wheel) >= 20, f"only {len(wheel)} models of the onnx wheel's test data run"
    return built + wheel


# -- the sandbox and the worker ----------------------------------------------------------------------------------------


class Worker:
    def __init__(self, sandbox: str):
        self.sandbox = sandbox
        self.proc = None
        self.start()

    def start(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "onnx_fuzz_worker.py"), self.sandbox, SECRET.tobytes().hex(),
             str(ADDRESS_SPACE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            cwd=os.path.join(self.sandbox, "cwd"), env=env, text=True)
        assert self._answer(120) == {"ready": True}

    def _answer(self, timeout: float) -> dict | None:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        if not line:  # the worker died
            self.proc.wait(timeout=30)
            return None
        return json.loads(line)

    def run(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self._answer(TIMEOUT)
        if answer is None:
            alive = self.proc.poll() is None
            self.stop()
            self.start()
            return {"outcome": "hang" if alive else "crash", "returncode": None if alive else self.proc.returncode}
        return answer

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    root = tmp_path_factory.mktemp("onnx_fuzz")
    for d in ("model", "cwd", "outside"):
        (root / d).mkdir()
    for d in ("cwd", "outside"):
        (root / d / "secret.bin").write_bytes(np.tile(SECRET, 64).tobytes())
    (root / "model" / "weights.bin").write_bytes(np.zeros(1 << 16, np.float32).tobytes())
    (root / "model" / "sub").mkdir()
    (root / "model" / "link.bin").symlink_to(root / "outside" / "secret.bin")
    if hasattr(os, "mkfifo"):
        os.mkfifo(root / "model" / "fifo")
    return str(root)


@pytest.fixture(scope="module")
def worker(sandbox):
    if not hasattr(select, "select") or sys.platform == "win32":
        pytest.skip("the worker protocol needs select() on pipes")
    w = Worker(sandbox)
    yield w
    w.stop()


# -- mutations --------------------------------------------------------------------------------------------------------


def _tensors(message: Message) -> list[TensorProto]:
    out, stack = [], [message]
    while stack:
        m = stack.pop()
        if isinstance(m, TensorProto):
            out.append(m)
            continue
        for fd, value in m.ListFields():
            if fd.type == fd.TYPE_MESSAGE:
                stack.extend([value] if isinstance(value, Message) else list(value))
    return out


HOSTILE_LOCATIONS = ["{outside}", "../outside/secret.bin", "../cwd/secret.bin", "secret.bin", "link.bin", "fifo",
                     "/dev/zero", "/proc/self/environ", "/etc/passwd", "sub", ".", "", "sub/../../outside/secret.bin",
                     "weights.bin\0../outside/secret.bin", "..", "C:\\secret.bin"]
HOSTILE_OFFSETS = [{"offset": "-1"}, {"offset": "abc"}, {"offset": "1e3"}, {"offset": str(2**70)},
                   {"length": "999999999999"}, {"offset": str(1 << 20)}, {"length": "-5"},
                   {"offset": "4", "length": "4"}, {"length": "0"}, {"offset": " 4"}, {}]


@st.composite
def mutation(draw, corpus_size):
    idx = draw(st.integers(0, corpus_size - 1))
    kind = draw(st.sampled_from(["truncate", "bitflip", "overwrite", "tensor_dims", "input_dims", "feed_dims",
                                 "external", "external_offsets"]))
    as_bytes = draw(st.integers(0, 3)) == 0
    return idx, kind, as_bytes, draw(st.randoms(use_true_random=False))


def _mutate(model: onnx.ModelProto, feeds: dict, kind: str, rnd, sandbox: str) -> tuple[bytes, dict]:
    feeds = dict(feeds)
    if kind in ("truncate", "bitflip", "overwrite"):
        raw = bytearray(model.SerializeToString())
        if kind == "truncate":
            raw = raw[: rnd.randrange(len(raw))]
        elif kind == "bitflip":
            for _ in range(rnd.randint(1, 8)):
                i = rnd.randrange(len(raw))
                raw[i] ^= 1 << rnd.randrange(8)
        else:
            for _ in range(rnd.randint(1, 4)):
                i = rnd.randrange(len(raw))
                raw[i:i + 4] = bytes(rnd.choice([0x00, 0xFF, 0x7F, 0x80]) for _ in range(4))
        return bytes(raw), feeds
    m = onnx.ModelProto()
    m.CopyFrom(model)
    dims = [0, 1, 2, 3, 7, -1, -(2**40), 2**31, 2**40, 10**9]
    if kind == "tensor_dims":
        tensors = _tensors(m)
        if tensors:
            t = rnd.choice(tensors)
            del t.dims[:]
            t.dims.extend(rnd.choice(dims) for _ in range(rnd.randint(0, 4)))
    elif kind == "input_dims":
        inputs = [vi for vi in m.graph.input if vi.type.HasField("tensor_type")]
        if inputs:
            shape = rnd.choice(inputs).type.tensor_type.shape
            shape.ClearField("dim")
            for _ in range(rnd.randint(0, 4)):
                d = shape.dim.add()
                if rnd.random() < 0.3:
                    d.dim_param = rnd.choice(["N", "M"])
                else:
                    d.dim_value = rnd.choice([v for v in dims if v >= 0])
    elif kind == "feed_dims" and feeds:
        name = rnd.choice(sorted(feeds))
        v = np.asarray(feeds[name])
        choice = rnd.randrange(4) if v.dtype.kind in "biuf" else rnd.choice([0, 2])  # strings: no casts
        if choice == 0:
            feeds[name] = np.zeros(tuple(rnd.choice([0, 1, 2, 5]) for _ in range(rnd.randint(0, 4))), v.dtype)
        elif choice == 1:
            feeds[name] = v.astype(rnd.choice([np.float64, np.int64, np.int32, np.bool_, np.float16]))
        elif choice == 2:
            feeds[name] = v.reshape(-1)
        else:
            feeds[name] = np.full(v.shape, rnd.choice([np.nan, np.inf, -1e30, 0.0]), np.float32) \
                if v.dtype.kind == "f" else v + rnd.choice([-(2**31), 2**31 - 1, -1])
    elif kind in ("external", "external_offsets"):
        tensors = _tensors(m)
        if not tensors:  # an unused initializer: its data must be refused all the same
            m.graph.initializer.append(numpy_helper.from_array(np.zeros(4, np.float32), "fuzz_extra"))
            tensors = list(m.graph.initializer)
        if tensors:
            t = rnd.choice(tensors)
            if kind == "external":
                loc = rnd.choice(HOSTILE_LOCATIONS).replace("{outside}", os.path.join(sandbox, "outside", "secret.bin"))
                extra = {}
            else:
                loc, extra = "weights.bin", rnd.choice(HOSTILE_OFFSETS)
            t.ClearField("raw_data")
            t.data_location = TensorProto.EXTERNAL
            del t.external_data[:]
            for k, v in {"location": loc, **extra}.items():
                e = t.external_data.add()
                e.key, e.value = k, v
    return m.SerializeToString(), feeds


def _plain(v) -> np.ndarray:
    """An array np.load reads without pickle: strings as unicode."""
    v = np.asarray(v)
    return v.astype(str) if v.dtype == object else v


@settings(max_examples=800, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_mutated_models_load_or_fail_cleanly(corpus, sandbox, worker, data):
    idx, kind, as_bytes, rnd = data.draw(mutation(len(corpus)))
    name, model, feeds = corpus[idx]
    raw, feeds = _mutate(model, feeds, kind, rnd, sandbox)
    path = os.path.join(sandbox, "model", "case.onnx")
    with open(path, "wb") as f:
        f.write(raw)
    feed_path = os.path.join(sandbox, "feeds.npz")
    np.savez(feed_path, **{k: _plain(v) for k, v in feeds.items()})
    answer = worker.run({"model": path, "as": "bytes" if as_bytes else "path", "feeds": feed_path})
    what = f"{name} mutated by {kind} ({'bytes' if as_bytes else 'path'})"
    assert answer["outcome"] in ("ok", "error"), f"{what}: the worker {answer['outcome']}ed ({answer})"
    assert not answer["outside"], f"{what}: opened files outside the model folder: {answer['outside']}"
    assert not answer["leaked"], f"{what}: an output holds the secret bytes"
    if answer["outcome"] == "error":
        assert answer["type"] in ALLOWED, f"{what}: {answer['type']}: {answer['message']}\n{answer['traceback']}"
        assert answer["message"], f"{what}: {answer['type']} without a message"
