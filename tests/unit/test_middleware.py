"""Middleware onion, idempotency claim store and soft dedup (spec 03 §10–§11) without a database."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from chokaq_core.domain import ChokaQFatalError
from chokaq_core.handlers import CancellationToken, JobContext, JobDefinition
from chokaq_core.middleware import (
    ClaimStatus,
    IdempotencyMiddleware,
    InMemoryDeduplicator,
    InMemoryIdempotencyStore,
    JobCall,
    reset_idempotency_store,
    run_pipeline,
)

TRACE: list[str] = []


def ctx(job_id: str = "j1") -> JobContext:
    return JobContext(job_id, "t.v1", "q", 1, None, datetime.now(UTC), CancellationToken())


class Outer:
    def __call__(self, ctx: JobContext, job: JobCall, call_next: Callable[[], Any]) -> Any:
        TRACE.append("outer-in")
        result = call_next()
        TRACE.append("outer-out")
        return result


class Inner:
    def __call__(self, ctx: JobContext, job: JobCall, call_next: Callable[[], Any]) -> Any:
        TRACE.append("inner-in")
        result = call_next()
        TRACE.append("inner-out")
        return result


class ShortCircuit:
    def __call__(self, ctx: JobContext, job: JobCall, call_next: Callable[[], Any]) -> Any:
        TRACE.append("short")
        return "skipped"


def handler() -> str:
    TRACE.append("handler")
    return "done"


def test_onion_order_first_is_outermost() -> None:
    TRACE.clear()
    assert run_pipeline([Outer, Inner], ctx(), JobCall("t.v1", {}), handler) == "done"
    assert TRACE == ["outer-in", "inner-in", "handler", "inner-out", "outer-out"]


def test_not_calling_next_short_circuits() -> None:
    TRACE.clear()
    assert run_pipeline([Outer, ShortCircuit, Inner], ctx(), JobCall("t.v1", {}), handler) == "skipped"
    assert TRACE == ["outer-in", "short", "outer-out"]


def test_in_memory_store_contract() -> None:
    store = InMemoryIdempotencyStore()
    assert store.try_begin("k", "j1", 60) == (ClaimStatus.CLAIMED, None)
    assert store.try_begin("k", "j2", 60)[0] == ClaimStatus.ALREADY_IN_PROGRESS
    assert not store.complete("k", "j2", "m", None)  # not the owner
    assert store.complete("k", "j1", "marker", None)
    assert store.try_begin("k", "j3", 60) == (ClaimStatus.ALREADY_COMPLETED, "marker")
    assert store.try_begin("other", "j4", 0.0)[0] == ClaimStatus.CLAIMED
    assert store.try_begin("other", "j5", 60)[0] == ClaimStatus.CLAIMED  # the first claim expired at once
    assert store.release("other", "j5") and not store.release("other", "j5")


@pytest.fixture
def memory_store(settings: Any) -> Any:
    reset_idempotency_store()
    yield
    reset_idempotency_store()


def test_idempotency_middleware_runs_once_per_key(memory_store: None) -> None:
    calls: list[str] = []
    job = JobCall("t.v1", {"order": 7}, idempotency_key="order:7")
    middleware = IdempotencyMiddleware()
    middleware(ctx("a"), job, lambda: calls.append("a"))
    middleware(ctx("b"), job, lambda: calls.append("b"))  # completed duplicate: skipped
    assert calls == ["a"]


def test_idempotency_middleware_releases_the_claim_on_failure(memory_store: None) -> None:
    job = JobCall("t.v1", {}, idempotency_key="k-fail")
    middleware = IdempotencyMiddleware()

    def boom() -> None:
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        middleware(ctx("a"), job, boom)
    ran: list[str] = []
    middleware(ctx("a"), job, lambda: ran.append("retry"))
    assert ran == ["retry"]


def test_result_ttl_outside_bounds_is_fatal(memory_store: None, settings: Any) -> None:
    settings.CHOKAQ = {**settings.CHOKAQ, "IDEMPOTENCY": {"MIN_RESULT_TTL": 10, "MAX_RESULT_TTL": 100}}
    job = JobCall("t.v1", {}, idempotency_key="k-ttl", result_ttl=5)
    with pytest.raises(ChokaQFatalError, match="outside the configured bounds"):
        IdempotencyMiddleware()(ctx(), job, lambda: None)


def test_jobs_without_a_key_run_unguarded(memory_store: None) -> None:
    ran: list[int] = []
    for _ in range(2):
        IdempotencyMiddleware()(ctx(), JobCall("t.v1", {}), lambda: ran.append(1))
    assert ran == [1, 1]


def test_definition_builds_execution_keys() -> None:
    by_format = JobDefinition("t.v1", handler, idempotency_key="order:{order_id}")
    by_callable = JobDefinition("t.v1", handler, idempotency_key=lambda p: f"x-{p['n']}")
    assert by_format.execution_key({"order_id": 5}) == "order:5"
    assert by_callable.execution_key({"n": 3}) == "x-3"
    assert JobDefinition("t.v1", handler).execution_key({}) is None


def test_deduplicator_suppresses_within_ttl() -> None:
    now = [0.0]
    dedup = InMemoryDeduplicator(clock=lambda: now[0])
    assert dedup.try_acquire("cmd", 2) and not dedup.try_acquire("cmd", 2)
    now[0] = 2.5
    assert dedup.try_acquire("cmd", 2)
    assert dedup.try_acquire("", 2) and dedup.try_acquire("", 2)
