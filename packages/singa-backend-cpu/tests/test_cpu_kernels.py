"""The CPU backend's own kernel tests: every primitive family called directly with views, against numpy references
computed in float64 (or exactly, for integers, bits and random draws).

The shared conformance suite in singa-core checks the contract across backends; these tests also reach into what is
particular to this backend: strided and broadcast layouts of the generated element-wise code, the threaded paths of
large inputs, the vectorised exp, and the Philox generator against the Random123 known answers.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

import singa_backend_cpu
from singa import device, dtypes, expressions, primitives
from singa.backend import View
from singa_backend_cpu.device import ffi
from singa_backend_cpu.table import philox_u32

DEV = device.get_device("cpu")
K = DEV.kernels
RNG = np.random.default_rng(20240521)
NP = {dtypes.float32: np.float32, dtypes.float16: np.float16, dtypes.int32: np.int32, dtypes.int64: np.int64,
      dtypes.bool_: np.bool_, dtypes.float64: np.float64}
ALL_NP = [np.float32, np.float16, np.int32, np.int64, np.bool_, np.float64]
FLOAT_NP = (np.float32, np.float16, np.float64)


# -- helpers ------------------------------------------------------------------------------------------------------


def put(arr) -> View:
    arr = np.asarray(arr)
    v = View(DEV.alloc(arr.nbytes), dtypes.from_numpy_dtype(arr.dtype), arr.shape)
    DEV.write(v, arr)
    return v


def empty(shape, dt) -> View:
    dt = np.dtype(dt)
    return View(DEV.alloc(math.prod(shape) * dt.itemsize), dtypes.from_numpy_dtype(dt), tuple(shape))


def get(v: View) -> np.ndarray:
    return DEV.read(v)


def strided_view(arr: np.ndarray, shape, strides, offset=0) -> View:
    """A view of `shape` with element `strides` over a copy of the flat `arr` (broadcast when a stride is 0)."""
    base = put(np.ascontiguousarray(arr).reshape(-1))
    return View(base.buffer, base.dtype, tuple(shape), tuple(strides), offset)


def host_strided(arr: np.ndarray, shape, strides, offset=0) -> np.ndarray:
    flat = np.ascontiguousarray(arr).reshape(-1)
    return np.lib.stride_tricks.as_strided(flat[offset:], shape, [s * flat.itemsize for s in strides]).copy()


def sample(dt, shape, domain=(-3.0, 3.0)) -> np.ndarray:
    if dt == np.bool_:
        return RNG.random(shape) < 0.5
    if np.issubdtype(dt, np.integer):
        return RNG.integers(-6, 7, shape).astype(dt)
    return RNG.uniform(domain[0], domain[1], shape).astype(dt)


def close(got, ref, dt, rtol=None, atol=None) -> None:
    got = np.asarray(got)
    ref = np.asarray(ref)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    if np.dtype(dt) in FLOAT_NP:
        r0, a0 = {np.float32: (1e-5, 1e-6), np.float16: (2e-3, 2e-3), np.float64: (1e-12, 1e-12)}[np.dtype(dt).type]
        np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), equal_nan=True,
                                   rtol=rtol if rtol is not None else r0, atol=atol if atol is not None else a0)
    else:
        np.testing.assert_array_equal(got, ref)


# -- the table ----------------------------------------------------------------------------------------------------


def test_every_primitive_is_implemented():
    assert DEV.missing_kernels() == []
    assert set(primitives.names()) <= set(K)
    assert all(not getattr(fn, "is_fallback", False) for fn in DEV.table.values())


def test_backend_reports_itself():
    from singa import plugins

    backend = plugins.get_backend("cpu")
    info = backend.info()
    assert backend.distribution == "singa-backend-cpu"
    assert "OpenBLAS" in info["blas"]
    assert "-fopenmp" in info["compiler flags"]
    assert DEV.backend_name == "cpu"
    assert "cpu:0" in DEV.description()


def test_threads_setting_round_trips():
    before = singa_backend_cpu.get_num_threads()
    try:
        singa_backend_cpu.set_num_threads(1)
        assert singa_backend_cpu.get_num_threads() == 1
        x = sample(np.float32, (1 << 20,))
        one = empty((), np.float32)
        K["reduce_sum"](one, put(x), axes=(0,))
        singa_backend_cpu.set_num_threads(2)
        two = empty((), np.float32)
        K["reduce_sum"](two, put(x), axes=(0,))
        assert get(one) == get(two)  # partial sums are combined in a fixed order: the same bits either way
    finally:
        singa_backend_cpu.set_num_threads(before)
    with pytest.raises(ValueError, match="at least 1"):
        singa_backend_cpu.set_num_threads(0)


def test_thread_counts_are_validated_and_capped():
    before = singa_backend_cpu.get_num_threads()
    cap = singa_backend_cpu.MAX_THREADS_PER_CORE * len(os.sched_getaffinity(0))
    try:
        for n in (65535, 32768, cap + 1):
            with pytest.warns(RuntimeWarning, match=f"asks for {n} threads.*using {cap}"):
                singa_backend_cpu.set_num_threads(n)
            assert singa_backend_cpu.get_num_threads() == cap
        singa_backend_cpu.set_num_threads(cap)  # the cap itself is allowed, without a warning
        for bad in (2.5, "4", None, True):
            with pytest.raises(TypeError, match="must be an integer"):
                singa_backend_cpu.set_num_threads(bad)
        with pytest.raises(ValueError, match="at least 1"):
            singa_backend_cpu.set_num_threads(-3)
    finally:
        singa_backend_cpu.set_num_threads(before)


@pytest.mark.parametrize(("env", "want", "warning"), [
    ({"SINGA_NUM_THREADS": "65535"}, "cap", "SINGA_NUM_THREADS=65535 asks for 65535 threads"),
    ({"OMP_NUM_THREADS": "32768"}, "cap", "OMP_NUM_THREADS=32768 asks for 32768 threads"),
    ({"OMP_NUM_THREADS": "32768,4"}, "cap", "asks for 32768 threads"),
    ({"SINGA_NUM_THREADS": "abc", "OMP_NUM_THREADS": "1"}, "1", "SINGA_NUM_THREADS='abc' is not a positive integer"),
    ({"SINGA_NUM_THREADS": "-2"}, "cores", "SINGA_NUM_THREADS='-2' is not a positive integer"),
    ({"SINGA_NUM_THREADS": "0"}, "cores", "SINGA_NUM_THREADS='0' is not a positive integer"),
    ({"SINGA_NUM_THREADS": "2"}, "2", None),
])
def test_thread_count_environment(env, want, warning):
    """The process starts, runs a parallel kernel and reports the capped count (65535 threads used to segfault)."""
    code = ("import numpy as np; from singa import device, ops; import singa_backend_cpu as c; "
            "x = ops.from_numpy(np.ones(1 << 22, np.float32), device.get_device('cpu')); "
            "s = float(ops.to_numpy(ops.sum(x))); assert s == 1 << 22, s; print(c.get_num_threads())")
    clean = {k: v for k, v in os.environ.items() if k not in ("SINGA_NUM_THREADS", "OMP_NUM_THREADS")}
    r = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    cores = len(os.sched_getaffinity(0))
    expect = {"cap": singa_backend_cpu.MAX_THREADS_PER_CORE * cores, "cores": cores}.get(want) or int(want)
    assert int(r.stdout.split()[-1]) == expect
    if warning is None:
        assert "RuntimeWarning" not in r.stderr, r.stderr
    else:
        assert warning in r.stderr, r.stderr


# -- memory -------------------------------------------------------------------------------------------------------


def test_buffers_are_64_byte_aligned_and_round_trip():
    for n in (1, 3, 1000, 1 << 20):
        buf = DEV.alloc(n)
        assert int(ffi.cast("uintptr_t", buf.handle)) % 64 == 0
    x = sample(np.float32, (5, 7))
    v = put(x)
    np.testing.assert_array_equal(get(v), x)
    w = empty((5, 7), np.float32)
    DEV.copy_view(w, v)
    np.testing.assert_array_equal(get(w), x)


@pytest.mark.parametrize("dt", ALL_NP)
def test_fill(dt):
    for shape in [(), (0, 3), (4, 5), (300, 700)]:
        out = empty(shape, dt)
        value = {np.float32: -2.5, np.float16: 0.333, np.int32: -7, np.int64: 2 ** 40 + 3, np.bool_: True,
                 np.float64: 1 / 3}[dt]
        K["fill"](out, value)
        np.testing.assert_array_equal(get(out), np.full(shape, value, dt))
    base = put(np.zeros((4, 6), dt))
    K["fill"](View(base.buffer, base.dtype, (4, 3), (6, 2), 1), 1)
    ref = np.zeros((4, 6), dt)
    ref[:, 1::2] = 1
    np.testing.assert_array_equal(get(base), ref)


def test_fill_out_of_range_float_becomes_inf():
    out = empty((2,), np.float16)
    K["fill"](out, 1e6)
    assert np.all(np.isinf(get(out)))


@pytest.mark.parametrize("dt", ALL_NP)
def test_copy_between_layouts(dt):
    x = sample(dt, (6, 5, 4))
    for shape, strides, offset in [((4, 5, 6), (1, 4, 20), 0), ((5, 4), (4, 1), 20), ((3, 2), (40, 3), 7),
                                   ((6, 5, 4), (20, 4, 1), 0), ((), (), 11), ((0, 4), (4, 1), 0),
                                   ((2, 5, 3), (0, 4, 1), 1)]:
        out = empty(shape, dt)
        K["copy"](out, strided_view(x, shape, strides, offset))
        np.testing.assert_array_equal(get(out), host_strided(x, shape, strides, offset))
    # strided destination
    dst = put(np.zeros((4, 6), dt))
    src = sample(dt, (4, 3))
    K["copy"](View(dst.buffer, dst.dtype, (4, 3), (6, 2), 0), put(src))
    np.testing.assert_array_equal(get(dst)[:, ::2], src)


def test_copy_large_transposed_uses_threads_correctly():
    x = sample(np.float32, (700, 900))
    out = empty((900, 700), np.float32)
    K["copy"](out, strided_view(x, (900, 700), (1, 900)))
    np.testing.assert_array_equal(get(out), x.T)


@pytest.mark.parametrize("src", ALL_NP)
@pytest.mark.parametrize("dst", ALL_NP)
def test_cast_every_pair(src, dst):
    x = (RNG.standard_normal(301) * 50).astype(src) if src != np.bool_ else RNG.random(301) < 0.5
    if src in FLOAT_NP:
        x[:3] = [0.0, -0.0, 2.5]
    out = empty(x.shape, dst)
    K["cast"](out, put(x))
    if dst == np.bool_:
        ref = x != 0
    elif np.issubdtype(dst, np.integer) and np.issubdtype(x.dtype, np.floating):
        ref = np.trunc(x).astype(dst)  # toward zero
    else:
        ref = x.astype(dst)
    np.testing.assert_array_equal(get(out), ref)
    # strided source
    out = empty((100,), dst)
    K["cast"](out, strided_view(x, (100,), (3,), 1))
    np.testing.assert_array_equal(get(out), ref[1::3][:100])


def test_cast_large_int_to_half_rounds_once():
    x = np.array([2049, 4095, 65519, 70000, -70000], np.int64)
    out = empty(x.shape, np.float16)
    K["cast"](out, put(x))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(get(out), x.astype(np.float16))


@pytest.mark.parametrize("dt", ALL_NP)
def test_where_broadcast(dt):
    cond = RNG.random((4, 1, 6)) < 0.5
    a = sample(dt, (1, 5, 6))
    b = sample(dt, (4, 5, 1))
    shape = (4, 5, 6)
    out = empty(shape, dt)
    K["where"](out, strided_view(cond, shape, (6, 0, 1)), strided_view(a, shape, (0, 6, 1)),
               strided_view(b, shape, (5, 1, 0)))
    np.testing.assert_array_equal(get(out), np.where(cond, a, b))
    out = empty(shape, dt)
    c2, a2, b2 = np.broadcast_arrays(cond, a, b)
    K["where"](out, put(c2.copy()), put(a2.copy()), put(b2.copy()))
    np.testing.assert_array_equal(get(out), np.where(cond, a, b))


# -- element-wise -------------------------------------------------------------------------------------------------

_PARAMS = {"clip": (-1.0, 1.5), "hardsigmoid": (0.2, 0.5), "selu": (1.67, 1.05)}


def _elementwise_cases():
    for entry in expressions.TABLE.values():
        for dt in entry.kernel_dtypes:
            yield pytest.param(entry.name, dt, id=f"{entry.name}-{dtypes.name(dt)}")


def _reference(entry, xs, dt, params):
    npdt = NP[dt]
    out_dt = np.bool_ if entry.out_bool else npdt
    if npdt in FLOAT_NP:
        args = [x.astype(np.float64) for x in xs]
        kw = {k: np.float64(v) for k, v in params.items()}
    else:
        args = list(xs)
        kw = dict(params)
    with np.errstate(all="ignore"):
        r = np.asarray(entry.ref(*args, **kw))
    return r.astype(out_dt) if (entry.out_bool or npdt not in FLOAT_NP) else r


@pytest.mark.parametrize(("name", "dt"), list(_elementwise_cases()))
def test_elementwise_matches_reference(name, dt):
    entry = expressions.TABLE[name]
    npdt = NP[dt]
    out_dt = np.bool_ if entry.out_bool else npdt
    values = dict(zip(entry.params, _PARAMS.get(name, (0.3, 1.7))))
    for shape in [(3, 5, 7), (), (0, 4), (70000,)]:  # the last one goes through the threaded path
        xs = [sample(npdt, shape, entry.domain) for _ in range(entry.arity)]
        out = empty(shape, out_dt)
        K[name](out, *[put(x) for x in xs], **values)
        close(get(out), _reference(entry, xs, dt, values), out_dt)


@pytest.mark.parametrize(("name", "dt"), list(_elementwise_cases()))
def test_elementwise_strided_and_broadcast(name, dt):
    entry = expressions.TABLE[name]
    npdt = NP[dt]
    out_dt = np.bool_ if entry.out_bool else npdt
    values = dict(zip(entry.params, _PARAMS.get(name, (0.3, 1.7))))
    shape = (4, 3, 5)
    if entry.arity == 1:
        x = sample(npdt, (5, 3, 4), entry.domain)
        views = [strided_view(x, shape, (1, 4, 12))]  # a transpose
        hosts = [x.transpose(2, 1, 0)]
    else:
        a = sample(npdt, (4, 1, 5), entry.domain)
        b = sample(npdt, (3, 1), entry.domain)
        views = [strided_view(a, shape, (5, 0, 1)), strided_view(b, shape, (0, 1, 0))]
        hosts = [np.broadcast_to(a, shape), np.broadcast_to(b, shape)]
    out = empty(shape, out_dt)
    K[name](out, *views, **values)
    close(get(out), _reference(entry, hosts, dt, values), out_dt)


@pytest.mark.parametrize("dt", [np.float32, np.float16, np.float64, np.int32, np.int64])
def test_binary_broadcast_large_uses_threads_correctly(dt):
    a = sample(dt, (300, 1000))
    b = sample(dt, (1, 1000))
    out = empty((300, 1000), dt)
    K["add"](out, put(a), strided_view(b, (300, 1000), (0, 1)))
    close(get(out), a.astype(np.float64) + b, dt)
    out = empty((300, 1000), dt)
    K["mul"](out, strided_view(b, (300, 1000), (0, 1)), strided_view(a, (300, 1000), (1000, 1)))
    close(get(out), a.astype(np.float64) * b, dt)
    col = sample(dt, (1, 300000))
    out = empty((2, 300000), dt)  # two rows only: each row is split between threads
    K["sub"](out, strided_view(col, (2, 300000), (0, 1)), strided_view(col[:, ::-1].copy(), (2, 300000), (0, 1)))
    close(get(out), np.broadcast_to(col - col[:, ::-1], (2, 300000)).astype(np.float64), dt)


def test_elementwise_in_place():
    x = sample(np.float32, (1000,))
    v = put(x)
    K["add"](v, v, v)
    close(get(v), 2.0 * x, np.float32)
    K["exp"](v, v)
    close(get(v), np.exp(2.0 * x.astype(np.float64)), np.float32)


def test_elementwise_rejects_mismatched_dtypes_and_shapes():
    with pytest.raises(TypeError, match="add"):
        K["add"](empty((3,), np.float32), put(np.ones(3, np.float32)), put(np.ones(3, np.int32)))
    with pytest.raises(TypeError, match="exp"):
        K["exp"](empty((3,), np.int32), put(np.ones(3, np.int32)))
    with pytest.raises(ValueError, match="broadcast"):
        K["add"](empty((3,), np.float32), put(np.ones(3, np.float32)), put(np.ones(4, np.float32)))


@pytest.mark.parametrize("dt", [np.int32, np.int64])
def test_integer_division_by_zero_is_zero_and_truncates(dt):
    low = np.iinfo(dt).min  # low / -1 overflows: it wraps like numpy instead of trapping (SIGFPE) on x86
    a = np.array([7, -7, 7, -7, 5, 0, low, low], dt)
    b = np.array([2, 2, -2, -2, 0, 0, -1, 1], dt)
    for name, ref in [("div", [3, -3, -3, 3, 0, 0, low, low]), ("fmod", [1, -1, 1, -1, 0, 0, 0, 0]),
                      ("mod", [1, 1, -1, -1, 0, 0, 0, 0])]:
        out = empty(a.shape, dt)
        K[name](out, put(a), put(b))
        np.testing.assert_array_equal(get(out), np.array(ref, dt), err_msg=name)


def test_nan_and_inf_semantics():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0], np.float32)
    y = np.array([1.0, np.nan, 2.0, -0.0, np.nan, 0.5], np.float32)
    for name, ref in [("maximum", np.maximum(x, y)), ("minimum", np.minimum(x, y))]:
        out = empty(x.shape, np.float32)
        K[name](out, put(x), put(y))
        np.testing.assert_array_equal(get(out), ref, err_msg=name)
    for name, ref in [("isnan", np.isnan(x)), ("isinf", np.isinf(x))]:
        out = empty(x.shape, np.bool_)
        K[name](out, put(x))
        np.testing.assert_array_equal(get(out), ref, err_msg=name)


def test_vectorised_exp_is_within_two_ulp():
    # every 997th float32 bit pattern with a finite, non-overflowing exp, plus the edges
    bits = np.arange(0, 2 ** 32, 997, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x) & (x > -110) & (x < 88.7)]
    out = empty(x.shape, np.float32)
    K["exp"](out, put(x))
    got = get(out).astype(np.float64)
    ref = np.exp(x.astype(np.float64))
    ulp = np.maximum(np.spacing(ref.astype(np.float32)).astype(np.float64), 2.0 ** -149)
    assert np.max(np.abs(got - ref) / ulp) <= 2.0
    edge = np.array([np.nan, np.inf, -np.inf, 89.0, 88.8, -87.5, -103.5, -104.0, -200.0, 0.0], np.float32)
    out = empty(edge.shape, np.float32)
    K["exp"](out, put(edge))
    with np.errstate(over="ignore"):
        close(get(out), np.exp(edge.astype(np.float64)).astype(np.float32), np.float32, rtol=3e-7, atol=0)


def _finite_sweep(lo: float, hi: float, n: int) -> np.ndarray:
    """Every 997th float32 bit pattern that is finite, then n evenly spaced float32 values over [lo, hi]."""
    x = np.arange(0, 2 ** 32, 997, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([x[np.isfinite(x)], np.linspace(lo, hi, n, dtype=np.float32)])


def test_vectorised_erf_is_within_three_ulp():
    # every 997th float32 bit pattern (all of them finite: erf saturates), a fine sweep of [-5, 5], then the edges;
    # the reference is math.erf in float64
    x = _finite_sweep(-5, 5, 200001)
    out = empty(x.shape, np.float32)
    K["erf"](out, put(x))
    got = get(out).astype(np.float64)
    ref = np.array([math.erf(v) for v in x.astype(np.float64)])
    ulp = np.maximum(np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64), 2.0 ** -149)
    assert np.max(np.abs(got - ref) / ulp) <= 3.0
    edge = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-40, 0.921875, 3.9375, 3.93, 10.0], np.float32)
    out = empty(edge.shape, np.float32)
    K["erf"](out, put(edge))
    want = np.array([math.erf(v) if not np.isnan(v) else np.nan for v in edge.astype(np.float64)], np.float32)
    close(get(out), want, np.float32, rtol=3e-7, atol=0)
    assert np.signbit(get(out)[4])  # erf(-0) = -0


def test_vectorised_gelu_keeps_the_negative_tail():
    # gelu(x) = x Phi(x) against 0.5 x erfc(-x / sqrt 2) in float64: the positive side within a few ulp, the negative
    # side to a relative 5e-6 over [-6, 0] and 2e-5 down to where the results leave the normal range (the erf form,
    # 0.5 x (1 + erf), loses that tail to cancellation: 8e-5 at -6, all digits by -10), flushed to 0 below
    x = _finite_sweep(-14, 14, 280001)
    out = empty(x.shape, np.float32)
    K["gelu"](out, put(x))
    got = get(out).astype(np.float64)
    xd = x.astype(np.float64)
    ref = np.array([0.5 * v * math.erfc(-v / math.sqrt(2.0)) for v in xd])
    pos = xd >= 0
    ulp = np.spacing(np.abs(ref[pos]).astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got[pos] - ref[pos]) / np.maximum(ulp, 2.0 ** -149)) <= 8.0
    rel = np.abs(got - ref) / np.maximum(np.abs(ref), 1e-300)
    normal = ~pos & (np.abs(ref) >= 2e-38)  # results in the normal range (tiny negative x give subnormal ones too)
    assert np.max(rel[normal & (xd >= -6)]) <= 5e-6
    assert np.max(rel[normal]) <= 2e-5
    assert np.all(np.abs(got[~pos & ~normal] - ref[~pos & ~normal]) <= 2e-38)
    edge = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, -1e-40, 1e-30, -20.0, 30.0], np.float32)
    out = empty(edge.shape, np.float32)
    K["gelu"](out, put(edge))
    got = get(out)
    with np.errstate(invalid="ignore"):  # -inf: the table's 0.5 x (1 + erf(x / sqrt 2)) is -inf * 0, NaN
        want = 0.5 * edge * (1 + np.array([math.erf(v / math.sqrt(2.0)) if np.isfinite(v) else np.sign(v)
                                          for v in edge.astype(np.float64)], np.float32))
    close(got, want, np.float32, rtol=3e-7, atol=0)
    assert np.signbit(got[4])  # gelu(-0) = -0
    assert np.signbit(got[7])  # the flushed tail keeps its sign


def test_vectorised_tanh_is_within_three_ulp():
    # every 997th float32 bit pattern, a fine sweep of [-12, 12], then the edges; the reference is numpy in float64
    x = _finite_sweep(-12, 12, 200001)
    out = empty(x.shape, np.float32)
    K["tanh"](out, put(x))
    got = get(out).astype(np.float64)
    ref = np.tanh(x.astype(np.float64))
    ulp = np.maximum(np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64), 2.0 ** -149)
    assert np.max(np.abs(got - ref) / ulp) <= 3.0
    edge = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-40, 0.625, 44.0, 100.0, -9.0], np.float32)
    out = empty(edge.shape, np.float32)
    K["tanh"](out, put(edge))
    close(get(out), np.tanh(edge.astype(np.float64)).astype(np.float32), np.float32, rtol=3e-7, atol=0)
    assert np.signbit(get(out)[4])  # tanh(-0) = -0


# -- reductions ---------------------------------------------------------------------------------------------------

_REDUCE_REF = {"reduce_sum": np.sum, "reduce_mean": np.mean, "reduce_max": np.max, "reduce_min": np.min,
               "reduce_prod": np.prod}
_AXES = [(), (0,), (3,), (1, 2), (0, 2), (0, 3), (1, 3), (0, 1, 2, 3), (0, 2, 3)]


@pytest.mark.parametrize("name", list(_REDUCE_REF))
@pytest.mark.parametrize("dt", FLOAT_NP)
def test_float_reductions(name, dt):
    rtol = {np.float32: 1e-5, np.float16: 3e-3, np.float64: 1e-12}[dt]
    x = sample(dt, (4, 5, 6, 7), (0.5, 1.5) if name == "reduce_prod" else (-3, 3))
    for axes in _AXES:
        ref = _REDUCE_REF[name](x.astype(np.float64), axis=axes) if axes else x.astype(np.float64)
        out = empty(np.shape(ref), dt)
        K[name](out, put(x), axes=axes)
        close(get(out), ref, dt, rtol=rtol)
    for shape, axes in [((), ()), ((1, 1), (0,)), ((1, 1), ()), ((3, 1), (1,))]:  # nothing, or size-1 axes, to reduce
        x = sample(dt, shape, (0.5, 1.5))
        ref = _REDUCE_REF[name](x.astype(np.float64), axis=axes) if axes else x.astype(np.float64)
        out = empty(np.shape(ref), dt)
        K[name](out, put(x), axes=axes)
        close(get(out), ref, dt, rtol=rtol)


@pytest.mark.parametrize("name", list(_REDUCE_REF))
@pytest.mark.parametrize("dt", [np.int32, np.int64])
def test_integer_reductions(name, dt):
    x = RNG.integers(-3, 4, (4, 5, 6)).astype(dt)
    for axes in [(0,), (2,), (0, 2), (0, 1, 2), ()]:
        if name == "reduce_mean":
            n = math.prod(x.shape[a] for a in axes) if axes else 1
            s = np.sum(x.astype(np.int64), axis=axes)
            ref = np.sign(s) * (np.abs(s) // n)  # truncation toward zero
        else:
            ref = _REDUCE_REF[name](x.astype(np.int64), axis=axes)
        out = empty(np.shape(ref), dt)
        K[name](out, put(x), axes=axes)
        np.testing.assert_array_equal(get(out), np.asarray(ref).astype(dt), err_msg=f"{name} {axes}")


def test_bool_reductions_count():
    x = RNG.random((30, 40)) < 0.3
    out = empty((40,), np.int64)
    K["reduce_sum"](out, put(x), axes=(0,))
    np.testing.assert_array_equal(get(out), x.sum(axis=0))
    out = empty((30,), np.bool_)
    K["reduce_max"](out, put(x), axes=(1,))
    np.testing.assert_array_equal(get(out), x.any(axis=1))


def test_large_sums_are_accurate_on_every_path():
    x = RNG.random(1 << 23).astype(np.float32)
    out = empty((), np.float32)
    K["reduce_sum"](out, put(x), axes=(0,))
    close(get(out), x.astype(np.float64).sum(), np.float32, rtol=1e-6)
    m = x.reshape(512, -1)
    for axes in [(0,), (1,)]:
        out = empty((m.shape[1 - axes[0]],), np.float32)
        K["reduce_sum"](out, put(m), axes=axes)
        close(get(out), m.astype(np.float64).sum(axis=axes), np.float32, rtol=1e-6)
    t = x.reshape(8, 1024, -1)
    out = empty((1024,), np.float32)
    K["reduce_max"](out, put(t), axes=(0, 2))
    close(get(out), t.max(axis=(0, 2)), np.float32)


@pytest.mark.parametrize("name", list(_REDUCE_REF))
@pytest.mark.parametrize("dt", [np.float32, np.float64, np.float16, np.int32])
def test_reductions_over_a_middle_axis_with_short_kept_rows(name, dt):
    """A kept innermost group under a reduced one (a channel-blocked layout's pixel means: (N, C/B, H*W, B) over
    H*W) is accumulated a whole reduced group per call, in registers for sums of 8-element multiples: rows of 8,
    16, 24, 64 and others, serial and threaded, against float64 numpy."""
    cases = [((1, 125, 169, 8), (2,)), ((8, 32, 49, 16), (2,)), ((3, 4, 5, 24), (0, 2)), ((2, 64, 300, 16), (0, 2)),
             ((5, 7, 64), (1,)), ((4, 9, 12), (0, 1)), ((6, 11, 72), (1,)), ((2, 3, 40, 8), (1, 2))]
    for shape, axes in cases:
        if np.issubdtype(dt, np.integer):
            x = RNG.integers(-3, 4, shape).astype(dt)
            if name == "reduce_prod":
                x = np.where(x == 0, 1, np.sign(x)).astype(dt)
        else:
            x = sample(dt, shape, (0.9, 1.1) if name == "reduce_prod" else (-3, 3))
        wide = x.astype(np.int64 if np.issubdtype(dt, np.integer) else np.float64)
        ref = _REDUCE_REF[name](wide, axis=axes)
        if np.issubdtype(dt, np.integer) and name == "reduce_mean":
            s, n = np.sum(wide, axis=axes), math.prod(shape[a] for a in axes)
            ref = np.sign(s) * (np.abs(s) // n)
        out = empty(np.shape(ref), dt)
        K[name](out, put(x), axes=axes)
        if np.issubdtype(dt, np.integer):
            np.testing.assert_array_equal(get(out), np.asarray(ref).astype(dt), err_msg=f"{name} {shape} {axes}")
        else:
            close(get(out), ref, dt, rtol={np.float32: 1e-5, np.float16: 3e-3, np.float64: 1e-12}[dt])


def test_reductions_of_empty_and_nan():
    x = np.zeros((3, 0), np.float32)
    out = empty((3,), np.float32)
    K["reduce_sum"](out, put(x), axes=(1,))
    np.testing.assert_array_equal(get(out), np.zeros(3))
    K["reduce_mean"](out, put(x), axes=(1,))
    assert np.all(np.isnan(get(out)))
    K["reduce_prod"](out, put(x), axes=(1,))
    np.testing.assert_array_equal(get(out), np.ones(3))
    with pytest.raises(ValueError, match="reduce_max"):
        K["reduce_max"](out, put(x), axes=(1,))
    y = np.array([[1.0, np.nan, 3.0], [1.0, 2.0, 3.0]], np.float32)
    for name, ref in [("reduce_max", np.max(y, axis=1)), ("reduce_min", np.min(y, axis=1))]:
        out = empty((2,), np.float32)
        K[name](out, put(y), axes=(1,))
        np.testing.assert_array_equal(get(out), ref)
        out = empty((3,), np.float32)
        K[name](out, put(y), axes=(0,))
        np.testing.assert_array_equal(get(out), _REDUCE_REF[name](y, axis=0))


@pytest.mark.parametrize("dt", ALL_NP)
@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_argmin(dt, name):
    x = sample(dt, (4, 5, 6)) if dt != np.bool_ else RNG.random((4, 5, 6)) < 0.5
    ref_fn = np.argmax if name == "argmax" else np.argmin
    for axis in (0, 1, 2, -1):
        ref = ref_fn(x, axis=axis)
        out = empty(ref.shape, np.int64)
        K[name](out, put(x), axis=axis)
        np.testing.assert_array_equal(get(out), ref, err_msg=f"axis {axis}")


def test_argmax_ties_and_nan_follow_numpy():
    x = np.array([[1.0, 3.0, 3.0, np.nan, np.nan], [2.0, 2.0, 1.0, 0.0, 2.0]], np.float32)
    for name, fn in [("argmax", np.argmax), ("argmin", np.argmin)]:
        for axis in (0, 1):
            out = empty(fn(x, axis=axis).shape, np.int64)
            K[name](out, put(x), axis=axis)
            np.testing.assert_array_equal(get(out), fn(x, axis=axis))


# -- matrix product -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", [np.float32, np.float16, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("batches", [(1, 1, 1), (3, 3, 3), (3, 1, 3), (3, 3, 1)])
def test_matmul(dt, ta, tb, batches):
    batch, ba, bb = batches
    m, n, k = 5, 6, 7
    a = sample(dt, (ba, k, m) if ta else (ba, m, k))
    b = sample(dt, (bb, n, k) if tb else (bb, k, n))
    c = sample(dt, (batch, m, n))
    A = np.swapaxes(a, 1, 2) if ta else a
    B = np.swapaxes(b, 1, 2) if tb else b
    product = np.matmul(A.astype(np.float64), B.astype(np.float64))
    out = empty((batch, m, n), dt)
    K["matmul"](out, put(a), put(b), trans_a=ta, trans_b=tb)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dt == np.float32 else {}
    close(get(out), product.astype(dt) if np.issubdtype(dt, np.integer) else product, dt, **tol)
    if dt != np.int32 and dt != np.int64:
        out = put(c)
        K["matmul"](out, put(a), put(b), trans_a=ta, trans_b=tb, alpha=0.5, beta=-2.0)
        close(get(out), 0.5 * product - 2.0 * c.astype(np.float64), dt, **tol)


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize(("batch", "ba", "bb", "m", "n", "k"), [
    (1, 1, 1, 300, 120, 90),  # split by rows
    (1, 1, 1, 70, 400, 90),  # split by columns
    (8, 8, 8, 64, 64, 64),  # whole products per thread
    (8, 1, 8, 64, 48, 64),
    (3, 3, 1, 100, 100, 100),  # batch folded into rows when a is not transposed
])
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_matmul_threaded_paths(ta, tb, batch, ba, bb, m, n, k, dt):
    a = sample(dt, (ba, k, m) if ta else (ba, m, k))
    b = sample(dt, (bb, n, k) if tb else (bb, k, n))
    c = sample(dt, (batch, m, n))
    A = np.swapaxes(a, 1, 2) if ta else a
    B = np.swapaxes(b, 1, 2) if tb else b
    out = put(c)
    K["matmul"](out, put(a), put(b), trans_a=ta, trans_b=tb, alpha=1.5, beta=0.5)
    tol = {"rtol": 1e-4, "atol": 1e-4} if dt == np.float32 else {}
    close(get(out), 1.5 * np.matmul(A.astype(np.float64), B) + 0.5 * c, dt, **tol)


@pytest.mark.parametrize("dt", [np.float32, np.float64, np.int32])
def test_matmul_reads_strided_heads_in_place_eagerly_and_bound(dt):
    # matmul's strided operands (strided_operands): the heads of a (batch, seq, 3 * heads * dim) tensor as (batch,
    # heads, seq, dim) views with two batch strides and rows 3 * heads * dim apart, k transposed; and a b whose batch
    # axes split the same flat batch as (3, 2), transposed in memory. float64 numpy; bound launches replay new contents
    # (none where a copy would be needed: an integer's strided operands, the strided other split)
    batch, heads, seq, dim = 2, 3, 5, 4
    row = 3 * heads * dim
    qkv = put(np.zeros((batch, seq, row), dt))
    q = View(qkv.buffer, qkv.dtype, (batch, heads, seq, dim), (seq * row, dim, row, 1), 0)
    k = View(qkv.buffer, qkv.dtype, (batch, heads, seq, dim), (seq * row, dim, row, 1), heads * dim)
    other = put(np.zeros((2, 3, seq, dim), dt))
    k_other = View(other.buffer, other.dtype, (3, 2, seq, dim), (seq * dim, 3 * seq * dim, dim, 1), 0)
    out, out2 = empty((batch * heads, seq, seq), dt), empty((batch * heads, seq, seq), dt)
    bound = K["matmul"].bind(out, q, k, trans_b=True)
    assert (bound is None) == (dt == np.int32)
    assert K["matmul"].bind(out2, q, k_other, trans_b=True) is None
    for step in range(2):
        x = RNG.integers(-4, 5, (batch, seq, row)).astype(dt)
        y = RNG.integers(-4, 5, (2, 3, seq, dim)).astype(dt)
        DEV.write(qkv, x)
        DEV.write(other, y)
        if step == 0 or bound is None:
            K["matmul"](out, q, k, trans_b=True)
        else:
            bound()
        K["matmul"](out2, q, k_other, trans_b=True)
        h = x.astype(np.float64).reshape(batch, seq, 3, heads, dim).transpose(2, 0, 3, 1, 4)
        qf, kf = (h[i].reshape(batch * heads, seq, dim) for i in (0, 1))
        np.testing.assert_array_equal(get(out), (qf @ kf.swapaxes(-1, -2)).astype(dt))
        flat = y.astype(np.float64).transpose(1, 0, 2, 3).reshape(batch * heads, seq, dim)  # (3, 2) row-major
        np.testing.assert_array_equal(get(out2), (qf @ flat.swapaxes(-1, -2)).astype(dt))


def test_matmul_edges():
    # k == 0 gives zeros (beta == 0 never reads the output, even when it holds NaN)
    out = put(np.full((1, 3, 4), np.nan, np.float32))
    K["matmul"](out, put(np.zeros((1, 3, 0), np.float32)), put(np.zeros((1, 0, 4), np.float32)))
    np.testing.assert_array_equal(get(out), np.zeros((1, 3, 4)))
    # 2-D operands and a large product through OpenBLAS
    a = sample(np.float32, (300, 200))
    b = sample(np.float32, (200, 100))
    out = empty((300, 100), np.float32)
    K["matmul"](out, put(a), put(b))
    close(get(out), a.astype(np.float64) @ b, np.float32, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="matmul"):
        K["matmul"](empty((1, 3, 4), np.float32), put(np.zeros((1, 3, 5), np.float32)),
                    put(np.zeros((1, 6, 4), np.float32)))


# -- convolution --------------------------------------------------------------------------------------------------


def conv_ref(x, w, b, stride, pad, dil, groups):
    """Direct float64 cross-correlation: pad, then add kh*kw shifted slices times the weights."""
    n, _, h, wd = x.shape
    k, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad[0], pad[2]), (pad[1], pad[3])))
    oh = (h + pad[0] + pad[2] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pad[1] + pad[3] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    y = np.zeros((n, k, oh, ow))
    kg = k // groups
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg, i * dil[0]:i * dil[0] + stride[0] * (oh - 1) + 1:stride[0],
                           j * dil[1]:j * dil[1] + stride[1] * (ow - 1) + 1:stride[1]]
                y[:, g * kg:(g + 1) * kg] += np.einsum("nchw,kc->nkhw", patch, w[g * kg:(g + 1) * kg, :, i, j])
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y


def conv_grads_ref(x, w, dy, stride, pad, dil, groups):
    """dx and dw by the adjoint of conv_ref (exact in float64)."""
    n, c, h, wd = x.shape
    k, cg, kh, kw = w.shape
    oh, ow = dy.shape[2:]
    kg = k // groups
    grown = (h + pad[0] + pad[2] + stride[0] * kh * dil[0], wd + pad[1] + pad[3] + stride[1] * kw * dil[1])
    dxp = np.zeros((n, c) + grown)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad[0], dxp.shape[2] - h - pad[0]),
                                       (pad[1], dxp.shape[3] - wd - pad[1])))
    dw = np.zeros(w.shape)
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                hs = slice(i * dil[0], i * dil[0] + stride[0] * (oh - 1) + 1, stride[0])
                ws = slice(j * dil[1], j * dil[1] + stride[1] * (ow - 1) + 1, stride[1])
                d = dy[:, g * kg:(g + 1) * kg].astype(np.float64)
                dxp[:, g * cg:(g + 1) * cg, hs, ws] += np.einsum("nkhw,kc->nchw", d, w[g * kg:(g + 1) * kg, :, i, j])
                dw[g * kg:(g + 1) * kg, :, i, j] = np.einsum("nkhw,nchw->kc", d, xp[:, g * cg:(g + 1) * cg, hs, ws])
    return dxp[:, :, pad[0]:pad[0] + h, pad[1]:pad[1] + wd], dw


CONV_CASES = [
    # N, C, H, W, K, kh, kw, stride, padding (t, l, b, r), dilation, groups
    (2, 3, 7, 6, 4, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (3, 4, 9, 8, 6, 3, 2, (2, 1), (0, 2, 1, 0), (1, 2), 2),
    (2, 4, 5, 5, 4, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),  # pointwise: x is read as it is
    (5, 4, 4, 4, 2, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 2),  # pointwise, images batched
    (1, 8, 33, 40, 16, 5, 5, (2, 2), (2, 2, 2, 2), (1, 1), 4),
    (40, 3, 8, 8, 5, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),  # small images batched into one product
    (2, 6, 6, 6, 6, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 6),  # depthwise
    (1, 2, 3, 3, 3, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1), 1),  # kernel larger than the input
    # large enough for threads to take whole images, each with its own scratch (and its own dw sum)
    (8, 8, 16, 16, 16, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 2),
    (64, 4, 6, 6, 8, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),  # ... small images batched within each thread
    (16, 32, 8, 8, 32, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),  # ... pointwise, batched
    (4, 16, 32, 32, 16, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),  # ... pointwise, read in place
    (3, 16, 20, 20, 24, 3, 3, (2, 2), (1, 0, 2, 1), (2, 1), 1),  # ... more threads than images would be idle
    (1, 64, 32, 32, 96, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 4),  # grouped pointwise, fewer images than threads:
    (2, 48, 9, 9, 24, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 3),  # ... whole (image, group) products per thread
]


# float32 runs on each provider: the backend's own kernels (SINGA_ONEDNN=0), oneDNN in blocked layouts (=1) and
# oneDNN on NCHW (=nchw), wherever oneDNN takes the shape
CONV_PROVIDERS = [(np.float32, "0"), (np.float32, "1"), (np.float32, "nchw"), (np.float16, "0"), (np.float64, "0")]


@pytest.mark.parametrize("case", CONV_CASES, ids=[str(i) for i in range(len(CONV_CASES))])
@pytest.mark.parametrize(("dt", "onednn_mode"), CONV_PROVIDERS,
                         ids=["float32-own", "float32-onednn", "float32-onednn-nchw", "float16", "float64"])
def test_conv2d_forward_and_backward(case, dt, onednn_mode, monkeypatch):
    from singa_backend_cpu import onednn

    monkeypatch.setenv("SINGA_ONEDNN", onednn_mode)
    onednn.reset()
    n, c, h, wd, k, kh, kw, stride, pad, dil, groups = case
    x = sample(dt, (n, c, h, wd))
    w = sample(dt, (k, c // groups, kh, kw))
    b = sample(dt, (k,))
    params = {"stride": stride, "padding": pad, "dilation": dil, "groups": groups}
    ref = conv_ref(x, w, b, stride, pad, dil, groups)
    # float32: sums of up to C*kh*kw products of about 3*3, added in an order each provider picks; a result near
    # zero carries the rounding error of the terms' scale, so the absolute tolerance follows that scale
    scale = float(np.max(np.abs(ref)))
    tol = {np.float32: {"rtol": 1e-4, "atol": 1e-4 + 4e-6 * scale}, np.float16: {"rtol": 1e-2, "atol": 5e-2},
           np.float64: {}}[dt]
    y = empty(ref.shape, dt)
    K["conv2d"](y, put(x), put(w), put(b), **params)
    close(get(y), ref, dt, **tol)
    y = empty(ref.shape, dt)
    K["conv2d"](y, put(x), put(w), None, **params)
    close(get(y), ref - b.astype(np.float64).reshape(1, -1, 1, 1), dt, **tol)
    dy = sample(dt, ref.shape)
    dx_ref, dw_ref = conv_grads_ref(x, w, dy, stride, pad, dil, groups)
    dx = empty(x.shape, dt)
    K["conv2d_backward_data"](dx, put(dy), put(w), **params)
    close(get(dx), dx_ref, dt, **tol)
    dw = empty(w.shape, dt)
    K["conv2d_backward_weight"](dw, put(dy), put(x), **params)
    close(get(dw), dw_ref, dt, **(tol if dt != np.float16 else {"rtol": 1e-2, "atol": 0.3}))
    used = set(onednn.choices().values())
    if onednn_mode == "0" or onednn.library() is None:
        assert used <= {onednn.OWN}
    else:  # oneDNN took every one of the four calls
        assert onednn.OWN not in used, onednn.choices()
    onednn.reset()


# 3x3 stride-1 convolutions of 16-channel multiples, which our own float32 kernels run by Winograd F(4x4, 3x3)
WINOGRAD_CASES = [
    # N, C, H, W, K, padding (t, l, b, r)
    (4, 16, 13, 11, 32, (1, 1, 1, 1)),  # planes that are not whole 4x4 tiles
    (3, 32, 9, 17, 16, (2, 0, 1, 2)),  # uneven padding
    (2, 48, 32, 32, 64, (0, 0, 0, 0)),
    (8, 64, 20, 20, 64, (1, 1, 1, 1)),  # several chunks of tiles per thread
]


def _winograd_geometry(case, ref_shape):
    n, c, h, wd, k, pad = case
    return ffi.new("int64_t[]", [n, c, h, wd, k, 3, 3, *ref_shape[2:], 1, 1, *pad, 1, 1, 1])


@pytest.mark.parametrize("case", WINOGRAD_CASES, ids=[str(i) for i in range(len(WINOGRAD_CASES))])
@pytest.mark.parametrize("on", [True, False], ids=["winograd", "direct"])
def test_winograd_convolutions_match_float64(case, on, monkeypatch):
    from singa_backend_cpu import onednn, table
    from singa_backend_cpu.device import lib

    monkeypatch.setenv("SINGA_ONEDNN", "0")  # our own kernels
    onednn.reset()
    n, c, h, wd, k, pad = case
    x, w, b = sample(np.float32, (n, c, h, wd)), sample(np.float32, (k, c, 3, 3)), sample(np.float32, (k,))
    ref = conv_ref(x, w, b, (1, 1), pad, (1, 1), 1)
    dy = sample(np.float32, ref.shape)
    dx_ref, _ = conv_grads_ref(x, w, dy, (1, 1), pad, (1, 1), 1)
    geometry = _winograd_geometry(case, ref.shape)
    lib.sg_set_winograd(on)
    try:
        assert lib.sg_conv2d_winograd(geometry, 0) == on  # the forward convolution takes the path ...
        assert lib.sg_conv2d_winograd(geometry, 1) == on  # ... and so does its data gradient
        y, dx = empty(ref.shape, np.float32), empty(x.shape, np.float32)
        K["conv2d"](y, put(x), put(w), put(b), padding=pad)
        K["conv2d_backward_data"](dx, put(dy), put(w), padding=pad)
    finally:
        lib.sg_set_winograd(table.WINOGRAD)
    # the transforms add terms up to 8x the inputs' size: Winograd's rounding error is ~10x the direct kernels',
    # measured up to 1e-5 of the largest output element on these and ResNet's layers
    for got, want in ((get(y), ref), (get(dx), dx_ref)):
        scale = float(np.max(np.abs(want)))
        close(got, want, np.float32, rtol=0, atol=(3e-5 if on else 4e-6) * scale)


def test_winograd_is_turned_off_by_singa_winograd_0():
    code = ("from singa_backend_cpu.device import lib; import singa_backend_cpu.table; "
            "print(lib.sg_get_winograd())")
    for setting, want in (("0", "0"), ("1", "1"), (None, "1")):
        env = {k: v for k, v in os.environ.items() if k != "SINGA_WINOGRAD"}
        if setting is not None:
            env["SINGA_WINOGRAD"] = setting
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split()[-1] == want, (setting, r.stdout)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_conv2d_post_ops_pass(dt):
    """sg_conv2d_post, conv2d_fused's residual add and ReLU in one pass (a replayed graph's output planned over its
    residual runs it into the residual's own bytes): y = t + r, then ReLU, NaN kept, r absent or y aliasing t or r."""
    from singa_backend_cpu.device import lib

    code = {np.float32: dtypes.float32, np.float64: dtypes.float64}[dt]
    n = 70001  # threaded, and not a multiple of any vector width
    t = RNG.standard_normal(n).astype(dt)
    r = RNG.standard_normal(n).astype(dt)
    t[:3] = [np.nan, -0.0, np.inf]
    for relu in (0, 1):
        for with_r in (False, True):
            want = (t.astype(np.float64) + (r if with_r else 0)).astype(dt)
            if relu:
                want = np.where(want < 0, dt(0), want)
            for into in ("new", "t", "r"):
                tv, rv = put(t), put(r)
                yv = {"new": empty((n,), dt), "t": tv, "r": rv}[into]
                assert lib.sg_conv2d_post(code, yv.buffer.handle, yv.offset, tv.buffer.handle, tv.offset,
                                          rv.buffer.handle if with_r else ffi.NULL, rv.offset if with_r else 0, n,
                                          relu) == 0
                np.testing.assert_array_equal(get(yv), want, err_msg=f"relu {relu} residual {with_r} into {into}")
    assert lib.sg_conv2d_post(dtypes.float16, ffi.NULL, 0, ffi.NULL, 0, ffi.NULL, 0, 1, 0) != 0  # not float16


