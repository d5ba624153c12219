"""SINGA's device-level graph calls (`EnableGraph`, `RunGraph`, `ResetGraph`), over `singa.graph`.

Apache SINGA's `Model` drives graph mode through the device:

    dev.EnableGraph(True)          # from now on, operations are buffered
    out = model.train_one_batch(x, y)
    dev.Sync()
    dev.EnableGraph(False)
    dev.RunGraph(serial)           # run what was buffered; every later call runs it again

and scripts that do the same by hand get the same training. Here a recording runs its step eagerly while it records
(`singa.graph.Recorder`), so the step has already happened once when `RunGraph` first comes: that first call only
finishes the recording, and each later call replays it. The sequence above therefore performs one step per
`RunGraph`, as SINGA's does. `EnableGraph(False)` inside a recording pauses it (a layer creating its parameters does
this) and `EnableGraph(True)` resumes it; the recording ends at `RunGraph` or `ResetGraph`. Recording again after a
`RunGraph` adds a second graph, replayed after the first.

A step that cannot be replayed faithfully (it reads device data on the host, say) makes `RunGraph` raise
`GraphUnsupported`, naming the place.
"""

from __future__ import annotations

from typing import Any

from singa import graph as _graph

__all__ = ["DeviceGraph"]


class _Recorded:
    __slots__ = ("recorder", "graph", "pending")

    def __init__(self, recorder: _graph.Recorder, g: _graph.Graph):
        self.recorder = recorder
        self.graph = g
        self.pending = True  # its step ran while it was recorded: the next RunGraph skips it once


class DeviceGraph:
    """The graph state of one device: an open recording and the finished graphs that RunGraph replays in order."""

    def __init__(self, device: Any):
        self.device = device
        self.recorder: _graph.Recorder | None = None
        self.graphs: list[_Recorded] = []

    def enable(self, flag: bool) -> None:
        """EnableGraph outside a recording (inside one, the recorder pauses and resumes itself)."""
        if not flag:
            return
        rec = _graph.Recorder(self.device)
        rec.__enter__()  # refuses to nest in another recording, naming it
        self.recorder = rec

    def _close(self) -> _graph.Recorder | None:
        rec, self.recorder = self.recorder, None
        if rec is not None:
            rec.__exit__(None, None, None)
        return rec

    def run(self, serial: bool) -> None:
        rec = self._close()
        if rec is not None:
            try:
                g = rec.finish(bool(serial))
            except _graph.GraphUnsupported as exc:
                raise _graph.GraphUnsupported(f"RunGraph: the operations recorded since EnableGraph(True) cannot be "
                                              f"replayed: {exc}") from None
            self.graphs.append(_Recorded(rec, g))
        for r in self.graphs:
            if r.pending:
                r.pending = False
                continue
            if r.graph.sequential != bool(serial):  # another execution order: plan it once
                r.graph = _graph.Graph(self.device, r.recorder.calls, r.recorder.infos, bool(serial))
            r.graph.run()

    def reset(self) -> None:
        """Forget the open recording and every graph."""
        self._close()
        self.graphs.clear()

    def summary(self) -> list[dict[str, int]]:
        return [r.graph.summary() for r in self.graphs]
