"""The attempts history: one row per failed execution (error class, message, traceback, time, worker)."""

from django.db import migrations, models

from chokaq_core.ledger import ledger_steps, table

ledger, unledger = ledger_steps(6, "JobAttempts", "Attempts history (every failed execution's error)")


class Migration(migrations.Migration):
    dependencies = [("chokaq_core", "0005_schedules")]
    operations = [
        table("JobAttempts", "chokaq_job_attempts", [
            ("id", models.BigAutoField(primary_key=True, serialize=False)),
            ("job_id", models.CharField(max_length=50)),
            ("attempt", models.IntegerField()),
            ("worker_id", models.CharField(max_length=100, null=True)),
            ("error_class", models.CharField(max_length=255)),
            ("error_message", models.TextField()),
            ("traceback", models.TextField()),
            ("started_at", models.DateTimeField(null=True)),
            ("failed_at", models.DateTimeField()),
        ], indexes=[
            models.Index(fields=["job_id", "id"], name="attempts_by_job"),
            models.Index(fields=["failed_at"], name="attempts_by_time"),
        ]),
        migrations.RunPython(ledger, unledger),
    ]
