"""A short run of the demo (examples/mnist_cnn/train.py): two graph-mode steps on a small subset, then its outputs are
checked: finite losses, the JSON history, the PNG (where matplotlib is installed), and a checkpoint that restores the
trained weights into a fresh model (same held-out accuracy). The IDX path needs neither scikit-learn nor matplotlib."""

from __future__ import annotations

import gzip
import importlib.util
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from singa import data, device, tensor

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "mnist_cnn"


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def demo():
    return load("mnist_cnn_train", EXAMPLE / "train.py")


def write_idx(path: Path, arr: np.ndarray) -> None:
    code = {np.dtype(np.uint8): 0x08}[arr.dtype]
    head = struct.pack(">HBB", 0, code, arr.ndim) + b"".join(struct.pack(">I", d) for d in arr.shape)
    path.write_bytes(gzip.compress(head + arr.tobytes()))


def fake_mnist(folder: Path, n_train: int = 48, n_test: int = 20) -> None:
    """MNIST-format files of blurry class-dependent blobs (enough to run the demo on the IDX path)."""
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("test", n_test)):
        y = rng.integers(0, 10, n).astype(np.uint8)
        x = rng.integers(0, 40, (n, 28, 28)).astype(np.uint8)
        for i, c in enumerate(y):
            x[i, 2 * c + 2:2 * c + 8, 4:24] = 255
        write_idx(folder / (data.MNIST_FILES[f"{split}_images"] + ".gz"), x)
        write_idx(folder / (data.MNIST_FILES[f"{split}_labels"] + ".gz"), y)


def check_outputs(demo, out: Path, steps: int, args) -> None:
    hist = json.loads((out / "history.json").read_text())
    assert hist["steps"] == steps
    assert len(hist["step_loss"]) == steps
    assert np.all(np.isfinite(hist["step_loss"]))
    assert 0.0 <= hist["held_out_accuracy"] <= 1.0
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The checkpoint restores the trained weights into a fresh model: identical held-out predictions.
    dev = device.get_default_device()
    x_train, _, x_test, _ = demo.load_data(args)
    trained = np.asarray(hist["held_out_accuracy"])
    fresh, _, _ = demo.build_model(dev, demo.parse_args(["--eager", "--batch-size", str(args.batch_size),
                                                         "--seed", "123"]))
    fresh.load_states(str(out / "checkpoint.zip"))
    _, _, _, y_test = demo.load_data(args)
    assert demo.evaluate(fresh, dev, x_test, y_test) == pytest.approx(float(trained))


def test_demo_two_steps_on_idx_files(demo, tmp_path, capsys):
    mnist = tmp_path / "mnist"
    mnist.mkdir()
    fake_mnist(mnist)
    out = tmp_path / "out"
    argv = ["--mnist", str(mnist), "--epochs", "1", "--batch-size", "16", "--max-steps", "2", "--out", str(out)]
    assert demo.main(argv) == 0
    printed = capsys.readouterr()
    assert "held-out accuracy" in printed.out
    assert "epoch 1/1" in printed.err  # the progress line
    check_outputs(demo, out, 2, demo.parse_args(argv))


def test_demo_two_steps_on_digits(demo, tmp_path):
    pytest.importorskip("sklearn")
    out = tmp_path / "out"
    argv = ["--limit", "100", "--epochs", "1", "--batch-size", "16", "--max-steps", "2", "--out", str(out)]
    assert demo.main(argv) == 0
    check_outputs(demo, out, 2, demo.parse_args(argv))


def test_demo_fails_below_min_accuracy(demo, tmp_path):
    mnist = tmp_path / "mnist"
    mnist.mkdir()
    fake_mnist(mnist)
    argv = ["--mnist", str(mnist), "--epochs", "1", "--batch-size", "16", "--max-steps", "1", "--eager",
            "--out", str(tmp_path / "out"), "--min-accuracy", "1.01"]
    assert demo.main(argv) == 1


def test_progress_bar_redraws_on_a_terminal():
    demo = load("mnist_cnn_train_p", EXAMPLE / "train.py")

    class Tty:
        def __init__(self):
            self.text = ""

        def isatty(self):
            return True

        def write(self, s):
            self.text += s

        def flush(self):
            pass

    stream = Tty()
    bar = demo.Progress(4, "epoch 1/1", stream=stream, width=8)
    bar.update(2, "loss 1.0")
    bar.close(4, "done")
    assert stream.text.startswith("\repoch 1/1 [####....] 2/4 loss 1.0")
    assert "[########] 4/4 done" in stream.text
    assert stream.text.endswith("\n")


def test_tensor_placeholders_match_model_inputs(demo):
    # The placeholders the demo compiles with: float32 images and int32 labels of the batch size.
    m, tx, ty = demo.build_model(device.get_default_device(), demo.parse_args(["--eager", "--batch-size", "8"]))
    assert tx.shape == (8, 1, 28, 28)
    assert tx.dtype == tensor.float32
    assert ty.shape == (8,)
    assert ty.dtype == tensor.int32
    names = set(m.get_params())
    assert {"conv1.W", "conv1.b", "conv2.W", "linear1.W", "linear2.b"} <= names
