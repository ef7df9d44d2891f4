"""``python bench/reliability_report.py``: run the long chaos and database-restart scenarios, write docs/reliability.md.

It runs the acceptance tests ``tests/acceptance/test_chaos.py`` and ``tests/acceptance/test_db_restart.py``
through pytest with larger knobs (more jobs, more kills, more restarts); each test writes its figures as
JSON into ``$CHOKAQ_RELIABILITY_DIR``. The fuzz figures come from ``var/reliability/fuzz.json``
(written by ``tests/reliability/test_fuzz.py``) when it exists. The Markdown table goes to
``docs/reliability.md``.

    source scripts/_env.sh
    python bench/reliability_report.py                 # long: 50,000 jobs / 30 kills, 3 restarts (~10 min)
    python bench/reliability_report.py --quick         # the CI sizes: 20,000 jobs / 10 kills, 1 restart (~2.5 min)
    python bench/reliability_report.py --jobs 100000 --kills 50 --restarts 5 --pg-url postgres://…/db

PostgreSQL must be reachable at ``--pg-url`` (pytest-django creates ``test_<name>`` there); the restart
scenario starts its own throw-away cluster with the server binaries of ``CHOKAQ_PG_BIN``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_scenario(test_file: str, env: dict[str, str], timeout: int) -> tuple[bool, float, str]:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", test_file, "-q", "-s", "-p", "no:randomly", f"--timeout={timeout}"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )
    tail = (proc.stdout + proc.stderr)[-3000:]
    return proc.returncode == 0, time.monotonic() - started, tail


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def fuzz_figures(path: Path) -> tuple[int | None, int | None, str]:
    """(cases tried, 500s seen, note) summed over the vendors in fuzz.json."""
    data = read_json(path)
    if not data:
        return None, None, f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} not found"
    sections = [v for v in data.values() if isinstance(v, dict) and "cases" in v] or [data]
    cases = sum(int(s.get("cases", 0)) for s in sections)
    errors = sum(int(s.get("server_errors", s.get("500s", 0))) for s in sections)
    vendors = ", ".join(k for k, v in data.items() if isinstance(v, dict) and "cases" in v)
    return cases, errors, f"from {path.name} ({vendors or 'one run'})"


def cell(value: object) -> str:
    return "—" if value is None else str(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the CI sizes (20,000 jobs, 10 kills, 1 restart)")
    parser.add_argument("--jobs", type=int, default=None, help="chaos jobs (default 50,000; --quick 20,000)")
    parser.add_argument("--kills", type=int, default=None, help="chaos SIGKILLs (default 30; --quick 10)")
    parser.add_argument("--kill-interval", type=float, default=2.5, help="seconds between kills")
    parser.add_argument("--restart-jobs", type=int, default=None, help="restart jobs (default 5,000; --quick 1,500)")
    parser.add_argument("--restarts", type=int, default=None, help="PostgreSQL restarts (default 3; --quick 1)")
    parser.add_argument("--outage", type=float, default=5.0, help="seconds the server stays down")
    parser.add_argument("--pg-url", default=os.environ.get("CHOKAQ_RELIABILITY_PG_URL",
                                                           "postgres://postgres@127.0.0.1:5432/chokaq_reliability"))
    parser.add_argument("--fuzz", type=Path, default=ROOT / "var" / "reliability" / "fuzz.json")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "reliability.md")
    parser.add_argument("--skip", default="", help="comma-separated scenarios not to run: chaos,restart")
    args = parser.parse_args()

    jobs = args.jobs or (20_000 if args.quick else 50_000)
    kills = args.kills or (10 if args.quick else 30)
    restart_jobs = args.restart_jobs or (1_500 if args.quick else 5_000)
    restarts = args.restarts or (1 if args.quick else 3)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}

    results: dict[str, dict[str, Any] | None] = {}
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="chokaq-reliability-") as out_dir:
        base = {**os.environ, "DATABASE_URL": args.pg_url, "CHOKAQ_RELIABILITY_DIR": out_dir,
                "DJANGO_SETTINGS_MODULE": "tests.settings"}
        scenarios = [
            ("chaos", "tests/acceptance/test_chaos.py",
             {"CHOKAQ_CHAOS_JOBS": str(jobs), "CHOKAQ_CHAOS_KILLS": str(kills),
              "CHOKAQ_CHAOS_KILL_INTERVAL": str(args.kill_interval)}, 600 + jobs // 20),
            ("restart", "tests/acceptance/test_db_restart.py",
             {"CHOKAQ_RESTART_JOBS": str(restart_jobs), "CHOKAQ_RESTART_CYCLES": str(restarts),
              "CHOKAQ_RESTART_OUTAGE": str(args.outage)}, 600 + restart_jobs // 10),
        ]
        for name, test_file, knobs, timeout in scenarios:
            if name in skip:
                results[name] = None
                notes.append(f"{name}: not run (--skip)")
                continue
            print(f"== {name}: {test_file} {knobs}", flush=True)
            ok, seconds, tail = run_scenario(test_file, {**base, **knobs}, timeout)
            data = read_json(Path(out_dir) / f"{name}.json")
            if data is not None:
                data["passed"] = ok
                data["seconds"] = round(seconds, 1)
            results[name] = data
            print(f"   {'passed' if ok else 'FAILED'} in {seconds:.0f} s", flush=True)
            if not ok:
                print(tail, file=sys.stderr)
                notes.append(f"{name}: the test FAILED ({test_file}); see its output")

    chaos, restart = results.get("chaos"), results.get("restart")
    fuzz_cases, fuzz_500s, fuzz_note = fuzz_figures(args.fuzz)
    restart_survived = None
    if restart is not None:
        restart_survived = (f"yes ({restart['restarts']}× {restart['outage_s']:g} s down)"
                            if restart.get("passed") and restart.get("survived") else "NO")
    elif "restart" not in skip:
        restart_survived = "NO (the test failed before reporting)"

    lost = double_recorded = None
    if chaos is not None or restart is not None:
        lost = sum(int(r.get("lost", 0)) for r in (chaos, restart) if r)
        double_recorded = sum(int(r.get("double_recorded", 0)) for r in (chaos, restart) if r)
    total_jobs = sum(int(r.get("jobs", 0)) for r in (chaos, restart) if r) or None

    shown = [a for a in sys.argv[1:] if not a.startswith("--pg-url")]
    command = "".join(f" {a}" for a in shown if a not in (args.pg_url,))
    header = ["jobs", "kills", "lost", "double-recorded", "double-executed", "max zombie detection time",
              "restart survived", "fuzz cases tried", "500s seen"]
    row = [
        cell(total_jobs), cell(chaos and chaos.get("kills")), cell(lost), cell(double_recorded),
        cell(chaos and chaos.get("double_executed")),
        cell(chaos and f"{chaos['max_zombie_detection_s']:.2f} s (bound {chaos['zombie_timeout_s']:g} s timeout"
                       f" + {chaos['scan_interval_s']:g} s sweep)"),
        cell(restart_survived), cell(fuzz_cases), cell(fuzz_500s),
    ]
    lines = [
        "# ChokaQ reliability report",
        "",
        f"Generated by `python bench/reliability_report.py{command}` on "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} ({os.cpu_count()} CPUs, PostgreSQL).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        "| " + " | ".join(row) + " |",
        "",
        "## What the figures mean",
        "",
        "- **jobs**: jobs driven through the chaos run plus the restart run.",
        "- **kills**: `chokaq_worker` processes SIGKILLed mid-run (each frozen first, its Processing rows read, then"
        " killed and replaced by a fresh worker).",
        "- **lost**: enqueued jobs found in neither Archive nor DLQ at the end.",
        "- **double-recorded**: jobs found twice (twice in one pillar, or in both Archive and DLQ).",
        "- **double-executed**: jobs that ran more often than their type needs; allowed only for jobs whose"
        " handler was running at a kill (the test fails otherwise). Zombies are never retried, so this is"
        " normally 0.",
        "- **max zombie detection time**: from the SIGKILL to the DLQ `failed_at` of the killed worker's running"
        " jobs (Zombie), with short test settings.",
        "- **restart survived**: PostgreSQL stopped (`pg_ctl stop -m fast`) and started mid-run; both workers"
        " and the daphne web process stayed up, every job was archived exactly once, `/deck/health/`"
        " answered 503 during the outage and 200 after.",
        f"- **fuzz cases tried / 500s seen**: {fuzz_note}.",
        "",
        "## Runs",
        "",
    ]
    if chaos is not None:
        lines.append(
            f"- Chaos (`tests/acceptance/test_chaos.py`): {chaos['jobs']:,} jobs (60 % fast, 10 % slow 50–200 ms,"
            f" 15 % transient, 5 % fatal, 10 % throttled), {chaos['workers']} workers, {chaos['kills']} kills"
            f" ({chaos['kills_mid_run']} mid-run), {chaos['running_at_kills']} jobs running at a kill →"
            f" {chaos['zombies']} Zombies; {chaos['archived']:,} archived, {chaos['dlq']:,} in the DLQ"
            f" ({chaos['fatal']:,} fatal by design). Seed {chaos['seed']}; {chaos['seconds']} s;"
            f" {'passed' if chaos['passed'] else 'FAILED'}.")
    if restart is not None:
        lines.append(
            f"- Restart (`tests/acceptance/test_db_restart.py`): {restart['jobs']:,} jobs enqueued continuously,"
            f" {restart['restarts']} restart(s) of {restart['outage_s']:g} s; {restart['enqueue_calls_failed_during_outage']}"
            f" enqueue call(s) hit the outage and were resolved without duplicates;"
            f" {restart['rerun_after_transient_error']} job(s) re-ran after a transient database error in the"
            f" handler; health back to 200 within {restart['max_recovery_to_healthy_s']} s of the server start;"
            f" {restart['seconds']} s; {'passed' if restart['passed'] else 'FAILED'}.")
    lines += [f"- {n}" for n in notes]
    lines.append("")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")
    print("\n".join(lines[4:7]))
    failed = [n for n, r in results.items() if n not in skip and (r is None or not r.get("passed"))]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
