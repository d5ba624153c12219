"""Per-operation overhead: a Python loop of 10,000 `a + b` on (64, 64) float32 tensors, microseconds per op."""

from __future__ import annotations

import numpy as np

import benchlib
from benchlib import Table, best_time, ratio, torch
from singa import tensor

LOOP = 10_000
QUICK_LOOP = 1_000
SHAPE = (64, 64)


def run(quick: bool = False) -> Table:
    """Dispatch overhead of a small op: singa vs numpy vs torch."""
    dev = benchlib.singa_device()
    loop = QUICK_LOOP if quick else LOOP
    repeat = 2 if quick else 5
    table = Table(
        title=f"Per-op overhead: {loop:,} × `a + b` on {SHAPE[0]}×{SHAPE[1]} float32 (µs per op, lower is better)",
        script="bench_overhead.py",
        headers=["op", "singa", "numpy", "torch", "singa/numpy", "singa/torch"],
    )
    rng = np.random.default_rng(0)
    a = rng.standard_normal(SHAPE, dtype=np.float32)
    b = rng.standard_normal(SHAPE, dtype=np.float32)
    A, B = tensor.from_numpy(a, dev), tensor.from_numpy(b, dev)
    np.testing.assert_allclose(tensor.to_numpy(A + B), a + b, rtol=1e-6)

    def singa_loop():
        for _ in range(loop):
            A + B  # the expression is what is timed
        dev.synchronize()

    def numpy_loop():
        for _ in range(loop):
            a + b

    t_torch = None
    if torch is not None:
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)

        def torch_loop():
            for _ in range(loop):
                ta + tb

        t_torch = best_time(torch_loop, repeat) / loop * 1e6
    t_singa = best_time(singa_loop, repeat) / loop * 1e6
    t_numpy = best_time(numpy_loop, repeat) / loop * 1e6
    table.rows.append(["`a + b`", t_singa, t_numpy, t_torch, ratio(t_singa, t_numpy), ratio(t_singa, t_torch)])
    table.notes.append(
        "The loop's total time (one `dev.synchronize()` at its end) divided by its length, best of several loops "
        "after one warm-up loop. At this size the arithmetic is negligible: this is the cost of going from a Python "
        "operator to a finished kernel call, allocation of the result included.")
    return table


if __name__ == "__main__":
    benchlib.main(run)
