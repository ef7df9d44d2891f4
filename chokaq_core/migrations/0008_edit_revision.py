"""The edit version of Hot and DLQ rows: a stale operator edit is refused instead of overwriting a newer one."""

from django.db import migrations, models
from django.utils import timezone


def ledger(apps, schema_editor):
    apps.get_model("chokaq_core", "SchemaMigrations").objects.using(schema_editor.connection.alias).get_or_create(
        version=8,
        defaults={"name": "EditRevision", "description": "Edit version of Hot and DLQ rows",
                  "applied_at": timezone.now()},
    )


def unledger(apps, schema_editor):
    apps.get_model("chokaq_core", "SchemaMigrations").objects.using(schema_editor.connection.alias).filter(
        version=8
    ).delete()


class Migration(migrations.Migration):
    dependencies = [("chokaq_core", "0007_covering_indexes_state")]
    operations = [
        migrations.AddField("jobshot", "revision", models.IntegerField(default=0, db_default=0)),
        migrations.AddField("jobsdlq", "revision", models.IntegerField(default=0, db_default=0)),
        migrations.RunPython(ledger, unledger),
    ]
