"""What the training benchmarks (train_cnn.py, train_resnet.py) share: one training step of a singa Model (eager or
graph mode) and of its PyTorch twin, from the same initial weights on the same data, timed and compared.

Per framework and mode:
* the losses of `LOSS_STEPS` SGD steps (momentum 0.9, lr 0.01) on fixed random batches, from singa's initial weights
  (torch gets them copied in); the max relative difference to torch's losses is reported;
* the mean step time over `repeat` rounds of `number` steps after `warmup` steps (each singa round ends with
  `dev.synchronize()`), with the spread (sd) of the round means;
* for singa, the device pool's peak bytes in use during the timed steps (`dev.pool.reset_peak()` first), each mode
  measured alone (the other mode's model freed).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import benchlib
from benchlib import Table, ratio, torch
from singa import opt, tensor

LR, MOMENTUM = 0.01, 0.9
LOSS_STEPS = 20


@dataclass
class Spec:
    title: str
    script: str
    make_singa: Callable[[], object]  # a singa model.Model with set_optimizer / train_one_batch(x, y)
    make_torch: Callable[[], object] | None  # its torch.nn.Module twin (None without torch)
    sample_shape: tuple  # (C, H, W)
    batch: int
    num_classes: int = 10


@dataclass
class Result:
    losses: list[float]
    step_s: float | None = None
    step_sd: float | None = None
    peak_bytes: int | None = None


def make_batches(spec: Spec, n: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((spec.batch, *spec.sample_shape), dtype=np.float32),
             rng.integers(0, spec.num_classes, spec.batch).astype(np.int32)) for _ in range(n)]


def time_steps(step: Callable[[int], object], sync: Callable[[], None], warmup: int, repeat: int,
               number: int) -> tuple[float, float]:
    """(mean, sd) over `repeat` rounds of the per-step time of a round of `number` steps, after `warmup` steps."""
    for i in range(warmup):
        step(i)
    sync()
    gc.collect()
    rounds = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for i in range(number):
            step(i)
        sync()
        rounds.append((time.perf_counter() - t0) / number)
    return statistics.fmean(rounds), (statistics.stdev(rounds) if len(rounds) > 1 else 0.0)


def singa_model(spec: Spec, dev, use_graph: bool, init: dict[str, np.ndarray] | None, seed: int = 0):
    """A compiled model with its placeholders (model, tx, ty); `init` (name -> array) overrides its initial states."""
    dev.set_rand_seed(seed)
    m = spec.make_singa()
    m.set_optimizer(opt.SGD(lr=LR, momentum=MOMENTUM))
    tx = tensor.Tensor((spec.batch, *spec.sample_shape), dev, tensor.float32)
    ty = tensor.Tensor((spec.batch,), dev, tensor.int32)
    m.compile([tx], is_train=True, use_graph=use_graph, sequential=False)
    if init is not None:
        m.set_states(init)
    return m, tx, ty


def initial_states(spec: Spec, dev) -> dict[str, np.ndarray]:
    m, _, _ = singa_model(spec, dev, use_graph=False, init=None)
    return {k: tensor.to_numpy(v).copy() for k, v in m.get_states().items()}


def run_singa(spec: Spec, dev, use_graph: bool, init, batches, timing: tuple[int, int, int] | None) -> Result:
    m, tx, ty = singa_model(spec, dev, use_graph, init)

    def step(i: int):
        x, y = batches[i % len(batches)]
        tx.copy_from_numpy(x)
        ty.copy_from_numpy(y)
        return m(tx, ty)

    losses = []
    for i in range(LOSS_STEPS):
        _, loss = step(i)
        losses.append(float(tensor.to_numpy(loss).reshape(-1)[0]))
    res = Result(losses)
    if timing is not None:
        gc.collect()
        dev.synchronize()
        dev.pool.reset_peak()
        res.step_s, res.step_sd = time_steps(step, dev.synchronize, *timing)
        res.peak_bytes = dev.pool.peak_bytes
    return res


def run_torch(spec: Spec, init, batches, timing: tuple[int, int, int] | None, nudge: float = 0.0) -> Result:
    import _torch_models as tm

    module = spec.make_torch()
    tm.load_singa_weights(module, init)
    if nudge:
        tm.nudge(module, nudge)
    res = Result(tm.train_steps(module, batches[:LOSS_STEPS], lr=LR, momentum=MOMENTUM))
    if timing is not None:
        optim = torch.optim.SGD(module.parameters(), lr=LR, momentum=MOMENTUM)
        data = [(torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))) for x, y in batches]
        res.step_s, res.step_sd = time_steps(lambda i: tm.train_step(module, optim, *data[i % len(data)]),
                                             lambda: None, *timing)
    return res


def max_rel_diff(a: list[float], b: list[float]) -> float:
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a64 - b64) / np.maximum(np.abs(b64), 1e-12)))


def sci(v: float) -> str:
    return f"{v:.1e}"


def measure(spec: Spec, quick: bool, nudge: float | None = None) -> Table:
    """The table of one model: singa eager, singa graph, torch (and torch nudged by `nudge`, loss only)."""
    dev = benchlib.singa_device()
    timing = (1, 2, 2) if quick else (3, 5, 5)  # warmup steps, rounds, steps per round
    batches = make_batches(spec, LOSS_STEPS)
    init = initial_states(spec, dev)
    eager = run_singa(spec, dev, False, init, batches, timing)
    gc.collect()  # the eager model's memory goes back before graph mode is measured
    graph = run_singa(spec, dev, True, init, batches, timing)
    gc.collect()
    have_torch = torch is not None and spec.make_torch is not None
    ref = run_torch(spec, init, batches, timing) if have_torch else None
    nudged = run_torch(spec, init, batches, None, nudge) if have_torch and nudge else None

    table = Table(
        title=spec.title,
        script=spec.script,
        headers=["framework / mode", "step (ms)", "sd (ms)", "vs torch", "peak memory (MiB)",
                 f"loss max rel. diff vs torch ({LOSS_STEPS} steps)"],
    )
    t_ref = ref.step_s if ref else None

    def row(name: str, r: Result | None, diff_to: Result | None):
        if r is None:
            return [name, None, None, None, None, None]
        ms = None if r.step_s is None else r.step_s * 1e3
        sd = None if r.step_sd is None else r.step_sd * 1e3
        mib = None if r.peak_bytes is None else r.peak_bytes / 2**20
        diff = sci(max_rel_diff(r.losses, diff_to.losses)) if diff_to is not None else None
        return [name, ms, sd, ratio(r.step_s, t_ref), mib, diff]

    table.rows += [row("singa eager", eager, ref), row("singa graph", graph, ref)]
    if have_torch:
        table.rows.append(row(f"torch {torch.__version__}", ref, None))
        table.rows[-1][3] = 1.0
    if nudged is not None:
        table.rows.append(row(f"torch, weights + {nudge:g}·N(0,1)", Result(nudged.losses), ref))
    table.rows.append(["singa graph vs eager", None, None, ratio(graph.step_s, eager.step_s),
                       ratio(graph.peak_bytes, eager.peak_bytes), sci(max_rel_diff(graph.losses, eager.losses))])
    threads = f"torch {torch.get_num_threads()} threads" if torch is not None else "torch not installed"
    table.notes.append(
        f"Batch {spec.batch}, SGD lr {LR} momentum {MOMENTUM}, softmax cross-entropy; singa on `{dev.name}` "
        f"({dev.description()}), {threads}. Step time: mean over {timing[1]} rounds of {timing[2]} steps after "
        f"{timing[0]} warm-up steps (sd: spread of the round means); a step is forward, loss, backward and update "
        "(singa: `model(tx, ty)` with the batch copied into the placeholders). Peak memory: the singa device "
        "pool's bytes in use during the timed steps (parameters, optimizer state and activations), each mode alone. "
        f"Loss: the {LOSS_STEPS} losses of singa and torch from the same initial weights (singa's, copied into "
        "torch) on the same random batches; the last row compares graph with eager mode.")
    if nudged is not None:
        table.notes.append(
            f"PyTorch's own spread: the same torch run with every initial weight moved by {nudge:g}·N(0,1); "
            "singa's difference to torch is to be read against it.")
    table.losses = {"singa eager": eager.losses, "singa graph": graph.losses,
                    **({"torch": ref.losses} if ref else {}), **({"torch nudged": nudged.losses} if nudged else {})}
    return table
