"""Typed ChokaQ settings, read from ``settings.CHOKAQ`` at access time (spec 05 §1).

``config()`` returns a frozen snapshot merged over the code defaults; it is
rebuilt when a test changes the settings. Durations accept ``timedelta`` or
seconds and are exposed as float seconds.
"""

from __future__ import annotations

import copy
import zoneinfo
from dataclasses import dataclass
from datetime import timedelta
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from chokaq_core.domain import (
    DEFAULT_MAX_RATE_KEYS,
    KEY_CHARACTERS,
    RateLimit,
    is_valid_name,
    parse_rate,
    rate_limit_name,
    split_rate_limit_name,
)

DEFAULTS: dict[str, Any] = {
    "DATABASE": "default",
    # "sql" (the DATABASE alias) or "memory": a private in-process SQLite database, for tests and experiments (spec 03 §15).
    "STORAGE": "sql",
    "IN_MEMORY": {"MAX_CAPACITY": 100_000},
    "JOB_MODULES": [],
    "REQUIRE_REGISTERED_JOB_TYPES": True,
    "MODE": "bus",
    "PIPE_HANDLER": None,
    "MIDDLEWARE": [],
    "EXECUTION": {
        "DEFAULT_TIMEOUT": 15 * 60,
        "HEARTBEAT_INTERVAL_MIN": 8,
        "HEARTBEAT_INTERVAL_MAX": 12,
        "HEARTBEAT_FAILURE_THRESHOLD": 10,
        "CANCEL_ON_HEARTBEAT_FAILURE": False,
        "PENDING_CANCELLATION_RETENTION": 30,
        "CANCEL_POLL_INTERVAL": 1,
    },
    "RETRY": {
        "MAX_ATTEMPTS": 3,
        "BASE_DELAY": 3,
        "MAX_DELAY": 3600,
        "BACKOFF_MULTIPLIER": 2.0,
        "JITTER_MAX_DELAY": 1,
        "CIRCUIT_BREAKER_DELAY": 5,
        "MAX_JOB_AGE": 24 * 3600,
    },
    "RECOVERY": {
        "FETCHED_JOB_TIMEOUT": 10 * 60,
        "PROCESSING_ZOMBIE_TIMEOUT": 10 * 60,
        "SCAN_INTERVAL": 60,
    },
    "WORKER": {
        "CONCURRENCY": 10,
        "MAX_CONCURRENCY": 100,
        "PREFETCH_CAPACITY": 100,
        "FETCH_BATCH_SIZE": 20,
        "POLLING_INTERVAL": 1,
        "NO_QUEUES_SLEEP_INTERVAL": 5,
        "SHUTDOWN_GRACE_PERIOD": 30,
        "PREFETCHED_JOB_RELEASE_TIMEOUT": 5,
        "REGISTRY_HEARTBEAT_INTERVAL": 5,
        "COMPLETION_FLUSH_INTERVAL": 0.02,
        "COMPLETION_BATCH_SIZE": 1000,
    },
    "SQL": {
        "COMMAND_TIMEOUT_SECONDS": 30,
        "CLEANUP_BATCH_SIZE": 1000,
        "MAX_TRANSIENT_RETRIES": 3,
        "TRANSIENT_RETRY_BASE_DELAY_MS": 200,
        # PostgreSQL: workers VACUUM (ANALYZE) the Hot table once its dead row versions pass this many
        # (+ 20 % of its live rows); None turns it off (leave it to a well-tuned autovacuum).
        "HOT_VACUUM_MIN_DEAD_ROWS": 20_000,
        # PostgreSQL: the hot path's statements are prepared once per connection (False: behind a
        # transaction-pooling PgBouncer older than 1.21).
        "PREPARED_STATEMENTS": True,
    },
    "SERIALIZATION": {"MAX_PAYLOAD_BYTES": 1_000_000},
    "QUEUES": {},
    "HEALTH": {"WORKER_HEARTBEAT_TIMEOUT": 30, "QUEUE_LAG_DEGRADED_THRESHOLD": 5, "QUEUE_LAG_UNHEALTHY_THRESHOLD": 10},
    # Spec 05 §2 cardinality guard of metric labels.
    "METRICS": {
        "MAX_QUEUE_TAG_VALUES": 100,
        "MAX_JOB_TYPE_TAG_VALUES": 500,
        "MAX_ERROR_TAG_VALUES": 100,
        "MAX_FAILURE_REASON_TAG_VALUES": 50,
        "MAX_TAG_VALUE_LENGTH": 128,
        "UNKNOWN_TAG_VALUE": "unknown",
        "OVERFLOW_TAG_VALUE": "other",
    },
    # Retention (spec 05 §5): None = keep forever; INTERVAL = the in-worker cleanup period (None = off).
    # HISTORY_MINUTES_HOURS / HISTORY_HOURS_DAYS: the minute and hour roll-ups behind the Deck's 1 h / 24 h / 7 d views.
    "RETENTION": {"ARCHIVE_DAYS": None, "DLQ_DAYS": None, "METRIC_BUCKETS_HOURS": 24, "WORKER_ROWS_DAYS": 1,
                  "HISTORY_MINUTES_HOURS": 48, "HISTORY_HOURS_DAYS": 30, "INTERVAL": 3600},
    # Recurring jobs: {"name": {"CRON": "*/5 * * * *", "TYPE": "type.key", "PAYLOAD": {}, ...}}.
    "SCHEDULE": {},
    # Fleet-wide rate limits: {"type:payment.capture.v1": "100/m", "queue:emails": {"RATE": "10/s burst 5",
    # "PER_KEY": True, "MAX_KEYS": 1000}}; an operator may override, pause or lift each from the Deck.
    "RATE_LIMITS": {},
    "EVENTS": {"COALESCE_INTERVAL": 0.2},
    "IDEMPOTENCY": {
        "IN_PROGRESS_TTL": 30 * 60,
        "DEFAULT_RESULT_TTL": None,
        "MIN_RESULT_TTL": None,
        "MAX_RESULT_TTL": None,
        "STORE": "chokaq_core.middleware.InMemoryIdempotencyStore",
        "REDIS_URL": "",
    },
    "CIRCUIT_BREAKER": {
        "DEFAULT": {
            "FAILURE_THRESHOLD": 5,
            "BREAK_DURATION_SECONDS": 30,
            "HALF_OPEN_MAX_CALLS": 1,
            "HALF_OPEN_PROBE_TIMEOUT_SECONDS": 30,
            "FAILURE_WINDOW_SECONDS": 60,
        },
        "POLICIES": {},
    },
}

