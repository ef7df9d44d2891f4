"""Names as path segments, no queue created as a side effect, no 500 for hostile shapes, an audit of every job.

Each case reproduces a finding of the security review: a job id or queue name that steered a URL, a Deck
setting that created a queue, inputs that were 500s (cursor values, deep payloads, NUL), payloads the editor
could not save, bulk actions whose audit named only some of the jobs.
"""

from __future__ import annotations

import base64
import json
import re
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

import chokaq_core
from chokaq_core import storage
from chokaq_core.domain import NewJob, new_ulid
from chokaq_core.models import JobsDLQ, JobsHot, Queues
from deck.models import OperatorAction
from tests.deck.conftest import HTMX, Jobs, archived, dead, make_user, page_refused, pending
from tests.deck.test_authorization import snapshot

pytestmark = pytest.mark.django_db
DECK = Path(__file__).resolve().parents[2] / "deck"


@pytest.fixture
def admin(client_as: Callable[[str], Client]) -> Client:
    return client_as("admin")


def refused(response: Any, status: int = 400, text: str = "") -> str:
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert body["ok"] is False and body["error"]
    assert text.lower() in body["error"].lower(), body["error"]
    return str(body["error"])


def stored(job_id: str, queue: str = "main", payload: str = '{"n": 1}') -> str:
    """A row written straight through storage, as rows written before the alphabet existed were."""
    return storage.enqueue([NewJob(job_id, queue, "test.ok.v1", payload)])[0]


# ---------------------------------------------------------------- ids and names are path segments


@pytest.mark.parametrize("job_id", ["x/../../metrics", "../../api/dlq/01ABC/purge?", "a b", "<i>", ".."])
def test_enqueue_refuses_an_id_that_is_no_path_segment_and_writes_nothing(job_id: str) -> None:
    before = snapshot()
    with pytest.raises(ValueError, match="job id must"):
        chokaq_core.enqueue("test.ok.v1", {}, job_id=job_id)
    with pytest.raises(ValueError, match="job id must"):
        chokaq_core.enqueue_many([{"type_key": "test.ok.v1", "job_id": "fine-1"},
                                  {"type_key": "test.ok.v1", "job_id": job_id}])
    assert snapshot() == before


def test_service_resurrect_and_edit_refuse_a_hostile_id(jobs: Jobs) -> None:
    from chokaq_core import service

    before = snapshot()
    for call in (service.resurrect, service.edit):
        with pytest.raises(ValueError, match="job id must"):
            call("../../api/dlq/x/purge?", actor="ops", payload='{"n": 2}')
    assert snapshot() == before


def test_a_schedule_name_outside_the_key_alphabet_is_a_settings_error() -> None:
    from chokaq_core.conf import schedule_entry_errors

    assert schedule_entry_errors("nightly-report.v1", {"CRON": "0 3 * * *", "TYPE": "test.ok.v1"}) == []
    assert "idempotency keys" in schedule_entry_errors("nightly report", {"CRON": "0 3 * * *", "TYPE": "t"})[0]


def test_enqueue_refuses_a_queue_name_with_markup() -> None:
    before = snapshot()
    with pytest.raises(ValueError, match="queue must"):
        chokaq_core.enqueue("test.ok.v1", {}, queue="<img src=x onerror=alert(1)>")
    assert snapshot() == before


@pytest.mark.parametrize("url", [
    "/deck/api/jobs/a%20b/cancel", "/deck/api/jobs/..%3F/resurrect", "/deck/api/jobs/%3Cb%3E/resurrect",
    "/deck/api/jobs/a%3Fb/edit", "/deck/api/dlq/%2E%2E/purge", "/deck/api/queues/a%3Cb/pause",
    "/deck/api/queues/../x/pause",
])
def test_deck_commands_refuse_ids_and_names_outside_the_alphabet(admin: Client, jobs: Jobs, url: str) -> None:
    before = snapshot()
    response = admin.post(url, {"payload": '{"n": 2}', "value": "1"}, **HTMX)
    assert response.status_code in (400, 404), response.status_code
    if response.status_code == 400:
        refused(response, 400, "must")
    assert snapshot() == before


def test_bulk_ids_outside_the_alphabet_are_refused(admin: Client, jobs: Jobs) -> None:
    before = snapshot()
    refused(admin.post("/deck/api/dlq/purge", {"ids": f"{jobs.dead},../x"}), 400, "job id must")
    assert snapshot() == before


