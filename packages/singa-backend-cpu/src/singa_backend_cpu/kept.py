"""Copies derived from constant buffers, kept from call to call while the buffer stays declared constant.

Inference plans declare their weights constant (singa.backend.declare_constant); a kernel may then keep what it
derives from them (oneDNN's reordered weights, the Winograd kernel's transformed ones) instead of deriving it at each
call. A copy is valid while its buffer is alive and carries the declaration token it was made under: a new
declaration (the weights written again) gives a new token, and the stale copy is dropped the next time one is kept.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from singa.backend import constant_token


class KeptCopies:
    """{key: copy} for copies of constant buffers; thread-safe. A copy is published only once it is complete (`put`
    after it is filled), so that another thread never reads one being written."""

    def __init__(self) -> None:
        self._entries: dict[Any, tuple[weakref.ref, int, Any]] = {}  # key -> (buffer, token, copy)
        self._lock = threading.Lock()

    def get(self, key: Any, buffer: Any, token: int) -> Any | None:
        """The copy kept under `key` for `buffer` as declared with `token`, or None."""
        with self._lock:
            entry = self._entries.get(key)
        if entry is not None and entry[0]() is buffer and entry[1] == token:
            return entry[2]
        return None

    def put(self, key: Any, buffer: Any, token: int, copy: Any) -> None:
        """Keep `copy` of `buffer` (declared with `token`) under `key`, dropping copies whose buffer is gone or
        declared again since."""
        with self._lock:
            for stale in [k for k, e in self._entries.items() if e[0]() is None or constant_token(e[0]()) != e[1]]:
                del self._entries[stale]
            self._entries[key] = (weakref.ref(buffer), token, copy)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
