"""Export: a recorded SINGA autograd graph as an ONNX model (`to_onnx`, SINGA's `SingaFrontend`).

Every Operator call records where its inputs came from (`op.src`: the creator of each input, a `Dummy` for a leaf) and
marks its outputs with `creator = op`, whatever `autograd.training` says (the flag only decides what is kept for
backward), so a forward pass run after `model.eval()` exports as well as one run while training. The exporter walks
from the outputs' creators back to the given inputs, orders the operators so that each comes after its producers
(post-order, as SINGA does), and translates each one into one or more ONNX nodes. Operators keep their constructor
arguments (stride, axis, running statistics ...) and the shapes and dtypes they saw after backward has run, so a graph
can be exported after training steps too.

What becomes what:
- the given inputs are the graph inputs, in their order; when nothing in the graph fixes the batch size, their first
  dimension is the symbolic `batch` (see `dynamic_batch`). As in SINGA, entries that are not Tensors (shape lists,
  numbers) are ignored with a warning, and a given tensor that the graph does not use takes the place of the next
  data leaf of the graph (a tensor that is neither a parameter nor a constant) that no given tensor names, in the
  order the walk meets them; one left over after that is ignored with a warning;
- leaves with `stores_grad` or `requires_grad` or a name (layer parameters), and BatchNorm's running statistics, are
  initializers named after the tensor (`conv1.W`), made unique; integer arguments that ONNX takes as inputs (Reshape's
  shape, Slice's starts, axes, pads ...) are int64 initializers too;
- other constants (autograd's own scalars, initial RNN states, decomposition constants) are Constant nodes, so that an
  importer that trains every float initializer does not train them.

BatchNormalization is exported in inference form (running statistics) and Dropout as ONNX Dropout (identity at
inference): the ONNX model computes what `model.eval()` computes, whatever mode the graph was recorded in.
"""

from __future__ import annotations

import math
import re
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from singa import autograd
from singa import dtypes as _dt
from singa.tensor import Tensor
from singa_onnx.errors import UnsupportedOperatorError

__all__ = [
    "DEFAULT_OPSET", "MIN_OPSET", "UnsupportedExportError", "SingaFrontend", "to_onnx", "singa_to_onnx_model",
    "singa_to_onnx_graph", "exportable_operators",
]

# Opset 18: Reduce*/Split/Pad take their axes and sizes as inputs, and every onnxruntime since 1.14 loads it.
DEFAULT_OPSET = 18
# Below 13, Squeeze/Unsqueeze/Split/ReduceSum take attributes instead of inputs; we emit only the input form.
MIN_OPSET = 13
BATCH_DIM = "batch"

_ONNX_TYPE = {
    _dt.float32: TensorProto.FLOAT, _dt.float16: TensorProto.FLOAT16, _dt.int32: TensorProto.INT32,
    _dt.int64: TensorProto.INT64, _dt.bool_: TensorProto.BOOL, _dt.float64: TensorProto.DOUBLE,
}
_INTS = (_dt.int32, _dt.int64)


class UnsupportedExportError(UnsupportedOperatorError):
    """Operators that cannot be exported, all of them; `problems` holds (position, class name, operator name, reason).

    A subclass of the importer's UnsupportedOperatorError, so one `except sonnx.UnsupportedOperatorError` covers
    both directions."""

    def __init__(self, problems: list[tuple[int, str, str, str]], total: int) -> None:
        self.problems = list(problems)
        lines = [f"  operator {pos} of {total} ({cls} '{name}'): {why}" for pos, cls, name, why in problems]
        NotImplementedError.__init__(self, f"to_onnx: {len(problems)} operator(s) cannot be exported (positions "
                                     "count the operators from the inputs in execution order):\n" + "\n".join(lines))


class _Unsupported(Exception):
    """Raised by a handler; the exporter adds the operator's class and position."""


# -- handler table ------------------------------------------------------------------------------------------------

_HANDLERS: dict[str, Callable] = {}
# Constructor arguments holding data tensors rather than settings: their producers are part of the graph, and a graph
# input passed in their place becomes an input of the ONNX graph.
_SIDE_INPUTS = {
    "Where": ("condition",), "Gather": ("indices",), "ScatterElements": ("indices", "updates"),
    "SoftMaxCrossEntropy": ("t",), "CrossEntropy": ("t",), "BinaryCrossEntropy": ("t",), "MeanSquareError": ("t",),
}


def _handles(*names: str) -> Callable:
    def deco(fn: Callable) -> Callable:
        for n in names:
            _HANDLERS[n] = fn
        return fn

    return deco


def _autograd_class(op: Any, table: dict) -> str | None:
    """The nearest class of op (itself or a base) that singa.autograd defines (or re-exports from its operator modules)
    and `table` knows."""
    for cls in type(op).__mro__:
        if cls.__name__ in table and getattr(autograd, cls.__name__, None) is cls:
            return cls.__name__
    return None


def exportable_operators() -> list[str]:
    """The names of the autograd Operator classes `to_onnx` translates."""
    return sorted(_HANDLERS)


# -- small helpers -------------------------------------------------------------------------------------------------


def _ints(v: Any) -> list[int]:
    if isinstance(v, Tensor):
        v = v.to_numpy()
    return [int(e) for e in np.asarray(v).reshape(-1)]


def _array(v: Any) -> np.ndarray:
    return v.to_numpy() if isinstance(v, Tensor) else np.asarray(v)


def _np_dtype(code: int) -> np.dtype:
    return _dt.to_numpy_dtype(code)


def _clean(name: str) -> str:
    """A readable ONNX name: letters, digits, '_' and '.' ('#' of operator names becomes '_')."""
    s = re.sub(r"[^A-Za-z0-9_.]", "_", str(name)).strip("_")
    return s or "v"


def _flatten(xs: Any) -> list:
    if isinstance(xs, Tensor):
        return [xs]
    out = []
    for x in xs:
        out.extend(_flatten(x) if isinstance(x, (list, tuple)) else [x])
    return out


def _key(t: Tensor) -> tuple | None:
    c = t.creator
    return None if c is None else (c, c.y_id2idx.get(id(t), 0))


def _src_key(op: Any, i: int) -> tuple:
    creator, xid = op.src[i][0], op.src[i][1]
    meta = op.__dict__.get("_src_meta")
    idx = meta[i][0] if meta is not None and i < len(meta) else creator.y_id2idx.get(xid, 0)
    return (creator, idx)


def _side_tensors(op: Any) -> list[Tensor]:
    cls = _autograd_class(op, _SIDE_INPUTS)
    if cls is None:
        return []
    return [v for v in (getattr(op, a, None) for a in _SIDE_INPUTS[cls]) if isinstance(v, Tensor)]


# -- the exporter --------------------------------------------------------------------------------------------------


