"""SINGA's CUDA backend: the GPU kernels singa-core shares, compiled by NVRTC at first use (cached on disk), cuBLAS
matrix products and cuDNN convolutions, all reached through cffi from NVIDIA's driver and PyPI wheels (no compiler
on the user's machine), one stream per device, a caching allocator and CUDA Graph replay of graph-mode steps.

Installed, it registers itself as the `cuda` backend through the `singa.backends` entry point; `SINGA_DEVICE=cuda`
(or `cuda:N`), `singa.device.create_cuda_gpu()` and `create_cuda_gpu_on(N)` select it. Importing this package never
fails for lack of a GPU: the backend then reports no devices, and `python -m singa info` says why.
"""

from __future__ import annotations

from singa import hookimpl
from singa_backend_cuda.backend import CudaBackend

__all__ = ["CudaBackend", "singa_backend"]


@hookimpl
def singa_backend() -> CudaBackend:
    return CudaBackend()
