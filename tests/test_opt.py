"""singa.opt against hand-computed numpy updates (float64) and against torch.optim on the same gradients.

Runs on the default device (SINGA_DEVICE picks it). Gradients are made by hand, so these tests need no autograd,
except the last ones, which check `opt(loss)` end to end.
"""

from __future__ import annotations

import numpy as np
import pytest

from singa import autograd, device, graph, ops, opt, tensor
from singa.tensor import Tensor

try:
    import torch
except ImportError:  # the numpy references still run
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch.optim is the reference")

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")

STEPS = 6
RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def dev():
    return device.get_default_device()


def _data(seed: int = 0, shapes=((3, 4), (5,))):
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(STEPS)]
    return params, grads


def _run_singa(o: opt.Optimizer, params, grads, dev) -> list[np.ndarray]:
    ps = [tensor.from_numpy(p.copy(), dev) for p in params]
    for gs in grads:
        for p, g in zip(ps, gs):
            o.update(p, tensor.from_numpy(g, dev))
        o.step()
    return [p.to_numpy() for p in ps]


def _run_torch(make, params, grads) -> list[np.ndarray]:
    ps = [torch.tensor(p.copy(), requires_grad=True) for p in params]
    o = make(ps)
    for gs in grads:
        for p, g in zip(ps, gs):
            p.grad = torch.tensor(g)
        o.step()
    return [p.detach().numpy() for p in ps]


# -- numpy references (float64) -------------------------------------------------------------------------------------


def _sgd_ref(params, grads, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, lrs=None):
    ps = [p.astype(np.float64) for p in params]
    bufs = [None] * len(ps)
    for t, gs in enumerate(grads):
        rate = lr if lrs is None else lrs[t]
        for i, g in enumerate(gs):
            g = g.astype(np.float64) + weight_decay * ps[i]
            if momentum:
                bufs[i] = g.copy() if bufs[i] is None else momentum * bufs[i] + (1 - dampening) * g
                g = g + momentum * bufs[i] if nesterov else bufs[i]
            ps[i] = ps[i] - rate * g
    return ps


def _adam_ref(params, grads, lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0):
    ps = [p.astype(np.float64) for p in params]
    m = [np.zeros_like(p) for p in ps]
    v = [np.zeros_like(p) for p in ps]
    for t, gs in enumerate(grads, start=1):
        for i, g in enumerate(gs):
            g = g.astype(np.float64) + weight_decay * ps[i]
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            mhat, vhat = m[i] / (1 - b1 ** t), v[i] / (1 - b2 ** t)
            ps[i] = ps[i] - lr * mhat / (np.sqrt(vhat) + eps)
    return ps


def _rmsprop_ref(params, grads, lr, rho=0.9, eps=1e-8, weight_decay=0.0):
    ps = [p.astype(np.float64) for p in params]
    sq = [np.zeros_like(p) for p in ps]
    for gs in grads:
        for i, g in enumerate(gs):
            g = g.astype(np.float64) + weight_decay * ps[i]
            sq[i] = rho * sq[i] + (1 - rho) * g * g
            ps[i] = ps[i] - lr * g / (np.sqrt(sq[i]) + eps)
    return ps


def _adagrad_ref(params, grads, lr, eps=1e-8, weight_decay=0.0):
    ps = [p.astype(np.float64) for p in params]
    acc = [np.zeros_like(p) for p in ps]
    for gs in grads:
        for i, g in enumerate(gs):
            g = g.astype(np.float64) + weight_decay * ps[i]
            acc[i] = acc[i] + g * g
            ps[i] = ps[i] - lr * g / (np.sqrt(acc[i]) + eps)
    return ps


def _close(got, want, rtol=RTOL, atol=ATOL):
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


SGD_CASES = [
    {},
    {"momentum": 0.9},
    {"momentum": 0.9, "nesterov": True},
    {"momentum": 0.9, "weight_decay": 0.01},
    {"momentum": 0.8, "dampening": 0.3},
    {"momentum": 0.7, "dampening": 0.5, "weight_decay": 0.05},
    {"momentum": 0.9, "nesterov": True, "weight_decay": 1e-3},
    {"weight_decay": 0.1},
]


