"""In-memory transitions (``CHOKAQ["STORAGE"] = "memory"``, spec 03 §15).

The same interface and transition rules as ``sqlite.py`` — guards, counters,
buckets, ordering, bulkheads, keyset paging — over lock-guarded dictionaries,
one per table. It lives in one process and is lost on exit, so the worker
must run in the same process (``chokaq_core.testing.run_until_idle``).

* ``cursor`` is unused (storage passes None).
* One process-wide re-entrant lock serializes every function; ``atomic()``
  (which ``storage.run`` opens around each storage operation) adds an undo
  journal, so an operation that raises — an id clash, a failing step of a
  multi-function transition — leaves every table as it found it, like a
  rolled-back transaction. Rows are immutable: each change replaces the row
  and journals the old one.
* The "database clock" is :func:`clock`; tests may monkeypatch it (it must
  return an aware datetime). Every stored datetime is aware UTC.
* SQL semantics kept on purpose: ``NULL`` never equals anything (owner
  guards), LIKE searches are ASCII-case-insensitive substrings, a negative
  LIMIT means no limit, keyset comparisons follow SQLite's type order
  (NULL < numbers < text) with datetimes compared as SQLite's stored text.
* Soft cap ``IN_MEMORY.MAX_CAPACITY``: an enqueue that finds Hot + Archive +
  DLQ ≥ cap evicts the 1,000 oldest Archive rows (by finish time), then, if
  still at cap, the 500 oldest DLQ rows (by failure time), decrementing their
  counters as a purge does; Hot rows are never evicted.
"""

from __future__ import annotations

import functools
import heapq
import logging
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError

from chokaq_core.conf import config
from chokaq_core.domain import (
    INDEXED_SORTS,
    ArchivedJob,
    Attempt,
    BulkPreview,
    DeadJob,
    DeckSnapshot,
    ErrorGroup,
    FailedAttempt,
    Failure,
    FailureReason,
    HistorySort,
    HotJob,
    JobFilter,
    JobRow,
    JobStatus,
    MetricPoint,
    NewJob,
    QueueLag,
    QueueState,
    QueueStats,
    Retry,
    SnapshotRequest,
    Success,
    SummaryStats,
    WorkerInfo,
)
from chokaq_core.sql import DIALECT_FUNCTIONS

logger = logging.getLogger("chokaq.storage.memory")

Cursor = Any
Moved = list[tuple[str, str]]

# Every function only touches process memory under one lock: nothing needs a database transaction.
AUTOCOMMIT_SAFE = frozenset(DIALECT_FUNCTIONS)
ZOMBIE_DETAILS = "Zombie: Worker heartbeat expired during execution"
UNKNOWN_ERROR = "Unknown error (No details provided)"  # spec 01 §4.6: the text stored for empty details
TOP_ERRORS_SAMPLE = 5000
EMPTY_ERROR = "(empty error details)"
EVICT_ARCHIVE_ROWS = 1000  # spec 03 §15
EVICT_DLQ_ROWS = 500


def clock() -> datetime:
    """The storage clock (the database clock of the SQL modes). Tests may replace it."""
    return datetime.now(UTC)


def _now() -> datetime:
    return clock().astimezone(UTC)


def _utc(value: datetime) -> datetime:
    """As ``sqlite._ts`` reads a parameter: aware values converted, naive ones taken as local time."""
    return value.astimezone(UTC)


def _ts(value: datetime) -> str:
    """SQLite's stored text of a datetime (how the SQL module compares mixed keyset values)."""
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


# ---------------------------------------------------------------- rows (one dataclass per table)


@dataclass(frozen=True, slots=True)
class _Hot:
    seq: int  # insertion order, SQLite's rowid: the last tie-breaker of every ordering
    id: str
    queue: str
    type: str
    payload: str | None
    tags: str | None
    idempotency_key: str | None
    priority: int
    status: int
    attempt_count: int
    worker_id: str | None
    heartbeat_at: datetime | None
    scheduled_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    last_updated_at: datetime
    created_by: str | None
    last_modified_by: str | None
    cancel_requested_by: str | None = None


@dataclass(frozen=True, slots=True)
class _Archive:
    seq: int
    id: str
    queue: str
    type: str
    payload: str | None
    tags: str | None
    attempt_count: int
    worker_id: str | None
    created_by: str | None
    last_modified_by: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime
    duration_ms: float | None
    result: str | None


@dataclass(frozen=True, slots=True)
class _Dead:
    seq: int
    id: str
    queue: str
    type: str
    payload: str | None
    tags: str | None
    failure_reason: int
    error_details: str | None
    attempt_count: int
    worker_id: str | None
    created_by: str | None
    last_modified_by: str | None
    created_at: datetime
    failed_at: datetime
    previous_payload: str | None = None


@dataclass(frozen=True, slots=True)
class _Stats:
    queue: str
    succeeded_total: int
    failed_total: int
    retried_total: int
    last_activity_at: datetime | None


BucketKey = tuple[datetime, str, int, int]  # (bucket_start, queue, outcome, failure_reason)


@dataclass(frozen=True, slots=True)
class _Bucket:
    completed_count: int
    duration_count: int
    total_duration_ms: float
    max_duration_ms: float | None
    last_updated_at: datetime


@dataclass(frozen=True, slots=True)
class _Queue:
    name: str
    is_paused: bool
    is_active: bool
    zombie_timeout_seconds: int | None
    max_workers: int | None
    last_updated_at: datetime


@dataclass(frozen=True, slots=True)
class _Worker:
    worker_id: str
    hostname: str
    pid: int
    queues: str
    started_at: datetime
    last_heartbeat_at: datetime
    stopped_at: datetime | None
    is_running: bool
    capacity: int
    active_count: int
    runtime_json: str
    circuits_json: str


@dataclass(frozen=True, slots=True)
class _Schedule:
    name: str
    last_tick_at: datetime
    updated_at: datetime


