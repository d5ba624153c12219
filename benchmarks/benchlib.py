"""Shared pieces of the benchmarks: timers, machine facts, markdown tables.

Every benchmark module has `run(quick=False) -> Table` and runs standalone (`python benchmarks/bench_x.py [--quick]`).
Only SINGA's public API is used, and every singa timing ends with `dev.synchronize()`, so that a backend that queues
work asynchronously is timed for the work, not for the queueing.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# libgomp reads GOMP_SPINCOUNT (how long idle OpenMP threads busy-wait) once, when the first library using it loads.
# torch ships a libgomp.so.1 that singa's CPU kernels then share, so the CPU backend's own default (set when its
# extension loads) comes too late once torch is imported: without this, singa would run on libgomp's ~1 ms default
# busy-wait, several-fold slower on a busy machine than in a script that never imports torch. Both frameworks share
# the one runtime, so both run with this setting; an explicit GOMP_SPINCOUNT or OMP_WAIT_POLICY wins.
SPIN_DEFAULT = "20000"  # singa_backend_cpu.device.DEFAULT_GOMP_SPINCOUNT
SPIN_TOO_LATE = False  # True when torch was imported before benchlib could set it
if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = SPIN_DEFAULT
    SPIN_TOO_LATE = "torch" in sys.modules

import numpy as np  # noqa: E402

from singa import device  # noqa: E402

try:
    if os.environ.get("SINGA_BENCH_NO_TORCH") == "1":  # a child process measuring singa alone (its memory)
        raise ImportError("SINGA_BENCH_NO_TORCH=1")
    import torch
except ImportError:  # the benchmarks still run; torch columns say n/a
    torch = None


def openmp_note() -> str:
    """One sentence on the OpenMP runtime settings singa and torch ran with (for a table's notes)."""
    if SPIN_TOO_LATE:
        return ("torch was imported before benchlib, so singa's OpenMP threads ran on torch's libgomp with libgomp's "
                "default busy-wait (GOMP_SPINCOUNT 300000, about a millisecond): on a busy machine that slows singa "
                "several-fold.")
    return (f"OpenMP (one libgomp, shared by singa's CPU kernels and torch): GOMP_SPINCOUNT="
            f"{os.environ.get('GOMP_SPINCOUNT')}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
            f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}.")


@dataclass
class Table:
    title: str
    script: str  # file name under benchmarks/, for the command line shown with the table
    headers: list[str]
    rows: list[list] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.headers) + " |", "|" + "|".join("---" for _ in self.headers) + "|"]
        lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in self.rows]
        return "\n".join(lines)


def fmt(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        if v >= 100:
            return f"{v:.0f}"
        if v >= 10:
            return f"{v:.1f}"
        return f"{v:.2f}" if v >= 0.1 else f"{v:.3f}"
    return str(v)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def best_time(fn: Callable[[], object], repeat: int, warmup: int = 1, number: int = 1) -> float:
    """Best (smallest) seconds per call of `fn` over `repeat` rounds of `number` calls, after `warmup` calls.

    The minimum is the least disturbed measurement on a shared machine; every call's result is dropped at once so
    that memory is reused the way a training loop reuses it.
    """
    for _ in range(warmup):
        fn()
    gc.collect()
    best = float("inf")
    gc_was = gc.isenabled()
    gc.disable()  # a collection landing inside one round would be charged to whatever ran then
    try:
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            best = min(best, (time.perf_counter() - t0) / number)
    finally:
        if gc_was:
            gc.enable()
    return best


def pass_rows(dev, label: str, shape: tuple, singa: dict, tfn: dict, repeat: int, ofn: dict | None = None
              ) -> list[list]:
    """Rows [label, shape, pass, singa ms, torch ms, singa/torch] of one layer: each pass (name -> zero-argument
    callable) timed best-of-`repeat`, singa's ending with `dev.synchronize()`, torch's under no_grad; with `ofn`
    (a third framework's passes, e.g. onnxruntime's), two more columns: its ms and singa/its."""
    rows = []
    for what, fn in singa.items():

        def timed(f=fn):
            f()
            dev.synchronize()

        ms = best_time(timed, repeat, warmup=2) * 1e3
        tms = None
        if what in tfn:
            with torch.no_grad():
                tms = best_time(tfn[what], repeat, warmup=2) * 1e3
        row = [label, f"({', '.join(str(d) for d in shape)})", what, ms, tms, ratio(ms, tms)]
        if ofn is not None:
            oms = best_time(ofn[what], repeat, warmup=2) * 1e3 if what in ofn else None
            row += [oms, ratio(ms, oms)]
        rows.append(row)
    return rows


def conv_passes(dev, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, dy: np.ndarray, stride: int, pad: int,
                groups: int = 1) -> tuple[dict, dict]:
    """({pass: callable} for singa, {pass: callable} for torch, empty without torch) of a 2-D convolution's three
    passes, forward (with bias `b` when given), data gradient and weight gradient, on the same arrays."""
    from singa import ops

    tx, tw, tdy = (ops.from_numpy(a, dev) for a in (x, w, dy))
    tb = None if b is None else ops.from_numpy(b, dev)
    kw = {"stride": stride, "padding": pad, "groups": groups}
    singa = {
        "forward": lambda: ops.conv2d(tx, tw, tb, **kw),
        "backward data": lambda: ops.conv2d_backward_data(tdy, tw, x.shape, **kw),
        "backward weight": lambda: ops.conv2d_backward_weight(tdy, tx, w.shape, **kw),
    }
    if torch is None:
        return singa, {}
    t, twt, pdy = (torch.from_numpy(a) for a in (x, w, dy))
    ptb = None if b is None else torch.from_numpy(b)

    def grads(mask):
        return torch.ops.aten.convolution_backward(pdy, t, twt, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0],
                                                   groups, mask)

    return singa, {
        "forward": lambda: torch.nn.functional.conv2d(t, twt, ptb, stride, pad, 1, groups),
        "backward data": lambda: grads([True, False, False])[0],
        "backward weight": lambda: grads([False, True, False])[1],
    }


