"""Settings validation (spec 05 §1): every error is collected and reported together."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from chokaq_core.conf import config


def test_defaults() -> None:
    cfg = config()
    assert cfg.RETRY.MAX_ATTEMPTS == 3 and cfg.RETRY.BASE_DELAY == 3.0 and cfg.RETRY.MAX_DELAY == 3600.0
    assert cfg.WORKER.PREFETCH_CAPACITY == 100 and cfg.WORKER.FETCH_BATCH_SIZE == 20
    assert cfg.RECOVERY.PROCESSING_ZOMBIE_TIMEOUT == 600.0
    assert cfg.execution_timeout("anything") == 900.0


def test_timedelta_and_per_queue_timeout(settings: Any) -> None:
    settings.CHOKAQ = {"RETRY": {"BASE_DELAY": timedelta(milliseconds=500)},
                       "QUEUES": {"Reports": {"EXECUTION_TIMEOUT": timedelta(minutes=2)}}}
    cfg = config()
    assert cfg.RETRY.BASE_DELAY == 0.5
    assert cfg.execution_timeout("reports") == 120.0 and cfg.execution_timeout("REPORTS") == 120.0
    assert cfg.execution_timeout("emails") == 900.0


def test_all_errors_are_reported_together(settings: Any) -> None:
    settings.CHOKAQ = {
        "RETRY": {"MAX_ATTEMPTS": 0, "BASE_DELAY": -1, "MAX_DELAY": 10**9},
        "WORKER": {"CONCURRENCY": 0},
        "NOPE": 1,
        "EXECUTION": {"HEARTBEAT_INTERVAL_MIN": 20, "HEARTBEAT_INTERVAL_MAX": 10, "TYPO": 1},
        "QUEUES": {"q": {"MAX_WORKERS": 3}},
    }
    with pytest.raises(ImproperlyConfigured) as info:
        config()
    text = str(info.value)
    assert text.startswith("Invalid ChokaQ configuration: ")
    for fragment in ("RETRY.MAX_ATTEMPTS must be >= 1", "RETRY.BASE_DELAY must be > 0", "2^31-1 ms",
                     "WORKER.CONCURRENCY", "unknown setting CHOKAQ['NOPE']", "HEARTBEAT_INTERVAL_MAX",
                     "CHOKAQ['EXECUTION']['TYPO']", "only EXECUTION_TIMEOUT is supported"):
        assert fragment in text, fragment


def test_system_check_reports_bad_settings(settings: Any) -> None:
    settings.CHOKAQ = {"RETRY": {"MAX_ATTEMPTS": 0}}
    with pytest.raises(SystemCheckError, match=r"chokaq\.E001"):
        call_command("check")


def test_wrong_duration_type(settings: Any) -> None:
    settings.CHOKAQ = {"WORKER": {"POLLING_INTERVAL": "1s"}}
    with pytest.raises(ImproperlyConfigured, match=r"WORKER\.POLLING_INTERVAL: expected seconds or timedelta"):
        config()


@pytest.mark.parametrize("value", [-1, "20000", True, 1.5])
def test_hot_vacuum_threshold_must_be_a_count(settings: Any, value: Any) -> None:
    settings.CHOKAQ = {"SQL": {"HOT_VACUUM_MIN_DEAD_ROWS": value}}
    with pytest.raises(ImproperlyConfigured, match=r"SQL\.HOT_VACUUM_MIN_DEAD_ROWS must be None or an integer"):
        config()


def test_hot_vacuum_can_be_turned_off(settings: Any) -> None:
    settings.CHOKAQ = {"SQL": {"HOT_VACUUM_MIN_DEAD_ROWS": None}}
    assert config().SQL.HOT_VACUUM_MIN_DEAD_ROWS is None


def test_prepared_statements_flag_is_a_bool(settings: Any) -> None:
    settings.CHOKAQ = {"SQL": {"PREPARED_STATEMENTS": "yes"}}
    with pytest.raises(ImproperlyConfigured, match=r"SQL\.PREPARED_STATEMENTS must be True or False"):
        config()