def test_conv2d_rejects_bad_groups():
    with pytest.raises(ValueError, match="conv2d"):
        K["conv2d"](empty((1, 4, 3, 3), np.float32), put(np.zeros((1, 3, 3, 3), np.float32)),
                    put(np.zeros((4, 2, 1, 1), np.float32)), None, groups=2)


# -- pooling ------------------------------------------------------------------------------------------------------


def _window(i, j, kernel, stride, pad, dil, h, w):
    """Output (i, j)'s window: its tap rows, its tap columns, and its taps inside the input in scan order."""
    rows = [i * stride[0] - pad[0] + a * dil[0] for a in range(kernel[0])]
    cols = [j * stride[1] - pad[1] + b * dil[1] for b in range(kernel[1])]
    return rows, cols, [(r, q) for r in rows for q in cols if 0 <= r < h and 0 <= q < w]


def pool_ref(x, kernel, stride, pad, dil, mode, cip, oh, ow):
    n, c, h, w = x.shape
    y = np.zeros((n, c, oh, ow))
    idx = np.full((n, c, oh, ow), -1, np.int64)
    for i in range(oh):
        for j in range(ow):
            rows, cols, inside = _window(i, j, kernel, stride, pad, dil, h, w)
            padded = sum(1 for r in rows for q in cols if -pad[0] <= r < h + pad[2] and -pad[1] <= q < w + pad[3])
            if not inside:
                continue
            vals = np.stack([x[:, :, r, q] for r, q in inside], axis=-1).astype(np.float64)
            if mode == "max":
                best = np.argmax(vals, axis=-1)
                y[:, :, i, j] = np.take_along_axis(vals, best[..., None], -1)[..., 0]
                idx[:, :, i, j] = np.array([r * w + q for r, q in inside])[best]
            else:
                y[:, :, i, j] = vals.sum(-1) / (padded if cip else len(inside))
    return y, idx


