"""The dialect interface written once (``BaseDialect``): every dialect function over a few hooks a vendor
overrides, built from the shared texts, statements and row mappers of ``parts`` (re-exported here).

``parts`` is a module of its own because a worker may compile both from source (where no ``.pyc`` is kept):
the compiler's transient memory grows with the module, and the two as one 115 KiB module were the start-up's
memory peak.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from chokaq_core.domain import (
    ArchivedJob,
    Attempt,
    BucketSpend,
    ClaimHold,
    DeadJob,
    FailedAttempt,
    Failure,
    FailureReason,
    HotJob,
    JobFilter,
    JobStatus,
    NewJob,
    QueueState,
    Rate,
    RateBucket,
    RateLimit,
    RateLimitState,
    Retry,
    ScheduleState,
    StorageError,
    Success,
    WorkerInfo,
)
from chokaq_core.sql.parts import *  # noqa: F403 (the dialects and tests read the parts as base.X)
from chokaq_core.sql.parts import (
    ACTIVE_ROW,
    AGED_BATCHES,
    ARCHIVE,
    ARCHIVE_FIELDS,
    ARCHIVED_ITEMS,
    ATTEMPT_FIELDS,
    ATTEMPT_ITEMS,
    ATTEMPTS,
    BUCKET_COLUMNS,
    BUCKET_KEY,
    BUCKET_UPDATE,
    BUCKETS,
    DLQ,
    DLQ_FIELDS,
    DLQ_ROW,
    EMPTY_ERROR,
    ENQUEUE_PASSES,
    FAILED_ITEMS,
    HISTORY,
    HISTORY_COLUMNS,
    HISTORY_KEY,
    HISTORY_UPDATE,
    HOT,
    HOT_FIELDS,
    LIST_WORKERS_SELECT,
    MAX_HELD_KEYS,
    PURGE_ARCHIVE,
    PURGE_DLQ,
    PURGES,
    QUEUE_STATES_SELECT,
    QUEUES,
    RATE_BUCKET_FIELDS,
    RATE_BUCKETS,
    RATE_LIMIT_FIELDS,
    RATE_LIMITS,
    READ_ORDERS,
    RETRY,
    SCHEDULE_STATES_SQL,
    SCHEDULES,
    SHARED_STATEMENTS,
    STATS,
    SUMMARY_STATS_SQL,
    TO_ARCHIVE,
    TO_DLQ,
    TO_HOT,
    TOP_ERRORS_SAMPLE,
    WORKERS,
    ZOMBIE_DETAILS,
    Cursor,
    Move,
    Moved,
    StaleBuckets,
    archived_job,
    as_utc,
    bulkhead,
    cancel_details,
    dead_job,
    error_columns,
    error_details,
    finite,
    history_rows,
    hot_job,
    in_claim_order,
    last_error_set,
    locate_statement,
    located,
    queue_state,
    queue_stats_select,
    rate_bucket,
    rate_limit_state,
    resurrected,
    revision_guard,
    schedule_state,
    throughput_select,
    worker_info,
)


class BaseDialect:
    """The dialect interface (``sql.Dialect``): every function of ``DIALECT_FUNCTIONS`` written once; a vendor
    gives its statements and overrides the hooks below (timestamps, LIMIT/TOP, id lists, the claim, the move, the
    counters, the snapshot, case folding)."""

    QUEUE_HEALTH_SELECT: str  # (name, due pending, avg lag s, max lag s) per Queues row; params: queue_health_params
    TOP_ERRORS_SQL: str  # ERROR_GROUP_WIDTH columns, ordered, a derived table as it is; params: top_errors_params
    QUEUE_STATES_SELECT = QUEUE_STATES_SELECT
    SUMMARY_STATS_SQL = SUMMARY_STATS_SQL
    QUEUE_STATS_SELECT = queue_stats_select()
    LIST_WORKERS_SELECT = LIST_WORKERS_SELECT
    THROUGHPUT_SELECT = throughput_select("%s")  # params: param_ts(since)
    QUEUE_STATES_SQL = QUEUE_STATS_SQL = LIST_WORKERS_SQL = THROUGHPUT_SQL = QUEUE_HEALTH_SQL = ""  # READ_ORDERS
    # Capabilities. The channel enqueue NOTIFYs, for an idle worker to LISTEN on (None: no push channel):
    NOTIFY_CHANNEL: str | None = None
    SESSION_PID_SQL: str | None = None  # the server process of this session; None: the vendor has no such id
    GENERIC_PLANS_SQL: str | None = None  # a session keeps its prepared statements' generic plans; None: no such
    MOVES_IN_ONE_STATEMENT = False  # each move between pillars (resurrect, purges, zombies) is one statement
    MOVES_RECORD_HISTORY = False  # each move to the Archive/DLQ also counts its rows in the history buckets (no
    # record_history after it)
    ENQUEUE_IN_ONE_STATEMENT = False  # an enqueue of jobs without idempotency keys is one statement
    ENQUEUE_COPY_FROM = 0  # a batch of this many jobs or more may be copied (COPY: several statements); 0: never
    LEASES_IN_CLAIM = False  # claim() leases its first rows itself (else fetch_batch runs the lease after it)
    CLAIMS_ALONE = False  # fetch_alone(): a claim with no capped queue in reach is one self-committing statement
    PREPARES = False  # storage prepares the hot path's fixed statement texts (PostgreSQL's server-side binding)
    ONE_WRITER = False  # the database has one write lock (SQLite): a process's writers take turns on a lock of
    # storage's instead of meeting in the database's busy handler
    TOKENS: dict[str, str]  # a vendor's words in SHARED_STATEMENTS
    TS = "%s"  # a datetime parameter (param_ts) as an operand
    TRUE, FALSE = "TRUE", "FALSE"  # the boolean literals
    FOLDS_CASE = False  # a search lowers the column and the term (else the vendor's LIKE ignores case itself)
    LIMIT = " LIMIT %s"  # after an ORDER BY: at most that many rows
    PICK_HINT = ""  # after the table a bulk command picks rows from: lock hints (SQL Server)
    PICK_LOCK = ""  # after the pick's LIMIT: lock the picked rows, skipping those another transaction holds
    PICKED = "IN ({})"  # ``id`` against the ids a subquery picks
    DLQ_ROW = DLQ_ROW  # a DLQ list row; error_head is the end of the details
    JOB_ATTEMPTS_SQL = f"SELECT {', '.join(ATTEMPT_FIELDS)} FROM {ATTEMPTS} WHERE job_id = %s ORDER BY id"
    PURGE_WORKERS_SQL: str  # params: param_ts(cutoff), batch size → changed
    PURGE_METRIC_BUCKETS_SQL: str  # params: param_ts(cutoff), batch size → changed
    PURGE_ATTEMPTS_SQL: str  # params: param_ts(cutoff), batch size → changed
    PURGE_HISTORY_SQL: str  # params: granularity, param_ts(cutoff), batch size → changed
    # The transitions' statements (``clock``: SQLite's time parameter, nothing elsewhere).
    MARK_PROCESSING_BATCH_SQL: str  # params: clock, ids, worker → (id, attempt count)
    MARK_PROCESSING_AT_SQL: str  # params: param_ts(start), ids, worker → (id, attempt count)
    KEEP_ALIVE_SQL: str  # params: clock, ids, worker → (id)
    CANCEL_REQUESTS_SQL = (f"SELECT id, cancel_requested_by FROM {HOT}"
                           " WHERE worker_id = %s AND status = 2 AND cancel_requested_by IS NOT NULL")  # → (id, actor)
    CANCEL_BATCH_SQL: str  # params: clock, details, actor, ids → moved
    REQUEST_CANCEL_SQL: str  # params: actor, ids → (id)
    UPDATE_HOT_SQL: str  # params: clock, payload, tags, priority, actor, job id, revision → (id)
    UPDATE_DLQ_SQL: str  # params: payload, tags, actor, job id, revision → (id)
    RELEASE_SQL: str  # params: clock, ids, worker → id
    RECOVER_ABANDONED_SQL: str  # params: clock, ago_params(timeout) → changed
    ARCHIVE_ZOMBIES_SQL: str  # params: clock, seconds_params(global timeout), details → moved
    RESURRECT_SQL: str  # params: clock, payload, tags, priority, actor, ids, revision → moved
    PURGE_DLQ_IDS_SQL: str  # params: clock, ids, batch size → moved
    PURGE_ARCHIVE_IDS_SQL: str  # params: clock, ids, batch size → moved
    PURGE_DLQ_OLDER_SQL: str  # params: clock, param_ts(cutoff), batch size → moved
    PURGE_ARCHIVE_SQL: str  # params: clock, param_ts(cutoff), batch size → moved
    # The completions' params: clock, items_params of (id, …) as below, the owner twice (None: no owner guard) → moved.
    ARCHIVE_SUCCEEDED_SQL: str  # duration_ms, result
    MOVE_TO_DLQ_SQL: str  # failure_reason, error_details, error_columns
    RESCHEDULE_SQL: str  # attempt_count, delay_fields, error_columns, held_by

    def __init_subclass__(cls, statements: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        """``statements``: a vendor module's namespace; every statement the base classes name (``*_SQL``) that it
        defines becomes the vendor's (an instance gets the others of ``SHARED_STATEMENTS`` in its ``TOKENS``)."""
        super().__init_subclass__(**kwargs)
        names = {n for k in cls.__mro__ for n in (*vars(k), *vars(k).get("__annotations__", {}))
                 if n.endswith(("_SQL", "_SELECT"))}
        for name in names & set(statements or ()):
            setattr(cls, name, statements[name])  # type: ignore[index]
        for read, order in READ_ORDERS.items():
            if hasattr(cls, f"{read}_SELECT"):
                setattr(cls, f"{read}_SQL", f"{getattr(cls, f'{read}_SELECT')}\nORDER BY {order}")

    def __init__(self) -> None:
        words = {"name": "%s", "substr": "substr", "dirty": "", "limit": self.LIMIT, "count": "", "sweep": "",
                 **self.TOKENS}
        words["output"], words["returning"] = self.returning("id")
        words["lease_output"], words["lease_returning"] = self.returning("id, attempt_count")
        for name, template in SHARED_STATEMENTS.items():
            if not hasattr(self, name):  # a vendor module's own statement wins
                setattr(self, name, template.format_map(words))
        # the lease stamped with a given moment: a rate-limited lease starts its jobs when their tokens were taken
        self.MARK_PROCESSING_AT_SQL = SHARED_STATEMENTS["MARK_PROCESSING_BATCH_SQL"].format_map(
            {**words, "clock": f"WITH clock(now) AS (SELECT {self.TS}) ", "now": "(SELECT now FROM clock)"})
        for name, batch in AGED_BATCHES.items():
            setattr(self, name, self.aged_batch(*batch))
        self._write_completions()

    def _write_completions(self) -> None:
        """The completion statements from their one description, each written by the vendor's ``completion``."""
        text, number, now, ids, by_item = (self.TOKENS["text"], self.TOKENS["int"], self.MOVED_NOW, self.TOKENS["ids"],
                                           "a.id = h.id")
        guard = f"({text} IS NULL OR h.worker_id = %s)"  # the owner twice, None for no guard
        retry_items = {"id": "name", "attempt_count": "int", **self.DUE_ITEMS, "error_class": "class",
                       "error_message": "message", "held_by": "class"}
        retry = (f"status = 0, attempt_count = a.attempt_count, scheduled_at = {self.DUE}, worker_id = NULL,"
                 f" heartbeat_at = NULL, cancel_requested_by = NULL, last_updated_at = {now}, "
                 + last_error_set("a.error_class", "a.error_message", "a.held_by", now, "h."))
        statements = {  # the rows this worker owns, named by the batch, each taking its item's values
            "ARCHIVE_SUCCEEDED_SQL": self.completion(TO_ARCHIVE, self.items_table(ARCHIVED_ITEMS), by_item, guard,
                                                     {c: f"a.{c}" for c in ARCHIVED_ITEMS if c != "id"}),
            "MOVE_TO_DLQ_SQL": self.completion(TO_DLQ, self.items_table(FAILED_ITEMS), by_item, guard,
                                               {c: f"a.{c}" for c in FAILED_ITEMS if c != "id"}),
            "RESCHEDULE_SQL": self.completion(RETRY, self.items_table(retry_items), by_item, guard, {}, retry),
            # Pending/Fetched rows named by id
            "CANCEL_BATCH_SQL": self.completion(
                TO_DLQ, f"(SELECT {text} AS error_details, {text} AS last_modified_by) AS a", None,
                f"h.id {ids} AND {self.TOKENS['by_id']}h.status IN (0, 1)",
                {"failure_reason": str(int(FailureReason.CANCELLED)), "error_details": "a.error_details",
                 "last_modified_by": "a.last_modified_by"}),
            # Processing rows whose heartbeat expired (spec 01 §4.12: the queue's timeout, else the global one), a
            # sweep that may leave a locked row to the next
            "ARCHIVE_ZOMBIES_SQL": self.completion(
                TO_DLQ, self.ZOMBIE_SOURCE, None, self.ZOMBIE_WHERE,
                {"failure_reason": str(int(FailureReason.ZOMBIE)), "error_details": "a.error_details"}, sweep=True),
            # DLQ rows named by id, at the edit's revision (None: any), edits coalesced
            "RESURRECT_SQL": self.completion(
                TO_HOT, f"(SELECT {text} AS payload, {text} AS tags, {number} AS priority, {text} AS actor) AS a", None,
                f"h.id {ids} AND h.{revision_guard(number)}",
                resurrected("a.payload", "a.tags", "a.priority", "a.actor", "{row}."))}
        for name, (move, keep, order) in PURGES.items():  # no values of their own: a one-row source
            picked = self.PICKED.format(self.pick(move.origin, f" WHERE {keep.format(ids=ids, ts=self.TS)}", order))
            statements[name] = self.completion(move, "(SELECT 1 AS one) AS a", None, f"h.id {picked}", {})
        for name, sql in statements.items():
            setattr(self, name, sql)

    MOVED_NOW = ""  # the moment a ``completion`` statement stamps rows with
    ZOMBIE_SOURCE = ZOMBIE_WHERE = ""  # the zombie sweep's row ``a`` (the global timeout, the details) and its rows
    DUE_ITEMS: dict[str, str] = {}  # a retry's delay as the reschedule batch carries it (``delay_fields``: kinds)
    DUE = ""  # when a rescheduled row is due: an expression over those items (``a``)

    def completion(self, move: Move, source: str, on: str | None, where: str, values: Mapping[str, str],
                   sets: str = "", sweep: bool = False) -> str:
        """A move's statement (SQLite: its first step, see ``_move``): the rows ``h`` of the pillar the move leaves that
        ``where`` keeps, joined to ``source`` ``a`` (on ``on``, else its one row), leave for ``move``'s pillar (or,
        a purge, for none) with ``values`` (column → expression) set, or for ``RETRY`` stay with ``sets`` as their SET;
        then counted (and bucketed), a row leaving the DLQ or the Archive off its counter; it returns (id, queue) of
        each. Parameters: the clock's, the source's, then the where's. ``sweep``: rows another transaction holds may
        be left for the next one."""
        raise NotImplementedError

    def claim_sql(self, window: str, limit: str, worker: str, now: str, top: bool = False) -> str:
        """Rank the ``window`` of due Pending rows per queue, apply the bulkheads, claim (spec 01 §4.2): the claimed
        rows (``HOT_FIELDS``), read by primary key (``bulkhead``'s operands and ``top``)."""
        output, returning = self.returning(", ".join(HOT_FIELDS))
        capped = f"SELECT name FROM {QUEUES} WHERE max_workers IS NOT NULL"
        return (f"WITH win AS ({window}),\n{bulkhead('win', capped, limit, top)}\n"
                f"UPDATE {HOT}{self.TOKENS['rowlock']} SET status = 1, worker_id = {worker}, last_updated_at = {now}"
                f"{output}\nWHERE id IN (SELECT id FROM picked) AND {self.TOKENS['by_id']}status = 0{returning}")

    def pick(self, table: str, where: str, order: str, lock: bool = True) -> str:
        """The ids of the first rows of ``table`` by ``order`` that ``where`` keeps (params: where's, how many), locked
        (skipping those another transaction holds) where the vendor can unless ``lock`` is False."""
        hint, tail = (self.PICK_HINT, self.PICK_LOCK) if lock else ("", "")
        return f"SELECT id FROM {table}{hint}{where} ORDER BY {order}{self.LIMIT}{tail}"

    def rows(self, cursor: Cursor) -> list[Any]:
        """The rows of the statement just executed."""
        return list(cursor.fetchall())

    def session_pid(self, cursor: Cursor) -> int | None:
        """The id of the server process serving this session (PostgreSQL's ``pg_backend_pid()``), so storage can
        tell a direct connection from one through a pooler; None where the vendor has no such id."""
        return None if self.SESSION_PID_SQL is None else int(self._one(cursor, self.SESSION_PID_SQL)[0])

    def keep_generic_plans(self, cursor: Cursor) -> None:
        """Make this session run its prepared statements on their generic plans (no planning per call), without JIT."""
        if self.GENERIC_PLANS_SQL is not None:
            cursor.execute(self.GENERIC_PLANS_SQL)

    # ------------------------------------------------------------ hooks

    def param_ts(self, value: datetime | None) -> Any:
        """A datetime as a statement parameter (or inside a batch item, ``items_params``)."""
        return value

    def search_clause(self, column: str) -> str:
        """The case-insensitive substring match of one searched column (the pattern from ``search_pattern``)."""
        return f"lower({column}) LIKE %s ESCAPE '\\'" if self.FOLDS_CASE else f"{column} LIKE %s ESCAPE '\\'"

    def search_pattern(self, term: str) -> str:
        """A LIKE pattern matching ``term`` anywhere (folded where the search folds case), its wildcards escaped
        (with ``ESCAPE '\\'``)."""
        term = term.lower() if self.FOLDS_CASE else term
        return "%" + term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"

    def id_list(self, ids: Sequence[str]) -> tuple[str, list[Any]]:
        """``(predicate tail, params)`` matching ``id`` against ``ids``: ``IN (%s, …)`` by default."""
        return f"IN ({', '.join(['%s'] * len(ids)) if ids else 'NULL'})", list(ids)

    def queue_health_params(self) -> list[Any]:
        return []

    def top_errors_params(self, limit: int) -> list[Any]:
        """The parameters of ``TOP_ERRORS_SQL``: the empty-details text, the sample size, at most ``limit`` groups."""
        return [EMPTY_ERROR, TOP_ERRORS_SAMPLE, limit]

    def clock(self, at: datetime | None = None) -> list[Any]:
        """The current time (or ``at``) as the leading parameter of a statement that stamps rows: none where the
        statement reads the database clock."""
        return []

    def ids_param(self, ids: Sequence[str]) -> Any:
        """A list of job ids (duplicates dropped) as one statement parameter."""
        return list(dict.fromkeys(ids))

    def seconds_params(self, seconds: float) -> list[Any]:
        """A duration in seconds as statement parameters."""
        return [float(seconds)]

    def ago_params(self, seconds: float) -> list[Any]:
        """The moment ``seconds`` ago as statement parameters: the duration, for the database clock."""
        return self.seconds_params(seconds)

    def items_params(self, rows: Sequence[Mapping[str, Any]]) -> list[Any]:
        """Per-item rows of a batch as statement parameters: one array per key by default."""
        return [list(column) for column in zip(*(row.values() for row in rows), strict=True)]

    def delay_fields(self, seconds: float) -> dict[str, Any]:
        """A retry delay as the reschedule statement reads it."""
        return {"delay_seconds": float(seconds)}

    def now(self) -> tuple[str, list[Any]]:
        """``(SQL, params)`` of the current time: the database clock (``TOKENS["now"]``) by default."""
        return self.TOKENS["now"], []

    # ------------------------------------------------------------ queue controls and the worker registry

    def upsert(self, table: str, key: str, values: Mapping[str, str], update: Mapping[str, str | None]) -> str:
        """A statement inserting one row into ``table`` (``values``: column → SQL expression) or, when a row of that
        ``key`` is there, setting ``update`` (as ``merge_rows``)."""
        return self.merge_rows(table, [key], list(values), f"VALUES ({', '.join(values.values())})", update)

    def merge_rows(self, table: str, key: Sequence[str], columns: Sequence[str], source: str,
                   update: Mapping[str, str | None]) -> str:
        """Insert the rows of ``source`` (VALUES, or a SELECT of ``columns`` whose rows go in key order, so concurrent
        upserts lock them in one order) into ``table``; where a row of the same ``key`` (the leading columns) is there,
        set ``update`` instead (column → an expression over ``{new}``, the row offered, and ``{old}``, the row there;
        None: the offered value). ``INSERT … ON CONFLICT`` here; SQL Server merges (``mssql.merge_rows``)."""
        sets = ", ".join(f"{c} = {(e or '{new}.' + c).format(new='excluded', old=table)}" for c, e in update.items())
        order = "" if source.startswith("VALUES") else f" ORDER BY {', '.join(str(i + 1) for i in range(len(key)))}"
        return (f"INSERT INTO {table} ({', '.join(columns)}) {source}{order}"
                f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET {sets}")

    def stats_add(self, counter: str, source: str, now: str) -> str:
        """The counter upsert (spec 01 §4.13): ``counter`` += the rows of ``source`` per queue, a missing row
        inserted."""
        return self.merge_rows(STATS, ["queue"], ["queue", counter, "last_activity_at"],
                               f"SELECT queue, count(*), {now} FROM {source} AS b GROUP BY queue",
                               {counter: f"{{old}}.{counter} + {{new}}.{counter}", "last_activity_at": None})

    def bucket_add(self, outcome: int, source: str, second: str, now: str) -> str:
        """The MetricBuckets upsert of this ``second`` from ``source`` (``Move.counted``); no aggregate sees a NULL
        (SQL Server would send a warning ahead of the result)."""
        return self.merge_rows(BUCKETS, BUCKET_KEY, BUCKET_COLUMNS,
                               f"SELECT {second}, queue, {outcome}, failure_reason, count(*),"
                               " sum(CASE WHEN duration_ms IS NULL THEN 0 ELSE 1 END), sum(coalesce(duration_ms, 0)),"
                               f" nullif(max(coalesce(duration_ms, -1)), -1), {now} FROM {source} AS b"
                               " GROUP BY queue, failure_reason", BUCKET_UPDATE)

    def history_add(self, source: str) -> str:
        """Add the rows of ``source`` (``HISTORY_COLUMNS`` order) to the history buckets (``HISTORY_UPDATE``)."""
        return self.merge_rows(HISTORY, HISTORY_KEY, HISTORY_COLUMNS, source, HISTORY_UPDATE)

    def param(self, kind: str) -> str:
        """A parameter of a ``kind`` ("name", "text", "int", "bool") as an operand that keeps its type when NULL."""
        return "%s"

    def returning(self, columns: str) -> tuple[str, str]:
        """How an UPDATE returns ``columns`` of the rows it changed: (after SET, at the end)."""
        return "", f" RETURNING {columns}"

    def _upsert_queue(self, cursor: Cursor, queue: str, column: str, kind: str, value: Any) -> None:
        """Create the queue row (unpaused, visible, no limits) with one control set, or update that control
        (spec 01 §4.17)."""
        now, at = self.now()
        values = {"name": self.param("name"), "is_paused": self.FALSE, "is_active": self.TRUE, column: self.param(kind),
                  "last_updated_at": now}
        update = dict.fromkeys((column, "last_updated_at"))
        cursor.execute(self.upsert(QUEUES, "name", values, update), [queue, value, *at])

    def set_queue_paused(self, cursor: Cursor, queue: str, paused: bool) -> None:
        self._upsert_queue(cursor, queue, "is_paused", "bool", bool(paused))

    def set_queue_zombie_timeout(self, cursor: Cursor, queue: str, seconds: int | None) -> None:
        self._upsert_queue(cursor, queue, "zombie_timeout_seconds", "int", seconds)

    def set_queue_max_workers(self, cursor: Cursor, queue: str, max_workers: int | None) -> None:
        self._upsert_queue(cursor, queue, "max_workers", "int", max_workers)

    def set_queue_active(self, cursor: Cursor, queue: str, active: bool) -> bool:
        """Update only; pauses the queue in both directions."""
        now, at = self.now()
        output, tail = self.returning("name")
        cursor.execute(f"UPDATE {QUEUES} SET is_active = %s, is_paused = {self.TRUE}, last_updated_at = {now}{output}"
                       f" WHERE name = %s{tail}", [bool(active), *at, queue])
        return bool(self.rows(cursor))

    def upsert_worker(self, cursor: Cursor, info: WorkerInfo) -> None:
        """Register or refresh a worker row; ``started_at`` is set on first insert only (``stopped_at`` NULL)."""
        now, at = self.now()
        kinds = {"worker_id": "name", "hostname": "name", "pid": "int", "queues": "name", "started_at": None,
                 "last_heartbeat_at": None, "is_running": "bool", "capacity": "int", "active_count": "int",
                 "runtime_json": "text", "circuits_json": "text"}
        values = {column: now if kind is None else self.param(kind) for column, kind in kinds.items()}
        update: dict[str, str | None] = {c: None for c in kinds if c not in ("worker_id", "started_at")}
        update["stopped_at"] = f"CASE WHEN {{new}}.is_running = {self.TRUE} THEN NULL ELSE {{old}}.stopped_at END"
        cursor.execute(self.upsert(WORKERS, "worker_id", values, update),
                       [info.worker_id, info.hostname, info.pid, info.queues, *at, *at, bool(info.is_running),
                        info.capacity, info.active_count, info.runtime_json, info.circuits_json])

    def stop_worker(self, cursor: Cursor, worker_id: str) -> None:
        """Mark a worker stopped (not running, no active executions)."""
        now, at = self.now()
        cursor.execute(f"UPDATE {WORKERS} SET is_running = {self.FALSE}, stopped_at = {now}, active_count = 0"
                       " WHERE worker_id = %s", [*at, worker_id])

    # ------------------------------------------------------------ builders

    def where(self, filters: JobFilter, date_column: str, search_columns: Sequence[str],
              equal: Sequence[tuple[str, Any]] = ()) -> tuple[str, list[Any]]:
        """`` WHERE …`` (or nothing) and its params (spec 01 §4.10): equality, case-insensitive search, dates, then
        the view's own ``equal`` columns (None: not filtered)."""
        clauses: list[str] = []
        params: list[Any] = []
        for column, value in (("queue", filters.queue), ("type", filters.type), ("id", filters.job_id), *equal):
            if value is not None:
                clauses.append(f"{column} = %s")
                params.append(value)
        if filters.search:
            pattern = self.search_pattern(filters.search)
            clauses.append("(" + " OR ".join(self.search_clause(c) for c in search_columns) + ")")
            params += [pattern] * len(search_columns)
        bounds: tuple[tuple[str, datetime | None], ...] = ((">=", filters.from_at), ("<=", filters.to_at))
        for op, moment in bounds:
            if moment is not None:
                clauses.append(f"{date_column} {op} {self.TS}")
                params.append(self.param_ts(moment))
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params

    def dlq_where(self, filters: JobFilter) -> tuple[str, list[Any]]:
        """The DLQ view's filters; a Top Errors group (reason, class, message) is served by ``dlq_by_error``."""
        reason = None if filters.failure_reason is None else int(filters.failure_reason)
        return self.where(filters, "created_at", ("id", "type", "tags", "error_details"), (
            ("failure_reason", reason), ("error_class", filters.error_class), ("error_message", filters.error_message)))

    def locate_sql(self, ids: Sequence[str]) -> tuple[str, list[Any]]:
        tail, params = self.id_list(ids)
        return locate_statement(tail), params * 3

    def _all(self, cursor: Cursor, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        if params:
            cursor.execute(sql, list(params))
        else:
            cursor.execute(sql)
        return self.rows(cursor)

    def _one(self, cursor: Cursor, sql: str, params: Sequence[Any] = ()) -> Any:
        rows = self._all(cursor, sql, params)
        return rows[0] if rows else None

    # ------------------------------------------------------------ rate limits (declared, overridden, their buckets)

    SPENDS_ALONE = False  # lease_spending runs without a transaction (else in the caller's), each statement committed
    ROW_LOCK_HINT = ""  # a table hint that locks the rows a read returns until commit (SQL Server)
    ROW_LOCK_TAIL = ""  # the clause after a read that locks its rows until commit (PostgreSQL: FOR UPDATE)
    IGNORE_DUPLICATE = " ON CONFLICT DO NOTHING"  # an INSERT … SELECT that loses a race to a twin inserts nothing

    def rate_limits(self, cursor: Cursor) -> list[RateLimitState]:
        """Every limit row, by name (without its use: ``rate_buckets``)."""
        return [rate_limit_state(r) for r in self._all(
            cursor, f"SELECT {', '.join(RATE_LIMIT_FIELDS)} FROM {RATE_LIMITS} ORDER BY name")]

    def rate_buckets(self, cursor: Cursor, names: Sequence[str], lock: bool = False) -> list[RateBucket]:
        """The buckets of the limits ``names``; ``lock``: their rows locked until commit, in (limit, key) order."""
        if not names:
            return []
        tail, params = self.name_list(names)
        hint, order = (self.ROW_LOCK_HINT, f" ORDER BY l.limit_name, l.rate_key{self.ROW_LOCK_TAIL}") if lock else ("", "")
        return [rate_bucket(r) for r in self._all(
            cursor, f"SELECT {', '.join(RATE_BUCKET_FIELDS)} FROM {RATE_BUCKETS} AS l{hint} WHERE l.limit_name {tail}"
                    f"{order}", params)]

    def pending_by_key(self, cursor: Cursor) -> list[tuple[str, str, str | None, int]]:
        """Due Pending rows per (queue, type, rate key): what rate limits may be holding back."""
        now, at = self.now()
        return [(r[0], r[1], r[2], int(r[3])) for r in self._all(
            cursor, f"SELECT queue, type, rate_key, count(*) FROM {HOT} WHERE status = 0"
                    f" AND (scheduled_at IS NULL OR scheduled_at <= {now}) GROUP BY queue, type, rate_key", at)]

    def hold_clause(self, hold: ClaimHold | None, alias: str = "h") -> tuple[str, list[Any]]:
        """``(" AND NOT (…)", params)``: the predicate a claim adds to its candidate rows (``alias``) to skip what
        a rate limit holds back — whole queues, types, and at most ``MAX_HELD_KEYS`` partitions (the rest are
        sent back by the plan after the claim); ``("", [])`` when nothing is held."""
        if not hold:
            return "", []
        terms: list[str] = []
        params: list[Any] = []
        for column, names in ((f"{alias}.queue", hold.queues), (f"lower({alias}.type)", hold.types)):
            if names:
                tail, values = self.name_list(names)
                terms.append(f"{column} {tail}")
                params += values
        for scope, target, key in hold.keys[:MAX_HELD_KEYS]:
            column = f"{alias}.queue" if scope == "queue" else f"lower({alias}.type)"
            terms.append(f"({column} = %s AND coalesce({alias}.rate_key, '') = %s)")
            params += [target, key]
        return f" AND NOT ({' OR '.join(terms)})", params

    def name_list(self, names: Sequence[str]) -> tuple[str, list[Any]]:
        """``(predicate tail, params)`` matching a name column against ``names`` (as ``id_list``)."""
        return self.id_list(names)

    def _ensure_rate_limit(self, cursor: Cursor, name: str, per_key: bool, max_keys: int) -> None:
        now, at = self.now()
        cursor.execute(
            f"INSERT INTO {RATE_LIMITS} (name, is_lifted, per_key, max_keys, updated_at) SELECT %s, %s, %s, %s, {now}"
            f" WHERE NOT EXISTS (SELECT 1 FROM {RATE_LIMITS}{self.ROW_LOCK_HINT} WHERE name = %s)"
            f"{self.IGNORE_DUPLICATE}", [name, False, per_key, max_keys, *at, name])

    def declare_rate_limits(self, cursor: Cursor, limits: Sequence[RateLimit]) -> None:
        """Make the declared columns the given limits (settings and ``@job``): rows of other names lose their
        declared rate (an operator's override stays)."""
        tail, params = self.name_list([limit.name for limit in limits]) if limits else ("IS NULL", [])
        cursor.execute(f"UPDATE {RATE_LIMITS} SET declared_count = NULL, declared_window = NULL, declared_burst = NULL"
                       f" WHERE declared_count IS NOT NULL AND NOT (name {tail})", params)
        for limit in limits:
            self._ensure_rate_limit(cursor, limit.name, limit.per_key, limit.max_keys)
            cursor.execute(f"UPDATE {RATE_LIMITS} SET declared_count = %s, declared_window = %s, declared_burst = %s,"
                           " per_key = %s, max_keys = %s WHERE name = %s",
                           [limit.rate.count, limit.rate.window, limit.rate.burst, limit.per_key, limit.max_keys,
                            limit.name])

    def set_rate_limit(self, cursor: Cursor, name: str, rate: Rate | None, lifted: bool, actor: str | None) -> None:
        """An operator's override of limit ``name``: a rate (count 0 pauses), lifted, or neither (back to the
        declared rate)."""
        self._ensure_rate_limit(cursor, name, False, 1000)
        now, at = self.now()
        cursor.execute(
            f"UPDATE {RATE_LIMITS} SET override_count = %s, override_window = %s, override_burst = %s, is_lifted = %s,"
            f" updated_by = %s, updated_at = {now} WHERE name = %s",
            [rate.count if rate else None, rate.window if rate else None, rate.burst if rate else None, bool(lifted),
             actor, *at, name])

    def lock_rate_buckets(self, cursor: Cursor, names: Sequence[str]) -> tuple[datetime, list[RateBucket]]:
        """Lock the rows of the limits ``names`` until commit (leases of these limits run one at a time), then read
        their buckets: the database's time and the buckets. Two statements on purpose: a read that waited for the
        lock must see the buckets the previous lease committed, and PostgreSQL's READ COMMITTED re-reads only the
        locked rows of a statement that waited, not the rows it joined (a join would double-spend tokens). The
        buckets are locked too: a lease planned on known buckets writes them without the limits' locks
        (``lease_spending``), so this lease must read what such a write committed and hold it off until its own
        write, or that write would overwrite the other's spend (a lost update: tokens spent twice)."""
        now, at = self.now()
        tail, params = self.name_list(names)
        rows = self._all(cursor, f"SELECT l.name, {now} FROM {RATE_LIMITS} AS l{self.ROW_LOCK_HINT} WHERE l.name {tail}"
                                 f" ORDER BY l.name{self.ROW_LOCK_TAIL}", [*at, *params])
        if not rows:
            return as_utc(self._all(cursor, f"SELECT {now}", at)[0][0]), []
        return as_utc(rows[0][1]), self.rate_buckets(cursor, names, lock=True)

    def read_rate_buckets(self, cursor: Cursor, names: Sequence[str]) -> tuple[datetime, list[RateBucket]]:
        """The database's time and the buckets of the limits ``names``, locking nothing (a claim's estimate of
        the tokens; the lease spends them under ``lock_rate_buckets``)."""
        now, at = self.now()
        return as_utc(self._all(cursor, f"SELECT {now}", at)[0][0]), self.rate_buckets(cursor, names)

    def _bucket_update(self) -> str:
        """The UPDATE of a bucket's state, before its WHERE (``_bucket_values`` are its parameters)."""
        return (f"UPDATE {RATE_BUCKETS} SET tokens = %s, refilled_at = {self.TS}, window_started_at = {self.TS},"
                " window_used = %s")

    def _bucket_values(self, bucket: RateBucket) -> list[Any]:
        return [bucket.tokens, self.param_ts(bucket.refilled_at), self.param_ts(bucket.window_started_at),
                bucket.window_used]

    def save_rate_buckets(self, cursor: Cursor, changed: Sequence[RateBucket], added: Sequence[RateBucket],
                          dropped: Sequence[tuple[str, str]]) -> None:
        """Write the buckets a lease changed or added, and delete the refilled ones it dropped (under the
        limits' row locks, so no other lease writes them meanwhile)."""
        ts = self.TS  # a statement per bucket: a lease writes a few (the same texts on every vendor's driver)
        for b in changed:
            cursor.execute(f"{self._bucket_update()} WHERE limit_name = %s AND rate_key = %s",
                           [*self._bucket_values(b), b.limit_name, b.rate_key])
        for b in added:
            cursor.execute(
                f"INSERT INTO {RATE_BUCKETS} ({', '.join(RATE_BUCKET_FIELDS)}) VALUES (%s, %s, %s, {ts}, {ts}, %s)",
                [b.limit_name, b.rate_key, b.tokens, self.param_ts(b.refilled_at), self.param_ts(b.window_started_at),
                 b.window_used])
        for name, key in dropped:
            cursor.execute(f"DELETE FROM {RATE_BUCKETS} WHERE limit_name = %s AND rate_key = %s", [name, key])

    def _swap_bucket(self, cursor: Cursor, was: RateBucket, now: RateBucket) -> bool:
        """Write bucket ``now`` where the stored one is still ``was`` (compare-and-set); whether it was."""
        output, tail = self.returning("limit_name")
        return bool(self._all(
            cursor, f"{self._bucket_update()}{output} WHERE limit_name = %s AND rate_key = %s AND tokens = %s"
            f" AND refilled_at = {self.TS}{tail}",
            [*self._bucket_values(now), was.limit_name, was.rate_key, was.tokens, self.param_ts(was.refilled_at)]))

    def lease_spending(self, cursor: Cursor, job_ids: Sequence[str], worker_id: str, spends: Sequence[BucketSpend],
                       at: datetime) -> dict[str, int]:
        """The lease of ``job_ids`` paying its tokens from buckets the caller planned on without a lock at ``at``:
        each is written only if it is still as known (compare-and-set), then the jobs start at ``at`` (a start is
        stamped when its token was taken, as under the lock). A bucket changed since raises ``StaleBuckets`` (the
        lease under ``lock_rate_buckets`` decides), as does, in the caller's transaction, a lost job (roll back). ``SPENDS_ALONE`` (one short write at a time): a
        failed swap swaps back the buckets written, a lost job gives its token back (``give_back``)."""
        for n, spend in enumerate(spends):
            if not self._swap_bucket(cursor, spend.known, spend.spent):
                for done in spends[:n] if self.SPENDS_ALONE else ():
                    self._swap_bucket(cursor, done.spent, done.known)
                raise StaleBuckets(spend.known.limit_name)
        leased = self.mark_processing_batch(cursor, job_ids, worker_id, at)
        if len(leased) != len(job_ids) and not self.SPENDS_ALONE:
            raise StaleBuckets("a job of the lease is no longer this worker's")
        self.give_back(cursor, spends, leased)
        return leased

    def give_back(self, cursor: Cursor, spends: Sequence[BucketSpend], leased: Mapping[str, int]) -> None:
        """The tokens ``spends`` took for jobs that did not start (not in ``leased``), back by compare-and-set (where
        another lease wrote the bucket in between it stays spent: a window then holds fewer starts, never more)."""
        for spend in spends:
            if lost := sum(1 for job_id in spend.job_ids if job_id not in leased):
                self._swap_bucket(cursor, spend.spent, replace(spend.spent, tokens=spend.spent.tokens + lost,
                                                               window_used=spend.spent.window_used - lost))

    # ------------------------------------------------------------ retention of the worker registry, metrics and attempts

    def aged_batch(self, table: str, key: str, column: str, where: str) -> str:
        """One batch delete of ``table``'s rows (named by ``key``) whose ``column`` is before a cutoff, oldest first,
        the picked rows locked, skipping locked ones (``PICK_LOCK``); params: ``where``'s, the cutoff, the batch
        size."""
        return (f"DELETE FROM {table} WHERE ({key}) IN (SELECT {key} FROM {table} WHERE {where}{column} < {self.TS}"
                f" ORDER BY {column}{self.LIMIT}{self.PICK_LOCK})")

    def _batch_by_age(self, cursor: Cursor, sql: str, cutoff: datetime, batch_size: int, *lead: Any) -> int:
        """One batch delete of rows older than ``cutoff`` (params: ``lead``'s, the cutoff, the batch size); rows
        deleted."""
        cursor.execute(sql, [*lead, self.param_ts(cutoff), batch_size])
        return int(cursor.rowcount)

    def purge_workers(self, cursor: Cursor, cutoff: datetime, batch_size: int) -> int:
        """Delete one batch of worker rows whose last heartbeat is before ``cutoff``; rows deleted."""
        return self._batch_by_age(cursor, self.PURGE_WORKERS_SQL, cutoff, batch_size)

    def purge_metric_buckets(self, cursor: Cursor, cutoff: datetime, batch_size: int) -> int:
        """Delete one batch of MetricBuckets rows that started before ``cutoff`` (no counter changes)."""
        return self._batch_by_age(cursor, self.PURGE_METRIC_BUCKETS_SQL, cutoff, batch_size)

    def purge_attempts(self, cursor: Cursor, cutoff: datetime, batch_size: int) -> int:
        """Delete one batch of attempts-history rows that failed before ``cutoff``; rows deleted."""
        return self._batch_by_age(cursor, self.PURGE_ATTEMPTS_SQL, cutoff, batch_size)

    # ------------------------------------------------------------ reads

    def job_attempts(self, cursor: Cursor, job_id: str) -> list[Attempt]:
        """Every recorded failed execution of a job, oldest first."""
        return [Attempt(r[0], int(r[1]), r[2], r[3], r[4], r[5], as_utc(r[6]), as_utc(r[7]))
                for r in self._all(cursor, self.JOB_ATTEMPTS_SQL, [job_id])]

    def queue_states(self, cursor: Cursor) -> list[QueueState]:
        return [queue_state(r) for r in self._all(cursor, self.QUEUE_STATES_SQL)]

    def get_hot(self, cursor: Cursor, job_id: str) -> HotJob | None:
        row = self._one(cursor, f"SELECT {', '.join(HOT_FIELDS)} FROM {HOT} WHERE id = %s", [job_id])
        return None if row is None else hot_job(row)

    def get_archived(self, cursor: Cursor, job_id: str) -> ArchivedJob | None:
        row = self._one(cursor, f"SELECT {', '.join(ARCHIVE_FIELDS)} FROM {ARCHIVE} WHERE id = %s", [job_id])
        return None if row is None else archived_job(row)

    def get_dead(self, cursor: Cursor, job_id: str) -> DeadJob | None:
        row = self._one(cursor, f"SELECT {', '.join(DLQ_FIELDS)} FROM {DLQ} WHERE id = %s", [job_id])
        return None if row is None else dead_job(row)

    def list_workers(self, cursor: Cursor) -> list[WorkerInfo]:
        """Every worker registry row, freshest heartbeat first."""
        return [worker_info(r) for r in self._all(cursor, self.LIST_WORKERS_SQL)]

    def schedule_ticks(self, cursor: Cursor) -> dict[str, datetime]:
        """The latest claimed tick of every recurring job, by name."""
        return {str(name): as_utc(at) for name, at in self._all(cursor, f"SELECT name, last_tick_at FROM {SCHEDULES}")}

    def active_where(self, filters: JobFilter) -> tuple[str, list[Any]]:
        """The Active view's filters: status, queue, type and the search (id, type, tags, idempotency key)."""
        status = None if filters.status is None else int(filters.status)
        return self.where(filters, "created_at", ("id", "type", "tags", "idempotency_key"), (("status", status),))

    def active_sql(self, where: str = "") -> str:
        """The Active view's read of the rows ``where`` keeps; params: its own, then the limit."""
        return f"SELECT {ACTIVE_ROW} FROM {HOT}{where} ORDER BY created_at DESC, id DESC{self.LIMIT}"

    def locate_jobs(self, cursor: Cursor, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """Where each id is now: its Hot status, SUCCEEDED (Archive) or FAILED/CANCELLED/ZOMBIE (DLQ); absent ids
        are left out. Primary-key lookups only."""
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return {}
        return located(self._all(cursor, *self.locate_sql(ids)))

    def matching_where(self, pillar: str, filters: JobFilter) -> tuple[str, str, list[Any]]:
        """(table, WHERE …, params) of a bulk-by-filter run: Hot as the Active view filters it ("hot"), else
        the DLQ as its view does."""
        if pillar == "hot":
            return (HOT, *self.active_where(filters))
        return (DLQ, *self.dlq_where(filters))

    def count_matching(self, cursor: Cursor, pillar: str, filters: JobFilter) -> tuple[int, str | None]:
        """(rows matching, their largest id) of a bulk-by-filter run over ``pillar`` ("hot": the Active view's
        filters, "dlq": the DLQ view's): the run's size and its bound (rows added later lie beyond it)."""
        table, where, params = self.matching_where(pillar, filters)
        count, upto = self._one(cursor, f"SELECT count(*), max(id) FROM {table}{where}", params)
        return int(count or 0), None if upto is None else str(upto)

    def matching_ids(self, cursor: Cursor, pillar: str, filters: JobFilter, after: str | None, upto: str,
                     limit: int) -> list[str]:
        """One keyset batch of a bulk-by-filter run, newest id first: at most ``limit`` ids matching ``filters``
        in ``pillar`` below ``after`` (the previous batch's last id), or, for the first batch, up to ``upto``.
        DLQ picks lock the picked rows, skipping those another transaction holds, as ``_pick_dlq``; Hot picks
        take no lock (the cancel's own statements decide, so a row a worker is claiming is not skipped)."""
        table, where, params = self.matching_where(pillar, filters)
        bound, value = ("id <= %s", upto) if after is None else ("id < %s", after)
        sql = self.pick(table, f"{where} AND {bound}" if where else f" WHERE {bound}", "id DESC", lock=pillar == "dlq")
        return [str(r[0]) for r in self._all(cursor, sql, [*params, value, int(limit)])]

    def _count_older(self, cursor: Cursor, table: str, column: str, op: str, cutoff: datetime, limit: int) -> int:
        """Rows of ``table`` whose ``column`` is ``op`` ``cutoff``, counted up to ``limit`` (the scan stops there)."""
        sql = (f"SELECT count(*) FROM (SELECT 1 AS one FROM {table} WHERE {column} {op} {self.TS}"
               f" ORDER BY {column}{self.LIMIT}) AS capped")
        return int(self._one(cursor, sql, [self.param_ts(cutoff), int(limit)])[0] or 0)

    def count_archive_older_than(self, cursor: Cursor, cutoff: datetime, limit: int) -> int:
        """Archive rows ``purge_archive`` would delete (finished_at < cutoff), counted up to ``limit``: a preview,
        not a render-time count."""
        return self._count_older(cursor, ARCHIVE, "finished_at", "<", cutoff, limit)

    def count_dlq_older_than(self, cursor: Cursor, cutoff: datetime, limit: int) -> int:
        """DLQ rows ``purge_dlq_older_than`` would delete (created_at <= cutoff), counted up to ``limit``."""
        return self._count_older(cursor, DLQ, "created_at", "<=", cutoff, limit)

    # ------------------------------------------------------------ the live Deck's one read, schedules, attempts

    def pack(self, sql: str, width: int, order: str) -> str:
        """A read as one JSON value: the array of its rows as positional arrays (or SQL Server's objects, see
        ``json_rows``), in ``order`` over its columns ``c0``, ``c1``, …; ``sql`` stands as a derived table."""
        raise NotImplementedError

    WHEN = "%s"  # a boolean parameter as a condition

    def claim_schedule_tick(self, cursor: Cursor, name: str, tick: datetime) -> bool:
        """Move recurring job ``name``'s latest tick forward to ``tick``: True only for the one caller that moved it
        (a concurrent claimer waits for the row lock, then finds the tick taken; run it in the enqueue's
        transaction). A name seen for the first time records ``tick`` and returns False, so a new schedule starts
        with its next tick."""
        now, at = self.now()
        ts = self.param_ts(tick)
        output, tail = self.returning("name")
        if self._all(cursor, f"UPDATE {SCHEDULES} SET last_tick_at = {self.TS}, updated_at = {now}{output}"
                     f" WHERE name = %s AND last_tick_at < {self.TS}{tail}", [ts, *at, name, ts]):
            return True
        cursor.execute(f"INSERT INTO {SCHEDULES} (name, last_tick_at, updated_at) SELECT %s, {self.TS}, {now}"
                       f" WHERE NOT EXISTS (SELECT 1 FROM {SCHEDULES}{self.ROW_LOCK_HINT} WHERE name = %s)"
                       f"{self.IGNORE_DUPLICATE}", [name, ts, *at, name])
        return False

    def items_table(self, columns: Mapping[str, str]) -> str:
        """The batch of ``items_params`` as a table ``a`` of ``columns`` (name → kind: int, name, text or ts)."""
        raise NotImplementedError

    def record_attempts(self, cursor: Cursor, worker_id: str | None, attempts: Sequence[FailedAttempt]) -> None:
        """Insert one ``chokaq_job_attempts`` row per failed execution (one INSERT … SELECT over the batch as
        items, in order), stamped with the database clock: run it in the transaction that reschedules or
        dead-letters those executions."""
        if attempts:
            sql = (f"{self.TOKENS['clock']}INSERT INTO {ATTEMPTS} ({', '.join(ATTEMPT_FIELDS)}) SELECT a.job_id,"
                   f" a.attempt, {self.TOKENS['text']}, a.error_class, a.error_message, a.traceback,"
                   f" {self.TOKENS['now']}, a.started_at FROM {self.items_table(ATTEMPT_ITEMS)} ORDER BY a.n")
            cursor.execute(sql, [*self.clock(), worker_id, *self.items_params([
                {"n": n, "job_id": a.job_id, "attempt": a.attempt, "error_class": a.error.error_class,
                 "error_message": a.error.message, "traceback": a.error.traceback,
                 "started_at": self.param_ts(a.started_at)} for n, a in enumerate(attempts)])])

    def change_marker(self, cursor: Cursor) -> int | None:
        """A number that changes whenever ANOTHER connection commits (SQLite's ``PRAGMA data_version``): a
        worker without a push channel polls it every few milliseconds to notice new jobs at once. None where
        the vendor has a push channel (PostgreSQL's LISTEN/NOTIFY) or no such marker; no statement then."""
        return None

    def change_file(self, database: str) -> str | None:
        """The file whose writes come with the commits ``change_marker`` follows (SQLite's database file, of the
        connection setting ``NAME`` = ``database``), for a watch on it; None where there is none (a server)."""
        return None

    def tidy_hot_table(self, cursor: Cursor, min_dead_rows: int) -> bool:
        """Keep the Hot table's plans and size healthy under queue churn: when its dead row versions exceed
        ``min_dead_rows`` + 20 % of its live rows (autovacuum's formula with a larger base), vacuum and
        analyze it (one caller fleet-wide at a time); True when it did. Runs outside a transaction. Only
        PostgreSQL needs it (a server with autovacuum off or lagging leaves every claim walking dead index
        entries under stale statistics); elsewhere it does nothing and returns False."""
        return False

    # ------------------------------------------------------------ history roll-ups

    def record_history(self, cursor: Cursor, archived_ids: Sequence[str], failed_ids: Sequence[str],
                       at: datetime) -> None:
        """Count the rows a completion just moved to the Archive / the DLQ in the minute and the hour buckets
        of ``at`` (per queue, type and outcome, successes' durations in the histogram bins): run it in the
        transaction of the move. Ids that are not (or no longer) there count nothing."""
        archived = list(dict.fromkeys(archived_ids))
        failed = list(dict.fromkeys(failed_ids))
        if not archived and not failed:
            return
        archived_tail, archived_params = self.id_list(archived)
        failed_tail, failed_params = self.id_list(failed)
        minute = at.astimezone(UTC).replace(second=0, microsecond=0)  # and its hour
        rows = (f"(SELECT queue, type, 0 AS outcome, duration_ms FROM {ARCHIVE} WHERE id {archived_tail} UNION ALL"
                f" SELECT queue, type, 1 AS outcome, NULL AS duration_ms FROM {DLQ} WHERE id {failed_tail})")
        cursor.execute(self.history_add(history_rows(rows, self.TS, self.TS)),
                       [self.param_ts(minute), self.param_ts(minute.replace(minute=0)), *archived_params,
                        *failed_params])

    def purge_history(self, cursor: Cursor, granularity: int, cutoff: datetime, batch_size: int) -> int:
        """Delete one batch of ``granularity``-second history buckets that started before ``cutoff``."""
        return self._batch_by_age(cursor, self.PURGE_HISTORY_SQL, cutoff, batch_size, int(granularity))

    # ------------------------------------------------------------ recurring jobs: the Recurring panel

    def schedule_states(self, cursor: Cursor) -> list[ScheduleState]:
        """Every ``chokaq_schedules`` row (tick, operator switch, latest job), by name."""
        return [schedule_state(r) for r in self._all(cursor, SCHEDULE_STATES_SQL)]

    def set_schedule_enabled(self, cursor: Cursor, name: str, enabled: bool, tick: datetime) -> None:
        """The operator's switch of recurring job ``name``, kept in its row (created at ``tick`` when missing);
        switching on also moves the latest tick up to ``tick`` (its due tick now), so ticks that fell while it
        was off are not run."""
        now, at = self.now()
        values = {"name": self.param("name"), "last_tick_at": self.TS, "updated_at": now, "enabled": self.param("bool")}
        later = (f"CASE WHEN {{new}}.enabled = {self.TRUE} AND {{new}}.last_tick_at > {{old}}.last_tick_at"
                 " THEN {new}.last_tick_at ELSE {old}.last_tick_at END")
        update = {"enabled": None, "updated_at": None, "last_tick_at": later}
        cursor.execute(self.upsert(SCHEDULES, "name", values, update), [name, self.param_ts(tick), *at, bool(enabled)])

    def record_schedule_run(self, cursor: Cursor, name: str, job_id: str, tick: datetime) -> None:
        """Remember ``job_id`` as recurring job ``name``'s latest job, run now (the row created at ``tick`` when
        missing); run it in the transaction that enqueues the job."""
        now, at = self.now()
        values = {"name": self.param("name"), "last_tick_at": self.TS, "updated_at": now,
                  "last_job_id": self.param("name"), "last_run_at": now}
        update = dict.fromkeys(("updated_at", "last_job_id", "last_run_at"))
        cursor.execute(self.upsert(SCHEDULES, "name", values, update), [name, self.param_ts(tick), *at, job_id, *at])

    # ------------------------------------------------------------ enqueue and the claim

    def enqueue(self, cursor: Cursor, jobs: Sequence[NewJob]) -> list[str]:
        """Insert Pending rows; a taken idempotency key yields its holder's id. A job neither inserted nor
        resolved (its key's holder left Hot meanwhile, or the vendor lost an insert race) goes again."""
        if not jobs:
            return []
        stored: dict[str, str] = {}
        todo = list(jobs)
        for attempt in range(ENQUEUE_PASSES):
            inserted, holders = self.insert_jobs(cursor, todo, retry=attempt + 1 < ENQUEUE_PASSES)
            for job in todo:
                if job.id in inserted:
                    stored[job.id] = job.id
                elif job.idempotency_key is not None and job.idempotency_key in holders:
                    stored[job.id] = holders[job.idempotency_key]
            todo = [job for job in todo if job.id not in stored]
            if not todo:
                break
        if todo:
            raise StorageError(f"enqueue could not store or resolve {len(todo)} job(s): {[j.id for j in todo][:10]}")
        return [stored[job.id] for job in jobs]

    def insert_jobs(self, cursor: Cursor, jobs: Sequence[NewJob], retry: bool) -> tuple[set[str], dict[str, str]]:
        """The vendor's insert of Pending rows (taken keys skipped) with their queues' Queues and StatsSummary
        rows: (ids inserted, {idempotency key: id holding it}). ``retry``: a lost race may be left to the next
        pass."""
        raise NotImplementedError

    def enqueue_alone(self, cursor: Cursor, jobs: Sequence[NewJob]) -> list[str] | None:
        """Where ``ENQUEUE_IN_ONE_STATEMENT``: ``enqueue`` of jobs without idempotency keys as one statement that
        commits itself, or None, having written nothing, when it cannot be one (SQLite: a queue whose Queues and
        StatsSummary rows do not exist yet; the caller then runs ``enqueue`` in a transaction)."""
        return self.enqueue(cursor, jobs)

    def key_holders(self, cursor: Cursor, jobs: Sequence[NewJob], inserted: set[str]) -> dict[str, str]:
        """{idempotency key: Hot id holding it} for the keys of the jobs not inserted."""
        keys = sorted({j.idempotency_key for j in jobs if j.id not in inserted and j.idempotency_key is not None})
        if not keys:
            return {}
        tail, params = self.id_list(keys)
        rows = self._all(cursor, f"SELECT idempotency_key, id FROM {HOT} WHERE idempotency_key {tail}", params)
        return {str(key): str(job_id) for key, job_id in rows}

    def fetch_batch(self, cursor: Cursor, worker_id: str, limit: int, queues: Sequence[str] | None,
                    hold: ClaimHold | None = None, lease: int = 0) -> list[HotJob]:
        """Claim up to ``limit`` due Pending rows (Pending → Fetched) honouring pause, hide, bulkheads and what rate
        limits hold back (``hold``), in claim order: priority desc, due time asc, id. The first ``lease`` of them
        (the worker has a free execution slot for each) are leased in the same transaction: Processing, their
        attempt counted, started now (``LEASES_IN_CLAIM``: by the claim statement itself, else by the lease
        statement after it; a leased job's ``started_at`` and ``heartbeat_at`` are then not read back)."""
        if limit <= 0 or (queues is not None and not queues):
            return []
        names = None if queues is None else list(dict.fromkeys(queues))
        rows = (self.claim_leasing(cursor, worker_id, limit, names, hold or None, lease)
                if lease and self.LEASES_IN_CLAIM else self.claim(cursor, worker_id, limit, names, hold or None))
        jobs = in_claim_order(rows)
        if lease and not self.LEASES_IN_CLAIM and jobs:
            attempts = self.mark_processing_batch(cursor, [job.id for job in jobs[:lease]], worker_id)
            jobs = [replace(job, status=JobStatus.PROCESSING, attempt_count=attempts[job.id]) if job.id in attempts
                    else job for job in jobs]
        return jobs

    def fetch_alone(self, cursor: Cursor, worker_id: str, limit: int, queues: Sequence[str] | None,
                    lease: int = 0) -> list[HotJob] | None:
        """Where ``CLAIMS_ALONE``: ``fetch_batch`` without a hold as one statement that commits itself (no BEGIN,
        no lock of the capped queues, no COMMIT), or None, having claimed nothing, when a capped queue is in
        reach: its claimers take turns, so that claim is ``fetch_batch`` in a transaction (None at once elsewhere)."""
        return None

    def claim(self, cursor: Cursor, worker_id: str, limit: int, queues: list[str] | None,
              hold: ClaimHold | None = None) -> list[Any]:
        """The vendor's claim statement(s): the Hot rows (``HOT_FIELDS``) it moved to Fetched, its candidate rows
        filtered by ``hold_clause(hold)`` when a hold is given (None: the plain claim, not one statement more)."""
        raise NotImplementedError

    def claim_leasing(self, cursor: Cursor, worker_id: str, limit: int, queues: list[str] | None,
                      hold: ClaimHold | None, lease: int) -> list[Any]:
        """Where ``LEASES_IN_CLAIM``: the claim whose statement also leases its first ``lease`` rows in claim order."""
        raise NotImplementedError

    # ------------------------------------------------------------ the lease, commands and maintenance

    def mark_processing(self, cursor: Cursor, job_id: str, worker_id: str) -> int | None:
        """Lease gate (Fetched → Processing) for the owning worker; the new attempt count or None."""
        return self.mark_processing_batch(cursor, [job_id], worker_id).get(job_id)

    def mark_processing_batch(self, cursor: Cursor, job_ids: Sequence[str], worker_id: str,
                              at: datetime | None = None) -> dict[str, int]:
        """The lease gate for several buffered rows in one statement: {job id: new attempt count} of
        the rows that were still Fetched by this worker (the others must not run); ``at``: their start (else now)."""
        if not job_ids:
            return {}
        sql, clock = ((self.MARK_PROCESSING_BATCH_SQL, self.clock()) if at is None
                      else (self.MARK_PROCESSING_AT_SQL, [self.param_ts(at)]))
        rows = self._all(cursor, sql, [*clock, self.ids_param(job_ids), worker_id])
        return {str(job_id): int(attempts) for job_id, attempts in rows}

    def keep_alive(self, cursor: Cursor, job_ids: Sequence[str], worker_id: str) -> list[str]:
        """One UPDATE stamping the heartbeat of every listed Processing row this worker owns;
        returns the ids still owned."""
        if not job_ids:
            return []
        return [str(r[0]) for r in self._all(cursor, self.KEEP_ALIVE_SQL,
                                             [*self.clock(), self.ids_param(job_ids), worker_id])]

    def cancel_requests(self, cursor: Cursor, worker_id: str) -> list[tuple[str, str]]:
        """(job id, actor) of this worker's Processing rows an operator asked to cancel."""
        return [(str(job_id), str(actor)) for job_id, actor in self._all(cursor, self.CANCEL_REQUESTS_SQL, [worker_id])]

    def cancel_batch(self, cursor: Cursor, job_ids: Sequence[str], actor: str | None) -> Moved:
        """Pending/Fetched → DLQ Cancelled; Processing rows are left alone."""
        if not job_ids:
            return []
        return self._move(cursor, TO_DLQ, self.CANCEL_BATCH_SQL,
                          [*self.clock(), cancel_details(actor), actor, self.ids_param(job_ids)])

    def request_cancel(self, cursor: Cursor, job_ids: Sequence[str], actor: str) -> list[str]:
        """Flag Processing rows for cooperative cancellation; returns the flagged ids."""
        if not job_ids:
            return []
        return [str(r[0]) for r in self._all(cursor, self.REQUEST_CANCEL_SQL, [actor, self.ids_param(job_ids)])]

    def update_hot_data(self, cursor: Cursor, job_id: str, payload: str | None, tags: str | None,
                        priority: int | None, actor: str | None, revision: int | None = None) -> bool:
        """Edit a Pending Hot row (coalescing NULLs) and bump its revision; False if not Pending, not at
        ``revision`` (None: any) or nothing to change."""
        if payload is None and tags is None and priority is None:
            return False
        return bool(self._all(cursor, self.UPDATE_HOT_SQL,
                              [*self.clock(), payload, tags, priority, actor, job_id, revision]))

    def update_dlq_data(self, cursor: Cursor, job_id: str, payload: str | None, tags: str | None, actor: str | None,
                        revision: int | None = None) -> bool:
        """Edit a DLQ row, keeping the old payload in ``previous_payload``, and bump its revision; False if not
        at ``revision`` (None: any) or nothing to change."""
        if payload is None and tags is None:
            return False
        return bool(self._all(cursor, self.UPDATE_DLQ_SQL, [payload, tags, actor, job_id, revision]))

    def release_jobs(self, cursor: Cursor, job_ids: Sequence[str], worker_id: str) -> list[str]:
        """Fetched → Pending for the unstarted rows this worker owns; returns their ids."""
        if not job_ids:
            return []
        return [str(r[0]) for r in self._all(cursor, self.RELEASE_SQL,
                                             [*self.clock(), self.ids_param(job_ids), worker_id])]

    def recover_abandoned(self, cursor: Cursor, fetched_timeout_s: float) -> int:
        """Fetched rows untouched for the timeout → Pending."""
        cursor.execute(self.RECOVER_ABANDONED_SQL, [*self.clock(), *self.ago_params(fetched_timeout_s)])
        return int(cursor.rowcount)

    def archive_zombies(self, cursor: Cursor, global_timeout_s: float) -> Moved:
        """Processing rows whose heartbeat expired (queue timeout else global) → DLQ Zombie."""
        return self._move(cursor, TO_DLQ, self.ARCHIVE_ZOMBIES_SQL,
                          [*self.clock(), *self.seconds_params(global_timeout_s), ZOMBIE_DETAILS])

    # ------------------------------------------------------------ DLQ → Hot and the purges

    def _resurrect(self, cursor: Cursor, job_ids: Sequence[str], payload: str | None = None, tags: str | None = None,
                   priority: int | None = None, actor: str | None = None, revision: int | None = None) -> Moved:
        """DLQ → Hot Pending (priority 10 unless given, attempt count 0, edits coalesced); FailedTotal -n."""
        if not job_ids:
            return []
        return self._move(cursor, TO_HOT, self.RESURRECT_SQL,
                          [*self.clock(), payload, tags, priority, actor, self.ids_param(job_ids), revision])

    def resurrect(self, cursor: Cursor, job_id: str, payload: str | None, tags: str | None, priority: int | None,
                  actor: str | None, revision: int | None = None) -> bool:
        """DLQ → Hot Pending with optional edits; attempt count 0; FailedTotal −1. ``revision``: only if the DLQ
        row is still at that edit version (None: whatever it is); the Hot row carries it, one up."""
        return bool(self._resurrect(cursor, [job_id], payload, tags, priority, actor, revision))

    def resurrect_batch(self, cursor: Cursor, job_ids: Sequence[str], actor: str | None) -> Moved:
        """DLQ → Hot for the given ids, priority 10, no edits; FailedTotal -n."""
        return self._resurrect(cursor, job_ids, actor=actor)

    def _purge_by_age(self, cursor: Cursor, move: Move, sql: str, cutoff: datetime, batch_size: int) -> int:
        """One batch of the rows before ``cutoff`` purged; how many."""
        if batch_size <= 0:
            return 0
        return len(self._move(cursor, move, sql, [*self.clock(), self.param_ts(cutoff), batch_size]))

    def purge_dlq_ids(self, cursor: Cursor, job_ids: Sequence[str], batch_size: int) -> Moved:
        """Delete one batch of the given DLQ ids (oldest failure first); FailedTotal −n."""
        if not job_ids or batch_size <= 0:
            return []
        return self._move(cursor, PURGE_DLQ, self.PURGE_DLQ_IDS_SQL,
                          [*self.clock(), self.ids_param(job_ids), batch_size])

    def purge_archive_ids(self, cursor: Cursor, job_ids: Sequence[str]) -> Moved:
        """Delete the given Archive rows (one batch of them all, as ``purge_dlq_ids``); PurgedTotal +n."""
        if not job_ids:
            return []
        return self._move(cursor, PURGE_ARCHIVE, self.PURGE_ARCHIVE_IDS_SQL,
                          [*self.clock(), self.ids_param(job_ids), len(set(job_ids))])

    def purge_dlq_older_than(self, cursor: Cursor, cutoff: datetime, batch_size: int) -> int:
        """Delete one batch of DLQ rows created at or before ``cutoff``; FailedTotal -n."""
        return self._purge_by_age(cursor, PURGE_DLQ, self.PURGE_DLQ_OLDER_SQL, cutoff, batch_size)

    def purge_archive(self, cursor: Cursor, cutoff: datetime, batch_size: int) -> int:
        """Delete one batch of Archive rows finished before ``cutoff``; PurgedTotal +n (SucceededTotal never
        shrinks)."""
        return self._purge_by_age(cursor, PURGE_ARCHIVE, self.PURGE_ARCHIVE_SQL, cutoff, batch_size)

    def _pick_dlq(self, cursor: Cursor, filters: JobFilter, max_jobs: int, lock: bool = True) -> list[str]:
        """The first ``max_jobs`` filter matches, newest failure first, locked (skipping locked ones) where the
        vendor can unless ``lock`` is False."""
        where, params = self.dlq_where(filters)
        return [str(r[0]) for r in self._all(cursor, self.pick(DLQ, where, "failed_at DESC, id ASC", lock),
                                             [*params, int(max_jobs)])]

    def purge_dlq_by_filter(self, cursor: Cursor, filters: JobFilter, max_jobs: int) -> Moved:
        """Delete the first ``max_jobs`` matches; FailedTotal -n."""
        ids = self._pick_dlq(cursor, filters, max_jobs) if max_jobs > 0 else []
        return self.purge_dlq_ids(cursor, ids, len(ids))

    def resurrect_dlq_by_filter(self, cursor: Cursor, filters: JobFilter, max_jobs: int, actor: str | None) -> Moved:
        """Move the first ``max_jobs`` matches to Hot exactly as ``resurrect_batch``."""
        return self._resurrect(cursor, self._pick_dlq(cursor, filters, max_jobs), actor=actor) if max_jobs > 0 else []

    # ------------------------------------------------------------ completion (batched moves)

    def begin_completion(self, cursor: Cursor, worker_id: str | None, job_ids: Sequence[str],
                         failed_ids: Sequence[str]) -> dict[str, datetime | None]:
        """Open a completion transaction of several moves: when each failed execution of ``failed_ids`` started (the
        Hot row's ``started_at``, read before the move clears it). A vendor whose moves lock rows also takes the
        batch's Hot rows (this worker's) and its queues' counter rows here, each in key order (the shared rows' lock
        order: every later move of the transaction finds its counter rows held, so it never waits for one while
        holding another transaction's history or bucket rows). Here: primary-key reads (SQLite has one writer).
        ``storage.complete`` opens with it when the batch has several moves or failed executions to record."""
        starts: dict[str, datetime | None] = {}
        for job_id in dict.fromkeys(failed_ids):
            row = self.get_hot(cursor, job_id)
            starts[job_id] = row.started_at if row is not None else None
        return starts

    def _move(self, cursor: Cursor, move: Move, sql: str, params: list[Any]) -> Moved:
        """Run one move statement: (id, queue) of the rows it moved (PostgreSQL and SQL Server move, count and
        bucket inside the statement)."""
        return [(str(job_id), str(queue)) for job_id, queue in self._all(cursor, sql, params)]

    def _complete(self, cursor: Cursor, move: Move, sql: str, worker_id: str | None,
                  rows: Sequence[Mapping[str, Any]]) -> Moved:
        """Run a completion over its items' rows, the last row of an id standing for that id."""
        if not rows:
            return []
        rows = list({row["id"]: row for row in rows}.values())
        return self._move(cursor, move, sql, [*self.clock(), *self.items_params(rows), worker_id, worker_id])

    def archive_succeeded(self, cursor: Cursor, worker_id: str | None, items: Sequence[Success]) -> Moved:
        """Hot → Archive for every item this worker owns (None: no owner guard); SucceededTotal and the success
        bucket bumped per queue."""
        return self._complete(cursor, TO_ARCHIVE, self.ARCHIVE_SUCCEEDED_SQL, worker_id, [
            {"id": i.job_id, "duration_ms": finite(i.duration_ms), "result": i.result} for i in items])

    def move_to_dlq(self, cursor: Cursor, worker_id: str | None, items: Sequence[Failure]) -> Moved:
        """Hot → DLQ with each item's reason and details, owner-guarded; FailedTotal and the failure buckets
        bumped."""
        return self._complete(cursor, TO_DLQ, self.MOVE_TO_DLQ_SQL, worker_id, [
            {"id": i.job_id, "failure_reason": int(i.reason), "error_details": error_details(i.error_details),
             **error_columns(i)} for i in items])

    def reschedule_for_retry(self, cursor: Cursor, worker_id: str | None, items: Sequence[Retry]) -> Moved:
        """Back to Pending at now + delay with the given attempt count; RetriedTotal += n."""
        return self._complete(cursor, RETRY, self.RESCHEDULE_SQL, worker_id, [
            {"id": i.job_id, "attempt_count": int(i.attempt_count), **self.delay_fields(i.delay_seconds),
             **error_columns(i), "held_by": i.held_by} for i in items])
