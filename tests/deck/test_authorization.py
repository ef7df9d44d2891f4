"""Authorization matrix: anonymous / no-role / viewer / operator / admin × every endpoint and the websocket.

Hiding a button is not security: every request below is sent directly. Allowed requests must succeed
(2xx on the seeded data), refused ones must be 403 (or the login redirect for an anonymous page view)
and change nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from chokaq_core.models import JobsArchive, JobsDLQ, JobsHot, Queues, Schedules
from tests.deck.conftest import HTMX, Jobs, make_user, run

LEVEL = {"anonymous": 0, "nobody": 0, "viewer": 1, "operator": 2, "admin": 3}
VIEW, OPERATE, ADMIN = 1, 2, 3


@dataclass(frozen=True)
class Endpoint:
    method: str
    url: str  # {pending}, {processing}, {archived}, {dead} are filled from the seeded jobs
    minimum: int
    data: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        return f"{self.method} {self.url}"


ENDPOINTS = [
    Endpoint("GET", "/deck/", VIEW),
    *(Endpoint("GET", f"/deck/partials/{p}", VIEW)
      for p in ("stats", "queues", "chart", "top-errors", "console", "maintenance", "jobs", "recurring")),
    Endpoint("GET", "/deck/?range=24h", VIEW),
    Endpoint("GET", "/deck/?view=dlq", VIEW),
    Endpoint("GET", "/deck/jobs/{dead}", VIEW),
    Endpoint("GET", "/deck/jobs/{dead}/edit", OPERATE),
    Endpoint("POST", "/deck/api/jobs/{pending}/cancel", OPERATE),
    Endpoint("POST", "/deck/api/jobs/{dead}/resurrect", OPERATE),
    Endpoint("POST", "/deck/api/jobs/{dead}/resurrect", OPERATE, (("payload", '{{"n": 2}}'),)),
    Endpoint("POST", "/deck/api/jobs/{pending}/edit", OPERATE, (("payload", '{{"n": 2}}'),)),
    Endpoint("POST", "/deck/api/jobs/{pending}/priority", OPERATE, (("priority", "20"),)),
    Endpoint("POST", "/deck/api/jobs/bulk/cancel", OPERATE, (("ids", "{pending}"),)),
    Endpoint("POST", "/deck/api/jobs/bulk/resurrect", OPERATE, (("ids", "{dead}"),)),
    Endpoint("POST", "/deck/api/jobs/bulk/cancel-matching/preview", OPERATE, (("queue", "main"),)),
    Endpoint("POST", "/deck/api/jobs/bulk/cancel-matching", OPERATE, (("queue", "main"), ("confirm", "CANCEL"))),
    Endpoint("POST", "/deck/api/queues/main/pause", OPERATE, (("value", "1"),)),
    Endpoint("POST", "/deck/api/queues/main/active", OPERATE, (("value", "0"),)),
    Endpoint("POST", "/deck/api/queues/main/zombie-timeout", OPERATE, (("value", "120"),)),
    Endpoint("POST", "/deck/api/queues/main/max-workers", OPERATE, (("value", "3"),)),
    Endpoint("POST", "/deck/api/workers/capacity", OPERATE, (("capacity", "4"),)),
    Endpoint("POST", "/deck/api/circuits/close", OPERATE, (("key", "demo.payment.capture.v1"),)),
    Endpoint("POST", "/deck/api/circuits/open", OPERATE, (("key", "demo.payment.capture.v1"),)),
    Endpoint("POST", "/deck/api/schedules/nightly/enabled", OPERATE, (("value", "0"),)),
    Endpoint("POST", "/deck/api/schedules/nightly/run", OPERATE),
    Endpoint("POST", "/deck/api/archive/{archived}/purge", ADMIN),
    Endpoint("POST", "/deck/api/dlq/{dead}/purge", ADMIN),
    Endpoint("POST", "/deck/api/dlq/purge", ADMIN, (("ids", "{dead}"),)),
    Endpoint("POST", "/deck/api/dlq/bulk/preview", ADMIN, (("queue", "failing"),)),
    Endpoint("POST", "/deck/api/dlq/bulk/purge", ADMIN, (("queue", "failing"), ("confirm", "PURGE"))),
    Endpoint("POST", "/deck/api/dlq/bulk/resurrect", ADMIN, (("queue", "failing"), ("confirm", "REQUEUE"))),
    Endpoint("POST", "/deck/api/maintenance/preview", ADMIN, (("pillar", "dlq"), ("days", "7"))),
    Endpoint("POST", "/deck/api/maintenance/purge-archive", ADMIN, (("days", "30"),)),
    Endpoint("POST", "/deck/api/maintenance/purge-dlq", ADMIN, (("days", "7"),)),
]


@pytest.fixture(autouse=True)
def _worker_control(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Worker control travels over Redis; here it is only recorded (the matrix is about who may send it)."""
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr("chokaq_core.events.send_control", lambda message: sent.append(message) or True)
    return sent


@pytest.fixture(autouse=True)
def _recurring(chokaq_settings: Any) -> None:
    """One recurring job for the Recurring panel's commands."""
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "SCHEDULE": {
        "nightly": {"CRON": "0 3 * * *", "TYPE": "test.ok.v1"}}}


def snapshot() -> tuple[Any, ...]:
    return (sorted(JobsHot.objects.values_list("id", "status", "priority", "payload", "cancel_requested_by")),
            sorted(JobsArchive.objects.values_list("id", flat=True)),
            sorted(JobsDLQ.objects.values_list("id", "payload")),
            sorted(Queues.objects.values_list("name", "is_paused", "is_active", "zombie_timeout_seconds",
                                              "max_workers")),
            sorted(Schedules.objects.values_list("name", "enabled", "last_job_id")))


