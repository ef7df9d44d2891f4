"""Fleet-wide rate limits: the job's ``rate_key``, the limits (declared + operator overrides) and their token
buckets. SQL Server gets the same DDL from the schema editor (the tables are small: no compression)."""

import django.db.models.functions.datetime
from django.db import migrations, models

from chokaq_core.ledger import ledger_steps, table

ledger, unledger = ledger_steps(11, "RateLimits", "Fleet-wide rate limits per queue, job type and key")


class Migration(migrations.Migration):
    dependencies = [("chokaq_core", "0010_history")]  # re-chained onto main's latest (written against 0008_edit_revision)
    operations = [
        migrations.AddField("jobshot", "rate_key", models.CharField(max_length=255, null=True)),
        table("RateLimits", "chokaq_rate_limits", [
            ("name", models.CharField(max_length=300, primary_key=True, serialize=False)),
            ("declared_count", models.IntegerField(null=True)),
            ("declared_window", models.FloatField(null=True)),
            ("declared_burst", models.IntegerField(null=True)),
            ("override_count", models.IntegerField(null=True)),
            ("override_window", models.FloatField(null=True)),
            ("override_burst", models.IntegerField(null=True)),
            ("is_lifted", models.BooleanField(db_default=False, default=False)),
            ("per_key", models.BooleanField(db_default=False, default=False)),
            ("max_keys", models.IntegerField(db_default=1000, default=1000)),
            ("updated_by", models.CharField(max_length=100, null=True)),
            ("updated_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
        ]),
        table("RateBuckets", "chokaq_rate_buckets", [
            ("pk", models.CompositePrimaryKey("limit_name", "rate_key", blank=True, editable=False,
                                              primary_key=True, serialize=False)),
            ("limit_name", models.CharField(max_length=300)),
            ("rate_key", models.CharField(db_default="", default="", max_length=255)),
            ("tokens", models.FloatField()),
            ("refilled_at", models.DateTimeField()),
            ("window_started_at", models.DateTimeField()),
            ("window_used", models.IntegerField(db_default=0, default=0)),
        ]),
        migrations.RunPython(ledger, unledger),
    ]
