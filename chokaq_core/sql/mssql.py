"""SQL Server dialect (mssql-django): the T-SQL forms and hooks of ``BaseDialect`` that differ here.

Rules followed by every function here (spec 01 §1.2, §1.3, §3, §4):

* ``cursor`` is mssql-django's cursor: ``%s`` placeholders, turned into
  pyodbc's ``?``. Every parameter is typed (``CAST(%s AS nvarchar(max))``, or
  a batch's ``DECLARE @WorkerId nvarchar(4000) = %s``) so a NULL or a long
  string always has a declared type; batched inputs (ids, per-job durations,
  reasons, details, delays) travel as one JSON parameter read with
  ``OPENJSON … WITH (…)`` — one round trip whatever the batch size, and far
  from SQL Server's 2,100-parameter limit.
* ``storage`` owns the transaction (``transaction.atomic()``, READ COMMITTED):
  no batch issues ``BEGIN TRANSACTION``, ``COMMIT`` or ``SET XACT_ABORT ON``
  (the latter would doom the caller's whole transaction on a statement error,
  which breaks the savepoint ``enqueue`` relies on inside a caller's
  ``atomic()``; a failed batch is rolled back by ``atomic()`` instead).
* Time is the database clock: ``@Now = SYSUTCDATETIME()`` once per batch.
  Columns are ``datetimeoffset`` under ``USE_TZ``; a ``datetime2`` value
  assigned or compared to them is taken as ``+00:00``.
* Multi-statement batches start with ``SET NOCOUNT ON`` (so pyodbc sees no
  intermediate row counts, and an error in any statement reaches the client
  before the first result) and switch it back ``OFF`` just before the one
  statement whose result is read — the setting lives on the session, and
  Django's ORM counts rows (``save()``, ``update()``) on the same connection.
  A statement whose changed rows the driver counts (the recovery of abandoned
  fetches, the retention batches) starts with ``SET NOCOUNT OFF``, as the ORM's.
* Claims read ``WITH (UPDLOCK, READPAST, ROWLOCK)``; a move is
  ``DELETE … OUTPUT deleted.… INTO @Moved`` with the guard in its predicate,
  ``INSERT … SELECT … FROM @Moved``, ``MERGE … WITH (HOLDLOCK)`` for
  ``chokaq_stats_summary`` and ``chokaq_metric_buckets`` (grouped, so no
  merge touches a row twice), and ``SELECT id, queue FROM @Moved``.
* Aggregates never see NULLs (``Null value is eliminated…`` would be an
  informational message in front of the result); ``rows`` also skips any
  result that is not a row set.
* The passive dashboard reads (``summary_stats``, ``queue_stats``) use
  ``WITH (NOLOCK)`` as spec 01 §1.3 allows; every other read is committed.
* No ``{``/``}`` and no ``%`` other than ``%s`` appear in the SQL text:
  mssql-django rewrites statements containing ``GROUP BY`` with
  ``str.format`` and formats every statement with ``%``.

Requires SQL Server 2016+ with database compatibility level ≥ 130 (``OPENJSON``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from chokaq_core.domain import ClaimHold, NewJob
from chokaq_core.sql import Cursor, Dialect
from chokaq_core.sql.base import (
    HOT,
    RETRY,
    TO_HOT,
    BaseDialect,
    Move,
    as_utc,
    carried_values,
    insert_moved,
    job_item,
    queue_health_select,
    queue_stats_select,
    summary_stats_sql,
    throughput_select,
    uncount_sql,
)

IDEMPOTENCY_INDEX = "hot_idempotency"  # the filtered unique index behind the enqueue check
DUPLICATE_KEY_ERRORS = ("2601", "2627")  # duplicate key in a unique index / unique constraint
_INT_MAX = 2**31 - 1

# ---------------------------------------------------------------- SQL builders

_NOW = "DECLARE @Now datetime2(7) = SYSUTCDATETIME();"
_DIRTY = " WITH (NOLOCK)"  # passive dashboard telemetry may read dirty data (spec 01 §1.3)
_SWEEP = " WITH (ROWLOCK, READPAST)"  # a sweep or a retention batch never waits behind a locked row
# ``{}`` minus the seconds and the milliseconds of seconds_params (spec 01 §4.11, §4.12: a column compared to a
# computed cutoff, so its index serves).
_AGO = "DATEADD(SECOND, -CAST(%s AS int), DATEADD(MILLISECOND, -CAST(%s AS int), {}))"
# The current UTC second (spec 01 §4.13): whole seconds since a fixed epoch, added back to it (int until 2068).
_BUCKET = (
    "DECLARE @Bucket datetime2(7) = DATEADD(SECOND, DATEDIFF(SECOND, CAST('20000101' AS datetime2(7)), @Now),"
    " CAST('20000101' AS datetime2(7)));"
)

# Types of the ``@Moved`` table variable columns (the physical column types of the models).
_MOVED_TYPES = {
    "id": "nvarchar(50) NOT NULL PRIMARY KEY",
    **dict.fromkeys(("queue", "type"), "nvarchar(255) NOT NULL"),
    **dict.fromkeys(("priority", "status", "failure_reason", "revision", "attempt_count"), "int NOT NULL"),
    **dict.fromkeys(("payload", "error_details", "result"), "nvarchar(max) NULL"),
    **dict.fromkeys(("tags", "error_message"), "nvarchar(1000) NULL"),
    **dict.fromkeys(("error_class", "rate_key"), "nvarchar(255) NULL"),
    **dict.fromkeys(("worker_id", "created_by", "last_modified_by"), "nvarchar(100) NULL"),
    "created_at": "datetimeoffset NOT NULL",
    "started_at": "datetimeoffset NULL",
    "duration_ms": "float NULL",
}

# ``param`` and ``items_table`` kinds
PARAM_TYPES = {"name": "nvarchar(4000)", "text": "nvarchar(max)", "int": "int", "bool": "bit", "float": "float",
               "ts": "datetimeoffset(7)", "class": "nvarchar(255)", "message": "nvarchar(1000)"}
_ID_LIST = "IN (SELECT i.id FROM OPENJSON(%s) WITH (id nvarchar(4000) '$.id') AS i)"  # against a ``_ids_json`` array
_NAMES = "(SELECT f.name FROM OPENJSON({}) WITH (name nvarchar(4000) '$.name') AS f)"  # a JSON array of names


def _moved_table(columns: Sequence[str], name: str = "@Moved") -> str:
    return f"DECLARE {name} TABLE (" + ", ".join(f"{c} {_MOVED_TYPES[c]}" for c in columns) + ");"


def counters_locked(rows: str) -> str:
    """``base.counters_locked`` here: the counter rows of the queues of ``rows`` (a table variable with a ``queue``
    column) locked in key order, one by one. SQL Server locks a row as its scan or seek reads it, whatever the ORDER BY
    of the statement (a join may read the queues in any order), so each row is its own seek, the queues taken
    smallest first (``MIN`` and ``>`` compare as the key does, in the column's collation). ``UPDLOCK``: held to
    commit; ``HOLDLOCK`` on an equality seek of the key takes that key only."""
    return (f"DECLARE @LockQueue nvarchar(255) = (SELECT MIN(queue) FROM {rows});\n"
            "DECLARE @Locked int;\n"
            "WHILE @LockQueue IS NOT NULL\nBEGIN\n"
            "    SELECT @Locked = 1 FROM chokaq_stats_summary WITH (UPDLOCK, HOLDLOCK, ROWLOCK) WHERE queue = @LockQueue;\n"
            f"    SET @LockQueue = (SELECT MIN(queue) FROM {rows} WHERE queue > @LockQueue);\nEND;")


def merge_rows(table: str, key: Sequence[str], columns: Sequence[str], source: str,
               update: Mapping[str, str | None]) -> str:
    """``BaseDialect.merge_rows`` as ``MERGE … WITH (HOLDLOCK)``: ``source`` is the derived table ``s``, ``table``
    is ``t``."""
    sets = ", ".join(f"{c} = {(e or '{new}.' + c).format(new='s', old='t')}" for c, e in update.items())
    return (f"MERGE {table} WITH (HOLDLOCK) AS t\nUSING ({source}) AS s ({', '.join(columns)})\n"
            f"ON {' AND '.join(f't.{k} = s.{k}' for k in key)}\nWHEN MATCHED THEN UPDATE SET {sets}\n"
            f"WHEN NOT MATCHED THEN INSERT ({', '.join(columns)}) VALUES ({', '.join(f's.{c}' for c in columns)});")


def _params(*declarations: str) -> str:
    """Each parameter copied into a typed variable (``@Name type``), in order."""
    return "\n".join(f"DECLARE {declaration} = %s;" for declaration in declarations)


def _batch(*statements: str) -> str:
    """A multi-statement batch: NOCOUNT on for the work, off again for the final statement."""
    *work, last = statements
    return "\n".join(["SET NOCOUNT ON;", *work, "SET NOCOUNT OFF;", last])


# ---------------------------------------------------------------- statements

ENQUEUE_SQL = _batch(
    _NOW,
    "DECLARE @Jobs nvarchar(max) = %s;",
    "DECLARE @Inserted TABLE (id nvarchar(50) NOT NULL PRIMARY KEY);",
    "DECLARE @NewQueues TABLE (queue nvarchar(255) NOT NULL PRIMARY KEY);",
    # The idempotency check rides on the insert; the filtered unique index is the safety net (2601).
    "INSERT INTO chokaq_jobs_hot (id, queue, type, payload, tags, idempotency_key, priority, status,"
    " attempt_count, scheduled_at, created_at, last_updated_at, created_by, rate_key)\n"
    "OUTPUT inserted.id INTO @Inserted (id)\n"
    "SELECT j.id, j.queue, j.type, j.payload, j.tags, j.idempotency_key, j.priority, 0, 0,\n"
    "    CASE WHEN j.delay_s IS NULL THEN NULL ELSE DATEADD(MILLISECOND, j.delay_ms, DATEADD(SECOND, j.delay_s, @Now))"
    " END,\n"
    "    @Now, @Now, j.created_by, j.rate_key\n"
    "FROM OPENJSON(@Jobs) WITH (id nvarchar(4000) '$.id', queue nvarchar(4000) '$.queue',"
    " type nvarchar(4000) '$.type', payload nvarchar(max) '$.payload', tags nvarchar(4000) '$.tags',"
    " idempotency_key nvarchar(4000) '$.idempotency_key', priority int '$.priority', delay_s int '$.delay_s',"
    " delay_ms int '$.delay_ms', created_by nvarchar(4000) '$.created_by', rate_key nvarchar(4000) '$.rate_key')"
    " AS j\n"
    "WHERE j.idempotency_key IS NULL\n"
    "    OR NOT EXISTS (SELECT 1 FROM chokaq_jobs_hot AS k WHERE k.idempotency_key = j.idempotency_key);",
    # Queues and counters rows: an unlocked look first, so only brand-new queues take the range locks.
    "INSERT INTO @NewQueues (queue)\n"
    "SELECT DISTINCT n.queue FROM OPENJSON(@Jobs) WITH (queue nvarchar(4000) '$.queue') AS n\n"
    "WHERE NOT EXISTS (SELECT 1 FROM chokaq_queues AS q WHERE q.name = n.queue)\n"
    "    OR NOT EXISTS (SELECT 1 FROM chokaq_stats_summary AS s WHERE s.queue = n.queue);",
    "INSERT INTO chokaq_queues (name, is_paused, is_active, last_updated_at)\n"
    "SELECT n.queue, 0, 1, @Now FROM @NewQueues AS n\n"
    "WHERE NOT EXISTS (SELECT 1 FROM chokaq_queues AS q WITH (UPDLOCK, HOLDLOCK) WHERE q.name = n.queue);",
    "INSERT INTO chokaq_stats_summary (queue)\n"
    "SELECT n.queue FROM @NewQueues AS n\n"
    "WHERE NOT EXISTS (SELECT 1 FROM chokaq_stats_summary AS s WITH (UPDLOCK, HOLDLOCK) WHERE s.queue = n.queue);",
    # Rows inserted (key NULL) and, per key of the batch, the id holding it now.
    "SELECT i.id, CAST(NULL AS nvarchar(255)) AS idempotency_key FROM @Inserted AS i\n"
    "UNION ALL\n"
    "SELECT k.id, k.idempotency_key FROM chokaq_jobs_hot AS k\n"
    "WHERE k.idempotency_key IN (SELECT j.idempotency_key FROM OPENJSON(@Jobs)"
    " WITH (idempotency_key nvarchar(4000) '$.idempotency_key') AS j WHERE j.idempotency_key IS NOT NULL);",
)


# A completion of several moves: its Hot rows, then its queues' counter rows (by queue), so that no move of it waits
# for a counter row while it holds another transaction's (``base.BaseDialect.begin_completion``). The Hot rows are
# read with U locks (a sweep, reading past locked rows, leaves them to this completion). Params: worker (None: no
# owner guard), ids.
BEGIN_COMPLETION_SQL = _batch(
    _params("@WorkerId nvarchar(4000)"),
    _moved_table(("id", "queue", "started_at"), "@Own"),
    "INSERT INTO @Own (id, queue, started_at)\n"
    "SELECT h.id, h.queue, h.started_at FROM chokaq_jobs_hot AS h WITH (UPDLOCK, ROWLOCK)\n"
    f"WHERE h.id {_ID_LIST} AND (@WorkerId IS NULL OR h.worker_id = @WorkerId);",
    counters_locked("@Own"),
    "SELECT id, started_at FROM @Own;",
)


# ---------------------------------------------------------------- helpers


def _json(items: Iterable[Mapping[str, Any]]) -> str:
    return json.dumps(list(items), separators=(",", ":"))


def _ids_json(job_ids: Iterable[str]) -> str:
    return _json({"id": job_id} for job_id in dict.fromkeys(job_ids))


def _split_seconds(seconds: float) -> tuple[int, int]:
    """(whole seconds, remaining ms) for ``DATEADD``, whose number is an int."""
    whole, ms = divmod(round(float(seconds) * 1000), 1000)
    return max(-_INT_MAX, min(_INT_MAX, int(whole))), int(ms)


def _is_idempotency_race(exc: BaseException) -> bool:
    """A concurrent producer committed the same idempotency key first: 2601 on ``hot_idempotency`` in a message of
    the exception chain (pyodbc puts the native error number in the text)."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    text = " ".join(str(arg) for error in chain for arg in error.args)
    return any(code in text for code in DUPLICATE_KEY_ERRORS) and IDEMPOTENCY_INDEX in text


# ---------------------------------------------------------------- the Deck's reads: passive dashboard telemetry, dirty
# reads allowed (spec 01 §1.3); each stands as a derived table of ``deck_snapshot``.

SUMMARY_STATS_SQL = summary_stats_sql("scheduled_at > SYSUTCDATETIME()", _DIRTY)
QUEUE_STATS_SELECT = queue_stats_select(_DIRTY)
THROUGHPUT_SELECT = throughput_select("CAST(%s AS datetimeoffset(7))", _DIRTY)
_NOW_OFFSET = "TODATETIMEOFFSET(SYSUTCDATETIME(), 0)"
QUEUE_HEALTH_SELECT = queue_health_select(
    f"CASE WHEN p.due_at < {_NOW_OFFSET} THEN DATEDIFF_BIG(MILLISECOND, p.due_at, {_NOW_OFFSET}) / 1000.0 ELSE 0.0 END",
    _NOW_OFFSET, _DIRTY)


class SQLServerDialect(BaseDialect, statements=globals()):
    """The base over SQL Server's own statements (dirty reads for telemetry, spec 01 §1.3), JSON batches, ISO
    text datetimes and batches whose first results carry no rows."""

    TS = "CAST(%s AS datetimeoffset(7))"
    ROW_LOCK_HINT = " WITH (UPDLOCK, HOLDLOCK, ROWLOCK)"
    IGNORE_DUPLICATE = ""  # the locking hint of the NOT EXISTS read makes a racing twin wait instead
    LIMIT = " OFFSET 0 ROWS FETCH NEXT %s ROWS ONLY"
    PICK_HINT = " WITH (UPDLOCK, READPAST, ROWLOCK)"
    TRUE, FALSE = "1", "0"
    # The words of the SHARED_STATEMENTS it has not written itself (typed parameters: a NULL keeps its type).
    TOKENS = {"clock": "", "now": "SYSUTCDATETIME()", "ids": _ID_LIST, "by_id": "", "lazy": "",
              "text": "CAST(%s AS nvarchar(max))", "int": "CAST(%s AS int)", "rowlock": " WITH (ROWLOCK)",
              "name": "CAST(%s AS nvarchar(4000))", "substr": "SUBSTRING", "dirty": _DIRTY,  # TRIM: SQL Server 2017+
              "trimmed": "TRIM(NCHAR(32) + NCHAR(9) + NCHAR(13) + NCHAR(10) FROM"
                         " CAST(LEFT(COALESCE(error_details, N''), 4000) AS nvarchar(4000)))",
              # binary: the collations ignore case and trailing blanks
              "differs": "(payload IS NULL OR CAST(new_payload AS varbinary(max)) <> CAST(payload AS varbinary(max)))",
              # NOCOUNT is session state (an ORM insert may leave it ON): the driver's row count needs it OFF
              "count": "SET NOCOUNT OFF; ", "sweep": _SWEEP, "stamp": "SYSUTCDATETIME()",
              "ago": _AGO.format("SYSUTCDATETIME()")}

    FOLDS_CASE = True

    def aged_batch(self, table: str, key: str, column: str, where: str) -> str:
        """Deleted through an ordered CTE (no row-value IN here), skipping locked rows."""
        return (f"{self.TOKENS['count']}WITH b AS (SELECT {key} FROM {table}{_SWEEP} WHERE {where}{column} < {self.TS}"
                f" ORDER BY {column}{self.LIMIT}) DELETE FROM b")

    def search_pattern(self, term: str) -> str:
        return super().search_pattern(term).replace("[", "\\[")  # "[" is a wildcard in T-SQL too

    def param_ts(self, value: datetime | None) -> Any:
        """ISO 8601 UTC text, read as ``datetimeoffset(7)`` (naive values are UTC)."""
        return None if value is None else as_utc(value).isoformat(timespec="microseconds")

    def rows(self, cursor: Cursor) -> list[Any]:
        """The rows of the batch's result set, skipping results that carry none (messages, counts)."""
        while cursor.description is None:
            if not cursor.nextset():
                return []
        return [tuple(row) for row in cursor.fetchall()]

    def ids_param(self, ids: Sequence[str]) -> Any:
        return _ids_json(ids)

    def items_params(self, rows: Sequence[Mapping[str, Any]]) -> list[Any]:
        return [_json(rows)]  # one JSON array read by OPENJSON

    def delay_fields(self, seconds: float | None) -> dict[str, Any]:
        delay_s, delay_ms = (None, None) if seconds is None else _split_seconds(seconds)
        return {"delay_s": delay_s, "delay_ms": delay_ms}

    def seconds_params(self, seconds: float) -> list[Any]:
        return list(_split_seconds(seconds))  # DATEADD takes whole numbers

    def insert_jobs(self, cursor: Cursor, jobs: Sequence[NewJob], retry: bool) -> tuple[set[str], dict[str, str]]:
        """One batch inserts the jobs whose key is free (the first job of a key repeated in the batch stands for
        the others), creates missing Queues/StatsSummary rows and returns the ids inserted plus the holder of
        every key (spec 01 §4.1). A producer racing on the same key makes the filtered unique index refuse the
        insert (2601): the statement alone is rolled back and the next pass reads the winner."""
        first_of_key: dict[str | None, NewJob] = {}
        batch = [job for job in jobs if job.idempotency_key is None
                 or first_of_key.setdefault(job.idempotency_key, job) is job]
        try:
            cursor.execute(ENQUEUE_SQL, [_json(job_item(job, **self.delay_fields(job.delay_seconds)) for job in batch)])
            rows = self.rows(cursor)
        except Exception as exc:
            if retry and _is_idempotency_race(exc):
                return set(), {}
            raise
        return ({str(job_id) for job_id, key in rows if key is None},
                {str(key): str(job_id) for job_id, key in rows if key is not None})

    def claim(self, cursor: Cursor, worker_id: str, limit: int, queues: list[str] | None,
              hold: ClaimHold | None = None) -> list[Any]:
        """Spec 01 §4.2 in one batch: lock the capped queues' rows, then a window of due rows (skipping what rate
        limits hold back), rank per queue, apply the bulkhead, claim (the OUTPUT order is unspecified).

        As in the reference, the candidates are read ``WITH (UPDLOCK, READPAST, ROWLOCK)``, so concurrent
        claimers lock disjoint rows. The order (priority, then ``COALESCE(scheduled_at, created_at)``) is not
        an index order, so the sort reads — and U-locks, for this one statement — every due Pending row of
        the allowed queues; with a very large due backlog watch for lock escalation on ``chokaq_jobs_hot``.
        Claimers of a capped queue take turns (as on PostgreSQL): U locks on the capped queues' control rows,
        held to commit, make the claim statement that follows count every earlier committed claim."""
        clause, held = self.hold_clause(hold)
        named = [] if queues is None else [_json({"name": name} for name in queues)]
        within, capped = (f" AND {c} IN {_NAMES.format('@Queues')}" if named else "" for c in ("h.queue", "c.name"))
        window = ("SELECT TOP (@ScanLimit) h.id, h.queue, h.priority, COALESCE(h.scheduled_at, h.created_at) AS sort_at"
                  "\n    FROM chokaq_jobs_hot AS h WITH (UPDLOCK, READPAST, ROWLOCK)"
                  "\n    LEFT JOIN chokaq_queues AS q ON q.name = h.queue"
                  f"\n    WHERE h.status = 0 AND (h.scheduled_at IS NULL OR h.scheduled_at <= @Now){within}"
                  f"\n      AND COALESCE(q.is_paused, 0) = 0 AND COALESCE(q.is_active, 1) = 1{clause}"
                  "\n    ORDER BY h.priority DESC, sort_at, h.id")
        cursor.execute(_batch(_NOW, _params("@WorkerId nvarchar(4000)", "@ScanLimit int", "@Limit int",
                                            *(["@Queues nvarchar(max)"] if named else [])),
                              "DECLARE @Capped int;", "SELECT @Capped = COUNT(*) FROM chokaq_queues AS c WITH (UPDLOCK,"
                              f" ROWLOCK)\nWHERE c.max_workers IS NOT NULL{capped};",
                              self.claim_sql(window, "@Limit", "@WorkerId", "@Now", top=True) + ";"),
                       [worker_id, limit * 10, limit, *named, *held])
        return self.rows(cursor)

    def begin_completion(self, cursor: Cursor, worker_id: str | None, job_ids: Sequence[str],
                         failed_ids: Sequence[str]) -> dict[str, datetime | None]:
        """One batch, as on PostgreSQL: the batch's Hot rows that are still this worker's (U locks, held to commit),
        then its queues' counter rows in key order (``counters_locked``); when each failed execution started."""
        cursor.execute(BEGIN_COMPLETION_SQL, [worker_id, _ids_json(sorted(job_ids))])
        failed = set(failed_ids)
        return {str(job_id): as_utc(started) for job_id, started in self.rows(cursor) if job_id in failed}

    MOVED_NOW = "@Now"
    DUE_ITEMS = {"delay_s": "int", "delay_ms": "int"}
    DUE = "DATEADD(MILLISECOND, a.delay_ms, DATEADD(SECOND, a.delay_s, @Now))"
    # Spec 01 §4.12: both OR branches compare a column to a computed cutoff (the queue's timeout, else the global).
    ZOMBIE_SOURCE = (f"(SELECT {_AGO.format('@Now')} AS cutoff,"
                     " CAST(%s AS nvarchar(max)) AS error_details) AS a\nLEFT JOIN chokaq_queues AS q ON q.name = h.queue\n"
                     "CROSS APPLY (SELECT CASE WHEN q.zombie_timeout_seconds IS NULL THEN a.cutoff\n"
                     "    ELSE DATEADD(SECOND, -q.zombie_timeout_seconds, @Now) END AS cutoff) AS z")
    ZOMBIE_WHERE = ("h.status = 2\n  AND ((h.heartbeat_at IS NOT NULL AND h.heartbeat_at < z.cutoff)\n"
                    "    OR (h.heartbeat_at IS NULL AND h.last_updated_at < z.cutoff))")

    def completion(self, move: Move, source: str, on: str | None, where: str, values: Mapping[str, str],
                   sets: str = "", sweep: bool = False) -> str:
        """One batch (spec 01 §3): the changed rows go to ``@Moved`` (OUTPUT … INTO, the guard in the predicate), then
        the pillar's insert, the counters and the buckets."""
        join = f"INNER JOIN {source} ON {on}" if on else f"CROSS JOIN {source}"
        rows = f"FROM {move.origin} AS h WITH (ROWLOCK{', READPAST' if sweep else ''})\n{join}\nWHERE {where};"
        change, row = (f"UPDATE h SET {sets}", "inserted") if move is RETRY else ("DELETE h", "deleted")
        output = ", ".join(carried_values(move.carried, row, values).values())  # a moved row's revision one up
        steps = [_moved_table(move.carried),
                 f"{change}\nOUTPUT {output}\n    INTO @Moved ({', '.join(move.carried)})\n{rows}"]
        if move.table is not None:
            steps.append(insert_moved(move, "@Moved", "@Now") + ";")
        steps.append(counters_locked("@Moved"))  # the shared rows' lock order: counter rows by queue, then buckets
        if move.origin != HOT:  # back to Pending or purged: off its counter
            steps.append(uncount_sql(move.counter, "@Moved", "@Now" if move is TO_HOT else None) + ";")
        else:
            steps.append(self.stats_add(move.counter, "@Moved", "@Now"))
        if move.outcome is not None:
            steps += [_BUCKET, self.bucket_add(move.outcome, f"(SELECT {move.counted} FROM @Moved)", "@Bucket", "@Now")]
        return _batch(_NOW, *steps, "SELECT id, queue FROM @Moved;")

    merge_rows = staticmethod(merge_rows)

    def param(self, kind: str) -> str:
        return f"CAST(%s AS {PARAM_TYPES[kind]})"  # a NULL keeps its type

    def returning(self, columns: str) -> tuple[str, str]:
        return " OUTPUT " + ", ".join(f"inserted.{c.strip()}" for c in columns.split(",")), ""

    def id_list(self, ids: Sequence[str]) -> tuple[str, list[Any]]:
        return (_ID_LIST, [_ids_json(ids)]) if ids else super().id_list(ids)

    def name_list(self, names: Sequence[str]) -> tuple[str, list[Any]]:
        return f"IN {_NAMES.format('%s')}", [_json({"name": name} for name in names)]

    WHEN = "%s = 1"

    def pack(self, sql: str, width: int, order: str) -> str:
        """``FOR JSON PATH`` of the rows, keyed ``c0``, ``c1``, … (INCLUDE_NULL_VALUES keeps every key); a derived
        table has no ORDER BY of its own unless it has a TOP or an OFFSET, so ``order`` restores the read's.
        No rows: NULL, which ``json_rows`` reads as no rows."""
        cols = ", ".join(f"c{i}" for i in range(width))
        return f"(SELECT {cols} FROM ({sql}) AS t({cols}) ORDER BY {order} FOR JSON PATH, INCLUDE_NULL_VALUES)"

    def items_table(self, columns: Mapping[str, str]) -> str:
        return f"OPENJSON(%s) WITH ({', '.join(f"{c} {PARAM_TYPES[k]} '$.{c}'" for c, k in columns.items())}) AS a"


DIALECT: Dialect = SQLServerDialect()
