"""A project with ``USE_TZ = False`` and a local ``TIME_ZONE``: the engine's timestamps still read back as the
same instants (aware, in UTC), on every path a read can take (prepared, unprepared, behind a pooler)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from chokaq_core import storage

from .rows import new_job


@pytest.fixture
def local_time(settings: Any) -> str:
    """Django's own setting-changed handler moves the connection's session zone along."""
    settings.USE_TZ = False
    settings.TIME_ZONE = "America/New_York"  # never UTC: 4 or 5 hours off it
    connection.close()
    return settings.TIME_ZONE


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "unprepared"])
def test_a_row_reads_back_at_the_instant_it_was_written(local_time: str, prepared: bool,
                                                        chokaq_settings: Any) -> None:
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "SQL": {"PREPARED_STATEMENTS": prepared}}
    job = new_job("tz")
    before = datetime.now(UTC)

    storage.enqueue([job])
    row = storage.get_hot(job.id)
    claimed = storage.fetch_batch("tz-w", 1, ["tz"])

    after = datetime.now(UTC)
    assert row is not None and claimed
    for value in (row.created_at, claimed[0].created_at, claimed[0].last_updated_at):
        assert value.utcoffset() == timedelta(0)
        assert before - timedelta(seconds=5) <= value <= after + timedelta(seconds=5), value
