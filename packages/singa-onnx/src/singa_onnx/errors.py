"""Errors raised while importing or running an ONNX model."""

from __future__ import annotations


class SONNXError(Exception):
    """Base class of singa_onnx errors."""


class InvalidModelError(SONNXError, ValueError):
    """The model is malformed: onnx.checker's message, or a file/external-data problem."""


class InvalidInputError(SONNXError, ValueError):
    """An input given to `run` that the model cannot take: unknown name, wrong count, a dtype of another kind than the
    declared one, or a shape that breaks the declared static or symbolic dimensions."""


class UnsupportedOperatorError(SONNXError, NotImplementedError):
    """Operators (or their opsets / types) that this importer cannot run; all of them, found at prepare time.

    `problems` is a list of (node name, op type, reason) tuples."""

    def __init__(self, problems: list[tuple[str, str, str]]):
        self.problems = list(problems)
        lines = [f"  node {n!r} ({op}): {why}" for n, op, why in self.problems]
        super().__init__(f"{len(self.problems)} unsupported node(s) in the ONNX model:\n" + "\n".join(lines))


class NodeError(SONNXError, RuntimeError):
    """An operator failed while the model ran; the message names the node."""
