"""The read-only admin pages of the pillars, counters, queues and workers."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from chokaq_core import enqueue, storage
from chokaq_core.domain import Failure, FailureReason, Success

pytestmark = pytest.mark.django_db(transaction=True)

MODELS = ["jobshot", "jobsarchive", "jobsdlq", "statssummary", "queues", "workers"]


@pytest.fixture
def admin_client_() -> Client:
    user = User.objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def three_jobs() -> dict[str, str]:
    hot = enqueue("test.ok.v1", {"note": "<script>alert(1)</script>"})
    done = enqueue("test.ok.v1", {"n": 1})
    dead = enqueue("test.ok.v1", {"n": 2})
    jobs = storage.fetch_batch("w1", 10)
    assert {j.id for j in jobs} == {hot, done, dead}
    storage.release_jobs([hot], "w1")
    storage.complete("w1", [Success(done, 3.5, "42")], [], [Failure(dead, FailureReason.FATAL_ERROR, "boom")])
    return {"hot": hot, "archive": done, "dlq": dead}


@pytest.mark.parametrize("model", MODELS)
def test_changelist_renders_and_offers_no_add(admin_client_: Client, three_jobs: dict[str, str], model: str) -> None:
    response = admin_client_.get(reverse(f"admin:chokaq_core_{model}_changelist"))
    assert response.status_code == 200
    assert reverse(f"admin:chokaq_core_{model}_add") not in response.content.decode()
    assert admin_client_.get(reverse(f"admin:chokaq_core_{model}_add")).status_code == 403


@pytest.mark.parametrize(("model", "pillar"), [("jobshot", "hot"), ("jobsarchive", "archive"), ("jobsdlq", "dlq")])
def test_job_pages_are_view_only_and_escape_payloads(admin_client_: Client, three_jobs: dict[str, str], model: str,
                                                    pillar: str) -> None:
    job_id = three_jobs[pillar]
    url = reverse(f"admin:chokaq_core_{model}_change", args=[job_id])
    page = admin_client_.get(url)
    assert page.status_code == 200
    assert job_id in page.content.decode()
    assert "<script>alert(1)</script>" not in page.content.decode()
    assert admin_client_.post(url, {"queue": "hacked"}).status_code == 403
    delete = reverse(f"admin:chokaq_core_{model}_delete", args=[job_id])
    assert admin_client_.post(delete, {"post": "yes"}).status_code == 403
    assert storage.get_hot(three_jobs["hot"]) is not None
    assert storage.get_archived(three_jobs["archive"]) is not None
    assert storage.get_dead(three_jobs["dlq"]) is not None


def test_history_lists_count_from_the_counters(admin_client_: Client, three_jobs: dict[str, str]) -> None:
    for model, table in (("jobsarchive", "chokaq_jobs_archive"), ("jobsdlq", "chokaq_jobs_dlq")):
        with CaptureQueriesContext(connection) as queries:
            response = admin_client_.get(reverse(f"admin:chokaq_core_{model}_changelist"))
        assert response.status_code == 200
        assert "1 " in response.content.decode()
        counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper() and table in q["sql"]]
        assert counts == [], counts


def test_a_user_without_permissions_cannot_view(three_jobs: dict[str, str]) -> None:
    user = User.objects.create_user("staff", "s@example.com", "pw", is_staff=True)
    client = Client()
    client.force_login(user)
    assert client.get(reverse("admin:chokaq_core_jobsdlq_changelist")).status_code == 403
