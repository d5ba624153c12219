"""The plugin system end to end, in fresh interpreters: discovery, broken plugins, SINGA_DEVICE, fallback warnings,
and the conformance suite's pytest plugin (including proof that it fails a backend with a wrong kernel).

The deliberately broken plugins of tests/plugins/singa-plugin-broken are made visible to the subprocesses only, by a
generated `.dist-info` on their PYTHONPATH, so they never pollute the environment the other tests run in (installing
the package with pip works too: these tests then see it either way).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
BROKEN = HERE / "plugins" / "singa-plugin-broken"
BROKEN_ENTRY_POINTS = {
    "broken": "singa_plugin_broken.import_error",
    "brokenhook": "singa_plugin_broken.hook_error",
}


def _installed(dist: str) -> bool:
    try:
        metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


HAVE_CPU = _installed("singa-backend-cpu")
needs_cpu = pytest.mark.skipif(not HAVE_CPU, reason="singa-backend-cpu is not installed")
if not _installed("singa-plugin-hostmem"):
    pytest.skip("tests/plugins/singa-plugin-hostmem must be installed", allow_module_level=True)


def _fake_dist(site: Path, name: str, entry_points: dict[str, str]) -> None:
    """Make importlib.metadata see distribution `name` with these singa.backends entry points (no pip needed)."""
    info = site / f"{name.replace('-', '_')}-0.0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.1\n")
    lines = ["[singa.backends]"] + [f"{k} = {v}" for k, v in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory) -> list[str]:
    """PYTHONPATH entries that install singa-plugin-broken for a subprocess."""
    pyproject = (BROKEN / "pyproject.toml").read_text()
    for name, target in BROKEN_ENTRY_POINTS.items():
        assert f'{name} = "{target}"' in pyproject, f"{BROKEN}/pyproject.toml no longer declares {name}"
    site = tmp_path_factory.mktemp("broken-site")
    _fake_dist(site, "singa-plugin-broken", BROKEN_ENTRY_POINTS)
    return [str(site), str(BROKEN / "src")]


def run_python(code: str, *, path: list[str] = (), env: dict | None = None, args: list[str] | None = None,
               timeout: float = 180, cwd: Path = HERE) -> subprocess.CompletedProcess:
    """Run `python -c code` (or `python args...`) in a fresh interpreter with SINGA_* variables only from `env`."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("SINGA_")}
    e.update(env or {})
    if path:
        e["PYTHONPATH"] = os.pathsep.join([*path, *filter(None, [os.environ.get("PYTHONPATH")])])
    cmd = [sys.executable, *(args if args is not None else ["-c", textwrap.dedent(code)])]
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout, check=False, cwd=cwd)


def run_json(code: str, **kw) -> dict:
    proc = run_python(code, **kw)
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- broken plugins ---------------------------------------------------------------------------------------------------

REPORT = """
    import json, warnings
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as at_import:
        import singa
        from singa import device, plugins
    with warnings.catch_warnings(record=True) as at_discovery:
        reg = plugins.registry()
    import numpy as np
    from singa import dtypes
    from singa.backend import View
    dev = device.get_device({spec!r})
    a = View(dev.alloc(12), dtypes.float32, (3,))
    dev.write(a, np.array([1.0, 2.0, 3.0], np.float32))
    out = View(dev.alloc(12), dtypes.float32, (3,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dev.table["add"](out, a, a)
    print(json.dumps({{
        "import_warnings": [str(w.message) for w in at_import],
        "warnings": [[w.category.__name__, str(w.message)] for w in at_discovery],
        "failures": {{f.name: [f.group, f.value, f.error] for f in reg.failures}},
        "backends": sorted(reg.backends),
        "device": dev.name,
        "sum": dev.read(out).tolist(),
    }}))
"""


def _check_broken_reported(rep: dict) -> None:
    assert rep["import_warnings"] == [], "`import singa` must not load plugins"
    assert set(BROKEN_ENTRY_POINTS) <= set(rep["failures"]), rep["failures"]
    group, value, error = rep["failures"]["broken"]
    assert group == "singa.backends"
    assert value == BROKEN_ENTRY_POINTS["broken"]
    assert error.startswith("ImportError")
    assert "libbrokendevice.so" in error
    hook_error = rep["failures"]["brokenhook"][2]
    assert hook_error.startswith("RuntimeError")
    assert "no broken device" in hook_error
    for name in BROKEN_ENTRY_POINTS:
        hits = [m for cat, m in rep["warnings"] if cat == "PluginWarning" and repr(name) in m]
        assert len(hits) == 1, f"expected one PluginWarning naming {name!r}: {rep['warnings']}"
    assert "broken" not in rep["backends"]
    assert "brokenhook" not in rep["backends"]
    assert "hostmem" in rep["backends"]


