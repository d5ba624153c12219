"""Matrix products and scans: MatMul, Gemm, Einsum, CumSum, CumProd, TopK, Det, MatMulInteger."""

from __future__ import annotations

import string

import numpy as np

from singa import autograd, ops
from singa import dtypes as sdt
from singa.tensor import Tensor
from singa_onnx.ops._common import (
    FLOATS,
    arange,
    const_like,
    host_to_tensor,
    inputs_as_tensors,
    norm_axis,
    scalar,
    tensor,
)
from singa_onnx.registry import register


@register("MatMul")
def matmul(node, inputs, opset):
    a, b = inputs_as_tensors(node, inputs)
    if a.dtype in FLOATS:
        return autograd.matmul(a, b)
    return ops.matmul(a, b)


@register("FusedMatMul", domain="com.microsoft")
def fused_matmul(node, inputs, opset):
    """onnxruntime's contrib FusedMatMul (which the inference optimiser writes for a MatMul scaled by a constant):
    alpha * op(A) @ op(B), op transposing the last two axes where transA / transB."""
    if node.attr("transBatchA", 0) or node.attr("transBatchB", 0):
        raise ValueError("FusedMatMul: transBatchA / transBatchB are not supported")
    a, b = inputs_as_tensors(node, inputs)
    alpha = float(node.attr("alpha", 1.0))
    if node.attr("transA", 0):
        a = autograd.transpose(a, _last_two_swapped(a))
    if node.attr("transB", 0):
        b = autograd.transpose(b, _last_two_swapped(b))
    if a.dtype not in FLOATS:
        raise TypeError(f"FusedMatMul: float inputs expected, got {sdt.name(a.dtype)}")
    if not autograd.training or not (a.requires_grad or b.requires_grad):
        return ops.matmul(a, b, alpha=alpha)  # the scale in the product's own pass
    y = autograd.matmul(a, b)
    return y if alpha == 1.0 else autograd.mul(y, const_like(y, alpha))


def _last_two_swapped(t: Tensor) -> list[int]:
    n = len(t.shape)
    if n < 2:
        raise ValueError(f"FusedMatMul: a transposed operand needs 2 or more axes, got shape {t.shape}")
    return list(range(n - 2)) + [n - 1, n - 2]


@register("Gemm")
def gemm(node, inputs, opset):
    a, b, c = (list(inputs_as_tensors(node, inputs)) + [None])[:3]
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    ta, tb = node.attr("transA", 0), node.attr("transB", 0)
    if a.dtype in FLOATS:
        return autograd.gemm(a, b, c, alpha, beta, ta, tb)
    aa = ops.transpose(a) if ta else a
    bb = ops.transpose(b) if tb else b
    y = ops.matmul(aa, bb)
    if alpha != 1:
        y = ops.mul(y, const_like(y, int(alpha)))
    if c is not None:
        y = ops.add(y, c if beta == 1 else ops.mul(c, const_like(c, int(beta))))
    return y


@register("MatMulInteger")
def matmul_integer(node, inputs, opset):
    a, b = tensor(node, inputs[0], sdt.int32, slot=0), tensor(node, inputs[1], sdt.int32, slot=1)
    if len(inputs) > 2 and inputs[2] is not None:
        za = tensor(node, inputs[2], sdt.int32, slot=2)
        if za.shape and za.shape[0] == a.shape[-2] and len(a.shape) >= 2:
            za = ops.reshape(za, (za.shape[0], 1))  # one zero point per row of a
        a = ops.sub(a, za)
    if len(inputs) > 3 and inputs[3] is not None:
        b = ops.sub(b, tensor(node, inputs[3], sdt.int32, slot=3))  # one per column of b broadcasts as (N,)
    return ops.matmul(a, b)


# -- Einsum ---------------------------------------------------------------------------------------------------------


def _explicit(eq: str, shapes: list[tuple]) -> tuple[list[str], str]:
    """Operand and output subscripts with '...' replaced by letters and the output made explicit."""
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    used = set(eq) - set(",->.")
    spare = [c for c in string.ascii_letters if c not in used]
    ell_nd = max((len(s) - (len(t) - 3) for t, s in zip(terms, shapes) if "..." in t), default=0)
    ell = "".join(spare[:ell_nd])
    out_terms = []
    for t, s in zip(terms, shapes):
        if "..." in t:
            k = len(s) - (len(t) - 3)
            t = t.replace("...", ell[ell_nd - k:])
        out_terms.append(t)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts: dict = {}
        for t in out_terms:
            for c in t:
                counts[c] = counts.get(c, 0) + 1
        out = ell + "".join(sorted(c for c in counts if counts[c] == 1 and c not in ell))
    return out_terms, out


