"""Display rules of the Deck (spec 04 §2): numbers, lag, durations, badges, payloads."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django import template
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

from chokaq_core.domain import FailureReason, JobStatus, RateLimitState, is_valid_name
from chokaq_core.domain import short_class as domain_short_class
from chokaq_core.readmodel import ErrorGroup
from deck.conf import setting

register = template.Library()


@register.simple_tag
def deck_root() -> str:
    """The Deck's base path, e.g. ``/deck/`` (``CHOKAQ_DECK["ROUTE_PREFIX"]``)."""
    from django.urls import reverse

    return reverse("deck:index")


@register.simple_tag
def deck_ws() -> str:
    """The Deck's websocket path, e.g. ``/ws/deck/``."""
    from deck.urls import route_prefix

    return f"/ws/{route_prefix()}/"

_SPACES = re.compile(r"\s+")
REASON_CLASSES = {
    FailureReason.THROTTLED: "throttled", FailureReason.FATAL_ERROR: "fatal", FailureReason.TIMEOUT: "timeout",
    FailureReason.TRANSIENT: "transient", FailureReason.CANCELLED: "cancelled", FailureReason.ZOMBIE: "zombie",
}
STATUS_CLASSES = {
    JobStatus.PENDING: "pending", JobStatus.FETCHED: "fetched", JobStatus.PROCESSING: "processing",
    JobStatus.SUCCEEDED: "succeeded", JobStatus.FAILED: "failed", JobStatus.CANCELLED: "failed",
    JobStatus.ZOMBIE: "failed",
}


@register.filter
def num(value: Any) -> str:
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return "-"


@register.filter
def rate(value: Any) -> str:
    value = float(value or 0)
    return f"{value:.1f}" if value < 10 else f"{value:,.0f}"


@register.filter
def pct(value: Any) -> str:
    return f"{float(value or 0):.1f}%"


@register.filter
def lag(seconds: Any) -> str:
    seconds = float(seconds or 0)
    if seconds < 1:
        return f"{int(seconds * 1000)}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes:02d}:{rest:02d}"


@register.simple_tag
def lag_class(pending: int, max_lag: float) -> str:
    warning = setting("QUEUE_LAG_WARNING_THRESHOLD_SECONDS")
    critical = setting("QUEUE_LAG_CRITICAL_THRESHOLD_SECONDS")
    if not pending or max_lag < warning:
        return "healthy"
    return "critical" if max_lag >= critical else "warning"


