"""Fleet-wide rate limits: token buckets per limit (and key). The lease spends the tokens (in its transaction, on
the clock that stamps ``started_at``); the claim only reads the buckets and takes no more than they hold now."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db.models import F
from django.utils import timezone

from chokaq_core import storage
from chokaq_core.domain import HotJob, JobStatus, RateLimit, parse_rate
from chokaq_core.models import JobsHot, RateBuckets, RateLimits

from .rows import of_kind, pending


def limit(name: str, rate: str, *, per_key: bool = False, max_keys: int = 1000) -> RateLimit:
    """A limit in force, recorded as declared (a lease locks the limit rows)."""
    declared = RateLimit(name, parse_rate(rate), per_key, max_keys)
    storage.declare_rate_limits([declared])
    return declared


def saved_up(name: str, tokens: float, key: str = "") -> None:
    """A bucket that sat idle long enough to save ``tokens`` (its window long over)."""
    long_ago = timezone.now() - timedelta(hours=1)
    RateBuckets.objects.create(limit_name=name, rate_key=key, tokens=tokens, refilled_at=timezone.now(),
                               window_started_at=long_ago, window_used=0)


def age_buckets(seconds: float) -> None:
    """What the clock moving on by ``seconds`` looks like to the buckets."""
    RateBuckets.objects.update(refilled_at=F("refilled_at") - timedelta(seconds=seconds),
                               window_started_at=F("window_started_at") - timedelta(seconds=seconds))


def start(worker: str, n: int, queues: list[str] | None, limits: list[RateLimit]) -> list[HotJob]:
    """What a worker does: claim up to ``n`` rows under ``limits``, then lease them; the jobs it started."""
    claimed = storage.fetch_batch(worker, n, queues, limits)
    leased = storage.mark_processing_batch(claimed, worker, limits)
    return [job for job in claimed if job.id in leased]


def test_a_claim_takes_no_more_than_the_tokens_and_spends_none_of_them() -> None:
    capped = limit("type:rl.capped.v1", "60/h burst 3")  # a token a minute: none comes back during the test
    saved_up("type:rl.capped.v1", 3)
    ids = pending("rl", 8, type="rl.capped.v1")

    claimed = storage.fetch_batch("w1", 8, ["rl"], [capped])

    assert len(claimed) == 3
    held = JobsHot.objects.filter(id__in=ids).exclude(id__in=[j.id for j in claimed])
    assert held.count() == 5
    assert all(r.status == JobStatus.PENDING and r.worker_id is None and r.attempt_count == 0 for r in held)
    bucket = RateBuckets.objects.get(limit_name="type:rl.capped.v1", rate_key="")
    assert (bucket.tokens, bucket.window_used) == (3, 0), "a claim writes no bucket"
    assert len(storage.fetch_batch("w2", 8, ["rl"], [capped])) == 3, "another claim sees the same tokens"


def test_the_lease_spends_the_tokens_and_sends_what_they_do_not_cover_back_to_pending(published: list) -> None:
    capped = limit("type:rl.lease.v1", "60/h burst 3")
    saved_up("type:rl.lease.v1", 3)
    pending("rl-lease", 8, type="rl.lease.v1")
    free = pending("rl-lease-free", 1, type="rl.free.v1")  # no limit covers it
    first = storage.fetch_batch("w1", 3, ["rl-lease"], [capped])
    second = storage.fetch_batch("w2", 3, ["rl-lease"], [capped])  # the same 3 tokens
    second += storage.fetch_batch("w2", 1, ["rl-lease-free"])
    assert len(first) == 3 and len(second) == 4 and second[-1].id == free[0]
    published.clear()

    assert storage.mark_processing_batch(first, "w1", [capped]) == {job.id: 1 for job in first}
    late = storage.mark_processing_batch(second, "w2", [capped])

    assert late == {free[0]: 1}, "no token left for the second claim's limited rows; the free one starts"
    assert late.held == tuple(job.id for job in second[:3]) and late.held_for is not None and late.held_for > 1
    for job in second[:3]:
        row = JobsHot.objects.get(id=job.id)
        assert (row.status, row.worker_id, row.attempt_count, row.started_at) == (JobStatus.PENDING, None, 0, None)
    started = JobsHot.objects.filter(type="rl.lease.v1", started_at__isnull=False)
    assert started.count() == 3
    bucket = RateBuckets.objects.get(limit_name="type:rl.lease.v1", rate_key="")
    assert bucket.window_used == 3, "the bucket's counter equals the rows started"
    assert bucket.tokens < 1
    assert {u["jobId"] for u in of_kind(published, "JobUpdated") if u["status"] == int(JobStatus.PROCESSING)} == {
        *(job.id for job in first), free[0]}, "only started jobs are announced as Processing"
    assert storage.fetch_batch("w2", 8, ["rl-lease"], [capped]) == [], "no token left, nothing claimed"


def test_a_lease_that_lost_a_row_spends_no_token_for_it() -> None:
    capped = limit("type:rl.lost.v1", "60/h burst 3")
    saved_up("type:rl.lost.v1", 3)
    pending("rl-lost", 2, type="rl.lost.v1")
    claimed = storage.fetch_batch("w1", 2, ["rl-lost"], [capped])
    assert storage.cancel([claimed[0].id], actor="ops")[0] == [claimed[0].id]

    assert storage.mark_processing_batch(claimed, "w1", [capped]) == {claimed[1].id: 1}

    bucket = RateBuckets.objects.get(limit_name="type:rl.lost.v1", rate_key="")
    assert bucket.window_used == 1 and round(bucket.tokens, 3) == 2, "the cancelled row took no token"


def test_a_token_a_lost_row_took_goes_to_the_next_job_of_the_batch() -> None:
    """The lease admits in claim order; a row that is no longer ours gives its token to the job it held back."""
    capped = limit("type:rl.regive.v1", "60/h burst 1")
    saved_up("type:rl.regive.v1", 1)
    pending("rl-regive", 2, type="rl.regive.v1")
    foreign = storage.fetch_batch("w2", 1, ["rl-regive"], [])  # another worker's row, first in the batch
    own = storage.fetch_batch("w1", 1, ["rl-regive"], [])

    leased = storage.mark_processing_batch([*foreign, *own], "w1", [capped])

    assert leased == {own[0].id: 1}, "the one token starts this worker's own job"
    assert leased.held == () and leased.held_for is None
    assert JobsHot.objects.get(id=foreign[0].id).worker_id == "w2", "the other worker's row is untouched"
    assert RateBuckets.objects.get(limit_name="type:rl.regive.v1", rate_key="").window_used == 1


def test_a_lease_holds_back_only_rows_it_owns() -> None:
    capped = limit("type:rl.heldown.v1", "60/h burst 1")
    saved_up("type:rl.heldown.v1", 1)
    pending("rl-heldown", 3, type="rl.heldown.v1")
    own = storage.fetch_batch("w1", 2, ["rl-heldown"], [])
    foreign = storage.fetch_batch("w2", 1, ["rl-heldown"], [])

    leased = storage.mark_processing_batch([*own, *foreign], "w1", [capped])

    assert leased == {own[0].id: 1}
    assert leased.held == (own[1].id,), "the foreign row was never this worker's to hold back"
    row = JobsHot.objects.get(id=foreign[0].id)
    assert (row.status, row.worker_id) == (JobStatus.FETCHED, "w2")


def _no_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    def locked(*args: object) -> None:
        raise AssertionError("the lease took the limits' lock")

    monkeypatch.setattr(type(storage.dialect()), "lock_rate_buckets", locked)


def test_a_lease_on_the_buckets_it_knows_pays_without_the_limits_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    capped = limit("type:rl.known.v1", "60/h burst 5")
    saved_up("type:rl.known.v1", 5)
    pending("rl-known", 4, type="rl.known.v1")
    claimed = storage.fetch_batch("w1", 4, ["rl-known"], [capped])  # the claim reads the buckets: now known
    _no_lock(monkeypatch)

    first = storage.mark_processing_batch(claimed[:2], "w1", [capped])
    second = storage.mark_processing_batch(claimed[2:], "w1", [capped])  # planned on what the first wrote

    assert first == {job.id: 1 for job in claimed[:2]} and second == {job.id: 1 for job in claimed[2:]}
    bucket = RateBuckets.objects.get(limit_name="type:rl.known.v1", rate_key="")
    assert bucket.window_used == 4, "the bucket's counter equals the rows started"
    assert 1 <= bucket.tokens < 1.1, "four of the five tokens spent (a token a minute came back at most)"
    starts = {row.started_at for row in JobsHot.objects.filter(id__in=second)}
    assert starts == {bucket.refilled_at}, "the jobs start at the moment their tokens were taken"


def test_a_bucket_written_since_it_was_read_makes_the_lease_take_the_lock() -> None:
    capped = limit("type:rl.stale.v1", "60/h burst 5")
    saved_up("type:rl.stale.v1", 5)
    pending("rl-stale", 2, type="rl.stale.v1")
    claimed = storage.fetch_batch("w1", 2, ["rl-stale"], [capped])  # sees 5 tokens
    # another worker's leases spent them meanwhile
    RateBuckets.objects.filter(limit_name="type:rl.stale.v1").update(tokens=0.5, refilled_at=timezone.now())

    leased = storage.mark_processing_batch(claimed, "w1", [capped])

    assert leased == {} and set(leased.held) == {job.id for job in claimed}, "no token: both back to Pending"
    assert RateBuckets.objects.get(limit_name="type:rl.stale.v1", rate_key="").window_used == 0
    assert not JobsHot.objects.filter(type="rl.stale.v1", started_at__isnull=False).exists()


def test_a_planned_lease_whose_second_bucket_changed_leaves_the_first_as_it_was() -> None:
    """Buckets are swapped in (limit, key) order: the queue's first, then the type's. When the type's changed since
    it was read, the lease under the lock decides, and the queue's bucket pays once, for the jobs that started."""
    per_queue = limit("queue:rl-two", "60/h burst 5")
    per_type = limit("type:rl.two.v1", "60/h burst 5")
    saved_up("queue:rl-two", 5)
    saved_up("type:rl.two.v1", 5)
    pending("rl-two", 2, type="rl.two.v1")
    claimed = storage.fetch_batch("w1", 2, ["rl-two"], [per_queue, per_type])  # both buckets known
    RateBuckets.objects.filter(limit_name="type:rl.two.v1").update(tokens=1.5, refilled_at=timezone.now())

    leased = storage.mark_processing_batch(claimed, "w1", [per_queue, per_type])

    assert leased == {claimed[0].id: 1} and leased.held == (claimed[1].id,), "the type had one token left"
    queue_bucket = RateBuckets.objects.get(limit_name="queue:rl-two", rate_key="")
    assert queue_bucket.window_used == 1, "the queue's bucket counts the one start, not the planned two as well"
    assert 4 <= queue_bucket.tokens < 4.1


