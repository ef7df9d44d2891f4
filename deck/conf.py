"""The Deck's settings, read from ``settings.CHOKAQ_DECK`` at access time; :data:`DEFAULTS` is the reference
(docs/configuration.md lists every key; system check chokaq.E004 validates them)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # where include("deck.urls") sits; the websocket is /ws/<prefix>/
    "ROUTE_PREFIX": "/deck",
    # who may view / run commands: a "<app_label>.<codename>" permission, a callable (user) -> bool, or None
    "READ_PERMISSION": "deck.view_deck",
    "DESTRUCTIVE_PERMISSION": "deck.operate_deck",
    # everyone, logged in or not, may use the Deck (demos only)
    "ALLOW_ANONYMOUS": False,
    # queue lag colouring, seconds
    "QUEUE_LAG_WARNING_THRESHOLD_SECONDS": 5,
    "QUEUE_LAG_CRITICAL_THRESHOLD_SECONDS": 10,
    # live updates: progress frames at most once per TICK; storage read at most once per READ_INTERVAL and at
    # least once per POLL_INTERVAL (how other processes' work is seen without a cross-process channel layer)
    "TICK": 0.25,
    "POLL_INTERVAL": 1.0,
    "READ_INTERVAL": 1.0,
    # every open websocket's session, active flag and read permission are re-checked at least this often (s);
    # a logout closes its sockets at once regardless
    "REAUTH_INTERVAL": 30.0,
    # failed logins before a lockout, per username and per client address (django-ratelimit rates)
    "LOGIN_FAILURES_PER_USER": "5/5m",
    "LOGIN_FAILURES_PER_ADDRESS": "20/5m",
}


def setting(name: str) -> Any:
    """``CHOKAQ_DECK[name]``, else its default."""
    return (getattr(settings, "CHOKAQ_DECK", None) or {}).get(name, DEFAULTS[name])