class _Tables:
    def __init__(self) -> None:
        self.hot: dict[str, _Hot] = {}
        self.keys: dict[str, str] = {}  # the unique index on Hot idempotency keys: key → job id
        self.archive: dict[str, _Archive] = {}
        self.dlq: dict[str, _Dead] = {}
        self.stats: dict[str, _Stats] = {}
        self.buckets: dict[BucketKey, _Bucket] = {}
        self.queues: dict[str, _Queue] = {}
        self.workers: dict[str, _Worker] = {}
        self.schedules: dict[str, _Schedule] = {}
        self.attempts: dict[int, Attempt] = {}  # the attempts history: insertion seq → row
        self.seq = 0

    def clear(self) -> None:
        for table in (self.hot, self.keys, self.archive, self.dlq, self.stats, self.buckets, self.queues,
                      self.workers, self.schedules, self.attempts):
            table.clear()
        self.seq = 0


_db = _Tables()
_lock = threading.RLock()
_MISSING: Any = object()
_journal: list[tuple[dict[Any, Any], Any, Any]] | None = None  # (table, key, previous row or _MISSING)


# ---------------------------------------------------------------- transactions


@contextmanager
def atomic() -> Iterator[None]:
    """Hold the storage lock; on an exception undo every change made inside the block (a savepoint
    when nested), then re-raise."""
    global _journal
    with _lock:
        outer = _journal is None
        if outer:
            _journal = []
        assert _journal is not None
        mark = len(_journal)
        try:
            yield
        except BaseException:
            _undo(mark)
            raise
        finally:
            if outer:
                _journal = None


def _undo(mark: int) -> None:
    journal = _journal
    if journal is None:
        return
    while len(journal) > mark:
        table, key, previous = journal.pop()
        if previous is _MISSING:
            table.pop(key, None)
        else:
            table[key] = previous


def run[T](operation: Callable[[Any], T]) -> T:
    """``operation(None)`` as one atomic unit (what ``storage.run`` does in memory mode)."""
    with atomic():
        return operation(None)


def reset() -> None:
    """Forget every row of every table (tests)."""
    with _lock:
        _db.clear()
        if _journal is not None:
            _journal.clear()


def _transition[**P, R](func: Callable[P, R]) -> Callable[P, R]:
    """Run a dialect function as one atomic unit (joins an enclosing ``atomic()``)."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with atomic():
            return func(*args, **kwargs)

    return wrapper


def _put(table: dict[Any, Any], key: Any, row: Any) -> None:
    if _journal is not None:
        _journal.append((table, key, table.get(key, _MISSING)))
    table[key] = row


def _pop(table: dict[Any, Any], key: Any) -> Any:
    row = table.pop(key)
    if _journal is not None:
        _journal.append((table, key, row))
    return row


def _next_seq() -> int:
    _db.seq += 1
    return _db.seq


def _hot_insert(row: _Hot) -> None:
    if row.id in _db.hot:
        raise IntegrityError(f"UNIQUE constraint failed: chokaq_jobs_hot.id ({row.id})")
    _put(_db.hot, row.id, row)
    if row.idempotency_key is not None:
        _put(_db.keys, row.idempotency_key, row.id)


def _hot_delete(job_id: str) -> _Hot:
    row: _Hot = _pop(_db.hot, job_id)
    if row.idempotency_key is not None and _db.keys.get(row.idempotency_key) == row.id:
        _pop(_db.keys, row.idempotency_key)
    return row


def _hot_update(row: _Hot, **changes: Any) -> _Hot:
    new = replace(row, **changes)
    _put(_db.hot, row.id, new)
    return new


def _owned(value: str | None, worker_id: str | None) -> bool:
    """SQL ``column = %s``: NULL equals nothing."""
    return value is not None and worker_id is not None and value == worker_id


def _limit[T](rows: Iterable[T], limit: int) -> list[T]:
    """SQLite's LIMIT: a negative limit means none."""
    n = int(limit)
    items = list(rows)
    return items if n < 0 else items[:n]


def _unique(ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(ids))


def _by_seq[T: (_Hot, _Dead, _Archive)](rows: Iterable[T]) -> list[T]:
    return sorted(rows, key=lambda r: r.seq)


# ---------------------------------------------------------------- counters


def _bump_stats(column: str, counts: Counter[str], now: datetime) -> None:
    """Insert-or-increment one counter per queue (spec 01 §4.13)."""
    for queue, n in counts.items():
        row = _db.stats.get(queue)
        if row is None:
            values = {"succeeded_total": 0, "failed_total": 0, "retried_total": 0, column: n}
            _put(_db.stats, queue, _Stats(queue, last_activity_at=now, **values))
        else:
            _put(_db.stats, queue, replace(row, last_activity_at=now, **{column: getattr(row, column) + n}))


def _drop_stats(column: str, counts: Counter[str], now: datetime) -> None:
    """Update-only decrement floored at 0."""
    for queue, n in counts.items():
        row = _db.stats.get(queue)
        if row is not None:
            _put(_db.stats, queue, replace(row, last_activity_at=now, **{column: max(getattr(row, column) - n, 0)}))


def _bump_buckets(now: datetime, outcomes: Iterable[tuple[str, int, int, float | None]]) -> None:
    """Aggregate (queue, outcome, reason, duration) into the current second's buckets."""
    groups: dict[tuple[str, int, int], list[float | None]] = defaultdict(list)
    for queue, outcome, reason, duration in outcomes:
        groups[(queue, outcome, reason)].append(duration)
    start = now.replace(microsecond=0)
    for (queue, outcome, reason), durations in groups.items():
        timed = [float(d) for d in durations if d is not None]
        peak = max(timed) if timed else None
        key: BucketKey = (start, queue, outcome, reason)
        old = _db.buckets.get(key)
        if old is None:
            _put(_db.buckets, key, _Bucket(len(durations), len(timed), sum(timed), peak, now))
            continue
        if peak is None or (old.max_duration_ms is not None and peak <= old.max_duration_ms):
            peak = old.max_duration_ms
        _put(_db.buckets, key, _Bucket(old.completed_count + len(durations), old.duration_count + len(timed),
                                       old.total_duration_ms + sum(timed), peak, now))


