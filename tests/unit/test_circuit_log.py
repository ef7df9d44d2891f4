"""The worker's circuit log: one line per state change with the deferred count, not one line per deferred job."""

from __future__ import annotations

import logging

import pytest

from chokaq_core.domain import Retry
from chokaq_core.policy import BreakerPolicy, CircuitBreakers
from chokaq_core.worker.process import CircuitLog
from tests.unit.test_worker_services import Recorder, dispatcher, hot, run_until


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def circuit_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "chokaq.worker" and r.levelno >= logging.INFO and "circuit" in r.getMessage()]


def test_a_circuit_open_for_many_jobs_logs_each_state_change_once_with_the_count(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="chokaq.worker")
    clock = Clock()
    breakers = CircuitBreakers(BreakerPolicy(failure_threshold=1, break_duration=30, half_open_max_calls=1),
                               clock=clock, on_event=CircuitLog())
    breaker = breakers.get("demo.payment.capture.v1")
    breaker.failure(breaker.acquire(), fatal=False)  # type: ignore[arg-type]
    for _ in range(250):
        assert breaker.acquire() is None
    clock.now += 31
    probe = breaker.acquire()
    assert probe is not None
    breaker.success(probe)
    assert circuit_lines(caplog) == [
        "circuit demo.payment.capture.v1 opened (now OPEN; 0 job(s) deferred since the previous change)",
        "circuit demo.payment.capture.v1 half_opened (now HALF_OPEN; 250 job(s) deferred since the previous change)",
        "circuit demo.payment.capture.v1 closed (now CLOSED; 0 job(s) deferred since the previous change)",
    ]


def test_the_dispatcher_defers_jobs_of_an_open_circuit_without_an_info_line_each(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="chokaq.worker")
    rec = Recorder()
    d, _, in_flight = dispatcher(monkeypatch, rec, leased={}, threshold=1)
    breaker = d.breakers.get("t")
    breaker.failure(breaker.acquire(), fatal=False)  # type: ignore[arg-type]
    run_until(d, [hot(n) for n in range(8)], in_flight, lambda: len(rec.outcomes) == 8 and not in_flight)
    assert all(isinstance(o, Retry) for o in rec.outcomes)
    assert [line for line in circuit_lines(caplog) if "deferred" in line and "job j" in line] == []
