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
"""

from __future__ import annotations

import builtins
import contextlib
import itertools
import math
import sys
import threading
import types
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from singa import dtypes as _dt
from singa import ops
from singa.tensor import Tensor

CTensor = Tensor  # SINGA's raw tensor type; here the Tensor is its own data


class _TrainingFlag(threading.local):
    """SINGA's `autograd.training`, kept per thread (as PyTorch's grad mode): a model evaluated in one thread never
    switches recording off for another. A new thread starts from the value the main thread set last.

    Inside this module `training` is this object, whose truth is the calling thread's flag (`if training:`); from
    outside, `autograd.training` reads and assigns the calling thread's flag through the module's property below."""

    main_value = False  # class attribute: what the main thread set last, the start value of new threads

    def __init__(self) -> None:
        self.value = _TrainingFlag.main_value

    def __bool__(self) -> bool:
        return self.value

    def set(self, flag: Any) -> None:
        self.value = flag = bool(flag)
        if threading.current_thread() is threading.main_thread():
            _TrainingFlag.main_value = flag


training = _TrainingFlag()
_op_ids = itertools.count()  # operator names stay unique when several threads create operators
_op_next = [0]  # the id after the last one given out: Operator.op_count


class _AutogradModule(types.ModuleType):
    @property
    def training(self) -> bool:
        return training.value

    @training.setter
    def training(self, flag: Any) -> None:
        training.set(flag)


sys.modules[__name__].__class__ = _AutogradModule


@contextlib.contextmanager
def no_grad() -> Iterator[None]:
    """Switch recording off for the calling thread inside the block (as torch.no_grad): operators compute without
    keeping what a backward pass needs. Other threads, and the value new threads start from, are untouched."""
    prev = training.value
    training.value = False
    try:
        yield
    finally:
        training.value = prev

_FLOATS = frozenset(_dt.FLOATS + (_dt.float64,))
_INTS = frozenset(_dt.INTS)

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


# -- error types: ours (ValueError, TypeError) that are also SINGA's (its operators validate with assert) -------------


class InvalidInputError(ValueError, AssertionError):
    """Invalid operator or layer input (a shape, an axis, a value): a ValueError, and an AssertionError as SINGA's."""


class InvalidTypeError(TypeError, ValueError, AssertionError):
    """An operator or layer input of the wrong type or dtype: a TypeError, also a ValueError and an AssertionError
    (what SINGA raises for it)."""


class InvalidIndexError(IndexError, ValueError, AssertionError):
    """An index out of range: an IndexError, also a ValueError and an AssertionError (what SINGA raises for it)."""


_COMPAT_ERRORS = {ValueError: InvalidInputError, TypeError: InvalidTypeError, IndexError: InvalidIndexError}


def _compat_error(exc: BaseException) -> BaseException:
    """A plain ValueError / TypeError / IndexError re-made as the matching Invalid*Error (same message and traceback);
    anything else as it is."""
    cls = _COMPAT_ERRORS.get(type(exc))
    if cls is None:
        return exc
    new = cls(*exc.args)
    new.__traceback__ = exc.__traceback__
    new.__cause__, new.__context__ = exc.__cause__, exc.__context__
    new.__suppress_context__ = exc.__suppress_context__
    return new




# -- small helpers (all on the tensors' device) -----------------------------------------------------------------------


def _full(shape: Sequence[int], value: Any, like: Tensor) -> Tensor:
    return ops.full(tuple(shape), value, like.dtype, like.device)


def _zeros(shape: Sequence[int], like: Tensor) -> Tensor:
    return ops.full(tuple(shape), 0, like.dtype, like.device)


def _expand(t: Tensor, shape: Sequence[int]) -> Tensor:
    """A contiguous copy of t broadcast to `shape` (never a stride-0 view that someone might write into)."""
    return ops.copy(ops.broadcast_to(t, tuple(shape)))


def _is_float(t: Tensor) -> bool:
    return t.dtype in _FLOATS


def _as_index(idx: Any, device: Any) -> Tensor:
    """Integer indices as an int32/int64 tensor (float index tensors, as SINGA passes them, are converted)."""
    if isinstance(idx, Tensor):
        if idx.dtype in _INTS:
            return idx
        return ops.cast(idx, _dt.int64)
    arr = np.asarray(idx)
    if arr.dtype.kind not in "iu":
        if arr.size and not np.all(np.equal(np.mod(arr, 1), 0)):
            raise TypeError(f"indices must be integers, got {arr.dtype} values {arr.ravel()[:4]}")
        arr = arr.astype(np.int64)
    return ops.from_numpy(arr.astype(np.int64), device, _dt.int64)


def _wrap_negative(idx: Tensor, n: int) -> Tensor:
    """ONNX indices count from the end when negative; the scatter kernels get them in [0, n)."""
    return ops.where(ops.lt(idx, 0), ops.add(idx, n), idx)


def _to_dtype(to: Any) -> int:
    """A SINGA dtype code from a code, a name or a numpy dtype."""
    if isinstance(to, (int, np.integer)) and not isinstance(to, (bool, np.bool_)):
        if int(to) in _dt.ALL or int(to) == _dt.float64:
            return int(to)
        raise TypeError(f"cast: unknown SINGA dtype code {to!r}")
    names = {"float": _dt.float32, "float32": _dt.float32, "float16": _dt.float16, "half": _dt.float16,
             "int": _dt.int32, "int32": _dt.int32, "int64": _dt.int64, "bool": _dt.bool_, "float64": _dt.float64}
    if isinstance(to, str) and to in names:
        return names[to]
    return _dt.from_numpy_dtype(to)


def _loss_shape(t: Tensor) -> Tensor:
    """SINGA's losses are tensors of shape (1,) (scripts read `to_numpy(loss)[0]`)."""
    return ops.reshape(t, (1,))


def _scalar_grad(dy: Any, like: Tensor) -> Tensor:
    """The incoming gradient of a (1,)-shaped loss as a 0-d tensor (SINGA also allows a plain float)."""
    if isinstance(dy, Tensor):
        if dy.size() != 1:
            raise ValueError(f"the gradient of a scalar loss must have one element, got shape {dy.shape}")
        return ops.reshape(dy, ())
    return _full((), float(dy), like)


def axis_helper(y_shape: Sequence[int], x_shape: Sequence[int]) -> tuple:
    """The axes of y_shape along which an operand of x_shape was broadcast (numpy rules)."""
    lead = len(y_shape) - len(x_shape)
    return tuple(i for i in range(len(y_shape)) if i < lead or x_shape[i - lead] != y_shape[i])


def back_broadcast(y_shape: Sequence[int], x_shape: Sequence[int], x: Tensor) -> Tensor:
    """Reduce x (a gradient of shape y_shape) to x_shape by summing the broadcast axes."""
    y_shape, x_shape = tuple(y_shape), tuple(x_shape)
    if y_shape == x_shape:
        return x
    axes = axis_helper(y_shape, x_shape)
    r = ops.sum(x, axes) if axes else x
    return ops.reshape(r, x_shape)


def ctensor2numpy(x: Tensor) -> np.ndarray:
    """Host copy of a tensor (SINGA's helper for raw tensors)."""
    return ops.to_numpy(x)


# -- the graph ------------------------------------------------------------------------------------------------------


class _OperatorType(type):
    """Operator's metaclass, for SINGA's class counter `Operator.op_count` alone: a property over `_op_next` instead of
    a class attribute assigned at every construction (assigning a class attribute invalidates the interpreter's
    attribute caches of the class and all its subclasses, which slowed every operator call)."""

    @property
    def op_count(cls) -> int:
        """How many operators were created so far (their default names are numbered with it)."""
        return _op_next[0]

    @op_count.setter
    def op_count(cls, value: int) -> None:
        global _op_ids
        _op_ids = itertools.count(int(value))
        _op_next[0] = int(value)


class Operator(metaclass=_OperatorType):
    """An operation with a forward and a backward; calling it records the graph while `training` is True.

    Subclasses implement `forward(*xs)` (Tensors in, a Tensor or a tuple of Tensors out) and `backward(*dys)` (one
    gradient per output in, one gradient per input out, None for inputs without one). `__call__` always returns a
    tuple of output tensors.
    """

    def __init__(self, name: str | None = None) -> None:
        if name is None:
            n = next(_op_ids)
            _op_next[0] = n + 1  # a list's item: assigning Operator.op_count here would invalidate attribute caches
            name = f"{type(self).__name__}#{n}"
        self.name = name
        self.src: list = []
        self.requires_grad = False
        self.y_id2idx: dict = {}

    def __call__(self, *xs: Any) -> tuple:
        try:
            return self._do_forward(*xs)
        except (ValueError, TypeError, IndexError) as exc:
            raise _compat_error(exc) from None

    def output_name(self, idx: int) -> str:
        return f"{self.name}:{idx}"

    def grad_name(self, idx: int) -> str:
        return f"{self.output_name(idx)}_g"

    def forward(self, *xs: Tensor) -> Tensor | tuple:
        raise NotImplementedError(f"{type(self).__name__}.forward")

    def backward(self, *dys: Tensor) -> Tensor | tuple | None:
        raise NotImplementedError(f"{type(self).__name__}.backward")

    def get_params(self) -> list:
        return []

    # -- machinery ----------------------------------------------------------------------------------------------------
    def _input_needs_grad(self, i: int) -> bool:
        """Whether input i wants a gradient (lets backward skip work such as dx of a data batch)."""
        req = self.__dict__.get("_req")
        return True if req is None or i >= len(req) else req[i]

    def _grad_for(self, i: int, y_shape: tuple, x_shape: tuple, grad: Callable[[], Tensor]) -> Tensor | None:
        """The gradient of input i: grad() (of shape y_shape) summed over the axes along which x_shape was
        broadcast; None, without calling grad, when input i wants none."""
        return back_broadcast(y_shape, x_shape, grad()) if self._input_needs_grad(i) else None

    def _do_forward(self, *xs: Any) -> tuple:
        while xs and xs[-1] is None:  # optional trailing inputs (a bias, Gemm's C) left out
            xs = xs[:-1]
        given = xs
        for x in xs:
            if not isinstance(x, Tensor):
                xs = _tensor_inputs(type(self).__name__, xs)
                break
        d = self.__dict__
        if "_init_keys" not in d:
            # attributes set by __init__ (constructor arguments) survive _release; forward's saved tensors do not
            d["_init_keys"] = frozenset(d) | _BOOKKEEPING
        record = training.value  # keep what backward needs (the topology is recorded either way)
        d.pop("_released", None)  # an instance may be called again (layers keep theirs)
        d["_no_grad"] = not record
        # An input needs a gradient when it requires one and someone will consume it: a stored leaf (parameter) or
        # an operator's output. A leaf that only requires grad (an input batch) gets none: nothing would read it,
        # and skipping it saves e.g. the first convolution's backward-data pass.
        src, meta, req = [], [], []
        for x, g in zip(xs, given):
            creator = x.creator
            if creator is None:
                if x is g:
                    creator = x.creator = Dummy(x)
                else:  # a constant made from a number or array: its Dummy holds it, it does not point back
                    creator = Dummy(x, keep=True)
            sg, rg = x.stores_grad, x.requires_grad
            req.append(rg and (sg or creator.__class__ is not Dummy))
            # SINGA's 4-tuple (creator, id, tensor when its gradient is wanted, stores_grad), plus our own meta
            src.append((creator, id(x), x if sg else None, sg))
            meta.append((creator.y_id2idx.get(id(x), 0), rg, x.shape))
        d["_req"] = req = tuple(req)
        self.requires_grad = record and True in req
        self.src = src
        d["_src_meta"] = meta
        ys = self.forward(*xs)
        outs = tuple(ys) if isinstance(ys, (tuple, list)) else (ys,)
        # Every output is handed out as a fresh view object: the object forward returned may be an input, a tensor
        # this op keeps, or another op's output, and setting `creator` on it must not rewrite someone else's tensor
        # or make an op -> tensor -> op cycle (a new view costs less than finding out).
        wrapped = []
        for i, y in enumerate(outs):
            if not isinstance(y, Tensor):
                raise TypeError(f"{self.name}: forward returned {type(y).__name__} as output {i}, not a Tensor")
            y = ops.view_of(y)
            y.creator = self
            y.requires_grad = self.requires_grad
            y.stores_grad = False
            wrapped.append(y)
        self.y_id2idx = {id(y): i for i, y in enumerate(wrapped)}
        d["_y_meta"] = [(y.shape, y.dtype, y.device) for y in wrapped]
        if not record:
            self._release()
        return tuple(wrapped)

    def _do_backward(self, *dys: Tensor) -> tuple:
        dxs = self.backward(*dys)
        if not isinstance(dxs, (tuple, list)):
            dxs = (dxs,)
        return tuple(dxs)

    def _release(self) -> None:
        """Drop the tensors forward saved for backward (memory); constructor arguments stay."""
        d = self.__dict__
        for k in d.keys() - d.get("_init_keys", ()):
            if _holds_tensor(d[k]):
                del d[k]
        d["_released"] = True