def _delete_hot(ids: Iterable[str], guard: Callable[[_Hot], bool]) -> list[_Hot]:
    rows = _by_seq(row for i in _unique(ids) if (row := _db.hot.get(i)) is not None and guard(row))
    for row in rows:
        _hot_delete(row.id)
    return rows


def _worker_guard(worker_id: str | None) -> Callable[[_Hot], bool]:
    if worker_id is None:
        return lambda row: True
    return lambda row: _owned(row.worker_id, worker_id)


def _insert_dlq(
    rows: Sequence[_Hot], details: dict[str, tuple[int, str]], now: datetime, modified_by: str | None = None,
    keep_modifier: bool = True,
) -> Moved:
    for r in rows:
        if r.id in _db.dlq:
            raise IntegrityError(f"UNIQUE constraint failed: chokaq_jobs_dlq.id ({r.id})")
        reason, text = details[r.id]
        _put(_db.dlq, r.id, _Dead(
            _next_seq(), r.id, r.queue, r.type, r.payload, r.tags, reason, text, r.attempt_count, r.worker_id,
            r.created_by, r.last_modified_by if keep_modifier else modified_by, r.created_at, now,
        ))
    _bump_stats("failed_total", Counter(r.queue for r in rows), now)
    _bump_buckets(now, ((r.queue, 1, details[r.id][0], None) for r in rows))
    return [(r.id, r.queue) for r in rows]


# ---------------------------------------------------------------- capacity (spec 03 §15)


def _stored() -> int:
    return len(_db.hot) + len(_db.archive) + len(_db.dlq)


def _evict_if_full(now: datetime) -> None:
    cap = int(config().IN_MEMORY.MAX_CAPACITY)
    if _stored() < cap:
        return
    archived = heapq.nsmallest(EVICT_ARCHIVE_ROWS, _db.archive.values(), key=lambda r: (r.finished_at, r.id))
    for row in archived:
        _pop(_db.archive, row.id)
    _drop_stats("succeeded_total", Counter(r.queue for r in archived), now)
    dead: list[_Dead] = []
    if _stored() >= cap:
        dead = heapq.nsmallest(EVICT_DLQ_ROWS, _db.dlq.values(), key=lambda r: (r.failed_at, r.id))
        for dead_row in dead:
            _pop(_db.dlq, dead_row.id)
        _drop_stats("failed_total", Counter(r.queue for r in dead), now)
    level = logging.WARNING if archived or dead else logging.DEBUG  # Hot alone at the cap: nothing to evict
    logger.log(level, "in-memory storage at its capacity of %s rows: evicted %s Archive and %s DLQ rows", cap,
               len(archived), len(dead))


# ---------------------------------------------------------------- enqueue / claim


@_transition
def enqueue(cursor: Cursor, jobs: Sequence[NewJob]) -> list[str]:
    now = _now()
    if jobs:
        _evict_if_full(now)
    inserted: set[str] = set()
    for job in jobs:
        if job.idempotency_key is not None and job.idempotency_key in _db.keys:
            continue  # ON CONFLICT (idempotency_key) DO NOTHING
        scheduled = now + timedelta(seconds=job.delay_seconds) if job.delay_seconds is not None else None
        _hot_insert(_Hot(
            _next_seq(), job.id, job.queue, job.type, job.payload, job.tags, job.idempotency_key, job.priority, 0, 0,
            None, None, scheduled, now, None, now, job.created_by, None,
        ))
        inserted.add(job.id)
    result: list[str] = []
    for job in jobs:
        if job.id in inserted:
            result.append(job.id)
            continue
        holder = _db.keys.get(job.idempotency_key) if job.idempotency_key is not None else None
        result.append(holder if holder is not None else job.id)
    for queue in sorted({job.queue for job in jobs}):
        if queue not in _db.queues:
            _put(_db.queues, queue, _Queue(queue, False, True, None, None, now))
        if queue not in _db.stats:
            _put(_db.stats, queue, _Stats(queue, 0, 0, 0, now))
    return result


def _claim_order(row: _Hot) -> tuple[int, datetime, int]:
    return (-row.priority, row.scheduled_at or row.created_at, row.seq)


@_transition
def fetch_batch(cursor: Cursor, worker_id: str, limit: int, queues: Sequence[str] | None) -> list[HotJob]:
    if queues is not None and not queues:
        return []
    now = _now()
    wanted = set(queues) if queues is not None else None
    active: Counter[str] = Counter()
    due: dict[str, list[_Hot]] = defaultdict(list)
    for row in _db.hot.values():
        if row.status in (1, 2):
            active[row.queue] += 1
        elif row.status == 0 and (row.scheduled_at is None or row.scheduled_at <= now) and (
                wanted is None or row.queue in wanted):
            due[row.queue].append(row)
    candidates: list[_Hot] = []
    for queue, rows in due.items():
        control = _db.queues.get(queue)
        if control is not None and (control.is_paused or not control.is_active):
            continue
        if control is not None and control.max_workers is not None:  # bulkhead: cur + rank <= max_workers
            rows = sorted(rows, key=_claim_order)[: max(0, control.max_workers - active[queue])]
        candidates.extend(rows)
    picked = _limit(sorted(candidates, key=_claim_order), limit)
    return [_hot_job(_hot_update(row, status=1, worker_id=worker_id, last_updated_at=now)) for row in picked]


@_transition
def mark_processing(cursor: Cursor, job_id: str, worker_id: str) -> int | None:
    row = _db.hot.get(job_id)
    if row is None or row.status != 1 or not _owned(row.worker_id, worker_id):
        return None
    now = _now()
    return _hot_update(row, status=2, attempt_count=row.attempt_count + 1, started_at=now, heartbeat_at=now,
                       last_updated_at=now).attempt_count


@_transition
def mark_processing_batch(cursor: Cursor, job_ids: Sequence[str], worker_id: str) -> dict[str, int]:
    leased: dict[str, int] = {}
    now = _now()
    for job_id in _unique(job_ids):
        row = _db.hot.get(job_id)
        if row is not None and row.status == 1 and _owned(row.worker_id, worker_id):
            leased[job_id] = _hot_update(row, status=2, attempt_count=row.attempt_count + 1, started_at=now,
                                         heartbeat_at=now, last_updated_at=now).attempt_count
    return leased