@pytest.mark.parametrize("kw", SGD_CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "plain")
def test_sgd_matches_numpy(dev, kw):
    params, grads = _data(1)
    got = _run_singa(opt.SGD(lr=0.05, **kw), params, grads, dev)
    _close(got, _sgd_ref(params, grads, 0.05, **kw))


@needs_torch
@pytest.mark.parametrize("kw", SGD_CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "plain")
def test_sgd_matches_torch(dev, kw):
    params, grads = _data(2)
    got = _run_singa(opt.SGD(lr=0.1, **kw), params, grads, dev)
    _close(got, _run_torch(lambda ps: torch.optim.SGD(ps, lr=0.1, **kw), params, grads))


@needs_torch
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_adam_matches_numpy_and_torch(dev, wd):
    params, grads = _data(3)
    got = _run_singa(opt.Adam(lr=0.01, weight_decay=wd), params, grads, dev)
    _close(got, _adam_ref(params, grads, 0.01, weight_decay=wd))
    _close(got, _run_torch(lambda ps: torch.optim.Adam(ps, lr=0.01, eps=1e-8, weight_decay=wd), params, grads))


def test_adam_other_betas(dev):
    params, grads = _data(4)
    got = _run_singa(opt.Adam(lr=0.02, beta_1=0.5, beta_2=0.9, epsilon=1e-6), params, grads, dev)
    _close(got, _adam_ref(params, grads, 0.02, b1=0.5, b2=0.9, eps=1e-6))


@needs_torch
def test_rmsprop_matches_numpy_and_torch(dev):
    params, grads = _data(5)
    got = _run_singa(opt.RMSProp(lr=0.01, rho=0.8, epsilon=1e-7, weight_decay=0.01), params, grads, dev)
    _close(got, _rmsprop_ref(params, grads, 0.01, rho=0.8, eps=1e-7, weight_decay=0.01))
    _close(got, _run_torch(lambda ps: torch.optim.RMSprop(ps, lr=0.01, alpha=0.8, eps=1e-7, weight_decay=0.01),
                           params, grads))


@needs_torch
def test_adagrad_matches_numpy_and_torch(dev):
    params, grads = _data(6)
    got = _run_singa(opt.AdaGrad(lr=0.1, epsilon=1e-8), params, grads, dev)
    _close(got, _adagrad_ref(params, grads, 0.1))
    _close(got, _run_torch(lambda ps: torch.optim.Adagrad(ps, lr=0.1, eps=1e-8), params, grads))


def _inits(o, names):
    return tuple(getattr(o, n).init_value for n in names)


def test_defaults_follow_singa():
    sgd = opt.SGD()
    assert _inits(sgd, ("lr", "momentum", "dampening", "weight_decay")) == (0.1, 0, 0, 0)
    assert sgd.nesterov is False
    adam = opt.Adam()
    assert _inits(adam, ("lr", "beta_1", "beta_2", "epsilon", "weight_decay")) == (0.1, 0.9, 0.999, 1e-8, 0)
    rms = opt.RMSProp()
    assert _inits(rms, ("lr", "rho", "epsilon", "weight_decay")) == (0.1, 0.9, 1e-8, 0)
    ada = opt.AdaGrad()
    assert _inits(ada, ("lr", "epsilon", "weight_decay")) == (0.1, 1e-8, 0)


# -- in place, state ownership --------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [lambda: opt.SGD(0.1, momentum=0.9), lambda: opt.Adam(0.01), lambda: opt.RMSProp(),
                                  lambda: opt.AdaGrad()])
def test_updates_are_in_place(dev, make):
    o = make()
    p = tensor.from_numpy(np.ones((4, 3), np.float32), dev)
    buf, handle, before = p.buffer, p.buffer.handle, p.to_numpy()
    for _ in range(3):
        o.update(p, tensor.from_numpy(np.full((4, 3), 0.5, np.float32), dev))
        o.step()
    assert p.buffer is buf
    assert p.buffer.handle is handle
    assert not np.allclose(p.to_numpy(), before)


