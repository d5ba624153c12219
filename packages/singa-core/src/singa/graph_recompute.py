"""Recomputation of BatchNorm (+ residual Add) (+ ReLU) outputs in a recorded training step.

A training step keeps every value its backward reads alive from the forward to the backward. After a convolution,
BatchNorm and ReLU that is two activations a layer: the convolution's output `c` (BatchNorm's backward reads it) and
the ReLU's output `r` (ReLU's backward and the next convolution's weight gradient read it). At the start of the
backward, those kept activations are the step's memory peak (ResNet-18 on CIFAR: 74 MiB of `c` and 67 MiB of `r` at
batch 32). But `r` is a cheap function of `c`,

    r = relu(batchnorm_apply(c, scale, bias, saved_mean, saved_invstd) [+ s])

with the statistics BatchNorm saved for its backward anyway, so this rewrite lets the forward's `r` die at its last
forward reader and recomputes it just before its first reader in the backward: one pass over `c` a layer (about what
the ReLU itself costs) for one activation a layer less at the peak. The residual `s` of a block's Add is read where it
is alive anyway, or is itself recomputed first (the output of the block before, whose recomputation then moves that
much earlier).

Only where the device has its own `batchnorm_apply` (`Device.kernels`), whose contract is to reproduce
batchnorm_train's output bit for bit from the saved float32/float64 statistics: a replayed step computes exactly what
the eager step computes. Chains whose inputs change between the forward and the recomputation (a parameter updated
in between), float16 data, and values outliving the step keep their recorded calls.
"""

from __future__ import annotations

from singa import dtypes
from singa import graph as _graph
from singa.backend import Device
from singa.graph_fuse import _temporary, _whole

__all__ = ["recompute_batchnorm"]

_FLOATS = (dtypes.float32, dtypes.float64)


class _Chain:
    """batchnorm_train [-> add(·, residual)] [-> relu] of the forward, whose output `out` the backward reads."""

    __slots__ = ("bn", "last", "residual", "residual_bn", "out", "first_use", "at", "new_key")

    def __init__(self, bn: int, last: int, residual: tuple | None, out: tuple, first_use: int):
        self.bn, self.last, self.residual, self.out = bn, last, residual, out
        self.residual_bn: int | None = None  # the BatchNorm whose output the residual is, recomputed alongside
        self.first_use = first_use  # the first backward call reading `out`
        self.at = first_use  # where the recomputation goes (earlier when a later chain needs it as its residual)
        self.new_key = -1


