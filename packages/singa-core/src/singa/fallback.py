"""Host fallback: every primitive in numpy, run on a copy of the device data.

A backend that lacks a kernel still works: `Device.table` wraps the function here so that it reads its input views to
the host, computes, and writes its outputs back, warning once per (device, kernel) (`singa.fallback_policy`: or
raising, or silent). These functions are also the
executable form of the contract in `singa.primitives`: each takes host arrays named as the primitive's views, plus its
parameters, and returns {output name: array}.
"""

from __future__ import annotations

import numpy as np

from singa import dtypes, expressions, fallback_policy, primitives

# -- element-wise -----------------------------------------------------------------------------------------------------


def _compute_dtype(x: np.ndarray) -> np.dtype:
    return np.dtype(np.float32) if x.dtype == np.float16 else x.dtype


def elementwise(entry: expressions.Elementwise, out_dtype: np.dtype, *xs: np.ndarray, alpha=0.0, beta=0.0):
    """Evaluate a table entry in numpy; float16 computes in float32 like the backends do."""
    args = [x.astype(_compute_dtype(x)) for x in xs]
    params = {"alpha": alpha, "beta": beta}
    kwargs = {p: params[p] for p in entry.params}
    if args and np.issubdtype(args[0].dtype, np.floating):
        kwargs = {k: args[0].dtype.type(v) for k, v in kwargs.items()}
    with np.errstate(all="ignore"):
        r = entry.ref(*args, **kwargs)
    return np.asarray(r).astype(out_dtype, copy=False)


def _make_elementwise(entry):
    if entry.arity == 1:
        def fn(out, x, alpha=0.0, beta=0.0):
            return {"out": elementwise(entry, out.dtype, x, alpha=alpha, beta=beta)}
    elif entry.takes_params:
        def fn(out, a, b, alpha=0.0, beta=0.0):
            return {"out": elementwise(entry, out.dtype, a, b, alpha=alpha, beta=beta)}
    else:
        def fn(out, a, b):
            return {"out": elementwise(entry, out.dtype, a, b)}
    return fn


# -- memory -------------------------------------------------------------------------------------------------------


def fill(out, value):
    return {"out": np.full(out.shape, value, out.dtype)}


def copy(out, x):
    return {"out": x}


def cast(out, x):
    with np.errstate(all="ignore"):
        if out.dtype == np.bool_:
            return {"out": x != 0}
        if np.issubdtype(out.dtype, np.integer) and np.issubdtype(x.dtype, np.floating):
            return {"out": np.trunc(x).astype(out.dtype)}
        return {"out": x.astype(out.dtype)}


def where(out, cond, a, b):
    return {"out": np.where(cond, a, b)}


# -- reductions ---------------------------------------------------------------------------------------------------


def _acc(x):
    return x.astype(np.float32) if x.dtype == np.float16 else x


def reduce_sum(out, x, axes):
    return {"out": np.sum(_acc(x), axis=tuple(axes))}


def reduce_mean(out, x, axes):
    with np.errstate(all="ignore"):
        n = int(np.prod([x.shape[a] for a in axes])) if axes else 1
        s = np.sum(_acc(x), axis=tuple(axes))
        if np.issubdtype(s.dtype, np.integer):  # integer mean truncates toward zero, like C division
            return {"out": (np.trunc(s / n).astype(s.dtype) if n else np.zeros_like(s))}
        return {"out": s / n if n else np.full(s.shape, np.nan, s.dtype)}


def reduce_max(out, x, axes):
    return {"out": np.max(x, axis=tuple(axes))}


def reduce_min(out, x, axes):
    return {"out": np.min(x, axis=tuple(axes))}


def reduce_prod(out, x, axes):
    return {"out": np.prod(_acc(x), axis=tuple(axes))}


def argmax(out, x, axis):
    return {"out": np.argmax(x, axis=axis)}


def argmin(out, x, axis):
    return {"out": np.argmin(x, axis=axis)}


# -- linear algebra -----------------------------------------------------------------------------------------------


