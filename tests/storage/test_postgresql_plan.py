"""PostgreSQL only: the claim query is served by the partial indexes of its two streams (spec 01 §2.1, §4.2).

The SQL text is not copied here: it is captured from a real
``chokaq_core.sql.postgresql.fetch_batch`` call through a recording cursor,
then EXPLAINed with the same parameters on a realistic table (50k Hot rows,
mostly Fetched/Processing, a few hundred or 10k Pending, statistics analysed).
Both the capture and the EXPLAIN run in transactions that are rolled back.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction

from chokaq_core.models import JobsHot

from .plans import captured, explain

pytestmark = [pytest.mark.postgresql, pytest.mark.sql_only]

HOT_ROWS = 50_000
# Every n-th row is Pending (spread over the four queues), the rest Fetched/Processing:
# a few hundred Pending rows (310), and a backlog (10,000) where index order decides the cost.
BACKLOGS = {"few-hundred-pending": 161, "backlog-10k": 5}
QUEUES = ["alpha", "beta", "gamma", "delta"]


def _fill_hot_table(pending_step: int) -> None:
    """50k rows over four queues: every ``pending_step``-th row due Pending, the others Fetched/Processing."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO chokaq_jobs_hot (id, queue, type, payload, priority, status, attempt_count, worker_id,
                                         heartbeat_at, scheduled_at, created_at, started_at, last_updated_at)
            SELECT 'job-' || lpad(g::text, 8, '0'),
                   (%s::text[])[1 + g %% 4],
                   'plan.v1', '{}', (g %% 5) * 10,
                   CASE WHEN g %% %s = 0 THEN 0 WHEN g %% 2 = 0 THEN 1 ELSE 2 END,
                   CASE WHEN g %% %s = 0 THEN 0 ELSE 1 END,
                   CASE WHEN g %% %s = 0 THEN NULL ELSE 'w-' || (g %% 20) END,
                   CASE WHEN g %% 2 = 1 THEN now() END,
                   CASE WHEN g %% 7 = 0 THEN now() - interval '1 minute' END,
                   now() - (g || ' milliseconds')::interval, NULL, now()
            FROM generate_series(1, %s) AS g
            """,
            [QUEUES, pending_step, pending_step, pending_step, HOT_ROWS],
        )
        cursor.execute(
            "INSERT INTO chokaq_queues (name, is_paused, is_active, last_updated_at)"
            " SELECT unnest(%s::text[]), false, true, now() ON CONFLICT (name) DO NOTHING",
            [QUEUES],
        )
        cursor.execute("ANALYZE chokaq_jobs_hot")
        cursor.execute("ANALYZE chokaq_queues")


def _captured_fetch_sql(queues: list[str] | None) -> tuple[str, Any]:
    """The statement ``fetch_batch`` sends (run for real, then rolled back)."""
    from chokaq_core.sql import postgresql

    claimed, executed = captured(lambda cursor: postgresql.DIALECT.fetch_batch(cursor, "w-plan", 20, queues))
    assert len(claimed) == 20, "the realistic table has due Pending rows to claim"
    claims = [(sql, params) for sql, params in executed if "chokaq_jobs_hot" in sql]
    assert len(claims) == 1, f"fetch_batch should be one statement, saw {len(executed)}"
    return claims[0]


@pytest.mark.parametrize("backlog", list(BACKLOGS))
@pytest.mark.parametrize("queues", [["alpha", "gamma"], None], ids=["queue-list", "all-queues"])
def test_claim_query_uses_the_partial_fetch_index(queues: list[str] | None, backlog: str) -> None:
    assert connection.vendor == "postgresql"
    step = BACKLOGS[backlog]
    _fill_hot_table(step)
    pending_rows = HOT_ROWS // step
    assert JobsHot.objects.filter(status=0).count() == pending_rows
    assert JobsHot.objects.count() == HOT_ROWS
    assert JobsHot.objects.filter(status=0, queue__in=["alpha", "gamma"]).count() > 100

    sql, params = _captured_fetch_sql(queues)
    plan = explain(sql, params)

    assert "Seq Scan on chokaq_jobs_hot" not in plan, f"claim query scans all of Hot:\n{plan}"
    if backlog == "backlog-10k":
        # With a real backlog the ordered fetch index decides the cost.
        assert "hot_fetch_due" in plan, f"claim query does not use hot_fetch_due:\n{plan}"
    else:
        # With a few hundred Pending rows the planner may prefer the smaller Pending-only
        # partial index (hot_pending_lag); either way it reads Pending rows only.
        assert "hot_fetch_due" in plan or "hot_pending_lag" in plan, plan
    assert JobsHot.objects.filter(status=0).count() == pending_rows, "capture and EXPLAIN were rolled back"


WAITING_ROWS = 20_000
# A queue's scheduled rows: all due tomorrow (a million reminders), or all due already (a backlog of retries).
SCHEDULES = {"due-tomorrow": "now() + interval '1 day'", "due-already": "now() - interval '1 hour'"}


def _hot_table_reads(node: dict[str, Any]) -> list[tuple[str, int]]:
    """Every scan of the Hot table in an ``EXPLAIN (ANALYZE, FORMAT JSON)`` plan: its type and the rows it read
    (returned or filtered out, over all its loops)."""
    reads = [(node["Node Type"], (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
                                  + node.get("Rows Removed by Index Recheck", 0)) * node["Actual Loops"])
             ] if node.get("Relation Name") == "chokaq_jobs_hot" else []
    return reads + [read for child in node.get("Plans", []) for read in _hot_table_reads(child)]


def _claim_reads() -> list[tuple[str, int]]:
    """Run one claim of every queue under ``EXPLAIN (ANALYZE, FORMAT JSON)``, rolled back: its scans of Hot."""
    sql, params = _captured_fetch_sql(None)
    with transaction.atomic(), connection.cursor() as wrapper:
        wrapper.cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        [[[explained]]] = wrapper.cursor.fetchall()
        transaction.set_rollback(True)
    return _hot_table_reads(explained["Plan"])


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_a_claim_reads_a_bounded_number_of_rows_whatever_waits_in_the_queue(schedule: str) -> None:
    """A queue with many scheduled rows (due later, or a due backlog) and a few rows due now: each claim stream reads
    its first rows in index order, never the queue's other scheduled rows."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO chokaq_jobs_hot (id, queue, type, payload, priority, status, attempt_count, scheduled_at,"
            f" created_at, last_updated_at) SELECT 'wait-' || g, 'alpha', 'plan.v1', '{{}}', 0, 0, 0,"
            f" {SCHEDULES[schedule]} + (g || ' ms')::interval, now(), now() FROM generate_series(1, %s) AS g"
            " UNION ALL SELECT 'now-' || g, 'alpha', 'plan.v1', '{}', 0, 0, 0, NULL, now(), now()"
            " FROM generate_series(1, 25) AS g", [WAITING_ROWS])
        cursor.execute("ANALYZE chokaq_jobs_hot")
    reads = _claim_reads()
    assert reads and all(kind != "Seq Scan" for kind, _ in reads), reads
    assert sum(rows for _, rows in reads) < 1_000, reads  # the claim's 20 rows, 80 candidates, the queues' probes
    assert JobsHot.objects.filter(status=0).count() == WAITING_ROWS + 25, "capture and EXPLAIN were rolled back"


