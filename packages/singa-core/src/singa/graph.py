"""Graph mode: record the kernel calls of one step, then replay them without re-running Python.

Recording. While a `Recorder` is active, every kernel called on its device by its thread is kept (other threads'
calls are not: see `_DeviceHooks`, which puts dispatchers in place of the entries of every device's kernel table and
of the device's `alloc`, `write`, `write_strided`, `read` and `copy_view`). The step runs eagerly as usual; each
kernel call is kept as (kernel, the views it was given, its parameters), with each view's buffer replaced by a key.
Buffers fall into three kinds:

* external: alive before the step (parameters, optimizer states, input placeholders); the graph keeps them;
* persistent: allocated during the step and still alive after it (returned outputs, lazily created states); kept;
* temporary: allocated during the step and dead at its end. Their memory is planned (see below).

Host traffic decides whether a step can be replayed faithfully. A host write of constant data into a buffer made in
the step (a constant built from numpy) is recorded and re-written at each replay; a host *read* of device data
(`to_numpy`, `item`, `print(t)`) or a host write into an external tensor (`copy_from_numpy` inside the step) makes
the recording unusable: `finish` raises `GraphUnsupported` naming the place, and the caller runs eagerly instead.
Kernels that run on another device, or reads inside the core's host fallback, are handled the same way (the
fallback's own reads are part of one kernel call and are ignored). A `host_check` (the core's validation of device
data, such as class labels) is kept as a call of its own and runs again at every replay.

External calls. `external(name, fn, args, reads, writes)` runs a Python function over views that is not a kernel (a
collective of a communicator: MPI or NCCL traffic, with whatever staging it needs) and, inside a recording, records
it as one call: a replay calls `fn` again on the rebuilt views. What `fn` does inside (kernels, host copies,
allocations) belongs to that one call. External calls also keep their program order among themselves, so that every
rank of a distributed job replays its collectives in the same order.

Replay. `Graph.run()` calls the recorded kernels on prebuilt views: no autograd, no shape checks, no allocation.
Random kernels get a fresh `device.next_rng_offset(n)` at each replay, reserved in program order, so a replayed
step draws exactly what the eager step would have drawn. `sequential=True` keeps program order; otherwise calls are
scheduled by their dependencies (read/write sets over buffers) with a greedy order that frees memory early; both
orders compute the same values since every kernel is deterministic and sees the same inputs. A device that can
record its own work (`Device.capture`: CUDA Graphs) records the first replay of a step without random kernels, and
later replays are one launch of that device graph, after the step's host checks of its inputs (class labels) have run
on the host; a step whose host checks read data the step itself computes stays replayed from Python.

Memory planning. Temporaries are placed at byte offsets of an arena so that two temporaries share bytes only when
their live ranges (first to last call that touches them, in execution order) are disjoint: greedy by size, each
at the best-fitting gap (the approach of TFLite's arena planner). The arena is then cut into a few blocks where no
temporary straddles the cut, choosing the cuts by dynamic programming to minimise what the device's memory pool
will actually reserve (it rounds large blocks up to powers of two). Before that, an element-wise kernel's output may
take the bytes of an input that dies at that call (see `_in_place`): the two are planned as one block.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from singa import dtypes, primitives, profiling
from singa.backend import Buffer, Device, View

__all__ = ["Recorder", "Graph", "GraphUnsupported", "GraphWarning", "no_record", "set_phase", "recording", "host_check",
           "external"]

_EXTERNAL_ORDER = -1  # a pseudo buffer key every external call reads and writes: they stay in program order
_ALIGN = 64  # byte alignment of planned temporaries (a multiple of every itemsize; cache-line friendly)
_SINGA_DIR = os.path.dirname(os.path.abspath(__file__))
# SINGA_GRAPH_RECOMPUTE=0 keeps every activation a training step's backward reads instead of recomputing the cheap
# ones (see graph_recompute): for measuring what the recomputation saves and costs
_RECOMPUTE = os.environ.get("SINGA_GRAPH_RECOMPUTE", "").strip() != "0"


class GraphWarning(UserWarning):
    """Graph mode could not be used for a step (the step ran eagerly instead)."""


class GraphUnsupported(RuntimeError):
    """A recorded step cannot be replayed faithfully; the message says why and where."""


class _ThreadState(threading.local):
    active: Recorder | None = None  # the recorder of this thread, if it is recording a step


_tls = _ThreadState()


def recording() -> Recorder | None:
    """The recorder now active in the calling thread, if any."""
    return _tls.active


@contextlib.contextmanager
def no_record() -> Iterator[None]:
    """Run set-up work (creating optimizer states, initialising parameters) inside a recorded step without recording
    it: its kernels run once, now, and are not replayed. Buffers written here are kept as they are by the graph."""
    rec = _tls.active
    if rec is None:
        yield
        return
    rec.suspended += 1
    try:
        yield
    finally:
        rec.suspended -= 1


def external(name: str, fn: Callable[..., None], args: Sequence[Any], reads: Sequence[int] = (),
             writes: Sequence[int] = ()) -> None:
    """Call `fn(*args)` now; inside a recorded step also record it, to be called again at every replay.

    `args` are views (tensors) of the recorded device or plain values; `reads` and `writes` are the positions of the
    views `fn` reads and writes (a view may be in both). At a replay `fn` gets views rebuilt on the same memory, which
    are `singa.backend.View`s, not Tensors.
    """
    rec = _tls.active
    if rec is None or rec.depth:
        fn(*args)
        return
    rec.external(name, fn, args, reads, writes)


def set_phase(name: str) -> None:
    """Label the kernels recorded from now on (forward / backward / update), for time profiling."""
    rec = _tls.active
    if rec is not None:
        rec.phase = name


# -- recording ------------------------------------------------------------------------------------------------------


class _BufInfo:
    __slots__ = ("key", "nbytes", "ref", "strong", "in_step")

    def __init__(self, key: int, buf: Buffer, in_step: bool):
        self.key = key
        self.nbytes = buf.nbytes
        self.ref = weakref.ref(buf)
        self.strong = None if in_step else buf  # external buffers are kept by the graph
        self.in_step = in_step


class _Call:
    __slots__ = ("kind", "name", "fn", "specs", "params", "reads", "writes", "phase", "data")

    def __init__(self, kind: str, name: str, fn: Callable, specs: list, params: dict, reads: frozenset,
                 writes: frozenset, phase: str, data: np.ndarray | None = None):
        self.kind = kind  # 'kernel', 'write', 'write_strided', 'copy_view', 'external'
        self.name = name
        self.fn = fn
        self.specs = specs  # per positional argument: None, ('v', key, dtype, shape, strides, offset) or ('c', value)
        self.params = params
        self.reads = reads
        self.writes = writes
        self.phase = phase
        self.data = data

    def touched(self) -> frozenset:
        return self.reads | self.writes


def _access(name: str, specs: list, params: dict) -> tuple[frozenset, frozenset]:
    """Buffer keys read and written by a kernel call, from the primitive's contract (outputs come first)."""
    spec = primitives.SPECIAL_BY_NAME.get(name)
    if spec is None:  # element-wise: (out, inputs...)
        outs, inplace = ("out",), ()
    else:
        outs, inplace = spec.outputs, spec.inplace
    reads, writes = set(), set()
    for i, s in enumerate(specs):
        if s is None or s[0] != "v":
            continue
        key = s[1]
        if i < len(outs):
            writes.add(key)
            oname = outs[i].rstrip("?")
            if oname in inplace and not (name == "matmul" and params.get("beta", 0.0) == 0.0):
                reads.add(key)
        else:
            reads.add(key)
    return frozenset(reads), frozenset(writes)


