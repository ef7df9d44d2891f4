"""A job enqueued to run now enters two Hot indexes fewer: ``hot_pending_lag`` and ``hot_pending_split`` hold only
the Pending rows with a schedule (delayed, retrying, held by an open circuit). A Pending row without
``scheduled_at`` is due, so neither index ever told anything about it: SQLite's claim reads due scheduled rows
through ``hot_pending_lag`` (its ``scheduled_at <= …`` implies the new condition), and the summary's Pending split
counts the ready rows as the Pending rows minus those that wait.
"""

from django.db import migrations, models
from django.db.models import Q

from chokaq_core.ledger import ledger_steps

ledger, unledger = ledger_steps(15, "ScheduledPendingIndexes", "Pending indexes of scheduled rows only")

SCHEDULED_PENDING = Q(status=0, scheduled_at__isnull=False)


class Migration(migrations.Migration):
    dependencies = [("chokaq_core", "0014_leaner_hot_indexes")]
    operations = [
        migrations.RemoveIndex("jobshot", "hot_pending_lag"),
        migrations.AddIndex("jobshot", models.Index(fields=["queue", "scheduled_at", "created_at"],
                                                    condition=SCHEDULED_PENDING, name="hot_pending_lag")),
        migrations.RemoveIndex("jobshot", "hot_pending_split"),
        migrations.AddIndex("jobshot", models.Index(fields=["status", "scheduled_at", "last_error_at", "held_by"],
                                                    condition=SCHEDULED_PENDING, name="hot_pending_split")),
        migrations.RunPython(ledger, unledger),
    ]
