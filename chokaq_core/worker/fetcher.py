"""The fetcher: claims batches of Pending rows into the prefetch buffer (spec 03 §2).

It claims when a whole batch fits (never one row per freed slot: under a backlog that made the claim a
transaction per job). A full batch means more is waiting, so it claims again at once; a short one makes it
wait on the database's wake-up source itself (push or commit marker: the thread that receives the signal is
the one that claims, nothing hands it on) or for the polling interval. A burst fetcher stops the worker once
nothing is eligible any more.
Under rate limits (followed from the database by :class:`RateLimits`, which the dispatcher's lease shares)
the claim takes no more than the tokens there are now, and a claim that was held back waits only until the
limit's next token; the lease spends the tokens (see ``storage.mark_processing_batch``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from chokaq_core import storage
from chokaq_core.domain import ClaimedJobs, HotJob, JobStatus, RateLimit
from chokaq_core.worker.limits import InFlight, PrefetchBuffer

logger = logging.getLogger("chokaq.worker")

BURST_WAIT = 0.05  # seconds a burst fetcher waits between two looks at an empty table
FOLLOW_INTERVAL = 0.5  # seconds between two reads of the rate limits (an operator's change applies within ~1 s)
MIN_TOKEN_WAIT = 0.01  # seconds: the shortest wait for a limit's next token


class RateLimits:
    """The rate limits in force for this worker's queues, as the database holds them (declared, overridden,
    paused or lifted), read again at most every ``interval`` seconds. The fetcher's claims and the
    dispatcher's leases share one (each thread asks it; one of them reads the database when it is due)."""

    def __init__(self, queues: Sequence[str] | None, interval: float = FOLLOW_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.queues = set(queues) if queues else None
        self.interval = interval
        self.clock = clock
        self._limits: list[RateLimit] = []
        self._read_at: float | None = None
        self._lock = threading.Lock()

    def current(self) -> list[RateLimit]:
        with self._lock:
            now = self.clock()
            if self._read_at is None or now - self._read_at >= self.interval:
                self._read_at = now
                try:
                    self._limits = [limit for state in storage.rate_limits()
                                    if (limit := state.limit) is not None and self._concerns(limit)]
                except Exception:
                    logger.exception("reading the rate limits failed; the last ones read stay in force")
            return self._limits

    def _concerns(self, limit: RateLimit) -> bool:
        scope, _, target = limit.name.partition(":")
        return scope != "queue" or self.queues is None or target in self.queues


class Fetcher:
    def __init__(self, worker_id: str, queues: list[str] | None, batch_size: int, polling_interval: float,
                 buffer: PrefetchBuffer, in_flight: InFlight, stopping: threading.Event,
                 burst_idle: Callable[[], bool] | None = None, on_burst_done: Callable[[], None] | None = None,
                 rate_limits: RateLimits | None = None) -> None:
        """``burst_idle`` (nothing buffered, running or uncommitted) makes a burst fetcher: it calls
        ``on_burst_done`` and ends once the table had nothing eligible twice in a row. ``rate_limits``: the
        limits the claims follow (none when not given)."""
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
        self.rate_limits = rate_limits
        # Leasing at the claim (set by the worker: the dispatcher's reserve and start_claimed). With free slots
        # (no rate limit in force), the claim leases as many of its rows as there are free slots, straight to executors:
        # one statement and one hand-off fewer per job, and a row is Processing only with a slot to run on.
        self.reserve: Callable[[int], int] | None = None
        self.start_claimed: Callable[[Sequence[HotJob], int], None] | None = None
        # The database's wake-up source (set by the worker; none: a burst, which only polls). The fetcher waits on
        # it itself and closes it when it ends; stop() closes it too, which ends a wait in progress.
        self.source: storage.WakeSource | None = None

    def run(self) -> None:
        try:
            self._claim_loop()
        finally:
            if self.source is not None:
                self.source.close()

    def _claim_loop(self) -> None:
        burst_idle = self.burst_idle
        if self.source is not None:
            self.source.wait(0)  # listening (or the commit marker read) before the first claim: no signal lost
        while not self.stopping.is_set():
            if not self.buffer.wait_for_space(timeout=self.polling_interval, room=self.batch_size):
                continue
            if self.stopping.is_set():
                break
            # a full claim means a backlog: then take all the room there is (fewer claims per job)
            limit = max(1, self.buffer.free() if self._backlog else min(self.batch_size, self.buffer.free()))
            self.wakeup.clear()
            reserved = 0
            try:
                rate_limits = self.rate_limits.current() if self.rate_limits is not None else []
                if rate_limits:  # the lease spends the tokens: no leasing at the claim
                    jobs = storage.fetch_batch(self.worker_id, limit, self.queues, rate_limits)
                else:
                    if self.reserve is not None:
                        reserved = self.reserve(limit)
                    jobs = (storage.fetch_batch(self.worker_id, limit, self.queues, lease=reserved) if reserved
                            else storage.fetch_batch(self.worker_id, limit, self.queues))
            except Exception:
                logger.exception("fetch failed (1002 WorkerLoopCrashed); retrying in 5 s")
                self._start_claimed([], reserved)
                self.stopping.wait(5)
                continue
            self._backlog = len(jobs) == limit
            held_for = jobs.held_for if isinstance(jobs, ClaimedJobs) else None
            leased = [job for job in jobs if job.status == JobStatus.PROCESSING] if reserved else []
            self.in_flight.add(len(jobs))
            self._start_claimed(leased, reserved)  # the leased rows to executors, the slots none took freed
            if jobs:
                self.buffer.put_many([job for job in jobs if job.status != JobStatus.PROCESSING] if leased else jobs)
                self._idle_since = None
                if self._backlog:
                    continue
            elif burst_idle is not None and held_for is None and self._burst_done(burst_idle()):
                logger.info("burst: nothing eligible left, stopping")
                if self.on_burst_done is not None:
                    self.on_burst_done()
                break
            wait = BURST_WAIT if burst_idle is not None else self.polling_interval
            if rate_limits:  # follow the limits' changes, and take the next token when it comes
                wait = min(wait, FOLLOW_INTERVAL, max(MIN_TOKEN_WAIT, held_for) if held_for is not None else wait)
            self._idle(wait)

    def _start_claimed(self, leased: Sequence[HotJob], reserved: int) -> None:
        if reserved and self.start_claimed is not None:
            self.start_claimed(leased, reserved)

    def _burst_done(self, idle: bool) -> bool:
        """Idle twice in a row."""
        if not idle:
            self._idle_since = None
            return False
        if self._idle_since is None:
            self._idle_since = time.monotonic()
            return False
        return True

    def _idle(self, seconds: float) -> None:
        """Wait up to ``seconds`` for the wake-up source's signal (for ``wakeup`` without a source)."""
        if self.source is None:
            self.wakeup.wait(seconds)
        elif not self.stopping.is_set():
            self.source.wait(seconds)
