"""The Deck in a real browser (Debian chromium via Playwright) against daphne and a real worker."""

from __future__ import annotations

import base64
import json
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

import chokaq_core
from chokaq_core import service
from chokaq_core.domain import FailureReason, JobStatus
from tests.browser.conftest import Deck, panel_shot, shot
from tests.deck.conftest import archived, dead

pytestmark = [pytest.mark.browser, pytest.mark.slow]

Open = Callable[..., Any]


def wait_status(page: Any, job_id: str, status: str, timeout: float = 20) -> None:
    page.wait_for_function(
        "([id, s]) => { const b = document.querySelector('#job-' + id + ' [data-role=status]');"
        " return b && b.textContent.trim() === s; }", arg=[job_id, status], timeout=timeout * 1000)


def wait_until(check: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


def real_errors(page: Any) -> list[str]:
    return [e for e in page.errors if "status of 403" not in e and "status of 409" not in e]


def seed_history() -> None:
    archived("emails", 6, duration_ms=85.0)
    archived("reports", 3, duration_ms=1450.0, type="demo.report.build.v1")
    dead("payments", 2, reason=FailureReason.TRANSIENT, details="ConnectionError: payment gateway timeout",
         type="demo.payment.capture.v1")
    dead("default", 3, reason=FailureReason.FATAL_ERROR, details="ValueError: width must be positive, got 0",
         type="demo.image.resize.v1")
    dead("default", 1, reason=FailureReason.CANCELLED, details="Cancelled by admin: ops")


def test_login_and_watch_a_job_go_pending_processing_succeeded_live(deck_server: Deck, page_for: Open) -> None:
    seed_history()
    service.set_queue_paused("browser", True)
    page = page_for("admin")
    page.evaluate("window.__noReload = true")
    chokaq_core.enqueue_many([{"type_key": "demo.email.send.v1", "payload": {"to": f"u{n}@x.y", "subject": "Hi"},
                               "queue": "browser-later"} for n in range(5)])
    job_id = chokaq_core.enqueue("demo.report.build.v1", {"report_id": 7, "pages": 12}, queue="browser",
                                 tags=["live"])
    wait_status(page, job_id, "PENDING")
    # resume the queue from the queues panel, as an operator would
    page.locator("#queues-panel tr[data-queue=browser] .switch").click()
    wait_status(page, job_id, "PROCESSING")
    page.wait_for_timeout(600)  # let the chart and counters take a tick
    shot(page, "deck-active")
    wait_status(page, job_id, "SUCCEEDED")
    assert page.evaluate("window.__noReload") is True, "the page was reloaded"
    assert service.find_job(job_id).archived is not None  # type: ignore[union-attr]
    assert page.locator("#console-log").inner_text().count("Queue browser: resumed") == 1
    assert real_errors(page) == []


def test_failing_job_lands_in_the_dlq_then_edit_save_and_retry_succeeds(deck_server: Deck, page_for: Open) -> None:
    seed_history()
    service.set_queue_paused("browser", True)
    page = page_for("operator")
    job_id = chokaq_core.enqueue("demo.image.resize.v1", {"url": "https://img.example/1.png", "width": 0},
                                 queue="browser")
    wait_status(page, job_id, "PENDING")
    page.locator("#queues-panel tr[data-queue=browser] .switch").click()
    wait_status(page, job_id, "FAILED")  # the live row shows the move to the DLQ
    page.click("#tab-dlq")
    page.wait_for_selector(f"#history-rows #job-{job_id}")
    shot(page, "deck-dlq")
    page.click(f"#job-{job_id} td.type")
    page.wait_for_selector("#inspector-status")
    assert "MORGUE" in page.inner_text("#inspector-status")
    assert "width must be positive" in page.inner_text("#inspector-error")
    shot(page, "deck-inspector")
    page.click("#btn-edit")
    page.wait_for_selector("#editor-payload")
    page.fill("#editor-payload", '{"url": "https://img.example/1.png", "width": ')
    page.click("#btn-save-retry")
    page.wait_for_selector("#editor-error:not([hidden])")
    assert "Invalid JSON" in page.inner_text("#editor-error")
    assert service.find_job(job_id).dead is not None  # type: ignore[union-attr]  # nothing was sent
    page.fill("#editor-payload", json.dumps({"url": "https://img.example/1.png", "width": 640}, indent=2))
    shot(page, "deck-editor")
    page.click("#btn-save-retry")
    page.wait_for_selector("#inspector-history")  # back in the inspector, with the operator history
    page.wait_for_selector(f"#history-rows #job-{job_id}", state="detached")  # the DLQ view re-fetched: gone
    wait_until(lambda: (v := service.find_job(job_id)) is not None and v.archived is not None)
    archived_job = service.find_job(job_id).archived  # type: ignore[union-attr]
    assert json.loads(archived_job.payload)["width"] == 640  # type: ignore[union-attr]
    page.click("#tab-archive")
    wait_status(page, job_id, "SUCCEEDED")
    shot(page, "deck-archive")
    assert real_errors(page) == []


def test_viewer_sees_no_operator_actions_and_a_forged_post_is_refused(deck_server: Deck, page_for: Open) -> None:
    seed_history()
    service.set_queue_paused("browser", True)
    job_id = chokaq_core.enqueue("demo.email.send.v1", {"to": "a@b.c", "subject": "Hi"}, queue="browser")
    page = page_for("viewer", theme="daylight")
    page.wait_for_selector(f"#job-{job_id}")
    assert page.locator("#bulk-bar").count() == 0
    assert page.locator("button:has-text('STOP')").count() == 0
    assert page.locator("#queues-panel .switch").count() == 0
    assert page.locator("#queues-panel input:not([disabled])").count() == 0
    page.click(f"#job-{job_id} td.type")
    page.wait_for_selector("#inspector-status")
    assert page.locator("#btn-edit, #btn-stop, #btn-retry, #btn-delete").count() == 0
    shot(page, "deck-viewer-light")
    status = page.evaluate(
        """async id => {
            const token = JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRFToken'];
            const r = await fetch('/deck/api/jobs/' + id + '/cancel', {method: 'POST', headers: {'X-CSRFToken': token}});
            return [r.status, await r.text()];
        }""", job_id)
    assert status[0] == 403 and "Permission denied" in status[1]
    no_token = page.evaluate("async id => (await fetch('/deck/api/jobs/' + id + '/cancel', {method: 'POST'})).status",
                             job_id)
    assert no_token == 403
    view = service.find_job(job_id)
    assert view is not None and view.hot is not None and view.hot.status == JobStatus.PENDING


def test_login_page_and_theme_switch(deck_server: Deck, browser: Any) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.goto(f"{deck_server.url}/deck/")
    assert "/deck/login/" in page.url
    page.fill("input[name=username]", "admin-user")
    page.fill("input[name=password]", "wrong")
    page.click("button[type=submit]")
    page.wait_for_selector("#login-error")
    shot(page, "deck-login")
    page.fill("input[name=username]", "admin-user")
    page.fill("input[name=password]", "deck-test-pw")
    page.click("button[type=submit]")
    page.wait_for_selector("#conn[data-state=online]")
    assert page.evaluate("document.documentElement.dataset.theme") == "blueprint"
    page.select_option("#theme-select", "daylight")
    page.reload()
    page.wait_for_selector("#conn[data-state=online]")
    assert page.evaluate("document.documentElement.dataset.theme") == "daylight"
    context.close()


def test_an_operator_changes_pauses_and_lifts_a_rate_limit_in_the_panel(deck_server: Deck, page_for: Open) -> None:
    from chokaq_core import storage
    from chokaq_core.domain import RateLimit, parse_rate

    storage.declare_rate_limits([RateLimit("type:demo.email.send.v1", parse_rate("100/m"))])
    page = page_for("operator")
    row = page.locator("#rate-limits-panel tr[data-limit='type:demo.email.send.v1']")
    row.wait_for(timeout=20_000)
    assert "100/m" in row.inner_text()

    row.locator("input.rate-input").fill("7/s")
    row.locator("input.rate-input").dispatch_event("change")
    wait_until(lambda: service.rate_limits()[0].rate == parse_rate("7/s"))
    page.wait_for_function("() => document.querySelector(\"#rate-limits-panel tr[data-limit='type:demo.email.send.v1']\")"
                           ".textContent.includes('7/s')", timeout=20_000)
    panel_shot(page, "#rate-limits-section", "deck-rate-limits")
    row = page.locator("#rate-limits-panel tr[data-limit='type:demo.email.send.v1']")
    row.locator("button", has_text="PAUSE").click()
    wait_until(lambda: (service.rate_limits()[0].rate or parse_rate("1/s")).count == 0)
    page.locator("#rate-limits-panel tr[data-limit='type:demo.email.send.v1']").locator(
        "button", has_text="LIFT").click()
    wait_until(lambda: service.rate_limits()[0].rate is None)
    assert real_errors(page) == []


def test_live_frames_are_compressed_when_the_browser_offers_permessage_deflate(deck_server: Deck,
                                                                              page_for: Open) -> None:
    """The Deck's web process (``deck.serve``: daphne) negotiates ``permessage-deflate``, and its frames arrive
    compressed (RSV1 set). Chromium offers the extension; the handshake is replayed here with the tab's session
    to read what the server answered."""
    page = page_for("viewer")
    cookies = "; ".join(f"{c['name']}={c['value']}" for c in page.context.cookies())
    host = deck_server.url.removeprefix("http://")
    with socket.create_connection(tuple(host.split(":")), timeout=10) as conn:  # type: ignore[arg-type]
        conn.sendall((f"GET /ws/deck/ HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\n"
                      "Sec-WebSocket-Version: 13\r\n"
                      "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
                      f"Origin: {deck_server.url}\r\nCookie: {cookies}\r\n\r\n").encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = conn.recv(4096)
            assert chunk, f"the server closed the handshake: {answer!r}"
            answer += chunk
        head, _, rest = answer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        assert lines[0].split()[1] == "101", lines[0]
        extensions = [v.strip() for k, _, v in (line.partition(":") for line in lines[1:])
                      if k.lower() == "sec-websocket-extensions"]
        assert extensions and extensions[0].startswith("permessage-deflate"), lines
        while not rest:
            rest = conn.recv(4096)
        assert rest[0] & 0x40, f"the first frame is not compressed (RSV1 clear): {rest[:2]!r}"


@pytest.mark.parametrize("phone", [False, True])
def test_a_queue_row_shows_its_rate_limit_use_through_live_pushes(deck_server: Deck, page_for: Open,
                                                                  phone: bool) -> None:
    """A pushed queues panel carries no limits: its rate cells follow the rate-limits panel (its 2 s refresh)."""
    service.set_queue_paused("browser", True)
    chokaq_core.enqueue("demo.email.send.v1", {"to": "a@b.c", "subject": "Hi"}, queue="browser")
    chokaq_core.enqueue("demo.email.send.v1", {"to": "a@b.c", "subject": "Hi"}, queue="browser-free")
    chokaq_core.enqueue("demo.email.send.v1", {"to": "a@b.c", "subject": "Hi"}, queue="browser-held")
    service.set_rate_limit("queue:browser", "100/m", actor="test")
    service.set_rate_limit("queue:browser-held", "0/m", actor="test")
    page = page_for("admin", phone=phone, size=(1440, 900))
    cell = "#queues-panel tr[data-queue=browser] td.rate-cell"
    page.wait_for_function(f"() => document.querySelector('{cell}')?.textContent.trim() === '0/100 per 1m'")
    page.evaluate("document.getElementById('queues-panel').dataset.seen = '1'")
    service.set_rate_limit("queue:browser", "50/m", actor="test")  # no event: the rate-limits panel's refresh brings it
    page.wait_for_function(f"() => document.querySelector('{cell}')?.textContent.trim() === '0/50 per 1m'")
    page.wait_for_function("() => !document.getElementById('queues-panel').dataset.seen")  # a push replaced it
    assert page.locator(cell).inner_text().strip() == "0/50 per 1m", "the pushed panel's cell is filled again"
    assert page.locator(f"{cell} a").get_attribute("href") == "#" + page.locator(
        "#rate-limits-panel tr[data-limit='queue:browser']").get_attribute("id")
    assert page.locator("#queues-panel tr[data-queue=browser-held] td.rate-cell").inner_text().strip() == "paused"
    assert page.locator("#queues-panel tr[data-queue=browser-free] td.rate-cell").inner_text().strip() == "—"
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= page.viewport_size["width"], "the page itself never scrolls sideways"
    height = page.evaluate(f"() => document.querySelector('{cell} a').getBoundingClientRect().height")  # pushes
    assert height < 30, "the rate badge stays on one line"  # swap the panel: measured in one step
    if phone:  # the table scrolls sideways to the rate; the queue's name stays at the row's start
        page.evaluate(f"document.querySelector('{cell}').scrollIntoView({{inline: 'center', block: 'center'}})")
        name, wrap = page.evaluate("""() => [document.querySelector('#queues-panel tr[data-queue=browser] td.queue-name'),
            document.querySelector('#queues-section .table-wrap')].map(e => e.getBoundingClientRect().left)""")
        assert page.evaluate("document.querySelector('#queues-section .table-wrap').scrollLeft") > 0
        assert abs(name - wrap) < 2, "the queue's name scrolled away with the numbers"
    panel_shot(page, "#queues-section", "deck-queues-phone" if phone else "deck-queues")
    page.locator(f"{cell} a").click()  # the badge leads to the limit's row, where it is changed
    page.wait_for_function("() => location.hash.startsWith('#rate-limit-')")
    assert page.locator("#rate-limits-panel tr[data-limit='queue:browser']").is_visible()
    assert real_errors(page) == []
