"""SINGA's Device object API (issue 13, item 1): the methods scripts and SINGA's own Model call on a device.

The reference (shared/reference/singa-python-api.md, "Object-level API") lists SetRandSeed, host, Reset, id, Sync,
ResetGraph, RunGraph(serial=False), graph_enabled, EnableGraph, PrintTimeProfiling, SetVerbosity, SetSkipIteration
and the static EnableLazyAlloc. SINGA's Model drives graph mode through them:

    dev.EnableGraph(True); out = train_one_batch(x, y); dev.Sync(); dev.EnableGraph(False); dev.RunGraph(serial)

and every later step is one `dev.RunGraph(serial)`. A script doing that by hand must train exactly as
`model.compile(..., use_graph=True)` does, and both as eager mode.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import MLP

from singa import device, graph, opt, profiling, tensor
from singa.backend import Device
from singa.tensor import Tensor

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")

SINGA_DEVICE_METHODS = ("SetRandSeed", "host", "Reset", "id", "Sync", "ResetGraph", "RunGraph", "graph_enabled",
                        "EnableGraph", "PrintTimeProfiling", "SetVerbosity", "SetSkipIteration", "EnableLazyAlloc")


@pytest.fixture
def dev():
    d = device.get_default_device()
    yield d
    d.ResetGraph()


def test_every_device_has_singas_methods(dev):
    for name in SINGA_DEVICE_METHODS:
        assert callable(getattr(dev, name)), name
        assert name in vars(Device) or name == "id", name  # in the core's base class: every backend inherits them
    assert dev.id() == int(dev.name.rsplit(":", 1)[1])
    assert f"{dev.backend_name}:{dev.id}" == dev.name  # still the plain index where code formats it
    assert dev.host() is device.create_cpu_device()
    Device.EnableLazyAlloc(True)  # static, as SINGA's
    device.enable_lazy_alloc(False)
    assert dev.graph_enabled() is False
    dev.Sync()


def test_id_is_also_an_int_for_backends(dev):
    d = device.get_device("cpu:0")
    assert d.id == 0
    assert d.id() == 0
    assert type(d.id()) is int
    assert {d.id: "x"}[0] == "x"


def _data(n, batch=8, features=12, classes=10, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, features)).astype(np.float32),
             rng.integers(0, classes, batch).astype(np.int32)) for _ in range(n)]


def _model(dev, x0, y0, use_graph, sequential):
    dev.SetRandSeed(11)  # the same initial weights in every run
    m = MLP(perceptron_size=16)
    m.set_optimizer(opt.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4))
    tx, ty = Tensor(x0.shape, dev), Tensor(y0.shape, dev, tensor.int32)
    m.compile([tx], is_train=True, use_graph=use_graph, sequential=sequential)
    return m, tx, ty


@pytest.mark.parametrize("serial", [False, True], ids=["scheduled", "serial"])
def test_graph_driven_through_the_device_trains_as_compile_use_graph(dev, serial):
    data = _data(5)
    runs = {}
    for how in ("eager", "compile", "device"):
        m, tx, ty = _model(dev, *data[0], use_graph=how == "compile", sequential=serial)
        losses = []
        for i, (x, y) in enumerate(data):
            tx.copy_from_numpy(x)
            ty.copy_from_numpy(y)
            if how != "device":
                _, loss = m(tx, ty)
            elif i == 0:  # what SINGA's Model does at the first graph-mode step
                dev.EnableGraph(True)
                assert dev.graph_enabled()
                _, loss = m.train_one_batch(tx, ty)
                dev.Sync()
                dev.EnableGraph(False)
                dev.RunGraph(serial)
            else:  # ... and at every later one: the buffered step runs again on the new data
                dev.RunGraph(serial)
            losses.append(float(loss.to_numpy()[0]))
        runs[how] = (losses, {k: t.to_numpy() for k, t in m.get_states().items()},
                     m.optimizer.step_counter.to_numpy()[0])
        dev.ResetGraph()
    for how in ("compile", "device"):
        assert runs[how][2] == len(data)  # one optimizer step per call, no more
        np.testing.assert_allclose(runs[how][0], runs["eager"][0], rtol=1e-5)
        for k, v in runs["eager"][1].items():
            np.testing.assert_allclose(runs[how][1][k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    # graph driven by hand and by compile replay the same kernels: identical numbers
    assert runs["device"][0] == runs["compile"][0]
    for k, v in runs["compile"][1].items():
        np.testing.assert_array_equal(runs["device"][1][k], v, err_msg=k)


def test_enable_graph_false_inside_a_recording_pauses_it(dev):
    x = tensor.from_numpy(np.ones(3, np.float32), dev)
    counter = tensor.from_numpy(np.zeros(1, np.float32), dev)
    dev.EnableGraph(True)
    y = x * 2.0
    dev.EnableGraph(False)  # what a layer does while it creates its parameters: not part of the step
    assert not dev.graph_enabled()
    counter += 1.0
    dev.EnableGraph(True)
    y += 1.0
    dev.EnableGraph(False)
    dev.RunGraph()  # the step already ran while it was recorded
    np.testing.assert_array_equal(y.to_numpy(), [3.0, 3.0, 3.0])
    x.copy_from_numpy(np.arange(3, dtype=np.float32))
    dev.RunGraph()
    np.testing.assert_array_equal(y.to_numpy(), [1.0, 3.0, 5.0])
    np.testing.assert_array_equal(counter.to_numpy(), [1.0])  # the paused part is not replayed


def test_singas_compile_sequence_creates_parameters_and_replays_nothing(dev):
    """SINGA's Model.compile: EnableGraph(True); forward(placeholders); EnableGraph(False); ResetGraph()."""
    dev.SetRandSeed(3)
    m = MLP(perceptron_size=4)
    tx = tensor.from_numpy(np.ones((2, 5), np.float32), dev)
    dev.EnableGraph(True)
    m.forward(tx)
    dev.EnableGraph(False)
    dev.ResetGraph()
    assert m.linear1.W.shape == (5, 4)
    w = m.linear1.W.to_numpy().copy()
    dev.RunGraph()  # nothing recorded any more: nothing runs
    np.testing.assert_array_equal(m.linear1.W.to_numpy(), w)