POOL_CASES = [
    # N, C, H, W, kernel, stride, padding, dilation, mode, count_include_pad, ceil
    (2, 3, 8, 8, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), "max", False, False),
    (2, 3, 7, 9, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), "avg", True, True),
    (2, 3, 7, 9, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), "avg", False, True),
    (1, 2, 10, 7, (3, 2), (2, 3), (1, 0, 1, 1), (2, 1), "max", False, True),
    (1, 1, 5, 5, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), "max", False, True),  # the last window hangs off the edge
    (2, 2, 6, 6, (3, 3), (1, 1), (2, 0, 0, 2), (1, 1), "avg", True, False),
]


def _pool_out(size, k, s, p0, p1, d, ceil):
    span = size + p0 + p1 - d * (k - 1) - 1
    return (-(-span // s) if ceil else span // s) + 1


@pytest.mark.parametrize("case", POOL_CASES, ids=[str(i) for i in range(len(POOL_CASES))])
@pytest.mark.parametrize("dt", FLOAT_NP)
@pytest.mark.parametrize("own", [False, True], ids=["default", "own"])
def test_pool2d_forward_and_backward(case, dt, own, monkeypatch):
    # float32 average pooling goes to oneDNN's NCHW kernels where it is installed ("default"); "own": ours
    if own:
        from singa_backend_cpu import onednn

        monkeypatch.setattr(onednn, "pool", lambda *a, **k: False)
    n, c, h, w, kernel, stride, pad, dil, mode, cip, ceil = case
    oh = _pool_out(h, kernel[0], stride[0], pad[0], pad[2], dil[0], ceil)
    ow = _pool_out(w, kernel[1], stride[1], pad[1], pad[3], dil[1], ceil)
    x = sample(dt, (n, c, h, w))
    params = {"kernel": kernel, "stride": stride, "padding": pad, "dilation": dil, "mode": mode,
              "count_include_pad": cip}
    y_ref, idx_ref = pool_ref(x, kernel, stride, pad, dil, mode, cip, oh, ow)
    y = empty((n, c, oh, ow), dt)
    idx = empty((n, c, oh, ow), np.int64)
    K["pool2d"](y, idx, put(x), **params)
    close(get(y), y_ref, dt)
    np.testing.assert_array_equal(get(idx), idx_ref)
    y2 = empty((n, c, oh, ow), dt)
    K["pool2d"](y2, None, put(x), **params)
    close(get(y2), y_ref, dt)
    # backward against the adjoint of the reference
    dy = sample(dt, (n, c, oh, ow))
    dx_ref = np.zeros((n, c, h * w))
    for i in range(oh):
        for j in range(ow):
            rows, cols, taps = _window(i, j, kernel, stride, pad, dil, h, w)
            inside = [r * w + q for r, q in taps]
            if not inside:
                continue
            if mode == "max":
                for nn in range(n):
                    for cc in range(c):
                        dx_ref[nn, cc, idx_ref[nn, cc, i, j]] += dy[nn, cc, i, j]
            else:
                padded = sum(1 for r in rows for q in cols if -pad[0] <= r < h + pad[2] and -pad[1] <= q < w + pad[3])
                for p in inside:
                    dx_ref[:, :, p] += dy[:, :, i, j].astype(np.float64) / (padded if cip else len(inside))
    dx = empty(x.shape, dt)
    K["pool2d_backward"](dx, put(dy), put(x), idx if mode == "max" else None, **params)
    close(get(dx), dx_ref.reshape(x.shape), dt)
    if mode == "max":  # without indices the winners are found again from x
        dx = empty(x.shape, dt)
        K["pool2d_backward"](dx, put(dy), put(x), None, **params)
        close(get(dx), dx_ref.reshape(x.shape), dt)


# The forward's paths (pool_real.h): phase copies for large planes taken a few rows at a time, for mid-sized planes
# several at a time, and with strides 1 to 3, dilation and padding; the row and column runs for windows that do not
# overlap; small planes side by side in vector lanes (full and partial groups of 16 or 8, windows in the padding alone);
# stride-2 windows that all lie inside, read in place.
POOL_PATH_CASES = [
    (2, 21, 14, 14, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),  # lanes: 42 planes, two full groups and a partial one
    (1, 20, 6, 7, (3, 2), (2, 1), (2, 1, 2, 0), (2, 1)),  # lanes: dilation, stride 2 rows, asymmetric padding
    (1, 17, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1), (1, 1)),  # lanes: windows in the padding alone
    # N, C, H, W, kernel, stride, padding, dilation
    (1, 3, 111, 111, (3, 3), (2, 2), (0, 0, 0, 0), (1, 1)),  # SqueezeNet's first pool: rows in several units
    (1, 2, 112, 112, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),  # ResNet's stem
    (2, 5, 28, 28, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),  # Inception: several planes a unit
    (1, 4, 13, 17, (3, 2), (3, 2), (2, 1, 0, 1), (2, 1)),  # stride 3, dilation, asymmetric padding
    (1, 3, 9, 8, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1)),  # windows that do not overlap
    # 2x2 / 2 with every window inside: pool_pairs_f32 in place (float32, AVX-512), 16 outputs a vector
    (2, 3, 8, 37, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1)),  # 18 outputs a row: a full vector and a masked tail
    (1, 2, 6, 64, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1)),  # 32 a row: two full vectors
    (1, 2, 8, 10, (2, 2), (2, 2), (0, 0, 1, 1), (1, 1)),  # bottom / right padding no window reaches
    (3, 5, 8, 8, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1)),  # 4 outputs a row (the MNIST CNN's second pool): one masked
    (2, 3, 24, 25, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1)),  # 12 a row, the last input column in no window
    # other windows with stride 2, every one inside: pool_stride2_f32 in place (the first case's 111x111 as well)
    (2, 3, 9, 41, (3, 3), (2, 2), (0, 0, 0, 0), (1, 1)),  # 20 outputs a row: a masked tail of 4
    (1, 2, 7, 40, (3, 2), (2, 2), (0, 0, 0, 0), (1, 1)),  # an oblong window
    (2, 3, 17, 19, (3, 3), (2, 2), (0, 0, 0, 0), (1, 1)),  # 9 outputs a row: one masked vector
    # stride 2 with windows reaching into the padding: their rows left out in place, the edge columns one by one
    (1, 3, 55, 55, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),  # odd: the last row and column reach the padding too
    (1, 2, 10, 40, (2, 2), (2, 2), (1, 1, 1, 1), (1, 1)),  # 2x2 with padding: not the pair loads
    (2, 2, 9, 36, (3, 3), (2, 2), (2, 1, 2, 0), (1, 1)),  # the first row's windows have one tap row inside
    (1, 3, 7, 7, (7, 7), (1, 1), (0, 0, 0, 0), (1, 1)),  # one window a plane
    (1, 2, 300, 5, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),  # tall and narrow
]


