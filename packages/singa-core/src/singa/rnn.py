"""A multi-layer RNN over one flat weight tensor: what SINGA's `layer.CudnnRNN` computes, in cuDNN's terms.

`RNNSpec` fixes the recurrence: mode ('tanh' or 'relu' Elman cells, 'lstm', 'gru'), sizes, layers, directions, bias.
The weights live in one 1-D tensor `W`, laid out as cuDNN's canonical weight space (PyTorch's flattened RNN weights
use the same layout): for each layer, for each direction (forward first),

    w_ih (G*H, in_l)   w_hh (G*H, H)   b_ih (G*H)   b_hh (G*H)      (biases only when bias=True)

row-major, with in_l the input size for layer 0 and D*H above, and the G gate blocks in cuDNN's order: LSTM
(input, forget, cell, output), GRU (reset, update, new), one block for Elman cells. The cells are cuDNN's:

    Elman   h' = act(W x + b_W + R h + b_R)
    LSTM    i, f, g, o = sigma, sigma, tanh, sigma of (W x + b_W + R h + b_R) per block
            c' = f c + i g;  h' = o tanh(c')
    GRU     r, z = sigma(W_r x + b_Wr + R_r h + b_Rr), sigma(...);  n = tanh(W_n x + b_Wn + r (R_n h + b_Rn))
            h' = (1 - z) n + z h

`forward(spec, x, hx, cx, W, seq_lengths)` builds the sequence from autograd operators (so autograd differentiates
it and it runs on any device): x is (T, B, input), hx and cx (L*D, B, H); it returns y (T, B, D*H) and the final
hy, cy. With `seq_lengths` (B,), sample b's steps from seq_lengths[b] on are padding: its states stop there (the
reverse direction starts at its last valid step) and its outputs there are zeros, as cuDNN's padded layout.

A backend with a fused RNN (cuDNN on the CUDA backend) plugs in through `Device.rnn_operator(spec, seq_lengths)`:
it returns an autograd Operator called as `op(x, hx, cx, W)` that computes (y, hy, cy) exactly as `forward` does,
with this layout (cx is zeros for modes other than LSTM; its gradient is then ignored), and whose backward returns
(dx, dhx, dcx, dW). The base Device returns None, meaning this generic path. The conformance suite compares a
backend's fused operator with this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from singa import autograd
from singa.tensor import Tensor

__all__ = ["RNNSpec", "MODES", "forward", "last_step"]

MODES = {"tanh": 1, "relu": 1, "lstm": 4, "gru": 3}  # mode -> gate blocks


@dataclass(frozen=True)
class RNNSpec:
    mode: str
    input_size: int
    hidden_size: int
    num_layers: int = 1
    bidirectional: bool = False
    bias: bool = True
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"RNN mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if min(self.input_size, self.hidden_size, self.num_layers) < 1:
            raise ValueError(f"RNN sizes must be positive: input_size {self.input_size}, hidden_size "
                             f"{self.hidden_size}, num_layers {self.num_layers}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"RNN dropout must be in [0, 1), got {self.dropout}")

    @property
    def gates(self) -> int:
        return MODES[self.mode]

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    def layout(self) -> list[tuple[int, int, str, int, tuple[int, ...]]]:
        """(layer, direction, name, offset, shape) of every weight block in W, in memory order."""
        G, H, D = self.gates, self.hidden_size, self.num_directions
        out, off = [], 0
        for layer in range(self.num_layers):
            n_in = self.input_size if layer == 0 else D * H
            for d in range(D):
                blocks = [("w_ih", (G * H, n_in)), ("w_hh", (G * H, H))]
                if self.bias:
                    blocks += [("b_ih", (G * H,)), ("b_hh", (G * H,))]
                for name, shape in blocks:
                    out.append((layer, d, name, off, shape))
                    off += math.prod(shape)
        return out

    def weight_size(self) -> int:
        return sum(math.prod(shape) for *_, shape in self.layout())


def _weights(spec: RNNSpec, W: Tensor) -> dict[tuple[int, int], dict[str, Tensor]]:
    """The weight blocks as differentiable views of W: {(layer, direction): {name: tensor}}."""
    out: dict[tuple[int, int], dict[str, Tensor]] = {}
    for layer, d, name, off, shape in spec.layout():
        block = autograd.slice(W, [off], [off + math.prod(shape)], [0])
        out.setdefault((layer, d), {})[name] = autograd.reshape(block, shape) if len(shape) > 1 else block
    return out


def _steps(x: Tensor) -> list[Tensor]:
    """x (T, B, F) as T tensors (B, F)."""
    T, B, F = x.shape
    parts = list(autograd.split(x, 0, [1] * T)) if T > 1 else [x]
    return [autograd.reshape(p, (B, F)) for p in parts]


def _states(s: Tensor, n: int) -> list[Tensor]:
    """s (n, B, H) as n tensors (B, H)."""
    _, B, H = s.shape
    parts = list(autograd.split(s, 0, [1] * n)) if n > 1 else [s]
    return [autograd.reshape(p, (B, H)) for p in parts]


def _cell(spec: RNNSpec, xw: Tensor, h: Tensor, c: Tensor | None, w: dict[str, Tensor]) -> tuple[Tensor, Any]:
    """One step: xw = W x + b_W (precomputed for all steps), h, c the states; returns (h', c')."""
    H = spec.hidden_size
    hw = autograd.matmul(h, autograd.transpose(w["w_hh"], (1, 0)))
    if spec.bias:
        hw = autograd.add_bias(hw, w["b_hh"], axis=0)
    if spec.mode == "gru":
        xr, xz, xn = autograd.split(xw, 1, [H, H, H])
        hr, hz, hn = autograd.split(hw, 1, [H, H, H])
        r = autograd.sigmoid(autograd.add(xr, hr))
        z = autograd.sigmoid(autograd.add(xz, hz))
        n = autograd.tanh(autograd.add(xn, autograd.mul(r, hn)))
        return autograd.add(autograd.mul(autograd.sub(1.0, z), n), autograd.mul(z, h)), None
    a = autograd.add(xw, hw)
    if spec.mode == "lstm":
        i, f, g, o = autograd.split(a, 1, [H, H, H, H])
        c = autograd.add(autograd.mul(autograd.sigmoid(f), c), autograd.mul(autograd.sigmoid(i), autograd.tanh(g)))
        return autograd.mul(autograd.sigmoid(o), autograd.tanh(c)), c
    return (autograd.tanh(a) if spec.mode == "tanh" else autograd.relu(a)), None


def _masks(seq_lengths: Any, T: int, B: int, like: Tensor) -> list[Tensor] | None:
    """Per step, a (B, 1) bool tensor: True where the step is within the sample's length."""
    if seq_lengths is None:
        return None
    lengths = (seq_lengths.to_numpy() if isinstance(seq_lengths, Tensor) else np.asarray(seq_lengths)).reshape(-1)
    if lengths.shape != (B,) or lengths.min(initial=1) < 1 or lengths.max(initial=1) > T:
        raise ValueError(f"seq_lengths must hold one length in [1, {T}] per sample ({B}), got {lengths.tolist()}")
    valid = np.arange(T).reshape(T, 1, 1) < lengths.reshape(1, B, 1)
    return [Tensor(data=valid[t], device=like.device, requires_grad=False) for t in range(T)]


