"""Autograd operators of linear algebra: `Matmul`, `MatmulBias`, `AddBias`, `Gemm` and `CosSim`."""

from __future__ import annotations

from singa import ops
from singa.autograd_engine import Operator, _Plain, back_broadcast, training
from singa.tensor import Tensor

# -- linear algebra -------------------------------------------------------------------------------------------------


def _swap(t: Tensor) -> Tensor:
    return ops.swapaxes(t, -1, -2)


class Matmul(_Plain):
    """numpy.matmul: 1-D operands and broadcast batch axes; gradients are summed over broadcast batches."""

    def forward(self, x: Tensor, w: Tensor) -> Tensor:
        y = ops.matmul(x, w)
        if training:
            self.input = (x, w)
        return y

    def backward(self, dy: Tensor) -> tuple:
        x, w = self.input
        if len(x.shape) == 2 and len(w.shape) == 2:  # the common case, without the reshapes of the general one
            return _matrix_grads(self, x, w, dy)
        xa = x if len(x.shape) > 1 else ops.reshape(x, (1, x.shape[0]))
        wa = w if len(w.shape) > 1 else ops.reshape(w, (w.shape[0], 1))
        m, k, n = xa.shape[-2], xa.shape[-1], wa.shape[-1]
        batch = ops.broadcast_shapes("matmul", xa.shape[:-2], wa.shape[:-2])
        g = ops.reshape(dy, batch + (m, n))
        dx = dw = None
        if self._input_needs_grad(0):
            dx = back_broadcast(batch + (m, k), xa.shape, ops.matmul(g, _swap(wa)))
            dx = ops.reshape(dx, x.shape)
        if self._input_needs_grad(1):
            if len(wa.shape) == 2 and batch:
                # w shared by every batch: one (k, B*m) @ (B*m, n) product instead of B products summed afterwards
                xb = ops.reshape(ops.contiguous(ops.broadcast_to(xa, batch + (m, k))), (-1, k))
                dw = ops.matmul(_swap(xb), ops.reshape(g, (-1, n)))
            else:
                dw = back_broadcast(batch + (k, n), wa.shape, ops.matmul(_swap(xa), g))
            dw = ops.reshape(dw, w.shape)
        return dx, dw


def matmul(x: Tensor, w: Tensor) -> Tensor:
    return Matmul()(x, w)[0]


def _matrix_grads(op: Operator, x: Tensor, w: Tensor, dy: Tensor) -> tuple:
    """(dx, dw) of y = x @ w for matrices x and w, each None when its input wants no gradient."""
    dx = ops.matmul(dy, _swap(w)) if op._input_needs_grad(0) else None
    dw = ops.matmul(_swap(x), dy) if op._input_needs_grad(1) else None
    return dx, dw


class MatmulBias(_Plain):
    """x @ w + b for a matrix x (batch, in), w (in, out) and b (out,): Linear's forward as one operator, so a layer
    costs one graph node and one in-place add instead of a second operator (exported as MatMul and Add)."""

    axis = 0  # the bias is repeated over rows, as AddBias(axis=0) repeats it (the exporter reads it)

    def forward(self, x: Tensor, w: Tensor, b: Tensor) -> Tensor:
        if len(x.shape) != 2 or len(w.shape) != 2 or b.shape != (w.shape[1],):
            raise ValueError(f"matmul_bias: wants x (batch, in), w (in, out) and b (out,), got x {x.shape}, "
                             f"w {w.shape} and b {b.shape}")
        y = ops.matmul(x, w)
        ops.add(y, b, out=y)
        if training:
            self.input = (x, w)
        return y

    def backward(self, dy: Tensor) -> tuple:
        x, w = self.input
        dx, dw = _matrix_grads(self, x, w, dy)
        return dx, dw, ops.sum(dy, 0) if self._input_needs_grad(2) else None


