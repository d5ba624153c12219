"""Control flow (If, Loop, Scan, SequenceMap), sequences and optionals.

Subgraphs run with `runtime.execute` in a scope that sees the enclosing graph's values. A sequence is a Python list of
values; an empty optional is None. Loop conditions and trip counts are read on the host (the next iteration depends on
them), so models with loops run eagerly, not as replayed graphs.
"""

from __future__ import annotations

import numpy as np

from singa import autograd, ops
from singa_onnx.ops._common import FLOATS, host, norm_axis, scalar, shape_of, tensor
from singa_onnx.registry import register


def _run_sub(node, prog, feeds: dict):
    from singa_onnx.runtime import execute

    vals = execute(prog, node.rt, feeds, parent=node.scope)
    return [vals.get(o) for o in prog.outputs]


def _stack(node, items: list, axis: int = 0):
    """Stack per-iteration values along a new axis (gradients flow for float tensors)."""
    ts = [tensor(node, v) for v in items]
    grad = ts[0].dtype in FLOATS
    nd = len(ts[0].shape) + 1
    ax = norm_axis(axis, nd)
    ex = [autograd.unsqueeze(t, [ax]) if grad else ops.unsqueeze(t, ax) for t in ts]
    if len(ex) == 1:
        return ex[0]
    return autograd.cat(ex, ax) if grad else ops.concat(ex, ax)


def _empty_scan(node, i: int):
    from singa_onnx import onnx_types as ot

    t = node.out_types[i] if i < len(node.out_types) else None
    return np.zeros((0,), dtype=ot.np_dtype(t) if t else np.float32)


@register("If")
def if_(node, inputs, opset):
    cond = bool(host(inputs[0]).reshape(-1)[0])
    prog = node.subgraphs["then_branch" if cond else "else_branch"]
    return tuple(_run_sub(node, prog, {}))


@register("Loop")
def loop(node, inputs, opset):
    body = node.subgraphs["body"]
    m = inputs[0]
    cond_in = inputs[1] if len(inputs) > 1 else None
    trip = int(scalar(m)) if m is not None else None
    cond = bool(scalar(cond_in)) if cond_in is not None else True
    carried = list(inputs[2:])
    n_carried = len(carried)
    scans: list[list] = [[] for _ in range(len(body.outputs) - 1 - n_carried)]
    names = body.all_inputs
    i = 0
    while cond and (trip is None or i < trip):
        feeds = {names[0]: np.asarray(i, dtype=np.int64)}
        if len(names) > 1:
            feeds[names[1]] = np.asarray(cond, dtype=bool)
        for n, v in zip(names[2:], carried):
            feeds[n] = v
        outs = _run_sub(node, body, feeds)
        cond = bool(scalar(outs[0])) if outs[0] is not None else cond
        carried = outs[1:1 + n_carried]
        for k, v in enumerate(outs[1 + n_carried:]):
            scans[k].append(v)
        i += 1
    results = list(carried)
    for k, items in enumerate(scans):
        if not items:
            results.append(_empty_scan(node, n_carried + k))
        elif isinstance(items[0], list):
            results.append([e for it in items for e in it])
        else:
            results.append(_stack(node, items))
    return tuple(results)


@register("Scan", since=9)
def scan(node, inputs, opset):
    body = node.subgraphs["body"]
    n_scan = node.attr("num_scan_inputs")
    n_state = len(inputs) - n_scan
    states = list(inputs[:n_state])
    xs = [tensor(node, v) for v in inputs[n_state:]]
    in_axes = list(node.attr("scan_input_axes") or [0] * n_scan)
    in_dirs = list(node.attr("scan_input_directions") or [0] * n_scan)
    n_out = len(body.outputs) - n_state
    out_axes = list(node.attr("scan_output_axes") or [0] * n_out)
    out_dirs = list(node.attr("scan_output_directions") or [0] * n_out)
    axes = [norm_axis(a, len(x.shape)) for a, x in zip(in_axes, xs)]
    T = xs[0].shape[axes[0]] if xs else 0
    names = body.all_inputs
    scans: list[list] = [[] for _ in range(n_out)]
    for t in range(T):
        feeds = dict(zip(names[:n_state], states))
        for k, (x, a, d) in enumerate(zip(xs, axes, in_dirs)):
            idx = T - 1 - t if d else t
            key = tuple(idx if j == a else slice(None) for j in range(len(x.shape)))
            sl = ops.getitem(x, key) if x.dtype not in FLOATS else autograd.squeeze(
                autograd.slice(x, [idx], [idx + 1], [a]), [a])
            feeds[names[n_state + k]] = sl
        outs = _run_sub(node, body, feeds)
        states = outs[:n_state]
        for k, v in enumerate(outs[n_state:]):
            scans[k].append(v)
    results = list(states)
    for k, items in enumerate(scans):
        if not items:
            results.append(_empty_scan(node, n_state + k))
            continue
        if out_dirs[k]:
            items = items[::-1]
        nd = len(shape_of(items[0])) + 1
        results.append(_stack(node, items, norm_axis(out_axes[k], nd)))
    return tuple(results)


