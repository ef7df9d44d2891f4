"""PostgreSQL: completions and zombie sweeps take the shared counter rows in one order, so they never deadlock.

Every move to the Archive or the DLQ upserts rows other transactions upsert too: its queues' counter row
(``chokaq_stats_summary``), the metric buckets and the history buckets. A completion batch is one transaction of
up to three moves (archive, reschedule, DLQ). Each test holds one transaction between two of its moves until the
other transaction has either caught up with it or is waiting on one of its locks, then lets both go on: the
interleaving that deadlocked. A deadlock is retried by storage (and so hidden); the tests count them instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.utils import timezone

from chokaq_core import storage
from chokaq_core.domain import Failure, FailureReason, JobFilter, Success
from chokaq_core.models import JobsArchive, JobsDLQ, JobsHot
from chokaq_core.sql import base

from .rows import archived, backdate, counters, dead, pending, processing, purged

pytestmark = [pytest.mark.postgresql, pytest.mark.sql_only]

DEADLOCK = "40P01"  # PostgreSQL's deadlock_detected


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def _waits_on_a_lock(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return bool(row and row[0])


class Between:
    """Holds a transaction between its archive and its DLQ move (once) until the other transaction has reached
    the same point, finished, or waits on a lock; counts the deadlocks the DLQ moves meet."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pids: dict[str, int] = {}
        self.arrived: dict[str, threading.Event] = {}
        self.done: dict[str, threading.Event] = {}
        self.deadlocks: list[str] = []
        self.errors: list[BaseException] = []
        self._held: set[str] = set()
        for method in ("archive_succeeded", "move_to_dlq", "archive_zombies"):
            monkeypatch.setattr(base.BaseDialect, method, self._watched(getattr(base.BaseDialect, method)))

    def _watched(self, move: Callable[..., Any]) -> Callable[..., Any]:
        """``move``, held before it runs if it is a DLQ move (the first one of its thread), counting deadlocks."""

        def watched(dialect: Any, cursor: Any, *args: Any) -> Any:
            name = threading.current_thread().name
            if move.__name__ == "move_to_dlq" and name in self.arrived and name not in self._held:
                self._held.add(name)
                self.arrived[name].set()
                self.wait_for_the_other(name)
            try:
                return move(dialect, cursor, *args)
            except Exception as exc:
                if DEADLOCK in (getattr(exc, "sqlstate", None), getattr(exc.__cause__, "sqlstate", None)):
                    self.deadlocks.append(f"{name}: {move.__name__}")
                raise

        return watched

    def wait_for_the_other(self, name: str) -> None:
        other = next(n for n in self.arrived if n != name)
        while not (self.arrived[other].is_set() or self.done[other].is_set()
                   or (other in self.pids and _waits_on_a_lock(self.pids[other]))):
            time.sleep(0.005)

    def thread(self, name: str, work: Callable[[], Any], started: threading.Event | None = None) -> threading.Thread:
        self.arrived.setdefault(name, threading.Event())
        self.done[name] = threading.Event()

        def body() -> None:
            try:
                self.pids[name] = _backend_pid()
                if started is not None:
                    started.wait(60)
                work()
            except BaseException as exc:  # reported by the main thread
                self.errors.append(exc)
            finally:
                self.done[name].set()
                connections.close_all()

        return threading.Thread(target=body, name=name)


@pytest.fixture
def between(monkeypatch: pytest.MonkeyPatch) -> Iterator[Between]:
    yield Between(monkeypatch)


def _run(*threads: threading.Thread) -> None:
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), f"{t.name} did not finish"


def test_two_mixed_completions_over_two_queues_in_opposite_orders_never_deadlock(between: Between,
                                                                                   vendor: str) -> None:
    """Worker a archives a job of queue lo-1 and fails one of lo-2; worker b the other way round. Each move takes
    its own queue's counter row: without one order over the whole transaction, a holds lo-1's and waits for lo-2's
    while b holds lo-2's and waits for lo-1's."""
    assert vendor == "postgresql"
    jobs = {(w, q): processing(q, w, type="test.lock.v1")[0] for w in ("w-a", "w-b") for q in ("lo-1", "lo-2")}

    def complete(worker: str, archived: str, failed: str) -> Callable[[], Any]:
        return lambda: storage.complete(worker, [Success(jobs[worker, archived].id, 5.0)], [], [
            Failure(jobs[worker, failed].id, FailureReason.FATAL_ERROR, "boom", attempt=1)])

    _run(between.thread("a", complete("w-a", "lo-1", "lo-2")), between.thread("b", complete("w-b", "lo-2", "lo-1")))

    assert between.errors == []
    assert between.deadlocks == [], "two completions deadlocked on the counter rows"
    assert JobsArchive.objects.filter(queue__in=["lo-1", "lo-2"]).count() == 2
    assert JobsDLQ.objects.filter(queue__in=["lo-1", "lo-2"]).count() == 2
    assert counters("lo-1") == counters("lo-2") == (1, 1, 0)


