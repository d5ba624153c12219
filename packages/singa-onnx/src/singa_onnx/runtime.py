"""Turning an ONNX graph into a runnable program, and running it.

`build_program(model)` validates the model, infers value types, checks every node (subgraphs included) against the
operator table and collects *all* unsupported nodes before failing. A `Program` is the list of nodes in ONNX order with
their handlers; `execute` runs it on a `Runtime` (device, training flag, parameter tensors), keeping each intermediate
value only until its last use.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, helper

from singa import autograd, ops
from singa import dtypes as sdt
from singa.backend import Device
from singa.tensor import Tensor
from singa_onnx import onnx_types as ot
from singa_onnx.checker import to_array
from singa_onnx.errors import InvalidInputError, InvalidModelError, NodeError, SONNXError, UnsupportedOperatorError
from singa_onnx.registry import OpEntry, lookup


class OnnxAttributes(dict):
    """A node's attributes as plain Python values (SINGA's name for this mapping)."""

    @classmethod
    def from_onnx(cls, args: Iterable[AttributeProto]) -> OnnxAttributes:
        d = cls()
        for a in args:
            d[a.name] = _attr_value(a)
        return d


def _attr_value(a: AttributeProto) -> Any:
    if a.type == AttributeProto.TENSOR:
        return to_array(a.t)
    if a.type == AttributeProto.TENSORS:
        return [to_array(t) for t in a.tensors]
    if a.type == AttributeProto.GRAPH:
        return a.g
    if a.type == AttributeProto.GRAPHS:
        return list(a.graphs)
    if a.type == AttributeProto.SPARSE_TENSOR:
        return _sparse_to_dense(a.sparse_tensor)
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8")
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [s.decode("utf-8") for s in v]
    return v


def _sparse_to_dense(sp: onnx.SparseTensorProto) -> np.ndarray:
    values = to_array(sp.values)
    idx = to_array(sp.indices)
    dims = tuple(sp.dims)
    name = sp.values.name
    nnz = values.size
    if values.ndim != 1 or any(d < 0 for d in dims):
        raise InvalidModelError(f"sparse tensor {name!r}: values of shape {values.shape} (must be 1-D) for dims "
                                f"{list(dims)}")
    if idx.dtype.kind not in "iu" or idx.shape not in ((nnz,), (nnz, len(dims))):
        raise InvalidModelError(f"sparse tensor {name!r}: indices of shape {idx.shape} and type {idx.dtype} for "
                                f"{nnz} values of dims {list(dims)} (expected int64 ({nnz},) or ({nnz}, {len(dims)}))")
    bound = np.asarray([math.prod(dims)]) if idx.ndim == 1 else np.asarray(dims)
    if idx.size and (idx.min() < 0 or np.any(idx.max(axis=0) >= bound)):
        raise InvalidModelError(f"sparse tensor {name!r}: an index lies outside dims {list(dims)}")
    dense = np.zeros(dims, dtype=values.dtype)
    if idx.ndim == 1:  # linear positions
        dense.reshape(-1)[idx] = values
    else:
        dense[tuple(idx.T)] = values
    return dense


class OnnxNode:
    """One ONNX node, ready to run: attributes decoded, value types attached, handler looked up, subgraphs built."""

    def __init__(self, proto: onnx.NodeProto, index: int, importer: Importer):
        self.proto = proto
        self.op_type = proto.op_type
        self.domain = proto.domain if proto.domain not in ("", "ai.onnx") else ""
        self.name = proto.name or f"{proto.op_type}_{index}"
        self.inputs = list(proto.input)
        self.outputs = list(proto.output)
        self.opset = importer.opset(self.domain)
        self.attrs = OnnxAttributes.from_onnx(proto.attribute)
        self.in_types = [importer.types.get(n) if n else None for n in self.inputs]
        self.out_types = [importer.types.get(n) if n else None for n in self.outputs]
        self.function: tuple | None = None
        local = importer.functions.get((self.domain, self.op_type))
        self.entry = None if local is not None else lookup(self.domain, self.op_type, self.opset)
        if self.entry is None:
            fp = local if local is not None else _schema_function(proto, self.domain, self.opset, self.in_types)
            if fp is not None:
                self.function = _function_program(fp, self, importer)
                self.entry = _FUNCTION_ENTRY
        self.rt: Runtime | None = None  # set while the node runs
        self.subgraphs: dict[str, Any] = {}
        for k, v in list(self.attrs.items()):
            if isinstance(v, GraphProto):
                self.subgraphs[k] = Program(v, importer, self.name)
            elif isinstance(v, list) and v and isinstance(v[0], GraphProto):
                self.subgraphs[k] = [Program(g, importer, self.name) for g in v]
        self.uses = [n for n in self.inputs if n]
        for sub in self.subgraphs.values():
            for p in sub if isinstance(sub, list) else [sub]:
                self.uses.extend(p.free)
        self.scratch: dict = {}  # per-node cache a handler may use (e.g. device copies of constants)

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    getattr = attr  # SINGA's OnnxNode spelling

    def __repr__(self) -> str:
        return f"OnnxNode({self.name!r}, {self.op_type}, opset {self.opset})"


class Importer:
    """Prepare-time context: opsets, value types, local functions and the list of problems found so far."""

    def __init__(self, model: ModelProto | None, parent: Importer | None = None, opsets: dict | None = None):
        self.model = model
        self.types: dict[str, int] = {}
        self.ranks: dict[str, int] = {}  # declared or inferred rank of a value, where known
        if parent is not None:
            self.problems = parent.problems
            self.functions = parent.functions
            self.opsets = dict(opsets or parent.opsets)
            return
        self.opsets = {("" if o.domain in ("", "ai.onnx") else o.domain): o.version for o in model.opset_import}
        self.problems: list[tuple[str, str, str]] = []
        self.functions = {("" if f.domain in ("", "ai.onnx") else f.domain, f.name): f for f in model.functions}
        self._collect_types(model)

    def opset(self, domain: str) -> int:
        v = self.opsets.get(domain)
        if v is None:
            v = self.opsets.get("", onnx.defs.onnx_opset_version()) if domain == "" else 1
        return v

    def _collect_types(self, model: ModelProto) -> None:
        try:
            inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
        except Exception:  # noqa: BLE001 - inference is best effort: declared types remain
            inferred = model
        for m in (inferred, model):  # declared types win over inferred ones
            self._graph_types(m.graph)

    def graph_types(self, g: GraphProto) -> None:
        self._graph_types(g)

    def _graph_types(self, g: GraphProto) -> None:
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            t = _elem_type(vi.type)
            if t:
                self.types[vi.name] = t
            if vi.type.WhichOneof("value") == "tensor_type" and vi.type.tensor_type.HasField("shape"):
                self.ranks[vi.name] = len(vi.type.tensor_type.shape.dim)
        for init in g.initializer:
            self.types[init.name] = init.data_type
        for node in g.node:
            if node.op_type == "Constant" and node.output:
                for a in node.attribute:
                    if a.type == AttributeProto.TENSOR:
                        self.types[node.output[0]] = a.t.data_type
            for a in node.attribute:
                if a.type == AttributeProto.GRAPH:
                    self._graph_types(a.g)
                elif a.type == AttributeProto.GRAPHS:
                    for sub in a.graphs:
                        self._graph_types(sub)


def _schema_function(proto: onnx.NodeProto, domain: str, opset: int, in_types: list) -> onnx.FunctionProto | None:
    """The function body ONNX defines for an operator (plain or built for these input types), if any."""
    try:
        schema = onnx.defs.get_schema(proto.op_type, opset, domain)
    except Exception:  # noqa: BLE001 - no schema: not a standard operator
        return None
    versions = [v for v in schema.function_opset_versions if v <= opset]
    if versions:
        fp = onnx.FunctionProto()
        fp.ParseFromString(schema.get_function_with_opset_version(max(versions)))
        return _with_schema_defaults(fp, schema)
    versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if not versions or any(t is None for n, t in zip(proto.input, in_types) if n):
        return None
    tps = [helper.make_tensor_type_proto(t if n else onnx.TensorProto.UNDEFINED, None).SerializeToString()
           for n, t in zip(proto.input, in_types)]
    try:
        raw = schema.get_context_dependent_function_with_opset_version(max(versions), proto.SerializeToString(),
                                                                       tps)
    except Exception:  # noqa: BLE001 - the builder rejects inputs it cannot expand
        return None
    fp = onnx.FunctionProto()
    fp.ParseFromString(raw)
    if not fp.node:
        return None  # the builder declined these inputs
    return _with_schema_defaults(fp, schema)


def _with_schema_defaults(fp: onnx.FunctionProto, schema: onnx.defs.OpSchema) -> onnx.FunctionProto:
    """Attribute defaults of the operator's schema as the function's own defaults."""
    have = {a.name for a in fp.attribute_proto}
    for name, attr in schema.attributes.items():
        if name not in have and attr.default_value is not None and attr.default_value.type:
            d = onnx.AttributeProto()
            d.CopyFrom(attr.default_value)
            d.name = name
            fp.attribute_proto.append(d)
    return fp


def _function_program(fp: onnx.FunctionProto, node: OnnxNode, importer: Importer) -> tuple:
    """(program, formal inputs, formal outputs) of a function call, attribute references resolved."""
    defaults = {a.name: a for a in fp.attribute_proto}
    given = {a.name: a for a in node.proto.attribute}
    nodes = []
    for n in fp.node:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        del m.attribute[:]
        for a in n.attribute:
            if a.ref_attr_name:
                src = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                if src is None:
                    continue
                b = onnx.AttributeProto()
                b.CopyFrom(src)
                b.name = a.name
                m.attribute.append(b)
            else:
                m.attribute.append(a)
        nodes.append(m)
    opsets = dict(importer.opsets)
    for o in fp.opset_import:
        opsets["" if o.domain in ("", "ai.onnx") else o.domain] = o.version
    inputs = [helper.make_tensor_value_info(name, t or onnx.TensorProto.UNDEFINED, None)
              for name, t in zip(fp.input, node.in_types + [None] * len(fp.input))]
    graph = helper.make_graph(nodes, f"{node.name}:{fp.name}", inputs,
                              [helper.make_empty_tensor_value_info(o) for o in fp.output])
    child = Importer(None, importer, opsets)
    try:
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
        m.ir_version = onnx.IR_VERSION
        child.graph_types(onnx.shape_inference.infer_shapes(m, check_type=False, strict_mode=False).graph)
    except Exception:  # noqa: BLE001 - inference is best effort
        child.graph_types(graph)
    prog = Program(graph, child, node.name)
    return prog, list(fp.input), list(fp.output)


def _call_function(node: OnnxNode, inputs: list, opset: int) -> tuple:
    prog, formal_in, formal_out = node.function
    feeds = dict(zip(formal_in, list(inputs) + [None] * len(formal_in)))
    vals = execute(prog, node.rt, feeds)
    return tuple(vals.get(o) for o in formal_out)


_FUNCTION_ENTRY = OpEntry("<function>", "", _call_function, 1, None, (), (), None)


def _elem_type(tp: onnx.TypeProto) -> int:
    """The element type of a tensor type, or of the tensors inside a sequence / optional type (0 if unknown)."""
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return tp.tensor_type.elem_type
    if kind == "sequence_type":
        return _elem_type(tp.sequence_type.elem_type)
    if kind == "optional_type":
        return _elem_type(tp.optional_type.elem_type)
    if kind == "sparse_tensor_type":
        return tp.sparse_tensor_type.elem_type
    return 0


class Program:
    """A graph ready to run: its nodes in order, its inputs, outputs and initializers."""

    def __init__(self, graph: GraphProto, importer: Importer, owner: str = ""):
        self.graph = graph
        self.name = graph.name
        self.initializers: dict[str, np.ndarray] = {}
        for t in graph.initializer:
            self.initializers[t.name] = to_array(t)
        for sp in graph.sparse_initializer:
            self.initializers[sp.values.name] = _sparse_to_dense(sp)
        self.inputs = [vi.name for vi in graph.input if vi.name not in self.initializers]
        self.all_inputs = [vi.name for vi in graph.input]
        self.outputs = [vi.name for vi in graph.output]
        self.types = {n: importer.types.get(n) for n in self.all_inputs + self.outputs}
        self.nodes = [OnnxNode(n, i, importer) for i, n in enumerate(graph.node)]
        for node in self.nodes:
            node.program = self
            self._check(node, importer)
        produced = set(self.all_inputs) | set(self.initializers)
        free: list[str] = []
        for node in self.nodes:
            for n in node.uses:
                if n not in produced and n not in free:
                    free.append(n)
            produced.update(o for o in node.outputs if o)
        free.extend(n for n in self.outputs if n not in produced and n not in free)
        self.free = free  # names this graph reads from enclosing graphs
        self._plan_lifetimes()

    @staticmethod
    def _check(node: OnnxNode, importer: Importer) -> None:
        if node.entry is None:
            from singa_onnx.registry import known

            have = known(node.domain, node.op_type)
            if have:
                ranges = ", ".join(f"{e.since}-{e.until or 'newest'}" for e in have)
                why = f"opset {node.opset} is not implemented (implemented: {ranges})"
            elif node.domain:
                why = f"operator {node.domain}.{node.op_type} is not implemented"
            else:
                why = "operator is not implemented"
            importer.problems.append((node.name, node.op_type, why))
            return
        for n, t in list(zip(node.inputs, node.in_types)) + list(zip(node.outputs, node.out_types)):
            if n and not ot.supported(t):
                why = f"value {n!r} has type {ot.name(t)}, which SINGA cannot hold"
                importer.problems.append((node.name, node.op_type, why))
                return

    def _plan_lifetimes(self) -> None:
        last: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            for n in node.uses:
                last[n] = i
        self.release: list[list[str]] = [[] for _ in self.nodes]
        keep = set(self.outputs)
        for n, i in last.items():
            if n not in keep:
                self.release[i].append(n)


def build_program(model: ModelProto) -> Program:
    """The model's main graph as a Program; raises UnsupportedOperatorError listing every problem."""
    importer = Importer(model)
    prog = Program(model.graph, importer)
    for vi in model.graph.input:
        t = importer.types.get(vi.name)
        if not ot.supported(t):
            importer.problems.append((vi.name, "graph input", f"type {ot.name(t)} cannot be held by SINGA"))
    if importer.problems:
        raise UnsupportedOperatorError(importer.problems)
    prog.importer = importer
    return prog


