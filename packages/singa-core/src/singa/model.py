"""SINGA's `model` module: `Model`, a Layer with a training step, graph mode and checkpoints.

A subclass defines `forward(*inputs)` and `train_one_batch(*inputs)` (forward, loss, `self.optimizer(loss)`), then:

    model.compile([tx], is_train=True, use_graph=True, sequential=False)   # creates the parameters
    for x, y in batches:
        tx.copy_from_numpy(x); ty.copy_from_numpy(y)
        out, loss = model(tx, ty)

With `use_graph=True` the first step is recorded while it runs eagerly and later steps replay its kernels
(`singa.graph`): the returned tensors are then the same objects at every step, rewritten by the replay. A step
that cannot be replayed faithfully (it reads device data on the host, say) is detected while it is recorded; the
model then warns once and keeps running eagerly. A step that creates or replaces parameter tensors (a layer that
initialises itself lazily inside `train_one_batch`) is recorded again at the next call.

Graph mode covers evaluation too: after `model.eval()`, `model(x)` records `forward` once per input signature (shapes
and dtypes; the last few are kept) and replays it, each convolution with the BatchNorm, residual Add and ReLU after it
folded into one call (`singa.graph_fuse`, refolded from the current parameters at every replay). Unlike a training
step's, its inputs are copied into the graph's own placeholders and its outputs are new tensors at every call, so a
script may keep both.

Checkpoints (`save_states` / `load_states`) are zip files holding one .npy per tensor and a JSON manifest (names,
dtypes, shapes, format version); nothing is pickled. `singa.checkpoint` writes them atomically (an interrupted or
failed save leaves the previous checkpoint intact; what a killed save left behind is removed by the next save or load)
and reads them defensively (a damaged file raises `CheckpointError`, naming the file and the problem).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from singa import autograd, checkpoint, layer, profiling
from singa import dtypes as _dt
from singa import graph as _graph
from singa.backend import View
from singa.distopt import DistOpt
from singa.tensor import Tensor

__all__ = ["ModelMeta", "Model", "CHECKPOINT_FORMAT", "CHECKPOINT_VERSION", "CheckpointError"]

CHECKPOINT_FORMAT = checkpoint.FORMAT
CHECKPOINT_VERSION = checkpoint.VERSION
CheckpointError = checkpoint.CheckpointError
_MAX_RECORD_ATTEMPTS = 3
_EVAL_GRAPHS = 4  # input signatures of `forward` a model keeps recorded for evaluation
# model -> the lock its evaluation graphs are replayed under (kept outside the model, which stays copyable)
_eval_locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_eval_locks_lock = threading.Lock()


class ModelMeta(layer.LayerMeta):
    """Wraps each class's `train_one_batch` so that graph mode can record and replay it."""

    @staticmethod
    def buffer_operation(func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(self: Model, *args: Any, **kwargs: Any) -> Any:
            return self._run_step(func, args, kwargs)

        wrapper.__buffered__ = True
        return wrapper

    def __new__(mcs, name: str, bases: tuple, attrs: dict) -> ModelMeta:
        fn = attrs.get("train_one_batch")
        if callable(fn) and not getattr(fn, "__buffered__", False):
            attrs["train_one_batch"] = ModelMeta.buffer_operation(fn)
        return super().__new__(mcs, name, bases, attrs)


def _tensors_in(obj: Any) -> list[Tensor]:
    if isinstance(obj, Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors_in(o)]
    if isinstance(obj, Mapping):
        return [t for o in obj.values() for t in _tensors_in(o)]
    return []


def _map_tensors(obj: Any, fn: Callable[[Tensor], Any]) -> Any:
    """`obj` (a tensor, or lists, tuples and dicts of them) with each tensor replaced by fn(tensor)."""
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(o, fn) for o in obj)
    if isinstance(obj, Mapping):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    return obj


