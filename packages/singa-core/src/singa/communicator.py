"""The Communicator protocol: collectives over device memory for data-parallel training (`singa.opt.DistOpt`).

A communicator plugin is a module named by an entry point in the `singa.communicators` group whose `singa_communicator`
hook returns a `CommunicatorFactory` (see `singa.hookspecs`). singa-core ships one, `mpi` (`singa.mpi`, through mpi4py:
`pip install singa-core[mpi]`); singa-comm-nccl adds `nccl` for CUDA memory.

A factory says which devices' memory its communicators work on (`memory(device)`): "native" when the collectives run
on the device's own memory (NCCL on CUDA buffers, MPI on the CPU backend's buffers, which are host memory), "staged"
when they go through host copies (`Device.read` / `Device.write`, MPI for any other backend), None when it cannot.
`select(device)` picks a native factory first, then a staged one.

A `Communicator` is one process's end of a group of `world_size` ranks, bound to one device. Its collectives take
contiguous views (Tensors or `singa.backend.View`s) of that device's memory and are *eager*: when a call returns, the
result is in place (or, for NCCL, queued on the device's stream, ordered before every later kernel; `synchronize()`
waits for it). Each one is guarded by a timeout (`SINGA_COMM_TIMEOUT` seconds, default 600, 0 turns it off): a
collective that a dead or stuck rank never joins stops the whole job with an error naming this rank and the call,
instead of hanging.

Every rank must call the collectives in the same order with matching shapes and dtypes, as in MPI; `DistOpt` checks
its parameters across ranks at its first step for that reason.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from singa import dtypes
from singa.backend import Device, DistributionVersion, is_contiguous, numel

__all__ = ["World", "CommunicatorError", "CommunicatorFactory", "Communicator", "select", "factories", "NATIVE",
           "STAGED", "DEFAULT_TIMEOUT", "timeout_seconds", "select_sparse"]

NATIVE = "native"
STAGED = "staged"
DEFAULT_TIMEOUT = 600.0  # seconds a collective may wait for the other ranks


@dataclass(frozen=True)
class World:
    """Where this process stands: its rank among `size` processes, and among the `local_size` on its machine."""

    rank: int
    size: int
    local_rank: int
    local_size: int


class CommunicatorError(RuntimeError):
    """A communicator cannot be created or used; the message says which rank, device or library."""


def timeout_seconds() -> float:
    """SINGA_COMM_TIMEOUT (seconds; 0 or less: no timeout), else DEFAULT_TIMEOUT."""
    raw = os.environ.get("SINGA_COMM_TIMEOUT", "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        return float(raw)
    except ValueError:
        raise CommunicatorError(f"SINGA_COMM_TIMEOUT={raw!r} is not a number of seconds") from None


class CommunicatorFactory:
    """What a `singa.communicators` plugin returns: it describes a communicator kind and creates communicators.

    name          the name DistOpt(communicator=...) and `python -m singa info` use ("mpi", "nccl")
    distribution  the pip distribution that provides it
    version       that distribution's version (found from `distribution` unless the plugin sets it)
    """

    name: str = "?"
    distribution: str = "?"
    version = DistributionVersion()

    def status(self) -> str | None:
        """None when usable on this machine, else why not (a missing library, no device...)."""
        return None

    def memory(self, device: Device) -> str | None:
        """NATIVE, STAGED or None: how this kind's communicators reach `device`'s memory."""
        return None

    def world(self) -> World:
        """This process's rank and world, as the launcher (mpiexec) set them up."""
        raise NotImplementedError

    def create(self, device: Device, world: World, **options: Any) -> Communicator:
        """A communicator over `device` for this process (collective: every rank calls it)."""
        raise NotImplementedError

    def info(self) -> dict[str, str]:
        """Extra facts for `python -m singa info` (library versions)."""
        return {}


def factories() -> dict[str, CommunicatorFactory]:
    """The installed communicator factories, by name."""
    from singa import plugins

    return dict(plugins.registry().communicators)


