"""Server-side validation of every Deck input (spec 04 §6).

Each form turns raw query/POST data into service arguments or a message
that the view answers with a 400 — bad input never reaches the engine and
never becomes a 500.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, time
from typing import Any

from django import forms
from django.http import HttpRequest, QueryDict

from chokaq_core import service
from chokaq_core.domain import MAX_ATTEMPT_MESSAGE, MAX_ERROR_CLASS, FailureReason, JobFilter, JobStatus
from chokaq_core.readmodel import SORT_KEYS, HistorySort

MAX_NAME = 255
MAX_SEARCH = 1000
MAX_TAGS = 1000
MAX_PAYLOAD_CHARS = 4_000_000  # the editor's pretty-printed text; the envelope limit applies to compact JSON
MAX_EDIT_BODY = 4 * MAX_PAYLOAD_CHARS + 65_536  # bytes of a JSON edit body (escaping can double a payload twice)
MAX_BATCH = 1000
PAGE_SIZES = (10, 100, 500)  # a 1,000-row page took ≈200 ms to render (bench/deck_bench.py): 500 at most
SORT_LABELS = {"date": "Date", "duration": "Duration", "type": "Type", "queue": "Queue", "attempts": "Attempts",
               "created": "Created", "id": "Id", "worker": "Worker", "reason": "Reason"}
REASONS = [(int(r), r.display_name) for r in FailureReason]
TOKENS = {"purge": "PURGE", "requeue": "REQUEUE", "cancel": "CANCEL"}
MAX_RUN = 2**31 - 1  # the largest max-jobs bound of a bulk-by-filter run (blank: every match)


class InvalidInput(ValueError):
    """Raised with one readable message for the whole form."""


def _plain(label: str, error: forms.ValidationError) -> str:
    """One field error in plain words, e.g. "Max workers must be at least 1" (not "value: Ensure this value is
    greater than or equal to 1.")."""
    params = error.params or {}
    limit = params.get("limit_value")
    if error.code == "required":
        return f"{label} is required"
    if error.code == "min_value":
        return f"{label} must be at least {limit}"
    if error.code == "max_value":
        return f"{label} must be at most {limit}"
    if error.code == "max_length":
        return f"{label} is too long: at most {limit} characters (got {params.get('show_value')})"
    if error.code == "invalid_choice":
        return f"{label}: {params.get('value')!r} is not one of the choices"
    if error.code == "invalid" and "whole number" in str(error.message):
        return f"{label} must be a whole number"
    if error.code == "invalid" and "date" in str(error.message):
        return f"{label} must be a day written YYYY-MM-DD"
    text = " ".join(error.messages).rstrip(".")
    return f"{label}: {text}"


def message(form: forms.Form) -> str:
    """Every error of a form, in plain words naming the field by its label."""
    parts = []
    for field, errors in form.errors.as_data().items():
        if field == "__all__":
            parts += [" ".join(e.messages) for e in errors]
            continue
        bound = form.fields.get(field)
        label = str(bound.label) if bound is not None and bound.label else field.replace("_", " ").capitalize()
        parts += [_plain(label, e) for e in errors]
    return "; ".join(parts) or "invalid input"


def clean(form_class: type[forms.Form], data: QueryDict | dict[str, Any]) -> dict[str, Any]:
    form = form_class(data)
    if not form.is_valid():
        raise InvalidInput(message(form))
    return form.cleaned_data


def job_id(value: str) -> str:
    """A job id from a path segment or form field: the engine's alphabet (``service.check_job_id``)."""
    try:
        return service.check_job_id(value)
    except service.ServiceError as exc:
        raise InvalidInput(str(exc)) from None


def queue_name(value: str) -> str:
    """A queue name from a path segment: the engine's alphabet (``service.check_queue_name``)."""
    try:
        return service.check_queue_name(value)
    except service.ServiceError as exc:
        raise InvalidInput(str(exc)) from None


def ids(data: QueryDict) -> list[str]:
    """``ids`` given as repeated fields and/or comma separated, checked by the engine's rule
    (``service.check_job_ids``: 1–1000 after trimming, each valid, de-duplicated)."""
    raw = [part for value in data.getlist("ids") for part in value.split(",")]
    try:
        return service.check_job_ids(raw)
    except service.ServiceError as exc:
        raise InvalidInput(str(exc)) from None


def _day_start(day: Any) -> datetime | None:
    return datetime.combine(day, time.min, tzinfo=UTC) if day else None


def _day_end(day: Any) -> datetime | None:
    return datetime.combine(day, time.max, tzinfo=UTC) if day else None


class _Filters(forms.Form):
    queue = forms.CharField(required=False, max_length=MAX_NAME, strip=True, label="Queue")
    type = forms.CharField(required=False, max_length=MAX_NAME, strip=True, label="Type")
    q = forms.CharField(required=False, max_length=MAX_SEARCH, strip=True, label="Search text")
    reason = forms.TypedChoiceField(required=False, choices=[("", "any"), *REASONS], coerce=int, empty_value=None,
                                    label="Failure reason")
    eclass = forms.CharField(required=False, max_length=MAX_ERROR_CLASS, strip=True, label="Error class")
    emsg = forms.CharField(required=False, max_length=MAX_ATTEMPT_MESSAGE, strip=False, label="Error message")
    start = forms.DateField(required=False, input_formats=["%Y-%m-%d"], label="Start day (from)")
    end = forms.DateField(required=False, input_formats=["%Y-%m-%d"], label="End day (to)")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("start") and data.get("end") and data["start"] > data["end"]:
            raise forms.ValidationError("'from' must not be after 'to'")
        if data.get("emsg") and not data.get("eclass"):
            raise forms.ValidationError("an error message filter needs its error class (eclass)")
        return data

    def filters(self, pillar: str) -> JobFilter:
        d = self.cleaned_data
        reason = d.get("reason")
        return JobFilter(
            queue=d.get("queue") or None,
            type=d.get("type") or None,
            search=d.get("q") or None,
            failure_reason=FailureReason(reason) if reason is not None and pillar == "dlq" else None,
            from_at=_day_start(d.get("start")),
            to_at=_day_end(d.get("end")),
            # a Top Errors group: class and message exactly (an empty message is a message)
            error_class=d.get("eclass") or None if pillar == "dlq" else None,
            error_message=d.get("emsg") or "" if pillar == "dlq" and d.get("eclass") else None,
        )


class JobsQuery(_Filters):
    """The job matrix: which view, its filters, sort and page."""

    view = forms.ChoiceField(required=False, choices=[("active", "Active"), ("archive", "Archive"), ("dlq", "DLQ")],
                             label="View")
    status = forms.TypedChoiceField(required=False, coerce=int, empty_value=None, label="Status",
                                    choices=[("", "any"), *((int(s), s.name) for s in JobStatus if s <= 2)])
    sort = forms.CharField(required=False, max_length=20, label="Sort")
    dir = forms.ChoiceField(required=False, choices=[("desc", "desc"), ("asc", "asc")], label="Direction")
    size = forms.TypedChoiceField(required=False, coerce=int, empty_value=None, label="Page size",
                                  choices=[(n, n) for n in PAGE_SIZES])
    after = forms.CharField(required=False, max_length=2000, label="Next-page key")
    before = forms.CharField(required=False, max_length=2000, label="Previous-page key")

    def clean_sort(self) -> str:
        key = (self.cleaned_data.get("sort") or "date").strip().lower()
        if key not in SORT_KEYS:
            raise forms.ValidationError(f"unknown sort key (allowed: {', '.join(SORT_KEYS)})")
        return key

    @property
    def pillar(self) -> str:
        return self.cleaned_data.get("view") or "active"

    def sort_spec(self) -> HistorySort:
        return HistorySort(self.cleaned_data["sort"], self.cleaned_data.get("dir") != "asc")

    def active_filters(self) -> JobFilter:
        d = self.cleaned_data
        status = d.get("status")
        return JobFilter(queue=d.get("queue") or None, type=d.get("type") or None, search=d.get("q") or None,
                         status=JobStatus(status) if status is not None else None)


def jobs_query(data: QueryDict) -> JobsQuery:
    form = JobsQuery(data)
    if not form.is_valid():
        raise InvalidInput(message(form))
    return form


class DlqBulk(_Filters):
    """The DLQ bulk-by-filter form (preview / purge / requeue)."""

    max_jobs = forms.IntegerField(required=False, max_value=MAX_RUN, label="Max jobs")
    confirm = forms.CharField(required=False, max_length=20, label="Confirmation word")

    def max(self) -> int | None:
        """The run's bound: blank = every match (no cap; the run goes in batches), ≤ 0 = 100 (spec 04 §6)."""
        return self.cleaned_data.get("max_jobs")


def dlq_bulk(data: QueryDict) -> DlqBulk:
    form = DlqBulk(data)
    if not form.is_valid():
        raise InvalidInput(message(form))
    return form


class Edit(forms.Form):
    payload = forms.CharField(required=False, max_length=MAX_PAYLOAD_CHARS, strip=False, label="Payload")
    tags = forms.CharField(required=False, max_length=MAX_TAGS, strip=True, label="Tags")
    priority = forms.IntegerField(required=False, min_value=0, max_value=1_000_000, label="Priority")
    revision = forms.IntegerField(required=False, min_value=0, label="Revision")  # the edit version the editor was opened at

    def clean_payload(self) -> str | None:
        payload = self.cleaned_data.get("payload")
        if payload is None or not payload.strip():
            if "payload" in self.data:
                raise forms.ValidationError("Payload is empty")
            return None
        return str(payload)


def is_json(request: HttpRequest) -> bool:
    return request.content_type == "application/json"


def edit_body(request: HttpRequest) -> dict[str, Any]:
    """The editor's JSON body (``{"payload": "...", "tags": "...", "priority": "..."}``). Read here, bounded by
    ``MAX_EDIT_BODY`` rather than Django's form cap, so every payload the envelope allows can be saved."""
    raw = request.read(MAX_EDIT_BODY + 1)
    if len(raw) > MAX_EDIT_BODY:
        raise InvalidInput(f"the request is over {MAX_EDIT_BODY:,} bytes; the limit is {MAX_EDIT_BODY:,} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidInput("the request body must be a JSON object of fields")
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in data.items() if v is not None}


class Priority(forms.Form):
    priority = forms.IntegerField(min_value=0, max_value=1_000_000, label="Priority")


class Toggle(forms.Form):
    """``value`` = 1/0 (true/false, on/off)."""

    value = forms.CharField(max_length=5, label="Value (1 or 0)")

    def clean_value(self) -> bool:
        raw = self.cleaned_data["value"].strip().lower()
        if raw in ("1", "true", "on", "yes"):
            return True
        if raw in ("0", "false", "off", "no"):
            return False
        raise forms.ValidationError("must be 1 or 0")


class ZombieTimeout(forms.Form):
    value = forms.IntegerField(required=False, min_value=1, max_value=86_400, label="Zombie timeout (seconds)")


class RateValue(forms.Form):
    """A rate limit as typed ("100/m", "50/s burst 10"; empty: back to the declared rate); the name when the
    address does not carry it (a new limit)."""

    value = forms.CharField(required=False, max_length=100, label="Rate")
    name = forms.CharField(required=False, max_length=300, label="Limit")


class MaxWorkers(forms.Form):
    value = forms.IntegerField(required=False, min_value=1, max_value=10_000, label="Max workers")


class Capacity(forms.Form):
    """Fleet-wide handler concurrency per worker (spec 04 §2.9: 0–100; the worker clamps to at least 1)."""

    capacity = forms.IntegerField(min_value=0, max_value=100, label="Capacity")


class CircuitKey(forms.Form):
    """The type key of a circuit breaker (its alphabet is checked by the service)."""

    key = forms.CharField(max_length=MAX_NAME, strip=True, label="Circuit key")


class Days(forms.Form):
    days = forms.IntegerField(min_value=1, max_value=365, label="Days")
