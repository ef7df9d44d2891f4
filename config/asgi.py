"""ASGI entry point of the demo project: Django's application wrapped with the Deck's helper."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from deck.asgi import with_deck

# Static files are served by WhiteNoise (a middleware in config.settings: hashed names with a ten-year
# immutable cache lifetime once collectstatic has run); behind a CDN or a web server that serves STATIC_ROOT
# the middleware can go.
application = with_deck(get_asgi_application())
