"""``python manage.py chokaq_worker`` as a real process: banner, burst, --processes, SIGTERM (spec 03 §1, 02 §9).

The processes run against this run's test database (``tests.conftest.database_url()``);
``test.record.v1`` writes one row per execution into ``test_executions``, so a test
can count executions that happened in another process.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from chokaq_core import FailureReason, JobStatus, enqueue, enqueue_many
from chokaq_core.api import EnqueueOptions
from chokaq_core.models import JobsArchive, JobsHot
from tests.conftest import database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BANNER = re.compile(r"^ChokaQ worker (\S+) \| database (\w+) .*\| queues \* \| concurrency (\d+) \| batch (\d+)", re.M)
OVERRIDES: dict[str, dict[str, Any]] = {
    "EXECUTION": {"HEARTBEAT_INTERVAL_MIN": 0.2, "HEARTBEAT_INTERVAL_MAX": 0.3, "CANCEL_POLL_INTERVAL": 0.1},
    "WORKER": {"POLLING_INTERVAL": 0.05, "SHUTDOWN_GRACE_PERIOD": 10, "REGISTRY_HEARTBEAT_INTERVAL": 0.5,
               "CONCURRENCY": 4, "MAX_CONCURRENCY": 8},
    "RETRY": {"BASE_DELAY": 0.05, "JITTER_MAX_DELAY": 0},
}


def _env(**overrides: dict[str, Any]) -> dict[str, str]:
    sections = {k: dict(v) for k, v in OVERRIDES.items()}
    for section, values in overrides.items():
        sections.setdefault(section, {}).update(values)
    return {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings",
            "CHOKAQ_TEST_OVERRIDES": json.dumps(sections), "PYTHONUNBUFFERED": "1"}


def _burst(*args: str, timeout: float = 90, **overrides: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "chokaq_worker", "--burst", *args], cwd=ROOT, env=_env(**overrides),
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def executions(transactional_db: None) -> Iterator[Any]:
    """The ``test_executions`` table in the test database; returns a reader of {job id: [attempts]}."""
    key = "bigserial" if connection.vendor == "postgresql" else "integer"
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS test_executions")
        cursor.execute(f"CREATE TABLE test_executions (id {key} PRIMARY KEY, job_id varchar(50) NOT NULL, attempt int)")

    def read() -> dict[str, list[int]]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT job_id, attempt FROM test_executions ORDER BY id")
            result: dict[str, list[int]] = {}
            for job_id, attempt in cursor.fetchall():
                result.setdefault(job_id, []).append(attempt)
            return result

    yield read
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS test_executions")


def test_burst_drains_everything_eligible_and_exits_zero(executions: Any, state: Any, vendor: str) -> None:
    ids = enqueue_many([EnqueueOptions("test.record.v1", {}) for _ in range(10)])
    fatal = enqueue("test.fatal.v1", {})
    later = enqueue("test.record.v1", {}, delay=3600)  # not eligible: burst must not wait for it

    started = time.monotonic()
    done = _burst()
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - started < 60

    # The start-up banner is the first line.
    match = BANNER.match(done.stdout)
    assert match, f"no banner in {done.stdout!r}"
    worker_id, db_vendor, concurrency, batch = match.groups()
    assert db_vendor == vendor and concurrency == "4" and batch == "20"
    assert done.stdout.splitlines()[0].endswith("| burst")

    for job_id in ids:
        archived = state.archived(job_id)
        assert archived is not None, f"{job_id} not archived:\n{done.stderr[-3000:]}"
        assert (archived.attempt_count, archived.worker_id) == (1, worker_id)
    assert executions() == {job_id: [1] for job_id in ids}
    dead = state.dead(fatal)
    assert (dead.failure_reason, dead.attempt_count) == (FailureReason.FATAL_ERROR, 1)
    assert state.hot(later).status == JobStatus.PENDING
    assert JobsHot.objects.count() == 1
    registry = state.registry(worker_id)
    assert registry is not None and registry.is_running is False


def test_burst_with_two_processes_drains_and_exits_zero(executions: Any, state: Any) -> None:
    # A tiny prefetch buffer so that one process cannot claim every job before the other starts.
    ids = enqueue_many([EnqueueOptions("test.record.v1", {"sleep": 0.2}) for _ in range(24)])
    done = _burst("--processes", "2", "--concurrency", "2",
                  WORKER={"PREFETCH_CAPACITY": 2, "FETCH_BATCH_SIZE": 2})
    assert done.returncode == 0, done.stdout + done.stderr

    banners = BANNER.findall(done.stdout)
    worker_ids = {b[0] for b in banners}
    assert len(banners) == 2 and len(worker_ids) == 2, done.stdout
    assert JobsHot.objects.count() == 0
    assert JobsArchive.objects.count() == len(ids)
    assert set(JobsArchive.objects.values_list("attempt_count", flat=True)) == {1}
    by_worker = Counter(JobsArchive.objects.values_list("worker_id", flat=True))
    assert set(by_worker) == worker_ids, by_worker  # both processes did work
    assert executions() == {job_id: [1] for job_id in ids}
    for worker_id in worker_ids:
        assert state.registry(worker_id).is_running is False


def test_sigterm_stops_a_running_worker_gracefully(executions: Any, state: Any, tmp_path: Path) -> None:
    worker_id = f"sigterm-{secrets.token_hex(3)}"
    out, err = tmp_path / "worker.out", tmp_path / "worker.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "chokaq_worker", "--worker-id", worker_id], cwd=ROOT, env=_env(),
            stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
        )

    def output() -> str:
        return f"rc={proc.poll()}\n{out.read_text(errors='replace')}\n{err.read_text(errors='replace')[-4000:]}"

    try:
        state.wait(lambda: BANNER.search(out.read_text()) or proc.poll() is not None, "the banner", timeout=30)
        assert proc.poll() is None, output()
        assert BANNER.search(out.read_text()).group(1) == worker_id
        assert state.wait(lambda: state.registry(worker_id), "the registry row").is_running

        running = enqueue("test.sleep.v1", {"seconds": 60})
        done = enqueue("test.record.v1", {})
        state.wait_status(running, JobStatus.PROCESSING, worker_id=worker_id, timeout=20)
        state.wait_archived(done, timeout=20)

        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, output()
        assert time.monotonic() - started < 8, "shutdown waited for the grace period instead of interrupting"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    registry = state.registry(worker_id)
    assert registry.is_running is False and registry.stopped_at is not None
    row = state.hot(running)
    assert (row.status, row.attempt_count, row.worker_id) == (JobStatus.PENDING, 1, None), output()
    assert state.counters() == (1, 0, 1)
    assert executions() == {done: [1]}
