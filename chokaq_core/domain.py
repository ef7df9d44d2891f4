"""Enumerations with the spec's numeric values, row dataclasses and exceptions.

No ORM and no SQL here: everything in this module is plain Python that every
layer (storage, worker, service, Deck) can import.
"""

from __future__ import annotations

import os
import re
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import IntEnum
from typing import Any


class JobStatus(IntEnum):
    """Spec 02 §1. Only 0–2 are stored (in Hot); 3–6 are virtual."""

    PENDING = 0
    FETCHED = 1
    PROCESSING = 2
    SUCCEEDED = 3
    FAILED = 4
    CANCELLED = 5
    ZOMBIE = 6


class FailureReason(IntEnum):
    """Spec 02 §5.1, persisted in ``chokaq_jobs_dlq.failure_reason``."""

    MAX_RETRIES_EXCEEDED = 0
    CANCELLED = 1
    ZOMBIE = 2
    CIRCUIT_BREAKER_OPEN = 3
    REJECTED = 4
    THROTTLED = 5
    FATAL_ERROR = 6
    TIMEOUT = 7
    TRANSIENT = 8
    HEARTBEAT_FAILURE = 9
    RETRY_LIFETIME_EXPIRED = 10

    @property
    def display_name(self) -> str:
        """The reference's PascalCase name, used in events and the Deck."""
        return "".join(part.capitalize() for part in self.name.split("_"))

    @property
    def shown_status(self) -> JobStatus:
        """How the Deck shows a DLQ row of this reason (spec 02 §1): Cancelled, Zombie, else Failed."""
        if self is FailureReason.CANCELLED:
            return JobStatus.CANCELLED
        if self is FailureReason.ZOMBIE:
            return JobStatus.ZOMBIE
        return JobStatus.FAILED


class CancellationReason(IntEnum):
    SHUTDOWN = 0
    TIMEOUT = 1
    ADMIN = 2
    HEARTBEAT_FAILURE = 3


# ---------------------------------------------------------------- exceptions


class ChokaQError(Exception):
    """Base class of every ChokaQ exception."""


class EnvelopeError(ChokaQError, ValueError):
    """An enqueue argument breaks an envelope limit (spec 03 §9)."""


class UnknownJobTypeError(ChokaQError, ValueError):
    """Enqueue of a type key no ``@job`` registered (and no opt-out given)."""


class ChokaQFatalError(ChokaQError):
    """Fatal: the job goes straight to the DLQ, no retry."""

    chokaq_fatal = True


class JobTypeNotRegisteredError(ChokaQFatalError):
    """The worker found a row whose type key has no handler."""


class PayloadDeserializationError(ChokaQFatalError):
    """The stored payload is not a JSON object the handler can take."""


class ChokaQThrottledError(ChokaQError):
    """Downstream rate limiting; ``retry_after`` (seconds or timedelta) is honoured."""

    chokaq_throttled = True

    def __init__(self, message: str = "Throttled", retry_after: float | timedelta | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class CircuitFatalError(ChokaQError):
    """Opens the circuit of its job type at once (no retries)."""

    chokaq_circuit_fatal = True


class JobCancelledError(ChokaQError):
    """Raised by ``ctx.cancellation.raise_if_cancelled()``."""

    def __init__(self, reason: CancellationReason | None = None) -> None:
        super().__init__(f"Job cancelled ({reason.name if reason is not None else 'unknown'})")
        self.reason = reason


class StorageError(ChokaQError):
    """A storage operation failed after the transient-error retries."""


# ---------------------------------------------------------------- ids

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]  # every 10 bits as their two characters
_ulid_lock = threading.Lock()
_ulid_last: tuple[int, int] = (0, 0)


def new_ulid() -> str:
    """A 26-character ULID, monotonic within one process (spec 02 §2.1)."""
    return new_ulids(1)[0]


_RAND_MASK = (1 << 80) - 1


