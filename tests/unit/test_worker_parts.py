"""The worker's in-process parts without a database: limiter, prefetch buffer, event coalescing, cancellation."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest

from chokaq_core import events
from chokaq_core.domain import CancellationReason, HotJob, JobCancelledError, JobStatus
from chokaq_core.handlers import CancellationToken, JobContext
from chokaq_core.worker import Limiter, PrefetchBuffer
from chokaq_core.worker.limits import AHEAD_WAIT


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


def test_limiter_leases_ahead_only_as_far_as_short_executions_allow() -> None:
    """Nothing ahead before an execution was timed; then as many rows as the executors finish in AHEAD_WAIT, at
    most ``most_ahead``; none once executions take longer than that."""
    limiter = Limiter(2, maximum=5, most_ahead=6)
    assert limiter.acquire(0) and limiter.acquire(0) and not limiter.acquire(0)
    limiter.pace(AHEAD_WAIT / 2)  # two executors finish 4 rows in AHEAD_WAIT
    assert limiter.ahead == 4
    assert all(limiter.acquire(0) for _ in range(4)) and not limiter.acquire(0)
    for _ in range(20):
        limiter.pace(AHEAD_WAIT / 1000)
    assert limiter.ahead == 6, "at most most_ahead"
    for _ in range(20):
        limiter.pace(AHEAD_WAIT * 5)
    assert limiter.ahead == 0
    for _ in range(4):
        limiter.release()
    assert limiter.running == 2 and not limiter.acquire(0), "the executors' own slots only"
    assert Limiter(2, maximum=5).ahead == 0


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
