"""Threads: autograd's `training` flag and graph recording are per thread.

Each test runs jobs (one model each, trained eagerly, trained in graph mode, or evaluated) first one after the other,
then in 4 threads at once on the same device, and asks for the same numbers bit for bit. The switch interval is made
tiny so that the threads interleave between almost every operation.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
from helpers import CNN

from singa import autograd, device, graph, ops, opt, tensor

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")

STEPS = 4
BATCH = 6


@pytest.fixture(scope="module", params=[d.name for d in device.list_devices()])
def dev(request):
    """Every installed device: each backend must keep the threads apart."""
    return device.get_device(request.param)


@pytest.fixture
def busy_switching():
    prev = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(prev)


def _data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((STEPS, BATCH, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 5, (STEPS, BATCH)).astype(np.int32)
    return x, y


def _job(kind: str, seed: int, dev) -> list[np.ndarray]:
    """One model's run: its per-step outputs (and losses), then its final states, as numpy arrays."""
    x, y = _data(seed)
    m = CNN(channels=4, dropout=0)
    m.optimizer = opt.SGD(lr=0.05, momentum=0.9)
    tx = tensor.Tensor((BATCH, 1, 8, 8), dev)
    ty = tensor.Tensor((BATCH,), dev, tensor.int32)
    m.compile([tx], is_train=kind != "eval", use_graph=kind == "graph", sequential=False)
    rng = np.random.default_rng(1000 + seed)  # weights from numpy: the device's generator is shared by the threads
    for _, t in sorted(m.get_params().items()):
        t.copy_from_numpy(rng.standard_normal(t.shape).astype(np.float32) * 0.3)
    out = []
    for s in range(STEPS):
        tx.copy_from_numpy(x[s])
        ty.copy_from_numpy(y[s])
        if kind == "eval":
            m.eval()  # switches recording off in this thread only
            out.append(tensor.to_numpy(m(tx)))
            assert not autograd.training
        else:
            o, loss = m(tx, ty)
            out += [tensor.to_numpy(o), tensor.to_numpy(loss)]
            assert autograd.training
    out += [t.to_numpy() for _, t in sorted(m.get_states().items())]
    if kind == "graph":
        assert m.graph_summary() is not None, "the graph job ran eagerly"
    return out


