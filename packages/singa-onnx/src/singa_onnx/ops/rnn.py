"""RNN, GRU and LSTM (every attribute: directions, activations with alpha/beta, clip, peepholes, sequence_lens,
layout), unrolled over time with autograd operators: the input projection of all time steps is one matrix product."""

from __future__ import annotations

import numpy as np

from singa import autograd, ops
from singa import dtypes as sdt
from singa.tensor import Tensor
from singa_onnx.ops._common import const_like, host, host_to_tensor, inputs_as_tensors
from singa_onnx.registry import register


def _activation(name: str, alpha: float | None, beta: float | None):
    n = name.lower()

    def c(x, v):
        return const_like(x, v)

    if n == "sigmoid":
        return autograd.sigmoid
    if n == "tanh":
        return autograd.tanh
    if n == "relu":
        return autograd.relu
    if n == "affine":
        return lambda x: autograd.add(autograd.mul(x, c(x, alpha)), c(x, beta))
    if n == "leakyrelu":
        return lambda x: autograd.leakyrelu(x, 0.01 if alpha is None else alpha)
    if n == "thresholdedrelu":
        a = 1.0 if alpha is None else alpha
        return lambda x: autograd.where(x, ops.full(x.shape, 0, x.dtype, x.device), ops.gt(x, a))
    if n == "scaledtanh":
        return lambda x: autograd.mul(autograd.tanh(autograd.mul(x, c(x, beta))), c(x, alpha))
    if n == "hardsigmoid":
        return lambda x: autograd.hardsigmoid(x, 0.2 if alpha is None else alpha, 0.5 if beta is None else beta)
    if n == "elu":
        return lambda x: autograd.elu(x, 1.0 if alpha is None else alpha)
    if n == "softsign":
        return autograd.softsign
    if n == "softplus":
        return autograd.softplus
    raise ValueError(f"unknown RNN activation {name!r}")


def _activations(node, defaults: list[str], num_dir: int) -> list[list]:
    names = node.attr("activations") or defaults * num_dir
    alphas = list(node.attr("activation_alpha") or [])
    betas = list(node.attr("activation_beta") or [])
    fns = []
    for i, n in enumerate(names):
        fns.append(_activation(n, alphas[i] if i < len(alphas) else None, betas[i] if i < len(betas) else None))
    k = len(defaults)
    if len(fns) == k and num_dir == 2:
        fns = fns * 2
    return [fns[d * k:(d + 1) * k] for d in range(num_dir)]


def _row(t: Tensor, d: int) -> Tensor:
    """t[d] of a (num_dir, ...) tensor, keeping the gradient."""
    return autograd.reshape(autograd.slice(t, [d], [d + 1], [0]), list(t.shape[1:]))


def _cols(t: Tensor, k: int, h: int) -> Tensor:
    """Gate k's block of h columns of a (..., G*h) tensor."""
    return autograd.slice(t, [k * h], [(k + 1) * h], [len(t.shape) - 1])


