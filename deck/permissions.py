"""Who may do what on the Deck (ARCHITECTURE §5).

Three permissions of the ``deck`` app, handed out by ``chokaq_roles`` as
groups: *Deck viewers* (``view_deck``), *Deck operators* (+ ``operate_deck``:
cancel, retry/resurrect, edit, pause/resume, queue limits) and *Deck admins*
(+ ``admin_deck``: purges and bulk-by-filter). A superuser has them all.
Every view and the websocket check them server-side; templates only use
them to hide controls.

Spec 04 §8 settings in ``CHOKAQ_DECK`` move the boundaries:

* ``READ_PERMISSION`` (default ``"deck.view_deck"``): a permission codename or a
  callable ``(user) -> bool`` guarding the page, partials, previews and the
  websocket; ``None`` = any authenticated user.
* ``DESTRUCTIVE_PERMISSION`` (default ``"deck.operate_deck"``): the same form,
  for every command; ``None`` = the read boundary, purges included. With a
  permission set, purges and bulk-by-filter also need ``deck.admin_deck``.
* ``ALLOW_ANONYMOUS`` (default False): the demo escape hatch — everyone,
  logged in or not, may do everything. Combined with either permission it is
  a configuration error (``check_policy``, run when the app loads).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import IntEnum
from functools import wraps
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse

from deck import conf

logger = logging.getLogger("chokaq.deck")

VIEW = "deck.view_deck"
OPERATE = "deck.operate_deck"
ADMIN = "deck.admin_deck"

GROUPS: dict[str, tuple[str, ...]] = {
    "Deck viewers": ("view_deck",),
    "Deck operators": ("view_deck", "operate_deck"),
    "Deck admins": ("view_deck", "operate_deck", "admin_deck"),
}


class Role(IntEnum):
    """What a user may do, highest permission wins (each role includes the ones below)."""

    NONE = 0
    VIEWER = 1
    OPERATOR = 2
    ADMIN = 3


Policy = str | Callable[[Any], bool] | None


def _policy(name: str) -> Policy:
    policy: Policy = conf.setting(name)
    return policy


def anonymous_allowed() -> bool:
    return conf.setting("ALLOW_ANONYMOUS") is True


def check_policy() -> None:
    """Spec 04 §8: settings that cannot mean what they say stop the process when the app loads (the same
    :func:`deck.conf.problems` as system check chokaq.E004)."""
    found = conf.settings_problems()
    if found:
        raise ImproperlyConfigured("Invalid CHOKAQ_DECK: " + "; ".join(found))


def _satisfies(user: Any, policy: Policy) -> bool:
    if policy is None:
        return True
    if callable(policy):
        return bool(policy(user))
    return bool(user.has_perm(policy))


def role_of(user: Any) -> Role:
    if anonymous_allowed():
        return Role.ADMIN
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return Role.NONE
    if not _satisfies(user, _policy("READ_PERMISSION")):
        return Role.NONE
    destructive = _policy("DESTRUCTIVE_PERMISSION")
    if destructive is None:
        return Role.ADMIN  # commands share the read boundary
    if _satisfies(user, destructive):
        return Role.ADMIN if user.has_perm(ADMIN) else Role.OPERATOR
    return Role.VIEWER


def actor(user: Any) -> str:
    """The name recorded as ``LastModifiedBy`` and in the operator log (spec 04 §8)."""
    name = user.get_username() if user is not None and getattr(user, "is_authenticated", False) else ""
    return name or "TheDeck Admin"


def refuse(request: HttpRequest, status: int, message: str) -> HttpResponse:
    """A 4xx the Deck's script turns into a toast (JSON body: ``{"ok": false, "error": ...}``)."""
    return JsonResponse({"ok": False, "error": message}, status=status)


def require(minimum: Role) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Guard a view: anonymous full-page GETs go to the login page, anything else is a 403."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            user = request.user
            if not user.is_authenticated and not anonymous_allowed():
                if request.method == "GET" and not request.headers.get("HX-Request"):
                    # the Deck's own login page, whatever the site-wide LOGIN_URL says; auth's views module is
                    # imported here, not with this module: every process loads it for ``check_policy``
                    from django.contrib.auth.views import redirect_to_login

                    return redirect_to_login(request.get_full_path(), login_url=reverse("deck:login"))
                return refuse(request, 403, "Log in to use the Deck.")
            role = role_of(user)
            request.deck_role = role  # type: ignore[attr-defined]
            if role < minimum:
                if request.method == "POST":
                    logger.warning("Rejected %s. User %s does not satisfy the %s policy",
                                   view.__name__, actor(user), minimum.name.lower())
                return refuse(request, 403, f"Permission denied: this needs the Deck {minimum.name.lower()} role.")
            return view(request, *args, **kwargs)

        return guarded

    return decorate
