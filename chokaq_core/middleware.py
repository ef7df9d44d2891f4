"""Execution middleware (spec 03 §10–§11): an onion around every handler call.

``CHOKAQ["MIDDLEWARE"]`` lists dotted paths; the first entry is the outermost
layer. A middleware class is instantiated per execution and called as
``mw(ctx, job, call_next)`` where ``job`` is a :class:`JobCall` (the type, the
decoded payload in Bus mode or the raw payload text in Pipe mode). Calling
``call_next()`` runs the rest of the onion; not calling it short-circuits and
the execution counts as a success. Exceptions follow the normal retry/DLQ
policy. Middleware must not write ChokaQ tables or swallow cancellation.

Built in:

* :class:`LoggingMiddleware` — one log line per execution with its duration.
* :class:`IdempotencyMiddleware` — claim store + completion markers, so a job
  whose side effect already completed is not run twice even if its worker died
  before recording the success (the retry then finds the marker).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any, Protocol

from django.conf import settings
from django.utils.module_loading import import_string

from chokaq_core import metrics
from chokaq_core.conf import config
from chokaq_core.domain import ChokaQFatalError
from chokaq_core.handlers import JobContext
from chokaq_core.lazy import Lazy

logger = logging.getLogger("chokaq.middleware")


@dataclass(frozen=True)
class JobCall:
    """What middleware sees of the job being executed."""

    type_key: str
    payload: dict[str, Any] | str
    idempotency_key: str | None = None
    result_ttl: float | None = None


Middleware = Callable[[JobContext, JobCall, Callable[[], Any]], Any]


def load_middleware(paths: list[str]) -> list[type]:
    return [import_string(path) for path in paths]


def run_pipeline(classes: list[type], ctx: JobContext, job: JobCall, handler: Callable[[], Any]) -> Any:
    """Run ``handler`` inside the middleware onion (first class = outermost)."""

    def layer(index: int) -> Any:
        if index == len(classes):
            return handler()
        return classes[index]()(ctx, job, lambda: layer(index + 1))

    return layer(0)


class LoggingMiddleware:
    def __call__(self, ctx: JobContext, job: JobCall, call_next: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        try:
            result = call_next()
        except BaseException as exc:
            logger.info("job %s (%s) attempt %s raised %s after %.1f ms", ctx.job_id, job.type_key, ctx.attempt,
                        type(exc).__name__, (time.perf_counter() - started) * 1000)
            raise
        logger.info("job %s (%s) attempt %s done in %.1f ms", ctx.job_id, job.type_key, ctx.attempt,
                    (time.perf_counter() - started) * 1000)
        return result


# ---------------------------------------------------------------- idempotency


class ClaimStatus(Enum):
    CLAIMED = "claimed"
    ALREADY_IN_PROGRESS = "in_progress"
    ALREADY_COMPLETED = "completed"


class IdempotencyStore(Protocol):
    def try_begin(self, key: str, job_id: str, in_progress_ttl: float) -> tuple[ClaimStatus, str | None]: ...

    def complete(self, key: str, job_id: str, marker: str, ttl: float | None) -> bool: ...

    def release(self, key: str, job_id: str) -> bool: ...


class InMemoryIdempotencyStore:
    """Process-local store (development only); expired entries are purged every 64 operations."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[str, str, float | None, str | None]] = {}  # key → (state, job, expiry, marker)
        self._lock = threading.Lock()
        self._ops = 0

    def _live(self, key: str, now: float) -> tuple[str, str, float | None, str | None] | None:
        entry = self._entries.get(key)
        if entry is not None and entry[2] is not None and entry[2] <= now:
            del self._entries[key]
            return None
        return entry

    def _tick(self, now: float) -> None:
        self._ops += 1
        if self._ops % 64 == 0:
            for key in [k for k, e in self._entries.items() if e[2] is not None and e[2] <= now]:
                del self._entries[key]

    def try_begin(self, key: str, job_id: str, in_progress_ttl: float) -> tuple[ClaimStatus, str | None]:
        with self._lock:
            now = time.monotonic()
            self._tick(now)
            entry = self._live(key, now)
            if entry is None:
                self._entries[key] = ("in_progress", job_id, now + in_progress_ttl, None)
                return ClaimStatus.CLAIMED, None
            if entry[0] == "completed":
                return ClaimStatus.ALREADY_COMPLETED, entry[3]
            return ClaimStatus.ALREADY_IN_PROGRESS, None

    def complete(self, key: str, job_id: str, marker: str, ttl: float | None) -> bool:
        with self._lock:
            now = time.monotonic()
            entry = self._live(key, now)
            if entry is None or entry[0] != "in_progress" or entry[1] != job_id:
                return False
            self._entries[key] = ("completed", job_id, now + ttl if ttl is not None else None, marker)
            return True

    def release(self, key: str, job_id: str) -> bool:
        with self._lock:
            entry = self._live(key, time.monotonic())
            if entry is None or entry[0] != "in_progress" or entry[1] != job_id:
                return False
            del self._entries[key]
            return True


_RELEASE_OR_COMPLETE = """
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
local entry = cjson.decode(current)
if entry['state'] ~= 'in_progress' or entry['job'] ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) return 1 end
if ARGV[3] == '' then redis.call('SET', KEYS[1], ARGV[2]) else redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end
return 1
"""


