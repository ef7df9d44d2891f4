"""A per-process value built on first use."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Lazy[T]:
    """A value built once, on first use, under a lock (so concurrent first calls build it once); ``reset``
    forgets it so the next use builds it again."""

    def __init__(self, build: Callable[[], T]) -> None:
        self._build = build
        self._value: T | None = None
        self._lock = threading.Lock()

    def __call__(self) -> T:
        with self._lock:
            if self._value is None:
                self._value = self._build()
            return self._value

    def reset(self) -> None:
        with self._lock:
            self._value = None
