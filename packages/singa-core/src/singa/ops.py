"""Functional operations on Tensors, device-agnostic and without autograd (autograd calls these both ways).

Each operation validates its inputs, works out the result's shape and dtype, allocates the result on the inputs'
device (`device.alloc`) and calls the device's kernel, `device.table[name](*views, **params)`, per the contract in
`singa.primitives`. The core never touches device memory: transposes, slices, broadcasting and `expand` are views that
only change shape/strides/offset; everything else is a kernel call.

Dtype rule of the element-wise binary operations (SINGA's, made explicit):

* operands of different kinds (bool < integer < float) compute in the dtype of the higher kind, the other operand
  converted first, as SINGA casts: int32 + float32 is float32, bool * int32 is int32;
* operands of the same kind and different widths are not promoted (float16 + float32, int32 + int64): TypeError
  naming both, so that a half-precision or int64 index path never widens silently;
* a Python or numpy scalar adopts the tensor's dtype, except that a float scalar with an integer or bool tensor makes
  the result float32 (SINGA converts the scalar with float(); `int_tensor * 0.5` is float32, `int_tensor * 2` stays
  integer); an integer scalar out of an integer tensor's range is an error;
* a numpy array operand becomes a tensor of the other operand's dtype when it is of the same kind (float/int/bool),
  else a tensor of its own dtype (float64 as float32), and the rule above applies;
* integer `div` truncates toward zero (C, as the kernels do); `floor_divide` and `mod` follow Python.

Errors name the operation and both operands' shapes, dtypes or devices: `add: cannot broadcast shapes (2, 3) and (4,)`.

Where it lives: this module re-exports every name of its families and installs the Tensor operators (`+`, `*`, ...):
`singa.ops_core` (construction, validation, `_run`, scalars, cast/copy/fill/assign), `ops_elementwise`, `ops_shape`
(views, indexing, concat, pad, gather/scatter), `ops_reduce`, `ops_linalg`, `ops_conv`, `ops_nn` (normalisation,
softmax, losses) and `ops_random`.
"""

from __future__ import annotations

from singa.ops_conv import *  # noqa: F403 - re-exported: this module is the public face of its families
from singa.ops_conv import (  # noqa: F401 - private names, re-exported for code that reaches them through this module
    _FUSED_ACTIVATIONS,
    _conv_geometry,
    _float_pair,
    _pads4,
    _pair,
    _pool_len,
    _pool_params,
)
from singa.ops_core import *  # noqa: F403 - re-exported: this module is the public face of its families
from singa.ops_core import (  # noqa: F401 - private names, re-exported for code that reaches them through this module
    _ALL,
    _FLOATS,
    _INTS,
    _ITEMSIZE,
    _LEFT_SCALAR,
    _META,
    _NOPARAMS,
    _NUMERIC,
    _RIGHT_SCALAR,
    _TABLES,
    _array_operand,
    _as_strided,
    _axes,
    _axis,
    _bview,
    _check_out,
    _const,
    _contig,
    _contiguous_input,
    _default_device,
    _device_dtype,
    _dt,
    _empty,
    _entry_dtypes,
    _hazard,
    _kind,
    _meta,
    _name,
    _new,
    _promote,
    _run,
    _same_device,
    _same_dtype,
    _scalar,
    _shape_arg,
    _supported,
    _table,
    _tensor,
    _wrap,
)
from singa.ops_elementwise import *  # noqa: F403 - re-exported: this module is the public face of its families
from singa.ops_elementwise import (  # noqa: F401 - private names, re-exported for code that reaches them through this module
    _TABLE,
    _make_binary,
    _make_unary,
    add,
    div,
    mul,
    sub,
)
from singa.ops_linalg import *  # noqa: F403 - re-exported: this module is the public face of its families
from singa.ops_linalg import (  # noqa: F401 - private names, re-exported for code that reaches them through this module
    _mat_operand,
    _matrix_product,
    _plain_matrix,
)
from singa.ops_nn import *  # noqa: F403 - re-exported: this module is the public face of its families
from singa.ops_nn import (  # noqa: F401 - private names, re-exported for code that reaches them through this module
    _bn_check,
    _graph,
    _softmax_grad,
    _softmax_like,
    _xent_check,
)
from singa.ops_random import *  # noqa: F403 - re-exported: this module is the public face of its families
from singa.ops_random import (  # noqa: F401 - private names, re-exported for code that reaches them through this module
    _random,
)
from singa.ops_reduce import *  # noqa: F403 - re-exported: this module is the public face of its families
from singa.ops_reduce import (  # noqa: F401 - private names, re-exported for code that reaches them through this module
    _arg,
    _reduce,
)
from singa.ops_shape import *  # noqa: F403 - re-exported: this module is the public face of its families
from singa.ops_shape import (  # noqa: F401 - private names, re-exported for code that reaches them through this module
    _index_array,
    _infer_shape,
    _reshape_strides,
)
from singa.tensor import Tensor

# The hottest operators are these functions themselves (one Python call less than a method that forwards to them).
# Element-wise add and mul commute, so the reflected forms can be the same functions.
Tensor.__add__ = Tensor.__radd__ = add
Tensor.__mul__ = Tensor.__rmul__ = mul
Tensor.__sub__ = sub
Tensor.__truediv__ = div