class _Exporter:
    """One export: the nodes, initializers and value facts (name -> shape, dtype, batch state) built so far.

    Batch state of a value: 'b' (its first axis is the batch), 'd' (it depends on the batch otherwise), None
    (independent of it). Handlers call `static(reason)` when a translation is exact only at the recorded batch size;
    the model then gets fixed input shapes instead of a symbolic batch.
    """

    def __init__(self, opset: int | None = None, dynamic_batch: bool | None = None, inline: bool = False) -> None:
        if opset is not None and int(opset) < MIN_OPSET:
            raise ValueError(f"to_onnx: opset_version must be at least {MIN_OPSET}, got {opset}")
        self.explicit_opset = opset is not None
        self.opset = int(opset) if opset is not None else DEFAULT_OPSET
        self.dynamic_batch = dynamic_batch
        self.inline = inline  # every constant as a Constant node (a node list that stands on its own)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.taken: set[str] = set()
        self.node_names: set[str] = set()
        self.shape: dict[str, tuple] = {}
        self.dtype: dict[str, int] = {}
        self.bstate: dict[str, str | None] = {}
        self.names: dict[tuple, str] = {}  # (creator, output index) -> value name
        self.leaf_names: dict[int, str] = {}  # id(leaf tensor) -> value name
        self.held: list[Tensor] = []  # the leaves named above, kept alive so that their ids stay theirs
        self.const_cache: dict[tuple, str] = {}
        self.node_count: Counter = Counter()
        self.batch: int | None = None
        self.static_reasons: list[str] = []
        self.input_ids: dict[int, int] = {}
        self.input_names: list[str] = []
        self.base = "node"  # name stem of the operator being translated
        self.where = ""  # "Conv2d 'conv#3' (operator 2 of 9)" for messages

    # -- names ---------------------------------------------------------------------------------------------------------
    def unique(self, stem: str) -> str:
        stem = _clean(stem)
        name, k = stem, 1
        while name in self.taken:
            name = f"{stem}_{k}"
            k += 1
        self.taken.add(name)
        return name

    def tmp(self, what: str) -> str:
        return self.unique(f"{self.base}.{what}")

    def value(self, name: str, shape: Sequence[int] | None, dtype: int, state: str | None = None) -> str:
        self.shape[name] = tuple(shape) if shape is not None else None
        self.dtype[name] = dtype
        self.bstate[name] = state
        return name

    # -- nodes and constants -------------------------------------------------------------------------------------------
    def node(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str] | str | None = None,
             **attrs: Any) -> str:
        """Append a node; returns its (first) output name, a fresh one unless given."""
        if outputs is None:
            outputs = [self.tmp(op_type.lower())]
        elif isinstance(outputs, str):
            outputs = [outputs]
        inputs = list(inputs)
        while inputs and inputs[-1] == "":  # trailing optional inputs left out
            inputs.pop()
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(helper.make_node(op_type, inputs, list(outputs), name=self.node_name(self.base), **attrs))
        return outputs[0]

    def node_name(self, stem: str) -> str:
        """Node names: the operator's name, then `<name>.2`, `<name>.3` for the further nodes it needs."""
        while True:
            self.node_count[stem] += 1
            n = self.node_count[stem]
            name = stem if n == 1 else f"{stem}.{n}"
            if name not in self.node_names:
                self.node_names.add(name)
                return name

    def const(self, arr: Any, what: str, dtype: Any = None) -> str:
        """A constant value: integer and bool arrays as initializers, floats as Constant nodes (see module doc)."""
        arr = np.asarray(arr, dtype=dtype)
        if arr.dtype == np.float64 and dtype is None:
            arr = arr.astype(np.float32)
        small = arr.size <= 64
        ck = (arr.dtype.str, arr.shape, arr.tobytes()) if small else None
        if ck is not None and ck in self.const_cache:
            return self.const_cache[ck]
        name = self.unique(f"{self.base}.{what}")
        tp = numpy_helper.from_array(np.array(arr, order="C"), name)
        if arr.dtype.kind in "iub" and not self.inline:
            self.initializers.append(tp)
        else:
            self.nodes.append(helper.make_node("Constant", [], [name], name=self.node_name(name), value=tp))
        self.value(name, arr.shape, _dt.from_numpy_dtype(arr.dtype))
        if ck is not None:
            self.const_cache[ck] = name
        return name

    def ints(self, values: Sequence[int], what: str) -> str:
        return self.const(np.asarray(list(values), dtype=np.int64), what)

    def scalar(self, v: float, like: str, what: str = "c") -> str:
        """A 0-d constant in the dtype of value `like`."""
        return self.const(np.asarray(v, dtype=self.np_dtype(like)), what)

    def initializer(self, arr: np.ndarray, stem: str) -> str:
        name = self.unique(stem)
        self.initializers.append(numpy_helper.from_array(np.array(arr, order="C"), name))
        self.value(name, arr.shape, _dt.from_numpy_dtype(arr.dtype))
        return name

    def np_dtype(self, name: str) -> np.dtype:
        return _np_dtype(self.dtype[name])

    def need_opset(self, version: int, what: str) -> None:
        if self.opset >= version:
            return
        if self.explicit_opset:
            raise _Unsupported(f"{what} needs opset {version}; opset_version={self.opset} was asked for")
        self.opset = version  # the ops emitted so far mean the same in every later opset

    # -- reading values ------------------------------------------------------------------------------------------------
    def leaf(self, t: Tensor, stem: str) -> str:
        """The name of a leaf tensor: a graph input, an initializer (a parameter) or a constant."""
        if id(t) in self.input_ids:
            return self.input_names[self.input_ids[id(t)]]
        if id(t) in self.leaf_names:
            return self.leaf_names[id(t)]
        arr = t.to_numpy()
        if t.stores_grad or t.requires_grad or t.name:
            name = self.initializer(arr, t.name or stem)
        else:
            name = self.const(arr, "const")
        self.leaf_names[id(t)] = name
        self.held.append(t)
        return name

    def src_name(self, op: Any, i: int) -> str:
        key = _src_key(op, i)
        if key in self.names:
            return self.names[key]
        creator, _, kept, _ = op.src[i]
        if not isinstance(creator, autograd.Dummy):
            raise RuntimeError(f"to_onnx: internal error, input {i} of {op.name} was not translated before it")
        t = kept if kept is not None else creator.tensor
        if t is None:
            meta = op.__dict__.get("_src_meta")
            shape = meta[i][2] if meta is not None else "?"
            raise _Unsupported(f"its input {i} is a constant of shape {shape} that autograd no longer holds (a "
                               "Python number or array given to an operator is freed after the forward; pass a "
                               "Tensor that you keep instead)")
        name = self.leaf(t, f"{self.base}.in{i}")
        self.names[key] = name
        return name

    def side(self, v: Any, what: str, dtype: Any = None) -> str:
        """A data argument held by the operator (Where's condition, Gather's indices, a loss target)."""
        if isinstance(v, Tensor):
            if id(v) in self.input_ids:
                return self.input_names[self.input_ids[id(v)]]
            k = _key(v)
            if k is not None and k in self.names:
                return self.names[k]
            v = v.to_numpy()
        arr = np.asarray(v)
        if dtype is not None:
            arr = arr.astype(dtype)
        return self.const(arr, what)

    # -- batch analysis ------------------------------------------------------------------------------------------------
    def static(self, reason: str) -> None:
        self.static_reasons.append(f"{self.where}: {reason}")

    def dep(self, name: str) -> bool:
        return self.bstate.get(name) is not None

    def broadcast_check(self, names: Sequence[str]) -> None:
        """Operands broadcast together: a batch-independent one whose axis under the batch axis has the recorded batch
        size (> 1) would not fit another batch."""
        if self.batch is None or self.batch == 1:
            return
        batched = [n for n in names if self.bstate.get(n) == "b"]
        for n in names:
            s = self.shape.get(n)
            if self.dep(n) or s is None:
                continue
            for b in batched:
                j = len(s) - len(self.shape[b])
                if 0 <= j < len(s) and s[j] == self.batch:
                    self.static(f"a constant of shape {s} broadcasts against the batch axis")
                    return

    def same_batch(self, names: Sequence[str]) -> None:
        """Operands whose first axes must match (a loss target, concatenated pieces)."""
        if any(self.bstate.get(n) == "b" for n in names) and not all(self.bstate.get(n) == "b" for n in names):
            self.static("operands of fixed size are aligned with the batch axis")

    # -- the export ----------------------------------------------------------------------------------------------------
    def _index_inputs(self, inputs: list[Tensor]) -> dict:
        self.input_ids = {}
        input_keys = {}
        for i, t in enumerate(inputs):
            self.input_ids.setdefault(id(t), i)
            k = _key(t)
            if k is not None:
                input_keys.setdefault(k, i)
        return input_keys

    def run(self, inputs: Sequence[Tensor], outputs: Sequence[Tensor], model_name: str) -> onnx.ModelProto:
        inputs, outputs = self._check_args(inputs, outputs)
        input_keys = self._index_inputs(inputs)
        ops = self._collect(outputs, input_keys)
        matched = self._match_inputs(inputs, outputs, ops, input_keys)
        if matched is not inputs:  # leaves bound by position, or unused entries dropped: the graph's cuts are leaves
            inputs = matched
            input_keys = self._index_inputs(inputs)

        missing = []
        for pos, op in enumerate(ops, 1):
            if _autograd_class(op, _HANDLERS) is None:
                why = "no ONNX translation for this class (singa_onnx.frontend.exportable_operators() lists them)"
                missing.append((pos, type(op).__name__, op.name, why))
        if missing:
            raise UnsupportedExportError(missing, len(ops))

        first = inputs[0].shape if inputs else ()
        if self.dynamic_batch is not False and len(first) >= 1:
            self.batch = first[0]
        for i, t in enumerate(inputs):
            if id(t) in self.input_ids and self.input_ids[id(t)] != i:
                raise ValueError(f"to_onnx: input {i} is the same tensor as input {self.input_ids[id(t)]}")
            name = self.unique(t.name or ("input" if len(inputs) == 1 else f"input_{i}"))
            state = "b" if self.batch is not None and t.shape and t.shape[0] == self.batch else None
            self.input_names.append(self.value(name, t.shape, t.dtype, state))
        for k, i in input_keys.items():
            self.names[k] = self.input_names[i]

        out_names: dict[tuple, str] = {}
        wanted = []  # (graph output name, key or None, tensor)
        for i, t in enumerate(outputs):
            stem = t.name if t.name and id(t) not in self.input_ids else ("output" if len(outputs) == 1
                                                                            else f"output_{i}")
            name = self.unique(stem)
            k = _key(t)
            if k is not None and not isinstance(k[0], autograd.Dummy) and k not in input_keys and k not in out_names:
                out_names[k] = name
            wanted.append((name, k, t))

        problems = []
        for pos, op in enumerate(ops, 1):
            cls = _autograd_class(op, _HANDLERS)
            self.base = _clean(op.name.lstrip("_"))
            self.where = f"{type(op).__name__} '{op.name}' (operator {pos} of {len(ops)})"
            try:
                self._translate(op, cls, out_names)
            except _Unsupported as exc:
                problems.append((pos, type(op).__name__, op.name, str(exc)))
        if problems:
            raise UnsupportedExportError(problems, len(ops))

        self.base = "output"
        for name, k, t in wanted:
            if k is not None and out_names.get(k) == name:
                continue  # produced under its own name
            if id(t) in self.input_ids:
                src = self.input_names[self.input_ids[id(t)]]
            elif k is not None and k in self.names:
                src = self.names[k]
            else:
                src = self.leaf(t, name + ".value")
            self.node("Identity", [src], name)
            self.value(name, self.shape[src], self.dtype[src], self.bstate.get(src))
        return self._model(inputs, [w[0] for w in wanted], model_name)

    @staticmethod
    def _check_args(inputs: Any, outputs: Any) -> tuple[list, list]:
        inputs = _flatten(inputs) if inputs is not None else []
        outputs = _flatten(outputs)
        skipped = [f"inputs[{i}] ({type(t).__name__})" for i, t in enumerate(inputs) if not isinstance(t, Tensor)]
        if skipped:  # SINGA scripts pass shapes or numbers there; SINGA ignores them
            warnings.warn(f"to_onnx: {', '.join(skipped)} not a singa Tensor, ignored (the graph's inputs are the "
                          "Tensors given)", UserWarning, stacklevel=4)
            inputs = [t for t in inputs if isinstance(t, Tensor)]
        for i, t in enumerate(outputs):
            if not isinstance(t, Tensor):
                raise TypeError(f"to_onnx: outputs[{i}] is a {type(t).__name__}, not a singa Tensor")
        if not outputs:
            raise ValueError("to_onnx: no outputs given")
        ids = {id(t) for t in inputs}
        for i, t in enumerate(outputs):
            if id(t) in ids:
                continue
            c = t.creator
            if c is None or (isinstance(c, autograd.Dummy) and not (t.stores_grad or t.requires_grad or t.name)):
                raise ValueError(
                    f"to_onnx: output {i} (shape {t.shape}) was not produced by autograd operators, so there is no "
                    "graph to export: pass the outputs of the forward pass, `y = model.forward(x)` (in train or eval "
                    "mode). In graph mode the outputs of a replayed train_one_batch carry no graph; call "
                    "model.forward(x) to make them.")
        return inputs, outputs

    def _match_inputs(self, inputs: list[Tensor], outputs: list[Tensor], ops: list, input_keys: dict) -> list:
        """SINGA's binding of the given inputs: a given tensor that the graph does not use takes the place of the
        next data leaf (not a parameter, not a constant, not given) in walk order; the rest are dropped with a
        warning. Returns `inputs` itself when every given tensor is used."""
        used: set = {_key(t) for t in outputs}
        leaves: list[Tensor] = []
        seen: set[int] = set()
        for op in ops:
            for i in range(len(op.src)):
                k = _src_key(op, i)
                used.add(k)
                creator = k[0]
                if not isinstance(creator, autograd.Dummy) or creator._kept is not None or k in input_keys:
                    continue
                t = creator.tensor
                if t is not None and id(t) not in seen and not t.stores_grad and t.requires_grad:
                    seen.add(id(t))
                    leaves.append(t)
            for t in _side_tensors(op):
                used.add(_key(t))
        unused = [i for i, t in enumerate(inputs) if _key(t) not in used and id(t) not in {id(o) for o in outputs}]
        if not unused:
            return inputs
        out = list(inputs)
        dropped = []
        for i in unused:
            if not leaves:
                dropped.append(i)
                continue
            leaf, given = leaves.pop(0), inputs[i]
            if leaf.shape != given.shape or leaf.dtype != given.dtype:
                raise ValueError(f"to_onnx: inputs[{i}] ({_dt.name(given.dtype)} {given.shape}) is not in the graph, "
                                 f"and the graph input it would stand for by position is a {_dt.name(leaf.dtype)} "
                                 f"tensor of shape {leaf.shape}: pass the tensors the forward pass was run on")
            out[i] = leaf
        if dropped:
            warnings.warn("to_onnx: " + ", ".join(f"inputs[{i}] (shape {inputs[i].shape})" for i in dropped)
                          + " not used by the graph, ignored", UserWarning, stacklevel=4)
            out = [t for i, t in enumerate(out) if i not in dropped]
        return out

    def _collect(self, outputs: Sequence[Tensor], input_keys: dict) -> list:
        """The operators between the inputs and the outputs, each after all of its producers."""

        def children(op: Any) -> list:
            kids = []
            for i in range(len(op.src)):
                k = _src_key(op, i)
                if not isinstance(k[0], autograd.Dummy) and k not in input_keys:
                    kids.append(k[0])
            for t in _side_tensors(op):
                k = _key(t)
                if k is not None and not isinstance(k[0], autograd.Dummy) and k not in input_keys \
                        and id(t) not in self.input_ids:
                    kids.append(k[0])
            return kids

        order, done, active = [], set(), set()
        for t in outputs:
            k = _key(t)
            if k is None or isinstance(k[0], autograd.Dummy) or k in input_keys or id(t) in self.input_ids:
                continue
            if k[0] in done:
                continue
            stack = [(k[0], iter(children(k[0])))]
            active.add(k[0])
            while stack:  # iterative depth-first post-order: unrolled recurrences are deeper than Python's stack
                op, it = stack[-1]
                nxt = next(it, None)
                if nxt is None:
                    stack.pop()
                    active.discard(op)
                    done.add(op)
                    order.append(op)
                elif nxt not in done:
                    if nxt in active:
                        raise ValueError(f"to_onnx: the recorded graph has a cycle through {nxt.name}")
                    active.add(nxt)
                    stack.append((nxt, iter(children(nxt))))
        return order

    def _translate(self, op: Any, cls: str, out_names: dict) -> None:
        if "_src_meta" not in op.__dict__:
            raise _Unsupported("its inputs were not recorded (an Operator subclass whose __call__ bypasses "
                               "Operator.__call__)")
        # outputs first: when an input cannot be read, the operators after this one still find its outputs' names
        Y = []
        ymeta = op.__dict__.get("_y_meta") or []
        for idx, (shape, dtype, _dev) in enumerate(ymeta):
            k = (op, idx)
            name = out_names.get(k) or self.unique(self.base if len(ymeta) == 1 else f"{self.base}.out{idx}")
            Y.append(self.value(name, shape, dtype, "unset"))
            self.names[k] = name
        X = [self.src_name(op, i) for i in range(len(op.src))]
        _HANDLERS[cls](self, op, X, Y)
        self.settle(X, Y)

    def settle(self, X: Sequence[str], Y: Sequence[str]) -> None:
        """What no handler decided: an output follows the batch when an input does and its first axis has that
        size; else it depends on the inputs when any does."""
        any_b = any(self.bstate.get(x) == "b" for x in X)
        any_dep = any(self.dep(x) for x in X)
        for y in Y:
            if self.bstate.get(y) == "unset":
                s = self.shape[y]
                if any_b and s and s[0] == self.batch:
                    self.bstate[y] = "b"
                else:
                    self.bstate[y] = "d" if any_dep else None

    def _model(self, inputs: Sequence[Tensor], out_names: list[str], model_name: str) -> onnx.ModelProto:
        dynamic = self.batch is not None and not self.static_reasons
        if self.dynamic_batch and self.static_reasons:
            raise ValueError("to_onnx: dynamic_batch=True, but the graph is exact only at the recorded batch size "
                             f"{self.batch}:\n  " + "\n  ".join(self.static_reasons))

        def dims(name: str) -> list | None:
            s = self.shape.get(name)
            if s is None:
                return None
            s = list(s)
            if dynamic and s:
                st = self.bstate.get(name)
                if st == "b":
                    s[0] = BATCH_DIM
                elif st == "d":
                    s[0] = None  # depends on the batch in a way we do not name
            return s

        g_in = [helper.make_tensor_value_info(n, _ONNX_TYPE[self.dtype[n]], dims(n)) for n in self.input_names]
        g_out = [helper.make_tensor_value_info(n, _ONNX_TYPE[self.dtype[n]], dims(n)) for n in out_names]
        graph = helper.make_graph(self.nodes, _clean(model_name), g_in, g_out, initializer=self.initializers)
        opsets = [helper.make_opsetid("", self.opset)]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="singa",
                                  producer_version=_singa_version())
        model.ir_version = helper.find_min_ir_version_for(opsets)
        if self.batch is not None and self.static_reasons:
            model.doc_string = (f"Input shapes are fixed at the recorded batch size {self.batch}: "
                                + "; ".join(self.static_reasons))
        return model


