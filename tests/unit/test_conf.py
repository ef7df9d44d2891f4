"""Settings validation (spec 05 §1): every error is collected and reported together."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from chokaq_core.conf import DEFAULTS, config
from deck.conf import DEFAULTS as DECK_DEFAULTS


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


# ---------------------------------------------------------------- the configuration reference (docs/configuration.md)

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
FREE_SECTIONS = ("QUEUES", "SCHEDULE")  # user-named entries, documented as one key each


def documented_keys(heading: str) -> dict[str, list[str]]:
    """Rows of the reference tables under ``## <heading>``: key → its other cells (default, meaning)."""
    section = REFERENCE.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        match = re.match(r"\|\s*`([A-Z_.]+)`\s*\|(.*)\|\s*$", line)
        if match:
            rows[match.group(1)] = [cell.strip() for cell in match.group(2).split("|")]
    return rows


def setting_keys(defaults: dict[str, Any], prefix: str = "") -> list[str]:
    """Every key of a defaults dict, nested sections as dotted names (``RETRY.MAX_ATTEMPTS``)."""
    keys: list[str] = []
    for key, value in defaults.items():
        if isinstance(value, dict) and value and key not in FREE_SECTIONS:
            keys += setting_keys(value, f"{prefix}{key}.")
        else:
            keys.append(prefix + key)
    return keys


@pytest.mark.parametrize(("heading", "defaults"), [("`CHOKAQ`", DEFAULTS), ("`CHOKAQ_DECK`", DECK_DEFAULTS)],
                         ids=["CHOKAQ", "CHOKAQ_DECK"])
def test_the_configuration_reference_lists_every_key_with_default_and_meaning(heading: str,
                                                                               defaults: dict[str, Any]) -> None:
    rows = documented_keys(heading)
    missing = [key for key in setting_keys(defaults) if key not in rows]
    assert not missing, f"docs/configuration.md does not list {missing}"
    stale = [key for key in rows if key not in setting_keys(defaults)]
    assert not stale, f"docs/configuration.md lists keys that no longer exist: {stale}"
    for key, cells in rows.items():
        assert len(cells) == 2 and all(cells), f"{key}: a default and a meaning are needed, got {cells}"


def test_the_reference_test_notices_a_new_key() -> None:
    assert "RETRY.NEW_KNOB" not in documented_keys("`CHOKAQ`")
    assert "RETRY.NEW_KNOB" in setting_keys({**DEFAULTS, "RETRY": {**DEFAULTS["RETRY"], "NEW_KNOB": 1}})
