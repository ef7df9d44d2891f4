"""What a worker process of the demo project imports: only what it runs (its PSS is a performance target)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

# django.setup() of the demo project and the worker command's imports, as `manage.py chokaq_worker` does them
PROBE = """
import json, sys
import django
django.setup()
from django.core.management import load_command_class
load_command_class("chokaq_core", "chokaq_worker")
print(json.dumps(sorted(sys.modules)))
"""


def worker_modules(database_url: str) -> set[str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "DATABASE_URL": database_url}
    env.pop("REDIS_URL", None)
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_a_postgresql_worker_loads_neither_the_in_memory_store_nor_the_decks_websocket_side() -> None:
    modules = worker_modules("postgres://postgres@127.0.0.1:5432/unused")  # setup does not connect
    unneeded = {"chokaq_core.sql.memory", "chokaq_core.sql.sqlite", "django.db.backends.sqlite3.base",
                "deck.consumers", "channels.generic.websocket", "chokaq_core.service",
                "croniter", "dateutil",  # the schedules' parser: the demo project has no schedules
                "daphne", "twisted",  # the web server's
                # Django's debug views (their template engine, tags, lorem ipsum): only an error report needs them
                "django.views.debug", "django.template.defaulttags",
                # the Prometheus exposition and the stdlib it serves with: only --metrics-port loads them
                "prometheus_client", "chokaq_core.prometheus", "http.server", "urllib.request", "wsgiref",
                # auth's login/password views: only the Deck's login redirect needs them, not its policy check
                "django.contrib.auth.views",
                # the Deck's reads and the read model they build (rows, counters, snapshot): only service reads them
                "chokaq_core.sql.reads", "chokaq_core.readmodel"}
    assert not unneeded & modules, sorted(unneeded & modules)
    assert {"chokaq_core.storage", "chokaq_core.worker", "deck.apps", "chokaq_core.sql.postgresql"} <= modules


# What a worker holds of the Deck's reads: the read model's classes in any of ChokaQ's modules, the read functions
# on its dialect (with their statements' builders and row mappers)
READS_PROBE = """
import json, sys
import django
django.setup()
from django.core.management import load_command_class
load_command_class("chokaq_core", "chokaq_worker")
from chokaq_core import storage
model = {"JobRow", "SummaryStats", "QueueStats", "Totals", "MetricPoint", "QueueLag", "ErrorGroup", "BulkPreview",
         "SnapshotRequest", "DeckSnapshot", "HistorySort", "HistoryPoint", "TypeHistory", "HistoryWindow"}
held = {name for module in list(sys.modules) if module.startswith("chokaq_core")
        for name in vars(sys.modules[module]) if name in model}
dialect = type(storage.dialect())
reads = [name for name in ("list_active", "list_archive", "list_dlq", "summary_stats", "queue_stats", "throughput",
                           "queue_health", "top_errors", "preview_dlq_bulk", "deck_snapshot", "history_buckets")
         if hasattr(dialect, name)]
