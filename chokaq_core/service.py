"""The Deck's only door into the engine: read views and operator commands.

Every command validates its input and raises ``ServiceError`` (a
``ValueError``) with a message fit for an operator; nothing is written when
validation fails. Events of each command travel back to the Deck by the same
road as the worker's (storage → events after commit).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from chokaq_core import events, health, prometheus, schedule, storage
from chokaq_core.api import MAX_PAYLOAD_DEPTH, PRIORITY_RANGE, serialize_payload
from chokaq_core.conf import config
from chokaq_core.domain import (
    DURATION_BINS,
    HISTORY_GRANULARITIES,
    ArchivedJob,
    Attempt,
    DeadJob,
    HotJob,
    JobFilter,
    JobStatus,
    QueueState,
    RateLimitState,
    WorkerInfo,
    check_name,
    parse_rate,
    percentile,
    rate_limit_name,
    split_rate_limit_name,
)
from chokaq_core.policy import next_token_at, refilled, window_use
from chokaq_core.readmodel import (
    HISTORY_SORTS,
    INDEXED_SORTS,
    SORT_KEYS,
    BulkPreview,
    ErrorGroup,
    HistoryPoint,
    HistorySort,
    JobRow,
    MetricPoint,
    QueueLag,
    QueueStats,
    SnapshotRequest,
    SummaryStats,
    TypeHistory,
)

logger = logging.getLogger("chokaq.service")

MAX_BULK_IDS = 1000


class ServiceError(ValueError):
    """An operator command was refused; the message says why."""


class ConflictError(ServiceError):
    """The job is no longer where the command expects it (it moved meanwhile); nothing was changed."""


class NotFoundError(ServiceError):
    """The command names something that does not exist (e.g. an unknown queue); nothing was changed."""


def check_job_id(job_id: str) -> str:
    """A job id as the Deck received it (path segment, form field), trimmed, or ServiceError naming the rule."""
    return _checked("job id", job_id)


def check_queue_name(name: str) -> str:
    """A queue name as the Deck or the CLI received it, trimmed, or ServiceError naming the rule."""
    return _checked("queue", name, "queue name")


def _checked(field_name: str, value: str, label: str | None = None) -> str:
    try:
        return check_name(field_name, (value or "").strip())
    except ValueError as exc:
        text = str(exc)
        raise ServiceError(text.replace(field_name, label, 1) if label else text) from None


class StaleEdit(ConflictError):
    """An edit made against an older state of the job (its revision moved on); nothing was saved.
    ``current`` is the job as it is now, for the editor to show."""

    def __init__(self, message: str, current: dict[str, Any]) -> None:
        super().__init__(message)
        self.current = current


@dataclass(frozen=True)
class JobView:
    """A job wherever it lives: exactly one of the three is set."""

    hot: HotJob | None = None
    archived: ArchivedJob | None = None
    dead: DeadJob | None = None
    attempts: tuple[Attempt, ...] = ()  # the attempts history: every failed execution, oldest first

    @property
    def pillar(self) -> str:
        return "hot" if self.hot else "archive" if self.archived else "dlq"


def summary() -> SummaryStats:
    return storage.summary_stats()


def queue_states() -> list[QueueState]:
    return storage.queue_states()


def find_job(job_id: str) -> JobView | None:
    """Look a job up in Hot, then Archive, then DLQ."""
    if hot := storage.get_hot(job_id):
        view = JobView(hot=hot)
    elif archived := storage.get_archived(job_id):
        view = JobView(archived=archived)
    elif dead := storage.get_dead(job_id):
        view = JobView(dead=dead)
    else:
        return None
    return replace(view, attempts=tuple(storage.job_attempts(job_id)))


MAX_WORKERS_RANGE = (1, 10_000)
ZOMBIE_TIMEOUT_RANGE = (1, 86_400)


def _known_queue(name: str) -> str:
    """A queue the Queues table holds: a Deck setting never creates a queue as a side effect."""
    name = check_queue_name(name)
    if name not in {q.name for q in storage.queue_states()}:
        raise NotFoundError(f"Queue {name!r} does not exist")
    return name


def _optional_int(label: str, value: int | str | None, bounds: tuple[int, int]) -> int | None:
    """Empty/None clears the setting; anything else must be an integer within ``bounds``."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ServiceError(f"{label} must be a whole number, got {value!r}")  # int() would truncate 1.5 to 1
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ServiceError(f"{label} must be a whole number, got {value!r}") from None
    if not bounds[0] <= number <= bounds[1]:
        raise ServiceError(f"{label} must be within {bounds[0]}-{bounds[1]}, got {number}")
    return number


def set_queue_paused(queue: str, paused: bool, *, must_exist: bool = False) -> None:
    """Pause stops new claims at once; buffered jobs of the queue are released; running jobs finish.
    ``must_exist`` (the Deck): NotFoundError for a queue the Queues table does not hold, instead of creating it."""
    storage.set_queue_paused(_known_queue(queue) if must_exist else check_queue_name(queue), paused)


def set_queue_active(queue: str, active: bool) -> bool:
    """Hide (inactive) or show (active) a queue; both directions leave it paused (spec 01 §4.17). False if the
    queue is unknown."""
    return storage.set_queue_active(check_queue_name(queue), active)


def set_queue_max_workers(queue: str, max_workers: int | str | None, *, must_exist: bool = False) -> int | None:
    """Fleet-wide cap on Fetched + Processing rows of the queue (None = unlimited); ``must_exist`` as for
    ``set_queue_paused``."""
    value = _optional_int("max workers", max_workers, MAX_WORKERS_RANGE)
    storage.set_queue_max_workers(_known_queue(queue) if must_exist else check_queue_name(queue), value)
    return value


def queue_change(queue: str, change: str) -> str:
    """An operator's change of a queue as its audit entry tells it, from the Deck or a shell: "Queue mail:
    paused"; ``change`` is one of ``paused_change``, ``active_change``, ``max_workers_change``,
    ``zombie_timeout_change``."""
    return f"Queue {queue}: {change}"