def _scan_max_ref(x, kernel, stride, pad, dil, oh, ow):
    """Max pooling by the contract's scan rule: taps in row-major order, the first maximum wins, a NaN beats
    everything and the first NaN stays; index -1 and value 0 for a window with nothing inside."""
    n, c, h, w = x.shape
    y = np.zeros((n, c, oh, ow), x.dtype)
    idx = np.full((n, c, oh, ow), -1, np.int64)
    for i in range(oh):
        for j in range(ow):
            taps = _window(i, j, kernel, stride, pad, dil, h, w)[2]
            for nn in range(n):
                for cc in range(c):
                    best, at = None, -1
                    for r, q in taps:
                        v = x[nn, cc, r, q]
                        if best is None or (not np.isnan(best) and (v > best or np.isnan(v))):
                            best, at = v, r * w + q
                    if at >= 0:
                        y[nn, cc, i, j], idx[nn, cc, i, j] = best, at
    return y, idx


@pytest.mark.parametrize("case", POOL_PATH_CASES, ids=[str(i) for i in range(len(POOL_PATH_CASES))])
@pytest.mark.parametrize("dt", FLOAT_NP)
def test_pool2d_paths_follow_the_scan_rule(case, dt):
    n, c, h, w, kernel, stride, pad, dil = case
    oh = _pool_out(h, kernel[0], stride[0], pad[0], pad[2], dil[0], False)
    ow = _pool_out(w, kernel[1], stride[1], pad[1], pad[3], dil[1], False)
    rng = np.random.default_rng(len(POOL_PATH_CASES) * 7 + POOL_PATH_CASES.index(case))
    # few distinct values, so windows tie; signed zeros, infinities and NaNs with payloads, so a tie's winner shows
    x = rng.integers(-3, 4, (n, c, h, w)).astype(dt)
    specials = np.array([0.0, -0.0, -np.inf, np.inf, np.nan], dt)
    mask = rng.random(x.shape) < 0.1
    x[mask] = specials[rng.integers(0, len(specials), mask.sum())]
    if dt != np.float16:  # NaNs of different payloads: the first one in scan order is the one kept
        bits = x.view(np.uint32 if dt == np.float32 else np.uint64)
        nan = np.isnan(x)
        bits[nan] |= rng.integers(1, 1000, nan.sum()).astype(bits.dtype)
    y_ref, idx_ref = _scan_max_ref(x, kernel, stride, pad, dil, oh, ow)
    params = {"kernel": kernel, "stride": stride, "padding": pad, "dilation": dil, "mode": "max",
              "count_include_pad": False}
    y, idx = empty((n, c, oh, ow), dt), empty((n, c, oh, ow), np.int64)
    K["pool2d"](y, idx, put(x), **params)
    np.testing.assert_array_equal(get(idx), idx_ref)
    bits_of = {np.float16: np.uint16, np.float32: np.uint32, np.float64: np.uint64}[dt]
    np.testing.assert_array_equal(get(y).view(bits_of), y_ref.view(bits_of))  # bit for bit: zeros' signs, NaNs
    y2 = empty((n, c, oh, ow), dt)
    K["pool2d"](y2, None, put(x), **params)
    np.testing.assert_array_equal(get(y2).view(bits_of), y_ref.view(bits_of))
    # averages, in float64 against a direct sum of the inside taps (finite data)
    xf = rng.uniform(-3, 3, (n, c, h, w)).astype(dt)
    for cip in (True, False):
        ref, _ = pool_ref(xf, kernel, stride, pad, dil, "avg", cip, oh, ow)
        ya = empty((n, c, oh, ow), dt)
        K["pool2d"](ya, None, put(xf), **{**params, "mode": "avg", "count_include_pad": cip})
        close(get(ya), ref, dt)


