"""Errors you can read and retries you can see, in a real browser: a Top Errors entry leads to its jobs, and a
retrying job shows its last error and its next attempt live."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import chokaq_core
from tests.browser.conftest import Deck, shot
from tests.browser.test_deck import real_errors
from tests.deck.conftest import exhausted

pytestmark = [pytest.mark.browser, pytest.mark.slow]

Open = Callable[..., Any]


def test_a_top_errors_click_lists_the_jobs_of_that_group(deck_server: Deck, page_for: Open) -> None:
    timeouts = set(exhausted("payments", "payment gateway timeout", 3))
    refused = set(exhausted("payments", "connection refused", 2))
    page = page_for("operator")
    entries = page.locator("#top-errors .error-link")
    assert entries.count() == 2
    assert entries.nth(0).locator(".prefix").inner_text() == "ConnectionError: payment gateway timeout"

    entries.nth(1).click()
    page.wait_for_selector("#history-rows tr.job-row")
    listed = set(page.eval_on_selector_all("#history-rows tr.job-row", "rows => rows.map(r => r.dataset.jobId)"))
    assert listed == refused
    assert "ConnectionError: connection refused" in page.inner_text("#error-group-filter")
    wrap = page.locator("#job-matrix .table-wrap").bounding_box()
    for cell in ("td.status", "td:nth-child(9)", "td.duration", "td.actions button"):  # Try is the 9th column
        box = page.locator(f"#history-rows tr.job-row >> nth=0 >> {cell}").bounding_box()
        assert box["x"] + box["width"] <= wrap["x"] + wrap["width"], f"{cell} is pushed out of the table's view"
    page.locator("#top-errors .error-link").nth(0).click()
    page.wait_for_function("n => document.querySelectorAll('#history-rows tr.job-row').length === n",
                           arg=len(timeouts))
    listed = set(page.eval_on_selector_all("#history-rows tr.job-row", "rows => rows.map(r => r.dataset.jobId)"))
    assert listed == timeouts
    assert "DLQ filtered by MaxRetriesExceeded: ConnectionError: payment gateway timeout" in page.inner_text(
        "#console-log")
    assert real_errors(page) == []


def test_a_retrying_job_shows_its_last_error_and_next_attempt(deck_server: Deck, page_for: Open) -> None:
    page = page_for("viewer")
    job_id = chokaq_core.enqueue("test.throttled.v1", {"retry_after": 600}, queue="browser")
    row = f"#active-rows #job-{job_id}"
    page.wait_for_selector(f"{row} [data-role=last-error]", timeout=20_000)
    assert page.inner_text(f"{row} [data-role=status]") == "PENDING"
    assert page.inner_text(f"{row} [data-role=last-error]") == "attempt 1 failed: ChokaQThrottledError: slow down"
    assert page.inner_text(f"{row} [data-role=next-at]").startswith("next attempt at ")
    assert "1 retrying" in page.inner_text("#stat-pending-split")
    shot(page, "deck-retrying")
    page.click(f"{row} td.type")
    page.wait_for_selector("#inspector-last-error")
    assert page.inner_text("#inspector-last-error") == "ChokaQThrottledError: slow down"
    assert page.locator("#inspector-attempts .attempt-entry").count() == 1
    assert real_errors(page) == []


def test_the_dlq_columns_stay_inside_the_table_with_the_inspector_open_at_1440(deck_server: Deck,
                                                                               page_for: Open) -> None:
    refused = exhausted("notifications", "connection refused", 2, type="shop.notifications.send_receipt_email.v1",
                        created_by="operations-team@example.com")
    page = page_for("operator", size=(1440, 900))
    page.locator("#top-errors .error-link").nth(0).click()
    page.wait_for_selector("#history-rows tr.job-row")
    page.click(f"#history-rows #job-{refused[0]} td.type")
    page.wait_for_selector("#inspector")
    wrap = page.locator("#job-matrix .table-wrap").bounding_box()
    shot(page, "deck-dlq-inspector-1440")
    for cell in ("td:nth-child(9)", "td.duration", "td.actions button"):  # Try is the 9th column
        box = page.locator(f"#history-rows tr.job-row >> nth=0 >> {cell}").bounding_box()
        assert box["x"] + box["width"] <= wrap["x"] + wrap["width"], f"{cell} is pushed out of the table's view"
    assert page.locator("#history-rows tr.job-row >> nth=0 >> td.actions button").inner_text() == "RETRY"
    assert real_errors(page) == []