def test_the_pending_split_counts_pending_rows_only_through_hot_pending_split() -> None:
    """The index carries every column the split reads: with a current visibility map (autovacuum) the count is
    an index-only scan; inside this test's transaction (no VACUUM) the planner takes a bitmap over it."""
    from chokaq_core.sql import base

    _fill_hot_table(BACKLOGS["backlog-10k"])
    plan = explain(base.pending_split_sql("scheduled_at > now()"), None)
    assert "hot_pending_split" in plan and "Seq Scan" not in plan, plan


def test_a_top_errors_group_filter_reads_its_group_through_dlq_by_error() -> None:
    from chokaq_core.domain import FailureReason, JobFilter
    from chokaq_core.readmodel import HistorySort
    from chokaq_core.sql import postgresql, reads_for

    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO chokaq_jobs_dlq (id, queue, type, failure_reason, error_details, attempt_count, created_at,
                                         failed_at, revision, error_class, error_message)
            SELECT 'dead-' || g, 'q', 'plan.v1', g % 4, 'Traceback …', 3, now(), now() - (g || ' ms')::interval, 0,
                   'builtins.Error' || (g % 50), 'message ' || (g % 7)
            FROM generate_series(1, 50000) AS g
            """)
        cursor.execute("ANALYZE chokaq_jobs_dlq")
    group = JobFilter(failure_reason=FailureReason(1), error_class="builtins.Error5", error_message="message 3")
    reads = reads_for(postgresql.DIALECT)
    rows, [(sql, params)] = captured(lambda cursor: reads.list_dlq(cursor, group, None, 100, HistorySort()))
    assert rows and all(r.error_class == "builtins.Error5" for r in rows)
    plan = explain(sql, params)
    assert "dlq_by_error" in plan and "Seq Scan" not in plan, plan


def test_a_job_due_now_enters_neither_index_of_waiting_rows() -> None:
    """``hot_pending_lag`` and ``hot_pending_split`` hold the scheduled Pending rows only (a row without a schedule
    is due), so a job enqueued to run now writes two index entries fewer; the split still reads its index."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'chokaq_jobs_hot'"
                       " AND indexname IN ('hot_pending_lag', 'hot_pending_split')")
        definitions = dict(cursor.fetchall())
    assert sorted(definitions) == ["hot_pending_lag", "hot_pending_split"]
    for name, definition in definitions.items():
        assert definition.endswith("WHERE ((scheduled_at IS NOT NULL) AND (status = 0))"), (name, definition)


