"""storage.complete: archive, DLQ and reschedule moves with their counters and buckets (spec 01 §3, §4.5, §4.6, §4.13, §4.14)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from chokaq_core import events, storage
from chokaq_core.domain import Failure, FailureReason, JobStatus, Retry, Success
from chokaq_core.models import JobsArchive, JobsDLQ, JobsHot, MetricBuckets

from .rows import (
    age,
    all_buckets,
    archive_row,
    buckets,
    close_to,
    counters,
    dlq_row,
    hot,
    new_job,
    of_kind,
    pending,
    processing,
    stats,
)

# ---------------------------------------------------------------- archive


def test_archive_moves_the_row_with_its_columns() -> None:
    job = processing("arc", "w1", 1, tags="t1", created_by="producer", payload='{"k":1}')[0]
    before_move = hot(job.id)
    assert before_move is not None
    JobsHot.objects.filter(id=job.id).update(last_modified_by="editor")
    before = timezone.now()

    done = storage.complete("w1", [Success(job.id, 12.5)], [], [])

    assert done.archived == [(job.id, "arc")]
    assert (done.rescheduled, done.failed) == ([], [])
    assert hot(job.id) is None
    row = archive_row(job.id)
    assert row is not None
    assert (row["queue"], row["type"], row["payload"], row["tags"]) == ("arc", job.type, '{"k":1}', "t1")
    assert row["attempt_count"] == 1
    assert row["worker_id"] == "w1"
    assert row["created_by"] == "producer"
    assert row["last_modified_by"] == "editor"
    assert row["created_at"] == before_move["created_at"]
    assert row["started_at"] == before_move["started_at"]
    assert row["duration_ms"] == 12.5
    assert close_to(row["finished_at"], before)
    assert row["finished_at"] >= row["started_at"]
    assert dlq_row(job.id) is None


def test_archive_bumps_succeeded_total_and_the_success_bucket() -> None:
    jobs = processing("arc-count", "w1", 3)
    untimed = processing("arc-count2", "w1", 1)[0]
    JobsHot.objects.filter(id=untimed.id).update(queue="arc-count")
    before = timezone.now()

    done = storage.complete(
        "w1", [Success(jobs[0].id, 10.0), Success(jobs[1].id, 30.0), Success(jobs[2].id, 20.0),
               Success(untimed.id, None)], [], [])

    assert len(done.archived) == 4
    assert counters("arc-count") == (4, 0, 0)
    assert close_to(stats("arc-count")["last_activity_at"], before)  # type: ignore[index]
    assert buckets("arc-count", 0, -1) == {"completed": 4, "timed": 3, "total": 60.0, "max": 30.0}
    assert buckets("arc-count", 1, -1)["completed"] == 0
    for bucket in MetricBuckets.objects.filter(queue="arc-count"):
        assert bucket.bucket_start.microsecond == 0, "buckets are whole UTC seconds"
        assert close_to(bucket.bucket_start, before)


def test_bucket_max_ignores_a_later_untimed_success() -> None:
    """MaxDurationMs = max(old, new) ignoring NULLs (spec 01 §4.13, the SQLite max() trap)."""
    a, b, c = processing("arc-max", "w1", 3)
    storage.complete("w1", [Success(a.id, 40.0)], [], [])
    storage.complete("w1", [Success(b.id, None)], [], [])
    assert buckets("arc-max", 0, -1) == {"completed": 2, "timed": 1, "total": 40.0, "max": 40.0}
    storage.complete("w1", [Success(c.id, 15.0)], [], [])
    assert buckets("arc-max", 0, -1) == {"completed": 3, "timed": 2, "total": 55.0, "max": 40.0}


def test_outcomes_of_different_seconds_land_in_different_buckets() -> None:
    a, b = processing("secs", "w1", 2)
    storage.complete("w1", [Success(a.id, 1.0)], [], [])
    age(1, [MetricBuckets])  # the success's bucket is now one second older than any new one
    storage.complete("w1", [], [], [Failure(b.id, FailureReason.TIMEOUT, "slow")])
    rows = list(MetricBuckets.objects.filter(queue="secs").order_by("bucket_start")
                .values_list("bucket_start", "outcome", "completed_count"))
    assert [(outcome, n) for _, outcome, n in rows] == [(0, 1), (1, 1)]
    assert rows[0][0] < rows[1][0]
    [success] = storage.throughput(rows[0][0])[:1]
    assert (success.at, success.succeeded, success.failed) == (rows[0][0], 1, 0)
    assert storage.throughput(rows[1][0] + timedelta(microseconds=1)) == []


def test_archive_by_the_wrong_worker_moves_nothing() -> None:
    job = processing("arc-guard", "w1")[0]
    before = hot(job.id)

    done = storage.complete("w2", [Success(job.id, 1.0)], [], [])

    assert done.archived == []
    assert hot(job.id) == before
    assert archive_row(job.id) is None
    assert counters("arc-guard") == (0, 0, 0)
    assert MetricBuckets.objects.filter(queue="arc-guard").count() == 0


def test_archive_without_a_worker_guard_moves_any_owner() -> None:
    job = processing("arc-admin", "w1")[0]
    done = storage.complete(None, [Success(job.id, 2.0)], [], [])
    assert done.archived == [(job.id, "arc-admin")]
    assert archive_row(job.id)["worker_id"] == "w1"  # type: ignore[index]


def test_archive_of_an_unknown_id_moves_nothing(published: list) -> None:
    waiting = pending("arc-unowned")[0]
    published.clear()
    done = storage.complete("w1", [Success("no-such-job", 1.0), Success(waiting, 1.0)], [], [])
    assert done.archived == []
    assert published == []
    assert JobsArchive.objects.count() == 0


# ---------------------------------------------------------------- DLQ


def test_move_to_dlq_with_reason_details_counters_and_bucket(published: list) -> None:
    job = processing("dlq", "w1", 1, tags="x", created_by="p")[0]
    before_move = hot(job.id)
    before = timezone.now()
    published.clear()

    done = storage.complete("w1", [], [], [Failure(job.id, FailureReason.FATAL_ERROR, "FATAL: bad input")])

    assert done.failed == [(job.id, "dlq")]
    assert hot(job.id) is None
    row = dlq_row(job.id)
    assert row is not None
    assert row["failure_reason"] == int(FailureReason.FATAL_ERROR)
    assert row["error_details"] == "FATAL: bad input"
    assert (row["attempt_count"], row["worker_id"], row["tags"], row["created_by"]) == (1, "w1", "x", "p")
    assert row["created_at"] == before_move["created_at"]  # type: ignore[index]
    assert row["payload"] == before_move["payload"]  # type: ignore[index]
    assert close_to(row["failed_at"], before)
    assert counters("dlq") == (0, 1, 0)
    assert buckets("dlq", 1, int(FailureReason.FATAL_ERROR)) == {"completed": 1, "timed": 0, "total": 0.0,
                                                                  "max": None}
    assert buckets("dlq", 0, -1)["completed"] == 0
    assert [d["reason"] for d in of_kind(published, "JobFailed")] == ["FatalError"]


def test_move_to_dlq_groups_buckets_by_reason() -> None:
    a, b, c = processing("dlq-reasons", "w1", 3)
    storage.complete("w1", [], [], [Failure(a.id, FailureReason.TRANSIENT, "e1"),
                                    Failure(b.id, FailureReason.TRANSIENT, "e2"),
                                    Failure(c.id, FailureReason.TIMEOUT, "e3")])
    assert buckets("dlq-reasons", 1, int(FailureReason.TRANSIENT))["completed"] == 2
    assert buckets("dlq-reasons", 1, int(FailureReason.TIMEOUT))["completed"] == 1
    assert counters("dlq-reasons") == (0, 3, 0)


def test_move_to_dlq_with_empty_details_stores_the_default_text() -> None:
    job = processing("dlq-empty", "w1")[0]
    storage.complete("w1", [], [], [Failure(job.id, FailureReason.TRANSIENT, "")])
    assert dlq_row(job.id)["error_details"] == "Unknown error (No details provided)"  # type: ignore[index]


def test_move_to_dlq_by_the_wrong_worker_moves_nothing() -> None:
    job = processing("dlq-guard", "w1")[0]
    before = hot(job.id)

    done = storage.complete("w2", [], [], [Failure(job.id, FailureReason.FATAL_ERROR, "x")])

    assert done.failed == []
    assert hot(job.id) == before
    assert dlq_row(job.id) is None
    assert counters("dlq-guard") == (0, 0, 0)
    assert MetricBuckets.objects.filter(queue="dlq-guard").count() == 0


# ---------------------------------------------------------------- reschedule


def test_reschedule_for_retry_returns_the_row_to_pending_later() -> None:
    job = processing("retry", "w1")[0]
    before = timezone.now()
    buckets_before = all_buckets()

    done = storage.complete("w1", [], [Retry(job.id, 1, 30.0)], [])

    assert done.rescheduled == [(job.id, "retry")]
    row = hot(job.id)
    assert row is not None
    assert (row["status"], row["worker_id"], row["heartbeat_at"], row["attempt_count"]) == (0, None, None, 1)
    assert close_to(row["scheduled_at"], before + timedelta(seconds=30))
    assert row["scheduled_at"] > before + timedelta(seconds=20)
    assert close_to(row["last_updated_at"], before)
    assert counters("retry") == (0, 0, 1)
    assert all_buckets() == buckets_before, "a retry is not an outcome"
    assert storage.fetch_batch("w2", 5, ["retry"]) == [], "not due yet"


def test_reschedule_stores_the_attempt_count_as_given() -> None:
    job = processing("retry-n", "w1")[0]
    storage.complete("w1", [], [Retry(job.id, 5, 0.0)], [])
    assert hot(job.id)["attempt_count"] == 5  # type: ignore[index]


def test_reschedule_with_zero_delay_is_due_at_once() -> None:
    job = processing("retry-now", "w1")[0]
    storage.complete("w1", [], [Retry(job.id, 1, 0.0)], [])
    assert [j.id for j in storage.fetch_batch("w2", 5, ["retry-now"])] == [job.id]


def test_reschedule_by_the_wrong_worker_changes_nothing() -> None:
    job = processing("retry-guard", "w1")[0]
    before = hot(job.id)

    done = storage.complete("w2", [], [Retry(job.id, 1, 5.0)], [])

    assert done.rescheduled == []
    assert hot(job.id) == before
    assert counters("retry-guard") == (0, 0, 0)


# ---------------------------------------------------------------- mixed batch


def test_mixed_batch_in_one_call(published: list) -> None:
    ok1, ok2, again, bad = processing("mixed", "w1", 4)
    other = processing("mixed-2", "w1", 1)[0]
    not_mine = processing("mixed-3", "w2", 1)[0]
    published.clear()

    done = storage.complete(
        "w1",
        [Success(ok1.id, 5.0), Success(ok2.id, 7.0), Success(other.id, 1.0), Success(not_mine.id, 1.0)],
        [Retry(again.id, 1, 60.0)],
        [Failure(bad.id, FailureReason.TRANSIENT, "exhausted")],
    )

    assert sorted(done.archived) == sorted([(ok1.id, "mixed"), (ok2.id, "mixed"), (other.id, "mixed-2")])
    assert done.rescheduled == [(again.id, "mixed")]
    assert done.failed == [(bad.id, "mixed")]
    assert {r["id"] for r in JobsArchive.objects.values("id")} == {ok1.id, ok2.id, other.id}
    assert set(JobsDLQ.objects.values_list("id", flat=True)) == {bad.id}
    assert hot(again.id)["status"] == 0  # type: ignore[index]
    assert hot(not_mine.id)["status"] == 2  # type: ignore[index]
    assert counters("mixed") == (2, 1, 1)
    assert counters("mixed-2") == (1, 0, 0)
    assert counters("mixed-3") == (0, 0, 0)
    assert buckets("mixed", 0, -1) == {"completed": 2, "timed": 2, "total": 12.0, "max": 7.0}
    assert buckets("mixed-2", 0, -1)["completed"] == 1
    assert buckets("mixed", 1, int(FailureReason.TRANSIENT))["completed"] == 1
    assert sorted(d["jobId"] for d in of_kind(published, "JobArchived")) == sorted([ok1.id, ok2.id, other.id])
    assert [d["jobId"] for d in of_kind(published, "JobFailed")] == [bad.id]
    assert [(d["jobId"], d["status"], d["attemptCount"]) for d in of_kind(published, "JobUpdated")] == [
        (again.id, 0, 1)]


def test_completion_is_one_transaction() -> None:
    """A failing step rolls back the moves already made in the same call (spec 01 §3)."""
    ok = processing("atomic-c", "w1")[0]
    clash = processing("atomic-c2", "w1")[0]
    JobsArchive.objects.create(id=clash.id, queue="atomic-c2", type="t", created_at=timezone.now(),
                               finished_at=timezone.now())

    try:
        storage.complete("w1", [Success(ok.id, 1.0), Success(clash.id, 1.0)], [], [])
    except Exception:  # the insert must fail on the duplicate Archive id
        pass
    else:
        raise AssertionError("archiving onto an existing Archive id must fail")

    assert hot(ok.id) is not None and hot(clash.id) is not None
    assert archive_row(ok.id) is None
    assert counters("atomic-c") == (0, 0, 0)


def test_completion_events_fire_only_for_rows_moved(published: list) -> None:
    job = new_job("ev")
    storage.enqueue([job])
    published.clear()
    done = storage.complete("w1", [Success(job.id, 1.0)], [], [])  # Pending and not owned by w1
    assert done.archived == []
    assert published == []


# ---------------------------------------------------------------- events nobody hears


def test_a_worker_nobody_hears_builds_no_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an in-process listener or a channel layer (a worker without the Deck's Redis) an event reaches no one:
    the claim that leases, the lease, the single lease and the completions of every outcome build none (with a
    listener each announces its jobs: the tests of those transitions)."""
    built: list[object] = []
    real = events.Event

    def counted(*args: Any, **kwargs: Any) -> events.Event:
        built.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(events, "_listeners", [])
    monkeypatch.setattr(events, "_publisher", lambda: None)
    monkeypatch.setattr(events, "Event", counted)
    ids = pending("unheard", 6)

    claimed = storage.fetch_batch("w1", 6, ["unheard"], lease=2)
    assert [j.status for j in claimed].count(JobStatus.PROCESSING) == 2
    assert storage.mark_processing_batch(claimed[2:5], "w1") == {job_id: 1 for job_id in ids[2:5]}
    assert storage.mark_processing(claimed[5], "w1") == 1
    done = storage.complete("w1", [Success(ids[0], 1.0), Success(ids[1], 1.0)], [Retry(ids[2], 1, 60.0)],
                            [Failure(ids[3], FailureReason.TRANSIENT, "exhausted")])
    assert (len(done.archived), len(done.rescheduled), len(done.failed)) == (2, 1, 1)
    assert storage.complete("w1", [Success(ids[4], 1.0), Success(ids[5], 1.0)], [], []).archived

    assert built == []
    assert counters("unheard") == (4, 1, 1)
