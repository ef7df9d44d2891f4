"""Circuit breaker per job type in a real worker (spec 03 §7.3–§7.5), asserted on the database.

The worker's breakers run on a controllable clock (frozen unless the test moves
it), so an Open circuit stays Open for as long as the test looks at it and the
break duration passes exactly when the test says so. Every state is read from
what the worker itself wrote: the ``Workers.CircuitsJson`` snapshot of its
registry row, the Hot rows it rescheduled and the retry counter.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chokaq_core import FailureReason, JobStatus, enqueue
from chokaq_core.models import JobsArchive, JobsDLQ, JobsHot
from chokaq_core.worker import Worker
from tests.control import jobs as ctl

pytestmark = pytest.mark.django_db(transaction=True)

FLAKY = "ctl.flaky.v1"


class Clock:
    """The breakers' monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def circuits(state: Any, worker: Worker) -> dict[str, dict[str, Any]]:
    """The breaker snapshot of the worker's registry row, by circuit key."""
    row = state.registry(worker.worker_id)
    return {c["circuitKey"]: c for c in json.loads(row.circuits_json)} if row else {}


def wait_circuit(state: Any, worker: Worker, key: str, status: int, failures: int | None = None,
                 timeout: float = 10.0) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        entry = circuits(state, worker).get(key)
        if entry and entry["status"] == status and (failures is None or entry["failureCount"] == failures):
            return entry
        return None

    return state.wait(check, f"circuit {key} status {status} failures {failures} in the registry", timeout)


def deferred(state: Any, job_id: str, attempts: int) -> bool:
    """Pending again with a schedule (rescheduled), still at ``attempts`` executions."""
    job = state.hot(job_id)
    return bool(job and job.status == JobStatus.PENDING and job.scheduled_at is not None
                and job.attempt_count == attempts)


def retried(state: Any) -> int:
    return int(state.counters()[2])


def start_with_clock(start_worker: Any, **options: Any) -> tuple[Worker, Clock]:
    clock = Clock()
    worker = start_worker(**options)
    worker.breakers.clock = clock  # before the first job: each breaker takes the clock when created
    return worker, clock


def test_failing_type_opens_defers_probes_and_closes(start_worker: Any, state: Any, fast: Any) -> None:
    fast(CIRCUIT_BREAKER={"DEFAULT": {"FAILURE_THRESHOLD": 2, "BREAK_DURATION_SECONDS": 1}},
         RETRY={"MAX_ATTEMPTS": 10, "BASE_DELAY": 0.05, "CIRCUIT_BREAKER_DELAY": 0.1})
    worker, clock = start_with_clock(start_worker, concurrency=4)
    ctl.FLAKY["fail"] = True

    # Closed → Open: two transient failures in a row.
    first = [enqueue(FLAKY, {"n": n}) for n in range(2)]
    entry = wait_circuit(state, worker, FLAKY, status=1, failures=2)
    # The break ends BREAK_DURATION after the last failure, in wall-clock UTC the Deck can show.
    reset_at = datetime.fromisoformat(entry["resetAtUtc"])
    assert reset_at.utcoffset() == timedelta(0)
    assert abs((reset_at - datetime.now(UTC)).total_seconds() - 1) < 5
    assert ctl.calls_of(first) == 2

    # Open: further jobs of the type are deferred without running and without consuming an attempt.
    later = [enqueue(FLAKY, {"n": n}) for n in range(2, 5)]
    for job_id in later:
        state.wait(lambda j=job_id: deferred(state, j, attempts=0), f"{job_id} deferred with 0 attempts")
    for job_id in first:  # their retries come back to an open circuit: deferred too, still 1 attempt
        state.wait(lambda j=job_id: deferred(state, j, attempts=1), f"{job_id} deferred with 1 attempt")
    before = retried(state)
    state.wait(lambda: retried(state) >= before + 5, "more deferrals (each one counts as a retry)")
    assert ctl.calls_of(first + later) == 2, "a job of an open circuit reached the handler"
    assert JobsDLQ.objects.count() == 0

    # Another type is unaffected meanwhile.
    other = enqueue("ctl.ok.v1", {"n": 1})
    done = state.wait_archived(other)
    assert done.attempt_count == 1
    assert circuits(state, worker)[FLAKY]["status"] == 1
    state.wait(lambda: circuits(state, worker).get("ctl.ok.v1", {}).get("status") == 0, "ctl.ok.v1 closed")

    # Break over, downstream still down: one probe (HalfOpen) fails → Open again.
    clock.advance(1.01)
    wait_circuit(state, worker, FLAKY, status=1, failures=3)
    assert ctl.calls_of(first + later) == 3
    before = retried(state)
    state.wait(lambda: retried(state) >= before + 5, "deferrals after the failed probe")
    assert ctl.calls_of(first + later) == 3, "more than one probe, or a run while Open"

    # Break over, downstream back: the probe is held so the registry can show HalfOpen.
    ctl.FLAKY["fail"] = False
    ctl.HOLD.clear()
    clock.advance(1.01)
    wait_circuit(state, worker, FLAKY, status=2)
    before = retried(state)
    state.wait(lambda: retried(state) >= before + 3, "deferrals while the probe runs")
    assert ctl.calls_of(first + later) == 4, "HALF_OPEN_MAX_CALLS is 1: only one probe may run"
    ctl.HOLD.set()

    # The probe succeeds → Closed; every deferred job completes.
    assert wait_circuit(state, worker, FLAKY, status=0, failures=0)["resetAtUtc"] is None
    for job_id in first + later:
        state.wait_archived(job_id)
    attempts = dict(JobsArchive.objects.filter(id__in=first + later).values_list("id", "attempt_count"))
    # Each job ran once successfully; a job that failed earlier carries those attempts, none more.
    for job_id in first + later:
        assert attempts[job_id] == len(ctl.CALLS[job_id]), (job_id, attempts[job_id], ctl.CALLS[job_id])
    assert JobsDLQ.objects.count() == 0 and JobsHot.objects.count() == 0
    assert state.counters()[0:2] == (6, 0)


