"""Each worker service on its own, without a database: storage calls are replaced by recorders."""

from __future__ import annotations

import dataclasses
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from chokaq_core import job as register_job
from chokaq_core import metrics, storage
from chokaq_core.conf import config
from chokaq_core.domain import (
    CancellationReason,
    Failure,
    FailureReason,
    HotJob,
    JobStatus,
    LeasedJobs,
    QueueState,
    RateLimit,
    Retry,
    Success,
    WorkerInfo,
    parse_rate,
)
from chokaq_core.handlers import JobContext
from chokaq_core.policy import BreakerPolicy, CircuitBreakers, Permit, RetryPolicy
from chokaq_core.sql.wakeup import CommitMarkerProbe, FileWatch, Listen, Polling
from chokaq_core.worker.completer import Completer, Outcome
from chokaq_core.worker.control import Control
from chokaq_core.worker.dispatcher import Dispatcher, Leased
from chokaq_core.worker.executions import Executions
from chokaq_core.worker.executor import Executor, ExecutorPool
from chokaq_core.worker.fetcher import Fetcher, RateLimits
from chokaq_core.worker.limits import InFlight, Limiter, PrefetchBuffer
from chokaq_core.worker.supervisor import Registry, Supervisor


def hot(n: int, queue: str = "q", type_key: str = "t", attempt: int = 0) -> HotJob:
    now = datetime.now(UTC)
    return HotJob(f"j{n}", queue, type_key, "{}", None, None, 10, JobStatus.FETCHED, attempt, "w", None, None, now,
                  None, now, None, None)


# ---------------------------------------------------------------- executions


def test_a_cancel_for_a_job_not_running_yet_applies_when_it_starts() -> None:
    executions = Executions(cancel_retention=60)
    executions.cancel("j1", "alice")
    execution = executions.begin(hot(1), attempt=1, timeout=30)
    assert (execution.token.reason, execution.token.actor) == (CancellationReason.ADMIN, "alice")
    assert executions.begin(hot(2), 1, 30).token.reason is None
    assert len(executions) == 2
    executions.end("j1")
    assert [e.job.id for e in executions.snapshot()] == ["j2"]


def test_a_remembered_cancel_expires() -> None:
    executions = Executions(cancel_retention=0)
    executions.cancel("j1", "alice")
    assert executions.begin(hot(1), 1, 30).token.reason is None


def test_database_cancel_requests_override_timeout_but_not_an_earlier_admin() -> None:
    executions = Executions(cancel_retention=60)
    timed_out = executions.begin(hot(1), 1, 30)
    timed_out.token.cancel(CancellationReason.TIMEOUT)
    by_bob = executions.begin(hot(2), 1, 30)
    executions.cancel("j2", "bob")
    executions.apply_cancel_requests([("j1", "carol"), ("j2", "carol"), ("unknown", "carol")])
    assert (timed_out.token.reason, timed_out.token.actor) == (CancellationReason.ADMIN, "carol")
    assert by_bob.token.actor == "bob"
    executions.cancel_all(CancellationReason.SHUTDOWN)
    assert by_bob.token.reason == CancellationReason.ADMIN  # admin keeps priority over shutdown


# ---------------------------------------------------------------- completer


def completion(archived: list[str], rescheduled: list[str], failed: list[str]) -> storage.Completion:
    return storage.Completion([(i, "q") for i in archived], [(i, "q") for i in rescheduled],
                              [(i, "q") for i in failed])


def test_completer_commits_in_batches_and_counts_lost_ownership(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[list[str], list[str], list[str]]] = []
    conflicts: list[list[str]] = []

    def complete(worker_id: str, successes: Any, retries: Any, failures: Any) -> storage.Completion:
        calls.append(([o.job_id for o in successes], [o.job_id for o in retries], [o.job_id for o in failures]))
        return completion([o.job_id for o in successes if o.job_id != "lost"], [o.job_id for o in retries],
                          [o.job_id for o in failures])

    monkeypatch.setattr(storage, "complete", complete)
    monkeypatch.setattr("chokaq_core.metrics.completion_conflicts", lambda o: conflicts.append([x.job_id for x in o]))
    completer = Completer("w", batch_size=2, flush_interval=0, stopped=threading.Event())
    for outcome in (Success("a", 1.0), Retry("b", 1, 0.5), Failure("c", FailureReason.FATAL_ERROR, "x"),
                    Success("lost", 1.0)):
        completer.submit(outcome)
    assert completer.pending()
    completer.flush()
    assert calls == [(["a"], ["b"], []), (["lost"], [], ["c"])]
    assert conflicts == [["lost"]]
    assert not completer.pending()


