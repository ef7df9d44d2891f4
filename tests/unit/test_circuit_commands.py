"""An operator's circuit commands as a worker applies them: reset (close now) and open now."""

from __future__ import annotations

from types import SimpleNamespace

from chokaq_core.policy import BreakerPolicy, CircuitBreakers, CircuitStatus
from chokaq_core.worker.control import Control


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def control(breakers: CircuitBreakers, changes: list[int]) -> Control:
    return Control("w-1", SimpleNamespace(), lambda n: None, SimpleNamespace(breakers=breakers),  # type: ignore[arg-type]
                   SimpleNamespace(), lambda: changes.append(1))  # type: ignore[arg-type]


def test_reset_closes_an_open_breaker_now_and_forgets_its_failures() -> None:
    clock = Clock()
    breakers = CircuitBreakers(BreakerPolicy(failure_threshold=1, break_duration=60), clock=clock)
    breaker = breakers.get("demo.payment.capture.v1")
    stale = breaker.acquire()
    assert stale is not None
    breaker.failure(stale, fatal=False)
    assert breaker.status == CircuitStatus.OPEN and breaker.acquire() is None
    changes: list[int] = []
    control(breakers, changes).handle({"type": "worker.set_circuit", "key": "demo.payment.capture.v1",
                                       "state": "closed"})
    assert breaker.status == CircuitStatus.CLOSED and breaker.failure_count == 0 and changes == [1]
    assert breaker.acquire() is not None  # jobs run again at once, not after the break duration


def test_open_now_defers_the_type_for_a_full_break_duration() -> None:
    clock = Clock()
    breakers = CircuitBreakers(BreakerPolicy(failure_threshold=5, break_duration=30), clock=clock)
    changes: list[int] = []
    control(breakers, changes).handle({"type": "worker.set_circuit", "key": "demo.email.v1", "state": "open"})
    breaker = breakers.get("demo.email.v1")
    assert breaker.status == CircuitStatus.OPEN and breaker.acquire() is None and changes == [1]
    clock.now += 31
    assert breaker.acquire() is not None and breaker.status == CircuitStatus.HALF_OPEN


def test_a_command_for_another_worker_or_an_unknown_state_changes_nothing() -> None:
    breakers = CircuitBreakers(BreakerPolicy())
    changes: list[int] = []
    c = control(breakers, changes)
    c.handle({"type": "worker.set_circuit", "key": "k.v1", "state": "open", "workerId": "w-2"})
    c.handle({"type": "worker.set_circuit", "key": "k.v1", "state": "half"})
    assert breakers.snapshot() == [] and changes == []
