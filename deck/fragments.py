"""The one place that renders Deck fragments: page loads, htmx partials and websocket pushes.

Every fragment is a ``{% partialdef %}`` of a template under
``templates/deck/`` whose root element carries a stable id. A push wraps
the same partials with ``hx-swap-oob`` so the htmx ws extension swaps them
in by id; rows travel through the hidden ``#row-inbox`` from which
``deck.js`` upserts them into the Active table (a row the page does not
hold cannot be swapped by id).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from django.template.loader import render_to_string

from chokaq_core.readmodel import ErrorGroup, JobRow, SummaryStats
from chokaq_core.service import FleetView, HistoryView, QueueOverview, Throughput
from deck.permissions import Role

PANELS = "deck/panels.html"
JOBS = "deck/jobs.html"


def render(template: str, partial: str, context: dict[str, Any]) -> str:
    return render_to_string(f"{template}#{partial}", context)


def role_context(role: Role) -> dict[str, Any]:
    return {"role": int(role), "can_operate": role >= Role.OPERATOR, "can_admin": role >= Role.ADMIN}


def chart_json(tp: Throughput) -> str:
    """uPlot's column data: epoch seconds, succeeded/s, failed/s."""
    return json.dumps({
        "t": [int(p.at.timestamp()) for p in tp.points],
        "ok": [p.succeeded for p in tp.points],
        "fail": [p.failed for p in tp.points],
    }, separators=(",", ":"))


def chart_context(tp: Throughput) -> dict[str, Any]:
    """The chart's data for uPlot and its text alternative (totals over the window, the last minute's rates)."""
    return {"chart_json": chart_json(tp), "tp": tp, "chart_succeeded": sum(p.succeeded for p in tp.points),
            "chart_failed": sum(p.failed for p in tp.points)}


RANGE_LABELS = {"1h": "last hour (per minute)", "24h": "last 24 hours (per hour)", "7d": "last 7 days (per hour)"}


def history_json(view: HistoryView) -> str:
    """uPlot's column data of a history view: epoch seconds, succeeded and failed per bucket, p50/p95 ms."""
    return json.dumps({
        "t": [int(b.at.timestamp()) for b in view.buckets],
        "ok": [b.succeeded for b in view.buckets],
        "fail": [b.failed for b in view.buckets],
        "p50": [None if b.p50_ms is None else round(b.p50_ms, 3) for b in view.buckets],
        "p95": [None if b.p95_ms is None else round(b.p95_ms, 3) for b in view.buckets],
    }, separators=(",", ":"))


def history_context(view: HistoryView) -> dict[str, Any]:
    """A history view for the chart panel: uPlot's data, its label, and the busiest buckets for the table."""
    return {"history": view, "history_json": history_json(view), "range_label": RANGE_LABELS[view.range],
            "history_rows": [b for b in reversed(view.buckets) if b.succeeded or b.failed]}


def stats(summary: SummaryStats, tp: Throughput, *, oob: bool = False) -> str:
    return render(PANELS, "stats", {"summary": summary, "tp": tp, "oob": oob})


def queues(overview: Sequence[QueueOverview], role: Role, *, oob: bool = False) -> str:
    return render(PANELS, "queues", {"queues": overview, "oob": oob, **role_context(role)})


def chart(tp: Throughput, *, oob: bool = False) -> str:
    return render(PANELS, "chart-data", {**chart_context(tp), "oob": oob})


def top_errors(groups: Sequence[ErrorGroup], at: datetime | None, *, oob: bool = False) -> str:
    return render(PANELS, "top-errors", {"errors": groups, "errors_at": at, "oob": oob})


def workers(view: FleetView, *, oob: bool = False) -> str:
    return render(PANELS, "workers", {"fleet_view": view, "oob": oob})


def breakers(view: FleetView, role: Role, *, oob: bool = False) -> str:
    return render(PANELS, "breakers", {"fleet_view": view, "oob": oob, **role_context(role)})


def row(job: JobRow, role: Role, *, view: str = "active", gone: bool = False) -> str:
    return render(JOBS, "row", {"job": job, "view": view, "gone": gone, **role_context(role)})


def inbox(rows: Iterable[str], progress: dict[str, int], touched: Iterable[str] = (),
          bulk: Iterable[dict[str, Any]] = ()) -> str:
    """Rows to upsert (or, marked ``data-gone``, to retire), progress values, the ids of jobs that changed (an
    open inspector showing one re-fetches itself) and the progress of bulk runs (toasts), for ``deck.js``."""
    return render(PANELS, "inbox", {"rows": list(rows), "progress": sorted(progress.items()),
                                    "touched": list(touched), "bulk": list(bulk)})


def console(entries: Iterable[Any]) -> str:
    """Lines appended to the system console (operator actions and notable events)."""
    return render(PANELS, "console-lines", {"entries": list(entries)})


def now() -> datetime:
    return datetime.now(UTC)
