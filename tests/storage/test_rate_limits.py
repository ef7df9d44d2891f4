"""Fleet-wide rate limits in the claim: token buckets per limit (and key), written in the claim's transaction."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import F
from django.utils import timezone

from chokaq_core import storage
from chokaq_core.domain import JobStatus, RateLimit, parse_rate
from chokaq_core.models import JobsHot, RateBuckets, RateLimits

from .rows import pending


def limit(name: str, rate: str, *, per_key: bool = False, max_keys: int = 1000) -> RateLimit:
    """A limit in force, recorded as declared (a claim locks the limit rows)."""
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


def test_a_claim_takes_no_more_than_the_tokens_and_the_rest_stays_pending_without_an_attempt() -> None:
    capped = limit("type:rl.capped.v1", "60/h burst 3")  # a token a minute: none comes back during the test
    saved_up("type:rl.capped.v1", 3)
    ids = pending("rl", 8, type="rl.capped.v1")

    claimed = storage.fetch_batch("w1", 8, ["rl"], [capped])

    assert len(claimed) == 3
    held = JobsHot.objects.filter(id__in=ids).exclude(id__in=[j.id for j in claimed])
    assert held.count() == 5
    assert all(r.status == JobStatus.PENDING and r.worker_id is None and r.attempt_count == 0 for r in held)
    bucket = RateBuckets.objects.get(limit_name="type:rl.capped.v1", rate_key="")
    assert bucket.window_used == 3, "the bucket's counter equals the rows claimed"
    assert bucket.tokens < 1
    assert storage.fetch_batch("w2", 8, ["rl"], [capped]) == [], "no token left, nothing claimed"


def test_tokens_come_back_at_the_rate_up_to_the_burst() -> None:
    capped = limit("type:rl.refill.v1", "4/s burst 2")
    pending("rl-refill", 10, type="rl.refill.v1")
    assert len(storage.fetch_batch("w1", 10, ["rl-refill"], [capped])) == 1, "a new limit starts with one token"

    age_buckets(0.5)  # 4/s for half a second: two tokens
    assert len(storage.fetch_batch("w1", 10, ["rl-refill"], [capped])) == 2
    age_buckets(60)  # a long idle spell refills only up to the burst
    assert len(storage.fetch_batch("w1", 10, ["rl-refill"], [capped])) == 2
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

    claimed = storage.fetch_batch("w1", 15, ["rl-keys"], [tenants])

    by_key: dict[str | None, int] = {}
    for job in claimed:
        by_key[job.rate_key] = by_key.get(job.rate_key, 0) + 1
    assert by_key == {"tenant:a": 1, "tenant:b": 1, "tenant:c": 1}, "each new key starts with one token"
    assert {b.rate_key: b.window_used for b in RateBuckets.objects.all()} == {
        "tenant:a": 1, "tenant:b": 1, "tenant:c": 1}
    age_buckets(0.1)  # 20/s: two tokens each, the burst
    by_key = {}
    for job in storage.fetch_batch("w1", 15, ["rl-keys"], [tenants]):
        by_key[job.rate_key] = by_key.get(job.rate_key, 0) + 1
    assert by_key == {"tenant:a": 2, "tenant:b": 2, "tenant:c": 2}


def test_a_per_key_limit_keeps_at_most_max_keys_live() -> None:
    tenants = limit("type:rl.few.v1", "20/s burst 1", per_key=True, max_keys=2)
    for tenant in ("a", "b", "c"):
        storage.enqueue(_jobs("rl-few", 1, "rl.few.v1", f"tenant:{tenant}"))

    claimed = storage.fetch_batch("w1", 10, ["rl-few"], [tenants])

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

    for name in ("lock_rate_buckets", "save_rate_buckets", "rate_buckets"):
        monkeypatch.setattr(type(storage.dialect()), name, refuse)
    assert sorted(j.id for j in storage.fetch_batch("w1", 5, ["rl-plain"])) == sorted(ids)


@pytest.mark.sql_only
def test_a_claim_that_waited_for_another_claims_lock_sees_the_tokens_that_claim_left() -> None:
    """Another transaction (a claim, as far as the limit is concerned) holds the limit's row and spends the
    bucket's 5 tokens; a claim started meanwhile waits for it, then must see 0 tokens, not the 5 its first
    snapshot showed (PostgreSQL's READ COMMITTED re-reads only the rows a waiting statement locks)."""
    import threading

    from django.db import connection, connections, transaction

    capped = limit("type:rl.race.v1", "1/h burst 5")
    saved_up("type:rl.race.v1", 5)
    pending("rl-race", 10, type="rl.race.v1")
    locked, errors = threading.Event(), []

    def spend_all() -> None:
        try:
            with transaction.atomic():
                if connection.vendor == "postgresql":
                    with connection.cursor() as cursor:
                        cursor.execute("SELECT name FROM chokaq_rate_limits WHERE name = %s FOR UPDATE",
                                       ["type:rl.race.v1"])
                RateBuckets.objects.filter(limit_name="type:rl.race.v1").update(window_used=5)
                locked.set()
                threading.Event().wait(0.5)  # the other claim starts and waits for this lock meanwhile
                RateBuckets.objects.filter(limit_name="type:rl.race.v1").update(tokens=0.0)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            locked.set()
        finally:
            connections.close_all()

    holder = threading.Thread(target=spend_all)
    holder.start()
    assert locked.wait(30)
    claimed = storage.fetch_batch("w-b", 10, ["rl-race"], [capped])
    holder.join(timeout=60)

    assert errors == []
    assert claimed == [], "the waiting claim spent tokens the other transaction had already spent"
