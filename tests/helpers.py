"""Models, data and numpy references shared by several test modules (pytest puts this folder on sys.path).

The examples of seeds/autograd.md are kept here as printed, so that every test that runs one runs the same code.
The ONNX seeds' models are in onnx_helpers.py (it needs singa-onnx).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from singa import autograd, layer, model, tensor
from singa.tensor import Tensor

# -- data --------------------------------------------------------------------------------------------------------------


def images(n, rng):
    """28x28 one-channel images: class k has a bright 6x6 square at one of 10 positions, plus noise."""
    y = np.arange(n) % 10
    x = rng.normal(0, 0.3, (n, 1, 28, 28)).astype(np.float32)
    for i, k in enumerate(y):
        r, c = 2 + 12 * (k // 5), 1 + 5 * (k % 5)
        x[i, 0, r:r + 6, c:c + 5] += 2.0
    return x, y.astype(np.int32)


# -- numpy references --------------------------------------------------------------------------------------------------


def conv_ref(x, w, b=None, stride=(1, 1), pads=(0, 0, 0, 0), dilation=(1, 1), group=1) -> np.ndarray:
    """Direct-loop cross-correlation in float64; pads = (top, left, bottom, right)."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    n, c, _, _ = x.shape
    k, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    (sh, sw), (dh, dw) = stride, dilation
    oh = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    ow = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, k, oh, ow))
    per_group = k // group
    for o in range(k):
        g = o // per_group
        for i in range(oh):
            for j in range(ow):
                patch = xp[:, g * cg:(g + 1) * cg, i * sh:i * sh + dh * (kh - 1) + 1:dh,
                           j * sw:j * sw + dw * (kw - 1) + 1:dw]
                out[:, o, i, j] = (patch * w[o]).sum(axis=(1, 2, 3))
    if b is not None:
        out += np.asarray(b, np.float64)[None, :, None, None]
    return out


# -- seeds/autograd.md, "Operation only" -------------------------------------------------------------------------------


def seed_mlp(data, label, sgd, iterations, init=None):
    """The seed's MLP of autograd operations, as printed apart from the loss bookkeeping and the iteration count, on
    the default device. `init` (numpy values, e.g. from a run on another device) replaces the gaussian draws.
    Returns (losses, the parameters (w0, b0, w1, b1), their initial values as numpy arrays)."""
    w0 = Tensor(shape=(2, 3), requires_grad=True, stores_grad=True)
    w0.gaussian(0.0, 0.1)
    b0 = Tensor(shape=(1, 3), requires_grad=True, stores_grad=True)
    b0.set_value(0.0)

    w1 = Tensor(shape=(3, 2), requires_grad=True, stores_grad=True)
    w1.gaussian(0.0, 0.1)
    b1 = Tensor(shape=(1, 2), requires_grad=True, stores_grad=True)
    b1.set_value(0.0)
    params = (w0, b0, w1, b1)
    if init is not None:
        for p, value in zip(params, init):
            p.copy_from_numpy(value)
    init = [tensor.to_numpy(p) for p in params]

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
    return losses, params, init


# -- seeds/autograd.md, "Operation + Layer" ----------------------------------------------------------------------------


def seed_cnn():
    """The seed's CNN of layers and operations, as printed: (its forward function, its layers with parameters by
    name). Layers create their parameters at their first call."""
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

    return forward, {"conv1": conv1, "bn1": bn1, "conv21": conv21, "conv22": conv22, "bn2": bn2, "linear": linear}


def seed_cnn_step(forward, sgd, dev, x_train, y_train, i, batch_sz):
    """Batch i of the seed's CNN training loop, as printed: (loss, y)."""
    inputs = tensor.Tensor(device=dev, data=x_train[
                           i * batch_sz:(1 + i) * batch_sz], stores_grad=False)
    targets = tensor.Tensor(device=dev, data=y_train[
                            i * batch_sz:(1 + i) * batch_sz], requires_grad=False, stores_grad=False)

    loss, y = forward(inputs, targets)  # forward the net

    for p, gp in autograd.backward(loss):  # auto backward
        sgd.update(p, gp)
    return loss, y


# -- seeds/autograd.md, "Using the Model API" --------------------------------------------------------------------------


class MLP(model.Model):  # the model is a subclass of Model

    def __init__(self, data_size=10, perceptron_size=100, num_classes=10):
        super(MLP, self).__init__()  # noqa: UP008 - the seed's spelling

        # init the operators, layers and other objects
        self.relu = layer.ReLU()
        self.linear1 = layer.Linear(perceptron_size)
        self.linear2 = layer.Linear(num_classes)
        self.softmax_cross_entropy = layer.SoftMaxCrossEntropy()

    def forward(self, inputs):  # define the forward function
        y = self.linear1(inputs)
        y = self.relu(y)
        y = self.linear2(y)
        return y  # noqa: RET504 - as printed

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.softmax_cross_entropy(out, y)
        self.optimizer(loss)
        return out, loss

    def set_optimizer(self, optimizer):  # attach an optimizer
        self.optimizer = optimizer


# -- a small CNN for the Model tests -----------------------------------------------------------------------------------


class CNN(model.Model):
    """conv (no bias) -> batchnorm -> relu -> max pool -> conv -> relu -> avg pool -> dropout (unless 0) -> linear."""

    def __init__(self, channels=8, dropout=0.3, num_classes=5):
        super().__init__()
        self.conv1 = layer.Conv2d(channels, 3, padding=1, bias=False)
        self.bn1 = layer.BatchNorm2d()
        self.relu = layer.ReLU()
        self.pool1 = layer.MaxPool2d(2, 2)
        self.conv2 = layer.Conv2d(channels, 3, padding=1)
        self.pool2 = layer.AvgPool2d(2, 2)
        self.flat = layer.Flatten()
        self.drop = layer.Dropout(dropout) if dropout else None
        self.fc = layer.Linear(num_classes)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        y = self.pool1(self.relu(self.bn1(self.conv1(x))))
        y = self.flat(self.pool2(self.relu(self.conv2(y))))
        if self.drop is not None:
            y = self.drop(y)
        return self.fc(y)

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def run_threads(work: Callable[[int], None], n: int) -> list[BaseException]:
    """Run work(0) ... work(n - 1) in n threads at once; the exceptions any of them raised."""
    raised: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            raised.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return raised
