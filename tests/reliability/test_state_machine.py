"""Stateful property test of the job lifecycle: random sequences of transitions, invariants after each.

A hypothesis ``RuleBasedStateMachine`` drives ``chokaq_core.storage`` (and ``api.enqueue``) exactly as
workers, the maintenance loop and operators do — enqueue, claim, start, heartbeat, succeed / fail / retry
(sometimes with the wrong worker id or a stale id), cancel, resurrect, purge, zombie sweep and
abandoned-fetch recovery — and keeps a model of where every job must be. After every step the
invariants are checked with plain ORM reads (never through the code under test):

* every id the model knows is in exactly one pillar (Hot, Archive, DLQ), the one the model expects,
  and no row exists that the model does not know; a purged id is nowhere;
* Hot statuses are only 0–2 and each row has the status and owner the model expects;
* per queue, ``StatsSummary.succeeded_total`` equals the Archive rows and ``failed_total`` the DLQ rows;
* idempotency keys are unique among Hot rows;
* a job's attempt count never decreases, except when it is resurrected from the DLQ;
* claims under a rate limit (queue ``sm-b``) never take more than its tokens, never starve the unlimited
  queue and never count as an attempt; leases spend the tokens: a lease under the limit starts no more than
  its tokens (the rest go back to Pending without an attempt), the bucket's window counter equals the jobs
  started in the window, and the rows' own ``started_at`` never show more starts in the window than that.

Runs on the test database of the run (SQLite and PostgreSQL through ``scripts/test``); every example
starts from empty ChokaQ tables.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from chokaq_core import api, storage
from chokaq_core.domain import Failure, FailureReason, HotJob, JobStatus, Rate, RateLimit, Retry, Success
from chokaq_core.models import (
    JobsArchive,
    JobsDLQ,
    JobsHot,
    MetricBuckets,
    Queues,
    RateBuckets,
    RateLimits,
    StatsSummary,
)

QUEUES = ("sm-a", "sm-b")
WORKERS = ("sm-w1", "sm-w2")
KEYS = ("k1", "k2", "k3")
HOT, ARCHIVE, DLQ, PURGED = "hot", "archive", "dlq", "purged"
ZOMBIE_TIMEOUT = 300.0  # rows backdated by BACKDATE are past it, fresh ones are not
BACKDATE = 900.0
STALE_ID = "01STALE0000000000000000000"
# 3 an hour: no token comes back during a run; the ``refill`` rule stands for an idle spell (the burst, 2)
LIMITED = RateLimit("queue:sm-b", Rate(3, 3600.0, 2))


@dataclass
class Job:
    queue: str
    key: str | None
    place: str = HOT
    status: int = 0  # Hot only
    worker: str | None = None  # Hot only
    due: bool = True  # Pending only: claimable now
    attempts: int = 0


def wipe() -> None:
    for model in (JobsHot, JobsArchive, JobsDLQ, StatsSummary, MetricBuckets, Queues, RateBuckets, RateLimits):
        model.objects.all().delete()
    storage.KNOWN_BUCKETS.forget([LIMITED.name])  # what this process read of the buckets is gone with them


def ago(seconds: float) -> datetime:
    """An aware time ``seconds`` ago, never on a whole second (SQLite text comparison, see tests/storage/rows)."""
    value = timezone.now() - timedelta(seconds=seconds)
    return value if value.microsecond else value.replace(microsecond=1)


class JobLifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.jobs: dict[str, Job] = {}
        self.resurrected: set[str] = set()  # ids resurrected since the last invariant check
        self.last_attempts: dict[str, int] = {}
        self.tokens = 1  # whole tokens of LIMITED's bucket (a new bucket holds one)
        self.window_claims = 0  # jobs started under LIMITED since its window began

    # ------------------------------------------------------------ helpers

    def ids(self, place: str, status: int | None = None) -> list[str]:
        return sorted(i for i, j in self.jobs.items()
                      if j.place == place and (status is None or j.status == status))

    def pick(self, data: st.DataObject, candidates: list[str], *, stale: bool = True) -> str:
        pool = candidates + ([STALE_ID] if stale else [])
        return data.draw(st.sampled_from(pool)) if pool else STALE_ID

    def to_dlq(self, job_id: str) -> None:
        job = self.jobs[job_id]
        job.place, job.worker = DLQ, None

    # ------------------------------------------------------------ setup

    @initialize()
    def clean(self) -> None:
        wipe()
        storage.declare_rate_limits([LIMITED])

    def teardown(self) -> None:
        wipe()

    # ------------------------------------------------------------ rules

    @rule(queue=st.sampled_from(QUEUES), key=st.sampled_from((None, *KEYS)), delayed=st.booleans())
    def enqueue(self, queue: str, key: str | None, delayed: bool) -> None:
        job_id = api.enqueue("test.ok.v1", {"n": len(self.jobs)}, queue=queue, idempotency_key=key,
                             delay=3600 if delayed else None)
        holder = next((i for i, j in self.jobs.items() if key and j.place == HOT and j.key == key), None)
        if holder is not None:
            assert job_id == holder, "an active idempotency key must return the holder's id"
            return
        assert job_id not in self.jobs, "enqueue returned an id that already exists"
        self.jobs[job_id] = Job(queue, key, due=not delayed)

    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 4))
    def claim(self, worker: str, limit: int) -> None:
        claimed = storage.fetch_batch(worker, limit, list(QUEUES))
        due = {i for i in self.ids(HOT, 0) if self.jobs[i].due}
        got = [j.id for j in claimed]
        assert set(got) <= due, f"claimed rows that were not due Pending: {set(got) - due}"
        assert len(got) == min(limit, len(due)), "a claim left due Pending rows behind"
        for job_id in got:
            job = self.jobs[job_id]
            job.status, job.worker = 1, worker

    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 4))
    def claim_under_limit(self, worker: str, limit: int) -> None:
        due = {i for i in self.ids(HOT, 0) if self.jobs[i].due}
        claimed = storage.fetch_batch(worker, limit, list(QUEUES), [LIMITED])
        got = [j.id for j in claimed]
        assert set(got) <= due, f"claimed rows that were not due Pending: {set(got) - due}"
        limited = [i for i in got if self.jobs[i].queue == "sm-b"]
        assert len(limited) <= self.tokens, "a claim took more than the limit's tokens"
        if not self.tokens:
            free = sum(1 for i in due if self.jobs[i].queue != "sm-b")
            assert len(got) == min(limit, free), "an exhausted limit held back the unlimited queue"
        for job_id in got:  # the claim spends no token: the lease does
            job = self.jobs[job_id]
            job.status, job.worker = 1, worker

    @rule()
    def refill(self) -> None:
        """An idle spell: the bucket saved up its burst and a new window begins."""
        RateBuckets.objects.filter(limit_name=LIMITED.name).delete()
        RateBuckets.objects.create(limit_name=LIMITED.name, rate_key="", tokens=float(LIMITED.rate.burst),
                                   refilled_at=timezone.now(), window_started_at=ago(0), window_used=0)
        storage.KNOWN_BUCKETS.forget([LIMITED.name])  # written behind the engine, as another process would
        self.tokens, self.window_claims = LIMITED.rate.burst, 0

    @precondition(lambda self: self.ids(HOT, 1))
    @rule(data=st.data(), wrong=st.booleans())
    def start(self, data: st.DataObject, wrong: bool) -> None:
        job_id = self.pick(data, self.ids(HOT, 1))
        job = self.jobs.get(job_id)
        owner = job.worker if job else WORKERS[0]
        worker = next(w for w in WORKERS if w != owner) if wrong else owner
        row = storage.get_hot(job_id)
        if row is None:
            assert storage.mark_processing(_fake(job_id), worker or WORKERS[0], [LIMITED]) is None
            return
        attempts = storage.mark_processing(row, worker or WORKERS[0], [LIMITED])
        if wrong:
            assert attempts is None, "the lease gate let a foreign worker start the job"
            return
        assert job is not None
        if job.queue == "sm-b" and not self.tokens:
            assert attempts is None, "a lease started a job its limit had no token for"
            job.status, job.worker = 0, None  # held back: Pending again, no attempt
            return
        self._started(job)
        assert attempts == job.attempts

    @precondition(lambda self: self.ids(HOT, 1))
    @rule(worker=st.sampled_from(WORKERS), data=st.data())
    def start_batch(self, worker: str, data: st.DataObject) -> None:
        """A dispatcher's gathered batch: the lease spends the tokens in the batch's (claim) order."""
        ids = data.draw(st.lists(st.sampled_from(self.ids(HOT, 1)), min_size=1, max_size=4, unique=True))
        rows = [row for i in ids if (row := storage.get_hot(i)) is not None]
        owned = {row.id for row in rows if self.jobs[row.id].worker == worker}  # before held-back jobs are released
        leased = storage.mark_processing_batch(rows, worker, [LIMITED])
        for row in rows:
            job = self.jobs[row.id]
            if job.worker != worker:
                assert row.id not in leased, "the lease gate let a foreign worker start the job"
            elif job.queue == "sm-b" and not self.tokens:
                assert row.id not in leased and row.id in leased.held, "a lease started a job without a token"
                job.status, job.worker = 0, None
            else:
                self._started(job)
                assert leased.get(row.id) == job.attempts
        assert set(leased.held) <= owned, "the lease held back a job this worker does not own"

    def _started(self, job: Job) -> None:
        job.attempts += 1
        job.status = 2
        if job.queue == "sm-b":
            self.tokens -= 1
            self.window_claims += 1

    @rule(worker=st.sampled_from(WORKERS), data=st.data())
    def heartbeat(self, worker: str, data: st.DataObject) -> None:
        ids = data.draw(st.lists(st.sampled_from([*self.ids(HOT), STALE_ID]), max_size=4, unique=True))
        kept = storage.keep_alive(ids, worker)
        expected = {i for i in ids if i in self.jobs and self.jobs[i].status == 2 and self.jobs[i].worker == worker}
        assert set(kept) == expected

    @precondition(lambda self: self.ids(HOT, 2))
    @rule(data=st.data(), outcome=st.sampled_from(("succeed", "fail", "retry")), wrong=st.booleans(),
          retry_later=st.booleans())
    def complete(self, data: st.DataObject, outcome: str, wrong: bool, retry_later: bool) -> None:
        job_id = self.pick(data, self.ids(HOT, 2))
        job = self.jobs.get(job_id)
        owner = job.worker if job else WORKERS[0]
        worker = next(w for w in WORKERS if w != owner) if wrong else owner
        attempts = job.attempts if job else 1
        done = storage.complete(
            worker,
            [Success(job_id, 3.0)] if outcome == "succeed" else [],
            [Retry(job_id, attempts, 3600.0 if retry_later else 0.0)] if outcome == "retry" else [],
            [Failure(job_id, data.draw(st.sampled_from(list(FailureReason))), "boom")] if outcome == "fail" else [],
        )
        moved = [i for i, _ in (*done.archived, *done.rescheduled, *done.failed)]
        if job is None or wrong:
            assert moved == [], "a completion without ownership changed a row"
            return
        assert moved == [job_id]
        if outcome == "succeed":
            job.place, job.worker = ARCHIVE, None
        elif outcome == "fail":
            self.to_dlq(job_id)
        else:
            job.status, job.worker, job.due = 0, None, not retry_later

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        known = sorted(self.jobs)
        ids = data.draw(st.lists(st.sampled_from([*known, STALE_ID]), min_size=1, max_size=3, unique=True))
        moved, flagged = storage.cancel(ids, actor="sm-operator")
        want_moved = {i for i in ids if i in self.jobs and self.jobs[i].place == HOT and self.jobs[i].status in (0, 1)}
        want_flagged = {i for i in ids if i in self.jobs and self.jobs[i].place == HOT and self.jobs[i].status == 2}
        assert set(moved) == want_moved
        assert set(flagged) == want_flagged
        for job_id in moved:
            self.to_dlq(job_id)

    def _resurrected(self, job_id: str) -> None:
        job = self.jobs[job_id]
        job.place, job.status, job.worker, job.due, job.attempts = HOT, 0, None, True, 0
        job.key = None  # a resurrected row carries no idempotency key
        self.resurrected.add(job_id)

    @precondition(lambda self: self.ids(DLQ))
    @rule(data=st.data(), batch=st.booleans())
    def resurrect(self, data: st.DataObject, batch: bool) -> None:
        if batch:
            ids = data.draw(st.lists(st.sampled_from([*self.ids(DLQ), *self.ids(HOT), STALE_ID]),
                                     min_size=1, max_size=3, unique=True))
            n = storage.resurrect_batch(ids, actor="sm-operator")
            want = [i for i in ids if i in self.jobs and self.jobs[i].place == DLQ]
            assert n == len(want)
        else:
            job_id = self.pick(data, self.ids(DLQ) + self.ids(ARCHIVE))
            moved = storage.resurrect(job_id, actor="sm-operator")
            want = [job_id] if job_id in self.jobs and self.jobs[job_id].place == DLQ else []
            assert moved == bool(want)
        for job_id in want:
            self._resurrected(job_id)

    @precondition(lambda self: self.ids(DLQ))
    @rule(data=st.data())
    def purge(self, data: st.DataObject) -> None:
        ids = data.draw(st.lists(st.sampled_from([*self.ids(DLQ), *self.ids(HOT), STALE_ID]),
                                 min_size=1, max_size=3, unique=True))
        n = storage.purge_dlq_ids(ids)
        want = [i for i in ids if i in self.jobs and self.jobs[i].place == DLQ]
        assert n == len(want)
        for job_id in want:
            self.jobs[job_id].place = PURGED

    @precondition(lambda self: self.ids(HOT, 2))
    @rule(data=st.data(), sweep_all=st.booleans())
    def zombie_sweep(self, data: st.DataObject, sweep_all: bool) -> None:
        running = self.ids(HOT, 2)
        if sweep_all:  # timeout 0: every Processing row's heartbeat is already in the past
            stale = running
            JobsHot.objects.filter(id__in=running).update(heartbeat_at=ago(1), last_updated_at=ago(1))
            moved = storage.archive_zombies(0)
        else:
            stale = data.draw(st.lists(st.sampled_from(running), unique=True)) if running else []
            JobsHot.objects.filter(id__in=stale).update(heartbeat_at=ago(BACKDATE), last_updated_at=ago(BACKDATE))
            moved = storage.archive_zombies(ZOMBIE_TIMEOUT)
        assert sorted(i for i, _ in moved) == sorted(stale)
        for job_id in stale:
            self.to_dlq(job_id)

    @precondition(lambda self: self.ids(HOT, 1))
    @rule(data=st.data())
    def recover(self, data: st.DataObject) -> None:
        fetched = self.ids(HOT, 1)
        stale = data.draw(st.lists(st.sampled_from(fetched), unique=True)) if fetched else []
        JobsHot.objects.filter(id__in=stale).update(last_updated_at=ago(BACKDATE))
        assert storage.recover_abandoned(ZOMBIE_TIMEOUT) == len(stale)
        for job_id in stale:
            job = self.jobs[job_id]
            job.status, job.worker = 0, None

    # ------------------------------------------------------------ invariants (ORM reads only)

    @invariant()
    def each_job_in_exactly_one_pillar(self) -> None:
        hot = {r["id"]: r for r in JobsHot.objects.values("id", "status", "worker_id", "attempt_count",
                                                           "idempotency_key", "queue")}
        archive = dict(JobsArchive.objects.values_list("id", "attempt_count"))
        dlq = dict(JobsDLQ.objects.values_list("id", "attempt_count"))
        places = {HOT: hot, ARCHIVE: archive, DLQ: dlq}
        for job_id, job in self.jobs.items():
            found = [name for name, rows in places.items() if job_id in rows]
            if job.place == PURGED:
                assert found == [], f"purged job {job_id} is still in {found}"
            else:
                assert found == [job.place], f"job {job_id} expected in {job.place}, found in {found}"
        unknown = (set(hot) | set(archive) | set(dlq)) - set(self.jobs)
        assert not unknown, f"rows the model never created: {unknown}"
        statuses = {r["status"] for r in hot.values()}
        assert statuses <= {0, 1, 2}, f"Hot statuses outside 0-2: {statuses}"
        for job_id, row in hot.items():
            job = self.jobs[job_id]
            assert (row["status"], row["worker_id"]) == (job.status, job.worker), f"{job_id}: status/owner"
        # attempt counts: monotonic, except on resurrection
        attempts = {**{i: r["attempt_count"] for i, r in hot.items()}, **archive, **dlq}
        for job_id, n in attempts.items():
            before = self.last_attempts.get(job_id)
            if before is not None and job_id not in self.resurrected:
                assert n >= before, f"{job_id}: attempt count went from {before} to {n}"
            assert n == self.jobs[job_id].attempts, f"{job_id}: attempt count {n}, model {self.jobs[job_id].attempts}"
            self.last_attempts[job_id] = n
        self.resurrected.clear()
        keys = Counter(r["idempotency_key"] for r in hot.values() if r["idempotency_key"] is not None)
        assert all(n == 1 for n in keys.values()), f"idempotency key held twice in Hot: {keys}"

    @invariant()
    def the_rate_limits_bucket_counts_its_claims(self) -> None:
        bucket = RateBuckets.objects.filter(limit_name=LIMITED.name, rate_key="").first()
        if bucket is None:
            assert (self.tokens, self.window_claims) == (1, 0), "claims under the limit wrote no bucket"
            return
        assert bucket.tokens > -1e-9, f"the bucket was overdrawn: {bucket.tokens}"
        assert int(bucket.tokens + 1e-6) == self.tokens, f"tokens {bucket.tokens}, model {self.tokens}"
        assert bucket.window_used == self.window_claims, "the window's counter differs from the jobs started"
        assert bucket.window_used <= LIMITED.rate.count + LIMITED.rate.burst, "a window was exceeded"
        started = sum(model.objects.filter(queue="sm-b", started_at__gte=bucket.window_started_at).count()
                      for model in (JobsHot, JobsArchive))
        assert started <= bucket.window_used, "the rows' start times show more starts in the window than it counted"

    @invariant()
    def counters_equal_real_counts(self) -> None:
        archive = {r["queue"]: r["n"] for r in JobsArchive.objects.values("queue").annotate(n=Count("id"))}
        dlq = {r["queue"]: r["n"] for r in JobsDLQ.objects.values("queue").annotate(n=Count("id"))}
        stats = {s.queue: s for s in StatsSummary.objects.all()}
        for queue in set(archive) | set(dlq) | set(stats):
            s = stats.get(queue)
            assert s is not None, f"no StatsSummary row for {queue}"
            assert s.succeeded_total - s.purged_total == archive.get(queue, 0), f"{queue}: succeeded - purged vs Archive"
            assert s.failed_total == dlq.get(queue, 0), f"{queue}: failed_total vs DLQ"


def _fake(job_id: str) -> HotJob:
    """A HotJob-shaped stand-in for an id that is not in Hot."""
    now = timezone.now()

    return HotJob(job_id, QUEUES[0], "test.ok.v1", "{}", None, None, 10, JobStatus.FETCHED, 0, None, None, None,
                  now, None, now, None, None)


JobLifecycle.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, derandomize=False, print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def test_job_lifecycle_state_machine(transactional_db: None) -> None:
    run_state_machine_as_test(JobLifecycle, settings=JobLifecycle.TestCase.settings)


class _Draws:
    """A stand-in for hypothesis' ``data`` that hands out fixed draws, to replay one path through the machine."""

    def __init__(self, *values: object) -> None:
        self.values = list(values)

    def draw(self, strategy: object) -> object:
        return self.values.pop(0)


