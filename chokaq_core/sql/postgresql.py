"""PostgreSQL dialect: every transition of the ``Dialect`` protocol as raw SQL.

Rules followed by every function here (spec 01 §1.2, §1.3, §3):

* ``cursor`` is a raw psycopg3 cursor taking ``%s`` placeholders; ``storage``
  owns the transaction (READ COMMITTED) — nothing here commits or rolls back.
* Every timestamp is the database clock ``now()`` (the transaction start).
* A move between pillars is one statement of data-modifying CTEs: ``moved``
  deletes with the guard, ``ins`` inserts exactly those rows, ``stats`` /
  ``bucket`` upsert the counters grouped by queue (and reason) so no upsert
  touches a row twice. Batches travel as arrays (``unnest`` / ``= ANY``), so a
  whole batch is one round trip.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from chokaq_core.domain import (
    DeckSnapshot,
    FailedAttempt,
    FailureReason,
    HotJob,
    JobFilter,
    NewJob,
    SnapshotRequest,
    StorageError,
)
from chokaq_core.sql import Cursor, Dialect, Moved
from chokaq_core.sql.base import (
    ACTIVE_SQL,
    ACTIVE_WIDTH,
    ARCHIVE_FIELDS,
    CARRIED_REVISION,
    DLQ_FIELDS,
    EMPTY_ERROR,
    ERROR_GROUP_WIDTH,
    HOT_FIELDS,
    LIST_WORKERS_SQL,
    QUEUE_STATES_SQL,
    QUEUE_STATS_SQL,
    REVISION_BUMP,
    SINGLE_STATEMENTS,
    SUMMARY_STATS_SQL,
    SUMMARY_WIDTH,
    THROUGHPUT_SQL,
    TOP_ERRORS_SAMPLE,
    WORKER_FIELDS,
    StatementDialect,
    escaped_like,
    hot_job,
    last_error_set,
    locate_statement,
    revision_guard,
    snapshot_of,
)

NOTIFY_CHANNEL = "chokaq_jobs"

# The hot path's statements: fixed texts (arrays, never a growing list of placeholders) that storage runs
# through a preparing, server-side binding cursor, so PostgreSQL parses and plans each once per connection.
# ``enqueue`` of jobs without idempotency keys is one statement (see ENQUEUE_SQL): autocommit is enough.
ONE_STATEMENT_WITHOUT_KEYS = frozenset({"enqueue"})

PREPARED = frozenset({
    "enqueue", "fetch_batch", "mark_processing_batch", "keep_alive", "cancel_requests", "archive_succeeded",
    "move_to_dlq", "reschedule_for_retry", "deck_snapshot",
})

# Every function but enqueue is one statement (a move is one CTE statement) or a read,
# so storage may run it in autocommit; enqueue may need a by-key lookup and a re-insert.
AUTOCOMMIT_SAFE = SINGLE_STATEMENTS | {
    "archive_succeeded", "move_to_dlq", "reschedule_for_retry", "resurrect", "resurrect_batch", "cancel_batch",
    "purge_dlq_ids", "purge_dlq_older_than", "purge_archive", "archive_zombies", "purge_dlq_by_filter",
    "purge_archive_ids", "purge_workers", "purge_metric_buckets", "tidy_hot_table", "record_attempts", "purge_attempts",
}


WORKER_GUARD = "(%s::text IS NULL OR h.worker_id = %s)"
ID_ARRAY = "= ANY(%s::text[])"  # matches ids given as one array parameter


# ---------------------------------------------------------------- SQL builders


NO_ERROR = {"error_class": "NULL::varchar", "error_message": "NULL::varchar"}  # a DLQ move no exception caused


def _returning(columns: Iterable[str], stamp: str, overrides: Mapping[str, str]) -> str:
    """``RETURNING`` list of a ``moved`` CTE: ``h.<col>`` unless overridden (a moved row's revision goes up
    by one); skips the stamp column."""
    overrides = {"revision": f"h.{CARRIED_REVISION}", **NO_ERROR, **overrides}
    return ", ".join(f"{overrides[c]} AS {c}" if c in overrides else f"h.{c}" for c in columns if c != stamp)


def _insert_moved(table: str, columns: Sequence[str], stamp: str, returning: str) -> str:
    """``ins`` CTE: copy ``moved`` into ``table`` with ``stamp`` = now()."""
    select = ", ".join("now()" if c == stamp else c for c in columns)
    return (
        f"ins AS (INSERT INTO {table} ({', '.join(columns)})\n"
        f"    SELECT {select} FROM moved\n"
        f"    RETURNING {returning})"
    )


# Both ``ins`` forms return (queue, failure_reason, duration_ms), the shape the bucket upsert reads.
ARCHIVE_INSERT = _insert_moved(
    "chokaq_jobs_archive", ARCHIVE_FIELDS, "finished_at", "queue, -1 AS failure_reason, duration_ms"
)
DLQ_INSERT = _insert_moved(
    "chokaq_jobs_dlq", DLQ_FIELDS, "failed_at", "queue, failure_reason, NULL::float8 AS duration_ms"
)


def _stats_add(counter: str, source: str) -> str:
    """``stats`` CTE: ``counter += rows of source`` per queue, inserting a missing row."""
    return (
        f"stats AS (INSERT INTO chokaq_stats_summary AS s (queue, {counter}, last_activity_at)\n"
        f"    SELECT queue, count(*), now() FROM {source} GROUP BY queue ORDER BY queue\n"
        f"    ON CONFLICT (queue) DO UPDATE SET {counter} = s.{counter} + EXCLUDED.{counter},\n"
        f"        last_activity_at = EXCLUDED.last_activity_at)"
    )


def _stats_sub(counter: str, source: str, touch: bool = False) -> str:
    """``dec`` CTE: ``counter = greatest(counter - n, 0)`` per queue, update only."""
    touched = ", last_activity_at = now()" if touch else ""
    return (
        f"dec AS (UPDATE chokaq_stats_summary s SET {counter} = greatest(s.{counter} - c.n, 0){touched}\n"
        f"    FROM (SELECT queue, count(*) AS n FROM {source} GROUP BY queue) c WHERE s.queue = c.queue)"
    )


def _bucket_add(outcome: int) -> str:
    """``bucket`` CTE (spec 01 §4.13) fed by ``ins`` (queue, failure_reason, duration_ms)."""
    return (
        "bucket AS (INSERT INTO chokaq_metric_buckets AS b (bucket_start, queue, outcome, failure_reason,\n"
        "        completed_count, duration_count, total_duration_ms, max_duration_ms, last_updated_at)\n"
        f"    SELECT date_trunc('second', now()), queue, {outcome}, failure_reason, count(*), count(duration_ms),\n"
        "           coalesce(sum(duration_ms), 0), max(duration_ms), now()\n"
        "    FROM ins GROUP BY queue, failure_reason ORDER BY queue, failure_reason\n"
        "    ON CONFLICT (bucket_start, queue, outcome, failure_reason) DO UPDATE SET\n"
        "        completed_count = b.completed_count + EXCLUDED.completed_count,\n"
        "        duration_count = b.duration_count + EXCLUDED.duration_count,\n"
        "        total_duration_ms = b.total_duration_ms + EXCLUDED.total_duration_ms,\n"
        "        max_duration_ms = GREATEST(b.max_duration_ms, EXCLUDED.max_duration_ms),\n"
        "        last_updated_at = EXCLUDED.last_updated_at)"
    )


def _completion(ctes: str, insert: str, counter: str, outcome: int) -> str:
    """A whole Hot → Archive/DLQ move: ``ctes`` must end with the ``moved`` DELETE."""
    return (
        f"WITH {ctes},\n{insert},\n{_stats_add(counter, 'ins')},\n{_bucket_add(outcome)}\nSELECT id, queue FROM moved"
    )


def _purge(table: str, where: str, order: str, counter: str, result: str) -> str:
    """One skip-locked batch delete of ``table`` decrementing ``counter`` (spec 01 §4.10)."""
    return (
        f"WITH picked AS (SELECT id FROM {table} WHERE {where} ORDER BY {order} LIMIT %s FOR UPDATE SKIP LOCKED),\n"
        f"del AS (DELETE FROM {table} d USING picked p WHERE d.id = p.id RETURNING d.id, d.queue),\n"
        f"{_stats_sub(counter, 'del')}\n"
        f"SELECT {result} FROM del"
    )


# ---------------------------------------------------------------- statements

# One statement: the rows, their queues' control and counter rows, and one NOTIFY per queue that got a row
# (delivered at commit, like every NOTIFY). Without idempotency keys it is the whole enqueue, so storage runs
# it in autocommit when the caller has no transaction open: one round trip instead of BEGIN/…/COMMIT.
ENQUEUE_SQL = f"""
WITH src AS (
    SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[],
                         %s::int[], %s::float8[], %s::text[])
        AS t(id, queue, type, payload, tags, idempotency_key, priority, delay_seconds, created_by)),