def test_one_lease_under_a_limit_runs_through_the_single_lease_too() -> None:
    capped = limit("type:rl.one.v1", "60/h burst 1")
    saved_up("type:rl.one.v1", 1)
    pending("rl-one", 2, type="rl.one.v1")
    claimed = storage.fetch_batch("w1", 2, ["rl-one"], [])  # claimed without the limit: both rows

    assert storage.mark_processing(claimed[0], "w1", [capped]) == 1
    assert storage.mark_processing(claimed[1], "w1", [capped]) is None, "no token: back to Pending"
    assert JobsHot.objects.get(id=claimed[1].id).status == JobStatus.PENDING


def test_tokens_come_back_at_the_rate_up_to_the_burst() -> None:
    capped = limit("type:rl.refill.v1", "4/s burst 2")
    pending("rl-refill", 10, type="rl.refill.v1")
    assert len(start("w1", 10, ["rl-refill"], [capped])) == 1, "a new limit starts with one token"

    age_buckets(0.5)  # 4/s for half a second: two tokens
    assert len(start("w1", 10, ["rl-refill"], [capped])) == 2
    age_buckets(60)  # a long idle spell refills only up to the burst
    assert len(start("w1", 10, ["rl-refill"], [capped])) == 2
    assert RateBuckets.objects.get(limit_name="type:rl.refill.v1").window_used == 2, "a new window began"


