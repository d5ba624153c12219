"""Dense 2-D convolution (forward and both gradients) on layers of ResNet, VGG and MobileNet: GFLOP/s beside PyTorch.

On the CPU backend these run through oneDNN where it is installed and faster for the shape (SINGA_ONEDNN=auto), else
through the backend's own kernels; the table's notes say which ran each layer.
"""

from __future__ import annotations

import numpy as np

import benchlib
from benchlib import Table, torch
from singa import ops
from singa.kernel_checks import ConvGeometry

# label, batch, (C, H, W), K, kernel, stride, padding
CASES = [
    ("ResNet-18 conv2_x 3x3", 32, (64, 56, 56), 64, 3, 1, 1),
    ("ResNet-18 conv3_x 3x3 s2", 32, (64, 56, 56), 128, 3, 2, 1),
    ("ResNet-18 conv4_x 3x3", 32, (256, 14, 14), 256, 3, 1, 1),
    ("ResNet-18 conv2_x 3x3, batch 1", 1, (64, 56, 56), 64, 3, 1, 1),
    ("ResNet-18 conv3_x 3x3, batch 1", 1, (128, 28, 28), 128, 3, 1, 1),
    ("ResNet-50 1x1 expand", 32, (64, 56, 56), 256, 1, 1, 0),
    ("ResNet CIFAR 3x3", 32, (64, 32, 32), 64, 3, 1, 1),
    ("VGG-16 conv3 3x3", 8, (256, 56, 56), 256, 3, 1, 1),
    ("MobileNet pointwise 1x1", 32, (128, 28, 28), 256, 1, 1, 0),
    ("first layer 3->64 3x3", 32, (3, 32, 32), 64, 3, 1, 1),
]
QUICK_CASES = [0, 6, 9]


def _gflops(label_flops: float, ms: float | None) -> float | None:
    return None if ms is None or ms <= 0 else label_flops / (ms * 1e-3) / 1e9


def _case(dev, rng, case: tuple, repeat: int) -> list[list]:
    label, n, (c, h, w), k, kk, s, p = case
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((k, c, kk, kk)) / np.sqrt(c * kk * kk)).astype(np.float32)
    y = ops.conv2d(ops.from_numpy(x, dev), ops.from_numpy(wt, dev), None, stride=s, padding=p)
    oh, ow = y.shape[2], y.shape[3]
    flops = 2.0 * n * k * oh * ow * c * kk * kk  # the same for each of the three passes
    dy_np = rng.standard_normal(y.shape).astype(np.float32)
    singa, tfn = benchlib.conv_passes(dev, x, wt, None, dy_np, s, p)
    if tfn:
        with torch.no_grad():
            for what in singa:
                got, want = ops.to_numpy(singa[what]()), tfn[what]().numpy()
                if not np.allclose(got, want, rtol=1e-3, atol=1e-4 * max(1.0, float(np.max(np.abs(want))))):
                    raise AssertionError(f"{label} {what}: singa disagrees with torch "
                                         f"(max abs diff {np.max(np.abs(got - want)):.3g})")
    rows = []
    for row in benchlib.pass_rows(dev, label, (n, c, h, w), singa, tfn, repeat):
        _, shape, what, ms, tms, _ = row
        g, tg = _gflops(flops, ms), _gflops(flops, tms)
        provider = _provider(_KINDS[what], (n, c, h, w), wt.shape, y.shape, s, p)
        rows.append([label, shape, what, ms, g, tms, tg, benchlib.ratio(ms, tms), provider])
    return rows


_KINDS = {"forward": "conv2d", "backward data": "conv2d_backward_data", "backward weight": "conv2d_backward_weight"}


def _provider(kind: str, x_shape: tuple, w_shape: tuple, y_shape: tuple, stride: int, padding: int) -> str:
    """Which provider the CPU backend settled on for this pass (oneDNN's blocked or NCHW kernels or its own), so
    that a slow row can be told from a choice made during a burst of load; n/a on other backends."""
    try:
        from singa_backend_cpu import onednn
    except ImportError:
        return "n/a"
    from singa_backend_cpu.device import ffi, lib

    g = ConvGeometry("cpu", kind, x_shape, w_shape, y_shape, stride, padding, 1, 1, ())
    provider = onednn.chosen(kind, g) or "n/a"
    if provider == onednn.OWN and kind != "conv2d_backward_weight" and lib.sg_conv2d_winograd(
            ffi.new("int64_t[]", g.as_list()), int(kind == "conv2d_backward_data")):
        return "own-winograd"
    return "onednn-nhwc" if provider == onednn.BLOCKED and onednn.channels_last(kind, g) else provider


def _providers() -> str:
    try:
        from singa_backend_cpu import onednn
    except ImportError:
        return "not the CPU backend"
    ran = onednn.choices()
    if not ran:
        return onednn.status()
    by = {}
    for (kind, *_), provider in ran.items():
        by.setdefault(provider, set()).add(kind)
    own = sum(1 for v in ran.values() if v == onednn.OWN)
    parts = [f"{p} ran {', '.join(sorted(k))}" for p, k in sorted(by.items()) if p != onednn.OWN]
    return (f"{onednn.status()}; {'; '.join(parts) or 'oneDNN ran none'}; the backend's own kernels kept for {own} "
            "(op, shape) pairs, this run's earlier tables (depthwise convolutions) included")


def run(quick: bool = False) -> Table:
    """Dense convolution forward, data gradient and weight gradient: singa vs torch, GFLOP/s."""
    dev = benchlib.singa_device()
    table = Table(title="Dense 2-D convolution, float32 NCHW (ms per call and GFLOP/s, higher is better)",
                  script="bench_conv_layers.py",
                  headers=["layer", "input", "pass", "singa ms", "singa GFLOP/s", "torch ms", "torch GFLOP/s",
                           "singa/torch time", "singa provider"])
    rng = np.random.default_rng(0)
    for case in ([CASES[i] for i in QUICK_CASES] if quick else CASES):
        table.rows += _case(dev, rng, case, 3 if quick else 6)
    table.notes.append(
        "2·N·K·OH·OW·C·kh·kw floating-point operations per pass. Best of several timed calls after two warm-ups; "
        "torch runs `torch.nn.functional.conv2d` and `torch.ops.aten.convolution_backward` with one gradient asked "
        "for at a time (its oneDNN path, NCHW in and out, like singa's). singa/torch time is a ratio of times: below "
        "1, singa is faster. The provider is the kernel the CPU backend chose for the pass when it first met the shape "
        "(SINGA_ONEDNN=auto): onednn (oneDNN, channel-blocked layout), onednn-nhwc (oneDNN's brgemm kernels on "
        "channels-last copies, where they were clearly faster: small batches), onednn-nchw (oneDNN on NCHW), own "
        "(the backend's kernels), own-winograd (its Winograd F(4x4, 3x3) kernel: 3x3 stride-1 layers of 16-channel "
        "multiples).")
    table.notes.append(f"Providers: {_providers()}.")
    table.notes.append(benchlib.openmp_note())
    return table


if __name__ == "__main__":
    benchlib.main(run)
