"""The Deck's rate-limit panel: each limit with its use, changed, paused or lifted by an operator (audited)."""

from __future__ import annotations

import getpass
import io
import re
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from chokaq_core import enqueue, service, storage
from chokaq_core.domain import RateLimit, parse_rate
from chokaq_core.models import RateBuckets
from deck import fragments
from deck.models import OperatorAction
from deck.permissions import Role
from tests.deck.conftest import HTMX, archived

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


def test_the_inspector_says_until_when_an_empty_bucket_holds_a_pending_job(operator: Client) -> None:
    storage.declare_rate_limits([RateLimit("queue:rl-held", parse_rate("1/h burst 1"), per_key=True)])
    spent = timezone.now()
    RateBuckets.objects.create(limit_name="queue:rl-held", rate_key="tenant:a", tokens=0.0, refilled_at=spent,
                               window_started_at=spent, window_used=1)
    held = enqueue("tests.ok.v1", {}, queue="rl-held", rate_key="tenant:a", allow_unregistered=True)
    free = enqueue("tests.ok.v1", {}, queue="rl-held", rate_key="tenant:b", allow_unregistered=True)

    body = operator.get(f"/deck/jobs/{held}", **HTMX).content.decode()

    until = re.search(r"held by rate limit queue:rl-held \(tenant:a\) until (\d\d:\d\d:\d\d) UTC", body)
    assert until is not None, "the inspector names the limit, the key and when its next token comes"
    next_token = spent + timedelta(hours=1)
    assert until[1] in {f"{next_token:%H:%M:%S}", f"{next_token - timedelta(microseconds=1):%H:%M:%S}"}
    assert "held by rate limit" not in operator.get(f"/deck/jobs/{free}", **HTMX).content.decode()


@pytest.mark.parametrize("url", ["/deck/", "/deck/partials/queues"])
def test_the_queues_panel_shows_a_limited_queue_with_its_use_and_an_unlimited_one_without(
        operator: Client, url: str) -> None:
    storage.declare_rate_limits([RateLimit("queue:mail", parse_rate("100/m")), RateLimit("queue:held", parse_rate("0/m"))])
    for queue in ("mail", "mail", "mail", "held", "plain"):
        enqueue("tests.ok.v1", {}, queue=queue, allow_unregistered=True)
    limits = [state.limit for state in service.rate_limits() if state.limit is not None]
    claimed = storage.fetch_batch("w1", 10, None, limits)
    assert not [job for job in claimed if job.queue == "held"], "held is paused"
    leased = storage.mark_processing_batch(claimed, "w1", limits)  # the lease spends the tokens
    used = sum(1 for job in claimed if job.queue == "mail" and job.id in leased)
    assert used, "mail started within its limit"
    anchor = _limit_row_id(operator, "queue:mail")

    cells = _rate_cells(operator.get(url, **HTMX).content.decode(), r'<tr id="queue-\d+"[^>]*data-queue="([^"]+)">')

    assert re.sub(r"<[^>]+>", "", cells["mail"]) == f"{used}/100 per 1m"
    assert f'href="#{anchor}"' in cells["mail"], "links to the limit's row in the rate-limits panel"
    assert re.sub(r"<[^>]+>", "", cells["held"]) == "paused" and "badge-warning" in cells["held"]
    assert cells["plain"] == "—"


def test_a_pushed_queues_panel_leaves_its_rate_cells_to_the_rate_limits_panel() -> None:
    """A push reads no limits: its cells are empty, named, for deck.js to fill from the rate-limits rows' use."""
    declare("queue:mail", "100/m")
    enqueue("tests.ok.v1", {}, queue="mail", allow_unregistered=True)

    cells = _rate_cells(fragments.queues(service.queue_overview(), Role.OPERATOR, oob=True),
                        r'<tr id="queue-\d+"[^>]*data-queue="([^"]+)">', whole=True)

    assert cells["mail"] == '<td class="rate-cell" data-rate-for="queue:mail"></td>'


def test_the_types_table_shows_a_limited_type_with_its_use(operator: Client) -> None:
    declare("type:tests.ok.v1", "30/s")
    archived("done", 2, type="tests.ok.v1")
    archived("done", 1, type="tests.other.v1")
    anchor = _limit_row_id(operator, "type:tests.ok.v1")

    cells = _rate_cells(operator.get("/deck/?range=1h").content.decode(), r'<tr data-type="([^"]+)">')

    assert re.sub(r"<[^>]+>", "", cells["tests.ok.v1"]) == "0/30 per 1s"
    assert f'href="#{anchor}"' in cells["tests.ok.v1"]
    assert cells["tests.other.v1"] == "—"
    partial = operator.get("/deck/partials/chart?range=1h", **HTMX).content.decode()
    assert '<td class="rate-cell" data-rate-for="type:tests.ok.v1"></td>' in partial, "deck.js fills a re-fetch"


