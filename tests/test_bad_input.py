"""Bad data from a careless user: copies that do not fit, impossible shapes, labels out of range, bad device specs.

Each case must raise an error that names what is wrong (the sizes, the shape, the label and its position), never
compute with stale or wrapped values.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import MLP

from singa import device, opt, tensor
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
