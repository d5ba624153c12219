"""The CUDA backend on a GPU: what is particular to it beyond the shared conformance suite (which runs on cuda as on
every device). Every test here skips, saying why, on a machine without a usable CUDA device."""

from __future__ import annotations

import numpy as np
import pytest

from singa import dtypes, tensor
from singa.backend import View
from singa.testing import helpers as H
from singa.testing.conformance.references import draws_u32

F32, F16, I64 = dtypes.float32, dtypes.float16, dtypes.int64


def test_every_primitive_is_native(gpu):
    assert gpu.missing_kernels() == []
    assert not any(getattr(fn, "is_fallback", False) for fn in gpu.table.values())


def test_buffers_are_device_memory_and_copies_round_trip(gpu):
    from singa_backend_cuda.device import CudaBuffer

    buf = gpu.alloc(40 << 20)  # larger than the pinned staging buffer: copies go in pieces
    assert isinstance(buf.handle, CudaBuffer)
    x = np.random.default_rng(0).standard_normal(10 << 20).astype(np.float32)
    v = View(buf, F32, x.shape)
    gpu.write(v, x)
    assert np.array_equal(gpu.read(v), x)
    small = H.upload(gpu, np.arange(100, dtype=np.float32))
    gpu.copy_view(View(small.buffer, F32, (90,), offset=10), View(small.buffer, F32, (90,), offset=0))
    want = np.arange(100, dtype=np.float32)
    want[10:] = np.arange(90)
    assert np.array_equal(gpu.read(View(small.buffer, F32, (100,))), want)


@pytest.mark.parametrize(("seed", "offset", "n"), [(0, 0, 1000), (42, 6, 777), (2**64 - 1, 2**40 + 3, 9)])
def test_philox_words_match_the_reference(gpu, seed, offset, n):
    from singa.gpu.table import philox_u32

    assert philox_u32(gpu, seed, offset, n) == list(draws_u32(seed, offset, n))


@pytest.mark.parametrize("dtype", [F32, F16], ids=dtypes.name)
def test_matmul_through_cublas(gpu, dtype):
    rng = np.random.default_rng(1)
    npdt = np.float32 if dtype == F32 else np.float16
    a = rng.standard_normal((3, 70, 50)).astype(npdt)
    b = rng.standard_normal((1, 60, 50)).astype(npdt)  # broadcast over the batch, transposed
    out = H.empty(gpu, (3, 70, 60), dtype)
    gpu.table["matmul"](out, H.upload(gpu, a), H.upload(gpu, b), trans_b=True, alpha=0.5)
    want = 0.5 * a.astype(np.float64) @ np.swapaxes(b.astype(np.float64), 1, 2)
    tol = 1e-5 if dtype == F32 else 3e-3
    assert np.allclose(H.download(gpu, out), want, rtol=tol, atol=tol * np.abs(want).max())


def test_tf32_is_off_unless_asked(gpu):
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((1, 256, 1024)).astype(np.float32), rng.standard_normal((1, 1024, 256)).astype(
        np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)

    def err():
        out = H.empty(gpu, (1, 256, 256), F32)
        gpu.table["matmul"](out, H.upload(gpu, a), H.upload(gpu, b))
        return float(np.max(np.abs(H.download(gpu, out) - want)) / np.max(np.abs(want)))

    exact = err()
    assert exact < 1e-5  # FMA float32
    gpu.set_tf32(True)
    try:
        assert err() > 3 * exact  # TF32 keeps 10 bits of mantissa: visibly less exact
    finally:
        gpu.set_tf32(False)
    assert err() == exact


def test_out_of_memory_is_a_memory_error_and_the_device_survives(gpu):
    with pytest.raises(MemoryError, match="out of device memory"):
        gpu.alloc(1 << 50)
    v = H.upload(gpu, np.ones(10, np.float32))
    assert np.array_equal(H.download(gpu, v), np.ones(10, np.float32))


def test_captured_graph_replays_and_defers_label_checks(gpu):
    x = H.upload(gpu, np.random.default_rng(3).standard_normal((4, 5)).astype(np.float32))
    labels = H.upload(gpu, np.array([0, 1, 2, 3], np.int32))
    loss = H.empty(gpu, (4,), F32)
    kern = gpu.table["softmax_cross_entropy"]
    launch = gpu.capture(lambda: kern(loss, x, labels))
    assert launch is not None, getattr(gpu, "capture_error", None)
    launch()
    first = H.download(gpu, loss)
    kern(loss, x, labels)  # the eager call computes the same
    assert np.array_equal(H.download(gpu, loss), first)
    gpu.write(labels, np.array([0, 1, 7, 3], np.int32))  # out of range, seen only by the replayed graph
    launch()
    with pytest.raises(IndexError, match=r"label 7 with 5 classes.*CUDA graph"):
        gpu.synchronize()
    gpu.write(labels, np.array([0, 1, 2, 3], np.int32))
    launch()
    gpu.synchronize()  # the flag was cleared after the report


