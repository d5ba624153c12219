"""singa.tensor and singa.ops against numpy, on the default device (SINGA_DEVICE picks it: hostmem, cpu, ...).

References are numpy in float64 where precision matters. Every operation is also run on non-contiguous operands
(transposed, stepped and offset views), on 0-d and empty shapes, and on each dtype where it is defined.
"""

from __future__ import annotations

import copy as copy_module
import inspect
import math
import pickle
import random

import numpy as np
import pytest
from helpers import conv_ref

from singa import autograd, device, dtypes, ops, tensor
from singa.backend import Device
from singa.fallback import philox_uniform
from singa.tensor import Tensor

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")

F32, F16, I32, I64, BOOL = tensor.float32, tensor.float16, tensor.int32, tensor.int64, tensor.bool
NP = {F32: np.float32, F16: np.float16, I32: np.int32, I64: np.int64, BOOL: np.bool_}
TOL = {F32: (1e-5, 1e-6), F16: (2e-3, 2e-3)}


@pytest.fixture(scope="module")
def dev() -> Device:
    return device.get_default_device()


class ScratchDevice(Device):
    """A second device with host bytearrays and no kernels of its own (everything runs through the fallback)."""

    backend_name = "scratch"
    kernels = {}

    def _raw_alloc(self, nbytes):
        return bytearray(nbytes)

    def _raw_free(self, handle):
        pass

    def _copy_from_host(self, handle, byte_offset, host):
        raw = host.view(np.uint8).reshape(-1)
        handle[byte_offset:byte_offset + raw.size] = raw.tobytes()

    def _copy_to_host(self, handle, byte_offset, host):
        raw = host.view(np.uint8).reshape(-1)
        raw[...] = np.frombuffer(handle, np.uint8, raw.size, byte_offset)

    def _copy_on_device(self, dst, dst_off, src, src_off, nbytes):
        dst[dst_off:dst_off + nbytes] = src[src_off:src_off + nbytes]


@pytest.fixture(scope="module")
def other() -> Device:
    return ScratchDevice(0)


def rng(seed=0):
    return np.random.default_rng(seed)


def T(x, dtype=None, device=None) -> Tensor:
    arr = np.asarray(x)
    if dtype is None:
        return Tensor(data=arr, device=device)
    return Tensor(data=arr, dtype=dtype, device=device)


def N(t: Tensor) -> np.ndarray:
    return tensor.to_numpy(t)


def check(t: Tensor, ref, dtype=None, rtol=None, atol=None):
    """t equals the float64 (or exact) reference, has its shape and the expected dtype."""
    ref = np.asarray(ref)
    assert isinstance(t, Tensor)
    got = N(t)
    assert got.shape == ref.shape, f"shape {got.shape} != {ref.shape}"
    if dtype is not None:
        assert t.dtype == dtype, f"dtype {dtypes.name(t.dtype)} != {dtypes.name(dtype)}"
    if t.dtype in (F32, F16):
        r, a = TOL[t.dtype]
        np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=rtol or r, atol=atol or a)
    else:
        np.testing.assert_array_equal(got, ref)


def layout(arr: np.ndarray, kind: str, dtype=None) -> Tensor:
    """A tensor with arr's values in another memory layout (a view of a bigger or transposed buffer)."""
    arr = np.asarray(arr)
    if kind == "contiguous" or arr.ndim == 0:
        t = T(arr, dtype)
    elif kind == "transposed":
        t = T(np.ascontiguousarray(arr.T), dtype).T()
    elif kind == "stepped":
        big = np.zeros(arr.shape[:-1] + (2 * arr.shape[-1],), arr.dtype)
        big[..., ::2] = arr
        t = T(big, dtype)[..., ::2]
    elif kind == "offset":
        big = np.zeros((arr.shape[0] + 1,) + arr.shape[1:], arr.dtype)
        big[1:] = arr
        t = T(big, dtype)[1:]
    else:
        raise AssertionError(kind)
    assert t.shape == arr.shape
    np.testing.assert_array_equal(N(t), arr.astype(N(t).dtype))
    return t


LAYOUTS = ["contiguous", "transposed", "stepped", "offset"]


def values(shape, dtype, low=-3.0, high=3.0, seed=0):
    g = rng(seed)
    if dtype == BOOL:
        return g.random(shape) < 0.5
    if dtype in (I32, I64):
        return g.integers(int(low), int(high) + 1, shape).astype(NP[dtype])
    return g.uniform(low, high, shape).astype(NP[dtype])


# -- construction ---------------------------------------------------------------------------------------------------


def test_dtype_codes():
    assert (tensor.float32, tensor.float16, tensor.int32) == (0, 1, 2)
    assert {tensor.int64, tensor.bool} == {dtypes.int64, dtypes.bool_}
    assert tensor.PlaceHolder is Tensor
    assert tensor.sizeof(F32) == 4
    assert tensor.sizeof(F16) == 2
    assert tensor.sizeof(I64) == 8
    assert tensor.product((2, 3, 4)) == 24


def test_constructor_defaults(dev):
    t = Tensor((2, 3))
    assert t.shape == (2, 3)
    assert t.strides == (3, 1)
    assert t.offset == 0
    assert t.dtype == F32
    assert t.device is dev
    assert t.buffer.device is dev
    assert t.requires_grad is True
    assert t.stores_grad is False
    assert t.creator is None
    assert t.name is None
    np.testing.assert_array_equal(N(t), np.zeros((2, 3), np.float32))
    assert t.is_dummy()


@pytest.mark.parametrize("dtype", [F32, F16, I32, I64, BOOL])
def test_constructor_shape_dtype(dtype):
    t = Tensor([3, 2], None, dtype, requires_grad=False, stores_grad=True, name="w")
    assert t.shape == (3, 2)
    assert t.dtype == dtype
    assert (t.requires_grad, t.stores_grad, t.name) == (False, True, "w")
    np.testing.assert_array_equal(N(t), np.zeros((3, 2), NP[dtype]))


@pytest.mark.parametrize(("data", "dtype", "np_dtype"), [
    (np.arange(6, dtype=np.float64).reshape(2, 3), F32, np.float32),  # float64 narrows
    (np.arange(6, dtype=np.float32), F32, np.float32),
    (np.arange(6, dtype=np.float16), F16, np.float16),
    (np.arange(6, dtype=np.int32), I32, np.int32),
    (np.arange(6, dtype=np.int64), I64, np.int64),
    (np.array([True, False]), BOOL, np.bool_),
    ([[1.5, 2.5]], F32, np.float32),
    ([1, 2, 3], I64, np.int64),
    (np.arange(4, dtype=np.uint8), I64, np.int64),  # widened losslessly
    (2.5, F32, np.float32),
])
def test_constructor_from_data_keeps_dtype(data, dtype, np_dtype):
    t = Tensor(data=data)
    ref = np.asarray(data).astype(np_dtype)
    assert t.shape == ref.shape
    assert t.dtype == dtype
    np.testing.assert_array_equal(N(t), ref)


def test_constructor_explicit_dtype_converts():
    t = Tensor(data=np.array([1, 2, 3]), dtype=tensor.float32)
    assert t.dtype == F32
    np.testing.assert_array_equal(N(t), [1.0, 2.0, 3.0])
    t = Tensor(data=[1.7, -1.7], dtype=tensor.int32)
    assert t.dtype == I32
    np.testing.assert_array_equal(N(t), [1, -1])
    assert Tensor(data=[1.0], dtype="float16").dtype == F16
    assert Tensor(data=[1.0], dtype=np.float16).dtype == F16
    assert Tensor((1,), dtype="int").dtype == I32


def test_constructor_data_with_shape():
    t = Tensor((3, 2), data=np.arange(6.0))
    np.testing.assert_array_equal(N(t), np.arange(6.0).reshape(3, 2))
    src = T([[1.0, 2.0]])
    t = Tensor(data=src)
    np.testing.assert_array_equal(N(t), [[1.0, 2.0]])
    assert t.buffer is not src.buffer


def test_constructor_device_spec(dev):
    t = Tensor((2,), device=dev.name)
    assert t.device is dev


def test_module_creators(dev):
    z = tensor.zeros((2, 3))
    o = tensor.ones((2, 3), dev)
    check(z, np.zeros((2, 3)), F32)
    check(o, np.ones((2, 3)), F32)
    x = T(np.arange(4, dtype=np.int32))
    check(tensor.zeros_like(x), np.zeros(4, np.int32), I32)
    check(tensor.ones_like(x), np.ones(4, np.int32), I32)
    f = tensor.full((2,), 7, dtype=I64)
    check(f, [7, 7], I64)
    dev.set_rand_seed(5)
    r = tensor.random((100,))
    a = N(r)
    assert a.dtype == np.float32
    assert a.min() >= 0.0
    assert a.max() < 1.0
    assert a.std() > 0.1


@pytest.mark.parametrize("dtype", [F32, F16, I32, I64, BOOL])
@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (4,), (2, 3, 4)])
def test_numpy_round_trip(dtype, shape):
    a = values(shape, dtype)
    t = Tensor(data=a)  # keeps the array's dtype, int64 too (tensor.from_numpy narrows it, as SINGA)
    assert t.dtype == dtype
    assert t.shape == shape
    back = tensor.to_numpy(t)
    assert back.dtype == a.dtype
    np.testing.assert_array_equal(back, a)
    np.testing.assert_array_equal(np.asarray(t), a)


def test_from_numpy_narrows_as_singa():
    """SINGA's from_numpy: float64 -> float32 and int64 -> int32; explicit dtypes and Tensor(data=) keep int64."""
    assert tensor.from_numpy(np.zeros(2)).dtype == F32
    t = tensor.from_numpy(np.array([[3, -4], [2**31 - 1, -(2**31)]]))  # numpy's default int64
    check(t, [[3, -4], [2**31 - 1, -(2**31)]], I32)
    check(tensor.from_numpy(np.array([7, 200], np.uint8)), [7, 200], I32)
    check(tensor.from_numpy(np.array([True, False])), [True, False], BOOL)
    assert Tensor(data=np.zeros(2, np.int64)).dtype == I64
    assert Tensor(data=np.zeros(2, np.int64), dtype=tensor.int64).dtype == I64
    assert ops.from_numpy(np.zeros(2, np.int64)).dtype == I64  # the core's (and ONNX's) path keeps int64
    with pytest.raises(ValueError, match=r"int64 values in \[0, 4294967296\] do not fit int32"):
        tensor.from_numpy(np.array([0, 2**32]))
    t = tensor.from_numpy(np.ones((2, 2), np.float32)[:, 0])  # non-contiguous host data
    np.testing.assert_array_equal(N(t), [1.0, 1.0])


# -- properties -----------------------------------------------------------------------------------------------------


