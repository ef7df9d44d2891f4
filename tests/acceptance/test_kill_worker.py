"""Acceptance: three real ``chokaq_worker`` processes, one SIGKILLed mid-run.

5,000 ``test.record.v1`` jobs (each execution writes one row into
``test_executions``) are drained by three worker processes against the
PostgreSQL test database. While the run is in full swing one worker is frozen
(SIGSTOP), the jobs it is executing are read from ``chokaq_jobs_hot``, and it
is SIGKILLed. Freezing first makes that snapshot exact: nothing the victim
sends can commit after it (a transaction it left open rolls back when its
connection dies).

The survivors finish the queue; their rescue sweep (a zombie timeout of a few
seconds, set through ``CHOKAQ_TEST_OVERRIDES``) moves the victim's Processing
jobs to the DLQ as Zombie and hands its Fetched-but-unstarted jobs back to
Pending. Then every job must be in Archive or DLQ exactly once, nothing lost,
the DLQ holding exactly the jobs the victim was running, the only double
executions being of those jobs, and the counters matching the rows.
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

import pytest
from django.db import connection

from chokaq_core import FailureReason, JobStatus, enqueue_many, storage
from chokaq_core.conf import config
from tests.acceptance.procs import wait_for
from tests.conftest import database_url

pytestmark = [pytest.mark.acceptance, pytest.mark.postgresql, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
JOBS = 5_000
WORKERS = 3
HANDLER_SLEEP = 0.01  # seconds per job, so the run lasts long enough for the kill to land mid-run
KILL_AFTER_ARCHIVED = 1_000  # freeze + kill the victim once this many jobs are archived
OVERRIDES = {
    "RECOVERY": {"PROCESSING_ZOMBIE_TIMEOUT": 3, "FETCHED_JOB_TIMEOUT": 3, "SCAN_INTERVAL": 1},
    "EXECUTION": {"HEARTBEAT_INTERVAL_MIN": 0.5, "HEARTBEAT_INTERVAL_MAX": 1, "CANCEL_POLL_INTERVAL": 0.5},
    "RETRY": {"BASE_DELAY": 0.1, "MAX_DELAY": 1, "JITTER_MAX_DELAY": 0.1},
    # MAX_CONCURRENCY = CONCURRENCY: the executor pool is sized by MAX_CONCURRENCY and every pool thread keeps
    # its own connection, so the default (100) lets three workers exhaust PostgreSQL's max_connections (100).
    "WORKER": {"CONCURRENCY": 8, "MAX_CONCURRENCY": 8, "SHUTDOWN_GRACE_PERIOD": 10, "REGISTRY_HEARTBEAT_INTERVAL": 1},
}
BANNER = re.compile(r"ChokaQ worker (\S+) \|")
START_TIMEOUT = 30.0
RUN_TIMEOUT = 90.0
STOP_TIMEOUT = 20.0


@dataclass
class WorkerProcess:
    proc: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    worker_id: str = ""

    def output(self) -> str:
        text = [f"--- worker {self.worker_id or '?'} pid {self.proc.pid} rc {self.proc.poll()}"]
        for path in (self.stdout, self.stderr):
            try:
                text.append(path.read_text(errors="replace")[-4000:])
            except OSError:
                pass
        return "\n".join(text)


def _query(sql: str, params: list[object] | None = None) -> list[tuple[object, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return list(cursor.fetchall())


def _count(table: str) -> int:
    return int(_query(f"SELECT count(*) FROM {table}")[0][0])  # type: ignore[call-overload]


@pytest.fixture
def workers(executions_table: None, tmp_path: Path) -> Iterator[list[WorkerProcess]]:
    """Three ``manage.py chokaq_worker`` processes on the test database; always reaped afterwards."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "CHOKAQ_TEST_OVERRIDES": json.dumps(OVERRIDES),
        "PYTHONUNBUFFERED": "1",
    }
    started: list[WorkerProcess] = []
    try:
        for n in range(WORKERS):
            out, err = tmp_path / f"worker{n}.out", tmp_path / f"worker{n}.err"
            with out.open("wb") as stdout, err.open("wb") as stderr:
                proc = subprocess.Popen(
                    [sys.executable, "manage.py", "chokaq_worker"], cwd=ROOT, env=env, stdout=stdout, stderr=stderr,
                    stdin=subprocess.DEVNULL,
                )
            started.append(WorkerProcess(proc, out, err))
        deadline = time.monotonic() + START_TIMEOUT
        for worker in started:
            while not worker.worker_id:
                match = BANNER.search(worker.stdout.read_text(errors="replace"))
                if match:
                    worker.worker_id = match.group(1)
                    break
                if worker.proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("a worker did not print its banner:\n" + worker.output())
                time.sleep(0.05)
        yield started
    finally:
        for worker in started:
            if worker.proc.poll() is None:
                worker.proc.kill()
        for worker in started:
            try:
                worker.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def _freeze_and_snapshot(victim: WorkerProcess) -> set[str]:
    """SIGSTOP the victim, let the server finish what it already received, read its Processing jobs.

    Retries until the victim is caught with at least one job running: between two tries it runs until it holds a
    Processing row again (at most 2 s), so a loaded machine that caught it between jobs does not starve it into
    giving its rows up to the survivors' sweep (it only ran 50 ms between tries, far too short to beat them).
    """
    for _ in range(50):
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and not _processing(victim):
            time.sleep(0.02)
        os.kill(victim.proc.pid, signal.SIGSTOP)
        time.sleep(1.0)
        running = _processing(victim)
        if running:
            return running
        os.kill(victim.proc.pid, signal.SIGCONT)
    rows = _query("SELECT worker_id, status, count(*) FROM chokaq_jobs_hot GROUP BY worker_id, status")
    pytest.fail(f"never caught the victim with a job in Processing (Hot rows by worker and status: {rows}):\n"
                + victim.output())


