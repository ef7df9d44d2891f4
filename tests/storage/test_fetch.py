"""storage.fetch_batch: selection, ordering, pause/hide, bulkheads, no double claims (spec 01 §4.2)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from chokaq_core import storage
from chokaq_core.domain import JobStatus, Success
from chokaq_core.models import JobsHot, Queues

from .rows import ago, backdate, close_to, fetched, hot, new_job, of_kind, pending, processing


def stagger(ids: list[str]) -> None:
    """Distinct creation times, oldest first in list order (one enqueue call stamps them all alike)."""
    for i, job_id in enumerate(ids):
        JobsHot.objects.filter(id=job_id).update(created_at=ago(100 - i))


def test_claims_only_due_pending_rows_and_stamps_them() -> None:
    due = pending("claim")[0]
    future = pending("claim", delay=3600)[0]
    other_fetched = fetched("claim-busy", "w-other")[0]
    JobsHot.objects.filter(id=other_fetched.id).update(queue="claim")
    running = processing("claim-run", "w-other")[0]
    JobsHot.objects.filter(id=running.id).update(queue="claim")
    before = timezone.now()

    claimed = storage.fetch_batch("w1", 10, ["claim"])

    assert [j.id for j in claimed] == [due]
    job = claimed[0]
    assert job.status == JobStatus.FETCHED
    assert job.worker_id == "w1"
    assert job.attempt_count == 0, "fetching is not an attempt"
    row = hot(due)
    assert row is not None
    assert (row["status"], row["worker_id"], row["attempt_count"]) == (1, "w1", 0)
    assert close_to(row["last_updated_at"], before)
    assert hot(future)["status"] == 0  # type: ignore[index]
    assert hot(other_fetched.id)["worker_id"] == "w-other"  # type: ignore[index]
    assert hot(running.id)["status"] == 2  # type: ignore[index]


def test_returned_rows_carry_the_stored_columns() -> None:
    job = new_job("cols", payload='{"a":1}', tags="x", priority=7, created_by="api", key="cols-key")
    storage.enqueue([job])

    [claimed] = storage.fetch_batch("w1", 5, ["cols"])

    assert (claimed.id, claimed.queue, claimed.type, claimed.payload, claimed.tags, claimed.priority,
            claimed.created_by, claimed.idempotency_key) == (
        job.id, "cols", job.type, '{"a":1}', "x", 7, "api", "cols-key")
    assert claimed.created_at is not None and claimed.created_at.tzinfo is not None
    assert claimed.scheduled_at is None


def test_a_row_becomes_claimable_once_its_scheduled_time_passes() -> None:
    job_id = pending("later", delay=3600)[0]
    assert storage.fetch_batch("w1", 5, ["later"]) == []

    backdate([job_id], 1, "scheduled_at")

    assert [j.id for j in storage.fetch_batch("w1", 5, ["later"])] == [job_id]


def test_a_claimed_row_is_not_claimed_again() -> None:
    job_id = pending("once")[0]
    assert [j.id for j in storage.fetch_batch("w1", 5, ["once"])] == [job_id]
    assert storage.fetch_batch("w2", 5, ["once"]) == []
    assert storage.fetch_batch("w1", 5, ["once"]) == []
    assert hot(job_id)["worker_id"] == "w1"  # type: ignore[index]


def test_respects_the_limit() -> None:
    ids = pending("limit", 10)

    claimed = storage.fetch_batch("w1", 3, ["limit"])

    assert len(claimed) == 3
    assert JobsHot.objects.filter(id__in=ids, status=1, worker_id="w1").count() == 3
    assert JobsHot.objects.filter(id__in=ids, status=0, worker_id__isnull=True).count() == 7


def test_orders_by_priority_desc_then_due_time() -> None:
    t0 = ago(600)
    spec = {  # name: (priority, created_at offset s, scheduled_at offset s or None)
        "low_old": (1, 0, None),
        "mid_late": (10, 300, None),
        "mid_early": (10, 100, None),
        "mid_sched": (10, 0, 200),  # created first, but due at +200: between mid_early and mid_late
        "high_new": (50, 500, None),
        "high_sched_early": (50, 550, 50),  # created last, due earliest among the 50s
    }
    ids = {}
    for name, (priority, created, scheduled) in spec.items():
        job_id = pending("prio", priority=priority)[0]
        ids[name] = job_id
        JobsHot.objects.filter(id=job_id).update(
            created_at=t0 + timedelta(seconds=created),
            scheduled_at=None if scheduled is None else t0 + timedelta(seconds=scheduled),
        )
    expected = ["high_sched_early", "high_new", "mid_early", "mid_sched", "mid_late", "low_old"]

    top = storage.fetch_batch("w1", 3, ["prio"])
    rest = storage.fetch_batch("w1", 10, ["prio"])

    assert [j.id for j in top] == [ids[n] for n in expected[:3]]
    assert [j.id for j in rest] == [ids[n] for n in expected[3:]]


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
    storage.set_queue_paused("hidden-q", False)  # hidden but explicitly resumed
    state = next(q for q in storage.queue_states() if q.name == "hidden-q")
    assert (state.is_active, state.is_paused) == (False, False)

    assert storage.fetch_batch("w1", 10, ["hidden-q"]) == []
    assert storage.fetch_batch("w1", 10, None) == []

    storage.set_queue_active("hidden-q", True)
    storage.set_queue_paused("hidden-q", False)
    assert [j.id for j in storage.fetch_batch("w1", 10, ["hidden-q"])] == [hidden]


def test_rows_of_a_queue_without_a_queues_row_are_claimable() -> None:
    job_id = pending("orphan")[0]
    Queues.objects.filter(name="orphan").delete()
    assert [j.id for j in storage.fetch_batch("w1", 10, ["orphan"])] == [job_id]


def test_queue_filter_list() -> None:
    a = pending("qa", 2)
    b = pending("qb", 2)
    c = pending("qc", 2)

    assert storage.fetch_batch("w1", 10, []) == []
    assert sorted(j.id for j in storage.fetch_batch("w1", 10, ["qa", "qc"])) == sorted(a + c)
    assert JobsHot.objects.filter(id__in=b, status=0).count() == 2
    assert storage.fetch_batch("w1", 10, ["nope"]) == []
    assert sorted(j.id for j in storage.fetch_batch("w1", 10, None)) == sorted(b)


def test_bulkhead_caps_fetched_plus_processing_per_queue() -> None:
    storage.set_queue_max_workers("capped", 2)
    ids = pending("capped", 5)
    stagger(ids)
    free = pending("uncapped", 3)

    first = storage.fetch_batch("w1", 10, ["capped", "uncapped"])
    assert sorted(j.id for j in first if j.queue == "capped") == sorted(ids[:2]), "the two oldest"
    assert len([j for j in first if j.queue == "uncapped"]) == 3
    assert storage.fetch_batch("w2", 10, ["capped"]) == [], "fleet-wide: another worker is capped too"

    job = next(j for j in first if j.queue == "capped")
    assert storage.mark_processing(job, "w1") == 1
    assert storage.fetch_batch("w2", 10, ["capped"]) == [], "Processing rows still count"

    storage.complete("w1", [Success(job.id, 1.0)], [], [])
    again = storage.fetch_batch("w2", 10, ["capped"])
    assert [j.id for j in again] == [ids[2]]
    assert JobsHot.objects.filter(queue="capped", status__in=[1, 2]).count() == 2
    assert JobsHot.objects.filter(id__in=free, status=1).count() == 3


def test_bulkhead_counts_rows_claimed_before_the_cap_was_set() -> None:
    running = processing("late-cap", "w0", 1)
    waiting = pending("late-cap", 4)
    stagger(waiting)
    storage.set_queue_max_workers("late-cap", 3)

    claimed = storage.fetch_batch("w1", 10, ["late-cap"])

    assert sorted(j.id for j in claimed) == sorted(waiting[:2])
    assert JobsHot.objects.filter(queue="late-cap", status__in=[1, 2]).count() == 3
    assert hot(running[0].id)["status"] == 2  # type: ignore[index]


def test_bulkhead_cleared_with_none() -> None:
    storage.set_queue_max_workers("uncap", 1)
    pending("uncap", 3)
    assert len(storage.fetch_batch("w1", 10, ["uncap"])) == 1
    storage.set_queue_max_workers("uncap", None)
    assert len(storage.fetch_batch("w1", 10, ["uncap"])) == 2



def test_a_cap_set_after_a_claim_of_one_statement_holds_at_the_next_claim() -> None:
    """Without a capped queue in reach a claim is one statement where the dialect can (PostgreSQL); the statement
    itself checks that no cap is in reach, so a cap set since the last claim still holds fleet-wide."""
    ids = pending("cap-later", 4)
    stagger(ids)
    assert [j.id for j in storage.fetch_batch("w1", 1, ["cap-later"])] == ids[:1]
    storage.set_queue_max_workers("cap-later", 2)
    assert [j.id for j in storage.fetch_batch("w2", 10, ["cap-later"])] == ids[1:2]
    assert storage.fetch_batch("w3", 10, ["cap-later"]) == []
    assert storage.fetch_batch("w3", 10) == [], "every queue in reach: the cap holds too"
    assert JobsHot.objects.filter(queue="cap-later", status__in=[1, 2]).count() == 2
    storage.set_queue_max_workers("cap-later", None)
    assert len(storage.fetch_batch("w3", 10, ["cap-later"])) == 2

@pytest.mark.sql_only
def test_two_workers_never_claim_the_same_row() -> None:
    """Two threads, each with its own connection, claim side by side (lockstep rounds) until none is left.

    On PostgreSQL a claim may come back short or empty while the other worker holds the remaining rows
    locked (SKIP LOCKED, best effort): each thread keeps going until no Pending row is left.
    """
    total, limit = 500, 7
    ids = set(pending("race", total))
    claims: dict[str, list[str]] = {"w-a": [], "w-b": []}
    errors: list[BaseException] = []
    lockstep = threading.Barrier(2, timeout=30)

    def claim(worker: str) -> None:
        try:
            for _ in range(20):  # contended rounds: both threads claim at the same moment
                lockstep.wait()
                claims[worker].extend(j.id for j in storage.fetch_batch(worker, limit, ["race"]))
            for _ in range(10_000):  # then drain
                batch = storage.fetch_batch(worker, limit, ["race"])
                claims[worker].extend(j.id for j in batch)
                if not batch and not JobsHot.objects.filter(queue="race", status=0).exists():
                    return
            raise AssertionError(f"{worker} could not drain the queue")
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            lockstep.abort()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claim, args=(w,)) for w in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)

    assert errors == []
    a, b = claims["w-a"], claims["w-b"]
    assert len(a) == len(set(a)) and len(b) == len(set(b))
    assert not set(a) & set(b), "a row was claimed by both workers"
    assert len(a) + len(b) == total
    assert set(a) | set(b) == ids
    assert a and b, "both workers took part"
    assert set(JobsHot.objects.filter(worker_id="w-a", status=1).values_list("id", flat=True)) == set(a)
    assert set(JobsHot.objects.filter(worker_id="w-b", status=1).values_list("id", flat=True)) == set(b)


def test_equal_priority_and_due_time_claim_in_id_order() -> None:
    jobs = [new_job("ties", id=f"tie-{n}") for n in (3, 1, 4, 2)]
    storage.enqueue(jobs)  # one statement: one creation time
    assert {j.id for j in storage.fetch_batch("w1", 2, ["ties"])} == {"tie-1", "tie-2"}, "the id breaks the tie"
    assert {j.id for j in storage.fetch_batch("w1", 2, ["ties"])} == {"tie-3", "tie-4"}


# ---------------------------------------------------------------- leasing at the claim (docs/architecture.md)


def test_a_claim_leases_its_first_rows_for_the_free_slots(published: list) -> None:
    ids = pending("claim-lease", 5, priority=10)
    stagger(ids)
    before = timezone.now()
    published.clear()

    claimed = storage.fetch_batch("w1", 5, ["claim-lease"], lease=2)

    assert [j.id for j in claimed] == ids, "claim order"
    assert [(j.status, j.attempt_count) for j in claimed] == [(JobStatus.PROCESSING, 1)] * 2 + [(JobStatus.FETCHED, 0)] * 3
    for job_id in ids[:2]:
        row = hot(job_id)
        assert row is not None
        assert (row["status"], row["attempt_count"], row["worker_id"]) == (2, 1, "w1")
        assert close_to(row["started_at"], before)
        assert close_to(row["heartbeat_at"], before)
    for job_id in ids[2:]:
        row = hot(job_id)
        assert row is not None
        assert (row["status"], row["attempt_count"], row["worker_id"], row["started_at"]) == (1, 0, "w1", None)
    updates = [e for e in of_kind(published, "JobUpdated") if e["status"] == int(JobStatus.PROCESSING)]
    assert sorted(e["jobId"] for e in updates) == sorted(ids[:2]), "the leased rows are announced as Processing"
    assert storage.mark_processing_batch(claimed[:2], "w1") == {}, "a leased row is not leased twice"
    assert storage.mark_processing_batch(claimed[2:], "w1") == {job_id: 1 for job_id in ids[2:]}


def test_a_claim_leases_no_more_rows_than_it_claims() -> None:
    ids = pending("claim-lease-few", 2)
    claimed = storage.fetch_batch("w1", 10, ["claim-lease-few"], lease=5)
    assert sorted((j.id, j.status) for j in claimed) == sorted((i, JobStatus.PROCESSING) for i in ids)


def test_a_worker_that_dies_after_a_leasing_claim_loses_no_job() -> None:
    """The crash argument of leasing at the claim: the claim commits the leased rows as Processing (owned, started,
    heartbeat now) and the rest as Fetched. A worker that dies right after it never heartbeats them: the leased rows
    become visible Zombies once their heartbeat is older than the zombie timeout (as a lease's rows always did), the
    Fetched ones go back to Pending through the abandoned-fetch recovery and run elsewhere; none is lost."""
    ids = pending("claim-lease-crash", 4)
    stagger(ids)
    claimed = storage.fetch_batch("w-dead", 4, ["claim-lease-crash"], lease=2)
    assert [j.status for j in claimed] == [JobStatus.PROCESSING] * 2 + [JobStatus.FETCHED] * 2
    backdate(ids, 20 * 60, "heartbeat_at")
    backdate(ids, 20 * 60, "last_updated_at")

    assert sorted(storage.archive_zombies(600)) == sorted((i, "claim-lease-crash") for i in ids[:2])
    assert storage.recover_abandoned(600) == 2

    for job_id in ids[:2]:
        assert hot(job_id) is None
        assert storage.get_dead(job_id) is not None, "a started job that lost its worker is a Zombie in the DLQ"
    rows = [hot(job_id) for job_id in ids[2:]]
    assert [(r["status"], r["worker_id"], r["attempt_count"]) for r in rows if r] == [(0, None, 0)] * 2
    again = storage.fetch_batch("w2", 4, ["claim-lease-crash"])
    assert sorted(j.id for j in again) == sorted(ids[2:]), "the unstarted rows run on another worker"


@pytest.mark.parametrize("walk", [True, False], ids=["due-schedules-and-a-paused-queue", "every-queue-open"])
def test_successive_claims_over_many_queues_follow_the_claim_order_exactly(walk: bool) -> None:
    """Over 40 queues of unequal sizes (a few rows each, or a backlog; mixed priorities; due and future scheduled rows
    and one queue paused, or only future ones) every claim takes the next rows of one order across all queues:
    priority desc, then coalesce(scheduled_at, created_at), then id — whether the claim reads each queue's first rows,
    a share of them, or every queue's rows in one index."""
    import random

    rng = random.Random(15)
    t0 = ago(3600)
    rows: dict[str, tuple[str, int, float, float | None]] = {}  # id: (queue, priority, created s, scheduled s)
    for q in range(40):
        queue = f"many-{q:02d}"
        size = rng.choice([1, 2, 3, 5, 8, 30]) if q % 7 else 60  # every 7th queue holds a backlog
        for _ in range(size):
            job_id = f"o-{rng.randrange(10**8):08d}"
            while job_id in rows:
                job_id = f"o-{rng.randrange(10**8):08d}"
            created = float(rng.randrange(0, 3000, 7))  # coarse: equal times across and within queues
            scheduled = None if rng.random() < 0.7 else created + rng.choice([-50.0, 10.0, 200.0, 7200.0] if walk
                                                                              else [7200.0])
            rows[job_id] = (queue, rng.choice([0, 0, 5, 10, 10, 50]), created, scheduled)
    storage.enqueue([new_job(queue, id=job_id, priority=priority) for job_id, (queue, priority, _, _) in rows.items()])
    for job_id, (_, _, created, scheduled) in rows.items():
        JobsHot.objects.filter(id=job_id).update(
            created_at=t0 + timedelta(seconds=created),
            scheduled_at=None if scheduled is None else t0 + timedelta(seconds=scheduled))
    paused = "many-03" if walk else None
    if paused:
        storage.set_queue_paused(paused, True)
    due = [job_id for job_id, (queue, _, created, scheduled) in rows.items()
           if queue != paused and (scheduled is None or scheduled < 3600)]
    expected = sorted(due, key=lambda i: (-rows[i][1], rows[i][3] if rows[i][3] is not None else rows[i][2], i))
    assert len(expected) > 250, "enough rows that a claim reads a share of most queues"

    claimed: list[str] = []
    for limit in (1, 5, 20, 3, 50, 2) * 20:
        batch = [j.id for j in storage.fetch_batch("w-many", limit, None)]
        assert batch == expected[len(claimed):len(claimed) + limit], f"claim of {limit} after {len(claimed)} rows"
        claimed += batch
        if len(claimed) == len(expected):
            break
    assert claimed == expected
    assert storage.fetch_batch("w-many", 10, None) == []
