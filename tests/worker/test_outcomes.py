"""What the worker makes of each handler outcome (spec 02 §2.4, §3–§5, 03 §7.1, §13)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from chokaq_core import FailureReason, JobStatus, enqueue, events
from chokaq_core.models import JobsHot
from tests import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def test_success_is_archived_with_attempt_one_and_duration(start_worker: Any, state: Any) -> None:
    seen: list[events.Event] = []
    events.add_listener(seen.append)
    try:
        job_id = enqueue("test.ctx.v1", {"sleep": 0.15}, queue="mail", created_by="alice")
        worker = start_worker()
        archived = state.wait_archived(job_id)
    finally:
        events.remove_listener(seen.append)

    assert archived.attempt_count == 1
    assert archived.worker_id == worker.worker_id
    assert archived.queue == "mail" and archived.created_by == "alice"
    assert archived.duration_ms is not None and 150 <= archived.duration_ms < 5000
    assert archived.started_at is not None and archived.started_at <= archived.finished_at
    assert state.hot(job_id) is None and state.dead(job_id) is None
    assert state.counters("mail") == (1, 0, 0)
    assert jobs.EXECUTIONS[job_id] == [1]
    [ctx] = jobs.CONTEXTS[job_id]
    assert (ctx.job_id, ctx.job_type, ctx.queue, ctx.attempt, ctx.created_by) == (
        job_id, "test.ctx.v1", "mail", 1, "alice")
    assert not ctx.is_cancelled
    mine = [(e.kind, e.data.get("status")) for e in seen if e.data.get("jobId") == job_id]
    assert mine.index((events.EventKind.JOB_UPDATED, JobStatus.PROCESSING)) < mine.index(
        (events.EventKind.JOB_ARCHIVED, None))


def test_transient_failures_back_off_then_succeed(start_worker: Any, state: Any, fast: Any) -> None:
    # Documented backoff (spec 02 §4.1): BASE × MULTIPLIER^(a−1) → 0.4 s after attempt 1, 0.8 s after 2.
    fast(RETRY={"BASE_DELAY": 0.4, "BACKOFF_MULTIPLIER": 2.0, "JITTER_MAX_DELAY": 0, "MAX_ATTEMPTS": 3})
    job_id = enqueue("test.fail.v1", {"succeed_on": 3})
    start_worker()

    delays = []
    for attempt in (1, 2):
        pending = state.wait_status(job_id, JobStatus.PENDING, attempt_count=attempt)
        assert pending.worker_id is None and pending.scheduled_at is not None
        delays.append((pending.scheduled_at - pending.last_updated_at).total_seconds())
    assert delays[0] == pytest.approx(0.4, abs=0.01)
    assert delays[1] == pytest.approx(0.8, abs=0.01)

    archived = state.wait_archived(job_id)
    assert archived.attempt_count == 3
    assert jobs.EXECUTIONS[job_id] == [1, 2, 3]
    assert state.counters() == (1, 0, 2)


def test_exhausted_transient_failures_go_to_dlq_as_transient(start_worker: Any, state: Any) -> None:
    job_id = enqueue("test.fail.v1", {})
    start_worker()

    dead = state.wait_dead(job_id)
    assert dead.failure_reason == FailureReason.TRANSIENT
    assert dead.attempt_count == 3
    assert "ConnectionError: transient failure on attempt 3" in dead.error_details
    assert "Traceback" in dead.error_details
    assert jobs.EXECUTIONS[job_id] == [1, 2, 3]
    assert state.counters() == (0, 1, 2)


def test_max_attempts_one_means_no_retry(start_worker: Any, state: Any, fast: Any) -> None:
    fast(RETRY={"MAX_ATTEMPTS": 1})
    job_id = enqueue("test.fail.v1", {})
    start_worker()

    dead = state.wait_dead(job_id)
    assert (dead.failure_reason, dead.attempt_count) == (FailureReason.TRANSIENT, 1)
    assert jobs.EXECUTIONS[job_id] == [1]
    assert state.counters() == (0, 1, 0)


@pytest.mark.parametrize(("type_key", "message"), [
    ("test.fatal.v1", "FATAL: bad input, do not retry"),
    ("test.valueerror.v1", "FATAL: poison payload"),
])
def test_fatal_errors_go_to_dlq_on_the_first_attempt(
    start_worker: Any, state: Any, type_key: str, message: str
) -> None:
    job_id = enqueue(type_key, {})
    start_worker()

    dead = state.wait_dead(job_id)
    assert dead.failure_reason == FailureReason.FATAL_ERROR
    assert dead.attempt_count == 1
    assert dead.error_details.startswith(message + "\n")
    assert "Traceback" in dead.error_details
    assert jobs.EXECUTIONS[job_id] == [1]
    assert state.counters() == (0, 1, 0)


def test_throttled_retry_after_is_honoured_then_dlq_throttled(start_worker: Any, state: Any, fast: Any) -> None:
    fast(RETRY={"BASE_DELAY": 0.05, "MAX_ATTEMPTS": 2, "JITTER_MAX_DELAY": 0.5})
    job_id = enqueue("test.throttled.v1", {"retry_after": 0.6})
    start_worker()

    pending = state.wait_status(job_id, JobStatus.PENDING, attempt_count=1)
    # retry_after wins over the 0.05 s backoff, and gets no jitter.
    assert (pending.scheduled_at - pending.last_updated_at).total_seconds() == pytest.approx(0.6, abs=0.01)

    dead = state.wait_dead(job_id)
    assert dead.failure_reason == FailureReason.THROTTLED
    assert dead.attempt_count == 2
    assert "ChokaQThrottledError: slow down" in dead.error_details
    assert jobs.EXECUTIONS[job_id] == [1, 2]
    assert state.counters() == (0, 1, 1)


def test_throttled_without_retry_after_uses_backoff_and_exhausts(start_worker: Any, state: Any) -> None:
    job_id = enqueue("test.throttled.v1", {})
    start_worker()

    dead = state.wait_dead(job_id)
    assert (dead.failure_reason, dead.attempt_count) == (FailureReason.THROTTLED, 3)
    assert jobs.EXECUTIONS[job_id] == [1, 2, 3]


def test_retry_lifetime_budget_expires(start_worker: Any, state: Any, fast: Any) -> None:
    # The first retry would run 0.5 s after the failure, past CreatedAt + 0.2 s.
    fast(RETRY={"MAX_JOB_AGE": 0.2, "BASE_DELAY": 0.5})
    job_id = enqueue("test.fail.v1", {})
    start_worker()

    dead = state.wait_dead(job_id)
    assert dead.failure_reason == FailureReason.RETRY_LIFETIME_EXPIRED
    assert dead.attempt_count == 1
    assert "Retry lifetime expired" in dead.error_details
    assert "MAX_JOB_AGE 0.2s" in dead.error_details
    assert "ConnectionError: transient failure on attempt 1" in dead.error_details
    assert jobs.EXECUTIONS[job_id] == [1]
    assert state.counters() == (0, 1, 0)


def test_unknown_job_type_is_fatal_and_the_worker_keeps_going(start_worker: Any, state: Any) -> None:
    before = enqueue("test.ok.v1", {})
    unknown = enqueue("test.nobody.handles.v1", {"x": 1}, allow_unregistered=True)
    after = enqueue("test.ok.v1", {})
    start_worker()

    dead = state.wait_dead(unknown)
    assert dead.failure_reason == FailureReason.FATAL_ERROR
    assert dead.attempt_count == 1
    assert dead.error_details.startswith("FATAL:")
    assert "'test.nobody.handles.v1'" in dead.error_details
    assert state.wait_archived(before).attempt_count == 1
    assert state.wait_archived(after).attempt_count == 1
    assert jobs.EXECUTIONS[before] == [1] and jobs.EXECUTIONS[after] == [1]
    assert unknown not in jobs.EXECUTIONS


@pytest.mark.parametrize(("payload", "message"), [
    ('{"broken": ', "is not valid JSON"),
    ("[1, 2, 3]", "must be a JSON object"),
])
def test_malformed_payload_is_fatal(start_worker: Any, state: Any, payload: str, message: str) -> None:
    job_id = enqueue("test.ok.v1", {})
    assert JobsHot.objects.filter(id=job_id).update(payload=payload) == 1
    start_worker()

    dead = state.wait_dead(job_id)
    assert dead.failure_reason == FailureReason.FATAL_ERROR
    assert dead.attempt_count == 1
    assert dead.error_details.startswith("FATAL:")
    assert message in dead.error_details
    assert dead.payload == payload  # the bad payload is kept for the operator to fix
    assert job_id not in jobs.EXECUTIONS


@pytest.mark.parametrize("key", ["order:{order_id}", lambda payload: f"order:{payload['order_id']}"])
def test_an_idempotency_key_that_cannot_be_built_sends_the_job_to_the_dlq_at_once(start_worker: Any, state: Any,
                                                                                    key: Any) -> None:
    from chokaq_core.api import job

    @job("tests.outcomes.keyfails.v1", idempotency_key=key)
    def keyed(ctx: Any, **payload: Any) -> None: ...

    job_id = enqueue("tests.outcomes.keyfails.v1", {"other": 1})  # no order_id: the key function raises KeyError
    start_worker()

    dead = state.wait_dead(job_id)
    assert dead.failure_reason == FailureReason.FATAL_ERROR and dead.attempt_count == 1, "never retried"
    assert f"cannot build the idempotency key of job {job_id}: KeyError('order_id')" in dead.error_details
    assert json.loads(dead.payload) == {"other": 1}  # kept for the operator to fix


def test_unexpected_payload_keys_are_a_fatal_type_error(start_worker: Any, state: Any) -> None:
    job_id = enqueue("test.fail.v1", {"succeed_on": 1, "bogus": True})
    start_worker()

    dead = state.wait_dead(job_id)
    assert dead.failure_reason == FailureReason.FATAL_ERROR
    assert dead.attempt_count == 1
    assert "FATAL:" in dead.error_details and "TypeError" in dead.error_details
    assert "'bogus'" in dead.error_details
    assert job_id not in jobs.EXECUTIONS  # the handler was never entered


def test_async_handler_runs_to_success(start_worker: Any, state: Any) -> None:
    job_id = enqueue("test.async.v1", {"seconds": 0.1})
    start_worker()

    archived = state.wait_archived(job_id)
    assert archived.attempt_count == 1
    assert archived.duration_ms is not None and archived.duration_ms >= 100
    assert jobs.EXECUTIONS[job_id] == [1]


def test_progress_is_published_and_clamped(start_worker: Any, state: Any) -> None:
    seen: list[tuple[str, int, str | None]] = []
    lock = threading.Lock()

    def listener(event: events.Event) -> None:
        if event.kind == events.EventKind.JOB_PROGRESS:
            with lock:
                seen.append((event.data["jobId"], event.data["percentage"], event.data["message"]))

    events.add_listener(listener)
    try:
        simple = enqueue("test.progress.v1", {})
        steps = enqueue("test.progress_steps.v1", {"steps": [-20, 0, 33.7, 100, 250]})
        start_worker()
        state.wait_archived(simple)
        state.wait_archived(steps)
    finally:
        events.remove_listener(listener)

    assert [(p, m) for i, p, m in seen if i == simple] == [(50, "half"), (100, None)]
    assert [p for i, p, _ in seen if i == steps] == [0, 0, 33, 100, 100]
    assert all(0 <= p <= 100 for _, p, _ in seen)
    assert jobs.EXECUTIONS[simple] == [1] and jobs.EXECUTIONS[steps] == [1]
