"""Pure decisions of the worker: backoff with jitter, failure classification (spec 02 §4–§5)
and the per-type circuit breaker (spec 03 §7).

Nothing here touches the database; time is always an argument or an injected
clock, so every rule has a unit test.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import Enum, IntEnum
from operator import attrgetter

from chokaq_core.domain import (
    BucketSpend,
    CancellationReason,
    ChokaQFatalError,
    ClaimHold,
    FailureReason,
    HotJob,
    JobCancelledError,
    Rate,
    RateBucket,
    RateLimit,
)
from chokaq_core.handlers import retry_after_seconds

MAX_DELAY_MS = 2**31 - 1
DEFAULT_FATAL: tuple[type[BaseException], ...] = (ChokaQFatalError, ValueError, TypeError, NotImplementedError)


class Kind(Enum):
    CANCELLED = "cancelled"
    FATAL = "fatal"
    THROTTLED = "throttled"
    TRANSIENT = "transient"


def root_cause(exc: BaseException) -> BaseException:
    """Follow explicit chaining (``raise … from …``) to the innermost exception."""
    seen = {id(exc)}
    while exc.__cause__ is not None and id(exc.__cause__) not in seen:
        exc = exc.__cause__
        seen.add(id(exc))
    return exc


def classify(exc: BaseException, fatal: tuple[type[BaseException], ...] = DEFAULT_FATAL) -> Kind:
    root = root_cause(exc)
    if isinstance(root, JobCancelledError) or isinstance(exc, JobCancelledError):
        return Kind.CANCELLED
    if isinstance(root, fatal) or getattr(root, "chokaq_fatal", False):
        return Kind.FATAL
    if getattr(root, "chokaq_throttled", False):
        return Kind.THROTTLED
    return Kind.TRANSIENT


def backoff_seconds(
    attempt: int, *, base: float, multiplier: float, cap: float, jitter: float, rng: random.Random | None = None
) -> float:
    """Delay after execution ``attempt`` (1-based) failed: capped exponential plus jitter that never passes the cap."""
    rng = rng or random.Random()
    try:
        raw = base * multiplier ** (attempt - 1)
    except OverflowError:
        raw = float("inf")
    capped = min(raw, cap)
    window = max(0.0, min(jitter, cap - capped))
    delay_ms = int((capped + rng.uniform(0, window)) * 1000)
    return min(delay_ms, MAX_DELAY_MS) / 1000


@dataclass(frozen=True)
class RetryPolicy:
    """How a failed execution is retried (spec 02 §5): attempts, exponential backoff with jitter, the age limit.
    Read from ``CHOKAQ["RETRY"]`` (``multiplier`` is BACKOFF_MULTIPLIER, ``jitter`` JITTER_MAX_DELAY); an operator
    may change ``max_attempts`` and ``base_delay`` of a running worker (``worker.set_retry_policy``)."""

    max_attempts: int = 3
    base_delay: float = 3.0
    max_delay: float = 3600.0
    multiplier: float = 2.0
    jitter: float = 1.0
    max_job_age: float | None = 86400.0


@dataclass(frozen=True)
class Decision:
    """What to do with a failed execution: retry after ``delay`` seconds, or move to the DLQ."""

    retry: bool
    delay: float = 0.0
    reason: FailureReason | None = None
    details: str = ""


def decide_failure(
    exc: BaseException, attempt: int, created_at: datetime, now: datetime, policy: RetryPolicy,
    fatal: tuple[type[BaseException], ...] = DEFAULT_FATAL, rng: random.Random | None = None,
) -> Decision:
    """Spec 02 §4–§5.2 for a non-cancellation exception raised by execution ``attempt``."""
    kind = classify(exc, fatal)
    text = "".join(traceback.format_exception(exc)).strip()
    if kind == Kind.FATAL:
        return Decision(False, reason=FailureReason.FATAL_ERROR, details=f"FATAL: {exc}\n{text}")
    if attempt >= policy.max_attempts:
        reason = FailureReason.THROTTLED if kind == Kind.THROTTLED else FailureReason.TRANSIENT
        return Decision(False, reason=reason, details=text)
    retry_after = retry_after_seconds(getattr(root_cause(exc), "retry_after", None)) if kind == Kind.THROTTLED else None
    if retry_after is not None:
        delay = min(retry_after, policy.max_delay)
    else:
        delay = backoff_seconds(attempt, base=policy.base_delay, multiplier=policy.multiplier, cap=policy.max_delay,
                                jitter=policy.jitter, rng=rng)
    if policy.max_job_age is not None:
        deadline = created_at + timedelta(seconds=policy.max_job_age)
        next_run = now + timedelta(seconds=delay)
        if now >= deadline or next_run > deadline:
            return Decision(
                False, reason=FailureReason.RETRY_LIFETIME_EXPIRED,
                details=(f"Retry lifetime expired: created {created_at.isoformat()}, next run would be "
                         f"{next_run.isoformat()}, MAX_JOB_AGE {policy.max_job_age:g}s. Last error:\n{text}"),
            )
    return Decision(True, delay=delay)


def cancellation_outcome(reason: CancellationReason | None) -> tuple[FailureReason | None, str]:
    """Spec 02 §8: how a cancellation ends an execution. ``None`` reason → reschedule (shutdown)."""
    if reason == CancellationReason.SHUTDOWN:
        return None, "Worker Shutdown"
    if reason == CancellationReason.ADMIN:
        return FailureReason.CANCELLED, "Cancelled by admin while running"
    if reason == CancellationReason.HEARTBEAT_FAILURE:
        return FailureReason.HEARTBEAT_FAILURE, "Heartbeat failure threshold reached"
    if reason == CancellationReason.TIMEOUT:
        return FailureReason.TIMEOUT, "Timeout: Execution Timeout"
    return FailureReason.TIMEOUT, "Unknown execution cancellation"


# ---------------------------------------------------------------- circuit breaker (spec 03 §7.3–§7.5)


class CircuitStatus(IntEnum):
    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2


@dataclass(frozen=True)
class BreakerPolicy:
    """When a circuit opens, how long it stays open and how it is probed again (spec 03 §7.3)."""

    failure_threshold: int = 5
    break_duration: float = 30.0
    half_open_max_calls: int = 1
    half_open_probe_timeout: float = 30.0
    failure_window: float = 60.0


@dataclass(frozen=True)
class Permit:
    """A one-shot lease: exactly one of success / failure / release is applied (spec 03 §7.4)."""

    key: str
    generation: int
    probe: bool


class CircuitBreaker:
    """One breaker per job type key, per worker process. ``clock`` returns seconds (monotonic)."""

    def __init__(self, key: str, policy: BreakerPolicy, clock: Callable[[], float],
                 on_event: Callable[[str, str, CircuitStatus], None] | None = None) -> None:
        self.key = key
        self.policy = policy
        self.clock = clock
        self.on_event = on_event
        self.status = CircuitStatus.CLOSED
        self.failure_count = 0
        self.last_failure: float | None = None
        self.generation = 0
        self.half_open_started = 0.0
        self.outstanding = 0
        self.probe_successes = 0
        self._lock = threading.Lock()

    def _event(self, name: str) -> None:
        if self.on_event is not None:
            self.on_event(self.key, name, self.status)

    def _open(self) -> None:
        self.status = CircuitStatus.OPEN
        self.generation += 1
        self.outstanding = 0
        self.probe_successes = 0
        self._event("opened")

    def acquire(self) -> Permit | None:
        """A permit to execute, or None (the job is deferred without consuming an attempt)."""
        with self._lock:
            now = self.clock()
            if self.status == CircuitStatus.CLOSED:
                return Permit(self.key, self.generation, probe=False)
            if self.status == CircuitStatus.OPEN:
                assert self.last_failure is not None
                if now < self.last_failure + self.policy.break_duration:
                    self._event("rejected")
                    return None
                self.status = CircuitStatus.HALF_OPEN
                self.generation += 1
                self.half_open_started = now
                self.outstanding = 0
                self.probe_successes = 0
                self._event("half_opened")
            if self.outstanding and now >= self.half_open_started + self.policy.half_open_probe_timeout:
                self.generation += 1
                self.half_open_started = now
                self.outstanding = 0
                self._event("probe_expired")
            if self.outstanding < self.policy.half_open_max_calls:
                self.outstanding += 1
                self._event("probe_acquired")
                return Permit(self.key, self.generation, probe=True)
            self._event("rejected")
            return None

    def success(self, permit: Permit) -> None:
        with self._lock:
            if permit.generation != self.generation:
                return
            if self.status == CircuitStatus.HALF_OPEN and permit.probe:
                self.outstanding = max(0, self.outstanding - 1)
                self.probe_successes += 1
                if self.probe_successes >= self.policy.half_open_max_calls:
                    self.status = CircuitStatus.CLOSED
                    self.failure_count = 0
                    self.generation += 1
                    self._event("closed")
            elif self.status == CircuitStatus.CLOSED and self.failure_count > 0:
                self.failure_count = 0

    def failure(self, permit: Permit, *, fatal: bool = False) -> None:
        with self._lock:
            if permit.generation != self.generation:
                return
            now = self.clock()
            if self.status == CircuitStatus.HALF_OPEN:
                self.failure_count += 1
                self.last_failure = now
                self._open()
                return
            if (self.failure_count > 0 and self.last_failure is not None
                    and now >= self.last_failure + self.policy.failure_window):
                self.failure_count = 0
            self.failure_count += 1
            self.last_failure = now
            if self.failure_count >= self.policy.failure_threshold or fatal:
                self._open()

    def force_close(self) -> None:
        """An operator's reset: Closed now with its failures forgotten; permits of the earlier state count for
        nothing (their outcomes are ignored, as after any state change)."""
        with self._lock:
            self.status = CircuitStatus.CLOSED
            self.failure_count = 0
            self.generation += 1
            self.outstanding = 0
            self.probe_successes = 0
            self._event("closed")

    def force_open(self) -> None:
        """An operator's open: Open now for a full break duration, as if a failure had just tripped it."""
        with self._lock:
            self.last_failure = self.clock()
            self._open()

    def release(self, permit: Permit) -> None:
        """No outcome (lease lost, cancellation, timeout, shutdown): frees a probe slot."""
        with self._lock:
            if permit.generation == self.generation and permit.probe and self.outstanding:
                self.outstanding -= 1
                self._event("permit_released")

    def snapshot(self) -> dict[str, object]:
        """The registry's view (spec 03 §7.5). ``resetAtUtc`` (ISO 8601, only when Open) is converted from
        this process's monotonic clock to wall-clock UTC, so that other processes (the Deck) can read it."""
        with self._lock:
            reset_at: str | None = None
            if self.status == CircuitStatus.OPEN and self.last_failure is not None:
                remaining = self.last_failure + self.policy.break_duration - self.clock()
                reset_at = (datetime.now(UTC) + timedelta(seconds=remaining)).isoformat()
            return {"circuitKey": self.key, "status": int(self.status), "failureCount": self.failure_count,
                    "resetAtUtc": reset_at}


