"""The OpenCL backend's own tests: what is particular to it beyond the shared conformance suite.

The program-binary cache (hits, corrupt and truncated entries rebuilt, never trusted), build errors carrying the
compiler's log, Philox draws bit-identical to the CPU backend, the dtype rules (float16 switched off gives a clear
error; float64 is refused), both scatter_add strategies, layouts with more axes than one strided launch walks, the
split reduction, CLBlast missing, and a machine without OpenCL (no loader, no platform) keeping `import singa` working.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from singa import dtypes
from singa.backend import View
from singa.testing import helpers as H

F32 = dtypes.float32


def _run(script: str, **env) -> subprocess.CompletedProcess:
    full = dict(os.environ)
    full.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, env=full,
                          timeout=600, check=False)


# -- memory and coverage ----------------------------------------------------------------------------------------------


def test_every_primitive_is_native(ocl):
    assert ocl.missing_kernels() == []
    assert not any(getattr(fn, "is_fallback", False) for fn in ocl.table.values())


def test_buffers_are_device_memory(ocl):
    from singa_backend_opencl.device import ClBuffer

    buf = ocl.alloc(4096)
    assert isinstance(buf.handle, ClBuffer)
    assert not isinstance(buf.handle, (np.ndarray, bytearray, memoryview))
    x = np.arange(1024, dtype=np.float32)
    v = View(buf, F32, (1024,))
    ocl.write(v, x)
    assert np.array_equal(ocl.read(v), x)


def test_overlapping_copy_within_one_buffer(ocl):
    # clEnqueueCopyBuffer refuses overlapping ranges; the device goes through a temporary
    x = np.arange(100, dtype=np.float32)
    v = H.upload(ocl, x)
    ocl.copy_view(View(v.buffer, F32, (90,), offset=10), View(v.buffer, F32, (90,), offset=0))
    want = x.copy()
    want[10:] = x[:90]
    assert np.array_equal(ocl.read(v), want)


# -- random numbers: the CPU backend's draws, bit for bit -------------------------------------------------------------

STREAMS = [(0, 0, 1000), (42, 6, 777), (0x1234_5678_9ABC_DEF0, 4 * (1 << 32) + 1, 513), (2 ** 64 - 1, 2 ** 40 + 3, 9)]


@pytest.mark.parametrize(("seed", "offset", "n"), STREAMS)
def test_philox_words_match_the_reference(ocl, seed, offset, n):
    from singa.gpu.table import philox_u32
    from singa.testing.conformance.references import draws_u32

    assert philox_u32(ocl, seed, offset, n) == list(draws_u32(seed, offset, n))


def _cpu():
    pytest.importorskip("singa_backend_cpu")
    from singa import device

    return device.get_device("cpu")


@pytest.mark.parametrize(("seed", "offset", "n"), STREAMS)
def test_uniform_draws_bit_identical_to_cpu(ocl, seed, offset, n):
    cpu = _cpu()
    from singa.gpu.table import philox_u32
    from singa_backend_cpu.table import philox_u32 as cpu_words

    assert philox_u32(ocl, seed, offset, n) == cpu_words(seed, offset, n)
    for dtype, (low, high) in [(F32, (0.0, 1.0)), (F32, (-2.5, 3.75)), (F32, (0.1, 0.3)), (dtypes.float16, (-1, 7)),
                               (dtypes.float16, (-2.3, 3.7)), (dtypes.float16, (0.1, 0.3))]:
        got = []
        for dev in (cpu, ocl):
            out = H.empty(dev, (n,), dtype)
            dev.table["random_uniform"](out, low=low, high=high, seed=seed, offset=offset)
            got.append(H.download(dev, out))
        assert got[0].tobytes() == got[1].tobytes(), f"uniform [{low}, {high}) {dtypes.name(dtype)}"
    for dtype in (F32, dtypes.int32, dtypes.bool_):
        got = []
        for dev in (cpu, ocl):
            out = H.empty(dev, (n,), dtype)
            dev.table["random_bernoulli"](out, p=0.3, seed=seed, offset=offset)
            got.append(H.download(dev, out))
        assert got[0].tobytes() == got[1].tobytes(), f"bernoulli {dtypes.name(dtype)}"


def test_normal_draws_match_cpu(ocl):
    cpu = _cpu()
    got = []
    for dev in (cpu, ocl):
        out = H.empty(dev, (4001,), F32)
        dev.table["random_normal"](out, mean=0.5, std=2.0, seed=99, offset=3)
        got.append(H.download(dev, out))
    # the same Box-Muller in double on both; the transcendental functions may differ in their last bit
    np.testing.assert_allclose(got[1], got[0], rtol=2e-7, atol=2e-7)
    assert np.mean(got[0] == got[1]) > 0.99


# -- the program binary cache -----------------------------------------------------------------------------------------

SOURCE = """
__kernel void sg_test_scale(__global float *x, const float a) { x[get_global_id(0)] *= a; }
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SINGA_OPENCL_CACHE", str(tmp_path))
    return tmp_path


