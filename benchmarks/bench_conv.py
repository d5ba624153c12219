"""Depthwise 2-D convolution (forward and both gradients) on the layers of MobileNet and ShuffleNet: ms per call."""

from __future__ import annotations

import numpy as np

import benchlib
from benchlib import Table, torch
from singa import ops

# label, (C, H, W), channel multiplier, kernel, stride, padding
CASES = [
    ("MobileNet dw 3x3 s1", (32, 56, 56), 1, 3, 1, 1),
    ("MobileNet dw 3x3 s2", (32, 56, 56), 1, 3, 2, 1),
    ("ShuffleNet dw 3x3 s2", (116, 56, 56), 1, 3, 2, 1),
    ("ShuffleNet dw 3x3 s1", (116, 28, 28), 1, 3, 1, 1),
    ("ShuffleNet dw 3x3 s2, 28x28", (232, 28, 28), 1, 3, 2, 1),
    ("ShuffleNet dw 3x3 s1, 14x14", (232, 14, 14), 1, 3, 1, 1),
    ("EfficientNet dw 5x5 s1", (240, 14, 14), 1, 5, 1, 2),
    ("dw 3x3 s1, multiplier 2", (32, 28, 28), 2, 3, 1, 1),
]
QUICK_CASES = [0, 2, 5]


def _check(got, want, what: str) -> None:
    # float32 sums of up to N * H * W products (the weight gradient): compare against the largest value
    if not np.allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.max(np.abs(want))))):
        raise AssertionError(f"{what}: singa disagrees with torch (max abs diff {np.max(np.abs(got - want)):.3g})")


def _case(dev, rng, n: int, case: tuple, repeat: int) -> list[list]:
    """Rows of one layer at batch n: each pass, singa and torch."""
    label, (c, h, w), mult, k, s, p = case
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((c * mult, 1, k, k)) / k).astype(np.float32)
    b = rng.standard_normal(c * mult).astype(np.float32)
    y_shape = ops.conv2d(ops.from_numpy(x, dev), ops.from_numpy(wt, dev), None, stride=s, padding=p, groups=c).shape
    dy_np = rng.standard_normal(y_shape).astype(np.float32)
    singa, tfn = benchlib.conv_passes(dev, x, wt, b, dy_np, s, p, groups=c)
    if tfn:
        with torch.no_grad():
            for what in singa:
                _check(ops.to_numpy(singa[what]()), tfn[what]().numpy(), f"{label} {what}")
    return benchlib.pass_rows(dev, label, (n, c, h, w), singa, tfn, repeat)


def run(quick: bool = False) -> Table:
    """Depthwise convolution forward (with bias), data gradient and weight gradient: singa vs torch."""
    table = benchlib.layer_table("Depthwise 2-D convolution, float32 NCHW (ms per call, lower is better)",
                                 "bench_conv.py", CASES, QUICK_CASES, quick, _case)
    table.notes.append(
        "groups = channels (one input channel per group), weights (C * multiplier, 1, k, k). Best of several timed "
        "calls after two warm-ups; the singa timer stops after `dev.synchronize()`. torch runs "
        "`torch.nn.functional.conv2d(..., groups=C)` and `torch.ops.aten.convolution_backward` with one gradient "
        "asked for at a time. Ratios are of times: below 1, singa is faster.")
    table.notes.append(benchlib.openmp_note())
    return table


if __name__ == "__main__":
    benchlib.main(run)
