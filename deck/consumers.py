"""The Deck's live side: a push-only websocket consumer and one broadcaster per web process.

How the Deck stays live (ARCHITECTURE §4 "push cheaply"):

* Every open tab's ``DeckConsumer`` attaches to the process's ``Broadcaster``
  (one per event loop, i.e. per daphne process). Consumers do no database
  work of their own and accept no commands (``{"type": "ping"}`` → pong).
* The broadcaster wakes on engine events and at least every
  ``CHOKAQ_DECK["POLL_INTERVAL"]`` (1 s), and reads storage at most once per
  ``CHOKAQ_DECK["READ_INTERVAL"]`` (1 s) in ONE statement for all tabs
  (``service.live_view`` → ``storage.deck_snapshot``: the O(1) stats, the newest
  100 Hot rows, where the previously shown rows went; per poll also throughput,
  queues and the worker registry; top errors when the DLQ changed). It diffs
  against the previous read and renders the changes through ``deck.fragments``
  (one render per role, not per tab). Progress events carry their data and go
  out at most once per ``CHOKAQ_DECK["TICK"]`` (250 ms) without a read; the
  console reads the audit log only after an ``OperatorAction`` event. So a web
  process costs about one statement per second whatever the load (the push budget).
* Events reach the broadcaster two ways. With a cross-process channel layer
  (``REDIS_URL``) the broadcaster joins the group ``chokaq.deck`` on behalf of
  all its tabs and receives the ``deck.events`` messages that every process's
  ``CoalescingPublisher`` sends (workers on any host included). Without one
  (the README's run command: SQLite and the in-memory layer) it registers an
  in-process listener (``events.add_listener``; the hand-off into the loop is
  ``loop.call_soon_threadsafe``) for commands and in-process work, and the
  once-a-second poll shows what separate worker processes did.
* The open inspector follows its job: the tab sends ``{"type": "follow", "jobId": …}`` (the socket's only
  message besides ping; a subscription, not a command). Each read also locates the followed jobs in the same
  statement, and a frame names (``data-touched``) a followed job that an event mentioned or whose place or
  status changed since the last read; ``deck.js`` then re-fetches that inspector (at most 4 times a second).
  Without a cross-process layer this is how a worker's moves of an old job still reach its inspector.
* Events are hints, the database is the truth: a row reaches the page only
  as rendered from storage, and nothing is pushed for a rolled-back
  transaction (storage publishes after commit only). After a reconnect the
  page re-fetches its panels over HTTP (deck.js).

A socket lives only as long as the right to see (spec 04 §8):

* Logging out (``user_logged_out``, e.g. ``POST /deck/logout/``) closes every socket of that session at once
  with 4401: directly in this process, and through the channel-layer group ``chokaq.deck.sessions`` in every
  other web process (the message carries a digest of the session key, never the key).
* At least every ``CHOKAQ_DECK["REAUTH_INTERVAL"]`` (30 s) the broadcaster re-checks every socket in a
  thread: the session still exists and still authenticates its user (a password change or flush ends it),
  the user is still active, and the read permission still holds. Gone → close 4401; no read permission any
  more → close 4403; a role that changed (viewer ↔ operator) takes effect on the next frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from asgiref.sync import async_to_sync
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings
from django.contrib import auth
from django.db import close_old_connections, connections
from django.http import HttpRequest

from chokaq_core import events, service
from chokaq_core.domain import JobStatus
from chokaq_core.readmodel import JobRow
from deck import conf, fragments
from deck.models import OperatorAction, console_actions
from deck.permissions import Role, anonymous_allowed, role_of

logger = logging.getLogger("chokaq.deck")

ACTIVE_ROWS = 100
TOP_ERRORS_MIN_INTERVAL = 2.0
CONSOLE_FAILURE_LINES = 5
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
SESSIONS_GROUP = "chokaq.deck.sessions"  # channel-layer group: "this session ended" to every web process
SESSION_ENDED = "deck.session.ended"

def deck_setting(name: str) -> float:
    return float(conf.setting(name))


def _job_ids(message: dict[str, Any]) -> list[str]:
    """The job ids an event message names (``jobId``, or a purge's ``jobIds``)."""
    data = message.get("data")
    if not isinstance(data, dict):
        return []
    many = data.get("jobIds")
    ids: list[Any] = many if isinstance(many, list) else [data.get("jobId")]
    return [i for i in ids if isinstance(i, str) and i]


def session_digest(session_key: str | None) -> str | None:
    """What identifies a session on the wire (logout messages): never the session key itself."""
    return hashlib.sha256(session_key.encode()).hexdigest() if session_key else None


class DeckConsumer(AsyncWebsocketConsumer):
    """Push-only: refuses anonymous users (4401) and users without the view permission (4403)."""

    role: Role = Role.NONE
    broadcaster: Broadcaster | None = None
    session: str | None = None  # session_digest() of the session that opened the socket
    user_pk: Any = None
    session_key: str | None = None
    following: str | None = None  # the job id of this tab's open inspector (``{"type": "follow"}``)
    closing = False
    # No channel of its own: the broadcaster receives ``chokaq.deck`` once for all tabs and calls ``push``.
    # With the default alias every tab would also block on its own channel-layer receive (50 tabs = 50
    # Redis readers), and a Redis read timeout under load closed the tab with 1011 (seen in the websocket load test).
    channel_layer_alias = None  # type: ignore[assignment]

    async def connect(self) -> None:
        user = self.scope.get("user")
        if (user is None or not user.is_authenticated) and not anonymous_allowed():
            await self.accept()
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.role = await asyncio.to_thread(_role_of_user, user)
        if self.role < Role.VIEWER:
            await self.accept()
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.session_key = getattr(self.scope.get("session"), "session_key", None)
        self.session = session_digest(self.session_key)
        self.user_pk = getattr(user, "pk", None)
        await self.accept()
        self.broadcaster = Broadcaster.for_running_loop()
        self.broadcaster.attach(self)

    async def disconnect(self, code: int) -> None:
        if self.broadcaster is not None:
            await self.broadcaster.detach(self)
            self.broadcaster = None

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            message = json.loads(text_data or "{}")
        except (ValueError, RecursionError):  # e.g. 200k "[": too deep for the parser, ignored like bad JSON
            return
        if not isinstance(message, dict):
            return
        if message.get("type") == "ping":
            await self.send(text_data=json.dumps({"type": "pong"}))
        elif message.get("type") == "follow":
            self.follow(message.get("jobId"))

    def follow(self, job_id: Any) -> None:
        """The job this tab's inspector shows (None: no inspector): the broadcaster also locates it on every read,
        so its moves are announced even when no event reaches this process (no cross-process channel layer)
        and it is not among the Active rows. A subscription, not a command: it changes nothing but what is
        read. Anything but a job id (``service.check_job_id``) is ignored."""
        try:
            self.following = service.check_job_id(job_id) if isinstance(job_id, str) else None
        except service.ServiceError:
            self.following = None

    async def push(self, frame: str) -> None:
        if not self.closing:
            await self.send(text_data=frame)

    def revoke(self) -> bool:
        """The right to see ended: from now on nothing is pushed (False if that already happened)."""
        if self.closing:
            return False
        self.closing = True
        if self.broadcaster is not None:
            self.broadcaster.consumers.discard(self)
        return True

    async def end(self, code: int) -> None:
        """Revoke and close with ``code`` (4401 / 4403)."""
        self.revoke()
        with contextlib.suppress(Exception):
            await self.close(code=code)


def _role_of_user(user: Any) -> Role:
    try:
        return role_of(user)
    finally:
        close_old_connections()


class _SessionRequest(HttpRequest):
    """Just enough of a request for ``django.contrib.auth.get_user``: the socket's session, loaded afresh."""

    def __init__(self, session_key: str) -> None:
        from importlib import import_module

        super().__init__()
        self.session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)


