"""singa.graph: recording kernel calls, replaying them, scheduling and memory planning; singa.profiling.

Steps here are written with singa.ops directly (forward, hand-written backward, optimizer), so what is replayed is
known exactly; test_model.py covers whole models.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from singa import device, graph, ops, opt, profiling, tensor
from singa.backend import MemoryPool

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")


@pytest.fixture(scope="module")
def dev():
    return device.get_default_device()


class TinyMLP:
    """x (N, 6) -> matmul -> relu -> matmul -> softmax cross-entropy, backward by hand, SGD with momentum."""

    def __init__(self, dev, seed=0, dropout=0.0):
        rng = np.random.default_rng(seed)
        self.dev = dev
        self.w0 = tensor.from_numpy(rng.standard_normal((6, 16)).astype(np.float32) * 0.3, dev)
        self.w1 = tensor.from_numpy(rng.standard_normal((16, 4)).astype(np.float32) * 0.3, dev)
        self.opt = opt.SGD(0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)
        self.dropout = dropout

    def step(self, x, y):
        h = ops.matmul(x, self.w0)
        a = ops.relu(h)
        if self.dropout:
            mask = ops.mul(ops.random_bernoulli(ops.empty(a.shape, a.dtype, self.dev), 1 - self.dropout),
                           1 / (1 - self.dropout))
            a = ops.mul(a, mask)
        logits = ops.matmul(a, self.w1)
        loss = ops.mean(ops.softmax_cross_entropy(logits, y))
        dl = ops.full((x.shape[0],), 1.0 / x.shape[0], tensor.float32, self.dev)
        dlogits = ops.softmax_cross_entropy_backward(dl, logits, y)
        dw1 = ops.matmul(a.T(), dlogits)
        da = ops.matmul(dlogits, self.w1.T())
        if self.dropout:
            da = ops.mul(da, mask)
        dw0 = ops.matmul(x.T(), ops.relu_grad(da, h))
        self.opt.update(self.w1, dw1)
        self.opt.update(self.w0, dw0)
        self.opt.step()
        return loss


def _batches(n=5, seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 4, 8).astype(np.int32))
            for _ in range(n)]


def _train(dev, mode, dropout=0.0):
    """mode: 'eager', 'seq' or 'dep'. Returns per-step losses and the final weights."""
    dev.set_rand_seed(42)
    m = TinyMLP(dev, dropout=dropout)
    tx = tensor.Tensor((8, 6), dev)
    ty = tensor.Tensor((8,), dev, tensor.int32)
    losses, g, out = [], None, None
    for x, y in _batches():
        tx.copy_from_numpy(x)
        ty.copy_from_numpy(y)
        if mode == "eager":
            out = m.step(tx, ty)
        elif g is None:
            with graph.Recorder(dev) as rec:
                out = m.step(tx, ty)
            g = rec.finish(sequential=(mode == "seq"))
            del rec
        else:
            g.run()
        losses.append(float(out.to_numpy()))
    return np.array(losses), m.w0.to_numpy(), m.w1.to_numpy(), g


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_replay_equals_eager(dev, dropout):
    le, w0e, w1e, _ = _train(dev, "eager", dropout)
    for mode in ("seq", "dep"):
        lg, w0g, w1g, g = _train(dev, mode, dropout)
        np.testing.assert_allclose(lg, le, rtol=1e-6)
        np.testing.assert_allclose(w0g, w0e, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(w1g, w1e, rtol=1e-6, atol=1e-7)
        assert len(g) > 10
        assert sorted(g.order) == list(range(len(g.calls)))
    assert len(set(np.round(le, 6))) == len(le)  # the loss does change: the replay really trains


def test_random_kernels_draw_fresh_numbers(dev):
    dev.set_rand_seed(7)
    x = tensor.Tensor((64,), dev)
    with graph.Recorder(dev) as rec:
        y = ops.mul(ops.random_uniform(x, 0.0, 1.0), 2.0)
    g = rec.finish()
    del rec
    first = y.to_numpy().copy()
    off = dev.rng_offset
    g.run()
    second = y.to_numpy().copy()
    assert dev.rng_offset == off + 64
    assert not np.allclose(first, second)
    # the replay drew exactly what an eager call at that offset draws
    dev.set_rand_seed(7)
    ops.random_uniform(tensor.Tensor((64,), dev), 0.0, 1.0)
    np.testing.assert_allclose(ops.random_uniform(tensor.Tensor((64,), dev), 0.0, 1.0).to_numpy() * 2, second)


def test_host_read_is_detected(dev):
    x = tensor.from_numpy(np.ones(4, np.float32), dev)
    with graph.Recorder(dev) as rec:
        y = ops.add(x, 1.0)
        value = y.to_numpy()  # the step's result still comes out right: it ran eagerly
    assert np.allclose(value, 2.0)
    with pytest.raises(graph.GraphUnsupported, match=r"read on the host.*test_graph\.py"):
        rec.finish()


def test_host_write_into_existing_tensor_is_detected(dev):
    x = tensor.from_numpy(np.ones(4, np.float32), dev)
    with graph.Recorder(dev) as rec:
        x.copy_from_numpy(np.zeros(4, np.float32))
        ops.add(x, 1.0)
    with pytest.raises(graph.GraphUnsupported, match="existed before the step"):
        rec.finish()


def test_constants_written_in_the_step_are_replayed(dev):
    x = tensor.from_numpy(np.arange(4, dtype=np.float32), dev)
    with graph.Recorder(dev) as rec:
        c = tensor.from_numpy(np.array([10, 20, 30, 40], np.float32), dev)  # a host write into a new buffer
        y = ops.add(x, ops.mul(c, 2.0))
    g = rec.finish()
    del rec, c
    x.copy_from_numpy(np.array([1, 1, 1, 1], np.float32))
    g.run()
    np.testing.assert_allclose(y.to_numpy(), [21, 41, 61, 81])


def test_no_record_runs_once(dev):
    acc = tensor.from_numpy(np.zeros(3, np.float32), dev)
    with graph.Recorder(dev) as rec:
        with graph.no_record():
            ops.fill(acc, 5.0)  # set-up: not replayed
        ops.add(acc, 1.0, out=acc)
    g = rec.finish()
    for _ in range(3):
        g.run()
    np.testing.assert_allclose(acc.to_numpy(), 9.0)


def test_conv_without_bias(dev):
    rng = np.random.default_rng(3)
    x = tensor.from_numpy(rng.standard_normal((2, 3, 6, 6)).astype(np.float32), dev)
    w = tensor.from_numpy(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), dev)
    with graph.Recorder(dev) as rec:
        y = ops.relu(ops.conv2d(x, w, None, stride=1, padding=1))
    g = rec.finish()
    del rec
    want = y.to_numpy().copy()
    x.copy_from_numpy(rng.standard_normal((2, 3, 6, 6)).astype(np.float32))
    g.run()
    assert not np.allclose(y.to_numpy(), want)
    np.testing.assert_allclose(y.to_numpy(), ops.relu(ops.conv2d(x, w, None, padding=1)).to_numpy(), rtol=1e-6)


def test_recorder_restores_the_device(dev):
    table = dev.table
    before = dict(table)
    with graph.Recorder(dev):
        assert table["add"] is not before["add"]
        assert dev.graph_enabled()
        dev.EnableGraph(False)  # layer.py pauses the recording while a layer creates its parameters
        assert not dev.graph_enabled()
        dev.EnableGraph(True)
    assert table == before
    assert dev.table is table
    for name in ("alloc", "read", "write", "write_strided", "copy_view", "graph_enabled", "EnableGraph"):
        assert name not in vars(dev)
    with pytest.raises(ZeroDivisionError), graph.Recorder(dev):
        raise ZeroDivisionError
    assert table == before
    assert "alloc" not in vars(dev)


def test_nested_recording_is_refused(dev):
    with graph.Recorder(dev), pytest.raises(RuntimeError, match="already being recorded"), graph.Recorder(dev):
        pass


def test_replay_allocates_nothing(dev):
    _, _, _, g = _train(dev, "seq")
    n = dev.pool.num_requests
    in_use = dev.pool.bytes_in_use
    g.run()
    assert dev.pool.num_requests == n
    assert dev.pool.bytes_in_use == in_use


# -- scheduling ----------------------------------------------------------------------------------------------------


def _random_calls(n: int, nbuf: int, seed: int):
    rng = random.Random(seed)
    calls = []
    for _ in range(n):
        reads = frozenset(rng.sample(range(nbuf), rng.randint(0, 3)))
        writes = frozenset(rng.sample(range(nbuf), rng.randint(1, 2)))
        calls.append(graph._Call("kernel", "k", None, [], {}, reads, writes, "forward"))
    return calls


@pytest.mark.parametrize("seed", range(5))
def test_schedule_respects_every_dependency(seed):
    calls = _random_calls(60, 12, seed)
    order = graph._schedule(calls, {k: 100 * (k + 1) for k in range(12)})
    pos = {c: i for i, c in enumerate(order)}
    assert sorted(order) == list(range(len(calls)))
    for i, a in enumerate(calls):
        for j in range(i + 1, len(calls)):
            b = calls[j]
            if (a.writes & (b.reads | b.writes)) or (a.reads & b.writes):
                assert pos[i] < pos[j], (i, j)


def test_schedule_frees_memory_early():
    # program order: two big producers first, then their consumers; the scheduler interleaves them
    big, small = 1000, 10
    K = graph._Call
    calls = [K("kernel", "p", None, [], {}, frozenset(), frozenset([0]), "f"),
             K("kernel", "p", None, [], {}, frozenset(), frozenset([1]), "f"),
             K("kernel", "c", None, [], {}, frozenset([0]), frozenset([2]), "f"),
             K("kernel", "c", None, [], {}, frozenset([1]), frozenset([3]), "f")]
    sizes = {0: big, 1: big, 2: small, 3: small}
    order = graph._schedule(calls, sizes)
    assert order == [0, 2, 1, 3]
    assert graph._live_peak(calls, order, sizes) < graph._live_peak(calls, [0, 1, 2, 3], sizes)


# -- memory planning -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_plan_never_overlaps_live_blocks(seed):
    rng = random.Random(seed)
    n = 80
    sizes = [rng.choice([8, 100, 4096, 70_000, 2_000_000]) for _ in range(n)]
    lives = []
    for _ in range(n):
        s = rng.randrange(50)
        lives.append((s, s + rng.randrange(10)))
    offsets, total = graph.plan_offsets(sizes, lives)
    for i in range(n):
        assert offsets[i] % graph._ALIGN == 0
        assert offsets[i] + sizes[i] <= total
        for j in range(i + 1, n):
            if lives[i][0] <= lives[j][1] and lives[j][0] <= lives[i][1]:
                assert offsets[i] + sizes[i] <= offsets[j] or offsets[j] + sizes[j] <= offsets[i]
    peak = max(sum(graph._align(s) for s, (a, b) in zip(sizes, lives) if a <= t <= b) for t in range(60))
    assert peak <= total < sum(graph._align(s) for s in sizes)
    blocks = graph.split_arena(offsets, sizes, total)
    assert blocks[0][0] == 0
    assert blocks[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    for off, size in zip(offsets, sizes):  # no block boundary inside a temporary
        assert any(s <= off and off + graph._align(size) <= e for s, e in blocks)
    assert sum(MemoryPool.size_class(e - s) for s, e in blocks) <= MemoryPool.size_class(total)


def test_pool_bytes_matches_memory_pool():
    n = np.array([1, 511, 512, 513, 1 << 20, (1 << 20) + 1, 3_000_000, 1 << 23, 9 << 20, (9 << 20) + 1], np.int64)
    assert graph._pool_bytes(n).tolist() == [MemoryPool.size_class(int(v)) for v in n]


def test_pool_size_classes_waste_at_most_an_eighth_above_1_mib():
    rng = np.random.default_rng(0)
    for n in [(1 << 20) + 1, 9 << 20, 3 << 28, *rng.integers(1 << 20, 1 << 32, 200).tolist()]:
        cls = MemoryPool.size_class(n)
        assert n <= cls <= n + n // 8, n
        assert MemoryPool.size_class(cls) == cls  # a class is its own class: freed blocks are found again
    assert MemoryPool.size_class(9 << 20) == 9 << 20  # a 512x512x3x3 float32 weight takes 9 MiB, not 16


def test_planned_arena_is_smaller_than_the_temporaries(dev):
    _, _, _, g = _train(dev, "dep")
    s = g.summary()
    assert s["temporaries"] > 5
    assert s["arena_bytes"] < s["temporary_bytes"]


def _record(dev, fn, *args):
    with graph.Recorder(dev) as rec:
        out = fn(*args)
    g = rec.finish()
    del rec
    return g, out


def test_element_wise_kernels_write_over_dying_inputs(dev):
    """relu(x * 2 + 1) on a (64, 64) input: each intermediate dies at the next kernel, which may take its bytes; the
    replay still equals numpy's float64 result."""
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((64, 64)).astype(np.float32) for _ in range(2)]
    x = tensor.from_numpy(xs[0], dev)
    g, y = _record(dev, lambda t: ops.relu(ops.add(ops.mul(t, 2.0), 1.0)), x)
    s = g.summary()
    assert s["temporaries"] == 2
    assert s["in_place"] == 1  # mul's output is the temporary add writes over
    assert s["arena_bytes"] == MemoryPool.size_class(64 * 64 * 4)  # one block holds both
    for a in xs:
        x.copy_from_numpy(a)
        g.run()
        np.testing.assert_allclose(y.to_numpy(), np.maximum(a.astype(np.float64) * 2 + 1, 0), rtol=1e-6)


