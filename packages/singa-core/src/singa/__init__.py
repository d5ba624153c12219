"""SINGA: a device-agnostic deep learning core; devices come from plugins (see singa.hookspecs)."""

from singa.hookspecs import hookimpl

__version__ = "0.1.0"
__all__ = ["hookimpl", "__version__"]
