"""The CUDA backend beside PyTorch CUDA, in one run: matrix products, training steps, losses against the CPU backend.

    python benchmarks/gpu_check.py --reference        # on any machine with the CPU backend: writes gpu_reference.json
    python benchmarks/gpu_check.py --out DIR          # on a GPU machine (benchmarks/gpu_check.sh runs it)
    python benchmarks/gpu_check.py --splice DIR       # put DIR's results (gpu_check.sh's logs too) in the doc

The reference run trains the MNIST CNN and ResNet-18 (CIFAR-style) for LOSS_STEPS steps on `cpu`, eager and graph
mode, from initial weights drawn with numpy from a fixed seed, on fixed batches; it stores the losses (and torch CPU's,
the yardstick for how far two correct float32 implementations drift apart). The GPU run repeats the training on
`cuda` from the same weights and batches and reports the largest relative loss difference to the CPU backend; then
times a step of singa eager, singa graph (a CUDA Graph) and torch (same model and weights, TF32 off in both, cuDNN
autotuning on in both), taking turns round by round; and times 4096x4096x4096 float32 and float16 matrix products.
Results go to DIR/gpu_report.md and DIR/gpu_report.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _trainbench  # noqa: E402
import train_cnn  # noqa: E402
import train_resnet  # noqa: E402

from benchlib import torch  # noqa: E402
from singa import device, tensor  # noqa: E402

REFERENCE = HERE / "gpu_reference.json"
LOSS_STEPS = 20
MODELS = {"mnist_cnn": lambda: train_cnn.spec(64), "resnet18": lambda: train_resnet.spec(32)}


def fixed_init(spec, dev) -> dict[str, np.ndarray]:
    """Initial states from numpy's generator (identical on every machine): He-normal weights, zero biases, BN
    scale 1 / bias 0, running mean 0 / var 1."""
    m, _, _ = _trainbench.singa_model(spec, dev, use_graph=False, init=None)
    rng = np.random.default_rng(2024)
    out = {}
    for name, v in sorted(m.get_states().items()):
        shape = tuple(v.shape)
        leaf = name.rsplit(".", 1)[-1].lower()
        if "var" in leaf:
            a = np.ones(shape)
        elif "mean" in leaf or (len(shape) == 1 and (leaf == "b" or "bias" in leaf or "beta" in leaf)):
            a = np.zeros(shape)
        elif len(shape) == 1:  # a BN scale
            a = np.ones(shape)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 2 else shape[0]
            a = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        out[name] = a.astype(np.float32)
    return out


def singa_losses(spec, dev, use_graph: bool, init, batches) -> list[float]:
    step = _trainbench.singa_stepper(spec, dev, use_graph, init, batches)
    return [float(tensor.to_numpy(step(i)[1]).reshape(-1)[0]) for i in range(LOSS_STEPS)]


def torch_losses(spec, init, batches, dev: str) -> list[float]:
    import _torch_models as tm

    module = spec.make_torch()
    tm.load_singa_weights(module, init)
    module = module.to(dev).train()
    optim = torch.optim.SGD(module.parameters(), lr=_trainbench.LR, momentum=_trainbench.MOMENTUM)
    data = [(torch.from_numpy(x).to(dev), torch.from_numpy(y.astype(np.int64)).to(dev)) for x, y in batches]
    return [float(tm.train_step(module, optim, *data[i % len(data)])) for i in range(LOSS_STEPS)]


def reference() -> None:
    dev = device.get_device("cpu")
    out = {}
    for key, make in MODELS.items():
        spec = make()
        batches, desc = _trainbench.make_batches(spec, LOSS_STEPS)
        init = fixed_init(spec, dev)
        out[key] = {"batch": spec.batch, "data": desc, "cpu_eager": singa_losses(spec, dev, False, init, batches),
                    "cpu_graph": singa_losses(spec, dev, True, init, batches),
                    "torch_cpu": torch_losses(spec, init, batches, "cpu") if torch is not None else None,
                    "cpu": dev.description()}
        print(key, "done", flush=True)
    REFERENCE.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {REFERENCE}")


def _time(fn, sync, warmup: int, repeat: int, number: int) -> list[float]:
    for _ in range(warmup):
        fn()
    sync()
    rounds = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        sync()
        rounds.append((time.perf_counter() - t0) / number)
    return rounds


def _matmul_row(dev, name: str, np_dt) -> dict:
    from singa.backend import View

    n = 4096
    rng = np.random.default_rng(0)
    a_h, b_h = (rng.standard_normal((n, n)).astype(np_dt) for _ in range(2))
    a, b = tensor.from_numpy(a_h, dev), tensor.from_numpy(b_h, dev)
    c = tensor.Tensor((n, n), dev, a.dtype)
    kern = dev.table["matmul"]
    va, vb, vc = (View(t.buffer, t.dtype, (1, n, n), None, t.offset) for t in (a, b, c))
    got = _time(lambda: kern(vc, va, vb), dev.synchronize, 3, 5, 10)
    ta, tb = torch.from_numpy(a_h).cuda(), torch.from_numpy(b_h).cuda()
    ref = _time(lambda: torch.matmul(ta, tb), torch.cuda.synchronize, 3, 5, 10)
    want = (ta.double() @ tb.double()).cpu().numpy()
    err = float(np.max(np.abs(tensor.to_numpy(c).astype(np.float64) - want)) / np.max(np.abs(want)))
    flops = 2 * n ** 3
    return {"dtype": name, "singa_tflops": flops / min(got) / 1e12, "torch_tflops": flops / min(ref) / 1e12,
            "ratio": min(ref) / min(got), "max_err_rel_to_max": err}


def matmul_rows(dev) -> list[dict]:
    """4096^3 products: singa's matmul kernel on preallocated tensors against torch.matmul, TF32 off."""
    return [_matmul_row(dev, "float32", np.float32), _matmul_row(dev, "float16", np.float16)]


