"""singa-comm-nccl without and with a GPU.

Without a GPU (this project's CI): the package imports, binds the real libnccl.so.2 of NVIDIA's wheel (version,
error strings, a unique id), registers the `nccl` communicator, reports why it cannot run, is never chosen for a
non-CUDA device (DistOpt falls back to MPI) and refuses non-CUDA memory with a clear error. With a GPU the checks of
gpu_check.py run (they skip here, with the reason).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import singa_comm_nccl
from singa import communicator, device, plugins
from singa_comm_nccl import NcclFactory, NcclIdHolder, nccl

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check


def test_registered_as_the_nccl_communicator():
    reg = plugins.registry()
    assert isinstance(reg.communicators.get("nccl"), NcclFactory)
    assert reg.origins["nccl"] == "singa_comm_nccl"
    assert singa_comm_nccl.singa_communicator().name == "nccl"


def test_binds_the_library_of_nvidias_wheel():
    if nccl.lib is None:
        pytest.skip(f"no NCCL library: {nccl.load_error}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        wheel = version("nvidia-nccl-cu13")
    except PackageNotFoundError:
        wheel = None
    if wheel is not None:
        assert nccl.version() == ".".join(wheel.split(".")[:3])
        assert nccl.path.endswith(os.path.join("nvidia", "nccl", "lib", "libnccl.so.2"))
    err = nccl.NcclError(4, "ncclAllReduce (rank 3)")
    assert "ncclAllReduce (rank 3) failed: ncclInvalidArgument (4): invalid argument" in str(err)


def test_unique_id_holder():
    if nccl.lib is None:
        pytest.skip(f"no NCCL library: {nccl.load_error}")
    a, b = NcclIdHolder(), NcclIdHolder()
    assert len(a.id) == 128
    assert a.id != b.id
    assert pickle.loads(pickle.dumps(a)).id == a.id  # travels to multiprocessing workers
    with pytest.raises(ValueError, match="128 bytes"):
        NcclIdHolder(b"short")


def test_only_cuda_memory():
    f = NcclFactory()
    cpu = device.get_device("cpu")
    assert f.memory(cpu) is None
    assert communicator.select(cpu).name == "mpi"  # never nccl for host memory
    with pytest.raises(communicator.CommunicatorError, match="cpu:0 is not a CUDA device"):
        f.create(cpu, communicator.World(0, 1, 0, 1))
    with pytest.raises(communicator.CommunicatorError, match="'nccl' cannot work on the memory of cpu:0"):
        communicator.select(cpu, "nccl")


def test_says_why_it_cannot_run_without_a_gpu():
    f = NcclFactory()
    why = f.status()
    if "cuda" in plugins.registry().backends and plugins.registry().backends["cuda"].device_count() > 0 \
            and nccl.lib is not None:
        assert why is None
        return
    assert why is not None
    assert any(s in why for s in ("singa-backend-cuda", "no CUDA device", "NCCL could not be loaded"))
    assert f.info()["status" if nccl.lib is None else "nccl"]


def test_distopt_with_nccl_id_refuses_host_memory():
    """SINGA's launch without MPI (nccl_id, local_rank, world_size) names the device NCCL cannot use."""
    script = """
import numpy as np
from singa import autograd, opt, tensor, device
from singa_comm_nccl import NcclIdHolder
dist = opt.DistOpt(opt.SGD(lr=0.1), nccl_id=NcclIdHolder(), local_rank=0, world_size=1)
assert (dist.global_rank, dist.local_rank, dist.world_size) == (0, 0, 1)
autograd.training = True
w = tensor.Tensor((3,), device.get_device("cpu"), requires_grad=True, stores_grad=True)
try:
    dist.backward_and_update(autograd.reduce_sum(autograd.mul(w, w), keepdims=0))
except Exception as e:
    print(type(e).__name__, e)
"""
    if nccl.lib is None:
        pytest.skip(f"no NCCL library: {nccl.load_error}")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    assert "CommunicatorError" in r.stdout
    assert "cpu:0" in r.stdout
    from singa import opt

    with pytest.raises(ValueError, match="give local_rank and world_size"):
        opt.DistOpt(opt.SGD(), nccl_id=b"x" * 128)


@pytest.fixture(scope="module")
def gpu():
    try:
        return gpu_check.setup()
    except Exception as exc:  # noqa: BLE001 - any reason to skip is printed
        pytest.skip(f"no GPU for NCCL: {exc}")


@pytest.mark.parametrize("check", gpu_check.CHECKS, ids=lambda f: f.__name__)
def test_on_a_gpu(gpu, check):
    check(*gpu)