_DURATION_KEYS = {
    "EXECUTION": {"DEFAULT_TIMEOUT", "HEARTBEAT_INTERVAL_MIN", "HEARTBEAT_INTERVAL_MAX",
                  "PENDING_CANCELLATION_RETENTION", "CANCEL_POLL_INTERVAL"},
    "RETRY": {"BASE_DELAY", "MAX_DELAY", "JITTER_MAX_DELAY", "CIRCUIT_BREAKER_DELAY", "MAX_JOB_AGE"},
    "RECOVERY": {"FETCHED_JOB_TIMEOUT", "PROCESSING_ZOMBIE_TIMEOUT", "SCAN_INTERVAL"},
    "WORKER": {"POLLING_INTERVAL", "NO_QUEUES_SLEEP_INTERVAL", "SHUTDOWN_GRACE_PERIOD",
               "PREFETCHED_JOB_RELEASE_TIMEOUT", "REGISTRY_HEARTBEAT_INTERVAL", "COMPLETION_FLUSH_INTERVAL"},
    "HEALTH": {"WORKER_HEARTBEAT_TIMEOUT", "QUEUE_LAG_DEGRADED_THRESHOLD", "QUEUE_LAG_UNHEALTHY_THRESHOLD"},
    "RETENTION": {"INTERVAL"},
    "EVENTS": {"COALESCE_INTERVAL"},
    "IDEMPOTENCY": {"IN_PROGRESS_TTL", "DEFAULT_RESULT_TTL", "MIN_RESULT_TTL", "MAX_RESULT_TTL"},
}
# Sections holding user-named entries rather than fixed keys.
_FREE_SECTIONS = ("QUEUES", "SCHEDULE", "RATE_LIMITS")
# Durations that may be 0 (checked >= 0 below).
_NON_NEGATIVE = {("RETRY", "JITTER_MAX_DELAY"), ("HEALTH", "QUEUE_LAG_DEGRADED_THRESHOLD")}
_OPTIONAL_DURATIONS = {("RETENTION", "INTERVAL"), ("RETRY", "MAX_JOB_AGE"), ("IDEMPOTENCY", "DEFAULT_RESULT_TTL"),
                       ("IDEMPOTENCY", "MIN_RESULT_TTL"), ("IDEMPOTENCY", "MAX_RESULT_TTL")}


