"""The claim's two streams get an index each, and ``hot_fetch_pending`` (every Pending row) goes.

``hot_fetch_due`` holds the Pending rows without ``scheduled_at`` (every one of them due) in claim order;
``hot_fetch_scheduled`` the scheduled ones. In ``hot_fetch_pending`` the rows without a schedule sorted after the
scheduled ones of their priority, so "due, without a schedule" was no range of it: a claim walked every row
scheduled for later (a million reminders due tomorrow made each claim read a million rows). A row due at once
still enters three Hot indexes, a scheduled row five, as before.

On PostgreSQL and SQL Server both carry ``type`` (``INCLUDE``, ``chokaq_core.models.COVERING_COLUMNS``); the
migration state lists key columns only (see 0007). Going back recreates ``hot_fetch_pending`` without it.
"""

from django.db import migrations, models
from django.db.models import Q

from chokaq_core.ledger import ledger_steps

ledger, unledger = ledger_steps(16, "ClaimStreamIndexes", "One index per claim stream: due rows, scheduled rows")

STREAMS = {"hot_fetch_due": (["queue", "-priority", "created_at"], Q(status=0, scheduled_at__isnull=True)),
           "hot_fetch_scheduled": (["queue", "-priority", "scheduled_at", "created_at"],
                                   Q(status=0, scheduled_at__isnull=False))}


class Migration(migrations.Migration):
    dependencies = [("chokaq_core", "0015_scheduled_pending_indexes")]
    operations = [
        *(migrations.SeparateDatabaseAndState(
            database_operations=[migrations.AddIndex("jobshot", models.Index(
                fields=fields, condition=condition, include=("type",), name=name))],
            state_operations=[migrations.AddIndex("jobshot", models.Index(
                fields=fields, condition=condition, name=name))],
        ) for name, (fields, condition) in STREAMS.items()),
        migrations.RemoveIndex("jobshot", "hot_fetch_pending"),
        migrations.RunPython(ledger, unledger),
    ]
