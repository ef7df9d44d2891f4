"""Memory mode — archive_zombies: expired Processing rows → DLQ Zombie (spec 01 §4.12, 02 §6)."""

from __future__ import annotations

import pytest

from chokaq_core import storage
from chokaq_core.domain import FailureReason, JobStatus, Retry

from .conftest import Clock
from .rows import counters, dlq_row, fetched, hot, of_kind, outcomes, processing

pytestmark = pytest.mark.usefixtures("clock")
ZOMBIE_TEXT = "Zombie: Worker heartbeat expired during execution"


def test_expired_heartbeats_go_to_the_dlq_as_zombies(clock: Clock, published: list) -> None:
    expired = processing("zq", "w-dead")[0]
    stuck_fetch = fetched("zq-f", "w-dead")[0]
    clock.advance(20 * 60)
    alive = processing("zq", "w1")[0]
    published.clear()

    moved = storage.archive_zombies(600)

    assert moved == [(expired.id, "zq")]
    assert storage.get_hot(expired.id) is None
    row = dlq_row(expired.id)
    assert (row.failure_reason, row.error_details, row.worker_id, row.attempt_count) == (
        FailureReason.ZOMBIE, ZOMBIE_TEXT, "w-dead", 1)
    assert (row.created_at, row.failed_at) == (expired.created_at, clock.now)
    assert storage.locate_jobs([expired.id]) == {expired.id: JobStatus.ZOMBIE}
    assert hot(alive.id).status == JobStatus.PROCESSING
    assert hot(stuck_fetch.id).status == JobStatus.FETCHED, "Fetched rows are not zombies"
    assert counters("zq") == (0, 1, 0)
    assert outcomes() == (0, 1)
    assert of_kind(published, "StatsUpdated")
    assert storage.archive_zombies(600) == []


def test_the_heartbeat_decides_and_last_update_stands_in_for_a_missing_one(clock: Clock) -> None:
    beating = processing("zq-hb", "w1")[0]
    retried = processing("zq-hb", "w1")[0]
    storage.complete("w1", [], [Retry(retried.id, 1, 0.0)], [])
    [again] = storage.fetch_batch("w1", 1, ["zq-hb"])
    clock.advance(20 * 60)
    storage.keep_alive([beating.id], "w1")
    assert storage.mark_processing(again, "w1") == 2  # heartbeat stamped now
    clock.advance(5)
    assert storage.archive_zombies(600) == []
    assert storage.archive_zombies(5) == [], "strictly older than the timeout"
    assert sorted(storage.archive_zombies(4)) == sorted([(beating.id, "zq-hb"), (retried.id, "zq-hb")])
    assert dlq_row(retried.id).attempt_count == 2, "zombies keep their attempt count"


def test_queue_zombie_timeout_overrides_the_global_one(clock: Clock) -> None:
    short = processing("zq-short", "w1")[0]
    default = processing("zq-default", "w1")[0]
    storage.set_queue_zombie_timeout("zq-short", 60)
    storage.set_queue_zombie_timeout("zq-long", 3600)
    clock.advance(15 * 60)
    long = processing("zq-long", "w1")[0]
    clock.advance(5 * 60)  # short and default: 20 min silent; long: 5 min

    assert storage.archive_zombies(30 * 60) == [(short.id, "zq-short")], "60 s override < 20 min < 30 min global"
    assert storage.archive_zombies(10 * 60) == [(default.id, "zq-default")]
    assert storage.archive_zombies(60) == [], "zq-long keeps its 1 h override"
    storage.set_queue_zombie_timeout("zq-long", None)
    assert storage.archive_zombies(60) == [(long.id, "zq-long")], "cleared override falls back to the global"
