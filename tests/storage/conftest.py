"""Fixtures of the storage contract suite: ONE suite, run against every backend.

Every test runs once per backend through the ``backend`` fixture: the SQL
database of this run (SQLite by default, PostgreSQL or SQL Server when
``DATABASE_URL`` points there — ``scripts/test`` runs the suite on each) and
the in-memory storage (spec 03 §15; in the SQLite run only, see
``pytest_collection_modifyitems``). Storage transitions really commit, so
PostgreSQL's ``now()`` moves between calls as in production and events that
fire on commit can be observed.

Rows are checked with plain ORM reads (see ``rows.py``). For the memory
backend a database router sends every ChokaQ model to a Django connection on
the same private in-process database, so the very same reads (and the
backdating ``update()`` calls that age rows) see what the memory storage wrote.
Tests marked ``sql_only`` are about a SQL database itself (Django
transactions, other connections, a vendor's plans) and run on the SQL backend
only; ``memory_only`` ones are about the memory mode itself (its capacity cap,
its settings, the worker in the same process).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections, router
from django.db.backends.sqlite3.base import DatabaseWrapper

from chokaq_core import events, storage
from chokaq_core.conf import config
from chokaq_core.sql import memory

MEMORY_ALIAS = "chokaq_memory"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sql_only: a storage test about the SQL database itself (not memory mode)")
    config.addinivalue_line("markers", "memory_only: a test of the in-memory storage mode itself")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        backends = ["sql", "memory"]
        if metafunc.definition.get_closest_marker("sql_only"):
            backends = ["sql"]
        elif metafunc.definition.get_closest_marker("memory_only"):
            backends = ["memory"]
        metafunc.parametrize("backend", backends, indirect=True,
                             ids=[connection.vendor if b == "sql" else b for b in backends])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The memory backend is the same in-process SQLite whatever this run's database is: it runs in the SQLite
    run, and the PostgreSQL (or SQL Server) run deselects it rather than repeat it."""
    if connection.vendor == "sqlite":
        return
    kept, repeated = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        (repeated if callspec is not None and callspec.params.get("backend") == "memory" else kept).append(item)
    if repeated:
        config.hook.pytest_deselected(items=repeated)
        items[:] = kept


class _MemoryRouter:
    """Every ChokaQ model lives in the in-memory storage's database."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return MEMORY_ALIAS if model._meta.app_label == "chokaq_core" else None

    db_for_write = db_for_read


_memory_wrappers: dict[str, Any] = {}


def _memory_connection() -> Any:
    """A Django connection on the private in-memory database (this thread only, tests only): created
    dynamically, not in ``settings.DATABASES``, so Django's test isolation lets it through."""
    uri = memory.database().uri
    if uri not in _memory_wrappers:
        settings_dict = {**connections.settings["default"], "ENGINE": "django.db.backends.sqlite3", "NAME": uri,
                         "OPTIONS": {}}
        _memory_wrappers[uri] = DatabaseWrapper(settings_dict, MEMORY_ALIAS)
    return _memory_wrappers[uri]


@pytest.fixture(autouse=True)
def backend(request: pytest.FixtureRequest, transactional_db: None, chokaq_settings: Any,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The storage under test: "sql" (this run's database) or "memory"."""
    if request.param == "memory":
        chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "STORAGE": "memory"}
        storage.reset_memory()
        connections[MEMORY_ALIAS] = _memory_connection()
        monkeypatch.setattr(router, "routers", [_MemoryRouter()])
    yield request.param
    if request.param == "memory":
        del connections[MEMORY_ALIAS]
        storage.reset_memory()


@pytest.fixture
def vendor(backend: str) -> str:
    """The SQL dialect under test (memory mode runs the SQLite one)."""
    return "sqlite" if backend == "memory" else str(connection.vendor)


@pytest.fixture
def published() -> Iterator[list[events.Event]]:
    """Events delivered to in-process listeners (i.e. after commit), in order."""
    seen: list[events.Event] = []
    listener = seen.append
    events.add_listener(listener)
    try:
        yield seen
    finally:
        events.remove_listener(listener)


@pytest.fixture
def small_batches(chokaq_settings: Any) -> int:
    """CHOKAQ["SQL"]["CLEANUP_BATCH_SIZE"] = 2, so purges need several batches."""
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ,
                              "SQL": {**chokaq_settings.CHOKAQ.get("SQL", {}), "CLEANUP_BATCH_SIZE": 2}}
    assert config().SQL.CLEANUP_BATCH_SIZE == 2
    return 2
