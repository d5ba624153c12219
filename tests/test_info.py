"""`python -m singa info`, run as a user runs it: in a subprocess, against the plugins installed in this environment.

The hostmem test plugin (tests/plugins/singa-plugin-hostmem, installed by `nox -s tests`) implements fill, copy and add;
everything else must be reported as running through the host fallback. Plugins with odd behaviour are made on the fly
as a module plus a `.dist-info` folder on PYTHONPATH, which is all importlib.metadata needs to see an entry point.
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

import singa
from singa import primitives

HOSTMEM_KERNELS = {"fill", "copy", "add"}


def run_info(*args: str, env: dict | None = None, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("SINGA_DEVICE", "SINGA_DISABLE_PLUGINS")}
    if pythonpath:
        e["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, e.get("PYTHONPATH")) if p)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "singa", *args], env=e, capture_output=True, text=True, timeout=300)


def info_json(**kw) -> dict:
    r = run_info("info", "--json", **kw)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def hostmem_installed():
    try:
        import singa_plugin_hostmem  # noqa: F401
    except ImportError:
        pytest.fail("the hostmem test plugin is not installed: pip install tests/plugins/singa-plugin-hostmem "
                    "(nox -s tests does)")


def make_plugin(root, dist: str, group: str, ep_name: str, module: str, source: str) -> str:
    """Write `module`.py and a minimal dist-info declaring it under `group`; returns the folder for PYTHONPATH."""
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{ep_name} = {module}\n")
    return str(root)


def test_versions_text():
    r = run_info("info")
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith(f"singa-core {singa.__version__} ")
    assert f"Python {platform.python_version()} " in r.stdout
    assert f"numpy {np.__version__}" in r.stdout


def test_hostmem_coverage_json(hostmem_installed):
    rep = info_json()
    assert rep["singa_core"]["version"] == singa.__version__
    assert rep["numpy"] == np.__version__
    (b,) = [b for b in rep["backends"] if b["name"] == "hostmem"]
    assert b["distribution"] == "singa-plugin-hostmem"
    assert b["version"] == "0.0.1"
    assert b["errors"] == []
    assert [d["name"] for d in b["devices"]] == ["hostmem:0"]
    assert "bytearray" in b["devices"][0]["description"]

    k = b["kernels"]
    every = primitives.names()
    assert k["total"] == len(every)
    assert k["implemented"] == len(HOSTMEM_KERNELS)
    assert k["composed"] == len(primitives.COMPOSED)
    assert k["fallback"] == len(every) - len(HOSTMEM_KERNELS) - len(primitives.COMPOSED)
    implemented = [n for g in k["groups"].values() for n in g["implemented"]]
    fallback = [n for g in k["groups"].values() for n in g["fallback"]]
    built = [n for g in k["groups"].values() for n in g["composed"]]
    assert set(implemented) == HOSTMEM_KERNELS
    assert set(built) == primitives.COMPOSED
    assert sorted(implemented + fallback + built) == sorted(every)
    for group, names in k["groups"].items():
        for n in names["implemented"] + names["fallback"] + names["composed"]:
            assert primitives.group(n) == group
    assert k["groups"]["memory"] == {"implemented": ["fill", "copy"], "composed": [], "fallback": ["cast"]}
    assert "add" in k["groups"]["binary"]["implemented"]
    assert "matmul" in k["groups"]["linalg"]["fallback"]


def test_hostmem_coverage_text(hostmem_installed):
    r = run_info("info")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "hostmem: singa-plugin-hostmem 0.0.1" in out
    assert "device hostmem:0: hostmem:0 (bytearray memory, test plugin)" in out
    section = out[out.index("hostmem: singa-plugin-hostmem"):]
    n = len(primitives.names())
    c = len(primitives.COMPOSED)
    assert f"kernels: 3/{n} implemented, {c} composed from its other kernels, {n - 3 - c} through the host fallback" \
        in section
    lines = section.splitlines()
    memory = next(i for i, line in enumerate(lines) if line.split()[:1] == ["memory"])
    assert lines[memory].split()[1] == "2/3"
    assert lines[memory + 1].strip() == "cast"
    # every fallback name of the backend is printed somewhere in its section
    block = section.split("\n\n")[0]
    for name in primitives.names():
        if name not in HOSTMEM_KERNELS:
            assert name in block


def test_singa_device_selects(hostmem_installed):
    rep = info_json(env={"SINGA_DEVICE": "hostmem"})
    assert rep["default_device"] == {"SINGA_DEVICE": "hostmem", "device": "hostmem:0", "error": None}
    r = run_info("info", env={"SINGA_DEVICE": "hostmem"})
    assert "Default device: hostmem:0 (SINGA_DEVICE=hostmem)" in r.stdout


@pytest.mark.parametrize(("spec", "words"), [
    ("nosuchdev", ["nosuchdev", "installed backends", "singa.backends"]),
    ("cuda:x", ["not an integer"]),
    ("hostmem:7", ["out of range"]),
])
def test_bad_singa_device_is_reported_not_raised(hostmem_installed, spec, words):
    rep = info_json(env={"SINGA_DEVICE": spec})
    d = rep["default_device"]
    assert d["device"] is None
    for w in words:
        assert w in d["error"]
    r = run_info("info", env={"SINGA_DEVICE": spec})
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    last = r.stdout.rstrip().splitlines()[-1]
    assert last.startswith(f"Default device: unavailable (SINGA_DEVICE={spec}):")


def test_failed_plugin_is_listed(tmp_path):
    path = make_plugin(tmp_path, "singa-test-kaputt", "singa.backends", "kaputt", "singa_test_kaputt",
                       "raise ImportError('libkaputt.so: cannot open shared object file')\n")
    rep = info_json(pythonpath=path)
    (f,) = [f for f in rep["failures"] if f["name"] == "kaputt"]
    assert f["group"] == "singa.backends"
    assert f["entry_point"] == "singa_test_kaputt"
    assert "ImportError: libkaputt.so" in f["error"]
    assert "Traceback" in f["detail"]
    assert "kaputt" not in [b["name"] for b in rep["backends"]]

    r = run_info("info", pythonpath=path)
    assert r.returncode == 0
    assert "kaputt (singa.backends, singa_test_kaputt): ImportError: libkaputt.so" in r.stdout
    assert "PluginWarning" not in r.stderr  # reported once, in the report, not also as a warning
    r = run_info("info", "-v", pythonpath=path)
    assert "raise ImportError" in r.stdout


def test_backend_errors_are_reported_per_backend(tmp_path):
    path = make_plugin(tmp_path, "singa-test-flaky", "singa.backends", "flaky", "singa_test_flaky", """
        from singa import hookimpl
        from singa.backend import Backend, Device

        class FlakyDevice(Device):
            backend_name = "flaky"
            kernels = {"fill": lambda out, value: None}

            def _raw_alloc(self, nbytes):
                return bytearray(nbytes)

            def _raw_free(self, handle):
                pass

            def description(self):
                if self.id == 1:
                    raise OSError("device 1 fell off the bus")
                return "flaky device zero"

        class FlakyBackend(Backend):
            name = "flaky"
            distribution = "singa-test-flaky"
            version = "0.0.1"

            def device_count(self):
                return 2

            def create_device(self, index=0):
                return FlakyDevice(index)

            def info(self):
                raise RuntimeError("driver query failed")

        @hookimpl
        def singa_backend():
            return FlakyBackend()
        """)
    rep = info_json(pythonpath=path, env={"SINGA_DEVICE": "flaky:1"})
    (b,) = [b for b in rep["backends"] if b["name"] == "flaky"]
    assert b["errors"] == ["info(): RuntimeError: driver query failed"]
    assert b["devices"][0] == {"name": "flaky:0", "description": "flaky device zero",
                             "dtypes": ["float32", "float16", "int32", "int64", "bool"]}
    assert b["devices"][1]["error"] == "OSError: device 1 fell off the bus"
    assert b["kernels"]["implemented"] == 1
    assert rep["default_device"]["device"] == "flaky:1"  # selecting does not need description()

    r = run_info("info", pythonpath=path)
    assert r.returncode == 0, r.stderr
    assert "error: info(): RuntimeError: driver query failed" in r.stdout
    assert "device flaky:1: error: OSError: device 1 fell off the bus" in r.stdout


def test_communicators_listed(tmp_path):
    path = make_plugin(tmp_path, "singa-test-comm", "singa.communicators", "loopback", "singa_test_comm", """
        from singa import hookimpl

        class Factory:
            name = "loopback"
            distribution = "singa-test-comm"
            version = "0.0.1"

        @hookimpl
        def singa_communicator():
            return Factory()
        """)
    rep = info_json(pythonpath=path)
    assert {"name": "loopback", "distribution": "singa-test-comm", "version": "0.0.1",
            "entry_point": "singa_test_comm"} in rep["communicators"]  # no status()/info(): nothing more reported
    mpi = next(c for c in rep["communicators"] if c["name"] == "mpi")
    assert mpi["entry_point"] == "singa.mpi"
    assert mpi["status"] is None or "mpi4py" in mpi["status"]
    assert "loopback: singa-test-comm 0.0.1" in run_info("info", pythonpath=path).stdout


def test_no_command_prints_usage():
    r = run_info()
    assert r.returncode == 2
    assert "info" in r.stderr
