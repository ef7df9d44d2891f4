"""Login throttling, the Deck's Content-Security-Policy and no-store caching, and the project's password rules.

None of it needs project configuration: the Deck's views bring their own headers and its login view its own
throttle (failures counted per username and per client address in Django's cache by django-ratelimit).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.password_validation import validate_password
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.test import Client

from deck.permissions import check_policy
from tests.deck.conftest import PASSWORD, Jobs, make_user

DECK = Path(__file__).resolve().parents[2] / "deck"
LOCKOUT = "Too many failed login attempts"


@pytest.fixture(autouse=True)
def fresh_counters() -> Iterator[None]:
    cache.clear()
    yield
    cache.clear()


def attempt(username: str, password: str, address: str = "127.0.0.1") -> Any:
    return Client(REMOTE_ADDR=address).post("/deck/login/", {"username": username, "password": password,
                                                             "next": "/deck/"})


def logged_in(response: Any) -> bool:
    return response.status_code == 302 and "sessionid" in response.cookies


# ---------------------------------------------------------------- login throttling


@pytest.mark.django_db
def test_failed_logins_lock_the_account_out(roles: None) -> None:
    make_user("viewer")
    make_user("operator")
    for _ in range(5):
        response = attempt("viewer-user", "wrong")
        assert response.status_code == 200 and LOCKOUT not in response.content.decode()
    locked = attempt("viewer-user", PASSWORD)  # even the right password: it is not checked any more
    assert locked.status_code == 429
    assert not logged_in(locked)
    body = locked.content.decode()
    assert LOCKOUT in body and "Try again in" in body and 'id="login-lockout"' in body
    assert attempt("VIEWER-USER ", "wrong").status_code == 429  # the same account, however it is typed
    assert logged_in(attempt("operator-user", PASSWORD))  # other accounts are not affected


@pytest.mark.django_db
def test_failed_logins_lock_the_client_address_out(roles: None) -> None:
    make_user("admin")
    for n in range(20):
        assert attempt(f"guess-{n}", "wrong", address="10.0.0.9").status_code == 200
    locked = attempt("admin-user", PASSWORD, address="10.0.0.9")
    assert locked.status_code == 429 and LOCKOUT in locked.content.decode()
    assert logged_in(attempt("admin-user", PASSWORD, address="10.0.0.10"))


@pytest.mark.django_db
def test_successful_logins_do_not_count(roles: None) -> None:
    make_user("viewer")
    for _ in range(25):
        assert logged_in(attempt("viewer-user", PASSWORD))


@pytest.mark.django_db
def test_the_lockout_ends_with_its_window(roles: None, settings: Any) -> None:
    settings.CHOKAQ_DECK = {"LOGIN_FAILURES_PER_USER": "2/2s"}
    make_user("viewer")
    assert attempt("viewer-user", "wrong").status_code == 200
    assert attempt("viewer-user", "wrong").status_code == 200
    assert attempt("viewer-user", PASSWORD).status_code == 429
    time.sleep(2.5)  # the fixed window of 2 s has ended
    assert logged_in(attempt("viewer-user", PASSWORD))


@pytest.mark.parametrize(("name", "value"), [("LOGIN_FAILURES_PER_USER", "five"),
                                             ("LOGIN_FAILURES_PER_USER", "0/m"),
                                             ("LOGIN_FAILURES_PER_ADDRESS", 20),
                                             ("LOGIN_FAILURES_PER_ADDRESS", "20/5w")])
def test_throttle_settings_are_checked(settings: Any, name: str, value: Any) -> None:
    settings.CHOKAQ_DECK = {name: value}
    with pytest.raises(ImproperlyConfigured, match=f"{name} must be a rate like '5/5m'"):
        check_policy()


# ---------------------------------------------------------------- password rules


def test_the_project_uses_djangos_password_validators(settings: Any) -> None:
    names = [v["NAME"].rsplit(".", 1)[1] for v in settings.AUTH_PASSWORD_VALIDATORS]
    assert names == ["UserAttributeSimilarityValidator", "MinimumLengthValidator", "CommonPasswordValidator",
                     "NumericPasswordValidator"]
    for weak in ("password", "12345678", "short"):
        with pytest.raises(ValidationError):
            validate_password(weak)
    validate_password("correct horse battery staple 42")


# ---------------------------------------------------------------- CSP and caching on every Deck response


def deck_responses(client_as: Callable[[str], Client], jobs: Jobs) -> dict[str, Any]:
    viewer, admin, anonymous = client_as("viewer"), client_as("admin"), Client()
    return {
        "login page": anonymous.get("/deck/login/"),
        "redirect to login": anonymous.get("/deck/"),
        "page": viewer.get("/deck/"),
        "partial": viewer.get("/deck/partials/stats", HTTP_HX_REQUEST="true"),
        "inspector": viewer.get(f"/deck/jobs/{jobs.dead}", HTTP_HX_REQUEST="true"),
        "editor": admin.get(f"/deck/jobs/{jobs.dead}/edit", HTTP_HX_REQUEST="true"),
        "refused command": viewer.post(f"/deck/api/jobs/{jobs.pending}/cancel", HTTP_HX_REQUEST="true"),
    }


@pytest.mark.django_db
def test_every_deck_response_carries_the_csp_and_no_store(client_as: Callable[[str], Client], jobs: Jobs) -> None:
    for name, response in deck_responses(client_as, jobs).items():
        assert response.status_code in (200, 302, 403), (name, response.status_code)
        assert "no-store" in response.headers.get("Cache-Control", ""), name
        policy = dict(d.strip().split(" ", 1) for d in response.headers["Content-Security-Policy"].split(";"))
        assert policy["script-src"] == "'self'", (name, policy)  # no inline script, no eval, no other host
        assert policy["style-src"] == "'self'", (name, policy)
        assert policy["default-src"] == "'self'" and policy["object-src"] == "'none'"
        assert policy["frame-ancestors"] == "'none'" and policy["base-uri"] == "'none'"
        assert policy["connect-src"] == "'self' ws://testserver", (name, policy)


@pytest.mark.django_db
def test_a_project_csp_does_not_replace_the_decks(client_as: Callable[[str], Client], jobs: Jobs,
                                                  settings: Any) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.middleware.csp.ContentSecurityPolicyMiddleware"]
    settings.SECURE_CSP = {"default-src": ["'self'", "https://cdn.example"], "script-src": ["'unsafe-inline'"]}
    deck_page = client_as("viewer").get("/deck/")
    assert "unsafe-inline" not in deck_page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in deck_page.headers["Content-Security-Policy"]
    other_page = Client().get("/admin/login/")  # the project's own pages keep the project's policy
    assert "https://cdn.example" in other_page.headers["Content-Security-Policy"]


INLINE_HANDLER = re.compile(r"<[^>]+\son[a-z]+\s*=", re.IGNORECASE)
INLINE_SCRIPT = re.compile(r"<script(?![^>]*\ssrc=)[^>]*>", re.IGNORECASE)
STYLE_ATTRIBUTE = re.compile(r"<[^>]+\sstyle\s*=", re.IGNORECASE)
EVAL_FILTER = re.compile(r"hx-trigger=\"[^\"]*\[|hx-on|hx-vals=['\"]\s*js:|javascript:", re.IGNORECASE)


@pytest.mark.django_db
def test_rendered_deck_pages_have_nothing_the_policy_would_block(client_as: Callable[[str], Client],
                                                                 jobs: Jobs) -> None:
    for name, response in deck_responses(client_as, jobs).items():
        html = response.content.decode()
        for pattern in (INLINE_HANDLER, INLINE_SCRIPT, STYLE_ATTRIBUTE, EVAL_FILTER):
            assert not pattern.search(html), (name, pattern.pattern, pattern.search(html))


def test_templates_and_script_have_no_inline_handlers_or_eval() -> None:
    sources = [*sorted((DECK / "templates" / "deck").glob("*.html")), DECK / "fragments.py"]
    for path in sources:
        text = path.read_text()
        for pattern in (INLINE_HANDLER, INLINE_SCRIPT, STYLE_ATTRIBUTE, EVAL_FILTER):
            assert not pattern.search(text), (path.name, pattern.search(text))
    script = (DECK / "static" / "deck" / "deck.js").read_text()
    assert not re.search(r"\beval\(|new Function|setAttribute\(\s*['\"]on|\.on[a-z]+\s*=\s*['\"]", script)
    assert not re.search(r"""['"]<[^'"]*\son[a-z]+=""", script), "no HTML strings with inline handlers"