def new_ulids(count: int) -> list[str]:
    """``count`` ULIDs in increasing order, monotonic within one process: one clock reading and one random draw
    for the batch; the 48-bit time is 10 characters (2 zero bits first), each id's 80 random bits 16 more."""
    global _ulid_last
    if count <= 0:
        return []
    with _ulid_lock:
        ms = time.time_ns() // 1_000_000
        last_ms, last_rand = _ulid_last
        if ms <= last_ms:
            ms, first = last_ms, last_rand + 1
        else:
            first = int.from_bytes(os.urandom(10), "big")
        last = first + count - 1
        if last > _RAND_MASK:  # the 80 random bits ran out within this millisecond: move to the next one
            ms, first = ms + 1, int.from_bytes(os.urandom(10), "big") >> 1
            last = first + count - 1
        _ulid_last = (ms, last)
    pairs = _PAIRS
    stamp = "".join([pairs[ms >> shift & 1023] for shift in (40, 30, 20, 10, 0)])
    if count == 1:
        return [stamp + "".join([pairs[first >> shift & 1023] for shift in (70, 60, 50, 40, 30, 20, 10, 0)])]
    # the batch's random parts are consecutive: their first 70 bits change once per 1,024 ids, so each run of ids
    # sharing them is that 24-character head plus each of the last ten bits' characters
    ids: list[str] = []
    for high in range(first >> 10, (last >> 10) + 1):
        head = stamp + "".join([pairs[high >> shift & 1023] for shift in (60, 50, 40, 30, 20, 10, 0)])
        start = first - (high << 10) if high == first >> 10 else 0
        end = last - (high << 10) + 1 if high == last >> 10 else 1024
        ids += [head + pair for pair in pairs[start:end]]
    return ids


# ---------------------------------------------------------------- rows


@dataclass(slots=True, unsafe_hash=True)
class NewJob:
    """A validated envelope, ready for ``storage.enqueue``; treat it as immutable (not frozen: built once per job, and
    a frozen dataclass's ``__init__`` costs ~6x more)."""

    id: str
    queue: str
    type: str
    payload: str  # the handler's keyword arguments as JSON text
    tags: str | None = None
    idempotency_key: str | None = None
    priority: int = 10
    delay_seconds: float | None = None
    created_by: str | None = None
    rate_key: str | None = None  # the partition of a per-key rate limit this job counts against


@dataclass(frozen=True, slots=True)
class StoredJob:
    """What every job table's row starts with: the job's identity, queue, type, payload and tags."""

    id: str
    queue: str
    type: str
    payload: str | None
    tags: str | None


@dataclass(frozen=True, slots=True)
class HotJob(StoredJob):
    """A row of ``chokaq_jobs_hot``."""

    idempotency_key: str | None
    priority: int
    status: JobStatus
    attempt_count: int
    worker_id: str | None
    heartbeat_at: datetime | None
    scheduled_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    last_updated_at: datetime
    created_by: str | None
    last_modified_by: str | None
    revision: int = 0  # the edit version an operator's edit must name (see update_hot_data)
    rate_key: str | None = None  # the partition of a per-key rate limit this job counts against
    last_error_class: str | None = None  # the latest failed execution's exception class path (a retrying job)
    last_error_message: str | None = None
    last_error_at: datetime | None = None
    held_by: str | None = None  # the job type whose open circuit deferred this job (None once it runs again)

    @property
    def last_error(self) -> str | None:
        """The latest failed execution as ``ClassName: message`` (None before any failure)."""
        return error_summary(self.last_error_class, self.last_error_message)


@dataclass(frozen=True, slots=True)
class ArchivedJob(StoredJob):
    attempt_count: int
    worker_id: str | None
    created_by: str | None
    last_modified_by: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime
    duration_ms: float | None
    result: str | None = None  # the handler's return value as JSON text (Django addition: the django.tasks backend's result)


@dataclass(frozen=True, slots=True)
class DeadJob(StoredJob):
    failure_reason: FailureReason
    error_details: str | None
    attempt_count: int
    worker_id: str | None
    created_by: str | None
    last_modified_by: str | None
    created_at: datetime
    failed_at: datetime
    revision: int = 0  # the edit version, carried over from Hot (+1)
    error_class: str | None = None  # the exception class path of the failure (None: no exception, or an old row)
    error_message: str | None = None
    rate_key: str | None = None  # the job's partition of a per-key rate limit, back in Hot when resurrected

    @property
    def error(self) -> str | None:
        """``ClassName: message`` of the failure, else the details' last line (rows stored before the columns)."""
        return error_summary(self.error_class, self.error_message, self.error_details)


MAX_ATTEMPT_MESSAGE = 1000
MAX_ERROR_CLASS = 255
MAX_ATTEMPT_TRACEBACK = 8000
_TRACEBACK_HEAD = "Traceback (most recent call last):\n"


def short_class(error_class: str) -> str:
    """An exception class path's last part: ``requests.exceptions.ConnectionError`` → ``ConnectionError``."""
    return error_class.rsplit(".", 1)[-1]


