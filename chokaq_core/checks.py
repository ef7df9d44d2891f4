"""Django system checks for ChokaQ (spec 05 §1)."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.db import connections

SUPPORTED_VENDORS = ("postgresql", "sqlite", "microsoft")


def check_configuration(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from chokaq_core.conf import collect_errors, config

    messages: list[checks.CheckMessage] = [
        checks.Error(error, id="chokaq.E001", hint="Fix settings.CHOKAQ") for error in collect_errors()
    ]
    if messages:
        return messages
    alias = config().DATABASE
    if alias not in connections.settings:
        return [checks.Error(f"CHOKAQ['DATABASE'] names unknown alias {alias!r}", id="chokaq.E002")]
    vendor = connections[alias].vendor
    if vendor not in SUPPORTED_VENDORS:
        messages.append(
            checks.Error(
                f"database vendor {vendor!r} is not supported by ChokaQ",
                hint=f"use one of {', '.join(SUPPORTED_VENDORS)}",
                id="chokaq.E003",
            )
        )
    return messages


def register() -> None:
    checks.register(check_configuration, "chokaq")
