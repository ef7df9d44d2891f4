"""In-memory storage (``CHOKAQ["STORAGE"] = "memory"``, spec 03 §15): the SQLite dialect over a private database.

The tables are ChokaQ's own schema in an in-process SQLite database opened
with the ``sqlite3`` module (never through a Django connection), so every
transition, guard, counter and ordering is the SQLite dialect's by
construction. One connection serves the whole process: a re-entrant lock
around each storage operation is its transaction (``BEGIN`` … ``COMMIT``, or
``ROLLBACK`` when the operation raises). It lives in one process and is lost
on exit, so the worker must run in the same process
(``chokaq_core.testing.run_until_idle``).

Soft cap ``IN_MEMORY.MAX_CAPACITY``: an enqueue that finds Hot + Archive +
DLQ ≥ cap first evicts the 1,000 oldest Archive rows (by finish time), then,
if still at cap, the 500 oldest DLQ rows (by failure time), decrementing their
counters as a purge does (evicted Archive rows count as purged); Hot rows are
never evicted.
"""

from __future__ import annotations

import itertools
import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import django.db.utils
from django.apps import apps
from django.db.backends.sqlite3.base import SQLiteCursorWrapper
from django.db.utils import ConnectionHandler

from chokaq_core.lazy import Lazy
from chokaq_core.sql import base, sqlite

logger = logging.getLogger("chokaq.storage.memory")

EVICT_ARCHIVE_ROWS = 1000
EVICT_DLQ_ROWS = 500
_names = itertools.count(1)


def _schema() -> list[str]:
    """CREATE TABLE / CREATE INDEX statements of every ChokaQ model, as Django's SQLite backend writes them
    (collected only: the private editor never connects)."""
    renderer = ConnectionHandler({"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}})["default"]
    editor = renderer.schema_editor(collect_sql=True)
    editor.deferred_sql = []
    for model in apps.get_app_config("chokaq_core").get_models():
        editor.create_model(model)
    return [*editor.collected_sql, *(f"{statement};" for statement in editor.deferred_sql)]


class MemoryDatabase:
    """One process's private SQLite database holding ChokaQ's tables."""

    def __init__(self) -> None:
        # A named shared-cache database: private to this process, and open to a second connection of the
        # same process (the storage suite reads it back through the ORM that way).
        self.uri = f"file:chokaq-memory-{os.getpid()}-{next(_names)}?mode=memory&cache=shared"
        self.lock = threading.RLock()
        self.connection = sqlite3.connect(self.uri, uri=True, isolation_level=None, check_same_thread=False)
        self.tables = [model._meta.db_table for model in apps.get_app_config("chokaq_core").get_models()]
        self.connection.executescript("\n".join(_schema()))
        self._depth = 0

    def run[T](self, operation: Callable[[Any], T]) -> T:
        """``operation(cursor)`` as one transaction (a savepoint when nested), under the process-wide lock."""
        with self.lock:
            cursor = self.connection.cursor(factory=SQLiteCursorWrapper)
            name = f"s{self._depth}"
            cursor.execute("BEGIN" if self._depth == 0 else f"SAVEPOINT {name}")
            self._depth += 1
            try:
                result = _as_django_error(operation, cursor)
            except BaseException:
                self._depth -= 1
                cursor.execute("ROLLBACK" if self._depth == 0 else f"ROLLBACK TO {name}")
                if self._depth:
                    cursor.execute(f"RELEASE {name}")
                raise
            self._depth -= 1
            cursor.execute("COMMIT" if self._depth == 0 else f"RELEASE {name}")
            return result

    def reset(self) -> None:
        """Forget every row of every table (tests)."""
        self.run(lambda cursor: [cursor.execute(f"DELETE FROM {table}") for table in self.tables])


def _as_django_error[T](operation: Callable[[Any], T], cursor: Any) -> T:
    """Driver errors surface as Django's (``IntegrityError``, ``OperationalError``, …), as on a SQL storage."""
    try:
        return operation(cursor)
    except sqlite3.Error as exc:
        raise getattr(django.db.utils, type(exc).__name__, django.db.utils.DatabaseError)(*exc.args) from exc


database: Lazy[MemoryDatabase] = Lazy(MemoryDatabase)  # this process's in-memory database, built on first use


def evict_if_full(cursor: Any, capacity: int) -> None:
    """Make room before an enqueue (spec 03 §15): oldest Archive rows first, then oldest DLQ rows, each removed by
    the dialect's purge (its counters lowered, evicted Archive rows counted as purged)."""
    cursor.execute(f"SELECT (SELECT count(*) FROM {base.HOT}) + (SELECT count(*) FROM {base.ARCHIVE})"
                   f" + (SELECT count(*) FROM {base.DLQ})")
    stored = int(cursor.fetchone()[0])
    if stored < capacity:
        return
    archived = sqlite.DIALECT.purge_archive(cursor, datetime.max.replace(tzinfo=UTC), EVICT_ARCHIVE_ROWS)
    failed = 0
    if stored - archived >= capacity:
        cursor.execute(f"SELECT id FROM {base.DLQ} ORDER BY failed_at, id LIMIT %s", [EVICT_DLQ_ROWS])
        failed = len(sqlite.DIALECT.purge_dlq_ids(cursor, [row[0] for row in cursor.fetchall()], EVICT_DLQ_ROWS))
    level = logging.WARNING if archived or failed else logging.DEBUG  # Hot alone at the cap: nothing to evict
    logger.log(level, "in-memory storage at its capacity of %s rows: evicted %s Archive and %s DLQ rows",
               capacity, archived, failed)
