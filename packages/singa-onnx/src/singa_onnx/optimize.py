"""Inference-time rewrites of an imported graph, for SingaRep's runs that record no gradients.

`fold(program, device, params)` returns a new Program computing the same outputs with less work per run:

* constant folding: a node whose inputs are all constants (initializers, Constant nodes, earlier folded values) runs
  once here, with the same handler a run would use, and its outputs become constants (`Unsqueeze` of a weight,
  `ConstantOfShape`, shape arithmetic ...). Random operators and nodes with subgraphs are left alone;
* Identity, and Dropout outside training with no mask read, are left out: their readers read the input instead
  (as onnxruntime does; a value passed through them would otherwise keep the plan from laying out what surrounds
  them in channel blocks, see singa_onnx.layout);
* BatchNormalization in inference mode after a Conv whose output it alone reads: folded into the convolution's
  weights and bias (W * s and (b - mean) * s + beta, with s = gamma / sqrt(var + eps) and the bias in float64, the
  weights multiplied in float32);
* a per-channel constant Mul / Add after such a Conv (the scale-and-shift some exporters write after BatchNormalization)
  folds into its weights and bias the same way; after a BatchNormalization that is not folded, into its scale and
  bias;
* GELU spelled out (erf or tanh form) becomes one Gelu node, a float MatMul divided or multiplied by a constant
  scalar (attention's 1 / sqrt(d) scale) one com.microsoft FusedMatMul node whose alpha is the scale, and a Conv
  followed by a Relu, a residual Add, or both, one FusedConv node (see _fuse_gelu, _fuse_scaled_matmul and
  _fuse_conv).

Only float32 weights are rewritten. The rewrites use the parameter values given (the tensors of `SingaRep.tensor_map`),
so the folded program is valid only while they stay as they are: SingaRep builds it when the parameters are frozen
and builds it again when they change (see SingaRep.run). Training (SONNXModel, or SingaRep with trainable tensors)
always runs the graph as imported.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from singa import ops
from singa.backend import Device
from singa.tensor import Tensor
from singa_onnx.registry import lookup
from singa_onnx.runtime import OnnxAttributes, OnnxNode, Program, Runtime, run_node

# operators whose value is not a function of their inputs (or that change behaviour when training)
NO_FOLD = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli",
                     "Multinomial", "Dropout"})
# a folded value may not be larger than this (elements); beyond it the node runs at every call as before
MAX_FOLD_ELEMENTS = 1 << 26

_FLOAT = 1  # onnx.TensorProto.FLOAT


def fold(program: Program, device: Device, params: dict[str, Tensor]) -> Program:
    """A copy of `program` with constants folded and normalisations folded into convolutions (see the module doc)."""
    values: dict[str, Any] = {}
    for name, arr in program.initializers.items():
        p = params.get(name)
        values[name] = p if p is not None else arr
    rt = Runtime(device, params, training=False)
    nodes: list[OnnxNode] = []
    for node in program.nodes:
        if _foldable(node, values):
            outs = _evaluate(node, values, rt)
            if outs is not None:
                values.update(outs)
                continue
        nodes.append(node)
    f = _Folder(program, _skip_identities(nodes, values, program.outputs), values)
    f.run()
    out = copy.copy(program)
    nodes = _fuse_scaled_matmul(_fuse_gelu(f.nodes, values, program.outputs), values, program.outputs)
    out.nodes = _fuse_conv(nodes, values, program.outputs)
    used = set(program.outputs)
    for node in f.nodes:
        used.update(node.uses)
    out.initializers = {n: v for n, v in values.items() if n in used}
    out.folded = len(program.nodes) - len(f.nodes)
    out._plan_lifetimes()
    return out


def _foldable(node: OnnxNode, values: dict) -> bool:
    if node.op_type in NO_FOLD or node.subgraphs or node.entry is None:
        return False
    if not any(node.outputs):
        return False
    return all(n in values for n in node.inputs if n)


def _evaluate(node: OnnxNode, values: dict, rt: Runtime) -> dict | None:
    """{output: value} of one node on constant inputs, or None to leave the node in the program (it may fail, return
    a sequence, or produce something too large to keep)."""
    args = [values[n] if n else None for n in node.inputs]
    try:
        outs = run_node(node, args, rt, None)
    except Exception:  # noqa: BLE001 - a node that fails here fails at run time too, with the run's error message
        return None
    result = {}
    for n, v in zip(node.outputs, outs):
        if not n:
            continue
        if not (v is None or isinstance(v, (np.ndarray, Tensor))):
            return None
        if v is not None and _numel(v.shape) > MAX_FOLD_ELEMENTS:
            return None
        result[n] = v
    if any(n and n not in result for n in node.outputs):
        return None
    return result


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _host(v: Any) -> np.ndarray | None:
    if isinstance(v, Tensor):
        return ops.to_numpy(v)
    if isinstance(v, np.ndarray):
        return v
    return None


def _channel_vector(v: Any, channels: int, rank: int) -> np.ndarray | None:
    """A float32 constant that broadcasts over a rank-`rank` value as one number per channel (axis 1), as a (channels,)
    float64 vector; None for anything else."""
    a = _host(v)
    if a is None or a.dtype != np.float32 or a.ndim > rank or rank < 2:
        return None
    shape = (1,) * (rank - a.ndim) + a.shape
    if shape[0] != 1 or any(d != 1 for d in shape[2:]) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(a.astype(np.float64).reshape(-1), (channels,)) if shape[1] == channels else \
        np.full(channels, float(a.reshape(-1)[0]))


def _bn_inference(node: OnnxNode) -> bool:
    """BatchNormalization with running statistics and a single output (as the handler runs it outside training)."""
    outs = [o for o in node.outputs if o]
    if len(outs) != 1 or not node.outputs[0]:
        return False
    if node.opset >= 14:
        return not node.attr("training_mode", 0)
    return True


def _skip_identities(nodes: list[OnnxNode], values: dict, outputs: list[str]) -> list[OnnxNode]:
    """`nodes` without the Identity nodes and the inference Dropouts (training_mode absent or a constant false, the
    mask not read), their readers given the input instead. A node stays where its output is a graph output or is
    read inside a subgraph (whose free names this pass does not rewrite)."""
    kept = set(outputs)
    for node in nodes:
        for sub in node.subgraphs.values():
            for p in sub if isinstance(sub, list) else [sub]:
                kept.update(p.free)
    read = kept | {n for node in nodes for n in node.uses}  # a mask read (or a graph output) keeps its Dropout
    alias: dict[str, str] = {}
    for node in nodes:
        if node.domain or not node.inputs or not node.inputs[0] or not node.outputs or node.outputs[0] in kept:
            continue
        if node.op_type == "Identity" and len(node.outputs) == 1:
            pass
        elif node.op_type == "Dropout" and not (len(node.outputs) > 1 and node.outputs[1] in read):
            mode = node.inputs[2] if node.opset >= 12 and len(node.inputs) > 2 else ""
            training = _host(values.get(mode)) if mode else None
            if mode and (training is None or training.any()):
                continue
        else:
            continue
        alias[node.outputs[0]] = alias.get(node.inputs[0], node.inputs[0])
    if not alias:
        return nodes
    out = []
    for node in nodes:
        if node.outputs and node.outputs[0] in alias:
            continue
        if any(n in alias for n in node.inputs):
            node = copy.copy(node)
            node.inputs = [alias.get(n, n) for n in node.inputs]
            node.uses = [alias.get(n, n) for n in node.uses]
            node.scratch = {}
        out.append(node)
    return out


class _Folder:
    """BatchNormalization and per-channel Mul/Add folded into the Conv (or BatchNormalization) before them."""

    def __init__(self, program: Program, nodes: list[OnnxNode], values: dict):
        self.program = program
        self.values = values
        self.nodes = nodes
        self.ranks = program.importer.ranks if hasattr(program, "importer") else {}
        self.consumers: dict[str, int] = {}
        for node in nodes:
            for n in node.uses:
                self.consumers[n] = self.consumers.get(n, 0) + 1
        for n in program.outputs:
            self.consumers[n] = self.consumers.get(n, 0) + 2  # a graph output is never rewritten away
        self.names = set(values) | {n for node in nodes for n in node.inputs + node.outputs}

    def run(self) -> None:
        producer: dict[str, int] = {}
        kept: list[OnnxNode | None] = []
        for node in self.nodes:
            merged = None
            src = self._single_source(node)
            if src is not None and src in producer:
                i = producer[src]
                merged = self._merge(kept[i], node, src)
                if merged is not None:
                    kept[i] = merged
                    for o in merged.outputs:
                        if o:
                            producer[o] = i
                    continue
            kept.append(node)
            for o in node.outputs:
                if o:
                    producer[o] = len(kept) - 1
        self.nodes = [n for n in kept if n is not None]

    def _single_source(self, node: OnnxNode) -> str | None:
        """The non-constant input a foldable node reads, if it is read by this node alone."""
        if node.op_type == "BatchNormalization":
            x = node.inputs[0] if node.inputs else ""
        elif node.op_type in ("Mul", "Add") and len(node.inputs) == 2:
            a, b = node.inputs
            x = a if b in self.values and a not in self.values else b if a in self.values and b not in self.values \
                else ""
        else:
            return None
        if not x or self.consumers.get(x, 0) != 1 or len([o for o in node.outputs if o]) != 1:
            return None
        return x

    def _merge(self, prev: OnnxNode, node: OnnxNode, x: str) -> OnnxNode | None:
        try:
            if prev.op_type == "Conv":
                return self._into_conv(prev, node, x)
            if prev.op_type == "BatchNormalization" and node.op_type in ("Mul", "Add"):
                return self._into_bn(prev, node, x)
        except (ValueError, TypeError):
            return None
        return None

    # -- helpers ----------------------------------------------------------------------------------------------------
    def _const(self, name: str) -> Any:
        return self.values.get(name) if name else None

    def _new_name(self, base: str) -> str:
        name, i = base, 0
        while name in self.names:
            i += 1
            name = f"{base}_{i}"
        self.names.add(name)
        return name

    def _scale_shift(self, node: OnnxNode, x: str, channels: int, rank: int) -> tuple | None:
        """(scale, shift) float64 per-channel vectors that `node` applies to x, or None."""
        if any(t != _FLOAT for t in node.in_types[:len(node.inputs)]):
            return None
        if node.op_type == "BatchNormalization":
            if not _bn_inference(node) or len(node.inputs) < 5 or any(n not in self.values for n in node.inputs[1:5]):
                return None
            parts = [_host(self._const(n)) for n in node.inputs[1:5]]
            if any(p is None or p.dtype != np.float32 or p.shape != (channels,) for p in parts):
                return None
            gamma, beta, mean, var = (p.astype(np.float64) for p in parts)
            s = gamma / np.sqrt(var + float(node.attr("epsilon", 1e-5)))
            return s, beta - mean * s
        c = self._const(node.inputs[1] if node.inputs[0] == x else node.inputs[0])
        vec = _channel_vector(c, channels, rank)
        if vec is None:
            return None
        if node.op_type == "Mul":
            return vec, np.zeros(channels)
        return np.ones(channels), vec

    def _clone(self, node: OnnxNode, inputs: list[str], outputs: list[str], out_types: list) -> OnnxNode:
        new = copy.copy(node)
        new.inputs = list(inputs)
        new.outputs = list(outputs)
        new.uses = [n for n in inputs if n]
        new.in_types = list(node.in_types) + [None] * (len(inputs) - len(node.in_types))
        new.out_types = list(out_types)
        new.scratch = {}
        return new

    # -- the folds ----------------------------------------------------------------------------------------------------
    def _into_conv(self, conv: OnnxNode, node: OnnxNode, x: str) -> OnnxNode | None:
        if len(conv.inputs) < 2 or conv.in_types[0] != _FLOAT:
            return None
        w = _host(self._const(conv.inputs[1]))
        if w is None or w.dtype != np.float32 or w.ndim < 3:
            return None
        bias_name = conv.inputs[2] if len(conv.inputs) > 2 else ""
        if bias_name and bias_name not in self.values:
            return None
        k = w.shape[0]
        b = _host(self._const(bias_name)) if bias_name else np.zeros(k, np.float32)
        if b is None or b.dtype != np.float32 or b.size != k:
            return None
        ss = self._scale_shift(node, x, k, w.ndim)
        if ss is None:
            return None
        s, t = ss
        w2 = w * s.astype(np.float32).reshape((k,) + (1,) * (w.ndim - 1))  # float32, as a run would multiply
        b2 = (b.reshape(k).astype(np.float64) * s + t).astype(np.float32)
        wn, bn = self._new_name(f"{conv.inputs[1]}:folded"), self._new_name(f"{bias_name or conv.name}:folded_bias")
        self.values[wn], self.values[bn] = w2, b2
        return self._clone(conv, [conv.inputs[0], wn, bn], node.outputs[:1], node.out_types[:1])

    def _into_bn(self, bn: OnnxNode, node: OnnxNode, x: str) -> OnnxNode | None:
        rank = self.ranks.get(bn.inputs[0])
        if rank is None or len(bn.inputs) < 5 or any(n not in self.values for n in bn.inputs[1:5]):
            return None
        gamma, beta = (_host(self._const(n)) for n in bn.inputs[1:3])
        if gamma is None or beta is None or gamma.dtype != np.float32 or gamma.ndim != 1 or beta.shape != gamma.shape:
            return None
        ss = self._scale_shift(node, x, gamma.shape[0], rank)
        if ss is None:
            return None
        s, t = ss
        g2 = (gamma.astype(np.float64) * s).astype(np.float32)
        b2 = (beta.astype(np.float64) * s + t).astype(np.float32)
        gn, bn_ = self._new_name(f"{bn.inputs[1]}:folded"), self._new_name(f"{bn.inputs[2]}:folded")
        self.values[gn], self.values[bn_] = g2, b2
        inputs = [bn.inputs[0], gn, bn_] + list(bn.inputs[3:])
        return self._clone(bn, inputs, node.outputs[:1], node.out_types[:1])


# -- GELU: the erf and tanh forms exporters write, as one node -------------------------------------------------------

_SQRT2 = 1.4142135623730951
_SQRT2_PI = 0.7978845608028654  # sqrt(2 / pi)
_TANH_A = 0.044715


def _scalar(v: Any) -> float | None:
    """The value of a float constant holding one number, else None."""
    a = _host(v)
    if a is None or a.dtype.kind != "f" or a.size != 1:
        return None
    return float(a.reshape(-1)[0])


class _Dataflow:
    """Who computes and who reads each value of a node list, for the fusions below."""

    def __init__(self, nodes: list[OnnxNode], outputs: list[str]):
        self.uses: dict[str, list[OnnxNode]] = {}
        self.producer: dict[str, OnnxNode] = {}
        for node in nodes:
            for n in node.uses:
                self.uses.setdefault(n, []).append(node)
            for o in node.outputs:
                if o:
                    self.producer[o] = node
        self.kept = set(outputs)

    def private(self, name: str) -> bool:
        """`name` is read by one node and is not a graph output."""
        return len(self.uses.get(name, [])) == 1 and name not in self.kept

    def sole(self, name: str, ops: tuple) -> OnnxNode | None:
        """The one node reading `name` when it is one of the default domain's `ops` and `name` is private."""
        if not self.private(name):
            return None
        reader = self.uses[name][0]
        return reader if reader.op_type in ops and not reader.domain else None


