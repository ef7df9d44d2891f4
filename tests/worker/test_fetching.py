"""What the worker claims: delays, --queues, per-queue bulkheads (spec 02 §4.5, 03 §1, §5)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connections, transaction

from chokaq_core import JobStatus, enqueue, storage
from chokaq_core.domain import HotJob
from chokaq_core.models import JobsHot
from tests import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def test_delayed_job_runs_only_once_due(start_worker: Any, state: Any) -> None:
    job_id = enqueue("test.ok.v1", {}, delay=0.6)
    start_worker()
    time.sleep(0.3)
    assert state.hot(job_id).status == JobStatus.PENDING and job_id not in jobs.EXECUTIONS

    archived = state.wait_archived(job_id)
    assert (archived.started_at - archived.created_at).total_seconds() >= 0.6
    assert archived.attempt_count == 1 and jobs.EXECUTIONS[job_id] == [1]


def test_worker_restricted_to_queues_leaves_the_others(start_worker: Any, state: Any) -> None:
    mine = enqueue("test.ok.v1", {}, queue="alpha")
    other = enqueue("test.ok.v1", {}, queue="beta")
    start_worker(queues=["alpha"])

    state.wait_archived(mine)
    time.sleep(0.3)
    row = state.hot(other)
    assert (row.status, row.worker_id) == (JobStatus.PENDING, None)
    assert other not in jobs.EXECUTIONS


def test_queue_bulkhead_caps_active_rows(start_worker: Any, state: Any) -> None:
    storage.set_queue_max_workers("narrow", 2)
    ids = [enqueue("test.sleep.v1", {"seconds": 0.15}, queue="narrow") for _ in range(8)]
    free = [enqueue("test.sleep.v1", {"seconds": 0.15}, queue="wide") for _ in range(8)]
    start_worker(concurrency=10)

    peak_narrow = peak_wide = 0
    deadline = time.monotonic() + 20
    while JobsHot.objects.exists() and time.monotonic() < deadline:
        active = JobsHot.objects.filter(status__in=[JobStatus.FETCHED, JobStatus.PROCESSING])
        peak_narrow = max(peak_narrow, active.filter(queue="narrow").count())
        peak_wide = max(peak_wide, active.filter(queue="wide").count())
        time.sleep(0.01)

    assert not JobsHot.objects.exists()
    assert peak_narrow == 2, "MaxWorkers=2 must cap the queue's Fetched+Processing rows"
    assert peak_wide > 2, "an uncapped queue is not held back by its neighbour's cap"
    for job_id in ids + free:
        assert state.archived(job_id).attempt_count == 1
        assert jobs.EXECUTIONS[job_id] == [1]


def test_bulkhead_holds_between_two_concurrent_claims(state: Any, vendor: str) -> None:
    """Spec 03 §5: MaxWorkers caps Fetched+Processing *across the whole fleet*. Worker A's claim is
    still uncommitted while worker B claims from the same capped queue."""
    storage.set_queue_max_workers("narrow", 2)
    # More rows than A's lock window (10 × its limit), so B finds unlocked rows to claim.
    for _ in range(30):
        enqueue("test.ok.v1", {}, queue="narrow")
    claimed_by_b: list[HotJob] = []

    def claim_b() -> None:
        try:
            claimed_by_b.extend(storage.fetch_batch("claimer-b", 10, ["narrow"]))
        finally:
            connections.close_all()

    other = threading.Thread(target=claim_b)
    with transaction.atomic():
        claimed_by_a = storage.fetch_batch("claimer-a", 2, ["narrow"])
        other.start()
        other.join(1.0)  # PostgreSQL answers at once; SQLite waits for A's write lock
    other.join(30)
    assert not other.is_alive()

    assert len(claimed_by_a) == 2
    active = JobsHot.objects.filter(queue="narrow", status__in=[JobStatus.FETCHED, JobStatus.PROCESSING])
    assert len(claimed_by_a) + len(claimed_by_b) == active.count()
    assert active.count() <= 2, f"MaxWorkers=2 but {active.count()} rows are active"


def test_an_idle_worker_is_woken_by_a_new_job_not_by_its_poll(start_worker: Any, state: Any, fast: Any,
                                                               vendor: str) -> None:
    """The poll is 60 s away: only PostgreSQL's NOTIFY or SQLite's commit marker, which the fetcher waits on
    itself (no thread of their own), can bring the job to the worker within the wait."""
    fast(WORKER={"POLLING_INTERVAL": 60})
    worker = start_worker()
    expected = {"postgresql": "listen", "sqlite": "commit_marker"}[vendor]
    assert worker.fetcher.source is not None and worker.fetcher.source.kind == expected
    assert not {"chokaq-listener", "chokaq-probe"} & {t.name for t in worker._threads}
    time.sleep(0.5)  # the fetcher made its first (empty) claim and waits

    job_id = enqueue("test.ok.v1", {})

    state.wait_archived(job_id, timeout=15)
