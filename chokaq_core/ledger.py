"""What ChokaQ's migrations share: the schema ledger (``chokaq_schema_migrations``), the row each migration records
about itself, and the builders of the operations that create its tables."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import migrations, models
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


def table(name: str, db_table: str, fields: list[tuple[str, Any]], **options: Any) -> migrations.CreateModel:
    """The ``CreateModel`` of model ``name`` stored in ``db_table`` (``options``: its indexes, constraints)."""
    return migrations.CreateModel(name=name, fields=fields, options={"db_table": db_table, **options})


def counters(*names: str) -> list[tuple[str, models.BigIntegerField[int, int]]]:
    """Counter columns: a 64-bit integer starting at 0 (in the row and in the database default)."""
    return [(name, models.BigIntegerField(db_default=0, default=0)) for name in names]
