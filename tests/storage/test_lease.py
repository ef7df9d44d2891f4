"""Lease gate, keep-alive, release and abandoned-fetch recovery (spec 01 §4.3, §4.4, §4.11, §4.15)."""

from __future__ import annotations

from django.utils import timezone

from chokaq_core import storage
from chokaq_core.domain import JobStatus, Retry
from chokaq_core.models import JobsHot

from .rows import ago, backdate, close_to, fetched, hot, of_kind, pending, processing

# ---------------------------------------------------------------- mark_processing


def test_mark_processing_moves_fetched_to_processing_and_counts_the_attempt(published: list) -> None:
    job = fetched("gate", "w1")[0]
    before = timezone.now()

    assert storage.mark_processing(job, "w1") == 1

    row = hot(job.id)
    assert row is not None
    assert (row["status"], row["attempt_count"], row["worker_id"]) == (2, 1, "w1")
    assert close_to(row["started_at"], before)
    assert close_to(row["heartbeat_at"], before)
    assert row["last_updated_at"] >= row["started_at"]
    updates = of_kind(published, "JobUpdated")
    assert updates[-1]["jobId"] == job.id
    assert (updates[-1]["status"], updates[-1]["attemptCount"]) == (int(JobStatus.PROCESSING), 1)


def test_mark_processing_batch_leases_only_rows_still_fetched_by_this_worker(published: list) -> None:
    mine = fetched("gate-batch", "w1", 3)
    theirs = fetched("gate-batch-other", "w2")[0]
    started = processing("gate-batch-running", "w1")[0]
    waiting = pending("gate-batch-pending")[0]

    leased = storage.mark_processing_batch([*mine, theirs, started], "w1")

    assert leased == {job.id: 1 for job in mine}
    for job in mine:
        row = hot(job.id)
        assert row is not None and (row["status"], row["attempt_count"], row["worker_id"]) == (2, 1, "w1")
    assert (hot(theirs.id) or {})["status"] == 1, "another worker's row is not leased"
    assert (hot(started.id) or {})["attempt_count"] == 1, "a running row is not leased twice"
    assert (hot(waiting) or {})["status"] == 0
    updates = [u for u in of_kind(published, "JobUpdated") if u["status"] == int(JobStatus.PROCESSING)]
    assert {u["jobId"] for u in updates} >= {job.id for job in mine}
    assert storage.mark_processing_batch([], "w1") == {}


def test_attempt_count_keeps_growing_across_retries() -> None:
    job = processing("gate-retry", "w1")[0]
    done = storage.complete("w1", [], [Retry(job.id, 1, 0.0)], [])
    assert done.rescheduled == [(job.id, "gate-retry")]
    backdate([job.id], 1, "scheduled_at")

    [again] = storage.fetch_batch("w2", 5, ["gate-retry"])
    assert again.attempt_count == 1, "fetching does not count"

    assert storage.mark_processing(again, "w2") == 2
    assert hot(job.id)["attempt_count"] == 2  # type: ignore[index]


def test_mark_processing_by_another_worker_is_refused(published: list) -> None:
    job = fetched("gate-other", "w1")[0]
    published.clear()

    assert storage.mark_processing(job, "w2") is None

    row = hot(job.id)
    assert row is not None
    assert (row["status"], row["attempt_count"], row["worker_id"], row["started_at"]) == (1, 0, "w1", None)
    assert published == []


def test_mark_processing_of_a_pending_row_is_refused() -> None:
    job = fetched("gate-pending", "w1")[0]
    assert storage.release_jobs([job.id], "w1") == 1

    assert storage.mark_processing(job, "w1") is None
    assert (hot(job.id)["status"], hot(job.id)["attempt_count"]) == (0, 0)  # type: ignore[index]


def test_mark_processing_twice_is_refused_the_second_time() -> None:
    job = fetched("gate-twice", "w1")[0]
    assert storage.mark_processing(job, "w1") == 1
    assert storage.mark_processing(job, "w1") is None
    assert hot(job.id)["attempt_count"] == 1  # type: ignore[index]


