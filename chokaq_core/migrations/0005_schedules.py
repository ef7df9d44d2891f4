"""Recurring jobs: the latest claimed tick per schedule name."""

import django.db.models.functions.datetime
from django.db import migrations, models

from chokaq_core.ledger import ledger_steps, table

ledger, unledger = ledger_steps(5, "Schedules", "Recurring job ticks")


class Migration(migrations.Migration):
    dependencies = [("chokaq_core", "0004_archive_result")]
    operations = [
        table("Schedules", "chokaq_schedules", [
            ("name", models.CharField(max_length=200, primary_key=True, serialize=False)),
            ("last_tick_at", models.DateTimeField()),
            ("updated_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
        ]),
        migrations.RunPython(ledger, unledger),
    ]
