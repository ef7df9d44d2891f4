"""Storage calls of issue 5: worker registry reads and purges, bucket purges, schedule tick claims."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connections

from chokaq_core import storage
from chokaq_core.api import EnqueueOptions, build
from chokaq_core.domain import WorkerInfo
from chokaq_core.models import JobsHot, MetricBuckets, Schedules, Workers

pytestmark = pytest.mark.django_db(transaction=True)


def worker(worker_id: str, **extra: Any) -> WorkerInfo:
    return WorkerInfo(worker_id=worker_id, hostname="h", pid=1, queues="*", capacity=3, active_count=1, **extra)


def test_list_workers_freshest_first() -> None:
    storage.upsert_worker(worker("old"))
    Workers.objects.filter(worker_id="old").update(last_heartbeat_at=datetime.now(UTC) - timedelta(minutes=5))
    storage.upsert_worker(worker("new"))
    storage.stop_worker("old")
    rows = storage.list_workers()
    assert [w.worker_id for w in rows] == ["new", "old"]
    assert (rows[0].is_running, rows[0].capacity, rows[0].active_count) == (True, 3, 1)
    assert rows[1].is_running is False and rows[1].stopped_at is not None
    assert rows[0].last_heartbeat_at is not None and rows[0].last_heartbeat_at.tzinfo is not None


def test_purge_workers_in_batches(chokaq_settings: Any) -> None:
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "SQL": {"CLEANUP_BATCH_SIZE": 2}}
    for i in range(5):
        storage.upsert_worker(worker(f"stale-{i}"))
    storage.upsert_worker(worker("fresh"))
    Workers.objects.exclude(worker_id="fresh").update(last_heartbeat_at=datetime.now(UTC) - timedelta(days=2))
    batches: list[int] = []
    assert storage.purge_workers(datetime.now(UTC) - timedelta(days=1), batches.append) == 5
    assert batches == [2, 2, 1]
    assert list(Workers.objects.values_list("worker_id", flat=True)) == ["fresh"]


def test_purge_metric_buckets_leaves_recent_ones() -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    for hours in (1, 30, 50):
        MetricBuckets.objects.create(bucket_start=now - timedelta(hours=hours), queue="q", outcome=0,
                                     failure_reason=-1, completed_count=1)
    assert storage.purge_metric_buckets(now - timedelta(hours=24)) == 2
    assert MetricBuckets.objects.count() == 1


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
    assert list(JobsHot.objects.values_list("id", flat=True)) == [job.id]
    assert Schedules.objects.get(name="nightly").last_tick_at == t2


def test_concurrent_claims_enqueue_one_job() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    storage.enqueue_scheduled("every", t0, _job("every"))
    tick = t0 + timedelta(minutes=1)
    barrier = threading.Barrier(4)
    results: list[str | None] = []

    def claim() -> None:
        try:
            barrier.wait()
            results.append(storage.enqueue_scheduled("every", tick, _job("every")))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claim) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 4
    assert len([r for r in results if r]) == 1
    assert JobsHot.objects.count() == 1
