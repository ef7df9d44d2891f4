"""PostgreSQL: the claim and the lease commit asynchronously; nothing else does (bench/README, "Asynchronous
commit of the claim and the lease", has the argument)."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from chokaq_core import storage
from chokaq_core.domain import Retry, Success

from .plans import captured, explain
from .rows import pending

pytestmark = [pytest.mark.postgresql, pytest.mark.sql_only]


def setting() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('synchronous_commit')")
        return str(cursor.fetchone()[0])


def test_the_claim_and_the_lease_commit_asynchronously_and_nothing_after_them_does(vendor: str) -> None:
    """Each asks for an asynchronous commit of its own transaction only: the connection's later transactions, a
    handler's among them (executors lease on the connection their handlers use), commit as configured."""
    assert vendor == "postgresql", "PostgreSQL-only (deselected on SQLite)"
    pending("async-lease", 2)
    with transaction.atomic():  # the statements run in this transaction: their local setting is visible here
        assert setting() == "on"
        [job] = storage.fetch_batch("w1", 1, ["async-lease"])
        assert setting() == "off"
    with transaction.atomic():
        assert setting() == "on", "a transaction-local setting ends with its transaction"
        assert storage.mark_processing(job, "w1") == 1
        assert setting() == "off"
    [other] = storage.fetch_batch("w1", 1, ["async-lease"])
    assert storage.mark_processing_batch([other], "w1") == {other.id: 1}
    assert setting() == "on", "the connection's next transaction commits synchronously"
    with transaction.atomic():
        done = storage.complete("w1", [Success(job.id, 1.0, None), Success(other.id, 1.0, None)], [], [])
        assert sorted(i for i, _ in done.archived) == sorted([job.id, other.id])
        assert setting() == "on", "completions stay durable"


def test_a_claim_with_no_capped_queue_in_reach_is_one_statement_that_commits_itself(vendor: str) -> None:
    """No BEGIN, no lock of the capped queues, no COMMIT: the claim statement alone, asynchronously committed; with
    a capped queue in reach it claims nothing and says so, and that worker takes the transaction for a while."""
    assert vendor == "postgresql", "PostgreSQL-only (deselected on SQLite)"
    sql = storage.dialect()
    assert sql.CLAIMS_ALONE
    pending("alone", 2)
    with transaction.atomic():  # to read its transaction-local setting (run alone, the statement is its transaction)
        [job] = storage.run(lambda cursor: sql.fetch_alone(cursor, "w1", 1, ["alone"], 1), atomic=False)
        assert setting() == "off"
    assert job.status == 2 and job.worker_id == "w1" and job.attempt_count == 1, "leased at its claim"
    assert connection.get_autocommit() and not connection.in_atomic_block

    storage.set_queue_max_workers("alone", 5)
    assert storage.run(lambda cursor: sql.fetch_alone(cursor, "w1", 5, ["alone"], 0), atomic=False) is None
    assert storage.run(lambda cursor: sql.fetch_alone(cursor, "w1", 5, None, 0), atomic=False) is None
    assert storage.run(lambda cursor: sql.fetch_alone(cursor, "w1", 5, ["elsewhere"], 0), atomic=False) == []
    storage._CAPPED_IN_REACH.pop(("alone",), None)
    [other] = storage.fetch_batch("w1", 5, ["alone"])  # found the cap: claimed in a transaction instead
    assert other.worker_id == "w1"
    assert storage._CAPPED_IN_REACH[("alone",)] > 0


def test_a_claim_alone_leases_the_first_rows_in_claim_order_and_ranks_nothing(vendor: str) -> None:
    """With no capped queue in reach no bulkhead applies: the statement alone locks the claim's rows and leases the
    first of them in claim order (priority first, across the due and the due scheduled rows), without a ranking."""
    assert vendor == "postgresql", "PostgreSQL-only (deselected on SQLite)"
    sql = storage.dialect()
    low = pending("alone-order", 2, priority=0)
    [scheduled] = pending("alone-order", 1, priority=5, delay=60)
    high = pending("alone-order", 1, priority=9)
    with connection.cursor() as cursor:  # the scheduled row is due now
        cursor.execute("UPDATE chokaq_jobs_hot SET scheduled_at = now() - interval '1 second' WHERE id = %s",
                       [scheduled])
    claimed, [(statement, params)] = captured(lambda cursor: sql.fetch_alone(cursor, "w1", 3, ["alone-order"], 2),
                                              keep=True)
    assert claimed is not None
    assert [job.id for job in claimed] == [*high, scheduled, low[0]], "claim order"
    assert [job.status for job in claimed] == [2, 2, 1], "the first two leased, the third fetched"

    plan = explain(statement, params)
    assert "WindowAgg" not in plan, f"the claim alone ranks its rows for a bulkhead:\n{plan}"


def test_a_batch_of_successes_is_one_statement_that_commits_itself(vendor: str, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    """The move records its history itself, so archiving successes is one statement: no BEGIN, no COMMIT of its own,
    a durable commit; a batch with a retry or a failure keeps its transaction (several statements)."""
    assert vendor == "postgresql", "PostgreSQL-only (deselected on SQLite)"
    opened: list[bool] = []
    atomic = transaction.atomic

    def counting(*args: object, **kwargs: object) -> object:
        opened.append(True)
        return atomic(*args, **kwargs)  # type: ignore[arg-type]

    pending("alone-done", 3)
    jobs = storage.fetch_batch("w1", 3, ["alone-done"], lease=3)
    monkeypatch.setattr(storage.transaction, "atomic", counting)
    done = storage.complete("w1", [Success(jobs[0].id, 1.0, None), Success(jobs[1].id, 1.0, None)], [], [])
    assert sorted(i for i, _ in done.archived) == sorted([jobs[0].id, jobs[1].id]) and opened == []
    assert connection.get_autocommit() and not connection.in_atomic_block
    done = storage.complete("w1", [], [Retry(jobs[2].id, 1, 0.0)], [])
    assert [i for i, _ in done.rescheduled] == [jobs[2].id] and opened == [True]
