"""Helpers for tests that call kernels directly: numpy data onto a device as views of several layouts, outputs with
guard elements around them, reading back, comparison with per-dtype tolerances, and several cases per test.

Everything goes through the public Device protocol (`alloc`, `write`, `read`) and `singa.backend.View`, so the helpers
work for any backend, whatever its buffers are.
"""

from __future__ import annotations

import contextlib
import zlib

import numpy as np
import pytest

from singa import dtypes
from singa.backend import View, contiguous_strides, numel

__all__ = [
    "ALL_DTYPES",
    "FLOAT_DTYPES",
    "FLOAT_TOL",
    "LAYOUTS",
    "NUMERIC_DTYPES",
    "Checks",
    "OutputView",
    "assert_close",
    "broadcast",
    "download",
    "draw",
    "empty",
    "layout",
    "np_dtype",
    "read_buffer",
    "require",
    "rng",
    "stepped",
    "tolerance",
    "transposed",
    "unit_axis_strides",
    "upload",
]

# (rtol, atol) per float dtype; ints and bool compare exactly.
FLOAT_TOL = {dtypes.float32: (1e-5, 1e-6), dtypes.float16: (1e-2, 1e-3), dtypes.float64: (1e-12, 1e-12)}

# The dtypes a test is parametrised over: the required ones and float64, which a device may declare (Device.dtypes).
# A test taking one of them calls `require(device, dtype)` first, so that a device without it skips the case.
ALL_DTYPES = dtypes.ALL + (dtypes.float64,)
NUMERIC_DTYPES = dtypes.NUMERIC + (dtypes.float64,)
FLOAT_DTYPES = dtypes.FLOATS + (dtypes.float64,)


def require(device, *dts: int) -> None:
    """Skip the calling test unless `device` declares every dtype in `dts`."""
    missing = [dtypes.name(d) for d in dict.fromkeys(dts) if d not in device.dtypes]
    if missing:
        pytest.skip(f"{device.name} does not declare {', '.join(missing)} in Device.dtypes")


LAYOUTS = ("contiguous", "offset", "transposed", "stepped")


