"""Time profiling of graph-mode steps, as in SINGA 4, plus a Chrome trace export.

`device.SetVerbosity(n)` with n > 0 makes every graph replay on that device time each kernel call (the device is
synchronised after each one, so the time is the kernel's, not its launch). The first `skip` replays are warm-up and
are not timed (`device.SetSkipIteration(skip)`, default 5 as in SINGA). `device.PrintTimeProfiling()` (or
`Model.print_time_profiling()`) prints the time per phase (forward / backward / update) per iteration, then count,
total and mean time per kernel name; with verbosity >= 2 also the mean time of each recorded call in execution order.
`export_chrome_trace(device, path)` writes the timed calls in the Trace Event format that chrome://tracing and Perfetto
open: complete events (ph "X") with ts and dur in microseconds.
"""

from __future__ import annotations

import json
import os
import weakref
from typing import Any

from singa.backend import Device

__all__ = ["Profiler", "profiler", "begin_iteration", "print_time_profiling", "time_profiling_report",
           "export_chrome_trace", "set_skip_iteration"]

DEFAULT_SKIP = 5
MAX_EVENTS = 500_000  # trace events kept (each is a small tuple); the statistics keep counting past it


class CallStat:
    __slots__ = ("name", "phase", "count", "total_ns", "min_ns", "max_ns")

    def __init__(self, name: str, phase: str):
        self.name = name
        self.phase = phase
        self.count = 0
        self.total_ns = 0
        self.min_ns = None
        self.max_ns = 0