Operation = Operator
_do_backward = Operator._do_backward


def _holds_tensor(v: Any) -> bool:
    if isinstance(v, Tensor):
        return True
    if isinstance(v, (tuple, list)):
        return builtins.any(isinstance(e, Tensor) for e in v)
    return False


# what _do_forward records about every call (never a tensor saved for backward)
_BOOKKEEPING = frozenset({"_init_keys", "_released", "_no_grad", "_req", "src", "_src_meta", "y_id2idx", "_y_meta",
                          "requires_grad", "name"})


def _tensor_inputs(opname: str, xs: tuple) -> tuple:
    """Tensors as they are; numbers and numpy arrays become constants on the first tensor's device and dtype."""
    like = next((x for x in xs if isinstance(x, Tensor)), None)
    if like is None or builtins.all(isinstance(x, Tensor) for x in xs):
        if like is None and xs:
            raise TypeError(f"{opname}: needs at least one Tensor input, got {[type(x).__name__ for x in xs]}")
        return xs
    out = []
    for x in xs:
        if isinstance(x, Tensor):
            out.append(x)
            continue
        if isinstance(x, ops.SCALAR_TYPES):
            # a float number with integer tensors is a float32 constant (the operation then computes in float)
            dt = _dt.float32 if isinstance(x, (float, np.floating)) and not _is_float(like) else like.dtype
            c = ops.full((), x, dt, like.device)
        elif isinstance(x, (np.ndarray, list, tuple)):
            arr = np.asarray(x)
            same_kind = (arr.dtype.kind == "f") == _is_float(like)
            c = ops.from_numpy(arr, like.device, like.dtype if same_kind else None)
        else:
            raise TypeError(f"{opname}: unsupported input of type {type(x).__name__}")
        c.requires_grad = False
        out.append(c)
    return tuple(out)


class Dummy(Operator):
    """The creator of a leaf tensor (parameters, input data): where its gradient ends up."""

    def __init__(self, tensor: Tensor, name: str | None = None, keep: bool = False) -> None:
        super().__init__(name if name is not None else getattr(tensor, "name", None))
        self.y_id2idx = {id(tensor): 0}
        # weak: the tensor holds its Dummy (creator), so a strong reference back would make a cycle that keeps
        # device memory until the cyclic garbage collector runs. `keep` is for constants an operator made from a
        # Python number: nobody else holds them and they never point back, so the Dummy keeps them (for export).
        self._ref = weakref.ref(tensor)
        self._kept = tensor if keep else None

    @property
    def tensor(self) -> Tensor | None:
        return self._ref()

    @property
    def stores_grad(self) -> bool:
        t = self._ref()
        return bool(t is not None and t.stores_grad)

    def output_name(self, idx: int) -> str:
        return self.name

    def grad_name(self, idx: int) -> str:
        return f"{self.name}_g"


def _inputs_needing_grad(root: Operator) -> Iterator[tuple]:
    """Every input (creator, id, ...) of every operator reachable from `root` through operators that need gradients,
    once per use: the edges a gradient flows back along."""
    stack = [root]
    seen = {root}
    while stack:
        cur = stack.pop()
        if not cur.requires_grad:
            continue  # no gradient flows through it, so its sources wait for nothing from it
        for src in cur.src:
            yield src
            op = src[0]
            if op not in seen:
                seen.add(op)
                stack.append(op)


def infer_dependency(op: Operator) -> tuple:
    """(op_count, tensor_count): for each operator reachable from `op` through operators that need gradients, how
    many inputs of those operators it produced; and the same count per input tensor id (SINGA's pair of Counters)."""
    op_count: Counter = Counter()
    tensor_count: Counter = Counter()
    for src_op, xid, _, _ in _inputs_needing_grad(op):
        op_count[src_op] += 1
        tensor_count[xid] += 1
    return op_count, tensor_count


def _pending_outputs(root: Operator) -> dict:
    """infer_dependency's operator counts alone, in a plain dict: how many gradients each operator waits for."""
    count: dict = {}
    for src in _inputs_needing_grad(root):
        op = src[0]
        count[op] = count.get(op, 0) + 1
    return count


class _GradDict(dict):
    """{id(param): grad}, as SINGA documents `gradients`; indexing with the tensor itself works as well."""

    @staticmethod
    def _key(k: Any) -> Any:
        return id(k) if isinstance(k, Tensor) else k

    def __getitem__(self, k: Any) -> Tensor:
        return super().__getitem__(self._key(k))

    def __contains__(self, k: Any) -> bool:
        return super().__contains__(self._key(k))

    def get(self, k: Any, default: Any = None) -> Any:
        return super().get(self._key(k), default)


def gradients(y: Tensor, dy: Any = None) -> dict:
    """{id(param): grad} for every tensor with stores_grad=True that y depends on."""
    grads = _GradDict()
    for p, g in backward(y, dy):
        grads[id(p)] = g
    return grads


def _fit(dx: Tensor, shape: tuple, op: Operator, i: int) -> Tensor:
    """A gradient with its input's shape: broadcast contributions are summed, same-size ones reshaped."""
    if dx.shape == shape:
        return dx
    if len(dx.shape) >= len(shape):
        try:
            if ops.broadcast_shapes(op.name, shape, dx.shape) == dx.shape:
                return back_broadcast(dx.shape, shape, dx)
        except ValueError:
            pass
    if dx.size() == math.prod(shape):
        return ops.reshape(dx, shape)
    raise ValueError(f"{op.name}: backward returned a gradient of shape {dx.shape} for input {i} of shape {shape}")


def backward(y: Tensor, dy: Any = None, *, retain_graph: bool = True) -> Iterator[tuple]:
    """Back-propagate from y; yields (tensor, gradient) for every tensor with stores_grad=True that y depends on.

    Each pair is yielded once, after all contributions to that gradient are summed, so the caller may update the
    parameter in place as soon as it gets it. `dy` (default: ones of y's shape) is the gradient of the objective with
    respect to y; a number is broadcast. The graph keeps what backward needs, so it may be back-propagated again (as
    in SINGA); `retain_graph=False` releases each operator's saved tensors as soon as its backward has run (less
    memory; a second backward then fails).
    """
    if not isinstance(y, Tensor):
        raise TypeError(f"backward: y must be a Tensor, got {type(y).__name__}")
    if dy is None:
        dy = _full(y.shape, 1, y)
        owned = True
    elif isinstance(dy, Tensor):
        if dy.shape != y.shape:
            if dy.size() == y.size():
                dy = ops.reshape(dy, y.shape)
            else:
                dy = _expand(dy, y.shape)
        owned = False
    else:
        dy = _full(y.shape, dy, y)
        owned = True
    return _backward(y, dy, owned, retain_graph)


def _backward(y: Tensor, dy: Tensor, owned: bool, retain_graph: bool) -> Iterator[tuple]:
    root = y.creator
    if root is None or isinstance(root, Dummy):
        if y.stores_grad:
            yield y, (dy if owned else ops.copy(dy))
        return
    if root.__dict__.get("_no_grad"):
        raise RuntimeError(f"backward: {root.name} ran while autograd.training was False, so the forward pass kept "
                           "nothing for a backward pass; set autograd.training = True (model.train()) before it")
    op_dep = _pending_outputs(root)
    grads: dict = {root: {root.y_id2idx.get(id(y), 0): dy}}  # op -> {output index: summed gradient}
    wanted: dict = {}  # op -> {output index: tensor with stores_grad}
    if y.stores_grad:
        wanted[root] = {root.y_id2idx.get(id(y), 0): y}
    # Buffers that a gradient may share with another live gradient (an op returned its dy, or one tensor for two
    # inputs): such a gradient is copied before the caller, who may update it in place, gets it.
    shared = set() if owned else {dy.buffer}
    ready = [root]
    while ready:
        op = ready.pop()
        g = grads.pop(op, None) or {}
        is_leaf = op.__class__ is Dummy or isinstance(op, Dummy)
        w = wanted.pop(op, None)
        if w:
            for i, t in w.items():
                gi = g.get(i)
                if gi is not None:
                    if not is_leaf or gi.buffer in shared or not ops.is_contiguous(gi):
                        gi = ops.copy(gi)  # an intermediate's gradient is still used below: hand out a copy
                    yield t, gi
        if is_leaf or not op.requires_grad:
            continue
        od = op.__dict__
        if od.get("_released"):
            raise RuntimeError(f"{op.name}: backward through this graph a second time; its saved tensors were "
                               "released by an earlier backward with retain_graph=False (an optimizer's opt(loss) "
                               "releases them after its update: back-propagate yourself first, then call opt(loss))")
        meta = od.get("_src_meta") or [(0, True, None)] * len(op.src)
        if g:
            ymeta = od.get("_y_meta") or ()
            if len(ymeta) <= 1 and 0 in g:  # one output (most operators)
                dys = [g[0]]
            else:
                dys = []
                for i in range(builtins.max(len(ymeta), 1)):
                    d = g.get(i)
                    if d is None:  # an unused output of a multi-output op: a zero gradient
                        shape, dt, dev = ymeta[i]
                        d = ops.full(shape, 0, dt, dev)
                    dys.append(d)
            # backward itself, unless a subclass overrides _do_backward (SINGA's hook around it)
            dxs = op.backward(*dys) if type(op)._do_backward is _do_backward else op._do_backward(*dys)
            if dxs.__class__ is not tuple:
                dxs = tuple(dxs) if isinstance(dxs, list) else (dxs,)
            if len(dxs) != len(op.src):
                raise RuntimeError(f"{op.name}: backward returned {len(dxs)} gradients for {len(op.src)} inputs")
            seen = {d.buffer for d in dys}
            for dx in dxs:
                if dx is not None:
                    if dx.buffer in seen:
                        shared.add(dx.buffer)
                    seen.add(dx.buffer)
            if not retain_graph:
                op._release()
        else:  # nothing reached this op's outputs: its inputs get nothing from it either
            dxs = (None,) * len(op.src)
        for i, ((src_op, _xid, x, _sg), (idx, req, shape), dx) in enumerate(zip(op.src, meta, dxs)):
            if x is not None:
                wanted.setdefault(src_op, {})[idx] = x
            if dx is not None and req:
                if shape is not None and dx.shape != shape:
                    dx = _fit(dx, shape, op, i)
                slot = grads.setdefault(src_op, {})
                prev = slot.get(idx)
                slot[idx] = dx if prev is None else ops.add(prev, dx)
            op_dep[src_op] -= 1
            if op_dep[src_op] == 0:
                ready.append(src_op)
        del dxs, g


# -- building blocks --------------------------------------------------------------------------------------------------


class _Plain(Operator):
    """An operator built without arguments (SINGA's `__init__(self)`: its name is numbered automatically)."""

    def __init__(self) -> None:
        super().__init__()


class _NoGrad(_Plain):
    """An operator with one input and no gradient for it (shapes, indices, constants, logical results)."""

    def backward(self, dy: Tensor) -> None:
        return None


def _ints(v: Any) -> list:
    """The integers of a Tensor, an array, a sequence or a single number, flattened (shapes, axes, repeats)."""
    return [int(e) for e in np.asarray(ops.to_numpy(v) if isinstance(v, Tensor) else v).reshape(-1)]


# -- element-wise, one input ----------------------------------------------------------------------------------------


class _Unary(_Plain):
    """One-input element-wise operator: forward is the `singa.ops` function named `_op` (or `_fn`, where a class
    overrides it); backward is `_grad(dy, x, y)`; `_keep` says which of x and y forward saves for it."""

    _op = ""
    _keep = "x"

    def _fn(self, x: Tensor) -> Tensor:
        return getattr(ops, self._op)(x)

    def _grad(self, dy: Tensor, x: Tensor | None, y: Tensor | None) -> Tensor | None:
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        y = self._fn(x)
        if training:
            if "x" in self._keep:
                self.input = x
            if "y" in self._keep:
                self.output = y
        return y

    def backward(self, dy: Tensor) -> Tensor | None:
        return self._grad(dy, getattr(self, "input", None), getattr(self, "output", None))


