"""Element-wise add, mul, exp and a full sum on 16M float32 elements: milliseconds per call (lower is better)."""

from __future__ import annotations

import numpy as np

import benchlib
from benchlib import Table, best_time, ratio, torch
from singa import tensor

N = 1 << 24  # 16M elements, 64 MiB per float32 array: well past the caches, so this measures memory bandwidth
QUICK_N = 1 << 20


def _close(got, want, what: str, rtol: float) -> None:
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if not np.allclose(got, want, rtol=rtol, atol=rtol):
        raise AssertionError(f"{what}: singa disagrees with numpy")


def run(quick: bool = False) -> Table:
    """Element-wise ops and a full reduction: singa vs numpy vs torch."""
    dev = benchlib.singa_device()
    n = QUICK_N if quick else N
    repeat = 3 if quick else 10
    table = Table(
        title=f"Element-wise and reduction, {n // (1 << 20)}M float32 elements (ms per call, lower is better)",
        script="bench_elementwise.py",
        headers=["op", "singa", "numpy", "torch", "singa/numpy", "singa/torch"],
    )
    rng = np.random.default_rng(0)
    a = rng.uniform(-1.0, 1.0, n).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, n).astype(np.float32)
    A, B = tensor.from_numpy(a, dev), tensor.from_numpy(b, dev)
    ta = tb = None
    if torch is not None:
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)

    cases = [
        ("add (`a + b`)", lambda: A + B, lambda: a + b, lambda: ta + tb),
        ("mul (`a * b`)", lambda: A * B, lambda: a * b, lambda: ta * tb),
        ("exp (`exp(a)`)", lambda: tensor.exp(A), lambda: np.exp(a), lambda: torch.exp(ta)),
        ("sum (`sum(a)`, all elements)", lambda: tensor.sum(A), lambda: np.sum(a), lambda: torch.sum(ta)),
    ]
    for label, f_singa, f_numpy, f_torch in cases:
        got = f_singa()
        want = f_numpy()
        if label.startswith("sum"):
            # float32 sums of 16M terms differ by summation order; compare against the exact float64 sum
            got = got if np.isscalar(got) else tensor.to_numpy(got)
            _close(got, np.sum(a, dtype=np.float64), label, rtol=1e-3)
        else:
            _close(tensor.to_numpy(got), want, label, rtol=1e-5)
        del got, want

        def timed_singa(f=f_singa):
            f()
            dev.synchronize()

        t_singa = best_time(timed_singa, repeat, warmup=2)
        t_numpy = best_time(f_numpy, repeat, warmup=2)
        t_torch = best_time(f_torch, repeat, warmup=2) if torch is not None else None
        ms = [None if t is None else t * 1e3 for t in (t_singa, t_numpy, t_torch)]
        table.rows.append([label, ms[0], ms[1], ms[2], ratio(ms[0], ms[1]), ratio(ms[0], ms[2])])
    table.notes.append(
        "Best of several timed calls after two warm-ups. Ratios are of times: below 1, singa is faster. The singa "
        f"timer stops after `dev.synchronize()`. Each call allocates its {n * 4 >> 20} MiB result, as user code does: "
        "singa's memory pool reuses the block freed by the previous call, while numpy and torch ask the system "
        "allocator each time, so their times include fresh pages being faulted in.")
    return table


if __name__ == "__main__":
    benchlib.main(run)