def _singa_version() -> str:
    try:
        from importlib.metadata import version

        return version("singa-core")
    except Exception:  # noqa: BLE001 - the version string is informative only
        return ""


# -- translations ----------------------------------------------------------------------------------------------------
# Each handler gets the exporter, the operator, its input names X and output names Y (registered with the recorded
# shapes and dtypes), and appends nodes that compute Y.

_SIMPLE = {
    "ReLU": "Relu", "Identity": "Identity", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Cos": "Cos", "Cosh": "Cosh",
    "Acos": "Acos", "Acosh": "Acosh", "Sin": "Sin", "Sinh": "Sinh", "Asin": "Asin", "Asinh": "Asinh", "Tan": "Tan",
    "Atan": "Atan", "Atanh": "Atanh", "Abs": "Abs", "Exp": "Exp", "Log": "Log", "Sqrt": "Sqrt",
    "SoftPlus": "Softplus", "SoftSign": "Softsign", "Negative": "Neg", "Reciprocal": "Reciprocal", "Erf": "Erf",
    "Sign": "Sign", "Ceil": "Ceil", "Floor": "Floor", "Rounde": "Round", "Shape": "Shape", "NonZero": "NonZero",
}
_BROADCASTING = {
    "Add": "Add", "Sub": "Sub", "Mul": "Mul", "Div": "Div", "Pow": "Pow", "PRelu": "PRelu", "Sum": "Sum",
    "Mean": "Mean", "Max": "Max", "Min": "Min",
}