ins AS (
    INSERT INTO chokaq_jobs_hot (id, queue, type, payload, tags, idempotency_key, priority, status,
        attempt_count, scheduled_at, created_at, last_updated_at, created_by)
    SELECT id, queue, type, payload, tags, idempotency_key, priority, 0, 0,
           CASE WHEN delay_seconds IS NULL THEN NULL ELSE now() + make_interval(secs => delay_seconds) END,
           now(), now(), created_by
    FROM src
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue),
names AS (SELECT DISTINCT queue FROM src),
queues AS (
    INSERT INTO chokaq_queues (name, is_paused, is_active, last_updated_at)
    SELECT queue, false, true, now() FROM names ORDER BY queue
    ON CONFLICT (name) DO NOTHING),
stats AS (
    INSERT INTO chokaq_stats_summary (queue) SELECT queue FROM names ORDER BY queue
    ON CONFLICT (queue) DO NOTHING),
notified AS (SELECT pg_notify('{NOTIFY_CHANNEL}', queue) FROM (SELECT DISTINCT queue FROM ins ORDER BY queue) q)
SELECT id, queue FROM ins WHERE (SELECT count(*) FROM notified) >= 0
"""

IDS_BY_KEY_SQL = "SELECT idempotency_key, id FROM chokaq_jobs_hot WHERE idempotency_key = ANY(%s::text[])"


def _fetch_sql(queue_filter: bool) -> str:
    """Spec 01 §4.2: lock a window of due rows, rank per queue, apply the bulkhead, claim.

    The window is found through ``hot_fetch_pending`` instead of sorting every Pending
    row: per open queue, two index-ordered streams (due rows without ``scheduled_at``
    by ``created_at``, due scheduled rows by ``scheduled_at``) each give their first
    rows already in (priority desc, coalesce(scheduled_at, created_at)) order, so their
    merge holds exactly the spec's candidates. The candidate pool is twice the lock
    window, so a claimer still fills its window while another claimer holds one.
    ``queues`` None walks the distinct queues with Pending rows (a loose index scan),
    since a queue with no ``chokaq_queues`` row is still eligible. Rows are re-read by
    ``id = ANY(ARRAY(...))`` so the plan stays primary-key lookups even before the
    table is analysed.
    """
    if queue_filter:
        recursive, names = "", "SELECT DISTINCT name FROM unnest(%(queues)s::text[]) AS name"
    else:
        recursive = """RECURSIVE pending_queues AS (
    (SELECT queue FROM chokaq_jobs_hot WHERE status = 0 ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT h.queue FROM chokaq_jobs_hot h WHERE h.status = 0 AND h.queue > p.queue ORDER BY h.queue LIMIT 1)
    FROM pending_queues p WHERE p.queue IS NOT NULL),