def test_in_place_needs_the_same_view_and_a_dying_input(dev):
    """Writing over an input is only safe when the output selects exactly the input's bytes and nothing reads the
    input afterwards: a transposed read, a broadcast read or a later use each rule it out."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((32, 32)).astype(np.float32)
    x = tensor.from_numpy(a, dev)

    def transposed(t):
        u = ops.mul(t, 3.0)  # temporary, read below both as it is and transposed
        return ops.add(u, u.T())

    def reused(t):
        u = ops.mul(t, 3.0)
        v = ops.add(u, 1.0)
        return ops.sum(ops.mul(v, u), axis=1)  # u is still needed after the add: the add may not overwrite it

    for fn, ref in ((transposed, lambda a: 3 * a + 3 * a.T), (reused, lambda a: ((3 * a + 1) * 3 * a).sum(1))):
        g, y = _record(dev, fn, x)
        g.run()
        np.testing.assert_allclose(y.to_numpy(), ref(a.astype(np.float64)), rtol=1e-5, atol=1e-6)
    g, _ = _record(dev, transposed, x)
    assert g.summary()["in_place"] == 0
    g, _ = _record(dev, reused, x)
    assert g.summary()["in_place"] == 1  # only the last mul, where both u and v die, may write over one of them


def test_other_kernels_write_over_an_input_only_where_the_device_says_so(dev, monkeypatch):
    """conv2d_fused's output takes the bytes of a residual that dies at the call only where the device lists it in
    Device.shares_output_with, never when the residual is read later or is also the convolution's input; the replays
    equal a float64 numpy reference either way."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((2, 8, 6, 6)).astype(np.float32)
    wa = (rng.standard_normal((8, 8, 3, 3)) / 8).astype(np.float32)
    x, w = tensor.from_numpy(a, dev), tensor.from_numpy(wa, dev)

    def conv_ref(v):
        p = np.pad(v.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
        cols = np.stack([p[:, :, i:i + 6, j:j + 6] for i in range(3) for j in range(3)], axis=2)  # (N, C, 9, H, W)
        return np.einsum("nckhw,ock->nohw", cols, wa.astype(np.float64).reshape(8, 8, 9))

    def dying(t):  # the residual (a neg) is read by the convolution only
        return ops.neg(ops.conv2d(t, w, None, 1, 1, residual=ops.neg(t), activation="relu"))

    def read_later(t):  # the residual is also read after the convolution
        r = ops.neg(t)
        return ops.add(ops.conv2d(t, w, None, 1, 1, residual=r, activation="relu"), r)

    def also_the_input(t):  # the residual is the convolution's own input (same shape: 8 -> 8 channels, padding 1)
        r = ops.neg(t)
        return ops.neg(ops.conv2d(r, w, None, 1, 1, residual=r, activation="relu"))

    refs = {dying: lambda v: -np.maximum(conv_ref(v) - v, 0),
            read_later: lambda v: np.maximum(conv_ref(v) - v, 0) - v,
            also_the_input: lambda v: -np.maximum(conv_ref(-v) - v, 0)}
    shares = "conv2d_fused" in type(dev).shares_output_with
    for said in (True, False):
        if not said:
            monkeypatch.setattr(type(dev), "shares_output_with", {})
        for fn, ref in refs.items():
            g, y = _record(dev, fn, x)
            want = int(said and shares and fn is dying)
            assert g.summary()["in_place"] == want, (fn.__name__, said)
            for _ in range(2):
                v = rng.standard_normal(a.shape).astype(np.float32)
                x.copy_from_numpy(v)
                g.run()
                np.testing.assert_allclose(y.to_numpy(), ref(v), rtol=1e-4, atol=1e-4, err_msg=fn.__name__)


# -- time profiling --------------------------------------------------------------------------------------------------


def test_time_profiling_and_chrome_trace(dev, tmp_path, capsys):
    prof = profiling.profiler(dev)
    prof.reset()
    old = dev.verbosity
    dev.SetVerbosity(2)
    dev.SetSkipIteration(2)
    try:
        _, _, _, g = _train(dev, "seq")  # 4 replays: 2 skipped, 2 timed
    finally:
        dev.SetVerbosity(old)
    assert prof.iterations == 4
    assert prof.profiled == 2
    kernels = prof.by_kernel()
    assert kernels["matmul"]["count"] == 2 * sum(1 for c in g.calls if c.name == "matmul")
    assert all(r["total_ms"] > 0 for r in kernels.values())
    assert set(prof.by_phase()) >= {"update"}
    dev.PrintTimeProfiling()
    text = capsys.readouterr().out
    assert "2 graph iteration(s) timed" in text
    assert "matmul" in text
    assert "mean us" in text

    path = tmp_path / "trace.json"
    profiling.export_chrome_trace(dev, path)
    trace = json.loads(path.read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] != "M"]
    assert len(events) == 2 + 2 * len(g)  # an event per iteration and one per timed call
    for e in events:
        assert e["ph"] == "X"
        assert isinstance(e["name"], str)
        assert isinstance(e["ts"], (int, float))
        assert isinstance(e["dur"], (int, float))
        assert e["dur"] >= 0
        assert isinstance(e["pid"], int)
        assert isinstance(e["tid"], int)
    kernel_events = [e for e in events if e["tid"] == 1]
    assert {e["name"] for e in kernel_events} == {c.name for c in g.calls}
    its = [e for e in events if e["tid"] == 0]
    for a, b in zip(its, its[1:]):
        assert a["ts"] + a["dur"] <= b["ts"] + 1e-3  # µs, in order
    prof.reset()


