"""The job type registry and the handler's ``ctx``.

Handlers are plain functions ``handler(ctx, **payload)``; the payload is the
JSON object given at enqueue. This module knows no storage: the ``@job``
decorator, which returns a definition that can enqueue itself, lives in
``chokaq_core.api``.
"""

from __future__ import annotations

import importlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.apps import apps
from django.core.serializers.json import DjangoJSONEncoder
from django.utils.module_loading import autodiscover_modules

from chokaq_core.conf import config
from chokaq_core.domain import CancellationReason, JobCancelledError, Rate, RateLimit, rate_limit_name

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
    # A fleet-wide rate limit of this type (``type:<key>``), and how a job's key is found when each key gets
    # its own allowance: a format string over the payload ("tenant:{tenant_id}") or a callable payload -> key.
    rate_limit: Rate | None = None
    rate_key: str | Callable[[dict[str, Any]], str] | None = None

    def execution_key(self, payload: dict[str, Any]) -> str | None:
        """The idempotency-middleware key of one execution, or None when the job does not opt in."""
        if self.idempotency_key is None:
            return None
        if callable(self.idempotency_key):
            return str(self.idempotency_key(payload))
        return self.idempotency_key.format(**payload)

    def partition_key(self, payload: dict[str, Any]) -> str | None:
        """The rate key of a job of this type from its payload (None when the type declares no ``rate_key``);
        whatever the key function raises propagates."""
        if self.rate_key is None:
            return None
        if callable(self.rate_key):
            return self.rate_key(payload)
        return self.rate_key.format(**payload)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calling the definition runs the handler directly (handy in tests)."""
        return self.func(*args, **kwargs)


def register(definition: JobDefinition) -> None:
    lowered = definition.type_key.lower()
    with _registry_lock:
        existing = _registry.get(lowered)
        if existing is not None and _qualname(existing.func) != _qualname(definition.func):
            raise ValueError(
                f"job type {definition.type_key!r} is already registered by {_qualname(existing.func)}"
            )
        _registry[lowered] = definition


def declared_rate_limits() -> list[RateLimit]:
    """The limits the code declares: ``CHOKAQ["RATE_LIMITS"]`` over each ``@job(rate_limit=…)`` of its type."""
    with _registry_lock:
        definitions = list(_registry.values())
    limits = {limit.name: limit for limit in (
        RateLimit(rate_limit_name("type", d.type_key), d.rate_limit, per_key=d.rate_key is not None)
        for d in definitions if d.rate_limit is not None)}
    limits.update(config().RATE_LIMITS)
    return [limits[name] for name in sorted(limits)]


def _qualname(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"


DJANGO_TASK_PREFIX = "django.task:"

KeyResolver = Callable[[str], "JobDefinition | None"]
_key_resolvers: dict[str, KeyResolver] = {}


def resolve_prefix(prefix: str, resolver: KeyResolver) -> None:
    """Type keys starting with ``prefix`` that no ``@job`` registered resolve through ``resolver``: how the
    ``django.tasks`` backend makes its ``django.task:<module path>`` keys runnable."""
    _key_resolvers[prefix.lower()] = resolver


def get_definition(type_key: str) -> JobDefinition | None:
    """Type keys are compared case-insensitively (spec 03 §8); a key no ``@job`` registered goes to the
    resolver of its prefix (``django.task:`` keys → the ``@task`` function at that path)."""
    definition = _registry.get(type_key.lower())
    if definition is None:
        for prefix, resolve in _key_resolvers.items():
            if type_key[: len(prefix)].lower() == prefix:
                return resolve(type_key)
    return definition


def encode_result(job_id: str, value: Any) -> str | None:
    """A handler's return value as JSON text for the Archive row; None when it returned None, or
    when the value is not JSON (logged: the job still succeeded) or bigger than MAX_PAYLOAD_BYTES."""
    if value is None:
        return None
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


DISCOVERED_MODULES = ("jobs", "tasks")
"""Module names imported from every installed app: ``jobs.py`` holds ``@job`` definitions, ``tasks.py`` Django's
``@task`` functions (Django keeps no registry of them; importing the module is what makes them known)."""


def autodiscover() -> None:
    """Import every installed app's ``jobs.py`` and ``tasks.py``, then ``CHOKAQ['JOB_MODULES']``.

    It needs the models loaded, not the whole registry ready: ``ChokaQCoreConfig.ready()`` calls it, as the
    admin's ``ready()`` discovers ``admin.py`` (``apps.ready`` only turns True after every ``ready()`` ran),
    so it runs in web processes, the worker and every management command alike."""
    apps.check_models_ready()
    autodiscover_modules(*DISCOVERED_MODULES)
    for module in config().JOB_MODULES:
        importlib.import_module(module)


def in_discoverable_module(path: str) -> bool:
    """True when the dotted ``path`` lies in an installed app's package or in a ``CHOKAQ['JOB_MODULES']``
    module: the only code a stored type key may make a process import."""
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


def retry_after_seconds(value: float | timedelta | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        return max(0.0, value.total_seconds())
    return max(0.0, float(value))
