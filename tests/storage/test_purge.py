"""Purges: DLQ by ids in batches, Archive and DLQ by age, counters decremented (spec 01 §4.10)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from chokaq_core import storage
from chokaq_core.models import JobsArchive, JobsDLQ

from .rows import age, ago, all_buckets, archived, counters, dead, of_kind, purged, set_counters


@pytest.fixture
def batch_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[tuple[int, int]]]:
    """Record (batch_size, rows deleted) of every dialect purge call storage makes."""
    module = storage.dialect()
    calls: dict[str, list[tuple[int, int]]] = {}
    for name in ("purge_dlq_ids", "purge_archive", "purge_dlq_older_than"):
        original = getattr(module, name)

        def recorder(cursor: Any, arg: Any, batch_size: int, _name: str = name, _original: Any = original) -> Any:
            result = _original(cursor, arg, batch_size)
            calls.setdefault(_name, []).append((batch_size, result if isinstance(result, int) else len(result)))
            return result

        monkeypatch.setattr(module, name, recorder)
    return calls


def test_purge_dlq_ids_deletes_in_batches(small_batches: int, batch_calls: dict, published: list) -> None:
    doomed = dead("purge", 5)
    kept = dead("purge", 1)[0]
    other_queue = dead("purge-2", 2)
    assert counters("purge") == (0, 6, 0)
    snapshot = all_buckets()
    published.clear()

    purged = storage.purge_dlq_ids([*doomed, *other_queue, doomed[0], "no-such-job"])

    assert purged == 7
    assert set(JobsDLQ.objects.values_list("id", flat=True)) == {kept}
    assert counters("purge") == (0, 1, 0)
    assert counters("purge-2") == (0, 0, 0)
    assert all_buckets() == snapshot, "purges never touch buckets"
    calls = batch_calls["purge_dlq_ids"]
    assert all(size == small_batches for size, _ in calls)
    assert all(n <= small_batches for _, n in calls), "each transaction deletes at most one batch"
    assert sum(n for _, n in calls) == 7
    assert len(calls) >= 4
    [event] = of_kind(published, "JobsPurged")
    assert (event["count"], event["source"], sorted(event["jobIds"])) == (7, "DLQ", sorted([*doomed, *other_queue]))


def test_purge_dlq_ids_deletes_oldest_failures_first(small_batches: int, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = dead("purge-order", 3)
    for seconds, job_id in zip((10, 30, 20), ids, strict=True):
        JobsDLQ.objects.filter(id=job_id).update(failed_at=ago(seconds))
    module = storage.dialect()
    original = module.purge_dlq_ids
    batches: list[set[str]] = []

    def recorder(cursor: Any, job_ids: Any, batch_size: int) -> Any:
        moved = original(cursor, job_ids, batch_size)
        batches.append({i for i, _ in moved})
        return moved

    monkeypatch.setattr(module, "purge_dlq_ids", recorder)

    assert storage.purge_dlq_ids(ids) == 3
    assert batches[0] == {ids[1], ids[2]}, "the first batch takes the two oldest failures"
    assert batches[1] == {ids[0]}


def test_purge_dlq_ids_floors_failed_total_at_zero(small_batches: int) -> None:
    ids = dead("purge-floor", 3)
    set_counters("purge-floor", failed_total=1)
    assert storage.purge_dlq_ids(ids) == 3
    assert counters("purge-floor") == (0, 0, 0)


def test_purge_dlq_ids_of_nothing(published: list) -> None:
    dead("purge-none", 1)
    published.clear()
    assert storage.purge_dlq_ids(["no-such-job"]) == 0
    assert storage.purge_dlq_ids([]) == 0
    assert JobsDLQ.objects.count() == 1
    assert published == []


def test_purge_archive_by_age(small_batches: int, batch_calls: dict) -> None:
    old = archived("pa", 5)
    recent = archived("pa", 2)
    old_other = archived("pa-2", 1)
    JobsArchive.objects.filter(id__in=[*old, *old_other]).update(finished_at=ago(3 * 86400))
    snapshot = all_buckets()

    deleted = storage.purge_archive(timezone.now() - timedelta(days=1))

    assert deleted == 6
    assert set(JobsArchive.objects.values_list("id", flat=True)) == set(recent)
    assert counters("pa") == (7, 0, 0) and purged("pa") == 5, "succeeded never shrinks on purge"
    assert counters("pa-2") == (1, 0, 0) and purged("pa-2") == 1
    assert all_buckets() == snapshot
    calls = batch_calls["purge_archive"]
    assert all(size == small_batches and n <= small_batches for size, n in calls)
    assert sum(n for _, n in calls) == 6
    assert storage.purge_archive(timezone.now() - timedelta(days=1)) == 0


def test_purge_archive_keeps_rows_finished_after_the_cutoff() -> None:
    ids = archived("pa-cut", 2)
    JobsArchive.objects.filter(id=ids[0]).update(finished_at=ago(3600 + 60))
    JobsArchive.objects.filter(id=ids[1]).update(finished_at=ago(3600 - 60))
    assert storage.purge_archive(timezone.now() - timedelta(hours=1)) == 1
    assert set(JobsArchive.objects.values_list("id", flat=True)) == {ids[1]}


def test_purge_dlq_older_than_uses_creation_time(small_batches: int, batch_calls: dict) -> None:
    old = dead("pd", 3)
    young_but_failed_long_ago = dead("pd", 1)[0]
    young = dead("pd", 1)[0]
    JobsDLQ.objects.filter(id__in=old).update(created_at=ago(10 * 86400))
    JobsDLQ.objects.filter(id=young_but_failed_long_ago).update(failed_at=ago(10 * 86400))

    purged = storage.purge_dlq_older_than(timezone.now() - timedelta(days=7))

    assert purged == 3
    assert set(JobsDLQ.objects.values_list("id", flat=True)) == {young, young_but_failed_long_ago}
    assert counters("pd") == (0, 2, 0)
    assert sum(n for _, n in batch_calls["purge_dlq_older_than"]) == 3
    assert all(n <= small_batches for _, n in batch_calls["purge_dlq_older_than"])


@pytest.mark.parametrize("micro", [0, 499_999, 999_499, 999_500, 999_999])
def test_the_aging_helper_moves_every_timestamp_by_whole_seconds(micro: int) -> None:
    """``rows.age`` (which every age-based test leans on) moves a stamp whatever its fraction: on SQLite a
    fraction of .9995 s or more once left the row where it was, so an ordering by age came out wrong."""
    (job_id,) = archived("ageing")
    stamp = datetime(2026, 3, 1, 23, 59, 59, micro, tzinfo=UTC)
    JobsArchive.objects.filter(id=job_id).update(finished_at=stamp)
    age(3, [JobsArchive])
    assert JobsArchive.objects.get(id=job_id).finished_at == stamp - timedelta(seconds=3)
