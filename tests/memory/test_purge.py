"""Memory mode — purges: DLQ by ids in batches, Archive and DLQ by age, counters decremented (spec 01 §4.10)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from chokaq_core import storage

from .conftest import Clock
from .rows import archive_ids, archived, counters, dead, dlq_ids, of_kind, outcomes

pytestmark = pytest.mark.usefixtures("clock")


@pytest.fixture
def batch_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[tuple[int, Any]]]:
    """(batch_size, result) of every dialect purge call storage makes."""
    module = storage.dialect()
    calls: dict[str, list[tuple[int, Any]]] = {}
    for name in ("purge_dlq_ids", "purge_archive", "purge_dlq_older_than"):
        original = getattr(module, name)

        def recorder(cursor: Any, arg: Any, batch_size: int, _name: str = name, _original: Any = original) -> Any:
            result = _original(cursor, arg, batch_size)
            calls.setdefault(_name, []).append((batch_size, result))
            return result

        monkeypatch.setattr(module, name, recorder)
    return calls


def test_purge_dlq_ids_deletes_oldest_failures_first_in_batches(
    clock: Clock, small_batches: int, batch_calls: dict, published: list
) -> None:
    doomed = []
    for _ in range(5):
        doomed += dead("purge", 1)
        clock.advance(-10)  # each failure older than the one before
    kept = dead("purge", 1)[0]
    other_queue = dead("purge-2", 2)
    assert counters("purge") == (0, 6, 0)
    published.clear()

    assert storage.purge_dlq_ids([*doomed, *other_queue, doomed[0], "no-such-job"]) == 7

    assert dlq_ids() == {kept}
    assert (counters("purge"), counters("purge-2")) == ((0, 1, 0), (0, 0, 0))
    assert outcomes() == (0, 8), "purges never touch buckets"
    calls = batch_calls["purge_dlq_ids"]
    assert all(size == small_batches and len(moved) <= small_batches for size, moved in calls)
    # failure times: doomed[k] at -10k s, other_queue at -50 s (the clock ran backwards)
    assert [{i for i, _ in moved} for _, moved in calls] == [
        set(other_queue), {doomed[4], doomed[3]}, {doomed[2], doomed[1]}, {doomed[0]}, set()], (
        "then one empty call for the id that was never there")
    [event] = of_kind(published, "JobsPurged")
    assert (event["count"], event["source"], sorted(event["jobIds"])) == (7, "DLQ", sorted([*doomed, *other_queue]))
    assert storage.purge_dlq_ids(["no-such-job"]) == 0 and storage.purge_dlq_ids([]) == 0


def test_purge_archive_by_age(clock: Clock, small_batches: int, batch_calls: dict) -> None:
    old = archived("pa", 5) + archived("pa-2", 1)
    clock.advance(3 * 86400)
    recent = archived("pa", 2)

    assert storage.count_archive_older_than(clock.now - timedelta(days=1)) == 6
    assert storage.purge_archive(clock.now - timedelta(days=1)) == 6

    assert archive_ids() == set(recent)
    assert (counters("pa"), counters("pa-2")) == ((2, 0, 0), (0, 0, 0))
    calls = batch_calls["purge_archive"]
    assert all(size == small_batches and n <= small_batches for size, n in calls)
    assert sum(n for _, n in calls) == len(old)
    assert storage.purge_archive(clock.now - timedelta(days=1)) == 0


def test_purge_archive_keeps_rows_finished_at_or_after_the_cutoff(clock: Clock) -> None:
    first = archived("pa-cut", 1)[0]
    cutoff = clock.now
    archived("pa-cut", 1)
    clock.advance(1)
    last = archived("pa-cut", 1)[0]
    assert storage.purge_archive(cutoff + timedelta(microseconds=1)) == 2
    assert archive_ids() == {last}
    assert storage.get_archived(first) is None


def test_purge_dlq_older_than_uses_creation_time_inclusive(clock: Clock, small_batches: int) -> None:
    old = dead("pd", 3)
    cutoff = clock.now
    clock.advance(86400)
    young = dead("pd", 1)[0]

    assert storage.count_dlq_older_than(cutoff) == 3
    assert storage.purge_dlq_older_than(cutoff) == 3, "created_at <= cutoff"
    assert dlq_ids() == {young}
    assert counters("pd") == (0, 1, 0)
    assert all(storage.get_dead(i) is None for i in old)


def test_purge_archive_ids(published: list) -> None:
    ids = archived("pai", 3)
    published.clear()
    assert storage.purge_archive_ids([ids[0], ids[0], "no-such-job"]) == 1
    assert archive_ids() == set(ids[1:])
    assert counters("pai") == (2, 0, 0)
    [event] = of_kind(published, "JobsPurged")
    assert (event["source"], event["jobIds"]) == ("Archive", [ids[0]])