def test_job_query_parameter_with_a_slash_is_a_400(admin: Client) -> None:
    page_refused(admin.get("/deck/?job=a/b"), 400, "job id")


def test_rows_of_ids_stored_before_the_alphabet_build_no_url(admin: Client) -> None:
    """A hostile id already in the table renders escaped and inert: no hx-get/hx-post is built from it."""
    evil = stored("x/../../metrics")
    good = pending("main")[0]
    html = admin.get("/deck/partials/jobs?view=active", **HTMX).content.decode()
    assert f'hx-get="/deck/jobs/{good}"' in html
    assert f'hx-post="/deck/api/jobs/{good}/cancel"' in html
    row = re.search(r'<tr id="job-x/\.\./\.\./metrics".*?</tr>', html, re.S)
    assert row is not None, "the stored row is still listed"
    assert "hx-get" not in row.group(0) and "hx-post" not in row.group(0)
    assert evil


def test_queue_panel_builds_no_url_from_a_hostile_queue_name(admin: Client) -> None:
    Queues.objects.create(name="<img src=x onerror=alert(1)>")
    Queues.objects.create(name="../../api/dlq/X/purge")
    html = admin.get("/deck/partials/queues", **HTMX).content.decode()
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "/deck/api/queues/../" not in html and "api/queues/%3Cimg" not in html


URL_ATTRIBUTE = re.compile(r'(?:hx-(?:get|post|put|delete|patch)|href|action|ws-connect|src)="([^"]*)"')


def concatenated_paths(text: str) -> list[str]:
    """URL attributes whose path (before ``?``) pastes in a template value: ``"{% deck_root %}jobs/{{ id }}"``.
    A reversed URL held in a variable (``{{ jobs_url }}?view=…``) and ``urlencode``d query values are fine."""
    found = []
    for attr in URL_ATTRIBUTE.finditer(text):
        path = attr.group(1).split("?", 1)[0]
        if "{{" in path and not re.fullmatch(r"\{\{\s*jobs_url\s*\}\}", path):
            found.append(attr.group(0))
    return found


def test_no_template_concatenates_a_value_into_a_url_path() -> None:
    """URLs are reversed with arguments ({% url %}), never pasted together from ids or names."""
    offenders = [f"{path.name}: {hit}" for path in sorted((DECK / "templates" / "deck").glob("*.html"))
                 for hit in concatenated_paths(path.read_text())]
    assert not offenders, "URL paths built by concatenation:\n" + "\n".join(offenders)


def js_concatenations(script: str) -> list[str]:
    """Lines of a script that glue a string starting with ``/`` to something, without encodeURIComponent."""
    return [line.strip() for line in script.splitlines()
            if re.search(r"""(["'])/[^"']*\1\s*\+|\+\s*["']/""", line) and "encodeURIComponent" not in line]


def test_deck_script_builds_no_url_by_concatenation() -> None:
    offenders = js_concatenations((DECK / "static" / "deck" / "deck.js").read_text())
    assert not offenders, "URLs built by concatenation in deck.js:\n" + "\n".join(offenders)


def test_the_concatenation_checks_catch_the_old_markup() -> None:
    """The greps above would have caught the row markup the review exploited, and a script doing the same."""
    old = '<tr hx-get="{% deck_root %}jobs/{{ id }}" hx-post="{% deck_root %}api/jobs/{{ id }}/cancel">'
    assert len(concatenated_paths(old)) == 2
    assert concatenated_paths('<a hx-get="{{ jobs_url }}?view={{ view }}" href="{% url \'deck:job\' id %}">') == []
    assert js_concatenations('htmx.ajax("GET", "/deck/jobs/" + id);') and not js_concatenations(
        'htmx.ajax("GET", root + encodeURIComponent(id));')


# ---------------------------------------------------------------- no queue created as a side effect


@pytest.mark.parametrize("setting, value", [("max-workers", "5"), ("zombie-timeout", "120"), ("pause", "1"),
                                            ("active", "0")])
def test_settings_of_an_unknown_queue_are_a_404_and_create_nothing(admin: Client, setting: str, value: str) -> None:
    before = snapshot()
    refused(admin.post(f"/deck/api/queues/no-such-queue/{setting}", {"value": value}, **HTMX), 404,
            "does not exist")
    assert not Queues.objects.filter(name="no-such-queue").exists()
    assert snapshot() == before


