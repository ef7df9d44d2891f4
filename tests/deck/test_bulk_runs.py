"""Clearing a backlog: CANCEL ALL MATCHING (Active filters) and the DLQ bulk-by-filter commands act on every
match (no 1,000 cap), after a preview and a typed confirmation, in batches of ≤ 500 rows carried out by the
web process (``deck.runs``), with ONE audit entry per run that always states what was really done and
``BulkProgress`` events that operator tabs show as a toast."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.test import Client

from chokaq_core import events, service, storage
from chokaq_core.domain import FailureReason, JobFilter, JobStatus
from chokaq_core.models import JobsDLQ, JobsHot
from deck import runs
from deck.models import BULK_MEMBER_SCOPE, OperatorAction, console_actions
from tests.deck.conftest import HTMX, close_thread_connections, dead, frames_until, make_user, pending, processing, run
from tests.deck.test_consumer import connected

ClientAs = Callable[[str], Client]


@pytest.fixture
def seen() -> Iterator[list[events.Event]]:
    got: list[events.Event] = []
    events.add_listener(got.append)
    try:
        yield got
    finally:
        events.remove_listener(got.append)
        runs.wait_all()


def bulk_events(seen: list[events.Event]) -> list[dict[str, Any]]:
    return [e.data for e in seen if e.kind == events.EventKind.BULK_PROGRESS]


@pytest.mark.django_db
def test_cancel_all_matching_preview_counts_every_match_not_only_the_shown_rows(client_as: ClientAs) -> None:
    pending("backlog", 150)
    pending("other", 3)
    operator = client_as("operator")
    preview = operator.post("/deck/api/jobs/bulk/cancel-matching/preview", {"queue": "backlog", "status": "0"})
    body = preview.json()
    assert (body["matched"], body["willAffect"], body["truncated"]) == (150, 150, False)
    assert len(body["sampleIds"]) == 10
    fragment = operator.post("/deck/api/jobs/bulk/cancel-matching/preview", {"queue": "backlog"}, **HTMX)
    html = fragment.content.decode()
    assert "150 / 150" in html and "CONFIRM CANCEL" in html and "Type <code>CANCEL</code>" in html
    assert 'hx-include="#active-bulk-form"' in html


@pytest.mark.django_db
def test_cancel_all_matching_needs_the_typed_word_and_the_operate_role(client_as: ClientAs) -> None:
    ids = pending("backlog", 3)
    operator = client_as("operator")
    for word in ({}, {"confirm": "cancel"}, {"confirm": "PURGE"}):
        response = operator.post("/deck/api/jobs/bulk/cancel-matching", {"queue": "backlog", **word})
        assert response.status_code == 400 and "type CANCEL to confirm" in response.json()["error"]
    assert client_as("viewer").post("/deck/api/jobs/bulk/cancel-matching",
                                    {"queue": "backlog", "confirm": "CANCEL"}).status_code == 403
    assert set(JobsHot.objects.values_list("id", flat=True)) == set(ids), "nothing was cancelled"


@pytest.mark.django_db
def test_a_run_of_one_batch_finishes_in_the_request(client_as: ClientAs) -> None:
    running = processing("small")[0]
    ids = pending("small", 3)
    keep = pending("keep", 1)[0]
    response = client_as("operator").post("/deck/api/jobs/bulk/cancel-matching", {"queue": "small",
                                                                                  "confirm": "CANCEL"})
    body = response.json()
    assert body["affected"] == 4 and "runId" not in body
    assert body["message"] == "Cancelled 3 / 4 matching job(s) and asked 1 running one(s) to stop"
    assert set(JobsDLQ.objects.values_list("id", flat=True)) == set(ids)
    assert set(JobsHot.objects.values_list("id", flat=True)) == {running, keep}
    assert storage.cancel_requests("w-deck") == [(running, "operator-user")]
    [entry] = console_actions().filter(command="cancel_matching")
    assert entry.message == body["message"]


@pytest.mark.django_db(transaction=True)
def test_a_large_run_goes_on_in_the_background_with_one_audit_entry_and_progress(
        client_as: ClientAs, seen: list[events.Event]) -> None:
    ids = set(pending("backlog", 1200))
    keep = pending("keep", 1)[0]
    response = client_as("operator").post("/deck/api/jobs/bulk/cancel-matching",
                                          {"queue": "backlog", "confirm": "CANCEL"}, **HTMX)
    assert response.status_code == 204
    assert "Cancelled 0 / 1,200 matching job(s)" in response["HX-Trigger"]
    runs.wait_all()
    assert set(JobsDLQ.objects.values_list("id", flat=True)) == ids
    assert set(JobsHot.objects.values_list("id", flat=True)) == {keep}
    [entry] = console_actions().filter(command="cancel_matching")
    assert entry.message == "Cancelled 1,200 / 1,200 matching job(s)" and entry.level == "success"
    members = OperatorAction.objects.filter(scope=f"{BULK_MEMBER_SCOPE}{entry.id}")
    assert set(members.values_list("job_id", flat=True)) == ids  # each job's history shows the run
    progress = bulk_events(seen)
    assert [p["done"] for p in progress] == [500, 1000, 1200, 1200]
    assert all(p["actionId"] == entry.id and p["total"] == 1200 for p in progress)
    assert [p["finished"] for p in progress] == [False, False, False, True]
    assert progress[0]["message"].startswith("Cancelled 500 / 1,200 matching job(s) — running")


@pytest.mark.django_db(transaction=True)
def test_the_audit_entry_of_a_run_always_says_what_was_done(client_as: ClientAs, seen: list[events.Event],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A run stopped by an error after two batches: the two committed batches stay done and the entry says 1,000."""
    pending("backlog", 1300)
    real = storage.cancel_matching
    calls: list[int] = []

    def failing(*args: Any, **kwargs: Any) -> storage.MatchBatch:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("database went away")
        return real(*args, **kwargs)

    monkeypatch.setattr(storage, "cancel_matching", failing)
    response = client_as("operator").post("/deck/api/jobs/bulk/cancel-matching", {"queue": "backlog",
                                                                                  "confirm": "CANCEL"})
    run_id = response.json()["runId"]
    runs.wait_all()
    entry = OperatorAction.objects.get(id=run_id)
    assert entry.level == "error"
    assert entry.message == "Cancelled 1,000 / 1,300 matching job(s) — stopped: database went away"
    assert JobsDLQ.objects.count() == 1000 and JobsHot.objects.count() == 300
    assert bulk_events(seen)[-1]["finished"] is True


