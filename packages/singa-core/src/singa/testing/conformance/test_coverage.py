"""The suite itself: every primitive of the contract has conformance tests (a new primitive needs them)."""

from __future__ import annotations

import importlib
import pkgutil

from singa import primitives
from singa.testing import conformance


def test_every_primitive_is_covered():
    covered = set()
    for info in pkgutil.iter_modules(conformance.__path__):
        if info.name.startswith("test_"):
            covered |= getattr(importlib.import_module(f"{conformance.__name__}.{info.name}"), "COVERS", set())
    missing = [n for n in primitives.names() if n not in covered]
    assert not missing, f"primitives without a conformance test: {missing}"
