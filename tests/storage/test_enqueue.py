"""storage.enqueue: row columns, queue bootstrap, idempotency, batches, transactions (spec 01 §4.1, 02 §2.1, §10)."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.db import IntegrityError, connections, transaction
from django.utils import timezone

from chokaq_core import events, storage
from chokaq_core.domain import FailureReason, Success
from chokaq_core.models import JobsHot, Queues, StatsSummary

from .rows import (
    close_to,
    counters,
    dead,
    fetched,
    hot,
    new_job,
    of_kind,
    pending,
    processing,
    set_counters,
    stats,
)

# ---------------------------------------------------------------- columns


def test_enqueue_writes_a_pending_row_with_every_column() -> None:
    job = new_job("mail", type="test.ok.v1", payload='{"to":"a@b.c"}', tags="welcome,eu", priority=42,
                  created_by="signup-view")
    before = timezone.now()

    assert storage.enqueue([job]) == [job.id]

    row = hot(job.id)
    assert row is not None
    assert row["queue"] == "mail"
    assert row["type"] == "test.ok.v1"
    assert row["payload"] == '{"to":"a@b.c"}'
    assert row["tags"] == "welcome,eu"
    assert row["priority"] == 42
    assert row["status"] == 0
    assert row["attempt_count"] == 0
    assert row["created_by"] == "signup-view"
    assert row["idempotency_key"] is None
    assert row["worker_id"] is None
    assert row["heartbeat_at"] is None
    assert row["started_at"] is None
    assert row["last_modified_by"] is None
    assert row["cancel_requested_by"] is None
    assert row["scheduled_at"] is None, "no delay means NULL (due now)"
    assert close_to(row["created_at"], before)
    assert row["last_updated_at"] == row["created_at"]


def test_enqueue_stores_every_text_exactly_and_tells_null_from_the_word_null() -> None:
    """The batch travels as one JSON parameter on PostgreSQL: quotes, backslashes, non-ASCII and astral
    characters come back unchanged, a JSON null is SQL NULL while the text "null" stays text."""
    payload = '{"q":"\\"quoted\\" and \\\\ back","u":"żółć ✓ 😀"}'
    job = new_job("texts", payload=payload, tags="null,ąę,😀", created_by='o\'brien "x" \\', delay=0.25)
    other = new_job("texts", payload="null", created_by="null")

    assert storage.enqueue([job, other]) == [job.id, other.id]

    row = hot(job.id)
    assert row is not None
    assert (row["queue"], row["payload"], row["tags"], row["created_by"]) == (
        "texts", payload, "null,ąę,😀", 'o\'brien "x" \\')
    assert close_to(row["scheduled_at"], row["created_at"] + timedelta(seconds=0.25), 1)
    blank = hot(other.id)
    assert blank is not None
    assert (blank["payload"], blank["tags"], blank["created_by"], blank["scheduled_at"]) == ("null", None, "null", None)


def test_enqueue_with_delay_schedules_at_now_plus_delay() -> None:
    job = new_job("mail", delay=120)
    before = timezone.now()

    storage.enqueue([job])

    row = hot(job.id)
    assert row is not None
    assert close_to(row["scheduled_at"], before + timedelta(seconds=120))
    assert row["scheduled_at"] > row["created_at"] + timedelta(seconds=100)


def test_enqueue_with_zero_delay_stores_a_due_time_not_null() -> None:
    job = new_job("mail", delay=0)
    storage.enqueue([job])
    row = hot(job.id)
    assert row is not None and row["scheduled_at"] is not None
    assert close_to(row["scheduled_at"], row["created_at"], 1)


def test_enqueue_creates_queue_and_stats_rows_for_a_new_queue() -> None:
    assert not Queues.objects.filter(name="brand-new").exists()
    assert not StatsSummary.objects.filter(queue="brand-new").exists()

    pending("brand-new")

    queue = Queues.objects.get(name="brand-new")
    assert (queue.is_paused, queue.is_active, queue.max_workers, queue.zombie_timeout_seconds) == (
        False, True, None, None)
    assert counters("brand-new") == (0, 0, 0)


def test_enqueue_into_an_existing_queue_keeps_its_controls_and_counters() -> None:
    storage.set_queue_paused("kept", True)
    storage.set_queue_max_workers("kept", 3)
    pending("kept")
    set_counters("kept", succeeded_total=7, failed_total=2, retried_total=1)

    pending("kept", 2)

    queue = Queues.objects.get(name="kept")
    assert queue.is_paused is True
    assert queue.max_workers == 3
    assert counters("kept") == (7, 2, 1)
    assert Queues.objects.filter(name="kept").count() == 1


def test_enqueue_brings_back_the_queue_rows_of_a_known_queue_that_lost_them() -> None:
    """A queue enqueued to before whose Queues/StatsSummary rows are gone gets them again (an enqueue that skips
    the queue upserts once they exist must notice that they no longer do)."""
    pending("lost-rows")
    Queues.objects.filter(name="lost-rows").delete()
    StatsSummary.objects.filter(queue="lost-rows").delete()

    job = pending("lost-rows")[0]

    assert hot(job) is not None
    assert Queues.objects.filter(name="lost-rows").count() == 1
    assert counters("lost-rows") == (0, 0, 0)


def test_a_batch_over_a_known_and_a_new_queue_stores_every_job_and_both_queues() -> None:
    pending("known-q")
    jobs = [new_job("known-q"), new_job("new-q"), new_job("known-q")]

    assert storage.enqueue(jobs) == [j.id for j in jobs]

    assert all(hot(j.id) is not None for j in jobs)
    assert Queues.objects.filter(name__in=["known-q", "new-q"]).count() == 2
    assert counters("new-q") == (0, 0, 0)


def test_enqueue_returns_ids_in_input_order() -> None:
    jobs = [new_job("order") for _ in range(5)]
    assert storage.enqueue(list(reversed(jobs))) == [j.id for j in reversed(jobs)]


# ---------------------------------------------------------------- idempotency


def test_duplicate_key_in_hot_returns_existing_id_and_inserts_nothing(published: list) -> None:
    first = new_job("idem", key="order-1")
    storage.enqueue([first])
    published.clear()
    second = new_job("idem", key="order-1", payload='{"other":true}')

    assert storage.enqueue([second]) == [first.id]

    assert hot(second.id) is None
    assert JobsHot.objects.filter(idempotency_key="order-1").count() == 1
    assert hot(first.id)["payload"] == first.payload  # type: ignore[index]
    assert of_kind(published, "JobUpdated") == [], "a duplicate emits no notification"


@pytest.mark.parametrize("state", ["fetched", "processing"])
def test_key_held_by_a_running_job_still_blocks(state: str) -> None:
    holder = (fetched if state == "fetched" else processing)("idem-run", "w1", 1, key="k-run")[0]

    again = new_job("idem-run", key="k-run")
    assert storage.enqueue([again]) == [holder.id]
    assert hot(again.id) is None


def test_key_is_reusable_after_the_holder_was_archived() -> None:
    holder = processing("idem-arc", "w1", 1, key="k-arc")[0]
    storage.complete("w1", [Success(holder.id, 1.0)], [], [])
    assert hot(holder.id) is None

    again = new_job("idem-arc", key="k-arc")
    assert storage.enqueue([again]) == [again.id]
    row = hot(again.id)
    assert row is not None and row["idempotency_key"] == "k-arc"


def test_key_is_reusable_after_the_holder_went_to_the_dlq() -> None:
    holder_id = dead("idem-dlq", 1, reason=FailureReason.TRANSIENT, key="k-dlq")[0]
    assert hot(holder_id) is None

    again = new_job("idem-dlq", key="k-dlq")
    assert storage.enqueue([again]) == [again.id]
    assert hot(again.id) is not None


def test_key_is_reusable_after_the_holder_was_cancelled() -> None:
    holder = pending("idem-cxl", key="k-cxl")[0]
    moved, _ = storage.cancel([holder], actor="ops")
    assert moved == [holder]

    again = new_job("idem-cxl", key="k-cxl")
    assert storage.enqueue([again]) == [again.id]


def test_duplicate_keys_within_one_batch_store_the_first_only() -> None:
    a = new_job("batch-idem", key="same")
    b = new_job("batch-idem", key="same")
    c = new_job("batch-idem")
    d = new_job("batch-idem", key="other")

    assert storage.enqueue([a, b, c, d]) == [a.id, a.id, c.id, d.id]

    assert set(JobsHot.objects.filter(queue="batch-idem").values_list("id", flat=True)) == {a.id, c.id, d.id}


def test_batch_mixing_new_rows_and_a_key_already_in_hot() -> None:
    holder = pending("batch-mix", key="taken")[0]
    fresh = new_job("batch-mix", key="free")
    dup = new_job("batch-mix", key="taken")
    plain = new_job("batch-mix")

    assert storage.enqueue([fresh, dup, plain]) == [fresh.id, holder, plain.id]
    assert JobsHot.objects.filter(queue="batch-mix").count() == 3


def test_duplicate_job_id_raises_integrity_error_and_stores_nothing() -> None:
    existing = pending("dup-id")[0]
    fresh = new_job("dup-id-new-queue")
    clash = new_job("dup-id", id=existing)

    with pytest.raises(IntegrityError):
        storage.enqueue([fresh, clash])

    assert hot(fresh.id) is None, "the whole batch is one transaction"
    assert JobsHot.objects.filter(id=existing).count() == 1
    assert not Queues.objects.filter(name="dup-id-new-queue").exists()
    assert stats("dup-id-new-queue") is None


def test_duplicate_job_id_rolls_back_the_batch_whatever_the_error_class() -> None:
    """Vendor-neutral half of the test above: the batch is atomic even if the class is wrong."""
    existing = pending("dup-id2")[0]
    fresh = new_job("dup-id2")

    with pytest.raises(Exception):  # noqa: B017 - the class itself is pinned by the previous test
        storage.enqueue([fresh, new_job("dup-id2", id=existing)])

    assert hot(fresh.id) is None
    assert JobsHot.objects.filter(queue="dup-id2").count() == 1


# ---------------------------------------------------------------- batches


def test_enqueue_many_inserts_1200_jobs_in_one_call() -> None:
    jobs = [new_job(f"bulk-{i % 3}", priority=i % 7, tags=f"t{i}") for i in range(1200)]

    stored = storage.enqueue(jobs)

    assert stored == [j.id for j in jobs]
    assert JobsHot.objects.filter(queue__startswith="bulk-").count() == 1200
    assert JobsHot.objects.filter(queue__startswith="bulk-", status=0, attempt_count=0).count() == 1200
    last = jobs[-1]
    row = hot(last.id)
    assert row is not None and (row["queue"], row["priority"], row["tags"]) == (last.queue, last.priority, last.tags)
    assert set(Queues.objects.filter(name__startswith="bulk-").values_list("name", flat=True)) == {
        "bulk-0", "bulk-1", "bulk-2"}
    assert StatsSummary.objects.filter(queue__startswith="bulk-").count() == 3


def test_enqueue_many_resolves_keys_across_chunks() -> None:
    jobs = [new_job("chunks", key=f"k{i % 600}") for i in range(1200)]

    stored = storage.enqueue(jobs)

    assert stored[:600] == [j.id for j in jobs[:600]]
    assert stored[600:] == [j.id for j in jobs[:600]], "job i+600 shares job i's key"
    assert JobsHot.objects.filter(queue="chunks").count() == 600


LARGE = 300  # a batch past every vendor's form for few jobs (PostgreSQL copies 100 or more without keys or delays)


def test_a_large_batch_stores_every_text_exactly() -> None:
    """Tabs, newlines, carriage returns, backslashes, the text "\\N" and "null" are data, never separators or NULL
    markers (PostgreSQL copies such a batch as tab-separated text)."""
    odd = ["tab\there", "line\nbreak", "cr\rhere", "back\\slash \\N", "\\N", "null", "żółć ✓ 😀", 'q"uo\'te']
    jobs = [new_job(f"large-texts-{i % 2}", payload='{"v":' + json.dumps(odd[i % len(odd)]) + "}",
                    tags=odd[i % len(odd)] if i % 3 else None, created_by=odd[(i + 1) % len(odd)],
                    rate_key=f"tenant:{i % 5}" if i % 4 else None, priority=i % 9 - 4) for i in range(LARGE)]

    assert storage.enqueue(jobs) == [j.id for j in jobs]

    rows = {row["id"]: row for row in JobsHot.objects.filter(queue__startswith="large-texts-").values()}
    assert len(rows) == LARGE
    for job in jobs:
        row = rows[job.id]
        assert (row["queue"], row["type"], row["payload"], row["tags"], row["created_by"], row["rate_key"],
                row["priority"]) == (job.queue, job.type, job.payload, job.tags, job.created_by, job.rate_key,
                                     job.priority)
        assert (row["status"], row["attempt_count"], row["scheduled_at"], row["idempotency_key"]) == (0, 0, None, None)
        assert row["last_updated_at"] == row["created_at"]
    assert len({row["created_at"] for row in rows.values()}) == 1, "one moment for the batch"
    assert set(Queues.objects.filter(name__startswith="large-texts-").values_list("name", flat=True)) == {
        "large-texts-0", "large-texts-1"}
    assert stats("large-texts-0") is not None and stats("large-texts-1") is not None


def test_a_large_batch_of_values_with_nothing_to_escape_is_stored_exactly() -> None:
    """The batch PostgreSQL copies from one pre-built buffer: "null", the empty text, control characters other than
    tab/newline/CR and astral characters are data, and None is NULL."""
    plain = ["null", "", "\b\f\v", "żółć ✓ 😀", "\x01", 'q"uo\'te']
    jobs = [new_job(f"large-plain-{i % 2}", payload='{"v":"' + plain[i % len(plain)] + '"}',
                    tags=plain[i % len(plain)] if i % 3 else None, created_by=plain[(i + 1) % len(plain)] or None,
                    rate_key=f"tenant:{i % 5}" if i % 4 else None, priority=i % 9 - 4) for i in range(LARGE)]

    assert storage.enqueue(jobs) == [j.id for j in jobs]

    rows = {row["id"]: row for row in JobsHot.objects.filter(queue__startswith="large-plain-").values()}
    assert [(rows[j.id]["payload"], rows[j.id]["tags"], rows[j.id]["created_by"], rows[j.id]["rate_key"],
             rows[j.id]["priority"], rows[j.id]["type"]) for j in jobs] == [
        (j.payload, j.tags, j.created_by, j.rate_key, j.priority, j.type) for j in jobs]
    assert len({row["created_at"] for row in rows.values()}) == 1, "one moment for the batch"


def test_a_large_batch_with_a_taken_id_raises_integrity_error_and_stores_nothing() -> None:
    existing = pending("large-dup")[0]
    jobs = [new_job("large-dup-new-queue") for _ in range(LARGE)] + [new_job("large-dup", id=existing)]

    with pytest.raises(IntegrityError):
        storage.enqueue(jobs)

    assert not JobsHot.objects.filter(queue="large-dup-new-queue").exists(), "the whole batch is one transaction"
    assert not Queues.objects.filter(name="large-dup-new-queue").exists()
    assert stats("large-dup-new-queue") is None


@pytest.mark.sql_only
def test_a_large_batch_in_a_rolled_back_atomic_block_leaves_nothing_and_fires_nothing(published: list) -> None:
    jobs = [new_job("large-rollback") for _ in range(LARGE)]

    with pytest.raises(RuntimeError), transaction.atomic():
        assert storage.enqueue(jobs) == [j.id for j in jobs]
        assert JobsHot.objects.filter(queue="large-rollback").count() == LARGE, "visible inside the transaction"
        raise RuntimeError("the view failed")

    assert not JobsHot.objects.filter(queue="large-rollback").exists()
    assert not Queues.objects.filter(name="large-rollback").exists()
    assert stats("large-rollback") is None
    assert published == []


@pytest.mark.sql_only
def test_a_large_batch_publishes_one_event_per_job_after_commit(published: list) -> None:
    jobs = [new_job("large-events") for _ in range(LARGE)]

    with transaction.atomic():
        storage.enqueue(jobs)
        assert published == []

    assert [u["jobId"] for u in of_kind(published, "JobUpdated")] == [j.id for j in jobs]


# ---------------------------------------------------------------- transactions and events


def test_an_enqueue_nobody_hears_builds_no_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an in-process listener or a channel layer an event reaches no one: a batch builds none of them
    (the tests above, with a listener, get one per job)."""
    built: list[object] = []
    monkeypatch.setattr(events, "_listeners", [])
    monkeypatch.setattr(events, "_publisher", lambda: None)
    monkeypatch.setattr(events, "job_updated", lambda *args, **kwargs: built.append(args))
    jobs = [new_job("unheard") for _ in range(LARGE)]

    assert storage.enqueue(jobs) == [j.id for j in jobs]
    assert storage.enqueue([new_job("unheard")])

    assert built == []
    assert JobsHot.objects.filter(queue="unheard").count() == LARGE + 1


