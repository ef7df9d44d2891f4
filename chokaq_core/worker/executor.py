"""The executors: run one leased job each and hand its outcome to the completer (spec 03 §7.1 steps 5–11).

One thread per unit of capacity, never more, so a worker holds at most capacity + a few database
connections (a pool sized ``MAX_CONCURRENCY`` kept adding threads, each with its own connection,
because a slot frees before its thread idles). Every decision about a failure is a ``policy`` call.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from chokaq_core import metrics
from chokaq_core.conf import Config
from chokaq_core.domain import AttemptError, CancellationReason, Failure, HotJob, Retry, Success
from chokaq_core.handlers import CancellationToken, JobContext, encode_result
from chokaq_core.policy import (
    DEFAULT_FATAL,
    CircuitBreakers,
    Kind,
    Permit,
    RetryPolicy,
    cancellation_outcome,
    classify,
    decide_failure,
    is_circuit_fatal,
)
from chokaq_core.worker.completer import Outcome
from chokaq_core.worker.dispatcher import Leased
from chokaq_core.worker.executions import Executions
from chokaq_core.worker.invoke import drop_broken_connections, invoke, publish_progress
from chokaq_core.worker.threads import start_thread

logger = logging.getLogger("chokaq.worker")

# A handler asking the process to exit is a programming error, never retried: its job goes to the DLQ.
FATAL_EXCEPTIONS: tuple[type[BaseException], ...] = (*DEFAULT_FATAL, SystemExit, KeyboardInterrupt)


class Executor:
    """What one executor thread does with a leased job."""

    def __init__(self, cfg: Config, retry_policy: RetryPolicy, breakers: CircuitBreakers,
                 middleware: list[type], pipe_handler: Callable[..., Any] | None, executions: Executions,
                 stopping: threading.Event, complete: Callable[[Outcome], None],
                 finish_slot: Callable[[float | None], None]) -> None:
        self.cfg = cfg
        self.retry_policy = retry_policy  # replaced at run time by worker.set_retry_policy
        self.breakers = breakers
        self.middleware = middleware
        self.pipe_handler = pipe_handler
        self.executions = executions
        self.stopping = stopping
        self.complete = complete
        self.finish_slot = finish_slot

    def execute(self, item: Leased) -> None:
        job, attempt, permit = item
        if self.stopping.is_set():  # leased, never started (it waited for an executor): no attempt spent
            self.breakers.get(job.type).release(permit)
            self.complete(Retry(job.id, attempt - 1, 0.0))  # beaten as awaiting its commit from now on
            self.executions.unwait(job.id)
            self.finish_slot(None)
            return
        started = time.perf_counter()
        try:
            drop_broken_connections()
            self._execute_one(job, attempt, permit)
        except Exception:
            self.executions.unwait(job.id)  # in case it crashed before it began
            logger.exception("execution of %s crashed (1014)", job.id)
        finally:
            self.finish_slot(time.perf_counter() - started)

    def _execute_one(self, job: HotJob, attempt: int, permit: Permit) -> None:
        """Run one leased job (it is Processing and ours) and hand its outcome to the completer."""
        execution = self.executions.begin(job, attempt, self.cfg.execution_timeout(job.queue))
        token = execution.token
        if self.stopping.is_set():  # stop() may have cancelled the running ones just before we registered
            token.cancel(CancellationReason.SHUTDOWN)
        metrics.execution_started(job)
        try:
            outcome = self._run_handler(job, token, attempt, permit)
        finally:
            metrics.execution_ended(job)
            self.executions.end(job.id)
        metrics.execution_outcome(job, outcome, shutdown=token.reason == CancellationReason.SHUTDOWN)
        self.complete(outcome)

    def _run_handler(self, job: HotJob, token: CancellationToken, attempt: int, permit: Permit) -> Outcome:
        ctx = JobContext(
            job_id=job.id, job_type=job.type, queue=job.queue, attempt=attempt, created_by=job.created_by,
            created_at=job.created_at, cancellation=token, progress_sink=publish_progress,
        )
        started = time.perf_counter()
        try:
            token.raise_if_cancelled()
            value = invoke(job, ctx, self.middleware, self.pipe_handler)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt too: a handler cannot end the worker
            breaker = self.breakers.get(job.type)
            if classify(exc) == Kind.CANCELLED or (token.is_cancelled and isinstance(exc, asyncio.CancelledError)):
                breaker.release(permit)
                return self._cancelled(job, token, attempt)
            breaker.failure(permit, fatal=is_circuit_fatal(exc))
            metrics.job_failed(job, exc)
            decision = decide_failure(exc, attempt, job.created_at, datetime.now(UTC), self.retry_policy,
                                      fatal=FATAL_EXCEPTIONS)
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


class ExecutorPool:
    """Executor threads fed from one work queue, up to the limiter's capacity; never shrinks. A job leased
    ahead waits in the queue, Processing and ours: it is named in ``executions`` as waiting from its submission
    until an executor begins it, so the supervisor beats it.

    A thread is started when a job is submitted and no started thread is free to take it: under light load
    (jobs arriving one at a time) one thread runs them all, where threads started up front for the whole
    capacity each took their turn and each kept a database connection of its own (~60–150 KiB a thread with its
    stack, in every worker that ever ran ten jobs). Under load the threads reach the capacity as before.
    A thread the system refuses (``RuntimeError``) is retried by the next submission and the supervisor's tick."""

    def __init__(self, run: Callable[[Leased], None], executions: Executions) -> None:
        self.run = run
        self.executions = executions
        self._work: queue.SimpleQueue[Leased | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._capacity = 0
        self._spare = 0  # threads free to take a job (waiting or about to wait) minus jobs queued for them

    @property
    def threads(self) -> int:
        return len(self._threads)

    def submit(self, items: Sequence[Leased]) -> None:
        """Queue leased jobs for the executors (a lease's or a claim's batch: one lock for all of them)."""
        self.executions.wait([item[0].id for item in items])
        with self._lock:
            self._spare -= len(items)
            self._start_needed()
        for item in items:
            self._work.put(item)

    def take_waiting(self) -> list[Leased]:
        """Remove and return the jobs no executor has taken yet (at shutdown: they go back without running)."""
        taken: list[Leased] = []
        while True:
            try:
                item = self._work.get_nowait()
            except queue.Empty:
                break
            if item is None:  # a stop signal for an executor thread stays for it
                self._work.put(None)
                break
            taken.append(item)
        with self._lock:
            self._spare += len(taken)
        return taken

    def grow(self, capacity: int) -> None:
        """Allow executor threads up to ``capacity`` (capacity may grow at run time); start those that jobs
        already queued need."""
        with self._lock:
            self._capacity = max(self._capacity, capacity)
            self._start_needed()

    def start_needed(self) -> None:
        """Start the threads that queued jobs need and the system refused before (the supervisor's tick): a job
        whose thread was refused does not wait for the next submission."""
        with self._lock:
            self._start_needed()

    def _start_needed(self) -> None:
        """One thread for each queued job no free thread will take, within the capacity (under ``_lock``). A
        thread the system refuses is logged: the job waits for a free thread, and the next submission or the
        supervisor's next tick retries."""
        while self._spare < 0 and len(self._threads) < self._capacity:
            try:
                thread = start_thread(f"chokaq-exec-{len(self._threads) + 1}", self._loop)
            except RuntimeError:
                logger.exception("could not start an executor thread (%s running)", len(self._threads))
                return
            self._spare += 1  # the new thread's first wait, counted before it runs
            self._threads.append(thread)

    def _loop(self) -> None:
        while (item := self._work.get()) is not None:
            self.run(item)
            with self._lock:
                self._spare += 1

    def close(self, timeout: float = 5.0) -> None:
        """Stop the executor threads; each closes its own database connection as it exits."""
        with self._lock:
            threads, self._threads = self._threads, []
        for _ in threads:
            self._work.put(None)
        for thread in threads:
            thread.join(timeout)
