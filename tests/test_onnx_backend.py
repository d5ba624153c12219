"""onnx's own backend conformance suite (onnx.backend.test) through singa_onnx.SingaBackend.

Node, real (the light models shipped in the onnx wheel), simple, pytorch-converted and pytorch-operator cases, on the
CPU backend and on every other installed singa device. The exclusions, each with its reason, live in
singa_onnx.conformance (docs/conformance.md lists them with the pass counts).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

backend_test = pytest.importorskip("onnx.backend.test")
singa_onnx = pytest.importorskip("singa_onnx")

from singa import device  # noqa: E402
from singa_onnx import SingaBackend  # noqa: E402
from singa_onnx.conformance import excluded  # noqa: E402

# The runner writes the light models' generated inputs under $ONNX_HOME: keep that out of the user's home.
if "ONNX_HOME" not in os.environ:
    _home = tempfile.mkdtemp(prefix="singa-onnx-home-")
    atexit.register(shutil.rmtree, _home, True)
    os.environ["ONNX_HOME"] = _home


# The suite checks inference: autograd off in every case (conftest.py restores the flag afterwards).
pytestmark = pytest.mark.usefixtures("evaluating")


def _cases(backend: type, dev) -> dict:
    bt = backend_test.BackendTest(backend, __name__)
    for pattern, _reason in excluded(dev):
        bt.exclude(pattern)
    return bt.test_cases


def _bound_backend(dev) -> type:
    """SingaBackend with onnx's 'CPU' device mapped to singa device `dev` (and no CUDA variant)."""

    class Bound(SingaBackend):
        @classmethod
        def prepare(cls, model, device="CPU", **kwargs):
            return SingaBackend.prepare(model, dev, **kwargs)

        @classmethod
        def supports_device(cls, device: str) -> bool:
            return str(device).upper() == "CPU"

    Bound.__name__ = f"SingaBackend_{dev.name.replace(':', '_')}"
    return Bound


# the CPU backend under the plain names (onnx's 'CPU' device); 'CUDA' cases run when a CUDA backend is installed
globals().update(_cases(SingaBackend, device.get_device("cpu") if SingaBackend.supports_device("CPU") else None))

for _dev in device.list_devices():
    if _dev.name.startswith("cpu"):
        continue
    _tag = _dev.name.replace(":", "_")
    for _name, _cls in _cases(_bound_backend(_dev), _dev).items():
        globals()[f"{_name}_{_tag}"] = type(f"{_name}_{_tag}", (_cls,), {"__module__": __name__})
    del _name, _cls