def matmul_bias(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    """x @ w + b (x a matrix, b one value per column of the result), as one operator."""
    return MatmulBias()(x, w, b)[0]


class AddBias(Operator):
    """x + b with b repeated over rows (axis=0: b has x.shape[-1] elements) or columns (axis=1: x.shape[0])."""

    def __init__(self, axis: int = 0) -> None:
        super().__init__()
        self.axis = axis

    def forward(self, x: Tensor, b: Tensor) -> Tensor:
        nd = len(x.shape)
        if self.axis == 0:
            n, shape = x.shape[-1], (1,) * (nd - 1) + (x.shape[-1],)
        elif self.axis == 1:
            n, shape = x.shape[0], (x.shape[0],) + (1,) * (nd - 1)
        else:
            raise ValueError(f"add_bias: axis must be 0 or 1, got {self.axis}")
        if b.size() != n:
            raise ValueError(f"add_bias: bias of shape {b.shape} does not match x of shape {x.shape} (axis "
                             f"{self.axis} needs {n} elements)")
        self.shapes = (b.shape, shape)
        return ops.add(x, ops.reshape(b, shape))

    def backward(self, dy: Tensor) -> tuple:
        b_shape, shape = self.shapes
        axes = tuple(i for i, d in enumerate(shape) if d == 1 and dy.shape[i] != 1) or None
        db = ops.sum(dy, axes) if axes else dy
        return dy, ops.reshape(db, b_shape)


def add_bias(x: Tensor, b: Tensor, axis: int = 0) -> Tensor:
    return AddBias(axis)(x, b)[0]


class Gemm(Operator):
    """ONNX Gemm: alpha * A' @ B' + beta * C, with A' = A.T when transA, B' = B.T when transB; C broadcasts."""

    def __init__(self, alpha: float = 1.0, beta: float = 1.0, transA: int = 0, transB: int = 0) -> None:
        super().__init__()
        self.alpha = alpha
        self.beta = beta
        self.transA = transA
        self.transB = transB

    def forward(self, A: Tensor, B: Tensor, C: Tensor | None = None) -> Tensor:
        a = ops.transpose(A) if self.transA else A
        b = ops.transpose(B) if self.transB else B
        y = ops.matmul(a, b, alpha=self.alpha)
        if C is not None:
            y = ops.add(y, C if self.beta == 1 else ops.mul(C, self.beta))
            self.c_shape = C.shape
        if training:
            self.input = (a, b)
        return y

    def backward(self, dy: Tensor) -> tuple:
        a, b = self.input
        dA = dB = None
        if self._input_needs_grad(0):  # dA' = alpha * dy @ B'.T; with transA, dA = alpha * B' @ dy.T directly
            dA = ops.matmul(b, _swap(dy), alpha=self.alpha) if self.transA else ops.matmul(dy, _swap(b),
                                                                                           alpha=self.alpha)
        if self._input_needs_grad(1):
            dB = ops.matmul(_swap(dy), a, alpha=self.alpha) if self.transB else ops.matmul(_swap(a), dy,
                                                                                           alpha=self.alpha)
        if not hasattr(self, "c_shape"):
            return dA, dB
        dC = None
        if self._input_needs_grad(2):
            dC = back_broadcast(dy.shape, self.c_shape, dy if self.beta == 1 else ops.mul(dy, self.beta))
        return dA, dB, dC


def gemm(A: Tensor, B: Tensor, C: Tensor | None = None, alpha: float = 1.0, beta: float = 1.0, transA: int = 0,
         transB: int = 0) -> Tensor:
    return Gemm(alpha, beta, transA, transB)(A, B, C)[0]


class CosSim(_Plain):
    """Cosine similarity of a and b along their last axis (row by row for (N, D) inputs)."""

    @classmethod
    def dot(cls, a: Tensor, b: Tensor) -> Tensor:
        return ops.sum(ops.mul(a, b), -1)

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        ab = self.dot(a, b)
        aa = self.dot(a, a)
        bb = self.dot(b, b)
        den = ops.sqrt(ops.mul(aa, bb))
        y = ops.div(ab, den)
        if training:
            self.input = (a, b, y, aa, bb, den)
        return y

    def backward(self, dy: Tensor) -> tuple:
        a, b, y, aa, bb, den = self.input

        def col(t: Tensor) -> Tensor:
            return ops.unsqueeze(t, -1)

        g, yc, dc = col(dy), col(y), col(den)
        # d cos / da = b / (|a||b|) - cos * a / |a|^2
        da = ops.mul(g, ops.sub(ops.div(b, dc), ops.div(ops.mul(yc, a), col(aa))))
        db = ops.mul(g, ops.sub(ops.div(a, dc), ops.div(ops.mul(yc, b), col(bb))))
        return da, db


def cossim(a: Tensor, b: Tensor) -> Tensor:
    return CosSim()(a, b)[0]
