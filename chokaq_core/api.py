"""``enqueue()``: validate the envelope, serialize the payload, hand it to storage.

Every check runs before any row is written (spec 02 §2.1), and each failure
is a clear exception: ``UnknownJobTypeError``/``EnvelopeError`` (both
``ValueError``) or ``TypeError`` naming the payload field that JSON cannot
hold.

Names have an alphabet, because the Deck puts them into URL path segments
and HTML attributes (``domain.NAME_ALPHABETS``): a job id is 1–50 of
``[0-9A-Za-z._:-]``; a queue name and a type key 1–255 of the same
characters (``django.task:app.tasks.send`` and ``demo.email.send.v1`` fit);
an idempotency key 1–255 of ``[0-9A-Za-z._:@+=/-]`` (``order:42``,
``schedule:nightly:2026-01-01T00:00:00+00:00``). A name made only of dots
(``.``, ``..``) is a path traversal and is refused. Payload JSON nests at most
``MAX_PAYLOAD_DEPTH`` (64) levels. Enqueue joins the caller's ``transaction.atomic()``: the row commits
or rolls back with the caller's data and its event fires only on commit.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from asgiref.sync import sync_to_async
from django.core.serializers.json import DjangoJSONEncoder

from chokaq_core import storage
from chokaq_core.conf import config
from chokaq_core.domain import (
    NAME_ALPHABETS,
    ArchivedJob,
    DeadJob,
    EnvelopeError,
    HotJob,
    JobRecord,
    JobStatus,
    NewJob,
    UnknownJobTypeError,
    check_name,
    new_ulid,
    new_ulids,
    parse_rate,
)
from chokaq_core.handlers import JobDefinition, get_definition, register

PRIORITY_RANGE = (-1_000_000, 1_000_000)
MAX_PAYLOAD_DEPTH = 64


@dataclass(frozen=True)
class EnqueueOptions:
    """One job for ``enqueue_many`` (``BoundJob.request()`` builds these from a ``@job``)."""

    type_key: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    queue: str | None = None
    priority: int | None = None
    delay: timedelta | float | None = None
    run_at: datetime | None = None
    idempotency_key: str | None = None
    tags: Sequence[str] | str | None = None
    created_by: str | None = None
    job_id: str | None = None
    allow_unregistered: bool = False
    rate_key: str | None = None


def enqueue(
    type_key: str,
    payload: Mapping[str, Any] | None = None,
    *,
    queue: str | None = None,
    priority: int | None = None,
    delay: timedelta | float | None = None,
    run_at: datetime | None = None,
    idempotency_key: str | None = None,
    tags: Sequence[str] | str | None = None,
    created_by: str | None = None,
    job_id: str | None = None,
    allow_unregistered: bool = False,
    rate_key: str | None = None,
    using: str | None = None,
) -> str:
    """Enqueue one job; returns its id (the existing job's id when the idempotency key is active).
    ``rate_key``: the partition of a per-key rate limit the job counts against (default: the @job's key)."""
    job = _envelope(type_key, payload or {}, queue, priority, delay, run_at, idempotency_key, tags, created_by,
                    job_id, allow_unregistered, rate_key)
    return storage.enqueue([job], using=using)[0]


async def aenqueue(type_key: str, payload: Mapping[str, Any] | None = None, **options: Any) -> str:
    """Async twin of :func:`enqueue` for async views."""
    return await sync_to_async(enqueue)(type_key, payload, **options)


def enqueue_many(items: Iterable[EnqueueOptions | Mapping[str, Any]], *, using: str | None = None) -> list[str]:
    """Enqueue many jobs in one transaction (one multi-row INSERT per chunk). All are validated first."""
    fields = [_fields(item) for item in items]
    ids = iter(new_ulids(sum(1 for f in fields if f[_JOB_ID] is None)))
    kinds: dict[tuple[Any, ...], _Kind] = {}  # the batch's jobs mostly share a type, queue and priority
    jobs = [_envelope(*f, new_id=None if f[_JOB_ID] is not None else next(ids), kinds=kinds) for f in fields]
    return storage.enqueue(jobs, using=using) if jobs else []


_OPTION_KEYS = frozenset(EnqueueOptions.__dataclass_fields__)


# EnqueueOptions' fields in order: type_key, payload, queue, priority, delay, run_at, idempotency_key, tags,
# created_by, job_id, allow_unregistered, rate_key
# (a plain tuple: a named tuple costs ~0.75 µs more a job to build, ~3 % of a bulk enqueue)
type _Fields = tuple[Any, Mapping[str, Any], Any, Any, Any, Any, Any, Any, Any, Any, bool, Any]
_JOB_ID = 9  # job_id's position in _Fields


def _fields(item: EnqueueOptions | Mapping[str, Any]) -> _Fields:
    """An ``enqueue_many`` item's EnqueueOptions fields in order, without building one (a frozen dataclass costs
    ~5 µs a job) from a mapping; a mapping EnqueueOptions would refuse raises its TypeError."""
    if isinstance(item, EnqueueOptions):
        return (item.type_key, item.payload, item.queue, item.priority, item.delay, item.run_at,
                item.idempotency_key, item.tags, item.created_by, item.job_id, item.allow_unregistered, item.rate_key)
    if "type_key" not in item or not _OPTION_KEYS.issuperset(item):
        EnqueueOptions(**item)  # raises naming the missing or unexpected field
    get = item.get
    return (item["type_key"], get("payload", _NO_PAYLOAD), get("queue"), get("priority"), get("delay"), get("run_at"),
            get("idempotency_key"), get("tags"), get("created_by"), get("job_id"), get("allow_unregistered", False),
            get("rate_key"))


_NO_PAYLOAD: Mapping[str, Any] = {}  # never mutated: serialize_payload only reads it


async def aenqueue_many(items: Iterable[EnqueueOptions | Mapping[str, Any]], **options: Any) -> list[str]:
    return await sync_to_async(enqueue_many)(list(items), **options)


# ---------------------------------------------------------------- validation


type _Kind = tuple[str, JobDefinition | None, str, int]  # a checked type key, its @job, queue and priority


def build(options: EnqueueOptions, new_id: str | None = None, kinds: dict[tuple[Any, ...], _Kind] | None = None
          ) -> NewJob:
    """Validate one envelope (spec 03 §9) and serialize its payload. ``new_id``: the id of a job given none (a new
    ULID by default); ``kinds``: the checked (type, queue, priority) of the envelopes met so far in one batch."""
    return _envelope(*_fields(options), new_id=new_id, kinds=kinds)


def _envelope(type_key: Any, payload: Mapping[str, Any], queue: Any, priority: Any, delay: Any, run_at: Any,
              idempotency_key: Any, tags: Any, created_by: Any, job_id: Any, allow_unregistered: bool, rate_key: Any,
              new_id: str | None = None, kinds: dict[tuple[Any, ...], _Kind] | None = None) -> NewJob:
    """``build`` over the envelope's fields (EnqueueOptions' order)."""
    if kinds is None:
        type_key, definition, queue, priority = _kind(type_key, queue, priority, allow_unregistered)
    else:
        type_key, definition, queue, priority = _known_kind(type_key, queue, priority, allow_unregistered, kinds)
    job_id = new_id or new_ulid() if job_id is None else _name("job id", job_id)
    if idempotency_key is not None:  # a blank idempotency key means none
        idempotency_key = _text("idempotency key", idempotency_key, NAME_ALPHABETS["idempotency key"][1])
        idempotency_key = check_name("idempotency key", idempotency_key) if idempotency_key else None
    text = serialize_payload(payload)
    if tags is not None:
        tags = _tags(tags)
    seconds = None if delay is None and run_at is None else _delay(delay, run_at)
    if created_by is not None:
        created_by = _text("created_by", created_by, 100) or None
    if rate_key is not None or (definition is not None and definition.rate_key is not None):
        rate_key = _rate_key(definition, rate_key, payload)  # most jobs: no rate key given, none declared
    return NewJob(job_id, queue, type_key, text, tags, idempotency_key, priority, seconds, created_by, rate_key)


def _known_kind(type_key: Any, queue: Any, priority: Any, allow_unregistered: bool,
                kinds: dict[tuple[Any, ...], _Kind]) -> _Kind:
    """``_kind`` of an envelope, checked once per batch for each (type, queue, priority) met (with their Python
    types: ``True`` equals 1 but is no priority)."""
    key = (type_key, type(type_key), queue, type(queue), priority, type(priority), allow_unregistered)
    try:
        kind = kinds.get(key)
    except TypeError:  # an unhashable type key or queue: _kind says what is wrong with it
        return _kind(type_key, queue, priority, allow_unregistered)
    if kind is None:
        kind = kinds[key] = _kind(type_key, queue, priority, allow_unregistered)
    return kind


def _kind(type_key: Any, queue: Any, priority: Any, allow_unregistered: bool) -> _Kind:
    """The checked type key, its definition, the queue and the priority of an envelope."""
    type_key = _name("type key", type_key)
    definition = get_definition(type_key)
    if definition is None and not allow_unregistered and config().REQUIRE_REGISTERED_JOB_TYPES:
        raise UnknownJobTypeError(
            f"unknown job type {type_key!r}: no @job registers it (pass allow_unregistered=True to enqueue "
            "a type handled by another service)"
        )
    queue = _name("queue", queue if queue is not None else (definition.queue if definition else "default"))
    priority = priority if priority is not None else (definition.priority if definition else 10)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"priority must be an int, got {type(priority).__name__}")
    if not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
        raise EnvelopeError(f"priority must be within {PRIORITY_RANGE[0]}..{PRIORITY_RANGE[1]}, got {priority}")
    return type_key, definition, queue, priority


def _rate_key(definition: JobDefinition | None, key: Any, payload: Mapping[str, Any]) -> str | None:
    """The job's rate key: the one given, else the @job's ``rate_key`` over the payload; EnvelopeError (a
    ValueError) when the key function raises or the key is not 1-255 characters of the key alphabet."""
    if key is None and definition is not None and definition.rate_key is not None:
        try:
            key = definition.partition_key(dict(payload))
        except Exception as exc:
            raise EnvelopeError(f"the rate_key of {definition.type_key!r} raised {type(exc).__name__}: {exc}") from exc
    if key is None:
        return None
    if not isinstance(key, str):
        raise EnvelopeError(f"rate key must be a string, got {type(key).__name__}")
    return _name("rate key", key)


def _name(field_name: str, value: Any) -> str:
    """A job id, queue, type key or idempotency key: a non-blank string within its alphabet and length
    (``domain.NAME_ALPHABETS``). Queue and type names repeat from job to job: each is checked once."""
    if type(value) is str and field_name in _REPEATED_NAMES:
        return _checked_name(field_name, value)
    return check_name(field_name, _text(field_name, value, NAME_ALPHABETS[field_name][1], required=True))


_REPEATED_NAMES = frozenset(("queue", "type key"))


@lru_cache(maxsize=1024)
def _checked_name(field_name: str, value: str) -> str:
    """``_name`` of a string, remembered (an invalid one raises and is not remembered)."""
    return check_name(field_name, _text(field_name, value, NAME_ALPHABETS[field_name][1], required=True))


def _text(name: str, value: Any, limit: int, *, required: bool = False) -> str:
    if value is None:
        if required:
            raise EnvelopeError(f"{name} is required")
        return ""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    if "\x00" in value:
        raise EnvelopeError(f"{name} must not contain a NUL character")  # no database text column can hold it
    value = value.strip()
    if required and not value:
        raise EnvelopeError(f"{name} must not be blank")
    if len(value) > limit:
        raise EnvelopeError(f"{name} is {len(value)} characters; the limit is {limit}")
    return value


def _tags(tags: Sequence[str] | str | None) -> str | None:
    if tags is None:
        return None
    if isinstance(tags, str):
        items = [t.strip() for t in tags.split(",")]
    else:
        if not all(isinstance(t, str) for t in tags):
            raise TypeError("tags must be strings")
        items = [t.strip() for t in tags]
        if any("," in t for t in items):
            raise EnvelopeError("a tag must not contain a comma")
    if any("\x00" in t for t in items):
        raise EnvelopeError("a tag must not contain a NUL character")
    joined = ",".join(t for t in items if t)
    if len(joined) > 1000:
        raise EnvelopeError(f"tags are {len(joined)} characters joined; the limit is 1000")
    return joined or None


def _delay(delay: timedelta | float | None, run_at: datetime | None) -> float | None:
    if delay is not None and run_at is not None:
        raise ValueError("give either delay or run_at, not both")
    if run_at is not None:
        if not isinstance(run_at, datetime) or run_at.tzinfo is None:
            raise TypeError("run_at must be an aware datetime")
        return _in_range(max(0.0, (run_at - datetime.now(UTC)).total_seconds()))
    if delay is None:
        return None
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, (int, float)) and not isinstance(delay, bool):
        try:
            seconds = float(delay)
        except OverflowError:
            raise EnvelopeError(f"delay of {delay} seconds is out of range") from None
    else:
        raise TypeError(f"delay must be a timedelta or seconds, got {type(delay).__name__}")
    if seconds < 0 or math.isnan(seconds):
        raise ValueError(f"delay must not be negative, got {seconds}")
    return _in_range(seconds)