# -- batch normalisation ------------------------------------------------------------------------------------------


def _bn_axes(shape):
    return (0,) + tuple(range(2, len(shape)))


def _bc(v, ndim):
    return v.reshape((1, -1) + (1,) * (ndim - 2))


@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (8, 5), (2, 64, 3, 3), (1, 2, 1, 1)])
@pytest.mark.parametrize(("dt", "pdt"), [(np.float32, np.float32), (np.float16, np.float16), (np.float16, np.float32),
                                         (np.float64, np.float64), (np.float64, np.float32)])
def test_batchnorm(shape, dt, pdt):
    c, nd = shape[1], len(shape)
    x = (RNG.standard_normal(shape) * 2 + 30).astype(dt)  # a mean far from zero must not cost precision
    scale, bias = sample(pdt, (c,)), sample(pdt, (c,))
    rmean, rvar = sample(pdt, (c,)), (RNG.random(c) + 0.5).astype(pdt)
    xf = x.astype(np.float64)
    axes = _bn_axes(shape)
    m = xf.size // c
    mean, var = xf.mean(axis=axes), xf.var(axis=axes)
    invstd = 1 / np.sqrt(var + 1e-5)
    y_ref = (xf - _bc(mean, nd)) * _bc(invstd * scale, nd) + _bc(bias.astype(np.float64), nd)
    tol = {"rtol": 1e-2, "atol": 1e-2} if dt == np.float16 else {}
    # statistics: (rtol of means, rtol of variances) in the parameters' dtype
    r_mean, r_var = {np.float32: (1e-5, 1e-4), np.float16: (2e-3, 2e-3), np.float64: (1e-12, 1e-12)}[pdt]
    y, rm, rv = empty(shape, dt), put(rmean), put(rvar)
    sm, si = empty((c,), pdt), empty((c,), pdt)
    K["batchnorm_train"](y, rm, rv, sm, si, put(x), put(scale), put(bias), momentum=0.9, eps=1e-5)
    close(get(y), y_ref, dt, **tol)
    close(get(sm), mean, pdt, rtol=r_mean)
    close(get(si), invstd, pdt, rtol=r_var)
    close(get(rm), 0.9 * rmean + 0.1 * mean, pdt, rtol=r_mean)
    close(get(rv), 0.9 * rvar + 0.1 * var * m / max(m - 1, 1), pdt, rtol=r_var)

    y2 = empty(shape, dt)
    K["batchnorm_infer"](y2, put(x), put(scale), put(bias), put(rmean), put(rvar), eps=1e-5)
    inv = 1 / np.sqrt(rvar.astype(np.float64) + 1e-5)
    close(get(y2), (xf - _bc(rmean.astype(np.float64), nd)) * _bc(inv * scale, nd) + _bc(bias.astype(np.float64), nd),
          dt, **tol)

    dy = sample(dt, shape)
    dyf = dy.astype(np.float64)
    smf, sif = get(sm).astype(np.float64), get(si).astype(np.float64)
    xhat = (xf - _bc(smf, nd)) * _bc(sif, nd)
    db, ds = dyf.sum(axis=axes), (dyf * xhat).sum(axis=axes)
    dx_ref = _bc(scale * sif, nd) / m * (m * dyf - _bc(db, nd) - xhat * _bc(ds, nd))
    dx, dscale, dbias = empty(shape, dt), empty((c,), pdt), empty((c,), pdt)
    K["batchnorm_backward"](dx, dscale, dbias, put(dy), put(x), put(scale), sm, si)
    # float64 data: computed in double, so each result is as good as the dtype it is stored in (close's bounds)
    half = {"rtol": 2e-2, "atol": 5e-2}
    close(get(dx), dx_ref, dt, **{np.float32: {"rtol": 1e-4, "atol": 1e-4}, np.float16: tol, np.float64: {}}[dt])
    close(get(dscale), ds, pdt, **{np.float32: {"rtol": 1e-4, "atol": 1e-4}, np.float16: half, np.float64: {}}[dt])
    close(get(dbias), db, pdt, **{np.float32: {"rtol": 1e-5, "atol": 1e-5}, np.float16: half, np.float64: {}}[dt])


