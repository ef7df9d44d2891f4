#!/usr/bin/env python
"""The Deck benchmark: server time of every Deck page and partial with 1,000,000 Archive and
100,000 DLQ rows, and the websocket delay from commit to client under a steady 1,000 jobs/s.

    python bench/deck_bench.py [--pg-url URL] [--archive 1000000] [--dlq 100000] [--requests 20]
                               [--rate 1000] [--seconds 20] [--redis-url redis://127.0.0.1:6379/10] [--quick]

* Its own PostgreSQL database (``chokaq_deck_bench``, created and migrated if missing). History is
  seeded once with ``INSERT … SELECT generate_series`` in chunks (progress bar) and kept between runs;
  the counters (``chokaq_stats_summary``) are set to match.
* Page times: the Django test client in this process, logged in as a superuser, times every Deck GET
  (full page and each htmx partial, history pages, keyset next page, sorts, searches, inspector, editor)
  and the two read-only POST previews — ``--requests`` times each after two warm-ups. That is the server
  time (views, queries, templates, middleware), without the network.
* Live delay: two ``chokaq_worker`` processes drain the queue ``deckbench`` while a producer thread here
  enqueues ``--rate`` jobs/s (batches every 20 ms) with ``REDIS_URL`` set. A Deck consumer (the real
  ``DeckConsumer`` and its broadcaster, subscribed to Redis) receives the pushes; the delay of a job is
  the time from its enqueue commit to the first frame carrying its row.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_PG_URL = "postgres://postgres@127.0.0.1:5432/chokaq_deck_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/10"
QUEUE = "deckbench"
JOB_TYPE = "test.ok.v1"  # a no-op handler of tests/jobs.py (tests.settings loads it)
CHUNK = 500_000
PAGE_TARGET_MS = 150.0
PUSH_TARGET_MS = 500.0


def log(message: str) -> None:
    print(message, flush=True)


def progress(label: str, done: int, total: int, started: float) -> None:
    width = 30
    filled = int(width * done / max(total, 1))
    rate = done / max(time.monotonic() - started, 1e-9)
    sys.stdout.write(f"\r  {label:8} [{'#' * filled}{'.' * (width - filled)}] {done:>9,}/{total:,}  {rate:,.0f} rows/s")
    sys.stdout.flush()
    if done >= total:
        sys.stdout.write("\n")


def ensure_database(url: str) -> None:
    import psycopg
    from psycopg import sql

    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    admin = urlunparse(parsed._replace(scheme="postgresql", path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            log(f"created database {name}")


# ---------------------------------------------------------------- seeding (raw SQL: bench code, not the product)

ARCHIVE_CHUNK_SQL = """
INSERT INTO chokaq_jobs_archive (id, queue, type, payload, tags, attempt_count, worker_id, created_by,
    last_modified_by, created_at, started_at, finished_at, duration_ms)
SELECT 'BA' || lpad(g::text, 10, '0'),
       (ARRAY['emails', 'reports', 'default', 'payments'])[1 + g %% 4],
       (ARRAY['demo.email.send.v1', 'demo.report.build.v1', 'demo.payment.capture.v1', 'demo.image.resize.v1',
              'demo.api.sync.v1'])[1 + g %% 5],
       '{"n": ' || g || ', "to": "user' || g || '@example.com"}',
       CASE WHEN g %% 10 = 0 THEN 'vip' END, 1 + (g %% 3 = 0)::int, 'bench-w' || (g %% 8), NULL, NULL,
       now() - make_interval(secs => g * 0.5 + 1), now() - make_interval(secs => g * 0.5 + 0.5),
       now() - make_interval(secs => g * 0.5), (g %% 997)::float8
FROM generate_series(%s, %s) AS g
"""

DLQ_CHUNK_SQL = """
INSERT INTO chokaq_jobs_dlq (id, queue, type, payload, tags, failure_reason, error_details, attempt_count,
    worker_id, created_by, last_modified_by, created_at, failed_at)