class _Einsum(autograd.Operator):
    """numpy.einsum; each operand's gradient is another einsum of the output gradient with the other operands."""

    def __init__(self, equation: str) -> None:
        super().__init__()
        self.equation = equation

    def forward(self, *xs: Tensor) -> Tensor:
        y = ops.einsum(self.equation, *xs)
        if autograd.training:
            self.saved = xs
        return y

    def backward(self, dy: Tensor) -> tuple:
        xs = self.saved
        terms, out = _explicit(self.equation, [x.shape for x in xs])
        sizes: dict = {}
        for t, x in zip(terms, xs):
            for c, d in zip(t, x.shape):
                sizes[c] = max(sizes.get(c, 1), d)
        grads = []
        for i, (t, x) in enumerate(zip(terms, xs)):
            if not self._input_needs_grad(i) or len(set(t)) != len(t):
                grads.append(None)  # repeated indices (diagonals) get no gradient
                continue
            others = [(tt, xx) for j, (tt, xx) in enumerate(zip(terms, xs)) if j != i]
            avail = set(out).union(*[set(tt) for tt, _ in others]) if others else set(out)
            target = "".join(c for c in t if c in avail)
            spec = ",".join([out] + [tt for tt, _ in others]) + "->" + target
            g = ops.einsum(spec, dy, *[xx for _, xx in others])
            # letters only in this operand were summed away: the gradient is constant along them
            full_shape = tuple(sizes[c] for c in t)
            g = ops.reshape(g, tuple(sizes[c] if c in target else 1 for c in t))
            g = ops.copy(ops.broadcast_to(g, full_shape))
            if full_shape != x.shape:
                g = autograd.back_broadcast(full_shape, x.shape, g)
            grads.append(g)
        return tuple(grads)


@register("Einsum")
def einsum(node, inputs, opset):
    xs = inputs_as_tensors(node, inputs)
    eq = node.attr("equation")
    if xs[0].dtype in FLOATS:
        return _Einsum(eq)(*xs)[0]
    return ops.einsum(eq, *xs)


# -- scans ----------------------------------------------------------------------------------------------------------


@register("CumSum", static=(1,))
def cumsum(node, inputs, opset):
    x = tensor(node, inputs[0])
    nd = len(x.shape)
    if nd == 0:
        return x
    ax = norm_axis(int(scalar(inputs[1])), nd)
    n = x.shape[ax]
    excl, rev = node.attr("exclusive", 0), node.attr("reverse", 0)
    # y = x @ M along the axis: M[j, i] = 1 where element j contributes to the sum at i
    j, i = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    m = (j > i if excl else j >= i) if rev else (j < i if excl else j <= i)
    M = host_to_tensor(m.astype(np.float32), x.device, x.dtype)
    perm = [a for a in range(nd) if a != ax] + [ax]
    inv = list(np.argsort(perm))
    grad = x.dtype in FLOATS
    xt = autograd.transpose(x, perm) if grad else ops.transpose(x, perm)
    y = autograd.matmul(xt, M) if grad else ops.matmul(ops.contiguous(xt), M)
    return autograd.transpose(y, inv) if grad else ops.copy(ops.transpose(y, inv))


@register("CumProd", static=(1,))
def cumprod(node, inputs, opset):
    x = tensor(node, inputs[0])
    nd = len(x.shape)
    ax = norm_axis(int(scalar(inputs[1])), nd)
    n = x.shape[ax]
    excl, rev = node.attr("exclusive", 0), node.attr("reverse", 0)
    grad = x.dtype in FLOATS

    def sl(k):
        return autograd.slice(x, [k], [k + 1], [ax]) if grad else ops.slice(x, [k], [k + 1], [ax])

    mul = autograd.mul if grad else ops.mul
    order = list(range(n - 1, -1, -1)) if rev else list(range(n))
    pieces: dict = {}
    acc = None
    for k in order:
        if excl:
            pieces[k] = acc if acc is not None else ops.full(sl(k).shape, 1, x.dtype, x.device)
            acc = sl(k) if acc is None else mul(acc, sl(k))
        else:
            acc = sl(k) if acc is None else mul(acc, sl(k))
            pieces[k] = acc
    parts = [pieces[k] for k in range(n)]
    if not parts:
        return x
    return autograd.cat(parts, ax) if grad else ops.concat(parts, ax)


