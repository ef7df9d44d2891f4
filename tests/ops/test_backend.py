"""The ``django.tasks`` backend against Django's task API contract, using the documented examples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core import mail
from django.db import transaction
from django.tasks import TaskResultStatus, default_task_backend, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils import timezone

from chokaq_core import FailureReason, UnknownJobTypeError, enqueue, storage
from chokaq_core.backend import ChokaQBackend, type_key_for
from chokaq_core.domain import AttemptError, Failure
from chokaq_core.models import JobsArchive, JobsDLQ, JobsHot
from chokaq_core.worker import Worker
from tests.adopter import tasks as adopter_tasks
from tests.conftest import database_url
from tests.ops import tasks
from tests.ops.conftest import FAST

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def signals() -> Iterator[list[tuple[str, str, str]]]:
    """(signal, task result id, status) in the order Django's task signals fired."""
    seen: list[tuple[str, str, str]] = []

    def receiver(name: str) -> Callable[..., None]:
        def record(sender: Any, task_result: Any, **kwargs: Any) -> None:
            seen.append((name, task_result.id, str(task_result.status)))

        return record

    receivers = {task_enqueued: receiver("enqueued"), task_started: receiver("started"),
                 task_finished: receiver("finished")}
    for signal, func in receivers.items():
        signal.connect(func, weak=False)
    yield seen
    for signal, func in receivers.items():
        signal.disconnect(func)