class _Flat(_Unary):
    """A piecewise-constant function: the gradient is zero almost everywhere (SINGA returns zeros)."""

    _keep = ""

    def _grad(self, dy, x, y):
        return _zeros(dy.shape, dy)


def _forward_a(self, a: Tensor) -> Tensor:  # forward with SINGA's argument name `a` (Abs, Exp, Sign)
    return _Unary.forward(self, a)


def _unary(name: str, op: str | Callable, grad: Callable | None = None, *, keep: str | None = None,
           doc: str | None = None, base: type = _Unary, arg: str = "x") -> tuple[type, Callable]:
    """The operator class `name` and its function (`name` in lower case), which applies a new instance to a tensor.

    Forward is the `singa.ops` function named `op` (or `op` itself, a function of x); backward is grad(dy, x, y),
    where forward saves x, y or both as `keep` says (x when None; a `_Flat` base saves nothing and needs no grad).
    `arg` is the argument's name in forward and in the function, as SINGA spells it."""
    ns: dict = {"__module__": __name__, "__qualname__": name, "__doc__": doc}
    if isinstance(op, str):
        ns["_op"] = op
    else:
        ns["_fn"] = staticmethod(op)
    if grad is not None:
        ns["_grad"] = staticmethod(grad)
    if keep is not None:
        ns["_keep"] = keep
    if arg == "a":
        ns["forward"] = _forward_a
    elif arg != "x":
        raise ValueError(f"_unary: argument name {arg!r} (x or a)")
    cls = type(name, (base,), ns)

    if arg == "a":
        def function(a: Tensor) -> Tensor:
            return cls()(a)[0]
    else:
        def function(x: Tensor) -> Tensor:
            return cls()(x)[0]

    function.__name__ = function.__qualname__ = name.lower()
    function.__module__ = __name__
    return cls, function


def _gelu_grad(dy: Tensor, x: Tensor, y: Tensor | None) -> Tensor:
    # d/dx x * Phi(x) = Phi(x) + x * phi(x)
    cdf = ops.mul(ops.add(ops.erf(ops.mul(x, math.sqrt(0.5))), 1), 0.5)
    pdf = ops.mul(ops.exp(ops.mul(ops.square(x), -0.5)), 1 / math.sqrt(2 * math.pi))
    return ops.mul(dy, ops.add(cdf, ops.mul(x, pdf)))


def _gelu_tanh_grad(dy: Tensor, x: Tensor, y: Tensor | None) -> Tensor:
    # y = x/2 (1 + t), t = tanh(c (x + a x^3)): dy/dx = (1 + t)/2 + x/2 (1 - t^2) c (1 + 3 a x^2)
    c, a = math.sqrt(2 / math.pi), 0.044715
    x2 = ops.square(x)
    t = ops.tanh(ops.mul(ops.mul(x, ops.add(ops.mul(x2, a), 1.0)), c))
    slope = ops.mul(ops.mul(ops.sub(1.0, ops.square(t)), ops.add(ops.mul(x2, 3 * a * c), c)), ops.mul(x, 0.5))
    return ops.mul(dy, ops.add(ops.mul(ops.add(t, 1.0), 0.5), slope))


def _round_half_away(x: Tensor) -> Tensor:
    return ops.mul(ops.sign(x), ops.floor(ops.add(ops.abs(x), 0.5)))


# The operators without parameters: class, function = _unary(name, forward, gradient (dy, x, y), what it keeps).
# ReLU keeps its output (y > 0 exactly where x > 0), so that the input (often a batch-norm output) dies at once.
ReLU, relu = _unary("ReLU", "relu", lambda dy, x, y: ops.relu_grad(dy, y), keep="y")
Identity, identity = _unary("Identity", lambda x: x, lambda dy, x, y: dy, keep="")
Sigmoid, sigmoid = _unary("Sigmoid", "sigmoid", lambda dy, x, y: ops.sigmoid_grad(dy, y), keep="y")
Tanh, tanh = _unary("Tanh", "tanh", lambda dy, x, y: ops.tanh_grad(dy, y), keep="y")
Cos, cos = _unary("Cos", "cos", lambda dy, x, y: ops.neg(ops.mul(dy, ops.sin(x))))
Cosh, cosh = _unary("Cosh", "cosh", lambda dy, x, y: ops.mul(dy, ops.sinh(x)))
# acos' = -1 / sqrt(1 - x^2)
Acos, acos = _unary("Acos", "acos", lambda dy, x, y: ops.neg(ops.div(dy, ops.sqrt(ops.sub(1, ops.square(x))))))
Acosh, acosh = _unary("Acosh", "acosh", lambda dy, x, y: ops.div(dy, ops.sqrt(ops.sub(ops.square(x), 1))))
Sin, sin = _unary("Sin", "sin", lambda dy, x, y: ops.mul(dy, ops.cos(x)))
Sinh, sinh = _unary("Sinh", "sinh", lambda dy, x, y: ops.mul(dy, ops.cosh(x)))
Asin, asin = _unary("Asin", "asin", lambda dy, x, y: ops.div(dy, ops.sqrt(ops.sub(1, ops.square(x)))))
Asinh, asinh = _unary("Asinh", "asinh", lambda dy, x, y: ops.div(dy, ops.sqrt(ops.add(ops.square(x), 1))))
Tan, tan = _unary("Tan", "tan", lambda dy, x, y: ops.mul(dy, ops.add(ops.square(y), 1)), keep="y")
Atan, atan = _unary("Atan", "atan", lambda dy, x, y: ops.div(dy, ops.add(ops.square(x), 1)))
Atanh, atanh = _unary("Atanh", "atanh", lambda dy, x, y: ops.div(dy, ops.sub(1, ops.square(x))))
Abs, abs = _unary("Abs", "abs", lambda dy, x, y: ops.mul(dy, ops.sign(x)), arg="a")
Exp, exp = _unary("Exp", "exp", lambda dy, x, y: ops.mul(dy, y), keep="y", arg="a")
Log, log = _unary("Log", "log", lambda dy, x, y: ops.div(dy, x))
Sqrt, sqrt = _unary("Sqrt", "sqrt", lambda dy, x, y: ops.div(ops.mul(dy, 0.5), y), keep="y")
SoftPlus, softplus = _unary("SoftPlus", "softplus", lambda dy, x, y: ops.mul(dy, ops.sigmoid(x)))
SoftSign, softsign = _unary("SoftSign", "softsign", lambda dy, x, y: ops.div(dy, ops.square(ops.add(ops.abs(x), 1))))
Negative, negative = _unary("Negative", "neg", lambda dy, x, y: ops.neg(dy), keep="")
Reciprocal, reciprocal = _unary("Reciprocal", "reciprocal", lambda dy, x, y: ops.neg(ops.mul(dy, ops.square(y))),
                                keep="y")
Erf, erf = _unary("Erf", "erf",
                  lambda dy, x, y: ops.mul(dy, ops.mul(ops.exp(ops.neg(ops.square(x))), 2.0 / math.sqrt(math.pi))))
Gelu, gelu = _unary("Gelu", "gelu", _gelu_grad, doc="x * Phi(x) (the exact, erf-based GELU).")
GeluTanh, gelu_tanh = _unary("GeluTanh", "gelu_tanh", _gelu_tanh_grad,
                             doc="x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): GELU's tanh approximation "
                                 "(PyTorch's gelu(approximate='tanh'), GPT-2's).")
Sign, sign = _unary("Sign", "sign", base=_Flat, arg="a")
Ceil, ceil = _unary("Ceil", "ceil", base=_Flat)
Floor, floor = _unary("Floor", "floor", base=_Flat)
Round, round = _unary("Round", _round_half_away, base=_Flat,
                      doc="Round half away from zero (SINGA's Round; Rounde rounds half to even).")
Rounde, rounde = _unary("Rounde", "round", base=_Flat, doc="Round half to even (ONNX Round).")


class Clip(_Unary):
    """Clamp to [min, max] (None leaves that side open); the gradient passes where x is inside the interval."""

    def __init__(self, min: float | None, max: float | None) -> None:
        super().__init__()
        self.min = min
        self.max = max

    def _fn(self, x):
        return ops.clip(x, self.min, self.max)

    def _grad(self, dy, x, y):
        inside = None
        if self.min is not None:
            inside = ops.ge(x, self.min)
        if self.max is not None:
            upper = ops.le(x, self.max)
            inside = upper if inside is None else ops.logical_and(inside, upper)
        return dy if inside is None else ops.where(inside, dy, 0)


def clip(x: Tensor, min: float | None = None, max: float | None = None) -> Tensor:
    return Clip(min, max)(x)[0]


class Elu(_Unary):
    _keep = "xy"

    def __init__(self, alpha: float = 1.0) -> None:
        super().__init__()
        self.alpha = alpha

    def _fn(self, x):
        return ops.elu(x, self.alpha)

    def _grad(self, dy, x, y):
        # d/dx = 1 for x > 0, alpha * exp(x) = y + alpha otherwise
        return ops.where(ops.gt(x, 0), dy, ops.mul(dy, ops.add(y, self.alpha)))


def elu(x: Tensor, alpha: float = 1) -> Tensor:
    return Elu(alpha)(x)[0]


class SeLU(_Unary):
    _keep = "xy"

    def __init__(self, alpha: float = 1.67326, gamma: float = 1.0507) -> None:
        super().__init__()
        self.alpha = alpha
        self.gamma = gamma

    def _fn(self, x):
        return ops.selu(x, self.alpha, self.gamma)

    def _grad(self, dy, x, y):
        # gamma for x > 0; gamma * alpha * exp(x) = y + gamma * alpha otherwise
        return ops.where(ops.gt(x, 0), ops.mul(dy, self.gamma), ops.mul(dy, ops.add(y, self.gamma * self.alpha)))


def selu(x: Tensor, alpha: float = 1.67326, gamma: float = 1.0507) -> Tensor:
    return SeLU(alpha, gamma)(x)[0]


class LeakyRelu(_Unary):
    def __init__(self, a: float) -> None:
        super().__init__()
        self.a = a

    def _fn(self, x):
        return ops.leakyrelu(x, self.a)

    def _grad(self, dy, x, y):
        return ops.where(ops.ge(x, 0), dy, ops.mul(dy, self.a))


def leakyrelu(x: Tensor, a: float = 0.01) -> Tensor:
    return LeakyRelu(a)(x)[0]


class HardSigmoid(_Unary):
    """y = clip(alpha * x + gamma, 0, 1)."""

    def __init__(self, alpha: float = 0.2, gamma: float = 0.5) -> None:
        super().__init__()
        self.alpha = alpha
        self.gamma = gamma

    def _fn(self, x):
        return ops.hardsigmoid(x, self.alpha, self.gamma)

    def _grad(self, dy, x, y):
        z = ops.add(ops.mul(x, self.alpha), self.gamma)
        inside = ops.logical_and(ops.gt(z, 0), ops.lt(z, 1))
        return ops.where(inside, ops.mul(dy, self.alpha), 0)


def hardsigmoid(x: Tensor, alpha: float = 0.2, gamma: float = 0.5) -> Tensor:
    return HardSigmoid(alpha, gamma)(x)[0]


class _SoftMaxLike(Operator):
    """Softmax or log-softmax along `axis`: `_op` forward, `_op`_backward from the saved output."""

    _op = "softmax"

    def __init__(self, axis: int = 1) -> None:
        super().__init__()
        self.axis = axis

    def forward(self, x: Tensor) -> Tensor:
        y = getattr(ops, self._op)(x, self.axis)
        if training:
            self.output = y
        return y

    def backward(self, dy: Tensor) -> Tensor:
        return getattr(ops, self._op + "_backward")(dy, self.output, self.axis)


class SoftMax(_SoftMaxLike):
    _op = "softmax"


def softmax(x: Tensor, axis: int = 1) -> Tensor:
    return SoftMax(axis)(x)[0]


class LogSoftmax(_SoftMaxLike):
    _op = "log_softmax"


def log_softmax(x: Tensor, axis: int = 1) -> Tensor:
    return LogSoftmax(axis)(x)[0]


