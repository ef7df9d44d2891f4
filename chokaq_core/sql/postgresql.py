"""PostgreSQL dialect: the SQL forms and hooks of ``BaseDialect`` that differ here.

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

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from itertools import chain
from operator import attrgetter
from typing import Any

from chokaq_core.domain import BucketSpend, ClaimHold, HotJob, NewJob
from chokaq_core.sql import Cursor, Dialect
from chokaq_core.sql.base import (
    HOT,
    HOT_FIELDS,
    MAX_HELD_KEYS,
    RETRY,
    TO_HOT,
    TRIMMED,
    BaseDialect,
    Move,
    StaleBuckets,
    as_utc,
    bulkhead,
    carried_values,
    counters_locked,
    history_rows,
    in_claim_order,
    insert_moved,
    pending_queues,
    queue_health_select,
    uncount_sql,
)

NOTIFY_CHANNEL = "chokaq_jobs"
# Always true; makes the commit of the statement's own transaction asynchronous (transaction-local: the
# connection's next transaction commits as configured again). Only the claim and the lease say it.
ASYNC_COMMIT = "set_config('synchronous_commit', 'off', true) = 'off'"

ID_ARRAY = "= ANY(%s::text[])"  # matches ids given as one array parameter
ITEM_TYPES = {"int": "int", "name": "varchar", "text": "text", "ts": "timestamptz", "float": "float8", "class": "text",
              "message": "text"}  # items_table kinds


# ---------------------------------------------------------------- statements

# One statement: the rows, their queues' control and counter rows, and one NOTIFY per queue that got a row
# (delivered at commit). Without keys it is the whole enqueue: storage runs it in autocommit outside a caller's
# transaction (one round trip). One job is ten parameters (no DISTINCT or sort: ~50 µs less server time); a batch
# one jsonb array of ``job_row``s (json.dumps is C; jsonb parses once); a large batch without keys or delays is a
# COPY (no JSON, no per-row plan: ~40 % less server time a row) after ENQUEUE_QUEUES_SQL, whose now() stamps it.
_ENQUEUE = f"""
WITH {{rows}}names AS ({{names}}),
queues AS (
    INSERT INTO chokaq_queues (name, is_paused, is_active, last_updated_at)
    SELECT queue, false, true, now() FROM names ORDER BY queue
    ON CONFLICT (name) DO NOTHING),
stats AS (
    INSERT INTO chokaq_stats_summary (queue) SELECT queue FROM names ORDER BY queue
    ON CONFLICT (queue) DO NOTHING),
notified AS (SELECT pg_notify('{NOTIFY_CHANNEL}', queue) FROM ({{notify}}) q)
SELECT {{result}} WHERE (SELECT count(*) FROM notified) >= 0
"""
_ROWS = """src AS (SELECT {} {}),
ins AS (
    INSERT INTO chokaq_jobs_hot (id, queue, type, payload, tags, idempotency_key, priority, status,
        attempt_count, scheduled_at, created_at, last_updated_at, created_by, rate_key)
    SELECT id, queue, type, payload, tags, idempotency_key, priority, 0, 0,
           CASE WHEN delay_seconds IS NULL THEN NULL ELSE now() + make_interval(secs => delay_seconds) END,
           now(), now(), created_by, rate_key
    FROM src
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue),
"""
_COLUMNS = {"id": "text", "queue": "text", "type": "text", "payload": "text", "tags": "text", "idempotency_key": "text",
            "priority": "int", "delay_seconds": "float8", "created_by": "text", "rate_key": "text"}  # job_row's
ENQUEUE_SQL = _ENQUEUE.format(rows=_ROWS.format(", ".join(f"(r->>{i})::{t} AS {c}" for i, (c, t) in enumerate(
    _COLUMNS.items())), "FROM jsonb_array_elements(%s::jsonb) AS r"), names="SELECT DISTINCT queue FROM src",
    notify="SELECT DISTINCT queue FROM ins ORDER BY queue", result="id, queue FROM ins")
ENQUEUE_ONE_SQL = _ENQUEUE.format(rows=_ROWS.format(", ".join(f"%s::{t} AS {c}" for c, t in _COLUMNS.items()), ""),
                                  names="SELECT queue FROM src", notify="SELECT queue FROM ins", result="id, queue FROM ins")
ENQUEUE_QUEUES_SQL = _ENQUEUE.format(rows="", names="SELECT DISTINCT unnest(%s::text[]) AS queue",
                                     notify="SELECT queue FROM names", result="now()::text")
# A key-less job's columns as COPY takes them, then created_at and last_updated_at (the batch's one moment)
_COPY_FIELDS = ("id", "queue", "type", "payload", "tags", "priority", "created_by", "rate_key")
COPY_JOBS_SQL = f"COPY chokaq_jobs_hot ({', '.join(_COPY_FIELDS)}, created_at, last_updated_at) FROM STDIN"
copy_values: Callable[[NewJob], tuple[Any, ...]] = attrgetter(*_COPY_FIELDS)


job_row: Callable[[NewJob], tuple[Any, ...]] = attrgetter(*_COLUMNS)  # a job's _COLUMNS, in C

# COPY's text format: a value holding a backslash, tab, newline or CR needs escaping, and NULL is \N.
_COPY_SPECIALS = ("\\", "\t", "\n", "\r")
_TEXTS = attrgetter(*(field for field in _COPY_FIELDS if field != "priority"))


def copy_rows(jobs: Sequence[NewJob], now: str) -> bytes | None:
    """COPY_JOBS_SQL's rows of ``jobs`` stamped ``now`` as one text-format buffer (one write: no per-row call into
    the driver), or None when a value needs escaping (the caller then writes row by row through the driver's own
    escaping). All the batch's text values are joined once and searched for the characters to escape."""
    texts = "".join(filter(None, chain.from_iterable(map(_TEXTS, jobs))))
    if any(char in texts for char in _COPY_SPECIALS):
        return None
    tail = f"\t{now}\t{now}\n"
    # _COPY_FIELDS in their order, spelled out: one f-string a row is what makes the buffer cheap
    return "".join([f"{j.id}\t{j.queue}\t{j.type}\t{'\\N' if j.payload is None else j.payload}\t"
                    f"{'\\N' if j.tags is None else j.tags}\t{j.priority}\t"
                    f"{'\\N' if j.created_by is None else j.created_by}\t"
                    f"{'\\N' if j.rate_key is None else j.rate_key}{tail}" for j in jobs]).encode()


