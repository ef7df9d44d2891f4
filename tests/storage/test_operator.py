"""Operator commands: cancel, resurrect, edits (spec 01 §4.6-§4.9, §4.16, 02 §8, §11)."""

from __future__ import annotations

import pytest
from django.db import IntegrityError
from django.utils import timezone

from chokaq_core import storage
from chokaq_core.domain import Failure, FailureReason, Retry
from chokaq_core.models import JobsDLQ, JobsHot

from .rows import (
    all_buckets,
    buckets,
    close_to,
    counters,
    dead,
    dlq_row,
    fetched,
    hot,
    new_job,
    of_kind,
    pending,
    processing,
    set_counters,
)

# ---------------------------------------------------------------- cancel


def test_cancel_moves_pending_and_fetched_rows_to_the_dlq(published: list) -> None:
    waiting = pending("cxl", tags="t")[0]
    buffered = fetched("cxl-f", "w1")[0]
    JobsHot.objects.filter(id=buffered.id).update(queue="cxl")
    before = {job_id: hot(job_id) for job_id in (waiting, buffered.id)}
    now = timezone.now()
    published.clear()

    moved, flagged = storage.cancel([waiting, buffered.id, "no-such-job"], actor="alice")

    assert sorted(moved) == sorted([waiting, buffered.id])
    assert flagged == []
    for job_id in (waiting, buffered.id):
        assert hot(job_id) is None
        row = dlq_row(job_id)
        assert row is not None
        assert row["failure_reason"] == int(FailureReason.CANCELLED) == 1
        assert row["error_details"] == "Cancelled by admin: alice"
        assert row["last_modified_by"] == "alice"
        assert row["attempt_count"] == 0
        assert row["created_at"] == before[job_id]["created_at"]  # type: ignore[index]
        assert close_to(row["failed_at"], now)
    assert dlq_row(buffered.id)["worker_id"] == "w1"  # type: ignore[index]
    assert dlq_row(waiting)["tags"] == "t"  # type: ignore[index]
    assert counters("cxl") == (0, 2, 0)
    assert buckets("cxl", 1, int(FailureReason.CANCELLED))["completed"] == 2
    assert sorted((d["jobId"], d["reason"]) for d in of_kind(published, "JobFailed")) == sorted(
        [(waiting, "Cancelled"), (buffered.id, "Cancelled")])
    assert storage.mark_processing(buffered, "w1") is None, "the buffered copy fails its lease gate"


def test_cancel_only_flags_processing_rows() -> None:
    running = processing("cxl-run", "w1")[0]
    other = processing("cxl-run-2", "w2")[0]

    moved, flagged = storage.cancel([running.id], actor="bob")

    assert (moved, flagged) == ([], [running.id])
    row = hot(running.id)
    assert row is not None
    assert (row["status"], row["worker_id"], row["cancel_requested_by"]) == (2, "w1", "bob")
    assert dlq_row(running.id) is None
    assert counters("cxl-run") == (0, 0, 0)
    assert storage.cancel_requests("w1") == [(running.id, "bob")]
    assert storage.cancel_requests("w2") == []
    assert hot(other.id)["cancel_requested_by"] is None  # type: ignore[index]


def test_cancel_of_a_mixed_selection() -> None:
    waiting = pending("cxl-mix")[0]
    running = processing("cxl-mix-r", "w1")[0]

    moved, flagged = storage.cancel([waiting, running.id], actor="carol")

    assert (moved, flagged) == ([waiting], [running.id])
    assert storage.cancel_requests("w1") == [(running.id, "carol")]


def test_cancel_requests_lists_only_processing_rows_of_the_worker() -> None:
    running = processing("cxl-req", "w1")[0]
    storage.cancel([running.id], actor="dave")
    assert storage.cancel_requests("w1") == [(running.id, "dave")]
    storage.complete("w1", [], [], [Failure(running.id, FailureReason.CANCELLED, "Cancelled by admin: dave")])
    assert storage.cancel_requests("w1") == []