def _splice(nodes: list[OnnxNode], replaced: dict[int, OnnxNode], dropped: set[int]) -> list[OnnxNode]:
    """`nodes` with each replaced node swapped for its fused node and the dropped ones left out."""
    if not replaced:
        return nodes
    return [replaced.get(id(n), n) for n in nodes if id(n) not in dropped]


def _fuse_gelu(nodes: list[OnnxNode], values: dict, outputs: list[str]) -> list[OnnxNode]:
    """Replace GELU spelled out as exporters write it with one Gelu node: one kernel instead of five (erf) or nine
    (tanh), and no temporaries. Forms: x * 0.5 * (1 + erf(x / sqrt(2))) (Div or Mul by the constant), and
    x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) with x^3 as Pow(x, 3) or products of x (PyTorch's
    gelu(approximate='tanh'), GPT-2's gelu_new); the last two products in either order, operands in either order.
    Every intermediate must be read by the pattern alone and not be a graph output. The float32 result differs from
    the rounded steps by a few ulp."""
    flow = _Dataflow(nodes, outputs)
    producer, private = flow.producer, flow.private

    def made(name: str | None, op: str) -> OnnxNode | None:
        """The `op` node computing `name` when `name` is read once and not a graph output."""
        node = producer.get(name) if name is not None else None
        if node is None or node.op_type != op or len(node.inputs) != 2 or not private(name):
            return None
        return node

    def other(node: OnnxNode, name: str) -> str | None:
        """The input of a two-input node that is not `name`."""
        if len(node.inputs) != 2 or name not in node.inputs:
            return None
        return node.inputs[1] if node.inputs[0] == name else node.inputs[0]

    def near(name: str | None, want: float) -> bool:
        v = _scalar(values.get(name)) if name in values else None
        return v is not None and abs(v - want) <= 1e-6 * abs(want)

    def scaled(name: str, factor: float) -> tuple[str, OnnxNode] | None:
        """(y, the node) when `name` is y * factor (either order) or y / (1 / factor)."""
        node = producer.get(name)
        if node is None or len(node.inputs) != 2 or not private(name):
            return None
        a, b = node.inputs
        if node.op_type == "Div":
            return (a, node) if near(b, 1 / factor) else None
        if node.op_type == "Mul":
            return (a, node) if near(b, factor) else ((b, node) if near(a, factor) else None)
        return None

    def erf_head(erf: OnnxNode) -> tuple[str, list] | None:
        """x and the nodes of x / sqrt(2) feeding `erf`."""
        found = scaled(erf.inputs[0], 1 / _SQRT2)
        return None if found is None else (found[0], [found[1]])

    def cube_of(name: str) -> tuple[str, list] | None:
        """x and the nodes of x^3 = Pow(x, 3), x * (x * x) or (x * x) * x at `name`."""
        node = producer.get(name)
        if node is None or len(node.inputs) != 2 or not private(name):
            return None
        a, b = node.inputs
        if node.op_type == "Pow":
            return (a, [node]) if near(b, 3.0) else None
        if node.op_type != "Mul":
            return None
        for x, sq in ((a, b), (b, a)):
            square = made(sq, "Mul")
            if square is not None and square.inputs[0] == square.inputs[1] == x:
                return x, [node, square]
        return None

    def tanh_head(tanh: OnnxNode) -> tuple[str, list] | None:
        """x and the nodes of sqrt(2/pi) * (x + 0.044715 * x^3) feeding `tanh`."""
        found = scaled(tanh.inputs[0], _SQRT2_PI)
        if found is None:
            return None
        inner, scale = found
        plus = made(inner, "Add")
        if plus is None:
            return None
        for x, term in (tuple(plus.inputs), tuple(plus.inputs)[::-1]):
            found = scaled(term, _TANH_A)
            cube = cube_of(found[0]) if found is not None else None
            if cube is not None and cube[0] == x:
                return x, [scale, plus, found[1]] + cube[1]
        return None

    heads = {"Erf": (erf_head, "none"), "Tanh": (tanh_head, "tanh")}
    replaced: dict[int, OnnxNode] = {}
    dropped: set[int] = set()
    for core in nodes:
        head = heads.get(core.op_type)
        if head is None or len(core.inputs) != 1 or core.in_types[0] != _FLOAT:
            continue
        found = head[0](core)
        if found is None:
            continue
        x, group = found
        plus = flow.sole(core.outputs[0], ("Add",))
        if plus is None or not near(other(plus, core.outputs[0]), 1.0):
            continue
        times = flow.sole(plus.outputs[0], ("Mul",))
        if times is None:
            continue
        partner = other(times, plus.outputs[0])
        group += [core, plus, times]
        if partner == x:  # (x * (1 + f)) * 0.5
            half = flow.sole(times.outputs[0], ("Mul",))
            if half is None or not near(other(half, times.outputs[0]), 0.5):
                continue
            group.append(half)
            last = half
        else:  # (x * 0.5) * (1 + f)
            half = made(partner, "Mul")
            if half is None or other(half, x) is None or not near(other(half, x), 0.5):
                continue
            group.append(half)
            last = times
        if any(id(n) in dropped or id(n) in replaced for n in group):
            continue
        gelu = copy.copy(last)
        gelu.op_type = "Gelu"
        gelu.domain = ""
        gelu.name = f"{last.name}/gelu"
        gelu.inputs, gelu.uses = [x], [x]
        gelu.in_types = [core.in_types[0]]
        gelu.attrs = OnnxAttributes(approximate=head[1])
        gelu.entry = lookup("", "Gelu", max(last.opset, 20))
        gelu.function = None
        gelu.scratch = {}
        if gelu.entry is None:
            continue
        replaced[id(last)] = gelu
        dropped.update(id(n) for n in group if n is not last)
    return _splice(nodes, replaced, dropped)