def _same_structure(before: dict, after: dict) -> bool:
    """Whether a step left the model's state tensors (and their buffers) as they were (see Model._structure)."""
    return before.keys() == after.keys() and all(before[k][0] is after[k][0] and before[k][1] is after[k][1]
                                                 for k in before)


def _user_stacklevel() -> int:
    """The warnings stacklevel of the innermost caller outside singa (counted from the caller of this function)."""
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    f = sys._getframe(1)
    level = 1
    while f is not None and os.path.abspath(f.f_code.co_filename).startswith(here):
        f = f.f_back
        level += 1
    return level


_PLAIN = (bool, int, float, str)


def _plain(o: Any) -> tuple:
    """An object's plain settings, in attribute order (an attribute deleted and set again reorders them: a new
    signature, one needless recording)."""
    return tuple([(k, v) for k, v in vars(o).items() if isinstance(v, _PLAIN)])


def _opt_signature(opt: Any) -> tuple:
    """The optimizer object, its schedule and their plain settings: a recorded step bakes them in. Computed at every
    replay, so kept to one pass over the attributes."""
    if opt is None:
        return (None,)
    # its hyper-parameters are schedulers (SINGA's lr, momentum, ...): each one's identity and settings
    scheds = tuple([(k, id(v), _plain(v)) for k, v in vars(opt).items()
                    if not isinstance(v, _PLAIN) and "init_value" in getattr(v, "__dict__", ())])
    return (id(opt), _plain(opt), scheds)


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and bool(np.array_equal(a, b)))
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - arguments whose comparison fails are simply not the same
        return False


class _StepGraph:
    """A recorded train_one_batch: its graph, the arguments it was recorded with and what it returned."""

    def __init__(self, g: _graph.Graph, args: tuple, kwargs: dict, out: Any, checks: list[tuple[Tensor, Any]],
                 model: Model, uses_optimizer: bool = True):
        self.graph = g
        self.model = model
        self.uses_optimizer = uses_optimizer
        self.opt_sig = _opt_signature(getattr(model, "optimizer", None)) if uses_optimizer else None
        self.kw_names = tuple(sorted(kwargs))
        self.inputs: list[tuple] = []
        for a in list(args) + [kwargs[k] for k in self.kw_names]:
            if isinstance(a, Tensor):
                view = View(a.buffer, a.dtype, a.shape, a.strides, a.offset)
                self.inputs.append(("t", a, view))
            else:
                self.inputs.append(("v", a, None))
        self.out = out
        self.checks = checks

    def bind(self, args: tuple, kwargs: dict) -> str | None:
        """None when this call can be replayed (tensor arguments copied into the recorded inputs first), 'stale'
        when a parameter tensor was replaced since the recording, else why the call differs from the recorded one."""
        if tuple(sorted(kwargs)) != self.kw_names or len(args) + len(kwargs) != len(self.inputs):
            return "train_one_batch called with other arguments than the recorded step"
        for t, buf in self.checks:
            if t.buffer is not buf:
                return "stale"
        if self.uses_optimizer and _opt_signature(getattr(self.model, "optimizer", None)) != self.opt_sig:
            return "stale"  # another optimizer or new settings: record the step again
        copies = []
        flat = list(args) + [kwargs[k] for k in self.kw_names]
        for i, ((kind, rec, view), a) in enumerate(zip(self.inputs, flat)):
            if kind == "t":
                if a is rec and a.buffer is view.buffer and a.offset == view.offset and a.strides == view.strides \
                        and a.shape == view.shape:
                    continue
                if not isinstance(a, Tensor) or a.shape != view.shape or a.dtype != view.dtype or \
                        a.device is not rec.device:
                    what = (f"a {_dt.name(a.dtype)} tensor of shape {a.shape} on {a.device.name}"
                            if isinstance(a, Tensor) else type(a).__name__)
                    return (f"argument {i} is {what}, the step was recorded with a {_dt.name(view.dtype)} tensor of "
                            f"shape {view.shape} on {rec.device.name}")
                copies.append((view, a))
            elif not _same_value(a, rec):
                return (f"argument {i} ({type(a).__name__}) differs from the value the step was recorded with "
                        "(graph mode bakes non-tensor arguments in)")
        for view, a in copies:
            rec_dev = view.buffer.device
            rec_dev.table["copy"](view, a)
        return None

    def replay(self) -> Any:
        self.graph.run()
        return self.out