@_transition
def keep_alive(cursor: Cursor, job_ids: Sequence[str], worker_id: str) -> list[str]:
    if not job_ids:
        return []
    now = _now()
    rows = _by_seq(row for i in _unique(job_ids) if (row := _db.hot.get(i)) is not None
                   and row.status == 2 and _owned(row.worker_id, worker_id))
    return [_hot_update(row, heartbeat_at=now, last_updated_at=now).id for row in rows]


@_transition
def cancel_requests(cursor: Cursor, worker_id: str) -> list[tuple[str, str]]:
    return [(row.id, row.cancel_requested_by) for row in _by_seq(_db.hot.values())
            if row.status == 2 and _owned(row.worker_id, worker_id) and row.cancel_requested_by is not None]


# ---------------------------------------------------------------- completion


@_transition
def archive_succeeded(cursor: Cursor, worker_id: str | None, items: Sequence[Success]) -> Moved:
    if not items:
        return []
    now = _now()
    durations = {item.job_id: item.duration_ms for item in items}
    results = {item.job_id: item.result for item in items}
    rows = _delete_hot(durations, _worker_guard(worker_id))
    if not rows:
        return []
    for r in rows:
        if r.id in _db.archive:
            raise IntegrityError(f"UNIQUE constraint failed: chokaq_jobs_archive.id ({r.id})")
        _put(_db.archive, r.id, _Archive(
            _next_seq(), r.id, r.queue, r.type, r.payload, r.tags, r.attempt_count, r.worker_id, r.created_by,
            r.last_modified_by, r.created_at, r.started_at, now, durations[r.id], results[r.id],
        ))
    _bump_stats("succeeded_total", Counter(r.queue for r in rows), now)
    _bump_buckets(now, ((r.queue, 0, -1, durations[r.id]) for r in rows))
    return [(r.id, r.queue) for r in rows]


@_transition
def move_to_dlq(cursor: Cursor, worker_id: str | None, items: Sequence[Failure]) -> Moved:
    if not items:
        return []
    details = {
        item.job_id: (int(item.reason), item.error_details if item.error_details and item.error_details.strip()
                      else UNKNOWN_ERROR)
        for item in items
    }
    rows = _delete_hot(details, _worker_guard(worker_id))
    return _insert_dlq(rows, details, _now()) if rows else []


@_transition
def reschedule_for_retry(cursor: Cursor, worker_id: str | None, items: Sequence[Retry]) -> Moved:
    now = _now()
    guard = _worker_guard(worker_id)
    moved: Moved = []
    for item in items:
        row = _db.hot.get(item.job_id)
        if row is None or not guard(row):
            continue
        _hot_update(row, status=0, attempt_count=item.attempt_count,
                    scheduled_at=now + timedelta(seconds=item.delay_seconds), worker_id=None, heartbeat_at=None,
                    cancel_requested_by=None, last_updated_at=now)
        moved.append((row.id, row.queue))
    _bump_stats("retried_total", Counter(queue for _, queue in moved), now)
    return moved


@_transition
def release_jobs(cursor: Cursor, job_ids: Sequence[str], worker_id: str) -> int:
    if not job_ids:
        return 0
    now = _now()
    rows = [row for i in _unique(job_ids) if (row := _db.hot.get(i)) is not None
            and row.status == 1 and _owned(row.worker_id, worker_id)]
    for row in rows:
        _hot_update(row, status=0, worker_id=None, last_updated_at=now)
    return len(rows)


# ---------------------------------------------------------------- operator commands


def _resurrect_rows(
    job_ids: Sequence[str], payload: str | None, tags: str | None, priority: int | None, actor: str | None,
) -> Moved:
    if not job_ids:
        return []
    now = _now()
    rows = _by_seq(row for i in _unique(job_ids) if (row := _db.dlq.get(i)) is not None)
    if not rows:
        return []
    for r in rows:
        _pop(_db.dlq, r.id)
    for r in rows:
        _hot_insert(_Hot(
            _next_seq(), r.id, r.queue, r.type, payload if payload is not None else r.payload,
            tags if tags is not None else r.tags, None, priority if priority is not None else 10, 0, 0, None, None,
            None, r.created_at, None, now, r.created_by, actor,
        ))
    _drop_stats("failed_total", Counter(r.queue for r in rows), now)
    return [(r.id, r.queue) for r in rows]


@_transition
def resurrect(
    cursor: Cursor, job_id: str, payload: str | None, tags: str | None, priority: int | None, actor: str | None
) -> bool:
    return bool(_resurrect_rows([job_id], payload, tags, priority, actor))


@_transition
def resurrect_batch(cursor: Cursor, job_ids: Sequence[str], actor: str | None) -> Moved:
    return _resurrect_rows(_unique(job_ids), None, None, None, actor)


@_transition
def cancel_batch(cursor: Cursor, job_ids: Sequence[str], actor: str | None) -> Moved:
    ids = _unique(job_ids)
    if not ids:
        return []
    rows = _delete_hot(ids, lambda row: row.status in (0, 1))
    if not rows:
        return []
    text = f"Cancelled by admin: {actor}" if actor else "Cancelled by admin (Batch)"
    details = {r.id: (int(FailureReason.CANCELLED), text) for r in rows}
    return _insert_dlq(rows, details, _now(), modified_by=actor, keep_modifier=False)


@_transition
def request_cancel(cursor: Cursor, job_ids: Sequence[str], actor: str) -> list[str]:
    if not job_ids:
        return []
    rows = _by_seq(row for i in _unique(job_ids) if (row := _db.hot.get(i)) is not None and row.status == 2)
    return [_hot_update(row, cancel_requested_by=actor).id for row in rows]


