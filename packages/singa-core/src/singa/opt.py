"""SINGA's `opt` module: optimizers (SGD, RMSProp, AdaGrad, Adam) and learning-rate schedules.

The update equations are PyTorch's (`torch.optim`), weight decay included (an L2 term added to the gradient).

Updates are written in place into each parameter's own memory, and every quantity that changes from step to step
(the learning rate of a schedule, Adam's bias corrections, SGD's first-step dampening) is computed on the device from
the step counter, itself a device tensor advanced by `step()`. A training step therefore has no Python-side state
that a graph replay (singa.graph) would miss, and a recorded step stays correct at every later step.

Optimizer state (momentum buffers, moments) belongs to the parameter *object*: it is kept in a dict keyed by
`id(param)` that also holds the parameter, so that the id cannot be reused. Two parameters with the same name never
share state. Names only label the state in `get_states()` / `set_states()` checkpoints.

Half precision. A float16 parameter is trained through a float32 *master* copy (`master_weights=True`, the default):
at its first update the optimizer creates the master (the parameter cast to float32) and keeps every state of that
parameter (momentum, moments) in float32 too. Each update casts the float16 gradient to float32, applies the rule to
the master, and writes the master rounded to float16 back into the parameter's own buffer (in place, so a recorded
graph keeps working). Before each update the master is re-synchronised from the parameter when the two disagree
(something else wrote the parameter: `set_params`, `load_states` of a checkpoint without masters), so the float16
tensor stays the source of truth. Masters are saved as '<param>/master' states. With `master_weights=False` the
update runs in the parameter's own dtype, as in Apache SINGA (small updates are then lost to float16 rounding).

Loss scaling. `loss_scale=S` (static) makes `opt(loss)` back-propagate from S * loss, so that small float16
gradients do not flush to zero, then unscale each gradient in float32 (times 1 / S) before the update. All gradients
are computed before any parameter is updated; when one of them holds an inf or a NaN the whole step is skipped on the
device (parameters, masters and states keep their values, the step counter does not advance and `skipped_steps`
counts it), with no host read, so graph replays skip the same way. `update(param, grad)` called directly takes
unscaled gradients and checks nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from singa import dtypes as _dt
from singa import graph, ops, tensor
from singa.backend import Device
from singa.tensor import Tensor

__all__ = ["DecayScheduler", "Constant", "ExponentialDecay", "Optimizer", "SGD", "RMSProp", "AdaGrad", "Adam",
           "DistOpt"]

_F16_MAX = 65504.0  # the largest finite float16


# -- learning-rate schedules ----------------------------------------------------------------------------------------


class DecayScheduler:
    """A value that depends on the step: `scheduler(step)` for a number (a float) or a 0-d Tensor (a Tensor on the
    same device, computed with kernels so that graph replays follow the schedule)."""

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
            return ops.full((), self.init_value, dt, step.device)
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


# -- optimizers -----------------------------------------------------------------------------------------------------


class _ParamState:
    __slots__ = ("param", "name", "tensors")

    def __init__(self, param: Tensor, name: str, tensors: dict[str, Tensor]):
        self.param = param  # keeps id(param) from being reused while the state exists
        self.name = name
        self.tensors = tensors


class Optimizer:
    """Base class: `opt(loss)` runs `autograd.backward(loss)`, updates every parameter it yields, then `step()`.

    `lr` is a number or a DecayScheduler; `dtype` is that of the step counter's float view and the schedule values.
    `loss_scale` (a number, best a power of two; None: off) turns on static loss scaling with overflow skipping;
    `master_weights` (default True) trains float16 parameters through float32 master copies (see the module doc).
    """

    state_names: tuple[str, ...] = ()

    def __init__(self, lr: float | DecayScheduler, dtype: int = tensor.float32, *, loss_scale: float | None = None,
                 master_weights: bool = True):
        if isinstance(lr, DecayScheduler):
            self.lr = lr
        else:
            lr = float(lr)
            if not lr >= 0.0:
                raise ValueError(f"{type(self).__name__}: lr must be >= 0, got {lr}")
            self.lr = Constant(lr)
        if dtype not in _dt.FLOATS:
            raise TypeError(f"{type(self).__name__}: dtype must be tensor.float32 or float16, got {_dt.name(dtype)}")
        self.dtype = dtype
        if loss_scale is not None:
            loss_scale = float(loss_scale)
            if not (math.isfinite(loss_scale) and loss_scale > 0.0):
                raise ValueError(f"{type(self).__name__}: loss_scale must be a positive finite number, got "
                                 f"{loss_scale}")
        self.loss_scale = loss_scale
        self.master_weights = bool(master_weights)
        self.step_counter: Tensor | None = None  # int32, 0-d, on the device of the first parameter updated
        self.skipped_steps: Tensor | None = None  # int32, 0-d: steps skipped for inf/nan gradients (loss_scale)
        self._one: Tensor | None = None
        self._ok: Tensor | None = None  # during a loss-scaled call(): bool 0-d, every gradient is finite
        self._unscaled: dict[int, Tensor] = {}  # during a loss-scaled call(): id(grad) -> float32 grad / loss_scale
        self._states: dict[int, _ParamState] = {}
        self._names: set[str] = set()
        self._scalars: dict[tuple, Any] = {}  # per-step device scalars; step() clears them
        self._pending: dict[str, np.ndarray] = {}  # set_states() values for parameters not seen yet
        self._pending_step = 0
        self._pending_skipped = 0

    # -- the public protocol ------------------------------------------------------------------------------------------
    def __call__(self, loss: Tensor) -> None:
        self.call(loss)
        self.step()

    def call(self, loss: Tensor) -> None:
        """Backward from `loss` and update each parameter as its gradient arrives (no step())."""
        from singa import autograd

        if self.loss_scale is not None:
            self._scaled_call(autograd, loss)
            return
        graph.set_phase("backward")
        for p, g in autograd.backward(loss):
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
        pairs = list(autograd.backward(loss, scale))  # every gradient first: the skip decision needs them all
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
        self.apply(param.name, param, grad)

    def apply(self, param_name: Any, param_value: Tensor, param_grad: Tensor) -> None:
        """Update `param_value` in place; `param_name` only labels its state in checkpoints."""
        raise NotImplementedError(f"{type(self).__name__}.apply is not implemented")

    def step(self) -> None:
        """Advance the step counter (learning-rate schedules and bias corrections read it)."""
        self._scalars.clear()
        ok, self._ok = self._ok, None
        if self.step_counter is None:
            self._pending_step += 1
            return
        if ok is None:
            ops.add(self.step_counter, self._one, out=self.step_counter)
            return
        done = ops.cast(ok, _dt.int32)  # 1, or 0 for a step skipped on overflow
        ops.add(self.step_counter, done, out=self.step_counter)
        ops.add(self.skipped_steps, ops.sub(self._one, done), out=self.skipped_steps)

    def device_check(self, *inputs: Tensor) -> None:
        """Move every tensor to the device of the first one (in place), as SINGA does."""
        dev = inputs[0].device
        for t in inputs[1:]:
            if t is not None and t.device is not dev:
                t.to_device(dev)

    # -- checkpoints --------------------------------------------------------------------------------------------------
    def get_states(self) -> dict[str, Tensor]:
        """{'step_counter': ..., '<param name>/<state>': ...} as Tensor copies (np.asarray converts each)."""
        out: dict[str, Tensor] = {}
        if self.step_counter is not None:
            out["step_counter"] = self.step_counter.clone()
        else:
            out["step_counter"] = tensor.from_numpy(np.array(self._pending_step, np.int32))
        if self.loss_scale is not None:
            out["skipped_steps"] = (self.skipped_steps.clone() if self.skipped_steps is not None
                                    else tensor.from_numpy(np.array(self._pending_skipped, np.int32)))
        for st in self._states.values():
            for s, t in st.tensors.items():
                out[f"{st.name}/{s}"] = t.clone()
        for k, v in self._pending.items():
            out.setdefault(k, tensor.from_numpy(v))
        return out

    def set_states(self, states: Mapping[str, Any]) -> None:
        """Restore what get_states() returned. States of parameters not updated yet are applied at their first
        update (a fresh optimizer can be loaded before training resumes). Existing tensors are written in place."""
        by_name = {st.name: st for st in self._states.values()}
        plan: list[tuple[str, np.ndarray]] = []
        bad: list[str] = []
        step = skipped = None
        for k, v in states.items():
            if k == "step_counter":
                step = int(np.asarray(v).reshape(()))
                continue
            if k == "skipped_steps":
                skipped = int(np.asarray(v).reshape(()))
                continue
            name, sep, s = str(k).rpartition("/")
            if not sep or (s not in self.state_names and s != "master"):
                bad.append(str(k))
                continue
            arr = np.asarray(v)
            st = by_name.get(name)
            if st is not None and s in st.tensors and st.tensors[s].shape != arr.shape:
                raise ValueError(f"{type(self).__name__}.set_states: {k!r} has shape {arr.shape} but parameter "
                                 f"{name!r} has shape {st.param.shape}")
            plan.append((str(k), arr))
        if bad:
            want = ", ".join(self.state_names) or "none"
            raise KeyError(f"{type(self).__name__}.set_states: unknown state(s) {', '.join(map(repr, bad))}; "
                           f"expected 'step_counter' and '<param>/<state>' with <state> one of: {want} (or "
                           "'master', a float16 parameter's float32 copy)")
        if step is not None:
            if self.step_counter is not None:
                self.step_counter.copy_from_numpy(np.array(step, np.int32))
            else:
                self._pending_step = step
        if skipped is not None:
            if self.skipped_steps is not None:
                self.skipped_steps.copy_from_numpy(np.array(skipped, np.int32))
            else:
                self._pending_skipped = skipped
        for k, arr in plan:
            name, _, s = k.rpartition("/")
            st = by_name.get(name)
            if st is None or s not in st.tensors:  # applied when that state is created
                self._pending[k] = np.array(arr, copy=True)
            else:
                st.tensors[s].copy_from_numpy(arr)
        self._scalars.clear()

    # -- helpers for subclasses ----------------------------------------------------------------------------------------
    def _check(self, name: Any, p: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
        who = type(self).__name__
        if not isinstance(p, Tensor) or not isinstance(g, Tensor):
            raise TypeError(f"{who}: parameter and gradient must be Tensors, got {type(p).__name__} and "
                            f"{type(g).__name__}")
        self.device_check(p, g)
        if p.shape != g.shape:
            raise ValueError(f"{who}: gradient of shape {g.shape} for parameter {name!r} of shape {p.shape}")
        if p.dtype != g.dtype:
            raise TypeError(f"{who}: gradient dtype {_dt.name(g.dtype)} differs from parameter {name!r}'s "
                            f"{_dt.name(p.dtype)}")
        if p.dtype not in _dt.FLOATS:
            raise TypeError(f"{who}: parameter {name!r} has dtype {_dt.name(p.dtype)}; only float tensors are trained")
        graph.set_phase("update")
        self._counter(p.device)  # step() is then a device operation, replayed with the step
        return p, g

    def _param_state(self, p: Tensor, name: Any) -> _ParamState:
        """The state record of parameter `p` (created empty, with its checkpoint label, at its first update)."""
        st = self._states.get(id(p))
        if st is not None and st.param is p:
            return st
        label = self._unique_name(p, name)
        st = self._states[id(p)] = _ParamState(p, label, {})
        self._names.add(label)
        return st

    def _new_state_tensor(self, st: _ParamState, s: str, dtype: int, init: Tensor | None = None) -> Tensor:
        """State `s` of `st.param`, of its shape, on its device, in `dtype`: the value given to set_states, else
        `init` cast to dtype, else zeros."""
        p = st.param
        with graph.no_record():  # set-up: runs once, never replayed
            t = Tensor(p.shape, p.device, dtype, requires_grad=False)
            pending = self._pending.pop(f"{st.name}/{s}", None)
            if pending is not None:
                if pending.shape != p.shape:
                    raise ValueError(f"{type(self).__name__}: loaded state {st.name}/{s} has shape {pending.shape}, "
                                     f"the parameter has shape {p.shape}")
                t.copy_from_numpy(pending)
            elif init is not None:
                ops.cast(init, dtype, out=t)
        st.tensors[s] = t
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
                self._pending.pop(f"{label}/master", None)
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

    def _counter(self, dev: Device) -> Tensor:
        if self.step_counter is None:
            with graph.no_record():
                self.step_counter = Tensor((), dev, _dt.int32, requires_grad=False)
                self._one = ops.full((), 1, _dt.int32, dev)
                self.skipped_steps = ops.full((), self._pending_skipped, _dt.int32, dev)
                if self._pending_step:
                    self.step_counter.copy_from_numpy(np.array(self._pending_step, np.int32))
        elif self.step_counter.device is not dev:
            raise ValueError(f"{type(self).__name__}: parameters on {self.step_counter.device.name} and {dev.name}; "
                             "one optimizer updates the parameters of one device")
        return self.step_counter

    def _cached(self, key: str, p: Tensor, make: Any) -> Any:
        """A per-step scalar: `make(dev)` returns a float or a float32 0-d tensor; cached per dtype until step()."""
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

    def _step_f(self, dev: Device) -> Tensor:
        """The number of completed steps as a float 0-d tensor."""
        v = self._scalars.get(("step", None))
        if v is None:
            v = self._scalars[("step", None)] = ops.cast(self._counter(dev), self.dtype)
        return v

    def _lr(self, p: Tensor) -> Any:
        """The learning rate now: a float for a constant rate, else a device scalar from the schedule."""
        if type(self.lr) is Constant:
            return self.lr.init_value
        return self._cached("lr", p, lambda dev: self.lr(self._step_f(dev)))

    @staticmethod
    def _descend(w: Tensor, step: Tensor, lr: Any) -> None:
        """w -= lr * step, in place: one pass for a float rate, else through the device scalar."""
        if isinstance(lr, float):
            ops.axpby(1.0, w, -lr, step, out=w)
        else:
            ops.sub(w, ops.mul(step, lr), out=w)

    def _decayed(self, p: Tensor, g: Tensor, weight_decay: float) -> Tensor:
        return ops.axpby(1.0, g, weight_decay, p) if weight_decay else g

    def __repr__(self) -> str:
        return f"{type(self).__name__}(lr={self.lr.init_value if type(self.lr) is Constant else self.lr!r})"


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay (PyTorch's rules):

        g = grad + weight_decay * p
        buf = g at the first step, else momentum * buf + (1 - dampening) * g
        g = g + momentum * buf if nesterov else buf          (when momentum != 0)
        p = p - lr * g
    """

    def __init__(self, lr: float | DecayScheduler = 0.1, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, dtype: int = tensor.float32, *,
                 loss_scale: float | None = None, master_weights: bool = True):
        super().__init__(lr, dtype, loss_scale=loss_scale, master_weights=master_weights)
        if momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD: momentum and weight_decay must be >= 0, got {momentum} and {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: Nesterov momentum needs momentum > 0 and dampening = 0")
        self.momentum = float(momentum)
        self.dampening = float(dampening)
        self.weight_decay = float(weight_decay)
        self.nesterov = bool(nesterov)
        self.state_names = ("momentum",) if self.momentum else ()

    def apply(self, param_name: Any, param_value: Tensor, param_grad: Tensor) -> None:
        p = param_value
        w, g, st, saved = self._begin(param_name, param_value, param_grad)
        lr = self._lr(w)
        g = self._decayed(w, g, self.weight_decay)
        if self.momentum:
            buf = st["momentum"]
            if self.dampening:  # the factor changes after the first step: a device scalar, not a parameter
                ops.mul(buf, self.momentum, out=buf)
                ops.add(buf, ops.mul(g, self._cached("damp", w, self._damp)), out=buf)
            else:
                ops.axpby(self.momentum, buf, 1.0, g, out=buf)
            g = ops.axpby(1.0, g, self.momentum, buf) if self.nesterov else buf
        self._descend(w, g, lr)
        self._end(p, w, saved)

    def _damp(self, dev: Device) -> Tensor:
        # 1 at the first step (the buffer starts as the gradient itself), 1 - dampening afterwards
        first_done = ops.clip(self._step_f(dev), 0.0, 1.0)
        return ops.add(ops.mul(first_done, -self.dampening), 1.0)


class _SquareScaled(Optimizer):
    """The rule RMSProp and AdaGrad share: a state accumulates g^2 (`_accumulate`, in place), then
    p -= lr * g / (sqrt(state) + epsilon)."""

    def _accumulate(self, acc: Tensor, g: Tensor) -> None:
        raise NotImplementedError

    def apply(self, param_name: Any, param_value: Tensor, param_grad: Tensor) -> None:
        p = param_value
        w, g, st, saved = self._begin(param_name, param_value, param_grad)
        lr = self._lr(w)
        g = self._decayed(w, g, self.weight_decay)
        acc = st[self.state_names[0]]
        self._accumulate(acc, g)
        denom = ops.add(ops.sqrt(acc), self.epsilon)
        self._descend(w, ops.div(g, denom), lr)
        self._end(p, w, saved)


class RMSProp(_SquareScaled):
    """RMSProp (PyTorch's, not centred): sq = rho * sq + (1 - rho) * g^2;  p -= lr * g / (sqrt(sq) + epsilon)."""

    state_names = ("square_avg",)

    def __init__(self, lr: float | DecayScheduler = 0.1, rho: float = 0.9, epsilon: float = 1e-08,
                 weight_decay: float = 0, *, loss_scale: float | None = None, master_weights: bool = True):
        super().__init__(lr, loss_scale=loss_scale, master_weights=master_weights)
        if not 0.0 <= rho < 1.0:
            raise ValueError(f"RMSProp: rho must be in [0, 1), got {rho}")
        self.rho = float(rho)
        self.epsilon = float(epsilon)
        self.weight_decay = float(weight_decay)

    def _accumulate(self, sq: Tensor, g: Tensor) -> None:
        ops.axpby(self.rho, sq, 1.0 - self.rho, ops.square(g), out=sq)


class AdaGrad(_SquareScaled):
    """AdaGrad (PyTorch's, no lr decay): acc += g^2;  p -= lr * g / (sqrt(acc) + epsilon)."""

    state_names = ("sum",)

    def __init__(self, lr: float | DecayScheduler = 0.1, epsilon: float = 1e-08, weight_decay: float = 0, *,
                 loss_scale: float | None = None, master_weights: bool = True):
        super().__init__(lr, loss_scale=loss_scale, master_weights=master_weights)
        self.epsilon = float(epsilon)
        self.weight_decay = float(weight_decay)

    def _accumulate(self, acc: Tensor, g: Tensor) -> None:
        ops.add(acc, ops.square(g), out=acc)


class Adam(Optimizer):
    """Adam with bias correction (PyTorch's; weight decay is an L2 term, not AdamW's decoupled decay):

        m = beta_1 * m + (1 - beta_1) * g;   v = beta_2 * v + (1 - beta_2) * g^2;   t = steps done + 1
        p -= lr / (1 - beta_1^t) * m / (sqrt(v) / sqrt(1 - beta_2^t) + epsilon)
    """

    state_names = ("m", "v")

    def __init__(self, lr: float | DecayScheduler = 0.1, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-08, weight_decay: float = 0, *, loss_scale: float | None = None,
                 master_weights: bool = True):
        super().__init__(lr, loss_scale=loss_scale, master_weights=master_weights)
        for what, b in (("beta_1", beta_1), ("beta_2", beta_2)):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"Adam: {what} must be in [0, 1), got {b}")
        self.beta_1 = float(beta_1)
        self.beta_2 = float(beta_2)
        self.epsilon = float(epsilon)
        self.weight_decay = float(weight_decay)

    def apply(self, param_name: Any, param_value: Tensor, param_grad: Tensor) -> None:
        p = param_value
        w, g, st, saved = self._begin(param_name, param_value, param_grad)
        g = self._decayed(w, g, self.weight_decay)
        m, v = st["m"], st["v"]
        ops.axpby(self.beta_1, m, 1.0 - self.beta_1, g, out=m)
        ops.axpby(self.beta_2, v, 1.0 - self.beta_2, ops.square(g), out=v)
        denom = ops.add(ops.div(ops.sqrt(v), self._cached("bc2", w, self._bc2_sqrt)), self.epsilon)
        self._descend(w, ops.div(m, denom), self._cached("step_size", w, self._step_size))
        self._end(p, w, saved)

    def _t(self, dev: Device) -> Tensor:
        t = self._scalars.get(("t", None))
        if t is None:
            t = self._scalars[("t", None)] = ops.add(self._step_f(dev), 1.0)
        return t

    def _bc2_sqrt(self, dev: Device) -> Tensor:
        return ops.sqrt(ops.unary("rsub_scalar", ops.unary("rpow_scalar", self._t(dev), alpha=self.beta_2), alpha=1.0))

    def _step_size(self, dev: Device) -> Tensor:
        bc1 = ops.unary("rsub_scalar", ops.unary("rpow_scalar", self._t(dev), alpha=self.beta_1), alpha=1.0)
        lr = self.lr.init_value if type(self.lr) is Constant else self.lr(self._step_f(dev))
        return ops.div(lr, bc1)


# data-parallel training (singa.distopt): imported last, it builds on the optimizers above
from singa.distopt import DistOpt  # noqa: E402