def test_a_paused_type_holds_its_jobs_and_other_types_are_still_claimed() -> None:
    paused = limit("type:rl.paused.v1", "0/m")
    pending("rl-mixed", 60, type="rl.paused.v1", priority=50)  # more than the claim's scan window of 10 x limit
    other = pending("rl-mixed", 1, type="rl.free.v1")

    claimed = storage.fetch_batch("w1", 5, ["rl-mixed"], [paused])

    assert [j.id for j in claimed] == other
    assert JobsHot.objects.filter(type="rl.paused.v1", status=JobStatus.PENDING).count() == 60


def test_each_key_of_a_per_key_limit_has_its_own_allowance() -> None:
    tenants = limit("type:rl.tenant.v1", "20/s burst 2", per_key=True)
    for tenant in ("a", "b", "c"):
        storage.enqueue([j for j in _jobs("rl-keys", 5, "rl.tenant.v1", f"tenant:{tenant}")])

    claimed = start("w1", 15, ["rl-keys"], [tenants])

    by_key: dict[str | None, int] = {}
    for job in claimed:
        by_key[job.rate_key] = by_key.get(job.rate_key, 0) + 1
    assert by_key == {"tenant:a": 1, "tenant:b": 1, "tenant:c": 1}, "each new key starts with one token"
    assert {b.rate_key: b.window_used for b in RateBuckets.objects.all()} == {
        "tenant:a": 1, "tenant:b": 1, "tenant:c": 1}
    age_buckets(0.1)  # 20/s: two tokens each, the burst
    by_key = {}
    for job in start("w1", 15, ["rl-keys"], [tenants]):
        by_key[job.rate_key] = by_key.get(job.rate_key, 0) + 1
    assert by_key == {"tenant:a": 2, "tenant:b": 2, "tenant:c": 2}


