"""Browser tests: Playwright drives Debian's chromium against a real daphne and a real worker.

The test process owns the test database (``transactional_db``); daphne and
``chokaq_worker`` run as subprocesses on that same database (SQLite file or
PostgreSQL test database). Playwright's sync API is used from plain test
functions (it cannot run inside an asyncio loop).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from tests.conftest import database_url
from tests.deck.conftest import PASSWORD, make_user

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "docs" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
OVERRIDES = {"WORKER": {"POLLING_INTERVAL": 0.2, "CONCURRENCY": 4, "MAX_CONCURRENCY": 4},
             "RETRY": {"BASE_DELAY": 0.5, "JITTER_MAX_DELAY": 0.1}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Deck:
    url: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    web_command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def output(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.logs if p.exists())

    def kill_web(self) -> None:
        """An outage: daphne dies at once (SIGKILL), its websockets drop without a close frame."""
        self.processes[0].kill()
        self.processes[0].wait()

    def start_web(self) -> None:
        """daphne again, on the same port; returns once it answers HTTP."""
        self.processes[0] = _start(self.web_command, self.env, self.logs[0])
        wait_answering(self)


def wait_answering(deck: Deck, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{deck.url}/deck/login/", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline or deck.processes[0].poll() is not None:
            raise RuntimeError(f"daphne did not start\n{deck.output()}")
        time.sleep(0.05)


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed browser test reports what the page could not show: the Hot rows and queue states in the database,
    and the tails of daphne's and the worker's logs (a live-update failure is otherwise a bare timeout)."""
    report = yield
    deck = getattr(item, "funcargs", {}).get("deck_server")
    if report.when == "call" and report.failed and isinstance(deck, Deck):
        from chokaq_core.models import JobsHot, Queues

        try:
            hot: list[Any] = list(JobsHot.objects.values_list("id", "queue", "status", "worker_id")[:20])
            queues: list[Any] = list(Queues.objects.values_list("name", "is_paused", "is_active"))
        except Exception as exc:  # the report must not hide the failure it explains
            hot, queues = [], [f"could not read the database: {exc}"]
        report.sections.append(("deck server", f"Hot rows: {hot}\nqueues: {queues}\n{deck.output()}"))
    return report


@pytest.fixture
def deck_server(transactional_db: None, tmp_path: Path) -> Iterator[Deck]:
    """daphne (``deck.serve``: config.asgi with tests.settings) + one chokaq_worker, on the test database."""
    call_command("chokaq_roles", verbosity=0)
    for role in ("viewer", "operator", "admin"):
        make_user(role)
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings",
           "PYTHONUNBUFFERED": "1", "CHOKAQ_TEST_OVERRIDES": json.dumps(OVERRIDES),
           "CHOKAQ_DECK_TICK": "0.2", "CHOKAQ_DECK_READ_INTERVAL": "0.2",
           "CHOKAQ_DECK_POLL_INTERVAL": "0.5"}
    env.pop("REDIS_URL", None)
    deck = Deck(f"http://127.0.0.1:{port}", env=env,
                web_command=[sys.executable, "-m", "deck.serve", "-b", "127.0.0.1", "-p", str(port),
                             "config.asgi:application"])
    try:
        deck.logs.append(tmp_path / "daphne.log")
        deck.processes.append(_start(deck.web_command, env, deck.logs[-1]))
        deck.logs.append(tmp_path / "worker.log")
        deck.processes.append(_start([sys.executable, "manage.py", "chokaq_worker", "--queues", "browser"], env,
                                     deck.logs[-1]))
        wait_answering(deck)
        yield deck
    finally:
        for proc in deck.processes:
            _stop(proc)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One chromium per module. Playwright's sync API keeps an event loop running in this thread, which
    Django's async-safety check would take for an async context: the database calls of these tests are
    plain synchronous ones, so the check is switched off while the browser is up (and only then)."""
    from playwright.sync_api import sync_playwright

    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            instance = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield instance
            instance.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


class PageErrors(list[str]):
    """JavaScript errors and failed requests seen by a page (favicon and expected refusals aside)."""


@pytest.fixture
def page_for(browser: Any, deck_server: Deck) -> Iterator[Any]:
    contexts: list[Any] = []

    def open_as(role: str, theme: str | None = None, phone: bool = False,
                size: tuple[int, int] = (1600, 1000)) -> Any:
        context = (browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True,
                                       device_scale_factor=2) if phone
                   else browser.new_context(viewport={"width": size[0], "height": size[1]}))
        if theme:
            context.add_init_script(f"localStorage.setItem('deck-theme', '{theme}')")
        contexts.append(context)
        page = context.new_page()
        page.errors = PageErrors()
        page.on("pageerror", lambda exc: page.errors.append(f"pageerror: {exc}"))
        page.on("console", lambda msg: page.errors.append(f"console: {msg.text}") if msg.type == "error" else None)
        page.goto(f"{deck_server.url}/deck/")
        page.fill("input[name=username]", f"{role}-user")
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_selector("#conn[data-state=online]", timeout=15_000)
        return page

    yield open_as
    for context in contexts:
        context.close()


def shot_dir() -> Path:
    """Where screenshots go: docs/screenshots/ when CHOKAQ_UPDATE_SCREENSHOTS=1 (to refresh the README's
    images), else var/screenshots/ so an ordinary test run leaves the repository clean."""
    target = SCREENSHOTS if os.environ.get("CHOKAQ_UPDATE_SCREENSHOTS") == "1" else ROOT / "var" / "screenshots"
    target.mkdir(parents=True, exist_ok=True)
    return target


def shot(page: Any, name: str, full_page: bool = False) -> None:
    """Screenshot a view (see ``shot_dir``)."""
    page.screenshot(path=str(shot_dir() / f"{name}.png"), full_page=full_page)


def panel_shot(page: Any, selector: str, name: str) -> None:
    """Screenshot one element of the page (see ``shot_dir``)."""
    page.locator(selector).screenshot(path=str(shot_dir() / f"{name}.png"))
