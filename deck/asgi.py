"""The one helper a project wraps its ASGI application with to serve the Deck's websocket.

``application = with_deck(get_asgi_application())`` routes ``/ws/<ROUTE_PREFIX>/`` to the Deck's push-only
consumer (behind origin validation and Django's session auth) and every other HTTP request to the project's
own application.
"""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from channels.security.websocket import AllowedHostsOriginValidator


def with_deck(http_application: Any) -> ProtocolTypeRouter:
    """``http_application`` (Django's ASGI app) plus the Deck's websocket route."""
    from deck.routing import websocket_urlpatterns  # the URLconf needs the app registry, ready by now

    return ProtocolTypeRouter({
        "http": http_application,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    })