@pytest.mark.sql_only
def test_enqueue_in_a_rolled_back_atomic_block_leaves_nothing_and_fires_nothing(published: list) -> None:
    job = new_job("tx-rollback")

    with pytest.raises(RuntimeError), transaction.atomic():
        assert storage.enqueue([job]) == [job.id]
        assert hot(job.id) is not None, "visible inside the caller's transaction"
        raise RuntimeError("the view failed")

    assert hot(job.id) is None
    assert not Queues.objects.filter(name="tx-rollback").exists()
    assert stats("tx-rollback") is None
    assert published == []


@pytest.mark.sql_only
def test_enqueue_event_fires_after_commit_only(published: list) -> None:
    job = new_job("tx-commit", priority=3, created_by="me")

    with transaction.atomic():
        storage.enqueue([job])
        assert published == [], "nothing may be published before the caller commits"

    updates = of_kind(published, "JobUpdated")
    assert len(updates) == 1
    assert updates[0]["jobId"] == job.id
    assert updates[0]["queue"] == "tx-commit"
    assert updates[0]["status"] == 0
    assert updates[0]["attemptCount"] == 0
    assert updates[0]["priority"] == 3
    assert hot(job.id) is not None


def test_enqueue_without_a_transaction_publishes_once_committed(published: list) -> None:
    job = new_job("autocommit")
    storage.enqueue([job])
    assert [d["jobId"] for d in of_kind(published, "JobUpdated")] == [job.id]
    assert len(of_kind(published, "StatsUpdated")) == 1