def test_a_per_key_limit_keeps_at_most_max_keys_live() -> None:
    tenants = limit("type:rl.few.v1", "20/s burst 1", per_key=True, max_keys=2)
    for tenant in ("a", "b", "c"):
        storage.enqueue(_jobs("rl-few", 1, "rl.few.v1", f"tenant:{tenant}"))

    claimed = start("w1", 10, ["rl-few"], [tenants])

    assert len(claimed) == 2
    assert RateBuckets.objects.count() == 2


def test_a_queue_limit_covers_every_type_of_the_queue() -> None:
    capped = limit("queue:rl-q", "5/s burst 4")
    saved_up("queue:rl-q", 4)
    pending("rl-q", 3, type="rl.one.v1")
    pending("rl-q", 3, type="rl.two.v1")
    pending("rl-other", 3, type="rl.one.v1")

    claimed = storage.fetch_batch("w1", 20, None, [capped])

    assert sum(1 for j in claimed if j.queue == "rl-q") == 4
    assert sum(1 for j in claimed if j.queue == "rl-other") == 3


def test_declared_limits_and_overrides_are_rows() -> None:
    storage.declare_rate_limits([RateLimit("type:rl.a.v1", parse_rate("100/m")),
                                 RateLimit("queue:rl-b", parse_rate("5/s"), per_key=True, max_keys=7)])
    storage.set_rate_limit("type:rl.a.v1", parse_rate("10/m"), actor="ops")
    storage.set_rate_limit("queue:rl-c", None, lifted=True, actor="ops")

    states = {s.name: s for s in storage.rate_limits()}
    assert states["type:rl.a.v1"].declared == parse_rate("100/m")
    assert states["type:rl.a.v1"].rate == parse_rate("10/m"), "the operator's override is in force"
    assert states["type:rl.a.v1"].updated_by == "ops"
    assert states["queue:rl-b"].limit == RateLimit("queue:rl-b", parse_rate("5/s"), True, 7)
    assert states["queue:rl-c"].rate is None, "lifted"

    storage.declare_rate_limits([])  # the code no longer declares them: the override stays
    states = {s.name: s for s in storage.rate_limits()}
    assert states["type:rl.a.v1"].declared is None and states["type:rl.a.v1"].rate == parse_rate("10/m")
    assert states["queue:rl-b"].rate is None
    storage.set_rate_limit("type:rl.a.v1", None)
    assert {s.name: s for s in storage.rate_limits()}["type:rl.a.v1"].rate is None
    assert RateLimits.objects.count() == 3


def _jobs(queue: str, n: int, type_key: str, rate_key: str) -> list:
    from dataclasses import replace

    from .rows import new_job

    return [replace(new_job(queue, type=type_key), rate_key=rate_key) for _ in range(n)]


