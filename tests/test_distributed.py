"""Distributed training with real ranks: `mpiexec -n 2` and `mpiexec --oversubscribe -n 4` on the CPU backend.

The workers in tests/distributed/ run under mpiexec and write what they computed; the tests here compare it with
references computed by one process:

* fp32 (`backward_and_update`, eager and graph mode): N ranks with batch b end, after 20 steps, with the parameters
  of one process training on batch N*b with plain SGD, within 1e-5 relative (float32 rounding of the loss mean
  taken in two stages), and every rank holds bit-identical parameters.
* The other modes change the arithmetic by design, so their reference is an emulation of the N ranks in one process
  with numpy (tests/distributed/train_worker.py: float16 sums, sparse selection with residuals, partial averaging),
  which the ranks must match within 1e-5 relative; in addition each one is held to the batch-N*b reference where the
  mode allows: half precision within a bound derived below, partial update with a single partition and sparse
  updates that send everything exactly like fp32.
* Faults: a rank that raises, is killed, hangs, or builds another model stops the whole job with an error that
  names the rank, within a bounded time.

Every rank runs single-threaded (SINGA_NUM_THREADS=1), so that the emulation's gradients are bit-identical to the
ranks' (OpenMP reductions may otherwise sum in another order).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from singa import data, distopt

HERE = Path(__file__).resolve().parent / "distributed"
STEPS = 20
PARAMS = ["conv.W", "conv.b", "fc1.W", "fc1.b", "fc2.W", "fc2.b"]
SMALL = {"threshold": 50}  # the test model's 36-, 4-, 16- and 10-element tensors are fused; 1024 and 160 go alone
BUFF = 40  # smaller than the fused tensors together: buckets are closed before they overflow the buffer


def _mpiexec() -> str | None:
    path = shutil.which("mpiexec")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    return path


MPIEXEC = _mpiexec()
if MPIEXEC is None:
    why = "needs OpenMPI's mpiexec and mpi4py (apt-get install openmpi-bin libopenmpi-dev; pip install singa-core[mpi])"
    if os.environ.get("CI"):
        pytest.fail(f"CI installs them: {why}", pytrace=False)
    pytest.skip(why, allow_module_level=True)


def launch(n: int, script: str | Path, *args: str, env: dict | None = None, timeout: float = 600) -> tuple:
    """(CompletedProcess, seconds) of `mpiexec -n n python script args` (root allowed, oversubscribed); a bare name
    is a worker of tests/distributed/."""
    e = {k: v for k, v in os.environ.items() if k != "SINGA_DEVICE"}
    e.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "SINGA_NUM_THREADS": "1",
              "OMPI_MCA_rmaps_base_oversubscribe": "1", "PYTHONWARNINGS": "ignore::RuntimeWarning"})
    e.update(env or {})
    cmd = [MPIEXEC, "--oversubscribe", "-n", str(n), sys.executable, str(HERE / script), *args]  # / keeps a Path
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout, check=False)
    return r, time.perf_counter() - t0


# -- the configurations ----------------------------------------------------------------------------------------------

SPARSE = {
    "topk_corr": {"spars": 0.1, "topK": True, "corr": True},
    "topk_nocorr": {"spars": 0.1, "topK": True, "corr": False},
    "thr_corr": {"spars": 0.02, "topK": False, "corr": True},
    "thr_nocorr": {"spars": 0.02, "topK": False, "corr": False},
}


def dist_configs(world: int) -> list[dict]:
    def cfg(name, method, graph=False, **kw):
        return {"name": name, "mode": "dist", "method": method, "kwargs": {**SMALL, **kw}, "buffSize": BUFF,
                "steps": STEPS, "graph": graph}

    out = [cfg("fp32", "backward_and_update"), cfg("fp32_graph", "backward_and_update", graph=True),
           cfg("half", "backward_and_update_half"), cfg("half_graph", "backward_and_update_half", graph=True),
           cfg("half_clip", "backward_and_update_half", clipping=True, clip_Value=0.05),
           cfg("partial", "backward_and_partial_update"),
           cfg("partial_graph", "backward_and_partial_update", graph=True),
           {**cfg("partial_one", "backward_and_partial_update"), "kwargs": {"threshold": 10 ** 6}, "buffSize": 10 ** 6},
           cfg("sparse_all_topk", "backward_and_sparse_update", spars=1.0, topK=True),
           cfg("sparse_all_thr", "backward_and_sparse_update", spars=0.0, topK=False)]
    out += [cfg(f"sparse_{k}", "backward_and_sparse_update", **kw) for k, kw in SPARSE.items()]
    out.append(cfg("sparse_topk_corr_graph", "backward_and_sparse_update", graph=True, **SPARSE["topk_corr"]))
    out[1]["checkpoint"] = True
    return out


EMULATED = {"half": "half", "half_graph": "half", "half_clip": "half_clip", "partial": "partial",
            "partial_graph": "partial", **{f"sparse_{k}": f"sparse_{k}" for k in SPARSE},
            "sparse_topk_corr_graph": "sparse_topk_corr"}


def reference_configs(worlds: list[int]) -> list[dict]:
    out = [{"name": "plain", "mode": "plain", "steps": STEPS}]
    by_name = {c["name"]: c for c in dist_configs(2)}
    for w in worlds:
        for name in sorted(set(EMULATED.values())):
            c = by_name[name]
            out.append({"name": f"emu_{name}", "mode": "emulate", "world": w, "method": c["method"],
                        "kwargs": c["kwargs"], "buffSize": c["buffSize"], "steps": STEPS})
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Every configuration at 2 and 4 ranks, and the one-process references (one mpiexec launch each)."""
    out = tmp_path_factory.mktemp("dist")
    for n in (2, 4):
        cfgs = out / f"dist{n}.json"
        cfgs.write_text(json.dumps(dist_configs(n)))
        r, _ = launch(n, "train_worker.py", str(cfgs), str(out))
        assert r.returncode == 0, f"mpiexec -n {n} failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    refs = out / "refs.json"
    refs.write_text(json.dumps(reference_configs([2, 4])))
    r, _ = launch(1, "train_worker.py", str(refs), str(out))
    assert r.returncode == 0, f"the reference run failed:\n{r.stderr[-6000:]}"
    return out