def test_broken_plugins_are_reported_and_skipped(broken_site):
    rep = run_json(REPORT.format(spec="hostmem"), path=broken_site)
    _check_broken_reported(rep)
    assert rep["device"] == "hostmem:0"
    assert rep["sum"] == [2.0, 4.0, 6.0]


@needs_cpu
def test_cpu_works_with_broken_plugins(broken_site):
    rep = run_json(REPORT.format(spec="cpu"), path=broken_site)
    _check_broken_reported(rep)
    assert rep["device"] == "cpu:0"
    assert rep["sum"] == [2.0, 4.0, 6.0]


@pytest.mark.parametrize("name", sorted(BROKEN_ENTRY_POINTS))
def test_asking_for_a_broken_backend_says_why(broken_site, name):
    rep = run_json(f"""
        import json, warnings
        warnings.simplefilter("ignore")
        from singa import device
        try:
            device.get_device({name!r})
        except RuntimeError as e:
            print(json.dumps({{"error": str(e)}}))
    """, path=broken_site)
    assert "failed to load" in rep["error"]
    assert ("ImportError" if name == "broken" else "RuntimeError") in rep["error"]


def test_disabled_plugins_are_not_loaded(broken_site):
    rep = run_json(REPORT.format(spec="hostmem"), path=broken_site,
                   env={"SINGA_DISABLE_PLUGINS": ",".join(BROKEN_ENTRY_POINTS)})
    assert rep["failures"] == {}
    assert rep["warnings"] == []


# -- SINGA_DEVICE -----------------------------------------------------------------------------------------------------

DEFAULT = """
    import json
    from singa import device
    try:
        print(json.dumps({"device": device.get_default_device().name}))
    except Exception as e:
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
"""


@pytest.mark.parametrize(("value", "want"), [
    ("hostmem", "hostmem:0"),
    ("hostmem:0", "hostmem:0"),
    (" HostMem ", "hostmem:0"),
    pytest.param("cpu", "cpu:0", marks=needs_cpu),
    pytest.param("", "cpu:0", marks=needs_cpu),  # unset: the CPU backend
])
def test_singa_device_selects_the_default(value, want):
    env = {"SINGA_DEVICE": value} if value else {}
    assert run_json(DEFAULT, env=env) == {"device": want}


def test_without_a_cpu_backend_the_default_is_a_device_there_is():
    """`pip install singa-core singa-backend-cuda` alone: unset SINGA_DEVICE means the first device of another
    backend (cuda, then opencl, then any plugin), so optimizers and `get_default_device()` still work."""
    assert run_json(DEFAULT, env={"SINGA_DISABLE_PLUGINS": "cpu,cuda,opencl"}) == {"device": "hostmem:0"}


@pytest.mark.parametrize(("env", "needles"), [
    # SINGA's own backends: the PyPI name and the form that installs from a checkout
    ({"SINGA_DEVICE": "cuda"}, ["`pip install singa-backend-cuda`", "`pip install ./packages/singa-backend-cuda`"]),
    ({"SINGA_DISABLE_PLUGINS": "opencl", "SINGA_DEVICE": "opencl:0"},
     ["opencl", "disabled by SINGA_DISABLE_PLUGINS=opencl"]),
    ({"SINGA_DEVICE": "hostmem:3"}, ["hostmem", "out of range"]),
    # an unknown name: what is installed, and how a third-party backend makes its name known (nothing to pip install)
    ({"SINGA_DEVICE": "nosuchthing"}, ["nosuchthing", "installed backends: ", "hostmem", "entry point",
                                       "`singa.backends`"]),
    # without the CPU backend or any other device, the default has nowhere to go and says why
    ({"SINGA_DISABLE_PLUGINS": "cpu,cuda,opencl,hostmem"}, ["'cpu'", "disabled by SINGA_DISABLE_PLUGINS=cpu"]),
])
def test_singa_device_errors_say_what_to_do(env, needles):
    backend = env.get("SINGA_DEVICE", "").split(":")[0]
    if backend == "cuda" and _installed("singa-backend-cuda"):
        pytest.skip("singa-backend-cuda is installed here")
    rep = run_json(DEFAULT, env=env)
    assert "error" in rep, f"expected an error, got {rep}"
    assert rep["error"].startswith("RuntimeError")
    for needle in needles:
        assert needle in rep["error"]
    if backend == "nosuchthing":
        assert "pip install" not in rep["error"], "no pseudo-command for a name nobody publishes"


