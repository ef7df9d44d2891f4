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

Operators switch an entry off and on from the Deck's Recurring panel: the switch is kept in the entry's
``chokaq_schedules`` row (it wins over the entry's ``ENABLED``), every check reads it, so every worker honours
it from its next check on; switching on does not run the ticks that fell while the entry was off. "Run now"
enqueues one job of the entry at once (tags ``schedule:<name>`` and ``run:now``, created by the operator). The
row also keeps the entry's latest job (a tick's or a run-now's) for the panel.
"""

from __future__ import annotations

import logging
import zoneinfo
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from chokaq_core import storage
from chokaq_core.api import EnqueueOptions, build
from chokaq_core.conf import Config, config
from chokaq_core.domain import NewJob, ScheduleState
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
        from croniter import croniter

        return croniter(self.cron, local).get_prev(datetime).astimezone(UTC)  # type: ignore[no-any-return]

    def next_tick(self, now: datetime) -> datetime:
        """The first tick after ``now`` (UTC)."""
        local = now.astimezone(zoneinfo.ZoneInfo(self.timezone))
        from croniter import croniter

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


def is_enabled(entry: Entry, state: ScheduleState | None) -> bool:
    """The operator's switch when set, else the entry's ``ENABLED``."""
    return entry.enabled if state is None or state.enabled is None else state.enabled


def _job(entry: Entry, tick: datetime | None, actor: str | None = None) -> NewJob:
    """A job of ``entry``: for its ``tick`` (keyed, so a tick is one job), or an operator's run-now."""
    tags = [f"schedule:{entry.name}"[:200], f"tick:{tick.isoformat()}" if tick is not None else "run:now"]
    return build(EnqueueOptions(type_key=entry.type_key, payload=entry.payload, queue=entry.queue,
                                priority=entry.priority, tags=tags,
                                idempotency_key=key_for(entry.name, tick) if tick is not None else None,
                                created_by=(actor or f"schedule:{entry.name}")[:100]))


def run_due(now: datetime | None = None, cfg: Config | None = None) -> dict[str, str]:
    """Enqueue every enabled entry whose latest tick nobody claimed yet; name → job id of what this call
    enqueued. The operator's switches are read once per call."""
    now = now or datetime.now(UTC)
    enqueued: dict[str, str] = {}
    states = {state.name: state for state in storage.schedule_states()}
    for entry in entries(cfg):
        if not is_enabled(entry, states.get(entry.name)):
            continue
        try:
            tick = entry.due_tick(now)
            stored = storage.enqueue_scheduled(entry.name, tick, _job(entry, tick))
        except Exception:
            logger.exception("recurring job %r could not be enqueued", entry.name)
            continue
        if stored is not None:
            enqueued[entry.name] = stored
            logger.info("recurring job %r enqueued for tick %s as %s", entry.name, tick.isoformat(), stored)
    return enqueued


def entry(name: str) -> Entry:
    """The configured entry called ``name``; KeyError when there is none."""
    for candidate in entries():
        if candidate.name == name:
            return candidate
    raise KeyError(name)


def set_enabled(name: str, enabled: bool, now: datetime | None = None) -> None:
    """Switch entry ``name`` on or off for the whole fleet (kept in its row); KeyError for an unknown name."""
    found = entry(name)
    storage.set_schedule_enabled(found.name, enabled, found.due_tick(now or datetime.now(UTC)))


def run_now(name: str, actor: str, now: datetime | None = None) -> str:
    """Enqueue one job of entry ``name`` now, whatever its switch; the job's id. KeyError for an unknown name."""
    found = entry(name)
    return storage.run_schedule_now(found.name, found.due_tick(now or datetime.now(UTC)), _job(found, None, actor))


def overview(now: datetime | None = None) -> list[dict[str, Any]]:
    """For the Deck: every entry with its queue, switch, last claimed tick, latest job and next run time."""
    now = now or datetime.now(UTC)
    states = {state.name: state for state in storage.schedule_states()}
    rows = []
    for e in entries():
        definition = get_definition(e.type_key)
        state = states.get(e.name)
        enabled = is_enabled(e, state)
        rows.append({"name": e.name, "cron": e.cron, "type": e.type_key, "enabled": enabled, "timezone": e.timezone,
                     "configuredEnabled": e.enabled, "overridden": state is not None and state.enabled is not None,
                     "queue": e.queue or (definition.queue if definition else "default"),
                     "lastTickUtc": state.last_tick_at if state else None,
                     "lastJobId": state.last_job_id if state else None,
                     "lastRunUtc": state.last_run_at if state else None,
                     "nextRunUtc": e.next_tick(now) if enabled else None})
    return rows
