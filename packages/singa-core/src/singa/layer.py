"""SINGA's `layer` module: operators with parameters, created lazily from the first input.

A layer is configured without knowing its input size (`Linear(10)` takes only the output size). Its first call
runs `initialize(*inputs)`, which creates the parameters from the input's shape, on the input's device, in the
input's float dtype (float32 for integer inputs such as embedding ids); `LayerMeta` arranges this by wrapping each
class's `initialize` and `forward`.

Names. A layer assigned as an attribute of another layer (a Model is a Layer) becomes its sublayer under that
attribute name, so parameters and states get hierarchical names: `linear1.W`, `block1.conv2.b`, `bn1.running_mean`.
The root layer adds no prefix (a lone `Linear` has `W` and `b`). Each parameter tensor's `name` is kept equal to its
hierarchical name. `get_params()` returns the trainable tensors (requires_grad and stores_grad True);
`get_states()` returns them plus the buffers that are not trained (BatchNorm2d's running mean and variance).

Shapes are never frozen at the first call: convolution, pooling, batch normalisation and the recurrent layers take a
different batch size (and, for SAME padding, a different image size) at every call.
"""

from __future__ import annotations

import builtins
import functools
import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import numpy as np

from singa import autograd, rnn
from singa import dtypes as _dt
from singa.tensor import Tensor

__all__ = [
    "LayerMeta", "Layer", "Linear", "Gemm", "Embedding", "Conv2d", "SeparableConv2d", "BatchNorm2d", "Pooling2d",
    "MaxPool2d", "AvgPool2d", "MaxPool1d", "AvgPool1d", "RNN_Base", "RNN", "LSTM", "ReLU", "Sigmoid", "Add",
    "Flatten", "SoftMaxCrossEntropy", "SoftMax", "MeanSquareError", "CrossEntropy", "BinaryCrossEntropy", "Dropout",
    "Cat", "Reshape", "CudnnRNN", "LayerNorm",
]

_PAD_MODES = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def _first_tensor(args: Sequence[Any]) -> Tensor | None:
    """The first Tensor among the arguments, looking one level into lists and tuples (RNN steps, Cat inputs)."""
    for a in args:
        if isinstance(a, Tensor):
            return a
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, Tensor):
                    return b
    return None


