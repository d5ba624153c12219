"""The MPI communicator (entry point `mpi` in `singa.communicators`), through mpi4py: `pip install singa-core[mpi]`.

Launch with an MPI launcher, every rank running the same script:

    mpiexec -n 4 python train.py

The world is MPI_COMM_WORLD (rank, size) and, for the local rank, its split by shared-memory node. Importing this module
costs nothing: mpi4py (which initialises MPI) is imported at the first `world()` or `create()`.

Memory. The CPU backend's buffers are host memory (`Device.host_memory`): MPI reads and writes them in place, without
a copy. Any other backend is staged: the view is copied to a host array (`Device.read`), reduced there, and written
back (`Device.write`). float16 sums use a user-defined MPI operation (MPI has no half type); the other collectives
move bytes.

Faults. Once a world of more than one rank exists, an uncaught exception on any rank prints its traceback and the
rank, then calls MPI_Abort, which stops every rank (mpiexec names the rank too); a rank that dies is reported by
mpiexec, which stops the others. Collectives are guarded by SINGA_COMM_TIMEOUT (see `singa.communicator`).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import numpy as np

from singa import dtypes, hookimpl
from singa.backend import Device, numel
from singa.communicator import NATIVE, STAGED, Communicator, CommunicatorError, CommunicatorFactory, World

__all__ = ["MpiFactory", "MpiCommunicator", "world", "singa_communicator"]

_INSTALL = ("the MPI communicator needs mpi4py and an MPI library: `pip install singa-core[mpi]` and, on Debian or "
            "Ubuntu, `apt-get install openmpi-bin libopenmpi-dev`")

_world: World | None = None
_f16_sum = None


def _mpi():
    """mpi4py's MPI module (initialises MPI on first use)."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise CommunicatorError(f"{_INSTALL} ({exc})") from None
    return MPI


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("singa-core")
    except Exception:  # noqa: BLE001 - running from a source tree without metadata
        return "0+unknown"


def world() -> World:
    """This process's World in MPI_COMM_WORLD (collective the first time: every rank calls it)."""
    global _world
    if _world is None:
        MPI = _mpi()
        comm = MPI.COMM_WORLD
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
        try:
            _world = World(comm.rank, comm.size, node.rank, node.size)
        finally:
            node.Free()
        if comm.size > 1:
            _abort_on_uncaught(comm.rank, comm.size)
    return _world


def _abort_now(code: int = 1) -> None:
    _mpi().COMM_WORLD.Abort(code)


def _abort_on_uncaught(rank: int, size: int) -> None:
    """An uncaught exception on one rank would leave the others waiting in a collective: abort the job instead."""
    previous = sys.excepthook

    def hook(kind, value, tb) -> None:
        try:
            previous(kind, value, tb)
            sys.stderr.write(f"singa: rank {rank} of {size} stopped on an uncaught {kind.__name__}: {value}; "
                             "aborting every rank\n")
            sys.stderr.flush()
        finally:
            _abort_now(1)

    sys.excepthook = hook


def _float16_sum():
    """MPI has no half type: a commutative user operation over 2-byte elements, added as float16 by numpy."""
    global _f16_sum
    if _f16_sum is None:
        MPI = _mpi()

        def add(inbuf, inoutbuf, datatype) -> None:
            acc = np.frombuffer(inoutbuf, np.float16)
            acc += np.frombuffer(inbuf, np.float16)

        _f16_sum = MPI.Op.Create(add, commute=True)
    return _f16_sum


