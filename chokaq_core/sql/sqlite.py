"""SQLite transitions (the embedded default).

Every transition runs inside ``transaction.atomic()``, which the project's
``transaction_mode = "IMMEDIATE"`` turns into ``BEGIN IMMEDIATE``: the write
lock is taken up front, so the read-then-write sequences below are
serialized without row locks. SQLite's clock is not usable (spec 01 §1.2):
``now`` is taken in Python and written in Django's text format, with
microseconds always present so text comparison orders correctly.
RETURNING cannot feed an INSERT in SQLite, hence the Python hand-off of the
deleted rows inside one transaction (spec 01 §3).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from chokaq_core.domain import (
    DeckSnapshot,
    FailedAttempt,
    Failure,
    FailureReason,
    HotJob,
    JobFilter,
    NewJob,
    Retry,
    SnapshotRequest,
    Success,
)
from chokaq_core.sql import Dialect
from chokaq_core.sql.base import (
    ACTIVE_SQL,
    ACTIVE_WIDTH,
    ARCHIVE,
    ARCHIVE_FIELDS,
    BUCKETS,
    CARRIED_REVISION,
    DLQ,
    DLQ_FIELDS,
    EMPTY_ERROR,
    ERROR_GROUP_WIDTH,
    HOT,
    HOT_FIELDS,
    LIST_WORKERS_SQL,
    QUEUE_STATES_SQL,
    QUEUE_STATS_SQL,
    QUEUES,
    REVISION_BUMP,
    SCHEDULES,
    SINGLE_STATEMENTS,
    STATS,
    SUMMARY_WIDTH,
    THROUGHPUT_SQL,
    TOP_ERRORS_SAMPLE,
    WORKERS,
    ZOMBIE_DETAILS,
    BaseDialect,
    cancel_details,
    dlq_row_sql,
    error_columns,
    error_details,
    hot_job,
    last_error_params,
    last_error_set,
    revision_guard,
    snapshot_of,
    summary_stats_sql,
)

Cursor = Any
Moved = list[tuple[str, str]]

HOT_COLUMNS = ", ".join(HOT_FIELDS)
ARCHIVE_COLUMNS = ", ".join(ARCHIVE_FIELDS)
DLQ_COLUMNS = ", ".join(DLQ_FIELDS)
# Columns a move carries out of Hot (indexes into a HOT_COLUMNS row).
_ID, _QUEUE, _TYPE, _PAYLOAD, _TAGS, _ATTEMPTS, _WORKER, _STARTED, _CREATED, _CREATED_BY, _MODIFIED_BY, _REVISION = (
    0, 1, 2, 3, 4, 8, 9, 13, 12, 15, 16, 17,
)
# "+status = n" (a unary plus) in statements that name their rows by id keeps SQLite on the primary key:
# without statistics it would otherwise walk every row of that status through hot_status_created.
# Functions storage may run without an explicit transaction: one statement, or reads.
PREPARED: frozenset[str] = frozenset()  # no preparing cursor: every statement as the driver runs it
ONE_STATEMENT_WITHOUT_KEYS: frozenset[str] = frozenset()
AUTOCOMMIT_SAFE = SINGLE_STATEMENTS | {"purge_workers", "purge_metric_buckets", "change_marker", "purge_attempts"}
MAX_ROWS_PER_INSERT = 500


def _now() -> datetime:
    return datetime.now(UTC)


def _ts(value: datetime | None) -> str | None:
    """Django's SQLite storage format for an aware UTC datetime."""
    if value is None:
        return None
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


def _marks(count: int) -> str:
    return ", ".join(["%s"] * count)


def _chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _sort_key(job: HotJob) -> tuple[int, datetime]:
    return (-job.priority, job.scheduled_at or job.created_at)


# ---------------------------------------------------------------- counters


def _bump_stats(cursor: Cursor, column: str, counts: Counter[str], now: str | None) -> None:
    """Insert-or-increment one counter per queue (spec 01 §4.13)."""
    for queue, n in counts.items():
        values = {"succeeded_total": 0, "failed_total": 0, "retried_total": 0, column: n}
        cursor.execute(
            f"INSERT INTO {STATS} (queue, {', '.join(values)}, last_activity_at) VALUES (%s, %s, %s, %s, %s)"
            f" ON CONFLICT (queue) DO UPDATE SET"
            f" {column} = {column} + excluded.{column}, last_activity_at = excluded.last_activity_at",
            [queue, *values.values(), now],
        )


def _drop_stats(cursor: Cursor, column: str, counts: Counter[str], now: str | None) -> None:
    """Update-only decrement floored at 0."""
    for queue, n in counts.items():
        cursor.execute(
            f"UPDATE {STATS} SET {column} = max({column} - %s, 0), last_activity_at = %s WHERE queue = %s",
            [n, now, queue],
        )


