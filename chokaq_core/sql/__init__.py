"""The Dialect protocol: every storage transition, one function per name.

``chokaq_core/sql/<vendor>.py`` are the only modules with SQL text; each
holds a dialect class (a ``sql.base.BaseDialect``) implementing every method
below and exports its instance as ``DIALECT``; ``storage`` is their only caller. Rules shared by every vendor:

* ``cursor`` is a DB-API cursor that takes ``%s`` placeholders (the inner
  cursor of a Django connection). The caller owns the transaction: each
  function runs inside ``transaction.atomic()`` opened by ``storage`` and never
  commits or rolls back itself.
* Timestamps come from the database clock on PostgreSQL and SQL Server; the
  SQLite module takes ``datetime.now(UTC)`` in Python and writes Django's text
  format (spec 01 §1.2).
* Every move between pillars deletes with its guard, inserts exactly the
  deleted rows and bumps ``chokaq_stats_summary`` / ``chokaq_metric_buckets``
  in the same transaction (spec 01 §3). Mutations report what they actually
  changed, never the requested count.
* Reads and the single-row commands are one statement on every vendor;
  the capabilities below say what else is, so storage may run it without
  ``BEGIN``/``COMMIT`` round trips when no transaction is open.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from django.core.exceptions import ImproperlyConfigured

from chokaq_core.domain import (
    ArchivedJob,
    Attempt,
    BulkPreview,
    ClaimHold,
    DeadJob,
    DeckSnapshot,
    ErrorGroup,
    FailedAttempt,
    Failure,
    HistorySort,
    HistoryWindow,
    HotJob,
    JobFilter,
    JobRow,
    JobStatus,
    MetricPoint,
    NewJob,
    QueueLag,
    QueueState,
    QueueStats,
    Rate,
    RateBucket,
    RateLimit,
    RateLimitState,
    Retry,
    ScheduleState,
    SnapshotRequest,
    Success,
    SummaryStats,
    WorkerInfo,
)

Cursor = Any
Moved = list[tuple[str, str]]  # (job id, queue) of each row a transition changed


class Dialect(Protocol):
    # ------------------------------------------------------------ capabilities
    MOVES_IN_ONE_STATEMENT: bool  # each move between pillars (resurrect, purges, zombies) is one statement
    MOVES_RECORD_HISTORY: bool  # a move to the Archive/DLQ counts its rows in the history buckets itself (no
    # record_history after it)
    ENQUEUE_IN_ONE_STATEMENT: bool  # an enqueue of jobs without idempotency keys is one statement
    PREPARES: bool  # storage prepares the hot path's fixed statement texts (PostgreSQL's server-side binding)
    NOTIFY_CHANNEL: str | None  # the channel enqueue NOTIFYs, for an idle worker to LISTEN on; None: no push channel

    # ------------------------------------------------------------ enqueue / claim
    def enqueue(self, cursor: Cursor, jobs: Sequence[NewJob]) -> list[str]:
        """Insert Pending rows (one multi-row statement per chunk); ensure the Queues and
        StatsSummary rows of their queues. Returns, per input job and in order, the id
        actually stored: the existing Hot row's id when its idempotency key is taken.
        PostgreSQL also ``NOTIFY chokaq_jobs`` in the same transaction."""

    def fetch_batch(self, cursor: Cursor, worker_id: str, limit: int, queues: Sequence[str] | None,
                    hold: ClaimHold | None = None) -> list[HotJob]:
        """Claim up to ``limit`` due Pending rows (Pending → Fetched, ``worker_id`` set) of
        ``queues`` (None = every queue), skipping paused/hidden queues, honouring each
        queue's ``max_workers`` bulkhead and skipping what ``hold`` names (rate limits without
        a token). Ordered by priority desc, due time asc."""

    def mark_processing(self, cursor: Cursor, job_id: str, worker_id: str) -> int | None:
        """Lease gate: Fetched → Processing if still owned; returns the new attempt count or None."""

    def mark_processing_batch(self, cursor: Cursor, job_ids: Sequence[str], worker_id: str) -> dict[str, int]:
        """The lease gate for several buffered rows in one statement: {job id: new attempt count} of
        the rows that were still Fetched by this worker (the others must not run)."""

    def keep_alive(self, cursor: Cursor, job_ids: Sequence[str], worker_id: str) -> list[str]:
        """One UPDATE stamping the heartbeat of every listed Processing row this worker owns;
        returns the ids still owned."""

    def cancel_requests(self, cursor: Cursor, worker_id: str) -> list[tuple[str, str]]:
        """(job id, actor) of this worker's Processing rows an operator asked to cancel."""

    # ------------------------------------------------------------ completion (batched)
    def archive_succeeded(self, cursor: Cursor, worker_id: str | None, items: Sequence[Success]) -> Moved:
        """Hot → Archive for every item this worker owns (None: no owner guard)."""

    def move_to_dlq(self, cursor: Cursor, worker_id: str | None, items: Sequence[Failure]) -> Moved:
        """Hot → DLQ with each item's reason and details, owner-guarded."""

    def reschedule_for_retry(self, cursor: Cursor, worker_id: str | None, items: Sequence[Retry]) -> Moved:
        """Back to Pending at now + delay, attempt count as given; RetriedTotal += n."""

    def release_jobs(self, cursor: Cursor, job_ids: Sequence[str], worker_id: str) -> int:
        """Fetched → Pending for unstarted rows this worker owns (pause, shutdown)."""

    # ------------------------------------------------------------ operator commands
    def resurrect(
        self, cursor: Cursor, job_id: str, payload: str | None, tags: str | None, priority: int | None, actor: str | None,
        revision: int | None = None,
    ) -> bool:
        """DLQ → Hot Pending with optional edits; attempt count 0; FailedTotal −1. ``revision``: only if the DLQ
        row is still at that edit version (None: whatever it is); the Hot row carries it, one up."""

    def resurrect_batch(self, cursor: Cursor, job_ids: Sequence[str], actor: str | None) -> Moved:
        """DLQ → Hot for up to 1000 ids, priority 10, no edits."""

    def cancel_batch(self, cursor: Cursor, job_ids: Sequence[str], actor: str | None) -> Moved:
        """Pending/Fetched → DLQ Cancelled (Processing rows are left alone)."""

    def request_cancel(self, cursor: Cursor, job_ids: Sequence[str], actor: str) -> list[str]:
        """Flag Processing rows for cooperative cancellation; returns the flagged ids."""

    def update_hot_data(
        self, cursor: Cursor, job_id: str, payload: str | None, tags: str | None, priority: int | None, actor: str | None,
        revision: int | None = None,
    ) -> bool:
        """Edit a Pending Hot row (coalescing NULLs) and bump its revision; False if not Pending, not at
        ``revision`` (None: any) or nothing to change."""

    def update_dlq_data(
        self, cursor: Cursor, job_id: str, payload: str | None, tags: str | None, actor: str | None,
        revision: int | None = None,
    ) -> bool:
        """Edit a DLQ row, keeping the old payload in ``previous_payload``, and bump its revision; False if not
        at ``revision`` (None: any) or nothing to change."""

    def purge_dlq_ids(self, cursor: Cursor, job_ids: Sequence[str], batch_size: int) -> Moved:
        """Delete one batch of the given DLQ ids (oldest failure first); FailedTotal −n."""

    def purge_dlq_older_than(self, cursor: Cursor, cutoff: datetime, batch_size: int) -> int:
        """Delete one batch of DLQ rows created at or before ``cutoff``; FailedTotal −n."""

    def purge_archive(self, cursor: Cursor, cutoff: datetime, batch_size: int) -> int:
        """Delete one batch of Archive rows finished before ``cutoff``; PurgedTotal +n (SucceededTotal never
        shrinks)."""

    # ------------------------------------------------------------ maintenance
    def recover_abandoned(self, cursor: Cursor, fetched_timeout_s: float) -> int:
        """Fetched rows untouched for the timeout → Pending."""

    def archive_zombies(self, cursor: Cursor, global_timeout_s: float) -> Moved:
        """Processing rows whose heartbeat expired (queue timeout else global) → DLQ Zombie."""

    # ------------------------------------------------------------ queue controls
    def set_queue_paused(self, cursor: Cursor, queue: str, paused: bool) -> None: ...

    def set_queue_zombie_timeout(self, cursor: Cursor, queue: str, seconds: int | None) -> None: ...

    def set_queue_max_workers(self, cursor: Cursor, queue: str, max_workers: int | None) -> None: ...

    def set_queue_active(self, cursor: Cursor, queue: str, active: bool) -> bool:
        """Update only; sets ``is_paused = true`` in both directions (spec 01 §4.17)."""

    # ------------------------------------------------------------ rate limits
    def rate_limits(self, cursor: Cursor) -> list[RateLimitState]:
        """Every limit row (declared and overridden), by name."""

    def rate_buckets(self, cursor: Cursor, names: Sequence[str]) -> list[RateBucket]:
        """The token buckets of the limits ``names``."""

    def pending_by_key(self, cursor: Cursor) -> list[tuple[str, str, str | None, int]]:
        """Due Pending rows per (queue, type, rate key)."""

    def declare_rate_limits(self, cursor: Cursor, limits: Sequence[RateLimit]) -> None:
        """The declared columns become ``limits``; other rows lose their declared rate."""

    def set_rate_limit(self, cursor: Cursor, name: str, rate: Rate | None, lifted: bool, actor: str | None) -> None:
        """An operator's override of one limit (created if absent)."""

    def lock_rate_buckets(self, cursor: Cursor, names: Sequence[str]) -> tuple[datetime, list[RateBucket]]:
        """Lock the limits' rows until commit; the database's time and the limits' buckets."""

    def read_rate_buckets(self, cursor: Cursor, names: Sequence[str]) -> tuple[datetime, list[RateBucket]]:
        """The database's time and the limits' buckets, without a lock."""

    def save_rate_buckets(self, cursor: Cursor, changed: Sequence[RateBucket], added: Sequence[RateBucket],
                          dropped: Sequence[tuple[str, str]]) -> None:
        """Write a lease's bucket changes."""

    # ------------------------------------------------------------ worker registry
    def upsert_worker(self, cursor: Cursor, info: WorkerInfo) -> None: ...

    def stop_worker(self, cursor: Cursor, worker_id: str) -> None: ...

    # ------------------------------------------------------------ operations: health, retention, schedule (issue 5)
    def list_workers(self, cursor: Cursor) -> list[WorkerInfo]:
        """Every worker registry row, freshest heartbeat first."""

    def purge_workers(self, cursor: Cursor, cutoff: datetime, batch_size: int) -> int:
        """Delete one batch of worker rows whose last heartbeat is before ``cutoff``; rows deleted."""

    def purge_metric_buckets(self, cursor: Cursor, cutoff: datetime, batch_size: int) -> int:
        """Delete one batch of MetricBuckets rows that started before ``cutoff`` (no counter changes)."""

    def session_pid(self, cursor: Cursor) -> int | None:
        """The id of the server process serving this session (PostgreSQL's ``pg_backend_pid()``), so storage can
        tell a direct connection from one through a pooler; None where the vendor has no such id."""
        ...

    def tidy_hot_table(self, cursor: Cursor, min_dead_rows: int) -> bool:
        """Keep the Hot table's plans and size healthy under queue churn: when its dead row versions exceed
        ``min_dead_rows`` + 20 % of its live rows (autovacuum's formula with a larger base), vacuum and
        analyze it (one caller fleet-wide at a time); True when it did. Runs outside a transaction. Only
        PostgreSQL needs it (a server with autovacuum off or lagging leaves every claim walking dead index
        entries under stale statistics); elsewhere it does nothing and returns False."""

    def claim_schedule_tick(self, cursor: Cursor, name: str, tick: datetime) -> bool:
        """Move recurring job ``name``'s latest tick forward to ``tick``: True only for the one caller
        that moved it (run it in the enqueue's transaction). A name seen for the first time records
        ``tick`` and returns False, so a new schedule starts with its next tick."""

    def schedule_ticks(self, cursor: Cursor) -> dict[str, datetime]:
        """The latest claimed tick of every recurring job, by name."""

    def schedule_states(self, cursor: Cursor) -> list[ScheduleState]:
        """Every ``chokaq_schedules`` row (tick, operator switch, latest job), by name."""

    def set_schedule_enabled(self, cursor: Cursor, name: str, enabled: bool, tick: datetime) -> None:
        """The operator's switch of recurring job ``name``, kept in its row (created at ``tick`` when missing);
        switching on also moves the latest tick up to ``tick`` (its due tick now), so ticks that fell while it
        was off are not run."""

    def record_schedule_run(self, cursor: Cursor, name: str, job_id: str, tick: datetime) -> None:
        """Remember ``job_id`` as recurring job ``name``'s latest job, run now (the row created at ``tick`` when
        missing); run it in the transaction that enqueues the job."""

    # ------------------------------------------------------------ history roll-ups
    def record_history(self, cursor: Cursor, archived_ids: Sequence[str], failed_ids: Sequence[str],
                       at: datetime) -> None:
        """Count the rows a completion just moved to the Archive / the DLQ in the minute and the hour buckets
        of ``at`` (per queue, type and outcome, successes' durations in the histogram bins): run it in the
        transaction of the move. Ids that are not (or no longer) there count nothing."""

    def history_buckets(self, cursor: Cursor, granularity: int, since: datetime, types_limit: int) -> HistoryWindow:
        """The ``granularity``-second buckets from ``since`` summed over queues and types (oldest first), and the
        ``types_limit`` busiest types over them: O(buckets × queues × types) rows, never Archive."""

    def purge_history(self, cursor: Cursor, granularity: int, cutoff: datetime, batch_size: int) -> int:
        """Delete one batch of ``granularity``-second history buckets that started before ``cutoff``."""

    def change_marker(self, cursor: Cursor) -> int | None:
        """A number that changes whenever ANOTHER connection commits (SQLite's ``PRAGMA data_version``): a
        worker without a push channel polls it every few milliseconds to notice new jobs at once. None where
        the vendor has a push channel (PostgreSQL's LISTEN/NOTIFY) or no such marker; no statement then."""

    # ------------------------------------------------------------ reads
    def queue_states(self, cursor: Cursor) -> list[QueueState]: ...

    def summary_stats(self, cursor: Cursor) -> SummaryStats: ...

    def queue_stats(self, cursor: Cursor) -> list[QueueStats]: ...

    def get_hot(self, cursor: Cursor, job_id: str) -> HotJob | None: ...

    def get_archived(self, cursor: Cursor, job_id: str) -> ArchivedJob | None: ...

    def get_dead(self, cursor: Cursor, job_id: str) -> DeadJob | None: ...

    # ------------------------------------------------------------ Deck reads and bulk commands (issue 3)
    def list_active(self, cursor: Cursor, filters: JobFilter, limit: int) -> list[JobRow]:
        """Newest ``limit`` Hot rows (created_at desc, id desc) matching status/queue/type and the search
        (id, type, tags, idempotency key); no payload."""

    def list_archive(
        self, cursor: Cursor, filters: JobFilter, after_key: tuple[Any, str] | None, limit: int, sort: HistorySort
    ) -> list[JobRow]:
        """One keyset page of Archive rows: ordered by the sort column then id (same direction), strictly
        after ``after_key`` = (sort value as ``JobRow.sort_value`` gives it, id). Never OFFSET, never COUNT."""

    def list_dlq(
        self, cursor: Cursor, filters: JobFilter, after_key: tuple[Any, str] | None, limit: int, sort: HistorySort
    ) -> list[JobRow]:
        """One keyset page of DLQ rows, as ``list_archive``."""

    def locate_jobs(self, cursor: Cursor, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """Where each id is now: its Hot status, SUCCEEDED (Archive) or FAILED/CANCELLED/ZOMBIE (DLQ); absent ids
        are left out. Primary-key lookups only."""

    def throughput(self, cursor: Cursor, since: datetime) -> list[MetricPoint]:
        """Per-second succeeded (outcome 0) and failed (outcome 1) counts from MetricBuckets, oldest first."""

    def queue_health(self, cursor: Cursor) -> list[QueueLag]:
        """Per ``Queues`` row: due Pending count, average and max lag in seconds (0 when none)."""

    def top_errors(self, cursor: Cursor, limit: int) -> list[ErrorGroup]:
        """Top (reason, error prefix) groups over the 5000 newest DLQ rows (spec 01 §5)."""

    def preview_dlq_bulk(self, cursor: Cursor, filters: JobFilter, max_jobs: int) -> BulkPreview:
        """Dry run of a filtered DLQ bulk operation: matched count, up to 10 sample ids (newest failure first)."""

    def count_matching(self, cursor: Cursor, pillar: str, filters: JobFilter) -> tuple[int, str | None]:
        """(rows matching, their largest id) of a bulk-by-filter run over ``pillar`` ("hot": the Active view's
        filters, "dlq": the DLQ view's): the run's size and its bound (rows added later lie beyond it)."""
        ...

    def matching_ids(self, cursor: Cursor, pillar: str, filters: JobFilter, after: str | None, upto: str,
                     limit: int) -> list[str]:
        """One keyset batch of a bulk-by-filter run, newest id first: at most ``limit`` ids matching ``filters``
        in ``pillar`` below ``after`` (the previous batch's last id), or, for the first batch, up to ``upto``."""
        ...

    def purge_dlq_by_filter(self, cursor: Cursor, filters: JobFilter, max_jobs: int) -> Moved:
        """Delete the first ``max_jobs`` matches (failed_at desc, id asc; skip locked); FailedTotal −n."""

    def resurrect_dlq_by_filter(self, cursor: Cursor, filters: JobFilter, max_jobs: int, actor: str | None) -> Moved:
        """Move the first ``max_jobs`` matches to Hot exactly as ``resurrect_batch``."""

    def purge_archive_ids(self, cursor: Cursor, job_ids: Sequence[str]) -> Moved:
        """Delete the given Archive rows; PurgedTotal +n."""

    def count_archive_older_than(self, cursor: Cursor, cutoff: datetime, limit: int) -> int:
        """Archive rows ``purge_archive`` would delete (finished_at < cutoff), counted up to ``limit``: a preview,
        not a render-time count."""

    def count_dlq_older_than(self, cursor: Cursor, cutoff: datetime, limit: int) -> int:
        """DLQ rows ``purge_dlq_older_than`` would delete (created_at <= cutoff), counted up to ``limit``."""

    def deck_snapshot(self, cursor: Cursor, request: SnapshotRequest) -> DeckSnapshot:
        """Everything the live Deck shows, in ONE statement: ``summary_stats``, ``list_active`` (no filters,
        ``request.active_limit`` rows), ``locate_jobs(request.locate_ids)`` and, when asked, ``throughput``,
        ``queue_states`` + ``queue_stats`` + ``queue_health``, ``list_workers`` and ``top_errors`` — each part
        exactly as its own function returns it. The parts travel as JSON (``json_rows`` decodes them)."""

    # ------------------------------------------------------------ attempts history
    def record_attempts(self, cursor: Cursor, worker_id: str | None, attempts: Sequence[FailedAttempt]) -> None:
        """Insert one ``chokaq_job_attempts`` row per failed execution, stamped with the database clock (run it
        in the transaction that reschedules or dead-letters those executions)."""

    def job_attempts(self, cursor: Cursor, job_id: str) -> list[Attempt]:
        """Every recorded failed execution of a job, oldest first."""

    def purge_attempts(self, cursor: Cursor, cutoff: datetime, batch_size: int) -> int:
        """Delete one batch of attempts-history rows that failed before ``cutoff``; rows deleted."""


def json_rows(packed: Any, datetime_at: Sequence[int] = ()) -> list[list[Any]]:
    """Rows a ``deck_snapshot`` statement packed as a JSON array of arrays (or, on SQL Server, of objects whose
    keys ``c0``, ``c1``, … give the positions): decoded, with the ISO timestamps at ``datetime_at`` parsed into
    aware UTC datetimes. ``None`` (a part the statement found no rows for) is no rows."""
    if packed is None:
        return []
    rows = json.loads(packed) if isinstance(packed, str | bytes) else packed
    out = []
    for row in rows:
        if isinstance(row, dict):  # SQL Server's FOR JSON PATH, INCLUDE_NULL_VALUES: every key present
            values = [row.get(f"c{i}") for i in range(len(row))]
        else:
            values = list(row)
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


DIALECT_FUNCTIONS: tuple[str, ...] = tuple(
    name for name in Dialect.__dict__ if not name.startswith("_") and callable(Dialect.__dict__[name])
)

_VENDOR_MODULES = {"postgresql": "postgresql", "sqlite": "sqlite", "microsoft": "mssql"}


def dialect_for(connection: Any) -> Dialect:
    """The dialect of a Django connection's vendor (its module's ``DIALECT``); any other vendor is a configuration
    error."""
    vendor = connection.vendor
    try:
        module_name = _VENDOR_MODULES[vendor]
    except KeyError:
        raise ImproperlyConfigured(
            f"ChokaQ does not support the {vendor!r} database vendor (supported: postgresql, sqlite, microsoft)"
        ) from None
    dialect: Dialect = importlib.import_module(f"chokaq_core.sql.{module_name}").DIALECT
    return dialect
