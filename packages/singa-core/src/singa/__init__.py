"""SINGA: a device-agnostic deep learning core; devices come from plugins (see singa.hookspecs)."""

from singa.fallback_policy import get_fallback, set_fallback
from singa.hookspecs import hookimpl


def _version() -> str:
    # the repository's VERSION file, through the installed distribution's metadata
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("singa-core")
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        return "0+unknown"


__version__ = _version()
__all__ = ["hookimpl", "get_fallback", "set_fallback", "__version__"]
