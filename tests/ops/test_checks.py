"""Every rule of spec 05 §1 produces its stable system-check id on bad settings."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core import checks as django_checks
from django.core.management import call_command
from django.db import connection, connections

from chokaq_core import checks
from chokaq_core.backend import ChokaQBackend
from chokaq_core.models import COVERING_COLUMNS, JobsArchive, JobsDLQ, JobsHot
from deck import checks as deck_checks

ROOT = Path(__file__).resolve().parents[2]


def ids(messages: list[django_checks.CheckMessage]) -> list[str]:
    return [m.id for m in messages if m.id]


def chokaq(settings: Any, **sections: Any) -> None:
    current = dict(settings.CHOKAQ)
    for key, value in sections.items():
        current[key] = {**current.get(key, {}), **value} if isinstance(value, dict) and key != "SCHEDULE" else value
    settings.CHOKAQ = current


def test_the_project_settings_pass() -> None:
    assert [m for m in checks.check_configuration() if m.is_serious()] == []
    assert [m for m in checks.check_deck() if m.is_serious()] == []
    assert ids(checks.check_deploy()) in ([], ["chokaq.W006"])  # W006: the suite runs without Redis by default


@pytest.mark.parametrize(
    ("sections", "fragment"),
    [
        ({"WORKER": {"POLLING_INTERVAL": 0}}, "WORKER.POLLING_INTERVAL must be > 0"),
        ({"EXECUTION": {"HEARTBEAT_INTERVAL_MIN": 10, "HEARTBEAT_INTERVAL_MAX": 5}}, "HEARTBEAT_INTERVAL_MAX"),
        ({"RETRY": {"MAX_ATTEMPTS": 0}}, "RETRY.MAX_ATTEMPTS"),
        ({"WORKER": {"REGISTRY_HEARTBEAT_INTERVAL": 60}}, "REGISTRY_HEARTBEAT_INTERVAL must be <"),
        ({"HEALTH": {"QUEUE_LAG_DEGRADED_THRESHOLD": 20, "QUEUE_LAG_UNHEALTHY_THRESHOLD": 10}},
         "QUEUE_LAG_UNHEALTHY_THRESHOLD must be >="),
        ({"HEALTH": {"QUEUE_LAG_DEGRADED_THRESHOLD": -1}}, "QUEUE_LAG_DEGRADED_THRESHOLD must be >= 0"),
        ({"METRICS": {"MAX_QUEUE_TAG_VALUES": 0}}, "METRICS.MAX_QUEUE_TAG_VALUES"),
        ({"METRICS": {"OVERFLOW_TAG_VALUE": "  "}}, "METRICS.OVERFLOW_TAG_VALUE"),
        ({"RETENTION": {"ARCHIVE_DAYS": -3}}, "RETENTION.ARCHIVE_DAYS"),
        ({"RETENTION": {"METRIC_BUCKETS_HOURS": None}}, "RETENTION.METRIC_BUCKETS_HOURS"),
        ({"SCHEDULE": {"nightly": {"CRON": "61 * * * *", "TYPE": "test.ok.v1"}}}, "not a valid cron expression"),
        ({"SCHEDULE": {"nightly": {"CRON": "0 3 * * *"}}}, "TYPE must be"),
        ({"SCHEDULE": {"nightly": {"CRON": "0 3 * * *", "TYPE": "t", "TIMEZONE": "Mars/Base"}}}, "TIMEZONE"),
        ({"SQL": {"CLEANUP_BATCH_SIZE": 0}}, "SQL.CLEANUP_BATCH_SIZE"),
        ({"NO_SUCH_SECTION": {}}, "unknown setting"),
    ],
)
def test_invalid_chokaq_settings_are_e001(chokaq_settings: Any, sections: dict[str, Any], fragment: str) -> None:
    chokaq(chokaq_settings, **sections)
    messages = checks.check_configuration()
    assert set(ids(messages)) == {"chokaq.E001"}
    assert any(fragment in m.msg for m in messages), [m.msg for m in messages]


def test_every_error_is_reported_at_once(chokaq_settings: Any) -> None:
    chokaq(chokaq_settings, WORKER={"POLLING_INTERVAL": 0}, RETRY={"MAX_ATTEMPTS": 0})
    assert len(checks.check_configuration()) == 2


def test_unknown_database_alias_is_e002(chokaq_settings: Any) -> None:
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "DATABASE": "nowhere"}
    assert ids(checks.check_configuration()) == ["chokaq.E002"]


def test_unsupported_vendor_is_e003(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections["default"], "vendor", "mysql")
    assert ids(checks.check_configuration()) == ["chokaq.E003"]


@pytest.mark.parametrize(
    ("deck", "problem"),
    [
        ({"ALLOW_ANONYMOUS": True, "READ_PERMISSION": "deck.view_deck"},
         "ALLOW_ANONYMOUS cannot be combined with READ_PERMISSION"),
        ({"ALLOW_ANONYMOUS": "yes"}, "ALLOW_ANONYMOUS must be True or False (got 'yes')"),
        ({"ROUTE_PREFIX": "chokaq"}, "ROUTE_PREFIX must be a path like '/deck' or '/ops/jobs' (got 'chokaq')"),
        ({"ROUTE_PREFIX": 7}, "ROUTE_PREFIX must be a path like '/deck' or '/ops/jobs' (got 7)"),
        ({"QUEUE_LAG_WARNING_THRESHOLD_SECONDS": 10, "QUEUE_LAG_CRITICAL_THRESHOLD_SECONDS": 10},
         "QUEUE_LAG_CRITICAL_THRESHOLD_SECONDS must be > QUEUE_LAG_WARNING_THRESHOLD_SECONDS (got 10 <= 10)"),
        ({"QUEUE_LAG_WARNING_THRESHOLD_SECONDS": -1}, "QUEUE_LAG_WARNING_THRESHOLD_SECONDS must be >= 0 (got -1)"),
        ({"QUEUE_LAG_CRITICAL_THRESHOLD_SECONDS": "10"},
         "QUEUE_LAG_CRITICAL_THRESHOLD_SECONDS must be a number of seconds (got '10')"),
        ({"DESTRUCTIVE_PERMISSION": "no-dot"}, "DESTRUCTIVE_PERMISSION must be None, a callable (user) -> bool or "
                                               "'<app_label>.<codename>' (got 'no-dot')"),
        ({"READ_PERMISSION": 3}, "READ_PERMISSION must be None, a callable (user) -> bool or "
                                 "'<app_label>.<codename>' (got 3)"),
        ({"TICK": 0}, "TICK must be a number of seconds > 0 (got 0)"),
        ({"POLL_INTERVAL": True}, "POLL_INTERVAL must be a number of seconds > 0 (got True)"),
        ({"LOGIN_FAILURES_PER_USER": "five"}, "LOGIN_FAILURES_PER_USER must be a rate like '5/5m'"),
        ("deck", "CHOKAQ_DECK must be a dict (got str)"),
    ],
)
def test_invalid_deck_settings_are_e004_and_stop_the_app(settings: Any, deck: Any, problem: str) -> None:
    """One validation: the system check reports exactly the bad value, and the app refuses to load on it."""
    from django.core.exceptions import ImproperlyConfigured

    from deck.permissions import check_policy

    settings.CHOKAQ_DECK = deck
    messages = deck_checks.check_settings()
    assert ids(messages) == ["chokaq.E004"] and messages[0].msg.startswith(problem)
    with pytest.raises(ImproperlyConfigured) as refused:
        check_policy()
    assert str(refused.value) == f"Invalid CHOKAQ_DECK: {messages[0].msg}"


@pytest.mark.parametrize("deck", [None, {}, {"ALLOW_ANONYMOUS": True, "READ_PERMISSION": None,
                                             "DESTRUCTIVE_PERMISSION": None, "ROUTE_PREFIX": "/ops/jobs",
                                             "QUEUE_LAG_WARNING_THRESHOLD_SECONDS": 0, "TICK": 0.05}])
def test_valid_deck_settings_pass(settings: Any, deck: Any) -> None:
    from deck.permissions import check_policy

    settings.CHOKAQ_DECK = deck
    assert deck_checks.check_settings() == []
    check_policy()


def test_deck_without_channels_is_e005(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.apps import apps

    installed = apps.is_installed
    monkeypatch.setattr(apps, "is_installed", lambda name: name != "channels" and installed(name))
    assert ids(checks.check_deck()) == ["chokaq.E005"]


@pytest.mark.parametrize("layers", [{}, {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}])
def test_no_cross_process_layer_is_a_deploy_warning_w006(settings: Any, layers: dict[str, Any]) -> None:
    """Without a channel layer (or with the in-memory one) the Deck still works on one host: in-process events
    and its database poll. Only ``check --deploy`` warns."""
    settings.CHANNEL_LAYERS = layers
    assert checks.check_deck() == []
    messages = checks.check_deploy()
    assert ids(messages) == ["chokaq.W006"]
    assert not messages[0].is_serious()


def test_unreachable_redis_is_w007_and_hides_the_password(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": ["redis://:s3cret@127.0.0.1:1/0"]}}}
    messages = checks.check_deck()
    assert ids(messages) == ["chokaq.W007"]
    assert "s3cret" not in messages[0].msg
    assert not messages[0].is_serious()


@pytest.mark.parametrize("host", ["redis://127.0.0.1:6379/0", ("127.0.0.1", 6379), {"address": "redis://127.0.0.1:6379"}])
def test_reachable_redis_passes(settings: Any, host: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": [host]}}}
    assert checks.check_deck() == []


def test_tasks_backend_without_the_app_is_e010(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = ChokaQBackend("default", {})
    assert backend.check() == []
    from django.apps import apps

    monkeypatch.setattr(apps, "is_installed", lambda name: name != "chokaq_core")
    assert ids(backend.check()) == ["chokaq.E010"]


def test_unregistered_types_in_production_are_w020(chokaq_settings: Any) -> None:
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "REQUIRE_REGISTERED_JOB_TYPES": False}
    chokaq_settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer"}}
    assert ids(checks.check_deploy()) == ["chokaq.W020"]
    messages = django_checks.run_checks(tags=["chokaq"], include_deployment_checks=True)
    assert "chokaq.W020" in ids(messages)


def test_manage_py_check_runs_the_chokaq_checks(settings: Any) -> None:
    settings.CHOKAQ_DECK = {"ROUTE_PREFIX": "chokaq"}
    with pytest.raises(Exception, match=r"chokaq\.E004"):
        call_command("check", tag=["chokaq"])


# ---------------------------------------------------------------- a project adopting ChokaQ


def test_check_prints_nothing_for_the_project(settings: Any) -> None:
    """No warnings at all (models.W040 of the covering indexes included), nothing silenced."""
    settings.SILENCED_SYSTEM_CHECKS = []
    out = io.StringIO()
    call_command("check", stdout=out, stderr=out)
    assert out.getvalue().strip() == "System check identified no issues (0 silenced).", out.getvalue()


@pytest.mark.django_db
def test_covering_indexes_keep_their_include_columns_where_the_vendor_has_them(vendor: str) -> None:
    """The models list key columns only; PostgreSQL keeps each index's INCLUDE columns, SQLite has the index."""
    with connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute("""
                SELECT i.relname, array_agg(a.attname ORDER BY k.n)
                FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
                CROSS JOIN LATERAL unnest(x.indkey) WITH ORDINALITY AS k(attnum, n)
                JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum
                WHERE k.n > x.indnkeyatts AND i.relname = ANY(%s)
                GROUP BY i.relname""", [list(COVERING_COLUMNS)])
            assert {name: tuple(columns) for name, columns in cursor.fetchall()} == COVERING_COLUMNS
        else:
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
            assert set(COVERING_COLUMNS) <= {row[0] for row in cursor.fetchall()}


