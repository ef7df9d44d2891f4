"""The Deck's read model: the rows, filters, sorts and snapshot that only the Deck's reads build (``service`` and
the dialects' read side, ``sql.reads``).

Apart from ``domain`` because a worker never reads them: a frozen, slotted dataclass costs ~15–30 KiB of a
process's memory (its generated methods and the class ``slots=True`` rebuilds), and a worker process imports
``domain`` but not this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from chokaq_core.domain import (
    DURATION_BINS,
    FailureReason,
    JobStatus,
    QueueState,
    WorkerInfo,
    error_summary,
    percentile,
)


@dataclass(frozen=True, slots=True)
class Totals:
    """Hot counts by status and the retained counters (spec 01 §4.13), of one queue or of them all."""

    pending: int
    fetched: int
    processing: int
    succeeded_total: int
    failed_total: int
    retried_total: int
    last_activity_at: datetime | None = None
    purged_total: int = 0  # Archive rows deleted by purges (succeeded_total never shrinks)

    @property
    def archived(self) -> int:
        """Archive rows still retained: every success counted minus those purged since."""
        return max(0, self.succeeded_total - self.purged_total)


@dataclass(frozen=True, slots=True)
class QueueStats(Totals):
    """One Queues row's totals."""

    queue: str = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class SummaryStats(Totals):
    """O(1) counters plus Hot counts by status; Pending is split into ``ready`` (due now), ``scheduled`` (a later
    time, no failure), ``retrying`` (a later time after a failed execution) and ``held`` (deferred by an open
    circuit), which add up to ``pending``."""

    ready: int = 0
    scheduled: int = 0
    retrying: int = 0
    held: int = 0

    @property
    def total(self) -> int:
        """Hot rows plus retained Archive and DLQ rows, from O(1) counters."""
        return self.pending + self.fetched + self.processing + self.archived + self.failed_total


# ---------------------------------------------------------------- Deck reads: rows, filters, sorts, snapshot

SORT_KEYS = ("date", "id", "queue", "type", "created", "worker", "attempts", "duration", "reason")
"""Whitelisted history sort keys (spec 04 §5); the dialects map each to a column per pillar."""

HISTORY_SORTS = {"archive": tuple(k for k in SORT_KEYS if k != "reason"),
                 "dlq": tuple(k for k in SORT_KEYS if k != "duration")}
"""Sort keys each pillar has a column for: an Archive row has no failure reason, a DLQ row no duration."""

INDEXED_SORTS = {"archive": frozenset({"date", "id"}), "dlq": frozenset({"date", "id", "created"})}
"""Sort keys an index serves per pillar; any other sort ranks only the newest ``HistorySort.window`` matches."""


@dataclass(frozen=True, slots=True)
class JobRow:
    """One line of a Deck table in any pillar: never the payload, at most 400 chars of error."""

    id: str
    queue: str
    type: str
    status: JobStatus  # Hot status, SUCCEEDED (Archive), FAILED / CANCELLED / ZOMBIE (DLQ)
    attempt_count: int
    created_at: datetime
    priority: int | None = None  # Hot only
    created_by: str | None = None
    tags: str | None = None
    worker_id: str | None = None
    scheduled_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None  # Archive: finished; DLQ: failed
    duration_ms: float | None = None
    failure_reason: FailureReason | None = None
    error_head: str | None = None  # the last 400 characters of the error details (DLQ; a traceback ends in its error)
    error_class: str | None = None  # DLQ: the failure's exception class path; Hot: the last failed execution's
    error_message: str | None = None
    error_at: datetime | None = None  # Hot: when the last execution failed
    held_by: str | None = None  # Hot: the job type whose open circuit deferred the job

    @property
    def error(self) -> str | None:
        """``ClassName: message`` first; rows without a class show the details' last line."""
        return error_summary(self.error_class, self.error_message, self.error_head)

    def sort_value(self, key: str) -> Any:
        """The value the dialects order by for ``key`` (NULLs coalesced as in their SQL)."""
        match key:
            case "id":
                return self.id
            case "queue":
                return self.queue
            case "type":
                return self.type
            case "created":
                return self.created_at
            case "worker":
                return self.worker_id or ""
            case "attempts":
                return self.attempt_count
            case "duration":
                return -1.0 if self.duration_ms is None else float(self.duration_ms)
            case "reason":
                return int(self.failure_reason) if self.failure_reason is not None else -1
        return self.finished_at


