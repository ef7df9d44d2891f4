"""``deck_snapshot``: the live Deck's one statement agrees part for part with the separate reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from chokaq_core import storage
from chokaq_core.domain import FailureReason, JobFilter, JobStatus, Success, WorkerInfo
from chokaq_core.readmodel import SnapshotRequest

from .rows import archived, dead, fetched, pending, processing

EVERYTHING = dict(queues=True, workers=True, errors_limit=5)


def busy_engine() -> dict[str, list[str]]:
    """Rows in every state, counters, buckets, a paused queue, two registry rows and DLQ error groups."""
    ids = {
        "fetched": [j.id for j in fetched("snap-b", "w1", 2)],
        "processing": [j.id for j in processing("snap-b2", "w1", 2)],
        "archived": archived("snap-a", 2),
        "dead": dead("snap-c", 2, reason=FailureReason.TIMEOUT, details="Timeout: slow")
        + dead("snap-c", 1, reason=FailureReason.MAX_RETRIES_EXCEEDED, details="ValueError: bad\nline two"),
    }
    done = processing("snap-a", "w2", 1)[0]
    storage.complete("w2", [Success(done.id, 3.5)], [], [])
    ids["archived"].append(done.id)
    ids["pending"] = pending("snap-a", 3, tags="t1", created_by="me") + pending("snap-d", 1, delay=60)
    storage.set_queue_paused("snap-b", True)
    for name, running in (("wk-1", True), ("wk-2", False)):
        storage.upsert_worker(WorkerInfo(worker_id=name, hostname="h", pid=7, queues="*", capacity=4, active_count=1,
                                         is_running=running, circuits_json='[{"circuitKey": "x", "status": 1}]'))
    return ids


def snapshot(**asked: Any) -> Any:
    return storage.deck_snapshot(SnapshotRequest(active_limit=asked.pop("limit", 100), **asked))


def test_every_part_equals_its_own_read() -> None:
    ids = busy_engine()
    since = datetime.now(UTC) - timedelta(minutes=5)
    everyone = [i for group in ids.values() for i in group] + ["no-such-job", ids["dead"][0]]

    snap = snapshot(locate_ids=everyone, throughput_since=since, **EVERYTHING)

    assert snap.summary == storage.summary_stats()
    assert (snap.summary.pending, snap.summary.fetched, snap.summary.processing) == (4, 2, 2)
    assert snap.active == storage.list_active(JobFilter(), 100)
    assert len(snap.active) == 8 and all(r.created_at.tzinfo is not None for r in snap.active)
    assert snap.located == storage.locate_jobs(everyone)
    assert {snap.located[i] for i in ids["archived"]} == {JobStatus.SUCCEEDED}
    assert {snap.located[i] for i in ids["dead"]} == {JobStatus.FAILED}
    assert "no-such-job" not in snap.located
    assert snap.throughput == storage.throughput(since)
    assert sum(p.succeeded for p in snap.throughput) == 3 and sum(p.failed for p in snap.throughput) == 3
    assert snap.queue_states == storage.queue_states()
    assert [q.is_paused for q in snap.queue_states if q.name == "snap-b"] == [True]
    assert snap.queue_stats == storage.queue_stats()
    lags = storage.queue_health()
    assert [(q.queue, q.pending) for q in snap.queue_lags] == [(q.queue, q.pending) for q in lags]
    for mine, theirs in zip(snap.queue_lags, lags, strict=True):  # lag is measured against "now": moves a little
        assert abs(mine.max_lag_seconds - theirs.max_lag_seconds) < 5
    assert [q.pending for q in snap.queue_lags if q.queue == "snap-a"] == [3]
    assert [q.pending for q in snap.queue_lags if q.queue == "snap-d"] == [0], "not due yet"
    assert snap.workers == storage.list_workers() and {w.worker_id for w in snap.workers} == {"wk-1", "wk-2"}
    assert all(w.last_heartbeat_at is not None and w.last_heartbeat_at.tzinfo is not None for w in snap.workers)
    assert snap.errors == storage.top_errors(5)
    assert {(e.reason, e.count) for e in snap.errors} == {(FailureReason.TIMEOUT, 2), (FailureReason.MAX_RETRIES_EXCEEDED, 1)}


def test_parts_not_asked_for_are_none_and_limit_is_kept() -> None:
    busy_engine()

    snap = snapshot(limit=2)

    assert snap.throughput is None and snap.queue_states is None and snap.queue_stats is None
    assert snap.queue_lags is None and snap.workers is None and snap.errors is None
    assert snap.located == {} and snap.summary == storage.summary_stats()
    assert snap.active == storage.list_active(JobFilter(), 2)


def test_limits_are_those_of_the_separate_reads() -> None:
    busy_engine()

    snap = snapshot(limit=3, errors_limit=1)

    assert snap.active == storage.list_active(JobFilter(), 3) and len(snap.active) == 3
    assert snap.errors == storage.top_errors(1) and len(snap.errors) == 1


def test_empty_engine() -> None:
    snap = snapshot(locate_ids=["gone"], throughput_since=datetime.now(UTC), **EVERYTHING)

    assert snap.summary == storage.summary_stats() and snap.summary.total == 0
    assert snap.active == [] and snap.located == {} and snap.throughput == []
    assert snap.queue_states == snap.queue_stats == snap.queue_lags == snap.workers == snap.errors == []


class CountingCursor:
    def __init__(self, inner: Any) -> None:
        self.inner, self.statements = inner, 0

    def execute(self, *args: Any) -> Any:
        self.statements += 1
        return self.inner.execute(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_one_statement_whatever_is_asked() -> None:
    ids = busy_engine()
    module = storage.reads(storage.alias())
    request = SnapshotRequest(active_limit=100, locate_ids=ids["archived"] + ids["dead"],
                              throughput_since=datetime.now(UTC) - timedelta(minutes=5), queues=True, workers=True,
                              errors_limit=5)
    counted: list[int] = []

    def read(cursor: Any) -> Any:
        counting = CountingCursor(cursor)
        snap = module.deck_snapshot(counting, request)
        counted.append(counting.statements)
        return snap

    snap = storage.run(read)

    assert counted == [1]
    assert len(snap.located) == 6
