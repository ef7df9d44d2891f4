"""SQLite transitions (the embedded default): the SQL forms and hooks of ``BaseDialect`` that differ here.

Every transition runs inside ``transaction.atomic()``, which the project's
``transaction_mode = "IMMEDIATE"`` turns into ``BEGIN IMMEDIATE``: the write
lock is taken up front, so the read-then-write sequences below are
serialized without row locks. SQLite's clock is not usable (spec 01 §1.2):
``now`` is taken in Python and written in Django's text format, with
microseconds always present so text comparison orders correctly (a statement
that stamps rows reads it from its ``clock`` CTE, the ``clock()`` parameter).
RETURNING cannot feed an INSERT in SQLite, hence the Python hand-off of the
deleted rows inside one transaction (spec 01 §3): ``_move`` lands them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from chokaq_core.domain import ClaimHold, FailureReason, NewJob
from chokaq_core.sql import Cursor, Dialect, Moved
from chokaq_core.sql.base import (
    DLQ,
    HOT,
    HOT_FIELDS,
    NO_EXCEPTION,
    QUEUES,
    STATS,
    TO_HOT,
    BaseDialect,
    Move,
    bucket_add,
    bulkhead,
    dlq_row_sql,
    job_item,
    last_error_set,
    queue_health_select,
    resurrected,
    revision_guard,
    stats_add,
    summary_stats_sql,
    uncount_sql,
)

HOT_COLUMNS = ", ".join(HOT_FIELDS)


def _now() -> datetime:
    return datetime.now(UTC)


def _ts(value: datetime | None) -> str | None:
    """Django's SQLite storage format for an aware UTC datetime."""
    if value is None:
        return None
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


def _marks(count: int) -> str:
    return ", ".join(["%s"] * count)


# ---------------------------------------------------------------- counters


def count_removed(cursor: Cursor, counter: str, counts: Counter[str], now: str | None) -> None:
    """Apply the rows a delete removed, ``counts`` per queue, to ``counter`` (``uncount_sql``)."""
    if counts:
        cursor.execute(uncount_sql(counter, "(SELECT json_extract(value, '$[0]') AS queue, json_extract(value, '$[1]')"
                                            " AS n FROM json_each(%s))", "%s"), [now, json.dumps(list(counts.items()))])


# ---------------------------------------------------------------- statements

# "+status = n" (a unary plus) in statements that name their rows by id keeps SQLite on the primary key:
# without statistics it would otherwise walk every row of that status through hot_status_created.
_ITEM = "json_extract(value, '$.{}')"  # a key of the JSON array items json_each walks
_CLOCK = "WITH clock(now) AS (SELECT %s) "  # the clock() parameter, read as _NOW
_NOW = "(SELECT now FROM clock)"
_IDS = "(SELECT value FROM json_each(%s))"  # the ids_param JSON array
_ITEM_IDS = f"(SELECT {_ITEM.format('id')} FROM json_each(%s))"  # the items_params JSON array's ids
# The landed rows as the counter upserts read them (queue, failure_reason, duration_ms): a JSON array parameter.
_COUNTED = ("(SELECT " + ", ".join(f"{_ITEM.format(c)} AS {c}" for c in ("queue", "failure_reason", "duration_ms"))
            + " FROM json_each(%s))")
_OWNED = "(%s IS NULL OR worker_id = %s)"  # the guard_params

_JOB = "id, queue, type, payload, tags, idempotency_key, priority, created_by, scheduled_at, rate_key"
ENQUEUE_SQL = (
    f"INSERT INTO {HOT} ({_JOB}, status, attempt_count, created_at, last_updated_at)"
    f" SELECT {', '.join(_ITEM.format(c) for c in _JOB.split(', '))}, 0, 0, %s, %s"
    " FROM json_each(%s) WHERE true ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
    " RETURNING id"
)
# Moves out of Hot return the Hot row (plus any columns the move sets) for _move to land.
ARCHIVE_SUCCEEDED_SQL = MOVE_TO_DLQ_SQL = f"DELETE FROM {HOT} WHERE id IN {_ITEM_IDS} AND {_OWNED} RETURNING {HOT_COLUMNS}"
# A move out of Hot no exception caused names its rows' (empty) exception class and message.
_NO_EXCEPTION = ", ".join(f"{value} AS {column}" for column, value in NO_EXCEPTION.items())
CANCEL_BATCH_SQL = (f"WITH a(details, actor) AS (SELECT %s, %s) DELETE FROM {HOT} WHERE id IN {_IDS}"
                    f" AND status IN (0, 1) RETURNING {HOT_COLUMNS}, {int(FailureReason.CANCELLED)} AS failure_reason,"
                    f" (SELECT details FROM a) AS error_details, (SELECT actor FROM a) AS last_modified_by, {_NO_EXCEPTION}")
