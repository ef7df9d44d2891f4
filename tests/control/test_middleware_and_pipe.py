"""The middleware onion, the idempotency middleware and Pipe mode in a real worker (spec 03 §10–§11, §14).

In-process workers on the test database; every outcome is read back from Hot,
Archive and the DLQ.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from chokaq_core import FailureReason, JobStatus, enqueue
from chokaq_core.models import JobsArchive, JobsDLQ, JobsHot
from tests.control import jobs as ctl

pytestmark = pytest.mark.django_db(transaction=True)

IDEMPOTENCY = "chokaq_core.middleware.IdempotencyMiddleware"


class OrderHandler(logging.Handler):
    """Puts the LoggingMiddleware's line into the same ORDER list as the custom middleware."""

    def emit(self, record: logging.LogRecord) -> None:
        if "done in" in record.getMessage():
            with ctl._lock:
                ctl.ORDER.append("log")


@pytest.fixture
def middleware_log() -> Iterator[None]:
    logger = logging.getLogger("chokaq.middleware")
    handler, level = OrderHandler(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_idempotency_middleware_runs_the_handler_once_per_key(start_worker: Any, state: Any, fast: Any) -> None:
    fast(MIDDLEWARE=[IDEMPOTENCY])
    start_worker(concurrency=1)
    first = enqueue("ctl.order.v1", {"order_id": "A-1"})
    second = enqueue("ctl.order.v1", {"order_id": "A-1"})
    other = enqueue("ctl.order.v1", {"order_id": "B-2"})

    for job_id in (first, second, other):
        assert state.wait_archived(job_id).attempt_count == 1
    assert ctl.calls_of([first, second]) == 1, "the same order was charged twice"
    assert ctl.calls_of([other]) == 1
    assert not JobsDLQ.objects.exists() and not JobsHot.objects.exists()
    assert state.counters()[:2] == (3, 0)


def test_idempotency_claim_is_released_when_the_handler_fails(start_worker: Any, state: Any, fast: Any) -> None:
    fast(MIDDLEWARE=[IDEMPOTENCY])
    start_worker(concurrency=1)
    job_id = enqueue("ctl.order.v1", {"order_id": "C-3", "fail_first": True})
    assert state.wait_archived(job_id).attempt_count == 2
    assert ctl.CALLS[job_id] == [1, 2], "the retry must run the handler again: the failed claim was released"
    duplicate = enqueue("ctl.order.v1", {"order_id": "C-3"})
    state.wait_archived(duplicate)
    assert ctl.calls_of([duplicate]) == 0, "a completed key must skip the handler"


def test_a_duplicate_of_a_running_key_is_skipped_and_archived(start_worker: Any, state: Any, fast: Any) -> None:
    fast(MIDDLEWARE=[IDEMPOTENCY])
    start_worker(concurrency=2)
    ctl.HOLD.clear()
    first = enqueue("ctl.order.v1", {"order_id": "E-5", "hold": True})
    state.wait_status(first, JobStatus.PROCESSING)
    state.wait(lambda: ctl.calls_of([first]) == 1, "the first execution inside its handler")
    duplicate = enqueue("ctl.order.v1", {"order_id": "E-5"})
    # AlreadyInProgress: the duplicate is archived as a success without running, while the first still runs.
    state.wait_archived(duplicate)
    assert ctl.calls_of([duplicate]) == 0
    assert state.hot(first) is not None and state.hot(first).status == JobStatus.PROCESSING
    ctl.HOLD.set()
    state.wait_archived(first)
    assert ctl.calls_of([first, duplicate]) == 1


def test_without_the_middleware_every_job_runs(start_worker: Any, state: Any, fast: Any) -> None:
    start_worker(concurrency=1)
    ids = [enqueue("ctl.order.v1", {"order_id": "D-4"}) for _ in range(2)]
    for job_id in ids:
        state.wait_archived(job_id)
    assert ctl.calls_of(ids) == 2


def test_onion_order_with_the_logging_middleware(start_worker: Any, state: Any, fast: Any,
                                                 middleware_log: None) -> None:
    fast(MIDDLEWARE=["tests.control.jobs.OuterMiddleware", "chokaq_core.middleware.LoggingMiddleware",
                     "tests.control.jobs.InnerMiddleware"])
    start_worker(concurrency=1)
    job_id = enqueue("ctl.ok.v1", {"n": 1})
    archived = state.wait_archived(job_id)
    assert ctl.ORDER == ["outer>", "inner>", "handler", "<inner", "log", "<outer"]
    assert json.loads(archived.result or "null") == "done"


def test_short_circuit_and_failing_middleware(start_worker: Any, state: Any, fast: Any) -> None:
    fast(MIDDLEWARE=["tests.control.jobs.GuardMiddleware"], RETRY={"MAX_ATTEMPTS": 3})
    start_worker(concurrency=2)
    skipped = enqueue("ctl.ok.v1", {"skip": True})
    refused = enqueue("ctl.ok.v1", {"explode": True})
    normal = enqueue("ctl.ok.v1", {"n": 2})

    archived = state.wait_archived(skipped)
    assert ctl.calls_of([skipped]) == 0, "a short-circuited job must not reach the handler"
    assert archived.attempt_count == 1
    assert json.loads(archived.result or "null") == "short-circuited"
    dead = state.wait_dead(refused)  # a middleware's exception follows the normal policy: ValueError is fatal
    assert dead.failure_reason == FailureReason.FATAL_ERROR and "refused by middleware" in (dead.error_details or "")
    assert ctl.calls_of([refused]) == 0
    state.wait_archived(normal)
    assert ctl.calls_of([normal]) == 1


def test_pipe_mode_hands_every_raw_payload_to_one_function(start_worker: Any, state: Any, fast: Any) -> None:
    fast(MODE="pipe", PIPE_HANDLER="tests.control.jobs.pipe_handler",
         MIDDLEWARE=["tests.control.jobs.RecordingMiddleware"], RETRY={"MAX_ATTEMPTS": 2})
    start_worker(concurrency=2)
    good = enqueue("billing.invoice.v3", {"invoice": 42, "lines": [1, 2]}, allow_unregistered=True)
    flaky = enqueue("billing.sync.v1", {"mode": "transient"}, allow_unregistered=True)
    broken = enqueue("billing.sync.v1", {"mode": "fatal"}, allow_unregistered=True)

    archived = state.wait_archived(good)
    (job_type, text, seen_id), = [p for p in ctl.PIPED if p[2] == good]
    assert (job_type, seen_id) == ("billing.invoice.v3", good)
    assert isinstance(text, str) and json.loads(text) == {"invoice": 42, "lines": [1, 2]}
    assert json.loads(archived.result or "null") == {"type": "billing.invoice.v3", "length": len(text)}
    assert ("billing.invoice.v3", text) in ctl.SEEN_BY_MIDDLEWARE, "middleware must see the raw payload text"

    dead = state.wait_dead(flaky)  # transient: retried up to MAX_ATTEMPTS, then the DLQ
    assert dead.failure_reason == FailureReason.TRANSIENT and dead.attempt_count == 2
    assert ctl.CALLS[flaky] == [1, 2]
    dead = state.wait_dead(broken)  # fatal: straight to the DLQ
    assert dead.failure_reason == FailureReason.FATAL_ERROR and dead.attempt_count == 1
    assert ctl.CALLS[broken] == [1]
    assert JobsArchive.objects.count() == 1 and not JobsHot.objects.exists()
    assert state.counters()[:3] == (1, 2, 1)