def load(out: Path, name: str, world: int, rank: int) -> dict[str, np.ndarray]:
    with np.load(out / f"{name}_w{world}_r{rank}.npz") as z:
        return {k: z[k] for k in z.files}


def assert_close(got: dict, want: dict, rtol: float, what: str) -> None:
    for k in PARAMS:
        err = np.abs(got[k] - want[k]).max() / max(float(np.abs(want[k]).max()), 1e-6)
        assert err <= rtol, f"{what}: {k} differs by {err:.2e} (relative to its largest entry), bound {rtol:g}"


def assert_ranks_identical(out: Path, name: str, world: int) -> list[dict]:
    ranks = [load(out, name, world, r) for r in range(world)]
    for r in range(1, world):
        for k in PARAMS:
            assert np.array_equal(ranks[r][k], ranks[0][k]), f"{name}: rank {r}'s {k} differs from rank 0's"
    return ranks


# -- fp32 ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", ["fp32", "fp32_graph"])
def test_fp32_equals_one_process_with_the_whole_batch(runs, world, name):
    ranks = assert_ranks_identical(runs, name, world)
    plain = load(runs, "plain", 1, 0)
    assert_close(ranks[0], plain, 1e-5, f"{name} at {world} ranks vs one process with batch 16")
    moved = max(np.abs(plain[k] - plain[f"initial/{k}"]).max() for k in PARAMS)
    assert moved > 0.05, "the reference barely trained: the comparison would prove nothing"


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_start_from_rank_0s_parameters(runs, world):
    """Each rank initialises its own random parameters (seeded by its rank); compile broadcasts rank 0's."""
    ranks = [load(runs, "fp32", world, r) for r in range(world)]
    plain = load(runs, "plain", 1, 0)
    for r in range(world):
        for k in PARAMS:
            assert np.array_equal(ranks[r][f"initial/{k}"], plain[f"initial/{k}"])
        if r:
            assert not np.array_equal(ranks[r]["local/fc1.W"], ranks[0]["local/fc1.W"]), "seeds gave equal weights"


