"""The process's C heap (glibc malloc): how many arenas it keeps, and giving back what it freed."""

from __future__ import annotations

import ctypes
import importlib
import os
from collections.abc import Iterable

# glibc gives every thread that allocates its own malloc arena (a worker runs ~18 threads: ≈ 3 MiB of PSS in
# arenas); the GIL already serializes nearly every allocation, so one arena costs no contention. An explicit
# MALLOC_ARENA_MAX in the environment wins (glibc read it at start-up).
MALLOC_ARENAS = 1
_M_ARENA_MAX = -8  # mallopt's parameter number (glibc malloc.h)


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas for this process before its threads start; False where there is no glibc."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        return bool(ctypes.CDLL(None).mallopt(_M_ARENA_MAX, arenas))
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to cap
        return False


def release_free_heap() -> bool:
    """Give the heap that start-up freed (the compile of modules, system checks) back to the system; False where
    there is no glibc. glibc keeps freed pages inside its heap until asked, so a process that loaded many
    modules otherwise keeps the import-time high-water mark."""
    try:
        return bool(ctypes.CDLL(None).malloc_trim(0))
    except (OSError, AttributeError):  # not glibc: its allocator keeps its own counsel
        return False


def import_releasing(modules: Iterable[str]) -> None:
    """Import ``modules`` in order, giving the freed heap back after each: where no ``.pyc`` is kept, compiling
    a module holds its source's syntax tree for a moment, and the next compile would otherwise stack its own on
    top of what glibc kept of the last one. Listed dependencies first, each step compiles at most one large
    module, so the start-up's peak is one compile above the loaded code instead of several."""
    for module in modules:
        importlib.import_module(module)
        release_free_heap()
