"""Rescue sweep and retention: abandoned fetches, zombies, purges (spec 02 §6, 05 §5)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from chokaq_core import storage
from chokaq_core.conf import Config, config

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
        logger.warning("moved %s zombie jobs to the DLQ (4002): %s", len(zombies), [i for i, _ in zombies[:10]])
    return recovered, len(zombies)


def purge_archive_older_than(days: float) -> int:
    return storage.purge_archive(datetime.now(UTC) - timedelta(days=days))


def purge_dlq_older_than(days: float) -> int:
    return storage.purge_dlq_older_than(datetime.now(UTC) - timedelta(days=days))
