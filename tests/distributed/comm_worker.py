"""Runs under `mpiexec -n W`: the MPI communicator's collectives on each given device, checked against numpy.

    mpiexec -n 2 python tests/distributed/comm_worker.py OUT_DIR cpu hostmem [opencl]

Every rank draws every rank's data from one seed, so each can compute the expected result on its own. A failed
check raises (the excepthook then aborts the job, naming the rank); at the end each rank writes the names of the
checks it passed to OUT_DIR/comm_r<rank>.json.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from singa import communicator, device, dtypes, mpi, ops
from singa.backend import View
from singa.communicator import Communicator

passed: list[str] = []


def check(name: str, got: np.ndarray, want: np.ndarray, tol: float = 0.0) -> None:
    ok = np.array_equal(got, want) if tol == 0 else np.allclose(got, want, rtol=tol, atol=tol)
    if not ok or got.dtype != want.dtype:
        raise AssertionError(f"{name}: got {got!r}, want {want!r}")
    passed.append(name)


def same_everywhere(c, name: str, got: np.ndarray) -> None:
    """Every rank holds the same bits (MPI may sum in another order than numpy, but the same on every rank)."""
    digests = c.all_gather_object(hashlib.sha256(got.tobytes()).hexdigest())
    if len(set(digests)) != 1:
        raise AssertionError(f"{name}: the ranks hold different results")
    passed.append(name + " (same on every rank)")


def raises(name: str, exc: type, fn, needle: str) -> None:
    try:
        fn()
    except exc as e:
        if needle not in str(e):
            raise AssertionError(f"{name}: message {str(e)!r} lacks {needle!r}") from None
        passed.append(name)
        return
    raise AssertionError(f"{name}: no {exc.__name__} raised")


def data(world: int, shape: tuple, npdt, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if npdt.kind == "f":
        return [rng.standard_normal(shape).astype(npdt) for _ in range(world)]
    return [rng.integers(-1000, 1000, shape).astype(npdt) for _ in range(world)]


def run(dev, w) -> None:
    factory = communicator.select(dev)
    c = factory.create(dev, w)
    tag = dev.backend_name
    r, n = w.rank, w.size
    floats = [dtypes.float32, dtypes.float16, dtypes.int32, dtypes.int64]
    if dtypes.float64 in dev.dtypes:
        floats.append(dtypes.float64)
    for dt in floats:
        npdt = dtypes.to_numpy_dtype(dt)
        parts = data(n, (3, 5), npdt, seed=dt)
        x = ops.from_numpy(parts[r], dev, dtype=dt)
        c.all_reduce(x)
        want = parts[0].copy()
        for p in parts[1:]:
            want = want + p  # float16: rounded at each addition, like the MPI operation (commutative)
        # Two ranks: one (commutative) addition, exactly numpy's. More: MPI may pair the terms in another order, which
        # moves float sums by a few roundings (float16: its 2^-11 relative step on values up to about 10).
        tol = 0.0 if n <= 2 or npdt.kind != "f" else (2e-2 if dt == dtypes.float16 else 1e-5)
        check(f"{tag}: all_reduce {dtypes.name(dt)}", x.to_numpy(), want, tol)
        same_everywhere(c, f"{tag}: all_reduce {dtypes.name(dt)}", x.to_numpy())

    # a view in the middle of a buffer: only its elements change
    base = np.arange(12, dtype=np.float32) + 100 * r
    t = ops.from_numpy(base, dev)
    c.all_reduce(View(t.buffer, dtypes.float32, (5,), None, 4))
    want = base.copy()
    want[4:9] = sum(np.arange(12, dtype=np.float32)[4:9] + 100 * k for k in range(n))
    check(f"{tag}: all_reduce of an offset view", t.to_numpy(), want)

    for root in range(n):
        parts = data(n, (7,), np.dtype(np.float32), seed=50 + root)
        x = ops.from_numpy(parts[r], dev)
        c.broadcast(x, root)
        check(f"{tag}: broadcast from rank {root}", x.to_numpy(), parts[root])
    flags = ops.from_numpy(np.array([r % 2 == 0, r == 1, True]), dev)
    c.broadcast(flags, n - 1)
    check(f"{tag}: broadcast bool", flags.to_numpy(), np.array([(n - 1) % 2 == 0, n - 1 == 1, True]))

    parts = data(n, (2, 3), np.dtype(np.int64), seed=7)
    out = ops.empty((n * 6,), dtypes.int64, dev)
    c.all_gather(out, ops.from_numpy(parts[r], dev))
    check(f"{tag}: all_gather", out.to_numpy(), np.concatenate([p.reshape(-1) for p in parts]))

    got = c.all_gather_object({"rank": r, "name": f"r{r}"})
    if got != [{"rank": k, "name": f"r{k}"} for k in range(n)]:
        raise AssertionError(f"{tag}: all_gather_object gave {got}")
    passed.append(f"{tag}: all_gather_object")
    got = Communicator.all_gather_object(c, [r, [r] * r])  # the generic version, through device memory
    if got != [[k, [k] * k] for k in range(n)]:
        raise AssertionError(f"{tag}: generic all_gather_object gave {got}")
    passed.append(f"{tag}: generic all_gather_object")

    # fused: three tensors through a float32 and a float16 buffer, averaged
    shapes = [(4,), (2, 3), (5,)]
    for bdt in (dtypes.float32, dtypes.float16):
        parts = [data(n, s, np.dtype(np.float32), seed=200 + i) for i, s in enumerate(shapes)]
        xs = [ops.from_numpy(p[r], dev) for p in parts]
        buf = ops.empty((20,), bdt, dev)
        c.fused_all_reduce(xs, buf, scale=1.0 / n)
        for i, x in enumerate(xs):
            if bdt == dtypes.float32:
                want = sum(p for p in parts[i]) / np.float32(n)
            else:
                acc = parts[i][0].astype(np.float16)
                for p in parts[i][1:]:
                    acc = acc + p.astype(np.float16)
                want = acc.astype(np.float32) * np.float32(1.0 / n)
            tol = 0.0 if n <= 2 else (2e-2 if bdt == dtypes.float16 else 1e-5)
            check(f"{tag}: fused_all_reduce through {dtypes.name(bdt)}, tensor {i}", x.to_numpy(),
                  want.astype(np.float32), tol)
    raises(f"{tag}: fused buffer overflow", ValueError,
           lambda: c.fused_all_reduce([ops.from_numpy(np.zeros(30, np.float32), dev)], ops.empty((20,), dtypes.float32,
                                                                                                dev)), "fused buffer")

    # sparse: top-K and threshold, with and without residual; the MPI override and the generic version
    for impl in ("mpi", "generic"):
        for topk, spars in ((True, 0.25), (False, 0.8)):
            for with_res in (False, True):
                parts = data(n, (16,), np.dtype(np.float32), seed=300)
                res_parts = data(n, (16,), np.dtype(np.float32), seed=301)
                x = ops.from_numpy(parts[r], dev)
                res = ops.from_numpy(res_parts[r], dev) if with_res else None
                fn = (c.sparse_all_reduce if impl == "mpi"
                      else (lambda *a, **k: Communicator.sparse_all_reduce(c, *a, **k)))
                fn(x, spars, topk, res)
                total = np.zeros(16, np.float32)
                for k in range(n):
                    v = parts[k] + res_parts[k] if with_res else parts[k]
                    sel = (np.argsort(-np.abs(v), kind="stable")[:4] if topk else np.flatnonzero(np.abs(v) >= spars))
                    total[sel] += v[sel]
                    if k == r and with_res:
                        rest = v.copy()
                        rest[sel] = 0
                        check(f"{tag}: {impl} sparse residual topk={topk} ", res.to_numpy(), rest)
                check(f"{tag}: {impl} sparse topk={topk} residual={with_res}", x.to_numpy(), total)
    c.barrier()
    passed.append(f"{tag}: barrier")

    # errors name what is wrong
    t = ops.from_numpy(np.zeros((4, 4), np.float32), dev)
    raises(f"{tag}: strided view refused", ValueError, lambda: c.all_reduce(ops.transpose(t)), "contiguous")
    raises(f"{tag}: bool sum refused", TypeError, lambda: c.all_reduce(ops.from_numpy(np.zeros(3, bool), dev)),
           "bool")
    raises(f"{tag}: bad root", ValueError, lambda: c.broadcast(t, n), "root")
    raises(f"{tag}: all_gather size", ValueError, lambda: c.all_gather(ops.empty((3,), dtypes.float32, dev), t),
           "must hold")
    other = device.get_device("hostmem" if tag != "hostmem" else "cpu")
    raises(f"{tag}: tensor of another device", ValueError,
           lambda: c.all_reduce(ops.from_numpy(np.zeros(2, np.float32), other)), "this communicator works on")
    if factory.memory(dev) != (communicator.NATIVE if tag == "cpu" else communicator.STAGED):
        raise AssertionError(f"{tag}: memory() is {factory.memory(dev)}")
    if getattr(c, "zero_copy", None) != (tag == "cpu"):
        raise AssertionError(f"{tag}: zero_copy is {c.zero_copy}")
    passed.append(f"{tag}: memory access declared")


def main(argv: list[str]) -> int:
    out = Path(argv[1])
    w = mpi.world()
    for spec in argv[2:]:
        run(device.get_device(spec), w)
    (out / f"comm_r{w.rank}.json").write_text(json.dumps(passed))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
