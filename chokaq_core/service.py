"""The Deck's only door into the engine: read views and operator commands.

Every command validates its input and raises ``ServiceError`` (a
``ValueError``) with a message fit for an operator; nothing is written when
validation fails. Events of each command travel back to the Deck by the same
road as the worker's (storage → events after commit).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from chokaq_core import storage
from chokaq_core.api import serialize_payload
from chokaq_core.domain import (
    ArchivedJob,
    DeadJob,
    HotJob,
    QueueState,
    QueueStats,
    SummaryStats,
)

MAX_BULK_IDS = 1000


class ServiceError(ValueError):
    """An operator command was refused; the message says why."""


@dataclass(frozen=True)
class JobView:
    """A job wherever it lives: exactly one of the three is set."""

    hot: HotJob | None = None
    archived: ArchivedJob | None = None
    dead: DeadJob | None = None

    @property
    def pillar(self) -> str:
        return "hot" if self.hot else "archive" if self.archived else "dlq"


def summary() -> SummaryStats:
    return storage.summary_stats()


def queues() -> list[QueueStats]:
    return storage.queue_stats()


def queue_states() -> list[QueueState]:
    return storage.queue_states()


def find_job(job_id: str) -> JobView | None:
    """Look a job up in Hot, then Archive, then DLQ."""
    if hot := storage.get_hot(job_id):
        return JobView(hot=hot)
    if archived := storage.get_archived(job_id):
        return JobView(archived=archived)
    if dead := storage.get_dead(job_id):
        return JobView(dead=dead)
    return None


def _ids(job_ids: Sequence[str]) -> list[str]:
    ids = list(dict.fromkeys(i.strip() for i in job_ids if i and i.strip()))
    if not ids:
        raise ServiceError("no job ids given")
    if len(ids) > MAX_BULK_IDS:
        raise ServiceError(f"at most {MAX_BULK_IDS} ids per command, got {len(ids)}")
    return ids


def _payload(payload: str | None) -> str | None:
    """Validate edited payload JSON: it must parse to an object and fit the envelope limit."""
    if payload is None:
        return None
    try:
        value = json.loads(payload)
    except ValueError as exc:
        raise ServiceError(f"payload is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ServiceError("payload must be a JSON object of handler arguments")
    try:
        return serialize_payload(value)
    except (TypeError, ValueError) as exc:
        raise ServiceError(str(exc)) from exc


def cancel(job_ids: Sequence[str], *, actor: str) -> tuple[list[str], list[str]]:
    """Pending/Fetched → DLQ Cancelled now; Processing → cooperative cancel. Returns (moved, flagged)."""
    return storage.cancel(_ids(job_ids), actor=actor)


def resurrect(job_id: str, *, actor: str, payload: str | None = None, tags: str | None = None,
              priority: int | None = None) -> bool:
    return storage.resurrect(job_id, payload=_payload(payload), tags=tags, priority=priority, actor=actor)


def resurrect_many(job_ids: Sequence[str], *, actor: str) -> int:
    return storage.resurrect_batch(_ids(job_ids), actor=actor)


def edit(job_id: str, *, actor: str, payload: str | None = None, tags: str | None = None,
         priority: int | None = None) -> bool:
    """Edit a Pending Hot job or a DLQ job; False when the job is in neither state any more."""
    clean = _payload(payload)
    if storage.update_hot_data(job_id, payload=clean, tags=tags, priority=priority, actor=actor):
        return True
    return storage.update_dlq_data(job_id, payload=clean, tags=tags, actor=actor)


def purge_dlq(job_ids: Sequence[str]) -> int:
    return storage.purge_dlq_ids(_ids(job_ids))


MAX_WORKERS_RANGE = (1, 10_000)
ZOMBIE_TIMEOUT_RANGE = (1, 86_400)


def _queue(name: str) -> str:
    name = (name or "").strip()
    if not name or len(name) > 255:
        raise ServiceError("queue name must be 1-255 characters")
    return name


def _optional_int(label: str, value: int | str | None, bounds: tuple[int, int]) -> int | None:
    """Empty/None clears the setting; anything else must be an integer within ``bounds``."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ServiceError(f"{label} must be a whole number, got {value!r}") from None
    if not bounds[0] <= number <= bounds[1]:
        raise ServiceError(f"{label} must be within {bounds[0]}-{bounds[1]}, got {number}")
    return number


def set_queue_paused(queue: str, paused: bool) -> None:
    """Pause stops new claims at once; buffered jobs of the queue are released; running jobs finish."""
    storage.set_queue_paused(_queue(queue), paused)


def set_queue_visible(queue: str, visible: bool) -> bool:
    """Hide/show a queue; both directions leave it paused (spec 01 §4.17). False if the queue is unknown."""
    return storage.set_queue_active(_queue(queue), visible)


def set_queue_max_workers(queue: str, max_workers: int | str | None) -> int | None:
    """Fleet-wide cap on Fetched + Processing rows of the queue (None = unlimited)."""
    value = _optional_int("max workers", max_workers, MAX_WORKERS_RANGE)
    storage.set_queue_max_workers(_queue(queue), value)
    return value


def set_queue_zombie_timeout(queue: str, seconds: int | str | None) -> int | None:
    """Per-queue zombie timeout override in seconds (None = the global setting)."""
    value = _optional_int("zombie timeout", seconds, ZOMBIE_TIMEOUT_RANGE)
    storage.set_queue_zombie_timeout(_queue(queue), value)
    return value
