"""``events.dispatch`` of a producer: built only when someone hears it, then delivered as a list would be."""

from __future__ import annotations

from typing import Any

import pytest

from chokaq_core import events


def producer(calls: list[int]) -> Any:
    def produce() -> list[events.Event]:
        calls.append(1)
        return [events.stats_updated("t0"), events.job_updated("j1", "t.v1", "q", 2, 1, ts="t0")]
    return produce


class Publisher:
    def __init__(self) -> None:
        self.offered: list[events.Event] = []

    def offer(self, offered: list[events.Event]) -> None:
        self.offered.extend(offered)


def test_nobody_hears_so_nothing_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(events, "_listeners", [])
    monkeypatch.setattr(events, "_publisher", lambda: None)

    events.dispatch(producer(calls))

    assert calls == []


def test_a_listener_gets_what_the_producer_built_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    seen: list[events.Event] = []
    monkeypatch.setattr(events, "_listeners", [seen.append, seen.append])
    monkeypatch.setattr(events, "_publisher", lambda: None)

    events.dispatch(producer(calls))

    assert calls == [1]
    assert [str(e.kind) for e in seen] == ["StatsUpdated", "JobUpdated"] * 2


def test_the_channel_layer_publisher_alone_hears_the_producer(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    publisher = Publisher()
    monkeypatch.setattr(events, "_listeners", [])
    monkeypatch.setattr(events, "_publisher", lambda: publisher)

    events.dispatch(producer(calls))

    assert calls == [1]
    assert [(str(e.kind), e.data.get("jobId"), e.ts) for e in publisher.offered] == [
        ("StatsUpdated", None, "t0"), ("JobUpdated", "j1", "t0")]


def test_a_producer_that_fails_is_logged_never_raised(monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    seen: list[events.Event] = []
    monkeypatch.setattr(events, "_listeners", [seen.append])
    monkeypatch.setattr(events, "_publisher", lambda: None)

    def broken() -> list[events.Event]:
        raise RuntimeError("boom")

    events.dispatch(broken)

    assert seen == []
    assert "building events failed" in caplog.text
