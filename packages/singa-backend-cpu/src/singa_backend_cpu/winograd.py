"""Our Winograd F(4x4, 3x3) convolutions (kernels/winograd.c) on operands in oneDNN's channel blocks (16 channels
with AVX-512, 8 with AVX2), one of the kernels blocked.py weighs against oneDNN's blocked plan.

Plain NCHW calls need nothing here: sg_conv2d takes the Winograd path itself where it fits, and onednn.conv's
measurement weighs it against oneDNN as our own kernel. The transformed weights (36 C K floats) of weights declared
constant (the plans' initializers) are kept from call to call, as oneDNN's reordered copies are; other weights are
transformed at each call, and that is in the timing too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from singa.backend import constant_token
from singa_backend_cpu.device import ffi, lib
from singa_backend_cpu.kept import KeptCopies

BLOCKS = (8, 16)  # the channel blocks the kernel reads and writes in place

_kept = KeptCopies()  # (geometry, weights offset, declaration token) -> transformed weights of constant weights


def usable(g: Any, block: int) -> bool:
    """Whether the kernel can run forward geometry g on operands in channel blocks of `block`."""
    return block in BLOCKS and bool(lib.sg_winograd_usable(ffi.new("int64_t[]", g.as_list())))


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


def launch(g: Any, out: Any, x: Any, w: Any, b: Any, residual: Any, relu: bool, block: int) -> Callable[[], None]:
    """The kernel's launch on fixed views, the weights' transform kept while they stay declared constant."""
    geometry = ffi.new("int64_t[]", g.as_list())
    out_at, x_at = (out.buffer.handle, out.offset), (x.buffer.handle, x.offset)
    r_at = (residual.buffer.handle, residual.offset) if residual is not None else None

    def run() -> None:
        _run(g, geometry, block, out_at, x_at, _transformed(w, geometry, True), b, r_at, relu)

    return run


def on_scratch(g: Any, w: Any, b: Any, residual: bool, relu: bool, block: int) -> Callable[[], None]:
    """A run of the kernel on zeroed operands of its own (for timing): the weights transformed once where they are
    declared constant (as a plan's kept copy), else at each run."""
    geometry = ffi.new("int64_t[]", g.as_list())
    x_s = np.zeros(g.N * g.C * g.H * g.W, np.float32)
    y_s = np.zeros(g.N * g.K * g.OH * g.OW, np.float32)
    x_at, y_at = (ffi.cast("char *", x_s.ctypes.data), 0), (ffi.cast("char *", y_s.ctypes.data), 0)
    keep = constant_token(w.buffer) != 0
    u = _transformed(w, geometry, False)

    def run() -> None:
        _run(g, geometry, block, y_at, x_at, u if keep else _transformed(w, geometry, False), b,
             y_at if residual else None, relu)

    run.operands = (x_s, y_s)  # alive as long as the run
    return run


def reset() -> None:
    """Forget the kept weights."""
    _kept.clear()