@register.filter
def duration(ms: Any) -> str:
    if ms is None or ms == "":
        return "-"
    ms = max(0.0, float(ms))
    if ms < 1000:
        return f"{int(ms)}ms"
    if ms < 60_000:
        return f"{int(ms // 1000)}s {int(ms % 1000)}ms"
    minutes, seconds = divmod(int(ms // 1000), 60)
    return f"{minutes}m {seconds}s"


@register.filter
def percentile_ms(series: Any, p: Any) -> float | None:
    """The ``p``-th percentile (0–100) of a history series' durations, from its histogram bins."""
    return series.p(float(p) / 100)  # type: ignore[no-any-return]


@register.filter
def since_ms(moment: datetime | None) -> float | None:
    """Milliseconds from ``moment`` to now (an Active row's running time)."""
    if moment is None:
        return None
    return (datetime.now(UTC) - moment).total_seconds() * 1000


@register.filter
def age(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    seconds = max(0, int((datetime.now(UTC) - moment).total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


@register.filter
def hms(moment: datetime | None) -> str:
    return moment.astimezone(UTC).strftime("%H:%M:%S") if moment else "--"


@register.filter
def stamp(moment: datetime | None) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if moment else "-"


@register.filter
def iso(moment: datetime | None) -> str:
    return moment.astimezone(UTC).isoformat() if moment else ""


@register.filter
def status_name(status: Any) -> str:
    try:
        return JobStatus(int(status)).name
    except (TypeError, ValueError):
        return "?"


@register.filter
def status_class(status: Any) -> str:
    try:
        return STATUS_CLASSES[JobStatus(int(status))]
    except (TypeError, ValueError, KeyError):
        return "muted"


@register.filter
def reason_class(reason: Any) -> str:
    try:
        return REASON_CLASSES.get(FailureReason(int(reason)), "other")
    except (TypeError, ValueError):
        return "other"


@register.filter
def attempt_class(attempts: Any) -> str:
    attempts = int(attempts or 0)
    return "danger" if attempts >= 3 else "warning" if attempts == 2 else "plain"


@register.filter
def error_family(text: str | None) -> str:
    """CR/LF → space, runs of spaces collapsed, trimmed, first 160 characters."""
    return _SPACES.sub(" ", (text or "").replace("\r", " ").replace("\n", " ")).strip()[:160]


@register.filter
def is_later(moment: datetime | None) -> bool:
    """Whether ``moment`` is still ahead (a Pending job that is not due yet)."""
    return moment is not None and moment > datetime.now(UTC)


@register.filter
def short_class(error_class: str | None) -> str:
    """An exception class path's last part (the name shown; the path is the tooltip)."""
    return domain_short_class(error_class) if error_class else ""


@register.filter
def error_group_query(group: ErrorGroup) -> str:
    """The DLQ list query of a Top Errors group: its reason, class and message exactly (rows without a class:
    their details' prefix as the search text)."""
    params = {"view": "dlq", "reason": str(int(group.reason))}
    if group.error_class:
        params.update(eclass=group.error_class, emsg=group.error_message or "")
    else:
        params["q"] = group.prefix[:1000]
    return urlencode({**params, "size": "100"})


_NAME_BREAKS = re.compile(r"([._])")


@register.filter
def breakable(name: str | None) -> SafeString:
    """A dotted name (a job type) that a narrow column wraps after a dot or an underscore, never inside a word."""
    return mark_safe(_NAME_BREAKS.sub(r"\1<wbr>", escape(name or "")))  # escaped first: only <wbr> is markup


@register.filter
def clip(text: str | None, length: int) -> str:
    text = text or ""
    return text if len(text) <= length else text[:length] + "..."


@register.filter
def pretty_json(text: str | None) -> str:
    """Pretty-printed JSON, or the raw text when it is not JSON (escaped by the template)."""
    if text is None:
        return ""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False, sort_keys=False)
    except (ValueError, RecursionError):  # a payload stored nested deeper than the stack allows: shown as stored
        return text


@register.filter
def seconds_ago(seconds: float | None) -> str:
    """A heartbeat age in whole seconds ("-" when unknown)."""
    if seconds is None:
        return "-"
    return f"{max(0, int(seconds))}s"


@register.simple_tag
def countdown(reset_at: datetime | None, at: datetime) -> str:
    """Time left until an Open circuit lets a trial through (``N.Ns``), "READY" once elapsed (spec 04 §2.6)."""
    if reset_at is None:
        return "-"
    left = (reset_at - at).total_seconds()
    return f"{left:.1f}s" if left > 0 else "READY"


@register.filter
def url_safe_id(value: Any) -> bool:
    """Whether a job id fits the engine's alphabet and so may be reversed into a URL (rows stored before the
    alphabet existed may hold ``x/../../metrics``: they are listed, escaped, with no link or action)."""
    return is_valid_name("job id", value)


@register.filter
def url_safe_queue(value: Any) -> bool:
    """``url_safe_id`` for queue names."""
    return is_valid_name("queue", value)


@dataclass(frozen=True, slots=True)
class RateCell:
    """A queue's or a job type's limit as its row shows it: its use and the address of the limit's row in the
    rate-limits panel (``#rate-limit-<n>``, the panel's order: a counter, never the limit's name)."""

    text: str
    paused: bool
    href: str


@register.filter
def rate_cells(limits: Iterable[RateLimitState] | None, scope: str) -> dict[str, RateCell]:
    """The rate cells of one scope (``queue`` for the queues panel, ``type`` for the types table), by queue
    name or type key: each limit in force of that scope, numbered as the rate-limits panel numbers its rows."""
    cells: dict[str, RateCell] = {}
    for n, state in enumerate(limits or (), start=1):
        text = rate_use(state)
        prefix, _, target = state.name.partition(":")
        if text and prefix == scope and state.rate is not None:
            cells[target] = RateCell(text, not state.rate.count, f"#rate-limit-{n}")
    return cells


@register.filter
def rate_use(state: RateLimitState) -> str:
    """A limit's use as a queue's or type's row shows it: "87/100 per 1m", "paused" for a 0 count, "" when no
    rate is in force (lifted, or nothing declared)."""
    rate = state.rate
    if rate is None:
        return ""
    if not rate.count:
        return "paused"
    window = next((f"{rate.window / size:g}{unit}" for size, unit in ((3600, "h"), (60, "m"), (1, "s"))
                   if rate.window % size == 0), f"{rate.window:g}s")
    return f"{state.used}/{rate.count} per {window}"


@register.simple_tag
def rate_badge(cells: Mapping[str, RateCell], name: str, scope: str) -> str:
    """A rate cell's content: a badge with the limit's use linking to its row in the rate-limits panel (where
    it is changed, paused or lifted), or "—" when no limit applies."""
    key = name.lower() if scope == "type" else name  # type keys compare case-insensitively
    cell = cells.get(key)
    if cell is None:
        return "—"
    return format_html('<a href="{}" class="badge {} rate-badge" title="Rate limit {}:{} (change it under RATE '
                       'LIMITS)">{}</a>', cell.href, "badge-warning" if cell.paused else "badge-muted", scope, key,
                       cell.text)