# -- TopK: ranks from pairwise comparisons (no sort kernel), then a gather ------------------------------------------


def _ranks(x: Tensor, largest: bool) -> Tensor:
    """rank of each element along the last axis (0 = first in the output order); ties keep the lower index first."""
    n = x.shape[-1]
    xi = ops.unsqueeze(x, -1)  # (..., n, 1): element i
    xj = ops.unsqueeze(x, -2)  # (..., 1, n): element j
    before = ops.gt(xj, xi) if largest else ops.lt(xj, xi)
    idx = np.arange(n)
    lower = host_to_tensor(idx[None, :] < idx[:, None], x.device, sdt.bool_)  # [i, j]: j < i
    tie = ops.logical_and(ops.eq(xj, xi), lower)
    return ops.sum(ops.cast(ops.logical_or(before, tie), sdt.int64), -1)


@register("TopK", static=(1,))
def topk(node, inputs, opset):
    x = tensor(node, inputs[0])
    k = int(scalar(inputs[1])) if opset >= 10 else int(node.attr("k"))
    nd = len(x.shape)
    ax = norm_axis(node.attr("axis", -1), nd)
    largest = bool(node.attr("largest", 1))
    perm = [a for a in range(nd) if a != ax] + [ax]
    inv = list(np.argsort(perm))
    xt = ops.contiguous(ops.transpose(x, perm))
    ranks = _ranks(xt, largest)  # (..., n)
    r = arange(k, x.device, sdt.int64, (k, 1))  # (k, 1)
    hit = ops.cast(ops.eq(ops.unsqueeze(ranks, -2), r), sdt.int64)  # (..., k, n)
    n = x.shape[ax]
    idx = ops.sum(ops.mul(hit, arange(n, x.device, sdt.int64)), -1)  # (..., k)
    from singa_onnx.ops.indexing import gather_elements

    values = gather_elements(xt, idx, len(perm) - 1)
    values = autograd.transpose(values, inv) if x.dtype in FLOATS else ops.copy(ops.transpose(values, inv))
    return values, ops.copy(ops.transpose(idx, inv))


@register("Det")
def det(node, inputs, opset):
    x = tensor(node, inputs[0])
    n = x.shape[-1]
    batch = x.shape[:-2]
    # Gaussian elimination with partial pivoting, row operations as tensor ops on the whole batch
    a = ops.reshape(ops.copy(x), (-1, n, n))
    B = a.shape[0]
    det_acc = ops.full((B,), 1, x.dtype, x.device)
    rows = arange(n, x.device, sdt.int64)
    for c in range(n):
        col = ops.abs(ops.getitem(a, (slice(None), slice(c, None), c)))  # (B, n - c)
        p = ops.add(ops.argmax(col, 1), const_like(ops.argmax(col, 1), c))  # pivot rows (B,)
        # swap rows c and p: a permutation built from the pivot index
        pc = ops.unsqueeze(p, 1)
        is_p = ops.eq(ops.unsqueeze(rows, 0), pc)  # (B, n)
        is_c = ops.eq(ops.unsqueeze(rows, 0), ops.full((B, 1), c, sdt.int64, x.device))
        src = ops.where(is_c, pc, ops.where(is_p, ops.full((), c, sdt.int64, x.device), ops.unsqueeze(rows, 0)))
        swapped = ops.logical_not(ops.eq(p, ops.full((), c, sdt.int64, x.device)))
        from singa_onnx.ops.indexing import gather_elements

        a = gather_elements(a, ops.copy(ops.broadcast_to(ops.unsqueeze(src, 2), (B, n, n))), 1)
        det_acc = ops.where(swapped, ops.neg(det_acc), det_acc)
        piv = ops.getitem(a, (slice(None), c, c))  # (B,)
        det_acc = ops.mul(det_acc, piv)
        if c + 1 < n:
            below = ops.getitem(a, (slice(None), slice(c + 1, None), slice(None)))  # (B, n-c-1, n)
            factor = ops.div(ops.getitem(a, (slice(None), slice(c + 1, None), slice(c, c + 1))),
                             ops.reshape(piv, (B, 1, 1)))
            prow = ops.getitem(a, (slice(None), slice(c, c + 1), slice(None)))
            new_below = ops.sub(below, ops.mul(factor, prow))
            a = ops.concat([ops.getitem(a, (slice(None), slice(0, c + 1), slice(None))), new_below], 1)
    return ops.reshape(det_acc, batch)
