"""Rewrites of a recorded inference step (a `Model` forward in evaluation mode, see `Recorder.finish(inference=True)`).

Convolution + BatchNorm folding. In evaluation, a BatchNorm after a convolution is an affine map per output channel,
y = conv(x, w) * s + t with s = scale / sqrt(var + eps) and t = bias - mean * s, so the pair is one convolution with
weights w * s and bias t (+ b * s). A following residual Add and ReLU then go into the same call too: the recorded

    conv2d -> batchnorm_infer [-> add(·, r)] [-> relu]

becomes two `batchnorm_infer` calls that fold the weights and bias into planned temporaries, then one `conv2d_fused`
(the backend's fused kernel, or the core's composition where it has none). The fold runs at every replay, from the
parameters and running statistics as they are then, so a training step or a loaded checkpoint between two
evaluations needs nothing: no cache to invalidate. It reads and writes the weights once, which is worth it only
where they are smaller than the activation passes it saves (one per call removed): larger ones (a deep layer at a
small batch) keep the recorded calls.

Only values the chain alone touches are removed: an intermediate that another call reads, or that outlives the
step, stays as recorded.

Channel blocks. A device whose conv2d_fused reads and writes channel blocks (`Device.channel_block` B > 0: oneDNN
on the CPU) converts every NCHW activation to (N, C/B, H, W, B) and back around each convolution unless the caller
keeps it blocked (a pass over the activation each way: ~10% of a ResNet-18 evaluation at batch 32). After the fold,
`keep_channel_blocks` keeps an activation blocked when every call touching it can take that: convolutions (the
output, the input x and the residual, which shares the output's layout; a plain conv2d becomes a conv2d_fused to
take them), ReLU and same-shape Add (the same elements in either layout when all operands share it: they join their
operands into one group), poolings (pool2d's `blocks`; a pooling down to one pixel reads a blocked input and writes
what is NCHW too). A value read by any other call (a BatchNorm left unfolded, a reshape before a Linear), viewed in
part, or outliving the step keeps NCHW, and so does its whole group; the convolutions at those edges convert.
The same rules as singa_onnx.layout's, over kernel calls instead of ONNX nodes.

Two rewrites hold for any recorded step (training, evaluation, an ONNX plan), so `Recorder.finish` applies them to
all: `write_into_slices` lets a kernel whose output is only ever copied into a slice of another value (Concat's
inputs) write into that slice itself, where the slice's elements lie one after another (at batch 1, or a slice along
the first axis); `drop_unread` removes kernel calls whose every output is a temporary nothing reads (an ONNX
Dropout's mask that no node uses).
"""

from __future__ import annotations

import weakref
from typing import Any

from singa import dtypes
from singa import graph as _graph
from singa.backend import Device, View, contiguous_strides

__all__ = ["fold_batchnorm", "keep_channel_blocks", "write_into_slices", "drop_unread", "Groups"]


class Groups:
    """Union-find over hashable values: `join` puts values into one group, `root` names the group of a value (a
    value never joined is a group of its own). The layout passes use it: values in one group share a layout."""

    def __init__(self) -> None:
        self._parent: dict = {}

    def root(self, v: Any) -> Any:
        parent = self._parent
        while parent.setdefault(v, v) != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    def join(self, values: Any) -> None:
        roots = [self.root(v) for v in values]
        for r in roots[1:]:
            self._parent[r] = roots[0]


def _numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _whole(spec: Any, infos: list) -> bool:
    """A contiguous view of all of its buffer."""
    if spec is None or spec[0] != "v":
        return False
    _, key, dtype, shape, strides, offset = spec
    return (offset == 0 and strides == contiguous_strides(shape)
            and _numel(shape) * dtypes.itemsize(dtype) == infos[key].nbytes)


def _temporary(key: int, infos: list) -> bool:
    """A value made in the step and dead after it (the planner places it)."""
    info = infos[key]
    return info.in_step and info.strong is None


