"""ASGI entry point of the demo project: Django's application wrapped with the Deck's helper."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

from deck.asgi import with_deck

# daphne serves the Deck's static files itself (htmx, uPlot, deck.css/js are small and pinned);
# behind a CDN or whitenoise this wrapper can go.
application = with_deck(ASGIStaticFilesHandler(get_asgi_application()))