"""
        names = "SELECT queue AS name FROM pending_queues WHERE queue IS NOT NULL"
    stream = """(SELECT h.id, h.priority, {key} AS sort_at FROM chokaq_jobs_hot h
         WHERE h.queue = n.name AND h.status = 0 AND {due}
         ORDER BY h.priority DESC, h.scheduled_at, h.created_at LIMIT %(candidates)s)"""
    return f"""
WITH {recursive}open_queues AS (
    SELECT n.name FROM ({names}) n LEFT JOIN chokaq_queues q ON q.name = n.name
    WHERE coalesce(q.is_paused, false) = false AND coalesce(q.is_active, true)),
candidates AS (
    SELECT c.id, c.priority, c.sort_at FROM open_queues n CROSS JOIN LATERAL (
        {stream.format(key="h.created_at", due="h.scheduled_at IS NULL")}
        UNION ALL
        {stream.format(key="h.scheduled_at", due="h.scheduled_at <= now()")}) c
    ORDER BY c.priority DESC, c.sort_at, c.id
    LIMIT %(candidates)s),
locked AS (
    SELECT h.id, h.queue, h.priority, coalesce(h.scheduled_at, h.created_at) AS sort_at
    FROM chokaq_jobs_hot h
    WHERE h.id = ANY(ARRAY(SELECT id FROM candidates))
      AND h.status = 0 AND (h.scheduled_at IS NULL OR h.scheduled_at <= now())
    ORDER BY h.priority DESC, sort_at, h.id
    LIMIT %(scan)s
    FOR UPDATE OF h SKIP LOCKED),
capped AS (
    SELECT DISTINCT l.queue FROM locked l JOIN chokaq_queues q ON q.name = l.queue
    WHERE q.max_workers IS NOT NULL),
active AS (
    SELECT queue, count(*) AS n FROM chokaq_jobs_hot
    WHERE status IN (1, 2) AND queue IN (SELECT queue FROM capped) GROUP BY queue),
ranked AS (
    SELECT l.id, l.priority, l.sort_at, q.max_workers, coalesce(a.n, 0) AS cur,
           row_number() OVER (PARTITION BY l.queue ORDER BY l.priority DESC, l.sort_at, l.id) AS rnk
    FROM locked l LEFT JOIN chokaq_queues q ON q.name = l.queue
                  LEFT JOIN active a ON a.queue = l.queue),
picked AS (
    SELECT id FROM ranked
    WHERE max_workers IS NULL OR cur + rnk <= max_workers
    ORDER BY priority DESC, sort_at, id LIMIT %(limit)s),
claimed AS (
    UPDATE chokaq_jobs_hot h SET status = 1, worker_id = %(worker)s, last_updated_at = now()
    WHERE h.id = ANY(ARRAY(SELECT id FROM picked)) AND h.status = 0
    RETURNING {", ".join(f"h.{c}" for c in HOT_FIELDS)})
