"""Covering indexes leave the migration state: the models list key columns only (no ``models.W040`` on SQLite).

State only. Nothing changes in any database: on PostgreSQL and SQL Server the indexes keep the ``INCLUDE``
columns migration 0001 gave them (``chokaq_core.models.COVERING_COLUMNS``); on SQLite they never had any.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("chokaq_core", "0006_job_attempts"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.RemoveIndex(model_name='jobshot', name='hot_fetch_pending'),
                migrations.AddIndex(model_name='jobshot', index=models.Index(condition=models.Q(('status', 0)), fields=['queue', '-priority', 'scheduled_at', 'created_at'], name='hot_fetch_pending')),
                migrations.RemoveIndex(model_name='jobshot', name='hot_queue_stats'),
                migrations.AddIndex(model_name='jobshot', index=models.Index(fields=['queue', 'status'], name='hot_queue_stats')),
                migrations.RemoveIndex(model_name='jobshot', name='hot_status_created'),
                migrations.AddIndex(model_name='jobshot', index=models.Index(fields=['status', '-created_at'], name='hot_status_created')),
                migrations.RemoveIndex(model_name='jobshot', name='hot_fetched_recovery'),
                migrations.AddIndex(model_name='jobshot', index=models.Index(condition=models.Q(('status', 1)), fields=['last_updated_at'], name='hot_fetched_recovery')),
                migrations.RemoveIndex(model_name='jobshot', name='hot_processing_heartbeat'),
                migrations.AddIndex(model_name='jobshot', index=models.Index(condition=models.Q(('status', 2)), fields=['heartbeat_at', 'last_updated_at'], name='hot_processing_heartbeat')),
                migrations.RemoveIndex(model_name='jobsarchive', name='archive_by_time'),
                migrations.AddIndex(model_name='jobsarchive', index=models.Index(fields=['-finished_at'], name='archive_by_time')),
                migrations.RemoveIndex(model_name='jobsdlq', name='dlq_by_time'),
                migrations.AddIndex(model_name='jobsdlq', index=models.Index(fields=['-failed_at'], name='dlq_by_time')),
                migrations.RemoveIndex(model_name='jobsdlq', name='dlq_by_reason_time'),
                migrations.AddIndex(model_name='jobsdlq', index=models.Index(fields=['failure_reason', '-failed_at'], name='dlq_by_reason_time')),
                migrations.RemoveIndex(model_name='jobsdlq', name='dlq_by_type'),
                migrations.AddIndex(model_name='jobsdlq', index=models.Index(fields=['type', '-failed_at'], name='dlq_by_type')),
                migrations.RemoveIndex(model_name='jobsdlq', name='dlq_by_created'),
                migrations.AddIndex(model_name='jobsdlq', index=models.Index(fields=['-created_at'], name='dlq_by_created')),
                migrations.RemoveIndex(model_name='metricbuckets', name='buckets_recent'),
                migrations.AddIndex(model_name='metricbuckets', index=models.Index(fields=['-bucket_start'], name='buckets_recent')),
            ],
        ),
    ]
