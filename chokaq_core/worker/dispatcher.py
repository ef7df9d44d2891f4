"""The dispatcher: limiter slot → buffered row → circuit permit → executor (spec 03 §4, §6, §7.1 steps 2–4).

The rows in the buffer are already leased (the fetcher's claim takes the lease gate), so the dispatcher
makes no round trip on the way to a handler. It takes a slot before it takes a row: a row is always in
the buffer (kept alive by the supervisor), on its way to an executor, or running. Rows of a paused queue
and every row met while shutting down go back to Pending untouched (user code never started; the lease's
attempt is given back).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from chokaq_core import storage
from chokaq_core.domain import HotJob, Retry
from chokaq_core.policy import CircuitBreakers, Permit
from chokaq_core.worker.completer import Outcome
from chokaq_core.worker.limits import InFlight, Limiter, PrefetchBuffer

logger = logging.getLogger("chokaq.worker")

PAUSE_CACHE_SECONDS = 0.25  # queue states read at most this often (spec 03 §4 step 2)
SLOT_WAIT = 0.25  # seconds of one wait for a free slot (between two looks at paused queues and stopping)

Leased = tuple[HotJob, int, Permit]  # a job that is Processing and ours, its attempt, its circuit permit


class Dispatcher:
    def __init__(self, worker_id: str, batch_size: int, circuit_delay: float, buffer: PrefetchBuffer,
                 limiter: Limiter, in_flight: InFlight, breakers: CircuitBreakers, stopping: threading.Event,
                 submit: Callable[[Leased], None], complete: Callable[[Outcome], None]) -> None:
        self.worker_id = worker_id
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
        while not self.stopping.is_set():
            if not self.limiter.acquire(timeout=SLOT_WAIT):
                # every slot busy (it may take as long as a running job): a pause must still release the
                # buffered rows of its queue within the 2 s of spec 03 §6
                self.release(self.buffer.take_queues(self.paused_queues()))
                continue
            job = self.buffer.get(timeout=0.5)
            if job is None or self.stopping.is_set() or job.queue in self.paused_queues():
                self.limiter.release()
                if job is not None:
                    self.release([job])
                continue
            self.dispatch(job)

    def dispatch(self, job: HotJob) -> None:
        """Hand a leased row that holds a slot to an executor, or defer it while its circuit is open."""
        permit = self.breakers.get(job.type).acquire()
        if permit is None:
            # one DEBUG line per job; the INFO log has one line per state change with the count (CircuitLog)
            logger.debug("circuit open for %s: job %s deferred %.1f s (2001)", job.type, job.id, self.circuit_delay)
            self.complete(Retry(job.id, job.attempt_count - 1, self.circuit_delay))  # the lease's attempt back
            self.finish_slot()
            return
        self.submit((job, job.attempt_count, permit))

    def finish_slot(self) -> None:
        """A row that held a slot is done (executed, refused or lost)."""
        self.in_flight.done()
        self.limiter.release()

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
            logger.warning("release of %s prefetched jobs failed (1011); the rescue sweep will find them", len(jobs),
                           exc_info=True)
        finally:
            self.in_flight.done(len(jobs))
