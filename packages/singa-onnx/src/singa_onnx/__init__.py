"""singa-onnx: ONNX import and export for SINGA, also reachable as `singa.sonnx`.

Import: `prepare(onnx_model, device=dev)` returns a `SingaRep` whose `run(inputs, last_layers=-1)` returns the outputs
as a list; `SONNXModel(onnx_model)` is a `singa.model.Model` (inference, re-training, transfer learning);
`SingaBackend` is an `onnx.backend.base.Backend`. Export: `to_onnx(inputs, outputs)` and `SingaFrontend`.
"""

from __future__ import annotations

from singa_onnx.backend import SingaBackend, prepare, resolve_device, run_model, run_node, supports_device
from singa_onnx.errors import InvalidInputError, InvalidModelError, NodeError, SONNXError, UnsupportedOperatorError
from singa_onnx.model import SONNXModel
from singa_onnx.onnx_types import onnx_type_to_singa_type
from singa_onnx.rep import SingaRep
from singa_onnx.runtime import OnnxAttributes, OnnxNode


def _version() -> str:
    # the repository's VERSION file, through the installed distribution's metadata
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("singa-onnx")
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        return "0+unknown"


__version__ = _version()

__all__ = [
    "SingaBackend", "SingaRep", "SONNXModel", "prepare", "run_model", "run_node", "supports_device",
    "resolve_device", "onnx_type_to_singa_type", "OnnxNode", "OnnxAttributes", "SONNXError", "InvalidModelError",
    "InvalidInputError", "UnsupportedOperatorError", "NodeError", "__version__",
]

# Export lives in frontend.py, written alongside this package. Import keeps working without it (or if it fails to
# import); the export names then raise the reason when used.
try:
    from singa_onnx import frontend as _frontend
except ImportError as _exc:  # pragma: no cover - only while frontend.py is missing or broken
    _why = f"ONNX export is unavailable: {_exc}"

    def to_onnx(*args, **kwargs):
        raise ImportError(_why)

    class SingaFrontend:
        def __init__(self, *args, **kwargs):
            raise ImportError(_why)

    __all__ += ["SingaFrontend", "to_onnx"]
else:
    _names = [n for n in getattr(_frontend, "__all__", ["SingaFrontend", "to_onnx"]) if n not in __all__]
    globals().update({n: getattr(_frontend, n) for n in _names})
    __all__ += _names
