"""SINGA's `opt` module: optimizers (SGD, RMSProp, AdaGrad, Adam) and learning-rate schedules.

The update equations are PyTorch's (`torch.optim`), weight decay included (an L2 term added to the gradient).

SINGA's object API. Every hyper-parameter is a `DecayScheduler` (a number given to the constructor becomes
`Constant(number)`): `lr`, SGD's `momentum`, `dampening`, `weight_decay`, RMSProp's `rho`, `epsilon`, Adam's `beta_1`,
`beta_2` ... Next to each is its value at the current step as a device Tensor of shape (1,): `lr_value`, `mom_value`,
`dam_value`, `decay_value`, `rho_value`, `epsilon_value`, `beta_1_value`, `beta_2_value`. `step_counter` is a float32
Tensor of shape (1,) holding the number of completed steps; `step()` advances it and recomputes every `*_value`.
These tensors exist from construction, on the default device, and move to the parameters' device at the first update.
The per-parameter states are SINGA's dicts keyed by parameter name: SGD `moments`, RMSProp `running_average`, AdaGrad
`history`, Adam `m` and `v`. `get_states()` returns `{'step_counter': float, 'moments': {name: Tensor}, ...}` with
those keys and `set_states()` takes the same (values may be Tensors or numpy arrays).

Updates are written in place into each parameter's own memory, and every quantity that changes from step to step
(a scheduled value, Adam's bias corrections, SGD's first-step dampening) is computed on the device from the step
counter, itself advanced on the device by `step()`. A training step therefore has no Python-side state that a graph
replay (singa.graph) would miss, and a recorded step stays correct at every later step. A `Constant` hyper-parameter
is applied as a plain number (one kernel less per update).

Optimizer state belongs to the parameter *object*: it is kept in a dict keyed by `id(param)` that also holds the
parameter, so that the id cannot be reused. Two parameters with the same name never share state (the second gets the
label 'name#1'). Names only label the state in the dicts above and in checkpoints.

Half precision. A float16 parameter is trained through a float32 *master* copy (`master_weights=True`, the default):
at its first update the optimizer creates the master (the parameter cast to float32) and keeps every state of that
parameter (momentum, moments) in float32 too. Each update casts the float16 gradient to float32, applies the rule to
the master, and writes the master rounded to float16 back into the parameter's own buffer (in place, so a recorded
graph keeps working). Before each update the master is re-synchronised from the parameter when the two disagree
(something else wrote the parameter: `set_params`, `load_states` of a checkpoint without masters), so the float16
tensor stays the source of truth. Masters are the 'master' states. With `master_weights=False` the update runs in
the parameter's own dtype, as in Apache SINGA (small updates are then lost to float16 rounding).

Loss scaling. `loss_scale=S` (static) makes `opt(loss)` back-propagate from S * loss, so that small float16
gradients do not flush to zero, then unscale each gradient in float32 (times 1 / S) before the update. All gradients
are computed before any parameter is updated; when one of them holds an inf or a NaN the whole step is skipped on the
device (parameters, masters and states keep their values, the step counter does not advance and `skipped_steps`
counts it), with no host read, so graph replays skip the same way. `update(param, grad)` called directly takes
unscaled gradients and checks nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import numpy as np

from singa import dtypes as _dt
from singa import graph, ops, tensor
from singa.backend import Device
from singa.tensor import Tensor

__all__ = ["DecayScheduler", "Constant", "ExponentialDecay", "Optimizer", "SGD", "RMSProp", "AdaGrad", "Adam",
           "DistOpt"]

_F16_MAX = 65504.0  # the largest finite float16
_NUMBER = (int, float, np.integer, np.floating)


# -- learning-rate schedules ----------------------------------------------------------------------------------------


class DecayScheduler:
    """A value that depends on the step: `scheduler(step)` for a number (a float) or a Tensor (a Tensor of the
    step's shape on its device, computed with kernels so that graph replays follow the schedule)."""

    def __init__(self, init_value: float):
        self.init_value = float(init_value)

    def __call__(self, step: Any) -> Any:
        return self.call(step)

    def call(self, step: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.call is not implemented")


class Constant(DecayScheduler):
    """The same value at every step."""

    def call(self, step: Any) -> Any:
        if isinstance(step, Tensor):
            dt = step.dtype if step.dtype in _dt.FLOATS else _dt.float32
            return ops.full(step.shape, self.init_value, dt, step.device)
        return self.init_value


class ExponentialDecay(DecayScheduler):
    """init_value * decay_rate ** (step / decay_steps); with staircase the exponent is floored (decay in steps)."""

    def __init__(self, init_value: float, decay_steps: int, decay_rate: float, staircase: bool = False):
        super().__init__(init_value)
        if decay_steps <= 0:
            raise ValueError(f"ExponentialDecay: decay_steps must be positive, got {decay_steps}")
        self.decay_steps = decay_steps
        self.decay_rate = float(decay_rate)
        self.staircase = staircase

    def call(self, step: Any) -> Any:
        if isinstance(step, Tensor):
            s = step if step.dtype in _dt.FLOATS else ops.cast(step, _dt.float32)
            e = ops.div(s, float(self.decay_steps))
            if self.staircase:
                e = ops.floor(e)
            return ops.mul(ops.unary("rpow_scalar", e, alpha=self.decay_rate), self.init_value)
        e = float(step) / self.decay_steps
        if self.staircase:
            e = math.floor(e)
        return self.init_value * self.decay_rate ** e


def _scheduler(owner: str, what: str, value: Any) -> DecayScheduler:
    """A hyper-parameter as SINGA keeps it: a DecayScheduler (numbers become Constant)."""
    if isinstance(value, DecayScheduler):
        return value
    if isinstance(value, _NUMBER) and not isinstance(value, (bool, np.bool_)):
        return Constant(float(value))
    raise TypeError(f"Wrong {what} type: {owner} takes a number or an opt.DecayScheduler for {what}, got "
                    f"{type(value).__name__}")


# -- arithmetic on hyper-parameters that are numbers (Constant) or 0-d device scalars (other schedules) -------------


def _times(x: Tensor, a: Any) -> Tensor:
    return x if isinstance(a, float) and a == 1.0 else ops.mul(x, a)


def _one_minus(a: Any) -> Any:
    return 1.0 - a if isinstance(a, float) else ops.sub(1.0, a)


_PLAIN_DTYPES = (_dt.float32, _dt.float64)  # SGD's plain rule updates these in place (float16 goes through a master)


def _one_pass(w: Tensor, buf: Tensor, g: Tensor) -> bool:
    """Can ops.sgd_momentum update w and buf from g: one shape and float32/float64 dtype, contiguous, three buffers."""
    return (g.shape == w.shape and g.dtype == w.dtype and buf.dtype == w.dtype and w.dtype in _PLAIN_DTYPES
            and ops.is_contiguous(w) and ops.is_contiguous(g) and ops.is_contiguous(buf)
            and g.buffer is not w.buffer and g.buffer is not buf.buffer and buf.buffer is not w.buffer)


def _combine(a: Any, x: Tensor, b: Any, y: Tensor, out: Tensor | None = None) -> Tensor:
    """a * x + b * y (a, b numbers or 0-d tensors): one kernel when both are numbers."""
    if isinstance(a, float) and isinstance(b, float):
        return ops.axpby(a, x, b, y, out=out)
    return ops.add(_times(x, a), _times(y, b), out=out)


# -- optimizers -----------------------------------------------------------------------------------------------------


class _ParamState:
    __slots__ = ("param", "name", "tensors")

    def __init__(self, param: Tensor, name: str, tensors: dict[str, Tensor]):
        self.param = param  # keeps id(param) from being reused while the state exists
        self.name = name
        self.tensors = tensors  # state group ('moments', 'm', 'master' ...) -> tensor


class _StateView(MutableMapping):
    """SINGA's per-parameter state dict (`opt.moments`, `opt.m` ...): {parameter name: state tensor}, live.

    Assigning `view[name] = value` writes the value into that state (or keeps it for the parameter's first update);
    deleting forgets the state (it starts from zero again)."""

    def __init__(self, opt: Optimizer, group: str):
        self._opt = opt
        self._group = group

    def _by_name(self) -> dict[str, _ParamState]:
        return {st.name: st for st in self._opt._states.values() if self._group in st.tensors}

    def __getitem__(self, name: str) -> Tensor:
        st = self._by_name().get(name)
        if st is None:
            raise KeyError(name)
        return st.tensors[self._group]

    def __setitem__(self, name: str, value: Any) -> None:
        self._opt.set_states({self._group: {name: value}})

    def __delitem__(self, name: str) -> None:
        st = self._by_name().get(name)
        if st is None:
            raise KeyError(name)
        del st.tensors[self._group]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._by_name()))

    def __len__(self) -> int:
        return len(self._by_name())

    def __repr__(self) -> str:
        return f"{{{', '.join(f'{k!r}: Tensor{v.shape}' for k, v in self.items())}}}"


