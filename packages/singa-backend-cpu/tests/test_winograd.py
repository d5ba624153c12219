"""Winograd F(4x4, 3x3) on operands in oneDNN's channel blocks (16 with AVX-512, 8 with AVX2)
(singa_backend_cpu.winograd): chosen per shape (singa_backend_cpu.blocked) against oneDNN's blocked plan under
SINGA_ONEDNN=auto, right against a float64 reference with bias, residual (also the output's own bytes) and ReLU,
replayed as a bound launch, and with the transformed weights of constant weights kept until they are declared again.

(test_cpu_kernels.py checks the NCHW path of our own kernels, which sg_conv2d takes by itself.)
"""

from __future__ import annotations

import numpy as np
import pytest

from singa import device, graph, ops, tensor
from singa.backend import declare_constant
from singa_backend_cpu import blocked, onednn, winograd

DEV = device.get_device("cpu")
RNG = np.random.default_rng(11)
BLOCK = DEV.channel_block
BLOCKS = (BLOCK, BLOCK)

pytestmark = pytest.mark.skipif(BLOCK not in (8, 16), reason="no channel blocks on this machine (oneDNN absent)")


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setenv(onednn.SETTING, "auto")
    onednn.reset()
    blocked.reset()
    yield
    onednn.reset()
    blocked.reset()


def to_blocks(a, block=BLOCK):
    n, c, h, w = a.shape
    return np.ascontiguousarray(a.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2)).reshape(a.shape)