def layer_table(title: str, script: str, cases: list, quick_cases: list[int], quick: bool,
                case_rows: Callable[..., list[list]], third: str | None = None) -> Table:
    """The per-layer table of bench_pool / bench_conv: case_rows(dev, rng, n, case, repeat) gives a layer's rows
    (pass_rows); every case at batch 1 and 8 (the quick run: the quick cases at batch 1, fewer repeats); `third`:
    the name of a third framework whose columns the rows carry."""
    dev = singa_device()
    headers = ["layer", "input", "pass", "singa", "torch", "singa/torch"]
    if third:
        headers += [third, f"singa/{third}"]
    table = Table(title=title, script=script, headers=headers)
    rng = np.random.default_rng(0)
    for n in (1,) if quick else (1, 8):
        for case in ([cases[i] for i in quick_cases] if quick else cases):
            table.rows += case_rows(dev, rng, n, case, 5 if quick else (20 if n == 1 else 10))
    return table


def singa_device():
    """The device under test: the default device (SINGA_DEVICE selects another backend)."""
    return device.get_default_device()


def torch_threads() -> int | None:
    return torch.get_num_threads() if torch is not None else None


def cpu_model() -> str:
    """The CPU's model name, with its vendor, family and model numbers and the vector units that matter here (a
    virtual machine often reports only "Intel(R) Xeon(R) Processor", which does not say which generation)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    flags = set(fields.get("flags", "").split())
    units = [u for u, f in (("AVX2", "avx2"), ("AVX-512", "avx512f"), ("AVX-512 BF16", "avx512_bf16"),
                            ("AMX", "amx_tile")) if f in flags]
    detail = ", ".join(x for x in (fields.get("vendor_id"), fields.get("cpu family") and
                                   f"family {fields['cpu family']} model {fields.get('model', '?')}") if x)
    extra = "; ".join(x for x in (detail, " ".join(units)) if x)
    return f"{name} ({extra})" if extra else name


def memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def numpy_blas() -> str:
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:  # noqa: BLE001 - older numpy has no dict mode; the fact is only informative
        return "unknown"


def machine_facts() -> list[tuple[str, str]]:
    """(what, value) pairs describing where and with what the numbers were taken."""
    import singa

    dev = singa_device()
    facts = [
        ("date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
        ("CPU", cpu_model()),
        ("cores (os.cpu_count)", str(os.cpu_count())),
        ("cores usable by this process", str(len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity")
         else "?"),
        ("memory", f"{memory_gib():.1f} GiB" if memory_gib() else "?"),
        # Other work on the machine (load above the core count) makes multi-threaded numbers unreliable.
        ("load average (1, 5, 15 min) at start", ", ".join(f"{x:.2f}" for x in os.getloadavg())
         if hasattr(os, "getloadavg") else "?"),
        ("OS", platform.platform()),
        ("Python", platform.python_version()),
        ("numpy", f"{np.__version__} (BLAS: {numpy_blas()})"),
        ("torch", f"{torch.__version__} ({torch.get_num_threads()} threads)" if torch is not None
         else "not installed"),
        ("singa-core", singa.__version__),
        ("singa device", dev.description()),
    ]
    try:
        from singa import plugins

        backend = plugins.get_backend(dev.backend_name)
        facts.append(("singa backend", f"{backend.distribution} {backend.version}"))
        facts += [(f"{dev.backend_name} {k}", str(v)) for k, v in backend.info().items()]
    except Exception as exc:  # noqa: BLE001 - facts are informative; never lose the tables over them
        facts.append(("singa backend", f"unknown ({exc})"))
    facts.append(("OpenMP", openmp_note()))
    for var in ("SINGA_DEVICE", "SINGA_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(var):
            facts.append((var, os.environ[var]))
    return facts


def busy_warning() -> str | None:
    """A sentence when the machine was busy (1-minute load above half its cores) as the run started, else None."""
    if not hasattr(os, "getloadavg"):
        return None
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load <= cores / 2:
        return None
    return (f"the 1-minute load average was {load:.1f} on {cores} cores when the run started: other work was "
            "competing for the CPU, so these numbers understate what an idle machine does.")


def main(run: Callable[..., Table]) -> Table:
    """The standalone entry point of a benchmark module: parse --quick, run, print the table."""
    parser = argparse.ArgumentParser(description=run.__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats (a smoke test, not a result)")
    args = parser.parse_args()
    if busy_warning():
        print(f"warning: {busy_warning()}\n")
    table = run(quick=args.quick)
    print(f"### {table.title}\n")
    print(table.markdown())
    for note in table.notes:
        print(f"\n{note}")
    return table
