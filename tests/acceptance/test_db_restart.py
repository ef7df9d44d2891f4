"""Acceptance: PostgreSQL restarted in the middle of a run.

The test starts its own throw-away cluster (``initdb`` + ``pg_ctl`` in a temporary directory, on a
free port, trust auth; as the ``postgres`` user when run as root), migrates a database there, and
starts two ``chokaq_worker`` processes, a daphne web process and an enqueuer (``tests.acceptance.
enqueuer``) that keeps enqueuing through the outage. Mid-run the server is stopped
(``pg_ctl stop -m fast``), left down for a few seconds and started again.

Then: no worker or web process crashed; every job enqueued ends archived exactly once, none lost;
``GET /deck/health/`` answered 503 during the outage and 200 after the recovery.
Knobs: CHOKAQ_RESTART_JOBS (1,500), CHOKAQ_RESTART_OUTAGE (seconds down, 5), CHOKAQ_RESTART_CYCLES (1).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from tests.acceptance.procs import (
    Proc,
    env_float,
    env_int,
    free_port,
    reap,
    spawn,
    spawn_worker,
    stop_gracefully,
    wait_banners,
    wait_for,
    write_result,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.postgresql, pytest.mark.slow]

PG_BIN = Path(os.environ.get("CHOKAQ_PG_BIN", "/usr/lib/postgresql/15/bin"))
JOBS = env_int("CHOKAQ_RESTART_JOBS", 1_500)
OUTAGE = env_float("CHOKAQ_RESTART_OUTAGE", 5.0)
CYCLES = env_int("CHOKAQ_RESTART_CYCLES", 1)
BATCH, INTERVAL = 10, 0.05
OVERRIDES = {
    # Processing rows must outlive the outage (their heartbeats stop meanwhile); Fetched rows whose
    # lease gate failed during it come back to Pending after FETCHED_JOB_TIMEOUT.
    "RECOVERY": {"PROCESSING_ZOMBIE_TIMEOUT": 60, "FETCHED_JOB_TIMEOUT": 8, "SCAN_INTERVAL": 2},
    "EXECUTION": {"HEARTBEAT_INTERVAL_MIN": 0.5, "HEARTBEAT_INTERVAL_MAX": 1, "CANCEL_POLL_INTERVAL": 0.5},
    # A handler whose own write hits the outage fails transiently and is retried.
    "RETRY": {"MAX_ATTEMPTS": 20, "BASE_DELAY": 0.2, "MAX_DELAY": 2, "JITTER_MAX_DELAY": 0.1},
    "WORKER": {"CONCURRENCY": 4, "MAX_CONCURRENCY": 4, "SHUTDOWN_GRACE_PERIOD": 10, "REGISTRY_HEARTBEAT_INTERVAL": 1},
    "CIRCUIT_BREAKER": {"DEFAULT": {"FAILURE_THRESHOLD": 1_000_000_000}},
    # Only the database decides the health answer here, not a lag built up during the outage.
    "HEALTH": {"WORKER_HEARTBEAT_TIMEOUT": 60, "QUEUE_LAG_DEGRADED_THRESHOLD": 1_000_000,
               "QUEUE_LAG_UNHEALTHY_THRESHOLD": 1_000_000},
}


@dataclass
class Cluster:
    root: Path
    port: int

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, db: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{db}"

    def ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.data), *args], check=check)

    def start(self) -> None:
        self.ctl("-l", str(self.root / "server.log"), "-w", "-t", "60", "-o",
                 f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=60", "start")

    def stop(self) -> None:
        self.ctl("-w", "-m", "fast", "stop")

    def log(self) -> str:
        try:
            return (self.root / "server.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""


def _as_postgres(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    if os.getuid() == 0:  # initdb and the server refuse to run as root
        argv = ["runuser", "-u", "postgres", "--", *argv]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        pytest.fail(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    for tool in ("initdb", "pg_ctl"):
        if not (PG_BIN / tool).exists():
            pytest.fail(f"{PG_BIN / tool} is missing: the restart test needs the PostgreSQL server binaries"
                        " (set CHOKAQ_PG_BIN)")
    if os.getuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail("running as root and there is no 'postgres' user to run initdb/pg_ctl as")
    root = Path(tempfile.mkdtemp(prefix="chokaq-pg-"))
    if os.getuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    cluster = Cluster(root, free_port())
    try:
        _as_postgres([str(PG_BIN / "initdb"), "-D", str(cluster.data), "-A", "trust", "-U", "postgres",
                      "-E", "UTF8", "--no-sync"])
        cluster.start()
        yield cluster
    finally:
        if (cluster.data / "postmaster.pid").exists():
            cluster.ctl("-w", "-m", "immediate", "stop", check=False)
        shutil.rmtree(root, ignore_errors=True)


def _sql(url: str, sql: str, params: list[object] | None = None) -> list[tuple[object, ...]]:
    with psycopg.connect(url.replace("postgres://", "postgresql://"), autocommit=True, connect_timeout=5) as conn:
        cur = conn.execute(sql, params or [])  # type: ignore[arg-type]
        return list(cur.fetchall()) if cur.description else []


def _health(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/deck/health/", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def _enqueued(proc: Proc) -> int:
    lines = [ln for ln in proc.stdout.read_text(errors="replace").splitlines() if ln.startswith(("enqueued", "done"))]
    return int(lines[-1].split()[1]) if lines else 0


def test_workers_and_web_survive_a_postgresql_restart(cluster: Cluster, tmp_path: Path) -> None:
    url = cluster.url("chokaq")
    _sql(cluster.url("postgres"), "CREATE DATABASE chokaq")
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "CHOKAQ_TEST_OVERRIDES": json.dumps(OVERRIDES),
        "PYTHONUNBUFFERED": "1",
    }
    migrate = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=Path(__file__).parents[2],
                             env=env, capture_output=True, text=True, timeout=180)
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    _sql(url, "CREATE TABLE test_executions (id bigserial PRIMARY KEY, job_id varchar(50) NOT NULL, attempt int)")

    procs: list[Proc] = []
    try:
        workers = [spawn_worker(f"worker{n}", env, tmp_path) for n in range(2)]
        procs += workers
        web_port = free_port()
        web = spawn("web", [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(web_port),
                            "config.asgi:application"], env, tmp_path)
        procs.append(web)
        wait_banners(workers)
        wait_for(lambda: _health(web_port) == 200, 60, "the web process to answer 200 on /deck/health/", procs)

        enqueuer = spawn("enqueuer", [sys.executable, "-m", "tests.acceptance.enqueuer", str(JOBS), str(BATCH),
                                      str(INTERVAL), "rs"], env, tmp_path)
        procs.append(enqueuer)

        outage_codes: list[int | None] = []
        recovery_seconds: list[float] = []
        for cycle in range(CYCLES):
            target = JOBS * (cycle + 1) // (CYCLES + 1)
            wait_for(lambda t=target: _enqueued(enqueuer) >= t, 120, f"{target} jobs enqueued", procs)  # type: ignore[misc]
            cluster.stop()
            down = time.monotonic()
            while time.monotonic() - down < OUTAGE:
                outage_codes.append(_health(web_port))
                time.sleep(0.5)
            assert all(p.alive() for p in [*workers, web]), "\n".join(p.output() for p in procs)
            cluster.start()
            up = time.monotonic()
            wait_for(lambda: _health(web_port) == 200, 60, "/deck/health/ to answer 200 after the restart",
                     procs)
            recovery_seconds.append(time.monotonic() - up)
        assert 503 in outage_codes, f"/deck/health/ during the outage answered {outage_codes}"
        assert set(outage_codes) <= {503}, f"/deck/health/ during the outage answered {outage_codes}"

        wait_for(lambda: enqueuer.proc.poll() is not None, 180, "the enqueuer to finish", procs)
        assert enqueuer.proc.returncode == 0, enqueuer.output()

        def drained() -> bool:
            try:
                hot = _sql(url, "SELECT count(*) FROM chokaq_jobs_hot")[0][0]
            except psycopg.Error:
                return False
            return hot == 0

        wait_for(drained, 120, "every job to leave the hot table", procs)
        dead = [p for p in [*workers, web] if not p.alive()]
        assert not dead, "a process crashed:\n" + "\n".join(p.output() for p in dead)

        enqueued = {f"rs-{n:06d}" for n in range(1, JOBS + 1)}
        archived = [str(r[0]) for r in _sql(url, "SELECT id FROM chokaq_jobs_archive")]
        dlq = _sql(url, "SELECT id, failure_reason, error_details FROM chokaq_jobs_dlq")
        hot = _sql(url, "SELECT count(*) FROM chokaq_jobs_hot")[0][0]
        assert not dlq, f"{len(dlq)} jobs in the DLQ, e.g. {dlq[:3]}"
        assert hot == 0
        assert len(archived) == len(set(archived)) == JOBS
        assert set(archived) == enqueued
        executions = dict(_sql(url, "SELECT job_id, count(*) FROM test_executions GROUP BY job_id"))
        assert set(executions) == enqueued
        done_line = enqueuer.stdout.read_text().strip().splitlines()[-1]  # "done N failures F"
        enqueue_failures = int(done_line.split()[-1])
        assert enqueue_failures >= 1, "the outage must land while jobs are being enqueued"
        reran = sum(1 for n in executions.values() if int(n) > 1)  # type: ignore[call-overload]
        assert _health(web_port) == 200

        result = {
            "jobs": JOBS, "restarts": CYCLES, "outage_s": OUTAGE, "survived": True, "lost": 0,
            "double_recorded": len(archived) - len(set(archived)), "rerun_after_transient_error": reran,
            "enqueue_calls_failed_during_outage": enqueue_failures,
            "max_recovery_to_healthy_s": round(max(recovery_seconds), 2), "health_during_outage": sorted(
                {str(c) for c in outage_codes}),
        }
        write_result("restart", result)
        print("restart:", json.dumps(result, sort_keys=True))
        stop_gracefully([*workers, web])
    finally:
        reap(procs)