def test_a_held_job_stays_due_pending_and_its_wait_counts_in_the_queue_lag() -> None:
    paused = limit("type:rl.lag.v1", "0/m")
    held = pending("rl-lag", 1, type="rl.lag.v1")
    JobsHot.objects.filter(id__in=held).update(created_at=timezone.now() - timedelta(seconds=60))

    assert storage.fetch_batch("w1", 5, ["rl-lag"], [paused]) == []

    lag = {q.queue: q for q in storage.queue_health()}["rl-lag"]
    assert lag.pending == 1 and lag.max_lag_seconds >= 30, "held, not hidden: the wait shows in the lag"


def test_without_a_limit_in_force_the_claim_is_the_plain_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    limit("type:rl.other.v1", "0/m")  # declared for another type: this claim is not given it
    ids = pending("rl-plain", 3)

    def refuse(*args: object) -> None:
        raise AssertionError("a claim without limits touched the rate-limit tables")

    for name in ("lock_rate_buckets", "read_rate_buckets", "save_rate_buckets", "rate_buckets"):
        monkeypatch.setattr(type(storage.dialect()), name, refuse)
    claimed = storage.fetch_batch("w1", 5, ["rl-plain"])
    assert sorted(j.id for j in claimed) == sorted(ids)
    other = RateLimit("type:rl.other.v1", parse_rate("0/m"))
    assert storage.mark_processing_batch(claimed, "w1", [other]) == {i: 1 for i in ids}, \
        "a lease whose jobs no limit concerns is the plain lease"


def test_a_claim_under_limits_neither_locks_nor_writes_the_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    capped = limit("type:rl.read.v1", "60/h burst 2")
    saved_up("type:rl.read.v1", 2)
    pending("rl-read", 4, type="rl.read.v1")

    def refuse(*args: object) -> None:
        raise AssertionError("the claim locked or wrote the buckets")

    for name in ("lock_rate_buckets", "save_rate_buckets"):
        monkeypatch.setattr(type(storage.dialect()), name, refuse)
    claimed = storage.fetch_batch("w1", 4, ["rl-read"], [capped])

    assert len(claimed) == 2
    assert claimed.held_for is not None, "the claim says when the next token comes"  # type: ignore[attr-defined]


def test_a_claim_while_the_known_buckets_hold_plenty_is_the_plain_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    roomy = limit("type:rl.roomy.v1", "1000/s")
    saved_up("type:rl.roomy.v1", 100)
    pending("rl-roomy", 6, type="rl.roomy.v1")
    first = start("w1", 2, ["rl-roomy"], [roomy])  # reads the buckets; the lease's write is known too

    def refuse(*args: object) -> None:
        raise AssertionError("the claim read the buckets")

    monkeypatch.setattr(type(storage.dialect()), "read_rate_buckets", refuse)
    second = storage.fetch_batch("w1", 4, ["rl-roomy"], [roomy])

    assert len(first) == 2 and len(second) == 4
    assert storage.mark_processing_batch(second, "w1", [roomy]) == {job.id: 1 for job in second}
    assert RateBuckets.objects.get(limit_name="type:rl.roomy.v1", rate_key="").window_used == 6


def another_lease_spending_all(name: str, started: int) -> Callable[[], list[BaseException]]:
    """A lease under the limits' locks in another transaction: it locks limit ``name`` and its bucket
    (``lock_rate_buckets``) and returns to the caller, whose lease runs meanwhile; half a second later it writes the
    bucket empty (``started`` jobs started) and commits. The returned function waits for that and gives the errors
    it met."""
    import threading
    from dataclasses import replace

    from django.db import connection, connections, transaction

    locked, errors = threading.Event(), []

    def spend_all() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                sql = storage.dialect()
                _, buckets = sql.lock_rate_buckets(cursor, [name])
                locked.set()
                threading.Event().wait(0.5)  # the caller's lease runs meanwhile
                sql.save_rate_buckets(cursor, [replace(buckets[0], tokens=0.0, window_used=started)], [], [])
        except BaseException as exc:  # reported by the caller
            errors.append(exc)
            locked.set()
        finally:
            connections.close_all()

    holder = threading.Thread(target=spend_all)
    holder.start()
    assert locked.wait(30)

    def finish() -> list[BaseException]:
        holder.join(timeout=60)
        return errors

    return finish


