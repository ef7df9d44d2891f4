"""Errors you can read, retries you can see: the exception class and message apart from the traceback (DLQ rows,
the Hot row's last error), Top Errors groups and their exact filter, the Pending split and the circuit hold."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from chokaq_core import service, storage
from chokaq_core.domain import AttemptError, Failure, FailureReason, JobFilter, JobStatus, Retry
from chokaq_core.models import JobsHot
from chokaq_core.readmodel import HistorySort, SnapshotRequest

from .rows import close_to, dlq_row, fetched, hot, pending, processing, raised


def _fail(queue: str, error: AttemptError | None, n: int = 1,
          reason: FailureReason = FailureReason.MAX_RETRIES_EXCEEDED) -> list[str]:
    jobs = processing(queue, "w-err", n)
    details = error.traceback if error is not None else "Cancelled by admin: bob"
    storage.complete("w-err", [], [], [Failure(j.id, reason, details, 1, error) for j in jobs])
    return [j.id for j in jobs]


def backdate_due(job_id: str) -> None:
    """Make a waiting job due (its retry time passed)."""
    assert JobsHot.objects.filter(id=job_id).update(scheduled_at=timezone.now() - timedelta(seconds=1)) == 1


def _dlq(**f: object) -> set[str]:
    return {r.id for r in service.history("dlq", JobFilter(**f), HistorySort()).rows}  # type: ignore[arg-type]


def test_a_dlq_move_stores_the_exception_class_and_message_apart_from_the_traceback() -> None:
    error = raised("payment gateway timeout")
    assert error.traceback.find("ConnectionError: payment gateway timeout") > 1000, "the message is far in"
    [job_id] = _fail("err-dlq", error)

    row = dlq_row(job_id)
    assert row is not None
    assert (row["error_class"], row["error_message"]) == ("builtins.ConnectionError", "payment gateway timeout")
    assert row["error_details"] == error.traceback, "the traceback stays in the details"
    [listed] = [r for r in service.history("dlq", JobFilter(), HistorySort()).rows if r.id == job_id]
    assert listed.error == "ConnectionError: payment gateway timeout"
    dead = storage.get_dead(job_id)
    assert dead is not None and dead.error == "ConnectionError: payment gateway timeout"


def test_a_dlq_row_without_a_class_shows_the_last_line_of_its_details() -> None:
    jobs = processing("err-old", "w-err")
    storage.complete("w-err", [], [], [Failure(jobs[0].id, FailureReason.FATAL_ERROR,
                                               "Traceback (most recent call last):\n  File \"x.py\"\nKeyError: 'sku'\n")])
    [listed] = [r for r in service.history("dlq", JobFilter(), HistorySort()).rows if r.id == jobs[0].id]
    assert (listed.error_class, listed.error) == (None, "KeyError: 'sku'")


def test_top_errors_group_by_reason_class_and_message_and_the_group_filter_lists_exactly_its_jobs() -> None:
    timeouts = _fail("err-top", raised("payment gateway timeout"), 3)
    refused = _fail("err-top", raised("connection refused"), 2)
    fatal = _fail("err-top", raised("payment gateway timeout"), 1, FailureReason.FATAL_ERROR)
    values = _fail("err-top", raised("payment gateway timeout", ValueError), 1)

    groups = storage.top_errors(10)
    assert [(g.reason, g.error_class, g.error_message, g.count) for g in groups[:2]] == [
        (FailureReason.MAX_RETRIES_EXCEEDED, "builtins.ConnectionError", "payment gateway timeout", 3),
        (FailureReason.MAX_RETRIES_EXCEEDED, "builtins.ConnectionError", "connection refused", 2)]
    assert groups[0].label == "ConnectionError: payment gateway timeout"
    assert len(groups) == 4, "reason, class and message each split a group"

    def members(group_index: int) -> set[str]:
        g = groups[group_index]
        return _dlq(failure_reason=g.reason, error_class=g.error_class, error_message=g.error_message)

    assert members(0) == set(timeouts)
    assert members(1) == set(refused)
    assert _dlq(failure_reason=FailureReason.FATAL_ERROR, error_class="builtins.ConnectionError",
                error_message="payment gateway timeout") == set(fatal)
    assert _dlq(error_class="builtins.ValueError", error_message="payment gateway timeout") == set(values)
    assert storage.preview_dlq_bulk(JobFilter(error_class="builtins.ConnectionError",
                                              error_message="connection refused"), 100).matched == 2


def test_a_group_without_a_class_leads_to_its_jobs_through_its_prefix() -> None:
    [bob] = _fail("err-legacy", None, reason=FailureReason.CANCELLED)
    jobs = processing("err-legacy", "w-err")
    storage.complete("w-err", [], [], [Failure(jobs[0].id, FailureReason.FATAL_ERROR, "line one\r\n  line two")])
    groups = {g.prefix: g for g in storage.top_errors(10)}
    multi = groups["line one\r\n  line two"]
    assert (multi.error_class, multi.label) == (None, "line one\r\n  line two")
    assert _dlq(failure_reason=multi.reason, search=multi.prefix) == {jobs[0].id}
    assert _dlq(failure_reason=FailureReason.CANCELLED, search=groups["Cancelled by admin: bob"].prefix) == {bob}


def test_a_retry_keeps_the_last_error_and_its_time_on_the_hot_row() -> None:
    job = processing("err-retry", "w1")[0]
    before = timezone.now()
    storage.complete("w1", [], [Retry(job.id, 1, 600.0, raised("gateway timeout"))], [])

    row = hot(job.id)
    assert row is not None and row["status"] == 0
    assert (row["last_error_class"], row["last_error_message"], row["held_by"]) == (
        "builtins.ConnectionError", "gateway timeout", None)
    assert close_to(row["last_error_at"], before)
    [listed] = [r for r in storage.list_active(JobFilter(), 10) if r.id == job.id]
    assert (listed.status, listed.attempt_count, listed.error) == (
        JobStatus.PENDING, 1, "ConnectionError: gateway timeout")
    assert close_to(listed.error_at, before) and close_to(listed.scheduled_at, before + timedelta(seconds=600))
    got = storage.get_hot(job.id)
    assert got is not None and got.last_error == "ConnectionError: gateway timeout"
    assert isinstance(got.last_error_at, datetime) and got.last_error_at.tzinfo is not None
    assert close_to(got.last_error_at, before)


def test_a_circuit_deferral_holds_the_job_and_keeps_its_last_error_until_it_fails_again() -> None:
    job = processing("err-held", "w1")[0]
    storage.complete("w1", [], [Retry(job.id, 1, 0.0, raised("first"))], [])
    [again] = storage.fetch_batch("w1", 1, ["err-held"])
    storage.complete("w1", [], [Retry(again.id, 1, 600.0, held_by="test.flaky.v1")], [])

    row = hot(job.id)
    assert row is not None
    assert (row["held_by"], row["last_error_message"]) == ("test.flaky.v1", "first"), "a deferral is no failure"
    [listed] = [r for r in storage.list_active(JobFilter(), 10) if r.id == job.id]
    assert listed.held_by == "test.flaky.v1"

    backdate_due(job.id)
    [third] = storage.fetch_batch("w1", 1, ["err-held"])
    assert storage.mark_processing(third, "w1") == 2
    storage.complete("w1", [], [Retry(job.id, 2, 600.0, raised("second"))], [])
    row = hot(job.id)
    assert row is not None and (row["held_by"], row["last_error_message"]) == (None, "second")


def test_the_pending_split_counts_ready_scheduled_retrying_and_held_jobs() -> None:
    pending("split", 2)
    pending("split", 1, delay=3600)
    retrying = processing("split-retry", "w1", 2)
    storage.complete("w1", [], [Retry(j.id, 1, 600.0, raised("down")) for j in retrying], [])
    held = fetched("split-held", "w1", 3)
    storage.complete("w1", [], [Retry(j.id, 0, 600.0, held_by="test.ok.v1") for j in held], [])
    due_retry = processing("split-due", "w1")[0]
    storage.complete("w1", [], [Retry(due_retry.id, 1, 0.0, raised("again"))], [])
    backdate_due(due_retry.id)

    stats = storage.summary_stats()
    assert (stats.pending, stats.ready, stats.scheduled, stats.retrying, stats.held) == (9, 3, 1, 2, 3)
    snap = storage.deck_snapshot(SnapshotRequest(active_limit=5))
    assert snap.summary == stats, "the live Deck's one read counts the same"


def test_queue_lag_counts_only_due_jobs_not_retrying_or_held_ones() -> None:
    waiting = processing("lag-due", "w1")[0]
    storage.complete("w1", [], [Retry(waiting.id, 1, 600.0, raised("down"))], [])
    held = fetched("lag-held", "w1")[0]
    storage.complete("w1", [], [Retry(held.id, 0, 600.0, held_by="test.ok.v1")], [])
    pending("lag-due", 1)
    health = {q.queue: q for q in storage.queue_health()}
    assert health["lag-due"].pending == 1
    assert (health["lag-held"].pending, health["lag-held"].max_lag_seconds) == (0, 0.0)
