"""PostgreSQL behind a pooler: an idle worker's LISTEN is sent only on a direct connection.

A pooler (PgBouncer) answers a connection with a process id of its own, so the serving session's
``pg_backend_pid()`` differs from it; a LISTEN sent there would be registered on whichever pooled server
session ran it. The real pooler run is ``tests/acceptance/test_pgbouncer.py``.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection

from chokaq_core import storage
from chokaq_core.sql import wakeup

pytestmark = [pytest.mark.postgresql, pytest.mark.sql_only]


def notify_soon(channel: str) -> threading.Timer:
    def send() -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {channel}")
    timer = threading.Timer(0.3, send)
    timer.start()
    return timer


def test_a_direct_connection_listens_and_is_woken(vendor: str) -> None:
    assert vendor == "postgresql", "PostgreSQL-only (deselected on SQLite)"
    source = storage.wake_source()
    assert isinstance(source, wakeup.Listen)
    try:
        assert source.wait(0.05) is False  # connects and listens
        timer = notify_soon(source.channel)
        assert source.wait(5.0) is True
        timer.join()
        assert source.pooled is False
    finally:
        source.close()


def test_through_a_pooler_no_listen_is_sent_and_the_worker_polls(vendor: str) -> None:
    assert vendor == "postgresql", "PostgreSQL-only (deselected on SQLite)"
    serving = storage.dialect().session_pid

    def pooled_pid(cursor: Any) -> int | None:
        pid = serving(cursor)
        return None if pid is None else pid + 1  # not the id the connection reported: a pooler's

    source = wakeup.Listen(connection.get_connection_params(), "chokaq_pooler_test", pooled_pid)
    try:
        timer = notify_soon("chokaq_pooler_test")
        assert source.wait(1.0) is False  # waited its timeout: nothing listens
        timer.join()
        assert source.pooled is True
        assert source._conn is None  # no connection held open
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN chokaq_pooler_test'")
            assert cursor.fetchone()[0] == 0
    finally:
        source.close()
