"""``chokaq_queue``: pause/resume/hide/show/set with validated limits (spec 04 §6 ranges)."""

from __future__ import annotations

import getpass
import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from chokaq_core.models import Queues

pytestmark = pytest.mark.django_db


def state(name: str) -> Queues:
    return Queues.objects.get(name=name)


def test_pause_resume_creates_and_updates_the_row() -> None:
    call_command("chokaq_queue", "pause", "emails")
    assert state("emails").is_paused and state("emails").is_active
    call_command("chokaq_queue", "resume", "emails")
    assert not state("emails").is_paused


def test_hide_and_show_leave_the_queue_paused() -> None:
    call_command("chokaq_queue", "resume", "reports")
    call_command("chokaq_queue", "hide", "reports")
    assert not state("reports").is_active and state("reports").is_paused
    call_command("chokaq_queue", "show", "reports")
    assert state("reports").is_active and state("reports").is_paused


def test_list_names_each_setting_as_the_queue_row_does() -> None:
    call_command("chokaq_queue", "pause", "lister")
    call_command("chokaq_queue", "hide", "lister")
    out = io.StringIO()
    call_command("chokaq_queue", "list", stdout=out)
    [line] = [row for row in out.getvalue().splitlines() if row.startswith("lister\t")]
    assert line.split("\t")[1:] == ["paused=True", "active=False", "max_workers=-", "zombie_timeout=-"]


def test_hide_unknown_queue_is_an_error() -> None:
    with pytest.raises(CommandError, match="does not exist"):
        call_command("chokaq_queue", "hide", "nope")
    assert not Queues.objects.filter(name="nope").exists()


def test_set_limits_and_clear_them() -> None:
    call_command("chokaq_queue", "set", "q1", "--max-workers", "3", "--zombie-timeout", "120")
    assert (state("q1").max_workers, state("q1").zombie_timeout_seconds) == (3, 120)
    call_command("chokaq_queue", "set", "q1", "--max-workers", "none")
    assert state("q1").max_workers is None and state("q1").zombie_timeout_seconds == 120


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-workers", "0"], "max workers must be within 1-10000, got 0"),
        (["--max-workers", "10001"], "max workers must be within 1-10000"),
        (["--max-workers", "lots"], "max workers must be a whole number"),
        (["--zombie-timeout", "86401"], "zombie timeout must be within 1-86400"),
        ([], "set needs --max-workers"),
    ],
)
def test_out_of_range_limits_are_refused_and_nothing_changes(args: list[str], message: str) -> None:
    call_command("chokaq_queue", "set", "q2", "--max-workers", "5")
    with pytest.raises(CommandError, match=message):
        call_command("chokaq_queue", "set", "q2", *args)
    assert state("q2").max_workers == 5


def test_blank_queue_name_is_refused() -> None:
    with pytest.raises(CommandError, match="queue name must be 1-255 characters"):
        call_command("chokaq_queue", "pause", "   ")


def test_set_rate_sets_pauses_lifts_and_resets_a_queue_or_type_limit() -> None:
    from chokaq_core import service
    from chokaq_core.domain import parse_rate

    def rate(name: str) -> object:
        return {s.name: s for s in service.rate_limits()}[name].rate

    out = io.StringIO()
    call_command("chokaq_queue", "set", "emails", "--rate", "100/m", stdout=out)
    assert rate("queue:emails") == parse_rate("100/m") and "rate limit queue:emails: 100/m" in out.getvalue()
    call_command("chokaq_queue", "set", "--type", "Pay.Capture.v1", "--rate", "0/m")
    assert rate("type:pay.capture.v1") == parse_rate("0/m")
    call_command("chokaq_queue", "set", "emails", "--rate", "none")
    assert rate("queue:emails") is None
    call_command("chokaq_queue", "set", "emails", "--rate", "reset")
    assert rate("queue:emails") is None, "nothing declared to return to"
    listed = io.StringIO()
    call_command("chokaq_queue", "list", stdout=listed)
    assert "type:pay.capture.v1\trate=0/m\tused=0/0" in listed.getvalue()
    assert {s.name: s for s in service.rate_limits()}["queue:emails"].updated_by == f"shell:{getpass.getuser()}"


def test_each_rate_change_from_the_shell_is_in_the_decks_audit_log() -> None:
    from deck.models import OperatorAction

    call_command("chokaq_queue", "set", "emails", "--rate", "100/m", stdout=io.StringIO())
    call_command("chokaq_queue", "set", "--type", "Pay.Capture.v1", "--rate", "0/m", stdout=io.StringIO())
    call_command("chokaq_queue", "set", "emails", "--rate", "none", stdout=io.StringIO())
    call_command("chokaq_queue", "set", "emails", "--rate", "reset", stdout=io.StringIO())
    with pytest.raises(CommandError):
        call_command("chokaq_queue", "set", "emails", "--rate", "lots")

    entries = list(OperatorAction.objects.order_by("id").values_list("actor", "command", "scope", "message"))
    shell = f"shell:{getpass.getuser()}"
    assert entries == [
        (shell, "set_rate_limit", "queue:emails", "Rate limit queue:emails: set to 100/m (in force: 100/m)"),
        (shell, "set_rate_limit", "type:pay.capture.v1", "Rate limit type:pay.capture.v1: set to 0/m (in force: 0/m)"),
        (shell, "lift_rate_limit", "queue:emails", "Rate limit queue:emails: lifted (in force: none)"),
        (shell, "set_rate_limit", "queue:emails", "Rate limit queue:emails: reset to the declared rate (in force: none)"),
    ], "one entry per change, as the Deck writes it; none for a refused rate"


@pytest.mark.parametrize(("args", "error"), [
    (["set", "emails", "--rate", "lots"], "does not parse"),
    (["set", "emails", "--rate", "10/0s"], "window must be > 0"),
    (["set", "--type", "bad type", "--rate", "1/s"], "type key must be"),
])
def test_a_bad_rate_is_a_command_error_and_nothing_changes(args: list[str], error: str) -> None:
    from chokaq_core import service

    with pytest.raises(CommandError, match=error):
        call_command("chokaq_queue", *args)
    assert service.rate_limits() == []
