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
# Worker tests: the whole ctx per execution, and how a watched execution saw its cancellation.
CONTEXTS: dict[str, list[JobContext]] = defaultdict(list)
CANCELS: dict[str, tuple[Any, str | None]] = {}


def record(ctx: JobContext) -> None:
    with _lock:
        EXECUTIONS[ctx.job_id].append(ctx.attempt)


def reset() -> None:
    with _lock:
        EXECUTIONS.clear()
        GATES.clear()
        CONTEXTS.clear()
        CANCELS.clear()


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



def _record_row(ctx: JobContext) -> None:
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO test_executions (job_id, attempt) VALUES (%s, %s)", [ctx.job_id, ctx.attempt])


# Chaos / restart acceptance tests: every execution writes one row into ``test_executions`` before anything else.


@job("test.chaos.fast.v1")
def chaos_fast(ctx: JobContext) -> None:
    _record_row(ctx)


@job("test.chaos.slow.v1")
def chaos_slow(ctx: JobContext, ms: int = 100) -> None:
    _record_row(ctx)
    time.sleep(ms / 1000)


@job("test.chaos.transient.v1")
def chaos_transient(ctx: JobContext, succeed_on: int = 2) -> None:
    """A transient error (retried with backoff) until execution ``succeed_on``."""
    _record_row(ctx)
    if ctx.attempt < succeed_on:
        raise ConnectionError(f"transient failure on attempt {ctx.attempt}")


@job("test.chaos.fatal.v1")
def chaos_fatal(ctx: JobContext) -> None:
    _record_row(ctx)
    raise ChokaQFatalError("chaos: fatal, never retried")


@job("test.chaos.throttled.v1")
def chaos_throttled(ctx: JobContext, retry_after: float = 0.2, succeed_on: int = 2) -> None:
    """Throttled (retry after ``retry_after`` s) until execution ``succeed_on``."""
    _record_row(ctx)
    if ctx.attempt < succeed_on:
        raise ChokaQThrottledError("chaos: slow down", retry_after=retry_after)


# ---------------------------------------------------------------- worker tests


@job("test.ctx.v1")
def ctx_probe(ctx: JobContext, sleep: float = 0.0) -> None:
    """Keeps the whole context it was given; sleeps cooperatively."""
    record(ctx)
    with _lock:
        CONTEXTS[ctx.job_id].append(ctx)
    if sleep and ctx.cancellation.wait(sleep):
        ctx.raise_if_cancelled()


@job("test.watch.v1")
def watch(ctx: JobContext, name: str) -> None:
    """Like ``test.gate.v1``, but records the reason and actor of the cancellation it saw."""
    record(ctx)
    event = GATES.setdefault(name, threading.Event())
    while not event.wait(0.02):
        if ctx.is_cancelled:
            with _lock:
                CANCELS[ctx.job_id] = (ctx.cancellation.reason, ctx.cancellation.actor)
            ctx.raise_if_cancelled()


@job("test.progress_steps.v1")
def progress_steps(ctx: JobContext, steps: list[float]) -> None:
    record(ctx)
    for step in steps:
        ctx.progress(step, f"at {step}")


@job("test.late.v1")
def late(ctx: JobContext, seconds: float = 1.0) -> None:
    """Ignores cancellation for ``seconds``, then honours whatever cancellation arrived meanwhile."""
    record(ctx)
    time.sleep(seconds)
    if ctx.is_cancelled:
        with _lock:
            CANCELS[ctx.job_id] = (ctx.cancellation.reason, ctx.cancellation.actor)
    ctx.raise_if_cancelled()