@_handles(*_SIMPLE)
def _simple(ex: _Exporter, op: Any, X: list, Y: list) -> None:
    cls = _autograd_class(op, _SIMPLE)
    ex.node(_SIMPLE[cls], X, Y)
    if cls in ("Shape", "NonZero") and ex.dep(X[0]):
        ex.bstate[Y[0]] = "d"  # values, not axes, follow the batch


@_handles(*_BROADCASTING)
def _broadcasting(ex: _Exporter, op: Any, X: list, Y: list) -> None:
    ex.broadcast_check(X)
    ex.node(_BROADCASTING[_autograd_class(op, _BROADCASTING)], X, Y)


@_handles("Elu")
def _elu(ex, op, X, Y):
    ex.node("Elu", X, Y, alpha=float(op.alpha))


@_handles("SeLU")
def _selu(ex, op, X, Y):
    ex.node("Selu", X, Y, alpha=float(op.alpha), gamma=float(op.gamma))


@_handles("LeakyRelu")
def _leakyrelu(ex, op, X, Y):
    ex.node("LeakyRelu", X, Y, alpha=float(op.a))


@_handles("HardSigmoid")
def _hardsigmoid(ex, op, X, Y):
    ex.node("HardSigmoid", X, Y, alpha=float(op.alpha), beta=float(op.gamma))


@_handles("Clip")
def _clip(ex, op, X, Y):
    lo = "" if op.min is None else ex.scalar(float(_array(op.min).reshape(-1)[0]), X[0], "min")
    hi = "" if op.max is None else ex.scalar(float(_array(op.max).reshape(-1)[0]), X[0], "max")
    ex.node("Clip", [X[0], lo, hi], Y)


@_handles("Round")
def _round(ex, op, X, Y):
    # SINGA's Round goes half away from zero; ONNX Round goes half to even: sign(x) * floor(|x| + 0.5)
    x = X[0]
    up = ex.node("Floor", [ex.node("Add", [ex.node("Abs", [x]), ex.scalar(0.5, x, "half")])])
    ex.node("Mul", [ex.node("Sign", [x]), up], Y)


@_handles("Gelu")
def _gelu(ex, op, X, Y):
    if ex.opset >= 20:
        ex.node("Gelu", X, Y)
        return
    x = X[0]  # x * 0.5 * (1 + erf(x / sqrt(2)))
    e = ex.node("Erf", [ex.node("Mul", [x, ex.scalar(1 / math.sqrt(2), x, "rsqrt2")])])
    cdf = ex.node("Mul", [ex.node("Add", [e, ex.scalar(1.0, x, "one")]), ex.scalar(0.5, x, "half")])
    ex.node("Mul", [x, cdf], Y)


@_handles("GeluTanh")
def _gelu_tanh(ex, op, X, Y):
    if ex.opset >= 20:
        ex.node("Gelu", X, Y, approximate="tanh")
        return
    x = X[0]  # x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), as PyTorch writes it below opset 20
    cube = ex.node("Mul", [x, ex.node("Mul", [x, x])])
    inner = ex.node("Add", [x, ex.node("Mul", [cube, ex.scalar(0.044715, x, "gelu_a")])])
    t = ex.node("Tanh", [ex.node("Mul", [inner, ex.scalar(math.sqrt(2 / math.pi), x, "sqrt2_pi")])])
    half = ex.node("Mul", [ex.node("Add", [t, ex.scalar(1.0, x, "one")]), ex.scalar(0.5, x, "half")])
    ex.node("Mul", [x, half], Y)


@_handles("SoftMax", "LogSoftmax")
def _softmax(ex, op, X, Y):
    kind = "Softmax" if _autograd_class(op, {"SoftMax": 1, "LogSoftmax": 1}) == "SoftMax" else "LogSoftmax"
    ex.node(kind, X, Y, axis=int(op.axis))


@_handles("Cast")
def _cast(ex, op, X, Y):
    ex.node("Cast", X, Y, to=_ONNX_TYPE[ex.dtype[Y[0]]])


def _cast_to(ex: _Exporter, name: str, code: int, out: str | None = None) -> str:
    if ex.dtype.get(name) == code and out is None:
        return name
    y = ex.node("Cast", [name], out, to=_ONNX_TYPE[code])
    if out is None:
        ex.value(y, ex.shape.get(name), code, ex.bstate.get(name))
    return y


@_handles("Less", "Greater", "Equal")
def _compare(ex, op, X, Y):
    ex.broadcast_check(X)
    kind = {"lt": "Less", "gt": "Greater", "eq": "Equal"}[op._op]
    if ex.dtype[Y[0]] == _dt.bool_:
        ex.node(kind, X, Y)
    else:  # SINGA gives 0/1 in the operands' dtype
        _cast_to(ex, ex.node(kind, X), ex.dtype[Y[0]], Y[0])


