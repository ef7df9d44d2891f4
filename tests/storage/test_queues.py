"""Queue controls (spec 01 §4.17) and the read models built on them."""

from __future__ import annotations

from django.utils import timezone

from chokaq_core import storage
from chokaq_core.models import Queues

from .rows import ago, close_to, of_kind, pending


def state(name: str) -> tuple[bool, bool, int | None, int | None]:
    q = Queues.objects.get(name=name)
    return q.is_paused, q.is_active, q.zombie_timeout_seconds, q.max_workers


def test_set_queue_paused_creates_a_missing_queue_row(published: list) -> None:
    now = timezone.now()
    storage.set_queue_paused("new-paused", True)
    assert state("new-paused") == (True, True, None, None)
    assert close_to(Queues.objects.get(name="new-paused").last_updated_at, now)
    [event] = of_kind(published, "QueueStateChanged")
    assert event == {"queueName": "new-paused", "isPaused": True, "isActive": True}


def test_set_queue_paused_toggles_and_keeps_other_controls() -> None:
    pending("pz")
    storage.set_queue_max_workers("pz", 4)
    storage.set_queue_zombie_timeout("pz", 120)
    Queues.objects.filter(name="pz").update(last_updated_at=ago(3600))

    storage.set_queue_paused("pz", True)
    assert state("pz") == (True, True, 120, 4)
    assert close_to(Queues.objects.get(name="pz").last_updated_at, timezone.now())
    storage.set_queue_paused("pz", False)
    assert state("pz") == (False, True, 120, 4)
    assert Queues.objects.filter(name="pz").count() == 1


def test_set_queue_active_pauses_in_both_directions(published: list) -> None:
    pending("act")
    assert state("act")[:2] == (False, True)

    assert storage.set_queue_active("act", False) is True
    assert state("act")[:2] == (True, False)

    storage.set_queue_paused("act", False)
    assert storage.set_queue_active("act", True) is True
    assert state("act")[:2] == (True, True), "unhiding leaves the queue paused until resumed"
    assert [(e["isPaused"], e["isActive"]) for e in of_kind(published, "QueueStateChanged")] == [
        (True, False), (False, False), (True, True)]


def test_set_queue_active_never_creates_a_row() -> None:
    assert storage.set_queue_active("ghost", False) is False
    assert not Queues.objects.filter(name="ghost").exists()


def test_zombie_timeout_upsert_and_clear() -> None:
    storage.set_queue_zombie_timeout("zt", 90)
    assert state("zt") == (False, True, 90, None)
    storage.set_queue_paused("zt", True)
    storage.set_queue_zombie_timeout("zt", 300)
    assert state("zt") == (True, True, 300, None)
    storage.set_queue_zombie_timeout("zt", None)
    assert state("zt") == (True, True, None, None)


def test_max_workers_upsert_and_clear() -> None:
    storage.set_queue_max_workers("mw", 5)
    assert state("mw") == (False, True, None, 5)
    storage.set_queue_max_workers("mw", 1)
    assert state("mw") == (False, True, None, 1)
    storage.set_queue_max_workers("mw", None)
    assert state("mw") == (False, True, None, None)


def test_queue_states_read_back_every_control() -> None:
    storage.set_queue_paused("b-read", True)
    storage.set_queue_max_workers("a-read", 2)
    storage.set_queue_zombie_timeout("a-read", 60)
    states = {q.name: q for q in storage.queue_states()}
    assert (states["a-read"].is_paused, states["a-read"].is_active, states["a-read"].zombie_timeout_seconds,
            states["a-read"].max_workers) == (False, True, 60, 2)
    assert states["b-read"].is_paused is True
    names = [q.name for q in storage.queue_states()]
    assert names == sorted(names)