class Runtime:
    """What a run needs besides the values: the device, whether the model is being trained, parameter tensors."""

    def __init__(self, device: Device, params: dict[str, Tensor] | None = None, training: bool = False):
        self.device = device
        self.params = params if params is not None else {}
        self.training = training  # dropout and batch statistics active (imported models being trained)
        # values kept in channel blocks of `block` (singa_onnx.layout; the inference plan sets them for a run)
        self.blocked: frozenset[str] = frozenset()
        self.block = 0

    @property
    def recording(self) -> bool:
        """Whether autograd records (gradients wanted)."""
        return autograd.training


class _Scope:
    __slots__ = ("vals", "parent")

    def __init__(self, vals: dict, parent: _Scope | None):
        self.vals = vals
        self.parent = parent

    def get(self, name: str) -> Any:
        s = self
        while s is not None:
            if name in s.vals:
                return s.vals[name]
            s = s.parent
        raise KeyError(name)


def execute(prog: Program, rt: Runtime, feeds: dict[str, Any], parent: _Scope | None = None, stop: int | None = None,
            keep: Iterable[str] = (), observe: dict | None = None) -> dict[str, Any]:
    """Run nodes[:stop] of prog; returns the values of its outputs (or of everything in `keep`) by name.
    `observe`, if given, receives {name: (shape, dtype)} of every Tensor fed or returned by a node."""
    vals: dict[str, Any] = {}
    for name, arr in prog.initializers.items():
        p = rt.params.get(name) if parent is None else None
        vals[name] = p if p is not None else arr
    vals.update(feeds)
    if observe is not None:
        observe.update((n, (v.shape, v.dtype)) for n, v in feeds.items() if isinstance(v, Tensor))
    scope = _Scope(vals, parent)
    keep = set(keep)
    nodes = prog.nodes if stop is None else prog.nodes[:stop]
    for i, node in enumerate(nodes):
        args = []
        for n in node.inputs:
            if not n:
                args.append(None)
                continue
            try:
                args.append(scope.get(n))
            except KeyError:
                raise NodeError(f"node {node.name!r} ({node.op_type}): input {n!r} has no value (not a graph input, "
                                "initializer or earlier output)") from None
        outs = run_node(node, args, rt, scope)
        for n, v in zip(node.outputs, outs):
            if n:
                vals[n] = v
                if observe is not None and isinstance(v, Tensor):
                    observe[n] = (v.shape, v.dtype)
        if stop is None:
            for n in prog.release[i]:
                if n not in keep:
                    vals.pop(n, None)
    return vals


