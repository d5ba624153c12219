"""Runs under `mpiexec -n W` (or alone): trains a small CNN for a few steps in each configuration of a JSON file and
saves every rank's parameters, for tests/test_distributed.py to compare.

    mpiexec -n 2 python tests/distributed/train_worker.py CONFIGS.json OUT_DIR

Each configuration names a `mode`:

* "dist": the model's optimizer is `opt.DistOpt(SGD)`; train_one_batch calls the DistOpt method `method` with `kwargs`;
  rank r trains on its block of each global batch.
* "plain": one process, plain SGD on the whole global batch (the reference of "N ranks with batch b = one process
  with batch N*b").
* "emulate": one process simulating `world` ranks with numpy (the reference of the modes whose result depends on
  what each rank computed alone: float16 sums, sparse selection, partial averaging); written independently of
  singa.distopt except for the bucket layout (`distopt.buckets`, tested on its own).

The global batch of step s is the same in every run (seeded by s), so every configuration sees the same data; ranks
start from different random parameters (seeded by their rank) to show that compile() broadcasts rank 0's.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np

from singa import autograd, device, distopt, layer, model, opt, tensor

GLOBAL_BATCH = 16
LR, MOMENTUM, WEIGHT_DECAY = 0.05, 0.9, 1e-4


class Net(model.Model):
    """Conv 4@3x3 (padding 1), sigmoid, AvgPool 2, Linear 16, sigmoid, Linear 10 on 1x8x8 inputs. No batch norm, whose
    batch statistics would differ between N ranks of batch b and one process of batch N*b; smooth activations and
    pooling, so that a small change of the gradients (float16 transfers) changes the trajectory smoothly instead of
    flipping ReLU and max-pool decisions."""

    def __init__(self, method: str = "plain", kwargs: dict | None = None):
        super().__init__()
        self.conv = layer.Conv2d(4, 3, padding=1)
        self.act1 = layer.Sigmoid()
        self.pool = layer.AvgPool2d(2, 2)
        self.flat = layer.Flatten()
        self.fc1 = layer.Linear(16)
        self.act2 = layer.Sigmoid()
        self.fc2 = layer.Linear(10)
        self.loss_fn = layer.SoftMaxCrossEntropy()
        self.method = method
        self.kwargs = dict(kwargs or {})

    def forward(self, x):
        y = self.pool(self.act1(self.conv(x)))
        return self.fc2(self.act2(self.fc1(self.flat(y))))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss_fn(out, y)
        if self.method == "plain":
            self.optimizer(loss)
        else:
            getattr(self.optimizer, self.method)(loss, **self.kwargs)
        return out, loss

    def set_optimizer(self, optimizer):
        self.optimizer = optimizer


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 + step)
    return (rng.standard_normal((GLOBAL_BATCH, 1, 8, 8)).astype(np.float32),
            rng.integers(0, 10, GLOBAL_BATCH).astype(np.int32))


def build(dev, seed: int, method: str, kwargs: dict, optimizer, batch_size: int, graph: bool) -> tuple:
    dev.set_rand_seed(seed)
    np.random.seed(seed)
    m = Net(method, kwargs)
    m.set_optimizer(optimizer)
    tx = tensor.Tensor((batch_size, 1, 8, 8), dev, tensor.float32)
    ty = tensor.Tensor((batch_size,), dev, tensor.int32)
    m.compile([tx], is_train=True, use_graph=graph, sequential=False)
    return m, tx, ty


def sgd() -> opt.SGD:
    return opt.SGD(lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)


def params(m) -> dict[str, np.ndarray]:
    return {k: v.to_numpy() for k, v in m.get_params().items()}


# -- the runs -----------------------------------------------------------------------------------------------------


def run_dist(dev, cfg: dict, out: Path) -> None:
    dist = opt.DistOpt(sgd(), buffSize=cfg.get("buffSize", 4194304))
    rank, world = dist.global_rank, dist.world_size
    b = GLOBAL_BATCH // world
    seed = 100 + rank
    local = params(build(dev, seed, "plain", {}, sgd(), b, False)[0])  # what this rank would start from alone
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m, tx, ty = build(dev, seed, cfg["method"], cfg.get("kwargs", {}), dist, b, cfg.get("graph", False))
        initial = params(m)
        for s in range(cfg["steps"]):
            x, y = batch(s)
            tx.copy_from_numpy(x[rank * b:(rank + 1) * b])
            ty.copy_from_numpy(y[rank * b:(rank + 1) * b])
            m(tx, ty)
    dev.synchronize()
    stem = out / f"{cfg['name']}_w{world}_r{rank}"
    np.savez(f"{stem}.npz", **params(m), **{f"initial/{k}": v for k, v in initial.items()},
             **{f"local/{k}": v for k, v in local.items()})
    meta = {"graph": m.graph_summary(), "warnings": [str(w.message) for w in caught],
            "communicator": type(dist.communicator).__name__,
            "zero_copy": getattr(dist.communicator, "zero_copy", None)}
    Path(f"{stem}.json").write_text(json.dumps(meta))
    if cfg.get("checkpoint"):
        check_checkpoint(m, dist, out / f"{cfg['name']}_w{world}")


def check_checkpoint(m, dist, stem: Path) -> None:
    """Every rank saves to its own file name: only rank 0's exists afterwards; every rank then loads it."""
    m.save_states(f"{stem}_ck{dist.global_rank}.zip")
    mine = params(m)
    for t in m.get_params().values():  # scramble, then load rank 0's file
        t.copy_from_numpy(np.full(t.shape, 7.0, np.float32))
    m.load_states(f"{stem}_ck0.zip")
    loaded = params(m)
    same = all(np.array_equal(loaded[k], mine[k]) for k in mine)
    exists = sorted(p.name for p in stem.parent.glob(stem.name + "_ck*.zip"))
    (stem.parent / f"{stem.name}_ck_r{dist.global_rank}.json").write_text(json.dumps({"same": same,
                                                                                      "files": exists}))


