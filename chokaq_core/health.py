"""The three health checks of spec 05 §4, shared by ``/deck/health/`` and ``manage.py chokaq_health``.

* ``chokaq_sql`` (chokaq, sql, storage): the database answers within
  ``SQL.COMMAND_TIMEOUT_SECONDS`` and the six tables exist.
* ``chokaq_worker`` (chokaq, worker, live): the freshest running row of the
  worker registry (fleet-wide, or one host) has capacity and a heartbeat
  younger than ``HEALTH.WORKER_HEARTBEAT_TIMEOUT``.
* ``chokaq_queue_saturation`` (chokaq, queue, saturation): the worst queue's
  max lag strictly above ``QUEUE_LAG_UNHEALTHY_THRESHOLD`` is Unhealthy,
  strictly above ``QUEUE_LAG_DEGRADED_THRESHOLD`` Degraded.

A check that cannot read what it needs is Unhealthy and says why. What a check
reports never carries a secret: URL passwords in descriptions and data (an
exception text naming a connection URL) are masked (``chokaq_core.redaction``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from django.db import connections

from chokaq_core import storage
from chokaq_core.conf import config
from chokaq_core.redaction import mask_credentials

REQUIRED_TABLES = (
    "chokaq_jobs_hot", "chokaq_jobs_archive", "chokaq_jobs_dlq", "chokaq_stats_summary", "chokaq_metric_buckets",
    "chokaq_queues",
)


class Status(StrEnum):
    HEALTHY = "Healthy"
    DEGRADED = "Degraded"
    UNHEALTHY = "Unhealthy"


_RANK = {Status.HEALTHY: 0, Status.DEGRADED: 1, Status.UNHEALTHY: 2}


@dataclass(frozen=True)
class CheckResult:
    status: Status
    description: str
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"status": str(self.status), "description": self.description, "data": self.data}


@dataclass(frozen=True)
class Report:
    status: Status
    checks: dict[str, CheckResult]

    @property
    def http_status(self) -> int:
        return 503 if self.status == Status.UNHEALTHY else 200

    @property
    def exit_code(self) -> int:
        return 1 if self.status == Status.UNHEALTHY else 0

    def as_dict(self) -> dict[str, Any]:
        return {"status": str(self.status), "checks": {name: r.as_dict() for name, r in self.checks.items()}}


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value is not None else None


# ---------------------------------------------------------------- chokaq_sql


def check_sql(host: str | None = None) -> CheckResult:
    cfg = config()
    alias, timeout = cfg.DATABASE, float(cfg.SQL.COMMAND_TIMEOUT_SECONDS)
    outcome: dict[str, Any] = {}

    def probe() -> None:
        connection = connections[alias]
        try:
            with connection.cursor() as cursor:
                outcome["tables"] = set(connection.introspection.table_names(cursor))
            outcome["vendor"] = connection.vendor
        except Exception as exc:
            outcome["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            connection.close()

    # In its own thread (and connection): a database that hangs cannot hang the probe past the timeout.
    thread = threading.Thread(target=probe, name="chokaq-health-sql", daemon=True)
    thread.start()
    thread.join(timeout)
    data: dict[str, Any] = {"database": alias, "timeoutSeconds": timeout}
    if thread.is_alive():
        return CheckResult(Status.UNHEALTHY, f"ChokaQ SQL storage is not reachable: no answer within {timeout:g} s",
                           data)
    if "error" in outcome:
        return CheckResult(Status.UNHEALTHY, f"ChokaQ SQL storage is not reachable: {outcome['error']}", data)
    missing = [t for t in REQUIRED_TABLES if t not in outcome["tables"]]
    data.update(vendor=outcome["vendor"], missingTables=missing)
    if missing:
        return CheckResult(Status.UNHEALTHY, "ChokaQ SQL storage is reachable but missing required tables: "
                           + ", ".join(missing) + " (run manage.py migrate chokaq_core)", data)
    return CheckResult(Status.HEALTHY, "ChokaQ SQL storage is reachable and all required tables exist.", data)


# ---------------------------------------------------------------- chokaq_worker


def check_worker(host: str | None = None) -> CheckResult:
    timeout = float(config().HEALTH.WORKER_HEARTBEAT_TIMEOUT)
    running = [w for w in storage.list_workers() if w.is_running and (host is None or w.hostname == host)]
    where = f" on host {host}" if host else ""
    if not running:
        return CheckResult(Status.UNHEALTHY, f"ChokaQ worker{where} has not entered its runtime loop.",
                           {"workerCount": 0, "isRunning": False, "host": host})
    freshest = max(running, key=lambda w: w.last_heartbeat_at or datetime.min.replace(tzinfo=UTC))
    age = (datetime.now(UTC) - freshest.last_heartbeat_at).total_seconds() if freshest.last_heartbeat_at else None
    data = {
        "active": freshest.active_count, "capacity": freshest.capacity, "isRunning": freshest.is_running,
        "lastHeartbeatUtc": _iso(freshest.last_heartbeat_at),
        "heartbeatAgeSeconds": round(age, 3) if age is not None else None, "workerCount": len(running),
        "workerId": freshest.worker_id, "host": host,
    }
    if freshest.capacity <= 0:
        return CheckResult(Status.UNHEALTHY, f"ChokaQ worker{where} has no capacity (capacity={freshest.capacity}).",
                           data)
    if age is None:
        return CheckResult(Status.UNHEALTHY, f"ChokaQ worker{where} has no heartbeat.", data)
    if age > timeout:
        return CheckResult(Status.UNHEALTHY,
                           f"ChokaQ worker heartbeat is stale. Age={age:.1f}s, Timeout={timeout:.1f}s", data)
    return CheckResult(Status.HEALTHY, f"ChokaQ worker{where} is running.", data)


# ---------------------------------------------------------------- chokaq_queue_saturation


def check_queue_saturation(host: str | None = None) -> CheckResult:
    health = config().HEALTH
    degraded, unhealthy = float(health.QUEUE_LAG_DEGRADED_THRESHOLD), float(health.QUEUE_LAG_UNHEALTHY_THRESHOLD)
    now = datetime.now(UTC)
    lags = storage.queue_health()
    points = storage.throughput(now - timedelta(seconds=60))
    succeeded = sum(p.succeeded for p in points)
    failed = sum(p.failed for p in points)
    worst = max(lags, key=lambda q: q.max_lag_seconds, default=None)
    data: dict[str, Any] = {
        "generatedAtUtc": _iso(now), "queueCount": len(lags),
        "jobsPerSecondLastMinute": round((succeeded + failed) / 60, 3),
        "failureRateLastMinutePercent": round(100 * failed / (succeeded + failed), 2) if succeeded + failed else 0.0,
        "worstQueue": worst.queue if worst else None, "worstQueuePending": worst.pending if worst else 0,
        "worstQueueMaxLagSeconds": round(worst.max_lag_seconds, 3) if worst else 0.0,
    }
    lag = worst.max_lag_seconds if worst else 0.0
    if lag > unhealthy:
        return CheckResult(Status.UNHEALTHY, f"ChokaQ queue '{data['worstQueue']}' is saturated: max lag "
                           f"{lag:.1f}s > {unhealthy:g}s.", data)
    if lag > degraded:
        return CheckResult(Status.DEGRADED, f"ChokaQ queue '{data['worstQueue']}' is lagging: max lag "
                           f"{lag:.1f}s > {degraded:g}s.", data)
    return CheckResult(Status.HEALTHY, "ChokaQ queues are within their lag thresholds.", data)


# ---------------------------------------------------------------- registry


CHECKS: dict[str, tuple[frozenset[str], Callable[[str | None], CheckResult]]] = {
    "chokaq_sql": (frozenset({"chokaq", "sql", "storage"}), check_sql),
    "chokaq_worker": (frozenset({"chokaq", "worker", "live"}), check_worker),
    "chokaq_queue_saturation": (frozenset({"chokaq", "queue", "saturation"}), check_queue_saturation),
}


def _without_secrets(result: CheckResult) -> CheckResult:
    data = {k: mask_credentials(v) if isinstance(v, str) else v for k, v in result.data.items()}
    return CheckResult(result.status, mask_credentials(result.description), data)


def run(tags: Iterable[str] | None = None, host: str | None = None) -> Report:
    """Run the checks carrying any of ``tags`` (all when None); the report's status is the worst."""
    wanted = {t.strip() for t in tags or () if t.strip()}
    results: dict[str, CheckResult] = {}
    for name, (check_tags, check) in CHECKS.items():
        if wanted and not wanted & check_tags:
            continue
        try:
            result = check(host)
        except Exception as exc:
            result = CheckResult(Status.UNHEALTHY, f"{name} could not be evaluated: {type(exc).__name__}: {exc}", {})
        results[name] = _without_secrets(result)
    worst = max((r.status for r in results.values()), key=_RANK.__getitem__, default=Status.HEALTHY)
    return Report(worst, results)
