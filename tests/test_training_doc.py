"""docs/training.md: every Python snippet runs as printed, in order, in one namespace (as a reader would paste them)."""

from __future__ import annotations

import pathlib
import re

import pytest

from singa import autograd

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "training.md"

pytestmark = pytest.mark.filterwarnings("ignore::singa.backend.FallbackWarning")


def _snippets() -> list[tuple[int, str]]:
    text = DOC.read_text(encoding="utf-8")
    out = []
    for m in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M):
        out.append((text.count("\n", 0, m.start()) + 2, m.group(1)))
    return out


def test_every_snippet_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the snippets write checkpoint.zip, half.zip and trace.json
    snippets = _snippets()
    assert len(snippets) >= 10
    ns: dict = {"__name__": "training_doc"}
    prev = autograd.training
    try:
        for line, code in snippets:
            exec(compile(code, f"{DOC}:{line}", "exec"), ns)  # the documentation's own code
    finally:
        autograd.training = prev
        ns["dev"].SetVerbosity(0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.zip", "half.zip", "trace.json"]
    assert "time profiling" in capsys.readouterr().out