# Spec 01 §4.12: a queue's own timeout, else the global one (seconds, as julianday fractions of a day).
ARCHIVE_ZOMBIES_SQL = (
    f"{_CLOCK}DELETE FROM {HOT} WHERE status = 2 AND julianday(coalesce(heartbeat_at, last_updated_at))"
    f" < julianday({_NOW}) - coalesce((SELECT q.zombie_timeout_seconds FROM {QUEUES} q WHERE q.name = {HOT}.queue),"
    f" %s) / 86400.0 RETURNING {HOT_COLUMNS}, {int(FailureReason.ZOMBIE)} AS failure_reason, %s AS error_details,"
    f" {_NO_EXCEPTION}"
)
_RESCHEDULED = {"id": "id", "attempt_count": "attempts", "scheduled_at": "due", "stamp": "stamp",
                "error_class": "error_class", "error_message": "error_message", "held_by": "held_by"}
RESCHEDULE_SQL = (
    f"WITH items AS (SELECT {', '.join(f'{_ITEM.format(k)} AS {v}' for k, v in _RESCHEDULED.items())}"
    " FROM json_each(%s))"
    f" UPDATE {HOT} SET status = 0, attempt_count = items.attempts, scheduled_at = items.due, worker_id = NULL,"
    " heartbeat_at = NULL, cancel_requested_by = NULL, last_updated_at = items.stamp, "
    + last_error_set("items.error_class", "items.error_message", "items.held_by", "items.stamp", f"{HOT}.") +
    f" FROM items WHERE {HOT}.id = items.id AND (%s IS NULL OR {HOT}.worker_id = %s) RETURNING id, queue"
)
_RESURRECTED = resurrected(*(f"(SELECT {c} FROM a)" for c in ("payload", "tags", "priority", "actor")))
RESURRECT_SQL = (f"WITH a(payload, tags, priority, actor) AS (SELECT %s, %s, %s, %s) DELETE FROM {DLQ}"
                 f" WHERE id IN {_IDS} AND {revision_guard()} RETURNING "
                 + ", ".join(f"{_RESURRECTED[c]} AS {c}" if c in _RESURRECTED else c for c in TO_HOT.carried))


# ---------------------------------------------------------------- the claim


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
# ``{hold}``: what rate limits hold back (BaseDialect.hold_clause), empty without limits.
_UNSCHEDULED_STREAM = f"""SELECT * FROM (
    SELECT h.id, h.queue, h.priority, h.created_at AS sort_at FROM {HOT} h INDEXED BY hot_fetch_pending
    WHERE h.queue = %s AND h.status = 0 AND +h.scheduled_at IS NULL{{hold}}
    ORDER BY h.priority DESC, h.scheduled_at, h.created_at LIMIT %s)"""
_SCHEDULED_STREAM = f"""SELECT * FROM (
    SELECT h.id, h.queue, h.priority, h.scheduled_at AS sort_at FROM {HOT} h INDEXED BY hot_pending_lag
    WHERE h.queue = %s AND h.status = 0 AND h.scheduled_at <= %s{{hold}}
    ORDER BY h.priority DESC, h.scheduled_at, h.created_at LIMIT %s)"""
MAX_STREAMED_QUEUES = 200  # two compound terms per queue; SQLite allows 500 per statement
MAX_STREAMED_HOLD_PARAMS = 4000  # a hold's parameters repeat in both streams of every queue (32,766 per statement)


def _claim_sql(window: str) -> str:
    """Rank the window per queue, apply the bulkheads, claim (spec 01 §4.2)."""
    return f"""
        WITH win AS ({window}),
        {bulkhead("win", f"SELECT name FROM {QUEUES} WHERE max_workers IS NOT NULL", "%s")}
        UPDATE {HOT} SET status = 1, worker_id = %s, last_updated_at = %s
        WHERE id IN (SELECT id FROM picked) AND +status = 0  -- by primary key, not a walk of the status index
        RETURNING {HOT_COLUMNS}
        """


