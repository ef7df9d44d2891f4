"""Fuzzing the enqueue API and every Deck endpoint: bad input never breaks anything.

* ``api.enqueue`` with random JSON, huge strings, unicode (NUL, lone surrogates, astral planes), nulls,
  wrong types, non-finite and out-of-range numbers: every call either stores the job or raises a
  ``ValueError``/``TypeError`` with a message, and a rejected call leaves every ChokaQ table unchanged
  (row counts and a checksum of the rows, read through the ORM).
* every Deck URL of ``deck/urls.py`` as an admin (every permission): POST commands with random forms
  (and raw, invalid UTF-8 bodies), GET pages/partials with random query strings, path parameters that are
  real ids of every pillar, stale ids or random text. Never a 500; a refused request (4xx) leaves the
  ChokaQ tables unchanged, and a GET never changes them.

The cases tried and the 500s seen are written to ``<VAR_DIR>/reliability/fuzz.json`` (one section per
database vendor) for the reliability report. A 409 conflict is recorded in the operator log by design
(``chokaq_deck_actions``), so that table is not part of the "unchanged" checksum.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import math
import os
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import connection
from django.test import Client
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from chokaq_core import api
from chokaq_core.models import JobsArchive, JobsDLQ, JobsHot, MetricBuckets, Queues, Schedules, StatsSummary, Workers
from tests.deck.conftest import archived, dead, make_user, pending, processing

API_EXAMPLES = int(os.environ.get("CHOKAQ_FUZZ_API_EXAMPLES", "200"))
DECK_EXAMPLES = int(os.environ.get("CHOKAQ_FUZZ_DECK_EXAMPLES", "25"))

TALLY: Counter[str] = Counter()
_SEED = itertools.count()
FAILURES: list[dict[str, Any]] = []

# ---------------------------------------------------------------- table checksums (ORM reads only)

TABLES: tuple[tuple[type, tuple[str, ...]], ...] = (
    (JobsHot, ("id",)), (JobsArchive, ("id",)), (JobsDLQ, ("id",)), (StatsSummary, ("queue",)),
    (MetricBuckets, ("bucket_start", "queue", "outcome", "failure_reason")), (Queues, ("name",)),
    (Workers, ("worker_id",)), (Schedules, ("name",)),
)


def snapshot() -> dict[str, tuple[int, str]]:
    """Per ChokaQ table: (row count, sha256 of every row in key order)."""
    out = {}
    for model, order in TABLES:
        rows = list(model.objects.order_by(*order).values_list())  # type: ignore[attr-defined]
        out[model._meta.db_table] = (len(rows), hashlib.sha256(repr(rows).encode("utf-8", "surrogatepass"))
                                     .hexdigest())
    return out


@pytest.fixture(scope="module", autouse=True)
def _fuzz_summary() -> Iterator[None]:
    """Write the cases tried and the 500s seen for the reliability report once the module is done.

    The tallies are process-wide and never reset here: pytest-django may run this module's tests in two
    groups (database tests apart from the others), so the fixture can be set up and torn down twice."""
    yield
    path = Path(django_settings.VAR_DIR) / "reliability" / "fuzz.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        summary = {}
    summary[connection.vendor] = {
        "at": datetime.now(UTC).isoformat(),
        "cases": sum(v for k, v in TALLY.items() if k.startswith("cases:")),
        "api_cases": TALLY["cases:api"],
        "deck_cases": TALLY["cases:deck"],
        "rejected": TALLY["rejected"],
        "accepted": TALLY["accepted"],
        "server_errors": TALLY["500"],
        "failures": FAILURES[:20],
    }
    path.write_text(json.dumps(summary, indent=2, sort_keys=True))


# ---------------------------------------------------------------- strategies

ANY_CHAR = st.characters(codec=None, exclude_categories=())  # every code point, lone surrogates and NUL included
WEIRD_TEXT = st.one_of(
    st.text(ANY_CHAR, max_size=60),
    st.text(st.sampled_from("\x00\ud800\udfff\U0001f600\u202e\ufeff%_'\"\\<>&;,\n\t "), max_size=20),
    st.integers(0, 3).map(lambda n: "x" * (10 ** (n + 2) + 1)),  # 101 .. 100,001 characters
)
JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                      st.floats(allow_nan=True, allow_infinity=True), WEIRD_TEXT)
JSON = st.recursive(JSON_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(WEIRD_TEXT, inner, max_size=4)),
                    max_leaves=12)
WRONG = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.binary(max_size=8),
                  st.lists(st.integers(), max_size=3), st.builds(object), st.just({"a": 1}), st.just({1, 2}))
TYPES = st.sampled_from(["test.ok.v1", "test.fail.v1", "test.record.v1"])
# names that once steered a Deck URL (path segments), and payload shapes that once exhausted the stack
HOSTILE_NAMES = st.sampled_from(["x/../../metrics", "..", ".", "../../api/dlq/X/purge?", "<img src=x onerror=1>",
                                 "a b", "a%2Fb", "q#x"])


def nested_list(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


class DeepPayload(dict[str, Any]):
    """``{"deep": [[[…]]]}`` nested ``levels`` deep, printed short (hypothesis's printer recurses)."""

    def __init__(self, levels: int) -> None:
        super().__init__(deep=nested_list(levels))
        self.levels = levels

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))

    def __repr__(self) -> str:
        return f"DeepPayload({self.levels})"


