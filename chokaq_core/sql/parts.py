"""The parts every vendor dialect is written from, once: the texts, the edit-version guard, table and column
names, row mappers and the shared statements (``base.BaseDialect`` builds the dialect functions from them).

The texts are stored in rows (error details of DLQ moves) or shown by the Deck, so every vendor must write
exactly the same words. The edit version (``revision``) makes an operator's edit a compare-and-set: each edit
names the revision it was made against, the statement bumps it, and a row whose revision moved on meanwhile
(another edit, a move between Hot and the DLQ, which carry it +1) matches nothing — the caller learns that
the edit was stale and nothing changed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any

from chokaq_core.domain import (
    DURATION_BIN_EDGES_MS,
    DURATION_BINS,
    HISTORY_GRANULARITIES,
    ArchivedJob,
    DeadJob,
    Failure,
    FailureReason,
    HotJob,
    JobStatus,
    NewJob,
    QueueState,
    Rate,
    RateBucket,
    RateLimitState,
    Retry,
    ScheduleState,
    WorkerInfo,
)

Cursor = Any
Moved = list[tuple[str, str]]  # (job id, queue) of each row a transition changed

ZOMBIE_DETAILS = "Zombie: Worker heartbeat expired during execution"
UNKNOWN_ERROR = "Unknown error (No details provided)"  # spec 01 §4.6: the text stored for empty details
EMPTY_ERROR = "(empty error details)"  # how top_errors names the group of rows without details
TOP_ERRORS_SAMPLE = 5000  # top_errors groups the newest this many DLQ rows (spec 01 §5)

REVISION_BUMP = "revision = revision + 1"


def revision_guard(expected: str = "%s") -> str:
    """The predicate of a versioned edit: ``expected`` (a placeholder or variable holding the revision the
    edit was made against, NULL for an unversioned command) must equal the row's revision."""
    return f"revision = coalesce({expected}, revision)"


def finite(value: float | None) -> float | None:
    """A measured number as stored: a float, or NULL when missing or not finite."""
    return float(value) if value is not None and math.isfinite(value) else None


def error_details(text: str | None) -> str:
    """Error details as stored in a DLQ row: the default text for blank ones."""
    return text if text and text.strip() else UNKNOWN_ERROR


def error_columns(item: Retry | Failure) -> dict[str, str | None]:
    """The error class and message a retry or DLQ move stores: what the execution raised, else NULLs."""
    error = item.error
    return {"error_class": error.error_class if error else None, "error_message": error.message if error else None}


def last_error_set(error_class: str, message: str, held_by: str, now: str, row: str = "") -> str:
    """A reschedule's SET of the Hot row's last error: a failed execution (its class not NULL) replaces the last
    error and its time, a retry without one (circuit deferral, shutdown) keeps them; ``held_by`` names the open
    circuit that deferred the job, or clears it. Operands are SQL expressions; ``row`` qualifies the row."""
    return (f"last_error_class = coalesce({error_class}, {row}last_error_class),"
            f" last_error_message = CASE WHEN {error_class} IS NULL THEN {row}last_error_message ELSE {message} END,"
            f" last_error_at = CASE WHEN {error_class} IS NULL THEN {row}last_error_at ELSE {now} END,"
            f" held_by = {held_by}")


def job_item(job: NewJob, **delay: Any) -> dict[str, Any]:
    """A new job as an item of the vendor's enqueue batch: its Hot columns, then ``delay`` (the vendor's form of
    ``job.delay_seconds``)."""
    return {"id": job.id, "queue": job.queue, "type": job.type, "payload": job.payload, "tags": job.tags,
            "idempotency_key": job.idempotency_key, "priority": int(job.priority), "created_by": job.created_by,
            "rate_key": job.rate_key, **delay}


def cancel_details(actor: str | None) -> str:
    """Error details of an operator's cancellation."""
    return f"Cancelled by admin: {actor}" if actor else "Cancelled by admin (Batch)"


def json_rows(packed: Any, datetime_at: Sequence[int] = ()) -> list[list[Any]]:
    """Rows a ``deck_snapshot`` statement packed as a JSON array of arrays (or, on SQL Server, of objects whose
    keys ``c0``, ``c1``, … give the positions): decoded, with the ISO timestamps at ``datetime_at`` parsed into
    aware UTC datetimes. ``None`` (a part the statement found no rows for) is no rows."""
    if packed is None:
        return []
    rows = json.loads(packed) if isinstance(packed, str | bytes) else packed
    out = []
    for row in rows:  # SQL Server's FOR JSON PATH, INCLUDE_NULL_VALUES: every key present
        values = [row.get(f"c{i}") for i in range(len(row))] if isinstance(row, dict) else list(row)
        for i in datetime_at:
            values[i] = json_datetime(values[i])
        out.append(values)
    return out


def json_datetime(value: Any) -> datetime | None:
    """An ISO 8601 timestamp as JSON renders it (PostgreSQL: offset; SQLite and SQL Server: naive UTC, SQL Server
    with up to 7 fractional digits) as an aware UTC datetime."""
    if value is None or isinstance(value, datetime):
        return value
    text = str(value).replace(" ", "T", 1)
    head, dot, rest = text.partition(".")
    if dot:  # at most 6 fractional digits for fromisoformat; keep any offset after them
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[:min(digits, 6)]}{rest[digits:]}"
    moment = datetime.fromisoformat(text)
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


