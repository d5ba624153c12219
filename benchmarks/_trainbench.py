"""What the training benchmarks (train_cnn.py, train_resnet.py) share: one training step of a singa Model (eager or
graph mode) and of its PyTorch twin, from the same initial weights on the same data, timed and compared.

Per framework and mode:
* the losses of `LOSS_STEPS` SGD steps (`EARLY_STEPS` with --quick; momentum 0.9, lr 0.01) on fixed batches (real
  digits where scikit-learn is installed), from singa's initial weights (torch gets them copied in); the max
  relative difference to torch's;
* the step time over `repeat` rounds of `number` steps after `warmup` steps, the contestants taking turns round by
  round (each singa round ends with `dev.synchronize()`): mean and fastest round;
* for singa, the device pool's peak bytes in use over steady-state steps (`dev.pool.reset_peak()` first), each mode
  measured alone (the other mode's model freed).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import benchlib
from benchlib import Table, best_time, ratio, torch
from singa import data, layer, model, opt, tensor

LR, MOMENTUM = 0.01, 0.9
LOSS_STEPS = 20
PEAK_STEPS = 3
EARLY_STEPS = 5  # differences grow along training; the first steps show the agreement of the arithmetic itself
NUDGE_SEEDS = 3  # torch's own spread: this many runs, each with its initial weights nudged by another random draw


class Classifier(model.Model):
    """A model trained with softmax cross-entropy, SINGA's way (`train_one_batch`, `set_optimizer`): the training
    benchmarks' models subclass it and write `forward`."""

    def __init__(self) -> None:
        super().__init__()
        self.softmax_cross_entropy = layer.SoftMaxCrossEntropy()

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.softmax_cross_entropy(out, y)
        self.optimizer(loss)
        return out, loss

    def set_optimizer(self, optimizer) -> None:
        self.optimizer = optimizer


@dataclass
class Spec:
    title: str
    script: str
    make_singa: Callable[[], object]  # a singa model.Model with set_optimizer / train_one_batch(x, y)
    make_torch: Callable[[], object] | None  # its torch.nn.Module twin (None without torch)
    sample_shape: tuple  # (C, H, W)
    batch: int
    num_classes: int = 10
    timing: tuple[int, int, int] = (3, 5, 10)  # warm-up steps, rounds, steps per round
    quick_timing: tuple[int, int, int] = (1, 2, 2)
    note: str | None = None  # a last note for the table (what the numbers mean for this model)


@dataclass
class Result:
    losses: list[float]
    step_s: float | None = None  # mean over the rounds
    step_best: float | None = None  # fastest round
    peak_bytes: int | None = None
    rss: dict | None = None  # rss_child's report: {"first": MiB, "steady": MiB or None}


def make_batches(spec: Spec, n: int, seed: int = 0) -> tuple[list[tuple[np.ndarray, np.ndarray]], str]:
    """`n` batches of real handwritten digits (scikit-learn's, resized to the model's input and repeated over its
    channels, standardised), or of random numbers without scikit-learn; and a description of which."""
    rng = np.random.default_rng(seed)
    c, h, w = spec.sample_shape
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        batches = [(rng.standard_normal((spec.batch, c, h, w), dtype=np.float32),
                    rng.integers(0, spec.num_classes, spec.batch).astype(np.int32)) for _ in range(n)]
        return batches, "random N(0, 1) images and labels (scikit-learn is not installed)"
    digits = load_digits()
    order = rng.permutation(len(digits.target))[:n * spec.batch]
    if len(order) < n * spec.batch:
        order = np.resize(order, n * spec.batch)
    x = data.resize_bilinear(digits.images / 16.0, (h, w))
    x = np.repeat(((x - x.mean()) / x.std())[order, None], c, axis=1).astype(np.float32)  # the same for any n
    y = digits.target[order].astype(np.int32)
    batches = [(x[i * spec.batch:(i + 1) * spec.batch], y[i * spec.batch:(i + 1) * spec.batch]) for i in range(n)]
    return batches, (f"scikit-learn's handwritten digits resized to {h}×{w}" + (f", repeated over {c} channels"
                                                                                  if c > 1 else ""))


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


def singa_stepper(spec: Spec, dev, use_graph: bool, init, batches) -> Callable[[int], tuple]:
    """step(i): one training step of a fresh singa model on batch i (cyclically); returns (out, loss)."""
    m, tx, ty = singa_model(spec, dev, use_graph, init)

    def step(i: int):
        x, y = batches[i % len(batches)]
        tx.copy_from_numpy(x)
        ty.copy_from_numpy(y)
        return m(tx, ty)

    return step


