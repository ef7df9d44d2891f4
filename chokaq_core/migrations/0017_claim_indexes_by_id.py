"""The claim's two stream indexes end with ``id``: each queue's rows in the exact claim order.

The claim order is priority desc, then coalesce(scheduled_at, created_at), then id. Without ``id`` in the key, rows
of one time (a bulk enqueue stamps its rows alike) sat in the index in no claim order, so a claim over many queues
could not stop reading a queue at the last row it needs: it read every row of that time. ``hot_fetch_scheduled``
orders by ``scheduled_at`` then ``id`` (its ``created_at`` key never was the claim's order).

On PostgreSQL and SQL Server both still carry ``type`` (``INCLUDE``, see 0016); the migration state lists key
columns only (see 0007). Going back recreates the 0016 key columns.
"""

from django.db import migrations, models
from django.db.models import Q

from chokaq_core.ledger import ledger_steps

ledger, unledger = ledger_steps(17, "ClaimIndexesById", "The claim's stream indexes end with id (exact claim order)")

CONDITIONS = {"hot_fetch_due": Q(status=0, scheduled_at__isnull=True),
              "hot_fetch_scheduled": Q(status=0, scheduled_at__isnull=False)}
AFTER = {"hot_fetch_due": ["queue", "-priority", "created_at", "id"],
         "hot_fetch_scheduled": ["queue", "-priority", "scheduled_at", "id"]}


def _index(name: str, fields: list[str], covering: bool) -> models.Index:
    return models.Index(fields=fields, condition=CONDITIONS[name], name=name, **({"include": ("type",)} if covering
                                                                               else {}))


class Migration(migrations.Migration):
    dependencies = [("chokaq_core", "0016_due_pending_index")]
    operations = [
        *(migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RemoveIndex("jobshot", name),
                                 migrations.AddIndex("jobshot", _index(name, fields, covering=True))],
            state_operations=[migrations.RemoveIndex("jobshot", name),
                              migrations.AddIndex("jobshot", _index(name, fields, covering=False))],
        ) for name, fields in AFTER.items()),
        migrations.RunPython(ledger, unledger),
    ]