def run_node(node: OnnxNode, args: list, rt: Runtime, scope: _Scope | None = None) -> tuple:
    entry = node.entry
    prev = node.rt, getattr(node, "scope", None)
    node.rt, node.scope = rt, scope
    try:
        if entry.host is not None and args and all(a is None or isinstance(a, np.ndarray) for a in args) and any(
                a is not None for a in args):
            out = entry.host(node, args, node.opset)
        else:
            out = entry.handler(node, args, node.opset)
    except (NodeError, UnsupportedOperatorError):
        raise
    except Exception as exc:
        shapes = ", ".join(_describe(a) for a in args)
        raise NodeError(f"node {node.name!r} ({node.op_type}, opset {node.opset}) failed on inputs [{shapes}]: "
                        f"{type(exc).__name__}: {exc}") from exc
    finally:
        node.rt, node.scope = prev
    if not isinstance(out, tuple):
        out = (out,)
    # numpy reductions and indexing return numpy scalars for 0-d results: keep host values arrays
    return tuple(np.asarray(o) if isinstance(o, np.generic) else o for o in out)


def _describe(a: Any) -> str:
    if isinstance(a, Tensor):
        from singa import dtypes

        return f"Tensor{a.shape} {dtypes.name(a.dtype)}"
    if isinstance(a, np.ndarray):
        return f"array{a.shape} {a.dtype}"
    if a is None:
        return "None"
    if isinstance(a, list):
        return f"sequence of {len(a)}"
    return type(a).__name__


