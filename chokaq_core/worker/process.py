"""The worker process: the services of ``chokaq_core.worker`` wired together (spec 03 §1–§4, 02 §9).

fetcher → prefetch buffer → dispatcher (limiter, lease gate) → executor pool → completer, watched by
the supervisor; the wake-up source comes from storage, the control channel from events.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import connections
from django.utils.module_loading import import_string

from chokaq_core import events, maintenance, metrics, storage
from chokaq_core.conf import Config, config
from chokaq_core.domain import CancellationReason, WorkerInfo
from chokaq_core.handlers import declared_rate_limits
from chokaq_core.middleware import load_middleware
from chokaq_core.policy import BreakerPolicy, CircuitBreakers, CircuitStatus, RetryPolicy
from chokaq_core.worker.completer import Completer
from chokaq_core.worker.control import Control
from chokaq_core.worker.dispatcher import Dispatcher
from chokaq_core.worker.executions import Executions
from chokaq_core.worker.executor import Executor, ExecutorPool
from chokaq_core.worker.fetcher import Fetcher, RateLimits
from chokaq_core.worker.limits import InFlight, Limiter, PrefetchBuffer
from chokaq_core.worker.supervisor import Registry, Supervisor, rescue_loop, rescue_once
from chokaq_core.worker.threads import start_thread

logger = logging.getLogger("chokaq.worker")


def new_worker_id() -> str:
    """``<hostname>-<pid>-<4 hex>``: unique per process, ≤ 100 characters."""
    host = socket.gethostname()[:80]
    return f"{host}-{os.getpid()}-{secrets.token_hex(2)}"


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
    """One worker process's services, wired: :meth:`start` runs each on its own thread, :meth:`stop` shuts
    down gracefully (unstarted rows back to Pending, running handlers cancelled, outcomes committed)."""

    def __init__(self, options: WorkerOptions | None = None) -> None:
        self.options = options or WorkerOptions()
        self.cfg: Config = config()
        cfg, wk = self.cfg, self.cfg.WORKER
        self.worker_id = self.options.worker_id or new_worker_id()
        self.queues = self.options.queues or None
        self.batch_size = max(1, min(self.options.batch_size or wk.FETCH_BATCH_SIZE, wk.PREFETCH_CAPACITY))
        # Leases run ahead of the executors by what they finish in AHEAD_WAIT, at most a prefetch buffer's worth: capped
        # at one batch, the slots (executors + 20) bounded a drain of short jobs at slots / lease round trip.
        self.limiter = Limiter(self.options.concurrency or wk.CONCURRENCY, wk.MAX_CONCURRENCY, wk.PREFETCH_CAPACITY)
        self.buffer = PrefetchBuffer(wk.PREFETCH_CAPACITY)
        self.breakers = CircuitBreakers(
            _breaker_policy(cfg.breaker_settings()),
            {key: _breaker_policy(cfg.breaker_settings(key)) for key in cfg.CIRCUIT_BREAKER.POLICIES},
            on_event=CircuitLog(),
        )
        self.stopping = threading.Event()
        self.stopped = threading.Event()
        self.in_flight = InFlight()
        self.executions = Executions(float(cfg.EXECUTION.PENDING_CANCELLATION_RETENTION))
        self.completer = Completer(self.worker_id, wk.COMPLETION_BATCH_SIZE, wk.COMPLETION_FLUSH_INTERVAL,
                                   self.stopped)
        self.rate_limits = RateLimits(self.queues)  # one view of the limits: claims read them, leases spend them
        self.fetcher = Fetcher(self.worker_id, self.queues, self.batch_size, wk.POLLING_INTERVAL, self.buffer,
                               self.in_flight, self.stopping,
                               burst_idle=self._burst_idle if self.options.burst else None, on_burst_done=self.stop,
                               rate_limits=self.rate_limits)
        self.executor = Executor(cfg, _retry_policy(cfg), self.breakers, load_middleware(list(cfg.MIDDLEWARE)),
                                 import_string(str(cfg.PIPE_HANDLER)) if cfg.MODE == "pipe" else None,
                                 self.executions, self.stopping, self.completer.submit, self._finish_slot)
        self.pool = ExecutorPool(self.executor.execute, self.executions)
        self.dispatcher = Dispatcher(self.worker_id, self.batch_size, cfg.RETRY.CIRCUIT_BREAKER_DELAY, self.buffer,
                                     self.limiter, self.in_flight, self.breakers, self.stopping, self.pool.submit,
                                     self.completer.submit, self.rate_limits)
        self.fetcher.reserve, self.fetcher.start_claimed = self.dispatcher.reserve, self.dispatcher.start_claimed
        self.registry = Registry(self.worker_id, self._describe)
        self.supervisor = Supervisor(self.worker_id, cfg, self.executions, self.registry, self.stopped,
                                     self.completer.awaiting, self.completer.taking, self.pool.start_needed)
        self.control = Control(self.worker_id, self.limiter, self.pool.grow, self.executor, self.executions,
                               self.registry.write)
        self.wake_source: storage.WakeSource | None = None
        self._threads: list[threading.Thread] = []
        self.exit_code = 0

    def banner(self) -> str:
        db = connections[storage.alias()]
        name = db.settings_dict.get("NAME")
        host = db.settings_dict.get("HOST") or ""
        where = f"{db.vendor} {host + '/' if host else ''}{name}"
        return (f"ChokaQ worker {self.worker_id} | database {where} | queues "
                f"{','.join(self.queues) if self.queues else '*'} | concurrency {self.limiter.capacity} | "
                f"batch {self.batch_size}{' | burst' if self.options.burst else ''}")

    def start(self) -> None:
        """Start every service on its thread; returns at once (use :meth:`run` to block)."""
        burst, rescue = self.options.burst, self.options.rescue
        self.registry.write()
        storage.declare_rate_limits(declared_rate_limits())
        if rescue:
            rescue_once(self.cfg)
        self.pool.grow(self.limiter.capacity)
        targets: list[tuple[str, Callable[[], None]]] = [
            ("chokaq-fetcher", _engine(self.fetcher.run)),
            ("chokaq-dispatcher", _engine(self.dispatcher.run)),
            ("chokaq-completer", _engine(self.completer.run)),
            ("chokaq-supervisor", _engine(self.supervisor.run)),
        ]
        if rescue:
            targets.append(("chokaq-rescue", lambda: rescue_loop(self.cfg, self.stopping)))
        if not burst:
            self.wake_source = self.fetcher.source = storage.wake_source()  # the fetcher waits on it itself
            targets.append(("chokaq-control", lambda: events.listen_control(self.on_control, self.stopping)))
            # recurring jobs and the in-worker retention run
            targets.append(("chokaq-periodic", lambda: maintenance.periodic(self.stopping, self.cfg)))
        self._threads.extend(start_thread(name, target) for name, target in targets)
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
        self.fetcher.wakeup.set()
        if self.wake_source is not None:
            self.wake_source.close()
        self.executions.cancel_all(CancellationReason.SHUTDOWN)
        start_thread("chokaq-shutdown", self._shutdown)

    def _shutdown(self) -> None:
        # Spec 02 §9.1: the fetcher stops claiming and closes the buffer. Wait for it, so that a claim
        # still on the wire when stop() was called lands in the buffer before the drain releases it.
        grace = self.cfg.WORKER.SHUTDOWN_GRACE_PERIOD
        fetcher = next((t for t in self._threads if t.name == "chokaq-fetcher"), None)
        if fetcher is not None and fetcher is not threading.current_thread():
            fetcher.join(grace)
        self.buffer.close()
        self.dispatcher.release(self.buffer.drain())
        for item in self.pool.take_waiting():  # leased ahead, never started: back at once, without their attempt
            self.executor.execute(item)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and (self.in_flight or self.completer.pending()):
            time.sleep(0.02)
        if self.in_flight:
            logger.warning("worker %s exiting with %s executions still running (1016)", self.worker_id,
                           len(self.executions))
        self.limiter.close()
        self.completer.flush()
        self.registry.close()
        if not self.in_flight:  # stuck handlers keep their (daemon) threads
            self.close_executor_connections()
        logger.info("worker %s stopped (1001)", self.worker_id)
        self.stopped.set()

    def close_executor_connections(self, timeout: float = 5.0) -> None:
        """Stop the executor threads; each closes its own database connection as it exits."""
        self.pool.close(timeout)

    def on_control(self, message: dict[str, Any]) -> None:
        """Deck → worker commands over the channel layer (spec 03 §12)."""
        self.control.handle(message)

    @property
    def retry_policy(self) -> RetryPolicy:
        return self.executor.retry_policy

    def _finish_slot(self, ran: float | None) -> None:
        self.dispatcher.finish_slot(ran)

    def _burst_idle(self) -> bool:
        """Nothing buffered, running or waiting to be committed."""
        return not (self.in_flight or self.completer.pending() or len(self.buffer))

    def _describe(self) -> WorkerInfo:
        policy = self.executor.retry_policy
        return WorkerInfo(
            worker_id=self.worker_id, hostname=socket.gethostname()[:255], pid=os.getpid(),
            queues=",".join(self.queues or ["*"]), capacity=self.limiter.capacity,
            active_count=len(self.executions),
            runtime_json=json.dumps({"maxAttempts": policy.max_attempts, "baseDelaySeconds": policy.base_delay}),
            circuits_json=json.dumps(self.breakers.snapshot()),
        )


def _engine(target: Callable[[], None]) -> Callable[[], None]:
    """``target`` on a thread that runs only the engine's statements (``storage.engine_thread``)."""
    def run() -> None:
        storage.engine_thread()
        target()
    return run


