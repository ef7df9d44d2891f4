"""``python manage.py chokaq_cleanup``: retention cleanup of Archive, DLQ, MetricBuckets, the history roll-ups and
Workers (spec 05 §5).

Defaults come from ``CHOKAQ["RETENTION"]`` (Archive and DLQ are kept forever
unless a number of days is given). Rows go in batches of
``SQL.CLEANUP_BATCH_SIZE``, each batch its own transaction, so workers are
never blocked for long; StatsSummary counters drop with every batch; Hot is
never touched. DLQ rows are recovery evidence: decide their retention (and
whether to export payloads first) before passing ``--dlq-days``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from chokaq_core import maintenance, storage
from chokaq_core.domain import HISTORY_GRANULARITIES
from chokaq_core.models import HistoryBuckets, JobAttempts, JobsArchive, JobsDLQ, MetricBuckets, Workers

LABELS = {"archive": "Archive", "dlq": "DLQ", "metric_buckets": "MetricBuckets", "workers": "Workers",
          "attempts": "JobAttempts", "history_minutes": "History (min)", "history_hours": "History (hour)"}
BAR_WIDTH = 30


def count_older(target: str, cutoff: datetime) -> int:
    """Rows ``target``'s purge would delete (read-only ORM count; used for dry runs and the bar)."""
    using = storage.alias()
    if target == "archive":
        return JobsArchive.objects.using(using).filter(finished_at__lt=cutoff).count()
    if target == "dlq":
        return JobsDLQ.objects.using(using).filter(created_at__lte=cutoff).count()
    if target == "metric_buckets":
        return MetricBuckets.objects.using(using).filter(bucket_start__lt=cutoff).count()
    if target == "attempts":
        return JobAttempts.objects.using(using).filter(failed_at__lt=cutoff).count()
    if target.startswith("history_"):
        granularity = HISTORY_GRANULARITIES[target.removeprefix("history_").removesuffix("s")]
        return HistoryBuckets.objects.using(using).filter(granularity=granularity, bucket_start__lt=cutoff).count()
    return Workers.objects.using(using).filter(last_heartbeat_at__lt=cutoff).count()


class Command(BaseCommand):
    help = "Delete Archive/DLQ rows, metric buckets and worker rows older than the retention settings, in batches."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--archive-days", type=float, default=None, help="Archive rows finished longer ago")
        parser.add_argument("--dlq-days", type=float, default=None, help="DLQ rows created longer ago")
        parser.add_argument("--metric-buckets-hours", type=float, default=None, help="metric buckets older than")
        parser.add_argument("--worker-rows-days", type=float, default=None, help="worker rows not heartbeating for")
        parser.add_argument("--dry-run", action="store_true", help="count what would be deleted, delete nothing")
        parser.add_argument("--no-progress", action="store_true", help="no progress bar, only the summary")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            plan = maintenance.RetentionPlan.from_settings(
                archive_days=options["archive_days"], dlq_days=options["dlq_days"],
                metric_buckets_hours=options["metric_buckets_hours"], worker_rows_days=options["worker_rows_days"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        now = datetime.now(UTC)
        cutoffs = plan.cutoffs(now)
        for target, label in LABELS.items():
            if target not in cutoffs:
                self.stdout.write(f"{label}: kept (no retention set)")
        if options["dry_run"]:
            for target, cutoff in cutoffs.items():
                self.stdout.write(f"{LABELS[target]}: {count_older(target, cutoff)} rows older than "
                                  f"{cutoff.isoformat()} would be deleted (dry run)")
            return
        show = not options["no_progress"]
        totals = {t: count_older(t, c) for t, c in cutoffs.items()} if show else {}
        done: dict[str, int] = dict.fromkeys(cutoffs, 0)
        current: list[str] = []

        def progress(target: str, n: int) -> None:
            done[target] += n
            if not show:
                return
            if current and current[-1] != target:
                self.stdout.write("")
            current.append(target)
            total = max(totals.get(target, 0), done[target], 1)
            filled = int(BAR_WIDTH * done[target] / total)
            self.stdout.write(f"\r{LABELS[target]:<14} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] "
                              f"{done[target]}/{total}", ending="")
            self.stdout.flush()

        deleted = maintenance.cleanup(plan, progress, now=now)
        if current:
            self.stdout.write("")
        for target, cutoff in cutoffs.items():
            self.stdout.write(f"{LABELS[target]}: deleted {deleted.get(target, 0)} rows older than "
                              f"{cutoff.isoformat()}")
        self.stdout.write(f"Retention cleanup done: {sum(deleted.values())} rows deleted.")
