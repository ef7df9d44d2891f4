"""A DLQ row keeps its job's ``rate_key``, so a resurrected job counts against the same partition of a per-key
rate limit as before it failed. Existing rows keep NULL (the limit's shared allowance, as they had)."""

from django.db import migrations, models

from chokaq_core.ledger import ledger_steps

ledger, unledger = ledger_steps(13, "DlqRateKey", "A DLQ row keeps its job's rate key")


class Migration(migrations.Migration):
    dependencies = [("chokaq_core", "0012_error_columns")]
    operations = [
        migrations.AddField("jobsdlq", "rate_key", models.CharField(max_length=255, null=True)),
        migrations.RunPython(ledger, unledger),
    ]
