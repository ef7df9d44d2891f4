"""The open inspector follows its job live (no reload): after Save & Retry it turns from PENDING to SUCCEEDED,
and a running job stopped from it shows CANCELLED — with only the actions valid where the job now is.

The worker is a separate process and there is no Redis: no worker event reaches the web process, so these
also prove the broadcaster's own look at the followed job."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

import chokaq_core
from chokaq_core import service
from tests.browser.conftest import Deck
from tests.browser.test_deck import real_errors, wait_status, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow]

Open = Callable[..., Any]


def wait_inspector(page: Any, state: str, where: str, timeout: float = 20) -> None:
    page.wait_for_function(
        "([s, w]) => { const b = document.querySelector('#inspector #inspector-status');"
        " return b && b.querySelector('.state').textContent.trim() === s"
        " && b.querySelector('.where').textContent.trim() === w; }", arg=[state, where], timeout=timeout * 1000)


def test_the_inspector_turns_from_pending_to_succeeded_after_save_and_retry(deck_server: Deck,
                                                                         page_for: Open) -> None:
    page = page_for("operator")
    page.evaluate("window.__noReload = true")
    job_id = chokaq_core.enqueue("demo.image.resize.v1", {"url": "https://img.example/2.png", "width": 0},
                                 queue="browser")
    wait_until(lambda: (v := service.find_job(job_id)) is not None and v.dead is not None)
    page.click("#tab-dlq")
    page.wait_for_selector(f"#history-rows #job-{job_id}")
    page.click(f"#job-{job_id} td.type")
    wait_inspector(page, "FAILED", "MORGUE")
    service.set_queue_paused("browser", True)  # the retried job waits, so its PENDING state can be seen
    page.click("#btn-edit")
    page.wait_for_selector("#editor-payload")
    page.fill("#editor-payload", json.dumps({"url": "https://img.example/2.png", "width": 320}))
    page.click("#btn-save-retry")
    wait_inspector(page, "PENDING", "ACTIVE")
    assert page.locator("#inspector #btn-stop").count() == 1
    service.set_queue_paused("browser", False)  # from this process: no event of it reaches the Deck
    wait_inspector(page, "SUCCEEDED", "ARCHIVE")
    assert page.inner_text("#inspector-moved").strip() == "Moved: ACTIVE → ARCHIVE"
    for stale in ("#btn-stop", "#btn-retry", "#btn-edit"):
        assert page.locator(f"#inspector {stale}").count() == 0, f"{stale} is still offered"
    assert page.evaluate("window.__noReload") is True, "the page was reloaded"
    assert real_errors(page) == []


def test_a_running_job_stopped_from_its_inspector_shows_cancelled(deck_server: Deck, page_for: Open) -> None:
    page = page_for("operator")
    page.evaluate("window.__noReload = true")
    job_id = chokaq_core.enqueue("test.sleep.v1", {"seconds": 120}, queue="browser")
    wait_status(page, job_id, "PROCESSING")
    page.click(f"#job-{job_id} td.type")
    wait_inspector(page, "PROCESSING", "ACTIVE")
    page.click("#inspector #btn-stop")
    wait_inspector(page, "CANCELLED", "MORGUE")
    assert "Moved: ACTIVE → MORGUE" in page.inner_text("#inspector")
    assert page.locator("#inspector #btn-stop").count() == 0
    assert page.locator("#inspector #btn-retry").count() == 1
    assert page.locator("#inspector .progress").count() == 0
    assert page.evaluate("window.__noReload") is True, "the page was reloaded"
    assert real_errors(page) == []


def test_a_burst_of_news_about_the_inspected_job_costs_at_most_two_re_fetches(deck_server: Deck,
                                                                            page_for: Open) -> None:
    """Throttle: 40 pushes naming the inspected job at once give at most one re-fetch now and one trailing
    re-fetch (counted, not timed)."""
    service.set_queue_paused("browser", True)
    job_id = chokaq_core.enqueue("demo.email.send.v1", {"to": "a@b.c", "subject": "Hi"}, queue="browser")
    page = page_for("viewer")  # the row is in the first render: this test counts re-fetches, not the push
    wait_status(page, job_id, "PENDING")
    fetches: list[str] = []
    page.on("request", lambda r: fetches.append(r.url) if r.url.endswith(f"/deck/jobs/{job_id}") else None)
    page.click(f"#job-{job_id} td.type")
    wait_inspector(page, "PENDING", "ACTIVE")
    # The server names a job once when a tab starts following it (the inspector may predate a change): that
    # second fetch is awaited, so only the burst's fetches are counted below.
    for _ in range(200):  # Playwright delivers request events only while it runs: wait inside it
        if len(fetches) >= 2:
            break
        page.wait_for_timeout(100)
    page.wait_for_function("() => { const f = window.Deck.follow; return !f.busy && !f.timer && !f.again; }")
    page.wait_for_function("() => !document.querySelector('#inspector.htmx-request')")
    assert len(fetches) == 2, fetches
    fetches.clear()
    page.evaluate("""(id) => {
        for (let i = 0; i < 40; i++) {
          const b = document.createElement('b');
          b.dataset.touched = id;
          document.getElementById('row-inbox').appendChild(b);
          window.Deck.processInbox();
        }
    }""", job_id)
    page.wait_for_function("() => { const f = window.Deck.follow; return !f.busy && !f.timer && !f.again; }")
    page.wait_for_function("() => !document.querySelector('#inspector.htmx-request')")
    # one re-fetch now and one trailing, or only the trailing one when the last fetch was under 250 ms ago
    assert 1 <= len(fetches) <= 2, fetches
    wait_inspector(page, "PENDING", "ACTIVE")
    assert real_errors(page) == []
