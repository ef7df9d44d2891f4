"""Acceptance: chaos under load — four ``chokaq_worker`` processes, a random one SIGKILLed
every few seconds and replaced, ten times, while they drain a mixed queue.

Job types (``tests/jobs.py``, each execution writes one row into ``test_executions`` first): fast,
slow (50–200 ms), transient (fails with a retried error until attempt 2 or 3), fatal (DLQ at once) and
throttled (small ``retry_after`` until attempt 2). Each kill freezes the victim first (SIGSTOP), lets
the server finish what it already received, SIGKILLs it (its open transaction rolls back with its connection),
waits until the server has ended its sessions and then reads the victim's Processing rows — the only jobs whose
handler can be cut off.

At the end every job is in Archive or the DLQ exactly once and none is lost; the DLQ holds the fatal
jobs plus Zombies of the frozen snapshots only; more executions than a job needs only happen to jobs
running at a kill, each of which is visible (Zombie in the DLQ, or archived); the retained counters
equal the rows; each Zombie reached the DLQ within PROCESSING_ZOMBIE_TIMEOUT + SCAN_INTERVAL + slack
of its kill.

Knobs (``bench/reliability_report.py`` runs the long version): CHOKAQ_CHAOS_JOBS (20,000),
CHOKAQ_CHAOS_KILLS (10), CHOKAQ_CHAOS_KILL_INTERVAL (seconds between kills, 2.5). Before each kill the queue is
topped up with more of the mix to twice what the fleet finished since the previous kill (at least
TOP_UP_FLOOR Hot rows), so every kill lands under load however fast the fleet drains.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path

import pytest
from django.db import connection

from chokaq_core import FailureReason, JobStatus, enqueue_many, storage
from tests.acceptance.procs import (
    Proc,
    env_float,
    env_int,
    reap,
    spawn_worker,
    stop_gracefully,
    wait_banners,
    wait_for,
    write_result,
)
from tests.conftest import database_url

pytestmark = [pytest.mark.acceptance, pytest.mark.postgresql, pytest.mark.slow]

JOBS = env_int("CHOKAQ_CHAOS_JOBS", 20_000)
KILLS = env_int("CHOKAQ_CHAOS_KILLS", 10)
KILL_INTERVAL = env_float("CHOKAQ_CHAOS_KILL_INTERVAL", 2.5)
WORKERS = 4
ZOMBIE_TIMEOUT = 4.0
SCAN_INTERVAL = 1.0
DETECTION_SLACK = 3.0  # a loaded 2-core machine: sweep transaction time, scheduling delays
FREEZE = 1.0  # seconds between SIGSTOP and SIGKILL: the server finishes what it received
OVERRIDES = {
    "RECOVERY": {"PROCESSING_ZOMBIE_TIMEOUT": ZOMBIE_TIMEOUT, "FETCHED_JOB_TIMEOUT": 3, "SCAN_INTERVAL": SCAN_INTERVAL},
    "EXECUTION": {"HEARTBEAT_INTERVAL_MIN": 0.5, "HEARTBEAT_INTERVAL_MAX": 1, "CANCEL_POLL_INTERVAL": 0.5},
    "RETRY": {"MAX_ATTEMPTS": 3, "BASE_DELAY": 0.1, "MAX_DELAY": 1, "JITTER_MAX_DELAY": 0.1},
    # Pool threads keep a connection each: 4 × 5 handlers stays well inside max_connections (100),
    # which other test runs share.
    "WORKER": {"CONCURRENCY": 5, "MAX_CONCURRENCY": 5, "SHUTDOWN_GRACE_PERIOD": 10, "REGISTRY_HEARTBEAT_INTERVAL": 1},
    # Failing and throttled types must keep running: no circuit opens during the test.
    "CIRCUIT_BREAKER": {"DEFAULT": {"FAILURE_THRESHOLD": 1_000_000_000}},
}
RUN_TIMEOUT = max(200.0, JOBS / 50)  # seconds for the drain after the last kill
# Kills must land under load however fast the fleet drains: the Hot rows kept before each kill, at the least.
TOP_UP_FLOOR = 4_000


@dataclass
class Kill:
    worker_id: str
    running: set[str]
    at: datetime  # database clock, just after the SIGKILL
    archived: int


def _query(sql: str, params: list[object] | None = None) -> list[tuple[object, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return list(cursor.fetchall())


def _count(table: str) -> int:
    return int(_query(f"SELECT count(*) FROM {table}")[0][0])  # type: ignore[call-overload]


def _mix(n: int, seed: int) -> list[dict[str, object]]:
    """The job mix: 60 % fast, 10 % slow, 15 % transient, 5 % fatal, 10 % throttled."""
    rng = random.Random(seed)
    items: list[dict[str, object]] = []
    for _ in range(n):
        r = rng.random()
        if r < 0.60:
            items.append({"type_key": "test.chaos.fast.v1", "payload": {}})
        elif r < 0.70:
            items.append({"type_key": "test.chaos.slow.v1", "payload": {"ms": rng.randint(50, 200)}})
        elif r < 0.85:
            items.append({"type_key": "test.chaos.transient.v1", "payload": {"succeed_on": rng.choice([2, 3])}})
        elif r < 0.90:
            items.append({"type_key": "test.chaos.fatal.v1", "payload": {}})
        else:
            items.append({"type_key": "test.chaos.throttled.v1",
                          "payload": {"retry_after": round(rng.uniform(0.05, 0.3), 3), "succeed_on": 2}})
    return items


def _needed(item: dict[str, object]) -> int:
    """Executions the job needs to finish when nothing interferes."""
    payload = item["payload"]
    assert isinstance(payload, dict)
    return int(payload.get("succeed_on", 1))


@pytest.fixture
def fleet(executions_table: None, tmp_path: Path) -> Iterator[tuple[list[Proc], dict[str, str]]]:
    """(every worker process started, env); all are SIGKILLed and reaped afterwards."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "CHOKAQ_TEST_OVERRIDES": json.dumps(OVERRIDES),
        "PYTHONUNBUFFERED": "1",
    }
    started: list[Proc] = []
    try:
        yield started, env
    finally:
        reap(started)


