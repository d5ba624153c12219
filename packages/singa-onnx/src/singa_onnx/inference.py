"""What SingaRep runs for plain inference: the folded program, and recorded kernel sequences replayed per input shape.

An `InferencePlan` is built from a prepared model and the current values of its parameter tensors when SingaRep runs
with autograd off and every tensor of its `tensor_map` frozen. It holds:

* the program after `optimize.fold` (constants folded, BatchNormalization and per-channel scale/shift folded into the
  convolutions before them);
* per input signature (the shapes and dtypes of the inputs), a `singa.graph` recording of one run: the kernel calls
  with their arguments, their temporaries placed in one planned arena. The first run with a signature runs the program
  eagerly and notes every value's shape, the second records it (also eagerly, so its results are that run's) with the
  activations between convolutions in channel blocks where the device has them (singa_onnx.layout, from those
  shapes), later ones copy the inputs into the recorded input tensors and replay the kernels: no operator dispatch,
  shape checks, autograd bookkeeping or allocation per node. Replays compute bit for bit what the recorded run
  computes.

A run that cannot be replayed (a node reads device data back to the host, e.g. a data-dependent shape; sequence or
string inputs; a graph recording of someone else's in progress) runs eagerly every time, with the same results.
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np

from singa import autograd, backend, graph, ops
from singa.backend import Device, View
from singa.tensor import Tensor
from singa_onnx.layout import blocked_values
from singa_onnx.optimize import fold
from singa_onnx.runtime import ImportedGraph, Runtime, execute

MAX_GRAPHS = 4  # recorded signatures kept per plan (least recently used dropped first)
_MAX_SEEN = 64


class _Replay:
    """One recorded run: its graph, the input tensors it reads, the values it leaves as outputs and the values it
    keeps in channel blocks."""

    __slots__ = ("graph", "inputs", "outputs", "blocked")

    def __init__(self, g: graph.Graph, inputs: list, outputs: list, blocked: frozenset):
        self.graph = g
        self.inputs = inputs  # [(View of the recorded input tensor, kind)] in signature order
        self.outputs = outputs
        self.blocked = blocked


class InferencePlan:
    def __init__(self, imported: ImportedGraph, device: Device, params: dict[str, Tensor]):
        self.imported = imported
        self.device = device
        self.params = dict(params)  # the tensors it was built from (SingaRep compares them before each run)
        self.program = fold(imported.program, device, self.params)
        self.runtime = Runtime(device, self.params, training=False)
        # The weights stay as they are while the plan is in use (SingaRep drops it when they may change, and asks for
        # refresh() after writing into them): declared constant, a backend may keep copies in the layout its library
        # prefers. `close()` (or the plan's end) ends the promise.
        self._release = weakref.finalize(self, backend.release_constant, self._constant_weights())
        self.replay = True  # False: always run eagerly (the folded program)
        self._graphs: OrderedDict = OrderedDict()  # signature -> _Replay, or None when it cannot be replayed
        self._seen: dict = {}  # signature -> the value shapes of its first (eager) run
        self._lock = threading.Lock()

    def _constant_weights(self) -> list:
        """Declare the convolution weights constant (host ones, e.g. those folding made, copied to the device once
        here); returns their buffers."""
        inits = self.program.initializers
        buffers = {}
        for node in self.program.nodes:
            if node.op_type not in ("Conv", "FusedConv") or len(node.inputs) < 2 or node.inputs[1] not in inits:
                continue
            name = node.inputs[1]
            w = inits[name]
            if isinstance(w, np.ndarray) and w.dtype == np.float32:
                w = inits[name] = ops.from_numpy(np.ascontiguousarray(w), self.device)
            if isinstance(w, Tensor):
                buffers[id(w.buffer)] = w.buffer
        backend.declare_constant(buffers.values())
        return list(buffers.values())

    def close(self) -> None:
        """The weights may change from now on: release the constant declaration (the plan must not run again)."""
        self._release()

    def valid_for(self, params: dict[str, Tensor]) -> bool:
        mine = self.params
        return len(params) == len(mine) and all(mine.get(k) is v for k, v in params.items())

    def graphs(self) -> int:
        """How many recorded runs the plan holds."""
        return sum(1 for g in self._graphs.values() if g is not None)

    def blocked(self) -> set[str]:
        """The values its recorded runs keep in channel blocks between convolutions (singa_onnx.layout)."""
        return {n for g in self._graphs.values() if g is not None for n in g.blocked}

    # -- running ------------------------------------------------------------------------------------------------------
    def run(self, inputs: Any) -> tuple[list, bool]:
        """(output values in graph-output order, whether any input was a Tensor). Tensor outputs are never shared with
        the plan (a replay writes its outputs again at every run). One run at a time: threads sharing a plan share
        its recorded buffers (and its nodes' runtime), so they take turns."""
        with self._lock:
            return self._run(inputs)

    def _run(self, inputs: Any) -> tuple[list, bool]:
        imp = self.imported
        items = imp.feed_items(inputs)
        as_tensors = any(isinstance(v, Tensor) for _, v in items)
        prepared = self._prepare(items) if self.replay and graph.recording() is None else None
        observe = None  # the shapes of a signature's first run, for its recording
        if prepared is not None:
            sig, values = prepared
            if sig in self._graphs:
                rec = self._graphs[sig]
                if rec is not None:
                    self._graphs.move_to_end(sig)
                    return self._replay(rec, values, as_tensors), as_tensors
            elif sig in self._seen:
                return self._record(sig, values, as_tensors, self._seen.pop(sig)), as_tensors
            else:
                if len(self._seen) >= _MAX_SEEN:
                    self._seen.clear()
                self._seen[sig] = observe = {}
        feeds = {name: imp.feed_value(name, v, self.device) for name, v in items}
        return self._execute(feeds, observe=observe), as_tensors

    def _execute(self, feeds: dict, observe: dict | None = None, blocked: frozenset = frozenset()) -> list:
        """Run the folded program (recording nothing for autograd: no gradient flows through a plan); `observe`
        receives the values' shapes, `blocked` names the values kept in channel blocks (singa_onnx.layout)."""
        prog, rt = self.program, self.runtime
        if blocked:  # this run's own runtime (the plan's stays NCHW for the eager runs)
            rt = copy.copy(rt)
            rt.blocked, rt.block = blocked, self.device.channel_block
        with autograd.no_grad():
            vals = execute(prog, rt, feeds, observe=observe)
        return [vals[n] for n in prog.outputs]

    def _prepare(self, items: list) -> tuple | None:
        """(signature, [(name, kind, value)]) of replayable inputs, or None."""
        dev = self.device
        sig, values = [], []
        for name, v in items:
            if isinstance(v, Tensor):
                v = self.imported.feed_value(name, v, dev)  # checks the device; casts integer inputs
                sig.append((name, "t", v.shape, v.dtype))
                values.append((name, "t", v))
            elif v is None:
                sig.append((name, None))
                values.append((name, None, None))
            elif isinstance(v, (list, tuple, dict)):
                return None
            else:
                got = self.imported.host_input(name, np.asarray(v), dev)
                if got is None:
                    return None
                arr, code = got
                sig.append((name, "h", arr.shape, code))
                values.append((name, "h", arr))
        return tuple(sig), values

    def _record(self, sig: tuple, values: list, as_tensors: bool, shapes: dict) -> list:
        """Run once more, recording the kernels; the activations between convolutions in channel blocks where the
        device has them, as the first run's `shapes` allow."""
        dev = self.device
        blocked = blocked_values(self.program, shapes, dev.channel_block)
        feeds, binds = {}, []
        for name, kind, v in values:
            if kind is None:
                feeds[name] = None
                continue
            if kind == "t":
                t = ops.copy(v)
            else:
                t = ops.from_numpy(v, dev, self._code(sig, name))
            t.requires_grad = False
            feeds[name] = t
            binds.append((View(t.buffer, t.dtype, t.shape, t.strides, t.offset), kind))
        with graph.Recorder(dev) as rec:
            outs = self._execute(feeds, blocked=blocked)
        del feeds
        try:
            g = rec.finish(sequential=True)
        except graph.GraphUnsupported:
            self._graphs[sig] = None
            return outs  # computed eagerly, nothing kept: they are the caller's
        self._graphs[sig] = _Replay(g, binds, outs, blocked)
        while len(self._graphs) > MAX_GRAPHS:
            self._graphs.popitem(last=False)
        return self._outputs(outs, as_tensors)

    @staticmethod
    def _code(sig: tuple, name: str) -> int:
        for entry in sig:
            if entry[0] == name:
                return entry[3]
        raise KeyError(name)

    def _replay(self, rec: _Replay, values: list, as_tensors: bool) -> list:
        dev = self.device
        copy = None
        it = iter(rec.inputs)
        for _name, kind, v in values:
            if kind is None:
                continue
            view, _ = next(it)
            if kind == "t":
                if copy is None:
                    copy = dev.table["copy"]
                copy(view, v)
            else:
                dev.write(view, v)
        rec.graph.run()
        return self._outputs(rec.outputs, as_tensors)

    @staticmethod
    def _outputs(outs: list, as_tensors: bool) -> list:
        """Values a replay will overwrite, as the caller's own: device outputs copied, as Tensors or to the host (while
        the caller holds the plan: another thread's replay may rewrite them as soon as it lets go), host ones
        copied."""
        res = []
        for v in outs:
            if isinstance(v, Tensor):
                res.append(ops.copy(v) if as_tensors else ops.to_numpy(v))
            elif isinstance(v, np.ndarray):
                res.append(v.copy())
            else:
                res.append(v)
        return res
