"""Prometheus exposition (spec 05 §2): the process instruments of ``chokaq_core.metrics`` plus fleet
gauges read from the database at scrape time (one cheap read per family): queue depth by status, queue
lag, retained Archive/DLQ counters, outcomes of the last minute, worker heartbeat age and capacity,
circuit states reported by the worker registry, and each rate limit's count, use this window and the due
jobs it holds back (label ``limit``: the limit's name; keys are never labels).

The web process serves it as ``/deck/metrics`` (:func:`exposition`); a worker with
``chokaq_worker --metrics-port N`` (:func:`serve`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, start_http_server
from prometheus_client import metrics as client_metrics
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from chokaq_core import storage
from chokaq_core.domain import RateBucket, RateLimitState
from chokaq_core.metrics import INSTRUMENTS, Instrument, limit_tag, queue_tag, reason_tag, type_tag
from chokaq_core.policy import refilled, window_use

logger = logging.getLogger("chokaq.metrics")

__all__ = ["CONTENT_TYPE_LATEST", "REGISTRY", "FleetCollector", "InstrumentCollector", "exposition", "serve"]


class InstrumentCollector(Collector):
    """The process instruments of ``chokaq_core.metrics`` as prometheus_client's own Counter, Histogram and Gauge
    expose them: the same families, samples (``_total``, ``_bucket``/``_count``/``_sum``, ``_created`` unless
    prometheus_client's created series are disabled), labels and order."""

    def __init__(self, instruments: Sequence[Instrument] = INSTRUMENTS) -> None:
        self.instruments = instruments

    def describe(self) -> list[Metric]:
        return [Metric(i.name, i.documentation, i.kind) for i in self.instruments]

    def collect(self) -> Iterator[Metric]:
        created = getattr(client_metrics, "_use_created", True)  # prometheus_client's switch (env or call)
        for instrument in self.instruments:
            family = Metric(instrument.name, instrument.documentation, instrument.kind)
            name = instrument.name
            for values, series in instrument.series():
                labels = dict(zip(instrument.labelnames, values, strict=True))
                if instrument.kind == "counter":
                    family.add_sample(name + "_total", labels, series.value)
                    if created:
                        family.add_sample(name + "_created", labels, series.created)
                elif instrument.kind == "gauge":
                    family.add_sample(name, labels, series.value)
                else:
                    buckets, total = series.snapshot()
                    cumulative = 0.0
                    for bound, count in zip(series.bounds, buckets, strict=True):
                        cumulative += count
                        family.add_sample(name + "_bucket", {**labels, "le": floatToGoString(bound)}, cumulative)
                    family.add_sample(name + "_count", labels, cumulative)
                    if series.bounds[0] >= 0:
                        family.add_sample(name + "_sum", labels, total)
                    if created:
                        family.add_sample(name + "_created", labels, series.created)
            yield family


class FleetCollector(Collector):
    """Gauges from the database, read once per scrape (a failed read exports chokaq_scrape_error 1)."""

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # nothing is read from the database at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        error = GaugeMetricFamily("chokaq_scrape_error", "1 when the last scrape could not read the database.")
        try:
            families = list(self._families())
        except Exception:
            logger.warning("metrics scrape could not read the database", exc_info=True)
            error.add_metric([], 1)
            yield error
            return
        error.add_metric([], 0)
        yield error
        yield from families

    @staticmethod
    def _families() -> Iterator[GaugeMetricFamily]:
        now = datetime.now(UTC)
        depth = GaugeMetricFamily("chokaq_queue_depth", "Hot rows by queue and status.", labels=["queue", "status"])
        retained = GaugeMetricFamily("chokaq_jobs_retained", "Rows kept in Archive/DLQ (StatsSummary counters).",
                                     labels=["queue", "pillar"])
        for q in storage.queue_stats():
            queue = queue_tag(q.queue)
            for status, value in (("pending", q.pending), ("fetched", q.fetched), ("processing", q.processing)):
                depth.add_metric([queue, status], value)
            retained.add_metric([queue, "archive"], q.archived)
            retained.add_metric([queue, "dlq"], q.failed_total)
        yield depth
        yield retained
        lag_max = GaugeMetricFamily("chokaq_queue_lag_seconds", "Max wait of due Pending jobs.", labels=["queue"])
        lag_avg = GaugeMetricFamily("chokaq_queue_lag_avg_seconds", "Average wait of due Pending jobs.",
                                    labels=["queue"])
        due = GaugeMetricFamily("chokaq_queue_due_pending", "Due Pending jobs.", labels=["queue"])
        for lag in storage.queue_health():
            queue = queue_tag(lag.queue)
            lag_max.add_metric([queue], lag.max_lag_seconds)
            lag_avg.add_metric([queue], lag.avg_lag_seconds)
            due.add_metric([queue], lag.pending)
        yield lag_max
        yield lag_avg
        yield due
        points = storage.throughput(now - timedelta(seconds=60))
        minute = GaugeMetricFamily("chokaq_outcomes_last_minute", "Outcomes recorded in the last 60 s (MetricBuckets)",
                                   labels=["outcome"])
        minute.add_metric(["succeeded"], sum(p.succeeded for p in points))
        minute.add_metric(["dlq"], sum(p.failed for p in points))
        yield minute
        yield from _worker_families(storage.list_workers(), now)
        limits = storage.rate_limits()
        if limits:
            buckets = storage.rate_buckets([state.name for state in limits])
            yield from _rate_limit_families(limits, buckets, storage.pending_by_key(), now)


def _rate_limit_families(states: Sequence[RateLimitState], buckets: Sequence[RateBucket],
                         pending: Sequence[tuple[str, str, str | None, int]], now: datetime,
                         ) -> Iterator[GaugeMetricFamily]:
    count = GaugeMetricFamily("chokaq_rate_limit_count", "Jobs a rate limit allows per window (0: paused).",
                              labels=["limit"])
    window = GaugeMetricFamily("chokaq_rate_limit_window_seconds", "A rate limit's window.", labels=["limit"])
    used = GaugeMetricFamily("chokaq_rate_limit_used", "Jobs started in the limit's current window (all keys).",
                             labels=["limit"])
    held = GaugeMetricFamily("chokaq_rate_limit_held_jobs", "Due Pending jobs the limit holds back (no token).",
                             labels=["limit"])
    stored = {(b.limit_name, b.rate_key): b for b in buckets}
    for state in states:
        limit = state.limit
        if limit is None:
            continue
        label = [limit_tag(limit.name)]
        count.add_metric(label, limit.rate.count)
        window.add_metric(label, limit.rate.window)
        used.add_metric(label, sum(window_use(limit.rate, b, now) for (name, _), b in stored.items()
                                   if name == limit.name))
        held.add_metric(label, sum(n for queue, job_type, key, n in pending if limit.covers(queue, job_type)
                                   and refilled(limit.rate, stored.get((limit.name, limit.bucket_key(key))), now) < 1))
    yield from (count, window, used, held)


def _worker_families(workers: Sequence[Any], now: datetime) -> Iterator[GaugeMetricFamily]:
    running = [w for w in workers if w.is_running]
    count = GaugeMetricFamily("chokaq_workers_running", "Worker processes marked running in the registry.")
    count.add_metric([], len(running))
    yield count
    capacity = GaugeMetricFamily("chokaq_workers_capacity", "Sum of running workers' concurrency.")
    capacity.add_metric([], sum(w.capacity for w in running))
    yield capacity
    busy = GaugeMetricFamily("chokaq_workers_busy", "Sum of running workers' active executions.")
    busy.add_metric([], sum(w.active_count for w in running))
    yield busy
    ages = [(now - w.last_heartbeat_at).total_seconds() for w in running if w.last_heartbeat_at]
    age = GaugeMetricFamily("chokaq_worker_heartbeat_age_seconds",
                            "Registry heartbeat age of running workers: freshest and stalest.", labels=["which"])
    if ages:
        age.add_metric(["freshest"], max(0.0, min(ages)))
        age.add_metric(["stalest"], max(0.0, max(ages)))
    yield age
    circuits = GaugeMetricFamily("chokaq_circuit_state", "Worker processes reporting a circuit in a state.",
                                 labels=["type", "state"])
    states = {0: "Closed", 1: "Open", 2: "HalfOpen"}
    counted: dict[tuple[str, str], int] = {}
    for w in running:
        try:
            snapshot = json.loads(w.circuits_json or "[]")
        except ValueError:
            continue
        for circuit in snapshot if isinstance(snapshot, list) else []:
            if not isinstance(circuit, dict):
                continue
            state = circuit.get("status")
            name = states.get(state, str(state)) if isinstance(state, int) else str(state)
            key = (type_tag(circuit.get("circuitKey")), reason_tag(name))
            counted[key] = counted.get(key, 0) + 1
    for (circuit_type, state), n in sorted(counted.items()):
        circuits.add_metric([circuit_type, state], n)
    yield circuits


REGISTRY = CollectorRegistry(auto_describe=True)
REGISTRY.register(InstrumentCollector())
REGISTRY.register(FleetCollector())


def exposition() -> bytes:
    """The registry in Prometheus text format."""
    return generate_latest(REGISTRY)


class _ClosingRegistry:
    """The registry for the worker's own HTTP server: each scrape runs on a short-lived server
    thread, so the database connection it opened is closed when the scrape is done."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Any]:
        try:
            yield from self.registry.collect()
        finally:
            connections.close_all()

    def restricted_registry(self, names: Iterable[str]) -> _ClosingRegistry:
        return _ClosingRegistry(self.registry.restricted_registry(names))  # type: ignore[arg-type]


def serve(port: int, addr: str = "0.0.0.0") -> Any:
    """Serve :data:`REGISTRY` on ``port`` from a daemon thread (``chokaq_worker --metrics-port``)."""
    return start_http_server(port, addr=addr, registry=_ClosingRegistry(REGISTRY))  # type: ignore[arg-type]
