"""Storage reads agree with the tables (row mapping by column, counts, counters)."""

from __future__ import annotations

from chokaq_core import storage
from chokaq_core.domain import FailureReason, JobStatus, Success

from .rows import archive_row, archived, dead, dlq_row, fetched, hot, pending, processing


def test_get_hot_maps_every_column() -> None:
    job = processing("read-hot", "w1", 1, tags="a", created_by="me", key="rk", priority=33, payload='{"p":1}')[0]
    row = hot(job.id)
    assert row is not None

    read = storage.get_hot(job.id)

    assert read is not None
    assert read.status == JobStatus.PROCESSING
    for field in ("id", "queue", "type", "payload", "tags", "idempotency_key", "priority", "attempt_count",
                  "worker_id", "heartbeat_at", "scheduled_at", "created_at", "started_at", "last_updated_at",
                  "created_by", "last_modified_by"):
        assert getattr(read, field) == row[field], field
    assert storage.get_hot("no-such-job") is None


def test_get_archived_maps_every_column() -> None:
    job_id = archived("read-arc", 1, duration_ms=9.25, tags="t", created_by="me")[0]
    row = archive_row(job_id)
    assert row is not None

    read = storage.get_archived(job_id)

    assert read is not None
    for field in ("id", "queue", "type", "payload", "tags", "attempt_count", "worker_id", "created_by",
                  "last_modified_by", "created_at", "started_at", "finished_at", "duration_ms"):
        assert getattr(read, field) == row[field], field
    assert storage.get_archived("no-such-job") is None


def test_get_dead_maps_every_column() -> None:
    job_id = dead("read-dlq", 1, reason=FailureReason.TIMEOUT, details="Timeout: Execution Timeout", tags="t")[0]
    row = dlq_row(job_id)
    assert row is not None

    read = storage.get_dead(job_id)

    assert read is not None
    assert read.failure_reason == FailureReason.TIMEOUT
    for field in ("id", "queue", "type", "payload", "tags", "error_details", "attempt_count", "worker_id",
                  "created_by", "last_modified_by", "created_at", "failed_at"):
        assert getattr(read, field) == row[field], field
    assert storage.get_dead("no-such-job") is None


def test_queue_and_summary_stats_count_each_state() -> None:
    archived("rs-a", 2)
    dead("rs-b", 1)
    pending("rs-a", 3)
    fetched("rs-a-f", "w1", 2)
    processing("rs-b", "w1", 1)
    job = processing("rs-b2", "w1", 1)[0]
    storage.complete("w1", [Success(job.id, 1.0)], [], [])

    stats = {s.queue: s for s in storage.queue_stats()}
    a, b = stats["rs-a"], stats["rs-b"]
    assert (a.pending, a.fetched, a.processing, a.succeeded_total, a.failed_total) == (3, 0, 0, 2, 0)
    assert (b.pending, b.fetched, b.processing, b.succeeded_total, b.failed_total) == (0, 0, 1, 0, 1)
    assert stats["rs-a-f"].fetched == 2
    assert a.last_activity_at is not None and a.last_activity_at.tzinfo is not None

    summary = storage.summary_stats()
    assert (summary.pending, summary.fetched, summary.processing) == (3, 2, 1)
    assert (summary.succeeded_total, summary.failed_total, summary.retried_total) == (3, 1, 0)
    assert summary.total == 3 + 2 + 1 + 3 + 1