# -- softmax and the loss -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", FLOAT_NP)
@pytest.mark.parametrize(("shape", "axis"), [((4, 10), 1), ((4, 10), 0), ((3, 5, 7), 1), ((2, 3, 2000), 1),
                                             ((6,), 0), ((3, 4, 5), -1), ((300, 40), 1), ((0, 5), 1)])
def test_softmax_family(dt, shape, axis):
    x = (RNG.standard_normal(shape) * 3).astype(dt)
    xf = x.astype(np.float64)
    z = xf - (xf.max(axis=axis, keepdims=True) if x.size else 0)
    lse = np.log(np.exp(z).sum(axis=axis, keepdims=True))
    refs = {"softmax": np.exp(z - lse), "log_softmax": z - lse}
    for name, ref in refs.items():
        y = empty(shape, dt)
        K[name](y, put(x), axis=axis)
        close(get(y), ref, dt)
        yv = ref.astype(dt)
        dy = sample(dt, shape)
        dyf, yf = dy.astype(np.float64), yv.astype(np.float64)
        if name == "softmax":
            dx_ref = yf * (dyf - (dyf * yf).sum(axis=axis, keepdims=True))
        else:
            dx_ref = dyf - np.exp(yf) * dyf.sum(axis=axis, keepdims=True)
        dx = empty(shape, dt)
        K[name + "_backward"](dx, put(dy), put(yv), axis=axis)
        close(get(dx), dx_ref, dt, **({"rtol": 1e-5, "atol": 1e-5} if dt == np.float32 else {}))