def test_profiling_off_by_default(dev):
    prof = profiling.profiler(dev)
    prof.reset()
    assert dev.verbosity == 0
    _train(dev, "seq")
    assert prof.profiled == 0
    assert not prof.events
    assert "no graph iteration profiled" in prof.report()


def test_element_wise_calls_are_replayed_as_bound_launches(dev):
    """Element-wise kernels work out their launch once (kernel.bind): contiguous, broadcast and transposed operands
    replay as bound launches and compute what the eager step computed, with new input values."""
    import functools

    rng = np.random.default_rng(3)
    a = tensor.from_numpy(rng.standard_normal((4, 5, 6)).astype(np.float32), dev)
    b = tensor.from_numpy(rng.standard_normal((5, 1)).astype(np.float32), dev)
    with graph.Recorder(dev) as rec:
        y = ops.mul(ops.add(a, b), 3.0)  # broadcast add, then a contiguous scale
        z = ops.sub(ops.transpose(y, (2, 0, 1)), 1.0)  # a transposed operand
        w = ops.relu(z)
    g = rec.finish(sequential=True)
    assert any(isinstance(fn, functools.partial) for fn, _, _ in g._exec)
    for _ in range(2):
        an = rng.standard_normal((4, 5, 6)).astype(np.float32)
        bn = rng.standard_normal((5, 1)).astype(np.float32)
        a.copy_from_numpy(an)
        b.copy_from_numpy(bn)
        g.run()
        want = np.maximum(np.transpose((an + bn) * 3.0, (2, 0, 1)) - 1.0, 0.0)
        np.testing.assert_array_equal(tensor.to_numpy(w), want.astype(np.float32))