def test_completer_gathers_again_for_what_arrives_while_a_batch_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outcomes handed over during a commit wait for the next gather (a busy completer that took them at once
    committed a transaction per few jobs); a whole batch waiting is committed at once."""
    stopped = threading.Event()
    steps: list[str | list[str]] = []

    def complete(worker_id: str, successes: Any, retries: Any, failures: Any) -> storage.Completion:
        steps.append([o.job_id for o in successes])
        if len(steps) == 2:  # the first batch is committing: three more jobs finish meanwhile
            for job_id in ("b", "c", "d"):
                completer.submit(Success(job_id, 1.0))
        if "d" in steps[-1]:
            stopped.set()
        return completion([o.job_id for o in successes], [], [])

    def gather(seconds: float) -> None:
        steps.append("gather")

    monkeypatch.setattr(storage, "complete", complete)
    monkeypatch.setattr("chokaq_core.worker.completer.time.sleep", gather)
    completer = Completer("w", batch_size=2, flush_interval=0.02, stopped=stopped)
    completer.submit(Success("a", 1.0))
    runner = threading.Thread(target=completer.run, daemon=True)
    runner.start()
    runner.join(5)
    assert steps == ["gather", ["a"], ["b", "c"], "gather", ["d"]]
    assert not completer.pending()


def test_what_gathers_in_one_flush_interval_of_a_fast_drain_commits_as_one_batch_at_the_defaults(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A default worker draining no-op jobs on PostgreSQL (~11,000 a second) gathers ~450 outcomes per flush
    interval and its commit: one transaction at the defaults. Cut at 200, each gather was two or three moves, and
    over many queues each move writes every queue's counter, bucket and history rows again."""
    calls: list[int] = []

    def complete(worker_id: str, successes: Any, retries: Any, failures: Any) -> storage.Completion:
        calls.append(len(successes))
        return completion([o.job_id for o in successes], [], [])

    monkeypatch.setattr(storage, "complete", complete)
    wk = config().WORKER
    completer = Completer("w", wk.COMPLETION_BATCH_SIZE, wk.COMPLETION_FLUSH_INTERVAL, threading.Event())
    for n in range(450):
        completer.submit(Success(f"j{n}", 0.01))
    completer.flush(gathered=True)
    assert calls == [450]


def test_completer_keeps_a_batch_while_the_database_is_away(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[int] = []

    def complete(worker_id: str, successes: Any, retries: Any, failures: Any) -> storage.Completion:
        attempts.append(len(successes))
        if len(attempts) == 1:
            raise ConnectionError("database restarting")
        return completion([o.job_id for o in successes], [], [])

    monkeypatch.setattr(storage, "complete", complete)
    completer = Completer("w", batch_size=10, flush_interval=0, stopped=threading.Event())
    completer.submit(Success("a", 1.0))
    completer.flush()
    assert attempts == [1, 1] and not completer.pending()


def test_finished_jobs_stay_alive_until_their_outcome_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A handler that finished is no longer an execution, but its row is still Processing and ours until the
    completer commits: the supervisor keeps beating the outcomes queued behind a slow or retried commit (not the
    batch in flight, whose rows the completion has locked)."""
    beaten: list[list[str]] = []

    def keep_alive(ids: list[str], worker_id: str) -> list[str]:
        beaten.append(sorted(ids))
        return list(ids)

    committing: list[list[str]] = []

    def complete(worker_id: str, successes: Any, retries: Any, failures: Any) -> storage.Completion:
        supervisor.keep_alive([])  # a heartbeat while the batch is being committed
        committing.append(sorted(completer.awaiting()))
        return completion([o.job_id for o in successes], [o.job_id for o in retries], [])

    monkeypatch.setattr(storage, "keep_alive", keep_alive)
    monkeypatch.setattr(storage, "complete", complete)
    completer = Completer("w", batch_size=1, flush_interval=0, stopped=threading.Event())
    executions = Executions(60)
    supervisor = Supervisor("w", supervision(), executions, Registry("w", lambda: None), threading.Event(),  # type: ignore[arg-type]
                            completer.awaiting)
    running = executions.begin(hot(3), 1, 30)
    completer.submit(Success("a", 1.0))
    completer.submit(Retry("b", 1, 0.5))
    supervisor.keep_alive([running])
    assert beaten == [["a", "b", running.job.id]]
    completer.flush()
    assert committing == [["b"], []]  # what still waits behind the batch in flight
    assert beaten[1:] == [["b"]]  # a heartbeat during the last commit had nothing to beat
    assert completer.awaiting() == []
    supervisor.keep_alive([])
    assert len(beaten) == 2  # nothing running and nothing awaiting: no statement at all


# ---------------------------------------------------------------- fetcher


def test_fetcher_claims_again_at_once_after_a_full_batch_and_stops_a_burst_when_idle(
        monkeypatch: pytest.MonkeyPatch) -> None:
    batches = [[hot(1), hot(2)], [hot(3)], [], []]
    limits: list[int] = []

    def fetch_batch(worker_id: str, limit: int, queues: Any) -> list[HotJob]:
        limits.append(limit)
        return batches.pop(0) if batches else []

    monkeypatch.setattr(storage, "fetch_batch", fetch_batch)
    buffer, in_flight, stopping = PrefetchBuffer(10), InFlight(), threading.Event()
    done: list[bool] = []
    fetcher = Fetcher("w", None, batch_size=2, polling_interval=60, buffer=buffer, in_flight=in_flight,
                      stopping=stopping, burst_idle=lambda: not len(buffer.drain()),
                      on_burst_done=lambda: done.append(True))
    fetcher.run()
    assert done == [True]
    # after a full batch (a backlog) the claim takes all the room there is (8 of 10); then batch-sized again;
    # the empty claims: the buffer was not idle, then idle once, then twice
    assert limits == [2, 8, 2, 2, 2]
    assert bool(in_flight)


def test_the_fetcher_waits_on_its_wake_source_itself_and_claims_when_it_signals(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No thread hands the signal on: the source is read before the first claim (nothing enqueued meanwhile is
    missed), a signal ends the idle wait with a claim at once, and the fetcher closes the source when it ends."""
    stopping = threading.Event()
    calls: list[str] = []

    def fetch_batch(worker_id: str, limit: int, queues: Any) -> list[HotJob]:
        calls.append("claim")
        return []

    class Source:
        kind = "listen"
        closed = False

        def wait(self, timeout: float) -> bool:
            calls.append(f"wait {timeout:g}")
            if calls.count("claim") == 2:
                stopping.set()
            return True

        def close(self) -> None:
            self.closed = True

    monkeypatch.setattr(storage, "fetch_batch", fetch_batch)
    fetcher = Fetcher("w", None, 1, 60, PrefetchBuffer(1), InFlight(), stopping)
    fetcher.source = source = Source()  # type: ignore[assignment]
    fetcher.run()
    assert calls == ["wait 0", "claim", "wait 60", "claim", "wait 60"]
    assert source.closed


def test_closing_the_wake_source_ends_an_idle_fetchers_wait() -> None:
    """stop() closes the source: the fetcher's wait ends at once, whatever its polling interval."""
    stopping = threading.Event()
    fetcher = Fetcher("w", None, 1, 3600, PrefetchBuffer(1), InFlight(), stopping)
    fetcher.source = source = Polling()
    waiter = threading.Thread(target=fetcher._idle, args=(3600,))
    waiter.start()
    source.close()
    waiter.join(5)
    assert not waiter.is_alive()


# ---------------------------------------------------------------- dispatcher


class Recorder:
    def __init__(self) -> None:
        self.submitted: list[Leased] = []
        self.outcomes: list[Outcome] = []
        self.released: list[list[str]] = []
        self.lease_limits: list[list[RateLimit]] = []  # the rate limits each lease was given


def dispatcher(monkeypatch: pytest.MonkeyPatch, rec: Recorder, leased: dict[str, int] | Exception,
               paused: set[str] = frozenset(), threshold: int = 5,  # type: ignore[assignment]
               held: tuple[str, ...] = (), rate_limits: RateLimits | None = None
               ) -> tuple[Dispatcher, Limiter, InFlight]:
    def mark(jobs: Any, worker_id: str, rate_limits: Sequence[RateLimit] = ()) -> LeasedJobs:
        rec.lease_limits.append(list(rate_limits))
        if isinstance(leased, Exception):
            raise leased
        result = LeasedJobs(leased)
        result.held = held
        return result

    monkeypatch.setattr(storage, "mark_processing_batch", mark)
    monkeypatch.setattr(storage, "release_jobs", lambda ids, w: rec.released.append(list(ids)) or len(ids))
    monkeypatch.setattr(storage, "queue_states",
                        lambda: [QueueState(name, True, True, None, None) for name in paused])
    limiter, in_flight = Limiter(4, 4), InFlight()
    breakers = CircuitBreakers(BreakerPolicy(failure_threshold=threshold))
    return (Dispatcher("w", 10, 7.0, PrefetchBuffer(10), limiter, in_flight, breakers, threading.Event(),
                       rec.submitted.extend, rec.outcomes.append, rate_limits), limiter, in_flight)


def run_until(d: Dispatcher, jobs: list[HotJob], in_flight: InFlight, done: Callable[[], bool]) -> None:
    """Buffer ``jobs``, run the dispatcher loop until ``done()``, then stop it."""
    in_flight.add(len(jobs))
    d.buffer.put_many(jobs)
    thread = threading.Thread(target=d.run)
    thread.start()
    deadline = time.monotonic() + 5
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)
    d.stopping.set()
    thread.join(5)
    assert not thread.is_alive() and done()


