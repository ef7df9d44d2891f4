"""StatsSummary stays equal to the pillars after a long mixed sequence of transitions (spec 01 §2.4)."""

from __future__ import annotations

import random
from collections import Counter
from datetime import timedelta

import pytest
from django.db.models import Count
from django.utils import timezone

from chokaq_core import storage
from chokaq_core.domain import Failure, FailureReason, Retry, Success
from chokaq_core.models import JobsArchive, JobsDLQ, JobsHot, StatsSummary

from .rows import backdate, new_job

QUEUES = ("inv-a", "inv-b", "inv-c")
WORKERS = ("w-1", "w-2", "w-3")


def per_queue(model: type, **filters: object) -> Counter[str]:
    rows = model.objects.filter(queue__in=QUEUES, **filters).values("queue").annotate(n=Count("id"))  # type: ignore[attr-defined]
    return Counter({r["queue"]: r["n"] for r in rows})


def check_invariant(retried: Counter[str]) -> None:
    archive, dlq = per_queue(JobsArchive), per_queue(JobsDLQ)
    stats = {s.queue: s for s in storage.queue_stats()}
    purged = dict(StatsSummary.objects.values_list("queue", "purged_total"))
    hot = {status: per_queue(JobsHot, status=status) for status in (0, 1, 2)}
    for queue in QUEUES:
        s = stats[queue]
        assert s.succeeded_total - purged[queue] == archive[queue], f"{queue}: succeeded - purged vs Archive"
        assert s.failed_total == dlq[queue], f"{queue}: failed_total vs DLQ"
        assert s.retried_total == retried[queue], f"{queue}: retried_total vs reschedules"
        assert (s.pending, s.fetched, s.processing) == (hot[0][queue], hot[1][queue], hot[2][queue])
    summary = storage.summary_stats()
    assert summary.archived == sum(archive.values()) == summary.succeeded_total - summary.purged_total
    assert summary.failed_total == sum(dlq.values())
    assert summary.pending + summary.fetched + summary.processing == JobsHot.objects.count()


@pytest.mark.parametrize("seed", [7, 2024])
def test_counters_match_the_pillars_after_random_operations(seed: int) -> None:
    rng = random.Random(seed)
    retried: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    for queue in QUEUES:
        storage.enqueue([new_job(queue) for _ in range(5)])

    for step in range(200):
        action = rng.choice(["enqueue", "fetch", "start", "complete", "complete", "cancel", "resurrect",
                             "purge_dlq", "purge_archive", "zombies", "recover", "release"])
        worker = rng.choice(WORKERS)
        if action == "enqueue":
            queue = rng.choice(QUEUES)
            storage.enqueue([new_job(queue, key=rng.choice([None, f"k{rng.randint(0, 5)}"]))
                             for _ in range(rng.randint(1, 4))])
        elif action == "fetch":
            storage.fetch_batch(worker, rng.randint(1, 6), list(QUEUES))
        elif action == "start":
            for job in storage.fetch_batch(worker, rng.randint(1, 3), list(QUEUES)):
                storage.mark_processing(job, worker)
        elif action == "complete":
            running = dict(JobsHot.objects.filter(queue__in=QUEUES, status=2).values_list("id", "worker_id"))
            if not running:
                continue
            worker = running[rng.choice(sorted(running))]
            successes, retries, failures = [], [], []
            # items may name other workers' jobs: the ownership guard must drop those
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
            ids = list(JobsHot.objects.filter(queue__in=QUEUES).values_list("id", flat=True))
            storage.cancel(rng.sample(ids, min(len(ids), rng.randint(1, 4))), actor="ops")
        elif action == "resurrect":
            ids = list(JobsDLQ.objects.filter(queue__in=QUEUES).values_list("id", flat=True))
            if ids:
                if rng.random() < 0.5:
                    storage.resurrect(rng.choice(ids), actor="ops")
                else:
                    storage.resurrect_batch(rng.sample(ids, min(len(ids), 3)), actor="ops")
        elif action == "purge_dlq":
            ids = list(JobsDLQ.objects.filter(queue__in=QUEUES).values_list("id", flat=True))
            storage.purge_dlq_ids(rng.sample(ids, min(len(ids), 2)))
        elif action == "purge_archive":
            ids = list(JobsArchive.objects.filter(queue__in=QUEUES).values_list("id", flat=True))
            old = rng.sample(ids, min(len(ids), 2))
            if rng.random() < 0.5:
                storage.purge_archive_ids(old)
            else:
                JobsArchive.objects.filter(id__in=old).update(finished_at=timezone.now() - timedelta(days=30))
                storage.purge_archive(timezone.now() - timedelta(days=1))
        elif action == "zombies":
            running = list(JobsHot.objects.filter(queue__in=QUEUES, status=2).values_list("id", flat=True))
            if running:
                backdate(rng.sample(running, 1), 3600, "heartbeat_at")
            storage.archive_zombies(600)
        elif action == "recover":
            fetched = list(JobsHot.objects.filter(queue__in=QUEUES, status=1).values_list("id", flat=True))
            if fetched:
                backdate(rng.sample(fetched, 1), 3600, "last_updated_at")
            storage.recover_abandoned(600)
        elif action == "release":
            mine = list(JobsHot.objects.filter(queue__in=QUEUES, status=1, worker_id=worker)
                        .values_list("id", flat=True))
            storage.release_jobs(mine, worker)
        if step % 10 == 0:
            check_invariant(retried)

    check_invariant(retried)
    assert min(outcomes["archived"], outcomes["failed"], outcomes["retried"]) > 0, f"a dull sequence: {outcomes}"
