"""The open inspector follows its job: the socket names the followed job when it moves (an event, or the
broadcaster's own look at where it is), and the inspector's re-fetch says where it is now, where it came
from, that it was purged, and offers only the actions valid there."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.test import Client

from chokaq_core import events, service, storage
from chokaq_core.domain import Success
from tests.deck.conftest import (
    HTMX,
    archived,
    close_thread_connections,
    dead,
    frames_until,
    make_user,
    pending,
    processing,
    run,
)
from tests.deck.test_consumer import connected, enqueue

ClientAs = Callable[[str], Client]


def follow_headers(job_id: str, was: str) -> dict[str, str]:
    return {**HTMX, "HTTP_X_DECK_FOLLOW": job_id, "HTTP_X_DECK_WAS": was}


def actions(html: str) -> set[str]:
    """The ids of the inspector's action buttons."""
    block = html.split('class="actions inspector-actions"', 1)[1] if "inspector-actions" in html else ""
    return set(re.findall(r'id="(btn-[a-z-]+)"', block))


# ---------------------------------------------------------------- the inspector's re-fetch (HTTP)


@pytest.mark.django_db
def test_a_followed_job_that_moved_to_the_archive_says_so_and_offers_only_archive_actions(
        client_as: ClientAs) -> None:
    job_id = archived("done")[0]
    html = client_as("admin").get(f"/deck/jobs/{job_id}", **follow_headers(job_id, "hot")).content.decode()
    assert 'data-where="archive"' in html
    assert re.search(r'id="inspector-moved"[^>]*>Moved: ACTIVE → ARCHIVE<', html)
    assert "SUCCEEDED" in html
    assert actions(html) == {"btn-delete"}  # no STOP, no RETRY, no EDIT for an archived job


@pytest.mark.django_db
def test_a_followed_job_that_stayed_put_shows_no_move(client_as: ClientAs) -> None:
    job_id = processing("busy")[0]
    html = client_as("operator").get(f"/deck/jobs/{job_id}", **follow_headers(job_id, "hot")).content.decode()
    assert 'data-where="hot"' in html and "inspector-moved" not in html
    assert actions(html) == {"btn-stop"}  # running: stop it, but it can no longer be edited


@pytest.mark.django_db
def test_a_followed_job_in_the_dlq_offers_retry_edit_and_delete(client_as: ClientAs) -> None:
    job_id = dead("failing")[0]
    html = client_as("admin").get(f"/deck/jobs/{job_id}", **follow_headers(job_id, "hot")).content.decode()
    assert "Moved: ACTIVE → MORGUE" in html
    assert actions(html) == {"btn-edit", "btn-retry", "btn-delete"}


@pytest.mark.django_db
def test_a_followed_job_that_was_purged_says_purged_with_no_buttons(client_as: ClientAs) -> None:
    job_id = dead("failing")[0]
    admin = client_as("admin")
    service.purge_dlq(job_id)
    response = admin.get(f"/deck/jobs/{job_id}", **follow_headers(job_id, "dlq"))
    html = response.content.decode()
    assert response.status_code == 404 and 'id="inspector"' in html
    assert 'id="job-purged"' in html and "PURGED" in html and "was purged: it was in MORGUE" in html
    assert "btn-" not in html  # nothing stale to press
    assert '"X-Deck-Was": "dlq"' in html  # a later refresh of this panel still says purged
    again = admin.get(f"/deck/jobs/{job_id}", **follow_headers(job_id, "dlq")).content.decode()
    assert 'id="job-purged"' in again


@pytest.mark.django_db
def test_an_unknown_id_without_follow_headers_is_not_called_purged(client_as: ClientAs) -> None:
    html = client_as("admin").get("/deck/jobs/01NOSUCHJOB0000000000000000", **HTMX).content.decode()
    assert 'id="job-not-found"' in html and "job-purged" not in html


@pytest.mark.django_db
def test_follow_headers_for_another_job_are_ignored(client_as: ClientAs) -> None:
    job_id = archived("done")[0]
    html = client_as("admin").get(f"/deck/jobs/{job_id}", **follow_headers("01OTHER", "hot")).content.decode()
    assert "inspector-moved" not in html


@pytest.mark.django_db
@pytest.mark.parametrize("was", ["<script>", "gone", "", "HOT"])
def test_a_follow_header_naming_no_pillar_changes_nothing(client_as: ClientAs, was: str) -> None:
    job_id = archived("done")[0]
    response = client_as("admin").get(f"/deck/jobs/{job_id}", **follow_headers(job_id, was))
    html = response.content.decode()
    assert response.status_code == 200 and "inspector-moved" not in html and "<script>" not in html
    service.purge_archive(job_id)
    gone = client_as("admin").get(f"/deck/jobs/{job_id}", **follow_headers(job_id, was)).content.decode()
    assert 'id="job-not-found"' in gone and "job-purged" not in gone and "<script>" not in gone