@pytest.mark.parametrize("name", ["hostmem", "HostMem", "singa-plugin-hostmem", "singa_plugin_hostmem"])
def test_disable_plugins_takes_any_name_info_shows(name):
    """The backend's name (first on its `singa info` line), its distribution and its entry point all disable it."""
    rep = run_json("""
        import json
        from singa import info
        rep = info.collect()
        print(json.dumps({"backends": [b["name"] for b in rep["backends"]], "disabled": rep["disabled"]}))
    """, env={"SINGA_DISABLE_PLUGINS": f"nosuch, {name}"})
    assert "hostmem" not in rep["backends"]
    assert rep["disabled"] == ["hostmem"]


def test_disable_plugins_by_backend_name_when_the_entry_point_differs(tmp_path):
    """A plugin whose entry point is not called like its backend is disabled by the name `singa info` shows."""
    (tmp_path / "singa_test_alias.py").write_text(textwrap.dedent("""
        from singa import hookimpl
        from singa_plugin_hostmem import HostMemBackend

        class Aliased(HostMemBackend):
            name = "aliased"

        @hookimpl
        def singa_backend():
            return Aliased()
    """))
    _fake_dist(tmp_path, "singa-test-alias", {"alias_ep": "singa_test_alias"})
    code = """
        import json
        from singa import plugins
        reg = plugins.registry()
        print(json.dumps({"backends": sorted(reg.backends), "disabled": reg.disabled}))
    """
    assert "aliased" in run_json(code, path=[str(tmp_path)])["backends"]
    rep = run_json(code, path=[str(tmp_path)], env={"SINGA_DISABLE_PLUGINS": "aliased"})
    assert "aliased" not in rep["backends"]
    assert rep["disabled"] == ["aliased"]


# -- host fallback warnings -------------------------------------------------------------------------------------------


def test_fallback_warns_once_per_kernel_naming_it():
    rep = run_json("""
        import json, warnings
        import numpy as np
        from singa import device, dtypes
        from singa.backend import FallbackWarning, View
        dev = device.get_device("hostmem")
        x = View(dev.alloc(16), dtypes.float32, (2, 2))
        dev.write(x, np.ones((2, 2), np.float32))
        out = View(dev.alloc(16), dtypes.float32, (2, 2))
        col = View(dev.alloc(8), dtypes.float32, (2,))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")  # so any once-only behaviour is singa's, not Python's
            for _ in range(3):
                dev.table["exp"](out, x)                  # fallback
                dev.table["reduce_sum"](col, x, axes=(0,))  # fallback
                dev.table["add"](out, x, x)               # native
                dev.table["fill"](out, value=2.0)         # native
        print(json.dumps({
            "warnings": [[issubclass(m.category, FallbackWarning), str(m.message)] for m in w],
            "missing": dev.missing_kernels(),
            "sum": dev.read(col).tolist(),
        }))
    """)
    assert all(is_fallback for is_fallback, _ in rep["warnings"]), rep["warnings"]
    messages = [m for _, m in rep["warnings"]]
    assert len(messages) == 2, messages
    for kernel in ("exp", "reduce_sum"):
        hits = [m for m in messages if repr(kernel) in m]
        assert len(hits) == 1, f"{kernel}: {messages}"
        assert "hostmem" in hits[0]
    assert {"exp", "reduce_sum"} <= set(rep["missing"])
    assert not {"add", "fill", "copy"} & set(rep["missing"])
    assert rep["sum"] == [2.0, 2.0]