SELECT * FROM claimed ORDER BY priority DESC, coalesce(scheduled_at, created_at), id
"""


FETCH_ALL_SQL = _fetch_sql(queue_filter=False)
FETCH_QUEUES_SQL = _fetch_sql(queue_filter=True)
# Claimers of a capped queue take turns: the claim statement counts the queue's active rows in
# its own snapshot, which cannot see another claimer's uncommitted claim. Locking the capped
# queues' control rows first (held to commit) makes the next claim statement's fresh READ
# COMMITTED snapshot include every earlier claim, so MaxWorkers holds fleet-wide.
LOCK_CAPPED_ALL_SQL = "SELECT name FROM chokaq_queues WHERE max_workers IS NOT NULL ORDER BY name FOR UPDATE"
LOCK_CAPPED_QUEUES_SQL = (
    "SELECT name FROM chokaq_queues WHERE max_workers IS NOT NULL AND name = ANY(%(queues)s) ORDER BY name FOR UPDATE"
)

MARK_PROCESSING_SQL = """
UPDATE chokaq_jobs_hot
SET status = 2, attempt_count = attempt_count + 1, started_at = now(), heartbeat_at = now(), last_updated_at = now()
WHERE id = %s AND worker_id = %s AND status = 1
RETURNING attempt_count
"""

MARK_PROCESSING_BATCH_SQL = """
UPDATE chokaq_jobs_hot
SET status = 2, attempt_count = attempt_count + 1, started_at = now(), heartbeat_at = now(), last_updated_at = now()
WHERE id = ANY(%s) AND worker_id = %s AND status = 1
RETURNING id, attempt_count
"""

KEEP_ALIVE_SQL = """
UPDATE chokaq_jobs_hot SET heartbeat_at = now(), last_updated_at = now()
WHERE id = ANY(%s::text[]) AND status = 2 AND worker_id = %s
RETURNING id
"""

CANCEL_REQUESTS_SQL = """
SELECT id, cancel_requested_by FROM chokaq_jobs_hot
WHERE worker_id = %s AND status = 2 AND cancel_requested_by IS NOT NULL
"""

ARCHIVE_SUCCEEDED_SQL = _completion(
    "items AS (SELECT * FROM unnest(%s::text[], %s::float8[], %s::text[]) AS t(id, duration_ms, result)),\n"
    "moved AS (DELETE FROM chokaq_jobs_hot h USING items i\n"
    f"    WHERE h.id = i.id AND {WORKER_GUARD}\n"
    f"    RETURNING {_returning(ARCHIVE_FIELDS, 'finished_at', {'duration_ms': 'i.duration_ms', 'result': 'i.result'})})",
    ARCHIVE_INSERT,
    "succeeded_total",
    0,
)

MOVE_TO_DLQ_SQL = _completion(
    "items AS (SELECT * FROM unnest(%s::text[], %s::int[], %s::text[], %s::text[], %s::text[])\n"
    "    AS t(id, failure_reason, error_details, error_class, error_message)),\n"
    "moved AS (DELETE FROM chokaq_jobs_hot h USING items i\n"
    f"    WHERE h.id = i.id AND {WORKER_GUARD}\n"
    "    RETURNING "
    + _returning(DLQ_FIELDS, "failed_at", {c: f"i.{c}" for c in
                                           ("failure_reason", "error_details", "error_class", "error_message")})
    + ")",
    DLQ_INSERT,
    "failed_total",
    1,
)

CANCEL_BATCH_SQL = _completion(
    "moved AS (DELETE FROM chokaq_jobs_hot h WHERE h.id = ANY(%s::text[]) AND h.status IN (0, 1)\n"
    "    RETURNING "
    + _returning(
        DLQ_FIELDS,
        "failed_at",
        {
            "failure_reason": str(int(FailureReason.CANCELLED)),
            "error_details": "%s::text",
            "last_modified_by": "%s::text",
        },
    )
    + ")",
    DLQ_INSERT,
    "failed_total",
    1,
)

ARCHIVE_ZOMBIES_SQL = _completion(
    "moved AS (DELETE FROM chokaq_jobs_hot h\n"
    "    WHERE h.status = 2 AND coalesce(h.heartbeat_at, h.last_updated_at) < now() - make_interval(secs =>\n"
    "        coalesce((SELECT q.zombie_timeout_seconds FROM chokaq_queues q WHERE q.name = h.queue), %s::float8))\n"
    "    RETURNING "
    + _returning(
        DLQ_FIELDS,
        "failed_at",
        {"failure_reason": str(int(FailureReason.ZOMBIE)), "error_details": "%s::text"},
    )
    + ")",
    DLQ_INSERT,
    "failed_total",
    1,
)

RESCHEDULE_SQL = f"""
WITH items AS (SELECT * FROM unnest(%s::text[], %s::int[], %s::float8[], %s::text[], %s::text[], %s::text[])
               AS t(id, attempt_count, delay_seconds, error_class, error_message, held_by)),
