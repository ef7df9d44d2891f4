"""The ChokaQ schema ledger: the row each migration records about itself."""

from __future__ import annotations

import types

import pytest
from django.apps import apps

from chokaq_core.ledger import ledger_steps
from chokaq_core.models import SchemaMigrations

pytestmark = pytest.mark.django_db


def test_the_migrations_record_their_ledger_rows() -> None:
    rows = dict(SchemaMigrations.objects.filter(version__in=[4, 5, 6, 8, 9, 10, 11, 12, 13]).values_list(
        "version", "name"))
    assert rows == {4: "ArchiveResult", 5: "Schedules", 6: "JobAttempts", 8: "EditRevision",
                    10: "History", 11: "RateLimits", 12: "ErrorColumns", 13: "DlqRateKey"}


def test_a_ledger_row_is_recorded_once_and_removed_going_back() -> None:
    ledger, unledger = ledger_steps(99, "Probe", "a test row")
    editor = types.SimpleNamespace(connection=types.SimpleNamespace(alias="default"))
    ledger(apps, editor)
    ledger(apps, editor)
    row = SchemaMigrations.objects.get(version=99)
    assert (row.name, row.description, row.applied_at is not None) == ("Probe", "a test row", True)
    unledger(apps, editor)
    assert not SchemaMigrations.objects.filter(version=99).exists()