def test_each_rate_limit_row_carries_the_use_its_queue_or_type_rows_show(operator: Client) -> None:
    storage.declare_rate_limits([RateLimit("queue:mail", parse_rate("10/5m burst 3")),
                                 RateLimit("type:tests.ok.v1", parse_rate("1000/h"))])
    service.lift_rate_limit("type:tests.ok.v1", actor="test")
    body = operator.get("/deck/partials/rate-limits", **HTMX).content.decode()
    uses = dict(re.findall(r'data-limit="([^"]+)" data-use="([^"]*)"', body))
    assert uses == {"queue:mail": "0/10 per 5m", "type:tests.ok.v1": ""}


def test_a_shell_change_is_audited_as_the_same_change_from_the_deck(operator: Client) -> None:
    declare("queue:mail", "100/m")
    assert operator.post("/deck/api/rate-limits/queue:mail/rate", {"value": "50/m"}, **HTMX).status_code == 204
    call_command("chokaq_queue", "set", "mail", "--rate", "50/m")
    call_command("chokaq_queue", "set", "--type", "tests.ok.v1", "--rate", "none")

    deck, shell, lifted = OperatorAction.objects.order_by("id").values("actor", "command", "scope", "message")
    assert deck == {**shell, "actor": "operator-user"}
    assert shell == {"actor": f"shell:{getpass.getuser()}", "command": "set_rate_limit", "scope": "queue:mail",
                     "message": "Rate limit queue:mail: set to 50/m (in force: 50/m)"}
    assert lifted["command"] == "lift_rate_limit" and lifted["scope"] == "type:tests.ok.v1"
    console = operator.get("/deck/partials/console", **HTMX).content.decode()
    assert "Rate limit type:tests.ok.v1: lifted (in force: none)" in console, "the Deck's console lists it"


def _limit_row_id(client: Client, name: str) -> str:
    """The id of limit ``name``'s row in the rate-limits panel."""
    body = client.get("/deck/partials/rate-limits", **HTMX).content.decode()
    row = re.search(rf'<tr id="(rate-limit-\d+)"[^>]*data-limit="{re.escape(name)}"', body)
    assert row is not None, name
    return row[1]


def _rate_cells(body: str, row: str, whole: bool = False) -> dict[str, str]:
    """Each row's rate cell (its inner html, or the whole cell), by the key ``row``'s group captures."""
    rows = re.findall(row + r"(.*?)</tr>", body, re.S)
    return {key: m[0] if whole else m[1] for key, inner in rows
            if (m := re.search(r'<td class="rate-cell"[^>]*>(.*?)</td>', inner, re.S))}


def test_each_queue_change_from_the_shell_is_audited_as_the_same_change_from_the_deck(operator: Client) -> None:
    """Pause, resume, hide, show, max workers and zombie timeout: one entry per change from either door, in the
    same command name, scope and wording; only the actor differs."""
    storage.set_queue_paused("mail", False)
    changes = [  # (Deck address, form value, the same change as shell arguments)
        ("pause", "1", ["pause", "mail"]),
        ("pause", "0", ["resume", "mail"]),
        ("active", "0", ["hide", "mail"]),
        ("active", "1", ["show", "mail"]),
        ("max-workers", "3", ["set", "mail", "--max-workers", "3"]),
        ("max-workers", "", ["set", "mail", "--max-workers", "none"]),
        ("zombie-timeout", "600", ["set", "mail", "--zombie-timeout", "600"]),
        ("zombie-timeout", "", ["set", "mail", "--zombie-timeout", "none"]),
    ]
    for address, value, shell in changes:
        assert operator.post(f"/deck/api/queues/mail/{address}", {"value": value}, **HTMX).status_code == 204
        call_command("chokaq_queue", *shell, stdout=io.StringIO())

    entries = list(OperatorAction.objects.order_by("id").values("actor", "command", "scope", "message"))
    deck, shell_entries = entries[0::2], entries[1::2]
    assert [e["actor"] for e in deck] == ["operator-user"] * len(changes)
    assert [e["actor"] for e in shell_entries] == [f"shell:{getpass.getuser()}"] * len(changes)
    assert [{**e, "actor": ""} for e in deck] == [{**e, "actor": ""} for e in shell_entries]
    assert [(e["command"], e["message"]) for e in shell_entries] == [
        ("set_queue_paused", "Queue mail: paused"), ("set_queue_paused", "Queue mail: resumed"),
        ("set_queue_active", "Queue mail: hidden (paused)"), ("set_queue_active", "Queue mail: shown (paused)"),
        ("set_queue_max_workers", "Queue mail: max workers 3"),
        ("set_queue_max_workers", "Queue mail: max workers unlimited"),
        ("set_queue_zombie_timeout", "Queue mail: zombie timeout 600s"),
        ("set_queue_zombie_timeout", "Queue mail: zombie timeout cleared (global)"),
    ]
    assert {e["scope"] for e in entries} == {"mail"}
