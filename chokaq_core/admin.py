"""Read-only Django admin pages for the three pillars, the counters and the queue controls.

Everything here is view-only: rows change only through ChokaQ's transitions
(the Deck, the service, the worker), never through the admin's forms. Archive
and DLQ lists are paged without ``COUNT(*)`` over history when unfiltered: the
total comes from ``StatsSummary``, whose counters equal the retained rows.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from django.contrib import admin
from django.core.paginator import Paginator
from django.db.models import Sum
from django.http import HttpRequest
from django.utils.functional import cached_property

from chokaq_core.domain import FailureReason, JobStatus
from chokaq_core.models import JobsArchive, JobsDLQ, JobsHot, Queues, StatsSummary, Workers


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """View permission only: no add, change or delete, whatever the user's permissions."""

    show_full_result_count = False
    list_per_page = 50

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in self.model._meta.fields] + list(self.readonly_fields)


def _pretty_payload(payload: str | None) -> str:
    if not payload:
        return "-"
    try:
        return json.dumps(json.loads(payload), indent=2, ensure_ascii=False)
    except ValueError:
        return payload


class JobAdmin(ReadOnlyAdmin):
    """A table of job rows: found by exact id or by type; the payload is shown formatted as JSON."""

    search_fields: ClassVar[tuple[str, ...]] = ("=id", "type")
    readonly_fields = ("payload_json",)

    @admin.display(description="payload (formatted)")
    def payload_json(self, obj: JobsHot | JobsArchive | JobsDLQ) -> str:
        return _pretty_payload(obj.payload)


class CounterPaginator(Paginator):  # type: ignore[type-arg]
    """Unfiltered lists count from a StatsSummary column instead of ``COUNT(*)`` over history."""

    counter = ""

    @cached_property
    def count(self) -> int:
        query = getattr(self.object_list, "query", None)
        if query is not None and not query.where:
            total = StatsSummary.objects.aggregate(n=Sum(self.counter))["n"]
            return int(total or 0)
        return super().count


class ArchivePaginator(CounterPaginator):
    counter = "succeeded_total"


class DLQPaginator(CounterPaginator):
    counter = "failed_total"


@admin.register(JobsHot)
class JobsHotAdmin(JobAdmin):
    list_display = ("id", "queue", "type", "status_name", "priority", "attempt_count", "worker_id", "created_at",
                    "scheduled_at")
    list_filter = ("status", "queue")
    search_fields = ("id", "type", "tags")
    ordering = ("-created_at",)

    @admin.display(description="status", ordering="status")
    def status_name(self, obj: JobsHot) -> str:
        return JobStatus(obj.status).name.title()


@admin.register(JobsArchive)
class JobsArchiveAdmin(JobAdmin):
    list_display = ("id", "queue", "type", "attempt_count", "duration_ms", "finished_at", "worker_id")
    list_filter = ("queue",)
    ordering = ("-finished_at",)
    paginator = ArchivePaginator


@admin.register(JobsDLQ)
class JobsDLQAdmin(JobAdmin):
    list_display = ("id", "queue", "type", "reason_name", "attempt_count", "failed_at", "worker_id")
    list_filter = ("failure_reason", "queue")
    ordering = ("-failed_at",)
    paginator = DLQPaginator

    @admin.display(description="failure reason", ordering="failure_reason")
    def reason_name(self, obj: JobsDLQ) -> str:
        try:
            return FailureReason(obj.failure_reason).display_name
        except ValueError:
            return str(obj.failure_reason)


@admin.register(StatsSummary)
class StatsSummaryAdmin(ReadOnlyAdmin):
    list_display = ("queue", "succeeded_total", "failed_total", "retried_total", "last_activity_at")
    search_fields = ("queue",)
    ordering = ("queue",)


@admin.register(Queues)
class QueuesAdmin(ReadOnlyAdmin):
    list_display = ("name", "is_paused", "is_active", "max_workers", "zombie_timeout_seconds", "last_updated_at")
    list_filter = ("is_paused", "is_active")
    search_fields = ("name",)
    ordering = ("name",)


@admin.register(Workers)
class WorkersAdmin(ReadOnlyAdmin):
    list_display = ("worker_id", "hostname", "pid", "is_running", "capacity", "active_count", "last_heartbeat_at")
    list_filter = ("is_running", "hostname")
    search_fields = ("worker_id", "hostname")
    ordering = ("-last_heartbeat_at",)