# -- Conv + residual Add + Relu, as one FusedConv node -----------------------------------------------------------

def _fuse_scaled_matmul(nodes: list[OnnxNode], values: dict, outputs: list[str]) -> list[OnnxNode]:
    """Replace MatMul -> Div (or Mul) by a constant float scalar, the MatMul's output read by that node alone, with
    one FusedMatMul node (onnxruntime's contrib operator) computing alpha * A @ B in the product's own pass: alpha = 1
    / c for a division (a few ulp from dividing each element, as onnxruntime's own fusion), c for a product."""
    flow = _Dataflow(nodes, outputs)
    entry = lookup("com.microsoft", "FusedMatMul", 1)
    replaced: dict[int, OnnxNode] = {}
    dropped: set[int] = set()
    for mm in nodes:
        if mm.op_type != "MatMul" or mm.domain or len(mm.inputs) != 2 or mm.in_types[0] != _FLOAT:
            continue
        scale = flow.sole(mm.outputs[0], ("Div", "Mul"))
        if scale is None or len(scale.inputs) != 2 or scale.inputs[0] == scale.inputs[1]:
            continue
        if scale.op_type == "Div" and scale.inputs[0] != mm.outputs[0]:
            continue  # c / (A @ B) is not a scale
        other = scale.inputs[1] if scale.inputs[0] == mm.outputs[0] else scale.inputs[0]
        c = _host(values.get(other)) if other in values else None
        if c is None or c.dtype != np.float32 or c.size != 1 or c.ndim > 1:  # rank 0 or (1,): no broadcast
            continue
        c = float(c.reshape(-1)[0])
        alpha = 1.0 / c if scale.op_type == "Div" and c != 0.0 else c
        if c == 0.0 or not np.isfinite(alpha):
            continue
        fused = copy.copy(mm)
        fused.op_type, fused.domain, fused.opset = "FusedMatMul", "com.microsoft", 1
        fused.name = f"{mm.name}/scaled"
        fused.outputs, fused.out_types = list(scale.outputs), list(scale.out_types)
        fused.attrs = OnnxAttributes(mm.attrs)
        fused.attrs["alpha"] = alpha
        fused.entry, fused.function, fused.scratch = entry, None, {}
        replaced[id(scale)] = fused
        dropped.add(id(mm))
    return _splice(nodes, replaced, dropped)


