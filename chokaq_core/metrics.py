"""The instruments of spec 05 §2, for Prometheus and OpenTelemetry.

Two kinds of series are exposed:

* **process instruments** (:data:`INSTRUMENTS`), recorded where things happen (enqueue commits, the
  worker's executions, the rescue sweep, circuit breakers, the idempotency
  middleware): ``chokaq_jobs_enqueued_total``, ``chokaq_jobs_completed_total``,
  ``chokaq_jobs_failed_total``, ``chokaq_jobs_processing_duration`` (ms),
  ``chokaq_jobs_queue_lag`` (ms), ``chokaq_jobs_dlq_total``,
  ``chokaq_jobs_retried_total``, ``chokaq_workers_active``,
  ``chokaq_jobs_heartbeat_failures_total``,
  ``chokaq_jobs_state_transition_conflicts_total``,
  ``chokaq_idempotency_claims_total``, ``chokaq_circuits_events_total``,
  ``chokaq_rate_limit_claimed_total`` and ``chokaq_rate_limit_held_total`` (jobs whose lease took a token of
  a rate limit / sent back to Pending at their lease for want of a token; label ``limit``, the limit's name —
  keys are never labels).
  They are recorded in this module's own series, not in prometheus_client's: only a process that serves
  metrics imports prometheus_client.
  The same instruments go to the OpenTelemetry meter ``ChokaQ`` 1.0.0 under
  their dotted names (a no-op unless the host configures a MeterProvider).
* **fleet gauges** read from the database at scrape time, by ``chokaq_core.prometheus``, which serves both
  from its ``REGISTRY``.

Label values pass the cardinality guard of spec 05 §2: trimmed, cut to
``METRICS.MAX_TAG_VALUE_LENGTH``, blank → ``UNKNOWN_TAG_VALUE``; the first N
distinct values of a family pass and later ones become ``OVERFLOW_TAG_VALUE``.
Markup, quotes, backslashes and control characters in a value become
``_``: a queue named ``<img onerror=…>`` before names had an alphabet never
reaches a scrape body as markup.

The web process serves ``/deck/metrics``; a worker serves the same registry with
``chokaq_worker --metrics-port N`` (both through ``chokaq_core.prometheus``).
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
import threading
import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from chokaq_core.conf import config
from chokaq_core.domain import Failure, FailureReason, HotJob, NewJob, Retry, Success

logger = logging.getLogger("chokaq.metrics")

OTEL_METER_NAME = "ChokaQ"
OTEL_METER_VERSION = "1.0.0"
MS_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000, 300_000, 900_000)

# ---------------------------------------------------------------- cardinality guard


_UNSAFE_LABEL_CHARACTERS = re.compile(r"[<>&\"'`\\\x00-\x1f\x7f]")


class TagGuard:
    """Process-local guard of one tag family: the first ``limit`` distinct values pass."""

    def __init__(self, family: str, limit_key: str) -> None:
        self.family = family
        self.limit_key = limit_key
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: Any) -> str:
        settings = config().METRICS
        text = "" if value is None else _UNSAFE_LABEL_CHARACTERS.sub("_", str(value)).strip()
        text = text[: settings.MAX_TAG_VALUE_LENGTH] if text else str(settings.UNKNOWN_TAG_VALUE).strip()
        with self._lock:
            if text in self._seen:
                return text
            if len(self._seen) < settings[self.limit_key]:
                self._seen.add(text)
                return text
        return str(settings.OVERFLOW_TAG_VALUE).strip()

    def reset(self) -> None:
        with self._lock:
            self._seen.clear()
        _job_label_cache.clear()
        _execution_series.clear()


queue_tag = TagGuard("queue", "MAX_QUEUE_TAG_VALUES")
type_tag = TagGuard("type", "MAX_JOB_TYPE_TAG_VALUES")
error_tag = TagGuard("error", "MAX_ERROR_TAG_VALUES")
reason_tag = TagGuard("reason", "MAX_FAILURE_REASON_TAG_VALUES")  # reason, transition, outcome, state, event
limit_tag = TagGuard("limit", "MAX_JOB_TYPE_TAG_VALUES")  # rate-limit names (queue:… / type:…), never their keys
GUARDS = (queue_tag, type_tag, error_tag, reason_tag, limit_tag)


# ---------------------------------------------------------------- instruments


class Instrument:
    """One process instrument: its series by label values. Recording is this module's own arithmetic (a lock and
    an addition per series, as prometheus_client's values do); ``chokaq_core.prometheus`` turns the series into
    Prometheus families at scrape time. A worker that serves no metrics thus never imports prometheus_client
    and the exposition's stdlib (HTTP server, urllib, wsgiref): ~1 MiB of every worker process."""

    kind = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: list[Instrument] | None = None) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._series: dict[tuple[str, ...], Any] = {}
        self._lock = threading.Lock()
        if registry is not None:
            registry.append(self)

    def labels(self, **labels: Any) -> Any:
        """The series of these label values (created on first use; every label name is required, as in
        prometheus_client)."""
        if len(labels) != len(self.labelnames) or set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name}: labels {sorted(labels)} are not {list(self.labelnames)}")
        key = tuple(str(labels[name]) for name in self.labelnames)
        series = self._series.get(key)
        if series is None:
            with self._lock:
                series = self._series.get(key)
                if series is None:
                    series = self._series[key] = self._new_series()
        return series

    def series(self) -> list[tuple[tuple[str, ...], Any]]:
        """(label values, series) in the order the series were created."""
        with self._lock:
            return list(self._series.items())

    def _new_series(self) -> Any:
        raise NotImplementedError


