"""SQLite transitions (the embedded default): the SQL forms and hooks of ``BaseDialect`` that differ here.

Every transition runs inside ``transaction.atomic()``, which the project's
``transaction_mode = "IMMEDIATE"`` turns into ``BEGIN IMMEDIATE``: the write
lock is taken up front, so the read-then-write sequences below are
serialized without row locks. SQLite's clock is not usable (spec 01 §1.2):
``now`` is taken in Python and written in Django's text format, with
microseconds always present so text comparison orders correctly (a statement
that stamps rows reads it from its ``clock`` CTE, the ``clock()`` parameter).
RETURNING cannot feed an INSERT in SQLite, hence a move in steps inside one
transaction (spec 01 §3): its statement lands the rows, ``_move`` deletes and
counts them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from chokaq_core.domain import ClaimHold, NewJob
from chokaq_core.sql import Cursor, Dialect, Moved
from chokaq_core.sql.base import (
    HOT,
    HOT_FIELDS,
    QUEUES,
    RETRY,
    STATS,
    TO_HOT,
    TRIMMED,
    BaseDialect,
    Move,
    carried_values,
    dlq_row_sql,
    insert_moved,
    job_item,
    pending_queues,
    queue_health_select,
    summary_stats_sql,
    uncount_sql,
)


def _ts(value: datetime | None) -> str | None:
    """Django's SQLite storage format for an aware UTC datetime."""
    if value is None:
        return None
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


# ---------------------------------------------------------------- statements

# "+status = n" (a unary plus) in statements that name their rows by id keeps SQLite on the primary key:
# without statistics it would otherwise walk every row of that status through hot_status_created.
_ITEM = "json_extract(value, '$.{}')"  # a key of the JSON array items json_each walks
_CLOCK = "WITH clock(now) AS (SELECT %s) "  # the clock() parameter, read as _NOW
_NOW = "(SELECT now FROM clock)"
_IDS = "(SELECT value FROM json_each(%s))"  # the ids_param JSON array
# The landed rows as the counter upserts read them (queue, failure_reason, duration_ms): a JSON array parameter.
_COUNTED = ("(SELECT " + ", ".join(f"json_extract(value, '$[{i}]') AS {c}"
                                   for i, c in enumerate(("queue", "failure_reason", "duration_ms")))
            + " FROM json_each(%s))")

_JOB = "id, queue, type, payload, tags, idempotency_key, priority, created_by, scheduled_at, rate_key"
ENQUEUE_SQL = (
    f"INSERT INTO {HOT} ({_JOB}, status, attempt_count, created_at, last_updated_at)"
    f" SELECT {', '.join(_ITEM.format(c) for c in _JOB.split(', '))}, 0, 0, %s, %s"
    " FROM json_each(%s) WHERE true ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
    " RETURNING id"
)

# The same insert as one self-committing statement, only when every queue of the batch has its Queues and
# StatsSummary rows already (params: stamp, stamp, items, queues, queues, their count twice); else it inserts nothing.
_KNOWN = "(SELECT count(*) FROM {table} WHERE {column} IN (SELECT value FROM json_each(%s)))"
ENQUEUE_KNOWN_SQL = ENQUEUE_SQL.replace(
    "WHERE true", f"WHERE {_KNOWN.format(table=QUEUES, column='name')} = %s"
                  f" AND {_KNOWN.format(table=STATS, column='queue')} = %s", 1)

# ---------------------------------------------------------------- the claim


_OPEN = "coalesce(q.is_paused, 0) = 0 AND coalesce(q.is_active, 1) = 1"
# The open queues with Pending rows, due or not, and whether each is capped (max_workers).
PENDING_QUEUES_SQL = (f"WITH {pending_queues(' INDEXED BY hot_queue_stats')}\n"
                      "SELECT pq.queue, q.max_workers IS NOT NULL FROM pq"
                      f" LEFT JOIN {QUEUES} q ON q.name = pq.queue WHERE pq.queue IS NOT NULL AND {_OPEN}")