@dataclass(frozen=True, slots=True)
class HistorySort:
    """``key`` is one of SORT_KEYS. For a key outside ``INDEXED_SORTS`` of the pillar, ``window`` (when set)
    bounds the work: only the newest ``window`` matching rows (by the pillar's date) are ranked, so no page
    sorts the whole history. ``search_window`` likewise bounds a text search to the newest rows of the pillar."""

    key: str = "date"
    descending: bool = True
    window: int | None = None
    search_window: int | None = None  # when set, a text search reads only the pillar's newest this many rows


@dataclass(frozen=True, slots=True)
class MetricPoint:
    """One second of MetricBuckets summed over queues."""

    at: datetime
    succeeded: int
    failed: int


@dataclass(frozen=True, slots=True)
class HistoryPoint:
    """One minute or hour bucket summed over queues and types: outcomes and the successes' histogram."""

    at: datetime
    succeeded: int
    failed: int
    bins: tuple[int, ...] = (0,) * DURATION_BINS
    max_ms: float | None = None


@dataclass(frozen=True, slots=True)
class TypeHistory:
    """One job type over a history window: outcomes and its successes' duration histogram."""

    type: str
    succeeded: int
    failed: int
    duration_count: int
    total_duration_ms: float
    max_ms: float | None
    bins: tuple[int, ...] = (0,) * DURATION_BINS

    def p(self, fraction: float) -> float | None:
        return percentile(self.bins, fraction, self.max_ms)


@dataclass(frozen=True, slots=True)
class HistoryWindow:
    """What ``history_buckets`` reads for one granularity since a start: the buckets, oldest first, and the
    busiest types."""

    points: list[HistoryPoint]
    types: list[TypeHistory]


@dataclass(frozen=True, slots=True)
class QueueLag:
    """Spec 01 §5 queue health: eligible (due) Pending rows and their waiting time, in seconds since each became
    due (its scheduled time, else its creation)."""

    queue: str
    pending: int
    avg_lag_seconds: float
    max_lag_seconds: float


@dataclass(frozen=True, slots=True)
class ErrorGroup:
    """A top DLQ error type (spec 01 §5): rows of one reason, exception class and message. Rows without a class
    (no exception, or stored before the class column) group by the start of their details, ``prefix``."""

    reason: FailureReason
    prefix: str
    count: int
    latest_at: datetime
    error_class: str | None = None
    error_message: str | None = None

    @property
    def label(self) -> str:
        """``ClassName: message``, else the details' prefix."""
        return error_summary(self.error_class, self.error_message) or self.prefix


@dataclass(frozen=True, slots=True)
class BulkPreview:
    """Dry run of a DLQ bulk operation (spec 01 §4.10)."""

    matched: int
    will_affect: int
    truncated: bool
    sample_ids: list[str]


@dataclass(frozen=True, slots=True)
class SnapshotRequest:
    """What one Deck read asks for: ``deck_snapshot`` answers all of it in ONE statement (the push budget: a web
    process with any number of open tabs stays within a couple of statements per second)."""

    active_limit: int  # the newest Hot rows (the Active table)
    locate_ids: Sequence[str] = ()  # ids last seen in that table: where each is now
    throughput_since: datetime | None = None  # per-second MetricBuckets from here on; None = not asked
    queues: bool = False  # queue states, per-queue counters and lag
    workers: bool = False  # the worker registry
    errors_limit: int = 0  # top DLQ error groups; 0 = not asked


@dataclass(frozen=True, slots=True)
class DeckSnapshot:
    """One consistent read of everything the live Deck shows; parts not asked for are None."""

    summary: SummaryStats
    active: list[JobRow]
    located: dict[str, JobStatus]
    throughput: list[MetricPoint] | None = None
    queue_states: list[QueueState] | None = None
    queue_stats: list[QueueStats] | None = None
    queue_lags: list[QueueLag] | None = None
    workers: list[WorkerInfo] | None = None
    errors: list[ErrorGroup] | None = None
