"""Rate limits hold at the start of a job: the worker's lease takes the token, not the claim.

A claim's rows wait in the prefetch buffer before the dispatcher leases them; what a gateway sees is the starts
(``started_at``, set by the lease in the database). These tests build the buffered rows with real claims, then
run the real worker's lease gate, and read the database's rows afterwards (no timing is measured).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models import F
from django.utils import timezone

from chokaq_core import JobStatus, storage
from chokaq_core.domain import HotJob, RateLimit, parse_rate
from chokaq_core.models import JobsHot, RateBuckets
from chokaq_core.worker import Worker, WorkerOptions
from chokaq_core.worker.dispatcher import Leased

pytestmark = pytest.mark.django_db(transaction=True)

LIMITED = RateLimit("type:test.ok.v1", parse_rate("1/h burst 3"))  # no token comes back during a test


def saved_up(tokens: float) -> None:
    """The limit's bucket after an idle spell: ``tokens`` saved, its window long over."""
    RateBuckets.objects.filter(limit_name=LIMITED.name).delete()
    long_ago = timezone.now() - timedelta(hours=2)
    RateBuckets.objects.create(limit_name=LIMITED.name, rate_key="", tokens=tokens, refilled_at=timezone.now(),
                               window_started_at=long_ago, window_used=0)


def idle_spell() -> None:
    """What three idle hours look like to the bucket: it refills up to its burst."""
    RateBuckets.objects.update(refilled_at=F("refilled_at") - timedelta(hours=3),
                               window_started_at=F("window_started_at") - timedelta(hours=3))


def lease(worker: Worker, jobs: list[HotJob]) -> list[Leased]:
    """The worker's dispatcher leases ``jobs`` (already in flight, each holding a slot) as one gathered batch."""
    submitted: list[Leased] = []
    worker.dispatcher.submit = submitted.extend
    worker.in_flight.add(len(jobs))
    for _ in jobs:
        assert worker.limiter.acquire(timeout=0)
    worker.dispatcher._lease_and_submit(jobs)
    return submitted


def busiest_hour() -> int:
    """The most starts the database recorded in any one hour (every start of a test falls in one)."""
    return JobsHot.objects.filter(started_at__isnull=False).count()


def test_rows_claimed_with_tokens_and_leased_later_in_a_bunch_start_within_the_limit(fast: Any) -> None:
    storage.declare_rate_limits([LIMITED])
    saved_up(3)
    ids = [storage.enqueue([job])[0] for job in _jobs(8)]
    worker = Worker(WorkerOptions(concurrency=8))
    # two claims an idle spell apart, each within the tokens it saw: six rows wait in the buffer
    first = storage.fetch_batch(worker.worker_id, 8, None, [LIMITED])
    idle_spell()
    second = storage.fetch_batch(worker.worker_id, 8, None, [LIMITED])
    assert len(first) == len(second) == 3

    started = lease(worker, [*first, *second])  # the dispatcher leases the buffered rows together

    assert busiest_hour() <= LIMITED.rate.count + LIMITED.rate.burst, "an hour of starts held more than rate + burst"
    assert len(started) == 3, "the lease started what the bucket's tokens allow"
    rows = {row.id: row for row in JobsHot.objects.filter(id__in=ids)}
    held = [row for row in rows.values() if row.started_at is None]
    assert len(held) == 5
    assert all(r.status == JobStatus.PENDING and r.worker_id is None and r.attempt_count == 0 for r in held), \
        "a job held back at its lease goes back to Pending without an attempt"
    bucket = RateBuckets.objects.get(limit_name=LIMITED.name, rate_key="")
    assert bucket.window_used == 3 and bucket.tokens < 1, "the bucket counts the starts"
    assert worker.limiter.running == 3 and worker.in_flight._count == 3, "held jobs gave back their slots"


def _jobs(n: int) -> list[Any]:
    from tests.storage.rows import new_job

    return [new_job("rl-start") for _ in range(n)]


def test_a_row_whose_rate_key_function_fails_in_the_worker_goes_to_the_dlq_with_the_error(start_worker: Any,
                                                                                          state: Any) -> None:
    from chokaq_core import FailureReason
    from chokaq_core.api import job
    from tests.storage.rows import new_job

    @job("tests.rl.keyfails.v1", rate_limit="100/s", rate_key=lambda payload: f"tenant:{payload['tenant']}")
    def keyed(ctx: Any, **payload: Any) -> None: ...

    # a row that reached Hot without its rate key (another service's enqueue): its payload has no tenant
    [job_id] = storage.enqueue([new_job("default", type="tests.rl.keyfails.v1", payload="{}")])
    start_worker()

    dead = state.wait_dead(job_id)
    assert dead.failure_reason == FailureReason.FATAL_ERROR and dead.attempt_count == 1
    assert f"the rate_key of job {job_id} failed: KeyError('tenant')" in dead.error_details
    assert state.hot(job_id) is None, "the job is in the DLQ, not lost"