def _fuse_conv(nodes: list[OnnxNode], values: dict, outputs: list[str]) -> list[OnnxNode]:
    """Replace each 2-D float Conv with constant weights by a FusedConv node (onnxruntime's com.microsoft operator:
    Relu(Conv(X, W, B) + Z)) that also takes the Relu, or the Add / two-input Sum (ResNet's residual) and a Relu
    after it, reading its output alone (see _conv_group), placed where the last replaced node was. It runs as one
    conv2d_fused kernel (oneDNN's sum and ReLU post-ops on the CPU); where Z's shape turns out not to be the
    convolution's, it runs as the separate steps."""
    flow = _Dataflow(nodes, outputs)
    entry = lookup("com.microsoft", "FusedConv", 1)
    replaced: dict[int, OnnxNode] = {}
    dropped: set[int] = set()
    for conv in nodes:
        if conv.op_type != "Conv" or conv.domain or len(conv.inputs) < 2 or conv.in_types[0] != _FLOAT:
            continue
        w = values.get(conv.inputs[1])
        if not isinstance(w, (Tensor, np.ndarray)) or len(w.shape) != 4:  # 2-D convolutions, constant weights
            continue
        group, z = _conv_group(conv, flow, values)
        if any(id(n) in dropped or id(n) in replaced for n in group):  # the Add went to the other convolution
            group, z = [conv], None
        last = group[-1]
        fused = copy.copy(conv)
        fused.op_type, fused.domain, fused.opset = "FusedConv", "com.microsoft", 1
        fused.name = f"{conv.name}/fused"
        bias = conv.inputs[2] if len(conv.inputs) > 2 else ""
        fused.inputs = [conv.inputs[0], conv.inputs[1], bias] + ([z] if z is not None else [])
        fused.uses = [n for n in fused.inputs if n]
        z_type = [group[1].in_types[group[1].inputs.index(z)]] if z is not None else []
        fused.in_types = (list(conv.in_types) + [None] * 3)[:3] + z_type
        fused.outputs, fused.out_types = list(last.outputs), list(last.out_types)
        fused.attrs = OnnxAttributes(conv.attrs)
        fused.attrs["activation"] = "Relu" if last.op_type == "Relu" else ""
        fused.entry, fused.function, fused.scratch = entry, None, {}
        replaced[id(last)] = fused
        dropped.update(id(n) for n in group if n is not last)
    return _splice(nodes, replaced, dropped)


def _conv_group(conv: OnnxNode, flow: _Dataflow, values: dict) -> tuple[list[OnnxNode], str | None]:
    """(the nodes one FusedConv replaces, conv first, and its residual Z or None): the Relu, or the Add / Sum with Z
    and the Relu after it, that alone read the convolution's output; the convolution alone (a FusedConv with
    nothing fused, the form singa_onnx.layout handles) where no such node follows."""
    y = conv.outputs[0]
    nxt = flow.sole(y, ("Relu", "Add", "Sum"))
    if nxt is None:
        return [conv], None
    if nxt.op_type == "Relu":
        return [conv, nxt], None
    if len(nxt.inputs) != 2 or nxt.inputs[0] == nxt.inputs[1]:
        return [conv], None
    z = nxt.inputs[1] if nxt.inputs[0] == y else nxt.inputs[0]
    if z in values:  # a constant: a bias the folder left (not per channel), broadcast, not a residual
        return [conv], None
    relu = flow.sole(nxt.outputs[0], ("Relu",))
    return ([conv, nxt, relu] if relu is not None else [conv, nxt]), z