def test_dispatcher_leases_a_gathered_batch_and_submits_what_is_still_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder()
    d, limiter, in_flight = dispatcher(monkeypatch, rec, leased={"j1": 1, "j3": 2})
    run_until(d, [hot(1), hot(2), hot(3)], in_flight, lambda: len(rec.submitted) == 2 and limiter.running == 2)
    assert [(job.id, attempt) for job, attempt, _ in rec.submitted] == [("j1", 1), ("j3", 2)]
    assert limiter.running == 2  # j2's lease was rejected: its slot is free again
    assert rec.released == []


def test_dispatcher_frees_the_slots_of_jobs_a_rate_limit_held_back_at_their_lease(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder()
    limits = RateLimits(None)
    capped = RateLimit("type:t", parse_rate("5/s"))
    limits._limits, limits._read_at = [capped], float("inf")  # read: no database
    conflicts: list[object] = []
    monkeypatch.setattr(metrics, "transition_conflict", lambda *args: conflicts.append(args))
    d, limiter, in_flight = dispatcher(monkeypatch, rec, leased={"j1": 1}, held=("j2", "j3"), rate_limits=limits)
    run_until(d, [hot(1), hot(2), hot(3)], in_flight, lambda: len(rec.submitted) == 1 and limiter.running == 1)
    assert rec.lease_limits == [[capped]], "the lease spends the tokens of the limits the fetcher follows"
    assert [job.id for job, _, _ in rec.submitted] == ["j1"]
    assert rec.released == [], "the lease already sent them back to Pending"
    assert in_flight._count == 1, "held jobs are no longer in flight"
    assert conflicts == [], "a job held back by a limit is no lost lease"


def test_dispatcher_releases_rows_of_paused_queues(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder()
    d, _, in_flight = dispatcher(monkeypatch, rec, leased={"j2": 1}, paused={"stopped"})
    run_until(d, [hot(1, queue="stopped"), hot(2)], in_flight, lambda: bool(rec.released and rec.submitted))
    assert rec.released == [["j1"]]
    assert [job.id for job, _, _ in rec.submitted] == ["j2"]


def open_circuit(d: Dispatcher, job_type: str) -> None:
    """Open ``job_type``'s circuit (threshold 1: one failure)."""
    breaker = d.breakers.get(job_type)
    permit = breaker.acquire()
    assert permit is not None
    breaker.failure(permit, fatal=False)


def test_dispatcher_defers_a_job_whose_circuit_is_open_without_an_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder()
    d, limiter, in_flight = dispatcher(monkeypatch, rec, leased={}, threshold=1)
    open_circuit(d, "t")
    run_until(d, [hot(1, attempt=3)], in_flight, lambda: bool(rec.outcomes) and not in_flight)
    assert rec.outcomes == [Retry("j1", 3, 7.0, held_by="t")] and rec.submitted == []
    assert limiter.running == 0 and not in_flight


def leased_at_claim(n: int, attempt: int = 1) -> HotJob:
    return dataclasses.replace(hot(n, attempt=attempt), status=JobStatus.PROCESSING)


def test_rows_leased_at_the_claim_start_on_their_reserved_slots_and_the_unused_slots_are_freed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder()
    d, limiter, in_flight = dispatcher(monkeypatch, rec, leased={})
    assert d.reserve(10) == 4 and limiter.running == 4  # never more than the free slots, never waiting
    in_flight.add(2)
    d.start_claimed([leased_at_claim(1), leased_at_claim(2, attempt=3)], 4)
    assert [(job.id, attempt) for job, attempt, _ in rec.submitted] == [("j1", 1), ("j2", 3)]
    assert limiter.running == 2 and rec.outcomes == [] and rec.lease_limits == []  # no lease statement of their own


def test_a_row_leased_at_the_claim_whose_circuit_is_open_or_met_at_shutdown_counts_no_attempt(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder()
    d, limiter, in_flight = dispatcher(monkeypatch, rec, leased={}, threshold=1)
    open_circuit(d, "t")
    in_flight.add(1)
    d.start_claimed([leased_at_claim(1, attempt=4)], d.reserve(1))
    assert rec.outcomes == [Retry("j1", 3, 7.0, held_by="t")] and rec.submitted == []
    d.stopping.set()
    in_flight.add(1)
    d.start_claimed([leased_at_claim(2, attempt=1)], d.reserve(1))
    assert rec.outcomes[1:] == [Retry("j2", 0, 0.0)] and rec.submitted == []
    assert limiter.running == 0 and not in_flight


def test_dispatcher_releases_the_batch_when_the_lease_gate_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder()
    d, limiter, in_flight = dispatcher(monkeypatch, rec, leased=ConnectionError("gone"))
    run_until(d, [hot(1), hot(2)], in_flight, lambda: bool(rec.released) and not in_flight)
    assert rec.released == [["j1", "j2"]] and rec.submitted == []
    assert limiter.running == 0 and not in_flight


# ---------------------------------------------------------------- executor


@register_job("unit.exit.v1")
def exits(ctx: JobContext, how: str = "system") -> str:
    if how == "system":
        sys.exit(2)
    if how == "interrupt":
        raise KeyboardInterrupt
    return "done"


def executor(outcomes: list[Outcome], finished: list[bool]) -> Executor:
    cfg = config()
    return Executor(cfg, RetryPolicy(max_attempts=3, base_delay=1, max_delay=10, multiplier=2, jitter=0,
                                     max_job_age=None),
                    CircuitBreakers(BreakerPolicy()), [], None, Executions(60), threading.Event(), outcomes.append,
                    lambda ran: finished.append(True))


@pytest.mark.parametrize("how, name", [("system", "SystemExit"), ("interrupt", "KeyboardInterrupt")])
def test_a_handler_asking_the_process_to_exit_fails_its_job_fatally(how: str, name: str) -> None:
    outcomes: list[Outcome] = []
    finished: list[bool] = []
    run = executor(outcomes, finished)
    job = HotJob("j1", "q", "unit.exit.v1", f'{{"how": "{how}"}}', None, None, 10, JobStatus.PROCESSING, 1, "w",
                 None, None, datetime.now(UTC), None, datetime.now(UTC), None, None)
    permit = run.breakers.get(job.type).acquire()
    assert permit is not None
    run.execute((job, 1, permit))
    [outcome] = outcomes
    assert isinstance(outcome, Failure) and outcome.reason == FailureReason.FATAL_ERROR
    assert name in outcome.error_details
    assert finished == [True] and len(run.executions) == 0


def test_a_handler_that_returns_succeeds_with_its_result() -> None:
    outcomes: list[Outcome] = []
    run = executor(outcomes, [])
    job = HotJob("j1", "q", "unit.exit.v1", '{"how": "return"}', None, None, 10, JobStatus.PROCESSING, 1, "w",
                 None, None, datetime.now(UTC), None, datetime.now(UTC), None, None)
    permit = run.breakers.get(job.type).acquire()
    assert permit is not None
    run.execute((job, 1, permit))
    [outcome] = outcomes
    assert isinstance(outcome, Success) and outcome.result is not None and "done" in outcome.result


def test_a_job_leased_ahead_and_met_by_shutdown_goes_back_without_its_attempt() -> None:
    """A job that waited for an executor and finds the worker stopping never started: rescheduled at once with the
    attempts it had before its lease, its circuit permit given back, its slot freed."""
    outcomes: list[Outcome] = []
    finished: list[bool] = []
    run = executor(outcomes, finished)
    job = HotJob("j1", "q", "unit.exit.v1", '{"how": "return"}', None, None, 10, JobStatus.PROCESSING, 3, "w",
                 None, None, datetime.now(UTC), None, datetime.now(UTC), None, None)
    breaker = run.breakers.get(job.type)
    permit = breaker.acquire()
    assert permit is not None
    run.stopping.set()
    run.execute((job, 3, permit))
    assert outcomes == [Retry("j1", 2, 0.0)] and finished == [True]
    assert len(run.executions) == 0 and breaker.snapshot()["failureCount"] == 0


def test_jobs_waiting_for_an_executor_are_named_for_the_heartbeats() -> None:
    """Leased ahead, a job waits in the executors' queue Processing and ours: ``Executions`` names it as waiting
    (the supervisor beats it) until an executor begins it, in the same step that makes it running."""
    started, release = threading.Event(), threading.Event()
    executions = Executions(60)

    def run(item: Leased) -> None:
        executions.begin(item[0], item[1], 30)
        started.set()
        release.wait(5)
        executions.end(item[0].id)

    pool = ExecutorPool(run, executions)
    pool.submit([(hot(1), 1, Permit("t", 0, False))])
    pool.submit([(hot(2), 1, Permit("t", 0, False))])
    assert executions.beats() == ([], ["j1", "j2"])
    pool.grow(1)
    assert started.wait(5)
    running, waiting = executions.beats()
    assert [e.job.id for e in running] == ["j1"] and waiting == ["j2"]
    release.set()
    pool.close(5)
    assert executions.beats() == ([], [])


def test_shutdown_takes_the_jobs_no_executor_has_taken() -> None:
    """At shutdown the jobs still waiting for an executor are taken out of its queue at once (to go back without
    their attempt), not after the running handlers end; the executors' stop signals stay in the queue."""
    executions = Executions(60)
    ran: list[str] = []
    pool = ExecutorPool(lambda item: ran.append(item[0].id), executions)
    pool.submit([(hot(1), 1, Permit("t", 0, False))])
    pool.submit([(hot(2), 1, Permit("t", 0, False))])
    assert [item[0].id for item in pool.take_waiting()] == ["j1", "j2"]
    assert pool.take_waiting() == []
    pool.grow(1)
    pool.close(5)
    assert ran == []


def test_an_executor_thread_starts_only_when_a_job_finds_none_free_and_never_beyond_the_capacity() -> None:
    """Jobs arriving one at a time run on one thread (one database connection), not on each of the capacity's
    threads in turn; jobs arriving together start threads up to the capacity, and no further."""
    executions = Executions(60)
    ran: list[str] = []
    release = threading.Event()
    finished = threading.Semaphore(0)

    def run(item: Leased) -> None:
        ran.append(threading.current_thread().name)
        if item[0].id.startswith("jb"):
            release.wait(5)
        finished.release()

    pool = ExecutorPool(run, executions)
    pool.grow(4)
    assert pool.threads == 0
    for n in range(5):
        pool.submit([(hot(n), 1, Permit("t", 0, False))])
        assert finished.acquire(timeout=5)
        while pool._spare < 1:  # the thread counts itself free just after its job returns
            time.sleep(0.001)
    assert pool.threads == 1 and set(ran) == {"chokaq-exec-1"}
    busy = [dataclasses.replace(hot(n), id=f"jb{n}") for n in range(6)]
    for job in busy:
        pool.submit([(job, 1, Permit("t", 0, False))])
    assert pool.threads == 4, "the free thread took one, three more started, the capacity holds the rest"
    release.set()
    for _ in busy:
        assert finished.acquire(timeout=5)
    assert pool.threads == 4 and len(ran) == 11
    pool.close(5)


def refuse_the_first_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The system refuses the executor pool's next thread (``RuntimeError``, as ``Thread.start`` raises it), then
    starts them again."""
    from chokaq_core.worker import executor

    real_start = executor.start_thread
    refusals = [RuntimeError("can't start new thread")]

    def start(name: str, target: Callable[[], None]) -> threading.Thread:
        if refusals:
            raise refusals.pop()
        return real_start(name, target)

    monkeypatch.setattr(executor, "start_thread", start)


def test_an_executor_thread_the_system_refuses_leaves_the_job_queued_for_the_next_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    finished = threading.Semaphore(0)
    refuse_the_first_thread(monkeypatch)
    pool = ExecutorPool(lambda item: (ran.append(item[0].id), finished.release()), Executions(60))
    pool.grow(2)
    pool.submit([(hot(1), 1, Permit("t", 0, False))])  # refused: queued, nothing raised to the dispatcher
    assert pool.threads == 0 and ran == []
    pool.submit([(hot(2), 1, Permit("t", 0, False))])
    assert finished.acquire(timeout=5) and finished.acquire(timeout=5)
    assert sorted(ran) == ["j1", "j2"] and pool.threads == 2, "the second submission started one for each"
    pool.close(5)


def test_a_job_whose_executor_thread_was_refused_starts_on_the_supervisors_tick_without_another_submission(
        monkeypatch: pytest.MonkeyPatch) -> None:
    finished = threading.Event()
    ran_on: list[str] = []
    refuse_the_first_thread(monkeypatch)
    monkeypatch.setattr(storage, "keep_alive", lambda ids, worker_id: list(ids))
    executions = Executions(60)
    pool = ExecutorPool(lambda item: (ran_on.append(threading.current_thread().name), finished.set()), executions)
    pool.grow(2)
    pool.submit([(hot(1), 1, Permit("t", 0, False))])  # refused: queued with no thread to take it
    assert pool.threads == 0 and not finished.is_set()
    stopped = threading.Event()
    supervisor = Supervisor("w", supervision(), executions, Registry("w", lambda: None), stopped,  # type: ignore[arg-type]
                            start_needed=pool.start_needed)
    thread = threading.Thread(target=supervisor.run, daemon=True)
    thread.start()
    try:
        assert finished.wait(5), "the supervisor's tick started the thread the job waited for"
        assert ran_on == ["chokaq-exec-1"]
    finally:
        stopped.set()
        thread.join(5)
        pool.close(5)


def test_a_heartbeat_never_names_a_row_a_completion_has_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """A heartbeat reads what to beat and sends its UPDATE while the completer cannot take a batch: the completion
    of a job that finished meanwhile waits for the heartbeat (their statements lock rows in different orders, so a
    heartbeat naming rows a completion had locked deadlocked with it, and hung while it waited)."""
    executions = Executions(60)
    completer = Completer("w", batch_size=10, flush_interval=0, stopped=threading.Event())
    supervisor = Supervisor("w", supervision(), executions, Registry("w", lambda: None), threading.Event(),  # type: ignore[arg-type]
                            completer.awaiting, completer.taking)
    running = executions.begin(hot(1), 1, 30)
    events: list[str] = []
    flusher: list[threading.Thread] = []

    def keep_alive(ids: list[str], worker_id: str) -> list[str]:
        events.append(f"beat {sorted(ids)}")
        executions.end(running.job.id)  # the job finishes while its heartbeat is on the wire
        completer.submit(Success(running.job.id, 1.0))
        flusher.append(threading.Thread(target=completer.flush))
        flusher[0].start()
        flusher[0].join(0.3)  # the completer cannot take the batch yet
        events.append("beat returns")
        return list(ids)

    def complete(worker_id: str, successes: Any, retries: Any, failures: Any) -> storage.Completion:
        events.append(f"commit {[o.job_id for o in successes]}")
        return completion([o.job_id for o in successes], [], [])

    monkeypatch.setattr(storage, "keep_alive", keep_alive)
    monkeypatch.setattr(storage, "complete", complete)
    supervisor.beat()
    flusher[0].join(5)
    assert events == ["beat ['j1']", "beat returns", "commit ['j1']"]


def test_a_batch_waiting_to_retry_its_commit_is_beaten(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch whose commit failed holds no lock while it waits to try again: its rows are beaten meanwhile."""
    completer = Completer("w", batch_size=10, flush_interval=0, stopped=threading.Event())
    seen: list[list[str]] = []
    calls = iter([ConnectionError("away"), None])

    def complete(worker_id: str, successes: Any, retries: Any, failures: Any) -> storage.Completion:
        if (error := next(calls)) is not None:
            raise error
        return completion([o.job_id for o in successes], [], [])

    def sleep(seconds: float) -> None:
        seen.append(completer.awaiting())

    monkeypatch.setattr(storage, "complete", complete)
    monkeypatch.setattr("chokaq_core.worker.completer.time.sleep", sleep)
    completer.submit(Success("a", 1.0))
    completer.submit(Success("b", 1.0))
    completer.flush()
    assert seen == [["a", "b"]] and completer.awaiting() == []


# ---------------------------------------------------------------- supervisor, registry, control


def supervision(threshold: int = 2, cancel_on_failure: bool = True) -> SimpleNamespace:
    return SimpleNamespace(EXECUTION=SimpleNamespace(
        HEARTBEAT_FAILURE_THRESHOLD=threshold, CANCEL_ON_HEARTBEAT_FAILURE=cancel_on_failure,
        HEARTBEAT_INTERVAL_MIN=0.2, HEARTBEAT_INTERVAL_MAX=0.3, CANCEL_POLL_INTERVAL=0.1,
    ), WORKER=SimpleNamespace(REGISTRY_HEARTBEAT_INTERVAL=1))


def test_keep_alive_stops_beating_for_jobs_no_longer_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "keep_alive", lambda ids, worker_id: ["j1"])
    executions = Executions(60)
    mine, lost = executions.begin(hot(1), 1, 30), executions.begin(hot(2), 1, 30)
    supervisor = Supervisor("w", supervision(), executions, Registry("w", lambda: None), threading.Event())  # type: ignore[arg-type]
    supervisor.keep_alive(executions.snapshot())
    assert (mine.beating, lost.beating) == (True, False)


@pytest.mark.parametrize("cancel_on_failure", [True, False])
def test_repeated_keep_alive_failures_cancel_running_jobs_when_configured(monkeypatch: pytest.MonkeyPatch,
                                                                         cancel_on_failure: bool) -> None:
    def down(ids: Any, worker_id: str) -> list[str]:
        raise ConnectionError("gone")

    monkeypatch.setattr(storage, "keep_alive", down)
    monkeypatch.setattr("chokaq_core.metrics.heartbeat_failed", lambda jobs: list(jobs))
    executions = Executions(60)
    running = executions.begin(hot(1), 1, 30)
    supervisor = Supervisor("w", supervision(2, cancel_on_failure), executions, Registry("w", lambda: None),  # type: ignore[arg-type]
                            threading.Event())
    supervisor.keep_alive(executions.snapshot())
    assert running.token.reason is None
    supervisor.keep_alive(executions.snapshot())
    assert running.token.reason == (CancellationReason.HEARTBEAT_FAILURE if cancel_on_failure else None)


def test_an_execution_past_its_deadline_is_cancelled_as_timeout() -> None:
    executions = Executions(60)
    late, on_time = executions.begin(hot(1), 1, timeout=-1), executions.begin(hot(2), 1, timeout=60)
    supervisor = Supervisor("w", supervision(), executions, Registry("w", lambda: None), threading.Event())  # type: ignore[arg-type]
    supervisor.enforce_timeouts(executions.snapshot(), time.monotonic())
    assert (late.token.reason, on_time.token.reason) == (CancellationReason.TIMEOUT, None)


def test_registry_writes_until_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[str] = []
    monkeypatch.setattr(storage, "upsert_worker", lambda info: written.append(info.worker_id))
    monkeypatch.setattr(storage, "stop_worker", lambda worker_id: written.append(f"stop {worker_id}"))
    info = WorkerInfo(worker_id="w", hostname="h", pid=1, queues="*", capacity=1, active_count=0,
                      runtime_json="{}", circuits_json="[]")
    registry = Registry("w", lambda: info)
    registry.write()
    registry.close()
    registry.write()
    assert written == ["w", "stop w"]


def test_control_applies_capacity_retry_policy_and_cancel_for_this_worker_only() -> None:
    limiter, grown, changed = Limiter(2, 8), [], []
    outcomes: list[Outcome] = []
    run = executor(outcomes, [])
    control = Control("w1", limiter, grown.append, run, run.executions, lambda: changed.append(True))
    control.handle({"type": "worker.set_capacity", "capacity": 5, "workerId": "other"})
    assert limiter.capacity == 2
    control.handle({"type": "worker.set_capacity", "capacity": 50})
    assert (limiter.capacity, grown) == (8, [8])
    control.handle({"type": "worker.set_retry_policy", "max_attempts": 9, "base_delay_seconds": 0.5})
    assert (run.retry_policy.max_attempts, run.retry_policy.base_delay, run.retry_policy.max_delay) == (9, 0.5, 10)
    running = run.executions.begin(hot(1), 1, 30)
    control.handle({"type": "worker.cancel_job", "jobId": "j1", "actor": "ops"})
    assert (running.token.reason, running.token.actor) == (CancellationReason.ADMIN, "ops")
    assert changed == [True, True]


# ---------------------------------------------------------------- wake-up sources


def test_polling_waits_its_timeout_and_close_ends_the_wait() -> None:
    source = Polling()
    assert source.wait(0.01) is False
    results: list[bool] = []
    waiting = threading.Thread(target=lambda: results.append(source.wait(3600)))
    waiting.start()
    source.close()
    waiting.join()  # an hour's wait that close() did not end outlasts the test's timeout: the test fails
    assert results == [False]
    assert source.wait(3600) is False  # closed: later waits return at once too


def marker_reader(values: list[Any]) -> Callable[[], int | None]:
    def read() -> int | None:
        value = values.pop(0) if len(values) > 1 else values[0]
        if isinstance(value, Exception):
            raise value
        return value  # type: ignore[no-any-return]

    return read


def test_commit_marker_probe_signals_when_the_marker_moves() -> None:
    probe = CommitMarkerProbe(marker_reader([1, 1, 1, 2]), interval=0.001)
    assert probe.wait(5) is True
    assert probe.wait(0.02) is False  # still 2


def test_commit_marker_probe_reads_less_often_once_the_marker_stopped_moving() -> None:
    """Every ``interval`` while commits come and go; every ``idle_interval`` after ``idle_after`` without one."""
    probe = CommitMarkerProbe(marker_reader([1, 1, 2]), interval=0.001, idle_interval=0.004, idle_after=60)
    start = time.monotonic()
    assert probe.pace(start) == 0.001
    assert probe.pace(start + 61) == 0.004
    assert probe.wait(5) is True  # the move: fast reads again from now on
    assert probe.pace(time.monotonic()) == 0.001 and probe.pace(time.monotonic() + 61) == 0.004


def test_commit_marker_probe_treats_an_unreadable_marker_as_no_signal() -> None:
    probe = CommitMarkerProbe(marker_reader([1, RuntimeError("locked")]), interval=0.001)
    assert probe.wait(0.02) is False
    probe.close()
    assert probe.wait(5) is False


def _closing_from_another_thread_ends_the_wait(probe: CommitMarkerProbe, timeout: float) -> None:
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(probe.wait(timeout)))
    waiter.start()
    time.sleep(0.05)
    probe.close()
    waiter.join(5)
    assert not waiter.is_alive() and result == [False]


def test_closing_a_commit_marker_probe_from_another_thread_ends_its_wait() -> None:
    _closing_from_another_thread_ends_the_wait(CommitMarkerProbe(marker_reader([1]), interval=0.001), 60)


def watched_database(tmp_path: Any) -> tuple[str, Callable[[], None], Callable[[], int | None]]:
    """A WAL database file, a commit on a connection of its own, and the data_version of another connection."""
    import sqlite3

    path = str(tmp_path / "db.sqlite3")
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("CREATE TABLE t (x)")
    reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    return (path, lambda: writer.execute("INSERT INTO t VALUES (1)") and None,
            lambda: int(reader.execute("PRAGMA data_version").fetchone()[0]))


def test_a_write_to_the_database_files_wakes_a_watched_probe_long_before_its_next_read(tmp_path: Any) -> None:
    path, commit, read = watched_database(tmp_path)
    watch = FileWatch.open(path)
    assert watch is not None  # Linux: inotify is there
    probe = CommitMarkerProbe(read, interval=3600, idle_interval=3600, watch=watch)
    assert probe.wait(0) is False
    timer = threading.Timer(0.1, commit)
    timer.start()
    started = time.monotonic()
    assert probe.wait(30) is True  # without the watch: the next read is an hour away, the wait ends False
    assert time.monotonic() - started < 10
    timer.join()
    probe.close()


def test_a_file_watch_ignores_writes_to_other_files_of_the_directory(tmp_path: Any) -> None:
    path, commit, _ = watched_database(tmp_path)
    watch = FileWatch.open(path)
    assert watch is not None
    assert watch.written() is False
    (tmp_path / "other.log").write_text("x")
    assert watch.written() is False
    commit()
    assert watch.written() is True
    assert watch.written() is False  # taken
    watch.close()


def test_closing_a_watched_probe_from_another_thread_ends_its_wait(tmp_path: Any) -> None:
    path, _, read = watched_database(tmp_path)
    probe = CommitMarkerProbe(read, idle_interval=3600, watch=FileWatch.open(path))
    _closing_from_another_thread_ends_the_wait(probe, 3600)
    assert probe.wait(3600) is False


def test_the_sqlite_dialect_names_its_database_file_for_a_watch_and_none_in_memory() -> None:
    from chokaq_core.sql.postgresql import DIALECT as POSTGRESQL
    from chokaq_core.sql.sqlite import DIALECT as SQLITE

    assert SQLITE.change_file("/var/db.sqlite3") == "/var/db.sqlite3"
    assert SQLITE.change_file("file:/var/db.sqlite3?mode=rw") == "/var/db.sqlite3"
    assert SQLITE.change_file(":memory:") is None
    assert SQLITE.change_file("file:x?mode=memory&cache=shared") is None
    assert POSTGRESQL.change_file("chokaq") is None


def test_listen_closed_while_waiting_ends_the_wait_and_leaves_its_connection_to_the_waiting_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    source = Listen({}, "chokaq_jobs")
    quiet, _ = socket.socketpair()  # a server socket nothing arrives on
    events_seen: list[str] = []

    class Connection:
        def notifies(self, timeout: float) -> list[str]:
            events_seen.append("polled")
            return []

        def fileno(self) -> int:
            return quiet.fileno()

        def close(self) -> None:
            events_seen.append("closed")

    monkeypatch.setattr(source, "_connect", Connection)
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(source.wait(3600)))
    waiter.start()
    deadline = time.monotonic() + 5
    while not events_seen and time.monotonic() < deadline:  # the wait has polled its connection once
        time.sleep(0.01)
    assert events_seen == ["polled"]
    source.close()
    waiter.join(5)
    assert not waiter.is_alive() and result == [False]
    assert events_seen == ["polled", "closed"]  # closed by the waiting thread, once its wait ended
    assert source.wait(3600) is False
    quiet.close()