# ---------------------------------------------------------------- tables and column lists

HOT = "chokaq_jobs_hot"
ARCHIVE = "chokaq_jobs_archive"
DLQ = "chokaq_jobs_dlq"
STATS = "chokaq_stats_summary"
BUCKETS = "chokaq_metric_buckets"
QUEUES = "chokaq_queues"
WORKERS = "chokaq_workers"
SCHEDULES = "chokaq_schedules"
RATE_LIMITS = "chokaq_rate_limits"
RATE_BUCKETS = "chokaq_rate_buckets"
MAX_HELD_KEYS = 100  # partitions of per-key limits a claim skips by name; more are sent back after the claim
HISTORY = "chokaq_history_buckets"
PURGED = "purged_total"  # the counter an Archive purge raises (succeeded_total never shrinks)

# Column lists follow the row dataclasses field for field, so a fetched row maps by position.
HOT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(HotJob))
ARCHIVE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ArchivedJob))
DLQ_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(DeadJob))
WORKER_FIELDS = ("worker_id", "hostname", "pid", "queues", "capacity", "active_count", "is_running", "runtime_json",
                 "circuits_json", "started_at", "last_heartbeat_at", "stopped_at")
_TIMES = {"heartbeat_at", "scheduled_at", "created_at", "started_at", "last_updated_at", "finished_at", "failed_at",
          "last_error_at", "last_heartbeat_at", "stopped_at"}


def as_utc(value: Any) -> Any:
    """A timestamp as the driver returns it (a datetime, naive meaning UTC, or SQLite's stored text) as an aware
    one."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return json_datetime(value)


def _mapped(names: Sequence[str], row: Sequence[Any]) -> dict[str, Any]:
    return {name: as_utc(value) if name in _TIMES else value for name, value in zip(names, row, strict=True)}


def _row_builder[T](cls: type[T], converters: Mapping[str, Callable[[Any], Any]]) -> Callable[[Sequence[Any]], T]:
    """A row → ``cls`` constructor for a frozen slots dataclass whose columns follow its fields: it fills the slots
    through their descriptors (timestamps through ``as_utc``, the named columns through their converter). A frozen
    dataclass's ``__init__`` sets each field by ``object.__setattr__``: ~6 µs for Hot's 23 fields, ten times this,
    and a claim builds one per claimed row."""
    names = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
    setters = [getattr(cls, name).__set__ for name in names]
    convert = [converters.get(name, as_utc if name in _TIMES else None) for name in names]
    plain = tuple((put, i) for i, (put, c) in enumerate(zip(setters, convert, strict=True)) if c is None)
    converted = tuple((put, i, c) for i, (put, c) in enumerate(zip(setters, convert, strict=True)) if c is not None)
    width, new = len(names), object.__new__

    def build(row: Sequence[Any]) -> T:
        if len(row) != width:
            raise ValueError(f"a {cls.__name__} row has {width} columns, not {len(row)}")
        built = new(cls)
        for put, i in plain:
            put(built, row[i])
        for put, i, c in converted:
            put(built, c(row[i]))
        return built

    return build


hot_job = _row_builder(HotJob, {"status": JobStatus})


def in_claim_order(rows: Iterable[Sequence[Any]]) -> list[HotJob]:
    return sorted((hot_job(row) for row in rows), key=lambda j: (-j.priority, j.scheduled_at or j.created_at, j.id))


archived_job = _row_builder(ArchivedJob, {})
dead_job = _row_builder(DeadJob, {"failure_reason": FailureReason})


def worker_info(row: Sequence[Any]) -> WorkerInfo:
    data = _mapped(WORKER_FIELDS, row)
    return WorkerInfo(**{**data, "pid": int(data["pid"]), "capacity": int(data["capacity"]),
                         "active_count": int(data["active_count"]), "is_running": bool(data["is_running"])})


def queue_state(r: Sequence[Any]) -> QueueState:
    return QueueState(r[0], bool(r[1]), bool(r[2]), r[3], r[4])


def located(rows: Iterable[Sequence[Any]]) -> dict[str, JobStatus]:
    """(id, code) rows of ``locate_sql``: a Hot status, SUCCEEDED, or -1 - the DLQ failure reason."""
    return {job_id: JobStatus(code) if code >= 0 else FailureReason(-1 - code).shown_status for job_id, code in rows}


# ---------------------------------------------------------------- shared statements

QUEUE_STATES_SELECT = f"SELECT name, is_paused, is_active, zombie_timeout_seconds, max_workers FROM {QUEUES}"
HOT_COUNTS = ("sum(CASE WHEN status = 0 THEN 1 ELSE 0 END) AS pending,"
               " sum(CASE WHEN status = 1 THEN 1 ELSE 0 END) AS fetched,"
               " sum(CASE WHEN status = 2 THEN 1 ELSE 0 END) AS processing")
SUMMARY_WIDTH = 12  # columns of a summary row (``summary``)
ERROR_GROUP_WIDTH = 6  # columns of a top-errors row (``error_group``)


def pending_split_sql(later: str, source: str = HOT) -> str:
    """The waiting part of the Pending split (waiting, then scheduled, retrying, held) as one row: a count over the
    partial index ``hot_pending_split`` of the scheduled Pending rows, which carries every column read (index-only
    where the visibility map allows). A row without a schedule is due, so the ready count is the Pending count
    minus ``waiting`` (``summary_stats_sql``). ``later`` is the vendor's predicate "scheduled_at is after now"; a
    job not due is held when an open circuit deferred it, else retrying when an execution failed, else scheduled."""
    waits = "CASE WHEN p.later = 1 AND p.held_by IS NULL AND p.last_error_at IS {}NULL THEN 1 ELSE 0 END"
    return (
        "SELECT coalesce(sum(p.later), 0) AS waiting,"
        f" coalesce(sum({waits.format('')}), 0) AS scheduled,"
        f" coalesce(sum({waits.format('NOT ')}), 0) AS retrying,"
        " coalesce(sum(CASE WHEN p.later = 1 AND p.held_by IS NOT NULL THEN 1 ELSE 0 END), 0) AS held"
        f" FROM (SELECT CASE WHEN {later} THEN 1 ELSE 0 END AS later, held_by, last_error_at"
        f" FROM {source} WHERE status = 0 AND scheduled_at IS NOT NULL) AS p"
    )


def summary_stats_sql(later: str, dirty: str = "") -> str:
    """Hot counts by status, the retained counters and the Pending split (``pending_split_sql``); ``dirty``: a table
    hint that allows dirty reads (spec 01 §1.3). The latest activity skips NULLs before its aggregate (SQL Server
    would send a warning ahead of the row)."""
    return f"""
