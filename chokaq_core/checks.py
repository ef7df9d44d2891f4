"""Django system checks for ChokaQ (spec 05 §1). Ids are stable: alert and silence on them.

============  =======  =====================================================================
id            level    rule
============  =======  =====================================================================
chokaq.E001   Error    a ``CHOKAQ`` setting is unknown, of the wrong type or out of range
                       (durations, intervals, retry/worker/SQL limits, HEALTH thresholds,
                       METRICS guard, RETENTION, SCHEDULE entries and cron expressions,
                       RATE_LIMITS names, rates, PER_KEY and MAX_KEYS)
chokaq.E002   Error    ``CHOKAQ["DATABASE"]`` names no ``DATABASES`` alias
chokaq.E003   Error    the database vendor is not postgresql, sqlite or microsoft
chokaq.E004   Error    a ``CHOKAQ_DECK`` setting is invalid (spec 05 §1.2; registered by ``deck.checks``)
chokaq.E005   Error    the Deck is installed without Channels (``"channels"`` in INSTALLED_APPS)
chokaq.W006   Warning  (``--deploy``) the Deck has no cross-process channel layer (none, or
                       in-memory): workers in other processes cannot push live events or
                       receive worker control
chokaq.W007   Warning  a Redis channel layer is configured but does not answer PING
chokaq.E008   Error    the settings need an optional dependency that is not installed; the
                       message names the extra (``pip install "django-chokaq[postgres]"``)
chokaq.E009   Error    ChokaQ's SQLite database runs without ``transaction_mode="IMMEDIATE"``
                       (concurrent workers then fail with "database is locked")
chokaq.E011   Error    (the Deck's check, ``deck.checks``) ``ASGI_APPLICATION`` is unset, cannot
                       be imported or does not route the Deck's websocket ``/ws/<prefix>/``
chokaq.E012   Error    (the Deck's check) ``deck.urls`` is included at another path than
                       ``CHOKAQ_DECK["ROUTE_PREFIX"]`` (the websocket follows the setting)
chokaq.E010   Error    ``TASKS`` uses ChokaQBackend while ``chokaq_core`` is not installed
                       (reported by the backend's own check)
chokaq.W020   Warning  (``--deploy``) unregistered job types are accepted at enqueue
                       (``REQUIRE_REGISTERED_JOB_TYPES`` should be True in production)
============  =======  =====================================================================
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any
from urllib.parse import urlsplit

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db import connections

from chokaq_core.conf import collect_errors, config

logger = logging.getLogger("chokaq.checks")

SUPPORTED_VENDORS = ("postgresql", "sqlite", "microsoft")
IN_MEMORY_LAYERS = ("channels.layers.InMemoryChannelLayer",)
REDIS_LAYERS = ("channels_redis.core.RedisChannelLayer", "channels_redis.pubsub.RedisPubSubChannelLayer")
REDIS_PING_TIMEOUT = 1.0
REDIS_IDEMPOTENCY_STORE = "chokaq_core.middleware.RedisIdempotencyStore"
# Database engines whose driver comes with an extra: ENGINE -> (importable module, extra).
ENGINE_DRIVERS = {
    "django.db.backends.postgresql": ("psycopg", "postgres"),
    "mssql": ("mssql", "mssql"),
}
SQLITE_HINT = ('set DATABASES[{alias!r}]["OPTIONS"] = {{"transaction_mode": "IMMEDIATE", "timeout": 20, '
               '"init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"}}')


def is_importable(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_extra(module: str, extra: str, needed_by: str) -> checks.Error:
    """The chokaq.E008 error for an optional dependency the settings need."""
    return checks.Error(
        f"{needed_by} needs the Python package {module!r}, which is not installed",
        hint=f'pip install "django-chokaq[{extra}]"',
        id="chokaq.E008",
    )


def check_configuration(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = [
        checks.Error(error, id="chokaq.E001", hint="Fix settings.CHOKAQ") for error in collect_errors()
    ]
    if messages:
        return messages
    if config().IDEMPOTENCY.STORE == REDIS_IDEMPOTENCY_STORE and not is_importable("redis"):
        messages.append(missing_extra("redis", "redis", "CHOKAQ['IDEMPOTENCY']['STORE'] (Redis)"))
    if config().STORAGE == "memory":  # spec 03 §15: ChokaQ uses no database at all
        return messages
    alias = config().DATABASE
    if alias not in connections.settings:
        return [checks.Error(f"CHOKAQ['DATABASE'] names unknown alias {alias!r}", id="chokaq.E002")]
    engine = str(connections.settings[alias].get("ENGINE", ""))
    if engine in ENGINE_DRIVERS and not is_importable(ENGINE_DRIVERS[engine][0]):
        module, extra = ENGINE_DRIVERS[engine]
        return [*messages, missing_extra(module, extra, f"DATABASES[{alias!r}] ({engine})")]
    vendor = connections[alias].vendor
    if vendor not in SUPPORTED_VENDORS:
        messages.append(
            checks.Error(
                f"database vendor {vendor!r} is not supported by ChokaQ",
                hint=f"use one of {', '.join(SUPPORTED_VENDORS)}",
                id="chokaq.E003",
            )
        )
    if vendor == "sqlite":
        mode = (connections.settings[alias].get("OPTIONS") or {}).get("transaction_mode")
        if str(mode or "").upper() != "IMMEDIATE":
            messages.append(checks.Error(
                f"ChokaQ's SQLite database {alias!r} runs without transaction_mode='IMMEDIATE': a worker's "
                "read-then-write transition can fail with 'database is locked' as soon as two processes write",
                hint=SQLITE_HINT.format(alias=alias),
                id="chokaq.E009",
            ))
    return messages


def check_deck(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The Deck's settings and its channel layer (spec 05 §1.2)."""
    messages: list[checks.CheckMessage] = []  # CHOKAQ_DECK itself (chokaq.E004) is checked by deck.checks
    if not apps.is_installed("deck"):
        return messages
    if not apps.is_installed("channels"):
        messages.append(checks.Error(
            "the Deck is installed without Channels: its websocket (live updates) cannot be served",
            hint='INSTALLED_APPS += ["channels", "chokaq_core", "deck"]',
            id="chokaq.E005",
        ))
        return messages
    backend = _layer_backend()
    if backend.startswith("channels_redis.") and not is_importable("channels_redis"):
        messages.append(missing_extra("channels_redis", "redis", f"CHANNEL_LAYERS['default'] ({backend})"))
    elif backend in REDIS_LAYERS:
        layers: dict[str, Any] = settings.CHANNEL_LAYERS
        for host in layers["default"].get("CONFIG", {}).get("hosts", ["redis://localhost:6379"]):
            error = redis_unreachable(host)
            if error:
                messages.append(checks.Warning(
                    f"the Redis channel layer at {_describe(host)} does not answer: {error}",
                    hint="start Redis or fix CHANNEL_LAYERS; live Deck updates are lost meanwhile",
                    id="chokaq.W007",
                ))
    return messages


