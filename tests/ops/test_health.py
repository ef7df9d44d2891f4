"""Health checks of spec 05 §4: the JSON endpoint and ``manage.py chokaq_health`` agree."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import OperationalError, connections
from django.test import Client

from chokaq_core import enqueue, health, storage
from chokaq_core.domain import WorkerInfo
from chokaq_core.models import JobsHot, Workers
from chokaq_core.readmodel import QueueLag
from chokaq_core.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)


def register(worker_id: str = "w-1", hostname: str = "host-a", capacity: int = 4) -> None:
    storage.upsert_worker(WorkerInfo(worker_id=worker_id, hostname=hostname, pid=1, queues="*", capacity=capacity,
                                     active_count=0))


def get(client: Client, query: str = "") -> tuple[int, dict[str, Any]]:
    response = client.get("/deck/health/" + query)
    assert response["Content-Type"] == "application/json"
    return response.status_code, json.loads(response.content)


def command(*args: str) -> tuple[int, dict[str, Any]]:
    out = StringIO()
    with pytest.raises(SystemExit) as exit_info:
        call_command("chokaq_health", *args, stdout=out)
    return int(exit_info.value.code or 0), json.loads(out.getvalue())


def test_healthy_fleet_is_200_and_exit_0(client: Client) -> None:
    register()
    status, body = get(client)
    assert status == 200
    assert body["status"] == "Healthy"
    assert set(body["checks"]) == {"chokaq_sql", "chokaq_worker", "chokaq_queue_saturation"}
    worker = body["checks"]["chokaq_worker"]
    assert worker["status"] == "Healthy"
    assert {"active", "capacity", "isRunning", "lastHeartbeatUtc", "heartbeatAgeSeconds", "workerCount"} <= set(
        worker["data"])
    saturation = body["checks"]["chokaq_queue_saturation"]["data"]
    assert {"generatedAtUtc", "queueCount", "jobsPerSecondLastMinute", "failureRateLastMinutePercent", "worstQueue",
            "worstQueuePending", "worstQueueMaxLagSeconds"} <= set(saturation)
    assert body["checks"]["chokaq_sql"]["data"]["missingTables"] == []
    code, report = command()
    assert (code, report["status"]) == (0, "Healthy")


def test_no_worker_is_unhealthy(client: Client) -> None:
    status, body = get(client)
    assert status == 503
    assert body["status"] == "Unhealthy"
    assert "has not entered its runtime loop" in body["checks"]["chokaq_worker"]["description"]
    assert command()[0] == 1


def test_a_stopped_worker_turns_the_check_unhealthy(client: Client, fast: Callable[..., None]) -> None:
    worker = Worker()
    worker.start()
    try:
        status, body = get(client, "?tags=live")
        assert (status, body["checks"]["chokaq_worker"]["status"]) == (200, "Healthy")
        assert body["checks"]["chokaq_worker"]["data"]["workerId"] == worker.worker_id
    finally:
        worker.stop()
        assert worker.stopped.wait(30)
    status, body = get(client, "?tags=live")
    assert status == 503
    assert body["checks"]["chokaq_worker"]["status"] == "Unhealthy"
    assert command("--tags", "live")[0] == 1


def test_stale_heartbeat_and_zero_capacity(client: Client) -> None:
    register()
    Workers.objects.update(last_heartbeat_at=datetime.now(UTC) - timedelta(seconds=31))
    status, body = get(client, "?tags=live")
    assert status == 503
    assert body["checks"]["chokaq_worker"]["description"].startswith("ChokaQ worker heartbeat is stale. Age=")
    assert "Timeout=30.0s" in body["checks"]["chokaq_worker"]["description"]
    register("w-2", capacity=0)
    status, body = get(client, "?tags=live")
    assert status == 503
    assert "no capacity" in body["checks"]["chokaq_worker"]["description"]


def test_host_filter_of_the_command() -> None:
    register("w-a", hostname="host-a")
    assert command("--tags", "live", "--host", "host-a")[0] == 0
    code, report = command("--tags", "live", "--host", "host-b")
    assert code == 1
    assert "on host host-b" in report["checks"]["chokaq_worker"]["description"]


def test_tags_select_checks(client: Client) -> None:
    register()
    _, body = get(client, "?tags=live")
    assert set(body["checks"]) == {"chokaq_worker"}
    _, body = get(client, "?tags=sql,saturation")
    assert set(body["checks"]) == {"chokaq_sql", "chokaq_queue_saturation"}
    assert set(command("--tags", "storage")[1]["checks"]) == {"chokaq_sql"}


def test_saturated_queue_is_unhealthy_lagging_queue_degraded(client: Client) -> None:
    register()
    job_id = enqueue("test.ok.v1", {}, queue="reports")
    JobsHot.objects.filter(id=job_id).update(created_at=datetime.now(UTC) - timedelta(seconds=60))
    status, body = get(client)
    assert status == 503
    check = body["checks"]["chokaq_queue_saturation"]
    assert check["status"] == "Unhealthy"
    assert (check["data"]["worstQueue"], check["data"]["worstQueuePending"]) == ("reports", 1)
    assert check["data"]["worstQueueMaxLagSeconds"] >= 60
    assert command("--tags", "saturation")[0] == 1
    JobsHot.objects.filter(id=job_id).update(created_at=datetime.now(UTC) - timedelta(seconds=7))
    status, body = get(client)
    assert (status, body["status"], body["checks"]["chokaq_queue_saturation"]["status"]) == (200, "Degraded",
                                                                                            "Degraded")
    assert command()[0] == 0


def test_future_jobs_do_not_count_as_lag(client: Client) -> None:
    register()
    enqueue("test.ok.v1", {}, delay=3600)
    _, body = get(client)
    assert body["checks"]["chokaq_queue_saturation"]["status"] == "Healthy"


@pytest.mark.parametrize(("lag", "expected"), [(5.0, "Healthy"), (5.001, "Degraded"), (10.0, "Degraded"),
                                               (10.001, "Unhealthy")])
def test_thresholds_are_strict(monkeypatch: pytest.MonkeyPatch, lag: float, expected: str) -> None:
    monkeypatch.setattr(storage, "queue_health", lambda: [QueueLag("default", 1, lag, lag)])
    assert health.check_queue_saturation().status == expected


def test_unreachable_database_and_missing_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "REQUIRED_TABLES", (*health.REQUIRED_TABLES, "chokaq_not_there"))
    result = health.check_sql()
    assert result.status == "Unhealthy"
    assert "missing required tables: chokaq_not_there" in result.description

    def refuse(*args: Any, **kwargs: Any) -> list[str]:
        raise OperationalError("connection refused")

    monkeypatch.setattr(type(connections["default"].introspection), "table_names", refuse)
    result = health.check_sql()
    assert result.status == "Unhealthy"
    assert result.description.startswith("ChokaQ SQL storage is not reachable: OperationalError")


def test_only_get_and_head(client: Client) -> None:
    assert client.post("/deck/health/").status_code == 405
