"""The ChokaQ tables (schema only).

Physical names follow spec 01 §1.1; indexes are named after the query they
serve. No code path writes these tables through the ORM: every state change is
a raw-SQL transition in ``chokaq_core.sql.<vendor>`` called by ``storage``.
The models exist for migrations, the admin and read-only ORM use in tests.

Covering indexes: on PostgreSQL and SQL Server the indexes of :data:`COVERING_COLUMNS` also carry those
non-key columns (``INCLUDE (…)``), created by migration 0001; SQLite cannot store them. The models list
the key columns only, so that ``manage.py check`` on SQLite has nothing to warn about (``models.W040``);
migration 0007 moved the migration state accordingly without touching any database.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

# index name -> its INCLUDE columns on PostgreSQL and SQL Server (see the module docstring)
COVERING_COLUMNS: dict[str, tuple[str, ...]] = {
    "hot_fetch_due": ("type",),
    "hot_fetch_scheduled": ("type",),
    "hot_queue_stats": ("priority",),
    "hot_status_created": ("queue", "type", "priority", "scheduled_at", "worker_id"),
    "hot_fetched_recovery": ("queue", "worker_id"),
    "hot_processing_heartbeat": ("queue", "type", "worker_id"),
    "archive_by_time": ("queue", "type", "duration_ms"),
    "dlq_by_time": ("queue", "type", "failure_reason", "attempt_count"),
    "dlq_by_reason_time": ("queue", "type"),
    "dlq_by_type": ("queue", "failure_reason", "created_at"),
    "dlq_by_created": ("queue", "type", "failure_reason", "failed_at"),
}


# The Pending rows with a schedule: the only ones that can wait (a row without scheduled_at is due), so the
# indexes of waiting rows hold them alone and a job enqueued to run now enters two Hot indexes fewer.
SCHEDULED_PENDING = Q(status=0, scheduled_at__isnull=False)
# The Pending rows without a schedule: all due, so an index of them alone is the claim's exact ordered range.
DUE_PENDING = Q(status=0, scheduled_at__isnull=True)


class JobIdField(models.CharField):
    """A job id: ``varchar`` on every vendor, without the ``varchar_pattern_ops`` twin index Django gives a varchar
    primary key on PostgreSQL. Ids are matched by equality, by range (keyset pages) and by the search's
    ``LIKE '%…%'``, which no btree serves: the twin only cost one more index entry per row version written.
    Spelling the type ``character varying`` (the same type) is what keeps Django from creating it."""

    def db_type(self, connection: Any) -> str | None:
        if connection.vendor == "postgresql":
            return f"character varying({self.max_length})"
        return super().db_type(connection)


class JobModel(models.Model):
    """The columns every job table starts with: the job's identity, queue, type, payload and tags."""

    id = JobIdField(max_length=50, primary_key=True)
    queue = models.CharField(max_length=255)
    type = models.CharField(max_length=255)
    payload = models.TextField(null=True)
    tags = models.CharField(max_length=1000, null=True)

    class Meta:
        abstract = True