FALLBACK = """
    import json, warnings
    import numpy as np
    import singa
    from singa import device, dtypes
    from singa.backend import FallbackError, View
    dev = device.get_device("hostmem")
    x = View(dev.alloc(16), dtypes.float32, (4,))
    dev.write(x, np.ones(4, np.float32))
    out = View(dev.alloc(16), dtypes.float32, (4,))

    def run(kernel):
        dev.write(out, np.full(4, 7.0, np.float32))
        try:
            dev.table[kernel](*((out, x) if kernel == "exp" else (out, x, x)))
            result = "ran"
        except (FallbackError, ValueError) as e:
            result = f"{type(e).__name__}: {e}"
        return [result, dev.read(out).tolist()]

    rep = {}
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for step in STEPS:
            if step[0] == "set":
                try:
                    rep.setdefault("previous", []).append(singa.set_fallback(step[1]))
                except ValueError as e:
                    rep.setdefault("set_errors", []).append(str(e))
            else:
                rep.setdefault("runs", []).append(run(step[1]))
    rep["warnings"] = [str(m.message) for m in w if m.category.__name__ == "FallbackWarning"]
    print(json.dumps(rep))
"""


def _fallback_run(steps: list, env: dict | None = None) -> dict:
    return run_json(FALLBACK.replace("STEPS", repr(steps)), env=env)


def test_fallback_error_mode_from_the_environment():
    rep = _fallback_run([("run", "exp"), ("run", "add"), ("run", "exp")], env={"SINGA_FALLBACK": "error"})
    for result, values in (rep["runs"][0], rep["runs"][2]):
        assert result.startswith("FallbackError: ")
        assert "'exp'" in result
        assert "'hostmem'" in result
        assert "SINGA_FALLBACK=error" in result
        assert values == [7.0] * 4, "nothing is computed (or written) once the fallback is refused"
    assert rep["runs"][1] == ["ran", [2.0] * 4], "a native kernel is never affected"
    assert rep["warnings"] == []


def test_fallback_silent_and_warn_modes():
    for mode, warnings in (("silent", 0), ("warn", 1)):
        rep = _fallback_run([("run", "exp"), ("run", "exp")], env={"SINGA_FALLBACK": mode})
        for result, values in rep["runs"]:
            assert result == "ran"
            np.testing.assert_allclose(values, np.full(4, np.e), rtol=1e-6)
        assert len(rep["warnings"]) == warnings, rep["warnings"]
        if warnings:
            assert "'exp'" in rep["warnings"][0]


def test_set_fallback_overrides_the_environment_until_reset():
    rep = _fallback_run([("set", "error"), ("run", "exp"), ("set", None), ("run", "exp"), ("set", "WARN"),
                         ("run", "exp"), ("set", "loud")], env={"SINGA_FALLBACK": "silent"})
    assert rep["previous"] == ["silent", "error", "silent"]  # each call returns the mode it replaced
    assert rep["runs"][0][0].startswith("FallbackError: ")
    assert rep["runs"][1][0] == "ran"  # back to SINGA_FALLBACK=silent
    assert rep["runs"][2][0] == "ran"
    assert len(rep["warnings"]) == 1  # only the run under "warn" warned
    (bad,) = rep["set_errors"]
    assert "'loud'" in bad
    assert "warn, error, silent" in bad


def test_bad_fallback_variable_is_an_error_naming_it():
    rep = _fallback_run([("run", "add"), ("run", "exp")], env={"SINGA_FALLBACK": "loud"})
    assert rep["runs"][0][0] == "ran"
    assert rep["runs"][1][0].startswith("ValueError: SINGA_FALLBACK: unknown fallback mode 'loud'")


# -- a backend installed with no device ------------------------------------------------------------------------------

NODEV = """
from singa import hookimpl
from singa.backend import Backend


class NoDeviceBackend(Backend):
    name = "nodev"
    distribution = "singa-test-nodev"
    version = "0.0.1"

    def device_count(self):
        return 0

    def create_device(self, index=0):
        raise AssertionError(f"nodev:{index} requested from a backend that reported no device")


@hookimpl
def singa_backend():
    return NoDeviceBackend()
"""


@pytest.fixture(scope="module")
def nodev_site(tmp_path_factory) -> list[str]:
    """PYTHONPATH entries that install a backend with zero devices (OpenCL without a platform, CUDA without a GPU)."""
    site = tmp_path_factory.mktemp("nodev-site")
    (site / "singa_test_nodev.py").write_text(NODEV)
    _fake_dist(site, "singa-test-nodev", {"nodev": "singa_test_nodev"})
    return [str(site)]