def _vector(spec: Any, k: int, dtype: int) -> bool:
    return spec is not None and spec[0] == "v" and spec[3] == (k,) and spec[4] == (1,) and spec[2] == dtype


def _reshaped(spec: tuple, shape: tuple) -> tuple:
    return ("v", spec[1], spec[2], shape, contiguous_strides(shape), spec[5])


class _Rewriter:
    def __init__(self, device: Device, calls: list, infos: list):
        self.device = device
        self.calls = calls
        self.infos = infos
        self.table = {name: getattr(fn, "__wrapped__", fn) for name, fn in device.table.items()}
        self.touches: dict[int, list[int]] = {}
        for i, c in enumerate(calls):
            for k in c.touched():
                self.touches.setdefault(k, []).append(i)
        self.zeros: dict[tuple, tuple] = {}
        self.taken: set[int] = set()  # calls a chain replaces

    def _temporary(self, key: int, *users: int) -> bool:
        """A value made in the step, dead after it, and touched by exactly these calls."""
        info = self.infos[key]
        return info.in_step and info.strong is None and sorted(self.touches.get(key, ())) == sorted(users)

    def _only_reader(self, key: int, writer: int) -> int | None:
        """The one call other than `writer` that touches `key`, if it comes after the write and no other chain
        has taken it."""
        users = [i for i in self.touches.get(key, ()) if i != writer]
        if len(users) != 1 or users[0] < writer or users[0] in self.taken:
            return None
        return users[0]

    def _new_temporary(self, nbytes: int) -> int:
        info = _graph._BufInfo.__new__(_graph._BufInfo)
        info.key, info.nbytes, info.in_step, info.strong = len(self.infos), nbytes, True, None
        info.ref = weakref.ref(self)  # never dereferenced: temporaries are placed by the planner
        self.infos.append(info)
        return info.key

    def _zeros(self, k: int, dtype: int) -> tuple:
        """A kept buffer of k zeros (the fold's zero mean and bias), one per (k, dtype)."""
        spec = self.zeros.get((k, dtype))
        if spec is None:
            buf = self.device.alloc(k * dtypes.itemsize(dtype))
            self.table["fill"](View(buf, dtype, (k,)), value=0.0)
            info = _graph._BufInfo(len(self.infos), buf, in_step=False)
            self.infos.append(info)
            spec = ("v", info.key, dtype, (k,), (1,), 0)
            self.zeros[(k, dtype)] = spec
        return spec

    def _unchanged_between(self, keys: set[int], start: int, end: int) -> bool:
        """No call strictly between start and end writes any of `keys` (the fused call moves from start to end)."""
        return not any(self.calls[i].writes & keys for i in range(start + 1, end))

    def chain(self, i: int) -> tuple[list[int], tuple | None, str] | None:
        """The calls [conv, bn, (add), (relu)] starting at conv call i, the residual's spec and the activation."""
        calls = self.calls
        conv = calls[i]
        out, w = conv.specs[0], conv.specs[2]
        if not _whole(out, self.infos) or w is None or w[0] != "v" or w[4] != contiguous_strides(w[3]):
            return None
        if out[2] not in (dtypes.float32, dtypes.float64):
            return None
        j = self._only_reader(out[1], i)
        if j is None or calls[j].name != "batchnorm_infer" or calls[j].specs[1] != out:
            return None
        if not self._temporary(out[1], i, j):
            return None
        k = out[3][1]
        if not all(_vector(s, k, out[2]) for s in calls[j].specs[2:6]):
            return None
        group, residual, act = [i, j], None, "none"
        y = calls[j].specs[0]
        if not _whole(y, self.infos) or y[3] != out[3]:
            return None
        nxt = self._only_reader(y[1], j)
        if nxt is not None and calls[nxt].name == "add" and self._temporary(y[1], j, nxt):
            a, b = calls[nxt].specs[1], calls[nxt].specs[2]
            other = b if a == y else a if b == y else None
            if other is not None and other[1] != y[1] and _whole(other, self.infos) and other[3] == y[3] \
                    and other[2] == y[2] and _whole(calls[nxt].specs[0], self.infos):
                group.append(nxt)
                residual, y = other, calls[nxt].specs[0]
                nxt = self._only_reader(y[1], nxt)
        if nxt is not None and calls[nxt].name == "relu" and not any(calls[nxt].params.values()) \
                and calls[nxt].specs[1] == y and self._temporary(y[1], group[-1], nxt) \
                and _whole(calls[nxt].specs[0], self.infos):
            group.append(nxt)
            act = "relu"
        # the fold passes over the weights twice; each call it removes passed over the activation two or three times
        if _numel(w[3]) > (len(group) - 1) * _numel(out[3]):
            return None
        return group, residual, act

    def fuse(self, group: list[int], residual: tuple | None, act: str) -> list:
        conv, bn = self.calls[group[0]], self.calls[group[1]]
        out = self.calls[group[-1]].specs[0]
        _, x, w, b = conv.specs[:4]
        y_scale, y_bias, mean, var = bn.specs[2:6]
        dtype, k = w[2], w[3][0]
        # the fused call takes the place of the chain's last call: what the convolution and the BatchNorm read
        # must hold the same values there (the residual is read where the Add read it)
        read = {s[1] for s in (x, w, b, y_scale, y_bias, mean, var) if s is not None and s[0] == "v"}
        if not self._unchanged_between(read, group[0], group[-1]):
            return []
        isz = dtypes.itemsize(dtype)
        per = _numel(w[3]) // k
        w_fold = ("v", self._new_temporary(_numel(w[3]) * isz), dtype, w[3], w[4], 0)
        b_fold = ("v", self._new_temporary(k * isz), dtype, (k,), (1,), 0)
        zeros = self._zeros(k, dtype)
        b_in = b if b is not None and b[0] == "v" else zeros
        eps = bn.params
        norm = self.table["batchnorm_infer"]
        return [
            # w * s: the weights as a (1, K, C*kh*kw, 1) batch, normalised with mean 0 and bias 0
            self._call(norm, "batchnorm_infer",
                       [_reshaped(w_fold, (1, k, per, 1)), _reshaped(w, (1, k, per, 1)), y_scale, zeros, zeros, var],
                       eps),
            # (b - mean) * s + bias
            self._call(norm, "batchnorm_infer",
                       [_reshaped(b_fold, (1, k, 1, 1)), _reshaped(b_in, (1, k, 1, 1)), y_scale, y_bias, mean, var],
                       eps),
            self._call(self.table["conv2d_fused"], "conv2d_fused", [out, x, w_fold, b_fold, residual],
                       dict(conv.params, activation=act)),
        ]

    def _call(self, fn, name: str, specs: list, params: dict):
        reads, writes = _graph._access(name, specs, params)
        return _graph._Call("kernel", name, fn, specs, dict(params), reads, writes, "forward")

    def run(self) -> list:
        if "conv2d_fused" not in self.table or "batchnorm_infer" not in self.table or "fill" not in self.table:
            return self.calls
        replaced: dict[int, list] = {}  # position of a chain's last call -> the calls that take its place
        for i, c in enumerate(self.calls):
            if c.kind != "kernel" or c.name != "conv2d" or i in self.taken:
                continue
            found = self.chain(i)
            if found is None:
                continue
            group, residual, act = found
            fused = self.fuse(group, residual, act)
            if fused:
                self.taken.update(group)
                replaced[group[-1]] = fused
        out = []
        for i, c in enumerate(self.calls):
            if i in replaced:
                out.extend(replaced[i])
            elif i not in self.taken:
                out.append(c)
        return out


