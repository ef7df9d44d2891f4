"""Errors you can read and retries you can see, over HTTP: ``ClassName: message`` first, Top Errors links that list
exactly their group, the last error / next attempt / circuit hold of a Pending row, the Pending split card and the
inspector's attempts timeline."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from urllib.parse import unquote

import pytest
from django.test import Client

from chokaq_core import storage
from chokaq_core.domain import Failure, FailureReason, Retry
from tests.deck.conftest import HTMX, _processing, exhausted, pending
from tests.storage.rows import raised

pytestmark = pytest.mark.django_db

ClientAs = Callable[[str], Client]


@pytest.fixture
def viewer(client_as: ClientAs) -> Client:
    return client_as("viewer")


def _rows(page: str) -> set[str]:
    return set(re.findall(r'<tr id="job-([^"]+)"', page))


def test_a_dlq_row_shows_class_and_message_not_the_traceback_head(viewer: Client) -> None:
    [job_id] = exhausted("err-dlq", "payment gateway timeout")
    page = viewer.get("/deck/partials/jobs?view=dlq", **HTMX).content.decode()
    row = page[page.index(f'id="job-{job_id}"'):]
    row = row[:row.index("</tr>")]
    assert 'data-role="error"' in row and ">ConnectionError: payment gateway timeout</span>" in row
    assert "Traceback (most recent call last)" not in row


def test_top_errors_show_class_and_message_and_each_link_lists_exactly_its_group(viewer: Client) -> None:
    timeouts = exhausted("err-top", "payment gateway timeout", 3)
    refused = exhausted("err-top", "connection refused", 2)
    panel = viewer.get("/deck/partials/top-errors", **HTMX).content.decode()
    labels = re.findall(r'<span class="prefix">([^<]*)</span>', panel)
    assert labels[:2] == ["ConnectionError: payment gateway timeout", "ConnectionError: connection refused"]
    links = [html.unescape(h) for h in re.findall(r'class="error-link"\s+hx-get="([^"]+)"', panel)]
    assert len(links) == 2
    for link, expected in zip(links, (timeouts, refused), strict=True):
        assert "eclass=builtins.ConnectionError" in unquote(link)
        listed = viewer.get(link, **HTMX)
        assert listed.status_code == 200
        assert _rows(listed.content.decode()) == set(expected), link


def test_a_legacy_group_without_a_class_still_lists_its_jobs(viewer: Client) -> None:
    ids = _processing("err-legacy", 2, "w-err")
    storage.complete("w-err", [], [], [Failure(i, FailureReason.FATAL_ERROR, "Traceback (most recent call last):\n"
                                               "  File \"x.py\", line 1\nKeyError: 'sku'\n") for i in ids])
    panel = viewer.get("/deck/partials/top-errors", **HTMX).content.decode()
    [link] = [html.unescape(h) for h in re.findall(r'class="error-link"\s+hx-get="([^"]+)"', panel)]
    assert _rows(viewer.get(link, **HTMX).content.decode()) == set(ids)
    page = viewer.get("/deck/partials/jobs?view=dlq", **HTMX).content.decode()
    assert ">KeyError: &#x27;sku&#x27;</span>" in page, "rows without a class show the details' last line"


def test_an_error_message_filter_without_its_class_is_refused(viewer: Client) -> None:
    response = viewer.get("/deck/partials/jobs?view=dlq&emsg=boom", **HTMX)
    assert response.status_code == 400 and b"error class" in response.content


def test_a_retrying_pending_row_shows_its_last_error_and_next_attempt(viewer: Client) -> None:
    [job_id] = _processing("err-retry", 1, "w-err")
    storage.complete("w-err", [], [Retry(job_id, 2, 600.0, raised("payment gateway timeout"))], [])
    page = viewer.get("/deck/partials/jobs?view=active", **HTMX).content.decode()
    row = page[page.index(f'id="job-{job_id}"'):]
    row = row[:row.index("</tr>")]
    assert ">PENDING<" in row
    assert "attempt 2 failed: ConnectionError: payment gateway timeout" in row
    assert 'data-role="next-at">next attempt at <time' in row


def test_a_job_deferred_by_an_open_circuit_says_so(viewer: Client) -> None:
    [job_id] = pending("err-held")
    [job] = storage.fetch_batch("w-err", 1, ["err-held"])
    storage.complete("w-err", [], [Retry(job.id, 0, 600.0, held_by="shop.charge.v1")], [])
    page = viewer.get("/deck/partials/jobs?view=active", **HTMX).content.decode()
    row = page[page.index(f'id="job-{job_id}"'):]
    assert "held by open circuit shop.charge.v1" in row[:row.index("</tr>")]
    stats = viewer.get("/deck/partials/stats", **HTMX).content.decode()
    assert re.search(r'id="stat-held"[^>]*>1 held by circuit<', stats)
    inspector = viewer.get(f"/deck/jobs/{job_id}", **HTMX).content.decode()
    assert 'id="inspector-held"' in inspector and "by open circuit shop.charge.v1" in inspector


def test_the_pending_card_splits_ready_scheduled_and_retrying(viewer: Client) -> None:
    pending("split", 2)
    pending("split", 1, delay=3600)
    [retrying] = _processing("split-retry", 1, "w-err")
    storage.complete("w-err", [], [Retry(retrying, 1, 600.0, raised("down"))], [])
    stats = viewer.get("/deck/partials/stats", **HTMX).content.decode()
    assert re.search(r'id="stat-pending">4<', stats)
    for element_id, text in (("stat-ready", "2 ready"), ("stat-scheduled", "1 scheduled"),
                             ("stat-retrying", "1 retrying")):
        assert re.search(rf'id="{element_id}"[^>]*>{text}<', stats), element_id
    assert 'id="stat-held"' not in stats


def test_the_inspector_shows_every_attempt_as_a_timeline(viewer: Client) -> None:
    [job_id] = _processing("err-timeline", 1, "w-err")
    storage.complete("w-err", [], [Retry(job_id, 1, 0.0, raised("first"))], [])
    [again] = storage.fetch_batch("w-err2", 1, ["err-timeline"])
    assert storage.mark_processing(again, "w-err2") == 2
    error = raised("second", ValueError)
    storage.complete("w-err2", [], [], [Failure(job_id, FailureReason.MAX_RETRIES_EXCEEDED, error.traceback, 2,
                                                error)])
    inspector = viewer.get(f"/deck/jobs/{job_id}", **HTMX).content.decode()
    assert 'id="inspector-error-summary"' in inspector and ">ValueError: second</p>" in inspector
    timeline = inspector[inspector.index('id="inspector-attempts"'):]
    assert re.findall(r'data-attempt="(\d+)"', timeline) == ["1", "2"]
    assert timeline.index("ConnectionError: first") < timeline.index("ValueError: second")
    assert "on w-err</span>" in timeline and "on w-err2</span>" in timeline


def test_a_job_type_wraps_only_after_its_dots_and_underscores() -> None:
    """The job table's narrow Type column breaks a type between its parts, never inside a word."""
    from deck.templatetags.deck_format import breakable

    assert breakable("shop.send_email.v1") == "shop.<wbr>send_<wbr>email.<wbr>v1"
    assert breakable("a<b>.c") == "a&lt;b&gt;.<wbr>c"  # escaped first: only the break is markup
    assert breakable(None) == ""
