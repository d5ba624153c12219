"""The `gpu` fixture: the first CUDA device, or a skip that says why there is none; `nvrtc_or_skip` for the
compile-only tests, which need NVIDIA's NVRTC wheel but no GPU."""

from __future__ import annotations

import pytest


def cuda_device():
    """cuda:0, or None on a machine without a usable CUDA device."""
    from singa import device as singa_device
    from singa import plugins

    backend = plugins.registry().backends.get("cuda")
    if backend is None or backend.device_count() == 0:
        return None
    return singa_device.get_device("cuda:0")


def why_no_gpu() -> str:
    from singa import plugins

    backend = plugins.registry().backends.get("cuda")
    if backend is None:
        return "singa-backend-cuda is not installed"
    return f"no CUDA device: {backend.info().get('status', 'unknown reason')}"


@pytest.fixture(scope="session")
def gpu():
    dev = cuda_device()
    if dev is None:
        pytest.skip(why_no_gpu())
    return dev


@pytest.fixture(scope="session")
def nvrtc_lib():
    from singa_backend_cuda import libs, nvrtc

    try:
        return nvrtc.get()
    except libs.MissingLibrary as exc:
        pytest.skip(str(exc))
