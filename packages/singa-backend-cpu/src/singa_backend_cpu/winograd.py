"""Our Winograd F(4x4, 3x3) convolutions (kernels/winograd.c) for the callers that keep activations in 16-channel
blocks: the ONNX inference plan and inference graphs (conv2d_fused's `blocks`, singa_onnx.layout, graph_fuse).

Plain NCHW calls need nothing here: sg_conv2d takes the Winograd path itself where it fits, and onednn.conv's
measurement weighs it against oneDNN as our own kernel. Blocked calls went to oneDNN alone; here a forward convolution
in blocks of 16 gets the Winograd kernel where, timed in turns against oneDNN's blocked plan on scratch operands the
first time the shape is met, it is clearly faster. The transformed weights (36 C K floats) of weights declared
constant (the plans' initializers) are kept from call to call, as oneDNN's reordered copies are; other weights are
transformed at each call, and that is in the timing too.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

from singa.backend import constant_token
from singa_backend_cpu import onednn
from singa_backend_cpu.device import ffi, lib

BLOCK = 16  # the kernel's channel block (one 16-float vector)

_choices: dict[tuple, bool] = {}  # (geometry, bias, residual, relu) -> Winograd chosen over oneDNN
_kept: dict[tuple, tuple] = {}  # (geometry, weights offset, token) -> (weakref of the weights' buffer, transformed)
_lock = threading.Lock()


def _transformed(w: Any, geometry: Any, keep: bool) -> np.ndarray:
    """The transformed weights of view w; kept (and reused) while its buffer stays declared constant."""
    token = constant_token(w.buffer) if keep else 0
    key = (tuple(geometry), w.offset, token)
    if token:
        with _lock:
            entry = _kept.get(key)
            if entry is not None and entry[0]() is w.buffer:
                return entry[1]
    u = np.empty(36 * geometry[1] * geometry[4], np.float32)  # 36 C K
    status = lib.sg_winograd_transform(w.buffer.handle, w.offset, ffi.cast("char *", u.ctypes.data), geometry)
    if status:
        raise ValueError(f"cpu kernel conv2d_fused: no Winograd form for geometry {list(geometry)}")
    if token:
        with _lock:
            for stale in [k_ for k_, e in _kept.items() if e[0]() is None or constant_token(e[0]()) != k_[2]]:
                del _kept[stale]
            _kept[key] = (weakref.ref(w.buffer), u)
    return u


def _run(out: Any, x: Any, u: np.ndarray, b: Any, residual: Any, relu: bool, geometry: Any) -> int:
    return lib.sg_winograd_forward(x.buffer.handle, x.offset, ffi.cast("char *", u.ctypes.data),
                                   *((b.buffer.handle, b.offset) if b is not None else (ffi.NULL, 0)),
                                   *((residual.buffer.handle, residual.offset) if residual is not None
                                     else (ffi.NULL, 0)),
                                   out.buffer.handle, out.offset, geometry, int(relu), 1)


def conv_blocked(g: Any, out: Any, x: Any, w: Any, b: Any, residual: Any, relu: bool, blocks: tuple) -> bool:
    """Run a float32 forward convolution whose x and out (with the residual) are in blocks of 16 by Winograd, where
    that fits the shape and was measured faster than oneDNN's blocked plan; False, having done nothing, otherwise."""
    if blocks != (BLOCK, BLOCK) or onednn.mode() != "auto":
        return False
    key = _key(g, b, residual, relu)
    if key not in _choices:
        _decide(key, g, w, b, residual, relu)
    launch = bound(g, out, x, w, b, residual, relu, blocks)
    if launch is None:
        return False
    launch()
    return True


def bound(g: Any, out: Any, x: Any, w: Any, b: Any, residual: Any, relu: bool, blocks: tuple):
    """The launch of conv_blocked's call on fixed operands (a replayed graph's too), where the shape runs by
    Winograd; else None."""
    if blocks != (BLOCK, BLOCK) or onednn.mode() != "auto" or not _choices.get(_key(g, b, residual, relu)):
        return None
    geometry = ffi.new("int64_t[]", g.as_list())

    def launch() -> None:
        if _run(out, x, _transformed(w, geometry, True), b, residual, relu, geometry):
            raise MemoryError(f"cpu kernel conv2d_fused (Winograd): out of memory for geometry {g.as_list()}")

    return launch


def _key(g: Any, b: Any, residual: Any, relu: bool) -> tuple:
    return tuple(g.as_list()), b is not None, residual is not None, relu


def _decide(key: tuple, g: Any, w: Any, b: Any, residual: Any, relu: bool) -> bool:
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
        keep = constant_token(w.buffer) != 0
        u = _transformed(w, geometry, False)

        def ours() -> None:
            uu = u if keep else _transformed(w, geometry, False)
            lib.sg_winograd_forward(ffi.cast("char *", x_s.ctypes.data), 0, ffi.cast("char *", uu.ctypes.data),
                                    *((b.buffer.handle, b.offset) if b is not None else (ffi.NULL, 0)),
                                    *((ffi.cast("char *", y_s.ctypes.data), 0) if residual is not None
                                      else (ffi.NULL, 0)),
                                    ffi.cast("char *", y_s.ctypes.data), 0, geometry, int(relu), 1)

        chosen = onednn.slower_than(g, b is not None, (residual is not None, relu), (BLOCK, BLOCK), ours)
    with _lock:
        _choices[key] = chosen
    return chosen


def reset() -> None:
    """Forget the choices and the kept weights (tests change SINGA_ONEDNN between cases)."""
    with _lock:
        _choices.clear()
        _kept.clear()


def choices() -> dict[tuple, bool]:
    """A copy of the choices made so far: {(geometry, bias, residual, relu): Winograd chosen}."""
    with _lock:
        return dict(_choices)