def _run_rnn(node, inputs, kind: str):
    X, W, R = inputs_as_tensors(node, inputs[:3])
    B = inputs[3] if len(inputs) > 3 else None
    seq_lens = inputs[4] if len(inputs) > 4 else None
    h0 = inputs[5] if len(inputs) > 5 else None
    c0 = inputs[6] if len(inputs) > 6 else None
    P = inputs[7] if len(inputs) > 7 else None
    hidden = node.attr("hidden_size") or R.shape[-1]
    direction = node.attr("direction", "forward")
    num_dir = 2 if direction == "bidirectional" else 1
    layout = node.attr("layout", 0)
    clip = node.attr("clip")
    if layout:
        X = autograd.transpose(X, [1, 0, 2])
    T, N, _ = X.shape
    G = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    defaults = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}[kind]
    acts = _activations(node, defaults, num_dir)
    dev, dt = X.device, X.dtype
    lens = host(seq_lens).astype(np.int64) if seq_lens is not None else None
    masks = None
    if lens is not None and (lens < T).any():
        masks = [host_to_tensor((t < lens).reshape(N, 1), dev, sdt.bool_) for t in range(T)]
    ys, hs, cs = [], [], []
    for d in range(num_dir):
        Wd, Rd = _row(W, d), _row(R, d)  # (G*h, in), (G*h, h)
        # input projections of every step at once: (T*N, in) @ (in, G*h)
        xw = autograd.matmul(autograd.reshape(X, [T * N, X.shape[2]]), autograd.transpose(Wd, [1, 0]))
        if B is not None:
            Bd = _row(inputs_as_tensors(node, [B], dt, first_slot=3)[0], d)
            wb = autograd.slice(Bd, [0], [G * hidden], [0])
            rb = autograd.slice(Bd, [G * hidden], [2 * G * hidden], [0])
            xw = autograd.add(xw, wb)
        else:
            rb = None
        xw = autograd.reshape(xw, [T, N, G * hidden])
        h = ops.full((N, hidden), 0, dt, dev)
        if h0 is not None:
            h = _row(inputs_as_tensors(node, [h0], dt, first_slot=5)[0], d)
        c = None
        if kind == "LSTM":
            c = ops.full((N, hidden), 0, dt, dev)
            if c0 is not None:
                c = _row(inputs_as_tensors(node, [c0], dt, first_slot=6)[0], d)
        peep = None
        if kind == "LSTM" and P is not None:
            peep = _row(inputs_as_tensors(node, [P], dt, first_slot=7)[0], d)
        f = acts[d]
        reverse = direction == "reverse" or d == 1
        steps = range(T - 1, -1, -1) if reverse else range(T)
        outs: dict[int, Tensor] = {}
        Rt = autograd.transpose(Rd, [1, 0])  # (h, G*h)

        def clipped(z):
            return autograd.clip(z, -clip, clip) if clip is not None else z

        for t in steps:
            xt = autograd.reshape(autograd.slice(xw, [t], [t + 1], [0]), [N, G * hidden])
            if kind == "RNN":
                z = autograd.add(xt, autograd.matmul(h, Rt))
                if rb is not None:
                    z = autograd.add(z, rb)
                h_new = f[0](clipped(z))
                c_new = None
            elif kind == "GRU":
                hr = autograd.matmul(h, Rt)  # (N, 3h) with the z, r, h blocks
                rbs = [None] * 3 if rb is None else [_cols(rb, k, hidden) for k in range(3)]

                def gate(k, extra=None, xt=xt, hr=hr, rbs=rbs):
                    z = autograd.add(_cols(xt, k, hidden), _cols(hr, k, hidden) if extra is None else extra)
                    return z if rbs[k] is None or extra is not None else autograd.add(z, rbs[k])

                zt = f[0](clipped(gate(0)))
                rt = f[0](clipped(gate(1)))
                Rh = autograd.slice(Rt, [2 * hidden], [3 * hidden], [1])
                if node.attr("linear_before_reset", 0):
                    lin = autograd.matmul(h, Rh)
                    if rbs[2] is not None:
                        lin = autograd.add(lin, rbs[2])
                    pre = autograd.add(_cols(xt, 2, hidden), autograd.mul(rt, lin))
                else:
                    pre = autograd.add(_cols(xt, 2, hidden), autograd.matmul(autograd.mul(rt, h), Rh))
                    if rbs[2] is not None:
                        pre = autograd.add(pre, rbs[2])
                ht = f[1](clipped(pre))
                one = const_like(zt, 1.0)
                h_new = autograd.add(autograd.mul(autograd.sub(one, zt), ht), autograd.mul(zt, h))
                c_new = None
            else:
                z = autograd.add(xt, autograd.matmul(h, Rt))
                if rb is not None:
                    z = autograd.add(z, rb)
                zi, zo, zf, zc = (_cols(z, k, hidden) for k in range(4))
                if peep is not None:
                    pi, po, pf = (autograd.slice(peep, [k * hidden], [(k + 1) * hidden], [0]) for k in range(3))
                    zi = autograd.add(zi, autograd.mul(pi, c))
                    zf = autograd.add(zf, autograd.mul(pf, c))
                it = f[0](clipped(zi))
                ft = f[0](clipped(zf))
                if node.attr("input_forget", 0):
                    ft = autograd.sub(const_like(it, 1.0), it)
                ct = f[1](clipped(zc))
                c_new = autograd.add(autograd.mul(ft, c), autograd.mul(it, ct))
                if peep is not None:
                    zo = autograd.add(zo, autograd.mul(po, c_new))
                ot = f[0](clipped(zo))
                h_new = autograd.mul(ot, f[2](c_new))
            if masks is not None:
                m = masks[t]
                outs[t] = autograd.where(h_new, ops.full(h_new.shape, 0, dt, dev), m)
                h = autograd.where(h_new, h, m)
                if c_new is not None:
                    c = autograd.where(c_new, c, m)
            else:
                outs[t] = h_new
                h = h_new
                if c_new is not None:
                    c = c_new
        ys.append(autograd.cat([autograd.unsqueeze(outs[t], [0]) for t in range(T)], 0) if T > 1 else
                  autograd.unsqueeze(outs[0], [0]))
        hs.append(h)
        cs.append(c)
    Y = autograd.cat([autograd.unsqueeze(y, [1]) for y in ys], 1) if num_dir > 1 else autograd.unsqueeze(ys[0], [1])
    Yh = autograd.cat([autograd.unsqueeze(h, [0]) for h in hs], 0) if num_dir > 1 else autograd.unsqueeze(hs[0], [0])
    if layout:
        Y = autograd.transpose(Y, [2, 0, 1, 3])
        Yh = autograd.transpose(Yh, [1, 0, 2])
    outs = [Y, Yh]
    if kind == "LSTM":
        Yc = autograd.cat([autograd.unsqueeze(c, [0]) for c in cs], 0) if num_dir > 1 else autograd.unsqueeze(
            cs[0], [0])
        outs.append(autograd.transpose(Yc, [1, 0, 2]) if layout else Yc)
    return tuple(outs)


@register("RNN")
def rnn(node, inputs, opset):
    return _run_rnn(node, inputs, "RNN")


@register("GRU")
def gru(node, inputs, opset):
    return _run_rnn(node, inputs, "GRU")


@register("LSTM")
def lstm(node, inputs, opset):
    return _run_rnn(node, inputs, "LSTM")
