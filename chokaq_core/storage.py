"""The only caller of ``chokaq_core.sql``: transactions, transient-error retry and events on commit.

Each public function is one storage transition (names as spec 01 §1.4). It
runs the vendor's SQL inside ``transaction.atomic()`` on the ChokaQ alias —
a savepoint when the caller already has a transaction open, which is how
``enqueue`` joins a view's ``atomic()`` block — retries transient database
errors (spec 03 §16) only when it owns the transaction, and publishes its
events after commit.

With ``CHOKAQ["STORAGE"] = "memory"`` (spec 03 §15) the same functions run the
SQLite dialect over the process's private database (``chokaq_core.sql.memory``):
no Django connection and no Django transaction (its lock is the transaction, and
a caller's ``atomic()`` block does not roll it back), events dispatched at once.
"""

from __future__ import annotations

import importlib
import logging
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import ModuleType
from typing import TYPE_CHECKING, Any, Concatenate

from django.conf import settings
from django.db import connections, transaction

from chokaq_core import events, metrics
from chokaq_core.conf import config
from chokaq_core.domain import (
    ArchivedJob,
    Attempt,
    ClaimedJobs,
    DeadJob,
    FailedAttempt,
    Failure,
    HotJob,
    JobFilter,
    JobStatus,
    LeasedJobs,
    NewJob,
    QueueState,
    Rate,
    RateBucket,
    RateLimit,
    RateLimitState,
    Retry,
    ScheduleState,
    Success,
    WorkerInfo,
)
from chokaq_core.policy import RatePlan
from chokaq_core.sql import Dialect, dialect_for, reads_for, wakeup
from chokaq_core.sql.base import StaleBuckets
from chokaq_core.sql.wakeup import WakeSource as WakeSource

if TYPE_CHECKING:  # what the Deck's reads return: a worker never loads it
    from chokaq_core.readmodel import (
        BulkPreview,
        DeckSnapshot,
        ErrorGroup,
        HistorySort,
        HistoryWindow,
        JobRow,
        MetricPoint,
        QueueLag,
        QueueStats,
        SnapshotRequest,
        SummaryStats,
    )
    from chokaq_core.sql.reads import Reads

logger = logging.getLogger("chokaq.storage")

_PG_TRANSIENT_STATES = {"40001", "40P01", "55P03", "53300", "57P01", "57P02", "57P03"}
_MSSQL_TRANSIENT_CODES = {"1205", "-2", "4060", "40197", "40501", "40613", "08S01", "HYT00"}


def alias() -> str:
    return config().DATABASE


def memory_mode() -> bool:
    """True when ``CHOKAQ["STORAGE"]`` is "memory": every operation stays in this process."""
    return config().STORAGE == "memory"


def _memory() -> ModuleType:
    """``chokaq_core.sql.memory``, imported on first use like every vendor module (``dialect_for``): a process on
    PostgreSQL or SQL Server never loads it, Django's SQLite backend nor the SQLite dialect (≈ 1 MiB)."""
    return importlib.import_module("chokaq_core.sql.memory")


def _sqlite() -> ModuleType:
    """``chokaq_core.sql.sqlite``, the dialect of memory mode, imported on first use."""
    return importlib.import_module("chokaq_core.sql.sqlite")


def dialect(using: str | None = None) -> Dialect:
    """The vendor dialect of the ChokaQ alias (the SQLite one in memory mode): a ``BaseDialect`` instance."""
    if memory_mode():
        return _sqlite().DIALECT
    return dialect_for(connections[using or alias()])


def reads(using: str | None = None) -> Reads:
    """The Deck's reads over the dialect of the ChokaQ alias (``sql.reads_for``): loaded on the first read."""
    return reads_for(dialect(using))


def vendor(using: str | None = None) -> str:
    """The Django vendor of the ChokaQ alias, or "memory" in memory mode."""
    if memory_mode():
        return "memory"
    return str(connections[using or alias()].vendor)