class MpiCommunicator(Communicator):
    """MPI collectives (on a duplicate of MPI_COMM_WORLD) over one device's memory."""

    name = "mpi"

    def __init__(self, device: Device, world: World):
        super().__init__(device, world)
        MPI = _mpi()
        self._MPI = MPI
        with self.guard("MPI_Comm_dup"):  # collective: a rank that never gets here must not hang the others
            self.comm = MPI.COMM_WORLD.Dup()  # our traffic never matches a user's own messages
        self.zero_copy = bool(getattr(device, "host_memory", False))
        self._aliases: dict[tuple, tuple] = {}

    # -- host access to a view -----------------------------------------------------------------------------------
    def _host(self, x) -> tuple[np.ndarray, np.ndarray | None]:
        """(a numpy array MPI can use, the staged host copy or None when it is the view's own memory)."""
        if self.zero_copy:
            return self._alias(x), None
        host = np.ascontiguousarray(self.device.read(x)).reshape(-1)
        return host, host

    def _alias(self, x) -> np.ndarray:
        """A 1-d numpy array over the view's own memory, cached per (buffer, offset, size, dtype): a training step
        sends the same views every time, and mpi4py takes a numpy array fastest."""
        buf = x.buffer
        n = numel(x.shape)
        key = (id(buf), x.offset, n, x.dtype)
        hit = self._aliases.get(key)
        if hit is not None and hit[0]() is buf:
            return hit[1]
        if len(self._aliases) > 1024:
            self._aliases.clear()
        arr = np.frombuffer(self.device.host_buffer(x), dtypes.to_numpy_dtype(x.dtype))
        self._aliases[key] = (weakref.ref(buf), arr)
        return arr

    def _done(self, x, staged: np.ndarray | None) -> None:
        if staged is not None:
            self.device.write(x, staged.reshape(x.shape))

    # -- the collectives -------------------------------------------------------------------------------------------
    def _all_reduce(self, x) -> None:
        MPI = self._MPI
        buf, staged = self._host(x)
        if x.dtype == dtypes.float16:
            self.comm.Allreduce(MPI.IN_PLACE, [buf.view(np.uint16), MPI.UINT16_T], op=_float16_sum())
        else:
            self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        self._done(x, staged)

    def _broadcast(self, x, root: int) -> None:
        buf, staged = self._host(x)
        self.comm.Bcast([buf.view(np.uint8), self._MPI.BYTE], root=root)
        self._done(x, staged)

    def _all_gather(self, out, x) -> None:
        MPI = self._MPI
        src, _ = self._host(x)
        dst, staged = self._host(out)
        self.comm.Allgather([src.view(np.uint8), MPI.BYTE], [dst.view(np.uint8), MPI.BYTE])
        self._done(out, staged)

    def barrier(self) -> None:
        with self.guard("barrier"):
            self.comm.Barrier()

    def abort(self, message: str) -> None:
        try:
            sys.stderr.write(f"singa: {message}\n")
            sys.stderr.flush()
        finally:
            _abort_now(1)  # MPI_COMM_WORLD: every process of the job

    def all_gather_object(self, obj: Any) -> list:
        """Every rank's JSON value, in rank order (host messages only: no device memory is used)."""
        import json

        with self.guard("all_gather_object"):
            texts = self.comm.allgather(json.dumps(obj, sort_keys=True))
        return [json.loads(t) for t in texts]

    def sparse_all_reduce(self, x, spars: float, topk: bool, residual=None) -> None:
        """As `Communicator.sparse_all_reduce`, the pairs exchanged by MPI_Allgatherv on host arrays (no padding)."""
        from singa.communicator import _accumulate, select_sparse

        self._check("sparse_all_reduce", x)
        if residual is not None:
            self._check("sparse_all_reduce", residual, "residual")
        MPI = self._MPI
        dev = self.device
        n = numel(x.shape)
        npdt = dtypes.to_numpy_dtype(x.dtype)
        if self.zero_copy:
            v = self._alias(x)
        else:
            v = dev.read(x).reshape(-1)
        if residual is not None:
            r = self._alias(residual) if self.zero_copy else dev.read(residual).reshape(-1)
            v = v + r
        idx = select_sparse(v, spars, topk)
        if residual is not None:
            rest = v.copy()
            rest[idx] = 0
            if self.zero_copy:
                r[:] = rest
            else:
                dev.write(residual, rest.reshape(residual.shape))
        vals = np.ascontiguousarray(v[idx])
        with self.guard("sparse_all_reduce"):
            counts = np.array(self.comm.allgather(len(idx)), np.int64)
            all_i = np.empty(int(counts.sum()), np.int32)
            all_v = np.empty(int(counts.sum()), npdt)
            displ = np.concatenate([[0], np.cumsum(counts)[:-1]])
            self.comm.Allgatherv([idx, MPI.INT32_T], [all_i, (counts, displ), MPI.INT32_T])
            self.comm.Allgatherv([vals.view(np.uint8), MPI.BYTE],
                                 [all_v.view(np.uint8), (counts * npdt.itemsize, displ * npdt.itemsize), MPI.BYTE])
        total = _accumulate(n, [(all_i[d:d + c], all_v[d:d + c]) for d, c in zip(displ, counts)], npdt)
        if self.zero_copy:
            self._alias(x)[:] = total
        else:
            dev.write(x, total.reshape(x.shape))


class MpiFactory(CommunicatorFactory):
    name = "mpi"
    distribution = "singa-core"
    version = _version()

    def status(self) -> str | None:
        import importlib.util

        if importlib.util.find_spec("mpi4py") is None:
            return _INSTALL
        return None

    def memory(self, device: Device) -> str | None:
        return NATIVE if getattr(device, "host_memory", False) else STAGED

    def world(self) -> World:
        return world()

    def create(self, device: Device, world: World, **options: Any) -> MpiCommunicator:
        if options:
            raise TypeError(f"the mpi communicator takes no options, got {', '.join(sorted(options))}")
        return MpiCommunicator(device, world)

    def info(self) -> dict[str, str]:
        import importlib.util

        if importlib.util.find_spec("mpi4py") is None:
            return {"status": _INSTALL}
        from importlib.metadata import version

        # the MPI library itself is named only once MPI is initialised (which `info` must not do)
        return {"mpi4py": version("mpi4py"), "memory": "zero-copy on host-memory devices (cpu), staged elsewhere"}


@hookimpl
def singa_communicator() -> MpiFactory:
    return MpiFactory()
