"""The chart's history views and the Recurring panel in a real browser (keyboard, address, live switches)."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chokaq_core import service
from chokaq_core.domain import FailureReason
from chokaq_core.models import HistoryBuckets, JobsHot, Schedules
from tests.browser.conftest import Deck, panel_shot
from tests.deck.conftest import archived, dead

pytestmark = [pytest.mark.browser, pytest.mark.slow]

Open = Callable[..., Any]
SCHEDULE = {"nightly-report": {"CRON": "0 3 * * *", "TYPE": "demo.report.build.v1", "QUEUE": "reports",
                               "PAYLOAD": {"report_id": 1, "pages": 3}},
            "cache-warmup": {"CRON": "*/15 * * * *", "TYPE": "test.ok.v1", "QUEUE": "browser-later"}}


@pytest.fixture(autouse=True)
def _schedule(monkeypatch: pytest.MonkeyPatch, chokaq_settings: Any) -> None:
    """The Deck server (and this process) know two recurring jobs; set before the server starts."""
    import tests.browser.conftest as browser_conftest

    monkeypatch.setattr(browser_conftest, "OVERRIDES", {**browser_conftest.OVERRIDES, "SCHEDULE": SCHEDULE})
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "SCHEDULE": SCHEDULE}


def seed_hours() -> None:
    """A day of hour buckets before the real completions below: a daily wave of two types."""
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    for hours in range(1, 24):
        wave = 40 + int(30 * math.sin(hours / 24 * 2 * math.pi))
        for job_type, bins in (("demo.email.send.v1", {"b06": wave, "b07": wave // 3}),
                               ("demo.report.build.v1", {"b10": wave // 4, "b11": wave // 8})):
            done = sum(bins.values())
            HistoryBuckets.objects.create(granularity=3600, bucket_start=now - timedelta(hours=hours), queue="emails",
                                          type=job_type, outcome=0, completed_count=done, duration_count=done,
                                          total_duration_ms=done * 90.0, max_duration_ms=4800.0, **bins)
        HistoryBuckets.objects.create(granularity=3600, bucket_start=now - timedelta(hours=hours), queue="payments",
                                      type="demo.payment.capture.v1", outcome=1, completed_count=hours % 5)


def test_the_range_switcher_by_keyboard_and_address(deck_server: Deck, page_for: Open) -> None:
    seed_hours()
    archived("emails", 8, duration_ms=85.0, type="demo.email.send.v1")
    archived("reports", 3, duration_ms=1450.0, type="demo.report.build.v1")
    dead("payments", 2, reason=FailureReason.TRANSIENT, details="ConnectionError: gateway timeout",
         type="demo.payment.capture.v1")
    service.set_rate_limit("type:demo.email.send.v1", "100/m", actor="test")
    page = page_for("operator")
    assert page.locator("#chart-panel").get_attribute("data-range") == "5m"
    link = page.locator("#chart-panel .range-switch a", has_text="24h")
    link.focus()
    page.keyboard.press("Enter")
    page.wait_for_selector("#chart-panel[data-range='24h'] #history-chart canvas", timeout=10_000)
    assert page.url.endswith("/deck/?range=24h"), page.url
    assert page.locator("#chart-panel .range-switch a[aria-current=true]").inner_text() == "24h"
    types = page.locator("#history-types tbody tr")
    assert types.count() == 3 and types.first.get_attribute("data-type") == "demo.email.send.v1"
    # the re-fetched panel reads no limits: deck.js fills a type's rate cell from the rate-limits panel
    page.wait_for_function("() => document.querySelector('#history-types tr[data-type=\"demo.email.send.v1\"] "
                           "td.rate-cell')?.textContent.trim() === '0/100 per 1m'", timeout=5_000)
    assert types.nth(1).locator("td.rate-cell").inner_text().strip() == "—"
    assert "History chart, last 24 hours" in page.locator("#history-data").inner_text()
    page.wait_for_timeout(300)
    panel_shot(page, "#chart-panel", "deck-history")

    page.goto(f"{deck_server.url}/deck/?range=7d")  # the address alone opens the view
    page.wait_for_selector("#chart-panel[data-range='7d'] #history-chart canvas", timeout=10_000)
    page.keyboard.press("Tab")  # the links are ordinary links: reachable by keyboard
    page.locator("#chart-panel .range-switch a", has_text="5m").click()
    page.wait_for_selector("#chart-panel[data-range='5m'] #chart canvas", timeout=10_000)
    assert page.errors == []


def test_the_recurring_panel_switches_and_runs_now(deck_server: Deck, page_for: Open) -> None:
    page = page_for("operator")
    row = page.locator("#recurring-panel tr[data-schedule='nightly-report']")
    assert "ENABLED" in row.inner_text() and "0 3 * * *" in row.inner_text()
    row.locator("button.switch").click()
    page.wait_for_function("() => document.querySelector(\"tr[data-schedule='nightly-report']\")"
                           ".textContent.includes('DISABLED')", timeout=10_000)
    assert Schedules.objects.get(name="nightly-report").enabled is False
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#recurring-panel tr[data-schedule='cache-warmup'] button", has_text="RUN NOW").click()
    page.wait_for_selector("#recurring-panel tr[data-schedule='cache-warmup'] a.job-link", timeout=10_000)
    job_id = page.locator("#recurring-panel tr[data-schedule='cache-warmup'] a.job-link").inner_text()
    assert JobsHot.objects.filter(id=job_id, created_by="operator-user").exists()
    assert "run now as job" in page.locator("#console-log").inner_text()
    page.wait_for_timeout(300)
    panel_shot(page, "#recurring-panel", "deck-recurring")
    page.locator("#recurring-panel a.job-link").first.click()
    page.wait_for_selector("#side-panel #inspector", timeout=10_000)
    assert job_id in page.locator("#side-panel").inner_text()
    assert page.errors == []
