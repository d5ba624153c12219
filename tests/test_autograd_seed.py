"""The two autograd examples of the seed document (seeds/autograd.md), run as printed on small synthetic data.

Only the data, the device line and the training-loop bounds (which the seed leaves to the reader) are ours; the
model code is the seed's. Each test checks that training lowers the loss.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from helpers import images, seed_cnn, seed_cnn_step, seed_mlp

from singa import autograd, device, tensor

HAVE_OPT = importlib.util.find_spec("singa.opt") is not None
HAVE_LAYER = importlib.util.find_spec("singa.layer") is not None


def _mlp_data(one_hot: bool):
    # two classes separated by a line, as in SINGA's examples/autograd/mlp.py
    rng = np.random.default_rng(0)
    data = rng.uniform(-1, 1, (64, 2)).astype(np.float32)
    label = (data[:, 1] > 0.5 * data[:, 0] + 0.1).astype(np.int32)
    if one_hot:
        label = np.eye(2, dtype=np.float32)[label]
    return data, label


class _ManualSGD:
    """p -= lr * g through tensor operators, so the autograd example is checked even without singa.opt."""

    def __init__(self, lr):
        self.lr = lr

    def update(self, p, g):
        p -= g * self.lr


@pytest.mark.parametrize("one_hot", [False, True], ids=["int-labels", "one-hot"])
def test_seed_mlp_operation_only(one_hot):
    if not HAVE_OPT:
        pytest.xfail("singa.opt not yet available")
    from singa import opt

    device.get_default_device().set_rand_seed(0)
    data, label = _mlp_data(one_hot)
    sgd = opt.SGD(0.05)  # optimizer
    losses, params, _ = seed_mlp(data, label, sgd, 10)
    assert all(np.isfinite(losses))
    assert losses[-1] < losses[0]
    assert params[1].shape == (1, 3)
    assert params[3].shape == (1, 2)


def test_seed_mlp_learns_with_manual_updates():
    device.get_default_device().set_rand_seed(1)
    data, label = _mlp_data(False)
    losses, _, _ = seed_mlp(data, label, _ManualSGD(0.5), 150)
    # from log(2) to a model that separates the two half-planes
    assert losses[0] == pytest.approx(np.log(2), abs=0.02)
    assert losses[-1] < 0.35
    assert all(b <= a + 1e-3 for a, b in zip(losses, losses[1:]))


@pytest.mark.xfail(not (HAVE_LAYER and HAVE_OPT), reason="singa.layer not yet available", strict=False)
def test_seed_cnn_operation_and_layer():
    from singa import opt

    dev = device.get_default_device()
    dev.set_rand_seed(0)
    rng = np.random.default_rng(0)
    x_train, y_train = images(12, rng)
    batch_sz = 6
    batch_number = len(x_train) // batch_sz
    epochs = 3
    sgd = opt.SGD(lr=0.001)

    forward, _ = seed_cnn()  # the seed's layers and forward function, as printed

    # -- the seed's training loop, as printed (plus loss bookkeeping) --
    epoch_loss = []
    autograd.training = True
    for epoch in range(epochs):  # noqa: B007 - the seed's loop, as printed
        total = 0.0
        for i in range(batch_number):
            loss, y = seed_cnn_step(forward, sgd, dev, x_train, y_train, i, batch_sz)
            total += float(tensor.to_numpy(loss)[0])
        epoch_loss.append(total / batch_number)
        assert y.shape == (batch_sz, 10)

    assert all(np.isfinite(epoch_loss))
    assert epoch_loss[-1] < 0.8 * epoch_loss[0]

    # the trained layers run on another batch size in inference mode
    autograd.training = False
    loss, y = forward(tensor.Tensor(device=dev, data=x_train[:3]), tensor.Tensor(device=dev, data=y_train[:3]))
    assert y.shape == (3, 10)
    assert not y.requires_grad  # inference: nothing kept for backward