class CounterSeries:
    __slots__ = ("_lock", "created", "value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        with self._lock:
            self.value += amount


class GaugeSeries:
    __slots__ = ("_lock", "value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        with self._lock:
            self.value += amount

    def dec(self, amount: float = 1) -> None:
        with self._lock:
            self.value -= amount


class HistogramSeries:
    __slots__ = ("_lock", "bounds", "buckets", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._lock = threading.Lock()
        self.bounds = bounds  # ascending, the last +Inf
        self.buckets = [0.0] * len(bounds)  # observations per bucket (not cumulative)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        index = bisect_left(self.bounds, amount) if amount == amount else len(self.bounds)  # NaN: in no bucket
        with self._lock:
            self.sum += amount
            if index < len(self.buckets):
                self.buckets[index] += 1

    def snapshot(self) -> tuple[list[float], float]:
        """The bucket counts and the sum, read together."""
        with self._lock:
            return list(self.buckets), self.sum


class Counter(Instrument):
    kind = "counter"

    def _new_series(self) -> CounterSeries:
        return CounterSeries()


class Gauge(Instrument):
    kind = "gauge"

    def _new_series(self) -> GaugeSeries:
        return GaugeSeries()


class Histogram(Instrument):
    kind = "histogram"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float],
                 registry: list[Instrument] | None = None) -> None:
        super().__init__(name, documentation, labelnames, registry)
        bounds = tuple(float(b) for b in buckets)
        self.bounds = bounds if bounds and bounds[-1] == math.inf else (*bounds, math.inf)  # as prometheus_client

    def _new_series(self) -> HistogramSeries:
        return HistogramSeries(self.bounds)


INSTRUMENTS: list[Instrument] = []  # in the exposition's order

ENQUEUED = Counter("chokaq_jobs_enqueued", "New (non-duplicate) jobs committed.", ["queue", "type"],
                   registry=INSTRUMENTS)
COMPLETED = Counter("chokaq_jobs_completed", "Successful executions.", ["queue", "type"], registry=INSTRUMENTS)
FAILED = Counter("chokaq_jobs_failed", "Executions that raised (not cancellations); error = exception class.",
                 ["queue", "type", "error"], registry=INSTRUMENTS)
PROCESSING_DURATION = Histogram("chokaq_jobs_processing_duration", "Handler duration of successes, milliseconds.",
                                ["queue", "type"], buckets=MS_BUCKETS, registry=INSTRUMENTS)
QUEUE_LAG = Histogram("chokaq_jobs_queue_lag", "Wait from due time to execution start, milliseconds.",
                      ["queue", "type"], buckets=MS_BUCKETS, registry=INSTRUMENTS)
DLQ = Counter("chokaq_jobs_dlq", "Moves to the DLQ; reason = FailureReason name.", ["queue", "type", "reason"],
              registry=INSTRUMENTS)
RETRIED = Counter("chokaq_jobs_retried", "Transient/throttled reschedules; attempt = next execution number.",
                  ["queue", "type", "attempt"], registry=INSTRUMENTS)
ACTIVE = Gauge("chokaq_workers_active", "Executions running in this process.", ["queue"], registry=INSTRUMENTS)
HEARTBEAT_FAILURES = Counter("chokaq_jobs_heartbeat_failures", "Failed job heartbeat writes.", ["queue", "type"],
                             registry=INSTRUMENTS)
CONFLICTS = Counter("chokaq_jobs_state_transition_conflicts", "Worker transitions that changed no row.",
                    ["queue", "type", "transition"], registry=INSTRUMENTS)
IDEMPOTENCY_CLAIMS = Counter("chokaq_idempotency_claims", "Idempotency middleware outcomes.", ["outcome"],
                             registry=INSTRUMENTS)
RATE_LIMIT_CLAIMED = Counter("chokaq_rate_limit_claimed", "Jobs started under a rate limit (its tokens spent).",
                             ["limit"], registry=INSTRUMENTS)
RATE_LIMIT_HELD = Counter("chokaq_rate_limit_held", "Jobs sent back to Pending at their lease: the limit had no token.",
                          ["limit"], registry=INSTRUMENTS)
CIRCUIT_EVENTS = Counter("chokaq_circuits_events", "Circuit breaker events.", ["type", "state", "event"],
                         registry=INSTRUMENTS)


class _Otel:
    """The same instruments on the OpenTelemetry meter ``ChokaQ`` (absent API: nothing is recorded).

    They are created once the host has loaded the OpenTelemetry metrics API (configuring a MeterProvider
    imports it) or names its provider in ``OTEL_PYTHON_METER_PROVIDER``. Until then no provider exists, so a
    measurement would go to the API's no-op proxies: the API (~1 MiB with its entry-point lookups) is not
    loaded into a process that exports nothing."""

    def __init__(self) -> None:
        self._instruments: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._provider_named = bool(os.environ.get("OTEL_PYTHON_METER_PROVIDER"))  # the environment the process started with

    def get(self, name: str) -> Any:
        if self._instruments is None:
            if not self._provider_named and "opentelemetry.metrics" not in sys.modules:
                return None
            with self._lock:
                if self._instruments is None:
                    self._instruments = self._build()
        return self._instruments.get(name)

    @staticmethod
    def _build() -> dict[str, Any]:
        try:
            from opentelemetry import metrics as otel
        except ImportError:
            return {}
        meter = otel.get_meter(OTEL_METER_NAME, OTEL_METER_VERSION)
        counters = ("chokaq.jobs.enqueued", "chokaq.jobs.completed", "chokaq.jobs.failed", "chokaq.jobs.dlq",
                    "chokaq.jobs.retried", "chokaq.jobs.heartbeat_failures", "chokaq.jobs.state_transition_conflicts",
                    "chokaq.idempotency.claims", "chokaq.circuits.events", "chokaq.rate_limit.claimed",
                    "chokaq.rate_limit.held")
        instruments: dict[str, Any] = {name: meter.create_counter(name) for name in counters}
        instruments["chokaq.jobs.processing_duration"] = meter.create_histogram("chokaq.jobs.processing_duration",
                                                                                unit="ms")
        instruments["chokaq.jobs.queue_lag"] = meter.create_histogram("chokaq.jobs.queue_lag", unit="ms")
        instruments["chokaq.workers.active"] = meter.create_up_down_counter("chokaq.workers.active")
        return instruments


OTEL = _Otel()


_children: dict[tuple[int, tuple[tuple[str, str], ...]], Any] = {}


def _child(metric: Any, labels: dict[str, str]) -> Any:
    """``metric.labels(**labels)``, remembered: the worker records a few per job, and labels() checks and locks."""
    key = (id(metric), tuple(labels.items()))
    child = _children.get(key)
    if child is None:
        if len(_children) >= _LABEL_CACHE_SIZE:
            _children.clear()
        child = _children[key] = metric.labels(**labels)
    return child


def _add(counter: Counter, otel_name: str, labels: dict[str, str], amount: float = 1) -> None:
    _count(_child(counter, labels), otel_name, labels, amount)


def _count(child: Any, otel_name: str, labels: dict[str, str], amount: float = 1) -> None:
    """A counter's labelled ``child`` (and its OpenTelemetry instrument, when one is configured) goes up."""
    child.inc(amount)
    instrument = OTEL.get(otel_name)
    if instrument is not None:
        instrument.add(amount, labels)


def _observe(histogram: Histogram, otel_name: str, labels: dict[str, str], value: float) -> None:
    _measure(_child(histogram, labels), otel_name, labels, value)


def _measure(child: Any, otel_name: str, labels: dict[str, str], value: float) -> None:
    """A histogram's labelled ``child`` (and its OpenTelemetry instrument, when one is configured) records ``value``."""
    child.observe(value)
    instrument = OTEL.get(otel_name)
    if instrument is not None:
        instrument.record(value, labels)


def _safely(func: Any) -> Any:
    """Metrics never break the engine: a recording error is logged and swallowed."""

    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            func(*args, **kwargs)
        except Exception:
            logger.debug("metric %s not recorded", func.__name__, exc_info=True)

    wrapper.__name__ = func.__name__
    wrapper.__doc__ = func.__doc__
    return wrapper


_LABEL_CACHE_SIZE = 10_000
_job_label_cache: dict[tuple[str | None, str | None], dict[str, str]] = {}
_job_label_cache_config: list[Any] = [None]  # the Config object the cache was filled under


def _job_labels(queue: str | None, job_type: str | None) -> dict[str, str]:
    """The guarded (queue, type) labels. Memoised: a worker asks for the same few pairs thousands of times a
    second; emptied when the settings change or a guard is reset. Callers must not mutate the result."""
    current = config()
    if _job_label_cache_config[0] is not current:
        _job_label_cache.clear()
        _execution_series.clear()
        _job_label_cache_config[0] = current
    key = (queue, job_type)
    labels = _job_label_cache.get(key)
    if labels is None:
        labels = {"queue": queue_tag(queue), "type": type_tag(job_type)}
        if len(_job_label_cache) < _LABEL_CACHE_SIZE:
            _job_label_cache[key] = labels
    return labels


def _count_jobs(counter: Counter, otel_name: str, jobs: Iterable[NewJob | HotJob]) -> None:
    """One on ``counter`` per job, labelled by its queue and type: one increment per (queue, type) of the batch,
    by its count (a bulk enqueue is one or a few pairs)."""
    counts: dict[tuple[str, str], int] = {}
    for job in jobs:
        key = (job.queue, job.type)
        counts[key] = counts.get(key, 0) + 1
    for (queue, job_type), n in counts.items():
        _add(counter, otel_name, _job_labels(queue, job_type), n)


# ---------------------------------------------------------------- recording points


@_safely
def jobs_enqueued(jobs: Sequence[NewJob]) -> None:
    _count_jobs(ENQUEUED, "chokaq.jobs.enqueued", jobs)


class ExecutionSeries:
    """The series one (queue, type) records into at every execution: the queue lag, the active gauge, the completed
    counter and the duration. Looked up once per execution (``_execution_series_of``) instead of a labelled child
    per record."""

    __slots__ = ("active", "completed", "duration", "labels", "lag", "queue_labels")

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels
        self.queue_labels = {"queue": labels["queue"]}
        self.lag = _child(QUEUE_LAG, labels)
        self.active = _child(ACTIVE, self.queue_labels)
        self.completed = _child(COMPLETED, labels)
        self.duration = _child(PROCESSING_DURATION, labels)


_execution_series: dict[tuple[str | None, str | None], ExecutionSeries] = {}


def _execution_series_of(queue: str | None, job_type: str | None) -> ExecutionSeries:
    """The memoised series of (queue, type), emptied with the label cache (settings changed, a guard reset)."""
    labels = _job_labels(queue, job_type)  # first: it empties both caches when the settings changed
    series = _execution_series.get((queue, job_type))
    if series is None or series.labels is not labels:
        series = ExecutionSeries(labels)
        if len(_execution_series) < _LABEL_CACHE_SIZE:
            _execution_series[(queue, job_type)] = series
    return series


@_safely
def execution_started(job: HotJob) -> None:
    series = _execution_series_of(job.queue, job.type)
    due = job.scheduled_at or job.created_at
    lag_ms = max(0.0, (datetime.now(UTC) - due).total_seconds() * 1000)
    _measure(series.lag, "chokaq.jobs.queue_lag", series.labels, lag_ms)
    series.active.inc()
    active = OTEL.get("chokaq.workers.active")
    if active is not None:
        active.add(1, series.queue_labels)


@_safely
def execution_ended(job: HotJob) -> None:
    series = _execution_series_of(job.queue, job.type)
    series.active.dec()
    active = OTEL.get("chokaq.workers.active")
    if active is not None:
        active.add(-1, series.queue_labels)


@_safely
def job_failed(job: HotJob, exc: BaseException) -> None:
    labels = {**_job_labels(job.queue, job.type), "error": error_tag(type(exc).__name__)}
    _add(FAILED, "chokaq.jobs.failed", labels)


@_safely
def execution_outcome(job: HotJob, outcome: Any, shutdown: bool = False) -> None:
    """Success → completed + duration; Retry → retried (not for a shutdown reschedule); Failure → dlq."""
    if isinstance(outcome, Success):
        series = _execution_series_of(job.queue, job.type)
        _count(series.completed, "chokaq.jobs.completed", series.labels)
        if outcome.duration_ms is not None:
            _measure(series.duration, "chokaq.jobs.processing_duration", series.labels, outcome.duration_ms)
        return
    labels = _job_labels(job.queue, job.type)
    if isinstance(outcome, Retry) and not shutdown:
        _add(RETRIED, "chokaq.jobs.retried", {**labels, "attempt": str(outcome.attempt_count + 1)})
    elif isinstance(outcome, Failure):
        _add(DLQ, "chokaq.jobs.dlq", {**labels, "reason": reason_tag(FailureReason(outcome.reason).display_name)})


@_safely
def zombies_moved(moved: Iterable[tuple[str, str]]) -> None:
    for _job_id, queue in moved:
        _add(DLQ, "chokaq.jobs.dlq", {**_job_labels(queue, None), "reason": reason_tag("Zombie")})


@_safely
def transition_conflict(transition: str, queue: str | None = None, job_type: str | None = None, count: int = 1) -> None:
    labels = {**_job_labels(queue, job_type), "transition": reason_tag(transition)}
    _add(CONFLICTS, "chokaq.jobs.state_transition_conflicts", labels, count)


@_safely
def completion_conflicts(outcomes: Iterable[Any]) -> None:
    """Outcomes whose completion changed no row (the worker lost ownership)."""
    for outcome in outcomes:
        if isinstance(outcome, Retry):
            name = "RescheduleForRetry"
        elif isinstance(outcome, Failure):
            name = "ArchiveCancelled" if outcome.reason == FailureReason.CANCELLED else "ArchiveFailed"
        else:
            name = "ArchiveSucceeded"
        transition_conflict(name)


@_safely
def heartbeat_failed(jobs: Iterable[HotJob]) -> None:
    _count_jobs(HEARTBEAT_FAILURES, "chokaq.jobs.heartbeat_failures", jobs)


@_safely
def idempotency_claim(outcome: str) -> None:
    _add(IDEMPOTENCY_CLAIMS, "chokaq.idempotency.claims", {"outcome": reason_tag(outcome)})


@_safely
def circuit_event(key: str, event: str, state: str) -> None:
    labels = {"type": type_tag(key), "state": reason_tag(state), "event": reason_tag(event)}
    _add(CIRCUIT_EVENTS, "chokaq.circuits.events", labels)


@_safely
def rate_limited(claimed: dict[str, int], held: dict[str, int]) -> None:
    """A committed lease under rate limits: jobs that took a token and jobs sent back, per limit."""
    for name, count in claimed.items():
        _add(RATE_LIMIT_CLAIMED, "chokaq.rate_limit.claimed", {"limit": limit_tag(name)}, count)
    for name, count in held.items():
        _add(RATE_LIMIT_HELD, "chokaq.rate_limit.held", {"limit": limit_tag(name)}, count)