@_handles("And", "Or", "Xor", "Not")
def _logical(ex, op, X, Y):
    ex.broadcast_check(X)
    kind = {"logical_and": "And", "logical_or": "Or", "logical_xor": "Xor"}.get(getattr(op, "_op", None), "Not")
    args = [_cast_to(ex, x, _dt.bool_) for x in X]
    if ex.dtype[Y[0]] == _dt.bool_:
        ex.node(kind, args, Y)
    else:
        _cast_to(ex, ex.node(kind, args), ex.dtype[Y[0]], Y[0])


@_handles("Where")
def _where(ex, op, X, Y):
    cond = _cast_to(ex, ex.side(op.condition, "condition"), _dt.bool_)
    ex.broadcast_check([cond, *X])
    ex.node("Where", [cond, *X], Y)


# -- linear algebra --------------------------------------------------------------------------------------------------


@_handles("Matmul")
def _matmul(ex, op, X, Y):
    a, b = X
    ra, rb = len(ex.shape[a]), len(ex.shape[b])
    sa, sb = ex.bstate.get(a), ex.bstate.get(b)
    if (sa == "b" and ra == 1 and not ex.dep(b)) or (sb == "b" and rb <= 2 and not ex.dep(a)):
        ex.static("a matrix product contracts the batch axis with a fixed-size operand")
    if ra > 2 or rb > 2:
        ex.broadcast_check(X)
    ex.node("MatMul", X, Y)
    if (sa == "b" and ra >= 2) or (sb == "b" and rb > 2 and rb >= ra):
        ex.bstate[Y[0]] = "b"
    elif sa or sb:
        ex.bstate[Y[0]] = "d"


def _reshaped(ex: _Exporter, name: str, shape: Sequence[int], what: str) -> str:
    """name, reshaped to `shape` when it has another shape (parameters of shape (1, n) where ONNX wants (n,))."""
    if tuple(ex.shape[name]) == tuple(shape):
        return name
    out = ex.node("Reshape", [name, ex.ints(shape, what + "_shape")])
    return ex.value(out, shape, ex.dtype[name], ex.bstate.get(name))


@_handles("AddBias")
def _addbias(ex, op, X, Y):
    x, b = X
    nd = len(ex.shape[x])
    if op.axis == 0:
        target = (1,) * (nd - 1) + (ex.shape[x][-1],)
    else:  # one bias per row: its size is the batch size
        target = (ex.shape[x][0],) + (1,) * (nd - 1)
        if ex.bstate.get(x) == "b" and not ex.dep(b):
            ex.static("add_bias(axis=1) adds a bias per row of the batch")
    bs = ex.shape[b]
    if not (len(bs) <= nd and tuple(bs) == target[nd - len(bs):]):
        b = _reshaped(ex, b, target, "bias")
    ex.broadcast_check([x, b])
    ex.node("Add", [x, b], Y)


@_handles("MatmulBias")
def _matmul_bias(ex, op, X, Y):
    x, w, b = X
    product = ex.value(ex.tmp("matmul"), ex.shape[Y[0]], ex.dtype[Y[0]], "unset")
    _matmul(ex, op, [x, w], [product])
    ex.settle([x, w], [product])
    _addbias(ex, op, [product, b], Y)


@_handles("LayerNorm")
def _layer_norm(ex, op, X, Y):
    x = X[0]
    nd = len(ex.shape[x])
    ax = op.axis % nd
    norm = tuple(ex.shape[x][ax:])
    scale = X[1] if op.has_scale else ex.const(np.ones(norm), "scale", ex.np_dtype(x))
    bias = X[-1] if op.has_bias else ""
    if ex.opset >= 17:
        ex.node("LayerNormalization", [x, scale, bias], Y, axis=ax, epsilon=float(op.eps))
        return
    axes = list(range(ax, nd))  # the same arithmetic in older operators
    _reduce(ex, "ReduceMean", x, axes, 1, Y[1])
    d = ex.node("Sub", [x, Y[1]])
    var = _reduce(ex, "ReduceMean", ex.node("Mul", [d, d]), axes, 1)
    ex.node("Reciprocal", [ex.node("Sqrt", [ex.node("Add", [var, ex.scalar(op.eps, x, "eps")])])], Y[2])
    scaled = ex.node("Mul", [ex.node("Mul", [d, Y[2]]), scale])
    if bias:
        ex.node("Add", [scaled, bias], Y[0])
    else:
        ex.node("Identity", [scaled], Y[0])


@_handles("Gemm")
def _gemm(ex, op, X, Y):
    a_batched = ex.bstate.get(X[0]) == "b"
    if a_batched and op.transA and not ex.dep(X[1]):
        ex.static("Gemm with transA contracts the batch axis")
    if len(X) > 2 and a_batched and not op.transA and not ex.dep(X[2]):
        cs = ex.shape[X[2]]
        if len(cs) == 2 and cs[0] == ex.batch and ex.batch != 1:
            ex.static("Gemm's C has a row per example of the recorded batch")
    ex.node("Gemm", X, Y, alpha=float(op.alpha), beta=float(op.beta), transA=int(op.transA),
            transB=int(op.transB))
    if ex.bstate.get(X[0]) == "b" and op.transA:
        ex.bstate[Y[0]] = "d"


@_handles("CosSim")
def _cossim(ex, op, X, Y):
    a, b = X
    ex.broadcast_check(X)

    def dot(u: str, v: str) -> str:
        return _reduce(ex, "ReduceSum", ex.node("Mul", [u, v]), [-1], 0)

    den = ex.node("Sqrt", [ex.node("Mul", [dot(a, a), dot(b, b)])])
    ex.node("Div", [dot(a, b), den], Y)
    if len(ex.shape[a]) == 1 and ex.dep(a):
        ex.bstate[Y[0]] = "d"


# -- shape and layout ------------------------------------------------------------------------------------------------


def _reduce(ex: _Exporter, kind: str, x: str, axes: Sequence[int] | None, keepdims: int,
            out: str | None = None) -> str:
    """A reduction in the form of the target opset (axes as an input from opset 13 for ReduceSum, 18 for others)."""
    axes = None if axes is None else [int(a) for a in axes]
    if kind == "ReduceSum" or ex.opset >= 18:
        ins = [x] if not axes else [x, ex.ints(axes, "axes")]
        return ex.node(kind, ins, out, keepdims=int(keepdims))
    return ex.node(kind, [x], out, keepdims=int(keepdims), axes=axes or None)


@_handles("Reshape")
def _reshape(ex, op, X, Y):
    x = X[0]
    spec = _ints(op.shape) if not isinstance(op.shape, (int, np.integer)) else [int(op.shape)]
    xs, st = ex.shape[x], ex.bstate.get(x)
    if st == "b":
        if spec and spec[0] == ex.batch and xs and xs[0] == ex.batch:
            spec[0] = 0  # "copy the input's first axis": the same shape here, and right for any batch
        if not spec or spec[0] not in (0, -1):
            ex.static(f"reshape to {spec} does not keep the batch as the first axis")
    elif st == "d":
        ex.static(f"reshape of a batch-dependent value of shape {xs} to fixed sizes")
    ex.node("Reshape", [x, ex.ints(spec, "shape")], Y)


@_handles("Flatten")
def _flatten_op(ex, op, X, Y):
    ex.node("Flatten", X, Y, axis=int(op.axis))


def _axes(v: Any, nd: int) -> list[int]:
    return sorted(a % nd for a in _ints([v] if isinstance(v, (int, np.integer)) else v)) if nd else []


@_handles("Squeeze")
def _squeeze(ex, op, X, Y):
    x = X[0]
    xs = ex.shape[x]
    axis = op.axis
    empty = axis is None or (isinstance(axis, (list, tuple)) and not axis)
    axes = [i for i, d in enumerate(xs) if d == 1] if empty else _axes(axis, len(xs))
    if ex.dep(x) and ((0 in axes and ex.bstate.get(x) == "b") or ex.batch == 1):
        ex.static("squeeze removes an axis whose size 1 may be the batch size")
    ex.node("Squeeze", [x, ex.ints(axes, "axes")] if axes else [x], Y)
    if ex.bstate.get(x) == "b" and 0 not in axes:
        ex.bstate[Y[0]] = "b"