def select(device: Device, name: str | None = None) -> CommunicatorFactory:
    """The factory for `device`: the one named, else a native one, else a staged one (alphabetical within each)."""
    from singa import plugins

    found = factories()
    if name is not None:
        f = found.get(name)
        if f is None:
            failed = [x for x in plugins.registry().failures if x.name == name]
            if failed:
                raise CommunicatorError(f"communicator {name!r} is installed but failed to load: {failed[0].error}")
            dist = plugins.KNOWN_DISTRIBUTIONS.get(name, f"the plugin that provides {name!r}")
            raise CommunicatorError(f"no communicator named {name!r} is installed (installed: "
                                    f"{', '.join(sorted(found)) or 'none'}); install it with `pip install {dist}`")
        if f.memory(device) is None:
            raise CommunicatorError(f"communicator {name!r} cannot work on the memory of {device.name}")
        why = f.status()
        if why is not None:
            raise CommunicatorError(f"communicator {name!r} cannot be used here: {why}")
        return f
    reasons = []
    for kind in (NATIVE, STAGED):
        for n in sorted(found):
            f = found[n]
            try:
                how = f.memory(device)
            except Exception as exc:  # noqa: BLE001 - a broken plugin must not hide a working one
                reasons.append(f"{n}: {type(exc).__name__}: {exc}")
                continue
            if how != kind:
                continue
            why = f.status()
            if why is None:
                return f
            reasons.append(f"{n}: {why}")
    if not found:
        raise CommunicatorError("no communicator is installed: `pip install singa-core[mpi]` (MPI through mpi4py)")
    detail = "; ".join(reasons) if reasons else f"none of {', '.join(sorted(found))} works on its memory"
    raise CommunicatorError(f"no usable communicator for {device.name}: {detail}")


# -- the protocol -----------------------------------------------------------------------------------------------------


class _Watchdog:
    """Stops the job when a guarded call outlives the timeout (a daemon thread that polls a deadline)."""

    def __init__(self, timeout: float, on_timeout):
        self.timeout = timeout
        self._on_timeout = on_timeout
        self._armed: tuple[int, float, str] | None = None
        self._serial = 0
        self._thread: threading.Thread | None = None

    def arm(self, what: str, serial: int) -> int:
        """Watch the call numbered `serial` (what it is, for the message)."""
        self._serial = serial
        self._armed = (serial, time.monotonic() + self.timeout, what)
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="singa-comm-watchdog", daemon=True)
            self._thread.start()
        return self._serial

    def disarm(self, serial: int) -> None:
        armed = self._armed
        if armed is not None and armed[0] == serial:
            self._armed = None

    def _watch(self) -> None:
        poll = min(1.0, max(self.timeout / 8, 0.05))
        while True:
            time.sleep(poll)
            armed = self._armed
            if armed is not None and time.monotonic() > armed[1] and self._armed is armed:
                self._on_timeout(f"{armed[2]} (collective #{armed[0]})")
                return


