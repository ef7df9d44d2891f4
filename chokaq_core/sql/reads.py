"""The Deck's reads (``READ_FUNCTIONS``), written once over a dialect's hooks and statements: the lists, the
counters, the live snapshot, the history — what only ``service`` asks ``storage`` for, through ``storage.reads``.

Apart from ``base`` because a worker never runs them: it imports ``base`` and its vendor's module, not this one,
nor the read model (``chokaq_core.readmodel``) these functions build. What differs by vendor stays in the vendor's
dialect as hooks (``pack``, ``WHEN``, ``LIMIT``, ``TS``, ``param_ts``, the ``*_SELECT``/``*_SQL`` texts) and is read
from it here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from chokaq_core.domain import DURATION_BINS, FailureReason, JobFilter, JobStatus
from chokaq_core.readmodel import (
    INDEXED_SORTS,
    BulkPreview,
    DeckSnapshot,
    ErrorGroup,
    HistoryPoint,
    HistorySort,
    HistoryWindow,
    JobRow,
    MetricPoint,
    QueueLag,
    QueueStats,
    SnapshotRequest,
    SummaryStats,
    TypeHistory,
)
from chokaq_core.sql.base import BaseDialect
from chokaq_core.sql.parts import (
    _DATE_SORTS,
    ACTIVE_WIDTH,
    ARCHIVE,
    ARCHIVE_ROW,
    ARCHIVE_SORT,
    DLQ,
    DLQ_SORT,
    DLQ_WINDOWED_ROW,
    ERROR_GROUP_WIDTH,
    HISTORY_POINTS_SQL,
    HISTORY_TYPES_SQL,
    SUMMARY_WIDTH,
    WORKER_FIELDS,
    Cursor,
    as_utc,
    json_rows,
    located,
    queue_state,
    worker_info,
)

# What ``storage`` reads through ``Reads`` (the other dialect functions: ``DIALECT_FUNCTIONS``).
READ_FUNCTIONS: tuple[str, ...] = (
    "summary_stats", "queue_stats", "list_active", "list_archive", "list_dlq", "throughput", "queue_health",
    "top_errors", "preview_dlq_bulk", "deck_snapshot", "history_buckets",
)


# ---------------------------------------------------------------- row mappers

def summary(r: Sequence[Any]) -> SummaryStats:
    """A row of ``summary_stats_sql``: the counters, the purged count, then the Pending split (ready, scheduled,
    retrying, held; ready never below 0, where dirty reads saw the two counts at different moments)."""
    return SummaryStats(int(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]), as_utc(r[6]), int(r[7]),
                        max(int(r[8] or 0), 0), *(int(v or 0) for v in r[9:SUMMARY_WIDTH]))


def queue_stats_row(r: Sequence[Any]) -> QueueStats:
    return QueueStats(int(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]), int(r[6]), as_utc(r[7]), int(r[8]),
                      queue=r[0])


def active_row(r: Sequence[Any]) -> JobRow:
    return JobRow(id=r[0], queue=r[1], type=r[2], status=JobStatus(r[3]), attempt_count=r[4], created_at=as_utc(r[5]),
                  priority=r[6], created_by=r[7], tags=r[8], worker_id=r[9], scheduled_at=as_utc(r[10]),
                  started_at=as_utc(r[11]), error_class=r[12], error_message=r[13], error_at=as_utc(r[14]),
                  held_by=r[15])


def archive_row(r: Sequence[Any]) -> JobRow:
    return JobRow(id=r[0], queue=r[1], type=r[2], status=JobStatus.SUCCEEDED, attempt_count=r[3],
                  created_at=as_utc(r[4]), created_by=r[5], tags=r[6], worker_id=r[7], started_at=as_utc(r[8]),
                  finished_at=as_utc(r[9]), duration_ms=r[10])


def dlq_row(r: Sequence[Any]) -> JobRow:
    reason = FailureReason(r[9])
    return JobRow(id=r[0], queue=r[1], type=r[2], status=reason.shown_status, attempt_count=r[3],
                  created_at=as_utc(r[4]), created_by=r[5], tags=r[6], worker_id=r[7], finished_at=as_utc(r[8]),
                  failure_reason=reason, error_head=r[10], error_class=r[11], error_message=r[12])


def metric(r: Sequence[Any]) -> MetricPoint:
    return MetricPoint(as_utc(r[0]), int(r[1]), int(r[2]))


def lag(r: Sequence[Any]) -> QueueLag:
    return QueueLag(r[0], int(r[1]), float(r[2]), float(r[3]))


def error_group(r: Sequence[Any]) -> ErrorGroup:
    """(reason, prefix, count, latest, class, message): a ``TOP_ERRORS_SQL`` row."""
    return ErrorGroup(FailureReason(r[0]), r[1] or "", int(r[2]), as_utc(r[3]), r[4], r[5])


def history_point(r: Sequence[Any]) -> HistoryPoint:
    return HistoryPoint(as_utc(r[0]), int(r[1] or 0), int(r[2] or 0), tuple(int(b or 0) for b in r[4:]),
                        None if r[3] is None else float(r[3]))


def type_history(r: Sequence[Any]) -> TypeHistory:
    bins = tuple(int(b or 0) for b in r[4:4 + DURATION_BINS])
    duration_count, total = r[4 + DURATION_BINS:]
    return TypeHistory(str(r[0]), int(r[1] or 0), int(r[2] or 0), int(duration_count or 0), float(total or 0),
                       None if r[3] is None else float(r[3]), bins)


class Reads:
    """The read functions of one dialect (``sql.reads_for``): each written once here over ``sql``'s hooks."""

    def __init__(self, sql: BaseDialect) -> None:
        self.sql = sql
        self._snapshots: dict[str, str] = {}  # the deck_snapshot statement by its locate part

    def search_bound(self, table: str, date: str, filters: JobFilter, sort: HistorySort,
                     where: str, params: list[Any]) -> tuple[str, list[Any]]:
        """``where`` narrowed, for a text search with ``sort.search_window``, to rows no older than the newest
        ``search_window`` rows of ``table`` (one index-only read of ``date``), so a search never reads all history."""
        if not filters.search or sort.search_window is None or filters.job_id is not None:
            return where, params
        bound = (f"{date} >= (SELECT min(d) FROM (SELECT {date} AS d FROM {table}"
                 f" ORDER BY {date} DESC{self.sql.LIMIT}) AS newest)")
        return (f"{where} AND {bound}" if where else f" WHERE {bound}"), [*params, int(sort.search_window)]

    def keyset(self, sql: str, where: str, params: list[Any], order: str, after_key: tuple[Any, str] | None,
               limit: int, sort: HistorySort) -> tuple[str, list[Any]]:
        """``sql`` + filters + keyset predicate on (order, id) + ORDER BY/LIMIT, both in the sort's direction.
        Spelled ``c <= v AND (c < v OR id < i)`` so a single-column index on ``c`` bounds the scan."""
        op, direction = ("<", "DESC") if sort.descending else (">", "ASC")
        params = list(params)
        if after_key is not None:
            value, last_id = after_key
            marker = "%s"
            if order in _DATE_SORTS and isinstance(value, datetime):
                value, marker = self.sql.param_ts(value), self.sql.TS
            keyset = f"{order} {op}= {marker} AND ({order} {op} {marker} OR id {op} %s)"
            where = f"{where} AND {keyset}" if where else f" WHERE {keyset}"
            params += [value, value, last_id]
        return f"{sql}{where} ORDER BY {order} {direction}, id {direction}{self.sql.LIMIT}", [*params, int(limit)]

    def history_page(self, cursor: Cursor, pillar: str, filters: JobFilter, after_key: tuple[Any, str] | None,
                     limit: int, sort: HistorySort) -> list[Any]:
        """One keyset page of the Archive's or the DLQ's rows (``pillar``) its view's filters keep, read from the
        table itself or, for a sort no index serves, from the newest ``sort.window`` matching rows (a bounded sort
        instead of one over all of history)."""
        table, date, inner, outer, sorts = ((ARCHIVE, "finished_at", ARCHIVE_ROW, ARCHIVE_ROW, ARCHIVE_SORT)
                                            if pillar == "archive" else
                                            (DLQ, "failed_at", self.sql.DLQ_ROW, DLQ_WINDOWED_ROW, DLQ_SORT))
        filtered = self.sql.where(filters, date, ("id", "type", "tags")) if table == ARCHIVE else self.sql.dlq_where(filters)
        where, params = self.search_bound(table, date, filters, sort, *filtered)
        select = f"SELECT {inner} FROM {table}"
        if sort.window is not None and sort.key not in INDEXED_SORTS[pillar]:
            select = f"SELECT {outer} FROM ({select}{where} ORDER BY {date} DESC, id DESC{self.sql.LIMIT}) AS w"
            where, params = "", [*params, int(sort.window)]
        return self.sql._all(cursor, *self.keyset(select, where, params, sorts.get(sort.key, date), after_key, limit, sort))

    def summary_stats(self, cursor: Cursor) -> SummaryStats:
        return summary(self.sql._one(cursor, self.sql.SUMMARY_STATS_SQL))

    def queue_stats(self, cursor: Cursor) -> list[QueueStats]:
        return [queue_stats_row(r) for r in self.sql._all(cursor, self.sql.QUEUE_STATS_SQL)]

    def list_active(self, cursor: Cursor, filters: JobFilter, limit: int) -> list[JobRow]:
        """Newest ``limit`` Hot rows (created_at desc, id desc) matching status/queue/type and the search
        (id, type, tags, idempotency key); no payload."""
        where, params = self.sql.active_where(filters)
        return [active_row(r) for r in self.sql._all(cursor, self.sql.active_sql(where), [*params, int(limit)])]

    def list_archive(self, cursor: Cursor, filters: JobFilter, after_key: tuple[Any, str] | None, limit: int,
                     sort: HistorySort) -> list[JobRow]:
        """One keyset page of Archive rows: ordered by the sort column then id (same direction), strictly
        after ``after_key`` = (sort value as ``JobRow.sort_value`` gives it, id). Never OFFSET, never COUNT."""
        return [archive_row(r) for r in self.history_page(cursor, "archive", filters, after_key, limit, sort)]

    def list_dlq(self, cursor: Cursor, filters: JobFilter, after_key: tuple[Any, str] | None, limit: int,
                 sort: HistorySort) -> list[JobRow]:
        """One keyset page of DLQ rows, as ``list_archive``."""
        return [dlq_row(r) for r in self.history_page(cursor, "dlq", filters, after_key, limit, sort)]

    def throughput(self, cursor: Cursor, since: datetime) -> list[MetricPoint]:
        """Per-second succeeded (outcome 0) and failed (outcome 1) counts from MetricBuckets, oldest first."""
        return [metric(r) for r in self.sql._all(cursor, self.sql.THROUGHPUT_SQL, [self.sql.param_ts(since)])]

    def queue_health(self, cursor: Cursor) -> list[QueueLag]:
        """Per ``Queues`` row: due Pending count, average and max lag in seconds (0 when none)."""
        return [lag(r) for r in self.sql._all(cursor, self.sql.QUEUE_HEALTH_SQL, self.sql.queue_health_params())]

    def top_errors(self, cursor: Cursor, limit: int) -> list[ErrorGroup]:
        """Top (reason, error prefix) groups over the 5000 newest DLQ rows (spec 01 §5)."""
        return [error_group(r) for r in self.sql._all(cursor, self.sql.TOP_ERRORS_SQL, self.sql.top_errors_params(int(limit)))]

    def preview_dlq_bulk(self, cursor: Cursor, filters: JobFilter, max_jobs: int) -> BulkPreview:
        """Dry run of a filtered DLQ bulk operation: matched count, up to 10 sample ids (newest failure first)."""
        where, params = self.sql.dlq_where(filters)
        matched = int(self.sql._one(cursor, f"SELECT count(*) FROM {DLQ}{where}", params)[0] or 0)
        sample = self.sql._pick_dlq(cursor, filters, min(max_jobs, 10), lock=False) if matched and max_jobs > 0 else []
        return BulkPreview(matched, min(matched, max(max_jobs, 0)), matched > max_jobs, sample)

    def snapshot(self, request: SnapshotRequest) -> tuple[str, list[Any]]:
        """The ``deck_snapshot`` statement and its parameters: one SELECT of every part (under READ COMMITTED
        SNAPSHOT or PostgreSQL's statement snapshot, one consistent read), each packed by ``pack`` from its own
        read's statement, a part not asked for skipped by its CASE (checked before its subquery runs)."""
        ids = list(dict.fromkeys(request.locate_ids))
        locate, located_params = self.sql.locate_sql(ids)
        sql = self._snapshots.get(locate)
        if sql is None:
            sql = self._snapshots[locate] = (
                f"SELECT {self.sql.pack(self.sql.SUMMARY_STATS_SQL, SUMMARY_WIDTH, 'c0')},"
                f" {self.sql.pack(self.sql.active_sql(), ACTIVE_WIDTH, 'c5 DESC, c0 DESC')},"
                f" {self.sql.pack(locate, 2, 'c0')},\n"
                + ",\n".join(f"CASE WHEN {self.sql.WHEN} THEN {self.sql.pack(*part)} END" for part in (
                    (self.sql.THROUGHPUT_SELECT, 3, "c0"), (self.sql.QUEUE_STATES_SELECT, 5, "c0"),
                    (self.sql.QUEUE_STATS_SELECT, 9, "c0"), (self.sql.QUEUE_HEALTH_SELECT, 4, "c0"),
                    (self.sql.LIST_WORKERS_SELECT, len(WORKER_FIELDS), "c10 DESC, c0"),
                    (self.sql.TOP_ERRORS_SQL, ERROR_GROUP_WIDTH, "c2 DESC, c3 DESC"))))
        since = request.throughput_since
        return sql, [int(request.active_limit), *located_params,
                     since is not None, self.sql.param_ts(since or datetime.fromtimestamp(0, UTC)),
                     request.queues, request.queues, request.queues, *self.sql.queue_health_params(), request.workers,
                     request.errors_limit > 0, *self.sql.top_errors_params(max(1, int(request.errors_limit)))]

    def deck_snapshot(self, cursor: Cursor, request: SnapshotRequest) -> DeckSnapshot:
        """Everything the live Deck shows, in ONE statement: ``summary_stats``, ``list_active`` (no filters,
        ``request.active_limit`` rows), ``locate_jobs(request.locate_ids)`` and, when asked, ``throughput``,
        ``queue_states`` + ``queue_stats`` + ``queue_health``, ``list_workers`` and ``top_errors`` — each part
        exactly as its own function returns it (None: not asked for). The parts travel as JSON (``json_rows`` decodes
        them; the mappers parse JSON timestamps)."""
        totals, active, found, points, states, stats, lags, workers, errors = self.sql._one(cursor, *self.snapshot(request))
        return DeckSnapshot(
            summary=summary(json_rows(totals)[0]),
            active=[active_row(r) for r in json_rows(active)],
            located=located(json_rows(found)),
            throughput=None if request.throughput_since is None else [metric(r) for r in json_rows(points)],
            queue_states=[queue_state(r) for r in json_rows(states)] if request.queues else None,
            queue_stats=[queue_stats_row(r) for r in json_rows(stats)] if request.queues else None,
            queue_lags=[lag(r) for r in json_rows(lags)] if request.queues else None,
            workers=[worker_info(r) for r in json_rows(workers)] if request.workers else None,
            errors=[error_group(r) for r in json_rows(errors)] if request.errors_limit > 0 else None,
        )

    def history_buckets(self, cursor: Cursor, granularity: int, since: datetime, types_limit: int) -> HistoryWindow:
        """The ``granularity``-second buckets from ``since`` summed over queues and types (oldest first), and the
        ``types_limit`` busiest types over them: O(buckets × queues × types) rows, never Archive."""
        since_param = self.sql.param_ts(since)
        points = self.sql._all(cursor, HISTORY_POINTS_SQL.format(ts=self.sql.TS), [int(granularity), since_param])
        types = self.sql._all(cursor, HISTORY_TYPES_SQL.format(ts=self.sql.TS, limit=self.sql.LIMIT),
                          [int(granularity), since_param, int(types_limit)])
        return HistoryWindow([history_point(r) for r in points], [type_history(r) for r in types])
