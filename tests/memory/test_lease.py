"""Memory mode — lease gate, keep-alive, release and abandoned-fetch recovery (spec 01 §4.3, §4.4, §4.11, §4.15)."""

from __future__ import annotations

import pytest

from chokaq_core import storage
from chokaq_core.domain import JobStatus, Retry

from .conftest import Clock
from .rows import fetched, hot, nowhere, of_kind, pending, processing

pytestmark = pytest.mark.usefixtures("clock")


def test_mark_processing_moves_fetched_to_processing_and_counts_the_attempt(clock: Clock, published: list) -> None:
    job = fetched("gate", "w1")[0]
    clock.advance(2)

    assert storage.mark_processing(job, "w1") == 1

    row = hot(job.id)
    assert (row.status, row.attempt_count, row.worker_id) == (JobStatus.PROCESSING, 1, "w1")
    assert row.started_at == row.heartbeat_at == row.last_updated_at == clock.now
    update = of_kind(published, "JobUpdated")[-1]
    assert (update["jobId"], update["status"], update["attemptCount"]) == (job.id, int(JobStatus.PROCESSING), 1)


def test_attempt_count_keeps_growing_across_retries(clock: Clock) -> None:
    job = processing("gate-retry", "w1")[0]
    assert storage.complete("w1", [], [Retry(job.id, 1, 10.0)], []).rescheduled == [(job.id, "gate-retry")]
    clock.advance(10)
    [again] = storage.fetch_batch("w2", 5, ["gate-retry"])
    assert again.attempt_count == 1, "fetching does not count"
    assert storage.mark_processing(again, "w2") == 2
    assert hot(job.id).attempt_count == 2


def test_the_lease_gate_refuses_every_row_that_is_not_fetched_by_the_caller(published: list) -> None:
    other = fetched("gate-other", "w1")[0]
    released = fetched("gate-pending", "w1")[0]
    twice = fetched("gate-twice", "w1")[0]
    gone = fetched("gate-gone", "w1")[0]
    assert storage.release_jobs([released.id], "w1") == 1
    assert storage.mark_processing(twice, "w1") == 1
    assert storage.cancel([gone.id], actor="ops")[0] == [gone.id]
    published.clear()

    assert storage.mark_processing(other, "w2") is None
    assert storage.mark_processing(released, "w1") is None
    assert storage.mark_processing(twice, "w1") is None
    assert storage.mark_processing(gone, "w1") is None

    assert (hot(other.id).status, hot(other.id).attempt_count, hot(other.id).started_at) == (1, 0, None)
    assert (hot(released.id).status, hot(released.id).attempt_count) == (0, 0)
    assert hot(twice.id).attempt_count == 1
    assert nowhere(gone.id) is False and storage.get_hot(gone.id) is None
    assert published == []


def test_keep_alive_stamps_only_owned_processing_rows(clock: Clock) -> None:
    mine = processing("beat", "w1", 2)
    mine_fetched = fetched("beat-f", "w1")[0]
    theirs = processing("beat-o", "w2")[0]
    old = {j.id: hot(j.id) for j in [mine_fetched, theirs]}
    clock.advance(300)

    owned = storage.keep_alive([*(j.id for j in mine), mine_fetched.id, theirs.id, "no-such-job"], "w1")

    assert sorted(owned) == sorted(j.id for j in mine)
    for job in mine:
        assert hot(job.id).heartbeat_at == hot(job.id).last_updated_at == clock.now
    for job_id, before in old.items():
        assert (hot(job_id).heartbeat_at, hot(job_id).last_updated_at) == (before.heartbeat_at, before.last_updated_at)
    assert storage.keep_alive([], "w1") == []


def test_release_returns_only_owned_fetched_rows_to_pending(clock: Clock) -> None:
    mine = fetched("rel", "w1", 2)
    theirs = fetched("rel-o", "w2")[0]
    running = processing("rel-p", "w1")[0]
    clock.advance(3)

    assert storage.release_jobs([j.id for j in mine] + [theirs.id, running.id], "w1") == 2

    for job in mine:
        row = hot(job.id)
        assert (row.status, row.worker_id, row.attempt_count, row.last_updated_at) == (0, None, 0, clock.now)
    assert (hot(theirs.id).status, hot(theirs.id).worker_id) == (1, "w2")
    assert (hot(running.id).status, hot(running.id).worker_id) == (2, "w1")
    assert sorted(j.id for j in storage.fetch_batch("w3", 10, ["rel"])) == sorted(j.id for j in mine)
    assert storage.release_jobs([], "w1") == 0
    assert storage.release_jobs([pending("rel-none")[0]], "w1") == 0


def test_recover_abandoned_returns_old_fetched_rows_to_pending(clock: Clock, published: list) -> None:
    stale = fetched("abandon", "w-dead", 2)
    running = processing("abandon-run", "w-dead")[0]
    clock.advance(20 * 60)
    fresh = fetched("abandon-fresh", "w1")[0]
    published.clear()

    assert storage.recover_abandoned(600) == 2

    for job in stale:
        row = hot(job.id)
        assert (row.status, row.worker_id, row.attempt_count, row.last_updated_at) == (0, None, 0, clock.now)
    assert (hot(fresh.id).status, hot(fresh.id).worker_id) == (1, "w1")
    assert (hot(running.id).status, hot(running.id).worker_id) == (2, "w-dead"), "Processing rows are not abandoned"
    assert of_kind(published, "StatsUpdated")
    assert storage.recover_abandoned(600) == 0


def test_recover_abandoned_respects_the_timeout(clock: Clock) -> None:
    job = fetched("abandon-t", "w-dead")[0]
    clock.advance(90)
    assert storage.recover_abandoned(120) == 0
    assert hot(job.id).status == JobStatus.FETCHED
    assert storage.recover_abandoned(90) == 0, "strictly older than the timeout"
    assert storage.recover_abandoned(60) == 1
    assert hot(job.id).status == JobStatus.PENDING
