"""The job type registry, the ``@job`` decorator and the handler's ``ctx``.

Handlers are plain functions ``handler(ctx, **payload)``; the payload is the
JSON object given at enqueue. This module knows no storage: enqueueing goes
through ``chokaq_core.api`` (imported lazily).
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.utils.module_loading import autodiscover_modules

from chokaq_core.domain import CancellationReason, JobCancelledError

if TYPE_CHECKING:
    from chokaq_core.api import EnqueueOptions

logger = logging.getLogger("chokaq.handlers")

_registry: dict[str, JobDefinition] = {}
_registry_lock = threading.Lock()


@dataclass(frozen=True)
class JobDefinition:
    """A registered job type: its stable key, default queue and handler."""

    type_key: str
    func: Callable[..., Any]
    queue: str = "default"
    priority: int = 10
    # Idempotency middleware opt-in (spec 03 §11): a format string over the payload
    # ("order:{order_id}") or a callable payload -> key; and how long completion is remembered.
    idempotency_key: str | Callable[[dict[str, Any]], str] | None = None
    result_ttl: float | None = None

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.func)

    def execution_key(self, payload: dict[str, Any]) -> str | None:
        """The idempotency-middleware key of one execution, or None when the job does not opt in."""
        if self.idempotency_key is None:
            return None
        if callable(self.idempotency_key):
            return str(self.idempotency_key(payload))
        return self.idempotency_key.format(**payload)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calling the definition runs the handler directly (handy in tests)."""
        return self.func(*args, **kwargs)

    def using(self, **options: Any) -> BoundJob:
        """Job options (priority, delay, idempotency_key, tags, queue, …) apart from handler arguments."""
        return BoundJob(self, options)

    def enqueue(self, **payload: Any) -> str:
        return BoundJob(self, {}).enqueue(**payload)

    async def aenqueue(self, **payload: Any) -> str:
        return await BoundJob(self, {}).aenqueue(**payload)

    def request(self, **payload: Any) -> EnqueueOptions:
        """An item for ``enqueue_many``."""
        return BoundJob(self, {}).request(**payload)


@dataclass(frozen=True)
class BoundJob:
    definition: JobDefinition
    options: dict[str, Any]

    def using(self, **options: Any) -> BoundJob:
        return BoundJob(self.definition, {**self.options, **options})

    def _options(self) -> dict[str, Any]:
        opts = dict(self.options)
        opts.setdefault("queue", self.definition.queue)
        opts.setdefault("priority", self.definition.priority)
        return opts

    def enqueue(self, **payload: Any) -> str:
        from chokaq_core.api import enqueue

        return enqueue(self.definition.type_key, payload, **self._options())

    async def aenqueue(self, **payload: Any) -> str:
        from chokaq_core.api import aenqueue

        return await aenqueue(self.definition.type_key, payload, **self._options())

    def request(self, **payload: Any) -> EnqueueOptions:
        """An item for ``enqueue_many``."""
        from chokaq_core.api import EnqueueOptions

        return EnqueueOptions(type_key=self.definition.type_key, payload=payload, **self._options())


def job(
    type_key: str, *, queue: str = "default", priority: int = 10,
    idempotency_key: str | Callable[[dict[str, Any]], str] | None = None, result_ttl: float | None = None,
) -> Callable[[Callable[..., Any]], JobDefinition]:
    """Register ``func`` as the handler of ``type_key`` (a stable contract name, e.g. ``email.send.v1``).

    ``idempotency_key``/``result_ttl`` opt the job into the idempotency middleware.
    """
    key = (type_key or "").strip()
    if not key or len(key) > 255:
        raise ValueError(f"job type key must be 1-255 characters, got {type_key!r}")
    if not (queue or "").strip() or len(queue) > 255:
        raise ValueError(f"queue must be 1-255 characters, got {queue!r}")

    def decorate(func: Callable[..., Any]) -> JobDefinition:
        definition = JobDefinition(type_key=key, func=func, queue=queue, priority=priority,
                                   idempotency_key=idempotency_key, result_ttl=result_ttl)
        register(definition)
        return definition

    return decorate


def register(definition: JobDefinition) -> None:
    lowered = definition.type_key.lower()
    with _registry_lock:
        existing = _registry.get(lowered)
        if existing is not None and _qualname(existing.func) != _qualname(definition.func):
            raise ValueError(
                f"job type {definition.type_key!r} is already registered by {_qualname(existing.func)}"
            )
        _registry[lowered] = definition


def unregister(type_key: str) -> None:
    with _registry_lock:
        _registry.pop(type_key.lower(), None)


