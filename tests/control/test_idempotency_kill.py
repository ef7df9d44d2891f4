"""The idempotency middleware: a worker killed after the side effect and before completion does not run it twice.

A ``chokaq_worker`` subprocess runs ``ctl.effect.v1`` (its handler inserts one
row into ``ctl_effects`` per run) with the idempotency middleware on a shared
Redis store. An outer test middleware sleeps once the onion returned — the
completion marker is in Redis, the archive not yet committed — and the worker is
SIGKILLed in that sleep. The zombie sweep moves the job to the DLQ, an operator
resurrects it, a fresh worker runs it: the middleware finds the marker and skips
the handler, the job is archived, and the side effect exists exactly once.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.db import connection

from chokaq_core import FailureReason, JobStatus, enqueue, maintenance, service, storage
from chokaq_core.middleware import RedisIdempotencyStore
from tests.control.conftest import REDIS_URL, WorkerProcesses, query

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

QUEUE = "ctl-idem"
MIDDLEWARE = ["tests.control.jobs.LingerAfterMiddleware", "chokaq_core.middleware.IdempotencyMiddleware"]
OVERRIDES = {"MIDDLEWARE": MIDDLEWARE,
             "IDEMPOTENCY": {"STORE": "chokaq_core.middleware.RedisIdempotencyStore"}}


@pytest.fixture
def effects_table(transactional_db: None) -> Iterator[None]:
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS ctl_effects")
        cursor.execute("CREATE TABLE ctl_effects (job_id varchar(50) NOT NULL, effect_key varchar(200) NOT NULL,"
                       " attempt integer NOT NULL)")
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS ctl_effects")


@pytest.fixture
def effect_key() -> Iterator[str]:
    key = f"kill-{uuid.uuid4().hex}"
    yield key
    redis.Redis.from_url(REDIS_URL).delete(RedisIdempotencyStore.prefix + f"effect:{key}")


def effects(key: str) -> list[tuple[Any, ...]]:
    return query("SELECT job_id, attempt FROM ctl_effects WHERE effect_key = %s", [key])


def marker(key: str) -> dict[str, Any] | None:
    raw = redis.Redis.from_url(REDIS_URL).get(RedisIdempotencyStore.prefix + f"effect:{key}")
    return json.loads(raw) if raw else None


def until(predicate: Any, what: str, procs: WorkerProcesses, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}\n" + procs.outputs())
        time.sleep(0.05)


def test_killed_after_the_side_effect_the_job_is_not_run_twice(
    effects_table: None, effect_key: str, worker_procs: WorkerProcesses,
) -> None:
    service.set_queue_zombie_timeout(QUEUE, 1)
    job_id = enqueue("ctl.effect.v1", {"key": effect_key}, queue=QUEUE)

    victim = worker_procs.start("--queues", QUEUE, "--no-rescue", overrides=OVERRIDES, REDIS_URL=REDIS_URL,
                                CHOKAQ_TEST_LINGER="60")
    # The side effect is committed and the completion marker written; the job is still Processing.
    until(lambda: effects(effect_key) and (m := marker(effect_key)) and m["state"] == "completed",
          "the side effect and its completion marker", worker_procs)
    job = storage.get_hot(job_id)
    assert job is not None and job.status == JobStatus.PROCESSING and job.worker_id == victim.worker_id
    worker_procs.kill(victim)

    # The zombie sweep (queue timeout 1 s) moves it to the DLQ: a zombie is never retried automatically.
    dead = until(lambda: maintenance.rescue() and storage.get_dead(job_id), "the job in the DLQ as a zombie",
                 worker_procs)
    assert dead.failure_reason == FailureReason.ZOMBIE and dead.worker_id == victim.worker_id
    assert len(effects(effect_key)) == 1

    # An operator resurrects it; a new worker runs it; the middleware skips the handler.
    assert service.resurrect_many([job_id], actor="ops@example") == [job_id]
    second = worker_procs.start("--queues", QUEUE, overrides=OVERRIDES, REDIS_URL=REDIS_URL)
    archived = until(lambda: storage.get_archived(job_id), "the resurrected job archived", worker_procs)
    assert archived.worker_id == second.worker_id
    assert effects(effect_key) == [(job_id, 1)], "the side effect ran twice"
    assert storage.get_hot(job_id) is None and storage.get_dead(job_id) is None
    assert marker(effect_key)["state"] == "completed"  # type: ignore[index]


def test_without_the_marker_a_resurrected_job_runs_again(
    effects_table: None, effect_key: str, worker_procs: WorkerProcesses,
) -> None:
    """The control experiment: killed before the handler finished, the job's side effect is re-run —
    so the test above passes because of the middleware, not because a resurrected job never runs."""
    service.set_queue_zombie_timeout(QUEUE, 1)
    job_id = enqueue("ctl.effect.v1", {"key": effect_key}, queue=QUEUE)
    no_idempotency = {"MIDDLEWARE": ["tests.control.jobs.LingerAfterMiddleware"]}
    victim = worker_procs.start("--queues", QUEUE, "--no-rescue", overrides=no_idempotency, CHOKAQ_TEST_LINGER="60")
    until(lambda: effects(effect_key), "the side effect", worker_procs)
    worker_procs.kill(victim)
    until(lambda: maintenance.rescue() and storage.get_dead(job_id), "the zombie in the DLQ", worker_procs)
    assert service.resurrect_many([job_id], actor="ops@example") == [job_id]
    worker_procs.start("--queues", QUEUE, overrides=no_idempotency)
    until(lambda: storage.get_archived(job_id), "the resurrected job archived", worker_procs)
    assert len(effects(effect_key)) == 2
