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
from helpers import MLP, images, seed_cnn, seed_cnn_step, seed_mlp

from singa import autograd, device, opt, plugins, tensor

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
def _restore_default_device():
    default = device.get_default_device()
    yield
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


# -- seeds/autograd.md, "Operation only" --------------------------------------------------------------------------


def _operation_only(dev, init):
    """The seed's MLP on the default device `dev`; `init` (numpy, from the CPU run) replaces the gaussian draws."""
    device.set_default_device(dev)
    dev.set_rand_seed(0)
    rng = np.random.default_rng(0)
    data = rng.uniform(-1, 1, (64, 2)).astype(np.float32)
    label = (data[:, 1] > 0.5 * data[:, 0] + 0.1).astype(np.int32)
    losses, params, init = seed_mlp(data, label, opt.SGD(0.05), STEPS, init)
    assert all(p.device is dev for p in params)
    return init, losses


def test_seed_operation_only_mlp(cpu, ocl):
    init, c = _operation_only(cpu, None)
    _, o = _operation_only(ocl, init)
    _agree(c, o, "seed MLP (operations only)")


# -- seeds/autograd.md, "Operation + Layer" -----------------------------------------------------------------------


def _operation_and_layer(dev, init):
    device.set_default_device(dev)
    dev.set_rand_seed(0)
    x_train, y_train = images(6 * STEPS, np.random.default_rng(1))
    batch_sz = 6
    sgd = opt.SGD(lr=0.001)

    forward, layers = seed_cnn()

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
        loss, _ = seed_cnn_step(forward, sgd, dev, x_train, y_train, i, batch_sz)
        losses.append(float(tensor.to_numpy(loss).reshape(-1)[0]))
    return init, losses


def test_seed_operation_and_layer_cnn(cpu, ocl):
    init, c = _operation_and_layer(cpu, None)
    _, o = _operation_and_layer(ocl, init)
    _agree(c, o, "seed CNN (operations and layers)")


# -- seeds/autograd.md, "Using the Model API" -----------------------------------------------------------------------


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
    x, y = images(64 * STEPS, np.random.default_rng(3))
    m = _mnist_model()
    m.set_optimizer(opt.SGD(lr=0.02, momentum=0.9, weight_decay=1e-5))  # examples/mnist_cnn/train.py's defaults
    return _train_model(m, dev, init, x, y, 64, (1, 28, 28), use_graph=use_graph)


@pytest.mark.parametrize("use_graph", [True, False], ids=["graph", "eager"])
def test_mnist_cnn(cpu, ocl, use_graph):
    init, c = _mnist_cnn(cpu, None, use_graph)
    _, o = _mnist_cnn(ocl, init, use_graph)
    _agree(c, o, f"MNIST CNN ({'graph' if use_graph else 'eager'} mode)")