def torch_stepper(spec: Spec, init, batches, nudge: float = 0.0, float64: bool = False,
                  nudge_seed: int = 0) -> Callable[[int], object]:
    """step(i): one training step of a fresh torch twin (singa's initial weights, each moved by `nudge`·N(0, 1) drawn
    with `nudge_seed`) on batch i; returns the loss. `float64`: the whole computation in double precision (the
    reference arithmetic)."""
    import _torch_models as tm

    module = spec.make_torch()
    tm.load_singa_weights(module, init)
    if nudge:
        tm.nudge(module, nudge, seed=nudge_seed)
    if float64:
        module = module.double()
    module.train()
    optim = torch.optim.SGD(module.parameters(), lr=LR, momentum=MOMENTUM)
    dtype = torch.float64 if float64 else torch.float32
    data = [(torch.from_numpy(x).to(dtype), torch.from_numpy(y.astype(np.int64))) for x, y in batches]
    return lambda i: tm.train_step(module, optim, *data[i % len(data)])


def singa_losses_and_peak(spec: Spec, dev, use_graph: bool, init, batches, n_loss: int) -> Result:
    """The first `n_loss` losses of a singa model, and its pool's peak bytes over `PEAK_STEPS` more steps (this model
    alone on the device: whatever else was allocated is freed first)."""
    gc.collect()
    step = singa_stepper(spec, dev, use_graph, init, batches)
    losses = [float(tensor.to_numpy(step(i)[1]).reshape(-1)[0]) for i in range(n_loss)]
    dev.synchronize()
    gc.collect()
    dev.pool.reset_peak()
    for i in range(PEAK_STEPS):
        step(i)
    dev.synchronize()
    res = Result(losses, peak_bytes=dev.pool.peak_bytes)
    del step
    gc.collect()
    return res


def _proc_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    raise KeyError(field)


def rss_child(spec: Spec, use_graph: bool) -> None:
    """Run in a fresh process (see singa_rss): a singa model's first training step, then `PEAK_STEPS` more; print the
    process's peak RSS (VmHWM) after the first step and, the peak reset (/proc/self/clear_refs) there, over the
    others, as JSON, in MiB."""
    dev = benchlib.singa_device()
    batches, _ = make_batches(spec, PEAK_STEPS + 1)
    step = singa_stepper(spec, dev, use_graph, None, batches)
    step(0)
    dev.synchronize()
    first = _proc_mib("VmHWM")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux 4.0+)
        reset = True
    except OSError:
        reset = False
    for i in range(1, PEAK_STEPS + 1):
        step(i)
    dev.synchronize()
    print(json.dumps({"title": spec.title, "first": first, "steady": _proc_mib("VmHWM") if reset else None}))


def singa_rss(spec: Spec, use_graph: bool) -> dict | None:
    """rss_child's report for `spec` in eager or graph mode, from a fresh Python process that does not import torch
    (both modes pay the same imports); None where /proc is missing or the child fails."""
    if not os.path.exists("/proc/self/status"):
        return None
    module = os.path.splitext(spec.script)[0]
    code = f"import _trainbench, {module}; _trainbench.rss_child({module}.spec(), {use_graph})"
    env = dict(os.environ, SINGA_BENCH_NO_TORCH="1")
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900,
                             check=True).stdout
        report = json.loads(out.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return None
    return report if report.get("title") == spec.title else None


def time_interleaved(steppers: dict[str, tuple[Callable, Callable]], warmup: int, repeat: int,
                     number: int) -> dict[str, list[float]]:
    """Seconds per step of each round of `number` steps, per contestant {name: (step, sync)}.

    The contestants take turns round by round (the order rotating), so that a machine whose load changes during the
    run slows all of them alike instead of whichever happened to run then.
    """
    for step, sync in steppers.values():
        for i in range(warmup):
            step(i)
        sync()
    names = list(steppers)
    rounds: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeat):
        for name in names[r % len(names):] + names[:r % len(names)]:
            step, sync = steppers[name]
            gc.collect()
            t0 = time.perf_counter()
            for i in range(number):
                step(i)
            sync()
            rounds[name].append((time.perf_counter() - t0) / number)
    return rounds


def _rss_cells(r: Result) -> list:
    """The two peak-RSS cells of a row (None where not measured)."""
    if r.rss is None:
        return [None, None]
    return [r.rss.get("first"), r.rss.get("steady")]


