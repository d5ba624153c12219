"""SINGA's `opt.DistOpt`: data-parallel training over a Communicator (MPI, or NCCL for CUDA memory).

Every rank runs the same script on its own part of the data (`singa.data.shard`), launched by `mpiexec -n N`. DistOpt
wraps the optimizer: each step, the ranks' gradients are combined through the communicator that suits the parameters'
device (`singa.communicator.select`: NCCL for CUDA memory when singa-comm-nccl is installed, else MPI), then every
rank applies the same update.

Modes (SINGA's methods):

* `backward_and_update(loss, threshold)`: gradients summed in float32 and divided by the number of ranks. Tensors of at
  most `threshold` elements are packed, in backward order, into one fused buffer of `buffSize` elements and sent as one
  message once they pass `threshold` elements (or would overflow the buffer); larger ones are sent alone. N ranks with
  batch b compute what one process computes with batch N*b (up to float rounding), and stay identical.
* `backward_and_update_half(loss, threshold, clipping, clip_Value)`: the same with the gradients sent, and summed, in
  float16: half the bytes, about three decimal digits per gradient. `clipping` first clips each gradient to
  [-clip_Value, clip_Value] (float16 overflows past 65504).
* `backward_and_partial_update(loss, threshold)`: each rank updates with its own gradient, then one partition of the
  parameters (a bucket, as above) is averaged over the ranks, in turn, one partition per step. Cheaper steps; ranks
  drift apart between the turns of a partition (the partition just averaged is identical on every rank).
* `backward_and_sparse_update(loss, threshold, spars, topK, corr)`: each rank sends only part of each gradient bucket:
  its max(1, int(spars * n)) largest entries (topK=True) or the entries of magnitude >= spars (topK=False). The sum of
  what every rank sent, divided by the number of ranks, is the update's gradient on every rank (so parameters stay
  identical). With corr=True each rank keeps what it did not send and adds it to the next step's gradient (local
  accumulation, the residuals of SINGA's sparsification).

The lower-level calls (`all_reduce`, `fused_all_reduce`, `all_reduce_half`, `fused_all_reduce_half`,
`sparsification`, `fused_sparsification`, `wait`, `update`) keep SINGA's meaning: sums, not averages; `update`
divides by the number of ranks.

First step. Before the first collective of a step with a new parameter set, the ranks compare their parameters'
shapes and dtypes (a mismatch raises `DistributedError` on every rank, naming the parameter and the ranks) and the
parameters not yet broadcast are overwritten with rank 0's. `Model.compile` broadcasts the model's states right away,
so that the first step already starts from identical parameters; a plain autograd loop can call
`broadcast_parameters` itself.

Graph mode. Every communication step (staging into the fused buffer, the collective, the averaging, the copy back) is
one `singa.graph.external` call, so a recorded `train_one_batch` replays its collectives in order; the partition that
partial update averages is chosen when the call runs, so replays keep turning through the partitions.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from singa import autograd, graph, ops
from singa import dtypes as _dt
from singa.backend import Device, numel
from singa.communicator import Communicator, World, _scale, select
from singa.tensor import Tensor

__all__ = ["DistOpt", "DistributedError", "buckets"]

DEFAULT_THRESHOLD = 2097152


class DistributedError(ValueError):
    """The ranks disagree about what they train (parameter count, shapes or dtypes)."""


def buckets(sizes: Sequence[int], threshold: int, capacity: int) -> list[tuple[bool, list[int]]]:
    """How tensors of `sizes` (in order) are sent: a list of (fused, positions).

    A tensor of more than `threshold` elements (or more than `capacity`) goes alone (fused=False); smaller ones are
    packed in order into a fused bucket that is closed once it holds more than `threshold` elements, or before the next
    tensor would take it past `capacity` elements (the fused buffer's size).
    """
    out: list[tuple[bool, list[int]]] = []
    cur: list[int] = []
    acc = 0
    for i, n in enumerate(sizes):
        if n > threshold or n > capacity:
            out.append((False, [i]))
            continue
        if acc + n > capacity:
            out.append((True, cur))
            cur, acc = [], 0
        cur.append(i)
        acc += n
        if acc > threshold:
            out.append((True, cur))
            cur, acc = [], 0
    if cur:
        out.append((True, cur))
    return out


class _RunState:
    """What changes from step to step (kept out of DistOpt's plain attributes, which a recorded graph bakes in)."""

    def __init__(self) -> None:
        self.checked: tuple | None = None  # ids of the parameters last compared across ranks
        self.synced: dict[int, weakref.ref] = {}  # id -> tensor broadcast from rank 0
        self.buffers: dict[int, Tensor] = {}  # dtype -> fused buffer of buffSize elements
        self.staged: dict[int, list] = {}  # dtype -> tensors fused_all_reduce(send=False) queued
        self.partial = 0  # the partition backward_and_partial_update averages next
        self.partial_layout: tuple | None = None
        self.residuals: dict[tuple, Tensor] = {}  # (layout, bucket) -> what sparse updates kept back
        self.residual_layout: tuple | None = None


class DistOpt:
    """Data-parallel wrapper of an optimizer (SINGA's signature).

    opt          the optimizer every rank applies (default SGD())
    nccl_id      SINGA's launch without MPI: an id from `singa_comm_nccl.NcclIdHolder()` shared by processes that
                 give their own local_rank and the world_size (one machine); None: the world comes from mpiexec
    local_rank, world_size   with nccl_id, this process's rank and the number of processes; without, they are taken
                 from MPI and, when given, must agree with it
    buffSize     elements of each fused buffer (one per transfer dtype)
    communicator a communicator name ("mpi", "nccl") instead of the choice by device

    Attributes: world_size, local_rank (on this machine: pick the GPU with it), global_rank, communicator (created at
    the first collective, for the parameters' device). Anything else (lr, step_counter, ...) is the wrapped
    optimizer's.
    """

    def __init__(self, opt: Any = None, nccl_id: Any = None, local_rank: int | None = None,
                 world_size: int | None = None, buffSize: int = 4194304, *, communicator: str | None = None):
        from singa import opt as opt_module

        if opt is None:
            opt = opt_module.SGD()
        if not isinstance(opt, opt_module.Optimizer):
            raise TypeError(f"DistOpt: opt must be a singa.opt.Optimizer, got {type(opt).__name__}")
        if getattr(opt, "loss_scale", None) is not None:
            raise ValueError("DistOpt: an optimizer with loss_scale is not supported (its overflow check is per "
                             "rank); use backward_and_update_half(clipping=True) for float16 transfers")
        if int(buffSize) < 1:
            raise ValueError(f"DistOpt: buffSize must be a positive number of elements, got {buffSize}")
        self.opt = opt
        self.buffSize = int(buffSize)
        self._name = communicator
        self._options: dict[str, Any] = {}
        if nccl_id is not None:
            if local_rank is None or world_size is None:
                raise ValueError("DistOpt: with nccl_id, give local_rank and world_size too (one process per GPU of "
                                 "one machine, launched without MPI)")
            if not 0 <= int(local_rank) < int(world_size):
                raise ValueError(f"DistOpt: local_rank {local_rank} is not a rank of a world of {world_size}")
            self._name = communicator or "nccl"
            self._options = {"nccl_id": nccl_id}
            world = World(int(local_rank), int(world_size), int(local_rank), int(world_size))
        else:
            from singa import mpi

            world = mpi.world()
            for what, given, actual in (("world_size", world_size, world.size),
                                        ("local_rank", local_rank, world.local_rank)):
                if given is not None and int(given) != actual:
                    raise ValueError(f"DistOpt: {what}={given}, but mpiexec started this process with {what} "
                                     f"{actual} (leave it out, or pass nccl_id for a launch without MPI)")
        self._world = world
        self.world_size = world.size
        self.local_rank = world.local_rank
        self.global_rank = world.rank
        self.communicator: Communicator | None = None
        self._run = _RunState()

    def __repr__(self) -> str:
        return f"DistOpt({self.opt!r}, rank {self.global_rank} of {self.world_size})"

    def __getattr__(self, name: str) -> Any:
        # only for names DistOpt itself lacks: the wrapped optimizer's (lr, step_counter, ...)
        if name.startswith("__") or name in ("opt", "_run"):
            raise AttributeError(name)
        return getattr(self.opt, name)

    # -- the wrapped optimizer -----------------------------------------------------------------------------------
    def __call__(self, loss: Tensor) -> None:
        self.backward_and_update(loss)

    def update(self, param: Tensor, grad: Tensor) -> None:
        """Update `param` from a gradient summed over the ranks: divided by world_size (in place), then applied."""
        if self.world_size > 1:
            ops.mul(grad, 1.0 / self.world_size, out=grad)
        self.opt.update(param, grad)

    def step(self) -> None:
        self.opt.step()

    def get_states(self) -> dict[str, Tensor]:
        return self.opt.get_states()

    def set_states(self, states: Any) -> None:
        self.opt.set_states(states)

    # -- communicator --------------------------------------------------------------------------------------------
    def _comm(self, device: Device) -> Communicator:
        c = self.communicator
        if c is None:
            factory = select(device, self._name)
            with graph.no_record():
                c = factory.create(device, self._world, **self._options)
            self.communicator = c
        elif c.device is not device:
            raise ValueError(f"DistOpt: a tensor on {device.name}, but this DistOpt communicates on {c.device.name} "
                             "(one DistOpt trains the parameters of one device)")
        return c

    def _buffer(self, c: Communicator, dtype: int) -> Tensor:
        buf = self._run.buffers.get(dtype)
        if buf is None:
            with graph.no_record():
                buf = ops.empty((self.buffSize,), dtype, c.device)
            self._run.buffers[dtype] = buf
        return buf

    def barrier(self, device: Device | None = None) -> None:
        """Wait for every rank (through the communicator, or MPI's world before there is one)."""
        if self.communicator is None and device is not None:
            self._comm(device)
        if self.communicator is not None:
            self.communicator.barrier()
        elif self.world_size > 1:
            from singa import mpi

            mpi._mpi().COMM_WORLD.Barrier()

    # -- SINGA's collectives (sums, in place; recorded as one call each in graph mode) ---------------------------------
    def all_reduce(self, tensor: Tensor) -> None:
        """Sum `tensor` over the ranks, in place."""
        c = self._comm(tensor.device)
        graph.external("all_reduce", c.all_reduce, (tensor,), reads=(0,), writes=(0,))

    def fused_all_reduce(self, tensor: Sequence[Tensor], send: bool = True) -> None:
        """SINGA's fused all-reduce of a list of tensors: send=False queues them for the fused buffer; send=True sends
        everything queued and these tensors as one float32 message and writes the sums back."""
        self._queue_or_send(list(tensor), send, _dt.float32)

    def all_reduce_half(self, tensor: Tensor) -> None:
        """Sum `tensor` over the ranks with a float16 transfer (cast, all-reduce, cast back), in place."""
        c = self._comm(tensor.device)
        self._send(c, [tensor], False, _dt.float16, 1.0)

    def fused_all_reduce_half(self, tensor: Sequence[Tensor], send: bool = True) -> None:
        """fused_all_reduce with a float16 fused buffer."""
        self._queue_or_send(list(tensor), send, _dt.float16)

    def sparsification(self, tensor: Tensor, accumulation: Tensor | None, spars: float, topK: bool) -> None:
        """Replace `tensor` by the sum over the ranks of each rank's sparse part of it (see the module doc); with
        `accumulation` the part is chosen from tensor + accumulation, and accumulation keeps the rest."""
        c = self._comm(tensor.device)
        self._sparse(c, [tensor], False, spars, topK, accumulation, 1.0)

    def fused_sparsification(self, tensor: Sequence[Tensor], accumulation: Tensor | None, spars: float,
                             topK: bool) -> None:
        """sparsification of several tensors as one (accumulation holds as many elements as they do together)."""
        ts = list(tensor)
        if ts:
            c = self._comm(ts[0].device)
            self._sparse(c, ts, True, spars, topK, accumulation, 1.0)

    def wait(self) -> None:
        """Wait for the collectives issued so far (NCCL queues them on the device's stream; MPI's have returned)."""
        c = self.communicator
        if c is not None:
            graph.external("wait", c.synchronize, ())

    def broadcast_parameters(self, tensors: Sequence[Tensor], root: int = 0) -> None:
        """Overwrite each tensor with rank `root`'s, on every rank, after checking that the ranks hold the same
        shapes and dtypes (Model.compile calls it with the model's states)."""
        ts = list(tensors)
        if not ts:
            return
        c = self._comm(ts[0].device)
        with graph.no_record():
            self._check_same(c, ts, "tensor")
            for t in ts:
                graph.external("broadcast", lambda v, c=c: c.broadcast(v, root), (t,), reads=(0,), writes=(0,))
                self._run.synced[id(t)] = weakref.ref(t)

    # -- the training steps ----------------------------------------------------------------------------------------
    def backward_and_update(self, loss: Tensor, threshold: int = DEFAULT_THRESHOLD) -> None:
        """Backward, fp32 all-reduce of the gradients (fused below `threshold` elements), averaged update."""
        pairs = self._backward(loss)
        if pairs:
            c = self._comm(pairs[0][0].device)
            grads = [g for _, g in pairs]
            for fused, pos in buckets([g.size() for g in grads], threshold, self.buffSize):
                self._send(c, [grads[i] for i in pos], fused, _dt.float32, 1.0 / self.world_size)
        self._apply(pairs)

    def backward_and_update_half(self, loss: Tensor, threshold: int = DEFAULT_THRESHOLD, clipping: bool = False,
                                 clip_Value: float = 100) -> None:
        """backward_and_update with float16 transfers; `clipping` clips each gradient to [-clip_Value, clip_Value]
        first."""
        pairs = self._backward(loss)
        if pairs:
            c = self._comm(pairs[0][0].device)
            grads = [g for _, g in pairs]
            if clipping:
                for g in grads:
                    ops.clip(g, -float(clip_Value), float(clip_Value), out=g)
            for fused, pos in buckets([g.size() for g in grads], threshold, self.buffSize):
                self._send(c, [grads[i] for i in pos], fused, _dt.float16, 1.0 / self.world_size)
        self._apply(pairs)

    def backward_and_partial_update(self, loss: Tensor, threshold: int = DEFAULT_THRESHOLD) -> None:
        """Local update with this rank's gradient, then one parameter partition averaged over the ranks (in turn)."""
        pairs = self._backward(loss)
        for p, g in pairs:
            self.opt.update(p, g)
        if pairs:
            c = self._comm(pairs[0][0].device)
            params = [p for p, _ in pairs]
            layout = buckets([p.size() for p in params], threshold, self.buffSize)
            run = self._run
            key = (tuple(id(p) for p in params), threshold)
            if run.partial_layout != key:
                run.partial_layout, run.partial = key, 0
            scale = 1.0 / self.world_size

            def average_next(*views: Any) -> None:
                if getattr(c.device, "capturing", False):  # a device graph would replay one partition forever
                    raise RuntimeError("partial update chooses its partition at run time: not capturable")
                k = run.partial % len(layout)
                run.partial = (k + 1) % len(layout)
                fused, pos = layout[k]
                self._transfer(c, [views[i] for i in pos], fused, _dt.float32, scale)

            every = tuple(range(len(params)))
            graph.external("partial_all_reduce", average_next, params, reads=every, writes=every)
            self.wait()
        self.opt.step()

    def backward_and_sparse_update(self, loss: Tensor, threshold: int = DEFAULT_THRESHOLD, spars: float = 0.05,
                                   topK: bool = False, corr: bool = True) -> None:
        """Backward, sparse all-reduce of each gradient bucket (top-K fraction or magnitude threshold `spars`; corr:
        local accumulation of what was not sent), averaged update."""
        pairs = self._backward(loss)
        if pairs:
            c = self._comm(pairs[0][0].device)
            grads = [g for _, g in pairs]
            layout = buckets([g.size() for g in grads], threshold, self.buffSize)
            run = self._run
            key = (tuple(id(p) for p, _ in pairs), threshold)
            if run.residual_layout != key:
                run.residual_layout, run.residuals = key, {}
            for k, (fused, pos) in enumerate(layout):
                group = [grads[i] for i in pos]
                res = self._residual(c, k, sum(g.size() for g in group)) if corr else None
                self._sparse(c, group, fused, spars, topK, res, 1.0 / self.world_size)
        self._apply(pairs)

    # -- internals -------------------------------------------------------------------------------------------------
    def _backward(self, loss: Tensor) -> list[tuple[Tensor, Tensor]]:
        graph.set_phase("backward")
        pairs = list(autograd.backward(loss))
        graph.set_phase("update")
        if pairs:
            self._prepare(pairs)
        return pairs

    def _apply(self, pairs: list) -> None:
        if pairs:
            self.wait()  # NCCL: the sums are queued on the stream; a peer's failure surfaces here, under the timeout
        for p, g in pairs:
            self.opt.update(p, g)
        self.opt.step()

    def _prepare(self, pairs: list) -> None:
        """At the first step with this parameter set: compare it across ranks, broadcast what rank 0 has not sent."""
        run = self._run
        key = tuple(id(p) for p, _ in pairs)
        if run.checked == key:
            return
        dev = pairs[0][0].device
        for p, _ in pairs:
            if p.device is not dev:
                raise ValueError(f"DistOpt: parameters on {dev.name} and {p.device.name}; one DistOpt trains the "
                                 "parameters of one device")
        c = self._comm(dev)
        params = [p for p, _ in pairs]
        with graph.no_record():
            self._check_same(c, params, "parameter")
            fresh = []
            for p in params:
                ref = run.synced.get(id(p))
                if ref is None or ref() is not p:
                    fresh.append(p)
            for p in fresh:
                graph.external("broadcast", lambda v, c=c: c.broadcast(v, 0), (p,), reads=(0,), writes=(0,))
                run.synced[id(p)] = weakref.ref(p)
        run.checked = key

    def _check_same(self, c: Communicator, tensors: list, what: str) -> None:
        mine = [[t.name if isinstance(t.name, str) and t.name else f"#{i}", list(t.shape), _dt.name(t.dtype)]
                for i, t in enumerate(tensors)]
        everyone = c.all_gather_object(mine)
        base = everyone[0]
        problems = []
        for r, theirs in enumerate(everyone[1:], start=1):
            if len(theirs) != len(base):
                problems.append(f"rank 0 has {len(base)} {what}s, rank {r} has {len(theirs)}")
            for i, (a, b) in enumerate(zip(base, theirs)):
                if a[1:] != b[1:]:
                    problems.append(f"{what} {i} ({a[0]!r} on rank 0, {b[0]!r} on rank {r}) is {a[2]} "
                                    f"{tuple(a[1])} on rank 0 but {b[2]} {tuple(b[1])} on rank {r}")
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise DistributedError(f"DistOpt: the ranks do not hold the same {what}s: " + "; ".join(problems[:5])
                                   + more + " (every rank must build the same model)")

    def _queue_or_send(self, ts: list, send: bool, dtype: int) -> None:
        queued = self._run.staged.setdefault(dtype, [])
        for t in ts:
            if not any(q is t for q in queued):
                queued.append(t)
        if send and queued:
            self._run.staged[dtype] = []
            c = self._comm(queued[0].device)
            self._send(c, queued, True, dtype, 1.0)

    def _send(self, c: Communicator, group: list, fused: bool, dtype: int, scale: float) -> None:
        """One message: `group` summed over the ranks in `dtype`, times `scale`, written back (one graph call)."""
        every = tuple(range(len(group)))
        graph.external("fused_all_reduce" if fused else "all_reduce",
                       lambda *views: self._transfer(c, views, fused, dtype, scale), group, reads=every, writes=every)

    def _transfer(self, c: Communicator, views: Sequence, fused: bool, dtype: int, scale: float) -> None:
        if fused:
            c.fused_all_reduce(views, self._buffer(c, dtype), scale)
        elif views[0].dtype == dtype:
            c.all_reduce(views[0])
            if scale != 1.0:
                _scale(views[0], scale)
        else:  # a tensor too large for the fused buffer, sent in another dtype: through a temporary of its size
            c.fused_all_reduce(views, ops.empty((numel(views[0].shape),), dtype, c.device), scale)

    def _residual(self, c: Communicator, k: int, n: int) -> Tensor:
        res = self._run.residuals.get(k)
        if res is None:
            with graph.no_record():
                res = ops.full((n,), 0, _dt.float32, c.device)
            self._run.residuals[k] = res
        return res

    def _sparse(self, c: Communicator, group: list, fused: bool, spars: float, topk: bool, residual: Tensor | None,
                scale: float) -> None:
        spars, topk = float(spars), bool(topk)
        n = len(group)
        args = (*group, residual) if residual is not None else tuple(group)
        every = tuple(range(len(args)))

        def run(*views: Any) -> None:
            xs, res = (views[:n], views[n]) if residual is not None else (views, None)
            if not fused and xs[0].dtype == _dt.float32:
                c.sparse_all_reduce(xs[0], spars, topk, res)
                if scale != 1.0:
                    _scale(xs[0], scale)
            else:
                buf = self._buffer(c, _dt.float32) if fused else ops.empty((numel(xs[0].shape),), _dt.float32,
                                                                         c.device)
                c.fused_sparse_all_reduce(xs, buf, spars, topk, res, scale)

        graph.external("sparse_all_reduce", run, args, reads=every, writes=every)