def test_settings_of_a_known_queue_still_apply(admin: Client, jobs: Jobs) -> None:
    assert admin.post("/deck/api/queues/main/max-workers", {"value": "5"}).status_code == 200
    assert admin.post("/deck/api/queues/main/zombie-timeout", {"value": "120"}).status_code == 200
    row = Queues.objects.get(name="main")
    assert (row.max_workers, row.zombie_timeout_seconds) == (5, 120)


def test_metrics_label_values_carry_no_markup(client: Client) -> None:
    Queues.objects.create(name="<img src=x onerror=alert(1)>")
    stored("legacy-1", queue='<img src=x onerror="alert(1)">')
    body = client.get("/deck/metrics").content.decode()
    assert "chokaq_queue_depth" in body
    assert "<" not in body and ">" not in body


# ---------------------------------------------------------------- no 500s


def token(*parts: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(parts)).encode()).decode().rstrip("=")


@pytest.mark.parametrize("query, text", [
    ("view=archive&after=" + token("date", "0001-01-01T00:00:00+23:59", "x"), "page key"),
    ("view=archive&after=" + token("date", "9999-12-31T23:59:59-23:59", "x"), "page key"),
    ("view=archive&after=" + token("date", "2024-01-01T00:00:00+24:00", "x"), "page key"),
    ("view=archive&sort=attempts&after=" + token("attempts", 10**30, "x"), "page key"),
    ("view=archive&sort=attempts&after=" + token("attempts", True, "x"), "page key"),
    ("view=archive&sort=duration&after=" + token("duration", True, "x"), "page key"),
    ("view=archive&sort=duration&after=" + token("duration", 10**400, "x"), "page key"),
    ("view=dlq&sort=reason&after=" + token("reason", 10**30, "x"), "page key"),
    ("view=archive&sort=id&after=" + token("id", "a\x00b", "x"), "page key"),
    ("view=archive&after=" + token("date", "2024-01-01T00:00:00+00:00", "x\x00y"), "page key"),
    ("view=archive&sort=queue&before=" + token("queue", "q", "\x00"), "page key"),
    ("job=a/b", "job id"),
    ("job=a%00b", "job id"),
])
def test_hostile_queries_are_400_not_500(admin: Client, jobs: Jobs, query: str, text: str) -> None:
    archived("done", 2)
    before = snapshot()
    page_refused(admin.get(f"/deck/?{query}"), 400, text)
    if "view=" in query:
        refused(admin.get(f"/deck/partials/jobs?{query}", **HTMX), 400, text)
    assert snapshot() == before


def deep_text(levels: int) -> str:
    return '{"x": ' + "[" * (levels - 1) + "]" * (levels - 1) + "}"


@pytest.mark.parametrize("action", ["edit", "resurrect"])
@pytest.mark.parametrize("levels", [65, 5000])
def test_deep_payload_edits_are_400(admin: Client, jobs: Jobs, action: str, levels: int) -> None:
    target = jobs.dead if action != "edit" else jobs.pending
    before = snapshot()
    refused(admin.post(f"/deck/api/jobs/{target}/{action}", {"payload": deep_text(levels)}, **HTMX), 400,
            "nests")
    assert snapshot() == before


def test_a_job_already_holding_a_deep_payload_still_renders(admin: Client) -> None:
    """990 levels were accepted before the depth limit; inspector, editor and history must still render."""
    job_id = stored("deep-hot", payload=deep_text(990))
    OperatorAction.objects.create(actor="ops", command="edit", job_id=job_id, message="saved",
                                  previous_payload=deep_text(990), new_payload=deep_text(990))
    for url in (f"/deck/jobs/{job_id}", f"/deck/jobs/{job_id}/edit", f"/deck/?job={job_id}"):
        response = admin.get(url, follow=True, **(HTMX if "?" not in url else {}))
        assert response.status_code == 200, (url, response.status_code)
        assert "[[[[" in response.content.decode()


def test_a_deep_payload_job_can_be_cancelled(admin: Client) -> None:
    job_id = stored("deep-cancel", payload=deep_text(990))
    assert admin.post(f"/deck/api/jobs/{job_id}/cancel", **HTMX).status_code == 204