def test_a_cancel_request_does_not_survive_a_reschedule() -> None:
    """The flag targets one execution: once the row is back to Pending, its next run must not inherit it."""
    running = processing("cxl-retry", "w1")[0]
    storage.cancel([running.id], actor="dave")
    storage.complete("w1", [], [Retry(running.id, 1, 0.0)], [])

    row = hot(running.id)
    assert row is not None and row["status"] == 0
    assert row["cancel_requested_by"] is None
    [again] = storage.fetch_batch("w2", 5, ["cxl-retry"])
    assert storage.mark_processing(again, "w2") == 2
    assert storage.cancel_requests("w2") == []


# ---------------------------------------------------------------- resurrect


def _dead_job(queue: str, **fields: object) -> tuple[str, dict]:
    job_id = dead(queue, 1, reason=FailureReason.TRANSIENT, details="exhausted", **fields)[0]
    row = dlq_row(job_id)
    assert row is not None
    return job_id, row


def test_resurrect_returns_a_dlq_row_to_hot_pending(published: list) -> None:
    job_id, before = _dead_job("res", priority=50, key="res-key", tags="a,b", created_by="producer",
                               payload='{"v":1}')
    assert counters("res") == (0, 1, 0)
    snapshot = all_buckets()
    now = timezone.now()
    published.clear()

    assert storage.resurrect(job_id, actor="bob") is True

    assert dlq_row(job_id) is None
    row = hot(job_id)
    assert row is not None
    assert (row["status"], row["attempt_count"], row["idempotency_key"]) == (0, 0, None)
    assert row["priority"] == 10, "original priority is not known: default 10"
    assert (row["payload"], row["tags"], row["type"], row["queue"]) == ('{"v":1}', "a,b", before["type"], "res")
    assert row["created_at"] == before["created_at"]
    assert row["created_by"] == "producer"
    assert row["last_modified_by"] == "bob"
    assert (row["worker_id"], row["heartbeat_at"], row["started_at"], row["scheduled_at"]) == (None,) * 4
    assert row["cancel_requested_by"] is None
    assert close_to(row["last_updated_at"], now)
    assert counters("res") == (0, 0, 0)
    assert all_buckets() == snapshot, "resurrection never changes buckets"
    assert [d["jobId"] for d in of_kind(published, "JobResurrected")] == [job_id]
    assert [j.id for j in storage.fetch_batch("w2", 5, ["res"])] == [job_id], "claimable at once"


def test_a_job_keeps_its_rate_key_through_the_dlq_and_back() -> None:
    """A per-key rate limit's partition stays the job's: failed or cancelled, then resurrected (in a batch, edited)."""
    failed = dead("rk", rate_key="tenant:7")[0]
    cancelled = pending("rk", rate_key="tenant:8")[0]
    assert storage.cancel([cancelled], actor="ops")[0] == [cancelled]
    edited = dead("rk", rate_key="tenant:9")[0]

    assert (dlq_row(failed) or {})["rate_key"] == "tenant:7"
    assert (dlq_row(cancelled) or {})["rate_key"] == "tenant:8"
    assert storage.resurrect_batch([failed, cancelled], actor="ops") == 2
    assert storage.resurrect(edited, payload='{"fixed": 1}', actor="ops") is True

    assert [(hot(i) or {}).get("rate_key") for i in (failed, cancelled, edited)] == ["tenant:7", "tenant:8",
                                                                                     "tenant:9"]


def test_resurrect_applies_edits() -> None:
    job_id, _ = _dead_job("res-edit", tags="old")

    assert storage.resurrect(job_id, payload='{"fixed":true}', tags="repaired", priority=99, actor="eve")

    row = hot(job_id)
    assert row is not None
    assert (row["payload"], row["tags"], row["priority"], row["last_modified_by"]) == (
        '{"fixed":true}', "repaired", 99, "eve")


def test_resurrect_twice_moves_once_and_decrements_once() -> None:
    job_id, _ = _dead_job("res-twice")
    _dead_job("res-twice")
    assert counters("res-twice") == (0, 2, 0)

    assert storage.resurrect(job_id, actor="a") is True
    assert storage.resurrect(job_id, actor="b") is False

    assert counters("res-twice") == (0, 1, 0)
    assert hot(job_id)["last_modified_by"] == "a"  # type: ignore[index]
    assert JobsHot.objects.filter(id=job_id).count() == 1


def test_resurrect_of_a_missing_id_is_false(published: list) -> None:
    assert storage.resurrect("no-such-job", actor="x") is False
    assert published == []


