"""The PyTorch twins of the training benchmarks' singa models, and the tools that give both the same weights.

The modules use the same attribute names as the singa models (`conv1`, `block3.conv2`, `linear2` ...), so that a
singa parameter name maps to a torch state_dict key by its last part alone: `W` -> `weight` (transposed for Linear,
whose singa weight is (in, out)), `b` -> `bias`, BatchNorm's `scale` -> `weight`, `bias`, `running_mean`/`running_var`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


class MnistCNN(nn.Module):
    """Conv 20@5x5, ReLU, MaxPool 2, Conv 50@5x5, ReLU, MaxPool 2, Flatten, Linear 500, ReLU, Linear 10."""

    def __init__(self, num_classes: int = 10, num_channels: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(num_channels, 20, 5)
        self.conv2 = nn.Conv2d(20, 50, 5)
        self.linear1 = nn.Linear(50 * 4 * 4, 500)
        self.linear2 = nn.Linear(500, num_classes)

    def forward(self, x):
        y = F.max_pool2d(F.relu(self.conv1(x)), 2, 2)
        y = F.max_pool2d(F.relu(self.conv2(y)), 2, 2)
        y = F.relu(self.linear1(torch.flatten(y, 1)))
        return self.linear2(y)


class MLP(nn.Module):
    """Flatten, Linear 256, ReLU, Linear 256, ReLU, Linear 10 (train_mlp.py's model)."""

    def __init__(self, num_classes: int = 10, hidden: int = 256):
        super().__init__()
        self.linear1 = nn.Linear(28 * 28, hidden)
        self.linear2 = nn.Linear(hidden, hidden)
        self.linear3 = nn.Linear(hidden, num_classes)

    def forward(self, x):
        y = F.relu(self.linear1(torch.flatten(x, 1)))
        y = F.relu(self.linear2(y))
        return self.linear3(y)


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN plus the shortcut (1x1 conv + BN when the shape changes), then ReLU."""

    def __init__(self, in_planes: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.has_shortcut = stride != 1 or in_planes != planes
        if self.has_shortcut:
            self.shortcut_conv = nn.Conv2d(in_planes, planes, 1, stride, bias=False)
            self.shortcut_bn = nn.BatchNorm2d(planes)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        s = self.shortcut_bn(self.shortcut_conv(x)) if self.has_shortcut else x
        return F.relu(y + s)


# (planes, stride of the first block) of the four stages; two BasicBlocks each
RESNET18_STAGES = [(64, 1), (128, 2), (256, 2), (512, 2)]


class ResNet18(nn.Module):
    """CIFAR-style ResNet-18: 3x3 stem (no max-pool), stages 64/128/256/512 of [2, 2, 2, 2] BasicBlocks, 4x4 average
    pool, Linear 512 -> classes. Blocks are attributes block0..block7 (the singa model's names)."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        in_planes, i = 64, 0
        for planes, stride in RESNET18_STAGES:
            for s in (stride, 1):
                setattr(self, f"block{i}", BasicBlock(in_planes, planes, s))
                in_planes, i = planes, i + 1
        self.num_blocks = i
        self.linear = nn.Linear(512, num_classes)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        for i in range(self.num_blocks):
            y = getattr(self, f"block{i}")(y)
        y = F.avg_pool2d(y, 4)
        return self.linear(torch.flatten(y, 1))


_SUFFIX = {"W": "weight", "b": "bias", "scale": "weight", "bias": "bias",
           "running_mean": "running_mean", "running_var": "running_var"}


def torch_key(singa_name: str) -> str:
    """The torch state_dict key of a singa parameter or state name ('block0.bn1.scale' -> 'block0.bn1.weight')."""
    head, _, last = singa_name.rpartition(".")
    if last not in _SUFFIX:
        raise KeyError(f"no torch counterpart known for singa name {singa_name!r}")
    return f"{head}.{_SUFFIX[last]}" if head else _SUFFIX[last]


def load_singa_weights(module: nn.Module, arrays: dict[str, np.ndarray]) -> None:
    """Copy singa's parameters and states (name -> numpy array) into `module`; every torch tensor must be covered."""
    state = module.state_dict()
    todo = {k for k, v in state.items() if v.dtype.is_floating_point}
    for name, arr in arrays.items():
        key = torch_key(name)
        if key not in state:
            raise KeyError(f"singa {name!r} -> torch {key!r}, which {type(module).__name__} does not have")
        target = state[key]
        arr = np.asarray(arr, dtype=np.float32)
        if arr.ndim == 2 and name.endswith(".W") and isinstance(_owner(module, key), nn.Linear):
            arr = arr.T  # singa Linear W is (in, out); torch's weight is (out, in)
        if tuple(arr.shape) != tuple(target.shape):
            raise ValueError(f"singa {name!r} has shape {arr.shape}, torch {key!r} has {tuple(target.shape)}")
        with torch.no_grad():
            target.copy_(torch.from_numpy(np.ascontiguousarray(arr)))
        todo.discard(key)
    if todo:
        raise KeyError(f"torch tensors not set from singa: {sorted(todo)}")


def _owner(module: nn.Module, key: str) -> nn.Module:
    return module.get_submodule(key.rpartition(".")[0])


def nudge(module: nn.Module, eps: float, seed: int = 0) -> None:
    """Add eps * N(0, 1) to every parameter (the spread of PyTorch against itself from almost the same start)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * eps)


def train_steps(module: nn.Module, batches, lr: float = 0.01, momentum: float = 0.9) -> list[float]:
    """Losses of one SGD step on each (x, y) numpy batch, in order (the loss before each step's update)."""
    opt = torch.optim.SGD(module.parameters(), lr=lr, momentum=momentum)
    module.train()
    losses = []
    for x, y in batches:
        loss = train_step(module, opt, torch.from_numpy(x), torch.from_numpy(y.astype(np.int64)))
        losses.append(float(loss))
    return losses


def train_step(module: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(module(x), y)
    loss.backward()
    opt.step()
    return loss.detach()