def test_softmax_is_stable_for_large_inputs():
    x = np.array([[1000.0, 999.0, -1000.0], [-np.inf, 0.0, 0.0]], np.float32)
    y = empty(x.shape, np.float32)
    K["softmax"](y, put(x), axis=1)
    close(get(y), [[1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1)), 0.0], [0.0, 0.5, 0.5]], np.float32)


@pytest.mark.parametrize("dt", FLOAT_NP)
@pytest.mark.parametrize("target_kind", ["int32", "int64", "prob"])
def test_softmax_cross_entropy(dt, target_kind):
    n, c = 7, 5
    x = (RNG.standard_normal((n, c)) * 2).astype(dt)
    if target_kind == "prob":
        t = RNG.random((n, c)).astype(dt)  # not normalised: the gradient must use sum(t)
        tf = t.astype(np.float64)
    else:
        t = RNG.integers(0, c, n).astype(target_kind)
        tf = np.zeros((n, c))
        tf[np.arange(n), t] = 1.0
    xf = x.astype(np.float64)
    logp = xf - xf.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    loss = empty((n,), dt)
    K["softmax_cross_entropy"](loss, put(x), put(t))
    close(get(loss), -(tf * logp).sum(1), dt)
    dloss = RNG.random(n).astype(dt)
    dx = empty((n, c), dt)
    K["softmax_cross_entropy_backward"](dx, put(dloss), put(x), put(t))
    close(get(dx), (np.exp(logp) * tf.sum(1, keepdims=True) - tf) * dloss.astype(np.float64)[:, None], dt)


def test_softmax_cross_entropy_rejects_bad_labels():
    x = put(np.zeros((3, 4), np.float32))
    with pytest.raises(IndexError, match="label 9"):
        K["softmax_cross_entropy"](empty((3,), np.float32), x, put(np.array([0, 9, 1], np.int64)))
    with pytest.raises(IndexError):
        K["softmax_cross_entropy_backward"](empty((3, 4), np.float32), put(np.ones(3, np.float32)), x,
                                            put(np.array([0, -5, 1], np.int32)))
    for k, args in (("softmax_cross_entropy", (empty((3,), np.float32), x)),
                    ("softmax_cross_entropy_backward", (empty((3, 4), np.float32), put(np.ones(3, np.float32)), x))):
        with pytest.raises(IndexError, match="label -1 with 4 classes"):  # a class label never counts from the end
            K[k](*args, put(np.array([0, -1, 1], np.int32)))


# -- indexing -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", ALL_NP)
@pytest.mark.parametrize("idt", [np.int32, np.int64])
def test_gather_and_scatter_add(dt, idt):
    x = sample(dt, (4, 5, 6))
    for axis in (0, 1, 2, -1):
        n = x.shape[axis]
        idx = RNG.integers(-n, n, (2, 3)).astype(idt)
        ref = np.take(x, idx.astype(np.int64), axis=axis)
        out = empty(ref.shape, dt)
        K["gather"](out, put(x), put(idx), axis=axis)
        np.testing.assert_array_equal(get(out), ref)
        if dt == np.bool_:
            continue
        upd = sample(dt, ref.shape)
        acc = put(x)
        K["scatter_add"](acc, put(idx), put(upd), axis=axis)
        expect = x.astype(np.float64)
        moved = np.moveaxis(expect, axis, 0)
        np.add.at(moved, np.where(idx < 0, idx + n, idx).reshape(-1),
                  np.moveaxis(upd.reshape(x.shape[:axis % 3] + (idx.size,) + x.shape[axis % 3 + 1:]), axis, 0))
        close(get(acc), expect.astype(dt) if np.issubdtype(dt, np.integer) else expect, dt)


