"""Checkpoint files: a zip of .npy arrays and a JSON manifest, written atomically and read back defensively.

Writing. The archive goes to a temporary file beside the target, named `.<target>.<host>.<pid>.<random>.singa-tmp`, is
synced to disk and renamed over the target, so an interrupted or failed save leaves the previous checkpoint intact. A
save killed outright (kill -9, power loss) leaves its temporary behind: the next save or load of the same target
removes the temporaries whose process is gone (`remove_stale_temporaries`).

Reading. Every way a file can be damaged (not a zip, a bad CRC, a missing member, a broken or mistyped manifest, an
array whose header disagrees with the manifest or claims more bytes than the member holds) raises `CheckpointError`,
naming the file and what is wrong. Nothing is unpickled, and no array is allocated before its size is checked
against the bytes that are really there.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import tempfile
import zipfile
import zlib
from typing import Any

import numpy as np

__all__ = ["FORMAT", "VERSION", "CheckpointError", "write", "read", "stale_temporaries", "remove_stale_temporaries"]

FORMAT = "singa-checkpoint"
VERSION = 2  # 2: optimizer states in SINGA's groups (entries carry "group"); 1 still loads
_SUFFIX = ".singa-tmp"
_SECTIONS = ("states", "optimizer", "aux")
_KINDS = ("tensor", "array")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read (damaged, truncated, or not a SINGA checkpoint); the message says which file
    and what is wrong."""


# -- temporaries ------------------------------------------------------------------------------------------------------


def _host() -> str:
    return socket.gethostname().replace(os.sep, "_") or "localhost"


def _temp_prefix(fpath: str) -> str:
    return f".{os.path.basename(fpath)}."


def _process_gone(pid: int) -> bool:
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return True
    except OSError:  # it exists, under another user
        return False
    return False


def stale_temporaries(fpath: str | os.PathLike) -> list[str]:
    """Paths of the temporaries of saves of `fpath` whose process (on this host) no longer runs."""
    fpath = os.fspath(fpath)
    folder = os.path.dirname(os.path.abspath(fpath))
    prefix, host = _temp_prefix(fpath), _host()
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    out = []
    for name in names:
        if not (name.startswith(prefix) and name.endswith(_SUFFIX)):
            continue
        parts = name[len(prefix):-len(_SUFFIX)].rsplit(".", 2)  # host (may hold dots), pid, random
        if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
            continue
        if os.name == "nt" or _process_gone(int(parts[1])):  # Windows: an open file refuses the unlink below
            out.append(os.path.join(folder, name))
    return out


def remove_stale_temporaries(fpath: str | os.PathLike) -> None:
    """Delete what killed saves of `fpath` left behind (errors, such as a read-only folder, are ignored)."""
    for path in stale_temporaries(fpath):
        with contextlib.suppress(OSError):
            os.unlink(path)


# -- writing ----------------------------------------------------------------------------------------------------------


def _write_array(f: Any, arr: np.ndarray) -> None:
    # (np.ascontiguousarray would turn a 0-d array into shape (1,))
    np.lib.format.write_array(f, np.array(arr, order="C", copy=not arr.flags.c_contiguous), allow_pickle=False)