def _bump_buckets(cursor: Cursor, now: datetime, outcomes: Iterable[tuple[str, int, int, float | None]]) -> None:
    """Aggregate (queue, outcome, reason, duration) into the current second's buckets."""
    groups: dict[tuple[str, int, int], list[float | None]] = defaultdict(list)
    for queue, outcome, reason, duration in outcomes:
        groups[(queue, outcome, reason)].append(duration)
    bucket = _ts(now.replace(microsecond=0))
    stamp = _ts(now)
    for (queue, outcome, reason), durations in groups.items():
        timed = [d for d in durations if d is not None]
        cursor.execute(
            f"INSERT INTO {BUCKETS} (bucket_start, queue, outcome, failure_reason, completed_count, duration_count,"
            f" total_duration_ms, max_duration_ms, last_updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
            f" ON CONFLICT (bucket_start, queue, outcome, failure_reason) DO UPDATE SET"
            f" completed_count = completed_count + excluded.completed_count,"
            f" duration_count = duration_count + excluded.duration_count,"
            f" total_duration_ms = total_duration_ms + excluded.total_duration_ms,"
            f" max_duration_ms = CASE WHEN excluded.max_duration_ms IS NULL THEN max_duration_ms"
            f" WHEN max_duration_ms IS NULL OR excluded.max_duration_ms > max_duration_ms"
            f" THEN excluded.max_duration_ms ELSE max_duration_ms END,"
            f" last_updated_at = excluded.last_updated_at",
            [bucket, queue, outcome, reason, len(durations), len(timed), sum(timed),
             max(timed) if timed else None, stamp],
        )


