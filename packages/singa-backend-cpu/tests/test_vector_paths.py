"""The portable build: one kernel module per vector path (isa.py), the widest chosen at import, SINGA_CPU_ISA to force.

A wheel carries the baseline, AVX2 and AVX-512 builds of every kernel. These tests check that the CPU detection agrees
with what the kernel reports in /proc/cpuinfo, that the widest runnable path is the one loaded, that every path
computes the same results as the baseline one, and that the whole backend conformance suite passes with the dispatch
forced to the AVX2 and the baseline paths (what a CPU without AVX-512, or without AVX2, would run). Each path runs in
its own interpreter: the choice is made once, when the package is imported.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from singa_backend_cpu import device as cpu_device
from singa_backend_cpu import isa

X86 = isa.is_x86_64()
PORTABLE = [p.name for p in isa.build_paths(platform.machine()) if p.name != isa.NATIVE] if X86 else ["baseline"]
BUILT = isa.built()
portable_build = pytest.mark.skipif(
    isa.NATIVE in BUILT, reason="a SINGA_CPU_NATIVE=1 build has only the native path; the portable build is tested "
    "by `nox -s tests` and `nox -s wheels`")


def run_python(code: str, path: str | None, timeout: float = 600, args: list[str] | None = None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SINGA_")}
    if path is not None:
        env[isa.FORCE_VARIABLE] = path
    cmd = [sys.executable, *(args if args is not None else ["-c", textwrap.dedent(code)])]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False)


def _level_from_cpuinfo() -> int:
    """The x86-64 level from the flags Linux reports (it drops AVX flags the OS does not save state for)."""
    with open("/proc/cpuinfo") as f:
        flags = set(next(line for line in f if line.startswith("flags")).split(":", 1)[1].split())
    v3 = {"avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", "abm"}
    v4 = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
    return 4 if v3 | v4 <= flags else 3 if v3 <= flags else 0


@pytest.mark.skipif(not (X86 and os.path.exists("/proc/cpuinfo")), reason="x86-64 Linux only (/proc/cpuinfo flags)")
def test_cpu_level_agrees_with_the_kernel():
    assert isa.cpu_level() == _level_from_cpuinfo()


def test_widest_runnable_path_is_loaded():
    want = isa.NATIVE if isa.NATIVE in BUILT else [p for p in BUILT if isa.by_name(p).level <= isa.cpu_level()][-1]
    proc = run_python("from singa_backend_cpu.device import VECTOR_PATH; print(VECTOR_PATH)", None)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [want]
    if not os.environ.get(isa.FORCE_VARIABLE):
        assert want == cpu_device.VECTOR_PATH


@portable_build
def test_a_portable_build_has_every_path():
    assert BUILT == PORTABLE


@pytest.mark.parametrize(("path", "message"), [
    ("sse9", "SINGA_CPU_ISA=sse9: unknown vector path"),
    ("native", "SINGA_CPU_ISA=native: this install of singa-backend-cpu has no native kernels"),
])
@portable_build
def test_forcing_a_path_that_cannot_run_says_why(path, message):
    proc = run_python("import singa_backend_cpu", path)
    assert proc.returncode != 0
    assert message in proc.stderr


@pytest.mark.skipif(not X86 or isa.cpu_level() >= 4, reason="this CPU runs AVX-512: nothing to refuse")
@portable_build
def test_forcing_a_path_the_cpu_lacks_is_refused():
    proc = run_python("import singa_backend_cpu", "avx512")
    assert proc.returncode != 0
    assert "this CPU cannot run the avx512 kernels" in proc.stderr


# -- every path computes the same results ----------------------------------------------------------------------------

# Writes what one path computes to an .npz: every element-wise entry of the expression table over a long vector (vector
# bodies, remainders and threads) in float32, float64 and float16, then one training step of a small CNN (convolution,
# depthwise convolution, batch norm, pooling, matmul, softmax cross-entropy, and all their gradients).
WORKER = """
    import sys
    import numpy as np
    from singa import autograd, device, dtypes, expressions, layer, tensor
    from singa.backend import View
    from singa_backend_cpu.device import VECTOR_PATH

    dev = device.get_device("cpu")
    rng = np.random.default_rng(11)
    out = {"path": np.array(VECTOR_PATH)}
    n = 100_003
    inputs = {dt: rng.uniform(-2.5, 2.5, n) for dt in (dtypes.float32, dtypes.float64, dtypes.float16)}
    second = rng.uniform(0.25, 3.0, n)

    def put(arr, dt):
        arr = arr.astype(dtypes.to_numpy_dtype(dt))
        v = View(dev.alloc(arr.nbytes), dt, arr.shape)
        dev.write(v, arr)
        return v

    for name, entry in expressions.TABLE.items():
        for dt, x in inputs.items():
            if dt not in entry.dtypes:
                continue
            result = View(dev.alloc(n * 8), dtypes.bool_ if entry.out_bool else dt, (n,))
            args = (put(x, dt),) if entry.arity == 1 else (put(x, dt), put(second, dt))
            params = {"alpha": 0.3, "beta": 0.7} if entry.params else {}
            dev.table[name](result, *args, **params)
            out[f"{name}/{dtypes.name(dt)}"] = dev.read(result)

    class Net(layer.Layer):
        def __init__(self):
            super().__init__()
            self.conv = layer.Conv2d(12, 3, padding=1, bias=False)  # a bias before batch norm has no gradient
            self.bn = layer.BatchNorm2d(12)
            self.dw = layer.Conv2d(12, 5, padding=2, group=12)
            self.pool = layer.MaxPool2d(2, 2)
            self.avg = layer.AvgPool2d(3, 1, padding=1)
            self.flat = layer.Flatten()
            self.fc = layer.Linear(10)
            self.loss = layer.SoftMaxCrossEntropy()

        def forward(self, x):
            y = self.pool(autograd.relu(self.bn(self.conv(x))))
            y = self.avg(autograd.tanh(self.dw(y)))
            return self.fc(self.flat(y))

    dev.set_rand_seed(3)
    net = Net()
    x = tensor.from_numpy(rng.standard_normal((8, 5, 17, 15)).astype(np.float32), dev)
    t = tensor.from_numpy(rng.integers(0, 10, 8).astype(np.int32), dev)
    autograd.training = True
    logits = net(x)
    loss = net.loss(logits, t)
    out["cnn/logits"] = tensor.to_numpy(logits)
    out["cnn/loss"] = tensor.to_numpy(loss)
    names = {id(p): name for name, p in net.get_params().items()}
    for p, g in autograd.backward(loss):
        out[f"cnn/grad/{names[id(p)]}"] = tensor.to_numpy(g)

    # our Winograd F(4x4, 3x3) kernel (16-float vectors on every path): a 3x3 stride-1 convolution of 16-channel
    # multiples and its data gradient, on the backend's own kernels
    import os
    from singa_backend_cpu.device import ffi, lib
    os.environ["SINGA_ONEDNN"] = "0"
    geometry = ffi.new("int64_t[]", [6, 16, 10, 9, 32, 3, 3, 10, 9, 1, 1, 1, 1, 1, 1, 1, 1, 1])
    out["winograd/taken"] = np.array([lib.sg_conv2d_winograd(geometry, 0), lib.sg_conv2d_winograd(geometry, 1)]) > 0
    wx = put(rng.standard_normal((6, 16, 10, 9)), dtypes.float32)
    ww = put(rng.standard_normal((32, 16, 3, 3)) / 12, dtypes.float32)
    wy = View(dev.alloc(6 * 32 * 90 * 4), dtypes.float32, (6, 32, 10, 9))
    dev.table["conv2d"](wy, wx, ww, None, padding=(1, 1, 1, 1))
    out["winograd/forward"] = dev.read(wy)
    wdx = View(dev.alloc(6 * 16 * 90 * 4), dtypes.float32, (6, 16, 10, 9))
    dev.table["conv2d_backward_data"](wdx, wy, ww, padding=(1, 1, 1, 1))
    out["winograd/data gradient"] = dev.read(wdx)

    # the blocked unfolding + GEMM (conv.c): in-register transposes of VW channels where the block is a multiple of
    # VW, element by element otherwise; 8- and 16-channel blocks, a strided and padded 3x3 with residual and ReLU
    def ptr(a):
        return ffi.cast("char *", a.ctypes.data)

    gx = rng.standard_normal((2, 32, 9, 11)).astype(np.float32)
    gw = (rng.standard_normal((48, 32, 3, 3)) / 12).astype(np.float32)
    gb = rng.standard_normal(48).astype(np.float32)
    gr = rng.standard_normal((2, 48, 5, 6)).astype(np.float32)
    ggeom = ffi.new("int64_t[]", [2, 32, 9, 11, 48, 3, 3, 5, 6, 2, 2, 1, 1, 1, 1, 1, 1, 1])
    for block in (8, 16):
        gy = np.empty_like(gr)
        assert lib.sg_conv2d_gemm_blocked(ptr(gx), 0, ptr(gw), 0, ptr(gb), 0, ptr(gr), 0, ptr(gy), 0, ggeom, 1,
                                          block) == 0
        out[f"cnn/blocked gemm {block}"] = gy
    np.savez(sys.argv[1], **out)
