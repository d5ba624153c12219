"""Bad data from a careless user: copies that do not fit, impossible shapes, labels out of range, bad device specs.

Each case must raise an error that names what is wrong (the sizes, the shape, the label and its position), never
compute with stale or wrapped values.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import MLP

from singa import autograd, device, layer, model, ops, opt, tensor
from singa.tensor import Tensor

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")


@pytest.fixture(scope="module")
def dev():
    return device.get_default_device()


# -- copies into existing tensors must match their size ------------------------------------------------------------


def test_copy_from_numpy_refuses_a_short_array(dev):
    t = tensor.from_numpy(np.full((3, 4), 9, np.float32), dev)
    with pytest.raises(ValueError, match=r"5 values for a tensor of shape \(3, 4\) \(12 elements\)"):
        t.copy_from_numpy(np.arange(5, dtype=np.float32))
    assert np.array_equal(t.to_numpy(), np.full((3, 4), 9, np.float32))  # untouched
    with pytest.raises(ValueError, match="13 values"):
        t.copy_from_numpy(np.arange(13, dtype=np.float32))
    with pytest.raises(ValueError, match="13 values"):
        tensor.copy_from_numpy(t, np.arange(13, dtype=np.float32))


def test_copy_from_numpy_same_size_any_shape_and_offsets(dev):
    t = tensor.Tensor((3, 4), dev)
    t.copy_from_numpy(np.arange(12, dtype=np.float32))  # same size, other shape: row-major order
    assert np.array_equal(t.to_numpy(), np.arange(12, dtype=np.float32).reshape(3, 4))
    t.copy_from_numpy(np.array([-1, -2], np.float32), offset=5)  # from an offset: any number that fits
    assert t.to_numpy().ravel()[4:8].tolist() == [4, -1, -2, 7]
    with pytest.raises(ValueError, match="at offset 11 do not fit"):
        t.copy_from_numpy(np.array([1, 2], np.float32), offset=11)
    with pytest.raises(ValueError, match="at offset -1"):
        t.copy_from_numpy(np.array([1], np.float32), offset=-1)
    with pytest.raises(TypeError, match="offset must be an integer"):
        t.copy_from_numpy(np.array([1], np.float32), offset=1.5)


def test_copy_from_tensor_and_copy_data_check_sizes(dev):
    t = tensor.Tensor((3, 4), dev)
    short = tensor.from_numpy(np.ones(5, np.float32), dev)
    with pytest.raises(ValueError, match=r"5 values for a tensor of shape \(3, 4\)"):
        t.copy_from(short)
    with pytest.raises(ValueError, match=r"source shape \(5,\) and destination shape \(3, 4\)"):
        t.copy_data(short)
    t.copy_from(short, offset=7)
    assert t.to_numpy().ravel().tolist() == [0] * 7 + [1] * 5


def test_set_value_with_arrays_broadcasts_or_refuses(dev):
    t = tensor.Tensor((3, 4), dev)
    with pytest.raises(ValueError, match=r"\(5,\).*\(3, 4\)"):
        t.set_value(np.arange(5, dtype=np.float32))
    row = np.arange(4, dtype=np.float32)
    t.set_value(row)  # broadcast like numpy's t[...] = row
    assert np.array_equal(t.to_numpy(), np.broadcast_to(row, (3, 4)))
    t.set_value(tensor.from_numpy(np.full((3, 1), 2, np.float32), dev))
    assert np.array_equal(t.to_numpy(), np.full((3, 4), 2, np.float32))
    with pytest.raises(ValueError, match=r"\(2,\).*\(3, 4\)"):
        t.set_value([1.0, 2.0])
    t.set_value(7)
    assert np.array_equal(t.to_numpy(), np.full((3, 4), 7, np.float32))


def test_a_short_last_batch_never_trains_on_stale_rows(dev):
    """The documented loop copies each batch into compile's placeholders: a short last batch is an error."""
    m = MLP(data_size=4, perceptron_size=8, num_classes=3)
    m.set_optimizer(opt.SGD(lr=0.1))
    tx = tensor.Tensor((8, 4), dev)
    ty = tensor.Tensor((8,), dev, tensor.int32)
    m.compile([tx], is_train=True, use_graph=True)
    rng = np.random.default_rng(0)
    tx.copy_from_numpy(rng.standard_normal((8, 4)).astype(np.float32))
    ty.copy_from_numpy(rng.integers(0, 3, 8).astype(np.int32))
    m(tx, ty)
    with pytest.raises(ValueError, match=r"20 values for a tensor of shape \(8, 4\)"):
        tx.copy_from_numpy(rng.standard_normal((5, 4)).astype(np.float32))
    with pytest.raises(ValueError, match=r"5 values for a tensor of shape \(8,\)"):
        ty.copy_from_numpy(rng.integers(0, 3, 5).astype(np.int32))