# What rate limits hold back (ClaimHold), as arrays: one statement text whatever is held.
HOLD_SQL = """ AND NOT (h.queue = ANY(%(held_queues)s::text[]) OR lower(h.type) = ANY(%(held_types)s::text[])
           OR (h.queue, coalesce(h.rate_key, '')) IN (
               SELECT * FROM unnest(%(held_queue_targets)s::text[], %(held_queue_keys)s::text[]))
           OR (lower(h.type), coalesce(h.rate_key, '')) IN (
               SELECT * FROM unnest(%(held_type_targets)s::text[], %(held_type_keys)s::text[])))"""


def _hold_params(hold: ClaimHold) -> dict[str, list[str]]:
    keys = hold.keys[:MAX_HELD_KEYS]
    by_scope = {scope: [(target, key) for s, target, key in keys if s == scope] for scope in ("queue", "type")}
    return {"held_queues": list(hold.queues), "held_types": list(hold.types),
            **{f"held_{scope}_{part}": [pair[i] for pair in pairs]
               for scope, pairs in by_scope.items() for i, part in enumerate(("targets", "keys"))}}


_LEASED = "h.id = ANY(ARRAY(SELECT id FROM leased))"  # the first %(lease)s claimed rows start now (lease_at_claim)


def _fetch_sql(queue_filter: bool, held: bool = False, alone: bool = False, shares: bool = True) -> str:
    """Spec 01 §4.2: lock a window of due rows, rank per queue, apply the bulkhead, claim.

    The window is found without sorting every Pending row: per open queue, two streams
    (due rows without ``scheduled_at`` by ``created_at``: an exact ordered range of
    ``hot_fetch_due``, which holds those rows only, so rows scheduled for later are never
    walked; due scheduled rows by ``scheduled_at``: a range of ``hot_fetch_scheduled``)
    each give their first rows in (priority desc, coalesce(scheduled_at, created_at))
    order, so their merge holds exactly the spec's candidates. The candidate pool is twice
    the lock window, so a claimer still fills its window while another claimer holds one.

    Over many queues the candidates are few per queue: reading each stream's first
    ``candidates`` rows read queues x 2 x candidates rows for ``candidates`` of them. So
    each stream first gives a share (``candidates`` / queues + 2, ``sample``); the
    ``candidates``-th sampled row is the ``cut``: no row after it is a candidate, as the
    sample already holds that many rows before it. A stream whose share ends before or
    on the cut may hold more rows up to it, and only those streams are read again
    (``more``), up to the cut: two index ranges (higher priorities; the cut's priority up
    to its time and id: the indexes end with ``id``), so a later row is never read. Without a cut (fewer sampled rows than
    candidates) a filled stream gives its first ``candidates`` rows, as one stream did
    before. The scheduled stream is read only when some scheduled row is due (the first
    entry of ``hot_pending_split``: an EXISTS was planned as a scan of the table), not
    once per queue.

    A claim of every queue (``queues`` None) without rate limits to apply, while no queue
    is paused or hidden and no scheduled row is due, takes its candidates from
    ``hot_fetch_all`` (every queue's due rows in one claim order): no walk of the queues.

    Otherwise ``queues`` None walks the distinct queues with Pending rows (a loose index scan),
    since a queue with no ``chokaq_queues`` row is still eligible. Rows are re-read by
    ``id = ANY(ARRAY(...))`` so the plan stays primary-key lookups even before the
    table is analysed. ``alone``: it claims only if no capped queue is in reach (last column).
    ``shares`` False (a few queues named): each stream gives its first ``candidates`` rows
    at once, the shares' sorts and the cut would cost more than the rows they spare.
    """
    if queue_filter:
        recursive, names = "", "SELECT DISTINCT name FROM unnest(%(queues)s::text[]) AS name"
    else:
        recursive, names = f"{pending_queues()},\n", "SELECT queue AS name FROM pq WHERE queue IS NOT NULL"
    hold = HOLD_SQL if held else ""
    # A stream's first ``{limit}`` rows (id, priority, sort_at) of the queue ``{q}`` within ``{bound}``, in its index's
    # exact claim order: the due rows without a schedule, the due scheduled rows (only while some are due).
    streams = {
        "due": """(SELECT {s}h.id, h.priority, h.created_at AS sort_at FROM chokaq_jobs_hot h
         WHERE h.queue = {q} AND h.status = 0 AND h.scheduled_at IS NULL AND {bound}{hold}
         ORDER BY h.priority DESC, h.created_at, h.id LIMIT {limit})""",
        "scheduled": """(SELECT {s}h.id, h.priority, h.scheduled_at AS sort_at FROM chokaq_jobs_hot h
         WHERE h.queue = {q} AND h.status = 0 AND h.scheduled_at <= now() AND (SELECT due FROM scheduled)
           AND {bound}{hold}
         ORDER BY h.priority DESC, h.scheduled_at, h.id LIMIT {limit})"""}
    key = {"due": "h.created_at", "scheduled": "h.scheduled_at"}
    sample = "\n        UNION ALL\n        ".join(
        streams[kind].format(s=f"{i} AS stream, ", q="n.name", hold=hold, limit="(SELECT n FROM share)", bound="true")
        for i, kind in enumerate(streams))
    more = "\n        UNION ALL\n        ".join(
        streams[kind].format(s="", q="m.name", hold=hold, limit="%(candidates)s", bound=f"m.stream = {i} AND {bound}")
        for i, kind in enumerate(streams)
        for bound in ("h.priority > coalesce(m.priority, -2147483649::int8)",  # all of it, without a cut
                      f"h.priority = m.priority AND ({key[kind]}, h.id) <= (m.sort_at, m.id)"))
    # Every queue open, no rate limit holding rows back, no scheduled row due: the candidates are the first rows of
    # hot_fetch_all, every queue's due rows in one claim order (no walk of the queues at all).
    whole = "" if queue_filter or held else f"""whole AS (
    SELECT NOT (SELECT due FROM scheduled){" AND NOT (SELECT capped FROM reach)" if alone else ""}
       AND NOT EXISTS (SELECT 1 FROM chokaq_queues WHERE is_paused OR NOT is_active) AS whole),
"""
    reach = f"""reach AS (SELECT EXISTS (SELECT 1 FROM chokaq_queues WHERE max_workers IS NOT NULL{
        " AND name = ANY(%(queues)s::text[])" if queue_filter else ""}) AS capped),""" if alone else ""
    first = """
    (SELECT h.id, h.priority, h.created_at AS sort_at FROM chokaq_jobs_hot h
     WHERE h.status = 0 AND h.scheduled_at IS NULL AND (SELECT whole FROM whole)
     ORDER BY h.priority DESC, h.created_at, h.id LIMIT %(candidates)s)
    UNION ALL""" if whole else ""
    otherwise = """
     WHERE NOT (SELECT whole FROM whole)""" if whole else ""
    if shares:
        shared = f"""share AS (SELECT least(%(candidates)s, %(candidates)s / greatest(count(*), 1) + 2) AS n FROM open_queues),
sample AS (
    SELECT n.name, c.stream, c.id, c.priority, c.sort_at,
           row_number() OVER (PARTITION BY n.name, c.stream ORDER BY c.priority DESC, c.sort_at, c.id) AS nth
    FROM open_queues n CROSS JOIN LATERAL (
        {sample}) c),
cut AS (SELECT priority, sort_at, id FROM sample ORDER BY priority DESC, sort_at, id OFFSET %(candidates)s - 1 LIMIT 1),
filled AS (
    SELECT s.name, s.stream, c.priority, c.sort_at, c.id FROM sample s LEFT JOIN cut c ON true
    WHERE s.nth = (SELECT n FROM share) AND s.nth < %(candidates)s
      AND (c.priority IS NULL OR s.priority > c.priority
           OR (s.priority = c.priority AND (s.sort_at, s.id) <= (c.sort_at, c.id)))),
{whole}candidates AS ({first}
    (SELECT id, priority, sort_at FROM (
        SELECT id, priority, sort_at FROM sample
        UNION
        SELECT c.id, c.priority, c.sort_at FROM filled m CROSS JOIN LATERAL (
        {more}) c) u{otherwise}
     ORDER BY priority DESC, sort_at, id
     LIMIT %(candidates)s)),
"""
    else:
        streams_whole = "\n        UNION ALL\n        ".join(
            streams[kind].format(s="", q="n.name", hold=hold, limit="%(candidates)s", bound="true") for kind in streams)
        shared = f"""candidates AS (
    SELECT c.id, c.priority, c.sort_at FROM open_queues n CROSS JOIN LATERAL (
        {streams_whole}) c
    ORDER BY c.priority DESC, c.sort_at, c.id
    LIMIT %(candidates)s),
"""
    return f"""
WITH {recursive}{reach}open_queues AS (
    SELECT n.name FROM ({names}) n LEFT JOIN chokaq_queues q ON q.name = n.name
    WHERE coalesce(q.is_paused, false) = false AND coalesce(q.is_active, true){
        " AND NOT (SELECT capped FROM reach)" if alone else ""}),
scheduled AS (SELECT coalesce((SELECT min(scheduled_at) FROM chokaq_jobs_hot WHERE status = 0
                                AND scheduled_at IS NOT NULL) <= now(), false) AS due),
{shared}locked AS (
    SELECT h.id, h.queue, h.priority, coalesce(h.scheduled_at, h.created_at) AS sort_at
    FROM chokaq_jobs_hot h
    WHERE h.id = ANY(ARRAY(SELECT id FROM candidates))
      AND h.status = 0 AND (h.scheduled_at IS NULL OR h.scheduled_at <= now())
    ORDER BY h.priority DESC, sort_at, h.id
    LIMIT %(scan)s
    FOR UPDATE OF h SKIP LOCKED),
{_UNCAPPED_PICK if alone else _BULKHEAD_PICK}claimed AS (
    UPDATE chokaq_jobs_hot h SET status = CASE WHEN {_LEASED} THEN 2 ELSE 1 END, worker_id = %(worker)s,
        attempt_count = h.attempt_count + CASE WHEN {_LEASED} THEN 1 ELSE 0 END,
        started_at = CASE WHEN {_LEASED} THEN now() ELSE h.started_at END,
        heartbeat_at = CASE WHEN {_LEASED} THEN now() ELSE h.heartbeat_at END, last_updated_at = now()
    WHERE h.id = ANY(ARRAY(SELECT id FROM picked)) AND h.status = 0 AND {ASYNC_COMMIT}
    RETURNING {", ".join(f"h.{c}" for c in HOT_FIELDS)})
{"SELECT c.*, r.capped FROM reach r LEFT JOIN claimed c ON true" if alone else _IN_CLAIM_ORDER}
"""