def test_listen_takes_every_notification_already_arrived_in_one_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst of enqueues wakes the fetcher once: the wait that sees them takes them all."""
    source = Listen({}, "chokaq_jobs")
    queued = ["a", "b", "c"]

    class Connection:
        def notifies(self, timeout: float) -> list[str]:
            taken, queued[:] = list(queued), []
            return taken

        def close(self) -> None:
            pass

    monkeypatch.setattr(source, "_connect", Connection)
    assert source.wait(0) is True
    assert queued == []
    source.close()


def test_memory_mode_polls(chokaq_settings: Any) -> None:
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "STORAGE": "memory"}
    assert storage.wake_source().kind == "poll"


def test_listen_backs_off_after_a_lost_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    source = Listen({"dbname": "x", "cursor_factory": object(), "context": object()}, "chokaq_jobs")
    assert set(source.params) == {"dbname"}
    attempts: list[int] = []

    def connect() -> Any:
        attempts.append(1)
        raise ConnectionError("refused")

    monkeypatch.setattr(source, "_connect", connect)
    assert source.wait(0.01) is False
    assert source.wait(0.01) is False  # within the reconnect delay: no new attempt
    assert attempts == [1]
    source.close()
    assert source.wait(5) is False


def test_a_worker_leases_ahead_as_far_as_its_prefetch_buffer_holds() -> None:
    """Short executions let leases run ahead of the executors by a prefetch buffer's worth, not one fetch batch:
    with one batch the slots (executors + batch) bounded a drain of short jobs to slots per lease round trip."""
    from chokaq_core.worker.process import Worker, WorkerOptions

    worker = Worker(WorkerOptions(concurrency=2, batch_size=5))
    for _ in range(50):
        worker.limiter.pace(1e-6)
    assert worker.limiter.ahead == config().WORKER.PREFETCH_CAPACITY
