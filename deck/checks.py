"""The Deck's system checks: its settings are valid, the project's ASGI application and URLconf serve the Deck
where it says.

chokaq.E004  a ``CHOKAQ_DECK`` value is invalid (``deck.conf.problems``, the rules the app also enforces when it loads)
chokaq.E011  ``ASGI_APPLICATION`` is unset, cannot be imported, or does not route ``/ws/<ROUTE_PREFIX>/`` to the
             Deck's consumer (``application = deck.asgi.with_deck(get_asgi_application())`` does)
chokaq.E012  ``deck.urls`` is included at another path than ``CHOKAQ_DECK["ROUTE_PREFIX"]`` (the websocket route
             and the page's socket address follow the setting, so both must agree)
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.urls import NoReverseMatch, reverse
from django.utils.module_loading import import_string

ASGI_HINT = ('in your asgi.py: "from deck.asgi import with_deck" and '
             '"application = with_deck(get_asgi_application())"; in settings: '
             'ASGI_APPLICATION = "<project>.asgi.application"')
# Attributes through which ASGI wrappers (Channels' middleware, origin validators, static-files handlers)
# reach the application they wrap.
INNER_ATTRIBUTES = ("inner", "application", "app")
MAX_WRAPPERS = 20


def websocket_path() -> str:
    """The Deck's websocket path without its leading slash, e.g. ``ws/deck/``."""
    from deck.urls import route_prefix

    return f"ws/{route_prefix()}/"


def _unwrap(application: Any) -> Any:
    """The first ProtocolTypeRouter or URLRouter inside ``application``'s wrappers (else the innermost app)."""
    from channels.routing import ProtocolTypeRouter, URLRouter

    for _ in range(MAX_WRAPPERS):
        if isinstance(application, ProtocolTypeRouter | URLRouter):
            return application
        inner = next((getattr(application, name) for name in INNER_ATTRIBUTES
                      if getattr(application, name, None) is not None), None)
        if inner is None:
            return application
        application = inner
    return application


def routes_the_deck(application: Any, path: str) -> bool | None:
    """Whether a websocket connection to ``path`` reaches the Deck's consumer: True, False, or None when the
    application is of a kind this check cannot look into."""
    from channels.routing import ProtocolTypeRouter, URLRouter
    from django.core.handlers.asgi import ASGIHandler

    from deck.consumers import DeckConsumer

    target = _unwrap(application)
    if isinstance(target, ProtocolTypeRouter):
        if "websocket" not in target.application_mapping:
            return False
        target = _unwrap(target.application_mapping["websocket"])
    if isinstance(target, ASGIHandler):
        return False  # Django's own handler speaks HTTP only
    if not isinstance(target, URLRouter):
        return None
    for route in target.routes:
        match = route.pattern.match(path)
        if not match:
            continue
        callback = route.callback
        if getattr(callback, "consumer_class", None) is DeckConsumer:
            return True
        nested = routes_the_deck(callback, match[0])
        if nested is not False:
            return nested
    return False


def check_asgi_application(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """chokaq.E011: the configured ASGI application routes the Deck's websocket."""
    dotted = getattr(settings, "ASGI_APPLICATION", None)
    path = websocket_path()
    if not dotted:
        return [checks.Error(f"ASGI_APPLICATION is not set: nothing serves the Deck's websocket /{path}",
                             hint=ASGI_HINT, id="chokaq.E011")]
    try:
        application = import_string(str(dotted))
    except Exception as exc:
        return [checks.Error(f"ASGI_APPLICATION {dotted!r} cannot be imported: {type(exc).__name__}: {exc}",
                             hint=ASGI_HINT, id="chokaq.E011")]
    if routes_the_deck(application, path) is False:
        return [checks.Error(f"ASGI_APPLICATION {dotted!r} does not route the Deck's websocket /{path}: the "
                             "Deck's page then shows no live updates",
                             hint=ASGI_HINT, id="chokaq.E011")]
    return []


def check_url_prefix(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """chokaq.E012: ``include("deck.urls")`` sits at ``CHOKAQ_DECK["ROUTE_PREFIX"]``."""
    from deck.urls import route_prefix

    try:
        mounted = reverse("deck:index")
    except NoReverseMatch:
        return [checks.Error('the Deck is installed but its URLs are not: add path("deck/", include("deck.urls")) '
                             "to your ROOT_URLCONF", id="chokaq.E012")]
    except Exception:
        return []  # a broken URLconf is reported by Django's own checks
    expected = f"/{route_prefix()}/"
    if mounted.strip("/") != route_prefix():
        return [checks.Error(
            f"deck.urls is included at {mounted!r} but CHOKAQ_DECK['ROUTE_PREFIX'] is {expected!r}: the "
            "Deck's websocket follows the setting",
            hint=f"include it at path({route_prefix() + '/'!r}, include('deck.urls')) or set "
                 f"CHOKAQ_DECK['ROUTE_PREFIX'] = {'/' + mounted.strip('/')!r}",
            id="chokaq.E012",
        )]
    return []


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """chokaq.E004: one error per invalid ``CHOKAQ_DECK`` value."""
    from deck import conf

    return [checks.Error(problem, id="chokaq.E004", hint="Fix settings.CHOKAQ_DECK")
            for problem in conf.settings_problems()]


def register() -> None:
    checks.register(check_settings, "chokaq")
    checks.register(check_asgi_application, "chokaq")
    checks.register(check_url_prefix, "chokaq", checks.Tags.urls)
