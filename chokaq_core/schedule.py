"""Recurring jobs: ``CHOKAQ["SCHEDULE"]`` cron entries turned into jobs, exactly once per tick across the fleet.

::

    CHOKAQ = {"SCHEDULE": {
        "nightly-report": {"CRON": "0 3 * * *", "TYPE": "reports.nightly.v1", "PAYLOAD": {"format": "pdf"},
                           "QUEUE": "reports", "PRIORITY": 10, "TIMEZONE": "Europe/Paris"},
    }}

Cron expressions are read by ``croniter`` (five fields, or six with seconds
last). Every worker process (not ``--burst``) checks the schedule about once a
second. For each entry the latest due tick is claimed with a guarded update of
its ``chokaq_schedules`` row *in the same transaction* as the enqueue, so two
workers racing for a tick produce one job, and a tick is never enqueued twice
even after its job has left Hot. A missed tick (no worker running) is not
replayed: the next check enqueues only the latest one. A schedule seen for the
first time starts with its next tick. The job carries the tags
``schedule:<name>`` and ``tick:<ISO time>`` (searchable in the Deck), is created
by ``schedule:<name>`` and has the idempotency key ``schedule:<name>:<tick>``.
"""

from __future__ import annotations

import logging
import zoneinfo
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from croniter import croniter

from chokaq_core import storage
from chokaq_core.api import EnqueueOptions, build
from chokaq_core.conf import Config, config
from chokaq_core.handlers import get_definition

logger = logging.getLogger("chokaq.schedule")


@dataclass(frozen=True)
class Entry:
    name: str
    cron: str
    type_key: str
    payload: dict[str, Any] = field(default_factory=dict)
    queue: str | None = None
    priority: int | None = None
    timezone: str = "UTC"
    enabled: bool = True

    def due_tick(self, now: datetime) -> datetime:
        """The latest tick at or before ``now`` (UTC)."""
        local = now.astimezone(zoneinfo.ZoneInfo(self.timezone)) + timedelta(microseconds=1)
        return croniter(self.cron, local).get_prev(datetime).astimezone(UTC)  # type: ignore[no-any-return]

    def next_tick(self, now: datetime) -> datetime:
        """The first tick after ``now`` (UTC)."""
        local = now.astimezone(zoneinfo.ZoneInfo(self.timezone))
        return croniter(self.cron, local).get_next(datetime).astimezone(UTC)  # type: ignore[no-any-return]


def entries(cfg: Config | None = None) -> list[Entry]:
    """The configured entries (validated by the settings checks, chokaq.E001)."""
    return [
        Entry(name=name, cron=spec["CRON"], type_key=spec["TYPE"], payload=dict(spec.get("PAYLOAD") or {}),
              queue=spec.get("QUEUE"), priority=spec.get("PRIORITY"), timezone=spec.get("TIMEZONE", "UTC"),
              enabled=bool(spec.get("ENABLED", True)))
        for name, spec in sorted((cfg or config()).SCHEDULE.items())
    ]


def key_for(name: str, tick: datetime) -> str:
    return f"schedule:{name}:{tick.astimezone(UTC).isoformat()}"[:255]


def run_due(now: datetime | None = None, cfg: Config | None = None) -> dict[str, str]:
    """Enqueue every entry whose latest tick nobody claimed yet; name → job id of what this call enqueued."""
    now = now or datetime.now(UTC)
    enqueued: dict[str, str] = {}
    for entry in entries(cfg):
        if not entry.enabled:
            continue
        try:
            tick = entry.due_tick(now)
            job = build(EnqueueOptions(type_key=entry.type_key, payload=entry.payload, queue=entry.queue,
                                       priority=entry.priority, idempotency_key=key_for(entry.name, tick),
                                       tags=[f"schedule:{entry.name}"[:200], f"tick:{tick.isoformat()}"],
                                       created_by=f"schedule:{entry.name}"[:100]))
            stored = storage.enqueue_scheduled(entry.name, tick, job)
        except Exception:
            logger.exception("recurring job %r could not be enqueued", entry.name)
            continue
        if stored is not None:
            enqueued[entry.name] = stored
            logger.info("recurring job %r enqueued for tick %s as %s", entry.name, tick.isoformat(), stored)
    return enqueued


def overview(now: datetime | None = None) -> list[dict[str, Any]]:
    """For the Deck: every entry with its queue, last claimed tick and next run time."""
    now = now or datetime.now(UTC)
    ticks = storage.schedule_ticks()
    rows = []
    for e in entries():
        definition = get_definition(e.type_key)
        rows.append({"name": e.name, "cron": e.cron, "type": e.type_key, "enabled": e.enabled, "timezone": e.timezone,
                     "queue": e.queue or (definition.queue if definition else "default"),
                     "lastTickUtc": ticks.get(e.name), "nextRunUtc": e.next_tick(now) if e.enabled else None})
    return rows