def _retry_policy(cfg: Config) -> RetryPolicy:
    retry = cfg.RETRY
    return RetryPolicy(max_attempts=retry.MAX_ATTEMPTS, base_delay=retry.BASE_DELAY, max_delay=retry.MAX_DELAY,
                       multiplier=retry.BACKOFF_MULTIPLIER, jitter=retry.JITTER_MAX_DELAY,
                       max_job_age=retry.MAX_JOB_AGE)


def _breaker_policy(values: dict[str, float]) -> BreakerPolicy:
    return BreakerPolicy(
        failure_threshold=int(values["FAILURE_THRESHOLD"]), break_duration=float(values["BREAK_DURATION_SECONDS"]),
        half_open_max_calls=int(values["HALF_OPEN_MAX_CALLS"]),
        half_open_probe_timeout=float(values["HALF_OPEN_PROBE_TIMEOUT_SECONDS"]),
        failure_window=float(values["FAILURE_WINDOW_SECONDS"]),
    )


class CircuitLog:
    """The worker's circuit log: one WARNING line per state change (opened, half-opened, closed) carrying how many
    jobs were deferred since the previous change, never one line per deferred job (a busy type behind an open
    breaker defers thousands a minute). Every event still feeds the metrics."""

    STATE_CHANGES = ("opened", "half_opened", "closed")

    def __init__(self) -> None:
        self._deferred: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, key: str, event: str, status: CircuitStatus) -> None:
        metrics.circuit_event(key, event, {0: "Closed", 1: "Open", 2: "HalfOpen"}.get(int(status), status.name))
        if event == "rejected":
            with self._lock:
                self._deferred[key] = self._deferred.get(key, 0) + 1
            return
        if event not in self.STATE_CHANGES:
            logger.debug("circuit %s %s (now %s)", key, event, status.name)
            return
        with self._lock:
            deferred = self._deferred.pop(key, 0)
        logger.warning("circuit %s %s (now %s; %s job(s) deferred since the previous change)", key, event,
                       status.name, deferred)