# The claim's pick after ``locked``: the bulkhead's ranking within each capped queue's ``max_workers``, and the
# first ``%(lease)s`` picked rows to lease.
_BULKHEAD_PICK = f"""capped AS (
    SELECT DISTINCT l.queue FROM locked l JOIN chokaq_queues q ON q.name = l.queue
    WHERE q.max_workers IS NOT NULL),
{bulkhead("locked", "SELECT queue FROM capped", "%(limit)s")},
leased AS (
    SELECT r.id FROM ranked r WHERE r.id = ANY(ARRAY(SELECT id FROM picked))
    ORDER BY r.priority DESC, r.sort_at, r.id LIMIT %(lease)s),
"""
# A claim alone runs only with no capped queue in reach (``reach``, the same snapshot): no bulkhead applies, and
# ``locked`` (``%(scan)s`` = ``%(limit)s`` rows: ``_claim_params`` without a cap) is the pick; a ranking no cap can
# limit would be work for nothing. Its rows are put in claim order by the caller (``in_claim_order``).
_UNCAPPED_PICK = """picked AS (SELECT id FROM locked),
leased AS (SELECT id FROM locked ORDER BY priority DESC, sort_at, id LIMIT %(lease)s),
"""
_IN_CLAIM_ORDER = "SELECT * FROM claimed c\nORDER BY c.priority DESC, coalesce(c.scheduled_at, c.created_at), c.id"


