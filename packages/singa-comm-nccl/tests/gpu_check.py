"""The NCCL communicator on a real GPU, one rank, checked against numpy: run on a machine with one CUDA device and
singa-backend-cuda, singa-comm-nccl and NCCL installed.

    python packages/singa-comm-nccl/tests/gpu_check.py          # no MPI needed: SINGA's NcclIdHolder launch

It prints one line per check and exits with status 0 when all pass, 1 when one fails, 2 when it cannot run (no GPU,
no NCCL: the reason is printed). The checks:

* all_reduce (float32, float16, an offset view inside a larger buffer), broadcast and all_gather on cuda tensors;
  with one rank the sum is the tensor itself, so these check the pointers, counts, dtypes and the stream ordering
  (a kernel before and after each collective);
* fused_all_reduce with scale 0.5 through a float32 and a float16 buffer, and the sparse all-reduce (top-K, with a
  residual) that NCCL runs through device all-gathers;
* one DistOpt step (each mode) of a small model on cuda against the same step of the plain optimizer: with one rank
  the results must be identical, in eager and in graph mode.

tests/test_nccl.py runs the same functions under pytest when a GPU is present.
"""

from __future__ import annotations

import sys

import numpy as np

CHECKS: list = []


def check(fn):
    CHECKS.append(fn)
    return fn


def setup():
    """(device, communicator) on cuda:0, or raise RuntimeError saying why not."""
    from singa import communicator, device, plugins
    from singa_comm_nccl import NcclFactory, NcclIdHolder

    factory = NcclFactory()
    why = factory.status()
    if why is not None:
        raise RuntimeError(why)
    if "cuda" not in plugins.registry().backends:
        raise RuntimeError("singa-backend-cuda is not installed")
    dev = device.create_cuda_gpu()
    comm = factory.create(dev, communicator.World(0, 1, 0, 1), nccl_id=NcclIdHolder())
    return dev, comm


def _eq(name: str, got: np.ndarray, want: np.ndarray, tol: float = 0.0) -> None:
    ok = np.array_equal(got, want) if tol == 0 else np.allclose(got, want, rtol=tol, atol=tol)
    if not ok or got.shape != want.shape:
        raise AssertionError(f"{name}: got {got!r}, want {want!r}")


@check
def collectives(dev, comm) -> None:
    from singa import dtypes, ops
    from singa.backend import View

    rng = np.random.default_rng(0)
    for dt in (dtypes.float32, dtypes.float16, dtypes.int32):
        a = (rng.standard_normal((33, 7)) * 10).astype(dtypes.to_numpy_dtype(dt))
        x = ops.from_numpy(a, dev, dtype=dt)
        y = ops.mul(x, 2) if dt != dtypes.int32 else ops.add(x, x)  # a kernel queued before the collective
        comm.all_reduce(y)
        z = ops.add(y, x)  # and one after it
        _eq(f"all_reduce {dtypes.name(dt)}", z.to_numpy(), (a + a + a).astype(a.dtype), 1e-3 if dt == 1 else 0)
    base = np.arange(20, dtype=np.float32)
    t = ops.from_numpy(base, dev)
    comm.all_reduce(View(t.buffer, dtypes.float32, (6,), None, 5))
    _eq("all_reduce of an offset view", t.to_numpy(), base)
    b = ops.from_numpy(np.array([1.5, -2, 3], np.float32), dev)
    comm.broadcast(b, 0)
    _eq("broadcast", b.to_numpy(), np.array([1.5, -2, 3], np.float32))
    flags = ops.from_numpy(np.array([True, False, True]), dev)
    comm.broadcast(flags, 0)
    _eq("broadcast bool", flags.to_numpy(), np.array([True, False, True]))
    src = rng.integers(0, 100, 10).astype(np.int64)
    out = ops.empty((10,), dtypes.int64, dev)
    comm.all_gather(out, ops.from_numpy(src, dev))
    _eq("all_gather", out.to_numpy(), src)
    got = comm.all_gather_object({"rank": 0, "ok": [1, 2]})
    if got != [{"rank": 0, "ok": [1, 2]}]:
        raise AssertionError(f"all_gather_object: {got}")
    comm.barrier()


