"""storage's write turns: on a database with one write lock (SQLite) a process's writers queue on a lock of its own
instead of meeting in the database's busy handler; elsewhere there is no turn (storage._write_turn)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, connections, transaction

from chokaq_core import storage
from chokaq_core.conf import config

from .rows import new_job

pytestmark = pytest.mark.sql_only  # memory mode's private database has one lock of its own


def one_writer() -> bool:
    return storage.dialect().ONE_WRITER


def in_threads(work: Callable[[int], None], n: int) -> list[BaseException]:
    """Run ``work(i)`` in ``n`` threads, each on its own connection; the errors they raised."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:  # reported by the caller
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a writer never got its turn"
    return errors


def no_busy_wait() -> None:
    """This thread's connection fails at once where it would wait in SQLite's busy handler."""
    if connection.vendor == "sqlite":
        storage.run(lambda cursor: None, writes=False)  # connected
        connection.connection.execute("PRAGMA busy_timeout = 0")


def test_writers_of_one_process_take_turns_and_never_meet_in_the_busy_handler(chokaq_settings: Any) -> None:
    """Four threads write in transactions that each stay open a while: with a busy timeout of 0 and no transient
    retry, any two that overlapped on SQLite's write lock would fail ("database is locked")."""
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "SQL": {**chokaq_settings.CHOKAQ.get("SQL", {}),
                                                                 "MAX_TRANSIENT_RETRIES": 0}}
    assert config().SQL.MAX_TRANSIENT_RETRIES == 0
    storage.enqueue([new_job("turns")])  # the queue's rows exist
    inside = threading.Semaphore(0)
    overlaps: list[int] = []
    holders = [0]
    count_lock = threading.Lock()

    def write(cursor: Any) -> None:
        with count_lock:
            holders[0] += 1
            overlaps.append(holders[0])
        cursor.execute("UPDATE chokaq_queues SET last_updated_at = last_updated_at WHERE name = %s", ["turns"])
        time.sleep(0.005)  # the transaction holds the write lock meanwhile
        with count_lock:
            holders[0] -= 1
        inside.release()

    def writer(i: int) -> None:
        no_busy_wait()
        for n in range(10):
            if n % 2:
                storage.run(write)  # a transaction (BEGIN IMMEDIATE on SQLite)
            else:
                storage.run(write, atomic=False)  # a self-committing write

    errors = in_threads(writer, 4)
    if one_writer():
        assert errors == [], f"a writer waited in the busy handler: {errors[:1]}"
        assert max(overlaps) == 1, "two writers of the process were inside at once"
    else:  # PostgreSQL: no turns, row locks decide (the writers may run side by side)
        assert storage._write_turn(connection) is None
        assert errors == []


def test_without_turns_the_same_writers_collide(chokaq_settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control of the test above: with the turns off, SQLite's writers do meet (so that test proves the turns)."""
    if not one_writer():
        assert storage._write_turn(connection) is None
        return
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "SQL": {**chokaq_settings.CHOKAQ.get("SQL", {}),
                                                                 "MAX_TRANSIENT_RETRIES": 0}}
    monkeypatch.setattr(type(storage.dialect()), "ONE_WRITER", False)
    storage.enqueue([new_job("turns-off")])
    start = threading.Barrier(4, timeout=30)

    def write(cursor: Any) -> None:
        cursor.execute("UPDATE chokaq_queues SET last_updated_at = last_updated_at WHERE name = %s", ["turns-off"])
        time.sleep(0.005)

    def writer(i: int) -> None:
        no_busy_wait()
        start.wait()
        for _ in range(10):
            storage.run(write)

    errors = in_threads(writer, 4)
    assert errors and all("locked" in str(e) for e in errors), errors


def test_a_turn_is_given_back_when_the_transaction_fails() -> None:
    turn = storage._write_turn(connection)
    if turn is None:
        assert not one_writer()
        return

    def fail(cursor: Any) -> None:
        cursor.execute("UPDATE chokaq_queues SET last_updated_at = last_updated_at")
        raise ValueError("the transition's own error")

    def take(i: int) -> None:
        assert turn.acquire(timeout=1), "the turn stayed taken after the error"
        turn.release()

    for atomic in (True, False):
        with pytest.raises(ValueError, match="own error"):
            storage.run(fail, atomic=atomic)
        assert in_threads(take, 1) == []


def test_a_caller_transaction_takes_no_turn_and_never_waits_for_one() -> None:
    """A caller's ``atomic()`` may hold SQLite's write lock already: storage writes inside it take no turn, so a writer
    of another thread that holds the turn while it waits for that lock cannot deadlock with it."""
    storage.enqueue([new_job("caller")])
    turn = storage._write_turn(connection)
    if turn is None:
        assert not one_writer()
        return
    waiting = threading.Event()
    done = threading.Event()

    def other_writer(i: int) -> None:
        def write(cursor: Any) -> None:
            waiting.set()  # holds the turn; SQLite's lock is the caller's: waits in the busy handler
            cursor.execute("UPDATE chokaq_queues SET last_updated_at = last_updated_at WHERE name = %s", ["caller"])

        storage.run(write, atomic=False)
        done.set()

    with transaction.atomic():
        storage.enqueue([new_job("caller")])  # nested: the caller's transaction now holds SQLite's write lock
        thread = threading.Thread(target=in_threads, args=(other_writer, 1))
        thread.start()
        assert waiting.wait(10)
        started = time.monotonic()
        storage.enqueue([new_job("caller")])  # must not queue behind the other thread's turn
        storage.set_queue_max_workers("caller", 5)
        assert time.monotonic() - started < 1.0
        assert not done.is_set(), "the other writer could not have written while the caller's transaction was open"
    thread.join(timeout=30)
    assert done.is_set()


def test_reads_take_no_turn() -> None:
    turn = storage._write_turn(connection)
    if turn is None:
        assert not one_writer()
        return
    held, release = threading.Event(), threading.Event()

    def holder(i: int) -> None:
        with turn:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=in_threads, args=(holder, 1))
    thread.start()
    try:
        assert held.wait(10)
        started = time.monotonic()
        storage.queue_states()
        storage.summary_stats()
        assert time.monotonic() - started < 1.0, "a read waited for a write turn"
    finally:
        release.set()
        thread.join(timeout=30)