@_handles("Unsqueeze")
def _unsqueeze(ex, op, X, Y):
    x = X[0]
    axes = _axes(op.axis, len(ex.shape[Y[0]]))
    ex.node("Unsqueeze", [x, ex.ints(axes, "axes")], Y)
    if ex.bstate.get(x) == "b":
        ex.bstate[Y[0]] = "d" if 0 in axes else "b"


@_handles("Transpose")
def _transpose(ex, op, X, Y):
    x = X[0]
    nd = len(ex.shape[x])
    perm = list(range(nd - 1, -1, -1)) if op.perm is None else [int(p) % nd for p in op.perm]
    ex.node("Transpose", X, Y, perm=perm)
    if ex.dep(x):
        ex.bstate[Y[0]] = "b" if ex.bstate[x] == "b" and perm and perm[0] == 0 else "d"


@_handles("Concat")
def _concat(ex, op, X, Y):
    nd = len(ex.shape[Y[0]])
    ax = int(op.axis) % nd
    if ax != 0 and any(ex.dep(x) for x in X) and not all(ex.bstate.get(x) == "b" for x in X):
        ex.static("concatenation joins fixed-size pieces to batch-dependent ones")
    ex.node("Concat", X, Y, axis=ax)
    if any(ex.dep(x) for x in X):
        ex.bstate[Y[0]] = "b" if ax != 0 and all(ex.bstate.get(x) == "b" for x in X) else "d"


@_handles("Split")
def _split(ex, op, X, Y):
    x = X[0]
    nd = len(ex.shape[x])
    ax = int(op.axis) % nd
    sizes = [ex.shape[y][ax] for y in Y]
    if ex.dep(x) and (ax == 0 or ex.bstate[x] == "d"):
        ex.static(f"split into fixed sizes {sizes} along a batch-dependent axis")
    ex.node("Split", [x, ex.ints(sizes, "split")], Y, axis=ax)


@_handles("Slice")
def _slice(ex, op, X, Y):
    x = X[0]
    nd = len(ex.shape[x])
    starts, ends = _ints(op.starts), _ints(op.ends)
    axes = _ints(op.axes) if op.axes is not None else list(range(len(starts)))
    steps = _ints(op.steps) if op.steps is not None else None
    if ex.dep(x) and (ex.bstate[x] == "d" or 0 in [a % nd for a in axes]):
        ex.static("slice with fixed bounds along a batch-dependent axis")
    ins = [x, ex.ints(starts, "starts"), ex.ints(ends, "ends"), ex.ints(axes, "axes")]
    if steps is not None:
        ins.append(ex.ints(steps, "steps"))
    ex.node("Slice", ins, Y)


@_handles("Expand")
def _expand(ex, op, X, Y):
    x = X[0]
    shape = _ints(op.shape)
    xs = ex.shape[x]
    lead = len(shape) - len(xs)
    if ex.bstate.get(x) == "b" and lead >= 0 and shape[lead] == ex.batch:
        shape[lead] = 1  # 1 keeps the input's own size: the batch, whatever it is
    elif ex.dep(x):
        ex.static(f"expand of a batch-dependent value to the fixed shape {shape}")
    ex.node("Expand", [x, ex.ints(shape, "shape")], Y)
    if ex.bstate.get(x) == "b":
        ex.bstate[Y[0]] = "b" if lead <= 0 else "d"


@_handles("Tile")
def _tile(ex, op, X, Y):
    x = X[0]
    reps = _ints(op.repeats)
    nd = len(ex.shape[x])
    if len(reps) > nd:  # numpy.tile prepends axes; ONNX Tile wants one repeat per axis
        x = ex.node("Unsqueeze", [x, ex.ints(range(len(reps) - nd), "axes")])
    else:  # fewer repeats than axes: they apply to the leading axes, as autograd.Tile (SINGA's) does
        reps = reps + [1] * (nd - len(reps))
    ex.node("Tile", [x, ex.ints(reps, "repeats")], Y)
    if ex.bstate.get(X[0]) == "b":
        ex.bstate[Y[0]] = "b" if len(reps) == nd and reps[0] == 1 else "d"


@_handles("Pad")
def _pad(ex, op, X, Y):
    x = X[0]
    pads = [int(p) for p in op.pads]
    ins = [x, ex.ints(pads, "pads")]
    if op.mode == "constant":
        ins.append(ex.scalar(float(op.constant), x, "value"))
    ex.node("Pad", ins, Y, mode=str(op.mode))


@_handles("UpSample")
def _upsample(ex, op, X, Y):
    if op.mode != "nearest":
        raise _Unsupported(f"upsample mode {op.mode!r} (only 'nearest' runs in SINGA)")
    scales = np.asarray([float(s) for s in np.asarray(op.scales).reshape(-1)], dtype=np.float32)
    # integer scales: asymmetric coordinates with floor rounding repeat each element, as SINGA's upsample does
    ex.node("Resize", [X[0], "", ex.const(scales, "scales")], Y, mode="nearest",
            coordinate_transformation_mode="asymmetric", nearest_mode="floor")


@_handles("DepthToSpace")
def _depth_to_space(ex, op, X, Y):
    ex.node("DepthToSpace", X, Y, blocksize=int(op.blocksize), mode=str(op.mode))


