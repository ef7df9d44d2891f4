"""ChokaQ for Django: a durable, database-backed background job engine.

Public surface::

    from chokaq_core import job, enqueue, aenqueue, enqueue_many, get_job

    @job("email.send.v1", queue="emails")
    def send_email(ctx, to: str, subject: str) -> None: ...

    job_id = send_email.enqueue(to="a@b.c", subject="Welcome")
    record = get_job(job_id)  # a read-only JobRecord: status, attempts, timestamps, result, error; None if unknown
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"  # the distribution's version (pyproject.toml reads it from here)

from chokaq_core.domain import (
    CancellationReason,
    ChokaQError,
    ChokaQFatalError,
    ChokaQThrottledError,
    CircuitFatalError,
    EnvelopeError,
    FailureReason,
    JobCancelledError,
    JobRecord,
    JobStatus,
    JobTypeNotRegisteredError,
    PayloadDeserializationError,
    UnknownJobTypeError,
    new_ulid,
)
from chokaq_core.handlers import JobContext

__all__ = [
    "CancellationReason",
    "ChokaQError",
    "ChokaQFatalError",
    "ChokaQThrottledError",
    "CircuitFatalError",
    "EnqueueOptions",
    "EnvelopeError",
    "FailureReason",
    "JobCancelledError",
    "JobContext",
    "JobRecord",
    "JobStatus",
    "JobTypeNotRegisteredError",
    "PayloadDeserializationError",
    "UnknownJobTypeError",
    "aenqueue",
    "aenqueue_many",
    "aget_job",
    "enqueue",
    "enqueue_many",
    "get_job",
    "job",
    "new_ulid",
]


def __getattr__(name: str) -> Any:
    # api imports storage and models-adjacent code: load it on first use so that
    # importing chokaq_core (e.g. from settings or an app's jobs.py) stays cheap.
    if name in ("enqueue", "aenqueue", "enqueue_many", "aenqueue_many", "EnqueueOptions", "get_job", "aget_job",
                "job"):
        from chokaq_core import api

        return getattr(api, name)
    raise AttributeError(f"module 'chokaq_core' has no attribute {name!r}")