def test_the_recording_steps_cached_blocks_are_given_back_before_the_arena(dev):
    """Finishing a recording empties the pool's cache (the eager step's temporaries), so that the process does not
    hold them and the planned arena at once; the replay still computes the step."""
    rng = np.random.default_rng(5)
    x = tensor.from_numpy(rng.standard_normal((64, 256)).astype(np.float32), dev)
    w1, w2 = (tensor.from_numpy(rng.standard_normal((256, 256)).astype(np.float32), dev) for _ in range(2))
    dev.pool.empty_cache()
    with graph.Recorder(dev) as rec:
        a, b = ops.matmul(x, w1), ops.matmul(x, w2)  # alive together: three temporaries, two planned blocks
        y = ops.sum(ops.relu(ops.add(a, b)))
        del a, b
    assert dev.pool.bytes_cached > 0  # the step's temporaries went back to the cache
    g = rec.finish()
    assert dev.pool.bytes_cached == 0
    g.run()
    xn = x.to_numpy()
    np.testing.assert_allclose(tensor.to_numpy(y), np.sum(np.maximum(xn @ w1.to_numpy() + xn @ w2.to_numpy(), 0)),
                               rtol=1e-4)


def _names(g) -> list[str]:
    return [c.name for c in g.calls]


@pytest.mark.parametrize(("shape", "axis", "copies"), [
    ((1, 4, 4, 4), 1, 0),  # batch 1: each input's slice of the result is dense, so its maker writes there
    ((2, 4, 4, 4), 0, 0),  # slices along the first axis are dense at any batch
    ((2, 4, 4, 4), 1, 3),  # two images: a channel slice is not, the copies stay
    ((1, 3, 4, 5), 1, 2),  # slices starting 240 and 480 bytes in (not multiples of 64) keep their copies
])
def test_values_only_copied_into_a_concat_are_written_into_it(dev, shape, axis, copies):
    rng = np.random.default_rng(7)
    x = tensor.from_numpy(rng.standard_normal(shape).astype(np.float32), dev)
    with graph.Recorder(dev) as rec:
        y = ops.tanh(ops.concat([ops.relu(x), ops.mul(x, 2.0), ops.add(x, 1.0)], axis))
    g = rec.finish()
    del rec
    assert _names(g).count("copy") == copies
    for _ in range(2):
        xn = rng.standard_normal(shape)
        x.copy_from_numpy(xn.astype(np.float32))
        g.run()
        want = np.tanh(np.concatenate([np.maximum(xn, 0), xn * 2.0, xn + 1.0], axis))
        np.testing.assert_allclose(y.to_numpy(), want, rtol=1e-5, atol=1e-6)


