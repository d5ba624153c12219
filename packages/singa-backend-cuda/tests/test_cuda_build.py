"""What the CUDA backend can show without a GPU: every kernel compiles with NVRTC, cleanly, for sm_80 and sm_90; the
cubin cache rebuilds corrupt entries; compiler errors carry NVRTC's log; the package imports and reports why there
is no device; launch arguments are laid out as the kernels declare them; NVIDIA's wheels are found by their layout."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from concurrent.futures import ThreadPoolExecutor

import pytest

from singa.gpu import table as gpu

ARCHS = (80, 90)
# what the shared sources ask of the device when they are rendered (the CUDA device's values)
DEVICE = types.SimpleNamespace(fp64=True, int64_atomics=True)


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: f"sm_{a}")
def test_every_program_compiles_without_warnings(nvrtc_lib, arch):
    from singa_backend_cuda import build

    names = gpu.program_names()
    assert len(names) > 250  # every element-wise entry and dtype, casts, memory, reductions, nn, indexing, random

    def compile_one(name):
        try:
            return name, build.compile_log(name, gpu.source_of(name, DEVICE), arch)
        except Exception as exc:  # noqa: BLE001 - collected, reported all at once below
            return name, f"{type(exc).__name__}: {exc}"

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        logs = dict(pool.map(compile_one, names))
    bad = {n: log for n, log in logs.items() if log.strip()}
    assert not bad, f"{len(bad)} of {len(names)} programs failed or warned for sm_{arch}; first: " + \
        "\n".join(f"--- {n}\n{log[:2000]}" for n, log in list(bad.items())[:3])


def test_compile_error_carries_the_log(nvrtc_lib):
    from singa_backend_cuda import nvrtc

    with pytest.raises(nvrtc.NvrtcError) as err:
        nvrtc.compile_program("broken", "__global__ void k() { undefined_name(); }", 90, [])
    assert "broken" in str(err.value)
    assert "sm_90" in str(err.value)
    assert "undefined_name" in err.value.log


def test_cubin_cache_hits_and_rebuilds_corrupt_entries(nvrtc_lib, tmp_path, monkeypatch):
    from singa_backend_cuda import build

    monkeypatch.setenv("SINGA_CUDA_CACHE", str(tmp_path))
    source = gpu.source_of("ew:add:float32", DEVICE)
    before = dict(build.stats)
    first = build.compile_program("ew:add:float32", source, 90)
    assert build.stats["compiled"] == before["compiled"] + 1
    assert first[:4] == b"\x7fELF"  # a cubin is an ELF image
    (entry,) = tmp_path.glob("ew_add_float32-*.cubin")
    assert build.compile_program("ew:add:float32", source, 90) == first
    assert build.stats["cache_hits"] == before["cache_hits"] + 1
    for damage in (lambda b: b[:-7], lambda b: b[:50] + bytes([b[50] ^ 1]) + b[51:], lambda b: b""):
        entry.write_bytes(damage(entry.read_bytes()) if entry.exists() else b"")
        assert build.compile_program("ew:add:float32", source, 90) == first
    assert build.stats["rejected"] >= before["rejected"] + 3
    # another architecture or another source is another entry
    build.compile_program("ew:add:float32", source, 80)
    build.compile_program("ew:add:float32", source + "\n// changed\n", 90)
    assert len(list(tmp_path.glob("ew_add_float32-*.cubin"))) == 3


def test_target_arch(nvrtc_lib):
    from singa_backend_cuda import build, nvrtc

    known = nvrtc.supported_archs()
    assert build.target_arch(9, 0) == 90
    assert build.target_arch(8, 6) == 86
    newest = max(known)
    assert build.target_arch(newest // 10 + 5, 0) == newest  # a device newer than NVRTC: its newest arch
    with pytest.raises(RuntimeError, match="cannot compile"):
        build.target_arch(3, 0)


def test_launch_arguments_are_aligned_like_c():
    from singa_backend_cuda.device import CudaDevice

    buf, shared = CudaDevice._pack([b"\1" * 8, b"\2" * 4, b"\3" * 8, b"\4" * 2, b"\5" * 4, 256, b"\6" * 328])
    assert shared == 256
    # 8 | 4 (+4 pad) | 8 | 2 (+2 pad) | 4 | 8 (the scratch size) | 328
    assert buf[:8] == b"\1" * 8
    assert buf[8:12] == b"\2" * 4
    assert buf[12:16] == bytes(4)
    assert buf[16:24] == b"\3" * 8
    assert buf[24:26] == b"\4" * 2
    assert buf[28:32] == b"\5" * 4
    assert int.from_bytes(buf[32:40], "little") == 256
    assert buf[40:] == b"\6" * 328


def test_wheel_layouts_are_found(tmp_path, monkeypatch):
    from singa_backend_cuda import libs

    for rel in ("nvidia/cu13/lib/libcublas.so.13", "nvidia/cudnn/lib/libcudnn.so.9"):
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"")
    monkeypatch.setattr(libs, "_site_dirs", lambda: [str(tmp_path)])
    monkeypatch.delenv("SINGA_CUDA_LIBRARY_PATH", raising=False)
    assert libs.find("libcublas.so.13") == str(tmp_path / "nvidia/cu13/lib/libcublas.so.13")
    assert libs.find("libcudnn.so.9") == str(tmp_path / "nvidia/cudnn/lib/libcudnn.so.9")
    assert libs.find("libnccl.so.2") is None


def test_missing_library_names_the_wheel(monkeypatch):
    from singa_backend_cuda import cudnn, libs

    monkeypatch.setattr(libs, "find", lambda soname: None)
    monkeypatch.setattr(cudnn, "SONAME", "libcudnn-absent.so.9")
    monkeypatch.setattr(cudnn, "_lib", None)
    monkeypatch.setitem(libs.WHEELS, "libcudnn-absent.so.9", ("nvidia-cudnn-cu13", []))
    with pytest.raises(libs.MissingLibrary, match="pip install nvidia-cudnn-cu13"):
        cudnn.get()


def _run(script: str, **env) -> subprocess.CompletedProcess:
    full = dict(os.environ)
    full.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, env=full,
                          timeout=300, check=False)


def test_no_driver_no_devices_and_a_clear_error():
    # a driver library that cannot exist: what a machine without the NVIDIA driver sees
    r = _run("""
        import singa
        from singa import device, plugins
        b = plugins.registry().backends["cuda"]
        print("count", b.device_count())
        print("status", b.info()["status"])
        try:
            device.get_default_device()
        except RuntimeError as exc:
            print("error", exc)
        """, SINGA_CUDA_DRIVER_LIBRARY="/nonexistent/libcuda.so.1", SINGA_DEVICE="cuda")
    assert r.returncode == 0, r.stderr
    assert "count 0" in r.stdout
    assert "NVIDIA driver" in r.stdout
    assert "libcuda.so.1" in r.stdout
    assert "error backend 'cuda' is installed but has 0 device(s)" in r.stdout
    assert "install the NVIDIA driver" in r.stdout
    info = _run("import subprocess, sys; subprocess.run([sys.executable, '-m', 'singa', 'info'])",
                SINGA_CUDA_DRIVER_LIBRARY="/nonexistent/libcuda.so.1")
    assert "cuda: singa-backend-cuda" in info.stdout
    assert "NVIDIA driver library could not be loaded" in info.stdout


def test_conv_padding_plan():
    from singa_backend_cuda.table import _Conv

    views = ()
    sym = _Conv("conv2d", (2, 3, 8, 8), (4, 3, 3, 3), (2, 4, 8, 8), 1, (1, 1, 1, 1), 1, 1, views)
    assert sym.direct
    assert sym.pad == (1, 1)
    # SAME_UPPER with stride 2: (0, 0, 1, 1) is asymmetric, so x is padded explicitly to the extent the windows read
    upper = _Conv("conv2d", (2, 3, 8, 8), (4, 3, 3, 3), (2, 4, 4, 4), 2, (0, 0, 1, 1), 1, 1, views)
    assert not upper.direct
    assert upper.pad == (0, 0)
    assert upper.xp_shape == (2, 3, 9, 9)
    # extra bottom padding no window reaches keeps the direct path
    extra = _Conv("conv2d", (1, 1, 5, 5), (1, 1, 3, 3), (1, 1, 3, 3), 2, (1, 1, 2, 2), 1, 1, views)
    assert extra.direct
    assert extra.pad == (1, 1)
