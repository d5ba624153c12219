"""The OpenCL backend next to the CPU backend, measured in one run: matrix-product GFLOP/s (CLBlast against the CPU's)
and the MNIST CNN training step (examples/mnist_cnn, batch 64, eager and graph mode), with the agreement of the two
devices' losses over 20 steps from the same initial weights.

    python benchmarks/bench_opencl.py [--quick]

Without an OpenCL device (no ICD loader, no platform, or singa-backend-opencl not installed) the table says so and
has no rows; `run()` never fails for that reason.
"""

from __future__ import annotations

import gc
import statistics
import time

import numpy as np
import train_cnn
from _trainbench import LOSS_STEPS, initial_states, make_batches, max_rel_diff, singa_stepper, time_interleaved

import benchlib
from bench_matmul import check
from benchlib import Table, ratio
from singa import device, plugins, tensor

SIZES = (1024, 2048)
QUICK_SIZES = (128, 256)


def opencl_device():
    """opencl:0, or None (and why) when there is none."""
    backend = plugins.registry().backends.get("opencl")
    if backend is None:
        return None, "singa-backend-opencl is not installed"
    if backend.device_count() == 0:
        return None, getattr(backend, "error", None) or "no OpenCL device"
    return device.get_device("opencl:0"), None


def _gflops(devs: dict, n: int, repeat: int) -> dict[str, float]:
    """Best GFLOP/s of an n×n×n float32 product per device, the devices taking turns round by round."""
    rng = np.random.default_rng(n)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    want = a @ b
    ops = {}
    for name, dev in devs.items():
        A, B = tensor.from_numpy(a, dev), tensor.from_numpy(b, dev)
        check(tensor.to_numpy(tensor.mult(A, B)), want, f"{name} mult n={n}")
        for _ in range(2):  # warm-up: first-call kernel builds and CLBlast's tuning lookups
            tensor.mult(A, B)
        dev.synchronize()
        ops[name] = (A, B, dev)
    best = dict.fromkeys(devs, float("inf"))
    names = list(devs)
    for r in range(repeat):
        for name in names[r % len(names):] + names[:r % len(names)]:
            A, B, dev = ops[name]
            gc.collect()
            t0 = time.perf_counter()
            tensor.mult(A, B)
            dev.synchronize()
            best[name] = min(best[name], time.perf_counter() - t0)
    return {name: 2.0 * n ** 3 / t / 1e9 for name, t in best.items()}


def run(quick: bool = False) -> Table:
    """OpenCL vs CPU backend: matrix-product GFLOP/s and the MNIST CNN training step, one run."""
    table = Table(
        title="OpenCL backend next to the CPU backend (higher GFLOP/s, lower ms are better)",
        script="bench_opencl.py",
        headers=["measurement", "opencl", "cpu", "opencl / cpu"],
    )
    ocl, why = opencl_device()
    if ocl is None:
        table.notes.append(f"Not measured: {why}.")
        return table
    cpu = device.get_device("cpu")
    devs = {"opencl": ocl, "cpu": cpu}

    for n in QUICK_SIZES if quick else SIZES:
        g = _gflops(devs, n, 2 if quick else (5 if n <= 1024 else 3))
        table.rows.append([f"matrix product {n}×{n}×{n} float32 (GFLOP/s)", g["opencl"], g["cpu"],
                           ratio(g["opencl"], g["cpu"])])

    spec = train_cnn.spec(64)
    batches, data_desc = make_batches(spec, LOSS_STEPS)
    init = initial_states(spec, cpu)
    losses = {}
    for name, dev in devs.items():
        step = singa_stepper(spec, dev, True, init, batches)
        losses[name] = [float(tensor.to_numpy(step(i)[1]).reshape(-1)[0]) for i in range(LOSS_STEPS)]
        dev.synchronize()
        del step
    warmup, repeat, number = spec.quick_timing if quick else (3, 4, 5)
    steppers = {f"{name} {mode}": (singa_stepper(spec, dev, mode == "graph", init, batches), dev.synchronize)
                for name, dev in devs.items() for mode in ("eager", "graph")}
    rounds = time_interleaved(steppers, warmup, repeat, number)
    del steppers
    gc.collect()
    for mode in ("eager", "graph"):
        o, c = (statistics.fmean(rounds[f"{d} {mode}"]) * 1e3 for d in ("opencl", "cpu"))
        table.rows.append([f"MNIST CNN training step, batch 64, {mode} (ms, mean)", o, c, ratio(o, c)])
    table.rows.append([f"MNIST CNN loss, max rel. diff opencl vs cpu over {LOSS_STEPS} steps",
                       f"{max_rel_diff(losses['opencl'], losses['cpu']):.1e}", None, None])
    table.notes.append(
        f"opencl: `{ocl.description()}`; cpu: `{cpu.description()}`. Matrix products: `tensor.mult` of two float32 "
        "matrices, 2·n³ operations over the best of several timed calls after two warm-ups, each ending with "
        "`dev.synchronize()`, the devices taking turns (OpenCL products go to CLBlast, the CPU's to oneDNN's sgemm). "
        f"Training: examples/mnist_cnn's model, SGD lr 0.01 momentum 0.9, {repeat} rounds of {number} steps after "
        f"{warmup} warm-up steps, the four device/mode contestants taking turns; both devices start from the same "
        f"weights on the same batches ({data_desc}).")
    return table


if __name__ == "__main__":
    benchlib.main(run)