NAMED_QUEUES_SQL = f"""
SELECT DISTINCT j.value, q.max_workers IS NOT NULL FROM json_each(%s) j LEFT JOIN {QUEUES} q ON q.name = j.value
WHERE {_OPEN}
"""
# Per open queue, its first due rows in claim order, read in index order (no sort of the backlog): rows
# without a schedule through hot_fetch_due (all due, in claim order: an exact range), due scheduled rows through
# hot_pending_lag (a range, then a small sort).
# ``{hold}``: what rate limits hold back (BaseDialect.hold_clause), empty without limits.
_STREAM = f"""SELECT * FROM (
    SELECT h.id, h.queue, h.priority, h.{{key}} AS sort_at FROM {HOT} h INDEXED BY {{index}}
    WHERE h.queue = %s AND h.status = 0 AND {{due}}{{{{hold}}}}
    ORDER BY h.priority DESC, {{order}} LIMIT %s)"""
_STREAMS = (f"{_STREAM.format(key='created_at', index='hot_fetch_due', due='h.scheduled_at IS NULL', order='h.created_at')}"
            f" UNION ALL {_STREAM.format(key='scheduled_at', index='hot_pending_lag', due='h.scheduled_at <= %s',
                                         order='h.scheduled_at, h.created_at')}")
# No capped queue in reach: the window's first rows are the claim (params: the window's, worker, now).
PLAIN_CLAIM_SQL = (f"WITH win AS ({{window}})\nUPDATE {HOT} SET status = 1, worker_id = %s, last_updated_at = %s"
                   f" WHERE id IN (SELECT id FROM win) AND +status = 0 RETURNING {', '.join(HOT_FIELDS)}")