class _Recompute:
    def __init__(self, device: Device, calls: list, infos: list):
        self.device, self.calls, self.infos = device, calls, infos
        self.readers: dict[int, list[int]] = {}
        self.writers: dict[int, list[int]] = {}
        for i, c in enumerate(calls):
            for k in c.reads:
                self.readers.setdefault(k, []).append(i)
            for k in c.writes:
                self.writers.setdefault(k, []).append(i)

    def _single_reader(self, spec: tuple, writer: int) -> int | None:
        """The one call reading the temporary `spec` (written only by `writer`), if it reads it whole."""
        key = spec[1]
        rs = self.readers.get(key, [])
        if (len(rs) != 1 or rs[0] <= writer or self.writers.get(key) != [writer] or not _temporary(key, self.infos)
                or not _whole(spec, self.infos)):
            return None
        return rs[0]

    def _changed(self, keys: set[int], start: int, end: int) -> bool:
        """Some call strictly between `start` and `end` writes one of `keys`."""
        return any(start < w < end for k in keys for w in self.writers.get(k, ()))

    def _normalises(self, i: int) -> bool:
        """Call i is a forward batchnorm_train of float32 or float64 data with statistics of that dtype (where
        batchnorm_apply reproduces its output exactly)."""
        bn = self.calls[i]
        if bn.kind != "kernel" or bn.name != "batchnorm_train" or bn.phase != "forward":
            return False
        y, _rm, _rv, sm, si, x, scale, bias = bn.specs
        views = (y, sm, si, x, scale, bias)
        return (all(s is not None and s[0] == "v" and s[2] in _FLOATS for s in views)
                and y[2] == x[2] == sm[2] == si[2])

    def _inputs(self, i: int) -> set[int]:
        _y, _rm, _rv, sm, si, x, scale, bias = self.calls[i].specs
        return {s[1] for s in (x, scale, bias, sm, si)}

    def chain(self, i: int) -> _Chain | None:
        calls = self.calls
        if not self._normalises(i):
            return None
        last, out, residual = i, calls[i].specs[0], None
        j = self._single_reader(out, last)
        if j is not None and calls[j].name == "add" and calls[j].phase == "forward":
            a, b = calls[j].specs[1:3]
            other = b if a == out else a if b == out else None
            o = calls[j].specs[0]
            if (other is not None and other[0] == "v" and other[1] != out[1] and other[3] == out[3]
                    and other[2] == out[2] and o[3] == out[3] and o[2] == out[2]):
                last, out, residual = j, o, other
                j = self._single_reader(out, last)
        if j is None or calls[j].name != "relu" or calls[j].phase != "forward" or any(calls[j].params.values()) \
                or calls[j].specs[1] != out:
            return None
        last, out = j, calls[j].specs[0]
        key = out[1]
        if (not _whole(out, self.infos) or not _temporary(key, self.infos) or self.writers.get(key) != [last]):
            return None
        later = [r for r in self.readers.get(key, ()) if calls[r].phase != "forward"]
        if not later or any(r <= last for r in self.readers.get(key, ())):
            return None
        first_use = min(later)
        if any(calls[r].phase == "forward" for r in self.readers[key] if r > first_use):
            return None
        # what the recomputation reads must hold the forward's values where it runs
        if self._changed(self._inputs(i), i, first_use):
            return None
        ch = _Chain(i, last, residual, out, first_use)
        if residual is not None:  # a projection shortcut's BatchNorm, read by this Add alone: recomputed too
            w = self.writers.get(residual[1], [])
            if (len(w) == 1 and self._normalises(w[0]) and calls[w[0]].specs[0] == residual
                    and self._single_reader(residual, w[0]) is not None
                    and not self._changed(self._inputs(w[0]), w[0], first_use)):
                ch.residual_bn = w[0]
        return ch

    def run(self) -> list:
        calls, infos = self.calls, self.infos
        chains = {}  # output key -> chain, in forward order
        for i, c in enumerate(calls):
            if c.kind == "kernel" and c.name == "batchnorm_train":
                ch = self.chain(i)
                if ch is None or ch.out[1] in chains:  # a block's two BatchNorms (projection shortcut) reach one Add
                    continue
                s = ch.residual
                if s is not None and s[1] not in chains and ch.residual_bn is None:
                    # read as recorded: it must be alive where the recomputation runs, and unchanged
                    alive = not _temporary(s[1], infos) or max(self.readers[s[1]]) >= ch.first_use
                    if not alive or self._changed({s[1]}, ch.last, ch.first_use):
                        continue
                chains[ch.out[1]] = ch
        if not chains:
            return calls
        # a chain whose residual is recomputed needs that value first: move its recomputation up, latest chain first
        for ch in reversed(list(chains.values())):
            if ch.residual is not None and ch.residual[1] in chains:
                dep = chains[ch.residual[1]]
                dep.at = min(dep.at, ch.at)
        for ch in chains.values():
            ch.new_key = _new_temporary(infos, infos[ch.out[1]].nbytes)
        renamed = {k: ch.new_key for k, ch in chains.items()}
        inserted: dict[int, list] = {}
        for ch in chains.values():  # forward order: a residual's recomputation comes before its reader's
            inserted.setdefault(ch.at, []).extend(self._recompute(ch, renamed))
        out = []
        for i, c in enumerate(calls):
            out.extend(inserted.get(i, ()))
            if c.phase != "forward":
                c = _rename(c, renamed)
            out.append(c)
        return out

    def _apply(self, bn: int, out: tuple, activation: str, anchor: frozenset) -> _graph._Call:
        _y, _rm, _rv, sm, si, x, scale, bias = self.calls[bn].specs
        return _call(self.device.table, "batchnorm_apply", [out, x, scale, bias, sm, si], {"activation": activation},
                     anchor)

    def _recompute(self, ch: _Chain, renamed: dict[int, int]) -> list:
        calls, infos = self.calls, self.infos
        table = self.device.table
        new_out = ("v", ch.new_key, *ch.out[2:])
        # gradients the anchor call reads: the recomputation waits for them, so that the schedule does not hoist it
        # back into the forward, where it would be alive as long as the value it replaces
        anchor = frozenset(k for k in calls[ch.at].reads if any(calls[w].phase != "forward"
                                                                 for w in self.writers.get(k, ())))
        if ch.residual is None:
            return [self._apply(ch.bn, new_out, "relu", anchor)]
        # each call writes a temporary of its own: the planner puts each over the one before (in place)
        nbytes = infos[ch.out[1]].nbytes
        normed, summed = (("v", _new_temporary(infos, nbytes), *ch.out[2:]) for _ in range(2))
        out = [self._apply(ch.bn, normed, "none", anchor)]
        s = ch.residual
        if ch.residual_bn is not None:
            s = ("v", _new_temporary(infos, infos[s[1]].nbytes), *s[2:])
            out.append(self._apply(ch.residual_bn, s, "none", anchor))
        elif s[1] in renamed:
            s = ("v", renamed[s[1]], *s[2:])
        return out + [_call(table, "add", [summed, normed, s], {}, frozenset()),
                      _call(table, "relu", [new_out, summed], {}, frozenset())]


def _new_temporary(infos: list, nbytes: int) -> int:
    info = _graph._BufInfo.__new__(_graph._BufInfo)
    info.key, info.nbytes, info.in_step, info.strong = len(infos), nbytes, True, None
    info.ref = lambda: None  # never dereferenced: temporaries are placed by the planner
    infos.append(info)
    return info.key


def _call(table: dict, name: str, specs: list, params: dict, anchor: frozenset) -> _graph._Call:
    fn = table[name]
    fn = getattr(fn, "__wrapped__", fn)
    reads, writes = _graph._access(name, specs, params)
    return _graph._Call("kernel", name, fn, specs, dict(params), reads | anchor, writes, "backward")


def _rename(c: _graph._Call, renamed: dict[int, int]) -> _graph._Call:
    if not (c.touched() & renamed.keys()):
        return c
    specs = [("v", renamed[s[1]], *s[2:]) if s is not None and s[0] == "v" and s[1] in renamed else s
             for s in c.specs]
    reads = frozenset(renamed.get(k, k) for k in c.reads)
    writes = frozenset(renamed.get(k, k) for k in c.writes)
    return _graph._Call(c.kind, c.name, c.fn, specs, c.params, reads, writes, c.phase, c.data)


def recompute_batchnorm(device: Device, calls: list, infos: list) -> list:
    """The calls of a recorded training step with each BatchNorm (+ Add) + ReLU output that the backward reads
    recomputed there instead of kept from the forward (see the module docstring); new temporaries are appended to
    `infos`. Unchanged where the device lacks its own batchnorm_apply."""
    if "batchnorm_apply" not in getattr(device, "kernels", {}):
        return calls
    return _Recompute(device, calls, infos).run()