def test_same_name_does_not_share_state(dev):
    """Apache SINGA keys momentum by name, so two parameters called 'W' shared one buffer."""
    params, grads = _data(7, shapes=((3,), (3,)))
    o = opt.SGD(0.1, momentum=0.9)
    ps = [tensor.from_numpy(p.copy(), dev) for p in params]
    for p in ps:
        p.name = "W"
    for gs in grads:
        for p, g in zip(ps, gs):
            o.apply("W", p, tensor.from_numpy(g, dev))
        o.step()
    _close([p.to_numpy() for p in ps], _sgd_ref(params, grads, 0.1, momentum=0.9))
    assert sorted(o.get_states()["moments"]) == ["W", "W#1"]


def test_state_follows_the_object_not_a_reused_id(dev):
    o = opt.SGD(0.1, momentum=0.9)
    p = tensor.from_numpy(np.ones(3, np.float32), dev)
    o.update(p, tensor.from_numpy(np.ones(3, np.float32), dev))
    st = o._states[id(p)]
    assert st.param is p  # the optimizer keeps the parameter alive, so its id is never reused by another tensor


def test_float16_parameters(dev):
    params, grads = _data(8)
    p16 = [p.astype(np.float16) for p in params]
    g16 = [[g.astype(np.float16) for g in gs] for gs in grads]
    got = _run_singa(opt.SGD(0.05, momentum=0.9), p16, g16, dev)
    want = _sgd_ref(p16, g16, 0.05, momentum=0.9)
    for a, b in zip(got, want):
        assert a.dtype == np.float16
        np.testing.assert_allclose(a.astype(np.float64), b, rtol=2e-2, atol=2e-2)
    got = _run_singa(opt.Adam(0.01), p16, g16, dev)
    for a, b in zip(got, _adam_ref(p16, g16, 0.01)):
        np.testing.assert_allclose(a.astype(np.float64), b, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(("make", "err"), [
    (lambda: opt.SGD(0.1, nesterov=True), ValueError),
    (lambda: opt.SGD(0.1, momentum=0.9, dampening=0.1, nesterov=True), ValueError),
    (lambda: opt.SGD(-1.0), ValueError),
    (lambda: opt.Adam(beta_1=1.0), ValueError),
    (lambda: opt.RMSProp(rho=1.5), ValueError),
    (lambda: opt.ExponentialDecay(0.1, 0, 0.5), ValueError),
])
def test_bad_settings(make, err):
    with pytest.raises(err):
        make()


def test_bad_gradients(dev):
    o = opt.SGD(0.1)
    p = tensor.from_numpy(np.ones((2, 3), np.float32), dev)
    with pytest.raises(ValueError, match=r"shape \(3, 2\).*\(2, 3\)"):
        o.update(p, tensor.from_numpy(np.ones((3, 2), np.float32), dev))
    with pytest.raises(TypeError, match="dtype"):
        o.update(p, tensor.from_numpy(np.ones((2, 3), np.float16), dev))
    with pytest.raises(TypeError, match="Tensor"):
        o.update(p, np.ones((2, 3), np.float32))


# -- schedules ------------------------------------------------------------------------------------------------------


def test_schedules_on_numbers():
    assert opt.Constant(0.3)(17) == 0.3
    d = opt.ExponentialDecay(0.1, decay_steps=4, decay_rate=0.5)
    assert d(0) == pytest.approx(0.1)
    assert d(2) == pytest.approx(0.1 * 0.5 ** 0.5)
    assert d(8) == pytest.approx(0.025)
    s = opt.ExponentialDecay(0.1, decay_steps=4, decay_rate=0.5, staircase=True)
    assert [s(i) for i in (0, 3, 4, 7, 8)] == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025])