@pytest.mark.parametrize("world", [2, 4])
def test_graph_mode_records_and_replays_the_collectives(runs, world):
    for name in ("fp32_graph", "half_graph", "partial_graph", "sparse_topk_corr_graph"):
        meta = json.loads((runs / f"{name}_w{world}_r0.json").read_text())
        assert meta["graph"] is not None, f"{name}: no step graph was recorded"
        assert meta["graph"]["calls"] > 0
        assert not [w for w in meta["warnings"] if "graph" in w.lower()], meta["warnings"]
        assert meta["communicator"] == "MpiCommunicator"
        assert meta["zero_copy"] is True


def test_checkpoint_written_by_rank_0_and_loaded_by_every_rank(runs):
    for r in range(2):
        rep = json.loads((runs / f"fp32_graph_w2_ck_r{r}.json").read_text())
        assert rep == {"same": True, "files": ["fp32_graph_w2_ck0.zip"]}, rep


# -- float16 transfers ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", ["half", "half_graph", "half_clip"])
def test_half_matches_its_emulation(runs, world, name):
    ranks = assert_ranks_identical(runs, name, world)
    emu = load(runs, f"emu_{EMULATED[name]}", world, 0)
    # At 2 ranks the float16 sum is one rounded addition, as in the emulation: equal up to float32 noise. At 4 the MPI
    # library may pair the terms in another order than the emulation's left-to-right sum: each reordering moves a
    # sum by at most a float16 rounding (2^-11 relative), which 20 steps of lr 0.05 turn into < 1e-3 of the weights.
    assert_close(ranks[0], emu, 1e-5 if world == 2 else 1e-3, f"{name} at {world} ranks vs its emulation")


@pytest.mark.parametrize("world", [2, 4])
def test_half_stays_within_float16_rounding_of_fp32(runs, world):
    """Bound: each averaged gradient entry carries at most two float16 roundings (the cast, and the sum; ~2^-11
    relative each) on its way, so every update differs from fp32's by < 2 * 2^-11 of its size, about 1e-3 relative;
    20 updates of SGD with momentum 0.9 (each gradient weighs at most 1/(1-0.9) = 10 updates) keep the weights within
    1e-3 of the distance they travelled (the test model is smooth, so the two trajectories do not fork at a ReLU or a
    max-pool). Tested with a factor 2 margin for their drift: 2e-3 * travel."""
    ranks = assert_ranks_identical(runs, "half", world)
    plain = load(runs, "plain", 1, 0)
    for k in PARAMS:
        travel = np.abs(plain[k] - plain[f"initial/{k}"]).max()
        err = np.abs(ranks[0][k] - plain[k]).max()
        assert err <= 2e-3 * travel + 1e-6, f"{k}: float16 transfers moved it {err:.2e}, bound {2e-3 * travel:.2e}"
        assert err > 0, f"{k}: bit-identical to fp32: the float16 path was not taken"


# -- partial update -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", ["partial", "partial_graph"])
def test_partial_update_matches_its_emulation(runs, world, name):
    """Each rank's parameters equal its replica in a one-process emulation of local steps and round-robin averaging
    (4 partitions here), so graph replays keep turning through the partitions."""
    emu = [load(runs, "emu_partial", world, r) for r in range(world)]
    for r in range(world):
        assert_close(load(runs, name, world, r), emu[r], 1e-5, f"{name} rank {r} vs its emulated replica")
    assert not np.array_equal(emu[0]["fc1.W"], emu[1]["fc1.W"]), "partial ranks drift apart between their turns"


@pytest.mark.parametrize("world", [2, 4])
def test_partial_update_with_one_partition_equals_fp32(runs, world):
    """With every parameter in one partition, each step averages all of them: SGD's update (momentum and weight
    decay included) is linear in the gradient, so averaging the ranks' locally updated parameters and momentum-driven
    steps gives exactly the update of the averaged gradient: the batch N*b result."""
    ranks = assert_ranks_identical(runs, "partial_one", world)
    assert_close(ranks[0], load(runs, "plain", 1, 0), 1e-5, f"partial update, one partition, {world} ranks")