def paused_change(paused: bool) -> str:
    return "paused" if paused else "resumed"


def active_change(active: bool) -> str:
    return "shown (paused)" if active else "hidden (paused)"


def max_workers_change(value: int | None) -> str:
    return f"max workers {value}" if value else "max workers unlimited"


def zombie_timeout_change(value: int | None) -> str:
    return f"zombie timeout {value}s" if value else "zombie timeout cleared (global)"


def set_queue_zombie_timeout(queue: str, seconds: int | str | None, *, must_exist: bool = False) -> int | None:
    """Per-queue zombie timeout override in seconds (None = the global setting); ``must_exist`` as for
    ``set_queue_paused``."""
    value = _optional_int("zombie timeout", seconds, ZOMBIE_TIMEOUT_RANGE)
    storage.set_queue_zombie_timeout(_known_queue(queue) if must_exist else check_queue_name(queue), value)
    return value


# ---------------------------------------------------------------- rate limits


def check_rate_limit_name(name: str) -> str:
    """A limit name (``queue:<name>``, ``type:<key>``) as the Deck or the CLI received it, or ServiceError."""
    try:
        return rate_limit_name(*split_rate_limit_name((name or "").strip()))
    except ValueError as exc:
        raise ServiceError(f"{exc} (a rate limit is named queue:<queue> or type:<type key>)") from None


def rate_limits(now: datetime | None = None) -> list[RateLimitState]:
    """Every limit with its use: claims in the current window (summed over keys), live keys and, while its
    shared bucket is empty, when the next job may start."""
    states = storage.rate_limits()
    buckets = storage.rate_buckets([state.name for state in states])
    now = now or datetime.now(UTC)
    shown = []
    for state in states:
        rate = state.rate
        own = [b for b in buckets if b.limit_name == state.name]
        if rate is None:
            shown.append(state)
            continue
        shared = next((b for b in own if b.rate_key == ""), None)
        tokens = refilled(rate, shared, now)
        shown.append(replace(
            state, used=sum(window_use(rate, b, now) for b in own),
            live_keys=sum(1 for b in own if b.rate_key and refilled(rate, b, now) < rate.capacity),
            held_until=None if state.per_key or tokens >= 1 else next_token_at(rate, tokens, now)))
    return shown


def set_rate_limit(name: str, rate: str | None, *, actor: str | None = None) -> RateLimitState:
    """An operator's rate for limit ``name`` ("100/m"; "0/m" pauses it; None/"" returns to the declared rate);
    workers follow within about a second."""
    name = check_rate_limit_name(name)
    text = (rate or "").strip()
    try:
        parsed = parse_rate(text) if text else None
    except ValueError as exc:
        raise ServiceError(str(exc)) from None
    storage.set_rate_limit(name, parsed, actor=actor)
    return _rate_limit(name, actor, parsed.text if parsed else "the declared rate")


def pause_rate_limit(name: str, *, actor: str | None = None) -> RateLimitState:
    """Hold every job of the limit (its count becomes 0, its window stays)."""
    name = check_rate_limit_name(name)
    window = next((s.rate.window for s in storage.rate_limits() if s.name == name and s.rate), 60.0)
    storage.set_rate_limit(name, parse_rate(f"0/{window:g}s"), actor=actor)
    return _rate_limit(name, actor, "paused")


def lift_rate_limit(name: str, *, actor: str | None = None) -> RateLimitState:
    """No limit at all, whatever is declared, until an operator sets or resets it."""
    name = check_rate_limit_name(name)
    storage.set_rate_limit(name, None, lifted=True, actor=actor)
    return _rate_limit(name, actor, "lifted")


def rate_hold(job: HotJob, now: datetime | None = None) -> str | None:
    """Why a Pending job waits on a rate limit ("held by rate limit type:x until 12:00:01 UTC"), or None."""
    if job.status != JobStatus.PENDING:
        return None
    now = now or datetime.now(UTC)
    limits = [limit for state in storage.rate_limits()
              if (limit := state.limit) is not None and limit.covers(job.queue, job.type)]
    buckets = {(b.limit_name, b.rate_key): b for b in storage.rate_buckets([limit.name for limit in limits])}
    for limit in limits:
        key = limit.bucket_key(job.rate_key)
        tokens = refilled(limit.rate, buckets.get((limit.name, key)), now)
        if tokens < 1:
            until = next_token_at(limit.rate, tokens, now)
            label = f"{limit.name} ({key})" if key else limit.name
            return f"held by rate limit {label} " + (f"until {until:%H:%M:%S} UTC" if until else "(paused)")
    return None


def rate_limit_change(state: RateLimitState, change: str) -> str:
    """An operator's change of a limit as its audit entry tells it: "Rate limit queue:mail: set to 100/m (in
    force: 100/m)"."""
    rate = state.rate
    return f"Rate limit {state.name}: {change} (in force: {rate.text if rate else 'none'})"


def record_command(command: str, *, actor: str, scope: str, message: str) -> None:
    """Hand a command run outside the Deck (a shell) to the audit log, through ``operator_command`` (the engine
    knows no Deck; the Deck audits its own commands itself)."""
    events.operator_command.send(sender=record_command, command=command, actor=actor, scope=scope, message=message)


def _rate_limit(name: str, actor: str | None, change: str) -> RateLimitState:
    """The limit after an operator's change, which is logged (the row keeps who changed it and when)."""
    logger.info("rate limit %s: %s by %s", name, change, actor or "unknown")
    return next(state for state in rate_limits() if state.name == name)


# ---------------------------------------------------------------- Deck reads: panels, live view, keyset history

ACTIVE_LIMIT = 100
MAX_PAGE_SIZE = 1000
BULK_BATCH = 500  # rows per transaction of a bulk-by-filter run ("all matching"): never a long lock on Hot
NO_CAP = 2**31 - 1  # a bulk-by-filter run without a max-jobs bound
THROUGHPUT_WINDOW = 300
TAGS_MAX = 1000
SEARCH_WINDOW = 100_000  # a text search over a larger pillar reads only its newest 100,000 rows
SORT_WINDOW = 50_000  # a sort no index serves ranks the newest 50,000 matches (readmodel.INDEXED_SORTS)
PILLAR_STATUSES = {"archive": (JobStatus.SUCCEEDED,),
                   "dlq": (JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.ZOMBIE)}


