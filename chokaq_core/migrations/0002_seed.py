"""Seed rows: the ``default`` queue, its counters, and the ChokaQ schema ledger (spec 01 §2.7)."""

from django.db import migrations
from django.utils import timezone

LEDGER = [
    (1, "Initial", "Initial Three Pillars schema"),
    (2, "HotPathIndexes", "Hot path index hardening"),
    (3, "MetricBuckets", "Rolling metric buckets"),
]


def seed(apps, schema_editor):
    alias = schema_editor.connection.alias
    now = timezone.now()
    apps.get_model("chokaq_core", "Queues").objects.using(alias).get_or_create(
        name="default", defaults={"is_paused": False, "is_active": True, "last_updated_at": now}
    )
    apps.get_model("chokaq_core", "StatsSummary").objects.using(alias).get_or_create(
        queue="default", defaults={"last_activity_at": now}
    )
    ledger = apps.get_model("chokaq_core", "SchemaMigrations")
    for version, name, description in LEDGER:
        ledger.objects.using(alias).get_or_create(
            version=version, defaults={"name": name, "description": description, "applied_at": now}
        )


class Migration(migrations.Migration):
    dependencies = [("chokaq_core", "0001_initial")]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
