"""The Deck under its own Content-Security-Policy in a real browser: nothing is blocked, nothing is lost.

The policy allows scripts and styles only from the Deck's static files (no inline script, handler, style
attribute or eval). Every ``securitypolicyviolation`` event the page fires is recorded and must not happen;
the behaviour that inline code used to carry still works: a row click opens the inspector (a click on the
row's checkbox does not), Enter in the editor does not submit the form, the theme is applied before paint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from chokaq_core.domain import FailureReason
from tests.browser.conftest import Deck
from tests.deck.conftest import dead

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__violations.push(e.violatedDirective + " " + (e.blockedURI || "inline") + " " + (e.sample || ""));
});
"""


def test_the_deck_runs_under_its_policy(deck_server: Deck, page_for: Callable[..., Any]) -> None:
    (job_id,) = dead("csp-q", 1, reason=FailureReason.FATAL_ERROR, details="ValueError: csp")
    page = page_for("operator", theme="carbon")
    page.context.add_init_script(RECORD_VIOLATIONS)
    page.reload()
    page.wait_for_selector("#conn[data-state=online]")
    assert page.evaluate("document.documentElement.dataset.theme") == "carbon"  # theme.js, before paint
    response = page.request.get(f"{deck_server.url}/deck/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert "no-store" in response.headers["cache-control"]

    page.click("#tab-dlq")
    page.wait_for_selector(f"#history-rows #job-{job_id}")
    page.click(f"#job-{job_id} .row-check")  # selecting a row does not open it
    page.wait_for_timeout(400)
    assert page.locator("#inspector-status").count() == 0
    page.click(f"#job-{job_id} td.type")  # a click elsewhere on the row does
    page.wait_for_selector("#inspector-status")
    page.evaluate("window.__notReloaded = true")
    page.click("#btn-edit")
    page.wait_for_selector("#editor-payload")
    page.press("#editor input[name=tags]", "Enter")  # no inline onsubmit any more: deck.js keeps the form put
    page.wait_for_timeout(400)
    assert page.evaluate("window.__notReloaded") is True
    assert page.locator("#editor-payload").count() == 1
    assert page.evaluate("window.__violations") == []
    assert [e for e in page.errors if "status of 4" not in e] == []