class Model(layer.Layer, metaclass=ModelMeta):
    """Base class of models: subclasses define `forward` and `train_one_batch`."""

    def __init__(self) -> None:
        super().__init__()
        self.training = True
        self.graph_mode = False
        self.sequential = False
        self.initialized = False
        self.device = None
        self._step_graph: _StepGraph | None = None
        self._in_step = False
        self._graph_off: str | None = None
        self._record_attempts = 0
        self._eval_graphs: list[_StepGraph] = []
        self._eval_off: str | None = None
        self._warned: set[str] = set()

    # -- the methods a subclass writes ---------------------------------------------------------------------------------
    def forward(self, *input: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.forward is not implemented")

    def train_one_batch(self, *input: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.train_one_batch is not implemented")

    # -- modes ---------------------------------------------------------------------------------------------------------
    def compile(self, inputs: list[Tensor], is_train: bool = True, use_graph: bool = False,
                sequential: bool = False) -> None:
        """Create the parameters by running `forward` once on the placeholders, then set the modes.

        The forward runs without recording autograd and in evaluation mode (batch statistics are not touched);
        `use_graph` turns graph mode on for `train_one_batch` (`sequential`: replay in program order). With a
        `DistOpt` as the optimizer (set_optimizer before compile) and is_train, every rank then takes rank 0's
        parameters and states.
        """
        if isinstance(inputs, Tensor):
            inputs = [inputs]
        if not isinstance(inputs, (list, tuple)) or not inputs or not all(isinstance(t, Tensor) for t in inputs):
            raise TypeError("compile: inputs must be a non-empty list of Tensors (the input placeholders)")
        self.device = inputs[0].device
        prev = autograd.training
        autograd.training = False
        try:
            self.forward(*inputs)
        finally:
            autograd.training = prev
        self.initialized = True
        opt = getattr(self, "optimizer", None)
        if is_train and isinstance(opt, DistOpt):
            # data-parallel training starts from rank 0's parameters (and buffers such as running means)
            opt.broadcast_parameters(list(self.get_states().values()))
        self.train(is_train)
        self.graph(use_graph, sequential)

    def train(self, mode: bool = True) -> None:
        """Training mode (`model(...)` runs train_one_batch, autograd records) or not."""
        self.training = bool(mode)
        autograd.training = bool(mode)

    def eval(self) -> None:
        """Evaluation mode: `model(x)` runs forward, nothing is recorded."""
        self.train(False)

    def graph(self, mode: bool = True, sequential: bool = False) -> None:
        """Turn graph mode on or off; a recorded step is dropped (the next step records again)."""
        self.graph_mode = bool(mode)
        self.sequential = bool(sequential)
        self._step_graph = None
        self._graph_off = None
        self._record_attempts = 0
        self._eval_graphs = []
        self._eval_off = None

    def __call__(self, *input: Any, **kwargs: Any) -> Any:
        if self.training:
            return self.train_one_batch(*input, **kwargs)
        if self.graph_mode and self.device is not None and self._eval_off is None and not autograd.training \
                and _graph.recording() is None:
            # one thread at a time replays (the graphs' buffers are shared); the others, and a call from inside
            # forward, run it eagerly
            with _eval_locks_lock:
                lock = _eval_locks.setdefault(self, threading.Lock())
            if lock.acquire(blocking=False):
                try:
                    if not self._in_step:
                        self._in_step = True
                        try:
                            return self._evaluate(input, kwargs)
                        finally:
                            self._in_step = False
                finally:
                    lock.release()
        return self.forward(*input, **kwargs)

    # -- graph mode ----------------------------------------------------------------------------------------------------
    def _run_step(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        if self._in_step or not self.graph_mode or not self.training or _graph.recording() is not None:
            return func(self, *args, **kwargs)  # (inside a recording made through the device, it records there)
        self._in_step = True
        try:
            return self._graph_step(func, args, kwargs)
        finally:
            self._in_step = False

    def _warn(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(f"{type(self).__name__}: {message}", _graph.GraphWarning, stacklevel=_user_stacklevel())

    def _graph_step(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        sg = self._step_graph
        if sg is not None:
            why = sg.bind(args, kwargs)
            if why is None:
                return sg.replay()
            if why != "stale":
                self._warn(f"graph mode: {why}; this step runs eagerly")
                return func(self, *args, **kwargs)
            self._step_graph = None  # parameters or the optimizer were replaced: record again
        if self._graph_off is not None:
            return func(self, *args, **kwargs)
        return self._record(func, args, kwargs)

    def _structure(self) -> dict[str, tuple[Tensor, Any]]:
        return {k: (t, t.buffer) for k, t in self.get_states().items()}

    def _record(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        tensors = _tensors_in(list(args) + list(kwargs.values()))
        dev = self.device if self.device is not None else (tensors[0].device if tensors else None)
        if dev is None or not self.initialized:
            # the first step creates the parameters: run it eagerly (get_states() means nothing before it)
            out = func(self, *args, **kwargs)
            self.initialized = True
            return out
        opt = getattr(self, "optimizer", None)
        if opt is not None and hasattr(opt, "_scalars"):
            opt._scalars.clear()  # per-step values computed outside the recording must be recomputed inside it
        before = self._structure()
        with _graph.Recorder(dev) as rec:
            out = func(self, *args, **kwargs)
        for t in _tensors_in(out):
            t.creator = None  # the step is over; let its autograd tape (and temporaries) go
        after = self._structure()
        if not _same_structure(before, after):
            self._record_attempts += 1
            if self._record_attempts >= _MAX_RECORD_ATTEMPTS:
                self._disable("every recorded step created or replaced parameter/state tensors (update them in "
                              "place, or initialise layers in compile)")
            return out
        try:
            g = rec.finish(self.sequential)
        except _graph.GraphUnsupported as exc:
            self._disable(str(exc))
            return out
        self._step_graph = _StepGraph(g, args, kwargs, out, list(after.values()), self)
        return out

    def _evaluate(self, args: tuple, kwargs: dict) -> Any:
        """`forward` in evaluation mode through the graph recorded for these inputs' signature (see the module
        docstring); outputs are copies, so that the next replay does not overwrite what the caller kept."""
        for sg in list(self._eval_graphs):
            why = sg.bind(args, kwargs)
            if why is None:
                return _map_tensors(sg.replay(), Tensor.clone)
            if why == "stale":
                self._eval_graphs.remove(sg)
        # the recording reads the graph's own copies of the inputs: a replay copies the caller's tensors into them
        args = tuple(_map_tensors(a, Tensor.clone) for a in args)
        kwargs = {k: _map_tensors(v, Tensor.clone) for k, v in kwargs.items()}
        before = self._structure()
        with _graph.Recorder(self.device) as rec:
            out = self.forward(*args, **kwargs)
        after = self._structure()
        if not _same_structure(before, after):
            return out  # forward made or replaced parameters: nothing to keep; the next call records again
        try:
            g = rec.finish(self.sequential, inference=True)
        except _graph.GraphUnsupported as exc:
            self._eval_off = str(exc)
            self._warn(f"graph mode does not cover this model's forward: {exc}. Evaluation runs eagerly (same "
                       "results, without the graph's speed)")
            return out
        self._eval_graphs.append(_StepGraph(g, args, kwargs, out, list(after.values()), self, uses_optimizer=False))
        del self._eval_graphs[:-_EVAL_GRAPHS]
        return _map_tensors(out, Tensor.clone)

    def _disable(self, why: str) -> None:
        self._graph_off = why
        self._step_graph = None
        self._warn(f"graph mode is off for this model: {why}. Its steps run eagerly (same results, without the "
                   "graph's speed and memory savings)")

    def graph_summary(self) -> dict[str, Any] | None:
        """Facts about the recorded step (calls, temporaries, planned arena bytes), or None before recording."""
        return None if self._step_graph is None else self._step_graph.graph.summary()

    # -- time profiling ------------------------------------------------------------------------------------------------
    def _profiled_device(self) -> Any:
        if self.device is None:
            raise RuntimeError(f"{type(self).__name__}: compile the model before profiling it")
        return self.device

    def print_time_profiling(self) -> None:
        """Per-kernel times of the graph-mode steps (enable with device.SetVerbosity(1)); same as
        device.PrintTimeProfiling()."""
        profiling.print_time_profiling(self._profiled_device())

    PrintTimeProfiling = print_time_profiling

    def export_chrome_trace(self, path: str | os.PathLike) -> None:
        """Write the profiled graph steps as Chrome trace JSON (chrome://tracing, Perfetto)."""
        profiling.export_chrome_trace(self._profiled_device(), path)

    # -- checkpoints ---------------------------------------------------------------------------------------------------
    def save_states(self, fpath: str | os.PathLike, aux_states: Mapping[str, Any] = {}) -> None:
        """Write the parameters and states, the attached optimizer's states and `aux_states` to a zip checkpoint.

        aux values may be Tensors, numpy arrays or JSON values (numbers, strings, lists, dicts); they come back from
        load_states as they went in. The file is replaced atomically. With a DistOpt over several ranks, every rank
        calls save_states (as SINGA's scripts do): rank 0 writes the file, and each rank returns once it is written,
        so that any rank may load it.
        """
        opt = getattr(self, "optimizer", None)
        dist = opt if isinstance(opt, DistOpt) and opt.world_size > 1 else None
        if dist is not None and dist.global_rank != 0:
            dist.barrier(self.device)  # rank 0 writes; wait until it has
            return
        self._write_states(fpath, aux_states)
        if dist is not None:
            dist.barrier(self.device)

    def _write_states(self, fpath: str | os.PathLike, aux_states: Mapping[str, Any]) -> None:
        arrays: list[dict[str, Any]] = []
        data: list[np.ndarray] = []

        def add(section: str, name: str, arr: np.ndarray, kind: str) -> None:
            if arr.dtype == object:
                raise TypeError(f"save_states: {section} entry {name!r} is not numeric (object arrays are not saved)")
            arrays.append({"section": section, "name": name, "kind": kind, "file": f"arrays/{len(data):05d}.npy",
                           "dtype": str(arr.dtype), "shape": list(arr.shape)})
            data.append(arr)

        for name, t in self.get_states().items():
            add("states", name, t.to_numpy(), "tensor")
        manifest: dict[str, Any] = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION,
                                    "model": type(self).__name__, "arrays": arrays, "values": {}}
        opt = getattr(self, "optimizer", None)
        if opt is not None and callable(getattr(opt, "get_states", None)):
            manifest["optimizer"] = type(opt).__name__
            for key, v in opt.get_states().items():
                if isinstance(v, Mapping):  # SINGA's per-parameter groups: {'moments': {param name: tensor}}
                    for name, t in v.items():
                        add("optimizer", f"{key}/{name}", np.asarray(t), "tensor")
                        arrays[-1]["group"] = key
                else:
                    add("optimizer", key, np.asarray(v), "tensor")
        for name, v in aux_states.items():
            if not isinstance(name, str):
                raise TypeError(f"save_states: aux_states keys must be strings, got {name!r}")
            if isinstance(v, Tensor):
                add("aux", name, v.to_numpy(), "tensor")
            elif isinstance(v, (np.ndarray, np.generic)):
                add("aux", name, np.asarray(v), "array")
            else:
                try:
                    manifest["values"][name] = json.loads(json.dumps(v, allow_nan=True))
                except (TypeError, ValueError):
                    raise TypeError(f"save_states: aux state {name!r} is a {type(v).__name__}; use a Tensor, a numpy "
                                    "array or a JSON value") from None
        checkpoint.write(fpath, manifest, data)

    def load_states(self, fpath: str | os.PathLike) -> dict[str, Any]:
        """Restore a checkpoint written by save_states (in place, into the existing tensors); returns aux_states.

        Every missing or unexpected name and every shape mismatch is reported in one error, before anything is
        changed.
        """
        fpath = os.fspath(fpath)
        manifest, arrays = checkpoint.read(fpath)
        current = self.get_states()
        if not current:
            raise RuntimeError(f"load_states({fpath!r}): {type(self).__name__} has no parameters yet; call "
                               "compile() (or run the model once) first, so that its layers create them")
        saved = {e["name"]: a for e, a in arrays if e["section"] == "states"}
        problems = []
        missing = sorted(set(current) - set(saved))
        unexpected = sorted(set(saved) - set(current))
        if missing:
            problems.append("missing from the checkpoint: " + ", ".join(missing))
        if unexpected:
            problems.append("not in the model: " + ", ".join(unexpected))
        for name in sorted(set(current) & set(saved)):
            t, a = current[name], saved[name]
            if tuple(a.shape) != t.shape:
                problems.append(f"{name}: checkpoint shape {a.shape}, model shape {t.shape}")
            elif a.dtype.kind != _dt.to_numpy_dtype(t.dtype).kind:
                problems.append(f"{name}: checkpoint dtype {a.dtype}, model dtype {_dt.name(t.dtype)}")
        if problems:
            raise ValueError(f"load_states({fpath!r}): the checkpoint does not match {type(self).__name__}: "
                             + "; ".join(problems))
        opt = getattr(self, "optimizer", None)
        opt_states = _optimizer_states(manifest, arrays)
        if opt_states and opt is not None and callable(getattr(opt, "set_states", None)):
            if manifest.get("optimizer") == type(opt).__name__:
                opt.set_states(opt_states)
            else:
                warnings.warn(f"load_states: the checkpoint holds {manifest.get('optimizer')} states; the model's "
                              f"optimizer is a {type(opt).__name__}, so they are not loaded", UserWarning,
                              stacklevel=2)
        for name, a in saved.items():
            current[name].copy_from_numpy(a)  # in place: a recorded graph keeps using the same buffers
        aux: dict[str, Any] = dict(manifest.get("values", {}))
        dev = self.device
        for e, a in arrays:
            if e["section"] == "aux":
                aux[e["name"]] = Tensor(data=a, device=dev, dtype=_dt.from_numpy_dtype(a.dtype)) \
                    if e["kind"] == "tensor" else a
        return aux


# Version 1 checkpoints named optimizer states '<param>/<state>' with these state names.
_V1_STATE_GROUPS = {"momentum": "moments", "square_avg": "running_average", "sum": "history", "m": "m", "v": "v",
                    "master": "master"}


def _optimizer_states(manifest: dict, arrays: list[tuple[dict, np.ndarray]]) -> dict[str, Any]:
    """The optimizer section as Optimizer.set_states takes it: {'step_counter': ..., 'moments': {name: array}}."""
    out: dict[str, Any] = {}
    for e, a in arrays:
        if e["section"] != "optimizer":
            continue
        name = e["name"]
        group = e.get("group")
        if group is None and manifest.get("version") == 1 and "/" in name:
            param, _, state = name.rpartition("/")
            group = _V1_STATE_GROUPS.get(state, state)
            name = f"{group}/{param}"
        if group is not None:
            out.setdefault(group, {})[name[len(group) + 1:]] = a
        else:
            out[name] = a
    return out
