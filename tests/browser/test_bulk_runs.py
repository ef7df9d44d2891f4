"""Clearing a backlog from the Deck in a real browser: CANCEL ALL MATCHING over 1,200 Pending jobs (more than
the rows the table shows, more than one batch), after a preview and the typed word; the run goes on in the web
process and its end reaches the console and a toast without a reload."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import chokaq_core
from chokaq_core import service
from chokaq_core.domain import JobFilter
from tests.browser.conftest import Deck
from tests.browser.test_deck import real_errors

pytestmark = [pytest.mark.browser, pytest.mark.slow]

Open = Callable[..., Any]


def test_cancel_all_matching_clears_a_backlog_with_a_progress_toast(deck_server: Deck, page_for: Open) -> None:
    chokaq_core.enqueue_many([{"type_key": "demo.email.send.v1", "payload": {"to": f"u{n}@x.y", "subject": "Hi"},
                               "queue": "backlog"} for n in range(1200)])
    keep = chokaq_core.enqueue("demo.email.send.v1", {"to": "keep@x.y", "subject": "Hi"}, queue="elsewhere")
    page = page_for("operator")
    page.evaluate("window.__noReload = true")
    page.fill("#jobs-filter input[name=queue]", "backlog")
    page.click("#jobs-filter button[type=submit]")
    page.wait_for_selector("#active-bulk-form input[name=queue][value=backlog]", state="attached")
    page.click("#active-bulk summary")
    page.click("#preview-cancel-matching")
    page.wait_for_selector("#bulk-preview-result")
    assert "1,200 / 1,200" in page.inner_text("#bulk-preview-result")
    page.fill("#bulk-preview-result input[name=confirm]", "CANCEL")
    page.click("#bulk-confirm")
    page.wait_for_function("() => document.getElementById('console-log').textContent"
                           ".includes('Cancelled 1,200 / 1,200 matching job(s)')", timeout=30_000)
    assert service.preview_cancel_matching(JobFilter(queue="backlog")).matched == 0
    assert (v := service.find_job(keep)) is not None and v.hot is not None
    assert page.locator("#toasts .toast", has_text="Cancelled 1,200 / 1,200").count() >= 1
    assert page.evaluate("window.__noReload") is True, "the page was reloaded"
    assert real_errors(page) == []