def _threaded(jobs: list[tuple[str, int]], dev) -> list:
    results: list = [None] * len(jobs)
    barrier = threading.Barrier(len(jobs))

    def work(i: int, kind: str, seed: int) -> None:
        try:
            barrier.wait()
            results[i] = _job(kind, seed, dev)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            results[i] = exc

    threads = [threading.Thread(target=work, args=(i, k, s)) for i, (k, s) in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
        assert not t.is_alive(), "a training thread hangs"
    return results


@pytest.mark.parametrize("jobs", [
    [("eager", 1), ("eager", 2), ("eager", 3), ("eager", 4)],
    [("graph", 1), ("graph", 2), ("graph", 3), ("graph", 4)],
    [("eager", 1), ("eval", 2), ("graph", 3), ("eval", 4)],
], ids=["eager", "graph", "eval-while-training"])
def test_threads_match_sequential_runs(dev, jobs, busy_switching):
    sequential = [_job(kind, seed, dev) for kind, seed in jobs]
    threaded = _threaded(jobs, dev)
    for (kind, seed), want, got in zip(jobs, sequential, threaded):
        if isinstance(got, BaseException):
            raise AssertionError(f"the {kind} job (seed {seed}) failed in its thread: {got!r}") from got
        assert len(got) == len(want)
        for i, (w, g) in enumerate(zip(want, got)):
            assert np.array_equal(w, g), f"{kind} job (seed {seed}): array {i} differs from the sequential run"


def test_training_flag_is_per_thread():
    autograd.training = True
    seen = {}

    def child():
        seen["start"] = autograd.training  # a new thread starts from the main thread's value
        autograd.training = False
        seen["own"] = autograd.training

    t = threading.Thread(target=child)
    t.start()
    t.join()
    assert seen == {"start": True, "own": False}
    assert autograd.training is True  # the child's assignment stayed in the child
    autograd.training = False
    t = threading.Thread(target=lambda: seen.__setitem__("start", autograd.training))
    t.start()
    t.join()
    assert seen["start"] is False


def test_eval_in_one_thread_keeps_another_threads_backward(dev):
    """An operator run while this thread trains keeps what its backward needs, whatever other threads set."""
    autograd.training = True
    x = tensor.Tensor((3, 4), dev)
    x.gaussian(0, 1)
    w = tensor.Tensor((4, 2), dev, requires_grad=True, stores_grad=True)
    w.gaussian(0, 1)
    loss = autograd.softmax_cross_entropy(autograd.matmul(x, w), tensor.from_numpy(np.array([0, 1, 1], np.int32), dev))
    t = threading.Thread(target=lambda: setattr(autograd, "training", False))
    t.start()
    t.join()
    assert autograd.training is True
    grads = {id(p): g for p, g in autograd.backward(loss)}
    assert id(w) in grads


def test_recording_ignores_other_threads_kernels(dev):
    """A kernel run by another thread while this one records is not part of the recorded step."""
    a = tensor.from_numpy(np.ones((4,), np.float32), dev)
    started, done = threading.Event(), threading.Event()

    def other():
        started.wait()
        for _ in range(5):
            tensor.to_numpy(a * 2.0 + 1.0)  # kernels and a host read, from another thread
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with graph.Recorder(dev) as rec:
        b = a + 1.0
        started.set()
        done.wait(timeout=60)
        c = b * 3.0
    t.join()
    g = rec.finish(sequential=True)  # a host read counted as this step's would raise GraphUnsupported here
    assert [call.name for call in g.calls] == ["add_scalar", "mul_scalar"]
    assert rec.problem is None
    g.run()
    assert np.array_equal(tensor.to_numpy(c), np.full((4,), 6.0, np.float32))


def test_two_threads_record_at_once(dev):
    """Recorders of two threads are active together and each keeps only its own calls."""
    ready = threading.Barrier(2)
    out = {}

    def record(name, op):
        a = tensor.from_numpy(np.arange(4, dtype=np.float32), dev)
        with graph.Recorder(dev) as rec:
            ready.wait()
            r = op(a)
            ready.wait()
        out[name] = ([c.name for c in rec.finish(True).calls], tensor.to_numpy(r))

    ts = [threading.Thread(target=record, args=("exp", tensor.exp)),
          threading.Thread(target=record, args=("sqrt", tensor.sqrt))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert out["exp"][0] == ["exp"]
    assert out["sqrt"][0] == ["sqrt"]
    assert "EnableGraph" not in vars(dev)
    assert all(not hasattr(f, "__wrapped__") for f in dev.table.values())


def test_index_checks_of_two_threads_stay_apart(dev, busy_switching):
    """A thread gathering with bad indices never makes another thread's good gather fail (a backend that checks
    indices on the device keeps one flag per thread), and gets its own error by the time it reads the result (an
    asynchronous device such as CUDA reports a device-side check at the next synchronisation, as PyTorch does)."""
    x = tensor.from_numpy(np.arange(20, dtype=np.float32).reshape(5, 4), dev)
    good = tensor.from_numpy(np.array([0, 4, 2], np.int32), dev)
    bad = tensor.from_numpy(np.array([1, 9, 0], np.int32), dev)
    stop = threading.Event()
    wrong: list = []

    def bad_gathers():
        while not stop.is_set():
            try:
                tensor.to_numpy(ops.gather(x, bad, 0))
                wrong.append("a bad index went through")
            except IndexError:
                pass

    t = threading.Thread(target=bad_gathers)
    t.start()
    try:
        for _ in range(300):
            r = ops.gather(x, good, 0)
            assert np.array_equal(tensor.to_numpy(r), np.arange(20, dtype=np.float32).reshape(5, 4)[[0, 4, 2]])
    finally:
        stop.set()
        t.join(timeout=60)
    assert not wrong
