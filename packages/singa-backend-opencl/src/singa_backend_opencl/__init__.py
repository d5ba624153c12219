"""SINGA's OpenCL backend: OpenCL C kernels built per device at first use (cached on disk), CLBlast matrix products.

Installed, it registers itself as the `opencl` backend through the `singa.backends` entry point; `SINGA_DEVICE=opencl`
or `singa.device.create_opencl_device()` selects it. Importing this package never fails for lack of OpenCL: the
backend then reports no devices, and `python -m singa info` says what to install.
"""

from __future__ import annotations

from singa import hookimpl
from singa_backend_opencl.backend import OpenclBackend

__all__ = ["OpenclBackend", "singa_backend"]


@hookimpl
def singa_backend() -> OpenclBackend:
    return OpenclBackend()