@pytest.mark.django_db(transaction=True)
def test_dlq_requeue_and_purge_by_filter_have_no_cap(client_as: ClientAs) -> None:
    timeouts = set(dead("bulk", 1100, reason=FailureReason.TIMEOUT))
    keep = dead("bulk", 1, reason=FailureReason.FATAL_ERROR)[0]
    admin = client_as("admin")
    preview = admin.post("/deck/api/dlq/bulk/preview", {"queue": "bulk", "reason": "7"}).json()
    assert (preview["matched"], preview["willAffect"], preview["truncated"]) == (1100, 1100, False)
    requeue = admin.post("/deck/api/dlq/bulk/resurrect", {"queue": "bulk", "reason": "7", "max_jobs": "1050",
                                                          "confirm": "REQUEUE"}).json()
    assert requeue["background"] is True and requeue["total"] == 1050
    runs.wait_all()
    requeued = set(JobsHot.objects.values_list("id", flat=True))
    assert len(requeued) == 1050 and requeued <= timeouts
    assert all(s == JobStatus.PENDING for s in JobsHot.objects.values_list("status", flat=True))
    purge = admin.post("/deck/api/dlq/bulk/purge", {"queue": "bulk", "reason": "7", "confirm": "PURGE"}).json()
    assert purge["affected"] == 50 and "runId" not in purge  # one batch: done in the request
    assert set(JobsDLQ.objects.values_list("id", flat=True)) == {keep}
    entries = {e.command: e.message for e in console_actions().filter(command__endswith="_matching")}
    assert entries == {"resurrect_matching": "Requeued 1,050 / 1,050 matching job(s)",
                       "purge_dlq_matching": "Purged 50 / 50 matching job(s)"}


# ---------------------------------------------------------------- the progress toast reaches operator tabs


def start_run() -> int:
    try:
        ids = pending("sock", 501)
        assert len(ids) == 501
        operator = Client()
        user = make_user("operator")
        assert user is not None
        operator.force_login(user)
        return int(operator.post("/deck/api/jobs/bulk/cancel-matching", {"queue": "sock",
                                                                         "confirm": "CANCEL"}).json()["runId"])
    finally:
        close_thread_connections()


@pytest.mark.django_db(transaction=True)
def test_run_progress_is_pushed_to_operator_tabs_only(live_settings: Any, roles: None) -> None:
    operator, viewer = make_user("operator"), make_user("viewer")
    assert isinstance(operator, User) and isinstance(viewer, User)

    async def scenario() -> None:
        op_socket = await connected(operator)
        viewer_socket = await connected(viewer, first=False)
        run_id = await sync_to_async(start_run)()
        frame, _ = await frames_until(op_socket, lambda f: f'data-bulk-run="{run_id}"' in f
                                      and "data-finished" in f, 10)
        assert frame is not None, "the run's end never reached the operator's tab"
        assert re.search(rf'data-bulk-run="{run_id}" data-level="success" data-done="501" data-total="501" '
                         r'data-finished="1">Cancelled 501 / 501 matching job\(s\)</s>', frame)
        _, seen_by_viewer = await frames_until(viewer_socket, lambda f: False, 1.0)
        assert not any("data-bulk-run" in f for f in seen_by_viewer)
        await op_socket.disconnect()
        await viewer_socket.disconnect()

    run(scenario())
    runs.wait_all()
    assert service.preview_cancel_matching(JobFilter(queue="sock")).matched == 0