@pytest.mark.parametrize("payload", [
    {"s": "é" * ((999_988 - 8) // 2)},  # 999,988 bytes of UTF-8 JSON
    {"s": "&" * (900_007 - 8)},  # 900,007 bytes of ASCII JSON ("&" is 3 bytes form-encoded)
])
def test_the_editor_saves_every_payload_the_envelope_allows(admin: Client, payload: dict[str, str]) -> None:
    job_id = pending("main")[0]
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    assert len(text.encode()) <= 1_000_000
    response = admin.post(f"/deck/api/jobs/{job_id}/edit", json.dumps({"payload": text, "tags": "", "priority": "10"}),
                          content_type="application/json", **HTMX)
    assert response.status_code == 200, response.content[:300]
    assert json.loads(JobsHot.objects.get(id=job_id).payload) == payload


def test_an_oversized_form_post_gets_the_json_refusal_not_an_html_page(admin: Client) -> None:
    """Form encoding inflates a 999,988-byte payload of "é" sixfold past Django's 2.5 MB cap."""
    job_id = pending("main")[0]
    before = snapshot()
    payload = json.dumps({"s": "é" * 499_990}, ensure_ascii=False)
    body = urllib.parse.urlencode({"payload": payload})  # what htmx sends for a form: about 6 MB
    refused(admin.post(f"/deck/api/jobs/{job_id}/edit", body, content_type="application/x-www-form-urlencoded",
                       **HTMX), 400, "too large")
    assert snapshot() == before


def test_an_oversized_json_edit_gets_the_json_refusal(admin: Client) -> None:
    job_id = pending("main")[0]
    before = snapshot()
    too_long = json.dumps({"payload": json.dumps({"s": '"' * 3_000_000})})
    refused(admin.post(f"/deck/api/jobs/{job_id}/edit", too_long, content_type="application/json", **HTMX), 400,
            "at most 4000000 characters")
    too_big = json.dumps({"payload": "x" * 17_000_000})
    refused(admin.post(f"/deck/api/jobs/{job_id}/edit", too_big, content_type="application/json", **HTMX), 400,
            "the limit is")
    refused(admin.post(f"/deck/api/jobs/{job_id}/edit", "{not json", content_type="application/json", **HTMX),
            400, "json")
    refused(admin.post(f"/deck/api/jobs/{job_id}/edit", "[1]", content_type="application/json", **HTMX),
            400, "object")
    assert snapshot() == before


# ---------------------------------------------------------------- audit of every affected job


def history_commands(client: Client, job_id: str) -> str:
    return client.get(f"/deck/jobs/{job_id}", **HTMX).content.decode()


@pytest.mark.parametrize("url, command", [
    ("/deck/api/dlq/purge", "purge_dlq_many"), ("/deck/api/jobs/bulk/resurrect", "resurrect_many"),
])
def test_bulk_actions_record_every_affected_job(admin: Client, url: str, command: str) -> None:
    ids = dead("failing", 60)
    response = admin.post(url, {"ids": ",".join([*ids, "NOT-THERE"])})
    assert response.status_code == 200 and response.json()["affected"] == 60
    audited = set(OperatorAction.objects.filter(command=command).values_list("job_id", flat=True))
    assert audited >= set(ids) and "NOT-THERE" not in audited
    if command == "resurrect_many":
        assert command in history_commands(admin, ids[-1])


def test_bulk_cancel_records_every_affected_job(admin: Client) -> None:
    ids = pending("main", 45)
    assert admin.post("/deck/api/jobs/bulk/cancel", {"ids": ids}).json()["affected"] == 45
    assert set(OperatorAction.objects.filter(command="cancel_many").values_list("job_id", flat=True)) >= set(ids)
    assert "cancel_many" in history_commands(admin, ids[0])


@pytest.mark.parametrize("url, token_word, command", [
    ("/deck/api/dlq/bulk/purge", "PURGE", "purge_dlq_matching"),
    ("/deck/api/dlq/bulk/resurrect", "REQUEUE", "resurrect_matching"),
])
def test_bulk_by_filter_records_every_affected_job(admin: Client, url: str, token_word: str, command: str) -> None:
    ids = dead("filtered", 40)
    other = dead("untouched", 1)
    response = admin.post(url, {"queue": "filtered", "max_jobs": "1000", "confirm": token_word})
    assert response.status_code == 200 and response.json()["affected"] == 40
    audited = set(OperatorAction.objects.filter(command=command).values_list("job_id", flat=True))
    assert audited >= set(ids) and other[0] not in audited
    assert JobsDLQ.objects.filter(id=other[0]).exists()


def test_a_tags_only_edit_records_before_and_after(admin: Client) -> None:
    job_id = pending("main", tags="red,blue")[0]
    assert admin.post(f"/deck/api/jobs/{job_id}/edit", {"tags": "green"}, **HTMX).status_code == 200
    entry = OperatorAction.objects.get(command="edit", job_id=job_id)
    assert "red,blue" in entry.message and "green" in entry.message
    assert "red,blue" in history_commands(admin, job_id)


def test_a_resurrect_with_new_tags_records_before_and_after(admin: Client) -> None:
    job_id = dead("failing", tags="old")[0]
    assert admin.post(f"/deck/api/jobs/{job_id}/resurrect", {"tags": "new"}).status_code == 200
    entry = OperatorAction.objects.get(command="resurrect", job_id=job_id)
    assert "old" in entry.message and "new" in entry.message


def test_ids_of_new_jobs_stay_valid() -> None:
    assert JobsHot.objects.filter(id=chokaq_core.enqueue("test.ok.v1", {}, job_id=f"ok-{new_ulid()}")).exists()


def test_bulk_member_entries_stay_out_of_the_console(admin: Client) -> None:
    ids = dead("failing", 30)
    assert admin.post("/deck/api/jobs/bulk/resurrect", {"ids": ids}).status_code == 200
    html = admin.get("/deck/partials/console", **HTMX).content.decode()
    assert html.count("Requeued 30 of 30") == 1


@pytest.mark.django_db(transaction=True)
def test_a_websocket_frame_nested_200k_levels_is_ignored(live_settings: Any, roles: None) -> None:
    from tests.deck.conftest import run
    from tests.deck.test_consumer import connected, frames_until

    user = make_user("admin")
    assert user is not None

    async def scenario() -> None:
        socket = await connected(user)
        await socket.send_to(text_data="[" * 200_000)
        await socket.send_to(text_data='{"type": "ping"}')
        frame, _ = await frames_until(socket, lambda f: '"pong"' in f, 5)
        assert frame == '{"type": "pong"}', "the consumer died on a deep frame"
        await socket.disconnect()

    run(scenario())


# ---------------------------------------------------------------- no secret in debug pages, logs, health


SECRET_PW = "s3cret" + "-pw"  # joined at run time: a debug page also shows the source lines around a frame
SECRET_URL = f"redis://:{SECRET_PW}@cache.internal:6379/0"


def test_health_masks_a_password_in_a_failing_check(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> list[Any]:
        raise ConnectionError(f"Error connecting to {SECRET_URL}")

    monkeypatch.setattr(storage, "list_workers", broken)
    body = client.get("/deck/health/").content.decode()
    assert "cache.internal" in body and SECRET_PW not in body and ":***@" in body


def test_a_debug_page_masks_url_passwords_in_settings_and_frames(settings: Any, rf: Any) -> None:
    import sys

    from django.views.debug import technical_500_response

    settings.DEBUG = True
    settings.REDIS_URL = SECRET_URL
    settings.CHANNEL_LAYERS = {"default": {"CONFIG": {"hosts": [SECRET_URL]}}}
    connection_url = SECRET_URL  # a frame variable holding the URL
    try:
        raise RuntimeError(f"cannot reach {connection_url}")
    except RuntimeError:
        html = technical_500_response(rf.get("/deck/"), *sys.exc_info()).content.decode()
    assert "REDIS_URL" in html and "cache.internal" in html
    assert SECRET_PW not in html


def test_logs_mask_url_passwords(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from chokaq_core.redaction import CredentialMaskingLogFilter

    logger = logging.getLogger("chokaq.test.redaction")
    logger.addFilter(CredentialMaskingLogFilter())
    try:
        with caplog.at_level(logging.INFO, logger="chokaq.test.redaction"):
            logger.info("connecting to %s", SECRET_URL)
            try:
                raise ConnectionError(SECRET_URL)
            except ConnectionError:
                logger.exception("lost %s", "postgres://app:db-pw@db/x")
    finally:
        logger.filters.clear()
    text = caplog.text + "".join(r.exc_text or "" for r in caplog.records)
    assert "cache.internal" in text and SECRET_PW not in text and "db-pw" not in text