def test_a_batch_lease_that_holds_back_its_own_job_satisfies_the_model(transactional_db: None) -> None:
    """The path hypothesis found: with the limit's token spent, a worker's batch lease holds back its own job.
    The job goes back to Pending, so the model's owner check must be taken before the lease, not after."""
    machine = JobLifecycle()
    machine.clean()
    try:
        machine.enqueue(queue="sm-b", key=None, delayed=False)
        machine.enqueue(queue="sm-b", key=None, delayed=False)
        machine.claim(worker="sm-w1", limit=2)
        first, second = machine.ids(HOT, 1)
        machine.start_batch(worker="sm-w1", data=_Draws([first]))  # spends the bucket's one token
        assert machine.tokens == 0
        machine.start_batch(worker="sm-w1", data=_Draws([second]))  # held back: Pending again, not an attempt
        assert machine.jobs[second].status == 0 and machine.jobs[second].worker is None
        machine.counters_equal_real_counts()
        machine.each_job_in_exactly_one_pillar()
        machine.the_rate_limits_bucket_counts_its_claims()
    finally:
        machine.teardown()


def test_an_example_starts_from_buckets_this_process_never_saw(transactional_db: None) -> None:
    """The path CI found: one example ends with the limit's bucket saved up (this process read 2 tokens) and the
    next starts within seconds from empty tables. The claim's fast path trusts what the process last read, so
    every example must start as a fresh worker does, knowing no bucket, or its first claim takes 2 rows for the
    new bucket's one token."""
    earlier = JobLifecycle()
    earlier.clean()
    try:
        earlier.refill()
        earlier.enqueue(queue="sm-a", key=None, delayed=False)
        earlier.claim_under_limit(worker="sm-w1", limit=1)  # reads the saved-up bucket: 2 tokens known
    finally:
        earlier.teardown()
    machine = JobLifecycle()
    machine.clean()
    try:
        machine.enqueue(queue="sm-b", key=None, delayed=False)
        machine.enqueue(queue="sm-b", key=None, delayed=False)
        machine.claim_under_limit(worker="sm-w1", limit=2)  # a new bucket: one token, one row
        assert len(machine.ids(HOT, 1)) == 1
        machine.the_rate_limits_bucket_counts_its_claims()
    finally:
        machine.teardown()