def _in_range(seconds: float) -> float:
    """Storage adds the delay to its own "now" (a little later): that must stay a representable datetime."""
    try:
        datetime.now(UTC) + timedelta(seconds=seconds, days=1)
    except OverflowError:
        raise EnvelopeError(f"a delay of {seconds} seconds is out of range (beyond the year 9999)") from None
    return seconds


def serialize_payload(payload: Mapping[str, Any]) -> str:
    """The payload as compact JSON text; TypeError names the first field JSON cannot hold."""
    if type(payload) is not dict and not isinstance(payload, Mapping):
        raise TypeError(f"payload must be a mapping of handler arguments, got {type(payload).__name__}")
    if not payload:
        return "{}"  # most jobs of a batch: nothing to walk, dump or measure
    for key in payload:
        if not isinstance(key, str):
            raise TypeError(f"payload field names must be strings, got {key!r}")
    check_depth(payload)
    try:
        text = json.dumps(payload, cls=DjangoJSONEncoder, ensure_ascii=False, allow_nan=False,
                          separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        path = _bad_field(payload, "") or "?"
        raise TypeError(f"payload field {path!r} is not JSON-serialisable: {exc}") from exc
    limit = config().SERIALIZATION.MAX_PAYLOAD_BYTES
    size = len(text.encode("utf-8"))
    if size > limit:
        raise EnvelopeError(f"payload is {size} bytes of JSON; the limit is {limit} bytes")
    return text


_SCALARS = (str, int, float, type(None))  # most payload values: rejected before the slower container test
_CONTAINERS = (Mapping, list, tuple)


def _is_container(value: Any) -> bool:
    return not isinstance(value, _SCALARS) and isinstance(value, _CONTAINERS)


def check_depth(value: Any, limit: int = MAX_PAYLOAD_DEPTH) -> None:
    """EnvelopeError when lists/objects nest deeper than ``limit`` levels (the payload object is level 1).
    Iterative (a payload nested thousands of levels deep must not exhaust the interpreter's stack) and depth
    first (a list holding itself twice must not grow the walk level by level); only containers are pushed,
    since enqueue runs this on every payload."""
    stack: list[tuple[Any, int]] = [(value, 1)] if _is_container(value) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            raise EnvelopeError(f"payload nests more than {limit} levels of lists/objects")
        children: Iterable[Any] = item.values() if isinstance(item, Mapping) else item
        stack.extend((child, depth + 1) for child in children  # _is_container, inlined: it runs per value
                     if not isinstance(child, _SCALARS) and isinstance(child, _CONTAINERS))


def _bad_field(value: Any, path: str) -> str | None:
    """The dotted path of the first value ``json.dumps`` rejects."""
    children: Iterable[tuple[str, Any]]
    if isinstance(value, Mapping):
        children = ((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        children = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        try:
            json.dumps(value, cls=DjangoJSONEncoder, allow_nan=False)
            return None
        except (TypeError, ValueError):
            return path
    for child_path, child in children:
        found = _bad_field(child, child_path)
        if found is not None:
            return found
    return None


# ---------------------------------------------------------------- the result API


def get_job(job_id: str) -> JobRecord | None:
    """The job ``job_id`` from whichever pillar holds it (Hot, Archive, DLQ) as a read-only record with its
    attempts history; None when no pillar knows the id."""
    if not isinstance(job_id, str):
        raise TypeError(f"job_id must be a string, got {type(job_id).__name__}")
    for _ in range(2):  # a job moving between pillars (an operator's resurrect) can slip between the reads
        if hot := storage.get_hot(job_id):
            return _record(hot, JobStatus(hot.status), priority=hot.priority, scheduled_at=hot.scheduled_at,
                           started_at=hot.started_at, error_class=hot.last_error_class,
                           error_message=hot.last_error_message)
        if archived := storage.get_archived(job_id):
            return _record(archived, JobStatus.SUCCEEDED, started_at=archived.started_at,
                           finished_at=archived.finished_at,
                           result=None if archived.result is None else json.loads(archived.result))
        if dead := storage.get_dead(job_id):
            return _record(dead, dead.failure_reason.shown_status, finished_at=dead.failed_at,
                           error=dead.error_details, failure_reason=dead.failure_reason,
                           error_class=dead.error_class, error_message=dead.error_message)
    return None


async def aget_job(job_id: str) -> JobRecord | None:
    return await sync_to_async(get_job)(job_id)


def _record(row: HotJob | ArchivedJob | DeadJob, status: JobStatus, **fields: Any) -> JobRecord:
    try:
        payload = json.loads(row.payload) if row.payload is not None else None
    except ValueError:
        payload = row.payload
    history = tuple(storage.job_attempts(row.id))
    if isinstance(row, DeadJob) and history and history[-1].attempt == row.attempt_count:
        fields["started_at"] = history[-1].started_at  # the DLQ row keeps no start: its last execution's
    return JobRecord(
        id=row.id, status=status, queue=row.queue, type=row.type, payload=payload, tags=row.tags,
        attempts=row.attempt_count, worker_id=row.worker_id, created_by=row.created_by, created_at=row.created_at,
        failed_attempts=history,
        **{"priority": None, "scheduled_at": None, "started_at": None, "finished_at": None, **fields},
    )


# ---------------------------------------------------------------- @job: a registered job type that enqueues itself


@dataclass(frozen=True)
class Job(JobDefinition):
    """What ``@job`` returns: the registered definition, plus ``enqueue``/``aenqueue``/``request`` and
    ``using(**options)`` for job options (priority, delay, idempotency_key, tags, queue, …)."""

    def using(self, **options: Any) -> BoundJob:
        """Job options (priority, delay, idempotency_key, tags, queue, …) apart from handler arguments."""
        return BoundJob(self, options)

    def enqueue(self, **payload: Any) -> str:
        return BoundJob(self, {}).enqueue(**payload)

    async def aenqueue(self, **payload: Any) -> str:
        return await BoundJob(self, {}).aenqueue(**payload)

    def request(self, **payload: Any) -> EnqueueOptions:
        """An item for ``enqueue_many``."""
        return BoundJob(self, {}).request(**payload)


@dataclass(frozen=True)
class BoundJob:
    definition: JobDefinition
    options: dict[str, Any]

    def using(self, **options: Any) -> BoundJob:
        return BoundJob(self.definition, {**self.options, **options})

    def _options(self) -> dict[str, Any]:
        opts = dict(self.options)
        opts.setdefault("queue", self.definition.queue)
        opts.setdefault("priority", self.definition.priority)
        return opts

    def enqueue(self, **payload: Any) -> str:
        return enqueue(self.definition.type_key, payload, **self._options())

    async def aenqueue(self, **payload: Any) -> str:
        return await aenqueue(self.definition.type_key, payload, **self._options())

    def request(self, **payload: Any) -> EnqueueOptions:
        """An item for ``enqueue_many``."""
        return EnqueueOptions(type_key=self.definition.type_key, payload=payload, **self._options())


def job(
    type_key: str, *, queue: str = "default", priority: int = 10,
    idempotency_key: str | Callable[[dict[str, Any]], str] | None = None, result_ttl: float | None = None,
    rate_limit: str | None = None, rate_key: str | Callable[[dict[str, Any]], str] | None = None,
) -> Callable[[Callable[..., Any]], Job]:
    """Register ``func`` as the handler of ``type_key`` (a stable contract name, e.g. ``email.send.v1``).

    ``idempotency_key``/``result_ttl`` opt the job into the idempotency middleware. ``rate_limit`` ("100/m",
    "50/s burst 10", "1000/h") caps how many jobs of the type the whole fleet starts per window; with
    ``rate_key`` (a format string over the payload, "tenant:{tenant_id}", or a callable payload -> key) each key
    gets that allowance. The type key and the queue must fit the alphabets ``enqueue()`` checks, and the rate
    must parse (``EnvelopeError``/``ValueError`` at decoration, not at the first enqueue).
    """
    key = _name("type key", type_key)
    queue = _name("queue", queue)
    rate = parse_rate(rate_limit) if rate_limit is not None else None
    if rate_key is not None and not (callable(rate_key) or isinstance(rate_key, str)):
        raise TypeError(f"rate_key must be a format string or a callable, got {type(rate_key).__name__}")

    def decorate(func: Callable[..., Any]) -> Job:
        definition = Job(type_key=key, func=func, queue=queue, priority=priority,
                         idempotency_key=idempotency_key, result_ttl=result_ttl, rate_limit=rate, rate_key=rate_key)
        register(definition)
        return definition

    return decorate