class Communicator:
    """One rank's end of a group, over one device's memory. Subclasses implement the `_`-prefixed collectives on
    contiguous views the public methods have checked, plus `barrier`, `synchronize` and `abort`.

    rank, world_size, local_rank, local_size: this process's place (see `World`)
    device: the device whose memory the collectives work on
    """

    name: ClassVar[str] = "?"

    def __init__(self, device: Device, world: World):
        self.device = device
        self.rank = world.rank
        self.world_size = world.size
        self.local_rank = world.local_rank
        self.local_size = world.local_size
        self.calls = 0  # collectives issued, for error messages
        timeout = timeout_seconds()
        self._watchdog = _Watchdog(timeout, self._timed_out) if timeout > 0 and world.size > 1 else None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} rank {self.rank} of {self.world_size} on {self.device.name}>"

    # -- what a subclass implements --------------------------------------------------------------------------------
    def _all_reduce(self, x) -> None:
        raise NotImplementedError

    def _broadcast(self, x, root: int) -> None:
        raise NotImplementedError

    def _all_gather(self, out, x) -> None:
        raise NotImplementedError

    def barrier(self) -> None:
        """Return when every rank has called barrier()."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait until every collective issued so far has completed (a no-op for blocking libraries such as MPI)."""

    def abort(self, message: str) -> None:
        """Print `message` and stop every rank of the job (never returns)."""
        raise NotImplementedError

    # -- the collectives --------------------------------------------------------------------------------------------
    def all_reduce(self, x) -> None:
        """Sum `x` over the ranks, in place (float32, float16, float64, int32, int64)."""
        self._check("all_reduce", x)
        if x.dtype == dtypes.bool_:
            raise TypeError(f"{self.name} all_reduce: cannot sum a bool tensor (rank {self.rank})")
        if not numel(x.shape):
            return
        self.calls += 1  # guard(), inlined: this is the per-step hot path
        dog = self._watchdog
        if dog is None:
            self._all_reduce(x)
            return
        serial = dog.arm("all_reduce", self.calls)
        try:
            self._all_reduce(x)
        finally:
            dog.disarm(serial)

    def broadcast(self, x, root: int = 0) -> None:
        """Overwrite `x` on every rank with rank `root`'s `x`."""
        self._check("broadcast", x)
        if not 0 <= root < self.world_size:
            raise ValueError(f"{self.name} broadcast: root {root} is not a rank of a world of {self.world_size}")
        if numel(x.shape):
            with self.guard("broadcast"):
                self._broadcast(x, root)

    def all_gather(self, out, x) -> None:
        """`out` (world_size * x.size elements, same dtype) receives every rank's `x`, in rank order."""
        self._check("all_gather", x)
        self._check("all_gather", out, "out")
        if out.dtype != x.dtype or numel(out.shape) != self.world_size * numel(x.shape):
            raise ValueError(f"{self.name} all_gather: out is {dtypes.name(out.dtype)} {out.shape}; it must hold "
                             f"{self.world_size} x {numel(x.shape)} {dtypes.name(x.dtype)} elements (rank {self.rank})")
        if numel(x.shape):
            with self.guard("all_gather"):
                self._all_gather(out, x)

    def all_gather_object(self, obj: Any) -> list:
        """Every rank's `obj` (a JSON value: numbers, strings, lists, dicts), in rank order. For small control data
        (DistOpt's parameter check); goes through `all_gather` on this device's memory."""
        from singa import ops

        raw = json.dumps(obj, sort_keys=True).encode()
        sizes = self._gather_ints([len(raw)])[:, 0]
        width = (int(sizes.max()) + 3) // 4
        words = np.zeros(width * 4, np.uint8)
        words[:len(raw)] = np.frombuffer(raw, np.uint8)
        mine = ops.from_numpy(words.view(np.int32), self.device)
        out = ops.empty((self.world_size * width,), dtypes.int32, self.device)
        self.all_gather(out, mine)
        allw = out.to_numpy().view(np.uint8).reshape(self.world_size, width * 4)
        return [json.loads(allw[r, :int(sizes[r])].tobytes().decode()) for r in range(self.world_size)]

    # -- the fused forms DistOpt needs (written once, over the collectives above) -----------------------------------
    def fused_all_reduce(self, xs: Sequence, buffer, scale: float = 1.0) -> None:
        """All-reduce several tensors as one message: copy (or cast) them into consecutive elements of `buffer`,
        sum the used part over the ranks in `buffer`'s dtype, multiply by `scale`, write the results back (cast to each
        tensor's dtype). A float16 `buffer` is SINGA's half-precision transfer."""
        used = self._stage(xs, buffer)
        self.all_reduce(_prefix(buffer, used))
        self._finish(xs, buffer, used, scale)

    def sparse_all_reduce(self, x, spars: float, topk: bool, residual=None) -> None:
        """Sum over the ranks of each rank's *selected* entries of x (+ residual), in place.

        topk: each rank selects its max(1, int(spars * n)) entries of largest magnitude (spars is a fraction); else the
        entries whose magnitude is at least `spars` (a threshold). With `residual` (same shape and dtype) the
        selection is made from x + residual and residual keeps what was not selected (local accumulation).
        Selection runs on the host (the primitive set has no top-k or compaction kernel); the exchange sends only the
        selected (index, value) pairs, padded to the largest count of any rank, through `all_gather`.
        """
        from singa import ops

        self._check("sparse_all_reduce", x)
        if residual is not None:
            self._check("sparse_all_reduce", residual, "residual")
        dev = self.device
        n = numel(x.shape)
        v = dev.read(x).reshape(-1)
        if residual is not None:
            v = v + dev.read(residual).reshape(-1)
        idx = select_sparse(v, spars, topk)
        if residual is not None:
            rest = v.copy()
            rest[idx] = 0
            dev.write(residual, rest.reshape(residual.shape))
        counts = self._gather_ints([len(idx)])[:, 0]
        width = max(int(counts.max()), 1)
        pad_i = np.zeros(width, np.int32)
        pad_i[:len(idx)] = idx
        pad_v = np.zeros(width, v.dtype)
        pad_v[:len(idx)] = v[idx]
        all_i = ops.empty((self.world_size * width,), dtypes.int32, dev)
        all_v = ops.empty((self.world_size * width,), x.dtype, dev)
        self.all_gather(all_i, ops.from_numpy(pad_i, dev))
        self.all_gather(all_v, ops.from_numpy(pad_v, dev))
        ai = all_i.to_numpy().reshape(self.world_size, width)
        av = all_v.to_numpy().reshape(self.world_size, width)
        total = _accumulate(n, [(ai[r, :c], av[r, :c]) for r, c in enumerate(counts)], v.dtype)
        dev.write(x, total.reshape(x.shape))

    def fused_sparse_all_reduce(self, xs: Sequence, buffer, spars: float, topk: bool, residual=None,
                                scale: float = 1.0) -> None:
        """`sparse_all_reduce` of several tensors as one: staged into `buffer` (same dtype), selected and exchanged
        together (residual: as many elements as the tensors together), multiplied by `scale`, written back."""
        used = self._stage(xs, buffer)
        part = _prefix(buffer, used)
        if residual is not None and numel(residual.shape) != used:
            raise ValueError(f"{self.name} fused_sparse_all_reduce: residual has {numel(residual.shape)} elements, "
                             f"the tensors {used}")
        self.sparse_all_reduce(part, spars, topk, None if residual is None else _flat(residual))
        self._finish(xs, buffer, used, scale)

    # -- helpers ----------------------------------------------------------------------------------------------------
    @contextmanager
    def guard(self, what: str):
        """Count the call and stop the job if it outlives the timeout (around every blocking library call)."""
        self.calls += 1
        dog = self._watchdog
        if dog is None:
            yield
            return
        serial = dog.arm(what, self.calls)
        try:
            yield
        finally:
            dog.disarm(serial)

    def _timed_out(self, what: str) -> None:
        self.abort(f"rank {self.rank} of {self.world_size}: {what} did not complete within "
                   f"{self._watchdog.timeout:g} s: another rank has stopped, died or is stuck before it "
                   "(SINGA_COMM_TIMEOUT sets the limit); aborting every rank")

    def _check(self, op: str, x, what: str = "x") -> None:
        buf = getattr(x, "buffer", None)
        if buf is None:
            raise TypeError(f"{self.name} {op}: {what} must be a Tensor or a view, got {type(x).__name__}")
        if buf.device is not self.device:
            raise ValueError(f"{self.name} {op}: {what} is on {buf.device.name}, this communicator works on "
                             f"{self.device.name} (rank {self.rank})")
        if not is_contiguous(x):
            raise ValueError(f"{self.name} {op}: {what} must be contiguous (call .contiguous() first)")

    def _gather_ints(self, values: Sequence[int]) -> np.ndarray:
        """(world_size, len(values)) int64: every rank's small integers."""
        from singa import ops

        mine = ops.from_numpy(np.asarray(values, np.int64), self.device)
        out = ops.empty((self.world_size * len(values),), dtypes.int64, self.device)
        self.all_gather(out, mine)
        return out.to_numpy().reshape(self.world_size, len(values))

    def _stage(self, xs: Sequence, buffer) -> int:
        """Copy (cast) each tensor into `buffer` at consecutive element offsets; returns the elements used."""
        self._check("fused", buffer, "buffer")
        table = self.device.table
        off = 0
        cap = numel(buffer.shape)
        for x in xs:
            self._check("fused", x)
            n = numel(x.shape)
            if off + n > cap:
                raise ValueError(f"{self.name}: the tensors ({off + n} elements so far) do not fit the fused buffer of "
                                 f"{cap} elements (DistOpt's buffSize)")
            part = _slice(buffer, off, x.shape)
            table["copy" if x.dtype == buffer.dtype else "cast"](part, x)
            off += n
        return off

    def _finish(self, xs: Sequence, buffer, used: int, scale: float) -> None:
        """Scale and write back: scaled in the buffer when it has the tensors' dtype (one pass), else after the
        cast back (a float16 transfer is scaled in the tensors' own precision, as SINGA's update divides)."""
        if scale != 1.0 and all(x.dtype == buffer.dtype for x in xs):
            _scale(_prefix(buffer, used), scale)
            self._unstage(xs, buffer)
            return
        self._unstage(xs, buffer)
        if scale != 1.0:
            for x in xs:
                _scale(x, scale)

    def _unstage(self, xs: Sequence, buffer) -> None:
        table = self.device.table
        off = 0
        for x in xs:
            part = _slice(buffer, off, x.shape)
            table["copy" if x.dtype == buffer.dtype else "cast"](x, part)
            off += numel(x.shape)


