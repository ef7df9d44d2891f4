"""Memory mode — ``deck_snapshot``: every part equals its own read; parts not asked for are None (issue 7)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from chokaq_core import storage
from chokaq_core.domain import FailureReason, JobFilter, JobStatus, SnapshotRequest, Success, WorkerInfo

from .conftest import Clock
from .rows import archived, dead, fetched, pending, processing

pytestmark = pytest.mark.usefixtures("clock")

EVERYTHING = dict(queues=True, workers=True, errors_limit=5)


def busy_engine(clock: Clock) -> dict[str, list[str]]:
    """Rows in every state, counters, buckets, a paused queue, two registry rows and DLQ error groups."""
    ids = {
        "fetched": [j.id for j in fetched("snap-b", "w1", 2)],
        "processing": [j.id for j in processing("snap-b2", "w1", 2)],
        "archived": archived("snap-a", 2),
        "dead": dead("snap-c", 2, reason=FailureReason.TIMEOUT, details="Timeout: slow")
        + dead("snap-c", 1, reason=FailureReason.MAX_RETRIES_EXCEEDED, details="ValueError: bad\nline two"),
    }
    clock.advance(1)
    done = processing("snap-a", "w2", 1)[0]
    storage.complete("w2", [Success(done.id, 3.5)], [], [])
    ids["archived"].append(done.id)
    clock.advance(1)
    ids["pending"] = pending("snap-a", 3, tags="t1", created_by="me") + pending("snap-d", 1, delay=60)
    storage.set_queue_paused("snap-b", True)
    for name, running in (("wk-1", True), ("wk-2", False)):
        storage.upsert_worker(WorkerInfo(worker_id=name, hostname="h", pid=7, queues="*", capacity=4, active_count=1,
                                         is_running=running, circuits_json='[{"circuitKey": "x", "status": 1}]'))
    clock.advance(2.5)
    return ids


def snapshot(**asked: Any) -> Any:
    return storage.deck_snapshot(SnapshotRequest(active_limit=asked.pop("limit", 100), **asked))


def test_every_part_equals_its_own_read(clock: Clock) -> None:
    ids = busy_engine(clock)
    since = clock.now - timedelta(minutes=5)
    everyone = [i for group in ids.values() for i in group] + ["no-such-job", ids["dead"][0]]

    snap = snapshot(locate_ids=everyone, throughput_since=since, **EVERYTHING)

    assert snap.summary == storage.summary_stats()
    assert (snap.summary.pending, snap.summary.fetched, snap.summary.processing) == (4, 2, 2)
    assert snap.active == storage.list_active(JobFilter(), 100) and len(snap.active) == 8
    assert snap.located == storage.locate_jobs(everyone)
    assert {snap.located[i] for i in ids["archived"]} == {JobStatus.SUCCEEDED}
    assert {snap.located[i] for i in ids["dead"]} == {JobStatus.FAILED}
    assert "no-such-job" not in snap.located
    assert snap.throughput == storage.throughput(since)
    assert sum(p.succeeded for p in snap.throughput) == 3 and sum(p.failed for p in snap.throughput) == 3
    assert snap.queue_states == storage.queue_states()
    assert [q.is_paused for q in snap.queue_states if q.name == "snap-b"] == [True]
    assert snap.queue_stats == storage.queue_stats()
    assert snap.queue_lags == storage.queue_health(), "the frozen clock makes the lag exact"
    assert [q.pending for q in snap.queue_lags if q.queue == "snap-a"] == [3]
    assert [q.pending for q in snap.queue_lags if q.queue == "snap-d"] == [0], "not due yet"
    assert snap.workers == storage.list_workers() and [w.worker_id for w in snap.workers] == ["wk-1", "wk-2"]
    assert snap.errors == storage.top_errors(5)
    assert {(e.reason, e.count) for e in snap.errors} == {(FailureReason.TIMEOUT, 2),
                                                          (FailureReason.MAX_RETRIES_EXCEEDED, 1)}


def test_limits_are_those_of_the_separate_reads(clock: Clock) -> None:
    busy_engine(clock)

    snap = snapshot(limit=3, errors_limit=1)

    assert snap.active == storage.list_active(JobFilter(), 3) and len(snap.active) == 3
    assert snap.errors == storage.top_errors(1) and len(snap.errors) == 1


def test_parts_not_asked_for_are_none(clock: Clock) -> None:
    busy_engine(clock)

    snap = snapshot(limit=2)

    assert snap.throughput is None and snap.queue_states is None and snap.queue_stats is None
    assert snap.queue_lags is None and snap.workers is None and snap.errors is None
    assert snap.located == {} and snap.summary == storage.summary_stats()
    assert snap.active == storage.list_active(JobFilter(), 2)


def test_empty_engine(clock: Clock) -> None:
    snap = snapshot(locate_ids=["gone"], throughput_since=clock.now - timedelta(hours=1), **EVERYTHING)

    assert snap.summary == storage.summary_stats() and snap.summary.total == 0
    assert snap.active == [] and snap.located == {} and snap.throughput == []
    assert snap.queue_states == snap.queue_stats == snap.queue_lags == snap.workers == snap.errors == []