@_handles("SpaceToDepth")
def _space_to_depth(ex, op, X, Y):
    b = int(op.blocksize)
    if op.mode == "DCR":  # ONNX SpaceToDepth is the inverse of DepthToSpace's DCR order
        ex.node("SpaceToDepth", X, Y, blocksize=b)
        return
    _, C, H, W = ex.shape[X[0]]  # CRD: the same steps as SINGA, with 0 keeping the batch axis
    t = ex.node("Reshape", [X[0], ex.ints([0, C, H // b, b, W // b, b], "shape6")])
    t = ex.node("Transpose", [t], perm=[0, 1, 3, 5, 2, 4])
    ex.node("Reshape", [t, ex.ints([0, C * b * b, H // b, W // b], "shape4")], Y)


@_handles("ConstantOfShape")
def _constant_of_shape(ex, op, X, Y):
    value = np.asarray(_array(op.value), dtype=ex.np_dtype(Y[0])).reshape(-1)[:1]
    ex.node("ConstantOfShape", [_cast_to(ex, X[0], _dt.int64)], Y, value=numpy_helper.from_array(value, "value"))
    if ex.dep(X[0]):
        ys = ex.shape[Y[0]]
        ex.bstate[Y[0]] = "b" if ys and ys[0] == ex.batch else "d"


@_handles("ReduceSum", "ReduceMean")
def _reduce_op(ex, op, X, Y):
    x = X[0]
    kind = "ReduceMean" if _autograd_class(op, {"ReduceSum": 1, "ReduceMean": 1}) == "ReduceMean" else "ReduceSum"
    nd = len(ex.shape[x])
    axes = None if op.axes is None else _axes(op.axes, nd)
    _reduce(ex, kind, x, axes or None, int(op.keepdims), Y[0])
    if ex.bstate.get(x) == "b":
        ex.bstate[Y[0]] = "d" if not axes or 0 in axes else "b"


@_handles("GlobalAveragePool")
def _global_average_pool(ex, op, X, Y):
    nd = len(ex.shape[X[0]])
    if op.data_format == "channels_first" and nd >= 3:
        ex.node("GlobalAveragePool", X, Y)
    else:
        axes = list(range(2, nd)) if op.data_format == "channels_first" else list(range(1, nd - 1))
        if axes:
            _reduce(ex, "ReduceMean", X[0], axes, 1, Y[0])
        else:
            ex.node("Identity", X, Y)


# -- indexing --------------------------------------------------------------------------------------------------------


def _index(ex: _Exporter, v: Any, what: str) -> str:
    """Indices as an integer value (SINGA accepts float indices and converts them)."""
    if isinstance(v, Tensor) and (id(v) in ex.input_ids or (_key(v) is not None and _key(v) in ex.names)):
        name = ex.side(v, what)
        return name if ex.dtype[name] in _INTS else _cast_to(ex, name, _dt.int64)
    arr = _array(v)
    return ex.side(arr if arr.dtype.kind in "iu" else arr.astype(np.int64), what, np.int64)


@_handles("Gather")
def _gather(ex, op, X, Y):
    x = X[0]
    ax = int(op.axis) % len(ex.shape[x])
    ex.node("Gather", [x, _index(ex, op.indices, "indices")], Y, axis=ax)
    if ex.bstate.get(x) == "b" and ax == 0:
        ex.bstate[Y[0]] = "d"


@_handles("Embedding")
def _embedding(ex, op, X, Y):
    ids, w = X
    if ex.dtype[ids] not in _INTS:
        ids = _cast_to(ex, ids, _dt.int64)
    ex.node("Gather", [w, ids], Y, axis=0)


@_handles("ScatterElements")
def _scatter_elements(ex, op, X, Y):
    x = X[0]
    idx = _index(ex, op.indices, "indices")
    upd = ex.side(op.updates, "updates", ex.np_dtype(x) if not isinstance(op.updates, Tensor) else None)
    upd = _cast_to(ex, upd, ex.dtype[x])
    if ex.dep(x) and not (ex.dep(idx) and ex.dep(upd)):
        ex.static("scatter_elements with fixed-size indices into a batch-dependent value")
    ex.node("ScatterElements", [x, idx, upd], Y, axis=int(op.axis))


@_handles("OneHot")
def _onehot(ex, op, X, Y):
    idx = _cast_to(ex, X[0], _dt.int64)
    depth = ex.const(np.asarray([_ints(op.depth)[0]], dtype=np.int64), "depth")
    values = ex.const(np.asarray(_array(op.values).reshape(-1), dtype=ex.np_dtype(Y[0])), "values")
    ex.node("OneHot", [idx, depth, values], Y, axis=int(op.axis))
    if ex.bstate.get(X[0]) == "b" and int(op.axis) % len(ex.shape[Y[0]]) == 0:
        ex.bstate[Y[0]] = "d"


@_handles("Dropout")
def _dropout(ex, op, X, Y):
    # inference form: ONNX Dropout without training_mode passes its input through, as SINGA does when not training
    ex.node("Dropout", [X[0], ex.const(np.asarray(float(op.ratio), dtype=np.float32), "ratio")], Y)


# -- losses (SINGA's: shape (1,), averaged over the batch) ------------------------------------------------------------


def _batch_mean_of_sums(ex: _Exporter, z: str, nd: int) -> str:
    """sum(z) / z.shape[0] for z of rank nd: the per-example sums averaged over the first axis (any batch size)."""
    if nd == 0:
        return z
    if nd == 1:
        return _reduce(ex, "ReduceMean", z, None, 0)
    return _reduce(ex, "ReduceMean", _reduce(ex, "ReduceSum", z, list(range(1, nd)), 0), [0], 0)


def _as_loss(ex: _Exporter, v: str, out: str) -> None:
    ex.node("Reshape", [v, ex.ints([1], "loss_shape")], out)


def _loss_target(op: Any, X: list[str]) -> Any:
    """A loss's target: its second input (SINGA 3's `MeanSquareError()(x, t)`) or its constructor argument."""
    return X[1] if len(X) > 1 else op.t


def _target(ex: _Exporter, t: Any) -> tuple[str, tuple, int]:
    name = t if isinstance(t, str) else ex.side(t, "target")
    return name, tuple(ex.shape[name]), ex.dtype[name]


def _dense_target(ex: _Exporter, x: str, t: Any) -> str:
    """The target as values of x's shape and dtype (class labels become one-hot rows), as SINGA's losses read it."""
    name, shape, code = _target(ex, t)
    xs = ex.shape[x]
    if len(xs) == 2 and shape != tuple(xs) and shape in ((xs[0],), (xs[0], 1)) and not \
            (shape == (xs[0], 1) and xs[1] == 1):
        labels = _cast_to(ex, ex.node("Reshape", [name, ex.ints([-1], "labels_shape")]), _dt.int64)
        values = ex.const(np.asarray([0, 1], dtype=ex.np_dtype(x)), "onehot_values")
        depth = ex.const(np.asarray([xs[1]], dtype=np.int64), "depth")
        ex.same_batch([x, name])
        return ex.node("OneHot", [labels, depth, values], axis=-1)
    ex.broadcast_check([x, name])
    return _cast_to(ex, name, ex.dtype[x])


@_handles("SoftMaxCrossEntropy")
def _softmax_cross_entropy(ex, op, X, Y):
    x = X[0]
    N, C = ex.shape[x]
    t, ts, tcode = _target(ex, _loss_target(op, X))
    ex.same_batch([x, t])
    if ts == (N, C) and not (C == 1 and tcode in _INTS):  # probabilities (one-hot rows): -mean(sum(t * logsoftmax))
        prod = ex.node("Mul", [_cast_to(ex, t, ex.dtype[x]), ex.node("LogSoftmax", [x], axis=1)])
        _as_loss(ex, ex.node("Neg", [_batch_mean_of_sums(ex, prod, 2)]), Y[0])
    elif ts in ((N,), (N, 1)):
        labels = t if ts == (N,) else ex.node("Reshape", [t, ex.ints([-1], "labels_shape")])
        if tcode not in _INTS:
            labels = _cast_to(ex, labels, _dt.int64)
        _as_loss(ex, ex.node("SoftmaxCrossEntropyLoss", [x, labels], reduction="mean"), Y[0])
    else:
        raise _Unsupported(f"target of shape {ts} for predictions of shape {(N, C)}")


@_handles("CrossEntropy")
def _cross_entropy(ex, op, X, Y):
    x = X[0]
    t = _dense_target(ex, x, _loss_target(op, X))
    prod = ex.node("Mul", [t, ex.node("Log", [x])])
    _as_loss(ex, ex.node("Neg", [_batch_mean_of_sums(ex, prod, len(ex.shape[x]))]), Y[0])


@_handles("BinaryCrossEntropy")
def _binary_cross_entropy(ex, op, X, Y):
    x = X[0]
    t = _dense_target(ex, x, _loss_target(op, X))
    eps = float(op._EPS)
    pos = ex.node("Mul", [t, ex.node("Log", [ex.node("Add", [x, ex.scalar(eps, x, "eps")])])])
    one_minus_t = ex.node("Sub", [ex.scalar(1.0, x, "one"), t])
    neg = ex.node("Mul", [one_minus_t, ex.node("Log", [ex.node("Sub", [ex.scalar(1.0 + eps, x, "one_eps"), x])])])
    both = ex.node("Add", [pos, neg])
    _as_loss(ex, ex.node("Neg", [_batch_mean_of_sums(ex, both, len(ex.shape[x]))]), Y[0])


@_handles("MeanSquareError")
def _mean_square_error(ex, op, X, Y):
    x = X[0]
    err = ex.node("Sub", [x, _dense_target(ex, x, _loss_target(op, X))])
    sq = ex.node("Mul", [err, err])
    _as_loss(ex, ex.node("Mul", [_batch_mean_of_sums(ex, sq, len(ex.shape[x])), ex.scalar(0.5, x, "half")]), Y[0])


@_handles("RankingLoss")
def _ranking_loss(ex, op, X, Y):
    pos, neg = X
    ex.broadcast_check(X)
    val = ex.node("Relu", [ex.node("Add", [ex.node("Sub", [neg, pos]), ex.scalar(float(op.M), pos, "margin")])])
    ps = ex.shape[pos]
    vs = tuple(np.broadcast_shapes(tuple(ps), tuple(ex.shape[neg])))
    if ps and vs and vs[0] == ps[0]:
        total = _batch_mean_of_sums(ex, val, len(vs))
    else:  # n = pos.shape[0] is not the first axis of the broadcast result: fixed at the recorded size
        n = ps[0] if ps else 1
        if ex.dep(pos):
            ex.static("ranking_loss divides by a batch size that is not its values' first axis")
        total = ex.node("Mul", [_reduce(ex, "ReduceSum", val, None, 0), ex.scalar(1.0 / n, pos, "inv_n")])
    _as_loss(ex, total, Y[0])


# -- convolution, pooling, normalisation ----------------------------------------------------------------------------


@_handles("_Conv2d")
def _conv(ex, op, X, Y):
    x, w = X[0], X[1]
    K, _, kh, kw = ex.shape[w]
    ins = [x, w]
    if len(X) > 2:
        ins.append(_reshaped(ex, X[2], (K,), "bias"))
    ex.node("Conv", ins, Y, kernel_shape=[kh, kw], strides=list(op.stride), pads=list(op.padding),
            dilations=list(op.dilation), group=int(op.group))


@_handles("_Pooling2d")
def _pool(ex, op, X, Y):
    kh, kw = op.kernel_size
    attrs = {"kernel_shape": [int(kh), int(kw)], "strides": [int(s) for s in op.stride],
             "pads": [int(p) for p in op.padding], "ceil_mode": int(bool(op.ceil_mode))}
    dil = [int(d) for d in op.dilation]
    # With ceil_mode SINGA (like PyTorch and onnxruntime) drops a last window that would start in the end padding;
    # onnx's shape inference keeps it. Slicing to SINGA's size makes the model mean the same to both.
    y_hw = list(ex.shape[Y[0]][2:])
    onnx_hw = y_hw
    if op.ceil_mode:
        pads = attrs["pads"]
        onnx_hw = [-(-(n + pads[i] + pads[i + 2] - (k - 1) * d - 1) // s) + 1
                   for i, (n, k, s, d) in enumerate(zip(ex.shape[X[0]][2:], (kh, kw), attrs["strides"], dil))]
    out = Y if onnx_hw == y_hw else None
    if op.is_max:
        if dil != [1, 1]:
            attrs["dilations"] = dil
        pooled = ex.node("MaxPool", X, out, **attrs)
    else:
        if dil != [1, 1]:
            ex.need_opset(19, "AveragePool with dilation")
            attrs["dilations"] = dil
        # ONNX's default count_include_pad is 0, SINGA's True: always say which
        pooled = ex.node("AveragePool", X, out, count_include_pad=int(bool(op.count_include_pad)), **attrs)
    if out is None:
        ex.node("Slice", [pooled, ex.ints([0, 0], "starts"), ex.ints(y_hw, "ends"), ex.ints([2, 3], "axes")], Y)


@_handles("_BatchNorm2d")
def _batchnorm(ex, op, X, Y):
    x, scale, bias = X
    C = ex.shape[x][1]

    def stat(t: Tensor, what: str) -> str:
        if id(t) not in ex.leaf_names:
            arr = np.asarray(t.to_numpy()).reshape(C)
            ex.leaf_names[id(t)] = ex.initializer(arr.astype(ex.np_dtype(x)), t.name or f"{ex.base}.{what}")
            ex.held.append(t)
        return ex.leaf_names[id(t)]

    ins = [x, _reshaped(ex, scale, (C,), "scale"), _reshaped(ex, bias, (C,), "bias"),
           stat(op.running_mean, "running_mean"), stat(op.running_var, "running_var")]
    # inference form: the running statistics, whichever mode the graph was recorded in
    ex.node("BatchNormalization", ins, Y, epsilon=float(op.eps), momentum=float(op.momentum))


# -- public API ------------------------------------------------------------------------------------------------------


class SingaFrontend:
    """SINGA's exporter class: translates the operators recorded by autograd into ONNX (see the module doc)."""

    target_opset_version = DEFAULT_OPSET

    @classmethod
    def singa_to_onnx_model(cls, inputs: Sequence[Tensor], y: Sequence[Tensor], model_name: str = "sonnx",
                            opset_version: int | None = None, dynamic_batch: bool | None = None) -> onnx.ModelProto:
        """The ONNX model computing outputs `y` from `inputs` (see `to_onnx`)."""
        return _Exporter(opset_version, dynamic_batch).run(inputs, y, model_name)

    @classmethod
    def singa_to_onnx_graph(cls, inputs: Sequence[Tensor], y: Sequence[Tensor], model_name: str = "sonnx",
                            opset_version: int | None = None, dynamic_batch: bool | None = None) -> onnx.GraphProto:
        """The graph of `singa_to_onnx_model` (the opset it needs is in the model's opset_import)."""
        return cls.singa_to_onnx_model(inputs, y, model_name, opset_version, dynamic_batch).graph

    @classmethod
    def singa_op_to_onnx_node(cls, op: autograd.Operator, op_t: Any = None) -> list[onnx.NodeProto]:
        """The nodes for one recorded operator, standing on their own (constants as Constant nodes).

        Inputs are named `<op>.in<i>` and outputs `<op>.out<i>` unless `op_t` maps input indices to names."""
        names = dict(op_t) if isinstance(op_t, dict) else {}
        meta = op.__dict__.get("_src_meta") or []
        X = [names.get(i, f"{_clean(op.name)}.in{i}") for i in range(len(op.src))]
        ymeta = op.__dict__.get("_y_meta") or []
        W = [f"{_clean(op.name)}.out{i}" for i in range(len(ymeta))]
        return cls.handle_special_ops(op, X, W, shapes=[m[2] for m in meta])

    @classmethod
    def handle_special_ops(cls, op: autograd.Operator, X: Sequence[str], W: Sequence[str],
                           shapes: Sequence[tuple] | None = None) -> list[onnx.NodeProto]:
        """The nodes computing outputs W from inputs X for operator `op` (every operator goes through its handler;
        attributes that ONNX takes as inputs become Constant nodes)."""
        ex = _Exporter(inline=True)
        kind = _autograd_class(op, _HANDLERS)
        if kind is None:
            raise UnsupportedExportError([(1, type(op).__name__, op.name, "no ONNX translation")], 1)
        meta = op.__dict__.get("_src_meta") or []
        shapes = list(shapes) if shapes is not None else [m[2] for m in meta]
        for i, x in enumerate(X):
            ex.taken.add(x)
            ex.value(x, shapes[i] if i < len(shapes) else None, _input_dtype(op, i))
        ymeta = op.__dict__.get("_y_meta") or []
        for i, w in enumerate(W):
            ex.taken.add(w)
            shape, dtype = (ymeta[i][0], ymeta[i][1]) if i < len(ymeta) else (None, _dt.float32)
            ex.value(w, shape, dtype)
        ex.base = _clean(op.name.lstrip("_"))
        ex.where = f"{type(op).__name__} '{op.name}'"
        try:
            _HANDLERS[kind](ex, op, list(X), list(W))
        except _Unsupported as exc:
            raise UnsupportedExportError([(1, type(op).__name__, op.name, str(exc))], 1) from None
        return ex.nodes


def _input_dtype(op: Any, i: int) -> int:
    """The dtype of a recorded operator's input i, from its producer's record or the leaf tensor."""
    creator, _, kept, _ = op.src[i]
    if isinstance(creator, autograd.Dummy):
        t = kept if kept is not None else creator.tensor
        return t.dtype if t is not None else _dt.float32
    idx = _src_key(op, i)[1]
    ymeta = creator.__dict__.get("_y_meta") or []
    return ymeta[idx][1] if idx < len(ymeta) else _dt.float32


def to_onnx(inputs: Sequence[Tensor] | Tensor, outputs: Sequence[Tensor] | Tensor, model_name: str = "sonnx",
            opset_version: int | None = None, dynamic_batch: bool | None = None) -> onnx.ModelProto:
    """Export the operators recorded between `inputs` and `outputs` as an ONNX model.

    Run the forward pass, in training or evaluation mode (`m.eval(); y = m.forward(x)`), then
    `onnx.save(to_onnx([x], [y]), path)`. The model computes the inference form (BatchNorm with running statistics,
    Dropout as identity). Graph inputs follow `inputs` in order; entries that are not Tensors are ignored with a
    warning, and a tensor the graph does not use stands for the graph's next data leaf by position, as in SINGA.

    opset_version: the ONNX opset (default 18, at least 13; raised to 19 when an average pooling uses dilation).
    dynamic_batch: None (default) names the first axis of the inputs `batch` unless the graph is exact only at the
    recorded batch size (the model's doc_string then says why); True demands a symbolic batch (or raises); False
    keeps the recorded shapes. Unsupported operators are all reported in one UnsupportedExportError, each with its
    class, name and position.
    """
    return SingaFrontend.singa_to_onnx_model(inputs, outputs, model_name, opset_version, dynamic_batch)


# SINGA's module-level names for the same functions
singa_to_onnx_model = to_onnx
singa_to_onnx_graph = SingaFrontend.singa_to_onnx_graph
