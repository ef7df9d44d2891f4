"""Calling a handler: resolve the type key, decode the payload, run the middleware onion, drive an async
handler on the executor thread's own event loop (spec 03 §7.1 step 7, §10, §14)."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Callable
from typing import Any

from django.db import connections

from chokaq_core import events
from chokaq_core.domain import HotJob, JobCancelledError, JobTypeNotRegisteredError, PayloadDeserializationError
from chokaq_core.handlers import CancellationToken, JobContext, get_definition
from chokaq_core.middleware import JobCall, run_pipeline

logger = logging.getLogger("chokaq.worker")


def invoke(job: HotJob, ctx: JobContext, middleware: list[type], pipe: Callable[..., Any] | None) -> Any:
    """Bus mode: type key → ``@job`` function → ``func(ctx, **payload)``. Pipe mode: one function
    ``pipe(job_type, payload_text, ctx)`` receives every raw payload."""
    if pipe is not None:
        if not middleware:  # the onion without a layer is the call itself
            return call_handler(pipe, ctx.cancellation, job.type, job.payload or "", ctx)
        call = JobCall(job.type, job.payload or "")
        return run_pipeline(middleware, ctx, call, lambda: call_handler(pipe, ctx.cancellation, job.type,
                                                                        job.payload or "", ctx))
    definition = get_definition(job.type)
    if definition is None:
        raise JobTypeNotRegisteredError(f"no handler is registered for job type {job.type!r} in this worker")
    try:
        payload = json.loads(job.payload) if job.payload else {}
    except ValueError as exc:
        raise PayloadDeserializationError(f"payload of job {job.id} is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise PayloadDeserializationError(
            f"payload of job {job.id} must be a JSON object of handler arguments, got {type(payload).__name__}"
        )
    try:
        key = definition.execution_key(payload)
    except Exception as exc:  # not chained as its cause: the job is dead at once, whatever the function raised
        raise PayloadDeserializationError(f"cannot build the idempotency key of job {job.id}: {exc!r}") from None
    if job.rate_key is None and definition.rate_key is not None:
        # a row that reached Hot without its rate key (another service's enqueue, an edited payload): the key
        # function must still hold for its payload, else the job is dead with the function's error
        try:
            definition.partition_key(payload)
        except Exception as exc:  # as above
            raise PayloadDeserializationError(f"the rate_key of job {job.id} failed: {exc!r}") from None
    if not middleware:
        return call_handler(definition.func, ctx.cancellation, ctx, **payload)
    call = JobCall(job.type, payload, key, definition.result_ttl)
    return run_pipeline(middleware, ctx, call, lambda: call_handler(definition.func, ctx.cancellation, ctx, **payload))


def call_handler(func: Callable[..., Any], token: CancellationToken, *args: Any, **kwargs: Any) -> Any:
    """Call a sync handler, or drive an async one to completion on this thread's own loop."""
    if inspect.iscoroutinefunction(func):
        return asyncio.run(_drive(func(*args, **kwargs), token))
    return func(*args, **kwargs)


async def _drive(coro: Any, token: CancellationToken) -> Any:
    """Run an async handler; cancel its task at the next await once the token is cancelled."""
    task = asyncio.ensure_future(coro)
    while not task.done():
        await asyncio.wait({task}, timeout=0.05)
        if token.is_cancelled and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                raise JobCancelledError(token.reason) from None
    return task.result()


def drop_broken_connections() -> None:
    """Before each handler, what Django does per request (``close_if_unusable_or_obsolete``) minus the age
    rule: a connection of this executor thread that saw a database error and no longer answers is closed,
    so the handler's next query reconnects. Without it a database restart leaves every pool thread holding
    a dead connection and each handler fails ("the connection is closed") until its retries run out."""
    for conn in connections.all(initialized_only=True):
        try:
            if conn.connection is not None and conn.errors_occurred and not conn.in_atomic_block:
                if conn.is_usable():
                    conn.errors_occurred = False
                else:
                    conn.close()
        except Exception:
            logger.debug("dropping a broken connection failed", exc_info=True)
            conn.connection = None


def publish_progress(job_id: str, percent: int, message: str | None) -> None:
    """``ctx.report_progress`` → a ``JobProgress`` event (UI only, not persisted)."""
    events.dispatch([events.Event(events.EventKind.JOB_PROGRESS,
                                  {"jobId": job_id, "percentage": percent, "message": message})])