@check
def fused_and_sparse(dev, comm) -> None:
    from singa import dtypes, ops

    rng = np.random.default_rng(1)
    parts = [rng.standard_normal(s).astype(np.float32) for s in ((4,), (2, 3), (5,))]
    for bdt in (dtypes.float32, dtypes.float16):
        xs = [ops.from_numpy(p, dev) for p in parts]
        comm.fused_all_reduce(xs, ops.empty((32,), bdt, dev), scale=0.5)
        for i, (x, p) in enumerate(zip(xs, parts)):
            want = p * 0.5 if bdt == dtypes.float32 else p.astype(np.float16).astype(np.float32) * np.float32(0.5)
            _eq(f"fused_all_reduce {dtypes.name(bdt)} tensor {i}", x.to_numpy(), want)
    v = rng.standard_normal(40).astype(np.float32)
    r = rng.standard_normal(40).astype(np.float32)
    x, res = ops.from_numpy(v, dev), ops.from_numpy(r, dev)
    comm.sparse_all_reduce(x, 0.1, True, res)
    total = v + r
    sel = np.argsort(-np.abs(total), kind="stable")[:4]
    want = np.zeros(40, np.float32)
    want[sel] = total[sel]
    rest = total.copy()
    rest[sel] = 0
    _eq("sparse_all_reduce top-K", x.to_numpy(), want)
    _eq("sparse_all_reduce residual", res.to_numpy(), rest)


def _train_pair(dev, method: str, kwargs: dict, graph: bool) -> tuple[dict, dict]:
    """(plain SGD's parameters, DistOpt's) after 3 steps of the same model and data on `dev`."""
    from singa import layer, model, opt, tensor
    from singa_comm_nccl import NcclIdHolder

    class Net(model.Model):
        def __init__(self):
            super().__init__()
            self.conv = layer.Conv2d(4, 3, padding=1)
            self.act = layer.ReLU()
            self.flat = layer.Flatten()
            self.fc = layer.Linear(10)
            self.loss_fn = layer.SoftMaxCrossEntropy()

        def forward(self, x):
            return self.fc(self.flat(self.act(self.conv(x))))

        def train_one_batch(self, x, y):
            loss = self.loss_fn(self.forward(x), y)
            if isinstance(self.optimizer, opt.DistOpt):
                getattr(self.optimizer, method)(loss, **kwargs)
            else:
                self.optimizer(loss)
            return loss

        def set_optimizer(self, o):
            self.optimizer = o

    results = []
    for distributed in (False, True):
        dev.set_rand_seed(3)
        m = Net()
        sgd = opt.SGD(lr=0.1, momentum=0.9)
        m.set_optimizer(opt.DistOpt(sgd, nccl_id=NcclIdHolder(), local_rank=0, world_size=1, buffSize=64)
                        if distributed else sgd)
        tx = tensor.Tensor((8, 1, 6, 6), dev)
        ty = tensor.Tensor((8,), dev, tensor.int32)
        m.compile([tx], is_train=True, use_graph=graph)
        rng = np.random.default_rng(5)
        for _ in range(3):
            tx.copy_from_numpy(rng.standard_normal((8, 1, 6, 6)).astype(np.float32))
            ty.copy_from_numpy(rng.integers(0, 10, 8).astype(np.int32))
            m(tx, ty)
        if distributed and type(m.optimizer.communicator).__name__ != "NcclCommunicator":
            raise AssertionError(f"DistOpt used {type(m.optimizer.communicator).__name__}, not NCCL")
        results.append({k: v.to_numpy() for k, v in m.get_params().items()})
    return results[0], results[1]


@check
def distopt_step(dev, comm) -> None:
    modes = [("backward_and_update", {"threshold": 20}), ("backward_and_partial_update", {"threshold": 20}),
             ("backward_and_sparse_update", {"threshold": 20, "spars": 1.0, "topK": True})]
    for graph in (False, True):
        for method, kw in modes:
            plain, dist = _train_pair(dev, method, kw, graph)
            for k in plain:
                _eq(f"{method} ({'graph' if graph else 'eager'}) {k}", dist[k], plain[k])
        plain, dist = _train_pair(dev, "backward_and_update_half", {"threshold": 20}, graph)
        for k in plain:  # one rank: only the float16 rounding of the gradient (2^-11 relative) separates them
            _eq(f"backward_and_update_half ({'graph' if graph else 'eager'}) {k}", dist[k], plain[k], 2e-3)


def main() -> int:
    try:
        dev, comm = setup()
    except Exception as exc:  # noqa: BLE001 - report why the check cannot run
        print(f"gpu_check: cannot run: {type(exc).__name__}: {exc}")
        return 2
    from singa_comm_nccl import nccl

    print(f"gpu_check: NCCL {nccl.version()} ({nccl.path}) on {dev.description()}")
    failed = 0
    for fn in CHECKS:
        try:
            fn(dev, comm)
            print(f"  ok    {fn.__name__}")
        except Exception as exc:  # noqa: BLE001 - report every check
            failed += 1
            print(f"  FAIL  {fn.__name__}: {type(exc).__name__}: {exc}")
    print(f"gpu_check: {len(CHECKS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
