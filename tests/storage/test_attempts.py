"""The attempts history: every failed execution's error is kept, in the transaction of its retry or DLQ move."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from chokaq_core import storage
from chokaq_core.domain import AttemptError, Failure, FailureReason, Retry
from chokaq_core.models import JobAttempts

from .rows import close_to, dlq_row, hot, processing


def _error(message: str, kind: type[BaseException] = ConnectionError) -> AttemptError:
    try:
        raise kind(message)
    except BaseException as exc:
        return AttemptError.of(exc)


def _rows(job_id: str) -> list[dict]:
    return list(JobAttempts.objects.filter(job_id=job_id).order_by("id").values())


def test_a_retried_attempt_keeps_its_error_on_the_attempts_history() -> None:
    job = processing("att-retry", "w1")[0]
    started = hot(job.id)["started_at"]  # type: ignore[index]
    before = timezone.now()

    storage.complete("w1", [], [Retry(job.id, 1, 30.0, _error("gateway timeout"))], [])

    assert hot(job.id)["attempt_count"] == 1  # type: ignore[index]
    [row] = _rows(job.id)
    assert (row["attempt"], row["worker_id"], row["error_class"], row["error_message"]) == (
        1, "w1", "builtins.ConnectionError", "gateway timeout")
    assert row["traceback"].startswith("Traceback (most recent call last):\n")
    assert row["traceback"].endswith("ConnectionError: gateway timeout\n")
    assert close_to(row["failed_at"], before)
    assert row["started_at"] == started is not None


def test_every_attempt_stays_in_order_when_the_job_moves_to_the_dlq() -> None:
    job = processing("att-dlq", "w1")[0]
    storage.complete("w1", [], [Retry(job.id, 1, 0.0, _error("first"))], [])
    [again] = storage.fetch_batch("w2", 1, ["att-dlq"])
    assert storage.mark_processing(again, "w2") == 2

    storage.complete("w2", [], [], [Failure(job.id, FailureReason.FATAL_ERROR, "FATAL: second", 2,
                                            _error("second", ValueError))])

    assert dlq_row(job.id) is not None
    history = storage.job_attempts(job.id)
    assert [(a.attempt, a.worker_id, a.error_class, a.message) for a in history] == [
        (1, "w1", "builtins.ConnectionError", "first"), (2, "w2", "builtins.ValueError", "second")]
    assert history[0].failed_at <= history[1].failed_at
    assert storage.job_attempts("no-such-job") == []


def test_a_move_that_lost_ownership_records_no_attempt() -> None:
    job = processing("att-lost", "w1")[0]
    done = storage.complete("intruder", [], [Retry(job.id, 1, 0.0, _error("not mine"))],
                            [Failure(job.id, FailureReason.FATAL_ERROR, "x", 1, _error("x"))])
    assert (done.rescheduled, done.failed) == ([], [])
    assert _rows(job.id) == []


def test_outcomes_without_an_error_record_nothing() -> None:
    deferred, cancelled = processing("att-none", "w1", 2)
    storage.complete("w1", [], [Retry(deferred.id, 0, 5.0)],  # e.g. a circuit-breaker deferral: nothing ran
                     [Failure(cancelled.id, FailureReason.CANCELLED, "Cancelled by admin while running")])
    assert _rows(deferred.id) == _rows(cancelled.id) == []


def test_a_batch_records_one_row_per_failed_execution() -> None:
    jobs = processing("att-batch", "w1", 3)
    storage.complete("w1", [], [Retry(j.id, 1, 0.0, _error(f"boom {j.id}")) for j in jobs], [])
    assert {j.id: [a.message for a in storage.job_attempts(j.id)] for j in jobs} == {
        j.id: [f"boom {j.id}"] for j in jobs}


def test_purge_attempts_deletes_only_older_rows_in_batches(small_batches: int) -> None:
    jobs = processing("att-purge", "w1", 4)
    storage.complete("w1", [], [Retry(j.id, 1, 0.0, _error("old")) for j in jobs], [])
    old = [j.id for j in jobs[:3]]
    JobAttempts.objects.filter(job_id__in=old).update(failed_at=timezone.now() - timedelta(days=10))
    reported: list[int] = []

    assert storage.purge_attempts(timezone.now() - timedelta(days=1), reported.append) == 3

    assert reported == [2, 1]
    assert list(JobAttempts.objects.values_list("job_id", flat=True)) == [jobs[3].id]
