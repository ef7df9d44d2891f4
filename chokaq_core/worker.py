"""The worker process: fetcher, bounded prefetch buffer, dispatcher, executors,
batched completer, supervisor (heartbeats, timeouts, cancel requests,
registry) and rescue sweep — spec 03 §1–§4, §7, spec 02 §6–§9.

It knows no SQL and no HTTP: every database touch is a ``storage`` call, and
every decision about a failure is a ``policy`` call.

Threads (each with its own Django connection, held for the worker's life):

* **fetcher** claims batches (``storage.fetch_batch``) into the buffer; when a
  batch comes back short it waits for a wake-up or the polling interval.
* **listener** (PostgreSQL) wakes the fetcher on the ``NOTIFY`` of an enqueue;
  **probe** (SQLite) does so when the database's commit marker moves (read
  every 5 ms, lock-free).
* **dispatcher** takes rows from the buffer, releases those of paused queues,
  acquires a limiter slot and submits the execution to the pool.
* **executors** (thread pool) run the lease gate, the handler and the policy,
  then hand the outcome to the completer.
* **completer** moves finished jobs in batches: one transaction archives,
  reschedules and dead-letters everything finished in the last ~20 ms.
* **supervisor** keeps running jobs alive (one UPDATE per interval for all of
  them), enforces execution timeouts, applies operator cancel requests and
  writes the worker registry row.
* **rescue** recovers abandoned fetches and moves zombies to the DLQ.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import json
import logging
import os
import queue
import random
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import connections

from chokaq_core import events, metrics, storage
from chokaq_core.conf import Config, config
from chokaq_core.domain import (
    AttemptError,
    CancellationReason,
    Failure,
    HotJob,
    JobCancelledError,
    JobTypeNotRegisteredError,
    PayloadDeserializationError,
    Retry,
    Success,
    WorkerInfo,
)
from chokaq_core.handlers import CancellationToken, JobContext, encode_result, get_definition
from chokaq_core.middleware import JobCall, load_middleware, run_pipeline
from chokaq_core.policy import (
    BreakerPolicy,
    CircuitBreakers,
    CircuitStatus,
    Kind,
    Permit,
    RetryPolicy,
    cancellation_outcome,
    classify,
    decide_failure,
    is_circuit_fatal,
)

logger = logging.getLogger("chokaq.worker")

COMMIT_PROBE_INTERVAL = 0.005  # seconds between two reads of SQLite's commit marker (PRAGMA data_version)

Outcome = Success | Retry | Failure


def new_worker_id() -> str:
    """``<hostname>-<pid>-<4 hex>``: unique per process, ≤ 100 characters."""
    host = socket.gethostname()[:80]
    return f"{host}-{os.getpid()}-{secrets.token_hex(2)}"


class Limiter:
    """Dynamic concurrency limiter (spec 03 §4) built on a Condition."""

    def __init__(self, capacity: int, maximum: int) -> None:
        self.maximum = maximum
        self.capacity = max(1, min(capacity, maximum))
        self.running = 0
        self._closed = False
        self._cond = threading.Condition()

    def acquire(self, timeout: float | None = None) -> bool:
        with self._cond:
            ok = self._cond.wait_for(lambda: self._closed or self.running < self.capacity, timeout)
            if not ok or self._closed:
                return False
            self.running += 1
            return True

    def release(self) -> None:
        with self._cond:
            if self.running <= 0:
                self.running = 0
                raise RuntimeError("limiter released without a matching acquire")
            self.running -= 1
            self._cond.notify_all()

    def set_capacity(self, capacity: int) -> None:
        with self._cond:
            self.capacity = max(1, min(capacity, self.maximum))
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class PrefetchBuffer:
    """Bounded FIFO between fetcher and dispatcher (spec 03 §3)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: collections.deque[HotJob] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    def free(self) -> int:
        return self.capacity - len(self._items)

    def wait_for_space(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._closed or len(self._items) < self.capacity, timeout)

    def put_many(self, jobs: Sequence[HotJob]) -> None:
        with self._cond:
            self._items.extend(jobs)
            self._cond.notify_all()

    def get(self, timeout: float) -> HotJob | None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._closed or bool(self._items), timeout):
                return None
            if not self._items:
                return None
            job = self._items.popleft()
            self._cond.notify_all()
            return job

    def drain(self) -> list[HotJob]:
        with self._cond:
            items = list(self._items)
            self._items.clear()
            self._cond.notify_all()
            return items

    def take_queues(self, queues: set[str]) -> list[HotJob]:
        """Remove and return the buffered rows of ``queues`` (the others keep their order)."""
        if not queues:
            return []
        with self._cond:
            taken = [j for j in self._items if j.queue in queues]
            if taken:
                self._items = collections.deque(j for j in self._items if j.queue not in queues)
                self._cond.notify_all()
            return taken

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


