"""Archive keeps the handler's return value (the django.tasks backend's results)."""

from django.db import migrations, models

from chokaq_core.ledger import ledger_steps

ledger, unledger = ledger_steps(4, "ArchiveResult", "Archive result column (handler return value)")


class Migration(migrations.Migration):
    dependencies = [("chokaq_core", "0003_sqlserver_storage")]
    operations = [
        migrations.AddField(model_name="jobsarchive", name="result", field=models.TextField(null=True)),
        migrations.RunPython(ledger, unledger),
    ]