def _processing(victim: WorkerProcess) -> set[str]:
    """The victim's Processing rows."""
    return {str(row[0]) for row in _query("SELECT id FROM chokaq_jobs_hot WHERE worker_id = %s AND status = %s",
                                          [victim.worker_id, int(JobStatus.PROCESSING)])}


def test_sigkill_one_of_three_workers_loses_nothing(workers: list[WorkerProcess]) -> None:
    assert config().DATABASE == "default"
    assert _count("chokaq_jobs_hot") == _count("chokaq_jobs_archive") == _count("chokaq_jobs_dlq") == 0

    ids = enqueue_many(
        {"type_key": "test.record.v1", "payload": {"sleep": HANDLER_SLEEP}} for _ in range(JOBS)
    )
    enqueued = set(ids)
    assert len(enqueued) == JOBS

    victim, survivors = workers[0], workers[1:]
    wait_for(lambda: _count("chokaq_jobs_archive") >= KILL_AFTER_ARCHIVED, RUN_TIMEOUT,
          f"{KILL_AFTER_ARCHIVED} archived jobs", workers)
    running_at_kill = _freeze_and_snapshot(victim)
    os.kill(victim.proc.pid, signal.SIGKILL)
    victim.proc.wait(timeout=10)
    archived_at_kill = _count("chokaq_jobs_archive")
    assert archived_at_kill < JOBS, "the kill must land mid-run"

    wait_for(lambda: _count("chokaq_jobs_hot") == 0, RUN_TIMEOUT, "the hot table to empty", workers)

    archived = [str(r[0]) for r in _query("SELECT id FROM chokaq_jobs_archive")]
    dead = _query("SELECT id, failure_reason, worker_id FROM chokaq_jobs_dlq")
    dead_ids = [str(r[0]) for r in dead]

    # Every job is in Archive or the DLQ exactly once; none is lost, none is invented.
    assert len(archived) == len(set(archived))
    assert len(dead_ids) == len(set(dead_ids))
    assert not set(archived) & set(dead_ids)
    assert set(archived) | set(dead_ids) == enqueued
    assert len(archived) + len(dead_ids) == JOBS

    # The DLQ holds exactly the victim's running jobs, as Zombies; nothing else failed.
    assert {r[1] for r in dead} <= {int(FailureReason.ZOMBIE)}
    assert {r[2] for r in dead} <= {victim.worker_id}
    assert set(dead_ids) == running_at_kill

    # Only jobs that were running at the kill may have run twice; every archived job really ran.
    executions = dict(_query("SELECT job_id, count(*) FROM test_executions GROUP BY job_id"))
    twice = {str(job_id) for job_id, n in executions.items() if int(n) > 1}  # type: ignore[call-overload]
    assert twice <= running_at_kill
    assert set(archived) <= set(executions)
    assert set(executions) <= enqueued

    # The retained counters match the rows.
    stats = storage.summary_stats()
    assert (stats.pending, stats.fetched, stats.processing) == (0, 0, 0)
    assert stats.succeeded_total == len(archived)
    assert stats.failed_total == len(dead_ids)

    print(f"killed {victim.worker_id} with {len(running_at_kill)} jobs running and {archived_at_kill} archived;"
          f" archived {len(archived)}, zombies {len(dead_ids)}, executed twice {len(twice)}")

    # The survivors shut down gracefully on SIGTERM.
    for worker in survivors:
        worker.proc.send_signal(signal.SIGTERM)
    for worker in survivors:
        try:
            code = worker.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail("a survivor did not stop on SIGTERM:\n" + worker.output())
        assert code == 0, worker.output()
    stopped = dict(_query("SELECT worker_id, is_running FROM chokaq_workers"))
    assert all(stopped[w.worker_id] is False for w in survivors), stopped
