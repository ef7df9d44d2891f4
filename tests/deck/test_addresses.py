"""Every state of the Deck is a real address: a job's page, the list's filters, refusals shown on the page."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.test import Client

from tests.deck.conftest import HTMX, Jobs, page_refused

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(client_as: Callable[[str], Client]) -> Client:
    return client_as("viewer")


def test_a_job_address_opens_the_page_with_its_inspector(viewer: Client, jobs: Jobs) -> None:
    response = viewer.get(f"/deck/jobs/{jobs.dead}")
    html = response.content.decode()
    assert response.status_code == 200 and 'id="deck-header"' in html
    assert f'id="inspector" class="inspector" data-job-id="{jobs.dead}"' in html


def test_an_unknown_job_address_is_a_404_page_that_says_so(viewer: Client, jobs: Jobs) -> None:
    message = page_refused(viewer.get("/deck/jobs/01NOSUCHJOB00000000000000"), 404, "was not found")
    assert "01NOSUCHJOB00000000000000" in message
    assert "Loading" not in message


def test_a_job_id_outside_the_alphabet_is_a_page_with_a_message(viewer: Client) -> None:
    page_refused(viewer.get("/deck/jobs/a%00b"), 400, "job id")


def test_the_old_job_query_form_redirects_to_the_job_address(viewer: Client, jobs: Jobs) -> None:
    response = viewer.get(f"/deck/?job={jobs.archived}")
    assert response.status_code == 302 and response["Location"] == f"/deck/jobs/{jobs.archived}"


def test_a_partial_address_opened_as_a_page_redirects_to_the_page_address(viewer: Client) -> None:
    response = viewer.get("/deck/partials/jobs?view=dlq&reason=8&q=gateway")
    assert response.status_code == 302
    assert response["Location"] == "/deck/?view=dlq&reason=8&q=gateway"
    assert viewer.get("/deck/partials/stats")["Location"] == "/deck/"


def test_the_filter_form_answer_pushes_the_page_address_not_the_partial(viewer: Client) -> None:
    query = "view=dlq&q=gateway&queue=&type=&reason=8&sort=date&dir=desc&size=100"
    answer = viewer.get(f"/deck/partials/jobs?{query}", HTTP_HX_TRIGGER="jobs-filter", **HTMX)
    assert answer.status_code == 200 and answer["HX-Push-Url"] == f"/deck/?{query}"
    # a live refresh of the matrix (no filter submit) leaves the address bar alone
    assert "HX-Push-Url" not in viewer.get(f"/deck/partials/jobs?{query}", HTTP_HX_TRIGGER="job-matrix", **HTMX)


def test_rows_link_to_their_job_address_and_push_it(viewer: Client, jobs: Jobs) -> None:
    html = viewer.get("/deck/partials/jobs?view=dlq", **HTMX).content.decode()
    assert (f'<a class="job-link" href="/deck/jobs/{jobs.dead}" hx-get="/deck/jobs/{jobs.dead}" '
            f'hx-target="#side-panel" hx-swap="innerHTML" hx-push-url="true"') in html


def test_history_is_never_kept_in_session_storage(viewer: Client) -> None:
    """Back reloads each address from the server (payloads never land in the browser's session storage)."""
    html = viewer.get("/deck/").content.decode()
    assert '"historyCacheSize": 0, "refreshOnHistoryMiss": true' in html


def test_the_editor_has_its_own_address_too(client_as: Callable[[str], Client], jobs: Jobs) -> None:
    operator = client_as("operator")
    inspector = operator.get(f"/deck/jobs/{jobs.dead}", **HTMX).content.decode()
    assert (f'hx-get="/deck/jobs/{jobs.dead}/edit" hx-target="#side-panel" hx-swap="innerHTML" '
            f'hx-push-url="true">EDIT</button>') in inspector
    editor = operator.get(f"/deck/jobs/{jobs.dead}/edit", **HTMX).content.decode()
    assert (f'hx-get="/deck/jobs/{jobs.dead}" hx-target="#side-panel" hx-swap="innerHTML" '
            f'hx-push-url="true">CANCEL</button>') in editor
    page = operator.get(f"/deck/jobs/{jobs.dead}/edit")  # the editor's address reloads to the editor
    assert page.status_code == 200 and 'id="editor-payload"' in page.content.decode()