def _draws(name: str, specs: list) -> int:
    """Draws a random kernel reserved from the generator (see ops._random): one per element, two for normals."""
    s = specs[0]
    n = 1
    for d in s[3]:
        n *= d
    return 2 * n if name == "random_normal" else n


def _where() -> str:
    """The innermost frame outside singa's own modules: where user code asked for what we cannot record."""
    frames = traceback.extract_stack()[:-2]
    for fr in reversed(frames):
        if not os.path.abspath(fr.filename).startswith(_SINGA_DIR + os.sep):
            return f"{fr.filename}:{fr.lineno} ({fr.name}: {(fr.line or '').strip()})"
    fr = frames[-1]
    return f"{fr.filename}:{fr.lineno} ({fr.name})"


class Recorder:
    """Records the kernel calls made on `device` by the calling thread while active (a context manager); `finish`
    builds the Graph.

    One recorder at a time per thread; recorders of different threads are independent (see `_hooks`).
    """

    def __init__(self, device: Device):
        self.device = device
        self.calls: list[_Call] = []
        self.infos: list[_BufInfo] = []
        self._by_id: dict[int, _BufInfo] = {}
        self.problem: str | None = None
        self.depth = 0  # > 0 inside a kernel call (its own allocations and host traffic are not the step's)
        self.suspended = 0  # > 0 inside no_record()
        self.phase = "forward"

    # -- bookkeeping ------------------------------------------------------------------------------------------------
    def _fail(self, why: str) -> None:
        if self.problem is None:
            self.problem = f"{why} at {_where()}"

    def _info(self, buf: Buffer) -> _BufInfo:
        info = self._by_id.get(id(buf))
        if info is None or info.ref() is not buf:  # never seen: it existed before the step
            info = _BufInfo(len(self.infos), buf, in_step=False)
            self.infos.append(info)
            self._by_id[id(buf)] = info
        return info

    def _spec(self, v: Any) -> tuple | None:
        if v is None:
            return None
        buf = getattr(v, "buffer", None)
        if not isinstance(buf, Buffer):
            return ("c", v)
        if buf.device is not self.device:
            self._fail(f"a tensor on {buf.device.name} used in a step recorded on {self.device.name}")
        return ("v", self._info(buf).key, v.dtype, tuple(v.shape), tuple(v.strides), int(v.offset))

    def _pin(self, keys) -> None:
        """Buffers written outside the recording keep their memory and contents (never planned)."""
        for k in keys:
            info = self.infos[k]
            if info.strong is None:
                info.strong = info.ref()

    # -- what the device hooks (below) call for this recorder's thread ----------------------------------------------
    def _kernel(self, dev: Device, name: str, fn: Callable, args: tuple, params: dict) -> Any:
        if dev is not self.device:
            if not self.depth and not self.suspended:
                self._fail(f"kernel {name!r} ran on {dev.name} inside a step recorded on {self.device.name}")
            return fn(*args, **params)
        if self.depth:
            return fn(*args, **params)
        specs = [self._spec(a) for a in args]
        reads, writes = _access(name, specs, params)
        self.depth += 1
        try:
            r = fn(*args, **params)
        finally:
            self.depth -= 1
        if self.suspended:
            self._pin(writes)
        else:
            self.calls.append(_Call("kernel", name, fn, specs, dict(params), reads, writes, self.phase))
        return r

    def external(self, name: str, fn: Callable, args: Sequence[Any], reads: Sequence[int],
                 writes: Sequence[int]) -> None:
        specs = [self._spec(a) for a in args]
        for i in (*reads, *writes):
            if specs[i] is None or specs[i][0] != "v":
                raise TypeError(f"graph.external({name!r}): argument {i} is read or written but is not a view")
        rkeys = frozenset(specs[i][1] for i in reads) | {_EXTERNAL_ORDER}
        wkeys = frozenset(specs[i][1] for i in writes) | {_EXTERNAL_ORDER}
        self.depth += 1
        try:
            fn(*args)
        finally:
            self.depth -= 1
        if self.suspended:
            self._pin(k for k in wkeys if k != _EXTERNAL_ORDER)
        else:
            self.calls.append(_Call("external", name, fn, specs, {}, rkeys, wkeys, "communication"))

    def _alloc(self, buf: Buffer) -> None:
        if not self.depth:
            info = _BufInfo(len(self.infos), buf, in_step=True)
            self.infos.append(info)
            self._by_id[id(buf)] = info

    def _host_write(self, kind: str, orig: Callable, view: Any, host: np.ndarray) -> None:
        if self.depth:
            return orig(view, host)
        self.depth += 1  # write_strided may call write: one record
        try:
            orig(view, host)
        finally:
            self.depth -= 1
        spec = self._spec(view)
        info = self.infos[spec[1]]
        if self.suspended:
            self._pin([info.key])
            return None
        if not info.in_step:
            self._fail("host data written into a tensor that existed before the step (e.g. copy_from_numpy "
                       "inside train_one_batch; copy the batch into the input placeholders before the call)")
        data = np.array(host, dtype=dtypes.to_numpy_dtype(view.dtype), copy=True)
        self.calls.append(_Call(kind, kind, orig, [spec], {}, frozenset(), frozenset([info.key]), self.phase, data))
        return None

    def _read(self) -> None:
        if not self.depth and not self.suspended:
            self._fail("device data read on the host (to_numpy, item, float(t), print(t) ...) inside the step")

    def _copy_view(self, orig: Callable, dst: Any, src: Any) -> None:
        if self.depth:
            return orig(dst, src)
        ds, ss = self._spec(dst), self._spec(src)
        self.depth += 1
        try:
            orig(dst, src)
        finally:
            self.depth -= 1
        if self.suspended:
            self._pin([ds[1]])
        else:
            self.calls.append(_Call("copy_view", "copy_view", orig, [ds, ss], {}, frozenset([ss[1]]),
                                    frozenset([ds[1]]), self.phase))
        return None

    def _check(self, name: str, check: Callable, views: tuple) -> None:
        """A host check of device data (see `host_check`): run now, and again at every replay."""
        if self.depth or self.suspended:
            check(*views)
            return
        specs = [self._spec(v) for v in views]
        self.depth += 1  # its reads are part of the check, not the step's
        try:
            check(*views)
        finally:
            self.depth -= 1
        reads = frozenset(s[1] for s in specs if s is not None and s[0] == "v")
        self.calls.append(_Call("check", name, check, specs, {}, reads, frozenset(), self.phase))

    # -- layer.py's protocol: Layer.initialize pauses the recording with EnableGraph(False) ---------------------------
    def _enable_graph(self, flag: bool) -> None:
        if flag:
            self.suspended = max(self.suspended - 1, 0)
        else:
            self.suspended += 1

    def __enter__(self) -> Recorder:
        if _tls.active is not None:
            raise RuntimeError("graph: a step is already being recorded in this thread (nested recording is not "
                               "supported)")
        _hooks.acquire(self.device)
        _tls.active = self
        return self

    def __exit__(self, *exc: Any) -> None:
        _tls.active = None
        _hooks.release()

    # -- the result ---------------------------------------------------------------------------------------------------
    def finish(self, sequential: bool = False, inference: bool = False) -> Graph:
        """Build the replayable graph (call after leaving the context, once the step's locals are gone).
        `inference`: the step is a forward in evaluation mode, whose convolution + BatchNorm chains may be folded
        (see graph_fuse).

        Raises GraphUnsupported when the step did something a replay cannot reproduce.
        """
        gc.collect()  # autograd's tape may hold temporaries in reference cycles
        for info in self.infos:
            if info.in_step and info.strong is None:
                info.strong = info.ref()  # still alive: persistent (outputs, new states)
        if self.problem is not None:
            raise GraphUnsupported(self.problem)
        from singa import graph_fuse, graph_recompute

        calls = self.calls
        if inference:
            calls = graph_fuse.fold_batchnorm(self.device, calls, self.infos)
            calls = graph_fuse.keep_channel_blocks(self.device, calls, self.infos)
        elif _RECOMPUTE:
            calls = graph_recompute.recompute_batchnorm(self.device, calls, self.infos)
        calls = graph_fuse.write_into_slices(calls, self.infos)
        calls = graph_fuse.drop_unread(calls, self.infos)
        return Graph(self.device, calls, self.infos, sequential)


