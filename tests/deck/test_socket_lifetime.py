"""A Deck websocket lives only as long as the right to see, and only pages of the Deck's own origin open one.

Sockets go through the real ASGI stack (``config.asgi.application``: the Deck's origin check, session auth,
the consumer) with a session cookie, as a browser tab does. Logging out closes the session's sockets at once
(4401); the periodic re-check (``REAUTH_INTERVAL``, short here) closes a socket whose user was deactivated,
whose session was deleted or whose password changed (4401), or who lost the read permission (4403).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group, User
from django.contrib.sessions.models import Session
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.test import Client

from deck.asgi import origin_allowed
from deck.consumers import Broadcaster
from deck.permissions import Role, check_policy
from tests.deck.conftest import make_user, run

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def reauth_settings(settings: Any) -> Any:
    settings.CHOKAQ_DECK = {"TICK": 0.05, "READ_INTERVAL": 0.05, "POLL_INTERVAL": 60, "REAUTH_INTERVAL": 0.2}
    return settings


@pytest.fixture
def slow_reauth(settings: Any) -> Any:
    """A re-check far away: whatever closes a socket within the test is the logout path."""
    settings.CHOKAQ_DECK = {"TICK": 0.05, "READ_INTERVAL": 0.05, "POLL_INTERVAL": 60, "REAUTH_INTERVAL": 600}
    return settings


def logged_in(role: str) -> tuple[Client, User]:
    user = make_user(role)
    assert user is not None
    client = Client()
    client.force_login(user)
    return client, user


def socket_of(client: Client, origin: str = "http://testserver", host: str = "testserver") -> WebsocketCommunicator:
    from config.asgi import application

    headers = [(b"origin", origin.encode()), (b"host", host.encode()),
               (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]
    return WebsocketCommunicator(application, "/ws/deck/", headers=headers)


async def opened(socket: WebsocketCommunicator) -> None:
    connected, _ = await socket.connect(timeout=5)
    assert connected
    first = await socket.receive_from(timeout=5)
    assert 'id="stats-bar"' in first


async def close_code(socket: WebsocketCommunicator, timeout: float) -> int | None:
    """Drain frames until the server closes the socket: its close code (None if it stayed open)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if socket.output_queue.empty():
            if socket.future.done():
                socket.future.result()
                return None
            await socket.receive_nothing(timeout=0.05)
            continue
        message = await socket.receive_output(timeout=1)
        if message["type"] == "websocket.close":
            return int(message.get("code", 1000))
    return None


def close_db() -> None:
    connections.close_all()


def test_logout_closes_the_sessions_socket_at_once(roles: None, slow_reauth: Any) -> None:
    client, user = logged_in("viewer")
    other_client = Client()
    other_client.force_login(user)  # the same user in another browser: a session of its own

    async def scenario() -> None:
        mine, other = socket_of(client), socket_of(other_client)
        await opened(mine)
        connected, _ = await other.connect(timeout=5)  # joins the running broadcaster: no first frame
        assert connected
        response = await sync_to_async(client.post)("/deck/logout/")
        assert response.status_code == 302
        assert await close_code(mine, timeout=5) == 4401
        assert await close_code(other, timeout=0.5) is None, "another session of the same user stays open"
        await other.disconnect()
        await mine.disconnect()

    run(scenario())
    run(sync_to_async(close_db)())


def deactivate(user: User) -> None:
    User.objects.filter(pk=user.pk).update(is_active=False)


def drop_from_viewers(user: User) -> None:
    user.groups.remove(Group.objects.get(name="Deck viewers"))


def delete_sessions(user: User) -> None:
    Session.objects.all().delete()


def change_password(user: User) -> None:
    fresh = User.objects.get(pk=user.pk)
    fresh.set_password("a-new-password-for-this-test")
    fresh.save()


@pytest.mark.parametrize(("change", "code"), [(deactivate, 4401), (delete_sessions, 4401), (change_password, 4401),
                                              (drop_from_viewers, 4403)])
def test_the_right_to_see_is_rechecked_every_interval(roles: None, reauth_settings: Any, change: Any,
                                                      code: int) -> None:
    client, user = logged_in("viewer")

    async def scenario() -> None:
        socket = socket_of(client)
        await opened(socket)
        assert await close_code(socket, timeout=0.5) is None, "nothing changed yet: the socket stays open"
        await sync_to_async(change)(user)
        assert await close_code(socket, timeout=10) == code
        await socket.disconnect()

    run(scenario())
    run(sync_to_async(close_db)())


def promote(user: User) -> None:
    user.groups.add(Group.objects.get(name="Deck operators"))


def test_a_role_change_takes_effect_without_reconnecting(roles: None, reauth_settings: Any) -> None:
    client, user = logged_in("viewer")

    async def scenario() -> None:
        socket = socket_of(client)
        await opened(socket)
        (consumer,) = Broadcaster.for_running_loop().consumers
        assert consumer.role == Role.VIEWER
        await sync_to_async(promote)(user)
        deadline = time.monotonic() + 10
        while consumer.role != Role.OPERATOR and time.monotonic() < deadline:
            await socket.receive_nothing(timeout=0.1)
        assert consumer.role == Role.OPERATOR
        await socket.disconnect()

    run(scenario())
    run(sync_to_async(close_db)())


