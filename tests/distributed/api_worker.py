"""Runs under `mpiexec -n W`: SINGA's lower-level DistOpt calls against numpy (sums, not averages).

    mpiexec -n 2 python tests/distributed/api_worker.py OUT_DIR

Writes the names of the checks passed to OUT_DIR/api_r<rank>.json; a failed check raises (and aborts the job).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from singa import device, opt, tensor

passed: list[str] = []


def check(name: str, got: np.ndarray, want: np.ndarray, tol: float = 0.0) -> None:
    ok = np.array_equal(got, want) if tol == 0 else np.allclose(got, want, rtol=tol, atol=tol)
    if not ok:
        raise AssertionError(f"{name}: got {got!r}, want {want!r}")
    passed.append(name)


def parts(n: int, shape: tuple, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


def main(out: Path) -> int:
    dev = device.get_device("cpu")
    dist = opt.DistOpt(opt.SGD(lr=0.5), buffSize=64)
    r, n = dist.global_rank, dist.world_size
    if (r, n, dist.local_rank) != (int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"]),
                                   int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])):
        raise AssertionError(f"rank attributes {r, n, dist.local_rank} differ from mpiexec's environment")
    passed.append("global_rank, world_size, local_rank")
    try:
        opt.DistOpt(opt.SGD(), world_size=n + 1)
    except ValueError as e:
        if f"mpiexec started this process with world_size {n}" not in str(e):
            raise
        passed.append("world_size disagreeing with mpiexec")

    def f32(a):
        return tensor.from_numpy(a, dev)

    def total(ps):
        acc = ps[0].copy()
        for p in ps[1:]:
            acc = acc + p
        return acc

    tol = 0.0 if n <= 2 else 1e-5  # more ranks: MPI may add in another order than numpy
    a = parts(n, (5,), 1)
    t = f32(a[r])
    dist.all_reduce(t)
    check("all_reduce sums", t.to_numpy(), total(a), tol)

    a, b = parts(n, (3, 4), 2), parts(n, (7,), 3)
    ta, tb = f32(a[r]), f32(b[r])
    dist.fused_all_reduce([ta], send=False)  # queued
    dist.fused_all_reduce([tb])  # sends both
    check("fused_all_reduce send=False then send", ta.to_numpy(), total(a), tol)
    check("fused_all_reduce second tensor", tb.to_numpy(), total(b), tol)

    h = parts(n, (6,), 4)
    t = f32(h[r])
    dist.all_reduce_half(t)
    check("all_reduce_half", t.to_numpy(), total([x.astype(np.float16) for x in h]).astype(np.float32), 2e-2)
    ta, tb = f32(a[r]), f32(b[r])
    dist.fused_all_reduce_half([ta, tb])
    check("fused_all_reduce_half", ta.to_numpy(), total([x.astype(np.float16) for x in a]).astype(np.float32), 2e-2)

    g = parts(n, (12,), 5)
    acc = parts(n, (12,), 6)
    t, ta_ = f32(g[r]), f32(acc[r])
    dist.sparsification(t, ta_, 0.25, True)
    want = np.zeros(12, np.float32)
    for k in range(n):
        v = g[k] + acc[k]
        sel = np.argsort(-np.abs(v), kind="stable")[:3]
        want[sel] += v[sel]
        if k == r:
            rest = v.copy()
            rest[sel] = 0
    check("sparsification sums the ranks' top-K", t.to_numpy(), want)
    check("sparsification keeps the rest in the accumulation", ta_.to_numpy(), rest)

    x1, x2 = parts(n, (4,), 7), parts(n, (5,), 8)
    t1, t2 = f32(x1[r]), f32(x2[r])
    dist.fused_sparsification([t1, t2], None, 0.5, False)  # threshold 0.5, no accumulation
    want = np.zeros(9, np.float32)
    for k in range(n):
        v = np.concatenate([x1[k], x2[k]])
        sel = np.flatnonzero(np.abs(v) >= 0.5)
        want[sel] += v[sel]
    check("fused_sparsification by threshold", np.concatenate([t1.to_numpy(), t2.to_numpy()]), want)

    p = tensor.Tensor((3,), dev, requires_grad=True, stores_grad=True)
    p.set_value(1.0)
    grad = f32(np.full(3, 2.0 * n, np.float32))  # a sum over the ranks
    dist.update(p, grad)
    check("update divides by world_size", p.to_numpy(), np.full(3, 1.0 - 0.5 * 2.0, np.float32))
    dist.wait()
    (out / f"api_r{r}.json").write_text(json.dumps(passed))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
