"""Memory mode — enqueue: row columns, queue bootstrap, idempotency, batches, atomicity (spec 01 §4.1, 03 §15)."""

from __future__ import annotations

from datetime import UTC, timedelta

import pytest
from django.db import IntegrityError

from chokaq_core import storage
from chokaq_core.domain import FailureReason, JobStatus, Success
from chokaq_core.sql import memory

from .conftest import Clock
from .rows import (
    counters,
    dead,
    fetched,
    hot,
    hot_ids,
    new_job,
    nowhere,
    of_kind,
    pending,
    processing,
)

pytestmark = pytest.mark.usefixtures("clock")


def test_memory_mode_selects_the_memory_dialect() -> None:
    assert storage.memory_mode() is True
    assert storage.dialect() is memory
    assert storage.vendor() == "memory"


def test_enqueue_writes_a_pending_row_with_every_column(clock: Clock) -> None:
    job = new_job("mail", payload='{"to":"a@b.c"}', tags="welcome,eu", priority=42, created_by="signup-view")

    assert storage.enqueue([job]) == [job.id]

    row = hot(job.id)
    assert (row.queue, row.type, row.payload, row.tags, row.priority) == (
        "mail", "test.ok.v1", '{"to":"a@b.c"}', "welcome,eu", 42)
    assert (row.status, row.attempt_count, row.created_by) == (JobStatus.PENDING, 0, "signup-view")
    assert (row.idempotency_key, row.worker_id, row.heartbeat_at, row.started_at, row.last_modified_by) == (None,) * 5
    assert row.scheduled_at is None, "no delay means NULL (due now)"
    assert row.created_at == clock.now and row.created_at.tzinfo is UTC
    assert row.last_updated_at == row.created_at


def test_enqueue_with_delay_schedules_at_now_plus_delay(clock: Clock) -> None:
    later = pending("mail", delay=120)[0]
    now = pending("mail", delay=0)[0]
    assert hot(later).scheduled_at == clock.now + timedelta(seconds=120)
    assert hot(now).scheduled_at == hot(now).created_at, "a zero delay stores a due time, not NULL"


def test_enqueue_creates_queue_and_stats_rows_for_a_new_queue() -> None:
    assert storage.queue_states() == []
    pending("brand-new")
    [state] = storage.queue_states()
    assert (state.name, state.is_paused, state.is_active, state.max_workers, state.zombie_timeout_seconds) == (
        "brand-new", False, True, None, None)
    assert counters("brand-new") == (0, 0, 0)


def test_enqueue_into_an_existing_queue_keeps_its_controls_and_counters() -> None:
    storage.set_queue_paused("kept", True)
    storage.set_queue_max_workers("kept", 3)
    storage.set_queue_paused("kept", False)
    archived_before = processing("kept", "w1")[0]
    storage.complete("w1", [Success(archived_before.id, 1.0)], [], [])
    storage.set_queue_paused("kept", True)

    pending("kept", 2)

    [state] = storage.queue_states()
    assert (state.is_paused, state.max_workers) == (True, 3)
    assert counters("kept") == (1, 0, 0)


def test_enqueue_returns_ids_in_input_order() -> None:
    jobs = [new_job("order") for _ in range(5)]
    assert storage.enqueue(list(reversed(jobs))) == [j.id for j in reversed(jobs)]


def test_enqueue_publishes_at_once(published: list) -> None:
    job = new_job("autocommit", priority=3)
    storage.enqueue([job])
    [update] = of_kind(published, "JobUpdated")
    assert (update["jobId"], update["queue"], update["status"], update["attemptCount"], update["priority"]) == (
        job.id, "autocommit", 0, 0, 3)
    assert len(of_kind(published, "StatsUpdated")) == 1


# ---------------------------------------------------------------- idempotency


def test_duplicate_key_in_hot_returns_existing_id_and_inserts_nothing(published: list) -> None:
    first = new_job("idem", key="order-1")
    storage.enqueue([first])
    published.clear()
    second = new_job("idem", key="order-1", payload='{"other":true}')

    assert storage.enqueue([second]) == [first.id]

    assert nowhere(second.id)
    assert hot_ids("idem") == {first.id}
    assert hot(first.id).payload == first.payload
    assert of_kind(published, "JobUpdated") == [], "a duplicate emits no notification"