def last_line(details: str | None) -> str | None:
    """The last non-blank line of error details: a traceback's exception line, or a one-line text itself."""
    for line in reversed((details or "").splitlines()):
        if line.strip():
            return line.strip()
    return None


def error_summary(error_class: str | None, message: str | None, details: str | None = None) -> str | None:
    """An error as the Deck shows it first: ``ClassName: message`` (only the class when the message is empty);
    without a class, the last line of ``details``."""
    if error_class:
        return f"{short_class(error_class)}: {message}" if message else short_class(error_class)
    return last_line(details)


@dataclass(frozen=True, slots=True)
class AttemptError:
    """What one failed execution raised: the exception's class path, its message and its traceback text
    (``traceback.format_exception``'s shape; the middle frames are cut when it is longer than
    ``MAX_ATTEMPT_TRACEBACK`` characters, keeping the first line and the exception at the end)."""

    error_class: str
    message: str
    traceback: str

    @classmethod
    def of(cls, exc: BaseException) -> AttemptError:
        kind = type(exc)
        text = "".join(traceback.format_exception(exc))
        if len(text) > MAX_ATTEMPT_TRACEBACK:
            head = _TRACEBACK_HEAD if text.startswith(_TRACEBACK_HEAD) else ""
            cut = f"{head}  ...\n"
            text = cut + text[len(text) - (MAX_ATTEMPT_TRACEBACK - len(cut)):]
        return cls(error_class=f"{kind.__module__}.{kind.__qualname__}"[-MAX_ERROR_CLASS:],
                   message=str(exc)[:MAX_ATTEMPT_MESSAGE], traceback=text)

    @property
    def summary(self) -> str:
        """``ClassName: message``."""
        return error_summary(self.error_class, self.message) or ""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One failed execution in a job's attempts history (``chokaq_job_attempts``), oldest first."""

    job_id: str
    attempt: int
    worker_id: str | None
    error_class: str
    message: str
    traceback: str
    failed_at: datetime
    started_at: datetime | None = None  # when that execution started (the Hot row's started_at)


@dataclass(frozen=True, slots=True)
class FailedAttempt:
    """An attempts-history row to write: the job, which execution failed, and what it raised."""

    job_id: str
    attempt: int
    error: AttemptError
    started_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Success:
    """A finished execution to archive."""

    job_id: str
    duration_ms: float | None
    result: str | None = None  # the handler's return value as JSON text, kept in the Archive row


@dataclass(frozen=True, slots=True)
class Retry:
    """A failed execution to put back to Pending at ``delay_seconds`` from now."""

    job_id: str
    attempt_count: int
    delay_seconds: float
    error: AttemptError | None = None  # what the attempt raised: the attempts history and the Hot row's last error
    held_by: str | None = None  # the job type whose open circuit deferred the job (no execution ran)


@dataclass(frozen=True, slots=True)
class Failure:
    """A terminal outcome to move to the DLQ."""

    job_id: str
    reason: FailureReason
    error_details: str
    attempt: int | None = None  # the execution that failed, when one ran (kept in the attempts history)
    error: AttemptError | None = None


@dataclass(frozen=True, slots=True)
class QueueState:
    """A ``chokaq_queues`` row: the operator's controls of one queue — paused, shown (``is_active``), its zombie
    timeout (None: the global one) and its bulkhead (``max_workers``, None: no cap)."""

    name: str
    is_paused: bool
    is_active: bool
    zombie_timeout_seconds: int | None
    max_workers: int | None


