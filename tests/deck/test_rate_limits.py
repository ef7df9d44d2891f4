"""The Deck's rate-limit panel: each limit with its use, changed, paused or lifted by an operator (audited)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from chokaq_core import enqueue, service, storage
from chokaq_core.domain import RateLimit, parse_rate
from chokaq_core.models import RateBuckets
from deck.models import OperatorAction
from tests.deck.conftest import HTMX

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def operator(client_as: Callable[[str], Client]) -> Client:
    return client_as("operator")


def declare(name: str = "type:tests.ok.v1", rate: str = "100/m") -> None:
    storage.declare_rate_limits([RateLimit(name, parse_rate(rate))])


def test_the_panel_shows_each_limit_with_its_use(operator: Client) -> None:
    declare("type:tests.ok.v1", "100/m burst 90")
    for n in range(5):
        enqueue("tests.ok.v1", {"n": n}, allow_unregistered=True)
    limits = [RateLimit("type:tests.ok.v1", parse_rate("100/m burst 90"))]
    long_ago = timezone.now() - timedelta(hours=1)  # as if it had been idle long enough to save up its burst
    RateBuckets.objects.create(limit_name="type:tests.ok.v1", rate_key="", tokens=90, refilled_at=timezone.now(),
                               window_started_at=long_ago, window_used=0)
    claimed = storage.fetch_batch("w1", 10, None, limits)
    assert len(storage.mark_processing_batch(claimed, "w1", limits)) == 5, "the lease spends the tokens"

    body = operator.get("/deck/partials/rate-limits", **HTMX).content.decode()

    assert 'id="rate-limits-panel"' in body and "type:tests.ok.v1" in body
    assert "5/100" in body, "use this window / the count"


def test_an_operator_sets_pauses_and_lifts_a_limit_and_each_change_is_audited(operator: Client) -> None:
    declare()
    assert operator.post("/deck/api/rate-limits/type:tests.ok.v1/rate", {"value": "10/s"}, **HTMX).status_code == 204
    assert {s.name: s.rate for s in service.rate_limits()}["type:tests.ok.v1"] == parse_rate("10/s")
    assert operator.post("/deck/api/rate-limits/type:tests.ok.v1/pause", **HTMX).status_code == 204
    assert {s.name: s.rate for s in service.rate_limits()}["type:tests.ok.v1"].count == 0  # type: ignore[union-attr]
    assert operator.post("/deck/api/rate-limits/type:tests.ok.v1/lift", **HTMX).status_code == 204
    assert {s.name: s.rate for s in service.rate_limits()}["type:tests.ok.v1"] is None
    assert operator.post("/deck/api/rate-limits/type:tests.ok.v1/rate", {"value": ""}, **HTMX).status_code == 204
    state = {s.name: s for s in service.rate_limits()}["type:tests.ok.v1"]
    assert state.rate == parse_rate("100/m") and state.updated_by == "operator-user", "back to the declared rate"
    assert operator.post("/deck/api/rate-limits", {"name": "queue:mail", "value": "5/s"}, **HTMX).status_code == 204

    audited = list(OperatorAction.objects.order_by("id").values_list("command", "scope"))
    assert audited == [("set_rate_limit", "type:tests.ok.v1"), ("pause_rate_limit", "type:tests.ok.v1"),
                       ("lift_rate_limit", "type:tests.ok.v1"), ("set_rate_limit", "type:tests.ok.v1"),
                       ("set_rate_limit", "queue:mail")]


@pytest.mark.parametrize(("url", "data", "error"), [
    ("/deck/api/rate-limits/type:tests.ok.v1/rate", {"value": "ten per minute"}, "does not parse"),
    ("/deck/api/rate-limits/type:tests.ok.v1/rate", {"value": "10/0s"}, "window must be > 0"),
    ("/deck/api/rate-limits/type:tests.ok.v1/rate", {"value": "-5/m"}, "count"),
    ("/deck/api/rate-limits/host:x/rate", {"value": "5/m"}, "queue or a type"),
    ("/deck/api/rate-limits", {"name": "", "value": "5/m"}, "queue or a type"),
])
def test_a_bad_limit_is_refused_with_its_reason_and_nothing_changes(operator: Client, url: str, data: dict[str, str],
                                                                    error: str) -> None:
    declare()
    response = operator.post(url, data, **HTMX)
    assert response.status_code == 400 and error in response.content.decode()
    assert [(s.name, s.rate) for s in service.rate_limits()] == [("type:tests.ok.v1", parse_rate("100/m"))]


def test_a_viewer_cannot_change_a_limit(client_as: Callable[[str], Client]) -> None:
    declare()
    assert client_as("viewer").post("/deck/api/rate-limits/type:tests.ok.v1/pause", **HTMX).status_code == 403
    assert service.rate_limits()[0].rate == parse_rate("100/m")


def test_the_inspector_says_which_limit_holds_a_pending_job(operator: Client) -> None:
    declare("type:tests.ok.v1", "0/m")
    job_id = enqueue("tests.ok.v1", {}, allow_unregistered=True)

    body = operator.get(f"/deck/jobs/{job_id}", **HTMX).content.decode()

    assert "held by rate limit type:tests.ok.v1 (paused)" in body
