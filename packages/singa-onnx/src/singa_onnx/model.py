"""SONNXModel: an imported ONNX model as a singa `model.Model` (inference, re-training, transfer learning)."""

from __future__ import annotations

from typing import Any

import numpy as np

from singa import autograd, layer, model
from singa.tensor import Tensor
from singa_onnx import ops as _ops  # noqa: F401 - importing the package registers every operator handler
from singa_onnx.ops._common import host_to_tensor
from singa_onnx.runtime import ImportedGraph, Runtime


class _Initializers(layer.Layer):
    """Holds an imported model's initializers as parameters (trainable) and states (running statistics).

    Its local names are the ONNX names, so they are unique inside it, and as a sublayer its prefix keeps them apart
    from the names of any other layer of the model (two imported models in one parent get two prefixes)."""

    def __init__(self) -> None:
        super().__init__()
        self.__dict__["by_onnx_name"] = {}

    def create(self, name: str, arr: np.ndarray, like: Tensor, trainable: bool) -> Tensor:
        # an ONNX name that is also one of the layer's own attributes ("name", "_layers" ...) gets a prefix
        local = name if name not in self.__dict__ and not hasattr(type(self), name) else f"onnx:{name}"
        t = host_to_tensor(arr, like.device)
        t.requires_grad = trainable
        t.stores_grad = trainable
        t.name = self._prefix() + local
        names = self.__dict__.setdefault("_param_names" if trainable else "_state_names", [])
        names.append(local)
        object.__setattr__(self, local, t)
        self.__dict__["by_onnx_name"][name] = local
        return t

    def tensors(self) -> dict[str, Tensor]:
        # looked up at every run: load_states and set_params write in place, but a user may also rebind one
        d = self.__dict__
        return {n: d[local] for n, local in d["by_onnx_name"].items()}


class SONNXModel(model.Model):
    """`SONNXModel(onnx_model)`: the ONNX graph runs in `forward(*x, last_layers=-1, aux_output=())`, which returns
    the outputs as a list (then the `aux_output` values, by ONNX name).

    Float initializers become trainable parameters (BatchNormalization's mean and variance become states) on the
    device of the first input, so the model can be compiled (`use_graph=True` too), re-trained with any optimizer and
    checkpointed. `last_layers=-3` stops before the last node (SINGA's count: -1 and -2 run every node, -k leaves out
    the last k - 2) for transfer learning: append layers in a subclass and train them together. Subclass it and write
    `train_one_batch`, as for any singa Model.
    """

    def __init__(self, onnx_model: Any, base_dir: str | None = None) -> None:
        super().__init__()
        self.__dict__["_imported"] = ImportedGraph(onnx_model, base_dir=base_dir)
        self.sonnx = _Initializers()

    @property
    def onnx_model(self) -> Any:
        return self._imported.proto

    @property
    def input_names(self) -> list[str]:
        return list(self._imported.inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self._imported.outputs)

    def initialize(self, *x: Any, **kwargs: Any) -> None:
        like = next((v for v in x if isinstance(v, Tensor)), None)
        if like is None:
            from singa import device

            like = Tensor((), device.get_default_device())
        imp = self._imported
        holder = self.sonnx
        for name, kind in imp.kinds.items():
            if kind != "const" and name not in holder.by_onnx_name:
                holder.create(name, imp.program.initializers[name], like, kind == "param")

    def forward(self, *x: Any, last_layers: int = -1, aux_output: Any = (), **kwargs: Any) -> list:
        imp = self._imported
        dev = next((v.device for v in x if isinstance(v, Tensor)), None) or self.device
        if dev is None:
            from singa import device

            dev = device.get_default_device()
        inputs = x[0] if len(x) == 1 and isinstance(x[0], (list, tuple, dict)) else list(x)
        feeds, _ = imp.feed(inputs, dev)
        params = self.sonnx.tensors()
        training = bool(self.training and autograd.training)
        rt = Runtime(dev, params, training=training)
        outs, _, _ = imp.run(rt, feeds, last_layers, aux_output)
        return [host_to_tensor(o, dev) if isinstance(o, np.ndarray) and o.dtype != object else o for o in outs]