SELECT 'BD' || lpad(g::text, 10, '0'),
       (ARRAY['emails', 'reports', 'default', 'payments'])[1 + g %% 4],
       (ARRAY['demo.email.send.v1', 'demo.report.build.v1', 'demo.payment.capture.v1', 'demo.image.resize.v1',
              'demo.api.sync.v1'])[1 + g %% 5],
       '{"n": ' || g || '}', NULL, g %% 11,
       (ARRAY['ValueError: width must be positive, got 0', 'ConnectionError: payment gateway timeout',
              'KeyError: ''account''', 'TimeoutError: handler exceeded 900 s',
              'Zombie: Worker heartbeat expired during execution'])[1 + g %% 5]
           || E'\\nTraceback (most recent call last):\\n  File "app/jobs.py", line ' || (g %% 300)
           || E', in handle\\n    raise error',
       1 + g %% 3, 'bench-w' || (g %% 8), NULL, NULL,
       now() - make_interval(secs => g * 5 + 3), now() - make_interval(secs => g * 5)
FROM generate_series(%s, %s) AS g
"""

COUNTERS_SQL = """
INSERT INTO chokaq_queues (name, is_paused, is_active, last_updated_at)
SELECT q, false, true, now() FROM unnest(ARRAY['emails', 'reports', 'default', 'payments', %s]) AS q
ON CONFLICT (name) DO NOTHING;
INSERT INTO chokaq_stats_summary AS s (queue, succeeded_total, failed_total, retried_total, last_activity_at)
SELECT q, (SELECT count(*) FROM chokaq_jobs_archive a WHERE a.queue = q),
          (SELECT count(*) FROM chokaq_jobs_dlq d WHERE d.queue = q), 0, now()
FROM unnest(ARRAY['emails', 'reports', 'default', 'payments', %s]) AS q
ON CONFLICT (queue) DO UPDATE SET succeeded_total = EXCLUDED.succeeded_total, failed_total = EXCLUDED.failed_total
"""


BUCKETS_SQL = """
INSERT INTO chokaq_metric_buckets (bucket_start, queue, outcome, failure_reason, completed_count, duration_count,
    total_duration_ms, max_duration_ms, last_updated_at)
SELECT date_trunc('second', now()) - make_interval(secs => s), q, o, CASE WHEN o = 1 THEN 1 + s %% 11 ELSE 0 END,
       CASE WHEN o = 0 THEN 20 + s %% 7 ELSE 1 END, CASE WHEN o = 0 THEN 20 + s %% 7 ELSE 1 END,
       (s %% 997)::float8 * 20, (s %% 997)::float8, now()
FROM generate_series(%s, %s) AS s, unnest(ARRAY['emails', 'reports', 'default', 'payments']) AS q,
     generate_series(0, 1) AS o
WHERE o = 0 OR s %% 10 = 0
ON CONFLICT DO NOTHING
"""


# The history roll-ups at their retention (48 h of minute buckets, 30 days of hour buckets) for 5 queues x 5 types
# x 2 outcomes: 180,000 rows the 1h / 24h / 7d chart views read a bounded slice of.
HISTORY_SQL = """
INSERT INTO chokaq_history_buckets (granularity, bucket_start, queue, type, outcome, completed_count, duration_count,
                                    total_duration_ms, max_duration_ms, b05, b06, b07)
SELECT g.width, date_trunc(g.unit, now()) - g.step * n, q, 'bench.type' || k || '.v1', o, 100, 100 * (1 - o),
       5000.0 * (1 - o), CASE WHEN o = 0 THEN 180.0 END, 50 * (1 - o), 30 * (1 - o), 20 * (1 - o)
FROM (VALUES (60, 'minute', interval '1 minute', 2880), (3600, 'hour', interval '1 hour', 720))
     AS g(width, unit, step, buckets)
