"""Build rows in a lifecycle state and read them back, through ``chokaq_core.storage`` only."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from itertools import count
from typing import Any

from chokaq_core import storage
from chokaq_core.domain import (
    ArchivedJob,
    DeadJob,
    Failure,
    FailureReason,
    HistorySort,
    HotJob,
    JobFilter,
    NewJob,
    Success,
    new_ulid,
)

_serial = count(1)
EVERYTHING = 10**9


def new_job(
    queue: str = "main", *, id: str | None = None, type: str = "test.ok.v1", payload: str | None = None,
    tags: str | None = None, key: str | None = None, priority: int = 10, delay: float | None = None,
    created_by: str | None = None,
) -> NewJob:
    return NewJob(id=id or new_ulid(), queue=queue, type=type,
                  payload=payload if payload is not None else json.dumps({"n": next(_serial)}), tags=tags,
                  idempotency_key=key, priority=priority, delay_seconds=delay, created_by=created_by)


def pending(queue: str, n: int = 1, **fields: Any) -> list[str]:
    jobs = [new_job(queue, **fields) for _ in range(n)]
    stored = storage.enqueue(jobs)
    assert stored == [j.id for j in jobs]
    return stored


def fetched(queue: str, worker: str, n: int = 1, **fields: Any) -> list[HotJob]:
    """``n`` new rows of ``queue`` claimed by ``worker`` (the queue must hold no other due Pending row)."""
    ids = pending(queue, n, **fields)
    claimed = storage.fetch_batch(worker, n, [queue])
    assert sorted(j.id for j in claimed) == sorted(ids), "queue had other due Pending rows"
    return claimed


def processing(queue: str, worker: str, n: int = 1, **fields: Any) -> list[HotJob]:
    jobs = fetched(queue, worker, n, **fields)
    for job in jobs:
        assert storage.mark_processing(job, worker) == 1
    return [hot(j.id) for j in jobs]


def dead(queue: str, n: int = 1, *, reason: FailureReason = FailureReason.FATAL_ERROR, details: str = "boom",
         worker: str = "w-dlq", **fields: Any) -> list[str]:
    jobs = processing(queue, worker, n, **fields)
    done = storage.complete(worker, [], [], [Failure(j.id, reason, details) for j in jobs])
    assert sorted(i for i, _ in done.failed) == sorted(j.id for j in jobs)
    return [j.id for j in jobs]


def archived(queue: str, n: int = 1, *, duration_ms: float | None = 5.0, worker: str = "w-arc",
             **fields: Any) -> list[str]:
    jobs = processing(queue, worker, n, **fields)
    done = storage.complete(worker, [Success(j.id, duration_ms) for j in jobs], [], [])
    assert sorted(i for i, _ in done.archived) == sorted(j.id for j in jobs)
    return [j.id for j in jobs]


# ---------------------------------------------------------------- reads


def hot(job_id: str) -> HotJob:
    row = storage.get_hot(job_id)
    assert row is not None, f"{job_id} is not in Hot"
    return row


def archive_row(job_id: str) -> ArchivedJob:
    row = storage.get_archived(job_id)
    assert row is not None, f"{job_id} is not in the Archive"
    return row


def dlq_row(job_id: str) -> DeadJob:
    row = storage.get_dead(job_id)
    assert row is not None, f"{job_id} is not in the DLQ"
    return row


def nowhere(job_id: str) -> bool:
    return storage.locate_jobs([job_id]) == {}


def counters(queue: str) -> tuple[int, int, int]:
    """(succeeded_total, failed_total, retried_total) of ``queue``; its Queues row must exist."""
    stats = {s.queue: s for s in storage.queue_stats()}
    assert queue in stats, f"no stats for {queue!r}"
    s = stats[queue]
    return s.succeeded_total, s.failed_total, s.retried_total


def hot_ids(queue: str | None = None) -> set[str]:
    return {r.id for r in storage.list_active(JobFilter(queue=queue), EVERYTHING)}


def archive_ids(queue: str | None = None) -> set[str]:
    return {r.id for r in storage.list_archive(JobFilter(queue=queue), None, EVERYTHING, HistorySort())}


def dlq_ids(queue: str | None = None) -> set[str]:
    return {r.id for r in storage.list_dlq(JobFilter(queue=queue), None, EVERYTHING, HistorySort())}


def outcomes(since: datetime | None = None) -> tuple[int, int]:
    """(succeeded, failed) summed over the MetricBuckets seconds since ``since`` (None: all of them)."""
    points = storage.throughput(since or datetime(2000, 1, 1, tzinfo=UTC))
    return sum(p.succeeded for p in points), sum(p.failed for p in points)


def of_kind(seen: list[Any], kind: str) -> list[dict[str, Any]]:
    return [e.data for e in seen if str(e.kind) == kind]
