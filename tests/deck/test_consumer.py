"""The live side: events committed by storage reach connected sockets as HTML fragments.

``live_settings`` puts the broadcaster's poll a minute away, so within these tests a fragment can only
come from the event path (in-process listener → broadcaster → one storage read → fragments).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.db import transaction
from django.db.backends.utils import CursorWrapper
from django.test import Client

from chokaq_core import events, service, storage
from chokaq_core.domain import Success
from deck import consumers
from deck.consumers import DeckConsumer
from tests.deck.conftest import close_thread_connections, frames_until, make_user, new_job, run

pytestmark = [pytest.mark.django_db(transaction=True)]


class Rollback(Exception):
    pass


def socket_for(user: User | None) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(DeckConsumer.as_asgi(), "/ws/deck/")
    communicator.scope["user"] = user
    return communicator


@pytest.fixture
def admin(roles: None) -> User:
    user = make_user("admin")
    assert user is not None
    return user


@pytest.fixture
def viewer(roles: None) -> User:
    user = make_user("viewer")
    assert user is not None
    return user


def enqueue(queue: str = "live", **fields: Any) -> str:
    try:
        return storage.enqueue([new_job(queue, **fields)])[0]
    finally:
        close_thread_connections()


def enqueue_and_roll_back(queue: str = "live") -> str:
    job = new_job(queue)
    try:
        with transaction.atomic():
            storage.enqueue([job])
            raise Rollback
    except Rollback:
        pass
    finally:
        close_thread_connections()
    return job.id


async def connected(user: User, first: bool = True) -> WebsocketCommunicator:
    """A connected socket; the first tab of a process also gets the broadcaster's first read (stats, chart,
    queues); later tabs join a running broadcaster and only get changes."""
    socket = socket_for(user)
    ok, _ = await socket.connect(timeout=5)
    assert ok
    if first:
        frame = await socket.receive_from(timeout=5)
        assert 'id="stats-bar"' in frame and 'hx-swap-oob="true"' in frame
    return socket


def test_committed_enqueue_reaches_the_socket_as_a_row_fragment(live_settings: Any, admin: User) -> None:
    async def scenario() -> None:
        socket = await connected(admin)
        job_id = await sync_to_async(enqueue)()
        frame, _ = await frames_until(socket, lambda f: job_id in f, timeout=5)
        assert frame is not None, "the committed job never reached the socket"
        assert '<div id="row-inbox" hx-swap-oob="innerHTML">' in frame
        row = re.search(rf'<tr id="job-{job_id}"[^>]*>', frame)
        assert row and 'data-status="0"' in row.group(0)
        assert f'/deck/api/jobs/{job_id}/cancel' in frame  # operator controls for an admin
        await socket.disconnect()

    run(scenario())


def test_a_job_enqueued_before_the_first_tab_connected_reaches_it(live_settings: Any, admin: User) -> None:
    """The page was rendered before the job came; the broadcaster's first read already holds it: that read sends
    every Active row (it used to be a silent baseline, so the row never showed until the job changed)."""
    async def scenario() -> None:
        job_id = await sync_to_async(enqueue)()
        socket = socket_for(admin)
        ok, _ = await socket.connect(timeout=5)
        assert ok
        frame, _ = await frames_until(socket, lambda f: job_id in f, timeout=5)
        assert frame is not None, "the first read kept the job to itself"
        await socket.disconnect()

    run(scenario())


def test_a_tab_that_joins_gets_the_rows_pushed_before_it_joined(live_settings: Any, admin: User) -> None:
    """A second tab's page was rendered before a job the first tab has already been sent: the read after it joins
    sends it every Active row and fragment."""
    async def scenario() -> None:
        first = await connected(admin)
        job_id = await sync_to_async(enqueue)()
        frame, _ = await frames_until(first, lambda f: job_id in f, timeout=5)
        assert frame is not None
        second = await connected(admin, first=False)
        frame, _ = await frames_until(second, lambda f: job_id in f and 'id="stats-bar"' in f, timeout=5)
        assert frame is not None, "the joining tab never got the row (or the stats) its page missed"
        await first.disconnect()
        await second.disconnect()

    run(scenario())


def test_nothing_is_sent_for_a_rolled_back_transaction(live_settings: Any, admin: User) -> None:
    async def scenario() -> None:
        socket = await connected(admin)
        ghost = await sync_to_async(enqueue_and_roll_back)()
        frame, seen = await frames_until(socket, lambda f: ghost in f, timeout=1.5)
        assert frame is None and not any(ghost in f for f in seen)
        # the socket is alive: a committed job right after does arrive
        job_id = await sync_to_async(enqueue)()
        frame, _ = await frames_until(socket, lambda f: job_id in f, timeout=5)
        assert frame is not None and ghost not in frame
        await socket.disconnect()

    run(scenario())
    assert service.find_job(consumers.__name__) is None  # nothing stored under odd ids either


def run_to_success(job_id: str) -> None:
    try:
        claimed = storage.fetch_batch("w-live", 10, ["live"])
        assert [j.id for j in claimed] == [job_id]
        storage.mark_processing(claimed[0], "w-live")
        events.dispatch([events.Event(events.EventKind.JOB_PROGRESS, {"jobId": job_id, "percentage": 40})])
    finally:
        close_thread_connections()


def finish(job_id: str) -> None:
    try:
        storage.complete("w-live", [Success(job_id, 3.0)], [], [])
    finally:
        close_thread_connections()


def test_a_job_is_followed_pending_processing_progress_succeeded(live_settings: Any, admin: User) -> None:
    async def scenario() -> None:
        socket = await connected(admin)
        job_id = await sync_to_async(enqueue)()
        assert (await frames_until(socket, lambda f: f'id="job-{job_id}"' in f, 5))[0]
        await sync_to_async(run_to_success)(job_id)
        frame, _ = await frames_until(socket, lambda f: f'data-progress-for="{job_id}" data-pct="40"' in f, 5)
        assert frame is not None
        processing = re.search(rf'<tr id="job-{job_id}"[^>]*data-status="2"', "".join(_))
        assert processing, "the Processing state was pushed"
        await sync_to_async(finish)(job_id)
        frame, _ = await frames_until(socket, lambda f: "data-gone" in f and job_id in f, 5)
        assert frame is not None and "SUCCEEDED" in frame
        await socket.disconnect()

    run(scenario())


def test_many_tabs_share_one_read_per_tick(live_settings: Any, admin: User, viewer: User,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    real = service.live_view

    def counting(**kwargs: Any) -> Any:
        reads.append(1)
        return real(**kwargs)

    monkeypatch.setattr(consumers.service, "live_view", counting)

    async def scenario() -> None:
        sockets = [await connected(admin)] + [await connected(admin, first=False) for _ in range(2)]
        sockets += [await connected(viewer, first=False) for _ in range(2)]
        before = len(reads)
        job_id = await sync_to_async(enqueue)()
        frames = [await frames_until(s, lambda f: job_id in f, 5) for s in sockets]
        assert all(frame for frame, _ in frames)
        assert 1 <= len(reads) - before <= 2  # one read per tick, whatever the number of tabs
        viewer_frame = frames[-1][0]
        assert viewer_frame is not None and "/deck/api/" not in viewer_frame  # viewers get no controls
        assert "/deck/api/" in (frames[0][0] or "")
        for s in sockets:
            await s.disconnect()

    run(scenario())


def test_a_burst_of_jobs_is_coalesced_into_few_frames(live_settings: Any, admin: User) -> None:
    live_settings.CHOKAQ_DECK = {"TICK": 0.25, "READ_INTERVAL": 0.25, "POLL_INTERVAL": 60}

    def burst() -> list[str]:
        try:
            ids = []
            for _ in range(20):  # 20 commits, 500 jobs
                ids += storage.enqueue([new_job("burst") for _ in range(25)])
            return ids
        finally:
            close_thread_connections()

    async def scenario() -> None:
        socket = await connected(admin)
        start = time.monotonic()
        ids = await sync_to_async(burst)()
        last, seen = await frames_until(socket, lambda f: ids[-1] in f, timeout=10)
        elapsed = time.monotonic() - start
        assert last is not None, "the burst's last job never reached the tab"
        # A rate property (one read per READ_INTERVAL, each the newest ACTIVE_LIMIT rows at most): the bound grows
        # with the measured time, so a slow machine cannot fail it; a frame per commit (20) or per job would.
        assert 1 <= len(seen) <= elapsed / 0.25 + 2, (len(seen), elapsed)
        rows = set(re.findall(r'<tr id="job-([0-9A-Z]+)"', "".join(seen)))
        assert len(rows) <= service.ACTIVE_LIMIT * len(seen)
        await socket.disconnect()

    run(scenario())


def test_queue_state_change_pushes_the_queues_panel(live_settings: Any, admin: User) -> None:
    async def scenario() -> None:
        socket = await connected(admin)
        await sync_to_async(_pause)("paused-q")
        frame, _ = await frames_until(socket, lambda f: 'id="queues-panel"' in f and "paused-q" in f, 5)
        assert frame is not None and "PAUSED" in frame
        await socket.disconnect()

    run(scenario())


def _pause(queue: str) -> None:
    try:
        enqueue(queue)
        service.set_queue_paused(queue, True)
    finally:
        close_thread_connections()


def test_the_socket_accepts_no_commands(live_settings: Any, admin: User) -> None:
    async def scenario() -> None:
        socket = await connected(admin)
        await socket.send_to(text_data='{"type": "cancel", "ids": ["x"]}')
        await socket.send_to(text_data="not json")
        await socket.send_to(text_data='{"type": "ping"}')
        frame, _ = await frames_until(socket, lambda f: '"pong"' in f, 5)
        assert frame == '{"type": "pong"}'
        await socket.disconnect()

    run(scenario())


class StatementLog:
    """Every SQL statement the Deck's reader thread runs: storage's (driver cursor) and the ORM's."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.statements: list[tuple[float, str]] = []
        log = self

        class Counting:
            def __init__(self, inner: Any) -> None:
                self.inner = inner

            def execute(self, sql: Any, *args: Any) -> Any:
                log.record(sql)
                return self.inner.execute(sql, *args)

            def __getattr__(self, name: str) -> Any:
                return getattr(self.inner, name)

        real_cursor = storage._cursor

        @contextlib.contextmanager
        def counting_cursor(using: str, prepared: bool = False) -> Any:
            with real_cursor(using, prepared) as cursor:
                yield Counting(cursor)

        monkeypatch.setattr(storage, "_cursor", counting_cursor)
        real_execute = CursorWrapper.execute

        def orm_execute(wrapper: Any, sql: Any, params: Any = None) -> Any:
            log.record(sql)
            return real_execute(wrapper, sql, params)

        monkeypatch.setattr(CursorWrapper, "execute", orm_execute)

    def record(self, sql: Any) -> None:
        if threading.current_thread().name.startswith("chokaq-deck"):
            self.statements.append((time.monotonic(), str(sql)))