upd AS (
    UPDATE chokaq_jobs_hot h
    SET status = 0, attempt_count = i.attempt_count, scheduled_at = now() + make_interval(secs => i.delay_seconds),
        worker_id = NULL, heartbeat_at = NULL, cancel_requested_by = NULL, last_updated_at = now(),
        {last_error_set("i.error_class", "i.error_message", "i.held_by", "now()", "h.")}
    FROM items i WHERE h.id = i.id AND {WORKER_GUARD}
    RETURNING h.id, h.queue),
{_stats_add("retried_total", "upd")}
SELECT id, queue FROM upd
"""

RELEASE_SQL = """
UPDATE chokaq_jobs_hot SET status = 0, worker_id = NULL, last_updated_at = now()
WHERE id = ANY(%s::text[]) AND status = 1 AND worker_id = %s
"""

# Spec 01 §4.7/§4.8: one statement for the single (edited) and the batch form.
RESURRECT_SQL = f"""
WITH moved AS (
    DELETE FROM chokaq_jobs_dlq WHERE id = ANY(%s::text[]) AND {revision_guard("%s::int")}
    RETURNING id, queue, type, payload, tags, created_by, created_at, revision),
ins AS (
    INSERT INTO chokaq_jobs_hot (id, queue, type, payload, tags, priority, status, attempt_count,
        created_at, last_updated_at, created_by, last_modified_by, revision)
    SELECT id, queue, type, coalesce(%s::text, payload), coalesce(%s::text, tags), coalesce(%s::int, 10), 0, 0,
           created_at, now(), created_by, %s::text, {CARRIED_REVISION}
    FROM moved
    RETURNING id, queue),
{_stats_sub("failed_total", "ins", touch=True)}
SELECT id, queue FROM ins
"""

REQUEST_CANCEL_SQL = """
UPDATE chokaq_jobs_hot SET cancel_requested_by = %s
WHERE id = ANY(%s::text[]) AND status = 2
RETURNING id
"""

UPDATE_HOT_SQL = f"""
UPDATE chokaq_jobs_hot
SET payload = coalesce(%s::text, payload), tags = coalesce(%s::text, tags), priority = coalesce(%s::int, priority),
    last_modified_by = %s, last_updated_at = now(), {REVISION_BUMP}
WHERE id = %s AND status = 0 AND {revision_guard("%s::int")}
RETURNING id
"""

UPDATE_DLQ_SQL = f"""
WITH edit AS (SELECT %s::text AS new_payload, %s::text AS new_tags, %s::text AS actor)
UPDATE chokaq_jobs_dlq
SET previous_payload = CASE WHEN coalesce(new_payload, payload) IS DISTINCT FROM payload
                            THEN payload ELSE previous_payload END,
    payload = coalesce(new_payload, payload), tags = coalesce(new_tags, tags), last_modified_by = actor, {REVISION_BUMP}
FROM edit WHERE id = %s AND {revision_guard("%s::int")}
RETURNING id
"""

PURGE_DLQ_IDS_SQL = _purge("chokaq_jobs_dlq", "id = ANY(%s::text[])", "failed_at, id", "failed_total", "id, queue")
PURGE_DLQ_OLDER_SQL = _purge("chokaq_jobs_dlq", "created_at <= %s", "created_at, id", "failed_total", "count(*)")
PURGE_ARCHIVE_SQL = _purge("chokaq_jobs_archive", "finished_at < %s", "finished_at, id", "succeeded_total", "count(*)")

RECOVER_ABANDONED_SQL = """
UPDATE chokaq_jobs_hot SET status = 0, worker_id = NULL, last_updated_at = now()
WHERE status = 1 AND last_updated_at < now() - make_interval(secs => %s::float8)
"""


# ---------------------------------------------------------------- helpers


def _moved(cursor: Cursor) -> Moved:
    return [(job_id, queue) for job_id, queue in cursor.fetchall()]


def _floats(values: Iterable[float | None]) -> list[float | None]:
    """psycopg picks an array's type from its items: keep them all floats."""
    return [None if v is None else float(v) for v in values]


def _unique_ids(job_ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(job_ids))


# ---------------------------------------------------------------- enqueue / claim


def _insert_jobs(cursor: Cursor, jobs: Sequence[NewJob]) -> dict[str, str]:
    """One multi-row insert (duplicate keys skipped); ``{id: queue}`` of the rows inserted."""
    cursor.execute(
        ENQUEUE_SQL,
        [
            [j.id for j in jobs],
            [j.queue for j in jobs],
            [j.type for j in jobs],
            [j.payload for j in jobs],
            [j.tags for j in jobs],
            [j.idempotency_key for j in jobs],
            [int(j.priority) for j in jobs],
            _floats(j.delay_seconds for j in jobs),
            [j.created_by for j in jobs],
        ],
    )
    return dict(cursor.fetchall())


