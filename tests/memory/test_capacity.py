"""Memory mode — the soft cap IN_MEMORY.MAX_CAPACITY and its eviction order (spec 03 §15)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from chokaq_core import storage

from .conftest import Clock
from .rows import archive_ids, archived, counters, dead, dlq_ids, hot, hot_ids, new_job, pending

pytestmark = pytest.mark.usefixtures("clock")


def in_batches(make: Callable[..., list[str]], queue: str, batches: int, clock: Clock) -> list[list[str]]:
    """``batches`` × 100 rows, each batch finished (or failed) one second after the previous one."""
    made = []
    for _ in range(batches):
        made.append(make(queue, 100))
        clock.advance(1)
    return made


def test_the_default_cap_is_100000() -> None:
    from chokaq_core.conf import config

    assert config().IN_MEMORY.MAX_CAPACITY == 100_000


def test_below_the_cap_nothing_is_evicted(clock: Clock, capacity: Callable[[int], None]) -> None:
    kept = archived("cap", 200) + dead("cap", 98)
    capacity(300)
    pending("cap")  # 298 + 1 stored < 300 afterwards: the check found 298
    assert len(archive_ids()) == 200 and len(dlq_ids()) == 98
    assert len(kept) == 298


def test_an_enqueue_at_the_cap_evicts_the_1000_oldest_archive_rows(
    clock: Clock, capacity: Callable[[int], None]
) -> None:
    batches = in_batches(archived, "arc", 12, clock)  # 1200 Archive rows, batch k finished at t0 + k s
    failed = dead("dlq", 300)
    waiting = pending("hot", 5)
    capacity(1505)
    assert counters("arc") == (1200, 0, 0)

    job = new_job("hot")
    assert storage.enqueue([job]) == [job.id]

    assert archive_ids() == set(batches[10] + batches[11]), "the 1000 oldest by finish time are gone"
    assert dlq_ids() == set(failed), "still below the cap after the Archive eviction: the DLQ is kept"
    assert hot_ids() == {*waiting, job.id}
    assert counters("arc") == (200, 0, 0), "evictions decrement the counters like purges"
    assert counters("dlq") == (0, 300, 0)
    assert storage.summary_stats().total == 200 + 300 + 6


def test_then_the_500_oldest_dlq_rows_when_still_at_the_cap(clock: Clock, capacity: Callable[[int], None]) -> None:
    waiting = pending("hot", 1000)
    old_archive = archived("arc", 100)
    batches = in_batches(dead, "dlq", 6, clock)  # 600 DLQ rows, batch k failed at t0 + k s
    capacity(1500)  # 1000 + 100 + 600 = 1700 stored

    job = new_job("hot")
    storage.enqueue([job])

    assert archive_ids() == set(), f"all {len(old_archive)} Archive rows went first"
    assert dlq_ids() == set(batches[5]), "then the 500 oldest by failure time"
    assert hot_ids() == {*waiting, job.id}, "Hot rows are never evicted"
    assert (counters("arc"), counters("dlq")) == ((0, 0, 0), (0, 100, 0))


def test_hot_rows_are_never_evicted_and_the_cap_is_soft(capacity: Callable[[int], None]) -> None:
    capacity(10)
    ids = pending("hot", 15)
    more = pending("hot", 5)
    assert hot_ids() == set(ids + more)
    assert hot(more[0]).queue == "hot"


def test_eviction_happens_only_on_enqueue(clock: Clock, capacity: Callable[[int], None]) -> None:
    archived("arc", 20)
    capacity(10)
    assert len(archive_ids()) == 20, "completions never evict"
    pending("hot")
    assert archive_ids() == set()