class _DeviceHooks:
    """Dispatchers installed on every device while any thread records a step.

    Each entry of a device's kernel table (the dict that `singa.ops` caches, so entries are replaced in place and
    restored afterwards) and its `alloc`, `write`, `write_strided`, `read`, `copy_view`, `graph_enabled` and
    `EnableGraph` are replaced by a function that asks the calling thread's recorder, if it has one, and otherwise
    calls the original: a step recorded in one thread never captures another thread's kernels. The hooks are counted:
    installed by the first recorder to start, removed when the last one ends.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._hooked: dict[int, Device] = {}
        self._undo: list[Callable[[], None]] = []

    def acquire(self, dev: Device) -> None:
        from singa import device as device_module

        with self._lock:
            try:
                for d in list(device_module._devices.values()) + [dev]:
                    if id(d) not in self._hooked:
                        self._hook(d)
            except BaseException:
                if not self._users:
                    self._unhook()
                raise
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if not self._users:
                self._unhook()

    def _unhook(self) -> None:
        while self._undo:
            self._undo.pop()()
        self._hooked.clear()

    def _shadow(self, obj: Any, name: str, value: Any) -> None:
        had = name in obj.__dict__
        old = obj.__dict__.get(name)
        setattr(obj, name, value)

        def undo() -> None:
            if had:
                setattr(obj, name, old)
            else:
                obj.__dict__.pop(name, None)

        self._undo.append(undo)

    def _hook(self, d: Device) -> None:
        self._hooked[id(d)] = d
        table = d.table
        saved = dict(table)
        self._undo.append(lambda: table.update(saved))
        for name, fn in saved.items():
            table[name] = _kernel_hook(d, name, fn)
        alloc, write, write_strided = d.alloc, d.write, d.write_strided
        read, copy_view = d.read, d.copy_view
        enabled, enable = getattr(d, "graph_enabled", None), getattr(d, "EnableGraph", None)

        def mine() -> Recorder | None:  # the calling thread's recorder, when it records on d
            rec = _tls.active
            return rec if rec is not None and rec.device is d else None

        def hooked_alloc(nbytes: int) -> Buffer:
            buf = alloc(nbytes)
            rec = mine()
            if rec is not None:
                rec._alloc(buf)
            return buf

        def hooked_write(view: Any, host: np.ndarray) -> None:
            rec = mine()
            return write(view, host) if rec is None else rec._host_write("write", write, view, host)

        def hooked_write_strided(view: Any, host: np.ndarray) -> None:
            rec = mine()
            return write_strided(view, host) if rec is None else \
                rec._host_write("write_strided", write_strided, view, host)

        def hooked_read(view: Any) -> np.ndarray:
            rec = _tls.active  # a read of any device's data inside a step
            if rec is not None:
                rec._read()
            return read(view)

        def hooked_copy_view(dst: Any, src: Any) -> None:
            rec = mine()
            return copy_view(dst, src) if rec is None else rec._copy_view(copy_view, dst, src)

        def graph_enabled() -> bool:
            rec = mine()
            if rec is None:
                return bool(enabled()) if callable(enabled) else False
            return rec.suspended == 0

        def enable_graph(flag: bool) -> None:
            rec = mine()
            if rec is not None:
                rec._enable_graph(flag)
            elif callable(enable):
                enable(flag)

        for name, fn in (("alloc", hooked_alloc), ("write", hooked_write), ("write_strided", hooked_write_strided),
                         ("read", hooked_read), ("copy_view", hooked_copy_view), ("graph_enabled", graph_enabled),
                         ("EnableGraph", enable_graph)):
            self._shadow(d, name, fn)


def _kernel_hook(dev: Device, name: str, fn: Callable) -> Callable:
    def kernel(*args: Any, **params: Any) -> Any:
        rec = _tls.active
        if rec is None:
            return fn(*args, **params)
        return rec._kernel(dev, name, fn, args, params)

    kernel.__wrapped__ = fn
    return kernel


_hooks = _DeviceHooks()


def host_check(name: str, check: Callable[..., None], *views: Any) -> None:
    """Run `check(*views)`, a function that reads device data on the host and raises on what it finds (labels out of
    range, say). In a step being recorded it is kept as a call of the graph and runs again at every replay, so a
    check made by the core holds in graph mode too, on every backend."""
    rec = _tls.active
    if rec is None:
        check(*views)
    else:
        rec._check(name, check, views)


# -- scheduling -----------------------------------------------------------------------------------------------------


def _dependencies(calls: list[_Call]) -> tuple[list[list[int]], list[int]]:
    """Successor lists and in-degrees from read-after-write, write-after-read and write-after-write on buffers."""
    n = len(calls)
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    last_writer: dict[int, int] = {}
    readers: dict[int, list[int]] = {}
    for i, c in enumerate(calls):
        deps = set()
        for k in c.reads:
            w = last_writer.get(k)
            if w is not None:
                deps.add(w)
        for k in c.writes:
            w = last_writer.get(k)
            if w is not None:
                deps.add(w)
            deps.update(readers.get(k, ()))
        deps.discard(i)
        for d in deps:
            succ[d].append(i)
        indeg[i] = len(deps)
        for k in c.reads - c.writes:
            readers.setdefault(k, []).append(i)
        for k in c.writes:
            last_writer[k] = i
            readers[k] = []
    return succ, indeg


def _schedule(calls: list[_Call], temp_bytes: dict[int, int]) -> list[int]:
    """A topological order that, among the calls ready to run, prefers the one that frees the most temporary memory
    net of what it newly occupies; when none frees any, program order."""
    succ, indeg = _dependencies(calls)
    remaining: dict[int, int] = {}
    for c in calls:
        for k in c.touched():
            if k in temp_bytes:
                remaining[k] = remaining.get(k, 0) + 1
    live: set[int] = set()
    ready = [i for i, d in enumerate(indeg) if d == 0]
    order: list[int] = []
    while ready:
        best, best_score = -1, None
        for i in ready:
            score = 0
            for k in calls[i].touched():
                b = temp_bytes.get(k)
                if b is None:
                    continue
                if remaining[k] == 1:
                    score += b if k in live else 0
                elif k not in live:
                    score -= b
            score = max(score, 0)  # nothing freed: keep program order
            if best_score is None or score > best_score or (score == best_score and i < best):
                best, best_score = i, score
        ready.remove(best)
        order.append(best)
        for k in calls[best].touched():
            if k in temp_bytes:
                live.add(k)
                remaining[k] -= 1
                if remaining[k] == 0:
                    live.discard(k)
        for j in succ[best]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    if len(order) != len(calls):  # cannot happen: edges only go forward in program order
        raise RuntimeError("graph: dependency cycle")
    return order


def _lifetimes(calls: list[_Call], order: list[int], temp_bytes: dict[int, int]) -> tuple[dict, dict]:
    """First and last position (in `order`) of the calls touching each temporary."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for pos, ci in enumerate(order):
        for k in calls[ci].touched():
            if k in temp_bytes:
                first.setdefault(k, pos)
                last[k] = pos
    return first, last