class JobsHot(JobModel):
    """Active work only: Pending (0), Fetched (1), Processing (2)."""

    idempotency_key = models.CharField(max_length=255, null=True)
    priority = models.IntegerField(default=10, db_default=10)
    status = models.IntegerField(default=0, db_default=0)
    attempt_count = models.IntegerField(default=0, db_default=0)
    worker_id = models.CharField(max_length=100, null=True)
    heartbeat_at = models.DateTimeField(null=True)
    scheduled_at = models.DateTimeField(null=True)
    created_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True)
    last_updated_at = models.DateTimeField(db_default=Now())
    created_by = models.CharField(max_length=100, null=True)
    last_modified_by = models.CharField(max_length=100, null=True)
    # Django addition: an operator's request to cancel a Processing job. The
    # owning worker reads it on its supervisor loop (no channel layer needed).
    cancel_requested_by = models.CharField(max_length=100, null=True)
    # The edit version: +1 on every operator edit and on every move between Hot and the DLQ (the row
    # carries it), so an edit made against an older state is refused instead of overwriting a newer one.
    revision = models.IntegerField(default=0, db_default=0)
    # The partition of a per-key rate limit the job counts against (``.using(rate_key=…)`` or the @job's
    # rate_key function); NULL: the limit's shared allowance.
    rate_key = models.CharField(max_length=255, null=True)
    # The latest failed execution of a job waiting for its retry (class path, message, time), and the job type
    # whose open circuit deferred it: the Deck shows why a Pending job waits and when it runs next.
    last_error_class = models.CharField(max_length=255, null=True)
    last_error_message = models.CharField(max_length=1000, null=True)
    last_error_at = models.DateTimeField(null=True)
    held_by = models.CharField(max_length=255, null=True)

    class Meta:
        db_table = "chokaq_jobs_hot"
        constraints = [
            models.CheckConstraint(condition=Q(status__in=[0, 1, 2]), name="hot_status_0_1_2"),
            models.UniqueConstraint(
                fields=["idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="hot_idempotency",
            ),
        ]
        indexes = [
            # the claim's due rows without a schedule, in the exact claim order (every row of it is due; the id
            # orders rows of one time, so a claim over many queues stops in each at the last row it needs)
            models.Index(fields=["queue", "-priority", "created_at", "id"], condition=DUE_PENDING,
                         name="hot_fetch_due"),
            # the claim's scheduled rows in claim order: the first due ones of a large due backlog without a sort
            models.Index(fields=["queue", "-priority", "scheduled_at", "id"], condition=SCHEDULED_PENDING,
                         name="hot_fetch_scheduled"),
            models.Index(fields=["queue", "status"], name="hot_queue_stats"),
            # scheduled Pending rows only (delayed, retrying, held): a row due at once enters neither this index
            # nor hot_pending_split, only the claim's (SCHEDULED_PENDING)
            models.Index(fields=["queue", "scheduled_at", "created_at"], condition=SCHEDULED_PENDING,
                         name="hot_pending_lag"),
            models.Index(
                fields=["status", "-created_at"],
                name="hot_status_created",
            ),
            models.Index(
                fields=["last_updated_at"],
                condition=Q(status=1),
                name="hot_fetched_recovery",
            ),
            models.Index(
                fields=["heartbeat_at", "last_updated_at"],
                condition=Q(status=2),
                name="hot_processing_heartbeat",
            ),
            # a worker's cancel requests: an entry only while an operator's request waits (not one per lease)
            models.Index(fields=["worker_id"], condition=Q(status=2, cancel_requested_by__isnull=False),
                         name="hot_cancel_requests"),
            # status leads so SQLite sees the Pending split's count as covered (its WHERE names status)
            models.Index(fields=["status", "scheduled_at", "last_error_at", "held_by"], condition=SCHEDULED_PENDING,
                         name="hot_pending_split"),
        ]


class JobsArchive(JobModel):
    """Succeeded jobs, write-once."""

    attempt_count = models.IntegerField(default=1, db_default=1)
    worker_id = models.CharField(max_length=100, null=True)
    created_by = models.CharField(max_length=100, null=True)
    last_modified_by = models.CharField(max_length=100, null=True)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField()
    duration_ms = models.FloatField(null=True)
    # Django addition (django.tasks results): the handler's return value as JSON text, read by the
    # django.tasks backend's get_result(). NULL when the handler returned None.
    result = models.TextField(null=True)

    class Meta:
        db_table = "chokaq_jobs_archive"
        indexes = [
            models.Index(fields=["-finished_at"], name="archive_by_time"),
            models.Index(fields=["tags"], condition=Q(tags__isnull=False), name="archive_tags"),
            models.Index(fields=["queue", "-finished_at"], name="archive_by_queue"),
        ]


class JobsDLQ(JobModel):
    """Terminal failures, cancellations and zombies."""

    failure_reason = models.IntegerField()
    error_details = models.TextField(null=True)
    attempt_count = models.IntegerField()
    worker_id = models.CharField(max_length=100, null=True)
    created_by = models.CharField(max_length=100, null=True)
    last_modified_by = models.CharField(max_length=100, null=True)
    created_at = models.DateTimeField()
    failed_at = models.DateTimeField()
    # Django addition (edit audit): the payload before the last operator edit, so
    # the inspector can show what changed.
    previous_payload = models.TextField(null=True)
    revision = models.IntegerField(default=0, db_default=0)  # the edit version, as JobsHot.revision
    # The failure's exception apart from its traceback (``error_details``): NULL when no exception caused it
    # (cancel, zombie) and in rows stored before these columns (the Deck shows the details' last line).
    error_class = models.CharField(max_length=255, null=True)
    error_message = models.CharField(max_length=1000, null=True)
    rate_key = models.CharField(max_length=255, null=True)  # as JobsHot.rate_key: a resurrected job keeps it

    class Meta:
        db_table = "chokaq_jobs_dlq"
        indexes = [
            models.Index(
                fields=["-failed_at"], name="dlq_by_time"
            ),
            models.Index(fields=["tags"], condition=Q(tags__isnull=False), name="dlq_tags"),
            models.Index(fields=["queue", "-failed_at"], name="dlq_by_queue"),
            models.Index(fields=["failure_reason", "-failed_at"], name="dlq_by_reason_time"),
            models.Index(
                fields=["type", "-failed_at"], name="dlq_by_type"
            ),
            models.Index(
                fields=["-created_at"], name="dlq_by_created"
            ),
            models.Index(fields=["failure_reason", "error_class", "-failed_at"], name="dlq_by_error"),
        ]


class StatsSummary(models.Model):
    """Per-queue retained counters (spec 01 §2.4): O(1) totals for the Deck."""

    queue = models.CharField(max_length=255, primary_key=True)
    succeeded_total = models.BigIntegerField(default=0, db_default=0)
    failed_total = models.BigIntegerField(default=0, db_default=0)
    retried_total = models.BigIntegerField(default=0, db_default=0)
    last_activity_at = models.DateTimeField(null=True)
    # Archive rows deleted by purges (by age, by id, memory-mode eviction): succeeded_total never shrinks,
    # so the rows still retained are succeeded_total - purged_total.
    purged_total = models.BigIntegerField(default=0, db_default=0)

    class Meta:
        db_table = "chokaq_stats_summary"


class MetricBuckets(models.Model):
    """Per-second outcome aggregates, written in the same transaction as the move."""

    pk = models.CompositePrimaryKey("bucket_start", "queue", "outcome", "failure_reason")
    bucket_start = models.DateTimeField()
    queue = models.CharField(max_length=255)
    outcome = models.SmallIntegerField()
    failure_reason = models.IntegerField()
    completed_count = models.BigIntegerField(default=0, db_default=0)
    duration_count = models.BigIntegerField(default=0, db_default=0)
    total_duration_ms = models.FloatField(default=0, db_default=0)
    max_duration_ms = models.FloatField(null=True)
    last_updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "chokaq_metric_buckets"
        constraints = [
            models.CheckConstraint(condition=Q(outcome__in=[0, 1]), name="buckets_outcome_0_1"),
            models.CheckConstraint(
                condition=Q(completed_count__gte=0, duration_count__gte=0, total_duration_ms__gte=0),
                name="buckets_non_negative",
            ),
        ]
        indexes = [
            # the key only (migration 0019): a completion's update of its bucket changes no indexed column (HOT)
            models.Index(
                fields=["-bucket_start"],
                name="buckets_recent",
            ),
        ]


HISTORY_BINS = 20  # duration histogram bins per history bucket (domain.DURATION_BIN_EDGES_MS)


class HistoryBuckets(models.Model):
    """Minute and hour roll-ups of outcomes per (queue, type), with a log-scale duration histogram.

    Written in the same transaction as the moves they count; the Deck's 1 h / 24 h / 7 d views read them
    (never Archive). ``granularity`` is the bucket width in seconds (60 or 3600); ``b00`` … ``b19`` count
    the successes whose duration fell in each bin of ``domain.DURATION_BIN_EDGES_MS``.
    """

    pk = models.CompositePrimaryKey("granularity", "bucket_start", "queue", "type", "outcome")
    granularity = models.IntegerField()
    bucket_start = models.DateTimeField()
    queue = models.CharField(max_length=255)
    type = models.CharField(max_length=255)
    outcome = models.SmallIntegerField()
    completed_count = models.BigIntegerField(default=0, db_default=0)
    duration_count = models.BigIntegerField(default=0, db_default=0)
    total_duration_ms = models.FloatField(default=0, db_default=0)
    max_duration_ms = models.FloatField(null=True)
    b00 = models.BigIntegerField(default=0, db_default=0)
    b01 = models.BigIntegerField(default=0, db_default=0)
    b02 = models.BigIntegerField(default=0, db_default=0)
    b03 = models.BigIntegerField(default=0, db_default=0)
    b04 = models.BigIntegerField(default=0, db_default=0)
    b05 = models.BigIntegerField(default=0, db_default=0)
    b06 = models.BigIntegerField(default=0, db_default=0)
    b07 = models.BigIntegerField(default=0, db_default=0)
    b08 = models.BigIntegerField(default=0, db_default=0)
    b09 = models.BigIntegerField(default=0, db_default=0)
    b10 = models.BigIntegerField(default=0, db_default=0)
    b11 = models.BigIntegerField(default=0, db_default=0)
    b12 = models.BigIntegerField(default=0, db_default=0)
    b13 = models.BigIntegerField(default=0, db_default=0)
    b14 = models.BigIntegerField(default=0, db_default=0)
    b15 = models.BigIntegerField(default=0, db_default=0)
    b16 = models.BigIntegerField(default=0, db_default=0)
    b17 = models.BigIntegerField(default=0, db_default=0)
    b18 = models.BigIntegerField(default=0, db_default=0)
    b19 = models.BigIntegerField(default=0, db_default=0)

    class Meta:
        db_table = "chokaq_history_buckets"
        constraints = [
            models.CheckConstraint(condition=Q(outcome__in=[0, 1]), name="history_outcome_0_1"),
            models.CheckConstraint(condition=Q(granularity__in=[60, 3600]), name="history_granularity"),
        ]


class Queues(models.Model):
    """Per-queue controls (spec 01 §2.6)."""

    name = models.CharField(max_length=255, primary_key=True)
    is_paused = models.BooleanField(default=False, db_default=False)
    is_active = models.BooleanField(default=True, db_default=True)
    zombie_timeout_seconds = models.IntegerField(null=True)
    max_workers = models.IntegerField(null=True)
    last_updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "chokaq_queues"


class Workers(models.Model):
    """Worker registry (spec 01 §2.8, Django addition)."""

    worker_id = models.CharField(max_length=100, primary_key=True)
    hostname = models.CharField(max_length=255)
    pid = models.IntegerField()
    queues = models.CharField(max_length=1000, default="", db_default="")
    started_at = models.DateTimeField()
    last_heartbeat_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True)
    is_running = models.BooleanField(default=True, db_default=True)
    capacity = models.IntegerField()
    active_count = models.IntegerField(default=0, db_default=0)
    runtime_json = models.TextField(default="{}", db_default="{}")
    circuits_json = models.TextField(default="[]", db_default="[]")

    class Meta:
        db_table = "chokaq_workers"


