"""String and text-feature operators, and small ai.onnx.ml operators.

SINGA devices hold no strings, so string tensors stay numpy object arrays on the host and these operators run there
(their outputs may go to the device when they are numeric).
"""

from __future__ import annotations

import re
import unicodedata

import numpy as np

from singa import ops
from singa import dtypes as sdt
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
            "_Unused" if dt == object else (-1 if dt.kind in "iu" else -0.0))
    table = {(k.item() if hasattr(k, "item") else k): v for k, v in zip(keys, values)}
    x = host(inputs[0])
    out = np.asarray([table.get(e.item() if hasattr(e, "item") else e, default) for e in x.reshape(-1)],
                     dtype=dt).reshape(x.shape)
    return out if dt == object else host_to_tensor(out, node.rt.device)


@register("Binarizer", domain=_ML)
def binarizer(node, inputs, opset):
    x = tensor(node, inputs[0])
    return ops.cast(ops.gt(x, float(node.attr("threshold", 0.0))), x.dtype)


@register("ArrayFeatureExtractor", domain=_ML)
def array_feature_extractor(node, inputs, opset):
    x = tensor(node, inputs[0], slot=0)
    idx = tensor(node, inputs[1], sdt.int64, slot=1)
    return ops.gather(x, ops.reshape(idx, (-1,)), len(x.shape) - 1)