def _build(ocl, source=SOURCE, name="test:scale"):
    from singa_backend_opencl import build

    handle = build.build_program(ocl.context, ocl.info.device_id, ocl.name, ocl.cache_key, name, source,
                                 ocl.build_options)
    return build.Program(name, handle)


def _works(ocl, program) -> bool:
    from singa_backend_opencl.device import F32 as PF32

    x = H.upload(ocl, np.arange(64, dtype=np.float32))
    ocl.launch(program.kernel("sg_test_scale"), 64, (x.buffer.handle.arg, PF32(3.0)), local=64)
    return np.array_equal(ocl.read(x), 3 * np.arange(64, dtype=np.float32))


def test_cache_hit_then_corrupt_entry_is_rebuilt(ocl, cache):
    from singa_backend_opencl import build

    before = dict(build.stats)
    prog = _build(ocl)
    assert _works(ocl, prog)
    files = list(cache.glob("test_scale-*.clbin"))
    assert len(files) == 1, "the binary must be stored under SINGA_OPENCL_CACHE"
    entry = files[0]
    good = entry.read_bytes()
    assert build.stats["compiled"] == before["compiled"] + 1

    assert _works(ocl, _build(ocl))  # second build: straight from the file
    assert build.stats["cache_hits"] == before["cache_hits"] + 1

    # flip one byte in the middle of the binary: the checksum catches it before the driver sees it
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    entry.write_bytes(bytes(bad))
    assert _works(ocl, _build(ocl))
    assert build.stats["rejected"] == before["rejected"] + 1
    assert build.stats["compiled"] == before["compiled"] + 2
    assert entry.read_bytes() == good or build._read_entry(entry) is not None, "the entry must be rewritten, valid"

    for damage in (good[: len(good) // 3], b"", b"not a cache file at all", b"SGCLBIN0" + good[8:]):
        entry.write_bytes(damage)
        assert _works(ocl, _build(ocl))
        assert build._read_entry(entry) is not None
    assert build.stats["rejected"] == before["rejected"] + 5


def test_cache_key_covers_source_device_and_driver(ocl, cache):
    from singa_backend_opencl import build

    _build(ocl)
    _build(ocl, SOURCE + "\n/* changed */\n")
    assert len(list(cache.glob("test_scale-*.clbin"))) == 2, "a changed source must not reuse the old binary"
    k = build.cache_key(SOURCE, "", ocl.cache_key)
    assert k != build.cache_key(SOURCE, "", ocl.cache_key.replace(ocl.info.driver, ocl.info.driver + "-next"))
    assert k != build.cache_key(SOURCE, "-DSG_FP64", ocl.cache_key)
    assert ocl.info.driver in ocl.cache_key
    assert ocl.info.name in ocl.cache_key
    assert ocl.info.platform_version in ocl.cache_key


def test_cache_off_and_unwritable(ocl, monkeypatch, tmp_path):
    from singa_backend_opencl import build

    monkeypatch.setenv("SINGA_OPENCL_CACHE", "off")
    assert build.cache_dir() is None
    assert _works(ocl, _build(ocl))
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("SINGA_OPENCL_CACHE", str(blocker / "sub"))
    monkeypatch.setattr(build.CACHE, "_warned_write", False)
    with pytest.warns(RuntimeWarning, match="cannot write the kernel cache"):
        prog = _build(ocl, SOURCE + "\n/* unwritable */\n")
    assert _works(ocl, prog)


def test_device_programs_use_the_cache(ocl, cache):
    """A fresh device object compiles into the cache; a second one loads from it."""
    from singa_backend_opencl import build
    from singa_backend_opencl.device import OpenclDevice

    for attempt in range(2):
        before = dict(build.stats)
        dev = OpenclDevice(0, ocl.info)
        a = H.upload(dev, np.arange(10, dtype=np.float32))
        out = H.empty(dev, (10,), F32)
        dev.table["square"](out, a)
        assert np.array_equal(H.download(dev, out), np.arange(10, dtype=np.float32) ** 2)
        key = "compiled" if attempt == 0 else "cache_hits"
        assert build.stats[key] > before[key]
    assert any(p.name.startswith("ew_square_float32-") for p in cache.iterdir())


def test_build_error_carries_log_and_name(ocl, cache):
    from singa_backend_opencl.build import OpenCLBuildError

    with pytest.raises(OpenCLBuildError) as err:
        _build(ocl, "__kernel void sg_broken(__global float *x) { x[0] = undeclared_thing; }", "test:broken")
    e = err.value
    assert e.program == "test:broken"
    assert "undeclared_thing" in e.log
    assert "test:broken" in str(e)
    assert "undeclared_thing" in str(e)
    assert ocl.name in str(e)
    assert not list(cache.glob("test_broken-*")), "a failed build must not leave a cache entry"


# -- dtypes ------------------------------------------------------------------------------------------------------------


def test_float16_off_gives_a_clear_error(ocl, monkeypatch):
    from singa import tensor
    from singa_backend_opencl.device import OpenclDevice, UnsupportedDtypeError

    monkeypatch.setenv("SINGA_OPENCL_FP16", "0")
    dev = OpenclDevice(0, ocl.info)
    assert dtypes.float16 not in dev.dtypes
    assert dtypes.float32 in dev.dtypes
    x = View(dev.alloc(64), dtypes.float16, (8,))
    out = View(dev.alloc(64), dtypes.float16, (8,))
    for call in (lambda: dev.table["exp"](out, x), lambda: dev.table["add"](out, x, x),
                 lambda: dev.table["reduce_sum"](out, x, axes=()), lambda: dev.table["fill"](out, value=1.0),
                 lambda: dev.table["cast"](View(dev.alloc(64), F32, (8,)), x)):
        with pytest.raises(UnsupportedDtypeError, match="float16") as err:
            call()
        assert dev.name in str(err.value)
        assert ocl.info.name in str(err.value)
        assert "SINGA_OPENCL_FP16" in str(err.value)
    with pytest.raises(TypeError, match="float16"):
        tensor.Tensor((2, 3), dev, tensor.float16)


def test_float64_where_the_device_has_it_and_refused_clearly_where_not(ocl, monkeypatch):
    from singa_backend_opencl.device import OpenclDevice

    x = np.linspace(-2, 2, 8)
    if ocl.fp64:  # PoCL has cl_khr_fp64: float64 is computed in double
        assert dtypes.float64 in ocl.dtypes
        out = H.empty(ocl, (8,), dtypes.float64)
        ocl.table["exp"](out, H.upload(ocl, x, dtypes.float64))
        np.testing.assert_allclose(H.download(ocl, out), np.exp(x), rtol=1e-14)
    monkeypatch.setenv("SINGA_OPENCL_FP64", "0")
    off = OpenclDevice(0, ocl.info)
    assert dtypes.float64 not in off.dtypes
    with pytest.raises(TypeError, match="float64") as err:
        off.table["exp"](View(off.alloc(64), dtypes.float64, (8,)), View(off.alloc(64), dtypes.float64, (8,)))
    assert off.name in str(err.value)


# -- strategies the conformance shapes do not all reach ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, dtypes.float16, dtypes.int32, dtypes.int64], ids=dtypes.name)
@pytest.mark.parametrize("atomic", [True, False], ids=["atomic", "columns"])
def test_scatter_add_both_strategies(ocl, monkeypatch, dtype, atomic):
    from singa.gpu import table

    monkeypatch.setattr(table, "SCATTER_ATOMIC_BELOW", 1 << 40 if atomic else 0)
    gen = np.random.default_rng(3)
    idx = gen.integers(-5, 5, 3000)
    upd = gen.integers(-4, 5, (3, 3000, 7)).astype(H.np_dtype(dtype))  # small integers: any order sums exactly
    base = gen.integers(-4, 5, (3, 5, 7)).astype(H.np_dtype(dtype))
    out = H.upload(ocl, base, offset=2)
    ocl.table["scatter_add"](out, H.upload(ocl, idx.astype(np.int64)), H.upload(ocl, upd), axis=1)
    want = base.astype(np.float64)
    for j, i in enumerate(idx):
        want[:, i] += upd[:, j]
    H.assert_close(ocl.read(out), want, dtype, rtol=0, atol=0, what=f"scatter_add atomic={atomic}")


def test_elementwise_beyond_eight_axes(ocl):
    # 10 axes that cannot merge (a transposed 10-d array): the launch is split over the leading axes
    gen = np.random.default_rng(5)
    a = gen.standard_normal((2, 3, 2, 2, 3, 2, 2, 1, 2, 3)).astype(np.float32)
    b = gen.standard_normal((2, 3, 2, 2, 3, 2, 2, 1, 2, 3)).astype(np.float32)
    out = H.empty(ocl, a.shape, F32)
    ocl.table["add"](out, H.transposed(ocl, a), H.stepped(ocl, b))
    H.assert_close(H.download(ocl, out), a.astype(np.float64) + b, F32)
    out = H.empty(ocl, a.shape, F32)
    ocl.table["copy"](out, H.transposed(ocl, a))
    assert np.array_equal(H.download(ocl, out), a)


def test_long_reduction_in_segments(ocl):
    gen = np.random.default_rng(9)
    x = gen.uniform(-1, 1, 3_000_017).astype(np.float32)
    for name, ref in (("reduce_sum", np.sum), ("reduce_max", np.max), ("reduce_mean", np.mean)):
        out = H.empty(ocl, (), F32)
        ocl.table[name](out, H.upload(ocl, x, offset=1), axes=(0,))
        H.assert_close(H.download(ocl, out), ref(x.astype(np.float64)), F32,
                       scale=np.abs(x).sum() / (x.size if name == "reduce_mean" else 1), what=name)
    y = gen.uniform(-1, 1, (3, 400_000)).astype(np.float32)
    out = H.empty(ocl, (3,), F32)
    ocl.table["reduce_sum"](out, H.upload(ocl, y), axes=(1,))
    H.assert_close(H.download(ocl, out), y.astype(np.float64).sum(axis=1), F32, scale=np.abs(y).sum(axis=1))


def test_bias_gradient_reduction(ocl):
    # (N, C, H, W) summed over (0, 2, 3): one work-group per channel, no transposing copy
    gen = np.random.default_rng(11)
    x = gen.standard_normal((16, 5, 9, 7)).astype(np.float32)
    for name in ("reduce_sum", "reduce_max", "reduce_prod"):
        xx = (x * 0.1 + 1) if name == "reduce_prod" else x
        out = H.empty(ocl, (5,), F32)
        ocl.table[name](out, H.upload(ocl, xx), axes=(0, 2, 3))
        ref = {"reduce_sum": np.sum, "reduce_max": np.max, "reduce_prod": np.prod}[name]
        H.assert_close(H.download(ocl, out), ref(xx.astype(np.float64), axis=(0, 2, 3)), F32,
                       rtol=1e-4 if name == "reduce_prod" else None, scale=np.abs(xx).sum(axis=(0, 2, 3)), what=name)


def test_index_errors_leave_outputs_alone(ocl):
    x = H.upload(ocl, np.arange(12, dtype=np.float32).reshape(3, 4))
    loss = H.upload(ocl, np.full(3, 7.0, np.float32))
    with pytest.raises(IndexError, match="label 4 with 4 classes"):
        ocl.table["softmax_cross_entropy"](loss, x, H.upload(ocl, np.array([0, 4, 1], np.int32)))
    with pytest.raises(IndexError, match="label -1 with 4 classes"):  # a class label never counts from the end
        ocl.table["softmax_cross_entropy"](loss, x, H.upload(ocl, np.array([0, -1, 1], np.int32)))
    assert np.array_equal(ocl.read(loss), np.full(3, 7.0, np.float32))
    out = H.upload(ocl, np.zeros((3, 2), np.float32))
    with pytest.raises(IndexError, match="index -5 on axis 1 of length 4"):
        ocl.table["gather"](out, x, H.upload(ocl, np.array([1, -5], np.int64)), axis=1)
    assert np.array_equal(ocl.read(out), np.zeros((3, 2), np.float32))


# -- machines without OpenCL pieces ------------------------------------------------------------------------------------

PROBE = """
    import json, warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import singa
        from singa import plugins, device
        b = plugins.registry().backends["opencl"]
        report = {"count": b.device_count(), "info": b.info(), "num": device.get_num_opencl_devices(),
                  "failures": [f.name for f in plugins.registry().failures if "opencl" in f.name]}
    # no warning about us either: a missing OpenCL is not a broken plugin (other plugins may warn: not ours)
    report["warnings"] = [str(w.message) for w in caught if "opencl" in str(w.message).lower()]
    print(json.dumps(report))
"""


def _probe(**env) -> dict:
    proc = _run(PROBE, **env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_without_icd_loader():
    rep = _probe(SINGA_OPENCL_LIBRARY="/nonexistent/libOpenCL.so.1")
    assert rep["warnings"] == []
    assert rep["count"] == 0
    assert rep["num"] == 0
    assert rep["failures"] == []
    assert "ICD loader" in rep["info"]["status"]


def test_without_platform(tmp_path):
    from singa_backend_opencl import cl

    if cl.lib is None:
        pytest.skip("no ICD loader here")
    # ocl-icd reads the vendor list from OCL_ICD_VENDORS: an empty folder means no platform at all
    rep = _probe(OCL_ICD_VENDORS=str(tmp_path))
    assert rep["warnings"] == []
    assert rep["count"] == 0
    assert rep["failures"] == []
    assert "pocl-opencl-icd" in rep["info"]["status"]
    proc = _run("import singa; from singa import device; device.create_opencl_device()", OCL_ICD_VENDORS=str(tmp_path))
    assert proc.returncode != 0
    assert "backend 'opencl' is installed but has 0 device(s)" in proc.stderr


def test_info_lists_the_device(ocl):
    proc = _run("from singa import info; info.main()")
    assert proc.returncode == 0, proc.stderr
    from singa import primitives

    section = proc.stdout.split("\n  opencl: ")[1]
    n = len(primitives.names())
    assert "device opencl:0" in section
    c = len(primitives.COMPOSED)  # built from its own kernels (singa.composed)
    assert f"kernels: {n - c}/{n} implemented, {c} composed from its other kernels, 0 through the host fallback" \
        in section


def test_products_without_clblast(ocl):
    """With CLBlast unavailable the backend's own GEMM kernel does every product (and the convolutions)."""
    proc = _run("""
        import numpy as np
        from singa import device, dtypes
        from singa.testing import helpers as H
        from singa_backend_opencl import clblast
        assert clblast.lib is None
        dev = device.get_device("opencl")
        g = np.random.default_rng(0)
        for dt in (dtypes.float32, dtypes.float16):
            a = g.uniform(-1, 1, (3, 37, 21)).astype(H.np_dtype(dt))
            b = g.uniform(-1, 1, (1, 21, 45)).astype(H.np_dtype(dt))
            out = H.empty(dev, (3, 37, 45), dt)
            dev.table["matmul"](out, H.upload(dev, a), H.upload(dev, b), trans_a=False, trans_b=False, alpha=1.0,
                                beta=0.0)
            H.assert_close(H.download(dev, out), a.astype(np.float64) @ b, dt, scale=np.abs(a) @ np.abs(b))
        x = g.uniform(-1, 1, (2, 3, 6, 6)).astype(np.float32)
        w = g.uniform(-1, 1, (4, 3, 3, 3)).astype(np.float32)
        y = H.empty(dev, (2, 4, 4, 4), dtypes.float32)
        dev.table["conv2d"](y, H.upload(dev, x), H.upload(dev, w), None, stride=(1, 1), padding=(0, 0, 0, 0),
                            dilation=(1, 1), groups=1)
        from singa.testing.conformance.references import conv_ref
        H.assert_close(H.download(dev, y), conv_ref(x, w, None, 4, 4, stride=(1, 1), padding=(0, 0, 0, 0),
                                                    dilation=(1, 1), groups=1), dtypes.float32, rtol=1e-5,
                       atol=1e-5)
        print("ok")
    """, SINGA_CLBLAST_LIBRARY="")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("ok")


# -- paths that only large inputs take, forced on small ones ----------------------------------------------------------


@pytest.mark.parametrize("groups", [1, 2])
def test_convolution_in_chunks(ocl, monkeypatch, groups):
    """Images unfolded a few at a time (as when the unfolded matrix would not fit) give the one-chunk results."""
    from singa.testing.conformance.references import conv_backward_data_ref, conv_backward_weight_ref, conv_ref
    from singa_backend_opencl import table

    gen = np.random.default_rng(13)
    x = gen.uniform(-1, 1, (7, 4, 9, 8)).astype(np.float32)
    w = gen.uniform(-1, 1, (6, 4 // groups, 3, 3)).astype(np.float32)
    b = gen.uniform(-1, 1, 6).astype(np.float32)
    p = {"stride": (2, 1), "padding": (1, 0, 1, 2), "dilation": (1, 2), "groups": groups}
    oh, ow = 5, 6
    dy = gen.uniform(-1, 1, (7, 6, oh, ow)).astype(np.float32)
    monkeypatch.setattr(table, "COL_BUDGET", 4 * 9 * oh * ow * 3)  # room for three images at a time
    y = H.empty(ocl, (7, 6, oh, ow), F32)
    ocl.table["conv2d"](y, H.upload(ocl, x), H.upload(ocl, w), H.upload(ocl, b), **p)
    ax, aw, ady = np.abs(x), np.abs(w), np.abs(dy)
    H.assert_close(H.download(ocl, y), conv_ref(x, w, b, oh, ow, **p), F32,
                   scale=conv_ref(ax, aw, np.abs(b), oh, ow, **p), what="conv2d in chunks")
    dx = H.empty(ocl, x.shape, F32)
    ocl.table["conv2d_backward_data"](dx, H.upload(ocl, dy), H.upload(ocl, w), **p)
    H.assert_close(H.download(ocl, dx), conv_backward_data_ref(dy, w, x.shape, **p), F32,
                   scale=conv_backward_data_ref(ady, aw, x.shape, **p), what="conv2d_backward_data in chunks")
    dw = H.empty(ocl, w.shape, F32)
    ocl.table["conv2d_backward_weight"](dw, H.upload(ocl, dy), H.upload(ocl, x), **p)
    H.assert_close(H.download(ocl, dw), conv_backward_weight_ref(dy, x, w.shape, **p), F32,
                   scale=conv_backward_weight_ref(ady, ax, w.shape, **p), what="conv2d_backward_weight in chunks")


def test_reductions_over_every_axis_subset_of_4d(ocl):
    # kept and reduced axes interleaved every way: merged, the (A, K, B) kernel, or gathered by a copy first
    import itertools

    gen = np.random.default_rng(17)
    x = gen.uniform(-5, 5, (3, 4, 5, 6)).astype(np.float32)
    xi = gen.integers(-9, 9, (3, 4, 5, 6)).astype(np.int64)
    for r in range(5):
        for axes in itertools.combinations(range(4), r):
            for name, ref in (("reduce_sum", np.sum), ("reduce_max", np.max), ("reduce_min", np.min)):
                for arr, dt in ((x, F32), (xi, dtypes.int64)):
                    want = ref(arr.astype(np.float64 if dt == F32 else np.int64), axis=axes)
                    out = H.empty(ocl, want.shape, dt)
                    ocl.table[name](out, H.upload(ocl, arr, offset=1), axes=axes)
                    H.assert_close(H.download(ocl, out), want, dt, scale=np.abs(arr).sum(axis=axes),
                                   what=f"{name} {dtypes.name(dt)} axes {axes}")


def test_float16_normalisation_matches_cpu(ocl):
    """float16 batch normalisation (per-channel vectors in float16 too) and softmax give the CPU backend's results."""
    cpu = _cpu()
    gen = np.random.default_rng(19)
    x = gen.normal(0.5, 2, (6, 3, 5, 4)).astype(np.float16)
    dy = gen.normal(0, 1, x.shape).astype(np.float16)
    vecs = [gen.uniform(0.5, 2, 3).astype(np.float16) for _ in range(4)]
    got = []
    for dev in (cpu, ocl):
        y, rm, rv, sm, si = (H.empty(dev, s, dtypes.float16) for s in (x.shape, (3,), (3,), (3,), (3,)))
        dev.write(rm, vecs[2])
        dev.write(rv, vecs[3])
        xv = H.upload(dev, x)
        dev.table["batchnorm_train"](y, rm, rv, sm, si, xv, H.upload(dev, vecs[0]), H.upload(dev, vecs[1]),
                                     momentum=0.9, eps=1e-5)
        dx, ds, db = H.empty(dev, x.shape, dtypes.float16), H.empty(dev, (3,), dtypes.float16), \
            H.empty(dev, (3,), dtypes.float16)
        dev.table["batchnorm_backward"](dx, ds, db, H.upload(dev, dy), xv, H.upload(dev, vecs[0]), sm, si)
        sx = H.empty(dev, (6, 60), dtypes.float16)
        dev.table["log_softmax"](sx, H.upload(dev, x.reshape(6, 60)), axis=1)
        got.append([H.download(dev, v) for v in (y, rm, rv, sm, si, dx, ds, db, sx)])
    for name, c, o in zip(("y", "running_mean", "running_var", "saved_mean", "saved_invstd", "dx", "dscale",
                           "dbias", "log_softmax"), *got):
        H.assert_close(o, c.astype(np.float64), dtypes.float16, rtol=2e-3, atol=2e-3, what=name)


def test_integer_mean_truncates(ocl):
    # primitives.reduce_mean: integer means truncate toward zero; an empty one is 0
    x = np.array([[-7, -1, 0], [5, 2, 1], [-3, -3, -4]], np.int64)
    out = H.empty(ocl, (3,), dtypes.int64)
    ocl.table["reduce_mean"](out, H.upload(ocl, x), axes=(1,))
    assert H.download(ocl, out).tolist() == [-2, 2, -3]
    out = H.empty(ocl, (4,), dtypes.int32)
    ocl.table["reduce_mean"](out, H.upload(ocl, np.zeros((0, 4), np.int32)), axes=(0,))
    assert H.download(ocl, out).tolist() == [0, 0, 0, 0]
