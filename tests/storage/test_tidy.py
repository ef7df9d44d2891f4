"""``tidy_hot_table``: the Hot table is vacuumed and analyzed once churn left enough dead row versions
(PostgreSQL; a no-op elsewhere), one caller at a time."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
from django.db import connection

from chokaq_core import maintenance, storage

from .rows import archived


def hot_vacuum_count() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'chokaq_jobs_hot'")
        return int(cursor.fetchone()[0])


def tidy_until_done(threshold: int, seconds: float = 10.0) -> bool:
    """The statistics collector publishes a backend's counts about once a second: ask until they show."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if storage.tidy_hot_table(threshold):
            return True
        time.sleep(0.2)
    return False


def test_does_nothing_below_the_threshold(vendor: str) -> None:
    archived("tidy", 20)

    assert storage.tidy_hot_table(10_000_000) is False


def test_churn_past_the_threshold_vacuums_the_hot_table(vendor: str) -> None:
    archived("tidy", 200)  # every job: insert, claim, lease, delete = dead row versions
    if vendor != "postgresql":
        assert storage.tidy_hot_table(0) is False  # nothing to do on SQLite
        return
    before = hot_vacuum_count()

    assert tidy_until_done(100)

    assert hot_vacuum_count() == before + 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'chokaq_jobs_hot'")
        assert cursor.fetchone()[0] is True


@pytest.mark.postgresql
@pytest.mark.sql_only
def test_one_vacuum_at_a_time_fleet_wide(vendor: str) -> None:
    assert vendor == "postgresql", "PostgreSQL-only (deselected on SQLite)"
    archived("tidy", 200)
    s = connection.settings_dict
    other = psycopg.connect(host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, user=s["USER"],
                            dbname=s["NAME"])
    try:
        # What a running VACUUM holds on the table; no session state is involved (safe behind a transaction pooler).
        other.execute("LOCK TABLE chokaq_jobs_hot IN SHARE UPDATE EXCLUSIVE MODE")
        time.sleep(1.2)  # let the statistics show the dead rows
        before = hot_vacuum_count()
        assert storage.tidy_hot_table(0) is False  # another worker is vacuuming
        assert hot_vacuum_count() == before
        other.rollback()
        assert tidy_until_done(0)
    finally:
        other.close()


def test_the_periodic_duty_checks_at_most_every_interval(monkeypatch: pytest.MonkeyPatch, chokaq_settings: Any) -> None:
    calls: list[int] = []
    monkeypatch.setattr(storage, "tidy_hot_table", lambda threshold: calls.append(threshold) or False)
    state: dict[str, float] = {}

    maintenance.tidy_hot_table_if_due(state)
    maintenance.tidy_hot_table_if_due(state)

    assert calls == [20_000]
    state["tidy_due"] = 0.0
    maintenance.tidy_hot_table_if_due(state)
    assert calls == [20_000, 20_000]
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "SQL": {"HOT_VACUUM_MIN_DEAD_ROWS": None}}
    state["tidy_due"] = 0.0
    maintenance.tidy_hot_table_if_due(state)
    assert calls == [20_000, 20_000]


def test_a_failing_vacuum_turns_the_duty_off(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(threshold: int) -> bool:
        raise RuntimeError("must be owner of table chokaq_jobs_hot")

    monkeypatch.setattr(storage, "tidy_hot_table", refuse)
    state: dict[str, float] = {}

    assert maintenance.tidy_hot_table_if_due(state) is False
    state["tidy_due"] = 0.0
    monkeypatch.setattr(storage, "tidy_hot_table", lambda threshold: pytest.fail("called again"))
    assert maintenance.tidy_hot_table_if_due(state) is False
