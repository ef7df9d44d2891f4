"""The chart's history views (1h / 24h / 7d from the roll-ups), the Recurring panel and the PURGED card."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client

from chokaq_core import service, storage
from chokaq_core.models import HistoryBuckets, JobsHot, Schedules
from deck.models import OperatorAction
from tests.deck.conftest import HTMX, archived, dead, page_refused

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(client_as: Callable[[str], Client]) -> Client:
    return client_as("viewer")


@pytest.fixture
def operator(client_as: Callable[[str], Client]) -> Client:
    return client_as("operator")


@pytest.fixture
def nightly(chokaq_settings: Any) -> None:
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "SCHEDULE": {
        "nightly": {"CRON": "0 3 * * *", "TYPE": "test.ok.v1", "QUEUE": "reports"},
        "off": {"CRON": "*/5 * * * *", "TYPE": "test.ok.v1", "ENABLED": False},
    }}


def text(content: bytes) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", content.decode())))


# ---------------------------------------------------------------- the service's history views


def test_each_range_reads_a_bounded_number_of_zero_filled_buckets() -> None:
    archived("h", 2, duration_ms=30.0, type="test.ok.v1")
    dead("h", 1, type="test.fail.v1")
    for key, (granularity, count) in service.HISTORY_RANGES.items():
        view = service.history_buckets(key)
        assert (view.granularity, len(view.buckets)) == (granularity, count)
        assert all((b.at - view.buckets[0].at).total_seconds() % view.seconds == 0 for b in view.buckets)
        assert (view.succeeded, view.failed) == (2, 1), key
        assert view.buckets[-1].succeeded == 2, "the current bucket is the last one"
        assert view.p50_ms is not None and 20 <= view.p50_ms <= 50, "30 ms falls in the 20-50 ms bin"
        assert [t.type for t in view.types] == ["test.ok.v1", "test.fail.v1"]
    assert round(service.history_buckets("1h").fail_rate, 1) == 33.3


class _Recording:
    def __init__(self, cursor: Any, seen: list[str]) -> None:
        self._cursor, self._seen = cursor, seen

    def execute(self, sql: str, params: Any = None) -> Any:
        self._seen.append(sql)
        return self._cursor.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


def test_a_history_view_reads_only_the_roll_ups(monkeypatch: pytest.MonkeyPatch) -> None:
    archived("ro", 3)
    statements: list[str] = []
    real = storage._cursor

    @contextmanager
    def recording(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with real(*args, **kwargs) as cursor:
            yield _Recording(cursor, statements)

    monkeypatch.setattr(storage, "_cursor", recording)
    service.history_buckets("7d")
    assert len(statements) == 2 and all("chokaq_history_buckets" in s for s in statements)
    assert not any("chokaq_jobs_archive" in s or "chokaq_jobs_dlq" in s for s in statements), "never Archive/DLQ"


def test_ranges_are_checked() -> None:
    assert service.check_chart_range(None) == "5m" and service.check_chart_range(" 24h ") == "24h"
    for bad in ("30d", "7D", "1h;DROP", "x" * 500):
        with pytest.raises(service.ServiceError, match="range must be one of"):
            service.check_chart_range(bad)
    with pytest.raises(service.ServiceError):
        service.history_buckets("5m")


def test_old_buckets_fall_out_of_the_window() -> None:
    archived("old", 1)
    HistoryBuckets.objects.filter(granularity=3600).update(bucket_start=datetime(2000, 1, 1, tzinfo=UTC))
    assert service.history_buckets("7d").succeeded == 0
    assert service.history_buckets("1h").succeeded == 1


# ---------------------------------------------------------------- the chart panel


def test_the_range_is_a_url_parameter_with_keyboard_links_and_a_text_alternative(viewer: Client) -> None:
    archived("page", 2, duration_ms=120.0, type="test.ok.v1")
    response = viewer.get("/deck/?range=24h")
    assert response.status_code == 200
    body = response.content.decode()
    panel = body[body.index('id="chart-panel"'):body.index("</section>", body.index('id="chart-panel"'))]
    assert 'data-range="24h"' in panel and 'id="history-chart"' in panel and 'id="chart"' not in panel
    links = re.findall(r'<a href="([^"]+)" class="range[^"]*"[^>]*?(aria-current="true")?>(\w+)</a>', panel)
    assert [(href, label) for href, _, label in links] == [(f"/deck/?range={r}", r) for r in service.CHART_RANGES]
    assert [label for _, current, label in links if current] == ["24h"]
    words = text(panel.encode())
    assert "History chart, last 24 hours (per hour): 2 job(s) succeeded and 0 failed" in words
    assert "test.ok.v1" in words and "p95" in words
    data = json.loads(html.unescape(re.search(r'id="history-data" class="sr-only" data-points="([^"]+)"',
                                              panel).group(1)))  # type: ignore[union-attr]
    assert len(data["t"]) == 24 and sum(data["ok"]) == 2 and data["p95"][-1] is not None
    assert 'id="chart-data"' in panel, "the live 5m data stays, so pushes always find their target"


def test_the_default_range_is_the_live_5m_chart(viewer: Client) -> None:
    body = viewer.get("/deck/").content.decode()
    assert 'data-range="5m"' in body and 'id="chart"' in body and 'id="history-chart"' not in body


def test_the_chart_partial_takes_the_range(viewer: Client) -> None:
    archived("part", 1)
    response = viewer.get("/deck/partials/chart?range=7d", **HTMX)
    assert response.status_code == 200 and 'data-range="7d"' in response.content.decode()
    assert "last 7 days (per hour): 1 job(s) succeeded" in text(response.content)
    assert 'hx-get="/deck/partials/chart?range=7d"' in response.content.decode(), "a resync keeps the range"


def test_a_bad_range_is_a_clear_400(viewer: Client) -> None:
    page_refused(viewer.get("/deck/?range=30d"), 400, "range must be one of 5m, 1h, 24h, 7d")
    refused = viewer.get("/deck/partials/chart?range=30d", **HTMX)
    assert refused.status_code == 400 and "range must be one of" in refused.json()["error"]


# ---------------------------------------------------------------- the purged counter


def test_the_purged_card_counts_purges_and_succeeded_does_not_shrink(client_as: Callable[[str], Client]) -> None:
    ids = archived("pc", 3)
    admin = client_as("admin")
    assert admin.post(f"/deck/api/archive/{ids[0]}/purge", **HTMX).status_code == 204
    stats = text(admin.get("/deck/partials/stats", **HTMX).content)
    assert "SUCCEEDED 3" in stats and "PURGED 1 2 archived" in stats
    assert storage.summary_stats().total == 2


# ---------------------------------------------------------------- the Recurring panel


def test_the_recurring_panel_lists_next_and_last_runs_with_the_job(viewer: Client, nightly: None) -> None:
    job_id = service.run_schedule_now("nightly", actor="alice")
    response = viewer.get("/deck/partials/recurring", **HTMX)
    assert response.status_code == 200
    body = response.content.decode()
    rows = dict(re.findall(r'data-schedule="([^"]+)">(.*?)</tr>', body, re.S))
    assert set(rows) == {"nightly", "off"}
    assert f'href="/deck/jobs/{job_id}"' in rows["nightly"] and "ENABLED" in rows["nightly"]
    assert "reports" in rows["nightly"] and "0 3 * * *" in rows["nightly"]
    assert "DISABLED" in rows["off"] and "/deck/api/" not in body, "a viewer gets no controls"
    next_run = re.search(r'<time datetime="([^"]+)"', rows["nightly"]).group(1)  # type: ignore[union-attr]
    assert datetime.fromisoformat(next_run).hour == 3


def test_an_empty_schedule_says_how_to_add_one(viewer: Client) -> None:
    assert "No recurring jobs configured" in text(viewer.get("/deck/partials/recurring", **HTMX).content)


def test_disable_and_enable_persist_and_are_audited(operator: Client, nightly: None) -> None:
    response = operator.post("/deck/api/schedules/nightly/enabled", {"value": "0"})
    assert response.status_code == 200 and response.json()["ok"] is True
    assert Schedules.objects.get(name="nightly").enabled is False
    assert {r["name"]: r["enabled"] for r in service.recurring()}["nightly"] is False
    entry = OperatorAction.objects.get(command="set_schedule_enabled")
    assert (entry.actor, entry.scope, entry.message) == (
        "operator-user", "nightly", "Recurring job nightly disabled on every worker")
    assert operator.post("/deck/api/schedules/off/enabled", {"value": "1"}, **HTMX).status_code == 204
    assert Schedules.objects.get(name="off").enabled is True
    assert OperatorAction.objects.filter(command="set_schedule_enabled").count() == 2


def test_run_now_enqueues_one_audited_job(operator: Client, nightly: None) -> None:
    response = operator.post("/deck/api/schedules/nightly/run")
    assert response.status_code == 200
    job_id = response.json()["jobId"]
    job = JobsHot.objects.get(id=job_id)
    assert (job.type, job.queue, job.created_by, job.tags) == ("test.ok.v1", "reports", "operator-user",
                                                               "schedule:nightly,run:now")
    entry = OperatorAction.objects.get(command="run_schedule_now")
    assert (entry.job_id, entry.actor) == (job_id, "operator-user")
    assert Schedules.objects.get(name="nightly").last_job_id == job_id


def test_schedule_commands_refuse_bad_input_and_change_nothing(operator: Client, nightly: None) -> None:
    assert operator.post("/deck/api/schedules/nope/run").status_code == 404
    assert operator.post("/deck/api/schedules/nope/enabled", {"value": "0"}).status_code == 404
    bad = operator.post("/deck/api/schedules/nightly/enabled", {"value": "maybe"})
    assert bad.status_code == 400 and "must be 1 or 0" in bad.json()["error"]
    assert operator.post("/deck/api/schedules/nightly/enabled").status_code == 400
    assert not Schedules.objects.exists() and not JobsHot.objects.exists()
    assert not OperatorAction.objects.filter(command__in=["run_schedule_now", "set_schedule_enabled"]).exists()


def test_the_operator_page_has_the_schedule_controls(operator: Client, nightly: None) -> None:
    body = operator.get("/deck/").content.decode()
    assert 'hx-post="/deck/api/schedules/nightly/enabled"' in body
    assert 'hx-post="/deck/api/schedules/nightly/run"' in body and "hx-confirm=" in body


def test_a_disabled_schedule_has_no_next_run(viewer: Client, nightly: None) -> None:
    service.set_schedule_enabled("nightly", False, now=datetime.now(UTC) - timedelta(minutes=1))
    rows = {r["name"]: r for r in service.recurring()}
    assert rows["nightly"]["nextRunUtc"] is None and rows["nightly"]["overridden"] is True