@pytest.mark.django_db
def test_job_ids_have_no_pattern_ops_twin_and_django_would_not_add_one(vendor: str) -> None:
    """No ``_like`` index beside a job table's primary key (no statement matches ids by prefix), and the schema
    editor's own rule for adding one, on any later change of the field, declines on every job table."""
    tables = [model._meta.db_table for model in (JobsHot, JobsArchive, JobsDLQ)]
    listing = ("SELECT indexname FROM pg_indexes WHERE tablename = %s" if vendor == "postgresql"
               else "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = %s")
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(listing, [table])
            names = [row[0] for row in cursor.fetchall()]
            assert names and [name for name in names if name.endswith("_like")] == [], (table, names)
    if vendor == "postgresql":
        with connection.schema_editor(collect_sql=True) as editor:
            assert [editor._create_like_index_sql(m, m._meta.pk) for m in (JobsHot, JobsArchive, JobsDLQ)] == [None] * 3


# ---------------------------------------------------------------- chokaq.E008: a missing optional dependency


def without(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make ``modules`` not installed for this test (``import`` raises, ``find_spec`` finds nothing)."""
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # type: ignore[arg-type]


@pytest.fixture
def extra_alias(monkeypatch: pytest.MonkeyPatch, chokaq_settings: Any) -> Iterator[Callable[[dict[str, Any]], None]]:
    """Point CHOKAQ["DATABASE"] at an extra alias with the given settings (never connected to)."""

    def use(database: dict[str, Any]) -> None:
        monkeypatch.setitem(connections.settings, "chokaq_extra", {**connections.settings["default"], **database})
        chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "DATABASE": "chokaq_extra"}

    yield use
    with contextlib.suppress(AttributeError):  # the wrapper exists only when a check asked for the vendor
        del connections["chokaq_extra"]


@pytest.mark.parametrize(("engine", "module", "extra"), [
    ("django.db.backends.postgresql", "psycopg", "postgres"),
    ("mssql", "mssql", "mssql"),
])
def test_a_database_driver_missing_is_e008_naming_the_extra(monkeypatch: pytest.MonkeyPatch, extra_alias: Any,
                                                            engine: str, module: str, extra: str) -> None:
    without(monkeypatch, module)
    extra_alias({"ENGINE": engine, "NAME": "shop", "OPTIONS": {}})
    messages = checks.check_configuration()
    assert ids(messages) == ["chokaq.E008"]
    assert f'pip install "django-chokaq[{extra}]"' == messages[0].hint and module in messages[0].msg


def test_a_redis_channel_layer_without_channels_redis_is_e008(monkeypatch: pytest.MonkeyPatch,
                                                                settings: Any) -> None:
    without(monkeypatch, "channels_redis", "redis")
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": ["redis://127.0.0.1:6379/0"]}}}
    messages = checks.check_deck()
    assert ids(messages) == ["chokaq.E008"]
    assert messages[0].hint == 'pip install "django-chokaq[redis]"'


def test_the_redis_idempotency_store_without_redis_is_e008(monkeypatch: pytest.MonkeyPatch,
                                                             chokaq_settings: Any) -> None:
    without(monkeypatch, "redis")
    chokaq(chokaq_settings, IDEMPOTENCY={"STORE": checks.REDIS_IDEMPOTENCY_STORE, "REDIS_URL": "redis://x"})
    assert ids(checks.check_configuration()) == ["chokaq.E008"]


def test_missing_extras_are_check_errors_never_import_errors_at_start_up(tmp_path: Path) -> None:
    """A process without psycopg, channels_redis, redis, opentelemetry, mssql and daphne imports the engine and
    the Deck, and ``check`` names the extra the settings need. (A missing driver of the *default* database
    stops Django itself before any app loads; for ChokaQ's own alias see the test above.)"""
    script = tmp_path / "start.py"
    script.write_text(
        "import sys\n"
        "for name in ('psycopg', 'psycopg2', 'channels_redis', 'redis', 'opentelemetry', 'mssql', 'pyodbc',"
        " 'daphne'):\n"
        "    sys.modules[name] = None\n"
        "import django\n"
        "from django.core.management import execute_from_command_line\n"
        "django.setup()\n"
        "import chokaq_core, chokaq_core.storage, chokaq_core.worker, chokaq_core.metrics, deck.asgi, deck.views\n"
        "execute_from_command_line(['manage.py', 'check'])\n"
    )
    env = {**{k: v for k, v in os.environ.items() if k != "DATABASE_URL"}, "DJANGO_SETTINGS_MODULE": "tests.settings",
           "REDIS_URL": "redis://127.0.0.1:6379/0", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output and "ImportError" not in output, output
    assert 'pip install "django-chokaq[redis]"' in output, output
    assert "chokaq.E008" in output


# ---------------------------------------------------------------- chokaq.E009: SQLite transaction mode


@pytest.mark.parametrize("options", [{}, {"transaction_mode": "DEFERRED"}, {"timeout": 20}])
def test_sqlite_without_immediate_transactions_is_e009_with_a_hint(extra_alias: Any, options: dict[str, Any]) -> None:
    extra_alias({"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:", "OPTIONS": options})
    messages = checks.check_configuration()
    assert ids(messages) == ["chokaq.E009"]
    assert messages[0].is_serious() and '"transaction_mode": "IMMEDIATE"' in (messages[0].hint or "")


@pytest.mark.parametrize("mode", ["IMMEDIATE", "immediate"])
def test_sqlite_with_immediate_transactions_passes(extra_alias: Any, mode: str) -> None:
    extra_alias({"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:", "OPTIONS": {"transaction_mode": mode}})
    assert checks.check_configuration() == []


# ---------------------------------------------------------------- chokaq.E011: the ASGI application


def _django_app() -> Any:
    from django.core.asgi import get_asgi_application

    return get_asgi_application()


async def _custom_app(scope: Any, receive: Any, send: Any) -> None:
    """An ASGI callable the check cannot look into."""


def _asgi_candidates() -> dict[str, Any]:
    from channels.routing import ProtocolTypeRouter, URLRouter
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
    from django.urls import path

    from deck.asgi import with_deck
    from deck.consumers import DeckConsumer

    return {
        "DJANGO_ONLY": _django_app(),
        "STATIC_DJANGO_ONLY": ASGIStaticFilesHandler(_django_app()),
        "HTTP_ONLY_ROUTER": ProtocolTypeRouter({"http": _django_app()}),
        "OTHER_SOCKETS": ProtocolTypeRouter({"http": _django_app(), "websocket": URLRouter([
            path("ws/chat/", DeckConsumer.as_asgi())])}),
        "WITH_DECK": with_deck(_django_app()),
        "WITH_DECK_AND_STATIC": with_deck(ASGIStaticFilesHandler(_django_app())),
        "NESTED": ProtocolTypeRouter({"http": _django_app(), "websocket": URLRouter([
            path("ws/", URLRouter([path("deck/", DeckConsumer.as_asgi())]))])}),
        "CUSTOM": _custom_app,
    }


ASGI_CANDIDATES = ("DJANGO_ONLY", "STATIC_DJANGO_ONLY", "HTTP_ONLY_ROUTER", "OTHER_SOCKETS", "WITH_DECK",
                   "WITH_DECK_AND_STATIC", "NESTED", "CUSTOM")


def __getattr__(name: str) -> Any:
    """ASGI_APPLICATION candidates importable as ``tests.ops.test_checks.<NAME>`` (built on first access)."""
    if name in ASGI_CANDIDATES:
        return _asgi_candidates()[name]
    raise AttributeError(name)


@pytest.mark.parametrize("application", [None, "DJANGO_ONLY", "STATIC_DJANGO_ONLY", "HTTP_ONLY_ROUTER",
                                         "OTHER_SOCKETS", "tests.ops.no_such_module.application"])
def test_an_asgi_application_without_the_deck_route_is_e011(settings: Any, application: str | None) -> None:
    settings.ASGI_APPLICATION = application and (application if "." in application else f"{__name__}.{application}")
    messages = deck_checks.check_asgi_application()
    assert ids(messages) == ["chokaq.E011"]
    assert "with_deck(get_asgi_application())" in (messages[0].hint or "")


@pytest.mark.parametrize("application", ["WITH_DECK", "WITH_DECK_AND_STATIC", "NESTED", "CUSTOM"])
def test_an_asgi_application_routing_the_deck_passes(settings: Any, application: str) -> None:
    settings.ASGI_APPLICATION = f"{__name__}.{application}"
    assert deck_checks.check_asgi_application() == []


def test_the_project_asgi_application_routes_the_deck_under_its_prefix(settings: Any) -> None:
    assert settings.ASGI_APPLICATION == "config.asgi.application"
    assert deck_checks.check_asgi_application() == []
    settings.CHOKAQ_DECK = {**settings.CHOKAQ_DECK, "ROUTE_PREFIX": "/ops/jobs"}  # routing.py read /deck
    assert ids(deck_checks.check_asgi_application()) == ["chokaq.E011"]


# ---------------------------------------------------------------- chokaq.E012: where deck.urls is included

urlpatterns: list[Any] = []  # a ROOT_URLCONF without the Deck


def test_deck_urls_at_another_path_than_the_route_prefix_is_e012(settings: Any) -> None:
    assert deck_checks.check_url_prefix() == []
    settings.CHOKAQ_DECK = {**settings.CHOKAQ_DECK, "ROUTE_PREFIX": "/ops"}
    messages = deck_checks.check_url_prefix()
    assert ids(messages) == ["chokaq.E012"] and "'/deck/'" in messages[0].msg


def test_deck_installed_but_not_included_is_e012(settings: Any) -> None:
    settings.ROOT_URLCONF = __name__
    messages = deck_checks.check_url_prefix()
    assert ids(messages) == ["chokaq.E012"] and 'include("deck.urls")' in messages[0].msg