# ---------------------------------------------------------------- completion (batched)


# ---------------------------------------------------------------- operator commands


# ---------------------------------------------------------------- maintenance


# ---------------------------------------------------------------- operations: retention, schedule, reads


PURGE_WORKERS_SQL = """
DELETE FROM chokaq_workers WHERE worker_id IN (
    SELECT worker_id FROM chokaq_workers WHERE last_heartbeat_at < %s
    ORDER BY last_heartbeat_at LIMIT %s FOR UPDATE SKIP LOCKED)
"""
PURGE_METRIC_BUCKETS_SQL = """
DELETE FROM chokaq_metric_buckets WHERE (bucket_start, queue, outcome, failure_reason) IN (
    SELECT bucket_start, queue, outcome, failure_reason FROM chokaq_metric_buckets WHERE bucket_start < %s
    ORDER BY bucket_start LIMIT %s FOR UPDATE SKIP LOCKED)
"""
INSERT_SCHEDULE_SQL = """
INSERT INTO chokaq_schedules (name, last_tick_at, updated_at) VALUES (%s, %s, now())
ON CONFLICT (name) DO NOTHING RETURNING name
"""
# A concurrent claimer blocks on the row lock, then re-reads last_tick_at and finds the tick taken.
ADVANCE_SCHEDULE_SQL = """
UPDATE chokaq_schedules SET last_tick_at = %s, updated_at = now() WHERE name = %s AND last_tick_at < %s
RETURNING name
"""
SCHEDULE_TICKS_SQL = "SELECT name, last_tick_at FROM chokaq_schedules"


HOT_DEAD_ROWS_SQL = "SELECT n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE relid = 'chokaq_jobs_hot'::regclass"
TIDY_LOCK_KEY = 0x43484F4B  # "CHOK": one vacuum of the Hot table at a time, fleet-wide
TRY_LOCK_SQL = "SELECT pg_try_advisory_lock(%s)"
UNLOCK_SQL = "SELECT pg_advisory_unlock(%s)"
VACUUM_HOT_SQL = "VACUUM (ANALYZE) chokaq_jobs_hot"


QUEUE_HEALTH_SQL = """
SELECT q.name, h.n, coalesce(h.avg_lag, 0), coalesce(h.max_lag, 0)
FROM chokaq_queues q CROSS JOIN LATERAL (
    SELECT count(*) AS n, avg(lag) AS avg_lag, max(lag) AS max_lag FROM (
        SELECT greatest(0, extract(epoch FROM now() - coalesce(h.scheduled_at, h.created_at)))::float8 AS lag
        FROM chokaq_jobs_hot h
        WHERE h.queue = q.name AND h.status = 0 AND (h.scheduled_at IS NULL OR h.scheduled_at <= now())) x) h
ORDER BY q.name
"""

TOP_ERRORS_SQL = """
WITH recent AS (
    SELECT failure_reason, failed_at, error_class, error_message,
           CASE WHEN error_class IS NULL THEN btrim(left(coalesce(error_details, ''), 4000), E' \\t\\r\\n') END AS e
    FROM chokaq_jobs_dlq ORDER BY failed_at DESC LIMIT %s)
SELECT failure_reason, CASE WHEN e IS NULL THEN '' WHEN e = '' THEN %s ELSE left(e, 160) END AS prefix,
       count(*) AS n, max(failed_at) AS latest, error_class, error_message
FROM recent GROUP BY failure_reason, error_class, error_message, prefix ORDER BY n DESC, latest DESC LIMIT %s
"""

PURGE_ARCHIVE_IDS_SQL = f"""
WITH del AS (DELETE FROM chokaq_jobs_archive WHERE id = ANY(%s::text[]) RETURNING id, queue),
{_stats_sub("succeeded_total", "del")}
SELECT id, queue FROM del
"""


PURGE_ATTEMPTS_SQL = """
DELETE FROM chokaq_job_attempts WHERE id IN (
    SELECT id FROM chokaq_job_attempts WHERE failed_at < %s ORDER BY failed_at LIMIT %s FOR UPDATE SKIP LOCKED)
"""


# ---------------------------------------------------------------- Deck bulk commands


# ---------------------------------------------------------------- the live Deck's one read (issue 7)


def _packed(sql: str, width: int, order: str) -> str:
    """A read as one JSON value: an array of positional rows (``sql.json_rows`` decodes it)."""
    cols = ", ".join(f"c{i}" for i in range(width))
    return (f"(SELECT coalesce(json_agg(json_build_array({cols}) ORDER BY {order}), '[]'::json)"
            f" FROM ({sql}) AS t({cols}))")


