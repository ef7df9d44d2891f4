"""The jobs running in this worker process, and the cancel requests waiting for a job that is not
running here yet (spec 02 §8): shared by the executors, the supervisor and the control channel."""

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
    """Running executions by job id, plus remembered cancels (job id → (expiry, actor))."""

    def __init__(self, cancel_retention: float) -> None:
        self.cancel_retention = cancel_retention
        self._running: dict[str, Execution] = {}
        self._pending_cancels: dict[str, tuple[float, str | None]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._running)

    def begin(self, job: HotJob, attempt: int, timeout: float) -> Execution:
        """Register a job that starts now; a cancel that arrived before it started applies at once."""
        execution = Execution(job, CancellationToken(), attempt, time.monotonic() + timeout)
        with self._lock:
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