def _client_ports(pid: int) -> set[int]:
    """The local TCP ports of a process's sockets (its database connections among them, as the server's
    client_port)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _connected(worker: Proc) -> bool:
    """The worker has printed its banner and holds a session of the test database (a replacement prints its banner
    before its first connection: frozen then, it would leave nothing on the server to wait for or to check)."""
    if not worker.banner_id():
        return False
    sessions = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND client_port = ANY(%s)"
    return bool(_query(sessions, [sorted(_client_ports(worker.proc.pid))])[0][0])


def _freeze_and_kill(victim: Proc) -> Kill:
    """SIGSTOP, SIGKILL, wait until the server has ended the victim's sessions, then read its Processing rows.

    A statement the victim sent just before the freeze may still be running on a loaded server (a claim that leases
    and commits itself): only once every session of the victim has ended can no row change hands to it, so the
    snapshot is read then — the victim's Processing rows, plus any the zombie sweep moved to the DLQ since the freeze.
    """
    os.kill(victim.proc.pid, signal.SIGSTOP)
    stopped = _query("SELECT clock_timestamp()")[0][0]
    time.sleep(FREEZE)
    ports = _client_ports(victim.proc.pid)
    assert ports, f"{victim.name} holds no TCP connection to the database"
    os.kill(victim.proc.pid, signal.SIGKILL)
    victim.proc.wait(timeout=10)
    at = _query("SELECT clock_timestamp()")[0][0]
    assert isinstance(at, datetime)
    deadline = time.monotonic() + 30
    sessions = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND client_port = ANY(%s)"
    while _query(sessions, [sorted(ports)])[0][0]:
        assert time.monotonic() < deadline, f"the server kept a session of the killed {victim.name} for 30 s"
        time.sleep(0.01)
    running = {
        str(r[0]) for r in _query("SELECT id FROM chokaq_jobs_hot WHERE worker_id = %s AND status = %s",
                                  [victim.worker_id, int(JobStatus.PROCESSING)])
    } | {
        str(r[0]) for r in _query("SELECT id FROM chokaq_jobs_dlq WHERE worker_id = %s AND failure_reason = %s"
                                  " AND failed_at >= %s", [victim.worker_id, int(FailureReason.ZOMBIE), stopped])
    }
    return Kill(victim.worker_id, running, at, _count("chokaq_jobs_archive"))


def test_chaos_random_sigkills_under_load_lose_nothing(fleet: tuple[list[Proc], dict[str, str]],
                                                       tmp_path: Path) -> None:
    procs, env = fleet
    assert _count("chokaq_jobs_hot") == _count("chokaq_jobs_archive") == _count("chokaq_jobs_dlq") == 0
    began = time.monotonic()
    seed = env_int("CHOKAQ_CHAOS_SEED", random.randrange(1 << 30))
    rng = random.Random(seed)

    items = _mix(JOBS, seed)
    ids: list[str] = []
    for start in range(0, JOBS, 2_000):
        ids += enqueue_many(items[start:start + 2_000])
    assert len(set(ids)) == JOBS
    spec = dict(zip(ids, items, strict=True))
    enqueued = set(ids)

    serial = 0

    def start_worker() -> Proc:
        nonlocal serial
        serial += 1
        worker = spawn_worker(f"worker{serial}", env, tmp_path)
        procs.append(worker)
        return worker

    live = [start_worker() for _ in range(WORKERS)]
    wait_banners(live)

    kills: list[Kill] = []
    finished_before = 0
    while len(kills) < KILLS:
        time.sleep(KILL_INTERVAL)
        hot = _count("chokaq_jobs_hot")
        finished = len(ids) - hot
        want = max(TOP_UP_FLOOR, 2 * (finished - finished_before))
        finished_before = finished
        if hot < want:  # the same mix, seeded by the run's seed and how many jobs came before
            more = _mix(want - hot, seed + len(ids))
            for start in range(0, len(more), 2_000):
                added = enqueue_many(more[start:start + 2_000])
                ids += added
                spec.update(zip(added, more[start:start + 2_000], strict=True))
                enqueued.update(added)
            time.sleep(0.2)  # the fleet picks the new jobs up before the victim is frozen
        dead = [w for w in live if not w.alive()]
        assert not dead, "a worker died without being killed:\n" + "\n".join(w.output() for w in dead)
        victim = rng.choice(live)
        wait_for(partial(_connected, victim), 60, f"{victim.name} to connect to the database", [victim])
        kills.append(_freeze_and_kill(victim))
        live.remove(victim)
        live.append(start_worker())
    kills_done = time.monotonic()

    wait_for(lambda: _count("chokaq_jobs_hot") == 0, RUN_TIMEOUT, "the hot table to empty", live)
    drained = time.monotonic()
    dead = [w for w in live if not w.alive()]
    assert not dead, "a worker died without being killed:\n" + "\n".join(w.output() for w in dead)

    archived = [str(r[0]) for r in _query("SELECT id FROM chokaq_jobs_archive")]
    archived_attempts = dict(_query("SELECT id, attempt_count FROM chokaq_jobs_archive"))
    dlq = _query("SELECT id, failure_reason, worker_id, attempt_count, failed_at FROM chokaq_jobs_dlq")
    dead_ids = [str(r[0]) for r in dlq]
    reasons = {str(r[0]): int(r[1]) for r in dlq}  # type: ignore[call-overload]

    # Every job is in Archive or the DLQ exactly once; none is lost, none is invented.
    double_recorded = (len(archived) - len(set(archived)) + len(dead_ids) - len(set(dead_ids))
                       + len(set(archived) & set(dead_ids)))
    lost = enqueued - set(archived) - set(dead_ids)
    assert double_recorded == 0
    assert not lost, f"{len(lost)} jobs lost, e.g. {sorted(lost)[:5]}"
    assert set(archived) | set(dead_ids) == enqueued

    running_at_kills = set().union(*(k.running for k in kills))
    zombies = {i for i, reason in reasons.items() if reason == int(FailureReason.ZOMBIE)}
    fatal_jobs = {i for i, item in spec.items() if item["type_key"] == "test.chaos.fatal.v1"}

    # The DLQ: fatal jobs (FatalError) and Zombies of the frozen snapshots, nothing else.
    others = {i: r for i, r in reasons.items() if r != int(FailureReason.ZOMBIE)
              and not (i in fatal_jobs and r == int(FailureReason.FATAL_ERROR))}
    assert not others, f"unexpected DLQ entries: {dict(list(others.items())[:10])}"
    owners = {str(r[0]): str(r[2]) for r in dlq}
    killed = {k.worker_id for k in kills}
    unexplained = {i: (owners[i], "killed" if owners[i] in killed else "not killed")
                   for i in sorted(zombies - running_at_kills)[:10]}
    assert zombies <= running_at_kills, f"Zombies of jobs not running at a kill (job: worker): {unexplained}"
    assert fatal_jobs - zombies <= set(dead_ids)
    # Each job running at a kill is visible: a Zombie in the DLQ (or, had it completed, archived).
    invisible = running_at_kills - zombies - set(archived)
    assert not invisible, f"jobs running at a kill that are neither Zombie nor archived: {sorted(invisible)[:10]}"

    # Executions: every archived job ran as often as it needs; more runs only for jobs running at a kill.
    executions: Counter[str] = Counter()
    for job_id, n in _query("SELECT job_id, count(*) FROM test_executions GROUP BY job_id"):
        executions[str(job_id)] = int(n)  # type: ignore[call-overload]
    assert set(executions) <= enqueued
    short = [i for i in archived if executions[i] < _needed(spec[i])]
    assert not short, f"archived jobs that did not run enough: {short[:10]}"
    dlq_attempts = {str(r[0]): int(r[3]) for r in dlq}  # type: ignore[call-overload]
    expected = {i: (dlq_attempts[i] if i in zombies else _needed(spec[i])) for i in enqueued}
    double_executed = {i for i in enqueued if executions[i] > expected[i]}
    assert double_executed <= running_at_kills, f"extra executions of jobs not running at a kill: {sorted(double_executed - running_at_kills)[:10]}"

    # The retained counters equal the rows.
    stats = storage.summary_stats()
    assert (stats.pending, stats.fetched, stats.processing) == (0, 0, 0)
    assert stats.succeeded_total == len(archived)
    assert stats.failed_total == len(dead_ids)
    retries = sum(int(a) - 1 for a in archived_attempts.values()) + sum(a - 1 for a in dlq_attempts.values())  # type: ignore[call-overload]
    assert stats.retried_total == retries

    # Zombie detection: from the kill to the DLQ row, within the timeout plus one sweep (plus slack). The property
    # is about time (how soon a dead worker's jobs are declared zombies), so a bound with generous slack stays.
    failed_at = {str(r[0]): r[4] for r in dlq}
    detections = [
        (failed_at[i] - k.at).total_seconds() for k in kills for i in k.running if i in zombies  # type: ignore[operator]
    ]
    max_detection = max(detections, default=0.0)
    bound = ZOMBIE_TIMEOUT + SCAN_INTERVAL + DETECTION_SLACK
    assert max_detection <= bound, f"zombie detection took {max_detection:.2f} s (bound {bound:.1f} s)"

    result = {
        "jobs": len(enqueued), "workers": WORKERS, "kills": len(kills), "seed": seed,
        "kills_mid_run": sum(1 for k in kills if k.archived < len(enqueued)),
        "running_at_kills": len(running_at_kills), "archived": len(archived), "dlq": len(dead_ids),
        "zombies": len(zombies), "fatal": len(fatal_jobs), "lost": len(lost), "double_recorded": double_recorded,
        "double_executed": len(double_executed), "max_zombie_detection_s": round(max_detection, 3),
        "zombie_timeout_s": ZOMBIE_TIMEOUT, "scan_interval_s": SCAN_INTERVAL,
        "kills_seconds": round(kills_done - began, 1), "drain_seconds": round(drained - began, 1),
    }
    write_result("chaos", result)
    print("chaos:", json.dumps(result, sort_keys=True))

    # The survivors and the replacements shut down gracefully.
    stop_gracefully(live)
