"""Memory mode — operator commands: cancel, resurrect, edits (spec 01 §4.6-§4.9, §4.16, 02 §8, §11)."""

from __future__ import annotations

import pytest

from chokaq_core import storage
from chokaq_core.domain import Failure, FailureReason, JobStatus

from .conftest import Clock
from .rows import counters, dead, dlq_ids, dlq_row, fetched, hot, new_job, of_kind, outcomes, pending, processing

pytestmark = pytest.mark.usefixtures("clock")


# ---------------------------------------------------------------- cancel


def test_cancel_moves_pending_and_fetched_rows_to_the_dlq(clock: Clock, published: list) -> None:
    waiting = pending("cxl", tags="t")[0]
    buffered = fetched("cxl-f", "w1")[0]
    created = {waiting: hot(waiting).created_at, buffered.id: buffered.created_at}
    clock.advance(1)
    published.clear()

    moved, flagged = storage.cancel([waiting, buffered.id, "no-such-job"], actor="alice")

    assert sorted(moved) == sorted([waiting, buffered.id]) and flagged == []
    for job_id in (waiting, buffered.id):
        assert storage.get_hot(job_id) is None
        row = dlq_row(job_id)
        assert (row.failure_reason, row.error_details, row.last_modified_by) == (
            FailureReason.CANCELLED, "Cancelled by admin: alice", "alice")
        assert (row.attempt_count, row.created_at, row.failed_at) == (0, created[job_id], clock.now)
    assert (dlq_row(buffered.id).worker_id, dlq_row(waiting).tags) == ("w1", "t")
    assert (counters("cxl"), counters("cxl-f")) == ((0, 1, 0), (0, 1, 0))
    assert outcomes() == (0, 2)
    assert sorted((d["jobId"], d["reason"]) for d in of_kind(published, "JobFailed")) == sorted(
        [(waiting, "Cancelled"), (buffered.id, "Cancelled")])
    assert storage.locate_jobs([waiting]) == {waiting: JobStatus.CANCELLED}
    assert storage.mark_processing(buffered, "w1") is None, "the buffered copy fails its lease gate"


def test_cancel_only_flags_processing_rows() -> None:
    running = processing("cxl-run", "w1")[0]
    other = processing("cxl-run-2", "w2")[0]
    waiting = pending("cxl-run")[0]

    moved, flagged = storage.cancel([waiting, running.id], actor="bob")

    assert (moved, flagged) == ([waiting], [running.id])
    row = hot(running.id)
    assert (row.status, row.worker_id) == (JobStatus.PROCESSING, "w1")
    assert counters("cxl-run") == (0, 1, 0)
    assert storage.cancel_requests("w1") == [(running.id, "bob")]
    assert storage.cancel_requests("w2") == []
    storage.complete("w1", [], [], [Failure(running.id, FailureReason.CANCELLED, "Cancelled by admin: bob")])
    assert storage.cancel_requests("w1") == []
    assert hot(other.id).status == JobStatus.PROCESSING


def test_cancel_without_an_actor_uses_the_batch_text() -> None:
    job_id = pending("cxl-batch")[0]
    storage.dialect().cancel_batch(None, [job_id], None)
    assert dlq_row(job_id).error_details == "Cancelled by admin (Batch)"


# ---------------------------------------------------------------- resurrect


def test_resurrect_returns_a_dlq_row_to_hot_pending(clock: Clock, published: list) -> None:
    job_id = dead("res", 1, priority=50, key="res-key", tags="a,b", created_by="producer", payload='{"v":1}')[0]
    before = dlq_row(job_id)
    assert counters("res") == (0, 1, 0)
    clock.advance(1)
    published.clear()

    assert storage.resurrect(job_id, actor="bob") is True

    assert storage.get_dead(job_id) is None
    row = hot(job_id)
    assert (row.status, row.attempt_count, row.idempotency_key, row.priority) == (0, 0, None, 10)
    assert (row.payload, row.tags, row.type, row.queue) == ('{"v":1}', "a,b", before.type, "res")
    assert (row.created_at, row.created_by, row.last_modified_by) == (before.created_at, "producer", "bob")
    assert (row.worker_id, row.heartbeat_at, row.started_at, row.scheduled_at) == (None,) * 4
    assert row.last_updated_at == clock.now
    assert counters("res") == (0, 0, 0)
    assert outcomes() == (0, 1), "resurrection never changes buckets"
    assert [d["jobId"] for d in of_kind(published, "JobResurrected")] == [job_id]
    assert [j.id for j in storage.fetch_batch("w2", 5, ["res"])] == [job_id], "claimable at once"
    again = new_job("res", key="res-key")
    assert storage.enqueue([again]) == [again.id], "resurrected rows carry no idempotency key"