def run_plain(dev, cfg: dict, out: Path) -> None:
    m, tx, ty = build(dev, 100, "plain", {}, sgd(), GLOBAL_BATCH, cfg.get("graph", False))
    initial = params(m)
    for s in range(cfg["steps"]):
        x, y = batch(s)
        tx.copy_from_numpy(x)
        ty.copy_from_numpy(y)
        m(tx, ty)
    np.savez(out / f"{cfg['name']}_w1_r0.npz", **params(m), **{f"initial/{k}": v for k, v in initial.items()})


def _grads(m, x: np.ndarray, y: np.ndarray, dev) -> list[tuple]:
    """(param, float32 gradient as numpy) in backward order, for one simulated rank's batch."""
    autograd.training = True
    out = m.forward(tensor.from_numpy(x, dev))
    loss = m.loss_fn(out, tensor.from_numpy(y, dev))
    return [(p, g.to_numpy()) for p, g in autograd.backward(loss)]


def _select(v: np.ndarray, spars: float, topk: bool) -> np.ndarray:
    if topk:
        k = min(v.size, max(1, int(spars * v.size)))
        return np.argsort(-np.abs(v), kind="stable")[:k]
    return np.flatnonzero(np.abs(v) >= spars)


def run_emulate(dev, cfg: dict, out: Path) -> None:
    world, method, kw = cfg["world"], cfg["method"], cfg.get("kwargs", {})
    b = GLOBAL_BATCH // world
    threshold = kw.get("threshold", distopt.DEFAULT_THRESHOLD)
    capacity = cfg.get("buffSize", 4194304)
    replicas = world if method == "backward_and_partial_update" else 1
    models = []
    for _ in range(replicas):
        o = sgd()
        m, _, _ = build(dev, 100, "plain", {}, o, b, False)
        models.append((m, o))
    residuals: dict = {}
    turn = 0
    for s in range(cfg["steps"]):
        x, y = batch(s)
        if replicas > 1:  # partial update: local steps, then the next partition averaged over the replicas
            per = []
            for r, (m, o) in enumerate(models):
                pairs = _grads(m, x[r * b:(r + 1) * b], y[r * b:(r + 1) * b], dev)
                for p, g in pairs:
                    o.update(p, tensor.from_numpy(g, dev))
                per.append([p for p, _ in pairs])
            layout = distopt.buckets([p.size() for p in per[0]], threshold, capacity)
            _, pos = layout[turn % len(layout)]
            turn += 1
            for i in pos:
                vals = [per[r][i].to_numpy() for r in range(world)]
                total = vals[0].copy()
                for v in vals[1:]:
                    total += v
                avg = total * np.float32(1.0 / world)
                for r in range(world):
                    per[r][i].copy_from_numpy(avg)
            for _, o in models:
                o.step()
            continue
        m, o = models[0]
        per_rank = [_grads(m, x[r * b:(r + 1) * b], y[r * b:(r + 1) * b], dev) for r in range(world)]
        ps = [p for p, _ in per_rank[0]]
        layout = distopt.buckets([p.size() for p in ps], threshold, capacity)
        combined = [None] * len(ps)
        for k, (_, pos) in enumerate(layout):
            flat = [np.concatenate([per_rank[r][i][1].reshape(-1) for i in pos]) for r in range(world)]
            if method == "backward_and_update_half":
                if kw.get("clipping"):
                    c = np.float32(kw.get("clip_Value", 100))
                    flat = [np.clip(f, -c, c) for f in flat]
                acc = flat[0].astype(np.float16)
                for f in flat[1:]:
                    acc = acc + f.astype(np.float16)  # rounded to float16 at each addition, as the transfer sums
                total = acc.astype(np.float32)
            elif method == "backward_and_sparse_update":
                spars, topk, corr = kw.get("spars", 0.05), kw.get("topK", False), kw.get("corr", True)
                total = np.zeros_like(flat[0])
                for r in range(world):
                    v = flat[r] + residuals[(r, k)] if corr and (r, k) in residuals else flat[r]
                    sel = _select(v, spars, topk)
                    if corr:
                        rest = v.copy()
                        rest[sel] = 0
                        residuals[(r, k)] = rest
                    total[sel] += v[sel]
            else:
                total = flat[0].copy()
                for f in flat[1:]:
                    total += f
            total = total * np.float32(1.0 / world)
            off = 0
            for i in pos:
                n = ps[i].size()
                combined[i] = total[off:off + n].reshape(ps[i].shape)
                off += n
        for p, g in zip(ps, combined):
            o.update(p, tensor.from_numpy(np.ascontiguousarray(g), dev))
        o.step()
    for r, (m, _) in enumerate(models):
        np.savez(out / f"{cfg['name']}_w{world}_r{r}.npz", **params(m))


def main(argv: list[str]) -> int:
    configs = json.loads(Path(argv[1]).read_text())
    out = Path(argv[2])
    dev = device.get_default_device()
    for cfg in configs:
        {"dist": run_dist, "plain": run_plain, "emulate": run_emulate}[cfg["mode"]](dev, cfg, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
