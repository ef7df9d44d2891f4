"""Memory mode — fetch_batch: selection, ordering, pause/hide, bulkheads, no double claims (spec 01 §4.2)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from chokaq_core import storage
from chokaq_core.domain import JobStatus, Success

from .conftest import Clock
from .rows import hot, new_job, pending, processing

pytestmark = pytest.mark.usefixtures("clock")


def staggered(queue: str, n: int, clock: Clock, **fields: object) -> list[str]:
    """``n`` Pending rows created one second apart, oldest first."""
    ids = []
    for _ in range(n):
        ids += pending(queue, **fields)  # type: ignore[arg-type]
        clock.advance(1)
    return ids


def test_claims_only_due_pending_rows_and_stamps_them(clock: Clock) -> None:
    buffered, running = staggered("claim", 2, clock)
    assert [j.id for j in storage.fetch_batch("w-other", 2, ["claim"])] == [buffered, running]
    assert storage.mark_processing(hot(running), "w-other") == 1
    due = pending("claim")[0]
    future = pending("claim", delay=3600)[0]
    clock.advance(5)

    claimed = storage.fetch_batch("w1", 10, ["claim"])

    assert [j.id for j in claimed] == [due]
    job = claimed[0]
    assert (job.status, job.worker_id, job.attempt_count) == (JobStatus.FETCHED, "w1", 0), "fetching is no attempt"
    row = hot(due)
    assert (row.status, row.worker_id, row.attempt_count, row.last_updated_at) == (1, "w1", 0, clock.now)
    assert hot(future).status == JobStatus.PENDING
    assert (hot(buffered).status, hot(buffered).worker_id) == (JobStatus.FETCHED, "w-other")
    assert hot(running).status == JobStatus.PROCESSING


def test_returned_rows_carry_the_stored_columns() -> None:
    job = new_job("cols", payload='{"a":1}', tags="x", priority=7, created_by="api", key="cols-key")
    storage.enqueue([job])
    [claimed] = storage.fetch_batch("w1", 5, ["cols"])
    assert (claimed.id, claimed.queue, claimed.type, claimed.payload, claimed.tags, claimed.priority,
            claimed.created_by, claimed.idempotency_key, claimed.scheduled_at) == (
        job.id, "cols", job.type, '{"a":1}', "x", 7, "api", "cols-key", None)
    assert claimed.created_at.tzinfo is not None


def test_a_row_becomes_claimable_once_its_scheduled_time_passes(clock: Clock) -> None:
    job_id = pending("later", delay=3600)[0]
    assert storage.fetch_batch("w1", 5, ["later"]) == []
    clock.advance(3599)
    assert storage.fetch_batch("w1", 5, ["later"]) == []
    clock.advance(1)
    assert [j.id for j in storage.fetch_batch("w1", 5, ["later"])] == [job_id], "due at exactly its time"


def test_a_claimed_row_is_not_claimed_again() -> None:
    job_id = pending("once")[0]
    assert [j.id for j in storage.fetch_batch("w1", 5, ["once"])] == [job_id]
    assert storage.fetch_batch("w2", 5, ["once"]) == []
    assert storage.fetch_batch("w1", 5, ["once"]) == []
    assert hot(job_id).worker_id == "w1"


def test_respects_the_limit() -> None:
    ids = pending("limit", 10)
    claimed = storage.fetch_batch("w1", 3, ["limit"])
    assert len(claimed) == 3
    assert sum(hot(i).status == JobStatus.FETCHED for i in ids) == 3
    assert storage.fetch_batch("w1", 0, ["limit"]) == []


def test_orders_by_priority_desc_then_due_time(clock: Clock) -> None:
    # name: (priority, created at t0 + s, delay s or None) — due time = scheduled_at else created_at
    spec = {
        "low_old": (1, 0, None),
        "mid_sched": (10, 0, 200),  # created first, due at +200: between mid_early and mid_late
        "mid_early": (10, 100, None),
        "mid_late": (10, 300, None),
        "high_new": (50, 500, None),
        "high_sched_early": (50, 540, -490),  # created last, due earliest among the 50s (at +50)
    }
    t0 = clock.now
    ids = {}
    for name, (priority, created, delay) in spec.items():
        clock.now = t0 + timedelta(seconds=created)
        ids[name] = pending("prio", priority=priority, delay=delay)[0]
    clock.advance(1000)
    expected = ["high_sched_early", "high_new", "mid_early", "mid_sched", "mid_late", "low_old"]

    top = storage.fetch_batch("w1", 3, ["prio"])
    rest = storage.fetch_batch("w1", 10, ["prio"])

    assert [j.id for j in top] == [ids[n] for n in expected[:3]]
    assert [j.id for j in rest] == [ids[n] for n in expected[3:]]


def test_equal_priority_and_due_time_claim_in_insertion_order() -> None:
    ids = pending("ties", 5)  # one frozen instant
    assert [j.id for j in storage.fetch_batch("w1", 5, ["ties"])] == ids


def test_skips_paused_queues_until_resumed() -> None:
    paused = pending("paused-q", 2)
    live = pending("live-q")[0]
    storage.set_queue_paused("paused-q", True)

    assert [j.id for j in storage.fetch_batch("w1", 10, ["paused-q", "live-q"])] == [live]
    assert storage.fetch_batch("w1", 10, None) == []

    storage.set_queue_paused("paused-q", False)
    assert sorted(j.id for j in storage.fetch_batch("w1", 10, ["paused-q"])) == sorted(paused)


def test_skips_hidden_queues_even_when_not_paused() -> None:
    hidden = pending("hidden-q")[0]
    assert storage.set_queue_active("hidden-q", False) is True
    storage.set_queue_paused("hidden-q", False)
    [state] = storage.queue_states()
    assert (state.is_active, state.is_paused) == (False, False)

    assert storage.fetch_batch("w1", 10, ["hidden-q"]) == []
    assert storage.fetch_batch("w1", 10, None) == []

    storage.set_queue_active("hidden-q", True)
    storage.set_queue_paused("hidden-q", False)
    assert [j.id for j in storage.fetch_batch("w1", 10, ["hidden-q"])] == [hidden]


def test_queue_filter_list() -> None:
    a, b, c = pending("qa", 2), pending("qb", 2), pending("qc", 2)
    assert storage.fetch_batch("w1", 10, []) == []
    assert sorted(j.id for j in storage.fetch_batch("w1", 10, ["qa", "qc"])) == sorted(a + c)
    assert all(hot(i).status == JobStatus.PENDING for i in b)
    assert storage.fetch_batch("w1", 10, ["nope"]) == []
    assert sorted(j.id for j in storage.fetch_batch("w1", 10, None)) == sorted(b)


def test_bulkhead_caps_fetched_plus_processing_per_queue(clock: Clock) -> None:
    storage.set_queue_max_workers("capped", 2)
    ids = staggered("capped", 5, clock)
    free = pending("uncapped", 3)

    first = storage.fetch_batch("w1", 10, ["capped", "uncapped"])
    assert sorted(j.id for j in first if j.queue == "capped") == sorted(ids[:2]), "the two oldest"
    assert len([j for j in first if j.queue == "uncapped"]) == 3
    assert storage.fetch_batch("w2", 10, ["capped"]) == [], "fleet-wide: another worker is capped too"

    job = next(j for j in first if j.queue == "capped")
    assert storage.mark_processing(job, "w1") == 1
    assert storage.fetch_batch("w2", 10, ["capped"]) == [], "Processing rows still count"

    storage.complete("w1", [Success(job.id, 1.0)], [], [])
    assert [j.id for j in storage.fetch_batch("w2", 10, ["capped"])] == [ids[2]]
    stats = {s.queue: s for s in storage.queue_stats()}
    assert stats["capped"].fetched + stats["capped"].processing == 2
    assert all(hot(i).status == JobStatus.FETCHED for i in free)


def test_bulkhead_counts_rows_claimed_before_the_cap_was_set(clock: Clock) -> None:
    running = processing("late-cap", "w0", 1)[0]
    waiting = staggered("late-cap", 4, clock)
    storage.set_queue_max_workers("late-cap", 3)

    claimed = storage.fetch_batch("w1", 10, ["late-cap"])

    assert sorted(j.id for j in claimed) == sorted(waiting[:2])
    assert hot(running.id).status == JobStatus.PROCESSING


def test_bulkhead_cleared_with_none() -> None:
    storage.set_queue_max_workers("uncap", 1)
    pending("uncap", 3)
    assert len(storage.fetch_batch("w1", 10, ["uncap"])) == 1
    storage.set_queue_max_workers("uncap", None)
    assert len(storage.fetch_batch("w1", 10, ["uncap"])) == 2


def test_two_workers_never_claim_the_same_row() -> None:
    total, limit = 500, 7
    ids = set(pending("race", total))
    claims: dict[str, list[str]] = {"w-a": [], "w-b": []}
    errors: list[BaseException] = []
    lockstep = threading.Barrier(2, timeout=30)

    def claim(worker: str) -> None:
        try:
            for _ in range(20):
                lockstep.wait()
                claims[worker].extend(j.id for j in storage.fetch_batch(worker, limit, ["race"]))
            while batch := storage.fetch_batch(worker, limit, ["race"]):
                claims[worker].extend(j.id for j in batch)
        except BaseException as exc:
            errors.append(exc)
            lockstep.abort()

    threads = [threading.Thread(target=claim, args=(w,)) for w in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    assert errors == []
    a, b = claims["w-a"], claims["w-b"]
    assert not set(a) & set(b), "a row was claimed by both workers"
    assert len(a) + len(b) == total and set(a) | set(b) == ids
    assert a and b
    assert all(hot(i).worker_id == "w-a" for i in a) and all(hot(i).worker_id == "w-b" for i in b)