def forward(spec: RNNSpec, x: Tensor, hx: Tensor, cx: Tensor | None, W: Tensor,
            seq_lengths: Any = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """(y, hy, cy) of the RNN on x (T, B, input) from hx, cx (L*D, B, H); cy is None unless LSTM."""
    T, B, _ = x.shape
    H, D, L = spec.hidden_size, spec.num_directions, spec.num_layers
    weights = _weights(spec, W)
    h0 = _states(hx, L * D)
    c0 = _states(cx, L * D) if spec.mode == "lstm" else [None] * (L * D)
    masks = _masks(seq_lengths, T, B, x)
    zeros = autograd.mul(h0[0], 0.0) if masks is not None else None
    layer_in = x
    hy: list[Tensor] = []
    cy: list[Tensor] = []
    for layer in range(L):
        n_in = layer_in.shape[2]
        flat = autograd.reshape(layer_in, (T * B, n_in))
        outs_by_dir = []
        for d in range(D):
            w = weights[(layer, d)]
            xw = autograd.matmul(flat, autograd.transpose(w["w_ih"], (1, 0)))  # every step's input part at once
            if spec.bias:
                xw = autograd.add_bias(xw, w["b_ih"], axis=0)
            xws = _steps(autograd.reshape(xw, (T, B, spec.gates * H)))
            h, c = h0[layer * D + d], c0[layer * D + d]
            outs: list[Any] = [None] * T
            for t in (range(T) if d == 0 else range(T - 1, -1, -1)):
                h_new, c_new = _cell(spec, xws[t], h, c, w)
                if masks is None:
                    h, c = h_new, c_new
                    outs[t] = h
                else:  # padding steps keep the state and output zeros
                    h = autograd.where(h_new, h, masks[t])
                    if c is not None:
                        c = autograd.where(c_new, c, masks[t])
                    outs[t] = autograd.where(h_new, zeros, masks[t])
            outs_by_dir.append(outs)
            hy.append(h)
            if c is not None:
                cy.append(c)
        steps = outs_by_dir[0] if D == 1 else [autograd.cat([f, b], 1) for f, b in zip(*outs_by_dir)]
        layer_in = autograd.cat([autograd.reshape(s, (1, B, D * H)) for s in steps], 0) if T > 1 else \
            autograd.reshape(steps[0], (1, B, D * H))
        if spec.dropout > 0 and layer < L - 1 and autograd.training:
            layer_in = autograd.dropout(layer_in, ratio=spec.dropout)

    def stack(states: list[Tensor]) -> Tensor:
        parts = [autograd.reshape(s, (1, B, H)) for s in states]
        return parts[0] if len(parts) == 1 else autograd.cat(parts, 0)

    return layer_in, stack(hy), (stack(cy) if cy else None)


def last_step(y: Tensor, seq_lengths: Any = None) -> Tensor:
    """y (T, B, F) at each sample's last valid step: (B, F)."""
    T, B, F = y.shape
    if seq_lengths is None:
        return autograd.reshape(autograd.slice(y, [T - 1], [T], [0]), (B, F))
    lengths = (seq_lengths.to_numpy() if isinstance(seq_lengths, Tensor) else np.asarray(seq_lengths)).reshape(-1)
    pick = (np.arange(T).reshape(T, 1, 1) == (lengths.reshape(1, B, 1) - 1)).astype(np.float32)
    sel = Tensor(data=pick, device=y.device, dtype=y.dtype, requires_grad=False)
    return autograd.reduce_sum(autograd.mul(y, sel), [0], 0)
