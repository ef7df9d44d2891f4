"""Rows read from the job tables map to the frozen row dataclasses field for field (no database)."""

from dataclasses import FrozenInstanceError, fields
from datetime import UTC, datetime, timedelta, timezone

import pytest

from chokaq_core.domain import ArchivedJob, DeadJob, FailureReason, HotJob, JobStatus
from chokaq_core.sql.base import archived_job, dead_job, hot_job

AT = datetime(2026, 12, 3, 17, 0, tzinfo=UTC)
TIMES = {"heartbeat_at", "scheduled_at", "created_at", "started_at", "last_updated_at", "finished_at", "failed_at",
         "last_error_at"}


def a_row(cls: type) -> dict[str, object]:
    """A value for every column of ``cls``: the names as text, timestamps naive (as SQLite returns them)."""
    row: dict[str, object] = {}
    for i, f in enumerate(fields(cls)):
        if f.name in TIMES:
            row[f.name] = (AT + timedelta(seconds=i)).replace(tzinfo=None)
        elif f.name in {"priority", "attempt_count", "revision", "status", "failure_reason"}:
            row[f.name] = 2
        elif f.name == "duration_ms":
            row[f.name] = 1.5
        else:
            row[f.name] = f"{f.name}-value"
    return row


def test_a_hot_row_maps_each_column_to_its_field_with_aware_times_and_the_status_enum() -> None:
    row = a_row(HotJob)
    job = hot_job(tuple(row.values()))
    assert job == HotJob(**{**row, "status": JobStatus(2), **{n: v.replace(tzinfo=UTC) for n, v in row.items()
                                                                if isinstance(v, datetime)}})
    assert job.status is JobStatus.PROCESSING
    assert job.created_at.tzinfo is UTC and job.id == "id-value" and job.held_by == "held_by-value"


def test_an_aware_time_in_another_zone_is_read_as_utc() -> None:
    row = a_row(HotJob)
    row["created_at"] = datetime(2026, 12, 3, 19, 0, tzinfo=timezone(timedelta(hours=2)))
    job = hot_job(tuple(row.values()))
    assert job.created_at == AT and job.created_at.utcoffset() == timedelta(0)


def test_archive_and_dlq_rows_map_too() -> None:
    archived = archived_job(tuple(a_row(ArchivedJob).values()))
    assert archived.duration_ms == 1.5 and archived.finished_at.tzinfo is UTC
    dead = dead_job(tuple(a_row(DeadJob).values()))
    assert dead.failure_reason is FailureReason.ZOMBIE


def test_a_built_row_is_still_frozen_and_hashable() -> None:
    job = hot_job(tuple(a_row(HotJob).values()))
    with pytest.raises(FrozenInstanceError):
        job.priority = 9  # type: ignore[misc]
    assert hash(job) == hash(hot_job(tuple(a_row(HotJob).values())))


@pytest.mark.parametrize("width", [len(fields(HotJob)) - 1, len(fields(HotJob)) + 1])
def test_a_row_of_the_wrong_width_is_refused(width: int) -> None:
    with pytest.raises(ValueError, match=f"HotJob row has {len(fields(HotJob))} columns, not {width}"):
        hot_job(("x",) * width)
