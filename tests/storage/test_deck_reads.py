"""The Deck's reads and bulk commands (spec 01 §5, spec 04): active list, keyset history pages and sorts, filters,
locate, throughput, queue health, top errors, filtered DLQ bulk commands, purges by id and age."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from chokaq_core import service, storage
from chokaq_core.domain import FailureReason, JobFilter, JobStatus, NewJob, new_ulid
from chokaq_core.models import JobsDLQ, Queues, StatsSummary
from chokaq_core.readmodel import HistorySort

from .rows import (
    age,
    archive_ids,
    archived,
    counters,
    dead,
    dlq_ids,
    hot_ids,
    of_kind,
    pending,
    processing,
    purged,
)


def test_empty_storage_reads() -> None:
    Queues.objects.all().delete()  # the SQL schema's seed rows (the default queue), if this test runs first
    StatsSummary.objects.all().delete()
    summary = storage.summary_stats()
    assert (summary.total, summary.last_activity_at) == (0, None)
    assert storage.queue_stats() == storage.queue_states() == storage.queue_health() == []
    assert storage.top_errors(10) == [] and storage.list_workers() == [] and storage.schedule_ticks() == {}


def test_active_lists_newest_hot_rows_and_filters() -> None:
    first = pending("q1", tags="alpha")[0]
    age(1)
    second = pending("q2", type="test.fail.v1")[0]
    age(1)
    running = processing("q3", "w1")[0].id
    age(1)
    keyed = storage.enqueue([NewJob(new_ulid(), "q4", "test.ok.v1", "{}", idempotency_key="order-42_x")])[0]
    newest = storage.get_hot(keyed).created_at  # type: ignore[union-attr]

    rows = service.active_jobs()
    assert [r.id for r in rows] == [keyed, running, second, first]
    assert rows[1].status == JobStatus.PROCESSING and rows[1].started_at is not None
    assert [r.id for r in service.active_jobs(JobFilter(status=JobStatus.PENDING))] == [keyed, second, first]
    assert [r.id for r in service.active_jobs(JobFilter(queue="q1"))] == [first]
    assert [r.id for r in service.active_jobs(JobFilter(search="ALPHA"))] == [first]
    assert [r.id for r in service.active_jobs(JobFilter(search="fail"))] == [second]
    assert service.active_jobs(JobFilter(search="%")) == [], "LIKE wildcards are escaped"
    assert [r.id for r in service.active_jobs(JobFilter(search="ORDER-42_"))] == [keyed]
    assert [r.id for r in service.active_jobs(JobFilter(from_at=newest - timedelta(seconds=1.5)))] == [keyed, running]
    assert len(service.active_jobs(limit=2)) == 2


def test_archive_keyset_pages_cover_every_row_once_forward_and_back() -> None:
    ids = []
    for _ in range(7):
        ids += archived("pages", 1)
        age(1)
    sort = HistorySort("date", descending=True)
    page = service.history("archive", JobFilter(), sort, size=3)
    pages = [page]
    while page.next_token:
        page = service.history("archive", JobFilter(), sort, after=page.next_token, size=3)
        pages.append(page)
    assert [[r.id for r in p.rows] for p in pages] == [ids[6:3:-1], ids[3:0:-1], ids[:1]]
    back = service.history("archive", JobFilter(), sort, before=pages[2].prev_token, size=3)
    assert [r.id for r in back.rows] == [r.id for r in pages[1].rows]
    assert back.retained == 7


# Each pillar's own sort keys: a key the pillar lacks (Archive "reason", DLQ "duration") orders by the date in
# every dialect while JobRow.sort_value() gives a constant, so its page keys never advance (a service matter).
SORTS = [("archive", k) for k in ("id", "queue", "type", "created", "worker", "attempts", "duration", "date")] + [
    ("dlq", k) for k in ("id", "queue", "type", "created", "worker", "attempts", "reason", "date")]


@pytest.mark.parametrize(("pillar", "key"), SORTS)
@pytest.mark.parametrize("descending", [True, False])
def test_every_sort_pages_without_gaps_or_repeats(pillar: str, key: str, descending: bool) -> None:
    make = archived if pillar == "archive" else dead
    ids = make("a", 3, worker="w-b") + make("b", 2, worker="w-a", type="test.fail.v1")
    age(1)
    ids += make("a", 2, worker="w-c")
    sort = HistorySort(key, descending)
    seen: list[str] = []
    token = None
    while True:
        page = service.history(pillar, JobFilter(), sort, after=token, size=2)
        seen += [r.id for r in page.rows]
        if not page.next_token:
            break
        token = page.next_token
    assert sorted(seen) == sorted(ids) and len(seen) == len(ids)
    rows = service.history(pillar, JobFilter(), sort, size=10).rows
    values = [(r.sort_value(key), r.id) for r in rows]
    assert values == sorted(values, reverse=descending)


def test_dlq_filters_by_reason_type_queue_search_and_dates(vendor: str) -> None:
    fatal = dead("dq", reason=FailureReason.FATAL_ERROR, details="ValueError: width must be positive")[0]
    timeout = dead("dq", reason=FailureReason.TIMEOUT, details="Timed out after 5s", type="test.sleep.v1")[0]
    other = dead("other", reason=FailureReason.FATAL_ERROR, details="KeyError: 'x'", tags="Ünïcode")[0]
    created = sorted(JobsDLQ.objects.values_list("created_at", flat=True))
    sort = HistorySort()

    def ids(**f: object) -> set[str]:
        return {r.id for r in service.history("dlq", JobFilter(**f), sort).rows}  # type: ignore[arg-type]

    assert ids() == {fatal, timeout, other}
    assert ids(failure_reason=FailureReason.TIMEOUT) == {timeout}
    assert ids(type="test.sleep.v1") == {timeout}
    assert ids(queue="other") == {other}
    assert ids(search="WIDTH must") == {fatal}
    assert ids(search="ünïcode") == (set() if vendor == "sqlite" else {other}), "SQLite's LIKE folds ASCII only"
    assert ids(search="Ünï") == {other}
    assert ids(from_at=created[0], to_at=created[-1]) == {fatal, timeout, other}, "both bounds inclusive"
    assert ids(to_at=created[0] - timedelta(microseconds=1)) == set()
    row = next(r for r in service.history("dlq", JobFilter(), sort).rows if r.id == fatal)
    assert (row.failure_reason, row.status, row.error_head) == (
        FailureReason.FATAL_ERROR, JobStatus.FAILED, "ValueError: width must be positive")


def test_locate_reports_where_each_job_is() -> None:
    p = pending("loc")[0]
    a = archived("loc2")[0]
    c = dead("loc3", reason=FailureReason.CANCELLED)[0]
    f = dead("loc4")[0]
    z = dead("loc5", reason=FailureReason.ZOMBIE)[0]
    assert storage.locate_jobs([p, a, c, f, z, "missing", p]) == {
        p: JobStatus.PENDING, a: JobStatus.SUCCEEDED, c: JobStatus.CANCELLED, f: JobStatus.FAILED, z: JobStatus.ZOMBIE}


def test_throughput_rates_from_metric_buckets() -> None:
    archived("tp", 3)
    dead("tp2", 2)
    tp = service.throughput()
    assert len(tp.points) == service.THROUGHPUT_WINDOW
    assert sum(p.succeeded for p in tp.points) == 3 and sum(p.failed for p in tp.points) == 2
    assert tp.per_second_1m == pytest.approx(5 / 60)
    assert tp.fail_rate_1m == pytest.approx(40.0)
    assert tp.fail_rate_5m == pytest.approx(40.0)


def test_queue_health_counts_due_pending_rows_and_their_lag() -> None:
    pending("lagging", 1)
    age(10)
    pending("lagging", 1)
    pending("lagging", 1, delay=3600)
    pending("idle", 1, delay=3600)
    age(20)
    health = {q.queue: q for q in storage.queue_health()}
    assert (health["lagging"].pending, health["lagging"].avg_lag_seconds, health["lagging"].max_lag_seconds) == (
        2, pytest.approx(25.0, abs=2), pytest.approx(30.0, abs=2))
    assert (health["idle"].pending, health["idle"].max_lag_seconds) == (0, 0.0)


def test_top_errors_group_rows_without_a_class_by_reason_and_prefix() -> None:
    dead("te", 3, details="ValueError: width must be positive\r\n  at line 3")
    dead("te", 1, reason=FailureReason.TIMEOUT, details="  Timed out  ")
    dead("te", 1, details="x" * 500)
    groups = storage.top_errors(10)
    assert (groups[0].count, groups[0].reason) == (3, FailureReason.FATAL_ERROR)
    assert groups[0].prefix == "ValueError: width must be positive\r\n  at line 3", "the text as stored: searchable"
    assert any(g.prefix == "Timed out" and g.reason == FailureReason.TIMEOUT for g in groups)
    assert any(len(g.prefix) == 160 for g in groups)
    assert len(storage.top_errors(1)) == 1


def test_dlq_bulk_preview_purge_and_resurrect_by_filter() -> None:
    ids = []
    for _ in range(5):
        ids += dead("bulk", reason=FailureReason.TIMEOUT)
        age(1)
    keep = dead("bulk", 1, reason=FailureReason.FATAL_ERROR)[0]
    f = JobFilter(queue="bulk", failure_reason=FailureReason.TIMEOUT)

    preview = service.preview_dlq_matching(f, 3)
    assert (preview.matched, preview.will_affect, preview.truncated) == (5, 3, True)
    assert preview.sample_ids == ids[:-4:-1], "newest failure first"
    assert len(service.resurrect_matching(f, 2, actor="ops")) == 2
    assert hot_ids("bulk") == set(ids[3:])
    assert counters("bulk") == (0, 4, 0)
    assert len(service.purge_dlq_matching(f, 0)) == 3  # max_jobs <= 0 means 100
    assert counters("bulk") == (0, 1, 0)
    assert dlq_ids() == {keep}


def test_purge_preview_counts_at_most_the_cap_and_says_so() -> None:
    archived("cap", 3)
    dead("cap", 3)
    age(40 * 86400)
    for pillar in ("archive", "dlq"):
        assert service.preview_purge_older_than(pillar, 30, cap=2)[1:] == (2, True), pillar
        assert service.preview_purge_older_than(pillar, 30, cap=3)[1:] == (3, False), pillar
    assert storage.count_archive_older_than(datetime.now(UTC), 2) == 2, "the count stops at its limit"
    assert service.purge_older_than("archive", 30) == 3, "the purge itself is not capped"


def test_a_text_search_reads_only_the_newest_rows_of_a_large_pillar(monkeypatch: pytest.MonkeyPatch) -> None:
    old = dead("sw", details="needle in the old row")[0]
    age(10)
    dead("sw", 3, details="hay")
    monkeypatch.setattr(service, "SEARCH_WINDOW", 3)
    far = service.history("dlq", JobFilter(search="needle"), HistorySort())
    assert (far.rows, far.searched) == ([], 3), "a match older than the newest 3 rows is not read"
    assert [r.id for r in service.history("dlq", JobFilter(search=old), HistorySort()).rows] == [old], \
        "an exact id search stays exact"
    monkeypatch.setattr(service, "SEARCH_WINDOW", 4)
    near = service.history("dlq", JobFilter(search="needle"), HistorySort(key="queue"))
    assert ([r.id for r in near.rows], near.searched) == ([old], None), "the whole pillar fits: an exact search"
    monkeypatch.setattr(service, "SEARCH_WINDOW", 1)
    archived("sw", type="needle.old")
    age(10)
    newest = archived("sw", type="needle.new")
    hit = service.history("archive", JobFilter(search="needle"), HistorySort())
    assert ([r.id for r in hit.rows], hit.searched) == (newest, 1), "the newest row is searched, the older not"


def test_purge_one_archived_job_and_preview_counts_by_age() -> None:
    old = archived("age", 1)[0]
    gone = dead("age2")[0]
    age(40 * 86400)
    new = archived("age", 1)[0]
    assert service.preview_purge_older_than("archive", 30)[1] == 1
    assert service.preview_purge_older_than("dlq", 30)[1] == 1
    assert service.preview_purge_older_than("dlq", 50)[1] == 0
    service.purge_archive(new)
    assert counters("age") == (2, 0, 0) and purged("age") == 1, "a purge never lowers succeeded: purged counts it"
    with pytest.raises(service.ConflictError):
        service.purge_archive(new)
    assert purged("age") == 1
    assert service.purge_older_than("archive", 30) == 1
    assert archive_ids() == set() and storage.get_archived(old) is None
    assert counters("age") == (2, 0, 0) and purged("age") == 2
    summary = storage.summary_stats()
    assert (summary.succeeded_total, summary.purged_total, summary.archived) == (2, 2, 0)
    by_queue = {q.queue: q for q in storage.queue_stats()}["age"]
    assert (by_queue.succeeded_total, by_queue.purged_total, by_queue.archived) == (2, 2, 0)
    assert storage.get_dead(gone) is not None


def test_purge_archive_ids(published: list) -> None:
    ids = archived("pai", 3)
    published.clear()
    assert storage.purge_archive_ids([ids[0], ids[0], "no-such-job"]) == 1
    assert archive_ids() == set(ids[1:])
    assert counters("pai") == (3, 0, 0) and purged("pai") == 1
    [event] = of_kind(published, "JobsPurged")
    assert (event["source"], event["jobIds"]) == ("Archive", [ids[0]])


def test_a_sort_no_index_serves_ranks_only_the_newest_window_and_job_id_filters_exactly() -> None:
    ids = []
    for n in range(5):
        ids += archived("win", 1, duration_ms=float(10 - n))  # newer rows are faster
        age(1)
    fastest_first = HistorySort("duration", descending=False, window=3)
    assert [r.id for r in storage.list_archive(JobFilter(), None, 10, fastest_first)] == ids[:1:-1], (
        "only the 3 newest are ranked")
    by_date = HistorySort("date", window=3)
    assert len(storage.list_archive(JobFilter(), None, 10, by_date)) == 5, "an indexed sort ignores the window"
    assert [r.id for r in storage.list_archive(JobFilter(job_id=ids[1]), None, 10, HistorySort())] == [ids[1]]
    assert [r.id for r in service.history("archive", JobFilter(search=f" {ids[2]} "), HistorySort()).rows] == [ids[2]]