MAX_STREAMED_QUEUES = 200  # two compound terms per queue; SQLite allows 500 per statement
MAX_STREAMED_HOLD_PARAMS = 4000  # a hold's parameters repeat in both streams of every queue (32,766 per statement)


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
              "int": "%s", "ago": "%s", "trimmed": TRIMMED.format(trim="trim", chr="char"), "lazy": "",
              "rowlock": "", "differs": "new_payload IS NOT payload"}

    ENQUEUE_IN_ONE_STATEMENT = True  # once a queue has its rows (enqueue_alone)
    ONE_WRITER = True  # one write lock per database file (storage's write turns)
    SPENDS_ALONE = True  # a planned lease's bucket swaps and the lease commit one by one (see lease_spending)

    def clock(self, at: datetime | None = None) -> list[Any]:
        return [_ts(at or datetime.now(UTC))]

    def ids_param(self, ids: Sequence[str]) -> Any:
        return json.dumps(list(dict.fromkeys(ids)))

    def id_list(self, ids: Sequence[str]) -> tuple[str, list[Any]]:
        """One JSON array parameter, not ``IN (%s, …)``: the statement's text must not depend on how many ids it
        names. The sqlite3 module prepares and keeps (up to 128 per connection) one program per distinct text, so
        a completion's history upsert (4 KiB of SQL) cached a program per batch size: +2.5 MiB in a worker
        over a drain."""
        return (f"IN {_IDS}", [self.ids_param(ids)]) if ids else super().id_list(ids)

    def ago_params(self, seconds: float) -> list[Any]:
        return [_ts(datetime.now(UTC) - timedelta(seconds=seconds))]  # a text cutoff: the comparison stays on its index

    def items_params(self, rows: Sequence[Mapping[str, Any]]) -> list[Any]:
        return [json.dumps(list(rows))]

    def delay_fields(self, seconds: float | None) -> dict[str, Any]:
        return {"scheduled_at": None if seconds is None else _ts(datetime.now(UTC) + timedelta(seconds=seconds))}

    def items_table(self, columns: Mapping[str, str]) -> str:
        return f"(SELECT {', '.join(f'{_ITEM.format(c)} AS {c}' for c in columns)} FROM json_each(%s)) AS a"

    def pack(self, sql: str, width: int, order: str) -> str:
        """The aggregate reads its rows in the order of the subquery (not flattened into an aggregate)."""
        cols = ", ".join(f"c{i}" for i in range(width))
        return (f"(WITH t({cols}) AS ({sql})"
                f" SELECT json_group_array(json_array({cols})) FROM (SELECT * FROM t ORDER BY {order}))")

    def param_ts(self, value: datetime | None) -> Any:
        return _ts(value)

    def queue_health_params(self) -> list[Any]:
        now = _ts(datetime.now(UTC))
        return [now, now]

    def now(self) -> tuple[str, list[Any]]:
        return "%s", [_ts(datetime.now(UTC))]

    def change_marker(self, cursor: Cursor) -> int | None:
        """Changes whenever another connection commits; read without a lock (the WAL index)."""
        return int(self._one(cursor, "PRAGMA data_version")[0])

    def change_file(self, database: str) -> str | None:
        """The database file itself; None for an in-memory database."""
        memory = not database or database == ":memory:" or "mode=memory" in database
        return None if memory else database.removeprefix("file:").partition("?")[0]

    def insert_jobs(self, cursor: Cursor, jobs: Sequence[NewJob], retry: bool) -> tuple[set[str], dict[str, str]]:
        """One insert of the batch as JSON items (taken keys skipped), then the queues' rows."""
        stamp = _ts(datetime.now(UTC))
        cursor.execute(ENQUEUE_SQL, [stamp, stamp, json.dumps([job_item(j, **self.delay_fields(j.delay_seconds))
                                                               for j in jobs])])
        inserted = {str(row[0]) for row in cursor.fetchall()}
        queues = json.dumps(sorted({job.queue for job in jobs}))
        cursor.execute(f"INSERT INTO {QUEUES} (name, is_paused, is_active, last_updated_at) SELECT value, 0, 1, %s"
                       " FROM json_each(%s) WHERE true ON CONFLICT (name) DO NOTHING", [stamp, queues])
        cursor.execute(f"INSERT INTO {STATS} (queue, last_activity_at) SELECT value, %s FROM json_each(%s) WHERE true"
                       " ON CONFLICT (queue) DO NOTHING", [stamp, queues])
        return inserted, self.key_holders(cursor, jobs, inserted)

    def enqueue_alone(self, cursor: Cursor, jobs: Sequence[NewJob]) -> list[str] | None:
        """One INSERT that commits itself (no BEGIN IMMEDIATE, no queue upserts, no COMMIT) once the batch's
        queues have their rows; None, having inserted nothing, while one does not (the first job of a queue)."""
        stamp = _ts(datetime.now(UTC))
        names = sorted({job.queue for job in jobs})
        queues = json.dumps(names)
        cursor.execute(ENQUEUE_KNOWN_SQL, [stamp, stamp, json.dumps([job_item(j, **self.delay_fields(j.delay_seconds))
                                                                     for j in jobs]),
                                           queues, len(names), queues, len(names)])
        inserted = {str(row[0]) for row in cursor.fetchall()}
        return [job.id for job in jobs] if inserted else None

    def claim(self, cursor: Cursor, worker_id: str, limit: int, queues: list[str] | None,
              hold: ClaimHold | None = None) -> list[Any]:
        """The claim under ``BEGIN IMMEDIATE`` (two statements: open queues, claim).

        With a capped queue in reach the scan window is the first 10 x limit due rows in claim order, as on
        PostgreSQL: per open queue two index-ordered streams, merged. Ranking only these keeps a claim cheap
        whatever the backlog (a queue's rows in the window are exactly its first rows, so the per-queue rank is the
        true one). Without one there is no bulkhead to apply: the first ``limit`` rows of the window are the claim
        (a third of the 10x window's time: no 10x scan, sort and ranking)."""
        now = _ts(datetime.now(UTC))
        if queues is None:
            cursor.execute(PENDING_QUEUES_SQL)
        else:
            cursor.execute(NAMED_QUEUES_SQL, [json.dumps(sorted(set(queues)))])
        held_queues = set(hold.queues) if hold else set()
        reach = {str(name): bool(capped) for name, capped in cursor.fetchall() if name not in held_queues}
        open_queues = sorted(reach)
        if not open_queues:
            return []
        capped = any(reach.values())
        # the streams cut a run of rows tied on (priority, due time) anywhere, so without a ranking to feed they
        # still read twice the claim: the window's id order then holds across a tie the claim ends in
        scan, candidates = (limit * 10, limit * 10) if capped else (limit, limit * 2)
        clause, held = self.hold_clause(hold)
        if len(open_queues) <= MAX_STREAMED_QUEUES and len(held) * len(open_queues) <= MAX_STREAMED_HOLD_PARAMS:
            stream = _STREAMS.format(hold=clause)
            window = f"SELECT * FROM ({' UNION ALL '.join([stream] * len(open_queues))}) ORDER BY priority DESC, sort_at, id LIMIT %s"
            params: list[Any] = [p for name in open_queues
                                 for p in (name, *held, candidates, name, now, *held, candidates)] + [scan]
        else:  # very many queues: one ranked read of the due rows instead of 2 streams per queue
            window = f"""SELECT h.id, h.queue, h.priority, coalesce(h.scheduled_at, h.created_at) AS sort_at
                FROM {HOT} h WHERE h.status = 0 AND (h.scheduled_at IS NULL OR h.scheduled_at <= %s)
                  AND h.queue IN (SELECT value FROM json_each(%s)){clause}
                ORDER BY h.priority DESC, sort_at, h.id LIMIT %s"""
            params = [now, json.dumps(open_queues), *held, scan]
        if capped:
            cursor.execute(self.claim_sql(window, "%s", "%s", "%s"), [*params, limit, worker_id, now])
        else:
            cursor.execute(PLAIN_CLAIM_SQL.format(window=window), [*params, worker_id, now])
        return list(cursor.fetchall())

    MOVED_NOW = _NOW
    DUE_ITEMS = {"scheduled_at": "ts"}
    DUE = "a.scheduled_at"
    ZOMBIE_SOURCE = "(SELECT %s AS timeout, %s AS error_details) AS a"
    # Spec 01 §4.12: a queue's own timeout, else the global one (seconds, as julianday fractions of a day).
    ZOMBIE_WHERE = (f"h.status = 2 AND julianday(coalesce(h.heartbeat_at, h.last_updated_at)) < julianday({_NOW})"
                    f" - coalesce((SELECT q.zombie_timeout_seconds FROM {QUEUES} q WHERE q.name = h.queue), a.timeout)"
                    " / 86400.0")

    def completion(self, move: Move, source: str, on: str | None, where: str, values: Mapping[str, str],
                   sets: str = "", sweep: bool = False) -> str:
        """One statement lands the rows (a retry: updates them; a purge: deletes them) and returns them with what
        the counters read; ``_move`` then deletes landed rows where they were and counts them (RETURNING cannot feed
        an INSERT here). The source is the outer loop (CROSS JOIN keeps SQLite's join order), so the rows are read by
        primary key."""
        keep = f"{where} RETURNING id, {move.counted}"
        if move is RETRY:
            return f"{_CLOCK}UPDATE {HOT} AS h SET {sets} FROM {source} WHERE {on} AND {keep}"
        if move.table is None:
            return f"{_CLOCK}DELETE FROM {move.origin} AS h WHERE EXISTS (SELECT 1 FROM {source}) AND {keep}"
        landed = carried_values(move.carried, "h", values)
        rows = f"{source} CROSS JOIN {move.origin} AS h WHERE {f'{on} AND ' if on else ''}{keep}"
        return f"{_CLOCK}{insert_moved(move, rows, _NOW, landed)}"

    def _move(self, cursor: Cursor, move: Move, sql: str, params: list[Any]) -> Moved:
        """Run a ``completion`` statement, then delete the landed rows where they were and count them."""
        cursor.execute(sql, params)
        rows = cursor.fetchall()
        if not rows:
            return []
        moved = [(str(row[0]), str(row[1])) for row in rows]
        if move.table is not None:
            cursor.execute(f"DELETE FROM {move.origin} WHERE id IN {_IDS}", [json.dumps([i for i, _ in moved])])
        now = datetime.now(UTC)
        stamp = _ts(now)
        counted = json.dumps([row[1:] for row in rows])
        if move.origin != HOT:  # back to Pending or purged: off its counter
            touched = [stamp] if move is TO_HOT else []
            cursor.execute(uncount_sql(move.counter, _COUNTED, "%s" if touched else None), [*touched, counted])
        else:
            cursor.execute(self.stats_add(move.counter, _COUNTED, "%s"), [stamp, counted])
        if move.outcome is not None:
            cursor.execute(self.bucket_add(move.outcome, _COUNTED, "%s", "%s"),
                           [_ts(now.replace(microsecond=0)), stamp, counted])
        return moved


DIALECT: Dialect = SQLiteDialect()