def test_a_socket_without_a_session_is_rechecked_by_its_user_row(roles: None, reauth_settings: Any) -> None:
    """A project's own websocket auth (a user in the scope, no session): the user row is re-read."""
    from deck.consumers import DeckConsumer

    user = make_user("viewer")
    assert user is not None

    async def scenario() -> None:
        socket = WebsocketCommunicator(DeckConsumer.as_asgi(), "/ws/deck/")
        socket.scope["user"] = user
        await opened(socket)
        await sync_to_async(deactivate)(user)
        assert await close_code(socket, timeout=10) == 4401
        await socket.disconnect()

    run(scenario())
    run(sync_to_async(close_db)())


@pytest.mark.parametrize("value", [0, -1, "30", True, None])
def test_reauth_interval_must_be_a_positive_number(settings: Any, value: Any) -> None:
    settings.CHOKAQ_DECK = {"REAUTH_INTERVAL": value}
    with pytest.raises(ImproperlyConfigured, match="REAUTH_INTERVAL must be a number of seconds > 0"):
        check_policy()


# ---------------------------------------------------------------- the origin check


def scope(origin: str | None, host: str | None, scheme: str = "ws", **headers: str) -> dict[str, Any]:
    raw = [(b"origin", origin.encode())] if origin is not None else []
    raw += [(b"host", host.encode())] if host is not None else []
    raw += [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    return {"type": "websocket", "scheme": scheme, "headers": raw}


@pytest.mark.parametrize(("origin", "host", "scheme", "allowed"), [
    ("http://127.0.0.1:8000", "127.0.0.1:8000", "ws", True),  # the page's own origin
    ("http://localhost", "localhost", "ws", True),
    ("https://localhost:8443", "localhost:8443", "wss", True),
    ("HTTP://LOCALHOST", "localhost", "ws", True),  # origins compare case-insensitively
    ("http://127.0.0.1:9999", "127.0.0.1:8000", "ws", False),  # another port on the same host
    ("http://127.0.0.1", "127.0.0.1:8000", "ws", False),
    ("https://127.0.0.1:8000", "127.0.0.1:8000", "ws", False),  # another scheme
    ("http://localhost:8443", "localhost:8443", "wss", False),
    ("http://testserver", "127.0.0.1:8000", "ws", False),  # a host in ALLOWED_HOSTS, but not this page's
    ("http://evil.example", "evil.example", "ws", False),  # a Host outside ALLOWED_HOSTS
    ("null", "127.0.0.1:8000", "ws", False),
    ("http://127.0.0.1:notaport", "127.0.0.1:8000", "ws", False),
    (None, "127.0.0.1:8000", "ws", False),  # no Origin at all
    ("http://127.0.0.1:8000", None, "ws", False),  # no Host at all
])
def test_origin_must_be_the_pages_own(settings: Any, origin: str | None, host: str | None, scheme: str,
                                      allowed: bool) -> None:
    settings.ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
    settings.CSRF_TRUSTED_ORIGINS = []
    assert origin_allowed(scope(origin, host, scheme)) is allowed


@pytest.mark.parametrize(("origin", "allowed"), [
    ("https://deck.example.com", True),
    ("https://a.ops.example.com", True),
    ("http://deck.example.com", False),  # trusted origins are exact: scheme included
    ("https://deck.example.com:8443", False),  # ... and port
    ("https://other.example.com", False),
    ("http://a.ops.example.com", False),
])
def test_trusted_origins_are_matched_exactly(settings: Any, origin: str, allowed: bool) -> None:
    """Behind a proxy the socket reaches ``web:8000`` while the page is ``https://deck.example.com``."""
    settings.ALLOWED_HOSTS = ["web"]
    settings.CSRF_TRUSTED_ORIGINS = ["https://deck.example.com", "https://*.ops.example.com"]
    assert origin_allowed(scope(origin, "web:8000")) is allowed


def test_behind_a_tls_proxy_the_forwarded_scheme_counts(settings: Any) -> None:
    settings.ALLOWED_HOSTS = ["deck.example.com"]
    settings.CSRF_TRUSTED_ORIGINS = []
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    assert origin_allowed(scope("https://deck.example.com", "deck.example.com", x_forwarded_proto="https"))
    assert not origin_allowed(scope("https://deck.example.com", "deck.example.com"))


@pytest.mark.parametrize("origin", ["http://127.0.0.1:9999", "http://testserver"])
def test_the_asgi_stack_refuses_another_origin_of_an_allowed_host(roles: None, settings: Any, origin: str) -> None:
    """The page at http://127.0.0.1:8000 is the only origin of that socket (today's finding: any port of an
    allowed host, and ``http://testserver``, were accepted)."""
    settings.ALLOWED_HOSTS = ["127.0.0.1", "testserver"]
    client, _ = logged_in("admin")

    async def scenario() -> None:
        refused, _ = await socket_of(client, origin=origin, host="127.0.0.1:8000").connect(timeout=5)
        assert not refused
        same = socket_of(client, origin="http://127.0.0.1:8000", host="127.0.0.1:8000")
        await opened(same)
        await same.disconnect()

    run(scenario())
    run(sync_to_async(close_db)())
