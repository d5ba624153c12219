"""The CPU backend object that the `singa.backends` entry point hands to singa-core."""

from __future__ import annotations

import os

import scipy_openblas32

from singa.backend import Backend
from singa_backend_cpu import isa, onednn, table
from singa_backend_cpu.device import VECTOR_PATH, CpuDevice, ffi, lib


class CpuBackend(Backend):
    name = "cpu"
    distribution = "singa-backend-cpu"

    def device_count(self) -> int:
        return 1

    def create_device(self, index: int = 0) -> CpuDevice:
        if index != 0:
            raise RuntimeError(f"the cpu backend has one device (cpu:0); cpu:{index} does not exist")
        return CpuDevice(index)

    def info(self) -> dict[str, str]:
        return {
            "blas": f"{'float32 on oneDNN sgemm, the rest on ' if table.SGEMM == 'onednn' else ''}OpenBLAS from "
                    f"scipy-openblas32 {scipy_openblas32.__version__} "
                    f"({ffi.string(lib.scipy_openblas_get_config()).decode()})",
            "threads": f"{lib.sg_get_num_threads()} OpenMP threads (oneDNN's too); OpenBLAS's products are split "
                       f"over them, OpenBLAS running {lib.scipy_openblas_get_num_threads()} thread inside each",
            "thread placement": _placement(),
            "vector path": _vector_path(),
            "compiler flags": ffi.string(lib.sg_build_flags()).decode(),
            "onednn": onednn.status(),
            "winograd": "F(4x4, 3x3) for our own float32 3x3 stride-1 convolutions where they fit"
                        if lib.sg_get_winograd() else "off (SINGA_WINOGRAD=0)",
        }


def _placement() -> str:
    from singa_backend_cpu import placement

    return placement()


def _vector_path() -> str:
    """Which kernel module runs, why, and what else this install has."""
    chosen = isa.by_name(VECTOR_PATH)
    forced = os.environ.get(isa.FORCE_VARIABLE, "").strip()
    why = f"forced by {isa.FORCE_VARIABLE}={forced}" if forced else (
        "a build for this machine" if VECTOR_PATH == isa.NATIVE else "the widest this CPU runs")
    return (f"{chosen.name} ({chosen.summary}; {why}); built: {', '.join(isa.built())}; "
            f"this CPU runs up to {isa.widest_supported()}")
