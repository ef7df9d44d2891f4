"""Worker registry, MetricBuckets retention and recurring-job ticks (spec 01 §4.17, spec 05 operations)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from chokaq_core import storage
from chokaq_core.api import EnqueueOptions, build
from chokaq_core.domain import Success, WorkerInfo
from chokaq_core.models import MetricBuckets, Schedules, Workers

from .rows import age, close_to, hot_ids, pending, processing


def worker(worker_id: str, **extra: Any) -> WorkerInfo:
    fields: dict[str, Any] = {"hostname": "h", "pid": 1, "queues": "*", "capacity": 3, "active_count": 1, **extra}
    return WorkerInfo(worker_id=worker_id, **fields)


def test_worker_registry_upsert_stop_list_and_purge(small_batches: int) -> None:
    storage.upsert_worker(worker("old"))
    for i in range(4):
        storage.upsert_worker(worker(f"stale-{i}"))
    age(2 * 86400, [Workers])
    started = Workers.objects.get(worker_id="old").started_at
    storage.upsert_worker(worker("new"))
    storage.upsert_worker(worker("old", capacity=7, active_count=2, hostname="elsewhere"))
    storage.stop_worker("old")
    storage.stop_worker("no-such-worker")
    now = timezone.now()

    rows = storage.list_workers()
    assert {w.worker_id for w in rows[:2]} == {"old", "new"}, "freshest heartbeat first"
    assert [w.worker_id for w in rows[2:]] == [f"stale-{i}" for i in (3, 2, 1, 0)]
    new, old = (next(w for w in rows if w.worker_id == name) for name in ("new", "old"))
    assert (new.is_running, new.capacity, new.active_count) == (True, 3, 1) and close_to(new.last_heartbeat_at, now)
    assert new.last_heartbeat_at is not None and new.last_heartbeat_at.tzinfo is not None
    assert (old.is_running, old.capacity, old.active_count) == (False, 7, 0) and close_to(old.stopped_at, now)
    assert (old.started_at, old.hostname) == (started, "elsewhere"), "an upsert keeps the first start only"
    storage.upsert_worker(worker("idle", is_running=False))
    assert [w.is_running for w in storage.list_workers() if w.worker_id == "idle"] == [False], (
        "the registry row says what the worker reported")

    batches: list[int] = []
    assert storage.purge_workers(now - timedelta(days=1), batches.append) == 4
    assert batches == [2, 2]
    assert {w.worker_id for w in storage.list_workers()} == {"new", "old", "idle"}


def test_purge_metric_buckets_leaves_recent_ones() -> None:
    jobs = processing("mb", "w1", 3)
    for job in jobs:
        storage.complete("w1", [Success(job.id, 1.0)], [], [])
        age(3600, [MetricBuckets])  # the oldest bucket moves first: no two rows ever share a second
    assert MetricBuckets.objects.count() == 3
    assert storage.purge_metric_buckets(timezone.now() - timedelta(hours=1, minutes=30)) == 2
    assert sum(p.succeeded for p in storage.throughput(datetime(2000, 1, 1, tzinfo=UTC))) == 1


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
    assert Schedules.objects.get(name="nightly").last_tick_at == t2


def test_a_failing_enqueue_rolls_back_its_tick_claim() -> None:
    t1 = datetime(2026, 1, 1, tzinfo=UTC)
    storage.enqueue_scheduled("clash", t1, _job("clash"))
    existing = pending("q")[0]
    clashing = replace(_job("clash"), id=existing)
    with pytest.raises(Exception):  # noqa: B017 - IntegrityError on the duplicate id
        storage.enqueue_scheduled("clash", t1 + timedelta(minutes=1), clashing)
    assert storage.schedule_ticks() == {"clash": t1}, "the tick claim and the enqueue are one transaction"
