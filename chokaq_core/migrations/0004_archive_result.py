"""Archive keeps the handler's return value (issue 5: the django.tasks backend's results)."""

from pathlib import Path

from django.db import migrations, models
from django.utils import timezone

# Follows the SQL Server storage migration when it is present (it is written alongside).
_PREVIOUS = "0003_sqlserver_storage" if (Path(__file__).parent / "0003_sqlserver_storage.py").exists() else "0002_seed"


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
    dependencies = [("chokaq_core", _PREVIOUS)]
    operations = [
        migrations.AddField(model_name="jobsarchive", name="result", field=models.TextField(null=True)),
        migrations.RunPython(ledger, unledger),
    ]