def _live_peak(calls: list[_Call], order: list[int], temp_bytes: dict[int, int]) -> int:
    """The most temporary bytes alive at once in this order: a lower bound of any plan for it."""
    first, last = _lifetimes(calls, order, temp_bytes)
    delta = [0] * (len(order) + 1)
    for k, f in first.items():
        delta[f] += _align(temp_bytes[k])
        delta[last[k] + 1] -= _align(temp_bytes[k])
    peak = cur = 0
    for d in delta:
        cur += d
        peak = max(peak, cur)
    return peak


# -- memory planning ------------------------------------------------------------------------------------------------


def _in_place(calls: list[_Call], order: list[int], temp_bytes: dict[int, int], first: dict[int, int],
              last: dict[int, int], shares: dict[str, str]) -> dict[int, int]:
    """Temporaries a kernel may write over one of its inputs: {output key: key of the temporary whose bytes it
    takes} (chains resolved to their first member).

    An element-wise kernel reads element i of each input and writes element i of its output, so its output can share
    memory with an input whose last use is this very call, provided the two views select the same bytes (same dtype,
    shape, strides and offset) and the input is not also read through another view. Lifetimes are closed ranges, so
    the planner alone would never overlap them: this is the one place where a temporary dies and another is born in
    the same bytes within one call (ReLU after batch norm, the residual Add, gradient arithmetic). Other kernels
    share only where the device says so (`shares`: Device.shares_output_with), with the one input named there.
    """
    root: dict[int, int] = {}
    for pos, ci in enumerate(order):
        c = calls[ci]
        if c.kind != "kernel" or not c.specs or c.specs[0] is None:
            continue
        spec = primitives.SPECIAL_BY_NAME.get(c.name)
        out = c.specs[0]
        if out[0] != "v" or out[1] not in temp_bytes or first[out[1]] != pos:
            continue
        if spec is None:
            candidates = c.specs[1:]
        elif c.name in shares and len(spec.outputs) == 1:
            names = [n.rstrip("?") for n in spec.outputs + spec.inputs]
            i = names.index(shares[c.name])
            candidates = c.specs[i:i + 1]
        else:
            continue
        views: dict[int, list] = {}
        for s in c.specs[1:]:
            if s is not None and s[0] == "v":
                views.setdefault(s[1], []).append(s[2:])
        for s in candidates:
            if s is None or s[0] != "v":
                continue
            key, seen = s[1], views[s[1]]
            # an element-wise kernel may read the input through several arguments (x * x), a convolution may not
            if key in temp_bytes and last[key] == pos and set(seen) == {out[2:]} and (spec is None or len(seen) == 1):
                root[out[1]] = root.get(key, key)
                break
    return root


