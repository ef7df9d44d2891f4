"""The Deck's HTTP side: one full page, htmx partials, POST commands (spec 04 §1, §4).

* ``GET`` endpoints render the full page, or only their partial for an htmx
  request (``HX-Request``), so every URL can be reloaded or bookmarked.
* ``POST`` commands validate with ``deck.forms``, call ``chokaq_core.service``,
  record the operator action and answer ``{"ok": true, "affected": n}`` (or,
  for htmx, 204 / a fragment with an ``HX-Trigger`` toast). Bad input is a
  400, a job that moved meanwhile a 409, a missing role a 403 — never a 500.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import wraps
from typing import Any

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from chokaq_core import events, service
from chokaq_core.domain import JobStatus, RateLimitState
from chokaq_core.readmodel import HISTORY_SORTS, SORT_KEYS, BulkPreview
from deck import forms, fragments, runs
from deck.models import BULK_MEMBER_SCOPE, OperatorAction, console_actions
from deck.permissions import Role, actor, refuse, require, role_of

logger = logging.getLogger("chokaq.deck")

PAGE = "deck/index.html"
PANEL_TEMPLATES = {
    "stats": "deck/panels.html#stats",
    "queues": "deck/panels.html#queues",
    "chart": "deck/panels.html#chart",
    "top-errors": "deck/panels.html#top-errors",
    "console": "deck/panels.html#console",
    "maintenance": "deck/panels.html#maintenance",
    "workers": "deck/panels.html#workers",
    "breakers": "deck/panels.html#breakers",
    "rate-limits": "deck/panels.html#rate-limits",
    "recurring": "deck/panels.html#recurring",
    "jobs": "deck/jobs.html#matrix",
}
CONSOLE_LINES = 30


def _htmx(request: HttpRequest) -> bool:
    return request.headers.get("HX-Request") == "true"


def _role(request: HttpRequest) -> Role:
    return getattr(request, "deck_role", None) or role_of(request.user)


# ---------------------------------------------------------------- page and partials


def console_entries(limit: int = CONSOLE_LINES) -> list[dict[str, Any]]:
    entries = list(console_actions()[:limit])
    return [{"id": e.id, "at": e.at, "level": e.level, "message": f"{e.actor}: {e.message}"} for e in reversed(entries)]


def _matrix(query: QueryDict) -> dict[str, Any]:
    form = forms.jobs_query(query)
    view = form.pillar
    d = form.cleaned_data
    base = query.copy()
    for key in ("after", "before"):
        base.pop(key, None)
    ctx: dict[str, Any] = {
        "view": view, "q": d, "query": base.urlencode(), "full_query": query.urlencode(),
        "sort_options": [(k, forms.SORT_LABELS[k]) for k in ("date", "duration", "type", "queue", "attempts")
                         if k in HISTORY_SORTS.get(view, SORT_KEYS)],
        "reasons": forms.REASONS, "page_sizes": forms.PAGE_SIZES[1:], "tokens": forms.TOKENS,
    }
    if view == "active":
        ctx["rows"] = service.active_jobs(form.active_filters())
        ctx["status_filter"] = "" if d.get("status") is None else str(d["status"])
        return ctx
    preview = not d.get("size") and not d.get("after") and not d.get("before")
    size = d.get("size") or (10 if preview else 100)
    page = service.history(view, form.filters(view), form.sort_spec(), after=d.get("after") or None,
                           before=d.get("before") or None, size=size)

    def link(token: str | None, direction: str) -> str | None:
        if token is None:
            return None
        params = base.copy()
        params["size"] = str(size)
        params[direction] = token
        return params.urlencode()

    ctx.update(rows=page.rows, page=page, preview=preview, size=size,
               next_query=link(page.next_token, "after"), prev_query=link(page.prev_token, "before"))
    return ctx


def _panels(panel: str | None = None, query: QueryDict | None = None) -> dict[str, Any]:
    """The data of one panel (or of every panel when ``panel`` is None), each read once; ``query``: the address's
    parameters (the chart's ``range``)."""
    ctx: dict[str, Any] = {}
    if panel in (None, "stats", "chart"):
        tp = service.throughput()
        ctx.update(fragments.chart_context(tp))
    if panel in (None, "chart"):
        chart_range = service.check_chart_range((query or QueryDict()).get("range"))
        ctx.update(chart_range=chart_range, chart_ranges=service.CHART_RANGES)
        if chart_range != "5m":
            ctx.update(fragments.history_context(service.history_buckets(chart_range)))
    if panel in (None, "recurring"):
        ctx["recurring"] = service.recurring()
    if panel in (None, "stats"):
        ctx["summary"] = service.summary()
    if panel in (None, "queues"):
        ctx["queues"] = service.queue_overview()
    if panel in (None, "queues", "rate-limits"):  # one read serves the rate-limits panel and the rate cells
        ctx["rate_limits"] = service.rate_limits()
    if panel in (None, "top-errors"):
        ctx.update(errors=service.top_errors(), errors_at=fragments.now())
    if panel in (None, "console"):
        ctx["console_entries"] = console_entries()
    if panel in (None, "maintenance", "workers", "breakers"):  # one read of the worker registry serves all three
        view = service.fleet_view()
        if panel in (None, "maintenance"):
            ctx["fleet"] = view.totals
        if panel in (None, "workers", "breakers"):
            ctx["fleet_view"] = view
    return ctx


PLACES = {"hot": "ACTIVE", "archive": "ARCHIVE", "dlq": "MORGUE"}  # a pillar → its label in the inspector


def _inspector(job_id: str, request: HttpRequest | None = None) -> dict[str, Any]:
    """The inspector's data. A live re-fetch of an open inspector (``deck.js`` follows its job: header
    ``X-Deck-Follow`` = the job id, ``X-Deck-Was`` = the pillar it showed) also says where the job came from,
    and that a job it showed and that is now in no pillar was purged."""
    job_id = forms.job_id(job_id)
    jv = service.find_job(job_id)
    history = list(OperatorAction.objects.filter(job_id=job_id)[:20]) if jv else []
    where = jv.pillar if jv else "gone"
    followed = request is not None and request.headers.get("X-Deck-Follow") == job_id
    was = request.headers.get("X-Deck-Was") if followed and request is not None else None
    moved_from = PLACES.get(was or "") if was != where else None
    purged = followed and jv is None and was in PLACES
    held = service.rate_hold(jv.hot) if jv is not None and jv.hot is not None else None
    return {"job_id": job_id, "jv": jv, "history": history, "rate_held": held, "where": where, "place": PLACES.get(where),
            "moved_from": moved_from, "purged": purged, "last_pillar": was if purged else where if jv else ""}


def _page_context(request: HttpRequest, **extra: Any) -> dict[str, Any]:
    return {**_panels(query=request.GET), **_matrix(request.GET), **fragments.role_context(_role(request)), **extra}


def _render(request: HttpRequest, template: str, context: dict[str, Any], status: int = 200) -> HttpResponse:
    return render(request, template, context, status=status)


def _bad(request: HttpRequest, exc: Exception) -> HttpResponse:
    if isinstance(exc, service.StaleEdit):  # the job as it is now, for the editor to show
        return JsonResponse({"ok": False, "error": str(exc), "current": exc.current}, status=409)
    status = 409 if isinstance(exc, service.ConflictError) else 404 if isinstance(exc, service.NotFoundError) else 400
    return refuse(request, status, str(exc))


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """A project's ``handler400``: under the Deck's prefix a refusal is the JSON the Deck's script turns into a
    toast (e.g. a form body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``, refused before any view runs), never an HTML
    error page; elsewhere Django's own 400 page."""
    from django.core.exceptions import RequestDataTooBig
    from django.views.defaults import bad_request as django_bad_request

    if not request.path.startswith(reverse("deck:index")):
        return django_bad_request(request, exception)
    if isinstance(exception, RequestDataTooBig):
        return refuse(request, 400, "The request is too large for a form post; the editor sends JSON (reload the "
                                    "page if it is older than this Deck).")
    return refuse(request, 400, "Bad request.")


def _page_url(query: QueryDict) -> str:
    """The page's own address for a matrix query (``/deck/?view=dlq&reason=…``): what the address bar shows."""
    encoded = query.urlencode()
    return reverse("deck:index") + (f"?{encoded}" if encoded else "")


def _page_with_message(request: HttpRequest, message: str, status: int, **extra: Any) -> HttpResponse:
    """The full page in its default state with ``message`` shown above the panels (a bad address, an unknown
    job): a page an operator can read and leave, never a raw JSON body."""
    context = {**_panels(), **_matrix(QueryDict()), **fragments.role_context(_role(request)),
               "page_error": message, **extra}
    return _render(request, PAGE, context, status=status)


@require_GET
@require(Role.VIEWER)
def index(request: HttpRequest) -> HttpResponse:
    try:
        context = _page_context(request)
    except (forms.InvalidInput, service.ServiceError) as exc:
        return _page_with_message(request, f"This address has a parameter the Deck cannot use: {exc}", 400)
    if request.GET.get("job"):  # the old ?job= form of a job's address
        try:
            return redirect("deck:inspector", forms.job_id(request.GET["job"]))
        except forms.InvalidInput as exc:
            return _page_with_message(request, str(exc), 400)
    return _render(request, PAGE, context)


@require_GET
@require(Role.VIEWER)
def partial(request: HttpRequest, panel: str) -> HttpResponse:
    if panel not in PANEL_TEMPLATES:
        return refuse(request, 404, f"unknown panel {panel!r}")
    if not _htmx(request):  # a partial's address opened as a page: the page's own address for that state
        return redirect(_page_url(request.GET))
    try:
        context: dict[str, Any] = {**fragments.role_context(_role(request))}
        context.update(_matrix(request.GET) if panel == "jobs" else _panels(panel, request.GET))
    except (forms.InvalidInput, service.ServiceError) as exc:
        return _bad(request, exc)
    response = _render(request, PANEL_TEMPLATES[panel], context)
    if panel == "jobs" and request.headers.get("HX-Trigger") == "jobs-filter":
        response["HX-Push-Url"] = _page_url(request.GET)  # the filter form: the page's address, not the partial's
    return response


def _job_not_found(job_id: str) -> str:
    return (f"Job {job_id} was not found: it is in none of Active, Archive or the DLQ (it may have been purged, "
            f"or the id is mistyped).")


@require_GET
@require(Role.VIEWER)
def inspector(request: HttpRequest, job_id: str) -> HttpResponse:
    try:
        context = _inspector(job_id, request)
    except (forms.InvalidInput, service.ServiceError) as exc:
        if _htmx(request):
            return _bad(request, exc)
        return _page_with_message(request, str(exc), 404 if isinstance(exc, service.NotFoundError) else 400)
    status = 200 if context["jv"] else 404
    if not _htmx(request):
        if status == 404:
            return _page_with_message(request, _job_not_found(context["job_id"]), 404, side="inspector", **context)
        return _render(request, PAGE, _page_context(request, side="inspector", **context))
    # an htmx refresh of an open inspector whose job is gone still swaps (the panel says so)
    return _render(request, "deck/inspector.html#inspector", {**context, **fragments.role_context(_role(request))},
                   status=status)


@require_GET
@require(Role.OPERATOR)
def editor(request: HttpRequest, job_id: str) -> HttpResponse:
    try:
        context = _inspector(job_id)
        jv = context["jv"]
        if jv is None or (jv.hot is not None and jv.hot.status != JobStatus.PENDING) or jv.archived is not None:
            return refuse(request, 409, "Only Pending jobs and DLQ jobs can be edited.")
        context["priority_default"] = jv.hot.priority if jv.hot else 10
        context["max_payload_bytes"] = service.max_payload_bytes()
        if not _htmx(request):
            return _render(request, PAGE, _page_context(request, side="editor", **context))
    except (forms.InvalidInput, service.ServiceError) as exc:
        return _bad(request, exc)
    return _render(request, "deck/inspector.html#editor", {**context, **fragments.role_context(_role(request))})


# ---------------------------------------------------------------- commands

# Log event ids of an operator command (spec 05 §3): the ``chokaq.deck`` line names the command's verb.
COMMAND_REJECTED, COMMAND_COMPLETED = 6000, 6001


@dataclass
class Done:
    """What a command did: the operator-facing message, the affected count and the audit details."""

    message: str
    affected: int = 1
    level: str = "success"
    job_id: str | None = None
    scope: str = ""
    previous_payload: str | None = None
    new_payload: str | None = None
    body: Callable[[], str] | None = None  # renders the htmx fragment to return instead of 204 (after the audit)
    job_ids: list[str] = field(default_factory=list)  # every job a bulk command affected: each gets an entry
    extra: dict[str, Any] = field(default_factory=dict)
    run: runs.Run | None = None  # a bulk run to carry out in the background once its audit entry exists


def command(minimum: Role) -> Callable[[Callable[..., Done]], Callable[..., HttpResponse]]:
    def decorate(run: Callable[..., Done]) -> Callable[..., HttpResponse]:
        @require_POST
        @require(minimum)
        @wraps(run)
        def view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            name = run.__name__
            try:
                done = run(request, *args, **kwargs)
            except (forms.InvalidInput, service.ServiceError) as exc:
                if isinstance(exc, service.ConflictError):
                    _audit(request, name, Done(str(exc), 0, "warning", scope=_scope(args, kwargs)),
                           COMMAND_REJECTED)
                else:
                    logger.info("%s by %s refused: %s", name, actor(request.user), exc,
                                extra={"event_id": COMMAND_REJECTED})
                return _bad(request, exc)
            entry_id = _audit(request, name, done, COMMAND_COMPLETED)
            if done.run is not None:  # its thread starts once the audit entry is committed
                bulk = done.run
                transaction.on_commit(lambda: runs.start(bulk, entry_id), using=OperatorAction.objects.db)
                done.extra["runId"] = entry_id
            if _htmx(request):
                response = HttpResponse(done.body() if done.body else "", status=200 if done.body else 204)
                response["HX-Trigger"] = json.dumps({"deck:toast": {"level": done.level, "message": done.message},
                                                     "deck:changed": True})
                return response
            return JsonResponse({"ok": True, "affected": done.affected, "message": done.message, **done.extra})

        return view

    return decorate


def _scope(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    return " ".join(str(v) for v in (*args, *kwargs.values()))[:1000]


def _audit(request: HttpRequest, name: str, done: Done, event_id: int) -> int:
    return record(actor(request.user), name, done, event_id)


def record(who: str, name: str, done: Done, event_id: int) -> int:
    """One audit entry per command, plus one per job a bulk command affected (so each job's history shows it;
    those member entries stay out of the console); one ``chokaq.deck`` log line with the command's event id.
    Returns the entry's id."""
    log = logger.warning if "purge" in name else logger.info
    log("%s by %s%s: %s", name, who, " refused" if event_id == COMMAND_REJECTED else "", done.message,
        extra={"event_id": event_id})
    entry = OperatorAction.objects.create(
        actor=who, command=name, scope=done.scope[:1000], job_id=done.job_id, level=done.level,
        message=done.message, previous_payload=done.previous_payload, new_payload=done.new_payload,
    )
    if done.job_ids:
        OperatorAction.objects.bulk_create(
            [OperatorAction(actor=who, command=name, scope=f"{BULK_MEMBER_SCOPE}{entry.id}", job_id=job_id,
                            level=done.level, message=f"{done.message} (bulk action #{entry.id})")
             for job_id in done.job_ids], batch_size=500)
    events.publish([events.operator_action(entry.id, name)], using=OperatorAction.objects.db)
    return int(entry.id)


def record_shell_command(sender: object, *, command: str, actor: str, scope: str, message: str,
                         **_: Any) -> None:
    """A command an operator ran from a shell (``events.operator_command``), audited as the Deck's own."""
    record(actor[:150], command, Done(message, scope=scope), COMMAND_COMPLETED)


def _inspector_body(request: HttpRequest, job_id: str) -> Callable[[], str]:
    return lambda: render_to_string("deck/inspector.html#inspector",
                                    {**_inspector(job_id), **fragments.role_context(_role(request))}, request=request)


@dataclass(frozen=True)
class Before:
    """What an edit is about to change, for the audit entry."""

    payload: str | None = None
    tags: str | None = None


def _before(job_id: str) -> Before:
    jv = service.find_job(job_id)
    if jv is None:
        return Before()
    job = jv.hot or jv.archived or jv.dead
    return Before(job.payload, job.tags)  # type: ignore[union-attr]


def _edit_message(text: str, before: Before, edits: dict[str, Any]) -> str:
    """``text`` plus the tags change, when the edit sets tags (a payload change is kept as before/after)."""
    if edits["tags"] is None or edits["tags"] == (before.tags or ""):
        return text
    return f"{text}; tags {before.tags or ''!r} → {edits['tags']!r}"


@command(Role.OPERATOR)
def cancel(request: HttpRequest, job_id: str) -> Done:
    job_id = forms.job_id(job_id)
    how = service.cancel(job_id, actor=actor(request.user))
    text = "moved to the DLQ as Cancelled" if how == "moved" else "asked to stop (it is running)"
    return Done(f"Cancel request sent for {job_id}: {text}", job_id=job_id, scope=job_id)


def _edit_data(request: HttpRequest) -> dict[str, Any]:
    """The editor's fields, form encoded or (the Deck's editor) a JSON object: a payload of every size the
    envelope allows fits a JSON body, whereas form encoding can inflate it sixfold past Django's request cap."""
    data = forms.clean(forms.Edit, forms.edit_body(request) if forms.is_json(request) else request.POST)
    return {"payload": data.get("payload"), "tags": data.get("tags") or None, "priority": data.get("priority"),
            "revision": data.get("revision")}


@command(Role.OPERATOR)
def resurrect(request: HttpRequest, job_id: str) -> Done:
    """DLQ → Hot: the list's and the inspector's RETRY (no body) and the editor's SAVE & RETRY (payload, tags,
    priority, revision), which gets the refreshed inspector back."""
    job_id = forms.job_id(job_id)
    edits = _edit_data(request)
    if edits["payload"] is None and edits["tags"] is None and edits["priority"] is None:
        service.resurrect(job_id, actor=actor(request.user))
        return Done(f"Job {job_id} resurrected", job_id=job_id, scope=job_id)
    before = _before(job_id)
    service.resurrect(job_id, actor=actor(request.user), **edits)
    return Done(_edit_message(f"Job {job_id} resurrected", before, edits), job_id=job_id, scope=job_id,
                previous_payload=before.payload if edits["payload"] is not None else None,
                new_payload=edits["payload"], body=_inspector_body(request, job_id))


@command(Role.OPERATOR)
def edit(request: HttpRequest, job_id: str) -> Done:
    job_id = forms.job_id(job_id)
    edits = _edit_data(request)
    if edits["payload"] is None and edits["tags"] is None and edits["priority"] is None:
        raise forms.InvalidInput("nothing to change")
    before = _before(job_id)
    service.edit(job_id, actor=actor(request.user), **edits)
    return Done(_edit_message(f"Job {job_id} saved", before, edits), job_id=job_id, scope=job_id,
                previous_payload=before.payload if edits["payload"] is not None else None,
                new_payload=edits["payload"], body=_inspector_body(request, job_id))


@command(Role.OPERATOR)
def set_priority(request: HttpRequest, job_id: str) -> Done:
    job_id = forms.job_id(job_id)
    priority = forms.clean(forms.Priority, request.POST)["priority"]
    service.set_priority(job_id, priority, actor=actor(request.user))
    return Done(f"Job {job_id} priority set to {priority}", job_id=job_id, scope=job_id)


@command(Role.ADMIN)
def purge_archive(request: HttpRequest, job_id: str) -> Done:
    job_id = forms.job_id(job_id)
    service.purge_archive(job_id)
    return Done(f"Archived job {job_id} deleted forever", job_id=job_id, scope=job_id, level="warning")


@command(Role.ADMIN)
def purge_dlq(request: HttpRequest, job_id: str) -> Done:
    job_id = forms.job_id(job_id)
    service.purge_dlq(job_id)
    return Done(f"DLQ job {job_id} deleted forever", job_id=job_id, scope=job_id, level="warning")


@command(Role.OPERATOR)
def cancel_many(request: HttpRequest) -> Done:
    ids = forms.ids(request.POST)
    moved, flagged = service.cancel_many(ids, actor=actor(request.user))
    n = len(moved) + len(flagged)
    return Done(f"Cancel sent for {n} of {len(ids)} job(s) ({len(moved)} moved, {len(flagged)} running)",
                affected=n, scope=",".join(ids), level="success" if n else "warning", job_ids=[*moved, *flagged])


@command(Role.OPERATOR)
def resurrect_many(request: HttpRequest) -> Done:
    ids = forms.ids(request.POST)
    moved = service.resurrect_many(ids, actor=actor(request.user))
    n = len(moved)
    return Done(f"Requeued {n} of {len(ids)} DLQ job(s)", affected=n, scope=",".join(ids),
                level="success" if n else "warning", job_ids=moved)


@command(Role.ADMIN)
def purge_dlq_many(request: HttpRequest) -> Done:
    ids = forms.ids(request.POST)
    purged = service.purge_dlq_many(ids)
    return Done(f"Bulk purge: {len(purged)} DLQ job(s) permanently deleted", affected=len(purged),
                scope=",".join(ids), level="warning", job_ids=purged)


def _queue_done(name: str, change: str) -> Done:
    return Done(service.queue_change(name, change), scope=name)


@command(Role.OPERATOR)
def set_queue_paused(request: HttpRequest, name: str) -> Done:
    name = forms.queue_name(name)
    paused = forms.clean(forms.Toggle, request.POST)["value"]
    service.set_queue_paused(name, paused, must_exist=True)
    return _queue_done(name, service.paused_change(paused))


@command(Role.OPERATOR)
def set_queue_active(request: HttpRequest, name: str) -> Done:
    name = forms.queue_name(name)
    visible = forms.clean(forms.Toggle, request.POST)["value"]
    if not service.set_queue_active(name, visible):
        raise service.NotFoundError(f"Queue {name!r} does not exist")
    return _queue_done(name, service.active_change(visible))


@command(Role.OPERATOR)
def set_queue_zombie_timeout(request: HttpRequest, name: str) -> Done:
    name = forms.queue_name(name)
    seconds = forms.clean(forms.ZombieTimeout, request.POST).get("value")
    value = service.set_queue_zombie_timeout(name, None if seconds is None else max(60, seconds),
                                             must_exist=True)
    return _queue_done(name, service.zombie_timeout_change(value))


@command(Role.OPERATOR)
def set_queue_max_workers(request: HttpRequest, name: str) -> Done:
    name = forms.queue_name(name)
    value = service.set_queue_max_workers(name, forms.clean(forms.MaxWorkers, request.POST).get("value"),
                                         must_exist=True)
    return _queue_done(name, service.max_workers_change(value))


def _rate_done(state: RateLimitState, text: str) -> Done:
    return Done(service.rate_limit_change(state, text), scope=state.name)


@command(Role.OPERATOR)
def set_rate_limit(request: HttpRequest, name: str | None = None) -> Done:
    """Set a limit's rate (a new limit when the form names it); an empty rate returns to the declared one."""
    data = forms.clean(forms.RateValue, request.POST)
    state = service.set_rate_limit(name or data.get("name") or "", data.get("value"), actor=actor(request.user))
    return _rate_done(state, f"set to {data['value']}" if data.get("value") else "reset to the declared rate")


@command(Role.OPERATOR)
def pause_rate_limit(request: HttpRequest, name: str) -> Done:
    return _rate_done(service.pause_rate_limit(name, actor=actor(request.user)), "paused")


@command(Role.OPERATOR)
def lift_rate_limit(request: HttpRequest, name: str) -> Done:
    return _rate_done(service.lift_rate_limit(name, actor=actor(request.user)), "lifted")


def _preview(request: HttpRequest, preview: BulkPreview, action: str, max_jobs: int | None) -> HttpResponse:
    if not _htmx(request):
        return JsonResponse({"ok": True, "matched": preview.matched, "willAffect": preview.will_affect,
                             "truncated": preview.truncated, "sampleIds": preview.sample_ids})
    return _render(request, "deck/panels.html#bulk-preview",
                   {"preview": preview, "action": action, "max_jobs": max_jobs, "tokens": forms.TOKENS,
                    "batch": service.BULK_BATCH})


@require_POST
@require(Role.ADMIN)
def preview_dlq_matching(request: HttpRequest) -> HttpResponse:
    try:
        form = forms.dlq_bulk(request.POST)
        preview = service.preview_dlq_matching(form.filters("dlq"), form.max())
    except (forms.InvalidInput, service.ServiceError) as exc:
        return _bad(request, exc)
    action = request.POST.get("action", "purge")
    return _preview(request, preview, action if action in ("purge", "requeue") else "purge", form.max())


@require_POST
@require(Role.OPERATOR)
def preview_cancel_matching(request: HttpRequest) -> HttpResponse:
    try:
        preview = service.preview_cancel_matching(forms.jobs_query(request.POST).active_filters())
    except (forms.InvalidInput, service.ServiceError) as exc:
        return _bad(request, exc)
    return _preview(request, preview, "cancel", None)


def _confirmed(data: Mapping[str, Any], action: str) -> None:
    if data.get("confirm") != forms.TOKENS[action]:
        raise forms.InvalidInput(f"type {forms.TOKENS[action]} to confirm")


def _bulk_run(request: HttpRequest, run: runs.Run, level: str = "success") -> Done:
    """A confirmed bulk-by-filter command (``deck.runs``): done inside the request when it fits one batch, else
    started in the background (its audit entry is then rewritten as the batches commit)."""
    scope = request.POST.urlencode()[:1000]
    if run.total and not run.inline:
        return Done(run.message(0, running=True), affected=0, level="info", scope=scope, run=run,
                    extra={"total": run.total, "background": True})
    done, flagged = run.work(None)
    n = len(done) + len(flagged)
    return Done(run.message(n, len(flagged), total=max(run.total, n)), affected=n,
                level=level if n else "warning", scope=scope, job_ids=[*done, *flagged])


@command(Role.OPERATOR)
def cancel_matching(request: HttpRequest) -> Done:
    """CANCEL ALL MATCHING (Active view, its current filters): every matching Hot job, not only the loaded rows."""
    form = forms.jobs_query(request.POST)
    _confirmed(request.POST, "cancel")
    filters, who = form.active_filters(), actor(request.user)
    total = service.preview_cancel_matching(filters).matched
    return _bulk_run(request, runs.Run("cancel_matching", who, "Cancelled", total, lambda on_batch: (
        service.cancel_matching(filters, actor=who, on_batch=on_batch))))


@command(Role.ADMIN)
def purge_dlq_matching(request: HttpRequest) -> Done:
    form = forms.dlq_bulk(request.POST)
    _confirmed(form.cleaned_data, "purge")
    filters, limit = form.filters("dlq"), form.max()
    total = service.preview_dlq_matching(filters, limit).will_affect
    return _bulk_run(request, runs.Run("purge_dlq_matching", actor(request.user), "Purged", total, lambda on_batch: (
        service.purge_dlq_matching(filters, limit, on_batch=on_batch), [])), level="warning")


@command(Role.ADMIN)
def resurrect_matching(request: HttpRequest) -> Done:
    form = forms.dlq_bulk(request.POST)
    _confirmed(form.cleaned_data, "requeue")
    filters, limit, who = form.filters("dlq"), form.max(), actor(request.user)
    total = service.preview_dlq_matching(filters, limit).will_affect
    return _bulk_run(request, runs.Run("resurrect_matching", who, "Requeued", total, lambda on_batch: (
        service.resurrect_matching(filters, limit, actor=who, on_batch=on_batch), [])))


@command(Role.OPERATOR)
def set_worker_capacity(request: HttpRequest) -> Done:
    capacity = max(1, forms.clean(forms.Capacity, request.POST)["capacity"])
    if not service.set_worker_capacity(capacity):
        raise service.ServiceError(f"Worker control {NO_CONTROL_LAYER}")
    return Done(f"Worker capacity set to {capacity} on every live worker", scope=str(capacity))


NO_CONTROL_LAYER = "needs a cross-process channel layer (set REDIS_URL): nothing was sent"


def _circuit_command(request: HttpRequest, send: Callable[[str], bool], text: str, level: str) -> Done:
    key = forms.clean(forms.CircuitKey, request.POST)["key"]
    if not send(key):
        raise service.ServiceError(f"Circuit control {NO_CONTROL_LAYER}")
    return Done(f"Circuit {key} {text} on every live worker", scope=key, level=level)


@command(Role.OPERATOR)
def close_circuit(request: HttpRequest) -> Done:
    return _circuit_command(request, service.close_circuit, "reset (closed now)", "success")


@command(Role.OPERATOR)
def open_circuit(request: HttpRequest) -> Done:
    return _circuit_command(request, service.open_circuit, "opened now (its jobs wait a full break duration)",
                            "warning")


@command(Role.OPERATOR)
def set_schedule_enabled(request: HttpRequest, name: str) -> Done:
    enabled = forms.clean(forms.Toggle, request.POST)["value"]
    service.set_schedule_enabled(name, enabled)
    return Done(f"Recurring job {name} {'enabled' if enabled else 'disabled'} on every worker", scope=name,
                level="success" if enabled else "warning")


@command(Role.OPERATOR)
def run_schedule_now(request: HttpRequest, name: str) -> Done:
    job_id = service.run_schedule_now(name, actor=actor(request.user))
    return Done(f"Recurring job {name} run now as job {job_id}", job_id=job_id, scope=name,
                extra={"jobId": job_id})


@require_POST
@require(Role.ADMIN)
def preview_purge_older_than(request: HttpRequest) -> HttpResponse:
    pillar = request.POST.get("pillar", "")
    try:
        if pillar not in ("archive", "dlq"):
            raise forms.InvalidInput("pillar must be archive or dlq")
        days = forms.clean(forms.Days, request.POST)["days"]
        cutoff, count, capped = service.preview_purge_older_than(pillar, days)
    except (forms.InvalidInput, service.ServiceError) as exc:
        return _bad(request, exc)
    if not _htmx(request):
        return JsonResponse({"ok": True, "cutoff": cutoff.isoformat(), "count": count, "capped": capped})
    return _render(request, "deck/panels.html#purge-preview",
                   {"pillar": pillar, "days": days, "cutoff": cutoff, "count": count, "capped": capped})


def _purge_older(request: HttpRequest, pillar: str) -> Done:
    days = forms.clean(forms.Days, request.POST)["days"]
    n = service.purge_older_than(pillar, days)
    label = "archived" if pillar == "archive" else "DLQ"
    text = f"Purged {n} {label} job(s) older than {days} days." if n else f"No {label} jobs to purge."
    return Done(text, affected=n, level="warning", scope=f"{pillar} older than {days} days")


@command(Role.ADMIN)
def purge_archive_older_than(request: HttpRequest) -> Done:
    return _purge_older(request, "archive")


@command(Role.ADMIN)
def purge_dlq_older_than(request: HttpRequest) -> Done:
    return _purge_older(request, "dlq")

