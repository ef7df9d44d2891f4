"""The Pending split is a count over the partial index ``hot_pending_split`` alone on SQLite (a covering index:
no table row is read), on the schema the models create."""

from __future__ import annotations

import sqlite3

from chokaq_core.sql import memory, sqlite


def test_sqlite_counts_the_pending_split_from_the_covering_index() -> None:
    connection = sqlite3.connect(":memory:")
    for statement in memory._schema():
        connection.execute(statement)
    split = sqlite.SUMMARY_STATS_SQL[sqlite.SUMMARY_STATS_SQL.index("CROSS JOIN (SELECT coalesce(sum(p.later)"):]
    split = split.removeprefix("CROSS JOIN (").rsplit(") AS pend", 1)[0]
    plan = " / ".join(row[3] for row in connection.execute(f"EXPLAIN QUERY PLAN {split}"))
    assert "USING COVERING INDEX hot_pending_split" in plan, plan
