"""Deck → worker control over a real Redis channel layer (spec 03 §4, §12): resize a running worker
process, change its retry policy and cancel one of its running jobs, without a restart; and the
remembered cancel of a job that is not running yet (spec 02 §8, in-process).

This process's channel layer points at Redis; the worker is a ``manage.py
chokaq_worker`` subprocess started with ``REDIS_URL``. Every effect is read from
the database: the worker's registry row and its Processing rows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from chokaq_core import FailureReason, JobStatus, enqueue, enqueue_many, events, service
from chokaq_core.api import EnqueueOptions
from chokaq_core.models import JobsDLQ, JobsHot, Workers
from tests.control import jobs as ctl
from tests.control.conftest import WorkerProcess, WorkerProcesses

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

QUEUE = "ctl-live"


def processing(worker: WorkerProcess) -> list[str]:
    return list(JobsHot.objects.filter(queue=QUEUE, worker_id=worker.worker_id, status=JobStatus.PROCESSING)
                .values_list("id", flat=True))


def registry(worker: WorkerProcess) -> Workers | None:
    return Workers.objects.filter(worker_id=worker.worker_id).first()


def until(predicate: Callable[[], Any], what: str, procs: WorkerProcesses, timeout: float = 10.0,
          every: Callable[[], None] | None = None) -> Any:
    """Poll ``predicate``; ``every`` (e.g. re-sending a best-effort message) runs once a second."""
    deadline = time.monotonic() + timeout
    next_every = time.monotonic()
    while True:
        if every is not None and time.monotonic() >= next_every:
            every()
            next_every = time.monotonic() + 1.0
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what} (last {value!r})\n" + procs.outputs())
        time.sleep(0.05)


def test_capacity_retry_policy_and_cancel_reach_a_running_worker_over_redis(
    redis_layer: str, worker_procs: WorkerProcesses,
) -> None:
    worker = worker_procs.start("--queues", QUEUE, "--concurrency", "1", REDIS_URL=redis_layer)
    enqueue_many([EnqueueOptions("test.sleep.v1", {"seconds": 60}, queue=QUEUE) for _ in range(6)])

    until(lambda: len(processing(worker)) == 1, "one job running at concurrency 1", worker_procs)
    row = registry(worker)
    assert row is not None and row.capacity == 1

    # Resize: the command is best effort (the worker may still be joining the group), so it is repeated
    # until the registry shows it — the same thing the Deck's panel reads.
    def resize() -> None:
        assert service.set_worker_capacity(4, worker_id=worker.worker_id) is True

    until(lambda: (r := registry(worker)) is not None and r.capacity == 4, "capacity 4 in the registry",
          worker_procs, every=resize)
    running = until(lambda: (ids := processing(worker)) and len(ids) == 4 and ids, "4 jobs running at once",
                    worker_procs)
    until(lambda: (r := registry(worker)) is not None and r.active_count == 4, "active count 4 in the registry",
          worker_procs)
    assert len(processing(worker)) == 4, "capacity 4 must cap the worker at 4 running jobs"

    # Runtime retry-policy override, reported in the registry's runtime JSON.
    events.send_control({"type": "worker.set_retry_policy", "max_attempts": 7, "base_delay_seconds": 2.5,
                         "workerId": worker.worker_id})
    until(lambda: (r := registry(worker)) is not None and json.loads(r.runtime_json) == {
        "maxAttempts": 7, "baseDelaySeconds": 2.5}, "the retry override in the registry", worker_procs)

    # Cancel one running job over the channel (not through the database flag): it lands in the DLQ at once.
    victim = running[0]
    assert events.send_control({"type": "worker.cancel_job", "jobId": victim, "actor": "ops@example",
                                "workerId": worker.worker_id})
    # The job sleeps 60 s: well before that, only the cancel can have put it in the DLQ.
    dead = until(lambda: JobsDLQ.objects.filter(id=victim).first(), "the cancelled job in the DLQ", worker_procs,
                 timeout=30)
    assert dead.failure_reason == FailureReason.CANCELLED
    assert "ops@example" in (dead.error_details or "")
    assert dead.attempt_count == 1
    # Its slot goes to the next job; the other three keep running.
    until(lambda: len(processing(worker)) == 4 and victim not in processing(worker), "a 4th job started",
          worker_procs)
    assert set(running[1:]) <= set(processing(worker))
    assert JobsDLQ.objects.count() == 1

    # Shrink: running work is never cancelled; new starts wait until fewer than 2 run.
    until(lambda: (r := registry(worker)) is not None and r.capacity == 2, "capacity 2 in the registry",
          worker_procs, every=lambda: service.set_worker_capacity(2, worker_id=worker.worker_id))
    assert len(processing(worker)) == 4 and JobsDLQ.objects.count() == 1


def test_control_message_for_another_worker_is_ignored(redis_layer: str, worker_procs: WorkerProcesses) -> None:
    worker = worker_procs.start("--queues", QUEUE, "--concurrency", "1", REDIS_URL=redis_layer)
    other = worker_procs.start("--queues", QUEUE, "--concurrency", "1", REDIS_URL=redis_layer)

    # Both processes are listening once each has applied a message addressed to it.
    for n, proc in ((8, worker), (9, other)):
        until(lambda p=proc, n=n: (r := registry(p)) is not None and json.loads(r.runtime_json)["maxAttempts"] == n,
              f"retry override {n} applied by {proc.worker_id}", worker_procs,
              every=lambda p=proc, n=n: events.send_control(
                  {"type": "worker.set_retry_policy", "max_attempts": n, "workerId": p.worker_id}))

    until(lambda: (r := registry(worker)) is not None and r.capacity == 3, "capacity 3 for the target",
          worker_procs, every=lambda: service.set_worker_capacity(3, worker_id=worker.worker_id))
    # The other process received the same broadcast and ignored it (its next registry write says so).
    row = registry(other)
    assert row is not None
    seen = row.last_heartbeat_at
    until(lambda: (r := registry(other)) is not None and r.last_heartbeat_at > seen, "another registry write",
          worker_procs)
    row = registry(other)
    assert row is not None and row.capacity == 1 and json.loads(row.runtime_json)["maxAttempts"] == 9


def test_without_a_cross_process_layer_control_reports_that_it_cannot_reach_workers() -> None:
    assert service.set_worker_capacity(5) is False
    assert events.send_control({"type": "worker.cancel_job", "jobId": "x"}) is False
    with pytest.raises(ValueError, match="unknown control message type"):
        events.send_control({"type": "worker.reboot"})


@pytest.mark.parametrize(("retention", "cancelled"), [(30, True), (0.2, False)])
def test_cancel_for_a_job_not_running_yet_is_remembered_for_the_retention_window(
    start_worker: Any, state: Any, fast: Any, gate: Any, retention: float, cancelled: bool,
) -> None:
    """Spec 02 §8: a worker remembers ``worker.cancel_job`` for a job it is not (yet) running for
    PENDING_CANCELLATION_RETENTION and cancels it before dispatch if it starts within the window."""
    fast(EXECUTION={"PENDING_CANCELLATION_RETENTION": retention})
    worker = start_worker(concurrency=1)
    blocker = enqueue("test.gate.v1", {"name": "slot"})
    state.wait_status(blocker, JobStatus.PROCESSING)
    target = enqueue("ctl.ok.v1", {"n": 1})
    state.wait_status(target, JobStatus.FETCHED)  # in this worker's buffer, waiting for the only slot

    worker.on_control({"type": "worker.cancel_job", "job_id": target, "actor": "ops@example"})
    if not cancelled:
        time.sleep(retention + 0.1)  # let the remembered request expire
    gate("slot").set()
    state.wait_archived(blocker)
    if cancelled:
        dead = state.wait_dead(target)
        assert dead.failure_reason == FailureReason.CANCELLED and "ops@example" in (dead.error_details or "")
        assert ctl.calls_of([target]) == 0, "the handler ran although the job was cancelled before it started"
    else:
        assert state.wait_archived(target).attempt_count == 1
        assert ctl.calls_of([target]) == 1