SELECT coalesce(h.pending, 0), coalesce(h.fetched, 0), coalesce(h.processing, 0), totals.succeeded, totals.failed,
       totals.retried, (SELECT max(z.last_activity_at) FROM {STATS} AS z{dirty} WHERE z.last_activity_at IS NOT NULL)
       AS last_activity_at, totals.purged, coalesce(h.pending, 0) - pend.waiting, pend.scheduled, pend.retrying, pend.held
FROM (SELECT {HOT_COUNTS} FROM {HOT}{dirty}) AS h
CROSS JOIN (SELECT coalesce(sum(succeeded_total), 0) AS succeeded, coalesce(sum(failed_total), 0) AS failed,
                   coalesce(sum(retried_total), 0) AS retried, coalesce(sum(purged_total), 0) AS purged
            FROM {STATS}{dirty}) AS totals
CROSS JOIN ({pending_split_sql(later, HOT + dirty)}) AS pend
"""


SUMMARY_STATS_SQL = summary_stats_sql("scheduled_at > now()")


def queue_health_select(lag: str, now: str, dirty: str = "") -> str:
    """Per Queues row: its due Pending rows' count, average and longest lag in seconds (0 when none), unordered:
    ``lag`` is the vendor's seconds from ``p.due_at`` to ``now`` (0 for a row not yet late)."""
    return f"""SELECT q.name, coalesce(h.n, 0), coalesce(h.avg_lag, 0), coalesce(h.max_lag, 0)
FROM {QUEUES} AS q{dirty}
LEFT JOIN (
    SELECT l.queue, count(*) AS n, avg(l.lag) AS avg_lag, max(l.lag) AS max_lag
    FROM (SELECT p.queue, {lag} AS lag
          FROM (SELECT w.queue, coalesce(w.scheduled_at, w.created_at) AS due_at FROM {HOT} AS w{dirty}
                WHERE w.status = 0 AND (w.scheduled_at IS NULL OR w.scheduled_at <= {now})) AS p) AS l
    GROUP BY l.queue) AS h ON h.queue = q.name"""


def queue_stats_select(dirty: str = "") -> str:
    """Per Queues row: Hot counts by status and the retained counters, unordered (``dirty``: a table hint that
    allows dirty reads, spec 01 §1.3)."""
    return f"""SELECT q.name, coalesce(h.pending, 0), coalesce(h.fetched, 0), coalesce(h.processing, 0),
       coalesce(s.succeeded_total, 0), coalesce(s.failed_total, 0), coalesce(s.retried_total, 0), s.last_activity_at,
       coalesce(s.purged_total, 0)
FROM {QUEUES} AS q{dirty}
LEFT JOIN (SELECT queue, {HOT_COUNTS} FROM {HOT}{dirty} GROUP BY queue) AS h ON h.queue = q.name
LEFT JOIN {STATS} AS s{dirty} ON s.queue = q.name"""


def throughput_select(since: str, dirty: str = "") -> str:
    """Per-second succeeded and failed counts from ``since`` (an operand), unordered (``dirty``: as above)."""
    return ("SELECT bucket_start, sum(CASE WHEN outcome = 0 THEN completed_count ELSE 0 END),"
            " sum(CASE WHEN outcome = 1 THEN completed_count ELSE 0 END)"
            f" FROM {BUCKETS}{dirty} WHERE bucket_start >= {since} GROUP BY bucket_start")


