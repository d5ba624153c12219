"""SINGA's device functions, resolved through the installed backend plugins.

`SINGA_DEVICE` (`cpu`, `cuda`, `cuda:1`, `opencl:0`, or a plugin's own name) chooses what `get_default_device()`
returns; unset, it is the CPU backend, or where that is not installed (`pip install singa-core singa-backend-cuda`)
the first device of the first installed backend that has one. Devices are created once per (backend, index) and
shared.
"""

from __future__ import annotations

import os

from singa import plugins
from singa.backend import Device

__all__ = [
    "Device", "get_default_device", "set_default_device", "get_device", "parse_device_spec",
    "create_cpu_device", "create_cuda_gpu", "create_cuda_gpu_on", "create_cuda_gpus", "create_cuda_gpus_on",
    "create_opencl_device", "get_num_gpus", "get_gpu_ids", "get_gpu_mem_size", "get_num_opencl_platforms",
    "get_num_opencl_devices", "device_query", "enable_lazy_alloc", "list_devices",
]

_devices: dict[tuple[str, int], Device] = {}
_default: Device | None = None


def parse_device_spec(spec: str) -> tuple[str, int]:
    """'cuda:1' -> ('cuda', 1); 'cpu' -> ('cpu', 0)."""
    name, colon, idx = spec.strip().partition(":")
    if not name:
        raise ValueError(f"empty device name in {spec!r}")
    if not colon:
        return name.lower(), 0
    if not (idx.isascii() and idx.isdigit()):  # 'cpu:' and 'cpu:abc' alike; no sign, blanks or underscores
        raise ValueError(f"device index in {spec!r} is not an integer N >= 0 (write 'name' or 'name:N')")
    return name.lower(), int(idx)


def get_device(spec: str) -> Device:
    """The device named by a spec such as 'cpu', 'opencl:0' or 'cuda:1'."""
    name, index = parse_device_spec(spec)
    key = (name, index)
    dev = _devices.get(key)
    if dev is None:
        backend = plugins.get_backend(name)
        count = backend.device_count()
        if count == 0:
            why = backend.info().get("status")  # e.g. no driver, no OpenCL platform
            raise RuntimeError(f"backend {name!r} is installed but has 0 device(s) on this machine: "
                               + (why or "`python -m singa info` may say why"))
        if not 0 <= index < count:
            raise RuntimeError(f"backend {name!r} has {count} device(s); index {index} is out of range")
        dev = backend.create_device(index)
        _devices[key] = dev
    return dev


def get_default_device() -> Device:
    """The device named by `SINGA_DEVICE`; unset, the CPU, or the first device there is without a CPU backend."""
    global _default
    if _default is None:
        _default = get_device(os.environ.get("SINGA_DEVICE", "").strip() or _unset_default_spec())
    return _default


def _unset_default_spec() -> str:
    reg = plugins.registry()
    backends = reg.backends
    if "cpu" in backends or any(f.name == "cpu" for f in reg.failures):
        return "cpu"  # a CPU backend that failed to load is an error to show, not to route around
    for name in ("cuda", "opencl", *sorted(backends)):  # SINGA's order of preference, then any plugin's
        if name in backends and backends[name].device_count() > 0:
            return name
    return "cpu"  # nothing usable: get_device says what to install


def set_default_device(dev: Device | str) -> Device:
    global _default
    _default = get_device(dev) if isinstance(dev, str) else dev
    return _default


def list_devices() -> list[Device]:
    """Every device of every installed backend (a backend with no device contributes none)."""
    out = []
    for name, backend in sorted(plugins.registry().backends.items()):
        for i in range(backend.device_count()):
            out.append(get_device(f"{name}:{i}"))
    return out


def create_cpu_device() -> Device:
    return get_device("cpu")


def create_cuda_gpu() -> Device:
    return get_device("cuda:0")


def create_cuda_gpu_on(device_id: int) -> Device:
    return get_device(f"cuda:{int(device_id)}")


def create_cuda_gpus(num: int) -> list[Device]:
    return [create_cuda_gpu_on(i) for i in range(num)]


def create_cuda_gpus_on(device_ids) -> list[Device]:
    return [create_cuda_gpu_on(i) for i in device_ids]


def create_opencl_device() -> Device:
    return get_device("opencl:0")


def _count(name: str) -> int:
    backend = plugins.registry().backends.get(name)
    return backend.device_count() if backend is not None else 0


def get_num_gpus() -> int:
    return _count("cuda")


def get_gpu_ids() -> list[int]:
    return list(range(get_num_gpus()))


def get_gpu_mem_size(id: int) -> tuple[int, int]:
    """(free, total) bytes of a CUDA device, as the CUDA backend reports them."""
    return create_cuda_gpu_on(id).mem_info()


def get_num_opencl_platforms() -> int:
    backend = plugins.registry().backends.get("opencl")
    return backend.platform_count() if backend is not None else 0


def get_num_opencl_devices() -> int:
    return _count("opencl")


def device_query(id: int, verbose: bool = False) -> str:
    text = create_cuda_gpu_on(id).description()
    if verbose:
        print(text)
    return text


def enable_lazy_alloc(enable: bool) -> None:
    """Accepted for compatibility: every backend here allocates on first write through its pool."""
    Device.EnableLazyAlloc(enable)