SUMMARY_STATS_SQL = summary_stats_sql("julianday(scheduled_at) > julianday('now')")
DLQ_ROW = dlq_row_sql("substr(error_details, -400)")  # the last 400 characters

QUEUE_HEALTH_SELECT = queue_health_select("max(0.0, (julianday(%s) - julianday(p.due_at)) * 86400.0)", "%s")


class SQLiteDialect(BaseDialect, statements=globals()):
    """The base over SQLite's text timestamps (the clock is Python's, spec 01 §1.2), JSON id lists and the
    Python hand-off of moved rows."""

    # "stamp": the clock() parameter itself, no CTE (the driver counts the changed rows only of a statement
    # that starts with UPDATE); "+status" keeps SQLite on the primary key (see above).
    DLQ_ROW = DLQ_ROW
    TOKENS = {"clock": _CLOCK, "now": _NOW, "stamp": "%s", "ids": f"IN {_IDS}", "by_id": "+", "text": "%s",
              "int": "%s", "ago": "%s", "trim": "trim", "chr": "char", "lazy": "", "pick": "", "rowlock": "",
              "output": "", "returning": " RETURNING id", "differs": "new_payload IS NOT payload"}

    SPENDS_ALONE = True  # a planned lease's bucket swaps and the lease commit one by one (see lease_spending)

    def clock(self, at: datetime | None = None) -> list[Any]:
        return [_ts(at or _now())]

    def ids_param(self, ids: Sequence[str]) -> Any:
        return json.dumps(list(dict.fromkeys(ids)))

    def ago_params(self, seconds: float) -> list[Any]:
        return [_ts(_now() - timedelta(seconds=seconds))]  # a text cutoff: the comparison stays on its index

    def items_params(self, rows: Sequence[Mapping[str, Any]]) -> list[Any]:
        return [json.dumps(list(rows))]

    def delay_fields(self, seconds: float) -> dict[str, Any]:
        now = _now()
        return {"scheduled_at": _ts(now + timedelta(seconds=seconds)), "stamp": _ts(now)}

    def item_ts(self, value: datetime | None) -> Any:
        return _ts(value)

    def items_table(self, columns: Mapping[str, str]) -> str:
        return f"(SELECT {', '.join(f'{_ITEM.format(c)} AS {c}' for c in columns)} FROM json_each(%s)) AS a"

    def pack(self, sql: str, width: int, order: str) -> str:
        """The aggregate reads its rows in the order of the subquery (not flattened into an aggregate)."""
        cols = ", ".join(f"c{i}" for i in range(width))
        return (f"(WITH t({cols}) AS ({sql})"
                f" SELECT json_group_array(json_array({cols})) FROM (SELECT * FROM t ORDER BY {order}))")

    def uncount(self, cursor: Cursor, counter: str, queues: Mapping[str, int]) -> None:
        count_removed(cursor, counter, Counter(queues), _ts(_now()))

    def param_ts(self, value: datetime | None) -> Any:
        return _ts(value)

    def queue_health_params(self) -> list[Any]:
        now = _ts(_now())
        return [now, now]

    def now(self) -> tuple[str, list[Any]]:
        return "%s", [_ts(_now())]

    def change_marker(self, cursor: Cursor) -> int | None:
        """Changes whenever another connection commits; read without a lock (the WAL index)."""
        cursor.execute("PRAGMA data_version")
        return int(cursor.fetchone()[0])

    def insert_jobs(self, cursor: Cursor, jobs: Sequence[NewJob], retry: bool) -> tuple[set[str], dict[str, str]]:
        """One insert of the batch as JSON items (taken keys skipped), then the queues' rows."""
        now = _now()
        stamp = _ts(now)
        cursor.execute(ENQUEUE_SQL, [stamp, stamp, json.dumps([
            job_item(j, scheduled_at=None if j.delay_seconds is None else _ts(now + timedelta(seconds=j.delay_seconds)))
            for j in jobs])])
        inserted = {str(row[0]) for row in cursor.fetchall()}
        queues = json.dumps(sorted({job.queue for job in jobs}))
        cursor.execute(f"INSERT INTO {QUEUES} (name, is_paused, is_active, last_updated_at) SELECT value, 0, 1, %s"
                       " FROM json_each(%s) WHERE true ON CONFLICT (name) DO NOTHING", [stamp, queues])
        cursor.execute(f"INSERT INTO {STATS} (queue, last_activity_at) SELECT value, %s FROM json_each(%s) WHERE true"
                       " ON CONFLICT (queue) DO NOTHING", [stamp, queues])
        return inserted, self.key_holders(cursor, jobs, inserted)

    def claim(self, cursor: Cursor, worker_id: str, limit: int, queues: list[str] | None,
              hold: ClaimHold | None = None) -> list[Any]:
        """The claim under ``BEGIN IMMEDIATE`` (two statements: open queues, claim).

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
        held_queues = set(hold.queues) if hold else set()
        open_queues = sorted(row[0] for row in cursor.fetchall() if row[0] not in held_queues)
        if not open_queues:
            return []
        scan = limit * 10
        clause, held = self.hold_clause(hold)
        if len(open_queues) <= MAX_STREAMED_QUEUES and len(held) * len(open_queues) <= MAX_STREAMED_HOLD_PARAMS:
            stream = f"{_UNSCHEDULED_STREAM} UNION ALL {_SCHEDULED_STREAM}".format(hold=clause)
            window = f"SELECT * FROM ({' UNION ALL '.join([stream] * len(open_queues))}) ORDER BY priority DESC, sort_at, id LIMIT %s"
            params: list[Any] = [p for name in open_queues
                                 for p in (name, *held, scan, name, now, *held, scan)] + [scan]
        else:  # very many queues: one ranked read of the due rows instead of 2 streams per queue
            window = f"""SELECT h.id, h.queue, h.priority, coalesce(h.scheduled_at, h.created_at) AS sort_at
                FROM {HOT} h WHERE h.status = 0 AND (h.scheduled_at IS NULL OR h.scheduled_at <= %s)
                  AND h.queue IN (SELECT value FROM json_each(%s)){clause}
                ORDER BY h.priority DESC, sort_at, h.id LIMIT %s"""
            params = [now, json.dumps(open_queues), *held, scan]
        cursor.execute(_claim_sql(window), [*params, limit, worker_id, now])
        return list(cursor.fetchall())

    def _move(self, cursor: Cursor, move: Move, sql: str, params: list[Any],
              landing: Mapping[str, Mapping[str, Any]] | None = None) -> Moved:
        """The statement changes a pillar (a delete returning each row, or the retry's update); the rows it deleted,
        with the columns it or ``landing`` set, are inserted into the move's pillar, then counted."""
        cursor.execute(sql, params)
        names = [d[0] for d in cursor.description]
        rows = [{**dict(zip(names, row, strict=True)), **(landing or {}).get(str(row[0]), {})}
                for row in cursor.fetchall()]
        if not rows:
            return []
        now = _now()
        stamp = _ts(now)
        if move.table is not None:
            for row in rows:
                row[move.stamp] = stamp
                if "revision" in move.fields:
                    row["revision"] += 1  # the row carries its revision, one up
            cursor.executemany(f"INSERT INTO {move.table} ({', '.join(move.fields)}) VALUES ({_marks(len(move.fields))})",
                               [tuple(row[c] for c in move.fields) for row in rows])  # the pillar's columns, in order
        if move.table == HOT:  # back to Pending: off its counter
            self.uncount(cursor, move.counter, Counter(row["queue"] for row in rows))
            return [(str(row["id"]), str(row["queue"])) for row in rows]
        counted = json.dumps([{"queue": row["queue"], "failure_reason": row.get("failure_reason", -1),
                               "duration_ms": row.get("duration_ms")} for row in rows])
        cursor.execute(stats_add(move.counter, _COUNTED, "%s"), [stamp, counted])
        if move.outcome is not None:
            cursor.execute(bucket_add(move.outcome, _COUNTED, "%s", "%s"), [_ts(now.replace(microsecond=0)), stamp, counted])
        return [(str(row["id"]), str(row["queue"])) for row in rows]


DIALECT: Dialect = SQLiteDialect()
