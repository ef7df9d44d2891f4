"""The dispatcher: limiter slot → buffered row → circuit permit → lease gate, for the executor thread that asks
(spec 03 §4, §6, §7.1 steps 2–4).

Each executor thread takes its next job itself (:meth:`Dispatcher.take`): a busy worker moves a job from the
buffer to a handler without waking another thread. The taker also takes the rows that other free slots can
run now and passes the lease gate for all of them in one statement on its own connection; it keeps the first
and hands the others, leased and each holding its slot, to the executors waiting for one. A row stays Fetched
until its handler is about to start, so Processing means running. The dispatcher's own thread
(:meth:`Dispatcher.run`) only watches pauses: while every slot is busy it still releases the buffered rows of
a paused queue within the 2 s of spec 03 §6. Rows of a paused queue and every row met while shutting down go
back to Pending untouched (user code never started).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence

from chokaq_core import metrics, storage
from chokaq_core.domain import HotJob, Retry
from chokaq_core.policy import CircuitBreakers, Permit
from chokaq_core.worker.completer import Outcome
from chokaq_core.worker.limits import InFlight, Limiter, PrefetchBuffer

logger = logging.getLogger("chokaq.worker")

PAUSE_CACHE_SECONDS = 0.25  # queue states read at most this often (spec 03 §4 step 2)
SLOT_WAIT = 0.25  # seconds of one wait for a slot or a row (between two looks at stopping)

Leased = tuple[HotJob, int, Permit]  # a job that is Processing and ours, its attempt, its circuit permit


class Dispatcher:
    def __init__(self, worker_id: str, batch_size: int, circuit_delay: float, buffer: PrefetchBuffer,
                 limiter: Limiter, in_flight: InFlight, breakers: CircuitBreakers, stopping: threading.Event,
                 complete: Callable[[Outcome], None]) -> None:
        self.worker_id = worker_id
        self.batch_size = batch_size
        self.circuit_delay = circuit_delay
        self.buffer = buffer
        self.limiter = limiter
        self.in_flight = in_flight
        self.breakers = breakers
        self.stopping = stopping
        self.complete = complete
        self._ready: collections.deque[Leased] = collections.deque()  # leased by another taker, slot held
        self._pause_cache: tuple[float, set[str]] = (0.0, set())
        self._pause_lock = threading.Lock()

    def take(self) -> Leased | None:
        """The calling executor's next job: leased, holding a slot and its circuit permit; None once the worker
        stops (or the limiter is closed)."""
        while not self.stopping.is_set():
            try:
                return self._ready.popleft()
            except IndexError:
                pass
            if not self.limiter.acquire(timeout=SLOT_WAIT, unless=self._has_ready):
                if self.limiter.closed:
                    return None
                continue
            job = self.buffer.get(timeout=SLOT_WAIT)
            if job is None or self.stopping.is_set() or job.queue in self.paused_queues():
                self.limiter.release()
                if job is not None:
                    self.release([job])
                continue
            leased = self.lease(self._gather(job))
            if leased:
                if len(leased) > 1:
                    self._ready.extend(leased[1:])
                    self.limiter.wake()
                return leased[0]
        self._release_ready()
        return None

    def _has_ready(self) -> bool:
        return bool(self._ready)

    def _gather(self, first: HotJob) -> list[HotJob]:
        """``first`` plus the buffered rows that free slots can run right now (each with its slot)."""
        batch = [first]
        while len(batch) < self.batch_size and self.limiter.acquire(timeout=0):
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

    def lease(self, jobs: list[HotJob]) -> list[Leased]:
        """Circuit permits, then the lease gate for rows that each hold a slot, in one statement. A job that does
        not run now (circuit open: deferred without an attempt; lease refused or failed) has its slot freed."""
        admitted: list[tuple[HotJob, Permit]] = []
        for job in jobs:
            permit = self.breakers.get(job.type).acquire()
            if permit is None:
                # one DEBUG line per job; the INFO log has one line per state change with the count (CircuitLog)
                logger.debug("circuit open for %s: job %s deferred %.1f s (2001)", job.type, job.id,
                             self.circuit_delay)
                self.complete(Retry(job.id, job.attempt_count, self.circuit_delay))
                self.finish_slot()
            else:
                admitted.append((job, permit))
        if not admitted:
            return []
        try:
            attempts = storage.mark_processing_batch([job for job, _ in admitted], self.worker_id)
        except Exception:
            logger.exception("lease gate failed for %s jobs (1014); releasing them", len(admitted))
            for job, permit in admitted:
                self.breakers.get(job.type).release(permit)
                self.limiter.release()
            self.release([job for job, _ in admitted])  # user code never started: back to Pending
            return []
        leased: list[Leased] = []
        for job, permit in admitted:
            attempt = attempts.get(job.id)
            if attempt is None:
                self.breakers.get(job.type).release(permit)
                logger.info("lease rejected for %s (2002): no longer Fetched by this worker", job.id)
                metrics.transition_conflict("MarkAsProcessing", job.queue, job.type)
                self.finish_slot()
            else:
                leased.append((job, attempt, permit))
        return leased

    def _release_ready(self) -> None:
        """Shutting down: leased jobs no executor took run no user code; their rows stay ours and Processing
        until the completer reschedules them like an interrupted job."""
        while True:
            try:
                job, attempt, permit = self._ready.popleft()
            except IndexError:
                return
            self.breakers.get(job.type).release(permit)
            self.complete(Retry(job.id, attempt - 1, 0.0))
            self.finish_slot()

    def run(self) -> None:
        """The pause watcher: buffered rows of a queue paused meanwhile go back to Pending, even while every slot
        is busy with a long job."""
        while not self.stopping.wait(PAUSE_CACHE_SECONDS):
            self.release(self.buffer.take_queues(self.paused_queues()))

    def finish_slot(self) -> None:
        """A row that held a slot is done (executed, refused or lost)."""
        self.in_flight.done()
        self.limiter.release()

    def paused_queues(self) -> set[str]:
        """Paused or hidden queues, read at most every ``PAUSE_CACHE_SECONDS`` by whichever thread asks first."""
        stamp, paused = self._pause_cache
        if time.monotonic() - stamp <= PAUSE_CACHE_SECONDS or not self._pause_lock.acquire(blocking=False):
            return paused  # fresh enough, or another thread is reading them right now
        try:
            try:
                paused = {q.name for q in storage.queue_states() if q.is_paused or not q.is_active}
            except Exception:
                logger.warning("could not read queue states", exc_info=True)
            self._pause_cache = (time.monotonic(), paused)
            return paused
        finally:
            self._pause_lock.release()

    def release(self, jobs: Sequence[HotJob]) -> None:
        """Prefetched rows back to Pending (spec 01 §4.15)."""
        if not jobs:
            return
        try:
            storage.release_jobs([j.id for j in jobs], self.worker_id)
        except Exception:
            logger.warning("release of %s prefetched jobs failed (1011); the rescue sweep will find them", len(jobs),
                           exc_info=True)
        finally:
            self.in_flight.done(len(jobs))
