"""Fixtures of the in-memory storage suite (spec 03 §15).

Every test here runs with ``CHOKAQ["STORAGE"] = "memory"`` and without the
``db`` fixture, so pytest-django blocks database access; on top of that every
attempt to open a connection, from any thread, is recorded and fails the test
— the memory mode must not touch the database at all. Rows are built and read
back through ``chokaq_core.storage`` only (see ``rows.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db.backends.base.base import BaseDatabaseWrapper

from chokaq_core import events, storage, testing
from chokaq_core.conf import config
from chokaq_core.sql import memory


class Clock:
    """A storage clock that only moves when told to (patched over ``memory.clock``)."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


@pytest.fixture(autouse=True)
def no_database(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Record (and refuse) every attempt to connect to a database, whatever the thread."""
    attempts: list[str] = []

    def refuse(wrapper: Any, *args: Any, **kwargs: Any) -> None:
        attempts.append(f"{wrapper.alias} from {threading.current_thread().name}")
        raise RuntimeError("the in-memory storage mode must not access the database")

    monkeypatch.setattr(BaseDatabaseWrapper, "ensure_connection", refuse)
    yield attempts
    assert attempts == [], f"database access in memory mode: {attempts}"


@pytest.fixture(autouse=True)
def memory_storage(chokaq_settings: Any) -> Iterator[None]:
    """CHOKAQ["STORAGE"] = "memory" with empty tables, emptied again afterwards."""
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "STORAGE": "memory"}
    assert config().STORAGE == "memory" and storage.dialect() is memory
    testing.reset_storage()
    yield
    memory.reset()  # directly: a test may have left the settings invalid or in SQL mode


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """Freeze the storage clock (never on a whole second, like tests/storage ``ago()``)."""
    fake = Clock(datetime(2026, 3, 14, 15, 9, 26, 535897, tzinfo=UTC))
    monkeypatch.setattr(memory, "clock", fake)
    return fake


@pytest.fixture
def published() -> Iterator[list[events.Event]]:
    """Events delivered to in-process listeners, in order."""
    seen: list[events.Event] = []
    events.add_listener(seen.append)
    try:
        yield seen
    finally:
        events.remove_listener(seen.append)


@pytest.fixture
def small_batches(chokaq_settings: Any) -> int:
    """CHOKAQ["SQL"]["CLEANUP_BATCH_SIZE"] = 2, so purges need several batches."""
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ,
                              "SQL": {**chokaq_settings.CHOKAQ.get("SQL", {}), "CLEANUP_BATCH_SIZE": 2}}
    assert config().SQL.CLEANUP_BATCH_SIZE == 2
    return 2


@pytest.fixture
def capacity(chokaq_settings: Any) -> Any:
    """``capacity(n)`` sets CHOKAQ["IN_MEMORY"]["MAX_CAPACITY"]."""

    def apply(n: int) -> None:
        chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "IN_MEMORY": {"MAX_CAPACITY": n}}
        assert config().IN_MEMORY.MAX_CAPACITY == n

    return apply
