"""SINGA's NCCL communicator: collectives on CUDA memory, queued on the CUDA backend's stream.

Installed, it registers the `nccl` communicator through the `singa.communicators` entry point; `opt.DistOpt` picks it
for parameters on a CUDA device (`singa.communicator.select`). Importing this package never fails for lack of NCCL or
of a GPU: the communicator then reports why it cannot run (`python -m singa info`), and DistOpt falls back to MPI.
"""

from __future__ import annotations

from singa import hookimpl
from singa_comm_nccl.backend import NcclFactory, NcclIdHolder
from singa_comm_nccl.communicator import NcclCommunicator
from singa_comm_nccl.nccl import NcclError

__all__ = ["NcclFactory", "NcclCommunicator", "NcclIdHolder", "NcclError", "singa_communicator"]


@hookimpl
def singa_communicator() -> NcclFactory:
    return NcclFactory()
