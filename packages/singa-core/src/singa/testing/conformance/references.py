"""Float64 references of the conformance suite, written from the definitions in singa.primitives.

Deliberately independent of singa.fallback (which is itself under test whenever a backend lacks a kernel): direct
summation over output positions and kernel taps for convolution and pooling, textbook formulas elsewhere, and
Philox4x32-10 rebuilt from PHILOX_DOC.
"""

from __future__ import annotations

import math

import numpy as np

# -- convolution and pooling ------------------------------------------------------------------------------------------


def conv_out_hw(H_, W, kh, kw, stride, padding, dilation):
    oh = (H_ + padding[0] + padding[2] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (W + padding[1] + padding[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    return oh, ow


def _taps(oh, ow, kh, kw, H_, W, stride, padding, dilation):
    """Every (output row, output col, tap row, tap col, input row, input col) that reads inside the input."""
    for p in range(oh):
        for i in range(kh):
            h = p * stride[0] - padding[0] + i * dilation[0]
            if not 0 <= h < H_:
                continue
            for q in range(ow):
                for j in range(kw):
                    v = q * stride[1] - padding[1] + j * dilation[1]
                    if 0 <= v < W:
                        yield p, q, i, j, h, v


def conv_ref(x, w, b, oh, ow, stride, padding, dilation, groups):
    x, w = x.astype(np.float64), w.astype(np.float64)
    N, _, H_, W = x.shape
    K, Cg, kh, kw = w.shape
    Kg = K // groups
    y = np.zeros((N, K, oh, ow))
    for g in range(groups):
        ks, cs = slice(g * Kg, (g + 1) * Kg), slice(g * Cg, (g + 1) * Cg)
        for p, q, i, j, h, v in _taps(oh, ow, kh, kw, H_, W, stride, padding, dilation):
            y[:, ks, p, q] += x[:, cs, h, v] @ w[ks, :, i, j].T
    if b is not None:
        y += b.astype(np.float64).reshape(1, K, 1, 1)
    return y


def conv_backward_data_ref(dy, w, x_shape, stride, padding, dilation, groups):
    dy, w = dy.astype(np.float64), w.astype(np.float64)
    H_, W = x_shape[2:]
    K, Cg, kh, kw = w.shape
    Kg = K // groups
    dx = np.zeros(x_shape)
    for g in range(groups):
        ks, cs = slice(g * Kg, (g + 1) * Kg), slice(g * Cg, (g + 1) * Cg)
        for p, q, i, j, h, v in _taps(dy.shape[2], dy.shape[3], kh, kw, H_, W, stride, padding, dilation):
            dx[:, cs, h, v] += dy[:, ks, p, q] @ w[ks, :, i, j]
    return dx


def conv_backward_weight_ref(dy, x, w_shape, stride, padding, dilation, groups):
    dy, x = dy.astype(np.float64), x.astype(np.float64)
    H_, W = x.shape[2:]
    K, Cg, kh, kw = w_shape
    Kg = K // groups
    dw = np.zeros(w_shape)
    for g in range(groups):
        ks, cs = slice(g * Kg, (g + 1) * Kg), slice(g * Cg, (g + 1) * Cg)
        for p, q, i, j, h, v in _taps(dy.shape[2], dy.shape[3], kh, kw, H_, W, stride, padding, dilation):
            dw[ks, :, i, j] += dy[:, ks, p, q].T @ x[:, cs, h, v]
    return dw


def _window(p, q, kernel, stride, padding, dilation, H_, W):
    """(flat indices inside the input in window order, number of taps inside input or declared padding)."""
    inside, counted = [], 0
    for i in range(kernel[0]):
        h = p * stride[0] - padding[0] + i * dilation[0]
        for j in range(kernel[1]):
            v = q * stride[1] - padding[1] + j * dilation[1]
            if 0 <= h < H_ and 0 <= v < W:
                inside.append(h * W + v)
            if -padding[0] <= h < H_ + padding[2] and -padding[1] <= v < W + padding[3]:
                counted += 1
    return inside, counted


def pool_ref(x, oh, ow, kernel, stride, padding, dilation, mode, count_include_pad):
    """(out, indices) in float64 / int64 by direct evaluation of every window."""
    N, C, H_, W = x.shape
    flat = x.astype(np.float64).reshape(N, C, H_ * W)
    y = np.zeros((N, C, oh, ow))
    idx = np.full((N, C, oh, ow), -1, np.int64)
    for p in range(oh):
        for q in range(ow):
            inside, counted = _window(p, q, kernel, stride, padding, dilation, H_, W)
            if not inside:
                continue
            vals = flat[:, :, inside]
            if mode == "max":
                best = np.argmax(vals, axis=2)  # first in window order among equals
                y[:, :, p, q] = np.take_along_axis(vals, best[..., None], 2)[..., 0]
                idx[:, :, p, q] = np.asarray(inside)[best]
            else:
                y[:, :, p, q] = vals.sum(axis=2) / (counted if count_include_pad else len(inside))
    return y, idx


def pool_backward_ref(dy, x_shape, idx, kernel, stride, padding, dilation, mode, count_include_pad):
    """dx of pool2d: max sends dy to the recorded winners (idx, -1 for none), avg spreads it over each window."""
    N, C, H_, W = x_shape
    dx = np.zeros((N * C, H_ * W))
    d = dy.astype(np.float64).reshape(N * C, -1)
    if mode == "max":
        win = idx.reshape(N * C, -1)
        rows = np.broadcast_to(np.arange(N * C)[:, None], win.shape)
        valid = win >= 0
        np.add.at(dx, (rows[valid], win[valid]), d[valid])  # windows overlap: a winner can collect several
        return dx.reshape(x_shape)
    ow = dy.shape[3]
    for p in range(dy.shape[2]):
        for q in range(ow):
            inside, counted = _window(p, q, kernel, stride, padding, dilation, H_, W)
            for k in inside:
                dx[:, k] += d[:, p * ow + q] / (counted if count_include_pad else len(inside))
    return dx.reshape(x_shape)


def pool_out_hw(H_, W, kernel, stride, padding, dilation, ceil):
    out = []
    for size, k, s, lo, hi, d in ((H_, kernel[0], stride[0], padding[0], padding[2], dilation[0]),
                                  (W, kernel[1], stride[1], padding[1], padding[3], dilation[1])):
        span = size + lo + hi - d * (k - 1) - 1
        out.append((-(-span // s) if ceil else span // s) + 1)
    return tuple(out)


# -- gradients, batch normalisation, softmax ------------------------------------------------------------------------


def numeric_grad(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar function f at x (float64)."""
    x = x.astype(np.float64)
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        hi, lo = x.copy(), x.copy()
        hi[idx] += eps
        lo[idx] -= eps
        g[idx] = (f(hi) - f(lo)) / (2 * eps)
    return g


def bn_axes(x):
    return (0,) + tuple(range(2, x.ndim))


def per_channel(v, x):
    return np.asarray(v, np.float64).reshape((1, -1) + (1,) * (x.ndim - 2))


def bn_forward(x, scale, bias, eps):
    axes = bn_axes(x)
    mean = x.mean(axis=axes)
    var = ((x - per_channel(mean, x)) ** 2).mean(axis=axes)
    invstd = 1 / np.sqrt(var + eps)
    y = (x - per_channel(mean, x)) * per_channel(invstd, x) * per_channel(scale, x) + per_channel(bias, x)
    return y, mean, var, invstd


def bn_backward_ref(dy, x, scale, mean, invstd):
    """Closed-form training-mode gradients (dx, dscale, dbias) given the saved statistics, each with its magnitude:
    the same sums over the absolute values of their terms (the gradients cancel to nearly nothing where dy is
    uncorrelated with x)."""
    axes = bn_axes(x)
    m = x.size // x.shape[1]
    xhat = (x - per_channel(mean, x)) * per_channel(invstd, x)
    db, db_mag = dy.sum(axis=axes), np.abs(dy).sum(axis=axes)
    ds, ds_mag = (dy * xhat).sum(axis=axes), np.abs(dy * xhat).sum(axis=axes)
    k = per_channel(np.asarray(scale, np.float64) * invstd, x) / m
    dx = k * (m * dy - per_channel(db, x) - xhat * per_channel(ds, x))
    dx_mag = np.abs(k) * (m * np.abs(dy) + per_channel(db_mag, x) + np.abs(xhat) * per_channel(ds_mag, x))
    return (dx, dx_mag), (ds, ds_mag), (db, db_mag)


def softmax_ref(x, axis):
    z = x - x.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax_ref(x, axis):
    z = x - x.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def onehot(t, C):
    if t.ndim == 2:
        return t.astype(np.float64)
    o = np.zeros((t.size, C))
    o[np.arange(t.size), t] = 1
    return o


def sce_ref(x, t):
    return -(onehot(t, x.shape[1]) * log_softmax_ref(x, 1)).sum(axis=1)


# -- random numbers: Philox4x32-10 (singa.primitives.PHILOX_DOC) ------------------------------------------------------


MASK32 = 0xFFFFFFFF
PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)


def philox4x32_10(counter, key):
    """One Philox4x32 block, 10 rounds, in plain Python integers (Salmon et al., SC'11)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = (k0 + PHILOX_W[0]) & MASK32, (k1 + PHILOX_W[1]) & MASK32
        p0, p1 = PHILOX_M[0] * c0, PHILOX_M[1] * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK32
    return c0, c1, c2, c3


def draws_u32(seed: int, offset: int, n: int) -> list[int]:
    """Draws offset .. offset+n-1 of stream `seed`, as the document defines them."""
    key = (seed & MASK32, (seed >> 32) & MASK32)
    out, block, words = [], None, None
    for c in range(offset, offset + n):
        if c // 4 != block:
            block = c // 4
            words = philox4x32_10((block & MASK32, block >> 32, 0, 0), key)
        out.append(words[c % 4])
    return out


def draws_uniform(seed: int, offset: int, n: int) -> np.ndarray:
    return np.array([(r >> 8) * 2.0 ** -24 for r in draws_u32(seed, offset, n)], np.float64)


# Random123's kat_vectors for philox4x32_10: (counter, key, output)
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((MASK32,) * 4, (MASK32, MASK32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def normal_reference(seed, offset, n, mean, std):
    u = draws_uniform(seed, offset, 2 * n)
    return np.array([mean + std * math.sqrt(-2 * math.log(1 - u[2 * i])) * math.cos(2 * math.pi * u[2 * i + 1])
                     for i in range(n)])


def draws_uniform_fast(seed: int, offset: int, n: int) -> np.ndarray:
    """draws_uniform for large n: the same rounds on numpy uint64 columns (checked against the scalar version)."""
    if n == 0:
        return np.zeros(0)
    first, last = offset // 4, (offset + n - 1) // 4
    blocks = np.arange(first, last + 1, dtype=np.uint64)
    m32 = np.uint64(MASK32)
    c = [blocks & m32, blocks >> np.uint64(32), np.zeros_like(blocks), np.zeros_like(blocks)]
    k0, k1 = seed & MASK32, (seed >> 32) & MASK32
    for r in range(10):
        if r:
            k0, k1 = (k0 + PHILOX_W[0]) & MASK32, (k1 + PHILOX_W[1]) & MASK32
        p0, p1 = c[0] * np.uint64(PHILOX_M[0]), c[2] * np.uint64(PHILOX_M[1])  # < 2**64: no wrap
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0), p1 & m32, (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1),
             p0 & m32]
    words = np.stack(c, axis=1).reshape(-1)[offset - 4 * first:][:n]
    return (words >> np.uint64(8)).astype(np.float64) * 2.0 ** -24
