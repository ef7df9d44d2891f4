"""Recurring jobs: CHOKAQ["SCHEDULE"] cron entries become exactly one job per tick across the fleet."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from chokaq_core import schedule, storage
from chokaq_core.models import JobsArchive, JobsDLQ, JobsHot
from tests.conftest import database_url

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 3, 1, 2, 59, 30, tzinfo=UTC)


@pytest.fixture
def nightly(chokaq_settings: Any) -> None:
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "SCHEDULE": {
        "nightly": {"CRON": "0 3 * * *", "TYPE": "test.ok.v1", "PAYLOAD": {"report": "daily"}, "QUEUE": "reports",
                    "PRIORITY": 50},
        "paused": {"CRON": "* * * * *", "TYPE": "test.ok.v1", "ENABLED": False},
    }}


def test_ticks_and_time_zones() -> None:
    entry = schedule.Entry("n", "0 3 * * *", "t", timezone="Europe/Paris")
    assert entry.due_tick(datetime(2026, 3, 1, 2, 0, tzinfo=UTC)) == datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
    assert entry.next_tick(datetime(2026, 3, 1, 2, 0, tzinfo=UTC)) == datetime(2026, 3, 2, 2, 0, tzinfo=UTC)
    every2 = schedule.Entry("e", "* * * * * */2", "t")
    assert every2.due_tick(datetime(2026, 1, 1, 0, 0, 5, 400, tzinfo=UTC)) == datetime(2026, 1, 1, 0, 0, 4, tzinfo=UTC)


def test_a_new_schedule_starts_with_its_next_tick_then_fires_once_per_tick(nightly: None) -> None:
    assert schedule.run_due(now=T0) == {}  # first sight of "nightly": its 03:00 of yesterday is not replayed
    assert JobsHot.objects.count() == 0
    assert schedule.run_due(now=T0 + timedelta(seconds=20)) == {}
    fired = schedule.run_due(now=T0 + timedelta(seconds=31))
    assert list(fired) == ["nightly"]
    job = storage.get_hot(fired["nightly"])
    assert job is not None
    assert (job.type, job.queue, job.priority, json.loads(job.payload or "")) == (
        "test.ok.v1", "reports", 50, {"report": "daily"})
    assert job.created_by == "schedule:nightly"
    assert job.tags == "schedule:nightly,tick:2026-03-01T03:00:00+00:00"
    assert job.idempotency_key == "schedule:nightly:2026-03-01T03:00:00+00:00"
    assert schedule.run_due(now=T0 + timedelta(minutes=5)) == {}
    assert JobsHot.objects.count() == 1
    # A worker that was away for three days enqueues only the latest tick.
    assert list(schedule.run_due(now=T0 + timedelta(days=3, minutes=1))) == ["nightly"]
    assert JobsHot.objects.count() == 2


def test_overview_for_the_deck(nightly: None) -> None:
    schedule.run_due(now=T0)
    rows = {row["name"]: row for row in schedule.overview(now=T0)}
    assert rows["nightly"]["nextRunUtc"] == datetime(2026, 3, 1, 3, 0, tzinfo=UTC)
    assert rows["nightly"]["lastTickUtc"] == datetime(2026, 2, 28, 3, 0, tzinfo=UTC)
    assert rows["nightly"]["queue"] == "reports"
    assert (rows["paused"]["enabled"], rows["paused"]["nextRunUtc"]) == (False, None)


def test_the_tick_job_is_remembered_as_the_last_run(nightly: None) -> None:
    schedule.run_due(now=T0)
    fired = schedule.run_due(now=T0 + timedelta(seconds=31))["nightly"]
    row = {r["name"]: r for r in schedule.overview(now=T0 + timedelta(minutes=1))}["nightly"]
    assert row["lastJobId"] == fired and row["lastRunUtc"] is not None
    assert row["lastTickUtc"] == datetime(2026, 3, 1, 3, 0, tzinfo=UTC)


def test_a_switched_off_entry_is_skipped_by_every_worker_from_its_next_check(nightly: None) -> None:
    schedule.run_due(now=T0)  # first sight
    schedule.set_enabled("nightly", False, now=T0 + timedelta(seconds=10))
    assert schedule.run_due(now=T0 + timedelta(seconds=31)) == {}, "the switch is read at every check"
    assert JobsHot.objects.count() == 0
    rows = {r["name"]: r for r in schedule.overview(now=T0 + timedelta(minutes=1))}
    assert (rows["nightly"]["enabled"], rows["nightly"]["overridden"], rows["nightly"]["nextRunUtc"]) == (
        False, True, None)
    # switched on again the next day: yesterday's missed tick is not run, the next one is
    schedule.set_enabled("nightly", True, now=T0 + timedelta(days=1))
    assert schedule.run_due(now=T0 + timedelta(days=1, seconds=1)) == {}
    assert list(schedule.run_due(now=T0 + timedelta(days=1, seconds=31))) == ["nightly"]


def test_the_operator_switch_wins_over_the_setting(nightly: None) -> None:
    schedule.set_enabled("paused", True, now=T0)
    assert list(schedule.run_due(now=T0 + timedelta(minutes=1))) == ["paused"]
    assert {r["name"]: r["enabled"] for r in schedule.overview(now=T0)}["paused"] is True


def test_run_now_enqueues_one_job_whatever_the_switch(nightly: None) -> None:
    schedule.set_enabled("nightly", False, now=T0)
    first = schedule.run_now("nightly", "alice", now=T0)
    second = schedule.run_now("nightly", "alice", now=T0)
    assert first != second
    job = storage.get_hot(second)
    assert job is not None and (job.type, job.queue, job.priority) == ("test.ok.v1", "reports", 50)
    assert (job.tags, job.created_by, job.idempotency_key) == ("schedule:nightly,run:now", "alice", None)
    row = {r["name"]: r for r in schedule.overview(now=T0)}["nightly"]
    assert row["lastJobId"] == second and row["enabled"] is False
    assert schedule.run_due(now=T0 + timedelta(seconds=31)) == {}, "run now claims no tick"


def test_unknown_names_are_refused(nightly: None) -> None:
    with pytest.raises(KeyError):
        schedule.set_enabled("nope", False)
    with pytest.raises(KeyError):
        schedule.run_now("nope", "alice")
    assert storage.schedule_states() == []


def test_an_unknown_type_is_logged_not_raised(chokaq_settings: Any, caplog: pytest.LogCaptureFixture) -> None:
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "SCHEDULE": {
        "broken": {"CRON": "* * * * *", "TYPE": "no.such.type"}}}
    assert schedule.run_due(now=T0) == {}
    assert "could not be enqueued" in caplog.text


EVERY_2S = {"SCHEDULE": {"every2s": {"CRON": "* * * * * */2", "TYPE": "test.ok.v1"}},
            "WORKER": {"CONCURRENCY": 2, "MAX_CONCURRENCY": 2, "POLLING_INTERVAL": 0.2,
                       "REGISTRY_HEARTBEAT_INTERVAL": 1}}


def _scheduled_ticks() -> list[str]:
    """The ticks of the schedule's jobs in all three pillars, read as one statement: one snapshot, in which a job
    that a worker moves from Hot to the Archive meanwhile is in one of them (three queries could see it twice)."""
    tags = JobsHot.objects.filter(created_by="schedule:every2s").values_list("tags", flat=True).union(
        *(model.objects.filter(created_by="schedule:every2s").values_list("tags", flat=True)
          for model in (JobsArchive, JobsDLQ)), all=True)
    return [t for tag in tags for t in (tag or "").split(",") if t.startswith("tick:")]


@pytest.mark.acceptance
@pytest.mark.slow
def test_two_worker_processes_make_exactly_one_job_per_tick(tmp_path: Path) -> None:
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings",
           "CHOKAQ_TEST_OVERRIDES": json.dumps(EVERY_2S), "PYTHONUNBUFFERED": "1"}
    workers = []
    for n in range(2):
        log = (tmp_path / f"worker{n}.log").open("wb")
        workers.append(subprocess.Popen([sys.executable, "manage.py", "chokaq_worker"], cwd=ROOT, env=env,
                                        stdout=log, stderr=subprocess.STDOUT))
    try:
        deadline = time.monotonic() + 90
        while len(_scheduled_ticks()) < 4 and time.monotonic() < deadline:
            assert all(w.poll() is None for w in workers), "a worker exited early"
            time.sleep(0.2)
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()
    ticks = _scheduled_ticks()
    logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(tmp_path.glob("worker*.log")))
    assert len(ticks) >= 4, logs
    assert len(ticks) == len(set(ticks)), f"a tick was enqueued twice: {sorted(ticks)}"
    assert all(datetime.fromisoformat(t.removeprefix("tick:")).second % 2 == 0 for t in ticks)
    assert all(w.returncode == 0 for w in workers), logs


@pytest.mark.django_db
def test_the_ticks_are_read_in_one_snapshot(django_assert_num_queries: Any) -> None:
    """A worker moving a job between two of three reads made one tick count twice, and the wait above ended early."""
    with django_assert_num_queries(1):
        assert _scheduled_ticks() == []