def test_an_event_storm_costs_one_statement_per_read_interval(settings: Any, admin: User,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The push budget: whatever the number of events and tabs, the web process reads storage in ONE statement
    at most once per READ_INTERVAL (here 0.5 s; the poll is a minute away)."""
    settings.CHOKAQ_DECK = {"TICK": 0.05, "READ_INTERVAL": 0.5, "POLL_INTERVAL": 60}
    log = StatementLog(monkeypatch)

    def storm() -> list[str]:
        ids = []
        try:
            for _ in range(30):  # 30 commits over ~3 s, each with its own events
                ids += storage.enqueue([new_job("storm") for _ in range(5)])
                time.sleep(0.1)
        finally:
            close_thread_connections()
        return ids

    async def scenario() -> None:
        sockets = [await connected(admin)] + [await connected(admin, first=False) for _ in range(4)]
        start = time.monotonic()
        ids = await sync_to_async(storm)()
        frame, _ = await frames_until(sockets[0], lambda f: ids[-1] in f, 3)
        assert frame is not None, "the last job reached the tab"
        window = [sql for at, sql in log.statements if at >= start]
        elapsed = time.monotonic() - start
        # A rate property (reads per READ_INTERVAL): the bound grows with the measured time, so slowness can't fail it.
        assert 2 <= len(window) <= elapsed / 0.5 + 2, (len(window), elapsed, window[:3])
        assert all("chokaq_jobs_hot" in sql for sql in window), "each read is the one snapshot statement"
        for s in sockets:
            await s.disconnect()

    run(scenario())


def test_an_operator_command_reaches_the_console_through_its_event(live_settings: Any, admin: User,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit log is read only after an OperatorAction event, and its line reaches every tab."""
    log = StatementLog(monkeypatch)

    def pause_from_the_deck() -> None:
        client = Client()
        client.force_login(admin)
        try:
            response = client.post("/deck/api/queues/console-q/pause", {"value": "true"}, HTTP_HX_REQUEST="true")
            assert response.status_code in (200, 204), response.content
        finally:
            close_thread_connections()

    async def scenario() -> None:
        socket = await connected(admin)
        await sync_to_async(enqueue)("console-q")
        await frames_until(socket, lambda f: False, 0.5)
        assert not [sql for _, sql in log.statements if "deck_operatoraction" in sql.lower()
                    and "ORDER BY" in sql and '"id" >' in sql], "no audit-log read without a command"
        await sync_to_async(pause_from_the_deck)()
        frame, _ = await frames_until(socket, lambda f: "console-inbox" in f and "console-q" in f, 5)
        assert frame is not None, "the console line was pushed"
        await socket.disconnect()

    run(scenario())