def matmul(out, a, b, trans_a=False, trans_b=False, alpha=1.0, beta=0.0):
    ct = np.float32 if a.dtype == np.float16 else a.dtype
    A = a.astype(ct)
    B = b.astype(ct)
    batch = out.shape[0]  # Ba, Bb of 1 broadcast to the output's batch
    A = np.broadcast_to(A, (batch,) + A.shape[1:])
    B = np.broadcast_to(B, (batch,) + B.shape[1:])
    if trans_a:
        A = A.transpose(0, 2, 1)
    if trans_b:
        B = B.transpose(0, 2, 1)
    r = np.matmul(A, B)
    if alpha != 1.0:
        r = r * alpha
    if beta != 0.0:
        r = r + beta * out.astype(ct)
    return {"out": r}


# -- convolution and pooling --------------------------------------------------------------------------------------


def _out_hw(H, W, kh, kw, stride, padding, dilation):
    oh = (H + padding[0] + padding[2] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (W + padding[1] + padding[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    return oh, ow


def _im2col(x, kh, kw, oh, ow, stride, padding, dilation):
    """(N, C, H, W) -> (N, C, kh, kw, oh, ow), zero padded."""
    N, C, H, W = x.shape
    pad_b = max(padding[2], (oh - 1) * stride[0] + dilation[0] * (kh - 1) + 1 - H - padding[0])
    pad_r = max(padding[3], (ow - 1) * stride[1] + dilation[1] * (kw - 1) + 1 - W - padding[1])
    xp = np.pad(x, ((0, 0), (0, 0), (padding[0], pad_b), (padding[1], pad_r)))
    cols = np.empty((N, C, kh, kw, oh, ow), x.dtype)
    for i in range(kh):
        for j in range(kw):
            hs, ws = i * dilation[0], j * dilation[1]
            cols[:, :, i, j] = xp[:, :, hs:hs + stride[0] * oh:stride[0], ws:ws + stride[1] * ow:stride[1]][:, :, :oh, :ow]
    return cols


def conv2d(out, x, w, b, stride, padding, dilation, groups):
    ct = np.float32 if x.dtype == np.float16 else x.dtype
    x, w = x.astype(ct), w.astype(ct)
    N, C, H, W = x.shape
    K, Cg, kh, kw = w.shape
    oh, ow = out.shape[2], out.shape[3]
    cols = _im2col(x, kh, kw, oh, ow, stride, padding, dilation)
    Kg = K // groups
    y = np.empty((N, K, oh, ow), ct)
    for g in range(groups):
        c = cols[:, g * Cg:(g + 1) * Cg].reshape(N, Cg * kh * kw, oh * ow)
        wg = w[g * Kg:(g + 1) * Kg].reshape(Kg, Cg * kh * kw)
        y[:, g * Kg:(g + 1) * Kg] = np.matmul(wg, c).reshape(N, Kg, oh, ow)
    if b is not None:
        y += b.astype(ct).reshape(1, K, 1, 1)
    return {"out": y}


def conv2d_fused(out, x, w, b, residual, stride, padding, dilation, groups, activation):
    y = conv2d(out, x, w, b, stride, padding, dilation, groups)["out"]
    if residual is not None:
        y += residual.astype(y.dtype)
    if activation == "relu":
        y = np.where(y < 0, 0, y).astype(y.dtype)  # as the relu entry: NaN stays NaN
    return {"out": y}


def conv2d_backward_weight(dw, dy, x, stride, padding, dilation, groups):
    ct = np.float32 if x.dtype == np.float16 else x.dtype
    x, dy = x.astype(ct), dy.astype(ct)
    N = x.shape[0]
    K, Cg, kh, kw = dw.shape
    oh, ow = dy.shape[2], dy.shape[3]
    cols = _im2col(x, kh, kw, oh, ow, stride, padding, dilation)
    Kg = K // groups
    r = np.empty(dw.shape, ct)
    for g in range(groups):
        c = cols[:, g * Cg:(g + 1) * Cg].reshape(N, Cg * kh * kw, oh * ow)
        d = dy[:, g * Kg:(g + 1) * Kg].reshape(N, Kg, oh * ow)
        r[g * Kg:(g + 1) * Kg] = np.einsum("nkp,ncp->kc", d, c).reshape(Kg, Cg, kh, kw)
    return {"dw": r}


def conv2d_backward_data(dx, dy, w, stride, padding, dilation, groups):
    ct = np.float32 if w.dtype == np.float16 else w.dtype
    w, dy = w.astype(ct), dy.astype(ct)
    N, C, H, W = dx.shape
    K, Cg, kh, kw = w.shape
    oh, ow = dy.shape[2], dy.shape[3]
    Kg = K // groups
    Hp = max(H + padding[0] + padding[2], (oh - 1) * stride[0] + dilation[0] * (kh - 1) + 1)
    Wp = max(W + padding[1] + padding[3], (ow - 1) * stride[1] + dilation[1] * (kw - 1) + 1)
    xp = np.zeros((N, C, Hp, Wp), ct)
    for g in range(groups):
        d = dy[:, g * Kg:(g + 1) * Kg].reshape(N, Kg, oh * ow)
        wg = w[g * Kg:(g + 1) * Kg].reshape(Kg, Cg * kh * kw)
        cols = np.matmul(wg.T, d).reshape(N, Cg, kh, kw, oh, ow)
        for i in range(kh):
            for j in range(kw):
                hs, ws = i * dilation[0], j * dilation[1]
                xp[:, g * Cg:(g + 1) * Cg, hs:hs + stride[0] * oh:stride[0], ws:ws + stride[1] * ow:stride[1]] += cols[:, :, i, j]
    return {"dx": xp[:, :, padding[0]:padding[0] + H, padding[1]:padding[1] + W]}


def _pool_windows(H, W, oh, ow, kernel, stride, padding, dilation):
    """Yield (oi, oj, [(h, w) valid positions], count_with_pad) for each output position."""
    for oi in range(oh):
        for oj in range(ow):
            pos, padded = [], 0
            for i in range(kernel[0]):
                h = oi * stride[0] - padding[0] + i * dilation[0]
                for j in range(kernel[1]):
                    w_ = oj * stride[1] - padding[1] + j * dilation[1]
                    if 0 <= h < H and 0 <= w_ < W:
                        pos.append((h, w_))
                        padded += 1
                    elif -padding[0] <= h < H + padding[2] and -padding[1] <= w_ < W + padding[3]:
                        padded += 1
            yield oi, oj, pos, padded


def pool2d(out, indices, x, kernel, stride, padding, dilation, mode, count_include_pad):
    ct = np.float32 if x.dtype == np.float16 else x.dtype
    xc = x.astype(ct)
    N, C, H, W = x.shape
    oh, ow = out.shape[2], out.shape[3]
    y = np.zeros((N, C, oh, ow), ct)
    idx = np.full((N, C, oh, ow), -1, np.int64)
    flat = xc.reshape(N, C, H * W)
    for oi, oj, pos, padded in _pool_windows(H, W, oh, ow, kernel, stride, padding, dilation):
        if not pos:
            continue
        lin = np.array([h * W + w_ for h, w_ in pos])
        vals = flat[:, :, lin]
        if mode == "max":
            k = np.argmax(vals, axis=2)
            y[:, :, oi, oj] = np.take_along_axis(vals, k[..., None], 2)[..., 0]
            idx[:, :, oi, oj] = lin[k]
        else:
            div = padded if count_include_pad else len(pos)
            y[:, :, oi, oj] = vals.sum(axis=2) / div
    res = {"out": y}
    if indices is not None:
        res["indices"] = idx
    return res


def pool2d_backward(dx, dy, x, indices, kernel, stride, padding, dilation, mode, count_include_pad):
    ct = np.float32 if dy.dtype == np.float16 else dy.dtype
    N, C, H, W = dx.shape
    oh, ow = dy.shape[2], dy.shape[3]
    g = np.zeros((N, C, H * W), ct)
    d = dy.astype(ct)
    if mode == "max":
        if indices is None:
            indices = pool2d(dy, np.empty(dy.shape, np.int64), x, kernel, stride, padding, dilation, mode,
                             count_include_pad)["indices"]
        nn, cc = np.meshgrid(np.arange(N), np.arange(C), indexing="ij")
        for oi in range(oh):
            for oj in range(ow):
                k = indices[:, :, oi, oj]
                valid = k >= 0
                np.add.at(g, (nn[valid], cc[valid], k[valid]), d[:, :, oi, oj][valid])
    else:
        for oi, oj, pos, padded in _pool_windows(H, W, oh, ow, kernel, stride, padding, dilation):
            if not pos:
                continue
            div = padded if count_include_pad else len(pos)
            for h, w_ in pos:
                g[:, :, h * W + w_] += d[:, :, oi, oj] / div
    return {"dx": g.reshape(N, C, H, W)}


# -- normalisation, softmax, losses -------------------------------------------------------------------------------


def _bn_axes(x):
    return (0,) + tuple(range(2, x.ndim))


def _bc(v, x):
    return v.reshape((1, -1) + (1,) * (x.ndim - 2))


def batchnorm_train(y, running_mean, running_var, saved_mean, saved_invstd, x, scale, bias, momentum, eps):
    ct = np.float32 if x.dtype == np.float16 else x.dtype
    xc = x.astype(ct)
    axes = _bn_axes(x)
    m = int(np.prod([x.shape[a] for a in axes]))
    mean = xc.mean(axis=axes)
    var = xc.var(axis=axes)
    invstd = 1.0 / np.sqrt(var + eps)
    out = (xc - _bc(mean, x)) * _bc(invstd * scale.astype(ct), x) + _bc(bias.astype(ct), x)
    unbiased = var * m / max(m - 1, 1)
    return {
        "y": out,
        "running_mean": momentum * running_mean + (1 - momentum) * mean,
        "running_var": momentum * running_var + (1 - momentum) * unbiased,
        "saved_mean": mean,
        "saved_invstd": invstd,
    }


def batchnorm_infer(y, x, scale, bias, mean, var, eps):
    ct = np.float32 if x.dtype == np.float16 else x.dtype
    xc = x.astype(ct)
    inv = 1.0 / np.sqrt(var.astype(ct) + eps)
    return {"y": (xc - _bc(mean.astype(ct), x)) * _bc(inv * scale.astype(ct), x) + _bc(bias.astype(ct), x)}


def batchnorm_apply(y, x, scale, bias, saved_mean, saved_invstd, activation="none"):
    ct = np.float32 if x.dtype == np.float16 else x.dtype
    xc = x.astype(ct)
    out = (xc - _bc(saved_mean.astype(ct), x)) * _bc(saved_invstd.astype(ct) * scale.astype(ct), x) + _bc(
        bias.astype(ct), x)
    return {"y": np.where(out < 0, 0, out) if activation == "relu" else out}


def batchnorm_backward(dx, dscale, dbias, dy, x, scale, saved_mean, saved_invstd):
    ct = np.float32 if x.dtype == np.float16 else x.dtype
    xc, d = x.astype(ct), dy.astype(ct)
    axes = _bn_axes(x)
    m = int(np.prod([x.shape[a] for a in axes]))
    xhat = (xc - _bc(saved_mean, x)) * _bc(saved_invstd, x)
    db = d.sum(axis=axes)
    ds = (d * xhat).sum(axis=axes)
    g = _bc(scale.astype(ct) * saved_invstd, x) / m * (m * d - _bc(db, x) - xhat * _bc(ds, x))
    return {"dx": g, "dscale": ds, "dbias": db}


def layer_norm(y, mean, invstd, x, scale, bias, eps):
    ct = np.float32 if x.dtype == np.float16 else x.dtype
    xc = x.astype(ct)
    m = xc.mean(axis=1, keepdims=True)
    d = xc - m
    inv = 1.0 / np.sqrt((d * d).mean(axis=1, keepdims=True) + np.dtype(ct).type(eps))
    out = d * inv
    if scale is not None:
        out = out * scale.astype(ct)
    if bias is not None:
        out = out + bias.astype(ct)
    return {"y": out, "mean": m[:, 0], "invstd": inv[:, 0]}


def softmax(out, x, axis):
    xc = _acc(x)
    e = np.exp(xc - np.max(xc, axis=axis, keepdims=True)) if x.size else xc
    return {"out": e / np.sum(e, axis=axis, keepdims=True) if x.size else e}


def log_softmax(out, x, axis):
    xc = _acc(x)
    if not x.size:
        return {"out": xc}
    z = xc - np.max(xc, axis=axis, keepdims=True)
    return {"out": z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))}


def softmax_backward(dx, dy, y, axis):
    d, yy = _acc(dy), _acc(y)
    return {"dx": yy * (d - np.sum(d * yy, axis=axis, keepdims=True))}


def log_softmax_backward(dx, dy, y, axis):
    d, yy = _acc(dy), _acc(y)
    return {"dx": d - np.exp(yy) * np.sum(d, axis=axis, keepdims=True)}


def _targets(x, target):
    if np.issubdtype(target.dtype, np.integer):
        labels = target.reshape(-1)
        bad = (labels < 0) | (labels >= x.shape[1])  # numpy would wrap -1 to the last class
        if bad.any():
            i = int(np.argmax(bad))
            raise IndexError(f"softmax_cross_entropy: label {labels[i]} at position {i} is outside [0, {x.shape[1]})")
        t = np.zeros(x.shape, np.float64)
        if x.shape[0]:
            t[np.arange(x.shape[0]), labels] = 1.0
        return t
    return target.astype(np.float64)


def softmax_cross_entropy(loss, x, target):
    logp = log_softmax(None, x.astype(np.float64), 1)["out"]
    return {"loss": -np.sum(_targets(x, target) * logp, axis=1)}


def softmax_cross_entropy_backward(dx, dloss, x, target):
    p = softmax(None, x.astype(np.float64), 1)["out"]
    t = _targets(x, target)
    return {"dx": (p * t.sum(axis=1, keepdims=True) - t) * dloss.astype(np.float64)[:, None]}


# -- indexing -----------------------------------------------------------------------------------------------------


def _check_indices(indices, n, axis):
    if indices.size and (indices.min() < -n or indices.max() >= n):
        raise IndexError(f"gather: index out of range [{-n}, {n}) on axis {axis}: "
                         f"min {indices.min()}, max {indices.max()}")


def gather(out, x, indices, axis):
    _check_indices(indices, x.shape[axis], axis)
    return {"out": np.take(x, indices.astype(np.int64), axis=axis)}


def scatter_add(out, indices, updates, axis):
    n = out.shape[axis]
    _check_indices(indices, n, axis)
    r = out.copy()
    idx = np.where(indices < 0, indices + n, indices).astype(np.int64).reshape(-1)
    moved = np.moveaxis(r, axis, 0)
    upd = updates.reshape(out.shape[:axis] + (idx.size,) + out.shape[axis + 1:])
    np.add.at(moved, idx, np.moveaxis(upd, axis, 0))
    return {"out": r}


def pad(out, x, pads, mode, value=0.0):
    nd = x.ndim
    if nd == 0:  # nothing to pad; numpy rejects an empty pad list
        return {"out": x.copy()}
    width = [(pads[i], pads[i + nd]) for i in range(nd)]
    if mode == "constant":
        return {"out": np.pad(x, width, mode="constant", constant_values=value)}
    return {"out": np.pad(x, width, mode={"reflect": "reflect", "edge": "edge"}[mode])}


# -- optimizer updates -----------------------------------------------------------------------------------------------

def sgd_momentum(w, buf, g, lr, momentum):
    ct = np.float32 if w.dtype == np.float16 else w.dtype
    b = (momentum * buf.astype(ct) + g.astype(ct)).astype(buf.dtype)
    return {"buf": b, "w": w.astype(ct) - lr * b.astype(ct)}


# -- random numbers: Philox4x32-10 (see primitives.PHILOX_DOC) ----------------------------------------------------

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)