@dataclass(slots=True)
class WorkerInfo:
    """A row of ``chokaq_workers`` (the worker registry)."""

    worker_id: str
    hostname: str
    pid: int
    queues: str
    capacity: int
    active_count: int
    is_running: bool = True
    runtime_json: str = "{}"
    circuits_json: str = "[]"
    started_at: datetime | None = None
    last_heartbeat_at: datetime | None = None
    stopped_at: datetime | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- the Deck's filters (its lists, its bulk commands)


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Filters of the Deck's lists and of the DLQ bulk operations (spec 01 §4.10, 04 §5).

    ``search`` is a case-insensitive substring (LIKE wildcards escaped) over id, type and tags
    (and error details in the DLQ). ``from_at``/``to_at`` bound finished_at (Archive) or
    created_at (DLQ, Hot), both inclusive. ``status`` applies to Hot only; ``failure_reason`` to the DLQ.
    """

    queue: str | None = None
    type: str | None = None
    status: JobStatus | None = None
    failure_reason: FailureReason | None = None
    search: str | None = None
    from_at: datetime | None = None
    to_at: datetime | None = None
    job_id: str | None = None  # exact id (a primary-key lookup), combined with the other filters
    error_class: str | None = None  # DLQ: exact exception class path (a Top Errors group with ``error_message``)
    error_message: str | None = None  # DLQ: exact message; set together with ``error_class``


# ---------------------------------------------------------------- history roll-ups

# Upper edges (ms) of the duration histogram's bins, a 1-2-5 log scale: bin i counts durations in
# [edge[i-1], edge[i]) (bin 0 from 0), the last bin everything from 1,000,000 ms (≈ 17 min) up.
DURATION_BIN_EDGES_MS: tuple[float, ...] = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000,
                                            20_000, 50_000, 100_000, 200_000, 500_000, 1_000_000)
DURATION_BINS = len(DURATION_BIN_EDGES_MS) + 1
HISTORY_GRANULARITIES = {"minute": 60, "hour": 3600}  # bucket widths in seconds


def duration_bin(duration_ms: float) -> int:
    """The histogram bin of one duration."""
    for i, edge in enumerate(DURATION_BIN_EDGES_MS):
        if duration_ms < edge:
            return i
    return len(DURATION_BIN_EDGES_MS)


def percentile(bins: Sequence[int], fraction: float, max_ms: float | None = None) -> float | None:
    """The ``fraction`` (0–1) percentile of the durations a histogram counts, interpolated linearly inside
    its bin (the open last bin ends at ``max_ms``, the longest duration seen) and never above ``max_ms``;
    None when the histogram is empty."""
    total = sum(bins)
    if total <= 0:
        return None
    rank = fraction * total
    seen = 0
    for i, count in enumerate(bins):
        if count and seen + count >= rank:
            low = DURATION_BIN_EDGES_MS[i - 1] if i else 0.0
            high = DURATION_BIN_EDGES_MS[i] if i < len(DURATION_BIN_EDGES_MS) else max(max_ms or low, low)
            value = low + (high - low) * max(rank - seen, 0) / count
            return min(value, max_ms) if max_ms is not None else value
        seen += count
    return max_ms


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """A ``chokaq_schedules`` row: the latest claimed tick, the operator's switch (None: as configured) and the
    latest job the schedule enqueued."""

    name: str
    last_tick_at: datetime
    enabled: bool | None = None
    last_job_id: str | None = None
    last_run_at: datetime | None = None


# ---------------------------------------------------------------- the result API


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job as ``chokaq_core.get_job`` reads it from whichever pillar holds it (read-only).

    ``status`` is the Hot status (Pending, Fetched, Processing), SUCCEEDED (Archive) or FAILED / CANCELLED /
    ZOMBIE (DLQ). ``started_at`` is when the latest execution started (in the DLQ: known when that execution's
    failure is in ``failed_attempts``); ``finished_at`` when it reached the Archive or the DLQ. ``result`` is the handler's
    decoded JSON return value (Archive only), ``error`` the DLQ row's error text, ``error_class`` and
    ``error_message`` the exception of the DLQ row's failure or, for a Hot job, of its latest failed execution,
    ``failed_attempts`` the attempts history (every failed execution, oldest first)."""

    id: str
    status: JobStatus
    queue: str
    type: str
    payload: Any
    tags: str | None
    priority: int | None  # Hot only: the Archive and the DLQ keep no priority
    attempts: int
    worker_id: str | None
    created_by: str | None
    created_at: datetime
    scheduled_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    result: Any = None
    error: str | None = None
    failure_reason: FailureReason | None = None
    failed_attempts: tuple[Attempt, ...] = ()
    error_class: str | None = None
    error_message: str | None = None

    @property
    def error_summary(self) -> str | None:
        """``ClassName: message`` (else the last line of ``error``)."""
        return error_summary(self.error_class, self.error_message, self.error)

    @property
    def is_finished(self) -> bool:
        """In the Archive or the DLQ (a DLQ job may still be resurrected by an operator)."""
        return self.status >= JobStatus.SUCCEEDED


# ---------------------------------------------------------------- name alphabets (ids and names go into URLs and HTML)

