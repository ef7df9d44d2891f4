"""Fewer index entries per job row version: every Hot update (claim, lease) is a non-HOT update that adds an entry
to each full index of the table and to each partial index whose condition the new version meets.

- The ``varchar_pattern_ops`` twin of the job id on PostgreSQL (Hot, Archive, DLQ) goes: no statement matches an id
  by prefix (``models.JobIdField`` keeps Django from creating it again).
- ``hot_tags`` goes: the Deck's search is ``LIKE '%…%'``, which a btree cannot serve; nothing else reads tags.
- ``hot_processing_worker`` (an entry per lease) becomes ``hot_cancel_requests``, which holds only the Processing
  rows with an operator's cancel request waiting: the supervisor's one read by worker; the zombie sweep and the
  Deck's Processing counts read ``hot_processing_heartbeat``.
"""

from django.db import migrations, models
from django.db.models import Q

from chokaq_core.ledger import ledger_steps
from chokaq_core.models import JobIdField
from chokaq_core.vendor_ops import DropPatternOpsTwin

ledger, unledger = ledger_steps(14, "LeanerHotIndexes", "Fewer index entries per job row version")

JOB_TABLES = ("jobshot", "jobsarchive", "jobsdlq")


class Migration(migrations.Migration):
    dependencies = [("chokaq_core", "0013_dlq_rate_key")]
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AlterField(model, "id", JobIdField(max_length=50, primary_key=True,
                                                                            serialize=False))
                              for model in JOB_TABLES],
            database_operations=[DropPatternOpsTwin(model, "id") for model in JOB_TABLES],
        ),
        migrations.RemoveIndex("jobshot", "hot_tags"),
        migrations.RemoveIndex("jobshot", "hot_processing_worker"),
        migrations.AddIndex(
            "jobshot",
            models.Index(fields=["worker_id"], condition=Q(status=2, cancel_requested_by__isnull=False),
                         name="hot_cancel_requests"),
        ),
        migrations.RunPython(ledger, unledger),
    ]
