"""The Deck's websocket route (wrapped in AuthMiddlewareStack + the Deck's origin check by ``deck.asgi.with_deck``)."""

from __future__ import annotations

from django.urls import path

from deck.consumers import DeckConsumer
from deck.urls import route_prefix

websocket_urlpatterns = [
    path(f"ws/{route_prefix()}/", DeckConsumer.as_asgi()),
]
