"""Bad input gets an error that names the operation and both operands' shapes / dtypes (devices: test_tensor.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from singa import ops, tensor
from singa.tensor import Tensor

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")

F32, I32 = tensor.float32, tensor.int32


def raises(exc, message):
    """pytest.raises matching `message` literally (shapes are full of regex characters)."""
    return pytest.raises(exc, match=re.escape(message))


def test_broadcast_names_both_shapes():
    with raises(ValueError, "add: cannot broadcast shapes (2, 3) and (4,)"):
        Tensor((2, 3)) + Tensor((4,))
    with raises(ValueError, "mul: cannot broadcast shapes (5,) and (2, 3)"):
        ops.mul(Tensor((5,)), Tensor((2, 3)))
    with raises(ValueError, "lt: cannot broadcast shapes (2, 3) and (3, 2)"):
        tensor.lt(Tensor((2, 3)), Tensor((3, 2)))


def test_dtype_mismatch_names_both_dtypes():
    with raises(TypeError, "add: dtype mismatch int32 and int64"):  # one kind: never widened implicitly
        Tensor((2,), dtype=I32) + Tensor((2,), dtype=tensor.int64)
    with raises(TypeError, "sub: dtype mismatch float16 and float32"):
        Tensor((2,), dtype=tensor.float16) - Tensor((2,))
    with raises(TypeError, "matmul: dtype mismatch float32 and int64"):
        Tensor((2, 2)) @ Tensor((2, 2), dtype=tensor.int64)
    with raises(TypeError, "concat: dtype mismatch float32 and int32"):
        tensor.concatenate([Tensor((1, 2)), Tensor((1, 2), dtype=I32)], 0)
    with raises(TypeError, "where: dtype mismatch float32 and int32"):
        ops.where(Tensor((2,), dtype=tensor.bool), Tensor((2,)), Tensor((2,), dtype=I32))


def test_unsupported_dtypes():
    with raises(TypeError, "exp: dtype int32 is not supported (supported: float32, float16, float64)"):
        tensor.exp(Tensor((2,), dtype=I32))
    with raises(TypeError, "add: dtype bool is not supported"):
        Tensor((2,), dtype=tensor.bool) + Tensor((2,), dtype=tensor.bool)
    with raises(TypeError, "mean: dtype int32 is not supported"):
        ops.mean(Tensor((2,), dtype=I32))
    with raises(TypeError, "random_uniform: dtype int32 is not supported"):
        Tensor((2,), dtype=I32).uniform(0, 1)
    with raises(TypeError, "conv2d: dtype int32 is not supported"):
        ops.conv2d(Tensor((1, 1, 3, 3), dtype=I32), Tensor((1, 1, 2, 2), dtype=I32))


def test_scalars_adopt_the_tensor_dtype_exactly():
    with raises(ValueError, "add: scalar 3000000000 is out of range for int32"):
        Tensor((2,), dtype=I32) + 3_000_000_000
    with raises(TypeError, "fill: float scalar 1.5 with an int32 tensor"):
        Tensor((2,), dtype=I32).set_value(1.5)
    with raises(TypeError, "fill: scalar 2 cannot be used with a bool tensor"):
        Tensor((2,), dtype=tensor.bool).set_value(2)
    with raises(TypeError, "add: unsupported operand type str"):
        Tensor((2,)) + "x"


def test_inplace_result_must_fit():
    a = Tensor((3,))
    with raises(ValueError, "add: output shape (3,) does not match the result shape (2, 3)"):
        a += Tensor((2, 3))
    b = Tensor((3,), dtype=I32)
    with raises(TypeError, "add: output dtype int32 does not match the result dtype float32"):
        b += Tensor((3,))  # int32 + float32 computes in float32, which an int32 tensor cannot hold
    with raises(TypeError, "mul: output dtype int32 does not match the result dtype float32"):
        b *= 0.5
    with raises(TypeError, "add: output dtype int32 does not match the result dtype float32"):
        tensor.add(Tensor((3,)), Tensor((3,)), Tensor((3,), dtype=I32))


def test_matmul_errors_name_both_shapes():
    with raises(ValueError, "matmul: inner dimensions differ: a (2, 3) @ b (4, 5)"):
        Tensor((2, 3)) @ Tensor((4, 5))
    with raises(ValueError, "matmul: inner dimensions differ: a (3,) @ b (4,)"):
        ops.matmul(Tensor((3,)), Tensor((4,)))
    with raises(ValueError, "matmul: cannot broadcast batch dimensions: a (2, 3, 4) @ b (3, 4, 5)"):
        Tensor((2, 3, 4)) @ Tensor((3, 4, 5))
    with raises(ValueError, "matmul: 0-d operand: a () @ b (3,)"):
        Tensor(()) @ Tensor((3,))
    with raises(ValueError, "matmul: output shape (2, 2) does not match the result shape (2, 5)"):
        tensor.mult(Tensor((2, 3)), Tensor((3, 5)), Tensor((2, 2)))
    with raises(ValueError, "tensordot: shape mismatch: a (2, 3) axes (1,) and b (4, 5) axes (0,)"):
        tensor.tensordot(Tensor((2, 3)), Tensor((4, 5)), 1)


def test_layout_errors():
    with raises(ValueError, "reshape: cannot reshape (2, 3) (6 elements) to (4,) (4 elements)"):
        Tensor((2, 3)).reshape((4,))
    with raises(ValueError, "reshape: cannot reshape (2, 3) (6 elements) to (4, -1)"):
        Tensor((2, 3)).reshape((4, -1))
    with raises(ValueError, "transpose: axes (0, 0) are not a permutation of the 2 axes of shape (2, 3)"):
        Tensor((2, 3)).transpose((0, 0))
    with raises(ValueError, "expand: cannot broadcast shapes (3,) and (2, 4)"):
        ops.expand(Tensor((3,)), (2, 4))
    with raises(ValueError, "broadcast_to: cannot broadcast shape (2, 3) to (3,)"):
        ops.broadcast_to(Tensor((2, 3)), (3,))
    with raises(ValueError, "squeeze: axis 0 of shape (2, 1) has size 2, not 1"):
        ops.squeeze(Tensor((2, 1)), 0)
    with raises(ValueError, "assign: cannot broadcast source shape (2, 3) to destination shape (3,)"):
        ops.assign(Tensor((3,)), Tensor((2, 3)))
    with raises(ValueError, "concat: shapes (2, 3) and (2, 4) differ outside axis 0"):
        tensor.concatenate([Tensor((2, 3)), Tensor((2, 4))], 0)
    with raises(ValueError, "concat: axis 2 is out of range for shape (2, 3)"):
        tensor.concatenate([Tensor((2, 3))], 2)
    with raises(ValueError, "pad: expected 4 pad values for shape (2, 3), got 2"):
        ops.pad(Tensor((2, 3)), (1, 1))
    with raises(ValueError, "pad: reflect padding (3, 0) must be smaller than the size 3 of axis 1 in shape (2, 3)"):
        ops.pad(Tensor((2, 3)), (0, 3, 0, 0), "reflect")
    with raises(ValueError, "repeat: repeats [1, 2] must be 3 non-negative counts for axis 0 of shape (3,)"):
        tensor.repeat(Tensor((3,)), [1, 2], 0)


def test_reduction_errors():
    with raises(ValueError, "sum: axis 2 is out of range for shape (2, 3)"):
        ops.sum(Tensor((2, 3)), 2)
    with raises(ValueError, "max: repeated axis 1 for shape (2, 3)"):
        ops.max(Tensor((2, 3)), (1, -1))
    with raises(ValueError, "argmax: zero-size reduction over axis 0 of shape (0, 3)"):
        ops.argmax(Tensor((0, 3)), 0)
    with raises(ValueError, "sum_columns: expected a 2-D tensor, got shape (3,)"):
        tensor.sum_columns(Tensor((3,)))


def test_indexing_errors():
    with raises(IndexError, "index 3 is out of bounds for axis 0 with size 3 (shape (3, 2))"):
        Tensor((3, 2))[3]
    with raises(ValueError, "scatter_add: updates shape (2, 3) does not match (2, 2) (target (4, 2), indices (2,), "
                            "axis 0)"):
        ops.scatter_add(Tensor((4, 2)), [0, 1], Tensor((2, 3)))
    with raises(TypeError, "gather: indices must be int32 or int64, got float32"):
        ops.gather(Tensor((3,)), Tensor((2,)))
    with pytest.raises(IndexError, match="out of range"):
        ops.gather(Tensor((3,)), [0, 3])


def test_nn_errors_name_the_shapes():
    with raises(ValueError, "conv2d: input (1, 3, 5, 5) and weight (4, 2, 3, 3) do not match with groups=1"):
        ops.conv2d(Tensor((1, 3, 5, 5)), Tensor((4, 2, 3, 3)))
    with raises(ValueError, "conv2d: input must be 4-D (N, C, H, W), got shape (3, 5, 5)"):
        ops.conv2d(Tensor((3, 5, 5)), Tensor((4, 3, 3, 3)))
    with raises(ValueError, "conv2d: bias shape (3,) does not match the 4 kernels of weight (4, 3, 3, 3)"):
        ops.conv2d(Tensor((1, 3, 5, 5)), Tensor((4, 3, 3, 3)), Tensor((3,)))
    with raises(ValueError, "conv2d: kernel (3, 3) with dilation (1, 1) does not fit input (1, 1, 2, 2) with padding"):
        ops.conv2d(Tensor((1, 1, 2, 2)), Tensor((1, 1, 3, 3)))
    with raises(ValueError, "conv2d_backward_data: dy shape (1, 4, 2, 2) does not match the conv2d output "
                            "(1, 4, 3, 3) for input (1, 3, 5, 5) and weight (4, 3, 3, 3)"):
        ops.conv2d_backward_data(Tensor((1, 4, 2, 2)), Tensor((4, 3, 3, 3)), (1, 3, 5, 5))
    with raises(ValueError, "pool2d: kernel (3, 3) with dilation (1, 1) does not fit input (1, 1, 2, 2) with padding"):
        ops.pool2d(Tensor((1, 1, 2, 2)), 3)
    with raises(ValueError, "pool2d: mode must be 'max' or 'avg', got 'min'"):
        ops.pool2d(Tensor((1, 1, 4, 4)), 2, mode="min")
    with raises(ValueError, "batchnorm_train: scale shape (4,) does not match the 3 channels of x (2, 3, 4, 4)"):
        ops.batchnorm_train(Tensor((2, 3, 4, 4)), Tensor((4,)), Tensor((3,)), Tensor((3,)), Tensor((3,)))
    with raises(ValueError, "softmax_cross_entropy: label target shape (3,) does not match x (2, 5) "
                            "(expected (2,))"):
        ops.softmax_cross_entropy(Tensor((2, 5)), Tensor((3,), dtype=I32))
    with raises(ValueError, "softmax_cross_entropy: target shape (2, 4) does not match x (2, 5)"):
        ops.softmax_cross_entropy(Tensor((2, 5)), Tensor((2, 4)))
    with raises(ValueError, "softmax: axis 2 is out of range for shape (2, 5)"):
        ops.softmax(Tensor((2, 5)), 2)


def test_construction_and_copy_errors():
    with raises(ValueError, "Tensor: data of shape (6,) does not fit shape (4,)"):
        Tensor((4,), data=np.zeros(6))
    with raises(ValueError, "negative dimension in shape (2, -1)"):
        Tensor((2, -1))
    with raises(TypeError, "unknown SINGA dtype code 9"):
        Tensor((2,), dtype=9)
    with raises(TypeError, "numpy dtype complex128 has no SINGA equivalent"):
        Tensor(data=np.zeros(2, complex))
    with raises(ValueError, "copy_from_numpy: 7 values for a tensor of shape (2, 3) (6 elements); the sizes must "
                            "match"):
        Tensor((2, 3)).copy_from_numpy(np.zeros(7))
    with raises(ValueError, "copy_from_numpy: 3 values at offset 4 do not fit in a tensor of shape (2, 3) "
                            "(6 elements)"):
        Tensor((2, 3)).copy_from_numpy(np.zeros(3), offset=4)
    with raises(TypeError, "copy_from_numpy: cannot copy float64 data into a int32 tensor"):
        Tensor((2,), dtype=I32).copy_from_numpy(np.array([1.5, 2.5]))
    with raises(ValueError, "copy_data: source shape (2, 2) and destination shape (2, 3) have different numbers"):
        Tensor((2, 3)).copy_data(Tensor((2, 2)))
    with raises(TypeError, "copy_data_to_from: dtype mismatch float32 and int32"):
        tensor.copy_data_to_from(Tensor((2,)), Tensor((2,), dtype=I32), 2)
    with raises(ValueError, "copy_data_to_from: 3 elements from offset 0 of src (3,) to offset 1 of dst (3,) run "
                            "past the end"):
        tensor.copy_data_to_from(Tensor((3,)), Tensor((3,)), 3, dst_offset=1)
    with raises(ValueError, "add_row: v of shape (3,) does not match the 4 columns of a tensor of shape (2, 4)"):
        Tensor((2, 4)).add_row(Tensor((3,)))
    with raises(ValueError, "random_bernoulli: p must be in [0, 1], got 1.5"):
        Tensor((2,)).bernoulli(1.5)


def test_einsum_errors():
    with raises(ValueError, "einsum: size mismatch for index 'j': 3 and 4"):
        tensor.einsum("ij,jk->ik", Tensor((2, 3)), Tensor((4, 5)))
    with raises(ValueError, "einsum: subscripts 'ijk' do not match operand 0 of shape (2, 3)"):
        tensor.einsum("ijk->i", Tensor((2, 3)))
    with raises(ValueError, "einsum: 1 operand subscripts in 'ij' for 2 operands"):
        tensor.einsum("ij", Tensor((2, 3)), Tensor((2, 3)))