def test_size_ndim_memsize_empty():
    t = Tensor((2, 3, 4), dtype=F16)
    assert t.ndim() == 3
    assert t.size() == 24
    assert t.memsize() == 48
    assert not t.is_empty()
    assert Tensor(()).is_empty()  # SINGA: a shape-() tensor is "empty"
    assert Tensor((0, 3)).is_empty()
    assert len(t) == 2
    with pytest.raises(TypeError):
        len(Tensor(()))


def test_is_transpose_and_contiguous():
    t = T(np.arange(6.0).reshape(2, 3))
    assert not t.is_transpose()
    assert t.T().is_transpose()
    assert t.T().transpose().is_transpose() is False
    assert t.contiguous() is t
    c = t.T().contiguous()
    assert not c.is_transpose()
    assert c.buffer is not t.buffer
    np.testing.assert_array_equal(N(c), np.arange(6.0).reshape(2, 3).T)
    assert tensor.contiguous(t) is t


def test_repr_item_scalars():
    t = T([[1.5, 2.0]])
    r = repr(t)
    assert "1.5" in r
    assert "float32" in r
    assert t.device.name in r
    s = T(3.25)
    assert s.item() == 3.25
    assert float(s) == 3.25
    assert int(T(7, I32)) == 7
    # SINGA's tensors have no truth value of their own: `if t:` is true for any tensor (scripts test existence)
    assert bool(T([1.0]))
    assert bool(T(0.0))
    assert bool(t)
    assert bool(Tensor((0,)))
    with pytest.raises(ValueError, match="2 elements"):
        t.item()


def test_iteration_and_hash():
    t = T(np.arange(6.0).reshape(3, 2))
    rows = list(t)
    assert len(rows) == 3
    np.testing.assert_array_equal(N(rows[2]), [4.0, 5.0])
    d = {t: 1}
    assert d[t] == 1
    assert t in {t}
    assert (t == None) is False  # noqa: E711 - identity fallback must not raise
    assert (t != None) is True  # noqa: E711


def test_is_dummy_with_creator():
    class Dummy:
        pass

    class Op:
        pass

    assert Tensor((1,), creator=Dummy()).is_dummy()
    assert not Tensor((1,), creator=Op()).is_dummy()


# -- element-wise arithmetic ----------------------------------------------------------------------------------------

BINARY = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply),
    "div": (lambda a, b: a / b, np.divide),
    "pow": (lambda a, b: a ** b, np.power),
}

SHAPE_PAIRS = [
    ((3, 4), (3, 4)),
    ((3, 4), (4,)),
    ((3, 1), (1, 4)),
    ((2, 3, 4), (3, 1)),
    ((), (3, 4)),
    ((3, 4), ()),
    ((), ()),
    ((0, 4), (4,)),
    ((2, 0), (2, 1)),
]


def _operands(name, dtype, sa, sb, seed=0):
    if name == "pow":
        return values(sa, dtype, 0.5, 2.0, seed), values(sb, dtype, -2.0, 2.0, seed + 1)
    if name == "div":
        return values(sa, dtype, -3, 3, seed), values(sb, dtype, 0.5, 3.0, seed + 1) * (
            np.where(values(sb, F32, -1, 1, seed + 2) < 0, -1, 1).astype(NP[dtype]))
    return values(sa, dtype, -3, 3, seed), values(sb, dtype, -3, 3, seed + 1)


@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize(("sa", "sb"), SHAPE_PAIRS, ids=str)
def test_binary_broadcast_float32(name, sa, sb):
    op, ref = BINARY[name]
    a, b = _operands(name, F32, sa, sb)
    check(op(T(a), T(b)), ref(a.astype(np.float64), b.astype(np.float64)), F32)
    check(getattr(ops, name)(T(a), T(b)), ref(a.astype(np.float64), b.astype(np.float64)), F32)


