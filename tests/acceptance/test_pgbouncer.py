"""Acceptance: the enqueuer and two workers through PgBouncer in transaction pooling.

The test starts its own ``pgbouncer`` (Debian's 1.18: no prepared statements across transactions, no
session state) on a free port in a temporary directory, ``pool_mode = transaction``, ``auth_type = any``,
forwarding to the test database on 127.0.0.1:5432 with fewer server connections than clients, so server
connections really are shared between clients from one transaction to the next. The enqueuer
(``tests.acceptance.enqueuer``) and two ``chokaq_worker`` processes connect only through it.

Behind a transaction pooler LISTEN wake-ups may be lost (the workers then poll), never jobs: every one of
the 10,000 jobs ends in Archive exactly once, ran exactly once with attempt 1, and the retained counters
equal the rows. A missing ``pgbouncer`` binary fails the test (``scripts/test`` installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import psycopg
import pytest
from django.db import connection

from chokaq_core import storage
from tests.acceptance.procs import Proc, free_port, reap, spawn, spawn_worker, stop_gracefully, wait_banners, wait_for
from tests.conftest import database_url

pytestmark = [pytest.mark.acceptance, pytest.mark.postgresql, pytest.mark.slow]

JOBS = 10_000
BATCH, INTERVAL = 100, 0.01
POOL_SIZE = 6  # server connections per (database, user): fewer than the clients' connections
OVERRIDES = {
    "WORKER": {"CONCURRENCY": 8, "MAX_CONCURRENCY": 8, "SHUTDOWN_GRACE_PERIOD": 10, "POLLING_INTERVAL": 0.5},
}


@dataclass
class Bouncer:
    root: Path
    port: int
    proc: subprocess.Popen[bytes]

    def log(self, tail: int = 4000) -> str:
        try:
            return (self.root / "pgbouncer.log").read_text(errors="replace")[-tail:]
        except OSError:
            return ""


def _binary() -> str:
    found = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if Path(p).exists()), None)
    if not found:
        pytest.fail("pgbouncer is missing: this test needs it (scripts/test installs Debian's pgbouncer;"
                    " apt-get install pgbouncer)")
    return found


@pytest.fixture
def bouncer(transactional_db: None) -> Iterator[Bouncer]:
    """A private pgbouncer in transaction pooling in front of the test database's server."""
    binary = _binary()
    server = urlparse(database_url())
    root = Path(tempfile.mkdtemp(prefix="chokaq-pgbouncer-"))
    port = free_port()
    (root / "pgbouncer.ini").write_text(f"""
[databases]
* = host={server.hostname or '127.0.0.1'} port={server.port or 5432} user={server.username or 'postgres'}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = {POOL_SIZE}
max_client_conn = 500
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
logfile = {root / 'pgbouncer.log'}
pidfile = {root / 'pgbouncer.pid'}
""")
    argv = [binary, str(root / "pgbouncer.ini")]
    if os.getuid() == 0:  # pgbouncer refuses to run as root
        shutil.chown(root, "postgres", "postgres")
        argv = ["runuser", "-u", "postgres", "--", *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=(root / "stderr.log").open("wb"),
                            stdin=subprocess.DEVNULL)
    bouncer = Bouncer(root, port, proc)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/{server.path.lstrip('/')}",
                                connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"pgbouncer did not start (rc {proc.poll()}):\n{bouncer.log()}\n"
                                f"{(root / 'stderr.log').read_text(errors='replace')}")
                time.sleep(0.1)
        yield bouncer
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(root, ignore_errors=True)


def _query(sql: str) -> list[tuple[object, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return list(cursor.fetchall())


def _count(table: str) -> int:
    return int(_query(f"SELECT count(*) FROM {table}")[0][0])  # type: ignore[call-overload]


def test_enqueuer_and_two_workers_through_transaction_pooling_lose_and_double_nothing(
        bouncer: Bouncer, executions_table: None, tmp_path: Path) -> None:
    direct = urlparse(database_url())
    env = {
        **os.environ,
        "DATABASE_URL": direct._replace(netloc=f"{direct.username or 'postgres'}@127.0.0.1:{bouncer.port}").geturl(),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "CHOKAQ_TEST_OVERRIDES": json.dumps(OVERRIDES),
        "PYTHONUNBUFFERED": "1",
        "CONN_MAX_AGE": "600",
    }
    procs: list[Proc] = []
    try:
        workers = [spawn_worker(f"worker{n}", env, tmp_path) for n in range(2)]
        procs += workers
        wait_banners(workers)
        enqueuer = spawn("enqueuer", [sys.executable, "-m", "tests.acceptance.enqueuer", str(JOBS), str(BATCH),
                                      str(INTERVAL), "pb"], env, tmp_path)
        procs.append(enqueuer)

        def output() -> list[Proc]:
            return procs

        wait_for(lambda: enqueuer.proc.poll() is not None, 240, "the enqueuer to finish", output())
        assert enqueuer.proc.returncode == 0, enqueuer.output() + "\n" + bouncer.log()
        wait_for(lambda: _count("chokaq_jobs_hot") == 0, 240, "every job to leave the hot table", output())
        dead = [p for p in workers if not p.alive()]
        assert not dead, "a worker crashed:\n" + "\n".join(p.output() for p in dead) + "\n" + bouncer.log()

        enqueued = {f"pb-{n:06d}" for n in range(1, JOBS + 1)}
        archived = _query("SELECT id, attempt_count FROM chokaq_jobs_archive")
        archived_ids = [str(row[0]) for row in archived]
        dlq = _query("SELECT id, failure_reason, error_details FROM chokaq_jobs_dlq")
        assert not dlq, f"{len(dlq)} jobs in the DLQ, e.g. {dlq[:3]}"
        assert len(archived_ids) == JOBS, f"{len(archived_ids)} archived of {JOBS}"
        assert len(set(archived_ids)) == JOBS, "a job was archived twice"
        assert set(archived_ids) == enqueued

        # Each job ran once, at attempt 1, and its archived attempt count says so.
        executions = _query("SELECT job_id, count(*), min(attempt), max(attempt) FROM test_executions GROUP BY job_id")
        assert {str(row[0]) for row in executions} == enqueued
        reran = [row for row in executions if row[1] != 1 or row[2] != 1 or row[3] != 1]
        assert not reran, f"{len(reran)} jobs ran more than once or at a later attempt, e.g. {reran[:3]}"
        assert {int(row[1]) for row in archived} == {1}  # type: ignore[call-overload]

        # The retained counters equal the rows.
        stats = storage.summary_stats()
        assert (stats.pending, stats.fetched, stats.processing) == (0, 0, 0)
        assert stats.succeeded_total == JOBS
        assert stats.failed_total == 0
        stop_gracefully(workers)
        errors = [line for w in workers for line in w.stderr.read_text(errors="replace").splitlines()
                  if "prepared statement" in line or "Traceback" in line]
        assert not errors, "workers logged errors behind PgBouncer:\n" + "\n".join(errors[:20])
        # No LISTEN was left on a pooled server session (its notifications would reach an idle server connection).
        stray = [line for line in bouncer.log(tail=10**9).splitlines() if "when not linked" in line]
        assert not stray, "a pooled server session received notifications:\n" + "\n".join(stray[:5])
    finally:
        reap(procs)