# -- sparse updates -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", sorted(k for k in EMULATED if k.startswith("sparse")))
def test_sparse_update_matches_its_emulation(runs, world, name):
    ranks = assert_ranks_identical(runs, name, world)
    assert_close(ranks[0], load(runs, f"emu_{EMULATED[name]}", world, 0), 1e-5, f"{name} at {world} ranks")
    plain = load(runs, "plain", 1, 0)
    gap = max(np.abs(ranks[0][k] - plain[k]).max() for k in PARAMS)
    assert gap > 1e-3, "sparse updates should differ from dense ones at this sparsity"


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", ["sparse_all_topk", "sparse_all_thr"])
def test_sparse_update_sending_everything_equals_fp32(runs, world, name):
    """top-K with spars=1 and a threshold of 0 send every entry: the dense fp32 result."""
    ranks = assert_ranks_identical(runs, name, world)
    assert_close(ranks[0], load(runs, "plain", 1, 0), 1e-5, f"{name} at {world} ranks")


# -- the communicator's collectives on each kind of memory ------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 4])
def test_collectives_against_numpy(tmp_path, world):
    from singa import plugins

    specs = ["cpu", "hostmem"]  # zero-copy host memory, and a backend staged through read/write
    ocl = plugins.registry().backends.get("opencl")
    if ocl is not None and ocl.device_count() > 0:
        specs.append("opencl")  # device memory proper (PoCL here)
    r, _ = launch(world, "comm_worker.py", str(tmp_path), *specs)
    assert r.returncode == 0, r.stderr[-6000:]
    lists = [json.loads((tmp_path / f"comm_r{rank}.json").read_text()) for rank in range(world)]
    assert all(p == lists[0] for p in lists)
    for spec in specs:
        mine = [p for p in lists[0] if p.startswith(f"{spec}: ")]
        assert len(mine) >= 36, mine
        assert f"{spec}: barrier" in mine
        assert f"{spec}: memory access declared" in mine


@pytest.mark.parametrize("world", [2, 4])
def test_distopt_lower_level_calls(tmp_path, world):
    """SINGA's all_reduce, fused_all_reduce(send=False/True), the half versions, sparsification with and without
    accumulation, update (divides by the world size), wait, and the rank attributes against mpiexec's environment."""
    r, _ = launch(world, "api_worker.py", str(tmp_path))
    assert r.returncode == 0, r.stderr[-6000:]
    for rank in range(world):
        assert len(json.loads((tmp_path / f"api_r{rank}.json").read_text())) == 11


# -- faults ----------------------------------------------------------------------------------------------------------

FAULT_LIMIT = 120  # seconds: far beyond a healthy run (about 3 s), far below "forever"


