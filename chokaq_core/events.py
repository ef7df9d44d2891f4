"""The push contract between the engine and the Deck (spec 04 §7).

Catalogue of event kinds (``data`` fields):

* ``JobUpdated`` — jobId, type, queue, status, attemptCount, priority, durationMs, createdBy, startedAtUtc.
  Enqueue committed (Pending, 0); lease gate passed (Processing); reschedule (Pending); Hot edit.
* ``JobProgress`` — jobId, percentage, message. A handler called ``ctx.progress``.
* ``JobArchived`` — jobId, queue. Success moved the row to Archive.
* ``JobFailed`` — jobId, queue, reason (FailureReason name). A single move to the DLQ.
* ``JobResurrected`` — jobId, queue. Single resurrection (bulk sends StatsUpdated).
* ``JobsPurged`` — jobIds, source ("DLQ"/"Archive"), count.
* ``QueueStateChanged`` — queueName, isPaused, isActive.
* ``StatsUpdated`` — {} after any change of counters.
* ``BulkProgress`` — actionId, command, done, total, finished, level, message. A bulk-by-filter run of the
  Deck committed a batch (or ended); ``actionId`` is the run's audit entry.
* ``OperatorAction`` — actionId, command. The Deck logged an operator command (its console reads the audit
  log only when this arrives, so open tabs cost no audit-log query per tick).

Storage publishes with :func:`publish` *after commit* (never on rollback).
Delivery is best effort: the database is the source of truth. Events reach

1. in-process listeners (:func:`add_listener`), synchronously on the
   committing thread — the Deck's broadcaster and the tests use them; and
2. the channel layer group ``chokaq.deck`` when a cross-process layer
   (Redis) is configured: a background thread coalesces events for
   ``CHOKAQ["EVENTS"]["COALESCE_INTERVAL"]`` (200 ms) and sends one
   ``{"type": "deck.events", "events": [...]}`` message per tick, so
   thousands of jobs per second do not become thousands of frames.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import connections, transaction
from django.dispatch import Signal

from chokaq_core.conf import config

logger = logging.getLogger("chokaq.events")

GROUP = "chokaq.deck"
operator_command = Signal()
"""Sent for a command an operator ran outside the Deck (``manage.py chokaq_queue``), with ``command`` (the
service verb), ``actor``, ``scope`` and ``message``: the Deck, when installed, records it in its audit log."""
MESSAGE_TYPE = "deck.events"


class EventKind(StrEnum):
    JOB_UPDATED = "JobUpdated"
    JOB_PROGRESS = "JobProgress"
    JOB_ARCHIVED = "JobArchived"
    JOB_FAILED = "JobFailed"
    JOB_RESURRECTED = "JobResurrected"
    JOBS_PURGED = "JobsPurged"
    QUEUE_STATE_CHANGED = "QueueStateChanged"
    STATS_UPDATED = "StatsUpdated"
    OPERATOR_ACTION = "OperatorAction"
    BULK_PROGRESS = "BulkProgress"


@dataclass(frozen=True, slots=True)
class Event:
    kind: EventKind
    data: dict[str, Any] = field(default_factory=dict)
    ts: str = field(default_factory=lambda: datetime.now(UTC).isoformat())

    def as_message(self) -> dict[str, Any]:
        return {"event": str(self.kind), "data": self.data, "ts": self.ts}


Listener = Callable[[Event], None]
_listeners: list[Listener] = []
_listeners_lock = threading.Lock()


def add_listener(listener: Listener) -> None:
    with _listeners_lock:
        _listeners.append(listener)


def remove_listener(listener: Listener) -> None:
    with _listeners_lock:
        if listener in _listeners:
            _listeners.remove(listener)


Produced = list[Event] | Callable[[], list[Event]]
"""Events, or their producer: a callable building them, called only when someone hears them (an in-process
listener or the channel-layer publisher, see ``dispatch``)."""


def publish(events: Produced, using: str | None = None) -> None:
    """Deliver ``events`` once the current transaction on ``using`` commits (now if none is open)."""
    if not events:
        return
    connection = connections[using or "default"]
    if connection.in_atomic_block:
        transaction.on_commit(lambda: dispatch(events), using=connection.alias)
    else:
        dispatch(events)


def dispatch(events: Produced) -> None:
    """Hand committed events to listeners and the channel-layer publisher; never raises. Given a producer, it builds
    them only when someone hears them: a process with no listener and no channel layer (a worker without the Deck's
    Redis) builds no event for the jobs it claims, leases and completes."""
    with _listeners_lock:
        listeners = list(_listeners)
    publisher = _publisher()
    if not listeners and publisher is None:
        return
    if callable(events):
        try:
            events = events()
        except Exception:
            logger.exception("building events failed")
            return
    for listener in listeners:
        for event in events:
            try:
                listener(event)
            except Exception:  # a listener's bug must never affect a state transition
                logger.exception("event listener failed")
    if publisher is not None:
        publisher.offer(events)


# ---------------------------------------------------------------- helpers for producers


def job_updated(job_id: str, type_key: str, queue: str, status: int, attempt_count: int, *, ts: str | None = None,
                **extra: Any) -> Event:
    """``ts``: the event's time when the caller stamps a whole batch with one (default: now)."""
    data = {"jobId": job_id, "type": type_key, "queue": queue, "status": int(status), "attemptCount": attempt_count,
            "priority": extra.get("priority"), "durationMs": extra.get("duration_ms"),
            "createdBy": extra.get("created_by"), "startedAtUtc": extra.get("started_at")}
    return Event(EventKind.JOB_UPDATED, data) if ts is None else Event(EventKind.JOB_UPDATED, data, ts)


