"""The Deck as a set of real addresses, on a phone, and through an outage (Playwright on Debian's chromium)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.browser.conftest import Deck, shot
from tests.browser.test_deck import seed_history

pytestmark = [pytest.mark.browser, pytest.mark.slow]

Open = Callable[..., Any]
JOB_ADDRESS = re.compile(r"/deck/jobs/[0-9A-Za-z]+$")


def path_of(page: Any) -> str:
    return str(page.evaluate("location.pathname + location.search"))


def test_a_row_click_gives_the_job_its_address_and_back_restores_the_list(deck_server: Deck, page_for: Open) -> None:
    seed_history()
    page = page_for("viewer")
    page.goto(f"{deck_server.url}/deck/?view=dlq&reason=8")
    page.wait_for_selector("#conn[data-state=online]")
    rows = page.locator("#history-rows tr.job-row")
    assert rows.count() == 2  # the two Transient DLQ jobs
    job_id = rows.first.get_attribute("data-job-id")
    rows.first.locator("td.type").click()  # anywhere on the row, not only its id link
    page.wait_for_selector(f"#inspector[data-job-id='{job_id}']")
    assert path_of(page) == f"/deck/jobs/{job_id}"

    page.go_back()
    page.wait_for_url(f"{deck_server.url}/deck/?view=dlq&reason=8")
    page.wait_for_selector("#side-empty")
    assert page.locator("#history-rows tr.job-row").count() == 2
    assert page.locator("#tab-dlq.current").count() == 1

    page.go_forward()  # the job's address reloads to the job
    page.wait_for_selector(f"#inspector[data-job-id='{job_id}']")


def test_the_filter_form_puts_the_page_address_in_the_bar(deck_server: Deck, page_for: Open) -> None:
    seed_history()
    page = page_for("viewer")
    page.click("#tab-dlq")
    page.wait_for_selector("#job-matrix.view-dlq")
    page.fill("#jobs-filter input[name=q]", "gateway")
    page.click("#jobs-filter button[type=submit]")
    page.wait_for_url(re.compile(r"q=gateway"))
    address = path_of(page)
    assert address.startswith("/deck/?") and "partials" not in address
    page.reload()  # the address reloads to the same state
    page.wait_for_selector("#job-matrix.view-dlq")
    assert page.locator("#jobs-filter input[name=q]").input_value() == "gateway"
    assert page.locator("#history-rows tr.job-row").count() == 2


def test_a_phone_has_no_sideways_scroll_and_a_tapped_row_opens_the_inspector_in_view(
        deck_server: Deck, page_for: Open) -> None:
    seed_history()
    page = page_for("operator", phone=True)
    page.goto(f"{deck_server.url}/deck/?view=dlq&size=100")
    page.wait_for_selector("#conn[data-state=online]")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.evaluate("document.getElementById('job-matrix').scrollIntoView()")
    shot(page, "deck-mobile-list")
    row = page.locator("#history-rows tr.job-row").first
    row.scroll_into_view_if_needed()
    assert row.locator("td.id").is_visible() and row.locator("td.status").is_visible()
    row.locator("td.status").tap()
    page.wait_for_selector("#inspector h2")
    # measured in one step: the inspector is re-fetched once as the tab starts following its job, and a
    # locator's bounding_box() that resolves the old element and measures it after that swap gets None
    box = page.wait_for_function("() => { const r = document.getElementById('inspector')?.getBoundingClientRect();"
                                 " return r && {y: r.y, height: r.height}; }").json_value()
    assert box["y"] >= 0 and box["y"] < 844 and box["height"] > 200, box
    assert page.locator("#inspector .side-close").is_visible()
    shot(page, "deck-mobile")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.locator("#inspector .side-close").tap()
    page.wait_for_selector("#side-empty", state="attached")
    assert not JOB_ADDRESS.search(path_of(page))


def test_the_badge_is_online_again_within_3_s_of_daphne_answering(deck_server: Deck, page_for: Open) -> None:
    page = page_for("viewer")
    deck_server.kill_web()
    page.wait_for_selector("#conn:not([data-state=online])", timeout=10_000)
    assert page.locator("#conn-retry").is_visible()  # RETRY NOW is offered while the connection is down
    assert page.evaluate("document.documentElement.dataset.conn") != "online"  # the stale numbers are dimmed
    time.sleep(15)  # long enough for an uncapped exponential backoff to wait far beyond the server's return
    deck_server.start_web()
    page.wait_for_selector("#conn[data-state=online]", timeout=3_000)
    assert page.locator("#conn-retry").is_hidden()


def test_a_job_row_opens_from_the_keyboard(deck_server: Deck, page_for: Open) -> None:
    seed_history()
    page = page_for("viewer")
    page.goto(f"{deck_server.url}/deck/?view=dlq&reason=8")
    page.wait_for_selector("#conn[data-state=online]")
    link = page.locator("#history-rows tr.job-row a.job-link").first
    job_id = link.locator("xpath=ancestor::tr").get_attribute("data-job-id")
    page.locator("#jobs-filter button[type=submit]").focus()
    for _ in range(30):  # Tab from the filter form down to the first job row's link
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.classList.contains('job-link')"):
            break
    assert page.evaluate("document.activeElement.closest('tr').dataset.jobId") == job_id
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline != "none"  # the focus is visible
    page.keyboard.press("Enter")
    page.wait_for_selector(f"#inspector[data-job-id='{job_id}']")
    assert path_of(page) == f"/deck/jobs/{job_id}"
