"""Archive keeps the handler's return value (the django.tasks backend's results)."""

from django.db import migrations, models
from django.utils import timezone


def ledger(apps, schema_editor):
    apps.get_model("chokaq_core", "SchemaMigrations").objects.using(schema_editor.connection.alias).get_or_create(
        version=4,
        defaults={"name": "ArchiveResult", "description": "Archive result column (handler return value)",
                  "applied_at": timezone.now()},
    )


def unledger(apps, schema_editor):
    apps.get_model("chokaq_core", "SchemaMigrations").objects.using(schema_editor.connection.alias).filter(
        version=4
    ).delete()


class Migration(migrations.Migration):
    dependencies = [("chokaq_core", "0003_sqlserver_storage")]
    operations = [
        migrations.AddField(model_name="jobsarchive", name="result", field=models.TextField(null=True)),
        migrations.RunPython(ledger, unledger),
    ]
