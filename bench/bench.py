#!/usr/bin/env python
"""ChokaQ benchmark: every performance target with its measured value and a PASS/FAIL verdict.

    python bench/bench.py [--vendor sqlite|postgresql|both] [--jobs 20000] [--quick] [--repeat N]
    python bench/bench.py --scale [--vendor postgresql] [--quick]     # growth curves

It uses its own databases: ``var/bench/bench.sqlite3`` (recreated each run) and the PostgreSQL
database of ``--pg-url`` (created if missing). For each vendor it re-invokes itself as a child
process with ``DATABASE_URL`` set, so Django is configured before ``django.setup()``; the child
migrates, runs every measurement and writes its results as JSON, and this parent prints one table
per vendor. Workers are real ``manage.py chokaq_worker --queues default`` subprocesses with the
user's default settings. See bench/README.md.
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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
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
HISTORY_CHUNK = 500_000
STEPS = ("single", "bulk", "drain", "concurrency2", "processes2", "pickup")
SCALE_STEPS = ("backlog", "queues", "archive", "processes", "future")
SCALE_TOLERANCE = 0.10
# how the README's getting-started starts a worker; BENCH_WORKER_QUEUES=all: without --queues (every queue)
WORKER = [] if os.environ.get("BENCH_WORKER_QUEUES") == "all" else ["--queues", "default"]
CLK_TCK = os.sysconf("SC_CLK_TCK")
BACKLOG_POINTS = os.environ.get("BENCH_BACKLOG_POINTS", "")  # e.g. "1000000": only these backlog curve points
COUNT_HOT_ROWS = os.environ.get("BENCH_POLL") == "rows"  # poll the drain by count(*) of Hot, as before 2026-12-03


@dataclass(frozen=True)
class Target:
    """One target of the performance issue: the vendor it applies to, its bound and direction."""

    key: str
    vendor: str  # "postgresql", "sqlite" or "any"
    label: str
    bound: float
    at_least: bool  # True: measured ≥ bound passes; False: measured ≤ bound passes
    unit: str

    def passes(self, value: float) -> bool:
        return value >= self.bound if self.at_least else value <= self.bound

    def text(self) -> str:
        number = f"{self.bound:,.0f}" if self.bound >= 100 else f"{self.bound:g}"
        return f"{'≥' if self.at_least else '≤'} {number} {self.unit}"


TARGETS = [
    Target("single", "any", "single-call enqueue", 3_200, True, "jobs/s"),
    Target("bulk", "postgresql", "bulk enqueue", 100_000, True, "jobs/s"),
    Target("drain", "postgresql", "drain at defaults", 8_000, True, "jobs/s"),
    Target("drain", "sqlite", "drain at defaults (WAL)", 4_000, True, "jobs/s"),
    Target("concurrency2", "postgresql", "drain, --concurrency 2", 4_000, True, "jobs/s"),
    Target("pickup_p50", "postgresql", "pickup p50, idle worker", 2.0, False, "ms"),
    Target("pickup_p95", "postgresql", "pickup p95, idle worker", 3.0, False, "ms"),
    Target("pickup_p50", "sqlite", "pickup p50, idle worker", 3.0, False, "ms"),
    Target("pss_idle", "any", "worker PSS, idle (max sampled)", 45, False, "MiB"),
    Target("pss_drain", "any", "worker PSS during the drain (max sampled)", 45, False, "MiB"),
]


def log(message: str) -> None:
    print(f"[bench {datetime.now().strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ====================================================================== parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--vendor", choices=["sqlite", "postgresql", "both"], default=None,
                   help="which databases (default both; with --scale, postgresql)")
    p.add_argument("--jobs", type=int, default=None, help="jobs per drain and per bulk enqueue (default 20,000)")
    p.add_argument("--single", type=int, default=None, help="single-call enqueues (default 2,000)")
    p.add_argument("--pickups", type=int, default=None, help="jobs of the pickup-latency run (default 200)")
    p.add_argument("--repeat", type=int, default=None,
                   help="drains per measurement: the best is shown, all are in --json (default 1)")
    p.add_argument("--quick", action="store_true",
                   help="small numbers for a fast check (2,000 jobs; with --scale every curve point ÷ 10)")
    p.add_argument("--scale", action="store_true", help="growth curves instead of the targets (see README)")
    p.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", DEFAULT_PG_URL))
    p.add_argument("--worker-args", default="", help="extra chokaq_worker arguments, e.g. '--batch-size 100'")
    p.add_argument("--chokaq", default="{}", help="JSON overrides of CHOKAQ sections (default none: the user's defaults)")
    p.add_argument("--only", default=None,
                   help=f"comma-separated steps (default all: {','.join(STEPS)}; with --scale {','.join(SCALE_STEPS)})")
    p.add_argument("--rate-limit", default=None, metavar="RATE",
                   help="also run paired drains, unlimited then with the no-op type rate-limited to RATE (e.g.\n"
                        "'1000000/s', far above the drain rate): the overhead of a rate limit (claim and lease)")
    p.add_argument("--json", dest="json_out", default=None, help="also write all results to this JSON file")
    p.add_argument("--child", choices=["sqlite", "postgresql"], help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = args.quick
    args.vendor = args.vendor or ("postgresql" if args.scale else "both")
    args.jobs = args.jobs or (2_000 if quick else 20_000)
    args.single = args.single or (300 if quick else 2_000)
    args.pickups = args.pickups or (50 if quick else 200)
    args.repeat = max(1, args.repeat or 1)
    steps = SCALE_STEPS if args.scale else STEPS
    args.only = [s.strip() for s in (args.only or ",".join(steps)).split(",") if s.strip()]
    unknown = set(args.only) - set(steps)
    if unknown:
        p.error(f"unknown --only steps {sorted(unknown)}; choose from {','.join(steps)}")
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
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
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


def fmt(value: float, unit: str) -> str:
    return f"{value:,.0f} {unit}" if value >= 100 else f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}"


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> list[str]:
    widths = [max(len(row[i]) for row in [*rows, header]) for i in range(len(header))]
    return ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
            for row in [header, tuple("-" * w for w in widths), *rows]]


def measured_values(r: dict[str, Any]) -> dict[str, float]:
    """The value each target key reads from one vendor's result."""
    values: dict[str, float] = {}
    for key in ("single", "bulk"):
        if key in r:
            values[key] = r[key]["rate"]
    for key in ("drain", "concurrency2"):
        if key in r:
            values[key] = r[key]["steady_rate"]
    if "pickup" in r:
        values["pickup_p50"], values["pickup_p95"] = r["pickup"]["p50_ms"], r["pickup"]["p95_ms"]
        values["pss_idle"] = r["pickup"]["pss_max_mib"]
    drains = [r[k]["pss_max_mib"] for k in ("drain", "concurrency2") if k in r]
    if drains:
        values["pss_drain"] = max(drains)
    return values


