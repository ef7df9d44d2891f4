"""Deck basics: compressed answers, a text alternative for the chart, live regions, keyboard-reachable rows."""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable

import pytest
from django.test import Client

from tests.deck.conftest import HTMX, Jobs, archived

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(client_as: Callable[[str], Client]) -> Client:
    return client_as("viewer")


@pytest.mark.parametrize("url, htmx", [("/deck/", False), ("/deck/partials/jobs?view=archive", True),
                                       ("/deck/partials/stats", True)])
def test_deck_answers_are_gzip_compressed_for_a_client_that_accepts_it(viewer: Client, jobs: Jobs, url: str,
                                                                       htmx: bool) -> None:
    archived("done", 20)
    plain = viewer.get(url, **(HTMX if htmx else {}))
    packed = viewer.get(url, HTTP_ACCEPT_ENCODING="gzip, deflate, br", **(HTMX if htmx else {}))
    assert packed.status_code == 200 and packed["Content-Encoding"] == "gzip"
    assert "Accept-Encoding" in packed["Vary"]
    assert len(packed.content) * 2 < len(plain.content)
    body = gzip.decompress(packed.content).decode()
    assert body.count('id="') == plain.content.decode().count('id="')  # the same page, modulo the CSRF mask
    assert packed["Cache-Control"].startswith("max-age=0") or "no-store" in packed["Cache-Control"]


def test_the_chart_has_a_text_alternative(viewer: Client) -> None:
    html = viewer.get("/deck/").content.decode()
    assert '<div id="chart" class="chart" aria-hidden="true">' in html
    text = re.search(r'<p id="chart-data" class="sr-only"[^>]*>(.*?)</p>', html, re.S)
    assert text is not None
    assert text.group(1).startswith("Throughput chart, last 5 minutes: 0 job(s) succeeded and 0 failed")


def test_the_connection_badge_and_toasts_are_live_regions(viewer: Client) -> None:
    html = viewer.get("/deck/").content.decode()
    assert re.search(r'<span id="conn"[^>]*role="status"[^>]*aria-live="polite"', html)
    assert '<div id="toasts" aria-live="polite">' in html
    assert '<button type="button" class="btn small" id="conn-retry" hidden' in html


def test_job_rows_are_reachable_by_keyboard_through_a_link(viewer: Client, jobs: Jobs) -> None:
    html = viewer.get("/deck/partials/jobs?view=active", **HTMX).content.decode()
    row = re.search(rf'<tr id="job-{jobs.pending}".*?</tr>', html, re.S)
    assert row is not None
    assert f'<a class="job-link" href="/deck/jobs/{jobs.pending}"' in row.group(0)
