"""Bad input never reaches the engine and never becomes a 500: a 4xx with a message, and nothing changes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from chokaq_core import storage
from chokaq_core.domain import Success
from chokaq_core.models import JobsDLQ, JobsHot
from tests.deck.conftest import HTMX, Jobs, page_refused
from tests.deck.test_authorization import snapshot

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(client_as: Callable[[str], Client]) -> Client:
    return client_as("admin")


def refused(response: Any, status: int = 400, text: str = "") -> str:
    assert response.status_code == status, (response.status_code, response.content[:300])
    body = response.json()
    assert body["ok"] is False and body["error"]
    assert text.lower() in body["error"].lower(), body["error"]
    return str(body["error"])


BAD_PAYLOADS = [
    ("{not json", "not valid JSON"),
    ("[1, 2, 3]", "must be a JSON object"),
    ('"just a string"', "must be a JSON object"),
    ("", "Payload is empty"),
    ("   ", "Payload is empty"),
    ('{"x": NaN}', ""),
]


# A blank payload on ``resurrect`` means "no edit" (a plain resurrection, covered by test_views).
@pytest.mark.parametrize("action, payload, text", [
    (action, payload, text) for action in ("edit", "resurrect") for payload, text in BAD_PAYLOADS
    if action != "resurrect" or payload.strip()
])
def test_invalid_payload_json_is_refused(admin: Client, jobs: Jobs, payload: str, text: str, action: str) -> None:
    before = snapshot()
    target = jobs.dead
    refused(admin.post(f"/deck/api/jobs/{target}/{action}", {"payload": payload}), 400, text)
    refused(admin.post(f"/deck/api/jobs/{target}/{action}", {"payload": payload}, **HTMX), 400, text)
    assert snapshot() == before


def test_oversized_payload_is_refused(admin: Client, jobs: Jobs, chokaq_settings: Any) -> None:
    before = snapshot()
    huge = json.dumps({"blob": "x" * 1_000_001})
    refused(admin.post(f"/deck/api/jobs/{jobs.dead}/resurrect", {"payload": huge}), 400, "payload")
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "SERIALIZATION": {"MAX_PAYLOAD_BYTES": 100}}
    refused(admin.post(f"/deck/api/jobs/{jobs.pending}/edit", {"payload": json.dumps({"blob": "y" * 200})}), 400,
            "limit is 100 bytes")
    assert snapshot() == before


def test_edit_of_a_job_that_moved_meanwhile_is_a_conflict(admin: Client, jobs: Jobs) -> None:
    # the Pending job was picked up and finished after the operator opened the editor
    claimed = storage.fetch_batch("w-late", 10, ["main"])
    assert [j.id for j in claimed] == [jobs.pending]
    storage.mark_processing(claimed[0], "w-late")
    storage.complete("w-late", [Success(jobs.pending, 1.0)], [], [])
    before = snapshot()
    error = refused(admin.post(f"/deck/api/jobs/{jobs.pending}/edit", {"payload": '{"n": 9}'}, **HTMX), 409,
                    "Save failed")
    assert "processed or deleted externally" in error
    assert snapshot() == before


def test_save_and_retry_of_a_job_already_requeued_is_a_conflict(admin: Client, jobs: Jobs) -> None:
    assert admin.post(f"/deck/api/jobs/{jobs.dead}/resurrect").status_code == 200
    before = snapshot()
    refused(admin.post(f"/deck/api/jobs/{jobs.dead}/resurrect", {"payload": '{"n": 9}'}), 409,
            "Repair and retry failed")
    assert snapshot() == before
    assert json.loads(JobsHot.objects.get(id=jobs.dead).payload) == {"n": 1}


@pytest.mark.parametrize("url, text", [
    ("/deck/api/jobs/{processing}/resurrect", "not in the DLQ"),
    ("/deck/api/jobs/{archived}/cancel", "cannot be cancelled"),
    ("/deck/api/jobs/{processing}/priority", "not Pending"),
    ("/deck/api/archive/{dead}/purge", "not in the Archive"),
    ("/deck/api/dlq/{archived}/purge", "not in the DLQ"),
    ("/deck/api/jobs/NOSUCHJOB/resurrect", "not in the DLQ"),
])
def test_commands_on_jobs_in_the_wrong_place_are_conflicts(admin: Client, jobs: Jobs, url: str, text: str) -> None:
    before = snapshot()
    fill = {"processing": jobs.processing, "archived": jobs.archived, "dead": jobs.dead}
    refused(admin.post(url.format(**fill), {"priority": "5"}), 409, text)
    assert snapshot() == before


def test_editor_of_a_running_job_is_a_conflict(admin: Client, jobs: Jobs) -> None:
    refused(admin.get(f"/deck/jobs/{jobs.processing}/edit", **HTMX), 409, "can be edited")


@pytest.mark.parametrize("query, text", [
    ("view=archive&sort=payload", "unknown sort key"),
    ("view=dlq&sort=id;DROP TABLE x", "unknown sort key"),
    ("view=everything", "view"),
    ("view=active&status=7", "status"),
    ("view=archive&size=37", "size"),
    ("view=archive&size=1000", "size"),  # a 1,000-row page renders over 150 ms: 500 is the largest page
    ("view=archive&size=abc", "size"),
    ("view=archive&after=garbage", "invalid page key"),
    ("view=dlq&before=eyJ4IjogMX0", "invalid page key"),
    ("view=dlq&start=2024-13-45", "start"),
    ("view=dlq&start=2024-05-02&end=2024-05-01", "'from' must not be after 'to'"),
    ("view=dlq&reason=99", "reason"),
    ("view=dlq&q=" + "x" * 1001, "search text is too long"),
])
def test_bad_list_queries_are_400(admin: Client, query: str, text: str) -> None:
    refused(admin.get(f"/deck/partials/jobs?{query}", **HTMX), 400, text)
    page_refused(admin.get(f"/deck/?{query}"), 400, text)


@pytest.mark.parametrize("url, data, text", [
    ("/deck/api/jobs/{pending}/priority", {"priority": "abc"}, "priority"),
    ("/deck/api/jobs/{pending}/priority", {"priority": "-1"}, "priority"),
    ("/deck/api/jobs/{pending}/priority", {"priority": "2000000"}, "priority"),
    ("/deck/api/jobs/{pending}/priority", {}, "priority"),
    ("/deck/api/jobs/{pending}/edit", {"payload": '{"n": 1}', "priority": "1e9"}, "priority"),
    ("/deck/api/jobs/{pending}/edit", {"tags": "t" * 1001}, "tags"),
    ("/deck/api/jobs/{pending}/edit", {}, "nothing to change"),
    ("/deck/api/jobs/" + "A" * 51 + "/cancel", {}, "job id"),
    ("/deck/api/jobs/bulk/cancel", {}, "select at least one job"),
    ("/deck/api/jobs/bulk/cancel", {"ids": " , ,"}, "select at least one job"),
    ("/deck/api/jobs/bulk/resurrect", {"ids": ",".join(f"J{n}" for n in range(1001))}, "at most 1000"),
    ("/deck/api/dlq/purge", {"ids": "B" * 51}, "job id"),
    ("/deck/api/queues/main/pause", {"value": "maybe"}, "value"),
    ("/deck/api/queues/main/pause", {}, "value"),
    ("/deck/api/queues/main/zombie-timeout", {"value": "x"}, "Zombie timeout (seconds) must be a whole number"),
    ("/deck/api/queues/main/zombie-timeout", {"value": "0"}, "Zombie timeout (seconds) must be at least 1"),
    ("/deck/api/queues/main/zombie-timeout", {"value": "90000"}, "Zombie timeout (seconds) must be at most 86400"),
    ("/deck/api/queues/main/max-workers", {"value": "0"}, "Max workers must be at least 1"),
    ("/deck/api/queues/main/max-workers", {"value": "10001"}, "Max workers must be at most 10000"),
    ("/deck/api/queues/" + "q" * 256 + "/pause", {"value": "1"}, "queue name"),
    ("/deck/api/dlq/bulk/preview", {"max_jobs": "many"}, "Max jobs must be a whole number"),
    ("/deck/api/dlq/bulk/preview", {"reason": "11"}, "reason"),
    ("/deck/api/dlq/bulk/preview", {"start": "2024-02-02", "end": "2024-01-01"}, "'from' must not be after"),
    ("/deck/api/dlq/bulk/purge", {"confirm": "purge"}, "type PURGE to confirm"),
    ("/deck/api/dlq/bulk/resurrect", {}, "type REQUEUE to confirm"),
    ("/deck/api/maintenance/preview", {"pillar": "hot", "days": "3"}, "pillar"),
    ("/deck/api/maintenance/preview", {"pillar": "dlq", "days": "0"}, "days"),
    ("/deck/api/maintenance/purge-archive", {"days": "366"}, "days"),
    ("/deck/api/maintenance/purge-dlq", {"days": "soon"}, "days"),
])
def test_bad_numbers_ids_and_filters_are_400(admin: Client, jobs: Jobs, url: str, data: dict[str, str],
                                             text: str) -> None:
    before = snapshot()
    message = refused(admin.post(url.format(pending=jobs.pending), data), 400, text)
    refused(admin.post(url.format(pending=jobs.pending), data, **HTMX), 400, text)
    assert snapshot() == before
    # plain words that name the field by its label, not Django's "value: Ensure this value is …"
    assert "Ensure this value" not in message and not message.startswith(("value:", "max_jobs:")), message
    assert JobsDLQ.objects.filter(id=jobs.dead).exists()


def test_bad_job_id_in_inspector_is_400(admin: Client) -> None:
    refused(admin.get("/deck/jobs/" + "Z" * 60, **HTMX), 400, "job id")