def _step_times(spec, dev, init, batches) -> tuple[object, dict[str, list[float]]]:
    """(the graph-mode model, seconds per step of each round) of singa eager, singa graph and torch, taking turns."""
    import _torch_models as tm

    s_eager = _trainbench.singa_stepper(spec, dev, False, init, batches)
    gm, gx, gy = _trainbench.singa_model(spec, dev, True, init)

    def graph_step(i):
        x, y = batches[i % len(batches)]
        gx.copy_from_numpy(x)
        gy.copy_from_numpy(y)
        return gm(gx, gy)

    module = spec.make_torch()
    tm.load_singa_weights(module, init)
    module = module.cuda().train()
    optim = torch.optim.SGD(module.parameters(), lr=_trainbench.LR, momentum=_trainbench.MOMENTUM)
    data = [(torch.from_numpy(x).cuda(), torch.from_numpy(y.astype(np.int64)).cuda()) for x, y in batches]

    def torch_step(i):
        x, y = data[i % len(data)]
        return tm.train_step(module, optim, x, y)

    steppers = {"singa eager": (s_eager, dev.synchronize), "singa graph": (graph_step, dev.synchronize),
                "torch": (torch_step, torch.cuda.synchronize)}
    return gm, _trainbench.time_interleaved(steppers, 5, 10, 20)


