"""Checkpoint files under stress: saves killed with SIGKILL, and damaged archives.

A killed save leaves a recognisable temporary beside its target, which the next save or load of that target removes
(only when its process is gone); every damaged archive raises `model.CheckpointError` naming the file and the problem.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import zipfile

import numpy as np
import pytest
from helpers import MLP

from singa import checkpoint, device, model, opt
from singa.tensor import Tensor

TEMP = re.compile(r"^\.ck\.zip\.(?P<host>.+)\.(?P<pid>\d+)\.[^.]+\.singa-tmp$")


@pytest.fixture(scope="module")
def dev():
    return device.get_default_device()


def _model(dev) -> MLP:
    m = MLP(data_size=12, perceptron_size=16, num_classes=4)
    m.optimizer = opt.SGD(lr=0.1, momentum=0.9)
    m.compile([Tensor((8, 12), dev)])
    return m


def _temporaries(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.endswith(".singa-tmp"))


def _left_by(pid: int, folder) -> bool:
    return any((m := TEMP.match(n)) is not None and m["pid"] == str(pid) for n in _temporaries(folder))


# -- temporaries ------------------------------------------------------------------------------------------------------


def test_a_save_writes_a_recognisable_temporary_beside_the_target(dev, tmp_path, monkeypatch):
    m = _model(dev)
    seen = []
    real = checkpoint._write_array

    def spy(f, arr):
        seen.extend(_temporaries(tmp_path))
        real(f, arr)

    monkeypatch.setattr(checkpoint, "_write_array", spy)
    m.save_states(tmp_path / "ck.zip")
    assert seen, "no temporary seen during the save"
    match = TEMP.match(seen[0])
    assert match is not None, seen[0]
    assert match["pid"] == str(os.getpid())
    assert match["host"] == socket.gethostname()
    assert os.listdir(tmp_path) == ["ck.zip"]


SAVER = textwrap.dedent("""
    import sys
    import numpy as np
    from singa import device, layer, model
    from singa.tensor import Tensor

    class Big(model.Model):
        def __init__(self):
            super().__init__()
            self.fc = layer.Linear(1500)

        def forward(self, x):
            return self.fc(x)

    m = Big()
    m.compile([Tensor((2, 2000), device.get_default_device())])
    print("ready", flush=True)
    while True:
        m.save_states(sys.argv[1])
""")


def _kill_save(target) -> bool:
    """Start a process that saves `target` (12 MB) in a loop and SIGKILL it while its temporary exists; True when the
    kill caught a save in flight (its temporary is left)."""
    p = subprocess.Popen([sys.executable, "-c", SAVER, str(target)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if _left_by(p.pid, target.parent):
                break
            time.sleep(0.001)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return _left_by(p.pid, target.parent)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
@pytest.mark.parametrize("then", ["save", "load"])
def test_temporaries_of_killed_saves_are_removed_by_the_next_save_or_load(dev, tmp_path, then):
    target = tmp_path / "ck.zip"
    _model(dev).save_states(target)  # a checkpoint for the load (the killed saves may never replace it)
    caught = 0
    for _ in range(8):
        if _kill_save(target):
            caught += 1
            # each killed process's first save removed what the one before it left: one temporary at a time
            assert len(_temporaries(tmp_path)) == 1
            if caught == 3:
                break
    assert caught == 3, "the kills did not interrupt saves (the test proves nothing)"
    (tmp_path / "other.zip.singa-tmp").write_bytes(b"x")  # not a temporary of ck.zip: left alone
    if then == "save":
        _model(dev).save_states(target)
    else:
        other = MLP(data_size=12, perceptron_size=7, num_classes=4)
        other.compile([Tensor((8, 12), dev)])
        with pytest.raises(ValueError, match="does not match"):  # the load fails, after the cleanup
            other.load_states(target)
    assert _temporaries(tmp_path) == ["other.zip.singa-tmp"]


def test_temporaries_of_live_processes_and_other_hosts_are_kept(dev, tmp_path):
    target = tmp_path / "ck.zip"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    host = socket.gethostname()
    try:
        names = {
            "dead": f".ck.zip.{host}.{dead.pid}.abc12345.singa-tmp",
            "live": f".ck.zip.{host}.{live.pid}.abc12345.singa-tmp",
            "self": f".ck.zip.{host}.{os.getpid()}.abc12345.singa-tmp",
            "other host": f".ck.zip.elsewhere.example.{dead.pid}.abc12345.singa-tmp",
            "other target": f".ck2.zip.{host}.{dead.pid}.abc12345.singa-tmp",
        }
        for n in names.values():
            (tmp_path / n).write_bytes(b"partial")
        assert checkpoint.stale_temporaries(target) == [str(tmp_path / names["dead"])]
        _model(dev).save_states(target)
        left = set(os.listdir(tmp_path))
        assert names["dead"] not in left
        assert {names[k] for k in ("live", "self", "other host", "other target")} <= left
    finally:
        live.kill()
        live.wait()


# -- damaged archives -----------------------------------------------------------------------------------------------


def _members(path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def _rewrite(path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for n, b in members.items():
            zf.writestr(n, b)


def _manifest(members) -> dict:
    return json.loads(members["manifest.json"])


def _with_manifest(members, change) -> dict:
    man = _manifest(members)
    change(man)
    return {**members, "manifest.json": json.dumps(man).encode()}


def _npy(descr: str, shape: tuple, data: bytes) -> bytes:
    """A .npy member with any header (it may claim more than `data` holds)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue() + data