@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize("la", LAYOUTS)
@pytest.mark.parametrize("lb", LAYOUTS)
def test_binary_noncontiguous(name, la, lb):
    op, ref = BINARY[name]
    a, b = _operands(name, F32, (4, 5), (4, 5), seed=3)
    check(op(layout(a, la), layout(b, lb)), ref(a.astype(np.float64), b.astype(np.float64)), F32)
    # broadcast plus a strided operand
    check(op(layout(a, la), layout(b[:1], lb)), ref(a.astype(np.float64), b[:1].astype(np.float64)), F32)


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_float16(name):
    op, ref = BINARY[name]
    a, b = _operands(name, F16, (3, 4), (4,))
    want = ref(a.astype(np.float64), b.astype(np.float64))
    check(op(T(a), T(b)), want, F16, rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize("dtype", [I32, I64])
def test_binary_int_exact(dtype):
    a = np.array([[-7, 7, 5, 0], [9, -9, 3, 2]], NP[dtype])
    b = np.array([2, -2, 5, 3], NP[dtype])
    ta, tb = T(a), T(b)
    check(ta + tb, a + b, dtype)
    check(ta - tb, a - b, dtype)
    check(ta * tb, a * b, dtype)
    check(ta / tb, np.trunc(a / b).astype(NP[dtype]), dtype)  # C division: toward zero
    check(ta // tb, a // b, dtype)  # Python: floor
    check(ta % tb, a % b, dtype)
    check(ta * 3, a * 3, dtype)
    check(ta * 2.0, (a * 2).astype(np.float32), F32)  # a float scalar makes the result float (SINGA)
    check(10 - ta, 10 - a, dtype)
    check(ta + True, a + 1, dtype)
    big = np.array([2**40 + 3], np.int64)
    if dtype == I64:
        check(T(big) + 1, big + 1, I64)  # exact, no trip through float parameters


def test_int_division_by_zero_is_zero():
    a = T(np.array([5, -5, 0], np.int32))
    check(a / T(np.zeros(3, np.int32)), [0, 0, 0], I32)
    check(a // 0, [0, 0, 0], I32)


def test_floordiv_mod_float():
    a = np.array([-7.5, 7.5, 2.0, -0.5], np.float32)
    b = np.array([2.0, -2.0, 0.75, 3.0], np.float32)
    check(T(a) // T(b), np.floor_divide(a.astype(np.float64), b), F32)
    check(T(a) % T(b), np.mod(a.astype(np.float64), b), F32)
    check(T(a) // 2, np.floor(a / 2.0), F32)
    check(7 % T(b), np.mod(7.0, b.astype(np.float64)), F32)


@pytest.mark.parametrize("la", LAYOUTS)
def test_scalar_operands_and_reflected(la):
    a = values((3, 4), F32, 0.5, 2.0, seed=7)
    a64 = a.astype(np.float64)
    t = layout(a, la)
    check(t + 2, a64 + 2, F32)
    check(2 + t, a64 + 2, F32)
    check(t - 1.5, a64 - 1.5, F32)
    check(1.5 - t, 1.5 - a64, F32)
    check(t * 3, a64 * 3, F32)
    check(3 * t, a64 * 3, F32)
    check(t / 4, a64 / 4, F32)
    check(4 / t, 4 / a64, F32)
    check(t ** 2, a64 ** 2, F32)
    check(2 ** t, 2 ** a64, F32)
    check(-t, -a64, F32)
    check(+t, a64, F32)
    check(abs(t - 1), np.abs(a64 - 1), F32)
    check(t + np.float32(1), a64 + 1, F32)
    check(np.float64(2) * t, a64 * 2, F32)


def test_numpy_array_operands():
    a = values((2, 3), F32)
    b = np.arange(3.0)  # float64: same kind, adopts float32
    r = T(a) + b
    assert isinstance(r, Tensor)
    check(r, a.astype(np.float64) + b, F32)
    r = b - T(a)  # numpy defers to Tensor.__rsub__
    assert isinstance(r, Tensor)
    check(r, b - a.astype(np.float64), F32)


def test_binary_same_tensor_and_fresh_output():
    a = values((3, 3), F32)
    t = T(a)
    r = t + t
    assert r.buffer is not t.buffer
    check(r, 2 * a.astype(np.float64), F32)
    check(t, a, F32)


def test_maximum_minimum_where_clip():
    a = values((3, 4), F32, seed=1)
    b = values((4,), F32, seed=2)
    check(ops.maximum(T(a), T(b)), np.maximum(a, b), F32)
    check(ops.minimum(T(a), 0.0), np.minimum(a, 0.0), F32)
    cond = a > 0
    check(ops.where(T(cond), T(a), T(b)), np.where(cond, a, b), F32)
    check(ops.where(T(a), 1.0, T(b)), np.where(a != 0, 1.0, b), F32)  # non-bool cond means != 0
    check(ops.where(T(cond[:, :1]), 0.0, T(a).T().T()), np.where(cond[:, :1], 0.0, a), F32)
    check(ops.clip(T(a), -1, 1), np.clip(a, -1, 1), F32)
    check(ops.clip(T(a), min=0), np.maximum(a, 0), F32)
    ai = np.array([-5, 0, 5], np.int32)
    check(ops.clip(T(ai), -2.5, 2.5), [-2, 0, 2], I32)


# -- comparisons --------------------------------------------------------------------------------------------------

COMPARE = {
    "lt": (lambda a, b: a < b, np.less),
    "le": (lambda a, b: a <= b, np.less_equal),
    "gt": (lambda a, b: a > b, np.greater),
    "ge": (lambda a, b: a >= b, np.greater_equal),
    "eq": (lambda a, b: a == b, np.equal),
    "ne": (lambda a, b: a != b, np.not_equal),
}


@pytest.mark.parametrize("name", list(COMPARE))
@pytest.mark.parametrize("dtype", [F32, F16, I32, I64])
def test_comparison_operators_return_input_dtype(name, dtype):
    op, ref = COMPARE[name]
    a = values((3, 4), dtype, -2, 2, seed=4)
    b = values((4,), dtype, -2, 2, seed=5)
    b[0] = a[0, 0]  # some ties
    check(op(T(a), T(b)), ref(a, b).astype(NP[dtype]), dtype)
    check(op(T(a), 1), ref(a, NP[dtype](1)).astype(NP[dtype]), dtype)
    check(op(1, T(a)), ref(NP[dtype](1), a).astype(NP[dtype]), dtype)
    # ops returns bool tensors
    check(getattr(ops, name)(T(a), T(b)), ref(a, b), BOOL)


@pytest.mark.parametrize("name", ["lt", "le", "gt", "ge", "eq"])
def test_comparison_module_functions(name):
    a = values((5,), F32, seed=6)
    check(getattr(tensor, name)(T(a), 0.5), COMPARE[name][1](a, np.float32(0.5)).astype(np.float32), F32)


def test_bool_tensors_logic():
    a = values((6,), BOOL, seed=1)
    b = values((6,), BOOL, seed=2)
    check(T(a) == T(b), a == b, BOOL)
    check(ops.logical_and(T(a), T(b)), a & b, BOOL)
    check(ops.logical_or(T(a), T(b)), a | b, BOOL)
    check(ops.logical_xor(T(a), T(b)), a ^ b, BOOL)
    check(ops.logical_not(T(a)), ~a, BOOL)


# -- in-place operators ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("la", LAYOUTS)
def test_inplace_operators_write_own_memory(la):
    a = values((3, 4), F32, 0.5, 2.0, seed=8)
    b = values((4,), F32, 0.5, 2.0, seed=9)
    t = layout(a, la)
    buf, off, strides = t.buffer, t.offset, t.strides
    ref = a.astype(np.float64)
    t += T(b)
    ref = ref + b
    t -= 0.5
    ref = ref - 0.5
    t *= T(b[None, :])
    ref = ref * b
    t /= 2
    ref = ref / 2
    assert (t.buffer, t.offset, t.strides) == (buf, off, strides)
    check(t, ref, F32)


def test_inplace_through_views_updates_base():
    base = T(np.zeros((3, 4), np.float32))
    row = base[1]
    row += 1
    col = base[:, 2]  # (3, 1): SINGA's int index keeps the axis
    col *= 0
    col += T(np.array([[5.0], [6.0], [7.0]], np.float32))
    want = np.zeros((3, 4))
    want[1] = 1
    want[:, 2] = [5, 6, 7]
    check(base, want)
    base[0] += 2  # __getitem__, __iadd__ then __setitem__ of the view onto itself
    want[0] += 2
    check(base, want)


def test_inplace_with_aliased_operand():
    a = values((4, 4), F32, seed=10)
    t = T(a)
    t += t.T()  # reads elements the loop has already written unless the core protects it
    check(t, a.astype(np.float64) + a.T, F32)
    t = T(a)
    t -= t[0]  # broadcast of an overlapping row
    check(t, a.astype(np.float64) - a[0], F32)


def test_kernels_never_see_an_output_overlapping_an_input(dev, monkeypatch):
    """The core computes aside when an output aliases an input in another layout (kernels may assume no overlap)."""
    seen = []
    table = dev.table

    def spy(name):
        real = table[name]

        def kernel(out, *ins, **params):
            for v in ins:
                if v is not None and v.buffer is out.buffer:
                    # element-wise kernels may update in place (identical view); other kernels must never alias
                    assert name in ("add", "sub", "mul", "copy"), name
                    assert (v.offset, v.strides, v.shape) == (out.offset, out.strides, out.shape), name
            seen.append(name)
            return real(out, *ins, **params)

        return kernel

    for name in ("add", "sub", "mul", "matmul", "copy", "scatter_add"):
        monkeypatch.setitem(table, name, spy(name))
    a = values((4, 4), F32, seed=10)
    t = T(a)
    t += t.T()
    t -= t[0]
    t *= t  # identical views are fine
    ref = a.astype(np.float64) + a.T
    ref = ref - ref[0]
    check(t, ref * ref, F32)
    m = T(a)
    tensor.mult(m, m.T(), m, beta=1.0)
    check(m, a.astype(np.float64) @ a.T + a, F32, rtol=1e-5, atol=1e-5)
    s = T(np.ones(4, np.float32))
    ops.scatter_add(s, [0, 1], s[2:])
    check(s, [2, 2, 1, 1], F32)
    assert {"add", "sub", "mul", "matmul", "scatter_add"} <= set(seen)


def test_inplace_int_and_module_ret():
    t = T(np.array([1, 2, 3], np.int32))
    t += 2
    t *= T(np.array([2, 2, 2], np.int32))
    check(t, [6, 8, 10], I32)
    a, b = values((2, 3), F32, seed=1), values((2, 3), F32, seed=2)
    ret = Tensor((2, 3))
    assert tensor.add(T(a), T(b), ret) is ret
    check(ret, a.astype(np.float64) + b, F32)
    assert tensor.sub(T(a), T(b), ret) is ret
    check(ret, a.astype(np.float64) - b, F32)
    assert tensor.eltwise_mult(T(a), T(b), ret) is ret
    check(ret, a.astype(np.float64) * b, F32)
    assert tensor.div(T(a), 2.0, ret) is ret
    check(ret, a.astype(np.float64) / 2, F32)
    check(tensor.add(T(a), T(b)), a.astype(np.float64) + b, F32)
    check(tensor.pow(T(np.abs(a)), 2), np.abs(a.astype(np.float64)) ** 2, F32)
    out = Tensor((2, 3))
    assert tensor.pow(T(np.abs(a)), T(b), out) is out
    check(out, np.abs(a.astype(np.float64)) ** b, F32)


def test_axpy():
    x, y = values((3, 2), F32, seed=1), values((3, 2), F32, seed=2)
    ty = T(y)
    assert tensor.axpy(0.5, T(x), ty) is ty
    check(ty, y.astype(np.float64) + 0.5 * x, F32)


# -- unary functions ----------------------------------------------------------------------------------------------

UNARY = {
    "abs": (np.abs, (-3, 3)), "exp": (np.exp, (-3, 3)), "ceil": (np.ceil, (-3, 3)), "floor": (np.floor, (-3, 3)),
    "log": (np.log, (0.1, 5)), "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), (-5, 5)), "sign": (np.sign, (-3, 3)),
    "sqrt": (np.sqrt, (0, 5)), "square": (np.square, (-3, 3)), "tanh": (np.tanh, (-3, 3)),
    "relu": (lambda x: np.maximum(x, 0), (-3, 3)),
}


@pytest.mark.parametrize("name", list(UNARY))
@pytest.mark.parametrize("la", ["contiguous", "transposed"])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_tensor_unary_functions(name, la, dtype):
    ref, (lo, hi) = UNARY[name]
    a = values((3, 5), dtype, lo, hi, seed=11)
    check(getattr(tensor, name)(layout(a, la)), ref(a.astype(np.float64)), dtype)


@pytest.mark.parametrize(("name", "ref"), [
    ("sin", np.sin), ("cos", np.cos), ("atan", np.arctan), ("sinh", np.sinh), ("neg", np.negative),
    ("round", np.rint), ("softsign", lambda x: x / (1 + np.abs(x))), ("reciprocal", lambda x: 1 / x),
])
def test_ops_unary(name, ref):
    a = values((4, 3), F32, 0.5, 3, seed=12)
    check(getattr(ops, name)(T(a)), ref(a.astype(np.float64)), F32)


def test_ops_parametrised_unary():
    a = values((10,), F32, seed=13).astype(np.float64)
    x = T(a)
    check(ops.leakyrelu(x, 0.1), np.where(a >= 0, a, 0.1 * a), F32)
    check(ops.elu(x, 0.5), np.where(a > 0, a, 0.5 * (np.exp(a) - 1)), F32)
    check(ops.selu(x), np.where(a > 0, 1.0507 * a, 1.0507 * 1.67326 * (np.exp(a) - 1)), F32)
    check(ops.hardsigmoid(x), np.clip(0.2 * a + 0.5, 0, 1), F32)


@pytest.mark.parametrize("dtype", [I32, I64])
def test_int_unary(dtype):
    a = values((6,), dtype, -5, 5)
    check(tensor.abs(T(a)), np.abs(a), dtype)
    check(tensor.sign(T(a)), np.sign(a), dtype)
    check(tensor.square(T(a)), a * a, dtype)


def test_unary_on_0d_and_empty():
    check(tensor.exp(T(np.float32(1.0))), np.exp(1.0), F32)
    check(tensor.exp(Tensor((0, 3))), np.zeros((0, 3)), F32)
    check(T(np.float32(2.0)) * T(np.float32(3.0)), np.float64(6.0), F32)


def test_unary_out_parameter():
    a = values((2, 3), F32, seed=1)
    out = Tensor((3, 2)).T()  # a strided output
    assert ops.exp(T(a), out=out) is out
    check(out, np.exp(a.astype(np.float64)), F32)


# -- casts ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("src", [F32, F16, I32, I64, BOOL])
@pytest.mark.parametrize("dst", [F32, F16, I32, I64, BOOL])
def test_as_type(src, dst):
    a = values((2, 5), src, -4, 4, seed=14)
    if src in (F32, F16):
        a[0, :3] = [-1.5, 2.7, -0.2]  # truncation toward zero
    t = layout(a, "transposed", src)
    r = t.as_type(dst)
    assert r.dtype == dst
    if dst == BOOL:
        want = a != 0
    elif dst in (I32, I64) and src in (F32, F16):
        want = np.trunc(a).astype(NP[dst])
    else:
        want = a.astype(NP[dst])
    check(r, want, dst)
    check(t, a, src)  # unchanged


def test_to_type_in_place():
    t = T(np.array([1.9, -2.9], np.float32))
    assert t.to_type(I32) is t
    assert t.dtype == I32
    check(t, [1, -2], I32)
    assert T([1.0]).as_type("int").dtype == I32


# -- reductions ---------------------------------------------------------------------------------------------------

AXES = [None, 0, 1, -1, (0, 2), (0, 1, 2), ()]


@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("la", ["contiguous", "transposed"])
def test_reductions(axis, keepdims, la):
    a = values((2, 3, 4), F32, 0.5, 2.0, seed=15)
    a64 = a.astype(np.float64)
    t = layout(a, la)
    check(ops.sum(t, axis, keepdims), np.sum(a64, axis=axis, keepdims=keepdims), F32)
    check(ops.mean(t, axis, keepdims), np.mean(a64, axis=axis, keepdims=keepdims), F32)
    check(ops.max(t, axis, keepdims), np.max(a64, axis=axis, keepdims=keepdims), F32)
    check(ops.min(t, axis, keepdims), np.min(a64, axis=axis, keepdims=keepdims), F32)
    check(ops.prod(t, axis, keepdims), np.prod(a64, axis=axis, keepdims=keepdims), F32)


@pytest.mark.parametrize("dtype", [I32, I64, F16])
def test_reductions_other_dtypes(dtype):
    a = values((3, 4), dtype, -3, 3, seed=16)
    a64 = a.astype(np.float64)
    check(ops.sum(T(a), 1), np.sum(a64, 1).astype(NP[dtype]) if dtype != F16 else np.sum(a64, 1), dtype)
    check(ops.max(T(a), 0), np.max(a, 0), dtype)
    check(ops.argmin(T(a), 1), np.argmin(a, 1), I64)


def test_bool_sum_counts():
    a = values((4, 5), BOOL, seed=17)
    check(ops.sum(T(a), 1), a.sum(1), I64)


def test_empty_reductions():
    t = Tensor((0, 3))
    check(ops.sum(t, 0), np.zeros(3), F32)
    check(ops.prod(t, 0), np.ones(3), F32)
    assert np.isnan(N(ops.mean(t, 0))).all()
    check(ops.sum(t, 1), np.zeros(0), F32)
    check(ops.max(t, 1), np.zeros(0), F32)  # nothing to reduce into: fine
    with pytest.raises(ValueError, match=r"max: zero-size reduction over axes \(0,\) of shape \(0, 3\)"):
        ops.max(t, 0)


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_argmax_argmin(axis, keepdims):
    a = values((4, 5), F32, seed=18)
    a[1, 2] = a[1, 3] = 10.0  # ties: the first wins
    t = layout(a, "transposed")
    check(ops.argmax(t, axis, keepdims), np.argmax(a, axis=axis, keepdims=keepdims), I64)
    check(ops.argmin(t, axis, keepdims), np.argmin(a, axis=axis, keepdims=keepdims), I64)


def test_tensor_sum_average_columns_rows():
    a = values((3, 4), F32, seed=19)
    a64 = a.astype(np.float64)
    s = tensor.sum(T(a))
    assert s.shape == ()
    check(s, a64.sum(), F32)
    check(tensor.sum(T(a), 0), a64.sum(0), F32)
    check(tensor.sum(T(a), (0, 1)), a64.sum(), F32)
    out = Tensor((4,))
    assert tensor.sum(T(a), 0, out) is out
    check(out, a64.sum(0), F32)
    avg = tensor.average(T(a))
    assert isinstance(avg, float)
    assert avg == pytest.approx(a64.mean(), rel=1e-6)
    check(tensor.average(T(a), 1), a64.mean(1), F32)
    check(tensor.sum_columns(T(a)), a64.sum(1, keepdims=True), F32)
    check(tensor.sum_rows(T(a)), a64.sum(0, keepdims=True), F32)


def test_l1_l2_are_averages():
    a = values((5, 7), F32, seed=20)
    a64 = a.astype(np.float64)
    assert T(a).l1() == pytest.approx(np.abs(a64).sum() / a.size, rel=1e-6)
    assert T(a).l2() == pytest.approx(np.sqrt((a64 ** 2).sum()) / a.size, rel=1e-6)
    assert T(a.astype(np.float16)).l2() == pytest.approx(np.sqrt((a.astype(np.float16).astype(np.float64) ** 2).sum())
                                                        / a.size, rel=1e-4)


# -- matrix products ------------------------------------------------------------------------------------------------

MATMUL_SHAPES = [
    ((3, 4), (4, 5)),
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((2, 3, 4), (2, 4, 5)),
    ((2, 3, 4), (4, 5)),
    ((3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (1, 3, 4, 5)),
    ((2, 3, 3, 4), (3, 4, 5)),
    ((1, 3, 4), (2, 4, 5)),
    ((3, 0), (0, 5)),
    ((0, 4), (4, 5)),
    ((2, 3, 4), (2, 4, 0)),
]


@pytest.mark.parametrize(("sa", "sb"), MATMUL_SHAPES, ids=str)
def test_matmul_shapes(sa, sb):
    a, b = values(sa, F32, seed=21), values(sb, F32, seed=22)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    check(ops.matmul(T(a), T(b)), want, F32, rtol=1e-5, atol=1e-5)
    check(T(a) @ T(b), want, F32, rtol=1e-5, atol=1e-5)
    if len(sa) <= 2 and len(sb) <= 2:
        check(tensor.mult(T(a), T(b)), want, F32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("la", LAYOUTS)
@pytest.mark.parametrize("lb", LAYOUTS)
def test_matmul_layouts(la, lb):
    a, b = values((5, 6), F32, seed=23), values((6, 4), F32, seed=24)
    want = a.astype(np.float64) @ b
    check(layout(a, la) @ layout(b, lb), want, F32, rtol=1e-5, atol=1e-5)


def test_matmul_batched_transposed_views():
    a = values((3, 4, 5), F32, seed=25)
    b = values((3, 4, 6), F32, seed=26)
    ta = ops.transpose(T(a), (0, 2, 1))  # (3, 5, 4), a transposed layout: no copy needed
    check(ta @ T(b), np.matmul(a.transpose(0, 2, 1).astype(np.float64), b), F32, rtol=1e-5, atol=1e-5)
    tb = ops.transpose(T(np.ascontiguousarray(b.transpose(0, 2, 1))), (0, 2, 1))
    check(ta @ tb, np.matmul(a.transpose(0, 2, 1).astype(np.float64), b), F32, rtol=1e-5, atol=1e-5)
    check(T(a)[:, :, ::2] @ T(b)[0, :3, :].T().T(), np.matmul(a[:, :, ::2].astype(np.float64), b[0, :3, :]),
          F32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [F32, dtypes.float64, F16, I32])
@pytest.mark.parametrize("batch", [1, 2])
def test_matmul_of_attention_heads_sliced_from_packed_projections(dev, dtype, batch, monkeypatch):
    # q k^T and p v on the heads of one (batch, seq, 3 * heads * dim) tensor, as a transformer's packed QKV projection
    # leaves them: each head a (seq, dim) matrix whose rows lie 3 * heads * dim apart, k transposed. A device whose
    # matmul takes strided operands (`strided_operands`: the CPU's) is handed them where they lie, no copies (at batch
    # 2 the batch and head axes step by two strides); the results match float64 numpy either way
    import singa.ops_linalg as linalg

    heads, seq, dim = 3, 5, 4
    npt = NP.get(dtype, np.float64)
    qkv = rng(61).integers(-3, 4, (batch, seq, 3 * heads * dim)).astype(npt)
    copies = []
    monkeypatch.setattr(linalg, "copy", lambda x, *a, **k: copies.append(x.shape) or ops.copy(x, *a, **k))
    t = ops.transpose(ops.reshape(T(qkv), (batch, seq, 3, heads, dim)), (2, 0, 3, 1, 4))
    q, k, v = (ops.squeeze(t[i], 0) for i in range(3))
    scores = q @ ops.swapaxes(k, -1, -2)
    out = scores @ v
    r = qkv.astype(np.float64).reshape(batch, seq, 3, heads, dim).transpose(2, 0, 3, 1, 4)
    want_scores = r[0] @ r[1].swapaxes(-1, -2)
    tol = 1e-2 if dtype == F16 else 1e-9
    np.testing.assert_allclose(tensor.to_numpy(scores).astype(np.float64), want_scores, rtol=tol, atol=tol)
    want_out = tensor.to_numpy(scores).astype(np.float64) @ r[2]  # from the scores as computed (float16 rounds them)
    np.testing.assert_allclose(tensor.to_numpy(out).astype(np.float64), want_out, rtol=tol, atol=tol * 10)
    if getattr(dev.kernels.get("matmul"), "strided_operands", False):
        assert copies == []


@pytest.mark.parametrize("dtype", [I32, I64, F16])
def test_matmul_dtypes(dtype):
    a, b = values((3, 4), dtype, -3, 3, seed=27), values((4, 2), dtype, -3, 3, seed=28)
    want = a.astype(np.float64) @ b.astype(np.float64)
    check(T(a) @ T(b), want.astype(NP[dtype]) if dtype != F16 else want, dtype, rtol=1e-2, atol=1e-2)


def test_mult_with_c_alpha_beta():
    a, b, c = values((3, 4), F32, seed=29), values((4, 5), F32, seed=30), values((3, 5), F32, seed=31)
    C = T(c)
    assert tensor.mult(T(a), T(b), C, alpha=2.0, beta=0.5) is C
    check(C, 2 * (a.astype(np.float64) @ b) + 0.5 * c, F32, rtol=1e-5, atol=1e-5)
    check(tensor.mult(T(a), T(b), alpha=-1.0), -(a.astype(np.float64) @ b), F32, rtol=1e-5, atol=1e-5)
    Ct = T(np.ascontiguousarray(c.T)).T()  # strided C
    tensor.mult(T(a), T(b), Ct, alpha=1.0, beta=1.0)
    check(Ct, a.astype(np.float64) @ b + c, F32, rtol=1e-5, atol=1e-5)
    K0 = T(c)
    tensor.mult(Tensor((3, 0)), Tensor((0, 5)), K0, beta=2.0)  # no products: only beta * C
    check(K0, 2 * c.astype(np.float64), F32)


@pytest.mark.parametrize(("sa", "sb", "axes"), [
    ((3, 4, 5), (4, 5, 2), 2), ((3, 4), (4, 5), 1), ((2, 3), (4,), 0),
    ((3, 4, 5), (5, 4, 2), ([1, 2], [1, 0])), ((3, 4), (3, 4), ([0, 1], [0, 1])), ((2, 3), (3, 2), (1, 0)),
])
def test_tensordot(sa, sb, axes):
    a, b = values(sa, F32, seed=32), values(sb, F32, seed=33)
    check(tensor.tensordot(T(a), T(b), axes), np.tensordot(a.astype(np.float64), b, axes), F32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("spec", "shapes"), [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]),
    ("ki,kj->kij", [(4, 3), (4, 2)]),
    ("kia,kja->kij", [(3, 2, 2), (3, 4, 2)]),
    ("ij,jk", [(2, 3), (3, 4)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("ij->", [(3, 4)]),
    ("ij->ji", [(3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("i,i", [(5,), (5,)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("b...,b->...", [(2, 3, 4), (2,)]),
    ("ij,kj->ik", [(3, 1), (2, 4)]),  # size-1 index broadcasts
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 2)]),
])
def test_einsum(spec, shapes):
    arrays = [values(s, F32, seed=34 + i) for i, s in enumerate(shapes)]
    want = np.einsum(spec, *[a.astype(np.float64) for a in arrays])
    r = tensor.einsum(spec, *[T(a) for a in arrays])
    check(r, want, F32, rtol=1e-5, atol=1e-5)


def test_einsum_result_is_not_a_view_of_an_input():
    t = T(values((3, 4), F32))
    r = tensor.einsum("ij->ji", t)
    assert r.buffer is not t.buffer


# -- layout: transpose, reshape, views ------------------------------------------------------------------------------


def test_transpose_is_a_view():
    a = values((2, 3, 4), F32, seed=40)
    t = T(a)
    for axes in [None, (1, 0, 2), (2, 0, 1), (-1, 0, 1)]:
        v = t.transpose(axes)
        assert v.buffer is t.buffer
        check(v, np.transpose(a, axes), F32)
        check(tensor.transpose(t, axes), np.transpose(a, axes), F32)
    v = t.T()
    v[0, 0, 0] = 100.0
    a[0, 0, 0] = 100.0
    check(t, a, F32)


@pytest.mark.parametrize("la", LAYOUTS)
@pytest.mark.parametrize("shape", [(4, 5), (20,), (2, -1), (5, 2, 2), (1, 20, 1), (-1,)])
def test_reshape(la, shape):
    a = values((4, 5), F32, seed=41)
    t = layout(a, la)
    r = t.reshape(shape)
    check(r, a.reshape(shape), F32)
    if la in ("contiguous", "offset"):
        assert r.buffer is t.buffer
    check(tensor.reshape(t, shape), a.reshape(shape), F32)


def test_reshape_views_without_copy_when_strides_allow():
    a = values((4, 6), F32, seed=42)
    t = T(a)[:, ::2]  # (4, 3), row stride 6, column stride 2
    r = t.reshape((2, 2, 3))  # splits rows only: expressible with strides
    assert r.buffer is t.buffer
    check(r, a[:, ::2].reshape(2, 2, 3), F32)
    r = t.T().reshape((3, 2, 2))
    check(r, a[:, ::2].T.reshape(3, 2, 2), F32)
    assert t.reshape(4, 3, 1).buffer is t.buffer
    e = Tensor((0, 4)).reshape((4, 0))
    assert e.shape == (4, 0)


def test_squeeze_unsqueeze_expand_flatten():
    a = values((3, 1, 4), F32, seed=43)
    t = T(a)
    check(ops.squeeze(t), a.squeeze(), F32)
    check(ops.squeeze(t, 1), a.squeeze(1), F32)
    check(ops.unsqueeze(t, 0), a[None], F32)
    check(ops.unsqueeze(t.T(), [0, -1]), a.T[None, ..., None], F32)
    check(ops.expand(t, (2, 3, 5, 4)), np.broadcast_to(a, (2, 3, 5, 4)), F32)
    check(ops.expand(t, (5, 1)), np.broadcast_to(a, (3, 5, 4)), F32)  # ONNX: bidirectional
    check(ops.broadcast_to(t, (2, 3, 2, 4)), np.broadcast_to(a, (2, 3, 2, 4)), F32)
    assert ops.expand(t, (2, 3, 5, 4)).buffer is t.buffer
    check(ops.flatten(t, 1), a.reshape(3, 4), F32)
    check(ops.flatten(t, 0), a.reshape(1, 12), F32)
    check(ops.swapaxes(t, 0, 2), a.swapaxes(0, 2), F32)


# (key, the numpy key selecting what SINGA's __getitem__ returns: an int i keeps its axis as i:i+1)
INDEX_KEYS = [
    (1, np.s_[1:2]), (-1, np.s_[-1:]), ((1, 2), np.s_[1:2, 2:3]), ((slice(None), 2), np.s_[:, 2:3]),
    ((slice(1, None), slice(None, None, 2)), np.s_[1:, ::2]), ((slice(None, None, -1),), np.s_[::-1]),
    ((Ellipsis, 1), np.s_[..., 1:2]), ((None, 1), np.s_[None, 1:2]), ((1, None, slice(2, 4)), np.s_[1:2, None, 2:4]),
    ((slice(5, 10),), np.s_[5:10]), ((slice(2, 1),), np.s_[2:1]), ((Ellipsis,), np.s_[...]), ((), ()),
    ((slice(None, None, -2), slice(3, 0, -1)), np.s_[::-2, 3:0:-1]), ((0, 0, 0), np.s_[0:1, 0:1, 0:1]),
    ((Ellipsis, -1, 2), np.s_[..., -1:, 2:3]), ((np.int64(2),), np.s_[2:3]),
]


@pytest.mark.parametrize(("key", "np_key"), INDEX_KEYS, ids=lambda k: repr(k))
@pytest.mark.parametrize("la", ["contiguous", "transposed", "stepped"])
def test_getitem_views(key, np_key, la):
    a = values((3, 5, 4), F32, seed=44)
    t = layout(a, la)
    v = t[key]
    assert v.buffer is t.buffer
    check(v, a[np_key], F32)


def test_getitem_with_an_int_keeps_the_axis_as_singa():
    t = T(np.arange(12.0).reshape(3, 4))
    assert t[0].shape == (1, 4)
    assert t[:, 1].shape == (3, 1)
    assert t[2, 3].shape == (1, 1)
    assert ops.getitem(t, 0).shape == (4,)  # the functional core keeps numpy's rule
    assert [r.shape for r in t] == [(4,)] * 3  # iteration yields rows, as numpy


def test_getitem_advanced_and_errors():
    a = values((4, 3), F32, seed=45)
    t = T(a)
    check(t[[2, 0, 2]], a[[2, 0, 2]], F32)
    check(t[np.array([[1], [3]])], a[np.array([[1], [3]])], F32)
    check(t[T(np.array([3, -1], np.int32))], a[[3, -1]], F32)
    for bad, match in (((0, 3), "index 3 is out of bounds for axis 1 with size 3"), ((0, 0, 0), "too many indices"),
                       (7, "index 7 is out of bounds for axis 0 with size 4")):
        for err in (IndexError, ValueError):  # SINGA raises ValueError: both catch it
            with pytest.raises(err, match=match):
                t[bad]
    with pytest.raises(TypeError, match="boolean"):
        t[np.array([True, False, True, False])]


def test_setitem():
    a = np.zeros((3, 4), np.float32)
    t = T(a)
    t[0] = 1.5
    a[0] = 1.5
    t[:, 1] = T(np.array([1.0, 2.0, 3.0], np.float32))
    a[:, 1] = [1, 2, 3]
    t[1:, 2:] = T(np.array([7.0, 8.0], np.float32))  # broadcast
    a[1:, 2:] = [7, 8]
    t[2, ::-1] = np.arange(4.0)
    a[2, ::-1] = np.arange(4.0)
    t[..., 0] = t[..., 3]
    a[..., 0] = a[..., 3]
    check(t, a, F32)
    s = T(np.float32(1.0))
    s[()] = 5
    check(s, 5.0, F32)


# -- copies, devices, host transfers ----------------------------------------------------------------------------------


def test_clone_copy_deepcopy():
    a = values((2, 3), F32, seed=46)
    t = T(a, )
    t.stores_grad = True
    c = t.clone()
    assert c.buffer is not t.buffer
    assert c.stores_grad
    s = t.copy()
    assert s.buffer is t.buffer
    assert s is not t
    d = t.deepcopy()
    e = copy_module.deepcopy(t)
    f = copy_module.copy(t)
    assert f.buffer is t.buffer
    t += 1
    for x in (c, d, e):
        check(x, a, F32)
    check(s, a.astype(np.float64) + 1, F32)
    check(f, a.astype(np.float64) + 1, F32)
    check(T(a).T().clone(), a.T, F32)


def test_set_value():
    t = Tensor((2, 2), dtype=I32)
    assert t.set_value(3) is t
    check(t, np.full((2, 2), 3), I32)
    n = t.set_value(4, inplace=False)
    check(t, np.full((2, 2), 3), I32)
    check(n, np.full((2, 2), 4), I32)
    v = Tensor((3, 4))[:, 1:3]
    v.set_value(2.5)
    check(v, np.full((3, 2), 2.5), F32)


def test_copy_from_numpy_with_offset():
    t = Tensor((2, 3))
    assert t.copy_from_numpy(np.arange(6, dtype=np.float64).reshape(3, 2)) is t
    check(t, np.arange(6.0).reshape(2, 3), F32)
    t.copy_from_numpy(np.array([10.0, 11.0]), offset=3)
    check(t, [[0, 1, 2], [10, 11, 5]], F32)
    tt = T(np.zeros((3, 2), np.float32)).T()  # strided: logical row-major order
    tt.copy_from_numpy([1, 2, 3], offset=2)
    check(tt, [[0, 0, 1], [2, 3, 0]], F32)
    tensor.copy_from_numpy(t, np.ones(6, np.float32))
    check(t, np.ones((2, 3)), F32)
    i = Tensor((2,), dtype=I32)
    i.copy_from_numpy(np.array([5, 6], np.int64))
    check(i, [5, 6], I32)
    i.copy_from_numpy(np.array([0.0, 1.0], np.float32))  # exact integers (one-hot labels) are accepted
    check(i, [0, 1], I32)


def test_copy_data_copy_from_and_copy_data_to_from(other):
    a = values((2, 3), F32, seed=47)
    t = Tensor((3, 2))
    assert t.copy_data(T(a)) is t
    check(t, a.reshape(3, 2), F32)
    u = Tensor((6,))
    u.copy_from(T(a[:, :2]).T(), offset=1)  # 4 elements of a strided source, row-major order
    check(u, np.concatenate([[0], a[:, :2].T.reshape(-1), [0]]), F32)
    u.copy_from(np.array([9.0, 9.0], np.float32), offset=4)
    check(u, np.concatenate([[0], a[:, :2].T.reshape(-1)[:3], [9, 9]]), F32)
    dst = Tensor((5,))
    tensor.copy_data_to_from(dst, T(np.arange(6.0, dtype=np.float32)), 3, dst_offset=2, src_offset=1)
    check(dst, [0, 0, 1, 2, 3], F32)
    far = Tensor((2, 3), device=other)  # across devices
    far.copy_data(T(a))
    assert far.device is other
    np.testing.assert_array_equal(N(far), a)
    back = Tensor((2, 3))
    back.copy_data(far)
    check(back, a, F32)


def test_to_device_moves_in_place(dev, other):
    a = values((3, 4), F32, seed=48)
    t = T(a).T()  # strided data: moves into contiguous memory
    assert t.to_device(other) is t
    assert t.device is other
    assert t.buffer.device is other
    np.testing.assert_array_equal(N(t), a.T)
    r = t * 2  # computes on the new device
    assert r.device is other
    np.testing.assert_allclose(N(r), a.T * 2)
    t.to_device(dev)
    assert t.device is dev
    check(t, a.T, F32)


def test_reset_like(other):
    t = Tensor((2,))
    t.reset_like(Tensor((3, 4), device=other, dtype=I32))
    assert (t.shape, t.dtype, t.device) == ((3, 4), I32, other)
    np.testing.assert_array_equal(N(t), np.zeros((3, 4), np.int32))


def test_to_host():
    try:
        host = device.get_device("cpu")
    except RuntimeError:
        pytest.skip("the CPU backend (the host device) is not installed")
    a = values((2, 2), F32)
    t = T(a)
    h = tensor.to_host(t)
    assert h.device is host
    assert h.buffer is not t.buffer
    np.testing.assert_array_equal(N(h), a)
    assert t.to_host() is t
    assert t.device is host


def test_pickle_round_trip():
    t = Tensor(data=values((2, 3), F32), stores_grad=True, name="p")
    u = pickle.loads(pickle.dumps(t))
    assert (u.shape, u.dtype, u.device, u.stores_grad, u.name) == (t.shape, t.dtype, t.device, True, "p")
    np.testing.assert_array_equal(N(u), N(t))


# -- row/column helpers ------------------------------------------------------------------------------------------------


def test_row_column_methods():
    m = values((3, 4), F32, 1, 2, seed=49)
    col = values((3,), F32, 1, 2, seed=50)
    row = values((4,), F32, 1, 2, seed=51)
    m64 = m.astype(np.float64)
    for name, v, ref in [
        ("add_column", col, m64 + col[:, None]), ("add_row", row, m64 + row),
        ("div_column", col, m64 / col[:, None]), ("div_row", row, m64 / row),
        ("mult_column", col, m64 * col[:, None]), ("mult_row", row, m64 * row),
    ]:
        t = T(m)
        getattr(t, name)(T(v))
        check(t, ref, F32)
    t = T(m)
    assert tensor.add_column(2.0, T(col), 0.5, t) is t
    check(t, 2 * col[:, None] + 0.5 * m64, F32)
    t = T(m)
    assert tensor.add_row(1.0, T(row), 1.0, t) is t
    check(t, m64 + row, F32)


# -- concatenation, repeat, tile, pad, gather, scatter ---------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concatenate(axis):
    parts = [values((2, 3), F32, seed=52), values((2, 3), F32, seed=53), values((2, 3), F32, seed=54)]
    ts = [T(parts[0]), T(np.ascontiguousarray(parts[1].T)).T(), T(parts[2])]
    check(tensor.concatenate(ts, axis), np.concatenate(parts, axis), F32)
    check(ops.concat([T(parts[0]), Tensor((0, 3))], 0), parts[0], F32)
    ints = [np.arange(3, dtype=np.int32), np.arange(2, dtype=np.int32)]
    check(ops.concat([T(i) for i in ints]), np.concatenate(ints), I32)


@pytest.mark.parametrize(("repeats", "axis"), [(2, None), (3, 0), (2, 1), ([1, 0, 2], 0), ([2, 1, 1, 0], -1), (0, 1)])
def test_repeat(repeats, axis):
    a = values((3, 4), F32, seed=55)
    check(tensor.repeat(T(a), repeats, axis), np.repeat(a, repeats, axis), F32)
    check(T(a).T().repeat(repeats, axis if axis is None else -1 - (axis % 2)),
          np.repeat(a.T, repeats, axis if axis is None else -1 - (axis % 2)), F32)


@pytest.mark.parametrize("reps", [(2, 3), (1, 2), (2,), (2, 1, 2), 3])
def test_tile(reps):
    a = values((2, 3), F32, seed=56)
    check(ops.tile(T(a), reps), np.tile(a, reps), F32)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad(mode):
    a = values((3, 4), F32, seed=57)
    pads = (1, 2, 2, 0)  # begin_0, begin_1, end_0, end_1
    width = ((1, 2), (2, 0))
    kw = {"constant_values": 1.5} if mode == "constant" else {}
    check(ops.pad(T(a).T().T(), pads, mode, 1.5), np.pad(a, width, mode=mode, **kw), F32)
    check(ops.pad(T(a), (-1, 0, 1, -2)), np.pad(a[1:, :2], ((0, 1), (0, 0))), F32)  # negative pads crop


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_and_scatter_add(axis):
    a = values((4, 5), F32, seed=58)
    idx = np.array([[0, -1], [2, 2]], np.int64)
    check(ops.gather(T(a), idx, axis), np.take(a, idx, axis), F32)
    check(ops.gather(T(a).T(), T(idx.astype(np.int32)), axis), np.take(a.T, idx, axis), F32)
    target = np.zeros((4, 5))
    upd_shape = target.shape[:axis % 2] + idx.shape + target.shape[axis % 2 + 1:]
    upd = values(upd_shape, F32, seed=59)
    t = T(target.astype(np.float32))
    assert ops.scatter_add(t, idx, T(upd), axis) is t
    want = target.copy()
    moved = np.moveaxis(want, axis, 0)
    n = want.shape[axis]
    np.add.at(moved, np.where(idx < 0, idx + n, idx).reshape(-1),
              np.moveaxis(upd.reshape(target.shape[:axis % 2] + (idx.size,) + target.shape[axis % 2 + 1:]), axis, 0))
    check(t, want, F32)


def test_slice_onnx():
    a = values((5, 6), F32, seed=60)
    check(ops.slice(T(a), [1, 0], [100, -1]), a[1:100, 0:-1], F32)
    check(ops.slice(T(a), [-1], [-6], axes=[1], steps=[-2]), a[:, -1:-6:-2], F32)


# -- random numbers ---------------------------------------------------------------------------------------------------


def test_uniform_follows_the_device_generator(dev):
    n = 1001
    dev.set_rand_seed(1234)
    t = Tensor((7, 143))
    assert t.uniform(-2.0, 3.0) is t
    want = -2.0 + 5.0 * philox_uniform(1234, 0, n)
    np.testing.assert_allclose(N(t).reshape(-1), want.astype(np.float32), rtol=1e-6, atol=1e-6)
    u = tensor.uniform(0.0, 1.0, Tensor((5,)))  # the stream advances to a multiple of 4
    np.testing.assert_allclose(N(u), philox_uniform(1234, 1004, 5).astype(np.float32), rtol=1e-6, atol=1e-7)
    dev.set_rand_seed(1234)
    again = Tensor((7, 143)).uniform(-2.0, 3.0)
    np.testing.assert_array_equal(N(again), N(t))


def test_gaussian_follows_the_device_generator(dev):
    n = 500
    dev.set_rand_seed(99)
    t = Tensor((n,)).gaussian(1.0, 2.0)
    u = philox_uniform(99, 0, 2 * n)
    want = 1.0 + 2.0 * np.sqrt(-2.0 * np.log(1.0 - u[0::2])) * np.cos(2.0 * np.pi * u[1::2])
    np.testing.assert_allclose(N(t), want, rtol=1e-4, atol=1e-4)
    nxt = Tensor((3,)).uniform(0.0, 1.0)  # the normal fill reserved two draws per element
    np.testing.assert_allclose(N(nxt), philox_uniform(99, 2 * n, 3).astype(np.float32), rtol=1e-6, atol=1e-7)
    big = tensor.gaussian(0.0, 1.0, Tensor((20000,)))
    assert abs(N(big).mean()) < 0.05
    assert abs(N(big).std() - 1.0) < 0.05


def test_bernoulli_and_strided_targets(dev):
    dev.set_rand_seed(7)
    b = Tensor((4000,)).bernoulli(0.3)
    arr = N(b)
    assert set(np.unique(arr)) <= {0.0, 1.0}
    assert abs(arr.mean() - 0.3) < 0.03
    want = (philox_uniform(7, 0, 4000) < 0.3).astype(np.float32)
    np.testing.assert_array_equal(arr, want)
    base = Tensor((3, 4))
    view = base[:, 1:3]
    tensor.bernoulli(1.0, view)
    np.testing.assert_array_equal(N(base), np.array([[0, 1, 1, 0]] * 3, np.float32))
    fresh = base.uniform(5.0, 6.0, inplace=False)
    assert fresh is not base
    assert N(fresh).min() >= 5.0
    np.testing.assert_array_equal(N(base), np.array([[0, 1, 1, 0]] * 3, np.float32))
    assert N(Tensor((10,), dtype=I32).bernoulli(1.0)).tolist() == [1] * 10


def test_mlp_seed_usage(dev):
    """The autograd seed's pattern: gaussian-initialised weights, zero bias, a forward pass."""
    dev.set_rand_seed(0)
    w0 = Tensor(shape=(2, 3), requires_grad=True, stores_grad=True)
    w0.gaussian(0.0, 0.1)
    b0 = Tensor(shape=(1, 3), requires_grad=True, stores_grad=True)
    b0.set_value(0.0)
    x = Tensor(data=np.array([[1.0, 2.0], [3.0, 4.0]]))
    y = tensor.relu(x @ w0 + b0)
    want = np.maximum(N(x).astype(np.float64) @ N(w0) + N(b0), 0)
    check(y, want, F32)


# -- nn ops: softmax, losses, convolution, pooling, batchnorm ----------------------------------------------------------


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_family(axis):
    x = values((3, 4, 5), F32, seed=61).astype(np.float64) if axis != -1 else values((4, 5), F32, seed=61).astype(
        np.float64)
    y = _softmax(x, axis)
    check(ops.softmax(layout(x.astype(np.float32), "transposed"), axis), y, F32)
    check(ops.log_softmax(T(x.astype(np.float32)), axis), np.log(y), F32)
    dy = values(x.shape, F32, seed=62).astype(np.float64)
    check(ops.softmax_backward(T(dy.astype(np.float32)), T(y.astype(np.float32)), axis),
          y * (dy - (dy * y).sum(axis=axis, keepdims=True)), F32, rtol=1e-5, atol=1e-5)
    check(ops.log_softmax_backward(T(dy.astype(np.float32)), T(np.log(y).astype(np.float32)), axis),
          dy - y * dy.sum(axis=axis, keepdims=True), F32, rtol=1e-5, atol=1e-5)


def test_tensor_softmax_rows():
    x = values((3, 5), F32, seed=63)
    check(tensor.softmax(T(x)), _softmax(x.astype(np.float64), 1), F32)
    out = Tensor((3, 5))
    assert tensor.softmax(T(x), out) is out
    check(out, _softmax(x.astype(np.float64), 1), F32)


@pytest.mark.parametrize("kind", ["labels32", "labels64", "labels_column", "dist"])
def test_softmax_cross_entropy(kind):
    x = values((4, 5), F32, seed=64)
    labels = np.array([0, 4, 2, 2])
    onehot = np.eye(5)[labels]
    if kind == "dist":
        tgt = _softmax(values((4, 5), F32, seed=65).astype(np.float64), 1)
        t, dist = T(tgt.astype(np.float32)), tgt
    else:
        dt = np.int64 if kind == "labels64" else np.int32
        arr = labels.astype(dt).reshape(-1, 1) if kind == "labels_column" else labels.astype(dt)
        t, dist = T(arr), onehot
    x64 = x.astype(np.float64)
    logp = x64 - x64.max(1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
    check(ops.softmax_cross_entropy(T(x), t), -(dist * logp).sum(1), F32)
    dloss = values((4,), F32, seed=66).astype(np.float64)
    want = (np.exp(logp) * dist.sum(1, keepdims=True) - dist) * dloss[:, None]
    check(ops.softmax_cross_entropy_backward(T(dloss.astype(np.float32)), T(x), t), want, F32)
    check(ops.softmax_cross_entropy_backward(1.0, T(x), t), np.exp(logp) * dist.sum(1, keepdims=True) - dist, F32)


def _dot_central_difference(f, a, i, dy, eps):
    """<dy, df/da[i]> by a central difference: ((f(a + eps e_i) - f(a - eps e_i)) * dy).sum() / (2 eps)."""
    ap, am = a.copy(), a.copy()
    ap[i] += eps
    am[i] -= eps
    return ((f(ap) - f(am)) * dy).sum() / (2 * eps)


CONV_CASES = [
    # x shape, w shape, stride, padding (as given to ops), pads (t, l, b, r), dilation, groups, bias
    ((2, 3, 6, 5), (4, 3, 3, 3), 1, 1, (1, 1, 1, 1), 1, 1, True),
    ((1, 4, 7, 7), (6, 2, 3, 2), (2, 1), (1, 0), (1, 0, 1, 0), 1, 2, False),
    ((2, 2, 8, 8), (2, 2, 3, 3), 2, (0, 1, 2, 1), (0, 1, 2, 1), (2, 1), 1, True),
    ((1, 4, 5, 5), (4, 1, 3, 3), 1, 1, (1, 1, 1, 1), 1, 4, True),  # depthwise
]


@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_conv2d_and_gradients(case):
    xs, ws, stride, padding, pads, dilation, groups, bias = case
    x = values(xs, F32, -1, 1, seed=67).astype(np.float64)
    w = values(ws, F32, -1, 1, seed=68).astype(np.float64)
    b = values((ws[0],), F32, -1, 1, seed=69).astype(np.float64) if bias else None
    st = ops._pair("t", stride, "s", 1)
    dl = ops._pair("t", dilation, "d", 1)
    want = conv_ref(x, w, b, st, pads, dl, groups)
    tx, tw = layout(x.astype(np.float32), "offset"), T(w.astype(np.float32))
    tb = T(b.astype(np.float32)) if bias else None
    y = ops.conv2d(tx, tw, tb, stride, padding, dl, groups)
    check(y, want, F32, rtol=1e-5, atol=1e-5)
    # gradients: the adjoints of the (linear) forward, checked by <dy, conv(x, w)> identities
    dy = values(want.shape, F32, -1, 1, seed=70).astype(np.float64)
    dx = ops.conv2d_backward_data(T(dy.astype(np.float32)), tw, xs, stride, padding, dl, groups)
    dw = ops.conv2d_backward_weight(T(dy.astype(np.float32)), tx, ws, stride, padding, dl, groups)
    assert dx.shape == xs
    assert dw.shape == ws
    eps = 1e-3
    gen = rng(71)
    for _ in range(3):
        i = tuple(gen.integers(0, s) for s in xs)
        num = _dot_central_difference(lambda v: conv_ref(v, w, None, st, pads, dl, groups), x, i, dy, eps)
        assert N(dx)[i] == pytest.approx(num, rel=1e-4, abs=1e-4)
        j = tuple(gen.integers(0, s) for s in ws)
        num = _dot_central_difference(lambda v: conv_ref(x, v, None, st, pads, dl, groups), w, j, dy, eps)
        assert N(dw)[j] == pytest.approx(num, rel=1e-4, abs=1e-4)


@pytest.mark.parametrize(("H", "k", "s", "p", "ceil", "want"), [
    (5, 2, 3, 1, True, 2), (5, 2, 2, 0, True, 3), (5, 2, 2, 0, False, 2), (6, 3, 2, 1, True, 4),
    (6, 3, 2, 1, False, 3), (7, 3, 3, 1, True, 3), (4, 2, 2, 1, True, 3),
])
def test_pool_output_size(H, k, s, p, ceil, want):
    """Sizes as PyTorch computes them (ceil mode drops a last window that would start in the right padding)."""
    assert ops.pool_output_shape((1, 1, H, H), k, s, p, 1, ceil) == (1, 1, want, want)
    y = ops.pool2d(Tensor((1, 1, H, H)), k, s, p, ceil_mode=ceil)
    assert y.shape == (1, 1, want, want)


def _pool_ref(x, k, s, pads, mode, count_include_pad, oh, ow):
    N_, C, H, W = x.shape
    y = np.zeros((N_, C, oh, ow))
    for i in range(oh):
        for j in range(ow):
            h0, w0 = i * s[0] - pads[0], j * s[1] - pads[1]
            hs, ws = slice(max(h0, 0), min(h0 + k[0], H)), slice(max(w0, 0), min(w0 + k[1], W))
            win = x[:, :, hs, ws]
            if mode == "max":
                y[:, :, i, j] = win.max(axis=(2, 3))
            else:
                if count_include_pad:
                    hh = min(h0 + k[0], H + pads[2]) - max(h0, -pads[0])
                    ww = min(w0 + k[1], W + pads[3]) - max(w0, -pads[1])
                    div = hh * ww
                else:
                    div = win.shape[2] * win.shape[3]
                y[:, :, i, j] = win.sum(axis=(2, 3)) / div
    return y


@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize(("k", "s", "p", "ceil", "cip"), [
    (2, 2, 0, False, True), (3, 2, 1, True, True), (3, 2, 1, True, False), ((3, 2), (1, 2), (1, 0), False, False),
])
def test_pool2d_and_backward(mode, k, s, p, ceil, cip):
    x = values((2, 3, 7, 6), F32, seed=72).astype(np.float64)
    kk, ss = ops._pair("t", k, "k", 1), ops._pair("t", s, "s", 1)
    pads = ops._pads4("t", p)
    shape = ops.pool_output_shape(x.shape, k, s, p, 1, ceil)
    want = _pool_ref(x, kk, ss, pads, mode, cip, shape[2], shape[3])
    tx = layout(x.astype(np.float32), "stepped")
    y, idx = ops.pool2d(tx, k, s, p, 1, mode, ceil, cip, return_indices=True)
    check(y, want, F32)
    dy = values(shape, F32, seed=73).astype(np.float64)
    dx = ops.pool2d_backward(T(dy.astype(np.float32)), tx, idx, k, s, p, 1, mode, cip)
    # the backward is the adjoint of the forward: <dy, pool(x + e_i)> - <dy, pool(x)> for a small step
    eps = 1e-3
    gen = rng(74)
    for _ in range(4):
        i = tuple(gen.integers(0, d) for d in x.shape)
        xp = x.copy()
        xp[i] += eps
        num = ((_pool_ref(xp, kk, ss, pads, mode, cip, shape[2], shape[3]) - want) * dy).sum() / eps
        assert N(dx)[i] == pytest.approx(num, rel=1e-3, abs=1e-3)
    if mode == "max":  # without indices the kernel recomputes the argmax
        dx2 = ops.pool2d_backward(T(dy.astype(np.float32)), tx, None, k, s, p, 1, mode, cip)
        np.testing.assert_allclose(N(dx2), N(dx), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", [(4, 3, 2, 5), (6, 3)])
def test_batchnorm(shape):
    x = values(shape, F32, seed=75).astype(np.float64)
    C = shape[1]
    scale = values((C,), F32, 0.5, 2, seed=76).astype(np.float64)
    bias = values((C,), F32, seed=77).astype(np.float64)
    rm0, rv0 = values((C,), F32, seed=78).astype(np.float64), values((C,), F32, 0.5, 2, seed=79).astype(np.float64)
    axes = (0,) + tuple(range(2, len(shape)))
    bc = (1, C) + (1,) * (len(shape) - 2)
    mean, var = x.mean(axes), x.var(axes)
    m = x.size // C
    invstd = 1 / np.sqrt(var + 1e-5)
    want = (x - mean.reshape(bc)) * (invstd * scale).reshape(bc) + bias.reshape(bc)
    rm, rv = T(rm0.astype(np.float32)), T(rv0.astype(np.float32))
    y, sm, si = ops.batchnorm_train(layout(x.astype(np.float32), "transposed"), T(scale.astype(np.float32)),
                                    T(bias.astype(np.float32)), rm, rv, 0.9, 1e-5)
    check(y, want, F32, rtol=1e-4, atol=1e-4)
    check(sm, mean, F32)
    check(si, invstd, F32, rtol=1e-4)
    check(rm, 0.9 * rm0 + 0.1 * mean, F32)
    check(rv, 0.9 * rv0 + 0.1 * var * m / (m - 1), F32, rtol=1e-4)
    yi = ops.batchnorm_infer(T(x.astype(np.float32)), T(scale.astype(np.float32)), T(bias.astype(np.float32)),
                             T(rm0.astype(np.float32)), T(rv0.astype(np.float32)), 1e-5)
    check(yi, (x - rm0.reshape(bc)) / np.sqrt(rv0.reshape(bc) + 1e-5) * scale.reshape(bc) + bias.reshape(bc), F32,
          rtol=1e-4, atol=1e-4)
    dy = values(shape, F32, seed=80).astype(np.float64)
    dx, ds, db = ops.batchnorm_backward(T(dy.astype(np.float32)), T(x.astype(np.float32)), T(scale.astype(np.float32)),
                                        sm, si)
    xhat = (x - mean.reshape(bc)) * invstd.reshape(bc)
    db_ref = dy.sum(axes)
    ds_ref = (dy * xhat).sum(axes)
    dx_ref = (scale * invstd).reshape(bc) / m * (m * dy - db_ref.reshape(bc) - xhat * ds_ref.reshape(bc))
    check(db, db_ref, F32, rtol=1e-4, atol=1e-4)
    check(ds, ds_ref, F32, rtol=1e-4, atol=1e-4)
    check(dx, dx_ref, F32, rtol=1e-3, atol=1e-4)


# -- device mismatch (a second device) --------------------------------------------------------------------------------


def test_device_mismatch_errors_name_both_devices(dev, other):
    a = Tensor((2, 2))
    b = Tensor((2, 2), device=other)
    msg = f"tensors on different devices: {dev.name} and {other.name} (use to_device)"
    with pytest.raises(ValueError, match=r"add: " + msg.replace("(", r"\(").replace(")", r"\)")):
        a + b
    with pytest.raises(ValueError, match=r"matmul: tensors on different devices: " + dev.name):
        a @ b
    with pytest.raises(ValueError, match=rf"concat: .*{dev.name} and {other.name}"):
        tensor.concatenate([a, b], 0)
    with pytest.raises(ValueError, match=rf"where: .*{other.name}"):
        ops.where(ops.gt(a, 0.0), a, b)
    with pytest.raises(ValueError, match=rf"add: output on {other.name} but inputs on {dev.name}"):
        tensor.add(a, a, b)
    with pytest.raises(ValueError, match=rf"conv2d: .*{dev.name} and {other.name}"):
        ops.conv2d(Tensor((1, 1, 3, 3)), Tensor((1, 1, 2, 2), device=other))


def test_math_module_is_shadow_safe():
    """tensor.sum/abs/pow shadow builtins inside singa.tensor; norms and sizes must still be plain Python numbers."""
    t = T(np.full((2, 2), -2.0, np.float32))
    assert isinstance(t.size(), int)
    assert t.l1() == 2.0 / 1  # mean |x| = 2
    assert math.isclose(t.l2(), math.sqrt(16.0) / 4)


# -- API surface: SINGA's names, arguments and defaults ----------------------------------------------------------------

# From the reference listing of singa.tensor (device=get_default_device() becomes device=None: resolved per call).
SINGA_METHODS = [
    ('__init__', ('shape=(), device=None, dtype=float32, data=None, requires_grad=True, stores_grad=False, '
                 'creator=None, name=None')),
    ('is_dummy', ''),
    ('ndim', ''),
    ('is_empty', ''),
    ('is_transpose', ''),
    ('transpose', 'axes=None'),
    ('size', ''),
    ('memsize', ''),
    ('contiguous', ''),
    ('reshape', 'shape'),
    ('reset_like', 't'),
    ('as_type', 'dtype'),
    ('to_type', 'dtype'),
    ('to_device', 'device'),
    ('to_host', ''),
    ('l2', ''),
    ('l1', ''),
    ('set_value', 'x, inplace=True'),
    ('copy_from_numpy', 'np_array, offset=0'),
    ('copy_data', 't'),
    ('copy_from', 't, offset=0'),
    ('clone', ''),
    ('repeat', 'repeats, axis'),
    ('T', ''),
    ('copy', ''),
    ('deepcopy', ''),
    ('bernoulli', 'p, inplace=True'),
    ('gaussian', 'mean, std, inplace=True'),
    ('uniform', 'low, high, inplace=True'),
    ('add_column', 'v'),
    ('add_row', 'v'),
    ('div_column', 'v'),
    ('div_row', 'v'),
    ('mult_column', 'v'),
    ('mult_row', 'v'),
]
SINGA_FUNCTIONS = [
    ('zeros_like', 't'),
    ('ones_like', 't'),
    ('product', 'shape'),
    ('sizeof', 'dtype'),
    ('contiguous', 'tensor'),
    ('reshape', 'tensor, shape'),
    ('transpose', 't, axes=None'),
    ('copy_data_to_from', 'dst, src, size, dst_offset=0, src_offset=0'),
    ('from_numpy', 'np_array, dev=None'),
    ('to_host', 't'),
    ('to_numpy', 't'),
    ('abs', 't'),
    ('exp', 't'),
    ('ceil', 't'),
    ('log', 't'),
    ('sigmoid', 't'),
    ('sign', 't'),
    ('sqrt', 't'),
    ('square', 't'),
    ('tanh', 't'),
    ('sum', 't, axis=None, out=None'),
    ('pow', 't, x, out=None'),
    ('average', 't, axis=None'),
    ('softmax', 't, out=None'),
    ('lt', 't, x'),
    ('le', 't, x'),
    ('gt', 't, x'),
    ('ge', 't, x'),
    ('eq', 't, x'),
    ('add', 'lhs, rhs, ret=None'),
    ('sub', 'lhs, rhs, ret=None'),
    ('eltwise_mult', 'lhs, rhs, ret=None'),
    ('mult', 'A, B, C=None, alpha=1.0, beta=0.0'),
    ('einsum', 'ops, *args'),
    ('repeat', 't, repeats, axis=None'),
    ('tensordot', 'A, B, axes=2'),
    ('div', 'lhs, rhs, ret=None'),
    ('axpy', 'alpha, x, y'),
    ('bernoulli', 'p, t'),
    ('gaussian', 'mean, std, t'),
    ('uniform', 'low, high, t'),
    ('add_column', 'alpha, v, beta, M'),
    ('add_row', 'alpha, v, beta, M'),
    ('sum_columns', 'M'),
    ('sum_rows', 'M'),
    ('copy_from_numpy', 'data, np_array'),
    ('concatenate', 'tensors, axis'),
    ('random', 'shape, device=None'),
    ('zeros', 'shape, device=None'),
    ('ones', 'shape, device=None'),
]


def _params_match(fn, listed: str) -> None:
    params = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
    want = [a.strip() for a in listed.split(",") if a.strip()]
    assert len(params) >= len(want), f"{fn.__qualname__}: {params} lacks {want}"
    for p, w in zip(params, want):
        name, _, default = w.partition("=")
        if name.startswith("*"):
            assert p.kind is inspect.Parameter.VAR_POSITIONAL, f"{fn.__qualname__}: {name}"
            name = name[1:]
        assert p.name == name, f"{fn.__qualname__}: parameter {p.name!r} where SINGA has {name!r}"
        if default:
            assert p.default == eval(default, {"float32": tensor.float32}), f"{fn.__qualname__}: default of {name}"
        else:
            assert p.default is inspect.Parameter.empty, f"{fn.__qualname__}: {name} must stay required"
    for extra in params[len(want):]:  # additions must not break SINGA's calls
        assert extra.default is not inspect.Parameter.empty or extra.kind is inspect.Parameter.VAR_POSITIONAL


@pytest.mark.parametrize(("name", "listed"), SINGA_METHODS, ids=[m[0] for m in SINGA_METHODS])
def test_tensor_method_signatures(name, listed):
    _params_match(getattr(Tensor, name), listed)


@pytest.mark.parametrize(("name", "listed"), SINGA_FUNCTIONS, ids=[f[0] for f in SINGA_FUNCTIONS])
def test_module_function_signatures(name, listed):
    _params_match(getattr(tensor, name), listed)


def test_reshape_fuzz_against_numpy():
    """Random transposed/sliced views reshaped to random factorizations: views when the strides allow, else copies."""
    gen = random.Random(0)
    views = 0
    for _ in range(300):
        shape = tuple(gen.randint(1, 4) for _ in range(gen.randint(1, 4)))
        a = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
        t = T(a)
        perm = list(range(len(shape)))
        gen.shuffle(perm)
        key = tuple(slice(None, None, gen.choice([1, 2, -1])) for _ in shape)
        t, a = t.transpose(perm)[key], a.transpose(perm)[key]
        n = a.size
        dims = []
        while n > 1:
            d = gen.choice([k for k in range(2, n + 1) if n % k == 0])
            dims.append(d)
            n //= d
        dims += [1] * gen.randint(0, 2)
        gen.shuffle(dims)
        r = t.reshape(tuple(dims))
        views += r.buffer is t.buffer
        np.testing.assert_array_equal(N(r), a.reshape(tuple(dims)))
    assert views > 50  # the no-copy path is exercised, not just the copy


def test_flatten_negative_axis_counts_from_the_end():
    from singa import ops

    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = tensor.from_numpy(x)
    for axis, shape in [(-1, (6, 4)), (-3, (1, 24)), (0, (1, 24)), (3, (24, 1)), (1, (2, 12))]:
        y = tensor.to_numpy(ops.flatten(t, axis))
        assert y.shape == shape, (axis, y.shape)
        np.testing.assert_array_equal(y, x.reshape(shape))


# -- SINGA's promotion rule (issue 13): a float scalar or a float tensor makes an integer operation float ------------


@pytest.mark.parametrize("dtype", [I32, I64])
def test_float_scalar_with_int_tensor_promotes_to_float32(dtype):
    a = np.array([[-7, 7, 5, 0], [9, -9, 3, 2]], NP[dtype])
    ta = T(a)
    af = a.astype(np.float64)
    check(ta + 0.5, af + 0.5, F32)
    check(0.5 + ta, 0.5 + af, F32)
    check(ta - 1.25, af - 1.25, F32)
    check(2.5 - ta, 2.5 - af, F32)
    check(ta * 0.5, af * 0.5, F32)
    check(ta / 4.0, af / 4.0, F32)  # true division: SINGA converts the scalar with float()
    check(1.0 / (ta + 10), 1.0 / (af + 10), F32)
    check(ta ** 2.0, af ** 2.0, F32)
    check(ta * np.float32(0.25), af * 0.25, F32)  # numpy floats too
    check(tensor.add(ta, 0.5), af + 0.5, F32)
    check(ta + 3, a + 3, dtype)  # int with int stays int
    check(ta * True, a, dtype)
    check(ta < 0.5, (af < 0.5).astype(NP[dtype]), dtype)  # SINGA's comparisons: 0/1 in the tensor's dtype
    check(ta >= 0.0, (af >= 0).astype(NP[dtype]), dtype)


def test_int_and_float_tensors_compute_in_float():
    i = np.array([[1, -2, 3]], np.int32)
    f = np.array([[0.5], [-1.5]], np.float32)
    check(T(i) + T(f), i + f.astype(np.float64), F32)  # broadcast too
    check(T(f) - T(i), f.astype(np.float64) - i, F32)
    check(T(i) * T(f), i * f.astype(np.float64), F32)
    check(T(i) / T(f), i / f.astype(np.float64), F32)
    check(tensor.eltwise_mult(T(i), T(f)), i * f.astype(np.float64), F32)
    h = np.array([0.5, 1.5, -2.0], np.float16)
    check(T(i) + T(h), (i + h).astype(np.float16), F16)  # the float operand's dtype
    b = np.array([True, False, True])
    check(T(b) * T(f), b * f.astype(np.float64), F32)
    check(T(b) * T(i), b * i, I32)  # bool < int < float
    check(T(i) + np.array([0.25, 0.5, 0.75]), i + np.array([0.25, 0.5, 0.75]), F32)  # a numpy operand likewise


def test_same_kind_is_never_widened_and_in_place_results_must_fit():
    with pytest.raises(TypeError, match="int32 and int64"):
        T(np.ones(2, np.int32)) + T(np.ones(2, np.int64))
    with pytest.raises(TypeError, match="float16 and float32"):
        T(np.ones(2, np.float16)) * T(np.ones(2, np.float32))
    t = T(np.array([1, 2], np.int32))
    with pytest.raises(TypeError, match="output dtype int32 does not match the result dtype float32"):
        t += 0.5
    t += 2
    check(t, [3, 4], I32)


def test_autograd_promotes_like_tensors():
    x = T(np.array([1, 2, 3], np.int32))
    check(autograd.mul(x, 0.5), [0.5, 1.0, 1.5], F32)
    check(autograd.add(x, T(np.array([0.5, 0.5, 0.5], np.float32))), [1.5, 2.5, 3.5], F32)


def test_data_is_assignable_as_singa():
    """SINGA scripts update weights with `W.data += delta.data` (W keeps its memory) and swap raw tensors with
    `t.data = other.data`."""
    w = T(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    buf = w.buffer
    delta = T(np.full((2, 2), 0.5, np.float32))
    w.data += delta.data
    assert w.buffer is buf
    check(w, [[1.5, 2.5], [3.5, 4.5]], F32)
    w.data -= delta.data * 2.0
    check(w, [[0.5, 1.5], [2.5, 3.5]], F32)
    other = T(np.arange(3, dtype=np.int32))
    w.data = other.data
    assert w.buffer is other.buffer
    check(w, [0, 1, 2], I32)
    with pytest.raises(TypeError, match=r"Tensor\.data"):
        w.data = np.zeros(3)


def test_setitem_takes_what_getitem_gives():
    a = np.arange(12.0).reshape(3, 4)
    t = T(a.astype(np.float32))
    t[0] = t[2]  # a (1, 4) value into row 0
    t[1] += 10.0
    t[:, 3] = t[:, 0]  # (3, 1) into column 3
    a[0] = a[2]
    a[1] += 10
    a[:, 3] = a[:, 0]
    check(t, a, F32)
