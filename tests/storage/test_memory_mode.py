"""The in-memory storage mode itself (spec 03 §15): capacity eviction, settings, the worker in this process,
and no database access at all."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db.backends.base.base import BaseDatabaseWrapper

from chokaq_core import api, events, storage, testing
from chokaq_core.checks import check_configuration
from chokaq_core.conf import DEFAULTS, collect_errors, config
from chokaq_core.domain import FailureReason, JobStatus
from chokaq_core.models import JobsArchive, JobsDLQ
from chokaq_core.readmodel import SnapshotRequest
from tests import jobs

from .rows import age, archive_ids, archived, counters, dead, dlq_ids, hot, hot_ids, new_job, of_kind, pending, purged

pytestmark = pytest.mark.memory_only


@pytest.fixture
def capacity(chokaq_settings: Any) -> Callable[[int], None]:
    """``capacity(n)`` sets CHOKAQ["IN_MEMORY"]["MAX_CAPACITY"]."""

    def apply(n: int) -> None:
        chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "IN_MEMORY": {"MAX_CAPACITY": n}}
        assert config().IN_MEMORY.MAX_CAPACITY == n

    return apply


def without_database[**P](test: Callable[P, None]) -> Callable[P, None]:
    """Run ``test`` refusing (and recording) every attempt to open a Django database connection, whatever the
    thread: the memory mode must not touch the database at all."""

    @functools.wraps(test)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> None:
        attempts: list[str] = []

        def refuse(wrapper: Any, *a: Any, **kw: Any) -> None:
            attempts.append(f"{wrapper.alias} from {threading.current_thread().name}")
            raise RuntimeError("the in-memory storage mode must not access the database")

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(BaseDatabaseWrapper, "ensure_connection", refuse)
            test(*args, **kwargs)
        assert attempts == [], f"database access in memory mode: {attempts}"

    return guarded


FAST: dict[str, dict[str, Any]] = {
    "RETRY": {"BASE_DELAY": 0.05, "JITTER_MAX_DELAY": 0, "MAX_ATTEMPTS": 3},
    "EXECUTION": {"HEARTBEAT_INTERVAL_MIN": 0.2, "HEARTBEAT_INTERVAL_MAX": 0.3, "CANCEL_POLL_INTERVAL": 0.05},
    "WORKER": {"POLLING_INTERVAL": 0.05, "SHUTDOWN_GRACE_PERIOD": 3, "REGISTRY_HEARTBEAT_INTERVAL": 0.5,
               "COMPLETION_FLUSH_INTERVAL": 0.01},
}


@pytest.fixture
def fast(chokaq_settings: Any) -> None:
    """Short worker intervals."""
    current = dict(chokaq_settings.CHOKAQ)
    for section, values in FAST.items():
        current[section] = {**current.get(section, {}), **values}
    chokaq_settings.CHOKAQ = current


# ---------------------------------------------------------------- capacity


def in_batches(make: Callable[..., list[str]], queue: str, batches: int) -> list[list[str]]:
    """``batches`` × 100 rows, each batch finished (or failed) one second after the previous one."""
    made = []
    for _ in range(batches):
        made.append(make(queue, 100))
        age(1, [JobsArchive, JobsDLQ])
    return made


def test_the_default_cap_is_100000() -> None:
    assert config().IN_MEMORY.MAX_CAPACITY == 100_000


def test_below_the_cap_nothing_is_evicted(capacity: Callable[[int], None]) -> None:
    kept = archived("cap", 200) + dead("cap", 98)
    capacity(300)
    pending("cap")  # 298 + 1 stored < 300 afterwards: the check found 298
    assert len(archive_ids()) == 200 and len(dlq_ids()) == 98
    assert len(kept) == 298


def test_an_enqueue_at_the_cap_evicts_the_1000_oldest_archive_rows(capacity: Callable[[int], None]) -> None:
    batches = in_batches(archived, "arc", 12)  # 1200 Archive rows, batch k finished k seconds after batch 0
    failed = dead("dlq", 300)
    waiting = pending("hot", 5)
    capacity(1505)
    assert counters("arc") == (1200, 0, 0)

    job = new_job("hot")
    assert storage.enqueue([job]) == [job.id]

    assert archive_ids() == set(batches[10] + batches[11]), "the 1000 oldest by finish time are gone"
    assert dlq_ids() == set(failed), "still below the cap after the Archive eviction: the DLQ is kept"
    assert hot_ids() == {*waiting, job.id}
    assert counters("arc") == (1200, 0, 0) and purged("arc") == 1000, "evictions count as purged, like purges"
    assert counters("dlq") == (0, 300, 0)
    assert storage.summary_stats().total == 200 + 300 + 6


def test_then_the_500_oldest_dlq_rows_when_still_at_the_cap(capacity: Callable[[int], None]) -> None:
    waiting = pending("hot", 1000)
    old_archive = archived("arc", 100)
    batches = in_batches(dead, "dlq", 6)  # 600 DLQ rows, batch k failed k seconds after batch 0
    capacity(1500)  # 1000 + 100 + 600 = 1700 stored

    job = new_job("hot")
    storage.enqueue([job])

    assert archive_ids() == set(), f"all {len(old_archive)} Archive rows went first"
    assert dlq_ids() == set(batches[5]), "then the 500 oldest by failure time"
    assert hot_ids() == {*waiting, job.id}, "Hot rows are never evicted"
    assert (counters("arc"), counters("dlq"), purged("arc")) == ((100, 0, 0), (0, 100, 0), 100)


def test_hot_rows_are_never_evicted_and_the_cap_is_soft(capacity: Callable[[int], None]) -> None:
    capacity(10)
    ids = pending("hot", 15)
    more = pending("hot", 5)
    assert hot_ids() == set(ids + more)
    assert hot(more[0])["queue"] == "hot"  # type: ignore[index]


def test_eviction_happens_only_on_enqueue(capacity: Callable[[int], None]) -> None:
    archived("arc", 20)
    capacity(10)
    assert len(archive_ids()) == 20, "completions never evict"
    pending("hot")
    assert archive_ids() == set()


# ---------------------------------------------------------------- settings


def test_defaults() -> None:
    assert DEFAULTS["STORAGE"] == "sql"
    assert DEFAULTS["IN_MEMORY"] == {"MAX_CAPACITY": 100_000}


@pytest.mark.parametrize(("override", "message"), [
    ({"STORAGE": "redis"}, "STORAGE must be 'sql' or 'memory'"),
    ({"IN_MEMORY": {"MAX_CAPACITY": 0}}, "IN_MEMORY.MAX_CAPACITY must be an integer >= 1"),
    ({"IN_MEMORY": {"MAX_CAPACITY": 1.5}}, "IN_MEMORY.MAX_CAPACITY must be an integer >= 1"),
    ({"IN_MEMORY": {"MAX_CAPACITY": True}}, "IN_MEMORY.MAX_CAPACITY must be an integer >= 1"),
    ({"IN_MEMORY": {"MAX_ROWS": 5}}, "unknown setting CHOKAQ['IN_MEMORY']['MAX_ROWS']"),
])
def test_bad_values_are_refused(chokaq_settings: Any, override: dict[str, Any], message: str) -> None:
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, **override}
    assert any(message in e for e in collect_errors())
    with pytest.raises(ImproperlyConfigured, match="Invalid ChokaQ configuration"):
        config()


def test_memory_mode_skips_the_database_checks(chokaq_settings: Any) -> None:
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "DATABASE": "no-such-alias"}
    assert check_configuration() == [], "STORAGE = 'memory' needs no database alias"
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "STORAGE": "sql"}
    assert [m.id for m in check_configuration()] == ["chokaq.E002"]
    assert storage.memory_mode() is False


def test_memory_mode_runs_the_sqlite_dialect_and_publishes_at_once(published: list) -> None:
    assert storage.memory_mode() is True and storage.vendor() == "memory"
    job = new_job("autocommit", priority=3)
    storage.enqueue([job])
    [update] = of_kind(published, "JobUpdated")
    assert (update["jobId"], update["queue"], update["status"], update["attemptCount"], update["priority"]) == (
        job.id, "autocommit", 0, 0, 3)
    assert len(of_kind(published, "StatsUpdated")) == 1
    assert storage.change_marker() is None, "the worker lives in the writer's process: nothing to poll"


# ---------------------------------------------------------------- the worker in this process


@without_database
def test_enqueue_then_run_until_idle_archives_the_good_and_dead_letters_the_bad(fast: None) -> None:
    ok = [api.enqueue("test.ok.v1", {"n": i}, queue="mail") for i in range(20)]
    flaky = [api.enqueue("test.fail.v1", {"succeed_on": 2}, queue="mail") for _ in range(2)]
    exhausted = api.enqueue("test.fail.v1", {"succeed_on": 99})
    fatal = api.enqueue("test.fatal.v1")
    poison = api.enqueue("test.valueerror.v1")
    later = api.enqueue("test.async.v1", {"seconds": 0.01}, delay=0.3)

    summary = testing.run_until_idle(max_seconds=20)

    delayed = storage.get_archived(later)
    assert delayed is not None and delayed.started_at is not None
    assert delayed.started_at - delayed.created_at >= timedelta(seconds=0.3), "the delayed job ran at its time"
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
    snapshot = storage.deck_snapshot(SnapshotRequest(active_limit=10, locate_ids=(fatal,), queues=True))
    assert snapshot.summary == summary and snapshot.located == {fatal: JobStatus.FAILED}


@without_database
def test_the_worker_registry_and_events_live_in_memory_too(fast: None) -> None:
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


@without_database
def test_paused_queues_and_jobs_due_after_the_deadline_are_left_pending(fast: None) -> None:
    paused = api.enqueue("test.ok.v1", queue="paused")
    storage.set_queue_paused("paused", True)
    far = api.enqueue("test.ok.v1", delay=3600)
    done = api.enqueue("test.ok.v1")

    summary = testing.run_until_idle(max_seconds=5)

    assert summary.pending == 2 and summary.succeeded_total == 1
    assert storage.get_archived(done) is not None
    assert jobs.EXECUTIONS[paused] == jobs.EXECUTIONS[far] == []


@without_database
def test_only_the_given_queues_run(fast: None) -> None:
    mine = api.enqueue("test.ok.v1", queue="mine")
    other = api.enqueue("test.ok.v1", queue="other")
    testing.run_until_idle(max_seconds=5, queues=["mine"])
    assert storage.get_archived(mine) is not None
    assert storage.get_hot(other).status == JobStatus.PENDING  # type: ignore[union-attr]


@without_database
def test_a_handler_still_running_at_the_deadline_raises_timeout(fast: None) -> None:
    job_id = api.enqueue("test.sleep.v1", {"seconds": 5})
    with pytest.raises(TimeoutError, match="still running"):
        testing.run_until_idle(max_seconds=0.5)
    row = storage.get_hot(job_id)
    assert row is not None and row.status == JobStatus.PENDING, "shutdown put the interrupted job back"


@without_database
def test_reset_storage_is_for_the_memory_mode_only(chokaq_settings: Any) -> None:
    api.enqueue("test.ok.v1")
    testing.reset_storage()
    assert storage.summary_stats().total == 0
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "STORAGE": "sql"}
    with pytest.raises(RuntimeError, match="in-memory storage only"):
        testing.reset_storage()
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "STORAGE": "memory"}


@without_database
def test_django_tasks_run_in_memory_mode_too(fast: None) -> None:
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
