"""The autograd engine that `singa.autograd` re-exports: the per-thread `training` flag and `no_grad`, the error types,
`Operator` and `Dummy` (recording the graph), dependency counting, `gradients`, `backward`, and the helpers and
building blocks (`_Plain`, `_NoGrad`) the operators in `singa.operators` share.

What the flag decides, how the graph is walked and what it keeps in memory: see `singa.autograd`'s docstring."""

from __future__ import annotations

import builtins
import contextlib
import itertools
import math
import threading
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
