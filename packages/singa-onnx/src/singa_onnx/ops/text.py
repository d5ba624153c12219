"""String and text-feature operators, and small ai.onnx.ml operators.

SINGA devices hold no strings, so string tensors stay numpy object arrays on the host and these operators run there
(their outputs may go to the device when they are numeric).
"""

from __future__ import annotations

import io
import re
import unicodedata

import numpy as np

from singa import dtypes as sdt
from singa import ops
from singa_onnx.ops._common import host, host_to_tensor, tensor
from singa_onnx.registry import register

_ML = "ai.onnx.ml"


def _strings(v) -> np.ndarray:
    a = np.asarray(v)
    return a if a.dtype == object else a.astype(str).astype(object)


@register("StringConcat")
def string_concat(node, inputs, opset):
    a, b = (_strings(v) for v in inputs)
    return (np.char.add(a.astype(str), b.astype(str))).astype(object)


@register("RegexFullMatch")
def regex_full_match(node, inputs, opset):
    pattern = re.compile(node.attr("pattern"))
    x = _strings(inputs[0])
    return np.vectorize(lambda s: pattern.fullmatch(s) is not None, otypes=[bool])(x) if x.size else \
        np.zeros(x.shape, bool)


@register("StringSplit")
def string_split(node, inputs, opset):
    x = _strings(inputs[0])
    sep = node.attr("delimiter") or None
    maxsplit = node.attr("maxsplit")
    flat = [str(s).split(sep, -1 if maxsplit is None else maxsplit) for s in x.reshape(-1)]
    counts = np.asarray([len(p) for p in flat], dtype=np.int64).reshape(x.shape)
    width = max((len(p) for p in flat), default=0)
    out = np.full((len(flat), width), "", dtype=object)
    for i, p in enumerate(flat):
        out[i, :len(p)] = p
    return out.reshape(x.shape + (width,)), counts


