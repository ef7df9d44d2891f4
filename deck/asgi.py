"""The one helper a project wraps its ASGI application with to serve the Deck's websocket.

``application = with_deck(get_asgi_application())`` routes ``/ws/<ROUTE_PREFIX>/`` to the Deck's push-only
consumer (behind the Deck's origin check and Django's session auth) and every other HTTP request to the
project's own application.

Origin rule (cross-site websocket hijacking): a handshake is accepted only when its ``Origin`` header names
exactly the origin of the page that opened it — scheme, host **and** port equal to the handshake's own
(``Host`` header valid for ``ALLOWED_HOSTS``; ``https`` when the handshake is ``wss`` or, behind a proxy,
when ``SECURE_PROXY_SSL_HEADER`` says so) — or an origin listed in ``CSRF_TRUSTED_ORIGINS`` (exact, or the
``https://*.example.com`` subdomain form), the same rule Django's CSRF protection applies to a POST. A
missing or malformed ``Origin`` is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest
from django.utils.http import is_same_domain

logger = logging.getLogger("chokaq.deck")


class HandshakeRequest(HttpRequest):
    """The websocket handshake seen as an ``HttpRequest``: Django's own ``get_host()`` (``ALLOWED_HOSTS``,
    ``USE_X_FORWARDED_HOST``) and ``scheme`` (``SECURE_PROXY_SSL_HEADER``) then apply to it unchanged."""

    def __init__(self, scope: dict[str, Any]) -> None:
        super().__init__()
        headers: Iterable[tuple[bytes, bytes]] = scope.get("headers") or []
        for name, value in headers:
            key = "HTTP_" + name.decode("latin1").upper().replace("-", "_")
            text = value.decode("latin1")
            self.META[key] = f"{self.META[key]},{text}" if key in self.META else text
        server = scope.get("server") or (None, None)
        if server[0] is not None:
            self.META["SERVER_NAME"], self.META["SERVER_PORT"] = str(server[0]), str(server[1] or "")
        self._websocket_scheme = str(scope.get("scheme") or "ws")

    def _get_scheme(self) -> str:
        return "https" if self._websocket_scheme == "wss" else "http"


def origin_allowed(scope: dict[str, Any]) -> bool:
    """The handshake's ``Origin`` is the page's own origin (scheme, host and port) or a trusted one."""
    request = HandshakeRequest(scope)
    origin = request.META.get("HTTP_ORIGIN", "")
    try:
        parsed = urlsplit(origin)
        parsed.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        return False
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return False
    try:
        own = f"{request.scheme}://{request.get_host()}"
    except (DisallowedHost, KeyError):  # a Host outside ALLOWED_HOSTS, or no Host at all
        own = None
    if own is not None and origin.lower() == own.lower():
        return True
    trusted: list[str] = list(getattr(settings, "CSRF_TRUSTED_ORIGINS", []) or [])
    if origin.lower() in {t.lower() for t in trusted if "*" not in t}:
        return True
    for pattern in (t for t in trusted if "*" in t):
        pattern_parts = urlsplit(pattern)
        if pattern_parts.scheme == parsed.scheme and is_same_domain(
                parsed.netloc.lower(), pattern_parts.netloc.removeprefix("*").lower()):
            return True
    return False


class DeckOriginValidator:
    """ASGI middleware: a websocket handshake from an origin ``origin_allowed`` refuses is denied (HTTP 403
    before the socket opens); everything else passes to ``application``."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope.get("type") == "websocket" and not origin_allowed(scope):
            origin = dict(scope.get("headers") or []).get(b"origin", b"").decode("latin1")
            logger.warning("Refused a Deck websocket from origin %r", origin[:200])
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)


def with_deck(http_application: Any) -> ProtocolTypeRouter:
    """``http_application`` (Django's ASGI app) plus the Deck's websocket route."""
    from deck.routing import websocket_urlpatterns  # the URLconf needs the app registry, ready by now

    return ProtocolTypeRouter({
        "http": http_application,
        "websocket": DeckOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    })
