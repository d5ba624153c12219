"""oneDNN as the CPU backend's provider of float32 convolutions and matrix products: it loads where its wheel is a
dependency, the setting is obeyed and validated, the per-shape choice is made once, results match a float64 reference
on layer shapes of real networks, and threads each get their own plans.

(test_cpu_kernels.py runs every convolution case on both providers.)
"""

from __future__ import annotations

import platform
import sys
import threading

import numpy as np
import pytest

from singa import autograd, device, dtypes, tensor
from singa_backend_cpu import onednn

X86_LINUX = platform.machine() == "x86_64" and sys.platform.startswith("linux")
DEV = device.get_device("cpu")
RNG = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv(onednn.SETTING, raising=False)
    onednn.reset()
    yield
    onednn.reset()


def test_loads_where_its_wheel_is_a_dependency():
    lib = onednn.library()
    if not X86_LINUX:
        # no wheel for this platform: the backend's own kernels do all the work, and info says so
        assert lib is None
        assert onednn.status().startswith("not used")
        return
    assert lib is not None, onednn.status()
    assert lib.version[0] == 3
    assert onednn.status().startswith("oneDNN 3.")


def test_info_reports_it():
    from singa import plugins

    info = plugins.registry().backends["cpu"].info()
    assert "onednn" in info
    assert "oneDNN" in info["onednn"] or "not used" in info["onednn"]


def test_an_unknown_setting_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv(onednn.SETTING, "fast")
    with pytest.raises(ValueError, match="SINGA_ONEDNN"):
        onednn.mode()


def conv_ref(x, w, b, stride, pad, groups):
    """float64 NCHW convolution by unfolding (padding symmetric)."""
    n, c, h, wd = x.shape
    k, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - kh) // stride + 1
    ow = (wd + 2 * pad - kw) // stride + 1
    y = np.zeros((n, k, oh, ow))
    kg = k // groups
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                rows = slice(i, i + stride * (oh - 1) + 1, stride)
                cols = slice(j, j + stride * (ow - 1) + 1, stride)
                patch = xp[:, g * cg:(g + 1) * cg, rows, cols]
                y[:, g * kg:(g + 1) * kg] += np.einsum("nchw,kc->nkhw", patch, w[g * kg:(g + 1) * kg, :, i, j])
    return y + b.reshape(1, -1, 1, 1)


