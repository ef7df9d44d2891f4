"""Timeouts, heartbeats, the rescue sweep and operator commands against a running worker
(spec 02 §6–§8, §11; 03 §7)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from chokaq_core import CancellationReason, FailureReason, JobStatus, enqueue, service, storage
from chokaq_core.models import JobsHot, Queues
from tests import jobs

pytestmark = pytest.mark.django_db(transaction=True)


# ---------------------------------------------------------------- execution timeout


def test_execution_timeout_cancels_a_cooperative_handler(start_worker: Any, state: Any, fast: Any) -> None:
    fast(EXECUTION={"DEFAULT_TIMEOUT": 0.3})
    job_id = enqueue("test.sleep.v1", {"seconds": 30})
    started = time.monotonic()
    start_worker()

    dead = state.wait_dead(job_id)
    assert time.monotonic() - started < 10
    assert dead.failure_reason == FailureReason.TIMEOUT
    assert dead.error_details == "Timeout: Execution Timeout"
    assert dead.attempt_count == 1
    assert jobs.EXECUTIONS[job_id] == [1]  # a timeout is terminal: no retry
    assert state.counters() == (0, 1, 0)


def test_per_queue_execution_timeout(start_worker: Any, state: Any, fast: Any) -> None:
    # Queue names in QUEUES are matched case-insensitively; the row's queue decides.
    fast(EXECUTION={"DEFAULT_TIMEOUT": 30}, QUEUES={"Slow": {"EXECUTION_TIMEOUT": 0.3}})
    limited = enqueue("test.sleep.v1", {"seconds": 30}, queue="slow")
    limited_async = enqueue("test.async.v1", {"seconds": 30}, queue="slow")
    unlimited = enqueue("test.sleep.v1", {"seconds": 0.8}, queue="default")
    start_worker()

    for job_id in (limited, limited_async):
        dead = state.wait_dead(job_id)
        assert (dead.failure_reason, dead.error_details) == (FailureReason.TIMEOUT, "Timeout: Execution Timeout")
        assert dead.attempt_count == 1
        assert jobs.EXECUTIONS[job_id] == [1]
    archived = state.wait_archived(unlimited)
    assert archived.attempt_count == 1 and archived.duration_ms >= 800
    assert state.counters("slow") == (0, 2, 0)


def test_handler_ignoring_the_timeout_keeps_running_and_succeeds(start_worker: Any, state: Any, fast: Any) -> None:
    fast(EXECUTION={"DEFAULT_TIMEOUT": 0.2})
    job_id = enqueue("test.sleep.v1", {"seconds": 0.8, "cooperative": False})
    start_worker()

    archived = state.wait_archived(job_id)
    assert archived.attempt_count == 1 and archived.duration_ms >= 800
    assert jobs.EXECUTIONS[job_id] == [1]


# ---------------------------------------------------------------- heartbeat and rescue


def test_heartbeat_keeps_a_long_job_out_of_the_zombie_sweep(
    start_worker: Any, state: Any, fast: Any, gate: Any
) -> None:
    # Heartbeat every 0.2–0.3 s, zombie timeout 1 s, sweep every 0.2 s, job runs ~2.5 s.
    fast(RECOVERY={"PROCESSING_ZOMBIE_TIMEOUT": 1.0, "SCAN_INTERVAL": 0.2})
    release = gate("long")
    job_id = enqueue("test.gate.v1", {"name": "long"})
    worker = start_worker()

    first = state.wait_status(job_id, JobStatus.PROCESSING)
    beats = {first.heartbeat_at}
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        row = state.hot(job_id)
        assert row is not None and row.status == JobStatus.PROCESSING, "the running job left Hot"
        assert row.worker_id == worker.worker_id
        beats.add(row.heartbeat_at)
        time.sleep(0.05)
    assert len(beats) >= 5, f"heartbeat_at advanced only {len(beats) - 1} times in 2.5 s"
    assert max(beats) - first.heartbeat_at >= timedelta(seconds=1.5)
    assert state.dead(job_id) is None

    release.set()
    archived = state.wait_archived(job_id)
    assert archived.attempt_count == 1
    assert jobs.EXECUTIONS[job_id] == [1]


def _leasing_ahead(start_worker: Any, state: Any, gate: Any, waiting: int) -> tuple[Any, str, list[str]]:
    """A one-executor worker leasing ahead (its limiter paced as after very short executions), its executor held
    by a gated job, and ``waiting`` jobs leased behind it: (worker, the gated job, the waiting jobs)."""
    gate("ahead")
    blocker = enqueue("test.gate.v1", {"name": "ahead"})
    worker = start_worker(concurrency=1)
    worker.limiter.pace(1e-5)  # executions this short: lease a whole prefetch buffer ahead of the one executor
    assert worker.limiter.ahead == worker.buffer.capacity
    state.wait_started(blocker)
    behind = [enqueue("test.ok.v1", {"n": n}) for n in range(waiting)]
    for job_id in behind:
        state.wait_status(job_id, JobStatus.PROCESSING, attempt_count=1, worker_id=worker.worker_id)
    return worker, blocker, behind


def test_jobs_leased_ahead_wait_for_an_executor_past_the_zombie_timeout_and_are_never_swept(
    start_worker: Any, state: Any, fast: Any, gate: Any
) -> None:
    """Rows leased ahead wait, Processing and ours, for the one executor a gated job holds for three zombie
    timeouts, the sweep running every 0.2 s: the heartbeat keeps every one alive, none reaches the DLQ, and each
    runs once when the executor frees."""
    fast(RECOVERY={"PROCESSING_ZOMBIE_TIMEOUT": 1.0, "SCAN_INTERVAL": 0.2})
    worker, blocker, behind = _leasing_ahead(start_worker, state, gate, waiting=5)
    leased = {job_id: state.hot(job_id).heartbeat_at for job_id in behind}
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        for job_id in behind:
            row = state.hot(job_id)
            assert row is not None and row.status == JobStatus.PROCESSING, f"{job_id} left Hot while it waited"
            assert row.worker_id == worker.worker_id and row.attempt_count == 1
        assert not any(jobs.EXECUTIONS.get(job_id) for job_id in behind), "the executor is held"
        time.sleep(0.05)
    for job_id in behind:
        assert state.hot(job_id).heartbeat_at - leased[job_id] >= timedelta(seconds=2), f"{job_id} not beaten"
        assert state.dead(job_id) is None

    jobs.GATES["ahead"].set()
    for job_id in [blocker, *behind]:
        assert state.wait_archived(job_id).attempt_count == 1
        assert jobs.EXECUTIONS[job_id] == [1]
    assert state.counters() == (6, 0, 0)


def test_shutdown_gives_jobs_leased_ahead_back_without_their_attempt(
    start_worker: Any, state: Any, fast: Any, gate: Any
) -> None:
    """Shutdown meets rows leased ahead and waiting for an executor: they go back to Pending at once with the
    attempt count they had before their lease (no handler ran), while the running job is cancelled by the
    shutdown and rescheduled."""
    worker, blocker, behind = _leasing_ahead(start_worker, state, gate, waiting=3)
    start_worker.stop(worker)
    for job_id in behind:
        row = state.hot(job_id)
        assert row is not None and (row.status, row.attempt_count, row.worker_id) == (JobStatus.PENDING, 0, None)
        assert not jobs.EXECUTIONS.get(job_id)
    row = state.hot(blocker)
    assert row is not None and row.status == JobStatus.PENDING and row.attempt_count == 1
    assert jobs.EXECUTIONS[blocker] == [1]


def test_heartbeat_failures_cancel_the_job_when_configured(
    start_worker: Any, state: Any, fast: Any, gate: Any, monkeypatch: Any
) -> None:
    fast(EXECUTION={"HEARTBEAT_FAILURE_THRESHOLD": 2, "CANCEL_ON_HEARTBEAT_FAILURE": True})
    gate("beating")
    job_id = enqueue("test.watch.v1", {"name": "beating"})

    def broken_keep_alive(job_ids: Any, worker_id: str) -> list[str]:
        raise ConnectionError("database unreachable for heartbeats")

    monkeypatch.setattr(storage, "keep_alive", broken_keep_alive)
    start_worker()

    dead = state.wait_dead(job_id)
    assert dead.failure_reason == FailureReason.HEARTBEAT_FAILURE
    assert dead.attempt_count == 1
    assert jobs.CANCELS[job_id][0] == CancellationReason.HEARTBEAT_FAILURE


def _ghost_processing(queue: str, worker_id: str = "ghost-worker") -> str:
    """A Processing row owned by a worker that no longer exists (fetch + lease gate, no heartbeat)."""
    job_id = enqueue("test.ok.v1", {}, queue=queue)
    [row] = storage.fetch_batch(worker_id, 5, [queue])
    assert row.id == job_id
    assert storage.mark_processing(row, worker_id) == 1
    return job_id


def _backdate(job_id: str, seconds: float, *fields: str) -> None:
    then = timezone.now() - timedelta(seconds=seconds)
    assert JobsHot.objects.filter(id=job_id).update(**{f: then for f in fields}) == 1


def test_zombie_rescue_moves_expired_processing_rows_to_dlq(start_worker: Any, state: Any, fast: Any) -> None:
    fast(RECOVERY={"PROCESSING_ZOMBIE_TIMEOUT": 60, "SCAN_INTERVAL": 0.2})
    # Found by the sweep at start-up: heartbeat an hour old.
    at_start = _ghost_processing("ghosts")
    _backdate(at_start, 3600, "heartbeat_at", "last_updated_at")
    # A fresh heartbeat: must survive every sweep.
    fresh = _ghost_processing("ghosts")
    # Per-queue ZombieTimeoutSeconds (5 s) overrides the global 60 s; the default queue keeps 60 s.
    storage.set_queue_zombie_timeout("strict", 5)
    strict = _ghost_processing("strict")
    _backdate(strict, 20, "heartbeat_at", "last_updated_at")
    lenient = _ghost_processing("default")
    _backdate(lenient, 20, "heartbeat_at", "last_updated_at")

    start_worker(queues=["elsewhere"])  # it sweeps every queue but fetches none of these
    for job_id in (at_start, strict):
        dead = state.wait_dead(job_id)
        assert dead.failure_reason == FailureReason.ZOMBIE
        assert "heartbeat expired" in dead.error_details
        assert dead.attempt_count == 1 and dead.worker_id == "ghost-worker"

    # Found by the periodic sweep: a row that expires while the worker runs.
    later = _ghost_processing("ghosts")
    _backdate(later, 3600, "heartbeat_at", "last_updated_at")
    assert state.wait_dead(later).failure_reason == FailureReason.ZOMBIE

    time.sleep(0.5)  # a few more sweeps
    for job_id in (fresh, lenient):
        assert state.hot(job_id).status == JobStatus.PROCESSING
    assert state.counters("ghosts")[1] == 2 and state.counters("strict")[1] == 1
    assert not any(jobs.EXECUTIONS.get(j) for j in (at_start, strict, later))  # zombies are never re-run


def test_abandoned_fetches_return_to_pending_and_are_processed(start_worker: Any, state: Any, fast: Any) -> None:
    fast(RECOVERY={"FETCHED_JOB_TIMEOUT": 5, "SCAN_INTERVAL": 0.2})
    stale = enqueue("test.ok.v1", {})
    recent = enqueue("test.ok.v1", {})
    fetched = storage.fetch_batch("ghost-worker", 10)
    assert {j.id for j in fetched} == {stale, recent}
    _backdate(stale, 3600, "last_updated_at")

    worker = start_worker()
    archived = state.wait_archived(stale)
    assert (archived.attempt_count, archived.worker_id) == (1, worker.worker_id)
    assert jobs.EXECUTIONS[stale] == [1]

    time.sleep(0.5)
    row = state.hot(recent)
    assert (row.status, row.worker_id) == (JobStatus.FETCHED, "ghost-worker")  # not yet abandoned

    _backdate(recent, 3600, "last_updated_at")  # now it is: the periodic sweep recovers it
    assert state.wait_archived(recent).attempt_count == 1
    assert jobs.EXECUTIONS[recent] == [1]
    assert state.counters() == (2, 0, 0)


# ---------------------------------------------------------------- operator commands


def test_cancel_of_a_pending_job_moves_it_to_dlq(start_worker: Any, state: Any) -> None:
    start_worker()
    job_id = enqueue("test.ok.v1", {}, delay=0.5)
    moved, flagged = service.cancel_many([job_id], actor="alice")
    assert (moved, flagged) == ([job_id], [])

    dead = state.dead(job_id)
    assert dead.failure_reason == FailureReason.CANCELLED
    assert "alice" in dead.error_details and dead.last_modified_by == "alice"
    assert dead.attempt_count == 0
    time.sleep(1.0)  # past the delay: the worker must not find it
    assert state.pillar(job_id) == "dlq"
    assert job_id not in jobs.EXECUTIONS
    assert state.counters() == (0, 1, 0)


def test_cancel_of_a_buffered_job_fails_its_lease_gate(start_worker: Any, state: Any, gate: Any) -> None:
    release = gate("hold")
    blocker = enqueue("test.gate.v1", {"name": "hold"}, priority=100)
    buffered = enqueue("test.ok.v1", {})
    start_worker(concurrency=1)
    state.wait_status(blocker, JobStatus.PROCESSING)
    state.wait_status(buffered, JobStatus.FETCHED)

    moved, _ = service.cancel_many([buffered], actor="carol")
    assert moved == [buffered]
    release.set()
    state.wait_archived(blocker)
    time.sleep(0.3)

    dead = state.dead(buffered)
    assert (dead.failure_reason, dead.attempt_count) == (FailureReason.CANCELLED, 0)
    assert buffered not in jobs.EXECUTIONS


def test_cooperative_cancel_of_a_running_job(start_worker: Any, state: Any, gate: Any) -> None:
    gate("watched")
    job_id = enqueue("test.watch.v1", {"name": "watched"})
    start_worker()
    state.wait_status(job_id, JobStatus.PROCESSING)

    moved, flagged = service.cancel_many([job_id], actor="bob")
    assert (moved, flagged) == ([], [job_id])

    dead = state.wait_dead(job_id)
    assert dead.failure_reason == FailureReason.CANCELLED
    assert "bob" in dead.error_details
    assert dead.attempt_count == 1
    assert jobs.CANCELS[job_id] == (CancellationReason.ADMIN, "bob")
    assert jobs.EXECUTIONS[job_id] == [1]
    assert state.counters() == (0, 1, 0)


def test_admin_cancel_wins_over_an_earlier_timeout(start_worker: Any, state: Any, fast: Any) -> None:
    # Spec 02 §8: "If several reasons arrive, Admin wins over Timeout".
    fast(EXECUTION={"DEFAULT_TIMEOUT": 0.2})
    job_id = enqueue("test.late.v1", {"seconds": 1.2})
    start_worker()
    state.wait_status(job_id, JobStatus.PROCESSING)
    time.sleep(0.5)  # the timeout has fired; the handler has not noticed yet
    assert service.cancel_many([job_id], actor="dave") == ([], [job_id])

    dead = state.wait_dead(job_id)
    assert jobs.CANCELS[job_id] == (CancellationReason.ADMIN, "dave")
    assert dead.failure_reason == FailureReason.CANCELLED
    assert "dave" in dead.error_details


def test_resurrected_job_is_processed_again_from_attempt_one(start_worker: Any, state: Any, fast: Any) -> None:
    fast(RETRY={"MAX_ATTEMPTS": 2})
    job_id = enqueue("test.fail.v1", {"succeed_on": 5}, created_by="app")
    start_worker()
    dead = state.wait_dead(job_id)
    assert (dead.failure_reason, dead.attempt_count) == (FailureReason.TRANSIENT, 2)
    assert jobs.EXECUTIONS[job_id] == [1, 2]

    # The operator fixes the payload while resurrecting.
    service.resurrect(job_id, actor="ops", payload='{"succeed_on": 1}')
    archived = state.wait_archived(job_id)
    assert archived.attempt_count == 1
    assert archived.created_by == "app" and archived.last_modified_by == "ops"
    assert jobs.EXECUTIONS[job_id] == [1, 2, 1]
    assert state.dead(job_id) is None
    assert state.counters() == (1, 0, 1)  # FailedTotal went back down on resurrection


def test_paused_queue_is_not_fetched_until_resumed(start_worker: Any, state: Any) -> None:
    service.set_queue_paused("held", True)
    job_id = enqueue("test.ok.v1", {}, queue="held")
    assert Queues.objects.get(name="held").is_paused
    start_worker()
    time.sleep(0.5)
    assert state.hot(job_id).status == JobStatus.PENDING
    assert job_id not in jobs.EXECUTIONS

    service.set_queue_paused("held", False)
    assert state.wait_archived(job_id).attempt_count == 1
    assert jobs.EXECUTIONS[job_id] == [1]


def test_buffered_rows_of_a_queue_paused_after_fetch_are_released(
    start_worker: Any, state: Any, gate: Any
) -> None:
    release = gate("front")
    blocker = enqueue("test.gate.v1", {"name": "front"}, priority=100)
    # With one slot, the dispatcher holds ``waiting`` while it waits for the slot; ``buffered`` stays in the buffer.
    waiting = enqueue("test.ok.v1", {}, queue="later", priority=50)
    buffered = enqueue("test.ok.v1", {}, queue="later")
    worker = start_worker(concurrency=1)
    state.wait_status(blocker, JobStatus.PROCESSING)
    for job_id in (waiting, buffered):
        state.wait_status(job_id, JobStatus.FETCHED, worker_id=worker.worker_id)

    service.set_queue_paused("later", True)
    time.sleep(0.3)  # past the dispatcher's 250 ms pause cache
    release.set()
    state.wait_archived(blocker)
    # Spec 03 §4 checks the pause before waiting for a slot: ``waiting`` may run or be released,
    # ``buffered`` must go back to Pending unstarted.
    row = state.wait_status(buffered, JobStatus.PENDING)
    assert (row.attempt_count, row.worker_id) == (0, None)
    time.sleep(0.3)
    assert state.hot(buffered).status == JobStatus.PENDING and buffered not in jobs.EXECUTIONS
    assert state.pillar(waiting) in ("hot", "archive")

    service.set_queue_paused("later", False)
    for job_id in (waiting, buffered):
        assert state.wait_archived(job_id).attempt_count == 1
        assert jobs.EXECUTIONS[job_id] == [1]
