"""The CUDA backend object that the `singa.backends` entry point hands to singa-core.

Devices are the CUDA devices the NVIDIA driver reports, in its order (`cuda:0` is CUDA's device 0; CUDA_VISIBLE_DEVICES
applies as usual). Without the driver, without a device, or with a driver too old for CUDA 13, the backend is listed
with no devices and says why: `import singa` and the other backends are never affected. NVIDIA's libraries (NVRTC,
cuBLAS, cuDNN) come from their PyPI wheels and are loaded when first needed.
"""

from __future__ import annotations

from singa.backend import Backend
from singa_backend_cuda import build, cuda, libs


class CudaBackend(Backend):
    name = "cuda"
    distribution = "singa-backend-cuda"

    def __init__(self):
        self._infos = None
        self.error: str | None = None

    def _discover(self) -> list:
        if self._infos is not None:
            return self._infos
        from singa_backend_cuda.device import DeviceInfo

        infos = []
        self.error = cuda.init()
        if self.error is None:
            try:
                infos = [DeviceInfo(i) for i in range(cuda.device_count())]
            except cuda.CudaError as exc:
                self.error = f"CUDA device query failed: {exc}"
            if not infos and self.error is None:
                self.error = "the NVIDIA driver reports no CUDA device"
        self._infos = infos
        return infos

    def device_count(self) -> int:
        return len(self._discover())

    def create_device(self, index: int = 0):
        from singa_backend_cuda.device import CudaDevice

        infos = self._discover()
        if not 0 <= index < len(infos):
            reason = f": {self.error}" if self.error else ""
            raise RuntimeError(f"cuda:{index} does not exist ({len(infos)} CUDA device(s){reason})")
        return CudaDevice(index, infos[index])

    def info(self) -> dict[str, str]:
        self._discover()
        out = {}
        if self.error:
            out["status"] = self.error
        v = cuda.driver_version()
        out["driver"] = f"CUDA {cuda.version_text(v)}" if v else "none"
        out["nvrtc"] = _library_line(lambda: ".".join(map(str, _nvrtc_version())), "libnvrtc.so.13")
        out["cublas"] = _library_line(None, "libcublas.so.13")
        out["cudnn"] = _library_line(None, "libcudnn.so.9")
        d = build.CACHE.directory()
        out["kernel cache"] = str(d) if d is not None else "off (SINGA_CUDA_CACHE)"
        return out


def _nvrtc_version() -> tuple[int, int]:
    from singa_backend_cuda import nvrtc

    return nvrtc.version()


def _library_line(describe, soname: str) -> str:
    """Where a library is (or would be) loaded from, without loading cuBLAS/cuDNN just to print it."""
    loaded = libs.loaded().get(soname)
    if loaded:
        extra = describe() if describe else ""
        return f"{extra + ' ' if extra else ''}{loaded}"
    path = libs.find(soname)
    wheel = libs.WHEELS[soname][0]
    if path is None:
        return f"not found (pip install {wheel})"
    return f"{path} (loaded on first use)"