@_transition
def update_hot_data(
    cursor: Cursor, job_id: str, payload: str | None, tags: str | None, priority: int | None, actor: str | None
) -> bool:
    if payload is None and tags is None and priority is None:
        return False
    row = _db.hot.get(job_id)
    if row is None or row.status != 0:
        return False
    _hot_update(row, payload=payload if payload is not None else row.payload,
                tags=tags if tags is not None else row.tags,
                priority=priority if priority is not None else row.priority,
                last_modified_by=actor, last_updated_at=_now())
    return True


@_transition
def update_dlq_data(cursor: Cursor, job_id: str, payload: str | None, tags: str | None, actor: str | None) -> bool:
    if payload is None and tags is None:
        return False
    row = _db.dlq.get(job_id)
    if row is None:
        return False
    previous = row.payload if payload is not None and payload != row.payload else row.previous_payload
    _put(_db.dlq, job_id, replace(row, previous_payload=previous,
                                  payload=payload if payload is not None else row.payload,
                                  tags=tags if tags is not None else row.tags, last_modified_by=actor))
    return True


def _delete_dlq(rows: Sequence[_Dead]) -> Moved:
    if not rows:
        return []
    for row in rows:
        _pop(_db.dlq, row.id)
    moved = [(row.id, row.queue) for row in rows]
    _drop_stats("failed_total", Counter(q for _, q in moved), _now())
    return moved


@_transition
def purge_dlq_ids(cursor: Cursor, job_ids: Sequence[str], batch_size: int) -> Moved:
    ids = _unique(job_ids)
    if not ids:
        return []
    rows = sorted((row for i in ids if (row := _db.dlq.get(i)) is not None), key=lambda r: (r.failed_at, r.id))
    return _delete_dlq(_limit(rows, batch_size))


@_transition
def purge_dlq_older_than(cursor: Cursor, cutoff: datetime, batch_size: int) -> int:
    limit = _utc(cutoff)
    rows = sorted((r for r in _db.dlq.values() if r.created_at <= limit), key=lambda r: (r.created_at, r.id))
    return len(_delete_dlq(_limit(rows, batch_size)))


@_transition
def purge_archive(cursor: Cursor, cutoff: datetime, batch_size: int) -> int:
    limit = _utc(cutoff)
    rows = _limit(sorted((r for r in _db.archive.values() if r.finished_at < limit),
                         key=lambda r: (r.finished_at, r.id)), batch_size)
    for row in rows:
        _pop(_db.archive, row.id)
    _drop_stats("succeeded_total", Counter(r.queue for r in rows), _now())
    return len(rows)


# ---------------------------------------------------------------- maintenance


@_transition
def recover_abandoned(cursor: Cursor, fetched_timeout_s: float) -> int:
    now = _now()
    cutoff = now - timedelta(seconds=fetched_timeout_s)
    rows = [row for row in _db.hot.values() if row.status == 1 and row.last_updated_at < cutoff]
    for row in rows:
        _hot_update(row, status=0, worker_id=None, last_updated_at=now)
    return len(rows)


@_transition
def archive_zombies(cursor: Cursor, global_timeout_s: float) -> Moved:
    now = _now()
    cutoffs = {q.name: now - timedelta(seconds=q.zombie_timeout_seconds)
               for q in _db.queues.values() if q.zombie_timeout_seconds is not None}
    default_cutoff = now - timedelta(seconds=global_timeout_s)
    rows = _by_seq(row for row in _db.hot.values() if row.status == 2
                   and (row.heartbeat_at or row.last_updated_at) < cutoffs.get(row.queue, default_cutoff))
    for row in rows:
        _hot_delete(row.id)
    if not rows:
        return []
    details = {r.id: (int(FailureReason.ZOMBIE), ZOMBIE_DETAILS) for r in rows}
    return _insert_dlq(rows, details, now)


# ---------------------------------------------------------------- queue controls


def _upsert_queue(queue: str, column: str, value: Any) -> None:
    """Create the queue row (unpaused, visible, no limits) with one control set, or update that control."""
    now = _now()
    row = _db.queues.get(queue)
    if row is None:
        row = _Queue(queue, False, True, None, None, now)
    _put(_db.queues, queue, replace(row, last_updated_at=now, **{column: value}))


@_transition
def set_queue_paused(cursor: Cursor, queue: str, paused: bool) -> None:
    _upsert_queue(queue, "is_paused", bool(paused))


@_transition
def set_queue_zombie_timeout(cursor: Cursor, queue: str, seconds: int | None) -> None:
    _upsert_queue(queue, "zombie_timeout_seconds", seconds)


@_transition
def set_queue_max_workers(cursor: Cursor, queue: str, max_workers: int | None) -> None:
    _upsert_queue(queue, "max_workers", max_workers)


@_transition
def set_queue_active(cursor: Cursor, queue: str, active: bool) -> bool:
    row = _db.queues.get(queue)
    if row is None:
        return False
    _put(_db.queues, queue, replace(row, is_active=bool(active), is_paused=True, last_updated_at=_now()))
    return True


# ---------------------------------------------------------------- worker registry


@_transition
def upsert_worker(cursor: Cursor, info: WorkerInfo) -> None:
    now = _now()
    row = _db.workers.get(info.worker_id)
    if row is None:
        row = _Worker(info.worker_id, info.hostname, info.pid, info.queues, now, now, None, True, info.capacity,
                      info.active_count, info.runtime_json, info.circuits_json)
    else:
        row = replace(row, last_heartbeat_at=now, is_running=True, stopped_at=None, capacity=info.capacity,
                      active_count=info.active_count, queues=info.queues, runtime_json=info.runtime_json,
                      circuits_json=info.circuits_json)
    _put(_db.workers, info.worker_id, row)


@_transition
def stop_worker(cursor: Cursor, worker_id: str) -> None:
    row = _db.workers.get(worker_id)
    if row is not None:
        _put(_db.workers, worker_id, replace(row, is_running=False, stopped_at=_now(), active_count=0))


# ---------------------------------------------------------------- operations: health, retention, schedule (issue 5)


