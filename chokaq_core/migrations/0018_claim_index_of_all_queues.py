"""PostgreSQL: ``hot_fetch_all``, the due Pending rows without a schedule of every queue in one claim order.

A worker on every queue (no ``--queues``) claimed by walking the queues with Pending rows and reading a share of
each queue's ``hot_fetch_due`` range: two index probes a queue for each claim, whatever the claim's size. While no
queue is paused or hidden, no rate limit holds rows back and no scheduled row is due, the claim's candidates are
the first rows of this index. PostgreSQL only (its claim alone reads it): on SQLite and SQL Server it would be
one more index entry per job written for no read. Not in the migration state (no model field or option changes).
"""

from typing import Any

from django.db import migrations

from chokaq_core.ledger import ledger_steps

ledger, unledger = ledger_steps(18, "ClaimIndexOfAllQueues", "PostgreSQL: every queue's due rows in claim order")

CREATE = ("CREATE INDEX IF NOT EXISTS hot_fetch_all ON chokaq_jobs_hot (priority DESC, created_at, id)"
          " WHERE status = 0 AND scheduled_at IS NULL")
DROP = "DROP INDEX IF EXISTS hot_fetch_all"


def _on_postgresql(sql: str) -> Any:
    def run(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("chokaq_core", "0017_claim_indexes_by_id")]
    operations = [
        migrations.RunPython(_on_postgresql(CREATE), _on_postgresql(DROP)),
        migrations.RunPython(ledger, unledger),
    ]