print(json.dumps({"model": sorted(held), "reads": reads}))
"""


def test_a_postgresql_worker_holds_neither_the_decks_read_model_nor_its_read_functions() -> None:
    """A worker never reads the Deck's lists, counters or snapshot: neither the dataclasses those reads build
    (~15–30 KiB each) nor the read functions of its dialect are in its memory."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings",
           "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/unused"}  # setup does not connect
    out = subprocess.run([sys.executable, "-c", READS_PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    held = json.loads(out.stdout.strip().splitlines()[-1])
    assert held == {"model": [], "reads": []}, held


# A worker's executions record every instrument; no MeterProvider is configured in the demo project
RECORD_PROBE = """
import json, sys
import django
django.setup()
from datetime import UTC, datetime
from chokaq_core import metrics
from chokaq_core.domain import HotJob, JobStatus, Success
now = datetime.now(UTC)
job = HotJob(id="j", queue="q", type="t", payload="{}", tags=None, idempotency_key=None, priority=10,
             status=JobStatus.PROCESSING, attempt_count=1, worker_id="w", heartbeat_at=None, scheduled_at=None,
             created_at=now, started_at=None, last_updated_at=now, created_by=None, last_modified_by=None)
metrics.execution_started(job)
metrics.execution_outcome(job, Success("j", 3.0))
metrics.execution_ended(job)
print(json.dumps(sorted(sys.modules)))
"""


def test_recording_the_instruments_loads_neither_prometheus_client_nor_an_unconfigured_opentelemetry() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings",
           "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/unused"}
    env.pop("OTEL_PYTHON_METER_PROVIDER", None)
    out = subprocess.run([sys.executable, "-c", RECORD_PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    modules = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert not {"prometheus_client", "opentelemetry", "opentelemetry.metrics"} & modules


def test_a_sqlite_worker_loads_the_sqlite_dialect_when_it_needs_it_but_not_the_in_memory_store() -> None:
    modules = worker_modules(f"sqlite:///{ROOT / 'var' / 'unused-probe.sqlite3'}")
    assert "chokaq_core.sql.memory" not in modules
    assert "deck.consumers" not in modules


def test_the_worker_caps_malloc_arenas_unless_the_environment_already_does(monkeypatch: pytest.MonkeyPatch) -> None:
    from chokaq_core import heap

    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert heap.limit_malloc_arenas() is False, "the operator's MALLOC_ARENA_MAX wins"
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    assert heap.limit_malloc_arenas(8) is True  # glibc (this machine): mallopt accepted the cap
    assert heap.limit_malloc_arenas() is True


def test_the_worker_command_gives_the_freed_heap_back_before_its_checks_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.core.management.base import BaseCommand

    from chokaq_core.management.commands import chokaq_worker

    calls: list[str] = []
    monkeypatch.setattr(chokaq_worker, "release_free_heap", lambda: calls.append("release") or True)
    monkeypatch.setattr(BaseCommand, "execute", lambda self, *args, **options: calls.append("checks and handle"))
    chokaq_worker.Command().execute()
    assert calls == ["release", "checks and handle"]


class StopReady(Exception):
    pass


def test_the_engine_is_imported_module_by_module_with_the_freed_heap_given_back_after_each(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from django.apps import apps as registry

    from chokaq_core import apps, heap

    steps: list[str] = []
    monkeypatch.setattr(heap.importlib, "import_module", lambda name: steps.append(name))
    monkeypatch.setattr(heap, "release_free_heap", lambda: steps.append("release") or True)
    heap.import_releasing(["chokaq_core.storage", "chokaq_core.api"])
    assert steps == ["chokaq_core.storage", "release", "chokaq_core.api", "release"]

    def first_step(modules: list[str]) -> None:
        steps[:] = list(modules)
        raise StopReady

    monkeypatch.setattr(heap, "import_releasing", first_step)
    with pytest.raises(StopReady):
        apps.ChokaQCoreConfig("chokaq_core", registry.get_app_config("chokaq_core").module)
    assert steps == list(apps.ENGINE_MODULES) and steps[-1] == "chokaq_core.backend"


@pytest.mark.parametrize("database", ["nowhere", "default"])
def test_the_app_configuration_loads_whatever_the_engines_database_setting(
        database: str, chokaq_settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading the vendor's dialect early is no check: an alias Django does not know, a database whose driver
    is missing, are left to the system checks (chokaq.E002, the missing extra), as before."""
    from django.apps import apps as registry
    from django.core.exceptions import ImproperlyConfigured

    from chokaq_core import apps, storage

    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "DATABASE": database}

    def no_driver(using: str | None = None) -> Any:
        raise ImproperlyConfigured("Error loading psycopg2 or psycopg module")

    if database == "default":
        monkeypatch.setattr(storage, "dialect", no_driver)
    config = apps.ChokaQCoreConfig("chokaq_core", registry.get_app_config("chokaq_core").module)
    assert config.label == "chokaq_core"


# Which models and admin registrations are loaded at the moment the engine's largest modules (the dialect core, the
# vendor's dialect, storage) are imported by a worker-like start of the demo project
ORDER_PROBE = """
import json, sys
WATCHED = ("chokaq_core.sql.base", "chokaq_core.sql.postgresql", "chokaq_core.storage")
LATER = ("chokaq_core.models", "deck.models", "django.contrib.auth.models", "django.contrib.auth.admin")
seen = {}
class Observer:
    def find_spec(self, name, path=None, target=None):
        if name in WATCHED and name not in seen:
            seen[name] = sorted(m for m in LATER if m in sys.modules)
        return None
sys.meta_path.insert(0, Observer())
import django
django.setup()
from django.core.management import load_command_class
load_command_class("chokaq_core", "chokaq_worker")
print(json.dumps(seen))
"""


def test_the_engine_is_compiled_before_the_project_loads_its_models_and_admin() -> None:
    """Where no ``.pyc`` is kept, compiling the engine's largest modules is the start-up's memory peak: over the
    heap of the app configurations, not over every model and the admin registrations, it stays under the running
    worker's level."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings",
           "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/unused"}  # setup does not connect
    out = subprocess.run([sys.executable, "-c", ORDER_PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"chokaq_core.sql.base": [], "chokaq_core.sql.postgresql": [], "chokaq_core.storage": []}


class NotGlibc:
    """A C library without glibc's malloc extensions (musl, macOS)."""


def test_without_glibc_the_heap_is_left_alone_and_the_engine_still_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    from chokaq_core import heap

    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.setattr(heap.ctypes, "CDLL", lambda name: NotGlibc())
    assert heap.release_free_heap() is False
    assert heap.limit_malloc_arenas() is False
    heap.import_releasing(["chokaq_core.storage", "chokaq_core.api"])


def test_the_settings_name_the_credential_masking_reporters_without_importing_the_debug_views_eagerly() -> None:
    from django.utils.module_loading import import_string
    from django.views.debug import ExceptionReporter, SafeExceptionReporterFilter

    from chokaq_core import redaction

    reporter_class = import_string("chokaq_core.redaction.CredentialMaskingExceptionReporter")
    try:
        raise ConnectionError("cannot reach postgres://app:s3cret@db/x")
    except ConnectionError as exc:
        reporter = reporter_class(None, type(exc), exc, exc.__traceback__)
    assert isinstance(reporter, ExceptionReporter)
    text = reporter.get_traceback_text()
    assert "s3cret" not in text and "postgres://app:***@db/x" in text
    assert issubclass(import_string("chokaq_core.redaction.CredentialMaskingReporterFilter"),
                      SafeExceptionReporterFilter)
    with pytest.raises(AttributeError):
        redaction.NoSuchReporter  # noqa: B018


# The compiler's transient memory grows with the module it compiles (where no .pyc is kept, a worker compiles
# ChokaQ from source at every start): sql/base.py as one 115 KiB module was the start-up's memory peak, +3.6 MiB
# for ~60 ms, and left the running worker ~1 MiB more fragmented heap than the same code in two modules.
LARGEST_SOURCE = 96 * 1024


def test_no_module_of_chokaq_a_worker_compiles_is_larger_than_the_start_up_peak_allows() -> None:
    modules = worker_modules("postgres://postgres@127.0.0.1:5432/unused") | worker_modules(
        f"sqlite:///{ROOT / 'var' / 'unused-probe.sqlite3'}")
    sizes = {name: (ROOT / (name.replace(".", "/") + ".py")).stat().st_size for name in modules
             if name.startswith(("chokaq_core", "deck")) and (ROOT / (name.replace(".", "/") + ".py")).exists()}
    assert "chokaq_core.sql.base" in sizes
    large = {name: size for name, size in sizes.items() if size > LARGEST_SOURCE}
    assert not large, large
