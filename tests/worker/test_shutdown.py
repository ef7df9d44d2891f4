"""Graceful shutdown of an in-process worker (spec 02 §9)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from chokaq_core import CancellationReason, JobStatus, enqueue, storage
from tests import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def test_stop_releases_buffered_jobs_and_reschedules_the_running_one(
    start_worker: Any, state: Any, gate: Any
) -> None:
    gate("busy")
    running = enqueue("test.watch.v1", {"name": "busy"}, priority=100)
    buffered = [enqueue("test.ok.v1", {}) for _ in range(4)]
    worker = start_worker(concurrency=1, batch_size=10)
    state.wait_status(running, JobStatus.PROCESSING)
    state.wait_started(running)
    for job_id in buffered:
        state.wait_status(job_id, JobStatus.FETCHED, worker_id=worker.worker_id)
    assert state.wait(lambda: state.registry(worker.worker_id), "registry row").is_running

    stopped_at = timezone.now()
    start = time.monotonic()
    start_worker.stop(worker, timeout=10)
    assert time.monotonic() - start < 5

    # The running cooperative job saw the shutdown and was put back to run now, attempt consumed.
    assert jobs.CANCELS[running] == (CancellationReason.SHUTDOWN, None)
    row = state.hot(running)
    assert (row.status, row.attempt_count, row.worker_id) == (JobStatus.PENDING, 1, None)
    assert row.scheduled_at is not None
    assert abs(row.scheduled_at - stopped_at) < timedelta(seconds=5)
    # Buffered, never-started jobs went back to Pending untouched.
    for job_id in buffered:
        row = state.hot(job_id)
        assert (row.status, row.attempt_count, row.worker_id) == (JobStatus.PENDING, 0, None)
        assert job_id not in jobs.EXECUTIONS
    assert state.counters() == (0, 0, 1)
    registry = state.registry(worker.worker_id)
    assert registry.is_running is False and registry.stopped_at is not None

    # A new worker picks everything up; the interrupted job runs its second attempt.
    jobs.GATES["busy"].set()
    start_worker()
    assert state.wait_archived(running).attempt_count == 2
    assert jobs.EXECUTIONS[running] == [1, 2]
    for job_id in buffered:
        assert state.wait_archived(job_id).attempt_count == 1
        assert jobs.EXECUTIONS[job_id] == [1]


def test_a_job_that_finishes_during_shutdown_is_archived(start_worker: Any, state: Any) -> None:
    job_id = enqueue("test.sleep.v1", {"seconds": 0.6, "cooperative": False})
    worker = start_worker()
    state.wait_status(job_id, JobStatus.PROCESSING)
    state.wait_started(job_id)

    start_worker.stop(worker, timeout=10)
    archived = state.archived(job_id)
    assert archived is not None, "finalization during shutdown was not written"
    assert archived.attempt_count == 1
    assert jobs.EXECUTIONS[job_id] == [1]
    assert state.counters() == (1, 0, 0)


def test_stop_gives_up_after_the_grace_period(start_worker: Any, state: Any, fast: Any) -> None:
    fast(WORKER={"SHUTDOWN_GRACE_PERIOD": 0.3})
    job_id = enqueue("test.sleep.v1", {"seconds": 2.0, "cooperative": False})
    worker = start_worker()
    state.wait_status(job_id, JobStatus.PROCESSING)
    state.wait_started(job_id)

    start = time.monotonic()
    start_worker.stop(worker, timeout=10)
    assert time.monotonic() - start < 1.5
    # The handler is still running: the row stays Processing (a zombie later), never half-finished.
    row = state.hot(job_id)
    assert (row.status, row.attempt_count, row.worker_id) == (JobStatus.PROCESSING, 1, worker.worker_id)
    assert state.registry(worker.worker_id).is_running is False


def test_stop_of_an_idle_worker_is_quick(start_worker: Any, state: Any) -> None:
    worker = start_worker()
    state.wait(lambda: state.registry(worker.worker_id), "registry row")
    start = time.monotonic()
    start_worker.stop(worker, timeout=10)
    assert time.monotonic() - start < 2
    assert state.registry(worker.worker_id).is_running is False
    for thread in worker._threads:
        thread.join(3)
        assert not thread.is_alive(), f"{thread.name} still running after stop"


def test_stop_during_a_claim_leaves_no_row_fetched(start_worker: Any, state: Any, monkeypatch: Any) -> None:
    """stop() lands while fetch_batch is on the wire: the rows it claims must still be handed back."""
    in_fetch = threading.Event()
    real_fetch = storage.fetch_batch

    def slow_fetch(*args: Any, **kwargs: Any) -> Any:
        in_fetch.set()
        time.sleep(0.3)  # a slow database: the claim commits while the worker is stopping
        return real_fetch(*args, **kwargs)

    worker = start_worker()
    state.wait(lambda: state.registry(worker.worker_id), "registry row")
    monkeypatch.setattr(storage, "fetch_batch", slow_fetch)
    in_fetch.clear()
    assert in_fetch.wait(5)
    ids = [enqueue("test.ok.v1", {}) for _ in range(3)]
    start_worker.stop(worker, timeout=10)
    time.sleep(0.5)  # the claim has returned by now

    for job_id in ids:
        row = state.hot(job_id)
        if row is not None:
            assert (row.status, row.worker_id) == (JobStatus.PENDING, None), f"{job_id} stranded: {row}"
        else:  # or it ran to completion before the worker stopped
            assert state.archived(job_id) is not None


def test_registry_stays_stopped_after_stop(start_worker: Any, state: Any, fast: Any, monkeypatch: Any) -> None:
    """The registry writer must not mark the worker running again after shutdown marked it stopped."""
    fast(WORKER={"REGISTRY_HEARTBEAT_INTERVAL": 0.1})
    real_stop = storage.stop_worker

    def slow_stop(worker_id: str) -> None:
        real_stop(worker_id)
        time.sleep(0.4)  # shutdown's remaining steps take a while (pool join, connection close…)

    monkeypatch.setattr(storage, "stop_worker", slow_stop)
    worker = start_worker()
    state.wait(lambda: state.registry(worker.worker_id), "registry row")
    start_worker.stop(worker, timeout=10)
    time.sleep(0.3)
    registry = state.registry(worker.worker_id)
    assert registry.is_running is False and registry.stopped_at is not None