@_transition
def list_workers(cursor: Cursor) -> list[WorkerInfo]:
    rows = sorted(_db.workers.values(), key=lambda r: r.worker_id)
    rows.sort(key=lambda r: r.last_heartbeat_at, reverse=True)  # stable: worker id breaks ties
    return [
        WorkerInfo(r.worker_id, r.hostname, r.pid, r.queues, r.capacity, r.active_count, r.is_running,
                   r.runtime_json, r.circuits_json, r.started_at, r.last_heartbeat_at, r.stopped_at)
        for r in rows
    ]


@_transition
def purge_workers(cursor: Cursor, cutoff: datetime, batch_size: int) -> int:
    limit = _utc(cutoff)
    rows = _limit(sorted((r for r in _db.workers.values() if r.last_heartbeat_at < limit),
                         key=lambda r: (r.last_heartbeat_at, r.worker_id)), batch_size)
    for row in rows:
        _pop(_db.workers, row.worker_id)
    return len(rows)


@_transition
def purge_metric_buckets(cursor: Cursor, cutoff: datetime, batch_size: int) -> int:
    limit = _utc(cutoff)
    keys = _limit(sorted(k for k in _db.buckets if k[0] < limit), batch_size)
    for key in keys:
        _pop(_db.buckets, key)
    return len(keys)


def tidy_hot_table(cursor: Cursor, min_dead_rows: int) -> bool:
    """Nothing to do: there are no row versions in memory."""
    return False


@_transition
def claim_schedule_tick(cursor: Cursor, name: str, tick: datetime) -> bool:
    # The storage lock serializes the callers: the first to move the tick forward wins.
    now, at = _now(), _utc(tick)
    row = _db.schedules.get(name)
    if row is None:
        _put(_db.schedules, name, _Schedule(name, at, now))
        return False
    if not row.last_tick_at < at:
        return False
    _put(_db.schedules, name, _Schedule(name, at, now))
    return True


@_transition
def schedule_ticks(cursor: Cursor) -> dict[str, datetime]:
    return {name: row.last_tick_at for name, row in _db.schedules.items()}


def change_marker(cursor: Cursor) -> int | None:
    """None: the in-memory store lives in the worker's own process."""
    return None


# ---------------------------------------------------------------- reads


def _hot_job(r: _Hot) -> HotJob:
    return HotJob(
        id=r.id, queue=r.queue, type=r.type, payload=r.payload, tags=r.tags, idempotency_key=r.idempotency_key,
        priority=r.priority, status=JobStatus(r.status), attempt_count=r.attempt_count, worker_id=r.worker_id,
        heartbeat_at=r.heartbeat_at, scheduled_at=r.scheduled_at, created_at=r.created_at, started_at=r.started_at,
        last_updated_at=r.last_updated_at, created_by=r.created_by, last_modified_by=r.last_modified_by,
    )


@_transition
def queue_states(cursor: Cursor) -> list[QueueState]:
    return [QueueState(q.name, q.is_paused, q.is_active, q.zombie_timeout_seconds, q.max_workers)
            for q in sorted(_db.queues.values(), key=lambda q: q.name)]


@_transition
def summary_stats(cursor: Cursor) -> SummaryStats:
    by_status = Counter(row.status for row in _db.hot.values())
    stats = list(_db.stats.values())
    stamps = [s.last_activity_at for s in stats if s.last_activity_at is not None]
    return SummaryStats(
        pending=by_status[0], fetched=by_status[1], processing=by_status[2],
        succeeded_total=sum(s.succeeded_total for s in stats), failed_total=sum(s.failed_total for s in stats),
        retried_total=sum(s.retried_total for s in stats), last_activity_at=max(stamps) if stamps else None,
    )


@_transition
def queue_stats(cursor: Cursor) -> list[QueueStats]:
    counts = Counter((row.queue, row.status) for row in _db.hot.values())
    result = []
    for name in sorted(_db.queues):
        s = _db.stats.get(name)
        result.append(QueueStats(
            name, counts[(name, 0)], counts[(name, 1)], counts[(name, 2)], s.succeeded_total if s else 0,
            s.failed_total if s else 0, s.retried_total if s else 0, s.last_activity_at if s else None,
        ))
    return result


@_transition
def get_hot(cursor: Cursor, job_id: str) -> HotJob | None:
    row = _db.hot.get(job_id)
    return _hot_job(row) if row else None


@_transition
def get_archived(cursor: Cursor, job_id: str) -> ArchivedJob | None:
    r = _db.archive.get(job_id)
    if r is None:
        return None
    return ArchivedJob(r.id, r.queue, r.type, r.payload, r.tags, r.attempt_count, r.worker_id, r.created_by,
                       r.last_modified_by, r.created_at, r.started_at, r.finished_at, r.duration_ms, r.result)


@_transition
def get_dead(cursor: Cursor, job_id: str) -> DeadJob | None:
    r = _db.dlq.get(job_id)
    if r is None:
        return None
    return DeadJob(r.id, r.queue, r.type, r.payload, r.tags, FailureReason(r.failure_reason), r.error_details,
                   r.attempt_count, r.worker_id, r.created_by, r.last_modified_by, r.created_at, r.failed_at)


# ---------------------------------------------------------------- Deck reads and bulk commands (issue 3)

# Sort key → value per pillar (spec 04 §5, as sqlite.ARCHIVE_SORT / DLQ_SORT); unlisted keys sort by the date.
ARCHIVE_SORT: dict[str, Callable[[_Archive], Any]] = {
    "id": lambda r: r.id, "queue": lambda r: r.queue, "type": lambda r: r.type, "created": lambda r: r.created_at,
    "worker": lambda r: r.worker_id or "", "attempts": lambda r: r.attempt_count,
    "duration": lambda r: -1.0 if r.duration_ms is None else r.duration_ms, "date": lambda r: r.finished_at,
}
DLQ_SORT: dict[str, Callable[[_Dead], Any]] = {
    "id": lambda r: r.id, "queue": lambda r: r.queue, "type": lambda r: r.type, "created": lambda r: r.created_at,
    "worker": lambda r: r.worker_id or "", "attempts": lambda r: r.attempt_count,
    "reason": lambda r: r.failure_reason, "date": lambda r: r.failed_at,
}
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _fold(text: str) -> str:
    """SQLite LIKE folds ASCII letters only."""
    return text.translate(_ASCII_LOWER)


