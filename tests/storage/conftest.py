"""Fixtures of the storage contract suite (runs unchanged on SQLite and PostgreSQL).

Every test uses ``transactional_db``: storage transitions really commit, so
PostgreSQL's ``now()`` moves between calls as in production, and events that
fire on commit can be observed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from chokaq_core import events
from chokaq_core.conf import config


@pytest.fixture(autouse=True)
def _committing_db(transactional_db: None) -> None:
    """Every storage test runs against a database that commits."""


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
