"""Bad input to the control plane: breaker settings that make no sense fail the system checks
and start-up; out-of-range queue and worker limits are refused and change nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from chokaq_core import enqueue, service, storage
from chokaq_core.models import JobsDLQ, JobsHot, Queues
from tests.control.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("breaker", "fragment"),
    [
        ({"DEFAULT": {"FAILURE_THRESHOLD": 0}}, "CIRCUIT_BREAKER.DEFAULT.FAILURE_THRESHOLD must be a number >= 1"),
        ({"DEFAULT": {"BREAK_DURATION_SECONDS": 0.5}}, "CIRCUIT_BREAKER.DEFAULT.BREAK_DURATION_SECONDS must be"),
        ({"DEFAULT": {"HALF_OPEN_MAX_CALLS": -1}}, "HALF_OPEN_MAX_CALLS must be a number >= 1"),
        ({"DEFAULT": {"FAILURE_WINDOW_SECONDS": "60"}}, "FAILURE_WINDOW_SECONDS must be a number >= 1"),
        ({"DEFAULT": {"FAILURE_TRESHOLD": 3}}, "CIRCUIT_BREAKER.DEFAULT: unknown key 'FAILURE_TRESHOLD'"),
        ({"POLICIES": {"email.send.v1": {"HALF_OPEN_PROBE_TIMEOUT_SECONDS": 0}}},
         "CIRCUIT_BREAKER.POLICIES.email.send.v1.HALF_OPEN_PROBE_TIMEOUT_SECONDS must be a number >= 1"),
        ({"POLICIES": {"email.send.v1": {"BOGUS": 1}}}, "POLICIES.email.send.v1: unknown key 'BOGUS'"),
        ({"POLICIES": {"email.send.v1": 5}}, "CIRCUIT_BREAKER.POLICIES.email.send.v1 must be a dict"),
    ],
)
def test_nonsense_breaker_settings_fail_manage_py_check(chokaq_settings: Any, breaker: dict[str, Any],
                                                         fragment: str) -> None:
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "CIRCUIT_BREAKER": breaker}
    with pytest.raises(SystemCheckError) as excinfo:
        call_command("check")
    assert "chokaq.E001" in str(excinfo.value)
    assert fragment in str(excinfo.value)


def test_a_worker_process_with_a_nonsense_breaker_does_not_start() -> None:
    """Validation also runs in ``ready()``: the process fails before any job could be claimed."""
    overrides = {"CIRCUIT_BREAKER": {"DEFAULT": {"FAILURE_THRESHOLD": 0}, "POLICIES": {"x.v1": {"BOGUS": 2}}}}
    env = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "tests.settings",
           "CHOKAQ_TEST_OVERRIDES": json.dumps(overrides), "DATABASE_URL": "sqlite:///:memory:"}
    for command in (["check"], ["chokaq_worker", "--burst"]):
        result = subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=env, capture_output=True,
                                text=True, timeout=60)
        output = result.stdout + result.stderr
        assert result.returncode != 0, output
        assert "Invalid ChokaQ configuration" in output
        assert "CIRCUIT_BREAKER.DEFAULT.FAILURE_THRESHOLD must be a number >= 1 (got 0)" in output
        assert "CIRCUIT_BREAKER.POLICIES.x.v1: unknown key 'BOGUS'" in output


@pytest.mark.parametrize("value", [0, -1, 10_001, "many", "2.5", 1.5, True])
def test_max_workers_out_of_range_is_refused_and_nothing_changes(value: Any) -> None:
    service.set_queue_max_workers("ctl-limits", 5)
    before = Queues.objects.get(name="ctl-limits")
    with pytest.raises(service.ServiceError, match="max workers must be"):
        service.set_queue_max_workers("ctl-limits", value)
    after = Queues.objects.get(name="ctl-limits")
    assert (after.max_workers, after.last_updated_at) == (5, before.last_updated_at)
    with pytest.raises(service.ServiceError):
        service.set_queue_max_workers("ctl-unknown", value)
    assert not Queues.objects.filter(name="ctl-unknown").exists(), "a refused command created a queue row"


def test_max_workers_bounds_are_accepted_and_none_clears() -> None:
    assert service.set_queue_max_workers("ctl-limits", 1) == 1
    assert service.set_queue_max_workers("ctl-limits", "10000") == 10_000
    assert Queues.objects.get(name="ctl-limits").max_workers == 10_000
    assert service.set_queue_max_workers("ctl-limits", None) is None
    assert Queues.objects.get(name="ctl-limits").max_workers is None


@pytest.mark.parametrize("value", [0, 86_401, "soon"])
def test_zombie_timeout_out_of_range_is_refused(value: Any) -> None:
    service.set_queue_zombie_timeout("ctl-limits", 30)
    with pytest.raises(service.ServiceError, match="zombie timeout must be"):
        service.set_queue_zombie_timeout("ctl-limits", value)
    assert Queues.objects.get(name="ctl-limits").zombie_timeout_seconds == 30


@pytest.mark.parametrize("name", ["", "   ", "q" * 256])
def test_bad_queue_names_are_refused(name: str) -> None:
    with pytest.raises(service.ServiceError, match="queue name must be 1-255 characters"):
        service.set_queue_paused(name, True)
    with pytest.raises(service.ServiceError):
        service.set_queue_max_workers(name, 3)
    assert not Queues.objects.exists()


@pytest.mark.parametrize("value", [0, 10_001, "", "four"])
def test_worker_capacity_out_of_range_is_refused(value: Any) -> None:
    with pytest.raises(service.ServiceError, match="capacity"):
        service.set_worker_capacity(value)


def test_bulk_commands_take_at_most_1000_ids_and_change_nothing_otherwise() -> None:
    job_id = enqueue("test.ok.v1", {})
    too_many = [job_id, *(f"missing-{n}" for n in range(1000))]
    with pytest.raises(service.ServiceError, match="at most 1000 ids"):
        service.cancel_many(too_many, actor="ops")
    with pytest.raises(service.ServiceError, match="at most 1000 ids"):
        service.resurrect_many(too_many, actor="ops")
    with pytest.raises(service.ServiceError, match="no job ids"):
        service.cancel_many(["", "  "], actor="ops")
    assert JobsHot.objects.filter(id=job_id, status=0).exists() and not JobsDLQ.objects.exists()

    # Exactly 1000 (with duplicates folded) is fine: the one real job is cancelled, the rest are unknown.
    moved, flagged = service.cancel_many([job_id, job_id, *(f"missing-{n}" for n in range(999))], actor="ops")
    assert (moved, flagged) == ([job_id], [])
    dead = storage.get_dead(job_id)
    assert dead is not None and "ops" in (dead.error_details or "")
    assert service.resurrect_many([job_id, *(f"missing-{n}" for n in range(999))], actor="ops") == [job_id]
    assert JobsHot.objects.filter(id=job_id, status=0).exists() and not JobsDLQ.objects.exists()
