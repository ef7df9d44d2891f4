"""The Deck over HTTP: every GET endpoint as a full page and as an htmx partial, every command's effect."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from chokaq_core import service, storage
from chokaq_core.domain import FailureReason, JobStatus
from chokaq_core.models import JobsArchive, JobsDLQ, JobsHot, Queues, StatsSummary
from deck.models import OperatorAction
from tests.deck.conftest import HTMX, Jobs, archived, dead, pending

pytestmark = pytest.mark.django_db

ClientAs = Callable[[str], Client]


@pytest.fixture
def admin(client_as: ClientAs) -> Client:
    return client_as("admin")


def test_site_root_is_the_example_shop_linking_to_the_deck(client: Client) -> None:
    response = client.get("/")
    assert response.status_code == 200 and b'href="/deck/"' in response.content


def test_login_page_and_login(client: Client, client_as: ClientAs) -> None:
    client_as("viewer")  # creates viewer-user
    page = client.get("/deck/login/")
    assert page.status_code == 200 and b"CHOKAQ" in page.content
    response = client.post("/deck/login/", {"username": "viewer-user", "password": "deck-test-pw", "next": "/deck/"})
    assert response.status_code == 302 and response["Location"] == "/deck/"
    assert client.get("/deck/").status_code == 200


def test_full_page_shows_every_panel(admin: Client, jobs: Jobs) -> None:
    html = admin.get("/deck/").content.decode()
    for element_id in ("deck-header", "conn", "stats-bar", "queues-panel", "chart-panel", "chart-data", "top-errors",
                       "job-matrix", "active-rows", "side-panel", "maintenance-panel", "console-log", "row-inbox",
                       "theme-select"):
        assert f'id="{element_id}"' in html, element_id
    assert f'id="job-{jobs.pending}"' in html and f'id="job-{jobs.processing}"' in html
    assert f'id="job-{jobs.archived}"' not in html  # Active view = Hot only
    assert 'ws-connect="/ws/deck/"' in html and "htmx.min.js" in html and "uPlot.iife.min.js" in html


@pytest.mark.parametrize("panel, element_id", [
    ("stats", "stats-bar"), ("queues", "queues-panel"), ("chart", "chart-panel"), ("top-errors", "top-errors"),
    ("console", "console-panel"), ("maintenance", "maintenance-panel"), ("jobs", "job-matrix"),
])
def test_every_partial_as_full_page_and_htmx_fragment(admin: Client, jobs: Jobs, panel: str, element_id: str) -> None:
    full = admin.get(f"/deck/partials/{panel}", follow=True)  # redirected to the page's own address
    assert full.redirect_chain and full.redirect_chain[-1][0].startswith("/deck/")
    assert full.status_code == 200 and b"<!doctype html>" in full.content and b'id="deck-header"' in full.content
    part = admin.get(f"/deck/partials/{panel}", **HTMX)
    assert part.status_code == 200 and b"<!doctype html>" not in part.content
    assert f'id="{element_id}"'.encode() in part.content


def test_unknown_panel_is_404(admin: Client) -> None:
    assert admin.get("/deck/partials/nope", **HTMX).status_code == 404


@pytest.mark.parametrize("view", ["active", "archive", "dlq"])
def test_job_matrix_views(admin: Client, jobs: Jobs, view: str) -> None:
    html = admin.get(f"/deck/partials/jobs?view={view}", **HTMX).content.decode()
    expected = {"active": jobs.pending, "archive": jobs.archived, "dlq": jobs.dead}[view]
    assert f'id="job-{expected}"' in html
    if view == "dlq":
        assert "FATALERROR" in html and "ValueError: boom" in html
    if view != "active":
        assert "PREVIEW — showing last 1 of 1" in html


def test_history_paging_links_walk_every_row(admin: Client) -> None:
    ids = archived("pg", 5)
    seen: list[str] = []
    url = "/deck/partials/jobs?view=archive&size=100&sort=date&dir=desc"
    first = admin.get(url, **HTMX).content.decode()
    assert all(f"job-{i}" in first for i in ids)
    # smaller pages through the keyset links
    page = admin.get("/deck/?view=archive&size=10").content.decode()
    assert "page-next" not in page
    for job_id in ids:
        seen.append(job_id) if f"job-{job_id}" in page else None
    assert sorted(seen) == sorted(ids)


def test_active_status_filter(admin: Client, jobs: Jobs) -> None:
    html = admin.get("/deck/partials/jobs?view=active&status=2", **HTMX).content.decode()
    assert f"job-{jobs.processing}" in html and f"job-{jobs.pending}" not in html
    assert 'data-status="2"' in html


@pytest.mark.parametrize("pillar", ["pending", "processing", "archived", "dead"])
def test_inspector_full_page_and_partial(admin: Client, jobs: Jobs, pillar: str) -> None:
    job_id = getattr(jobs, pillar)
    full = admin.get(f"/deck/jobs/{job_id}")
    assert full.status_code == 200 and b'id="deck-header"' in full.content and b'id="inspector"' in full.content
    part = admin.get(f"/deck/jobs/{job_id}", **HTMX)
    html = part.content.decode()
    assert part.status_code == 200 and 'id="inspector"' in html and "<!doctype" not in html
    where = {"pending": "ACTIVE", "processing": "ACTIVE", "archived": "ARCHIVE", "dead": "MORGUE"}[pillar]
    assert where in html
    assert ('id="btn-edit"' in html) == (pillar in ("pending", "dead"))
    assert ('id="btn-retry"' in html) == (pillar == "dead")
    assert ('id="btn-delete"' in html) == (pillar in ("archived", "dead"))


def test_inspector_of_unknown_job(admin: Client) -> None:
    """An htmx refresh of an open inspector whose job is gone: a 404 whose fragment says so (the side panel
    swaps it in); the page address of an unknown job is a real 404 page (tests/deck/test_addresses.py)."""
    response = admin.get("/deck/jobs/NOPE", **HTMX)
    assert response.status_code == 404 and b'id="job-not-found"' in response.content
    assert b"<!doctype html>" not in response.content


def test_editor_full_page_and_partial(admin: Client, jobs: Jobs) -> None:
    assert b'id="editor"' in admin.get(f"/deck/jobs/{jobs.dead}/edit").content
    html = admin.get(f"/deck/jobs/{jobs.dead}/edit", **HTMX).content.decode()
    assert 'id="editor-payload"' in html and 'id="btn-save-retry"' in html
    pending_editor = admin.get(f"/deck/jobs/{jobs.pending}/edit", **HTMX).content.decode()
    assert 'id="btn-save"' in pending_editor and "btn-save-retry" not in pending_editor
    assert admin.get(f"/deck/jobs/{jobs.processing}/edit", **HTMX).status_code == 409


def test_payload_and_error_text_are_escaped(admin: Client) -> None:
    job_id = dead("xss", payload={"html": "<script>alert(1)</script>"}, details="<img src=x onerror=alert(2)>",
                  tags="<b>tag</b>")[0]
    for url in (f"/deck/jobs/{job_id}", "/deck/?view=dlq", f"/deck/jobs/{job_id}/edit"):
        html = admin.get(url, **HTMX).content.decode()
        assert "<script>alert(1)" not in html and "<img src=x" not in html and "<b>tag</b>" not in html
    inspector = admin.get(f"/deck/jobs/{job_id}", **HTMX).content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in inspector and "&lt;img src=x onerror=alert(2)&gt;" in inspector


# ---------------------------------------------------------------- commands


def test_command_answers_json_or_htmx_toast(admin: Client, jobs: Jobs) -> None:
    response = admin.post(f"/deck/api/jobs/{jobs.pending}/cancel")
    assert response.status_code == 200
    assert response.json() == {"ok": True, "affected": 1, "message": response.json()["message"]}
    other = pending("main")[0]
    htmx = admin.post(f"/deck/api/jobs/{other}/cancel", **HTMX)
    assert htmx.status_code == 204
    trigger = json.loads(htmx["HX-Trigger"])
    assert trigger["deck:toast"]["level"] == "success" and trigger["deck:changed"] is True
    assert JobsDLQ.objects.get(id=other).failure_reason == FailureReason.CANCELLED
    assert OperatorAction.objects.filter(command="cancel", actor="admin-user").count() == 2


def test_cancel_processing_job_flags_it(admin: Client, jobs: Jobs) -> None:
    assert admin.post(f"/deck/api/jobs/{jobs.processing}/cancel").json()["ok"]
    assert JobsHot.objects.get(id=jobs.processing).cancel_requested_by == "admin-user"


def test_resurrect_without_and_with_edits(admin: Client, jobs: Jobs) -> None:
    assert admin.post(f"/deck/api/jobs/{jobs.dead}/resurrect").status_code == 200
    row = JobsHot.objects.get(id=jobs.dead)
    assert row.status == JobStatus.PENDING and row.last_modified_by == "admin-user"
    other = dead("failing2")[0]
    response = admin.post(f"/deck/api/jobs/{other}/resurrect", {"payload": '{"n": 42}', "priority": "30"})
    assert response.status_code == 200
    row = JobsHot.objects.get(id=other)
    assert json.loads(row.payload) == {"n": 42} and row.priority == 30


def test_save_and_retry_moves_the_edited_job_and_keeps_the_old_payload(admin: Client, jobs: Jobs) -> None:
    response = admin.post(f"/deck/api/jobs/{jobs.dead}/resurrect",
                          {"payload": '{"n": 7}', "tags": "fixed", "priority": "50"}, **HTMX)
    assert response.status_code == 200 and b'id="inspector"' in response.content and b"ACTIVE" in response.content
    row = JobsHot.objects.get(id=jobs.dead)
    assert json.loads(row.payload) == {"n": 7} and row.tags == "fixed" and row.priority == 50
    assert not JobsDLQ.objects.filter(id=jobs.dead).exists()
    action = OperatorAction.objects.get(command="resurrect")
    assert action.previous_payload == '{"n": 1}' and action.new_payload == '{"n": 7}' and action.actor == "admin-user"
    assert b"payload change" in response.content  # the inspector shows what changed


def test_save_edits_pending_and_dlq_jobs(admin: Client, jobs: Jobs) -> None:
    assert admin.post(f"/deck/api/jobs/{jobs.pending}/edit", {"payload": '{"n": 2}', "priority": "5"}).status_code == 200
    hot = JobsHot.objects.get(id=jobs.pending)
    assert json.loads(hot.payload) == {"n": 2} and hot.priority == 5 and hot.last_modified_by == "admin-user"
    assert admin.post(f"/deck/api/jobs/{jobs.dead}/edit", {"payload": '{"n": 3}', "tags": "t"}).status_code == 200
    row = JobsDLQ.objects.get(id=jobs.dead)
    assert json.loads(row.payload) == {"n": 3} and row.tags == "t" and row.previous_payload == '{"n": 1}'


def test_set_priority(admin: Client, jobs: Jobs) -> None:
    assert admin.post(f"/deck/api/jobs/{jobs.pending}/priority", {"priority": "99"}).status_code == 200
    assert JobsHot.objects.get(id=jobs.pending).priority == 99


def test_bulk_commands(admin: Client) -> None:
    hot = pending("bulk", 3)
    response = admin.post("/deck/api/jobs/bulk/cancel", {"ids": hot})
    assert response.json()["affected"] == 3
    assert admin.post("/deck/api/jobs/bulk/resurrect", {"ids": ",".join(hot[:2])}).json()["affected"] == 2
    assert admin.post("/deck/api/dlq/purge", {"ids": [hot[2]]}).json()["affected"] == 1
    assert not JobsDLQ.objects.exists() and JobsHot.objects.filter(id__in=hot[:2]).count() == 2


def test_queue_controls(admin: Client, jobs: Jobs) -> None:
    assert admin.post("/deck/api/queues/main/pause", {"value": "1"}).status_code == 200
    assert Queues.objects.get(name="main").is_paused
    assert admin.post("/deck/api/queues/main/pause", {"value": "0"}).status_code == 200
    assert not Queues.objects.get(name="main").is_paused
    assert admin.post("/deck/api/queues/main/zombie-timeout", {"value": "30"}).status_code == 200
    assert Queues.objects.get(name="main").zombie_timeout_seconds == 60  # raised to 60
    assert admin.post("/deck/api/queues/main/zombie-timeout", {"value": ""}).status_code == 200
    assert Queues.objects.get(name="main").zombie_timeout_seconds is None
    assert admin.post("/deck/api/queues/main/max-workers", {"value": "4"}).status_code == 200
    assert Queues.objects.get(name="main").max_workers == 4
    assert admin.post("/deck/api/queues/main/active", {"value": "0"}).status_code == 200
    queue = Queues.objects.get(name="main")
    assert not queue.is_active and queue.is_paused
    assert b"queue-hidden" in admin.get("/deck/partials/queues", **HTMX).content


def test_dlq_bulk_by_filter_preview_then_confirmed_purge_and_requeue(admin: Client) -> None:
    dead("bf", 4, reason=FailureReason.TIMEOUT)
    dead("bf", 1, reason=FailureReason.FATAL_ERROR)
    preview = admin.post("/deck/api/dlq/bulk/preview", {"queue": "bf", "reason": "7", "max_jobs": "3"})
    assert preview.json() == {"ok": True, "matched": 4, "willAffect": 3, "truncated": True,
                              "sampleIds": preview.json()["sampleIds"]}
    fragment = admin.post("/deck/api/dlq/bulk/preview", {"queue": "bf", "reason": "7", "action": "requeue"}, **HTMX)
    assert b"4 / 4" in fragment.content and b"CONFIRM REQUEUE" in fragment.content
    assert admin.post("/deck/api/dlq/bulk/resurrect", {"queue": "bf", "reason": "7", "max_jobs": "3"}).status_code == 400
    assert admin.post("/deck/api/dlq/bulk/resurrect",
                      {"queue": "bf", "reason": "7", "max_jobs": "3", "confirm": "REQUEUE"}).json()["affected"] == 3
    assert admin.post("/deck/api/dlq/bulk/purge",
                      {"queue": "bf", "reason": "7", "confirm": "PURGE"}).json()["affected"] == 1
    assert JobsDLQ.objects.count() == 1 and StatsSummary.objects.get(queue="bf").failed_total == 1


def test_maintenance_preview_and_purges(admin: Client, jobs: Jobs) -> None:
    preview = admin.post("/deck/api/maintenance/preview", {"pillar": "archive", "days": "30"})
    assert preview.json()["count"] == 0
    fragment = admin.post("/deck/api/maintenance/preview", {"pillar": "dlq", "days": "7"}, **HTMX)
    assert b"would be deleted" in fragment.content
    assert admin.post("/deck/api/maintenance/purge-archive", {"days": "30"}).json()["affected"] == 0
    assert admin.post("/deck/api/maintenance/purge-dlq", {"days": "7"}).json()["message"] == "No DLQ jobs to purge."
    assert JobsArchive.objects.filter(id=jobs.archived).exists()


def test_maintenance_preview_says_more_than_when_capped(admin: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    archived("capv", 3)
    JobsArchive.objects.update(finished_at=datetime.now(UTC) - timedelta(days=40))
    monkeypatch.setattr(service, "PURGE_PREVIEW_CAP", 2)
    assert admin.post("/deck/api/maintenance/preview", {"pillar": "archive", "days": "30"}).json() | {"cutoff": 0} \
        == {"ok": True, "cutoff": 0, "count": 2, "capped": True}
    fragment = admin.post("/deck/api/maintenance/preview", {"pillar": "archive", "days": "30"}, **HTMX).content
    assert b"more than 2</strong>" in fragment and b"CONFIRM PURGE ARCHIVE" in fragment
    monkeypatch.setattr(service, "PURGE_PREVIEW_CAP", 3)
    fragment = admin.post("/deck/api/maintenance/preview", {"pillar": "archive", "days": "30"}, **HTMX).content
    assert b"more than" not in fragment and b"<strong>3</strong>" in fragment


def test_a_bounded_text_search_says_which_rows_it_read(admin: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    oldest = dead("swv", 3, details="hay")[0]
    JobsDLQ.objects.filter(id=oldest).update(failed_at=datetime.now(UTC) - timedelta(hours=1))
    monkeypatch.setattr(service, "SEARCH_WINDOW", 2)
    html = admin.get("/deck/partials/jobs?view=dlq&q=hay&size=100", **HTMX).content.decode()
    assert "searched the newest 2 rows" in html and html.count('class="job-row') == 2
    monkeypatch.setattr(service, "SEARCH_WINDOW", 3)
    html = admin.get("/deck/partials/jobs?view=dlq&q=hay&size=100", **HTMX).content.decode()
    assert "searched the newest" not in html and html.count('class="job-row') == 3


def test_delete_forever_single_rows(admin: Client, jobs: Jobs) -> None:
    assert admin.post(f"/deck/api/archive/{jobs.archived}/purge").status_code == 200
    assert admin.post(f"/deck/api/dlq/{jobs.dead}/purge").status_code == 200
    assert not JobsArchive.objects.exists() and not JobsDLQ.objects.exists()
    assert service.find_job(jobs.archived) is None


def test_console_shows_the_latest_operator_actions(admin: Client, jobs: Jobs) -> None:
    admin.post(f"/deck/api/jobs/{jobs.pending}/cancel")
    html = admin.get("/deck/partials/console", **HTMX).content.decode()
    assert "admin-user: Cancel request sent for" in html


def test_top_error_click_through_filters_the_dlq(admin: Client) -> None:
    dead("te", 2, details="KeyError: 'account'")
    html = admin.get("/deck/partials/top-errors", **HTMX).content.decode()
    assert "KeyError: &#x27;account&#x27;" in html and "view=dlq&amp;reason=6" in html
    filtered = admin.get("/deck/partials/jobs?view=dlq&reason=6&q=KeyError&size=100", **HTMX).content.decode()
    assert filtered.count('class="job-row') == 2


def test_worker_capacity_needs_a_cross_process_layer(admin: Client) -> None:
    response = admin.post("/deck/api/workers/capacity", {"capacity": "4"})
    assert response.status_code == 400 and "REDIS_URL" in response.json()["error"]
    assert admin.post("/deck/api/workers/capacity", {"capacity": "101"}).status_code == 400


def test_maintenance_panel_shows_the_live_fleet(admin: Client) -> None:
    from chokaq_core.domain import WorkerInfo

    storage.upsert_worker(WorkerInfo("w-fleet", "host", 1, "*", capacity=8, active_count=3))
    html = admin.get("/deck/partials/maintenance", **HTMX).content.decode()
    assert "(Busy: 3 · 1 live worker)" in html and 'value="8"' in html


def test_lag_colours_follow_the_deck_settings(admin: Client, settings: object) -> None:
    pending("slow")
    from datetime import timedelta

    from django.utils import timezone

    from chokaq_core.models import JobsHot as Hot

    Hot.objects.filter(queue="slow").update(created_at=timezone.now() - timedelta(seconds=7))
    assert "lag-warning" in admin.get("/deck/partials/queues", **HTMX).content.decode()
    settings.CHOKAQ_DECK = {"QUEUE_LAG_WARNING_THRESHOLD_SECONDS": 1, "QUEUE_LAG_CRITICAL_THRESHOLD_SECONDS": 6}  # type: ignore[attr-defined]
    assert "lag-critical" in admin.get("/deck/partials/queues", **HTMX).content.decode()


def _editor_revision(client: Client, job_id: str) -> str:
    """The edit version the editor form carries (what the operator's edit is made against)."""
    html = client.get(f"/deck/jobs/{job_id}/edit", **HTMX).content.decode()
    [revision] = re.findall(r'name="revision" value="(\d+)"', html)
    return revision


def test_a_stale_save_is_a_409_with_the_current_state_and_changes_nothing(client_as: ClientAs, jobs: Jobs) -> None:
    one, two = client_as("admin"), client_as("operator")
    seen_by_one = _editor_revision(one, jobs.dead)  # operator 1 opens the editor
    retried = two.post(f"/deck/api/jobs/{jobs.dead}/resurrect",
                       {"payload": '{"p": 2}', "revision": _editor_revision(two, jobs.dead)}, **HTMX)
    assert retried.status_code == 200, "operator 2's Save & Retry went through"

    for url in (f"/deck/api/jobs/{jobs.dead}/edit", f"/deck/api/jobs/{jobs.dead}/resurrect"):
        stale = one.post(url, {"payload": '{"p": 1}', "revision": seen_by_one}, **HTMX)
        assert stale.status_code == 409
        body = stale.json()
        assert "changed meanwhile" in body["error"] and "nothing was saved" in body["error"]
        assert body["current"]["where"] == "Pending" and json.loads(body["current"]["payload"]) == {"p": 2}
        assert body["current"]["revision"] > int(seen_by_one)
    as_the_editor_posts = one.post(f"/deck/api/jobs/{jobs.dead}/edit", json.dumps(
        {"payload": '{"p": 1}', "revision": seen_by_one}), content_type="application/json", **HTMX)
    assert as_the_editor_posts.status_code == 409 and as_the_editor_posts.json()["current"]["where"] == "Pending"
    row = JobsHot.objects.get(id=jobs.dead)
    assert json.loads(row.payload) == {"p": 2}, "operator 2's payload is not overwritten"

    fresh = one.post(f"/deck/api/jobs/{jobs.dead}/edit",
                     {"payload": '{"p": 3}', "revision": _editor_revision(one, jobs.dead)}, **HTMX)
    assert fresh.status_code == 200 and json.loads(JobsHot.objects.get(id=jobs.dead).payload) == {"p": 3}


def test_two_saves_of_one_dlq_job_the_second_is_stale(client_as: ClientAs, jobs: Jobs) -> None:
    one, two = client_as("admin"), client_as("operator")
    seen = _editor_revision(one, jobs.dead)
    assert _editor_revision(two, jobs.dead) == seen
    assert two.post(f"/deck/api/jobs/{jobs.dead}/edit", {"payload": '{"p": 2}', "revision": seen}).status_code == 200
    stale = one.post(f"/deck/api/jobs/{jobs.dead}/edit", {"tags": "mine", "revision": seen})
    assert stale.status_code == 409 and stale.json()["current"]["where"] == "in the DLQ"
    row = JobsDLQ.objects.get(id=jobs.dead)
    assert json.loads(row.payload) == {"p": 2} and row.tags is None