def philox_u32(seed: int, offset: int, n: int) -> np.ndarray:
    """The generator's 32-bit draws offset .. offset+n-1."""
    if n == 0:
        return np.empty(0, np.uint32)
    first, last = offset // 4, (offset + n - 1) // 4
    ctr = np.arange(first, last + 1, dtype=np.uint64)
    c0 = (ctr & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    c1 = (ctr >> np.uint64(32)).astype(np.uint32)
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    k0 = np.uint32(seed & 0xFFFFFFFF)
    k1 = np.uint32((seed >> 32) & 0xFFFFFFFF)
    with np.errstate(over="ignore"):
        for _ in range(10):
            p0 = c0.astype(np.uint64) * _M0
            p1 = c2.astype(np.uint64) * _M1
            hi0, lo0 = (p0 >> np.uint64(32)).astype(np.uint32), (p0 & np.uint64(0xFFFFFFFF)).astype(np.uint32)
            hi1, lo1 = (p1 >> np.uint64(32)).astype(np.uint32), (p1 & np.uint64(0xFFFFFFFF)).astype(np.uint32)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
            k0 = np.uint32(k0 + _W0)
            k1 = np.uint32(k1 + _W1)
    words = np.stack([c0, c1, c2, c3], axis=1).reshape(-1)
    start = offset - first * 4
    return words[start:start + n]


def philox_uniform(seed: int, offset: int, n: int) -> np.ndarray:
    return (philox_u32(seed, offset, n) >> np.uint32(8)).astype(np.float64) * 2.0 ** -24


def random_uniform(out, low, high, seed, offset):
    u = philox_uniform(seed, offset, out.size)
    return {"out": (low + (high - low) * u).reshape(out.shape)}


def random_normal(out, mean, std, seed, offset):
    u = philox_uniform(seed, offset, 2 * out.size)
    r = np.sqrt(-2.0 * np.log(1.0 - u[0::2])) * np.cos(2.0 * np.pi * u[1::2])
    return {"out": (mean + std * r).reshape(out.shape)}


def random_bernoulli(out, p, seed, offset):
    u = philox_uniform(seed, offset, out.size)
    return {"out": (u < p).reshape(out.shape)}


# -- the wrapper that runs these on device data -------------------------------------------------------------------

IMPL = {name: _make_elementwise(e) for name, e in expressions.TABLE.items()}
IMPL.update({p.name: globals()[p.name] for p in primitives.SPECIAL})


class _HostSpec:
    """A stand-in for an output view on the host: the shape and numpy dtype the function must produce."""

    __slots__ = ("shape", "dtype", "size")

    def __init__(self, view):
        self.shape = view.shape
        self.dtype = dtypes.to_numpy_dtype(view.dtype)
        self.size = int(np.prod(view.shape, dtype=np.int64))

    def astype(self, dt):  # only reached when an output is read without being declared in-place
        raise TypeError("output view read by a fallback kernel that does not declare it in-place")


def run_on_host(fn, spec: primitives.Primitive | None, device, args: tuple, params: dict) -> None:
    """Read `args` views to the host, call `fn`, write its outputs back to the views named by the result."""
    if spec is None:  # element-wise: (out, x) or (out, a, b)
        out_names, in_names, inplace = ("out",), (("x",) if len(args) == 2 else ("a", "b")), ()
    else:
        out_names, in_names, inplace = spec.outputs, spec.inputs, spec.inplace
    names = [n.rstrip("?") for n in out_names + in_names]
    host = {}
    views = {}
    for n, v in zip(names, args):
        views[n] = v
        if v is None:
            host[n] = None
        elif n in in_names or n in inplace or n + "?" in in_names:
            host[n] = device.read(v)
        else:
            host[n] = _HostSpec(v)
    result = fn(**host, **params)
    for n, arr in result.items():
        view = views.get(n)
        if view is None:
            continue
        arr = np.asarray(arr)
        npdt = dtypes.to_numpy_dtype(view.dtype)
        if arr.shape != view.shape:
            arr = arr.reshape(view.shape)
        with np.errstate(all="ignore"):
            device.write_strided(view, arr.astype(npdt, copy=False))


def make(device, name: str):
    """A kernel for `device` that runs primitive `name` on the host, warning once."""
    fn = IMPL[name]
    spec = primitives.SPECIAL_BY_NAME.get(name)

    def kernel(*args, **params):
        fallback_policy.report(device.name, device.backend_name, name)
        run_on_host(fn, spec, device, args, params)

    kernel.is_fallback = True
    kernel.__name__ = f"fallback_{name}"
    return kernel
