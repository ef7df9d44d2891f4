"""Metrics of spec 05 §2: /deck/metrics scraped by the test client, parsed by prometheus_client's parser."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from chokaq_core import enqueue, metrics, storage
from chokaq_core.domain import Failure, FailureReason, HotJob, JobStatus, Retry, Success, WorkerInfo
from chokaq_core.models import JobsHot, Workers
from chokaq_core.worker import Worker
from tests.conftest import database_url

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(autouse=True)
def _fresh_tag_guards() -> Iterator[None]:
    """The cardinality guards are process-wide: a suite run before this one may have filled them with its
    queue names (100 by default), and this file's labels would then read "other"."""
    for guard in metrics.GUARDS:
        guard.reset()
    yield


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def scrape(client: Client) -> Samples:
    response = client.get("/deck/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    return parse(response.content.decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def make_job(queue: str, job_type: str) -> HotJob:
    now = datetime.now(UTC)
    return HotJob(id="j", queue=queue, type=job_type, payload="{}", tags=None, idempotency_key=None, priority=10,
                  status=JobStatus.PROCESSING, attempt_count=1, worker_id="w", heartbeat_at=None, scheduled_at=None,
                  created_at=now, started_at=None, last_updated_at=now, created_by=None, last_modified_by=None)


def test_worker_instruments_count_what_happened(client: Client, burst: Callable[..., Worker],
                                                fast: Callable[..., None]) -> None:
    fast(RETRY={"MAX_ATTEMPTS": 2})
    before = scrape(client)
    ok = [enqueue("test.ok.v1", {}, queue="m-ok") for _ in range(3)]
    enqueue("test.fatal.v1", {}, queue="m-bad")
    enqueue("test.fail.v1", {"succeed_on": 2}, queue="m-retry")
    burst()
    while JobsHot.objects.filter(queue__in=["m-ok", "m-bad", "m-retry"]).exists():  # the retry is due a bit later
        burst()
    assert storage.get_archived(ok[0]) is not None
    after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("chokaq_jobs_enqueued_total", queue="m-ok", type="test.ok.v1") == 3
    assert delta("chokaq_jobs_completed_total", queue="m-ok", type="test.ok.v1") == 3
    assert delta("chokaq_jobs_processing_duration_count", queue="m-ok", type="test.ok.v1") == 3
    assert delta("chokaq_jobs_queue_lag_count", queue="m-ok", type="test.ok.v1") == 3
    assert delta("chokaq_jobs_failed_total", queue="m-bad", type="test.fatal.v1", error="ChokaQFatalError") == 1
    assert delta("chokaq_jobs_dlq_total", queue="m-bad", type="test.fatal.v1", reason="FatalError") == 1
    assert delta("chokaq_jobs_failed_total", queue="m-retry", type="test.fail.v1", error="ConnectionError") == 1
    assert delta("chokaq_jobs_retried_total", queue="m-retry", type="test.fail.v1", attempt="2") == 1
    assert delta("chokaq_jobs_completed_total", queue="m-retry", type="test.fail.v1") == 1
    assert value(after, "chokaq_workers_active", queue="m-ok") == 0
    # fleet gauges read from the database
    assert value(after, "chokaq_jobs_retained", queue="m-ok", pillar="archive") == 3
    assert value(after, "chokaq_jobs_retained", queue="m-bad", pillar="dlq") == 1
    assert value(after, "chokaq_outcomes_last_minute", outcome="succeeded") >= 4
    assert value(after, "chokaq_scrape_error") == 0
    storage.purge_archive_ids(ok[:1])
    assert value(scrape(client), "chokaq_jobs_retained", queue="m-ok", pillar="archive") == 2, "purged rows are gone"


def test_fleet_gauges(client: Client) -> None:
    enqueue("test.ok.v1", {}, queue="m-depth")
    enqueue("test.ok.v1", {}, queue="m-depth")
    storage.fetch_batch("w1", 1, ["m-depth"])
    storage.upsert_worker(WorkerInfo(
        worker_id="w1", hostname="h", pid=1, queues="*", capacity=8, active_count=3,
        circuits_json=json.dumps([{"circuitKey": "email.send.v1", "status": 1, "failureCount": 5},
                                  {"circuitKey": "sms.send.v1", "status": 0, "failureCount": 0}])))
    storage.upsert_worker(WorkerInfo(worker_id="w2", hostname="h", pid=2, queues="*", capacity=2, active_count=0,
                                     circuits_json=json.dumps([{"circuitKey": "email.send.v1", "status": 1}])))
    storage.upsert_worker(WorkerInfo(worker_id="gone", hostname="h", pid=3, queues="*", capacity=50, active_count=0))
    storage.stop_worker("gone")
    samples = scrape(client)
    assert value(samples, "chokaq_queue_depth", queue="m-depth", status="pending") == 1
    assert value(samples, "chokaq_queue_depth", queue="m-depth", status="fetched") == 1
    assert value(samples, "chokaq_queue_due_pending", queue="m-depth") == 1
    assert ("chokaq_queue_lag_seconds", (("queue", "m-depth"),)) in samples
    assert value(samples, "chokaq_workers_running") == 2
    assert value(samples, "chokaq_workers_capacity") == 10
    assert value(samples, "chokaq_workers_busy") == 3
    assert 0 <= value(samples, "chokaq_worker_heartbeat_age_seconds", which="stalest") < 60
    assert value(samples, "chokaq_circuit_state", type="email.send.v1", state="Open") == 2
    assert value(samples, "chokaq_circuit_state", type="sms.send.v1", state="Closed") == 1


def test_a_database_outage_does_not_break_the_scrape(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    def down() -> list[Any]:
        raise ConnectionError("database away")

    monkeypatch.setattr(storage, "queue_stats", down)
    samples = scrape(client)
    assert value(samples, "chokaq_scrape_error") == 1


def test_transition_conflicts_heartbeat_failures_circuits_and_idempotency(client: Client) -> None:
    before = scrape(client)
    job = make_job("m-x", "m.type")
    metrics.transition_conflict("MarkAsProcessing", job.queue, job.type)
    metrics.completion_conflicts([Success("j", 1.0), Retry("j", 1, 1.0), Failure("j", FailureReason.CANCELLED, "x"),
                                  Failure("j", FailureReason.TIMEOUT, "x")])
    metrics.heartbeat_failed([job, job])
    metrics.circuit_event("m.type", "opened", "Open")
    metrics.idempotency_claim("completed_duplicate")
    metrics.zombies_moved([("z1", "m-x")])
    after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("chokaq_jobs_state_transition_conflicts_total", queue="m-x", type="m.type",
                 transition="MarkAsProcessing") == 1
    for transition in ("ArchiveSucceeded", "RescheduleForRetry", "ArchiveCancelled", "ArchiveFailed"):
        assert delta("chokaq_jobs_state_transition_conflicts_total", queue="unknown", type="unknown",
                     transition=transition) == 1
    assert delta("chokaq_jobs_heartbeat_failures_total", queue="m-x", type="m.type") == 2
    assert delta("chokaq_circuits_events_total", type="m.type", state="Open", event="opened") == 1
    assert delta("chokaq_idempotency_claims_total", outcome="completed_duplicate") == 1
    assert delta("chokaq_jobs_dlq_total", queue="m-x", type="unknown", reason="Zombie") == 1


def test_cardinality_guard(chokaq_settings: Any) -> None:
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "METRICS": {
        "MAX_QUEUE_TAG_VALUES": 2, "MAX_TAG_VALUE_LENGTH": 5, "UNKNOWN_TAG_VALUE": "n/a", "OVERFLOW_TAG_VALUE": "many"}}
    guard = metrics.TagGuard("queue", "MAX_QUEUE_TAG_VALUES")
    assert guard("  alpha  ") == "alpha"
    assert guard("bravo-long-name") == "bravo"
    assert guard("charlie") == "many"
    assert guard("alpha") == "alpha"
    assert guard("   ") == "many"  # "unknown" is a value like any other: the family is full
    guard.reset()
    assert guard("") == "n/a"


@pytest.fixture(scope="module")
def otel_reader() -> Iterator[Any]:
    from opentelemetry import metrics as otel
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    otel.set_meter_provider(MeterProvider(metric_readers=[reader]))
    yield reader


def test_opentelemetry_meter_chokaq_records_the_same_instruments(otel_reader: Any) -> None:
    job = make_job("otel-q", "otel.type")
    metrics.execution_outcome(job, Success("o", 12.0))
    data = otel_reader.get_metrics_data()
    found = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found[(scope.scope.name, scope.scope.version, metric.name)] = metric
    assert ("ChokaQ", "1.0.0", "chokaq.jobs.completed") in found
    points = found[("ChokaQ", "1.0.0", "chokaq.jobs.completed")].data.data_points
    assert any(dict(p.attributes) == {"queue": "otel-q", "type": "otel.type"} and p.value >= 1 for p in points)
    assert found[("ChokaQ", "1.0.0", "chokaq.jobs.processing_duration")].unit == "ms"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.acceptance
@pytest.mark.slow
def test_worker_metrics_port(tmp_path: Path) -> None:
    port = _free_port()
    log = (tmp_path / "worker.log").open("wb")
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    proc = subprocess.Popen([sys.executable, "manage.py", "chokaq_worker", "--metrics-port", str(port),
                             "--concurrency", "2"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        job_id = enqueue("test.ok.v1", {}, queue="m-port")
        deadline = time.monotonic() + 60
        samples: Samples = {}
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "worker.log").read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    samples = parse(response.read().decode())
            except OSError:
                time.sleep(0.2)
                continue
            if value(samples, "chokaq_jobs_completed_total", queue="m-port", type="test.ok.v1") >= 1:
                break
            time.sleep(0.2)
        assert value(samples, "chokaq_jobs_completed_total", queue="m-port", type="test.ok.v1") == 1
        assert value(samples, "chokaq_workers_running") >= 1
        # The counter moves when the handler returns; the archive commit follows in the next completion batch.
        while storage.get_archived(job_id) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert storage.get_archived(job_id) is not None
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.returncode == 0, (tmp_path / "worker.log").read_text()
    assert not Workers.objects.filter(is_running=True).exists()


def test_rate_limit_instruments_and_gauges_name_the_limit_never_a_key(client: Client) -> None:
    from chokaq_core.domain import RateLimit, parse_rate

    # a token each 6 s: none comes back before the scrape (on PostgreSQL the buckets carry the test transaction's
    # start time, which the scrape's clock has left behind by then)
    capped = RateLimit("type:test.ok.v1", parse_rate("10/m burst 2"))
    tenants = RateLimit("queue:m-keys", parse_rate("10/m burst 1"), per_key=True)
    storage.declare_rate_limits([capped, tenants])
    for _ in range(5):
        enqueue("test.ok.v1", {}, queue="m-rl")
    for tenant in ("tenant:secret-1", "tenant:secret-1", "tenant:secret-2"):
        enqueue("test.other.v1", {}, queue="m-keys", rate_key=tenant, allow_unregistered=True)
    before = scrape(client)

    claimed = storage.fetch_batch("w1", 10)  # claimed without the limits: the lease spends the tokens
    leased = storage.mark_processing_batch(claimed, "w1", [capped, tenants])

    assert len(leased) == 3, "one of the capped type (a new limit starts with one token), one per tenant"
    after = scrape(client)
    assert value(after, "chokaq_rate_limit_claimed_total", limit="type:test.ok.v1") - value(
        before, "chokaq_rate_limit_claimed_total", limit="type:test.ok.v1") == 1
    assert value(after, "chokaq_rate_limit_held_total", limit="type:test.ok.v1") - value(
        before, "chokaq_rate_limit_held_total", limit="type:test.ok.v1") == 4
    assert value(after, "chokaq_rate_limit_count", limit="type:test.ok.v1") == 10
    assert value(after, "chokaq_rate_limit_window_seconds", limit="type:test.ok.v1") == 60
    assert value(after, "chokaq_rate_limit_used", limit="type:test.ok.v1") == 1
    assert value(after, "chokaq_rate_limit_held_jobs", limit="type:test.ok.v1") == 4
    assert value(after, "chokaq_rate_limit_used", limit="queue:m-keys") == 2
    assert value(after, "chokaq_rate_limit_held_jobs", limit="queue:m-keys") == 1
    labels = {v for (_, pairs) in after for (_, v) in pairs}
    assert not any("secret" in label for label in labels), "rate keys are never labels"
