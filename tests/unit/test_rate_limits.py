"""Rate limits without a database: the rate syntax, the settings and their system check, @job and enqueue's
rate key, and the token-bucket decisions of a claim (policy.RatePlan)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core import checks
from hypothesis import given, settings
from hypothesis import strategies as st

from chokaq_core import storage
from chokaq_core.api import EnqueueOptions, build, job
from chokaq_core.conf import config
from chokaq_core.domain import (
    EnvelopeError,
    HotJob,
    JobStatus,
    PayloadDeserializationError,
    Rate,
    RateBucket,
    RateLimit,
    parse_rate,
)
from chokaq_core.handlers import JobContext, declared_rate_limits, get_definition
from chokaq_core.policy import RatePlan, next_token_at, refilled
from chokaq_core.worker.invoke import invoke

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("text", "rate"), [
    ("100/m", Rate(100, 60, 10)), ("50/s", Rate(50, 1, 5)), ("1000/h", Rate(1000, 3600, 100)),
    ("10/5m", Rate(10, 300, 1)), ("50/s burst 10", Rate(50, 1, 10)), (" 3 / 2 sec ", Rate(3, 2, 1)),
    ("0/m", Rate(0, 60, 1)), ("7/90s", Rate(7, 90, 1)),
])
def test_a_rate_parses_and_reads_back_from_its_text(text: str, rate: Rate) -> None:
    assert parse_rate(text) == rate
    assert parse_rate(rate.text) == rate


@pytest.mark.parametrize(("text", "error"), [
    ("fast", "does not parse"), ("10/0s", "window must be > 0"), ("10/-1m", "window must be > 0"),
    ("-1/m", "count must be"), ("10/m burst 0", "burst must be"), ("10/d", "unknown unit"), (10, "is a string"),
    ("", "does not parse"), ("10/m burst", "does not parse"),
])
def test_a_bad_rate_is_a_value_error_saying_what_is_wrong(text: Any, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_rate(text)


def test_settings_declare_limits_and_bad_ones_fail_the_system_check(settings: Any) -> None:
    settings.CHOKAQ = {"RATE_LIMITS": {"type:Pay.Capture.v1": "100/m",
                                       "queue:mail": {"RATE": "5/s burst 2", "PER_KEY": True, "MAX_KEYS": 9}}}
    assert config().RATE_LIMITS == {
        "type:pay.capture.v1": RateLimit("type:pay.capture.v1", Rate(100, 60, 10)),
        "queue:mail": RateLimit("queue:mail", Rate(5, 1, 2), per_key=True, max_keys=9)}

    settings.CHOKAQ = {"RATE_LIMITS": {"type:a.v1": "lots", "queue:b": "10/0m", "host:c": "1/s",
                                       "queue:d": {"RATE": "1/s", "PER_KEY": "yes"}, "queue:e": {"RATE": "1/s",
                                                                                              "MAX_KEYS": 0},
                                       "queue:f": {"RTE": "1/s"}}}
    errors = [m.msg for m in checks.run_checks() if m.id == "chokaq.E001"]
    assert any("RATE_LIMITS['type:a.v1']" in e and "does not parse" in e for e in errors)
    assert any("RATE_LIMITS['queue:b']" in e and "window must be > 0" in e for e in errors)
    assert any("RATE_LIMITS['host:c']" in e and "queue or a type" in e for e in errors)
    assert any("RATE_LIMITS['queue:d']" in e and "PER_KEY" in e for e in errors)
    assert any("RATE_LIMITS['queue:e']" in e and "MAX_KEYS" in e for e in errors)
    assert any("RATE_LIMITS['queue:f']" in e and "unknown keys" in e for e in errors)


def test_job_declares_a_limit_and_settings_win(settings: Any) -> None:
    @job("tests.rl.declared.v1", rate_limit="20/s", rate_key="tenant:{tenant}")
    def declared(ctx: Any, tenant: int) -> None: ...

    assert RateLimit("type:tests.rl.declared.v1", Rate(20, 1, 2), per_key=True) in declared_rate_limits()
    settings.CHOKAQ = {"RATE_LIMITS": {"type:tests.rl.declared.v1": "5/m"}}
    assert RateLimit("type:tests.rl.declared.v1", Rate(5, 60, 1)) in declared_rate_limits()


def test_job_refuses_a_bad_rate_at_decoration() -> None:
    with pytest.raises(ValueError, match="window must be > 0"):
        job("tests.rl.bad.v1", rate_limit="5/0s")


def test_enqueue_takes_the_rate_key_given_or_the_jobs_own() -> None:
    @job("tests.rl.keyed.v1", rate_limit="20/s", rate_key=lambda payload: f"tenant:{payload['tenant']}")
    def keyed(ctx: Any, tenant: int) -> None: ...

    assert build(EnqueueOptions("tests.rl.keyed.v1", {"tenant": 4})).rate_key == "tenant:4"
    assert build(EnqueueOptions("tests.rl.keyed.v1", {"tenant": 4}, rate_key="vip")).rate_key == "vip"
    assert keyed.using(rate_key="tenant:9").request(tenant=1).rate_key == "tenant:9"
    assert build(EnqueueOptions("test.ok.v1", {})).rate_key is None


@pytest.mark.parametrize(("options", "error"), [
    (EnqueueOptions("tests.rl.raises.v1", {}), "raised KeyError"),
    (EnqueueOptions("test.ok.v1", {}, rate_key="has space"), "rate key must be 1-255 characters"),
    (EnqueueOptions("test.ok.v1", {}, rate_key="x" * 256), "the limit is 255"),
    (EnqueueOptions("test.ok.v1", {}, rate_key=42), "rate key must be a string"),  # type: ignore[arg-type]
])
def test_a_bad_rate_key_is_a_value_error_at_enqueue(options: EnqueueOptions, error: str) -> None:
    @job("tests.rl.raises.v1", rate_key=lambda payload: payload["tenant"])
    def raises(ctx: Any) -> None: ...

    with pytest.raises(EnvelopeError, match=error) as info:
        build(options)
    assert isinstance(info.value, ValueError)


def test_the_worker_refuses_a_job_whose_rate_key_function_fails() -> None:
    @job("tests.rl.worker.v1", rate_key=lambda payload: payload["tenant"])
    def handler(ctx: Any, **payload: Any) -> str:
        return "ran"

    ctx = JobContext("J1", "tests.rl.worker.v1", "default", 1, None, T0, cancellation=None)  # type: ignore[arg-type]
    with pytest.raises(PayloadDeserializationError, match="rate_key of job J1 failed: KeyError"):
        invoke(hot("tests.rl.worker.v1", payload="{}"), ctx, [], None)
    assert invoke(hot("tests.rl.worker.v1", payload='{"tenant": "t"}'), ctx, [], None) == "ran"
    assert get_definition("tests.rl.worker.v1") is not None


# ---------------------------------------------------------------- token buckets


def hot(type_key: str = "rl.v1", queue: str = "q", rate_key: str | None = None, payload: str = "{}") -> HotJob:
    return HotJob(id="J1", queue=queue, type=type_key, payload=payload, tags=None, idempotency_key=None, priority=10,
                  status=JobStatus.FETCHED, attempt_count=0, worker_id="w", heartbeat_at=None, scheduled_at=None,
                  created_at=T0, started_at=None, last_updated_at=T0, created_by=None, last_modified_by=None,
                  rate_key=rate_key)


def test_a_bucket_refills_at_the_rate_up_to_its_burst() -> None:
    rate = parse_rate("10/s burst 5")
    assert refilled(rate, None, T0) == 1, "a bucket never written starts with one token"
    assert refilled(parse_rate("0/m"), None, T0) == 0
    empty = RateBucket("type:rl.v1", "", 0.0, T0, T0, 5)
    assert refilled(rate, empty, T0 + timedelta(seconds=0.3)) == pytest.approx(3)
    assert refilled(rate, empty, T0 + timedelta(hours=1)) == 5
    assert refilled(rate, empty, T0 - timedelta(seconds=1)) == 0, "a clock behind the bucket adds nothing"
    assert next_token_at(rate, 0.5, T0) == T0 + timedelta(seconds=0.05)
    assert next_token_at(parse_rate("0/m"), 0.0, T0) is None, "a paused limit never gets a token"


def test_a_plan_admits_jobs_in_claim_order_while_every_limit_covering_them_has_a_token() -> None:
    by_type = RateLimit("type:rl.v1", parse_rate("10/s burst 3"))
    by_queue = RateLimit("queue:q", parse_rate("10/s burst 4"))
    idle = T0 - timedelta(hours=1)
    plan = RatePlan.of([by_type, by_queue], [RateBucket("type:rl.v1", "", 3.0, T0, idle, 9),
                                             RateBucket("queue:q", "", 4.0, T0, idle, 9)], T0)
    jobs = [hot(), hot(type_key="other.v1"), hot(), hot(), hot(), hot(type_key="other.v1"), hot(type_key="free.v1", queue="elsewhere")]

    kept, released = plan.admit(jobs)

    assert kept == [jobs[0], jobs[1], jobs[2], jobs[3], jobs[6]]
    assert released == [jobs[4], jobs[5]]
    changed, added, dropped = plan.changes()
    assert added == [] and dropped == []
    assert sorted((b.limit_name, b.tokens, b.window_used, b.window_started_at) for b in changed) == [
        ("queue:q", 0.0, 4, T0), ("type:rl.v1", 0.0, 3, T0)], "a new window began with this claim"
    assert plan.claimed() == {"type:rl.v1": 3, "queue:q": 4} and plan.held == {"type:rl.v1": 1, "queue:q": 2}
    assert plan.next_token_in() == pytest.approx(0.1)


def test_a_plan_holds_what_has_no_token_and_counts_the_window() -> None:
    paused = RateLimit("type:paused.v1", parse_rate("0/m"))
    keyed = RateLimit("queue:q", parse_rate("1/s burst 1"), per_key=True)
    spent = RateBucket("queue:q", "tenant:a", 0.2, T0, T0 - timedelta(seconds=0.5), 3)
    plan = RatePlan.of([paused, keyed], [spent], T0)

    hold = plan.hold()

    assert hold.types == ("paused.v1",) and hold.queues == () and hold.keys == (("queue", "q", "tenant:a"),)
    kept, _ = plan.admit([hot(queue="q", rate_key="tenant:b"), hot(queue="q", rate_key="tenant:a")])
    assert [j.rate_key for j in kept] == ["tenant:b"]
    assert plan.next_token_in() == pytest.approx(0.8)


def test_a_per_key_limit_drops_refilled_buckets_and_keeps_max_keys_live() -> None:
    keyed = RateLimit("type:rl.v1", parse_rate("10/s burst 1"), per_key=True, max_keys=2)
    stale = RateBucket("type:rl.v1", "old", 0.0, T0 - timedelta(seconds=5), T0 - timedelta(seconds=5), 1)
    live = RateBucket("type:rl.v1", "live", 0.0, T0, T0, 1)
    plan = RatePlan.of([keyed], [stale, live], T0)

    kept, released = plan.admit([hot(rate_key="new"), hot(rate_key="newer")])

    assert [j.rate_key for j in kept] == ["new"] and [j.rate_key for j in released] == ["newer"]
    changed, added, dropped = plan.changes()
    assert [b.rate_key for b in added] == ["new"] and dropped == [("type:rl.v1", "old")]
    assert changed == []


@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.one_of(st.none(), st.floats(0, 6)), min_size=3, max_size=3),
       picks=st.lists(st.tuples(st.sampled_from(("rl.v1", "other.v1")), st.sampled_from(("q", "r")),
                                st.sampled_from((None, "a", "b"))), max_size=12))
def test_a_batch_is_admitted_as_its_jobs_would_be_one_by_one(tokens: list[float | None],
                                                              picks: list[tuple[str, str, str | None]]) -> None:
    """A batch whose buckets hold every token it needs is taken at once: the same jobs, tokens and holds as
    deciding each job in claim order."""
    limits = [RateLimit("type:rl.v1", parse_rate("10/s burst 6")), RateLimit("queue:q", parse_rate("10/s burst 6")),
              RateLimit("queue:r", parse_rate("10/s burst 6"), per_key=True, max_keys=2)]
    buckets = [RateBucket(limit.name, "a" if limit.per_key else "", t, T0, T0, 0)
               for limit, t in zip(limits, tokens, strict=True) if t is not None]
    jobs = [hot(type_key, queue, key) for type_key, queue, key in picks]
    batch, one_by_one = RatePlan.of(limits, buckets, T0), RatePlan.of(limits, buckets, T0)

    kept, released = batch.admit(jobs)

    each = [one_by_one.admit([job]) for job in jobs]
    assert kept == [job for job, (got, _) in zip(jobs, each, strict=True) if got]
    assert released == [job for job, (_, back) in zip(jobs, each, strict=True) if back]
    assert batch.taken == one_by_one.taken and batch.held == one_by_one.held
    assert batch.changes() == one_by_one.changes()


# ---------------------------------------------------------------- the buckets a process knows (planned leases)


def test_known_buckets_keep_the_newest_sight_of_each_bucket() -> None:
    known = storage.KnownBuckets()
    newer = RateBucket("type:a.v1", "", 2.0, T0 + timedelta(seconds=5), T0, 3)
    known.note(T0 + timedelta(seconds=5), [newer])
    known.note(T0 + timedelta(seconds=1), [RateBucket("type:a.v1", "", 4.0, T0, T0, 1)])  # a claim's older read

    now, buckets = known.now_and_buckets(["type:a.v1"]) or (None, [])
    assert buckets == [newer]
    assert now is not None and now >= T0 + timedelta(seconds=5), "the clock moves on from its newest reading"
    assert known.now_and_buckets(["type:other.v1"])[1] == []  # type: ignore[index]
    known.note(T0 + timedelta(seconds=6), [], dropped=[("type:a.v1", "")])
    assert known.now_and_buckets(["type:a.v1"])[1] == []  # type: ignore[index]


def test_known_buckets_trust_no_clock_read_too_long_ago(monkeypatch: pytest.MonkeyPatch) -> None:
    known = storage.KnownBuckets()
    assert known.now_and_buckets(["type:a.v1"]) is None, "nothing read yet"
    known.note(T0, [RateBucket("type:a.v1", "", 2.0, T0, T0, 3)])
    read_at = storage.time.monotonic()
    monkeypatch.setattr(storage.time, "monotonic", lambda: read_at + known.MAX_AGE + 1)
    assert known.now_and_buckets(["type:a.v1"]) is None
    known.forget(["type:a.v1"])
    monkeypatch.undo()
    known.note(T0 + timedelta(seconds=1), [])
    assert known.now_and_buckets(["type:a.v1"])[1] == []  # type: ignore[index]


def test_a_plan_names_the_buckets_a_start_takes_from_and_writes_them_in_limit_and_key_order() -> None:
    per_type = RateLimit("type:pay.v1", Rate(60, 60.0, 5))
    per_queue = RateLimit("queue:mail", Rate(60, 60.0, 5))
    bucket = RateBucket("type:pay.v1", "", 3.0, T0, T0, 1)
    plan = RatePlan.of([per_type, per_queue], [bucket], T0)
    job = hot("pay.v1", "mail")

    assert plan.slots(job) == [("type:pay.v1", ""), ("queue:mail", "")]
    plan.admit([job])
    changed, added, dropped = plan.changes()
    assert [(b.limit_name, b.tokens, b.window_used) for b in changed] == [("type:pay.v1", 2.0, 2)]
    assert [(b.limit_name, b.tokens) for b in added] == [("queue:mail", 0.0)], "a new bucket's one token, spent"
    assert dropped == []
    plan.give_back([job])
    assert plan.changes() == ([], [], []), "a job given back took nothing"