def is_transient(exc: BaseException) -> bool:
    """Spec 03 §16: errors worth retrying (lock contention, deadlock, lost connection)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        # sqlite3's OperationalError, known by its class (a worker on PostgreSQL never imports sqlite3)
        if type(current).__name__ == "OperationalError" and type(current).__module__ == "sqlite3":
            text = str(current).lower()
            if "database is locked" in text or "database table is locked" in text:
                return True
        sqlstate = getattr(current, "sqlstate", None)
        if isinstance(sqlstate, str) and (sqlstate in _PG_TRANSIENT_STATES or sqlstate.startswith("08")):
            return True
        module = type(current).__module__
        if module.startswith("psycopg") and type(current).__name__ in ("OperationalError", "InterfaceError"):
            return True
        if module.startswith("pyodbc") and any(code in str(arg) for arg in current.args
                                                for code in _MSSQL_TRANSIENT_CODES):
            return True
        current = current.__cause__ or current.__context__
    return False


PREPARE_ONLY_WHEN_ASKED = 2**31 - 1  # psycopg prepares a statement after this many runs, or when asked


class _PreparingCursor:
    """A psycopg cursor that binds server-side and prepares each statement once per connection.

    Django's psycopg cursors bind client-side (every parameter quoted into the SQL text in Python, every
    statement parsed and planned again by PostgreSQL). The engine's hot statements are few, fixed texts
    (arrays, not growing placeholder lists) run thousands of times: preparing them saves the claim's
    ~3 ms plan per call and the client-side quoting. Only on a direct connection (``_direct_session``): behind
    a pooler the next transaction may run on another server session, where the statement's name is missing or
    names another client's statement. ``SQL.PREPARED_STATEMENTS = False`` turns it off everywhere."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    def execute(self, query: Any, params: Any = None) -> Any:
        return self._cursor.execute(query, params, prepare=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


_DIRECT_SESSIONS: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_GENERIC_PLANS: weakref.WeakSet[Any] = weakref.WeakSet()  # the worker's own sessions told to keep generic plans
_ENGINE_THREAD = threading.local()


def engine_thread() -> None:
    """Mark the calling thread as one of the worker's own (claim, lease, completion): its direct database sessions
    run only the engine's prepared statements, so they keep each one's generic plan (``plan_cache_mode``). By
    default PostgreSQL plans a prepared statement again for each call while the generic plan looks dearer than the
    calls' custom ones, and the claim's plan (~2 ms) cost more than running it. Never set on threads that run user
    code or on a web process's connections: their own prepared statements keep PostgreSQL's choice."""
    _ENGINE_THREAD.generic_plans = True


def _direct_session(using: str, raw: Any, cursor: Any) -> bool:
    """True when this driver connection talks to the database server's own session process: the process id the
    server reported when the connection opened is the one serving it now. A pooler (PgBouncer, in any pool
    mode) answers the connection itself with an id of its own, and a transaction pooler hands each transaction
    to whichever server session is free, so nothing may live in the session (prepared statements). Asked once
    per connection, in the caller's transaction."""
    known = _DIRECT_SESSIONS.get(raw)
    if known is None:
        pid = dialect(using).session_pid(cursor)
        known = _DIRECT_SESSIONS[raw] = pid is not None and pid == raw.info.backend_pid
        if not known:
            logger.info("the database connection goes through a pooler (server session %s, connection reported"
                        " %s): the engine's statements are not prepared on it", pid, raw.info.backend_pid)
    return known


@contextmanager
def _cursor(using: str, prepared: bool = False) -> Iterator[Any]:
    """The driver-level cursor (``%s`` placeholders on every vendor), without Django's debug logging;
    driver errors still surface as Django's (``IntegrityError``, ``OperationalError``, …). ``prepared``:
    where the dialect prepares, a server-side binding cursor that prepares its statements (see
    ``_PreparingCursor``), opened on the driver connection directly (no Django cursor wrapper to build) and kept
    for the connection's next call (a new psycopg cursor adapts its parameters cold: ~20 µs a statement)."""
    connection = connections[using]
    if prepared and dialect_for(connection).PREPARES and config().SQL.PREPARED_STATEMENTS:
        # what connection.cursor() does before it builds its wrapper
        connection.close_if_health_check_failed()
        connection.ensure_connection()
        connection.validate_thread_sharing()
        raw = connection.connection
        cursor = _IDLE_CURSORS.pop(connection, None)  # popped: a nested call makes its own
        if cursor is None or cursor.connection is not raw:
            with connection.wrap_database_errors:
                cursor = _preparing_cursor(using, raw)
        if cursor is not None:
            if getattr(_ENGINE_THREAD, "generic_plans", False) and raw not in _GENERIC_PLANS:
                with connection.wrap_database_errors:
                    dialect(using).keep_generic_plans(cursor)  # a session setting (a direct session: it stays)
                _GENERIC_PLANS.add(raw)
            try:
                with connection.wrap_database_errors:
                    yield cursor
            finally:
                _IDLE_CURSORS[connection] = cursor
            return
    with connection.cursor() as wrapper, connection.wrap_database_errors:
        if connection.vendor == "postgresql" and not settings.USE_TZ:
            _read_timestamptz_aware(wrapper.cursor)  # Django's loader would make them naive local time
        yield wrapper.cursor


_IDLE_CURSORS: weakref.WeakKeyDictionary[Any, _PreparingCursor] = weakref.WeakKeyDictionary()


def _preparing_cursor(using: str, raw: Any) -> _PreparingCursor | None:
    """A preparing cursor on the driver connection ``raw``, or None behind a pooler (``_direct_session``)."""
    if _DIRECT_SESSIONS.get(raw) is False:
        return None
    import psycopg

    cursor = psycopg.Cursor(raw)
    if not _direct_session(using, raw, cursor):
        cursor.close()
        return None
    if raw.prepare_threshold is None:  # Django's default turns preparing off, even when asked
        raw.prepare_threshold = PREPARE_ONLY_WHEN_ASKED  # explicitly; its client-side cursors never
    _read_timestamptz_aware(cursor)
    return _PreparingCursor(cursor)


def _read_timestamptz_aware(cursor: Any) -> None:
    """psycopg's own timestamptz loader (C) on ``cursor``: an aware datetime in the session's zone, which the
    dialects' rows normalise to UTC (``as_utc``). Django's wraps it in a Python ``load`` that replaces the zone
    with the connection's: the same value under USE_TZ (at ~0.5 µs a timestamp, and a claimed row has seven), but
    without USE_TZ a naive local time, which a row would read as UTC."""
    import psycopg

    timestamptz = psycopg.postgres.types["timestamptz"].oid
    loader = psycopg.adapters.get_loader(timestamptz, psycopg.pq.Format.TEXT)
    if loader is not None:
        cursor.adapters.register_loader(timestamptz, loader)


_WRITE_TURNS: dict[str, threading.RLock] = {}  # per database file of a ONE_WRITER dialect (see _write_turn)
_WRITE_TURNS_LOCK = threading.Lock()
_NO_TURN = nullcontext()


def _write_turn(connection: Any) -> threading.RLock | None:
    """The lock this process's writers of ``connection``'s database take turns on, where the database has one write
    lock (``ONE_WRITER``: SQLite); None elsewhere, and None while the caller may hold the database's lock already:
    inside a caller's transaction (its ``atomic()`` block, or autocommit turned off), which took no turn — a turn
    taken there could wait for a writer that waits for that transaction.

    SQLite lets one connection write at a time; another waits in its busy handler, which sleeps 1, 2, 5, 10 … ms
    between its tries: a lock freed meanwhile stays unused until the sleep ends. The worker's own threads (the
    claim, the lease, the completion), whose transactions last a millisecond or two, spent most of a drain in those
    sleeps (bench/README, "Eighth round (h/sqlite)"). Queued on this lock, the next writer starts when the last one
    commits. Writers of other processes, and a caller's own
    transactions, still meet them in the busy handler. A turn spans one storage transaction or self-committing
    statement: never a handler's run. Reentrant: commit hooks that write run inside their transaction's turn."""
    if connection.in_atomic_block or (connection.connection is not None and not connection.autocommit):
        return None
    if not dialect_for(connection).ONE_WRITER:
        return None
    name = str(connection.settings_dict["NAME"])
    turn = _WRITE_TURNS.get(name)
    if turn is None:
        with _WRITE_TURNS_LOCK:
            turn = _WRITE_TURNS.setdefault(name, threading.RLock())
    return turn


def run[T](operation: Callable[[Any], T], *, using: str | None = None, atomic: bool = True,
           prepared: bool = False, writes: bool = True) -> T:
    """Run ``operation(cursor)`` in a transaction with the transient-error retry policy (``prepared``: its
    statements are the hot path's fixed texts, see ``Mode``; ``writes``: it may write, so it takes a write turn
    where the database has one writer, see ``_write_turn``)."""
    if memory_mode():  # the private database's lock is the transaction; nothing there is transient
        return _memory().database().run(operation)
    db = using or alias()
    connection = connections[db]
    nested = connection.in_atomic_block
    turn = _write_turn(connection) if writes or atomic else None
    sql = config().SQL
    attempt = 0
    while True:
        try:
            with turn if turn is not None else _NO_TURN:
                if atomic:
                    with transaction.atomic(using=db), _cursor(db, prepared) as cursor:
                        return operation(cursor)
                with _cursor(db, prepared) as cursor:
                    return operation(cursor)
        except Exception as exc:
            attempt += 1
            if nested or attempt > sql.MAX_TRANSIENT_RETRIES or not is_transient(exc):
                raise
            base = sql.TRANSIENT_RETRY_BASE_DELAY_MS
            delay_ms = base * 2 ** (attempt - 1) + random.randint(0, max(int(base * 0.5) - 1, 0))
            logger.warning("transient database error (attempt %s), retrying in %s ms: %s", attempt, delay_ms, exc)
            _discard_if_broken(connection)
            time.sleep(delay_ms / 1000)


type BatchPurge = Callable[[Any, datetime, int], int]  # one batch of a purge by age: cursor, cutoff, batch size


@dataclass(frozen=True)
class Mode:
    """How a transition runs. ``alone``: without a BEGIN/COMMIT of its own (it is one statement or only reads;
    inside a caller's transaction it runs there). ``prepared``: its statements are the hot path's fixed texts,
    prepared where the dialect prepares (PostgreSQL). ``writes``: it may write (an alone read takes no write turn,
    see ``_write_turn``; a transaction always does)."""

    alone: bool = False
    prepared: bool = False
    writes: bool = True


IN_TRANSACTION = Mode()
ALONE = Mode(alone=True)
READ = Mode(alone=True, writes=False)
HOT_PATH = Mode(alone=True, prepared=True)
HOT_READ = Mode(alone=True, prepared=True, writes=False)


def moves() -> Mode:
    """How a move between pillars runs: alone where the dialect moves in one statement."""
    return Mode(alone=dialect().MOVES_IN_ONE_STATEMENT)


def call[**P, R](mode: Mode, transition: Callable[Concatenate[Any, P], R], /, *args: P.args,
                 **kwargs: P.kwargs) -> R:
    """Run one dialect function of the ChokaQ alias (a bound method of ``dialect()``, the cursor its first
    argument) as ``mode`` says, with the transient-error retry policy."""
    return run(lambda cursor: transition(cursor, *args, **kwargs), atomic=not mode.alone, prepared=mode.prepared,
               writes=mode.writes)


def _emit(published: events.Produced, using: str | None = None) -> None:
    """Publish after commit: ``published`` as a producer (a callable) is built only when someone hears it (the
    per-job events of claims, leases and completions: ``events.dispatch``)."""
    if memory_mode():
        events.dispatch(published)  # nothing to wait for: there is no database transaction
    else:
        events.publish(published, using=using or alias())


def on_commit(func: Callable[[], object], using: str | None = None) -> None:
    """``transaction.on_commit`` on the ChokaQ alias; at once in memory mode (there is no transaction)."""
    if memory_mode():
        func()
    else:
        transaction.on_commit(func, using=using or alias())


def _discard_if_broken(connection: Any) -> None:
    try:
        if connection.connection is not None and not connection.is_usable():
            connection.close()
    except Exception:
        connection.connection = None


# ---------------------------------------------------------------- enqueue / claim


def enqueue(jobs: Sequence[NewJob], *, using: str | None = None) -> list[str]:
    """Insert Pending rows; returns the stored id per job. Metrics and events follow the commit, for new rows
    only (one after-commit callback builds both: a rolled-back enqueue pays for neither)."""
    cfg = config()
    db = using or cfg.DATABASE
    if cfg.STORAGE == "memory":
        stored = run(lambda cursor: _enqueue_in_memory(cursor, jobs))
        fresh = [job for job, job_id in zip(jobs, stored, strict=True) if job.id == job_id]
        if fresh:
            _enqueued(fresh)  # memory mode has no transaction to wait for
        return stored
    connection = connections[db]
    sql = dialect_for(connection)
    in_transaction = connection.in_atomic_block
    # one statement (no idempotency key to resolve) may skip BEGIN/COMMIT, but inside the caller's transaction
    # it still takes its savepoint: a failure must not poison the caller's transaction
    alone = (sql.ENQUEUE_IN_ONE_STATEMENT and not in_transaction
             and not 0 < sql.ENQUEUE_COPY_FROM <= len(jobs) and all(job.idempotency_key is None for job in jobs))
    # (SQLite's one statement needs the batch's queue rows to exist: without them it writes nothing, and the
    # transaction that creates them follows)
    alone_stored: list[str] | None = None
    if alone:
        alone_stored = run(lambda cursor: sql.enqueue_alone(cursor, jobs), using=db, atomic=False, prepared=True)
    stored = alone_stored if alone_stored is not None else run(lambda cursor: sql.enqueue(cursor, jobs), using=db,
                                                                prepared=True)
    fresh = [job for job, job_id in zip(jobs, stored, strict=True) if job.id == job_id]
    if fresh:
        if in_transaction or not connection.get_autocommit():
            transaction.on_commit(lambda: _enqueued(fresh), using=db)
        else:
            _enqueued(fresh)  # committed already: what on_commit does in autocommit, without its detour
    return stored


def _enqueued(fresh: Sequence[NewJob]) -> None:
    """After an enqueue commits: count the new rows, then publish their events (one moment for the batch)."""
    metrics.jobs_enqueued(fresh)

    def produce() -> list[events.Event]:
        now = datetime.now(UTC).isoformat()
        return [events.job_updated(j.id, j.type, j.queue, JobStatus.PENDING, 0, ts=now, priority=j.priority,
                                   created_by=j.created_by) for j in fresh] + [events.stats_updated(now)]

    events.dispatch(produce)  # built only when heard: no listener and no channel layer, a job's event goes nowhere


def _enqueue_in_memory(cursor: Any, jobs: Sequence[NewJob]) -> list[str]:
    """``enqueue`` in memory mode: make room under the capacity cap first, in the same transaction."""
    if jobs:
        _memory().evict_if_full(cursor, int(config().IN_MEMORY.MAX_CAPACITY))
    return _sqlite().DIALECT.enqueue(cursor, jobs)


def reset_memory() -> None:
    """Forget every row of the in-memory storage (tests)."""
    _memory().database().reset()


# When a claim found a capped queue in reach (of all queues: None), that worker's claims of those queues take the
# transaction (lock the capped queues, then claim) for CAPPED_RECHECK seconds before trying one statement again.
CAPPED_RECHECK = 5.0
_CAPPED_IN_REACH: dict[tuple[str, ...] | None, float] = {}


def fetch_batch(worker_id: str, limit: int, queues: Sequence[str] | None = None,
                rate_limits: Sequence[RateLimit] = (), lease: int = 0) -> list[HotJob]:
    """Claim up to ``limit`` due rows. Under ``rate_limits`` the claim reads those limits' buckets (locking and
    writing nothing: the lease spends the tokens), skips what has no token left and keeps the claimed rows within
    the tokens there are now (the rest go back to Pending, no attempt counted); without limits, or while the
    buckets this process knows hold ``limit`` tokens of each limit, it is the claim alone. Claims of several
    workers may together take more than the tokens: the lease sends the excess back.

    ``lease`` (without rate limits only): the caller holds that many free execution slots, so the first ``lease``
    claimed rows are leased at once, in the claim's transaction (status Processing, the attempt counted, started
    now: docs/architecture.md, "Leasing at the claim"); the caller must start them (or reschedule them)."""
    if not rate_limits:
        jobs = _claim(worker_id, limit, queues, lease)
        if lease:
            _emit(lambda: _processing_events([(job, job.attempt_count) for job in jobs
                                              if job.status == JobStatus.PROCESSING]))
        return jobs
    names = sorted({limit.name for limit in rate_limits})
    known = KNOWN_BUCKETS.now_and_buckets(names)
    if known is not None and RatePlan.of(rate_limits, known[1], known[0]).plentiful(limit):
        return ClaimedJobs(_claim(worker_id, limit, queues, 0))

    def operation(cursor: Any) -> ClaimedJobs:
        sql = dialect()
        now, buckets = sql.read_rate_buckets(cursor, names)
        KNOWN_BUCKETS.note(now, buckets)
        plan = RatePlan.of(rate_limits, buckets, now)
        hold = plan.hold()
        kept, released = plan.admit(sql.fetch_batch(cursor, worker_id, limit, queues, hold))
        if released:
            sql.release_jobs(cursor, [job.id for job in released], worker_id)
        claimed = ClaimedJobs(kept)
        claimed.held_for = plan.next_token_in() if hold or released else None
        return claimed

    return run(operation, prepared=True)  # the claim's statements, prepared as the plain claim's are


def _claim(worker_id: str, limit: int, queues: Sequence[str] | None, lease: int) -> list[HotJob]:
    """The claim without rate limits to apply (``fetch_batch``)."""
    sql, reach = dialect(), None if queues is None else tuple(queues)
    claimed = None
    if sql.CLAIMS_ALONE and time.monotonic() >= _CAPPED_IN_REACH.get(reach, 0.0):
        claimed = call(HOT_PATH, sql.fetch_alone, worker_id, limit, queues, lease)
        if claimed is None:  # a capped queue is in reach: its claimers take turns, in a transaction
            _CAPPED_IN_REACH[reach] = time.monotonic() + CAPPED_RECHECK
    return claimed if claimed is not None else call(Mode(prepared=True), sql.fetch_batch, worker_id, limit, queues,
                                                    None, lease)


def rate_limits() -> list[RateLimitState]:
    """Every rate-limit row (declared and overridden), without its use."""
    return call(READ, dialect().rate_limits)


def rate_buckets(names: Sequence[str]) -> list[RateBucket]:
    return call(READ, dialect().rate_buckets, names)


def pending_by_key() -> list[tuple[str, str, str | None, int]]:
    """Due Pending rows per (queue, type, rate key)."""
    return call(READ, dialect().pending_by_key)


def declare_rate_limits(limits: Sequence[RateLimit]) -> None:
    """Record the limits the code and settings declare (a worker does at start)."""
    call(IN_TRANSACTION, dialect().declare_rate_limits, limits)


def set_rate_limit(name: str, rate: Rate | None, *, lifted: bool = False, actor: str | None = None) -> None:
    """An operator's override: a rate (count 0 pauses), lifted, or neither (back to the declared rate)."""
    call(IN_TRANSACTION, dialect().set_rate_limit, name, rate, lifted, actor)


def mark_processing(job: HotJob, worker_id: str, rate_limits: Sequence[RateLimit] = ()) -> int | None:
    """The lease gate: returns the new attempt count, or None when the row is no longer ours (or, under
    ``rate_limits``, when a limit had no token: the row is Pending again, see ``mark_processing_batch``)."""
    if any(limit.covers(job.queue, job.type) for limit in rate_limits):
        return mark_processing_batch([job], worker_id, rate_limits).get(job.id)
    attempts = call(HOT_PATH, dialect().mark_processing, job.id, worker_id)
    if attempts is not None:
        _emit(lambda: _processing_events([(job, attempts)]))
    return attempts


def mark_processing_batch(jobs: Sequence[HotJob], worker_id: str, rate_limits: Sequence[RateLimit] = ()
                          ) -> LeasedJobs:
    """The lease gate for several buffered jobs: {job id: attempt} of those now Processing and ours. Without a
    limit that concerns the jobs it is one statement. Under ``rate_limits`` the lease spends the tokens, in one
    transaction on the database clock that stamps ``started_at``: it locks those limits' buckets, leases the
    jobs within the tokens (in the given claim order), sends the others back to Pending (no attempt counted;
    ``held`` names them, ``held_for`` says when the next token comes) and writes the buckets."""
    if not jobs:
        return LeasedJobs()
    kinds = {(job.queue, job.type) for job in jobs} if rate_limits else set()
    concerned = [limit for limit in rate_limits if any(limit.covers(queue, type_key) for queue, type_key in kinds)]
    if not concerned:
        leased = LeasedJobs(call(HOT_PATH, dialect().mark_processing_batch, [job.id for job in jobs], worker_id))
    else:
        plans: list[RatePlan] = []
        planned = _lease_on_known_buckets(jobs, worker_id, concerned, plans)
        if planned is None:
            leased = run(lambda cursor: _lease_within_tokens(cursor, jobs, worker_id, concerned, plans), prepared=True)
            changed, added, dropped = plans[0].changes()  # what the lease read under the lock, then wrote
            KNOWN_BUCKETS.note(plans[0].clock or plans[0].now, [*plans[0].buckets.values(), *changed, *added], dropped)
        else:
            leased = planned
        metrics.rate_limited(plans[0].claimed(), dict(plans[0].held))  # the committed attempt's plan
    _emit(lambda: _processing_events([(job, leased[job.id]) for job in jobs if job.id in leased]))
    return leased


class KnownBuckets:
    """The rate buckets as this process last read or wrote them, and the database's clock as last read. A lease
    plans on them without a lock and pays by compare-and-set (``lease_spending``): while one worker holds a limit's
    leases (or the limit is far above the rate) a limited lease costs what a plain one does; a bucket another
    worker wrote since makes that lease fail and the locked lease decide, which refreshes what is known."""

    MAX_AGE = 10.0  # seconds: the clock read longer ago is not trusted (a paused process, a changed host clock)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str], RateBucket] = {}
        self._clock: tuple[datetime, float] | None = None  # the database's time, and time.monotonic() then

    def note(self, now: datetime, buckets: Sequence[RateBucket], dropped: Sequence[tuple[str, str]] = ()) -> None:
        """What a read (or a write) showed at the database's time ``now``, in order (a later sight of a bucket with
        the same ``refilled_at`` wins); an older sight never replaces a newer; ``dropped`` ones are deleted."""
        with self._lock:
            if self._clock is None or now > self._clock[0]:
                self._clock = (now, time.monotonic())
            for bucket in buckets:
                slot = (bucket.limit_name, bucket.rate_key)
                seen = self._buckets.get(slot)
                if seen is None or bucket.refilled_at >= seen.refilled_at:
                    self._buckets[slot] = bucket
            for slot in dropped:
                self._buckets.pop(slot, None)

    def forget(self, names: Sequence[str]) -> None:
        with self._lock:
            self._buckets = {slot: b for slot, b in self._buckets.items() if slot[0] not in names}

    def now_and_buckets(self, names: Sequence[str]) -> tuple[datetime, list[RateBucket]] | None:
        """The database's time now, estimated from the last reading (never ahead of it: a lease that plans on an
        earlier time finds fewer tokens), and the known buckets of ``names``; None while the clock is unknown."""
        with self._lock:
            if self._clock is None or time.monotonic() - self._clock[1] > self.MAX_AGE:
                return None
            read, at = self._clock
            return (read + timedelta(seconds=time.monotonic() - at),
                    [b for slot, b in self._buckets.items() if slot[0] in names])


KNOWN_BUCKETS = KnownBuckets()


def _lease_on_known_buckets(jobs: Sequence[HotJob], worker_id: str, limits: Sequence[RateLimit],
                            plans: list[RatePlan]) -> LeasedJobs | None:
    """``mark_processing_batch`` planned on the known buckets: when they cover every job and a lease without a
    lock can pay for them, one compare-and-set lease; None when the locked lease must decide."""
    names = sorted({limit.name for limit in limits})
    known = KNOWN_BUCKETS.now_and_buckets(names)
    if known is None:
        return None
    plan = RatePlan.of(limits, known[1], known[0])
    admitted, held = plan.admit(jobs)
    spends = None if held else plan.spends(admitted)
    if spends is None:
        return None  # a held job or a new bucket: the locked lease decides (and learns the buckets)
    sql = dialect()
    try:
        leased = LeasedJobs(call(HOT_PATH if sql.SPENDS_ALONE else Mode(prepared=True),
                                 sql.lease_spending, [job.id for job in admitted], worker_id, spends, plan.now))
    except StaleBuckets:
        KNOWN_BUCKETS.forget(names)
        return None
    lost = [job for job in admitted if job.id not in leased]
    plan.give_back(lost)  # their rows took no token (only a lease that spends alone gets here with a lost row)
    if lost:
        KNOWN_BUCKETS.forget(names)
    else:
        KNOWN_BUCKETS.note(plan.clock or plan.now, [spend.spent for spend in spends])
    plans[:] = [plan]
    return leased


def _lease_within_tokens(cursor: Any, jobs: Sequence[HotJob], worker_id: str, limits: Sequence[RateLimit],
                         plans: list[RatePlan]) -> LeasedJobs:
    """``mark_processing_batch`` under limits, in the caller's transaction (``plans`` receives the plan)."""
    sql = dialect()
    now, buckets = sql.lock_rate_buckets(cursor, sorted({limit.name for limit in limits}))
    plan = RatePlan.of(limits, buckets, now)
    plans[:] = [plan]  # a transient retry plans again
    admitted, held = plan.admit(jobs)
    leased = LeasedJobs()
    while admitted:
        leased.update(sql.mark_processing_batch(cursor, [job.id for job in admitted], worker_id, plan.now))
        lost = [job for job in admitted if job.id not in leased]  # no longer ours: they did not start
        if not lost or not held:
            plan.give_back(lost)
            break
        plan.give_back(lost)  # their tokens go to the jobs admit held back for them
        plan.held.clear()
        admitted, held = plan.admit(held)
    released = set(sql.release_jobs(cursor, [job.id for job in held], worker_id)) if held else set()
    sql.save_rate_buckets(cursor, *plan.changes())
    leased.held = tuple(job.id for job in held if job.id in released)  # a foreign job was never ours to hold
    leased.held_for = plan.next_token_in() if leased.held else None
    return leased


def _processing_events(leased: Sequence[tuple[HotJob, int]]) -> list[events.Event]:
    """One JobUpdated (Processing) per leased job, all stamped with the lease's one moment."""
    now = datetime.now(UTC).isoformat()
    return [events.job_updated(job.id, job.type, job.queue, JobStatus.PROCESSING, attempts, ts=now,
                               priority=job.priority, created_by=job.created_by, started_at=now)
            for job, attempts in leased]


def keep_alive(job_ids: Sequence[str], worker_id: str) -> list[str]:
    return call(HOT_PATH, dialect().keep_alive, job_ids, worker_id)


def cancel_requests(worker_id: str) -> list[tuple[str, str]]:
    return call(HOT_READ, dialect().cancel_requests, worker_id)


@dataclass(frozen=True)
class Completion:
    archived: list[tuple[str, str]]
    rescheduled: list[tuple[str, str]]
    failed: list[tuple[str, str]]


def complete(
    worker_id: str | None, successes: Sequence[Success], retries: Sequence[Retry], failures: Sequence[Failure]
) -> Completion:
    """Finish a batch of executions in one transaction (archive, reschedule, DLQ). A batch of successes where the
    move records its history itself is one statement: it commits itself (no BEGIN, no COMMIT round trip)."""
    sql = dialect()
    alone = not retries and not failures and sql.MOVES_RECORD_HISTORY

    # A completion of several moves opens with begin_completion (the shared rows' lock order across its
    # statements); so does one that records failed executions (it reads when they started). One move alone takes
    # its rows in that order within its statement.
    several = sum(1 for moves in (successes, retries, failures) if moves) > 1
    failed_ids = [r.job_id for r in retries if r.error is not None] + [f.job_id for f in failures if f.error is not None]

    def operation(cursor: Any) -> Completion:
        started = sql.begin_completion(
            cursor, worker_id, [*(s.job_id for s in successes), *(r.job_id for r in retries),
                                *(f.job_id for f in failures)], failed_ids) if several or failed_ids else {}
        completion = Completion(
            archived=sql.archive_succeeded(cursor, worker_id, successes) if successes else [],
            rescheduled=sql.reschedule_for_retry(cursor, worker_id, retries) if retries else [],
            failed=sql.move_to_dlq(cursor, worker_id, failures) if failures else [],
        )
        failed_attempts = _failed_attempts(completion, retries, failures, started)
        if failed_attempts:
            sql.record_attempts(cursor, worker_id, failed_attempts)
        if not sql.MOVES_RECORD_HISTORY:
            sql.record_history(cursor, [i for i, _ in completion.archived], [i for i, _ in completion.failed],
                               datetime.now(UTC))
        return completion

    done = run(operation, atomic=not alone, prepared=True)
    if done.archived or done.rescheduled or done.failed:
        _emit(lambda: _completion_events(done, retries, failures))
    return done


def _completion_events(done: Completion, retries: Sequence[Retry], failures: Sequence[Failure]) -> list[events.Event]:
    """What a committed completion announces, stamped with one moment for the whole batch."""
    reasons = {f.job_id: f.reason for f in failures}
    attempts = {r.job_id: r.attempt_count for r in retries}
    now = datetime.now(UTC).isoformat()
    return (
        [events.Event(events.EventKind.JOB_ARCHIVED, {"jobId": i, "queue": q}, now) for i, q in done.archived]
        + [events.Event(events.EventKind.JOB_UPDATED, {"jobId": i, "queue": q, "status": int(JobStatus.PENDING),
                                                       "attemptCount": attempts[i]}, now) for i, q in done.rescheduled]
        + [events.Event(events.EventKind.JOB_FAILED, {"jobId": i, "queue": q, "reason": reasons[i].display_name},
                        now) for i, q in done.failed]
        + [events.stats_updated(now)]
    )


def _failed_attempts(done: Completion, retries: Sequence[Retry], failures: Sequence[Failure],
                     started: dict[str, datetime | None]) -> list[FailedAttempt]:
    """The attempts-history rows of a completion batch: each failed execution that carries its error and
    whose move really happened (a lost-ownership row records nothing)."""
    moved = {job_id for job_id, _ in done.rescheduled} | {job_id for job_id, _ in done.failed}
    recorded = [FailedAttempt(r.job_id, r.attempt_count, r.error, started.get(r.job_id)) for r in retries
                if r.error is not None and r.job_id in moved]
    recorded += [FailedAttempt(f.job_id, f.attempt, f.error, started.get(f.job_id)) for f in failures
                 if f.error is not None and f.attempt is not None and f.job_id in moved]
    return recorded


def job_attempts(job_id: str) -> list[Attempt]:
    """A job's attempts history: every recorded failed execution, oldest first."""
    return call(READ, dialect().job_attempts, job_id)


def purge_attempts(cutoff: datetime, progress: Callable[[int], None] | None = None) -> int:
    """Attempts-history rows of executions that failed before ``cutoff``."""
    return _purge_batches(ALONE, dialect().purge_attempts, cutoff, progress)


def release_jobs(job_ids: Sequence[str], worker_id: str) -> int:
    return len(call(ALONE, dialect().release_jobs, job_ids, worker_id)) if job_ids else 0


# ---------------------------------------------------------------- operator commands


def resurrect(
    job_id: str, *, payload: str | None = None, tags: str | None = None, priority: int | None = None,
    actor: str | None = None, revision: int | None = None,
) -> bool:
    """DLQ → Hot with optional edits; ``revision``: only if the job is still at that edit version."""
    moved = bool(call(moves(), dialect().resurrect, job_id, payload, tags, priority, actor, revision))
    if moved:
        job = get_hot(job_id)
        _emit([events.Event(events.EventKind.JOB_RESURRECTED, {"jobId": job_id, "queue": job.queue if job else None}),
               events.stats_updated()])
    return moved


def resurrect_batch(job_ids: Sequence[str], *, actor: str | None = None) -> int:
    moved = call(moves(), dialect().resurrect_batch, job_ids, actor)
    if moved:
        _emit([events.stats_updated()])
    return len(moved)


def cancel(job_ids: Sequence[str], *, actor: str) -> tuple[list[str], list[str]]:
    """Cancel jobs: Pending/Fetched move to the DLQ as Cancelled at once; Processing ones are
    flagged for cooperative cancellation by their worker. Returns (moved ids, flagged ids)."""

    def operation(cursor: Any) -> tuple[list[tuple[str, str]], list[str]]:
        sql = dialect()
        moved = sql.cancel_batch(cursor, job_ids, actor)
        if not sql.MOVES_RECORD_HISTORY:
            sql.record_history(cursor, [], [i for i, _ in moved], datetime.now(UTC))
        moved_ids = {i for i, _ in moved}
        flagged = sql.request_cancel(cursor, [i for i in job_ids if i not in moved_ids], actor)
        return moved, flagged

    moved, flagged = run(operation)
    if moved:
        _emit([events.Event(events.EventKind.JOB_FAILED, {"jobId": i, "queue": q, "reason": "Cancelled"})
               for i, q in moved] + [events.stats_updated()])
    return [i for i, _ in moved], flagged


def update_hot_data(
    job_id: str, *, payload: str | None = None, tags: str | None = None, priority: int | None = None,
    actor: str | None = None, revision: int | None = None,
) -> bool:
    """Edit a Pending job; ``revision``: only if it is still at that edit version."""
    changed = bool(call(ALONE, dialect().update_hot_data, job_id, payload, tags, priority, actor, revision))
    if changed:
        job = get_hot(job_id)
        if job is not None:
            _emit([events.job_updated(job.id, job.type, job.queue, job.status, job.attempt_count,
                                               priority=job.priority, created_by=job.created_by)])
    return changed


def update_dlq_data(job_id: str, *, payload: str | None = None, tags: str | None = None,
                    actor: str | None = None, revision: int | None = None) -> bool:
    """Edit a DLQ job; ``revision``: only if it is still at that edit version."""
    return bool(call(ALONE, dialect().update_dlq_data, job_id, payload, tags, actor, revision))


def purge_dlq_ids(job_ids: Sequence[str]) -> int:
    """Delete DLQ rows by id in batches of ``CLEANUP_BATCH_SIZE`` (each batch its own transaction)."""
    remaining = list(dict.fromkeys(job_ids))
    batch = config().SQL.CLEANUP_BATCH_SIZE
    purged: list[str] = []
    while remaining:
        moved = call(moves(), dialect().purge_dlq_ids, remaining, batch)
        if not moved:
            break
        gone = {i for i, _ in moved}
        purged += [i for i in remaining if i in gone]
        remaining = [i for i in remaining if i not in gone]
    if purged:
        _emit([events.Event(events.EventKind.JOBS_PURGED,
                                      {"jobIds": purged, "source": "DLQ", "count": len(purged)}),
                         events.stats_updated()])
    return len(purged)


def _purge_by_age(purge: BatchPurge, source: str, cutoff: datetime,
                  progress: Callable[[int], None] | None = None) -> int:
    total = _purge_batches(moves(), purge, cutoff, progress)
    if total:
        _emit([events.Event(events.EventKind.JOBS_PURGED, {"jobIds": [], "source": source, "count": total}),
                         events.stats_updated()])
    return total


def purge_archive(cutoff: datetime, progress: Callable[[int], None] | None = None) -> int:
    """Archive rows finished before ``cutoff``, batch by batch (``progress(n)`` after each)."""
    return _purge_by_age(dialect().purge_archive, "Archive", cutoff, progress)


def purge_dlq_older_than(cutoff: datetime, progress: Callable[[int], None] | None = None) -> int:
    """DLQ rows created at or before ``cutoff``, batch by batch (``progress(n)`` after each)."""
    return _purge_by_age(dialect().purge_dlq_older_than, "DLQ", cutoff, progress)


# ---------------------------------------------------------------- maintenance


def recover_abandoned(fetched_timeout_s: float) -> int:
    n = int(call(ALONE, dialect().recover_abandoned, fetched_timeout_s))
    if n:
        _emit([events.stats_updated()])
    return n


def archive_zombies(global_timeout_s: float) -> list[tuple[str, str]]:
    sql = dialect()

    def operation(cursor: Any) -> list[tuple[str, str]]:
        zombies = sql.archive_zombies(cursor, global_timeout_s)
        sql.record_history(cursor, [], [i for i, _ in zombies], datetime.now(UTC))
        return zombies

    moved = call(moves(), sql.archive_zombies, global_timeout_s) if sql.MOVES_RECORD_HISTORY else run(operation)
    if moved:
        _emit([events.stats_updated()])
    return list(moved)


# ---------------------------------------------------------------- queue controls


def _queue_changed(queue: str) -> None:
    state = next((q for q in queue_states() if q.name == queue), None)
    if state is not None:
        _emit([events.Event(events.EventKind.QUEUE_STATE_CHANGED,
                            {"queueName": queue, "isPaused": state.is_paused, "isActive": state.is_active})])


def set_queue_paused(queue: str, paused: bool) -> None:
    call(ALONE, dialect().set_queue_paused, queue, paused)
    _queue_changed(queue)


def set_queue_active(queue: str, active: bool) -> bool:
    changed = bool(call(ALONE, dialect().set_queue_active, queue, active))
    if changed:
        _queue_changed(queue)
    return changed


def set_queue_zombie_timeout(queue: str, seconds: int | None) -> None:
    call(ALONE, dialect().set_queue_zombie_timeout, queue, seconds)


def set_queue_max_workers(queue: str, max_workers: int | None) -> None:
    call(ALONE, dialect().set_queue_max_workers, queue, max_workers)


# ---------------------------------------------------------------- worker registry


def upsert_worker(info: WorkerInfo) -> None:
    call(ALONE, dialect().upsert_worker, info)


def stop_worker(worker_id: str) -> None:
    call(ALONE, dialect().stop_worker, worker_id)


# ---------------------------------------------------------------- operations: health, retention, schedule


def list_workers() -> list[WorkerInfo]:
    return call(READ, dialect().list_workers)


def _purge_batches(mode: Mode, purge: BatchPurge, cutoff: datetime, progress: Callable[[int], None] | None) -> int:
    """Repeat one-batch deletes (each its own transaction) until a batch comes back short."""
    return _batches(lambda batch: call(mode, purge, cutoff, batch), progress)


def _batches(one_batch: Callable[[int], int], progress: Callable[[int], None] | None) -> int:
    """Run ``one_batch(batch size)`` until it deletes fewer rows than the batch size; the total deleted."""
    batch = config().SQL.CLEANUP_BATCH_SIZE
    total = 0
    while True:
        n = one_batch(batch)
        total += n
        if progress is not None and n:
            progress(n)
        if n < batch:
            return total


def purge_workers(cutoff: datetime, progress: Callable[[int], None] | None = None) -> int:
    """Worker registry rows whose last heartbeat is before ``cutoff``."""
    return _purge_batches(ALONE, dialect().purge_workers, cutoff, progress)


def purge_metric_buckets(cutoff: datetime, progress: Callable[[int], None] | None = None) -> int:
    """MetricBuckets rows that started before ``cutoff`` (counters are not touched)."""
    return _purge_batches(ALONE, dialect().purge_metric_buckets, cutoff, progress)


def purge_history(granularity: int, cutoff: datetime, progress: Callable[[int], None] | None = None) -> int:
    """History buckets of one granularity (seconds) that started before ``cutoff``, batch by batch."""
    return _batches(lambda batch: call(ALONE, dialect().purge_history, granularity, cutoff, batch), progress)


def history_buckets(granularity: int, since: datetime, types_limit: int) -> HistoryWindow:
    return call(READ, reads().history_buckets, granularity, since, types_limit)


def tidy_hot_table(min_dead_rows: int) -> bool:
    """Vacuum and analyze the Hot table when churn left too many dead row versions (PostgreSQL only)."""
    return bool(call(ALONE, dialect().tidy_hot_table, min_dead_rows))


def enqueue_scheduled(name: str, tick: datetime, job: NewJob) -> str | None:
    """Claim ``tick`` of recurring job ``name`` and enqueue ``job`` in one transaction: the stored id,
    or None when the tick was already claimed (by another worker) or is the schedule's first sight."""
    return _enqueue_for_schedule(name, tick, job, claim=True)


def run_schedule_now(name: str, tick: datetime, job: NewJob) -> str:
    """Enqueue one job of recurring job ``name`` outside its ticks (an operator's "run now") and remember it as
    the schedule's latest job, in one transaction; ``tick``: the schedule's due tick, recorded if its row is new."""
    return str(_enqueue_for_schedule(name, tick, job, claim=False))


def _enqueue_for_schedule(name: str, tick: datetime, job: NewJob, *, claim: bool) -> str | None:
    """Enqueue ``job`` as recurring job ``name``'s latest job, after claiming ``tick`` when ``claim``."""
    db = alias()

    def operation(cursor: Any) -> str | None:
        sql = dialect(db)
        if claim and not sql.claim_schedule_tick(cursor, name, tick):
            return None
        stored = str(sql.enqueue(cursor, [job])[0])
        sql.record_schedule_run(cursor, name, stored, tick)
        return stored

    stored = run(operation, using=db)
    if stored == job.id:
        metrics.jobs_enqueued([job])
        _emit([events.job_updated(job.id, job.type, job.queue, JobStatus.PENDING, 0, priority=job.priority,
                                  created_by=job.created_by), events.stats_updated()], using=db)
    return stored


def schedule_ticks() -> dict[str, datetime]:
    return call(READ, dialect().schedule_ticks)


def schedule_states() -> list[ScheduleState]:
    return call(READ, dialect().schedule_states)


def set_schedule_enabled(name: str, enabled: bool, tick: datetime) -> None:
    call(ALONE, dialect().set_schedule_enabled, name, enabled, tick)


def change_marker() -> int | None:
    """See ``BaseDialect.change_marker``: a commit marker to poll where there is no push channel, else None (memory
    mode: the worker lives in the writer's own process)."""
    if memory_mode():
        return None
    # read every couple of milliseconds by an idle worker: one statement, without the transition wrapper's retry
    # (a failed read is no signal, and the next read comes soon)
    with _cursor(alias()) as cursor:
        return dialect().change_marker(cursor)


# ---------------------------------------------------------------- reads


def queue_states() -> list[QueueState]:
    return call(READ, dialect().queue_states)


def summary_stats() -> SummaryStats:
    return call(READ, reads().summary_stats)


def queue_stats() -> list[QueueStats]:
    return call(READ, reads().queue_stats)


def get_hot(job_id: str) -> HotJob | None:
    return call(READ, dialect().get_hot, job_id)


def get_archived(job_id: str) -> ArchivedJob | None:
    return call(READ, dialect().get_archived, job_id)


def get_dead(job_id: str) -> DeadJob | None:
    return call(READ, dialect().get_dead, job_id)


# ---------------------------------------------------------------- Deck reads and bulk commands


def list_active(filters: JobFilter, limit: int) -> list[JobRow]:
    return call(READ, reads().list_active, filters, limit)


def list_archive(filters: JobFilter, after_key: tuple[Any, str] | None, limit: int, sort: HistorySort) -> list[JobRow]:
    return call(READ, reads().list_archive, filters, after_key, limit, sort)


def list_dlq(filters: JobFilter, after_key: tuple[Any, str] | None, limit: int, sort: HistorySort) -> list[JobRow]:
    return call(READ, reads().list_dlq, filters, after_key, limit, sort)


def locate_jobs(job_ids: Sequence[str]) -> dict[str, JobStatus]:
    return call(READ, dialect().locate_jobs, job_ids) if job_ids else {}


def throughput(since: datetime) -> list[MetricPoint]:
    return call(READ, reads().throughput, since)


def deck_snapshot(request: SnapshotRequest) -> DeckSnapshot:
    """The live Deck's one read per tick: one statement on every vendor."""
    return call(HOT_READ, reads().deck_snapshot, request)


def queue_health() -> list[QueueLag]:
    return call(READ, reads().queue_health)


def top_errors(limit: int) -> list[ErrorGroup]:
    return call(READ, reads().top_errors, limit)


def preview_dlq_bulk(filters: JobFilter, max_jobs: int) -> BulkPreview:
    return call(READ, reads().preview_dlq_bulk, filters, max_jobs)


def purge_dlq_by_filter(filters: JobFilter, max_jobs: int) -> int:
    moved = call(IN_TRANSACTION, dialect().purge_dlq_by_filter, filters, max_jobs)
    if moved:
        _emit([events.Event(events.EventKind.JOBS_PURGED,
                            {"jobIds": [i for i, _ in moved], "source": "DLQ", "count": len(moved)}),
               events.stats_updated()])
    return len(moved)


def resurrect_dlq_by_filter(filters: JobFilter, max_jobs: int, *, actor: str | None = None) -> int:
    moved = call(IN_TRANSACTION, dialect().resurrect_dlq_by_filter, filters, max_jobs, actor)
    if moved:
        _emit([events.stats_updated()])
    return len(moved)


# Bulk-by-filter runs (the Deck's "all matching" commands): the caller walks the matching rows batch by batch,
# newest id first, with a keyset cursor (``upto``: the largest matching id when the run started, from
# ``count_matching``, so rows added later are left alone; ``after``: the last id of the previous batch). Each batch is ONE short transaction: it reads the next ids and acts on
# exactly those, so no lock outlives a batch and a run stopped halfway leaves only whole batches done.


@dataclass(frozen=True)
class MatchBatch:
    """What one batch of a bulk-by-filter run did: the ids it moved (or purged), the running ones it asked to
    stop (cancel only), and where the next batch starts (None: the run is complete)."""

    done: list[str]
    flagged: list[str]
    after: str | None


def count_matching(pillar: str, filters: JobFilter) -> tuple[int, str | None]:
    """(rows matching, their largest id) in ``pillar`` ("hot" or "dlq")."""
    return call(READ, dialect().count_matching, pillar, filters)


def _match_batch(pillar: str, filters: JobFilter, after: str | None, upto: str, limit: int,
                 act: Callable[[Dialect, Any, list[str]], tuple[list[str], list[str]]]) -> MatchBatch:
    def operation(cursor: Any) -> tuple[list[str], tuple[list[str], list[str]]]:
        sql = dialect()
        ids = sql.matching_ids(cursor, pillar, filters, after, upto, limit)
        return ids, act(sql, cursor, ids) if ids else ([], [])

    ids, (done, flagged) = run(operation)
    return MatchBatch(done, flagged, ids[-1] if len(ids) == limit else None)


def cancel_matching(filters: JobFilter, after: str | None, upto: str, limit: int, *, actor: str) -> MatchBatch:
    """One batch of "cancel all matching" over Hot: Pending/Fetched → DLQ Cancelled, Processing flagged for
    cooperative cancellation (as ``cancel``)."""

    def act(sql: Dialect, cursor: Any, ids: list[str]) -> tuple[list[str], list[str]]:
        moved = {i for i, _ in sql.cancel_batch(cursor, ids, actor)}
        return [i for i in ids if i in moved], sql.request_cancel(cursor, [i for i in ids if i not in moved], actor)

    batch = _match_batch("hot", filters, after, upto, limit, act)
    if batch.done or batch.flagged:
        _emit([events.stats_updated()])
    return batch


def purge_dlq_matching(filters: JobFilter, after: str | None, upto: str, limit: int) -> MatchBatch:
    """One batch of "purge all matching" over the DLQ; FailedTotal −n."""

    def act(sql: Dialect, cursor: Any, ids: list[str]) -> tuple[list[str], list[str]]:
        gone = {i for i, _ in sql.purge_dlq_ids(cursor, ids, len(ids))}
        return [i for i in ids if i in gone], []

    batch = _match_batch("dlq", filters, after, upto, limit, act)
    if batch.done:
        _emit([events.Event(events.EventKind.JOBS_PURGED,
                            {"jobIds": batch.done, "source": "DLQ", "count": len(batch.done)}),
               events.stats_updated()])
    return batch


def resurrect_matching(filters: JobFilter, after: str | None, upto: str, limit: int, *,
                       actor: str | None) -> MatchBatch:
    """One batch of "requeue all matching": DLQ → Hot exactly as ``resurrect_batch``."""

    def act(sql: Dialect, cursor: Any, ids: list[str]) -> tuple[list[str], list[str]]:
        moved = {i for i, _ in sql.resurrect_batch(cursor, ids, actor)}
        return [i for i in ids if i in moved], []

    batch = _match_batch("dlq", filters, after, upto, limit, act)
    if batch.done:
        _emit([events.stats_updated()])
    return batch


def purge_archive_ids(job_ids: Sequence[str]) -> int:
    moved = call(moves(), dialect().purge_archive_ids, job_ids) if job_ids else []
    if moved:
        _emit([events.Event(events.EventKind.JOBS_PURGED,
                            {"jobIds": [i for i, _ in moved], "source": "Archive", "count": len(moved)}),
               events.stats_updated()])
    return len(moved)


def count_archive_older_than(cutoff: datetime, limit: int) -> int:
    """Archive rows finished before ``cutoff``, counted up to ``limit``."""
    return int(call(READ, dialect().count_archive_older_than, cutoff, limit))


def count_dlq_older_than(cutoff: datetime, limit: int) -> int:
    """DLQ rows created on or before ``cutoff``, counted up to ``limit``."""
    return int(call(READ, dialect().count_dlq_older_than, cutoff, limit))


# ---------------------------------------------------------------- wake-up source


def wake_source() -> WakeSource:
    """How an idle worker learns of new jobs: LISTEN where the dialect has a notify channel (PostgreSQL), the
    commit marker where it has one (SQLite's ``data_version``; woken by writes to the database's files where they
    can be watched), else polling (SQL Server, memory mode)."""
    if memory_mode():
        return wakeup.Polling()
    channel = dialect().NOTIFY_CHANNEL
    if channel is not None:
        return wakeup.Listen(connections[alias()].get_connection_params(), channel, dialect().session_pid)
    try:
        marker = change_marker()
    except Exception:
        logger.debug("commit marker unavailable", exc_info=True)
        marker = None
    if marker is None:
        return wakeup.Polling()
    path = dialect().change_file(str(connections[alias()].settings_dict.get("NAME") or ""))
    return wakeup.CommitMarkerProbe(change_marker, watch=wakeup.FileWatch.open(path) if path else None)
