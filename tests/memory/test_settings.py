"""CHOKAQ["STORAGE"] and CHOKAQ["IN_MEMORY"] settings (spec 03 §15, 05 §1)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from chokaq_core import storage
from chokaq_core.checks import check_configuration
from chokaq_core.conf import DEFAULTS, collect_errors, config


def test_defaults() -> None:
    assert DEFAULTS["STORAGE"] == "sql"
    assert DEFAULTS["IN_MEMORY"] == {"MAX_CAPACITY": 100_000}


@pytest.mark.parametrize(("override", "message"), [
    ({"STORAGE": "redis"}, "STORAGE must be 'sql' or 'memory'"),
    ({"IN_MEMORY": {"MAX_CAPACITY": 0}}, "IN_MEMORY.MAX_CAPACITY must be an integer >= 1"),
    ({"IN_MEMORY": {"MAX_CAPACITY": 1.5}}, "IN_MEMORY.MAX_CAPACITY must be an integer >= 1"),
    ({"IN_MEMORY": {"MAX_CAPACITY": True}}, "IN_MEMORY.MAX_CAPACITY must be an integer >= 1"),
    ({"IN_MEMORY": {"MAX_ROWS": 5}}, "unknown setting CHOKAQ['IN_MEMORY']['MAX_ROWS']"),
])
def test_bad_values_are_refused(chokaq_settings: Any, override: dict[str, Any], message: str) -> None:
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, **override}
    assert any(message in e for e in collect_errors())
    with pytest.raises(ImproperlyConfigured, match="Invalid ChokaQ configuration"):
        config()


def test_memory_mode_skips_the_database_checks(chokaq_settings: Any) -> None:
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "DATABASE": "no-such-alias"}
    assert check_configuration() == [], "STORAGE = 'memory' needs no database alias"
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "STORAGE": "sql"}
    assert [m.id for m in check_configuration()] == ["chokaq.E002"]
    assert storage.memory_mode() is False
