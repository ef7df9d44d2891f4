"""The Deck's URLs: a project mounts them with ONE include, ``path("deck/", include("deck.urls"))``, at
``CHOKAQ_DECK["ROUTE_PREFIX"]`` (default ``/deck``; system check chokaq.E012 compares the two). It serves the
page, its API, login/logout, ``health/`` and ``metrics``; the websocket is at ``/ws/<ROUTE_PREFIX>/``
(``deck.routing``, served through ``deck.asgi.with_deck``)."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

from deck import conf, probes, views
from deck.security import ThrottledLoginView, deck_response_headers


def route_prefix() -> str:
    """``CHOKAQ_DECK["ROUTE_PREFIX"]`` (default ``/deck``) without its slashes, e.g. ``deck`` or ``ops/jobs``.
    Its form is checked when the app loads (``deck.permissions.check_policy``, system check chokaq.E004)."""
    return str(conf.setting("ROUTE_PREFIX")).strip("/")


app_name = "deck"

urlpatterns = [
    path("", views.index, name="index"),
    # next_page: after a login without ?next= the Deck opens, whatever the site's LOGIN_REDIRECT_URL says
    path("login/", ThrottledLoginView.as_view(next_page="deck:index"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="deck:login"), name="logout"),
    path("health/", probes.health, name="health"),
    path("metrics", probes.metrics, name="metrics"),
    path("partials/<slug:panel>", views.partial, name="partial"),
    path("jobs/<str:job_id>", views.inspector, name="job"),
    path("jobs/<str:job_id>/edit", views.editor, name="job-edit"),
    # commands (POST + CSRF); bulk routes first so "bulk" is never taken for a job id
    path("api/jobs/bulk/cancel", views.bulk_cancel, name="bulk-cancel"),
    path("api/jobs/bulk/resurrect", views.bulk_resurrect, name="bulk-resurrect"),
    path("api/jobs/<str:job_id>/cancel", views.cancel_job, name="job-cancel"),
    path("api/jobs/<str:job_id>/restart", views.restart_job, name="job-restart"),
    path("api/jobs/<str:job_id>/resurrect", views.resurrect_job, name="job-resurrect"),
    path("api/jobs/<str:job_id>/repair-requeue", views.repair_requeue, name="job-repair-requeue"),
    path("api/jobs/<str:job_id>/edit", views.edit_job, name="job-save"),
    path("api/jobs/<str:job_id>/priority", views.set_priority, name="job-priority"),
    path("api/archive/<str:job_id>/purge", views.purge_archive_job, name="archive-purge-job"),
    path("api/dlq/purge", views.purge_dlq_ids, name="dlq-purge"),
    path("api/dlq/bulk/preview", views.dlq_bulk_preview, name="dlq-bulk-preview"),
    path("api/dlq/bulk/purge", views.dlq_bulk_purge, name="dlq-bulk-purge"),
    path("api/dlq/bulk/requeue", views.dlq_bulk_requeue, name="dlq-bulk-requeue"),
    path("api/dlq/<str:job_id>/purge", views.purge_dlq_job, name="dlq-purge-job"),
    path("api/queues/<path:name>/pause", views.queue_pause, name="queue-pause"),
    path("api/queues/<path:name>/active", views.queue_active, name="queue-active"),
    path("api/queues/<path:name>/zombie-timeout", views.queue_zombie_timeout, name="queue-zombie-timeout"),
    path("api/queues/<path:name>/max-workers", views.queue_max_workers, name="queue-max-workers"),
    path("api/workers/capacity", views.worker_capacity, name="worker-capacity"),
    path("api/maintenance/preview", views.maintenance_preview, name="maintenance-preview"),
    path("api/maintenance/purge-archive", views.purge_archive_older, name="purge-archive"),
    path("api/maintenance/purge-dlq", views.purge_dlq_older, name="purge-dlq"),
]

# Every Deck response carries the Deck's Content-Security-Policy and Cache-Control: no-store (deck.security).
for _pattern in urlpatterns:
    _pattern.callback = deck_response_headers(_pattern.callback)
