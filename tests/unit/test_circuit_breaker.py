"""Circuit breaker states with a controllable clock (spec 03 §7.3–§7.5)."""

from __future__ import annotations

from datetime import UTC, datetime

from chokaq_core.policy import BreakerPolicy, CircuitBreaker, CircuitBreakers, CircuitStatus


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(**policy: float) -> tuple[CircuitBreaker, Clock, list[str]]:
    clock = Clock()
    seen: list[str] = []
    breaker = CircuitBreaker("t.v1", BreakerPolicy(**policy), clock,  # type: ignore[arg-type]
                             lambda key, event, status: seen.append(event))
    return breaker, clock, seen


def fail(breaker: CircuitBreaker, n: int = 1) -> None:
    for _ in range(n):
        permit = breaker.acquire()
        assert permit is not None
        breaker.failure(permit)


def test_opens_after_threshold_then_half_opens_then_closes() -> None:
    breaker, clock, seen = make(failure_threshold=3, break_duration=30)
    fail(breaker, 2)
    assert breaker.status == CircuitStatus.CLOSED
    fail(breaker)
    assert breaker.status == CircuitStatus.OPEN
    reset_at = datetime.fromisoformat(str(breaker.snapshot()["resetAtUtc"]))  # now + the 30 s still to wait
    assert abs((reset_at - datetime.now(UTC)).total_seconds() - 30) < 5
    clock.now += 29
    assert breaker.acquire() is None  # still open: deferred, no attempt consumed
    clock.now += 1
    probe = breaker.acquire()
    assert probe is not None and probe.probe and breaker.status == CircuitStatus.HALF_OPEN
    assert breaker.acquire() is None  # only HALF_OPEN_MAX_CALLS probes at once
    breaker.success(probe)
    assert breaker.status == CircuitStatus.CLOSED and breaker.failure_count == 0
    assert seen == ["opened", "rejected", "half_opened", "probe_acquired", "rejected", "closed"]


def test_probe_failure_reopens() -> None:
    breaker, clock, _ = make(failure_threshold=1, break_duration=10)
    fail(breaker)
    clock.now += 10
    probe = breaker.acquire()
    assert probe is not None
    breaker.failure(probe)
    assert breaker.status == CircuitStatus.OPEN
    clock.now += 9
    assert breaker.acquire() is None


def test_success_resets_count_and_window_expires_old_failures() -> None:
    breaker, clock, _ = make(failure_threshold=3, failure_window=60)
    fail(breaker, 2)
    ok = breaker.acquire()
    assert ok is not None
    breaker.success(ok)
    fail(breaker, 2)
    assert breaker.status == CircuitStatus.CLOSED
    clock.now += 61
    fail(breaker)  # the two old failures left the window
    assert breaker.failure_count == 1 and breaker.status == CircuitStatus.CLOSED


def test_fatal_severity_opens_at_once() -> None:
    breaker, _, _ = make(failure_threshold=5)
    permit = breaker.acquire()
    assert permit is not None
    breaker.failure(permit, fatal=True)
    assert breaker.status == CircuitStatus.OPEN


def test_stale_generation_outcomes_are_ignored_and_released_probes_free_a_slot() -> None:
    breaker, clock, seen = make(failure_threshold=1, break_duration=5, half_open_probe_timeout=20)
    old = breaker.acquire()
    fail(breaker)
    assert old is not None
    breaker.success(old)  # from the Closed generation: ignored
    assert breaker.status == CircuitStatus.OPEN
    clock.now += 5
    probe = breaker.acquire()
    assert probe is not None
    breaker.release(probe)
    assert "permit_released" in seen
    again = breaker.acquire()
    assert again is not None and again.probe
    clock.now += 20  # the outstanding probe expires: a new generation starts
    newer = breaker.acquire()
    assert newer is not None and "probe_expired" in seen
    breaker.failure(again)  # outcome of the expired generation: ignored
    assert breaker.status == CircuitStatus.HALF_OPEN
    breaker.success(newer)
    assert breaker.status == CircuitStatus.CLOSED


def test_registry_per_type_key_with_overrides() -> None:
    clock = Clock()
    breakers = CircuitBreakers(BreakerPolicy(failure_threshold=5), {"Strict.V1": BreakerPolicy(failure_threshold=1)},
                               clock=clock)
    assert breakers.get("strict.v1") is breakers.get("STRICT.V1")
    fail(breakers.get("strict.v1"))
    fail(breakers.get("lenient.v1"))
    snapshot = {s["circuitKey"]: s["status"] for s in breakers.snapshot()}
    assert snapshot == {"strict.v1": 1, "lenient.v1": 0}