def write(fpath: str | os.PathLike, manifest: dict, data: list[np.ndarray]) -> None:
    """Write the manifest and one .npy member per entry of manifest['arrays'] (with `data` in the same order) to
    fpath, atomically (see the module's docstring)."""
    fpath = os.fspath(fpath)
    remove_stale_temporaries(fpath)
    folder = os.path.dirname(os.path.abspath(fpath))
    fd, tmp = tempfile.mkstemp(prefix=f"{_temp_prefix(fpath)}{_host()}.{os.getpid()}.", suffix=_SUFFIX, dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
                for entry, arr in zip(manifest["arrays"], data):
                    with zf.open(entry["file"], "w", force_zip64=True) as member:
                        _write_array(member, arr)
                zf.writestr("manifest.json", json.dumps(manifest, indent=1))
            f.flush()
            os.fsync(f.fileno())
        try:
            mode = os.stat(fpath).st_mode & 0o777
        except FileNotFoundError:
            mode = 0o644
        os.chmod(tmp, mode)
        os.replace(tmp, fpath)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable where the platform allows
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


# -- reading ----------------------------------------------------------------------------------------------------------


def _check_manifest(fail: Any, manifest: Any) -> None:
    if not isinstance(manifest, dict):
        fail(f"manifest.json holds a {type(manifest).__name__}, not an object")
    if manifest.get("format") != FORMAT:
        fail(f"format {manifest.get('format')!r} is not {FORMAT!r} (not a SINGA checkpoint)")
    version = manifest.get("version")
    if type(version) is not int:
        fail(f"manifest version {version!r} is a {type(version).__name__}, not an integer")
    if version > VERSION:
        fail(f"checkpoint format version {version} is newer than this singa reads ({VERSION}); upgrade singa")
    if version < 1:
        fail(f"checkpoint format version {version} does not exist")
    if not isinstance(manifest.get("values", {}), dict):
        fail("manifest 'values' is not an object")
    if not isinstance(manifest.get("optimizer", ""), str):
        fail("manifest 'optimizer' is not a string")
    arrays = manifest.get("arrays", [])
    if not isinstance(arrays, list):
        fail("manifest 'arrays' is not a list")
    for i, e in enumerate(arrays):
        if not isinstance(e, dict):
            fail(f"manifest arrays[{i}] is not an object")
        for key, kind in (("section", str), ("name", str), ("kind", str), ("file", str), ("dtype", str),
                          ("shape", list)):
            if not isinstance(e.get(key), kind):
                fail(f"manifest arrays[{i}] has no {kind.__name__} {key!r} (got {e.get(key)!r})")
        if e["section"] not in _SECTIONS or e["kind"] not in _KINDS:
            fail(f"manifest arrays[{i}] ({e['name']!r}) has section {e['section']!r} / kind {e['kind']!r}")
        if not all(type(d) is int and d >= 0 for d in e["shape"]):
            fail(f"manifest arrays[{i}] ({e['name']!r}) has shape {e['shape']!r}")


def _read_member(fail: Any, zf: zipfile.ZipFile, e: dict) -> np.ndarray:
    where = f"entry {e['name']!r} ({e['file']})"
    try:
        info = zf.getinfo(e["file"])
    except KeyError:
        fail(f"{where}: the member is missing")
    with zf.open(info) as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            fail(f"{where}: .npy format version {version} is not supported")
        if dtype.hasobject or str(dtype) != e["dtype"] or list(shape) != e["shape"]:
            fail(f"{where} is {dtype}{list(shape)}, the manifest says {e['dtype']}{e['shape']}")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > info.file_size:
            fail(f"{where}: its header claims {nbytes} bytes, the member holds {info.file_size}")
        buf = bytearray(nbytes)
        if f.readinto(buf) != nbytes:
            fail(f"{where}: truncated (fewer than the {nbytes} bytes of a {dtype}{list(shape)} array)")
        if f.read(1):
            fail(f"{where}: bytes after the array data")
    arr = np.frombuffer(buf, dtype)
    return arr.reshape(shape[::-1]).T if fortran else arr.reshape(shape)


def read(fpath: str | os.PathLike) -> tuple[dict, list[tuple[dict, np.ndarray]]]:
    """(manifest, [(manifest entry, array)]) of a checkpoint; CheckpointError for anything damaged."""
    fpath = os.fspath(fpath)
    remove_stale_temporaries(fpath)

    def fail(why: str) -> None:
        raise CheckpointError(f"checkpoint {fpath!r}: {why}")

    try:
        zf = zipfile.ZipFile(fpath, "r")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {fpath!r}: not a zip file (not a SINGA checkpoint, or a damaged one): "
                              f"{exc}") from None
    try:
        with zf:
            try:
                raw = zf.read("manifest.json")
            except KeyError:
                fail("no manifest.json (not a SINGA checkpoint)")
            try:
                manifest = json.loads(raw)
            except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                fail(f"manifest.json is not valid JSON: {exc}")
            _check_manifest(fail, manifest)
            out = [(e, _read_member(fail, zf, e)) for e in manifest.get("arrays", [])]
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, OSError, NotImplementedError, RuntimeError,
            zlib.error) as exc:
        # bad CRCs, truncated members, damaged .npy headers, unsupported compression or encryption
        raise CheckpointError(f"checkpoint {fpath!r}: damaged: {type(exc).__name__}: {exc}") from None
    return manifest, out