class Cast(Operator):
    def __init__(self, to: Any) -> None:
        super().__init__()
        self.to = to

    def forward(self, x: Tensor) -> Tensor:
        self.src_dtype = x.dtype
        return ops.cast(x, _to_dtype(self.to))

    def backward(self, dy: Tensor) -> Tensor | None:
        if self.src_dtype not in _FLOATS or not _is_float(dy):
            return None
        return ops.cast(dy, self.src_dtype)


def cast(x: Tensor, to: Any) -> Tensor:
    return Cast(to)(x)[0]


# -- element-wise, two or more inputs (numpy broadcasting) ----------------------------------------------------------


class _Binary(_Plain):
    """Two-input element-wise operator with numpy broadcasting: forward is the `singa.ops` function named `_op`;
    while training it keeps `_save(a, b, y)` as `self.input` for backward (by default the three shapes)."""

    _op = "add"

    @staticmethod
    def _save(a: Tensor, b: Tensor, y: Tensor) -> tuple:
        return a.shape, b.shape, y.shape

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        y = getattr(ops, self._op)(a, b)
        if training:
            self.input = self._save(a, b, y)
        return y


class Add(_Binary):
    _op = "add"

    def backward(self, dy: Tensor) -> tuple:
        sa, sb, sy = self.input
        return back_broadcast(sy, sa, dy), back_broadcast(sy, sb, dy)


def add(a: Tensor, b: Tensor) -> Tensor:
    return Add()(a, b)[0]


class Sub(_Binary):
    _op = "sub"

    def backward(self, dy: Tensor) -> tuple:
        sa, sb, sy = self.input
        db = self._grad_for(1, sy, sb, lambda: ops.neg(dy))
        return back_broadcast(sy, sa, dy), db


def sub(a: Tensor, b: Tensor) -> Tensor:
    return Sub()(a, b)[0]


class Mul(_Binary):
    _op = "mul"
    _save = staticmethod(lambda a, b, y: (a, b))

    def backward(self, dy: Tensor) -> tuple:
        a, b = self.input
        return (self._grad_for(0, dy.shape, a.shape, lambda: ops.mul(dy, b)),
                self._grad_for(1, dy.shape, b.shape, lambda: ops.mul(dy, a)))


def mul(x: Tensor, y: Tensor) -> Tensor:
    return Mul()(x, y)[0]


class Div(_Binary):
    _op = "div"
    _save = staticmethod(lambda a, b, y: (b, y, a.shape))

    def backward(self, dy: Tensor) -> tuple:
        b, y, a_shape = self.input
        da = ops.div(dy, b)
        # d(a/b)/db = -a / b^2 = -(dy / b) * y
        return (self._grad_for(0, dy.shape, a_shape, lambda: da),
                self._grad_for(1, dy.shape, b.shape, lambda: ops.neg(ops.mul(da, y))))


def div(a: Tensor, b: Tensor) -> Tensor:
    return Div()(a, b)[0]


class Pow(_Binary):
    _op = "pow"
    _save = staticmethod(lambda a, b, y: (a, b, y))

    def backward(self, dy: Tensor) -> tuple:
        a, b, y = self.input
        # d/da = b * a^(b-1) (not y * b / a, which fails at a = 0); d/db = a^b * ln(a)
        return (self._grad_for(0, dy.shape, a.shape, lambda: ops.mul(dy, ops.mul(b, ops.pow(a, ops.sub(b, 1))))),
                self._grad_for(1, dy.shape, b.shape, lambda: ops.mul(dy, ops.mul(y, ops.log(a)))))


def pow(a: Tensor, b: Tensor) -> Tensor:
    return Pow()(a, b)[0]


class PRelu(_Binary):
    """y = x for x >= 0, slope * x otherwise (slope broadcasts against x)."""

    _op = "prelu"
    _save = staticmethod(lambda x, slope, y: (x, slope))

    def forward(self, x: Tensor, slope: Tensor) -> Tensor:  # SINGA's argument names
        return super().forward(x, slope)

    def backward(self, dy: Tensor) -> tuple:
        x, slope = self.input
        neg = ops.lt(x, 0)
        return (self._grad_for(0, dy.shape, x.shape, lambda: ops.where(neg, ops.mul(dy, slope), dy)),
                self._grad_for(1, dy.shape, slope.shape, lambda: ops.where(neg, ops.mul(dy, x), 0)))


def prelu(x: Tensor, slope: Tensor) -> Tensor:
    return PRelu()(x, slope)[0]


def _bool_like(r: Tensor, x: Tensor) -> Tensor:
    """A boolean result as bool for a bool x, else as 0/1 in x's dtype (like Tensor's own operators)."""
    return r if x.dtype == _dt.bool_ else ops.cast(r, x.dtype)


def _as_bool(t: Tensor) -> Tensor:
    return t if t.dtype == _dt.bool_ else ops.cast(t, _dt.bool_)


class _Compare(_Binary):
    """A comparison: 0/1 in the operands' dtype (bool for bool operands), like Tensor's own operators. No gradient."""

    _op = "lt"

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return _bool_like(getattr(ops, self._op)(x, y), x)

    def backward(self, dy: Tensor) -> tuple:
        return None, None


class Less(_Compare):
    _op = "lt"


def less(x: Tensor, y: Tensor) -> Tensor:
    return Less()(x, y)[0]


class Greater(_Compare):
    _op = "gt"


def greater(x: Tensor, y: Tensor) -> Tensor:
    return Greater()(x, y)[0]


class Equal(_Compare):
    _op = "eq"


def equal(x: Tensor, y: Tensor) -> Tensor:
    return Equal()(x, y)[0]


class _Logical(_Binary):
    """Logical operators: bool operands give bool; numbers are read as x != 0 and give 0/1 in their dtype."""

    _op = "logical_and"

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return _bool_like(getattr(ops, self._op)(_as_bool(a), _as_bool(b)), a)

    def backward(self, dy: Tensor) -> tuple:
        return None, None


class And(_Logical):
    _op = "logical_and"


class Or(_Logical):
    _op = "logical_or"


class Xor(_Logical):
    _op = "logical_xor"


class Not(_NoGrad):
    def forward(self, x: Tensor) -> Tensor:
        return _bool_like(ops.logical_not(_as_bool(x)), x)


def _and(a: Tensor, b: Tensor) -> Tensor:
    return And()(a, b)[0]


def _or(a: Tensor, b: Tensor) -> Tensor:
    return Or()(a, b)[0]


def _xor(a: Tensor, b: Tensor) -> Tensor:
    return Xor()(a, b)[0]


def _not(x: Tensor) -> Tensor:
    return Not()(x)[0]


class Sum(_Plain):
    """Element-wise sum of any number of tensors (broadcasting)."""

    def _combine(self, xs: tuple) -> Tensor:
        y = xs[0]
        for x in xs[1:]:
            y = ops.add(y, x)
        return y

    def forward(self, *l: Tensor) -> Tensor:  # noqa: E741 - SINGA's parameter name
        if not l:
            raise ValueError(f"{type(self).__name__}: needs at least one tensor")
        self.shapes = [x.shape for x in l]
        return self._combine(l)

    def _scale(self, dy: Tensor) -> Tensor:
        return dy

    def backward(self, dy: Tensor) -> tuple:
        g = self._scale(dy)
        return tuple(back_broadcast(dy.shape, s, g) for s in self.shapes)


def sum(*l: Tensor) -> Tensor:  # noqa: E741 - SINGA's parameter name
    return Sum()(*l)[0]


class Mean(Sum):
    """Element-wise mean of any number of tensors (broadcasting)."""

    def _combine(self, xs: tuple) -> Tensor:
        return ops.mul(super()._combine(xs), 1.0 / len(xs))

    def _scale(self, dy: Tensor) -> Tensor:
        return ops.mul(dy, 1.0 / len(self.shapes))


def mean(*l: Tensor) -> Tensor:  # noqa: E741 - SINGA's parameter name
    return Mean()(*l)[0]


def add_all(*xs: Tensor) -> Tensor:
    """Sum of the tensors, as a chain of recorded additions."""
    if not xs:
        raise ValueError("add_all: needs at least one tensor")
    y = xs[0]
    for x in xs[1:]:
        y = add(y, x)
    return y


class Max(_Plain):
    """Element-wise maximum of any number of tensors (broadcasting); a tie sends the gradient to the first."""

    _pick = "maximum"

    def forward(self, *x: Tensor) -> Tensor:
        if not x:
            raise ValueError(f"{type(self).__name__}: needs at least one tensor")
        m = x[0]
        pick = getattr(ops, self._pick)
        for t in x[1:]:
            m = pick(m, t)
        if training:
            self.input = (tuple(x), m)
        return m

    def backward(self, dy: Tensor) -> tuple:
        xs, m = self.input
        taken = None
        out = []
        for i, x in enumerate(xs):
            hit = ops.eq(x, m)
            if hit.shape != m.shape:
                hit = ops.copy(ops.broadcast_to(hit, m.shape))
            if taken is not None:
                hit = ops.logical_and(hit, ops.logical_not(taken))
            taken = hit if taken is None else ops.logical_or(taken, hit)
            out.append(back_broadcast(m.shape, x.shape, ops.where(hit, dy, 0)) if self._input_needs_grad(i) else None)
        return tuple(out)


def max(*l: Tensor) -> Tensor:  # noqa: E741 - SINGA's parameter name
    return Max()(*l)[0]


class Min(Max):
    """Element-wise minimum of any number of tensors (broadcasting)."""

    _pick = "minimum"


def min(*l: Tensor) -> Tensor:  # noqa: E741 - SINGA's parameter name
    return Min()(*l)[0]


class Where(Operator):
    """condition ? a : b, broadcasting all three; condition is fixed at construction (no gradient)."""

    def __init__(self, condition: Any) -> None:
        super().__init__()
        self.condition = condition

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        cond = self.condition
        if not isinstance(cond, Tensor):
            cond = ops.from_numpy(np.asarray(cond, dtype=bool), a.device, _dt.bool_)
        cond = _as_bool(cond)
        y = ops.where(cond, a, b)
        if training:
            self.input = (cond, a.shape, b.shape)
        return y

    def backward(self, dy: Tensor) -> tuple:
        cond, sa, sb = self.input
        return (self._grad_for(0, dy.shape, sa, lambda: ops.where(cond, dy, 0)),
                self._grad_for(1, dy.shape, sb, lambda: ops.where(cond, 0, dy)))


def where(x: Tensor, y: Tensor, condition: Any) -> Tensor:
    return Where(condition)(x, y)[0]


# -- linear algebra -------------------------------------------------------------------------------------------------


def _swap(t: Tensor) -> Tensor:
    return ops.swapaxes(t, -1, -2)


class Matmul(_Plain):
    """numpy.matmul: 1-D operands and broadcast batch axes; gradients are summed over broadcast batches."""

    def forward(self, x: Tensor, w: Tensor) -> Tensor:
        y = ops.matmul(x, w)
        if training:
            self.input = (x, w)
        return y

    def backward(self, dy: Tensor) -> tuple:
        x, w = self.input
        if len(x.shape) == 2 and len(w.shape) == 2:  # the common case, without the reshapes of the general one
            return _matrix_grads(self, x, w, dy)
        xa = x if len(x.shape) > 1 else ops.reshape(x, (1, x.shape[0]))
        wa = w if len(w.shape) > 1 else ops.reshape(w, (w.shape[0], 1))
        m, k, n = xa.shape[-2], xa.shape[-1], wa.shape[-1]
        batch = ops.broadcast_shapes("matmul", xa.shape[:-2], wa.shape[:-2])
        g = ops.reshape(dy, batch + (m, n))
        dx = dw = None
        if self._input_needs_grad(0):
            dx = back_broadcast(batch + (m, k), xa.shape, ops.matmul(g, _swap(wa)))
            dx = ops.reshape(dx, x.shape)
        if self._input_needs_grad(1):
            if len(wa.shape) == 2 and batch:
                # w shared by every batch: one (k, B*m) @ (B*m, n) product instead of B products summed afterwards
                xb = ops.reshape(ops.contiguous(ops.broadcast_to(xa, batch + (m, k))), (-1, k))
                dw = ops.matmul(_swap(xb), ops.reshape(g, (-1, n)))
            else:
                dw = back_broadcast(batch + (k, n), wa.shape, ops.matmul(_swap(xa), g))
            dw = ops.reshape(dw, w.shape)
        return dx, dw


def matmul(x: Tensor, w: Tensor) -> Tensor:
    return Matmul()(x, w)[0]


