"""The Deck's settings, read from ``settings.CHOKAQ_DECK`` at access time; :data:`DEFAULTS` is the reference
(docs/configuration.md lists every key); :func:`problems` is their one validation, run by system check chokaq.E004
and when the app loads (``deck.permissions.check_policy``)."""

from __future__ import annotations

import re
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


PREFIX_FORM = re.compile(r"/[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*/?")
SECONDS_SETTINGS = ("TICK", "POLL_INTERVAL", "READ_INTERVAL", "REAUTH_INTERVAL")  # the live side's intervals
RATE_SETTINGS = ("LOGIN_FAILURES_PER_USER", "LOGIN_FAILURES_PER_ADDRESS")  # the login throttle (django-ratelimit)
RATE = re.compile(r"[1-9][0-9]*/([1-9][0-9]*)?[smhd]")


def settings_problems() -> list[str]:
    """:func:`problems` of the project's ``settings.CHOKAQ_DECK`` (unset or None: every default)."""
    deck = getattr(settings, "CHOKAQ_DECK", None)
    return problems({} if deck is None else deck)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def problems(deck: Any) -> list[str]:
    """What is wrong with ``settings.CHOKAQ_DECK`` (spec 05 §1.2, spec 04 §8): one message per bad value."""
    if not isinstance(deck, dict):
        return [f"CHOKAQ_DECK must be a dict (got {type(deck).__name__})"]
    found: list[str] = []
    prefix = deck.get("ROUTE_PREFIX", DEFAULTS["ROUTE_PREFIX"])
    if not isinstance(prefix, str) or not PREFIX_FORM.fullmatch(prefix):
        found.append(f"ROUTE_PREFIX must be a path like '/deck' or '/ops/jobs' (got {prefix!r})")
    for key in ("READ_PERMISSION", "DESTRUCTIVE_PERMISSION"):
        value = deck.get(key, DEFAULTS[key])
        if value is not None and not callable(value) and (
                not isinstance(value, str) or value.count(".") != 1 or not all(value.split("."))):
            found.append(f"{key} must be None, a callable (user) -> bool or '<app_label>.<codename>' (got {value!r})")
    anonymous = deck.get("ALLOW_ANONYMOUS", DEFAULTS["ALLOW_ANONYMOUS"])
    if not isinstance(anonymous, bool):
        found.append(f"ALLOW_ANONYMOUS must be True or False (got {anonymous!r})")
    elif anonymous and (deck.get("READ_PERMISSION") is not None or deck.get("DESTRUCTIVE_PERMISSION") is not None):
        found.append("ALLOW_ANONYMOUS cannot be combined with READ_PERMISSION or DESTRUCTIVE_PERMISSION "
                     "(set them to None, or keep ALLOW_ANONYMOUS False)")
    found += _lag_problems(deck.get("QUEUE_LAG_WARNING_THRESHOLD_SECONDS",
                                    DEFAULTS["QUEUE_LAG_WARNING_THRESHOLD_SECONDS"]),
                           deck.get("QUEUE_LAG_CRITICAL_THRESHOLD_SECONDS",
                                    DEFAULTS["QUEUE_LAG_CRITICAL_THRESHOLD_SECONDS"]))
    for name in SECONDS_SETTINGS:
        value = deck.get(name, DEFAULTS[name])
        if not _number(value) or not value > 0:
            found.append(f"{name} must be a number of seconds > 0 (got {value!r})")
    for name in RATE_SETTINGS:
        value = deck.get(name, DEFAULTS[name])
        if not isinstance(value, str) or not RATE.fullmatch(value):
            found.append(f"{name} must be a rate like '5/5m' (failures per period: s, m, h or d; got {value!r})")
    return found


def _lag_problems(warning: Any, critical: Any) -> list[str]:
    """The queue-lag colouring thresholds: numbers, 0 <= warning < critical."""
    found = [f"{name} must be a number of seconds (got {value!r})"
             for name, value in (("QUEUE_LAG_WARNING_THRESHOLD_SECONDS", warning),
                                 ("QUEUE_LAG_CRITICAL_THRESHOLD_SECONDS", critical)) if not _number(value)]
    if found:
        return found
    if warning < 0:
        found.append(f"QUEUE_LAG_WARNING_THRESHOLD_SECONDS must be >= 0 (got {warning!r})")
    if critical <= warning:
        found.append(f"QUEUE_LAG_CRITICAL_THRESHOLD_SECONDS must be > QUEUE_LAG_WARNING_THRESHOLD_SECONDS "
                     f"(got {critical!r} <= {warning!r})")
    return found