def from_blocks(a, block=BLOCK):
    n, c, h, w = a.shape
    return np.ascontiguousarray(a.reshape(n, c // block, h, w, block).transpose(0, 1, 4, 2, 3)).reshape(a.shape)


def conv_ref(x, w, b, pad):
    """float64 stride-1 cross-correlation, padding (top, left, bottom, right)."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad[0], pad[2]), (pad[1], pad[3])))
    oh, ow = xp.shape[2] - 2, xp.shape[3] - 2
    y = np.zeros((x.shape[0], w.shape[0], oh, ow))
    for i in range(3):
        for j in range(3):
            y += np.einsum("nchw,kc->nkhw", xp[:, :, i:i + oh, j:j + ow], w[:, :, i, j].astype(np.float64))
    return y + b.reshape(1, -1, 1, 1)


def operands(n=2, c=32, h=11, k=48, pad=(1, 1, 1, 1)):
    x = RNG.standard_normal((n, c, h, h + 3)).astype(np.float32)
    w = (RNG.standard_normal((k, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    b = RNG.standard_normal(k).astype(np.float32)
    ref = conv_ref(x, w, b, pad)
    r = RNG.standard_normal(ref.shape).astype(np.float32)
    return x, w, b, r, ref


def close(got, want):
    # Winograd's rounding: ~10x a direct kernel's, up to ~1e-5 of the largest output element (kernels/winograd.c)
    np.testing.assert_allclose(got, want, rtol=0, atol=3e-5 * float(np.max(np.abs(want))))


def choose(monkeypatch, winograd_wins: bool):
    """Make the measurement's verdict deterministic: Winograd faster than oneDNN's blocked plan (and the GEMM), or
    oneDNN's plan the fastest."""
    monkeypatch.setattr(onednn, "fastest_over_blocked",
                        lambda g, bias, post, blocks, others, kept=False: blocked.WINOGRAD if winograd_wins else None)


@pytest.mark.parametrize("residual", ["none", "separate", "output"])
@pytest.mark.parametrize("pad", [(1, 1, 1, 1), (0, 2, 1, 0)], ids=["same", "uneven"])
def test_blocked_convolutions_by_winograd_match_float64(residual, pad, monkeypatch):
    from singa_backend_cpu.table import kernels as K

    choose(monkeypatch, True)
    x, w, b, r, ref = operands(pad=pad)
    tx, tw, tb = (tensor.from_numpy(a, DEV) for a in (to_blocks(x), w, b))
    want = np.maximum(ref + (0 if residual == "none" else r), 0)
    if residual == "output":  # the residual in the output's own bytes (Device.shares_output_with)
        tr = tensor.from_numpy(to_blocks(r), DEV)
        K["conv2d_fused"](tr.data, tx.data, tw.data, tb.data, tr.data, padding=pad, activation="relu", blocks=BLOCKS)
        got = tensor.to_numpy(tr)
    else:
        tr = tensor.from_numpy(to_blocks(r), DEV) if residual == "separate" else None
        got = tensor.to_numpy(ops.conv2d(tx, tw, tb, 1, pad, 1, 1, residual=tr, activation="relu", blocks=BLOCKS))
    close(from_blocks(got), want)
    assert list(blocked.choices().values()) == [blocked.WINOGRAD]


def test_oneDNN_keeps_the_shapes_where_winograd_is_not_faster(monkeypatch):
    choose(monkeypatch, False)
    x, w, b, _, ref = operands()
    y = ops.conv2d(*(tensor.from_numpy(a, DEV) for a in (to_blocks(x), w, b)), 1, 1, blocks=BLOCKS)
    np.testing.assert_allclose(from_blocks(tensor.to_numpy(y)), ref, rtol=1e-4, atol=1e-4)
    assert list(blocked.choices().values()) == [None]
    # oneDNN's blocked plan ran it
    assert any(pkey[0][0] == "conv2d_fused" and pkey[0][-1] == BLOCKS for pkey in onednn._thread.plans)


def test_only_auto_weighs_winograd_for_blocked_operands(monkeypatch):
    # SINGA_ONEDNN=1 promises oneDNN's kernels on every run (and 0 has no blocked operands at all)
    choose(monkeypatch, True)
    monkeypatch.setenv(onednn.SETTING, "1")
    onednn.reset()
    x, w, b, _, ref = operands()
    y = ops.conv2d(*(tensor.from_numpy(a, DEV) for a in (to_blocks(x), w, b)), 1, 1, blocks=BLOCKS)
    np.testing.assert_allclose(from_blocks(tensor.to_numpy(y)), ref, rtol=1e-4, atol=1e-4)
    assert blocked.choices() == {}


def test_shapes_without_a_winograd_form_never_time_it(monkeypatch):
    timed = []
    monkeypatch.setattr(onednn, "fastest_over_blocked",
                        lambda g, bias, post, blocks, others, kept=False: timed.append(sorted(others)) or None)
    x = RNG.standard_normal((1, 32, 12, 12)).astype(np.float32)
    w = RNG.standard_normal((32, 32, 3, 3)).astype(np.float32)
    ops.conv2d(tensor.from_numpy(to_blocks(x), DEV), tensor.from_numpy(w, DEV), None, 2, 1, blocks=BLOCKS)
    assert timed == [[blocked.GEMM]]  # stride 2: only the unfolding + GEMM weighed against oneDNN
    assert list(blocked.choices().values()) == [None]


def test_replayed_blocked_convolutions_keep_transformed_constant_weights_until_declared_again(monkeypatch):
    choose(monkeypatch, True)
    x, w, b, r, _ = operands(n=1, c=16, h=14, k=32)
    tx, tw, tb, tr = (tensor.from_numpy(a, DEV) for a in (to_blocks(x), w, b, to_blocks(r)))
    declare_constant([tw.buffer])
    kw = {"residual": tr, "activation": "relu", "blocks": BLOCKS}
    ops.conv2d(tx, tw, tb, 1, 1, **kw)  # chosen, and the transformed weights kept
    assert len(winograd._kept) == 1
    with graph.Recorder(DEV) as rec:
        y = ops.conv2d(tx, tw, tb, 1, 1, **kw)
    g = rec.finish()
    (launch, _, _), = g._exec
    assert launch.__module__ == winograd.__name__
    for redeclare in (False, True, False):
        if redeclare:
            w = (RNG.standard_normal(w.shape) * 0.1).astype(np.float32)
            tw.copy_from_numpy(w)
            declare_constant([tw.buffer])
        x2, r2 = RNG.standard_normal(x.shape), RNG.standard_normal(r.shape)
        tx.copy_from_numpy(to_blocks(x2).astype(np.float32))
        tr.copy_from_numpy(to_blocks(r2).astype(np.float32))
        g.run()
        close(from_blocks(tensor.to_numpy(y)), np.maximum(conv_ref(x2, w, b, (1, 1, 1, 1)) + r2, 0))
    assert len(winograd._kept) == 1  # the first declaration's copy is dropped with its token


def test_weights_of_one_shape_in_several_layers_are_each_transformed_once(monkeypatch):
    # a model repeats its 3x3 shapes (SqueezeNet's fire modules, ResNet's blocks): each layer's transformed weights
    # stay kept beside the others', not evicting them at every call
    choose(monkeypatch, True)
    puts = []
    put = winograd._kept.put
    monkeypatch.setattr(winograd._kept, "put", lambda *a: puts.append(a[0]) or put(*a))
    x, w1, b, _, _ = operands(n=1, c=16, h=14, k=32)
    w2 = (RNG.standard_normal(w1.shape) * 0.1).astype(np.float32)
    tx, tw1, tw2, tb = (tensor.from_numpy(a, DEV) for a in (to_blocks(x), w1, w2, b))
    declare_constant([tw1.buffer, tw2.buffer])
    for _ in range(3):
        for w, tw in ((w1, tw1), (w2, tw2)):
            y = ops.conv2d(tx, tw, tb, 1, 1, blocks=BLOCKS)
            close(from_blocks(tensor.to_numpy(y)), conv_ref(x, w, b, (1, 1, 1, 1)))
    assert len(puts) == 2
    assert len(winograd._kept) == 2


@pytest.mark.parametrize("block", [0, 8, 16], ids=["nchw", "blocks8", "blocks16"])
@pytest.mark.parametrize(("n", "c", "h", "w", "k", "pad"), [(2, 32, 11, 14, 48, (1, 1, 1, 1)),
                                                          (1, 16, 9, 7, 32, (0, 2, 1, 0)),
                                                          (1, 64, 20, 20, 16, (1, 1, 1, 1))])
def test_kernel_takes_every_channel_block_whatever_the_vector_width(block, n, c, h, w, k, pad):
    # sg_winograd_forward on NCHW, 8- and 16-channel blocks, whichever block oneDNN picks here: the vector width of
    # the path (16 floats with AVX-512, 8 below) meets every block (halves in two blocks, or a lane offset in one)
    from singa_backend_cpu.device import ffi, lib

    def ptr(a):
        return ffi.cast("char *", a.ctypes.data)

    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (RNG.standard_normal((k, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    b = RNG.standard_normal(k).astype(np.float32)
    ref = conv_ref(x, wt, b, pad)
    r = RNG.standard_normal(ref.shape).astype(np.float32)
    oh, ow = ref.shape[2:]
    geometry = ffi.new("int64_t[]", [n, c, h, w, k, 3, 3, oh, ow, 1, 1, *pad, 1, 1, 1])
    u = np.empty(36 * c * k, np.float32)
    assert lib.sg_winograd_transform(ptr(wt), 0, ptr(u), geometry) == 0
    xb, rb = (to_blocks(x, block), to_blocks(r, block)) if block else (x, r)
    y = np.empty_like(rb)
    assert lib.sg_winograd_forward(ptr(xb), 0, ptr(u), ptr(b), 0, ptr(rb), 0, ptr(y), 0, geometry, 1, block) == 0
    close(from_blocks(y, block) if block else y, np.maximum(ref + r, 0))


def test_kernel_refuses_other_channel_blocks():
    from singa_backend_cpu.device import ffi, lib

    geometry = ffi.new("int64_t[]", [1, 16, 8, 8, 16, 3, 3, 8, 8, 1, 1, 1, 1, 1, 1, 1, 1, 1])
    buf = np.zeros(36 * 16 * 16, np.float32)
    p = ffi.cast("char *", buf.ctypes.data)
    assert lib.sg_winograd_forward(p, 0, p, ffi.NULL, 0, ffi.NULL, 0, p, 0, geometry, 0, 4) != 0  # SG_EVALUE