@dataclass(frozen=True)
class QueueOverview:
    """A Queues row with its counters and lag, for the Deck's queues panel."""

    state: QueueState
    stats: QueueStats | None
    lag: QueueLag | None

    @property
    def name(self) -> str:
        return self.state.name


@dataclass(frozen=True)
class Throughput:
    """Per-second outcomes of the last ``THROUGHPUT_WINDOW`` seconds (zero-filled) and the spec 04 §3.3 rates."""

    points: list[MetricPoint]
    per_second_1m: float
    per_second_5m: float
    fail_rate_1m: float
    fail_rate_5m: float


@dataclass(frozen=True)
class HistoryPage:
    """One keyset page of Archive or DLQ rows. ``next_token``/``prev_token`` are opaque page keys;
    ``retained`` is the pillar's O(1) counter (not a filtered count: history is never COUNTed to render)."""

    rows: list[JobRow]
    next_token: str | None
    prev_token: str | None
    retained: int
    window: int | None = None  # set when the sort only ranks the newest ``window`` matches
    searched: int | None = None  # set when a text search read only the newest ``searched`` rows of the pillar


def queue_overview() -> list[QueueOverview]:
    return _queue_overview(storage.queue_states(), storage.queue_stats(), storage.queue_health())


def _queue_overview(states: list[QueueState], stats: list[QueueStats], lags: list[QueueLag]) -> list[QueueOverview]:
    by_queue = {q.queue: q for q in stats}
    lag_by_queue = {q.queue: q for q in lags}
    return [QueueOverview(state, by_queue.get(state.name), lag_by_queue.get(state.name)) for state in states]


def _throughput_start(now: datetime | None) -> datetime:
    return (now or datetime.now(UTC)).replace(microsecond=0) - timedelta(seconds=THROUGHPUT_WINDOW - 1)


def throughput(now: datetime | None = None) -> Throughput:
    start = _throughput_start(now)
    return _throughput(start, storage.throughput(start))


def _throughput(start: datetime, read: list[MetricPoint]) -> Throughput:
    by_second = {p.at.astimezone(UTC).replace(microsecond=0): p for p in read}
    points = [by_second.get(start + timedelta(seconds=n)) or MetricPoint(start + timedelta(seconds=n), 0, 0)
              for n in range(THROUGHPUT_WINDOW)]
    last_minute = points[-60:]
    done_1m = sum(p.succeeded + p.failed for p in last_minute)
    failed_1m = sum(p.failed for p in last_minute)
    done_5m = sum(p.succeeded + p.failed for p in points)
    failed_5m = sum(p.failed for p in points)
    return Throughput(
        points=points,
        per_second_1m=done_1m / 60,
        per_second_5m=done_5m / THROUGHPUT_WINDOW,
        fail_rate_1m=failed_1m * 100 / done_1m if done_1m else 0.0,
        fail_rate_5m=failed_5m * 100 / done_5m if done_5m else 0.0,
    )


# ---------------------------------------------------------------- history roll-ups (the chart's 1 h / 24 h / 7 d views)

# range → (granularity, buckets shown): each view reads at most that many buckets per series
HISTORY_RANGES: dict[str, tuple[str, int]] = {"1h": ("minute", 60), "24h": ("hour", 24), "7d": ("hour", 168)}
CHART_RANGES = ("5m", *HISTORY_RANGES)  # 5m is the live per-second chart
HISTORY_TYPES_LIMIT = 20


@dataclass(frozen=True)
class HistoryBucket:
    """One bucket of a history view: outcomes and the successes' p50/p95 duration (ms, None without any)."""

    at: datetime
    succeeded: int
    failed: int
    p50_ms: float | None
    p95_ms: float | None


@dataclass(frozen=True)
class HistoryView:
    """A history view of the chart: zero-filled buckets (oldest first), totals and the busiest types."""

    range: str
    granularity: str
    seconds: int  # bucket width
    buckets: list[HistoryBucket]
    types: list[TypeHistory]
    succeeded: int
    failed: int
    p50_ms: float | None
    p95_ms: float | None

    @property
    def fail_rate(self) -> float:
        done = self.succeeded + self.failed
        return self.failed * 100 / done if done else 0.0


def check_chart_range(value: str | None) -> str:
    """A chart range as the address gives it (``?range=24h``): one of ``CHART_RANGES``, 5m when absent."""
    value = (value or "5m").strip()
    if value not in CHART_RANGES:
        raise ServiceError(f"range must be one of {', '.join(CHART_RANGES)} (got {value[:20]!r})")
    return value


