"""Circuit breakers in the Deck: the full type key, and the operator's audited reset / open-now commands."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client

from deck.models import OperatorAction
from tests.deck.conftest import HTMX
from tests.deck.test_fleet import circuit, worker

pytestmark = pytest.mark.django_db
KEY = "demo.payment.capture.v1"


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Worker control travels over Redis; here it is recorded."""
    messages: list[dict[str, Any]] = []
    monkeypatch.setattr("chokaq_core.events.send_control", lambda message: messages.append(message) or True)
    return messages


def test_the_panel_shows_the_full_type_key_not_its_last_segment(client_as: Callable[[str], Client]) -> None:
    worker("w-a", circuit(KEY, 1, 5, datetime.now(UTC) + timedelta(seconds=20)), circuit("demo.email.v1", 0))
    html = client_as("viewer").get("/deck/partials/breakers", **HTMX).content.decode()
    names = re.findall(r'<span class="name" data-role="circuit-key">([^<]*)</span>', html)
    assert sorted(names) == ["demo.email.v1", KEY]
    assert "circuit-close" not in html and "RESET" not in html  # a viewer sees no commands


def test_an_operator_sees_reset_on_an_open_breaker_and_open_now_on_a_closed_one(
        client_as: Callable[[str], Client]) -> None:
    worker("w-a", circuit(KEY, 1, 5, datetime.now(UTC) + timedelta(seconds=20)), circuit("demo.email.v1", 0))
    html = client_as("operator").get("/deck/partials/breakers", **HTMX).content.decode()
    open_item = re.search(rf'<li class="breaker breaker-open" data-circuit="{KEY}".*?</li>', html, re.S)
    closed_item = re.search(r'<li class="breaker breaker-closed" data-circuit="demo.email.v1".*?</li>', html, re.S)
    assert open_item is not None and closed_item is not None
    assert f'name="key" value="{KEY}" hx-post="/deck/api/circuits/close"' in open_item.group(0)
    assert "/deck/api/circuits/open" not in open_item.group(0)
    assert 'name="key" value="demo.email.v1" hx-post="/deck/api/circuits/open"' in closed_item.group(0)
    assert "/deck/api/circuits/close" not in closed_item.group(0)


@pytest.mark.parametrize("action, state", [("close", "closed"), ("open", "open")])
def test_a_circuit_command_reaches_every_worker_and_is_audited(client_as: Callable[[str], Client],
                                                               sent: list[dict[str, Any]], action: str,
                                                               state: str) -> None:
    answer = client_as("operator").post(f"/deck/api/circuits/{action}", {"key": KEY})
    assert answer.status_code == 200 and answer.json()["ok"] is True
    assert sent == [{"type": "worker.set_circuit", "key": KEY, "state": state, "workerId": None}]
    entry = OperatorAction.objects.get(command=f"{action}_circuit")
    assert entry.scope == KEY and entry.actor == "operator-user" and KEY in entry.message


def test_a_viewer_cannot_send_a_circuit_command(client_as: Callable[[str], Client],
                                                sent: list[dict[str, Any]]) -> None:
    assert client_as("viewer").post("/deck/api/circuits/close", {"key": KEY}).status_code == 403
    assert sent == [] and not OperatorAction.objects.exists()


@pytest.mark.parametrize("data, text", [({}, "Circuit key is required"), ({"key": "a b/../c"}, "circuit key"),
                                        ({"key": "x" * 300}, "Circuit key is too long")])
def test_a_bad_circuit_key_is_a_400_and_sends_nothing(client_as: Callable[[str], Client],
                                                      sent: list[dict[str, Any]], data: dict[str, str],
                                                      text: str) -> None:
    answer = client_as("operator").post("/deck/api/circuits/open", data)
    assert answer.status_code == 400 and text.lower() in answer.json()["error"].lower(), answer.json()
    assert sent == []


def test_without_a_cross_process_layer_the_command_says_nothing_was_sent(client_as: Callable[[str], Client],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("chokaq_core.events.send_control", lambda message: False)
    answer = client_as("operator").post("/deck/api/circuits/close", {"key": KEY})
    assert answer.status_code == 400 and "nothing was sent" in answer.json()["error"]