def test_failed_enqueue_inside_atomic_does_not_poison_the_callers_transaction(published: list) -> None:
    existing = pending("savepoint")[0]
    before = new_job("savepoint")
    after = new_job("savepoint")
    published.clear()

    with transaction.atomic():
        storage.enqueue([before])
        with pytest.raises(Exception):  # noqa: B017 - class pinned by test_duplicate_job_id_raises_integrity_error...
            storage.enqueue([new_job("savepoint", id=existing)])
        storage.enqueue([after])

    assert hot(before.id) is not None
    assert hot(after.id) is not None
    assert sorted(d["jobId"] for d in of_kind(published, "JobUpdated")) == sorted([before.id, after.id])


def test_concurrent_enqueues_of_the_same_keys_store_one_row_per_key() -> None:
    """Two threads with their own connections race on 40 keys: each key ends with one row and one id."""
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
        finally:
            connections.close_all()

    threads = [threading.Thread(target=produce, args=(n,)) for n in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)

    assert errors == []
    assert results["a"] == results["b"], "both producers get the stored id of each key"
    assert JobsHot.objects.filter(queue="idem-race").count() == len(keys)
    assert dict(JobsHot.objects.filter(queue="idem-race").values_list("idempotency_key", "id")) == dict(
        zip(keys, results["a"], strict=True))
