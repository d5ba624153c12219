"""singa-onnx: ONNX import and export for SINGA, also reachable as `singa.sonnx`.

Import: `prepare(onnx_model, device=dev)` returns a `SingaRep` whose `run(inputs, last_layers=-1)` returns the outputs as
a list; `SONNXModel(onnx_model)` is a `singa.model.Model` (inference, re-training, transfer learning);
`SingaBackend` is an `onnx.backend.base.Backend`. Export: `to_onnx(inputs, outputs)` and `SingaFrontend`.
"""

from __future__ import annotations

from singa_onnx.backend import SingaBackend, prepare, resolve_device, run_model, run_node, supports_device
from singa_onnx.errors import InvalidModelError, NodeError, SONNXError, UnsupportedOperatorError
from singa_onnx.model import SONNXModel
from singa_onnx.onnx_types import onnx_type_to_singa_type
from singa_onnx.rep import SingaRep
from singa_onnx.runtime import OnnxAttributes, OnnxNode

__version__ = "0.1.0"

__all__ = [
    "SingaBackend", "SingaRep", "SONNXModel", "prepare", "run_model", "run_node", "supports_device",
    "resolve_device", "onnx_type_to_singa_type", "OnnxNode", "OnnxAttributes", "SONNXError", "InvalidModelError",
    "UnsupportedOperatorError", "NodeError", "__version__",
]

# Export lives in frontend.py, written alongside this package; until it exists the import side works on its own.
try:
    from singa_onnx.frontend import SingaFrontend, to_onnx  # noqa: F401
except ImportError as _exc:  # pragma: no cover - only while frontend.py is missing
    if getattr(_exc, "name", None) not in ("singa_onnx.frontend",):
        raise
else:
    __all__ += ["SingaFrontend", "to_onnx"]
    try:
        from singa_onnx.frontend import singa_to_onnx_graph, singa_to_onnx_model  # noqa: F401
    except ImportError:
        pass
    else:
        __all__ += ["singa_to_onnx_graph", "singa_to_onnx_model"]