LIST_WORKERS_SELECT = f"SELECT {', '.join(WORKER_FIELDS)} FROM {WORKERS}"
# The reads a vendor writes as an unordered ``…_SELECT`` (so ``deck_snapshot`` can take each as a derived table): each
# ``…_SQL`` is its SELECT in this order (BaseDialect.__init_subclass__).
READ_ORDERS = {"THROUGHPUT": "bucket_start", "QUEUE_STATES": "name", "QUEUE_STATS": "q.name", "QUEUE_HEALTH": "q.name",
               "LIST_WORKERS": "last_heartbeat_at DESC, worker_id"}
ACTIVE_ROW = ("id, queue, type, status, attempt_count, created_at, priority, created_by, tags, worker_id, scheduled_at,"
              " started_at, last_error_class, last_error_message, last_error_at, held_by")
ACTIVE_WIDTH = 16  # columns of ACTIVE_ROW (``active_row``)
ARCHIVE_ROW = ("id, queue, type, attempt_count, created_at, created_by, tags, worker_id, started_at, finished_at,"
               " duration_ms")
_DLQ_HEAD = "id, queue, type, attempt_count, created_at, created_by, tags, worker_id, failed_at, failure_reason"


def dlq_row_sql(tail: str) -> str:
    """A DLQ list row: ``tail`` is the vendor's last 400 characters of the details (a traceback ends in its
    exception, the line shown for rows without a class)."""
    return f"{_DLQ_HEAD}, {tail} AS error_head, error_class, error_message"


DLQ_ROW = dlq_row_sql("right(error_details, 400)")
DLQ_WINDOWED_ROW = f"{_DLQ_HEAD}, error_head, error_class, error_message"
# Sort key → ordered expression per pillar (spec 04 §5); anything unlisted orders by the pillar's date.
_COMMON_SORT = {"id": "id", "queue": "queue", "type": "type", "created": "created_at",
                "worker": "coalesce(worker_id, '')", "attempts": "attempt_count"}
ARCHIVE_SORT = {**_COMMON_SORT, "duration": "coalesce(duration_ms, -1.0)", "date": "finished_at"}
DLQ_SORT = {**_COMMON_SORT, "reason": "failure_reason", "date": "failed_at"}
_DATE_SORTS = {"created_at", "finished_at", "failed_at"}
ATTEMPT_FIELDS = ("job_id", "attempt", "worker_id", "error_class", "error_message", "traceback", "failed_at",
                  "started_at")
ATTEMPTS = "chokaq_job_attempts"
# A failed execution as an item of record_attempts' batch (``items_table`` kinds), ``n`` its place.
ATTEMPT_ITEMS = {"n": "int", "job_id": "name", "attempt": "int", "error_class": "name", "error_message": "text",
                 "traceback": "text", "started_at": "ts"}
RATE_LIMIT_FIELDS = ("name", "declared_count", "declared_window", "declared_burst", "override_count", "override_window",
                     "override_burst", "is_lifted", "per_key", "max_keys", "updated_by", "updated_at")
RATE_BUCKET_FIELDS = ("limit_name", "rate_key", "tokens", "refilled_at", "window_started_at", "window_used")


class StaleBuckets(Exception):
    """A lease planned on buckets that another lease has written since (or on a job no longer its worker's)."""


def _rate(count: Any, window: Any, burst: Any) -> Rate | None:
    return None if count is None or window is None else Rate(int(count), float(window), int(burst or 1))


def rate_limit_state(r: Sequence[Any]) -> RateLimitState:
    return RateLimitState(name=r[0], declared=_rate(r[1], r[2], r[3]), override=_rate(r[4], r[5], r[6]),
                          lifted=bool(r[7]), per_key=bool(r[8]), max_keys=int(r[9]), updated_by=r[10],
                          updated_at=as_utc(r[11]) if r[11] is not None else None)


def rate_bucket(r: Sequence[Any]) -> RateBucket:
    return RateBucket(limit_name=r[0], rate_key=r[1], tokens=float(r[2]), refilled_at=as_utc(r[3]),
                      window_started_at=as_utc(r[4]), window_used=int(r[5]))


# ---------------------------------------------------------------- history roll-ups and schedules

HISTORY_BIN_COLUMNS = tuple(f"b{i:02d}" for i in range(DURATION_BINS))
HISTORY_KEY = ("granularity", "bucket_start", "queue", "type", "outcome")
HISTORY_COUNTS = ("completed_count", "duration_count", "total_duration_ms", *HISTORY_BIN_COLUMNS)  # added up
HISTORY_COLUMNS = (*HISTORY_KEY, *HISTORY_COUNTS, "max_duration_ms")


def _bin_counts(column: str) -> str:
    """One count per histogram bin of the durations in ``column`` (NULL durations count nowhere)."""
    edges = [repr(int(e)) if float(e).is_integer() else repr(float(e)) for e in DURATION_BIN_EDGES_MS]
    tests = [f"{column} >= {low} AND {column} < {high}" for low, high in zip(["0", *edges], edges, strict=False)]
    tests.append(f"{column} >= {edges[-1]}")
    return ", ".join(f"sum(CASE WHEN {test} THEN 1 ELSE 0 END)" for test in tests)


