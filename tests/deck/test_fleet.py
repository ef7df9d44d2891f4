"""The Workers and Circuit breakers panels: read from the worker registry through ``service.fleet_view``,
rendered by ``deck.fragments``, pushed by the broadcaster when the registry changes (spec 04 §2.6)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from chokaq_core import service, storage
from chokaq_core.domain import WorkerInfo
from chokaq_core.models import Workers
from deck.consumers import DeckConsumer
from tests.deck.conftest import HTMX, close_thread_connections, frames_until, make_user, run

ClientAs = Callable[[str], Client]


def circuit(key: str, status: int, failures: int = 0, reset_at: datetime | None = None) -> dict[str, Any]:
    return {"circuitKey": key, "status": status, "failureCount": failures,
            "resetAtUtc": reset_at.isoformat() if reset_at else None}


def worker(worker_id: str, *circuits: dict[str, Any], host: str = "host-a", pid: int = 100, queues: str = "*",
           capacity: int = 4, busy: int = 0) -> None:
    storage.upsert_worker(WorkerInfo(worker_id, host, pid, queues, capacity=capacity, active_count=busy,
                                     circuits_json=json.dumps(list(circuits))))


def age_heartbeat(worker_id: str, seconds: float) -> None:
    Workers.objects.filter(worker_id=worker_id).update(
        last_heartbeat_at=datetime.now(UTC) - timedelta(seconds=seconds))


@pytest.fixture
def viewer(client_as: ClientAs) -> Client:
    return client_as("viewer")


# ---------------------------------------------------------------- aggregation (service)


@pytest.mark.django_db
def test_one_open_and_one_closed_worker_make_the_key_open_with_counts() -> None:
    reset = datetime.now(UTC) + timedelta(seconds=25)
    worker("w-1", circuit("billing.charge.v1", 1, 5, reset), circuit("mail.send.v1", 0, 1))
    worker("w-2", circuit("billing.charge.v1", 0, 2), circuit("mail.send.v1", 2, 3), pid=101)
    view = service.fleet_view()
    by_key = {b.key: b for b in view.breakers}
    charge = by_key["billing.charge.v1"]
    assert (charge.status, charge.open, charge.closed, charge.half_open) == (1, 1, 1, 0)
    assert charge.max_failures == 5 and charge.reset_at == reset
    mail = by_key["mail.send.v1"]
    assert (mail.status, mail.label, mail.half_open, mail.closed, mail.max_failures) == (2, "HalfOpen", 1, 1, 3)
    assert mail.reset_at is None
    assert [b.key for b in view.breakers] == ["billing.charge.v1", "mail.send.v1"]  # worst first


@pytest.mark.django_db
def test_the_latest_reset_time_of_open_workers_wins() -> None:
    soon, later = datetime.now(UTC) + timedelta(seconds=5), datetime.now(UTC) + timedelta(seconds=40)
    worker("w-1", circuit("k", 1, 3, soon))
    worker("w-2", circuit("k", 1, 7, later), pid=2)
    (b,) = service.fleet_view().breakers
    assert (b.open, b.max_failures, b.reset_at) == (2, 7, later)


@pytest.mark.django_db
def test_stale_and_stopped_workers_do_not_count_for_breakers_but_are_listed(settings: Any) -> None:
    worker("w-live", circuit("k", 0))
    worker("w-stale", circuit("k", 1, 9, datetime.now(UTC)), pid=2)
    worker("w-gone", circuit("k", 2), pid=3)
    storage.stop_worker("w-gone")
    age_heartbeat("w-stale", 600)
    view = service.fleet_view()
    assert {w.worker_id: w.state for w in view.workers} == {"w-live": "running", "w-stale": "stale",
                                                            "w-gone": "stopped"}
    (b,) = view.breakers
    assert (b.status, b.closed, b.open, b.half_open) == (0, 1, 0, 0)


@pytest.mark.django_db
def test_malformed_circuit_snapshots_are_ignored() -> None:
    storage.upsert_worker(WorkerInfo("w-bad", "h", 1, "*", 1, 0, circuits_json="not json"))
    storage.upsert_worker(WorkerInfo("w-odd", "h", 2, "*", 1, 0, circuits_json=json.dumps(
        [{"circuitKey": "x", "status": 7}, {"status": 1}, "str", {"circuitKey": "ok", "status": 0,
                                                                 "failureCount": "many", "resetAtUtc": "nope"}])))
    (b,) = service.fleet_view().breakers
    assert (b.key, b.status, b.max_failures) == ("ok", 0, 0)


# ---------------------------------------------------------------- views


def test_views_render_both_panels_with_the_registry(viewer: Client) -> None:
    worker("w-a", circuit("orders.Export", 1, 4, datetime.now(UTC) + timedelta(seconds=30)),
           host="box-1", pid=4242, queues="default,mail", capacity=8, busy=3)
    worker("w-b", circuit("orders.Export", 0, 1), host="box-2", pid=77)
    page = viewer.get("/deck/").content.decode()
    assert 'id="workers-panel"' in page and 'id="breakers-panel"' in page
    html = viewer.get("/deck/partials/workers", **HTMX).content.decode()
    row = re.search(r'<tr class="worker-row[^"]*" data-worker="w-a".*?</tr>', html, re.S)
    assert row is not None
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row.group(0), re.S)]
    assert cells[:6] == ["w-a", "box-1", "4242", "default,mail", "8", "3"]
    assert re.fullmatch(r"\d+s", cells[6]) and cells[7] == "RUNNING"
    html = viewer.get("/deck/partials/breakers", **HTMX).content.decode()
    item = re.search(r'<li class="breaker breaker-open" data-circuit="orders.Export" data-status="1".*?</li>', html,
                     re.S)
    assert item is not None and "Export" in item.group(0)
    assert re.search(r"\d+\.\ds", item.group(0)) and "open 1 · half 0 · closed 1" in item.group(0)
    assert "max failures 4" in item.group(0)


def test_the_full_page_reads_the_worker_registry_once(viewer: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    worker("w-a", host="box-1", capacity=8, busy=3)
    worker("w-b", host="box-2", pid=77, capacity=3, busy=1)
    worker("w-old", host="box-3", pid=78, capacity=50, busy=50)
    age_heartbeat("w-old", 3 * 3600)  # running but stale: on the Workers panel, not in the live totals
    reads: list[None] = []
    real = storage.list_workers

    def counted() -> list[WorkerInfo]:
        reads.append(None)
        return real()

    monkeypatch.setattr(storage, "list_workers", counted)
    page = viewer.get("/deck/").content.decode()
    assert len(reads) == 1
    assert 'data-worker="w-a"' in page and 'data-worker="w-old"' in page
    busy = re.search(r'id="fleet-busy">(.*?)</span>', page, re.S)
    assert busy is not None and busy.group(1) == "(Busy: 4 · 2 live workers)"
    assert 'name="capacity" min="0" max="100" value="11"' in page


def test_an_elapsed_open_circuit_reads_ready(viewer: Client) -> None:
    worker("w-a", circuit("a.b", 1, 4, datetime.now(UTC) - timedelta(seconds=1)))
    assert "READY" in viewer.get("/deck/partials/breakers", **HTMX).content.decode()


def test_empty_states(viewer: Client) -> None:
    html = viewer.get("/deck/partials/breakers", **HTMX).content.decode()
    assert "System Healthy" not in html and "No live worker: circuit breaker state is unknown" in html
    assert "No workers registered" in viewer.get("/deck/partials/workers", **HTMX).content.decode()
    worker("w-quiet")  # a live worker without breakers: still healthy
    assert "System Healthy (No active breakers)" in viewer.get("/deck/partials/breakers", **HTMX).content.decode()


def test_a_stale_heartbeat_is_shown_as_stale(viewer: Client, settings: Any) -> None:
    worker("w-old", circuit("k.v", 1, 2, datetime.now(UTC) + timedelta(seconds=60)))
    worker("w-new", pid=2)
    age_heartbeat("w-old", 31)  # HEALTH.WORKER_HEARTBEAT_TIMEOUT defaults to 30 s
    html = viewer.get("/deck/partials/workers", **HTMX).content.decode()
    old = re.search(r'<tr[^>]*data-worker="w-old"[^>]*data-state="(\w+)".*?</tr>', html, re.S)
    assert old is not None and old.group(1) == "stale" and "STALE" in old.group(0)
    assert 'class="num stale"' in old.group(0)
    assert re.search(r'data-worker="w-new" data-state="running"', html)
    # a stale worker's breakers are not live any more
    assert "System Healthy" in viewer.get("/deck/partials/breakers", **HTMX).content.decode()
    age_heartbeat("w-new", 31)  # every worker stale: no live worker, so never "System Healthy"
    html = viewer.get("/deck/partials/breakers", **HTMX).content.decode()
    assert "System Healthy" not in html and "No live worker" in html


def test_stopped_workers_are_greyed_and_drop_off_later(viewer: Client) -> None:
    worker("w-done")
    storage.stop_worker("w-done")
    html = viewer.get("/deck/partials/workers", **HTMX).content.decode()
    assert 'class="worker-row worker-stopped" data-worker="w-done" data-state="stopped"' in html
    Workers.objects.filter(worker_id="w-done").update(stopped_at=datetime.now(UTC) - timedelta(hours=2))
    assert "w-done" not in viewer.get("/deck/partials/workers", **HTMX).content.decode()


def test_registry_text_is_escaped(viewer: Client) -> None:
    evil = "<script>alert(1)</script>"
    worker(f"w-{evil}", circuit(f"x.{evil}", 1, 1, datetime.now(UTC)), host=evil, queues=evil)
    for panel in ("workers", "breakers"):
        html = viewer.get(f"/deck/partials/{panel}", **HTMX).content.decode()
        assert evil not in html and "&lt;script&gt;" in html
    assert evil not in viewer.get("/deck/").content.decode()


# ---------------------------------------------------------------- authorization


@pytest.mark.parametrize("panel", ["workers", "breakers"])
@pytest.mark.parametrize("role, status", [("anonymous", 403), ("nobody", 403), ("viewer", 200), ("operator", 200),
                                          ("admin", 200)])
def test_panel_authorization(client_as: ClientAs, panel: str, role: str, status: int) -> None:
    worker("w-auth", circuit("k", 1, 1, datetime.now(UTC)))
    response = client_as(role).get(f"/deck/partials/{panel}", **HTMX)
    assert response.status_code == status
    assert ("w-auth" in response.content.decode() or 'data-circuit="k"' in response.content.decode()) == (
        status == 200)


def test_anonymous_page_view_goes_to_the_login(client_as: ClientAs) -> None:
    worker("w-auth")
    response = client_as("anonymous").get("/deck/partials/workers")
    assert response.status_code == 302 and "/deck/login/" in response["Location"]


# ---------------------------------------------------------------- live


def _upsert(*args: Any, **kwargs: Any) -> None:
    try:
        worker(*args, **kwargs)
    finally:
        close_thread_connections()


@pytest.mark.django_db(transaction=True)
def test_a_registry_change_reaches_the_socket(roles: None, settings: Any) -> None:
    settings.CHOKAQ_DECK = {"TICK": 0.05, "READ_INTERVAL": 0.05, "POLL_INTERVAL": 0.2}  # the registry is read once per poll
    user = make_user("viewer")

    async def scenario() -> None:
        socket = WebsocketCommunicator(DeckConsumer.as_asgi(), "/ws/deck/")
        socket.scope["user"] = user
        ok, _ = await socket.connect(timeout=5)
        assert ok
        first, _ = await frames_until(socket, lambda f: 'id="breakers-panel"' in f, timeout=5)
        assert first is not None and "No live worker" in first and 'id="workers-panel"' in first
        await sync_to_async(_upsert)("w-live", circuit("pay.Charge", 1, 6, datetime.now(UTC) + timedelta(seconds=9)),
                                     host="live-host")
        frame, _ = await frames_until(socket, lambda f: 'data-circuit="pay.Charge"' in f, timeout=5)
        assert frame is not None, "the breaker never reached the socket"
        assert 'id="breakers-panel" class="panel breakers-panel" hx-swap-oob="true"' in frame
        assert 'data-status="1"' in frame
        frame, _ = await frames_until(socket, lambda f: 'data-worker="w-live"' in f, timeout=5)
        assert frame is not None or "live-host" in (first or "")
        await sync_to_async(_upsert)("w-live", circuit("pay.Charge", 0, 0), host="live-host")
        frame, _ = await frames_until(socket, lambda f: 'data-circuit="pay.Charge" data-status="0"' in f, timeout=5)
        assert frame is not None, "the breaker closing never reached the socket"
        await socket.disconnect()

    run(scenario())
