"""Live across processes: a ``chokaq_worker`` in another process pushes through a real Redis.

The Deck side runs in this process with ``CHANNEL_LAYERS`` pointing at Redis
(``redis://127.0.0.1:6379/9``), so its broadcaster subscribes to ``chokaq.deck``
and registers no in-process listener; its poll is a minute away. The worker
is a separate ``manage.py chokaq_worker`` on the same test database with
``REDIS_URL`` set: every fragment about its job can only have come through Redis.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User

from chokaq_core import events, storage
from chokaq_core.domain import NewJob
from deck.consumers import Broadcaster, DeckConsumer
from tests.conftest import database_url
from tests.deck.conftest import close_thread_connections, frames_until, make_user, new_job, run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("CHOKAQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/9")


@pytest.fixture
def redis_layer(settings: Any) -> Iterator[None]:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": [REDIS_URL], "capacity": 5000, "expiry": 30}}}
    settings.CHOKAQ_DECK = {"TICK": 0.1, "READ_INTERVAL": 0.1, "POLL_INTERVAL": 60}
    events.reset_publisher()
    yield
    events.reset_publisher()


@pytest.fixture
def worker(redis_layer: None, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings",
           "REDIS_URL": REDIS_URL, "PYTHONUNBUFFERED": "1",
           "CHOKAQ_TEST_OVERRIDES": json.dumps({"WORKER": {"POLLING_INTERVAL": 0.2, "CONCURRENCY": 2,
                                                           "MAX_CONCURRENCY": 2},
                                                "EVENTS": {"COALESCE_INTERVAL": 0.05}})}
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "manage.py", "chokaq_worker", "--queues", "redis-live"], cwd=ROOT,
                                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        print(log.read_text(errors="replace")[-3000:])


def enqueue(job: NewJob) -> None:
    try:
        storage.enqueue([job])
    finally:
        close_thread_connections()


def test_worker_in_another_process_pushes_through_redis(roles: None, worker: subprocess.Popen[bytes]) -> None:
    user = make_user("viewer")
    assert isinstance(user, User)
    job = new_job("redis-live", type="test.sleep.v1", payload={"seconds": 1.5})

    async def scenario() -> None:
        socket = WebsocketCommunicator(DeckConsumer.as_asgi(), "/ws/deck/")
        socket.scope["user"] = user
        assert (await socket.connect(timeout=5))[0]
        broadcaster = Broadcaster.for_running_loop()
        assert broadcaster.cross_process, "the Redis layer must be in use"
        assert (await frames_until(socket, lambda f: 'id="stats-bar"' in f, 10))[0]
        await sync_to_async(enqueue, thread_sensitive=False)(job)  # committed; the worker picks it up
        running, seen = await frames_until(
            socket, lambda f: re.search(rf'<tr id="job-{job.id}"[^>]*data-status="2"', f) is not None, 45)
        assert running is not None, f"no Processing fragment; worker rc={worker.poll()}, frames={len(seen)}"
        done, _ = await frames_until(socket, lambda f: f'id="job-{job.id}"' in f and "data-gone" in f, 30)
        assert done is not None and "SUCCEEDED" in done
        await socket.disconnect()

    run(scenario())
    assert worker.poll() is None, "the worker must still be running"


def _circuit_status(key: str) -> int | None:
    """The status a live worker reports for the breaker of ``key`` in its registry row (None: not reported)."""
    for info in storage.list_workers():
        for item in json.loads(info.circuits_json or "[]"):
            if item.get("circuitKey") == key:
                return int(item["status"])
    return None


def test_an_operator_opens_and_resets_a_breaker_on_a_worker_in_another_process(
        client_as: Any, worker: subprocess.Popen[bytes]) -> None:
    """OPEN NOW and RESET travel over Redis to a real worker, which applies them and reports the new state."""
    import time

    operator = client_as("operator")
    key = "test.sleep.v1"
    for command, expected in (("open", 1), ("close", 0)):
        deadline, status = time.monotonic() + 30, None
        while status != expected:
            assert time.monotonic() < deadline, f"{command}: the worker reports {status}; rc={worker.poll()}"
            answer = operator.post(f"/deck/api/circuits/{command}", {"key": key})  # idempotent: resend until seen
            assert answer.status_code == 200, answer.content
            time.sleep(0.5)
            status = _circuit_status(key)
    assert worker.poll() is None, "the worker must still be running"
