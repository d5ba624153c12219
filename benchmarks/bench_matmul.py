"""Matrix product C = A @ B, float32, square n x n: GFLOP/s of singa, numpy and torch (higher is better)."""

from __future__ import annotations

import numpy as np

import benchlib
from benchlib import Table, best_time, ratio, torch
from singa import tensor

SIZES = (1024, 2048)
QUICK_SIZES = (128, 256)


def check(got: np.ndarray, want: np.ndarray, what: str) -> None:
    # A benchmark of a wrong result measures nothing; the tolerance allows float32 accumulation in any order.
    err = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
    if not err < 1e-4:
        raise AssertionError(f"{what}: relative error {err:.2e} against numpy")


def run(quick: bool = False) -> Table:
    """Matrix product GFLOP/s: singa vs numpy vs torch."""
    dev = benchlib.singa_device()
    table = Table(
        title="Matrix product of two n×n float32 matrices (GFLOP/s, higher is better)",
        script="bench_matmul.py",
        headers=["n", "singa", "numpy", "torch", "singa/numpy", "singa/torch"],
    )
    rng = np.random.default_rng(0)
    for n in QUICK_SIZES if quick else SIZES:
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        flops = 2.0 * n**3
        repeat = 2 if quick else (7 if n <= 1024 else 3)

        A, B = tensor.from_numpy(a, dev), tensor.from_numpy(b, dev)
        check(tensor.to_numpy(tensor.mult(A, B)), a @ b, f"singa mult n={n}")

        def singa_mm(A=A, B=B):
            tensor.mult(A, B)
            dev.synchronize()

        t_singa = best_time(singa_mm, repeat, warmup=2)
        t_numpy = best_time(lambda a=a, b=b: a @ b, repeat, warmup=2)
        t_torch = None
        if torch is not None:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            t_torch = best_time(lambda ta=ta, tb=tb: torch.mm(ta, tb), repeat, warmup=2)
        g = [None if t is None else flops / t / 1e9 for t in (t_singa, t_numpy, t_torch)]
        table.rows.append([n, g[0], g[1], g[2], ratio(g[0], g[1]), ratio(g[0], g[2])])
        del A, B
    table.notes.append(
        "Each number is 2·n³ floating-point operations over the best of several timed runs after two warm-up runs; "
        "singa computes `tensor.mult(A, B)` on the default device and the timer stops after `dev.synchronize()`. "
        "Every library uses its default thread count (see the machine table).")
    return table


if __name__ == "__main__":
    benchlib.main(run)