def test_a_zombie_sweep_never_deadlocks_with_a_mixed_completion_of_the_same_queue(between: Between,
                                                                                 vendor: str) -> None:
    """A completion has archived one job of the queue (its counter row is held) and is about to fail another of the
    same type when a sweep moves a dead worker's job of that type: the sweep must wait for the counter row before it
    takes the history rows the completion's DLQ move needs next."""
    assert vendor == "postgresql"
    done, failed = processing("lo-z", "w-live", 2, type="test.lock.v1")
    zombie = processing("lo-z", "w-dead", type="test.lock.v1")[0]
    backdate([zombie.id], 60, "heartbeat_at")
    completing = between.arrived.setdefault("completion", threading.Event())
    completion = between.thread("completion", lambda: storage.complete(
        "w-live", [Success(done.id, 5.0)], [], [Failure(failed.id, FailureReason.FATAL_ERROR, "boom", attempt=1)]))
    sweep = between.thread("sweep", lambda: storage.archive_zombies(10), started=completing)

    _run(completion, sweep)

    assert between.errors == []
    assert between.deadlocks == [], "the sweep and the completion deadlocked"
    assert JobsDLQ.objects.get(id=zombie.id).failure_reason == int(FailureReason.ZOMBIE)
    assert JobsDLQ.objects.get(id=failed.id).failure_reason == int(FailureReason.FATAL_ERROR)
    assert counters("lo-z") == (1, 2, 0)


def test_a_zombie_sweep_locks_no_row_it_does_not_sweep(vendor: str) -> None:
    """While a sweep's transaction is open, a live worker's Processing row stays free to complete or beat: the sweep
    locks (skipping the locked ones) only the expired rows it moves."""
    assert vendor == "postgresql"
    live = processing("lo-s", "w-live")[0]
    zombie = processing("lo-s", "w-dead")[0]
    backdate([zombie.id], 60, "heartbeat_at")
    refused: list[BaseException] = []

    def lock_the_live_row() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT id FROM chokaq_jobs_hot WHERE id = %s FOR UPDATE NOWAIT", [live.id])
        except BaseException as exc:  # reported by the main thread
            refused.append(exc)
        finally:
            connections.close_all()

    with transaction.atomic():  # the sweep runs in this transaction, still open while the other one tries
        assert storage.archive_zombies(10) == [(zombie.id, "lo-s")]
        other = threading.Thread(target=lock_the_live_row)
        other.start()
        other.join(timeout=60)

    assert refused == [], "the sweep held a live worker's row"


# ---------------------------------------------------------------- operator commands over several queues

OPS = "test.cmd.v1"  # the type of the rows an operator command acts on (the completion's rows are test.lock.v1)


def _dlq_rows() -> list[str]:
    return [*dead("lo-y", type=OPS), *dead("lo-x", type=OPS)]


def _archive_rows() -> list[str]:
    return [*archived("lo-y", type=OPS), *archived("lo-x", type=OPS)]


def _pending_rows() -> list[str]:
    return [*pending("lo-y", type=OPS), *pending("lo-x", type=OPS)]


def _matching(pillar: str, act: Callable[[JobFilter, str], Any]) -> Callable[[list[str]], Any]:
    """A bulk-by-filter run's one batch over the command's rows (as the Deck runs it)."""
    def run(ids: list[str]) -> Any:
        total, upto = storage.count_matching(pillar, JobFilter(type=OPS))
        assert total == len(ids) and upto is not None
        return act(JobFilter(type=OPS), upto)
    return run