_SUMMARY_COLUMNS = ", ".join(f"c{i}" for i in range(SUMMARY_WIDTH))
DECK_SNAPSHOT_SQL = f"""
SELECT (SELECT json_build_array({_SUMMARY_COLUMNS}) FROM ({SUMMARY_STATS_SQL}) AS s({_SUMMARY_COLUMNS})),
       {_packed(ACTIVE_SQL.format(where=""), ACTIVE_WIDTH, "c5 DESC, c0 DESC")},
       {_packed(locate_statement(ID_ARRAY), 2, "c0")},
       CASE WHEN %s THEN {_packed(THROUGHPUT_SQL, 3, "c0")} END,
       CASE WHEN %s THEN json_build_array({_packed(QUEUE_STATES_SQL, 5, "c0")}, {_packed(QUEUE_STATS_SQL, 8, "c0")},
                                          {_packed(QUEUE_HEALTH_SQL, 4, "c0")}) END,
       CASE WHEN %s THEN {_packed(LIST_WORKERS_SQL, len(WORKER_FIELDS), "c10 DESC, c0")} END,
       CASE WHEN %s THEN {_packed(TOP_ERRORS_SQL, ERROR_GROUP_WIDTH, "c2 DESC, c3 DESC")} END
"""


# ---------------------------------------------------------------- attempts history

RECORD_ATTEMPTS_SQL = """
INSERT INTO chokaq_job_attempts
    (job_id, attempt, worker_id, error_class, error_message, traceback, failed_at, started_at)
SELECT a.job_id, a.attempt, %s::varchar, a.error_class, a.error_message, a.traceback, now(), a.started_at
FROM unnest(%s::varchar[], %s::int[], %s::varchar[], %s::text[], %s::text[], %s::timestamptz[])
     WITH ORDINALITY AS a(job_id, attempt, error_class, error_message, traceback, started_at, n)
ORDER BY a.n
"""


