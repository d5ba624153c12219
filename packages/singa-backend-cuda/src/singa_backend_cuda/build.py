"""Compiling CUDA C++ programs with NVRTC at first use, for the device's own architecture, cached on disk.

A program is kernels/prelude.cuh followed by the source singa.gpu.table gives for it (the GPU backends' shared
kernels). NVRTC compiles it to a cubin for sm_<major><minor> of the device (or, for a device newer than this NVRTC,
for the newest architecture it knows: the driver runs older cubins of the same major version), and the cubin is kept
by singa.kernel_cache under

    $SINGA_CUDA_CACHE, else $XDG_CACHE_HOME/singa/cuda, else ~/.cache/singa/cuda        (SINGA_CUDA_CACHE=off: none)

keyed by the source, the options, the architecture and NVRTC's version, with a checksum that is verified before the
driver sees the bytes: a corrupt entry is deleted and rebuilt, never trusted. A program that does not compile raises
`nvrtc.NvrtcError` with NVRTC's log. Nothing here needs a GPU: the tests compile every program for sm_80 and sm_90.
"""

from __future__ import annotations

from pathlib import Path

from singa.kernel_cache import BinaryCache
from singa_backend_cuda import nvrtc

KERNELS = Path(__file__).resolve().parent / "kernels"
CACHE = BinaryCache("cuda", "SINGA_CUDA_CACHE", b"SGCUBIN1", ".cubin")  # bump the magic to invalidate entries
stats = CACHE.stats
# -default-device: the shared sources' plain `inline` helpers are device functions
OPTIONS = ["--std=c++17", "-default-device"]


def prelude() -> str:
    return (KERNELS / "prelude.cuh").read_text()


def target_arch(major: int, minor: int) -> int:
    """The architecture to compile for: the device's own if NVRTC knows it, else the newest NVRTC knows below it."""
    cc = 10 * major + minor
    known = [a for a in nvrtc.supported_archs() if a <= cc]
    if not known:
        raise RuntimeError(f"NVRTC {'.'.join(map(str, nvrtc.version()))} cannot compile for compute capability "
                           f"{major}.{minor} (it supports sm_{min(nvrtc.supported_archs())} and newer)")
    return cc if cc in known else max(known)


def compile_program(name: str, source: str, arch: int) -> bytes:
    """The cubin of program `name` (the prelude is prepended here) for sm_<arch>, from the cache when valid."""
    text = prelude() + "\n" + source
    version = ".".join(map(str, nvrtc.version()))
    path = CACHE.path(name, text, " ".join(OPTIONS), f"sm_{arch}", version)
    if path is not None:
        blob = CACHE.read(path)
        if blob is not None:
            stats["cache_hits"] += 1
            return blob
    cubin, _log = nvrtc.compile_program(name, text, arch, OPTIONS)
    stats["compiled"] += 1
    if path is not None and cubin:
        CACHE.write(path, cubin)
    return cubin


def compile_log(name: str, source: str, arch: int) -> str:
    """NVRTC's log for a fresh compile of `name` (no cache): empty when the source compiles without a warning."""
    _cubin, log = nvrtc.compile_program(name, prelude() + "\n" + source, arch, OPTIONS)
    return log
