"""Acceptance: fleet-wide rate limits enforced by the database across two real ``chokaq_worker`` processes.

Every property is read from the database's own record afterwards (``chokaq_jobs_archive.started_at``, set by
the worker's lease in the database, the transaction that takes the token), never from timings taken in the
test: the bounds are generous, so a loaded two-CPU machine stays within them, and still far from what a
missing limit gives.

* two workers with 8 slots each drain 1,000 jobs of a type limited to 50/s (burst 10): no 1-second window of
  starts holds more than 50 + 10, every job is archived exactly once (SQLite and PostgreSQL);
* three tenants x 300 jobs under a per-key 20/s: they run side by side (the drain takes about 15 s, far less
  than the 45 s one shared allowance would need) and no tenant exceeds its own allowance in any window;
* an operator's change applies within 2 s of the change's database time: a lower rate, then a pause that
  stops that type only while another type keeps running, then a lift.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from chokaq_core import enqueue_many, service, storage
from chokaq_core.models import JobsArchive, JobsDLQ, JobsHot
from tests.acceptance.procs import Proc, reap, spawn_worker, stop_gracefully, wait_banners, wait_for, write_result
from tests.conftest import database_url

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]

SLOTS = {"CONCURRENCY": 8, "MAX_CONCURRENCY": 8, "SHUTDOWN_GRACE_PERIOD": 10, "REGISTRY_HEARTBEAT_INTERVAL": 1}
DRAIN_TIMEOUT = 120.0
SETTLE = timedelta(seconds=2)  # the bound: every worker follows a change within 2 s


def start_workers(tmp_path: Path, rate_limits: dict[str, Any], count: int = 2) -> list[Proc]:
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings",
           "PYTHONUNBUFFERED": "1",
           "CHOKAQ_TEST_OVERRIDES": json.dumps({"WORKER": SLOTS, "RATE_LIMITS": rate_limits})}
    workers = [spawn_worker(f"worker{n}", env, tmp_path) for n in range(count)]
    wait_banners(workers)
    return workers


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    reap(started)


def starts(type_key: str | None = None) -> list[tuple[datetime, dict[str, Any]]]:
    """(started_at, payload) of every archived job, oldest first."""
    rows = JobsArchive.objects.filter(**({"type": type_key} if type_key else {})).values_list("started_at", "payload")
    return sorted(((started, json.loads(payload or "{}")) for started, payload in rows), key=lambda row: row[0])


def busiest_second(times: Sequence[datetime], window: float = 1.0) -> int:
    """The most starts in any window of ``window`` seconds (a sliding window over the sorted times)."""
    best, first = 0, 0
    for last, at in enumerate(times):
        while (at - times[first]).total_seconds() >= window:
            first += 1
        best = max(best, last - first + 1)
    return best


def database_now() -> datetime:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            return cursor.fetchone()[0].astimezone(UTC)
    return datetime.now(UTC)  # SQLite: the workers' clock is this host's


def assert_all_archived_once(ids: Sequence[str]) -> None:
    archived = list(JobsArchive.objects.values_list("id", flat=True))
    assert len(archived) == len(set(archived)) == len(ids)
    assert set(archived) == set(ids)
    assert not JobsHot.objects.exists() and not JobsDLQ.objects.exists()
    assert storage.summary_stats().succeeded_total == len(ids), "the counters equal the rows"


@pytest.mark.django_db(transaction=True)
def test_two_workers_never_start_more_than_the_limit_in_any_second(procs: list[Proc], tmp_path: Path) -> None:
    procs += start_workers(tmp_path, {"type:test.ok.v1": "50/s burst 10"})
    ids = enqueue_many({"type_key": "test.ok.v1", "payload": {"n": n}} for n in range(1000))

    wait_for(lambda: JobsArchive.objects.count() == 1000, DRAIN_TIMEOUT, "1,000 archived jobs", procs)
    stop_gracefully(procs)

    times = [at for at, _ in starts()]
    write_result(f"rate_limit_drain_{connection.vendor}", {"busiest_second": busiest_second(times),
                                                           "drain_s": (times[-1] - times[0]).total_seconds()})
    # Rate properties, about time by nature: counts per second of the stored start times, and a lower bound on the
    # drain (a slow machine only lengthens it). The lease takes the token, in the transaction that stamps
    # started_at on the database's clock: the start times themselves hold the bucket's bound, with no slack.
    assert busiest_second(times) <= 50 + 10, "no 1-second window over rate + burst"
    assert (times[-1] - times[0]).total_seconds() >= (1000 - 60) / 50 * 0.9, "the limit, not the workers, set the pace"
    assert_all_archived_once(ids)


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_each_tenant_gets_its_own_allowance(procs: list[Proc], tmp_path: Path) -> None:
    procs += start_workers(tmp_path, {"type:test.ok.v1": {"RATE": "20/s burst 5", "PER_KEY": True}})
    ids = enqueue_many({"type_key": "test.ok.v1", "payload": {"tenant": t, "n": n}, "rate_key": f"tenant:{t}"}
                       for n in range(300) for t in ("a", "b", "c"))

    wait_for(lambda: JobsArchive.objects.count() == 900, DRAIN_TIMEOUT, "900 archived jobs", procs)
    stop_gracefully(procs)

    rows = starts()
    drain = (rows[-1][0] - rows[0][0]).total_seconds()
    write_result("rate_limit_tenants", {"drain_s": drain, "busiest_second": {
        t: busiest_second([at for at, payload in rows if payload["tenant"] == t]) for t in ("a", "b", "c")}})
    assert 12 <= drain <= 30, f"tenants ran side by side: {drain:.1f} s (one shared 20/s allowance needs 45 s)"
    for tenant in ("a", "b", "c"):
        times = [at for at, payload in rows if payload["tenant"] == tenant]
        assert len(times) == 300
        assert busiest_second(times) <= 20 + 5, f"tenant {tenant} exceeded its allowance"
    assert_all_archived_once(ids)


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_an_operators_change_applies_within_two_seconds_and_a_pause_holds_that_type_only(
        procs: list[Proc], tmp_path: Path) -> None:
    procs += start_workers(tmp_path, {"type:test.ok.v1": "40/s burst 4"})
    limited = enqueue_many({"type_key": "test.ok.v1", "payload": {"n": n}} for n in range(2000))
    wait_for(lambda: JobsArchive.objects.count() >= 100, DRAIN_TIMEOUT, "the drain under way", procs)

    slowed = database_now()
    service.set_rate_limit("type:test.ok.v1", "5/s burst 1", actor="test")
    wait_for(lambda: database_now() > slowed + SETTLE + timedelta(seconds=4), 30, "four seconds at the new rate")
    paused = database_now()
    service.pause_rate_limit("type:test.ok.v1", actor="test")
    other = enqueue_many({"type_key": "test.sleep.v1", "payload": {"seconds": 0}} for _ in range(200))
    wait_for(lambda: JobsArchive.objects.filter(type="test.sleep.v1").count() == 200, DRAIN_TIMEOUT,
             "the unlimited type to drain while the limited one is paused", procs)
    wait_for(lambda: database_now() > paused + SETTLE + timedelta(seconds=2), 30, "two seconds of the pause")
    lifted = database_now()
    service.lift_rate_limit("type:test.ok.v1", actor="test")
    wait_for(lambda: JobsArchive.objects.count() == 2200, DRAIN_TIMEOUT, "every job archived after the lift", procs)
    stop_gracefully(procs)

    times = [at for at, _ in starts("test.ok.v1")]
    settled_slow = [t for t in times if slowed + SETTLE <= t < paused]
    assert len(settled_slow) <= 5 * (paused - slowed - SETTLE).total_seconds() + 1 + 2, "the lower rate held"
    assert busiest_second(settled_slow) <= 5 + 1
    assert [t for t in times if paused + SETTLE <= t < lifted] == [], "the pause held every job of the type"
    others = [at for at, _ in starts("test.sleep.v1")]
    assert len(others) == 200 and min(others) >= paused, "the other type ran during the pause"
    assert Counter(t >= lifted for t in times)[True] > 0, "the lift let the rest run"
    assert_all_archived_once([*limited, *other])
