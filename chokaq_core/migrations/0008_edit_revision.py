"""The edit version of Hot and DLQ rows: a stale operator edit is refused instead of overwriting a newer one."""

from django.db import migrations, models

from chokaq_core.ledger import ledger_steps

ledger, unledger = ledger_steps(8, "EditRevision", "Edit version of Hot and DLQ rows")


class Migration(migrations.Migration):
    dependencies = [("chokaq_core", "0007_covering_indexes_state")]
    operations = [
        migrations.AddField("jobshot", "revision", models.IntegerField(default=0, db_default=0)),
        migrations.AddField("jobsdlq", "revision", models.IntegerField(default=0, db_default=0)),
        migrations.RunPython(ledger, unledger),
    ]
