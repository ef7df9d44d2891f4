"""PostgreSQL: the hot path's statements are prepared once per connection (``SQL.PREPARED_STATEMENTS``)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection

from chokaq_core import storage
from chokaq_core.sql import postgresql

from .rows import archived, pending

pytestmark = [pytest.mark.postgresql, pytest.mark.sql_only]


def prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def test_the_hot_path_is_prepared_and_reused(vendor: str) -> None:
    assert vendor == "postgresql", "PostgreSQL-only (deselected on SQLite)"
    assert postgresql.DIALECT.PREPARES
    archived("prep", 3)  # enqueue, fetch, lease and complete on this thread's connection
    first = prepared_statements()
    assert any("INSERT INTO chokaq_jobs_hot" in s for s in first), first
    assert any("FOR UPDATE OF h SKIP LOCKED" in s for s in first), first

    archived("prep", 3)
    pending("prep", 2)

    assert len(prepared_statements()) == len(first), "the same statements are reused, not prepared again"
    assert storage.summary_stats().pending == 2  # a read outside the hot path is not prepared
    assert not any("chokaq_stats_summary) s" in s for s in prepared_statements())


def test_turned_off_nothing_is_prepared(vendor: str, chokaq_settings: Any) -> None:
    assert vendor == "postgresql", "PostgreSQL-only (deselected on SQLite)"
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "SQL": {"PREPARED_STATEMENTS": False}}
    connection.close()  # a fresh session: no statement prepared by an earlier test

    archived("prep-off", 3)

    assert prepared_statements() == []


def test_through_a_pooler_nothing_is_prepared(vendor: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A session served by another process than the one the connection reported at start (a pooler's own id,
    as PgBouncer gives) may change between transactions: no statement may live in it."""
    assert vendor == "postgresql", "PostgreSQL-only (deselected on SQLite)"
    connection.close()  # a fresh session: no statement prepared by an earlier test
    serving = type(storage.dialect()).session_pid
    monkeypatch.setattr(type(storage.dialect()), "session_pid", lambda self, cursor: serving(self, cursor) + 1)

    archived("prep-pooled", 3)

    assert prepared_statements() == []
    assert storage.summary_stats().succeeded_total >= 3


def session_setting(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting(%s)", [name])
        return str(cursor.fetchone()[0])


def test_the_engines_own_sessions_keep_generic_plans_and_compile_nothing(vendor: str) -> None:
    """A worker's claim runs its generic plan, whose estimate for a parameter's LIMIT grows with the backlog: at
    1M Pending rows it passed ``jit_above_cost`` and every claim compiled for ~700 ms. The engine's own sessions
    turn JIT off; a session that runs user code (this thread's) keeps the server's settings."""
    assert vendor == "postgresql", "PostgreSQL-only (deselected on SQLite)"
    seen: dict[str, str] = {}

    def engine() -> None:
        storage.engine_thread()
        try:
            pending("engine-session", 2)
            storage.fetch_batch("w-engine", 2)
            seen.update(plans=session_setting("plan_cache_mode"), jit=session_setting("jit"))
        finally:
            connection.close()

    thread = threading.Thread(target=engine)
    thread.start()
    thread.join()

    assert seen == {"plans": "force_generic_plan", "jit": "off"}
    archived("user-session", 1)
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, reset_val FROM pg_settings WHERE name IN ('plan_cache_mode', 'jit')")
        server = dict(cursor.fetchall())
    assert server["jit"] == "on", "the server's default must be on for this test to tell"
    assert {name: session_setting(name) for name in server} == server
