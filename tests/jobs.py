"""Job types used by the worker and acceptance tests.

Handlers record what they saw in ``EXECUTIONS`` (in-process tests) and, for
tests with real worker processes, in the table ``test_executions`` created by
the acceptance fixtures.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

from django.db import connection

from chokaq_core import ChokaQFatalError, ChokaQThrottledError, JobContext, job

EXECUTIONS: dict[str, list[int]] = defaultdict(list)
_lock = threading.Lock()
GATES: dict[str, threading.Event] = {}


def record(ctx: JobContext) -> None:
    with _lock:
        EXECUTIONS[ctx.job_id].append(ctx.attempt)


def reset() -> None:
    with _lock:
        EXECUTIONS.clear()
        GATES.clear()


@job("test.ok.v1")
def ok(ctx: JobContext, **payload: Any) -> None:
    record(ctx)


@job("test.fail.v1")
def fail_until(ctx: JobContext, succeed_on: int = 99) -> None:
    """Raises a transient error until execution ``succeed_on``."""
    record(ctx)
    if ctx.attempt < succeed_on:
        raise ConnectionError(f"transient failure on attempt {ctx.attempt}")


@job("test.fatal.v1")
def fatal(ctx: JobContext) -> None:
    record(ctx)
    raise ChokaQFatalError("bad input, do not retry")


@job("test.valueerror.v1")
def value_error(ctx: JobContext) -> None:
    record(ctx)
    raise ValueError("poison payload")


@job("test.throttled.v1")
def throttled(ctx: JobContext, retry_after: float | None = None) -> None:
    record(ctx)
    raise ChokaQThrottledError("slow down", retry_after=retry_after)


@job("test.sleep.v1")
def sleeper(ctx: JobContext, seconds: float = 1.0, cooperative: bool = True) -> None:
    """Sleeps; a cooperative sleeper stops as soon as it is cancelled."""
    record(ctx)
    if cooperative:
        if ctx.cancellation.wait(seconds):
            ctx.raise_if_cancelled()
    else:
        time.sleep(seconds)


@job("test.gate.v1")
def gate(ctx: JobContext, name: str) -> None:
    """Blocks until the test sets ``GATES[name]`` (or the job is cancelled)."""
    record(ctx)
    event = GATES.setdefault(name, threading.Event())
    while not event.wait(0.05):
        ctx.raise_if_cancelled()


@job("test.async.v1")
async def async_job(ctx: JobContext, seconds: float = 0.0) -> None:
    import asyncio

    record(ctx)
    await asyncio.sleep(seconds)


@job("test.progress.v1")
def progress(ctx: JobContext) -> None:
    record(ctx)
    ctx.progress(50, "half")
    ctx.progress(150)


@job("test.record.v1")
def record_in_table(ctx: JobContext, sleep: float = 0.0, fail: bool = False) -> None:
    """Acceptance tests: one row per execution in ``test_executions`` (committed at once)."""
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO test_executions (job_id, attempt) VALUES (%s, %s)", [ctx.job_id, ctx.attempt])
    if sleep:
        time.sleep(sleep)
    if fail:
        raise ConnectionError("recorded failure")
