"""The Deck's websocket route (wrapped in AuthMiddlewareStack + AllowedHostsOriginValidator by config.asgi)."""

from __future__ import annotations

from django.urls import path

from deck.consumers import DeckConsumer

websocket_urlpatterns = [
    path("ws/deck/", DeckConsumer.as_asgi()),
]