def fold_batchnorm(device: Device, calls: list, infos: list) -> list:
    """The calls of a recorded inference step with each convolution + BatchNorm (+ residual Add) (+ ReLU) chain
    replaced by the fold of its weights and one conv2d_fused (see the module docstring). New temporaries and the
    kept zero vectors are appended to `infos`."""
    return _Rewriter(device, calls, infos).run()


def _fits_blocks(spec: Any, infos: list, block: int) -> bool:
    """A whole float32 NCHW value, made in the step and dead after it, whose channels are whole blocks."""
    if not _whole(spec, infos) or spec[2] != dtypes.float32 or len(spec[3]) != 4 or spec[3][1] % block:
        return False
    return _temporary(spec[1], infos)


def _layout_positions(c: Any) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]] | None:
    """For a call that can run on channel-blocked values: (positions of its arguments that may be blocked,
    groups of positions that must share one layout); None for any other call."""
    if c.kind != "kernel":
        return None
    specs = c.specs
    if c.name in ("conv2d", "conv2d_fused") and c.params.get("groups", 1) == 1 and "blocks" not in c.params:
        if c.name == "conv2d_fused" and len(specs) > 4 and specs[4] is not None:
            return (0, 1, 4), ((0, 4),)
        return (0, 1), ()
    if c.name == "pool2d" and "blocks" not in c.params and specs[1] is None and len(specs[2][3]) == 4:
        if specs[0][3][2:] == (1, 1):
            return (2,), ()  # down to one pixel: the output is the same bytes in both layouts, left NCHW
        return (0, 2), ((0, 2),)
    if c.name in ("relu", "add") and not any(c.params.values()) and all(
            s is not None and s[0] == "v" and s[3] == specs[0][3] and s[4] == specs[0][4] for s in specs):
        return tuple(range(len(specs))), (tuple(range(len(specs))),)
    return None