class RedisIdempotencyStore:
    """Shared, atomic store for a fleet: ``SET NX PX`` to claim, a Lua compare-and-set to complete or release.

    The Redis URL comes from ``CHOKAQ["IDEMPOTENCY"]["REDIS_URL"]`` or the ``REDIS_URL`` setting.
    """

    prefix = "chokaq:idem:"

    def __init__(self, url: str | None = None) -> None:
        import redis
        url = url or config().IDEMPOTENCY.get("REDIS_URL") or getattr(settings, "REDIS_URL", "")
        if not url:
            raise ChokaQFatalError("RedisIdempotencyStore needs CHOKAQ['IDEMPOTENCY']['REDIS_URL'] or REDIS_URL")
        self.client = redis.Redis.from_url(url)
        self._script = self.client.register_script(_RELEASE_OR_COMPLETE)

    def try_begin(self, key: str, job_id: str, in_progress_ttl: float) -> tuple[ClaimStatus, str | None]:
        value = json.dumps({"state": "in_progress", "job": job_id})
        if self.client.set(self.prefix + key, value, nx=True, px=max(1, int(in_progress_ttl * 1000))):
            return ClaimStatus.CLAIMED, None
        raw = self.client.get(self.prefix + key)
        if raw is None:  # expired between the two calls: try once more
            return self.try_begin(key, job_id, in_progress_ttl)
        entry = json.loads(raw)
        if entry["state"] == "completed":
            return ClaimStatus.ALREADY_COMPLETED, entry.get("marker")
        return ClaimStatus.ALREADY_IN_PROGRESS, None

    def complete(self, key: str, job_id: str, marker: str, ttl: float | None) -> bool:
        value = json.dumps({"state": "completed", "job": job_id, "marker": marker})
        ttl_ms = "" if ttl is None else str(max(1, int(ttl * 1000)))
        return bool(self._script(keys=[self.prefix + key], args=[job_id, value, ttl_ms]))

    def release(self, key: str, job_id: str) -> bool:
        return bool(self._script(keys=[self.prefix + key], args=[job_id, "", ""]))


_store: Lazy[IdempotencyStore] = Lazy(lambda: import_string(config().IDEMPOTENCY.STORE)())


def idempotency_store() -> IdempotencyStore:
    """The process's store, built from ``CHOKAQ["IDEMPOTENCY"]["STORE"]`` on first use."""
    return _store()


def reset_idempotency_store() -> None:
    _store.reset()


class IdempotencyMiddleware:
    """Skip executions whose idempotency key already completed (or is running elsewhere)."""

    def __call__(self, ctx: JobContext, job: JobCall, call_next: Callable[[], Any]) -> Any:
        settings = config().IDEMPOTENCY
        if job.idempotency_key is None:
            return call_next()
        key = job.idempotency_key.strip()
        if not key:
            logger.warning("job %s declares a blank idempotency key; running it unguarded", ctx.job_id)
            metrics.idempotency_claim("empty_key")
            return call_next()
        store = idempotency_store()
        status, _marker = store.try_begin(key, ctx.job_id, settings.IN_PROGRESS_TTL)
        if status is not ClaimStatus.CLAIMED:
            logger.info("job %s skipped: idempotency key %r %s", ctx.job_id, key, status.value)
            metrics.idempotency_claim("completed_duplicate" if status is ClaimStatus.ALREADY_COMPLETED
                                      else "in_progress_duplicate")
            return None
        metrics.idempotency_claim("claimed")
        try:
            result = call_next()
        except BaseException:
            store.release(key, ctx.job_id)
            metrics.idempotency_claim("released")
            raise
        ttl = job.result_ttl if job.result_ttl is not None else settings.DEFAULT_RESULT_TTL
        if ttl is not None and (
            (settings.MIN_RESULT_TTL is not None and ttl < settings.MIN_RESULT_TTL)
            or (settings.MAX_RESULT_TTL is not None and ttl > settings.MAX_RESULT_TTL)
        ):
            raise ChokaQFatalError(f"result TTL {ttl}s is outside the configured bounds")
        marker = json.dumps({"CompletedAt": datetime.now(UTC).isoformat(), "JobId": ctx.job_id})
        if not store.complete(key, ctx.job_id, marker, ttl):
            metrics.idempotency_claim("complete_conflict")
            raise ChokaQFatalError(f"idempotency key {key!r} was taken over before completion (complete_conflict)")
        metrics.idempotency_claim("completed")
        return result


# ---------------------------------------------------------------- soft dedup (spec 03 §11.4)


class InMemoryDeduplicator:
    """Process-local soft suppression of repeated commands; never a correctness tool."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._entries: dict[str, float] = {}
        self._lock = threading.Lock()
        self._last_sweep = clock()

    def try_acquire(self, key: str, ttl: float) -> bool:
        if not key:
            return True
        with self._lock:
            now = self.clock()
            if now - self._last_sweep >= 60:
                self._entries = {k: v for k, v in self._entries.items() if v > now}
                self._last_sweep = now
            expiry = self._entries.get(key)
            if expiry is not None and expiry > now:
                return False
            self._entries[key] = now + ttl
            return True