def test_a_chain_of_copies_into_a_concat_collapses_onto_the_first_writer(dev):
    rng = np.random.default_rng(11)
    x = tensor.from_numpy(rng.standard_normal((1, 2, 4, 4)).astype(np.float32), dev)
    with graph.Recorder(dev) as rec:
        y = ops.concat([ops.copy(ops.copy(ops.relu(x))), ops.exp(x)], 1)
    g = rec.finish()
    del rec
    assert _names(g) == ["relu", "exp"]
    xn = rng.standard_normal((1, 2, 4, 4))
    x.copy_from_numpy(xn.astype(np.float32))
    g.run()
    np.testing.assert_allclose(y.to_numpy(), np.concatenate([np.maximum(xn, 0), np.exp(xn)], 1), rtol=1e-6)


def test_a_value_read_elsewhere_or_a_result_read_before_the_copy_keeps_the_copy(dev):
    """Only a value nothing else reads is made in place; a read of the result before the copy must see what was
    there before (the slice written early would change it)."""
    from singa.backend import View

    rng = np.random.default_rng(8)
    x = tensor.from_numpy(rng.standard_normal((1, 2, 4, 4)).astype(np.float32), dev)
    with graph.Recorder(dev) as rec:
        copy = dev.table["copy"]  # the recorder's hook (entries are replaced while it records)
        a = ops.relu(x)
        b = ops.exp(x)
        side = ops.mul(a, 3.0)  # a second reader of a: a keeps its own buffer
        r = ops.full((1, 4, 4, 4), 0.5, tensor.float32, dev)
        before = ops.sum(r)  # reads r while b's slice still holds 0.5
        copy(View(r.buffer, r.dtype, a.shape, r.strides, 0), a)
        copy(View(r.buffer, r.dtype, b.shape, r.strides, 2 * r.strides[1]), b)
        del a, b
    g = rec.finish()
    del rec
    assert _names(g).count("copy") == 2
    xn = rng.standard_normal((1, 2, 4, 4))
    x.copy_from_numpy(xn.astype(np.float32))
    g.run()
    np.testing.assert_allclose(before.to_numpy(), 0.5 * 64, rtol=1e-6)
    np.testing.assert_allclose(r.to_numpy(), np.concatenate([np.maximum(xn, 0), np.exp(xn)], 1), rtol=1e-5)
    np.testing.assert_allclose(side.to_numpy(), np.maximum(xn, 0) * 3.0, rtol=1e-6)


