"""The click path of a hostile job id, in a real browser: a row click fetches that job's inspector or nothing.

Rows stored before names had an alphabet (written straight through storage here) carried ids such as
``x/../../metrics``: pasted into ``hx-get`` the browser resolved it to ``/deck/metrics``, whose text body (with a
queue named ``<img onerror=…>``) was swapped into the side panel and ran script.
"""

from __future__ import annotations

from typing import Any

import pytest

from chokaq_core import storage
from chokaq_core.domain import NewJob, new_ulid
from chokaq_core.models import Queues
from tests.browser.conftest import Deck

pytestmark = [pytest.mark.browser, pytest.mark.slow]

HOSTILE_QUEUE = '<img src=x onerror="window.__xss=1">'
HOSTILE_IDS = ("x/../../metrics", "..", "../../api/dlq/ZZZ/purge?")


def test_a_hostile_row_id_cannot_make_a_click_fetch_another_url(deck_server: Deck, page_for: Any) -> None:
    Queues.objects.create(name=HOSTILE_QUEUE)
    storage.enqueue([NewJob(job_id, "hostile", "test.ok.v1", "{}") for job_id in HOSTILE_IDS])
    good = storage.enqueue([NewJob(new_ulid(), "hostile", "test.ok.v1", '{"n": 1}')])[0]
    page = page_for("admin")
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    for job_id in HOSTILE_IDS:
        row = page.locator(f'tr.job-row[data-job-id="{job_id}"]').first
        row.wait_for()
        row.locator("td.type").click()
        page.wait_for_timeout(400)
    assert not [u for u in requests if "/metrics" in u or "/purge" in u], requests
    for job_id in HOSTILE_IDS:
        row = page.locator(f'tr.job-row[data-job-id="{job_id}"]').first
        assert row.get_attribute("hx-get") is None
        assert row.locator("button").count() == 0  # no STOP built from the id either
    assert page.locator("#side-panel #side-empty").count() == 1
    assert page.evaluate("window.__xss") is None
    # the control: an ordinary row opens its inspector
    page.locator(f"#job-{good} td.type").click()
    page.wait_for_selector("#inspector-status")
    assert good in page.inner_text("#inspector")


def test_the_side_panel_accepts_only_the_inspector_partial(deck_server: Deck, page_for: Any) -> None:
    """Even when something asks htmx to put the metrics text or a JSON answer into the side panel, nothing is
    swapped: only an HTML fragment whose root is the inspector or the editor is accepted."""
    Queues.objects.create(name=HOSTILE_QUEUE)
    page = page_for("admin")
    before = page.inner_html("#side-panel")
    for url in ("/deck/metrics", "/deck/health/", "/deck/"):
        page.evaluate("url => htmx.ajax('GET', url, {target: '#side-panel', swap: 'innerHTML'})", url)
        page.wait_for_timeout(500)
        assert page.inner_html("#side-panel") == before, url
    assert page.evaluate("window.__xss") is None


@pytest.mark.parametrize("payload", [
    {"s": "é" * ((999_988 - 8) // 2)},  # 999,988 bytes of UTF-8 JSON
    {"s": "&" * (900_007 - 8)},  # 900,007 bytes of ASCII JSON ("&" is 3 bytes form-encoded)
], ids=["utf8-999988", "ascii-900007"])
def test_the_editor_saves_the_largest_payloads_the_envelope_allows(deck_server: Deck, page_for: Any,
                                                                   payload: dict[str, str]) -> None:
    """Form encoding inflated these past Django's 2.5 MB form cap (an HTML 400); the editor posts JSON."""
    import json

    from chokaq_core import service

    job_id = storage.enqueue([NewJob(new_ulid(), "editing", "test.ok.v1", '{"n": 1}')])[0]
    page = page_for("operator")
    page.locator(f"#job-{job_id} td.type").click()
    page.wait_for_selector("#btn-edit")
    page.click("#btn-edit")
    page.wait_for_selector("#editor-payload")
    page.fill("#editor-payload", json.dumps(payload, ensure_ascii=False))
    page.click("#btn-save")
    page.wait_for_selector("#inspector-history", timeout=20_000)
    view = service.find_job(job_id)
    assert view is not None and view.hot is not None
    assert json.loads(view.hot.payload) == payload