# Many queues, rows enqueued round-robin: each with its own creation time, or 1,000 at a time (one bulk enqueue
# stamps its rows alike).
SPREADS = {"own-time": "g", "batches-of-1000": "g / 1000 * 1000"}


@pytest.mark.parametrize("paused", [False, True], ids=["every-queue-open", "a-queue-paused"])
@pytest.mark.parametrize("spread", list(SPREADS))
def test_a_claim_over_many_queues_reads_about_its_candidates(spread: str, paused: bool) -> None:
    """100 queues of 200 due rows each: one claim of 20 rows (80 candidates) reads its candidates from hot_fetch_all
    while every queue is open, else its candidates and one or two rows a queue (a share of each), never each queue's
    first 80 rows (8,000 rows)."""
    with connection.cursor() as cursor:
        if paused:  # a paused queue's rows must be stepped over: the claim walks the queues
            cursor.execute("INSERT INTO chokaq_queues (name, is_paused, is_active, last_updated_at)"
                           " VALUES ('q000', true, true, now())")
        cursor.execute(
            "INSERT INTO chokaq_jobs_hot (id, queue, type, payload, priority, status, attempt_count, created_at,"
            " last_updated_at) SELECT 'many-' || lpad(g::text, 6, '0'), 'q' || lpad((g %% 100)::text, 3, '0'),"
            f" 'plan.v1', '{{}}', 0, 0, 0, now() - interval '1 hour' + ({SPREADS[spread]} || ' ms')::interval, now()"
            " FROM generate_series(1, %s) AS g", [100 * 200])
        cursor.execute("ANALYZE chokaq_jobs_hot")
    reads = _claim_reads()
    assert reads and all(kind != "Seq Scan" for kind, _ in reads), reads
    assert sum(rows for _, rows in reads) < (600 if paused else 300), reads  # main read 8,221 rows in each
    assert JobsHot.objects.filter(status=0).count() == 100 * 200, "capture and EXPLAIN were rolled back"
