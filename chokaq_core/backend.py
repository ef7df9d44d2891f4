"""A ``django.tasks`` backend: Django's ``@task`` functions become ChokaQ jobs.

::

    TASKS = {"default": {"BACKEND": "chokaq_core.backend.ChokaQBackend", "QUEUES": []}}

* **enqueue** writes one Pending row of type ``django.task:<module path>`` whose
  payload is ``{"args": [...], "kwargs": {...}}``. The task's ``queue_name`` is
  the ChokaQ queue, ``run_after`` its scheduled time, and its priority
  (Django: −100…100, default 0) is shifted by :data:`PRIORITY_OFFSET` so that
  Django's default lands on ChokaQ's default (10). Enqueue joins the caller's
  ``transaction.atomic()``; ``task_enqueued`` fires once the row is committed.
* **execution**: ``chokaq_worker`` resolves ``django.task:`` keys through
  :func:`task_definition` (``handlers.get_definition`` falls back to it), runs
  the function with ChokaQ's retry policy and timeouts, sends ``task_started``
  and ``task_finished`` around every attempt, and stores the JSON return value
  in the Archive row.
* **get_result** reads the job wherever it lives: Hot (Pending/Fetched →
  READY, Processing → RUNNING), Archive (SUCCESSFUL, with the return value) or
  DLQ (FAILED, with the recorded error). ChokaQ keeps only the last worker id
  of a job, so ``worker_ids`` repeats it once per attempt.

A failed attempt whose error ChokaQ classifies as transient is retried (the
result reads READY again, and ``task_started``/``task_finished`` fire for every
attempt); ``ValueError``/``TypeError`` and other fatal errors go to the DLQ at
once (spec 02 §5).
"""

from __future__ import annotations

import builtins
import json
import os
import socket
import threading
from dataclasses import replace
from datetime import datetime
from functools import partial
from traceback import format_exception
from typing import Any

from django.apps import apps
from django.core import checks
from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json
from django.utils.module_loading import import_string

from chokaq_core import api, service, storage
from chokaq_core.domain import ArchivedJob, DeadJob, FailureReason, HotJob, JobStatus
from chokaq_core.handlers import DJANGO_TASK_PREFIX, JobContext, JobDefinition, in_discoverable_module

PRIORITY_OFFSET = 10  # Django's default priority (0) is ChokaQ's default priority (10)
MAX_TYPE_KEY = 255


def type_key_for(task: Task) -> str:
    """The stable ChokaQ type key of a ``@task``: ``django.task:<module>.<qualname>``."""
    return f"{DJANGO_TASK_PREFIX}{task.module_path}"


def to_chokaq_priority(priority: int) -> int:
    return int(priority) + PRIORITY_OFFSET


def to_django_priority(priority: int) -> int:
    return max(TASK_MIN_PRIORITY, min(TASK_MAX_PRIORITY, int(priority) - PRIORITY_OFFSET))


def resolve_task(type_key: str) -> Task:
    """The ``Task`` object a ``django.task:`` type key names; ValueError when it names none."""
    if type_key[: len(DJANGO_TASK_PREFIX)].lower() != DJANGO_TASK_PREFIX:
        raise ValueError(f"{type_key!r} is not a django.tasks type key")
    path = type_key[len(DJANGO_TASK_PREFIX):]
    if not in_discoverable_module(path):  # never import code outside the project's apps for a stored key
        raise ValueError(f"{path!r} is not in a module of an installed app (nor in CHOKAQ['JOB_MODULES'])")
    try:
        found = import_string(path)
    except ImportError as exc:
        raise ValueError(f"{path!r} cannot be imported: {exc}") from exc
    if not isinstance(found, Task):
        raise ValueError(f"{path!r} is not a django.tasks Task (decorate it with @task)")
    return found


_definitions: dict[str, JobDefinition] = {}
_definitions_lock = threading.Lock()


def task_definition(type_key: str) -> JobDefinition | None:
    """The handler the worker runs for a ``django.task:`` row (None when the path names no ``@task``)."""
    with _definitions_lock:
        cached = _definitions.get(type_key)
    if cached is not None:
        return cached
    try:
        task = resolve_task(type_key)
    except ValueError:
        return None
    definition = JobDefinition(type_key=type_key, func=partial(run_task, task), queue=task.queue_name,
                               priority=to_chokaq_priority(task.priority))
    with _definitions_lock:
        _definitions[type_key] = definition
    return definition


def _class_path(exc: BaseException) -> str:
    kind = type(exc)
    return f"{kind.__module__}.{kind.__qualname__}"


def _process_worker_id() -> str:
    """What a running task sees as its worker (ChokaQ's worker ids start with host and pid)."""
    return f"{socket.gethostname()[:80]}-{os.getpid()}"


def run_task(task: Task, ctx: JobContext, args: list[Any] | None = None, kwargs: dict[str, Any] | None = None) -> Any:
    """Run one attempt of a ``@task`` inside the worker, sending Django's task signals around it."""
    now = timezone.now()
    result: TaskResult = TaskResult(
        task=task, id=ctx.job_id, status=TaskResultStatus.RUNNING, enqueued_at=ctx.created_at, started_at=now,
        last_attempted_at=now, finished_at=None, args=list(args or []), kwargs=dict(kwargs or {}),
        backend=task.backend, errors=[], worker_ids=[_process_worker_id()] * max(ctx.attempt, 1),
    )
    task_started.send(sender=ChokaQBackend, task_result=result)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *result.args, **result.kwargs)
        else:
            value = task.call(*result.args, **result.kwargs)
        value = normalize_json(value)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        object.__setattr__(result, "finished_at", timezone.now())
        result.errors.append(TaskError(exception_class_path=_class_path(exc), traceback="".join(format_exception(exc))))
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
        task_finished.send(sender=ChokaQBackend, task_result=result)
        raise
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "_return_value", value)
    task_finished.send(sender=ChokaQBackend, task_result=result)
    return value


