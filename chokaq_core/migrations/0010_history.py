"""History roll-ups (minute and hour buckets with a duration histogram), the purged counter, and the
Recurring panel's columns (operator switch, the latest job of each schedule)."""

from django.db import migrations, models

from chokaq_core.ledger import counters, ledger_steps, table
from chokaq_core.vendor_ops import SqlServerPageCompression

BINS = 20


ledger, unledger = ledger_steps(10, "History", "History buckets, purged counter, schedule switches")


class Migration(migrations.Migration):
    dependencies = [("chokaq_core", "0008_edit_revision")]
    operations = [
        migrations.AddField("statssummary", "purged_total", models.BigIntegerField(default=0, db_default=0)),
        migrations.AddField("schedules", "enabled", models.BooleanField(null=True)),
        migrations.AddField("schedules", "last_job_id", models.CharField(max_length=50, null=True)),
        migrations.AddField("schedules", "last_run_at", models.DateTimeField(null=True)),
        table("HistoryBuckets", "chokaq_history_buckets", [
            ("pk", models.CompositePrimaryKey("granularity", "bucket_start", "queue", "type", "outcome",
                                              blank=True, editable=False, primary_key=True, serialize=False)),
            ("granularity", models.IntegerField()),
            ("bucket_start", models.DateTimeField()),
            ("queue", models.CharField(max_length=255)),
            ("type", models.CharField(max_length=255)),
            ("outcome", models.SmallIntegerField()),
            *counters("completed_count", "duration_count"),
            ("total_duration_ms", models.FloatField(default=0, db_default=0)),
            ("max_duration_ms", models.FloatField(null=True)),
            *counters(*(f"b{i:02d}" for i in range(BINS))),
        ], constraints=[
            models.CheckConstraint(condition=models.Q(outcome__in=[0, 1]), name="history_outcome_0_1"),
            models.CheckConstraint(condition=models.Q(granularity__in=[60, 3600]), name="history_granularity"),
        ]),
        SqlServerPageCompression("HistoryBuckets", fillfactor=80),
        migrations.RunPython(ledger, unledger),
    ]
