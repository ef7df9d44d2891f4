"""Deck → worker commands over the channel layer (spec 03 §12): best effort and idempotent."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from chokaq_core.policy import RetryPolicy
from chokaq_core.worker.executions import Executions
from chokaq_core.worker.executor import Executor
from chokaq_core.worker.limits import Limiter

logger = logging.getLogger("chokaq.worker")


class Control:
    def __init__(self, worker_id: str, limiter: Limiter, grow: Callable[[int], None], executor: Executor,
                 executions: Executions, changed: Callable[[], None]) -> None:
        self.worker_id = worker_id
        self.limiter = limiter
        self.grow = grow
        self.executor = executor
        self.executions = executions
        self.changed = changed  # the registry row is rewritten after a capacity or policy change

    def handle(self, message: dict[str, Any]) -> None:
        target = message.get("workerId")
        if target and target != self.worker_id:
            return
        kind = message.get("type")
        if kind == "worker.set_capacity":
            self.limiter.set_capacity(int(message["capacity"]))
            self.grow(self.limiter.capacity)
            logger.info("worker %s capacity set to %s", self.worker_id, self.limiter.capacity)
            self.changed()
        elif kind == "worker.set_retry_policy":
            current = self.executor.retry_policy
            self.executor.retry_policy = RetryPolicy(
                max_attempts=int(message.get("max_attempts") or current.max_attempts),
                base_delay=float(message.get("base_delay_seconds") or current.base_delay),
                max_delay=current.max_delay, multiplier=current.multiplier,
                jitter=current.jitter, max_job_age=current.max_job_age,
            )
            self.changed()
        elif kind == "worker.set_circuit":
            key, state = str(message.get("key") or ""), message.get("state")
            if key and state in ("closed", "open"):
                breaker = self.executor.breakers.get(key)
                breaker.force_close() if state == "closed" else breaker.force_open()
                logger.info("worker %s circuit %s set %s by an operator", self.worker_id, key, state)
                self.changed()
        elif kind == "worker.cancel_job":
            job_id = str(message.get("job_id") or message.get("jobId") or "")
            if job_id:
                self.executions.cancel(job_id, message.get("actor"))