class SchemaMigrations(models.Model):
    """ChokaQ's own schema ledger (spec 01 §2.7), kept beside django_migrations."""

    version = models.IntegerField(primary_key=True)
    name = models.CharField(max_length=200)
    description = models.CharField(max_length=1000, null=True)
    applied_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "chokaq_schema_migrations"


class Schedules(models.Model):
    """Recurring jobs: the latest tick claimed per ``CHOKAQ["SCHEDULE"]`` name.

    Workers move ``last_tick_at`` forward with a guarded update in the same
    transaction as the tick's enqueue, so each tick becomes exactly one job
    across the fleet.
    """

    name = models.CharField(max_length=200, primary_key=True)
    last_tick_at = models.DateTimeField()
    updated_at = models.DateTimeField(db_default=Now())
    # The operator's switch (the Deck's Recurring panel): NULL follows the entry's ENABLED setting.
    enabled = models.BooleanField(null=True)
    # The latest job this schedule enqueued (a claimed tick or an operator's "run now") and when.
    last_job_id = models.CharField(max_length=50, null=True)
    last_run_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "chokaq_schedules"


class JobAttempts(models.Model):
    """The attempts history: one row per failed execution of a job — what it raised, when, on which worker.

    Rows are keyed by job id, so they stay valid while the job moves Hot → Archive / DLQ → Hot; they are
    written in the same transaction as the retry or DLQ move of that execution and deleted by retention.
    """

    id = models.BigAutoField(primary_key=True)
    job_id = models.CharField(max_length=50)
    attempt = models.IntegerField()
    worker_id = models.CharField(max_length=100, null=True)
    error_class = models.CharField(max_length=255)
    error_message = models.TextField()
    traceback = models.TextField()
    started_at = models.DateTimeField(null=True)
    failed_at = models.DateTimeField()

    class Meta:
        db_table = "chokaq_job_attempts"
        indexes = [
            models.Index(fields=["job_id", "id"], name="attempts_by_job"),
            models.Index(fields=["failed_at"], name="attempts_by_time"),
        ]


