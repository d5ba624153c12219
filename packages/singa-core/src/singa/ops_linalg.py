"""Matrix products of `singa.ops`: `matmul` (batched, with broadcasting), `tensordot` and `einsum`."""

from __future__ import annotations

import builtins
import math
import string
from typing import Any

import numpy as np

from singa.backend import View, make_view
from singa.ops_core import (
    _FLOATS,
    _NUMERIC,
    _TABLES,
    _as_strided,
    _axis,
    _bview,
    _check_out,
    _contig,
    _empty,
    _same_device,
    _same_dtype,
    _supported,
    _table,
    _tensor,
    assign,
    broadcast_shapes,
    copy,
    fill,
    is_contiguous,
)
from singa.ops_elementwise import mul
from singa.ops_reduce import sum
from singa.ops_shape import reshape, transpose
from singa.tensor import Tensor

# -- matrix products ----------------------------------------------------------------------------------------------


def _strided_matrices(X: Tensor, Bx: int) -> tuple | None:
    """(a (Bx, r, c) view with strides (batch, row, 1), trans False) or ((Bx, c, r) ..., True) over X's elements where
    its batch axes step by one stride and its rows (or, transposed, its columns) are contiguous; else None. Batch
    axes that step by two strides (the heads of a batch of sequences) give a (B1, B2, r, c) view instead."""
    r, c = X.shape[-2:]
    sr, sc = X.strides[-2:]
    batch: list[list[int]] = []  # [size, stride] of the batch axes merged where they can be, innermost first
    for d, st in zip(reversed(X.shape[:-2]), reversed(X.strides[:-2])):
        if d == 1:
            continue
        if batch and st == batch[-1][1] * batch[-1][0]:
            batch[-1][0] *= d
        else:
            batch.append([d, st])
    if len(batch) > 2:
        return None
    lead = tuple(d for d, _ in reversed(batch)) if len(batch) == 2 else (Bx,)
    steps = tuple(st for _, st in reversed(batch)) if len(batch) == 2 else (batch[0][1] if batch else 0,)
    if (sc == 1 or c == 1) and (sr >= c or r == 1):
        return View(X.buffer, X.dtype, lead + (r, c), steps + (sr if r > 1 else c, 1), X.offset), False
    if (sr == 1 or r == 1) and (sc >= r or c == 1):
        return View(X.buffer, X.dtype, lead + (c, r), steps + (sc if c > 1 else r, 1), X.offset), True
    return None


def _mat_operand(X: Tensor, S: tuple, B: int, strided: bool = False) -> tuple:
    """X of shape Sx + (r, c) as a (Bx, r, c) view (trans False) or a (Bx, c, r) view (trans True), Bx in {1, B}.

    Row-major and transposed layouts pass without a copy; only other layouts and partial batch broadcasts copy. With
    `strided` (the device's matmul takes strided operands: see primitives' matmul) matrices whose rows (or columns)
    are contiguous also pass, on one batch stride: attention's heads, a transposed slice of a (seq, heads * dim) tensor.
    """
    r, c = X.shape[-2:]
    Sx = X.shape[:-2]
    dt = X.dtype
    whole = (1,) * (len(S) - len(Sx)) + Sx == S  # X has the whole batch (else it broadcasts over it)
    if math.prod(Sx) == 1:
        mshape, mstrides = (r, c), X.strides[-2:]
        if _contig(mshape, mstrides):
            return View(X.buffer, dt, (1, r, c), None, X.offset), False
        if _contig((c, r), mstrides[::-1]):
            return View(X.buffer, dt, (1, c, r), None, X.offset), True
    elif whole:
        if _contig(X.shape, X.strides):
            return View(X.buffer, dt, (B, r, c), None, X.offset), False
        if _contig(Sx + (c, r), X.strides[:-2] + X.strides[-2:][::-1]):
            return View(X.buffer, dt, (B, c, r), None, X.offset), True
    if strided and (whole or math.prod(Sx) == 1):
        v = _strided_matrices(X, B if math.prod(Sx) > 1 else 1)
        if v is not None:
            return v
    if math.prod(Sx) == 1:
        Xc = copy(_as_strided(X, (r, c), X.strides[-2:], X.offset))
        return View(Xc.buffer, dt, (1, r, c), None, 0), False
    if whole:
        Xc = copy(X)
    else:  # a partial broadcast of the batch axes: materialise the full batch
        Xc = copy(_as_strided(X, S + (r, c), _bview(X, S + (r, c)).strides, X.offset))
    return View(Xc.buffer, dt, (B, r, c), None, 0), False