def history_buckets(range_key: str, now: datetime | None = None) -> HistoryView:
    """The 1h (minute buckets), 24h or 7d (hour buckets) view from the roll-ups: one read of at most 60/24/168
    buckets per series, never Archive."""
    if range_key not in HISTORY_RANGES:
        raise ServiceError(f"range must be one of {', '.join(HISTORY_RANGES)} (got {range_key[:20]!r})")
    granularity, count = HISTORY_RANGES[range_key]
    seconds = HISTORY_GRANULARITIES[granularity]
    now = (now or datetime.now(UTC)).astimezone(UTC)
    current = datetime.fromtimestamp(int(now.timestamp()) // seconds * seconds, UTC)
    start = current - timedelta(seconds=seconds * (count - 1))
    window = storage.history_buckets(seconds, start, HISTORY_TYPES_LIMIT)
    by_start = {p.at.astimezone(UTC): p for p in window.points}
    empty = (0,) * DURATION_BINS
    points = [by_start.get(start + timedelta(seconds=seconds * n)) or HistoryPoint(start + timedelta(seconds=seconds * n),
                                                                                    0, 0, empty)
              for n in range(count)]
    bins = tuple(sum(column) for column in zip(*(p.bins for p in points), strict=True))
    longest = max((p.max_ms for p in points if p.max_ms is not None), default=None)
    return HistoryView(
        range=range_key, granularity=granularity, seconds=seconds,
        buckets=[HistoryBucket(p.at, p.succeeded, p.failed, percentile(p.bins, 0.5, p.max_ms),
                               percentile(p.bins, 0.95, p.max_ms)) for p in points],
        types=window.types, succeeded=sum(p.succeeded for p in points), failed=sum(p.failed for p in points),
        p50_ms=percentile(bins, 0.5, longest), p95_ms=percentile(bins, 0.95, longest),
    )


TOP_ERRORS_LIMIT = 5


def top_errors(limit: int = TOP_ERRORS_LIMIT) -> list[ErrorGroup]:
    """The Top error types panel: the DLQ's most frequent errors (the same size the live view pushes)."""
    return storage.top_errors(limit)


@dataclass(frozen=True)
class LiveView:
    """What the live Deck pushes, from ONE storage statement (``storage.deck_snapshot``); parts not asked for
    are None."""

    summary: SummaryStats
    active: list[JobRow]
    located: dict[str, JobStatus]
    throughput: Throughput | None
    queues: list[QueueOverview] | None
    fleet: FleetView | None
    errors: list[ErrorGroup] | None


def live_view(*, locate: Sequence[str] = (), throughput: bool = False, queues: bool = False, fleet: bool = False,
              errors: bool = False, limit: int = ACTIVE_LIMIT, now: datetime | None = None) -> LiveView:
    """Stats, the newest ``limit`` Hot rows and where the ``locate`` ids are now; on request the throughput
    chart, the queues panel, the Workers/Circuit breakers panels and the top errors — in one statement."""
    now = now or datetime.now(UTC)
    start = _throughput_start(now)
    snap = storage.deck_snapshot(SnapshotRequest(
        active_limit=max(1, min(limit, MAX_PAGE_SIZE)), locate_ids=list(dict.fromkeys(locate)),
        throughput_since=start if throughput else None, queues=queues, workers=fleet,
        errors_limit=TOP_ERRORS_LIMIT if errors else 0))
    return LiveView(
        summary=snap.summary, active=snap.active, located=snap.located,
        throughput=None if snap.throughput is None else _throughput(start, snap.throughput),
        queues=None if snap.queue_states is None else _queue_overview(
            snap.queue_states, snap.queue_stats or [], snap.queue_lags or []),
        fleet=None if snap.workers is None else _fleet_view(snap.workers, now),
        errors=snap.errors,
    )


def active_jobs(filters: JobFilter | None = None, limit: int = ACTIVE_LIMIT) -> list[JobRow]:
    """The newest Hot rows (never the payload)."""
    return storage.list_active(filters or JobFilter(), max(1, min(limit, MAX_PAGE_SIZE)))


def locate(job_ids: Sequence[str]) -> dict[str, JobStatus]:
    return storage.locate_jobs(list(job_ids))


def _encode_key(sort: HistorySort, row: JobRow) -> str:
    value = row.sort_value(sort.key)
    raw = json.dumps([sort.key, value.isoformat() if isinstance(value, datetime) else value, row.id])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


SORT_INT_RANGE = (-(2**63), 2**63 - 1)


def _decode_key(token: str, sort: HistorySort) -> tuple[Any, str]:
    """A page key back to (sort value, id); anything malformed or from another sort is refused."""
    try:
        key, value, job_id = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        if key != sort.key or not isinstance(job_id, str):
            raise ValueError("page key of another sort")
        if "\x00" in job_id or (isinstance(value, str) and "\x00" in value):
            raise ValueError("NUL character")  # no database text column can hold it
        sample = JobRow("", "", "", JobStatus.PENDING, 0, datetime.now(UTC)).sort_value(key)
        if sort.key in ("date", "created"):
            value = datetime.fromisoformat(value)
            if value.tzinfo is None:
                raise ValueError("naive time")
            value = value.astimezone(UTC)  # OverflowError past year 1..9999 once the offset is applied
        elif isinstance(value, bool):
            raise ValueError("not a number")
        elif isinstance(sample, float):
            value = float(value)
            if not math.isfinite(value):
                raise ValueError("not a finite number")
        elif isinstance(sample, int) or sort.key == "reason":
            if not isinstance(value, int) or not SORT_INT_RANGE[0] <= value <= SORT_INT_RANGE[1]:
                raise ValueError("not a 64-bit integer")
        elif not isinstance(value, str):
            raise ValueError("not a string")
        return value, job_id
    except (ValueError, TypeError, OverflowError, RecursionError, binascii.Error, UnicodeDecodeError) as exc:
        raise ServiceError(f"invalid page key: {exc}") from exc


def history(
    pillar: str, filters: JobFilter, sort: HistorySort, *, after: str | None = None, before: str | None = None,
    size: int = 100,
) -> HistoryPage:
    """A keyset page of ``pillar`` ("archive" or "dlq"): the first page, the page after ``after`` or the page
    before ``before`` (page keys from an earlier ``HistoryPage``)."""
    if pillar not in ("archive", "dlq"):
        raise ServiceError(f"unknown history view {pillar!r}")
    if sort.key not in SORT_KEYS:
        raise ServiceError(f"unknown sort key {sort.key!r} (allowed: {', '.join(SORT_KEYS)})")
    if sort.key not in HISTORY_SORTS[pillar]:
        raise ServiceError(f"the {'Archive' if pillar == 'archive' else 'DLQ'} cannot be sorted by {sort.key!r}"
                           f" (allowed: {', '.join(HISTORY_SORTS[pillar])})")
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise ServiceError(f"page size must be within 1..{MAX_PAGE_SIZE}")
    read = storage.list_archive if pillar == "archive" else storage.list_dlq
    summary = storage.summary_stats()
    retained = summary.archived if pillar == "archive" else summary.failed_total
    window = None if sort.key in INDEXED_SORTS[pillar] else SORT_WINDOW
    sort = replace(sort, window=window)
    term = (filters.search or "").strip()
    filters = replace(filters, search=term or None)
    if term and len(term) <= 50 and filters.job_id is None:
        # a search that is exactly a job id of this pillar finds it by primary key, not by scanning history
        if storage.locate_jobs([term]).get(term) in PILLAR_STATUSES[pillar]:
            filters = replace(filters, job_id=term)
    searched = SEARCH_WINDOW if term and filters.job_id is None and retained > SEARCH_WINDOW else None
    sort = replace(sort, search_window=searched)
    if before:
        rows = read(filters, _decode_key(before, sort), size + 1, replace(sort, descending=not sort.descending))
        more_before = len(rows) > size
        rows = list(reversed(rows[:size]))
        if rows:
            return HistoryPage(rows, _encode_key(sort, rows[-1]),
                               _encode_key(sort, rows[0]) if more_before else None, retained, window, searched)
        after = None
    key: tuple[Any, str] | None = _decode_key(after, sort) if after else None
    rows = read(filters, key, size + 1, sort)
    if key is not None and not rows:  # the page emptied meanwhile (purge, requeue): back to the first page
        key, rows = None, read(filters, None, size + 1, sort)
    more = len(rows) > size
    rows = rows[:size]
    return HistoryPage(rows, _encode_key(sort, rows[-1]) if more else None,
                       _encode_key(sort, rows[0]) if key is not None and rows else None, retained, window,
                       searched)


# ---------------------------------------------------------------- operator commands
# One verb per operation (docs/architecture.md, "Verbs"): ``verb`` acts on one job and raises ConflictError when
# the job is not where the command expects it; ``verb_many`` acts on a list of ids and ``verb_matching`` on the
# newest DLQ rows matching a filter — both return the ids they affected (for the audit of every job).


def _edits(tags: str | None, priority: int | None) -> None:
    if tags is not None and len(tags) > TAGS_MAX:
        raise ServiceError(f"tags must be at most {TAGS_MAX} characters")
    if priority is not None and not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
        raise ServiceError(f"priority must be within {PRIORITY_RANGE[0]}..{PRIORITY_RANGE[1]}")


def _where_is(job_id: str) -> str:
    status = storage.locate_jobs([job_id]).get(job_id)
    return "gone" if status is None else status.name.capitalize()


def check_job_ids(job_ids: Sequence[str]) -> list[str]:
    """The ids of a bulk command: trimmed, de-duplicated, 1–``MAX_BULK_IDS`` of them, each a valid job id
    (``check_job_id``), or ServiceError saying which rule failed."""
    ids = list(dict.fromkeys(i.strip() for i in job_ids if i and i.strip()))
    if not ids:
        raise ServiceError("no job ids given: select at least one job")
    if len(ids) > MAX_BULK_IDS:
        raise ServiceError(f"at most {MAX_BULK_IDS} ids per command, got {len(ids)}")
    for job_id in ids:
        check_job_id(job_id)
    return ids


def _in_dlq(job_ids: Sequence[str]) -> list[str]:
    """Those of ``job_ids`` that are in the DLQ now."""
    where = storage.locate_jobs(list(job_ids))
    return [i for i in job_ids if where.get(i) in PILLAR_STATUSES["dlq"]]


def _on_dlq_rows(job_ids: Sequence[str], command: Callable[[list[str]], int]) -> list[str]:
    """Run a bulk DLQ ``command`` (purge, resurrect) on those of ``job_ids`` in the DLQ; returns the ids it moved
    out of the DLQ (in the DLQ before, not after), so the audit can name every affected job."""
    return _moved_out_of_dlq(_in_dlq(job_ids), command)


def _moved_out_of_dlq(dlq_ids: list[str], command: Callable[[list[str]], int]) -> list[str]:
    """Run ``command`` on ``dlq_ids`` (rows just seen in the DLQ); the ids no longer in the DLQ afterwards."""
    if not dlq_ids or not command(dlq_ids):
        return []
    still = set(_in_dlq(dlq_ids))
    return [i for i in dlq_ids if i not in still]


def _payload(payload: str | None) -> str | None:
    """Validate edited payload JSON: it must parse to an object and fit the envelope limit."""
    if payload is None:
        return None
    try:
        value = json.loads(payload)
    except RecursionError:
        raise ServiceError(f"payload nests too deeply: at most {MAX_PAYLOAD_DEPTH} levels of lists/objects") from None
    except ValueError as exc:
        raise ServiceError(f"payload is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ServiceError("payload must be a JSON object of handler arguments")
    try:
        return serialize_payload(value)
    except (TypeError, ValueError) as exc:
        raise ServiceError(str(exc)) from exc


def max_payload_bytes() -> int:
    """The envelope's payload limit (``CHOKAQ["SERIALIZATION"]["MAX_PAYLOAD_BYTES"]``), for the editor's check."""
    return int(config().SERIALIZATION.MAX_PAYLOAD_BYTES)


def cancel(job_id: str, *, actor: str) -> str:
    """Cancel one job: returns "moved" (Pending/Fetched → DLQ Cancelled) or "flagged" (Processing, cooperative)."""
    job_id = check_job_id(job_id)
    moved, flagged = storage.cancel([job_id], actor=actor)
    if moved:
        return "moved"
    if flagged:
        return "flagged"
    raise ConflictError(f"Job {job_id} cannot be cancelled: it is {_where_is(job_id)}")


def cancel_many(job_ids: Sequence[str], *, actor: str) -> tuple[list[str], list[str]]:
    """Pending/Fetched → DLQ Cancelled now; Processing → cooperative cancel. Returns (moved, flagged)."""
    return storage.cancel(check_job_ids(job_ids), actor=actor)


def _stale(job_id: str, revision: int | None) -> None:
    """Raise ``StaleEdit`` with the job's current state when it is still there but at another revision."""
    jv = find_job(job_id) if revision is not None else None
    if jv is None or (jv.hot is None and jv.dead is None):
        return
    if jv.hot is not None:
        row: HotJob | DeadJob = jv.hot
        where, priority = jv.hot.status.name.capitalize(), jv.hot.priority
    else:
        assert jv.dead is not None
        row, where, priority = jv.dead, "in the DLQ", None
    if row.revision == revision:
        return
    current = {"jobId": job_id, "where": where, "revision": row.revision, "payload": row.payload, "tags": row.tags,
               "priority": priority, "lastModifiedBy": row.last_modified_by}
    raise StaleEdit(f"Job {job_id} was changed meanwhile (by {row.last_modified_by or 'the engine'}; it is now "
                    f"{where} at revision {row.revision}, the edit was made against revision {revision}): nothing "
                    "was saved. Reopen the editor to edit the current state.", current)


def resurrect(job_id: str, *, actor: str, payload: str | None = None, tags: str | None = None,
              priority: int | None = None, revision: int | None = None) -> None:
    """DLQ → Hot, with optional edits applied in the same transaction (``revision``: the edit version they were
    made against; a newer one is a ``StaleEdit``). Any other place is a conflict: Processing jobs are never
    resurrected, archived ones only re-enqueued."""
    job_id = check_job_id(job_id)
    _edits(tags, priority)
    clean = _payload(payload)
    if storage.resurrect(job_id, payload=clean, tags=tags, priority=priority, actor=actor, revision=revision):
        return
    where = f"not in the DLQ (it is {_where_is(job_id)})"
    if payload is None and tags is None and priority is None:
        raise ConflictError(f"Job {job_id} is {where}")
    _stale(job_id, revision)
    raise ConflictError(f"Repair and retry failed: job {job_id} is {where}; it might have been purged or "
                        "requeued externally.")


def resurrect_many(job_ids: Sequence[str], *, actor: str) -> list[str]:
    """DLQ → Hot for many ids; returns the ids that moved."""
    return _on_dlq_rows(check_job_ids(job_ids), lambda ids: storage.resurrect_batch(ids, actor=actor))


def edit(job_id: str, *, actor: str, payload: str | None = None, tags: str | None = None,
         priority: int | None = None, revision: int | None = None) -> None:
    """Edit a Pending Hot job, else a DLQ job (payload, tags; ``revision``: only if it is still at that edit
    version). A job in neither state any more is a conflict, one at a newer edit version a ``StaleEdit``."""
    job_id = check_job_id(job_id)
    _edits(tags, priority)
    clean = _payload(payload)
    if storage.update_hot_data(job_id, payload=clean, tags=tags, priority=priority, actor=actor, revision=revision):
        return
    if storage.update_dlq_data(job_id, payload=clean, tags=tags, actor=actor, revision=revision):
        return
    _stale(job_id, revision)
    raise ConflictError("Save failed. Job might have been processed or deleted externally.")


def set_priority(job_id: str, priority: int, *, actor: str) -> None:
    """The priority of a Pending Hot job (the one edit that is its own command: the list's priority control)."""
    job_id = check_job_id(job_id)
    _edits(None, priority)
    if not storage.update_hot_data(job_id, priority=priority, actor=actor):
        raise ConflictError(f"Job {job_id} is not Pending any more (it is {_where_is(job_id)})")


def purge_archive(job_id: str) -> None:
    """Delete one Archive row forever."""
    job_id = check_job_id(job_id)
    if not storage.purge_archive_ids([job_id]):
        raise ConflictError(f"Job {job_id} is not in the Archive")


# ---------------------------------------------------------------- recurring jobs (the Recurring panel)


def recurring(now: datetime | None = None) -> list[dict[str, Any]]:
    """Every ``CHOKAQ["SCHEDULE"]`` entry: switch, next run, last run and its job."""
    return schedule.overview(now)


def _schedule_name(name: str) -> str:
    name = (name or "").strip()
    if not name or len(name) > 200:
        raise ServiceError("schedule name must be 1-200 characters")
    return name


def set_schedule_enabled(name: str, enabled: bool, now: datetime | None = None) -> None:
    """Switch a recurring job on or off fleet-wide (every worker honours it from its next check)."""
    name = _schedule_name(name)
    try:
        schedule.set_enabled(name, bool(enabled), now)
    except KeyError:
        raise NotFoundError(f"No recurring job named {name!r} in CHOKAQ['SCHEDULE']") from None


def run_schedule_now(name: str, *, actor: str, now: datetime | None = None) -> str:
    """Enqueue one job of a recurring job now (whatever its switch); the job's id."""
    name = _schedule_name(name)
    try:
        return schedule.run_now(name, actor, now)
    except KeyError:
        raise NotFoundError(f"No recurring job named {name!r} in CHOKAQ['SCHEDULE']") from None


def purge_dlq(job_id: str) -> None:
    """Delete one DLQ row forever."""
    job_id = check_job_id(job_id)
    if not storage.purge_dlq_ids([job_id]):
        raise ConflictError(f"Job {job_id} is not in the DLQ")


def purge_dlq_many(job_ids: Sequence[str]) -> list[str]:
    """Delete DLQ rows by id; returns the ids deleted."""
    return _on_dlq_rows(check_job_ids(job_ids), storage.purge_dlq_ids)


def _max_jobs(max_jobs: int | None) -> int:
    """A bulk-by-filter run's bound: None = every match (no cap), ≤ 0 = 100 (spec 04 §6), else that many."""
    if max_jobs is None:
        return NO_CAP
    return 100 if max_jobs <= 0 else max_jobs


def _dlq_filter(filters: JobFilter) -> JobFilter:
    if filters.from_at and filters.to_at and filters.from_at > filters.to_at:
        raise ServiceError("'from' must not be after 'to'")
    return filters


def preview_dlq_matching(filters: JobFilter, max_jobs: int | None = None) -> BulkPreview:
    """Dry run of ``purge_dlq_matching``/``resurrect_matching``: how many rows match and how many would be hit."""
    return storage.preview_dlq_bulk(_dlq_filter(filters), _max_jobs(max_jobs))


Progress = Callable[[list[str], int, int], None]  # after each batch: (its ids, rows done so far, rows to do)
Step = Callable[[str | None, str, int], storage.MatchBatch]  # (after, upto, size) → one committed batch


def _run_matching(pillar: str, filters: JobFilter, step: Step, max_jobs: int,
                  on_batch: Progress | None) -> tuple[list[str], list[str]]:
    """Walk the rows matching ``filters`` in ``pillar`` in batches of ≤ ``BULK_BATCH`` (each its own
    transaction, keyset by id), up to ``max_jobs`` of them; rows that begin to match after the run started
    (a larger id) are left alone. Returns (ids done, ids flagged)."""
    total, upto = storage.count_matching(pillar, filters)
    total = min(total, max_jobs)
    done: list[str] = []
    flagged: list[str] = []
    after: str | None = None
    while upto is not None:
        size = min(BULK_BATCH, max_jobs - len(done) - len(flagged))
        if size <= 0:
            break
        batch = step(after, upto, size)
        done += batch.done
        flagged += batch.flagged
        if on_batch is not None:
            on_batch([*batch.done, *batch.flagged], len(done) + len(flagged), max(total, len(done) + len(flagged)))
        if batch.after is None:
            break
        after = batch.after
    return done, flagged


def preview_cancel_matching(filters: JobFilter) -> BulkPreview:
    """Dry run of ``cancel_matching``: how many Hot rows match the Active view's filters, up to 10 of them."""
    matched, _ = storage.count_matching("hot", filters)
    sample = [r.id for r in storage.list_active(filters, 10)] if matched else []
    return BulkPreview(matched, matched, False, sample)


def cancel_matching(filters: JobFilter, *, actor: str, on_batch: Progress | None = None) -> tuple[list[str], list[str]]:
    """Cancel every Hot job matching the Active view's ``filters``, batch by batch (no cap): Pending/Fetched
    → DLQ Cancelled, Processing ones flagged for cooperative cancellation. Returns (moved, flagged)."""
    return _run_matching("hot", filters,
                         lambda after, upto, size: storage.cancel_matching(filters, after, upto, size, actor=actor),
                         NO_CAP, on_batch)


def purge_dlq_matching(filters: JobFilter, max_jobs: int | None = None, *,
                       on_batch: Progress | None = None) -> list[str]:
    """Delete the DLQ rows matching ``filters`` (every one, or at most ``max_jobs``), batch by batch; returns
    the ids deleted."""
    filters = _dlq_filter(filters)
    return _run_matching("dlq", filters, lambda after, upto, size: storage.purge_dlq_matching(
        filters, after, upto, size), _max_jobs(max_jobs), on_batch)[0]


def resurrect_matching(filters: JobFilter, max_jobs: int | None = None, *, actor: str,
                       on_batch: Progress | None = None) -> list[str]:
    """Move the DLQ rows matching ``filters`` (every one, or at most ``max_jobs``) back to Hot, batch by
    batch; returns the ids moved."""
    filters = _dlq_filter(filters)
    return _run_matching("dlq", filters, lambda after, upto, size: storage.resurrect_matching(
        filters, after, upto, size, actor=actor), _max_jobs(max_jobs), on_batch)[0]


def _cutoff(days: int) -> datetime:
    if not 1 <= days <= 365:
        raise ServiceError("days must be within 1..365")
    return datetime.now(UTC) - timedelta(days=days)


PURGE_PREVIEW_CAP = 100_000  # a purge preview counts at most this many rows, then says "more than"


def preview_purge_older_than(pillar: str, days: int, cap: int | None = None) -> tuple[datetime, int, bool]:
    """(cutoff, rows a purge older than ``days`` would delete now, capped) for "archive" or "dlq": the count stops
    at ``cap`` (``PURGE_PREVIEW_CAP``) and ``capped`` says there are more."""
    cutoff = _cutoff(days)
    cap = PURGE_PREVIEW_CAP if cap is None else cap
    count_older = storage.count_archive_older_than if pillar == "archive" else storage.count_dlq_older_than
    count = count_older(cutoff, cap + 1)
    return cutoff, min(count, cap), count > cap


def purge_older_than(pillar: str, days: int) -> int:
    """Delete the rows of ``pillar`` ("archive" or "dlq") older than ``days``; returns how many."""
    cutoff = _cutoff(days)
    return storage.purge_archive(cutoff) if pillar == "archive" else storage.purge_dlq_older_than(cutoff)


def set_worker_capacity(capacity: int | str, *, worker_id: str | None = None) -> bool:
    """Resize the concurrency of every worker (or one) at run time, without a restart.
    False when no cross-process channel layer (Redis) can carry the command."""
    value = _optional_int("capacity", capacity, (1, 10_000))
    if value is None:
        raise ServiceError("capacity is required")
    return events.send_control({"type": "worker.set_capacity", "capacity": value, "workerId": worker_id})



def _send_circuit_state(key: str, state: str, worker_id: str | None) -> bool:
    key = _checked("type key", key, "circuit key")
    return events.send_control({"type": "worker.set_circuit", "key": key, "state": state, "workerId": worker_id})


def close_circuit(key: str, *, worker_id: str | None = None) -> bool:
    """Reset the circuit breaker of type key ``key`` on every live worker (or one): Closed now, its failures
    forgotten. False when no cross-process channel layer (Redis) can carry the command."""
    return _send_circuit_state(key, "closed", worker_id)


def open_circuit(key: str, *, worker_id: str | None = None) -> bool:
    """Open the circuit breaker of type key ``key`` now on every live worker (or one), for a full break duration:
    its jobs are deferred meanwhile. False when no cross-process channel layer (Redis) can carry the command."""
    return _send_circuit_state(key, "open", worker_id)


@dataclass(frozen=True)
class Fleet:
    """Live workers (heartbeat younger than ``HEALTH.WORKER_HEARTBEAT_TIMEOUT``): for the Deck's engine panel."""

    workers: int
    capacity: int
    busy: int


def _fleet(registry: list[WorkerInfo], now: datetime) -> Fleet:
    """The live workers' count, capacity and busy slots: ``FleetView.totals``."""
    cutoff = now - timedelta(seconds=config().HEALTH.WORKER_HEARTBEAT_TIMEOUT)
    live = [w for w in registry
            if w.is_running and w.last_heartbeat_at is not None and w.last_heartbeat_at >= cutoff]
    return Fleet(len(live), sum(w.capacity for w in live), sum(w.active_count for w in live))


# ---------------------------------------------------------------- the fleet: Workers and Circuit breakers panels

STOPPED_VISIBLE_SECONDS = 3600  # a stopped worker stays on the Workers panel (greyed) this long
FLEET_MAX_ROWS = 200
CIRCUIT_LABELS = {0: "Closed", 1: "Open", 2: "HalfOpen"}
_CIRCUIT_RANK = {0: 0, 2: 1, 1: 2}  # worst first: Open > HalfOpen > Closed


@dataclass(frozen=True)
class WorkerRow:
    """One worker process of the registry as the Deck's Workers panel shows it."""

    worker_id: str
    hostname: str
    pid: int
    queues: str
    capacity: int
    busy: int
    is_running: bool
    last_heartbeat_at: datetime | None
    stopped_at: datetime | None
    heartbeat_age: float | None  # seconds since the last heartbeat, at read time
    stale: bool  # running, but no heartbeat within HEALTH.WORKER_HEARTBEAT_TIMEOUT

    @property
    def state(self) -> str:
        return "stopped" if not self.is_running else "stale" if self.stale else "running"


@dataclass(frozen=True)
class BreakerRow:
    """One circuit key merged over the live workers (spec 04 §2.6)."""

    key: str
    status: int  # worst reported: 1 Open > 2 HalfOpen > 0 Closed
    closed: int  # how many live workers report each status
    open: int
    half_open: int
    max_failures: int
    reset_at: datetime | None  # latest resetAtUtc among the workers reporting Open

    @property
    def label(self) -> str:
        return CIRCUIT_LABELS[self.status]


@dataclass(frozen=True)
class FleetView:
    """The Workers and Circuit breakers panels, both from one read of the worker registry."""

    at: datetime
    heartbeat_timeout: int
    workers: list[WorkerRow]
    breakers: list[BreakerRow]
    totals: Fleet  # the engine panel's live-worker totals, from the same read (every row, before the display cap)

    @property
    def live_workers(self) -> int:
        """Workers running with a fresh heartbeat: only they report breakers (none live: health is unknown)."""
        return sum(1 for w in self.workers if w.is_running and not w.stale)


def _aware(moment: datetime | None) -> datetime | None:
    return moment.replace(tzinfo=UTC) if moment is not None and moment.tzinfo is None else moment


def _reset_at(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return _aware(datetime.fromisoformat(value))
    except ValueError:
        return None


def _circuits(circuits_json: str) -> list[tuple[str, int, int, datetime | None]]:
    """A registry row's breaker snapshot as (key, status, failure count, reset at); malformed entries are skipped."""
    try:
        items = json.loads(circuits_json or "[]")
    except ValueError:
        return []
    out = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("circuitKey"), str):
            continue
        status, failures = item.get("status"), item.get("failureCount")
        if isinstance(status, bool) or status not in _CIRCUIT_RANK:
            continue
        failures = failures if isinstance(failures, int) and not isinstance(failures, bool) else 0
        out.append((item["circuitKey"], int(status), failures, _reset_at(item.get("resetAtUtc"))))
    return out


def fleet_view(now: datetime | None = None) -> FleetView:
    """Every registry row worth showing (running, and stopped within ``STOPPED_VISIBLE_SECONDS``) and the circuit
    breakers of the live ones (running, heartbeat younger than ``HEALTH.WORKER_HEARTBEAT_TIMEOUT``) merged per key."""
    return _fleet_view(storage.list_workers(), now or datetime.now(UTC))


def _fleet_view(registry: list[WorkerInfo], now: datetime) -> FleetView:
    timeout = int(config().HEALTH.WORKER_HEARTBEAT_TIMEOUT)
    rows: list[WorkerRow] = []
    merged: dict[str, dict[str, Any]] = {}
    for w in registry:
        beat, stopped = _aware(w.last_heartbeat_at), _aware(w.stopped_at)
        age = (now - beat).total_seconds() if beat is not None else None
        stale = w.is_running and (age is None or age > timeout)
        if not w.is_running and (stopped or beat or now) < now - timedelta(seconds=STOPPED_VISIBLE_SECONDS):
            continue
        rows.append(WorkerRow(w.worker_id, w.hostname, w.pid, w.queues, w.capacity, w.active_count, w.is_running,
                              beat, stopped, age, stale))
        if not w.is_running or stale:
            continue
        for key, status, failures, reset_at in _circuits(w.circuits_json):
            m = merged.setdefault(key, {"status": status, "counts": {0: 0, 1: 0, 2: 0}, "failures": 0, "reset": None})
            if _CIRCUIT_RANK[status] > _CIRCUIT_RANK[m["status"]]:
                m["status"] = status
            m["counts"][status] += 1
            m["failures"] = max(m["failures"], failures)
            if status == 1 and reset_at is not None and (m["reset"] is None or reset_at > m["reset"]):
                m["reset"] = reset_at
    rows.sort(key=lambda r: (not r.is_running, r.stale, r.hostname, r.pid, r.worker_id))
    breakers = [BreakerRow(key, m["status"], m["counts"][0], m["counts"][1], m["counts"][2], m["failures"],
                           m["reset"] if m["status"] == 1 else None)
                for key, m in merged.items()]
    breakers.sort(key=lambda b: (-_CIRCUIT_RANK[b.status], b.key))
    return FleetView(now, timeout, rows[:FLEET_MAX_ROWS], breakers, _fleet(registry, now))


def health_report(tags: Sequence[str] = ()) -> tuple[dict[str, Any], int]:
    """The health report of spec 05 §4 (``tags`` select checks, e.g. ``live``) and its HTTP status (503 when
    Unhealthy)."""
    report = health.run(list(tags))
    return report.as_dict(), report.http_status


def metrics_exposition() -> tuple[bytes, str]:
    """ChokaQ's instruments and fleet gauges in the Prometheus text format, and that format's content type."""
    return prometheus.exposition(), prometheus.CONTENT_TYPE_LATEST