def test_circuit_fatal_error_opens_the_circuit_at_once(start_worker: Any, state: Any, fast: Any) -> None:
    fast(CIRCUIT_BREAKER={"DEFAULT": {"FAILURE_THRESHOLD": 5, "BREAK_DURATION_SECONDS": 1}},
         RETRY={"MAX_ATTEMPTS": 5, "BASE_DELAY": 0.05, "CIRCUIT_BREAKER_DELAY": 0.1})
    worker, clock = start_with_clock(start_worker, concurrency=2)
    ctl.FLAKY["fail"] = True

    first = enqueue("ctl.circuit_fatal.v1", {"n": 1})
    wait_circuit(state, worker, "ctl.circuit_fatal.v1", status=1, failures=1)
    # The job itself is not dead: a circuit-fatal error opens the circuit, it is still retried (deferred).
    state.wait(lambda: deferred(state, first, attempts=1), "the failed job deferred")
    second = enqueue("ctl.circuit_fatal.v1", {"n": 2})
    state.wait(lambda: deferred(state, second, attempts=0), "a new job of the type deferred")
    assert ctl.calls_of([first, second]) == 1
    assert not JobsDLQ.objects.exists()

    # Other types still run.
    assert state.wait_archived(enqueue("ctl.ok.v1", {"n": 3})).attempt_count == 1

    ctl.FLAKY["fail"] = False
    clock.advance(1.01)
    wait_circuit(state, worker, "ctl.circuit_fatal.v1", status=0, failures=0)
    assert state.wait_archived(first).attempt_count == 2
    assert state.wait_archived(second).attempt_count == 1


def test_circuit_open_does_not_mask_a_fatal_outcome(start_worker: Any, state: Any, fast: Any) -> None:
    """Deferral never turns into DLQ: a job that really fails fatally still lands there as Fatal."""
    fast(CIRCUIT_BREAKER={"DEFAULT": {"FAILURE_THRESHOLD": 1, "BREAK_DURATION_SECONDS": 1}},
         RETRY={"MAX_ATTEMPTS": 3, "BASE_DELAY": 0.05, "CIRCUIT_BREAKER_DELAY": 0.1})
    worker, _clock = start_with_clock(start_worker, concurrency=1)
    job_id = enqueue("test.fatal.v1", {})
    dead = state.wait_dead(job_id)
    assert dead.failure_reason == FailureReason.FATAL_ERROR and dead.attempt_count == 1
    wait_circuit(state, worker, "test.fatal.v1", status=1, failures=1)
