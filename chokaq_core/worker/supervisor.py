"""The supervisor: keeps running jobs alive, enforces execution timeouts, applies operator cancel requests
and keeps the worker registry row fresh (spec 02 §6–§8, 03 §7.2, §12); every tick it also starts the executor
threads that queued jobs wait for and the system refused before; plus the rescue sweep.

Keep-alive is one UPDATE per interval for every row the process holds Processing: running, leased and waiting
for an executor, or finished and waiting for its completion to commit. A running job the UPDATE did not touch is
no longer ours and stops beating; repeated failures cancel the running jobs (``CANCEL_ON_HEARTBEAT_FAILURE``) or
only log that the heartbeat is degraded.

A heartbeat never names a row that a completion in progress has locked: it holds the completer's ``taking`` lock
from reading what to beat until its UPDATE returns, so no batch is taken meanwhile. (The two statements lock rows
in different orders: a heartbeat that met a completion deadlocked with it — a second lost for both — or waited as
long as the completion waited on another worker's locks, while none of the process's rows was beaten.)
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext

from chokaq_core import maintenance, metrics, storage
from chokaq_core.conf import Config
from chokaq_core.domain import CancellationReason, WorkerInfo
from chokaq_core.worker.executions import Execution, Executions

logger = logging.getLogger("chokaq.worker")

TICK = 0.1  # seconds between two looks at the running executions


class Registry:
    """The worker's ``Workers`` row: written at start, every ``REGISTRY_HEARTBEAT_INTERVAL`` and on
    changes, closed once at shutdown (no write may follow, spec 02 §9.5)."""

    def __init__(self, worker_id: str, describe: Callable[[], WorkerInfo]) -> None:
        self.worker_id = worker_id
        self.describe = describe
        self._lock = threading.Lock()
        self._closed = False

    def write(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                storage.upsert_worker(self.describe())
            except Exception:
                logger.warning("worker registry write failed", exc_info=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            try:
                storage.stop_worker(self.worker_id)
            except Exception:
                logger.exception("could not mark worker %s stopped", self.worker_id)


class Supervisor:
    def __init__(self, worker_id: str, cfg: Config, executions: Executions, registry: Registry,
                 stopped: threading.Event, awaiting: Callable[[], list[str]] = list,
                 taking: AbstractContextManager[object] | None = None,
                 start_needed: Callable[[], None] = lambda: None) -> None:
        """``awaiting``: the finished jobs whose completion is not committed yet (the completer's); ``taking``:
        held while nothing named by ``awaiting`` can be taken into a completion (the completer's lock);
        ``start_needed``: called every tick to start the executor threads queued jobs wait for (the pool's)."""
        self.worker_id = worker_id
        self.awaiting = awaiting
        self.taking = taking if taking is not None else nullcontext()
        self.cfg = cfg
        self.executions = executions
        self.registry = registry
        self.stopped = stopped
        self.start_needed = start_needed
        self._failures = 0  # keep-alive failures in a row

    def run(self) -> None:
        ex, wk = self.cfg.EXECUTION, self.cfg.WORKER
        next_beat = time.monotonic() + self.beat_interval()
        next_cancel_poll = time.monotonic() + ex.CANCEL_POLL_INTERVAL
        next_registry = time.monotonic() + wk.REGISTRY_HEARTBEAT_INTERVAL
        while not self.stopped.is_set():
            time.sleep(TICK)
            now = time.monotonic()
            self.start_needed()
            running = self.executions.snapshot()
            self.enforce_timeouts(running, now)
            if now >= next_beat:
                next_beat = now + self.beat_interval()
                self.beat()
            if running and now >= next_cancel_poll:
                next_cancel_poll = now + ex.CANCEL_POLL_INTERVAL
                self.apply_cancel_requests()
            if now >= next_registry:
                next_registry = now + wk.REGISTRY_HEARTBEAT_INTERVAL
                self.registry.write()

    def enforce_timeouts(self, running: list[Execution], now: float) -> None:
        for execution in running:
            if now >= execution.deadline and not execution.token.is_cancelled:
                logger.warning("job %s exceeded its execution timeout", execution.job.id)
                execution.token.cancel(CancellationReason.TIMEOUT)

    def beat(self) -> None:
        """One heartbeat for every row the process holds Processing, read and sent while no completion can take
        any of them."""
        with self.taking:
            running, waiting = self.executions.beats()
            self.keep_alive([e for e in running if e.beating], waiting)

    def keep_alive(self, beating: list[Execution], waiting: Sequence[str] = ()) -> None:
        """One heartbeat for the running jobs still ours, the rows leased and ``waiting`` for an executor and the
        finished jobs whose completion is not committed yet."""
        awaiting = self.awaiting()
        if not beating and not waiting and not awaiting:
            return
        ex = self.cfg.EXECUTION
        try:
            owned = set(storage.keep_alive([*(e.job.id for e in beating), *waiting, *awaiting], self.worker_id))
        except Exception:
            self._failures += 1
            logger.warning("heartbeat failed (2006), %s in a row", self._failures, exc_info=True)
            metrics.heartbeat_failed(e.job for e in beating)
            if self._failures >= ex.HEARTBEAT_FAILURE_THRESHOLD:
                self._failures = 0
                if ex.CANCEL_ON_HEARTBEAT_FAILURE:
                    logger.error("heartbeat failure threshold reached; cancelling running jobs (2007)")
                    for execution in beating:
                        execution.token.cancel(CancellationReason.HEARTBEAT_FAILURE)
                else:
                    logger.error("heartbeat degraded (2008)")
            return
        self._failures = 0
        for execution in beating:
            if execution.job.id not in owned:
                logger.debug("job %s is no longer ours; heartbeat stopped", execution.job.id)
                execution.beating = False

    def apply_cancel_requests(self) -> None:
        try:
            requests = storage.cancel_requests(self.worker_id)
        except Exception:
            logger.warning("could not read cancel requests", exc_info=True)
            return
        self.executions.apply_cancel_requests(requests)

    def beat_interval(self) -> float:
        ex = self.cfg.EXECUTION
        return random.randint(int(ex.HEARTBEAT_INTERVAL_MIN * 1000), int(ex.HEARTBEAT_INTERVAL_MAX * 1000)) / 1000


def rescue_once(cfg: Config) -> tuple[int, int]:
    """One rescue sweep (abandoned fetches back to Pending, zombies to the DLQ); errors are logged."""
    try:
        return maintenance.rescue(cfg)
    except Exception:
        logger.exception("rescue sweep failed (4003)")
        return 0, 0


def rescue_loop(cfg: Config, stopping: threading.Event) -> None:
    while not stopping.wait(cfg.RECOVERY.SCAN_INTERVAL):
        rescue_once(cfg)