def _flip_data_byte(path) -> None:
    """Flip one byte of the first array's data inside the (stored, uncompressed) archive: a bad CRC."""
    with zipfile.ZipFile(path) as zf:
        info = zf.infolist()[0]
    data = bytearray(path.read_bytes())
    name_len = int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], "little")
    extra_len = int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
    start = info.header_offset + 30 + name_len + extra_len
    data[start + info.file_size - 1] ^= 0x40
    path.write_bytes(bytes(data))


CORRUPTIONS = {
    "not a zip": (lambda p, m: p.write_bytes(b"not a zip at all"), "not a zip file"),
    "truncated": (lambda p, m: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "not a zip file"),
    "bad CRC": (lambda p, m: _flip_data_byte(p), "damaged: BadZipFile: Bad CRC-32"),
    "missing member": (lambda p, m: _rewrite(p, {k: v for k, v in m.items() if k != "arrays/00001.npy"}),
                       r"entry '.*' \(arrays/00001.npy\): the member is missing"),
    "missing manifest": (lambda p, m: _rewrite(p, {k: v for k, v in m.items() if k != "manifest.json"}),
                         "no manifest.json"),
    "manifest not JSON": (lambda p, m: _rewrite(p, {**m, "manifest.json": b'{"format": "singa-'}),
                          "manifest.json is not valid JSON"),
    "manifest not UTF-8": (lambda p, m: _rewrite(p, {**m, "manifest.json": b"\xff\xfe{}"}),
                           "manifest.json is not valid JSON"),
    "manifest a list": (lambda p, m: _rewrite(p, {**m, "manifest.json": b"[1, 2]"}), "holds a list, not an object"),
    "wrong format": (lambda p, m: _rewrite(p, _with_manifest(m, lambda d: d.update(format="zip"))),
                     "format 'zip' is not 'singa-checkpoint'"),
    "version a string": (lambda p, m: _rewrite(p, _with_manifest(m, lambda d: d.update(version="1"))),
                         "manifest version '1' is a str, not an integer"),
    "version a bool": (lambda p, m: _rewrite(p, _with_manifest(m, lambda d: d.update(version=True))),
                       "manifest version True is a bool, not an integer"),
    "version a float": (lambda p, m: _rewrite(p, _with_manifest(m, lambda d: d.update(version=1.0))),
                        "manifest version 1.0 is a float, not an integer"),
    "version newer": (lambda p, m: _rewrite(p, _with_manifest(m, lambda d: d.update(version=99))),
                      "version 99 is newer than this singa reads"),
    "arrays not a list": (lambda p, m: _rewrite(p, _with_manifest(m, lambda d: d.update(arrays={"a": 1}))),
                          "'arrays' is not a list"),
    "entry without file": (lambda p, m: _rewrite(p, _with_manifest(m, lambda d: d["arrays"][0].pop("file"))),
                           r"arrays\[0\] has no str 'file'"),
    "bad section": (lambda p, m: _rewrite(p, _with_manifest(m, lambda d: d["arrays"][0].update(section="x"))),
                    "section 'x'"),
    "negative shape": (lambda p, m: _rewrite(p, _with_manifest(m, lambda d: d["arrays"][0].update(shape=[-1]))),
                       r"has shape \[-1\]"),
    "values not a dict": (lambda p, m: _rewrite(p, _with_manifest(m, lambda d: d.update(values=[1]))),
                          "'values' is not an object"),
    "dtype mismatch": (lambda p, m: _rewrite(p, _with_manifest(m, lambda d: d["arrays"][0].update(dtype="int32"))),
                       r"entry .* is float32\[.*\], the manifest says int32"),
    "npy header lies": (lambda p, m: _rewrite(p, {
        **_with_manifest(m, lambda d: d["arrays"][0].update(shape=[10**12, 1], dtype="float32")),
        "arrays/00000.npy": _npy("<f4", (10**12, 1), bytes(16))}),
        r"header claims 4000000000000 bytes, the member holds \d+"),
    "object array": (lambda p, m: _rewrite(p, {**m, "arrays/00000.npy": _npy("|O", (2,), bytes(16))}),
                     r"is object\[2\]"),
    "trailing bytes": (lambda p, m: _rewrite(p, {**m, "arrays/00000.npy": m["arrays/00000.npy"] + b"\0"}),
                       "bytes after the array data"),
    "bad npy magic": (lambda p, m: _rewrite(p, {**m, "arrays/00000.npy": b"PK" + m["arrays/00000.npy"][2:]}),
                      "damaged: ValueError"),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_damaged_archives_raise_one_error_naming_file_and_problem(dev, tmp_path, kind):
    path = tmp_path / "ck.zip"
    m = _model(dev)
    m.save_states(path, aux_states={"epoch": 3})
    damage, message = CORRUPTIONS[kind]
    damage(path, _members(path))
    before = {k: t.to_numpy() for k, t in m.get_states().items()}
    with pytest.raises(model.CheckpointError) as exc:
        m.load_states(path)
    assert type(exc.value) is model.CheckpointError
    assert isinstance(exc.value, ValueError)  # callers that caught ValueError still do
    assert str(path) in str(exc.value)
    assert re.search(message, str(exc.value)), str(exc.value)
    assert all(np.array_equal(t.to_numpy(), before[k]) for k, t in m.get_states().items())  # nothing changed


def test_an_undamaged_archive_still_loads(dev, tmp_path):
    path = tmp_path / "ck.zip"
    m = _model(dev)
    m.save_states(path, aux_states={"epoch": 3, "arr": np.arange(3)})
    _rewrite(path, _members(path))  # rewritten member by member: same content, other zip layout
    aux = _model(dev).load_states(path)
    assert aux["epoch"] == 3
    assert np.array_equal(aux["arr"], np.arange(3))
