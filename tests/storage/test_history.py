"""History roll-ups: minute and hour buckets counted by the transactions that move rows, read back O(buckets).

Every move that ends a job (archive, DLQ move, cancel, zombie sweep) counts it in the minute and the hour
bucket of its queue and type, successes with their duration in the histogram bins, in the same transaction;
a row that did not move (lost ownership) counts nothing; retries, resurrections and purges change nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db.models import Sum
from django.utils import timezone

from chokaq_core import storage
from chokaq_core.domain import DURATION_BINS, Failure, FailureReason, Retry, Success, duration_bin
from chokaq_core.models import HistoryBuckets
from chokaq_core.sql.base import HISTORY_BIN_COLUMNS

from .plans import RecordingCursor
from .rows import archived, backdate, dead, pending, processing

MINUTE, HOUR = 60, 3600
LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)


def rows(granularity: int, **filters: object) -> list[dict]:
    return list(HistoryBuckets.objects.filter(granularity=granularity, **filters)
                .order_by("queue", "type", "outcome", "bucket_start").values())


def bins_of(row: dict) -> list[int]:
    return [row[c] for c in HISTORY_BIN_COLUMNS]


def expected_bins(durations: list[float]) -> list[int]:
    counts = Counter(duration_bin(d) for d in durations)
    return [counts.get(i, 0) for i in range(DURATION_BINS)]


def test_a_completion_counts_its_outcomes_per_type_in_the_minute_and_the_hour_bucket() -> None:
    fast = processing("hist", "w1", 3, type="test.fast.v1")
    slow = processing("hist", "w1", 2, type="test.slow.v1")
    failing = processing("hist", "w1", 2, type="test.fast.v1")
    durations = {fast[0].id: 0.5, fast[1].id: 3.0, fast[2].id: 3.5, slow[0].id: 1500.0, slow[1].id: 4_000_000.0}
    storage.complete("w1", [Success(i, d) for i, d in durations.items()], [],
                     [Failure(j.id, FailureReason.FATAL_ERROR, "boom") for j in failing])

    for granularity in (MINUTE, HOUR):
        found = {(r["type"], r["outcome"]): r for r in rows(granularity, queue="hist")}
        assert set(found) == {("test.fast.v1", 0), ("test.slow.v1", 0), ("test.fast.v1", 1)}
        ok_fast, ok_slow, failed = found["test.fast.v1", 0], found["test.slow.v1", 0], found["test.fast.v1", 1]
        assert (ok_fast["completed_count"], ok_fast["duration_count"], ok_fast["total_duration_ms"]) == (3, 3, 7.0)
        assert bins_of(ok_fast) == expected_bins([0.5, 3.0, 3.5]) and ok_fast["max_duration_ms"] == 3.5
        assert bins_of(ok_slow) == expected_bins([1500.0, 4_000_000.0]), "the last bin is open-ended"
        assert ok_slow["max_duration_ms"] == 4_000_000.0
        assert (failed["completed_count"], failed["duration_count"], sum(bins_of(failed))) == (2, 0, 0)
        assert failed["max_duration_ms"] is None
    minute_start = rows(MINUTE)[0]["bucket_start"]
    hour_start = rows(HOUR)[0]["bucket_start"]
    assert (minute_start.second, minute_start.microsecond) == (0, 0)
    assert (hour_start.minute, hour_start.second) == (0, 0) and hour_start <= minute_start


def test_later_completions_add_to_the_same_buckets() -> None:
    archived("add", 2, duration_ms=10.0)
    archived("add", 1, duration_ms=700.0)
    archived("add", 1, duration_ms=None)  # no duration: counted, not timed
    dead("add", 1)
    for granularity in (MINUTE, HOUR):
        ok, failed = rows(granularity, queue="add", outcome=0), rows(granularity, queue="add", outcome=1)
        total = {k: sum(r[k] for r in ok) for k in ("completed_count", "duration_count", "total_duration_ms")}
        assert total == {"completed_count": 4, "duration_count": 3, "total_duration_ms": 720.0}
        assert [sum(col) for col in zip(*(bins_of(r) for r in ok), strict=True)] == expected_bins([10, 10, 700])
        assert max(r["max_duration_ms"] for r in ok) == 700.0
        assert sum(r["completed_count"] for r in failed) == 1


def test_only_rows_that_really_moved_are_counted() -> None:
    mine = processing("own", "w1")[0]
    theirs = processing("own", "w2")[0]
    done = storage.complete("w1", [Success(mine.id, 1.0), Success(theirs.id, 1.0)], [], [])
    assert done.archived == [(mine.id, "own")]
    assert HistoryBuckets.objects.filter(granularity=MINUTE).aggregate(n=Sum("completed_count"))["n"] == 1


def test_retries_count_nothing_and_cancels_and_zombies_count_as_failures() -> None:
    retried = processing("rz", "w1")[0]
    storage.complete("w1", [], [Retry(retried.id, 1, 30.0)], [])
    assert not HistoryBuckets.objects.exists(), "a retry is not an outcome"
    waiting = pending("rz", 2)
    storage.cancel(waiting, actor="ops")
    stuck = processing("rz-z", "w3")[0]
    backdate([stuck.id], 3600, "heartbeat_at", "last_updated_at")
    assert [i for i, _ in storage.archive_zombies(600)] == [stuck.id]
    counted = {(r["queue"], r["outcome"]): r["completed_count"] for r in rows(MINUTE)}
    assert counted == {("rz", 1): 2, ("rz-z", 1): 1}


def test_purges_and_resurrections_never_change_history() -> None:
    kept = archived("pr", 2)
    failed = dead("pr", 2)
    before = sorted(map(str, HistoryBuckets.objects.values_list("completed_count", "outcome", "granularity")))
    storage.purge_archive_ids(kept[:1])
    storage.resurrect(failed[0], actor="ops")
    storage.purge_dlq_ids(failed[1:])
    storage.purge_archive(timezone.now() + timedelta(days=1))
    assert sorted(map(str, HistoryBuckets.objects.values_list("completed_count", "outcome", "granularity"))) == before


def test_the_read_sums_queues_per_bucket_and_ranks_types_by_volume() -> None:
    archived("r1", 3, duration_ms=4.0, type="test.a.v1")
    archived("r2", 1, duration_ms=400.0, type="test.a.v1")
    archived("r2", 1, duration_ms=40.0, type="test.b.v1")
    dead("r1", 2, type="test.b.v1")
    window = storage.history_buckets(MINUTE, LONG_AGO, 10)

    [point] = window.points
    assert (point.succeeded, point.failed) == (5, 2)
    assert list(point.bins) == expected_bins([4, 4, 4, 400, 40]) and point.max_ms == 400.0
    a, b = window.types
    assert (a.type, a.succeeded, a.failed, a.duration_count, a.total_duration_ms, a.max_ms) == (
        "test.a.v1", 4, 0, 4, 412.0, 400.0)
    assert (b.type, b.succeeded, b.failed, b.duration_count) == ("test.b.v1", 1, 2, 1)
    assert list(a.bins) == expected_bins([4, 4, 4, 400])
    assert a.p(0.5) is not None and 2 <= a.p(0.5) <= 5, "the median falls in the 2-5 ms bin"  # type: ignore[operator]
    assert a.p(0.95) is not None and 200 <= a.p(0.95) <= 400  # type: ignore[operator]
    assert storage.history_buckets(HOUR, LONG_AGO, 1).types == [a], "the limit keeps the busiest type"
    assert storage.history_buckets(MINUTE, timezone.now() + timedelta(minutes=2), 10).points == []


def test_the_read_starts_at_its_since_bucket() -> None:
    archived("since", 2)
    [row] = rows(HOUR)
    start = row["bucket_start"]
    assert [p.at for p in storage.history_buckets(HOUR, start - timedelta(hours=1), 5).points] == [start]
    assert [p.at for p in storage.history_buckets(HOUR, start, 5).points] == [start], "its own start is included"
    assert storage.history_buckets(HOUR, start + timedelta(hours=1), 5).points == []


def test_retention_deletes_one_granularity_older_than_its_cutoff() -> None:
    archived("ret", 3)
    HistoryBuckets.objects.filter(granularity=MINUTE).update(bucket_start=LONG_AGO)
    archived("ret", 1)  # a fresh minute bucket
    assert storage.purge_history(MINUTE, timezone.now() - timedelta(hours=1)) == 1
    assert rows(MINUTE)[0]["completed_count"] == 1 and rows(MINUTE)[0]["bucket_start"] > LONG_AGO
    assert sum(r["completed_count"] for r in rows(HOUR)) == 4, "hour buckets have their own retention"
    assert storage.purge_history(HOUR, timezone.now() - timedelta(hours=3)) == 0
    assert storage.purge_history(HOUR, timezone.now() + timedelta(hours=2)) == 1
    assert not rows(HOUR)


@pytest.mark.sql_only
def test_a_completions_statements_do_not_depend_on_how_many_jobs_it_finishes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver keeps a prepared program per statement text (SQLite's module up to 128 per connection): a text
    that named each id of the batch made the worker hold one history upsert program per batch size."""
    driver_cursor = storage._cursor

    def statements(jobs: int) -> set[str]:
        successes = [Success(j.id, 5.0) for j in processing("texts", "w-texts", jobs)]
        failures = [Failure(j.id, FailureReason.FATAL_ERROR, "boom") for j in processing("texts", "w-texts", jobs)]
        recorders: list[RecordingCursor] = []

        @contextmanager
        def recording(*args: Any, **kwargs: Any) -> Iterator[Any]:
            with driver_cursor(*args, **kwargs) as cursor:
                recorders.append(RecordingCursor(cursor))
                yield recorders[-1]

        monkeypatch.setattr(storage, "_cursor", recording)
        done = storage.complete("w-texts", successes, [], failures)
        monkeypatch.setattr(storage, "_cursor", driver_cursor)
        assert len(done.archived) == len(done.failed) == jobs
        return {sql for recorder in recorders for sql, _ in recorder.executed}

    one, three = statements(1), statements(3)
    assert any("chokaq_history_buckets" in sql for sql in one), one
    assert three == one, sorted(three ^ one)
