"""Spec 04 §8 policy settings: READ_PERMISSION, DESTRUCTIVE_PERMISSION, ALLOW_ANONYMOUS (CHOKAQ_DECK)."""

from __future__ import annotations

from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from django.urls import clear_url_caches

from chokaq_core.models import JobsDLQ, Queues
from deck.consumers import DeckConsumer
from deck.permissions import Role, check_policy, role_of
from tests.deck.conftest import HTMX, Jobs, make_user, run

pytestmark = pytest.mark.django_db


def deck(settings: Any, **policy: Any) -> None:
    settings.CHOKAQ_DECK = {"TICK": 0.05, "READ_INTERVAL": 0.05, "POLL_INTERVAL": 60, **policy}
    check_policy()


def logged_in(user: User | None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def pause(client: Client, queue: str = "main") -> int:
    return client.post(f"/deck/api/queues/{queue}/pause", {"value": "true"}, **HTMX).status_code


def test_defaults_keep_the_three_roles(settings: Any, roles: None) -> None:
    deck(settings)
    nobody = make_user("nobody")
    assert role_of(nobody) == Role.NONE
    assert role_of(make_user("viewer")) == Role.VIEWER
    assert role_of(make_user("operator")) == Role.OPERATOR
    assert role_of(make_user("admin")) == Role.ADMIN
    assert role_of(AnonymousUser()) == Role.NONE
    assert logged_in(nobody).get("/deck/").status_code == 403


def test_read_permission_none_lets_any_authenticated_user_read(settings: Any, roles: None, jobs: Jobs) -> None:
    deck(settings, READ_PERMISSION=None)
    nobody = logged_in(make_user("nobody"))

    assert nobody.get("/deck/").status_code == 200
    assert pause(nobody) == 403  # commands keep their own boundary
    assert logged_in(None).get("/deck/").status_code == 302  # still no anonymous access


def test_callables_decide_read_and_destructive(settings: Any, roles: None, jobs: Jobs) -> None:
    def on_call(user: Any) -> bool:
        return str(user.get_username()).startswith("oncall-")

    deck(settings, READ_PERMISSION=lambda user: user.is_staff or on_call(user), DESTRUCTIVE_PERMISSION=on_call)
    pager = User.objects.create_user("oncall-ann")
    staff = User.objects.create_user("sam", is_staff=True)
    other = User.objects.create_user("olga")

    assert role_of(pager) == Role.OPERATOR and role_of(staff) == Role.VIEWER and role_of(other) == Role.NONE
    assert pause(logged_in(staff)) == 403
    assert not Queues.objects.filter(name="main", is_paused=True).exists()
    assert pause(logged_in(pager)) in (200, 204)
    assert Queues.objects.get(name="main").is_paused
    assert logged_in(other).get("/deck/").status_code == 403


def test_a_codename_policy_and_purges_still_need_the_admin_permission(settings: Any, roles: None,
                                                                       jobs: Jobs) -> None:
    deck(settings, DESTRUCTIVE_PERMISSION="auth.change_user")
    viewer = make_user("viewer")
    assert viewer is not None and role_of(viewer) == Role.VIEWER
    from django.contrib.auth.models import Permission

    viewer.user_permissions.add(Permission.objects.get(codename="change_user"))
    viewer = User.objects.get(pk=viewer.pk)  # fresh permission cache
    assert role_of(viewer) == Role.OPERATOR
    client = logged_in(viewer)
    assert client.post(f"/deck/api/dlq/{jobs.dead}/purge", **HTMX).status_code == 403
    assert JobsDLQ.objects.filter(id=jobs.dead).exists()


def test_destructive_none_shares_the_read_boundary_purges_included(settings: Any, roles: None, jobs: Jobs) -> None:
    deck(settings, DESTRUCTIVE_PERMISSION=None)
    viewer = logged_in(make_user("viewer"))

    assert pause(viewer) in (200, 204)
    response = viewer.post(f"/deck/api/dlq/{jobs.dead}/purge", **HTMX)
    assert response.status_code in (200, 204), response.content
    assert not JobsDLQ.objects.filter(id=jobs.dead).exists()
    assert logged_in(make_user("nobody")).get("/deck/").status_code == 403  # reading still needs view_deck


def test_allow_anonymous_opens_everything(settings: Any, jobs: Jobs) -> None:
    deck(settings, ALLOW_ANONYMOUS=True, READ_PERMISSION=None, DESTRUCTIVE_PERMISSION=None)
    anonymous = logged_in(None)

    assert anonymous.get("/deck/").status_code == 200
    assert pause(anonymous) in (200, 204)
    assert Queues.objects.get(name="main").is_paused

    async def socket() -> None:
        communicator = WebsocketCommunicator(DeckConsumer.as_asgi(), "/ws/deck/")
        communicator.scope["user"] = AnonymousUser()
        connected, _ = await communicator.connect(timeout=5)
        assert connected
        frame = await communicator.receive_from(timeout=5)
        assert 'id="stats-bar"' in frame
        await communicator.disconnect()

    run(socket())


@pytest.mark.parametrize("policy", [
    {"ALLOW_ANONYMOUS": True, "READ_PERMISSION": "deck.view_deck"},
    {"ALLOW_ANONYMOUS": True, "DESTRUCTIVE_PERMISSION": lambda user: True},
    {"ALLOW_ANONYMOUS": "yes"},
    {"READ_PERMISSION": 42},
    {"DESTRUCTIVE_PERMISSION": "operate_deck"},
])
def test_contradictory_or_malformed_policies_are_refused(settings: Any, policy: dict[str, Any]) -> None:
    with pytest.raises(ImproperlyConfigured, match="CHOKAQ_DECK"):
        deck(settings, **policy)


def test_anonymous_socket_is_refused_by_default(settings: Any) -> None:
    deck(settings)

    async def socket() -> None:
        communicator = WebsocketCommunicator(DeckConsumer.as_asgi(), "/ws/deck/")
        communicator.scope["user"] = AnonymousUser()
        await communicator.connect(timeout=5)
        closed = await communicator.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": 4401}

    run(socket())




def test_route_prefix_moves_the_page_its_links_the_api_and_the_socket(settings: Any, roles: None,
                                                                        jobs: Jobs) -> None:
    import importlib

    import config.urls
    from deck import routing

    original = dict(settings.CHOKAQ_DECK)

    def rebuild(deck_settings: dict[str, Any]) -> None:
        settings.CHOKAQ_DECK = deck_settings
        importlib.reload(config.urls)
        importlib.reload(routing)
        clear_url_caches()

    rebuild({**original, "ROUTE_PREFIX": "/ops/jobs"})
    try:
        admin = logged_in(make_user("admin"))
        page = admin.get("/ops/jobs/").content.decode()
        assert 'ws-connect="/ws/ops/jobs/"' in page and 'href="/ops/jobs/?view=archive"' in page
        assert '"/deck/' not in page
        rows = admin.get("/ops/jobs/partials/jobs?view=active", **HTMX).content.decode()
        assert f'hx-post="/ops/jobs/api/jobs/{jobs.pending}/cancel"' in rows
        assert admin.get("/deck/").status_code == 404
        assert pause(admin) == 404  # the old path is gone
        assert admin.post("/ops/jobs/api/queues/main/pause", {"value": "true"}, **HTMX).status_code in (200, 204)
        assert str(routing.websocket_urlpatterns[0].pattern) == "ws/ops/jobs/"
        assert admin.get("/ops/jobs/health/").status_code in (200, 503)
    finally:
        rebuild(original)
    assert logged_in(make_user("admin")).get("/deck/").status_code == 200


@pytest.mark.parametrize("prefix", ["deck", "/", "/de ck", 5])
def test_a_malformed_route_prefix_is_refused(settings: Any, prefix: Any) -> None:
    with pytest.raises(ImproperlyConfigured, match="ROUTE_PREFIX"):
        deck(settings, ROUTE_PREFIX=prefix)