@register("Scan", since=8, until=8)
def scan8(node, inputs, opset):
    # opset 8: a leading batch axis and an optional sequence_lens input
    body = node.subgraphs["body"]
    n_scan = node.attr("num_scan_inputs")
    rest = list(inputs[1:])
    n_state = len(rest) - n_scan
    dirs = list(node.attr("directions") or [0] * n_scan)
    B = shape_of(rest[0] if rest else None)[0]
    names = body.all_inputs
    per_batch_out: list[list] = []
    for b in range(B):
        states = [ops.getitem(tensor(node, s), b) for s in rest[:n_state]]
        xs = [ops.getitem(tensor(node, x), b) for x in rest[n_state:]]
        T = xs[0].shape[0]
        scans: list[list] = []
        for t in range(T):
            feeds = dict(zip(names[:n_state], states))
            for k, (x, d) in enumerate(zip(xs, dirs)):
                feeds[names[n_state + k]] = ops.getitem(x, T - 1 - t if d else t)
            outs = _run_sub(node, body, feeds)
            states = outs[:n_state]
            if not scans:
                scans = [[] for _ in outs[n_state:]]
            for k, v in enumerate(outs[n_state:]):
                scans[k].append(v)
        per_batch_out.append(list(states) + [_stack(node, s) for s in scans])
    return tuple(_stack(node, [row[k] for row in per_batch_out]) for k in range(len(per_batch_out[0])))


# -- sequences ------------------------------------------------------------------------------------------------------


@register("SequenceEmpty")
def sequence_empty(node, inputs, opset):
    return []


@register("SequenceConstruct")
def sequence_construct(node, inputs, opset):
    return list(inputs)


def _pos(v, n, default, insert=False):
    if v is None:
        return default
    p = int(scalar(v))
    if p < 0:
        p += n + (1 if insert else 0) if insert else n
    return p


@register("SequenceAt")
def sequence_at(node, inputs, opset):
    seq = inputs[0]
    return seq[_pos(inputs[1], len(seq), 0)]


@register("SequenceInsert")
def sequence_insert(node, inputs, opset):
    seq = list(inputs[0])
    pos = inputs[2] if len(inputs) > 2 else None
    p = len(seq) if pos is None else int(scalar(pos))
    if p < 0:
        p += len(seq)
    seq.insert(p, inputs[1])
    return seq


@register("SequenceErase")
def sequence_erase(node, inputs, opset):
    seq = list(inputs[0])
    pos = inputs[1] if len(inputs) > 1 else None
    p = len(seq) - 1 if pos is None else int(scalar(pos))
    del seq[p]
    return seq


@register("SequenceLength")
def sequence_length(node, inputs, opset):
    return np.asarray(len(inputs[0]), dtype=np.int64)


@register("ConcatFromSequence")
def concat_from_sequence(node, inputs, opset):
    seq = inputs[0]
    ax = node.attr("axis")
    if node.attr("new_axis", 0):
        return _stack(node, seq, ax)
    ts = [tensor(node, v) for v in seq]
    ax = norm_axis(ax, len(ts[0].shape))
    if len(ts) == 1:
        return ts[0]
    return autograd.cat(ts, ax) if ts[0].dtype in FLOATS else ops.concat(ts, ax)


@register("SplitToSequence", static=(1,))
def split_to_sequence(node, inputs, opset):
    x = tensor(node, inputs[0])
    ax = norm_axis(node.attr("axis", 0), len(x.shape))
    d = x.shape[ax]
    split = inputs[1] if len(inputs) > 1 else None
    keep = node.attr("keepdims", 1)
    if split is None:
        parts = [1] * d
    else:
        s = host(split)
        if s.ndim == 0:
            n = int(s)
            parts = [n] * (d // n) + ([d % n] if d % n else [])
        else:
            parts = [int(p) for p in s]
    grad = x.dtype in FLOATS
    out, pos = [], 0
    for p in parts:
        piece = autograd.slice(x, [pos], [pos + p], [ax]) if grad else ops.slice(x, [pos], [pos + p], [ax])
        if split is None and not keep:
            piece = autograd.squeeze(piece, [ax]) if grad else ops.squeeze(piece, ax)
        out.append(piece)
        pos += p
    return out


@register("SequenceMap")
def sequence_map(node, inputs, opset):
    body = node.subgraphs["body"]
    seq = inputs[0]
    extra = inputs[1:]
    names = body.all_inputs
    results: list[list] = [[] for _ in body.outputs]
    for i in range(len(seq)):
        feeds = {names[0]: seq[i]}
        for n, v in zip(names[1:], extra):
            feeds[n] = v[i] if isinstance(v, list) else v
        for k, o in enumerate(_run_sub(node, body, feeds)):
            results[k].append(o)
    return tuple(results)


# -- optionals ------------------------------------------------------------------------------------------------------


@register("Optional")
def optional(node, inputs, opset):
    return inputs[0] if inputs else None


@register("OptionalHasElement")
def optional_has_element(node, inputs, opset):
    return np.asarray(bool(inputs) and inputs[0] is not None)


@register("OptionalGetElement")
def optional_get_element(node, inputs, opset):
    if inputs[0] is None:
        raise ValueError("OptionalGetElement of an empty optional")
    return inputs[0]
