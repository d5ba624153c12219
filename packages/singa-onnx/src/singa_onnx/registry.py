"""The operator table: {(domain, op_type): [entries]}, each entry a handler with the opset range it implements.

A handler is `handler(node, inputs, opset) -> outputs`: `inputs` holds one value per ONNX input (None where an optional
input is left out), a value being a singa Tensor (device data), a numpy array (host data: constants, shapes), a list
(an ONNX sequence) or None; it returns one value or a tuple of values. Handlers compute with singa's autograd operators
where a gradient exists, so an imported model trains.

`static` names the inputs whose values the handler needs on the host (shapes, axes, pads, scales ...): initializers used
only there stay numpy constants instead of becoming trainable parameters. `states` names inputs that are running
statistics (BatchNormalization's mean and variance): imported models keep them as non-trainable states.

A host implementation (`host=`) runs instead when every input is host data; that keeps the shape arithmetic of exported
models (Shape -> Gather -> Concat -> Reshape) on the host, where it needs no device round trip.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class OpEntry:
    op_type: str
    domain: str
    handler: Callable
    since: int
    until: int | None  # last opset this entry implements (None: up to the newest)
    static: tuple
    states: tuple
    host: Callable | None


_TABLE: dict[tuple[str, str], list[OpEntry]] = {}


def _dom(domain: str) -> str:
    return "" if domain in DEFAULT_DOMAINS else domain


def register(op_type: str | tuple, since: int = 1, until: int | None = None, domain: str = "",
             static: tuple = (), states: tuple = (), host: Callable | None = None) -> Callable:
    """Decorator: register a handler for one or several op types."""
    names = (op_type,) if isinstance(op_type, str) else tuple(op_type)

    def deco(fn: Callable) -> Callable:
        for n in names:
            _TABLE.setdefault((_dom(domain), n), []).append(
                OpEntry(n, _dom(domain), fn, since, until, tuple(static), tuple(states), host))
        return fn

    return deco


def lookup(domain: str, op_type: str, opset: int) -> OpEntry | None:
    for e in _TABLE.get((_dom(domain), op_type), ()):
        if e.since <= opset and (e.until is None or opset <= e.until):
            return e
    return None


def known(domain: str, op_type: str) -> list[OpEntry]:
    return list(_TABLE.get((_dom(domain), op_type), ()))


def table() -> dict[tuple[str, str], list[OpEntry]]:
    """A copy of the whole table (for documentation and coverage reports)."""
    return {k: list(v) for k, v in _TABLE.items()}