class CircuitBreakers:
    """The breakers of one worker process, created on first use per type key."""

    def __init__(self, default: BreakerPolicy, overrides: dict[str, BreakerPolicy] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 on_event: Callable[[str, str, CircuitStatus], None] | None = None) -> None:
        self.default = default
        self.overrides = {k.lower(): v for k, v in (overrides or {}).items()}
        self.clock = clock
        self.on_event = on_event
        self._breakers: dict[str, CircuitBreaker] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> CircuitBreaker:
        lowered = key.lower()
        with self._lock:
            breaker = self._breakers.get(lowered)
            if breaker is None:
                breaker = CircuitBreaker(key, self.overrides.get(lowered, self.default), self.clock, self.on_event)
                self._breakers[lowered] = breaker
            return breaker

    def snapshot(self) -> list[dict[str, object]]:
        with self._lock:
            breakers = list(self._breakers.values())
        return [b.snapshot() for b in breakers]


def is_circuit_fatal(exc: BaseException) -> bool:
    """Only exceptions marked circuit-fatal open the circuit at once (spec 02 §5.2)."""
    return bool(getattr(root_cause(exc), "chokaq_circuit_fatal", False))


# ---------------------------------------------------------------- rate limits: token buckets


def refilled(rate: Rate, bucket: RateBucket | None, now: datetime) -> float:
    """A bucket's tokens at ``now``: what it held, plus ``rate`` per second since, at most its capacity. A bucket
    never written (or dropped once refilled) holds one token: a new limit, or a new key, starts at its rate, and
    only an idle spell lets it save up a burst (so a saturated drain starts no burst on top of the rate)."""
    if bucket is None:
        return float(min(1, rate.capacity))
    elapsed = max(0.0, (now - bucket.refilled_at).total_seconds())
    return min(float(rate.capacity), bucket.tokens + elapsed * rate.per_second)