# The claim statements by (queues named, rate limits holding some back, alone): six fixed texts; and for fewer
# than SHARES_FROM queues named, three without the shares (by held, alone).
FETCH_SQL = {(named, held, alone): _fetch_sql(named, held, alone)
             for named in (False, True) for held, alone in ((False, False), (True, False), (False, True))}
FETCH_FEW_SQL = {(held, alone): _fetch_sql(True, held, alone, shares=False)
                 for held, alone in ((False, False), (True, False), (False, True))}
SHARES_FROM = 8  # queues named: one queue's claim with the shares took 1.45 ms, without 0.93 (EXPLAIN ANALYZE)


def _fetch_statement(queues: Sequence[str] | None, held: bool, alone: bool) -> str:
    return (FETCH_SQL[queues is not None, held, alone] if queues is None or len(queues) >= SHARES_FROM
            else FETCH_FEW_SQL[held, alone])
# Claimers of a capped queue take turns: the claim statement counts the queue's active rows in
# its own snapshot, which cannot see another claimer's uncommitted claim. Locking the capped
# queues' control rows first (held to commit) makes the next claim statement's fresh READ
# COMMITTED snapshot include every earlier claim, so MaxWorkers holds fleet-wide. Per queues named or not:
LOCK_CAPPED_SQL = {named: "SELECT name FROM chokaq_queues WHERE max_workers IS NOT NULL"
                          f"{' AND name = ANY(%(queues)s)' if named else ''} ORDER BY name FOR UPDATE"
                   for named in (False, True)}