def _plain_matrix(t: Tensor, r: int, c: int) -> tuple[View, bool] | None:
    """A 2-D t (r, c) as the kernel's (1, r, c) view when row-major, (1, c, r) with trans when it is a transposed
    row-major matrix; None for any other layout."""
    if t.strides == (c, 1):
        return make_view(t.buffer, t.dtype, (1, r, c), (r * c, c, 1), t.offset), False
    if t.strides == (1, r):
        return make_view(t.buffer, t.dtype, (1, c, r), (r * c, r, 1), t.offset), True
    return None


def _matrix_product(a: Tensor, b: Tensor, alpha: Any) -> Tensor | None:
    """The product of two float matrices, each row-major or a transposed row-major one, into a new tensor: the case of
    every fully connected layer and its gradients, without the general path's checks that cannot fail for it. None
    for anything else (matmul then takes the general path, which also names what is wrong)."""
    if len(a.shape) != 2 or len(b.shape) != 2:
        return None
    dt, dev = a.dtype, a.device
    (m, k), (k2, n) = a.shape, b.shape
    if b.dtype != dt or dt not in _FLOATS or b.device is not dev or k != k2 or not (m and n and k):
        return None
    pa, pb = _plain_matrix(a, m, k), _plain_matrix(b, k, n)
    if pa is None or pb is None:
        return None
    target = _empty((m, n), dt, dev)
    (_TABLES.get(dev) or _table(dev))["matmul"](make_view(target.buffer, dt, (1, m, n), (m * n, n, 1), 0), pa[0],
                                                 pb[0], trans_a=pa[1], trans_b=pb[1], alpha=float(alpha), beta=0.0)
    return target


def matmul(a: Tensor, b: Tensor, out: Tensor | None = None, alpha: float = 1.0, beta: float = 0.0) -> Tensor:
    """numpy.matmul (1-D operands, broadcast batch axes), scaled: alpha * a @ b (+ beta * out when out is given)."""
    if out is None and a.__class__ is Tensor and b.__class__ is Tensor:
        r = _matrix_product(a, b, alpha)
        if r is not None:
            return r
    op = "matmul"
    _tensor(op, a, "a")
    _tensor(op, b, "b")
    _same_device(op, a, b)
    _same_dtype(op, a, b)
    _supported(op, a.dtype, _NUMERIC)
    if not a.shape or not b.shape:
        raise ValueError(f"matmul: 0-d operand: a {a.shape} @ b {b.shape} (use mul for scalars)")
    A = a if len(a.shape) > 1 else _as_strided(a, (1,) + a.shape, (0,) + a.strides, a.offset)
    Bm = b if len(b.shape) > 1 else _as_strided(b, b.shape + (1,), b.strides + (0,), b.offset)
    m, k = A.shape[-2:]
    k2, n = Bm.shape[-2:]
    if k != k2:
        raise ValueError(f"matmul: inner dimensions differ: a {a.shape} @ b {b.shape}")
    try:
        S = broadcast_shapes(op, A.shape[:-2], Bm.shape[:-2])
    except ValueError:
        raise ValueError(f"matmul: cannot broadcast batch dimensions: a {a.shape} @ b {b.shape}") from None
    oshape = S + (m, n)
    if len(a.shape) == 1:
        oshape = oshape[:-2] + oshape[-1:]
    if len(b.shape) == 1:
        oshape = oshape[:-1]
    dev, dt = a.device, a.dtype
    if out is None:
        target = _empty(oshape, dt, dev)
        beta = 0.0
    else:
        _check_out(op, out, oshape, dt, dev)
        target = out
        if not is_contiguous(out) or out.buffer is a.buffer or out.buffer is b.buffer:
            target = copy(out) if beta != 0 else _empty(oshape, dt, dev)
    if math.prod(oshape):
        if k == 0:  # no products to sum: only the beta term remains
            if beta == 0:
                fill(target, 0)
            elif beta != 1:
                mul(target, beta, out=target)
        else:
            Bn = math.prod(S)
            if math.prod(Bm.shape[:-2]) == 1 and _contig(A.shape, A.strides):
                # b has no batch: fold a's batch into its rows, one large product instead of Bn small ones
                a3, ta = View(A.buffer, dt, (1, Bn * m, k), None, A.offset), False
                b3, tb = _mat_operand(Bm, (), 1)
                o3 = View(target.buffer, dt, (1, Bn * m, n), None, target.offset)
            else:
                kernel = _table(dev)["matmul"]  # a graph recorder's hook carries the backend's as __wrapped__
                strided = getattr(getattr(kernel, "__wrapped__", kernel), "strided_operands", False)
                a3, ta = _mat_operand(A, S, Bn, strided)
                b3, tb = _mat_operand(Bm, S, Bn, strided)
                o3 = View(target.buffer, dt, (Bn, m, n), None, target.offset)
            _table(dev)["matmul"](o3, a3, b3, trans_a=ta, trans_b=tb, alpha=float(alpha), beta=float(beta))
    if out is not None and target is not out:
        assign(out, target)
        return out
    return target