def _qualname(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"


DJANGO_TASK_PREFIX = "django.task:"


def get_definition(type_key: str) -> JobDefinition | None:
    """Type keys are compared case-insensitively (spec 03 §8). Keys ``django.task:<module path>``
    (written by the ``django.tasks`` backend) resolve to the ``@task`` function at that path."""
    definition = _registry.get(type_key.lower())
    if definition is None and type_key[: len(DJANGO_TASK_PREFIX)].lower() == DJANGO_TASK_PREFIX:
        from chokaq_core.backend import task_definition

        return task_definition(type_key)
    return definition


def encode_result(job_id: str, value: Any) -> str | None:
    """A handler's return value as JSON text for the Archive row; None when it returned None, or
    when the value is not JSON (logged: the job still succeeded) or bigger than MAX_PAYLOAD_BYTES."""
    if value is None:
        return None
    from django.core.serializers.json import DjangoJSONEncoder

    from chokaq_core.conf import config

    try:
        text = json.dumps(value, cls=DjangoJSONEncoder, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        logger.warning("job %s returned a value JSON cannot hold; no result is stored: %s", job_id, exc)
        return None
    limit = config().SERIALIZATION.MAX_PAYLOAD_BYTES
    if len(text.encode("utf-8")) > limit:
        logger.warning("job %s returned a result over %s bytes of JSON; no result is stored", job_id, limit)
        return None
    return text


def registered_types() -> list[str]:
    return sorted(d.type_key for d in _registry.values())


DISCOVERED_MODULES = ("jobs", "tasks")
"""Module names imported from every installed app: ``jobs.py`` holds ``@job`` definitions, ``tasks.py`` Django's
``@task`` functions (Django keeps no registry of them; importing the module is what makes them known)."""


def autodiscover() -> None:
    """Import every installed app's ``jobs.py`` and ``tasks.py``, then ``CHOKAQ['JOB_MODULES']``.

    It needs the models loaded, not the whole registry ready: ``ChokaQCoreConfig.ready()`` calls it, as the
    admin's ``ready()`` discovers ``admin.py`` (``apps.ready`` only turns True after every ``ready()`` ran),
    so it runs in web processes, the worker and every management command alike."""
    from chokaq_core.conf import config

    apps.check_models_ready()
    autodiscover_modules(*DISCOVERED_MODULES)
    for module in config().JOB_MODULES:
        importlib.import_module(module)


def in_discoverable_module(path: str) -> bool:
    """True when the dotted ``path`` lies in an installed app's package or in a ``CHOKAQ['JOB_MODULES']``
    module: the only code a stored type key may make a process import."""
    from chokaq_core.conf import config

    roots = [app.name for app in apps.get_app_configs()] + list(config().JOB_MODULES)
    return any(path.startswith(f"{root}.") for root in roots)


# ---------------------------------------------------------------- context


class CancellationToken:
    """Cooperative cancellation of one execution. The first reason wins, except
    that Admin beats Timeout, which beats any other reason (spec 02 §8)."""

    _rank = {CancellationReason.ADMIN: 3, CancellationReason.TIMEOUT: 2}

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: CancellationReason | None = None
        self.actor: str | None = None

    @property
    def is_cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self, reason: CancellationReason, actor: str | None = None) -> None:
        if self.reason is None or self._rank.get(reason, 1) > self._rank.get(self.reason, 1):
            self.reason = reason
            self.actor = actor
        self._event.set()

    def raise_if_cancelled(self) -> None:
        if self._event.is_set():
            raise JobCancelledError(self.reason)

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep up to ``timeout`` seconds; True as soon as the job is cancelled."""
        return self._event.wait(timeout)


@dataclass(frozen=True)
class JobContext:
    """What a handler receives as ``ctx`` (spec 03 §13). It exposes no storage operation."""

    job_id: str
    job_type: str
    queue: str
    attempt: int
    created_by: str | None
    created_at: datetime
    cancellation: CancellationToken
    progress_sink: Callable[[str, int, str | None], None] | None = None

    @property
    def is_cancelled(self) -> bool:
        return self.cancellation.is_cancelled

    def raise_if_cancelled(self) -> None:
        self.cancellation.raise_if_cancelled()

    def progress(self, percent: float, message: str | None = None) -> None:
        """Report progress (clamped to 0–100); UI only, not persisted."""
        if not self.job_id or self.progress_sink is None:
            return
        self.progress_sink(self.job_id, int(max(0, min(100, percent))), message)

    report_progress = progress

    def with_attempt(self, attempt: int) -> JobContext:
        return replace(self, attempt=attempt)


def retry_after_seconds(value: float | timedelta | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        return max(0.0, value.total_seconds())
    return max(0.0, float(value))