@pytest.mark.parametrize("state", ["fetched", "processing"])
def test_key_held_by_a_running_job_still_blocks(state: str) -> None:
    holder = (fetched if state == "fetched" else processing)("idem-run", "w1", 1, key="k-run")[0]
    again = new_job("idem-run", key="k-run")
    assert storage.enqueue([again]) == [holder.id]
    assert nowhere(again.id)


def test_key_is_reusable_after_the_holder_left_hot() -> None:
    archived_holder = processing("idem", "w1", 1, key="k-arc")[0]
    storage.complete("w1", [Success(archived_holder.id, 1.0)], [], [])
    dead("idem", 1, reason=FailureReason.TRANSIENT, key="k-dlq")
    cancelled = pending("idem", key="k-cxl")[0]
    assert storage.cancel([cancelled], actor="ops") == ([cancelled], [])

    for key in ("k-arc", "k-dlq", "k-cxl"):
        again = new_job("idem", key=key)
        assert storage.enqueue([again]) == [again.id]
        assert hot(again.id).idempotency_key == key


def test_duplicate_keys_within_one_batch_store_the_first_only() -> None:
    a, b, c, d = (new_job("batch-idem", key="same"), new_job("batch-idem", key="same"), new_job("batch-idem"),
                  new_job("batch-idem", key="other"))
    assert storage.enqueue([a, b, c, d]) == [a.id, a.id, c.id, d.id]
    assert hot_ids("batch-idem") == {a.id, c.id, d.id}


def test_batch_mixing_new_rows_and_a_key_already_in_hot() -> None:
    holder = pending("batch-mix", key="taken")[0]
    fresh, dup, plain = new_job("batch-mix", key="free"), new_job("batch-mix", key="taken"), new_job("batch-mix")
    assert storage.enqueue([fresh, dup, plain]) == [fresh.id, holder, plain.id]
    assert len(hot_ids("batch-mix")) == 3


def test_duplicate_job_id_raises_integrity_error_and_stores_nothing(published: list) -> None:
    existing = pending("dup-id")[0]
    fresh = new_job("dup-id-new-queue")
    published.clear()

    with pytest.raises(IntegrityError):
        storage.enqueue([fresh, new_job("dup-id", id=existing)])

    assert nowhere(fresh.id), "the whole batch is one transaction"
    assert hot_ids() == {existing}
    assert [q.name for q in storage.queue_states()] == ["dup-id"]
    assert [s.queue for s in storage.queue_stats()] == ["dup-id"]
    assert published == []
    again = new_job("dup-id-new-queue")
    assert storage.enqueue([again]) == [again.id], "the failed call left the storage usable"


def test_enqueue_many_inserts_1200_jobs_and_resolves_keys_across_them() -> None:
    jobs = [new_job(f"bulk-{i % 3}", priority=i % 7, tags=f"t{i}") for i in range(1200)]
    assert storage.enqueue(jobs) == [j.id for j in jobs]
    assert storage.summary_stats().pending == 1200
    assert {q.name for q in storage.queue_states()} == {"bulk-0", "bulk-1", "bulk-2"}
    last = hot(jobs[-1].id)
    assert (last.queue, last.priority, last.tags) == (jobs[-1].queue, jobs[-1].priority, jobs[-1].tags)

    keyed = [new_job("chunks", key=f"k{i % 600}") for i in range(1200)]
    stored = storage.enqueue(keyed)
    assert stored == [j.id for j in keyed[:600]] * 2
    assert len(hot_ids("chunks")) == 600


def test_concurrent_enqueues_of_the_same_keys_store_one_row_per_key() -> None:
    import threading

    keys = [f"race-{i}" for i in range(40)]
    results: dict[str, list[str]] = {"a": [], "b": []}
    errors: list[BaseException] = []
    lockstep = threading.Barrier(2, timeout=30)

    def produce(name: str) -> None:
        try:
            for key in keys:
                lockstep.wait()
                results[name].extend(storage.enqueue([new_job("idem-race", key=key)]))
        except BaseException as exc:
            errors.append(exc)
            lockstep.abort()

    threads = [threading.Thread(target=produce, args=(n,)) for n in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    assert errors == []
    assert results["a"] == results["b"]
    assert hot_ids("idem-race") == set(results["a"]) and len(set(results["a"])) == len(keys)