def max_rel_diff(a: list[float], b: list[float]) -> float:
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a64 - b64) / np.maximum(np.abs(b64), 1e-12)))


def loss_diffs(r: Result, ref: Result | None) -> list[str | None]:
    """Max relative loss differences over the first EARLY_STEPS steps and over all steps, as text."""
    if ref is None:
        return [None, None]
    return [f"{max_rel_diff(r.losses[:n], ref.losses[:n]):.1e}" for n in (EARLY_STEPS, len(ref.losses))]


def measure(spec: Spec, quick: bool, nudge: float | None = None) -> Table:
    """The table of one model: singa eager, singa graph, torch (and torch nudged by `nudge`, loss only)."""
    dev = benchlib.singa_device()
    timing = spec.quick_timing if quick else spec.timing
    n_loss = EARLY_STEPS if quick else LOSS_STEPS
    batches, data_desc = make_batches(spec, n_loss)
    init = initial_states(spec, dev)
    have_torch = torch is not None and spec.make_torch is not None

    # Losses and peak memory, one model at a time.
    res = {"singa eager": singa_losses_and_peak(spec, dev, False, init, batches, n_loss),
           "singa graph": singa_losses_and_peak(spec, dev, True, init, batches, n_loss)}
    if not quick:
        for mode, use_graph in (("singa eager", False), ("singa graph", True)):
            res[mode].rss = singa_rss(spec, use_graph)
    if have_torch:
        ref_step = torch_stepper(spec, init, batches)
        res["torch"] = Result([float(ref_step(i)) for i in range(n_loss)])
        del ref_step
        for seed in range(NUDGE_SEEDS if nudge else 0):
            nudged = torch_stepper(spec, init, batches, nudge, nudge_seed=seed)
            res[f"torch nudged {seed}"] = Result([float(nudged(i)) for i in range(n_loss)])
            del nudged
        exact = torch_stepper(spec, init, batches, float64=True)
        res["torch float64"] = Result([float(exact(i)) for i in range(n_loss)])
        del exact

    # Step times, the contestants taking turns.
    steppers = {"singa eager": (singa_stepper(spec, dev, False, init, batches), dev.synchronize),
                "singa graph": (singa_stepper(spec, dev, True, init, batches), dev.synchronize)}
    if have_torch:
        steppers["torch"] = (torch_stepper(spec, init, batches), lambda: None)
    rounds = time_interleaved(steppers, *timing)
    for name, times in rounds.items():
        res[name].step_s, res[name].step_best = statistics.fmean(times), min(times)
    del steppers
    gc.collect()

    table = Table(
        title=spec.title,
        script=spec.script,
        headers=["framework / mode", "step mean (ms)", "best round (ms)", "vs torch (mean)", "vs torch (best)",
                 "peak memory (MiB)", "peak RSS, step 1 (MiB)", "peak RSS, later steps (MiB)",
                 f"loss max rel. diff vs torch, steps 1-{EARLY_STEPS}", f"steps 1-{n_loss}",
                 f"vs torch float64, steps 1-{EARLY_STEPS}", f"steps 1-{n_loss}"],
    )
    ref = res.get("torch")
    f64 = res.get("torch float64")

    def row(name: str, label: str, diff_to: Result | None):
        r = res[name]
        ms = None if r.step_s is None else r.step_s * 1e3
        best = None if r.step_best is None else r.step_best * 1e3
        mib = None if r.peak_bytes is None else r.peak_bytes / 2**20
        return [label, ms, best, ratio(r.step_s, ref.step_s) if ref else None,
                ratio(r.step_best, ref.step_best) if ref else None, mib, *_rss_cells(r), *loss_diffs(r, diff_to),
                *loss_diffs(r, f64)]

    table.rows += [row("singa eager", "singa eager", ref), row("singa graph", "singa graph", ref)]
    if have_torch:
        table.rows.append(row("torch", f"torch {torch.__version__}", None))
    nudged = [k for k in res if k.startswith("torch nudged")]
    for k in nudged:
        table.rows.append(row(k, f"torch, weights + {nudge:g}·N(0,1), draw {k.split()[-1]}", ref))
    e, g = res["singa eager"], res["singa graph"]
    rss_ratios = [ratio(a, b) if a is not None and b is not None else None
                  for a, b in zip(_rss_cells(g), _rss_cells(e))]
    table.rows.append(["singa graph / eager", None, None, ratio(g.step_s, e.step_s), ratio(g.step_best, e.step_best),
                       ratio(g.peak_bytes, e.peak_bytes), *rss_ratios, *loss_diffs(g, e), None, None])
    threads = f"torch {torch.get_num_threads()} threads" if torch is not None else "torch not installed"
    warmup, repeat, number = timing
    table.notes.append(
        f"Batch {spec.batch}, SGD lr {LR} momentum {MOMENTUM}, softmax cross-entropy; singa on `{dev.name}` "
        f"({dev.description()}), {threads}. A step is forward, loss, backward and update (singa: `model(tx, ty)` "
        f"with the batch copied into the placeholders). Step time: {repeat} rounds of {number} steps each after "
        f"{warmup} warm-up steps, singa eager, singa graph and torch taking turns round by round; mean and fastest "
        "round, per step. Peak memory: the singa device pool's bytes in use over steady-state steps (parameters, "
        "optimizer state, activations, the graph's planned arena), each mode alone. Peak RSS: the high-water mark of "
        "the resident memory of a fresh process (no torch imported) that runs one mode, as a user's tools report "
        f"it: after the first step (graph mode records that step, eagerly), then over {PEAK_STEPS} more steps with "
        f"the mark reset after the first (/proc/self/clear_refs). Loss: the {n_loss} losses "
        "of singa and torch from the same initial weights (singa's, copied into torch) on the same batches "
        f"({data_desc}); the last row compares graph with eager mode.")
    paired = [g / e for g, e in zip(rounds["singa graph"], rounds["singa eager"])]
    table.notes.append(
        "Graph against eager mode round by round (both rounds of a pair come from one turn of the contestants, so "
        "a change of load from turn to turn cancels out): graph/eager step time "
        f"{statistics.median(paired):.3f} in the median round "
        f"({min(paired):.3f} to {max(paired):.3f}); graph mode was faster in {sum(r < 1 for r in paired)} of "
        f"{len(paired)} rounds.")
    table.notes.append(benchlib.openmp_note())
    if nudged:
        spread = [max_rel_diff(res[k].losses, ref.losses) for k in nudged]
        ours = max_rel_diff(res["singa eager"].losses, ref.losses)
        table.notes.append(
            f"PyTorch's own spread: the same torch run {len(nudged)} times, every initial weight moved by "
            f"{nudge:g}·N(0,1) (a different draw each time); singa's difference to torch is to be read against it. "
            f"Over steps 1-{n_loss} the nudged runs differ from torch by {min(spread):.1e} to {max(spread):.1e}; "
            f"singa eager by {ours:.1e} ({'inside' if ours <= max(spread) else 'outside'} that spread).")
    if f64 is not None:
        table.notes.append(
            "The last two columns compare each float32 run with the same training in float64 (torch, double "
            "precision throughout): how far float32 rounding alone moves the losses, for singa and for torch.")
    if spec.note:
        table.notes.append(spec.note)
    table.losses = {k: v.losses for k, v in res.items()}
    return table