def _claim_params(worker_id: str, limit: int, queues: Sequence[str] | None, lease: int, capped: bool,
                  hold: ClaimHold | None = None) -> dict[str, Any]:
    """A ``FETCH_SQL`` statement's parameters. A capped queue in reach: lock the spec's window of 10 x limit so the
    bulkhead ranking has rows of every queue to choose from; twice as many candidates leave room for rows other
    claimers hold. No bulkhead to apply: the first ``limit`` unlocked due rows ARE the claim, so lock only those
    (every row lock dirties its page: a 10x window made each claim lock 900 rows it then released)."""
    scan, candidates = (limit * 10, limit * 20) if capped else (limit, limit * 4)
    return {"limit": limit, "worker": worker_id, "lease": lease, "scan": scan, "candidates": candidates,
            **({} if queues is None else {"queues": list(queues)}), **(_hold_params(hold) if hold else {})}

# ---------------------------------------------------------------- the Hot table's upkeep, the session, reads

HOT_DEAD_ROWS_SQL = "SELECT n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE relid = 'chokaq_jobs_hot'::regclass"
# One vacuum of the Hot table at a time, fleet-wide, without session state (a session advisory lock would
# leak behind a transaction pooler): a VACUUM holds SHARE UPDATE EXCLUSIVE on the table while it runs, so a
# caller that sees it held leaves the work to that one, and SKIP_LOCKED skips the table if one starts meanwhile.
HOT_VACUUM_RUNNING_SQL = """
SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'relation' AND relation = 'chokaq_jobs_hot'::regclass
               AND mode = 'ShareUpdateExclusiveLock' AND granted)
"""
VACUUM_HOT_SQL = "VACUUM (ANALYZE, SKIP_LOCKED) chokaq_jobs_hot"
SESSION_PID_SQL = "SELECT pg_backend_pid()"
# A generic plan estimates a parameter's LIMIT as a tenth of the rows: at a backlog of 1M Pending rows the claim's
# estimate passed jit_above_cost, and each call compiled its expressions (~700 ms a claim, for a 2 ms plan). The
# engine's statements are short and never gain from JIT, so its sessions turn it off with the generic plans.
GENERIC_PLANS_SQL = "SELECT set_config('plan_cache_mode', 'force_generic_plan', false), set_config('jit', 'off', false)"
QUEUE_HEALTH_SELECT = queue_health_select("greatest(0, extract(epoch FROM now() - p.due_at))::float8", "now()")