def select_sparse(v: np.ndarray, spars: float, topk: bool) -> np.ndarray:
    """Indices (sorted, int32) of the entries of 1-d `v` that a sparse all-reduce sends: the max(1, int(spars * n))
    largest magnitudes with `topk`, else those with |v| >= spars."""
    n = v.size
    mag = np.abs(v.astype(np.float32, copy=False))
    if topk:
        if not spars > 0:
            raise ValueError(f"sparse all-reduce: top-K needs a fraction spars > 0, got {spars}")
        k = min(n, max(1, int(spars * n)))
        idx = np.arange(n) if k == n else np.argpartition(-mag, k - 1)[:k]
    else:
        if not spars >= 0:
            raise ValueError(f"sparse all-reduce: the threshold spars must be >= 0, got {spars}")
        idx = np.flatnonzero(mag >= spars)
    return np.sort(idx).astype(np.int32)


def _accumulate(n: int, pairs: Sequence[tuple[np.ndarray, np.ndarray]], dtype) -> np.ndarray:
    """Dense sum of every rank's (indices, values), in rank order (so every rank computes the same bits)."""
    acc = np.zeros(n, np.float64 if dtype == np.float64 else np.float32)
    for idx, vals in pairs:
        acc[idx] += vals  # indices are unique within one rank
    return acc.astype(dtype, copy=False)


def _view(buffer, dtype: int, shape: tuple, offset: int):
    from singa.backend import View

    return View(buffer, dtype, shape, None, offset)


def _slice(buffer_view, off: int, shape: tuple):
    return _view(buffer_view.buffer, buffer_view.dtype, tuple(shape), buffer_view.offset + off)


def _prefix(buffer_view, n: int):
    return _view(buffer_view.buffer, buffer_view.dtype, (n,), buffer_view.offset)


def _flat(x):
    return _view(x.buffer, x.dtype, (numel(x.shape),), x.offset)


def _scale(view, factor: float) -> None:
    """view *= factor, with the device's kernel."""
    from singa import ops

    t = ops._wrap(view.buffer, view.dtype, tuple(view.shape), tuple(view.strides), view.offset, view.buffer.device)
    ops.mul(t, factor, out=t)
