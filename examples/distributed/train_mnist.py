"""Data-parallel training of SINGA's MNIST CNN: every rank trains on its shard, DistOpt combines the gradients.

    mpiexec -n 2 python examples/distributed/train_mnist.py                  # 2 ranks, fp32 all-reduce, graph mode
    mpiexec -n 4 python examples/distributed/train_mnist.py --mode fp16      # float16 transfers
    mpiexec -n 2 python examples/distributed/train_mnist.py --mode sparse-topk --spars 0.05
    python examples/distributed/train_mnist.py                               # one rank works too

(As root, add `--allow-run-as-root` to mpiexec; with more ranks than cores, `--oversubscribe`.)

The data are the handwritten digits that ship with scikit-learn, resized to 28x28 (`singa.data.load_digits_28x28`,
no download; `--mnist FOLDER` reads the original MNIST IDX files instead). Each rank keeps its own part of the
training set (`singa.data.shard`, the same number of images on every rank) and trains on batches of `--batch-size`,
so one step processes ranks x batch-size images. Rank 0 prints one line per epoch: the loss and accuracy over every
rank's batches, the held-out accuracy (each rank scores its part of the held-out set, the counts are summed) and the
time; at the end every rank calls save_states and rank 0 writes the checkpoint. CUDA devices are picked by the local
rank (`--device cuda` gives each process its own GPU).

Modes: fp32 (backward_and_update), fp16 (backward_and_update_half), partial (backward_and_partial_update),
sparse-topk and sparse-threshold (backward_and_sparse_update with topK=True / False and --spars). docs/distributed.md
says what to expect from each.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from singa import data, device, opt, tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mnist_cnn"))
from model import CNN

MODES = ("fp32", "fp16", "partial", "sparse-topk", "sparse-threshold")


class DistCNN(CNN):
    """The MNIST CNN whose training step calls the DistOpt method of the chosen mode."""

    def __init__(self, mode: str, spars: float):
        super().__init__(num_classes=10, num_channels=1)
        self.mode = mode
        self.spars = spars

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.softmax_cross_entropy(out, y)
        o = self.optimizer
        if self.mode == "fp32":
            o.backward_and_update(loss)
        elif self.mode == "fp16":
            o.backward_and_update_half(loss)
        elif self.mode == "partial":
            o.backward_and_partial_update(loss)
        else:
            o.backward_and_sparse_update(loss, topK=self.mode == "sparse-topk", spars=self.spars)
        return out, loss


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=8, help="passes over the training set (default 8)")
    p.add_argument("--batch-size", type=int, default=32, help="mini-batch size of each rank (default 32)")
    p.add_argument("--lr", type=float, default=0.02, help="SGD learning rate (default 0.02)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    p.add_argument("--weight-decay", type=float, default=1e-5, help="SGD weight decay (default 1e-5)")
    p.add_argument("--mode", choices=MODES, default="fp32", help="how gradients are combined (default fp32)")
    p.add_argument("--spars", type=float, default=0.05,
                   help="sparse modes: the fraction sent (sparse-topk) or the magnitude threshold (sparse-threshold)")
    p.add_argument("--device", default=None, help="cpu, cuda (one GPU per local rank), opencl (default: $SINGA_DEVICE)")
    p.add_argument("--eager", action="store_true", help="eager mode instead of graph mode")
    p.add_argument("--seed", type=int, default=0, help="seed of the data split, the shards and the initial weights")
    p.add_argument("--mnist", type=Path, default=None, help="folder with the original MNIST IDX files")
    p.add_argument("--max-steps", type=int, default=None, help="stop each epoch after this many steps (smoke runs)")
    p.add_argument("--out", type=Path, default=Path("out-distributed"), help="checkpoint folder")
    p.add_argument("--min-accuracy", type=float, default=0.0,
                   help="exit with status 1 when the final held-out accuracy is below this")
    return p.parse_args(argv)


def pick_device(spec: str | None, dist: opt.DistOpt):
    if spec is None:
        return device.get_default_device()
    if spec == "cuda":
        return device.create_cuda_gpu_on(dist.local_rank)
    return device.get_device(spec)


def summed(dist: opt.DistOpt, dev, values: list[float]) -> np.ndarray:
    """The sum over the ranks of a few numbers (float64 on the host, float32 on the wire)."""
    t = tensor.from_numpy(np.asarray(values, np.float32), dev)
    dist.all_reduce(t)
    return t.to_numpy().astype(np.float64)


def evaluate(m, dev, x: np.ndarray, y: np.ndarray, batch_size: int = 128) -> tuple[int, int]:
    m.eval()
    correct = 0
    for xb, yb in data.batches(x, y, batch_size):
        correct += int((tensor.to_numpy(m(tensor.from_numpy(xb, dev))).argmax(axis=1) == yb).sum())
    m.train()
    return correct, len(y)


def main(argv=None) -> int:
    args = parse_args(argv)
    dist = opt.DistOpt(opt.SGD(lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay))
    rank, world = dist.global_rank, dist.world_size
    dev = pick_device(args.device, dist)
    if args.mnist is not None:
        x_train, y_train, x_test, y_test = data.load_mnist(args.mnist)
    else:
        x_train, y_train, x_test, y_test = data.load_digits_28x28(test_fraction=0.2, seed=args.seed)
    x_train, y_train = data.shard(x_train, y_train, rank=rank, world_size=world, seed=args.seed)
    x_test, y_test = data.shard(x_test, y_test, rank=rank, world_size=world, shuffle=False)
    steps = len(x_train) // args.batch_size
    if args.max_steps is not None:
        steps = min(steps, args.max_steps)
    if steps == 0:
        raise SystemExit(f"batch size {args.batch_size} is larger than this rank's {len(x_train)} training images")

    dev.set_rand_seed(args.seed + rank)  # each rank draws its own weights: compile() replaces them with rank 0's
    m = DistCNN(args.mode, args.spars)
    m.set_optimizer(dist)
    tx = tensor.Tensor((args.batch_size, 1, 28, 28), dev, tensor.float32)
    ty = tensor.Tensor((args.batch_size,), dev, tensor.int32)
    m.compile([tx], is_train=True, use_graph=not args.eager, sequential=False)
    if rank == 0:
        print(f"{world} rank(s) x batch {args.batch_size} on {dev.name}, mode {args.mode}, "
              f"{'eager' if args.eager else 'graph'} mode, {steps} steps per epoch, "
              f"communicator {type(dist.communicator).__name__}", flush=True)

    test_acc = 0.0
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        loss_sum, correct, seen = 0.0, 0, 0
        for i, (xb, yb) in enumerate(data.batches(x_train, y_train, args.batch_size, shuffle=True,
                                                  seed=args.seed * 1000 + epoch, drop_last=True)):
            if i == steps:
                break
            tx.copy_from_numpy(xb)
            ty.copy_from_numpy(yb)
            out, loss = m(tx, ty)
            loss_sum += float(tensor.to_numpy(loss).reshape(-1)[0])
            correct += int((tensor.to_numpy(out).argmax(axis=1) == yb).sum())
            seen += len(yb)
        dev.synchronize()
        seconds = time.perf_counter() - t0
        right, total = evaluate(m, dev, x_test, y_test)
        tot = summed(dist, dev, [loss_sum, steps, correct, seen, right, total])
        test_acc = tot[4] / max(tot[5], 1)
        if rank == 0:
            print(f"epoch {epoch}/{args.epochs}  loss {tot[0] / tot[1]:.4f}  train accuracy {tot[2] / tot[3]:.3f}  "
                  f"held-out accuracy {test_acc:.3f}  {seconds:.1f} s", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    m.save_states(str(args.out / "checkpoint.zip"))  # every rank calls it; rank 0 writes
    if rank == 0:
        print(f"checkpoint: {args.out / 'checkpoint.zip'}", flush=True)
    return 0 if test_acc >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())