class LayerMeta(type):
    """Wraps each class's `initialize` (parameter creation, run once) and `forward` (which calls `initialize` on
    the first call)."""

    @staticmethod
    def init_wrapper(func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(self: Layer, *args: Any, **kwargs: Any) -> Any:
            x = _first_tensor(args)
            dev = x.device if x is not None else None
            # Creating parameters is set-up, not a step of the model: keep it out of a graph being recorded.
            enabled = getattr(dev, "graph_enabled", None)
            pause = callable(enabled) and enabled() and hasattr(dev, "EnableGraph")
            if pause:
                dev.EnableGraph(False)
            try:
                out = func(self, *args, **kwargs)
            finally:
                if pause:
                    dev.EnableGraph(True)
            self.__dict__["_initialized"] = True
            return out

        wrapper.__wrapped_by_layermeta__ = True
        return wrapper

    @staticmethod
    def forward_wrapper(func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(self: Layer, *args: Any, **kwargs: Any) -> Any:
            try:
                if not self.__dict__.get("_initialized", False):
                    self.initialize(*args, **kwargs)
                    self.__dict__["_initialized"] = True
                return func(self, *args, **kwargs)
            except (ValueError, TypeError, IndexError) as exc:  # invalid input: also SINGA's AssertionError
                raise autograd._compat_error(exc) from None

        wrapper.__wrapped_by_layermeta__ = True
        return wrapper

    def __new__(mcs, name: str, bases: tuple, attrs: dict) -> LayerMeta:
        for key, wrap in (("initialize", LayerMeta.init_wrapper), ("forward", LayerMeta.forward_wrapper)):
            fn = attrs.get(key)
            if callable(fn) and not getattr(fn, "__wrapped_by_layermeta__", False):
                attrs[key] = wrap(fn)
        return super().__new__(mcs, name, bases, attrs)


class Layer(metaclass=LayerMeta):
    """Base class of layers (and of `model.Model`).

    Subclasses override `initialize(*inputs)` to create parameters with `_param(...)` / `_state(...)` and
    `forward(*inputs)`. Sublayers are registered by attribute assignment (`self.fc = Linear(10)`) or
    `register_layers`.
    """

    sep = "."

    def __init__(self) -> None:
        d = self.__dict__
        d["name"] = type(self).__name__
        d["_initialized"] = False
        d["_parent"] = None
        d.setdefault("_layers", {})
        d.setdefault("_param_names", [])
        d.setdefault("_state_names", [])

    # -- the two methods a subclass writes ----------------------------------------------------------------------------
    def initialize(self, *input: Any, **kwargs: Any) -> None:
        """Create parameters from the first inputs (nothing for a layer without parameters)."""

    def forward(self, *input: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.forward is not implemented")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    # -- sublayers ----------------------------------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: sublayers live in _layers, not in __dict__.
        d = self.__dict__
        layers = d.get("_layers")
        if layers is not None and name in layers:
            return layers[name]
        hint = ""
        if not name.startswith("__") and not d.get("_initialized", True):
            hint = " (parameters are created by the layer's first call)"
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'{hint}")

    def __setattr__(self, name: str, value: Any) -> None:
        layers = self.__dict__.setdefault("_layers", {})
        if isinstance(value, Layer):
            self.__dict__.pop(name, None)
            layers[name] = value
            value.__dict__["_parent"] = self
            value.__dict__["name"] = name
        else:
            layers.pop(name, None)
            object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        layers = self.__dict__.get("_layers", {})
        if name in layers:
            del layers[name]
        else:
            object.__delattr__(self, name)

    def register_layers(self, *args: Any) -> None:
        """Register sublayers: `register_layers(l1, l2, ...)` or a list of layers (named `<Class>_<index>`), or one
        mapping {name: layer}."""
        if len(args) == 1 and isinstance(args[0], Mapping):
            items = list(args[0].items())
        else:
            seq = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
            items = [(f"{type(v).__name__}_{i}", v) for i, v in enumerate(seq)]
        for name, value in items:
            if not isinstance(value, Layer):
                raise TypeError(f"register_layers: {name!r} is a {type(value).__name__}, not a Layer")
            setattr(self, str(name), value)

    def _prefix(self) -> str:
        """'a.b.' for a layer reached as root.a.b; '' for the root."""
        parts = []
        node = self
        while node.__dict__.get("_parent") is not None:
            parts.append(node.__dict__["name"])
            node = node.__dict__["_parent"]
        return Layer.sep.join(reversed(parts)) + Layer.sep if parts else ""

    # -- parameters and states ----------------------------------------------------------------------------------------
    def _new_tensor(self, local: str, shape: Sequence[int], like: Tensor | None, trainable: bool) -> Tensor:
        dev = like.device if like is not None else None
        dtype = _param_dtype(like)
        t = Tensor(shape=tuple(int(s) for s in shape), device=dev, dtype=dtype, requires_grad=trainable,
                   stores_grad=trainable, name=self._prefix() + local)
        names = self.__dict__.setdefault("_param_names" if trainable else "_state_names", [])
        if local not in names:
            names.append(local)
        object.__setattr__(self, local, t)
        return t

    def _param(self, local: str, shape: Sequence[int], like: Tensor | None) -> Tensor:
        """A zero trainable parameter stored as attribute `local`, on `like`'s device, in its float dtype."""
        return self._new_tensor(local, shape, like, True)

    def _state(self, local: str, shape: Sequence[int], like: Tensor | None) -> Tensor:
        """A zero non-trainable state (a running statistic) stored as attribute `local`."""
        return self._new_tensor(local, shape, like, False)

    def _own(self, names: Sequence[str]) -> dict[str, Tensor]:
        prefix = self._prefix()
        out = {}
        for local in names:
            t = self.__dict__.get(local)
            if isinstance(t, Tensor):
                t.name = prefix + local
                out[t.name] = t
        return out

    def _own_params(self) -> list[Tensor]:
        return list(self._own(self.__dict__.get("_param_names", ())).values())

    def get_params(self) -> dict[str, Tensor]:
        """{hierarchical name: tensor} of the trainable parameters of this layer and all its sublayers."""
        params = self._own(self.__dict__.get("_param_names", ()))
        for sub in self.__dict__.get("_layers", {}).values():
            params.update(sub.get_params())
        return params

    def get_states(self) -> dict[str, Tensor]:
        """The parameters plus the non-trainable states (running statistics), by hierarchical name."""
        states = self._own(self.__dict__.get("_state_names", ()))
        for sub in self.__dict__.get("_layers", {}).values():
            states.update(sub.get_states())
        states.update(self.get_params())
        return states

    def set_params(self, parameters: Mapping[str, Any]) -> None:
        """Copy values (Tensors or numpy arrays) into the parameters named by the keys; others keep their values."""
        _assign(type(self).__name__, "parameter", self.get_params(), parameters)

    def set_states(self, states: Mapping[str, Any]) -> None:
        """Copy values into the parameters and states named by the keys; others keep their values."""
        _assign(type(self).__name__, "parameter or state", self.get_states(), states)

    # -- input checks -------------------------------------------------------------------------------------------------
    def dtype_check(self, *inputs: Tensor) -> None:
        """Convert, in place, every tensor to the dtype of the first one."""
        dtype = inputs[0].dtype
        for t in inputs[1:]:
            if t is not None and t.dtype != dtype:
                t.to_type(dtype)

    def device_check(self, *inputs: Tensor) -> None:
        """Move, in place, every tensor to the device of the first one."""
        dev = inputs[0].device
        for t in inputs[1:]:
            if t is not None and t.device is not dev:
                t.to_device(dev)

    def _align(self, x: Tensor, *params: Tensor | None) -> None:
        """Bring the parameters to x's device and, for float inputs, to x's dtype (half precision training)."""
        dev, dt = x.device, x.dtype
        for p in params:  # (every step: usually nothing to do)
            if p is not None and (p.device is not dev or p.dtype != dt):
                break
        else:
            return
        ps = [p for p in params if p is not None]
        self.device_check(x, *ps)
        if x.dtype in _dt.FLOATS:
            self.dtype_check(x, *ps)

    def __repr__(self) -> str:
        subs = ", ".join(f"{k}={type(v).__name__}" for k, v in self.__dict__.get("_layers", {}).items())
        return f"{type(self).__name__}({subs})"


def _param_dtype(like: Tensor | None) -> int:
    if like is not None and like.dtype in _dt.FLOATS:
        return like.dtype
    return _dt.float32


def _assign(owner: str, what: str, targets: dict[str, Tensor], values: Mapping[str, Any]) -> None:
    unknown = [k for k in values if k not in targets]
    if unknown:
        known = ", ".join(sorted(targets)[:12]) + (" ..." if len(targets) > 12 else "")
        raise KeyError(f"{owner}: no {what} named {', '.join(map(repr, unknown))} (known: {known or 'none'}; "
                       "layers create their parameters on their first call, so run the model once before loading)")
    for key, value in values.items():
        dst = targets[key]
        if isinstance(value, Tensor):
            src = value if value.dtype == dst.dtype else value.as_type(dst.dtype)
            shape = src.shape
        else:
            arr = np.asarray(value)
            shape = arr.shape
        # Only size-1 axes may differ (a (1, n) bias for an (n,) one); anything else is a real mismatch.
        if shape != dst.shape and [d for d in shape if d != 1] != [d for d in dst.shape if d != 1]:
            raise ValueError(f"{owner}: {what} {key!r} has shape {dst.shape}, the value has shape {shape}")
        if isinstance(value, Tensor):
            dst.copy_data(src)
        else:
            dst.copy_from_numpy(arr)


# -- helpers for sizes and padding --------------------------------------------------------------------------------


def _pair(op: str, v: Any, what: str) -> tuple[int, int]:
    if isinstance(v, (int, np.integer)) and not isinstance(v, builtins.bool):
        t = (int(v), int(v))
    else:
        try:
            t = tuple(int(e) for e in v)
        except TypeError:
            raise TypeError(f"{op}: {what} must be an int or a pair of ints, got {v!r}") from None
    if len(t) != 2:
        raise ValueError(f"{op}: {what} must be an int or a pair of ints, got {v!r}")
    return t


def _explicit_pads(op: str, padding: Any) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from an int, (ph, pw) or four values in that order (ONNX's pads order)."""
    if padding is None:
        return (0, 0, 0, 0)
    if isinstance(padding, (int, np.integer)):
        p = (int(padding),) * 4
    else:
        p = tuple(int(e) for e in padding)
        if len(p) == 2:
            p = (p[0], p[1], p[0], p[1])
    if len(p) != 4 or any(e < 0 for e in p):
        raise ValueError(f"{op}: padding must be an int, (ph, pw) or (top, left, bottom, right) >= 0, got "
                         f"{padding!r}")
    return p


def _check_pad_mode(op: str, pad_mode: str) -> str:
    mode = str(pad_mode).upper()
    if mode not in _PAD_MODES:
        raise ValueError(f"{op}: pad_mode must be one of {', '.join(_PAD_MODES)}, got {pad_mode!r}")
    return mode


def _same_pads(mode: str, size: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
               dilation: Sequence[int] = (1, 1)) -> tuple[int, int, int, int]:
    """ONNX auto_pad SAME_*: output = ceil(input / stride); an odd total puts the extra row/column at the end
    (SAME_UPPER) or at the beginning (SAME_LOWER)."""
    begins, ends = [], []
    for n, k, s, d in zip(size, kernel, stride, dilation):
        out = -(-n // s)
        total = builtins.max((out - 1) * s + (k - 1) * d + 1 - n, 0)
        small, big = total // 2, total - total // 2
        begins.append(small if mode == "SAME_UPPER" else big)
        ends.append(big if mode == "SAME_UPPER" else small)
    return (begins[0], begins[1], ends[0], ends[1])


def _pads_for(mode: str, explicit: tuple[int, int, int, int], x: Tensor, kernel: tuple, stride: tuple,
              dilation: tuple = (1, 1)) -> tuple[int, int, int, int]:
    if mode == "NOTSET":
        return explicit
    if mode == "VALID":
        return (0, 0, 0, 0)
    return _same_pads(mode, x.shape[2:4], kernel, stride, dilation)


def _broadcasts(shape: tuple, to: tuple) -> bool:
    """Whether `shape` broadcasts to `to` (numpy's rule)."""
    if len(shape) > len(to):
        return False
    return all(a in (1, b) for a, b in zip(shape[::-1], to[::-1]))


def _as_steps(out: Any) -> list[Tensor]:
    """A multi-output operator's results as a list (a one-output call may return a bare Tensor)."""
    return [out] if isinstance(out, Tensor) else list(out)


# -- dense layers -------------------------------------------------------------------------------------------------


class Linear(Layer):
    """y = x W + b, W of shape (in_features, out_features), b of shape (out_features,).

    `Linear(out_features)`; SINGA's older `Linear(in_features, out_features[, bias])` is accepted too (the input
    size is then checked at the first call). W ~ N(0, 2 / (in + out)) as in SINGA, b = 0.
    """

    def __init__(self, out_features: int, *args: Any, bias: bool = True, **kwargs: Any) -> None:
        super().__init__()
        if kwargs:
            raise TypeError(f"Linear: unexpected keyword argument(s) {', '.join(kwargs)}")
        self.in_features: int | None = None
        self.out_features = int(out_features)
        self.bias = bias
        if len(args) > 0:
            self.in_features, self.out_features = int(out_features), int(args[0])
        if len(args) > 1:
            self.bias = bool(args[1])
        if len(args) > 2:
            raise TypeError(f"Linear: too many positional arguments {args!r}")
        if self.out_features <= 0:
            raise ValueError(f"Linear: out_features must be positive, got {self.out_features}")

    def initialize(self, x: Tensor) -> None:
        n_in = x.shape[-1] if x.shape else 0
        if self.in_features is not None and self.in_features != n_in:
            raise ValueError(f"Linear: declared in_features={self.in_features} but the input has shape {x.shape}")
        self.in_features = n_in
        self._param("W", (n_in, self.out_features), x).gaussian(0.0, math.sqrt(2.0 / (n_in + self.out_features)))
        self.b = self._param("b", (self.out_features,), x) if self.bias else None

    def forward(self, x: Tensor) -> Tensor:
        if not x.shape or x.shape[-1] != self.W.shape[0]:
            raise ValueError(f"Linear: expects {self.W.shape[0]} input features, got an input of shape {x.shape}")
        self._align(x, self.W, self.b)
        if self.b is not None and len(x.shape) == 2 and self.b.shape == (self.W.shape[1],):
            return autograd.matmul_bias(x, self.W, self.b)
        y = autograd.matmul(x, self.W)
        if self.b is not None:
            y = autograd.add_bias(y, self.b, axis=0) if len(y.shape) == 2 else autograd.add(y, self.b)
        return y


class Gemm(Layer):
    """y = alpha * op(x) op(W) + beta * b (ONNX Gemm), op transposing when transA / transB.

    W is (nb_kernels, in) when transB (the default) else (in, nb_kernels); b is `bias_shape` or (1, nb_kernels).
    """

    def __init__(self, nb_kernels: int, alpha: float = 1.0, beta: float = 1.0, transA: bool = False,
                 transB: bool = True, bias: bool = True, bias_shape: Sequence[int] | None = None) -> None:
        super().__init__()
        self.nb_kernels = int(nb_kernels)
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.transA = 1 if transA else 0
        self.transB = 1 if transB else 0
        self.bias = bias
        self.bias_shape = tuple(bias_shape) if bias_shape is not None else None

    def _in_features(self, x: Tensor) -> int:
        if len(x.shape) != 2:
            raise ValueError(f"Gemm: expects a 2-D input, got shape {x.shape}")
        return x.shape[0] if self.transA else x.shape[1]

    def initialize(self, x: Tensor) -> None:
        self.in_features = self._in_features(x)
        shape = (self.nb_kernels, self.in_features) if self.transB else (self.in_features, self.nb_kernels)
        self._param("W", shape, x).gaussian(0.0, math.sqrt(2.0 / (self.in_features + self.nb_kernels)))
        self.b = self._param("b", self.bias_shape or (1, self.nb_kernels), x) if self.bias else None

    def forward(self, x: Tensor) -> Tensor:
        n_in = self._in_features(x)
        w_in = self.W.shape[1] if self.transB else self.W.shape[0]
        if n_in != w_in:
            raise ValueError(f"Gemm: expects {w_in} input features, got an input of shape {x.shape} "
                             f"(transA={self.transA})")
        self._align(x, self.W, self.b)
        return autograd.gemm(x, self.W, self.b, self.alpha, self.beta, self.transA, self.transB)


class Embedding(Layer):
    """Looks up rows of W (input_dim, output_dim) for integer ids x of any shape: y has shape x.shape + (output_dim,).

    initializer: 'gaussian' (N(0, 1), the default), 'uniform' (U(-1, 1)), the name of a `singa.initializer`
    function, or a callable filling a tensor in place.
    """

    def __init__(self, input_dim: int, output_dim: int, initializer: str | Callable = "gaussian") -> None:
        super().__init__()
        self.input_dim = int(input_dim)
        self.output_dim = int(output_dim)
        self.initializer = initializer

    def initialize(self, x: Tensor) -> None:
        W = self._param("W", (self.input_dim, self.output_dim), x)
        init = self.initializer
        if callable(init):
            init(W)
        elif init == "gaussian":
            W.gaussian(0.0, 1.0)
        elif init == "uniform":
            W.uniform(-1.0, 1.0)
        else:
            from singa import initializer as _init

            fn = getattr(_init, str(init), None)
            if not callable(fn):
                raise ValueError(f"Embedding: unknown initializer {init!r}")
            fn(W)

    def from_pretrained(self, W: Tensor | np.ndarray, freeze: bool = True) -> Embedding:
        """Use the given (input_dim, output_dim) matrix; with freeze it receives no gradient."""
        shape = tuple(W.shape)
        if shape != (self.input_dim, self.output_dim):
            raise ValueError(f"Embedding.from_pretrained: expected shape {(self.input_dim, self.output_dim)}, got "
                             f"{shape}")
        if "W" not in self.__dict__:
            like = W if isinstance(W, Tensor) else None
            self._param("W", shape, like)
            self.__dict__["_initialized"] = True
        if isinstance(W, Tensor):
            self.W.copy_data(W if W.dtype == self.W.dtype else W.as_type(self.W.dtype))
        else:
            self.W.copy_from_numpy(np.asarray(W))
        self.W.requires_grad = not freeze
        self.W.stores_grad = not freeze
        return self

    def forward(self, x: Tensor) -> Tensor:
        self.device_check(x, self.W)
        return autograd.embedding(x, self.W)


# -- convolution and pooling --------------------------------------------------------------------------------------


class Conv2d(Layer):
    """2-D convolution of x (N, C, H, W) with W (nb_kernels, C / group, kh, kw) and b (nb_kernels,).

    padding: int, (ph, pw) or (top, left, bottom, right); ignored unless pad_mode is 'NOTSET'. pad_mode 'SAME_UPPER'
    / 'SAME_LOWER' pads so that the output is ceil(input / stride) for every input size, the odd pixel at the end /
    beginning (ONNX); 'VALID' means no padding. activation 'RELU' applies a ReLU to the output.

    SINGA's older `Conv2d(in_channels, out_channels, kernel_size[, stride[, padding]])` is accepted (in_channels is
    then checked at the first call). Initial W ~ N(0, 2 / (C / group * kh * kw + nb_kernels)) as in SINGA (the
    Glorot variance with fan_out counted as nb_kernels), b = 0.
    """

    _SINGA_TUNING = ("cudnn_prefer", "workspace_MB_limit")  # cuDNN hints in SINGA; nothing to tune here

    def __init__(self, nb_kernels: int, kernel_size: Any, *args: Any, stride: Any = 1, padding: Any = 0,
                 dilation: Any = 1, group: int = 1, bias: bool = True, pad_mode: str = "NOTSET",
                 activation: str = "NOTSET", **kwargs: Any) -> None:
        super().__init__()
        bad = [k for k in kwargs if k not in self._SINGA_TUNING]
        if bad:
            raise TypeError(f"Conv2d: unexpected keyword argument(s) {', '.join(bad)}")
        self.in_channels: int | None = None
        if args:  # older signature: (in_channels, out_channels, kernel_size, stride, padding, dilation, group, bias)
            if len(args) > 6:
                raise TypeError(f"Conv2d: too many positional arguments {args!r}")
            self.in_channels, nb_kernels, kernel_size = int(nb_kernels), kernel_size, args[0]
            rest = list(args[1:])
            stride = rest.pop(0) if rest else stride
            padding = rest.pop(0) if rest else padding
            dilation = rest.pop(0) if rest else dilation
            group = rest.pop(0) if rest else group
            bias = rest.pop(0) if rest else bias
        self.nb_kernels = int(nb_kernels)
        self.kernel_size = _pair("Conv2d", kernel_size, "kernel_size")
        self.stride = _pair("Conv2d", stride, "stride")
        self.dilation = _pair("Conv2d", dilation, "dilation")
        self.padding = _explicit_pads("Conv2d", padding)
        self.group = int(group)
        self.bias = bool(bias)
        self.pad_mode = _check_pad_mode("Conv2d", pad_mode)
        act = str(activation).upper()
        if act not in ("NOTSET", "RELU"):
            raise ValueError(f"Conv2d: activation must be 'NOTSET' or 'RELU', got {activation!r}")
        self.activation = act
        if min(self.kernel_size) < 1 or min(self.stride) < 1 or min(self.dilation) < 1:
            raise ValueError(f"Conv2d: kernel_size {self.kernel_size}, stride {self.stride} and dilation "
                             f"{self.dilation} must be positive")
        if self.nb_kernels < 1 or self.group < 1 or self.nb_kernels % self.group:
            raise ValueError(f"Conv2d: nb_kernels={self.nb_kernels} must be a positive multiple of group={self.group}")

    def _check_input(self, x: Tensor) -> None:
        if len(x.shape) != 4:
            raise ValueError(f"Conv2d: expects a 4-D input (N, C, H, W), got shape {x.shape}")

    def initialize(self, x: Tensor) -> None:
        self._check_input(x)
        c = x.shape[1]
        if self.in_channels is not None and self.in_channels != c:
            raise ValueError(f"Conv2d: declared in_channels={self.in_channels} but the input has shape {x.shape}")
        if c % self.group:
            raise ValueError(f"Conv2d: {c} input channels are not divisible by group={self.group}")
        self.in_channels = c
        kh, kw = self.kernel_size
        cg = c // self.group
        W = self._param("W", (self.nb_kernels, cg, kh, kw), x)
        W.gaussian(0.0, math.sqrt(2.0 / (cg * kh * kw + self.nb_kernels)))
        self.b = self._param("b", (self.nb_kernels,), x) if self.bias else None

    def forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        if x.shape[1] != self.in_channels:
            raise ValueError(f"Conv2d: expects {self.in_channels} input channels, got an input of shape {x.shape}")
        self._align(x, self.W, self.b)
        pads = _pads_for(self.pad_mode, self.padding, x, self.kernel_size, self.stride, self.dilation)
        y = autograd.conv2d(x, self.W, self.b, stride=self.stride, padding=pads, dilation=self.dilation,
                            group=self.group)
        if self.activation == "RELU":
            y = autograd.relu(y)
        return y


class SeparableConv2d(Layer):
    """A depthwise convolution (one kh x kw filter per input channel) followed by a pointwise 1x1 convolution to
    nb_kernels channels; sublayers `depthwise_conv` and `point_conv`."""

    def __init__(self, nb_kernels: int, kernel_size: Any, *args: Any, stride: Any = 1, padding: Any = 0,
                 bias: bool = False) -> None:
        super().__init__()
        if args:  # older signature: (in_channels, out_channels, kernel_size, stride, padding)
            if len(args) > 3:
                raise TypeError(f"SeparableConv2d: too many positional arguments {args!r}")
            nb_kernels, kernel_size = kernel_size, args[0]
            stride = args[1] if len(args) > 1 else stride
            padding = args[2] if len(args) > 2 else padding
        self.nb_kernels = int(nb_kernels)
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self.bias = bias

    def initialize(self, x: Tensor) -> None:
        if len(x.shape) != 4:
            raise ValueError(f"SeparableConv2d: expects a 4-D input (N, C, H, W), got shape {x.shape}")
        self.in_channels = x.shape[1]
        self.depthwise_conv = Conv2d(self.in_channels, self.kernel_size, stride=self.stride, padding=self.padding,
                                     group=self.in_channels, bias=self.bias)
        self.point_conv = Conv2d(self.nb_kernels, 1, bias=self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.point_conv(self.depthwise_conv(x))


class BatchNorm2d(Layer):
    """Batch normalisation over the channels (axis 1) of (N, C) or (N, C, H, W) inputs.

    Parameters scale (1) and bias (0), states running_mean (0) and running_var (1), all of shape (C,). While
    `autograd.training` is True it normalises with the batch statistics and updates
    running = momentum * running + (1 - momentum) * batch (the variance unbiased); otherwise it uses the running
    values. `BatchNorm2d(C)` (SINGA's older form) checks C at the first call; `eps` is an extra keyword.
    """

    def __init__(self, *args: Any, momentum: float = 0.9, eps: float = 1e-5) -> None:
        super().__init__()
        if len(args) > 2:
            raise TypeError(f"BatchNorm2d: too many positional arguments {args!r}")
        self.channels: int | None = int(args[0]) if args else None
        self.momentum = float(args[1]) if len(args) > 1 else float(momentum)
        self.eps = float(eps)
        if not 0.0 <= self.momentum <= 1.0:
            raise ValueError(f"BatchNorm2d: momentum must be in [0, 1], got {self.momentum}")

    def _check_input(self, x: Tensor) -> None:
        if len(x.shape) not in (2, 4):
            raise ValueError(f"BatchNorm2d: expects an (N, C) or (N, C, H, W) input, got shape {x.shape}")

    def initialize(self, x: Tensor) -> None:
        self._check_input(x)
        c = x.shape[1]
        if self.channels is not None and self.channels != c:
            raise ValueError(f"BatchNorm2d: declared {self.channels} channels but the input has shape {x.shape}")
        self.channels = c
        self._param("scale", (c,), x).set_value(1.0)
        self._param("bias", (c,), x)
        self._state("running_mean", (c,), x)
        self._state("running_var", (c,), x).set_value(1.0)

    def forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        if x.shape[1] != self.channels:
            raise ValueError(f"BatchNorm2d: expects {self.channels} channels, got an input of shape {x.shape}")
        self._align(x, self.scale, self.bias, self.running_mean, self.running_var)
        return autograd.batchnorm_2d(x, self.scale, self.bias, self.running_mean, self.running_var,
                                     momentum=self.momentum, eps=self.eps)


class LayerNorm(Layer):
    """Layer normalisation over the last axes of the input (PyTorch's nn.LayerNorm): each example is normalised to
    mean 0 and variance 1 (the biased variance) over those axes, then scaled and shifted by the parameters scale (1)
    and bias (0), of the normalised shape. `LayerNorm(normalized_shape)` takes an int (the last axis) or a tuple;
    `elementwise_affine=False` leaves the parameters out, `bias=False` only the shift."""

    def __init__(self, normalized_shape: Any, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True) -> None:
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) else normalized_shape
        try:
            self.normalized_shape = tuple(operator.index(d) for d in shape)
        except TypeError:
            raise TypeError(f"LayerNorm: normalized_shape must be an int or a sequence of ints, got "
                            f"{normalized_shape!r}") from None
        if not self.normalized_shape or min(self.normalized_shape) < 1:
            raise ValueError(f"LayerNorm: normalized_shape must be positive sizes, got {normalized_shape!r}")
        self.eps = float(eps)
        self.elementwise_affine = bool(elementwise_affine)
        self.has_bias = bool(bias) and self.elementwise_affine

    def _check_input(self, x: Tensor) -> None:
        k = len(self.normalized_shape)
        if tuple(x.shape[-k:]) != self.normalized_shape or len(x.shape) < k:
            raise ValueError(f"LayerNorm: expects inputs ending in {self.normalized_shape}, got shape {x.shape}")

    def initialize(self, x: Tensor) -> None:
        self._check_input(x)
        if self.elementwise_affine:
            self._param("scale", self.normalized_shape, x).set_value(1.0)
        if self.has_bias:
            self._param("bias", self.normalized_shape, x)

    def forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        scale = self.scale if self.elementwise_affine else None
        bias = self.bias if self.has_bias else None
        self._align(x, *(t for t in (scale, bias) if t is not None))
        return autograd.layer_norm(x, scale, bias, axis=len(x.shape) - len(self.normalized_shape), eps=self.eps)


class Pooling2d(Layer):
    """Max or average pooling of (N, C, H, W) inputs; stride defaults to kernel_size.

    padding: int, (ph, pw) or (top, left, bottom, right), used when pad_mode is 'NOTSET'; 'SAME_UPPER' /
    'SAME_LOWER' / 'VALID' as for Conv2d. Extra keywords: ceil_mode (output size rounded up, PyTorch's rule) and
    count_include_pad (average pooling divides by the full window, padding included, by default as SINGA's cuDNN
    path; False divides by the number of input pixels in the window).
    """

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, is_max: bool = True,
                 pad_mode: str = "NOTSET", *, ceil_mode: bool = False, count_include_pad: bool = True) -> None:
        super().__init__()
        op = type(self).__name__
        self.kernel_size = _pair(op, kernel_size, "kernel_size")
        self.stride = self.kernel_size if stride is None else _pair(op, stride, "stride")
        self.padding = _explicit_pads(op, padding)
        self.is_max = bool(is_max)
        self.pad_mode = _check_pad_mode(op, pad_mode)
        self.ceil_mode = bool(ceil_mode)
        self.count_include_pad = bool(count_include_pad)
        if min(self.kernel_size) < 1 or min(self.stride) < 1:
            raise ValueError(f"{op}: kernel_size {self.kernel_size} and stride {self.stride} must be positive")

    def _pool(self, x: Tensor) -> Tensor:
        if len(x.shape) != 4:
            raise ValueError(f"{type(self).__name__}: expects a 4-D input (N, C, H, W), got shape {x.shape}")
        pads = _pads_for(self.pad_mode, self.padding, x, self.kernel_size, self.stride)
        return autograd.pooling_2d(x, self.kernel_size, self.stride, pads, is_max=self.is_max,
                                   ceil_mode=self.ceil_mode, count_include_pad=self.count_include_pad)

    def forward(self, x: Tensor) -> Tensor:
        return self._pool(x)


class MaxPool2d(Pooling2d):
    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, pad_mode: str = "NOTSET", *,
                 ceil_mode: bool = False) -> None:
        super().__init__(kernel_size, stride, padding, True, pad_mode, ceil_mode=ceil_mode)


class AvgPool2d(Pooling2d):
    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, pad_mode: str = "NOTSET", *,
                 ceil_mode: bool = False, count_include_pad: bool = True) -> None:
        super().__init__(kernel_size, stride, padding, False, pad_mode, ceil_mode=ceil_mode,
                         count_include_pad=count_include_pad)


class _Pool1d(Pooling2d):
    """1-D pooling along the last axis: (N, C, L) inputs, or SINGA's (N, C, 1, L)."""

    def __init__(self, kernel_size: int, stride: int | None, padding: int, is_max: bool, pad_mode: str,
                 ceil_mode: bool, count_include_pad: bool = True) -> None:
        stride = kernel_size if stride is None else stride
        if not isinstance(padding, (int, np.integer)):
            raise TypeError(f"{type(self).__name__}: padding must be an int, got {padding!r}")
        super().__init__((1, int(kernel_size)), (1, int(stride)), (0, int(padding)), is_max, pad_mode,
                         ceil_mode=ceil_mode, count_include_pad=count_include_pad)

    def forward(self, x: Tensor) -> Tensor:
        if len(x.shape) == 3:
            n, c, length = x.shape
            y = self._pool(autograd.reshape(x, (n, c, 1, length)))
            return autograd.reshape(y, (n, c, y.shape[3]))
        return self._pool(x)


class MaxPool1d(_Pool1d):
    def __init__(self, kernel_size: int, stride: int | None = None, padding: int = 0, pad_mode: str = "NOTSET", *,
                 ceil_mode: bool = False) -> None:
        super().__init__(kernel_size, stride, padding, True, pad_mode, ceil_mode)


class AvgPool1d(_Pool1d):
    def __init__(self, kernel_size: int, stride: int | None = None, padding: int = 0, pad_mode: str = "NOTSET", *,
                 ceil_mode: bool = False, count_include_pad: bool = True) -> None:
        super().__init__(kernel_size, stride, padding, False, pad_mode, ceil_mode, count_include_pad)


# -- recurrent layers ---------------------------------------------------------------------------------------------


class RNN_Base(Layer):
    """Stacked, optionally bidirectional recurrences built from autograd operators (autograd differentiates them).

    Inputs, two forms:

    * a Tensor (seq, batch, input_size), or (batch, seq, input_size) with batch_first: the outputs are a Tensor
      (seq, batch, D * hidden_size) (batch first likewise), D = 2 when bidirectional else 1;
    * SINGA's list of seq Tensors (batch, input_size): the outputs are a list of (batch, D * hidden_size) Tensors.

    Initial states (h0, and c0 for LSTM) are (num_layers * D, batch, hidden_size), ordered layer by layer with the
    forward direction first (PyTorch's order); (batch, hidden_size) is accepted when num_layers * D == 1, and None
    means zeros. Final states come back in the rank of the given initial state (3-D when it was None, except for the
    single-layer unidirectional list form, which keeps SINGA's 2-D states).

    Parameters of layer 0, forward direction, keep SINGA's names (RNN: Wx, Wh, b; LSTM: Wx_i ... Bh_g); the others
    add `_l<k>` for layer k and `_reverse` for the backward direction (`Wx_l1`, `Wh_l0_reverse`). Weights start
    uniform on +-1/sqrt(hidden_size) (PyTorch's choice; SINGA's N(0, 1) saturates tanh), biases at 0.
    """

    def step_forward(self, x: Tensor | None = None, h: Tensor | None = None, c: Tensor | None = None,
                     Wx: Tensor | None = None, Wh: Tensor | None = None, Bx: Tensor | None = None,
                     Bh: Tensor | None = None, b: Tensor | None = None) -> Any:
        raise NotImplementedError

    _n_states = 1  # h (RNN); LSTM has (h, c)

    def _setup(self, input_size: int, hidden_size: int, num_layers: int, nonlinearity: str, bias: bool,
               batch_first: bool, dropout: float, bidirectional: bool) -> None:
        op = type(self).__name__
        self.input_size = int(input_size)
        self.hidden_size = int(hidden_size)
        self.num_layers = int(num_layers)
        self.nonlinearity = str(nonlinearity).lower()
        self.bias = bool(bias)
        self.batch_first = bool(batch_first)
        self.dropout = float(dropout)
        self.bidirectional = bool(bidirectional)
        if min(self.input_size, self.hidden_size, self.num_layers) < 1:
            raise ValueError(f"{op}: input_size, hidden_size and num_layers must be positive, got "
                             f"{self.input_size}, {self.hidden_size}, {self.num_layers}")
        if self.nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"{op}: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"{op}: dropout must be in [0, 1), got {self.dropout}")

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    @staticmethod
    def _suffix(layer: int, reverse: bool) -> str:
        if layer == 0 and not reverse:
            return ""
        return f"_l{layer}" + ("_reverse" if reverse else "")

    def _layer_input_size(self, layer: int) -> int:
        return self.input_size if layer == 0 else self.hidden_size * self.num_directions

    def _init_weight(self, name: str, shape: tuple, like: Tensor | None) -> Tensor:
        k = 1.0 / math.sqrt(self.hidden_size)
        return self._param(name, shape, like).uniform(-k, k)

    def _create(self, like: Tensor | None) -> None:
        for layer in range(self.num_layers):
            for reverse in (False, True)[: self.num_directions]:
                self._create_cell(layer, reverse, self._suffix(layer, reverse), like)

    def _create_cell(self, layer: int, reverse: bool, sfx: str, like: Tensor | None) -> None:
        raise NotImplementedError

    def _cell(self, x: Tensor, state: tuple, weights: tuple) -> tuple:
        raise NotImplementedError

    def _cell_weights(self, layer: int, reverse: bool) -> tuple:
        raise NotImplementedError

    # -- the shared driver ------------------------------------------------------------------------------------------
    def _steps(self, xs: Any) -> tuple[list[Tensor], bool]:
        """The per-step (batch, input) tensors, and whether the input was SINGA's list form."""
        op = type(self).__name__
        if isinstance(xs, Tensor):
            if len(xs.shape) != 3:
                raise ValueError(f"{op}: expects a 3-D input (seq, batch, feature) (batch first when batch_first), "
                                 f"got shape {xs.shape}")
            if self.batch_first:
                xs = autograd.transpose(xs, (1, 0, 2))
            seq, batch, feat = xs.shape
            if seq == 0:
                raise ValueError(f"{op}: the input sequence is empty")
            parts = _as_steps(autograd.split(xs, 0, [1] * seq)) if seq > 1 else [xs]
            steps = [autograd.reshape(p, (batch, feat)) for p in parts]
            is_list = False
        else:
            steps = list(xs)
            is_list = True
            if not steps:
                raise ValueError(f"{op}: the input sequence is empty")
        first = steps[0].shape
        for i, s in enumerate(steps):
            if len(s.shape) != 2 or s.shape != first or s.shape[1] != self.input_size:
                raise ValueError(f"{op}: step {i} has shape {s.shape}; every step must be (batch, "
                                 f"{self.input_size}) with the same batch size as step 0 {first}")
        return steps, is_list

    def _initial(self, s: Tensor | None, batch: int, like: Tensor, what: str) -> tuple[list[Tensor], int | None]:
        """Per (layer, direction) 2-D initial states, and the rank the caller gave (None when not given)."""
        n = self.num_layers * self.num_directions
        H = self.hidden_size
        if s is None:
            zeros = [Tensor((batch, H), like.device, _param_dtype(like), requires_grad=False) for _ in range(n)]
            return zeros, None
        if not isinstance(s, Tensor):
            raise TypeError(f"{type(self).__name__}: {what} must be a Tensor or None, got {type(s).__name__}")
        if s.shape == (batch, H) and n == 1:
            return [s], 2
        if n == 1 and len(s.shape) <= 2 and _broadcasts(s.shape, (batch, H)):
            return [autograd.expand(s, (batch, H))], 2  # SINGA's states broadcast like any operand: (batch, 1) ...
        if s.shape != (n, batch, H):
            raise ValueError(f"{type(self).__name__}: {what} must have shape {(n, batch, H)}"
                             + (f" or {(batch, H)}" if n == 1 else "") + f", got {s.shape}")
        parts = _as_steps(autograd.split(s, 0, [1] * n)) if n > 1 else [s]
        return [autograd.reshape(p, (batch, H)) for p in parts], 3

    def _final(self, states: list[Tensor], rank: int) -> Tensor:
        if rank == 2:
            return states[0]
        batch, H = states[0].shape
        parts = [autograd.reshape(h, (1, batch, H)) for h in states]
        return parts[0] if len(parts) == 1 else autograd.cat(parts, 0)

    def _run(self, xs: Any, init: tuple) -> tuple[Any, list[Tensor], bool]:
        steps, is_list = self._steps(xs)
        batch = steps[0].shape[0]
        self._align(steps[0], *self._own_params())
        inits, ranks = [], []
        for s, what in zip(init, ("h0", "c0")):
            per, rank = self._initial(s, batch, steps[0], what)
            inits.append(per)
            ranks.append(rank)
        T, D = len(steps), self.num_directions
        finals: list[list[Tensor]] = [[] for _ in init]
        layer_in = steps
        for layer in range(self.num_layers):
            outs_by_dir = []
            for d in range(D):
                k = layer * D + d
                state = tuple(per[k] for per in inits)
                weights = self._cell_weights(layer, d == 1)
                outs: list[Any] = [None] * T
                for t in (range(T) if d == 0 else range(T - 1, -1, -1)):
                    state = self._cell(layer_in[t], state, weights)
                    outs[t] = state[0]
                outs_by_dir.append(outs)
                for i, s in enumerate(state):
                    finals[i].append(s)
            if D == 1:
                layer_in = outs_by_dir[0]
            else:
                layer_in = [autograd.cat([f, b], 1) for f, b in zip(*outs_by_dir)]
            if self.dropout > 0 and layer < self.num_layers - 1 and autograd.training:
                layer_in = [autograd.dropout(y, ratio=self.dropout) for y in layer_in]
        if is_list:
            outputs: Any = layer_in
        else:
            width = layer_in[0].shape[1]
            outputs = autograd.cat([autograd.reshape(y, (1, batch, width)) for y in layer_in], 0) if T > 1 else \
                autograd.reshape(layer_in[0], (1, batch, width))
            if self.batch_first:
                outputs = autograd.transpose(outputs, (1, 0, 2))
        n = self.num_layers * D
        results = []
        for per, rank in zip(finals, ranks):
            if rank is None:
                rank = 2 if (is_list and n == 1) else 3
            results.append(self._final(per, rank))
        return outputs, results, is_list


class RNN(RNN_Base):
    """Elman RNN: h_t = act(x_t Wx + h_{t-1} Wh + b), act tanh or relu; Wx (in, H), Wh (H, H), b (H,).

    `forward(xs, h0=None)` returns (outputs, h_n); see RNN_Base for the shapes.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0, bidirectional: bool = False) -> None:
        super().__init__()
        self._setup(input_size, hidden_size, num_layers, nonlinearity, bias, batch_first, dropout, bidirectional)

    def _create_cell(self, layer: int, reverse: bool, sfx: str, like: Tensor | None) -> None:
        H = self.hidden_size
        self._init_weight("Wx" + sfx, (self._layer_input_size(layer), H), like)
        self._init_weight("Wh" + sfx, (H, H), like)
        if self.bias:
            self._param("b" + sfx, (H,), like)

    def initialize(self, xs: Any, h0: Tensor | None = None) -> None:
        self._create(_first_tensor([xs]))

    def _cell_weights(self, layer: int, reverse: bool) -> tuple:
        sfx = self._suffix(layer, reverse)
        d = self.__dict__
        return d["Wx" + sfx], d["Wh" + sfx], d.get("b" + sfx)

    def _cell(self, x: Tensor, state: tuple, weights: tuple) -> tuple:
        return (self.step_forward(x, state[0], *weights),)

    def step_forward(self, x: Tensor, h: Tensor, Wx: Tensor, Wh: Tensor, b: Tensor | None = None) -> Tensor:
        """One step: act(x Wx + h Wh + b)."""
        y = autograd.add(autograd.matmul(x, Wx), autograd.matmul(h, Wh))
        if b is not None:
            y = autograd.add_bias(y, b, axis=0)
        return autograd.tanh(y) if self.nonlinearity == "tanh" else autograd.relu(y)

    def forward(self, xs: Any, h0: Tensor | None = None) -> tuple:
        outputs, (h,), _ = self._run(xs, (h0,))
        return outputs, h


class LSTM(RNN_Base):
    """LSTM with SINGA's per-gate parameters: for gate g in (i, f, o, g), Wx_g (in, H), Wh_g (H, H), Bx_g, Bh_g (H,).

        i = sigmoid(x Wx_i + Bx_i + h Wh_i + Bh_i)   (likewise f and o)
        g = tanh(x Wx_g + Bx_g + h Wh_g + Bh_g)
        c' = f * c + i * g,   h' = o * tanh(c')

    `forward(xs, (h0, c0))`: a Tensor input returns (outputs, (h_n, c_n)) as PyTorch; SINGA's list input returns
    (outputs, h_n, c_n) as SINGA did. h0_c0 may be None (zeros). The gates' weights are concatenated once per call so
    that each step costs two matrix products. `nonlinearity` is accepted for SINGA's signature; LSTM always uses
    sigmoid gates and tanh.
    """

    _GATES = ("i", "f", "o", "g")

    def __init__(self, input_size: int, hidden_size: int, nonlinearity: str = "tanh", num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0, bidirectional: bool = False) -> None:
        super().__init__()
        self._setup(input_size, hidden_size, num_layers, nonlinearity, bias, batch_first, dropout, bidirectional)

    def _create_cell(self, layer: int, reverse: bool, sfx: str, like: Tensor | None) -> None:
        H, n_in = self.hidden_size, self._layer_input_size(layer)
        for g in self._GATES:
            self._init_weight(f"Wx_{g}{sfx}", (n_in, H), like)
        for g in self._GATES:
            self._init_weight(f"Wh_{g}{sfx}", (H, H), like)
        if self.bias:
            for kind in ("Bx", "Bh"):
                for g in self._GATES:
                    self._param(f"{kind}_{g}{sfx}", (H,), like)

    def initialize(self, xs: Any, h0_c0: tuple | None = None) -> None:
        self._create(_first_tensor([xs]))

    def _cell_weights(self, layer: int, reverse: bool) -> tuple:
        sfx = self._suffix(layer, reverse)
        d = self.__dict__

        def fused(kind: str) -> Tensor:
            return autograd.cat([d[f"{kind}_{g}{sfx}"] for g in self._GATES], 1 if kind[0] == "W" else 0)

        b = autograd.add(fused("Bx"), fused("Bh")) if self.bias else None
        return fused("Wx"), fused("Wh"), b

    def _cell(self, x: Tensor, state: tuple, weights: tuple) -> tuple:
        Wx, Wh, b = weights
        h, c = state
        z = autograd.add(autograd.matmul(x, Wx), autograd.matmul(h, Wh))
        if b is not None:
            z = autograd.add_bias(z, b, axis=0)
        H = self.hidden_size
        i, f, o, g = _as_steps(autograd.split(z, 1, [H, H, H, H]))
        i, f, o, g = autograd.sigmoid(i), autograd.sigmoid(f), autograd.sigmoid(o), autograd.tanh(g)
        c = autograd.add(autograd.mul(f, c), autograd.mul(i, g))
        h = autograd.mul(o, autograd.tanh(c))
        return h, c

    def step_forward(self, x: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
        """One step of layer 0 (forward direction): returns (h', c')."""
        return self._cell(x, (h, c), self._cell_weights(0, False))

    def forward(self, xs: Any, h0_c0: tuple | None = None) -> tuple:
        if h0_c0 is None:
            h0 = c0 = None
        else:
            h0, c0 = h0_c0
        outputs, (h, c), is_list = self._run(xs, (h0, c0))
        if is_list:
            return outputs, h, c
        return outputs, (h, c)


class CudnnRNN(Layer):
    """SINGA's cuDNN RNN layer: a stacked, optionally bidirectional RNN (rnn_mode 'lstm', 'gru', 'tanh' or 'relu';
    'vanilla' or 'rnn' take `activation`) whose weights are one flat parameter `W` in cuDNN's layout
    (`singa.rnn.RNNSpec.layout`). A backend with a fused RNN (cuDNN on the CUDA backend) runs it through
    `Device.rnn_operator`; elsewhere the generic `singa.rnn.forward` does, built from autograd operators.

    `forward(x, hx=None, cx=None, seq_lengths=None)`: x is (batch, seq, feature) when batch_first (the default, as
    SINGA's), else (seq, batch, feature); hx, cx (num_layers * D, batch, hidden), None for zeros. Returns the outputs
    (batch, seq, D * hidden) (seq first when not batch_first) or, with return_sequences=False, the last step's
    (batch, D * hidden). With use_mask, `seq_lengths` (batch,) gives each sample's length: later steps are padding
    (zero outputs; the last step is each sample's own). The final states are kept as `self.hy` and `self.cy`.
    """

    def __init__(self, hidden_size: int, activation: str = "tanh", num_layers: int = 1, bias: bool = True,
                 batch_first: bool = True, dropout: float = 0, bidirectional: bool = False, rnn_mode: str = "lstm",
                 use_mask: bool = False, return_sequences: bool = True) -> None:
        super().__init__()
        mode = str(rnn_mode).lower()
        if mode in ("vanilla", "rnn", "rnn_tanh", "rnn_relu"):
            mode = "relu" if mode == "rnn_relu" else ("tanh" if mode == "rnn_tanh" else str(activation).lower())
        if mode not in rnn.MODES:
            raise ValueError(f"CudnnRNN: rnn_mode must be 'lstm', 'gru', 'tanh' or 'relu' (or 'vanilla' with "
                             f"activation tanh or relu), got {rnn_mode!r} (activation {activation!r})")
        self.hidden_size = int(hidden_size)
        self.rnn_mode = mode
        self.activation = activation
        self.num_layers = int(num_layers)
        self.bias = bool(bias)
        self.batch_first = bool(batch_first)
        self.dropout = float(dropout)
        self.bidirectional = bool(bidirectional)
        self.use_mask = bool(use_mask)
        self.return_sequences = bool(return_sequences)
        self.spec = None

    def initialize(self, x: Tensor, hx: Tensor | None = None, cx: Tensor | None = None,
                   seq_lengths: Any = None) -> None:
        if not isinstance(x, Tensor) or len(x.shape) != 3:
            raise ValueError(f"CudnnRNN: expects a 3-D input Tensor, got "
                             f"{x.shape if isinstance(x, Tensor) else type(x).__name__}")
        self.spec = rnn.RNNSpec(self.rnn_mode, x.shape[2], self.hidden_size, self.num_layers, self.bidirectional,
                                self.bias, self.dropout)
        k = 1.0 / math.sqrt(self.hidden_size)
        self._param("W", (self.spec.weight_size(),), x).uniform(-k, k)

    def forward(self, x: Tensor, hx: Tensor | None = None, cx: Tensor | None = None,
                seq_lengths: Any = None) -> Tensor:
        spec = self.spec
        if x.shape[2] != spec.input_size:
            raise ValueError(f"CudnnRNN: input has {x.shape[2]} features, the layer was built for {spec.input_size}")
        self._align(x, self.W)
        if self.use_mask and seq_lengths is None:
            raise ValueError("CudnnRNN: use_mask=True needs seq_lengths (one length per sample)")
        lengths = seq_lengths if self.use_mask else None
        if self.batch_first:
            x = autograd.transpose(x, (1, 0, 2))
        B = x.shape[1]
        shape = (spec.num_layers * spec.num_directions, B, spec.hidden_size)
        states = []
        for s, what in ((hx, "hx"), (cx, "cx")):
            if s is None:
                s = Tensor(shape, x.device, x.dtype, requires_grad=False)
            elif s.shape != shape:
                raise ValueError(f"CudnnRNN: {what} must have shape {shape}, got {s.shape}")
            states.append(s)
        fused = x.device.rnn_operator(spec, lengths)
        if fused is not None:
            y, hy, cy = fused(x, states[0], states[1], self.W)
        else:
            y, hy, cy = rnn.forward(spec, x, states[0], states[1], self.W, lengths)
        self.hy, self.cy = hy, cy
        if not self.return_sequences:
            return rnn.last_step(y, lengths)
        return autograd.transpose(y, (1, 0, 2)) if self.batch_first else y


# -- layers without parameters ------------------------------------------------------------------------------------


class ReLU(Layer):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: Tensor) -> Tensor:
        return autograd.relu(x)


class Sigmoid(Layer):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: Tensor) -> Tensor:
        return autograd.sigmoid(x)


class Add(Layer):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return autograd.add(a, b)


class Flatten(Layer):
    """Reshape to 2-D: the axes before `axis` form the rows, the rest the columns."""

    def __init__(self, axis: int = 1) -> None:
        super().__init__()
        self.axis = axis

    def forward(self, x: Tensor) -> Tensor:
        return autograd.flatten(x, self.axis)


class SoftMaxCrossEntropy(Layer):
    """Mean over the batch of -log softmax(x)[target]; t holds class ids (N,) or one-hot / probabilities (N, C)."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        return autograd.softmax_cross_entropy(x, t)


class SoftMax(Layer):
    """Softmax along axis 1."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: Tensor) -> Tensor:
        return autograd.softmax(x)


class MeanSquareError(Layer):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        return autograd.mse_loss(x, t)


class CrossEntropy(Layer):
    """Cross entropy of probabilities x against targets t."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        return autograd.cross_entropy(x, t)


class BinaryCrossEntropy(Layer):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        return autograd.binary_cross_entropy(x, t)


class Dropout(Layer):
    """Zeroes each element with probability `ratio` while training (survivors scaled by 1 / (1 - ratio))."""

    def __init__(self, ratio: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= float(ratio) < 1.0:
            raise ValueError(f"Dropout: ratio must be in [0, 1), got {ratio}")
        self.ratio = float(ratio)

    def forward(self, x: Tensor) -> Tensor:
        return autograd.dropout(x, ratio=self.ratio)


class Cat(Layer):
    """Concatenate a list of tensors along `axis`."""

    def __init__(self, axis: int = 0) -> None:
        super().__init__()
        self.axis = axis

    def forward(self, xs: Sequence[Tensor]) -> Tensor:
        return autograd.cat(list(xs), self.axis)


class Reshape(Layer):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        return autograd.reshape(x, shape)
