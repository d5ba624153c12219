"""4-layer BERT-, RoBERTa- and GPT-2-style encoders written in PyTorch and exported to ONNX with torch.onnx.export,
for bench_onnx: the graphs a user exporting such a model from PyTorch hands to an ONNX runtime (MatMul + Add per
projection, LayerNorm and GELU as PyTorch exports them, attention as Reshape/Transpose/MatMul/Softmax).

Sizes are small (hidden 256, 4 heads, 4 layers, feed-forward 1024, sequence 128) so that a run takes milliseconds.
Weights are random (seeded); inputs are token ids (int64) of one sequence length, batch dimension free.
"""

from __future__ import annotations

import io
import math

import numpy as np

HIDDEN, HEADS, LAYERS, FFN, SEQ, VOCAB = 256, 4, 4, 1024, 128, 1000


def _torch_modules():
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Attention(nn.Module):
        def __init__(self, causal: bool):
            super().__init__()
            self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
            self.out = nn.Linear(HIDDEN, HIDDEN)
            self.causal = causal

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).split(HIDDEN, dim=2)
            d = HIDDEN // HEADS
            q, k, v = (a.reshape(b, t, HEADS, d).transpose(1, 2) for a in (q, k, v))
            s = q @ k.transpose(-1, -2) / math.sqrt(d)
            if self.causal:
                mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
                s = s.masked_fill(mask, float("-inf"))
            y = F.softmax(s, dim=-1) @ v
            return self.out(y.transpose(1, 2).reshape(b, t, HIDDEN))

    class Block(nn.Module):
        def __init__(self, pre_norm: bool, gelu: str):
            super().__init__()
            self.attn = Attention(causal=pre_norm)
            self.ln1 = nn.LayerNorm(HIDDEN)
            self.ln2 = nn.LayerNorm(HIDDEN)
            self.fc1 = nn.Linear(HIDDEN, FFN)
            self.fc2 = nn.Linear(FFN, HIDDEN)
            self.pre_norm = pre_norm
            self.gelu = gelu

        def mlp(self, x):
            return self.fc2(F.gelu(self.fc1(x), approximate=self.gelu))

        def forward(self, x):
            if self.pre_norm:  # GPT-2
                x = x + self.attn(self.ln1(x))
                return x + self.mlp(self.ln2(x))
            x = self.ln1(x + self.attn(x))  # BERT / RoBERTa
            return self.ln2(x + self.mlp(x))

    class Encoder(nn.Module):
        def __init__(self, kind: str):
            super().__init__()
            gpt = kind == "gpt2"
            self.tok = nn.Embedding(VOCAB, HIDDEN)
            self.pos = nn.Embedding(SEQ + 2, HIDDEN)
            self.ln = nn.LayerNorm(HIDDEN)
            self.blocks = nn.ModuleList(Block(gpt, "tanh" if gpt else "none") for _ in range(LAYERS))
            self.kind = kind

        def forward(self, ids):
            t = ids.shape[1]
            start = 2 if self.kind == "roberta" else 0  # RoBERTa's positions start after the padding index
            pos = torch.arange(start, start + t).unsqueeze(0)
            x = self.tok(ids) + self.pos(pos)
            if self.kind != "gpt2":
                x = self.ln(x)
            for blk in self.blocks:
                x = blk(x)
            return self.ln(x) if self.kind == "gpt2" else x

    return torch, Encoder


def export(kind: str, seed: int = 0):
    """The ONNX model (onnx.ModelProto) of a `kind` ('bert', 'roberta', 'gpt2') encoder, batch dimension free."""
    import onnx

    torch, Encoder = _torch_modules()
    torch.manual_seed(seed)
    m = Encoder(kind).eval()
    ids = torch.randint(0, VOCAB, (1, SEQ))
    f = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(m, (ids,), f, input_names=["ids"], output_names=["y"], opset_version=17,
                          dynamic_axes={"ids": {0: "batch"}, "y": {0: "batch"}}, dynamo=False)
    return onnx.load_from_string(f.getvalue())


def sample(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, (batch, SEQ)).astype(np.int64)


KINDS = ["bert", "roberta", "gpt2"]
