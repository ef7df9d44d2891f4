"""Job types, middleware and the pipe handler of the control-plane tests.

In-process tests import this module through ``tests/control/conftest.py``;
worker subprocesses load it through ``CHOKAQ["JOB_MODULES"]`` (the
``CHOKAQ_TEST_OVERRIDES`` the subprocess fixture passes).

Handlers record their calls in :data:`CALLS` (in-process tests) or, for worker
subprocesses, in the table ``ctl_effects`` that the kill test creates.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from django.db import connection

from chokaq_core import CircuitFatalError, JobContext, job
from chokaq_core.middleware import JobCall

_lock = threading.Lock()
# job id → the attempts that reached the handler (in-process tests).
CALLS: dict[str, list[int]] = defaultdict(list)
# ctl.flaky.v1 / ctl.circuit_fatal.v1 fail while "fail" is set; ctl.flaky.v1 blocks while "hold" is set.
FLAKY: dict[str, bool] = {"fail": False}
HOLD = threading.Event()  # set = let a held execution go on
HOLD.set()
# The onion as the middleware test sees it: "outer>", "inner>", "handler", "<inner", "log", "<outer".
ORDER: list[str] = []
# What the pipe handler and the recording middleware were given.
PIPED: list[tuple[str, str, str]] = []  # (job_type, payload_text, ctx.job_id)
SEEN_BY_MIDDLEWARE: list[tuple[str, Any]] = []  # (type_key, payload as the middleware received it)


def reset() -> None:
    with _lock:
        CALLS.clear()
        ORDER.clear()
        PIPED.clear()
        SEEN_BY_MIDDLEWARE.clear()
    FLAKY["fail"] = False
    HOLD.set()


def _record(ctx: JobContext) -> None:
    with _lock:
        CALLS[ctx.job_id].append(ctx.attempt)


def calls_of(job_ids: list[str]) -> int:
    with _lock:
        return sum(len(CALLS.get(i, [])) for i in job_ids)


# ---------------------------------------------------------------- circuit breaker


@job("ctl.flaky.v1")
def flaky(ctx: JobContext, n: int = 0) -> None:
    """A downstream that is down while ``FLAKY["fail"]`` is set (a transient error)."""
    _record(ctx)
    while not HOLD.wait(0.02):
        ctx.raise_if_cancelled()
    if FLAKY["fail"]:
        raise ConnectionError(f"downstream unavailable (attempt {ctx.attempt})")


@job("ctl.circuit_fatal.v1")
def circuit_fatal(ctx: JobContext, n: int = 0) -> None:
    """Raises a circuit-fatal error while ``FLAKY["fail"]`` is set: one failure opens the circuit."""
    _record(ctx)
    if FLAKY["fail"]:
        raise CircuitFatalError("the downstream says it is gone for good")


@job("ctl.ok.v1")
def ok(ctx: JobContext, n: int = 0, skip: bool = False, explode: bool = False) -> str:
    _record(ctx)
    with _lock:
        ORDER.append("handler")
    return "done"


# ---------------------------------------------------------------- idempotency


@job("ctl.order.v1", idempotency_key="order:{order_id}", result_ttl=3600)
def charge_order(ctx: JobContext, order_id: str, fail_first: bool = False, hold: bool = False) -> None:
    """Opted into the idempotency middleware by a key built from the payload; ``hold`` waits for HOLD."""
    _record(ctx)
    while hold and not HOLD.wait(0.02):
        ctx.raise_if_cancelled()
    if fail_first and ctx.attempt == 1:
        raise ConnectionError("payment gateway timeout")


@job("ctl.effect.v1", idempotency_key="effect:{key}")
def side_effect(ctx: JobContext, key: str) -> None:
    """The kill test's side effect: one committed row per handler run (worker subprocesses)."""
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO ctl_effects (job_id, effect_key, attempt) VALUES (%s, %s, %s)",
                       [ctx.job_id, key, ctx.attempt])


# ---------------------------------------------------------------- middleware


class OuterMiddleware:
    def __call__(self, ctx: JobContext, job: JobCall, call_next: Callable[[], Any]) -> Any:
        with _lock:
            ORDER.append("outer>")
        try:
            return call_next()
        finally:
            with _lock:
                ORDER.append("<outer")


class InnerMiddleware:
    def __call__(self, ctx: JobContext, job: JobCall, call_next: Callable[[], Any]) -> Any:
        with _lock:
            ORDER.append("inner>")
        try:
            return call_next()
        finally:
            with _lock:
                ORDER.append("<inner")


class GuardMiddleware:
    """Short-circuits jobs whose payload says ``skip``; raises a fatal error for ``explode``."""

    def __call__(self, ctx: JobContext, job: JobCall, call_next: Callable[[], Any]) -> Any:
        payload = job.payload if isinstance(job.payload, dict) else {}
        if payload.get("skip"):
            return "short-circuited"
        if payload.get("explode"):
            raise ValueError("refused by middleware")
        return call_next()


class RecordingMiddleware:
    def __call__(self, ctx: JobContext, job: JobCall, call_next: Callable[[], Any]) -> Any:
        with _lock:
            SEEN_BY_MIDDLEWARE.append((job.type_key, job.payload))
        return call_next()


class LingerAfterMiddleware:
    """Outermost in the kill test: sleeps after the rest of the onion returned — i.e. after the
    idempotency marker was written and before the worker commits the archive — for
    ``$CHOKAQ_TEST_LINGER`` seconds (0 or unset: no sleep)."""

    def __call__(self, ctx: JobContext, job: JobCall, call_next: Callable[[], Any]) -> Any:
        result = call_next()
        linger = float(os.environ.get("CHOKAQ_TEST_LINGER") or 0)
        if linger:
            time.sleep(linger)
        return result


# ---------------------------------------------------------------- pipe mode


def pipe_handler(job_type: str, payload: str, ctx: JobContext) -> Any:
    """The one handler of Pipe mode: the raw payload text of every type."""
    with _lock:
        PIPED.append((job_type, payload, ctx.job_id))
        CALLS[ctx.job_id].append(ctx.attempt)
    if '"transient"' in payload:
        raise ConnectionError("pipe downstream unavailable")
    if '"fatal"' in payload:
        raise ValueError("pipe cannot parse this")
    return {"type": job_type, "length": len(payload)}
