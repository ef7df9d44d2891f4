"""One ``include("deck.urls")`` serves the Deck, its login/logout, health and metrics, whatever the site's
``LOGIN_URL`` and ``LOGIN_REDIRECT_URL`` say."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from tests.deck.conftest import PASSWORD, make_user

ClientAs = Callable[[str], Client]


@pytest.fixture
def elsewhere(settings: Any) -> Any:
    """A site whose own login lives somewhere the Deck knows nothing about."""
    settings.LOGIN_URL = "/accounts/login/"
    settings.LOGIN_REDIRECT_URL = "/accounts/profile/"
    return settings


def test_anonymous_users_go_to_the_decks_login_whatever_login_url_says(elsewhere: Any, roles: None) -> None:
    response = Client().get("/deck/?view=archive")
    assert response.status_code == 302
    assert response["Location"] == "/deck/login/?next=/deck/%3Fview%3Darchive"


def test_a_login_without_next_opens_the_deck(elsewhere: Any, roles: None) -> None:
    user = make_user("viewer")
    assert user is not None
    client = Client()
    response = client.post("/deck/login/", {"username": user.username, "password": PASSWORD})
    assert response.status_code == 302 and response["Location"] == "/deck/"
    assert client.get("/deck/").status_code == 200
    assert client.post("/deck/logout/")["Location"] == "/deck/login/"


@pytest.mark.django_db
def test_health_and_metrics_are_served_by_the_include() -> None:
    client = Client()
    health = client.get("/deck/health/?tags=live")
    assert health.status_code in (200, 503) and "status" in health.json()
    metrics = client.get("/deck/metrics")
    assert metrics.status_code == 200 and metrics["Content-Type"].startswith("text/plain")
    assert b"chokaq_" in metrics.content
