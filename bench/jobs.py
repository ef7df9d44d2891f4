"""Job types of the benchmark, loaded through ``CHOKAQ_JOB_MODULES=bench.jobs``."""

from __future__ import annotations

import time

from django.db import connection

from chokaq_core import JobContext, job


@job("bench.noop.v1")
def noop(ctx: JobContext) -> None:
    """Does nothing: a drain of these measures the engine alone."""


@job("bench.pickup.v1")
def pickup(ctx: JobContext, t0: float) -> None:
    """Records when the handler started next to ``t0`` (taken just before ``enqueue()`` was called)."""
    started = time.time()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO bench_pickup (job_id, enqueued_at, started_at) VALUES (%s, %s, %s)",
            [ctx.job_id, t0, started],
        )