def training_rows(dev, ref: dict) -> list[dict]:
    rows = []
    for key, make in MODELS.items():
        spec = make()
        batches, desc = _trainbench.make_batches(spec, LOSS_STEPS)
        init = fixed_init(spec, dev)
        r = ref.get(key, {})
        eager = singa_losses(spec, dev, False, init, batches)
        graph = singa_losses(spec, dev, True, init, batches)
        th_gpu = torch_losses(spec, init, batches, "cuda")
        row = {"model": key, "batch": spec.batch, "data": desc, "cuda_eager": eager, "cuda_graph": graph,
               "torch_cuda": th_gpu}
        if r:
            row["diff_eager_vs_cpu_eager"] = _trainbench.max_rel_diff(eager, r["cpu_eager"])
            row["diff_graph_vs_cpu_graph"] = _trainbench.max_rel_diff(graph, r["cpu_graph"])
            row["diff_eager_vs_cpu_eager_step1"] = _trainbench.max_rel_diff(eager[:1], r["cpu_eager"][:1])
            row["diff_eager_vs_cpu_eager_first5"] = _trainbench.max_rel_diff(eager[:5], r["cpu_eager"][:5])
            if r.get("torch_cpu"):
                row["torch_cuda_vs_torch_cpu"] = _trainbench.max_rel_diff(th_gpu, r["torch_cpu"])
                row["torch_cpu_vs_cpu_eager"] = _trainbench.max_rel_diff(r["torch_cpu"], r["cpu_eager"])
        gm, times = _step_times(spec, dev, init, batches)
        for name, t in times.items():
            row[f"{name} ms"] = statistics.median(t) * 1e3
            row[f"{name} best ms"] = min(t) * 1e3
        sg = gm._step_graph
        row["cuda_graph_captured"] = bool(sg is not None and sg.graph._device_replay is not None)
        row["capture_error"] = getattr(dev, "capture_error", None)
        rows.append(row)
        print(key, json.dumps({k: v for k, v in row.items() if not isinstance(v, list)}), flush=True)
    return rows