def test_resurrect_floors_failed_total_at_zero() -> None:
    job_id, _ = _dead_job("res-floor")
    set_counters("res-floor", failed_total=0)
    assert storage.resurrect(job_id, actor="x") is True
    assert counters("res-floor") == (0, 0, 0)


def test_resurrected_job_frees_its_old_idempotency_key() -> None:
    job_id, _ = _dead_job("res-key", key="k-res")
    storage.resurrect(job_id, actor="x")
    again = new_job("res-key", key="k-res")
    assert storage.enqueue([again]) == [again.id], "resurrected rows carry no key"


def test_resurrect_batch_moves_each_listed_row_once() -> None:
    ids = dead("res-batch", 3, priority=70)
    keep = dead("res-batch", 1)[0]
    assert counters("res-batch") == (0, 4, 0)
    snapshot = all_buckets()

    moved = storage.resurrect_batch([*ids, ids[0], "no-such-job"], actor="ops")

    assert moved == 3
    for job_id in ids:
        row = hot(job_id)
        assert row is not None
        assert (row["status"], row["attempt_count"], row["priority"], row["last_modified_by"]) == (0, 0, 10, "ops")
    assert dlq_row(keep) is not None
    assert counters("res-batch") == (0, 1, 0)
    assert all_buckets() == snapshot
    assert storage.resurrect_batch(ids, actor="ops") == 0


# ---------------------------------------------------------------- edits


def test_update_hot_data_edits_a_pending_row() -> None:
    job_id = pending("edit", payload='{"a":1}', tags="t", priority=5)[0]
    now = timezone.now()

    assert storage.update_hot_data(job_id, payload='{"a":2}', actor="ed") is True
    row = hot(job_id)
    assert row is not None
    assert (row["payload"], row["tags"], row["priority"], row["last_modified_by"]) == ('{"a":2}', "t", 5, "ed")
    assert close_to(row["last_updated_at"], now)

    assert storage.update_hot_data(job_id, tags="u", priority=77, actor="fay") is True
    row = hot(job_id)
    assert (row["payload"], row["tags"], row["priority"], row["last_modified_by"]) == (  # type: ignore[index]
        '{"a":2}', "u", 77, "fay")


def test_update_hot_data_with_nothing_to_change_is_false() -> None:
    job_id = pending("edit-none")[0]
    before = hot(job_id)
    assert storage.update_hot_data(job_id, actor="ed") is False
    assert hot(job_id) == before


def test_update_hot_data_refuses_processing_and_fetched_rows() -> None:
    running = processing("edit-run", "w1")[0]
    buffered = fetched("edit-f", "w1")[0]
    before = {j.id: hot(j.id) for j in (running, buffered)}

    assert storage.update_hot_data(running.id, payload='{"x":1}', priority=1, actor="ed") is False
    assert storage.update_hot_data(buffered.id, payload='{"x":1}', actor="ed") is False
    assert storage.update_hot_data("no-such-job", payload='{"x":1}', actor="ed") is False

    assert {j.id: hot(j.id) for j in (running, buffered)} == before


def test_update_dlq_data_keeps_the_previous_payload() -> None:
    job_id, before = _dead_job("edit-dlq", payload='{"v":1}', tags="t")
    assert before["previous_payload"] is None

    assert storage.update_dlq_data(job_id, payload='{"v":2}', actor="ed") is True
    row = dlq_row(job_id)
    assert row is not None
    assert (row["payload"], row["previous_payload"], row["tags"], row["last_modified_by"]) == (
        '{"v":2}', '{"v":1}', "t", "ed")

    assert storage.update_dlq_data(job_id, tags="u", actor="fay") is True
    row = dlq_row(job_id)
    assert (row["payload"], row["previous_payload"], row["tags"], row["last_modified_by"]) == (  # type: ignore[index]
        '{"v":2}', '{"v":1}', "u", "fay"), "a tags-only edit keeps the previous payload"

    assert storage.update_dlq_data(job_id, payload='{"v":3}', actor="gus") is True
    assert (dlq_row(job_id)["payload"], dlq_row(job_id)["previous_payload"]) == (  # type: ignore[index]
        '{"v":3}', '{"v":2}')
    assert row["failure_reason"] == before["failure_reason"]  # type: ignore[index]
    assert counters("edit-dlq") == (0, 1, 0)


