#!/usr/bin/env python
"""Websocket load: many Deck tabs on a real daphne process while workers drain a steady stream of jobs.

    python bench/ws_load.py [--clients 50] [--rate 2000] [--seconds 20] [--workers 2]
                            [--pg-url postgres://postgres@127.0.0.1:5432/chokaq_ws_load]
                            [--redis-url redis://127.0.0.1:6379/13]

The scenario (shared with ``tests/acceptance/test_ws_load.py``, which calls :func:`run_load`):

* One ``daphne`` process serves ``tests.ws_load_asgi:application`` — ``config.asgi.application`` plus a log
  of every SQL statement the web process runs (``CHOKAQ_WS_QUERY_LOG``) — with ``REDIS_URL`` set, so its
  one broadcaster joins ``chokaq.deck`` for all tabs.
* ``--clients`` websocket clients (the ``websockets`` library) connect to ``/ws/deck/`` with a logged-in
  session cookie and an ``Origin`` the ``AllowedHostsOriginValidator`` accepts, exactly as a browser tab does.
* ``--workers`` ``chokaq_worker`` processes drain the queue ``wsload`` while a producer thread here enqueues
  ``--rate`` no-op jobs/s (an ``enqueue_many`` batch every 20 ms carrying what the rate owes by then, at most
  five batches' worth; the achieved rate is what is reported).
* Commit → client, per client and job: the time from the job's enqueue commit to the first frame that
  carries its row (``<tr id="job-…">``) or, when no row of it reached the client (at this rate most jobs
  start and finish between two reads, and only the newest 100 Hot rows are shown), to the first stats-bar
  frame received after the commit (the stats are read once per frame, so that frame's counters are at most
  one read older than the commit). Jobs are sampled (at most ``MAX_SAMPLED_JOBS`` per client).
* Web queries/s: the statements in the query log during the steady part of the run (from 3 s after the
  producer starts, i.e. after the 50 connections' session/user/role look-ups, to the producer's stop).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.deck_bench import ensure_database  # noqa: E402  (the same database set-up as the Deck bench)

DEFAULT_PG_URL = "postgres://postgres@127.0.0.1:5432/chokaq_ws_load"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/13"
QUEUE = "wsload"
JOB_TYPE = "test.ok.v1"  # a no-op handler of tests/jobs.py (tests.settings loads it)
BATCH_INTERVAL = 0.02
WARM_UP = 3.0  # seconds after the producer starts before the steady window (query count) begins
MAX_SAMPLED_JOBS = 4000
CONNECT_STAGGER = 0.1  # seconds between two tabs opening
CONNECT_ATTEMPTS = 3
ROW_RE = re.compile(r'<tr id="job-([0-9A-Z]+)"')
WORKER_OVERRIDES = {"WORKER": {"CONCURRENCY": 8, "MAX_CONCURRENCY": 8, "FETCH_BATCH_SIZE": 100,
                               "PREFETCH_CAPACITY": 200}}


def log(message: str) -> None:
    print(message, flush=True)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class ClientRecord:
    frames: int = 0
    stats_frames: list[float] = field(default_factory=list)
    seen: dict[str, float] = field(default_factory=dict)  # job id → first frame carrying its row
    error: str = ""
    reconnects: int = 0  # failed opening handshakes before the one that worked
    mentions_jobs: bool = False


@dataclass
class LoadResult:
    clients: int
    target_rate: int
    seconds: float
    enqueued: int
    archived: int
    clients_record: list[ClientRecord]
    delays_ms: list[float]
    row_delays_ms: list[float]
    queries: int
    window: float
    query_kinds: Counter[str]
    frames_sent_note: str = ""

    @property
    def achieved_rate(self) -> float:
        return self.enqueued / self.seconds

    @property
    def processed_rate(self) -> float:
        return self.archived / self.seconds

    @property
    def queries_per_second(self) -> float:
        return self.queries / self.window if self.window > 0 else float("nan")

    def summary(self) -> str:
        frames = [c.frames for c in self.clients_record]
        stats = [len(c.stats_frames) for c in self.clients_record]
        lines = [
            f"clients {self.clients}; enqueued {self.enqueued:,} in {self.seconds:.1f} s = "
            f"{self.achieved_rate:,.0f} jobs/s (target {self.target_rate:,}); archived meanwhile {self.archived:,} "
            f"= {self.processed_rate:,.0f} jobs/s",
            f"frames per client min {min(frames)} / median {statistics.median(frames):.0f} / max {max(frames)}; "
            f"stats frames per client min {min(stats)} / max {max(stats)}; "
            f"clients with errors {sum(1 for c in self.clients_record if c.error)}, failed handshakes retried "
            f"{sum(c.reconnects for c in self.clients_record)}",
            f"commit → client (row or next stats frame) p50 {pct(self.delays_ms, 0.5):.0f} ms, "
            f"p95 {pct(self.delays_ms, 0.95):.0f} ms, p99 {pct(self.delays_ms, 0.99):.0f} ms "
            f"({len(self.delays_ms):,} client×job samples)",
            f"commit → client, jobs shown as a row only: p50 {pct(self.row_delays_ms, 0.5):.0f} ms, "
            f"p95 {pct(self.row_delays_ms, 0.95):.0f} ms ({len(self.row_delays_ms):,} samples)",
            f"web process queries: {self.queries} in the steady {self.window:.1f} s = "
            f"{self.queries_per_second:.2f}/s; by statement: "
            + ", ".join(f"{k} ×{n}" for k, n in self.query_kinds.most_common(8)),
        ]
        return "\n".join(lines)


# ---------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(procs: list[subprocess.Popen[bytes]], timeout: float = 20.0) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_daphne(env: dict[str, str], port: int, log_dir: Path) -> subprocess.Popen[bytes]:
    out = (log_dir / "daphne.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                             "tests.ws_load_asgi:application"], cwd=ROOT, env=env, stdout=out,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daphne exited ({proc.returncode}): {(log_dir / 'daphne.log').read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            time.sleep(0.2)
    _stop([proc])
    raise RuntimeError("daphne did not listen within 60 s")


def start_workers(env: dict[str, str], n: int, log_dir: Path) -> list[subprocess.Popen[bytes]]:
    procs = []
    for i in range(n):
        out = (log_dir / f"worker{i}.log").open("wb")
        procs.append(subprocess.Popen([sys.executable, "manage.py", "chokaq_worker", "--queues", QUEUE],
                                      cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL))
    return procs


# ---------------------------------------------------------------- the run


def _archived() -> int:
    from django.db import connections

    from chokaq_core.models import JobsArchive

    try:
        return JobsArchive.objects.filter(queue=QUEUE).count()
    finally:
        connections.close_all()


async def _clients(uri: str, headers: dict[str, str], n: int, records: list[ClientRecord],
                   body: Any) -> None:
    """Connect ``n`` clients, run ``body()`` (a coroutine function) while they listen, then close them."""
    from websockets.asyncio.client import connect

    stop = asyncio.Event()
    opened = 0
    all_open = asyncio.Event()

    async def one(record: ClientRecord, delay: float) -> None:
        nonlocal opened
        counted = False

        def count() -> None:
            nonlocal opened, counted
            if not counted:
                counted = True
                opened += 1
                if opened == n:
                    all_open.set()

        await asyncio.sleep(delay)  # tabs do not open in the same millisecond
        for attempt in range(CONNECT_ATTEMPTS):
            try:
                async with connect(uri, additional_headers=headers, max_size=None, open_timeout=30,
                                   ping_interval=None) as ws:
                    count()
                    while not stop.is_set():
                        try:
                            message = await asyncio.wait_for(ws.recv(), timeout=0.5)
                        except TimeoutError:
                            continue
                        received = time.monotonic()
                        text = message if isinstance(message, str) else message.decode()
                        record.frames += 1
                        if 'id="stats-bar"' in text:
                            record.stats_frames.append(received)
                            record.mentions_jobs = True
                        for job_id in ROW_RE.findall(text):
                            record.seen.setdefault(job_id, received)
                            record.mentions_jobs = True
                    return
            except Exception as exc:
                record.error = f"{type(exc).__name__}: {exc}"
                if counted or attempt == CONNECT_ATTEMPTS - 1:
                    count()
                    return
                record.reconnects += 1  # like deck.js: try again after a moment
                await asyncio.sleep(1.0)

    tasks = [asyncio.create_task(one(r, i * CONNECT_STAGGER)) for i, r in enumerate(records)]
    try:
        await asyncio.wait_for(all_open.wait(), timeout=60)
        await body()
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


def run_load(*, db_url: str, redis_url: str, session_key: str, clients: int = 50, rate: int = 2000,
             seconds: float = 20.0, workers: int = 2, log_dir: Path) -> LoadResult:
    """The whole scenario. Django must be set up in this process on ``db_url`` with a Redis channel layer
    (so the producer's enqueue events go through Redis too); ``session_key`` is a logged-in session of a
    user with the Deck's view permission, in that database."""
    from django.db import connections

    from chokaq_core import enqueue_many

    log_dir.mkdir(parents=True, exist_ok=True)
    query_log = log_dir / "web-queries.log"
    query_log.write_text("")
    base = {**os.environ, "DATABASE_URL": db_url, "REDIS_URL": redis_url, "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONUNBUFFERED": "1", "DJANGO_DEBUG": "0", "CHOKAQ_LOG_LEVEL": "WARNING"}
    port = free_port()
    web = start_daphne({**base, "CHOKAQ_WS_QUERY_LOG": str(query_log)}, port, log_dir)
    procs = [web]
    try:
        procs += start_workers({**base, "CHOKAQ_TEST_OVERRIDES": json.dumps(WORKER_OVERRIDES)}, workers, log_dir)
        time.sleep(4.0)  # the workers' start-up (Django, job modules) is not part of the measurement
        records = [ClientRecord() for _ in range(clients)]
        committed: list[tuple[float, str]] = []
        lock = threading.Lock()
        stop = threading.Event()
        batch = max(1, round(rate * BATCH_INTERVAL))
        span: dict[str, float] = {}
        archived: dict[str, int] = {}

        def produce() -> None:
            try:
                archived["before"] = _archived()
                span["start"] = time.monotonic()
                span["wall_start"] = time.time()
                sent = 0
                while not stop.is_set():
                    # on schedule: each batch carries what the rate owes by now (at most 5 batches' worth, so a
                    # stall is not followed by one huge transaction)
                    owed = round((time.monotonic() - span["start"] + BATCH_INTERVAL) * rate) - sent
                    size = max(0, min(owed, batch * 5))
                    if size:
                        ids = enqueue_many([{"type_key": JOB_TYPE, "payload": {}, "queue": QUEUE}
                                            for _ in range(size)])
                        now = time.monotonic()
                        sent += len(ids)
                        with lock:
                            committed.extend((now, i) for i in ids)
                    time.sleep(BATCH_INTERVAL)
                span["end"] = time.monotonic()
                span["wall_end"] = time.time()
                archived["after"] = _archived()
            finally:
                connections.close_all()

        async def body() -> None:
            await asyncio.sleep(2.0)  # every tab open; the broadcaster's baseline read is done
            producer = threading.Thread(target=produce, name="ws-load-producer", daemon=True)
            producer.start()
            await asyncio.sleep(seconds)
            stop.set()
            await asyncio.to_thread(producer.join, 60)
            await asyncio.sleep(2.0)  # the last frames

        asyncio.run(_clients(f"ws://127.0.0.1:{port}/ws/deck/",
                             {"Cookie": f"sessionid={session_key}", "Origin": f"http://127.0.0.1:{port}"},
                             clients, records, body))
        if web.poll() is not None:
            raise RuntimeError(f"daphne died: {(log_dir / 'daphne.log').read_text()[-2000:]}")
    finally:
        _stop(procs)

    # ------------------------------------------------------------ figures
    with lock:
        jobs = list(committed)
    step = max(1, len(jobs) // MAX_SAMPLED_JOBS)
    sample = jobs[::step]
    delays: list[float] = []
    row_delays: list[float] = []
    for record in records:
        stats = record.stats_frames
        for at, job_id in sample:
            shown = record.seen.get(job_id)
            k = bisect.bisect_left(stats, at)
            candidates = [t for t in (shown, stats[k] if k < len(stats) else None) if t is not None and t >= at]
            if shown is not None and shown >= at:
                row_delays.append((shown - at) * 1000)
            if candidates:
                delays.append((min(candidates) - at) * 1000)

    start, end = span.get("wall_start", 0.0) + WARM_UP, span.get("wall_end", 0.0)
    kinds: Counter[str] = Counter()
    queries = 0
    for line in query_log.read_text(encoding="utf-8").splitlines():
        stamp, _, sql = line.partition(" ")
        if start <= float(stamp) <= end:
            queries += 1
            kinds[_statement_kind(sql)] += 1
    elapsed = span.get("end", 0.0) - span.get("start", 0.0)
    return LoadResult(clients=clients, target_rate=rate, seconds=elapsed, enqueued=len(jobs),
                      archived=archived.get("after", 0) - archived.get("before", 0), clients_record=records,
                      delays_ms=delays, row_delays_ms=row_delays, queries=queries, window=max(0.0, end - start),
                      query_kinds=kinds)


def _statement_kind(sql: str) -> str:
    tables = re.findall(r'(?:FROM|INTO|UPDATE) "?([a-z_]+)"?', sql, flags=re.IGNORECASE)
    return f"{sql.split(' ', 1)[0]} {tables[0] if tables else ''}".strip()


# ---------------------------------------------------------------- main


def viewer_session() -> str:
    """A logged-in session of a Deck viewer (the ``Deck viewers`` group of ``chokaq_roles``)."""
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from django.test import Client

    call_command("chokaq_roles", verbosity=0)
    user = User.objects.filter(username="ws-load-viewer").first() or User.objects.create_user("ws-load-viewer")
    user.groups.add(Group.objects.get(name="Deck viewers"))
    client = Client()
    client.force_login(user)
    from django.conf import settings

    return str(client.cookies[settings.SESSION_COOKIE_NAME].value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    ensure_database(args.pg_url)
    os.environ.update(DATABASE_URL=args.pg_url, REDIS_URL=args.redis_url, DJANGO_SETTINGS_MODULE="tests.settings",
                      CHOKAQ_LOG_LEVEL="WARNING")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.db import connection

    with connection.cursor() as cursor:  # every run starts from empty job tables (an earlier run's backlog
        cursor.execute("TRUNCATE chokaq_jobs_hot, chokaq_jobs_archive, chokaq_jobs_dlq, chokaq_stats_summary,"
                       " chokaq_metric_buckets, chokaq_workers")  # would slow this one's claims)
    session = viewer_session()
    log(f"{args.clients} Deck websocket clients, {args.workers} workers, {args.rate:,} jobs/s for "
        f"{args.seconds:.0f} s (Redis {args.redis_url}, {args.pg_url})")
    result = run_load(db_url=args.pg_url, redis_url=args.redis_url, session_key=session, clients=args.clients,
                      rate=args.rate, seconds=args.seconds, workers=args.workers,
                      log_dir=Path(settings.VAR_DIR) / "bench" / "ws_load")
    log(result.summary())
    errors = [c.error for c in result.clients_record if c.error]
    if errors:
        log(f"client errors: {errors[:3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
