"""``chokaq_core.get_job`` / ``aget_job``: a read-only record of a job from whichever pillar holds it."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from chokaq_core import FailureReason, JobRecord, JobStatus, aget_job, enqueue, get_job, storage
from chokaq_core.domain import AttemptError, Failure, HotJob, Retry, Success

pytestmark = pytest.mark.django_db(transaction=True)


def _running(job_id: str, worker: str = "w1") -> HotJob:
    [job] = [j for j in storage.fetch_batch(worker, 10) if j.id == job_id]
    assert storage.mark_processing(job, worker) is not None
    return job


def _error(message: str) -> AttemptError:
    try:
        raise ConnectionError(message)
    except ConnectionError as exc:
        return AttemptError.of(exc)


def test_an_unknown_id_is_none() -> None:
    assert get_job("01HNOSUCHJOB0000000000000") is None
    assert async_to_sync(aget_job)("nope") is None


def test_a_non_string_id_is_refused() -> None:
    with pytest.raises(TypeError, match="job_id must be a string"):
        get_job(42)  # type: ignore[arg-type]


def test_a_pending_job_reads_from_hot_and_the_record_is_read_only() -> None:
    job_id = enqueue("test.ok.v1", {"n": 1}, queue="records", priority=7, tags="a,b", delay=60)
    record = get_job(job_id)
    assert isinstance(record, JobRecord)
    assert (record.id, record.status, record.queue, record.type, record.payload, record.tags, record.priority) == (
        job_id, JobStatus.PENDING, "records", "test.ok.v1", {"n": 1}, "a,b", 7)
    assert (record.attempts, record.started_at, record.finished_at, record.result, record.error) == (
        0, None, None, None, None)
    assert record.scheduled_at is not None and record.scheduled_at > record.created_at + timedelta(seconds=50)
    assert not record.is_finished and record.failed_attempts == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.status = JobStatus.SUCCEEDED  # type: ignore[misc]
    assert async_to_sync(aget_job)(job_id) == record


def test_a_running_then_succeeded_job_carries_times_attempts_and_result() -> None:
    job_id = enqueue("test.ok.v1", {})
    _running(job_id)
    running = get_job(job_id)
    assert running is not None and running.status == JobStatus.PROCESSING
    assert (running.attempts, running.worker_id) == (1, "w1") and running.started_at is not None

    storage.complete("w1", [Success(job_id, 4.5, '{"answer": 42}')], [], [])

    done = get_job(job_id)
    assert done is not None and done.status == JobStatus.SUCCEEDED and done.is_finished
    assert done.result == {"answer": 42}
    assert done.created_at == running.created_at and done.started_at == running.started_at
    assert done.finished_at is not None and done.finished_at >= done.started_at  # type: ignore[operator]
    assert (done.priority, done.error, done.failure_reason) == (None, None, None)


def test_a_retried_then_dead_job_carries_its_error_and_every_failed_attempt() -> None:
    job_id = enqueue("test.ok.v1", {})
    _running(job_id)
    storage.complete("w1", [], [Retry(job_id, 1, 0.0, _error("first"))], [])
    retrying = get_job(job_id)
    assert retrying is not None and retrying.status == JobStatus.PENDING and retrying.attempts == 1
    assert [a.message for a in retrying.failed_attempts] == ["first"]
    assert (retrying.error_class, retrying.error_summary) == ("builtins.ConnectionError", "ConnectionError: first")

    _running(job_id, "w2")
    storage.complete("w2", [], [], [Failure(job_id, FailureReason.TRANSIENT, "Traceback …\nConnectionError: second",
                                            2, _error("second"))])

    dead = get_job(job_id)
    assert dead is not None and dead.status == JobStatus.FAILED and dead.is_finished
    assert (dead.failure_reason, dead.error, dead.attempts) == (
        FailureReason.TRANSIENT, "Traceback …\nConnectionError: second", 2)
    assert [(a.attempt, a.worker_id, a.message) for a in dead.failed_attempts] == [(1, "w1", "first"),
                                                                                (2, "w2", "second")]
    assert dead.finished_at is not None and dead.finished_at <= timezone.now()
    assert dead.started_at == dead.failed_attempts[-1].started_at is not None
    assert (dead.error_class, dead.error_message, dead.error_summary) == (
        "builtins.ConnectionError", "second", "ConnectionError: second")


def test_a_cancelled_job_reads_cancelled() -> None:
    job_id = enqueue("test.ok.v1", {})
    storage.cancel([job_id], actor="alice")
    record = get_job(job_id)
    assert record is not None and record.status == JobStatus.CANCELLED
    assert record.failure_reason == FailureReason.CANCELLED
