"""The engine reads and bulk commands the Deck needs, through ``chokaq_core.service``.

Run on every vendor of the suite: each is one dialect function in sqlite.py / postgresql.py.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from chokaq_core import service, storage
from chokaq_core.domain import FailureReason, JobFilter, JobStatus, NewJob, new_ulid
from chokaq_core.models import JobsArchive, JobsDLQ, StatsSummary
from chokaq_core.readmodel import HistorySort
from tests.deck.conftest import archived, dead, pending, processing

pytestmark = pytest.mark.django_db


def failed_total(queue: str) -> int:
    return StatsSummary.objects.get(queue=queue).failed_total


def test_active_lists_newest_hot_rows_without_payload_and_filters() -> None:
    first = pending("q1", tags="alpha")[0]
    second = pending("q2", type="test.fail.v1")[0]
    running = processing("q3")[0]
    rows = service.active_jobs()
    assert [r.id for r in rows[:3]] == [running, second, first]
    assert not hasattr(rows[0], "payload")
    assert rows[0].status == JobStatus.PROCESSING and rows[0].started_at is not None
    assert [r.id for r in service.active_jobs(JobFilter(status=JobStatus.PENDING))] == [second, first]
    assert [r.id for r in service.active_jobs(JobFilter(queue="q1"))] == [first]
    assert [r.id for r in service.active_jobs(JobFilter(search="ALPHA"))] == [first]
    assert [r.id for r in service.active_jobs(JobFilter(search="fail"))] == [second]
    assert service.active_jobs(JobFilter(search="%")) == []  # LIKE wildcards are escaped
    keyed = storage.enqueue([NewJob(new_ulid(), "q4", "test.ok.v1", "{}", idempotency_key="order-42_x")])[0]
    assert [r.id for r in service.active_jobs(JobFilter(search="ORDER-42_"))] == [keyed]
    assert len(service.active_jobs(limit=2)) == 2


def test_archive_keyset_pages_cover_every_row_once_forward_and_back() -> None:
    ids = archived("pages", 7)
    sort = HistorySort("date", descending=True)
    seen: list[str] = []
    page = service.history("archive", JobFilter(), sort, size=3)
    pages = [page]
    seen += [r.id for r in page.rows]
    while page.next_token:
        page = service.history("archive", JobFilter(), sort, after=page.next_token, size=3)
        pages.append(page)
        seen += [r.id for r in page.rows]
    assert sorted(seen) == sorted(ids) and len(seen) == 7
    assert [len(p.rows) for p in pages] == [3, 3, 1]
    assert pages[0].prev_token is None and pages[1].prev_token is not None
    back = service.history("archive", JobFilter(), sort, before=pages[2].prev_token, size=3)
    assert [r.id for r in back.rows] == [r.id for r in pages[1].rows]
    assert back.retained == 7


@pytest.mark.parametrize("key", ["id", "queue", "type", "created", "worker", "attempts", "duration", "date"])
@pytest.mark.parametrize("descending", [True, False])
def test_every_archive_sort_pages_without_gaps_or_repeats(key: str, descending: bool) -> None:
    ids = archived("a", 3, duration_ms=5.0) + archived("b", 2, duration_ms=50.0)
    sort = HistorySort(key, descending)
    seen: list[str] = []
    token = None
    while True:
        page = service.history("archive", JobFilter(), sort, after=token, size=2)
        seen += [r.id for r in page.rows]
        if not page.next_token:
            break
        token = page.next_token
    assert sorted(seen) == sorted(ids) and len(seen) == len(ids)
    values = [r.sort_value(key) for r in service.history("archive", JobFilter(), sort, size=10).rows]
    assert values == sorted(values, reverse=descending)


def test_unknown_sort_key_and_bad_page_key_are_refused() -> None:
    with pytest.raises(service.ServiceError, match="unknown sort key"):
        service.history("archive", JobFilter(), HistorySort("payload"))
    with pytest.raises(service.ServiceError, match="invalid page key"):
        service.history("archive", JobFilter(), HistorySort(), after="not-a-key")
    with pytest.raises(service.ServiceError, match="page size"):
        service.history("dlq", JobFilter(), HistorySort(), size=5000)


def test_queue_health_counts_only_due_pending_rows() -> None:
    pending("lagging", 2)
    pending("lagging", 1, delay=3600)
    pending("idle", 1, delay=3600)
    health = {q.name: q.lag for q in service.queue_overview()}
    assert health["lagging"] is not None and health["lagging"].pending == 2
    assert health["lagging"].max_lag_seconds >= health["lagging"].avg_lag_seconds >= 0
    assert health["idle"] is not None and health["idle"].pending == 0 and health["idle"].max_lag_seconds == 0


def test_dlq_bulk_preview_purge_and_requeue_by_filter() -> None:
    ids = dead("bulk", 5, reason=FailureReason.TIMEOUT)
    keep = dead("bulk", 1, reason=FailureReason.FATAL_ERROR)[0]
    f = JobFilter(queue="bulk", failure_reason=FailureReason.TIMEOUT)
    preview = service.preview_dlq_matching(f, 3)
    assert (preview.matched, preview.will_affect, preview.truncated) == (5, 3, True)
    assert len(preview.sample_ids) == 3 and set(preview.sample_ids) <= set(ids)
    assert failed_total("bulk") == 6
    assert len(service.resurrect_matching(f, 2, actor="ops")) == 2
    assert failed_total("bulk") == 4
    assert len(service.purge_dlq_matching(f, 0)) == 3  # max_jobs <= 0 means 100
    assert failed_total("bulk") == 1
    assert list(JobsDLQ.objects.values_list("id", flat=True)) == [keep]
    uncapped = service.preview_dlq_matching(JobFilter(queue="bulk"), 1001)  # the 1,000 cap is gone
    assert (uncapped.matched, uncapped.will_affect, uncapped.truncated) == (1, 1, False)


def test_purge_one_archived_job_and_preview_counts_by_age() -> None:
    old, new = archived("age", 2)
    JobsArchive.objects.filter(id=old).update(finished_at=timezone.now() - timedelta(days=40))
    gone = dead("age2")[0]
    JobsDLQ.objects.filter(id=gone).update(created_at=timezone.now() - timedelta(days=10))
    assert service.preview_purge_older_than("archive", 30)[1] == 1
    assert service.preview_purge_older_than("dlq", 7)[1] == 1
    assert service.preview_purge_older_than("dlq", 30)[1] == 0
    service.purge_archive(new)
    stats = StatsSummary.objects.get(queue="age")
    assert (stats.succeeded_total, stats.purged_total) == (2, 1)
    with pytest.raises(service.ConflictError):
        service.purge_archive(new)
    assert service.purge_older_than("archive", 30) == 1
    assert not JobsArchive.objects.exists()


@pytest.mark.parametrize("pillar", ["archive", "dlq"])
def test_sorts_no_index_serves_rank_only_the_newest_window(pillar: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "SORT_WINDOW", 3)
    ids = [(archived if pillar == "archive" else dead)("win")[0] for _ in range(5)]  # oldest first
    page = service.history(pillar, JobFilter(), HistorySort("type" if pillar == "archive" else "reason"), size=10)
    assert page.window == 3 and {r.id for r in page.rows} == set(ids[-3:])
    by_date = service.history(pillar, JobFilter(), HistorySort("date"), size=10)
    assert by_date.window is None and {r.id for r in by_date.rows} == set(ids)
    by_id = service.history(pillar, JobFilter(), HistorySort("id", descending=False), size=2)
    assert [r.id for r in by_id.rows] == sorted(ids)[:2] and by_id.window is None


def test_a_search_equal_to_a_job_id_is_a_primary_key_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = archived("pk", 3)
    seen: list[JobFilter] = []
    real = storage.list_archive
    monkeypatch.setattr(storage, "list_archive", lambda f, *a: seen.append(f) or real(f, *a))
    page = service.history("archive", JobFilter(search=f" {ids[1]} "), HistorySort())
    assert [r.id for r in page.rows] == [ids[1]] and seen[-1].job_id == ids[1]
    partial = service.history("archive", JobFilter(search=ids[1][:-3]), HistorySort())
    assert seen[-1].job_id is None and ids[1] in {r.id for r in partial.rows}
    dead_id = dead("pk2")[0]
    assert service.history("archive", JobFilter(search=dead_id), HistorySort()).rows == []
    assert [r.id for r in service.history("dlq", JobFilter(search=dead_id), HistorySort()).rows] == [dead_id]