def seconds(value: Any) -> float | None:
    """A duration setting as float seconds (``timedelta`` or number; None stays None)."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected seconds or timedelta, got {value!r}")
    return float(value)


class Section(dict[str, Any]):
    """A settings section with attribute access: ``config().RETRY.MAX_ATTEMPTS``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError as exc:
            raise AttributeError(name) from exc


@dataclass(frozen=True)
class Config:
    DATABASE: str
    STORAGE: str
    IN_MEMORY: Section
    JOB_MODULES: list[str]
    REQUIRE_REGISTERED_JOB_TYPES: bool
    MODE: str
    PIPE_HANDLER: str | None
    MIDDLEWARE: list[str]
    EXECUTION: Section
    RETRY: Section
    RECOVERY: Section
    WORKER: Section
    SQL: Section
    SERIALIZATION: Section
    QUEUES: dict[str, Section]
    HEALTH: Section
    EVENTS: Section
    IDEMPOTENCY: Section
    CIRCUIT_BREAKER: Section
    METRICS: Section
    RETENTION: Section
    SCHEDULE: dict[str, Any]
    RATE_LIMITS: dict[str, RateLimit]

    def breaker_settings(self, type_key: str | None = None) -> dict[str, float]:
        """The breaker policy of a type key: its POLICIES entry over DEFAULT."""
        policy = dict(self.CIRCUIT_BREAKER.DEFAULT)
        if type_key is not None:
            for key, override in self.CIRCUIT_BREAKER.POLICIES.items():
                if key.lower() == type_key.lower():
                    policy.update(override)
        return policy

    def execution_timeout(self, queue: str) -> float:
        """Per-queue ``EXECUTION_TIMEOUT`` (names matched case-insensitively) else the default."""
        override = self.QUEUES.get(queue.lower())
        if override is not None and override.get("EXECUTION_TIMEOUT") is not None:
            return float(override["EXECUTION_TIMEOUT"])
        return float(self.EXECUTION.DEFAULT_TIMEOUT)


def _merge(errors: list[str]) -> Config:
    user: dict[str, Any] = dict(getattr(settings, "CHOKAQ", {}) or {})
    merged = copy.deepcopy(DEFAULTS)
    for key, value in user.items():
        if key not in merged:
            errors.append(f"unknown setting CHOKAQ[{key!r}]")
            continue
        if isinstance(merged[key], dict) and key not in _FREE_SECTIONS:
            if not isinstance(value, dict):
                errors.append(f"CHOKAQ[{key!r}] must be a dict")
                continue
            for sub, subvalue in value.items():
                if sub not in merged[key]:
                    errors.append(f"unknown setting CHOKAQ[{key!r}][{sub!r}]")
                merged[key][sub] = subvalue
        else:
            merged[key] = value
    if isinstance(merged["CIRCUIT_BREAKER"].get("DEFAULT"), dict):
        merged["CIRCUIT_BREAKER"]["DEFAULT"] = {**DEFAULTS["CIRCUIT_BREAKER"]["DEFAULT"],
                                                **merged["CIRCUIT_BREAKER"]["DEFAULT"]}
    for section, keys in _DURATION_KEYS.items():
        for key in keys:
            try:
                merged[section][key] = seconds(merged[section][key])
            except TypeError as exc:
                errors.append(f"{section}.{key}: {exc}")
                merged[section][key] = DEFAULTS[section][key]
    queues: dict[str, Section] = {}
    for queue_name, options in (merged["QUEUES"] or {}).items():
        if not str(queue_name).strip():
            errors.append("QUEUES: queue names must be non-blank")
            continue
        queue_section = Section(options or {})
        if "EXECUTION_TIMEOUT" in queue_section:
            try:
                queue_section["EXECUTION_TIMEOUT"] = seconds(queue_section["EXECUTION_TIMEOUT"])
            except TypeError as exc:
                errors.append(f"QUEUES.{queue_name}.EXECUTION_TIMEOUT: {exc}")
        queues[str(queue_name).lower()] = queue_section
    merged["QUEUES"] = queues
    merged["RATE_LIMITS"] = _rate_limits(merged["RATE_LIMITS"], errors)
    values: dict[str, Any] = {k: Section(v) if isinstance(v, dict) and k not in _FREE_SECTIONS else v
                              for k, v in merged.items()}
    return Config(**values)


RATE_LIMIT_KEYS = {"RATE", "PER_KEY", "MAX_KEYS"}


