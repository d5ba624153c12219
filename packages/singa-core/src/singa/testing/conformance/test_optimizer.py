"""sgd_momentum: SGD's momentum rule in place (a backend's own one-pass kernel, or the core's two axpby), against a
float64 reference; the views it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from singa import dtypes
from singa.backend import View
from singa.testing import helpers as H

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")

COVERS = {"sgd_momentum"}

SHAPES = [(), (1,), (7,), (33, 65), (3, 4, 5), (70000,), (0, 4)]  # 70,000: past a threaded kernel's split


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64], ids=dtypes.name)
def test_sgd_momentum(device, dtype, shape):
    H.require(device, dtype)
    gen = H.rng("sgd_momentum", dtype, shape)
    w, buf, g = (H.draw(gen, shape, dtype) for _ in range(3))
    lr, momentum = 0.05, 0.9
    want_buf = momentum * buf.astype(np.float64) + g.astype(np.float64)
    want_w = w.astype(np.float64) - lr * want_buf
    vw, vbuf, vg = H.upload(device, w, offset=3), H.upload(device, buf, offset=1), H.upload(device, g, offset=2)
    for step in ("first", "second"):  # the second starts from the first one's results
        device.table["sgd_momentum"](vw, vbuf, vg, lr=lr, momentum=momentum)
        got_buf, got_w = H.download(device, vbuf), H.download(device, vw)
        H.assert_close(got_buf, want_buf, dtype, what=f"sgd_momentum buf, {step} step, {shape}")
        H.assert_close(got_w, want_w, dtype, scale=np.abs(want_w) + lr * np.abs(want_buf),
                       what=f"sgd_momentum w, {step} step, {shape}")
        want_buf = momentum * got_buf.astype(np.float64) + g.astype(np.float64)
        want_w = got_w.astype(np.float64) - lr * want_buf
    H.assert_close(H.download(device, vg), g, dtype, rtol=0, atol=0, what="sgd_momentum leaves g alone")


def test_sgd_momentum_refuses_what_it_cannot_do(device):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    w, buf, g = (H.upload(device, x) for _ in range(3))
    kernel = device.table["sgd_momentum"]
    with pytest.raises(ValueError, match=r"sgd_momentum.*one shape"):
        kernel(w, buf, H.upload(device, x[:2]), lr=0.1, momentum=0.9)
    with pytest.raises(TypeError, match=r"sgd_momentum"):
        kernel(w, buf, H.upload(device, x.astype(np.int32)), lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match=r"sgd_momentum.*contiguous"):
        kernel(w, buf, H.transposed(device, x), lr=0.1, momentum=0.9)
    both = H.upload(device, np.zeros(16, np.float32))
    first, second = View(both.buffer, dtypes.float32, (3, 4)), View(both.buffer, dtypes.float32, (3, 4), offset=4)
    with pytest.raises(ValueError, match=r"sgd_momentum.*overlap"):
        kernel(first, second, g, lr=0.1, momentum=0.9)
    H.assert_close(H.download(device, w), x, dtypes.float32, rtol=0, atol=0, what="a refused update writes nothing")
