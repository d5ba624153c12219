"""Finding NVIDIA's libraries (NVRTC, cuBLAS, cuDNN, NCCL) in their PyPI wheels, or on the system.

NVIDIA publishes each CUDA library as a wheel that unpacks its shared objects into `site-packages/nvidia/.../lib`
(CUDA 13 wheels share `nvidia/cu13/lib`; cuDNN and NCCL keep `nvidia/cudnn/lib`, `nvidia/nccl/lib`). Nothing here is
loaded at import time: `find(soname)` looks in every site-packages folder of this interpreter, then lets the dynamic
loader search (LD_LIBRARY_PATH, the system's CUDA); `load` opens the library with its companions first (cuBLAS needs
cuBLASLt, cuDNN's front library opens its engine libraries by name, NVRTC its builtins), globally, so that later
look-ups by name find the copies from the same folder. A library that cannot be found raises `MissingLibrary`,
naming the wheel that provides it.
"""

from __future__ import annotations

import ctypes
import glob
import os
import site
import sys
import threading

# soname -> (the wheel providing it, companions to load first from the same folder)
WHEELS = {
    "libnvrtc.so.13": ("nvidia-cuda-nvrtc", ["libnvrtc-builtins.so.13.*"]),
    "libcublas.so.13": ("nvidia-cublas", ["libcublasLt.so.13"]),
    "libcudnn.so.9": ("nvidia-cudnn-cu13", ["libcudnn_graph.so.9", "libcudnn_engines_precompiled.so.9",
                                            "libcudnn_engines_runtime_compiled.so.9", "libcudnn_heuristic.so.9",
                                            "libcudnn_ops.so.9", "libcudnn_cnn.so.9", "libcudnn_adv.so.9"]),
    "libnccl.so.2": ("nvidia-nccl-cu13", []),
}


class MissingLibrary(RuntimeError):
    """An NVIDIA library the backend needs is not installed."""


def _site_dirs() -> list[str]:
    dirs = []
    for d in [*site.getsitepackages(), site.getusersitepackages(), *sys.path]:
        if d and os.path.isdir(os.path.join(d, "nvidia")) and d not in dirs:
            dirs.append(d)
    return dirs


def find(soname: str) -> str | None:
    """The path of `soname` inside an installed NVIDIA wheel, or None (the loader may still find it by name)."""
    env = os.environ.get("SINGA_CUDA_LIBRARY_PATH")  # extra folders, searched first
    folders = [f for f in (env or "").split(os.pathsep) if f]
    for d in _site_dirs():
        folders += sorted(glob.glob(os.path.join(d, "nvidia", "*", "lib")))
    for folder in folders:
        hits = sorted(glob.glob(os.path.join(folder, soname)))
        if hits:
            return hits[-1]
    return None


_loaded: dict[str, str] = {}
_lock = threading.Lock()


def load(soname: str, ffi) -> tuple[object, str]:
    """(the cffi library object, the path it came from) for `soname`, with its companions loaded first."""
    wheel, companions = WHEELS.get(soname, (None, []))
    with _lock:
        path = find(soname)
        errors = []
        if path is not None:
            folder = os.path.dirname(path)
            for pattern in companions:
                for comp in sorted(glob.glob(os.path.join(folder, pattern)))[-1:]:
                    try:
                        ctypes.CDLL(comp, mode=ctypes.RTLD_GLOBAL)
                    except OSError as exc:  # an engine library cuDNN can live without; the front library decides
                        errors.append(f"{os.path.basename(comp)}: {exc}")
        for candidate in ([path] if path else []) + [soname]:
            try:
                lib = ffi.dlopen(candidate, ffi.RTLD_NOW | ffi.RTLD_GLOBAL)
            except OSError as exc:
                errors.append(f"{candidate}: {exc}")
                continue
            _loaded[soname] = candidate
            return lib, candidate
    hint = f"pip install {wheel}" if wheel else "install it"
    raise MissingLibrary(f"{soname} was not found ({'; '.join(errors) or 'not in any nvidia/*/lib folder'}): "
                         f"{hint}")


def loaded() -> dict[str, str]:
    """soname -> the path each loaded library came from (for `python -m singa info`)."""
    return dict(_loaded)
