"""Training on the OpenCL backend gives the CPU backend's losses.

The seeds' autograd examples (seeds/autograd.md: "Operation only" MLP, "Operation + Layer" CNN, the Model API MLP)
and the MNIST CNN of examples/mnist_cnn run 20 steps on `cpu` and on `opencl` from the same initial weights (copied
from the CPU run through numpy) and the same data; every step's loss must agree within 1e-4 relative. The OpenCL run
selects its device the way a user does: as the default device (what SINGA_DEVICE=opencl sets) for the seed code
that never names one, and by name for the models. Without an OpenCL platform the tests skip, saying so.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from singa import autograd, device, layer, model, opt, plugins, tensor
from singa.tensor import Tensor

ROOT = Path(__file__).resolve().parents[1]
STEPS = 20
RTOL = 1e-4


def _opencl_device():
    backend = plugins.registry().backends.get("opencl")
    if backend is None:
        pytest.skip("singa-backend-opencl is not installed")
    if backend.device_count() == 0:
        pytest.skip("no OpenCL platform: install pocl-opencl-icd")
    return device.get_device("opencl:0")


@pytest.fixture(scope="module")
def ocl():
    return _opencl_device()


@pytest.fixture(scope="module")
def cpu():
    if "cpu" not in plugins.registry().backends:
        pytest.skip("singa-backend-cpu is not installed")
    return device.get_device("cpu")


@pytest.fixture(autouse=True)
def _restore():
    training, default = autograd.training, device.get_default_device()
    yield
    autograd.training = training
    device.set_default_device(default)


def _agree(cpu_losses, ocl_losses, what: str) -> None:
    c, o = np.asarray(cpu_losses, np.float64), np.asarray(ocl_losses, np.float64)
    assert c.shape == o.shape == (STEPS,)
    assert np.isfinite(c).all()
    assert np.isfinite(o).all()
    rel = np.abs(o - c) / np.abs(c)
    assert rel.max() <= RTOL, (f"{what}: step {int(rel.argmax())} differs by {rel.max():.2e} relative\n"
                               f"cpu    {c}\nopencl {o}")
    assert c[-1] < c[0], f"{what}: the CPU run did not learn ({c[0]} -> {c[-1]})"


def _images(n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """28x28 one-channel images: class k has a bright patch at one of 10 places, plus noise."""
    y = np.arange(n) % 10
    x = rng.normal(0, 0.3, (n, 1, 28, 28)).astype(np.float32)
    for i, k in enumerate(y):
        r, c = 2 + 12 * (k // 5), 1 + 5 * (k % 5)
        x[i, 0, r:r + 6, c:c + 5] += 2.0
    return x, y.astype(np.int32)


# -- seeds/autograd.md, "Operation only" --------------------------------------------------------------------------


def _operation_only(dev, init):
    """The seed's MLP on the default device `dev`; `init` (numpy, from the CPU run) replaces the gaussian draws."""
    device.set_default_device(dev)
    dev.set_rand_seed(0)
    rng = np.random.default_rng(0)
    data = rng.uniform(-1, 1, (64, 2)).astype(np.float32)
    label = (data[:, 1] > 0.5 * data[:, 0] + 0.1).astype(np.int32)

    w0 = Tensor(shape=(2, 3), requires_grad=True, stores_grad=True)
    w0.gaussian(0.0, 0.1)
    b0 = Tensor(shape=(1, 3), requires_grad=True, stores_grad=True)
    b0.set_value(0.0)

    w1 = Tensor(shape=(3, 2), requires_grad=True, stores_grad=True)
    w1.gaussian(0.0, 0.1)
    b1 = Tensor(shape=(1, 2), requires_grad=True, stores_grad=True)
    b1.set_value(0.0)
    params = (w0, b0, w1, b1)
    if init is None:
        init = [tensor.to_numpy(p) for p in params]
    for p, value in zip(params, init):
        p.copy_from_numpy(value)
    assert all(p.device is dev for p in params)

    inputs = Tensor(data=data)  # data matrix
    target = Tensor(data=label)  # label vector
    autograd.training = True  # for training
    sgd = opt.SGD(0.05)  # optimizer

    losses = []
    for _ in range(STEPS):
        x = autograd.matmul(inputs, w0)  # matrix multiplication
        x = autograd.add_bias(x, b0)  # add the bias vector
        x = autograd.relu(x)  # ReLU activation operation

        x = autograd.matmul(x, w1)
        x = autograd.add_bias(x, b1)

        loss = autograd.softmax_cross_entropy(x, target)

        for p, g in autograd.backward(loss):
            sgd.update(p, g)
        losses.append(float(tensor.to_numpy(loss).reshape(-1)[0]))
    return init, losses


def test_seed_operation_only_mlp(cpu, ocl):
    init, c = _operation_only(cpu, None)
    _, o = _operation_only(ocl, init)
    _agree(c, o, "seed MLP (operations only)")


# -- seeds/autograd.md, "Operation + Layer" -----------------------------------------------------------------------