class Optimizer:
    """Base class: `opt(loss)` runs `autograd.backward(loss)`, updates every parameter it yields, then `step()`.

    `lr` is a number or a DecayScheduler; `dtype` is that of the schedule values used in the update rules.
    `loss_scale` (a number, best a power of two; None: off) turns on static loss scaling with overflow skipping;
    `master_weights` (default True) trains float16 parameters through float32 master copies (see the module doc).
    """

    # the per-parameter state groups of the rule (SINGA's names, which are also the get_states() keys)
    state_groups: tuple[str, ...] = ()
    # (scheduler attribute, value attribute) pairs: the value is scheduler(step_counter), recomputed by step()
    _values: tuple[tuple[str, str], ...] = (("lr", "lr_value"),)

    def __init__(self, lr: float | DecayScheduler, dtype: int = tensor.float32, *, loss_scale: float | None = None,
                 master_weights: bool = True):
        who = type(self).__name__
        if not isinstance(lr, DecayScheduler) and isinstance(lr, _NUMBER) and not float(lr) >= 0.0:
            raise ValueError(f"{who}: lr must be >= 0, got {lr}")
        self.lr = _scheduler(who, "learning rate", lr)
        if dtype not in _dt.FLOATS:
            raise TypeError(f"{who}: dtype must be tensor.float32 or float16, got {_dt.name(dtype)}")
        self.dtype = dtype
        if loss_scale is not None:
            loss_scale = float(loss_scale)
            if not (math.isfinite(loss_scale) and loss_scale > 0.0):
                raise ValueError(f"{who}: loss_scale must be a positive finite number, got {loss_scale}")
        self.loss_scale = loss_scale
        self.master_weights = bool(master_weights)
        # SINGA's step counter: float32, shape (1,), on the default device until the first parameter comes
        self.step_counter = tensor.zeros((1,))
        self.skipped_steps: Tensor | None = None  # int32, 0-d: steps skipped for inf/nan gradients (loss_scale)
        if loss_scale is not None:
            self.skipped_steps = ops.full((), 0, _dt.int32, self.step_counter.device)
        self._device: Device | None = None  # the parameters' device, fixed by the first update
        self._ok: Tensor | None = None  # during a loss-scaled call(): bool 0-d, every gradient is finite
        self._unscaled: dict[int, Tensor] = {}  # during a loss-scaled call(): id(grad) -> float32 grad / loss_scale
        self._states: dict[int, _ParamState] = {}
        self._names: set[str] = set()
        self._scalars: dict[tuple, Any] = {}  # per-step device scalars; step() clears them
        self._pending: dict[tuple[str, str], np.ndarray] = {}  # set_states() values for parameters not seen yet
        self._init_values()

    @property
    def state_names(self) -> tuple[str, ...]:
        """The state groups the rule uses now (SGD without momentum keeps none)."""
        return self.state_groups

    def __setattr__(self, name: str, value: Any) -> None:
        # a hyper-parameter stays a DecayScheduler (`opt.momentum = 0.5` becomes Constant(0.5)); its value tensor,
        # once it exists, is recomputed in place
        for sched, value_name in type(self)._values:
            if name == sched:
                value = _scheduler(type(self).__name__, name, value)
                object.__setattr__(self, name, value)
                v = self.__dict__.get(value_name)
                if v is not None:
                    ops.assign(v, self._evaluate(value))
                    self._scalars.clear()
                return
        object.__setattr__(self, name, value)

    def _init_values(self) -> None:
        """Create the `*_value` tensors of the schedulers set so far (a subclass calls this again after setting
        its own)."""
        for sched, value in self._values:
            s = getattr(self, sched, None)
            if s is not None and not hasattr(self, value):
                setattr(self, value, self._evaluate(s))

    def _evaluate(self, s: DecayScheduler) -> Tensor:
        """scheduler(step_counter) as a float32 tensor of the counter's shape (a scheduler may return a number)."""
        v = s(self.step_counter)
        if not isinstance(v, Tensor):
            return ops.full(self.step_counter.shape, float(v), _dt.float32, self.step_counter.device)
        return v if v.dtype == _dt.float32 else ops.cast(v, _dt.float32)

    # -- the public protocol ------------------------------------------------------------------------------------------
    def __call__(self, loss: Tensor) -> None:
        self.call(loss)
        self.step()

    def call(self, loss: Tensor) -> None:
        """Backward from `loss` and update each parameter as its gradient arrives (no step()). The graph's saved
        tensors are released as the backward goes: the step is done with it."""
        from singa import autograd

        if self.loss_scale is not None:
            self._scaled_call(autograd, loss)
            return
        graph.set_phase("backward")
        for p, g in autograd.backward(loss, retain_graph=False):
            self.update(p, g)
            graph.set_phase("backward")
        graph.set_phase("update")

    def _scaled_call(self, autograd: Any, loss: Tensor) -> None:
        """Backward from loss_scale * loss, unscale every gradient in float32, then update unless one is inf/nan."""
        scale = self.loss_scale
        if isinstance(loss, Tensor) and loss.dtype == _dt.float16 and scale > _F16_MAX:
            raise ValueError(f"{type(self).__name__}: loss_scale {scale:g} overflows the float16 loss (largest "
                             f"float16: {_F16_MAX:g}); use at most 32768")
        graph.set_phase("backward")
        pairs = list(autograd.backward(loss, scale, retain_graph=False))  # every gradient first: the skip needs all
        graph.set_phase("update")
        inv = 1.0 / scale
        total = None
        unscaled: dict[int, Tensor] = {}
        for _, g in pairs:
            if not isinstance(g, Tensor) or g.dtype not in _dt.FLOATS:
                continue  # _check reports it
            g32 = ops.mul(g if g.dtype == _dt.float32 else ops.cast(g, _dt.float32), inv)
            s = ops.sum(g32)  # inf or nan when any element is (or, for float32 gradients, beyond 3.4e38 in all)
            total = s if total is None else ops.add(total, s)
            unscaled[id(g)] = g32
        if total is not None:
            z = ops.mul(total, 0.0)  # 0 when finite, nan otherwise
            self._ok = ops.cast(ops.eq(z, z), _dt.bool_)
        self._unscaled = unscaled
        try:
            for p, g in pairs:
                self.update(p, g)
        finally:
            self._unscaled = {}

    def backward_and_update(self, loss: Tensor) -> None:
        """Same as `opt(loss)` (DistOpt's spelling, so single- and multi-process scripts read alike)."""
        self(loss)

    def update(self, param: Tensor, grad: Tensor) -> None:
        """Update one parameter in place from its gradient."""
        self.apply(getattr(param, "name", None), param, grad)

    def apply(self, param_name: Any, param_value: Tensor, param_grad: Tensor) -> None:
        """Update `param_value` in place; `param_name` labels its state (in the state dicts and checkpoints)."""
        raise NotImplementedError(f"{type(self).__name__}.apply is not implemented")

    def step(self) -> None:
        """Advance the step counter and recompute every scheduled value (`lr_value` ...) from it."""
        self._scalars.clear()
        ok, self._ok = self._ok, None
        if ok is None:
            ops.add(self.step_counter, 1.0, out=self.step_counter)
        else:
            ops.add(self.step_counter, ops.cast(ok, _dt.float32), out=self.step_counter)
            done = ops.cast(ok, _dt.int32)  # 1, or 0 for a step skipped on overflow
            ops.add(self.skipped_steps, ops.sub(1, done), out=self.skipped_steps)
        self._refresh_values(constants=False)

    def _refresh_values(self, constants: bool) -> None:
        """value = scheduler(step_counter), written in place (a graph replay keeps using the same tensors)."""
        for sched, value in self._values:
            s = getattr(self, sched)
            if constants or type(s) is not Constant:
                ops.assign(getattr(self, value), self._evaluate(s))

    def device_check(self, *inputs: Tensor) -> None:
        """Move every tensor to the device of the first one (in place), as SINGA does."""
        dev = inputs[0].device
        for t in inputs[1:]:
            if t is not None and t.device is not dev:
                t.to_device(dev)

    # -- checkpoints --------------------------------------------------------------------------------------------------
    def get_states(self) -> dict[str, Any]:
        """SINGA's keys: {'step_counter': float, '<group>': {param name: Tensor}} with the rule's groups (SGD
        'moments', RMSProp 'running_average', AdaGrad 'history', Adam 'm' and 'v'), plus 'master' for float16
        parameters' float32 masters and 'skipped_steps' (an int) with loss scaling. The tensors are copies."""
        out: dict[str, Any] = {"step_counter": float(self.step_counter.to_numpy().reshape(-1)[0])}
        if self.skipped_steps is not None:
            out["skipped_steps"] = int(self.skipped_steps.to_numpy())
        for st in self._states.values():
            for group, t in st.tensors.items():
                out.setdefault(group, {})[st.name] = t.clone()
        for (group, name), v in self._pending.items():
            out.setdefault(group, {}).setdefault(name, Tensor(data=v, device=self.step_counter.device))
        return out

    def set_states(self, states: Mapping[str, Any]) -> None:
        """Restore what get_states() returned (values may be Tensors or numpy arrays). States of parameters not
        updated yet are applied at their first update (a fresh optimizer can be loaded before training resumes).
        Existing tensors are written in place; the scheduled values are recomputed from the restored counter."""
        who = type(self).__name__
        groups = set(self.state_groups) | {"master"}
        bad = [str(k) for k in states if k not in groups and k not in ("step_counter", "skipped_steps")]
        if bad:
            want = ", ".join(repr(g) for g in ("step_counter", *self.state_groups, "master", "skipped_steps"))
            raise KeyError(f"{who}.set_states: unknown state key(s) {', '.join(map(repr, bad))}; expected {want}")
        by_name = {st.name: st for st in self._states.values()}
        plan: list[tuple[str, str, np.ndarray]] = []
        for group in groups & set(states):
            values = states[group]
            if not isinstance(values, Mapping):
                raise TypeError(f"{who}.set_states: {group!r} must be a dict {{parameter name: tensor}}, got "
                                f"{type(values).__name__}")
            for name, v in values.items():
                arr = v.to_numpy() if isinstance(v, Tensor) else np.asarray(v)
                st = by_name.get(name)
                if st is not None and group in st.tensors and st.tensors[group].shape != arr.shape:
                    raise ValueError(f"{who}.set_states: {group}[{name!r}] has shape {arr.shape} but parameter "
                                     f"{name!r} has shape {st.param.shape}")
                plan.append((group, str(name), arr))
        if "step_counter" in states:
            self.step_counter.copy_from_numpy(np.asarray(_host(states["step_counter"]), np.float32).reshape(1))
        if "skipped_steps" in states and self.skipped_steps is not None:
            self.skipped_steps.copy_from_numpy(np.asarray(_host(states["skipped_steps"])).astype(np.int32).reshape(()))
        for group, name, arr in plan:
            st = by_name.get(name)
            if st is None or group not in st.tensors:  # applied when that state is created
                self._pending[(group, name)] = np.array(arr, copy=True)
            else:
                st.tensors[group].copy_from_numpy(arr)
        self._refresh_values(constants=True)
        self._scalars.clear()

    # -- helpers for subclasses ----------------------------------------------------------------------------------------
    def _check(self, name: Any, p: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
        who = type(self).__name__
        if not isinstance(p, Tensor) or not isinstance(g, Tensor):
            hint = ""
            if p is None or g is None:
                hint = (" (a layer creates its parameters at its first call: run the model once, or compile it, "
                        "before updating, and pass the gradients autograd.backward yields)")
            raise TypeError(f"{who}: parameter and gradient must be Tensors, got {type(p).__name__} and "
                            f"{type(g).__name__} for parameter {name!r}{hint}")
        self.device_check(p, g)
        if p.shape != g.shape:
            raise ValueError(f"{who}: gradient of shape {g.shape} for parameter {name!r} of shape {p.shape}")
        if p.dtype != g.dtype:
            raise TypeError(f"{who}: gradient dtype {_dt.name(g.dtype)} differs from parameter {name!r}'s "
                            f"{_dt.name(p.dtype)}")
        if p.dtype not in _dt.FLOATS:
            raise TypeError(f"{who}: parameter {name!r} has dtype {_dt.name(p.dtype)}; only float tensors are trained")
        graph.set_phase("update")
        self._bind(p.device)
        return p, g

    def _bind(self, dev: Device) -> None:
        """At the first update, move the counter and the scheduled values to the parameters' device (in place)."""
        if self._device is dev:
            return
        if self._device is not None:
            raise ValueError(f"{type(self).__name__}: parameters on {self._device.name} and {dev.name}; one optimizer "
                             "updates the parameters of one device")
        with graph.no_record():  # set-up: runs once, never replayed
            for t in (self.step_counter, self.skipped_steps, *(getattr(self, v) for _, v in self._values)):
                if t is not None and t.device is not dev:
                    t.to_device(dev)
        self._device = dev

    def _param_state(self, p: Tensor, name: Any) -> _ParamState:
        """The state record of parameter `p` (created empty, with its label, at its first update)."""
        st = self._states.get(id(p))
        if st is not None and st.param is p:
            return st
        label = self._unique_name(p, name)
        st = self._states[id(p)] = _ParamState(p, label, {})
        self._names.add(label)
        return st

    def _new_state_tensor(self, st: _ParamState, group: str, dtype: int, init: Tensor | None = None) -> Tensor:
        """State `group` of `st.param`, of its shape, on its device, in `dtype`: the value given to set_states, else
        `init` cast to dtype, else zeros."""
        p = st.param
        with graph.no_record():  # set-up: runs once, never replayed
            t = Tensor(p.shape, p.device, dtype, requires_grad=False)
            pending = self._pending.pop((group, st.name), None)
            if pending is not None:
                if pending.shape != p.shape:
                    raise ValueError(f"{type(self).__name__}: loaded state {group}[{st.name!r}] has shape "
                                     f"{pending.shape}, the parameter has shape {p.shape}")
                t.copy_from_numpy(pending)
            elif init is not None:
                ops.cast(init, dtype, out=t)
        st.tensors[group] = t
        return t

    def _state(self, p: Tensor, name: Any, like: Tensor | None = None) -> dict[str, Tensor]:
        """The state tensors of parameter `p` (zeros, or values given to set_states, at its first update), in the
        dtype of `like` (the tensor the rule updates: `p`, or its float32 master)."""
        like = p if like is None else like
        st = self._param_state(p, name)
        for s in self.state_names:
            t = st.tensors.get(s)
            if t is None:
                self._new_state_tensor(st, s, like.dtype)
            elif t.dtype != like.dtype:  # the parameter changed dtype since: keep the values, in the rule's dtype
                with graph.no_record():
                    t.to_type(like.dtype)
        return {s: st.tensors[s] for s in self.state_names}

    def _master(self, p: Tensor, name: Any) -> Tensor:
        """The float32 master copy of float16 parameter `p`, re-synchronised from `p` where they disagree."""
        st = self._param_state(p, name)
        m = st.tensors.get("master")
        if m is None or m.shape != p.shape:
            st.tensors.pop("master", None)
            m = self._new_state_tensor(st, "master", _dt.float32, init=p)
        # Recorded with the step: p was last written from m (cast(m) == p) unless something else wrote p since.
        stale = ops.ne(p, ops.cast(m, p.dtype))
        ops.where(stale, ops.cast(p, _dt.float32), m, out=m)
        return m

    def _begin(self, name: Any, p: Tensor, g: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor], list]:
        """Checks, then what the rule works on: (w, g, states, saved), with w the parameter itself or the float32
        master of a float16 parameter, g the gradient in w's dtype (unscaled in a loss-scaled step) and `saved`
        the pre-update copies _end restores when the step is skipped."""
        p, g = self._check(name, p, g)
        gu = self._unscaled.pop(id(g), None)
        if self.master_weights and p.dtype == _dt.float16:
            w = self._master(p, name)
        else:
            st = self._states.get(id(p))
            if st is not None and st.param is p:
                st.tensors.pop("master", None)  # p is no longer trained through a master
            if self._pending:  # a float16 checkpoint's master, loaded for what is now a float32 parameter
                label = st.name if st is not None and st.param is p else (name if isinstance(name, str) else p.name)
                self._pending.pop(("master", label), None)
            w = p
        g = g if gu is None else gu
        if g.dtype != w.dtype:
            g = ops.cast(g, w.dtype)
        states = self._state(p, name, w) if self.state_names else {}
        saved = []
        if self._ok is not None:
            saved = [(t, ops.copy(t)) for t in (w, *states.values())]
        return w, g, states, saved

    def _end(self, p: Tensor, w: Tensor, saved: list) -> None:
        """Undo the update when the step overflowed; write the master back into the float16 parameter."""
        for t, old in saved:
            ops.where(self._ok, t, old, out=t)
        if w is not p:
            ops.cast(w, p.dtype, out=p)  # rounded to float16, in the parameter's own buffer

    def _unique_name(self, p: Tensor, name: Any) -> str:
        label = name if isinstance(name, str) and name else (p.name if isinstance(p.name, str) and p.name else None)
        if label is None:
            label = f"param{len(self._states)}"
        base, k = label, 1
        while label in self._names:
            label = f"{base}#{k}"
            k += 1
        return label

    def _cached(self, key: str, p: Tensor, make: Any) -> Any:
        """A per-step scalar: `make(dev)` returns a float or a float 0-d tensor; cached per dtype until step()."""
        k = (key, p.dtype)
        v = self._scalars.get(k)
        if v is None:
            base = self._scalars.get((key, None))
            if base is None:
                base = self._scalars[(key, None)] = make(p.device)
            v = base
            if isinstance(base, Tensor) and base.dtype != p.dtype:
                v = ops.cast(base, p.dtype)
            self._scalars[k] = v
        return v

    def _hyper(self, sched: str, p: Tensor) -> Any:
        """A hyper-parameter now, in the rule's dtype: a float for a Constant, else its scheduled device value."""
        s = getattr(self, sched)
        if type(s) is Constant:
            return s.init_value
        value = dict(self._values)[sched]
        return self._cached(sched, p, lambda dev: ops.reshape(getattr(self, value), ()))

    def _step_f(self, dev: Device) -> Tensor:
        """The number of completed steps as a 0-d float tensor in the optimizer's dtype."""
        v = self._scalars.get(("step", None))
        if v is None:
            s = ops.reshape(self.step_counter, ())
            v = self._scalars[("step", None)] = s if self.dtype == s.dtype else ops.cast(s, self.dtype)
        return v

    @staticmethod
    def _descend(w: Tensor, step: Tensor, lr: Any) -> None:
        """w -= lr * step, in place: one pass for a float rate, else through the device scalar."""
        if isinstance(lr, float):
            ops.axpby(1.0, w, -lr, step, out=w)
        else:
            ops.sub(w, ops.mul(step, lr), out=w)

    def _decayed(self, p: Tensor, g: Tensor) -> Tensor:
        """g + weight_decay * p (SINGA skips the term when the schedule starts at 0)."""
        if self.weight_decay.init_value == 0:
            return g
        return _combine(1.0, g, self._hyper("weight_decay", p), p)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(lr={self.lr.init_value if type(self.lr) is Constant else self.lr!r})"


