"""Train SINGA's MNIST CNN on real handwritten digits that ship with scikit-learn (no download), in graph mode.

    python examples/mnist_cnn/train.py                      # default device (SINGA_DEVICE), 8 epochs, ./out
    python examples/mnist_cnn/train.py --epochs 2 --out /tmp/run --device cpu
    python examples/mnist_cnn/train.py --mnist ~/data/mnist  # the original MNIST IDX files instead

The 1797 8x8 digits of `sklearn.datasets.load_digits` are resized to 28x28 (`singa.data.load_digits_28x28`); a
stratified fifth is held out. The model is compiled with `use_graph=True`: the first step records forward, backward and
the SGD update, later steps replay them with new data copied into the placeholders. The script prints the held-out
accuracy, and writes `training.png` (loss and accuracy curves), `checkpoint.zip` (`Model.save_states`) and
`history.json` into `--out`. It exits with status 1 if the final held-out accuracy is below `--min-accuracy` (95% for
a full run on the digits).

Needs scikit-learn for the digits (not with --mnist) and matplotlib for the plot (without it, no plot):
`pip install scikit-learn matplotlib`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from singa import data, device, opt, tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model import create_model


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=8, help="passes over the training set (default 8)")
    p.add_argument("--batch-size", type=int, default=64, help="mini-batch size (default 64)")
    p.add_argument("--lr", type=float, default=0.02, help="SGD learning rate (default 0.02)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    p.add_argument("--weight-decay", type=float, default=1e-5, help="SGD weight decay (default 1e-5)")
    p.add_argument("--device", default=None,
                   help="device spec such as cpu, cuda:0, opencl (default: $SINGA_DEVICE, else cpu)")
    p.add_argument("--out", type=Path, default=Path("out"), help="output folder (default ./out)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data split, shuffling and initial weights")
    p.add_argument("--eager", action="store_true", help="eager mode instead of graph mode")
    p.add_argument("--mnist", type=Path, default=None,
                   help="folder with the original MNIST IDX files (train-images-idx3-ubyte[.gz] ...) to use instead")
    p.add_argument("--limit", type=int, default=None, help="use only the first N training and held-out images")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (a smoke run)")
    p.add_argument("--no-onnx", action="store_true",
                   help="skip the ONNX round trip (export, onnxruntime check, re-import with sonnx)")
    p.add_argument("--min-accuracy", type=float, default=None,
                   help="exit with status 1 when the final held-out accuracy is below this (default: 0.95 for a "
                        "full run on the digits, 0 with --mnist, --limit or --max-steps)")
    args = p.parse_args(argv)
    if args.min_accuracy is None:
        partial = args.mnist is not None or args.limit is not None or args.max_steps is not None
        args.min_accuracy = 0.0 if partial else 0.95
    return args


def load_data(args) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): float32 (N, 1, 28, 28) images and int32 labels."""
    if args.mnist is not None:
        arrays = data.load_mnist(args.mnist)
    else:
        arrays = data.load_digits_28x28(test_fraction=0.2, seed=args.seed)
    if args.limit:
        arrays = tuple(a[:args.limit] for a in arrays)
    return arrays


def build_model(dev, args):
    """The CNN with its SGD optimizer, compiled on placeholders: (model, tx, ty)."""
    dev.set_rand_seed(args.seed)
    np.random.seed(args.seed)
    m = create_model(num_classes=10, num_channels=1)
    m.set_optimizer(opt.SGD(lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay))
    tx = tensor.Tensor((args.batch_size, 1, 28, 28), dev, tensor.float32)
    ty = tensor.Tensor((args.batch_size,), dev, tensor.int32)
    m.compile([tx], is_train=True, use_graph=not args.eager, sequential=False)
    return m, tx, ty


class Progress:
    """A one-line progress bar on stderr, redrawn in place on a terminal and printed once per epoch elsewhere."""

    def __init__(self, total: int, prefix: str, stream=None, width: int = 30):
        self.total, self.prefix, self.width = total, prefix, width
        self.stream = sys.stderr if stream is None else stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.t0 = time.perf_counter()

    def line(self, done: int, info: str) -> str:
        filled = self.width * done // max(self.total, 1)
        bar = "#" * filled + "." * (self.width - filled)
        return f"{self.prefix} [{bar}] {done}/{self.total} {info} {time.perf_counter() - self.t0:5.1f}s"

    def update(self, done: int, info: str) -> None:
        if self.tty:
            self.stream.write("\r" + self.line(done, info) + "\033[K")
            self.stream.flush()

    def close(self, done: int, info: str) -> None:
        self.stream.write(("\r" if self.tty else "") + self.line(done, info) + ("\033[K" if self.tty else "") + "\n")
        self.stream.flush()


def evaluate(m, dev, x: np.ndarray, y: np.ndarray, batch_size: int = 128) -> float:
    """Accuracy of the model in evaluation mode (any batch size; the last batch may be short)."""
    m.eval()
    correct = 0
    for xb, yb in data.batches(x, y, batch_size):
        logits = m(tensor.from_numpy(xb, dev))
        correct += int((tensor.to_numpy(logits).argmax(axis=1) == yb).sum())
    m.train()
    return correct / max(len(x), 1)


