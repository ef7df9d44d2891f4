"""Infrastructure endpoints: health (spec 05 §4) and Prometheus metrics (spec 05 §2).

They carry no login: expose them to probes and scrapers only (an internal
network or an ingress rule), never to the public.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from chokaq_core import health as health_checks


def _tags(request: HttpRequest) -> list[str]:
    return [t for value in request.GET.getlist("tags") for t in value.split(",") if t.strip()]


@never_cache
@require_safe
def health(request: HttpRequest) -> HttpResponse:
    """``GET /deck/health/[?tags=live]`` → ``{status, checks}``; 200 Healthy/Degraded, 503 Unhealthy."""
    report = health_checks.run(_tags(request))
    return JsonResponse(report.as_dict(), status=report.http_status)


@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    """``GET /deck/metrics``: Prometheus text exposition of ChokaQ's instruments and fleet gauges."""
    from prometheus_client import CONTENT_TYPE_LATEST

    from chokaq_core import metrics as instruments

    return HttpResponse(instruments.exposition(), content_type=CONTENT_TYPE_LATEST)
