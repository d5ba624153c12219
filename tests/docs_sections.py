"""Parts of the documentation generated from the code, so that they cannot drift from it.

A generated section sits between `<!-- NAME: ... -->` and `<!-- /NAME -->` in a Markdown file; tests/test_docs.py
checks that each holds what its function below produces, and `python tests/docs_sections.py` rewrites them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from itertools import groupby
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ranges(entries) -> str:
    spans = []
    for e in sorted(entries, key=lambda e: e.since):
        if e.until is not None:
            spans.append(str(e.since) if e.until == e.since else f"{e.since}-{e.until}")
        elif e.since > 1:
            spans.append(str(e.since))
    return f" ({', '.join(spans)})" if spans else ""


def onnx_ops() -> str:
    """The ONNX operators singa_onnx imports, by domain, with their opset ranges where they do not start at 1."""
    from singa_onnx import registry

    table = registry.table()
    lines = ["| domain | | operators |", "|---|---|---|"]
    for domain in sorted({d for d, _ in table}):
        names = sorted(op for d, op in table if d == domain)
        shown = domain or "ai.onnx"
        for letter, group in groupby(names, key=lambda n: n[0].upper()):
            ops = ", ".join(f"{op}{_ranges(table[(domain, op)])}" for op in group)
            lines.append(f"| {shown} | {letter} | {ops} |")
            shown = ""
    count = len([k for k in table if k[0] == ""])
    return "\n".join(lines) + f"\n\n{count} operators of `ai.onnx`, {len(table) - count} of other domains."


def onnx_export_ops() -> str:
    from singa_onnx import frontend

    names = frontend.exportable_operators()
    return f"{len(names)} operators: " + ", ".join(f"`{n}`" for n in names) + "."


def onnx_conformance() -> str:
    """The summary table of docs/conformance.md (which benchmarks/onnx_conformance.py writes)."""
    lines = (ROOT / "docs" / "conformance.md").read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(first, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[first:end])


SECTIONS: dict[str, tuple[str, Callable[[], str]]] = {
    "onnx-ops": ("docs/onnx.md", onnx_ops),
    "onnx-export-ops": ("docs/onnx.md", onnx_export_ops),
    "onnx-conformance": ("docs/onnx.md", onnx_conformance),
}


def _pattern(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- {re.escape(name)}:[^\n]*-->\n)(.*?)(<!-- /{re.escape(name)} -->)", re.S)


def current(name: str) -> str | None:
    """What the file holds in section `name` now (None when the markers are missing)."""
    path, _ = SECTIONS[name]
    m = _pattern(name).search((ROOT / path).read_text())
    return m.group(2).strip() if m else None


def rewrite() -> list[str]:
    """Fill every section with what the code says now; returns the names of the sections that changed."""
    changed = []
    for name, (path, make) in SECTIONS.items():
        file = ROOT / path
        text = file.read_text()
        new = _pattern(name).sub(lambda m, make=make: f"{m.group(1)}{make()}\n{m.group(3)}", text, count=1)
        if new != text:
            file.write_text(new)
            changed.append(name)
    return changed


if __name__ == "__main__":
    print("rewrote:", ", ".join(rewrite()) or "nothing")