def train(m, dev, tx, ty, arrays, args) -> dict:
    """SGD over shuffled mini-batches (full batches only: graph mode replays fixed shapes); returns the history."""
    x_train, y_train, x_test, y_test = arrays
    steps_per_epoch = len(x_train) // args.batch_size
    if steps_per_epoch == 0:
        raise SystemExit(f"batch size {args.batch_size} is larger than the {len(x_train)} training images")
    hist = {"step_loss": [], "epoch": [], "train_loss": [], "train_acc": [], "test_acc": [], "epoch_seconds": []}
    step = 0
    m.train()
    for epoch in range(1, args.epochs + 1):
        bar = Progress(steps_per_epoch, f"epoch {epoch}/{args.epochs}")
        losses, correct, seen = [], 0, 0
        for xb, yb in data.batches(x_train, y_train, args.batch_size, shuffle=True, seed=args.seed * 1000 + epoch,
                                   drop_last=True):
            tx.copy_from_numpy(xb)
            ty.copy_from_numpy(yb)
            out, loss = m(tx, ty)
            losses.append(float(tensor.to_numpy(loss).reshape(-1)[0]))
            correct += int((tensor.to_numpy(out).argmax(axis=1) == yb).sum())
            seen += len(yb)
            step += 1
            bar.update(len(losses), f"loss {losses[-1]:.4f} acc {correct / seen:.3f}")
            if args.max_steps is not None and step >= args.max_steps:
                break
        dev.synchronize()
        seconds = time.perf_counter() - bar.t0
        test_acc = evaluate(m, dev, x_test, y_test)
        hist["step_loss"] += losses
        hist["epoch"].append(epoch)
        hist["train_loss"].append(float(np.mean(losses)))
        hist["train_acc"].append(correct / max(seen, 1))
        hist["test_acc"].append(test_acc)
        hist["epoch_seconds"].append(seconds)
        bar.close(len(losses), f"loss {np.mean(losses):.4f} acc {correct / max(seen, 1):.3f} held-out {test_acc:.3f}")
        if args.max_steps is not None and step >= args.max_steps:
            break
    hist["steps"] = step
    return hist


def plot(hist: dict, path: Path) -> Path | None:
    """Loss per step (and per-epoch mean) and accuracy per epoch, as a PNG; None without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed, so no plot is written (pip install matplotlib)", file=sys.stderr)
        return None

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    steps_per_epoch = len(hist["step_loss"]) / max(len(hist["epoch"]), 1)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(np.arange(1, len(hist["step_loss"]) + 1) / steps_per_epoch, hist["step_loss"], lw=0.8, alpha=0.6,
             label="per step")
    ax1.plot(hist["epoch"], hist["train_loss"], "o-", label="epoch mean")
    ax1.set(xlabel="epoch", ylabel="softmax cross-entropy", title="training loss", yscale="log")
    ax1.legend()
    ax2.plot(hist["epoch"], hist["train_acc"], "o-", label="training")
    ax2.plot(hist["epoch"], hist["test_acc"], "s-", label="held-out")
    low = min(0.8, *hist["test_acc"], *hist["train_acc"]) - 0.02
    ax2.set(xlabel="epoch", ylabel="accuracy", title="accuracy", ylim=(low, 1.005))
    ax2.grid(alpha=0.3)
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def save(m, hist: dict, out: Path) -> dict[str, Path]:
    """Write the checkpoint, the history and the plot into `out`; {what: path} of what was written."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"checkpoint": out / "checkpoint.zip", "history": out / "history.json"}
    m.save_states(str(paths["checkpoint"]))
    paths["history"].write_text(json.dumps(hist, indent=1))
    png = plot(hist, out / "training.png")
    if png is not None:
        paths["plot"] = png
    return paths


def onnx_round_trip(m, dev, x_test: np.ndarray, y_test: np.ndarray, out: Path) -> bool:
    """Export the trained CNN to ONNX, run it in onnxruntime and import it back with sonnx (onnx_roundtrip.py);
    False when their outputs differ from SINGA's. Skipped, with a note, where singa-onnx is not installed."""
    try:
        import onnx_roundtrip
    except ImportError as exc:
        print(f"ONNX round trip skipped: {exc} (pip install singa-onnx onnxruntime)")
        return True
    return onnx_roundtrip.run(m, dev, x_test, y_test, out)["ok"]


def main(argv=None) -> int:
    args = parse_args(argv)
    dev = device.get_device(args.device) if args.device else device.get_default_device()
    t0 = time.perf_counter()
    arrays = load_data(args)
    x_train, _, x_test, _ = arrays
    print(f"device {dev.name}: {dev.description()}")
    print(f"data: {len(x_train)} training and {len(x_test)} held-out images of {x_train.shape[1:]} "
          f"({'MNIST ' + str(args.mnist) if args.mnist else 'scikit-learn digits resized to 28x28'})")
    m, tx, ty = build_model(dev, args)
    mode = "eager" if args.eager else "graph"
    print(f"model: MNIST CNN, {mode} mode, batch {args.batch_size}, SGD lr {args.lr} momentum {args.momentum}")
    t_train = time.perf_counter()
    hist = train(m, dev, tx, ty, arrays, args)
    train_seconds = time.perf_counter() - t_train
    acc = hist["test_acc"][-1]
    hist.update(device=dev.name, mode=mode, train_seconds=train_seconds, held_out_accuracy=acc)
    paths = save(m, hist, args.out)
    print(f"held-out accuracy: {acc:.4f} ({len(x_test)} images)")
    print(f"training: {hist['steps']} steps in {train_seconds:.1f} s "
          f"({1e3 * train_seconds / max(hist['steps'], 1):.1f} ms per step incl. evaluation); "
          f"total {time.perf_counter() - t0:.1f} s")
    for what, p in paths.items():
        print(f"{what}: {p}")
    if not args.no_onnx and not onnx_round_trip(m, dev, x_test, arrays[3], args.out):
        print("FAILED: the exported ONNX model's outputs differ from SINGA's", file=sys.stderr)
        return 1
    if acc < args.min_accuracy:
        print(f"FAILED: held-out accuracy {acc:.4f} is below {args.min_accuracy}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