# -- constructors: integer dimensions, byte sizes that fit, device specs ------------------------------------------


@pytest.mark.parametrize("make", [
    lambda s, d: Tensor(s, d),
    lambda s, d: tensor.zeros(s, d),
    lambda s, d: tensor.ones(s, d),
    lambda s, d: tensor.random(s, d),
    lambda s, d: tensor.full(s, 1.0, d),
], ids=["Tensor", "zeros", "ones", "random", "full"])
def test_constructors_refuse_non_integer_dims(dev, make):
    for shape in [(2.5, 3), (2, 3.0), ("2", 3), (None,)]:
        with pytest.raises(TypeError, match="shape must be a sequence of integers"):
            make(shape, dev)
    assert make((np.int64(2), 3), dev).shape == (2, 3)


def test_reshape_refuses_non_integer_dims(dev):
    t = tensor.Tensor((3, 4), dev)
    with pytest.raises(TypeError, match="shape must be a sequence of integers"):
        t.reshape((2.5, 4.8))


@pytest.mark.parametrize("shape", [(2**40, 2**40), (2**31, 2**31), (2**62,), (2**21, 2**21, 2**21)])
@pytest.mark.parametrize("make", [lambda s, d: Tensor(s, d), lambda s, d: tensor.zeros(s, d)], ids=["Tensor", "zeros"])
def test_byte_size_overflow_names_the_shape(dev, shape, make):
    with pytest.raises(ValueError, match=rf"shape \({shape[0]}, .*needs \d+ bytes|shape \({shape[0]},\) .*needs"):
        make(shape, dev)


def test_memory_the_device_cannot_give_names_the_shape(dev):
    shape = (2**20, 2**20, 2**10)  # 4 PiB: fits a 64-bit size, not any machine
    with pytest.raises(MemoryError, match=r"shape \(1048576, 1048576, 1024\)"):
        Tensor(shape, dev)


@pytest.mark.parametrize("spec", ["cpu:", "cpu:abc", "cpu:-1", "cpu: 0", "cpu:1_0", ":0", "cpu:+0"])
def test_bad_device_specs_are_errors(spec, monkeypatch):
    with pytest.raises(ValueError, match="device"):
        device.parse_device_spec(spec)
    monkeypatch.setenv("SINGA_DEVICE", spec)
    monkeypatch.setattr(device, "_default", None)
    with pytest.raises(ValueError, match=repr(spec).replace("+", r"\+")):
        device.get_default_device()


def test_good_device_specs():
    assert device.parse_device_spec("cpu") == ("cpu", 0)
    assert device.parse_device_spec(" CPU:0 ") == ("cpu", 0)
    assert device.parse_device_spec("cuda:12") == ("cuda", 12)


# -- class labels: integers in [0, classes), on every backend, eager and graph mode ---------------------------------


def _backends() -> list[str]:
    return [d.name for d in device.list_devices()]


class _Classifier(model.Model):
    def __init__(self, loss: str) -> None:
        super().__init__()
        self.fc = layer.Linear(5)
        self.loss = layer.SoftMaxCrossEntropy() if loss == "softmax_cross_entropy" else layer.CrossEntropy()
        self.softmax = loss != "softmax_cross_entropy"

    def forward(self, x):
        y = self.fc(x)
        return autograd.softmax(y) if self.softmax else y

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