NAME_CHARACTERS = "0-9A-Za-z._:-"
KEY_CHARACTERS = "0-9A-Za-z._:@+=/-"
# field → (allowed characters as a regex class, maximum length)
NAME_ALPHABETS: dict[str, tuple[str, int]] = {
    "job id": (NAME_CHARACTERS, 50),
    "queue": (NAME_CHARACTERS, 255),
    "type key": (NAME_CHARACTERS, 255),
    "idempotency key": (KEY_CHARACTERS, 255),
    "rate key": (KEY_CHARACTERS, 255),
}
NAME_PATTERNS = {name: re.compile(f"[{chars}]{{1,{limit}}}") for name, (chars, limit) in NAME_ALPHABETS.items()}


def check_name(field_name: str, value: str) -> str:
    """``value`` when it fits the alphabet of ``field_name`` (``NAME_ALPHABETS``); EnvelopeError naming the field
    otherwise. Dot-only names (``.``, ``..``) are refused: as a URL path segment they would climb the path."""
    if is_valid_name(field_name, value):
        return value
    chars, limit = NAME_ALPHABETS[field_name]
    if NAME_PATTERNS[field_name].fullmatch(value):
        raise EnvelopeError(f"{field_name} must not consist of dots only, got {value!r}")
    bad = sorted({c for c in value if not re.fullmatch(f"[{chars}]", c)})
    detail = f"; it contains {''.join(bad)!r}" if bad else ""
    raise EnvelopeError(f"{field_name} must be 1-{limit} characters of [{chars}], got {value[:60]!r}{detail}")


def is_valid_name(field_name: str, value: object) -> bool:
    """Whether ``value`` fits the alphabet of ``field_name`` (for rendering rows stored before it existed)."""
    return isinstance(value, str) and bool(NAME_PATTERNS[field_name].fullmatch(value)) and bool(value.strip("."))


# ---------------------------------------------------------------- rate limits (fleet-wide, spent by the lease)