def test_run_graph_names_what_cannot_be_replayed(dev):
    x = tensor.from_numpy(np.ones(3, np.float32), dev)
    dev.EnableGraph(True)
    y = x + 1.0
    y.to_numpy()  # a host read in the step: a replay could not give it back to Python
    dev.EnableGraph(False)
    with pytest.raises(graph.GraphUnsupported, match=r"RunGraph.*read on the host.*test_singa_device_api\.py"):
        dev.RunGraph()


def test_reset_restores_singas_defaults(dev):
    dev.SetVerbosity(2)
    dev.SetSkipIteration(0)
    x = tensor.from_numpy(np.ones(3, np.float32), dev)
    dev.EnableGraph(True)
    y = x * 3.0
    dev.EnableGraph(False)
    dev.Reset()
    assert dev.verbosity == 0
    assert profiling.profiler(dev).skip_iterations == profiling.DEFAULT_SKIP
    x.copy_from_numpy(np.zeros(3, np.float32))
    dev.RunGraph()  # the graph went with Reset
    np.testing.assert_array_equal(y.to_numpy(), [3.0, 3.0, 3.0])


def test_time_profiling_of_a_device_driven_graph(dev, capsys):
    x = tensor.from_numpy(np.ones((4, 4), np.float32), dev)
    dev.Reset()  # forget what earlier tests ran on this device
    dev.SetVerbosity(1)
    dev.SetSkipIteration(1)
    try:
        dev.EnableGraph(True)
        y = tensor.mult(x, x)
        y += 1.0
        dev.EnableGraph(False)
        for _ in range(4):
            dev.RunGraph(True)
        dev.PrintTimeProfiling()
    finally:
        dev.Reset()
    out = capsys.readouterr().out
    assert "2 graph iteration(s) timed" in out  # 3 replays after the recording, the first skipped
    assert "matmul" in out
    np.testing.assert_array_equal(y.to_numpy(), np.full((4, 4), 5.0))


def test_set_rand_seed_makes_draws_repeat(dev):
    a, b = Tensor((16,), dev), Tensor((16,), dev)
    dev.SetRandSeed(42)
    a.gaussian(0.0, 1.0)
    dev.SetRandSeed(42)
    b.gaussian(0.0, 1.0)
    np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())