def measure_inference(spec: Spec, quick: bool) -> Table:
    """Inference of the same model at the same batch: singa `model.eval()` then `forward` (eager) and `model(x)` with
    graph mode on (the recorded forward, BatchNorm folded into the convolutions), against torch's `eval()` under
    `no_grad`, same weights (BatchNorm with its running statistics), outputs compared. The three take turns over
    rounds, so that a slow spell of a shared machine hits them alike."""
    dev = benchlib.singa_device()
    title = spec.title.replace("Training step", "Inference").replace("ms per step", "ms per batch")
    table = Table(title=title, script=spec.script,
                  headers=["framework", "forward (ms)", "vs torch", "max rel. diff of the outputs vs torch"])
    batches, _ = make_batches(spec, 2)
    init = initial_states(spec, dev)
    x = batches[0][0]
    runs: dict[str, Callable[[], Any]] = {}
    for label, use_graph in (("singa eager", False), ("singa graph", True)):
        m, tx, _ = singa_model(spec, dev, use_graph=use_graph, init=init)
        m.eval()
        tx.copy_from_numpy(x)

        def singa_forward(m=m, tx=tx, call=use_graph):
            out = m(tx) if call else m.forward(tx)
            dev.synchronize()
            return out

        runs[label] = singa_forward
    want, torch_label = None, None
    if torch is not None and spec.make_torch is not None:
        import _torch_models as tm

        module = spec.make_torch()
        tm.load_singa_weights(module, init)
        module.eval()
        tx_t = torch.from_numpy(x)

        def torch_forward():
            with torch.no_grad():
                return module(tx_t)

        torch_label = f"torch {torch.__version__}"
        runs[torch_label] = torch_forward
        want = torch_forward().numpy()
    rounds, repeat = (1, 3) if quick else (4, 3)
    best = dict.fromkeys(runs, float("inf"))
    for r in range(rounds):
        for label, fn in runs.items():
            best[label] = min(best[label], best_time(fn, repeat, warmup=2 if r == 0 else 1))
    t_torch = best.get(torch_label)
    for label, fn in runs.items():
        if label == torch_label:
            table.rows.append([label, best[label] * 1e3, 1.0, None])
            continue
        got = tensor.to_numpy(fn())
        diff = None if want is None else float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
        table.rows.append([label, best[label] * 1e3, benchlib.ratio(best[label], t_torch),
                           None if diff is None else f"{diff:.1e}"])
    table.notes.append(
        f"Batch {spec.batch}, the training benchmark's initial weights; each time is the best of {rounds} rounds in "
        f"which the three take turns, {repeat} batches each after a warm-up (singa's timer stops after "
        "`dev.synchronize()`); torch "
        f"{benchlib.torch_threads()} threads. singa graph: the model compiled with `use_graph=True`, `model(x)` in "
        "evaluation mode replays the recorded forward with each convolution, its BatchNorm, the residual Add and "
        "ReLU in one call where the weights are smaller than the activations they save a pass over, and the "
        "activations between convolutions kept in oneDNN's channel blocks (`singa.graph_fuse`).")
    return table