BAD_LABELS = [
    (np.int32, [0, 4, -1, 2], r"label -1 at position 2 is outside \[0, 5\)"),
    (np.int32, [0, 5, 1, 2], r"label 5 at position 1 is outside \[0, 5\)"),
    (np.float32, [0, 1, 2, 2.5], r"label 2.5 at position 3 is not a whole number"),
    (np.float32, [0, -0.5, 2, 2], r"label -0.5 at position 1 is not a whole number"),
    (np.float32, [0, 1, -1, 2], r"label -1 at position 2 is outside \[0, 5\)"),
    (np.float32, [np.nan, 1, 1, 2], r"label nan at position 0 is not a whole number"),
]


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("loss", ["softmax_cross_entropy", "cross_entropy"])
@pytest.mark.parametrize(("dtype", "labels", "message"), BAD_LABELS)
def test_bad_labels_eager(backend, loss, dtype, labels, message):
    dev = device.get_device(backend)
    x = tensor.from_numpy(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32), dev)
    t = tensor.from_numpy(np.array(labels, dtype), dev)
    autograd.training = True
    w = tensor.from_numpy(np.ones((3, 5), np.float32), dev)
    w.requires_grad = w.stores_grad = True
    y = autograd.matmul(x, w)
    if loss == "softmax_cross_entropy":
        with pytest.raises((IndexError, ValueError), match=message):
            autograd.softmax_cross_entropy(y, t)
    else:
        p = autograd.softmax(y)
        with pytest.raises((IndexError, ValueError), match=message):
            autograd.cross_entropy(p, t)


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("loss", ["softmax_cross_entropy", "cross_entropy"])
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_bad_labels_graph_mode(backend, loss, dtype):
    """The check is part of the recorded step: a replay with a bad label raises too (and good steps still run)."""
    dev = device.get_device(backend)
    m = _Classifier(loss)
    m.optimizer = opt.SGD(lr=0.1)
    tx = tensor.Tensor((4, 3), dev)
    ty = tensor.Tensor((4,), dev, tensor.int32 if dtype == np.int32 else tensor.float32)
    m.compile([tx], is_train=True, use_graph=True)
    tx.copy_from_numpy(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32))
    good = np.array([0, 1, 2, 3], dtype)
    for _ in range(2):  # record, then replay
        ty.copy_from_numpy(good)
        m(tx, ty)
    assert m.graph_summary() is not None, "the step was not recorded"
    before = {k: v.to_numpy() for k, v in m.get_params().items()}
    for labels, message in [([0, 1, -1, 3], r"label -1 at position 2 is outside \[0, 5\)"),
                            ([0, 1, 2, 7], r"label 7 at position 3 is outside \[0, 5\)")]:
        ty.copy_from_numpy(np.array(labels, dtype))
        with pytest.raises(IndexError, match=message):
            m(tx, ty)
    if dtype == np.float32:
        ty.copy_from_numpy(np.array([0, 1.5, 2, 3], dtype))
        with pytest.raises(ValueError, match=r"label 1.5 at position 1 is not a whole number"):
            m(tx, ty)
    for k, v in m.get_params().items():  # the failed steps never reached the update
        assert np.array_equal(v.to_numpy(), before[k]), k
    ty.copy_from_numpy(good)
    m(tx, ty)
    assert m.graph_summary() is not None


@pytest.mark.parametrize("backend", _backends())
def test_ops_softmax_cross_entropy_checks_labels(backend):
    dev = device.get_device(backend)
    x = tensor.from_numpy(np.zeros((3, 4), np.float32), dev)
    t = tensor.from_numpy(np.array([1, 2, -2], np.int64), dev)
    with pytest.raises(IndexError, match=r"softmax_cross_entropy: label -2 at position 2 is outside \[0, 4\)"):
        ops.softmax_cross_entropy(x, t)
    with pytest.raises(IndexError, match=r"softmax_cross_entropy_backward: label -2 at position 2"):
        ops.softmax_cross_entropy_backward(1.0, x, t)
