"""The two autograd examples of the seed document (seeds/autograd.md), run as printed on small synthetic data.

Only the data, the device line and the training-loop bounds (which the seed leaves to the reader) are ours; the
model code is the seed's. Each test checks that training lowers the loss.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from singa import autograd, device, tensor
from singa.tensor import Tensor

HAVE_OPT = importlib.util.find_spec("singa.opt") is not None
HAVE_LAYER = importlib.util.find_spec("singa.layer") is not None


@pytest.fixture(autouse=True)
def _restore_training():
    old = autograd.training
    yield
    autograd.training = old


def _mlp_data(one_hot: bool):
    # two classes separated by a line, as in SINGA's examples/autograd/mlp.py
    rng = np.random.default_rng(0)
    data = rng.uniform(-1, 1, (64, 2)).astype(np.float32)
    label = (data[:, 1] > 0.5 * data[:, 0] + 0.1).astype(np.int32)
    if one_hot:
        label = np.eye(2, dtype=np.float32)[label]
    return data, label


def _seed_mlp(data, label, sgd, iterations=10):
    """The seed's 'Operation only' example, verbatim apart from the loss bookkeeping and the iteration count."""
    w0 = Tensor(shape=(2, 3), requires_grad=True, stores_grad=True)
    w0.gaussian(0.0, 0.1)
    b0 = Tensor(shape=(1, 3), requires_grad=True, stores_grad=True)
    b0.set_value(0.0)

    w1 = Tensor(shape=(3, 2), requires_grad=True, stores_grad=True)
    w1.gaussian(0.0, 0.1)
    b1 = Tensor(shape=(1, 2), requires_grad=True, stores_grad=True)
    b1.set_value(0.0)

    inputs = Tensor(data=data)  # data matrix
    target = Tensor(data=label)  # label vector
    autograd.training = True  # for training

    losses = []
    for _ in range(iterations):
        x = autograd.matmul(inputs, w0)  # matrix multiplication
        x = autograd.add_bias(x, b0)  # add the bias vector
        x = autograd.relu(x)  # ReLU activation operation

        x = autograd.matmul(x, w1)
        x = autograd.add_bias(x, b1)

        loss = autograd.softmax_cross_entropy(x, target)

        for p, g in autograd.backward(loss):
            sgd.update(p, g)
        losses.append(float(tensor.to_numpy(loss)[0]))
    return losses, (w0, b0, w1, b1)


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
    losses, params = _seed_mlp(data, label, sgd)
    assert all(np.isfinite(losses))
    assert losses[-1] < losses[0]
    assert params[1].shape == (1, 3)
    assert params[3].shape == (1, 2)


def test_seed_mlp_learns_with_manual_updates():
    device.get_default_device().set_rand_seed(1)
    data, label = _mlp_data(False)
    losses, _ = _seed_mlp(data, label, _ManualSGD(0.5), iterations=150)
    # from log(2) to a model that separates the two half-planes
    assert losses[0] == pytest.approx(np.log(2), abs=0.02)
    assert losses[-1] < 0.35
    assert all(b <= a + 1e-3 for a, b in zip(losses, losses[1:]))


def _images(n, rng):
    """28x28 one-channel images: class k has a bright 6x6 square at one of 10 positions, plus noise."""
    y = np.arange(n) % 10
    x = rng.normal(0, 0.3, (n, 1, 28, 28)).astype(np.float32)
    for i, k in enumerate(y):
        r, c = 2 + 12 * (k // 5), 1 + 5 * (k % 5)
        x[i, 0, r:r + 6, c:c + 5] += 2.0
    return x, y.astype(np.int32)


@pytest.mark.xfail(not (HAVE_LAYER and HAVE_OPT), reason="singa.layer not yet available", strict=False)
def test_seed_cnn_operation_and_layer():
    from singa import opt

    dev = device.get_default_device()
    dev.set_rand_seed(0)
    rng = np.random.default_rng(0)
    x_train, y_train = _images(12, rng)
    batch_sz = 6
    batch_number = len(x_train) // batch_sz
    epochs = 3
    sgd = opt.SGD(lr=0.001)

    # -- the seed's layers and forward function, as printed --
    conv1 = autograd.Conv2d(1, 32, 3, padding=1, bias=False)
    bn1 = autograd.BatchNorm2d(32)
    pooling1 = autograd.MaxPool2d(3, 1, padding=1)
    conv21 = autograd.Conv2d(32, 16, 3, padding=1)
    conv22 = autograd.Conv2d(32, 16, 3, padding=1)
    bn2 = autograd.BatchNorm2d(32)
    linear = autograd.Linear(32 * 28 * 28, 10)
    pooling2 = autograd.AvgPool2d(3, 1, padding=1)

    def forward(x, t):
        # x is the input data (a batch of images)
        # t is the label vector (a batch of integers)
        y = conv1(x)  # Conv layer
        y = autograd.relu(y)  # ReLU operation
        y = bn1(y)  # BN layer
        y = pooling1(y)  # Pooling Layer

        # two parallel convolution layers
        y1 = conv21(y)
        y2 = conv22(y)
        y = autograd.cat((y1, y2), 1)  # cat operation
        y = autograd.relu(y)  # ReLU operation
        y = bn2(y)
        y = pooling2(y)

        y = autograd.flatten(y)  # flatten operation
        y = linear(y)  # Linear layer
        loss = autograd.softmax_cross_entropy(y, t)  # operation
        return loss, y

    # -- the seed's training loop, as printed (plus loss bookkeeping) --
    epoch_loss = []
    autograd.training = True
    for epoch in range(epochs):  # noqa: B007 - the seed's loop, as printed
        total = 0.0
        for i in range(batch_number):
            inputs = tensor.Tensor(device=dev, data=x_train[
                                   i * batch_sz:(1 + i) * batch_sz], stores_grad=False)
            targets = tensor.Tensor(device=dev, data=y_train[
                                    i * batch_sz:(1 + i) * batch_sz], requires_grad=False, stores_grad=False)

            loss, y = forward(inputs, targets)  # forward the net

            for p, gp in autograd.backward(loss):  # auto backward
                sgd.update(p, gp)
            total += float(tensor.to_numpy(loss)[0])
        epoch_loss.append(total / batch_number)
        assert y.shape == (batch_sz, 10)

    assert all(np.isfinite(epoch_loss))
    assert epoch_loss[-1] < 0.8 * epoch_loss[0]

    # the trained layers run on another batch size in inference mode
    autograd.training = False
    loss, y = forward(tensor.Tensor(device=dev, data=x_train[:3]), tensor.Tensor(device=dev, data=y_train[:3]))
    assert y.shape == (3, 10)
    assert y.creator is None