def layer_operands(layer):
    """x, w, b, a residual of the output's shape and the float64 reference conv(x, w, b) for a LAYERS entry."""
    n, c, h, k, kk, stride, pad, groups = layer
    x = RNG.standard_normal((n, c, h, h)).astype(np.float32)
    w = (RNG.standard_normal((k, c // groups, kk, kk)) / np.sqrt(c // groups * kk * kk)).astype(np.float32)
    b = RNG.standard_normal(k).astype(np.float32)
    ref = conv_ref(x, w, b, stride, pad, groups)
    return x, w, b, RNG.standard_normal(ref.shape).astype(np.float32), ref


def check_fused_calls(layer):
    """conv2d with bias, then conv2d_fused with a residual and/or ReLU twice over (the second time on the plans and
    on the reordered weights kept while they are declared constant), each against float64."""
    from singa import backend, ops

    x, w, b, r, ref = layer_operands(layer)
    stride, pad, groups = layer[5:]
    tx, tw, tb, tr = (tensor.from_numpy(a, DEV) for a in (x, w, b, r))
    y = ops.conv2d(tx, tw, tb, stride, pad, 1, groups)
    np.testing.assert_allclose(tensor.to_numpy(y), ref, rtol=1e-4, atol=1e-4)
    backend.declare_constant([tw.buffer])
    try:
        for _ in range(2):
            for residual, activation in ((tr, "relu"), (tr, "none"), (None, "relu")):
                y = ops.conv2d(tx, tw, tb, stride, pad, 1, groups, residual=residual, activation=activation)
                want = ref + (r if residual is not None else 0)
                want = np.maximum(want, 0) if activation == "relu" else want
                np.testing.assert_allclose(tensor.to_numpy(y), want, rtol=1e-4, atol=1e-4)
    finally:
        backend.release_constant([tw.buffer])


# ResNet, VGG and MobileNet layer shapes (batch kept small): (N, C, H, K, k, stride, pad, groups)
LAYERS = [
    (4, 3, 32, 64, 3, 1, 1, 1),     # first layer, three channels
    (4, 64, 16, 64, 3, 1, 1, 1),    # ResNet basic block
    (4, 64, 16, 128, 3, 2, 1, 1),   # ResNet down-sampling
    (4, 64, 16, 128, 1, 2, 0, 1),   # ResNet shortcut
    (2, 128, 14, 256, 3, 1, 1, 1),  # VGG
    (4, 32, 16, 32, 3, 1, 1, 32),   # MobileNet depthwise
    (4, 32, 16, 64, 1, 1, 0, 1),    # MobileNet pointwise
]


@pytest.mark.parametrize("layer", LAYERS, ids=[f"{c}-{k}x{kk}-s{s}-g{g}" for _, c, _, k, kk, s, _, g in LAYERS])
def test_layer_shapes_match_float64_forward_and_gradients(layer, monkeypatch):
    monkeypatch.setenv(onednn.SETTING, "1")
    n, c, h, k, kk, stride, pad, groups = layer
    x = RNG.standard_normal((n, c, h, h)).astype(np.float32)
    w = (RNG.standard_normal((k, c // groups, kk, kk)) / np.sqrt(c // groups * kk * kk)).astype(np.float32)
    b = RNG.standard_normal(k).astype(np.float32)
    tx, tw, tb = (tensor.from_numpy(a, DEV) for a in (x, w, b))
    for t in (tx, tw, tb):
        t.requires_grad = True
        t.stores_grad = True
    autograd.training = True
    y = autograd.conv2d(tx, tw, tb, stride=(stride, stride), padding=(pad, pad, pad, pad), group=groups)
    ref = conv_ref(x, w, b, stride, pad, groups)
    np.testing.assert_allclose(tensor.to_numpy(y), ref, rtol=1e-4, atol=1e-4)
    dy = RNG.standard_normal(ref.shape).astype(np.float32)
    grads = dict(autograd.backward(y, tensor.from_numpy(dy, DEV)))
    # gradients by the adjoint: <dy, conv(x', w)> is linear in x' and w, checked through two directional derivatives
    dx = tensor.to_numpy(grads[tx])
    dw = tensor.to_numpy(grads[tw])
    vx = RNG.standard_normal(x.shape)
    vw = RNG.standard_normal(w.shape)
    zero = np.zeros_like(b)
    lhs_x = np.sum(dy * conv_ref(vx, w, zero, stride, pad, groups))
    lhs_w = np.sum(dy * conv_ref(x, vw, zero, stride, pad, groups))
    np.testing.assert_allclose(np.sum(dx * vx), lhs_x, rtol=1e-4)
    np.testing.assert_allclose(np.sum(dw * vw), lhs_w, rtol=1e-4)
    if X86_LINUX:
        assert onednn.choices()
        assert onednn.OWN not in onednn.choices().values(), onednn.choices()


@pytest.mark.parametrize("setting", ["1", "nchw", "0", "auto"])
@pytest.mark.parametrize("layer", LAYERS[1:4] + LAYERS[6:], ids=["block", "down", "shortcut", "pointwise"])
def test_fused_residual_and_relu_match_float64_on_every_provider(layer, setting, monkeypatch):
    # conv2d_fused: oneDNN's sum and ReLU post-ops in the blocked layout, the add and relu kernels after oneDNN's NCHW
    # kernels and after our own; also with the weights declared constant (their reordered copy kept)
    monkeypatch.setenv(onednn.SETTING, setting)
    check_fused_calls(layer)
    if X86_LINUX and setting in ("1", "nchw"):
        fused = {v for key, v in onednn.choices().items() if key[0] == "conv2d_fused"}
        assert fused == {onednn.BLOCKED if setting == "1" else onednn.PLAIN}, onednn.choices()


# batch-1 layers where oneDNN 3.2 has brgemm-based forward kernels on NHWC (dense 3x3 and 1x1, depthwise: brdgmm)
NHWC_LAYERS = [(1, 64, 14, 64, 3, 1, 1, 1), (1, 32, 15, 64, 3, 2, 1, 1), (1, 64, 8, 128, 1, 1, 0, 1),
               (1, 48, 9, 48, 3, 1, 1, 48)]


@pytest.mark.skipif(not X86_LINUX, reason="oneDNN's wheel is x86-64 Linux only")
@pytest.mark.parametrize("layer", NHWC_LAYERS, ids=[f"{c}-{k}x{kk}-s{s}-g{g}" for _, c, _, k, kk, s, _, g in
                                                   NHWC_LAYERS])
def test_channels_last_forward_plans_match_float64(layer, monkeypatch):
    # the blocked provider's forward on NCHW operands, run channels last (reordered to NHWC for oneDNN's brgemm
    # kernels): bias, residual and ReLU post-ops, and constant weights whose reordered copy is kept
    monkeypatch.setenv(onednn.SETTING, "1")  # the blocked provider, whatever the timings
    chosen = []

    def channels_last(plan):
        chosen.append(plan(True))
        return True, chosen[-1]

    monkeypatch.setattr(onednn, "_choose_channels_last", channels_last)
    check_fused_calls(layer)
    assert chosen
    assert all(p.impl.startswith(("brg", "brdgmm")) for p in chosen), [p.impl for p in chosen]
    assert set(onednn.choices().values()) == {onednn.BLOCKED}


def test_channels_last_is_chosen_only_by_measurement_under_auto(monkeypatch):
    # SINGA_ONEDNN=1 promises the same kernels every run: no timing, never NHWC; auto times both plans once per shape
    x, w, b, r, ref = layer_operands(NHWC_LAYERS[0])
    tx, tw, tb = (tensor.from_numpy(a, DEV) for a in (x, w, b))
    from singa import ops

    monkeypatch.setenv(onednn.SETTING, "1")
    np.testing.assert_allclose(tensor.to_numpy(ops.conv2d(tx, tw, tb, 1, 1)), ref, rtol=1e-4, atol=1e-4)
    if X86_LINUX:
        assert set(onednn._channels_last.values()) == {False}
    onednn.reset()
    monkeypatch.setenv(onednn.SETTING, "auto")
    measured = []
    real = onednn._choose_channels_last
    monkeypatch.setattr(onednn, "_choose_channels_last", lambda plan: measured.append(1) or real(plan))
    for _ in range(3):
        np.testing.assert_allclose(tensor.to_numpy(ops.conv2d(tx, tw, tb, 1, 1)), ref, rtol=1e-4, atol=1e-4)
    if X86_LINUX:
        assert len(measured) == 1
        assert len(onednn._channels_last) == 1


def test_auto_decides_once_per_shape_and_keeps_the_result_right(monkeypatch):
    from singa_backend_cpu.table import kernels as K

    x = RNG.standard_normal((2, 8, 12, 12)).astype(np.float32)
    w = RNG.standard_normal((16, 8, 3, 3)).astype(np.float32)
    ref = conv_ref(x, w, np.zeros(16), 1, 1, 1)
    tx, tw = tensor.from_numpy(x, DEV), tensor.from_numpy(w, DEV)
    for _ in range(3):
        y = tensor.Tensor((2, 16, 12, 12), DEV)
        K["conv2d"](y.data, tx.data, tw.data, None, stride=(1, 1), padding=(1, 1, 1, 1))
        np.testing.assert_allclose(tensor.to_numpy(y), ref, rtol=1e-4, atol=1e-4)
    assert len(onednn.choices()) == 1  # one shape, one decision


@pytest.mark.skipif(not X86_LINUX, reason="oneDNN's wheel is for x86-64 Linux only")
@pytest.mark.parametrize("constant", [True, False], ids=["constant-weights", "weights"])
def test_auto_times_onednn_reordering_constant_weights_once_as_in_use(constant, monkeypatch):
    # declared-constant weights are reordered once and kept in use, so the timing that weighs oneDNN against our
    # kernel (which needs no reorder) reorders them once too; other weights are reordered at every call, and timed so
    from singa.backend import declare_constant
    from singa_backend_cpu.table import kernels as K

    seen = []
    run = onednn._Plan.run

    def spy(self, addresses, thread, const=None, pointers=None, kept_at=None):
        seen.append(kept_at)
        return run(self, addresses, thread, const, pointers, kept_at)

    monkeypatch.setattr(onednn._Plan, "run", spy)
    monkeypatch.setenv(onednn.SETTING, "auto")
    x = RNG.standard_normal((1, 8, 10, 10)).astype(np.float32)
    w = RNG.standard_normal((16, 8, 3, 3)).astype(np.float32)
    tx, tw = tensor.from_numpy(x, DEV), tensor.from_numpy(w, DEV)
    if constant:
        declare_constant([tw.buffer])
    y = tensor.Tensor((1, 16, 10, 10), DEV)
    K["conv2d"](y.data, tx.data, tw.data, None, stride=(1, 1), padding=(1, 1, 1, 1))
    np.testing.assert_allclose(tensor.to_numpy(y), conv_ref(x, w, np.zeros(16), 1, 1, 1), rtol=1e-4, atol=1e-4)
    assert len(seen) >= 4  # the decision's turns: two plans, several runs each
    if constant:
        kept = [k for k in seen if k is not None]  # plans that reorder the weights (an NCHW plan may not)
        firsts = {}
        for at, filled in kept:
            firsts.setdefault(at, filled)
        assert firsts  # a kept copy per such plan ...
        assert not any(firsts.values())  # ... filled by its first run
        assert sum(1 for _, filled in kept if not filled) == len(firsts)  # and reused by the others
    else:
        assert seen == [None] * len(seen)


def test_off_means_the_backends_own_kernels(monkeypatch):
    monkeypatch.setenv(onednn.SETTING, "0")
    w = tensor.from_numpy(RNG.standard_normal((8, 4, 3, 3)).astype(np.float32), DEV)
    x = tensor.from_numpy(RNG.standard_normal((2, 4, 8, 8)).astype(np.float32), DEV)
    y = autograd.conv2d(x, w, padding=(1, 1, 1, 1))
    assert y.shape == (2, 8, 8, 8)
    assert onednn.choices()
    assert set(onednn.choices().values()) == {onednn.OWN}


@pytest.mark.parametrize("setting", ["1", "auto"])
def test_threads_get_the_sequential_results_bit_for_bit(setting, monkeypatch):
    monkeypatch.setenv(onednn.SETTING, setting)
    xs = [RNG.standard_normal((2, 16, 10, 10)).astype(np.float32) for _ in range(4)]
    w = RNG.standard_normal((32, 16, 3, 3)).astype(np.float32)

    tw = tensor.from_numpy(w, DEV)

    def run(x):
        return tensor.to_numpy(autograd.conv2d(tensor.from_numpy(x, DEV), tw, padding=(1, 1, 1, 1)))

    sequential = [run(x) for x in xs]
    results: list = [None] * len(xs)
    errors: list = []

    def worker(i):
        try:
            for _ in range(5):
                results[i] = run(xs[i])
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for got, want in zip(results, sequential):
        np.testing.assert_array_equal(got, want)


def test_threads_meeting_a_new_shape_together_all_get_right_results(monkeypatch):
    """In auto mode the first thread to meet a shape measures both providers while the others wait for its choice;
    every thread's output is written either way."""
    x = RNG.standard_normal((2, 12, 9, 9)).astype(np.float32)
    w = RNG.standard_normal((24, 12, 3, 3)).astype(np.float32)
    ref = conv_ref(x, w, np.zeros(24), 1, 1, 1)
    tw = tensor.from_numpy(w, DEV)
    barrier = threading.Barrier(4)
    results: list = [None] * 4
    errors: list = []

    def worker(i):
        try:
            tx = tensor.from_numpy(x, DEV)
            barrier.wait()
            results[i] = tensor.to_numpy(autograd.conv2d(tx, tw, padding=(1, 1, 1, 1)))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for got in results:
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_one_openmp_runtime_in_the_process(monkeypatch):
    """oneDNN and the backend's kernels share one GNU OpenMP (a second would keep its own idle threads spinning)."""
    monkeypatch.setenv(onednn.SETTING, "1")
    x = tensor.from_numpy(RNG.standard_normal((1, 4, 6, 6)).astype(np.float32), DEV)
    w = tensor.from_numpy(RNG.standard_normal((4, 4, 3, 3)).astype(np.float32), DEV)
    tensor.to_numpy(autograd.conv2d(x, w, padding=(1, 1, 1, 1)))
    with open("/proc/self/maps") as f:
        runtimes = {line.split()[-1] for line in f if "gomp" in line.rsplit("/", 1)[-1] and "/" in line}
    assert len(runtimes) == 1, runtimes


def test_a_new_thread_count_gets_its_own_plan(monkeypatch):
    import singa_backend_cpu

    monkeypatch.setenv(onednn.SETTING, "1")
    x = RNG.standard_normal((2, 8, 10, 10)).astype(np.float32)
    w = RNG.standard_normal((16, 8, 3, 3)).astype(np.float32)
    ref = conv_ref(x, w, np.zeros(16), 1, 1, 1)
    tx, tw = tensor.from_numpy(x, DEV), tensor.from_numpy(w, DEV)
    before = singa_backend_cpu.get_num_threads()
    try:
        for n in (1, 2, 1):
            singa_backend_cpu.set_num_threads(n)
            y = tensor.to_numpy(autograd.conv2d(tx, tw, padding=(1, 1, 1, 1)))
            np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-3)
        assert {k[2] for k in onednn._thread.plans} == {1, 2}
    finally:
        singa_backend_cpu.set_num_threads(before)


def test_a_failing_onednn_call_names_the_kernel_and_its_operands(monkeypatch):
    monkeypatch.setenv(onednn.SETTING, "1")
    x = tensor.from_numpy(RNG.standard_normal((1, 4, 6, 6)).astype(np.float32), DEV)
    w = tensor.from_numpy(RNG.standard_normal((4, 4, 3, 3)).astype(np.float32), DEV)
    autograd.conv2d(x, w, padding=(1, 1, 1, 1))  # plans made

    def fail(self, *args, **kwargs):
        self.lib.check(5, "dnnl_primitive_execute", self.what)

    monkeypatch.setattr(onednn._Plan, "run", fail)
    with pytest.raises(onednn.OneDnnError, match=r"cpu kernel conv2d\(float32\[1, 4, 6, 6\].*runtime error"):
        autograd.conv2d(x, w, padding=(1, 1, 1, 1))

    def out_of_memory(self, *args, **kwargs):
        self.lib.check(1, "dnnl_primitive_execute", self.what)

    monkeypatch.setattr(onednn._Plan, "run", out_of_memory)
    with pytest.raises(MemoryError, match="cpu kernel conv2d"):
        autograd.conv2d(x, w, padding=(1, 1, 1, 1))


def test_a_new_python_thread_runs_onednn_with_the_backends_thread_count(monkeypatch):
    """set_num_threads applies to every thread: a new Python thread's OpenMP setting comes from the environment, and
    oneDNN's weight gradient sums per thread, so a thread on another count would compute other bits."""
    import os

    import singa_backend_cpu
    from singa import ops

    monkeypatch.setenv(onednn.SETTING, "1")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: every thread count is 1")
    x = ops.from_numpy(RNG.standard_normal((64, 16, 12, 12)).astype(np.float32), DEV)
    dy = ops.from_numpy(RNG.standard_normal((64, 32, 12, 12)).astype(np.float32), DEV)
    before = singa_backend_cpu.get_num_threads()
    try:
        singa_backend_cpu.set_num_threads(1)
        want = ops.to_numpy(ops.conv2d_backward_weight(dy, x, (32, 16, 3, 3), padding=1))
        got = []
        t = threading.Thread(target=lambda: got.append(
            ops.to_numpy(ops.conv2d_backward_weight(dy, x, (32, 16, 3, 3), padding=1))))
        t.start()
        t.join()
    finally:
        singa_backend_cpu.set_num_threads(before)
    np.testing.assert_array_equal(got[0], want)


# -- matrix products ------------------------------------------------------------------------------------------------

MATMUL_CASES = [  # (a shape, b shape, transpose a, transpose b)
    ((64, 784), (784, 256), False, False),  # a fully connected layer's forward
    ((64, 256), (256, 256), False, True),  # its data gradient
    ((784, 64), (64, 256), True, False),  # its weight gradient
    ((1, 700), (700, 300), False, False),  # one row: a matrix-vector product
    ((300, 700), (700, 1), False, False),  # one column
    ((8, 33, 17), (17, 29), False, False),  # a stack times one matrix
    ((12, 40, 24), (12, 24, 40), False, False),  # many small products (split over the threads, one each)
    ((3, 5, 7), (1, 7, 4), True, True),  # broadcast batch, both transposed
]


@pytest.mark.parametrize(("a_shape", "b_shape", "ta", "tb"), MATMUL_CASES)
@pytest.mark.parametrize("setting", ["auto", "0"])
def test_matmul_matches_float64_on_either_provider(a_shape, b_shape, ta, tb, setting):
    """Both providers (oneDNN's sgemm, OpenBLAS split over the threads) against numpy in float64, with alpha and beta;
    the provider is chosen when the backend is imported, so each runs in its own process."""
    import subprocess
    import textwrap

    code = textwrap.dedent(f"""
        import numpy as np
        from singa import device, ops
        from singa_backend_cpu import table
        dev = device.get_device("cpu")
        rng = np.random.default_rng(3)
        a = rng.standard_normal({a_shape}).astype(np.float32)
        b = rng.standard_normal({b_shape}).astype(np.float32)
        c = rng.standard_normal(np.matmul(a, b).shape).astype(np.float32)
        ta, tb = ops.from_numpy(a, dev), ops.from_numpy(b, dev)
        # a transposed operand is a view of the transposed array, as autograd's gradients take it
        if {ta}:
            ta = ops.swapaxes(ops.from_numpy(np.ascontiguousarray(np.swapaxes(a, -1, -2)), dev), -1, -2)
        if {tb}:
            tb = ops.swapaxes(ops.from_numpy(np.ascontiguousarray(np.swapaxes(b, -1, -2)), dev), -1, -2)
        out = ops.from_numpy(c, dev)
        ops.matmul(ta, tb, out=out, alpha=0.5, beta=2.0)
        want = 0.5 * np.matmul(a.astype(np.float64), b.astype(np.float64)) + 2.0 * c
        got = ops.to_numpy(out)
        scale = np.abs(want).max()
        print(table.SGEMM, float(np.abs(got - want).max() / scale))
    """)
    env = {**__import__("os").environ, onednn.SETTING: setting}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    provider, err = res.stdout.split()
    assert provider == ("onednn" if setting == "auto" and X86_LINUX else "openblas")
    assert float(err) < 2e-6


class _MatmulSpy:
    """The kernel library with sg_matmul's last argument (1: OpenBLAS) recorded at each call."""

    def __init__(self, lib):
        self._lib, self.openblas = lib, []

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def sg_matmul(self, *args):
        self.openblas.append(args[-1])
        return self._lib.sg_matmul(*args)


@pytest.mark.parametrize("openblas_faster", [True, False])
def test_float32_products_take_openblas_per_shape_where_it_measured_faster(openblas_faster, monkeypatch):
    # the first call of a shape times oneDNN's sgemm (0) against OpenBLAS (1) and keeps the clearly faster one for
    # the later calls and a replayed graph's launch; either way the product matches float64
    from singa import graph, ops
    from singa_backend_cpu import table

    if table.SGEMM != "onednn":
        pytest.skip("oneDNN's sgemm is not installed")
    monkeypatch.setenv(onednn.SETTING, "auto")
    onednn.reset()
    spy = _MatmulSpy(table.lib)
    monkeypatch.setattr(table, "lib", spy)
    monkeypatch.setattr(onednn, "_timed_in_turns", lambda runs: {k: (run(), 1.0 if k != openblas_faster else 0.5)[1]
                                                                  for k, run in runs.items()})
    a = RNG.standard_normal((2, 96, 80)).astype(np.float32)
    b = RNG.standard_normal((80, 200)).astype(np.float32)
    ta, tb = ops.from_numpy(a, DEV), ops.from_numpy(b, DEV)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(ops.to_numpy(ops.matmul(ta, tb)), want, rtol=1e-5, atol=1e-4)
    assert spy.openblas == [0, 1, int(openblas_faster)]  # timed once each, then the chosen one ran
    assert onednn._products == {(1, 1, 1, 192, 200, 80, False, False): openblas_faster}  # one taller product
    spy.openblas.clear()
    with graph.Recorder(DEV) as rec:
        y = ops.matmul(ta, tb)
    g = rec.finish()
    a2 = RNG.standard_normal(a.shape).astype(np.float32)
    ta.copy_from_numpy(a2)
    g.run()
    np.testing.assert_allclose(ops.to_numpy(y), np.matmul(a2.astype(np.float64), b), rtol=1e-5, atol=1e-4)
    assert set(spy.openblas) == {int(openblas_faster)}  # the replay ran the chosen provider
    onednn.reset()


def test_small_accumulating_and_promised_products_are_not_timed(monkeypatch):
    # below PRODUCT_CHOICE_FLOPS, with beta != 0 (a second run would add twice) or under SINGA_ONEDNN=1 (oneDNN's
    # kernels promised) oneDNN's sgemm runs without a measurement
    from singa import ops
    from singa_backend_cpu import table

    if table.SGEMM != "onednn":
        pytest.skip("oneDNN's sgemm is not installed")
    timed = []
    monkeypatch.setattr(onednn, "_timed_in_turns", lambda runs: timed.append(runs) or {False: 1.0, True: 0.1})
    onednn.reset()
    small = ops.from_numpy(RNG.standard_normal((16, 16)).astype(np.float32), DEV)
    ops.matmul(small, small)
    big = ops.from_numpy(RNG.standard_normal((128, 128)).astype(np.float32), DEV)
    out = ops.from_numpy(np.ones((128, 128), np.float32), DEV)
    ops.matmul(big, big, out=out, beta=1.0)
    monkeypatch.setenv(onednn.SETTING, "1")
    ops.matmul(big, big)
    assert timed == []
    assert onednn._products == {(1, 1, 1, 128, 128, 128, False, False): False}
    onednn.reset()


def test_matmul_in_a_new_python_thread_gets_the_sequential_bits():
    """oneDNN's sgemm sizes its team from the calling thread's OpenMP setting: the backend sets it to its own count in
    every thread, so a worker thread computes the main thread's bits."""
    import os

    import singa_backend_cpu
    from singa import ops

    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: every thread count is 1")
    a = ops.from_numpy(RNG.standard_normal((256, 2048)).astype(np.float32), DEV)
    b = ops.from_numpy(RNG.standard_normal((2048, 256)).astype(np.float32), DEV)
    before = singa_backend_cpu.get_num_threads()
    try:
        for n in (1, 2):
            singa_backend_cpu.set_num_threads(n)
            want = ops.to_numpy(ops.matmul(a, b))
            got: list = []
            t = threading.Thread(target=lambda out=got: out.append(ops.to_numpy(ops.matmul(a, b))))
            t.start()
            t.join()
            np.testing.assert_array_equal(got[0], want)
    finally:
        singa_backend_cpu.set_num_threads(before)


def to_blocks(a, block):
    """NCHW -> the channel-blocked layout (N, C/B, H, W, B), flattened back into NCHW's shape (as the tensors hold
    it)."""
    n, c, h, w = a.shape
    return np.ascontiguousarray(a.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2)).reshape(a.shape)


def from_blocks(a, block):
    n, c, h, w = a.shape
    return np.ascontiguousarray(a.reshape(n, c // block, h, w, block).transpose(0, 1, 4, 2, 3)).reshape(a.shape)


# (N, C, H, K, k, stride, pad, groups): plain, 1x1, strided, depthwise, and groups of 24 channels (which oneDNN runs
# only through reorders: its blocked kernels would be its reference code)
BLOCKED_LAYERS = [(2, 32, 9, 48, 3, 1, 1, 1), (1, 64, 7, 32, 1, 1, 0, 1), (3, 16, 8, 64, 3, 2, 1, 1),
                  (2, 32, 8, 32, 3, 1, 1, 32), (1, 48, 6, 96, 1, 1, 0, 2)]


@pytest.mark.parametrize("own", [False, True], ids=["onednn", "converted"])
@pytest.mark.parametrize("layer", BLOCKED_LAYERS, ids=[f"{c}-{k}x{kk}-s{s}-g{g}" for _, c, _, k, kk, s, _, g in
                                                      BLOCKED_LAYERS])
def test_channel_blocked_operands_match_float64(layer, own, monkeypatch):
    # conv2d_fused(blocks=...): x, and out with the residual, in channel blocks of the device's size; oneDNN runs them
    # where they lie, or (own: oneDNN declining) the kernel converts them around the NCHW path
    from singa import ops

    block = DEV.channel_block
    if not X86_LINUX:
        assert block == 0  # no oneDNN: nothing is blocked, and the keyword is never passed
        return
    assert block in (8, 16)
    if own:
        monkeypatch.setattr(onednn, "conv_blocked", lambda *a, **k: False)
    x, w, b, r, ref = layer_operands(layer)
    stride, pad, groups = layer[5:]
    for blocks in ((block, block), (0, block), (block, 0)):
        for residual in (None, r):
            xs = to_blocks(x, block) if blocks[0] else x
            rs = None if residual is None else tensor.from_numpy(to_blocks(r, block) if blocks[1] else r, DEV)
            y = ops.conv2d(tensor.from_numpy(xs, DEV), tensor.from_numpy(w, DEV), tensor.from_numpy(b, DEV), stride,
                           pad, 1, groups, residual=rs, activation="relu", blocks=blocks)
            got = tensor.to_numpy(y)
            got = from_blocks(got, block) if blocks[1] else got
            want = np.maximum(ref + (0 if residual is None else r), 0)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"blocks {blocks}")


def test_blocks_the_device_does_not_have_are_refused():
    from singa import ops

    x, w = tensor.from_numpy(np.zeros((1, 20, 4, 4), np.float32), DEV), tensor.from_numpy(
        np.zeros((16, 20, 1, 1), np.float32), DEV)
    with pytest.raises(ValueError, match="channel block"):
        ops.conv2d(x, w, blocks=(24, 0))
    if DEV.channel_block:
        with pytest.raises(ValueError, match="dividing the channels"):
            ops.conv2d(x, w, blocks=(DEV.channel_block, 0))  # 20 channels are not whole blocks of 8 or 16


def test_nchw_average_pooling_stays_ours_where_onednn_has_no_jit_kernel_for_it():
    # oneDNN's NCHW averages are JIT code with AVX-512 only; with AVX2 its pick is a plain C loop (simple_nchw) at 8x
    # our kernel's time, so only a JIT plan may be kept; either way the result is the window mean
    from singa import ops

    if not onednn.in_use():
        pytest.skip("oneDNN is not in use")
    onednn.reset()
    x = RNG.standard_normal((1, 48, 14, 14)).astype(np.float32)
    y = tensor.to_numpy(ops.pool2d(tensor.from_numpy(x, DEV), 3, 1, 1, mode="avg"))
    want = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = sum(want[:, :, i:i + 14, j:j + 14] for i in range(3) for j in range(3)) / 9
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    kept = [plan.impl for (key, _), plan in onednn._thread.plans.items() if key[0] == "pool2d" and key[3] == 0]
    assert all(impl.startswith("jit") for impl in kept), kept


# (N, C, H, W, kernel, stride, padding (t, l, b, r), dilation, ceil_mode)
BLOCKED_POOLS = [(2, 32, 8, 8, (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), True),  # ceil mode: the last windows clipped
                 (1, 16, 8, 7, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), False),
                 (1, 32, 7, 7, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), False),
                 (2, 16, 9, 10, (3, 2), (2, 1), (1, 0, 1, 1), (2, 1), True)]


@pytest.mark.parametrize("own", [False, True], ids=["onednn", "converted"])
@pytest.mark.parametrize("case", BLOCKED_POOLS, ids=lambda c: f"{c[2]}x{c[3]}-k{c[4][0]}{c[4][1]}-ceil{int(c[8])}")
def test_channel_blocked_pooling_matches_nchw_pooling(case, own, monkeypatch):
    # pool2d(blocks=B): what the backend's NCHW kernel computes (the conformance suite checks that one against
    # float64), for max and both average divisors
    from singa import ops

    block = DEV.channel_block
    if not block:
        return
    if own:
        monkeypatch.setattr(onednn, "pool", lambda *a, **k: False)
    n, c, h, w, kernel, stride, pad, dil, ceil = case
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    tx, tb = tensor.from_numpy(x, DEV), tensor.from_numpy(to_blocks(x, block), DEV)
    for mode, include in (("max", False), ("avg", False), ("avg", True)):
        with monkeypatch.context() as m:  # the NCHW result of our own kernel, whichever way the blocks go
            m.setattr(onednn, "pool", lambda *a, **k: False)
            want = tensor.to_numpy(ops.pool2d(tx, kernel, stride, pad, dil, mode, ceil, include))
        got = tensor.to_numpy(ops.pool2d(tb, kernel, stride, pad, dil, mode, ceil, include, blocks=block))
        np.testing.assert_allclose(from_blocks(got, block), want, rtol=1e-6, atol=1e-6, err_msg=f"{mode} {include}")


@pytest.mark.parametrize(("setting", "dtype", "fused", "blocked"), [
    ("1", np.float32, True, False), ("1", np.float32, True, True), ("nchw", np.float32, False, False),
    ("0", np.float32, True, False), ("auto", np.float64, True, False)])
def test_replayed_convolutions_are_bound_launches_that_follow_new_data(setting, dtype, fused, blocked, monkeypatch):
    # a recorded convolution replays as the launch its kernel's `bind` worked out (the oneDNN plan, or our own kernel
    # with its arguments made), on whatever the recorded buffers hold then; from another thread it goes the whole way
    from singa import graph, ops

    block = DEV.channel_block
    if blocked and not block:
        pytest.skip("no channel blocks without oneDNN")
    monkeypatch.setenv(onednn.SETTING, setting)
    layer = LAYERS[2]
    stride, pad, groups = layer[5:]
    x, w, b, r, _ = layer_operands(layer)
    kind = dtypes.float64 if dtype == np.float64 else dtypes.float32
    tx, tw, tb, tr = (tensor.Tensor(device=DEV, data=a.astype(dtype), dtype=kind) for a in (x, w, b, r))
    assert tx.dtype == kind
    blocks = (block, block) if blocked else (0, 0)
    kw = {"residual": tr, "activation": "relu"} if fused else {}
    ops.conv2d(tx, tw, tb, stride, pad, 1, groups, blocks=blocks, **kw)  # the provider is chosen on the first call
    with graph.Recorder(DEV) as rec:
        y = ops.conv2d(tx, tw, tb, stride, pad, 1, groups, blocks=blocks, **kw)
    g = rec.finish()
    assert [fn.__name__ for fn, _, _ in g._exec] == ["launch"]

    def check():
        x2, r2 = RNG.standard_normal(x.shape), RNG.standard_normal(r.shape)
        tx.copy_from_numpy((to_blocks(x2, block) if blocked else x2).astype(dtype))
        tr.copy_from_numpy((to_blocks(r2, block) if blocked else r2).astype(dtype))
        g.run()
        want = conv_ref(x2, w, b, stride, pad, groups)
        want = np.maximum(want + r2, 0) if fused else want
        got = tensor.to_numpy(y)
        np.testing.assert_allclose(from_blocks(got, block) if blocked else got, want, rtol=1e-4, atol=1e-4)

    check()
    errors = []
    t = threading.Thread(target=lambda: errors.append(None) if check() is None else None)
    t.start()
    t.join()
    assert errors == [None]


@pytest.mark.parametrize(("setting", "dtype", "blocked"), [
    ("1", np.float32, False), ("1", np.float32, True), ("nchw", np.float32, False), ("0", np.float32, False),
    ("auto", np.float32, False), ("auto", np.float64, False)])
def test_a_residual_in_the_outputs_own_bytes_is_added_on_every_path(setting, dtype, blocked, monkeypatch):
    # Device.shares_output_with: conv2d_fused runs with the residual as its output's very view, called directly (the
    # first call also times the providers under auto) and in a replayed graph that plans the output over a residual
    # dying at the call; oneDNN's sum post-op adds it where it lies, the other paths add a copy taken first
    from singa import graph, ops
    from singa_backend_cpu.table import kernels as K

    assert DEV.shares_output_with == {"conv2d_fused": "residual"}
    block = DEV.channel_block
    if blocked and not block:
        pytest.skip("no channel blocks without oneDNN")
    monkeypatch.setenv(onednn.SETTING, setting)
    layer = LAYERS[1]
    stride, pad, groups = layer[5:]
    x, w, b, r, ref = layer_operands(layer)
    kind = dtypes.float64 if dtype == np.float64 else dtypes.float32

    def put(a):
        return tensor.Tensor(device=DEV, data=(to_blocks(a, block) if blocked else a).astype(dtype), dtype=kind)

    def get(t):
        a = tensor.to_numpy(t)
        return from_blocks(a, block) if blocked else a

    blocks = (block, block) if blocked else (0, 0)
    params = {"stride": (stride, stride), "padding": (pad,) * 4, "groups": groups, "activation": "relu",
              **({"blocks": blocks} if blocked else {})}
    tx, tw, tb = put(x), tensor.Tensor(device=DEV, data=w.astype(dtype), dtype=kind), \
        tensor.Tensor(device=DEV, data=b.astype(dtype), dtype=kind)
    for _ in range(2):
        tr = put(r)
        K["conv2d_fused"](tr.data, tx.data, tw.data, tb.data, tr.data, **params)
        np.testing.assert_allclose(get(tr), np.maximum(ref + r, 0), rtol=1e-4, atol=1e-4)
    tr = put(r)
    with graph.Recorder(DEV) as rec:
        y = ops.neg(ops.conv2d(tx, tw, tb, stride, pad, 1, groups, blocks=blocks, residual=ops.neg(tr),
                               activation="relu"))
    g = rec.finish()
    # the convolution's output (a temporary: y is the neg's) over the negated residual, which dies there
    assert g.num_in_place == 1
    for _ in range(2):
        x2, r2 = RNG.standard_normal(x.shape), RNG.standard_normal(r.shape)
        tx.copy_from_numpy((to_blocks(x2, block) if blocked else x2).astype(dtype))
        tr.copy_from_numpy((to_blocks(r2, block) if blocked else r2).astype(dtype))
        g.run()
        want = -np.maximum(conv_ref(x2, w, b, stride, pad, groups) - r2, 0)
        np.testing.assert_allclose(get(y), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("blocked", [False, True], ids=["nchw", "blocked"])
def test_bound_launches_keep_reordered_constant_weights_until_they_are_declared_again(blocked, monkeypatch):
    # a replayed convolution on weights declared constant runs as one C call on their kept reordered copy; weights
    # written and declared again (a new token) are reordered anew, by the launch's slower path
    from singa import graph, ops
    from singa.backend import declare_constant

    if onednn.library() is None:
        pytest.skip("oneDNN is not installed")
    block = DEV.channel_block if blocked else 0
    if blocked and not block:
        pytest.skip("no channel blocks without oneDNN")
    monkeypatch.setenv(onednn.SETTING, "1")
    onednn.reset()
    layer = LAYERS[2]
    stride, pad, groups = layer[5:]
    x, w, b, r, _ = layer_operands(layer)
    tx, tw, tb, tr = (tensor.from_numpy(a.astype(np.float32), DEV) for a in (x, w, b, r))
    declare_constant([tw.buffer])
    kw = {"residual": tr, "activation": "relu", "blocks": (block, block)}
    ops.conv2d(tx, tw, tb, stride, pad, 1, groups, **kw)  # the plan is made and the weights' reordered copy kept
    with graph.Recorder(DEV) as rec:
        y = ops.conv2d(tx, tw, tb, stride, pad, 1, groups, **kw)
    g = rec.finish()
    (launch, _, _), = g._exec

    def fast():
        found = [c.cell_contents for c in launch.__closure__ if isinstance(c.cell_contents, onednn._Launch)]
        return found[0] if found else None

    first = fast()
    assert first is not None
    assert first.kept is not None
    for redeclare in (False, True, False):
        if redeclare:
            w = RNG.standard_normal(w.shape) * 0.1
            tw.copy_from_numpy(w.astype(np.float32))
            declare_constant([tw.buffer])
            assert not first.still_constant()
        x2, r2 = RNG.standard_normal(x.shape), RNG.standard_normal(r.shape)
        tx.copy_from_numpy((to_blocks(x2, block) if block else x2).astype(np.float32))
        tr.copy_from_numpy((to_blocks(r2, block) if block else r2).astype(np.float32))
        g.run()
        want = np.maximum(conv_ref(x2, w, b, stride, pad, groups) + r2, 0)
        got = tensor.to_numpy(y)
        np.testing.assert_allclose(from_blocks(got, block) if block else got, want, rtol=1e-4, atol=1e-4)
        assert fast().still_constant()  # the launch after a new declaration keeps the new copy


@pytest.mark.parametrize("blocked", [False, True], ids=["nchw", "blocked"])
@pytest.mark.parametrize(("mode", "include"), [("max", False), ("avg", False), ("avg", True)])
def test_replayed_poolings_are_bound_launches_that_follow_new_data(mode, include, blocked):
    # as the convolutions: our NCHW kernel with its arguments made, or oneDNN's plan on channel blocks, rerun on the
    # recorded buffers' new contents; checked against a float64 max / mean over each 2x2 window, the last row and
    # column of windows half in the bottom and right padding (counted in the mean or not, as `include` says)
    from singa import graph, ops

    block = DEV.channel_block
    if blocked and not block:
        pytest.skip("no channel blocks without oneDNN")
    shape = (2, 32, 5, 7)
    tx = tensor.from_numpy(np.zeros(shape, np.float32), DEV)
    with graph.Recorder(DEV) as rec:
        y = ops.pool2d(tx, (2, 2), (2, 2), (0, 0, 1, 1), (1, 1), mode, False, include,
                       blocks=block if blocked else 0)
    g = rec.finish()
    assert [fn.__name__ for fn, _, _ in g._exec] == ["launch"]
    for _ in range(2):
        x = RNG.standard_normal(shape)
        tx.copy_from_numpy((to_blocks(x, block) if blocked else x).astype(np.float32))
        g.run()
        fill = {"max": -np.inf, "avg": 0.0 if include else np.nan}[mode]
        windows = np.pad(x, ((0, 0), (0, 0), (0, 1), (0, 1)), constant_values=fill).reshape(2, 32, 3, 2, 4, 2)
        want = windows.max(axis=(3, 5)) if mode == "max" else np.nanmean(windows, axis=(3, 5))
        got = tensor.to_numpy(y)
        np.testing.assert_allclose(from_blocks(got, block) if blocked else got, want, rtol=1e-5, atol=1e-6)
