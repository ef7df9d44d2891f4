"""Memory mode — queue controls, worker registry, bucket purges, schedule ticks (spec 01 §4.17, issue 5)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chokaq_core import storage
from chokaq_core.api import EnqueueOptions, build
from chokaq_core.domain import Success, WorkerInfo

from .conftest import Clock
from .rows import hot_ids, of_kind, outcomes, pending, processing

pytestmark = pytest.mark.usefixtures("clock")


def state(name: str) -> tuple[bool, bool, int | None, int | None]:
    q = next(q for q in storage.queue_states() if q.name == name)
    return q.is_paused, q.is_active, q.zombie_timeout_seconds, q.max_workers


def test_queue_controls_upsert_and_keep_each_other(published: list) -> None:
    storage.set_queue_paused("new-paused", True)
    assert state("new-paused") == (True, True, None, None)
    assert of_kind(published, "QueueStateChanged") == [{"queueName": "new-paused", "isPaused": True, "isActive": True}]

    pending("pz")
    storage.set_queue_max_workers("pz", 4)
    storage.set_queue_zombie_timeout("pz", 120)
    storage.set_queue_paused("pz", True)
    assert state("pz") == (True, True, 120, 4)
    storage.set_queue_paused("pz", False)
    storage.set_queue_zombie_timeout("pz", None)
    storage.set_queue_max_workers("pz", None)
    assert state("pz") == (False, True, None, None)
    assert [q.name for q in storage.queue_states()] == ["new-paused", "pz"]


def test_set_queue_active_pauses_in_both_directions_and_never_creates_a_row(published: list) -> None:
    pending("act")
    assert storage.set_queue_active("act", False) is True
    assert state("act")[:2] == (True, False)
    storage.set_queue_paused("act", False)
    assert storage.set_queue_active("act", True) is True
    assert state("act")[:2] == (True, True), "unhiding leaves the queue paused until resumed"
    assert [(e["isPaused"], e["isActive"]) for e in of_kind(published, "QueueStateChanged")] == [
        (True, False), (False, False), (True, True)]
    assert storage.set_queue_active("ghost", False) is False
    assert "ghost" not in {q.name for q in storage.queue_states()}


def worker(worker_id: str, **extra: Any) -> WorkerInfo:
    fields: dict[str, Any] = {"hostname": "h", "pid": 1, "queues": "*", "capacity": 3, "active_count": 1, **extra}
    return WorkerInfo(worker_id=worker_id, **fields)


def test_worker_registry_upsert_stop_list_and_purge(clock: Clock, small_batches: int) -> None:
    started = clock.now
    storage.upsert_worker(worker("old"))
    for i in range(4):
        storage.upsert_worker(worker(f"stale-{i}"))
    clock.advance(2 * 86400)
    storage.upsert_worker(worker("new"))
    storage.upsert_worker(worker("old", capacity=7, active_count=2, hostname="elsewhere"))
    storage.stop_worker("old")
    storage.stop_worker("no-such-worker")

    rows = storage.list_workers()
    assert [w.worker_id for w in rows] == ["new", "old", *(f"stale-{i}" for i in range(4))]
    new, old = rows[0], rows[1]
    assert (new.is_running, new.capacity, new.active_count, new.last_heartbeat_at) == (True, 3, 1, clock.now)
    assert (old.is_running, old.stopped_at, old.capacity, old.active_count) == (False, clock.now, 7, 0)
    assert (old.started_at, old.hostname) == (started, "h"), "an upsert keeps the first start and the host"

    batches: list[int] = []
    assert storage.purge_workers(clock.now - timedelta(days=1), batches.append) == 4
    assert batches == [2, 2]
    assert [w.worker_id for w in storage.list_workers()] == ["new", "old"]


def test_purge_metric_buckets_leaves_recent_ones(clock: Clock) -> None:
    jobs = processing("mb", "w1", 3)
    for job in jobs:
        storage.complete("w1", [Success(job.id, 1.0)], [], [])
        clock.advance(3600)
    assert storage.purge_metric_buckets(clock.now - timedelta(hours=1, minutes=30)) == 2
    assert outcomes() == (1, 0)


def _job(name: str) -> Any:
    return build(EnqueueOptions("test.ok.v1", {"schedule": name}))


def test_schedule_tick_claimed_once() -> None:
    t1 = datetime(2026, 1, 1, 3, 0, tzinfo=UTC)
    assert storage.enqueue_scheduled("nightly", t1, _job("nightly")) is None  # first sight
    assert storage.schedule_ticks() == {"nightly": t1}
    assert storage.enqueue_scheduled("nightly", t1, _job("nightly")) is None
    t2 = t1 + timedelta(days=1)
    job = _job("nightly")
    assert storage.enqueue_scheduled("nightly", t2, job) == job.id
    assert storage.enqueue_scheduled("nightly", t2, _job("nightly")) is None
    assert storage.enqueue_scheduled("nightly", t1, _job("nightly")) is None  # never backwards
    assert hot_ids() == {job.id}
    assert storage.schedule_ticks() == {"nightly": t2}


def test_a_failing_enqueue_rolls_back_its_tick_claim() -> None:
    t1 = datetime(2026, 1, 1, tzinfo=UTC)
    storage.enqueue_scheduled("clash", t1, _job("clash"))
    existing = pending("q")[0]
    clashing = replace(_job("clash"), id=existing)
    with pytest.raises(Exception):  # noqa: B017 - IntegrityError on the duplicate id
        storage.enqueue_scheduled("clash", t1 + timedelta(minutes=1), clashing)
    assert storage.schedule_ticks() == {"clash": t1}, "the tick claim and the enqueue are one transaction"