def test_control_run_finishes():
    r, _ = launch(2, "fault_worker.py", "none", timeout=FAULT_LIMIT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rank 0: finished" in r.stdout
    assert "rank 1: finished" in r.stdout


def test_a_rank_that_raises_stops_every_rank():
    r, secs = launch(2, "fault_worker.py", "raise", timeout=FAULT_LIMIT)
    assert r.returncode != 0
    # (Open MPI 4.1's own "MPI_ABORT was invoked on rank 1" is not always printed: its help-message relay sometimes
    # fails with "ORTE_ERROR_LOG: Data unpack would read past end of buffer"; singa's line is written before aborting)
    assert "rank 1 of 2 stopped on an uncaught RuntimeError: rank 1 failed on purpose" in r.stderr
    assert "finished" not in r.stdout


def test_a_rank_that_dies_stops_every_rank():
    r, secs = launch(2, "fault_worker.py", "kill", timeout=FAULT_LIMIT)
    assert r.returncode != 0
    assert "process rank 1" in r.stderr
    assert "signal 9" in r.stderr
    assert "finished" not in r.stdout


def test_a_rank_that_hangs_is_caught_by_the_timeout():
    r, secs = launch(2, "fault_worker.py", "hang", env={"SINGA_COMM_TIMEOUT": "4"}, timeout=FAULT_LIMIT)
    assert r.returncode != 0
    assert "rank 0 of 2: all_reduce" in r.stderr
    assert "did not complete within 4 s" in r.stderr
    assert secs < 60, f"took {secs:.0f} s"


@pytest.mark.parametrize(("scenario", "message"), [
    ("shape", ("tensor 0 ('fc1.W' on rank 0, 'fc1.W' on rank 1) is float32 (5, 16) on rank 0 but float32 (5, 17) on "
              "rank 1")),
    ("shape_loop", ("parameter 0 ('w' on rank 0, 'w' on rank 1) is float32 (4, 4) on rank 0 but float32 (5, 4) on "
                   "rank 1")),
    ("dtype_loop", ("parameter 0 ('w' on rank 0, 'w' on rank 1) is float32 (4, 4) on rank 0 but float16 (4, 4) on "
                   "rank 1")),
])
def test_mismatched_parameters_are_named_at_the_first_step(scenario, message):
    r, _ = launch(2, "fault_worker.py", scenario, timeout=FAULT_LIMIT)
    assert r.returncode != 0
    assert "DistributedError: DistOpt: the ranks do not hold the same" in r.stderr
    assert message in r.stderr, r.stderr[-3000:]


# -- the example -------------------------------------------------------------------------------------------------------

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "distributed" / "train_mnist.py"


def test_example_trains_the_mnist_cnn_on_two_ranks(tmp_path):
    pytest.importorskip("sklearn", reason="the example's digits ship with scikit-learn")
    r, _ = launch(2, EXAMPLE, "--epochs", "2", "--out", str(tmp_path), "--min-accuracy", "0.85")
    assert r.returncode == 0, r.stderr[-3000:]
    epochs = [line for line in r.stdout.splitlines() if line.startswith("epoch ")]
    assert [e.split()[1] for e in epochs] == ["1/2", "2/2"], r.stdout  # one line per epoch, from rank 0 only
    assert "2 rank(s) x batch 32 on cpu:0, mode fp32, graph mode" in r.stdout
    assert (tmp_path / "checkpoint.zip").is_file()


@pytest.mark.parametrize("mode", ["fp16", "partial", "sparse-topk", "sparse-threshold"])
def test_example_modes_run(tmp_path, mode):
    pytest.importorskip("sklearn", reason="the example's digits ship with scikit-learn")
    r, _ = launch(2, EXAMPLE, "--epochs", "1", "--max-steps", "4", "--mode", mode, "--spars", "0.05",
                  "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert len([line for line in r.stdout.splitlines() if line.startswith("epoch 1/1")]) == 1, r.stdout


# -- in-process pieces (no MPI) ----------------------------------------------------------------------------------------


def test_bucket_layout():
    # the test model's gradients in backward order: fc2.b 10, fc2.W 160, fc1.b 16, fc1.W 1024, conv.b 4, conv.W 36
    sizes = [10, 160, 16, 1024, 4, 36]
    assert distopt.buckets(sizes, 50, 40) == [(False, [1]), (False, [3]), (True, [0, 2, 4]), (True, [5])]
    assert distopt.buckets(sizes, 50, 10 ** 6) == [(False, [1]), (False, [3]), (True, [0, 2, 4, 5])]
    assert distopt.buckets(sizes, 20, 10 ** 6) == [(False, [1]), (True, [0, 2]), (False, [3]), (False, [5]),
                                                   (True, [4])]
    assert distopt.buckets(sizes, 10 ** 6, 10 ** 6) == [(True, [0, 1, 2, 3, 4, 5])]
    assert distopt.buckets([100, 5], 10 ** 6, 50) == [(False, [0]), (True, [1])]  # larger than the buffer: alone


def test_shard_gives_each_rank_an_equal_disjoint_part():
    x = np.arange(103)
    y = x * 10
    parts = [data.shard(x, y, rank=r, world_size=4, seed=3) for r in range(4)]
    assert all(len(px) == 25 and np.array_equal(py, px * 10) for px, py in parts)
    seen = np.concatenate([px for px, _ in parts])
    assert len(np.unique(seen)) == 100  # disjoint; 3 left over are dropped so every rank takes the same steps
    assert not np.array_equal(parts[0][0], np.arange(0, 100, 4))  # shuffled before sharing
    assert np.array_equal(data.shard_indices(10, 1, 2, shuffle=False), [1, 3, 5, 7, 9])
    with pytest.raises(ValueError, match="rank 2 is not a rank of a world of 2"):
        data.shard(x, rank=2, world_size=2)
    with pytest.raises(ValueError, match="array 0 has 103 rows but array 1 has 3"):
        data.shard(x, x[:3], rank=0, world_size=2)