RATE_UNITS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600}
RATE_SCOPES = ("queue", "type")
DEFAULT_MAX_RATE_KEYS = 1000
MAX_RATE_COUNT = 1_000_000
_RATE = re.compile(r"(?P<count>[+-]?\d+)\s*/\s*(?P<size>[+-]?\d+(?:\.\d+)?)?\s*(?P<unit>[a-z]+)"
                   r"(?:\s+burst\s+(?P<burst>[+-]?\d+))?", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Rate:
    """A rate cap: at most ``count`` jobs per ``window`` seconds, with a token bucket of ``burst`` tokens
    (so any window holds at most ``count + burst`` claims). ``count`` 0 holds every job (a paused limit)."""

    count: int
    window: float
    burst: int

    @property
    def per_second(self) -> float:
        return self.count / self.window

    @property
    def capacity(self) -> int:
        """The bucket's size: ``burst`` tokens (none when the limit is paused)."""
        return self.burst if self.count else 0

    @property
    def text(self) -> str:
        """The canonical spelling, which ``parse_rate`` reads back (``100/m``, ``50/s burst 10``)."""
        unit = {3600: "h", 60: "m", 1: "s"}
        size = next((f"{self.window / u:g}{name}" for u, name in unit.items() if self.window % u == 0), None)
        window = size or f"{self.window:g}s"
        if window[:1] == "1" and not window[1:2].isdigit() and window[1:2] != ".":
            window = window[1:]
        text = f"{self.count}/{window}"
        return text if self.burst == default_burst(self.count) else f"{text} burst {self.burst}"


def default_burst(count: int) -> int:
    """A tenth of the window's allowance (at least one token): short bursts, an even flow."""
    return max(1, count // 10)


def parse_rate(text: object) -> Rate:
    """``"100/m"``, ``"50/s"``, ``"1000/h"``, ``"10/5m"``, optionally ``" burst 20"``; ValueError saying what is
    wrong otherwise (a count that is no whole number >= 0, a window that is not > 0, an unknown unit)."""
    if not isinstance(text, str):
        raise ValueError(f"a rate limit is a string such as '100/m', got {type(text).__name__}")
    match = _RATE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"rate limit {text!r} does not parse: write COUNT/WINDOW such as '100/m', '50/s', "
                         "'1000/h' or '10/5m', optionally followed by 'burst N'")
    count, unit = int(match["count"]), match["unit"].lower()
    if unit not in RATE_UNITS:
        raise ValueError(f"rate limit {text!r}: unknown unit {match['unit']!r} (use s, m or h)")
    size = float(match["size"]) if match["size"] is not None else 1.0
    if size <= 0:
        raise ValueError(f"rate limit {text!r}: the window must be > 0")
    if not 0 <= count <= MAX_RATE_COUNT:
        raise ValueError(f"rate limit {text!r}: the count must be within 0-{MAX_RATE_COUNT}")
    burst = int(match["burst"]) if match["burst"] is not None else default_burst(count)
    if not 1 <= burst <= MAX_RATE_COUNT:
        raise ValueError(f"rate limit {text!r}: the burst must be within 1-{MAX_RATE_COUNT}")
    return Rate(count, size * RATE_UNITS[unit], burst)


def rate_limit_name(scope: str, target: str) -> str:
    """A limit's name, ``queue:<queue>`` or ``type:<type key>``; ValueError for another scope or a bad target."""
    if scope not in RATE_SCOPES:
        raise ValueError(f"a rate limit applies to a queue or a type, not {scope!r}")
    if scope == "queue":
        return f"queue:{check_name('queue', target)}"
    return f"type:{check_name('type key', target).lower()}"  # type keys compare case-insensitively


def split_rate_limit_name(name: str) -> tuple[str, str]:
    """``("type", "payment.capture.v1")`` of ``"type:payment.capture.v1"``; ValueError for a name without a
    known scope."""
    scope, _, target = str(name).partition(":")
    rate_limit_name(scope, target)
    return scope, target


@dataclass(frozen=True, slots=True)
class RateLimit:
    """One limit in force: its name, rate, and whether each ``rate_key`` gets its own allowance (at most
    ``max_keys`` keys live at once)."""

    name: str
    rate: Rate
    per_key: bool = False
    max_keys: int = DEFAULT_MAX_RATE_KEYS

    def covers(self, queue: str, type_key: str) -> bool:
        scope, _, target = self.name.partition(":")
        return queue == target if scope == "queue" else type_key.lower() == target

    def bucket_key(self, rate_key: str | None) -> str:
        """The bucket a job counts against: its rate key under a per-key limit, else the limit's one ''."""
        return (rate_key or "") if self.per_key else ""


@dataclass(frozen=True, slots=True)
class RateBucket:
    """The token bucket of one limit (and key): its tokens as of ``refilled_at``, and the starts of the
    current display window (``window_used`` since ``window_started_at``)."""

    limit_name: str
    rate_key: str
    tokens: float
    refilled_at: datetime
    window_started_at: datetime
    window_used: int


@dataclass(frozen=True, slots=True)
class RateLimitState:
    """A limit as the Deck shows it: declared (settings, ``@job``) and overridden (an operator), with its use."""

    name: str
    declared: Rate | None
    override: Rate | None
    lifted: bool
    per_key: bool
    max_keys: int
    updated_by: str | None
    updated_at: datetime | None
    used: int = 0  # claims in the current window, summed over the keys
    live_keys: int = 0
    held_until: datetime | None = None  # when the next token arrives, while the bucket is empty

    @property
    def rate(self) -> Rate | None:
        """The rate in force: the operator's override over the declared one; None once lifted."""
        if self.lifted:
            return None
        return self.override or self.declared

    @property
    def limit(self) -> RateLimit | None:
        rate = self.rate
        return RateLimit(self.name, rate, self.per_key, self.max_keys) if rate is not None else None


class ClaimedJobs(list[HotJob]):
    """The jobs a claim under rate limits took, and in how many seconds a limit that held jobs back has its
    next token (None: nothing was held, or only by a paused limit)."""

    held_for: float | None = None


@dataclass(frozen=True, slots=True)
class BucketSpend:
    """What a lease planned on a bucket it knows: ``known`` as stored when planned, ``spent`` as it is once every
    job of ``job_ids`` has started (a token each); the lease writes it only if the stored bucket is still ``known``."""

    known: RateBucket
    spent: RateBucket
    job_ids: tuple[str, ...]


class LeasedJobs(dict[str, int]):
    """A lease's {job id: attempt} of the jobs now Processing and ours; under rate limits also the ids the
    limits held back (back to Pending, no attempt counted) and in how many seconds a limit that held jobs back
    has its next token (None: nothing was held, or only by a paused limit)."""

    held: tuple[str, ...] = ()
    held_for: float | None = None


@dataclass(frozen=True, slots=True)
class ClaimHold:
    """What a claim must skip because its limit has no token left: whole queues, job types (lower-cased) and
    ``(scope, target, rate_key)`` partitions of per-key limits."""

    queues: tuple[str, ...] = ()
    types: tuple[str, ...] = ()
    keys: tuple[tuple[str, str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.queues or self.types or self.keys)