def stats_updated(ts: str | None = None) -> Event:
    """``ts``: the moment the caller already took for its batch of events (now by default)."""
    return Event(EventKind.STATS_UPDATED, {}) if ts is None else Event(EventKind.STATS_UPDATED, {}, ts)


def operator_action(action_id: int, command: str) -> Event:
    return Event(EventKind.OPERATOR_ACTION, {"actionId": action_id, "command": command})


def bulk_progress(action_id: int, command: str, done: int, total: int, *, finished: bool, level: str,
                  message: str) -> Event:
    return Event(EventKind.BULK_PROGRESS, {"actionId": action_id, "command": command, "done": done, "total": total,
                                           "finished": finished, "level": level, "message": message})


# ---------------------------------------------------------------- channel-layer publisher


class CoalescingPublisher:
    """Batches events per tick and sends them to the channel layer from one thread with its own loop."""

    def __init__(self, layer: Any, interval: float) -> None:
        self.layer = layer
        self.interval = interval
        self._pending: list[Event] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chokaq-events", daemon=True)
        self._thread.start()

    def offer(self, events: list[Event]) -> None:
        with self._lock:
            self._pending.extend(events)
        self._wake.set()

    def flush(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        with self._lock:
            events, self._pending = self._pending, []
        if not events:
            return
        message = {"type": MESSAGE_TYPE, "events": [e.as_message() for e in coalesce(events)]}
        own_loop = loop or asyncio.new_event_loop()
        try:
            for attempt in range(1, 4):
                try:
                    own_loop.run_until_complete(self.layer.group_send(GROUP, message))
                    return
                except Exception:
                    if attempt == 3:
                        logger.warning("event publish failed after 3 tries (2110)", exc_info=True)
                        return
                    time.sleep(min(0.5, 0.05 * 2 ** (attempt - 1)))
        finally:
            if loop is None:
                own_loop.close()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        while True:
            self._wake.wait()
            time.sleep(self.interval)
            self._wake.clear()
            self.flush(loop)


def coalesce(events: list[Event]) -> list[Event]:
    """Drop repeats inside one tick: one StatsUpdated, the last JobUpdated/JobProgress per job."""
    out: list[Event] = []
    index: dict[tuple[str, str], int] = {}
    for event in events:
        key = _coalesce_key(event)
        if key is None:
            out.append(event)
        elif key in index:
            out[index[key]] = event
        else:
            index[key] = len(out)
            out.append(event)
    return out


def _coalesce_key(event: Event) -> tuple[str, str] | None:
    if event.kind == EventKind.STATS_UPDATED:
        return ("stats", "")
    if event.kind in (EventKind.JOB_UPDATED, EventKind.JOB_PROGRESS):
        return (str(event.kind), str(event.data.get("jobId")))
    if event.kind == EventKind.BULK_PROGRESS:  # the latest count of a run (its last one says it finished)
        return (str(event.kind), str(event.data.get("actionId")))
    return None


_publisher_instance: CoalescingPublisher | None = None
_publisher_checked = False
_publisher_lock = threading.Lock()


def _publisher() -> CoalescingPublisher | None:
    """The process's publisher, or None without a cross-process channel layer."""
    global _publisher_instance, _publisher_checked
    if _publisher_checked:
        return _publisher_instance
    with _publisher_lock:
        if not _publisher_checked:
            _publisher_instance = _build_publisher()
            _publisher_checked = True
    return _publisher_instance


def _build_publisher() -> CoalescingPublisher | None:
    layer = _cross_process_layer()
    return None if layer is None else CoalescingPublisher(layer, config().EVENTS.COALESCE_INTERVAL)


def reset_publisher() -> None:
    """Forget the cached publisher (settings changed in tests)."""
    global _publisher_instance, _publisher_checked
    with _publisher_lock:
        _publisher_instance, _publisher_checked = None, False


# ---------------------------------------------------------------- Deck → worker control (spec 03 §12)

CONTROL_GROUP = "chokaq.workers"
CONTROL_TYPES = ("worker.set_capacity", "worker.set_retry_policy", "worker.cancel_job", "worker.set_circuit")


def _cross_process_layer() -> Any | None:
    """The channel layer between processes, or None: none is configured, or the in-memory one, which is bound to
    the web process's event loop (the Deck receives in-process events through ``add_listener`` instead)."""
    layer = get_channel_layer()
    return None if layer is None or isinstance(layer, InMemoryChannelLayer) else layer


def send_control(message: dict[str, Any]) -> bool:
    """Broadcast a control message to every worker; False when no cross-process layer exists
    (the Deck then warns that the command cannot reach workers)."""
    if message.get("type") not in CONTROL_TYPES:
        raise ValueError(f"unknown control message type {message.get('type')!r}")
    layer = _cross_process_layer()
    if layer is None:
        return False
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(layer.group_send(CONTROL_GROUP, message))
    finally:
        loop.close()
    return True


def listen_control(handler: Callable[[dict[str, Any]], None], stop: threading.Event) -> None:
    """Block (on the calling thread) delivering control messages to ``handler`` until ``stop`` is set.
    Returns at once without a cross-process layer: best effort, the database stays authoritative."""
    layer = _cross_process_layer()
    if layer is None:
        return

    async def run() -> None:
        channel = await layer.new_channel()
        await layer.group_add(CONTROL_GROUP, channel)
        try:
            while not stop.is_set():
                try:
                    message = await asyncio.wait_for(layer.receive(channel), timeout=1.0)
                except TimeoutError:
                    continue
                try:
                    handler(message)
                except Exception:
                    logger.exception("control message handler failed")
        finally:
            await layer.group_discard(CONTROL_GROUP, channel)

    loop = asyncio.new_event_loop()
    try:
        while not stop.is_set():
            try:
                loop.run_until_complete(run())
            except Exception:
                logger.warning("control channel lost; retrying in 5 s", exc_info=True)
                stop.wait(5)
    finally:
        loop.close()