def test_update_dlq_data_with_the_same_payload_keeps_the_older_previous_payload() -> None:
    job_id, _ = _dead_job("edit-dlq-same", payload='{"v":1}')
    storage.update_dlq_data(job_id, payload='{"v":2}', actor="ed")
    assert storage.update_dlq_data(job_id, payload='{"v":2}', actor="ed") is True
    row = dlq_row(job_id)
    assert (row["payload"], row["previous_payload"]) == ('{"v":2}', '{"v":1}')  # type: ignore[index]


def test_update_dlq_data_with_nothing_or_a_missing_row_is_false() -> None:
    job_id, before = _dead_job("edit-dlq-none")
    assert storage.update_dlq_data(job_id, actor="ed") is False
    assert dlq_row(job_id) == before
    assert storage.update_dlq_data("no-such-job", payload="{}", actor="ed") is False
    assert JobsDLQ.objects.count() == 1


def test_cancel_without_an_actor_uses_the_batch_text() -> None:
    job_id = pending("cxl-batch")[0]
    storage.run(lambda cursor: storage.dialect().cancel_batch(cursor, [job_id], None))
    assert dlq_row(job_id)["error_details"] == "Cancelled by admin (Batch)"  # type: ignore[index]


def test_a_resurrect_onto_an_id_hot_holds_again_fails_and_changes_nothing() -> None:
    job_id = dead("res-clash", 1)[0]
    pending("res-clash", id=job_id)  # Hot's primary key is the only check at enqueue
    with pytest.raises(IntegrityError):
        storage.resurrect(job_id, actor="x")
    assert dlq_row(job_id)["queue"] == "res-clash"  # type: ignore[index]
    assert counters("res-clash") == (0, 1, 0)


# ---------------------------------------------------------------- edit versions (no lost updates)


def test_a_versioned_edit_applies_once_and_a_stale_one_changes_nothing() -> None:
    job_id = pending("rev-hot", payload='{"v":0}')[0]
    seen = hot(job_id)["revision"]  # type: ignore[index]

    assert storage.update_hot_data(job_id, payload='{"v":2}', actor="two", revision=seen) is True
    assert storage.update_hot_data(job_id, payload='{"v":1}', actor="one", revision=seen) is False
    row = hot(job_id)
    assert (row["payload"], row["last_modified_by"], row["revision"]) == ('{"v":2}', "two", seen + 1)  # type: ignore[index]
    assert storage.update_hot_data(job_id, priority=3, actor="ops") is True, "an unversioned command still applies"
    assert hot(job_id)["revision"] == seen + 2  # type: ignore[index]

    dead_id = dead("rev-dlq", payload='{"v":0}')[0]
    at = dlq_row(dead_id)["revision"]  # type: ignore[index]
    assert storage.update_dlq_data(dead_id, tags="two", actor="two", revision=at) is True
    assert storage.update_dlq_data(dead_id, payload='{"v":1}', actor="one", revision=at) is False
    assert (dlq_row(dead_id)["payload"], dlq_row(dead_id)["tags"]) == ('{"v":0}', "two")  # type: ignore[index]


def test_a_stale_resurrect_changes_nothing_and_moves_carry_the_revision_up() -> None:
    job = processing("rev-move", "w1")[0]
    assert job.revision == 0
    storage.complete("w1", [], [], [Failure(job.id, FailureReason.FATAL_ERROR, "boom")])
    assert dlq_row(job.id)["revision"] == 1, "Hot → DLQ: one up"  # type: ignore[index]

    assert storage.resurrect(job.id, payload='{"stale":true}', actor="one", revision=0) is False
    assert dlq_row(job.id)["payload"] == job.payload and counters("rev-move") == (0, 1, 0)  # type: ignore[index]
    assert storage.resurrect(job.id, payload='{"fresh":true}', actor="two", revision=1) is True
    row = hot(job.id)
    assert (row["payload"], row["revision"]) == ('{"fresh":true}', 2), "DLQ → Hot: one up"  # type: ignore[index]
    assert storage.update_dlq_data(job.id, payload="{}", actor="one", revision=1) is False
    assert storage.update_hot_data(job.id, payload="{}", actor="one", revision=1) is False, (
        "the editor opened on the DLQ row cannot overwrite the retried job")
    assert storage.get_hot(job.id).revision == 2  # type: ignore[union-attr]