# The lease paying its tokens, in one statement (spends: the buckets as known and as spent, as JSON): each
# bucket still as planned pays for every job (compare-and-set: an UPDATE that waited re-checks the newest version);
# the jobs are leased only if every bucket paid. A job no longer ours gives its token back after (give_back).
LEASE_SPENDING_SQL = f"""
WITH spend AS (
    SELECT * FROM json_to_recordset(%(spends)s::json) AS s(limit_name text, rate_key text, known_tokens float8,
        known_refilled_at timestamptz, tokens float8, refilled_at timestamptz, window_started_at timestamptz,
        window_used int)),
paid AS (
    UPDATE chokaq_rate_buckets b SET tokens = s.tokens, refilled_at = s.refilled_at,
        window_started_at = s.window_started_at, window_used = s.window_used
    FROM spend s WHERE b.limit_name = s.limit_name AND b.rate_key = s.rate_key AND b.tokens = s.known_tokens
        AND b.refilled_at = s.known_refilled_at
    RETURNING b.limit_name, b.rate_key),
leased AS (
    UPDATE chokaq_jobs_hot SET status = 2, attempt_count = attempt_count + 1, started_at = %(at)s::timestamptz,
        heartbeat_at = %(at)s::timestamptz, last_updated_at = %(at)s::timestamptz
    WHERE id = ANY(%(ids)s::text[]) AND worker_id = %(worker)s AND status = 1
        AND (SELECT count(*) FROM paid) = %(buckets)s AND {ASYNC_COMMIT}
    RETURNING id, attempt_count)
SELECT limit_name, rate_key, NULL::int FROM paid UNION ALL SELECT NULL, id, attempt_count FROM leased
"""


# A sweep leaves a row that a live transaction holds (its worker's completion committing it, a heartbeat) to the
# next sweep instead of waiting for it: a zombie sweep that waited on a completion's rows while it held the
# counters' rows deadlocked with it (a second lost to both), and the completion that lost the deadlock gave its
# rows up to the sweep: Zombies of jobs that had finished on a live worker. The lock is taken only once the row is
# known to be swept (CASE fixes the order): as a plain qual the planner ran the costlier expiry test (a subplan) after
# it, so each sweep locked every unlocked Processing row of the fleet until it committed, live workers' completions
# and heartbeats waited on it, and a completion deadlocked with it (the sweep held the completion's rows and waited
# for the counter rows the completion held).
SWEEP_SKIPS_LOCKED = "CASE WHEN {where} THEN EXISTS (SELECT 1 FROM {table} z WHERE z.id = h.id FOR UPDATE SKIP LOCKED)" \
                     " ELSE false END"


# The shared rows' lock order, every transaction alike: Hot rows, then the counter rows (by queue), then the history
# and bucket rows (each by key). A completion of several moves takes its rows and its queues' counter rows first, in
# one statement (a move's own counter upsert then finds them held); each move's statement upserts its counters
# before its buckets and history (``completion``). A queue's counter row thus orders every writer of that queue's
# bucket and history rows: no two transactions wait on each other in a circle. Reads when the failed executions
# started (the moves clear ``started_at``). Params: ids, worker (None: no owner guard).
BEGIN_COMPLETION_SQL = f"""
WITH own AS (
    SELECT id, queue, started_at FROM {HOT}
    WHERE id = ANY(%(ids)s::text[]) AND (%(worker)s::text IS NULL OR worker_id = %(worker)s::text)
    ORDER BY id FOR UPDATE),
counters AS ({counters_locked("own")})
SELECT id, started_at FROM own WHERE (SELECT count(*) FROM counters) >= 0
"""


