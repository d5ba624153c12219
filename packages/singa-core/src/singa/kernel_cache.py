"""An on-disk cache of compiled kernel binaries, for backends that compile at first use (OpenCL, CUDA).

Entries live under

    $<ENV>, else $XDG_CACHE_HOME/singa/<backend>, else ~/.cache/singa/<backend>        (<ENV>=off disables it)

in files named after the program and a SHA-256 key over everything the binary depends on (the source, the compiler
options, the device or architecture, the compiler's version, the cache format): a new driver or a changed kernel gives
a new key, so a stale binary is never looked up. Each file carries the SHA-256 of the binary it holds; `read` checks
it *before* anyone sees the bytes (some drivers abort the process on a malformed binary) and deletes an entry that is
not exactly what was written, so the caller rebuilds it. Writing is atomic (a temporary file renamed over the entry),
and a cache that cannot be written costs only the rebuild next time, with one warning.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import tempfile
import warnings
from pathlib import Path

_HEADER = struct.Struct("<8s32sQ")  # magic, sha256 of the binary, its length


class BinaryCache:
    """The cache of one backend: `magic` (8 bytes) is its file format; bump it to invalidate every entry."""

    def __init__(self, backend: str, env: str, magic: bytes, suffix: str):
        if len(magic) != 8:
            raise ValueError("the cache magic must be 8 bytes")
        self.backend = backend
        self.env = env
        self.magic = magic
        self.suffix = suffix
        # what happened to each request in this process (tests and `python -m singa info` read it)
        self.stats = {"cache_hits": 0, "compiled": 0, "rejected": 0, "write_errors": 0}
        self._warned_write = False

    def directory(self) -> Path | None:
        """Where binaries are kept, or None when caching is off."""
        env = os.environ.get(self.env)
        if env is not None and env.strip().lower() in ("", "0", "off", "none"):
            return None
        if env:
            return Path(env).expanduser()
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "singa" / self.backend

    def key(self, *parts: str) -> str:
        h = hashlib.sha256()
        for part in (self.magic.decode(), *parts):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()

    def path(self, name: str, *parts: str) -> Path | None:
        """The entry of program `name` whose binary depends on `parts`; None when caching is off."""
        d = self.directory()
        if d is None:
            return None
        safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)[:80]
        return d / f"{safe}-{self.key(*parts)[:40]}{self.suffix}"

    def read(self, path: Path) -> bytes | None:
        """The binary of an entry, or None (and the file removed) when it is not exactly what was written."""
        try:
            raw = path.read_bytes()
        except OSError:
            return None
        ok = len(raw) >= _HEADER.size
        if ok:
            magic, digest, length = _HEADER.unpack_from(raw)
            blob = raw[_HEADER.size:]
            ok = magic == self.magic and length == len(blob) and length > 0 and hashlib.sha256(blob).digest() == digest
        if not ok:
            self.discard(path)
            return None
        return blob

    def discard(self, path: Path) -> None:
        """Remove an entry found invalid (a bad checksum, or a binary the driver refused)."""
        self.stats["rejected"] += 1
        with contextlib.suppress(OSError):
            path.unlink()

    def write(self, path: Path, blob: bytes) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(_HEADER.pack(self.magic, hashlib.sha256(blob).digest(), len(blob)))
                    f.write(blob)
                os.replace(tmp, path)  # atomic: a reader sees the old entry or the whole new one
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as exc:
            self.stats["write_errors"] += 1
            if not self._warned_write:
                self._warned_write = True
                warnings.warn(f"singa {self.backend}: cannot write the kernel cache at {path.parent} ({exc}); "
                              f"programs will be rebuilt in every process (set {self.env} to a writable folder)",
                              RuntimeWarning, stacklevel=4)