def wait_for(condition: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not met before the deadline")


def test_the_configured_backend_is_chokaq_with_honest_capabilities() -> None:
    backend = task_backends["default"]
    assert isinstance(backend, ChokaQBackend)
    assert (backend.supports_defer, backend.supports_async_task, backend.supports_get_result,
            backend.supports_priority) == (True, True, True, True)
    assert backend.check() == []


def test_documented_email_example_runs_on_a_chokaq_worker(burst: Callable[..., Worker],
                                                           signals: list[tuple[str, str, str]]) -> None:
    result = tasks.email_users.enqueue(emails=["user@example.com"], subject="You have a message",
                                       message="Hello there!")
    assert result.status == TaskResultStatus.READY
    assert not result.is_finished
    row = JobsHot.objects.get(id=result.id)
    assert row.type == "django.task:tests.ops.tasks.email_users" == type_key_for(tasks.email_users)
    assert json.loads(row.payload or "") == {
        "args": [], "kwargs": {"emails": ["user@example.com"], "subject": "You have a message",
                               "message": "Hello there!"}}
    assert (row.queue, row.priority) == ("default", 10)
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value

    burst()

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished
    assert result.return_value == 1
    assert result.errors == []
    assert result.attempts == 1
    assert result.enqueued_at is not None and result.started_at is not None and result.finished_at is not None
    assert [m.subject for m in mail.outbox] == ["You have a message"]
    assert JobsArchive.objects.get(id=result.id).result == "1"
    same = tasks.email_users.get_result(result.id)
    assert (same.id, same.status, same.return_value, same.kwargs["emails"]) == (
        result.id, TaskResultStatus.SUCCESSFUL, 1, ["user@example.com"])
    assert default_task_backend.get_result(result.id).return_value == 1
    assert signals == [("enqueued", result.id, "READY"), ("started", result.id, "RUNNING"),
                       ("finished", result.id, "SUCCESSFUL")]


def test_queue_name_and_priority_map_onto_the_job(burst: Callable[..., Worker]) -> None:
    result = tasks.email_users_priority.enqueue(emails=["a@example.com"], subject="s", message="m")
    row = JobsHot.objects.get(id=result.id)
    assert (row.queue, row.priority) == ("emails", 12)
    high = tasks.calculate_meaning_of_life.using(priority=100, queue_name="emails").enqueue()
    low = tasks.calculate_meaning_of_life.using(priority=-100).enqueue()
    assert JobsHot.objects.get(id=high.id).priority == 110
    assert JobsHot.objects.get(id=low.id).priority == -90
    pending = default_task_backend.get_result(high.id)
    assert (pending.task.priority, pending.task.queue_name, pending.status) == (100, "emails", TaskResultStatus.READY)
    burst()
    assert default_task_backend.get_result(high.id).return_value == 42
    assert default_task_backend.get_result(low.id).return_value == 42


def test_run_after_defers_the_job(burst: Callable[..., Worker]) -> None:
    later = timezone.now() + timedelta(minutes=5)
    result = tasks.email_users.using(priority=10, run_after=later).enqueue(
        emails=["user@example.com"], subject="later", message="later")
    row = JobsHot.objects.get(id=result.id)
    assert row.scheduled_at is not None and abs((row.scheduled_at - later).total_seconds()) < 5
    assert row.priority == 20
    burst()
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert mail.outbox == []


def test_takes_context_sees_attempt_and_result_id(burst: Callable[..., Worker],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    result = tasks.email_users_with_context.enqueue(emails=["user@example.com"], subject="ctx", message="m")
    burst()
    assert tasks.SEEN_CONTEXTS == [(1, result.id)]
    result.refresh()
    assert result.return_value == 1


def test_a_task_that_raises_ends_failed_with_its_error(burst: Callable[..., Worker],
                                                        signals: list[tuple[str, str, str]]) -> None:
    result = tasks.reject.enqueue(7)
    burst()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished
    assert len(result.errors) == 1
    assert result.errors[0].exception_class is ValueError
    assert "bad value 7" in result.errors[0].traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    assert JobsDLQ.objects.filter(id=result.id).exists()
    assert [s[0] for s in signals] == ["enqueued", "started", "finished"]
    assert signals[-1][2] == "FAILED"


def test_transient_failure_is_retried_and_both_attempts_signal(burst: Callable[..., Worker],
                                                                signals: list[tuple[str, str, str]]) -> None:
    result = tasks.flaky.enqueue("k1")
    wait_for(lambda: burst() and not JobsHot.objects.filter(id=result.id).exists())
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "second time lucky"
    assert result.attempts == 2
    assert [(name, status) for name, _, status in signals] == [
        ("enqueued", "READY"), ("started", "RUNNING"), ("finished", "FAILED"), ("started", "RUNNING"),
        ("finished", "SUCCESSFUL")]


def test_running_task_reads_running(background_worker: Callable[..., Worker]) -> None:
    result = tasks.wait_for_gate.enqueue("g1")
    background_worker()
    wait_for(lambda: default_task_backend.get_result(result.id).status == TaskResultStatus.RUNNING)
    running = default_task_backend.get_result(result.id)
    assert running.started_at is not None and running.finished_at is None
    wait_for(lambda: "g1" in tasks.GATES)  # Processing from the lease on; the task itself starts a moment later
    tasks.GATES["g1"].set()
    wait_for(lambda: default_task_backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL)
    assert default_task_backend.get_result(result.id).return_value == "g1"


def test_async_enqueue_get_result_and_async_task(burst: Callable[..., Worker]) -> None:
    async def produce() -> str:
        result = await tasks.acalculate_meaning_of_life.aenqueue()
        return result.id

    result_id = async_to_sync(produce)()
    burst()

    async def consume() -> Any:
        result = await tasks.acalculate_meaning_of_life.aget_result(result_id)
        await result.arefresh()
        return result

    result = async_to_sync(consume)()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"answer": 42, "question": None}


def test_enqueued_signal_waits_for_commit(signals: list[tuple[str, str, str]]) -> None:
    with transaction.atomic():
        result = tasks.calculate_meaning_of_life.enqueue()
        assert signals == []
    assert signals == [("enqueued", result.id, "READY")]
    with pytest.raises(RuntimeError), transaction.atomic():
        rolled_back = tasks.calculate_meaning_of_life.enqueue()
        raise RuntimeError("abort")
    assert len(signals) == 1
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(rolled_back.id)


def test_lookup_errors() -> None:
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("no-such-id")
    job_id = enqueue("test.ok.v1", {})
    with pytest.raises(TaskResultDoesNotExist, match=r"not a django\.tasks task"):
        default_task_backend.get_result(job_id)
    result = tasks.calculate_meaning_of_life.enqueue()
    with pytest.raises(TaskResultMismatch):
        tasks.email_users.get_result(result.id)


def test_invalid_tasks_are_refused() -> None:
    with pytest.raises(InvalidTask, match="aware"):
        tasks.calculate_meaning_of_life.using(run_after=timezone.now().replace(tzinfo=None)).enqueue()
    with pytest.raises(InvalidTask, match="priority"):
        tasks.calculate_meaning_of_life.using(priority=101)
    for queue in ("a b", "q/..", "<b>"):  # outside the queue alphabet: refused by the backend, not at enqueue
        with pytest.raises(InvalidTask, match="queue_name"):
            tasks.calculate_meaning_of_life.using(queue_name=queue)
    with pytest.raises(TypeError):
        tasks.email_users.enqueue(emails=[object()], subject="s", message="m")
    assert JobsHot.objects.count() == 0


def test_unimportable_task_row_goes_to_the_dlq(burst: Callable[..., Worker]) -> None:
    job_id = enqueue("django.task:tests.ops.tasks.gone", {"args": [], "kwargs": {}}, allow_unregistered=True)
    burst()
    dead = storage.get_dead(job_id)
    assert dead is not None and "gone" in (dead.error_details or "")


def test_a_task_key_outside_the_installed_apps_is_never_imported_at_enqueue() -> None:
    for path, module in (("this.nothing", "this"), ("tests.api.outside_apps.planted", "tests.api.outside_apps")):
        with pytest.raises(UnknownJobTypeError):
            enqueue(f"django.task:{path}", {"args": [], "kwargs": {}})
        assert module not in sys.modules, f"enqueue imported {module}"
    assert JobsHot.objects.count() == 0


def test_a_stored_task_key_outside_the_installed_apps_is_never_imported_by_worker_or_result(
        burst: Callable[..., Worker]) -> None:
    job_id = enqueue("django.task:tests.api.outside_apps.planted", {"args": [], "kwargs": {}},
                     allow_unregistered=True)
    with pytest.raises(TaskResultDoesNotExist, match="not in a module of an installed app"):
        default_task_backend.get_result(job_id)
    burst()
    dead = storage.get_dead(job_id)
    assert dead is not None and dead.failure_reason == FailureReason.FATAL_ERROR
    assert "tests.api.outside_apps" not in sys.modules, "the worker imported a module outside the installed apps"


# ---------------------------------------------------------------- the django.tasks contract, exactly


def _drain(burst: Callable[..., Worker], job_id: str) -> None:
    """Burst workers until the job left Hot (retries come back due after a short backoff)."""
    wait_for(lambda: burst() and not JobsHot.objects.filter(id=job_id).exists())


def test_get_result_equals_the_result_enqueue_returned() -> None:
    for enqueued in (tasks.calculate_meaning_of_life.enqueue(),
                     tasks.email_users_priority.enqueue(emails=["a@b.c"], subject="s", message="m")):
        stored = default_task_backend.get_result(enqueued.id)
        assert stored.enqueued_at == enqueued.enqueued_at  # to the microsecond: the row's own timestamp
        assert stored == enqueued
    with transaction.atomic():
        inside = tasks.calculate_meaning_of_life.enqueue()
        assert default_task_backend.get_result(inside.id) == inside


def test_a_failed_result_has_its_times_and_a_traceback_in_djangos_shape(burst: Callable[..., Worker]) -> None:
    result = tasks.reject.enqueue(7)
    burst()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.started_at is not None and result.last_attempted_at is not None
    assert result.enqueued_at <= result.started_at <= result.last_attempted_at <= result.finished_at  # type: ignore[operator]
    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.traceback.startswith("Traceback (most recent call last):\n  File ")
    assert error.traceback.endswith("ValueError: bad value 7\n")


def test_every_failed_attempt_keeps_its_error(burst: Callable[..., Worker]) -> None:
    result = adopter_tasks.always_down.enqueue("k1")
    _drain(burst, result.id)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert len(result.errors) == 3 == result.attempts  # RETRY.MAX_ATTEMPTS of the fast fixture
    for error in result.errors:
        assert error.exception_class is ConnectionError
        assert error.traceback.endswith("ConnectionError: payment gateway timeout (k1)\n")
    first_start = result.started_at
    assert first_start is not None and result.last_attempted_at is not None
    assert first_start < result.last_attempted_at


def test_a_dlq_error_missing_from_the_attempts_history_keeps_its_stored_class() -> None:
    """A DLQ row whose last execution left no attempts-history row (purged by retention) still names its class."""
    result = tasks.reject.enqueue(7)
    [job] = storage.fetch_batch("w-b", 10)
    assert storage.mark_processing(job, "w-b") == 1
    try:
        raise ConnectionError("payment gateway timeout")
    except ConnectionError as exc:
        error = AttemptError.of(exc)
    storage.complete("w-b", [], [], [Failure(job.id, FailureReason.TRANSIENT, "gateway down", None, error)])
    result.refresh()
    [dead] = result.errors
    assert (dead.exception_class_path, dead.traceback) == ("builtins.ConnectionError", "gateway down")


def test_a_retried_task_that_succeeds_keeps_the_errors_of_its_failed_attempts(burst: Callable[..., Worker]) -> None:
    result = tasks.flaky.enqueue("k-errors")
    _drain(burst, result.id)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert [e.exception_class_path for e in result.errors] == ["builtins.ConnectionError"]
    assert result.attempts == 2


def test_worker_ids_in_the_task_context_match_the_stored_ones(burst: Callable[..., Worker]) -> None:
    adopter_tasks.SEEN_RESULTS.clear()
    result = adopter_tasks.fails_then_sees_context.enqueue("k-ctx", failures=1)
    workers: list[Worker] = []
    wait_for(lambda: workers.append(burst()) or not JobsHot.objects.filter(id=result.id).exists())
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    stored = result.worker_ids
    assert len(stored) == 2 and set(stored) <= {w.worker_id for w in workers}
    assert adopter_tasks.SEEN_RESULTS == [(1, stored[:1], 0), (2, stored, 1)]
    assert result.return_value == stored


def test_a_task_raising_systemexit_or_keyboardinterrupt_fails_and_the_worker_keeps_running() -> None:
    """A real ``chokaq_worker --burst`` process: both tasks end FAILED, the next task still runs, exit code 0."""
    exiting = adopter_tasks.exits.enqueue(3)
    interrupted = adopter_tasks.interrupted.enqueue()
    after = tasks.calculate_meaning_of_life.enqueue()
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings",
           "CHOKAQ_TEST_OVERRIDES": json.dumps(FAST), "PYTHONUNBUFFERED": "1"}
    for _ in range(20):  # a failure the policy retries comes back due after a short backoff
        done = subprocess.run([sys.executable, "manage.py", "chokaq_worker", "--burst"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr[-2000:]
        left = set(JobsHot.objects.filter(id__in=[exiting.id, interrupted.id, after.id]).values_list("status", flat=True))
        if not left or left == {2}:  # done, or stuck Processing after the worker exited (nothing more will move)
            break
    for result, kind in ((exiting, "builtins.SystemExit"), (interrupted, "builtins.KeyboardInterrupt")):
        result.refresh()
        assert result.status == TaskResultStatus.FAILED, result.id
        assert result.errors and result.errors[-1].exception_class_path == kind
        assert result.errors[-1].traceback.startswith("Traceback (most recent call last):\n")
    after.refresh()
    assert after.status == TaskResultStatus.SUCCESSFUL and after.return_value == 42