def history_rows(rows: str, minute: str, hour: str) -> str:
    """The history bucket rows (``HISTORY_COLUMNS`` order) of ``rows`` (a derived table of the moved rows' queue,
    type, outcome, duration_ms): per (granularity, bucket, queue, type, outcome), in the minute bucket starting
    at ``minute`` and the hour bucket starting at ``hour`` (SQL expressions)."""
    return (
        f"SELECT g.granularity, g.bucket_start, m.queue, m.type, m.outcome, count(*), count(m.duration_ms),"
        f" coalesce(sum(m.duration_ms), 0), {_bin_counts('m.duration_ms')}, max(m.duration_ms)"
        f" FROM (SELECT {HISTORY_GRANULARITIES['minute']} AS granularity, {minute} AS bucket_start"
        f" UNION ALL SELECT {HISTORY_GRANULARITIES['hour']}, {hour}) AS g CROSS JOIN {rows} AS m"
        " GROUP BY g.granularity, g.bucket_start, m.queue, m.type, m.outcome"
    )


# Counts added, the longest duration kept (a NULL one, no timed row, changes nothing).
HISTORY_UPDATE = {**{c: f"{{old}}.{c} + {{new}}.{c}" for c in HISTORY_COUNTS},
                  "max_duration_ms": "CASE WHEN {new}.max_duration_ms IS NULL OR {old}.max_duration_ms >="
                                     " {new}.max_duration_ms THEN {old}.max_duration_ms ELSE {new}.max_duration_ms END"}


def _history_sums() -> str:
    outcome = ", ".join(f"sum(CASE WHEN outcome = {o} THEN completed_count ELSE 0 END)" for o in (0, 1))
    return f"{outcome}, max(max_duration_ms), {', '.join(f'sum({c})' for c in HISTORY_BIN_COLUMNS)}"


# params: granularity, param_ts(since)
HISTORY_POINTS_SQL = (f"SELECT bucket_start, {_history_sums()} FROM {HISTORY}"
                      " WHERE granularity = %s AND bucket_start >= {ts} GROUP BY bucket_start ORDER BY bucket_start")
# params: granularity, param_ts(since), limit
HISTORY_TYPES_SQL = (f"SELECT type, {_history_sums()}, sum(duration_count), sum(total_duration_ms) FROM {HISTORY}"
                     " WHERE granularity = %s AND bucket_start >= {ts} GROUP BY type"
                     " ORDER BY sum(completed_count) DESC, type{limit}")
SCHEDULE_FIELDS = ("name", "last_tick_at", "enabled", "last_job_id", "last_run_at")
SCHEDULE_STATES_SQL = f"SELECT {', '.join(SCHEDULE_FIELDS)} FROM {SCHEDULES} ORDER BY name"


def schedule_state(r: Sequence[Any]) -> ScheduleState:
    return ScheduleState(str(r[0]), as_utc(r[1]), None if r[2] is None else bool(r[2]), r[3], as_utc(r[4]))


def locate_statement(tail: str) -> str:
    """(id, code) of each id in the three pillars (see ``located``); ``tail`` matches ``id`` against the ids."""
    return (f"SELECT id, status FROM {HOT} WHERE id {tail}"
            f" UNION ALL SELECT id, {int(JobStatus.SUCCEEDED)} FROM {ARCHIVE} WHERE id {tail}"
            f" UNION ALL SELECT id, -1 - failure_reason FROM {DLQ} WHERE id {tail}")


@dataclass(frozen=True)
class Move:
    """Where a batch of rows goes: the pillar it lands in (None: it stays where it is) with its columns and stamp,
    the StatsSummary counter it bumps and its MetricBuckets outcome (None: not counted there), the pillar it
    leaves (Hot but for a resurrection) and what the counters read of a landed row (queue, failure_reason,
    duration_ms where it is bucketed)."""

    table: str | None
    fields: tuple[str, ...]
    stamp: str
    counter: str
    outcome: int | None
    origin: str = HOT
    counted: str = "queue"

    @property
    def carried(self) -> tuple[str, ...]:
        """The columns a moved row carries into its pillar (all but the stamp)."""
        return tuple(c for c in self.fields if c != self.stamp)


def carried_values(columns: Sequence[str], row: str, overrides: Mapping[str, str]) -> dict[str, str]:
    """The values of ``columns`` a moved row takes: ``row``'s own (its revision one up, no exception class or
    message: a Hot row has none) unless overridden (an override names the row ``{row}``)."""
    overrides = {"revision": f"{row}.revision + 1", "error_class": "NULL", "error_message": "NULL",
                 **{c: v.replace("{row}", row) for c, v in overrides.items()}}
    return {c: overrides.get(c, f"{row}.{c}") for c in columns}


