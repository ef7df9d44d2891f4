"""Retention cleanup (spec 05 §5): ``manage.py chokaq_cleanup`` and the in-worker run."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.models import Count

from chokaq_core import enqueue, maintenance, storage
from chokaq_core.domain import AttemptError, Failure, FailureReason, Retry, Success, WorkerInfo
from chokaq_core.models import (
    HistoryBuckets,
    JobAttempts,
    JobsArchive,
    JobsDLQ,
    JobsHot,
    MetricBuckets,
    StatsSummary,
    Workers,
)

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime.now(UTC)


def counters_match_rows() -> None:
    archived = dict(JobsArchive.objects.values_list("queue").annotate(n=Count("id")))
    dead = dict(JobsDLQ.objects.values_list("queue").annotate(n=Count("id")))
    for row in StatsSummary.objects.all():
        assert row.succeeded_total - row.purged_total == archived.get(row.queue, 0), row.queue
        assert row.failed_total == dead.get(row.queue, 0), row.queue


@pytest.fixture
def history(chokaq_settings: Any) -> dict[str, Any]:
    """Archive and DLQ rows of two queues, half of them 10 days old; buckets and worker rows, old and new."""
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "SQL": {"CLEANUP_BATCH_SIZE": 3}}
    ids = [enqueue("test.ok.v1", {"n": i}, queue=f"q{i % 2}") for i in range(20)]
    hot = enqueue("test.ok.v1", {"stays": True}, queue="q0")
    JobsHot.objects.filter(id=hot).update(created_at=NOW - timedelta(days=30))
    claimed = storage.fetch_batch("w1", 100)
    storage.release_jobs([hot], "w1")
    assert len(claimed) == 21
    storage.complete("w1", [Success(i, 1.0) for i in ids[:12]], [],
                     [Failure(i, FailureReason.FATAL_ERROR, "boom") for i in ids[12:]])
    old_archive, old_dlq = ids[:6], ids[12:16]
    JobsArchive.objects.filter(id__in=old_archive).update(finished_at=NOW - timedelta(days=10))
    JobsDLQ.objects.filter(id__in=old_dlq).update(created_at=NOW - timedelta(days=10))
    MetricBuckets.objects.all().delete()
    for hours in (1, 30, 40):
        MetricBuckets.objects.create(bucket_start=(NOW - timedelta(hours=hours)).replace(microsecond=0), queue="q0",
                                     outcome=0, failure_reason=-1, completed_count=5)
    for granularity, age in ((60, timedelta(hours=50)), (3600, timedelta(days=31))):  # past both retentions
        HistoryBuckets.objects.create(granularity=granularity, bucket_start=(NOW - age).replace(microsecond=0),
                                      queue="q0", type="test.ok.v1", outcome=0, completed_count=5)
    for name, age in (("fresh", timedelta(0)), ("gone-1", timedelta(days=3)), ("gone-2", timedelta(days=5))):
        storage.upsert_worker(WorkerInfo(worker_id=name, hostname="h", pid=1, queues="*", capacity=1, active_count=0))
        Workers.objects.filter(worker_id=name).update(last_heartbeat_at=NOW - age)
    counters_match_rows()
    return {"hot": hot, "old_archive": set(old_archive), "old_dlq": set(old_dlq)}


def run(*args: str) -> str:
    out = StringIO()
    call_command("chokaq_cleanup", *args, stdout=out)
    return out.getvalue()


def test_cleanup_deletes_in_batches_and_keeps_counters_exact(history: dict[str, Any]) -> None:
    output = run("--archive-days", "7", "--dlq-days", "7")
    assert "Archive: deleted 6 rows" in output
    assert "DLQ: deleted 4 rows" in output
    assert "MetricBuckets: deleted 2 rows" in output
    assert "Workers: deleted 2 rows" in output
    assert "History (min): deleted 1 rows" in output and "History (hour): deleted 1 rows" in output
    assert "Retention cleanup done: 16 rows deleted." in output
    assert re.search(r"Archive\s+\[#{30}\] 6/6", output)
    assert not JobsArchive.objects.filter(id__in=history["old_archive"]).exists()
    assert not JobsDLQ.objects.filter(id__in=history["old_dlq"]).exists()
    assert (JobsArchive.objects.count(), JobsDLQ.objects.count()) == (6, 4)
    assert JobsHot.objects.filter(id=history["hot"]).exists(), "Hot is never touched"
    assert MetricBuckets.objects.count() == 1
    assert list(Workers.objects.values_list("worker_id", flat=True)) == ["fresh"]
    counters_match_rows()
    assert "deleted 0 rows" in run("--archive-days", "7", "--dlq-days", "7")
    counters_match_rows()


def test_archive_and_dlq_are_kept_by_default(history: dict[str, Any]) -> None:
    output = run("--no-progress")
    assert "Archive: kept (no retention set)" in output
    assert "DLQ: kept (no retention set)" in output
    assert (JobsArchive.objects.count(), JobsDLQ.objects.count()) == (12, 8)
    assert MetricBuckets.objects.count() == 1


def test_retention_settings_are_the_defaults(history: dict[str, Any], chokaq_settings: Any) -> None:
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "RETENTION": {"ARCHIVE_DAYS": 7, "METRIC_BUCKETS_HOURS": 35}}
    output = run("--no-progress")
    assert "Archive: deleted 6 rows" in output
    assert "DLQ: kept" in output
    assert "MetricBuckets: deleted 1 rows" in output
    counters_match_rows()


def test_dry_run_counts_and_deletes_nothing(history: dict[str, Any]) -> None:
    output = run("--archive-days", "7", "--dlq-days", "7", "--dry-run")
    assert "Archive: 6 rows older than" in output and "would be deleted (dry run)" in output
    assert "DLQ: 4 rows" in output and "Workers: 2 rows" in output
    assert (JobsArchive.objects.count(), JobsDLQ.objects.count(), Workers.objects.count()) == (12, 8, 3)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(CommandError, match="archive_days must be > 0"):
        run("--archive-days", "0")


def test_in_worker_run_waits_for_its_interval(history: dict[str, Any], chokaq_settings: Any) -> None:
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "RETENTION": {"ARCHIVE_DAYS": 7, "INTERVAL": 3600}}
    state: dict[str, float] = {}
    assert maintenance.run_cleanup_if_due(state) is None  # the first run is one interval after start
    assert JobsArchive.objects.count() == 12
    state["cleanup_due"] = 0
    assert maintenance.run_cleanup_if_due(state) == {"archive": 6, "metric_buckets": 2, "workers": 2,
                                                     "history_minutes": 1, "history_hours": 1}
    assert not HistoryBuckets.objects.filter(bucket_start__lt=NOW - timedelta(hours=48)).exists()
    assert HistoryBuckets.objects.filter(granularity=60).exists(), "this run's own minute buckets are kept"
    assert maintenance.run_cleanup_if_due(state) is None
    counters_match_rows()
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "RETENTION": {"INTERVAL": None}}
    assert maintenance.run_cleanup_if_due({"cleanup_due": 0}) is None


BIG_ARCHIVE = 200_000
BIG_DLQ = 100_000


@pytest.mark.postgresql
@pytest.mark.slow
def test_cleanup_of_300k_rows_keeps_counters_equal_to_rows(chokaq_settings: Any, vendor: str) -> None:
    assert vendor == "postgresql", "the large-volume cleanup test is PostgreSQL-only (scripts/test deselects it on SQLite)"
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "SQL": {"CLEANUP_BATCH_SIZE": 2000}}
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO chokaq_jobs_archive (id, queue, type, payload, attempt_count, created_at, finished_at,"
            " duration_ms) SELECT 'A' || g, 'q' || (g %% 5), 'bulk.v1', '{}', 1, now() - interval '40 days',"
            " now() - (g %% 20) * interval '1 day', 1.5 FROM generate_series(1, %s) g", [BIG_ARCHIVE])
        cursor.execute(
            "INSERT INTO chokaq_jobs_dlq (id, queue, type, payload, failure_reason, error_details, attempt_count,"
            " created_at, failed_at) SELECT 'D' || g, 'q' || (g %% 5), 'bulk.v1', '{}', 6, 'boom', 1,"
            " now() - (g %% 20) * interval '1 day', now() FROM generate_series(1, %s) g", [BIG_DLQ])
        cursor.execute(
            "INSERT INTO chokaq_stats_summary AS s (queue, succeeded_total, failed_total, retried_total)"
            " SELECT queue, sum(a), sum(d), 0 FROM (SELECT queue, 1 AS a, 0 AS d FROM chokaq_jobs_archive"
            " UNION ALL SELECT queue, 0, 1 FROM chokaq_jobs_dlq) t GROUP BY queue"
            " ON CONFLICT (queue) DO UPDATE SET succeeded_total = EXCLUDED.succeeded_total,"
            " failed_total = EXCLUDED.failed_total")
    counters_match_rows()
    keep_archive = JobsArchive.objects.filter(finished_at__gte=NOW - timedelta(days=9, hours=12)).count()
    keep_dlq = JobsDLQ.objects.filter(created_at__gt=NOW - timedelta(days=9, hours=12)).count()
    assert 0 < keep_archive < BIG_ARCHIVE and 0 < keep_dlq < BIG_DLQ

    output = run("--archive-days", "9.5", "--dlq-days", "9.5")

    assert (JobsArchive.objects.count(), JobsDLQ.objects.count()) == (keep_archive, keep_dlq)
    deleted = BIG_ARCHIVE - keep_archive + BIG_DLQ - keep_dlq
    assert f"Archive: deleted {BIG_ARCHIVE - keep_archive} rows" in output
    assert f"DLQ: deleted {BIG_DLQ - keep_dlq} rows" in output
    assert deleted > 100_000
    counters_match_rows()


def test_progress_callback_reports_every_batch(history: dict[str, Any]) -> None:
    seen: list[tuple[str, int]] = []
    record: Callable[[str, int], None] = lambda target, n: seen.append((target, n))  # noqa: E731
    plan = maintenance.RetentionPlan(archive_days=7, dlq_days=None, metric_buckets_hours=None, worker_rows_days=None)
    assert maintenance.cleanup(plan, record) == {"archive": 6}
    assert seen == [("archive", 3), ("archive", 3)]


def test_attempts_history_lives_as_long_as_the_longer_of_archive_and_dlq(chokaq_settings: Any) -> None:
    ids = [enqueue("test.ok.v1", {"n": i}, queue="att") for i in range(3)]
    storage.fetch_batch("w1", 10, ["att"])
    try:
        raise ConnectionError("down")
    except ConnectionError as exc:
        error = AttemptError.of(exc)
    storage.complete("w1", [], [Retry(i, 1, 0.0, error) for i in ids], [])
    for job_id, age in zip(ids, (2, 10, 40), strict=True):
        JobAttempts.objects.filter(job_id=job_id).update(failed_at=NOW - timedelta(days=age))

    assert "attempts" not in maintenance.cleanup(maintenance.RetentionPlan(7, None, None, None), now=NOW)
    assert JobAttempts.objects.count() == 3
    deleted = maintenance.cleanup(maintenance.RetentionPlan(7, 30, None, None), now=NOW)

    assert deleted["attempts"] == 1
    assert sorted(JobAttempts.objects.values_list("job_id", flat=True)) == sorted(ids[:2])
    assert "JobAttempts: 1 rows older than" in run("--archive-days", "1", "--dlq-days", "5", "--dry-run")