def _sql_order(value: Any) -> tuple[int, Any]:
    """SQLite's comparison order of mixed values: NULL < numbers < text; datetimes are stored text."""
    if value is None:
        return (0, 0)
    if isinstance(value, (bool, int, float)):
        return (1, float(value) if isinstance(value, float) else int(value))
    if isinstance(value, datetime):
        return (2, _ts(value))
    return (2, str(value))


def _matches(filters: JobFilter, row: _Hot | _Archive | _Dead, date: datetime,
             searched: Sequence[str | None]) -> bool:
    if filters.queue is not None and row.queue != filters.queue:
        return False
    if filters.type is not None and row.type != filters.type:
        return False
    if filters.job_id is not None and row.id != filters.job_id:  # an exact id (primary-key lookup)
        return False
    if filters.search:
        needle = _fold(filters.search)
        if not any(value is not None and needle in _fold(value) for value in searched):
            return False
    if filters.from_at is not None and date < _utc(filters.from_at):
        return False
    return filters.to_at is None or date <= _utc(filters.to_at)


def _dlq_match(filters: JobFilter, r: _Dead) -> bool:
    if filters.failure_reason is not None and r.failure_reason != int(filters.failure_reason):
        return False
    return _matches(filters, r, r.created_at, (r.id, r.type, r.tags, r.error_details))


def _keyset[T: (_Archive, _Dead)](
    pillar: str, rows: Iterable[T], date: Callable[[T], datetime], column: Callable[[T], Any],
    after_key: tuple[Any, str] | None, limit: int, sort: HistorySort,
) -> list[T]:
    """Rows ordered by (column, id) in the sort's direction, strictly after ``after_key``; for a sort no index
    serves, only among the newest ``sort.window`` rows (by the pillar's date, then id)."""
    if sort.window is not None and sort.key not in INDEXED_SORTS[pillar]:
        rows = _limit(sorted(rows, key=lambda r: (date(r), r.id), reverse=True), sort.window)
    keyed = [((_sql_order(column(r)), r.id), r) for r in rows]
    if after_key is not None:
        value, last_id = after_key
        bound = (_sql_order(value), last_id)
        keyed = [k for k in keyed if (k[0] < bound if sort.descending else k[0] > bound)]
    keyed.sort(key=lambda k: k[0], reverse=sort.descending)
    return [r for _, r in _limit(keyed, limit)]


def _archive_row(r: _Archive) -> JobRow:
    return JobRow(id=r.id, queue=r.queue, type=r.type, status=JobStatus.SUCCEEDED, attempt_count=r.attempt_count,
                  created_at=r.created_at, created_by=r.created_by, tags=r.tags, worker_id=r.worker_id,
                  started_at=r.started_at, finished_at=r.finished_at, duration_ms=r.duration_ms)


def _dlq_row(r: _Dead) -> JobRow:
    reason = FailureReason(r.failure_reason)
    return JobRow(id=r.id, queue=r.queue, type=r.type, status=reason.shown_status, attempt_count=r.attempt_count,
                  created_at=r.created_at, created_by=r.created_by, tags=r.tags, worker_id=r.worker_id,
                  finished_at=r.failed_at, failure_reason=reason,
                  error_head=r.error_details[:400] if r.error_details is not None else None)


@_transition
def list_active(cursor: Cursor, filters: JobFilter, limit: int) -> list[JobRow]:
    rows = [r for r in _db.hot.values()
            if (filters.status is None or r.status == int(filters.status))
            and _matches(filters, r, r.created_at, (r.id, r.type, r.tags, r.idempotency_key))]
    rows.sort(key=lambda r: (r.created_at, r.id), reverse=True)
    return [
        JobRow(id=r.id, queue=r.queue, type=r.type, status=JobStatus(r.status), attempt_count=r.attempt_count,
               created_at=r.created_at, priority=r.priority, created_by=r.created_by, tags=r.tags,
               worker_id=r.worker_id, scheduled_at=r.scheduled_at, started_at=r.started_at)
        for r in _limit(rows, limit)
    ]


@_transition
def list_archive(
    cursor: Cursor, filters: JobFilter, after_key: tuple[Any, str] | None, limit: int, sort: HistorySort
) -> list[JobRow]:
    rows = (r for r in _db.archive.values() if _matches(filters, r, r.finished_at, (r.id, r.type, r.tags)))
    column = ARCHIVE_SORT.get(sort.key, ARCHIVE_SORT["date"])
    return [_archive_row(r) for r in _keyset("archive", rows, lambda r: r.finished_at, column, after_key, limit,
                                              sort)]


@_transition
def list_dlq(
    cursor: Cursor, filters: JobFilter, after_key: tuple[Any, str] | None, limit: int, sort: HistorySort
) -> list[JobRow]:
    rows = (r for r in _db.dlq.values() if _dlq_match(filters, r))
    column = DLQ_SORT.get(sort.key, DLQ_SORT["date"])
    return [_dlq_row(r) for r in _keyset("dlq", rows, lambda r: r.failed_at, column, after_key, limit, sort)]


@_transition
def locate_jobs(cursor: Cursor, job_ids: Sequence[str]) -> dict[str, JobStatus]:
    ids = _unique(job_ids)
    found: dict[str, JobStatus] = {}
    for job_id in ids:
        if (row := _db.hot.get(job_id)) is not None:
            found[job_id] = JobStatus(row.status)
    for job_id in ids:
        if job_id in _db.archive:
            found[job_id] = JobStatus.SUCCEEDED
    for job_id in ids:
        if (dead := _db.dlq.get(job_id)) is not None:
            found[job_id] = FailureReason(dead.failure_reason).shown_status
    return found