def keep_channel_blocks(device: Device, calls: list, infos: list) -> list:
    """The calls with the activations that can stay in the device's channel blocks kept so (see the module
    docstring): the convolutions and poolings that touch them get `blocks`."""
    block = getattr(device, "channel_block", 0)
    table = {name: getattr(fn, "__wrapped__", fn) for name, fn in device.table.items()}
    if block <= 0 or "conv2d_fused" not in table:
        return calls
    groups = Groups()
    bad: set[int] = set()
    for c in calls:
        pos = _layout_positions(c)
        allowed = () if pos is None else pos[0]
        for p, spec in enumerate(c.specs):
            if spec is None or spec[0] != "v":
                continue
            if p not in allowed or not _fits_blocks(spec, infos, block):
                bad.add(spec[1])
        for group in pos[1] if pos is not None else ():
            groups.join(c.specs[p][1] for p in group)
        if c.kind != "kernel" or pos is None:
            bad.update(c.touched())
    spoiled = {groups.root(k) for k in bad}

    def blocked(spec: Any) -> int:
        return block if spec is not None and spec[0] == "v" and groups.root(spec[1]) not in spoiled else 0

    out = []
    for c in calls:
        pos = _layout_positions(c)
        if pos is None or c.name in ("relu", "add"):
            out.append(c)
            continue
        if c.name == "pool2d":
            b = blocked(c.specs[2])
            out.append(c if not b else _graph._Call(c.kind, c.name, c.fn, c.specs, dict(c.params, blocks=b),
                                                    c.reads, c.writes, c.phase))
            continue
        blocks = (blocked(c.specs[1]), blocked(c.specs[0]))
        if blocks == (0, 0):
            out.append(c)
            continue
        specs, params, fn = c.specs, dict(c.params), c.fn
        if c.name == "conv2d":  # the fused kernel without a residual or activation: it takes `blocks`
            specs = list(specs[:4]) + [None] * (4 - len(specs)) + [None]
            params["activation"] = "none"
            fn = table["conv2d_fused"]
        params["blocks"] = blocks
        out.append(_graph._Call(c.kind, "conv2d_fused", fn, specs, params, c.reads, c.writes, c.phase))
    return out


def _dense(spec: tuple) -> bool:
    """The view's elements lie one after another in row-major order, as a contiguous view's do (the strides of
    dimensions of size 1 never step)."""
    return all(d == 1 or s == w for d, s, w in zip(spec[3], spec[4], contiguous_strides(spec[3])))


