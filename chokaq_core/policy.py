"""Pure decisions of the worker: backoff with jitter and failure classification (spec 02 §4–§5).

Nothing here touches the database, the clock of the process, or threads:
every input is an argument, so every rule has a unit test.
"""

from __future__ import annotations

import random
import traceback
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

from chokaq_core.domain import (
    CancellationReason,
    ChokaQFatalError,
    FailureReason,
    JobCancelledError,
)
from chokaq_core.handlers import retry_after_seconds

MAX_DELAY_MS = 2**31 - 1
DEFAULT_FATAL: tuple[type[BaseException], ...] = (ChokaQFatalError, ValueError, TypeError, NotImplementedError)


class Kind(Enum):
    CANCELLED = "cancelled"
    FATAL = "fatal"
    THROTTLED = "throttled"
    TRANSIENT = "transient"


def root_cause(exc: BaseException) -> BaseException:
    """Follow explicit chaining (``raise … from …``) to the innermost exception."""
    seen = {id(exc)}
    while exc.__cause__ is not None and id(exc.__cause__) not in seen:
        exc = exc.__cause__
        seen.add(id(exc))
    return exc


def classify(exc: BaseException, fatal: tuple[type[BaseException], ...] = DEFAULT_FATAL) -> Kind:
    root = root_cause(exc)
    if isinstance(root, JobCancelledError) or isinstance(exc, JobCancelledError):
        return Kind.CANCELLED
    if isinstance(root, fatal) or getattr(root, "chokaq_fatal", False):
        return Kind.FATAL
    if getattr(root, "chokaq_throttled", False):
        return Kind.THROTTLED
    return Kind.TRANSIENT


def backoff_seconds(
    attempt: int, *, base: float, multiplier: float, cap: float, jitter: float, rng: random.Random | None = None
) -> float:
    """Delay after execution ``attempt`` (1-based) failed: capped exponential plus jitter that never passes the cap."""
    rng = rng or random.Random()
    try:
        raw = base * multiplier ** (attempt - 1)
    except OverflowError:
        raw = float("inf")
    capped = min(raw, cap)
    window = max(0.0, min(jitter, cap - capped))
    delay_ms = int((capped + rng.uniform(0, window)) * 1000)
    return min(delay_ms, MAX_DELAY_MS) / 1000


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3
    base_delay: float = 3.0
    max_delay: float = 3600.0
    multiplier: float = 2.0
    jitter: float = 1.0
    max_job_age: float | None = 86400.0


@dataclass(frozen=True)
class Decision:
    """What to do with a failed execution: retry after ``delay`` seconds, or move to the DLQ."""

    retry: bool
    delay: float = 0.0
    reason: FailureReason | None = None
    details: str = ""


def decide_failure(
    exc: BaseException, attempt: int, created_at: datetime, now: datetime, policy: RetryPolicy,
    fatal: tuple[type[BaseException], ...] = DEFAULT_FATAL, rng: random.Random | None = None,
) -> Decision:
    """Spec 02 §4–§5.2 for a non-cancellation exception raised by execution ``attempt``."""
    kind = classify(exc, fatal)
    text = "".join(traceback.format_exception(exc)).strip()
    if kind == Kind.FATAL:
        return Decision(False, reason=FailureReason.FATAL_ERROR, details=f"FATAL: {exc}\n{text}")
    if attempt >= policy.max_attempts:
        reason = FailureReason.THROTTLED if kind == Kind.THROTTLED else FailureReason.TRANSIENT
        return Decision(False, reason=reason, details=text)
    retry_after = retry_after_seconds(getattr(root_cause(exc), "retry_after", None)) if kind == Kind.THROTTLED else None
    if retry_after is not None:
        delay = min(retry_after, policy.max_delay)
    else:
        delay = backoff_seconds(attempt, base=policy.base_delay, multiplier=policy.multiplier, cap=policy.max_delay,
                                jitter=policy.jitter, rng=rng)
    if policy.max_job_age is not None:
        deadline = created_at + timedelta(seconds=policy.max_job_age)
        next_run = now + timedelta(seconds=delay)
        if now >= deadline or next_run > deadline:
            return Decision(
                False, reason=FailureReason.RETRY_LIFETIME_EXPIRED,
                details=(f"Retry lifetime expired: created {created_at.isoformat()}, next run would be "
                         f"{next_run.isoformat()}, MAX_JOB_AGE {policy.max_job_age:g}s. Last error:\n{text}"),
            )
    return Decision(True, delay=delay)


def cancellation_outcome(reason: CancellationReason | None) -> tuple[FailureReason | None, str]:
    """Spec 02 §8: how a cancellation ends an execution. ``None`` reason → reschedule (shutdown)."""
    if reason == CancellationReason.SHUTDOWN:
        return None, "Worker Shutdown"
    if reason == CancellationReason.ADMIN:
        return FailureReason.CANCELLED, "Cancelled by admin while running"
    if reason == CancellationReason.HEARTBEAT_FAILURE:
        return FailureReason.HEARTBEAT_FAILURE, "Heartbeat failure threshold reached"
    if reason == CancellationReason.TIMEOUT:
        return FailureReason.TIMEOUT, "Timeout: Execution Timeout"
    return FailureReason.TIMEOUT, "Unknown execution cancellation"
