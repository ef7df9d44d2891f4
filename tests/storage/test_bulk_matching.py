"""Bulk-by-filter runs (the Deck's "all matching" commands): batches of ≤ 500 rows, each its own transaction,
walked with a keyset cursor; no cap; rows that begin to match after the run started, and rows that do not
match, are left alone."""

from __future__ import annotations

import pytest

from chokaq_core import events, service, storage
from chokaq_core.domain import FailureReason, JobFilter, JobStatus
from chokaq_core.models import JobsDLQ, JobsHot

from .rows import counters, dead, dlq_ids, hot_ids, pending, processing


def test_count_matching_gives_the_count_and_the_largest_matching_id() -> None:
    ids = pending("m1", 3)
    pending("m2", 2)
    assert storage.count_matching("hot", JobFilter(queue="m1")) == (3, max(ids))
    assert storage.count_matching("hot", JobFilter(queue="none")) == (0, None)
    failed = dead("m3", 2, reason=FailureReason.TIMEOUT)
    assert storage.count_matching("dlq", JobFilter(failure_reason=FailureReason.TIMEOUT)) == (2, max(failed))


def test_cancel_matching_walks_batches_newest_first_and_stops_at_the_bound() -> None:
    ids = sorted(pending("cm", 5))
    other = pending("other", 1)[0]
    total, upto = storage.count_matching("hot", JobFilter(queue="cm"))
    assert (total, upto) == (5, ids[-1])
    late = pending("cm", 1)[0]  # matches, but enqueued after the run started: beyond the bound
    first = storage.cancel_matching(JobFilter(queue="cm"), None, upto, 2, actor="ops")
    assert first.done == [ids[4], ids[3]] and first.flagged == [] and first.after == ids[3]
    second = storage.cancel_matching(JobFilter(queue="cm"), first.after, upto, 2, actor="ops")
    assert second.done == [ids[2], ids[1]] and second.after == ids[1]
    last = storage.cancel_matching(JobFilter(queue="cm"), second.after, upto, 2, actor="ops")
    assert last.done == [ids[0]] and last.after is None, "a short batch ends the run"
    assert dlq_ids() == set(ids)
    assert set(JobsDLQ.objects.values_list("failure_reason", flat=True)) == {int(FailureReason.CANCELLED)}
    assert hot_ids() == {other, late}


def test_cancel_matching_flags_running_jobs_and_honours_the_status_filter() -> None:
    running = processing("cs", "w1")[0].id
    waiting = pending("cs", 2)
    batch = storage.cancel_matching(JobFilter(queue="cs"), None, max([*waiting, running]), 500, actor="ops")
    assert sorted(batch.done) == sorted(waiting) and batch.flagged == [running] and batch.after is None
    assert JobsHot.objects.get(id=running).status == JobStatus.PROCESSING  # its worker stops it
    assert storage.cancel_requests("w1") == [(running, "ops")]
    only_pending = pending("cs", 1)[0]
    processing("cs2", "w2")
    f = JobFilter(status=JobStatus.PENDING)
    total, upto = storage.count_matching("hot", f)
    assert total == 1
    assert storage.cancel_matching(f, None, upto, 500, actor="ops").done == [only_pending]


def test_dlq_purge_and_resurrect_matching_batches() -> None:
    timeouts = sorted(dead("dm", 4, reason=FailureReason.TIMEOUT))
    keep = dead("dm", 1, reason=FailureReason.FATAL_ERROR)[0]
    f = JobFilter(queue="dm", failure_reason=FailureReason.TIMEOUT)
    _, upto = storage.count_matching("dlq", f)
    assert upto is not None
    requeued = storage.resurrect_matching(f, None, upto, 2, actor="ops")
    assert requeued.done == [timeouts[3], timeouts[2]] and requeued.after == timeouts[2]
    assert hot_ids("dm") == {timeouts[3], timeouts[2]}
    purged = storage.purge_dlq_matching(f, requeued.after, upto, 500)
    assert sorted(purged.done) == timeouts[:2] and purged.after is None
    assert dlq_ids() == {keep}
    assert counters("dm") == (0, 1, 0)


def test_a_batch_publishes_after_commit(published: list[events.Event]) -> None:
    ids = dead("pub", 2)
    _, upto = storage.count_matching("dlq", JobFilter(queue="pub"))
    assert upto is not None
    storage.purge_dlq_matching(JobFilter(queue="pub"), None, upto, 500)
    purged = [e for e in published if e.kind == events.EventKind.JOBS_PURGED]
    assert len(purged) == 1 and sorted(purged[0].data["jobIds"]) == sorted(ids)
    assert any(e.kind == events.EventKind.STATS_UPDATED for e in published)


def test_cancel_all_matching_has_no_cap_and_leaves_a_concurrent_non_matching_job_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """2,500 matching Pending jobs, all cancelled in batches of ≤ 500 (no 1,000 cap); a job of another queue
    enqueued while the run is under way is untouched."""
    ids = set(pending("backlog", 2500))
    sizes: list[int] = []
    progress: list[tuple[int, int]] = []
    real = storage.cancel_matching
    concurrent: list[str] = []

    def batch(*args: object, **kwargs: object) -> storage.MatchBatch:
        result = real(*args, **kwargs)  # type: ignore[arg-type]
        sizes.append(len(result.done) + len(result.flagged))
        if len(sizes) == 2:
            concurrent.extend(pending("fresh", 1))
        return result

    monkeypatch.setattr(storage, "cancel_matching", batch)
    moved, flagged = service.cancel_matching(JobFilter(queue="backlog"), actor="ops",
                                             on_batch=lambda ids, done, total: progress.append((done, total)))
    assert set(moved) == ids and flagged == []
    assert max(sizes) <= service.BULK_BATCH and sum(sizes) == 2500 and len(sizes) >= 5
    assert progress[-1] == (2500, 2500) and [d for d, _ in progress] == sorted(d for d, _ in progress)
    assert hot_ids() == set(concurrent) and len(concurrent) == 1
    assert dlq_ids() == ids


def test_dlq_matching_without_a_cap_and_with_one() -> None:
    ids = dead("big", 1200, reason=FailureReason.TRANSIENT)
    assert len(service.resurrect_matching(JobFilter(queue="big"), 700, actor="ops")) == 700
    assert len(service.purge_dlq_matching(JobFilter(queue="big"))) == 500  # no max: every match
    assert not (dlq_ids() & set(ids))