def _matrix_grads(op: Operator, x: Tensor, w: Tensor, dy: Tensor) -> tuple:
    """(dx, dw) of y = x @ w for matrices x and w, each None when its input wants no gradient."""
    dx = ops.matmul(dy, _swap(w)) if op._input_needs_grad(0) else None
    dw = ops.matmul(_swap(x), dy) if op._input_needs_grad(1) else None
    return dx, dw


class MatmulBias(_Plain):
    """x @ w + b for a matrix x (batch, in), w (in, out) and b (out,): Linear's forward as one operator, so a layer
    costs one graph node and one in-place add instead of a second operator (exported as MatMul and Add)."""

    axis = 0  # the bias is repeated over rows, as AddBias(axis=0) repeats it (the exporter reads it)

    def forward(self, x: Tensor, w: Tensor, b: Tensor) -> Tensor:
        if len(x.shape) != 2 or len(w.shape) != 2 or b.shape != (w.shape[1],):
            raise ValueError(f"matmul_bias: wants x (batch, in), w (in, out) and b (out,), got x {x.shape}, "
                             f"w {w.shape} and b {b.shape}")
        y = ops.matmul(x, w)
        ops.add(y, b, out=y)
        if training:
            self.input = (x, w)
        return y

    def backward(self, dy: Tensor) -> tuple:
        x, w = self.input
        dx, dw = _matrix_grads(self, x, w, dy)
        return dx, dw, ops.sum(dy, 0) if self._input_needs_grad(2) else None


