"""The dispatcher: buffered rows → limiter slot → circuit permit → lease gate → executor (spec 03 §4, §6,
§7.1 steps 2–4).

Rows of a paused queue and every row met while shutting down go back to Pending untouched (user code
never started). The lease gate runs for a whole gathered batch in one statement; under rate limits (the
fetcher's :class:`RateLimits`, shared) it is the lease that spends the tokens, so the limit holds at the
start of a job: rows the limit holds back go back to Pending and free their slots.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from chokaq_core import metrics, storage
from chokaq_core.domain import HotJob, Retry
from chokaq_core.policy import CircuitBreakers, Permit
from chokaq_core.worker.completer import Outcome
from chokaq_core.worker.fetcher import RateLimits
from chokaq_core.worker.limits import InFlight, Limiter, PrefetchBuffer

logger = logging.getLogger("chokaq.worker")

PAUSE_CACHE_SECONDS = 0.25  # queue states read at most this often (spec 03 §4 step 2)

Leased = tuple[HotJob, int, Permit]  # a job that is Processing and ours, its attempt, its circuit permit


class Dispatcher:
    def __init__(self, worker_id: str, batch_size: int, circuit_delay: float, buffer: PrefetchBuffer,
                 limiter: Limiter, in_flight: InFlight, breakers: CircuitBreakers, stopping: threading.Event,
                 submit: Callable[[Sequence[Leased]], None], complete: Callable[[Outcome], None],
                 rate_limits: RateLimits | None = None) -> None:
        """``submit``: hands a batch of leased jobs to the executors. ``rate_limits``: the limits the leases spend
        tokens of (none when not given)."""
        self.worker_id = worker_id
        self.rate_limits = rate_limits
        self.batch_size = batch_size
        self.circuit_delay = circuit_delay
        self.buffer = buffer
        self.limiter = limiter
        self.in_flight = in_flight
        self.breakers = breakers
        self.stopping = stopping
        self.submit = submit
        self.complete = complete
        self._pause_cache: tuple[float, set[str]] = (0.0, set())

    def run(self) -> None:
        while True:
            job = self.buffer.get(timeout=0.5)
            if job is None:
                if self.stopping.is_set():
                    return
                continue
            if self.stopping.is_set() or job.queue in self.paused_queues():
                self.release([job])
                continue
            if self._acquire_slot(job):
                self._lease_and_submit(self._gather(job))

    def _acquire_slot(self, job: HotJob) -> bool:
        """Wait for a limiter slot. Waiting may take as long as a running job: meanwhile a pause must still
        release this row and the buffered rows of its queue within the 2 s of spec 03 §6."""
        acquired = paused = False
        while not acquired and not self.stopping.is_set():
            acquired = self.limiter.acquire(timeout=0.25)
            if not acquired:
                now_paused = self.paused_queues()
                self.release(self.buffer.take_queues(now_paused))
                if job.queue in now_paused:
                    paused = True
                    break
        if acquired and job.queue in self.paused_queues():  # paused while this row waited
            self.limiter.release()
            acquired, paused = False, True
        if not acquired:
            self.release([job])
            if paused:
                logger.debug("job %s released: queue %s paused", job.id, job.queue)
        return acquired

    def _gather(self, first: HotJob) -> list[HotJob]:
        """``first`` plus the buffered rows that a free slot can take right now (each with its slot)."""
        batch = [first]
        while len(batch) < self.batch_size and not self.stopping.is_set():
            if not self.limiter.acquire(timeout=0):
                break
            job = self.buffer.get(timeout=0)
            if job is None:
                self.limiter.release()
                break
            if job.queue in self.paused_queues():
                self.limiter.release()
                self.release([job])
                continue
            batch.append(job)
        return batch

    def _lease_and_submit(self, jobs: list[HotJob]) -> None:
        """Circuit permits, then the lease gate for the whole batch in one statement, then hand each leased
        job to an executor. Every job arrives holding a slot."""
        if self.stopping.is_set():  # shutting down: unstarted rows go back to Pending untouched
            for _ in jobs:
                self.limiter.release()
            self.release(jobs)
            return
        admitted: list[tuple[HotJob, Permit]] = []
        for job in jobs:
            permit = self._permit(job, job.attempt_count)
            if permit is not None:
                admitted.append((job, permit))
        if not admitted:
            return
        try:
            rate_limits = self.rate_limits.current() if self.rate_limits is not None else []
            leased = storage.mark_processing_batch([job for job, _ in admitted], self.worker_id, rate_limits)
        except Exception:
            logger.exception("lease gate failed for %s jobs (1014); releasing them", len(admitted))
            for job, permit in admitted:
                self.breakers.get(job.type).release(permit)
                self.limiter.release()
            self.release([job for job, _ in admitted])  # user code never started: back to Pending
            return
        held = set(leased.held)
        started: list[Leased] = []
        if held:  # back to Pending: the fetcher's claims hold them back until the next token
            logger.debug("%s jobs held back by a rate limit at their lease; next token in %s s", len(held),
                         leased.held_for)
        for job, permit in admitted:
            attempt = leased.get(job.id)
            if job.id in held:
                self.breakers.get(job.type).release(permit)
                self.finish_slot()
            elif attempt is None:
                self.breakers.get(job.type).release(permit)
                logger.info("lease rejected for %s (2002): no longer Fetched by this worker", job.id)
                metrics.transition_conflict("MarkAsProcessing", job.queue, job.type)
                self.finish_slot()
            else:
                started.append((job, attempt, permit))
        if started:
            self.submit(started)

    def _permit(self, job: HotJob, attempts: int) -> Permit | None:
        """The circuit's permit for ``job``; None when its circuit is open: then the job is deferred with
        ``attempts`` (the attempts it had before this start) and its slot is done."""
        permit = self.breakers.get(job.type).acquire()
        if permit is None:
            # one DEBUG line per job; the INFO log has one line per state change with the count (CircuitLog)
            logger.debug("circuit open for %s: job %s deferred %.1f s (2001)", job.type, job.id, self.circuit_delay)
            self.complete(Retry(job.id, attempts, self.circuit_delay, held_by=job.type))
            self.finish_slot()
        return permit

    def reserve(self, n: int) -> int:
        """Take up to ``n`` free execution slots at once (never waiting) for rows the next claim leases itself
        (``start_claimed``)."""
        taken = 0
        while taken < n and self.limiter.acquire(timeout=0):
            taken += 1
        return taken

    def start_claimed(self, leased: Sequence[HotJob], reserved: int) -> None:
        """Hand the rows a claim leased (Processing and ours, each on one of the ``reserved`` slots) to executors, as
        ``_lease_and_submit`` does after its lease; the slots no row took are freed. A row whose circuit is open, or
        met while shutting down, is rescheduled without the attempt its lease counted (user code never started)."""
        for _ in range(reserved - len(leased)):
            self.limiter.release()
        started: list[Leased] = []
        for job in leased:
            unstarted = job.attempt_count - 1
            if self.stopping.is_set():
                self.complete(Retry(job.id, unstarted, 0.0))
                self.finish_slot()
                continue
            permit = self._permit(job, unstarted)
            if permit is not None:
                started.append((job, job.attempt_count, permit))
        if started:
            self.submit(started)

    def finish_slot(self, ran: float | None = None) -> None:
        """A row that held a slot is done (executed, refused or lost); ``ran``: its execution's seconds."""
        self.in_flight.done()
        self.limiter.release(ran)

    def paused_queues(self) -> set[str]:
        stamp, paused = self._pause_cache
        if time.monotonic() - stamp > PAUSE_CACHE_SECONDS:
            try:
                paused = {q.name for q in storage.queue_states() if q.is_paused or not q.is_active}
            except Exception:
                logger.warning("could not read queue states", exc_info=True)
            self._pause_cache = (time.monotonic(), paused)
        return paused

    def release(self, jobs: Sequence[HotJob]) -> None:
        """Prefetched rows back to Pending (spec 01 §4.15)."""
        if not jobs:
            return
        try:
            storage.release_jobs([j.id for j in jobs], self.worker_id)
        except Exception:
            logger.warning("release of %s prefetched jobs failed (1011); recovery will return them", len(jobs),
                           exc_info=True)
        finally:
            self.in_flight.done(len(jobs))
