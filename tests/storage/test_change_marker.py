"""``change_marker``: SQLite's commit marker moves on another connection's commit (the worker's probe)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections

from chokaq_core import storage
from chokaq_core.sql.wakeup import CommitMarkerProbe

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


@pytest.mark.sql_only
def test_a_commit_elsewhere_wakes_the_sqlite_probe_through_its_file_watch(vendor: str) -> None:
    """The probe's own reads are an hour apart here: only the watch on the database's files can end the wait."""
    source = storage.wake_source()
    try:
        if vendor != "sqlite":
            assert source.kind == "listen"
            return
        assert isinstance(source, CommitMarkerProbe) and source.watch is not None
        source.idle_interval = 3600
        assert source.wait(0) is False  # the marker's first value taken, as the fetcher does before its first claim
        timer = threading.Timer(0.2, commit_elsewhere)
        timer.start()
        started = time.monotonic()
        assert source.wait(30) is True
        assert time.monotonic() - started < 10
        timer.join()
    finally:
        source.close()
