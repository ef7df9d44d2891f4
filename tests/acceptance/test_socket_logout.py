"""Acceptance: on a real daphne process, logging out closes the browser's live socket at once.

A viewer logs in through the Deck's login form over HTTP, opens ``/ws/deck/`` with a real websocket client
(the ``websockets`` library) carrying the session cookie and the page's ``Origin``, then posts the logout
form: the server closes the socket with 4401. The re-check interval is ten minutes away, so the close can
only come from the logout. With Redis the socket lives on a second daphne process: the logout reaches it
through the channel layer. A handshake from another port of the same host is refused.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import os
import re
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import websockets
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from websockets.asyncio.client import connect

from tests.acceptance.procs import Proc, free_port, reap, spawn, wait_for
from tests.conftest import database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

REDIS_URL = os.environ.get("CHOKAQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/9")
PASSWORD = "a-viewer-password-9281"


class Browser:
    """Cookies and CSRF as a browser keeps them, against one base URL."""

    def __init__(self) -> None:
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies),
                                                  NoRedirect())

    def cookie(self, name: str) -> str:
        return next(c.value for c in self.cookies if c.name == name and c.value is not None)

    def get(self, url: str) -> tuple[int, str]:
        return self._open(urllib.request.Request(url))

    def post(self, url: str, fields: dict[str, str]) -> tuple[int, str]:
        data = urllib.parse.urlencode({**fields, "csrfmiddlewaretoken": self.cookie("csrftoken")}).encode()
        origin = re.match(r"https?://[^/]+", url)
        assert origin
        return self._open(urllib.request.Request(url, data=data, headers={"Origin": origin.group(0)}))

    def _open(self, request: urllib.request.Request) -> tuple[int, str]:
        try:
            with self.opener.open(request, timeout=20) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def start_web(name: str, env: dict[str, str], tmp_path: Path) -> tuple[Proc, str]:
    port = free_port()
    proc = spawn(name, [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                        "config.asgi:application"], env, tmp_path)
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert proc.alive(), proc.output()
        try:
            return Browser().get(f"{base}/deck/login/")[0] == 200
        except OSError:
            return False

    wait_for(answers, 60, f"{name} to answer", [proc])
    return proc, base


@pytest.fixture
def viewer(transactional_db: None) -> User:
    call_command("chokaq_roles", verbosity=0)
    user = User.objects.create_user("live-viewer", password=PASSWORD)
    user.groups.add(Group.objects.get(name="Deck viewers"))
    return user


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in started:
        print(p.output())
    reap(started)


@pytest.mark.parametrize("layer", ["in-memory", "redis"])
def test_logout_closes_the_live_socket(viewer: User, procs: list[Proc], tmp_path: Path, layer: str) -> None:
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings",
           "CHOKAQ_DECK_REAUTH_INTERVAL": "600", "PYTHONUNBUFFERED": "1"}
    env.pop("DJANGO_DEBUG", None)
    if layer == "redis":
        env["REDIS_URL"] = REDIS_URL
    web, base = start_web("web", env, tmp_path)
    procs.append(web)
    socket_base = base
    if layer == "redis":  # the socket on another process than the one serving the logout
        other, socket_base = start_web("web-2", env, tmp_path)
        procs.append(other)

    browser = Browser()
    assert browser.get(f"{base}/deck/login/")[0] == 200
    status, body = browser.post(f"{base}/deck/login/", {"username": "live-viewer", "password": PASSWORD,
                                                        "next": "/deck/"})
    assert status == 302, body[:500]
    session = browser.cookie("sessionid")
    host = socket_base.removeprefix("http://")
    uri = f"ws://{host}/ws/deck/"

    async def scenario() -> int:
        port = int(host.rsplit(":", 1)[1])
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            async with connect(uri, origin=f"http://127.0.0.1:{port + 1}",
                               additional_headers={"Cookie": f"sessionid={session}"}, open_timeout=20):
                pass
        assert refused.value.response.status_code == 403
        async with connect(uri, origin=socket_base, additional_headers={"Cookie": f"sessionid={session}"},
                           open_timeout=20, max_size=None) as socket:
            first = await asyncio.wait_for(socket.recv(), 20)
            assert 'id="stats-bar"' in str(first)
            status, _ = await asyncio.to_thread(browser.post, f"{base}/deck/logout/", {})
            assert status == 302
            try:
                async with asyncio.timeout(20):
                    while True:  # frames may still arrive until the close
                        await socket.recv()
            except websockets.exceptions.ConnectionClosed as closed:
                assert closed.rcvd is not None, "the server closed the socket"
                return closed.rcvd.code
            except TimeoutError:
                pytest.fail("the socket stayed open after logout")
        raise AssertionError("unreachable")

    assert asyncio.run(scenario()) == 4401
    assert all(p.alive() for p in procs), "\n".join(p.output() for p in procs)
