"""Many workers on one database, lost connections, connection hygiene (spec 02 §12, 03 §1, §16)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from django.db import connection
from django.db.backends.signals import connection_created

from chokaq_core import enqueue_many, storage
from chokaq_core.api import EnqueueOptions
from chokaq_core.models import JobsArchive, JobsDLQ, JobsHot
from tests import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def _other_backends() -> list[int]:
    """PostgreSQL backends connected to the test database, except this thread's own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return [row[0] for row in cursor.fetchall()]


def test_two_workers_share_300_jobs_and_run_each_exactly_once(start_worker: Any, state: Any) -> None:
    """The first worker's slots are held by gated jobs until the second has run one: on a loaded machine the first
    could otherwise drain all 300 before the second claims, and the share would not be seen."""
    held = enqueue_many([EnqueueOptions("test.gate.v1", {"name": "first"}, priority=1000) for _ in range(5)])
    ids = held + enqueue_many([EnqueueOptions("test.sleep.v1", {"seconds": 0.005}) for _ in range(300)])
    first = start_worker(concurrency=5, batch_size=10)
    state.wait(lambda: JobsHot.objects.filter(worker_id=first.worker_id, type="test.gate.v1", status=2).count() == 5,
               "the first worker's five slots held", timeout=30)
    second = start_worker(concurrency=5, batch_size=10)
    state.wait(lambda: JobsArchive.objects.filter(worker_id=second.worker_id).exists(), "the second worker's first job",
               timeout=30)
    jobs.GATES.setdefault("first", threading.Event()).set()

    state.wait(lambda: JobsArchive.objects.count() == 305, "305 archived jobs", timeout=60)
    assert JobsHot.objects.count() == 0 and JobsDLQ.objects.count() == 0
    assert all(jobs.EXECUTIONS[i] == [1] for i in ids), "a job ran more than once (or not at all)"
    assert len(jobs.EXECUTIONS) == 305
    by_worker = Counter(JobsArchive.objects.values_list("worker_id", flat=True))
    assert set(by_worker) == {first.worker_id, second.worker_id}, by_worker
    assert set(JobsArchive.objects.values_list("attempt_count", flat=True)) == {1}
    assert state.counters() == (305, 0, 0)


@pytest.mark.postgresql
def test_lost_database_connections_lose_no_work(start_worker: Any, state: Any, fast: Any, vendor: str) -> None:
    # Rows stranded Fetched by a failed lease gate come back through abandoned-fetch recovery.
    fast(RECOVERY={"FETCHED_JOB_TIMEOUT": 2, "SCAN_INTERVAL": 0.2})
    ids = enqueue_many([EnqueueOptions("test.sleep.v1", {"seconds": 0.02}) for _ in range(120)])

    opened: list[Any] = []
    lock = threading.Lock()

    def remember(sender: Any, connection: Any, **kwargs: Any) -> None:
        if threading.current_thread() is not threading.main_thread():
            with lock:
                opened.append(connection)

    connection_created.connect(remember)
    try:
        start_worker(concurrency=4, batch_size=5)
        state.wait(lambda: JobsArchive.objects.count() >= 1, "the first archived job", timeout=30)
        with lock:
            before = len(opened)
        for progress in (10, 40, 70):
            state.wait(lambda p=progress: JobsArchive.objects.count() >= p, f"{progress} archived jobs", timeout=30)
            # The real thing: the server kills every worker session. (SQLite has no server; closing
            # another thread's sqlite3 connection under it can crash the interpreter, so this test
            # runs on the PostgreSQL pass only.)
            with connection.cursor() as cursor:
                for pid in _other_backends():
                    cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        state.wait(lambda: JobsArchive.objects.count() == len(ids), f"{len(ids)} archived jobs", timeout=60)
    finally:
        connection_created.disconnect(remember)

    assert len(opened) > before, "the worker never had to reconnect: nothing was cut"
    assert JobsHot.objects.count() == 0 and JobsDLQ.objects.count() == 0
    assert all(jobs.EXECUTIONS[i] == [1] for i in ids), "a job ran twice or never"
    assert state.counters() == (len(ids), 0, 0)


@pytest.mark.postgresql
def test_a_stopped_worker_leaves_no_database_sessions_behind(start_worker: Any, state: Any, vendor: str) -> None:
    assert _other_backends() == []
    ids = enqueue_many([EnqueueOptions("test.sleep.v1", {"seconds": 0.05}) for _ in range(20)])
    worker = start_worker(concurrency=8)
    state.wait(lambda: all(storage.get_archived(i) for i in ids), "20 archived jobs")
    assert len(_other_backends()) >= 4  # fetcher, dispatcher (lease gate), completer, supervisor, listener…

    start_worker.stop(worker)
    for thread in worker._threads:
        thread.join(5)
    assert state.wait(lambda: _other_backends() == [], "worker sessions to close", timeout=5)