def _extent(spec: tuple) -> tuple[int, int]:
    """The bytes [start, end) of its buffer that a view can touch."""
    _, _, dtype, shape, strides, offset = spec
    lo = hi = offset
    if _numel(shape) == 0:
        return offset, offset
    for d, st in zip(shape, strides):
        if st > 0:
            hi += (d - 1) * st
        else:
            lo += (d - 1) * st
    size = dtypes.itemsize(dtype)
    return lo * size, (hi + 1) * size


def _apart(a: tuple, b: tuple) -> bool:
    (a0, a1), (b0, b1) = _extent(a), _extent(b)
    return a1 <= b0 or b1 <= a0


_SLICE_ALIGN = 64  # bytes: where a slice may start for a kernel to write it (libraries want aligned operands)


def write_into_slices(calls: list, infos: list) -> list:
    """The calls with each `copy(slice of r, t)` gone where one kernel call wrote all of t and nothing else reads it:
    that call writes the slice instead. The slice must be dense (its elements as a contiguous view of its shape
    would lie) and start at a multiple of 64 bytes (cuDNN's and oneDNN's fast kernels want aligned pointers), and,
    between the two calls, nothing may read r or write the slice's bytes; the writer must not touch r itself. t is
    then never made."""
    touches: dict[int, set[int]] = {}  # kept up to date as writers move: chains of copies collapse
    for i, c in enumerate(calls):
        for k in c.touched():
            touches.setdefault(k, set()).add(i)
    calls = list(calls)
    gone: set[int] = set()
    for j, c in enumerate(calls):
        if c.kind != "kernel" or c.name != "copy" or len(c.specs) != 2:
            continue
        dst, src = c.specs
        if dst is None or src is None or dst[0] != "v" or src[0] != "v":
            continue
        t, r = src[1], dst[1]
        users = touches.get(t, set())
        if (t == r or src[2:4] != dst[2:4] or not _whole(src, infos) or not _dense(dst)
                or dst[5] * dtypes.itemsize(dst[2]) % _SLICE_ALIGN
                or not _temporary(t, infos) or len(users) != 2 or max(users) != j):
            continue
        i = min(users)
        w = calls[i]
        out = w.specs[0] if w.kind == "kernel" and w.specs else None
        if (out is None or w.name.startswith("random_") or out[0] != "v" or out[1] != t or out[2] != src[2]
                or not _whole(out, infos) or t in w.reads or r in w.touched()
                or any(s is not None and s[0] == "v" and s[1] == t for s in w.specs[1:])):
            continue
        if any(m not in gone and (r in calls[m].reads or (r in calls[m].writes and not all(
                _apart(s, dst) for s in calls[m].specs if s is not None and s[0] == "v" and s[1] == r)))
               for m in range(i + 1, j)):
            continue
        # the writer's own shape of t (a matmul's (1, m, n) for a copy's (m, n)): the same bytes, in order
        specs = [("v", r, out[2], out[3], contiguous_strides(out[3]), dst[5])] + list(w.specs[1:])
        reads, writes = _graph._access(w.name, specs, w.params)
        calls[i] = _graph._Call(w.kind, w.name, w.fn, specs, w.params, reads, writes, w.phase, w.data)
        gone.add(j)
        touches[t] = set()
        touches[r] = (touches[r] - {j}) | {i}
    return [c for j, c in enumerate(calls) if j not in gone]


def drop_unread(calls: list, infos: list) -> list:
    """The calls without the kernel calls (random ones aside: they advance the generator) whose every output is a
    temporary that no later call reads."""
    read: set[int] = set()
    keep = []
    for c in reversed(calls):
        if (c.kind == "kernel" and not c.name.startswith("random_") and c.writes
                and all(_temporary(k, infos) and k not in read for k in c.writes)):
            continue
        read |= c.reads
        keep.append(c)
    return keep[::-1]