def test_gather_rejects_out_of_range_and_scatter_handles_large_inputs():
    with pytest.raises(IndexError, match="index 5"):
        K["gather"](empty((2,), np.float32), put(np.zeros(5, np.float32)), put(np.array([0, 5], np.int64)), axis=0)
    with pytest.raises(IndexError):
        K["scatter_add"](put(np.zeros(5, np.float32)), put(np.array([-6], np.int32)), put(np.ones(1, np.float32)),
                         axis=0)
    # an embedding-sized gradient: many duplicate rows, threads split the inner axis
    idx = RNG.integers(0, 50, 4000).astype(np.int64)
    upd = sample(np.float32, (4000, 64))
    acc = put(np.zeros((50, 64), np.float32))
    K["scatter_add"](acc, put(idx), put(upd), axis=0)
    expect = np.zeros((50, 64))
    np.add.at(expect, idx, upd.astype(np.float64))
    close(get(acc), expect, np.float32, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("idt", [np.int32, np.int64])
@pytest.mark.parametrize("axis", [0, 1])
def test_bound_gathers_replay_on_new_indices_and_name_a_bad_one(idt, axis):
    # an embedding lookup in a replayed transformer is a launch bound once: it reads the table and the indices as
    # they are at each call (negative ones counting from the end), and a bad index still fails naming it
    table = RNG.standard_normal((40, 24)).astype(np.float32)
    x, idx = put(table), put(np.zeros(7, idt))
    shape = (7, 24) if axis == 0 else (40, 7)
    out = empty(shape, np.float32)
    launch = K["gather"].bind(out, x, idx, axis=axis)
    assert callable(launch)
    assert K["gather"].bind(empty((3, 24), np.float32), View(x.buffer, x.dtype, (20, 24), (48, 1), 0),
                            put(np.zeros(3, idt)), axis=0) is None  # a strided table: the call goes the whole way
    length = table.shape[axis]
    for _ in range(2):
        i = RNG.integers(-length, length, 7).astype(idt)
        t = RNG.standard_normal(table.shape).astype(np.float32)
        DEV.write(idx, i)
        DEV.write(x, t)
        launch()
        np.testing.assert_array_equal(get(out), np.take(t, i, axis=axis))
    DEV.write(idx, np.array([0, 1, 2, length, 0, 0, 0], idt))
    with pytest.raises(IndexError, match=f"index {length} on axis {axis}"):
        launch()


@pytest.mark.parametrize("dt", ALL_NP)
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad(dt, mode):
    x = sample(dt, (3, 4, 5))
    for pads in [(1, 2, 0, 3, 1, 2), (0, 0, 0, 0, 0, 0), (2, 3, 4, 2, 3, 4), (7, 0, 9, 0, 8, 1)]:
        width = [(pads[i], pads[i + 3]) for i in range(3)]
        value = True if dt == np.bool_ else 1.5
        if mode == "constant":
            ref = np.pad(x, width, mode="constant", constant_values=np.array(value).astype(dt))
        else:
            ref = np.pad(x, width, mode=mode)
        out = empty(ref.shape, dt)
        K["pad"](out, put(x), pads=pads, mode=mode, value=value)
        np.testing.assert_array_equal(get(out), ref, err_msg=str(pads))


def test_pad_edge_cases():
    one = np.array([4.0], np.float32)
    out = empty((6,), np.float32)
    K["pad"](out, put(one), pads=(2, 3), mode="reflect")
    np.testing.assert_array_equal(get(out), np.full(6, 4.0))
    out = empty((), np.float32)
    K["pad"](out, put(np.array(3.0, np.float32)), pads=(), mode="constant")
    assert get(out) == 3.0
    out = empty((2, 3), np.int32)
    K["pad"](out, put(np.zeros((0, 3), np.int32)), pads=(1, 0, 1, 0), mode="constant", value=-2)
    np.testing.assert_array_equal(get(out), np.full((2, 3), -2))
    with pytest.raises(ValueError, match="pad"):
        K["pad"](out, put(np.zeros((0, 3), np.int32)), pads=(1, 0, 1, 0), mode="edge")


# -- random numbers -----------------------------------------------------------------------------------------------

_M32 = 0xFFFFFFFF


def philox_ref(counter, key):
    """Philox4x32-10 in plain Python (Salmon et al., SC'11), the test's own reference."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & _M32, p1 & _M32, ((p0 >> 32) ^ c3 ^ k1) & _M32, p0 & _M32
        k0, k1 = (k0 + 0x9E3779B9) & _M32, (k1 + 0xBB67AE85) & _M32
    return [c0, c1, c2, c3]


def draws_ref(seed, offset, n):
    """Draw j of the stream: word (offset + j) % 4 of Philox(counter (offset + j) // 4, key seed)."""
    key = (seed & _M32, seed >> 32)
    out = []
    for c in range(offset, offset + n):
        q = c // 4
        out.append(philox_ref((q & _M32, q >> 32, 0, 0), key)[c % 4])
    return out


def test_philox_reference_matches_random123_known_answers():
    assert philox_ref((0, 0, 0, 0), (0, 0)) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert philox_ref((_M32,) * 4, (_M32, _M32)) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert philox_ref((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0)) == [
        0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


@pytest.mark.parametrize(("seed", "offset", "n"), [(0, 0, 4), (0, 1, 9), (0x123456789ABCDEF0, 3, 300),
                                                  (7, (1 << 34) + 2, 50), (2 ** 64 - 1, 0, 17)])
def test_philox_draws_are_bit_identical(seed, offset, n):
    assert philox_u32(seed, offset, n) == draws_ref(seed, offset, n)


@pytest.mark.parametrize("dt", FLOAT_NP)
@pytest.mark.parametrize("offset", [0, 4, 7, 1001])
def test_random_uniform_is_bit_identical(dt, offset):
    seed, n = 0xDEADBEEF12345678, 3001
    u = (np.array(draws_ref(seed, offset, n), np.uint64) >> 8).astype(np.float64) * 2.0 ** -24
    out = empty((n,), dt)
    K["random_uniform"](out, low=-2.0, high=3.0, seed=seed, offset=offset)
    np.testing.assert_array_equal(get(out), (-2.0 + 5.0 * u).astype(dt))
    big = empty((1 << 18,), np.float32)  # threaded: the same stream whatever the split
    K["random_uniform"](big, low=0.0, high=1.0, seed=seed, offset=offset)
    np.testing.assert_array_equal(get(big)[:n], u.astype(np.float32))


@pytest.mark.parametrize("dt", FLOAT_NP)
def test_random_normal_follows_box_muller(dt):
    seed, offset, n = 42, 8, 2000
    u = (np.array(draws_ref(seed, offset, 2 * n), np.uint64) >> 8).astype(np.float64) * 2.0 ** -24
    ref = 1.0 + 2.0 * np.sqrt(-2.0 * np.log(1.0 - u[0::2])) * np.cos(2.0 * np.pi * u[1::2])
    out = empty((n,), dt)
    K["random_normal"](out, mean=1.0, std=2.0, seed=seed, offset=offset)
    tol = {np.float32: {"rtol": 1e-6, "atol": 1e-6}, np.float16: {"rtol": 1e-3, "atol": 1e-6}, np.float64: {}}[dt]
    close(get(out), ref.astype(dt), dt, **tol)
    big = empty((1 << 18,), np.float32)
    K["random_normal"](big, mean=0.0, std=1.0, seed=seed, offset=0)
    z = get(big).astype(np.float64)
    assert abs(z.mean()) < 0.01
    assert abs(z.std() - 1.0) < 0.01


@pytest.mark.parametrize("dt", ALL_NP)
def test_random_bernoulli(dt):
    seed, offset, n = 99, 5, 5000
    u = (np.array(draws_ref(seed, offset, n), np.uint64) >> 8).astype(np.float64) * 2.0 ** -24
    out = empty((n,), dt)
    K["random_bernoulli"](out, p=0.3, seed=seed, offset=offset)
    np.testing.assert_array_equal(get(out), (u < 0.3).astype(dt))


PLACEMENT_PROBE = """
import os, sys, threading
import numpy as np
from singa import device, ops
import singa_backend_cpu as c

def masks():
    return {int(t): frozenset(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}

def cpu_of_this_thread():
    with open(f"/proc/self/task/{threading.get_native_id()}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])

every = frozenset(os.sched_getaffinity(0))
x = ops.from_numpy(np.ones(1 << 22, np.float32), device.get_device("cpu"))
assert float(ops.to_numpy(ops.sum(x))) == 1 << 22
me = threading.get_native_id()
pinned = sorted(next(iter(m)) for t, m in masks().items() if t != me and len(m) == 1)
print("pinned", pinned, "mine", sorted(masks()[me]) == sorted(every))
if pinned:
    worker = pinned[0]
    os.sched_setaffinity(0, {worker})  # put this thread on a worker's CPU, then free it: it stays there
    os.sched_setaffinity(0, every)
    before = cpu_of_this_thread()
    c.get_num_threads()  # what every kernel asks before it forks; nothing runs that would make the scheduler move it
    print("moved", before == worker, cpu_of_this_thread() != worker, sorted(masks()[me]) == sorted(every))
    sys.stdout.flush()
    pid = os.fork()  # a child has none of the workers: it keeps off no CPU, and says so
    if pid == 0:
        os.sched_setaffinity(0, {worker})
        os.sched_setaffinity(0, every)
        c.get_num_threads()
        os.write(1, f"child {cpu_of_this_thread() == worker} {c.placement().startswith('left to')}\\n".encode())
        os._exit(0)
    os.waitpid(pid, 0)
    c.set_num_threads(1)
    print("freed", all(len(m) == len(every) for m in masks().values()), c.placement())
"""


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="thread placement needs Linux and at least 2 CPUs")
@pytest.mark.parametrize("setting", ["", "0"])
def test_workers_get_a_cpu_each_and_the_caller_keeps_off_them(setting):
    """As many threads as CPUs: each worker pinned to its own CPU, the calling thread free but moved off a worker's
    CPU before a kernel forks; one thread frees them again. SINGA_CPU_PIN=0: nothing pinned."""
    cpus = sorted(os.sched_getaffinity(0))
    clean = {k: v for k, v in os.environ.items() if k not in ("SINGA_NUM_THREADS", "OMP_NUM_THREADS", "SINGA_CPU_PIN")}
    r = subprocess.run([sys.executable, "-c", PLACEMENT_PROBE], env={**clean, "SINGA_CPU_PIN": setting},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    if setting == "0":
        assert lines == ["pinned [] mine True"]
        return
    assert lines[0] == f"pinned {cpus[1:]} mine True"
    assert lines[1] == "moved True True True"
    assert lines[2] == "child True True"
    assert lines[3] == "freed True left to the operating system (one thread)"


@pytest.mark.parametrize("dt", [np.float32, np.int64, np.float16])
def test_bound_copies_replay_on_new_contents(dt):
    # Graph replays a copy as the launch its `bind` made once: a memcpy between contiguous views, the strided kernel
    # for a transpose into a slice of a concatenation; each must copy what the source holds at the time of the call
    src = put(np.zeros((3, 4, 5), dt))
    dst = empty((3, 4, 5), dt)
    cat = empty((3, 5, 9), dt)
    transposed = View(src.buffer, src.dtype, (3, 5, 4), (20, 1, 5), 0)
    part = View(cat.buffer, cat.dtype, (3, 5, 4), (45, 9, 1), 5)
    launches = [K["copy"].bind(dst, src), K["copy"].bind(part, transposed)]
    assert all(callable(f) for f in launches)
    for _ in range(2):
        a = (RNG.standard_normal((3, 4, 5)) * 100).astype(dt)
        DEV.write(src, a)
        for f in launches:
            f()
        np.testing.assert_array_equal(get(dst), a)
        np.testing.assert_array_equal(get(cat)[:, :, 5:], a.transpose(0, 2, 1))


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_bound_layer_norms_and_softmaxes_replay_on_new_contents(dt):
    # a transformer's replay runs layer_norm and (log-)softmax, forward and backward, as launches bound once; each must
    # read what its inputs hold at the time of the call (float64 numpy references); a strided input has no launch
    rows, cols = 96, 200  # enough rows for the threads to share them
    x, y = put(np.zeros((rows, cols), dt)), empty((rows, cols), dt)
    mean, invstd = empty((rows,), dt), empty((rows,), dt)
    scale, bias = put(RNG.standard_normal(cols).astype(dt)), put(RNG.standard_normal(cols).astype(dt))
    sm, lsm, dy, dx, dlx = (empty((rows, cols), dt) for _ in range(5))
    launches = [K["layer_norm"].bind(y, mean, invstd, x, scale, bias, eps=1e-5),
                K["softmax"].bind(sm, x, axis=1), K["log_softmax"].bind(lsm, x, axis=-1),
                K["softmax_backward"].bind(dx, dy, sm, axis=1), K["log_softmax_backward"].bind(dlx, dy, lsm, axis=1)]
    assert all(callable(f) for f in launches)
    assert K["softmax"].bind(sm, View(x.buffer, x.dtype, (rows, cols // 2), (cols, 2), 0), axis=1) is None
    tol = 1e-5 if dt == np.float32 else 1e-12
    for _ in range(2):
        a = (RNG.standard_normal((rows, cols)) * 3 + 1).astype(dt)
        g = RNG.standard_normal((rows, cols)).astype(dt)
        DEV.write(x, a)
        DEV.write(dy, g)
        for f in launches:
            f()
        a64, g64 = a.astype(np.float64), g.astype(np.float64)
        m, v = a64.mean(1, keepdims=True), a64.var(1, keepdims=True)
        close(get(y), ((a64 - m) / np.sqrt(v + 1e-5) * get(scale) + get(bias)).astype(dt), dt, rtol=tol, atol=tol)
        close(get(mean), m[:, 0].astype(dt), dt, rtol=tol, atol=tol)
        e = np.exp(a64 - a64.max(1, keepdims=True))
        p = e / e.sum(1, keepdims=True)
        close(get(sm), p.astype(dt), dt, rtol=tol, atol=tol)
        close(get(lsm), np.log(p).astype(dt), dt, rtol=tol, atol=tol)
        close(get(dx), (p * (g64 - (g64 * p).sum(1, keepdims=True))).astype(dt), dt, rtol=tol, atol=tol)
        close(get(dlx), (g64 - p * g64.sum(1, keepdims=True)).astype(dt), dt, rtol=tol, atol=tol)


# -- optimizer updates --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_sgd_momentum_flushes_a_decayed_buffer_to_zero(dt):
    """A buffer value that decays below the smallest normal number (its gradient stays 0) is stored as 0, not as a
    subnormal; the others follow the rule; the weights of the flushed elements do not move."""
    tiny = np.finfo(dt).tiny
    buf = np.array([19 * tiny, -19 * tiny, 40 * tiny, 1.0, -0.5, 3 * tiny], dt)
    g = np.array([0, 0, 0, 0.25, 0, 2 * tiny], dt)
    w = np.array([1.5, -2.0, 0.75, 3.0, 1.0, 4.0], dt)
    vw, vbuf, vg = put(w), put(buf), put(g)
    K["sgd_momentum"](vw, vbuf, vg, lr=0.1, momentum=0.05)
    new_buf = 0.05 * buf.astype(np.float64) + g  # 0.95 tiny and -0.95 tiny: subnormal; the rest normal
    want_buf = np.where(np.abs(new_buf) < tiny, 0.0, new_buf)
    got_buf = get(vbuf)
    assert got_buf[:2].tolist() == [0.0, 0.0], got_buf
    close(got_buf, want_buf.astype(dt), dt, rtol=1e-6, atol=0)
    close(get(vw), (w - 0.1 * want_buf).astype(dt), dt, rtol=1e-6, atol=0)
