"""Enqueue envelope validation (spec 03 §9) without a database: every bad input is refused with a clear message."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import time
import uuid

import pytest

from chokaq_core.api import EnqueueOptions, build, serialize_payload
from chokaq_core.api import job as register_job
from chokaq_core.domain import EnvelopeError, UnknownJobTypeError, new_ulid
from chokaq_core.handlers import get_definition


def opts(**kwargs: object) -> EnqueueOptions:
    kwargs.setdefault("type_key", "test.ok.v1")
    return EnqueueOptions(**kwargs)  # type: ignore[arg-type]


def test_registered_job_defaults_come_from_the_decorator() -> None:
    job = build(opts(type_key="demo.email.send.v1", payload={"to": "a@b.c", "subject": "x"}))
    assert job.queue == "emails" and job.priority == 10 and job.delay_seconds is None
    assert json.loads(job.payload) == {"to": "a@b.c", "subject": "x"}
    assert len(job.id) == 26


def test_unknown_type_is_refused_naming_the_key() -> None:
    with pytest.raises(UnknownJobTypeError, match=r"nope\.v1") as info:
        build(opts(type_key="nope.v1"))
    assert isinstance(info.value, ValueError)


def test_unknown_type_allowed_with_explicit_opt_out() -> None:
    job = build(opts(type_key="other.service.v1", allow_unregistered=True))
    assert job.type == "other.service.v1" and job.queue == "default"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"type_key": ""}, "type key must not be blank"),
        ({"type_key": "x" * 256, "allow_unregistered": True}, "type key is 256 characters; the limit is 255"),
        ({"queue": "  "}, "queue must not be blank"),
        ({"queue": "q" * 256}, "limit is 255"),
        ({"created_by": "c" * 101}, "created_by is 101 characters; the limit is 100"),
        ({"idempotency_key": "k" * 256}, "idempotency key is 256 characters"),
        ({"tags": ["t" * 600, "u" * 600]}, "the limit is 1000"),
        ({"tags": ["a,b"]}, "must not contain a comma"),
        ({"job_id": "i" * 51}, "job id is 51 characters; the limit is 50"),
        ({"priority": 10**9}, "priority must be within"),
    ],
)
def test_envelope_limits(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(EnvelopeError, match=message):
        build(opts(**kwargs))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"priority": "high"}, "priority must be an int"),
        ({"priority": True}, "priority must be an int"),
        ({"queue": 5}, "queue must be a string"),
        ({"delay": "soon"}, "delay must be a timedelta or seconds"),
        ({"run_at": dt.datetime(2030, 1, 1)}, "aware datetime"),
        ({"payload": ["not", "a", "mapping"]}, "payload must be a mapping"),
        ({"tags": [1, 2]}, "tags must be strings"),
    ],
)
def test_wrong_types_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        build(opts(**kwargs))


def test_negative_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        build(opts(delay=-1))
    with pytest.raises(ValueError, match="either delay or run_at"):
        build(opts(delay=1, run_at=dt.datetime.now(dt.UTC)))


def test_blank_idempotency_key_means_none_and_keys_are_trimmed() -> None:
    assert build(opts(idempotency_key="   ")).idempotency_key is None
    assert build(opts(idempotency_key="  k1 ")).idempotency_key == "k1"


def test_tags_are_joined_and_trimmed() -> None:
    assert build(opts(tags=[" a ", "b", ""])).tags == "a,b"
    assert build(opts(tags="x, y")).tags == "x,y"
    assert build(opts(tags=[])).tags is None


def test_delay_and_run_at() -> None:
    assert build(opts(delay=dt.timedelta(minutes=5))).delay_seconds == 300
    run_at = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    assert 3590 < (build(opts(run_at=run_at)).delay_seconds or 0) <= 3600


def test_unserialisable_field_is_named() -> None:
    with pytest.raises(TypeError, match=r"payload field 'user\.avatar' is not JSON-serialisable"):
        serialize_payload({"user": {"name": "x", "avatar": object()}})
    with pytest.raises(TypeError, match=r"payload field 'items\[1\]'"):
        serialize_payload({"items": [1, {1, 2}]})
    with pytest.raises(TypeError, match="payload field 'ratio'"):
        serialize_payload({"ratio": float("nan")})
    with pytest.raises(TypeError, match="field names must be strings"):
        serialize_payload({1: "x"})  # type: ignore[dict-item]


def test_django_types_serialise() -> None:
    text = serialize_payload({"when": dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "d": decimal.Decimal("1.5"),
                              "u": uuid.UUID(int=0), "s": "ünïcødé"})
    assert json.loads(text) == {"when": "2026-01-01T00:00:00Z", "d": "1.5",
                                "u": "00000000-0000-0000-0000-000000000000", "s": "ünïcødé"}


def test_oversized_payload_names_the_limit(settings: object) -> None:
    with pytest.raises(EnvelopeError, match="the limit is 1000000 bytes"):
        serialize_payload({"blob": "x" * 1_000_000})
    assert serialize_payload({"blob": "x" * 999_000})


def test_ulids_are_unique_sortable_and_crockford() -> None:
    ids = [new_ulid() for _ in range(5000)]
    assert len(set(ids)) == 5000
    assert ids == sorted(ids)
    assert all(len(i) == 26 and set(i) <= set("0123456789ABCDEFGHJKMNPQRSTVWXYZ") for i in ids)


def test_a_ulid_spells_its_48_bit_millisecond_time_then_80_random_bits() -> None:
    before = time.time_ns() // 1_000_000
    ulid = new_ulid()
    after = time.time_ns() // 1_000_000
    value = 0
    for char in ulid:  # Crockford base32, five bits per character, most significant first
        value = value * 32 + "0123456789ABCDEFGHJKMNPQRSTVWXYZ".index(char)
    assert value < 2**128 and ulid[0] in "01234567"  # 26 characters hold 130 bits: the top two are zero
    assert before <= value >> 80 <= after
    assert new_ulid() > ulid


def _spelled(ms: int, random_bits: int) -> str:
    """A ULID spelled five bits at a time, most significant first (the definition, not the engine's table)."""
    value = ms << 80 | random_bits
    return "".join("0123456789ABCDEFGHJKMNPQRSTVWXYZ"[value >> 5 * (25 - i) & 31] for i in range(26))


@pytest.mark.parametrize(("last_random", "count"), [
    (1020, 10), (1023, 1), (2**20 - 3, 2000), (2**70 - 5, 3000), (2**80 - 1500, 1000), (2**80 - 2, 1), (0, 1024),
])
def test_a_batch_of_ulids_is_spelled_exactly_across_every_carry(monkeypatch: pytest.MonkeyPatch, last_random: int,
                                                                count: int) -> None:
    """A batch's random parts are consecutive: ids are spelled right where the low characters carry into the higher
    ones (every 1,024 ids, 2**20, 2**70) and where the 80 bits run out and the batch moves to the next millisecond."""
    from chokaq_core import domain

    ms = time.time_ns() // 1_000_000 + 60_000  # ahead of the clock: the batch continues this state
    monkeypatch.setattr(domain, "_ulid_last", (ms, last_random))
    ids = domain.new_ulids(count)
    stamp, last = domain._ulid_last
    assert ids == [_spelled(stamp, r) for r in range(last - count + 1, last + 1)]
    assert ids == sorted(ids) and len(set(ids)) == count and ids[0] > _spelled(ms, last_random)


# ---------------------------------------------------------------- names are URL path segments: an alphabet


@pytest.mark.parametrize(("field", "value"), [
    ("job_id", "x/../../metrics"), ("job_id", "../../api/dlq/01ABC/purge?"), ("job_id", "a b"),
    ("job_id", "<img src=x>"), ("job_id", ".."), ("job_id", "."), ("job_id", "a%2Fb"), ("job_id", "é"),
    ("queue", "<img src=x onerror=alert(1)>"), ("queue", "a/b"), ("queue", ".."), ("queue", "q?x"),
    ("type_key", "demo x"), ("type_key", "a/b"), ("type_key", "<b>"),
    ("idempotency_key", "k y"), ("idempotency_key", "k<"), ("idempotency_key", "k\nx"), ("idempotency_key", ".."),
])
def test_names_outside_their_alphabet_are_refused_naming_the_field(field: str, value: str) -> None:
    kwargs: dict[str, object] = {field: value, "allow_unregistered": True}
    label = {"job_id": "job id", "type_key": "type key", "idempotency_key": "idempotency key"}.get(field, field)
    with pytest.raises(EnvelopeError, match=f"^{label} must") as info:
        build(opts(**kwargs))
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(("field", "value"), [
    ("job_id", "01HZX3J6Q4W8N8R7T5V2K9M0AB"), ("job_id", "order-42_x.v1:a"), ("job_id", "a" * 50),
    ("queue", "default"), ("queue", "emails.eu-west:1"), ("queue", "q" * 255),
    ("type_key", "django.task:tests.ops.tasks.add"), ("type_key", "demo.email.send.v1"),
    ("idempotency_key", "order:42"), ("idempotency_key", "schedule:nightly:2026-01-01T00:00:00+00:00"),
    ("idempotency_key", "user@example.com/7=x"),
])
def test_names_inside_their_alphabet_are_accepted(field: str, value: str) -> None:
    job = build(opts(**{field: value, "allow_unregistered": True}))
    stored = {"job_id": job.id, "queue": job.queue, "type_key": job.type, "idempotency_key": job.idempotency_key}
    assert stored[field] == value


@pytest.mark.parametrize(("type_key", "queue", "label"), [
    ("demo x", "default", "type key"), ("a/b.v1", "default", "type key"), ("", "default", "type key"),
    ("ok.alphabet.v1", "<b>", "queue"), ("ok.alphabet.v1", "..", "queue"),
])
def test_job_refuses_a_name_enqueue_would_refuse_at_decoration(type_key: str, queue: str, label: str) -> None:
    """``@job`` applies enqueue's alphabets: a type key or default queue no enqueue could ever accept fails
    when the module is imported, and nothing is registered."""
    with pytest.raises(EnvelopeError, match=f"^{label} must"):
        register_job(type_key, queue=queue)
    assert get_definition(type_key or "-") is None


def nested(levels: int) -> dict[str, object]:
    """A payload object whose lists nest ``levels`` deep in total (the object itself is level 1)."""
    inner: object = []
    for _ in range(levels - 2):
        inner = [inner]
    return {"x": inner}


def test_payload_depth_is_limited_without_exhausting_the_stack() -> None:
    assert json.loads(serialize_payload(nested(64)))
    for levels in (65, 990, 5000, 200_000):
        with pytest.raises(EnvelopeError, match="nests more than 64 levels"):
            serialize_payload(nested(levels))


def test_a_self_containing_payload_is_refused() -> None:
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(EnvelopeError, match="nests more than 64 levels"):
        serialize_payload({"loop": loop})
