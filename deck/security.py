"""What every Deck response carries and how its login is throttled — with no project configuration.

The Deck is a reusable app installed in three steps, so nothing here needs a middleware, a context processor
or an authentication backend in the project:

* **Content-Security-Policy.** Every Deck view (``deck.urls`` wraps them all with ``deck_response_headers``)
  sets the Deck's own policy, built with Django's CSP support (``django.utils.csp``): scripts and styles only
  from the app's static files (plus Django's nonce when the project runs ``ContentSecurityPolicyMiddleware``;
  the Deck has no inline script or handler to need one), the websocket of its own host, no plugins, no
  framing, forms posting only to itself. A project's ``SECURE_CSP`` middleware leaves a header a view set
  alone, so the Deck's pages keep this policy in any project.
* **Cache-Control: no-store** (Django's ``add_never_cache_headers``) on every Deck page, partial and JSON
  answer: job payloads and errors never land in a shared or disk cache.
* **gzip** (Django's ``gzip_page``) for every Deck answer a client accepts it for: the page, partials and JSON
  shrink several times over, with no project middleware needed.
* **Login throttling** (``ThrottledLoginView``): failed logins are counted per username and per client
  address in Django's cache by django-ratelimit (``CHOKAQ_DECK["LOGIN_FAILURES_PER_USER"]``, default
  ``"5/5m"``; ``["LOGIN_FAILURES_PER_ADDRESS"]``, default ``"20/5m"``; django-ratelimit's rate syntax). Once
  either is reached, further attempts get HTTP 429 with a lockout message and the password is not even
  checked, until the window ends. Successful logins do not count. The counters live in the ``default``
  cache: with several web processes that must be a shared cache (Redis; ``config.settings`` uses
  ``REDIS_URL``). The client address is ``REMOTE_ADDR`` — behind a proxy, the web server must take it from
  the proxy's header (daphne ``--proxy-headers``), and only then.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.middleware.csp import get_nonce
from django.utils.cache import add_never_cache_headers
from django.utils.csp import CSP, LazyNonce, build_policy
from django.views.decorators.gzip import gzip_page
from django_ratelimit.core import get_usage

from deck import conf

LOCKOUT_STATUS = 429


# ---------------------------------------------------------------- Content-Security-Policy and caching


def deck_policy(request: HttpRequest) -> dict[str, list[str]]:
    """The Deck's Content-Security-Policy (``django.utils.csp`` form; ``CSP.NONCE`` becomes Django's nonce)."""
    websocket = ("wss://" if request.is_secure() else "ws://") + request.get_host()
    return {
        "default-src": [CSP.SELF],
        "script-src": [CSP.SELF, CSP.NONCE],
        "style-src": [CSP.SELF, CSP.NONCE],
        "img-src": [CSP.SELF, "data:"],
        "connect-src": [CSP.SELF, websocket],
        "font-src": [CSP.SELF],
        "object-src": [CSP.NONE],
        "base-uri": [CSP.NONE],
        "form-action": [CSP.SELF],
        "frame-ancestors": [CSP.NONE],
    }


def _finish(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    if CSP.HEADER_ENFORCE not in response:
        response.headers[CSP.HEADER_ENFORCE] = build_policy(deck_policy(request), get_nonce(request))
    add_never_cache_headers(response)
    return response


def deck_response_headers(view: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a Deck view: its response carries the Deck's CSP and ``Cache-Control: no-store``, and is gzip
    compressed for a client that accepts it (Django's ``gzip_page``; its GZipMiddleware pads each answer with
    random bytes against BREACH-style length probes, and CSRF tokens are masked per response)."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if get_nonce(request) is None:  # the project runs no CSP middleware: the Deck brings its own nonce
            request._csp_nonce = LazyNonce()  # type: ignore[attr-defined]
        return _finish(request, view(request, *args, **kwargs))

    return gzip_page(wrapped)


# ---------------------------------------------------------------- login throttling


def _username(group: str, request: HttpRequest) -> str:
    return str(request.POST.get("username", "")).strip().casefold()


def _address(group: str, request: HttpRequest) -> str:
    return str(request.META.get("REMOTE_ADDR") or "unknown")


_COUNTERS: tuple[tuple[str, str, Callable[[str, HttpRequest], str]], ...] = (
    ("LOGIN_FAILURES_PER_USER", "deck.login.user", _username),
    ("LOGIN_FAILURES_PER_ADDRESS", "deck.login.address", _address),
)


def _usages(request: HttpRequest, increment: bool) -> list[dict[str, Any]]:
    usages = []
    for setting, group, key in _COUNTERS:
        usage = get_usage(request, group=group, key=key, rate=conf.setting(setting), method="POST",
                          increment=increment)
        if usage is not None:
            usages.append(usage)
    return usages


class ThrottledLoginView(LoginView):
    """Django's LoginView on the Deck's template, with failed attempts throttled per username and address."""

    template_name = "deck/login.html"
    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        locked = [u for u in _usages(request, increment=False) if u["count"] >= u["limit"]]
        if locked:
            wait = max(1, max(u["time_left"] for u in locked))
            minutes = (wait + 59) // 60
            message = (f"Too many failed login attempts for this account or from this address. "
                       f"Try again in {minutes} minute{'s' if minutes != 1 else ''}.")
            context = self.get_context_data(form=self.get_form_class()(request), lockout=message)
            return self.render_to_response(context, status=LOCKOUT_STATUS)
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form: Any) -> HttpResponse:
        _usages(self.request, increment=True)
        return super().form_invalid(form)
