"""The NCCL communicator factory that the `singa.communicators` entry point hands to singa-core, and SINGA's
`NcclIdHolder`.

It works on CUDA memory only (`memory(device)` is NATIVE for the `cuda` backend's devices, None otherwise), so for any
other device `singa.communicator.select` moves on to MPI. Without NCCL, without singa-backend-cuda or without a GPU
it stays listed, with the reason in `status()`.
"""

from __future__ import annotations

from typing import Any

from singa.backend import Device
from singa.communicator import NATIVE, CommunicatorError, CommunicatorFactory, World
from singa_comm_nccl import nccl


class NcclIdHolder:
    """SINGA's `NcclIdHolder`: a fresh NCCL unique id (`.id`, 128 bytes) for `DistOpt(nccl_id=...)`, to hand to
    every process of a launch without MPI (it pickles, for multiprocessing)."""

    def __init__(self, id: bytes | None = None):
        self.id = nccl.unique_id() if id is None else bytes(id)
        if len(self.id) != nccl.UNIQUE_ID_BYTES:
            raise ValueError(f"NcclIdHolder: an NCCL unique id has {nccl.UNIQUE_ID_BYTES} bytes, got {len(self.id)}")

    def __repr__(self) -> str:
        return f"NcclIdHolder({self.id[:8].hex()}...)"


class NcclFactory(CommunicatorFactory):
    name = "nccl"
    distribution = "singa-comm-nccl"

    def status(self) -> str | None:
        if nccl.lib is None:
            return nccl.load_error
        from singa import plugins

        cuda = plugins.registry().backends.get("cuda")
        if cuda is None:
            return "NCCL works on CUDA memory: install singa-backend-cuda"
        try:
            if cuda.device_count() == 0:
                return "no CUDA device on this machine"
        except Exception as exc:  # noqa: BLE001 - a backend's failure is reported, never raised here
            return f"the CUDA backend cannot count its devices: {type(exc).__name__}: {exc}"
        return None

    def memory(self, device: Device) -> str | None:
        return NATIVE if device.backend_name == "cuda" else None

    def world(self) -> World:
        from singa import mpi

        return mpi.world()

    def create(self, device: Device, world: World, nccl_id: Any = None, **options: Any):
        if options:
            raise TypeError(f"the nccl communicator takes nccl_id only, got {', '.join(sorted(options))}")
        if device.backend_name != "cuda":
            raise CommunicatorError(f"nccl works on CUDA memory; {device.name} is not a CUDA device (rank "
                                    f"{world.rank})")
        if nccl.lib is None:
            raise CommunicatorError(f"rank {world.rank}: {nccl.load_error}")
        from singa_comm_nccl.communicator import NcclCommunicator

        uid = None
        if nccl_id is not None:
            uid = nccl_id.id if isinstance(nccl_id, NcclIdHolder) else bytes(nccl_id)
        return NcclCommunicator(device, world, uid)

    def info(self) -> dict[str, str]:
        if nccl.lib is None:
            return {"status": nccl.load_error}
        out = {"nccl": f"{nccl.version()} ({nccl.path})"}
        why = self.status()
        if why is not None:
            out["status"] = why
        return out
