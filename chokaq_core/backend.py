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
  :func:`task_definition` (the resolver ``handlers.get_definition`` uses for them), runs
  the function with ChokaQ's retry policy and timeouts, sends ``task_started``
  and ``task_finished`` around every attempt, and stores the JSON return value
  in the Archive row.
* **get_result** reads the job wherever it lives (``chokaq_core.get_job``):
  Hot (Pending/Fetched → READY, Processing → RUNNING), Archive (SUCCESSFUL,
  with the return value) or DLQ (FAILED). ``errors`` and ``worker_ids`` come
  from the attempts history (one entry per failed execution, then the
  execution running or finishing now); the traceback text is
  ``traceback.format_exception``'s, as in Django's own backends. The result
  ``enqueue()`` returns carries the stored ``enqueued_at``, so it equals what
  ``get_result`` reads, and a running task's context holds that same result.

A failed attempt whose error ChokaQ classifies as transient is retried (the
result reads READY again, and ``task_started``/``task_finished`` fire for every
attempt); ``ValueError``/``TypeError`` and other fatal errors go to the DLQ at
once (spec 02 §5).
"""

from __future__ import annotations

import builtins
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

from chokaq_core import api, storage
from chokaq_core.domain import NAME_ALPHABETS, EnvelopeError, FailureReason, JobRecord, JobStatus, check_name
from chokaq_core.handlers import (
    DJANGO_TASK_PREFIX,
    JobContext,
    JobDefinition,
    in_discoverable_module,
    resolve_prefix,
)

PRIORITY_OFFSET = 10  # Django's default priority (0) is ChokaQ's default priority (10)
MAX_TYPE_KEY = NAME_ALPHABETS["type key"][1]


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


resolve_prefix(DJANGO_TASK_PREFIX, task_definition)  # handlers.get_definition runs @task functions


def task_error(exc: BaseException) -> TaskError:
    """An exception as Django's own backends record it: class path and ``format_exception`` text."""
    return TaskError(exception_class_path=_class_path(type(exc)), traceback="".join(format_exception(exc)))


def _class_path(kind: type[BaseException]) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def run_task(task: Task, ctx: JobContext, args: list[Any] | None = None, kwargs: dict[str, Any] | None = None) -> Any:
    """Run one attempt of a ``@task`` inside the worker, sending Django's task signals around it.

    The task's context holds the job as ``get_result`` reads it now (RUNNING, with the stored worker ids and
    the errors of earlier attempts), so what the task sees is what the store says."""
    record = api.get_job(ctx.job_id)
    if record is not None and record.status == JobStatus.PROCESSING:
        result = task_result(task, record, task.backend)
    else:  # run outside the store (e.g. handlers.get_definition(key)(ctx, ...) in a test)
        now = timezone.now()
        result = TaskResult(
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
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the attempt failed; the worker decides
        object.__setattr__(result, "finished_at", timezone.now())
        result.errors.append(task_error(exc))
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
        task_finished.send(sender=ChokaQBackend, task_result=result)
        raise
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "_return_value", value)
    task_finished.send(sender=ChokaQBackend, task_result=result)
    return value


def _process_worker_id() -> str:
    """What a task run outside the store sees as its worker (ChokaQ's worker ids start with host and pid)."""
    return f"{socket.gethostname()[:80]}-{os.getpid()}"


_STATUSES = {JobStatus.PENDING: TaskResultStatus.READY, JobStatus.FETCHED: TaskResultStatus.READY,
             JobStatus.PROCESSING: TaskResultStatus.RUNNING, JobStatus.SUCCEEDED: TaskResultStatus.SUCCESSFUL}