@pytest.mark.django_db
@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=str)
@pytest.mark.parametrize("role", list(LEVEL))
@pytest.mark.parametrize("htmx", [False, True], ids=["plain", "htmx"])
def test_matrix(client_as: Callable[[str], Client], jobs: Jobs, role: str, endpoint: Endpoint, htmx: bool,
                _worker_control: list[dict[str, Any]]) -> None:
    client = client_as(role) if role != "nobody" else _nobody()
    fill = {"pending": jobs.pending, "processing": jobs.processing, "archived": jobs.archived, "dead": jobs.dead}
    url = endpoint.url.format(**fill)
    data = {k: v.format(**fill) for k, v in endpoint.data}
    before = snapshot()
    extra = HTMX if htmx else {}
    response = client.get(url, **extra) if endpoint.method == "GET" else client.post(url, data, **extra)
    allowed = LEVEL[role] >= endpoint.minimum
    if allowed:
        if "/partials/" in url and not htmx:  # a partial's address opened as a page: the page's own address
            assert response.status_code == 302 and response["Location"].startswith("/deck/")
            return
        assert response.status_code in (200, 204), (response.status_code, response.content[:300])
        return
    if role == "anonymous" and endpoint.method == "GET" and not htmx:
        assert response.status_code == 302 and response["Location"].startswith("/deck/login/?next=")
    else:
        assert response.status_code == 403, response.status_code
        if endpoint.method == "POST":
            assert response.json()["ok"] is False
    assert snapshot() == before
    assert _worker_control == []


def _nobody() -> Client:
    client = Client()
    user = make_user("nobody")
    assert user is not None
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_viewer_page_has_no_operator_controls(client_as: Callable[[str], Client], jobs: Jobs) -> None:
    html = client_as("viewer").get("/deck/").content.decode()
    assert "/deck/api/" not in html and 'class="row-check"' not in html and "bulk-bar" not in html
    inspector = client_as("viewer").get(f"/deck/jobs/{jobs.dead}", **HTMX).content.decode()
    assert "btn-edit" not in inspector and "btn-retry" not in inspector and "btn-delete" not in inspector


@pytest.mark.django_db
def test_operator_page_hides_admin_controls(client_as: Callable[[str], Client], jobs: Jobs) -> None:
    html = client_as("operator").get("/deck/?view=dlq").content.decode()
    assert "bulk-retry" in html and "bulk-purge" not in html and "dlq-bulk-form" not in html
    assert "/deck/api/maintenance/" not in html


@pytest.mark.django_db
def test_forged_post_without_csrf_token_is_refused(roles: None, jobs: Jobs) -> None:
    user = make_user("admin")
    assert user is not None
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    before = snapshot()
    assert client.post(f"/deck/api/jobs/{jobs.pending}/cancel").status_code == 403
    assert client.post("/deck/api/maintenance/purge-dlq", {"days": "1"}).status_code == 403
    assert snapshot() == before


@pytest.mark.django_db
def test_get_on_a_command_is_not_allowed(client_as: Callable[[str], Client], jobs: Jobs) -> None:
    assert client_as("admin").get(f"/deck/api/jobs/{jobs.pending}/cancel").status_code == 405
    assert JobsHot.objects.filter(id=jobs.pending).exists()


# ---------------------------------------------------------------- the websocket, through the real ASGI stack


def _socket(session_cookie: str | None, origin: bytes = b"http://testserver") -> WebsocketCommunicator:
    from config.asgi import application

    headers = [(b"origin", origin), (b"host", b"testserver")]
    if session_cookie:
        headers.append((b"cookie", f"sessionid={session_cookie}".encode()))
    return WebsocketCommunicator(application, "/ws/deck/", headers=headers)


def _session_of(role: str) -> str | None:
    if role == "anonymous":
        return None
    client = Client()
    user = make_user(role)
    assert user is not None
    client.force_login(user)
    return client.cookies["sessionid"].value


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("role, close_code", [("anonymous", 4401), ("nobody", 4403), ("viewer", None),
                                              ("operator", None), ("admin", None)])
def test_websocket_authorization(roles: None, role: str, close_code: int | None) -> None:
    cookie = _session_of(role)

    async def scenario() -> None:
        socket = _socket(cookie)
        connected, _ = await socket.connect(timeout=5)
        assert connected
        if close_code is None:
            frame = await socket.receive_from(timeout=5)
            assert 'id="stats-bar"' in frame
            await socket.send_to(text_data='{"type": "ping"}')
            assert '"pong"' in await _next_json(socket)
        else:
            assert await socket.receive_output(timeout=5) == {"type": "websocket.close", "code": close_code}
        await socket.disconnect()

    run(scenario())
    run(sync_to_async(_close_connections)())


async def _next_json(socket: WebsocketCommunicator) -> str:
    while True:
        frame = await socket.receive_from(timeout=5)
        if frame.startswith("{"):
            return frame


def _close_connections() -> None:
    from django.db import connections

    connections.close_all()


@pytest.mark.django_db(transaction=True)
def test_websocket_from_a_foreign_origin_is_refused(roles: None) -> None:
    cookie = _session_of("admin")

    async def scenario() -> None:
        connected, _ = await _socket(cookie, origin=b"http://evil.example").connect(timeout=5)
        assert not connected

    run(scenario())