def render(r: dict[str, Any]) -> str:
    """One vendor's table: every target (PASS/FAIL), then the figures that have no target."""
    values = measured_values(r)
    rows: list[tuple[str, ...]] = []
    for target in TARGETS:
        if target.vendor not in ("any", r["vendor"]):
            continue
        if target.key not in values:
            rows.append((target.label, "not run", target.text(), "—"))
            continue
        value = values[target.key]
        rows.append((target.label, fmt(value, target.unit), target.text(), "PASS" if target.passes(value) else "FAIL"))
    n = r["jobs"]
    for key, title in (("drain", "defaults"), ("concurrency2", "--concurrency 2"), ("processes2", "--processes 2")):
        if key not in r:
            continue
        d = r[key]
        if key == "processes2":
            rows.append((f"drain, {title}, excluding start-up", fmt(d["steady_rate"], "jobs/s"), "", ""))
        rows.append((f"  {title}: start → empty Hot ({n:,} jobs, {d['wall_s']:.1f} s)", fmt(d["wall_rate"], "jobs/s"),
                     "", ""))
        rows.append((f"  {title}: machine CPU per drained job", fmt(d["machine_cpu_ms"], "ms"), "", ""))
        rows.append((f"  {title}: worker CPU per drained job (start-up included)", fmt(d["worker_cpu_ms"], "ms"), "", ""))
        if d.get("db_connections"):
            rows.append((f"  {title}: peak PostgreSQL connections", str(d["db_connections"]), "", ""))
    if "bulk" in r and r["vendor"] != "postgresql":
        rows.append(("bulk enqueue (no target on SQLite)", fmt(r["bulk"]["rate"], "jobs/s"), "", ""))
    for key, raw, share in (("single", "raw single-row INSERT + commit", 0.85),
                            ("bulk", f"raw {BULK_BATCH:,}-row INSERT + commit", 0.45)):
        if r.get(key, {}).get("ceiling"):
            ratio = r[key]["rate"] / r[key]["ceiling"]
            rows.append((f"  {raw} (ceiling)", fmt(r[key]["ceiling"], "rows/s"), "", ""))
            verdict = ("PASS" if ratio >= share else "FAIL") if r["vendor"] == "postgresql" else ""
            rows.append((f"  {key} enqueue / ceiling", f"{ratio:.2f}", f"≥ {share:.2f}" if verdict else "", verdict))
    if "rate_limit" in r:
        rl = r["rate_limit"]
        rows.append((f"drain under a rate limit of {rl['rate']}, excluding start-up",
                     fmt(rl["limited"]["steady_rate"], "jobs/s"), "", ""))
        rows.append((f"  limited / unlimited (median of {len(rl['pairs'])} paired drains)", f"{rl['ratio']:.3f}",
                     "≥ 0.900", "PASS" if rl["ratio"] >= 0.9 else "FAIL"))
    if "pickup" in r:
        rows.append(("  pickup: min / mean / max", f"{r['pickup']['min_ms']:.2f} / {r['pickup']['mean_ms']:.2f} / "
                     f"{r['pickup']['max_ms']:.2f} ms", "", ""))
    lines = [header_line(r), ""]
    lines += table(rows, ("metric", "measured", "target", "verdict"))
    passed = sum(1 for row in rows if row[3] == "PASS")
    failed = sum(1 for row in rows if row[3] == "FAIL")
    lines.append(f"targets: {passed} PASS, {failed} FAIL")
    return "\n".join(lines)


