"""Shared fixtures. The suite runs twice (scripts/test): on SQLite and on PostgreSQL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.db.backends.postgresql.operations import DatabaseOperations as PostgreSQLOperations

from chokaq_core import storage
from tests import jobs


def _flush_written(self: PostgreSQLOperations, style: Any, tables: list[str], *, reset_sequences: bool = False,
                   allow_cascade: bool = False) -> list[str]:
    """A transactional test's flush truncates only the tables that were written since their last truncation (a
    table's file is empty until then): TRUNCATE gives each table and index a new file, ~4 ms a table here, and a
    test writes a handful of this project's 25. (DELETE instead would leave the dead rows of thousands of tests
    behind, slowing later tests and moving the planner's estimates.)"""
    if tables and not reset_sequences:
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT relname FROM pg_class WHERE relname = ANY(%s) AND relkind = 'r'"
                           " AND pg_relation_size(oid) > 0", [list(tables)])
            written = {name for (name,) in cursor.fetchall()}
        tables = [table for table in tables if table in written]
    # CASCADE: an empty table that references a written one (auth_user_groups → auth_user) goes with it
    return _truncate(self, style, tables, reset_sequences=reset_sequences, allow_cascade=True)


_truncate = PostgreSQLOperations.sql_flush
PostgreSQLOperations.sql_flush = _flush_written  # type: ignore[method-assign]


def pytest_report_header(config: pytest.Config) -> str:
    url = os.environ.get("DATABASE_URL", "sqlite (default)")
    return f"ChokaQ test database: {url}"


@pytest.fixture(autouse=True)
def _reset_recorded_executions() -> Iterator[None]:
    jobs.reset()
    yield
    for gate in list(jobs.GATES.values()):
        gate.set()


@pytest.fixture(autouse=True)
def _a_process_that_knows_no_rate_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a fresh worker does: its tables are new, so what the process read of the rate
    buckets in an earlier test (``storage.KNOWN_BUCKETS``, trusted by the claim) must not carry over."""
    monkeypatch.setattr(storage, "KNOWN_BUCKETS", storage.KnownBuckets())


@pytest.fixture
def vendor() -> str:
    return str(connection.vendor)


@pytest.fixture
def chokaq_settings(settings: Any) -> Any:
    """``settings`` with a mutable copy of CHOKAQ; assign sections to override them."""
    settings.CHOKAQ = {k: (dict(v) if isinstance(v, dict) else v) for k, v in settings.CHOKAQ.items()}
    return settings


def database_url() -> str:
    """A DATABASE_URL for subprocesses, pointing at the test database of this run."""
    s = connection.settings_dict
    if connection.vendor == "postgresql":
        auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
        return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    raise RuntimeError(f"no subprocess URL for vendor {connection.vendor}")