def _delete_hot(cursor: Cursor, ids: Sequence[str], guard: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    cursor.execute(
        f"DELETE FROM {HOT} WHERE id IN ({_marks(len(ids))}) {guard} RETURNING {HOT_COLUMNS}", [*ids, *params]
    )
    return list(cursor.fetchall())


def _worker_guard(worker_id: str | None) -> tuple[str, list[Any]]:
    if worker_id is None:
        return "", []
    return "AND worker_id = %s", [worker_id]


def _insert_dlq(
    cursor: Cursor, rows: Sequence[tuple[Any, ...]], details: dict[str, tuple[Any, ...]], now: datetime,
    modified_by: str | None = None, keep_modifier: bool = True,
) -> Moved:
    """``details``: id → (reason, details[, error class, error message])."""
    stamp = _ts(now)
    values = [
        (r[_ID], r[_QUEUE], r[_TYPE], r[_PAYLOAD], r[_TAGS], details[r[_ID]][0], details[r[_ID]][1], r[_ATTEMPTS],
         r[_WORKER], r[_CREATED_BY], r[_MODIFIED_BY] if keep_modifier else modified_by, r[_CREATED], stamp,
         r[_REVISION] + 1,  # the row carries its revision, one up
         *(details[r[_ID]][2:] or (None, None)))
        for r in rows
    ]
    cursor.executemany(f"INSERT INTO {DLQ} ({DLQ_COLUMNS}) VALUES ({_marks(len(DLQ_FIELDS))})", values)
    _bump_stats(cursor, "failed_total", Counter(r[_QUEUE] for r in rows), stamp)
    _bump_buckets(cursor, now, ((r[_QUEUE], 1, details[r[_ID]][0], None) for r in rows))
    return [(r[_ID], r[_QUEUE]) for r in rows]


# ---------------------------------------------------------------- enqueue / claim


_OPEN = "coalesce(q.is_paused, 0) = 0 AND coalesce(q.is_active, 1) = 1"
# Queues with due-or-not Pending rows, found by a loose scan of hot_fetch_pending (one index probe per queue).
PENDING_QUEUES_SQL = f"""
WITH RECURSIVE pq(queue) AS (
    SELECT (SELECT queue FROM {HOT} INDEXED BY hot_fetch_pending WHERE status = 0 ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT h.queue FROM {HOT} h INDEXED BY hot_fetch_pending
            WHERE h.status = 0 AND h.queue > pq.queue ORDER BY h.queue LIMIT 1)
    FROM pq WHERE pq.queue IS NOT NULL)
SELECT pq.queue FROM pq LEFT JOIN {QUEUES} q ON q.name = pq.queue WHERE pq.queue IS NOT NULL AND {_OPEN}
"""
NAMED_QUEUES_SQL = f"""
SELECT DISTINCT j.value FROM json_each(%s) j LEFT JOIN {QUEUES} q ON q.name = j.value WHERE {_OPEN}
"""
# Per open queue, its first due rows in claim order, read in index order (no sort of the backlog): rows
# without a schedule through hot_fetch_pending (the unary + keeps "scheduled_at IS NULL" a filter, so SQLite
# walks the index in order), due scheduled rows through hot_pending_lag (a range, then a small sort).
_UNSCHEDULED_STREAM = f"""SELECT * FROM (
    SELECT h.id, h.queue, h.priority, h.created_at AS sort_at FROM {HOT} h INDEXED BY hot_fetch_pending
    WHERE h.queue = %s AND h.status = 0 AND +h.scheduled_at IS NULL
    ORDER BY h.priority DESC, h.scheduled_at, h.created_at LIMIT %s)"""
_SCHEDULED_STREAM = f"""SELECT * FROM (
    SELECT h.id, h.queue, h.priority, h.scheduled_at AS sort_at FROM {HOT} h INDEXED BY hot_pending_lag
    WHERE h.queue = %s AND h.status = 0 AND h.scheduled_at <= %s
    ORDER BY h.priority DESC, h.scheduled_at, h.created_at LIMIT %s)"""
MAX_STREAMED_QUEUES = 200  # two compound terms per queue; SQLite allows 500 per statement


def _claim_sql(window: str) -> str:
    """Rank the window per queue, apply the bulkheads, claim (spec 01 §4.2)."""
    return f"""
        WITH win AS ({window}),
        active AS (SELECT queue, count(*) AS n FROM {HOT}
                   WHERE status IN (1, 2) AND queue IN (SELECT name FROM {QUEUES} WHERE max_workers IS NOT NULL)
                   GROUP BY queue),
        cand AS (
            SELECT w.id, w.priority, w.sort_at, q.max_workers, coalesce(a.n, 0) AS cur,
                   row_number() OVER (PARTITION BY w.queue ORDER BY w.priority DESC, w.sort_at, w.id) AS rnk
            FROM win w LEFT JOIN {QUEUES} q ON q.name = w.queue
                       LEFT JOIN active a ON a.queue = w.queue),
        picked AS (SELECT id FROM cand WHERE max_workers IS NULL OR cur + rnk <= max_workers
                   ORDER BY priority DESC, sort_at, id LIMIT %s)
        UPDATE {HOT} SET status = 1, worker_id = %s, last_updated_at = %s
        WHERE id IN (SELECT id FROM picked) AND +status = 0  -- by primary key, not a walk of the status index
        RETURNING {HOT_COLUMNS}
        """


# ---------------------------------------------------------------- completion


# ---------------------------------------------------------------- operator commands


def _resurrect_rows(
    cursor: Cursor, job_ids: Sequence[str], payload: str | None, tags: str | None, priority: int | None,
    actor: str | None, revision: int | None = None,
) -> Moved:
    if not job_ids:
        return []
    now = _ts(_now())
    cursor.execute(
        f"DELETE FROM {DLQ} WHERE id IN ({_marks(len(job_ids))}) AND {revision_guard()}"
        f" RETURNING id, queue, type, payload, tags, created_by, created_at, {CARRIED_REVISION}",
        [*job_ids, revision],
    )
    rows = cursor.fetchall()
    if not rows:
        return []
    cursor.executemany(
        f"INSERT INTO {HOT} (id, queue, type, payload, tags, priority, status, attempt_count, created_at,"
        f" last_updated_at, created_by, last_modified_by, revision) VALUES ({_marks(6)}, 0, 0, {_marks(5)})",
        [(r[0], r[1], r[2], payload if payload is not None else r[3], tags if tags is not None else r[4],
          priority if priority is not None else 10, r[6], now, r[5], actor, r[7]) for r in rows],
    )
    _drop_stats(cursor, "failed_total", Counter(r[1] for r in rows), now)
    return [(r[0], r[1]) for r in rows]


# ---------------------------------------------------------------- maintenance


# ---------------------------------------------------------------- operations: retention, schedule, reads



LAST_ERROR_SET = last_error_set("%s", "%s", "%s", "%s")  # params: last_error_params
SUMMARY_STATS_SQL = summary_stats_sql("julianday(scheduled_at) > julianday('now')")
DLQ_ROW = dlq_row_sql("substr(error_details, -400)")

QUEUE_HEALTH_SQL = f"""
        SELECT q.name, coalesce(h.n, 0), coalesce(h.avg_lag, 0), coalesce(h.max_lag, 0)
        FROM {QUEUES} q LEFT JOIN (
            SELECT queue, count(*) AS n, avg(lag) AS avg_lag, max(lag) AS max_lag FROM (
                SELECT queue, max(0.0, (julianday(%s) - julianday(coalesce(scheduled_at, created_at))) * 86400.0)
                       AS lag
                FROM {HOT} WHERE status = 0 AND (scheduled_at IS NULL OR scheduled_at <= %s))
            GROUP BY queue) h ON h.queue = q.name
        ORDER BY q.name
"""


TOP_ERRORS_SQL = f"""
        WITH recent AS (
            SELECT failure_reason, failed_at, error_class, error_message,
                   CASE WHEN error_class IS NULL THEN trim(substr(coalesce(error_details, ''), 1, 4000),
                                                           ' ' || char(9) || char(10) || char(13)) END AS e
            FROM {DLQ} ORDER BY failed_at DESC LIMIT %s)
        SELECT failure_reason, CASE WHEN e IS NULL THEN '' WHEN e = '' THEN %s ELSE substr(e, 1, 160) END AS prefix,
               count(*) AS n, max(failed_at) AS latest, error_class, error_message
        FROM recent GROUP BY failure_reason, error_class, error_message, prefix ORDER BY n DESC, latest DESC LIMIT %s
"""


# ---------------------------------------------------------------- Deck bulk commands


def _delete_dlq(cursor: Cursor, ids: Sequence[str]) -> Moved:
    if not ids:
        return []
    cursor.execute(f"DELETE FROM {DLQ} WHERE id IN ({_marks(len(ids))}) RETURNING id, queue", list(ids))
    moved = [(row[0], row[1]) for row in cursor.fetchall()]
    _drop_stats(cursor, "failed_total", Counter(q for _, q in moved), _ts(_now()))
    return moved


# ---------------------------------------------------------------- the live Deck's one read (issue 7)


def _packed(sql: str, width: int) -> str:
    """A read as one JSON value: an array of positional rows in the read's own order (``sql.json_rows``)."""
    cols = ", ".join(f"c{i}" for i in range(width))
    return f"(WITH t({cols}) AS ({sql}) SELECT json_group_array(json_array({cols})) FROM t)"


def _snapshot_sql(locate: str) -> str:
    return f"""
SELECT {_packed(SUMMARY_STATS_SQL, SUMMARY_WIDTH)}, {_packed(ACTIVE_SQL.format(where=""), ACTIVE_WIDTH)},
       {_packed(locate, 2)},
       CASE WHEN %s THEN {_packed(THROUGHPUT_SQL, 3)} END,
       CASE WHEN %s THEN json_array(json({_packed(QUEUE_STATES_SQL, 5)}), json({_packed(QUEUE_STATS_SQL, 8)}),
                                    json({_packed(QUEUE_HEALTH_SQL, 4)})) END,
       CASE WHEN %s THEN {_packed(LIST_WORKERS_SQL, 12)} END,
       CASE WHEN %s THEN {_packed(TOP_ERRORS_SQL, ERROR_GROUP_WIDTH)} END
"""


# ---------------------------------------------------------------- attempts history

ATTEMPTS = "chokaq_job_attempts"
ATTEMPT_COLUMNS = "job_id, attempt, worker_id, error_class, error_message, traceback, failed_at, started_at"
ATTEMPT_ROWS_PER_INSERT = 100  # 8 parameters a row, within SQLite's host-parameter limit


PURGE_WORKERS_SQL = (f"DELETE FROM {WORKERS} WHERE worker_id IN (SELECT worker_id FROM {WORKERS}"
                     " WHERE last_heartbeat_at < %s ORDER BY last_heartbeat_at LIMIT %s)")
PURGE_METRIC_BUCKETS_SQL = (f"DELETE FROM {BUCKETS} WHERE rowid IN (SELECT rowid FROM {BUCKETS} WHERE bucket_start < %s"
                            " ORDER BY bucket_start LIMIT %s)")
PURGE_ATTEMPTS_SQL = (f"DELETE FROM {ATTEMPTS} WHERE id IN (SELECT id FROM {ATTEMPTS} WHERE failed_at < %s"
                      " ORDER BY failed_at LIMIT %s)")


class SQLiteDialect(BaseDialect, statements=globals()):
    """The shared reads over SQLite's text timestamps (the clock is Python's, spec 01 §1.2)."""

    PREPARED = PREPARED
    AUTOCOMMIT_SAFE = AUTOCOMMIT_SAFE
    ONE_STATEMENT_WITHOUT_KEYS = ONE_STATEMENT_WITHOUT_KEYS
    DLQ_ROW = DLQ_ROW

    def param_ts(self, value: datetime | None) -> Any:
        return _ts(value)

    def queue_health_params(self) -> list[Any]:
        now = _ts(_now())
        return [now, now]

    def now(self) -> tuple[str, list[Any]]:
        return "%s", [_ts(_now())]

    def enqueue(self, cursor: Cursor, jobs: Sequence[NewJob]) -> list[str]:
        now = _now()
        stamp = _ts(now)
        inserted: set[str] = set()
        for chunk in _chunks(jobs, MAX_ROWS_PER_INSERT):
            params: list[Any] = []
            for job in chunk:
                scheduled = _ts(now + timedelta(seconds=job.delay_seconds)) if job.delay_seconds is not None else None
                params += [job.id, job.queue, job.type, job.payload, job.tags, job.idempotency_key, job.priority,
                           scheduled, stamp, stamp, job.created_by]
            cursor.execute(
                f"INSERT INTO {HOT} (id, queue, type, payload, tags, idempotency_key, priority, status, attempt_count,"
                f" scheduled_at, created_at, last_updated_at, created_by) VALUES "
                + ", ".join(["(%s, %s, %s, %s, %s, %s, %s, 0, 0, %s, %s, %s, %s)"] * len(chunk))
                + " ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING RETURNING id",
                params,
            )
            inserted.update(row[0] for row in cursor.fetchall())
        result: list[str] = []
        for job in jobs:
            if job.id in inserted:
                result.append(job.id)
                continue
            cursor.execute(f"SELECT id FROM {HOT} WHERE idempotency_key = %s", [job.idempotency_key])
            row = cursor.fetchone()
            # Under BEGIN IMMEDIATE nobody can have removed the holder meanwhile.
            result.append(row[0] if row else job.id)
        for queue in sorted({job.queue for job in jobs}):
            cursor.execute(
                f"INSERT INTO {QUEUES} (name, is_paused, is_active, last_updated_at) VALUES (%s, 0, 1, %s)"
                " ON CONFLICT (name) DO NOTHING",
                [queue, stamp],
            )
            cursor.execute(
                f"INSERT INTO {STATS} (queue, succeeded_total, failed_total, retried_total, last_activity_at)"
                " VALUES (%s, 0, 0, 0, %s) ON CONFLICT (queue) DO NOTHING",
                [queue, stamp],
            )
        return result

    def fetch_batch(self, cursor: Cursor, worker_id: str, limit: int, queues: Sequence[str] | None) -> list[HotJob]:
        """Claim up to ``limit`` due rows; runs under ``BEGIN IMMEDIATE`` (two statements: open queues, claim).

        The scan window is the first 10 x limit due rows in claim order, as on PostgreSQL: per open queue two
        index-ordered streams, merged. Ranking only these keeps a claim cheap whatever the backlog (a queue's
        rows in the window are exactly its first rows, so the per-queue rank is the true one)."""
        if limit <= 0 or (queues is not None and not queues):
            return []
        now = _ts(_now())
        if queues is None:
            cursor.execute(PENDING_QUEUES_SQL)
        else:
            cursor.execute(NAMED_QUEUES_SQL, [json.dumps(sorted(set(queues)))])
        open_queues = sorted(row[0] for row in cursor.fetchall())
        if not open_queues:
            return []
        scan = limit * 10
        if len(open_queues) <= MAX_STREAMED_QUEUES:
            streams = " UNION ALL ".join(f"{_UNSCHEDULED_STREAM} UNION ALL {_SCHEDULED_STREAM}" for _ in open_queues)
            window = f"SELECT * FROM ({streams}) ORDER BY priority DESC, sort_at, id LIMIT %s"
            params: list[Any] = [p for name in open_queues for p in (name, scan, name, now, scan)] + [scan]
        else:  # very many queues: one ranked read of the due rows instead of 2 streams per queue
            window = f"""SELECT h.id, h.queue, h.priority, coalesce(h.scheduled_at, h.created_at) AS sort_at
                FROM {HOT} h WHERE h.status = 0 AND (h.scheduled_at IS NULL OR h.scheduled_at <= %s)
                  AND h.queue IN (SELECT value FROM json_each(%s))
                ORDER BY h.priority DESC, sort_at, h.id LIMIT %s"""
            params = [now, json.dumps(open_queues), scan]
        cursor.execute(_claim_sql(window), [*params, limit, worker_id, now])
        return sorted((hot_job(row) for row in cursor.fetchall()), key=_sort_key)

    def mark_processing(self, cursor: Cursor, job_id: str, worker_id: str) -> int | None:
        now = _ts(_now())
        cursor.execute(
            f"UPDATE {HOT} SET status = 2, attempt_count = attempt_count + 1, started_at = %s, heartbeat_at = %s,"
            f" last_updated_at = %s WHERE id = %s AND worker_id = %s AND +status = 1 RETURNING attempt_count",
            [now, now, now, job_id, worker_id],
        )
        row = cursor.fetchone()
        return int(row[0]) if row else None

    def mark_processing_batch(self, cursor: Cursor, job_ids: Sequence[str], worker_id: str) -> dict[str, int]:
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return {}
        now = _ts(_now())
        cursor.execute(
            f"UPDATE {HOT} SET status = 2, attempt_count = attempt_count + 1, started_at = %s, heartbeat_at = %s,"
            f" last_updated_at = %s WHERE id IN ({_marks(len(ids))}) AND worker_id = %s AND +status = 1"
            " RETURNING id, attempt_count",
            [now, now, now, *ids, worker_id],
        )
        return {row[0]: int(row[1]) for row in cursor.fetchall()}

    def keep_alive(self, cursor: Cursor, job_ids: Sequence[str], worker_id: str) -> list[str]:
        if not job_ids:
            return []
        now = _ts(_now())
        cursor.execute(
            f"UPDATE {HOT} SET heartbeat_at = %s, last_updated_at = %s"
            f" WHERE id IN ({_marks(len(job_ids))}) AND +status = 2 AND worker_id = %s RETURNING id",
            [now, now, *job_ids, worker_id],
        )
        return [row[0] for row in cursor.fetchall()]

    def cancel_requests(self, cursor: Cursor, worker_id: str) -> list[tuple[str, str]]:
        cursor.execute(
            f"SELECT id, cancel_requested_by FROM {HOT}"
            " WHERE worker_id = %s AND status = 2 AND cancel_requested_by IS NOT NULL",
            [worker_id],
        )
        return [(row[0], row[1]) for row in cursor.fetchall()]

    def archive_succeeded(self, cursor: Cursor, worker_id: str | None, items: Sequence[Success]) -> Moved:
        if not items:
            return []
        now = _now()
        stamp = _ts(now)
        durations = {item.job_id: item.duration_ms for item in items}
        results = {item.job_id: item.result for item in items}
        guard, params = _worker_guard(worker_id)
        rows = _delete_hot(cursor, list(durations), guard, params)
        if not rows:
            return []
        cursor.executemany(
            f"INSERT INTO {ARCHIVE} ({ARCHIVE_COLUMNS}) VALUES ({_marks(14)})",
            [(r[_ID], r[_QUEUE], r[_TYPE], r[_PAYLOAD], r[_TAGS], r[_ATTEMPTS], r[_WORKER], r[_CREATED_BY],
              r[_MODIFIED_BY], r[_CREATED], r[_STARTED], stamp, durations[r[_ID]], results[r[_ID]]) for r in rows],
        )
        _bump_stats(cursor, "succeeded_total", Counter(r[_QUEUE] for r in rows), stamp)
        _bump_buckets(cursor, now, ((r[_QUEUE], 0, -1, durations[r[_ID]]) for r in rows))
        return [(r[_ID], r[_QUEUE]) for r in rows]

    def move_to_dlq(self, cursor: Cursor, worker_id: str | None, items: Sequence[Failure]) -> Moved:
        if not items:
            return []
        details = {
            item.job_id: (int(item.reason), error_details(item.error_details), *error_columns(item)) for item in items
        }
        guard, params = _worker_guard(worker_id)
        rows = _delete_hot(cursor, list(details), guard, params)
        return _insert_dlq(cursor, rows, details, _now()) if rows else []

    def reschedule_for_retry(self, cursor: Cursor, worker_id: str | None, items: Sequence[Retry]) -> Moved:
        now = _now()
        stamp = _ts(now)
        guard, params = _worker_guard(worker_id)
        moved: Moved = []
        for item in items:
            error_class, error_message = error_columns(item)
            cursor.execute(
                f"UPDATE {HOT} SET status = 0, attempt_count = %s, scheduled_at = %s, worker_id = NULL,"
                f" heartbeat_at = NULL, cancel_requested_by = NULL, last_updated_at = %s, {LAST_ERROR_SET}"
                f" WHERE id = %s {guard} RETURNING id, queue",
                [item.attempt_count, _ts(now + timedelta(seconds=item.delay_seconds)), stamp,
                 *last_error_params(error_class, error_message, stamp, item.held_by), item.job_id, *params],
            )
            moved.extend((row[0], row[1]) for row in cursor.fetchall())
        _bump_stats(cursor, "retried_total", Counter(queue for _, queue in moved), stamp)
        return moved

    def release_jobs(self, cursor: Cursor, job_ids: Sequence[str], worker_id: str) -> int:
        if not job_ids:
            return 0
        cursor.execute(
            f"UPDATE {HOT} SET status = 0, worker_id = NULL, last_updated_at = %s"
            f" WHERE id IN ({_marks(len(job_ids))}) AND +status = 1 AND worker_id = %s",
            [_ts(_now()), *job_ids, worker_id],
        )
        return int(cursor.rowcount)

    def resurrect(self, cursor: Cursor, job_id: str, payload: str | None, tags: str | None, priority: int | None, actor: str | None,
        revision: int | None = None,
    ) -> bool:
        return bool(_resurrect_rows(cursor, [job_id], payload, tags, priority, actor, revision))

    def resurrect_batch(self, cursor: Cursor, job_ids: Sequence[str], actor: str | None) -> Moved:
        return _resurrect_rows(cursor, list(dict.fromkeys(job_ids)), None, None, None, actor)

    def cancel_batch(self, cursor: Cursor, job_ids: Sequence[str], actor: str | None) -> Moved:
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return []
        rows = _delete_hot(cursor, ids, "AND status IN (0, 1)", [])
        if not rows:
            return []
        details = {r[_ID]: (int(FailureReason.CANCELLED), cancel_details(actor)) for r in rows}
        return _insert_dlq(cursor, rows, details, _now(), modified_by=actor, keep_modifier=False)

    def request_cancel(self, cursor: Cursor, job_ids: Sequence[str], actor: str) -> list[str]:
        if not job_ids:
            return []
        cursor.execute(
            f"UPDATE {HOT} SET cancel_requested_by = %s WHERE id IN ({_marks(len(job_ids))}) AND +status = 2"
            " RETURNING id",
            [actor, *job_ids],
        )
        return [row[0] for row in cursor.fetchall()]

    def update_hot_data(self, cursor: Cursor, job_id: str, payload: str | None, tags: str | None, priority: int | None, actor: str | None,
        revision: int | None = None,
    ) -> bool:
        if payload is None and tags is None and priority is None:
            return False
        cursor.execute(
            f"UPDATE {HOT} SET payload = coalesce(%s, payload), tags = coalesce(%s, tags),"
            f" priority = coalesce(%s, priority), last_modified_by = %s, last_updated_at = %s, {REVISION_BUMP}"
            f" WHERE id = %s AND status = 0 AND {revision_guard()}",
            [payload, tags, priority, actor, _ts(_now()), job_id, revision],
        )
        return bool(cursor.rowcount)

    def update_dlq_data(self, cursor: Cursor, job_id: str, payload: str | None, tags: str | None, actor: str | None,
                        revision: int | None = None) -> bool:
        if payload is None and tags is None:
            return False
        cursor.execute(
            f"UPDATE {DLQ} SET previous_payload = CASE WHEN %s IS NOT NULL AND %s IS NOT payload"
            " THEN payload ELSE previous_payload END,"
            f" payload = coalesce(%s, payload), tags = coalesce(%s, tags), last_modified_by = %s, {REVISION_BUMP}"
            f" WHERE id = %s AND {revision_guard()}",
            [payload, payload, payload, tags, actor, job_id, revision],
        )
        return bool(cursor.rowcount)

    def purge_dlq_ids(self, cursor: Cursor, job_ids: Sequence[str], batch_size: int) -> Moved:
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return []
        cursor.execute(
            f"DELETE FROM {DLQ} WHERE id IN (SELECT id FROM {DLQ} WHERE id IN ({_marks(len(ids))})"
            " ORDER BY failed_at, id LIMIT %s) RETURNING id, queue",
            [*ids, batch_size],
        )
        moved = [(row[0], row[1]) for row in cursor.fetchall()]
        _drop_stats(cursor, "failed_total", Counter(q for _, q in moved), _ts(_now()))
        return moved

    def _purge_by_age(self, cursor: Cursor, table: str, older: str, order: str, counter: str, cutoff: datetime,
                      batch_size: int) -> int:
        """One batch of ``table`` rows matching ``older`` (a predicate on the cutoff); ``counter`` −n."""
        cursor.execute(f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE {older}"
                       f" ORDER BY {order}, id LIMIT %s) RETURNING queue", [_ts(cutoff), batch_size])
        counts = Counter(row[0] for row in cursor.fetchall())
        _drop_stats(cursor, counter, counts, _ts(_now()))
        return sum(counts.values())

    def purge_dlq_older_than(self, cursor: Cursor, cutoff: datetime, batch_size: int) -> int:
        return self._purge_by_age(cursor, DLQ, "created_at <= %s", "created_at", "failed_total", cutoff, batch_size)

    def purge_archive(self, cursor: Cursor, cutoff: datetime, batch_size: int) -> int:
        return self._purge_by_age(cursor, ARCHIVE, "finished_at < %s", "finished_at", "succeeded_total", cutoff,
                                  batch_size)

    def recover_abandoned(self, cursor: Cursor, fetched_timeout_s: float) -> int:
        now = _now()
        cursor.execute(
            f"UPDATE {HOT} SET status = 0, worker_id = NULL, last_updated_at = %s"
            " WHERE status = 1 AND last_updated_at < %s",
            [_ts(now), _ts(now - timedelta(seconds=fetched_timeout_s))],
        )
        return int(cursor.rowcount)

    def archive_zombies(self, cursor: Cursor, global_timeout_s: float) -> Moved:
        now = _now()
        # Per-queue cutoffs computed in Python: Django's text format allows no date arithmetic in SQL.
        cursor.execute(f"SELECT name, zombie_timeout_seconds FROM {QUEUES} WHERE zombie_timeout_seconds IS NOT NULL")
        overrides = {name: seconds for name, seconds in cursor.fetchall()}
        default_cutoff = _ts(now - timedelta(seconds=global_timeout_s))
        clauses = [f"queue NOT IN ({_marks(len(overrides))}) AND coalesce(heartbeat_at, last_updated_at) < %s"
                   if overrides else "coalesce(heartbeat_at, last_updated_at) < %s"]
        params: list[Any] = [*overrides, default_cutoff]
        for name, timeout in overrides.items():
            clauses.append("(queue = %s AND coalesce(heartbeat_at, last_updated_at) < %s)")
            params += [name, _ts(now - timedelta(seconds=timeout))]
        cursor.execute(
            f"DELETE FROM {HOT} WHERE status = 2 AND ({' OR '.join(f'({c})' for c in clauses)})"
            f" RETURNING {HOT_COLUMNS}",
            params,
        )
        rows = cursor.fetchall()
        if not rows:
            return []
        details = {r[_ID]: (int(FailureReason.ZOMBIE), ZOMBIE_DETAILS) for r in rows}
        return _insert_dlq(cursor, rows, details, now)

    def tidy_hot_table(self, cursor: Cursor, min_dead_rows: int) -> bool:
        """Nothing to do: SQLite reuses freed pages and keeps no dead row versions."""
        return False

    def claim_schedule_tick(self, cursor: Cursor, name: str, tick: datetime) -> bool:
        # BEGIN IMMEDIATE serializes the callers: the first to move the tick forward wins.
        stamp, at = _ts(_now()), _ts(tick)
        cursor.execute(
            f"INSERT INTO {SCHEDULES} (name, last_tick_at, updated_at) VALUES (%s, %s, %s) ON CONFLICT (name) DO NOTHING",
            [name, at, stamp],
        )
        if cursor.rowcount:
            return False
        cursor.execute(
            f"UPDATE {SCHEDULES} SET last_tick_at = %s, updated_at = %s WHERE name = %s AND last_tick_at < %s",
            [at, stamp, name, at],
        )
        return bool(cursor.rowcount)

    def change_marker(self, cursor: Cursor) -> int | None:
        """Changes whenever another connection commits; read without a lock (the WAL index)."""
        cursor.execute("PRAGMA data_version")
        return int(cursor.fetchone()[0])

    def _dlq_pick(self, cursor: Cursor, filters: JobFilter, max_jobs: int) -> list[str]:
        where, params = self.dlq_where(filters)
        cursor.execute(f"SELECT id FROM {DLQ}{where} ORDER BY failed_at DESC, id ASC LIMIT %s", [*params, max_jobs])
        return [r[0] for r in cursor.fetchall()]

    def purge_dlq_by_filter(self, cursor: Cursor, filters: JobFilter, max_jobs: int) -> Moved:
        return _delete_dlq(cursor, self._dlq_pick(cursor, filters, max_jobs))

    def resurrect_dlq_by_filter(self, cursor: Cursor, filters: JobFilter, max_jobs: int, actor: str | None) -> Moved:
        return _resurrect_rows(cursor, self._dlq_pick(cursor, filters, max_jobs), None, None, None, actor)

    def purge_archive_ids(self, cursor: Cursor, job_ids: Sequence[str]) -> Moved:
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return []
        cursor.execute(f"DELETE FROM {ARCHIVE} WHERE id IN ({_marks(len(ids))}) RETURNING id, queue", ids)
        moved = [(row[0], row[1]) for row in cursor.fetchall()]
        _drop_stats(cursor, "succeeded_total", Counter(q for _, q in moved), _ts(_now()))
        return moved

    def deck_snapshot(self, cursor: Cursor, request: SnapshotRequest) -> DeckSnapshot:
        """Everything the live Deck shows in one statement (parts not asked for are skipped by their CASE)."""
        locate, ids = self.locate_sql(list(dict.fromkeys(request.locate_ids)))
        since = request.throughput_since
        now = _ts(_now())
        cursor.execute(_snapshot_sql(locate), [
            int(request.active_limit), *ids,
            since is not None, _ts(since or _now()),
            request.queues, now, now,
            request.workers,
            request.errors_limit > 0, TOP_ERRORS_SAMPLE, EMPTY_ERROR, max(1, int(request.errors_limit)),
        ])
        totals, active, found, points, queues, workers, errors = cursor.fetchone()
        states, stats, lags = json.loads(queues) if queues is not None else (None, None, None)
        return snapshot_of(request, totals, active, found, points, states, stats, lags, workers, errors)

    def record_attempts(self, cursor: Cursor, worker_id: str | None, attempts: Sequence[FailedAttempt]) -> None:
        now = _ts(_now())
        for chunk in _chunks(attempts, ATTEMPT_ROWS_PER_INSERT):
            cursor.execute(
                f"INSERT INTO {ATTEMPTS} ({ATTEMPT_COLUMNS}) VALUES {', '.join(['(%s, %s, %s, %s, %s, %s, %s, %s)'] * len(chunk))}",
                [value for a in chunk for value in (a.job_id, a.attempt, worker_id, a.error.error_class,
                                                    a.error.message, a.error.traceback, now, _ts(a.started_at))],
            )


DIALECT: Dialect = SQLiteDialect()