def insert_moved(move: Move, source: str, now: str, values: Mapping[str, str] | None = None) -> str:
    """Copy the moved rows in ``source`` into the move's pillar, stamped ``now``, the columns of ``values`` set to
    those."""
    values = {**(values or {}), move.stamp: now}
    return (f"INSERT INTO {move.table} ({', '.join(move.fields)})\n"
            f"    SELECT {', '.join(values.get(c, c) for c in move.fields)} FROM {source}")


def resurrected(payload: str, tags: str, priority: str, actor: str, row: str = "") -> dict[str, str]:
    """What a DLQ row (``row``: its qualifier) becomes in Hot besides what it keeps (operands: the edits, NULL to
    keep the row's own): Pending, no attempt yet, priority 10 unless given, modified by ``actor``."""
    return {"payload": f"coalesce({payload}, {row}payload)", "tags": f"coalesce({tags}, {row}tags)",
            "priority": f"coalesce({priority}, 10)", "status": "0", "attempt_count": "0", "last_modified_by": actor}


def counters_locked(rows: str) -> str:
    """The counter rows of the queues of ``rows`` (a table with a ``queue`` column), locked in key order: the shared
    rows' lock order (``BaseDialect.begin_completion``) for a transaction that changes several queues' counters.
    ``ORDER BY … FOR UPDATE`` locks each row as the sorted rows come, whatever order the plan reads them in (an
    ``UPDATE … FROM`` or a join takes them in the plan's order). SQL Server locks rows as it reads them, whatever the
    ORDER BY: ``mssql.counters_locked`` takes them one by one instead."""
    return f"SELECT queue FROM {STATS} WHERE queue IN (SELECT queue FROM {rows}) ORDER BY queue FOR UPDATE"


def uncount_sql(counter: str, rows: str, now: str | None = None) -> str:
    """Take the rows a move removed (``rows``: a table of them with their queue) off ``counter`` per queue, floored
    at 0, update only; an Archive purge's ``PURGED`` grows by them instead (``succeeded_total`` never shrinks).
    ``now``: the last activity's new stamp (None: left as it is)."""
    value = f"{PURGED} + c.n" if counter == PURGED else f"CASE WHEN {counter} > c.n THEN {counter} - c.n ELSE 0 END"
    touched = "" if now is None else f", last_activity_at = {now}"
    return (f"UPDATE {STATS} SET {counter} = {value}{touched} FROM (SELECT queue, count(*) AS n FROM {rows} AS r"
            f" GROUP BY queue) AS c WHERE c.queue = {STATS}.queue")


BUCKET_KEY = ("bucket_start", "queue", "outcome", "failure_reason")
BUCKET_COLUMNS = (*BUCKET_KEY, "completed_count", "duration_count", "total_duration_ms", "max_duration_ms",
                  "last_updated_at")
# The MetricBuckets upsert (spec 01 §4.13) on a bucket that is there: counts added, the longest duration kept.
BUCKET_UPDATE = {
    **{c: f"{{old}}.{c} + {{new}}.{c}" for c in ("completed_count", "duration_count", "total_duration_ms")},
    "max_duration_ms": "CASE WHEN {new}.max_duration_ms IS NULL THEN {old}.max_duration_ms"
                       " WHEN {old}.max_duration_ms IS NULL OR {new}.max_duration_ms > {old}.max_duration_ms"
                       " THEN {new}.max_duration_ms ELSE {old}.max_duration_ms END",
    "last_updated_at": None}


TO_ARCHIVE = Move(ARCHIVE, ARCHIVE_FIELDS, "finished_at", "succeeded_total", 0,
                  counted="queue, -1 AS failure_reason, duration_ms")
TO_DLQ = Move(DLQ, DLQ_FIELDS, "failed_at", "failed_total", 1,
              counted="queue, failure_reason, CAST(NULL AS float) AS duration_ms")
RETRY = Move(None, ("id", "queue"), "last_updated_at", "retried_total", None)
# DLQ → Hot: a Pending row again (its counter goes down; its revision one up, ``carried_values``).
TO_HOT = Move(HOT, ("id", "queue", "type", "payload", "tags", "priority", "status", "attempt_count", "created_at",
                    "last_updated_at", "created_by", "last_modified_by", "revision", "rate_key"), "last_updated_at",
              "failed_total", None, origin=DLQ)
# The purges of DLQ and Archive rows (spec 01 §4.10): moves that land nowhere, their counter lowered (an Archive
# purge's ``PURGED`` raised); statement → (move, the rows it may delete, their order), each one batch of the first
# rows ("{ids}": ``TOKENS["ids"]``, "{ts}": ``TS``).
PURGE_DLQ = Move(None, ("id", "queue"), "", "failed_total", None, origin=DLQ)
PURGE_ARCHIVE = Move(None, ("id", "queue"), "", PURGED, None, origin=ARCHIVE)
PURGES = {"PURGE_DLQ_IDS_SQL": (PURGE_DLQ, "id {ids}", "failed_at, id"),
          "PURGE_ARCHIVE_IDS_SQL": (PURGE_ARCHIVE, "id {ids}", "finished_at, id"),
          "PURGE_DLQ_OLDER_SQL": (PURGE_DLQ, "created_at <= {ts}", "created_at, id"),
          "PURGE_ARCHIVE_SQL": (PURGE_ARCHIVE, "finished_at < {ts}", "finished_at, id")}