def test_schedules_on_tensors(dev):
    step = tensor.from_numpy(np.array(6.0, np.float32), dev)
    d = opt.ExponentialDecay(0.2, decay_steps=4, decay_rate=0.5, staircase=False)
    assert float(d(step).to_numpy()) == pytest.approx(0.2 * 0.5 ** 1.5, rel=1e-6)
    s = opt.ExponentialDecay(0.2, decay_steps=4, decay_rate=0.5, staircase=True)
    assert float(s(step).to_numpy()) == pytest.approx(0.1, rel=1e-6)
    assert float(opt.Constant(0.7)(step).to_numpy()) == pytest.approx(0.7)


@pytest.mark.parametrize("staircase", [False, True])
def test_sgd_follows_the_schedule(dev, staircase):
    params, grads = _data(9)
    sched = opt.ExponentialDecay(0.1, decay_steps=2, decay_rate=0.7, staircase=staircase)
    got = _run_singa(opt.SGD(sched, momentum=0.5), params, grads, dev)
    lrs = [sched(t) for t in range(STEPS)]
    _close(got, _sgd_ref(params, grads, None, momentum=0.5, lrs=lrs))


@needs_torch
def test_adam_with_schedule_matches_torch_exponential_lr(dev):
    params, grads = _data(10)
    got = _run_singa(opt.Adam(opt.ExponentialDecay(0.05, 1, 0.9)), params, grads, dev)

    ps = [torch.tensor(p.copy(), requires_grad=True) for p in params]
    o = torch.optim.Adam(ps, lr=0.05)
    sched = torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.9)
    for gs in grads:
        for p, g in zip(ps, gs):
            p.grad = torch.tensor(g)
        o.step()
        sched.step()
    _close(got, [p.detach().numpy() for p in ps])


# -- states ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [lambda: opt.SGD(0.1, momentum=0.9, dampening=0.2),
                                  lambda: opt.Adam(opt.ExponentialDecay(0.01, 2, 0.8)), lambda: opt.RMSProp(0.01),
                                  lambda: opt.AdaGrad(0.1)])
def test_states_round_trip_resumes_exactly(dev, make):
    params, grads = _data(11)
    straight = _run_singa(make(), params, grads, dev)

    o1 = make()
    half = _run_singa(o1, params, grads[:3], dev)
    states = o1.get_states()
    assert states["step_counter"] == 3.0
    # SINGA's keys; the values may also be numpy arrays (what a checkpoint holds)
    states = {k: {n: np.asarray(t) for n, t in v.items()} if isinstance(v, dict) else v for k, v in states.items()}
    o2 = make()
    o2.set_states(states)  # before o2 has seen any parameter: applied at their first update
    resumed = _run_singa(o2, half, grads[3:], dev)
    _close(resumed, straight, rtol=1e-6, atol=1e-7)


def test_set_states_in_place_and_errors(dev):
    o = opt.SGD(0.1, momentum=0.9)
    p = tensor.from_numpy(np.ones(3, np.float32), dev)
    p.name = "w"
    o.update(p, tensor.from_numpy(np.ones(3, np.float32), dev))
    o.step()
    mom = o.moments["w"]
    buf = mom.buffer
    o.set_states({"moments": {"w": np.full(3, 7.0, np.float32)}, "step_counter": 5.0})
    assert mom.buffer is buf
    assert np.allclose(mom.to_numpy(), 7.0)
    assert o.get_states()["step_counter"] == 5.0
    with pytest.raises(KeyError, match="velocity"):
        o.set_states({"velocity": {"w": np.zeros(3)}})
    with pytest.raises(ValueError, match="shape"):
        o.set_states({"moments": {"w": np.zeros(4)}})


def test_step_counter_counts_steps(dev):
    o = opt.SGD(0.1)
    p = tensor.from_numpy(np.ones(2, np.float32), dev)
    for _ in range(4):
        o.update(p, tensor.from_numpy(np.ones(2, np.float32), dev))
        o.step()
    assert int(o.step_counter.to_numpy()[0]) == 4