def _align(n: int) -> int:
    return (max(n, 1) + _ALIGN - 1) // _ALIGN * _ALIGN


def plan_offsets(sizes: list[int], lives: list[tuple[int, int]]) -> tuple[list[int], int]:
    """Byte offsets for blocks of `sizes` live over the closed step ranges `lives`, overlapping in memory only when
    their ranges are disjoint. Greedy by size (largest first), each placed in the smallest gap that fits."""
    n = len(sizes)
    order = sorted(range(n), key=lambda i: (-sizes[i], lives[i][0], i))
    offsets = [0] * n
    p_off = np.zeros(n, np.int64)
    p_end = np.zeros(n, np.int64)
    p_s = np.zeros(n, np.int64)
    p_e = np.zeros(n, np.int64)
    total = 0
    for m, i in enumerate(order):
        size = _align(sizes[i])
        s, e = lives[i]
        mask = (p_s[:m] <= e) & (s <= p_e[:m])
        idx = np.nonzero(mask)[0]
        best, best_gap = None, None
        prev = 0
        if idx.size:
            o = p_off[:m][idx]
            srt = np.argsort(o, kind="stable")
            offs, ends = o[srt].tolist(), p_end[:m][idx][srt].tolist()
            for oo, ee in zip(offs, ends):
                gap = oo - prev
                if gap >= size and (best_gap is None or gap < best_gap):
                    best, best_gap = prev, gap
                prev = max(prev, ee)
        off = prev if best is None else best
        offsets[i] = off
        p_off[m], p_end[m], p_s[m], p_e[m] = off, off + size, s, e
        total = max(total, off + size)
    return offsets, total