def _layer_backend() -> str:
    """``CHANNEL_LAYERS['default']['BACKEND']``, or "" when no default layer is configured."""
    layers = getattr(settings, "CHANNEL_LAYERS", None) or {}
    default = layers.get("default") if isinstance(layers, dict) else None
    return str(default.get("BACKEND", "")) if isinstance(default, dict) else ""


def _describe(host: Any) -> str:
    """host:port of a channels_redis host entry, never its password."""
    if isinstance(host, (tuple, list)):
        return f"{host[0]}:{host[1]}"
    if isinstance(host, dict):
        host = host.get("address", "")
    parsed = urlsplit(str(host))
    return f"{parsed.scheme}://{parsed.hostname}:{parsed.port or 6379}"


def redis_unreachable(host: Any) -> str | None:
    """None when the Redis server answers PING within a second, else why not."""
    import redis

    options = {"socket_connect_timeout": REDIS_PING_TIMEOUT, "socket_timeout": REDIS_PING_TIMEOUT}
    try:
        if isinstance(host, (tuple, list)):
            client = redis.Redis(host=host[0], port=int(host[1]), **options)  # type: ignore[arg-type]
        elif isinstance(host, dict):
            extra = {k: v for k, v in host.items() if k != "address"}
            client = redis.Redis.from_url(str(host["address"]), **{**extra, **options})
        else:
            client = redis.Redis.from_url(str(host), **options)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def check_deploy(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if collect_errors():
        return []
    messages: list[checks.CheckMessage] = []
    if not config().REQUIRE_REGISTERED_JOB_TYPES:
        messages.append(checks.Warning(
            "CHOKAQ['REQUIRE_REGISTERED_JOB_TYPES'] is False: enqueue accepts type keys no worker can run",
            hint="set it to True in production (spec 05 §9, production checklist)",
            id="chokaq.W020",
        ))
    backend = _layer_backend()
    if apps.is_installed("deck") and (not backend or backend in IN_MEMORY_LAYERS):
        messages.append(checks.Warning(
            "the Deck has no cross-process channel layer: workers in other processes are seen only through the "
            "Deck's once-a-second database poll (no live progress), and worker control does nothing",
            hint='pip install "django-chokaq[redis]" and set CHANNEL_LAYERS["default"] to '
                 '"channels_redis.core.RedisChannelLayer" whenever chokaq_worker runs in its own process',
            id="chokaq.W006",
        ))
    return messages


# The tag of the checks a worker process runs at start (``chokaq_worker``): the engine's settings, database and
# drivers. The Deck's wiring (channel layer, ASGI application, URLconf) is the web process's to check: importing
# it would load the Deck, Channels and the project's views into every worker (~3 MiB of PSS).
ENGINE_TAG = "chokaq_engine"


def register() -> None:
    checks.register(check_configuration, "chokaq", ENGINE_TAG)
    checks.register(check_deck, "chokaq")
    checks.register(check_deploy, "chokaq", deploy=True)