# The batches of archive_succeeded and move_to_dlq (``items_table`` kinds, in ``items_params`` order): each item's own
# values of the moved row.
ARCHIVED_ITEMS = {"id": "name", "duration_ms": "float", "result": "text"}
FAILED_ITEMS = {"id": "name", "failure_reason": "int", "error_details": "text", "error_class": "class",
                "error_message": "message"}
ENQUEUE_PASSES = 3  # an insert, then re-inserts of jobs whose key holder left or whose insert lost a race


def pending_queues(hint: str = "") -> str:
    """``RECURSIVE pq(queue)``: every queue with Pending rows, due or not, by a loose scan of ``hot_queue_stats``
    (queue, status): one index probe per queue, ending on a NULL row (the claim's own indexes are partial, each on
    half of the Pending rows); ``hint`` names the index where the planner must be told."""
    probe = f"SELECT h.queue FROM {HOT} h{hint} WHERE h.status = 0{{}} ORDER BY h.queue LIMIT 1"
    return (f"RECURSIVE pq(queue) AS (\n    SELECT ({probe.format('')})\n    UNION ALL\n"
            f"    SELECT ({probe.format(' AND h.queue > pq.queue')})\n    FROM pq WHERE pq.queue IS NOT NULL)")


def bulkhead(window: str, capped: str, limit: str, top: bool = False) -> str:
    """The claim's ranking (spec 01 §4.2) after its ``window`` of due Pending rows (id, queue, priority, sort_at):
    ``active`` counts the running rows of the ``capped`` queues, ``ranked`` numbers each queue's rows in claim
    order, ``picked`` keeps the first ``limit`` rows within every queue's ``max_workers`` (``top``: as
    ``TOP (limit)``, SQL Server's form, rather than ``LIMIT``)."""
    return (f"active AS (SELECT queue, count(*) AS n FROM {HOT} WHERE status IN (1, 2) AND queue IN ({capped})"
            " GROUP BY queue),\n"
            "ranked AS (SELECT w.id, w.priority, w.sort_at, q.max_workers, coalesce(a.n, 0) AS cur,\n"
            "    row_number() OVER (PARTITION BY w.queue ORDER BY w.priority DESC, w.sort_at, w.id) AS rnk\n"
            f"    FROM {window} w LEFT JOIN {QUEUES} q ON q.name = w.queue LEFT JOIN active a ON a.queue = w.queue),\n"
            f"picked AS (SELECT {f'TOP ({limit}) ' if top else ''}id FROM ranked"
            " WHERE max_workers IS NULL OR cur + rnk <= max_workers\n"
            f"    ORDER BY priority DESC, sort_at, id{'' if top else f' LIMIT {limit}'})")


# Statements the vendors share, over their TOKENS (a vendor module's own statement of the same name wins):
# "clock" opens a statement that stamps rows with "now"; "stamp" is now where the driver must count the changed
# rows; "ids" matches ``id`` against ids_param; "by_id" prefixes a status test of rows named by id; "text"/"int"
# type a parameter ("name": a short text); "ago" is ago_params' moment; "trimmed" is a DLQ row's details trimmed
# of blanks/CR/LF (``TRIMMED``); "substr" is the substring function; "dirty" hints a read that may be dirty;
# "lazy" ends the WHERE of a statement whose own commit need not wait for the disk (the lease:
# bench/README, "Asynchronous commit of the claim and the lease").
# The "trimmed" of the vendors whose trim takes the characters to trim and whose || concatenates, over their
# trim-these-characters and character-code functions.
TRIMMED = "{trim}(substr(coalesce(error_details, ''), 1, 4000), ' ' || {chr}(9) || {chr}(10) || {chr}(13))"


# Retention: the oldest rows of a table, one batch (``aged_batch``: the table, its key, its date, a leading test).
AGED_BATCHES = {"PURGE_WORKERS_SQL": (WORKERS, "worker_id", "last_heartbeat_at", ""),
                "PURGE_METRIC_BUCKETS_SQL": (BUCKETS, ", ".join(BUCKET_KEY), "bucket_start", ""),
                "PURGE_HISTORY_SQL": (HISTORY, ", ".join(HISTORY_KEY), "bucket_start", "granularity = %s AND "),
                "PURGE_ATTEMPTS_SQL": (ATTEMPTS, "id", "failed_at", "")}