class PostgreSQLDialect(BaseDialect, statements=globals()):
    """The base over PostgreSQL's statements: array parameters, the database clock, lower() LIKE (the same match
    as ILIKE, cheaper on a scan)."""

    NOTIFY_CHANNEL: str | None = NOTIFY_CHANNEL
    # A move is one statement of CTEs; enqueue without keys is ENQUEUE_SQL alone (no by-key lookup to follow). The
    # hot path's statements are fixed texts (arrays, never a growing list of placeholders): storage runs them
    # through a preparing, server-side binding cursor, so PostgreSQL parses and plans each once per connection.
    MOVES_IN_ONE_STATEMENT = ENQUEUE_IN_ONE_STATEMENT = PREPARES = True
    ENQUEUE_COPY_FROM = 100
    MOVES_RECORD_HISTORY = True  # the history upsert is one more CTE of each move
    PICK_LOCK = " FOR UPDATE SKIP LOCKED"
    PICKED = "= ANY(ARRAY({}))"  # primary-key lookups whatever the statistics say (a semi join may scan the table)
    FOLDS_CASE = True
    TOKENS = {"clock": "", "now": "now()", "stamp": "now()", "ids": ID_ARRAY, "by_id": "", "text": "%s::text",
              "int": "%s::int", "ago": "now() - make_interval(secs => %s::float8)", "lazy": f" AND {ASYNC_COMMIT}",
              "trimmed": TRIMMED.format(trim="btrim", chr="chr"), "rowlock": "",
              "differs": "new_payload IS DISTINCT FROM payload"}

    ROW_LOCK_TAIL = " FOR UPDATE OF l"
    SPENDS_ALONE = True  # one statement

    def id_list(self, ids: Sequence[str]) -> tuple[str, list[Any]]:
        return ID_ARRAY, [list(ids)]

    def items_table(self, columns: Mapping[str, str]) -> str:
        arrays = ", ".join(f"%s::{ITEM_TYPES[kind]}[]" for kind in columns.values())
        return f"unnest({arrays}) AS a({', '.join(columns)})"

    def insert_jobs(self, cursor: Cursor, jobs: Sequence[NewJob], retry: bool) -> tuple[set[str], dict[str, str]]:
        """One statement inserts the rows (taken keys skipped), their queues' rows and the NOTIFYs; a large batch
        without keys or delays is its queues' statement, then a COPY of the rows."""
        if len(jobs) == 1:
            cursor.execute(ENQUEUE_ONE_SQL, job_row(jobs[0]))
        elif len(jobs) >= self.ENQUEUE_COPY_FROM and all(j.idempotency_key is j.delay_seconds is None for j in jobs):
            cursor.execute(ENQUEUE_QUEUES_SQL, [sorted({job.queue for job in jobs})])
            now = cursor.fetchone()[0]
            with cursor.copy(COPY_JOBS_SQL) as copy:
                if (rows := copy_rows(jobs, now)) is not None:
                    copy.write(rows)
                else:
                    for j in jobs:
                        copy.write_row((*copy_values(j), now, now))
            return {job.id for job in jobs}, {}
        else:
            cursor.execute(ENQUEUE_SQL, [json.dumps([job_row(j) for j in jobs], ensure_ascii=False, separators=(",", ":"))])
        inserted = {str(row[0]) for row in cursor.fetchall()}
        return inserted, self.key_holders(cursor, jobs, inserted)

    LEASES_IN_CLAIM = True
    CLAIMS_ALONE = True

    def claim(self, cursor: Cursor, worker_id: str, limit: int, queues: list[str] | None,
              hold: ClaimHold | None = None) -> list[Any]:
        return self.claim_leasing(cursor, worker_id, limit, queues, hold, 0)

    def fetch_alone(self, cursor: Cursor, worker_id: str, limit: int, queues: Sequence[str] | None,
                    lease: int = 0) -> list[HotJob] | None:
        if limit <= 0 or (queues is not None and not queues):
            return []
        cursor.execute(_fetch_statement(queues, False, True),
                       _claim_params(worker_id, limit, queues, lease, capped=False))
        rows = cursor.fetchall()
        return None if rows and rows[0][-1] else in_claim_order(row[:-1] for row in rows if row[0] is not None)

    def claim_leasing(self, cursor: Cursor, worker_id: str, limit: int, queues: list[str] | None,
                      hold: ClaimHold | None, lease: int) -> list[Any]:
        """Lock the capped queues in reach, then claim (spec 01 §4.2), skipping what rate limits hold back; the first
        ``lease`` rows in claim order are leased by the same UPDATE (Processing, one more attempt, started now)."""
        cursor.execute(LOCK_CAPPED_SQL[queues is not None], None if queues is None else {"queues": queues})
        capped = bool(cursor.fetchall())
        cursor.execute(_fetch_statement(queues, bool(hold), False),
                       _claim_params(worker_id, limit, queues, lease, capped, hold))
        return list(cursor.fetchall())

    def lease_spending(self, cursor: Cursor, job_ids: Sequence[str], worker_id: str, spends: Sequence[BucketSpend],
                       at: datetime) -> dict[str, int]:
        """One statement, committed on its own: the buckets still as known pay, and the jobs start only if all did
        (else the ones that paid are swapped back); a job no longer this worker's gives its token back."""
        buckets = [{"limit_name": s.known.limit_name, "rate_key": s.known.rate_key, "known_tokens": s.known.tokens,
                    "known_refilled_at": s.known.refilled_at.isoformat(), "tokens": s.spent.tokens,
                    "refilled_at": s.spent.refilled_at.isoformat(),
                    "window_started_at": s.spent.window_started_at.isoformat(), "window_used": s.spent.window_used}
                   for s in spends]  # each bucket as known and as spent
        cursor.execute(LEASE_SPENDING_SQL, {"ids": list(job_ids), "worker": worker_id, "buckets": len(spends), "at": at,
                                            "spends": json.dumps(buckets)})
        rows = cursor.fetchall()
        paid = {(name, key) for name, key, _ in rows if name is not None}
        if len(paid) != len(spends):
            for spend in (s for s in spends if (s.known.limit_name, s.known.rate_key) in paid):
                self._swap_bucket(cursor, spend.spent, spend.known)
            raise StaleBuckets("a bucket changed since the lease planned on it")
        leased = {str(job_id): int(n) for name, job_id, n in rows if name is None}
        self.give_back(cursor, spends, leased)
        return leased

    def tidy_hot_table(self, cursor: Cursor, min_dead_rows: int) -> bool:
        """VACUUM (ANALYZE) the Hot table when its dead row versions pass the threshold (autocommit only)."""
        live, dead = (int(n or 0) for n in self._one(cursor, HOT_DEAD_ROWS_SQL) or (0, 0))
        if dead < min_dead_rows + 0.2 * live or self._one(cursor, HOT_VACUUM_RUNNING_SQL)[0]:
            return False  # below the threshold, or another worker is at it
        cursor.execute(VACUUM_HOT_SQL)
        return True

    def begin_completion(self, cursor: Cursor, worker_id: str | None, job_ids: Sequence[str],
                         failed_ids: Sequence[str]) -> dict[str, datetime | None]:
        """One statement: the batch's own Hot rows, then its queues' counter rows, locked in key order; when each
        failed execution started."""
        cursor.execute(BEGIN_COMPLETION_SQL, {"ids": list(dict.fromkeys(job_ids)), "worker": worker_id})
        failed = set(failed_ids)
        return {str(job_id): as_utc(started) for job_id, started in cursor.fetchall() if job_id in failed}

    MOVED_NOW = "now()"
    DUE_ITEMS = {"delay_seconds": "float"}
    DUE = "now() + make_interval(secs => a.delay_seconds)"
    ZOMBIE_SOURCE = "(SELECT %s::float8 AS timeout, %s::text AS error_details) AS a"
    ZOMBIE_WHERE = ("h.status = 2 AND coalesce(h.heartbeat_at, h.last_updated_at) < now() - make_interval(secs =>\n"
                    "        coalesce((SELECT q.zombie_timeout_seconds FROM chokaq_queues q WHERE q.name = h.queue), a.timeout))")

    def completion(self, move: Move, source: str, on: str | None, where: str, values: Mapping[str, str],
                   sets: str = "", sweep: bool = False) -> str:
        """One statement of data-modifying CTEs (``moved``, then the pillar's insert and the counters). A ``sweep``
        skips the rows another transaction holds (``SWEEP_SKIPS_LOCKED``)."""
        skip = f" AND {SWEEP_SKIPS_LOCKED.format(table=move.origin, where=where)}" if sweep else ""
        rows = (f"{move.origin} h {f'SET {sets} FROM' if sets else 'USING'} {source}\n"
                f"    WHERE {f'{on} AND ' if on else ''}{where}{skip}")
        if move is RETRY:
            return (f"WITH moved AS (UPDATE {rows}\n    RETURNING h.id, h.queue),\n"
                    f"stats AS ({self.stats_add(move.counter, 'moved', 'now()')})\nSELECT id, queue FROM moved")
        carried = carried_values(move.carried, "h", values).items()  # what each row carries into its pillar
        moved = f"WITH moved AS (DELETE FROM {rows}\n    RETURNING {', '.join(f'{v} AS {c}' for c, v in carried)}),\n"
        if move.table is not None:
            moved += f"ins AS ({insert_moved(move, 'moved', 'now()')}\n    RETURNING id, type, {move.counted}),\n"
        if move.origin != HOT:  # back to Pending or purged: off its counter, the counter rows locked first by queue
            # (the shared rows' lock order: an operator's move over several queues against a worker's completion)
            dec = uncount_sql(move.counter, "(SELECT queue FROM moved WHERE (SELECT count(*) FROM held) >= 0)",
                              "now()" if move is TO_HOT else None)
            return f"{moved}held AS ({counters_locked('moved')}),\ndec AS ({dec})\nSELECT id, queue FROM moved"
        # The buckets and the history read the landed rows only once the counters are upserted (``counted`` waits
        # for all of ``stats``): the counter rows are locked first (``BEGIN_COMPLETION_SQL``'s order).
        counted = "counted AS (SELECT * FROM ins WHERE (SELECT count(*) FROM stats) >= 0),\n"
        bucket = self.bucket_add(move.outcome or 0, "counted", "date_trunc('second', now())", "now()")
        landed = f"(SELECT queue, type, {move.outcome} AS outcome, duration_ms FROM counted)"
        history = self.history_add(history_rows(landed, "date_trunc('minute', now())", "date_trunc('hour', now())"))
        return (f"{moved}stats AS ({self.stats_add(move.counter, 'ins', 'now()')}\n    RETURNING queue),\n{counted}"
                f"bucket AS ({bucket}),\nhist AS ({history})\nSELECT id, queue FROM moved")

    def pack(self, sql: str, width: int, order: str) -> str:
        cols = ", ".join(f"c{i}" for i in range(width))
        return (f"(SELECT coalesce(json_agg(json_build_array({cols}) ORDER BY {order}), '[]'::json)"
                f" FROM ({sql}) AS t({cols}))")


DIALECT: Dialect = PostgreSQLDialect()