def rate_limit_entry(name: Any, entry: Any) -> RateLimit:
    """One ``RATE_LIMITS`` entry (a rate string, or a dict of RATE, PER_KEY, MAX_KEYS) as a limit; ValueError
    saying what is wrong."""
    scope, target = split_rate_limit_name(name)
    options = entry if isinstance(entry, dict) else {"RATE": entry}
    unknown = set(options) - RATE_LIMIT_KEYS
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)} (use {sorted(RATE_LIMIT_KEYS)})")
    per_key = options.get("PER_KEY", False)
    if not isinstance(per_key, bool):
        raise ValueError(f"PER_KEY must be True or False (got {per_key!r})")
    max_keys = options.get("MAX_KEYS", DEFAULT_MAX_RATE_KEYS)
    if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 1:
        raise ValueError(f"MAX_KEYS must be an integer >= 1 (got {max_keys!r})")
    return RateLimit(rate_limit_name(scope, target), parse_rate(options.get("RATE")), per_key, max_keys)


def _rate_limits(entries: Any, errors: list[str]) -> dict[str, RateLimit]:
    if not isinstance(entries, dict):
        errors.append("RATE_LIMITS must be a dict of 'queue:<name>' / 'type:<key>' entries")
        return {}
    limits = {}
    for name, entry in entries.items():
        try:
            limit = rate_limit_entry(name, entry)
            limits[limit.name] = limit
        except ValueError as exc:
            errors.append(f"RATE_LIMITS[{name!r}]: {exc}")
    return limits