Identity = tuple[str | None, Any]  # (session key, user pk) of a socket


def _reauthorize(identities: set[Identity]) -> dict[Identity, Role | int]:
    """For each socket identity: its current Role, or the close code (4401 / 4403) if it may no longer see.

    Runs in a thread. With a session: ``auth.get_user`` on the stored session (gone, expired, flushed by a
    password change, or an inactive user → anonymous). Without one (a project's own auth middleware): the
    user row by primary key."""
    verdicts: dict[Identity, Role | int] = {}
    try:
        for identity in identities:
            if anonymous_allowed():
                verdicts[identity] = Role.ADMIN
                continue
            session_key, user_pk = identity
            user: Any
            if session_key:
                user = auth.get_user(_SessionRequest(session_key))
                if getattr(user, "pk", None) != user_pk:
                    user = None
            else:
                user = auth.get_user_model()._default_manager.filter(pk=user_pk).first()
            if user is None or not user.is_authenticated or not user.is_active:
                verdicts[identity] = CLOSE_UNAUTHENTICATED
                continue
            role = role_of(user)
            verdicts[identity] = role if role >= Role.VIEWER else CLOSE_FORBIDDEN
    finally:
        connections.close_all()  # a pooled thread: keep no connection between checks
    return verdicts


def close_sockets_of_ended_session(sender: Any, request: HttpRequest | None = None, **kwargs: Any) -> None:
    """``user_logged_out`` receiver: the logged-out session's sockets close now, in every web process."""
    digest = session_digest(getattr(getattr(request, "session", None), "session_key", None))
    if digest is None:
        return
    for broadcaster in Broadcaster.running():
        broadcaster.end_session_threadsafe(digest)
    layer = get_channel_layer()
    if layer is None or isinstance(layer, InMemoryChannelLayer):
        return
    try:
        async_to_sync(layer.group_send)(SESSIONS_GROUP, {"type": SESSION_ENDED, "session": digest})
    except Exception:  # the periodic re-check (REAUTH_INTERVAL) still closes them
        logger.warning("could not announce a Deck logout on the channel layer", exc_info=True)