def _operation_and_layer(dev, init):
    device.set_default_device(dev)
    dev.set_rand_seed(0)
    x_train, y_train = _images(6 * STEPS, np.random.default_rng(1))
    batch_sz = 6
    sgd = opt.SGD(lr=0.001)

    conv1 = autograd.Conv2d(1, 32, 3, padding=1, bias=False)
    bn1 = autograd.BatchNorm2d(32)
    pooling1 = autograd.MaxPool2d(3, 1, padding=1)
    conv21 = autograd.Conv2d(32, 16, 3, padding=1)
    conv22 = autograd.Conv2d(32, 16, 3, padding=1)
    bn2 = autograd.BatchNorm2d(32)
    linear = autograd.Linear(32 * 28 * 28, 10)
    pooling2 = autograd.AvgPool2d(3, 1, padding=1)
    layers = {"conv1": conv1, "bn1": bn1, "conv21": conv21, "conv22": conv22, "bn2": bn2, "linear": linear}

    def forward(x, t):
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

    # layers create their parameters on their first call: one evaluation-mode pass, then the CPU run's values
    autograd.training = False
    forward(tensor.Tensor(device=dev, data=x_train[:batch_sz]), tensor.Tensor(device=dev, data=y_train[:batch_sz]))
    if init is None:
        init = {k: {n: tensor.to_numpy(t) for n, t in lay.get_states().items()} for k, lay in layers.items()}
    for k, lay in layers.items():
        lay.set_states(init[k])

    losses = []
    autograd.training = True
    for i in range(STEPS):
        inputs = tensor.Tensor(device=dev, data=x_train[
                               i * batch_sz:(1 + i) * batch_sz], stores_grad=False)
        targets = tensor.Tensor(device=dev, data=y_train[
                                i * batch_sz:(1 + i) * batch_sz], requires_grad=False, stores_grad=False)

        loss, y = forward(inputs, targets)  # forward the net

        for p, gp in autograd.backward(loss):  # auto backward
            sgd.update(p, gp)
        losses.append(float(tensor.to_numpy(loss).reshape(-1)[0]))
    return init, losses


def test_seed_operation_and_layer_cnn(cpu, ocl):
    init, c = _operation_and_layer(cpu, None)
    _, o = _operation_and_layer(ocl, init)
    _agree(c, o, "seed CNN (operations and layers)")


# -- seeds/autograd.md, "Using the Model API" -----------------------------------------------------------------------


class MLP(model.Model):  # the model is a subclass of Model

    def __init__(self, data_size=10, perceptron_size=100, num_classes=10):
        super().__init__()

        # init the operators, layers and other objects
        self.relu = layer.ReLU()
        self.linear1 = layer.Linear(perceptron_size)
        self.linear2 = layer.Linear(num_classes)
        self.softmax_cross_entropy = layer.SoftMaxCrossEntropy()

    def forward(self, inputs):  # define the forward function
        y = self.linear1(inputs)
        y = self.relu(y)
        y = self.linear2(y)
        return y  # noqa: RET504 - the seed's code, as printed

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.softmax_cross_entropy(out, y)
        self.optimizer(loss)
        return out, loss

    def set_optimizer(self, optimizer):  # attach an optimizer
        self.optimizer = optimizer


def _train_model(m, dev, init, x, y, batch_size, sample_shape, use_graph):
    tx = tensor.Tensor((batch_size, *sample_shape), dev, tensor.float32)
    ty = tensor.Tensor((batch_size,), dev, tensor.int32)
    m.compile([tx], is_train=True, use_graph=use_graph, sequential=False)
    if init is None:
        init = {k: tensor.to_numpy(t) for k, t in m.get_states().items()}
    else:
        m.set_states(init)
    losses = []
    for b in range(STEPS):
        tx.copy_from_numpy(x[b * batch_size:(b + 1) * batch_size])
        ty.copy_from_numpy(y[b * batch_size:(b + 1) * batch_size])
        out, loss = m(tx, ty)
        losses.append(float(tensor.to_numpy(loss).reshape(-1)[0]))
    return init, losses


def _model_mlp(dev, init):
    dev.set_rand_seed(0)
    rng = np.random.default_rng(2)
    centers = rng.normal(0, 1, (10, 10)).astype(np.float32)
    y = rng.integers(0, 10, 32 * STEPS).astype(np.int32)
    x = (centers[y] + rng.normal(0, 0.5, (len(y), 10))).astype(np.float32)
    m = MLP()
    m.set_optimizer(opt.SGD(lr=0.005, momentum=0.9, weight_decay=1e-5))
    return _train_model(m, dev, init, x, y, 32, (10,), use_graph=True)


def test_seed_model_api_mlp(cpu, ocl):
    init, c = _model_mlp(cpu, None)
    _, o = _model_mlp(ocl, init)
    _agree(c, o, "seed Model API MLP (graph mode)")


# -- examples/mnist_cnn ---------------------------------------------------------------------------------------------


def _mnist_model():
    path = ROOT / "examples" / "mnist_cnn" / "model.py"
    spec = importlib.util.spec_from_file_location("mnist_cnn_model", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.create_model(num_classes=10, num_channels=1)


def _mnist_cnn(dev, init, use_graph):
    dev.set_rand_seed(0)
    x, y = _images(64 * STEPS, np.random.default_rng(3))
    m = _mnist_model()
    m.set_optimizer(opt.SGD(lr=0.02, momentum=0.9, weight_decay=1e-5))  # examples/mnist_cnn/train.py's defaults
    return _train_model(m, dev, init, x, y, 64, (1, 28, 28), use_graph=use_graph)


@pytest.mark.parametrize("use_graph", [True, False], ids=["graph", "eager"])
def test_mnist_cnn(cpu, ocl, use_graph):
    init, c = _mnist_cnn(cpu, None, use_graph)
    _, o = _mnist_cnn(ocl, init, use_graph)
    _agree(c, o, f"MNIST CNN ({'graph' if use_graph else 'eager'} mode)")
