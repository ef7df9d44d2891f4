"""Fixtures of the Deck tests: users per role, jobs in every pillar, websocket helpers.

Jobs are put in place through ``chokaq_core.storage`` exactly as a worker would
move them (enqueue → fetch → lease → complete); the Deck is then driven
through the test client or a ``WebsocketCommunicator``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.db import connections
from django.test import Client

from chokaq_core import storage
from chokaq_core.domain import Failure, FailureReason, NewJob, Success, new_ulid

ROLES = ("anonymous", "viewer", "operator", "admin")
GROUP_OF = {"viewer": "Deck viewers", "operator": "Deck operators", "admin": "Deck admins"}
PASSWORD = "deck-test-pw"


def new_job(queue: str = "main", *, type: str = "test.ok.v1", payload: dict[str, Any] | None = None,
            tags: str | None = None, priority: int = 10, delay: float | None = None,
            created_by: str | None = None) -> NewJob:
    return NewJob(id=new_ulid(), queue=queue, type=type, payload=json.dumps(payload or {"n": 1}), tags=tags,
                  priority=priority, delay_seconds=delay, created_by=created_by)


def pending(queue: str = "main", n: int = 1, **fields: Any) -> list[str]:
    return storage.enqueue([new_job(queue, **fields) for _ in range(n)])


def _processing(queue: str, n: int, worker: str, **fields: Any) -> list[str]:
    ids = pending(queue, n, **fields)
    claimed = storage.fetch_batch(worker, n, [queue])
    assert sorted(j.id for j in claimed) == sorted(ids), "the queue had other due Pending rows"
    for job in claimed:
        assert storage.mark_processing(job, worker) == 1
    return ids


def processing(queue: str = "busy", n: int = 1, **fields: Any) -> list[str]:
    return _processing(queue, n, "w-deck", **fields)


def archived(queue: str = "done", n: int = 1, *, duration_ms: float = 12.0, **fields: Any) -> list[str]:
    ids = _processing(queue, n, "w-arc", **fields)
    storage.complete("w-arc", [Success(i, duration_ms) for i in ids], [], [])
    return ids


def dead(queue: str = "failing", n: int = 1, *, reason: FailureReason = FailureReason.FATAL_ERROR,
         details: str = "ValueError: boom", **fields: Any) -> list[str]:
    ids = _processing(queue, n, "w-dlq", **fields)
    storage.complete("w-dlq", [], [], [Failure(i, reason, details) for i in ids])
    return ids


def exhausted(queue: str, message: str, n: int = 1, kind: type[BaseException] = ConnectionError,
              **fields: Any) -> list[str]:
    """``n`` jobs moved to the DLQ after their last retry, by an exception whose traceback is long."""
    from tests.storage.rows import raised

    error = raised(message, kind)
    ids = _processing(queue, n, "w-err", **fields)
    storage.complete("w-err", [], [], [Failure(i, FailureReason.MAX_RETRIES_EXCEEDED, error.traceback, 3, error)
                                       for i in ids])
    return ids


@dataclass
class Jobs:
    pending: str
    processing: str
    archived: str
    dead: str


@pytest.fixture
def jobs() -> Jobs:
    """One job in each place the Deck shows."""
    return Jobs(pending("main")[0], processing("busy")[0], archived("done")[0], dead("failing")[0])


@pytest.fixture
def roles(db: None) -> None:
    call_command("chokaq_roles", verbosity=0)


def make_user(role: str) -> User | None:
    if role == "anonymous":
        return None
    user = User.objects.filter(username=f"{role}-user").first() or User.objects.create_user(
        f"{role}-user", password=PASSWORD)
    if role == "nobody":
        return user
    user.groups.add(Group.objects.get(name=GROUP_OF[role]))
    return user


@pytest.fixture
def client_as(roles: None) -> Callable[[str], Client]:
    """``client_as("operator")``: a test client logged in with that Deck role (or anonymous)."""

    def build(role: str) -> Client:
        client = Client()
        user = make_user(role)
        if user is not None:
            client.force_login(user)
        return client

    return build


HTMX = {"HTTP_HX_REQUEST": "true"}


def page_refused(response: Any, status: int = 400, text: str = "") -> str:
    """A refused page address: the Deck's page (HTML, never a JSON body) with the reason shown in words."""
    import html
    import re

    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("text/html"), response["Content-Type"]
    body = response.content.decode()
    assert 'id="deck-header"' in body, "the full page"
    shown = re.search(r'<p class="page-error" id="page-error" role="alert">(.*?)</p>', body, re.S)
    assert shown is not None, "no message on the page"
    message = html.unescape(re.sub(r"<[^>]+>", "", shown.group(1)))
    assert text.lower() in message.lower(), message
    return message


# ---------------------------------------------------------------- websocket helpers


def run(coro: Any) -> Any:
    """Run a coroutine in a fresh loop (the suite has no async test plugin)."""
    return asyncio.run(coro)


async def frames_until(communicator: Any, predicate: Callable[[str], bool], timeout: float) -> tuple[str | None,
                                                                                                       list[str]]:
    """Receive frames until one satisfies ``predicate``; (that frame or None, every frame seen).

    Polls the output queue instead of ``receive_from(timeout=...)``, whose timeout cancels the application.
    """
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if communicator.output_queue.empty():
            if communicator.future.done():
                communicator.future.result()  # surface the consumer's exception
                break
            await asyncio.sleep(0.02)
            continue
        message = await communicator.receive_output(timeout=1)
        if message.get("type") != "websocket.send":
            raise AssertionError(f"unexpected message {message}")
        frame = message.get("text") or ""
        seen.append(frame)
        if predicate(frame):
            return frame, seen
    return None, seen


@pytest.fixture
def live_settings(settings: Any) -> Iterator[Any]:
    """A fast broadcaster that only reads on events (the poll interval is far away), so a fragment that
    arrives proves the event path."""
    settings.CHOKAQ_DECK = {"TICK": 0.05, "READ_INTERVAL": 0.05, "POLL_INTERVAL": 60}
    yield settings


def close_thread_connections() -> None:
    connections.close_all()
