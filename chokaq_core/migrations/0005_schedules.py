"""Recurring jobs: the latest claimed tick per schedule name."""

import django.db.models.functions.datetime
from django.db import migrations, models
from django.utils import timezone


def ledger(apps, schema_editor):
    apps.get_model("chokaq_core", "SchemaMigrations").objects.using(schema_editor.connection.alias).get_or_create(
        version=5,
        defaults={"name": "Schedules", "description": "Recurring job ticks", "applied_at": timezone.now()},
    )


def unledger(apps, schema_editor):
    apps.get_model("chokaq_core", "SchemaMigrations").objects.using(schema_editor.connection.alias).filter(
        version=5
    ).delete()


class Migration(migrations.Migration):
    dependencies = [("chokaq_core", "0004_archive_result")]
    operations = [
        migrations.CreateModel(
            name="Schedules",
            fields=[
                ("name", models.CharField(max_length=200, primary_key=True, serialize=False)),
                ("last_tick_at", models.DateTimeField()),
                ("updated_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={"db_table": "chokaq_schedules"},
        ),
        migrations.RunPython(ledger, unledger),
    ]
