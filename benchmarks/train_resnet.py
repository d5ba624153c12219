"""Training step of a CIFAR-style ResNet-18 at batch 32: singa eager and graph mode against PyTorch CPU.

3×32×32 input, 3×3 stem without max-pool, BasicBlocks of 64/128/256/512 channels ([2, 2, 2, 2]), BatchNorm, 4×4
average pool, Linear to 10 classes. Same initial weights, data and SGD (momentum 0.9, lr 0.01) as the torch twin in
_torch_models.py. The loss agreement is read against PyTorch's own spread: torch run again with its initial weights
nudged by 1e-6.

    python benchmarks/train_resnet.py [--quick]
    python benchmarks/train_resnet.py --profile [--graph]   # where singa's step time goes, by kernel
"""

from __future__ import annotations

import _trainbench

from benchlib import Table, torch
from singa import layer

BATCH = 32
NUDGE = 1e-6
STAGES = [(64, 1), (128, 2), (256, 2), (512, 2)]  # (channels, stride of the stage's first block)


class BasicBlock(layer.Layer):
    """conv3x3-BN-ReLU-conv3x3-BN plus the shortcut (1x1 conv + BN when the shape changes), then ReLU."""

    def __init__(self, planes: int, stride: int, shortcut: bool):
        super().__init__()
        self.conv1 = layer.Conv2d(planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = layer.BatchNorm2d()
        self.relu1 = layer.ReLU()
        self.conv2 = layer.Conv2d(planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = layer.BatchNorm2d()
        self.has_shortcut = shortcut
        if shortcut:
            self.shortcut_conv = layer.Conv2d(planes, 1, stride=stride, bias=False)
            self.shortcut_bn = layer.BatchNorm2d()
        self.add = layer.Add()
        self.relu2 = layer.ReLU()

    def forward(self, x):
        y = self.relu1(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        s = self.shortcut_bn(self.shortcut_conv(x)) if self.has_shortcut else x
        return self.relu2(self.add(y, s))


class ResNet18(_trainbench.Classifier):
    """CIFAR-style ResNet-18; blocks are attributes block0..block7 (the torch twin's names)."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = layer.Conv2d(64, 3, stride=1, padding=1, bias=False)
        self.bn1 = layer.BatchNorm2d()
        self.relu = layer.ReLU()
        in_planes, i = 64, 0
        for planes, stride in STAGES:
            for s in (stride, 1):
                setattr(self, f"block{i}", BasicBlock(planes, s, shortcut=s != 1 or in_planes != planes))
                in_planes, i = planes, i + 1
        self.num_blocks = i
        self.pool = layer.AvgPool2d(4, 4)
        self.flatten = layer.Flatten()
        self.linear = layer.Linear(num_classes)

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        for i in range(self.num_blocks):
            y = getattr(self, f"block{i}")(y)
        return self.linear(self.flatten(self.pool(y)))


def spec(batch: int = BATCH) -> _trainbench.Spec:
    make_torch = None
    if torch is not None:
        import _torch_models

        make_torch = _torch_models.ResNet18
    return _trainbench.Spec(
        title=f"Training step: ResNet-18 (CIFAR-style), batch {batch} (3×32×32 input; ms per step, lower is better)",
        script="train_resnet.py",
        make_singa=ResNet18,
        make_torch=make_torch,
        sample_shape=(3, 32, 32),
        batch=batch,
        timing=(2, 12, 3),
        note=("Kernels are about 97% of a step (the convolutions alone 90%: `python benchmarks/train_resnet.py "
              "--profile [--graph]`), so what graph mode saves here is eager mode's Python (autograd, checks, "
              "allocation): a few percent, against 15-20% on the MNIST CNN, whose kernels are small."),
    )


def run(quick: bool = False) -> list[Table]:
    """ResNet-18 training step: singa eager / graph vs torch; peak memory; loss agreement vs torch's own spread;
    then inference of the same network."""
    return [_trainbench.measure(spec(), quick, nudge=NUDGE), _trainbench.measure_inference(spec(), quick)]


if __name__ == "__main__":
    _trainbench.main(run, spec)