def matmul_bias(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    """x @ w + b (x a matrix, b one value per column of the result), as one operator."""
    return MatmulBias()(x, w, b)[0]


class AddBias(Operator):
    """x + b with b repeated over rows (axis=0: b has x.shape[-1] elements) or columns (axis=1: x.shape[0])."""

    def __init__(self, axis: int = 0) -> None:
        super().__init__()
        self.axis = axis

    def forward(self, x: Tensor, b: Tensor) -> Tensor:
        nd = len(x.shape)
        if self.axis == 0:
            n, shape = x.shape[-1], (1,) * (nd - 1) + (x.shape[-1],)
        elif self.axis == 1:
            n, shape = x.shape[0], (x.shape[0],) + (1,) * (nd - 1)
        else:
            raise ValueError(f"add_bias: axis must be 0 or 1, got {self.axis}")
        if b.size() != n:
            raise ValueError(f"add_bias: bias of shape {b.shape} does not match x of shape {x.shape} (axis "
                             f"{self.axis} needs {n} elements)")
        self.shapes = (b.shape, shape)
        return ops.add(x, ops.reshape(b, shape))

    def backward(self, dy: Tensor) -> tuple:
        b_shape, shape = self.shapes
        axes = tuple(i for i, d in enumerate(shape) if d == 1 and dy.shape[i] != 1) or None
        db = ops.sum(dy, axes) if axes else dy
        return dy, ops.reshape(db, b_shape)


def add_bias(x: Tensor, b: Tensor, axis: int = 0) -> Tensor:
    return AddBias(axis)(x, b)[0]


class Gemm(Operator):
    """ONNX Gemm: alpha * A' @ B' + beta * C, with A' = A.T when transA, B' = B.T when transB; C broadcasts."""

    def __init__(self, alpha: float = 1.0, beta: float = 1.0, transA: int = 0, transB: int = 0) -> None:
        super().__init__()
        self.alpha = alpha
        self.beta = beta
        self.transA = transA
        self.transB = transB

    def forward(self, A: Tensor, B: Tensor, C: Tensor | None = None) -> Tensor:
        a = ops.transpose(A) if self.transA else A
        b = ops.transpose(B) if self.transB else B
        y = ops.matmul(a, b, alpha=self.alpha)
        if C is not None:
            y = ops.add(y, C if self.beta == 1 else ops.mul(C, self.beta))
            self.c_shape = C.shape
        if training:
            self.input = (a, b)
        return y

    def backward(self, dy: Tensor) -> tuple:
        a, b = self.input
        dA = dB = None
        if self._input_needs_grad(0):  # dA' = alpha * dy @ B'.T; with transA, dA = alpha * B' @ dy.T directly
            dA = ops.matmul(b, _swap(dy), alpha=self.alpha) if self.transA else ops.matmul(dy, _swap(b),
                                                                                           alpha=self.alpha)
        if self._input_needs_grad(1):
            dB = ops.matmul(_swap(dy), a, alpha=self.alpha) if self.transB else ops.matmul(_swap(a), dy,
                                                                                           alpha=self.alpha)
        if not hasattr(self, "c_shape"):
            return dA, dB
        dC = None
        if self._input_needs_grad(2):
            dC = back_broadcast(dy.shape, self.c_shape, dy if self.beta == 1 else ops.mul(dy, self.beta))
        return dA, dB, dC


def gemm(A: Tensor, B: Tensor, C: Tensor | None = None, alpha: float = 1.0, beta: float = 1.0, transA: int = 0,
         transB: int = 0) -> Tensor:
    return Gemm(alpha, beta, transA, transB)(A, B, C)[0]


class CosSim(_Plain):
    """Cosine similarity of a and b along their last axis (row by row for (N, D) inputs)."""

    @classmethod
    def dot(cls, a: Tensor, b: Tensor) -> Tensor:
        return ops.sum(ops.mul(a, b), -1)

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        ab = self.dot(a, b)
        aa = self.dot(a, a)
        bb = self.dot(b, b)
        den = ops.sqrt(ops.mul(aa, bb))
        y = ops.div(ab, den)
        if training:
            self.input = (a, b, y, aa, bb, den)
        return y

    def backward(self, dy: Tensor) -> tuple:
        a, b, y, aa, bb, den = self.input

        def col(t: Tensor) -> Tensor:
            return ops.unsqueeze(t, -1)

        g, yc, dc = col(dy), col(y), col(den)
        # d cos / da = b / (|a||b|) - cos * a / |a|^2
        da = ops.mul(g, ops.sub(ops.div(b, dc), ops.div(ops.mul(yc, a), col(aa))))
        db = ops.mul(g, ops.sub(ops.div(a, dc), ops.div(ops.mul(yc, b), col(bb))))
        return da, db


def cossim(a: Tensor, b: Tensor) -> Tensor:
    return CosSim()(a, b)[0]


# -- shape and layout -----------------------------------------------------------------------------------------------


class _Reshaping(Operator):
    """An operator whose output is `_reshape(x)`, x's elements in another shape: backward reshapes dy back."""

    def _reshape(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        self.x_shape = x.shape
        return self._reshape(x)

    def backward(self, dy: Tensor) -> Tensor:
        return ops.reshape(dy, self.x_shape)


class Reshape(_Reshaping):
    """ONNX Reshape: 0 keeps the input's dimension, -1 is inferred."""

    def __init__(self, shape: Any) -> None:
        super().__init__()
        self.shape = shape

    def _reshape(self, x: Tensor) -> Tensor:
        shape = [x.shape[i] if s == 0 and i < len(x.shape) else s for i, s in enumerate(_ints(self.shape))]
        return ops.reshape(x, shape)


def reshape(x: Tensor, shape: Any) -> Tensor:
    return Reshape(shape)(x)[0]


class Flatten(_Reshaping):
    """(prod(shape[:axis]), prod(shape[axis:])) (ONNX Flatten)."""

    def __init__(self, axis: int = 1) -> None:
        super().__init__()
        self.axis = axis

    def _reshape(self, x: Tensor) -> Tensor:
        return ops.flatten(x, self.axis)


def flatten(x: Tensor, axis: int = 1) -> Tensor:
    return Flatten(axis)(x)[0]


class Squeeze(_Reshaping):
    """Drop the given size-1 axes (all of them when axis is empty)."""

    def __init__(self, axis: Any = []) -> None:  # noqa: B006 - SINGA's signature; never mutated
        super().__init__()
        self.axis = axis

    def _reshape(self, x: Tensor) -> Tensor:
        axis = self.axis
        if isinstance(axis, (list, tuple)) and not axis:
            axis = None
        return ops.squeeze(x, axis)


def squeeze(x: Tensor, axis: Any = []) -> Tensor:  # noqa: B006 - SINGA's signature; never mutated
    return Squeeze(axis)(x)[0]


class Unsqueeze(_Reshaping):
    """Insert size-1 axes at the given positions of the output."""

    def __init__(self, axis: Any) -> None:
        super().__init__()
        self.axis = axis

    def _reshape(self, x: Tensor) -> Tensor:
        axis = self.axis if isinstance(self.axis, (int, np.integer)) else list(self.axis)
        return ops.unsqueeze(x, axis)


def unsqueeze(x: Tensor, axis: Any = -1) -> Tensor:
    return Unsqueeze(axis)(x)[0]


class Transpose(Operator):
    """Permute the axes (reverse them when perm is None); a view."""

    def __init__(self, perm: Sequence[int] | None) -> None:
        super().__init__()
        self.perm = perm

    def forward(self, x: Tensor) -> Tensor:
        nd = len(x.shape)
        perm = tuple(range(nd - 1, -1, -1)) if self.perm is None else tuple(int(p) % nd for p in self.perm)
        self.inverse = tuple(np.argsort(perm))
        return ops.transpose(x, perm)

    def backward(self, dy: Tensor) -> Tensor:
        return ops.transpose(dy, self.inverse)


def transpose(x: Tensor, shape: Sequence[int] | None = None) -> Tensor:
    return Transpose(shape)(x)[0]


class Concat(Operator):
    def __init__(self, axis: int = 0) -> None:
        super().__init__()
        self.axis = axis

    def forward(self, *xs: Tensor) -> Tensor:
        y = ops.concat(xs, self.axis)
        self.sizes = [x.shape[self.axis] for x in xs]
        return y

    def backward(self, dy: Tensor) -> tuple:
        ax = self.axis % len(dy.shape)
        out, pos = [], 0
        for s in self.sizes:
            out.append(ops.slice(dy, [pos], [pos + s], [ax]))
            pos += s
        return tuple(out)


def cat(xs: Sequence[Tensor], axis: int = 0) -> Tensor:
    return Concat(axis)(*xs)[0]


class Split(Operator):
    """Split along axis into pieces of the sizes in `parts` (or num_output near-equal pieces)."""

    def __init__(self, axis: int, parts: Any, num_output: int | None = None) -> None:
        super().__init__()
        self.axis = axis
        self.parts = parts
        self.num_output = num_output

    def forward(self, x: Tensor) -> tuple:
        ax = self.axis % len(x.shape)
        d = x.shape[ax]
        parts = self.parts
        if parts is None or isinstance(parts, (int, np.integer)):
            n = int(parts if parts is not None else self.num_output)
            step = -(-d // n)  # ONNX: equal pieces, the last one smaller when d is not divisible
            parts = [builtins.min(step, d - i * step) for i in range(n)]
        parts = [int(p) for p in parts]
        if builtins.sum(parts) != d:
            raise ValueError(f"split: parts {parts} do not add up to the size {d} of axis {ax} in shape {x.shape}")
        self.ax = ax
        outs, pos = [], 0
        for p in parts:
            outs.append(ops.slice(x, [pos], [pos + p], [ax]))
            pos += p
        return tuple(outs)

    def backward(self, *dys: Tensor) -> Tensor:
        return ops.concat(dys, self.ax)


def split(x: Tensor, axis: int, parts: Any, num_output: int | None = None) -> tuple:
    return Split(axis, parts, num_output)(x)


class Slice(Operator):
    """ONNX Slice (ends clamp, negative steps allowed)."""

    def __init__(self, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int] | None = None,
                 steps: Sequence[int] | None = None) -> None:
        super().__init__()
        self.starts = starts
        self.ends = ends
        self.axes = axes
        self.steps = steps

    def _args(self) -> tuple:
        return tuple(None if v is None else _ints(v) for v in (self.starts, self.ends, self.axes, self.steps))

    def forward(self, x: Tensor) -> Tensor:
        self.x_shape = x.shape
        return ops.slice(x, *self._args())

    def backward(self, dy: Tensor) -> Tensor:
        dx = _zeros(self.x_shape, dy)
        ops.assign(ops.slice(dx, *self._args()), dy)
        return dx


def slice(x: Tensor, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int] | None = None,
          steps: Sequence[int] | None = None) -> Tensor:
    return Slice(starts, ends, axes, steps)(x)[0]


class Expand(Operator):
    """ONNX Expand: broadcast x and `shape` together."""

    def __init__(self, shape: Sequence[int]) -> None:
        super().__init__()
        self.shape = shape

    def forward(self, x: Tensor) -> Tensor:
        self.x_shape = x.shape
        return ops.copy(ops.expand(x, _ints(self.shape)))

    def backward(self, dy: Tensor) -> Tensor:
        return back_broadcast(dy.shape, self.x_shape, dy)


def expand(x: Tensor, shape: Sequence[int]) -> Tensor:
    return Expand(shape)(x)[0]


class Tile(Operator):
    """ONNX Tile (numpy.tile for as many repeats as axes). With fewer repeats than x has axes they apply to the
    leading axes, the rest repeated once, as SINGA's Tile does (numpy would apply them to the trailing axes)."""

    def __init__(self, repeats: Sequence[int] | int) -> None:
        super().__init__()
        self.repeats = repeats

    def forward(self, x: Tensor) -> Tensor:
        reps = _ints(self.repeats)
        if len(reps) < len(x.shape):
            reps += [1] * (len(x.shape) - len(reps))
        self.reps = reps
        self.x_shape = x.shape
        return ops.tile(x, reps)

    def backward(self, dy: Tensor) -> Tensor:
        nd = builtins.max(len(self.reps), len(self.x_shape))
        reps = [1] * (nd - len(self.reps)) + self.reps
        shape = (1,) * (nd - len(self.x_shape)) + tuple(self.x_shape)
        inter = [v for r, d in zip(reps, shape) for v in (r, d)]
        g = ops.sum(ops.reshape(dy, inter), tuple(range(0, 2 * nd, 2)))
        return ops.reshape(g, self.x_shape)


def tile(x: Tensor, repeats: Sequence[int] | int) -> Tensor:
    return Tile(repeats)(x)[0]


class Pad(Operator):
    """ONNX Pad: pads = (begin_0, ..., begin_n-1, end_0, ..., end_n-1); modes constant, reflect, edge."""

    def __init__(self, mode: str, pads: Sequence[int], constant: float = 0.0) -> None:
        super().__init__()
        self.mode = mode
        self.pads = pads
        self.constant = constant

    def forward(self, x: Tensor) -> Tensor:
        self.x_shape = x.shape
        self.p = [int(p) for p in self.pads]
        return ops.pad(x, self.p, self.mode, self.constant)

    def backward(self, dy: Tensor) -> Tensor:
        pads, nd = self.p, len(self.x_shape)
        if self.mode == "constant":
            # the adjoint of zero-padding is cropping (and of cropping, zero-padding): the same pads negated
            return ops.pad(dy, [-p for p in pads])
        # reflect / edge: each output position reads one input position per axis; sum the gradient back there
        crop = [builtins.max(-p, 0) for p in pads]
        inner = [self.x_shape[i] - crop[i] - crop[i + nd] for i in range(nd)]
        g = dy
        for i in range(nd):
            p0, p1 = builtins.max(pads[i], 0), builtins.max(pads[i + nd], 0)
            if not (p0 or p1):
                continue
            d = inner[i]
            pos = np.arange(-p0, d + p1)
            if self.mode == "edge":
                src = np.clip(pos, 0, d - 1)
            else:
                src = np.abs(pos)
                src = np.where(src > d - 1, 2 * (d - 1) - src, src)
            idx = ops.from_numpy(src.astype(np.int64), dy.device, _dt.int64)
            target = _zeros(g.shape[:i] + (d,) + g.shape[i + 1:], g)
            g = ops.scatter_add(target, idx, g, i)
        return ops.pad(g, crop) if builtins.any(crop) else g


def pad(x: Tensor, mode: str, pads: Sequence[int], constant: float = 0.0) -> Tensor:
    return Pad(mode, pads, constant)(x)[0]


class UpSample(Operator):
    """Nearest-neighbour upsampling by integer scales per axis."""

    def __init__(self, mode: str, scales: Sequence[float]) -> None:
        super().__init__()
        self.mode = mode
        self.scales = scales

    def forward(self, x: Tensor) -> Tensor:
        if self.mode != "nearest":
            raise ValueError(f"upsample: only mode 'nearest' is supported, got {self.mode!r}")
        scales = [float(s) for s in np.asarray(self.scales).reshape(-1)]
        if len(scales) != len(x.shape) or builtins.any(s < 1 or not s.is_integer() for s in scales):
            raise ValueError(f"upsample: scales {scales} must be one integer >= 1 per axis of shape {x.shape}")
        self.s = [int(s) for s in scales]
        self.x_shape = x.shape
        y = x
        for ax, s in enumerate(self.s):
            if s > 1:
                y = ops.repeat(y, s, ax)
        return y

    def backward(self, dy: Tensor) -> Tensor:
        inter = [v for d, s in zip(self.x_shape, self.s) for v in (d, s)]
        g = ops.sum(ops.reshape(dy, inter), tuple(range(1, 2 * len(self.s), 2)))
        return ops.reshape(g, self.x_shape)


def upsample(x: Tensor, mode: str, scales: Sequence[float]) -> Tensor:
    return UpSample(mode, scales)(x)[0]


def _depth_to_space(x: Tensor, b: int, mode: str) -> Tensor:
    N, C, H, W = x.shape
    c = C // (b * b)
    if C % (b * b):
        raise ValueError(f"depth_to_space: channels {C} of shape {x.shape} are not divisible by blocksize^2 = {b * b}")
    if mode == "DCR":  # channel index = (b1 * b + b2) * c + c0
        t = ops.transpose(ops.reshape(x, (N, b, b, c, H, W)), (0, 3, 4, 1, 5, 2))
    elif mode == "CRD":  # channel index = c0 * b * b + b1 * b + b2
        t = ops.transpose(ops.reshape(x, (N, c, b, b, H, W)), (0, 1, 4, 2, 5, 3))
    else:
        raise ValueError(f"depth_to_space: mode must be 'DCR' or 'CRD', got {mode!r}")
    return ops.reshape(t, (N, c, H * b, W * b))


def _space_to_depth(x: Tensor, b: int, mode: str) -> Tensor:
    N, C, H, W = x.shape
    if H % b or W % b:
        raise ValueError(f"space_to_depth: spatial size {x.shape[2:]} is not divisible by blocksize {b}")
    t = ops.reshape(x, (N, C, H // b, b, W // b, b))
    if mode == "DCR":
        t = ops.transpose(t, (0, 3, 5, 1, 2, 4))
    elif mode == "CRD":
        t = ops.transpose(t, (0, 1, 3, 5, 2, 4))
    else:
        raise ValueError(f"space_to_depth: mode must be 'DCR' or 'CRD', got {mode!r}")
    return ops.reshape(t, (N, C * b * b, H // b, W // b))


class _BlockMove(Operator):
    """DepthToSpace and SpaceToDepth: `_there` moves blocks of blocksize x blocksize, `_back` (the other) undoes it."""

    def __init__(self, blocksize: int, mode: str = "DCR") -> None:
        super().__init__()
        self.blocksize = blocksize
        self.mode = mode

    def forward(self, x: Tensor) -> Tensor:
        return self._there(x, int(self.blocksize), self.mode)

    def backward(self, dy: Tensor) -> Tensor:
        return self._back(dy, int(self.blocksize), self.mode)


class DepthToSpace(_BlockMove):
    _there, _back = staticmethod(_depth_to_space), staticmethod(_space_to_depth)


def depth_to_space(x: Tensor, blocksize: int, mode: str = "DCR") -> Tensor:
    return DepthToSpace(blocksize, mode)(x)[0]


class SpaceToDepth(_BlockMove):
    _there, _back = staticmethod(_space_to_depth), staticmethod(_depth_to_space)


def space_to_depth(x: Tensor, blocksize: int, mode: str = "DCR") -> Tensor:
    return SpaceToDepth(blocksize, mode)(x)[0]


class Shape(_NoGrad):
    """The input's shape as a 1-D int64 tensor."""

    def forward(self, x: Tensor) -> Tensor:
        return ops.from_numpy(np.asarray(x.shape, dtype=np.int64).reshape(len(x.shape)), x.device, _dt.int64)


def shape(x: Tensor) -> Tensor:
    return Shape()(x)[0]


class ConstantOfShape(_NoGrad):
    """A tensor of the shape held by the 1-D integer input, filled with `value` (float32 for a Python number)."""

    def __init__(self, value: Any = 0.0) -> None:
        super().__init__()
        self.value = value

    def forward(self, x: Tensor) -> Tensor:
        shp = tuple(_ints(x))
        v = self.value
        if isinstance(v, Tensor):
            v = ops.to_numpy(v)
        if isinstance(v, np.ndarray):
            dt = np.float32 if v.dtype == np.float64 else v.dtype
            code, v = _dt.from_numpy_dtype(dt), v.reshape(-1)[0].item()
        else:
            code = _dt.float32
        return ops.full(shp, v, code, x.device)


def constant_of_shape(x: Tensor, value: Any = 0) -> Tensor:
    return ConstantOfShape(value)(x)[0]


class NonZero(_NoGrad):
    """Indices (int64, shape (ndim, nnz)) of the non-zero elements.

    The output's size depends on the data, so the mask is read back to the host here (like every framework's
    nonzero, it synchronises the device)."""

    def forward(self, x: Tensor) -> Tensor:
        idx = np.array(np.nonzero(ops.to_numpy(ops.ne(x, 0))), dtype=np.int64).reshape(len(x.shape), -1)
        return ops.from_numpy(idx, x.device, _dt.int64)


def nonzero(x: Tensor) -> Tensor:
    return NonZero()(x)[0]


# -- reductions -----------------------------------------------------------------------------------------------------


def _reduce_axes(axes: Any, nd: int) -> tuple | None:
    if axes is None:
        return None
    axes = _ints(axes)
    return tuple(sorted(a % nd for a in axes)) if axes else None


class ReduceSum(Operator):
    def __init__(self, axes: Sequence[int] | None = None, keepdims: int = 1) -> None:
        super().__init__()
        self.axes = axes
        self.keepdims = keepdims

    def _count(self, x_shape: tuple, axes: tuple) -> int:
        return 1

    def _reduce(self, x: Tensor, axes: tuple | None) -> Tensor:
        return ops.sum(x, axes, keepdims=True)

    def forward(self, x: Tensor) -> Tensor:
        axes = _reduce_axes(self.axes, len(x.shape))
        self.x_shape = x.shape
        self.full_axes = tuple(range(len(x.shape))) if axes is None else axes
        y = self._reduce(x, axes)
        if not self.keepdims:
            y = ops.squeeze(y, self.full_axes) if self.full_axes else y
        return y

    def backward(self, dy: Tensor) -> Tensor:
        kshape = tuple(1 if i in self.full_axes else d for i, d in enumerate(self.x_shape))
        g = ops.reshape(dy, kshape)
        n = self._count(self.x_shape, self.full_axes)
        if n != 1:
            g = ops.mul(g, 1.0 / n)
        return _expand(g, self.x_shape)


def reduce_sum(x: Tensor, axes: Sequence[int] | None = None, keepdims: int = 1) -> Tensor:
    return ReduceSum(axes, keepdims)(x)[0]


class ReduceMean(ReduceSum):
    def _count(self, x_shape: tuple, axes: tuple) -> int:
        return math.prod(x_shape[a] for a in axes)

    def _reduce(self, x: Tensor, axes: tuple | None) -> Tensor:
        return ops.mean(x, axes, keepdims=True)


def reduce_mean(x: Tensor, axes: Sequence[int] | None = None, keepdims: int = 1) -> Tensor:
    return ReduceMean(axes, keepdims)(x)[0]


class GlobalAveragePool(Operator):
    """Mean over the spatial axes, kept as size-1 axes (channels_first: axes 2...; channels_last: 1...-2)."""

    def __init__(self, data_format: str = "channels_first") -> None:
        super().__init__()
        if data_format not in ("channels_first", "channels_last"):
            raise ValueError(f"globalaveragepool: data_format must be 'channels_first' or 'channels_last', got "
                             f"{data_format!r}")
        self.data_format = data_format

    def forward(self, x: Tensor) -> Tensor:
        nd = len(x.shape)
        axes = tuple(range(2, nd)) if self.data_format == "channels_first" else tuple(range(1, nd - 1))
        self.x_shape = x.shape
        self.count = math.prod(x.shape[a] for a in axes)
        return ops.mean(x, axes, keepdims=True)

    def backward(self, dy: Tensor) -> Tensor:
        return _expand(ops.mul(dy, 1.0 / self.count), self.x_shape)


def globalaveragepool(x: Tensor, data_format: str = "channels_first") -> Tensor:
    return GlobalAveragePool(data_format)(x)[0]


# -- indexing -------------------------------------------------------------------------------------------------------


class Gather(Operator):
    """ONNX Gather / numpy.take along `axis`; the gradient is scattered (and summed) back."""

    def __init__(self, axis: int, indices: Any) -> None:
        super().__init__()
        self.axis = axis
        self.indices = indices

    def forward(self, x: Tensor) -> Tensor:
        idx = _as_index(self.indices, x.device)
        self.ax = self.axis % len(x.shape)
        y = ops.gather(x, idx, self.ax)
        if training:
            self.saved = (_wrap_negative(idx, x.shape[self.ax]), x.shape)
        return y

    def backward(self, dy: Tensor) -> Tensor:
        idx, x_shape = self.saved
        return ops.scatter_add(_zeros(x_shape, dy), idx, dy, self.ax)


def gather(x: Tensor, axis: int, indices: Any) -> Tensor:
    return Gather(axis, indices)(x)[0]


class ScatterElements(Operator):
    """ONNX ScatterElements: a copy of x with x[..., indices[p], ...] = updates[p] along `axis` (p over indices).

    Done as a flat scatter over linear positions; the gradient passes to x where nothing was overwritten."""

    def __init__(self, indices: Any, updates: Any, axis: int = 0) -> None:
        super().__init__()
        self.indices = indices
        self.updates = updates
        self.axis = axis

    def forward(self, x: Tensor) -> Tensor:
        nd = len(x.shape)
        ax = self.axis % nd
        idx = _as_index(self.indices, x.device)
        if len(idx.shape) != nd or builtins.any(i > d for i, d in zip(idx.shape, x.shape)):
            raise ValueError(f"scatter_elements: indices of shape {idx.shape} do not fit data of shape {x.shape}")
        upd = self.updates
        if not isinstance(upd, Tensor):
            upd = ops.from_numpy(np.asarray(upd), x.device, x.dtype)
        if upd.dtype != x.dtype:
            upd = ops.cast(upd, x.dtype)
        if upd.shape != idx.shape:
            raise ValueError(f"scatter_elements: updates of shape {upd.shape} differ from indices {idx.shape}")
        idx = _wrap_negative(ops.cast(idx, _dt.int64), x.shape[ax])
        # linear position of each update: sum over axes of coordinate * stride, coordinate along `ax` from indices
        strides = [math.prod(x.shape[i + 1:]) for i in range(nd)]
        lin = ops.mul(idx, strides[ax])
        for i in range(nd):
            if i != ax:
                shp = [1] * nd
                shp[i] = idx.shape[i]
                coord = ops.from_numpy((np.arange(idx.shape[i], dtype=np.int64) * strides[i]).reshape(shp),
                                       x.device, _dt.int64)
                lin = ops.add(lin, coord)
        lin = ops.reshape(ops.contiguous(lin), (-1,))
        n = math.prod(x.shape)
        hits = ops.scatter_add(_zeros((n,), x), lin, _full(lin.shape, 1, x), 0)
        keep = ops.reshape(ops.eq(hits, 0), x.shape)
        placed = ops.scatter_add(_zeros((n,), x), lin, ops.reshape(ops.contiguous(upd), (-1,)), 0)
        y = ops.where(keep, x, ops.reshape(placed, x.shape))
        if training:
            self.keep = keep
        return y

    def backward(self, dy: Tensor) -> Tensor:
        return ops.where(self.keep, dy, 0)


def scatter_elements(x: Tensor, indices: Any, updates: Any, axis: int = 0) -> Tensor:
    return ScatterElements(indices, updates, axis)(x)[0]


class OneHot(_NoGrad):
    """ONNX OneHot: a new axis of size depth at `axis`, values[1] where it equals the index, values[0] elsewhere."""

    def __init__(self, axis: int, depth: Any, values: Any) -> None:
        super().__init__()
        self.axis = axis
        self.depth = depth
        self.values = values

    def forward(self, indices: Tensor) -> Tensor:
        depth = _ints(self.depth)[0]
        vals = ops.to_numpy(self.values) if isinstance(self.values, Tensor) else np.asarray(self.values)
        vals = vals.reshape(-1)
        if vals.size != 2:
            raise ValueError(f"onehot: values must be (off, on), got {vals}")
        # the output takes the values' dtype (ONNX); numpy's default float64 becomes float32, other ints int64
        npdt = vals.dtype
        if npdt == np.float64:
            npdt = np.dtype(np.float32)
        elif npdt.kind in "iu" and npdt not in (np.dtype(np.int32), np.dtype(np.int64)):
            npdt = np.dtype(np.int64)
        code = _dt.from_numpy_dtype(npdt)
        dev = indices.device
        idx = indices if indices.dtype in _INTS else ops.cast(indices, _dt.int64)
        idx = _wrap_negative(idx, depth)
        nd = len(idx.shape) + 1
        ax = self.axis % nd
        shp = [1] * nd
        shp[ax] = depth
        ar = ops.from_numpy(np.arange(depth, dtype=np.int64).reshape(shp), dev, _dt.int64)
        if idx.dtype != _dt.int64:
            idx = ops.cast(idx, _dt.int64)
        hit = ops.eq(ops.unsqueeze(idx, ax), ar)
        on = ops.full((), vals[1].item(), code, dev)
        off = ops.full((), vals[0].item(), code, dev)
        return ops.where(hit, on, off)


def onehot(axis: int, indices: Any, depth: Any, values: Any) -> Tensor:
    """SINGA's argument order; indices, depth and values may each be a Tensor, a numpy array or a number/list
    (numpy indices go to the device of a Tensor among depth and values, else the default device)."""
    if not isinstance(indices, Tensor):
        like = next((v for v in (depth, values) if isinstance(v, Tensor)), None)
        indices = ops.from_numpy(np.asarray(indices), like.device if like is not None else None)
    return OneHot(axis, depth, values)(indices)[0]


class Embedding(_Plain):
    """w[x]: rows of the table w (V, D) picked by the integer ids in x; the table gets a scattered gradient."""

    def forward(self, x: Tensor, w: Tensor) -> Tensor:
        idx = _as_index(x, w.device)
        y = ops.gather(w, idx, 0)
        if training:
            self.saved = (_wrap_negative(idx, w.shape[0]), w.shape)
        return y

    def backward(self, dy: Tensor) -> tuple:
        idx, w_shape = self.saved
        return None, ops.scatter_add(_zeros(w_shape, dy), idx, dy, 0)


def embedding(x: Tensor, w: Tensor) -> Tensor:
    return Embedding()(x, w)[0]


# -- regularisation -------------------------------------------------------------------------------------------------


class Dropout(Operator):
    """Zero each element with probability `ratio` and scale the rest by 1 / (1 - ratio) while training.

    The mask comes from the device's counter-based generator (device.set_rand_seed), so runs are reproducible and
    identical across backends; `seed` is kept for SINGA's signature. Identity when not training."""

    def __init__(self, seed: int = 0, ratio: float = 0.5) -> None:
        super().__init__()
        self.seed = seed
        self.ratio = ratio

    def forward(self, x: Tensor) -> Tensor:
        if not training or self.ratio <= 0:
            self.mask = None
            return x
        if self.ratio >= 1:
            self.mask = _zeros(x.shape, x)
        else:
            keep = ops.random_bernoulli(ops.empty(x.shape, x.dtype, x.device), 1.0 - self.ratio)
            self.mask = ops.mul(keep, 1.0 / (1.0 - self.ratio))
        return ops.mul(x, self.mask)

    def backward(self, dy: Tensor) -> Tensor:
        mask = getattr(self, "mask", None)
        return dy if mask is None else ops.mul(dy, mask)


def dropout(x: Tensor, seed: int = 0, ratio: float = 0.5) -> Tensor:
    return Dropout(seed, ratio)(x)[0]


# -- losses (SINGA's: a tensor of shape (1,), averaged over the batch) ------------------------------------------------


def _class_target(x: Tensor, t: Any) -> Tensor:
    """Targets for x (N, C): int labels (N,) stay labels; one-hot / probabilities (N, C) take x's dtype; float
    labels of shape (N,) (as SINGA scripts sometimes pass) become int labels."""
    if not isinstance(t, Tensor):
        t = ops.from_numpy(np.asarray(t), x.device)
    N, C = x.shape
    if t.shape == (N, C) and not (C == 1 and t.dtype in _INTS):
        return t if t.dtype == x.dtype else ops.cast(t, x.dtype)
    if t.shape in ((N,), (N, 1)):
        t = ops.reshape(t, (N,))
        if t.dtype in _INTS:
            return t  # checked by the loss that reads them (ops.softmax_cross_entropy, _dense_target)
        ops.check_labels("loss target", t, C)  # before the cast, which would truncate 2.5 and -0.5
        return ops.cast(t, _dt.int64)
    raise ValueError(f"target of shape {t.shape} does not match predictions of shape {x.shape} (expected ({N},) "
                     f"labels or ({N}, {C}) one-hot / probabilities)")


def _dense_target(x: Tensor, t: Any) -> Tensor:
    """Targets as x-shaped, x-dtype values (labels become one-hot)."""
    if not isinstance(t, Tensor):
        t = ops.from_numpy(np.asarray(t), x.device)
    if len(x.shape) == 2 and t.shape != x.shape:
        t = _class_target(x, t)
        if t.dtype in _INTS:
            ops.check_labels("loss target", t, x.shape[1])
            ar = ops.from_numpy(np.arange(x.shape[1], dtype=np.int64).reshape(1, -1), x.device, _dt.int64)
            return ops.cast(ops.eq(ops.unsqueeze(ops.cast(t, _dt.int64), 1), ar), x.dtype)
        return t
    if t.shape != x.shape:
        t = _expand(t, x.shape)
    return t if t.dtype == x.dtype else ops.cast(t, x.dtype)


def _batch(x: Tensor) -> int:
    """N, the number of samples a loss averages over: x's first dimension (1 for a 0-d x)."""
    return x.shape[0] if x.shape else 1


class _Loss(Operator):
    """A loss of predictions x against targets t, as a (1,) tensor. Both of SINGA's forms: the target given at
    construction (`MeanSquareError(t)(x)`, SINGA 4) or as a second input (`MeanSquareError()(x, t)`, SINGA 3, whose
    backward then returns (dx, None)). `_loss(x, t)` returns the loss and what `_grad(dy)` needs (kept as
    `self.saved` while training), with t converted by `_target`."""

    _target = staticmethod(_dense_target)

    def __init__(self, t: Any = None) -> None:
        super().__init__()
        self.t = t

    def _loss(self, x: Tensor, t: Tensor) -> tuple:
        raise NotImplementedError

    def _grad(self, dy: Any) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor, t: Tensor | None = None) -> Tensor:
        target = self.t if t is None else t
        if target is None:
            raise ValueError(f"{type(self).__name__}: no target; give it to the constructor ({type(self).__name__}(t)"
                             f"(x)) or as the second input ({type(self).__name__}()(x, t))")
        loss, saved = self._loss(x, self._target(x, target))
        if training:
            self.saved = saved
        return _loss_shape(loss)

    def backward(self, dy: Any = 1.0) -> Tensor | tuple:
        dx = self._grad(dy)
        return (dx, None) if len(self.src) > 1 else dx


class SoftMaxCrossEntropy(_Loss):
    """mean over the batch of -sum(t * log_softmax(x)); x (N, C) logits, t int labels or (N, C) probabilities."""

    @staticmethod
    def _target(x: Tensor, t: Any) -> Tensor:
        if len(x.shape) != 2:
            raise ValueError(f"softmax_cross_entropy: x must be (N, C) logits, got shape {x.shape}")
        return _class_target(x, t)

    def _loss(self, x: Tensor, t: Tensor) -> tuple:
        return ops.mean(ops.softmax_cross_entropy(x, t)), (x, t)

    def _grad(self, dy: Any = 1.0) -> Tensor:
        x, t = self.saved
        n = x.shape[0]
        g = ops.mul(ops.broadcast_to(_scalar_grad(dy, x), (n,)), 1.0 / n)
        return ops.softmax_cross_entropy_backward(g, x, t, labels_checked=True)  # the forward checked t


def softmax_cross_entropy(x: Tensor, t: Any) -> Tensor:
    return SoftMaxCrossEntropy(t)(x)[0]


class CrossEntropy(_Loss):
    """-sum(t * log(x)) / N for probabilities x (N, C); t one-hot / probabilities or int labels."""

    def _loss(self, x: Tensor, t: Tensor) -> tuple:
        n = _batch(x)
        return ops.mul(ops.sum(ops.mul(t, ops.log(x))), -1.0 / n), (x, t, n)

    def _grad(self, dy: Any = 1.0) -> Tensor:
        x, t, n = self.saved
        return ops.mul(ops.div(t, x), ops.mul(_scalar_grad(dy, x), -1.0 / n))


def cross_entropy(x: Tensor, t: Any) -> Tensor:
    return CrossEntropy(t)(x)[0]


class BinaryCrossEntropy(_Loss):
    """-sum(t log(x + 1e-4) + (1 - t) log(1 - x + 1e-4)) / N for probabilities x (SINGA keeps the 1e-4 guard)."""

    _EPS = 1e-4

    def _loss(self, x: Tensor, t: Tensor) -> tuple:
        n = _batch(x)
        pos = ops.mul(t, ops.log(ops.add(x, self._EPS)))
        neg = ops.mul(ops.sub(1, t), ops.log(ops.sub(1 + self._EPS, x)))
        return ops.mul(ops.sum(ops.add(pos, neg)), -1.0 / n), (x, t, n)

    def _grad(self, dy: Any = 1.0) -> Tensor:
        x, t, n = self.saved
        g = ops.sub(ops.div(ops.sub(1, t), ops.sub(1 + self._EPS, x)), ops.div(t, ops.add(x, self._EPS)))
        return ops.mul(g, ops.mul(_scalar_grad(dy, x), 1.0 / n))


def binary_cross_entropy(x: Tensor, t: Any) -> Tensor:
    return BinaryCrossEntropy(t)(x)[0]


class MeanSquareError(_Loss):
    """sum((x - t)^2) / (2 N) (SINGA's definition; N is the batch size)."""

    def _loss(self, x: Tensor, t: Tensor) -> tuple:
        err = ops.sub(x, t)
        n = _batch(x)
        return ops.mul(ops.sum(ops.square(err)), 0.5 / n), (err, n)

    def _grad(self, dy: Any = 1.0) -> Tensor:
        err, n = self.saved
        return ops.mul(err, ops.mul(_scalar_grad(dy, err), 1.0 / n))


def mse_loss(x: Tensor, t: Any) -> Tensor:
    return MeanSquareError(t)(x)[0]


class RankingLoss(Operator):
    """sum(max(0, M - pos + neg)) / N: a margin ranking loss over N pairs of scores."""

    def __init__(self, M: float = 0.2) -> None:
        super().__init__()
        self.M = M

    def forward(self, pos: Tensor, neg: Tensor) -> Tensor:
        val = ops.add(ops.sub(neg, pos), self.M)
        n = _batch(pos)
        if training:
            self.saved = (ops.gt(val, 0), n, pos.shape, neg.shape, _full((), 0, pos))
        return _loss_shape(ops.mul(ops.sum(ops.relu(val)), 1.0 / n))

    def backward(self, dy: Any = 1.0) -> tuple:
        active, n, sp, sn, like = self.saved
        g = ops.where(active, ops.mul(_scalar_grad(dy, like), 1.0 / n), 0)
        return back_broadcast(g.shape, sp, ops.neg(g)), back_broadcast(g.shape, sn, g)


def ranking_loss(pos: Tensor, neg: Tensor, M: float = 0.2) -> Tensor:
    return RankingLoss(M)(pos, neg)[0]


# -- convolution, pooling, normalisation ----------------------------------------------------------------------------


def _pads4(padding: Any) -> tuple:
    """(top, left, bottom, right) from an int, (ph, pw) or four values."""
    if isinstance(padding, (int, np.integer)):
        return (int(padding),) * 4
    p = tuple(int(v) for v in padding)
    if len(p) == 2:
        return (p[0], p[1], p[0], p[1])
    if len(p) != 4:
        raise ValueError(f"padding must be an int, (ph, pw) or (top, left, bottom, right), got {padding!r}")
    return p


def _pair(v: Any) -> tuple:
    return (int(v), int(v)) if isinstance(v, (int, np.integer)) else tuple(int(e) for e in v)


class _Conv2d(Operator):
    """2-D cross-correlation of x (N, C, H, W) with W (K, C/group, kh, kw), plus an optional bias (K,)."""

    def __init__(self, stride: Any = (1, 1), padding: Any = (0, 0, 0, 0), dilation: Any = (1, 1),
                 group: int = 1) -> None:
        super().__init__()
        self.stride = _pair(stride)
        self.padding = _pads4(padding)
        self.dilation = _pair(dilation)
        self.group = int(group)

    def _geom(self) -> dict:
        return {"stride": self.stride, "padding": self.padding, "dilation": self.dilation, "groups": self.group}

    def forward(self, x: Tensor, W: Tensor, b: Tensor | None = None) -> Tensor:
        if b is not None and b.shape != (W.shape[0],):
            b = ops.reshape(b, (W.shape[0],))
        y = ops.conv2d(x, W, b, **self._geom())
        if training:
            self.input = (x, W)
        return y

    def backward(self, dy: Tensor) -> tuple:
        x, W = self.input
        geom = self._geom()
        dx = ops.conv2d_backward_data(dy, W, x.shape, **geom) if self._input_needs_grad(0) else None
        dW = ops.conv2d_backward_weight(dy, x, W.shape, **geom) if self._input_needs_grad(1) else None
        if len(self.src) < 3:
            return dx, dW
        return dx, dW, ops.sum(dy, (0, 2, 3))


def conv2d(x: Tensor, W: Tensor, b: Tensor | None = None, stride: Any = (1, 1), padding: Any = (0, 0, 0, 0),
           dilation: Any = (1, 1), group: int = 1) -> Tensor:
    op = _Conv2d(stride, padding, dilation, group)
    return (op(x, W) if b is None else op(x, W, b))[0]


class _Pooling2d(Operator):
    """Max or average pooling of x (N, C, H, W); padding (top, left, bottom, right); PyTorch's ceil_mode rule."""

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = (0, 0, 0, 0), is_max: bool = True,
                 ceil_mode: bool = False, dilation: Any = (1, 1), count_include_pad: bool = True) -> None:
        super().__init__()
        self.kernel_size = _pair(kernel_size)
        self.stride = self.kernel_size if stride is None else _pair(stride)
        self.padding = _pads4(padding)
        self.is_max = is_max
        self.ceil_mode = ceil_mode
        self.dilation = _pair(dilation)
        self.count_include_pad = count_include_pad

    def _params(self) -> dict:
        return {"kernel": self.kernel_size, "stride": self.stride, "padding": self.padding,
                "dilation": self.dilation, "mode": "max" if self.is_max else "avg",
                "count_include_pad": self.count_include_pad}

    def forward(self, x: Tensor) -> Tensor:
        p = self._params()
        if self.is_max and training:
            y, idx = ops.pool2d(x, ceil_mode=self.ceil_mode, return_indices=True, **p)
        else:
            y, idx = ops.pool2d(x, ceil_mode=self.ceil_mode, **p), None
        if training:
            self.input = (x, idx)
        return y

    def backward(self, dy: Tensor) -> Tensor:
        x, idx = self.input
        return ops.pool2d_backward(dy, x, idx, **self._params())


def pooling_2d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = (0, 0, 0, 0), is_max: bool = True,
               ceil_mode: bool = False, dilation: Any = (1, 1), count_include_pad: bool = True) -> Tensor:
    return _Pooling2d(kernel_size, stride, padding, is_max, ceil_mode, dilation, count_include_pad)(x)[0]


class _BatchNorm2d(Operator):
    """Batch normalisation over every axis but 1 of x (N, C) or (N, C, H, W).

    While training it uses the batch statistics and updates running_mean / running_var in place
    (r = momentum * r + (1 - momentum) * batch); otherwise it normalises with the running statistics."""

    def __init__(self, running_mean: Tensor, running_var: Tensor, momentum: float = 0.9, eps: float = 1e-5,
                 name: str | None = None) -> None:
        super().__init__(name)
        self.running_mean = running_mean
        self.running_var = running_var
        self.momentum = momentum
        self.eps = eps

    def forward(self, x: Tensor, scale: Tensor, bias: Tensor) -> Tensor:
        C = x.shape[1]
        scale = scale if scale.shape == (C,) else ops.reshape(scale, (C,))
        bias = bias if bias.shape == (C,) else ops.reshape(bias, (C,))
        rm = self.running_mean if self.running_mean.shape == (C,) else ops.reshape(self.running_mean, (C,))
        rv = self.running_var if self.running_var.shape == (C,) else ops.reshape(self.running_var, (C,))
        if not training:
            return ops.batchnorm_infer(x, scale, bias, rm, rv, self.eps)
        y, mean, invstd = ops.batchnorm_train(x, scale, bias, rm, rv, self.momentum, self.eps)
        self.saved = (x, scale, mean, invstd)
        return y

    def backward(self, dy: Tensor) -> tuple:
        x, scale, mean, invstd = self.saved
        return ops.batchnorm_backward(dy, x, scale, mean, invstd)


def batchnorm_2d(x: Tensor, scale: Tensor, bias: Tensor, running_mean: Tensor, running_var: Tensor,
                 momentum: float = 0.9, eps: float = 1e-5) -> Tensor:
    return _BatchNorm2d(running_mean, running_var, momentum, eps)(x, scale, bias)[0]


class LayerNorm(Operator):
    """Layer normalisation over the axes from `axis` to the last (one `layer_norm` kernel forward). Outputs y, and
    the mean and invstd = 1 / sqrt(var + eps) with the normalised axes kept as 1 (ONNX LayerNormalization's optional
    outputs); only y carries a gradient. Inputs: x, then scale and bias where `has_scale` / `has_bias` say."""

    def __init__(self, axis: int = -1, eps: float = 1e-5, has_scale: bool = True, has_bias: bool = True) -> None:
        super().__init__()
        self.axis, self.eps = axis, eps
        self.has_scale, self.has_bias = has_scale, has_bias

    def forward(self, x: Tensor, *vecs: Tensor) -> tuple:
        if len(vecs) != self.has_scale + self.has_bias:
            raise ValueError(f"layer_norm: expected {self.has_scale + self.has_bias} of scale and bias, got "
                             f"{len(vecs)}")
        scale = vecs[0] if self.has_scale else None
        bias = vecs[-1] if self.has_bias else None
        y, mean, invstd = ops.layer_norm(x, scale, bias, self.axis, self.eps)
        ax = self.axis % len(x.shape)
        kept = x.shape[:ax] + (1,) * (len(x.shape) - ax)
        mean, invstd = ops.reshape(mean, kept), ops.reshape(invstd, kept)
        if training:
            self.saved = (x, scale, mean, invstd)
        return y, mean, invstd

    def backward(self, dy: Tensor, _dmean: Tensor, _dinvstd: Tensor) -> tuple:
        x, scale, mean, invstd = self.saved
        ax = self.axis % len(x.shape)
        axes = tuple(range(ax, len(x.shape)))
        xhat = ops.mul(ops.sub(x, mean), invstd)
        g = ops.mul(dy, scale) if scale is not None else dy
        # dx = invstd * (g - mean(g) - xhat * mean(g * xhat)) over the normalised axes
        mg = ops.mean(g, axes, keepdims=True)
        mgx = ops.mean(ops.mul(g, xhat), axes, keepdims=True)
        dx = ops.mul(ops.sub(ops.sub(g, mg), ops.mul(xhat, mgx)), invstd) if self._input_needs_grad(0) else None
        lead = tuple(range(ax))
        grads = [dx]
        if self.has_scale:
            grads.append(ops.sum(ops.mul(dy, xhat), lead) if lead else ops.mul(dy, xhat))
        if self.has_bias:
            grads.append(ops.sum(dy, lead) if lead else dy)
        return tuple(grads)


def layer_norm(x: Tensor, scale: Tensor | None = None, bias: Tensor | None = None, axis: int = -1,
               eps: float = 1e-5) -> Tensor:
    """Normalise over the axes from `axis` to the last (mean 0, variance 1, the biased variance), then scale and
    shift (scale and bias broadcast to x.shape[axis:]; None: 1 and 0)."""
    vecs = [t for t in (scale, bias) if t is not None]
    return LayerNorm(axis, eps, scale is not None, bias is not None)(x, *vecs)[0]
