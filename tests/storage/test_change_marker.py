"""``change_marker``: SQLite's commit marker moves on another connection's commit (the worker's probe)."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from chokaq_core import storage

from .rows import pending


def commit_elsewhere() -> None:
    """Enqueue on another thread, i.e. on another database connection."""

    def enqueue() -> None:
        try:
            pending("marker")
        finally:
            connections.close_all()

    thread = threading.Thread(target=enqueue)
    thread.start()
    thread.join(10)


@pytest.mark.sql_only
def test_the_marker_moves_only_when_another_connection_commits(vendor: str) -> None:
    first = storage.change_marker()
    if vendor != "sqlite":
        assert first is None  # PostgreSQL pushes (LISTEN/NOTIFY): nothing to poll
        return
    assert isinstance(first, int)
    assert storage.change_marker() == first

    commit_elsewhere()

    moved = storage.change_marker()
    assert moved is not None and moved != first
    assert storage.change_marker() == moved