class RateLimits(models.Model):
    """Fleet-wide rate limits, one row per ``queue:<name>`` / ``type:<key>``: the declared rate (settings and
    ``@job``, written by each worker at start) and an operator's override (a rate, 0 = paused, or lifted).
    A lease locks the rows of the limits in force, so the buckets below change one lease at a time."""

    name = models.CharField(max_length=300, primary_key=True)
    declared_count = models.IntegerField(null=True)
    declared_window = models.FloatField(null=True)
    declared_burst = models.IntegerField(null=True)
    override_count = models.IntegerField(null=True)
    override_window = models.FloatField(null=True)
    override_burst = models.IntegerField(null=True)
    is_lifted = models.BooleanField(default=False, db_default=False)
    per_key = models.BooleanField(default=False, db_default=False)
    max_keys = models.IntegerField(default=1000, db_default=1000)
    updated_by = models.CharField(max_length=100, null=True)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "chokaq_rate_limits"


class RateBuckets(models.Model):
    """The token bucket of one limit and key ('' for a limit's shared allowance), updated in the lease's
    transaction; ``window_used`` counts the starts since ``window_started_at`` (what the Deck shows)."""

    pk = models.CompositePrimaryKey("limit_name", "rate_key")
    limit_name = models.CharField(max_length=300)
    rate_key = models.CharField(max_length=255, default="", db_default="")
    tokens = models.FloatField()
    refilled_at = models.DateTimeField()
    window_started_at = models.DateTimeField()
    window_used = models.IntegerField(default=0, db_default=0)

    class Meta:
        db_table = "chokaq_rate_buckets"