def test_mark_processing_of_a_moved_row_is_refused() -> None:
    job = fetched("gate-gone", "w1")[0]
    moved, _ = storage.cancel([job.id], actor="ops")
    assert moved == [job.id]
    assert storage.mark_processing(job, "w1") is None
    assert hot(job.id) is None


# ---------------------------------------------------------------- keep_alive


def test_keep_alive_stamps_only_owned_processing_rows() -> None:
    mine = processing("beat", "w1", 2)
    mine_fetched = fetched("beat-f", "w1")[0]
    theirs = processing("beat-o", "w2")[0]
    all_ids = [j.id for j in mine] + [mine_fetched.id, theirs.id]
    backdate(all_ids, 300, "heartbeat_at", "last_updated_at")
    old = {r["id"]: r for r in JobsHot.objects.filter(id__in=all_ids).values()}
    before = timezone.now()

    owned = storage.keep_alive([*all_ids, "no-such-job"], "w1")

    assert sorted(owned) == sorted(j.id for j in mine)
    for job in mine:
        row = hot(job.id)
        assert row is not None
        assert close_to(row["heartbeat_at"], before) and close_to(row["last_updated_at"], before)
        assert row["status"] == 2
    for job_id in (mine_fetched.id, theirs.id):
        row = hot(job_id)
        assert row is not None
        assert (row["heartbeat_at"], row["last_updated_at"]) == (
            old[job_id]["heartbeat_at"], old[job_id]["last_updated_at"])


def test_keep_alive_with_no_ids_returns_nothing() -> None:
    processing("beat-none", "w1")
    assert storage.keep_alive([], "w1") == []


# ---------------------------------------------------------------- release_jobs


def test_release_returns_only_owned_fetched_rows_to_pending() -> None:
    mine = fetched("rel", "w1", 2)
    theirs = fetched("rel-o", "w2")[0]
    running = processing("rel-p", "w1")[0]
    ids = [j.id for j in mine] + [theirs.id, running.id]

    assert storage.release_jobs(ids, "w1") == 2

    for job in mine:
        row = hot(job.id)
        assert row is not None
        assert (row["status"], row["worker_id"], row["attempt_count"]) == (0, None, 0)
    assert (hot(theirs.id)["status"], hot(theirs.id)["worker_id"]) == (1, "w2")  # type: ignore[index]
    assert (hot(running.id)["status"], hot(running.id)["worker_id"]) == (2, "w1")  # type: ignore[index]
    assert sorted(j.id for j in storage.fetch_batch("w3", 10, ["rel"])) == sorted(j.id for j in mine)


def test_release_of_nothing_is_zero() -> None:
    assert storage.release_jobs([], "w1") == 0
    pending_id = pending("rel-none")[0]
    assert storage.release_jobs([pending_id], "w1") == 0


# ---------------------------------------------------------------- recover_abandoned


def test_recover_abandoned_returns_old_fetched_rows_to_pending(published: list) -> None:
    stale = fetched("abandon", "w-dead", 2)
    fresh = fetched("abandon-fresh", "w1")[0]
    running = processing("abandon-run", "w-dead")[0]
    backdate([j.id for j in stale] + [running.id], 20 * 60, "last_updated_at")
    before = timezone.now()
    published.clear()

    assert storage.recover_abandoned(600) == 2

    for job in stale:
        row = hot(job.id)
        assert row is not None
        assert (row["status"], row["worker_id"], row["attempt_count"]) == (0, None, 0)
        assert close_to(row["last_updated_at"], before)
    assert (hot(fresh.id)["status"], hot(fresh.id)["worker_id"]) == (1, "w1")  # type: ignore[index]
    assert (hot(running.id)["status"], hot(running.id)["worker_id"]) == (2, "w-dead")  # type: ignore[index]
    assert of_kind(published, "StatsUpdated"), "recovery announces changed counts"
    assert storage.recover_abandoned(600) == 0


def test_recover_abandoned_respects_the_timeout() -> None:
    job = fetched("abandon-t", "w-dead")[0]
    JobsHot.objects.filter(id=job.id).update(last_updated_at=ago(90))

    assert storage.recover_abandoned(120) == 0
    assert hot(job.id)["status"] == 1  # type: ignore[index]
    assert storage.recover_abandoned(60) == 1
    assert hot(job.id)["status"] == 0  # type: ignore[index]
