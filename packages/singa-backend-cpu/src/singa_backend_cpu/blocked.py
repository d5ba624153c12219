"""Our own kernels for float32 forward convolutions whose operands stay in oneDNN's channel blocks (16 channels with
AVX-512, 8 with AVX2): the ONNX inference plan and inference graphs (conv2d_fused's `blocks`; singa_onnx.layout,
graph_fuse). Blocked calls go to oneDNN's blocked plan unless one of these was clearly faster on the shape:
  - Winograd F(4x4, 3x3) (winograd.py): 3x3 stride-1 shapes;
  - the unfolding of x plus one GEMM over the threads (kernels/conv.c, sg_conv2d_gemm_blocked): any single-group
    shape. It wins on small images, where oneDNN's direct AVX2 kernels have little to split: 512 -> 512 3x3 at 7x7,
    batch 1, 2.0 ms against 3.0 (AMD EPYC Zen 3, 2 threads).
Under SINGA_ONEDNN=auto, the first time a shape is met, each kernel that can run it and oneDNN's plan are timed in
turns on scratch operands (onednn.fastest_over_blocked), and the choice is kept for the process. SINGA_ONEDNN=1
promises oneDNN's kernels, 0 has no blocked operands at all.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from singa.backend import constant_token
from singa_backend_cpu import onednn, winograd
from singa_backend_cpu.device import ffi, lib

WINOGRAD, GEMM = "winograd", "gemm"

_choices: dict[tuple, str | None] = {}  # (geometry, bias, residual, relu, blocks) -> our kernel, None for oneDNN's
_lock = threading.Lock()


def _block(blocks: tuple) -> int:
    """The channel block of a call our kernels take (x and out in one block), else 0."""
    return blocks[0] if blocks[0] and blocks == (blocks[0], blocks[0]) else 0


def _key(g: Any, b: Any, residual: Any, relu: bool, blocks: tuple) -> tuple:
    return tuple(g.as_list()), b is not None, residual is not None, relu, blocks


def conv_blocked(g: Any, out: Any, x: Any, w: Any, b: Any, residual: Any, relu: bool, blocks: tuple) -> bool:
    """Run a float32 forward convolution whose x and out (with the residual) are in channel blocks by one of our
    kernels, where one was measured clearly faster than oneDNN's blocked plan; False, having done nothing,
    otherwise."""
    if not _block(blocks) or onednn.mode() != "auto":
        return False
    key = _key(g, b, residual, relu, blocks)
    if key not in _choices:
        _decide(key, g, w, b, residual, relu, blocks)
    run = bound(g, out, x, w, b, residual, relu, blocks)
    if run is None:
        return False
    run()
    return True


def bound(g: Any, out: Any, x: Any, w: Any, b: Any, residual: Any, relu: bool, blocks: tuple
          ) -> Callable[[], None] | None:
    """The launch of conv_blocked's call on fixed operands (a replayed graph's too), where one of our kernels runs
    the shape; else None."""
    block = _block(blocks)
    if not block or onednn.mode() != "auto":
        return None
    kernel = _choices.get(_key(g, b, residual, relu, blocks))
    if kernel == WINOGRAD:
        return winograd.launch(g, out, x, w, b, residual, relu, block)
    if kernel == GEMM:
        return _gemm_launch(g, (out.buffer.handle, out.offset), (x.buffer.handle, x.offset), w, b,
                            (residual.buffer.handle, residual.offset) if residual is not None else None, relu, block)
    return None


def _gemm_launch(g: Any, out: tuple, x: tuple, w: Any, b: Any, residual: tuple | None, relu: bool, block: int
                 ) -> Callable[[], None]:
    """sg_conv2d_gemm_blocked on (pointer, offset) operands; w and b views (b may be None)."""
    geometry = ffi.new("int64_t[]", g.as_list())
    args = (*x, w.buffer.handle, w.offset, *((b.buffer.handle, b.offset) if b is not None else (ffi.NULL, 0)),
            *(residual if residual is not None else (ffi.NULL, 0)), *out, geometry, int(relu), block)
    conv = lib.sg_conv2d_gemm_blocked

    def run() -> None:
        if conv(*args):
            raise MemoryError(f"cpu kernel conv2d_fused (unfolding + GEMM): out of memory for geometry "
                              f"{g.as_list()}")

    return run


def _gemm_on_scratch(g: Any, w: Any, b: Any, residual: bool, relu: bool, block: int) -> Callable[[], None]:
    x_s = np.zeros(g.N * g.C * g.H * g.W, np.float32)
    y_s = np.zeros(g.N * g.K * g.OH * g.OW, np.float32)
    y_at = (ffi.cast("char *", y_s.ctypes.data), 0)
    run = _gemm_launch(g, y_at, (ffi.cast("char *", x_s.ctypes.data), 0), w, b, y_at if residual else None, relu,
                       block)
    run.operands = (x_s, y_s)  # alive as long as the run
    return run


def _decide(key: tuple, g: Any, w: Any, b: Any, residual: Any, relu: bool, blocks: tuple) -> str | None:
    """Which of our kernels runs this shape from now on (None: oneDNN's blocked plan), by timing in turns."""
    with _lock:
        if key in _choices:
            return _choices[key]
    block = _block(blocks)
    others = {}
    if winograd.usable(g, block):
        others[WINOGRAD] = winograd.on_scratch(g, w, b, residual is not None, relu, block)
    if g.G == 1:
        others[GEMM] = _gemm_on_scratch(g, w, b, residual is not None, relu, block)
    chosen = None
    if others:
        chosen = onednn.fastest_over_blocked(g, b is not None, (residual is not None, relu), blocks, others,
                                             constant_token(w.buffer) != 0)
    with _lock:
        _choices[key] = chosen
    return chosen


def reset() -> None:
    """Forget the choices and Winograd's kept weights (tests change SINGA_ONEDNN between cases)."""
    with _lock:
        _choices.clear()
    winograd.reset()


def choices() -> dict[tuple, str | None]:
    """A copy of the choices made so far: {(geometry, bias, residual, relu, blocks): our kernel or None}."""
    with _lock:
        return dict(_choices)
