"""Fixtures for the worker tests: a real database, in-process workers with short intervals.

Worker threads use their own database connections, so every test here runs
with ``transactional_db`` (data is committed) and polls the database against a
deadline instead of sleeping for a fixed time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from chokaq_core import storage
from chokaq_core.domain import ArchivedJob, DeadJob, HotJob
from chokaq_core.models import JobsHot, StatsSummary, Workers
from chokaq_core.worker import Worker, WorkerOptions
from tests import jobs

# Short intervals for every worker test; a test overrides sections with ``fast(...)``.
FAST: dict[str, dict[str, Any]] = {
    "RETRY": {"BASE_DELAY": 0.05, "JITTER_MAX_DELAY": 0, "MAX_ATTEMPTS": 3},
    "EXECUTION": {
        "HEARTBEAT_INTERVAL_MIN": 0.2,
        "HEARTBEAT_INTERVAL_MAX": 0.3,
        "CANCEL_POLL_INTERVAL": 0.05,
        "DEFAULT_TIMEOUT": 30,
    },
    "WORKER": {
        "POLLING_INTERVAL": 0.05,
        "NO_QUEUES_SLEEP_INTERVAL": 0.1,
        "SHUTDOWN_GRACE_PERIOD": 3,
        "REGISTRY_HEARTBEAT_INTERVAL": 0.5,
        "COMPLETION_FLUSH_INTERVAL": 0.01,
    },
    "RECOVERY": {"SCAN_INTERVAL": 0.2, "FETCHED_JOB_TIMEOUT": 60, "PROCESSING_ZOMBIE_TIMEOUT": 60},
}


@pytest.fixture
def fast(chokaq_settings: Any) -> Callable[..., None]:
    """Apply :data:`FAST`; call the returned function to override more keys, section by section."""

    def apply(**sections: Any) -> None:
        current = dict(chokaq_settings.CHOKAQ)
        for section, values in sections.items():
            if isinstance(values, dict) and section != "QUEUES":
                current[section] = {**current.get(section, {}), **values}
            else:
                current[section] = values
        chokaq_settings.CHOKAQ = current  # reassigning fires setting_changed → config() is rebuilt

    apply(**FAST)
    return apply


class WorkerStarter:
    """Starts in-process workers and stops every one of them at teardown."""

    def __init__(self) -> None:
        self.started: list[Worker] = []

    def __call__(self, **options: Any) -> Worker:
        worker = Worker(WorkerOptions(**options))
        self.started.append(worker)
        worker.start()
        return worker

    def stop(self, worker: Worker, timeout: float = 15) -> None:
        worker.stop()
        assert worker.stopped.wait(timeout), f"worker {worker.worker_id} did not stop within {timeout} s"

    def teardown(self) -> None:
        for gate in list(jobs.GATES.values()):
            gate.set()
        for worker in self.started:
            worker.stop()
        for worker in self.started:
            worker.stopped.wait(15)
            for thread in worker._threads:
                thread.join(5)
            worker.close_executor_connections()  # also after a grace-period timeout left a handler running


@pytest.fixture
def start_worker(transactional_db: None, fast: Callable[..., None]) -> Iterator[WorkerStarter]:
    """``start_worker(**WorkerOptions)`` → a started :class:`Worker` (stopped at teardown)."""
    workers = WorkerStarter()
    yield workers
    workers.teardown()


class State:
    """Reads of the committed database state (via storage and the ORM)."""

    def hot(self, job_id: str) -> HotJob | None:
        return storage.get_hot(job_id)

    def archived(self, job_id: str) -> ArchivedJob | None:
        return storage.get_archived(job_id)

    def dead(self, job_id: str) -> DeadJob | None:
        return storage.get_dead(job_id)

    def pillar(self, job_id: str) -> str | None:
        if self.hot(job_id):
            return "hot"
        if self.archived(job_id):
            return "archive"
        if self.dead(job_id):
            return "dlq"
        return None

    def counters(self, queue: str = "default") -> tuple[int, int, int]:
        """(succeeded_total, failed_total, retried_total) of a queue."""
        row = StatsSummary.objects.filter(queue=queue).values_list(
            "succeeded_total", "failed_total", "retried_total"
        ).first()
        return tuple(row) if row else (0, 0, 0)  # type: ignore[return-value]

    def hot_count(self) -> int:
        return JobsHot.objects.count()

    def registry(self, worker_id: str) -> Workers | None:
        return Workers.objects.filter(worker_id=worker_id).first()

    def wait(self, predicate: Callable[[], Any], what: str, timeout: float = 10.0, interval: float = 0.02) -> Any:
        """Poll ``predicate`` until it returns something truthy; fail with ``what`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                pytest.fail(f"timed out after {timeout} s waiting for {what} (last value {value!r})")
            time.sleep(interval)

    def wait_archived(self, job_id: str, timeout: float = 10.0) -> ArchivedJob:
        return self.wait(lambda: self.archived(job_id), f"job {job_id} in Archive", timeout)

    def wait_dead(self, job_id: str, timeout: float = 10.0) -> DeadJob:
        return self.wait(lambda: self.dead(job_id), f"job {job_id} in the DLQ", timeout)

    def wait_started(self, job_id: str, timeout: float = 10.0) -> list[int]:
        """Wait until the handler of an in-process job runs (``tests.jobs.record``): a Processing row is leased,
        and its executor thread may not have begun yet."""
        return self.wait(lambda: list(jobs.EXECUTIONS.get(job_id, [])), f"job {job_id}'s handler to start", timeout)

    def wait_status(self, job_id: str, status: int, timeout: float = 10.0, **fields: Any) -> HotJob:
        def check() -> HotJob | None:
            job = self.hot(job_id)
            if job is None or job.status != status:
                return None
            return job if all(getattr(job, k) == v for k, v in fields.items()) else None

        return self.wait(check, f"job {job_id} in Hot with status {status} {fields or ''}", timeout)


@pytest.fixture
def state(transactional_db: None) -> State:
    return State()


@pytest.fixture
def gate() -> Callable[[str], threading.Event]:
    """``gate(name)`` → the Event a ``test.gate.v1`` / ``test.watch.v1`` job with that name waits for."""

    def make(name: str) -> threading.Event:
        return jobs.GATES.setdefault(name, threading.Event())

    return make
