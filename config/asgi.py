"""ASGI entry point: HTTP through Django, the Deck's websocket through Channels."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from deck.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter({
    # daphne serves the Deck's static files itself (htmx, uPlot, deck.css/js are small and pinned);
    # behind a CDN or whitenoise this wrapper can go.
    "http": ASGIStaticFilesHandler(django_asgi_app),
    "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
})
