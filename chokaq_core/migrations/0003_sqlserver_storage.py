"""SQL Server storage: PAGE compression and FILLFACTOR 80 (spec 01 §2, spec 05 §6).

A no-op on SQLite and PostgreSQL. The filtered indexes (``WHERE [status] = 0``,
``WHERE [idempotency_key] IS NOT NULL``, …) are created by 0001 from the
models' conditions; this migration only rebuilds the big tables and all their
indexes compressed.
"""

from django.db import migrations

from chokaq_core.vendor_ops import SqlServerPageCompression


class Migration(migrations.Migration):
    dependencies = [("chokaq_core", "0002_seed")]
    operations = [
        SqlServerPageCompression("JobsHot", fillfactor=80),
        SqlServerPageCompression("JobsArchive", fillfactor=80),
        SqlServerPageCompression("JobsDLQ", fillfactor=80),
        SqlServerPageCompression("MetricBuckets", fillfactor=80),
    ]