def next_token_at(rate: Rate, tokens: float, now: datetime) -> datetime | None:
    """When a bucket holding ``tokens`` has one whole token: ``now`` if it has; None if it never will (paused)."""
    if tokens >= 1:
        return now
    if rate.count == 0:
        return None
    return now + timedelta(seconds=(1 - tokens) / rate.per_second)


def window_use(rate: Rate, bucket: RateBucket | None, now: datetime) -> int:
    """The claims counted in the bucket's current window (0 once that window is over)."""
    if bucket is None or (now - bucket.window_started_at).total_seconds() >= rate.window:
        return 0
    return bucket.window_used


type Slot = tuple[str, str]  # a bucket: (limit name, rate key)


@dataclass
class RatePlan:
    """What jobs may take under the limits in force, decided from their buckets at the database's time ``now``.
    The claim reads the buckets: ``hold`` tells it what to skip and ``admit`` keeps the claimed jobs within the
    tokens there are now (it writes nothing). The lease spends the tokens: under the limits' locks ``admit``
    keeps the jobs to start within the tokens (in claim order), ``give_back`` returns those the lease did not
    start after all, and ``changes`` gives the buckets to write in the lease's transaction; planned on the known
    buckets, ``spends`` gives the compare-and-set writes instead."""

    limits: Sequence[RateLimit]
    buckets: dict[Slot, RateBucket]
    now: datetime
    taken: Counter[Slot] = field(default_factory=Counter)
    held: Counter[str] = field(default_factory=Counter)  # jobs admit sent back, per limit that had no token
    clock: datetime | None = None  # the database's time as read (or estimated), when ``now`` is a bucket's later one
    # per plan, so computed once per batch: the buckets a (queue, type, rate key) takes from, each bucket's tokens
    _covering: dict[tuple[str, str, str | None], tuple[tuple[RateLimit, Slot], ...]] = field(
        default_factory=dict, repr=False)
    _refilled: dict[Slot, float] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, limits: Sequence[RateLimit], buckets: Sequence[RateBucket], now: datetime) -> RatePlan:
        """The plan's moment is ``now``, or the latest moment a bucket was spent at when that is later: a lease that
        waited for another's lock (its clock read before the wait) or plans on an estimate of the clock can find a
        bucket written at a later moment. Its jobs start at the plan's moment, so the stored start times never run
        ahead of the buckets' time and hold the limit's bound (rate × window + burst) with no slack."""
        return cls(limits, {(b.limit_name, b.rate_key): b for b in buckets},
                   max([now, *(b.refilled_at for b in buckets)]), clock=now)

    def _live_keys(self, limit: RateLimit) -> int:
        """Stored partitions of a per-key limit that have not refilled (a refilled one may be dropped)."""
        return sum(1 for (name, _), b in self.buckets.items()
                   if name == limit.name and refilled(limit.rate, b, self.now) < limit.rate.capacity) + sum(
            1 for (name, key) in self.taken if name == limit.name and (name, key) not in self.buckets)

    def available(self, limit: RateLimit, key: str) -> float:
        """Tokens left for partition ``key`` of ``limit`` after what this claim took."""
        slot = (limit.name, key)
        bucket = self.buckets.get(slot)
        if bucket is None and limit.per_key and slot not in self.taken and self._live_keys(limit) >= limit.max_keys:
            return 0.0  # a new key while max_keys keys are live: held until one refills
        tokens = self._refilled.get(slot)
        if tokens is None:  # the plan's moment is fixed: each bucket refills once
            tokens = self._refilled[slot] = refilled(limit.rate, bucket, self.now)
        return tokens - self.taken[slot]

    def hold(self) -> ClaimHold:
        """The queues, types and partitions without a whole token."""
        queues: list[str] = []
        types: list[str] = []
        keys: list[tuple[str, str, str]] = []
        for limit in self.limits:
            scope, _, target = limit.name.partition(":")
            if limit.rate.capacity == 0 or (not limit.per_key and self.available(limit, "") < 1):
                (queues if scope == "queue" else types).append(target if scope == "queue" else target.lower())
            elif limit.per_key:
                keys += [(scope, target, key) for (name, key) in self.buckets
                         if name == limit.name and self.available(limit, key) < 1]
        return ClaimHold(tuple(queues), tuple(types), tuple(keys))

    def plentiful(self, jobs: int) -> bool:
        """Whether every limit, none of them per key (a key's bucket is unknown before its rows are claimed), has
        ``jobs`` tokens left: a claim of ``jobs`` rows then has nothing to hold back."""
        return all(not limit.per_key and self.available(limit, "") >= jobs for limit in self.limits)

    def _slots(self, job: HotJob) -> tuple[tuple[RateLimit, Slot], ...]:
        kind = (job.queue, job.type, job.rate_key)
        covering = self._covering.get(kind)
        if covering is None:
            covering = self._covering[kind] = tuple(
                (limit, (limit.name, limit.bucket_key(job.rate_key))) for limit in self.limits
                if limit.covers(job.queue, job.type))
        return covering

    def slots(self, job: HotJob) -> list[Slot]:
        """The buckets ``(limit name, key)`` a start of ``job`` takes a token from."""
        return [slot for _, slot in self._slots(job)]

    def admit(self, jobs: Sequence[HotJob]) -> tuple[list[HotJob], list[HotJob]]:
        """``(kept, released)``: each job is kept while every limit covering it has a token for its key."""
        if self._take_all(jobs):
            return list(jobs), []
        kept: list[HotJob] = []
        released: list[HotJob] = []
        taken = self.taken
        for job in jobs:
            slots = self._slots(job)
            short = [limit.name for limit, (_, key) in slots if self.available(limit, key) < 1]
            if short:
                self.held.update(short)
                released.append(job)
            else:
                for _, slot in slots:
                    taken[slot] += 1
                kept.append(job)
        return kept, released

    def _take_all(self, jobs: Sequence[HotJob]) -> bool:
        """Take every job's tokens at once when each stored bucket they take from holds all of them (a limit far
        above its rate): what ``admit`` would decide job by job, counted per bucket; False (nothing taken)
        otherwise."""
        need: dict[Slot, int] = {}
        limit_of: dict[Slot, RateLimit] = {}
        for job in jobs:
            for limit, slot in self._slots(job):
                need[slot] = need.get(slot, 0) + 1
                limit_of[slot] = limit
        if not all(slot in self.buckets and self.available(limit_of[slot], slot[1]) >= count
                   for slot, count in need.items()):
            return False
        self.taken.update(need)
        return True

    def give_back(self, jobs: Sequence[HotJob]) -> None:
        """Return the tokens ``admit`` took for ``jobs`` (admitted, then not started: no longer ours)."""
        if not jobs:
            return
        for job in jobs:
            self.taken.subtract(self.slots(job))
        self.taken = +self.taken  # no slot left at zero: it took nothing

    def claimed(self) -> dict[str, int]:
        """Jobs that took a token, per limit (summed over its keys)."""
        per_limit: dict[str, int] = {}
        for (name, _), count in self.taken.items():
            per_limit[name] = per_limit.get(name, 0) + count
        return per_limit

    def next_token_in(self) -> float | None:
        """Seconds until the first limit without a whole token has one (None when none lacks one, or only paused
        ones do)."""
        waits = []
        for limit in self.limits:
            keys = {key for (name, key) in (*self.buckets, *self.taken) if name == limit.name} | {""}
            for key in keys if limit.per_key else {""}:
                tokens = self.available(limit, key)
                at = next_token_at(limit.rate, tokens, self.now) if tokens < 1 else None
                if at is not None:
                    waits.append((at - self.now).total_seconds())
        return min(waits, default=None)

    def _spent(self, limit: RateLimit, bucket: RateBucket, count: int) -> RateBucket:
        """``bucket`` (stored) once ``count`` more jobs took a token each at the plan's moment."""
        used = window_use(limit.rate, bucket, self.now)
        return RateBucket(bucket.limit_name, bucket.rate_key, refilled(limit.rate, bucket, self.now) - count,
                          max(self.now, bucket.refilled_at), bucket.window_started_at if used else self.now,
                          count + used)

    def changes(self) -> tuple[list[RateBucket], list[RateBucket], list[Slot]]:
        """``(changed, added, dropped)`` buckets: the ones this claim took tokens from, and the refilled
        partitions of per-key limits (deleted, so the table holds only live keys; a key that comes back starts
        again from one token, never more than it would have had). Each list is in (limit, key) order: the order
        every lease locks and writes buckets in, so two leases never wait on each other's locks in a circle."""
        changed: list[RateBucket] = []
        added: list[RateBucket] = []
        dropped: list[Slot] = []
        by_name = {limit.name: limit for limit in self.limits}
        for (name, key), count in self.taken.items():
            limit, bucket = by_name[name], self.buckets.get((name, key))
            if bucket is None:
                added.append(RateBucket(name, key, refilled(limit.rate, bucket, self.now) - count, self.now, self.now,
                                        count))
            else:
                changed.append(self._spent(limit, bucket, count))
        for (name, key), stored in self.buckets.items():
            owner = by_name.get(name)
            if (owner is not None and owner.per_key and (name, key) not in self.taken
                    and refilled(owner.rate, stored, self.now) >= owner.rate.capacity
                    and window_use(owner.rate, stored, self.now) == 0):
                dropped.append((name, key))
        slot = attrgetter("limit_name", "rate_key")
        return sorted(changed, key=slot), sorted(added, key=slot), sorted(dropped)

    def spends(self, admitted: Sequence[HotJob]) -> list[BucketSpend] | None:
        """The compare-and-set writes of a lease planned on known buckets, once ``admit`` kept ``admitted``: each
        bucket they take from, as known and as spent, with the ids it pays for, in (limit, key) order (as
        ``changes``); None when one of those buckets is not stored yet (the locked lease adds it)."""
        paid: dict[Slot, list[str]] = {}
        limit_of: dict[Slot, RateLimit] = {}
        for job in admitted:
            for limit, slot in self._slots(job):
                paid.setdefault(slot, []).append(job.id)
                limit_of[slot] = limit
        spends: list[BucketSpend] = []
        for slot in sorted(paid):
            bucket = self.buckets.get(slot)
            if bucket is None:
                return None
            spends.append(BucketSpend(bucket, self._spent(limit_of[slot], bucket, self.taken[slot]), tuple(paid[slot])))
        return spends