def tensordot(a: Tensor, b: Tensor, axes: Any = 2) -> Tensor:
    """numpy.tensordot: sum products over `axes` (an int n: last n of a with first n of b; or two axis lists)."""
    op = "tensordot"
    _tensor(op, a, "a")
    _tensor(op, b, "b")
    na, nb = len(a.shape), len(b.shape)
    if isinstance(axes, (int, np.integer)):
        if not 0 <= axes <= builtins.min(na, nb):
            raise ValueError(f"tensordot: axes={axes} is out of range for a {a.shape} and b {b.shape}")
        ax_a, ax_b = list(range(na - axes, na)), list(range(int(axes)))
    else:
        ax_a, ax_b = axes
        ax_a = [ax_a] if isinstance(ax_a, (int, np.integer)) else list(ax_a)
        ax_b = [ax_b] if isinstance(ax_b, (int, np.integer)) else list(ax_b)
        ax_a = [_axis(op, x, na, a.shape) for x in ax_a]
        ax_b = [_axis(op, x, nb, b.shape) for x in ax_b]
    if len(ax_a) != len(ax_b) or any(a.shape[i] != b.shape[j] for i, j in zip(ax_a, ax_b)):
        raise ValueError(f"tensordot: shape mismatch: a {a.shape} axes {tuple(ax_a)} and b {b.shape} axes "
                         f"{tuple(ax_b)}")
    free_a = [i for i in range(na) if i not in ax_a]
    free_b = [i for i in range(nb) if i not in ax_b]
    K = math.prod(a.shape[i] for i in ax_a)
    A2 = reshape(transpose(a, free_a + ax_a), (math.prod(a.shape[i] for i in free_a), K))
    B2 = reshape(transpose(b, ax_b + free_b), (K, math.prod(b.shape[i] for i in free_b)))
    return reshape(matmul(A2, B2), tuple(a.shape[i] for i in free_a) + tuple(b.shape[i] for i in free_b))


