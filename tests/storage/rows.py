"""Build rows in a given lifecycle state through ``storage`` and read them back through the ORM.

The contract suite drives every transition through ``chokaq_core.storage``
(the only caller of the vendor SQL) and checks the outcome with plain ORM
reads, so a bug shared by a dialect's write and its own read cannot hide.
Time passes the same way on every backend: ``age(seconds)`` moves the stored
timestamps of existing rows into the past (what a clock advancing by that
much looks like to them), and ``backdate`` sets chosen Hot columns to a time
ago — with the backend's own statements or ORM ``update()`` calls, never
through the code under test and never by patching a clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, timedelta
from itertools import count
from typing import Any

from django.db import connections, router
from django.db.models import DateTimeField, Max, Model, Sum
from django.utils import timezone

from chokaq_core import storage
from chokaq_core.domain import AttemptError, Failure, FailureReason, HotJob, NewJob, Success, new_ulid
from chokaq_core.models import JobsArchive, JobsDLQ, JobsHot, MetricBuckets, Queues, StatsSummary, Workers

_serial = count(1)


def new_job(
    queue: str = "main",
    *,
    id: str | None = None,
    type: str = "test.ok.v1",
    payload: str | None = None,
    tags: str | None = None,
    key: str | None = None,
    priority: int = 10,
    delay: float | None = None,
    created_by: str | None = None,
    rate_key: str | None = None,
) -> NewJob:
    return NewJob(
        id=id or new_ulid(),
        queue=queue,
        type=type,
        payload=payload if payload is not None else json.dumps({"n": next(_serial)}),
        tags=tags,
        idempotency_key=key,
        priority=priority,
        delay_seconds=delay,
        created_by=created_by,
        rate_key=rate_key,
    )


def pending(queue: str, n: int = 1, **fields: Any) -> list[str]:
    """Enqueue ``n`` due Pending rows; their ids in order."""
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
    """``n`` new rows of ``queue`` past the lease gate of ``worker`` (attempt 1)."""
    jobs = fetched(queue, worker, n, **fields)
    for job in jobs:
        assert storage.mark_processing(job, worker) == 1
    return [storage.get_hot(j.id) for j in jobs]  # type: ignore[misc]


def dead(
    queue: str, n: int = 1, *, reason: FailureReason = FailureReason.FATAL_ERROR, details: str = "boom",
    worker: str = "w-dlq", **fields: Any,
) -> list[str]:
    """``n`` new rows moved to the DLQ by their worker after one execution."""
    jobs = processing(queue, worker, n, **fields)
    done = storage.complete(worker, [], [], [Failure(j.id, reason, details) for j in jobs])
    assert sorted(i for i, _ in done.failed) == sorted(j.id for j in jobs)
    return [j.id for j in jobs]


def archived(queue: str, n: int = 1, *, duration_ms: float | None = 5.0, worker: str = "w-arc",
             **fields: Any) -> list[str]:
    """``n`` new rows archived by their worker after one execution."""
    jobs = processing(queue, worker, n, **fields)
    done = storage.complete(worker, [Success(j.id, duration_ms) for j in jobs], [], [])
    assert sorted(i for i, _ in done.archived) == sorted(j.id for j in jobs)
    return [j.id for j in jobs]


def raised(message: str, kind: type[BaseException] = ConnectionError) -> AttemptError:
    """What a failed execution raised: ``kind(message)`` with a long cause first, so its traceback is long and the
    exception line comes far from the start of the text (as in a real handler's failure)."""
    try:
        try:
            raise OSError("socket closed: " + "x" * 1200)
        except OSError as cause:
            raise kind(message) from cause
    except BaseException as exc:
        return AttemptError.of(exc)


# ---------------------------------------------------------------- ORM reads


def hot(job_id: str) -> dict[str, Any] | None:
    return JobsHot.objects.filter(id=job_id).values().first()


def archive_row(job_id: str) -> dict[str, Any] | None:
    return JobsArchive.objects.filter(id=job_id).values().first()


def dlq_row(job_id: str) -> dict[str, Any] | None:
    return JobsDLQ.objects.filter(id=job_id).values().first()


def stats(queue: str) -> dict[str, Any] | None:
    return StatsSummary.objects.filter(queue=queue).values().first()


def counters(queue: str) -> tuple[int, int, int]:
    """(succeeded_total, failed_total, retried_total) of ``queue``; the row must exist."""
    row = stats(queue)
    assert row is not None, f"no StatsSummary row for {queue!r}"
    return row["succeeded_total"], row["failed_total"], row["retried_total"]


def purged(queue: str) -> int:
    """``purged_total`` of ``queue``: Archive rows purged (``succeeded_total`` never shrinks)."""
    row = stats(queue)
    assert row is not None, f"no StatsSummary row for {queue!r}"
    return int(row["purged_total"])


def set_counters(queue: str, **values: int) -> None:
    assert StatsSummary.objects.filter(queue=queue).update(**values) == 1


def buckets(queue: str, outcome: int, reason: int) -> dict[str, Any]:
    """Sums over every bucket second of (queue, outcome, reason): robust to a second boundary."""
    agg = MetricBuckets.objects.filter(queue=queue, outcome=outcome, failure_reason=reason).aggregate(
        completed=Sum("completed_count"), timed=Sum("duration_count"), total=Sum("total_duration_ms"),
        max=Max("max_duration_ms"),
    )
    return {"completed": agg["completed"] or 0, "timed": agg["timed"] or 0, "total": agg["total"] or 0.0,
            "max": agg["max"]}


def all_buckets() -> list[dict[str, Any]]:
    return list(MetricBuckets.objects.order_by("bucket_start", "queue", "outcome", "failure_reason").values())


# ---------------------------------------------------------------- time


def ago(seconds: float) -> datetime:
    """An aware UTC time ``seconds`` ago, never on a whole second.

    Django's SQLite adapter drops ``.000000`` from whole seconds while the
    SQLite dialect always writes microseconds; avoiding whole seconds keeps
    ORM-written backdated values comparable as text.
    """
    value = timezone.now() - timedelta(seconds=seconds)
    return value if value.microsecond else value.replace(microsecond=1)


def close_to(value: datetime | None, expected: datetime, tolerance: float = 5.0) -> bool:
    return value is not None and abs((value - expected).total_seconds()) <= tolerance


def backdate(ids: Iterable[str], seconds: float, *fields_: str) -> None:
    """Set the given Hot timestamp columns of ``ids`` to ``seconds`` ago."""
    when = ago(seconds)
    ids = list(ids)
    assert JobsHot.objects.filter(id__in=ids).update(**{f: when for f in fields_}) == len(ids)


AGED: tuple[type[Model], ...] = (JobsHot, JobsArchive, JobsDLQ, StatsSummary, Queues, Workers)


def age(seconds: int, tables: Iterable[type[Model]] = AGED) -> None:
    """Move every stored timestamp of ``tables`` ``seconds`` (whole) into the past, in one statement per table
    written for the backend's column type. MetricBuckets are not aged by default: a bucket's second is part of
    its key (age it alone, while it has one row per queue and outcome)."""
    connection = connections[router.db_for_write(JobsHot)]
    for model in tables:
        columns = [f.column for f in model._meta.concrete_fields if isinstance(f, DateTimeField)]
        if connection.vendor == "sqlite":  # text: shift the whole seconds, keep the fraction as written (the
            # date functions read only the first 19 characters: they round to milliseconds, so a fraction of
            # .9995 or more would carry into the seconds and the row would not move at all)
            shifted = "strftime('%Y-%m-%d %H:%M:%S', substr({c}, 1, 19), '-{n} seconds') || substr({c}, 20)"
        elif connection.vendor == "postgresql":
            shifted = "{c} - make_interval(secs => {n})"
        else:
            shifted = "DATEADD(second, -{n}, {c})"
        sets = ", ".join(f"{c} = {shifted.format(c=c, n=int(seconds))}" for c in columns)
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {model._meta.db_table} SET {sets}")


def hot_ids(queue: str | None = None) -> set[str]:
    return set(JobsHot.objects.filter(**({"queue": queue} if queue else {})).values_list("id", flat=True))


def archive_ids(queue: str | None = None) -> set[str]:
    return set(JobsArchive.objects.filter(**({"queue": queue} if queue else {})).values_list("id", flat=True))


def dlq_ids(queue: str | None = None) -> set[str]:
    return set(JobsDLQ.objects.filter(**({"queue": queue} if queue else {})).values_list("id", flat=True))


def of_kind(seen: list[Any], kind: str) -> list[dict[str, Any]]:
    """The ``data`` of every published event of ``kind`` (e.g. "JobUpdated")."""
    return [e.data for e in seen if str(e.kind) == kind]