def rng(*key) -> np.random.Generator:
    """A generator seeded from `key` (stable across runs and processes, unlike hash())."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def np_dtype(dtype: int) -> np.dtype:
    return dtypes.to_numpy_dtype(dtype)


def draw(gen: np.random.Generator, shape, dtype: int, low=-3.0, high=3.0) -> np.ndarray:
    """Random values of `dtype`: floats uniform in [low, high) rounded to the dtype, ints in [low, high]."""
    shape = tuple(shape)
    if dtype == dtypes.bool_:
        return gen.random(shape) < 0.5
    if dtype in dtypes.INTS:
        return gen.integers(int(np.floor(low)), int(np.floor(high)) + 1, shape).astype(np_dtype(dtype))
    return gen.uniform(low, high, shape).astype(np_dtype(dtype))


def _garbage(n: int, dtype: int, gen=None) -> np.ndarray:
    """Values a kernel should never see: NaN for floats, a large sentinel for ints, a random bit pattern for bool."""
    npdt = np_dtype(dtype)
    if dtype == dtypes.bool_:
        return (gen or rng("garbage", n)).random(n) < 0.5
    if dtype in dtypes.INTS:
        return np.full(n, np.iinfo(npdt).max - 7, npdt)
    return np.full(n, np.nan, npdt)


def _dtype_of(array: np.ndarray, dtype: int | None) -> int:
    return dtypes.from_numpy_dtype(array.dtype) if dtype is None else dtype


def upload(device, array, dtype: int | None = None, offset: int = 0) -> View:
    """A contiguous view holding `array`, starting `offset` elements into its buffer.

    With an offset, garbage lies before and after the view's elements, so a kernel that ignores `view.offset` or
    reads past the end produces wrong (NaN) results.
    """
    array = np.asarray(array)
    dtype = _dtype_of(array, dtype)
    array = array.astype(np_dtype(dtype), copy=False)
    n = array.size
    tail = 3 if offset else 0
    buf = device.alloc(max((offset + n + tail) * dtypes.itemsize(dtype), 1))
    if offset:
        device.write(View(buf, dtype, (offset,)), _garbage(offset, dtype))
        device.write(View(buf, dtype, (tail,), offset=offset + n), _garbage(tail, dtype))
    view = View(buf, dtype, array.shape, offset=offset)
    device.write(view, array)
    return view


def transposed(device, array, perm=None, dtype: int | None = None) -> View:
    """A view of `array` whose memory holds its axes in the order `perm` (default: reversed): not contiguous."""
    array = np.asarray(array)
    perm = tuple(reversed(range(array.ndim))) if perm is None else tuple(perm)
    stored = np.ascontiguousarray(array.transpose(perm))
    base = upload(device, stored, dtype)
    stored_strides = contiguous_strides(stored.shape)
    strides = [0] * array.ndim
    for k, axis in enumerate(perm):
        strides[axis] = stored_strides[k]
    return View(base.buffer, base.dtype, array.shape, tuple(strides), base.offset)


def stepped(device, array, step: int = 2, offset: int = 1, dtype: int | None = None) -> View:
    """`array` as the slice [offset::step, ::step, ...] of a larger buffer filled with garbage."""
    array = np.asarray(array)
    dtype = _dtype_of(array, dtype)
    big_shape = tuple(max(d * step, 1) for d in array.shape)
    big = _garbage(numel(big_shape), dtype).reshape(big_shape)
    big[tuple(slice(0, d * step, step) for d in array.shape)] = array
    base = upload(device, big, dtype, offset=offset)
    strides = tuple(s * step for s in contiguous_strides(big_shape))
    return View(base.buffer, dtype, array.shape, strides, base.offset)


def broadcast(device, array, shape, dtype: int | None = None) -> View:
    """`array` (numpy-broadcastable to `shape`) seen with `shape`: stride 0 on every broadcast axis."""
    array = np.asarray(array)
    shape = tuple(shape)
    padded = (1,) * (len(shape) - array.ndim) + array.shape
    base = upload(device, array.reshape(padded), dtype)
    strides = tuple(0 if a == 1 and s != 1 else st for a, s, st in zip(padded, shape, contiguous_strides(padded)))
    return View(base.buffer, base.dtype, shape, strides, base.offset)


def unit_axis_strides(device, array, dtype: int | None = None, stride: int = 7777) -> View:
    """`array` uploaded contiguously, but with a meaningless stride on its size-1 axes: still contiguous by
    `singa.backend.is_contiguous` (numpy makes such views), so a kernel must never step along those axes."""
    base = upload(device, array, dtype)
    strides = tuple(stride if d == 1 else s for d, s in zip(base.shape, base.strides))
    return View(base.buffer, base.dtype, base.shape, strides, base.offset)


def layout(device, array, kind: str, dtype: int | None = None) -> View:
    """`array` on `device` in one of LAYOUTS."""
    if kind == "contiguous":
        return upload(device, array, dtype)
    if kind == "offset":
        return upload(device, array, dtype, offset=5)
    if kind == "transposed":
        return transposed(device, array, dtype=dtype)
    if kind == "stepped":
        return stepped(device, array, dtype=dtype)
    if kind == "unit-axis-strides":
        return unit_axis_strides(device, array, dtype=dtype)
    raise ValueError(f"unknown layout {kind!r}")


class OutputView(View):
    """An output whose elements start as garbage, with guard elements around it that no kernel may touch."""

    __slots__ = ("front", "guard")


def empty(device, shape, dtype: int, guard: int = 5, offset: int = 0) -> OutputView:
    """An output view; with `offset`, it starts that many elements into its buffer (an output written in place
    into part of a larger tensor), and those elements are guards too."""
    shape = tuple(shape)
    n = numel(shape)
    buf = device.alloc((offset + n + guard) * dtypes.itemsize(dtype))
    view = OutputView(buf, dtype, shape, offset=offset)
    view.guard = draw(rng("guard", shape, dtype), (guard,), dtype, -100, 100)
    view.front = draw(rng("front", shape, dtype), (offset,), dtype, -100, 100)
    device.write(View(buf, dtype, (offset + n + guard,)), np.concatenate([view.front, _garbage(n, dtype), view.guard]))
    return view


def read_buffer(device, view, start: int, count: int) -> np.ndarray:
    """`count` elements of the view's buffer from element `start`, whatever the view covers."""
    return device.read(View(view.buffer, view.dtype, (count,), offset=start))


