"""The Device protocol itself: memory pool counters, host <-> device and device <-> device copies, synchronisation,
random-number bookkeeping, the class-label scan, and the kernel table (complete, no stray names, fallback warnings)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from singa import device as singa_device
from singa import dtypes, plugins, primitives
from singa.backend import Device, View
from singa.testing import helpers as H

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")

COVERS: set = set()


def test_identity(device):
    assert isinstance(device, Device)
    assert device.name == f"{device.backend_name}:{device.id}"
    assert device.backend_name in plugins.registry().backends
    assert singa_device.get_device(device.name) is device, "a device must be found again by its name"
    assert isinstance(device.description(), str)
    assert device.description()


def test_singa_device_methods(device):
    """SINGA's Device API comes from the core's base class; a backend must not shadow it (an int `id` attribute,
    say): dev.id() is the index, and the graph calls record, finish and replay a step on this device."""
    assert device.id() == int(device.id)
    if "cpu" in plugins.registry().backends:
        assert device.host().backend_name == "cpu"
    assert device.graph_enabled() is False
    x = H.upload(device, np.array([1.0, 2.0], np.float32))
    device.EnableGraph(True)
    try:
        assert device.graph_enabled()
        y = H.upload(device, np.zeros(2, np.float32))
        device.table["add_scalar"](y, x, alpha=1.0)
    finally:
        device.EnableGraph(False)
    try:
        device.RunGraph(True)  # finishes the recording: its step has already run
        np.testing.assert_array_equal(H.download(device, y), [2.0, 3.0])
        device.write(x, np.array([5.0, 6.0], np.float32))
        device.RunGraph(False)
        np.testing.assert_array_equal(H.download(device, y), [6.0, 7.0])
    finally:
        device.ResetGraph()
    device.Sync()


def test_pool_counters(device):
    pool = device.pool
    gc.collect()
    base_use, base_req = pool.bytes_in_use, pool.num_requests
    pool.reset_peak()
    a = device.alloc(1000)
    b = device.alloc(3 << 20)  # above 1 MiB: power-of-two size classes
    assert a.nbytes == 1000
    assert b.nbytes == 3 << 20
    used = pool.size_class(1000) + pool.size_class(3 << 20)
    assert pool.bytes_in_use == base_use + used
    assert pool.peak_bytes >= base_use + used
    assert pool.num_requests == base_req + 2
    stats = device.memory_stats()
    assert stats["bytes_in_use"] == pool.bytes_in_use
    assert stats["peak_bytes"] == pool.peak_bytes
    del a, b
    gc.collect()
    assert pool.bytes_in_use == base_use, "freed buffers must leave bytes_in_use"
    assert pool.peak_bytes >= base_use + used, "peak_bytes must remember the high-water mark"
    allocs = pool.num_allocs
    c = device.alloc(900)  # same size class as the freed 1000-byte block: served from the cache
    assert pool.num_allocs == allocs, "a cached block of the right size class must be reused"
    del c
    gc.collect()
    pool.empty_cache()
    assert pool.bytes_cached == 0
    d = device.alloc(900)
    assert pool.num_allocs == allocs + 1
    del d


def test_alloc_zero_bytes(device):
    buf = device.alloc(0)
    v = View(buf, dtypes.float32, (0,))
    device.write(v, np.zeros(0, np.float32))
    assert device.read(v).shape == (0,)


SPECIALS = {
    dtypes.float32: np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 3.4028235e38, -1.5], np.float32),
    dtypes.float16: np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 6e-8, 65504, -1.5], np.float16),
    dtypes.int32: np.array([0, -1, 2 ** 31 - 1, -(2 ** 31), 7], np.int32),
    dtypes.int64: np.array([0, -1, 2 ** 63 - 1, -(2 ** 63), 2 ** 53 + 1], np.int64),
    dtypes.bool_: np.array([True, False, True, True, False]),
    dtypes.float64: np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, 1.7976931348623157e308, 1 / 3]),
}


@pytest.mark.parametrize("dtype", H.ALL_DTYPES, ids=dtypes.name)
def test_host_round_trip(device, dtype):
    H.require(device, dtype)
    gen = H.rng("round-trip", dtype)
    for x in (SPECIALS[dtype], H.draw(gen, (3, 5, 7), dtype, -1000, 1000), H.draw(gen, (), dtype),
              H.draw(gen, (300_001,), dtype, -1000, 1000)):
        for offset in (0, 3):
            v = H.upload(device, x, offset=offset)
            back = device.read(v)
            assert back.dtype == H.np_dtype(dtype)
            assert back.shape == x.shape
            # bit patterns, so -0.0 and NaN payloads count
            assert back.tobytes() == np.ascontiguousarray(x).tobytes(), f"round trip of {x.shape} at offset {offset}"


@pytest.mark.parametrize("dtype", H.ALL_DTYPES, ids=dtypes.name)
def test_read_strided_views(device, dtype):
    H.require(device, dtype)
    x = H.draw(H.rng("strided-read", dtype), (4, 6), dtype, -100, 100)
    for kind in H.LAYOUTS:
        assert np.array_equal(device.read(H.layout(device, x, kind)), x), kind
    assert np.array_equal(device.read(H.broadcast(device, x[:1], (3, 6))), np.broadcast_to(x[:1], (3, 6)))


@pytest.mark.parametrize("dtype", H.ALL_DTYPES, ids=dtypes.name)
def test_write_strided(device, dtype):
    H.require(device, dtype)
    gen = H.rng("write-strided", dtype)
    x = H.draw(gen, (3, 4), dtype, -100, 100)
    base = H.draw(gen, (20,), dtype, -100, 100)
    v = H.upload(device, base)
    view = View(v.buffer, dtype, (3, 4), (1, 3), offset=2)  # column-major window
    device.write_strided(view, x)
    want = base.copy()
    for i in range(3):
        for j in range(4):
            want[2 + i + 3 * j] = x[i, j]
    assert np.array_equal(device.read(v), want)


@pytest.mark.parametrize("dtype", H.ALL_DTYPES, ids=dtypes.name)
def test_copy_on_device(device, dtype):
    H.require(device, dtype)
    gen = H.rng("d2d", dtype)
    src = H.draw(gen, (1000,), dtype, -100, 100)
    dst0 = H.draw(gen, (1200,), dtype, -100, 100)
    s = H.upload(device, src, offset=7)
    d = H.upload(device, dst0)
    device.copy_view(View(d.buffer, dtype, (1000,), offset=101), s)
    device.synchronize()
    want = dst0.copy()
    want[101:1101] = src
    assert np.array_equal(device.read(d), want)


def test_copy_between_devices(device):
    others = [dev for dev in _other_devices() if dev is not device]
    if not others:
        pytest.skip("only one device installed")
    x = H.draw(H.rng("x-dev"), (5, 7), dtypes.float32)
    for other in others:
        src = H.upload(other, x)
        dst = View(device.alloc(x.nbytes), dtypes.float32, x.shape)
        device.copy_view(dst, src)
        assert np.array_equal(device.read(dst), x), f"{other.name} -> {device.name}"
        back = View(other.alloc(x.nbytes), dtypes.float32, x.shape)
        other.copy_view(back, dst)
        assert np.array_equal(other.read(back), x), f"{device.name} -> {other.name}"


def _other_devices():
    """The first device of each installed backend; a backend installed with no device (OpenCL without a platform, CUDA
    without a GPU) has none to offer and is left out."""
    return [singa_device.get_device(f"{name}:0") for name, backend in sorted(plugins.registry().backends.items())
            if backend.device_count() > 0]


def test_synchronize(device):
    x = H.draw(H.rng("sync"), (256, 256), dtypes.float32)
    a, out = H.upload(device, x), H.empty(device, (256, 256), dtypes.float32)
    device.table["copy"](out, a)
    device.synchronize()
    device.Sync()
    assert np.array_equal(H.download(device, out), x)


def test_rng_offsets(device):
    device.set_rand_seed(123)
    assert device.seed == 123
    assert device.rng_offset == 0
    assert device.next_rng_offset(5) == 0
    second = device.next_rng_offset(3)
    assert second == 8
    assert second % 4 == 0
    assert device.next_rng_offset(0) == 12


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.int64], ids=dtypes.name)
def test_find_label_outside(device, dtype):
    """The position of the first label outside [0, classes), or -1: contiguous (with an offset), strided, empty."""
    classes = 10
    cases = [([3, 0, 9, 2], -1), ([3, 10, -1], 1), ([-1, 4], 0), ([5, 6, 7, 9, 11], 4), ([], -1),
             (list(range(10)) * 300 + [-7], 3000)]
    for labels, want in cases:
        arr = np.array(labels, H.np_dtype(dtype))
        assert device.find_label_outside(H.upload(device, arr, offset=3), classes) == want, labels
    if dtype == dtypes.int64:  # beyond int32: a label that wraps into range when truncated
        assert device.find_label_outside(H.upload(device, np.array([1, 2**32 + 3], np.int64)), classes) == 1
    every_other = H.stepped(device, np.array([1, 2, 3, 12, 5], H.np_dtype(dtype)))
    assert device.find_label_outside(every_other, classes) == 3


def test_kernel_table_complete(device):
    names = primitives.names()
    assert list(device.table) == names
    assert all(callable(device.table[n]) for n in names)
    stray = sorted(set(device.kernels) - set(names))
    assert not stray, f"kernels named outside the primitive set (typos? renamed primitives?): {stray}"
    missing = set(device.missing_kernels())
    for n in names:
        assert bool(getattr(device.table[n], "is_fallback", False)) == (n in missing), n


def test_fallback_warning_once_per_kernel(device):
    """A missing kernel warns once, naming itself and the backend; a native kernel does not warn.

    Run in a fresh interpreter: the warning is once per process, and this suite has already called every kernel.
    """
    missing = device.missing_kernels()
    if not missing:
        pytest.skip(f"{device.name} implements every primitive: no fallback to warn about")
    fallback = [n for n in ("reduce_sum", "exp", "neg", "fill", "copy", "add") if n in missing]
    fallback = (fallback or missing)[:2]
    native = [n for n in ("fill", "copy") if n not in missing][:1]
    script = textwrap.dedent(f"""
        import json, warnings
        import numpy as np
        from singa import device as D, dtypes
        from singa.backend import View
        dev = D.get_device({device.name!r})
        def call(name):
            p = {{"reduce_sum": {{"axes": (0,)}}, "fill": {{"value": 1.0}}}}.get(name, {{}})
            x = View(dev.alloc(16), dtypes.float32, (4,))
            dev.write(x, np.ones(4, np.float32))
            out = View(dev.alloc(16), dtypes.float32, () if name == "reduce_sum" else (4,))
            args = {{"fill": (out,), "add": (out, x, x)}}.get(name, (out, x))
            dev.table[name](*args, **p)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for name in {fallback + native!r} * 3:
                call(name)
        print(json.dumps([(x.category.__name__, str(x.message)) for x in w]))
    """)
    env = dict(os.environ, SINGA_FALLBACK="warn")  # the default, whatever the suite itself runs under
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    warned = [(cat, msg) for cat, msg in json.loads(proc.stdout.strip().splitlines()[-1]) if cat == "FallbackWarning"]
    for name in fallback:
        hits = [msg for _, msg in warned if repr(name) in msg]
        assert len(hits) == 1, f"kernel {name!r} called 3 times: expected one FallbackWarning naming it, got {hits}"
        assert device.backend_name in hits[0], hits[0]
    assert len(warned) == len(fallback), f"native kernels {native} must not warn: {warned}"
