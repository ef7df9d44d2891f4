"""The ChokaQ schema ledger (``chokaq_schema_migrations``): the row each migration records about itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.utils import timezone

LedgerStep = Callable[[Any, Any], None]


def ledger_steps(version: int, name: str, description: str) -> tuple[LedgerStep, LedgerStep]:
    """The ``RunPython`` pair of a migration: record its ledger row (once) going forwards, remove it going back."""

    def ledger(apps: Any, schema_editor: Any) -> None:
        apps.get_model("chokaq_core", "SchemaMigrations").objects.using(schema_editor.connection.alias).get_or_create(
            version=version, defaults={"name": name, "description": description, "applied_at": timezone.now()},
        )

    def unledger(apps: Any, schema_editor: Any) -> None:
        apps.get_model("chokaq_core", "SchemaMigrations").objects.using(schema_editor.connection.alias).filter(
            version=version
        ).delete()

    return ledger, unledger
