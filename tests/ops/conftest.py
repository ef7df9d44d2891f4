"""Fixtures of the operations tests: committing database, short worker intervals, burst workers."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from chokaq_core.worker import Worker, WorkerOptions
from tests.ops import tasks

FAST: dict[str, dict[str, Any]] = {
    "RETRY": {"BASE_DELAY": 0.01, "JITTER_MAX_DELAY": 0, "MAX_ATTEMPTS": 3},
    "EXECUTION": {"HEARTBEAT_INTERVAL_MIN": 0.2, "HEARTBEAT_INTERVAL_MAX": 0.3, "CANCEL_POLL_INTERVAL": 0.05},
    "WORKER": {"POLLING_INTERVAL": 0.05, "SHUTDOWN_GRACE_PERIOD": 5, "REGISTRY_HEARTBEAT_INTERVAL": 0.5,
               "COMPLETION_FLUSH_INTERVAL": 0.01},
}


@pytest.fixture(autouse=True)
def _open_gates() -> Iterator[None]:
    tasks.GATES.clear()
    tasks.SEEN_CONTEXTS.clear()
    yield
    for gate in list(tasks.GATES.values()):
        gate.set()


@pytest.fixture
def fast(chokaq_settings: Any) -> Callable[..., None]:
    """Short worker intervals; call the fixture's value to override more sections."""

    def apply(**sections: Any) -> None:
        current = dict(chokaq_settings.CHOKAQ)
        for section, values in sections.items():
            current[section] = {**current.get(section, {}), **values} if isinstance(values, dict) else values
        chokaq_settings.CHOKAQ = current

    apply(**FAST)
    return apply


@pytest.fixture
def burst(fast: Callable[..., None], transactional_db: None) -> Callable[..., Worker]:
    """Run an in-process worker until nothing eligible is left (``--burst``)."""

    def run(**options: Any) -> Worker:
        worker = Worker(WorkerOptions(burst=True, rescue=False, concurrency=4, **options))
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        thread.join(120)
        assert not thread.is_alive(), "burst worker did not finish"
        return worker

    return run


@pytest.fixture
def background_worker(fast: Callable[..., None], transactional_db: None) -> Iterator[Callable[..., Worker]]:
    """Start in-process workers that keep running until the test ends."""
    started: list[Worker] = []

    def start(**options: Any) -> Worker:
        worker = Worker(WorkerOptions(rescue=False, concurrency=4, **options))
        worker.start()
        started.append(worker)
        return worker

    yield start
    for gate in list(tasks.GATES.values()):
        gate.set()
    for worker in started:
        worker.stop()
    for worker in started:
        assert worker.stopped.wait(30)
