"""Fixtures of the control-plane tests: in-process workers (from ``tests/worker``) and
real ``manage.py chokaq_worker`` subprocesses on the test database.

Every test polls the committed database state against a deadline; subprocesses
are always stopped (SIGTERM, then SIGKILL) before the database is flushed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from chokaq_core import events
from chokaq_core.middleware import reset_idempotency_store
from tests.conftest import database_url
from tests.control import jobs as ctl_jobs
from tests.worker.conftest import FAST, State, WorkerStarter, fast, gate, start_worker, state

__all__ = ["FAST", "REDIS_URL", "State", "WorkerStarter", "fast", "gate", "start_worker", "state"]

ROOT = Path(__file__).resolve().parents[2]
# Redis database of these tests (the Deck's live tests use /9). Control messages always name
# their worker, so a concurrent run on the same Redis cannot steer these tests' workers.
REDIS_URL = os.environ.get("CHOKAQ_TEST_CONTROL_REDIS_URL", "redis://127.0.0.1:6379/11")
BANNER = re.compile(r"ChokaQ worker (\S+) \|")

# Short intervals for worker subprocesses (CHOKAQ_TEST_OVERRIDES). MAX_CONCURRENCY stays small:
# every executor thread keeps its own database connection.
SUBPROCESS_OVERRIDES: dict[str, Any] = {
    "JOB_MODULES": ["tests.jobs", "tests.control.jobs"],
    "WORKER": {"POLLING_INTERVAL": 0.05, "NO_QUEUES_SLEEP_INTERVAL": 0.1, "SHUTDOWN_GRACE_PERIOD": 5,
               "REGISTRY_HEARTBEAT_INTERVAL": 0.5, "COMPLETION_FLUSH_INTERVAL": 0.01, "CONCURRENCY": 4,
               "MAX_CONCURRENCY": 8},
    "EXECUTION": {"HEARTBEAT_INTERVAL_MIN": 0.2, "HEARTBEAT_INTERVAL_MAX": 0.3, "CANCEL_POLL_INTERVAL": 0.1},
    "RECOVERY": {"SCAN_INTERVAL": 0.5},
    "RETRY": {"BASE_DELAY": 0.05, "JITTER_MAX_DELAY": 0},
}


@pytest.fixture(autouse=True)
def _reset_control_jobs() -> Iterator[None]:
    ctl_jobs.reset()
    reset_idempotency_store()
    yield
    ctl_jobs.HOLD.set()
    ctl_jobs.reset()
    reset_idempotency_store()


@dataclass
class WorkerProcess:
    proc: subprocess.Popen[bytes]
    log: Path
    worker_id: str = ""

    def output(self) -> str:
        try:
            text = self.log.read_text(errors="replace")[-6000:]
        except OSError:
            text = ""
        return f"--- worker {self.worker_id or '?'} pid {self.proc.pid} rc {self.proc.poll()}\n{text}"


def merge_overrides(base: dict[str, Any], extra: dict[str, Any] | None) -> dict[str, Any]:
    merged = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for section, values in (extra or {}).items():
        if isinstance(values, dict) and isinstance(merged.get(section), dict):
            merged[section] = {**merged[section], **values}
        else:
            merged[section] = values
    return merged


class WorkerProcesses:
    """Starts ``manage.py chokaq_worker`` subprocesses on the test database; reaps them at teardown."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[WorkerProcess] = []

    def env(self, overrides: dict[str, Any] | None = None, **extra_env: str) -> dict[str, str]:
        env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings",
               "PYTHONUNBUFFERED": "1",
               "CHOKAQ_TEST_OVERRIDES": json.dumps(merge_overrides(SUBPROCESS_OVERRIDES, overrides))}
        env.pop("REDIS_URL", None)
        env.pop("CHOKAQ_TEST_LINGER", None)
        env.update(extra_env)
        return env

    def start(self, *args: str, overrides: dict[str, Any] | None = None, timeout: float = 30.0,
              **extra_env: str) -> WorkerProcess:
        """Start one worker (``args`` go to the command) and wait for its banner."""
        log = self.tmp_path / f"worker{len(self.started)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "manage.py", "chokaq_worker", *args], cwd=ROOT,
                                    env=self.env(overrides, **extra_env), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        worker = WorkerProcess(proc, log)
        self.started.append(worker)
        deadline = time.monotonic() + timeout
        while not worker.worker_id:
            match = BANNER.search(log.read_text(errors="replace"))
            if match:
                worker.worker_id = match.group(1)
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("a worker subprocess did not print its banner:\n" + worker.output())
            time.sleep(0.05)
        return worker

    def stop(self, worker: WorkerProcess, timeout: float = 20.0) -> int:
        if worker.proc.poll() is None:
            worker.proc.send_signal(signal.SIGTERM)
        try:
            return worker.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            worker.proc.kill()
            worker.proc.wait(timeout=10)
            pytest.fail("a worker subprocess did not stop on SIGTERM:\n" + worker.output())

    def kill(self, worker: WorkerProcess) -> None:
        worker.proc.send_signal(signal.SIGKILL)
        worker.proc.wait(timeout=10)

    def outputs(self) -> str:
        return "\n".join(w.output() for w in self.started)

    def teardown(self) -> None:
        for worker in self.started:
            if worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for worker in self.started:
            try:
                worker.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.wait(timeout=10)


@pytest.fixture
def worker_procs(transactional_db: None, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[WorkerProcesses]:
    procs = WorkerProcesses(tmp_path)
    yield procs
    failed = getattr(request.node, "rep_call", None)
    procs.teardown()
    if failed is not None and failed.failed:
        print(procs.outputs())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]


@pytest.fixture
def redis_layer(settings: Any) -> Iterator[str]:
    """This process's channel layer on Redis (so ``send_control`` reaches worker subprocesses)."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": [REDIS_URL], "capacity": 5000, "expiry": 30}}}
    events.reset_publisher()
    yield REDIS_URL
    events.reset_publisher()  # the settings fixture restores CHANNEL_LAYERS afterwards


def query(sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return list(cursor.fetchall())


def scalar(sql: str, params: list[Any] | None = None) -> Any:
    return query(sql, params)[0][0]
