"""The completer: finished jobs' outcomes committed in batches (spec 03 §7.1 steps 8–10; ARCHITECTURE §4).

Executors hand over an outcome and move on; one thread waits ``COMPLETION_FLUSH_INTERVAL`` for a batch
to gather, then one ``storage.complete`` transaction archives, reschedules and dead-letters all of them.
Outcomes that arrive while a batch commits wait for the next gather (unless a whole batch is waiting): a
busy completer that took them at once committed a transaction per few jobs.
A zero-row transition means the job is no longer ours: logged (2100) and counted, never retried.

Until its completion commits a finished job's row is Processing and ours, so the supervisor beats it: the
outcomes queued, and a batch waiting to retry its commit. A batch is taken under ``taking``, which a heartbeat holds
while it reads what to beat and sends its UPDATE: the rows a completion locks are never in a heartbeat in flight.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from chokaq_core import metrics, storage
from chokaq_core.domain import Failure, Retry, Success

logger = logging.getLogger("chokaq.worker")

Outcome = Success | Retry | Failure


class Completer:
    def __init__(self, worker_id: str, batch_size: int, flush_interval: float, stopped: threading.Event) -> None:
        self.worker_id = worker_id
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.stopped = stopped
        self._outcomes: collections.deque[Outcome] = collections.deque()
        self._ready = threading.Event()
        self._unflushed = 0  # outcomes handed over and not yet committed
        self._unflushed_lock = threading.Lock()
        self.taking = threading.Lock()  # a batch taken from the queue, or a heartbeat naming the rows queued
        self._retrying: list[str] = []  # the ids of a batch whose commit failed, waiting to try again

    def submit(self, outcome: Outcome) -> None:
        with self._unflushed_lock:
            self._unflushed += 1
        self._outcomes.append(outcome)
        if not self._ready.is_set():  # set already: the gather that clears it takes this outcome too (queued first)
            self._ready.set()

    def pending(self) -> bool:
        """True while some outcome is not committed yet."""
        with self._unflushed_lock:
            return self._unflushed > 0

    def awaiting(self) -> list[str]:
        """Ids of finished jobs not being committed right now: queued, or in a batch waiting to retry its commit.
        Still Processing and ours, so the supervisor keeps them alive while a slow or retried commit holds the
        queue (the batch in flight is left out: its rows are locked by the completion, and a heartbeat on them
        would deadlock with it). Read under ``taking`` for a heartbeat, so none is taken before it is sent."""
        return [*self._retrying, *(o.job_id for o in self._outcomes.copy())]

    def run(self) -> None:
        while not self.stopped.is_set():
            if not self._ready.wait(timeout=0.5):
                continue
            time.sleep(self.flush_interval)  # let a batch gather
            self._ready.clear()
            self.flush(gathered=True)

    def flush(self, gathered: bool = False) -> None:
        """Commit every outcome handed over (``gathered``: those there now, then only whole batches)."""
        left = len(self._outcomes) if gathered else None
        while self._outcomes and (left is None or left > 0 or len(self._outcomes) >= self.batch_size):
            batch: list[Outcome] = []
            with self.taking:
                while self._outcomes and len(batch) < self.batch_size:
                    batch.append(self._outcomes.popleft())
            if left is not None:
                left -= len(batch)
            self._commit(batch)
            with self._unflushed_lock:
                self._unflushed -= len(batch)

    def _commit(self, batch: list[Outcome]) -> None:
        """Commit a batch of outcomes; keeps trying while the database is away (nothing is dropped)."""
        successes = [o for o in batch if isinstance(o, Success)]
        retries = [o for o in batch if isinstance(o, Retry)]
        failures = [o for o in batch if isinstance(o, Failure)]
        delay = 0.5
        while True:
            try:
                done = storage.complete(self.worker_id, successes, retries, failures)
                break
            except Exception:
                logger.exception("completion of %s jobs failed; retrying in %.1f s", len(batch), delay)
                with self.taking:
                    self._retrying = [o.job_id for o in batch]  # not locked while it waits: beaten
                time.sleep(delay)
                with self.taking:
                    self._retrying = []
                delay = min(delay * 2, 5.0)
                if self.stopped.is_set():
                    return
        applied = len(done.archived) + len(done.rescheduled) + len(done.failed)
        if applied < len(batch):
            moved = {i for i, _ in done.archived + done.rescheduled + done.failed}
            lost = [o.job_id for o in batch if o.job_id not in moved]
            metrics.completion_conflicts(o for o in batch if o.job_id not in moved)
            logger.warning("state transition not applied for %s jobs (2100, lost ownership): %s", len(lost),
                           lost[:10])