def test_kernels_whose_outputs_nothing_reads_are_not_replayed(dev):
    rng = np.random.default_rng(9)
    x = tensor.from_numpy(rng.standard_normal((3, 4)).astype(np.float32), dev)

    def step():
        unused = ops.exp(ops.mul(x, 2.0))  # a chain that leads nowhere
        noise = ops.random_uniform(ops.empty((3, 4), tensor.float32, dev))  # unread, but it moves the generator
        del unused, noise
        return ops.relu(x)

    with graph.Recorder(dev) as rec:
        y = step()
    g = rec.finish()
    del rec
    names = _names(g)
    assert "exp" not in names
    assert "mul_scalar" not in names
    assert "relu" in names
    assert any(n.startswith("random_") for n in names)
    xn = rng.standard_normal((3, 4))
    x.copy_from_numpy(xn.astype(np.float32))
    g.run()
    np.testing.assert_allclose(y.to_numpy(), np.maximum(xn, 0), rtol=1e-6)


def test_a_kernel_that_reads_the_result_keeps_its_own_output(dev):
    """r = r @ w through a copy: the product cannot be written over the r it reads."""
    from singa.backend import View

    rng = np.random.default_rng(10)
    x, w = (tensor.from_numpy(rng.standard_normal((4, 4)).astype(np.float32), dev) for _ in range(2))
    with graph.Recorder(dev) as rec:
        copy = dev.table["copy"]
        r = ops.add(x, 0.0)
        t = ops.matmul(r, w)
        copy(View(r.buffer, r.dtype, r.shape, r.strides, 0), t)
        del t
    g = rec.finish()
    del rec
    assert _names(g).count("copy") == 1
    xn = rng.standard_normal((4, 4))
    x.copy_from_numpy(xn.astype(np.float32))
    g.run()
    np.testing.assert_allclose(r.to_numpy(), xn @ w.to_numpy(), rtol=1e-5, atol=1e-5)
