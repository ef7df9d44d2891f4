"""History sort keys per pillar: a key the pillar has no column for is refused (it used to order by the date
while the page key carried the missing value, so keyset paging never advanced); every accepted (pillar, sort,
direction) pages through a small data set forward and back, each row exactly once."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.test import Client

from chokaq_core import service
from chokaq_core.domain import FailureReason, JobFilter
from chokaq_core.readmodel import HISTORY_SORTS, SORT_KEYS, HistorySort
from tests.deck.conftest import HTMX, archived, dead

ClientAs = Callable[[str], Client]
COMBOS = [(pillar, key) for pillar in ("archive", "dlq") for key in HISTORY_SORTS[pillar]]
MAX_PAGES = 50


def seed(pillar: str) -> list[str]:
    """Nine rows with repeated sort values (ties are broken by id)."""
    if pillar == "archive":
        return (archived("qa", 3, duration_ms=5.0) + archived("qb", 2, duration_ms=50.0, type="t.b.v1")
                + archived("qa", 2, duration_ms=5.0, tags="x") + archived("qc", 2, duration_ms=0.5))
    return (dead("qa", 3, reason=FailureReason.FATAL_ERROR) + dead("qb", 2, reason=FailureReason.TIMEOUT, type="t.b")
            + dead("qa", 2, reason=FailureReason.TRANSIENT) + dead("qc", 2, reason=FailureReason.FATAL_ERROR))


def test_the_refused_keys_are_exactly_the_missing_columns() -> None:
    assert set(SORT_KEYS) - set(HISTORY_SORTS["archive"]) == {"reason"}
    assert set(SORT_KEYS) - set(HISTORY_SORTS["dlq"]) == {"duration"}


@pytest.mark.django_db
@pytest.mark.parametrize("pillar, key", [("archive", "reason"), ("dlq", "duration")])
def test_a_sort_key_the_pillar_lacks_is_a_service_error(pillar: str, key: str) -> None:
    seed(pillar)
    with pytest.raises(service.ServiceError, match=f"cannot be sorted by '{key}'"):
        service.history(pillar, JobFilter(), HistorySort(key), size=2)


@pytest.mark.parametrize("url", ["/deck/?view=archive&sort=reason", "/deck/?view=dlq&sort=duration&size=100",
                                 "/deck/partials/jobs?view=archive&sort=reason"])
def test_the_view_answers_400_for_such_a_sort(client_as: ClientAs, url: str) -> None:
    archived("qa", 1)
    dead("qa", 1)
    response = client_as("viewer").get(url, **HTMX)
    assert response.status_code == 400
    assert "cannot be sorted by" in response.content.decode()


@pytest.mark.parametrize("view, offered, absent", [("archive", "duration", "reason"), ("dlq", "date", "duration")])
def test_the_sort_menu_offers_only_keys_of_the_pillar(client_as: ClientAs, view: str, offered: str,
                                                      absent: str) -> None:
    html = client_as("viewer").get(f"/deck/partials/jobs?view={view}", **HTMX).content.decode()
    assert f'<option value="{offered}"' in html and f'<option value="{absent}"' not in html


@pytest.mark.django_db
@pytest.mark.parametrize("descending", [True, False], ids=["desc", "asc"])
@pytest.mark.parametrize("pillar, key", COMBOS, ids=[f"{p}-{k}" for p, k in COMBOS])
def test_every_accepted_sort_walks_every_row_once(pillar: str, key: str, descending: bool) -> None:
    ids = seed(pillar)
    sort = HistorySort(key, descending)
    pages = [service.history(pillar, JobFilter(), sort, size=2)]
    while pages[-1].next_token:
        assert len(pages) < MAX_PAGES, "keyset paging does not advance"
        pages.append(service.history(pillar, JobFilter(), sort, after=pages[-1].next_token, size=2))
    seen = [r.id for p in pages for r in p.rows]
    assert len(seen) == len(ids) and set(seen) == set(ids), "a row was skipped or repeated"
    assert [len(p.rows) for p in pages] == [2, 2, 2, 2, 1]
    rows = [r for p in pages for r in p.rows]
    ordered = [(r.sort_value(key), r.id) for r in rows]
    assert [v for v, _ in ordered] == sorted((v for v, _ in ordered), reverse=descending)
    # and back: every page's prev_token gives the page before it
    for i in range(len(pages) - 1, 0, -1):
        assert pages[i].prev_token is not None
        back = service.history(pillar, JobFilter(), sort, before=pages[i].prev_token, size=2)
        assert [r.id for r in back.rows] == [r.id for r in pages[i - 1].rows]
    assert pages[0].prev_token is None
