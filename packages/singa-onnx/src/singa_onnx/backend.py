"""SingaBackend: onnx.backend.base.Backend over singa devices (`prepare`, `run_node`, `supports_device`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, DeviceType
from onnx.backend.base import Device as OnnxDevice

from singa import device as device_mod
from singa import plugins
from singa.backend import Device
from singa_onnx import onnx_types as ot
from singa_onnx import ops as _ops  # noqa: F401 - importing the package registers every operator handler
from singa_onnx.ops import _common
from singa_onnx.rep import SingaRep
from singa_onnx.runtime import ImportedGraph


def resolve_device(dev: Any) -> Device:
    """A singa Device from a Device, None (the default device), onnx's 'CPU' / 'CUDA:1' or a singa spec."""
    if isinstance(dev, Device):
        return dev
    if dev is None:
        return device_mod.get_default_device()
    if isinstance(dev, OnnxDevice):
        return device_mod.get_device(("cuda" if dev.type == DeviceType.CUDA else "cpu") + f":{dev.device_id}")
    if isinstance(dev, str):
        spec = dev.strip().lower()
        return device_mod.get_device(spec or "cpu")
    raise TypeError(f"device must be a singa Device or a string such as 'CPU', 'cuda:0', got {type(dev).__name__}")


class SingaBackend(Backend):
    """Runs ONNX models with singa: `prepare(model, device)` returns a SingaRep."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return True

    @classmethod
    def prepare(cls, model: Any, device: Any = "CPU", **kwargs: Any) -> SingaRep:
        """Validate (onnx.checker), build and bind the model to `device` (a singa Device, 'CPU', 'cuda:1', a singa
        backend name ...). Every unsupported node is reported at once (UnsupportedOperatorError). `base_dir` names
        the folder of external data files when `model` is a ModelProto loaded without them; `optimize=False` runs the
        graph as imported even for plain inference (see SingaRep)."""
        dev = resolve_device(device)
        imported = ImportedGraph(model, base_dir=kwargs.get("base_dir"), check=kwargs.get("check", True))
        tensor_map = {}
        for name, kind in imported.kinds.items():
            if kind in ("param", "state"):
                arr = imported.program.initializers[name]
                t = _common.host_to_tensor(arr, dev)
                t.requires_grad = False
                t.stores_grad = False
                t.name = name
                tensor_map[name] = t
        return SingaRep(imported, dev, tensor_map, optimize=kwargs.get("optimize", True))

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: Any = "CPU", **kwargs: Any) -> list:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: Any = "CPU", outputs_info: Any = None,
                 **kwargs: Any) -> tuple:
        """Run one NodeProto on numpy inputs (a list in the node's input order, or a dict by name)."""
        names = [n for n in node.input if n]
        if isinstance(inputs, dict):
            values = [inputs[n] for n in names]
        else:
            values = list(inputs)
        arrays = [np.asarray(v) for v in values]
        g_inputs = [helper.make_tensor_value_info(n, ot.from_np(a.dtype) if a.dtype != object else
                                                  onnx.TensorProto.STRING, a.shape) for n, a in zip(names, arrays)]
        g_outputs = []
        for i, n in enumerate(o for o in node.output if o):
            if outputs_info is not None and i < len(outputs_info):
                dt, shape = outputs_info[i]
                g_outputs.append(helper.make_tensor_value_info(n, ot.from_np(np.dtype(dt)), shape))
            else:
                g_outputs.append(helper.make_empty_tensor_value_info(n))
        graph = helper.make_graph([node], "run_node", g_inputs, g_outputs)
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        domain = node.domain or ""
        opsets = [helper.make_opsetid("", opset)]
        if domain not in ("", "ai.onnx"):
            opsets.append(helper.make_opsetid(domain, kwargs.get("domain_version", 1)))
        model = helper.make_model(graph, opset_imports=opsets)
        rep = cls.prepare(model, device, check=False)
        return tuple(rep.run(arrays))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """'CPU' needs the CPU backend, 'CUDA' a CUDA backend with a device; any other installed singa backend name
        with a device works too."""
        name = str(device).strip().lower().partition(":")[0]
        try:
            backend = plugins.registry().backends.get(name)
            return backend is not None and backend.device_count() > 0
        except Exception:  # noqa: BLE001 - a broken plugin set means no device is usable
            return False


prepare = SingaBackend.prepare
run_model = SingaBackend.run_model
run_node = SingaBackend.run_node
supports_device = SingaBackend.supports_device
