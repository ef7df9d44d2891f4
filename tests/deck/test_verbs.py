"""One verb per operation (docs/architecture.md, "Verbs"): a Deck command's URL name is its view's name, which is
its service function's name and the command its audit entry records."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, get_resolver

from chokaq_core import service
from deck import views
from deck.models import OperatorAction
from tests.deck.conftest import HTMX, Jobs, dead

pytestmark = pytest.mark.django_db

# the two purges by age share one service verb over the pillar they name
BY_PILLAR = {"purge_archive_older_than": "purge_older_than", "purge_dlq_older_than": "purge_older_than"}


@pytest.fixture
def admin(client_as: Callable[[str], Client]) -> Client:
    return client_as("admin")


def deck_patterns() -> list[URLPattern]:
    return [p for p in get_resolver("deck.urls").url_patterns if isinstance(p, URLPattern)]


def view_name(pattern: URLPattern) -> str:
    callback: Any = pattern.callback
    while hasattr(callback, "__wrapped__"):
        callback = callback.__wrapped__
    return str(callback.__name__)


def test_every_url_is_named_after_its_view() -> None:
    named = {p.name: view_name(p) for p in deck_patterns() if p.name not in ("login", "logout")}
    assert {name: view for name, view in named.items() if name != view.replace("_", "-")} == {}


def test_every_command_view_is_named_after_a_service_verb() -> None:
    commands = [view_name(p) for p in deck_patterns() if str(p.pattern).startswith("api/")]
    assert len(commands) == 30
    assert [c for c in commands if not callable(getattr(service, BY_PILLAR.get(c, c), None))] == []
    assert all(callable(getattr(views, c)) for c in commands)


def test_one_resurrect_endpoint_serves_retry_and_save_and_retry(admin: Client, jobs: Jobs) -> None:
    """The list's RETRY (no body) and the editor's SAVE & RETRY (edits; the inspector comes back) are one
    command, audited as ``resurrect``."""
    plain = admin.post(f"/deck/api/jobs/{jobs.dead}/resurrect", **HTMX)
    assert plain.status_code == 204
    edited_id = dead("failing-edit")[0]
    edited = admin.post(f"/deck/api/jobs/{edited_id}/resurrect", {"payload": '{"n": 3}'}, **HTMX)
    assert edited.status_code == 200 and b'id="inspector"' in edited.content
    assert set(OperatorAction.objects.filter(command="resurrect").values_list("job_id", flat=True)) == {
        jobs.dead, edited_id}


@pytest.mark.parametrize("old", ["restart", "repair-requeue"])
def test_the_old_resurrect_aliases_are_gone(admin: Client, jobs: Jobs, old: str) -> None:
    assert admin.post(f"/deck/api/jobs/{jobs.dead}/{old}").status_code == 404


def test_each_command_logs_its_verb_with_the_admin_command_event(admin: Client, jobs: Jobs,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="chokaq.deck")
    assert admin.post(f"/deck/api/jobs/{jobs.dead}/resurrect").status_code == 200
    assert admin.post(f"/deck/api/jobs/{jobs.dead}/resurrect").status_code == 409  # it moved: a conflict
    assert admin.post(f"/deck/api/jobs/{jobs.pending}/priority", {"priority": "x"}).status_code == 400
    lines = [(r.getMessage().split(":")[0], getattr(r, "event_id", None)) for r in caplog.records
             if r.name == "chokaq.deck"]
    assert lines == [("resurrect by admin-user", 6001), ("resurrect by admin-user refused", 6000),
                     ("set_priority by admin-user refused", 6000)]
