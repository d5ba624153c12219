"""NcclCommunicator: NCCL collectives on a CUDA device's memory, queued on the CUDA backend's stream.

Written against singa-backend-cuda's device interface: `dev.activate()` makes the device's primary context current on
the calling thread, `dev.stream` is its CUstream as an int (0: the default stream), `buffer.handle.ptr` is a buffer's
CUdeviceptr as an int; a view's element offset times its itemsize is its byte offset. Collectives are queued on that
stream, so they are ordered with the kernels before and after them without host waits; `synchronize()` waits for
them (and reports an asynchronous NCCL error), under the communicator's timeout.

The NCCL rank is the MPI rank; rank 0 makes the unique id and MPI broadcasts it, unless the id comes from SINGA's
`NcclIdHolder` (a launch without MPI).
"""

from __future__ import annotations

import contextlib
import os
import sys

from singa import dtypes, ops
from singa.backend import Device, numel
from singa.communicator import Communicator, World
from singa_comm_nccl import nccl
from singa_comm_nccl.nccl import ffi


def _exchange_id(world: World) -> bytes:
    """Rank 0's fresh unique id, on every rank, over MPI."""
    from singa import mpi

    MPI = mpi._mpi()
    buf = bytearray(nccl.unique_id() if world.rank == 0 else bytes(nccl.UNIQUE_ID_BYTES))
    MPI.COMM_WORLD.Bcast([buf, MPI.BYTE], root=0)
    return bytes(buf)


class NcclCommunicator(Communicator):
    name = "nccl"

    def __init__(self, device: Device, world: World, unique_id: bytes | None = None):
        super().__init__(device, world)
        device.activate()
        uid_bytes = _exchange_id(world) if unique_id is None else unique_id
        uid = ffi.new("ncclUniqueId *")
        ffi.memmove(uid, uid_bytes, nccl.UNIQUE_ID_BYTES)
        comm = ffi.new("ncclComm_t *")
        with self.guard("ncclCommInitRank"):
            nccl.check(nccl.lib.ncclCommInitRank(comm, world.size, uid[0], world.rank),
                       f"ncclCommInitRank (rank {world.rank} of {world.size} on {device.name})")
        self._comm = comm[0]
        self._mpi_world = unique_id is None
        self._flag = ops.full((1,), 0, dtypes.float32, device)  # for barrier()

    def __del__(self):
        comm = getattr(self, "_comm", None)
        if comm is not None and nccl.lib is not None:
            nccl.lib.ncclCommDestroy(comm)
            self._comm = None

    # -- pointers and the stream -----------------------------------------------------------------------------------
    @staticmethod
    def _ptr(x):
        return ffi.cast("void *", x.buffer.handle.ptr + x.offset * dtypes.itemsize(x.dtype))

    def _stream(self):
        return ffi.cast("cudaStream_t", self.device.stream)

    def _enqueue(self):
        """The device's lock on its stream where it has one (the CUDA backend's `stream_lock`): a CUDA Graph capture
        in another thread must not record this thread's collective."""
        return getattr(self.device, "stream_lock", None) or contextlib.nullcontext()

    def _call(self, code: int, what: str) -> None:
        nccl.check(code, f"{what} (rank {self.rank} of {self.world_size} on {self.device.name})", self._comm)

    # -- the collectives -------------------------------------------------------------------------------------------
    def _all_reduce(self, x) -> None:
        p = self._ptr(x)
        with self._enqueue():
            self._call(nccl.lib.ncclAllReduce(p, p, numel(x.shape), nccl.DTYPES[x.dtype], nccl.SUM, self._comm,
                                              self._stream()), "ncclAllReduce")

    def _broadcast(self, x, root: int) -> None:
        p = self._ptr(x)
        nbytes = numel(x.shape) * dtypes.itemsize(x.dtype)
        with self._enqueue():
            self._call(nccl.lib.ncclBroadcast(p, p, nbytes, nccl.UINT8, root, self._comm, self._stream()),
                       "ncclBroadcast")

    def _all_gather(self, out, x) -> None:
        nbytes = numel(x.shape) * dtypes.itemsize(x.dtype)
        with self._enqueue():
            self._call(nccl.lib.ncclAllGather(self._ptr(x), self._ptr(out), nbytes, nccl.UINT8, self._comm,
                                              self._stream()), "ncclAllGather")

    def barrier(self) -> None:
        self.all_reduce(self._flag)
        self.synchronize()

    def synchronize(self) -> None:
        """Wait for the queued collectives; an asynchronous NCCL error (a peer failed) raises NcclError. Inside a
        CUDA Graph capture of a replayed step (the CUDA backend's `capturing`) there is nothing to wait for yet: the
        collectives are recorded into the graph, and the next synchronisation outside it waits."""
        if getattr(self.device, "capturing", False):
            return
        with self.guard("synchronize"):
            self.device.synchronize()
        err = ffi.new("ncclResult_t *")
        self._call(nccl.lib.ncclCommGetAsyncError(self._comm, err), "ncclCommGetAsyncError")
        if err[0] not in (nccl.SUCCESS, nccl.IN_PROGRESS):
            self._call(err[0], "a queued NCCL collective")

    def abort(self, message: str) -> None:
        try:
            sys.stderr.write(f"singa: {message}\n")
            sys.stderr.flush()
            nccl.lib.ncclCommAbort(self._comm)
            self._comm = None
        finally:
            if self._mpi_world:
                from singa import mpi

                mpi._abort_now(1)
            os._exit(1)  # a launch without MPI: this process stops; its parent sees the exit status