def _check(cfg: Config, errors: list[str]) -> None:
    def positive(section: str, key: str, allow_none: bool = False) -> None:
        value = getattr(cfg, section)[key]
        if value is None and allow_none:
            return
        if value is None or value <= 0:
            errors.append(f"{section}.{key} must be > 0 (got {value!r})")

    for section, keys in _DURATION_KEYS.items():
        for key in keys:
            if (section, key) in _NON_NEGATIVE:
                continue
            positive(section, key, allow_none=(section, key) in _OPTIONAL_DURATIONS)
    ex, rt, wk, sql = cfg.EXECUTION, cfg.RETRY, cfg.WORKER, cfg.SQL
    if ex.HEARTBEAT_INTERVAL_MAX < ex.HEARTBEAT_INTERVAL_MIN:
        errors.append("EXECUTION.HEARTBEAT_INTERVAL_MAX must be >= HEARTBEAT_INTERVAL_MIN")
    if ex.HEARTBEAT_FAILURE_THRESHOLD < 1:
        errors.append("EXECUTION.HEARTBEAT_FAILURE_THRESHOLD must be >= 1")
    if rt.MAX_ATTEMPTS < 1:
        errors.append("RETRY.MAX_ATTEMPTS must be >= 1")
    if rt.MAX_DELAY < rt.BASE_DELAY:
        errors.append("RETRY.MAX_DELAY must be >= RETRY.BASE_DELAY")
    if rt.MAX_DELAY * 1000 > 2**31 - 1:
        errors.append("RETRY.MAX_DELAY must be <= 2^31-1 ms")
    if rt.BACKOFF_MULTIPLIER < 1:
        errors.append("RETRY.BACKOFF_MULTIPLIER must be >= 1")
    if rt.JITTER_MAX_DELAY < 0:
        errors.append("RETRY.JITTER_MAX_DELAY must be >= 0")
    if wk.MAX_CONCURRENCY < 1:
        errors.append("WORKER.MAX_CONCURRENCY must be >= 1")
    if not 1 <= wk.CONCURRENCY <= wk.MAX_CONCURRENCY:
        errors.append("WORKER.CONCURRENCY must be within 1..WORKER.MAX_CONCURRENCY")
    if wk.PREFETCH_CAPACITY < 1:
        errors.append("WORKER.PREFETCH_CAPACITY must be >= 1")
    if not 1 <= wk.FETCH_BATCH_SIZE <= max(wk.PREFETCH_CAPACITY, 1):
        errors.append("WORKER.FETCH_BATCH_SIZE must be within 1..WORKER.PREFETCH_CAPACITY")
    if wk.REGISTRY_HEARTBEAT_INTERVAL >= cfg.HEALTH.WORKER_HEARTBEAT_TIMEOUT:
        errors.append("WORKER.REGISTRY_HEARTBEAT_INTERVAL must be < HEALTH.WORKER_HEARTBEAT_TIMEOUT")
    if wk.COMPLETION_BATCH_SIZE < 1:
        errors.append("WORKER.COMPLETION_BATCH_SIZE must be >= 1")
    for key in ("COMMAND_TIMEOUT_SECONDS", "CLEANUP_BATCH_SIZE", "TRANSIENT_RETRY_BASE_DELAY_MS"):
        if sql[key] <= 0:
            errors.append(f"SQL.{key} must be > 0")
    if sql.MAX_TRANSIENT_RETRIES < 0:
        errors.append("SQL.MAX_TRANSIENT_RETRIES must be >= 0")
    if not isinstance(sql.PREPARED_STATEMENTS, bool):
        errors.append(f"SQL.PREPARED_STATEMENTS must be True or False (got {sql.PREPARED_STATEMENTS!r})")
    dead = sql.HOT_VACUUM_MIN_DEAD_ROWS
    if dead is not None and (isinstance(dead, bool) or not isinstance(dead, int) or dead < 0):
        errors.append(f"SQL.HOT_VACUUM_MIN_DEAD_ROWS must be None or an integer >= 0 (got {dead!r})")
    if cfg.STORAGE not in ("sql", "memory"):
        errors.append(f"STORAGE must be 'sql' or 'memory' (got {cfg.STORAGE!r})")
    capacity = cfg.IN_MEMORY.MAX_CAPACITY
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        errors.append(f"IN_MEMORY.MAX_CAPACITY must be an integer >= 1 (got {capacity!r})")
    if cfg.MODE not in ("bus", "pipe"):
        errors.append(f"MODE must be 'bus' or 'pipe' (got {cfg.MODE!r})")
    if cfg.MODE == "pipe" and not cfg.PIPE_HANDLER:
        errors.append("PIPE_HANDLER is required when MODE is 'pipe'")
    if not isinstance(cfg.MIDDLEWARE, (list, tuple)) or not all(isinstance(m, str) for m in cfg.MIDDLEWARE):
        errors.append("MIDDLEWARE must be a list of dotted paths")
    idem = cfg.IDEMPOTENCY
    if idem.MIN_RESULT_TTL is not None and idem.MAX_RESULT_TTL is not None and idem.MIN_RESULT_TTL > idem.MAX_RESULT_TTL:
        errors.append("IDEMPOTENCY.MIN_RESULT_TTL must be <= MAX_RESULT_TTL")
    breaker_keys = set(DEFAULTS["CIRCUIT_BREAKER"]["DEFAULT"])
    for name, policy in [("DEFAULT", cfg.CIRCUIT_BREAKER.DEFAULT), *(
            (f"POLICIES.{k}", v) for k, v in (cfg.CIRCUIT_BREAKER.POLICIES or {}).items())]:
        if not isinstance(policy, dict):
            errors.append(f"CIRCUIT_BREAKER.{name} must be a dict")
            continue
        for key, value in policy.items():
            if key not in breaker_keys:
                errors.append(f"CIRCUIT_BREAKER.{name}: unknown key {key!r}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1:
                errors.append(f"CIRCUIT_BREAKER.{name}.{key} must be a number >= 1 (got {value!r})")
    _check_operations(cfg, errors)
    if cfg.SERIALIZATION.MAX_PAYLOAD_BYTES < 1:
        errors.append("SERIALIZATION.MAX_PAYLOAD_BYTES must be >= 1")
    for name, options in cfg.QUEUES.items():
        unknown = set(options) - {"EXECUTION_TIMEOUT"}
        if unknown:
            errors.append(f"QUEUES.{name}: only EXECUTION_TIMEOUT is supported (got {sorted(unknown)})")
        timeout = options.get("EXECUTION_TIMEOUT")
        if timeout is not None and timeout <= 0:
            errors.append(f"QUEUES.{name}.EXECUTION_TIMEOUT must be > 0")


def _check_operations(cfg: Config, errors: list[str]) -> None:
    """HEALTH thresholds, METRICS guard, RETENTION and SCHEDULE (spec 05 §1)."""
    health = cfg.HEALTH
    if health.QUEUE_LAG_DEGRADED_THRESHOLD is not None and health.QUEUE_LAG_DEGRADED_THRESHOLD < 0:
        errors.append("HEALTH.QUEUE_LAG_DEGRADED_THRESHOLD must be >= 0")
    if (health.QUEUE_LAG_UNHEALTHY_THRESHOLD or 0) < (health.QUEUE_LAG_DEGRADED_THRESHOLD or 0):
        errors.append("HEALTH.QUEUE_LAG_UNHEALTHY_THRESHOLD must be >= HEALTH.QUEUE_LAG_DEGRADED_THRESHOLD")
    metrics = cfg.METRICS
    for key in ("MAX_QUEUE_TAG_VALUES", "MAX_JOB_TYPE_TAG_VALUES", "MAX_ERROR_TAG_VALUES",
                "MAX_FAILURE_REASON_TAG_VALUES", "MAX_TAG_VALUE_LENGTH"):
        if isinstance(metrics[key], bool) or not isinstance(metrics[key], int) or metrics[key] <= 0:
            errors.append(f"METRICS.{key} must be an integer > 0 (got {metrics[key]!r})")
    for key in ("UNKNOWN_TAG_VALUE", "OVERFLOW_TAG_VALUE"):
        value = metrics[key]
        if not isinstance(value, str) or not value.strip():
            errors.append(f"METRICS.{key} must be a non-blank string")
        elif isinstance(metrics.MAX_TAG_VALUE_LENGTH, int) and len(value.strip()) > metrics.MAX_TAG_VALUE_LENGTH:
            errors.append(f"METRICS.{key} must be at most MAX_TAG_VALUE_LENGTH characters")
    retention = cfg.RETENTION
    for key, none_ok in (("ARCHIVE_DAYS", True), ("DLQ_DAYS", True), ("METRIC_BUCKETS_HOURS", False),
                         ("WORKER_ROWS_DAYS", False), ("HISTORY_MINUTES_HOURS", False), ("HISTORY_HOURS_DAYS", False)):
        value = retention[key]
        if value is None and none_ok:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            errors.append(f"RETENTION.{key} must be a number > 0{' or None' if none_ok else ''} (got {value!r})")
    if not isinstance(cfg.SCHEDULE, dict):
        errors.append("SCHEDULE must be a dict of named entries")
        return
    for name, entry in cfg.SCHEDULE.items():
        errors.extend(f"SCHEDULE[{name!r}]: {problem}" for problem in schedule_entry_errors(name, entry))


def schedule_entry_errors(name: Any, entry: Any) -> list[str]:
    """What is wrong with one recurring-job entry (empty when it is valid)."""
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        return ["names must be 1-200 characters"]
    if not is_valid_name("idempotency key", f"schedule:{name}"):  # each tick's idempotency key names the entry
        return [f"names must be characters of [{KEY_CHARACTERS}] (they become idempotency keys)"]
    if not isinstance(entry, dict):
        return ["each entry must be a dict with CRON and TYPE"]
    problems = []
    unknown = set(entry) - {"CRON", "TYPE", "PAYLOAD", "QUEUE", "PRIORITY", "TIMEZONE", "ENABLED"}
    if unknown:
        problems.append(f"unknown keys {sorted(unknown)}")
    cron = entry.get("CRON")
    if not isinstance(cron, str) or not cron.strip():
        problems.append("CRON must be a cron expression")
    else:
        from croniter import croniter  # the schedules feature's parser: a project without schedules never loads it

        if not croniter.is_valid(cron):
            problems.append(f"CRON {cron!r} is not a valid cron expression")
    job_type = entry.get("TYPE")
    if not isinstance(job_type, str) or not job_type.strip() or len(job_type) > 255:
        problems.append("TYPE must be a job type key of 1-255 characters")
    if not isinstance(entry.get("PAYLOAD", {}), dict):
        problems.append("PAYLOAD must be a dict of handler arguments")
    queue = entry.get("QUEUE")
    if queue is not None and (not isinstance(queue, str) or not queue.strip()):
        problems.append("QUEUE must be a non-blank string")
    priority = entry.get("PRIORITY")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        problems.append("PRIORITY must be an integer")
    zone = entry.get("TIMEZONE", "UTC")
    try:
        zoneinfo.ZoneInfo(zone)
    except Exception:
        problems.append(f"TIMEZONE {zone!r} is not a known time zone")
    return problems


def collect_errors() -> list[str]:
    errors: list[str] = []
    cfg = _merge(errors)
    _check(cfg, errors)
    return errors


@lru_cache(maxsize=1)
def config() -> Config:
    """The effective configuration; raises ImproperlyConfigured listing every error."""
    errors: list[str] = []
    cfg = _merge(errors)
    _check(cfg, errors)
    if errors:
        raise ImproperlyConfigured("Invalid ChokaQ configuration: " + "; ".join(errors))
    return cfg


def validate() -> None:
    config()


def _reset(*, setting: str, **_: Any) -> None:
    if setting in ("CHOKAQ", "DATABASES"):
        config.cache_clear()


setting_changed.connect(_reset)
