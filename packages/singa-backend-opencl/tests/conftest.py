"""The `ocl` fixture: the first OpenCL device, or a skip that says what is missing."""

from __future__ import annotations

import pytest

NO_PLATFORM = "no OpenCL platform: install pocl-opencl-icd"


def opencl_device():
    """The opencl:0 device, or None when this machine has no OpenCL platform."""
    from singa import device as singa_device
    from singa import plugins

    backend = plugins.registry().backends.get("opencl")
    if backend is None or backend.device_count() == 0:
        return None
    return singa_device.get_device("opencl:0")


@pytest.fixture(scope="session")
def ocl():
    dev = opencl_device()
    if dev is None:
        pytest.skip(NO_PLATFORM)
    return dev