class PostgreSQLDialect(StatementDialect, statements=globals()):
    """The shared reads with PostgreSQL's id arrays and lower() LIKE (the same match as ILIKE, cheaper on a scan)."""

    PREPARED = PREPARED
    AUTOCOMMIT_SAFE = AUTOCOMMIT_SAFE
    ONE_STATEMENT_WITHOUT_KEYS = ONE_STATEMENT_WITHOUT_KEYS
    NOTIFY_CHANNEL: str | None = NOTIFY_CHANNEL

    def search_clause(self, column: str) -> str:
        return f"lower({column}) LIKE %s ESCAPE '\\'"

    def search_pattern(self, term: str) -> str:
        return escaped_like(term.lower())

    def id_list(self, ids: Sequence[str]) -> tuple[str, list[Any]]:
        return ID_ARRAY, [list(ids)]

    def enqueue(self, cursor: Cursor, jobs: Sequence[NewJob]) -> list[str]:
        """Insert Pending rows; a taken idempotency key yields the holder's id. NOTIFY per queue."""
        if not jobs:
            return []
        stored: dict[str, str] = {}
        todo = list(jobs)
        for _ in range(2):  # the second pass re-inserts jobs whose key holder left Hot meanwhile
            inserted = _insert_jobs(cursor, todo)
            stored.update((j.id, j.id) for j in todo if j.id in inserted)
            keys = sorted({j.idempotency_key for j in todo if j.id not in inserted and j.idempotency_key})
            holders: dict[str, str] = {}
            if keys:
                cursor.execute(IDS_BY_KEY_SQL, [keys])
                holders = dict(cursor.fetchall())
            stored.update(
                (j.id, holders[j.idempotency_key])
                for j in todo
                if j.id not in inserted and j.idempotency_key is not None and j.idempotency_key in holders
            )
            todo = [j for j in todo if j.id not in stored]
            if not todo:
                break
        else:
            raise StorageError(f"enqueue could not store or resolve {len(todo)} job(s): {[j.id for j in todo][:10]}")
        return [stored[j.id] for j in jobs]

    def fetch_batch(self, cursor: Cursor, worker_id: str, limit: int, queues: Sequence[str] | None) -> list[HotJob]:
        """Claim up to ``limit`` due Pending rows (Pending → Fetched) honouring pause, hide and bulkheads."""
        if limit <= 0 or (queues is not None and not queues):
            return []
        params: dict[str, Any] = {"limit": limit, "worker": worker_id}
        if queues is not None:
            params["queues"] = list(queues)
        if queues is None:
            cursor.execute(LOCK_CAPPED_ALL_SQL)
        else:
            cursor.execute(LOCK_CAPPED_QUEUES_SQL, {"queues": params["queues"]})
        if cursor.fetchall():
            # A capped queue is in reach: lock the spec's window of 10 x limit so the bulkhead ranking has rows of
            # every queue to choose from; twice as many candidates leave room for rows other claimers hold.
            params.update(scan=limit * 10, candidates=limit * 20)
        else:
            # No bulkhead to apply: the first ``limit`` unlocked due rows ARE the claim, so lock only those (every
            # row lock dirties its page: a 10x window made each claim lock 900 rows it then released).
            params.update(scan=limit, candidates=limit * 4)
        cursor.execute(FETCH_ALL_SQL if queues is None else FETCH_QUEUES_SQL, params)
        return [hot_job(row) for row in cursor.fetchall()]

    def tidy_hot_table(self, cursor: Cursor, min_dead_rows: int) -> bool:
        """VACUUM (ANALYZE) the Hot table when its dead row versions pass the threshold (autocommit only)."""
        cursor.execute(HOT_DEAD_ROWS_SQL)
        row = cursor.fetchone()
        live, dead = (int(row[0] or 0), int(row[1] or 0)) if row else (0, 0)
        if dead < min_dead_rows + 0.2 * live:
            return False
        cursor.execute(TRY_LOCK_SQL, [TIDY_LOCK_KEY])
        if not cursor.fetchone()[0]:
            return False  # another worker is at it
        try:
            cursor.execute(VACUUM_HOT_SQL)
        finally:
            cursor.execute(UNLOCK_SQL, [TIDY_LOCK_KEY])
        return True

    def claim_schedule_tick(self, cursor: Cursor, name: str, tick: datetime) -> bool:
        """Move ``name``'s latest tick forward to ``tick``; True for the one caller that did."""
        cursor.execute(INSERT_SCHEDULE_SQL, [name, tick])
        if cursor.fetchone() is not None:
            return False
        cursor.execute(ADVANCE_SCHEDULE_SQL, [tick, name, tick])
        return cursor.fetchone() is not None

    def change_marker(self, cursor: Cursor) -> int | None:
        """None: workers LISTEN for the NOTIFY of every enqueue instead."""
        return None

    def purge_dlq_by_filter(self, cursor: Cursor, filters: JobFilter, max_jobs: int) -> Moved:
        """Delete the first ``max_jobs`` matches (skip locked); FailedTotal -n."""
        where, params = self.dlq_where(filters)
        cursor.execute(
            f"WITH picked AS (SELECT id FROM chokaq_jobs_dlq{where} ORDER BY failed_at DESC, id ASC LIMIT %s"
            " FOR UPDATE SKIP LOCKED),\n"
            "del AS (DELETE FROM chokaq_jobs_dlq d USING picked p WHERE d.id = p.id RETURNING d.id, d.queue),\n"
            f"{_stats_sub('failed_total', 'del')}\nSELECT id, queue FROM del",
            [*params, max_jobs],
        )
        return _moved(cursor)

    def resurrect_dlq_by_filter(self, cursor: Cursor, filters: JobFilter, max_jobs: int, actor: str | None) -> Moved:
        """Lock the first ``max_jobs`` matches (skip locked), then move them to Hot as ``resurrect_batch``."""
        where, params = self.dlq_where(filters)
        cursor.execute(
            f"SELECT id FROM chokaq_jobs_dlq{where} ORDER BY failed_at DESC, id ASC LIMIT %s FOR UPDATE SKIP LOCKED",
            [*params, max_jobs],
        )
        ids = [row[0] for row in cursor.fetchall()]
        return self._resurrect(cursor, ids, actor=actor) if ids else []

    def deck_snapshot(self, cursor: Cursor, request: SnapshotRequest) -> DeckSnapshot:
        """Everything the live Deck shows in one statement (parts not asked for are skipped by their CASE)."""
        ids = _unique_ids(request.locate_ids)
        since = request.throughput_since
        cursor.execute(DECK_SNAPSHOT_SQL, [
            int(request.active_limit), ids, ids, ids,
            since is not None, since or datetime.fromtimestamp(0, UTC),
            request.queues, request.workers,
            request.errors_limit > 0, TOP_ERRORS_SAMPLE, EMPTY_ERROR, max(1, int(request.errors_limit)),
        ])
        totals, active, found, points, queues, workers, errors = cursor.fetchone()
        states, stats, lags = queues or (None, None, None)
        return snapshot_of(request, [totals], active, found, points, states, stats, lags, workers, errors)

    def record_attempts(self, cursor: Cursor, worker_id: str | None, attempts: Sequence[FailedAttempt]) -> None:
        """One INSERT … SELECT over unnest() arrays for the whole batch, in order."""
        if not attempts:
            return
        cursor.execute(RECORD_ATTEMPTS_SQL, [
            worker_id, [a.job_id for a in attempts], [a.attempt for a in attempts],
            [a.error.error_class for a in attempts], [a.error.message for a in attempts],
            [a.error.traceback for a in attempts], [a.started_at for a in attempts],
        ])


DIALECT: Dialect = PostgreSQLDialect()
