"""Run onnx's backend test suite through singa_onnx.SingaBackend and write the ONNX section of docs/conformance.md.

    python benchmarks/onnx_conformance.py                      # CPU backend, rewrites docs/conformance.md
    python benchmarks/onnx_conformance.py --device hostmem     # another singa device
    python benchmarks/onnx_conformance.py --output -           # print instead of writing

Counts are over the `_cpu` cases (onnx's CPU variants; the device they run on is --device). Every excluded case is
listed with its reason (from singa_onnx.conformance); failures, if any, are listed with the first line of their error.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import tempfile
import time
import unittest
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CATEGORIES = [("OnnxBackendNodeModelTest", "node"), ("OnnxBackendRealModelTest", "real (light models)"),
              ("OnnxBackendSimpleModelTest", "simple"), ("OnnxBackendPyTorchConvertedModelTest", "pytorch-converted"),
              ("OnnxBackendPyTorchOperatorModelTest", "pytorch-operator")]
TARGETS = {"node": 1200, "real (light models)": 9, "simple": 17, "pytorch-converted": 74, "pytorch-operator": 32}
SECTION = "## ONNX conformance"


def run(device_spec: str = "cpu", pattern: str | None = None, categories: list[str] | None = None) -> dict:
    import onnx
    import onnx.backend.test
    import onnxruntime

    import singa_onnx
    from singa import device as device_mod
    from singa_onnx import SingaBackend
    from singa_onnx.conformance import excluded

    os.environ.setdefault("ONNX_HOME", tempfile.mkdtemp(prefix="singa-onnx-home-"))
    dev = device_mod.get_device(device_spec)

    class Bound(SingaBackend):
        @classmethod
        def prepare(cls, model, device="CPU", **kwargs):
            return SingaBackend.prepare(model, dev, **kwargs)

        @classmethod
        def supports_device(cls, device: str) -> bool:
            return True  # onnx's cases are labelled CPU; they run on `dev` whatever it is

    rules = excluded(dev)
    t0 = time.perf_counter()
    bt = onnx.backend.test.BackendTest(Bound, __name__)
    load_s = time.perf_counter() - t0
    cases = bt.test_cases
    out = {"device": dev.name, "description": dev.description(), "onnx": onnx.__version__,
           "onnxruntime": onnxruntime.__version__, "singa_onnx": singa_onnx.__version__, "load_s": load_s,
           "categories": {}, "excluded": [], "failed": []}
    t1 = time.perf_counter()
    for cname, label in CATEGORIES:
        if categories and label.split()[0] not in categories:
            continue
        cls = cases[cname]
        counts = collections.Counter()
        for name in sorted(n for n in dir(cls) if n.startswith("test_") and n.endswith("_cpu")):
            if pattern and not re.search(pattern, name):
                continue
            counts["total"] += 1
            rule = next((r for r in rules if re.search(r[0], name)), None)
            if rule is not None:
                counts["excluded"] += 1
                out["excluded"].append((label, name, rule[1]))
                continue
            res = unittest.TestResult()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cls(name).run(res)
            if res.skipped:
                counts["skipped"] += 1
            elif res.failures or res.errors:
                counts["failed"] += 1
                msg = (res.failures or res.errors)[0][1].strip().splitlines()
                out["failed"].append((label, name, msg[-1][:200] if msg else ""))
            else:
                counts["passed"] += 1
        out["categories"][label] = counts
    out["run_s"] = time.perf_counter() - t1
    return out


def markdown(res: dict, command: str) -> str:
    intro = (f"onnx's backend test suite (`onnx.backend.test`, onnx {res['onnx']}) run through "
             f"`singa_onnx.SingaBackend` on singa device `{res['device']}` ({res['description']}). The reference "
             f"outputs are onnx's own; onnxruntime {res['onnxruntime']} is installed beside it for the export and "
             "benchmark checks.")
    how = (f"Produced by `{command}`: generating the node cases took {res['load_s']:.0f} s, running every category "
           f"{res['run_s']:.0f} s. The same suite runs in CI as `tests/test_onnx_backend.py` on every installed "
           "device, with the exclusions below.")
    lines = [SECTION, "", intro, "", how, "",
             "| category | cases (`_cpu`) | passed | failed | excluded | target |", "|---|---:|---:|---:|---:|---:|"]
    for label, c in res["categories"].items():
        lines.append(f"| {label} | {c['total']} | {c['passed']} | {c['failed']} | {c['excluded']} | "
                     f"{TARGETS.get(label, '')} |")
    lines += ["", ("Nothing is excluded for dilations, ceil_mode, count_include_pad, BatchNormalization epsilon, "
                   "Transpose, 1-D/3-D pooling and convolution, unsigned integers or 0-d tensors: those cases run and "
                   "pass."), ""]
    lines += ["### Excluded cases", "", "| category | case | reason |", "|---|---|---|"]
    for label, name, reason in res["excluded"]:
        lines.append(f"| {label} | `{name}` | {reason} |")
    if res["failed"]:
        lines += ["", "### Failing cases", "", "| category | case | error |", "|---|---|---|"]
        for label, name, msg in res["failed"]:
            lines.append(f"| {label} | `{name}` | {msg.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def write_section(path: Path, text: str) -> None:
    """Replace the ONNX section of the conformance page (up to the next `## ` heading), keeping the rest."""
    old = path.read_text() if path.exists() else "# Conformance\n\n"
    start = old.find(SECTION)
    if start < 0:
        head, _, rest = old.partition("\n\n")
        new = head + "\n\n" + text + "\n" + rest
    else:
        nxt = old.find("\n## ", start + len(SECTION))
        new = old[:start] + text + ("\n" + old[nxt + 1:] if nxt >= 0 else "")
    path.write_text(new)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="singa device spec (default: cpu)")
    p.add_argument("--output", default=str(ROOT / "docs" / "conformance.md"), help="page to update, or - to print")
    p.add_argument("-k", "--pattern", default=None, help="only cases whose name matches this regular expression")
    p.add_argument("--category", action="append", choices=[label.split()[0] for _, label in CATEGORIES],
                   help="only this category (repeatable): node, real, simple, pytorch-converted, pytorch-operator")
    args = p.parse_args(argv)
    res = run(args.device, args.pattern, args.category)
    command = "python benchmarks/onnx_conformance.py" + (f" --device {args.device}" if args.device != "cpu" else "")
    text = markdown(res, command)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        write_section(Path(args.output), text)
        print(f"wrote {args.output}")
    for label, c in res["categories"].items():
        print(f"{label:22s} passed {c['passed']:5d}  failed {c['failed']:3d}  excluded {c['excluded']:3d}  "
              f"of {c['total']}")
    return 1 if res["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
