"""Infrastructure endpoints served by the Deck's include: health (spec 05 §4) and Prometheus metrics (spec 05 §2).

They carry no login: expose them to probes and scrapers only (an internal network or an ingress rule), never to
the public.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from chokaq_core import service


def _tags(request: HttpRequest) -> list[str]:
    return [t for value in request.GET.getlist("tags") for t in value.split(",") if t.strip()]


@never_cache
@require_safe
def health(request: HttpRequest) -> HttpResponse:
    """``GET /deck/health/[?tags=live]`` → ``{status, checks}``; 200 Healthy/Degraded, 503 Unhealthy."""
    body, status = service.health_report(_tags(request))
    return JsonResponse(body, status=status)


@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    """``GET /deck/metrics``: Prometheus text exposition of ChokaQ's instruments and fleet gauges."""
    text, content_type = service.metrics_exposition()
    return HttpResponse(text, content_type=content_type)