class Profiler:
    """Timing statistics of the graph replays on one device."""

    def __init__(self, device_name: str):
        self.device_name = device_name
        self.skip_iterations = DEFAULT_SKIP
        self.reset()

    def reset(self) -> None:
        """Forget the statistics and restart the warm-up count."""
        self.iterations = 0  # replays seen
        self.profiled = 0  # replays timed
        self.calls: dict[tuple[int, int], CallStat] = {}
        self.events: list[tuple[str, str, int, int, int]] = []  # (name, phase, start ns, duration ns, iteration)
        self.iteration_spans: list[tuple[int, int, int]] = []  # (iteration, start ns, duration ns)
        self.dropped_events = 0

    # -- collection (called by Graph.run) -----------------------------------------------------------------------------
    def add(self, graph: int, pos: int, name: str, phase: str, start_ns: int, dur_ns: int) -> None:
        st = self.calls.get((graph, pos))
        if st is None:
            st = self.calls[(graph, pos)] = CallStat(name, phase)
        st.count += 1
        st.total_ns += dur_ns
        st.min_ns = dur_ns if st.min_ns is None else min(st.min_ns, dur_ns)
        st.max_ns = max(st.max_ns, dur_ns)
        if len(self.events) < MAX_EVENTS:
            self.events.append((name, phase, start_ns, dur_ns, self.iterations))
        else:
            self.dropped_events += 1

    def end_iteration(self, start_ns: int, dur_ns: int) -> None:
        self.profiled += 1
        self.iteration_spans.append((self.iterations, start_ns, dur_ns))

    # -- summaries -----------------------------------------------------------------------------------------------------
    def by_kernel(self) -> dict[str, dict[str, float]]:
        """{kernel name: {'count', 'total_ms', 'mean_us'}}, slowest first."""
        agg: dict[str, list[int]] = {}
        for st in self.calls.values():
            a = agg.setdefault(st.name, [0, 0])
            a[0] += st.count
            a[1] += st.total_ns
        rows = sorted(agg.items(), key=lambda kv: -kv[1][1])
        return {k: {"count": c, "total_ms": t / 1e6, "mean_us": t / c / 1e3 if c else 0.0} for k, (c, t) in rows}

    def by_phase(self) -> dict[str, float]:
        """{phase: mean milliseconds per profiled iteration}."""
        tot: dict[str, int] = {}
        for st in self.calls.values():
            tot[st.phase] = tot.get(st.phase, 0) + st.total_ns
        n = max(self.profiled, 1)
        return {p: t / n / 1e6 for p, t in tot.items()}

    def report(self, verbosity: int = 1) -> str:
        if not self.profiled:
            return (f"time profiling ({self.device_name}): no graph iteration profiled yet ({self.iterations} run, "
                    f"the first {self.skip_iterations} are skipped; enable with device.SetVerbosity(1))")
        skipped = min(self.iterations - self.profiled, self.skip_iterations)
        head = f"time profiling ({self.device_name}): {self.profiled} graph iteration(s) timed, {skipped} warm-up"
        lines = [head + " iteration(s) skipped"]
        phases = self.by_phase()
        total = sum(phases.values())
        lines.append("  per iteration: " + ", ".join(f"{p} {ms:.3f} ms" for p, ms in phases.items())
                     + f", total {total:.3f} ms")
        lines.append(f"  {'kernel':<32}{'count':>10}{'total ms':>12}{'mean us':>12}")
        for name, r in self.by_kernel().items():
            lines.append(f"  {name:<32}{r['count']:>10}{r['total_ms']:>12.3f}{r['mean_us']:>12.2f}")
        if verbosity >= 2:
            lines.append(f"  {'call':>6}  {'phase':<10}{'kernel':<32}{'count':>8}{'mean us':>12}{'min us':>10}"
                         f"{'max us':>10}")
            for (_, pos), st in sorted(self.calls.items()):
                mean = st.total_ns / st.count / 1e3
                lines.append(f"  {pos:>6}  {st.phase:<10}{st.name:<32}{st.count:>8}{mean:>12.2f}"
                             f"{(st.min_ns or 0) / 1e3:>10.2f}{st.max_ns / 1e3:>10.2f}")
        return "\n".join(lines)

    def chrome_trace(self) -> dict[str, Any]:
        """The Trace Event Format object: complete events, microseconds from the first timed iteration."""
        base = self.iteration_spans[0][1] if self.iteration_spans else 0
        if self.events:
            base = min(base, self.events[0][2]) if self.iteration_spans else self.events[0][2]
        pid = os.getpid()
        ev: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"singa {self.device_name}"}},
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "iterations"}},
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": 1, "args": {"name": "kernels"}},
        ]
        for it, start, dur in self.iteration_spans:
            ev.append({"name": f"iteration {it}", "cat": "iteration", "ph": "X", "ts": (start - base) / 1e3,
                       "dur": dur / 1e3, "pid": pid, "tid": 0, "args": {"iteration": it}})
        for name, phase, start, dur, it in self.events:
            ev.append({"name": name, "cat": phase, "ph": "X", "ts": (start - base) / 1e3, "dur": dur / 1e3,
                       "pid": pid, "tid": 1, "args": {"phase": phase, "iteration": it}})
        return {"traceEvents": ev, "displayTimeUnit": "ms",
                "otherData": {"device": self.device_name, "dropped_events": self.dropped_events}}


_profilers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def profiler(device: Device) -> Profiler:
    """The profiler of a device (created on first use)."""
    p = _profilers.get(device)
    if p is None:
        p = _profilers[device] = Profiler(device.name)
    return p


def begin_iteration(device: Device) -> Profiler | None:
    """Count one graph replay; the profiler when this one is to be timed, else None."""
    p = _profilers.get(device)
    if p is None:
        p = profiler(device)
    p.iterations += 1
    if getattr(device, "verbosity", 0) > 0 and p.iterations > p.skip_iterations:
        return p
    return None


def set_skip_iteration(device: Device, skip: int) -> None:
    if int(skip) < 0:
        raise ValueError(f"SetSkipIteration: skip must be >= 0, got {skip}")
    profiler(device).skip_iterations = int(skip)


def time_profiling_report(device: Device) -> str:
    return profiler(device).report(max(getattr(device, "verbosity", 1), 1))


def print_time_profiling(device: Device) -> None:
    print(time_profiling_report(device))


def export_chrome_trace(device: Device, path: str | os.PathLike) -> None:
    """Write the timed kernel calls of `device` as Chrome trace JSON (open with chrome://tracing or Perfetto)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(profiler(device).chrome_trace(), f)
