"""Runs under `mpiexec -n 2`: a DistOpt training loop in which rank 1 misbehaves, for the fault tests.

    mpiexec -n 2 python tests/distributed/fault_worker.py SCENARIO

raise        rank 1 raises at step 3 (the others are waiting in a collective)
kill         rank 1 is killed (SIGKILL) at step 3
hang         rank 1 sleeps instead of taking step 3 (run with a small SINGA_COMM_TIMEOUT)
shape        rank 1's model has a layer of another size (found by Model.compile's broadcast)
shape_loop   the same in a plain autograd loop without Model.compile (found at the first step)
dtype_loop   rank 1's parameter is float16, rank 0's float32 (found at the first step)
none         nobody misbehaves (the control run: it must succeed)
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

from singa import autograd, device, layer, model, opt, tensor


class Net(model.Model):
    def __init__(self, hidden: int):
        super().__init__()
        self.fc1 = layer.Linear(hidden)
        self.relu = layer.ReLU()
        self.fc2 = layer.Linear(3)
        self.loss_fn = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))

    def train_one_batch(self, x, y):
        loss = self.loss_fn(self.forward(x), y)
        self.optimizer(loss)
        return loss

    def set_optimizer(self, o):
        self.optimizer = o


def misbehave(scenario: str, rank: int, step: int) -> None:
    if rank != 1 or step != 3:
        return
    if scenario == "raise":
        raise RuntimeError("rank 1 failed on purpose at step 3")
    if scenario == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if scenario == "hang":
        time.sleep(600)


def model_loop(scenario: str, dist: opt.DistOpt, dev) -> None:
    rank = dist.global_rank
    m = Net(17 if scenario == "shape" and rank == 1 else 16)
    m.set_optimizer(dist)
    tx = tensor.Tensor((4, 5), dev)
    ty = tensor.Tensor((4,), dev, tensor.int32)
    m.compile([tx], is_train=True, use_graph=False)
    rng = np.random.default_rng(rank)
    for step in range(6):
        misbehave(scenario, rank, step)
        tx.copy_from_numpy(rng.standard_normal((4, 5)).astype(np.float32))
        ty.copy_from_numpy(rng.integers(0, 3, 4).astype(np.int32))
        m(tx, ty)


def plain_loop(scenario: str, dist: opt.DistOpt, dev) -> None:
    rank = dist.global_rank
    autograd.training = True
    shape = (5, 4) if scenario == "shape_loop" and rank == 1 else (4, 4)
    dt = tensor.float16 if scenario == "dtype_loop" and rank == 1 else tensor.float32
    w = tensor.Tensor(shape, dev, dt, requires_grad=True, stores_grad=True, name="w")
    w.gaussian(0.0, 0.1)
    for _ in range(3):
        x = tensor.from_numpy(np.ones((2, shape[0]), np.float32), dev)
        if dt != tensor.float32:
            x = x.as_type(dt)
        loss = autograd.reduce_sum(autograd.matmul(x, w), keepdims=0)
        dist.backward_and_update(loss)


def main(scenario: str) -> int:
    dev = device.get_default_device()
    dist = opt.DistOpt(opt.SGD(lr=0.1))
    if scenario.endswith("_loop"):
        plain_loop(scenario, dist, dev)
    else:
        model_loop(scenario, dist, dev)
    print(f"rank {dist.global_rank}: finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