def download(device, view) -> np.ndarray:
    """The view's elements on the host; for an OutputView, also checks that its guard is intact."""
    __tracebackhide__ = True
    out = device.read(view)
    if isinstance(view, OutputView):
        after = read_buffer(device, view, view.offset + numel(view.shape), len(view.guard))
        if not np.array_equal(after, view.guard, equal_nan=True):
            raise AssertionError(f"the kernel wrote past the end of its output (shape {view.shape}, "
                                 f"{dtypes.name(view.dtype)}): guard {view.guard} became {after}")
        before = read_buffer(device, view, 0, len(view.front))
        if not np.array_equal(before, view.front, equal_nan=True):
            raise AssertionError(f"the kernel wrote before the start of its output (offset {view.offset}): "
                                 f"{view.front} became {before}")
    return out


def tolerance(dtype: int) -> tuple[float, float]:
    return FLOAT_TOL.get(dtype, (0.0, 0.0))


def assert_close(got, want, dtype: int, *, rtol=None, atol=None, scale=None, what: str = "") -> None:
    """Compare a device result with a (float64) reference.

    Floats: |got - want| <= atol + rtol * max(|want|, scale) elementwise, NaN where want is NaN, equal infinities;
    `scale` (an array broadcastable to want, or a number) is the magnitude of the terms that made `want`, for sums
    whose result may cancel. Ints and bool: exact.
    """
    __tracebackhide__ = True
    got = np.asarray(got)
    want = np.asarray(want)
    prefix = f"{what}: " if what else ""
    if got.shape != want.shape:
        raise AssertionError(f"{prefix}shape {got.shape}, expected {want.shape}")
    if not dtypes.is_float(dtype):
        want = want.astype(np_dtype(dtype))
        bad = got != want
        if bad.any():
            raise AssertionError(prefix + _report(got, want, bad, None))
        return
    r0, a0 = tolerance(dtype)
    rtol = r0 if rtol is None else rtol
    atol = a0 if atol is None else atol
    g = got.astype(np.float64)
    w = want.astype(np.float64)
    mag = np.abs(w) if scale is None else np.maximum(np.abs(w), np.abs(np.asarray(scale, np.float64)))
    with np.errstate(invalid="ignore"):
        bound = atol + rtol * mag
        finite = np.isfinite(w)
        bad = np.where(finite, ~(np.abs(g - w) <= bound), ~((g == w) | (np.isnan(g) & np.isnan(w))))
    if bad.any():
        raise AssertionError(prefix + _report(got, want, bad, np.broadcast_to(bound, w.shape)))


def _report(got, want, bad, bound, limit: int = 6) -> str:
    idx = np.argwhere(bad)
    lines = [f"{len(idx)} of {bad.size} elements differ"]
    for i in idx[:limit]:
        t = tuple(int(k) for k in i)
        line = f"  at {t}: got {got[t]!r}, expected {want[t]!r}"
        if bound is not None:
            line += f" (tolerance {float(bound[t]):.3g})"
        lines.append(line)
    return "\n".join(lines)


class Checks:
    """Several cases in one test, each reported: a failing case does not hide the ones after it.

        checks = Checks()
        for case in cases:
            with checks(f"case {case}"):
                ...
        checks.done()   # one AssertionError listing every failed case, chained to the first one's traceback
    """

    def __init__(self):
        self.failures: list[str] = []
        self.first: BaseException | None = None

    @contextlib.contextmanager
    def __call__(self, what: str):
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - a kernel that raises is a failed case too
            if self.first is None:
                self.first = exc
            self.failures.append(f"[{what}] {type(exc).__name__}: {exc}")

    def done(self) -> None:
        __tracebackhide__ = True
        if self.failures:
            raise AssertionError(f"{len(self.failures)} case(s) failed:\n" + "\n".join(self.failures)) from self.first
