"""Fused operators a backend may provide beyond its kernel table (`Device.rnn_operator`: cuDNN's RNN, say).

A backend that returns one must compute what the core's generic version computes, forward and backward; a backend
that returns None (the base class's answer) uses the generic version, and these tests are skipped for it.
"""

from __future__ import annotations

import numpy as np
import pytest

from singa import autograd, rnn
from singa.tensor import Tensor

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")

COVERS: set = set()

SPECS = [rnn.RNNSpec("lstm", 5, 6, 2, True), rnn.RNNSpec("gru", 5, 6), rnn.RNNSpec("tanh", 5, 6, 1, True),
         rnn.RNNSpec("relu", 5, 6, 2, False, False)]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.mode}-L{s.num_layers}-D{s.num_directions}")
@pytest.mark.parametrize("masked", [False, True], ids=["full", "seq_lengths"])
def test_fused_rnn_matches_the_generic_one(device, spec, masked):
    lengths = np.array([4, 1, 3]) if masked else None
    fused = device.rnn_operator(spec, lengths)
    if fused is None:
        pytest.skip(f"{device.name} has no fused RNN (the generic one runs)")
    rng = np.random.default_rng(7)
    T_, B, H = 4, 3, spec.hidden_size
    n = spec.num_layers * spec.num_directions
    arrays = [rng.standard_normal((T_, B, spec.input_size)), rng.standard_normal((n, B, H)) * 0.5,
              rng.standard_normal((n, B, H)) * 0.5, rng.uniform(-0.4, 0.4, spec.weight_size())]
    r = rng.standard_normal((T_, B, spec.num_directions * H)).astype(np.float32)
    results = []
    prev = autograd.training
    autograd.training = True
    try:
        for run in (lambda *a: fused(*a), lambda *a: rnn.forward(spec, *a, lengths)):
            x, hx, cx, w = (Tensor(data=a.astype(np.float32), device=device, requires_grad=True, stores_grad=True)
                            for a in arrays)
            y, hy, cy = run(x, hx, cx, w)
            loss = autograd.reduce_sum(autograd.mul(y, Tensor(data=r, device=device)), None, 0)
            grads = autograd.gradients(loss)
            results.append([y.to_numpy(), hy.to_numpy()] + ([cy.to_numpy()] if spec.mode == "lstm" else [])
                           + [grads[t].to_numpy() for t in (x, hx, w)])
    finally:
        autograd.training = prev
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