def header_line(r: dict[str, Any]) -> str:
    load = " / ".join(f"{a:.2f}" for a in r["loadavg_before"][:1] + r["loadavg_after"][:1])
    line = f"== {r['vendor']}: {r['server']}  (1-min load average before / after: {load})"
    if max(r["loadavg_before"][0], r["loadavg_after"][0]) > 0.75 * (os.cpu_count() or 1):
        line += "\n   ! the machine was busy with other work during this run: treat these numbers as a lower bound"
    return line


def render_scale(r: dict[str, Any]) -> str:
    """Each curve: its points' rates next to the curve's base, PASS within the tolerance (faster passes)."""
    rows: list[tuple[str, ...]] = []
    for curve in r["curves"]:
        base = curve["points"][0]["value"]
        for i, point in enumerate(curve["points"]):
            value = point["value"]
            # Throughput points pass when at least 90 % of the base; latency points when at most 110 %.
            ratio = value / base if base else float("nan")
            ok = ratio >= 1 - SCALE_TOLERANCE if curve["higher_is_better"] else ratio <= 1 + SCALE_TOLERANCE
            rows.append((curve["name"] if i == 0 else "", point["label"], fmt(value, curve["unit"]),
                         "base" if i == 0 else f"{ratio:.3f}", "" if i == 0 else ("PASS" if ok else "FAIL"),
                         point.get("note", "")))
    lines = [header_line(r), ""]
    lines += table(rows, ("curve", "point", "measured", "vs base", f"±{SCALE_TOLERANCE:.0%}", "note"))
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
    print(f"ChokaQ benchmark{' --scale' if args.scale else ''} — {platform.node()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    print(f"code: {revision()}; worker: chokaq_worker {' '.join(WORKER)} {args.worker_args}".rstrip()
          + f"; CHOKAQ overrides {args.chokaq}")
    for result in results:
        print()
        print(render_scale(result) if args.scale else render(result))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))
    return 0


# ====================================================================== child


class Sampler(threading.Thread):
    """Samples the PSS (``/proc/<pid>/smaps_rollup``) of a worker process and its children every 100 ms."""

    def __init__(self, pid: int) -> None:
        super().__init__(name="bench-pss", daemon=True)
        self.pid = pid
        self.peak_kib = 0
        self.samples = 0
        self.halt = threading.Event()

    @staticmethod
    def pss_kib(pid: int) -> int:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    return int(line.split()[1])
        except (OSError, ValueError):
            pass
        return 0

    def pids(self) -> list[int]:
        try:
            children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
        except OSError:
            children = []
        return [self.pid, *map(int, children)]

    def run(self) -> None:
        while not self.halt.wait(0.1):
            largest = max((self.pss_kib(pid) for pid in self.pids()), default=0)
            if largest:
                self.peak_kib = max(self.peak_kib, largest)
                self.samples += 1

    def stop(self) -> float:
        """Stop sampling; the largest PSS of one process seen, in MiB."""
        self.halt.set()
        self.join(timeout=2)
        return self.peak_kib / 1024