def test_resurrect_applies_edits_and_moves_once() -> None:
    job_id = dead("res-edit", 1, tags="old")[0]
    dead("res-edit", 1)

    assert storage.resurrect(job_id, payload='{"fixed":true}', tags="repaired", priority=99, actor="eve") is True
    assert storage.resurrect(job_id, actor="b") is False
    assert storage.resurrect("no-such-job", actor="x") is False

    row = hot(job_id)
    assert (row.payload, row.tags, row.priority, row.last_modified_by) == ('{"fixed":true}', "repaired", 99, "eve")
    assert counters("res-edit") == (0, 1, 0)


def test_resurrect_batch_moves_each_listed_row_once() -> None:
    ids = dead("res-batch", 3, priority=70)
    keep = dead("res-batch", 1)[0]

    assert storage.resurrect_batch([*ids, ids[0], "no-such-job"], actor="ops") == 3

    for job_id in ids:
        row = hot(job_id)
        assert (row.status, row.attempt_count, row.priority, row.last_modified_by) == (0, 0, 10, "ops")
    assert dlq_ids() == {keep}
    assert counters("res-batch") == (0, 1, 0)
    assert storage.resurrect_batch(ids, actor="ops") == 0


def test_a_resurrect_onto_an_id_hot_holds_again_fails_and_changes_nothing() -> None:
    job_id = dead("res-clash", 1)[0]
    pending("res-clash", id=job_id)  # Hot's primary key is the only check at enqueue
    with pytest.raises(Exception):  # noqa: B017 - IntegrityError, as the SQL modes raise
        storage.resurrect(job_id, actor="x")
    assert dlq_row(job_id).queue == "res-clash"
    assert counters("res-clash") == (0, 1, 0)


# ---------------------------------------------------------------- edits


def test_update_hot_data_edits_only_pending_rows(clock: Clock) -> None:
    job_id = pending("edit", payload='{"a":1}', tags="t", priority=5)[0]
    running = processing("edit-run", "w1")[0]
    buffered = fetched("edit-f", "w1")[0]
    clock.advance(1)

    assert storage.update_hot_data(job_id, payload='{"a":2}', actor="ed") is True
    row = hot(job_id)
    assert (row.payload, row.tags, row.priority, row.last_modified_by, row.last_updated_at) == (
        '{"a":2}', "t", 5, "ed", clock.now)
    assert storage.update_hot_data(job_id, tags="u", priority=77, actor="fay") is True
    row = hot(job_id)
    assert (row.payload, row.tags, row.priority, row.last_modified_by) == ('{"a":2}', "u", 77, "fay")

    before = {j: hot(j) for j in (job_id, running.id, buffered.id)}
    assert storage.update_hot_data(job_id, actor="ed") is False
    assert storage.update_hot_data(running.id, payload='{"x":1}', priority=1, actor="ed") is False
    assert storage.update_hot_data(buffered.id, payload='{"x":1}', actor="ed") is False
    assert storage.update_hot_data("no-such-job", payload='{"x":1}', actor="ed") is False
    assert {j: hot(j) for j in before} == before


def test_update_dlq_data_keeps_the_previous_payload() -> None:
    job_id = dead("edit-dlq", 1, payload='{"v":1}', tags="t")[0]
    assert storage.dialect().get_dead(None, job_id).failure_reason == FailureReason.FATAL_ERROR

    assert storage.update_dlq_data(job_id, payload='{"v":2}', actor="ed") is True
    row = dlq_row(job_id)
    assert (row.payload, row.tags, row.last_modified_by) == ('{"v":2}', "t", "ed")
    assert storage.update_dlq_data(job_id, tags="u", actor="fay") is True
    assert storage.update_dlq_data(job_id, payload='{"v":2}', actor="gus") is True, "same payload: still a match"
    assert storage.update_dlq_data(job_id, payload='{"v":3}', actor="gus") is True
    assert storage.update_dlq_data(job_id, actor="ed") is False
    assert storage.update_dlq_data("no-such-job", payload="{}", actor="ed") is False
    # previous_payload is no storage read: it comes back with a repair through the module's table
    stored = storage.dialect()._db.dlq[job_id]
    assert (stored.payload, stored.previous_payload, stored.tags) == ('{"v":3}', '{"v":2}', "u")
    assert counters("edit-dlq") == (0, 1, 0)
