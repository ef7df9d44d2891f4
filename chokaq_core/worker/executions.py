"""The jobs this worker process holds leased — waiting for an executor or running — and the cancel requests
waiting for a job that is not running here yet (spec 02 §8): shared by the dispatcher, the executors, the
supervisor and the control channel.

A leased row is Processing and ours from its lease's commit until its completion commits, whether a handler
runs it yet or not: the supervisor beats every one of them. A row leased ahead (it waits for an executor) is
named here from the moment its lease returns until :meth:`Executions.begin` moves it to the running ones, under
one lock, so no heartbeat can miss it in between (:meth:`Executions.beats` reads both at once)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from chokaq_core.domain import CancellationReason, HotJob
from chokaq_core.handlers import CancellationToken


@dataclass
class Execution:
    """One running job, as the supervisor sees it."""

    job: HotJob
    token: CancellationToken
    attempt: int
    deadline: float
    beating: bool = True


class Executions:
    """Running executions by job id, rows leased and waiting for an executor, plus remembered cancels
    (job id → (expiry, actor))."""

    def __init__(self, cancel_retention: float) -> None:
        self.cancel_retention = cancel_retention
        self._running: dict[str, Execution] = {}
        self._waiting: dict[str, None] = {}  # leased, not taken by an executor yet (in lease order)
        self._pending_cancels: dict[str, tuple[float, str | None]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._running)

    def wait(self, job_ids: Iterable[str]) -> None:
        """Rows just leased (Processing and ours) that wait for an executor: beaten from now on."""
        with self._lock:
            self._waiting.update(dict.fromkeys(job_ids))

    def unwait(self, job_id: str) -> None:
        """A waiting row leaves without running (given back at shutdown): no longer ours to beat."""
        with self._lock:
            self._waiting.pop(job_id, None)

    def begin(self, job: HotJob, attempt: int, timeout: float) -> Execution:
        """Register a job that starts now (no longer waiting); a cancel that arrived before it started applies at
        once."""
        execution = Execution(job, CancellationToken(), attempt, time.monotonic() + timeout)
        with self._lock:
            self._waiting.pop(job.id, None)
            self._running[job.id] = execution
            pending = self._pending_cancels.pop(job.id, None)
        if pending is not None and pending[0] > time.monotonic():
            execution.token.cancel(CancellationReason.ADMIN, pending[1])
        return execution

    def end(self, job_id: str) -> None:
        with self._lock:
            self._running.pop(job_id, None)

    def snapshot(self) -> list[Execution]:
        with self._lock:
            return list(self._running.values())

    def beats(self) -> tuple[list[Execution], list[str]]:
        """The running executions and the ids of the rows waiting for an executor, read at one moment."""
        with self._lock:
            return list(self._running.values()), list(self._waiting)

    def cancel_all(self, reason: CancellationReason) -> None:
        with self._lock:
            for execution in self._running.values():
                execution.token.cancel(reason)

    def cancel(self, job_id: str, actor: str | None) -> None:
        """An operator cancel: applied if the job runs here, else remembered for ``cancel_retention`` s."""
        now = time.monotonic()
        with self._lock:
            execution = self._running.get(job_id)
            if execution is None:
                self._pending_cancels = {k: v for k, v in self._pending_cancels.items() if v[0] > now}
                self._pending_cancels[job_id] = (now + self.cancel_retention, actor)
        if execution is not None:
            execution.token.cancel(CancellationReason.ADMIN, actor)

    def apply_cancel_requests(self, requests: Iterable[tuple[str, str | None]]) -> None:
        """Cancel requests read from the database; admin wins over an earlier Timeout or Shutdown."""
        with self._lock:
            for job_id, actor in requests:
                target = self._running.get(job_id)
                if target is not None and target.token.reason != CancellationReason.ADMIN:
                    target.token.cancel(CancellationReason.ADMIN, actor)
