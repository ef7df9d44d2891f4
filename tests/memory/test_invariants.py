"""Memory mode — StatsSummary stays equal to the pillars after a long mixed sequence (spec 01 §2.4)."""

from __future__ import annotations

import random
from collections import Counter
from datetime import timedelta

import pytest

from chokaq_core import storage
from chokaq_core.domain import Failure, FailureReason, HistorySort, JobFilter, JobStatus, Retry, Success

from .conftest import Clock
from .rows import EVERYTHING, new_job

QUEUES = ("inv-a", "inv-b", "inv-c")
WORKERS = ("w-1", "w-2", "w-3")


def rows(pillar: str) -> list:
    if pillar == "hot":
        return storage.list_active(JobFilter(), EVERYTHING)
    read = storage.list_archive if pillar == "archive" else storage.list_dlq
    return read(JobFilter(), None, EVERYTHING, HistorySort())


def check_invariant(retried: Counter[str]) -> None:
    archive = Counter(r.queue for r in rows("archive"))
    dlq = Counter(r.queue for r in rows("dlq"))
    hot = Counter((r.queue, int(r.status)) for r in rows("hot"))
    stats = {s.queue: s for s in storage.queue_stats()}
    for queue in QUEUES:
        s = stats[queue]
        assert (s.succeeded_total, s.failed_total, s.retried_total) == (archive[queue], dlq[queue], retried[queue])
        assert (s.pending, s.fetched, s.processing) == (hot[(queue, 0)], hot[(queue, 1)], hot[(queue, 2)])
    summary = storage.summary_stats()
    assert (summary.succeeded_total, summary.failed_total) == (archive.total(), dlq.total())
    assert summary.pending + summary.fetched + summary.processing == hot.total()


def ids_of(pillar: str, status: JobStatus | None = None) -> list[str]:
    return sorted(r.id for r in rows(pillar) if status is None or r.status == status)


@pytest.mark.parametrize("seed", [7, 2024])
def test_counters_match_the_pillars_after_random_operations(seed: int, clock: Clock) -> None:
    rng = random.Random(seed)
    retried: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    for queue in QUEUES:
        storage.enqueue([new_job(queue) for _ in range(5)])

    for step in range(300):
        clock.advance(rng.uniform(0, 120))
        action = rng.choice(["enqueue", "fetch", "start", "complete", "complete", "cancel", "resurrect",
                             "purge_dlq", "purge_archive", "zombies", "recover", "release"])
        worker = rng.choice(WORKERS)
        if action == "enqueue":
            storage.enqueue([new_job(rng.choice(QUEUES), key=rng.choice([None, f"k{rng.randint(0, 5)}"]))
                             for _ in range(rng.randint(1, 4))])
        elif action == "fetch":
            storage.fetch_batch(worker, rng.randint(1, 6), list(QUEUES))
        elif action == "start":
            for job in storage.fetch_batch(worker, rng.randint(1, 3), list(QUEUES)):
                storage.mark_processing(job, worker)
        elif action == "complete":
            running = {r.id: r.worker_id for r in rows("hot") if r.status == JobStatus.PROCESSING}
            if not running:
                continue
            worker = running[rng.choice(sorted(running))]
            successes, retries, failures = [], [], []
            for job_id in rng.sample(sorted(running), min(len(running), rng.randint(1, 5))):
                kind = rng.choice(["ok", "retry", "fail"])
                if kind == "ok":
                    successes.append(Success(job_id, rng.uniform(1, 50)))
                elif kind == "retry":
                    retries.append(Retry(job_id, 1, 0.0))
                else:
                    failures.append(Failure(job_id, rng.choice(list(FailureReason)), f"step {step}"))
            done = storage.complete(worker, successes, retries, failures)
            moved = [i for i, _ in done.archived + done.rescheduled + done.failed]
            assert sorted(moved) == sorted(i for i in (x.job_id for x in [*successes, *retries, *failures])
                                           if running[i] == worker)
            retried.update(q for _, q in done.rescheduled)
            outcomes.update(archived=len(done.archived), failed=len(done.failed), retried=len(done.rescheduled))
        elif action == "cancel":
            ids = ids_of("hot")
            storage.cancel(rng.sample(ids, min(len(ids), rng.randint(1, 4))), actor="ops")
        elif action == "resurrect":
            ids = ids_of("dlq")
            if ids and rng.random() < 0.5:
                storage.resurrect(rng.choice(ids), actor="ops")
            elif ids:
                storage.resurrect_batch(rng.sample(ids, min(len(ids), 3)), actor="ops")
        elif action == "purge_dlq":
            ids = ids_of("dlq")
            storage.purge_dlq_ids(rng.sample(ids, min(len(ids), 2)))
        elif action == "purge_archive":
            if rng.random() < 0.5:
                ids = ids_of("archive")
                storage.purge_archive_ids(rng.sample(ids, min(len(ids), 2)))
            else:
                storage.purge_archive(clock.now - timedelta(minutes=30))
        elif action == "zombies":
            storage.archive_zombies(rng.choice([60, 600]))
        elif action == "recover":
            storage.recover_abandoned(rng.choice([60, 600]))
        elif action == "release":
            storage.release_jobs(ids_of("hot", JobStatus.FETCHED), worker)
        if step % 10 == 0:
            check_invariant(retried)

    check_invariant(retried)
    assert min(outcomes["archived"], outcomes["failed"], outcomes["retried"]) > 0, f"a dull sequence: {outcomes}"
