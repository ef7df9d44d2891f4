"""Errors apart from their tracebacks: the exception class and message of DLQ rows, the last error of a retrying
Hot row and the circuit that holds it, and the indexes of the DLQ's error-group filter and the Pending split.

Existing rows keep NULL (no scan of a large DLQ): the Deck shows their details' last line instead.
"""

from django.db import migrations, models
from django.db.models import Q

from chokaq_core.ledger import ledger_steps

ledger, unledger = ledger_steps(12, "ErrorColumns", "Error class and message apart from the traceback")


class Migration(migrations.Migration):
    # written on 0008_edit_revision; chained after main's latest (0011_rate_limits) so the graph has one leaf
    dependencies = [("chokaq_core", "0011_rate_limits")]
    operations = [
        migrations.AddField("jobshot", "last_error_class", models.CharField(max_length=255, null=True)),
        migrations.AddField("jobshot", "last_error_message", models.CharField(max_length=1000, null=True)),
        migrations.AddField("jobshot", "last_error_at", models.DateTimeField(null=True)),
        migrations.AddField("jobshot", "held_by", models.CharField(max_length=255, null=True)),
        migrations.AddField("jobsdlq", "error_class", models.CharField(max_length=255, null=True)),
        migrations.AddField("jobsdlq", "error_message", models.CharField(max_length=1000, null=True)),
        migrations.AddIndex(
            "jobshot",
            models.Index(fields=["status", "scheduled_at", "last_error_at", "held_by"], condition=Q(status=0),
                         name="hot_pending_split"),
        ),
        migrations.AddIndex(
            "jobsdlq", models.Index(fields=["failure_reason", "error_class", "-failed_at"], name="dlq_by_error"),
        ),
        migrations.RunPython(ledger, unledger),
    ]