@dataclass
class _State:
    """What the last read saw, to push only differences."""

    rows: dict[str, JobRow] | None = None
    resend: bool = False  # the next read sends every Active row, changed or not (a tab joined)
    failed_total: int | None = None
    errors_failed_total: int | None = None  # failed_total when the top errors were last read
    throughput: service.Throughput | None = None
    errors_read_at: float = 0.0
    last_action_id: int | None = None
    followed: dict[str, JobStatus | None] = field(default_factory=dict)  # followed job → where the last read saw it
    sent: dict[tuple[str, bool], str] = field(default_factory=dict)  # (fragment, can_operate) → last html


@dataclass
class _Due:
    """What the next read must include, gathered from events and the clock until the read happens."""

    dirty: bool = False  # something but progress happened: stats and the Active table
    full: bool = False  # the poll: throughput chart, queues, Workers and Circuit breakers panels
    queues: bool = False  # a QueueStateChanged event
    actions: bool = False  # an OperatorAction event: the console reads the audit log
    progress: dict[str, int] = field(default_factory=dict)  # job id → percentage, pushed without a read
    touched: set[str] = field(default_factory=set)  # followed jobs an event named: their inspectors re-fetch
    bulk: dict[int, dict[str, Any]] = field(default_factory=dict)  # bulk run → its latest BulkProgress, no read


