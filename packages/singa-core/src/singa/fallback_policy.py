"""What happens when a kernel runs through the host fallback: warn once (the default), raise, or stay silent.

`SINGA_FALLBACK=warn|error|silent` sets it for a whole run from outside; `singa.set_fallback(mode)` sets it from
Python and wins over the variable until `singa.set_fallback(None)` hands control back to it. The variable exists
because Python's own `-W error::singa.backend.FallbackWarning` cannot work: `-W` resolves its category while the
interpreter starts, before a package can be imported, and drops the filter ("Invalid -W option ignored").
"""

from __future__ import annotations

import os
import warnings

MODES = ("warn", "error", "silent")
VARIABLE = "SINGA_FALLBACK"

_mode: str | None = None  # set by set_fallback; None: SINGA_FALLBACK decides
_warned: set[tuple[str, str]] = set()


class FallbackWarning(RuntimeWarning):
    """A primitive ran through the host fallback because the backend lacks its kernel."""


class FallbackError(RuntimeError):
    """A primitive would have run through the host fallback while the fallback mode is 'error'."""


def _check(mode: str, where: str) -> str:
    m = mode.strip().lower()
    if m not in MODES:
        raise ValueError(f"{where}: unknown fallback mode {mode!r}; choose one of {', '.join(MODES)}")
    return m


def get_fallback() -> str:
    """The mode in force: what `set_fallback` chose, else SINGA_FALLBACK, else 'warn'."""
    if _mode is not None:
        return _mode
    value = os.environ.get(VARIABLE, "").strip()
    return _check(value, VARIABLE) if value else "warn"


def set_fallback(mode: str | None) -> str:
    """Choose what a host-fallback kernel does: 'warn' once per kernel and device, raise 'error', or run 'silent'.

    None returns the choice to the SINGA_FALLBACK variable. Returns the mode that was in force before, so that a caller
    can restore it.
    """
    global _mode
    previous = get_fallback()
    _mode = None if mode is None else _check(mode, "singa.set_fallback")
    return previous


def report(device_name: str, backend_name: str, kernel: str) -> None:
    """Called by every host-fallback kernel before it runs: warns once, raises, or does nothing, as the mode says."""
    mode = get_fallback()
    if mode == "silent":
        return
    message = f"singa: kernel {kernel!r} is not implemented by backend {backend_name!r}"
    if mode == "error":
        raise FallbackError(f"{message} ({device_name}), and the host fallback is turned into an error "
                            f"({VARIABLE}=error or singa.set_fallback('error'))")
    key = (device_name, kernel)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"{message}; running it through the host fallback", FallbackWarning, stacklevel=3)
