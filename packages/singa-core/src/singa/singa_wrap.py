"""`from singa import singa_wrap`: what SINGA scripts read from SINGA's compiled SWIG module, its build flags.

Apache SINGA's `singa_wrap` is the SWIG binding of its C++ library; scripts import it for the flags that say how SINGA
was built (`if singa_wrap.USE_CUDA: ...`, `USE_DIST` before distributed training). Here the same flags say what is
installed and usable, asked when read:

    USE_CUDA      the `cuda` backend plugin is installed and has at least one device
    USE_OPENCL    the `opencl` backend plugin is installed and has at least one device
    USE_DIST      distributed training can run: mpi4py is importable or a communicator plugin is installed
    USE_DNNL      the CPU backend reports oneDNN among its libraries (`python -m singa info`)
    USE_PYTHON3   True

Any other name is SINGA's internal C++ API (CTensor, the cuDNN handles, GpuConvForward ...), which this implementation
does not have: reading it raises an AttributeError that says so and what to use instead.
"""

from __future__ import annotations

import importlib.util
from typing import Any

__all__ = ["USE_CUDA", "USE_OPENCL", "USE_DIST", "USE_DNNL", "USE_PYTHON3"]  # noqa: F822 - flags come from __getattr__

USE_PYTHON3 = True


def _has_devices(name: str) -> bool:
    from singa import plugins

    backend = plugins.registry().backends.get(name)
    if backend is None:
        return False
    try:
        return backend.device_count() > 0
    except Exception:  # noqa: BLE001 - a backend that cannot count its devices has none usable
        return False


def _dist() -> bool:
    from singa import plugins

    return importlib.util.find_spec("mpi4py") is not None or bool(plugins.registry().communicators)


def _dnnl() -> bool:
    from singa import plugins

    backend = plugins.registry().backends.get("cpu")
    if backend is None:
        return False
    try:
        facts = backend.info()
    except Exception:  # noqa: BLE001 - no facts, no oneDNN
        return False
    return any(w in f"{k} {v}".lower() for k, v in facts.items() for w in ("dnnl", "onednn", "mkldnn"))


_FLAGS = {"USE_CUDA": lambda: _has_devices("cuda"), "USE_OPENCL": lambda: _has_devices("opencl"),
          "USE_DIST": _dist, "USE_DNNL": _dnnl}


def __getattr__(name: str) -> Any:
    flag = _FLAGS.get(name)
    if flag is not None:
        return bool(flag())
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"singa.singa_wrap.{name} is part of Apache SINGA's internal SWIG API (its C++ library), which this "
        "implementation does not have; singa_wrap here holds only the build flags (USE_CUDA, USE_DIST, USE_DNNL, "
        "USE_OPENCL, USE_PYTHON3). Use the Python API instead: singa.tensor (Tensor and its functions), "
        "singa.autograd (operators, e.g. autograd.conv2d), singa.layer, singa.device.")


def __dir__() -> list[str]:
    return sorted(__all__)
