"""The OpenCL backend object that the `singa.backends` entry point hands to singa-core.

Devices are every device of every platform the ICD loader reports, GPUs and accelerators first, then CPUs (so that
`opencl:0` is the fastest device on a machine with both); `SINGA_OPENCL_DEVICE_TYPE=cpu|gpu|accelerator` keeps one
kind only. Without the ICD loader, or with no platform installed, the backend is listed with no devices and says why:
`import singa` and the other backends are never affected.
"""

from __future__ import annotations

import os

from singa.backend import Backend
from singa_backend_opencl import build, cl, clblast

_ORDER = {"GPU": 0, "accelerator": 1, "device": 2, "CPU": 3}


class OpenclBackend(Backend):
    name = "opencl"
    distribution = "singa-backend-opencl"

    def __init__(self):
        self._infos = None
        self.error: str | None = None

    def _discover(self) -> list:
        if self._infos is not None:
            return self._infos
        from singa_backend_opencl.device import DeviceInfo

        infos = []
        if cl.lib is None:
            self.error = cl.load_error
        else:
            try:
                for pid in cl.platforms():
                    infos += [DeviceInfo(pid, did) for did in cl.devices(pid)]
            except (cl.CLError, OSError) as exc:
                self.error = f"OpenCL platform query failed: {exc}"
            if not infos and self.error is None:
                self.error = "no OpenCL platform or device found: install pocl-opencl-icd (or a GPU vendor's ICD)"
        kind = os.environ.get("SINGA_OPENCL_DEVICE_TYPE", "").strip().lower()
        if kind:
            infos = [i for i in infos if i.kind.lower() == kind]
        infos.sort(key=lambda i: _ORDER.get(i.kind, 2))  # stable: platform order within a kind
        self._infos = infos
        return infos

    def device_count(self) -> int:
        return len(self._discover())

    def platform_count(self) -> int:
        return len(cl.platforms()) if cl.lib is not None else 0

    def create_device(self, index: int = 0):
        from singa_backend_opencl.device import OpenclDevice

        infos = self._discover()
        if not 0 <= index < len(infos):
            reason = f": {self.error}" if self.error else ""
            raise RuntimeError(f"opencl:{index} does not exist ({len(infos)} OpenCL device(s){reason})")
        return OpenclDevice(index, infos[index])

    def info(self) -> dict[str, str]:
        infos = self._discover()
        out = {}
        if self.error:
            out["status"] = self.error
        out["platforms"] = "; ".join(sorted({f"{i.platform_name} ({i.platform_version})" for i in infos})) or "none"
        out["clblast"] = "libclblast loaded" if clblast.lib is not None else f"not used: {clblast.load_error}"
        d = build.cache_dir()
        out["kernel cache"] = str(d) if d is not None else "off (SINGA_OPENCL_CACHE)"
        return out
