"""Every rule of spec 05 §1 produces its stable system-check id on bad settings."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import checks as django_checks
from django.core.management import call_command
from django.db import connections

from chokaq_core import checks
from chokaq_core.backend import ChokaQBackend


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
    assert checks.check_deploy() == []


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
    "deck",
    [
        {"ALLOW_ANONYMOUS": True, "READ_PERMISSION": "deck.view_deck"},
        {"ROUTE_PREFIX": "chokaq"},
        {"QUEUE_LAG_WARNING_THRESHOLD_SECONDS": 10, "QUEUE_LAG_CRITICAL_THRESHOLD_SECONDS": 10},
        {"QUEUE_LAG_WARNING_THRESHOLD_SECONDS": -1},
        {"DESTRUCTIVE_PERMISSION": "no-dot"},
    ],
)
def test_invalid_deck_settings_are_e004(settings: Any, deck: dict[str, Any]) -> None:
    settings.CHOKAQ_DECK = deck
    assert "chokaq.E004" in ids(checks.check_deck())


def test_deck_without_a_channel_layer_is_e005(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {}
    assert ids(checks.check_deck()) == ["chokaq.E005"]


def test_in_memory_layer_is_w006(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    messages = checks.check_deck()
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
    assert ids(checks.check_deploy()) == ["chokaq.W020"]
    messages = django_checks.run_checks(tags=["chokaq"], include_deployment_checks=True)
    assert "chokaq.W020" in ids(messages)


def test_manage_py_check_runs_the_chokaq_checks(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {}
    with pytest.raises(Exception, match=r"chokaq\.E005"):
        call_command("check", tag=["chokaq"])
