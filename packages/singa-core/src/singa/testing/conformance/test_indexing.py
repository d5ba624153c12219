"""gather (ONNX Gather), scatter_add (its adjoint, accumulating repeated indices) and pad (constant, reflect, edge)."""

from __future__ import annotations

import numpy as np
import pytest

from singa import dtypes
from singa.testing import helpers as H

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")

COVERS = {"gather", "scatter_add", "pad"}

INDEX_DTYPES = (dtypes.int32, dtypes.int64)


def _indices(gen, n, shape, dtype):
    """Indices in [-n, n), both signs, with repeats."""
    idx = gen.integers(-n, n, shape)
    if idx.size >= 2:
        idx.reshape(-1)[:2] = [-1, n - 1]  # the same element, spelled both ways
    return idx.astype(H.np_dtype(dtype))


def gather_ref(x, idx, axis):
    n = x.shape[axis]
    norm = np.where(idx < 0, idx + n, idx).astype(np.int64)
    return x[(slice(None),) * axis + (norm,)]


@pytest.mark.parametrize("idtype", INDEX_DTYPES, ids=dtypes.name)
@pytest.mark.parametrize("dtype", H.ALL_DTYPES, ids=dtypes.name)
def test_gather(device, dtype, idtype):
    H.require(device, dtype)
    gen = H.rng("gather", dtype, idtype)
    x = H.draw(gen, (4, 5, 6), dtype, -50, 50)
    checks = H.Checks()
    for axis in range(3):
        for ishape in [(7,), (2, 3), (), (0,)]:
            idx = _indices(gen, x.shape[axis], ishape, idtype)
            want = gather_ref(x, idx, axis)
            with checks(f"axis {axis} indices shape {ishape}"):
                out = H.empty(device, want.shape, dtype)
                device.table["gather"](out, H.upload(device, x, offset=2), H.upload(device, idx, idtype), axis=axis)
                H.assert_close(H.download(device, out), want, dtype, rtol=0, atol=0,
                               what=f"gather axis={axis} indices {idx.tolist()}")
    checks.done()


@pytest.mark.parametrize("bad", [5, -6], ids=["past-end", "before-start"])
def test_gather_index_out_of_range(device, bad):
    x = H.upload(device, np.arange(10, dtype=np.float32).reshape(2, 5))
    idx = H.upload(device, np.array([0, bad], np.int64))
    out = H.empty(device, (2, 2), dtypes.float32)

    def gather():
        device.table["gather"](out, x, idx, axis=1)
        device.synchronize()  # an asynchronous device may only notice here

    with pytest.raises(IndexError):
        gather()


def scatter_add_ref(out0, idx, updates, axis):
    out = out0.astype(np.float64) if out0.dtype.kind == "f" else out0.astype(np.int64)
    n = out.shape[axis]
    flat = idx.reshape(-1)
    upd = updates.reshape(out.shape[:axis] + (flat.size,) + out.shape[axis + 1:])
    for j, i in enumerate(flat):
        i = int(i) + n if i < 0 else int(i)
        dst = (slice(None),) * axis + (i,)
        out[dst] += upd[(slice(None),) * axis + (j,)]
    return out


@pytest.mark.parametrize("idtype", INDEX_DTYPES, ids=dtypes.name)
@pytest.mark.parametrize("dtype", H.NUMERIC_DTYPES, ids=dtypes.name)
def test_scatter_add(device, dtype, idtype):
    H.require(device, dtype)
    gen = H.rng("scatter", dtype, idtype)
    checks = H.Checks()
    for shape, axis, ishape in [((5, 4), 0, (6,)), ((5, 4), 1, (7,)), ((3, 4, 3), 2, (2, 4)), ((3, 4), 1, (0,)),
                                ((4,), 0, (9,))]:
        out0 = H.draw(gen, shape, dtype, -5, 5)
        idx = _indices(gen, shape[axis], ishape, idtype)
        ushape = shape[:axis] + ishape + shape[axis + 1:]
        updates = H.draw(gen, ushape, dtype, -5, 5)
        want = scatter_add_ref(out0, idx, updates, axis)
        scale = scatter_add_ref(np.abs(out0), idx, np.abs(updates), axis)
        with checks(f"shape {shape} axis {axis} indices shape {ishape}"):
            out = H.empty(device, shape, dtype, offset=axis + 1)  # a target inside a larger tensor
            device.write(out, out0)  # scatter_add accumulates into out
            device.table["scatter_add"](out, H.upload(device, idx, idtype), H.upload(device, updates, offset=1),
                                        axis=axis)
            H.assert_close(H.download(device, out), want, dtype, scale=scale,
                           what=f"scatter_add shape {shape} axis {axis} indices {idx.tolist()} (repeats accumulate)")
    checks.done()


def test_scatter_add_many_repeats(device):
    # every update lands on one of two rows: a kernel that writes instead of accumulating loses almost all of them
    n = 500
    idx = np.tile(np.array([1, -1], np.int64), n // 2)
    updates = np.ones((n, 3), np.float32)
    out = H.empty(device, (3, 3), dtypes.float32)
    device.write(out, np.zeros((3, 3), np.float32))
    device.table["scatter_add"](out, H.upload(device, idx), H.upload(device, updates), axis=0)
    H.assert_close(H.download(device, out), [[0] * 3, [n // 2] * 3, [n // 2] * 3], dtypes.float32, what="scatter_add")


def _pads(gen, shape, mode):
    nd = len(shape)
    limit = [d - 1 for d in shape] if mode == "reflect" else [3] * nd
    begin = [int(gen.integers(0, max(lim, 0) + 1)) for lim in limit]
    end = [int(gen.integers(0, max(lim, 0) + 1)) for lim in limit]
    if nd:
        begin[0] = min(limit[0], 2) if limit[0] > 0 else 0
        end[-1] = min(limit[-1], 1) if limit[-1] > 0 else 0
    return tuple(begin + end)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("dtype", H.ALL_DTYPES, ids=dtypes.name)
def test_pad(device, dtype, mode):
    H.require(device, dtype)
    gen = H.rng("pad", dtype, mode)
    value = {dtypes.bool_: True, dtypes.int32: 7, dtypes.int64: -3}.get(dtype, 2.5)
    checks = H.Checks()
    for shape in [(5,), (4, 5), (3, 4, 5)] + ([(0, 3)] if mode == "constant" else []):
        x = H.draw(gen, shape, dtype, -50, 50)
        pads = _pads(gen, shape, mode)
        nd = len(shape)
        width = [(pads[i], pads[i + nd]) for i in range(nd)]
        if mode == "constant":
            want = np.pad(x, width, mode="constant", constant_values=value)
        else:
            want = np.pad(x, width, mode=mode)
        with checks(f"shape {shape} pads {pads}"):
            out = H.empty(device, want.shape, dtype)
            device.table["pad"](out, H.upload(device, x, offset=1), pads=pads, mode=mode, value=value)
            H.assert_close(H.download(device, out), want, dtype, rtol=0, atol=0,
                           what=f"pad {mode} shape {shape} pads {pads}")
    checks.done()


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_0d(device, mode):
    x = np.array(4.5, np.float32)
    out = H.empty(device, (), dtypes.float32)
    device.table["pad"](out, H.upload(device, x), pads=(), mode=mode, value=1.0)
    H.assert_close(H.download(device, out), x, dtypes.float32, rtol=0, atol=0, what=f"pad {mode} of a 0-d input")
