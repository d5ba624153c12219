"""SINGA: a device-agnostic deep learning core; devices come from plugins (see singa.hookspecs)."""

from singa.fallback_policy import get_fallback, set_fallback
from singa.hookspecs import hookimpl

__version__ = "0.1.0"
__all__ = ["hookimpl", "get_fallback", "set_fallback", "__version__"]
