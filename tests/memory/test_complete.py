"""Memory mode — complete(): archive, DLQ and reschedule with counters and buckets (spec 01 §3, §4.5, §4.6, §4.13)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError

from chokaq_core import storage
from chokaq_core.domain import Failure, FailureReason, JobStatus, Retry, Success
from chokaq_core.sql import memory

from .conftest import Clock
from .rows import (
    archive_ids,
    archive_row,
    counters,
    dlq_ids,
    dlq_row,
    hot,
    new_job,
    of_kind,
    outcomes,
    processing,
)

pytestmark = pytest.mark.usefixtures("clock")


# ---------------------------------------------------------------- archive


def test_archive_moves_the_row_with_its_columns(clock: Clock, published: list) -> None:
    job = processing("arc", "w1", 1, tags="t1", created_by="producer", payload='{"k":1}')[0]
    assert storage.update_hot_data(job.id, priority=1, actor="editor") is False, "only Pending rows are editable"
    clock.advance(2)
    published.clear()

    done = storage.complete("w1", [Success(job.id, 12.5, '{"answer":42}')], [], [])

    assert done.archived == [(job.id, "arc")] and (done.rescheduled, done.failed) == ([], [])
    assert storage.get_hot(job.id) is None and storage.get_dead(job.id) is None
    row = archive_row(job.id)
    assert (row.queue, row.type, row.payload, row.tags, row.attempt_count, row.worker_id, row.created_by) == (
        "arc", job.type, '{"k":1}', "t1", 1, "w1", "producer")
    assert (row.created_at, row.started_at, row.finished_at) == (job.created_at, job.started_at, clock.now)
    assert (row.duration_ms, row.result) == (12.5, '{"answer":42}')
    assert [d["jobId"] for d in of_kind(published, "JobArchived")] == [job.id]
    assert storage.locate_jobs([job.id]) == {job.id: JobStatus.SUCCEEDED}


def test_archive_bumps_succeeded_total_and_the_success_bucket(clock: Clock) -> None:
    jobs = processing("arc-count", "w1", 4)
    start = clock.now.replace(microsecond=0)

    done = storage.complete("w1", [Success(jobs[0].id, 10.0), Success(jobs[1].id, 30.0), Success(jobs[2].id, 20.0),
                                   Success(jobs[3].id, None)], [], [])

    assert len(done.archived) == 4
    assert counters("arc-count") == (4, 0, 0)
    [stats] = storage.queue_stats()
    assert stats.last_activity_at == clock.now
    [point] = storage.throughput(start - timedelta(seconds=10))
    assert (point.at, point.succeeded, point.failed) == (start, 4, 0), "buckets are whole UTC seconds"
    assert outcomes(start + timedelta(seconds=1)) == (0, 0)


def test_bucket_durations_keep_count_total_and_a_max_that_ignores_untimed_successes() -> None:
    """The duration aggregates are no storage read: checked on the module's bucket table (the ORM read of
    tests/storage), including the SQLite ``max()`` trap of spec 01 §4.13."""
    a, b, c = processing("arc-max", "w1", 3)
    storage.complete("w1", [Success(a.id, 40.0)], [], [])
    storage.complete("w1", [Success(b.id, None)], [], [])
    storage.complete("w1", [Success(c.id, 15.0)], [], [])
    [(key, bucket)] = memory._db.buckets.items()
    assert key[1:] == ("arc-max", 0, -1)
    assert (bucket.completed_count, bucket.duration_count, bucket.total_duration_ms, bucket.max_duration_ms) == (
        3, 2, 55.0, 40.0)


def test_outcomes_of_different_seconds_land_in_different_buckets(clock: Clock) -> None:
    a, b = processing("secs", "w1", 2)
    first = clock.now.replace(microsecond=0)
    storage.complete("w1", [Success(a.id, 1.0)], [], [])
    clock.advance(1)
    storage.complete("w1", [], [], [Failure(b.id, FailureReason.TIMEOUT, "slow")])
    points = storage.throughput(first)
    assert [(p.at, p.succeeded, p.failed) for p in points] == [(first, 1, 0), (first + timedelta(seconds=1), 0, 1)]
    assert storage.throughput(first + timedelta(seconds=1, microseconds=1)) == []


def test_the_owner_guard(published: list) -> None:
    job = processing("arc-guard", "w1")[0]
    before = hot(job.id)
    published.clear()

    done = storage.complete("w2", [Success(job.id, 1.0)], [Retry(job.id, 1, 5.0)],
                            [Failure(job.id, FailureReason.FATAL_ERROR, "x")])

    assert (done.archived, done.rescheduled, done.failed) == ([], [], [])
    assert hot(job.id) == before
    assert counters("arc-guard") == (0, 0, 0)
    assert storage.throughput(before.created_at - timedelta(days=1)) == []
    assert published == []
    assert storage.complete(None, [Success(job.id, 2.0)], [], []).archived == [(job.id, "arc-guard")], (
        "None: no owner guard")
    assert archive_row(job.id).worker_id == "w1"


def test_completion_of_unknown_or_unowned_rows_moves_nothing(published: list) -> None:
    job = new_job("ev")
    storage.enqueue([job])
    published.clear()
    done = storage.complete("w1", [Success("no-such-job", 1.0), Success(job.id, 1.0)], [], [])
    assert done.archived == []
    assert published == []
    assert archive_ids() == set()


# ---------------------------------------------------------------- DLQ


def test_move_to_dlq_with_reason_details_counters_and_bucket(clock: Clock, published: list) -> None:
    job = processing("dlq", "w1", 1, tags="x", created_by="p")[0]
    clock.advance(1)
    published.clear()

    done = storage.complete("w1", [], [], [Failure(job.id, FailureReason.FATAL_ERROR, "FATAL: bad input")])

    assert done.failed == [(job.id, "dlq")]
    assert storage.get_hot(job.id) is None
    row = dlq_row(job.id)
    assert (row.failure_reason, row.error_details) == (FailureReason.FATAL_ERROR, "FATAL: bad input")
    assert (row.attempt_count, row.worker_id, row.tags, row.created_by, row.payload) == (1, "w1", "x", "p",
                                                                                         job.payload)
    assert (row.created_at, row.failed_at) == (job.created_at, clock.now)
    assert counters("dlq") == (0, 1, 0)
    assert outcomes() == (0, 1)
    assert [d["reason"] for d in of_kind(published, "JobFailed")] == ["FatalError"]
    assert storage.locate_jobs([job.id]) == {job.id: JobStatus.FAILED}


def test_move_to_dlq_with_blank_details_stores_the_default_text() -> None:
    a, b = processing("dlq-empty", "w1", 2)
    storage.complete("w1", [], [], [Failure(a.id, FailureReason.TRANSIENT, ""),
                                    Failure(b.id, FailureReason.TRANSIENT, " \n ")])
    assert dlq_row(a.id).error_details == dlq_row(b.id).error_details == "Unknown error (No details provided)"


# ---------------------------------------------------------------- reschedule


def test_reschedule_for_retry_returns_the_row_to_pending_later(clock: Clock) -> None:
    job = processing("retry", "w1")[0]
    storage.cancel([job.id], actor="dave")  # a cancel request targets this execution only
    clock.advance(1)

    done = storage.complete("w1", [], [Retry(job.id, 5, 30.0)], [])

    assert done.rescheduled == [(job.id, "retry")]
    row = hot(job.id)
    assert (row.status, row.worker_id, row.heartbeat_at, row.attempt_count) == (0, None, None, 5)
    assert (row.scheduled_at, row.last_updated_at) == (clock.now + timedelta(seconds=30), clock.now)
    assert counters("retry") == (0, 0, 1)
    assert outcomes() == (0, 0), "a retry is not an outcome"
    assert storage.fetch_batch("w2", 5, ["retry"]) == [], "not due yet"
    clock.advance(30)
    [again] = storage.fetch_batch("w2", 5, ["retry"])
    assert storage.mark_processing(again, "w2") == 6
    assert storage.cancel_requests("w2") == [], "the cancel request did not survive the reschedule"


def test_mixed_batch_in_one_call(published: list) -> None:
    ok1, ok2, again, bad = processing("mixed", "w1", 4)
    other = processing("mixed-2", "w1", 1)[0]
    not_mine = processing("mixed-3", "w2", 1)[0]
    published.clear()

    done = storage.complete(
        "w1", [Success(ok1.id, 5.0), Success(ok2.id, 7.0), Success(other.id, 1.0), Success(not_mine.id, 1.0)],
        [Retry(again.id, 1, 60.0)], [Failure(bad.id, FailureReason.TRANSIENT, "exhausted")],
    )

    assert sorted(done.archived) == sorted([(ok1.id, "mixed"), (ok2.id, "mixed"), (other.id, "mixed-2")])
    assert done.rescheduled == [(again.id, "mixed")]
    assert done.failed == [(bad.id, "mixed")]
    assert archive_ids() == {ok1.id, ok2.id, other.id}
    assert dlq_ids() == {bad.id}
    assert (hot(again.id).status, hot(not_mine.id).status) == (JobStatus.PENDING, JobStatus.PROCESSING)
    assert (counters("mixed"), counters("mixed-2"), counters("mixed-3")) == ((2, 1, 1), (1, 0, 0), (0, 0, 0))
    assert outcomes() == (3, 1)
    assert sorted(d["jobId"] for d in of_kind(published, "JobArchived")) == sorted([ok1.id, ok2.id, other.id])
    assert [d["jobId"] for d in of_kind(published, "JobFailed")] == [bad.id]
    assert [(d["jobId"], d["status"], d["attemptCount"]) for d in of_kind(published, "JobUpdated")] == [
        (again.id, 0, 1)]


def test_completion_is_one_transaction(published: list) -> None:
    """A failing step rolls back the moves already made in the same call (spec 01 §3): here the Archive
    insert of a job whose id the Archive already holds (it was archived once, then enqueued again)."""
    first = processing("atomic-c", "w1")[0]
    storage.complete("w1", [Success(first.id, 1.0)], [], [])
    reused = processing("atomic-c", "w1", 1, id=first.id)[0]
    ok = processing("atomic-c", "w1")[0]
    failing = processing("atomic-c", "w1")[0]
    before = {j.id: hot(j.id) for j in (reused, ok, failing)}
    published.clear()

    with pytest.raises(IntegrityError):
        storage.complete("w1", [Success(ok.id, 1.0), Success(reused.id, 1.0)], [Retry(failing.id, 1, 0.0)],
                         [])

    assert {j: hot(j) for j in before} == before
    assert counters("atomic-c") == (1, 0, 0)
    assert archive_ids() == {first.id}
    assert outcomes() == (1, 0)
    assert published == []
