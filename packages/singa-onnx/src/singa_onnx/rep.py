"""SingaRep: a prepared ONNX model bound to a device (onnx.backend.base.BackendRep)."""

from __future__ import annotations

from typing import Any

from onnx.backend.base import BackendRep

from singa import autograd
from singa.backend import Device
from singa.tensor import Tensor
from singa_onnx.inference import InferencePlan
from singa_onnx.ops._common import host_to_tensor
from singa_onnx.runtime import ImportedGraph, Runtime, to_numpy_output


class SingaRep(BackendRep):
    """The result of `prepare`: `run(inputs, last_layers=-1)` returns the outputs as a list.

    Inputs are singa Tensors (on the rep's device) or numpy arrays, as a list in the order of the graph inputs or a
    dict by name; the batch size may change from call to call. Outputs are singa Tensors when any input was a Tensor
    (so `autograd` can follow them), else numpy arrays of the types the model declares.

    `tensor_map` holds the model's float initializers as Tensors on the device (the earlier API trains them by setting
    `requires_grad` / `stores_grad` on these tensors).

    Plain inference (no input that autograd follows, or autograd off; every tensor of `tensor_map` frozen; the whole
    model's outputs) runs an optimised version of the graph, built from the current tensors at the first such run
    (see singa_onnx.inference: constants and batch normalisations folded, and per input shape a recorded sequence of
    kernel calls replayed from the third run on). It is built again when `tensor_map` holds other tensors or some
    were trainable since; after writing into a frozen tensor of `tensor_map` in place, call `refresh()`.
    `optimize=False` (also a `prepare` argument) runs the graph as imported.
    """

    def __init__(self, imported: ImportedGraph, device: Device, tensor_map: dict[str, Tensor], optimize: bool = True):
        self.imported = imported
        self.device = device
        self.tensor_map = tensor_map
        self.inputs = list(imported.inputs)
        self.outputs = list(imported.outputs)
        self.optimize = optimize
        self._plan: InferencePlan | None = None

    def refresh(self) -> None:
        """Forget the optimised graph (and its recorded runs); the next inference run builds it from `tensor_map`."""
        self._drop_plan()

    def _drop_plan(self) -> None:
        if self._plan is not None:
            self._plan.close()  # its weights may be written from now on
            self._plan = None

    def inference_plan(self) -> InferencePlan | None:
        """The optimised graph plain inference runs now (built if needed), or None when the tensors are trainable or
        `optimize` is off."""
        if not self.optimize:
            return None
        tm = self.tensor_map
        for t in tm.values():
            if t.requires_grad or t.stores_grad:
                self._drop_plan()  # being trained: their values will change; build again once they are frozen
                return None
        plan = self._plan
        if plan is None or not plan.valid_for(tm):
            self._drop_plan()
            plan = self._plan = InferencePlan(self.imported, self.device, tm)
        return plan

    @property
    def model(self) -> Any:
        return self.imported.proto

    @property
    def layers(self) -> list:
        """The nodes, in the order they run (`last_layers` counts them from the end)."""
        return list(self.imported.program.nodes)

    def run(self, inputs: Any, last_layers: int = -1, aux_output: Any = (), all_outputs: bool = False,
            **kwargs: Any) -> list:
        """Run the model. `last_layers` counts as SINGA's code does: -1 and -2 run every node, -3 stops before the
        last node, -k before the last k - 2 nodes, returning the outputs of the last node run (for transfer
        learning); a non-negative k runs the nodes up to index k. `aux_output` adds named intermediate values after
        the outputs; `all_outputs=True` returns {name: value} of everything computed."""
        imp = self.imported
        # autograd on (a training script's default) needs the graph as imported only when a gradient flows through
        # the run: from an input, or into the tensors (inference_plan() declines those)
        if not (autograd.training and _gradient_flows_in(inputs)) and not all_outputs and not aux_output and \
                imp.stop_index(last_layers if last_layers is not None else -1) is None:
            plan = self.inference_plan()
            if plan is not None:
                outs, as_tensors = plan.run(inputs)
                return [self._out(v, n, as_tensors) for v, n in zip(outs, imp.outputs)]
        feeds, as_tensors = imp.feed(inputs, self.device)
        # training semantics (batch statistics, dropout) when autograd records and the imported tensors are being
        # trained, as the earlier API's re-training does; a frozen import under new layers keeps inference semantics
        training = autograd.training and any(t.stores_grad for t in self.tensor_map.values())
        rt = Runtime(self.device, self.tensor_map, training=training)
        outs, names, vals = imp.run(rt, feeds, last_layers, aux_output, all_outputs)
        if all_outputs:
            return {k: self._out(v, k, as_tensors) for k, v in vals.items()}
        return [self._out(v, n, as_tensors) for v, n in zip(outs, names)]

    def _out(self, v: Any, name: str, as_tensors: bool) -> Any:
        if as_tensors:
            if isinstance(v, Tensor) or v is None:
                return v
            if isinstance(v, list):
                return [self._out(e, name, True) for e in v]
            if getattr(v, "dtype", None) is not None and v.dtype != object:
                return host_to_tensor(v, self.device)
            return v
        return to_numpy_output(v, self.imported.types.get(name))


def _gradient_flows_in(inputs: Any) -> bool:
    """Whether an input is a Tensor autograd follows (the output of trainable layers upstream)."""
    values = inputs.values() if isinstance(inputs, dict) else inputs if isinstance(inputs, (list, tuple)) else [inputs]
    return any(isinstance(v, Tensor) and (v.requires_grad or v.stores_grad) for v in values)
