"""Memory mode — the attempts history (the same contract as tests/storage/test_attempts.py)."""

from __future__ import annotations

import pytest

from chokaq_core import storage
from chokaq_core.domain import AttemptError, Failure, FailureReason, Retry

from .conftest import Clock
from .rows import processing

pytestmark = pytest.mark.usefixtures("clock")


def _error(message: str) -> AttemptError:
    try:
        raise ConnectionError(message)
    except ConnectionError as exc:
        return AttemptError.of(exc)


def test_attempts_are_kept_in_order_across_retry_and_dlq(clock: Clock) -> None:
    job = processing("m-att", "w1")[0]
    storage.complete("w1", [], [Retry(job.id, 1, 0.0, _error("first"))], [])
    clock.advance(1)
    [again] = storage.fetch_batch("w2", 1, ["m-att"])
    storage.mark_processing(again, "w2")
    storage.complete("w2", [], [], [Failure(job.id, FailureReason.TRANSIENT, "second", 2, _error("second"))])

    history = storage.job_attempts(job.id)
    assert [(a.attempt, a.worker_id, a.message) for a in history] == [(1, "w1", "first"), (2, "w2", "second")]
    assert history[1].failed_at == clock.now
    assert history[1].started_at is not None  # the Hot row's started_at of that execution


def test_lost_ownership_and_errorless_outcomes_record_nothing() -> None:
    job = processing("m-att-lost", "w1")[0]
    storage.complete("intruder", [], [Retry(job.id, 1, 0.0, _error("x"))], [])
    storage.complete("w1", [], [Retry(job.id, 0, 0.0)], [])
    assert storage.job_attempts(job.id) == []


def test_purge_attempts_and_reset(clock: Clock) -> None:
    old, new = processing("m-att-purge", "w1", 2)
    storage.complete("w1", [], [Retry(old.id, 1, 0.0, _error("old"))], [])
    cutoff = clock.advance(60)
    storage.complete("w1", [], [Retry(new.id, 1, 0.0, _error("new"))], [])
    assert storage.purge_attempts(cutoff) == 1
    assert (storage.job_attempts(old.id), len(storage.job_attempts(new.id))) == ([], 1)