DEEP = st.sampled_from([63, 64, 65, 990, 5000])


def text_or_wrong(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(valid, st.none(), WEIRD_TEXT, WRONG)


ENQUEUE_KWARGS = st.fixed_dictionaries({}, optional={
    "queue": text_or_wrong(st.one_of(st.sampled_from(["fz-a", "fz-b"]), HOSTILE_NAMES)),
    "priority": st.one_of(st.integers(-(2**40), 2**40), st.integers(-10, 10), WRONG, WEIRD_TEXT),
    "delay": st.one_of(st.none(), st.floats(), st.integers(-(2**70), 2**70), st.timedeltas(), WRONG, WEIRD_TEXT),
    "run_at": st.one_of(st.none(), st.datetimes(), st.datetimes(timezones=st.just(UTC)), WRONG),
    "idempotency_key": text_or_wrong(st.one_of(st.sampled_from(["fz-k1", "fz-k2"]), HOSTILE_NAMES)),
    "tags": st.one_of(st.none(), WEIRD_TEXT, st.lists(WEIRD_TEXT, max_size=4), st.lists(WRONG, max_size=3)),
    "created_by": text_or_wrong(st.just("fuzzer")),
    "job_id": text_or_wrong(st.one_of(st.just("01FUZZ0000000000000000000A"), HOSTILE_NAMES)),
})
PAYLOADS = st.one_of(st.none(), st.dictionaries(WEIRD_TEXT, JSON, max_size=5), JSON, WRONG,
                     st.dictionaries(st.integers(), st.integers(), min_size=1, max_size=2),
                     st.integers(0, 1).map(lambda n: {"big": "y" * (1_000_000 + n)}),
                     DEEP.map(DeepPayload))


def _accept_or_reject(call: Callable[[], Any]) -> tuple[bool, Any]:
    """Run ``call`` and check the contract: a result, or a ValueError/TypeError with a message and no writes."""
    before = snapshot()
    TALLY["cases:api"] += 1
    try:
        result = call()
    except (ValueError, TypeError) as exc:
        TALLY["rejected"] += 1
        assert str(exc).strip(), f"{type(exc).__name__} without a message"
        assert snapshot() == before, f"a rejected enqueue changed the tables ({type(exc).__name__}: {exc})"
        return False, exc
    except Exception as exc:
        TALLY["500"] += 1
        FAILURES.append({"target": "api.enqueue", "error": f"{type(exc).__name__}: {exc}"[:300]})
        raise AssertionError(f"enqueue raised {type(exc).__name__} (not ValueError/TypeError): {exc}") from exc
    TALLY["accepted"] += 1
    return True, result


SETTINGS = {"deadline": None, "derandomize": False, "print_blob": True,
            "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                      HealthCheck.data_too_large, HealthCheck.large_base_example]}


@settings(max_examples=API_EXAMPLES, **SETTINGS)
@given(type_key=st.one_of(TYPES, WEIRD_TEXT, WRONG, HOSTILE_NAMES), payload=PAYLOADS, kwargs=ENQUEUE_KWARGS)
@example(type_key="test.ok.v1", payload={}, kwargs={"job_id": "x/../../metrics"})
@example(type_key="test.ok.v1", payload={}, kwargs={"queue": "<img src=x onerror=alert(1)>"})
@example(type_key="test.ok.v1", payload=DeepPayload(5000), kwargs={})
@example(type_key="test.ok.v1", payload={}, kwargs={"delay": math.inf})
@example(type_key="test.ok.v1", payload={}, kwargs={"delay": 1e300})
@example(type_key="test.ok.v1", payload={}, kwargs={"delay": timedelta.max})
@example(type_key="test.ok.v1", payload={}, kwargs={"run_at": datetime.max.replace(tzinfo=UTC)})
@example(type_key="test.ok.v1", payload={}, kwargs={"queue": "a\x00b"})
@example(type_key="test.ok.v1\x00", payload={}, kwargs={})
@example(type_key="test.ok.v1", payload={}, kwargs={"idempotency_key": "k\x00", "tags": ["t\x00"]})
@example(type_key="test.ok.v1", payload={}, kwargs={"queue": "\ud800"})
@example(type_key="test.ok.v1", payload={"s": "\ud800"}, kwargs={})
@example(type_key="test.ok.v1", payload={"\x00": "\x00"}, kwargs={})
def test_enqueue_accepts_or_rejects_cleanly(transactional_db: None, type_key: Any, payload: Any,
                                            kwargs: dict[str, Any]) -> None:
    ok, job_id = _accept_or_reject(lambda: api.enqueue(type_key, payload, **kwargs))
    if ok:
        row = JobsHot.objects.filter(id=job_id).values("type", "status").first()
        assert row is not None and row["status"] == 0, "an accepted enqueue stored no Pending row"


@settings(max_examples=max(API_EXAMPLES // 4, 10), **SETTINGS)
@given(items=st.lists(st.one_of(
    st.fixed_dictionaries({"type_key": st.one_of(TYPES, WEIRD_TEXT, WRONG), "payload": PAYLOADS}),
    st.dictionaries(WEIRD_TEXT, JSON, max_size=3), WRONG), max_size=5))
def test_enqueue_many_is_all_or_nothing(transactional_db: None, items: list[Any]) -> None:
    before = JobsHot.objects.count()
    ok, ids = _accept_or_reject(lambda: api.enqueue_many(items))
    if ok:
        assert JobsHot.objects.count() == before + len(set(ids))


# ---------------------------------------------------------------- the Deck

def _quote(text: str) -> str:
    return urllib.parse.quote(text.encode("utf-8", "surrogatepass"), safe="")


HTTP_TEXT = st.one_of(
    st.text(max_size=40),  # any code point a browser can send (no lone surrogates: not UTF-8 encodable)
    st.text(st.sampled_from("\x00\u202e\ufeff%_'\"\\<>&;,\n\t 0123456789-:T"), max_size=20),
    st.sampled_from(["", " ", "0", "-1", "1", "99999999999999999999", "1e9", "nan", "true", "on", "null", "[]",
                     "{}", '{"a": 1}', '{"n":', "2024-02-30", "2024-01-01", "9999-12-31", "0000-00-00"]),
    st.integers(0, 2).map(lambda n: "z" * (10 ** (n + 2) * 2)),
)
def _token(parts: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(parts).encode()).decode().rstrip("=")


HOSTILE_TOKENS = st.sampled_from([
    _token(["date", "0001-01-01T00:00:00+23:59", "x"]), _token(["date", "9999-12-31T23:59:59-23:59", "x"]),
    _token(["date", "2024-01-01T00:00:00+24:00", "x"]), _token(["attempts", 10**30, "x"]),
    _token(["attempts", True, "x"]), _token(["duration", True, "x"]), _token(["duration", 1e308, "x"]),
    _token(["reason", 10**30, "x"]), _token(["id", "a\x00b", "x"]), _token(["date", "2024-01-01T00:00:00+00:00", "\x00"]),
    base64.urlsafe_b64encode(b"[" * 5000).decode(),
])
TOKEN = st.one_of(
    HTTP_TEXT, HOSTILE_TOKENS,
    st.tuples(st.sampled_from(["date", "id", "created", "duration", "attempts", "reason", "queue", "x"]),
              JSON, st.one_of(st.text(max_size=30), WRONG.filter(lambda v: isinstance(v, (int, bool, type(None))))))
    .map(lambda t: base64.urlsafe_b64encode(json.dumps(list(t)).encode()).decode().rstrip("=")),
)
QUERY_KEYS = ("view", "status", "sort", "dir", "size", "after", "before", "queue", "type", "q", "reason", "start",
              "end", "job", "max_jobs", "confirm", "action", "pillar", "range")
CHOICES = {
    "view": ["active", "archive", "dlq", "ARCHIVE", "hot"], "status": ["0", "1", "2", "3", "-1"],
    "sort": ["date", "id", "queue", "type", "created", "worker", "attempts", "duration", "reason", "DROP"],
    "dir": ["asc", "desc", "up"], "size": ["10", "100", "500", "1000", "0", "1001"],
    "reason": ["0", "1", "2", "6", "10", "11", "-1"], "pillar": ["archive", "dlq", "hot"],
    "confirm": ["PURGE", "REQUEUE", "CANCEL", "purge"], "action": ["purge", "requeue", "<script>"],
    "job": ["a/b", "..", "x/../../metrics", "a\x00b", "../../api/dlq/X/purge?"],
    "range": ["5m", "1h", "24h", "7d", "30d", "", "7D"],
}


def _value(key: str) -> st.SearchStrategy[str]:
    strategies = [HTTP_TEXT]
    if key in CHOICES:
        strategies.append(st.sampled_from(CHOICES[key]))
    if key in ("after", "before"):
        strategies.append(TOKEN)
    return st.one_of(*strategies)


def _draw_params(data: st.DataObject, keys: tuple[str, ...]) -> dict[str, Any]:
    chosen = data.draw(st.lists(st.sampled_from(keys), unique=True, max_size=len(keys))) if keys else []
    out: dict[str, Any] = {}
    for key in chosen:
        if data.draw(st.integers(0, 5)) == 0:
            out[key] = data.draw(st.lists(_value(key), min_size=2, max_size=3))
        else:
            out[key] = data.draw(_value(key))
    out.update(data.draw(st.dictionaries(st.text(max_size=8), HTTP_TEXT, max_size=2)))
    return out


EDIT_FIELDS = ("payload", "tags", "priority")
FILTER_FIELDS = ("queue", "type", "q", "reason", "start", "end")
# (name, method, path template, form/query fields); {job}/{name} are filled per example
ENDPOINTS: list[tuple[str, str, str, tuple[str, ...]]] = [
    ("index", "GET", "/deck/", QUERY_KEYS),
    *[(f"partial-{p}", "GET", f"/deck/partials/{p}", QUERY_KEYS)
      for p in ("stats", "queues", "chart", "top-errors", "console", "maintenance", "workers", "breakers", "jobs",
                "recurring")],
    ("partial-unknown", "GET", "/deck/partials/{name}", QUERY_KEYS),
    ("health", "GET", "/deck/health/", ("tags",)),
    ("metrics", "GET", "/deck/metrics", ()),
    ("inspector", "GET", "/deck/jobs/{job}", ()),
    ("editor", "GET", "/deck/jobs/{job}/edit", ()),
    ("cancel-many", "POST", "/deck/api/jobs/bulk/cancel", ("ids",)),
    ("resurrect-many", "POST", "/deck/api/jobs/bulk/resurrect", ("ids",)),
    ("preview-cancel-matching", "POST", "/deck/api/jobs/bulk/cancel-matching/preview", ("q", "queue", "type",
                                                                                        "status")),
    ("cancel-matching", "POST", "/deck/api/jobs/bulk/cancel-matching", ("q", "queue", "type", "status", "confirm")),
    ("cancel", "POST", "/deck/api/jobs/{job}/cancel", ()),
    ("resurrect-plain", "POST", "/deck/api/jobs/{job}/resurrect", ()),
    ("resurrect", "POST", "/deck/api/jobs/{job}/resurrect", EDIT_FIELDS),
    ("edit", "POST", "/deck/api/jobs/{job}/edit", EDIT_FIELDS),
    ("set-priority", "POST", "/deck/api/jobs/{job}/priority", ("priority",)),
    ("purge-archive", "POST", "/deck/api/archive/{job}/purge", ()),
    ("purge-dlq-many", "POST", "/deck/api/dlq/purge", ("ids",)),
    ("preview-dlq-matching", "POST", "/deck/api/dlq/bulk/preview", (*FILTER_FIELDS, "max_jobs", "action")),
    ("purge-dlq-matching", "POST", "/deck/api/dlq/bulk/purge", (*FILTER_FIELDS, "max_jobs", "confirm")),
    ("resurrect-matching", "POST", "/deck/api/dlq/bulk/resurrect", (*FILTER_FIELDS, "max_jobs", "confirm")),
    ("purge-dlq", "POST", "/deck/api/dlq/{job}/purge", ()),
    ("set-queue-paused", "POST", "/deck/api/queues/{name}/pause", ("value",)),
    ("set-queue-active", "POST", "/deck/api/queues/{name}/active", ("value",)),
    ("set-queue-zombie-timeout", "POST", "/deck/api/queues/{name}/zombie-timeout", ("value",)),
    ("set-queue-max-workers", "POST", "/deck/api/queues/{name}/max-workers", ("value",)),
    ("set-rate-limit", "POST", "/deck/api/rate-limits/{name}/rate", ("value",)),
    ("set-rate-limit-new", "POST", "/deck/api/rate-limits", ("name", "value")),
    ("pause-rate-limit", "POST", "/deck/api/rate-limits/{name}/pause", ()),
    ("lift-rate-limit", "POST", "/deck/api/rate-limits/{name}/lift", ()),
    ("set-worker-capacity", "POST", "/deck/api/workers/capacity", ("capacity",)),
    ("close-circuit", "POST", "/deck/api/circuits/close", ("key",)),
    ("open-circuit", "POST", "/deck/api/circuits/open", ("key",)),
    ("set-schedule-enabled", "POST", "/deck/api/schedules/{name}/enabled", ("value",)),
    ("run-schedule-now", "POST", "/deck/api/schedules/{name}/run", ()),
    ("preview-purge-older-than", "POST", "/deck/api/maintenance/preview", ("pillar", "days")),
    ("purge-archive-older-than", "POST", "/deck/api/maintenance/purge-archive", ("days",)),
    ("purge-dlq-older-than", "POST", "/deck/api/maintenance/purge-dlq", ("days",)),
]
CHOICES.update({"value": ["1", "0", "true", "off", "60", "86400", "86401", "10000", "10001", "100/m", "0/m",
                          "50/s burst 10", "10/0s", "-1/m", "1/d", "", "9" * 30 + "/s"],
                "name": ["queue:main", "type:test.ok.v1", "host:x", "queue:", "type:<b>", ""],
                "days": ["1", "365", "0", "366", "-5"], "capacity": ["0", "1", "100", "101"],
                "priority": ["0", "10", "1000000", "1000001", "-1"],
                "payload": ['{"n": 2}', "[]", "{}", '{"n": NaN}', '{"\\u0000": "\\u0000"}', "   ",
                            '{"x": ' + "[" * 64 + "]" * 64 + "}", '{"x": ' + "[" * 5000 + "]" * 5000 + "}",
                            "[" * 200_000],
                "max_jobs": ["1", "1000", "1001", "0", "-3", "2147483648", "99999999999999999999"],
                "key": ["demo.payment.capture.v1", "a/b", "..", "<img src=x onerror=1>", "x" * 300]})


def test_every_deck_url_is_fuzzed() -> None:
    from django.urls import get_resolver

    named = {p.name for p in get_resolver("deck.urls").url_patterns if p.name not in ("login", "logout")}
    covered = {name for name, *_ in ENDPOINTS} | {"partial"}
    assert named <= covered, f"Deck URLs the fuzzer does not drive: {sorted(named - covered)}"


@pytest.fixture
def admin_client(transactional_db: None) -> Client:
    call_command("chokaq_roles", verbosity=0)
    client = Client()
    client.force_login(make_user("admin"))  # type: ignore[arg-type]
    return client


def _ensure_jobs() -> dict[str, list[str]]:
    """Real ids of every pillar (refilled when a fuzzed command emptied one; fresh queues, so a claim takes
    exactly the new rows even after the fuzzer requeued old ones)."""
    n = next(_SEED)
    if not JobsHot.objects.filter(status=0).exists():
        pending("main", 2)
    if not JobsHot.objects.filter(status=2).exists():
        processing(f"busy-{n}")
    if not JobsArchive.objects.exists():
        archived(f"done-{n}")
    if not JobsDLQ.objects.exists():
        dead(f"failing-{n}", 2)
    return {"hot": list(JobsHot.objects.values_list("id", flat=True)[:5]),
            "archive": list(JobsArchive.objects.values_list("id", flat=True)[:5]),
            "dlq": list(JobsDLQ.objects.values_list("id", flat=True)[:5])}


def _path_value(data: st.DataObject, real: list[str]) -> str:
    kind = data.draw(st.sampled_from(["real", "stale", "text"]))
    index = data.draw(st.integers(0, 15))  # drawn always: the ids differ between runs, the draws must not
    if kind == "real" and real:
        return real[index % len(real)]
    if kind == "stale":
        return "01STALE0000000000000000000"
    return data.draw(st.one_of(st.text(ANY_CHAR, min_size=1, max_size=60), HTTP_TEXT.filter(bool), HOSTILE_NAMES))


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=[e[0] for e in ENDPOINTS])
@settings(max_examples=DECK_EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_deck_endpoint_never_500(admin_client: Client, endpoint: tuple[str, str, str, tuple[str, ...]],
                                 data: st.DataObject) -> None:
    name, method, template, keys = endpoint
    ids = _ensure_jobs()
    real = ids["hot"] + ids["archive"] + ids["dlq"]
    path = template.format(job=_quote(_path_value(data, real)),
                           name=_quote(_path_value(data, ["main", "busy", "failing", "stats", "queue:main",
                                                          "type:test.ok.v1"])))
    htmx = {"HTTP_HX_REQUEST": "true"} if data.draw(st.booleans()) else {}
    raw_body = method == "POST" and data.draw(st.integers(0, 7)) == 0
    json_body = method == "POST" and "payload" in keys and not raw_body and data.draw(st.integers(0, 3)) == 0
    if raw_body:  # bytes no browser form would send: invalid UTF-8, stray separators
        body = data.draw(st.binary(max_size=200))
        form: Any = body
    elif json_body:  # the editor's JSON body: fields, or any JSON text (deep nesting included)
        form = data.draw(st.one_of(st.builds(json.dumps, st.fixed_dictionaries({}, optional={
            k: _value(k) for k in EDIT_FIELDS})), JSON.map(lambda v: json.dumps(v, allow_nan=True)),
            DEEP.map(lambda n: "[" * n + "]" * n), st.sampled_from(["[" * 200_000, "{", ""])))
    else:
        form = _draw_params(data, keys)
        if "ids" in keys and data.draw(st.booleans()):
            form["ids"] = [real[v % len(real)] if isinstance(v, int) else v for v in
                           data.draw(st.lists(st.one_of(st.integers(0, 15), HTTP_TEXT), min_size=1, max_size=4))]
    before = snapshot()
    TALLY["cases:deck"] += 1
    try:
        if method == "GET":
            response = admin_client.get(path, form, **htmx)
        elif raw_body:
            response = admin_client.post(path, form, content_type="application/x-www-form-urlencoded", **htmx)
        elif json_body:
            response = admin_client.post(path, form, content_type="application/json", **htmx)
        else:
            response = admin_client.post(path, form, **htmx)
    except Exception as exc:
        TALLY["500"] += 1
        FAILURES.append({"target": f"{method} {template}", "path": path[:200], "form": repr(form)[:300],
                         "error": f"{type(exc).__name__}: {exc}"[:300]})
        raise
    status = response.status_code
    if name == "health" and status == 503:
        status = 200  # Unhealthy (no worker in this test) is the health contract's answer, not a server error
    if status >= 500:
        TALLY["500"] += 1
        FAILURES.append({"target": f"{method} {template}", "path": path[:200], "form": repr(form)[:300],
                         "status": status})
    assert status < 500, f"{method} {path} {form!r} answered {status}"
    if status >= 400 or method == "GET":
        TALLY["rejected" if status >= 400 else "accepted"] += 1
        assert snapshot() == before, f"{method} {path} ({status}) changed the ChokaQ tables"
    else:
        TALLY["accepted"] += 1


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/deck/api/jobs/%00/cancel"), ("GET", "/deck/jobs/%00"), ("POST", "/deck/api/queues/a%00b/pause"),
])
def test_nul_in_a_path_parameter_is_a_400(admin_client: Client, method: str, path: str) -> None:
    """Regression (fuzz, PostgreSQL): a NUL in a job id or queue name reached the database and was a 500."""
    before = snapshot()
    response = admin_client.generic(method, path, "value=1", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 400, response.content
    assert snapshot() == before


# ---------------------------------------------------------------- the websocket

WS_FRAMES = st.one_of(
    st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    JSON.map(lambda v: json.dumps(v, allow_nan=True)),
    st.sampled_from(["[" * 200_000, "{" * 100_000, '{"type": ' * 50_000, '{"type": "ping"', "null", "[]", '"ping"',
                     '{"type": ["ping"]}', '{"type": "cancel", "ids": ["x/../../metrics"]}']),
    DEEP.map(lambda n: "[" * n + "]" * n),
)


@settings(max_examples=max(DECK_EXAMPLES // 3, 5), **SETTINGS)
@given(frames=st.lists(WS_FRAMES, min_size=1, max_size=8))
def test_websocket_survives_any_frame(admin_client: Client, frames: list[str]) -> None:
    """The push-only socket ignores whatever a client sends (deep JSON included) and still answers a ping."""
    import asyncio

    from channels.testing import WebsocketCommunicator

    from deck.consumers import DeckConsumer

    user = make_user("admin")

    async def scenario() -> None:
        socket = WebsocketCommunicator(DeckConsumer.as_asgi(), "/ws/deck/")
        socket.scope["user"] = user
        connected, _ = await socket.connect(timeout=5)
        assert connected
        for frame in frames:
            await socket.send_to(text_data=frame or " ")  # the test communicator refuses an empty frame
        await socket.send_to(text_data='{"type": "ping"}')
        while True:
            message = await socket.receive_output(timeout=5)
            if message.get("type") == "websocket.close":
                raise AssertionError(f"the socket closed with {message.get('code')}")
            if message.get("text") == '{"type": "pong"}':
                break
        await socket.disconnect()

    TALLY["cases:websocket"] += 1
    asyncio.run(scenario())
