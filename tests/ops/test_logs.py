"""Structured log events of spec 05 §3: every chokaq.* record carries event_id and event_name."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator

import pytest
from django.core.management import CommandError, call_command

from chokaq_core import health, logs
from chokaq_core.worker import Worker


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def chokaq_records() -> Iterator[list[logging.LogRecord]]:
    handler = ListHandler()
    logger = logging.getLogger("chokaq")
    logger.addHandler(handler)
    logs.install()
    yield handler.records
    logger.removeHandler(handler)


def ids(records: list[logging.LogRecord]) -> list[tuple[int, str]]:
    return [(r.event_id, r.event_name) for r in records]  # type: ignore[attr-defined]


def test_catalogue_is_the_spec_table() -> None:
    assert len(logs.EVENTS) == 39
    assert logs.EVENTS[1001] == "WorkerStopped" and logs.EVENTS[2023] == "JobRetriesExhaustedDlq"
    assert logs.EVENTS[4002] == "ZombieJobsArchived" and logs.EVENTS[6001] == "AdminCommandCompleted"
    assert logs.event("WorkerStopped") == {"event_id": 1001, "event_name": "WorkerStopped"}
    with pytest.raises(ValueError):
        logs.event(1999)


def test_ids_come_from_extra_or_from_the_message(chokaq_records: list[logging.LogRecord]) -> None:
    log = logging.getLogger("chokaq.test")
    log.warning("moved %s zombies", 3, extra=logs.event(4002))
    log.info("worker %s stopped (1001)", "w1")
    log.info("lease rejected for %s (2002): no longer Fetched", "j")
    log.info("nothing special (1234 is not an event)")
    logging.getLogger("other").warning("not ours (1001)")
    assert ids(chokaq_records) == [(4002, "ZombieJobsArchived"), (1001, "WorkerStopped"),
                                   (2002, "JobExecutionLeaseRejected"), (0, "General")]


@pytest.mark.django_db(transaction=True)
def test_a_worker_run_logs_started_and_stopped(chokaq_records: list[logging.LogRecord],
                                               fast: Callable[..., None]) -> None:
    worker = Worker()
    worker.start()
    worker.stop()
    assert worker.stopped.wait(30)
    names = [name for _, name in ids(chokaq_records)]
    assert "WorkerStarted" in names and "WorkerStopped" in names
    assert all(isinstance(r.event_id, int) for r in chokaq_records)  # type: ignore[attr-defined]


def test_json_formatter() -> None:
    record = logging.LogRecord("chokaq.worker", logging.ERROR, __file__, 1, "fetch failed (1002 WorkerLoopCrashed)",
                               None, None)
    logs.EventIdFilter().filter(record)
    document = json.loads(logs.JsonFormatter().format(record))
    assert (document["event_id"], document["event_name"], document["level"], document["logger"]) == (
        1002, "WorkerLoopCrashed", "ERROR", "chokaq.worker")


@pytest.mark.django_db(transaction=True)
def test_worker_refuses_a_missing_schema_with_5002(chokaq_records: list[logging.LogRecord],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "REQUIRED_TABLES", (*health.REQUIRED_TABLES, "chokaq_missing"))
    with pytest.raises(CommandError, match="missing required tables: chokaq_missing"):
        call_command("chokaq_worker", "--burst")
    assert (5002, "SqlInitializationFailed") in ids(chokaq_records)
