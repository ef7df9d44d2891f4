"""Pure retry/classification rules (spec 02 §4–§5) — no database."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from chokaq_core.domain import (
    CancellationReason,
    ChokaQFatalError,
    ChokaQThrottledError,
    FailureReason,
    JobCancelledError,
    JobTypeNotRegisteredError,
)
from chokaq_core.policy import (
    Kind,
    RetryPolicy,
    backoff_seconds,
    cancellation_outcome,
    classify,
    decide_failure,
    root_cause,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("attempt", "low", "high"), [(1, 3, 4), (2, 6, 7), (3, 12, 13), (4, 24, 25), (5, 48, 49)])
def test_backoff_follows_the_documented_formula(attempt: int, low: float, high: float) -> None:
    rng = random.Random(attempt)
    for _ in range(50):
        delay = backoff_seconds(attempt, base=3, multiplier=2, cap=3600, jitter=1, rng=rng)
        assert low <= delay <= high


def test_backoff_at_the_cap_has_no_jitter() -> None:
    assert backoff_seconds(20, base=3, multiplier=2, cap=3600, jitter=1) == 3600
    assert backoff_seconds(10_000, base=3, multiplier=2, cap=3600, jitter=1) == 3600


def test_jitter_never_pushes_past_the_cap() -> None:
    rng = random.Random(1)
    for _ in range(200):
        assert backoff_seconds(11, base=3, multiplier=2, cap=3100, jitter=1000, rng=rng) <= 3100


def test_root_cause_follows_explicit_chaining() -> None:
    try:
        try:
            raise ChokaQThrottledError("inner", retry_after=5)
        except ChokaQThrottledError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as outer:
        assert isinstance(root_cause(outer), ChokaQThrottledError)
        assert classify(outer) == Kind.THROTTLED


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ValueError("x"), Kind.FATAL),
        (TypeError("x"), Kind.FATAL),
        (NotImplementedError(), Kind.FATAL),
        (ChokaQFatalError("x"), Kind.FATAL),
        (JobTypeNotRegisteredError("x"), Kind.FATAL),
        (ChokaQThrottledError(), Kind.THROTTLED),
        (JobCancelledError(CancellationReason.ADMIN), Kind.CANCELLED),
        (ConnectionError("x"), Kind.TRANSIENT),
        (RuntimeError("x"), Kind.TRANSIENT),
    ],
)
def test_classification(exc: BaseException, kind: Kind) -> None:
    assert classify(exc) == kind


def test_marker_attributes_classify_custom_exceptions() -> None:
    class Gone(Exception):
        chokaq_fatal = True

    class Busy(Exception):
        chokaq_throttled = True

    assert classify(Gone()) == Kind.FATAL
    assert classify(Busy()) == Kind.THROTTLED


def test_transient_failure_with_attempts_left_is_retried() -> None:
    d = decide_failure(ConnectionError("down"), 1, NOW, NOW, RetryPolicy(), rng=random.Random(0))
    assert d.retry and 3 <= d.delay <= 4


def test_exhausted_transient_goes_to_dlq_as_transient() -> None:
    d = decide_failure(ConnectionError("down"), 3, NOW, NOW, RetryPolicy(max_attempts=3))
    assert not d.retry and d.reason == FailureReason.TRANSIENT and "ConnectionError: down" in d.details


def test_exhausted_throttled_goes_to_dlq_as_throttled() -> None:
    d = decide_failure(ChokaQThrottledError("slow"), 3, NOW, NOW, RetryPolicy(max_attempts=3))
    assert d.reason == FailureReason.THROTTLED


def test_fatal_goes_straight_to_dlq_with_fatal_prefix() -> None:
    d = decide_failure(ValueError("bad"), 1, NOW, NOW, RetryPolicy(max_attempts=5))
    assert not d.retry and d.reason == FailureReason.FATAL_ERROR and d.details.startswith("FATAL: bad")


def test_throttled_retry_after_is_honoured_without_jitter_and_capped() -> None:
    assert decide_failure(ChokaQThrottledError(retry_after=7), 1, NOW, NOW, RetryPolicy()).delay == 7
    d = decide_failure(ChokaQThrottledError(retry_after=timedelta(hours=5)), 1, NOW, NOW, RetryPolicy())
    assert d.delay == 3600
    assert decide_failure(ChokaQThrottledError(retry_after=-3), 1, NOW, NOW, RetryPolicy()).delay == 0


def test_throttled_without_retry_after_uses_backoff() -> None:
    d = decide_failure(ChokaQThrottledError(), 2, NOW, NOW, RetryPolicy(), rng=random.Random(0))
    assert 6 <= d.delay <= 7


def test_retry_lifetime_budget_expires() -> None:
    created = NOW - timedelta(hours=23, minutes=59, seconds=58)
    d = decide_failure(ConnectionError("x"), 1, created, NOW, RetryPolicy(max_job_age=86400))
    assert not d.retry and d.reason == FailureReason.RETRY_LIFETIME_EXPIRED
    assert "MAX_JOB_AGE" in d.details


def test_retry_lifetime_disabled() -> None:
    created = NOW - timedelta(days=30)
    assert decide_failure(ConnectionError("x"), 1, created, NOW, RetryPolicy(max_job_age=None)).retry


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (CancellationReason.SHUTDOWN, None),
        (CancellationReason.ADMIN, FailureReason.CANCELLED),
        (CancellationReason.TIMEOUT, FailureReason.TIMEOUT),
        (CancellationReason.HEARTBEAT_FAILURE, FailureReason.HEARTBEAT_FAILURE),
        (None, FailureReason.TIMEOUT),
    ],
)
def test_cancellation_outcomes(reason: CancellationReason | None, expected: FailureReason | None) -> None:
    assert cancellation_outcome(reason)[0] == expected
