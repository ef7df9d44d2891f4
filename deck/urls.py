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
    path("jobs/<str:job_id>", views.inspector, name="inspector"),
    path("jobs/<str:job_id>/edit", views.editor, name="editor"),
    # commands (POST + CSRF), each named after its view, which is named after its verb (docs/architecture.md);
    # bulk routes first so "bulk" is never taken for a job id
    path("api/jobs/bulk/cancel", views.cancel_many, name="cancel-many"),
    path("api/jobs/bulk/resurrect", views.resurrect_many, name="resurrect-many"),
    path("api/jobs/bulk/cancel-matching/preview", views.preview_cancel_matching, name="preview-cancel-matching"),
    path("api/jobs/bulk/cancel-matching", views.cancel_matching, name="cancel-matching"),
    path("api/jobs/<str:job_id>/cancel", views.cancel, name="cancel"),
    path("api/jobs/<str:job_id>/resurrect", views.resurrect, name="resurrect"),
    path("api/jobs/<str:job_id>/edit", views.edit, name="edit"),
    path("api/jobs/<str:job_id>/priority", views.set_priority, name="set-priority"),
    path("api/archive/<str:job_id>/purge", views.purge_archive, name="purge-archive"),
    path("api/dlq/purge", views.purge_dlq_many, name="purge-dlq-many"),
    path("api/dlq/bulk/preview", views.preview_dlq_matching, name="preview-dlq-matching"),
    path("api/dlq/bulk/purge", views.purge_dlq_matching, name="purge-dlq-matching"),
    path("api/dlq/bulk/resurrect", views.resurrect_matching, name="resurrect-matching"),
    path("api/dlq/<str:job_id>/purge", views.purge_dlq, name="purge-dlq"),
    path("api/queues/<path:name>/pause", views.set_queue_paused, name="set-queue-paused"),
    path("api/queues/<path:name>/active", views.set_queue_active, name="set-queue-active"),
    path("api/queues/<path:name>/zombie-timeout", views.set_queue_zombie_timeout, name="set-queue-zombie-timeout"),
    path("api/queues/<path:name>/max-workers", views.set_queue_max_workers, name="set-queue-max-workers"),
    path("api/rate-limits", views.set_rate_limit, name="set-rate-limit"),
    path("api/rate-limits/<path:name>/rate", views.set_rate_limit, name="set-rate-limit"),
    path("api/rate-limits/<path:name>/pause", views.pause_rate_limit, name="pause-rate-limit"),
    path("api/rate-limits/<path:name>/lift", views.lift_rate_limit, name="lift-rate-limit"),
    path("api/workers/capacity", views.set_worker_capacity, name="set-worker-capacity"),
    path("api/circuits/close", views.close_circuit, name="close-circuit"),
    path("api/circuits/open", views.open_circuit, name="open-circuit"),
    path("api/schedules/<path:name>/enabled", views.set_schedule_enabled, name="set-schedule-enabled"),
    path("api/schedules/<path:name>/run", views.run_schedule_now, name="run-schedule-now"),
    path("api/maintenance/preview", views.preview_purge_older_than, name="preview-purge-older-than"),
    path("api/maintenance/purge-archive", views.purge_archive_older_than, name="purge-archive-older-than"),
    path("api/maintenance/purge-dlq", views.purge_dlq_older_than, name="purge-dlq-older-than"),
]

# Every Deck response carries the Deck's Content-Security-Policy and Cache-Control: no-store (deck.security).
for _pattern in urlpatterns:
    _pattern.callback = deck_response_headers(_pattern.callback)