def _pool_bytes(n: np.ndarray) -> np.ndarray:
    """MemoryPool.size_class, vectorised: 512-byte multiples up to 1 MiB, eight classes per power of two above."""
    n = np.maximum(n, 1)
    small = (n + 511) // 512 * 512
    bits = np.frexp((n - 1).astype(np.float64))[1].astype(np.int64)  # (n - 1).bit_length()
    step = np.left_shift(np.int64(1), np.maximum(bits - 4, 0))
    big = (n + step - 1) // step * step
    return np.where(n <= (1 << 20), small, big)


def split_arena(offsets: list[int], sizes: list[int], total: int) -> list[tuple[int, int]]:
    """Cut [0, total) into blocks (start, end) at addresses no block crosses, minimising the pool's reserved bytes."""
    if total == 0:
        return []
    starts = np.asarray(offsets, np.int64)
    ends = starts + np.asarray([_align(s) for s in sizes], np.int64)
    cand = np.unique(np.concatenate([[0, total], starts, ends]))
    # a cut c is valid when every block starting before c also ends at or before c
    srt = np.argsort(starts, kind="stable")
    s_sorted, e_prefmax = starts[srt], np.maximum.accumulate(ends[srt])
    pos = np.searchsorted(s_sorted, cand, side="left")  # blocks with start < c
    valid = (pos == 0) | (e_prefmax[np.maximum(pos - 1, 0)] <= cand)
    cuts = cand[valid]
    k = len(cuts)
    best = np.zeros(k, np.int64)
    prev = np.zeros(k, np.int64)
    for j in range(1, k):
        costs = best[:j] + _pool_bytes(cuts[j] - cuts[:j])
        i = int(np.argmin(costs))
        best[j], prev[j] = costs[i], i
    out = []
    j = k - 1
    while j > 0:
        i = int(prev[j])
        out.append((int(cuts[i]), int(cuts[j])))
        j = i
    return out[::-1]