def einsum(subscripts: str, *operands: Tensor) -> Tensor:
    """numpy.einsum: explicit ('ij,jk->ik') or implicit output, '...', repeated indices (diagonals), size-1
    broadcasting, any number of operands (contracted left to right with matrix products)."""
    op = "einsum"
    if not operands:
        raise ValueError("einsum: no operands")
    for t in operands:
        _tensor(op, t, "operand")
        _same_device(op, operands[0], t)
        _same_dtype(op, operands[0], t)
    spec = subscripts.replace(" ", "")
    lhs, arrow, rhs = spec.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise ValueError(f"einsum: {len(terms)} operand subscripts in {subscripts!r} for {len(operands)} operands")
    letters = set(spec) - set(",->.")
    if any(c not in string.ascii_letters for c in letters):
        raise ValueError(f"einsum: subscripts {subscripts!r} may use only letters, ',', '->' and '...'")
    spare = [c for c in string.ascii_letters if c not in letters]
    ell_nd = 0
    for term, t in zip(terms, operands):
        if "..." in term:
            ell_nd = builtins.max(ell_nd, len(t.shape) - (len(term) - 3))
    ell = "".join(spare[:ell_nd])
    expanded = []
    for i, (term, t) in enumerate(zip(terms, operands)):
        if "..." in term:
            k = len(t.shape) - (len(term) - 3)
            if k < 0:
                raise ValueError(f"einsum: subscripts {term!r} do not match operand {i} of shape {t.shape}")
            term = term.replace("...", ell[ell_nd - k:])
        if "." in term or len(term) != len(t.shape):
            raise ValueError(f"einsum: subscripts {term!r} do not match operand {i} of shape {t.shape}")
        expanded.append(term)
    if arrow:
        out_terms = rhs.replace("...", ell)
        if "." in out_terms or len(set(out_terms)) != len(out_terms):
            raise ValueError(f"einsum: bad output subscripts {rhs!r}")
        if any(c not in "".join(expanded) for c in out_terms):
            raise ValueError(f"einsum: output subscript in {rhs!r} does not appear in the inputs")
    else:
        counts = {}
        for term in expanded:
            for c in term:
                counts[c] = counts.get(c, 0) + 1
        out_terms = ell + "".join(sorted(c for c in counts if counts[c] == 1 and c not in ell))
    sizes: dict = {}
    for term, t in zip(expanded, operands):
        for c, d in zip(term, t.shape):
            s = sizes.get(c, 1)
            if d != s and d != 1 and s != 1:
                raise ValueError(f"einsum: size mismatch for index {c!r}: {s} and {d}")
            sizes[c] = builtins.max(s, d) if d != 1 and s != 1 else (d if s == 1 else s)
    # Normalise operands: take diagonals of repeated indices, broadcast size-1 axes, sum indices used nowhere else.
    work = []
    for idx, (term, t) in enumerate(zip(expanded, operands)):
        shape, strides, labels = [], [], []
        for c, d, s in zip(term, t.shape, t.strides):
            if c in labels:
                j = labels.index(c)
                if shape[j] != d:
                    raise ValueError(f"einsum: repeated index {c!r} of operand {idx} spans sizes {shape[j]} and {d}")
                strides[j] += s
            else:
                labels.append(c)
                shape.append(d)
                strides.append(s)
        for j, c in enumerate(labels):
            if shape[j] == 1 and sizes[c] != 1:
                shape[j], strides[j] = sizes[c], 0
        work.append([_as_strided(t, tuple(shape), tuple(strides), t.offset), "".join(labels)])
    cur, cl = work[0]
    for i in range(1, len(work) + 1):
        later = out_terms + "".join(w[1] for w in work[i:])
        drop = [j for j, c in enumerate(cl) if c not in later]
        if drop:
            cur = sum(cur, drop)
            cl = "".join(c for j, c in enumerate(cl) if j not in drop)
        if i == len(work):
            break
        nxt, nl = work[i]
        later = out_terms + "".join(w[1] for w in work[i + 1:])
        drop = [j for j, c in enumerate(nl) if c not in later and c not in cl]
        if drop:
            nxt = sum(nxt, drop)
            nl = "".join(c for j, c in enumerate(nl) if j not in drop)
        batch = [c for c in cl if c in nl and c in later]
        contr = [c for c in cl if c in nl and c not in later]
        a_only = [c for c in cl if c not in nl]
        b_only = [c for c in nl if c not in cl]
        A = transpose(cur, [cl.index(c) for c in batch + a_only + contr])
        Bt = transpose(nxt, [nl.index(c) for c in batch + contr + b_only])
        size = lambda cs: math.prod(sizes[c] for c in cs)  # noqa: E731
        A = reshape(A, (size(batch), size(a_only), size(contr)))
        Bt = reshape(Bt, (size(batch), size(contr), size(b_only)))
        cl = "".join(batch + a_only + b_only)
        cur = reshape(matmul(A, Bt), tuple(sizes[c] for c in cl))
    res = transpose(cur, [cl.index(c) for c in out_terms])
    if any(res.buffer is t.buffer for t in operands):
        res = copy(res)  # never hand back a view of an input
    return res
