"""Rescue sweep and retention: abandoned fetches, zombies, purges (spec 02 §6, 05 §5)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial

from chokaq_core import metrics, schedule, storage
from chokaq_core.conf import Config, config
from chokaq_core.domain import HISTORY_GRANULARITIES

logger = logging.getLogger("chokaq.maintenance")


def rescue(cfg: Config | None = None) -> tuple[int, int]:
    """One sweep: Fetched rows past ``FETCHED_JOB_TIMEOUT`` back to Pending (user code never
    started), then Processing rows with an expired heartbeat to the DLQ as Zombie (never retried:
    their side effects may have happened). Returns (recovered, zombies)."""
    cfg = cfg or config()
    recovered = storage.recover_abandoned(cfg.RECOVERY.FETCHED_JOB_TIMEOUT)
    if recovered:
        logger.warning("recovered %s abandoned fetched jobs (4001)", recovered)
    zombies = storage.archive_zombies(cfg.RECOVERY.PROCESSING_ZOMBIE_TIMEOUT)
    if zombies:
        metrics.zombies_moved(zombies)
        logger.warning("moved %s zombie jobs to the DLQ (4002): %s", len(zombies), [i for i, _ in zombies[:10]])
    return recovered, len(zombies)


# ---------------------------------------------------------------- retention (spec 05 §5)

Progress = Callable[[str, int], None]  # (target, rows deleted by the batch just committed)


@dataclass(frozen=True)
class RetentionPlan:
    """What one cleanup run deletes: None skips a target (Archive and DLQ default to keep forever)."""

    archive_days: float | None
    dlq_days: float | None
    metric_buckets_hours: float | None
    worker_rows_days: float | None
    history_minutes_hours: float | None = None
    history_hours_days: float | None = None

    @classmethod
    def from_settings(cls, cfg: Config | None = None, **overrides: float | None) -> RetentionPlan:
        retention = (cfg or config()).RETENTION
        values = {
            "archive_days": retention.ARCHIVE_DAYS, "dlq_days": retention.DLQ_DAYS,
            "metric_buckets_hours": retention.METRIC_BUCKETS_HOURS, "worker_rows_days": retention.WORKER_ROWS_DAYS,
            "history_minutes_hours": retention.HISTORY_MINUTES_HOURS,
            "history_hours_days": retention.HISTORY_HOURS_DAYS,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        for key, value in values.items():
            if value is not None and value <= 0:
                raise ValueError(f"{key} must be > 0 (got {value})")
        return cls(**values)

    def cutoffs(self, now: datetime | None = None) -> dict[str, datetime]:
        """Target → cutoff: rows older than it are deleted."""
        now = now or datetime.now(UTC)
        spans = {"archive": timedelta(days=self.archive_days) if self.archive_days else None,
                 "dlq": timedelta(days=self.dlq_days) if self.dlq_days else None,
                 "metric_buckets": timedelta(hours=self.metric_buckets_hours) if self.metric_buckets_hours else None,
                 "workers": timedelta(days=self.worker_rows_days) if self.worker_rows_days else None,
                 "history_minutes": timedelta(hours=self.history_minutes_hours) if self.history_minutes_hours else None,
                 "history_hours": timedelta(days=self.history_hours_days) if self.history_hours_days else None}
        if self.archive_days and self.dlq_days:  # the attempts history lives as long as the longer of the two
            spans["attempts"] = timedelta(days=max(self.archive_days, self.dlq_days))
        return {target: now - span for target, span in spans.items() if span is not None}


CLEANUP_TARGETS: dict[str, Callable[[datetime, Callable[[int], None] | None], int]] = {
    "archive": storage.purge_archive,
    "dlq": storage.purge_dlq_older_than,
    "metric_buckets": storage.purge_metric_buckets,
    "workers": storage.purge_workers,
    "attempts": storage.purge_attempts,
    "history_minutes": partial(storage.purge_history, HISTORY_GRANULARITIES["minute"]),
    "history_hours": partial(storage.purge_history, HISTORY_GRANULARITIES["hour"]),
}


def cleanup(plan: RetentionPlan, progress: Progress | None = None, now: datetime | None = None) -> dict[str, int]:
    """Delete what ``plan`` says, target by target, in batches of ``SQL.CLEANUP_BATCH_SIZE`` rows, each
    batch its own short transaction (counters decremented with it). Hot is never touched."""
    deleted: dict[str, int] = {}
    for target, cutoff in plan.cutoffs(now).items():
        def report(n: int, target: str = target) -> None:
            if progress is not None:
                progress(target, n)

        deleted[target] = CLEANUP_TARGETS[target](cutoff, report)
        if deleted[target]:
            logger.info("retention cleanup deleted %s %s rows older than %s", deleted[target], target,
                        cutoff.isoformat())
    return deleted


def run_cleanup_if_due(state: dict[str, float], cfg: Config | None = None) -> dict[str, int] | None:
    """The in-worker retention run: at most once per ``RETENTION.INTERVAL`` (None: never), first one
    interval after the worker started. Errors are logged, never raised."""
    cfg = cfg or config()
    interval = cfg.RETENTION.INTERVAL
    if not interval:
        return None
    now = time.monotonic()
    due = state.setdefault("cleanup_due", now + interval)
    if now < due:
        return None
    state["cleanup_due"] = now + interval
    try:
        return cleanup(RetentionPlan.from_settings(cfg))
    except Exception:
        logger.exception("in-worker retention cleanup failed; the next run is in %s s", interval)
        return None


# ---------------------------------------------------------------- the worker's periodic duties

PERIODIC_INTERVAL = 0.5  # seconds between checks of the recurring-job schedule
TIDY_CHECK_INTERVAL = 5.0  # seconds between two looks at the Hot table's dead row versions


def tidy_hot_table_if_due(state: dict[str, float], cfg: Config | None = None) -> bool:
    """At most every ``TIDY_CHECK_INTERVAL``: vacuum the Hot table if churn left too many dead row versions
    (``SQL.HOT_VACUUM_MIN_DEAD_ROWS``; PostgreSQL only). Errors are logged once and turn it off."""
    cfg = cfg or config()
    threshold = cfg.SQL.HOT_VACUUM_MIN_DEAD_ROWS
    now = time.monotonic()
    if threshold is None or state.get("tidy_off") or now < state.get("tidy_due", 0.0):
        return False
    state["tidy_due"] = now + TIDY_CHECK_INTERVAL
    try:
        done = storage.tidy_hot_table(int(threshold))
    except Exception:
        state["tidy_off"] = 1.0
        logger.warning("could not vacuum the Hot table; this worker stops trying (set SQL.HOT_VACUUM_MIN_DEAD_ROWS"
                       " to None to silence this)", exc_info=True)
        return False
    if done:
        logger.info("vacuumed and analyzed the Hot table (dead row versions past %s)", threshold)
    return done


def periodic(stopping: threading.Event, cfg: Config | None = None) -> None:
    """Run by every non-burst worker on its own thread until ``stopping``: recurring jobs (each tick
    claimed once fleet-wide), every ``RETENTION.INTERVAL`` the retention cleanup, and the Hot table's
    vacuum when it is due."""
    cfg = cfg or config()
    state: dict[str, float] = {}
    while not stopping.is_set():
        if cfg.SCHEDULE:
            try:
                schedule.run_due(cfg=cfg)
            except Exception:
                logger.exception("recurring job check failed")
        run_cleanup_if_due(state, cfg)
        tidy_hot_table_if_due(state, cfg)
        stopping.wait(PERIODIC_INTERVAL)