@pytest.mark.django_db
def test_the_inspector_carries_its_follow_headers(client_as: ClientAs) -> None:
    job_id = pending("main")[0]
    html = client_as("viewer").get(f"/deck/jobs/{job_id}", **HTMX).content.decode()
    assert f'hx-headers=\'{{"X-Deck-Follow": "{job_id}", "X-Deck-Was": "hot"}}\'' in html


# ---------------------------------------------------------------- the socket names the followed job


def touched(frame: str) -> set[str]:
    return set(re.findall(r'data-touched="([^"]+)"', frame))


async def named_after_a_read(socket: Any, job_id: str, tries: int = 5) -> bool:
    """Cause reads (an unrelated enqueue each) until a frame names ``job_id``; the follow message travels on its
    own, so the first read may come before the socket handled it."""
    for _ in range(tries):
        await sync_to_async(enqueue)()
        if (await frames_until(socket, lambda f: job_id in touched(f), 2))[0] is not None:
            return True
    return False


def move_silently(job_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Archive a Processing job with no event reaching this process (a worker elsewhere, no Redis)."""
    try:
        with monkeypatch.context() as m:
            m.setattr(events, "dispatch", lambda batch: None)
            storage.complete("w-deck", [Success(job_id, 2.0)], [], [])
    finally:
        close_thread_connections()


def start_processing() -> str:
    try:
        return processing("busy")[0]
    finally:
        close_thread_connections()


@pytest.fixture
def admin_user(roles: None) -> User:
    user = make_user("admin")
    assert user is not None
    return user


@pytest.mark.django_db(transaction=True)
def test_a_followed_job_that_moves_without_an_event_is_named_on_the_next_read(
        live_settings: Any, admin_user: User, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        followed = await sync_to_async(start_processing)()
        other = await sync_to_async(start_processing)()
        socket = await connected(admin_user)
        await socket.send_to(text_data=f'{{"type": "follow", "jobId": "{followed}"}}')
        # the first read after following names the job once (its inspector may predate a change)
        assert await named_after_a_read(socket, followed), "the newly followed job was not named"
        await sync_to_async(move_silently)(followed, monkeypatch)
        await sync_to_async(move_silently)(other, monkeypatch)
        await sync_to_async(enqueue)()  # an unrelated event: the next read
        frame, seen = await frames_until(socket, lambda f: followed in touched(f), 5)
        assert frame is not None, "the followed job's move to the Archive was not named"
        assert not any(other in touched(f) for f in seen), "a job nobody follows is never named"
        await socket.disconnect()

    run(scenario())


@pytest.mark.django_db(transaction=True)
def test_an_event_for_the_followed_job_names_it_and_other_jobs_are_not_named(
        live_settings: Any, admin_user: User) -> None:
    async def scenario() -> None:
        job_id = await sync_to_async(enqueue)()
        socket = await connected(admin_user)
        await socket.send_to(text_data=f'{{"type": "follow", "jobId": "{job_id}"}}')
        assert await named_after_a_read(socket, job_id), "the newly followed job was not named"
        others: list[str] = []
        for _ in range(3):  # events of jobs nobody follows never travel as names
            others.append(await sync_to_async(enqueue)())
        events.dispatch([events.Event(events.EventKind.JOB_RESURRECTED, {"jobId": job_id, "queue": "live"})])
        frame, seen = await frames_until(socket, lambda f: job_id in touched(f), 5)
        assert frame is not None, "the event for the followed job was not passed on"
        assert not any(set(others) & touched(f) for f in seen)
        await socket.disconnect()

    run(scenario())


@pytest.mark.django_db(transaction=True)
def test_follow_messages_that_are_not_a_job_id_are_ignored(live_settings: Any, admin_user: User) -> None:
    async def scenario() -> None:
        socket = await connected(admin_user)
        for bad in ('{"type": "follow", "jobId": 12}', '{"type": "follow", "jobId": "' + "x" * 80 + '"}',
                    '{"type": "follow", "jobId": "a b"}', '{"type": "follow"}', '["follow"]'):
            await socket.send_to(text_data=bad)
        await socket.send_to(text_data='{"type": "ping"}')
        frame, _ = await frames_until(socket, lambda f: '"pong"' in f, 5)
        assert frame == '{"type": "pong"}'  # still alive
        await sync_to_async(enqueue)()
        frame, _ = await frames_until(socket, lambda f: bool(touched(f)), 1.0)
        assert frame is None, "nothing is followed"
        await socket.disconnect()

    run(scenario())
