"""SINGA's `autograd` module: reverse-mode differentiation over `singa.ops`, with SINGA's Operator API.

Calling an `Operator` records, for every input, the operator that produced it (its `creator`; a leaf gets a `Dummy`),
and marks the outputs with `creator = op`, whatever the flag `training` (one per thread) says: the graph's topology
always exists, so that a forward pass run in evaluation mode can be exported (`sonnx.to_onnx`). The flag decides what
the operators keep for the backward pass: while `training` is True they keep it, otherwise nothing (and backward
through them fails). `backward(loss)` walks the graph from the loss, summing every gradient contribution of a tensor
before the operator that produced it runs its own backward (dependency counting), and yields `(param, grad)` for each
tensor with `stores_grad=True`.

Every forward and backward computation goes through `singa.ops`, so it runs on whatever device the tensors live on.
Our Tensor is also SINGA's raw data (`CTensor`): `forward` and `backward` take and return Tensors.

Memory: an operator keeps the tensors its backward needs as long as the graph lives, so that `backward` may run twice
over one graph as in SINGA (a GAN updates two parts of a model from one loss); they are never kept when `training` is
False. `backward(loss, retain_graph=False)` drops each operator's tensors as soon as its backward has run (an
optimizer's `opt(loss)` does this: the step is done with the graph). The graph holds no reference cycles, so it is
freed as soon as the loss tensor goes away.

Errors: an operator (or layer) given invalid input raises ValueError or TypeError naming what is wrong; the error is
also an AssertionError, the type SINGA's own asserts raise, so scripts written for either catch it.

Where it lives: this module is the public face (the `training` property of the module, the legacy layer aliases) and
re-exports every name of `singa.autograd_engine` (the flag, the errors, `Operator`, `Dummy`, `backward`, the shared
helpers) and of the operator families in `singa.operators`: `unary` (math, activations, softmax, cast), `binary`
(arithmetic, comparisons, logic, sum/mean/max/min, where), `linalg`, `shape`, `reduce`, `indexing`, `nn` (dropout,
convolution, pooling, normalisation) and `loss`.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from singa.autograd_engine import *  # noqa: F403 - re-exported: this module is the public face of its families
from singa.autograd_engine import (  # noqa: F401 - private names, re-exported for code that reaches them through this module
    _BOOKKEEPING,
    _COMPAT_ERRORS,
    _FLOATS,
    _INTS,
    _as_index,
    _backward,
    _compat_error,
    _do_backward,
    _dt,
    _expand,
    _fit,
    _full,
    _GradDict,
    _holds_tensor,
    _inputs_needing_grad,
    _ints,
    _is_float,
    _loss_shape,
    _NoGrad,
    _op_next,
    _OperatorType,
    _pending_outputs,
    _Plain,
    _scalar_grad,
    _tensor_inputs,
    _to_dtype,
    _TrainingFlag,
    _wrap_negative,
    _zeros,
    training,
)
from singa.operators.binary import *  # noqa: F403 - re-exported: this module is the public face of its families
from singa.operators.binary import (  # noqa: F401 - private names, re-exported for code that reaches them through this module
    _and,
    _as_bool,
    _Binary,
    _bool_like,
    _Compare,
    _Logical,
    _not,
    _or,
    _xor,
)
from singa.operators.indexing import *  # noqa: F403 - re-exported: this module is the public face of its families
from singa.operators.linalg import *  # noqa: F403 - re-exported: this module is the public face of its families
from singa.operators.linalg import (  # noqa: F401 - private names, re-exported for code that reaches them through this module
    _matrix_grads,
    _swap,
)
from singa.operators.loss import *  # noqa: F403 - re-exported: this module is the public face of its families
from singa.operators.loss import (  # noqa: F401 - private names, re-exported for code that reaches them through this module
    _batch,
    _class_target,
    _dense_target,
    _Loss,
)
from singa.operators.nn import *  # noqa: F403 - re-exported: this module is the public face of its families
from singa.operators.nn import (  # noqa: F401 - private names, re-exported for code that reaches them through this module
    _BatchNorm2d,
    _Conv2d,
    _pads4,
    _pair,
    _Pooling2d,
)
from singa.operators.reduce import *  # noqa: F403 - re-exported: this module is the public face of its families
from singa.operators.reduce import (  # noqa: F401 - private names, re-exported for code that reaches them through this module
    _reduce_axes,
)
from singa.operators.shape import *  # noqa: F403 - re-exported: this module is the public face of its families
from singa.operators.shape import (  # noqa: F401 - private names, re-exported for code that reaches them through this module
    _BlockMove,
    _depth_to_space,
    _Reshaping,
    _space_to_depth,
)
from singa.operators.unary import *  # noqa: F403 - re-exported: this module is the public face of its families
from singa.operators.unary import (  # noqa: F401 - private names, re-exported for code that reaches them through this module
    _Flat,
    _forward_a,
    _gelu_grad,
    _gelu_tanh_grad,
    _round_half_away,
    _SoftMaxLike,
    _Unary,
    _unary,
)


class _AutogradModule(types.ModuleType):
    @property
    def training(self) -> bool:
        return training.value

    @training.setter
    def training(self, flag: Any) -> None:
        training.set(flag)


sys.modules[__name__].__class__ = _AutogradModule


# The legacy layer classes that SINGA re-exports from autograd (resolved lazily: singa.layer imports this module).
_LAYER_ALIASES = frozenset({
    "Linear", "Conv2d", "SeparableConv2d", "BatchNorm2d", "Pooling2d", "MaxPool2d", "AvgPool2d", "MaxPool1d",
    "AvgPool1d", "RNN_Base", "RNN", "LSTM",
})


def __getattr__(name: str) -> Any:
    if name in _LAYER_ALIASES:
        from singa import layer

        return getattr(layer, name)
    raise AttributeError(f"module 'singa.autograd' has no attribute {name!r}")