def _strip_accents(s: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFKD", s) if not unicodedata.combining(c))


@register("StringNormalizer")
def string_normalizer(node, inputs, opset):
    x = _strings(inputs[0])
    action = node.attr("case_change_action", "NONE")
    sensitive = bool(node.attr("is_case_sensitive", 0))
    stops = set(node.attr("stopwords") or [])
    low_stops = {w.lower() for w in stops}

    def keep(s: str) -> bool:
        return (s not in stops) if sensitive else (s.lower() not in low_stops)

    def change(s: str) -> str:
        s = _strip_accents(s)
        return s.lower() if action == "LOWER" else s.upper() if action == "UPPER" else s

    if x.ndim == 2 and x.shape[0] == 1:
        row = [change(s) for s in x[0] if keep(s)]
        return np.asarray([row or [""]], dtype=object)
    if x.ndim == 1:
        row = [change(s) for s in x if keep(s)]
        return np.asarray(row or [""], dtype=object)
    raise ValueError(f"StringNormalizer takes [C] or [1, C] inputs, got shape {x.shape}")


@register("TfIdfVectorizer")
def tfidf_vectorizer(node, inputs, opset):
    # n-gram counting over token ids / strings: a text-feature step, done on the host
    x = host(inputs[0])
    pool = list(node.attr("pool_int64s") or node.attr("pool_strings") or [])
    counts = list(node.attr("ngram_counts"))
    indexes = list(node.attr("ngram_indexes"))
    lo, hi = node.attr("min_gram_length"), node.attr("max_gram_length")
    max_skip = node.attr("max_skip_count", 0)
    mode = node.attr("mode")
    weights = node.attr("weights")
    table: dict = {}
    k = 0
    for size, start in enumerate(counts, start=1):
        end = counts[size] if size < len(counts) else len(pool)
        for j in range(start, end, size):
            if lo <= size <= hi:
                table[tuple(pool[j:j + size])] = indexes[k]
            k += 1
    width = max(indexes) + 1
    rows = x.reshape(1, -1) if x.ndim < 2 else x
    freq = np.zeros((rows.shape[0], width), dtype=np.float32)
    for r, row in enumerate(rows):
        toks = [t.item() if hasattr(t, "item") else t for t in row]
        n = len(toks)
        for d in range(1, max_skip + 2):
            for s in range(n):
                for size in range(max(lo, 1 if d == 1 else 2), hi + 1):
                    last = s + (size - 1) * d
                    if last >= n:
                        break
                    hit = table.get(tuple(toks[s:last + 1:d]))
                    if hit is not None:
                        freq[r, hit] += 1
    if mode == "IDF":
        freq = (freq > 0).astype(np.float32) * (np.asarray(weights, np.float32) if weights else 1)
    elif mode == "TFIDF" and weights:
        freq = freq * np.asarray(weights, np.float32)
    out = freq if x.ndim == 2 else freq[0]
    return host_to_tensor(out, node.rt.device)


@register("ImageDecoder")
def image_decoder(node, inputs, opset):
    # decoding JPEG / PNG / ... byte streams is codec work on the host; Pillow is an optional dependency
    try:
        import PIL.Image
    except ImportError:
        raise NotImplementedError("ImageDecoder needs Pillow (pip install pillow)") from None
    img = PIL.Image.open(io.BytesIO(host(inputs[0]).astype(np.uint8).tobytes()))
    fmt = node.attr("pixel_format", "RGB")
    if fmt == "Grayscale":
        out = np.asarray(img.convert("L"))[:, :, None]
    else:
        out = np.asarray(img.convert("RGB") if img.mode != "RGB" else img)
        if fmt == "BGR":
            out = out[:, :, ::-1]
    return host_to_tensor(np.ascontiguousarray(out), node.rt.device, sdt.int32)


# -- ai.onnx.ml ------------------------------------------------------------------------------------------------------


@register("LabelEncoder", domain=_ML)
def label_encoder(node, inputs, opset):
    a = node.attrs
    keys = a.get("keys_strings") or a.get("keys_int64s") or a.get("keys_floats")
    if keys is None and "keys_tensor" in a:
        keys = list(np.asarray(a["keys_tensor"]).reshape(-1))
    if "values_strings" in a:
        values, default, dt = a["values_strings"], a.get("default_string", "_Unused"), object
    elif "values_int64s" in a:
        values, default, dt = a["values_int64s"], a.get("default_int64", -1), np.int64
    elif "values_floats" in a:
        values, default, dt = a["values_floats"], a.get("default_float", -0.0), np.float32
    else:
        vt = np.asarray(a["values_tensor"])
        values, dt = list(vt.reshape(-1)), vt.dtype
        dtens = a.get("default_tensor")
        default = np.asarray(dtens).reshape(-1)[0] if dtens is not None else (
            "_Unused" if dt.kind == "O" else (-1 if dt.kind in "iu" else -0.0))
    table = {(k.item() if hasattr(k, "item") else k): v for k, v in zip(keys, values)}
    x = host(inputs[0])
    out = np.asarray([table.get(e.item() if hasattr(e, "item") else e, default) for e in x.reshape(-1)],
                     dtype=dt).reshape(x.shape)
    return out if out.dtype.kind == "O" else host_to_tensor(out, node.rt.device)


@register("Binarizer", domain=_ML)
def binarizer(node, inputs, opset):
    x = tensor(node, inputs[0])
    return ops.cast(ops.gt(x, float(node.attr("threshold", 0.0))), x.dtype)


@register("ArrayFeatureExtractor", domain=_ML)
def array_feature_extractor(node, inputs, opset):
    x = tensor(node, inputs[0], slot=0)
    idx = tensor(node, inputs[1], sdt.int64, slot=1)
    return ops.gather(x, ops.reshape(idx, (-1,)), len(x.shape) - 1)


@register("TreeEnsemble", domain=_ML)
def tree_ensemble(node, inputs, opset):
    """Every sample walks every tree on the device: per level, gather the node's feature, split and mode, compare,
    and move to the true or false child (leaves are numbered after the internal nodes and stay put)."""
    x = tensor(node, inputs[0])
    xf = x if x.dtype == sdt.float32 else ops.cast(x, sdt.float32)
    dev = x.device
    a = node.attrs
    splits = np.asarray(a["nodes_splits"], dtype=np.float64).reshape(-1)
    feat = np.asarray(a["nodes_featureids"], dtype=np.int64)
    modes = np.asarray(a["nodes_modes"].reshape(-1) if isinstance(a["nodes_modes"], np.ndarray)
                       else a["nodes_modes"], dtype=np.int64)
    tnode, fnode = np.asarray(a["nodes_truenodeids"]), np.asarray(a["nodes_falsenodeids"])
    tleaf, fleaf = np.asarray(a["nodes_trueleafs"]).astype(bool), np.asarray(a["nodes_falseleafs"]).astype(bool)
    weights = np.asarray(a["leaf_weights"], dtype=np.float64).reshape(-1)
    targets = np.asarray(a["leaf_targetids"], dtype=np.int64)
    roots = list(a["tree_roots"])
    tracks = np.asarray(a.get("nodes_missing_value_tracks_true") or [0] * len(feat)).astype(bool)
    n_targets = a.get("n_targets", 1)
    nn = len(feat)
    true_next = np.where(tleaf, nn + tnode, tnode).astype(np.int64)
    false_next = np.where(fleaf, nn + fnode, fnode).astype(np.int64)
    # set-membership nodes: their members, NaN-padded to one width
    members = [[] for _ in range(nn)]
    mv = list(np.asarray(a.get("membership_values", [])).reshape(-1))
    it = iter(mv)
    for i in range(nn):
        if modes[i] == 6:
            for v in it:
                if np.isnan(v):
                    break
                members[i].append(v)
    width = max(1, max(len(m) for m in members))
    mem = np.full((nn, width), np.nan, dtype=np.float32)
    for i, m in enumerate(members):
        mem[i, :len(m)] = m

    def t(arr, code):
        return host_to_tensor(np.asarray(arr), dev, code)

    T = {"split": t(splits.astype(np.float32), sdt.float32), "feat": t(feat, sdt.int64),
         "mode": t(modes, sdt.int64), "tn": t(true_next, sdt.int64), "fn": t(false_next, sdt.int64),
         "track": t(tracks, sdt.bool_), "mem": t(mem, sdt.float32)}
    N, F = xf.shape
    rows = host_to_tensor(np.arange(N, dtype=np.int64) * F, dev, sdt.int64)
    flat = ops.reshape(ops.contiguous(xf), (-1,))
    depth = nn + 1  # an upper bound on any path's length
    results = []
    for root in roots:
        root_leaf = tleaf[root] and fleaf[root] and tnode[root] == fnode[root]
        cur = ops.full((N,), nn + tnode[root] if root_leaf else root, sdt.int64, dev)
        for _ in range(depth):
            inner = ops.lt(cur, ops.full((), nn, sdt.int64, dev))
            c = ops.where(inner, cur, ops.full((), 0, sdt.int64, dev))
            v = ops.gather(flat, ops.add(rows, ops.gather(T["feat"], c, 0)), 0)
            s = ops.gather(T["split"], c, 0)
            m = ops.gather(T["mode"], c, 0)
            member = ops.max(ops.cast(ops.eq(ops.unsqueeze(v, 1), ops.gather(T["mem"], c, 0)), sdt.int32), 1)
            tests = [ops.le(v, s), ops.lt(v, s), ops.ge(v, s), ops.gt(v, s), ops.eq(v, s), ops.ne(v, s),
                     ops.cast(member, sdt.bool_)]
            cond = tests[0]
            for k in range(1, 7):
                cond = ops.where(ops.eq(m, ops.full((), k, sdt.int64, dev)), tests[k], cond)
            cond = ops.logical_or(cond, ops.logical_and(ops.isnan(v), ops.gather(T["track"], c, 0)))
            nxt = ops.where(cond, ops.gather(T["tn"], c, 0), ops.gather(T["fn"], c, 0))
            cur = ops.where(inner, nxt, cur)
            if not host(inner).any():
                break
        leaf = ops.sub(cur, ops.full((), nn, sdt.int64, dev))
        w = ops.gather(t(weights.astype(np.float32), sdt.float32), leaf, 0)
        tg = ops.gather(t(targets, sdt.int64), leaf, 0)
        hot = ops.eq(ops.unsqueeze(tg, 1), t(np.arange(n_targets).reshape(1, -1), sdt.int64))
        results.append((hot, w))
    agg = a.get("aggregate_function", 1)
    if agg in (0, 1):
        y = ops.full((N, n_targets), 0, sdt.float32, dev)
        for hot, w in results:
            y = ops.add(y, ops.where(hot, ops.unsqueeze(w, 1), ops.full((), 0.0, sdt.float32, dev)))
        if agg == 0:
            y = ops.mul(y, 1.0 / len(roots))
    else:
        big = np.finfo(np.float32).max
        y = ops.full((N, n_targets), big if agg == 2 else -big, sdt.float32, dev)
        pick = ops.minimum if agg == 2 else ops.maximum
        for hot, w in results:
            y = ops.where(hot, pick(y, ops.unsqueeze(w, 1)), y)
    post = a.get("post_transform", 0)
    if post == 1:
        y = ops.softmax(y, -1)
    elif post == 2:
        y = ops.sigmoid(y)
    return y if x.dtype == sdt.float32 else ops.cast(y, x.dtype)