CROSS JOIN LATERAL generate_series(0, g.buckets - 1) AS n
CROSS JOIN unnest(ARRAY['emails', 'reports', 'default', 'payments', %s]) AS q
CROSS JOIN generate_series(1, 5) AS k
CROSS JOIN (VALUES (0), (1)) AS oc(o)
ON CONFLICT DO NOTHING
"""


def secondary_indexes(cursor: Any, table: str) -> list[tuple[str, str]]:
    """(name, CREATE INDEX statement) of every index of ``table`` that backs no constraint."""
    cursor.execute(
        "SELECT i.indexname, i.indexdef FROM pg_indexes i WHERE i.tablename = %s AND NOT EXISTS"
        " (SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname) ORDER BY 1", [table])
    return [(str(name), str(ddl)) for name, ddl in cursor.fetchall()]


def seed_table(cursor: Any, table: str, prefix: str, total: int, chunk_sql: str, chunk: int,
               count_sql: str | None = None) -> bool:
    """Fill ``table`` up to ``total`` seeded rows (``chunk_sql`` inserts the numbers %s..%s); on PostgreSQL
    the secondary indexes are dropped meanwhile and rebuilt once at the end."""
    if count_sql:
        cursor.execute(count_sql)
    else:
        cursor.execute(f"SELECT count(*) FROM {table} WHERE id LIKE %s", [f"{prefix}%%"])
    have = int(cursor.fetchone()[0])
    if have >= total:
        log(f"  {table}: {have:,} seeded rows already present")
        return False
    indexes = secondary_indexes(cursor, table) if cursor.db.vendor == "postgresql" else []
    for name, _ in indexes:
        cursor.execute(f'DROP INDEX "{name}"')
    try:
        started = time.monotonic()
        for start in range(have + 1, total + 1, chunk):
            end = min(total, start + chunk - 1)
            cursor.execute(chunk_sql, [start, end])
            progress(table.removeprefix("chokaq_jobs_"), end - have, total - have, started)
    finally:
        for name, ddl in indexes:
            index_started = time.monotonic()
            cursor.execute(ddl)
            log(f"  rebuilt index {name} in {time.monotonic() - index_started:.1f} s")
    return True


def seed(archive: int, dlq: int) -> float:
    """Seed history once (kept between runs); returns the seconds it took (0 when nothing was missing)."""
    from django.db import connection

    started = time.monotonic()
    changed = False
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")
        cursor.execute("SET maintenance_work_mem = '256MB'")
        # An earlier run's live jobs (queue deckbench) would sit on top of every history page: the views are
        # timed on the seeded history alone, the same for every run.
        removed = 0
        for table in ("chokaq_jobs_archive", "chokaq_jobs_dlq", "chokaq_jobs_hot"):
            cursor.execute(f"DELETE FROM {table} WHERE queue = %s", [QUEUE])
            removed += cursor.rowcount
        if removed:
            log(f"  removed {removed:,} rows an earlier run's live part left")
            changed = True
        for table, prefix, total, chunk_sql in (("chokaq_jobs_archive", "BA", archive, ARCHIVE_CHUNK_SQL),
                                                ("chokaq_jobs_dlq", "BD", dlq, DLQ_CHUNK_SQL)):
            changed |= seed_table(cursor, table, prefix, total, chunk_sql, CHUNK)
        cursor.execute("SELECT count(*) FROM chokaq_metric_buckets")
        if int(cursor.fetchone()[0]) == 0:
            # One day of per-second buckets (the default METRIC_BUCKETS_HOURS retention) for four queues.
            seconds = 86_400
            bucket_started = time.monotonic()
            for start in range(0, seconds, 21_600):
                cursor.execute(BUCKETS_SQL, [start, min(seconds, start + 21_600) - 1])
                progress("buckets", min(seconds, start + 21_600), seconds, bucket_started)
            changed = True
        cursor.execute("SELECT count(*) FROM chokaq_history_buckets")
        if int(cursor.fetchone()[0]) < 100_000:
            cursor.execute(HISTORY_SQL, [QUEUE])
            log("  history roll-ups: 48 h of minute and 30 days of hour buckets seeded")
            changed = True
        cursor.execute(COUNTERS_SQL, [QUEUE, QUEUE])
        if changed:
            log("  VACUUM ANALYZE")
            for table in ("chokaq_jobs_archive", "chokaq_jobs_dlq", "chokaq_metric_buckets", "chokaq_history_buckets",
                          "chokaq_jobs_hot"):
                cursor.execute(f"VACUUM ANALYZE {table}")
        cursor.execute("SET synchronous_commit = on")
    return time.monotonic() - started if changed else 0.0


# ---------------------------------------------------------------- page times


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def page_times(requests: int, archive: int, dlq: int) -> list[tuple[str, float, float, int]]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user, _ = get_user_model().objects.get_or_create(username="deck-bench")
    user.is_superuser = user.is_staff = True
    user.save()
    client = Client()
    client.force_login(user)
    htmx: dict[str, Any] = {"HTTP_HX_REQUEST": "true"}
    archived_id, dead_id = f"BA{archive // 2:010d}", f"BD{dlq // 2:010d}"
    first_archive = client.get("/deck/partials/jobs?view=archive&size=100", **htmx).content.decode()
    next_link = re.search(r'id="page-next" href="/deck/\?([^"]+)"', first_archive)
    next_query = next_link.group(1).replace("&amp;", "&") if next_link else "view=archive&size=100"
    probes: list[tuple[str, str, str, dict[str, Any]]] = [
        ("full page /deck/", "GET", "/deck/", {}),
        ("full page, DLQ view", "GET", "/deck/?view=dlq", {}),
        ("full page, 7d history", "GET", "/deck/?range=7d", {}),
        *((f"partial {p}", "GET", f"/deck/partials/{p}", htmx)
          for p in ("stats", "queues", "chart", "top-errors", "console", "maintenance", "recurring")),
        *((f"chart history {r}", "GET", f"/deck/partials/chart?range={r}", htmx) for r in ("1h", "24h", "7d")),
        ("jobs: active", "GET", "/deck/partials/jobs?view=active", htmx),
        ("jobs: archive preview (10)", "GET", "/deck/partials/jobs?view=archive", htmx),
        ("jobs: archive page (100)", "GET", "/deck/partials/jobs?view=archive&size=100", htmx),
        ("jobs: archive next page (keyset)", "GET", f"/deck/partials/jobs?{next_query}", htmx),
        ("jobs: archive 500 rows", "GET", "/deck/partials/jobs?view=archive&size=500", htmx),
        ("jobs: archive by duration", "GET", "/deck/partials/jobs?view=archive&size=100&sort=duration", htmx),
        ("jobs: archive by type asc", "GET", "/deck/partials/jobs?view=archive&size=100&sort=type&dir=asc", htmx),
        ("jobs: archive queue filter", "GET", "/deck/partials/jobs?view=archive&size=100&queue=reports", htmx),
        ("jobs: archive search (common)", "GET", "/deck/partials/jobs?view=archive&size=100&q=vip", htmx),
        ("jobs: archive search (one id)", "GET", f"/deck/partials/jobs?view=archive&size=100&q={archived_id}", htmx),
        ("jobs: archive by attempts", "GET", "/deck/partials/jobs?view=archive&size=100&sort=attempts", htmx),
        ("jobs: archive day range", "GET",
         f"/deck/partials/jobs?view=archive&size=100&start={time.strftime('%Y-%m-%d', time.gmtime(time.time() - 172800))}"
         f"&end={time.strftime('%Y-%m-%d', time.gmtime(time.time() - 86400))}", htmx),
        ("jobs: dlq page (100)", "GET", "/deck/partials/jobs?view=dlq&size=100", htmx),
        ("jobs: dlq reason filter", "GET", "/deck/partials/jobs?view=dlq&size=100&reason=6", htmx),
        ("jobs: dlq search error text", "GET", "/deck/partials/jobs?view=dlq&size=100&q=gateway", htmx),
        ("jobs: dlq search (no match)", "GET", "/deck/partials/jobs?view=dlq&size=100&q=no-such-text", htmx),
        ("jobs: dlq by reason", "GET", "/deck/partials/jobs?view=dlq&size=100&sort=reason", htmx),
        ("inspector: archived job", "GET", f"/deck/jobs/{archived_id}", htmx),
        ("inspector: DLQ job", "GET", f"/deck/jobs/{dead_id}", htmx),
        ("editor: DLQ job", "GET", f"/deck/jobs/{dead_id}/edit", htmx),
        ("dlq bulk preview (reason)", "POST", "/deck/api/dlq/bulk/preview", {"reason": "6", "max_jobs": "100"}),
        ("purge preview (archive > 3 days)", "POST", "/deck/api/maintenance/preview", {"pillar": "archive", "days": "3"}),
    ]
    results = []
    for name, method, url, extra in probes:
        samples = []
        status = 0
        for n in range(requests + 2):
            started = time.perf_counter()
            if method == "GET":
                response = client.get(url, **extra)
            else:
                response = client.post(url, extra, **htmx)
            elapsed = (time.perf_counter() - started) * 1000
            status = response.status_code
            if n >= 2:
                samples.append(elapsed)
        results.append((name, statistics.median(samples), pct(samples, 0.95), status))
        log(f"  {name:36} p50 {results[-1][1]:7.1f} ms   p95 {results[-1][2]:7.1f} ms   [{status}]")
    return results


# ---------------------------------------------------------------- live delay


def start_workers(env: dict[str, str], n: int, log_dir: Path) -> list[subprocess.Popen[bytes]]:
    procs = []
    for i in range(n):
        out = (log_dir / f"deck-bench-worker{i}.log").open("wb")
        procs.append(subprocess.Popen([sys.executable, "manage.py", "chokaq_worker", "--queues", QUEUE,
                                       "--concurrency", "16"], cwd=ROOT, env=env, stdout=out,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
    return procs


def live_delay(rate: int, seconds: float) -> dict[str, Any]:
    from asgiref.sync import sync_to_async
    from channels.testing import WebsocketCommunicator
    from django.contrib.auth import get_user_model
    from django.db import connections

    from chokaq_core import enqueue_many
    from chokaq_core.models import JobsArchive
    from deck.consumers import Broadcaster, DeckConsumer

    user = get_user_model().objects.get(username="deck-bench")
    committed: dict[str, float] = {}
    lock = threading.Lock()
    stop = threading.Event()
    batch = max(1, rate // 50)

    def produce() -> None:
        next_at = time.monotonic()
        try:
            while not stop.is_set():
                ids = enqueue_many([{"type_key": JOB_TYPE, "payload": {}, "queue": QUEUE} for _ in range(batch)])
                now = time.monotonic()
                with lock:
                    committed.update((i, now) for i in ids)
                next_at += 0.02
                time.sleep(max(0.0, next_at - time.monotonic()))
        finally:
            connections.close_all()

    async def run() -> tuple[dict[str, float], int, bool]:
        socket = WebsocketCommunicator(DeckConsumer.as_asgi(), "/ws/deck/")
        socket.scope["user"] = user
        assert (await socket.connect(timeout=10))[0]
        cross = Broadcaster.for_running_loop().cross_process
        seen: dict[str, float] = {}
        frames = 0
        producer = threading.Thread(target=produce, name="deck-bench-producer", daemon=True)
        await asyncio.sleep(1.0)
        producer.start()
        deadline = time.monotonic() + seconds + 2.0
        while time.monotonic() < deadline:
            if time.monotonic() > deadline - 2.0:
                stop.set()
            if socket.output_queue.empty():
                await asyncio.sleep(0.002)
                continue
            message = await socket.receive_output(timeout=1)
            received = time.monotonic()
            frames += 1
            for job_id in re.findall(r'<tr id="job-([0-9A-Z]+)"', message.get("text") or ""):
                seen.setdefault(job_id, received)
        stop.set()
        producer.join(timeout=10)
        await socket.disconnect()
        await sync_to_async(connections.close_all)()
        return seen, frames, cross

    archived_before = JobsArchive.objects.filter(queue=QUEUE).count()
    seen, frames, cross = asyncio.run(run())
    time.sleep(2)
    archived = JobsArchive.objects.filter(queue=QUEUE).count() - archived_before
    with lock:
        delays = [(seen[i] - t) * 1000 for i, t in committed.items() if i in seen]
    return {"enqueued": len(committed), "archived": archived, "shown": len(delays), "frames": frames,
            "seconds": seconds, "cross_process": cross,
            "p50": statistics.median(delays) if delays else float("nan"),
            "p95": pct(delays, 0.95) if delays else float("nan"), "p99": pct(delays, 0.99) if delays else float("nan"),
            "max": max(delays) if delays else float("nan")}


# ---------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--archive", type=int, default=10_000_000)
    parser.add_argument("--dlq", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--rate", type=int, default=1_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="20,000 / 2,000 rows, 5 requests, 8 s of load")
    parser.add_argument("--seed-only", action="store_true", help="seed the history and stop")
    parser.add_argument("--no-live", action="store_true", help="skip the commit → client run")
    args = parser.parse_args()
    if args.quick:
        args.archive, args.dlq, args.requests, args.seconds = 20_000, 2_000, 5, 8.0

    ensure_database(args.pg_url)
    os.environ.update(DATABASE_URL=args.pg_url, REDIS_URL=args.redis_url, DJANGO_SETTINGS_MODULE="tests.settings",
                      CHOKAQ_LOG_LEVEL="WARNING")
    os.environ.setdefault("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,testserver")  # the test client's host
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("chokaq_roles", verbosity=0)
    log(f"seeding {args.archive:,} Archive and {args.dlq:,} DLQ rows (kept between runs)")
    seeded_s = seed(args.archive, args.dlq)
    log(f"seeding took {seeded_s:.1f} s" if seeded_s else "seeding: nothing to add")
    if args.seed_only:
        return 0

    log(f"\nserver time of every Deck page and partial ({args.requests} requests each, after 2 warm-ups)")
    pages = page_times(args.requests, args.archive, args.dlq)

    live: dict[str, Any] | None = None
    if not args.no_live:
        log(f"\ncommit → client under {args.rate:,} jobs/s for {args.seconds:.0f} s ({args.workers} workers, Redis)")
        log_dir = ROOT / "var" / "bench"
        log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "CHOKAQ_TEST_OVERRIDES": '{"WORKER": {"MAX_CONCURRENCY": 16, "FETCH_BATCH_SIZE": 100, '
                                        '"PREFETCH_CAPACITY": 200}}'}
        workers = start_workers(env, args.workers, log_dir)
        try:
            time.sleep(3)
            live = live_delay(args.rate, args.seconds)
        finally:
            for proc in workers:
                proc.send_signal(signal.SIGTERM)
            for proc in workers:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()

    worst = max(p95 for _, _, p95, _ in pages)
    failed = [name for name, _, _, status in pages if status >= 400]
    log("\n| View | p50 ms | p95 ms |\n|---|---:|---:|")
    for name, p50, p95, status in pages:
        flag = "" if p95 < PAGE_TARGET_MS and status < 400 else " ✗"
        log(f"| {name} | {p50:.1f} | {p95:.1f}{flag} |")
    log(f"\nslowest view p95 {worst:.1f} ms (target < {PAGE_TARGET_MS:.0f} ms): "
        f"{'met' if worst < PAGE_TARGET_MS and not failed else 'MISSED'}")
    if failed:
        log(f"views answering an error status: {', '.join(failed)}")
    if seeded_s:
        log(f"seeding this run: {seeded_s:.1f} s")
    if live is not None:
        log(f"live: {live['enqueued']:,} enqueued ({live['enqueued'] / live['seconds']:,.0f}/s), "
            f"{live['archived']:,} archived, {live['shown']:,} rows pushed in {live['frames']:,} frames "
            f"({live['frames'] / live['seconds']:.1f} frames/s), through Redis: {live['cross_process']}")
        log(f"commit → client p50 {live['p50']:.0f} ms, p95 {live['p95']:.0f} ms, p99 {live['p99']:.0f} ms, "
            f"max {live['max']:.0f} ms (target p95 < {PUSH_TARGET_MS:.0f} ms): "
            f"{'met' if live['p95'] < PUSH_TARGET_MS else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