# Exception classes recorded for DLQ rows whose details carry no traceback.
_REASON_CLASSES = {
    FailureReason.CANCELLED: "chokaq_core.domain.JobCancelledError",
    FailureReason.TIMEOUT: "chokaq_core.domain.JobCancelledError",
}


def _error_of(dead: DeadJob) -> TaskError:
    """The DLQ row's error as Django's ``TaskError``: the class is read off the traceback's last line."""
    details = dead.error_details or ""
    path = _REASON_CLASSES.get(dead.failure_reason, "chokaq_core.domain.ChokaQError")
    if "Traceback (most recent call last):" in details:
        for line in reversed(details.strip().splitlines()):
            if not line.strip() or line[:1].isspace():
                continue
            head = line.split(":", 1)[0].strip()
            if all(part.isidentifier() for part in head.split(".")):
                if "." in head:
                    path = head
                elif isinstance(getattr(builtins, head, None), type):
                    path = f"builtins.{head}"
            break
    return TaskError(exception_class_path=path, traceback=details)


class ChokaQBackend(BaseTaskBackend):
    """Django's Tasks framework on ChokaQ's three pillars (see the module docstring)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        if len(type_key_for(task)) > MAX_TYPE_KEY:
            raise InvalidTask(f"the task's module path is longer than {MAX_TYPE_KEY - len(DJANGO_TASK_PREFIX)} "
                              "characters: ChokaQ cannot store its type key")
        if not task.queue_name.strip() or len(task.queue_name) > 255:
            raise InvalidTask("queue_name must be 1-255 characters")

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        arguments: dict[str, Any] = {"args": normalize_json(list(args)), "kwargs": normalize_json(dict(kwargs))}
        run_at = task.run_after
        if run_at is not None and timezone.is_naive(run_at):
            run_at = timezone.make_aware(run_at)
        job_id = api.enqueue(type_key_for(task), arguments, queue=task.queue_name,
                             priority=to_chokaq_priority(task.priority), run_at=run_at)
        result: TaskResult = TaskResult(
            task=task, id=job_id, status=TaskResultStatus.READY, enqueued_at=timezone.now(), started_at=None,
            last_attempted_at=None, finished_at=None, args=arguments["args"], kwargs=arguments["kwargs"],
            backend=self.alias, errors=[], worker_ids=[],
        )
        storage.on_commit(partial(task_enqueued.send, type(self), task_result=result))
        return result

    def get_result(self, result_id: str) -> TaskResult:
        view = service.find_job(result_id) or service.find_job(result_id)  # twice: a resurrect may race the reads
        if view is None:
            raise TaskResultDoesNotExist(result_id)
        row: HotJob | ArchivedJob | DeadJob = view.hot or view.archived or view.dead  # type: ignore[assignment]
        if row.type[: len(DJANGO_TASK_PREFIX)].lower() != DJANGO_TASK_PREFIX:
            raise TaskResultDoesNotExist(f"{result_id} is a ChokaQ job of type {row.type!r}, not a django.tasks task")
        try:
            task = resolve_task(row.type)
        except ValueError as exc:
            raise TaskResultDoesNotExist(f"{result_id}: {exc}") from exc
        task = self._as_stored(task, row)
        arguments = _arguments(row.payload)
        started_at: datetime | None = None
        finished_at: datetime | None = None
        errors: list[TaskError] = []
        if isinstance(row, HotJob):
            status = TaskResultStatus.RUNNING if row.status == JobStatus.PROCESSING else TaskResultStatus.READY
            started_at = row.started_at
        elif isinstance(row, ArchivedJob):
            status, started_at, finished_at = TaskResultStatus.SUCCESSFUL, row.started_at, row.finished_at
        else:
            status, finished_at = TaskResultStatus.FAILED, row.failed_at
            errors.append(_error_of(row))
        result: TaskResult = TaskResult(
            task=task, id=row.id, status=status, enqueued_at=row.created_at, started_at=started_at,
            last_attempted_at=started_at, finished_at=finished_at, args=arguments["args"],
            kwargs=arguments["kwargs"], backend=self.alias, errors=errors,
            worker_ids=[row.worker_id or "unknown"] * row.attempt_count,
        )
        if isinstance(row, ArchivedJob) and row.result is not None:
            object.__setattr__(result, "_return_value", json.loads(row.result))
        return result

    def _as_stored(self, task: Task, row: HotJob | ArchivedJob | DeadJob) -> Task:
        """The task as the row holds it: its queue, and its priority while it is in Hot."""
        changes: dict[str, Any] = {}
        if row.queue != task.queue_name:
            changes["queue_name"] = row.queue
        if isinstance(row, HotJob) and to_django_priority(row.priority) != task.priority:
            changes["priority"] = to_django_priority(row.priority)
        if not changes:
            return task
        try:
            return replace(task, **changes)
        except InvalidTask:  # e.g. an operator moved it to a queue this backend does not list
            return task

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        if not apps.is_installed("chokaq_core"):
            return [checks.Error("ChokaQBackend needs 'chokaq_core' in INSTALLED_APPS", id="chokaq.E010",
                                 obj=self.alias)]
        return []


def _arguments(payload: str | None) -> dict[str, Any]:
    try:
        value = json.loads(payload) if payload else {}
    except ValueError:
        value = {}
    if not isinstance(value, dict):
        value = {}
    args = value.get("args", [])
    kwargs = value.get("kwargs", {})
    return {"args": args if isinstance(args, list) else [], "kwargs": kwargs if isinstance(kwargs, dict) else {}}