@_transition
def throughput(cursor: Cursor, since: datetime) -> list[MetricPoint]:
    start = _utc(since)
    sums: dict[datetime, list[int]] = defaultdict(lambda: [0, 0])
    for (bucket_start, _queue, outcome, _reason), bucket in _db.buckets.items():
        if bucket_start < start:
            continue
        counts = sums[bucket_start]  # the SQL groups every bucket second, whatever its outcome
        if outcome in (0, 1):
            counts[outcome] += bucket.completed_count
    return [MetricPoint(at, ok, failed) for at, (ok, failed) in sorted(sums.items())]


@_transition
def queue_health(cursor: Cursor) -> list[QueueLag]:
    now = _now()
    lags: dict[str, list[float]] = defaultdict(list)
    for row in _db.hot.values():
        if row.status == 0 and (row.scheduled_at is None or row.scheduled_at <= now):
            lags[row.queue].append(max(0.0, (now - (row.scheduled_at or row.created_at)).total_seconds()))
    result = []
    for name in sorted(_db.queues):
        values = lags.get(name, [])
        result.append(QueueLag(name, len(values), sum(values) / len(values) if values else 0.0,
                               max(values) if values else 0.0))
    return result


@_transition
def top_errors(cursor: Cursor, limit: int) -> list[ErrorGroup]:
    recent = sorted(_db.dlq.values(), key=lambda r: (r.failed_at, r.seq), reverse=True)[:TOP_ERRORS_SAMPLE]
    counts: Counter[tuple[int, str]] = Counter()
    latest: dict[tuple[int, str], datetime] = {}
    for r in recent:
        text = (r.error_details or "")[:4000].strip(" \t\n\r")
        prefix = EMPTY_ERROR if text == "" else text[:160].replace("\r", " ").replace("\n", " ")
        key = (r.failure_reason, prefix)
        counts[key] += 1
        if key not in latest or r.failed_at > latest[key]:
            latest[key] = r.failed_at
    ordered = sorted(counts, key=lambda k: (counts[k], latest[k]), reverse=True)
    return [ErrorGroup(FailureReason(k[0]), k[1], counts[k], latest[k]) for k in _limit(ordered, limit)]


def _dlq_pick(filters: JobFilter, max_jobs: int) -> list[_Dead]:
    rows = sorted((r for r in _db.dlq.values() if _dlq_match(filters, r)), key=lambda r: r.id)
    rows.sort(key=lambda r: r.failed_at, reverse=True)  # failed_at desc, id asc
    return _limit(rows, max_jobs)


@_transition
def preview_dlq_bulk(cursor: Cursor, filters: JobFilter, max_jobs: int) -> BulkPreview:
    matched = sum(1 for r in _db.dlq.values() if _dlq_match(filters, r))
    sample = [r.id for r in _dlq_pick(filters, min(max_jobs, 10))] if matched else []
    return BulkPreview(matched, min(matched, max_jobs), matched > max_jobs, sample)


@_transition
def purge_dlq_by_filter(cursor: Cursor, filters: JobFilter, max_jobs: int) -> Moved:
    return _delete_dlq(_by_seq(_dlq_pick(filters, max_jobs)))


@_transition
def resurrect_dlq_by_filter(cursor: Cursor, filters: JobFilter, max_jobs: int, actor: str | None) -> Moved:
    return _resurrect_rows([r.id for r in _dlq_pick(filters, max_jobs)], None, None, None, actor)


@_transition
def purge_archive_ids(cursor: Cursor, job_ids: Sequence[str]) -> Moved:
    ids = _unique(job_ids)
    if not ids:
        return []
    rows = _by_seq(row for i in ids if (row := _db.archive.get(i)) is not None)
    for row in rows:
        _pop(_db.archive, row.id)
    moved = [(row.id, row.queue) for row in rows]
    _drop_stats("succeeded_total", Counter(q for _, q in moved), _now())
    return moved


@_transition
def count_archive_older_than(cursor: Cursor, cutoff: datetime) -> int:
    limit = _utc(cutoff)
    return sum(1 for r in _db.archive.values() if r.finished_at < limit)


@_transition
def count_dlq_older_than(cursor: Cursor, cutoff: datetime) -> int:
    limit = _utc(cutoff)
    return sum(1 for r in _db.dlq.values() if r.created_at <= limit)


# ---------------------------------------------------------------- the live Deck's one read (issue 7)


@_transition
def deck_snapshot(cursor: Cursor, request: SnapshotRequest) -> DeckSnapshot:
    """Every part from its own read, all under one hold of the storage lock: one consistent state."""
    since, queues = request.throughput_since, request.queues
    return DeckSnapshot(
        summary=summary_stats(cursor),
        active=list_active(cursor, JobFilter(), request.active_limit),
        located=locate_jobs(cursor, request.locate_ids),
        throughput=None if since is None else throughput(cursor, since),
        queue_states=queue_states(cursor) if queues else None,
        queue_stats=queue_stats(cursor) if queues else None,
        queue_lags=queue_health(cursor) if queues else None,
        workers=list_workers(cursor) if request.workers else None,
        errors=top_errors(cursor, request.errors_limit) if request.errors_limit > 0 else None,
    )


# ---------------------------------------------------------------- attempts history

@_transition
def record_attempts(cursor: Cursor, worker_id: str | None, attempts: Sequence[FailedAttempt]) -> None:
    now = _now()
    for a in attempts:
        _put(_db.attempts, _next_seq(), Attempt(a.job_id, a.attempt, worker_id, a.error.error_class,
                                                 a.error.message, a.error.traceback, now, a.started_at))


def job_attempts(cursor: Cursor, job_id: str) -> list[Attempt]:
    with _lock:
        return [row for _, row in sorted(_db.attempts.items()) if row.job_id == job_id]


@_transition
def purge_attempts(cursor: Cursor, cutoff: datetime, batch_size: int) -> int:
    limit = _utc(cutoff)
    keys = _limit(sorted((k for k, row in _db.attempts.items() if row.failed_at < limit),
                         key=lambda k: (_db.attempts[k].failed_at, k)), batch_size)
    for key in keys:
        _pop(_db.attempts, key)
    return len(keys)