def test_backend_without_devices_is_never_asked_for_one(nodev_site):
    rep = run_json("""
        import json
        from singa import device
        try:
            device.get_device("nodev")
            error = None
        except RuntimeError as e:
            error = str(e)
        print(json.dumps({"devices": [d.name for d in device.list_devices()], "error": error}))
    """, path=nodev_site)
    assert "nodev:0" not in rep["devices"]
    assert "hostmem:0" in rep["devices"]
    assert "backend 'nodev' is installed but has 0 device(s)" in rep["error"]
    # the whole conformance module on devices (copies between every pair of backends included) runs as if nodev were
    # not there
    proc = _pytest(["-q", "--pyargs", "singa.testing.conformance.test_device", "-k", "copy_between or identity"],
                   path=nodev_site)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nodev" not in proc.stdout


# -- the conformance suite's pytest plugin ----------------------------------------------------------------------------


def _pytest(args: list[str], path: list[str] = (), cwd: Path | None = None) -> subprocess.CompletedProcess:
    """pytest in a fresh interpreter (so plugin discovery and the pytest11 entry point run as a user's would)."""
    return run_python("", args=["-m", "pytest", "-p", "no:cacheprovider", *args], path=path, cwd=cwd, timeout=600)


def test_device_fixture_parametrisation(tmp_path):
    (tmp_path / "test_dev.py").write_text(textwrap.dedent("""
        def test_name(device):
            assert device.name in ("hostmem:0", "cpu:0") or ":" in device.name
    """))
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "conftest.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.fixture
        def device():
            return "mine"
    """))
    (tmp_path / "own" / "test_own.py").write_text("def test_own(device):\n    assert device == 'mine'\n")

    default = _pytest(["--collect-only", "-q", "test_dev.py"], cwd=tmp_path)
    assert default.returncode == 0, default.stdout + default.stderr
    assert "test_dev.py::test_name[hostmem:0]" in default.stdout
    if HAVE_CPU:
        assert "test_dev.py::test_name[cpu:0]" in default.stdout

    chosen = _pytest(["-q", "--singa-device=hostmem", "test_dev.py", "own"], cwd=tmp_path)
    assert chosen.returncode == 0, chosen.stdout + chosen.stderr
    assert "2 passed" in chosen.stdout  # hostmem only, and the conftest's own `device` is left alone

    bad = _pytest(["-q", "--singa-device=nosuchthing", "test_dev.py"], cwd=tmp_path)
    assert bad.returncode == 4, bad.stdout + bad.stderr  # usage error, before collecting
    assert "no SINGA backend named 'nosuchthing'" in bad.stderr
    out_of_range = _pytest(["-q", "--singa-device=hostmem:3", "test_dev.py"], cwd=tmp_path)
    assert out_of_range.returncode == 4
    assert "out of range" in out_of_range.stderr


MUTANT = '''
"""hostmem with one kernel wrong on purpose: backend `mutant` is the unmutated control, `mut_<name>` each carry one
mutation, so that a single pytest run checks them all."""
import numpy as np

from singa import fallback, hookimpl
from singa.backend import Backend, View, contiguous_strides
from singa_plugin_hostmem import HostMemDevice


def _mutation(dev, name):
    fb = lambda kernel: fallback.make(dev, kernel)  # noqa: E731

    def neg_ignores_strides(out, x, **kw):
        fb("neg")(out, View(x.buffer, x.dtype, x.shape, contiguous_strides(x.shape), x.offset), **kw)

    def sum_ignores_offset(out, x, axes):
        fb("reduce_sum")(out, View(x.buffer, x.dtype, x.shape, x.strides, 0), axes=axes)

    def matmul_ignores_beta(out, a, b, beta=0.0, **kw):
        fb("matmul")(out, a, b, beta=0.0, **kw)

    def scatter_overwrites(out, indices, updates, axis):
        o, idx, upd = dev.read(out), dev.read(indices).reshape(-1), dev.read(updates)
        idx = np.where(idx < 0, idx + o.shape[axis], idx)
        moved = np.moveaxis(o, axis, 0)
        moved[idx] += np.moveaxis(upd.reshape(o.shape[:axis] + (idx.size,) + o.shape[axis + 1:]), axis, 0)
        dev.write(out, o)

    def conv_backward_forgets_dilation(dx, dy, w, dilation, **kw):
        fb("conv2d_backward_data")(dx, dy, w, dilation=(1, 1), **kw)

    def uniform_key_swapped(out, low, high, seed, offset):
        fb("random_uniform")(out, low=low, high=high, seed=((seed & 0xFFFFFFFF) << 32) | (seed >> 32), offset=offset)

    return {
        "neg_ignores_strides": {"neg": neg_ignores_strides},
        "sum_ignores_offset": {"reduce_sum": sum_ignores_offset},
        "matmul_ignores_beta": {"matmul": matmul_ignores_beta},
        "scatter_overwrites": {"scatter_add": scatter_overwrites},
        "conv_backward_forgets_dilation": {"conv2d_backward_data": conv_backward_forgets_dilation},
        "uniform_key_swapped": {"random_uniform": uniform_key_swapped},
    }.get(name, {})


def hook(mutation=""):
    class MutantDevice(HostMemDevice):
        backend_name = f"mut_{mutation}" if mutation else "mutant"

        def __init__(self, id=0):
            super().__init__(id)
            self.kernels = {**HostMemDevice.kernels, **_mutation(self, mutation)}

    class MutantBackend(Backend):
        name = MutantDevice.backend_name
        distribution = "singa-plugin-mutant"

        def create_device(self, index=0):
            return MutantDevice(index)

    @hookimpl
    def singa_backend():
        return MutantBackend()

    return singa_backend
'''

# mutation -> (-k expression selecting the tests that should catch it, a test id that must fail)
MUTATIONS = {
    "neg_ignores_strides": ("test_unary and neg", "test_unary[mut_neg_ignores_strides:0-neg-float32]"),
    "sum_ignores_offset": ("test_reduce", "test_reduce[mut_sum_ignores_offset:0-reduce_sum-float32]"),
    "matmul_ignores_beta": ("test_matmul", "test_matmul[mut_matmul_ignores_beta:0-N-N-float32]"),
    "scatter_overwrites": ("scatter_add", "test_scatter_add_many_repeats[mut_scatter_overwrites:0]"),
    "conv_backward_forgets_dilation": ("test_conv2d_backward",
                                       "test_conv2d_backward[mut_conv_backward_forgets_dilation:0-x1x2x9x8-"),
    "uniform_key_swapped": ("test_random_uniform",
                            "test_random_uniform[mut_uniform_key_swapped:0-1311768467463790320-"),
}


@pytest.fixture(scope="module")
def mutant_site(tmp_path_factory) -> list[str]:
    site = tmp_path_factory.mktemp("mutant-site")
    (site / "singa_plugin_mutant.py").write_text(MUTANT)
    entry_points = {"mutant": "singa_plugin_mutant_control"}
    stub = "from singa_plugin_mutant import hook\nsinga_backend = hook({})\n"
    (site / "singa_plugin_mutant_control.py").write_text(stub.format(""))
    for m in MUTATIONS:
        (site / f"singa_plugin_mut_{m}.py").write_text(stub.format(repr(m)))
        entry_points[f"mut_{m}"] = f"singa_plugin_mut_{m}"
    _fake_dist(site, "singa-plugin-mutant", entry_points)
    return [str(site)]


def test_conformance_suite_fails_wrong_kernels(mutant_site):
    """Spot check that the suite can fail: each `mut_*` device has one wrong kernel and must fail the test that
    targets it; the unmutated control device `mutant` must pass the same tests."""
    devices = ",".join(["mutant"] + [f"mut_{m}" for m in MUTATIONS])
    keyword = " or ".join(f"({k})" for k, _ in MUTATIONS.values())
    proc = _pytest(["--pyargs", "singa.testing.conformance", f"--singa-device={devices}", "-q", "-rf", "-k", keyword],
                   path=mutant_site, cwd=Path(mutant_site[0]))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAILED")]
    assert not [line for line in failed if "[mutant:0" in line], "the control device failed:\n" + "\n".join(failed)
    for mutation, (_, test_id) in MUTATIONS.items():
        assert any(test_id in line for line in failed), f"{mutation} was not caught:\n" + "\n".join(failed)


def test_missing_onnx_package_says_how_to_install_it():
    rep = run_json("""
        import json, sys
        sys.modules["singa_onnx"] = None   # as if singa-onnx were not installed
        try:
            from singa import sonnx  # noqa: F401
            print(json.dumps({"error": None}))
        except ImportError as e:
            print(json.dumps({"error": str(e)}))
    """)
    assert "`pip install singa-onnx`" in rep["error"]
    assert "`pip install ./packages/singa-onnx`" in rep["error"]