def test_state_creation_is_set_up_not_recorded(dev):
    """Creating momentum inside a recorded step is not part of the step: a replay must not zero it again."""
    o = opt.SGD(0.1, momentum=0.9)
    p = tensor.from_numpy(np.zeros(3, np.float32), dev)
    g = tensor.from_numpy(np.ones(3, np.float32), dev)
    with graph.Recorder(dev) as rec:
        o.update(p, g)
        o.step()
    gr = rec.finish()
    for _ in range(3):
        gr.run()
    # buf: 1, 1.9, 2.71, 3.439; p = -sum(0.1 * buf)
    assert np.allclose(p.to_numpy(), -0.1 * (1 + 1.9 + 2.71 + 3.439), rtol=1e-6)
    assert int(o.step_counter.to_numpy()[0]) == 4


# -- opt(loss) with autograd ------------------------------------------------------------------------------------------


@needs_torch
def test_call_backprops_and_updates(dev):
    rng = np.random.default_rng(12)
    x = rng.standard_normal((8, 4)).astype(np.float32)
    w0 = rng.standard_normal((4, 3)).astype(np.float32)
    t = rng.integers(0, 3, 8).astype(np.int32)
    prev = autograd.training
    autograd.training = True
    try:
        w = Tensor(data=w0.copy(), device=dev, requires_grad=True, stores_grad=True)
        w.name = "w"
        o = opt.SGD(0.5, momentum=0.9)
        for _ in range(2):
            loss = autograd.softmax_cross_entropy(autograd.matmul(Tensor(data=x, device=dev), w),
                                                  Tensor(data=t, device=dev))
            o(loss)
    finally:
        autograd.training = prev
    tw = torch.tensor(w0.copy(), requires_grad=True)
    to = torch.optim.SGD([tw], lr=0.5, momentum=0.9)
    for _ in range(2):
        to.zero_grad()
        torch.nn.functional.cross_entropy(torch.tensor(x) @ tw, torch.tensor(t, dtype=torch.long)).backward()
        to.step()
    np.testing.assert_allclose(w.to_numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert int(o.step_counter.to_numpy()[0]) == 2


def test_backward_and_update_is_call(dev):
    prev = autograd.training
    autograd.training = True
    try:
        w = Tensor(data=np.ones((2, 2), np.float32), device=dev, requires_grad=True, stores_grad=True)
        o = opt.SGD(0.1)
        o.backward_and_update(autograd.mse_loss(autograd.matmul(Tensor(data=np.eye(2, dtype=np.float32),
                                                                        device=dev), w),
                                                Tensor(data=np.zeros((2, 2), np.float32), device=dev)))
    finally:
        autograd.training = prev
    assert not np.allclose(w.to_numpy(), 1.0)
    assert int(ops.to_numpy(o.step_counter)[0]) == 1


# -- SINGA's object API (the reference's "Object-level API": attributes, their types, state keys) ------------------


def _value(t):
    assert isinstance(t, Tensor)
    assert t.shape == (1,)
    assert t.dtype == tensor.float32
    return float(t.to_numpy()[0])


@pytest.mark.parametrize(("make", "values"), [
    (lambda: opt.SGD(0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
     {"lr_value": 0.1, "mom_value": 0.9, "dam_value": 0.1, "decay_value": 0.01}),
    (lambda: opt.RMSProp(0.2, rho=0.8, epsilon=1e-6, weight_decay=0.05),
     {"lr_value": 0.2, "rho_value": 0.8, "epsilon_value": 1e-6, "decay_value": 0.05}),
    (lambda: opt.AdaGrad(0.3, epsilon=1e-7, weight_decay=0.02),
     {"lr_value": 0.3, "epsilon_value": 1e-7, "decay_value": 0.02}),
    (lambda: opt.Adam(0.4, beta_1=0.8, beta_2=0.99, epsilon=1e-5, weight_decay=0.03),
     {"lr_value": 0.4, "beta_1_value": 0.8, "beta_2_value": 0.99, "epsilon_value": 1e-5, "decay_value": 0.03}),
], ids=["sgd", "rmsprop", "adagrad", "adam"])
def test_singa_attributes_exist_before_any_parameter(make, values):
    o = make()
    assert isinstance(o.lr, opt.DecayScheduler)
    assert type(o.lr) is opt.Constant  # a float becomes Constant(lr)
    assert _value(o.step_counter) == 0.0
    for name, want in values.items():
        assert _value(getattr(o, name)) == pytest.approx(want, rel=1e-6), name
    o.step()  # usable with no parameter at all: the counter advances, nothing else happens
    o.step()
    assert _value(o.step_counter) == 2.0
    assert o.get_states()["step_counter"] == 2.0
    for sched in ("momentum", "dampening", "weight_decay", "rho", "epsilon", "beta_1", "beta_2"):
        if hasattr(o, sched):
            assert isinstance(getattr(o, sched), opt.DecayScheduler), sched


def test_wrong_learning_rate_type():
    with pytest.raises(TypeError, match="Wrong learning rate type"):
        opt.SGD(lr="0.1")
    with pytest.raises(TypeError, match="Wrong momentum type"):
        opt.SGD(0.1, momentum=[0.9])


def test_values_follow_step_and_set_states(dev):
    sched = opt.ExponentialDecay(0.1, decay_steps=2, decay_rate=0.5)
    o = opt.SGD(sched, momentum=opt.ExponentialDecay(0.9, 1, 0.9))
    for k in range(1, 4):
        o.step()
        assert _value(o.step_counter) == k
        assert _value(o.lr_value) == pytest.approx(0.1 * 0.5 ** (k / 2), rel=1e-6)
        assert _value(o.mom_value) == pytest.approx(0.9 * 0.9 ** k, rel=1e-6)
        assert _value(o.dam_value) == 0.0
    o.set_states({"step_counter": 8.0})
    assert _value(o.lr_value) == pytest.approx(0.1 * 0.5 ** 4, rel=1e-6)  # recomputed from the restored counter
    o.momentum = 0.5  # a number assigned later is a Constant too
    assert type(o.momentum) is opt.Constant
    assert _value(o.mom_value) == 0.5


def test_optimizer_used_without_parameters_says_so(dev):
    o = opt.SGD(0.1, momentum=0.9)
    g = tensor.from_numpy(np.ones(2, np.float32), dev)
    with pytest.raises(TypeError, match=r"NoneType.*first call"):
        o.update(None, g)
    with pytest.raises(TypeError, match="first call"):
        o.apply("linear.W", None, None)
    assert o.get_states() == {"step_counter": 0.0}


@pytest.mark.parametrize(("make", "groups"), [
    (lambda: opt.SGD(0.1, momentum=0.9), ("moments",)), (lambda: opt.RMSProp(0.01), ("running_average",)),
    (lambda: opt.AdaGrad(0.1), ("history",)), (lambda: opt.Adam(0.01), ("m", "v")),
], ids=["sgd", "rmsprop", "adagrad", "adam"])
def test_state_dicts_keyed_by_parameter_name(dev, make, groups):
    o = make()
    ps = {n: tensor.from_numpy(np.full(3, i + 1.0, np.float32), dev) for i, n in enumerate(("fc.W", "fc.b"))}
    for n, p in ps.items():
        p.name = n
    for _ in range(2):
        for p in ps.values():
            o.update(p, tensor.from_numpy(np.full(3, 0.5, np.float32), dev))
        o.step()
    states = o.get_states()
    assert set(states) == {"step_counter", *groups}  # SINGA's keys
    assert states["step_counter"] == 2.0
    for group in groups:
        view = getattr(o, group)  # SINGA's attribute: {parameter name: state tensor}
        assert sorted(view) == ["fc.W", "fc.b"]
        assert sorted(states[group]) == ["fc.W", "fc.b"]
        for n in view:
            np.testing.assert_array_equal(states[group][n].to_numpy(), view[n].to_numpy())
        live = view["fc.W"]
        view["fc.W"] = np.full(3, 7.0, np.float32)  # written into the live state, in place
        np.testing.assert_array_equal(live.to_numpy(), np.full(3, 7.0))
    o2 = make()
    o2.set_states(states)  # before o2 has seen the parameters: kept, and reported, until their first update
    pending = o2.get_states()
    for group in groups:
        for n in ("fc.W", "fc.b"):
            np.testing.assert_array_equal(pending[group][n].to_numpy(), states[group][n].to_numpy())


def _sgd_scheduled_momentum_ref(params, grads, lr, moms):
    ps = [p.astype(np.float64) for p in params]
    bufs = [None] * len(ps)
    for t, gs in enumerate(grads):
        for i, g in enumerate(gs):
            g = g.astype(np.float64)
            bufs[i] = g.copy() if bufs[i] is None else moms[t] * bufs[i] + g
            ps[i] = ps[i] - lr * bufs[i]
    return ps


def test_scheduled_momentum_matches_numpy(dev):
    params, grads = _data(13)
    sched = opt.ExponentialDecay(0.9, decay_steps=1, decay_rate=0.8)
    got = _run_singa(opt.SGD(0.05, momentum=sched), params, grads, dev)
    _close(got, _sgd_scheduled_momentum_ref(params, grads, 0.05, [sched(t) for t in range(STEPS)]))


def test_scheduled_rho_and_betas_match_numpy(dev):
    params, grads = _data(14)
    rho = opt.ExponentialDecay(0.9, decay_steps=2, decay_rate=0.9)
    got = _run_singa(opt.RMSProp(0.01, rho=rho), params, grads, dev)
    ps = [p.astype(np.float64) for p in params]
    sq = [np.zeros_like(p) for p in ps]
    for t, gs in enumerate(grads):
        r = rho(t)
        for i, g in enumerate(gs):
            sq[i] = r * sq[i] + (1 - r) * g.astype(np.float64) ** 2
            ps[i] = ps[i] - 0.01 * g / (np.sqrt(sq[i]) + 1e-8)
    _close(got, ps)
    b1 = opt.ExponentialDecay(0.9, decay_steps=3, decay_rate=0.95)
    got = _run_singa(opt.Adam(0.01, beta_1=b1), params, grads, dev)
    ps = [p.astype(np.float64) for p in params]
    m = [np.zeros_like(p) for p in ps]
    v = [np.zeros_like(p) for p in ps]
    for t, gs in enumerate(grads, start=1):
        beta = b1(t - 1)  # the value at the completed step count, as the device computes it
        for i, g in enumerate(gs):
            m[i] = beta * m[i] + (1 - beta) * g
            v[i] = 0.999 * v[i] + 0.001 * g.astype(np.float64) ** 2
            ps[i] = ps[i] - 0.01 * (m[i] / (1 - beta ** t)) / (np.sqrt(v[i] / (1 - 0.999 ** t)) + 1e-8)
    _close(got, ps)


def test_replayed_steps_follow_scheduled_values(dev):
    """step() recomputes lr_value, mom_value ... on the device: a recorded step replays the schedules."""
    lr = opt.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    mom = opt.ExponentialDecay(0.9, decay_steps=1, decay_rate=0.5)
    o = opt.SGD(lr, momentum=mom)
    p = tensor.from_numpy(np.zeros(3, np.float32), dev)
    g = tensor.from_numpy(np.ones(3, np.float32), dev)
    o.update(p, g)  # the first step creates the momentum buffer (set-up, outside the recording)
    o.step()
    with graph.Recorder(dev) as rec:
        o.update(p, g)
        o.step()
    gr = rec.finish()
    for _ in range(3):
        gr.run()
    want, buf = 0.0, None
    for t in range(5):
        buf = 1.0 if buf is None else mom(t) * buf + 1.0
        want -= lr(t) * buf
    np.testing.assert_allclose(p.to_numpy(), want, rtol=1e-6)
    assert o.step_counter.to_numpy()[0] == 5
    assert o.lr_value.to_numpy()[0] == pytest.approx(lr(5), rel=1e-6)