"""

# How far two paths may differ: FMA contraction and the vector width change rounding, by a few units in the last place
# of each result (float16 is computed in float32 and rounded, so one float16 ulp); the CNN's values are sums of many
# such terms, compared relative to the largest value of the tensor.
# (Measured on an AVX-512 machine: at most 2.4e-7 in float32, one ulp in float16, 1.9e-7 across the CNN.)
# Winograd's transforms amplify each path's rounding ~10x (kernels/winograd.c): its own bound, relative like the CNN's.
TOLERANCE = {"float32": 4e-6, "float64": 1e-14, "float16": 2 ** -9, "bool": 0, "cnn": 2e-6, "winograd": 3e-5}


def _outputs(path: str, tmp_path) -> dict[str, np.ndarray]:
    target = tmp_path / f"{path}.npz"
    proc = run_python("", path, args=["-c", textwrap.dedent(WORKER), str(target)])
    assert proc.returncode == 0, proc.stderr
    with np.load(target) as data:
        return {k: data[k] for k in data.files}


@portable_build
def test_every_path_computes_what_the_baseline_computes(tmp_path):
    runnable = [p for p in BUILT if isa.runs_here(p)]
    base = _outputs("baseline", tmp_path)
    assert str(base.pop("path")) == "baseline"
    assert any(k.startswith("cnn/grad/") for k in base)
    assert base["winograd/taken"].all()  # the baseline path ran the Winograd kernel, as the others must
    assert len(runnable) > 1 or not X86, f"only {runnable} run here: nothing to compare"
    worst = {}
    for path in runnable[1:]:
        got = _outputs(path, tmp_path)
        assert str(got.pop("path")) == path
        assert got.keys() == base.keys()
        for key, want in base.items():
            have = got[key]
            kind = key.split("/", 1)[0] if key.startswith(("cnn/", "winograd/")) else key.rsplit("/", 1)[1]
            if kind == "bool" or want.dtype == np.bool_:
                assert np.array_equal(have, want), f"{path}: {key} differs from the baseline"
                continue
            a, b = have.astype(np.float64), want.astype(np.float64)
            same_nan = np.isnan(a) == np.isnan(b)
            assert same_nan.all(), f"{path}: {key}: NaN where the baseline has none (or the reverse)"
            finite = np.isfinite(b)
            assert np.array_equal(a[~finite & ~np.isnan(b)], b[~finite & ~np.isnan(b)]), f"{path}: {key}: inf differs"
            a, b = a[finite], b[finite]
            if not b.size:
                continue
            relative_to_max = kind in ("cnn", "winograd")
            scale = np.maximum(np.abs(b), np.abs(b).max()) if relative_to_max else np.maximum(np.abs(b), 1.0)
            err = float((np.abs(a - b) / scale).max())
            worst[key] = max(worst.get(key, 0.0), err)
            assert err <= TOLERANCE[kind], f"{path}: {key} differs from the baseline by {err:.3g} (relative)"
    # the comparison is not vacuous: the paths really are different builds, which round differently somewhere
    assert any(v > 0 for v in worst.values()) or not X86, "every path gave bit-identical results: same build twice?"


# -- the conformance suite on the narrower paths ---------------------------------------------------------------------


@pytest.mark.parametrize("path", ["baseline", "avx2"])
@portable_build
def test_conformance_suite_passes_on_path(path):
    """The whole backend conformance suite, on the CPU device, with the dispatch forced to `path`."""
    if not X86 and path != "baseline":
        pytest.skip(f"{path} is an x86-64 path")
    if not isa.runs_here(path):
        pytest.skip(f"this CPU cannot run the {path} kernels")
    info = run_python("", path, args=["-m", "singa", "info", "--json"])
    assert info.returncode == 0, info.stderr
    (cpu,) = [b for b in json.loads(info.stdout)["backends"] if b["name"] == "cpu"]
    assert cpu["info"]["vector path"].startswith(f"{path} ("), cpu["info"]["vector path"]
    assert f"forced by {isa.FORCE_VARIABLE}={path}" in cpu["info"]["vector path"]
    proc = run_python("", path, args=["-m", "pytest", "-p", "no:cacheprovider", "-q", "--pyargs",
                                      "singa.testing.conformance", "--singa-device=cpu"])
    tail = proc.stdout[-3000:]
    assert proc.returncode == 0, f"conformance suite failed on the {path} path:\n{tail}\n{proc.stderr[-2000:]}"
    assert " passed" in tail, tail
    assert " failed" not in tail, tail
