"""Helpers for tests of code that enqueues ChokaQ jobs (spec 03 §15).

With ``CHOKAQ["STORAGE"] = "memory"`` jobs live in this process only, so they
must also run here::

    def test_signup_sends_the_welcome_mail(settings):
        settings.CHOKAQ = {**settings.CHOKAQ, "STORAGE": "memory"}
        testing.reset_storage()
        signup("a@example.com")          # enqueues "mail.welcome"
        summary = testing.run_until_idle()
        assert summary.succeeded_total == 1

``run_until_idle`` also works on a SQL storage, as long as the jobs it should
see are committed (worker threads use their own connections).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime

from chokaq_core import storage
from chokaq_core.conf import config
from chokaq_core.domain import JobFilter, JobStatus
from chokaq_core.readmodel import SummaryStats
from chokaq_core.worker import Worker, WorkerOptions

POLL_INTERVAL = 0.25  # longest sleep while waiting for a delayed job (a retry's backoff) to become due
_SCAN_LIMIT = 1_000_000


def run_until_idle(
    max_seconds: float = 10.0, *, queues: Sequence[str] | None = None, concurrency: int | None = None,
) -> SummaryStats:
    """Run fetch/execute cycles in this process until no job of ``queues`` (None: every queue) can run
    any more, then return the storage counters.

    Each cycle is a burst worker, which stops once nothing is eligible *now*; between cycles this waits
    for delayed jobs (retries, ``delay=``/``run_at=``) that become due before ``max_seconds`` have
    passed. Jobs of paused or hidden queues and jobs due after the deadline are left Pending (the
    summary shows them). Raises ``TimeoutError`` when a handler is still running, or a job is due and
    not run, at the deadline."""
    deadline = time.monotonic() + max_seconds
    wanted = list(queues) if queues else None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"ChokaQ jobs were still due after {max_seconds:g} s")
        worker = Worker(WorkerOptions(queues=wanted, concurrency=concurrency, burst=True, rescue=False))
        worker.start()
        if not worker.stopped.wait(remaining):
            worker.stop()
            worker.stopped.wait(config().WORKER.SHUTDOWN_GRACE_PERIOD)
            raise TimeoutError(f"ChokaQ jobs were still running after {max_seconds:g} s")
        wait = _next_due_in(wanted)
        if wait is None:
            return storage.summary_stats()
        remaining = deadline - time.monotonic()
        if wait > remaining:
            return storage.summary_stats()  # what is left is scheduled after the deadline
        time.sleep(min(wait, POLL_INTERVAL))


def reset_storage() -> None:
    """Forget every job, counter, queue control and worker row of the in-memory storage."""
    if not storage.memory_mode():
        raise RuntimeError('reset_storage() clears the in-memory storage only (CHOKAQ["STORAGE"] = "memory")')
    storage.reset_memory()


def _next_due_in(queues: list[str] | None) -> float | None:
    """Seconds until the next Pending job that a worker of ``queues`` could claim (0: one is due now);
    None when there is none."""
    blocked = {q.name for q in storage.queue_states() if q.is_paused or not q.is_active}

    def runnable(queue: str) -> bool:
        return queue not in blocked and (queues is None or queue in queues)

    if any(lag.pending for lag in storage.queue_health() if runnable(lag.queue)):
        return 0.0
    later = [row.scheduled_at for row in storage.list_active(JobFilter(status=JobStatus.PENDING), _SCAN_LIMIT)
             if runnable(row.queue) and row.scheduled_at is not None]
    if not later:
        return None
    return max(0.0, (min(later) - datetime.now(UTC)).total_seconds())
