"""Structured log events of spec 05 §3: every ``chokaq.*`` record carries ``event_id`` and ``event_name``.

Alert on ids, not on text. A log call states its event either explicitly::

    logger.warning("moved %s zombie jobs to the DLQ", n, extra=event(4002))

or, the engine's convention, with the id in parentheses in its message
(``"worker %s stopped (1001)"``): :class:`EventIdFilter` reads it. Records with
no id carry ``event_id = 0`` and ``event_name = "General"``.

:func:`install` (run by the app's ``ready()``) adds the filter to the handlers
of the ``chokaq`` logger and of the root logger; a ``LOGGING`` config can also
name ``chokaq_core.logs.EventIdFilter`` on its handlers, and
``chokaq_core.logs.JsonFormatter`` prints one JSON object per record.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime
from typing import Any

EVENTS: dict[int, str] = {
    # 1000 worker
    1000: "WorkerStarted", 1001: "WorkerStopped", 1002: "WorkerLoopCrashed", 1003: "WorkerLoopStoppedUnexpectedly",
    1004: "WorkerCapacityChanged", 1010: "PrefetchedJobReleased", 1011: "PrefetchedJobReleaseFailed",
    1012: "ProcessingTaskDrainStarted", 1013: "ProcessingTaskShutdownObserved", 1014: "ProcessingTaskWrapperFailed",
    1015: "WorkerShutdownTimedOut", 1016: "ProcessingTaskDrainTimedOut",
    # 2000 execution
    2000: "JobCancellationRequested", 2001: "CircuitBreakerRejected", 2002: "JobExecutionLeaseRejected",
    2003: "JobSucceededArchived", 2004: "JobShutdownRescheduled", 2005: "JobTimedOutOrCancelled",
    2006: "JobHeartbeatWriteFailed", 2007: "JobHeartbeatThresholdReached", 2008: "JobHeartbeatDegraded",
    2020: "JobFatalErrorDlq", 2021: "JobThrottledRetryScheduled", 2022: "JobTransientRetryScheduled",
    2023: "JobRetriesExhaustedDlq",
    # 2100 state / notify
    2100: "StateTransitionNotApplied", 2110: "NotificationFailed",
    # 3000 enqueue
    3000: "EnqueueDuplicateSkipped", 3001: "EnqueueNotificationFailed",
    # 4000 recovery
    4000: "ZombieRescueStarted", 4001: "AbandonedJobsRecovered", 4002: "ZombieJobsArchived",
    4003: "ZombieRescueCycleFailed",
    # 5000 storage
    5000: "SqlInitializationStarted", 5001: "SqlInitializationCompleted", 5002: "SqlInitializationFailed",
    5003: "SqlScriptExecutionFailed",
    # 6000 admin
    6000: "AdminCommandRejected", 6001: "AdminCommandCompleted",
}
NAMES: dict[str, int] = {name: number for number, name in EVENTS.items()}
GENERAL = (0, "General")
_MARKER = re.compile(r"\((\d{4})\b")


def event(which: int | str) -> dict[str, Any]:
    """``extra=`` for a log call: ``event(1001)`` or ``event("WorkerStopped")``."""
    number = which if isinstance(which, int) else NAMES[which]
    if number not in EVENTS:
        raise ValueError(f"unknown ChokaQ log event {which!r}")
    return {"event_id": number, "event_name": EVENTS[number]}


def event_of(message: str) -> tuple[int, str]:
    """The event a message names with ``(NNNN``; ``(0, "General")`` when none."""
    for match in _MARKER.finditer(message):
        number = int(match.group(1))
        if number in EVENTS:
            return number, EVENTS[number]
    return GENERAL


class EventIdFilter(logging.Filter):
    """Give every ``chokaq.*`` record ``event_id`` / ``event_name`` (explicit ``extra`` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "chokaq" or record.name.startswith("chokaq."):
            number = getattr(record, "event_id", None)
            if not isinstance(number, int):
                record.event_id, record.event_name = event_of(str(record.msg))
            elif not getattr(record, "event_name", None):
                record.event_name = EVENTS.get(number, GENERAL[1])
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, event id and name, exception."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(), "level": record.levelname,
            "logger": record.name, "message": record.getMessage(),
            "event_id": getattr(record, "event_id", None), "event_name": getattr(record, "event_name", None),
        }
        if record.exc_info:
            document["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(document, ensure_ascii=False, default=str)


def install() -> None:
    """Attach :class:`EventIdFilter` to the handlers of the ``chokaq`` and root loggers (once each)."""
    for logger in (logging.getLogger("chokaq"), logging.getLogger()):
        for handler in logger.handlers:
            if not any(isinstance(f, EventIdFilter) for f in handler.filters):
                handler.addFilter(EventIdFilter())
