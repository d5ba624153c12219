"""Training step of a small MLP at batch 64: singa eager and graph mode against PyTorch CPU.

784-256-256-10 with ReLU on flattened 28×28 digits: the arithmetic is small (about 0.3 MFLOP per sample), so the step
time is mostly the path from a Python operator to a finished kernel call, the per-op overhead. Same initial weights,
data and SGD (momentum 0.9, lr 0.01) as the torch twin in _torch_models.py.

    python benchmarks/train_mlp.py [--quick]
    python benchmarks/train_mlp.py --profile [--graph]   # where singa's step time goes
"""

from __future__ import annotations

import _trainbench

from benchlib import Table, torch
from singa import layer

BATCH = 64
NUDGE = 1e-6
HIDDEN = 256


class MLP(_trainbench.Classifier):
    """Flatten, Linear 256, ReLU, Linear 256, ReLU, Linear 10 (the torch twin's attribute names)."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.flatten = layer.Flatten()
        self.linear1 = layer.Linear(HIDDEN)
        self.relu1 = layer.ReLU()
        self.linear2 = layer.Linear(HIDDEN)
        self.relu2 = layer.ReLU()
        self.linear3 = layer.Linear(num_classes)

    def forward(self, x):
        y = self.relu1(self.linear1(self.flatten(x)))
        y = self.relu2(self.linear2(y))
        return self.linear3(y)


def spec(batch: int = BATCH) -> _trainbench.Spec:
    make_torch = None
    if torch is not None:
        import _torch_models

        make_torch = _torch_models.MLP
    return _trainbench.Spec(
        title=f"Training step: MLP 784-{HIDDEN}-{HIDDEN}-10, batch {batch} (28×28 input; ms per step, lower is better)",
        script="train_mlp.py",
        make_singa=MLP,
        make_torch=make_torch,
        sample_shape=(1, 28, 28),
        batch=batch,
        timing=(10, 5, 50),
        quick_timing=(2, 2, 10),
        note="A step is about 25 operators forward, backward and update, each on arrays of at most 64×784 floats: "
             "the time is mostly per-operator overhead, which graph mode removes by replaying the recorded kernels.",
    )


def run(quick: bool = False) -> Table:
    """Small MLP training step: singa eager / graph vs torch; peak memory; loss agreement vs torch's own spread."""
    return _trainbench.measure(spec(), quick, nudge=NUDGE)


if __name__ == "__main__":
    _trainbench.main(run, spec)
