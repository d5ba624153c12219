"""Forward convolutions on channel-blocked operands as an unfolding plus one GEMM (kernels/conv.c,
sg_conv2d_gemm_blocked), one of our kernels singa_backend_cpu.blocked weighs against oneDNN's blocked plan: right
against a float64 reference over strides, uneven padding, dilation, 1x1 and 7x7 kernels, several images, bias,
residual (also in the output's own bytes) and ReLU, for 8- and 16-channel blocks; chosen where it was the fastest,
and replayed as a bound launch.
"""

from __future__ import annotations

import numpy as np
import pytest

from singa import device, graph, ops, tensor
from singa.backend import declare_constant
from singa_backend_cpu import blocked, onednn
from singa_backend_cpu.device import ffi, lib

DEV = device.get_device("cpu")
RNG = np.random.default_rng(12)


def to_blocks(a, block):
    n, c, h, w = a.shape
    return np.ascontiguousarray(a.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2)).reshape(a.shape)


def from_blocks(a, block):
    n, c, h, w = a.shape
    return np.ascontiguousarray(a.reshape(n, c // block, h, w, block).transpose(0, 1, 4, 2, 3)).reshape(a.shape)


def conv_ref(x, w, b, stride, pad, dilation):
    """float64 cross-correlation; pad (top, left, bottom, right)."""
    (sh, sw), (dh, dw), (kh, kw) = stride, dilation, w.shape[2:]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad[0], pad[2]), (pad[1], pad[3])))
    oh = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    ow = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
    y = np.zeros((x.shape[0], w.shape[0], oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
            y += np.einsum("nchw,kc->nkhw", patch, w[:, :, i, j].astype(np.float64))
    return y + (0 if b is None else b.reshape(1, -1, 1, 1))


def ptr(a):
    return ffi.cast("char *", a.ctypes.data) if a is not None else ffi.NULL


CASES = [  # n, c, h, w, k, kernel, stride, pad, dilation
    (1, 32, 7, 7, 48, 3, 1, (1, 1, 1, 1), 1),
    (3, 16, 9, 11, 32, 3, 2, (0, 2, 1, 0), 1),
    (2, 16, 14, 14, 64, 1, 1, (0, 0, 0, 0), 1),
    (1, 48, 10, 8, 16, 1, 2, (0, 0, 0, 0), 1),
    (2, 16, 12, 12, 16, 3, 1, (2, 2, 2, 2), 2),
    (1, 16, 15, 13, 32, 7, 2, (3, 3, 3, 3), 1),
]


@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "n{}c{}h{}w{}k{}r{}s{}p{}d{}".format(*c[:7], "".join(
    map(str, c[7])), c[8]))
@pytest.mark.parametrize("post", ["bias", "bias-residual-relu", "residual-in-output", "none"])
def test_kernel_matches_float64(block, case, post):
    n, c, h, w_, k, r, s, pad, d = case
    x = RNG.standard_normal((n, c, h, w_)).astype(np.float32)
    wt = (RNG.standard_normal((k, c, r, r)) / np.sqrt(r * r * c)).astype(np.float32)
    b = RNG.standard_normal(k).astype(np.float32) if post != "none" else None
    ref = conv_ref(x, wt, b, (s, s), pad, (d, d))
    oh, ow = ref.shape[2:]
    res = RNG.standard_normal(ref.shape).astype(np.float32) if "resid" in post else None
    want = ref + (res if res is not None else 0)
    relu = post != "bias" and post != "none"
    if relu:
        want = np.maximum(want, 0)
    geometry = ffi.new("int64_t[]", [n, c, h, w_, k, r, r, oh, ow, s, s, *pad, d, d, 1])
    xb = to_blocks(x, block)
    rb = to_blocks(res, block) if res is not None else None
    y = rb if post == "residual-in-output" else np.full(ref.shape, np.nan, np.float32)
    status = lib.sg_conv2d_gemm_blocked(ptr(xb), 0, ptr(wt), 0, ptr(b), 0, ptr(rb), 0, ptr(y), 0, geometry,
                                        int(relu), block)
    assert status == 0
    np.testing.assert_allclose(from_blocks(y, block), want, rtol=1e-5, atol=1e-5 * float(np.max(np.abs(want))))


def test_kernel_refuses_groups_and_channels_off_the_block():
    buf = np.zeros(16 * 16 * 9 * 4, np.float32)
    p = ptr(buf)
    grouped = ffi.new("int64_t[]", [1, 16, 4, 4, 16, 3, 3, 4, 4, 1, 1, 1, 1, 1, 1, 1, 1, 2])
    assert lib.sg_conv2d_gemm_blocked(p, 0, p, 0, ffi.NULL, 0, ffi.NULL, 0, p, 0, grouped, 0, 8) != 0
    twelve = ffi.new("int64_t[]", [1, 12, 4, 4, 16, 3, 3, 4, 4, 1, 1, 1, 1, 1, 1, 1, 1, 1])
    assert lib.sg_conv2d_gemm_blocked(p, 0, p, 0, ffi.NULL, 0, ffi.NULL, 0, p, 0, twelve, 0, 8) != 0


BLOCK = DEV.channel_block
needs_blocks = pytest.mark.skipif(BLOCK not in (8, 16), reason="no channel blocks on this machine (oneDNN absent)")


@pytest.fixture
def gemm_chosen(monkeypatch):
    monkeypatch.setenv(onednn.SETTING, "auto")
    onednn.reset()
    blocked.reset()
    timed = []
    monkeypatch.setattr(onednn, "fastest_over_blocked",
                        lambda g, bias, post, blocks, others, kept=False: timed.append(sorted(others)) or blocked.GEMM)
    yield timed
    onednn.reset()
    blocked.reset()


@needs_blocks
def test_chosen_gemm_runs_blocked_calls_and_replays_them(gemm_chosen):
    blocks = (BLOCK, BLOCK)
    x = RNG.standard_normal((1, 2 * BLOCK, 7, 7)).astype(np.float32)
    w = (RNG.standard_normal((4 * BLOCK, 2 * BLOCK, 3, 3)) * 0.1).astype(np.float32)
    b = RNG.standard_normal(4 * BLOCK).astype(np.float32)
    r = RNG.standard_normal((1, 4 * BLOCK, 4, 4)).astype(np.float32)
    tx, tw, tb, tr = (tensor.from_numpy(a, DEV) for a in (to_blocks(x, BLOCK), w, b, to_blocks(r, BLOCK)))
    declare_constant([tw.buffer])
    kw = {"residual": tr, "activation": "relu", "blocks": blocks}
    y = ops.conv2d(tx, tw, tb, 2, 1, **kw)
    want = np.maximum(conv_ref(x, w, b, (2, 2), (1, 1, 1, 1), (1, 1)) + r, 0)
    np.testing.assert_allclose(from_blocks(tensor.to_numpy(y), BLOCK), want, rtol=1e-5, atol=1e-5)
    assert gemm_chosen == [[blocked.GEMM]]  # stride 2: no Winograd form to weigh
    assert list(blocked.choices().values()) == [blocked.GEMM]
    with graph.Recorder(DEV) as rec:
        y = ops.conv2d(tx, tw, tb, 2, 1, **kw)
    g = rec.finish()
    (launch, _, _), = g._exec
    assert launch.__module__ == blocked.__name__
    for _ in range(2):
        x2, r2 = RNG.standard_normal(x.shape), RNG.standard_normal(r.shape)
        tx.copy_from_numpy(to_blocks(x2, BLOCK).astype(np.float32))
        tr.copy_from_numpy(to_blocks(r2, BLOCK).astype(np.float32))
        g.run()
        want = np.maximum(conv_ref(x2, w, b, (2, 2), (1, 1, 1, 1), (1, 1)) + r2, 0)
        np.testing.assert_allclose(from_blocks(tensor.to_numpy(y), BLOCK), want, rtol=1e-5, atol=1e-5)


@needs_blocks
def test_grouped_blocked_calls_are_left_to_onednn(gemm_chosen):
    x = RNG.standard_normal((1, 2 * BLOCK, 6, 6)).astype(np.float32)
    w = RNG.standard_normal((2 * BLOCK, BLOCK, 1, 1)).astype(np.float32)
    y = ops.conv2d(tensor.from_numpy(to_blocks(x, BLOCK), DEV), tensor.from_numpy(w, DEV), None, 1, 0, groups=2,
                   blocks=(BLOCK, BLOCK))
    ref = np.concatenate([conv_ref(x[:, :BLOCK], w[:BLOCK], None, (1, 1), (0,) * 4, (1, 1)),
                          conv_ref(x[:, BLOCK:], w[BLOCK:], None, (1, 1), (0,) * 4, (1, 1))], axis=1)
    np.testing.assert_allclose(from_blocks(tensor.to_numpy(y), BLOCK), ref, rtol=1e-5, atol=1e-5)
    assert gemm_chosen == []  # nothing of ours to weigh
    assert list(blocked.choices().values()) == [None]


@needs_blocks
def test_onednn_is_timed_with_constant_weights_reordered_once(monkeypatch):
    # in an inference plan oneDNN reorders constant weights once and keeps the copy: the timing against our kernels
    # must do the same, or oneDNN pays a reorder per run that it never pays in use
    from singa.kernel_checks import ConvGeometry

    seen = []
    run = onednn._Plan.run

    def spy(self, addresses, thread, constant=None, pointers=None, kept_at=None):
        seen.append(kept_at)
        return run(self, addresses, thread, constant, pointers, kept_at)

    monkeypatch.setattr(onednn._Plan, "run", spy)
    g = ConvGeometry("cpu", "conv2d_fused", (1, 2 * BLOCK, 7, 7), (2 * BLOCK, 2 * BLOCK, 3, 3), (1, 2 * BLOCK, 7, 7),
                     1, 1, 1, 1, ())
    for kept in (True, False):
        seen.clear()
        onednn.fastest_over_blocked(g, True, (False, False), (BLOCK, BLOCK), {"other": lambda: None}, kept)
        assert len(seen) > 2
        if kept:
            assert seen[0][1] is False  # the first run reorders into the kept copy ...
            assert all(s[1] for s in seen[1:])  # ... the others reuse it
            assert len({s[0] for s in seen}) == 1
        else:
            assert seen == [None] * len(seen)


@needs_blocks
def test_a_plan_run_on_kept_weights_skips_their_reorder():
    from singa.kernel_checks import ConvGeometry

    c = k = 2 * BLOCK
    g = ConvGeometry("cpu", "conv2d_fused", (1, c, 7, 7), (k, c, 3, 3), (1, k, 7, 7), 1, 1, 1, 1, ())
    key = ("conv2d_fused", tuple(g.as_list()), True, (False, False), (BLOCK, BLOCK))
    plan = onednn._plan("conv2d_fused", g, key, True, onednn._aligned_threads())
    assert plan.weight_step >= 0
    x = RNG.standard_normal((1, c, 7, 7)).astype(np.float32)
    w1, w2 = (RNG.standard_normal((k, c, 3, 3)).astype(np.float32) for _ in range(2))
    b = RNG.standard_normal(k).astype(np.float32)
    xb, wbuf, y = to_blocks(x, BLOCK), w1.copy(), np.empty((1, k, 7, 7), np.float32)
    kept = np.empty(plan.weight_bytes + 64, np.uint8)
    at = (kept.ctypes.data + 63) // 64 * 64
    addresses = [a.ctypes.data for a in (y, xb, wbuf, b)]
    for w_in, filled, want in ((w1, False, w1), (w2, True, w1)):  # the second run keeps the first run's weights
        wbuf[:] = w_in
        plan.run(addresses, onednn._thread, kept_at=(at, filled))
        np.testing.assert_allclose(from_blocks(y, BLOCK), conv_ref(x, want, b, (1, 1), (1,) * 4, (1, 1)),
                                   rtol=1e-4, atol=1e-4)
    plan.run(addresses, onednn._thread)  # and without kept_at, the weights as they are now
    np.testing.assert_allclose(from_blocks(y, BLOCK), conv_ref(x, w2, b, (1, 1), (1,) * 4, (1, 1)),
                               rtol=1e-4, atol=1e-4)
