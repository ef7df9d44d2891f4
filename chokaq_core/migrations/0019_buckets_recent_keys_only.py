"""``buckets_recent`` keeps its key (``bucket_start``) only: a completion's bucket updates can be HOT.

Migration 0001 gave it the counters as ``INCLUDE`` columns on PostgreSQL and SQL Server. Each completion adds to
its queues' bucket of this second, and an update that changes an indexed column is never a heap-only (HOT)
update: every bucket update wrote a new entry in both of the table's indexes (PostgreSQL counted 0 HOT updates of
113,017), once per queue of each completion batch. No read took the counters from the index: the throughput read
sums by ``outcome``, which it never carried. The migration state is unchanged (the models list key columns only,
see 0007); on SQLite (no ``INCLUDE``) the index is rebuilt as it was.
"""

from django.db import migrations, models

from chokaq_core.ledger import ledger_steps

ledger, unledger = ledger_steps(19, "BucketsRecentKeysOnly", "buckets_recent without INCLUDE: bucket updates can be HOT")


class Migration(migrations.Migration):
    dependencies = [("chokaq_core", "0018_claim_index_of_all_queues")]
    operations = [
        migrations.SeparateDatabaseAndState(database_operations=[
            migrations.RemoveIndex("metricbuckets", "buckets_recent"),
            migrations.AddIndex("metricbuckets", models.Index(fields=["-bucket_start"], name="buckets_recent")),
        ]),
        migrations.RunPython(ledger, unledger),
    ]
