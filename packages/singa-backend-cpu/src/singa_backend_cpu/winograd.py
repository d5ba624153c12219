"""Our Winograd F(4x4, 3x3) convolutions (kernels/winograd.c) for the callers that keep activations in oneDNN's
channel blocks (16 channels with AVX-512, 8 with AVX2): the ONNX inference plan and inference graphs (conv2d_fused's
`blocks`, singa_onnx.layout, graph_fuse).

Plain NCHW calls need nothing here: sg_conv2d takes the Winograd path itself where it fits, and onednn.conv's
measurement weighs it against oneDNN as our own kernel. Blocked calls went to oneDNN alone; here a forward convolution
in channel blocks gets the Winograd kernel where, timed in turns against oneDNN's blocked plan on scratch operands the
first time the shape is met, it is clearly faster. The transformed weights (36 C K floats) of weights declared
constant (the plans' initializers) are kept from call to call, as oneDNN's reordered copies are; other weights are
transformed at each call, and that is in the timing too.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from singa.backend import constant_token
from singa_backend_cpu import onednn
from singa_backend_cpu.device import ffi, lib
from singa_backend_cpu.kept import KeptCopies

BLOCKS = (8, 16)  # the channel blocks the kernel reads and writes in place

_choices: dict[tuple, bool] = {}  # (geometry, bias, residual, relu, blocks) -> Winograd chosen over oneDNN
_kept = KeptCopies()  # (geometry, weights offset, declaration token) -> transformed weights of constant weights
_lock = threading.Lock()


def _transformed(w: Any, geometry: Any, keep: bool) -> np.ndarray:
    """The transformed weights of view w; kept (and reused) while its buffer stays declared constant."""
    token = constant_token(w.buffer) if keep else 0
    key = (tuple(geometry), w.offset, token)  # the token tells apart the many weights of one shape in a model
    if token:
        u = _kept.get(key, w.buffer, token)
        if u is not None:
            return u
    u = np.empty(36 * geometry[1] * geometry[4], np.float32)  # 36 C K
    status = lib.sg_winograd_transform(w.buffer.handle, w.offset, ffi.cast("char *", u.ctypes.data), geometry)
    if status:
        raise ValueError(f"cpu kernel conv2d_fused: no Winograd form for geometry {list(geometry)}")
    if token:
        _kept.put(key, w.buffer, token, u)
    return u


def _run(g: Any, geometry: Any, block: int, out: tuple, x: tuple, u: np.ndarray, b: Any, residual: tuple | None,
         relu: bool) -> None:
    """The kernel on (pointer, offset) operands; b a view or None."""
    status = lib.sg_winograd_forward(*x, ffi.cast("char *", u.ctypes.data),
                                     *((b.buffer.handle, b.offset) if b is not None else (ffi.NULL, 0)),
                                     *(residual if residual is not None else (ffi.NULL, 0)),
                                     *out, geometry, int(relu), block)
    if status:
        raise MemoryError(f"cpu kernel conv2d_fused (Winograd): out of memory for geometry {g.as_list()}")


def _block(blocks: tuple) -> int:
    """The channel block of a blocked call the kernel can take (both operands in oneDNN's block), else 0."""
    return blocks[0] if blocks[0] in BLOCKS and blocks == (blocks[0], blocks[0]) else 0


def conv_blocked(g: Any, out: Any, x: Any, w: Any, b: Any, residual: Any, relu: bool, blocks: tuple) -> bool:
    """Run a float32 forward convolution whose x and out (with the residual) are in channel blocks by Winograd,
    where that fits the shape and was measured faster than oneDNN's blocked plan; False, having done nothing,
    otherwise."""
    if not _block(blocks) or onednn.mode() != "auto":
        return False
    key = _key(g, b, residual, relu, blocks)
    if key not in _choices:
        _decide(key, g, w, b, residual, relu, blocks)
    launch = bound(g, out, x, w, b, residual, relu, blocks)
    if launch is None:
        return False
    launch()
    return True


def bound(g: Any, out: Any, x: Any, w: Any, b: Any, residual: Any, relu: bool, blocks: tuple):
    """The launch of conv_blocked's call on fixed operands (a replayed graph's too), where the shape runs by
    Winograd; else None."""
    block = _block(blocks)
    if not block or onednn.mode() != "auto" or not _choices.get(_key(g, b, residual, relu, blocks)):
        return None
    geometry = ffi.new("int64_t[]", g.as_list())
    out_at, x_at = (out.buffer.handle, out.offset), (x.buffer.handle, x.offset)
    r_at = (residual.buffer.handle, residual.offset) if residual is not None else None

    def launch() -> None:
        _run(g, geometry, block, out_at, x_at, _transformed(w, geometry, True), b, r_at, relu)

    return launch


def _key(g: Any, b: Any, residual: Any, relu: bool, blocks: tuple) -> tuple:
    return tuple(g.as_list()), b is not None, residual is not None, relu, blocks


def _decide(key: tuple, g: Any, w: Any, b: Any, residual: Any, relu: bool, blocks: tuple) -> bool:
    """Whether this shape runs by Winograd from now on: usable, and clearly faster than oneDNN's blocked plan, both
    timed on scratch operands (zeros; the weights transformed in each run unless they are kept)."""
    with _lock:
        if key in _choices:
            return _choices[key]
    geometry = ffi.new("int64_t[]", g.as_list())
    chosen = False
    if lib.sg_winograd_usable(geometry):
        x_s = np.zeros(g.N * g.C * g.H * g.W, np.float32)
        y_s = np.zeros(g.N * g.K * g.OH * g.OW, np.float32)
        x_at, y_at = (ffi.cast("char *", x_s.ctypes.data), 0), (ffi.cast("char *", y_s.ctypes.data), 0)
        keep = constant_token(w.buffer) != 0
        u = _transformed(w, geometry, False)

        def ours() -> None:
            _run(g, geometry, blocks[0], y_at, x_at, u if keep else _transformed(w, geometry, False), b,
                 y_at if residual is not None else None, relu)

        chosen = onednn.slower_than(g, b is not None, (residual is not None, relu), blocks, ours)
    with _lock:
        _choices[key] = chosen
    return chosen


def reset() -> None:
    """Forget the choices and the kept weights (tests change SINGA_ONEDNN between cases)."""
    with _lock:
        _choices.clear()
    _kept.clear()


def choices() -> dict[tuple, bool]:
    """A copy of the choices made so far: {(geometry, bias, residual, relu, blocks): Winograd chosen}."""
    with _lock:
        return dict(_choices)