# command → (its rows, the command over them, the pillar they leave, where they land (None: purged))
COMMANDS: dict[str, tuple[Callable[[], list[str]], Callable[[list[str]], Any], Any, Any]] = {
    "resurrect_batch": (_dlq_rows, lambda ids: storage.resurrect_batch(ids, actor="ops"), JobsDLQ, JobsHot),
    "resurrect_dlq_by_filter": (_dlq_rows, lambda ids: storage.resurrect_dlq_by_filter(JobFilter(type=OPS), 10,
                                                                                        actor="ops"), JobsDLQ, JobsHot),
    "resurrect_matching": (_dlq_rows, _matching("dlq", lambda f, upto: storage.resurrect_matching(
        f, None, upto, 10, actor="ops")), JobsDLQ, JobsHot),
    "purge_dlq_ids": (_dlq_rows, storage.purge_dlq_ids, JobsDLQ, None),
    "purge_dlq_by_filter": (_dlq_rows, lambda ids: storage.purge_dlq_by_filter(JobFilter(type=OPS), 10), JobsDLQ,
                            None),
    "purge_dlq_matching": (_dlq_rows, _matching("dlq", lambda f, upto: storage.purge_dlq_matching(f, None, upto, 10)),
                           JobsDLQ, None),
    "purge_dlq_older_than": (_dlq_rows, lambda ids: storage.purge_dlq_older_than(timezone.now()), JobsDLQ, None),
    "purge_archive_ids": (_archive_rows, storage.purge_archive_ids, JobsArchive, None),
    "purge_archive": (_archive_rows, lambda ids: storage.purge_archive(timezone.now()), JobsArchive, None),
    # already in key order before (a move out of Hot upserts its counters sorted by queue): kept as guards
    "cancel": (_pending_rows, lambda ids: storage.cancel(ids, actor="ops"), JobsHot, JobsDLQ),
    "cancel_matching": (_pending_rows, _matching("hot", lambda f, upto: storage.cancel_matching(
        f, None, upto, 10, actor="ops")), JobsHot, JobsDLQ),
}


def _blocked(pid: int) -> bool:
    """The session ``pid`` waits for a lock (live: ``pg_blocking_pids`` is no per-transaction snapshot)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT cardinality(pg_blocking_pids(%s)) > 0", [pid])
        return bool(cursor.fetchone()[0])


def _lock_counter_nowait(queue: str) -> str | None:
    """Lock ``queue``'s counter row at once, in a savepoint: None, or why it could not."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT queue FROM chokaq_stats_summary WHERE queue = %s FOR UPDATE NOWAIT", [queue])
        return None
    except DatabaseError as exc:
        return str(exc).strip()


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_operator_command_over_two_queues_takes_their_counter_rows_in_key_order(command: str, vendor: str) -> None:
    """A worker's completion over queues lo-x and lo-y locks lo-x's counter row, then lo-y's
    (``begin_completion``). An operator command over rows of both queues must take them in the same order: this
    test's transaction is that completion, holding lo-x's row; the command, started meanwhile, waits for it and
    must hold nothing of lo-y then (were it holding lo-y's row, the completion's next lock would close a circle:
    a deadlock, one of the two rolled back). Then the completion finishes (its moves change both queues' counters
    while the command waits), commits, and the command goes on over the rows as they are now: every counter
    equals its rows."""
    assert vendor == "postgresql"
    make_rows, act, origin, target = COMMANDS[command]
    job_a = processing("lo-x", "w-live", type="test.lock.v1")[0]
    job_b = processing("lo-y", "w-live", type="test.lock.v1")[0]
    ids = make_rows()
    before = {q: counters(q) for q in ("lo-x", "lo-y")}
    purged_before = {q: purged(q) for q in ("lo-x", "lo-y")}
    pid: list[int] = []
    errors: list[BaseException] = []

    def operator() -> None:
        try:
            pid.append(_backend_pid())
            act(ids)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=operator, name=command)
    held: str | None = "the command never waited for lo-x's counter row"
    with transaction.atomic():  # the completion
        sql = storage.dialect()
        with connection.cursor() as cursor:
            sql.begin_completion(cursor, "w-live", [job_a.id], [])  # its first lock: lo-x's counter row
        thread.start()
        while thread.is_alive() and not (pid and _blocked(pid[0])):
            time.sleep(0.002)
        if thread.is_alive():
            held = _lock_counter_nowait("lo-y")  # its next lock
        if held is None:
            with connection.cursor() as cursor:
                sql.archive_succeeded(cursor, "w-live", [Success(job_a.id, 5.0)])
                sql.move_to_dlq(cursor, "w-live", [Failure(job_b.id, FailureReason.FATAL_ERROR, "boom")])
        else:
            transaction.set_rollback(True)  # let the command go on
    thread.join(timeout=60)

    assert not thread.is_alive(), "the command did not finish"
    assert errors == []
    assert held is None, f"while it waited for lo-x's counter row the command held lo-y's: {held}"
    assert not origin.objects.filter(id__in=ids).exists()
    if target is not None:
        assert target.objects.filter(id__in=ids).count() == len(ids)
    failed = -1 if command.startswith(("resurrect", "purge_dlq")) else int(command.startswith("cancel"))
    for queue, (succeeded, failed_total, retried) in before.items():  # one row of each queue moved by the command,
        completed = (queue == "lo-x", queue == "lo-y")  # one by the completion (lo-x archived, lo-y failed)
        assert counters(queue) == (succeeded + completed[0], failed_total + completed[1] + failed, retried), queue
        assert purged(queue) == purged_before[queue] + command.startswith("purge_archive"), queue
