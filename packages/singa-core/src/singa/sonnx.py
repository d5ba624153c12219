"""SINGA's `sonnx` module (ONNX import and export), provided by the separate singa-onnx package.

With singa-onnx installed this module re-exports it (`prepare`, `SingaRep`, `SONNXModel`, `SingaBackend`, `to_onnx`,
...); without it, importing `singa.sonnx` raises ImportError saying to `pip install singa-onnx`.
"""

from __future__ import annotations

try:
    import singa_onnx as _impl
except ImportError as _exc:
    raise ImportError("singa.sonnx needs the singa-onnx package, which is not installed (or failed to import: "
                      f"{_exc}); install it with `pip install singa-onnx`, or from a checkout of the SINGA repository "
                      "with `pip install ./packages/singa-onnx`") from _exc

__all__ = list(getattr(_impl, "__all__", []))
globals().update({name: getattr(_impl, name) for name in __all__})


def __getattr__(name: str):
    # names singa_onnx defines beyond __all__ (SINGA's helpers) are reachable too
    try:
        return getattr(_impl, name)
    except AttributeError:
        raise AttributeError(f"module 'singa.sonnx' has no attribute {name!r}") from None
