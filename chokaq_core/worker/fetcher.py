"""The fetcher: claims batches of Pending rows into the prefetch buffer (spec 03 §2).

It claims when a whole batch fits (never one row per freed slot: under a backlog that made the claim a
transaction per job). A full batch means more is waiting, so it claims again at once; a short one makes it
wait for a wake-up (the database's push or commit-marker signal, pumped by :meth:`Fetcher.pump` on its own
thread) or the polling interval. A burst fetcher stops the worker once nothing is eligible any more.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from chokaq_core import storage
from chokaq_core.worker.limits import InFlight, PrefetchBuffer

logger = logging.getLogger("chokaq.worker")

BURST_WAIT = 0.05  # seconds a burst fetcher waits between two looks at an empty table
WAKE_SLICE = 1.0  # seconds of one wait on the wake source (stop() also closes it, ending the wait)


class Fetcher:
    def __init__(self, worker_id: str, queues: list[str] | None, batch_size: int, polling_interval: float,
                 buffer: PrefetchBuffer, in_flight: InFlight, stopping: threading.Event,
                 burst_idle: Callable[[], bool] | None = None, on_burst_done: Callable[[], None] | None = None,
                 ) -> None:
        """``burst_idle`` (nothing buffered, running or uncommitted) makes a burst fetcher: it calls
        ``on_burst_done`` and ends once the table had nothing eligible twice in a row."""
        self.worker_id = worker_id
        self.queues = queues
        self.batch_size = batch_size
        self.polling_interval = polling_interval
        self.buffer = buffer
        self.in_flight = in_flight
        self.stopping = stopping
        self.burst_idle = burst_idle
        self.on_burst_done = on_burst_done
        self.wakeup = threading.Event()
        self._idle_since: float | None = None
        self._backlog = False  # the last claim came back full

    def run(self) -> None:
        burst_idle = self.burst_idle
        while not self.stopping.is_set():
            if not self.buffer.wait_for_space(timeout=self.polling_interval, room=self.batch_size):
                continue
            if self.stopping.is_set():
                break
            # a full claim means a backlog: then take all the room there is (fewer claims per job)
            limit = max(1, self.buffer.free() if self._backlog else min(self.batch_size, self.buffer.free()))
            self.wakeup.clear()
            try:
                jobs = storage.fetch_batch(self.worker_id, limit, self.queues)
            except Exception:
                logger.exception("fetch failed (1002 WorkerLoopCrashed); retrying in 5 s")
                self.stopping.wait(5)
                continue
            self._backlog = len(jobs) == limit
            if jobs:
                self.in_flight.add(len(jobs))
                self.buffer.put_many(jobs)
                self._idle_since = None
                if self._backlog:
                    continue
            elif burst_idle is not None and self._burst_done(burst_idle()):
                logger.info("burst: nothing eligible left, stopping")
                if self.on_burst_done is not None:
                    self.on_burst_done()
                break
            self.wakeup.wait(BURST_WAIT if burst_idle is not None else self.polling_interval)

    def _burst_done(self, idle: bool) -> bool:
        """Idle twice in a row."""
        if not idle:
            self._idle_since = None
            return False
        if self._idle_since is None:
            self._idle_since = time.monotonic()
            return False
        return True

    def pump(self, source: storage.WakeSource) -> None:
        """Turn the database's wake-up signals into the fetcher's (runs on its own thread until shutdown)."""
        try:
            while not self.stopping.is_set():
                if source.wait(WAKE_SLICE):
                    self.wakeup.set()
        finally:
            source.close()
