"""Until the full Deck lands: a plain page with the counts of the three pillars."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.utils.html import escape

from chokaq_core import service


def overview(request: HttpRequest) -> HttpResponse:
    stats = service.summary()
    rows = "".join(
        f"<tr><td>{escape(q.queue)}</td><td>{q.pending}</td><td>{q.fetched}</td><td>{q.processing}</td>"
        f"<td>{q.succeeded_total}</td><td>{q.failed_total}</td><td>{q.retried_total}</td></tr>"
        for q in service.queues()
    )
    html = (
        "<!doctype html><title>ChokaQ</title><meta http-equiv=refresh content=2>"
        f"<h1>ChokaQ</h1><p>Hot: {stats.pending + stats.fetched + stats.processing} "
        f"(pending {stats.pending}, fetched {stats.fetched}, processing {stats.processing}) · "
        f"Archive: {stats.succeeded_total} · DLQ: {stats.failed_total} · retried {stats.retried_total}</p>"
        "<table border=1><tr><th>queue<th>pending<th>fetched<th>processing<th>succeeded<th>failed<th>retried</tr>"
        f"{rows}</table>"
    )
    return HttpResponse(html)