def test_deferred_flag_survives_the_graphs_reused_temporaries(gpu):
    # a temporary freed before the check would hand its block to the flag; the graph rewrites it at every launch
    x = H.upload(gpu, np.random.default_rng(5).standard_normal((4, 5)).astype(np.float32))
    labels = H.upload(gpu, np.array([0, 1, 2, 3], np.int32))
    loss = H.empty(gpu, (4,), F32)

    def step():
        tmp = View(gpu.alloc(400), F32, (100,))
        gpu.table["fill"](tmp, -1.0)  # 0xBF800000: a negative position if it ever reached the flag
        del tmp
        gpu.table["softmax_cross_entropy"](loss, x, labels)

    launch = gpu.capture(step)
    assert launch is not None, getattr(gpu, "capture_error", None)
    for _ in range(3):
        launch()
    gpu.synchronize()


def test_graph_mode_step_is_one_cuda_graph(gpu, monkeypatch):
    from singa import autograd, layer, model, opt

    class Net(model.Model):
        def __init__(self):
            super().__init__()
            self.fc1 = layer.Linear(16)
            self.fc2 = layer.Linear(3)

        def forward(self, x):
            return self.fc2(autograd.relu(self.fc1(x)))

        def train_one_batch(self, x, y):
            loss = autograd.softmax_cross_entropy(self.forward(x), y)
            self.optimizer(loss)
            return loss

        def set_optimizer(self, optimizer):
            self.optimizer = optimizer

    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((8, 10)).astype(np.float32) for _ in range(4)]
    ys = [rng.integers(0, 3, 8).astype(np.int32) for _ in range(4)]

    def losses(graph: bool):
        gpu.set_rand_seed(0)
        m = Net()
        m.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
        tx, ty = tensor.Tensor((8, 10), gpu), tensor.Tensor((8,), gpu, tensor.int32)
        m.compile([tx], is_train=True, use_graph=graph)
        out = []
        for x, y in zip(xs, ys):
            tx.copy_from_numpy(x)
            ty.copy_from_numpy(y)
            out.append(float(tensor.to_numpy(m(tx, ty)).reshape(-1)[0]))
        return out, m

    eager, _ = losses(False)
    graph, m = losses(True)
    assert np.allclose(graph, eager, rtol=1e-5)
    assert m._step_graph.graph._device_replay is not None, getattr(gpu, "capture_error", None)
    monkeypatch.setenv("SINGA_CUDA_GRAPHS", "0")
    python_replay, m2 = losses(True)
    assert m2._step_graph.graph._device_replay is None
    assert np.allclose(python_replay, graph, rtol=1e-6)


def test_cudnn_rnn_trains_alike_in_eager_and_graph_mode(gpu):
    from singa import autograd, layer, model, opt

    class Net(model.Model):
        def __init__(self):
            super().__init__()
            self.rnn = layer.CudnnRNN(hidden_size=8, rnn_mode="lstm", num_layers=2, bidirectional=True,
                                      batch_first=False, return_sequences=False)
            self.fc = layer.Linear(3)

        def forward(self, x):
            return self.fc(self.rnn(x))

        def train_one_batch(self, x, y):
            loss = autograd.softmax_cross_entropy(self.forward(x), y)
            self.optimizer(loss)
            return loss

        def set_optimizer(self, optimizer):
            self.optimizer = optimizer

    from singa import rnn

    assert gpu.rnn_operator(rnn.RNNSpec("lstm", 4, 8)) is not None
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((5, 6, 4)).astype(np.float32) for _ in range(4)]  # (T, B, F)
    ys = [rng.integers(0, 3, 6).astype(np.int32) for _ in range(4)]

    def losses(graph: bool):
        gpu.set_rand_seed(0)
        m = Net()
        m.set_optimizer(opt.SGD(lr=0.1))
        tx, ty = tensor.Tensor((5, 6, 4), gpu), tensor.Tensor((6,), gpu, tensor.int32)
        m.compile([tx], is_train=True, use_graph=graph)
        out = []
        for x, y in zip(xs, ys):
            tx.copy_from_numpy(x)
            ty.copy_from_numpy(y)
            out.append(float(tensor.to_numpy(m(tx, ty)).reshape(-1)[0]))
        return out

    eager, graph = losses(False), losses(True)
    assert np.all(np.isfinite(eager))
    assert eager[-1] < eager[0]
    assert np.allclose(graph, eager, rtol=1e-5)
