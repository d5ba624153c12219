"""Training step of SINGA's MNIST CNN at batch 64: singa eager and graph mode against PyTorch CPU.

Same model (examples/mnist_cnn/model.py and its torch twin), same initial weights, same batches, same SGD
(momentum 0.9, lr 0.01): step time, peak device memory, and the agreement of the losses over 20 steps, next to
PyTorch's own spread (torch again with its initial weights nudged by 1e-6).

    python benchmarks/train_cnn.py [--quick]
    python benchmarks/train_cnn.py --profile [--graph]   # where singa's step time goes, by kernel
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import _trainbench

from benchlib import Table, torch

MODEL_FILE = Path(__file__).resolve().parent.parent / "examples" / "mnist_cnn" / "model.py"
BATCH = 64
NUDGE = 1e-6  # PyTorch's own spread: torch again from initial weights moved by NUDGE·N(0, 1)


def load_example_model():
    """examples/mnist_cnn/model.py as a module (the demo's model is the benchmark's)."""
    spec = importlib.util.spec_from_file_location("mnist_cnn_model", MODEL_FILE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def spec(batch: int = BATCH) -> _trainbench.Spec:
    cnn = load_example_model()
    make_torch = None
    if torch is not None:
        import _torch_models

        make_torch = _torch_models.MnistCNN
    return _trainbench.Spec(
        title=f"Training step: MNIST CNN, batch {batch} (1×28×28 input; ms per step, lower is better)",
        script="train_cnn.py",
        make_singa=cnn.create_model,
        make_torch=make_torch,
        sample_shape=(1, 28, 28),
        batch=batch,
    )


def run(quick: bool = False) -> Table:
    """MNIST CNN training step: singa eager / graph vs torch; peak memory; loss agreement vs torch's own spread."""
    return _trainbench.measure(spec(), quick, nudge=NUDGE)


if __name__ == "__main__":
    _trainbench.main(run, spec)