class Broadcaster:
    """One per event loop (web process): one storage statement per read for every tab, fragments pushed to all.

    Budget: reads happen at most once per ``READ_INTERVAL`` (1 s) however many events arrive and
    however many tabs are open, and at least once per ``POLL_INTERVAL`` (1 s); each read is ONE statement
    (``service.live_view`` → ``storage.deck_snapshot``). The console's audit-log read runs only after an
    operator command (an ``OperatorAction`` event). Progress events carry their data and are pushed at the
    ``TICK`` rate without touching the database.
    """

    _instances: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Broadcaster] = weakref.WeakKeyDictionary()

    @classmethod
    def for_running_loop(cls) -> Broadcaster:
        loop = asyncio.get_running_loop()
        instance = cls._instances.get(loop)
        if instance is None:
            instance = cls._instances[loop] = cls(loop)
        return instance

    @classmethod
    def running(cls) -> list[Broadcaster]:
        """Every event loop's broadcaster, from any thread (a loop may add one meanwhile: look again)."""
        while True:
            try:
                return list(cls._instances.values())
            except RuntimeError:  # the dictionary changed size during iteration
                continue

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.consumers: set[DeckConsumer] = set()
        self.tick = deck_setting("TICK")
        self.poll_interval = deck_setting("POLL_INTERVAL")
        self.read_interval = deck_setting("READ_INTERVAL")
        self.reauth_interval = deck_setting("REAUTH_INTERVAL")
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._closing: set[asyncio.Task[None]] = set()
        self._executor: ThreadPoolExecutor | None = None
        self._state = _State()
        self._joined = False  # a tab joined since the last read: the next one sends everything (``attach``)
        layer = get_channel_layer()
        self.cross_process = layer is not None and not isinstance(layer, InMemoryChannelLayer)
        self.layer = layer

    # ------------------------------------------------------------ consumers

    def attach(self, consumer: DeckConsumer) -> None:
        """A tab's socket joins. Its page was rendered before: what changed since (and was pushed to the other
        tabs before it joined) would stay missing there until it changed again — a Pending row of a paused queue,
        forever. So the next read sends every tab everything: all fragments and every Active row."""
        self.consumers.add(consumer)
        if not self._tasks:
            self._start()
        else:
            self._joined = True
            self._wake.set()

    async def detach(self, consumer: DeckConsumer) -> None:
        self.consumers.discard(consumer)
        if not self.consumers and self._tasks:
            await self._stop()

    def _start(self) -> None:
        self._state = _State()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chokaq-deck")
        if self.cross_process:
            self._tasks.append(self.loop.create_task(self._receive()))
        else:
            events.add_listener(self._on_event)
        self._tasks.append(self.loop.create_task(self._run()))
        self._tasks.append(self.loop.create_task(self._reauthorize_periodically()))

    async def _stop(self) -> None:
        events.remove_listener(self._on_event)
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        executor, self._executor = self._executor, None
        if executor is not None:
            # the reader thread's database connection must not outlive the last tab
            await self.loop.run_in_executor(executor, connections.close_all)
            executor.shutdown(wait=False)

    # ------------------------------------------------------------ the right to see

    def end_session_threadsafe(self, digest: str) -> None:
        """From any thread: close the sockets of the session with that digest (4401)."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._end_session, digest)

    def _end_session(self, digest: str) -> None:
        for consumer in [c for c in self.consumers if c.session == digest]:
            consumer.revoke()  # before any further frame goes out
            task = self.loop.create_task(consumer.end(CLOSE_UNAUTHENTICATED))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _reauthorize_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.reauth_interval)
            try:
                await self.reauthorize()
            except Exception:
                logger.exception("deck websocket re-authorization failed; retrying next interval")

    async def reauthorize(self) -> None:
        """Re-check every socket's session, user and read permission now; close or re-role accordingly."""
        sockets = list(self.consumers)
        if not sockets:
            return
        verdicts = await asyncio.to_thread(_reauthorize, {(c.session_key, c.user_pk) for c in sockets})
        for consumer in sockets:
            verdict = verdicts.get((consumer.session_key, consumer.user_pk), CLOSE_UNAUTHENTICATED)
            if isinstance(verdict, Role):
                consumer.role = verdict
            else:
                await consumer.end(verdict)

    # ------------------------------------------------------------ event intake

    def _on_event(self, event: events.Event) -> None:
        """In-process listener: called on the committing thread, hands off into the loop."""
        with self._lock:
            self._pending.append(event.as_message())
        if self.loop.is_closed():  # the process's loop ended without the last tab saying goodbye
            events.remove_listener(self._on_event)
            return
        self.loop.call_soon_threadsafe(self._wake.set)

    async def _receive(self) -> None:
        """Cross-process intake: the ``deck.events`` messages of every process's publisher."""
        assert self.layer is not None
        channel = await self.layer.new_channel()
        await self.layer.group_add(events.GROUP, channel)
        await self.layer.group_add(SESSIONS_GROUP, channel)
        try:
            while True:
                try:
                    message = await self.layer.receive(channel)
                except Exception:  # e.g. a Redis read timeout under load: keep listening, the poll covers the gap
                    logger.warning("deck channel-layer receive failed; retrying", exc_info=True)
                    await asyncio.sleep(0.5)
                    continue
                if message.get("type") == events.MESSAGE_TYPE:
                    with self._lock:
                        self._pending.extend(m for m in message.get("events", []) if isinstance(m, dict))
                    self._wake.set()
                elif message.get("type") == SESSION_ENDED and isinstance(message.get("session"), str):
                    self._end_session(message["session"])
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.layer.group_discard(events.GROUP, channel))
            with contextlib.suppress(Exception):
                await asyncio.shield(self.layer.group_discard(SESSIONS_GROUP, channel))

    def _take(self, due: _Due) -> None:
        """Fold the received messages into what the next read (or progress frame) must carry."""
        with self._lock:
            pending, self._pending = self._pending, []
        followed = {c.following for c in self.consumers if c.following}
        for m in pending:
            kind = m.get("event")
            if kind == events.EventKind.JOB_PROGRESS:
                data = m.get("data") or {}
                if data.get("jobId"):
                    due.progress[str(data["jobId"])] = int(data.get("percentage") or 0)
                continue
            if kind == events.EventKind.BULK_PROGRESS:
                data = m.get("data") or {}
                if isinstance(data.get("actionId"), int):
                    due.bulk[data["actionId"]] = data
                continue
            due.dirty = True
            due.touched.update(i for i in _job_ids(m) if i in followed)
            due.queues = due.queues or kind == events.EventKind.QUEUE_STATE_CHANGED
            due.actions = due.actions or kind == events.EventKind.OPERATOR_ACTION

    # ------------------------------------------------------------ the tick loop

    async def _run(self) -> None:
        due = _Due(dirty=True, full=True)  # the first read sends the first tab everything (``attach``)
        last_read = last_flush = -float("inf")
        next_poll = time.monotonic() + self.poll_interval
        while True:
            now = time.monotonic()
            deadline = max(last_read + self.read_interval, now) if due.dirty else next_poll
            if due.progress or due.bulk:
                deadline = min(deadline, max(last_flush + self.tick, now))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, deadline - now))
            self._wake.clear()
            self._take(due)
            if self._joined:  # forget what was sent: the next read sends it all again (``attach``)
                self._joined = False
                self._state.sent.clear()
                self._state.resend = True
                due.dirty = due.full = True
            now = time.monotonic()
            if now >= next_poll:
                due.dirty = due.full = True
                next_poll = now + self.poll_interval
            read = due.dirty and now - last_read >= self.read_interval
            if not read and not ((due.progress or due.bulk) and now - last_flush >= self.tick):
                continue
            variants = {c.role >= Role.OPERATOR for c in self.consumers}
            if not variants:  # the last tab is leaving: do not spin until detach() stops this task
                await asyncio.sleep(self.tick)
                continue
            taken, due = due, _Due(dirty=due.dirty and not read, full=due.full and not read,
                                   queues=due.queues and not read, actions=due.actions and not read,
                                   touched=set() if read else due.touched)
            if read:
                last_read = now
            try:
                assert self._executor is not None
                followed = sorted({c.following for c in self.consumers if c.following})
                frames = await self.loop.run_in_executor(self._executor, self._build, taken, read, variants, followed)
            except Exception:
                logger.exception("deck broadcaster tick failed")
                await self.loop.run_in_executor(self._executor, connections.close_all)  # type: ignore[arg-type]
                continue
            last_flush = time.monotonic()
            await self._send(frames)

    async def _send(self, frames: dict[bool, str]) -> None:
        for consumer in list(self.consumers):
            frame = frames.get(consumer.role >= Role.OPERATOR)
            if not frame:
                continue
            try:
                await consumer.push(frame)
            except Exception:
                logger.debug("deck push failed; the socket is going away", exc_info=True)

    # ------------------------------------------------------------ reading and rendering (reader thread)

    def _build(self, due: _Due, read: bool, variants: set[bool],
               followed: Sequence[str] = ()) -> dict[bool, str]:
        """One read (ONE storage statement) when ``read``, then one frame per role variant (``can_operate``).
        ``followed``: the jobs open inspectors show, located by the same statement."""
        parts: dict[bool, list[str]] = {v: [] for v in variants}
        runs = sorted(due.bulk.values(), key=lambda d: d["actionId"])
        if not read:
            for can_operate in variants:
                bulk = runs if can_operate else []
                if due.progress or bulk:
                    parts[can_operate].append(fragments.inbox([], due.progress, bulk=bulk))
            return {v: "".join(p) for v, p in parts.items() if p}
        state = self._state
        now = time.monotonic()
        errors_due = state.errors_read_at == 0 or (
            state.failed_total != state.errors_failed_total and now - state.errors_read_at >= TOP_ERRORS_MIN_INTERVAL)
        view = service.live_view(locate=[*(state.rows or ()), *followed],
                                 throughput=due.full or state.throughput is None,
                                 queues=due.full or due.queues, fleet=due.full, errors=errors_due, limit=ACTIVE_ROWS)
        summary = view.summary
        state.failed_total = summary.failed_total
        if view.errors is not None:
            state.errors_read_at = now
            state.errors_failed_total = summary.failed_total
        changed, gone = self._diff(view.active, view.located)
        touched = sorted(due.touched | self._moved(followed, view.located))
        state.throughput = view.throughput or state.throughput
        console = self._console(gone, due.actions)
        for can_operate in variants:
            role = Role.OPERATOR if can_operate else Role.VIEWER
            out = parts[can_operate]
            assert state.throughput is not None
            self._once(out, ("stats", can_operate), fragments.stats(summary, state.throughput, oob=True))
            if view.throughput is not None:
                out.append(fragments.chart(view.throughput, oob=True))
            if view.queues is not None:
                self._once(out, ("queues", can_operate), fragments.queues(view.queues, role, oob=True))
            if view.fleet is not None:
                self._once(out, ("workers", can_operate), fragments.workers(view.fleet, oob=True))
                self._once(out, ("breakers", can_operate), fragments.breakers(view.fleet, role, oob=True))
            if view.errors is not None:
                self._once(out, ("errors", can_operate), fragments.top_errors(view.errors, fragments.now(), oob=True))
            rendered = [fragments.row(r, role) for r in changed] + [fragments.row(r, role, gone=True) for r in gone]
            bulk = runs if can_operate else []  # progress of bulk runs: operator tabs only
            if rendered or due.progress or touched or bulk:
                out.append(fragments.inbox(rendered, due.progress, touched, bulk))
            if console:
                out.append(fragments.console(console))
        return {v: "".join(p) for v, p in parts.items() if p}

    def _once(self, out: list[str], key: tuple[str, bool], html: str) -> None:
        if self._state.sent.get(key) != html:
            self._state.sent[key] = html
            out.append(html)

    def _moved(self, followed: Sequence[str], located: dict[str, JobStatus]) -> set[str]:
        """Followed jobs (open inspectors) whose place or status changed since the last read, or that a tab
        started following since (its inspector may have been rendered before the change: it re-fetches once)."""
        previous = self._state.followed
        now = {job_id: located.get(job_id) for job_id in followed}
        self._state.followed = now
        return {job_id for job_id, where in now.items() if job_id not in previous or previous[job_id] != where}

    def _diff(self, rows: list[JobRow], located: dict[str, JobStatus]) -> tuple[list[JobRow], list[JobRow]]:
        """Rows new or changed since the last read, and rows that left Hot (with their new status: ``located``
        holds where the previous read's rows are now, from the same statement)."""
        state = self._state
        current = {r.id: r for r in rows}
        previous, state.rows = state.rows, current
        if previous is None:  # the first read: every row, as for a tab that joins (``attach``)
            return rows, []
        changed = rows if state.resend else [r for r in rows if previous.get(r.id) != r]
        state.resend = False
        missing = [i for i in previous if i not in current]
        gone = []
        for job_id in missing:
            status = located.get(job_id)
            if status is None or status >= JobStatus.SUCCEEDED:  # archived, in the DLQ, or purged
                gone.append(replace(previous[job_id], status=status or previous[job_id].status))
        return changed, gone

    def _console(self, gone: list[JobRow], actions: bool) -> list[dict[str, Any]]:
        """Console lines: operator commands since the last look (read only after an ``OperatorAction`` event)
        and jobs that moved to the DLQ."""
        state = self._state
        lines: list[dict[str, Any]] = []
        if state.last_action_id is None:
            last = OperatorAction.objects.order_by("-id").values_list("id", flat=True).first()
            state.last_action_id = last or 0
        elif actions:
            for entry in console_actions().filter(id__gt=state.last_action_id).order_by("id")[:50]:
                lines.append({"id": entry.id, "at": entry.at, "level": entry.level,
                              "message": f"{entry.actor}: {entry.message}"})
                state.last_action_id = entry.id
        failed = [r for r in gone if r.status in (JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.ZOMBIE)]
        for row in failed[:CONSOLE_FAILURE_LINES]:
            lines.append({"at": fragments.now(), "level": "error",
                          "message": f"Job {row.id} ({row.type}) moved to the DLQ: {row.status.name}"})
        if len(failed) > CONSOLE_FAILURE_LINES:
            lines.append({"at": fragments.now(), "level": "error",
                          "message": f"... and {len(failed) - CONSOLE_FAILURE_LINES} more job(s) moved to the DLQ"})
        return lines