def task_result(task: Task, record: JobRecord, backend: str) -> TaskResult:
    """Django's view of a stored job.

    * ``errors``: one per failed execution from the attempts history; a DLQ row whose last execution is not in
      it (a zombie, a cancellation) adds its recorded error.
    * ``worker_ids``: the worker of each failed execution, then the one running or finishing it now.
    * ``started_at``: the first execution's start; ``last_attempted_at``: the latest execution's start.
    """
    status = _STATUSES.get(record.status, TaskResultStatus.FAILED)
    history = record.failed_attempts
    errors = [TaskError(exception_class_path=a.error_class, traceback=a.traceback) for a in history]
    worker_ids = [a.worker_id or "unknown" for a in history]
    starts = [a.started_at for a in history]
    last_in_history = bool(history) and history[-1].attempt == record.attempts
    if status in (TaskResultStatus.RUNNING, TaskResultStatus.SUCCESSFUL):
        worker_ids.append(record.worker_id or "unknown")
        starts.append(record.started_at)
    elif status == TaskResultStatus.FAILED and not last_in_history:
        errors.append(_dead_error(record))
        if record.worker_id and record.attempts:
            worker_ids.append(record.worker_id)
    known = [moment for moment in starts if moment is not None]
    result: TaskResult = TaskResult(
        task=task, id=record.id, status=status, enqueued_at=record.created_at,
        started_at=known[0] if known else None, last_attempted_at=known[-1] if known else None,
        finished_at=record.finished_at, backend=backend, errors=errors, worker_ids=worker_ids,
        **_arguments(record.payload),
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", record.result)
    return result


# Exception classes recorded for DLQ rows whose details carry no traceback.
_REASON_CLASSES: dict[FailureReason | None, str] = {
    FailureReason.CANCELLED: "chokaq_core.domain.JobCancelledError",
    FailureReason.TIMEOUT: "chokaq_core.domain.JobCancelledError",
}


def _dead_error(record: JobRecord) -> TaskError:
    """The DLQ row's own error as Django's ``TaskError``: its stored exception class, else (rows stored before the
    class column) the class read off the traceback's last line."""
    details = record.error or ""
    path = record.error_class or _REASON_CLASSES.get(record.failure_reason, "chokaq_core.domain.ChokaQError")
    if record.error_class is None and "Traceback (most recent call last):" in details:
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
        try:
            check_name("queue", task.queue_name)
        except EnvelopeError as exc:  # the queue enqueue() would refuse, refused where Django expects it
            raise InvalidTask(f"queue_name: {exc}") from None

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        arguments: dict[str, Any] = {"args": normalize_json(list(args)), "kwargs": normalize_json(dict(kwargs))}
        run_at = task.run_after
        if run_at is not None and timezone.is_naive(run_at):
            run_at = timezone.make_aware(run_at)
        job_id = api.enqueue(type_key_for(task), arguments, queue=task.queue_name,
                             priority=to_chokaq_priority(task.priority), run_at=run_at)
        stored = storage.get_hot(job_id)  # the row's own clock, so get_result() reads the same enqueued_at
        result: TaskResult = TaskResult(
            task=task, id=job_id, status=TaskResultStatus.READY,
            enqueued_at=stored.created_at if stored is not None else self._enqueued_at(job_id), started_at=None,
            last_attempted_at=None, finished_at=None, args=arguments["args"], kwargs=arguments["kwargs"],
            backend=self.alias, errors=[], worker_ids=[],
        )
        storage.on_commit(partial(task_enqueued.send, type(self), task_result=result))
        return result

    def _enqueued_at(self, job_id: str) -> datetime:
        """The stored enqueue time of a job a worker already took out of Hot."""
        record = api.get_job(job_id)
        return record.created_at if record is not None else timezone.now()

    def get_result(self, result_id: str) -> TaskResult:
        record = api.get_job(result_id)
        if record is None:
            raise TaskResultDoesNotExist(result_id)
        if record.type[: len(DJANGO_TASK_PREFIX)].lower() != DJANGO_TASK_PREFIX:
            raise TaskResultDoesNotExist(f"{result_id} is a ChokaQ job of type {record.type!r}, not a django.tasks task")
        try:
            task = resolve_task(record.type)
        except ValueError as exc:
            raise TaskResultDoesNotExist(f"{result_id}: {exc}") from exc
        return task_result(self._as_stored(task, record), record, self.alias)

    def _as_stored(self, task: Task, record: JobRecord) -> Task:
        """The task as the row holds it: its queue, and its priority while it is in Hot."""
        changes: dict[str, Any] = {}
        if record.queue != task.queue_name:
            changes["queue_name"] = record.queue
        if record.priority is not None and to_django_priority(record.priority) != task.priority:
            changes["priority"] = to_django_priority(record.priority)
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


def _arguments(value: Any) -> dict[str, Any]:
    """``args``/``kwargs`` of a stored payload (the JSON object the backend wrote at enqueue)."""
    if not isinstance(value, dict):
        value = {}
    args = value.get("args", [])
    kwargs = value.get("kwargs", {})
    return {"args": args if isinstance(args, list) else [], "kwargs": kwargs if isinstance(kwargs, dict) else {}}