@pytest.mark.sql_only
def test_a_lease_that_waited_for_another_leases_lock_sees_the_tokens_that_lease_left() -> None:
    """Another transaction (a lease) holds the limit's row and spends the bucket's 5 tokens; a lease started
    meanwhile waits for it, then must see 0 tokens, not the 5 its first snapshot showed (PostgreSQL's READ COMMITTED
    re-reads only the rows a waiting statement locks)."""
    capped = limit("type:rl.race.v1", "1/h burst 5")
    saved_up("type:rl.race.v1", 5)
    pending("rl-race", 10, type="rl.race.v1")
    claimed = storage.fetch_batch("w-b", 10, ["rl-race"], [capped])
    assert len(claimed) == 5
    storage.KNOWN_BUCKETS.forget(["type:rl.race.v1"])  # this lease goes straight to the limit's lock
    finish = another_lease_spending_all("type:rl.race.v1", 5)

    leased = storage.mark_processing_batch(claimed, "w-b", [capped])

    assert finish() == []
    assert leased == {}, "the waiting lease spent tokens the other transaction had already spent"
    assert len(leased.held) == 5


def test_starts_are_stamped_no_earlier_than_the_moment_their_bucket_was_spent() -> None:
    """A lease that waited for another lease's lock read its clock before the wait, and a lease planned on the
    buckets it knows estimates the clock: either can find a bucket spent at a later moment than its clock. Its jobs
    then start at the bucket's moment, never before it, or the stored start times of two leases would overlap and
    show more starts in a second than rate + burst."""
    capped = limit("type:rl.stamp.v1", "60/h burst 5")
    saved_up("type:rl.stamp.v1", 5)
    later = timezone.now() + timedelta(seconds=30)  # another lease's moment, later than this lease's clock
    RateBuckets.objects.filter(limit_name="type:rl.stamp.v1").update(refilled_at=later)
    pending("rl-stamp", 2, type="rl.stamp.v1")
    claimed = storage.fetch_batch("w1", 2, ["rl-stamp"], [capped])
    storage.KNOWN_BUCKETS.forget(["type:rl.stamp.v1"])  # the first lease decides under the limit's lock

    locked = storage.mark_processing_batch(claimed[:1], "w1", [capped])
    planned = storage.mark_processing_batch(claimed[1:], "w1", [capped])  # on the bucket the first one wrote

    assert locked == {claimed[0].id: 1} and planned == {claimed[1].id: 1}
    bucket = RateBuckets.objects.get(limit_name="type:rl.stamp.v1", rate_key="")
    starts = [JobsHot.objects.get(id=job.id).started_at for job in claimed]
    assert starts[0] is not None and starts[0] >= later, "the lease under the lock started its job before its token"
    assert starts[1] == bucket.refilled_at, "the planned lease started its job at another moment than its token's"
    assert bucket.window_used == 2 and 2.9 < bucket.tokens < 3.1


@pytest.mark.sql_only
def test_a_lease_planned_on_known_buckets_waits_for_a_lease_under_the_lock_and_spends_nothing_it_spent() -> None:
    """A lease under the limits' locks reads the buckets, then writes what it spent; a lease planned on the buckets
    it knows writes them by compare-and-set without those locks. The locked lease holds the bucket rows from its
    read to its commit, so the planned one waits, finds the bucket changed and decides under the lock: without
    that, the locked lease's write would overwrite the planned one's spend and the same tokens would start twice."""
    capped = limit("type:rl.lost.v1", "1/h burst 5")
    saved_up("type:rl.lost.v1", 5)
    pending("rl-lost", 5, type="rl.lost.v1")
    claimed = storage.fetch_batch("w-b", 5, ["rl-lost"], [capped])  # w-b now knows the bucket: 5 tokens
    assert len(claimed) == 5
    finish = another_lease_spending_all("type:rl.lost.v1", 5)

    leased = storage.mark_processing_batch(claimed, "w-b", [capped])

    assert finish() == []
    assert leased == {}, "the planned lease spent the tokens the locked lease spent too"
    assert len(leased.held) == 5
    bucket = RateBuckets.objects.get(limit_name="type:rl.lost.v1", rate_key="")
    assert (bucket.tokens, bucket.window_used) == (0.0, 5)