SHARED_STATEMENTS = {
    # "rowlock" hints the UPDATE's table; "output" / "returning": the changed rows' ids, before WHERE / at the end
    # (``returning``), "lease_output" / "lease_returning" their ids and attempt counts.
    "MARK_PROCESSING_BATCH_SQL": "{clock}UPDATE chokaq_jobs_hot{rowlock} SET status = 2, attempt_count = attempt_count"
                                 " + 1, started_at = {now}, heartbeat_at = {now}, last_updated_at = {now}{lease_output}"
                                 " WHERE id {ids} AND worker_id = %s AND {by_id}status = 1{lazy}{lease_returning}",
    "KEEP_ALIVE_SQL": "{clock}UPDATE chokaq_jobs_hot{rowlock} SET heartbeat_at = {now}, last_updated_at = {now}"
                      "{output} WHERE id {ids} AND {by_id}status = 2 AND worker_id = %s{returning}",
    "REQUEST_CANCEL_SQL": "UPDATE chokaq_jobs_hot{rowlock} SET cancel_requested_by = {text}{output}"
                          " WHERE id {ids} AND {by_id}status = 2{returning}",
    "UPDATE_HOT_SQL": "{clock}UPDATE chokaq_jobs_hot{rowlock} SET payload = coalesce({text}, payload),"
                      " tags = coalesce({text}, tags), priority = coalesce({int}, priority), last_modified_by = {text},"
                      f" last_updated_at = {{now}}, {REVISION_BUMP}{{output}} WHERE id = %s AND status = 0"
                      f" AND {revision_guard('{int}')}{{returning}}",
    "RELEASE_SQL": "{clock}UPDATE chokaq_jobs_hot{rowlock} SET status = 0, worker_id = NULL, last_updated_at = {now}"
                   "{output} WHERE id {ids} AND {by_id}status = 1 AND worker_id = %s{returning}",
    # "differs": new_payload is not payload (null-safe); previous_payload keeps the text an edit replaces.
    "UPDATE_DLQ_SQL": "WITH edit(new_payload, new_tags, actor) AS (SELECT {text}, {text}, {text})"
                      " UPDATE chokaq_jobs_dlq{rowlock} SET previous_payload = CASE WHEN new_payload IS NOT NULL AND {differs}"
                      " THEN payload ELSE previous_payload END, payload = coalesce(new_payload, payload),"
                      f" tags = coalesce(new_tags, tags), last_modified_by = actor, {REVISION_BUMP}{{output}}"
                      f" FROM edit WHERE id = %s AND {revision_guard('{int}')}{{returning}}",
    # "count": the driver counts the rows the statement changes; "sweep" hints a table whose locked rows are skipped.
    "RECOVER_ABANDONED_SQL": "{count}UPDATE chokaq_jobs_hot{sweep} SET status = 0, worker_id = NULL,"
                             " last_updated_at = {stamp} WHERE status = 1 AND last_updated_at < {ago}",
    # Spec 01 §5: the newest rows grouped by reason, exception class and message; rows without a class (no
    # exception, or stored before the column) by their details trimmed of blanks/CR/LF, as stored (searchable).
    # Derived tables rather than CTEs, so ``deck_snapshot`` can nest it on SQL Server too.
    "TOP_ERRORS_SQL": "SELECT g.failure_reason, g.prefix, count(*) AS n, max(g.failed_at) AS latest, g.error_class,"
                      " g.error_message\nFROM (SELECT r.failure_reason, r.failed_at, r.error_class, r.error_message,"
                      " CASE WHEN r.e IS NULL THEN '' WHEN r.e = '' THEN {name} ELSE {substr}(r.e, 1, 160) END"
                      " AS prefix\n      FROM (SELECT failure_reason, failed_at, error_class, error_message,"
                      " CASE WHEN error_class IS NULL THEN {trimmed} END AS e\n"
                      "            FROM chokaq_jobs_dlq{dirty} ORDER BY failed_at DESC{limit}) AS r) AS g\n"
                      "GROUP BY g.failure_reason, g.error_class, g.error_message, g.prefix"
                      " ORDER BY n DESC, latest DESC{limit}",
}


# The dialect functions (spec 01 §1.4's names), by concern: what storage calls; the other public methods of
# ``BaseDialect`` are the hooks and builders the vendors share.
DIALECT_FUNCTIONS: tuple[str, ...] = (
    "enqueue", "fetch_batch", "fetch_alone", "mark_processing", "mark_processing_batch", "keep_alive", "cancel_requests",
    "begin_completion", "archive_succeeded", "move_to_dlq", "reschedule_for_retry", "release_jobs",
    "resurrect", "resurrect_batch", "cancel_batch", "request_cancel", "update_hot_data", "update_dlq_data",
    "purge_dlq_ids", "purge_dlq_older_than", "purge_archive", "recover_abandoned", "archive_zombies",
    "set_queue_paused", "set_queue_zombie_timeout", "set_queue_max_workers", "set_queue_active",
    "rate_limits", "rate_buckets", "pending_by_key", "declare_rate_limits", "set_rate_limit", "lock_rate_buckets",
    "read_rate_buckets", "lease_spending", "save_rate_buckets",
    "upsert_worker", "stop_worker", "list_workers", "purge_workers", "purge_metric_buckets", "session_pid",
    "tidy_hot_table",
    "claim_schedule_tick", "schedule_ticks", "schedule_states", "set_schedule_enabled", "record_schedule_run",
    "record_history", "purge_history",
    "change_marker", "queue_states", "get_hot", "get_archived", "get_dead",
    "locate_jobs",
    "count_matching", "matching_ids", "purge_dlq_by_filter", "resurrect_dlq_by_filter",
    "purge_archive_ids", "count_archive_older_than", "count_dlq_older_than",
    "record_attempts", "job_attempts", "purge_attempts",
)