def to_numpy_output(v: Any, t: int | None) -> Any:
    """A value as numpy in ONNX type t (sequences element-wise)."""
    if isinstance(v, list):
        return [to_numpy_output(e, t) for e in v]
    if v is None:
        return None
    arr = ops.to_numpy(v) if isinstance(v, Tensor) else np.asarray(v)
    return ot.wrap_host(arr, t) if t is not None else arr


def _input_code(arr: np.ndarray, t: int | None, dev: Device) -> int | None:
    """The SINGA dtype an input array of ONNX type t becomes on dev (None: strings, which stay on the host)."""
    if arr.dtype == object or arr.dtype.kind in "SU" or t == ot.F.STRING:
        return None
    if t and t in ot.INT_TYPES | ot.FLOAT_TYPES | {ot.F.BOOL}:
        return ot.storage(t, dev)
    return ot.storage(ot.from_np(arr.dtype), dev)


def _declared_shape(tp: onnx.TypeProto) -> tuple | None:
    """A tensor input's declared shape: an int per static dimension, the symbol's name per symbolic one, None per
    unnamed one; None when no shape is declared (or the input is not a tensor)."""
    if tp.WhichOneof("value") != "tensor_type" or not tp.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tp.tensor_type.shape.dim)


def _shape_text(decl: tuple) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in decl) + ("," if len(decl) == 1 else "") + ")"


