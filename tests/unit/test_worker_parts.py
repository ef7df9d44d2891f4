"""The worker's in-process parts without a database: limiter, prefetch buffer, event coalescing, cancellation."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from chokaq_core import events
from chokaq_core.domain import CancellationReason, HotJob, JobCancelledError, JobStatus
from chokaq_core.handlers import CancellationToken, JobContext
from chokaq_core.worker import Limiter, PrefetchBuffer
from chokaq_core.worker.executor import ExecutorPool


def test_limiter_caps_and_resizes() -> None:
    limiter = Limiter(2, maximum=5)
    assert limiter.acquire(0) and limiter.acquire(0)
    assert not limiter.acquire(0.01)
    limiter.set_capacity(3)
    assert limiter.acquire(0)
    limiter.set_capacity(1)  # shrinking never cancels running work
    assert limiter.running == 3 and not limiter.acquire(0.01)
    for _ in range(3):
        limiter.release()
    assert limiter.acquire(0)
    limiter.set_capacity(0)
    assert limiter.capacity == 1
    limiter.set_capacity(99)
    assert limiter.capacity == 5


def test_limiter_release_without_acquire_is_loud() -> None:
    limiter = Limiter(1, maximum=1)
    with pytest.raises(RuntimeError):
        limiter.release()
    assert limiter.running == 0


def test_limiter_wakes_a_waiter_and_close_fails_acquire() -> None:
    limiter = Limiter(1, maximum=1)
    assert limiter.acquire(0)
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(limiter.acquire(2)))
    waiter.start()
    time.sleep(0.05)
    limiter.release()
    waiter.join(1)
    assert got == [True]
    limiter.close()
    assert not limiter.acquire(0.01)


def job(n: int) -> HotJob:
    now = datetime.now(UTC)
    return HotJob(f"j{n}", "q", "t", "{}", None, None, 10, JobStatus.FETCHED, 0, "w", None, None, now, None, now,
                  None, None)


def test_prefetch_buffer_is_bounded_fifo() -> None:
    buffer = PrefetchBuffer(3)
    buffer.put_many([job(1), job(2), job(3)])
    assert buffer.free() == 0 and not buffer.wait_for_space(0.01)
    first = buffer.get(0)
    assert first is not None and first.id == "j1"
    assert buffer.wait_for_space(0)
    assert [j.id for j in buffer.drain()] == ["j2", "j3"]
    assert buffer.get(0.01) is None


def test_cancellation_token_priorities() -> None:
    token = CancellationToken()
    token.cancel(CancellationReason.SHUTDOWN)
    token.cancel(CancellationReason.TIMEOUT)
    token.cancel(CancellationReason.ADMIN, "alice")
    token.cancel(CancellationReason.TIMEOUT)
    assert token.reason == CancellationReason.ADMIN and token.actor == "alice"
    with pytest.raises(JobCancelledError):
        token.raise_if_cancelled()
    assert token.wait(0)


def test_progress_is_clamped_and_needs_a_job_id() -> None:
    seen: list[tuple[str, int, str | None]] = []
    ctx = JobContext("j1", "t", "q", 1, None, datetime.now(UTC), CancellationToken(),
                     lambda *args: seen.append(args))
    ctx.progress(150)
    ctx.progress(-3, "x")
    ctx.report_progress(42.7)
    assert seen == [("j1", 100, None), ("j1", 0, "x"), ("j1", 42, None)]
    JobContext("", "t", "q", 1, None, datetime.now(UTC), CancellationToken(), lambda *a: seen.append(a)).progress(5)
    assert len(seen) == 3


def test_coalesce_keeps_last_update_per_job_and_one_stats_event() -> None:
    e = events.Event
    k = events.EventKind
    batch = [
        e(k.JOB_UPDATED, {"jobId": "a", "status": 0}),
        e(k.STATS_UPDATED),
        e(k.JOB_UPDATED, {"jobId": "b", "status": 0}),
        e(k.JOB_ARCHIVED, {"jobId": "x"}),
        e(k.JOB_UPDATED, {"jobId": "a", "status": 2}),
        e(k.STATS_UPDATED),
        e(k.JOB_ARCHIVED, {"jobId": "y"}),
    ]
    out = events.coalesce(batch)
    assert [(str(x.kind), x.data.get("jobId"), x.data.get("status")) for x in out] == [
        ("JobUpdated", "a", 2), ("StatsUpdated", None, None), ("JobUpdated", "b", 0),
        ("JobArchived", "x", None), ("JobArchived", "y", None),
    ]


def _wait_for(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_executor_pool_hands_each_job_to_the_executor_that_went_idle_last() -> None:
    ran: list[tuple[str, str]] = []

    def run(item: Any) -> None:
        ran.append((item, threading.current_thread().name))

    pool = ExecutorPool(run)
    pool.grow(4)
    _wait_for(lambda: len(pool._idle) == 4)
    for n in range(20):  # one job at a time, as an idle worker gets them
        pool.submit(f"job-{n}")
        _wait_for(lambda n=n: len(ran) == n + 1 and len(pool._idle) == 4)
    assert len({name for _, name in ran}) == 1, "light load keeps to one executor (one warm connection)"
    pool.close()
    assert not pool._threads


def test_executor_pool_runs_what_was_submitted_while_every_executor_was_busy_even_when_closing() -> None:
    release = threading.Event()
    ran: list[Any] = []

    def run(item: Any) -> None:
        release.wait(5)
        ran.append(item)

    pool = ExecutorPool(run)
    pool.grow(2)
    _wait_for(lambda: len(pool._idle) == 2)
    for n in range(6):  # two start at once, four wait in the backlog
        pool.submit(n)
    closer = threading.Thread(target=pool.close)
    closer.start()
    release.set()
    closer.join(10)
    assert sorted(ran) == list(range(6))
