#!/usr/bin/env python
"""ChokaQ benchmark: enqueue, drain, pickup latency, worker memory and history sensitivity.

    python bench/bench.py [--vendor sqlite|postgresql|both] [--jobs 20000] [--history 1000000] [--quick]

It uses its own databases: ``var/bench/bench.sqlite3`` (recreated each run) and
the PostgreSQL database ``chokaq_bench`` (created if missing; ``--pg-url``
points elsewhere). For each vendor it re-invokes itself as a child process
with ``DATABASE_URL`` set, so Django is configured before ``django.setup()``;
the child migrates, runs every measurement and writes its results as JSON,
and this parent prints one table per vendor. Workers are real
``manage.py chokaq_worker`` subprocesses. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BENCH_DIR = ROOT / "var" / "bench"
SQLITE_PATH = BENCH_DIR / "bench.sqlite3"
DEFAULT_PG_URL = "postgres://postgres@127.0.0.1:5432/chokaq_bench"
NOOP = "bench.noop.v1"
PICKUP = "bench.pickup.v1"
HISTORY_TYPE = "bench.history.v1"
BULK_BATCH = 1_000
STEPS = ("single", "bulk", "drain", "pickup", "history")
# CONCURRENCY stays at its default (10). MAX_CONCURRENCY (default 100) sizes the executor thread pool, and every
# pool thread keeps its own database connection: with the default a worker creeps up to ~100 connections, which
# exhausts PostgreSQL's max_connections = 100 (see README, "Findings"). Pass --chokaq '{}' to measure the default.
DEFAULT_OVERRIDES = '{"WORKER": {"MAX_CONCURRENCY": 10}}'

# The throughput targets, and what the best Python peers reach on this machine class.
TARGETS = {
    "single": ("≥ 2,000 jobs/s", lambda v: v >= 2_000, "PG peers 1,200–1,700"),
    "bulk": ("≥ 40,000 jobs/s", lambda v: v >= 40_000, "procrastinate 18,000"),
    "drain": ("≥ 4,000 jobs/s", lambda v: v >= 4_000, "Dramatiq/Redis 4,000; PG peers ~700"),
    "pickup": ("p50 ≤ 3 ms", lambda v: v <= 3.0, "RQ 2.4 ms; procrastinate 3.6 ms"),
    "rss": ("≤ 80 MiB", lambda v: v <= 80.0, ""),
    "ratio": ("≥ 0.95", lambda v: v >= 0.95, ""),
}


def log(message: str) -> None:
    print(f"[bench {datetime.now().strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ====================================================================== parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--vendor", choices=["sqlite", "postgresql", "both"], default="both")
    p.add_argument("--jobs", type=int, default=None, help="jobs per drain and per bulk enqueue (default 20,000)")
    p.add_argument("--history", type=int, default=None, help="rows pre-loaded into Archive (default 1,000,000)")
    p.add_argument("--single", type=int, default=None, help="single-call enqueues (default 2,000)")
    p.add_argument("--pickups", type=int, default=None, help="jobs of the pickup-latency run (default 200)")
    p.add_argument("--repeat", type=int, default=None,
                   help="drains per measurement: the best is shown, all are in --json (default 1)")
    p.add_argument("--quick", action="store_true", help="small numbers for a fast check (2,000 jobs, 50,000 history)")
    p.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", DEFAULT_PG_URL))
    p.add_argument("--worker-args", default="", help="extra chokaq_worker arguments, e.g. '--concurrency 20'")
    p.add_argument("--chokaq", default=DEFAULT_OVERRIDES,
                   help=f"JSON overrides of CHOKAQ sections (default {DEFAULT_OVERRIDES})")
    p.add_argument("--only", default=",".join(STEPS),
                   help=f"comma-separated steps to run (default all: {','.join(STEPS)}); history includes drain1")
    p.add_argument("--rate-limit", default=None, metavar="RATE",
                   help="also drain with the no-op type rate-limited to RATE (e.g. '1000000/s', far above the\n"
                        "drain rate) in pairs with unlimited drains: the limit's overhead")
    p.add_argument("--json", dest="json_out", default=None, help="also write all results to this JSON file")
    p.add_argument("--child", choices=["sqlite", "postgresql"], help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = args.quick
    args.jobs = args.jobs or (2_000 if quick else 20_000)
    args.history = args.history if args.history is not None else (50_000 if quick else 1_000_000)
    args.single = args.single or (300 if quick else 2_000)
    args.pickups = args.pickups or (50 if quick else 200)
    args.repeat = max(1, args.repeat or 1)
    args.only = [step.strip() for step in args.only.split(",") if step.strip()]
    unknown = set(args.only) - set(STEPS)
    if unknown:
        p.error(f"unknown --only steps {sorted(unknown)}; choose from {','.join(STEPS)}")
    return args


def prepare_sqlite() -> str:
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{SQLITE_PATH}{suffix}").unlink(missing_ok=True)
    return f"sqlite:///{SQLITE_PATH}"


def prepare_postgresql(url: str) -> str:
    """Create the bench database when it is missing (connecting to the server's ``postgres`` database)."""
    import psycopg
    from psycopg import sql

    parsed = urlparse(url)
    name = parsed.path.lstrip("/") or "chokaq_bench"
    admin = urlunparse(parsed._replace(scheme="postgresql", path="/postgres"))
    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            log(f"creating PostgreSQL database {name}")
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return url


def run_vendor(vendor: str, args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    url = prepare_sqlite() if vendor == "sqlite" else prepare_postgresql(args.pg_url)
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    out = BENCH_DIR / f"result-{vendor}.json"
    out.unlink(missing_ok=True)
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "CHOKAQ_JOB_MODULES": "bench.jobs",
        "BENCH_CHOKAQ": args.chokaq,
        "DJANGO_DEBUG": "0",
        "CHOKAQ_LOG_LEVEL": os.environ.get("CHOKAQ_LOG_LEVEL", "WARNING"),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("CHOKAQ_TEST_OVERRIDES", None)
    log(f"{vendor}: {url}")
    code = subprocess.call([sys.executable, str(Path(__file__).resolve()), *argv, "--child", vendor,
                            "--out", str(out)], cwd=ROOT, env=env)
    if code != 0 or not out.exists():
        raise SystemExit(f"the {vendor} benchmark failed (exit {code})")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def fmt_rate(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f} jobs/s"


def verdict(key: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    return "meets" if TARGETS[key][1](value) else "BELOW" if key not in ("pickup", "rss") else "ABOVE"


def render(result: dict[str, Any]) -> str:
    r = result
    n, h = r["jobs"], r["history"]
    rows: list[tuple[str, str, str, str]] = []

    def add(label: str, shown: str, key: str | None = None, value: float | None = None) -> None:
        if key is None:
            rows.append((label, shown, "", ""))
        else:
            rows.append((label, shown, TARGETS[key][0], verdict(key, value)))

    if "single" in r:
        add(f"single-call enqueue ({r['single']['jobs']:,} × enqueue())", fmt_rate(r["single"]["rate"]), "single",
            r["single"]["rate"])
    if "bulk" in r:
        add(f"bulk enqueue ({r['bulk']['jobs']:,} in enqueue_many batches of {BULK_BATCH:,})",
            fmt_rate(r["bulk"]["rate"]), "bulk", r["bulk"]["rate"])
    for key, title in (("drain1", "1 process"), ("drain2", "--processes 2")):
        if key in r:
            d = r[key]
            add(f"drain {n:,} no-op, {title}: start → exit ({d['wall_s']:.1f} s)", fmt_rate(d["wall_rate"]),
                "drain", d["wall_rate"])
            add("    excluding start-up (first start → last archive)", fmt_rate(d["steady_rate"]), "drain",
                d["steady_rate"])
    if "pickup" in r:
        pk = r["pickup"]
        add(f"pickup latency, idle worker ({pk['jobs']} jobs) p50 / p95",
            f"{pk['p50_ms']:.1f} / {pk['p95_ms']:.1f} ms", "pickup", pk["p50_ms"])
    if "drain1" in r:
        add("peak worker RSS (VmHWM, 1-process drain)", f"{r['drain1']['rss_mib']:.1f} MiB", "rss",
            r["drain1"]["rss_mib"])
    if "drain2" in r:
        add("peak RSS, largest of --processes 2", f"{r['drain2']['rss_mib']:.1f} MiB")
    if "pickup" in r:
        add("peak RSS, idle worker of the pickup run", f"{r['pickup']['rss_mib']:.1f} MiB")
    if "rate_limit" in r:
        rl = r["rate_limit"]
        add(f"drain {n:,} no-op under a rate limit of {rl['rate']}: excluding start-up",
            fmt_rate(rl["limited"]["steady_rate"]))
        add(f"    limited / unlimited, excluding start-up (median of {len(rl['pairs'])} paired runs)",
            f"{rl['ratio_steady']:.3f}")
    if "history_drain" in r:
        hist = r["history_drain"]
        add(f"drain {n:,} with {h:,} rows in Archive: start → exit", fmt_rate(hist["wall_rate"]))
        add("    excluding start-up", fmt_rate(hist["steady_rate"]))
        pairs = len(hist["runs"])
        add(f"history ratio, excluding start-up (median of {pairs} paired runs)", f"{r['ratio_steady']:.2f}",
            "ratio", r["ratio_steady"])
        add(f"history ratio, start → exit (median of {pairs} paired runs)", f"{r['ratio_wall']:.2f}", "ratio",
            r["ratio_wall"])
        add(f"(loading {h:,} archive rows took)", f"{r['history_load_s']:.1f} s")

    widths = [max(len(row[i]) for row in [*rows, ("metric", "measured", "target", "")]) for i in range(4)]
    load = " / ".join(f"{a:.2f}" for a in r["loadavg_before"][:1] + r["loadavg_after"][:1])
    lines = [f"== {r['vendor']}: {r['server']}  (1-min load average before / after: {load})"]
    if max(r["loadavg_before"][0], r["loadavg_after"][0]) > 0.75 * (os.cpu_count() or 1):
        lines.append("   ! the machine was busy with other work during this run: treat these numbers as a lower bound")
    lines.append("")
    header = ("metric", "measured", "target", "")
    for row in [header, tuple("-" * w for w in widths), *rows]:
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    return "\n".join(lines)


def revision() -> str:
    """The commit measured, and whether the working tree differs from it (bench/ itself excluded)."""
    if os.environ.get("BENCH_REVISION"):
        return os.environ["BENCH_REVISION"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench"],
                               cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown revision"
    return f"commit {head}{' + uncommitted changes' if dirty else ''}"


def parent(args: argparse.Namespace, argv: list[str]) -> int:
    vendors = ["sqlite", "postgresql"] if args.vendor == "both" else [args.vendor]
    results = [run_vendor(vendor, args, argv) for vendor in vendors]
    print()
    print(f"ChokaQ benchmark — {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    print(f"code: {revision()}; worker: chokaq_worker defaults {args.worker_args or ''}; CHOKAQ overrides {args.chokaq}")
    for result in results:
        print()
        print(render(result))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))
    return 0


# ====================================================================== child


class Child:
    """Runs inside a Django-configured process for one vendor."""

    def __init__(self, args: argparse.Namespace) -> None:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        self.args = args
        self.history_load_s = 0.0
        self.connection = connection
        self.vendor = connection.vendor
        self.worker_args = args.worker_args.split()
        log(f"{self.vendor}: migrating")
        call_command("migrate", verbosity=0)
        real = "double precision" if self.vendor == "postgresql" else "real"
        self.execute(f"CREATE TABLE IF NOT EXISTS bench_pickup (job_id varchar(50) PRIMARY KEY,"
                     f" enqueued_at {real} NOT NULL, started_at {real} NOT NULL)")

    # ------------------------------------------------------------ db helpers

    def execute(self, sql: str, params: list[Any] | None = None) -> None:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)

    def query(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall())

    def scalar(self, sql: str, params: list[Any] | None = None) -> Any:
        return self.query(sql, params)[0][0]

    def server(self) -> str:
        s = self.connection.settings_dict
        if self.vendor == "postgresql":
            version = self.scalar("SHOW server_version")
            return f"PostgreSQL {version} at {s['HOST']}:{s['PORT'] or 5432}/{s['NAME']}"
        version = self.scalar("SELECT sqlite_version()")
        return f"SQLite {version} (WAL, synchronous=NORMAL) at {"/" + str(s["NAME"]).lstrip("/")}"

    def reset(self) -> None:
        tables = ["chokaq_jobs_hot", "chokaq_jobs_archive", "chokaq_jobs_dlq", "chokaq_metric_buckets",
                  "chokaq_stats_summary", "chokaq_workers", "bench_pickup"]
        if self.vendor == "postgresql":
            self.execute(f"TRUNCATE {', '.join(tables)}")
        else:
            for table in tables:
                self.execute(f"DELETE FROM {table}")
        self.settle()

    def settle(self) -> None:
        """Flush dirty pages so a measurement does not pay for the previous step's writes."""
        if self.vendor == "postgresql":
            self.execute("VACUUM ANALYZE")
            self.execute("CHECKPOINT")
        else:
            self.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def parse_ts(self, value: Any) -> datetime:
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=UTC)
        return datetime.fromisoformat(str(value)).replace(tzinfo=UTC)

    # ------------------------------------------------------------ enqueue

    def fill(self, n: int) -> None:
        from chokaq_core import enqueue_many

        for start in range(0, n, BULK_BATCH):
            enqueue_many([{"type_key": NOOP}] * min(BULK_BATCH, n - start))

    def single_enqueue(self) -> dict[str, Any]:
        from chokaq_core import enqueue

        self.reset()
        for _ in range(20):  # warm up: connection, statement caches, queue rows
            enqueue(NOOP)
        n = self.args.single
        started = time.perf_counter()
        for _ in range(n):
            enqueue(NOOP)
        elapsed = time.perf_counter() - started
        log(f"{self.vendor}: single-call enqueue {n / elapsed:,.0f} jobs/s")
        return {"jobs": n, "seconds": elapsed, "rate": n / elapsed}

    def bulk_enqueue(self) -> dict[str, Any]:
        self.reset()
        self.fill(BULK_BATCH)  # warm up
        self.reset()
        n = self.args.jobs
        started = time.perf_counter()
        self.fill(n)
        elapsed = time.perf_counter() - started
        assert self.scalar("SELECT count(*) FROM chokaq_jobs_hot") == n
        log(f"{self.vendor}: bulk enqueue {n / elapsed:,.0f} jobs/s")
        return {"jobs": n, "seconds": elapsed, "rate": n / elapsed}

    # ------------------------------------------------------------ workers

    def spawn_worker(self, extra: list[str], name: str) -> tuple[subprocess.Popen[bytes], Path]:
        stdout = BENCH_DIR / f"{self.vendor}-{name}.out"
        with stdout.open("wb") as out, (BENCH_DIR / f"{self.vendor}-{name}.err").open("wb") as err:
            proc = subprocess.Popen([sys.executable, "manage.py", "chokaq_worker", *extra, *self.worker_args],
                                    cwd=ROOT, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        return proc, stdout

    @staticmethod
    def reap(proc: subprocess.Popen[bytes]) -> tuple[int, float]:
        """Wait for ``proc``; its exit code and peak RSS in MiB (ru_maxrss covers its waited-for children)."""
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        return proc.returncode, usage.ru_maxrss / 1024

    def drain_once(self, processes: int, label: str) -> dict[str, Any]:
        n = self.args.jobs
        self.fill(n)
        self.settle()
        extra = ["--burst"] + (["--processes", str(processes)] if processes > 1 else [])
        started = time.perf_counter()
        proc, _ = self.spawn_worker(extra, label)
        code, rss = self.reap(proc)
        wall = time.perf_counter() - started
        done, first, last = self.query(
            "SELECT count(*), min(started_at), max(finished_at) FROM chokaq_jobs_archive WHERE type = %s", [NOOP]
        )[0]
        left = self.scalar("SELECT count(*) FROM chokaq_jobs_hot")
        if code != 0 or done != n or left:
            raise SystemExit(f"drain {label}: exit {code}, archived {done}/{n}, {left} left in Hot "
                             f"(see {BENCH_DIR}/{self.vendor}-{label}.err)")
        span = (self.parse_ts(last) - self.parse_ts(first)).total_seconds()
        result = {"jobs": n, "processes": processes, "wall_s": wall, "wall_rate": n / wall,
                  "steady_s": span, "steady_rate": n / span if span > 0 else None, "rss_mib": rss}
        log(f"{self.vendor}: drain {label}: {n / wall:,.0f} jobs/s start → exit ({wall:.2f} s), "
            f"{result['steady_rate'] or 0:,.0f} jobs/s excluding start-up, peak RSS {rss:.1f} MiB")
        return result

    def drain_fresh(self, processes: int, label: str, history: int = 0) -> dict[str, Any]:
        """One drain on emptied tables (after loading ``history`` archive rows when asked)."""
        self.reset()
        if history:
            self.load_history(history)
        return self.drain_once(processes, label)

    @staticmethod
    def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
        return {**max(runs, key=lambda d: d["steady_rate"] or 0), "runs": runs}

    # ------------------------------------------------------------ pickup latency

    def pickup(self) -> dict[str, Any]:
        from chokaq_core import enqueue

        self.reset()
        proc, stdout = self.spawn_worker([], "pickup")
        try:
            deadline = time.monotonic() + 60
            while "ChokaQ worker" not in stdout.read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the pickup worker did not start (see {BENCH_DIR}/{self.vendor}-pickup.err)")
                time.sleep(0.05)
            time.sleep(2.0)  # let it settle into idle (LISTEN established, first poll done)
            n = self.args.pickups
            rng = random.Random(42)
            for _ in range(n):
                enqueue(PICKUP, {"t0": time.time()})
                time.sleep(rng.uniform(0.03, 0.07))
            deadline = time.monotonic() + 30
            while self.scalar("SELECT count(*) FROM bench_pickup") < n:
                if time.monotonic() > deadline:
                    raise SystemExit("pickup jobs did not all run within 30 s")
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        _, rss = self.reap(proc)
        latencies = sorted((s - e) * 1000 for e, s in self.query("SELECT enqueued_at, started_at FROM bench_pickup"))
        p50 = statistics.median(latencies)
        p95 = latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))]
        log(f"{self.vendor}: pickup p50 {p50:.2f} ms, p95 {p95:.2f} ms")
        return {"jobs": n, "p50_ms": p50, "p95_ms": p95, "min_ms": latencies[0], "max_ms": latencies[-1],
                "mean_ms": statistics.fmean(latencies), "rss_mib": rss}

    # ------------------------------------------------------------ rate limit overhead

    def rate_limited_drains(self, rate: str) -> dict[str, Any]:
        """Paired 1-process drains, unlimited then with the no-op type limited to ``rate`` (the workers get the
        limit through BENCH_CHOKAQ); the median ratio of their steady rates is the limit's overhead."""
        overrides = json.loads(os.environ.get("BENCH_CHOKAQ", "{}"))
        pairs = []
        for _ in range(self.args.repeat):
            base = self.drain_fresh(1, "drain1")
            os.environ["BENCH_CHOKAQ"] = json.dumps({**overrides, "RATE_LIMITS": {f"type:{NOOP}": rate}})
            try:
                limited = self.drain_fresh(1, "ratelimit")
            finally:
                os.environ["BENCH_CHOKAQ"] = json.dumps(overrides)
            pairs.append((base, limited))
        ratio = statistics.median((lim["steady_rate"] or 0) / (b["steady_rate"] or 1) for b, lim in pairs)
        log(f"{self.vendor}: rate limit {rate}: limited / unlimited drain {ratio:.3f}")
        return {"rate": rate, "pairs": pairs, "limited": self.best([lim for _, lim in pairs]), "ratio_steady": ratio}

    # ------------------------------------------------------------ history

    def load_history(self, rows: int) -> float:
        """Bulk-insert ``rows`` succeeded jobs into Archive (ids sort below today's ULIDs, as old jobs do)."""
        log(f"{self.vendor}: loading {rows:,} archive rows")
        started = time.perf_counter()
        columns = ("id, queue, type, payload, tags, attempt_count, worker_id, created_by, last_modified_by,"
                   " created_at, started_at, finished_at, duration_ms")
        if self.vendor == "postgresql":
            self.execute(
                f"INSERT INTO chokaq_jobs_archive ({columns})"
                " SELECT '00H' || lpad(g::text, 23, '0'), 'default', %s, '{}', NULL, 1, 'bench-history', NULL, NULL,"
                "  now() - make_interval(secs => g * 0.5 + 0.01), now() - make_interval(secs => g * 0.5 + 0.005),"
                "  now() - make_interval(secs => g * 0.5), 5.0"
                " FROM generate_series(1, %s) AS g",
                [HISTORY_TYPE, rows],
            )
        else:
            stamp = "strftime('%%Y-%%m-%%d %%H:%%M:%%f000', 'now', '-' || (n * 0.5 + {offset}) || ' seconds')"
            self.execute(
                f"INSERT INTO chokaq_jobs_archive ({columns})"
                " WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < %s)"
                " SELECT '00H' || substr('00000000000000000000000' || n, -23, 23), 'default', %s, '{}', NULL, 1,"
                f" 'bench-history', NULL, NULL, {stamp.format(offset=0.01)}, {stamp.format(offset=0.005)},"
                f" {stamp.format(offset=0)}, 5.0 FROM g",
                [rows, HISTORY_TYPE],
            )
        self.execute(
            "UPDATE chokaq_stats_summary SET succeeded_total = succeeded_total + %s WHERE queue = 'default'", [rows]
        )
        self.settle()
        elapsed = time.perf_counter() - started
        self.history_load_s = elapsed
        log(f"{self.vendor}: loaded {rows:,} archive rows in {elapsed:.1f} s")
        return elapsed

    # ------------------------------------------------------------ all

    def run(self) -> dict[str, Any]:
        result: dict[str, Any] = {"vendor": self.vendor, "server": self.server(), "jobs": self.args.jobs,
                                  "history": self.args.history, "worker_args": self.args.worker_args,
                                  "loadavg_before": os.getloadavg()}
        steps = self.args.only
        if "single" in steps:
            result["single"] = self.single_enqueue()
        if "bulk" in steps:
            result["bulk"] = self.bulk_enqueue()
        # Baseline and history drains alternate, so a change of machine load hits both alike; the ratio is
        # the median of the per-pair ratios.
        base_runs: list[dict[str, Any]] = []
        hist_runs: list[dict[str, Any]] = []
        if "drain" in steps or "history" in steps:
            for _ in range(self.args.repeat):
                base_runs.append(self.drain_fresh(1, "drain1"))
                if "history" in steps:
                    hist_runs.append(self.drain_fresh(1, "history", history=self.args.history))
            result["drain1"] = self.best(base_runs)
        if "drain" in steps:
            result["drain2"] = self.best([self.drain_fresh(2, "drain2") for _ in range(self.args.repeat)])
        if "pickup" in steps:
            result["pickup"] = self.pickup()
        if self.args.rate_limit:
            result["rate_limit"] = self.rate_limited_drains(self.args.rate_limit)
        if hist_runs:
            result["history_drain"] = self.best(hist_runs)
            result["history_load_s"] = self.history_load_s
            pairs = list(zip(base_runs, hist_runs, strict=True))
            result["ratio_steady"] = statistics.median((h["steady_rate"] or 0) / (b["steady_rate"] or 1)
                                                       for b, h in pairs)
            result["ratio_wall"] = statistics.median(h["wall_rate"] / b["wall_rate"] for b, h in pairs)
        result["loadavg_after"] = os.getloadavg()
        self.reset()
        return result


def child(args: argparse.Namespace) -> int:
    result = Child(args).run()
    Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    return 0


def main() -> int:
    argv = sys.argv[1:]
    args = parse_args(argv)
    if args.child:
        return child(args)
    return parent(args, argv)


if __name__ == "__main__":
    sys.exit(main())