_KIND_RANK = {"bool": 0, "int": 1, "float": 2}


def _kind(t: int | None) -> str | None:
    """'bool', 'int', 'float' or 'string' for an ONNX element type; None for others (complex...)."""
    if t == ot.F.STRING:
        return "string"
    if t == ot.F.BOOL:
        return "bool"
    if t in ot.INT_TYPES:
        return "int"
    if t in ot.FLOAT_TYPES:
        return "float"
    return None


def _check_kind(name: str, given: np.dtype, declared: int | None) -> None:
    want = _kind(declared)
    if want is None:
        return  # undeclared, complex and other types: left to the operators
    try:
        have = "string" if given.kind in "OSU" else _kind(ot.from_np(given))
    except Exception:  # noqa: BLE001 - a dtype ONNX has no type for
        have = None
    if have == want or (have in _KIND_RANK and want in _KIND_RANK and _KIND_RANK[have] <= _KIND_RANK[want]):
        return
    raise InvalidInputError(f"input {name!r}: {given} data for a {ot.name(declared)} input (convert it first: values "
                            "of another kind would be truncated)")


# -- the model-level wrapper shared by SingaRep and SONNXModel --------------------------------------------------------


class ImportedGraph:
    """A validated, checked, built model: its program, and which initializers are parameters, states or constants."""

    def __init__(self, model: Any, base_dir: str | None = None, check: bool = True):
        from singa_onnx import checker

        proto, base_dir = checker.load_model(model, base_dir)
        proto = checker.load_external(proto, base_dir)
        if check:
            checker.check(proto)
        self.proto = proto
        try:
            self.program = build_program(proto)
        except SONNXError:
            raise
        except Exception as exc:  # a malformed model onnx.checker let through: report it as the model's fault
            raise InvalidModelError(f"cannot build the ONNX model: {type(exc).__name__}: {exc}") from exc
        self.types = self.program.importer.types
        self.kinds = self._classify()
        self.shapes = {vi.name: _declared_shape(vi.type) for vi in proto.graph.input}

    def _classify(self) -> dict[str, str]:
        """'param' for float initializers read as data by some node, 'state' for running statistics, else 'const'."""
        prog = self.program
        kinds = dict.fromkeys(prog.initializers, "const")
        for node in prog.nodes:
            for i, n in enumerate(node.inputs):
                if n not in kinds or node.entry is None:
                    continue
                arr = prog.initializers[n]
                if arr.dtype.kind != "f":
                    continue
                if i in node.entry.states:
                    kinds[n] = "state"
                elif i not in node.entry.static and kinds[n] == "const":
                    kinds[n] = "param"
        return kinds

    @property
    def inputs(self) -> list[str]:
        return self.program.inputs

    @property
    def outputs(self) -> list[str]:
        return self.program.outputs

    def feed(self, values: Any, dev: Device) -> tuple[dict[str, Any], bool]:
        """{input name: value} from a list/tuple/dict/single value; True when any input was a singa Tensor."""
        feeds: dict[str, Any] = {}
        any_tensor = False
        for name, v in self.feed_items(values):
            feeds[name] = self.feed_value(name, v, dev)
            any_tensor = any_tensor or isinstance(v, Tensor)
        return feeds, any_tensor

    def feed_items(self, values: Any) -> list[tuple[str, Any]]:
        """[(input name, value)] from a list/tuple/dict/single value, checked against the graph's inputs."""
        names = self.program.inputs
        if isinstance(values, dict):
            items = list(values.items())
            unknown = [k for k, _ in items if k not in names]
            if unknown:
                raise InvalidInputError(f"unknown model input(s) {unknown}; the inputs are {names}")
        else:
            if isinstance(values, (Tensor, np.ndarray)) or np.isscalar(values):
                values = [values]
            values = list(values)
            if len(values) != len(names):
                raise InvalidInputError(f"the model takes {len(names)} input(s) {names}, got {len(values)}")
            items = list(zip(names, values))
        self.check_inputs(items)
        return items

    def check_inputs(self, items: list[tuple[str, Any]]) -> None:
        """Each input against the graph's declaration, as onnxruntime checks them: its dtype must be of the declared
        kind (bool < int < float widen, as numpy's same_kind casts; nothing narrows to another kind), each static
        dimension must match, and each symbolic dimension takes one value per run, the same in every input."""
        bound: dict[str, tuple[int, str]] = {}
        for name, v in items:
            if v is None or isinstance(v, (list, tuple)):
                continue  # an optional input left out, a sequence
            if isinstance(v, Tensor):
                shape, given = tuple(v.shape), sdt.to_numpy_dtype(v.dtype)
            else:
                arr = np.asarray(v)
                shape, given = arr.shape, arr.dtype
            _check_kind(name, given, self.types.get(name))
            decl = self.shapes.get(name)
            if decl is None:
                continue
            if len(shape) != len(decl):
                raise InvalidInputError(f"input {name!r}: shape {shape} has {len(shape)} dimension(s), the model "
                                        f"declares {_shape_text(decl)}")
            for i, (g, d) in enumerate(zip(shape, decl)):
                if isinstance(d, int) and g != d:
                    raise InvalidInputError(f"input {name!r}: shape {shape} does not match the declared "
                                            f"{_shape_text(decl)} (dimension {i} is {g}, not {d})")
                if isinstance(d, str):
                    first = bound.setdefault(d, (g, name))
                    if first[0] != g:
                        raise InvalidInputError(f"input {name!r}: shape {shape} does not match the declared "
                                                f"{_shape_text(decl)}: dimension {i} ({d!r}) is {g}, but input "
                                                f"{first[1]!r} made {d!r} {first[0]}")

    def feed_value(self, name: str, v: Any, dev: Device) -> Any:
        """One input as the program reads it: device data on `dev` in its storage type (strings stay on the host)."""
        t = self.types.get(name)
        if isinstance(v, Tensor):
            if v.device is not dev:
                raise ValueError(f"input {name!r} is on {v.device.name} but the model runs on {dev.name} "
                                 "(move it with to_device first)")
            if t in ot.INT_TYPES | {ot.F.BOOL} and v.dtype != ot.storage(t):
                v = ops.cast(v, ot.storage(t))
            return v
        if isinstance(v, list):
            return [self._to_device(np.asarray(e), t, dev) for e in v]
        if v is None:
            return None
        return self._to_device(np.asarray(v), t, dev)

    def host_input(self, name: str, arr: np.ndarray, dev: Device) -> tuple[np.ndarray, int] | None:
        """(host array converted to what the input's device tensor holds, its SINGA dtype), or None for data that
        stays on the host (strings)."""
        code = _input_code(arr, self.types.get(name), dev)
        if code is None:
            return None
        from singa_onnx.ops._common import host_array

        return host_array(arr, dev, code)

    @staticmethod
    def _to_device(arr: np.ndarray, t: int | None, dev: Device) -> Any:
        code = _input_code(arr, t, dev)
        if code is None:
            return arr  # strings stay on the host
        from singa_onnx.ops._common import host_to_tensor

        return host_to_tensor(arr, dev, code)

    def stop_index(self, last_layers: int) -> int | None:
        """How many nodes run (None: all), counting `last_layers` as SINGA's SingaRep does: -1 runs every node;
        -k with k >= 2 leaves out the last k - 2 nodes (-2 runs every node, -3 all but the last); a non-negative k
        is the index of the last node to run."""
        n = len(self.program.nodes)
        if last_layers is None or last_layers == -1:
            return None
        k = int(last_layers) if isinstance(last_layers, (int, np.integer)) and not isinstance(last_layers, bool) \
            else None
        keep = None if k is None else (n + k + 2 if k < 0 else k + 1)
        if keep is None or not 1 <= keep <= n:
            raise ValueError(f"last_layers must be -1 (every node), -k (SINGA's count: -2 runs every node, -3 all but "
                             f"the last, down to -{n + 1}: only the first node) or the index of the last node to run "
                             f"(0 to {n - 1}), got {last_layers!r}")
        return None if keep == n else keep

    def run(self, rt: Runtime, feeds: dict[str, Any], last_layers: int = -1, aux_output: Iterable[str] = (),
            all_outputs: bool = False) -> tuple[list[Any], list[str], dict[str, Any]]:
        """(outputs, their names, every kept value) of one run."""
        stop = self.stop_index(last_layers)
        aux = [aux_output] if isinstance(aux_output, str) else list(aux_output)
        prog = self.program
        if stop is None:
            names = list(prog.outputs)
        else:
            names = [o for o in prog.nodes[stop - 1].outputs if o]
        keep = set(names) | set(aux)
        vals = execute(prog, rt, feeds, stop=stop if stop is not None else None, keep=keep)
        if all_outputs:
            return [vals[n] for n in names], names, vals
        missing = [n for n in list(names) + aux if n not in vals]
        if missing:
            raise ValueError(f"no value named {missing} in the model (aux_output names must be ONNX value names)")
        return [vals[n] for n in names + aux], names + aux, vals
