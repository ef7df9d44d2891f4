"""Memory mode end to end: the unchanged worker runs in this process through ``testing.run_until_idle``
and never touches the database (the autouse ``no_database`` fixture fails the test on any attempt)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from chokaq_core import api, storage, testing
from chokaq_core.domain import FailureReason, JobStatus
from tests import jobs

FAST: dict[str, dict[str, Any]] = {
    "RETRY": {"BASE_DELAY": 0.05, "JITTER_MAX_DELAY": 0, "MAX_ATTEMPTS": 3},
    "EXECUTION": {"HEARTBEAT_INTERVAL_MIN": 0.2, "HEARTBEAT_INTERVAL_MAX": 0.3, "CANCEL_POLL_INTERVAL": 0.05},
    "WORKER": {"POLLING_INTERVAL": 0.05, "SHUTDOWN_GRACE_PERIOD": 3, "REGISTRY_HEARTBEAT_INTERVAL": 0.5,
               "COMPLETION_FLUSH_INTERVAL": 0.01},
}


@pytest.fixture
def fast(chokaq_settings: Any) -> Callable[..., None]:
    def apply(**sections: Any) -> None:
        current = dict(chokaq_settings.CHOKAQ)
        for section, values in sections.items():
            current[section] = {**current.get(section, {}), **values}
        chokaq_settings.CHOKAQ = current

    apply(**FAST)
    return apply


def test_enqueue_then_run_until_idle_archives_the_good_and_dead_letters_the_bad(fast: Any) -> None:
    ok = [api.enqueue("test.ok.v1", {"n": i}, queue="mail") for i in range(20)]
    flaky = [api.enqueue("test.fail.v1", {"succeed_on": 2}, queue="mail") for _ in range(2)]
    exhausted = api.enqueue("test.fail.v1", {"succeed_on": 99})
    fatal = api.enqueue("test.fatal.v1")
    poison = api.enqueue("test.valueerror.v1")
    later = api.enqueue("test.async.v1", {"seconds": 0.01}, delay=0.3)

    started = time.monotonic()
    summary = testing.run_until_idle(max_seconds=20)

    assert time.monotonic() - started >= 0.3, "it waited for the delayed job"
    assert (summary.pending, summary.fetched, summary.processing) == (0, 0, 0)
    assert (summary.succeeded_total, summary.failed_total, summary.retried_total) == (23, 3, 4)
    for job_id in [*ok, *flaky, later]:
        assert storage.locate_jobs([job_id]) == {job_id: JobStatus.SUCCEEDED}
        assert storage.get_archived(job_id).duration_ms is not None  # type: ignore[union-attr]
    assert [storage.get_archived(j).attempt_count for j in flaky] == [2, 2]  # type: ignore[union-attr]
    assert jobs.EXECUTIONS[exhausted] == [1, 2, 3]
    assert storage.get_dead(exhausted).failure_reason == FailureReason.TRANSIENT  # type: ignore[union-attr]
    assert storage.get_dead(fatal).failure_reason == FailureReason.FATAL_ERROR  # type: ignore[union-attr]
    assert jobs.EXECUTIONS[fatal] == [1], "fatal errors are not retried"
    assert storage.get_dead(poison) is not None
    assert all(jobs.EXECUTIONS[j] == [1] for j in ok)
    assert {q.queue: q.succeeded_total for q in storage.queue_stats()}["mail"] == 22
    assert sum(p.succeeded for p in storage.throughput(storage.get_archived(ok[0]).created_at.replace(  # type: ignore[union-attr]
        microsecond=0))) == 23


def test_the_worker_registry_and_events_live_in_memory_too(fast: Any) -> None:
    from chokaq_core import events

    seen: list[events.Event] = []
    events.add_listener(seen.append)
    try:
        job_id = api.enqueue("test.ok.v1")
        testing.run_until_idle(max_seconds=10)
    finally:
        events.remove_listener(seen.append)
    [worker] = storage.list_workers()
    assert worker.is_running is False and worker.stopped_at is not None
    assert [e.data["jobId"] for e in seen if str(e.kind) == "JobArchived"] == [job_id]
    assert storage.vendor() == "memory"


def test_paused_queues_and_jobs_due_after_the_deadline_are_left_pending(fast: Any) -> None:
    paused = api.enqueue("test.ok.v1", queue="paused")
    storage.set_queue_paused("paused", True)
    far = api.enqueue("test.ok.v1", delay=3600)
    done = api.enqueue("test.ok.v1")

    summary = testing.run_until_idle(max_seconds=5)

    assert summary.pending == 2 and summary.succeeded_total == 1
    assert storage.get_archived(done) is not None
    assert jobs.EXECUTIONS[paused] == jobs.EXECUTIONS[far] == []


def test_only_the_given_queues_run(fast: Any) -> None:
    mine = api.enqueue("test.ok.v1", queue="mine")
    other = api.enqueue("test.ok.v1", queue="other")
    testing.run_until_idle(max_seconds=5, queues=["mine"])
    assert storage.get_archived(mine) is not None
    assert storage.get_hot(other).status == JobStatus.PENDING  # type: ignore[union-attr]


def test_a_handler_still_running_at_the_deadline_raises_timeout(fast: Any) -> None:
    job_id = api.enqueue("test.sleep.v1", {"seconds": 5})
    with pytest.raises(TimeoutError, match="still running"):
        testing.run_until_idle(max_seconds=0.5)
    row = storage.get_hot(job_id)
    assert row is not None and row.status == JobStatus.PENDING, "shutdown put the interrupted job back"


def test_reset_storage_is_for_the_memory_mode_only(chokaq_settings: Any) -> None:
    api.enqueue("test.ok.v1")
    testing.reset_storage()
    assert storage.summary_stats().total == 0
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "STORAGE": "sql"}
    with pytest.raises(RuntimeError, match="in-memory storage only"):
        testing.reset_storage()
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "STORAGE": "memory"}


def test_django_tasks_run_in_memory_mode_too(fast: Any) -> None:
    from django.tasks import TaskResultStatus
    from django.tasks.signals import task_enqueued

    from tests.ops import tasks

    enqueued: list[str] = []

    def on_enqueued(sender: Any, task_result: Any, **kwargs: Any) -> None:
        enqueued.append(task_result.id)

    task_enqueued.connect(on_enqueued)
    try:
        result = tasks.calculate_meaning_of_life.enqueue()
    finally:
        task_enqueued.disconnect(on_enqueued)
    assert enqueued == [result.id], "no transaction to wait for: the signal fires at once"

    testing.run_until_idle(max_seconds=10)

    done = tasks.calculate_meaning_of_life.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == 42