@dataclass
class Execution:
    """One running job, as the supervisor sees it."""

    job: HotJob
    token: CancellationToken
    attempt: int
    deadline: float
    beating: bool = True


@dataclass
class WorkerOptions:
    queues: list[str] | None = None
    concurrency: int | None = None
    batch_size: int | None = None
    burst: bool = False
    rescue: bool = True
    worker_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Worker:
    def __init__(self, options: WorkerOptions | None = None) -> None:
        self.options = options or WorkerOptions()
        self.cfg: Config = config()
        wk = self.cfg.WORKER
        self.worker_id = self.options.worker_id or new_worker_id()
        self.queues = self.options.queues or None
        self.batch_size = max(1, min(self.options.batch_size or wk.FETCH_BATCH_SIZE, wk.PREFETCH_CAPACITY))
        self.limiter = Limiter(self.options.concurrency or wk.CONCURRENCY, wk.MAX_CONCURRENCY)
        self.buffer = PrefetchBuffer(wk.PREFETCH_CAPACITY)
        self.retry_policy = RetryPolicy(
            max_attempts=self.cfg.RETRY.MAX_ATTEMPTS, base_delay=self.cfg.RETRY.BASE_DELAY,
            max_delay=self.cfg.RETRY.MAX_DELAY, multiplier=self.cfg.RETRY.BACKOFF_MULTIPLIER,
            jitter=self.cfg.RETRY.JITTER_MAX_DELAY, max_job_age=self.cfg.RETRY.MAX_JOB_AGE,
        )
        self.breakers = CircuitBreakers(
            _breaker_policy(self.cfg.breaker_settings()),
            {key: _breaker_policy(self.cfg.breaker_settings(key)) for key in self.cfg.CIRCUIT_BREAKER.POLICIES},
            on_event=_log_circuit_event,
        )
        self.middleware = load_middleware(list(self.cfg.MIDDLEWARE))
        self.pipe_handler: Callable[..., Any] | None = None
        if self.cfg.MODE == "pipe":
            from django.utils.module_loading import import_string

            self.pipe_handler = import_string(str(self.cfg.PIPE_HANDLER))
        self.stopping = threading.Event()
        self.stopped = threading.Event()
        self._wakeup = threading.Event()
        self._outcomes: collections.deque[Outcome] = collections.deque()
        self._outcome_ready = threading.Event()
        self._unflushed = 0  # outcomes handed to the completer and not yet committed
        self._unflushed_lock = threading.Lock()
        self._running: dict[str, Execution] = {}
        self._running_lock = threading.Lock()
        # worker.cancel_job for a job not running here: job id → (expiry, actor), spec 02 §8 (under _running_lock)
        self._pending_cancels: dict[str, tuple[float, str | None]] = {}
        self._in_flight = 0  # rows taken by the dispatcher and not yet finished
        self._in_flight_lock = threading.Lock()
        # Executor threads: one per unit of capacity, never more, so a worker holds at most
        # capacity + a few database connections (a ThreadPoolExecutor sized MAX_CONCURRENCY kept
        # adding threads, each with its own connection, because a slot frees before its thread idles).
        self._work: queue.SimpleQueue[tuple[HotJob, int, Permit] | None] = queue.SimpleQueue()
        self._executors: list[threading.Thread] = []
        self._executors_lock = threading.Lock()
        self._pause_cache: tuple[float, set[str]] = (0.0, set())
        self._threads: list[threading.Thread] = []
        self._fetcher_stamp = datetime.now(UTC)
        self._registry_lock = threading.Lock()
        self._registry_closed = False
        self._idle_since: float | None = None
        self.exit_code = 0

    # ------------------------------------------------------------ lifecycle

    def banner(self) -> str:
        db = connections[storage.alias()]
        name = db.settings_dict.get("NAME")
        host = db.settings_dict.get("HOST") or ""
        where = f"{db.vendor} {host + '/' if host else ''}{name}"
        return (f"ChokaQ worker {self.worker_id} | database {where} | queues "
                f"{','.join(self.queues) if self.queues else '*'} | concurrency {self.limiter.capacity} | "
                f"batch {self.batch_size}{' | burst' if self.options.burst else ''}")

    def start(self) -> None:
        """Start every thread; returns at once (use :meth:`run` to block)."""
        self._register()
        if self.options.rescue:
            self.rescue_once()
        self._grow_executors()
        targets: list[tuple[str, Callable[[], None]]] = [
            ("chokaq-fetcher", self._fetch_loop),
            ("chokaq-dispatcher", self._dispatch_loop),
            ("chokaq-completer", self._complete_loop),
            ("chokaq-supervisor", self._supervise_loop),
        ]
        if self.options.rescue:
            targets.append(("chokaq-rescue", self._rescue_loop))
        if storage.vendor() == "postgresql" and not self.options.burst:
            targets.append(("chokaq-listener", self._listen_loop))
        elif not self.options.burst and self._commit_marker() is not None:  # SQLite: no push channel
            targets.append(("chokaq-probe", self._probe_loop))
        if not self.options.burst:
            targets.append(("chokaq-control", self._control_loop))
        if not self.options.burst:  # recurring jobs and the in-worker retention run (chokaq_core.maintenance)
            targets.append(("chokaq-periodic", self._periodic_loop))
        for name, target in targets:
            thread = threading.Thread(target=self._thread_main, args=(target,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        logger.info("worker %s started (1000): queues %s, concurrency %s", self.worker_id,
                    ",".join(self.queues or ["*"]), self.limiter.capacity)

    def run(self) -> int:
        self.start()
        self.stopped.wait()
        return self.exit_code

    def stop(self) -> None:
        """Begin graceful shutdown (spec 02 §9); :meth:`run` returns when it is done."""
        if self.stopping.is_set():
            return
        logger.info("worker %s shutting down", self.worker_id)
        self.stopping.set()
        self._wakeup.set()
        with self._running_lock:
            for execution in self._running.values():
                execution.token.cancel(CancellationReason.SHUTDOWN)
        threading.Thread(target=self._thread_main, args=(self._shutdown,), name="chokaq-shutdown",
                         daemon=True).start()

    def _shutdown(self) -> None:
        # Spec 02 §9.1: the fetcher stops claiming and closes the buffer. Wait for it, so that a claim
        # still on the wire when stop() was called lands in the buffer before the drain releases it.
        fetcher = next((t for t in self._threads if t.name == "chokaq-fetcher"), None)
        if fetcher is not None and fetcher is not threading.current_thread():
            fetcher.join(self.cfg.WORKER.SHUTDOWN_GRACE_PERIOD)
        self.buffer.close()
        self._release(self.buffer.drain())
        deadline = time.monotonic() + self.cfg.WORKER.SHUTDOWN_GRACE_PERIOD
        while time.monotonic() < deadline and (self._busy() or self._pending_outcomes()):
            time.sleep(0.02)
        if self._busy():
            logger.warning("worker %s exiting with %s executions still running (1016)", self.worker_id,
                           len(self._running))
        self.limiter.close()
        self._flush_outcomes()
        with self._registry_lock:  # no registry write may follow this one (spec 02 §9.5)
            self._registry_closed = True
            try:
                storage.stop_worker(self.worker_id)
            except Exception:
                logger.exception("could not mark worker %s stopped", self.worker_id)
        if not self._busy():  # stuck handlers keep their (daemon) threads
            self.close_executor_connections()
        logger.info("worker %s stopped (1001)", self.worker_id)
        self.stopped.set()

    def _grow_executors(self) -> None:
        """Start executor threads up to the limiter's capacity (capacity may grow at run time)."""
        with self._executors_lock:
            while len(self._executors) < self.limiter.capacity:
                thread = threading.Thread(target=self._thread_main, args=(self._executor_loop,),
                                          name=f"chokaq-exec-{len(self._executors) + 1}", daemon=True)
                thread.start()
                self._executors.append(thread)

    def _executor_loop(self) -> None:
        while (item := self._work.get()) is not None:
            self._execute(*item)

    def close_executor_connections(self, timeout: float = 5.0) -> None:
        """Stop the executor threads; each closes its own database connection as it exits."""
        with self._executors_lock:
            executors, self._executors = self._executors, []
        for _ in executors:
            self._work.put(None)
        for thread in executors:
            thread.join(timeout)

    def _thread_main(self, target: Callable[[], None]) -> None:
        try:
            target()
        except Exception:
            logger.exception("worker thread %s crashed", threading.current_thread().name)
        finally:
            connections.close_all()

    def _busy(self) -> bool:
        with self._in_flight_lock:
            return self._in_flight > 0

    def _pending_outcomes(self) -> bool:
        with self._unflushed_lock:
            return self._unflushed > 0

    # ------------------------------------------------------------ fetcher

    def _fetch_loop(self) -> None:
        wk = self.cfg.WORKER
        while not self.stopping.is_set():
            self._fetcher_stamp = datetime.now(UTC)
            if not self.buffer.wait_for_space(timeout=wk.POLLING_INTERVAL):
                continue
            if self.stopping.is_set():
                break
            limit = max(1, min(self.batch_size, self.buffer.free()))
            self._wakeup.clear()
            try:
                jobs = storage.fetch_batch(self.worker_id, limit, self.queues)
            except Exception:
                logger.exception("fetch failed (1002 WorkerLoopCrashed); retrying in 5 s")
                self.stopping.wait(5)
                continue
            if jobs:
                with self._in_flight_lock:
                    self._in_flight += len(jobs)
                self.buffer.put_many(jobs)
                self._idle_since = None
                if len(jobs) == limit:
                    continue
            elif self.options.burst and self._burst_done():
                logger.info("burst: nothing eligible left, stopping")
                self.stop()
                break
            self._wakeup.wait(wk.POLLING_INTERVAL if not self.options.burst else 0.05)

    def _burst_done(self) -> bool:
        """Idle twice in a row with nothing buffered, running or waiting to be committed."""
        if self._busy() or self._pending_outcomes() or len(self.buffer):
            self._idle_since = None
            return False
        if self._idle_since is None:
            self._idle_since = time.monotonic()
            return False
        return True

    def _commit_marker(self) -> int | None:
        try:
            return storage.change_marker()
        except Exception:
            logger.debug("commit marker unavailable", exc_info=True)
            return None

    def _probe_loop(self) -> None:
        """Where no push channel exists (SQLite): read the database's commit marker every
        ``COMMIT_PROBE_INTERVAL`` and wake the fetcher when another connection committed, so a new job is
        picked up within milliseconds instead of a ``POLLING_INTERVAL``. The marker is a lock-free read."""
        last = self._commit_marker()
        while not self.stopping.wait(COMMIT_PROBE_INTERVAL):
            marker = self._commit_marker()
            if marker is not None and marker != last:
                self._wakeup.set()
            last = marker

    def _listen_loop(self) -> None:
        """PostgreSQL LISTEN on its own connection: a NOTIFY from enqueue wakes the fetcher at once."""
        import psycopg

        from chokaq_core.sql.postgresql import NOTIFY_CHANNEL

        while not self.stopping.is_set():
            try:
                params = connections[storage.alias()].get_connection_params()
                params.pop("cursor_factory", None)
                params.pop("context", None)
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    while not self.stopping.is_set():
                        for _ in conn.notifies(timeout=1.0, stop_after=1):
                            self._wakeup.set()
            except Exception:
                logger.warning("LISTEN connection lost; falling back to polling for 5 s", exc_info=True)
                self.stopping.wait(5)

    # ------------------------------------------------------------ dispatcher

    def _dispatch_loop(self) -> None:
        while True:
            job = self.buffer.get(timeout=0.5)
            if job is None:
                if self.stopping.is_set():
                    return
                continue
            if self.stopping.is_set():
                self._release([job])
                continue
            if job.queue in self._paused_queues():
                self._release([job])
                continue
            # Waiting for a slot may take as long as a running job: meanwhile a pause must still release
            # this row and the buffered rows of its queue within the 2 s of spec 03 §6.
            acquired = paused = False
            while not acquired and not self.stopping.is_set():
                acquired = self.limiter.acquire(timeout=0.25)
                if not acquired:
                    now_paused = self._paused_queues()
                    self._release(self.buffer.take_queues(now_paused))
                    if job.queue in now_paused:
                        paused = True
                        break
            if acquired and job.queue in self._paused_queues():  # paused while this row waited
                self.limiter.release()
                acquired, paused = False, True
            if not acquired:
                self._release([job])
                if paused:
                    logger.debug("job %s released: queue %s paused", job.id, job.queue)
                continue
            self._lease_and_submit(self._gather(job))

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
            if job.queue in self._paused_queues():
                self.limiter.release()
                self._release([job])
                continue
            batch.append(job)
        return batch

    def _lease_and_submit(self, jobs: list[HotJob]) -> None:
        """Circuit permits, then the lease gate for the whole batch in one statement (spec 03 §7.1
        steps 2–4), then hand each leased job to an executor. Every job arrives holding a slot."""
        if self.stopping.is_set():  # shutting down: unstarted rows go back to Pending untouched
            for _ in jobs:
                self.limiter.release()
            self._release(jobs)
            return
        admitted: list[tuple[HotJob, Permit]] = []
        for job in jobs:
            permit = self.breakers.get(job.type).acquire()
            if permit is None:
                delay = self.cfg.RETRY.CIRCUIT_BREAKER_DELAY
                logger.info("circuit open for %s: job %s deferred %.1f s (2001)", job.type, job.id, delay)
                self._submit_outcome(Retry(job.id, job.attempt_count, delay))
                self._finish_slot()
            else:
                admitted.append((job, permit))
        if not admitted:
            return
        try:
            leased = storage.mark_processing_batch([job for job, _ in admitted], self.worker_id)
        except Exception:
            logger.exception("lease gate failed for %s jobs (1014); releasing them", len(admitted))
            for job, permit in admitted:
                self.breakers.get(job.type).release(permit)
                self.limiter.release()
            self._release([job for job, _ in admitted])  # user code never started: back to Pending
            return
        for job, permit in admitted:
            attempt = leased.get(job.id)
            if attempt is None:
                self.breakers.get(job.type).release(permit)
                logger.info("lease rejected for %s (2002): no longer Fetched by this worker", job.id)
                metrics.transition_conflict("MarkAsProcessing", job.queue, job.type)
                self._finish_slot()
            else:
                self._work.put((job, attempt, permit))

    def _finish_slot(self) -> None:
        with self._in_flight_lock:
            self._in_flight -= 1
        self.limiter.release()

    def _paused_queues(self) -> set[str]:
        stamp, paused = self._pause_cache
        if time.monotonic() - stamp > 0.25:
            try:
                paused = {q.name for q in storage.queue_states() if q.is_paused or not q.is_active}
            except Exception:
                logger.warning("could not read queue states", exc_info=True)
            self._pause_cache = (time.monotonic(), paused)
        return paused

    def _release(self, jobs: Sequence[HotJob]) -> None:
        if not jobs:
            return
        try:
            storage.release_jobs([j.id for j in jobs], self.worker_id)
        except Exception:
            logger.warning("release of %s prefetched jobs failed (1011); recovery will return them", len(jobs),
                           exc_info=True)
        finally:
            with self._in_flight_lock:
                self._in_flight -= len(jobs)

    # ------------------------------------------------------------ executor

    def _execute(self, job: HotJob, attempt: int, permit: Permit) -> None:
        try:
            _drop_broken_connections()
            self._execute_one(job, attempt, permit)
        except Exception:
            logger.exception("execution of %s crashed (1014)", job.id)
        finally:
            self._finish_slot()

    def _execute_one(self, job: HotJob, attempt: int, permit: Permit) -> None:
        """Run one leased job (it is Processing and ours) and hand its outcome to the completer."""
        token = CancellationToken()
        timeout = self.cfg.execution_timeout(job.queue)
        execution = Execution(job, token, attempt, time.monotonic() + timeout)
        with self._running_lock:
            self._running[job.id] = execution
            pending = self._pending_cancels.pop(job.id, None)
        if pending is not None and pending[0] > time.monotonic():  # cancelled before it started here
            token.cancel(CancellationReason.ADMIN, pending[1])
        if self.stopping.is_set():  # stop() may have swept _running just before we registered
            token.cancel(CancellationReason.SHUTDOWN)
        metrics.execution_started(job)
        try:
            outcome = self._run_handler(job, token, attempt, permit)
        finally:
            metrics.execution_ended(job)
            with self._running_lock:
                self._running.pop(job.id, None)
        metrics.execution_outcome(job, outcome, shutdown=token.reason == CancellationReason.SHUTDOWN)
        self._submit_outcome(outcome)

    def _run_handler(self, job: HotJob, token: CancellationToken, attempt: int, permit: Permit) -> Outcome:
        ctx = JobContext(
            job_id=job.id, job_type=job.type, queue=job.queue, attempt=attempt, created_by=job.created_by,
            created_at=job.created_at, cancellation=token, progress_sink=_publish_progress,
        )
        started = time.perf_counter()
        try:
            token.raise_if_cancelled()
            value = _invoke(job, ctx, self.middleware, self.pipe_handler)
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            breaker = self.breakers.get(job.type)
            if classify(exc) == Kind.CANCELLED or (token.is_cancelled and isinstance(exc, asyncio.CancelledError)):
                breaker.release(permit)
                return self._cancelled(job, token, attempt)
            breaker.failure(permit, fatal=is_circuit_fatal(exc))
            metrics.job_failed(job, exc)
            decision = decide_failure(exc, attempt, job.created_at, datetime.now(UTC), self.retry_policy)
            if decision.retry:
                logger.info("job %s attempt %s failed, retry in %.1f s (2022): %s", job.id, attempt, decision.delay,
                            exc)
                return Retry(job.id, attempt, decision.delay, AttemptError.of(exc))
            assert decision.reason is not None
            logger.warning("job %s failed terminally as %s", job.id, decision.reason.display_name)
            return Failure(job.id, decision.reason, decision.details, attempt, AttemptError.of(exc))
        duration_ms = (time.perf_counter() - started) * 1000
        self.breakers.get(job.type).success(permit)
        return Success(job.id, round(duration_ms, 3), encode_result(job.id, value))

    def _cancelled(self, job: HotJob, token: CancellationToken, attempt: int) -> Outcome:
        reason, details = cancellation_outcome(token.reason)
        if reason is None:
            logger.info("job %s interrupted by shutdown, rescheduled (2004)", job.id)
            return Retry(job.id, attempt, 0.0)
        if token.actor:
            details = f"{details}: {token.actor}"
        return Failure(job.id, reason, details)

    # ------------------------------------------------------------ completer

    def _submit_outcome(self, outcome: Outcome) -> None:
        with self._unflushed_lock:
            self._unflushed += 1
        self._outcomes.append(outcome)
        self._outcome_ready.set()

    def _complete_loop(self) -> None:
        wk = self.cfg.WORKER
        while not self.stopped.is_set():
            if not self._outcome_ready.wait(timeout=0.5):
                continue
            time.sleep(wk.COMPLETION_FLUSH_INTERVAL)  # let a batch gather
            self._outcome_ready.clear()
            self._flush_outcomes()

    def _flush_outcomes(self) -> None:
        size = self.cfg.WORKER.COMPLETION_BATCH_SIZE
        while self._outcomes:
            batch: list[Outcome] = []
            while self._outcomes and len(batch) < size:
                batch.append(self._outcomes.popleft())
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
                time.sleep(delay)
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

    # ------------------------------------------------------------ supervisor

    def _supervise_loop(self) -> None:
        ex, wk = self.cfg.EXECUTION, self.cfg.WORKER
        next_beat = time.monotonic() + self._beat_interval()
        next_cancel_poll = time.monotonic() + ex.CANCEL_POLL_INTERVAL
        next_registry = time.monotonic() + wk.REGISTRY_HEARTBEAT_INTERVAL
        failures = 0
        while not self.stopped.is_set():
            time.sleep(0.1)
            now = time.monotonic()
            with self._running_lock:
                running = list(self._running.values())
            for execution in running:
                if now >= execution.deadline and not execution.token.is_cancelled:
                    logger.warning("job %s exceeded its execution timeout", execution.job.id)
                    execution.token.cancel(CancellationReason.TIMEOUT)
            if now >= next_beat:
                next_beat = now + self._beat_interval()
                beating = [e for e in running if e.beating]
                if beating:
                    try:
                        owned = set(storage.keep_alive([e.job.id for e in beating], self.worker_id))
                        failures = 0
                        for execution in beating:
                            if execution.job.id not in owned:
                                logger.debug("job %s is no longer ours; heartbeat stopped", execution.job.id)
                                execution.beating = False
                    except Exception:
                        failures += 1
                        logger.warning("heartbeat failed (2006), %s in a row", failures, exc_info=True)
                        metrics.heartbeat_failed(e.job for e in beating)
                        if failures >= ex.HEARTBEAT_FAILURE_THRESHOLD:
                            failures = 0
                            if ex.CANCEL_ON_HEARTBEAT_FAILURE:
                                logger.error("heartbeat failure threshold reached; cancelling running jobs (2007)")
                                for execution in beating:
                                    execution.token.cancel(CancellationReason.HEARTBEAT_FAILURE)
                            else:
                                logger.error("heartbeat degraded (2008)")
            if running and now >= next_cancel_poll:
                next_cancel_poll = now + ex.CANCEL_POLL_INTERVAL
                try:
                    requests = storage.cancel_requests(self.worker_id)
                except Exception:
                    requests = []
                    logger.warning("could not read cancel requests", exc_info=True)
                with self._running_lock:
                    for job_id, actor in requests:
                        target = self._running.get(job_id)
                        # Admin wins over an earlier Timeout or Shutdown (spec 02 §8).
                        if target is not None and target.token.reason != CancellationReason.ADMIN:
                            target.token.cancel(CancellationReason.ADMIN, actor)
            if now >= next_registry:
                next_registry = now + wk.REGISTRY_HEARTBEAT_INTERVAL
                self._register()

    def _control_loop(self) -> None:
        events.listen_control(self.on_control, self.stopping)

    def on_control(self, message: dict[str, Any]) -> None:
        """Deck → worker commands over the channel layer (spec 03 §12); best effort, idempotent."""
        target = message.get("workerId")
        if target and target != self.worker_id:
            return
        kind = message.get("type")
        if kind == "worker.set_capacity":
            self.limiter.set_capacity(int(message["capacity"]))
            self._grow_executors()
            logger.info("worker %s capacity set to %s", self.worker_id, self.limiter.capacity)
            self._register()
        elif kind == "worker.set_retry_policy":
            self.retry_policy = RetryPolicy(
                max_attempts=int(message.get("max_attempts") or self.retry_policy.max_attempts),
                base_delay=float(message.get("base_delay_seconds") or self.retry_policy.base_delay),
                max_delay=self.retry_policy.max_delay, multiplier=self.retry_policy.multiplier,
                jitter=self.retry_policy.jitter, max_job_age=self.retry_policy.max_job_age,
            )
            self._register()
        elif kind == "worker.cancel_job":
            job_id = str(message.get("job_id") or message.get("jobId") or "")
            if not job_id:
                return
            actor = message.get("actor")
            now = time.monotonic()
            with self._running_lock:
                execution = self._running.get(job_id)
                if execution is None:
                    # Not running here (yet): remember it for PENDING_CANCELLATION_RETENTION (spec 02 §8).
                    self._pending_cancels = {k: v for k, v in self._pending_cancels.items() if v[0] > now}
                    retention = float(self.cfg.EXECUTION.PENDING_CANCELLATION_RETENTION)
                    self._pending_cancels[job_id] = (now + retention, actor)
            if execution is not None:
                execution.token.cancel(CancellationReason.ADMIN, actor)

    def _beat_interval(self) -> float:
        ex = self.cfg.EXECUTION
        return random.randint(int(ex.HEARTBEAT_INTERVAL_MIN * 1000), int(ex.HEARTBEAT_INTERVAL_MAX * 1000)) / 1000

    def _register(self) -> None:
        with self._registry_lock:
            if self._registry_closed:
                return
            try:
                storage.upsert_worker(WorkerInfo(
                    worker_id=self.worker_id, hostname=socket.gethostname()[:255], pid=os.getpid(),
                    queues=",".join(self.queues or ["*"]), capacity=self.limiter.capacity,
                    active_count=len(self._running),
                    runtime_json=json.dumps({"maxAttempts": self.retry_policy.max_attempts,
                                             "baseDelaySeconds": self.retry_policy.base_delay}),
                    circuits_json=json.dumps(self.breakers.snapshot()),
                ))
            except Exception:
                logger.warning("worker registry write failed", exc_info=True)

    # ------------------------------------------------------------ rescue

    def _rescue_loop(self) -> None:
        while not self.stopping.wait(self.cfg.RECOVERY.SCAN_INTERVAL):
            self.rescue_once()

    def _periodic_loop(self) -> None:
        from chokaq_core import maintenance

        maintenance.periodic(self.stopping, self.cfg)

    def rescue_once(self) -> tuple[int, int]:
        from chokaq_core import maintenance

        try:
            return maintenance.rescue(self.cfg)
        except Exception:
            logger.exception("rescue sweep failed (4003)")
            return 0, 0


# ---------------------------------------------------------------- dispatch


def _drop_broken_connections() -> None:
    """Before each handler, what Django does per request (``close_if_unusable_or_obsolete``) minus the age
    rule: a connection of this executor thread that saw a database error and no longer answers is closed,
    so the handler's next query reconnects. Without it a database restart leaves every pool thread holding
    a dead connection and each handler fails ("the connection is closed") until its retries run out."""
    for conn in connections.all(initialized_only=True):
        try:
            if conn.connection is not None and conn.errors_occurred and not conn.in_atomic_block:
                if conn.is_usable():
                    conn.errors_occurred = False
                else:
                    conn.close()
        except Exception:
            logger.debug("dropping a broken connection failed", exc_info=True)
            conn.connection = None


def _invoke(job: HotJob, ctx: JobContext, middleware: list[type], pipe: Callable[..., Any] | None) -> Any:
    """Resolve, decode and call the handler inside the middleware onion (spec 03 §7.1 step 7, §10, §14).

    Bus mode: type key → ``@job`` function → ``func(ctx, **payload)``. Pipe mode: one function
    ``pipe(job_type, payload_text, ctx)`` receives every raw payload.
    """
    if pipe is not None:
        call = JobCall(job.type, job.payload or "")
        return run_pipeline(middleware, ctx, call, lambda: _call(pipe, ctx.cancellation, job.type, job.payload or "",
                                                                  ctx))
    definition = get_definition(job.type)
    if definition is None:
        raise JobTypeNotRegisteredError(f"no handler is registered for job type {job.type!r} in this worker")
    try:
        payload = json.loads(job.payload) if job.payload else {}
    except ValueError as exc:
        raise PayloadDeserializationError(f"payload of job {job.id} is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise PayloadDeserializationError(
            f"payload of job {job.id} must be a JSON object of handler arguments, got {type(payload).__name__}"
        )
    try:
        key = definition.execution_key(payload)
    except (KeyError, IndexError, ValueError) as exc:
        raise PayloadDeserializationError(f"cannot build the idempotency key of job {job.id}: {exc!r}") from exc
    call = JobCall(job.type, payload, key, definition.result_ttl)
    return run_pipeline(middleware, ctx, call, lambda: _call(definition.func, ctx.cancellation, ctx, **payload))


def _call(func: Callable[..., Any], token: CancellationToken, *args: Any, **kwargs: Any) -> Any:
    """Call a sync handler, or drive an async one to completion on this thread's own loop."""
    if inspect.iscoroutinefunction(func):
        return asyncio.run(_drive(func(*args, **kwargs), token))
    return func(*args, **kwargs)


def _breaker_policy(values: dict[str, float]) -> BreakerPolicy:
    return BreakerPolicy(
        failure_threshold=int(values["FAILURE_THRESHOLD"]), break_duration=float(values["BREAK_DURATION_SECONDS"]),
        half_open_max_calls=int(values["HALF_OPEN_MAX_CALLS"]),
        half_open_probe_timeout=float(values["HALF_OPEN_PROBE_TIMEOUT_SECONDS"]),
        failure_window=float(values["FAILURE_WINDOW_SECONDS"]),
    )


def _log_circuit_event(key: str, event: str, status: CircuitStatus) -> None:
    level = logging.WARNING if event in ("opened", "half_opened", "closed") else logging.DEBUG
    logger.log(level, "circuit %s %s (now %s)", key, event, status.name)
    metrics.circuit_event(key, event, {0: "Closed", 1: "Open", 2: "HalfOpen"}.get(int(status), status.name))


async def _drive(coro: Any, token: CancellationToken) -> Any:
    """Run an async handler; cancel its task at the next await once the token is cancelled."""
    task = asyncio.ensure_future(coro)
    while not task.done():
        await asyncio.wait({task}, timeout=0.05)
        if token.is_cancelled and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                raise JobCancelledError(token.reason) from None
    return task.result()


def _publish_progress(job_id: str, percent: int, message: str | None) -> None:
    events.dispatch([events.Event(events.EventKind.JOB_PROGRESS,
                                  {"jobId": job_id, "percentage": percent, "message": message})])