def report(out: Path) -> None:
    dev = device.get_device("cuda:0")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    ref = json.loads(REFERENCE.read_text()) if REFERENCE.exists() else {}
    facts = {"device": dev.description(), "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
             "cuda_runtime_torch": torch.version.cuda}
    print(json.dumps(facts), flush=True)
    mm = matmul_rows(dev)
    print(json.dumps(mm), flush=True)
    tr = training_rows(dev, ref)
    (out / "gpu_report.json").write_text(json.dumps({"facts": facts, "matmul": mm, "training": tr}, indent=1))
    lines = [(f"GPU: {facts['gpu']}; singa {facts['device']}; torch {facts['torch']} "
             f"(CUDA {facts['cuda_runtime_torch']})"),
             "", "| product | singa TFLOP/s | torch TFLOP/s | singa / torch throughput | max error / max |",
             "|---|---|---|---|---|"]
    lines += [f"| 4096³ {r['dtype']} | {r['singa_tflops']:.1f} | {r['torch_tflops']:.1f} | {r['ratio']:.2f} | "
              f"{r['max_err_rel_to_max']:.1e} |" for r in mm]
    head = ("| model | singa eager ms | singa graph ms | torch ms | eager/torch | graph/torch | CUDA graph | "
            "loss vs cpu (eager, 20 steps) | graph vs cpu graph | torch cuda vs torch cpu |")
    lines += ["", head, "|---|" + "---|" * 9]
    for r in tr:
        lines.append(f"| {r['model']} b{r['batch']} | {r['singa eager ms']:.2f} | {r['singa graph ms']:.2f} | "
                     f"{r['torch ms']:.2f} | {r['singa eager ms'] / r['torch ms']:.2f} | "
                     f"{r['singa graph ms'] / r['torch ms']:.2f} | {r['cuda_graph_captured']} | "
                     f"{r.get('diff_eager_vs_cpu_eager', float('nan')):.1e} | "
                     f"{r.get('diff_graph_vs_cpu_graph', float('nan')):.1e} | "
                     f"{r.get('torch_cuda_vs_torch_cpu', float('nan')):.1e} |")
    (out / "gpu_report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


SECTION = "## GPU: the CUDA backend beside PyTorch CUDA"


def _log(path: Path) -> str | None:
    """A stage's log: its own file, or its part of gpu_check.sh's all_logs.txt; None when the stage did not run."""
    if path.is_file():
        return path.read_text(errors="replace")
    combined = path.parent / "all_logs.txt"
    if not combined.is_file():
        return None
    parts = combined.read_text(errors="replace").split("===== ")
    return next((p.split("\n", 1)[1] for p in parts if p.startswith(path.name + "\n")), None)


def _last_line(path: Path, pattern: str) -> str:
    """The last line of a log that contains `pattern` (pytest's summary, say), or 'not run'."""
    text = _log(path)
    lines = [line.strip() for line in (text or "").splitlines() if pattern in line]
    return lines[-1] if lines else "not run"


def splice(folder: Path, doc: Path) -> None:
    """Write the results in `folder` (gpu_report.json and gpu_check.sh's logs) as the GPU section of `doc`."""
    rep = json.loads((folder / "gpu_report.json").read_text())
    md = (folder / "gpu_report.md").read_text().strip()
    onnx = [line.strip() for line in (_log(folder / "onnx_models.log") or "").splitlines()
            if line.strip().split(" ")[0] in ("real", "simple", "pytorch-converted", "pytorch-operator")]
    rows = [f"| conformance suite on cuda | {_last_line(folder / 'conformance.log', ' passed')} |",
            f"| CUDA package tests | {_last_line(folder / 'cuda_tests.log', ' passed')} |",
            f"| seeds, graph mode, float16, layers on cuda | {_last_line(folder / 'tests_on_cuda.log', ' passed')} |",
            f"| NCCL communicator check | {_last_line(folder / 'nccl.log', 'passed')} |"]
    rows += [f"| ONNX backend suite, {line.split('  ')[0].strip()} | {line.split('  ', 1)[1].strip()} |"
             for line in onnx]
    section = [
        SECTION, "",
        ("`bash benchmarks/gpu_check.sh OUT` on a GPU machine, then `python benchmarks/gpu_check.py --splice OUT` "
        "(this section is kept when the rest of the report is regenerated on a CPU machine)."), "",
        (f"Measured {time.strftime('%Y-%m-%d', time.gmtime((folder / 'gpu_report.json').stat().st_mtime))}: "
        f"{rep['facts']['gpu']}, {rep['facts']['device']}; torch {rep['facts']['torch']} "
        f"(CUDA {rep['facts']['cuda_runtime_torch']}). TF32 off for both frameworks (float32 products and "
        "convolutions are float32 arithmetic), cuDNN autotuning on for both; singa's graph mode replays a CUDA "
        "Graph."), "",
        "| check | result |", "|---|---|", *rows, "",
        md, "",
        (f"Training: batch 64 (MNIST CNN) and 32 (ResNet-18, CIFAR-style) on scikit-learn's digits, SGD lr 0.01 "
         f"momentum 0.9, from the same numpy-drawn weights on every framework; step times are medians of 10 rounds of "
         f"20 steps after 5 warm-up steps, the three contestants taking turns. Loss columns: the largest relative "
         f"difference over {LOSS_STEPS} steps to the CPU backend's losses (benchmarks/gpu_reference.json, same weights "
         f"and batches), and torch's own CUDA-versus-CPU difference as the yardstick: ResNet-18's training is chaotic "
         f"at this batch size (two correct float32 implementations drift apart by ~1e-1 within 20 steps; the first "
         f"step's loss agrees to ~1e-7), the MNIST CNN's is not."), ""]
    text = doc.read_text() if doc.is_file() else "# Performance\n"
    start = text.find(SECTION)
    body = "\n".join(section)
    if start < 0:
        text = text.rstrip() + "\n\n" + body
    else:
        end = text.find("\n## ", start + len(SECTION))
        text = text[:start] + body + ("\n" + text[end + 1:] if end >= 0 else "")
    doc.write_text(text.rstrip() + "\n")
    print(f"wrote the GPU section of {doc}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reference", action="store_true", help="compute the CPU reference losses (no GPU needed)")
    p.add_argument("--out", default=".", help="folder for gpu_report.md / .json")
    p.add_argument("--splice", metavar="DIR", help="write DIR's results into --doc instead of measuring")
    p.add_argument("--doc", default=str(HERE.parent / "docs" / "performance.md"))
    args = p.parse_args()
    if args.splice:
        splice(Path(args.splice), Path(args.doc))
    elif args.reference:
        reference()
    else:
        report(Path(args.out))


if __name__ == "__main__":
    main()