# -- the replayable graph ---------------------------------------------------------------------------------------------


class Graph:
    """A recorded step: `run()` replays it. Built by `Recorder.finish`."""

    def __init__(self, device: Device, calls: list[_Call], infos: list[_BufInfo], sequential: bool):
        self.device = device
        self.sequential = sequential
        self.calls = calls
        self._infos = infos
        used: set[int] = set()
        for c in calls:
            used |= c.touched()
        used.discard(_EXTERNAL_ORDER)
        temp_bytes = {k: infos[k].nbytes for k in used if infos[k].strong is None}
        program = list(range(len(calls)))
        if sequential:
            self.order = program
        else:  # the dependency schedule, unless program order (also a valid one) needs less memory
            greedy = _schedule(calls, temp_bytes)
            self.order = min((greedy, program), key=lambda o: _live_peak(calls, o, temp_bytes))
        first, last = _lifetimes(calls, self.order, temp_bytes)
        root = _in_place(calls, self.order, temp_bytes, first, last, getattr(device, "shares_output_with", {}))
        groups: dict[int, list[int]] = {}
        for k in sorted(temp_bytes):
            groups.setdefault(root.get(k, k), []).append(k)
        temps = sorted(groups)  # one planned block per group of temporaries that share their bytes
        sizes = [max(temp_bytes[k] for k in groups[g]) for g in temps]
        lives = [(min(first[k] for k in groups[g]), max(last[k] for k in groups[g])) for g in temps]
        offsets, total = plan_offsets(sizes, lives)
        blocks = split_arena(offsets, sizes, total)
        # the recording step's temporaries are cached blocks of the pool now: give them back before the arena that
        # replaces them is allocated, so that the process never holds both
        device.pool.empty_cache()
        device.trim()
        self._blocks = [device.alloc(end - start) for start, end in blocks]
        starts = [start for start, _ in blocks]
        self._place: dict[int, tuple[Buffer, int]] = {}
        for g, off in zip(temps, offsets):
            b = int(np.searchsorted(starts, off, side="right")) - 1
            for k in groups[g]:
                self._place[k] = (self._blocks[b], off - starts[b])
        self.temp_bytes = sum(temp_bytes.values())  # what the temporaries would take without sharing
        self.arena_bytes = sum(device.pool.size_class(e - s) for s, e in blocks)
        self.num_temporaries = len(temp_bytes)
        self.num_in_place = len(root)
        self._build()
        # a device graph (see Device.capture) bakes every kernel parameter in: steps that draw random numbers get
        # fresh offsets at each replay, so they stay replayed from Python
        self._device_replay = None
        self._capturable = (not self._random and not self._checks_step_data
                            and os.environ.get("SINGA_GRAPH_CAPTURE", "").strip() != "0")

    def _view(self, spec: tuple | None) -> Any:
        if spec is None:
            return None
        if spec[0] == "c":
            return spec[1]
        _, key, dtype, shape, strides, offset = spec
        info = self._infos[key]
        if info.strong is not None:
            return View(info.strong, dtype, shape, strides, offset)
        buf, boff = self._place[key]
        return View(buf, dtype, shape, strides, boff // dtypes.itemsize(dtype) + offset)

    def _build(self) -> None:
        self._exec: list[tuple[Callable, tuple, dict]] = []
        self._random: list[tuple[dict, int]] = []
        params_of: dict[int, dict] = {}
        for ci in range(len(self.calls)):
            c = self.calls[ci]
            params_of[ci] = dict(c.params)
            if c.kind == "kernel" and c.name.startswith("random_"):
                self._random.append((params_of[ci], _draws(c.name, c.specs)))  # program order
        written: set[int] = set().union(*(c.writes for c in self.calls))
        self._inputs_checks: list[tuple[Callable, tuple, dict]] = []  # host checks of data fixed before the step
        self._device_exec: list[tuple[Callable, tuple, dict]] = []  # the rest: what a device graph may hold
        self._checks_step_data = False
        for ci in self.order:
            c = self.calls[ci]
            args = tuple(self._view(s) for s in c.specs)
            if c.kind in ("write", "write_strided"):
                args = args + (c.data,)
            entry = (c.fn, args, params_of[ci])
            bind = getattr(c.fn, "bind", None) if c.kind == "kernel" and not c.name.startswith("random_") else None
            if bind is not None:  # a kernel that can work out its launch once: replayed as that launch alone
                bound = bind(*args, **params_of[ci])
                if bound is not None:
                    entry = (bound, (), {})
            self._exec.append(entry)
            if c.kind == "check" and not (c.reads & written):
                self._inputs_checks.append(entry)
            else:
                self._device_exec.append(entry)
                self._checks_step_data |= c.kind == "check"

    def __len__(self) -> int:
        return len(self._exec)

    def _replay(self) -> None:
        for fn, args, kw in self._exec:
            fn(*args, **kw)

    def _replay_device_part(self) -> None:
        for fn, args, kw in self._device_exec:
            fn(*args, **kw)

    def run(self) -> None:
        """Replay the step."""
        dev = self.device
        for kw, draws in self._random:
            kw["seed"] = dev.seed
            kw["offset"] = dev.next_rng_offset(draws)
        prof = profiling.begin_iteration(dev)
        if prof is None:
            if self._device_replay is None and self._capturable:
                self._capturable = False  # one try: the device records the Python replay below into its own graph
                self._device_replay = dev.capture(self._replay_device_part)
            if self._device_replay is not None:
                for fn, args, kw in self._inputs_checks:  # host checks (labels): they read, a device graph cannot
                    fn(*args, **kw)
                self._device_replay()
            else:
                self._replay()
            return
        sync = dev.synchronize
        clock = time.perf_counter_ns
        calls, order = self.calls, self.order
        token = id(self)
        t_start = clock()
        for pos, (fn, args, kw) in enumerate(self._exec):
            t0 = clock()
            fn(*args, **kw)
            sync()
            c = calls[order[pos]]
            prof.add(token, pos, c.name, c.phase, t0, clock() - t0)
        prof.end_iteration(t_start, clock() - t_start)

    def summary(self) -> dict[str, int]:
        """Sizes of the plan: calls, temporaries (and how many an element-wise kernel writes over its input), their
        unshared bytes and the arena the planner reserved."""
        return {
            "calls": len(self._exec),
            "temporaries": self.num_temporaries,
            "in_place": self.num_in_place,
            "temporary_bytes": self.temp_bytes,
            "arena_bytes": self.arena_bytes,
            "arena_blocks": len(self._blocks),
        }
