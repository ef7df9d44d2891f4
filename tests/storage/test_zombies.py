"""storage.archive_zombies: expired Processing rows → DLQ Zombie (spec 01 §4.12, 02 §6)."""

from __future__ import annotations

from django.utils import timezone

from chokaq_core import storage
from chokaq_core.domain import FailureReason
from chokaq_core.models import JobsDLQ, JobsHot

from .rows import backdate, buckets, close_to, counters, dlq_row, fetched, hot, of_kind, processing

ZOMBIE_TEXT = "Zombie: Worker heartbeat expired during execution"


def test_expired_heartbeats_go_to_the_dlq_as_zombies(published: list) -> None:
    expired = processing("zq", "w-dead")[0]
    alive = processing("zq", "w1")[0]
    silent_old = processing("zq", "w-dead")[0]
    silent_new = processing("zq", "w1")[0]
    stuck_fetch = fetched("zq-f", "w-dead")[0]
    JobsHot.objects.filter(id=stuck_fetch.id).update(queue="zq")
    backdate([expired.id], 20 * 60, "heartbeat_at")
    backdate([silent_old.id], 20 * 60, "last_updated_at")
    backdate([stuck_fetch.id], 20 * 60, "last_updated_at")
    JobsHot.objects.filter(id__in=[silent_old.id, silent_new.id]).update(heartbeat_at=None)
    before_rows = {j.id: hot(j.id) for j in (expired, silent_old)}
    before = timezone.now()
    published.clear()

    moved = storage.archive_zombies(600)

    assert sorted(moved) == sorted([(expired.id, "zq"), (silent_old.id, "zq")])
    for job_id in (expired.id, silent_old.id):
        assert hot(job_id) is None
        row = dlq_row(job_id)
        assert row is not None
        assert row["failure_reason"] == int(FailureReason.ZOMBIE) == 2
        assert row["error_details"] == ZOMBIE_TEXT
        assert row["worker_id"] == "w-dead"
        assert row["attempt_count"] == 1
        assert row["created_at"] == before_rows[job_id]["created_at"]  # type: ignore[index]
        assert close_to(row["failed_at"], before)
    assert hot(alive.id)["status"] == 2  # type: ignore[index]
    assert hot(silent_new.id)["status"] == 2, "no heartbeat yet, but recently updated"  # type: ignore[index]
    assert hot(stuck_fetch.id)["status"] == 1, "Fetched rows are not zombies"  # type: ignore[index]
    assert counters("zq") == (0, 2, 0)
    assert buckets("zq", 1, int(FailureReason.ZOMBIE)) == {"completed": 2, "timed": 0, "total": 0.0, "max": None}
    assert of_kind(published, "StatsUpdated")
    assert storage.archive_zombies(600) == []


def test_a_recent_heartbeat_saves_an_old_last_update() -> None:
    """The heartbeat, when present, decides — not last_updated_at."""
    job = processing("zq-hb", "w1")[0]
    backdate([job.id], 20 * 60, "last_updated_at")
    backdate([job.id], 5, "heartbeat_at")
    assert storage.archive_zombies(600) == []
    assert hot(job.id)["status"] == 2  # type: ignore[index]


def test_queue_zombie_timeout_overrides_the_global_one() -> None:
    short = processing("zq-short", "w1")[0]
    default = processing("zq-default", "w1")[0]
    long = processing("zq-long", "w1")[0]
    storage.set_queue_zombie_timeout("zq-short", 60)
    storage.set_queue_zombie_timeout("zq-long", 3600)
    backdate([short.id, default.id], 5 * 60, "heartbeat_at")
    backdate([long.id], 20 * 60, "heartbeat_at")

    moved = storage.archive_zombies(600)

    assert moved == [(short.id, "zq-short")], "5 min > 60 s override; 5 min < 10 min global; 20 min < 1 h override"
    assert hot(default.id) is not None and hot(long.id) is not None
    assert counters("zq-short") == (0, 1, 0)
    assert counters("zq-long") == (0, 0, 0)

    backdate([default.id], 11 * 60, "heartbeat_at")
    assert storage.archive_zombies(600) == [(default.id, "zq-default")]
    assert hot(long.id) is not None

    storage.set_queue_zombie_timeout("zq-long", None)
    assert storage.archive_zombies(600) == [(long.id, "zq-long")], "cleared override falls back to the global"


def test_zombies_keep_their_attempt_count() -> None:
    job = processing("zq-attempts", "w1")[0]
    JobsHot.objects.filter(id=job.id).update(attempt_count=3)
    backdate([job.id], 20 * 60, "heartbeat_at")
    storage.archive_zombies(600)
    assert JobsDLQ.objects.get(id=job.id).attempt_count == 3


def test_only_a_silence_longer_than_the_timeout_makes_a_zombie() -> None:
    job = processing("zq-edge", "w1")[0]
    backdate([job.id], 20 * 60, "heartbeat_at")
    assert storage.archive_zombies(20 * 60 + 30) == []
    assert storage.archive_zombies(20 * 60 - 30) == [(job.id, "zq-edge")]
