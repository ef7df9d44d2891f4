"""``python -m tests.acceptance.enqueuer TOTAL BATCH INTERVAL PREFIX``: enqueue continuously through an outage.

Used by ``test_db_restart``: enqueues ``TOTAL`` jobs with explicit ids ``PREFIX-000001``… in batches
of ``BATCH`` every ``INTERVAL`` seconds. A batch that raises (the database is away) is not simply
sent again: once the database answers, its ids are looked up — one transaction, so all or none
committed — and it is re-sent only if none is there. Prints ``enqueued N`` after each batch and
``done N`` at the end (DJANGO_SETTINGS_MODULE and DATABASE_URL come from the environment).
"""

from __future__ import annotations

import sys
import time


def main() -> int:
    import django

    django.setup()
    from django.db import connection

    from chokaq_core import enqueue_many

    total, batch, interval, prefix = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]

    def committed(ids: list[str]) -> int | None:
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT (SELECT count(*) FROM chokaq_jobs_hot WHERE id = ANY(%s))"
                    " + (SELECT count(*) FROM chokaq_jobs_archive WHERE id = ANY(%s))"
                    " + (SELECT count(*) FROM chokaq_jobs_dlq WHERE id = ANY(%s))", [ids, ids, ids])
                return int(cursor.fetchone()[0])
        except Exception:
            connection.close()
            return None

    done, failures = 0, 0
    while done < total:
        ids = [f"{prefix}-{n:06d}" for n in range(done + 1, min(done + batch, total) + 1)]
        items = [{"type_key": "test.chaos.slow.v1", "payload": {"ms": 10}, "job_id": i} for i in ids]
        try:
            enqueue_many(items)
        except Exception as exc:
            failures += 1
            print(f"enqueue failed ({type(exc).__name__}); waiting for the database", flush=True)
            connection.close()
            while (found := committed(ids)) is None:
                time.sleep(0.25)
            if found == 0:
                continue  # nothing committed: send the same batch again
            if found != len(ids):
                print(f"PARTIAL BATCH {ids[0]}: {found} of {len(ids)}", flush=True)
                return 2
        done += len(ids)
        print(f"enqueued {done}", flush=True)
        time.sleep(interval)
    print(f"done {done} failures {failures}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