def profile(spec: Spec, steps: int = 5, top: int = 15, use_graph: bool = False) -> str:
    """Where a singa step's time goes: cProfile of `steps` steps after a warm-up, by function (kernels are the
    `_kernels.sg_*` built-ins), and the Python share (total minus the kernels')."""
    import cProfile
    import io
    import pstats

    dev = benchlib.singa_device()
    batches, _ = make_batches(spec, 4)
    step = singa_stepper(spec, dev, use_graph, initial_states(spec, dev), batches)
    for i in range(2):
        step(i)
    dev.synchronize()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for i in range(steps):
        step(i)
    dev.synchronize()
    prof.disable()
    wall = (time.perf_counter() - t0) / steps
    stats = pstats.Stats(prof)
    kernels: dict[str, tuple[int, float]] = {}
    for (file, _, func), (_, ncalls, tottime, _, _) in stats.stats.items():
        if file == "~" and func.startswith("<built-in method") and "._kernels" in func:
            name = func.split(".")[-1].rstrip(">")
            calls, t = kernels.get(name, (0, 0.0))
            kernels[name] = (calls + ncalls, t + tottime)
    total_k = sum(t for _, t in kernels.values()) / steps
    head = (f"singa {'graph' if use_graph else 'eager'} step: {wall * 1e3:.1f} ms wall (under cProfile); kernels "
            f"{total_k * 1e3:.1f} ms, the rest (Python: autograd, ops checks, allocation, optimizer) "
            f"{(wall - total_k) * 1e3:.1f} ms")
    lines = [head, "", "| kernel | calls/step | ms/step | share |", "|---|---|---|---|"]
    for name, (calls, t) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"| {name} | {calls / steps:.0f} | {t / steps * 1e3:.1f} | {t / steps / wall:.0%} |")
    out = io.StringIO()
    out.write(f"\nPython functions by own time ({steps} steps):\n")
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return "\n".join(lines) + "\n" + out.getvalue()


def main(run: Callable[..., Table | list[Table]], spec_fn: Callable[[], Spec]) -> None:
    """Standalone entry point: the table (`--quick` for a short run), or `--profile` for singa's kernel breakdown."""
    import argparse

    parser = argparse.ArgumentParser(description=run.__doc__)
    parser.add_argument("--quick", action="store_true", help="few steps and rounds (a smoke test, not a result)")
    parser.add_argument("--profile", action="store_true", help="print where a singa step's time goes instead")
    parser.add_argument("--graph", action="store_true", help="with --profile: graph mode instead of eager")
    args = parser.parse_args()
    if args.profile:
        print(profile(spec_fn(), use_graph=args.graph))
        return
    warning = benchlib.busy_warning() if hasattr(benchlib, "busy_warning") else None
    if warning:
        print(f"warning: {warning}\n")
    result = run(quick=args.quick)
    for table in result if isinstance(result, list) else [result]:
        print(f"### {table.title}\n")
        print(table.markdown())
        for note in table.notes:
            print(f"\n{note}")
        print()