def _host(v: Any) -> Any:
    return v.to_numpy() if isinstance(v, Tensor) else v


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay (PyTorch's rules):

        g = grad + weight_decay * p
        buf = g at the first step, else momentum * buf + (1 - dampening) * g
        g = g + momentum * buf if nesterov else buf          (when momentum != 0)
        p = p - lr * g
    """

    state_groups = ("moments",)
    _values = (("lr", "lr_value"), ("momentum", "mom_value"), ("dampening", "dam_value"),
               ("weight_decay", "decay_value"))

    def __init__(self, lr: float | DecayScheduler = 0.1, momentum: float | DecayScheduler = 0,
                 dampening: float | DecayScheduler = 0, weight_decay: float | DecayScheduler = 0,
                 nesterov: bool = False, dtype: int = tensor.float32, *, loss_scale: float | None = None,
                 master_weights: bool = True):
        super().__init__(lr, dtype, loss_scale=loss_scale, master_weights=master_weights)
        self.momentum = _scheduler("SGD", "momentum", momentum)
        self.dampening = _scheduler("SGD", "dampening", dampening)
        self.weight_decay = _scheduler("SGD", "weight_decay", weight_decay)
        if self.momentum.init_value < 0 or self.weight_decay.init_value < 0:
            raise ValueError(f"SGD: momentum and weight_decay must be >= 0, got {self.momentum.init_value} and "
                             f"{self.weight_decay.init_value}")
        self.nesterov = bool(nesterov)
        if self.nesterov and (self.momentum.init_value <= 0 or self.dampening.init_value != 0):
            raise ValueError("SGD: Nesterov momentum needs momentum > 0 and dampening = 0")
        self._init_values()

    @property
    def state_names(self) -> tuple[str, ...]:
        return self.state_groups if self.momentum.init_value != 0 else ()

    @property
    def moments(self) -> _StateView:
        """{parameter name: momentum buffer}."""
        return _StateView(self, "moments")

    @moments.setter
    def moments(self, values: Mapping[str, Any]) -> None:
        self.set_states({"moments": values})

    def apply(self, param_name: Any, param_value: Tensor, param_grad: Tensor) -> None:
        p = param_value
        buf = self._plain_momentum(p, param_grad)
        if buf is not None:  # the common rule, after the first step: one pass (sgd_momentum), none of the checks
            ops.sgd_momentum(p, buf, param_grad, self.lr.init_value, self.momentum.init_value)
            return
        w, g, st, saved = self._begin(param_name, param_value, param_grad)
        lr = self._hyper("lr", w)
        g = self._decayed(w, g)
        if self.state_names:
            buf = st["moments"]
            mom = self._hyper("momentum", w)
            if type(self.dampening) is Constant and self.dampening.init_value == 0:
                if (not self.nesterov and isinstance(lr, float) and isinstance(mom, float)
                        and _one_pass(w, buf, g)):
                    ops.sgd_momentum(w, buf, g, lr, mom)
                    self._end(p, w, saved)
                    return
                _combine(mom, buf, 1.0, g, out=buf)
            else:  # the factor changes after the first step: a device scalar, not a parameter
                ops.add(_times(buf, mom), ops.mul(g, self._cached("damp", w, self._damp)), out=buf)
            g = _combine(1.0, g, mom, buf) if self.nesterov else buf
        self._descend(w, g, lr)
        self._end(p, w, saved)

    def _plain_momentum(self, p: Tensor, g: Tensor) -> Tensor | None:
        """The momentum buffer of `p` when this update is the plain rule (constant lr and momentum > 0, no dampening,
        weight decay, Nesterov, loss scaling or float16 master) on a parameter updated before on this device, whose
        gradient and buffer ops.sgd_momentum takes (_one_pass); else None (the general path)."""
        if (type(self.lr) is not Constant or type(self.momentum) is not Constant or self.nesterov
                or type(self.dampening) is not Constant or self.dampening.init_value != 0
                or self.weight_decay.init_value != 0 or self.momentum.init_value == 0 or self._ok is not None
                or self._unscaled or p.__class__ is not Tensor or g.__class__ is not Tensor):
            return None
        st = self._states.get(id(p))
        if st is None or st.param is not p or "master" in st.tensors or self._device is not p.device:
            return None
        buf = st.tensors.get("moments")
        if buf is None or g.device is not p.device or not _one_pass(p, buf, g):
            return None
        graph.set_phase("update")
        return buf

    def _damp(self, dev: Device) -> Tensor:
        # 1 at the first step (the buffer starts as the gradient itself), 1 - dampening afterwards
        first_done = ops.clip(self._step_f(dev), 0.0, 1.0)
        d = self.dampening.init_value if type(self.dampening) is Constant else \
            ops.cast(ops.reshape(self.dam_value, ()), first_done.dtype)
        return ops.sub(1.0, ops.mul(first_done, d))


class _SquareScaled(Optimizer):
    """The rule RMSProp and AdaGrad share: a state accumulates g^2 (`_accumulate`, in place), then
    p -= lr * g / (sqrt(state) + epsilon)."""

    def _accumulate(self, acc: Tensor, g: Tensor, w: Tensor) -> None:
        raise NotImplementedError

    def apply(self, param_name: Any, param_value: Tensor, param_grad: Tensor) -> None:
        p = param_value
        w, g, st, saved = self._begin(param_name, param_value, param_grad)
        lr = self._hyper("lr", w)
        g = self._decayed(w, g)
        acc = st[self.state_names[0]]
        self._accumulate(acc, g, w)
        denom = ops.add(ops.sqrt(acc), self._hyper("epsilon", w))
        self._descend(w, ops.div(g, denom), lr)
        self._end(p, w, saved)


class RMSProp(_SquareScaled):
    """RMSProp (PyTorch's, not centred): sq = rho * sq + (1 - rho) * g^2;  p -= lr * g / (sqrt(sq) + epsilon)."""

    state_groups = ("running_average",)
    _values = (("lr", "lr_value"), ("rho", "rho_value"), ("epsilon", "epsilon_value"),
               ("weight_decay", "decay_value"))

    def __init__(self, lr: float | DecayScheduler = 0.1, rho: float | DecayScheduler = 0.9,
                 epsilon: float | DecayScheduler = 1e-08, weight_decay: float | DecayScheduler = 0, *,
                 loss_scale: float | None = None, master_weights: bool = True):
        super().__init__(lr, loss_scale=loss_scale, master_weights=master_weights)
        self.rho = _scheduler("RMSProp", "rho", rho)
        self.epsilon = _scheduler("RMSProp", "epsilon", epsilon)
        self.weight_decay = _scheduler("RMSProp", "weight_decay", weight_decay)
        if not 0.0 <= self.rho.init_value < 1.0:
            raise ValueError(f"RMSProp: rho must be in [0, 1), got {self.rho.init_value}")
        self._init_values()

    @property
    def running_average(self) -> _StateView:
        """{parameter name: running average of g^2}."""
        return _StateView(self, "running_average")

    @running_average.setter
    def running_average(self, values: Mapping[str, Any]) -> None:
        self.set_states({"running_average": values})

    def _accumulate(self, sq: Tensor, g: Tensor, w: Tensor) -> None:
        rho = self._hyper("rho", w)
        _combine(rho, sq, _one_minus(rho), ops.square(g), out=sq)


class AdaGrad(_SquareScaled):
    """AdaGrad (PyTorch's, no lr decay): acc += g^2;  p -= lr * g / (sqrt(acc) + epsilon)."""

    state_groups = ("history",)
    _values = (("lr", "lr_value"), ("epsilon", "epsilon_value"), ("weight_decay", "decay_value"))

    def __init__(self, lr: float | DecayScheduler = 0.1, epsilon: float | DecayScheduler = 1e-08,
                 weight_decay: float | DecayScheduler = 0, *, loss_scale: float | None = None,
                 master_weights: bool = True):
        super().__init__(lr, loss_scale=loss_scale, master_weights=master_weights)
        self.epsilon = _scheduler("AdaGrad", "epsilon", epsilon)
        self.weight_decay = _scheduler("AdaGrad", "weight_decay", weight_decay)
        self._init_values()

    @property
    def history(self) -> _StateView:
        """{parameter name: sum of g^2}."""
        return _StateView(self, "history")

    @history.setter
    def history(self, values: Mapping[str, Any]) -> None:
        self.set_states({"history": values})

    def _accumulate(self, acc: Tensor, g: Tensor, w: Tensor) -> None:
        ops.add(acc, ops.square(g), out=acc)


class Adam(Optimizer):
    """Adam with bias correction (PyTorch's; weight decay is an L2 term, not AdamW's decoupled decay):

        m = beta_1 * m + (1 - beta_1) * g;   v = beta_2 * v + (1 - beta_2) * g^2;   t = steps done + 1
        p -= lr / (1 - beta_1^t) * m / (sqrt(v) / sqrt(1 - beta_2^t) + epsilon)
    """

    state_groups = ("m", "v")
    _values = (("lr", "lr_value"), ("beta_1", "beta_1_value"), ("beta_2", "beta_2_value"),
               ("epsilon", "epsilon_value"), ("weight_decay", "decay_value"))

    def __init__(self, lr: float | DecayScheduler = 0.1, beta_1: float | DecayScheduler = 0.9,
                 beta_2: float | DecayScheduler = 0.999, epsilon: float | DecayScheduler = 1e-08,
                 weight_decay: float | DecayScheduler = 0, *, loss_scale: float | None = None,
                 master_weights: bool = True):
        super().__init__(lr, loss_scale=loss_scale, master_weights=master_weights)
        self.beta_1 = _scheduler("Adam", "beta_1", beta_1)
        self.beta_2 = _scheduler("Adam", "beta_2", beta_2)
        self.epsilon = _scheduler("Adam", "epsilon", epsilon)
        self.weight_decay = _scheduler("Adam", "weight_decay", weight_decay)
        for what in ("beta_1", "beta_2"):
            b = getattr(self, what).init_value
            if not 0.0 <= b < 1.0:
                raise ValueError(f"Adam: {what} must be in [0, 1), got {b}")
        self._init_values()

    @property
    def m(self) -> _StateView:
        """{parameter name: first moment}."""
        return _StateView(self, "m")

    @m.setter
    def m(self, values: Mapping[str, Any]) -> None:
        self.set_states({"m": values})

    @property
    def v(self) -> _StateView:
        """{parameter name: second moment}."""
        return _StateView(self, "v")

    @v.setter
    def v(self, values: Mapping[str, Any]) -> None:
        self.set_states({"v": values})

    def apply(self, param_name: Any, param_value: Tensor, param_grad: Tensor) -> None:
        p = param_value
        w, g, st, saved = self._begin(param_name, param_value, param_grad)
        g = self._decayed(w, g)
        m, v = st["m"], st["v"]
        b1, b2 = self._hyper("beta_1", w), self._hyper("beta_2", w)
        _combine(b1, m, _one_minus(b1), g, out=m)
        _combine(b2, v, _one_minus(b2), ops.square(g), out=v)
        denom = ops.add(ops.div(ops.sqrt(v), self._cached("bc2", w, self._bc2_sqrt)), self._hyper("epsilon", w))
        self._descend(w, ops.div(m, denom), self._cached("step_size", w, self._step_size))
        self._end(p, w, saved)

    def _t(self, dev: Device) -> Tensor:
        t = self._scalars.get(("t", None))
        if t is None:
            t = self._scalars[("t", None)] = ops.add(self._step_f(dev), 1.0)
        return t

    def _beta_pow(self, which: str, dev: Device) -> Tensor:
        """beta ** t on the device."""
        t = self._t(dev)
        s = getattr(self, which)
        if type(s) is Constant:
            return ops.unary("rpow_scalar", t, alpha=s.init_value)
        return ops.pow(ops.cast(ops.reshape(getattr(self, which + "_value"), ()), t.dtype), t)

    def _bc2_sqrt(self, dev: Device) -> Tensor:
        return ops.sqrt(ops.sub(1.0, self._beta_pow("beta_2", dev)))

    def _step_size(self, dev: Device) -> Tensor:
        bc1 = ops.sub(1.0, self._beta_pow("beta_1", dev))
        t = self._t(dev)
        lr = self.lr.init_value if type(self.lr) is Constant else ops.cast(ops.reshape(self.lr_value, ()), t.dtype)
        return ops.div(lr, bc1)


# data-parallel training (singa.distopt): imported last, it builds on the optimizers above
from singa.distopt import DistOpt  # noqa: E402