def machine_ticks() -> tuple[int, int]:
    """Clock ticks every CPU of the machine spent busy, and those the hypervisor stole (``/proc/stat``: user, nice,
    system, irq, softirq; steal). Stolen time is not the machine's work: on a shared VM it ran to 25 % of a drain."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9])
    return user + nice + system + irq + softirq, steal


class Child:
    """Runs inside a Django-configured process for one vendor."""

    def __init__(self, args: argparse.Namespace) -> None:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        self.args = args
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
        return f"SQLite {version} (WAL, synchronous=NORMAL) at {'/' + str(s['NAME']).lstrip('/')}"

    def reset(self, keep_history: bool = False) -> None:
        """Empty the job tables (``keep_history``: Archive keeps its seeded history rows)."""
        tables = ["chokaq_jobs_hot", "chokaq_jobs_dlq", "chokaq_metric_buckets", "chokaq_stats_summary",
                  "chokaq_workers", "chokaq_job_attempts", "bench_pickup"]
        if keep_history:
            self.execute("DELETE FROM chokaq_jobs_archive WHERE type <> %s", [HISTORY_TYPE])
        else:
            tables.append("chokaq_jobs_archive")
        if self.vendor == "postgresql":
            self.execute(f"TRUNCATE {', '.join(tables)}")
        else:
            for name in tables:
                self.execute(f"DELETE FROM {name}")
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

    def fill(self, n: int, queues: int = 1, delay: float | None = None, label: str = "") -> None:
        """Bulk-enqueue ``n`` no-op jobs round-robin over ``queues`` queues (``delay`` s in the future)."""
        from bench.deck_bench import progress
        from chokaq_core import enqueue_many

        names = ["default"] if queues == 1 else [f"bench{i:03d}" for i in range(queues)]
        started = time.monotonic()
        for start in range(0, n, BULK_BATCH):
            count = min(BULK_BATCH, n - start)
            enqueue_many([{"type_key": NOOP, "queue": names[(start + i) % len(names)], "delay": delay}
                          for i in range(count)])
            if label and ((start // BULK_BATCH) % 50 == 49 or start + count >= n):
                progress(label, start + count, n, started)

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
        ceiling = self.raw_ceiling(n, 1)
        log(f"{self.vendor}: single-call enqueue {n / elapsed:,.0f} jobs/s; raw single-row INSERT {ceiling:,.0f}/s")
        return {"jobs": n, "seconds": elapsed, "rate": n / elapsed, "ceiling": ceiling}

    def bulk_enqueue(self) -> dict[str, Any]:
        self.reset()
        self.fill(BULK_BATCH)  # warm up
        self.reset()
        n = self.args.jobs
        started = time.perf_counter()
        self.fill(n)
        elapsed = time.perf_counter() - started
        assert self.scalar("SELECT count(*) FROM chokaq_jobs_hot") == n
        ceiling = self.raw_ceiling(n, BULK_BATCH)
        log(f"{self.vendor}: bulk enqueue {n / elapsed:,.0f} jobs/s; raw {BULK_BATCH:,}-row INSERT {ceiling:,.0f}/s")
        return {"jobs": n, "seconds": elapsed, "rate": n / elapsed, "ceiling": ceiling}

    def raw_ceiling(self, n: int, batch: int) -> float:
        """Rows/s of the driver alone, on the same database: ``n`` rows of (id, queue, type, payload) — ids made
        client-side as ULIDs — into a table with only its primary key, ``batch`` rows per INSERT and commit (one
        array parameter per column on PostgreSQL, executemany on SQLite). The ceiling the enqueue rates are read
        against: no validation, no JSON, no Hot indexes, no queue rows or NOTIFY."""
        from chokaq_core.domain import new_ulids

        self.execute("DROP TABLE IF EXISTS bench_raw")
        self.execute("CREATE TABLE bench_raw (id varchar(50) PRIMARY KEY, queue varchar(255), type varchar(255),"
                     " payload text)")
        settings = self.connection.settings_dict
        if self.vendor == "postgresql":
            import psycopg

            conn: Any = psycopg.connect(host=settings["HOST"], port=settings["PORT"] or 5432, dbname=settings["NAME"],
                                        user=settings["USER"], password=settings["PASSWORD"] or None,
                                        autocommit=True, prepare_threshold=0)
            one = "INSERT INTO bench_raw VALUES (%s, %s, %s, %s)"
            many = "INSERT INTO bench_raw SELECT unnest(%s::text[]), %s, %s, %s"
        else:
            import sqlite3

            conn = sqlite3.connect(settings["NAME"], isolation_level=None)
            conn.execute("PRAGMA synchronous=NORMAL")
            one = "INSERT INTO bench_raw VALUES (?, ?, ?, ?)"
        with conn:
            started = time.perf_counter()
            for start in range(0, n, batch):
                ids = new_ulids(min(batch, n - start))
                if batch == 1:
                    conn.execute(one, [ids[0], "default", NOOP, "{}"])
                elif self.vendor == "postgresql":
                    conn.execute(many, [ids, "default", NOOP, "{}"])
                else:
                    conn.execute("BEGIN")
                    conn.executemany(one, [(i, "default", NOOP, "{}") for i in ids])
                    conn.execute("COMMIT")
            elapsed = time.perf_counter() - started
        conn.close()
        self.execute("DROP TABLE bench_raw")
        return n / elapsed

    # ------------------------------------------------------------ workers

    def spawn_worker(self, extra: list[str], name: str, queues: list[str] = WORKER) -> tuple[subprocess.Popen[bytes],
                                                                                              Path]:
        stdout = BENCH_DIR / f"{self.vendor}-{name}.out"
        with stdout.open("wb") as out, (BENCH_DIR / f"{self.vendor}-{name}.err").open("wb") as err:
            proc = subprocess.Popen([sys.executable, "manage.py", "chokaq_worker", *queues, *extra, *self.worker_args],
                                    cwd=ROOT, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        return proc, stdout

    @staticmethod
    def reap(proc: subprocess.Popen[bytes]) -> tuple[int, float]:
        """Wait for ``proc``; its exit code and CPU seconds (user + system, its waited-for children included)."""
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        return proc.returncode, usage.ru_utime + usage.ru_stime

    def connections_now(self) -> int:
        if self.vendor != "postgresql":
            return 0
        return int(self.scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")) - 1

    def finished_jobs(self) -> int:
        """Jobs that left Hot for Archive or the DLQ, from the per-queue counters (which equal the rows): one read
        of a row per queue. Counting the Hot rows instead is a scan of the whole table, ~240 ms of 3 processes
        (a parallel seq scan) at 1,000,000 rows, every 100 ms poll — the bench then competed with the drain it
        measured, more the larger the backlog."""
        return int(self.scalar("SELECT coalesce(sum(succeeded_total + failed_total), 0) FROM chokaq_stats_summary"))

    def drain(self, n: int, label: str, extra: list[str] | None = None, queues: list[str] = WORKER,
              timeout: float = 1_800) -> dict[str, Any]:
        """Start a worker on ``n`` Pending jobs as a user does, wait until all have left Hot, stop it (SIGTERM)."""
        finished_before = self.finished_jobs()
        started = time.perf_counter()
        proc, _ = self.spawn_worker(extra or [], label, queues)
        sampler = Sampler(proc.pid)
        sampler.start()
        peak_connections = 0
        deadline = time.monotonic() + timeout
        left = n
        busy_from: tuple[tuple[int, int], int] | None = None  # (ticks, jobs left) when the first job had left Hot
        while left:
            time.sleep(0.1)
            left = (int(self.scalar("SELECT count(*) FROM chokaq_jobs_hot WHERE type = %s", [NOOP]))
                    if COUNT_HOT_ROWS else n - (self.finished_jobs() - finished_before))
            if busy_from is None and left < n:
                busy_from = (machine_ticks(), left)
            peak_connections = max(peak_connections, self.connections_now())
            if proc.poll() is not None or time.monotonic() > deadline:
                break
        wall = time.perf_counter() - started
        (busy_ticks, steal_ticks), busy_left = busy_from or (machine_ticks(), 0)
        busy_jobs = busy_left - left
        busy_now, steal_now = machine_ticks()
        busy, steal = busy_now - busy_ticks, steal_now - steal_ticks
        pss = sampler.stop()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code, cpu = self.reap(proc)
        left = int(self.scalar("SELECT count(*) FROM chokaq_jobs_hot WHERE type = %s", [NOOP]))  # the rows, once
        done, first, last = self.query(
            "SELECT count(*), min(started_at), max(finished_at) FROM chokaq_jobs_archive WHERE type = %s", [NOOP]
        )[0]
        if left or done != n:
            raise SystemExit(f"drain {label}: exit {code}, archived {done}/{n}, {left} left in Hot "
                             f"(see {BENCH_DIR}/{self.vendor}-{label}.err)")
        span = (self.parse_ts(last) - self.parse_ts(first)).total_seconds()
        result = {"jobs": n, "wall_s": wall, "wall_rate": n / wall, "steady_s": span,
                  "steady_rate": n / span if span > 0 else 0.0, "pss_max_mib": pss, "pss_samples": sampler.samples,
                  "machine_cpu_ms": busy / CLK_TCK * 1000 / max(busy_jobs, 1), "steal_s": steal / CLK_TCK,
                  "worker_cpu_ms": cpu * 1000 / n, "db_connections": peak_connections, "exit": code}
        log(f"{self.vendor}: drain {label}: {result['steady_rate']:,.0f} jobs/s excluding start-up, "
            f"{n / wall:,.0f} start → empty ({wall:.2f} s), PSS ≤ {pss:.1f} MiB, "
            f"machine CPU {result['machine_cpu_ms']:.3f} ms/job, {steal / CLK_TCK:.1f} s stolen by the hypervisor, "
            f"{peak_connections} connections")
        return result

    def drain_fresh(self, label: str, extra: list[str] | None = None) -> dict[str, Any]:
        runs = []
        for _ in range(self.args.repeat):
            self.reset()
            self.fill(self.args.jobs)
            self.settle()
            runs.append(self.drain(self.args.jobs, label, extra))
        return {**max(runs, key=lambda d: d["steady_rate"]), "runs": runs}

    def rate_limited_drains(self, rate: str) -> dict[str, Any]:
        """Paired drains, unlimited then with the no-op type limited to ``rate`` (the worker reads the limit from
        BENCH_CHOKAQ); the median ratio of their steady rates is the limit's overhead (the claim reads the bucket,
        the lease spends it)."""
        overrides = json.loads(os.environ.get("BENCH_CHOKAQ", "{}"))
        pairs = []
        for _ in range(self.args.repeat):
            pair = []
            for limited in (False, True):
                self.reset()
                self.fill(self.args.jobs)
                self.settle()
                os.environ["BENCH_CHOKAQ"] = json.dumps(
                    {**overrides, "RATE_LIMITS": {f"type:{NOOP}": rate}} if limited else overrides)
                try:
                    pair.append(self.drain(self.args.jobs, "ratelimit" if limited else "unlimited"))
                finally:
                    os.environ["BENCH_CHOKAQ"] = json.dumps(overrides)
            pairs.append(pair)
        ratio = statistics.median(lim["steady_rate"] / (base["steady_rate"] or 1) for base, lim in pairs)
        log(f"{self.vendor}: rate limit {rate}: limited / unlimited drain {ratio:.3f}")
        return {"rate": rate, "pairs": pairs, "ratio": ratio,
                "limited": max((lim for _, lim in pairs), key=lambda d: d["steady_rate"])}

    # ------------------------------------------------------------ pickup latency

    def pickup(self, label: str = "pickup") -> dict[str, Any]:
        """Jobs enqueued one at a time, 30–70 ms apart, to an idle worker: enqueue call → handler start."""
        from chokaq_core import enqueue

        self.execute("DELETE FROM bench_pickup")
        proc, stdout = self.spawn_worker([], label)
        sampler = Sampler(proc.pid)
        sampler.start()
        try:
            deadline = time.monotonic() + 60
            while "ChokaQ worker" not in stdout.read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the pickup worker did not start (see {BENCH_DIR}/{self.vendor}-{label}.err)")
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
            pss = sampler.stop()
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            self.reap(proc)
        latencies = sorted((s - e) * 1000 for e, s in self.query("SELECT enqueued_at, started_at FROM bench_pickup"))
        p50 = statistics.median(latencies)
        p95 = latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))]
        log(f"{self.vendor}: {label} p50 {p50:.2f} ms, p95 {p95:.2f} ms, idle worker PSS ≤ {pss:.1f} MiB")
        return {"jobs": n, "p50_ms": p50, "p95_ms": p95, "min_ms": latencies[0], "max_ms": latencies[-1],
                "mean_ms": statistics.fmean(latencies), "pss_max_mib": pss}

    # ------------------------------------------------------------ history

    def load_history(self, rows: int) -> float:
        """Add succeeded rows to Archive up to ``rows`` (ids sort below today's ULIDs, as old jobs do);
        the secondary indexes are dropped meanwhile and rebuilt once, then VACUUM ANALYZE."""
        from bench.deck_bench import seed_table

        have = int(self.scalar("SELECT count(*) FROM chokaq_jobs_archive WHERE type = %s", [HISTORY_TYPE]))
        if have >= rows:
            return 0.0
        log(f"{self.vendor}: loading Archive up to {rows:,} history rows")
        started = time.perf_counter()
        columns = ("id, queue, type, payload, tags, attempt_count, worker_id, created_by, last_modified_by,"
                   " created_at, started_at, finished_at, duration_ms")
        with self.connection.cursor() as cursor:
            if self.vendor == "postgresql":
                cursor.execute("SET synchronous_commit = off")
                cursor.execute("SET maintenance_work_mem = '256MB'")
                chunk_sql = (
                    f"INSERT INTO chokaq_jobs_archive ({columns})"
                    " SELECT '00H' || lpad(g::text, 23, '0'), 'default', '" + HISTORY_TYPE + "', '{}', NULL, 1,"
                    " 'bench-history', NULL, NULL, now() - make_interval(secs => g * 0.5 + 0.01),"
                    " now() - make_interval(secs => g * 0.5 + 0.005), now() - make_interval(secs => g * 0.5), 5.0"
                    " FROM generate_series(%s, %s) AS g")
                seed_table(cursor, "chokaq_jobs_archive", "00H", rows, chunk_sql, HISTORY_CHUNK,
                           count_sql="SELECT count(*) FROM chokaq_jobs_archive WHERE type = '" + HISTORY_TYPE + "'")
                cursor.execute("SET synchronous_commit = on")
            else:
                stamp = "strftime('%%Y-%%m-%%d %%H:%%M:%%f000', 'now', '-' || (n * 0.5 + {offset}) || ' seconds')"
                chunk_sql = (
                    f"INSERT INTO chokaq_jobs_archive ({columns})"
                    " WITH RECURSIVE g(n) AS (SELECT %s UNION ALL SELECT n + 1 FROM g WHERE n < %s)"
                    " SELECT '00H' || substr('00000000000000000000000' || n, -23, 23), 'default', '"
                    + HISTORY_TYPE + "', '{}', NULL, 1, 'bench-history', NULL, NULL,"
                    f" {stamp.format(offset=0.01)}, {stamp.format(offset=0.005)}, {stamp.format(offset=0)}, 5.0 FROM g")
                seed_table(cursor, "chokaq_jobs_archive", "00H", rows, chunk_sql, HISTORY_CHUNK,
                           count_sql="SELECT count(*) FROM chokaq_jobs_archive WHERE type = '" + HISTORY_TYPE + "'")
        self.settle()
        elapsed = time.perf_counter() - started
        log(f"{self.vendor}: Archive holds {rows:,} history rows (+{rows - have:,} in {elapsed:.1f} s, "
            "VACUUM ANALYZE included)")
        return elapsed

    # ------------------------------------------------------------ targets

    def run(self) -> dict[str, Any]:
        result: dict[str, Any] = {"vendor": self.vendor, "server": self.server(), "jobs": self.args.jobs,
                                  "worker_args": self.args.worker_args, "loadavg_before": os.getloadavg()}
        steps = self.args.only
        if "single" in steps:
            result["single"] = self.single_enqueue()
        if "bulk" in steps:
            result["bulk"] = self.bulk_enqueue()
        if "drain" in steps:
            result["drain"] = self.drain_fresh("drain")
        if "concurrency2" in steps:
            result["concurrency2"] = self.drain_fresh("concurrency2", ["--concurrency", "2"])
        if "processes2" in steps:
            result["processes2"] = self.drain_fresh("processes2", ["--processes", "2"])
        if "pickup" in steps:
            self.reset()
            result["pickup"] = self.pickup()
        if self.args.rate_limit:
            result["rate_limit"] = self.rate_limited_drains(self.args.rate_limit)
        result["loadavg_after"] = os.getloadavg()
        self.reset()
        return result

    # ------------------------------------------------------------ growth curves

    def point(self, label: str, value: float, **extra: Any) -> dict[str, Any]:
        return {"label": label, "value": value, **extra}

    def curve_backlog(self, div: int) -> dict[str, Any]:
        points = []
        sizes = [int(x) for x in BACKLOG_POINTS.split(",") if x.strip()]
        for n in sizes or (10_000 // div, 100_000 // div, 1_000_000 // div):
            self.reset()
            self.fill(n, label=f"{n:,} Pending")
            self.settle()
            d = self.drain(n, f"backlog-{n}")
            points.append(self.point(f"{n:,} Pending", d["steady_rate"], note=f"PSS ≤ {d['pss_max_mib']:.1f} MiB",
                                     drain=d))
        return {"name": "drain, jobs already Pending", "unit": "jobs/s", "higher_is_better": True, "points": points}

    def curve_queues(self, div: int) -> dict[str, Any]:
        points = []
        for queues in (1, 10, 100):
            self.reset()
            self.fill(self.args.jobs, queues=queues)
            self.settle()
            d = self.drain(self.args.jobs, f"queues-{queues}", queues=[])  # no --queues: every queue
            points.append(self.point(f"{queues} queue{'s' if queues > 1 else ''}", d["steady_rate"], drain=d))
        return {"name": f"drain {self.args.jobs:,} over N queues", "unit": "jobs/s", "higher_is_better": True,
                "points": points}

    def curve_archive(self, div: int) -> dict[str, Any]:
        points = []
        self.reset()
        for rows in (0, 1_000_000 // div, 10_000_000 // div):
            load_s = self.load_history(rows)
            self.reset(keep_history=True)
            self.fill(self.args.jobs)
            self.settle()
            d = self.drain(self.args.jobs, f"archive-{rows}")
            points.append(self.point(f"{rows:,} in Archive", d["steady_rate"],
                                     note=f"loading took {load_s:.1f} s" if load_s else "", drain=d))
        return {"name": f"drain {self.args.jobs:,} with N rows in Archive", "unit": "jobs/s",
                "higher_is_better": True, "points": points}

    def curve_processes(self, div: int) -> dict[str, Any]:
        points = []
        for processes in (1, 2, 4):
            self.reset()
            self.fill(self.args.jobs)
            self.settle()
            d = self.drain(self.args.jobs, f"processes-{processes}",
                           ["--processes", str(processes)] if processes > 1 else [])
            points.append(self.point(f"--processes {processes}", d["steady_rate"],
                                     note=f"machine CPU {d['machine_cpu_ms']:.3f} ms/job", drain=d))
        return {"name": f"drain {self.args.jobs:,}, worker processes", "unit": "jobs/s", "higher_is_better": True,
                "points": points}

    def curve_future(self, div: int) -> dict[str, Any]:
        points = []
        for rows in (0, 1_000_000 // div):
            self.reset()
            if rows:
                self.fill(rows, delay=86_400.0, label=f"{rows:,} future")
                self.settle()
            pk = self.pickup(f"pickup-future-{rows}")
            points.append(self.point(f"{rows:,} Pending in the future", pk["p50_ms"],
                                     note=f"p95 {pk['p95_ms']:.2f} ms", pickup=pk))
        return {"name": "pickup p50, idle worker", "unit": "ms", "higher_is_better": False, "points": points}

    def run_scale(self) -> dict[str, Any]:
        curves: dict[str, Callable[[int], dict[str, Any]]] = {
            "backlog": self.curve_backlog, "queues": self.curve_queues, "archive": self.curve_archive,
            "processes": self.curve_processes, "future": self.curve_future}
        div = 10 if self.args.quick else 1
        result: dict[str, Any] = {"vendor": self.vendor, "server": self.server(), "jobs": self.args.jobs,
                                  "loadavg_before": os.getloadavg(), "curves": []}
        for step in self.args.only:
            result["curves"].append(curves[step](div))
        result["loadavg_after"] = os.getloadavg()
        self.reset()
        return result


def child(args: argparse.Namespace) -> int:
    sys.stdout = sys.stderr  # progress bars and logs: the parent's stdout carries only the tables
    bench = Child(args)
    result = bench.run_scale() if args.scale else bench.run()
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
