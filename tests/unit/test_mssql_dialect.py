"""SQL Server dialect without a SQL Server: every statement checked against recorded rows.

No SQL Server can run where this suite runs, so these tests check what breaks
at run time on SQL Server and can be decided from the text alone:

* every function of ``chokaq_core.sql.mssql`` is called with sample arguments
  through a recording cursor that hands each statement to mssql-django's own
  cursor wrapper (its ``%s`` → ``?`` formatting and its ``GROUP BY``
  rewrite), over a fake pyodbc cursor that returns plausible rows, so every
  code path runs and every return value is checked against the protocol;
* each recorded statement: every table and column exists in the Django models
  (per table where the alias says which), placeholders match parameters in
  number, JSON parameters carry every key their ``OPENJSON … WITH`` paths read,
  no PostgreSQL/SQLite-only syntax leaks in, ``SET NOCOUNT`` is restored,
  no transaction control, autocommit-safe functions change one table at most;
* the migrations render through mssql-django's schema editor in collect mode
  (what ``manage.py sqlmigrate`` prints): the filtered indexes of 0001 and the
  PAGE compression of 0003, and the ``@Moved`` column types match the columns.

``manage.py sqlmigrate`` itself needs a live server (its migration loader reads
``django_migrations``), hence the schema editor here. When the system has no
unixODBC library, pyodbc cannot be imported; mssql-django then gets a stub
module with pyodbc's names, enough to format SQL (nothing here connects).
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from django.apps import apps

from chokaq_core import vendor_ops
from chokaq_core.domain import (
    ArchivedJob,
    Attempt,
    AttemptError,
    BucketSpend,
    ClaimHold,
    DeadJob,
    FailedAttempt,
    Failure,
    FailureReason,
    HotJob,
    JobFilter,
    JobStatus,
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
from chokaq_core.readmodel import (
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
from chokaq_core.sql import DIALECT_FUNCTIONS, base, json_rows, reads_for
from chokaq_core.sql import mssql as sql
from chokaq_core.sql.base import StaleBuckets
from chokaq_core.sql.reads import READ_FUNCTIONS

RENDER_ALIAS = "chokaq_mssql_render"

# ---------------------------------------------------------------- mssql-django without a driver


def _pyodbc_stub() -> types.ModuleType:
    """The names mssql-django reads from pyodbc at import time (constants, version, error classes)."""
    stub = types.ModuleType("pyodbc")
    stub.version = "5.0.0"  # type: ignore[attr-defined]
    stub.pooling = True  # type: ignore[attr-defined]
    error = type("Error", (Exception,), {})
    stub.Error = error  # type: ignore[attr-defined]
    for name in ("DatabaseError", "IntegrityError", "OperationalError", "ProgrammingError", "DataError",
                 "InterfaceError", "InternalError", "NotSupportedError"):
        setattr(stub, name, type(name, (error,), {}))
    constants: dict[str, int] = {}

    def constant(name: str) -> int:
        if not name.startswith("SQL_"):
            raise AttributeError(name)
        return constants.setdefault(name, -1000 - len(constants))

    stub.__getattr__ = constant  # type: ignore[method-assign]
    return stub


def mssql_base() -> types.ModuleType:
    try:
        import pyodbc  # noqa: F401
    except ImportError:
        sys.modules["pyodbc"] = _pyodbc_stub()
    return importlib.import_module("mssql.base")


# ---------------------------------------------------------------- recording cursor


class DriverError(Exception):
    """What pyodbc raises: SQLSTATE then the driver's message (with the native error number)."""


@dataclass
class Sets:
    """A batch whose first result carries no rows (a message or a count) before the row set."""

    results: list[list[tuple[Any, ...]] | None]


@dataclass
class Count:
    """A statement that changes rows and returns none: the count the driver reports (``cursor.rowcount``)."""

    rows: int


class DriverCursor:
    """Stands in for a pyodbc cursor: takes ``?`` SQL, serves scripted results."""

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)
        self.executed: list[tuple[str, tuple[Any, ...]]] = []
        self.results: list[list[tuple[Any, ...]] | None] = []
        self.rowcount = -1

    def execute(self, sql_text: str, params: Sequence[Any] = ()) -> DriverCursor:
        self.executed.append((sql_text, tuple(params)))
        item = self.script.pop(0) if self.script else None
        if isinstance(item, BaseException):
            raise item
        self.rowcount = item.rows if isinstance(item, Count) else -1
        self.results = list(item.results) if isinstance(item, Sets) else [None if isinstance(item, Count) else item]
        return self

    @property
    def description(self) -> list[tuple[str]] | None:
        return [("column",)] if self.results and self.results[0] is not None else None

    def nextset(self) -> bool:
        if self.results:
            self.results.pop(0)
        return bool(self.results)

    def fetchall(self) -> list[list[Any]]:
        rows = self.results[0] if self.results and self.results[0] is not None else []
        self.results = []
        return [list(row) for row in rows]

    def close(self) -> None:
        pass


class FakeDriverConnection:
    """The attributes mssql-django's cursor wrapper reads from its connection."""

    driver_charset = None
    supports_mars = True
    _is_microsoft_driver = True

    class Database:
        Error = Exception

    def _on_error(self, exc: BaseException) -> None:
        pass


class Recorder:
    """The cursor the dialect gets: records (sql, params) and runs them through mssql-django's wrapper."""

    def __init__(self, script: list[Any]) -> None:
        self.driver = DriverCursor(script)
        self.wrapped = mssql_base().CursorWrapper(self.driver, FakeDriverConnection())
        self.calls: list[tuple[str, list[Any]]] = []

    def execute(self, sql_text: str, params: Sequence[Any] | None = None) -> Any:
        self.calls.append((sql_text, list(params or [])))
        return self.wrapped.execute(sql_text, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


# ---------------------------------------------------------------- the statement checker

KEYWORDS = frozenset("""
    SET NOCOUNT ON OFF DECLARE TABLE NOT NULL PRIMARY KEY NVARCHAR MAX MIN INT BIGINT FLOAT BIT DATETIME2 DATETIMEOFFSET
    VARBINARY SELECT FROM WHERE AND OR IN IS AS WITH UPDLOCK READPAST ROWLOCK HOLDLOCK NOLOCK TOP ORDER BY DESC ASC
    GROUP INSERT INTO VALUES UPDATE DELETE OUTPUT INSERTED DELETED MERGE USING WHEN MATCHED THEN ELSE END CASE
    COALESCE COUNT SUM CAST DATEADD DATEDIFF SECOND MILLISECOND SYSUTCDATETIME OPENJSON ROW_NUMBER OVER PARTITION
    LEFT RIGHT INNER JOIN CROSS APPLY EXISTS DISTINCT UNION ALL NULLIF @@ROWCOUNT LIKE ESCAPE LOWER TRIM NCHAR REPLACE AVG
    DATEDIFF_BIG TODATETIMEOFFSET IF BEGIN WHILE FOR JSON PATH INCLUDE_NULL_VALUES OFFSET ROWS FETCH NEXT ONLY SUBSTRING
""".split())

FORBIDDEN = {
    "RETURNING": r"\bRETURNING\b",
    "SKIP LOCKED": r"\bSKIP\s+LOCKED\b",
    "ON CONFLICT": r"\bON\s+CONFLICT\b",
    "LIMIT": r"\bLIMIT\b",
    "FOR UPDATE": r"\bFOR\s+UPDATE\b",
    "::": r"::",
    "excluded.": r"\bexcluded\.",
    "now()": r"\bnow\s*\(",
    "GREATEST(": r"\bGREATEST\s*\(",
    "LEAST(": r"\bLEAST\s*\(",
    "make_interval": r"\bmake_interval\b",
    "date_trunc": r"\bdate_trunc\b",
    "unnest": r"\bunnest\b",
    "ANY(": r"\bANY\s*\(",
    "ILIKE": r"\bILIKE\b",
    "FILTER (WHERE": r"\bFILTER\s*\(",
    "IS DISTINCT FROM": r"\bIS\s+(?:NOT\s+)?DISTINCT\s+FROM\b",
    "true/false literal": r"\b(?:true|false)\b",
    "|| concatenation": r"\|\|",
    "double-quoted identifier": r'"',
    "json_each": r"\bjson_each\b",
    "julianday": r"\bjulianday\b",
    "NOTIFY": r"\b(?:pg_)?notify\b",
    "transaction control": r"\b(?:BEGIN\s+TRAN(?:SACTION)?|COMMIT|ROLLBACK|SAVE\s+TRAN(?:SACTION)?)\b",
    "XACT_ABORT": r"\bXACT_ABORT\b",
}

DML = re.compile(r"^\s*(?:WITH\b.*?\)\s*)?(INSERT|UPDATE|DELETE|MERGE)\b", re.S | re.I)


def model_columns() -> dict[str, set[str]]:
    """``db_table`` → column names, from the ChokaQ models."""
    return {
        model._meta.db_table: {f.column for f in model._meta.concrete_fields if f.column}
        for model in apps.get_app_config("chokaq_core").get_models()
    }


def _strip_literals(text: str) -> str:
    return re.sub(r"(?:\bN)?'(?:[^']|'')*'", "''", text)


def _depths(text: str) -> Iterator[tuple[str, int]]:
    """Each character of ``text`` with the parenthesis depth after it."""
    depth = 0
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        yield ch, depth


def _balanced(text: str, start: int) -> str:
    """The text inside the parenthesis opening at ``text[start]``."""
    for i, (_, depth) in enumerate(_depths(text[start:])):
        if depth == 0:
            return text[start + 1 : start + i]
    raise AssertionError(f"unbalanced parenthesis at {start}: {text[start:start + 60]!r}")


def _top_level(text: str) -> str:
    """``text`` without what any parenthesis encloses."""
    return "".join(ch for ch, depth in _depths(text) if depth == 0 and ch != ")")


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts = [""]
    for ch, depth in _depths(text):
        if ch == "," and depth == 0:
            parts.append("")
        else:
            parts[-1] += ch
    return [p.strip() for p in parts if p.strip()]


def _openjson_schemas(text: str) -> list[tuple[str, dict[str, str]]]:
    """(variable, {column: json path}) of every ``OPENJSON(@var) WITH (…)`` in ``text`` (literals kept); a JSON
    parameter given inline, ``OPENJSON(%s)``, has the variable ``%s<n>``, ``n`` its placeholder's index."""
    schemas = []
    for match in re.finditer(r"OPENJSON\((@\w+|%s)\)\s+WITH\s*\(", text, re.I):
        columns = {}
        for entry in _split_top(_balanced(text, match.end() - 1)):
            path = re.search(r"'([^']*)'", entry)
            columns[entry.split()[0]] = path.group(1) if path else f"$.{entry.split()[0]}"
        variable = match.group(1)
        schemas.append((f"%s{text[:match.start()].count('%s')}" if variable == "%s" else variable, columns))
    return schemas


def _declared_params(text: str, params: Sequence[Any]) -> dict[str, Any]:
    """``@var`` → the parameter bound by ``DECLARE @var <type> = %s`` (placeholders in order)."""
    bound: dict[str, Any] = {}
    for index, match in enumerate(re.finditer(r"%s", text)):
        declared = re.search(r"DECLARE\s+(@\w+)\s+[\w()]+\s*=\s*$", text[: match.start()].rsplit("\n", 1)[-1])
        if declared and index < len(params):
            bound[declared.group(1)] = params[index]
    return bound


def check_statement(text: str, params: Sequence[Any]) -> list[str]:
    """Everything SQL Server would reject at run time that the text alone decides. [] when clean."""
    columns = model_columns()
    all_columns = set().union(*columns.values())
    problems: list[str] = []

    if text.count("%s") != len(params):
        problems.append(f"{text.count('%s')} placeholders for {len(params)} parameters")
    bare = _strip_literals(text)
    if re.search(r"%(?!s)", bare):
        problems.append("a literal % (mssql-django formats every statement with %)")
    if "{" in bare or "}" in bare:
        problems.append("braces (mssql-django rewrites GROUP BY statements with str.format)")
    for name, pattern in FORBIDDEN.items():
        if re.search(pattern, re.sub(r"@@?\w+", "@v", bare), re.I):
            problems.append(f"PostgreSQL/SQLite-only or forbidden syntax: {name}")

    # SET NOCOUNT discipline: ON for the work, OFF again before the one statement whose result is read.
    statements = [s.strip() for s in bare.replace("%s", "NULL").split(";") if s.strip()]
    changing = [s for s in statements if DML.match(s) and re.search(r"\bchokaq_\w+", s)]
    if "SET NOCOUNT ON" in bare:
        if not statements[0].upper().startswith("SET NOCOUNT ON"):
            problems.append("SET NOCOUNT ON is not the first statement")
        if len(statements) < 2 or not re.fullmatch(r"(?:END\s+)?SET NOCOUNT OFF", statements[-2], re.I):
            problems.append("SET NOCOUNT OFF must come right before the final statement (it is session state)")
    elif len(changing) > 1:
        problems.append("a batch changing several tables without SET NOCOUNT ON")

    # JSON parameters carry every key their OPENJSON paths read (lax paths silently yield NULL).
    bound = {**_declared_params(text, params), **{f"%s{i}": param for i, param in enumerate(params)}}
    for variable, schema in _openjson_schemas(text):
        if variable not in bound:
            problems.append(f"OPENJSON reads {variable}, which no DECLARE binds to a parameter")
            continue
        if bound[variable] is None:  # nothing to read: the statement must not reach OPENJSON at all
            if not re.search(rf"WHEN\s+{variable}\s+IS\s+NOT\s+NULL\b", text, re.I):
                problems.append(f"{variable} is NULL and no CASE WHEN {variable} IS NOT NULL guards its OPENJSON")
            continue
        items = json.loads(bound[variable])
        assert isinstance(items, list) and items, f"{variable} must be a non-empty JSON array"
        for column, path in schema.items():
            key = path.removeprefix("$.")
            missing = [item for item in items if key not in item]
            if not path.startswith("$.") or missing:
                problems.append(f"OPENJSON column {column} reads {path}, absent from the {variable} items")

    # ORDER BY in a derived table, subquery or CTE needs TOP, OFFSET or FOR JSON/XML (error 1033).
    for match in re.finditer(r"\(\s*SELECT\b", bare, re.I):
        query = _top_level(_balanced(bare, match.start()))
        if re.search(r"\bORDER\s+BY\b", query, re.I) and not re.search(
                r"^\s*SELECT\s+(?:DISTINCT\s+)?TOP\b|\bOFFSET\b|\bFOR\s+(?:JSON|XML)\b", query, re.I):
            problems.append(f"ORDER BY in a nested query without TOP/OFFSET/FOR JSON: {query[:60]!r}")

    ctes = set(re.findall(r"\b(\w+)\s+AS\s*\(", bare, re.I)) - KEYWORDS
    listed = re.findall(r"\b(\w+)\s*\(([^()]*)\)\s+AS\s*\(", bare, re.I)  # a CTE naming its columns
    ctes |= {name for name, _ in listed}
    table_vars: dict[str, set[str]] = {}
    for match in re.finditer(r"DECLARE\s+(@\w+)\s+TABLE\s*\(", bare, re.I):
        entries = _split_top(_balanced(bare, match.end() - 1))
        table_vars[match.group(1)] = {entry.split()[0] for entry in entries}
        for name in table_vars[match.group(1)] - all_columns:
            problems.append(f"{match.group(1)} column {name} is not a model column")
    openjson_names = {name for _, schema in _openjson_schemas(text) for name in schema}

    for statement in statements:
        tables = set(re.findall(r"\b(chokaq_\w+)\b", statement))
        for table in tables - set(columns):
            problems.append(f"unknown table {table}")
        aliases = {t: t for t in tables}  # alias or table name -> chokaq table, @table variable, CTE or "derived"
        for table, alias in re.findall(r"\b(chokaq_\w+)\s+(?:WITH\s*\([^)]*\)\s+)?(?:AS\s+)?(\w+)", statement, re.I):
            if alias.upper() not in KEYWORDS:  # ``AS`` is optional before an alias
                aliases[alias] = table
        for source, alias in re.findall(r"(?=(@\w+|\b\w+)\s+(?:AS\s+)?(\w+))", statement):
            if (source in table_vars or source in ctes) and alias.upper() not in KEYWORDS:
                aliases.setdefault(alias, source)
        for alias in re.findall(r"\)\s*AS\s+(\w+)", statement):
            aliases.setdefault(alias, "derived")
        declared = {a for a in re.findall(r"\bAS\s+(\w+)", statement, re.I)} - KEYWORDS
        for names in re.findall(r"\)\s*AS\s+\w+\s*\(([^()]*)\)", statement, re.I):  # AS t(c0, c1): derived columns
            declared |= set(_split_top(names))
        vars_used = [v for v in table_vars if v in statement]
        local_columns = set().union(*(columns.get(t, set()) for t in tables), *(table_vars[v] for v in vars_used))
        scope = local_columns | declared | ctes | openjson_names | set(tables) | {
            c for _, names in listed for c in _split_top(names)}

        for token in re.findall(r"@{0,2}[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?", statement):
            if token.startswith("@") or token.upper() in KEYWORDS:
                continue
            if "." in token:
                prefix, name = token.split(".")
                source = aliases.get(prefix)
                if prefix.lower() in ("inserted", "deleted"):
                    allowed = local_columns
                elif source in columns:
                    allowed = columns[source]
                elif source in table_vars:
                    allowed = table_vars[source]
                elif source is not None:  # a CTE or a derived table: its declared names
                    allowed = declared | local_columns | openjson_names
                else:
                    problems.append(f"unknown alias {prefix} in {token}")
                    continue
                if name not in allowed:
                    problems.append(f"{token}: no column {name} in {source or prefix}")
            elif token not in scope and token not in aliases:
                problems.append(f"unknown identifier {token}")

        # Column lists and assignments name columns of their target table.
        for table, names in re.findall(r"INSERT\s+INTO\s+(chokaq_\w+|@\w+)\s*\(([^)]*)\)", statement, re.I):
            target = columns.get(table) or table_vars.get(table, set())
            problems += [f"INSERT INTO {table}: no column {n}" for n in _split_top(names) if n not in target]
        merge = re.match(r"MERGE\s+(chokaq_\w+)", statement, re.I)
        if merge:
            target = columns.get(merge.group(1), set())
            insert = re.search(r"THEN\s+INSERT\s*\(([^)]*)\)", statement, re.I)
            if insert:
                problems += [f"MERGE INSERT: no column {n}" for n in _split_top(insert.group(1)) if n not in target]
            update = re.search(r"THEN\s+UPDATE\s+SET\s+(.*?)(?=\bWHEN\b|$)", statement, re.I | re.S)
            if update:
                problems += [f"MERGE UPDATE SET: no column {a}" for a in _assigned(update.group(1)) if a not in target]
        update = re.search(r"\bUPDATE\s+(?!SET\b)(\w+)(?:\s+WITH\s*\([^)]*\))?\s+SET\s+(.*?)(?=\bOUTPUT\b|\bFROM\b"
                           r"|\bWHERE\b|$)", statement, re.I | re.S)
        if update:
            target_name = aliases.get(update.group(1), update.group(1))
            target = columns.get(target_name, set())
            if not target:
                problems.append(f"UPDATE target {update.group(1)} is not a ChokaQ table")
            problems += [f"UPDATE SET: no column {a} in {target_name}" for a in _assigned(update.group(2))
                         if a not in target]
    return problems


def _assigned(set_clause: str) -> list[str]:
    return [re.match(r"(?:\w+\.)?(\w+)\s*=", part).group(1)  # type: ignore[union-attr]
            for part in _split_top(set_clause)]


def test_the_checker_catches_what_it_claims_to() -> None:
    assert check_statement("SELECT id FROM chokaq_jobs_hot WHERE id = %s", ["x"]) == []
    cases = {
        "SELECT nope FROM chokaq_jobs_hot": "unknown identifier nope",
        "SELECT h.failed_at FROM chokaq_jobs_hot AS h": "no column failed_at",
        "SELECT h.failed_at FROM chokaq_jobs_hot h": "no column failed_at",
        "UPDATE chokaq_queues SET is_paused = 1 FROM (SELECT 1 AS n) AS c WHERE chokaq_queues.nope = c.n": "no column nope",
        "WITH e(v) AS (SELECT 1) UPDATE chokaq_queues SET max_workers = v FROM e": "",
        "WITH e(v) AS (SELECT 1) UPDATE chokaq_queues SET max_workers = w FROM e": "unknown identifier w",
        "SELECT id FROM chokaq_nope": "unknown table",
        "SELECT id FROM chokaq_jobs_hot WHERE id = %s": "placeholders",
        "UPDATE chokaq_queues SET is_paused = true": "true/false",
        "UPDATE chokaq_queues SET paused = 1": "UPDATE SET: no column paused",
        "SELECT TOP 1 id FROM chokaq_jobs_hot LIMIT 1": "LIMIT",
        "DELETE FROM chokaq_jobs_dlq WHERE id = 'a' RETURNING id": "RETURNING",
        "INSERT INTO chokaq_queues (name, paused) VALUES ('a', 1)": "no column paused",
        "SET NOCOUNT ON; UPDATE chokaq_queues SET is_paused = 1; SELECT 1": "SET NOCOUNT OFF",
        "UPDATE chokaq_queues SET is_paused = 1; DELETE FROM chokaq_workers": "without SET NOCOUNT ON",
        "SELECT x.id FROM chokaq_jobs_hot AS h": "unknown alias x",
        "SELECT id FROM chokaq_jobs_hot WHERE tags = 'a%{b}'": "",  # inside literals: fine
        "BEGIN TRANSACTION; SELECT 1": "transaction control",
        "SELECT a.id FROM (SELECT id FROM chokaq_jobs_hot ORDER BY id) AS a": "ORDER BY in a nested query",
        "SELECT a.c0 FROM (SELECT TOP (1) id FROM chokaq_jobs_hot ORDER BY id) AS a(c0)": "",
        "SELECT (SELECT c0 FROM (SELECT id FROM chokaq_jobs_hot) AS t(c0) ORDER BY c0 FOR JSON PATH)": "",
        "SELECT (SELECT a.c1 FROM (SELECT id FROM chokaq_jobs_hot) AS a(c0) FOR JSON PATH)": "no column c1",
    }
    for statement, expected in cases.items():
        problems = check_statement(statement, [])
        if expected:
            assert any(expected in p for p in problems), (statement, problems)
        else:
            assert problems == [], (statement, problems)
    planted = "DECLARE @Ids nvarchar(max) = %s; SELECT i.id FROM OPENJSON(@Ids) WITH (id nvarchar(50) '$.job') AS i"
    assert any("reads $.job" in p for p in check_statement(planted, ['[{"id": "a"}]']))
    inline = "SELECT i.id FROM chokaq_jobs_hot WHERE id = %s OR id IN (SELECT i.id FROM OPENJSON(%s) WITH (id nvarchar(50) '$.job') AS i)"
    assert any("reads $.job" in p for p in check_statement(inline, ["a", '[{"id": "a"}]']))
    unguarded = "DECLARE @Ids nvarchar(max) = %s; SELECT i.id FROM OPENJSON(@Ids) WITH (id nvarchar(50) '$.id') AS i"
    assert any("no CASE WHEN @Ids IS NOT NULL" in p for p in check_statement(unguarded, [None]))


# ---------------------------------------------------------------- sample rows

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def _row(names: Sequence[str], **values: Any) -> tuple[Any, ...]:
    defaults: dict[str, Any] = {
        "id": "J1", "queue": "mail", "type": "test.ok.v1", "payload": "{}", "priority": 10, "status": 1,
        "attempt_count": 0, "worker_id": "w1", "created_at": T0, "last_updated_at": T0, "finished_at": T0,
        "failed_at": T0, "failure_reason": 6,
    }
    defaults.update(values)
    return tuple(defaults.get(name) for name in names)


def hot_row(**values: Any) -> tuple[Any, ...]:
    return _row(base.HOT_FIELDS, **values)


def new_job(job_id: str, key: str | None = None, delay: float | None = None) -> NewJob:
    return NewJob(id=job_id, queue="mail", type="test.ok.v1", payload='{"n": 1}', tags="a,b", idempotency_key=key,
                  priority=20, delay_seconds=delay, created_by="tests")


WORKER = WorkerInfo(worker_id="w1", hostname="host", pid=42, queues="mail,default", capacity=8, active_count=2)


@dataclass
class Case:
    """One call of a dialect function: arguments, the driver's scripted results, the expected return."""

    function: str
    args: tuple[Any, ...]
    script: list[Any] = field(default_factory=list)
    expected: Any = None
    check: Any = None  # a callable(result) for results compared by shape


ACTIVE_FIELDS = [c.strip() for c in base.ACTIVE_ROW.split(",")]
ARCHIVE_ROW_FIELDS = [c.strip() for c in base.ARCHIVE_ROW.split(",")]
DLQ_ROW_FIELDS = [*(c.strip() for c in base.DLQ_WINDOWED_ROW.split(","))]


def _job_rows(rows: Any, status: JobStatus) -> bool:
    return len(rows) == 1 and isinstance(rows[0], JobRow) and rows[0].status is status and (
        rows[0].created_at == T0 and rows[0].created_at.tzinfo is not None)


def _is_hot_batch(result: Any) -> bool:
    return [j.id for j in result] == ["J2", "J3", "J1"] and all(
        isinstance(j, HotJob) and j.status is JobStatus.FETCHED and j.created_at.tzinfo is not None for j in result)


# ---------------------------------------------------------------- deck_snapshot sample: each part's native rows

T1 = T0 + timedelta(seconds=1, microseconds=123456)
SNAPSHOT_SINCE = T0 - timedelta(minutes=5)
SNAPSHOT_IDS = ["J1", "J2", "J3", "J1"]

# What each separate read's statement returns on SQL Server (pyodbc types: datetimeoffset aware, bit bool).
SNAPSHOT_NATIVE: dict[str, list[tuple[Any, ...]]] = {
    "summary_stats": [(1, 2, 3, 10, 4, 5, T1, 2, 0, 0, 1, 0)],
    "list_active": [_row(ACTIVE_FIELDS, id="J2", status=2, priority=5, created_at=T1, started_at=T1, tags="a,b"),
                    _row(ACTIVE_FIELDS, id="J1", status=0, priority=10, scheduled_at=T1, created_by="me")],
    "locate_jobs": [("J1", 2), ("J2", 3), ("J3", -2)],
    "throughput": [(T0, 3, 1), (T1, 0, 2)],
    "queue_states": [("default", False, True, None, None), ("mail", True, False, 60, 3)],
    "queue_stats": [("default", 0, 0, 0, 0, 0, 0, None, 0), ("mail", 1, 0, 2, 7, 1, 0, T1, 1)],
    "queue_health": [("default", 0, Decimal("0"), Decimal("0")), ("mail", 2, Decimal("1.500000"), Decimal("2.250000"))],
    "list_workers": [_row(base.WORKER_FIELDS, worker_id="w2", hostname="h", pid=7, queues="mail", capacity=4,
                          active_count=1, is_running=True, runtime_json='{"x": "1/2"}', circuits_json="[]",
                          started_at=T0, last_heartbeat_at=T1, stopped_at=None),
                     _row(base.WORKER_FIELDS, worker_id="w1", hostname="h", pid=8, queues="*", capacity=2,
                          active_count=0, is_running=False, runtime_json="{}", circuits_json="[]",
                          started_at=T0, last_heartbeat_at=T0, stopped_at=T1)],
    "top_errors": [(6, "", 3, T1, "builtins.ValueError", "boom"), (8, "(empty error details)", 1, T0, None, None)],
}
# The same read called on its own: (function, arguments) per DeckSnapshot field.
SNAPSHOT_PARTS = {
    "summary": ("summary_stats", ()), "active": ("list_active", (JobFilter(), 50)),
    "located": ("locate_jobs", (SNAPSHOT_IDS,)), "throughput": ("throughput", (SNAPSHOT_SINCE,)),
    "queue_states": ("queue_states", ()), "queue_stats": ("queue_stats", ()), "queue_lags": ("queue_health", ()),
    "workers": ("list_workers", ()), "errors": ("top_errors", (5,)),
}


def _json_value(value: Any) -> Any:
    """A value as FOR JSON writes it: datetimeoffset with 7 fractional digits and its offset, numbers as numbers."""
    if isinstance(value, datetime):
        text = value.strftime("%Y-%m-%dT%H:%M:%S.%f") + "0"
        return text + value.strftime("%z")[:3] + ":" + value.strftime("%z")[3:] if value.tzinfo else text
    if isinstance(value, Decimal):
        return float(value)
    return value


def for_json(rows: Sequence[Sequence[Any]]) -> str | None:
    """``(SELECT c0, … FROM (…) AS t(c0, …) FOR JSON PATH, INCLUDE_NULL_VALUES)``: NULL when there is no row."""
    if not rows:
        return None
    return json.dumps([{f"c{i}": _json_value(v) for i, v in enumerate(row)} for row in rows], separators=(",", ":"))


def snapshot_row(native: dict[str, list[tuple[Any, ...]]], request: SnapshotRequest) -> tuple[Any, ...]:
    """The one row the deck_snapshot statement returns: a JSON text per part, NULL where its CASE is not taken."""
    def part(name: str, asked: bool) -> str | None:
        return for_json(native[name]) if asked else None

    return (part("summary_stats", True), part("list_active", True), part("locate_jobs", bool(request.locate_ids)),
            part("throughput", request.throughput_since is not None), part("queue_states", request.queues),
            part("queue_stats", request.queues), part("queue_health", request.queues),
            part("list_workers", request.workers), part("top_errors", request.errors_limit > 0))


ATTEMPT_ERROR = AttemptError("builtins.ConnectionError", "it's 50% down",
                             "Traceback (most recent call last):\n  ...\nConnectionError: it's 50% down\n")
FULL_REQUEST = SnapshotRequest(active_limit=50, locate_ids=SNAPSHOT_IDS, throughput_since=SNAPSHOT_SINCE, queues=True,
                               workers=True, errors_limit=5)
BARE_REQUEST = SnapshotRequest(active_limit=10)
EMPTY_NATIVE = {name: rows if name == "summary_stats" else [] for name, rows in SNAPSHOT_NATIVE.items()}


def _full_snapshot(snap: Any) -> bool:
    return (isinstance(snap, DeckSnapshot) and snap.summary == SummaryStats(1, 2, 3, 10, 4, 5, T1, 2, retrying=1)
            and [r.id for r in snap.active] == ["J2", "J1"] and len(snap.located) == 3
            and all(part is not None for part in (snap.throughput, snap.queue_states, snap.queue_stats,
                                                  snap.queue_lags, snap.workers, snap.errors)))


def _bare_snapshot(snap: Any) -> bool:
    return (isinstance(snap, DeckSnapshot) and snap.summary.total == 18 and len(snap.active) == 2
            and snap.located == {} and snap.throughput is None and snap.queue_states is None
            and snap.queue_stats is None and snap.queue_lags is None and snap.workers is None and snap.errors is None)


def _empty_snapshot(snap: Any) -> bool:
    return (isinstance(snap, DeckSnapshot) and snap.active == [] and snap.located == {} and snap.throughput == []
            and snap.queue_states == snap.queue_stats == snap.queue_lags == snap.workers == snap.errors == [])


BINS = (0, 0, 0, 0, 1, 2, *([0] * 14))
CLAIMED = [[hot_row(id="J1", priority=1), hot_row(id="J3", priority=50, created_at=T0 + timedelta(seconds=5)),
            hot_row(id="J2", priority=50, scheduled_at=T0 - timedelta(seconds=5))]]  # fetch_batch's rows, out of order

CASES = [
    Case("enqueue", ([new_job("A", "k1"), new_job("B", "k1"), new_job("C"), new_job("D", "k2", 1.5)],),
         [[("A", None), ("C", None), ("A", "k1"), ("HOLDER", "k2")]], ["A", "A", "C", "HOLDER"]),
    Case("enqueue", ([],), [], []),
    Case("fetch_batch", ("w1", 5, ["mail", "default", "mail"]), CLAIMED, check=_is_hot_batch),
    Case("fetch_batch", ("w1", 5, None), CLAIMED, check=_is_hot_batch),
    Case("fetch_batch", ("w1", 5, []), [], []),
    Case("fetch_alone", ("w1", 5, ["mail"], 1), [], None),  # no one-statement claim here: fetch_batch's transaction
    Case("mark_processing", ("J1", "w1"), [[("J1", 1)]], 1),
    Case("mark_processing", ("J1", "w1"), [[]], None),
    Case("mark_processing", ("J1", "w1"), [Sets([None, None, [("J1", 3)]])], 3),  # results without a row set skipped
    Case("mark_processing_batch", (["J1", "J2", "J1"], "w1"), [[("J1", 2)]], {"J1": 2}),
    Case("mark_processing_batch", ([], "w1"), [], {}),
    Case("mark_processing_batch", (["J1"], "w1", T0), [[("J1", 2)]], {"J1": 2}),  # started at a given moment
    Case("keep_alive", (["J1", "J2", "J1"], "w1"), [[("J1",)]], ["J1"]),
    Case("keep_alive", ([], "w1"), [], []),
    Case("cancel_requests", ("w1",), [[("J1", "bob")]], [("J1", "bob")]),
    Case("begin_completion", ("w1", ["J3", "J2", "J1"], ["J2", "J3"]), [Sets([None, [("J1", None), ("J2", T1)]])],
         {"J2": T1}),  # J3 no longer this worker's: no row
    Case("begin_completion", (None, ["J1"], ["J1"]), [[("J1", T1.replace(tzinfo=None))]], {"J1": T1}),
    Case("begin_completion", ("w1", ["J1"], []), [], {}),
    Case("archive_succeeded", ("w1", [Success("J1", 12.5), Success("J2", None)]),
         [[("J1", "mail"), ("J2", "mail")]], [("J1", "mail"), ("J2", "mail")]),
    Case("archive_succeeded", (None, [Success("J1", float("nan"))]), [[("J1", "mail")]], [("J1", "mail")]),
    Case("archive_succeeded", ("w1", []), [], []),
    Case("move_to_dlq", ("w1", [Failure("J1", FailureReason.FATAL_ERROR, "boom"),
                                Failure("J2", FailureReason.TIMEOUT, "  ")]),
         [[("J1", "mail")]], [("J1", "mail")]),
    Case("move_to_dlq", (None, [Failure("J1", FailureReason.CANCELLED, "Cancelled by admin: x")]), [[]], []),
    Case("reschedule_for_retry", ("w1", [Retry("J1", 2, 3.25), Retry("J2", 1, 0.0)]),
         [[("J1", "mail")]], [("J1", "mail")]),
    Case("reschedule_for_retry", (None, [Retry("J1", 1, 86400.0 * 40)]), [[("J1", "mail")]], [("J1", "mail")]),
    Case("move_to_dlq", ("w1", [Failure("J1", FailureReason.MAX_RETRIES_EXCEEDED, "Traceback …", 3, ATTEMPT_ERROR)]),
         [[("J1", "mail")]], [("J1", "mail")]),
    Case("reschedule_for_retry", ("w1", [Retry("J1", 2, 30.0, ATTEMPT_ERROR), Retry("J2", 0, 5.0, held_by="t.v1")]),
         [[("J1", "mail"), ("J2", "mail")]], [("J1", "mail"), ("J2", "mail")]),
    Case("release_jobs", (["J1", "J2"], "w1"), [[("J2",)]], ["J2"]),
    Case("release_jobs", ([], "w1"), [], []),
    Case("resurrect", ("J1", '{"fixed": true}', "retried", 30, "alice"), [[("J1", "mail")]], True),
    Case("resurrect", ("J1", None, None, None, None), [[]], False),
    Case("resurrect_batch", (["J1", "J2"], "alice"), [[("J1", "mail")]], [("J1", "mail")]),
    Case("resurrect_batch", ([], "alice"), [], []),
    Case("cancel_batch", (["J1", "J2"], "alice"), [[("J2", "mail")]], [("J2", "mail")]),
    Case("cancel_batch", (["J1"], None), [[]], []),
    Case("request_cancel", (["J1"], "alice"), [[("J1",)]], ["J1"]),
    Case("update_hot_data", ("J1", '{"a": 1}', None, 5, "alice"), [[("J1",)]], True),
    Case("update_hot_data", ("J1", None, None, None, "alice"), [], False),
    Case("update_dlq_data", ("J1", '{"a": 1}', "t", "alice"), [[]], False),
    Case("update_dlq_data", ("J1", None, "t", None), [[("J1",)]], True),
    Case("purge_dlq_ids", (["J1", "J2", "J1"], 1000), [[("J1", "mail")]], [("J1", "mail")]),
    Case("purge_dlq_ids", ([], 1000), [], []),
    Case("purge_dlq_older_than", (T0 - timedelta(days=7), 1000), [[("J1", "mail"), ("J2", "mail"), ("J3", "x")]], 3),
    Case("purge_archive", (T0 - timedelta(days=1), 2), [Sets([None, [("J1", "mail"), ("J2", "mail")]])], 2),
    Case("recover_abandoned", (600.0,), [Count(4)], 4),
    Case("archive_zombies", (600.5,), [[("J1", "mail")]], [("J1", "mail")]),
    Case("set_queue_paused", ("mail", True), [None], None),
    Case("set_queue_zombie_timeout", ("mail", None), [None], None),
    Case("set_queue_max_workers", ("mail", 3), [None], None),
    Case("set_queue_active", ("mail", False), [[("mail",)]], True),
    Case("set_queue_active", ("nope", True), [[]], False),
    Case("upsert_worker", (WORKER,), [None], None),
    Case("stop_worker", ("w1",), [None], None),
    Case("rate_limits", (), [[("type:pay.v1", 100, 60.0, 10, 0, 60.0, 1, False, True, 50, "ops", T0.replace(tzinfo=None))]],
         [RateLimitState("type:pay.v1", Rate(100, 60.0, 10), Rate(0, 60.0, 1), False, True, 50, "ops", T0)]),
    Case("rate_buckets", (["type:pay.v1"],), [[("type:pay.v1", "", 2.5, T0, T0, 7)]],
         [RateBucket("type:pay.v1", "", 2.5, T0, T0, 7)]),
    Case("rate_buckets", ([],), [], []),
    Case("fetch_batch", ("w1", 5, ["mail"], ClaimHold(("mail",), ("pay.v1",), (("type", "pay.v1", "tenant:1"),))),
         CLAIMED, check=_is_hot_batch),
    Case("pending_by_key", (), [[("mail", "pay.v1", "tenant:1", 3), ("mail", "pay.v1", None, 1)]],
         [("mail", "pay.v1", "tenant:1", 3), ("mail", "pay.v1", None, 1)]),
    Case("declare_rate_limits", ([RateLimit("type:pay.v1", Rate(100, 60.0, 10), True, 50)],), [None, None, None], None),
    Case("declare_rate_limits", ([],), [None], None),
    Case("set_rate_limit", ("queue:mail", Rate(0, 60.0, 1), False, "ops"), [None, None], None),
    Case("set_rate_limit", ("queue:mail", None, True, "ops"), [None, None], None),
    Case("lock_rate_buckets", (["queue:mail", "type:pay.v1"],),
         [[("queue:mail", T0), ("type:pay.v1", T0)], [("type:pay.v1", "", 2.5, T0, T0, 7)]],
         (T0, [RateBucket("type:pay.v1", "", 2.5, T0, T0, 7)])),
    Case("lock_rate_buckets", (["queue:gone"],), [[], [(T0,)]], (T0, [])),
    Case("read_rate_buckets", (["type:pay.v1"],), [[(T0,)], [("type:pay.v1", "", 2.5, T0, T0, 7)]],
         (T0, [RateBucket("type:pay.v1", "", 2.5, T0, T0, 7)])),
    Case("save_rate_buckets", ([RateBucket("type:pay.v1", "", 0.5, T0, T0, 3)],
                               [RateBucket("type:pay.v1", "tenant:1", 1.0, T0, T0, 1)], [("type:pay.v1", "tenant:2")]),
         [None, None, None], None),
    Case("lease_spending", (["J1"], "w1", [BucketSpend(RateBucket("type:pay.v1", "", 2.5, T0, T0, 7),
                                                      RateBucket("type:pay.v1", "", 1.5, T0, T0, 8), ("J1",))], T0),
         [[("type:pay.v1",)], [("J1", 1)]], {"J1": 1}),
    Case("queue_states", (), [[("default", False, True, None, None), ("mail", True, False, 60, 3)]],
         [QueueState("default", False, True, None, None), QueueState("mail", True, False, 60, 3)]),
    Case("summary_stats", (), [[(1, 2, 3, 10, 4, 5, T0.replace(tzinfo=None), 2, 0, 0, 1, 0)]],
         SummaryStats(1, 2, 3, 10, 4, 5, T0, 2, 0, 0, 1, 0)),
    Case("queue_stats", (), [[("mail", 1, 0, 2, 7, 1, 0, None, 3)]], [QueueStats(1, 0, 2, 7, 1, 0, None, 3, queue="mail")]),
    Case("get_hot", ("J1",), [[hot_row(status=2)]],
         check=lambda job: isinstance(job, HotJob) and job.status is JobStatus.PROCESSING and job.created_at == T0),
    Case("get_hot", ("J1",), [[]], None),
    Case("get_archived", ("J1",), [[_row(base.ARCHIVE_FIELDS, duration_ms=3.5)]],
         check=lambda job: isinstance(job, ArchivedJob) and job.duration_ms == 3.5 and job.finished_at == T0),
    Case("get_archived", ("J1",), [[]], None),
    Case("get_dead", ("J1",), [[_row(base.DLQ_FIELDS, error_details="boom")]],
         check=lambda job: isinstance(job, DeadJob) and job.failure_reason is FailureReason.FATAL_ERROR),
    Case("get_dead", ("J1",), [[]], None),
    Case("list_active", (JobFilter(queue="mail", type="test.ok.v1", status=JobStatus.PENDING, search="50%_[x]",
                                   from_at=T0 - timedelta(days=1), to_at=T0), 100),
         [[_row(ACTIVE_FIELDS, status=0, priority=5)]], check=lambda rows: _job_rows(rows, JobStatus.PENDING)),
    Case("list_active", (JobFilter(), 10), [[]], []),
    Case("list_archive", (JobFilter(search="x", from_at=T0), (T0, "J9"), 50, HistorySort("date", True)),
         [[_row(ARCHIVE_ROW_FIELDS, duration_ms=2.0)]], check=lambda rows: _job_rows(rows, JobStatus.SUCCEEDED)),
    Case("list_archive", (JobFilter(), ("w1", "J1"), 50, HistorySort("worker", False)), [[]], []),
    Case("list_archive", (JobFilter(queue="mail"), None, 50, HistorySort("duration", True)), [[]], []),
    Case("list_dlq", (JobFilter(failure_reason=FailureReason.ZOMBIE, search="boom", to_at=T0), (2, "J2"), 50,
                      HistorySort("reason", False)),
         [[_row(DLQ_ROW_FIELDS, failure_reason=2, error_head="Zombie: …")]],
         check=lambda rows: _job_rows(rows, JobStatus.ZOMBIE)),
    Case("list_dlq", (JobFilter(), None, 50, HistorySort("date", True)), [[]], []),
    Case("list_dlq", (JobFilter(search="boom"), None, 50, HistorySort("queue", True, 500, 1000)), [[]], []),
    Case("list_archive", (JobFilter(search="x"), None, 50, HistorySort("date", True, None, 1000)), [[]], []),
    Case("locate_jobs", (["J1", "J2", "J3", "J1"],), [[("J1", 2), ("J2", 3), ("J3", -2)]],
         {"J1": JobStatus.PROCESSING, "J2": JobStatus.SUCCEEDED, "J3": JobStatus.CANCELLED}),
    Case("locate_jobs", ([],), [], {}),
    Case("throughput", (T0 - timedelta(minutes=5),), [[(T0, 3, 1)]], [MetricPoint(T0, 3, 1)]),
    Case("queue_health", (), [[("mail", 2, Decimal("1.5"), Decimal("2.25"))]], [QueueLag("mail", 2, 1.5, 2.25)]),
    Case("top_errors", (5,), [[(6, "", 3, T0, "builtins.ValueError", "boom")]],
         [ErrorGroup(FailureReason.FATAL_ERROR, "", 3, T0, "builtins.ValueError", "boom")]),
    Case("preview_dlq_bulk", (JobFilter(queue="mail"), 100), [[(12,)], [("J1",), ("J2",)]],
         BulkPreview(12, 12, False, ["J1", "J2"])),
    Case("preview_dlq_bulk", (JobFilter(type="t"), 5), [[(12,)], [("J1",)]], BulkPreview(12, 5, True, ["J1"])),
    Case("preview_dlq_bulk", (JobFilter(), 100), [[(0,)]], BulkPreview(0, 0, False, [])),
    Case("count_matching", ("hot", JobFilter(queue="mail", status=JobStatus.PENDING, search="x")), [[(3, "J9")]],
         (3, "J9")),
    Case("count_matching", ("dlq", JobFilter(failure_reason=FailureReason.TIMEOUT)), [[(0, None)]], (0, None)),
    Case("matching_ids", ("hot", JobFilter(queue="mail"), None, "J9", 500), [[("J9",), ("J8",)]], ["J9", "J8"]),
    Case("matching_ids", ("dlq", JobFilter(), "J8", "J9", 500), [[]], []),
    Case("purge_dlq_by_filter", (JobFilter(queue="mail", to_at=T0), 100), [[("J1",)], [("J1", "mail")]],
         [("J1", "mail")]),
    Case("purge_dlq_by_filter", (JobFilter(), 0), [], []),
    Case("resurrect_dlq_by_filter", (JobFilter(failure_reason=FailureReason.TRANSIENT), 100, "alice"),
         [[("J1",)], [("J1", "mail")]], [("J1", "mail")]),
    Case("resurrect_dlq_by_filter", (JobFilter(search="x"), 10, None), [[]], []),
    Case("purge_archive_ids", (["J1", "J1"],), [[("J1", "mail")]], [("J1", "mail")]),
    Case("purge_archive_ids", ([],), [], []),
    Case("count_archive_older_than", (T0, 100_001), [[(5,)]], 5),
    Case("count_dlq_older_than", (T0, 100_001), [[(0,)]], 0),
    Case("list_workers", (), [[_row(base.WORKER_FIELDS, hostname="h", pid=7, queues="mail", capacity=4,
                                    active_count=1, is_running=1, runtime_json="{}", circuits_json="[]",
                                    started_at=T0, last_heartbeat_at=T0.replace(tzinfo=None))]],
         check=lambda ws: len(ws) == 1 and isinstance(ws[0], WorkerInfo) and ws[0].is_running is True
         and ws[0].last_heartbeat_at == T0),
    Case("purge_workers", (T0, 100), [Count(3)], 3),
    Case("purge_metric_buckets", (T0, 100), [Count(0)], 0),
    Case("tidy_hot_table", (20_000,), [], False),  # SQL Server's ghost cleanup: nothing to run
    Case("session_pid", (), [], None),  # no pooler to tell apart: nothing to run
    Case("claim_schedule_tick", ("nightly", T0), [[("nightly",)]], True),
    Case("claim_schedule_tick", ("nightly", T0), [[], None], False),
    Case("schedule_ticks", (), [[("nightly", T0)]], {"nightly": T0}),
    Case("schedule_states", (), [[("nightly", T0, None, "J1", T1), ("hourly", T0.replace(tzinfo=None), 0, None, None)]],
         [ScheduleState("nightly", T0, None, "J1", T1), ScheduleState("hourly", T0, False)]),
    Case("set_schedule_enabled", ("nightly", False, T0), [None], None),
    Case("set_schedule_enabled", ("nightly", True, T0), [None], None),
    Case("record_schedule_run", ("nightly", "J1", T0), [None], None),
    Case("record_history", (["J1", "J2", "J1"], ["J3"], T0), [None], None),
    Case("record_history", ([], [], T0), [], None),
    Case("history_buckets", (60, T0, 20), [[(T0, 3, 1, 12.5, *BINS)], [("t", 3, 1, 12.5, *BINS, 3, 30.0)]],
         HistoryWindow([HistoryPoint(T0, 3, 1, BINS, 12.5)], [TypeHistory("t", 3, 1, 3, 30.0, 12.5, BINS)])),
    Case("history_buckets", (3600, T0, 20), [[], []], HistoryWindow([], [])),
    Case("purge_history", (60, T0, 100), [Count(3)], 3),
    Case("change_marker", (), [], None),  # no statement: workers poll on SQL Server
    Case("record_attempts", ("w1", [FailedAttempt("J1", 1, ATTEMPT_ERROR, T0), FailedAttempt("J2", 3, ATTEMPT_ERROR)]),
         [None], None),
    Case("record_attempts", (None, []), [], None),
    Case("job_attempts", ("J1",), [[("J1", 1, "w1", "builtins.ConnectionError", "timeout", "Traceback …", T1, T0),
                                    ("J1", 2, None, "builtins.ValueError", "bad", "Traceback …",
                                     T1.replace(tzinfo=None), None)]],
         [Attempt("J1", 1, "w1", "builtins.ConnectionError", "timeout", "Traceback …", T1, T0),
          Attempt("J1", 2, None, "builtins.ValueError", "bad", "Traceback …", T1, None)]),
    Case("job_attempts", ("J9",), [[]], []),
    Case("purge_attempts", (T0, 100), [Count(4)], 4),
    Case("deck_snapshot", (FULL_REQUEST,), [[snapshot_row(SNAPSHOT_NATIVE, FULL_REQUEST)]], check=_full_snapshot),
    Case("deck_snapshot", (BARE_REQUEST,), [Sets([None, [snapshot_row(SNAPSHOT_NATIVE, BARE_REQUEST)]])],
         check=_bare_snapshot),
    Case("deck_snapshot", (FULL_REQUEST,), [[snapshot_row(EMPTY_NATIVE, FULL_REQUEST)]], check=_empty_snapshot),
]


READS = reads_for(sql.DIALECT)  # the Deck's reads over this dialect
FUNCTIONS = (*DIALECT_FUNCTIONS, *READ_FUNCTIONS)


def _function(name: str) -> Any:
    return getattr(READS if name in READ_FUNCTIONS else sql.DIALECT, name)


def _run(case: Case) -> tuple[Any, Recorder]:
    cursor = Recorder(case.script)
    return _function(case.function)(cursor, *case.args), cursor


def test_every_protocol_function_has_a_render_case() -> None:
    assert set(FUNCTIONS) <= {case.function for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.function)
def test_every_function_runs_and_returns_what_the_protocol_says(case: Case) -> None:
    result, cursor = _run(case)

    if case.check is not None:
        assert case.check(result), result
    else:
        assert result == case.expected
    hint = typing.get_type_hints(_function(case.function))["return"]
    origin = typing.get_origin(hint)
    if origin is list:
        assert isinstance(result, list)
    elif hint in (bool, int, type(None), SummaryStats):
        assert type(result) is hint or (hint is SummaryStats and isinstance(result, SummaryStats))
    if case.script:
        assert cursor.calls, "a call with work to do must reach the database"


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.function)
def test_every_statement_passes_the_checker_and_mssql_django_formats_it(case: Case) -> None:
    """The checker finds nothing; through mssql-django's own wrapper: ``?`` per parameter, GROUP BY batches
    rewritten with DECLAREs."""
    _, cursor = _run(case)
    assert len(cursor.driver.executed) == len(cursor.calls)
    for (text, params), (sent, sent_params) in zip(cursor.calls, cursor.driver.executed, strict=True):
        assert check_statement(text, params) == [], text
        assert "%s" not in sent
        assert sent.count("?") == len(sent_params), sent
        if "GROUP BY" in text and params:
            assert sent.startswith("DECLARE @var"), "the wrapper declares GROUP BY parameters as variables"
        else:
            assert len(sent_params) == len(params)


def run_alone_by_storage() -> set[str]:
    """The dialect functions ``storage`` runs without a transaction of their own on SQL Server: those it calls
    ``ALONE``, ``READ`` or on the ``HOT_PATH`` / ``HOT_READ`` (moves run alone only where the dialect moves in one
    statement)."""
    import ast

    from chokaq_core import storage

    assert not sql.DIALECT.MOVES_IN_ONE_STATEMENT and not sql.DIALECT.ENQUEUE_IN_ONE_STATEMENT
    found = set()
    for node in ast.walk(ast.parse(inspect.getsource(storage))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("call", "_purge_batches")
                and len(node.args) > 1 and isinstance(node.args[0], ast.Name)
                and node.args[0].id in ("ALONE", "READ", "HOT_PATH", "HOT_READ") and isinstance(node.args[1], ast.Attribute)):
            found.add(node.args[1].attr)
    return found


def test_functions_storage_runs_alone_change_one_table_at_most() -> None:
    alone = run_alone_by_storage()
    assert {"get_hot", "keep_alive", "deck_snapshot", "purge_workers"} <= alone <= set(FUNCTIONS)
    assert "fetch_batch" not in alone, "the claim's capped-queue locks must last until it commits"
    for function, texts in _texts(alone).items():
        for text in texts:
            statements = [s for s in _strip_literals(text).split(";") if s.strip()]
            changing = [s for s in statements if DML.match(s) and re.search(r"\bchokaq_\w+", s)]
            assert len(changing) <= 1, function


COMPLETIONS = ("archive_succeeded", "move_to_dlq", "cancel_batch", "archive_zombies")
RETENTION = ("purge_workers", "purge_metric_buckets", "purge_history", "purge_attempts")
CLAIMS = (Case("fetch_batch", ("w1", 10, None), [[]]), Case("fetch_batch", ("w1", 10, ["mail"]), [[]]))
# (functions, which of their statements (a prefix; "" = all), what each must match, why): SQL Server's forms.
SHAPES: list[tuple[Sequence[str], str, str, str]] = [
    *((COMPLETIONS, "", pattern, "a move: delete into @Moved, insert, counters, buckets") for pattern in (
        r"^SET NOCOUNT ON;", r"DELETE h\s+OUTPUT deleted\.id, deleted\.queue", r"INTO @Moved \(",
        r"INSERT INTO chokaq_jobs_(archive|dlq) \(.*\)\s+SELECT .* FROM @Moved;",
        r"MERGE chokaq_stats_summary WITH \(HOLDLOCK\) AS t", r"MERGE chokaq_metric_buckets WITH \(HOLDLOCK\) AS t",
        r"SET NOCOUNT OFF;\nSELECT id, queue FROM @Moved;$",
        r"sum\(coalesce\(duration_ms, 0\)\), nullif\(max\(coalesce\(duration_ms, -1\)\), -1\)")),  # no NULL aggregated
    (("mark_processing", "mark_processing_batch"), "", r"^(WITH clock\(now\) AS \(SELECT CAST\(%s AS datetimeoffset\(7\)\)\) )?UPDATE chokaq_jobs_hot WITH \(ROWLOCK\) SET status = 2, .*"
     r" OUTPUT inserted\.id, inserted\.attempt_count WHERE id IN \(SELECT i\.id FROM OPENJSON\(%s\)", "the lease"),
    (("record_attempts",), "", r"started_at datetimeoffset\(7\) '\$\.started_at'", "a start read with its offset"),
    *((("recover_abandoned", *RETENTION), "", pattern, "one statement the driver counts, skipping locked rows")
      for pattern in (r"^SET NOCOUNT OFF; (UPDATE|WITH) ", r"chokaq_\w+ WITH \(ROWLOCK, READPAST\)")),
    (RETENTION, "", r"WITH b AS \(SELECT .* ORDER BY (\w+) OFFSET 0 ROWS FETCH NEXT %s ROWS ONLY\) DELETE FROM b$",
     "the oldest rows first, deleted through the CTE (no row-value IN on SQL Server)"),
    (("recover_abandoned",), "", r"last_updated_at < DATEADD\(SECOND, -CAST\(%s AS int\), DATEADD\(MILLISECOND, -CAST"
     r"\(%s AS int\), SYSUTCDATETIME\(\)\)\)$", "Fetched rows older than the timeout: a computed cutoff"),
    (("top_errors",), "", r"FROM chokaq_jobs_dlq WITH \(NOLOCK\) ORDER BY failed_at DESC OFFSET 0 ROWS FETCH NEXT"
     r" %s ROWS ONLY\) AS r\) AS g", "the newest rows, then their groups"),
    *((("resurrect", "resurrect_batch"), "", pattern, "DLQ → Hot") for pattern in (
        r"FROM chokaq_jobs_dlq AS h WITH \(ROWLOCK\)", "INSERT INTO chokaq_jobs_hot")),
    *((("purge_dlq_ids", "purge_archive_ids", "purge_dlq_older_than", "purge_archive"), "", pattern, "a skip-locked batch")
      for pattern in (r"WITH \(UPDLOCK, READPAST, ROWLOCK\)", r"FETCH NEXT %s ROWS ONLY\)",
                      r"INTO @Moved \(id, queue\)", r"UPDATE chokaq_stats_summary SET (failed|purged)_total = ")),
    *((("purge_dlq_by_filter", "resurrect_dlq_by_filter"), "SELECT id FROM chokaq_jobs_dlq", pattern, "the pick")
      for pattern in (r"FROM chokaq_jobs_dlq WITH \(UPDLOCK, READPAST, ROWLOCK\)", "ORDER BY failed_at DESC, id ASC")),
    *((("fetch_batch",), "", pattern, "the claim locks, skips and ranks") for pattern in (
        r"FROM chokaq_jobs_hot AS h WITH \(UPDLOCK, READPAST, ROWLOCK\)", r"row_number\(\) OVER \(PARTITION BY w\.queue",
        r"cur \+ rnk <= max_workers", r"picked AS \(SELECT TOP \(@Limit\) id", r"OUTPUT inserted\.id, inserted\.queue",
        r"h\.status = 0",  # the literal predicate lets the filtered indexes hot_fetch_due / hot_fetch_scheduled serve
        r"(?s)FROM chokaq_queues AS c WITH \(UPDLOCK, ROWLOCK\)\nWHERE c\.max_workers IS NOT NULL.*WITH win AS")),
    *((("enqueue",), "", pattern, "queue rows under key-range locks") for pattern in (
        r"FROM chokaq_queues AS q WITH \(UPDLOCK, HOLDLOCK\) WHERE q\.name = n\.queue",
        r"FROM chokaq_stats_summary AS s WITH \(UPDLOCK, HOLDLOCK\) WHERE s\.queue = n\.queue")),
]
# (functions, what none of their statements may contain, why)
NEVER: list[tuple[Sequence[str], str, str]] = [
    ([c.function for c in CASES if c.function.startswith(("purge_", "resurrect")) and c.function != "purge_metric_buckets"],
     "METRIC_BUCKETS", "purges and resurrection never touch buckets"),
    (FUNCTIONS, "BEGIN TRAN", "storage owns the transaction"),
    (("resurrect", "resurrect_batch"), "METRIC_BUCKETS", "resurrection never changes buckets"),
]


def test_bulk_matching_batches_are_keyset_pages_newest_id_first() -> None:
    _, cursor = _run(Case("matching_ids", ("hot", JobFilter(queue="mail"), "J8", "J9", 500), [[]]))
    [(text, params)] = cursor.calls
    assert text.startswith("SELECT id FROM chokaq_jobs_hot WHERE queue = %s AND id < %s ORDER BY id DESC")
    assert text.endswith("OFFSET 0 ROWS FETCH NEXT %s ROWS ONLY") and params == ["mail", "J8", 500]
    _, cursor = _run(Case("matching_ids", ("dlq", JobFilter(), None, "J9", 500), [[]]))
    [(text, params)] = cursor.calls
    assert text.startswith("SELECT id FROM chokaq_jobs_dlq WITH (UPDLOCK, READPAST, ROWLOCK) WHERE id <= %s ORDER BY "
                           "id DESC") and params == ["J9", 500], "a DLQ batch skips rows another transaction holds"


def _texts(functions: Sequence[str], prefix: str = "") -> dict[str, list[str]]:
    """The statements each function sends (those starting with ``prefix``) over its render cases."""
    texts: dict[str, list[str]] = {}
    for case in [*CASES, *CLAIMS]:
        if case.function in functions:
            texts.setdefault(case.function, []).extend(t for t, _ in _run(case)[1].calls if t.startswith(prefix))
    return texts


@pytest.mark.parametrize(("functions", "prefix", "pattern", "why"), SHAPES, ids=lambda v: str(v)[:40])
def test_statements_have_the_sql_server_shape(functions: Sequence[str], prefix: str, pattern: str, why: str) -> None:
    texts = _texts(functions, prefix)
    assert set(texts) == set(functions) and all(texts.values()), f"a function of {functions} sends no such statement"
    assert all(re.search(pattern, text) for group in texts.values() for text in group), why


@pytest.mark.parametrize(("functions", "fragment", "why"), NEVER, ids=lambda v: str(v)[:40])
def test_statements_never_contain(functions: Sequence[str], fragment: str, why: str) -> None:
    assert not any(fragment in text.upper() for group in _texts(functions).values() for text in group), why


def test_the_claim_sends_worker_window_and_limit() -> None:
    for case in CLAIMS:
        [(_, params)] = _run(case)[1].calls
        assert params[:3] == ["w1", 100, 10], "worker, scan window (10 x limit), limit"


def test_dashboard_reads_are_dirty_and_correctness_reads_are_not() -> None:
    dirty_parts = (sql.SUMMARY_STATS_SQL, sql.QUEUE_STATS_SELECT, sql.THROUGHPUT_SELECT, sql.QUEUE_HEALTH_SELECT,
                   sql.DIALECT.TOP_ERRORS_SQL)
    for function, text in ((f, t) for f, texts in _texts(FUNCTIONS).items() for t in texts):
        tables = len(re.findall(r"\bchokaq_\w+", text))
        if function in ("summary_stats", "queue_stats", "throughput", "queue_health", "top_errors"):
            assert text.count("WITH (NOLOCK)") == tables, function
        elif function == "deck_snapshot":  # each part keeps its read's hints: dirty telemetry, committed rest
            assert text.count("WITH (NOLOCK)") == sum(len(re.findall(r"\bchokaq_\w+", p)) for p in dirty_parts)
        else:
            assert "NOLOCK" not in text, function


def test_deck_snapshot_is_one_statement_whose_parts_equal_the_separate_reads() -> None:
    snap, cursor = _run(Case("deck_snapshot", (FULL_REQUEST,), [[snapshot_row(SNAPSHOT_NATIVE, FULL_REQUEST)]]))

    assert len(cursor.calls) == 1 and len(cursor.driver.executed) == 1, "ONE statement, one round trip"
    [(text, params)] = cursor.calls
    assert text == READS.snapshot(FULL_REQUEST)[0]
    assert params == [50, *['[{"id":"J1"},{"id":"J2"},{"id":"J3"}]'] * 3, True, "2026-03-01T11:55:00.000000+00:00",
                      True, True, True, True, True, base.EMPTY_ERROR, base.TOP_ERRORS_SAMPLE, 5]
    assert isinstance(snap, DeckSnapshot)
    for name, (function, args) in SNAPSHOT_PARTS.items():
        alone, _ = _run(Case(function, args, [SNAPSHOT_NATIVE[function]]))
        assert getattr(snap, name) == alone, name
    assert snap.located == {"J1": JobStatus.PROCESSING, "J2": JobStatus.SUCCEEDED, "J3": JobStatus.CANCELLED}
    assert snap.throughput == [MetricPoint(T0, 3, 1), MetricPoint(T1, 0, 2)]
    assert snap.queue_lags is not None and snap.queue_lags[1] == QueueLag("mail", 2, 1.5, 2.25)
    assert snap.errors is not None and snap.errors[0] == ErrorGroup(FailureReason.FATAL_ERROR, "", 3, T1,
                                                                    "builtins.ValueError", "boom")
    assert snap.queue_states is not None and [type(q.is_paused) for q in snap.queue_states] == [bool, bool]
    assert snap.workers is not None and [w.is_running for w in snap.workers] == [True, False]
    assert snap.workers[0].runtime_json == '{"x": "1/2"}', "nested JSON text stays text"
    stamps = [snap.summary.last_activity_at, *(p.at for p in snap.throughput),
              *(t for r in snap.active for t in (r.created_at, r.scheduled_at, r.started_at)),
              *(s.last_activity_at for s in snap.queue_stats or []),
              *(t for w in snap.workers for t in (w.started_at, w.last_heartbeat_at, w.stopped_at)),
              *(e.latest_at for e in snap.errors)]
    assert T1 in stamps, "7 fractional digits read back to the microsecond"
    assert all(t.tzinfo is not None and t.utcoffset() == timedelta(0) for t in stamps if t is not None)


def test_deck_snapshot_reuses_each_read_and_skips_what_is_not_asked() -> None:
    snap, cursor = _run(Case("deck_snapshot", (SnapshotRequest(active_limit=10, errors_limit=-1),),
                             [[snapshot_row(SNAPSHOT_NATIVE, BARE_REQUEST)]]))
    assert _bare_snapshot(snap)
    [(text, params)] = cursor.calls
    assert params == [10, False, "1970-01-01T00:00:00.000000+00:00", False, False, False, False, False,
                      base.EMPTY_ERROR, base.TOP_ERRORS_SAMPLE, 1]
    assert "OPENJSON" not in text and "WHERE id IN (NULL)" in text, "no ids: nothing to locate, no JSON to read"

    *_, select = [s.strip() for s in text.split(";") if s.strip()]
    assert text.count("SELECT") == select.count("SELECT") and select.startswith("SELECT ("), "one SELECT statement"
    assert select.count("FOR JSON PATH, INCLUDE_NULL_VALUES)") == 9
    for guard, parts in (("%s = 1", 6),):  # throughput, queue states/stats/lags, workers, errors: each by its flag
        assert select.count(f"CASE WHEN {guard} THEN (SELECT ") == parts, guard
    # The parts are the separate reads' own statements (their ORDER BY re-applied outside the derived table).
    dialect = sql.DIALECT
    for alone, part in ((dialect.SUMMARY_STATS_SQL, sql.SUMMARY_STATS_SQL),
                        (dialect.THROUGHPUT_SQL, sql.THROUGHPUT_SELECT),
                        (dialect.QUEUE_STATES_SQL, dialect.QUEUE_STATES_SELECT),
                        (dialect.QUEUE_STATS_SQL, sql.QUEUE_STATS_SELECT),
                        (dialect.QUEUE_HEALTH_SQL, sql.QUEUE_HEALTH_SELECT),
                        (dialect.LIST_WORKERS_SQL, dialect.LIST_WORKERS_SELECT)):
        assert part in alone
    for part in (sql.SUMMARY_STATS_SQL, dialect.active_sql(), base.locate_statement("IN (NULL)"),
                 sql.THROUGHPUT_SELECT, dialect.QUEUE_STATES_SELECT, sql.QUEUE_STATS_SELECT,
                 sql.QUEUE_HEALTH_SELECT, dialect.LIST_WORKERS_SELECT, dialect.TOP_ERRORS_SQL):
        assert f"FROM ({part}) AS t(c0, " in select
    assert json_rows(for_json([(T1, True, None)]), datetime_at=[0]) == [[T1, True, None]], "the fake's FOR JSON"


def test_enqueue_sends_the_first_job_of_each_key_and_split_delays() -> None:
    [(_, params)] = _run(CASES[0])[1].calls
    sent = json.loads(params[0])
    assert [item["id"] for item in sent] == ["A", "C", "D"], "the first job of a repeated key stands for the others"
    assert (sent[2]["delay_s"], sent[2]["delay_ms"]) == (1, 500)
    assert sent[0]["delay_s"] is None


def _duplicate_key_error(index: str, number: str = "2601") -> DriverError:
    return DriverError("23000", f"[23000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Cannot insert duplicate "
                                f"key row in object 'dbo.chokaq_jobs_hot' with unique index '{index}'. ({number})")


RACE = _duplicate_key_error(sql.IDEMPOTENCY_INDEX)
# (jobs, the driver's results pass by pass, the stored ids or the error raised, statements sent)
ENQUEUE_PASSES: list[tuple[list[NewJob], list[Any], Any, int]] = [
    ([new_job("A", "k1"), new_job("B")], [RACE, [("B", None), ("WINNER", "k1")]], ["WINNER", "B"], 2),  # lost a race
    ([new_job("A")], [_duplicate_key_error("PK__chokaq_j__3213E83F", "2627")], DriverError, 1),  # a duplicate job id
    ([new_job("A", "k1")], [RACE] * base.ENQUEUE_PASSES, DriverError, base.ENQUEUE_PASSES),  # a race never resolved
    ([new_job("A", "k1")], [[], [("A", None), ("A", "k1")]], ["A"], 2),  # the key's holder left meanwhile: insert
]


@pytest.mark.parametrize(("jobs", "script", "outcome", "calls"), ENQUEUE_PASSES)
def test_enqueue_passes(jobs: list[NewJob], script: list[Any], outcome: Any, calls: int) -> None:
    cursor = Recorder(script)
    if outcome is DriverError:
        with pytest.raises(DriverError):
            sql.DIALECT.enqueue(cursor, jobs)
    else:
        assert sql.DIALECT.enqueue(cursor, jobs) == outcome
    assert len(cursor.calls) == calls


def test_datetime_parameters_are_naive_utc_and_delays_split_for_dateadd() -> None:
    cutoff = datetime(2026, 3, 1, 14, 0, 0, 250, tzinfo=UTC).astimezone(timezone(timedelta(hours=2)))
    _, cursor = _run(Case("purge_archive", (cutoff, 10), [[]]))
    assert cursor.calls[0][1][0] == "2026-03-01T14:00:00.000250+00:00", "exact, whatever the driver does with datetimes"
    _, cursor = _run(Case("recover_abandoned", (90.25,), [Count(0)]))
    assert cursor.calls[0][1] == [90, 250]
    _, cursor = _run(Case("reschedule_for_retry", (None, [Retry("J1", 1, -1.5)]), [[]]))
    item = json.loads(cursor.calls[0][1][0])[0]
    assert (item["delay_s"], item["delay_ms"]) == (-2, 500), "DATEADD(SECOND, -2) + 500 ms = -1.5 s"


def test_moves_carry_the_error_class_and_message_and_reschedules_the_last_error_and_hold() -> None:
    _, cursor = _run(Case("move_to_dlq", ("w1", [Failure("J1", FailureReason.MAX_RETRIES_EXCEEDED, "tb", 3,
                                                         ATTEMPT_ERROR), Failure("J2", FailureReason.FATAL_ERROR,
                                                                                 "no exception")]), [[]]))
    [(text, params)] = cursor.calls
    assert "error_class nvarchar(255) '$.error_class', error_message nvarchar(1000) '$.error_message'" in text
    assert re.search(r"OUTPUT deleted\.id, .*a\.error_class, a\.error_message, deleted\.rate_key\s+INTO @Moved", text)
    items = json.loads(params[0])
    assert [(i["error_class"], i["error_message"]) for i in items] == [
        ("builtins.ConnectionError", "it's 50% down"), (None, None)]
    for function in ("cancel_batch", "archive_zombies"):
        batch = _texts([function])[function][0]
        assert re.search(r"OUTPUT deleted\.id, .*NULL, NULL, deleted\.rate_key\s+INTO @Moved", batch), (
            "no exception: NULL class; the rate key carried")

    _, cursor = _run(Case("reschedule_for_retry", ("w1", [Retry("J1", 2, 30.0, ATTEMPT_ERROR),
                                                          Retry("J2", 0, 5.0, held_by="t.v1")]), [[]]))
    [(text, params)] = cursor.calls
    assert "last_error_class = coalesce(a.error_class, h.last_error_class)" in text
    assert "last_error_at = CASE WHEN a.error_class IS NULL THEN h.last_error_at ELSE @Now END" in text
    assert "held_by = a.held_by" in text and "held_by nvarchar(255) '$.held_by'" in text
    items = json.loads(params[0])
    assert [(i["error_class"], i["error_message"], i["held_by"]) for i in items] == [
        ("builtins.ConnectionError", "it's 50% down", None), (None, None, "t.v1")]


def test_the_pending_split_and_top_errors_read_the_new_columns() -> None:
    assert "CASE WHEN scheduled_at > SYSUTCDATETIME() THEN 1 ELSE 0 END AS later" in sql.SUMMARY_STATS_SQL
    # the scheduled Pending rows only: the literal predicate lets the filtered index hot_pending_split serve
    assert "FROM chokaq_jobs_hot WITH (NOLOCK) WHERE status = 0 AND scheduled_at IS NOT NULL) AS p" in sql.SUMMARY_STATS_SQL
    assert "coalesce(h.pending, 0) - pend.waiting" in sql.SUMMARY_STATS_SQL  # ready: the rest of the Pending rows
    assert "GROUP BY g.failure_reason, g.error_class, g.error_message, g.prefix" in sql.DIALECT.TOP_ERRORS_SQL
    _, cursor = _run(Case("list_dlq", (JobFilter(failure_reason=FailureReason.TRANSIENT, error_class="a.B",
                                                 error_message=""), None, 10, HistorySort()), [[]]))
    [(text, params)] = cursor.calls
    assert "failure_reason = %s AND error_class = %s AND error_message = %s" in text
    assert params[:3] == [int(FailureReason.TRANSIENT), "a.B", ""]
    assert "RIGHT(error_details, 400) AS error_head".lower() in text.lower()


# ---------------------------------------------------------------- migrations through mssql-django


@pytest.fixture(scope="module")
def mssql_connection() -> Iterator[Any]:
    """A mssql-django connection object that never connects (the server version is pinned)."""
    from django.db import connections
    from django.db.utils import ConnectionHandler

    mssql_base()
    configured = ConnectionHandler({
        "default": {"ENGINE": "django.db.backends.dummy"},
        RENDER_ALIAS: {"ENGINE": "mssql", "NAME": "chokaq", "HOST": "127.0.0.1", "PORT": "1433", "USER": "sa",
                       "PASSWORD": "x", "OPTIONS": {"driver": "ODBC Driver 18 for SQL Server"}},
    }).settings[RENDER_ALIAS]
    connections.settings[RENDER_ALIAS] = configured  # migrations look their alias up in django.db.connections
    connection = connections[RENDER_ALIAS]
    assert connection.vendor == "microsoft"
    known = type(connection)._known_versions  # type: ignore[attr-defined]
    known[RENDER_ALIAS] = 2022
    try:
        yield connection
    finally:
        known.pop(RENDER_ALIAS, None)
        del connections[RENDER_ALIAS]
        connections.settings.pop(RENDER_ALIAS, None)


def _migration(name: str) -> tuple[Any, Any]:
    """Migration ``name`` of chokaq_core and the project state it starts from."""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(None, ignore_no_migrations=True)
    key = ("chokaq_core", name)
    return loader.graph.nodes[key], loader.project_state(key, at_end=False)


def collect_sql(connection: Any, name: str) -> list[str]:
    """What ``manage.py sqlmigrate chokaq_core <name>`` prints, rendered without a server."""
    migration, state = _migration(name)
    with connection.schema_editor(collect_sql=True, atomic=False) as editor:
        migration.apply(state, editor, collect_sql=True)
    return [s for s in editor.collected_sql if not s.startswith("--")]


# What ``sqlmigrate`` prints on SQL Server: (migration, a pattern exactly one of its statements matches whole).
MIGRATION_STATEMENTS: list[tuple[str, str]] = [
    *(("0001_initial", rf"CREATE {kind}INDEX \[{index}\] ON \[chokaq_jobs_hot\] {on} WHERE {where};") for kind, index, on, where in (
        ("", "hot_fetch_pending", r"\(\[queue\], \[priority\] DESC, \[scheduled_at\], \[created_at\]\) INCLUDE \(\[type\]\)",
         r"\[status\] = 0"),
        ("UNIQUE ", "hot_idempotency", r"\(\[idempotency_key\]\)", r"\[idempotency_key\] IS NOT NULL"),
        ("", "hot_fetched_recovery", ".*", r"\[status\] = 1"), ("", "hot_processing_heartbeat", ".*", r"\[status\] = 2"),
        ("", "hot_pending_lag", ".*", r"\[status\] = 0"))),
    ("0010_history", r"CREATE TABLE \[chokaq_history_buckets\] .*"
     r"PRIMARY KEY \(\[granularity\], \[bucket_start\], \[queue\], \[type\], \[outcome\]\).*"),
    ("0010_history", r"CREATE TABLE \[chokaq_history_buckets\] .*" + ", ".join(rf"\[b{i:02d}\] bigint[^,]*" for i in range(20))
     + ".*"),
    ("0010_history", r"ALTER TABLE \[chokaq_history_buckets\] REBUILD WITH \(DATA_COMPRESSION = PAGE\);"),
    *(("0010_history", rf"ALTER TABLE \[chokaq_s\w+\] ADD \[{column}\] .*")
      for column in ("purged_total", "enabled", "last_job_id", "last_run_at")),
    *(("0012_error_columns", rf"ALTER TABLE \[{table}\] ADD \[{column}\] {re.escape(declaration)};") for table, column, declaration in (
        ("chokaq_jobs_hot", "last_error_class", "nvarchar(255) NULL"),
        ("chokaq_jobs_hot", "last_error_message", "nvarchar(1000) NULL"),
        ("chokaq_jobs_hot", "last_error_at", "datetimeoffset NULL"), ("chokaq_jobs_hot", "held_by", "nvarchar(255) NULL"),
        ("chokaq_jobs_dlq", "error_class", "nvarchar(255) NULL"),
        ("chokaq_jobs_dlq", "error_message", "nvarchar(1000) NULL"))),
    ("0012_error_columns", r"CREATE INDEX \[hot_pending_split\] ON \[chokaq_jobs_hot\]"  # Pending rows only
     r" \(\[status\], \[scheduled_at\], \[last_error_at\], \[held_by\]\) WHERE \[status\] = 0;"),
    ("0012_error_columns", r"CREATE INDEX \[dlq_by_error\] ON \[chokaq_jobs_dlq\]"
     r" \(\[failure_reason\], \[error_class\], \[failed_at\] DESC\);"),
    ("0013_dlq_rate_key", r"ALTER TABLE \[chokaq_jobs_dlq\] ADD \[rate_key\] nvarchar\(255\) NULL;"),
    *(("0014_leaner_hot_indexes", rf"DROP INDEX \[{index}\] ON \[chokaq_jobs_hot\];")
      for index in ("hot_tags", "hot_processing_worker")),
    ("0014_leaner_hot_indexes", r"CREATE INDEX \[hot_cancel_requests\] ON \[chokaq_jobs_hot\] \(\[worker_id\]\)"
     r" WHERE \(\[cancel_requested_by\] IS NOT NULL AND \[status\] = 2\);"),
    *(("0015_scheduled_pending_indexes", rf"DROP INDEX \[{index}\] ON \[chokaq_jobs_hot\];")
      for index in ("hot_pending_lag", "hot_pending_split")),
    *(("0015_scheduled_pending_indexes", rf"CREATE INDEX \[{index}\] ON \[chokaq_jobs_hot\] {on}"  # scheduled rows only
       r" WHERE \(\[scheduled_at\] IS NOT NULL AND \[status\] = 0\);") for index, on in (
        ("hot_pending_lag", r"\(\[queue\], \[scheduled_at\], \[created_at\]\)"),
        ("hot_pending_split", r"\(\[status\], \[scheduled_at\], \[last_error_at\], \[held_by\]\)"))),
    *(("0016_due_pending_index", rf"CREATE INDEX \[{index}\] ON \[chokaq_jobs_hot\] {on} INCLUDE \(\[type\]\)"
       rf" WHERE \(\[scheduled_at\] IS {which} AND \[status\] = 0\);") for index, on, which in (
        ("hot_fetch_due", r"\(\[queue\], \[priority\] DESC, \[created_at\]\)", "NULL"),
        ("hot_fetch_scheduled", r"\(\[queue\], \[priority\] DESC, \[scheduled_at\], \[created_at\]\)", "NOT NULL"))),
    ("0016_due_pending_index", r"DROP INDEX \[hot_fetch_pending\] ON \[chokaq_jobs_hot\];"),
    *(("0017_claim_indexes_by_id", rf"CREATE INDEX \[{index}\] ON \[chokaq_jobs_hot\] {on} INCLUDE \(\[type\]\)"
       rf" WHERE \(\[scheduled_at\] IS {which} AND \[status\] = 0\);") for index, on, which in (
        ("hot_fetch_due", r"\(\[queue\], \[priority\] DESC, \[created_at\], \[id\]\)", "NULL"),
        ("hot_fetch_scheduled", r"\(\[queue\], \[priority\] DESC, \[scheduled_at\], \[id\]\)", "NOT NULL"))),
    *(("0017_claim_indexes_by_id", rf"DROP INDEX \[{index}\] ON \[chokaq_jobs_hot\];")
      for index in ("hot_fetch_due", "hot_fetch_scheduled")),
    ("0019_buckets_recent_keys_only", r"DROP INDEX \[buckets_recent\] ON \[chokaq_metric_buckets\];"),
    ("0019_buckets_recent_keys_only", r"CREATE INDEX \[buckets_recent\] ON \[chokaq_metric_buckets\] \(\[bucket_start\] DESC\);"),
]


def test_the_postgresql_only_claim_index_renders_nothing_on_sql_server(mssql_connection: Any) -> None:
    """0018's index serves PostgreSQL's claim alone: SQL Server gets no statement."""
    assert collect_sql(mssql_connection, "0018_claim_index_of_all_queues") == []


def test_the_pattern_ops_twin_is_postgresql_only(mssql_connection: Any) -> None:
    """SQL Server has no ``_like`` index to drop: 0014 renders only its Hot index changes there."""
    assert len(collect_sql(mssql_connection, "0014_leaner_hot_indexes")) == 3


@pytest.mark.parametrize(("migration", "pattern"), MIGRATION_STATEMENTS, ids=lambda v: v[:40])
def test_migrations_render_their_sql_server_forms(mssql_connection: Any, migration: str, pattern: str) -> None:
    assert sum(bool(re.fullmatch(pattern, s)) for s in collect_sql(mssql_connection, migration)) == 1


def test_moved_table_variables_use_the_column_types_mssql_django_creates(mssql_connection: Any) -> None:
    """Each ``@Moved`` column has its table column's type (0001 creates them; the NULL columns later migrations
    add are compared whole)."""
    created: dict[str, str] = {}
    for statement in collect_sql(mssql_connection, "0001_initial"):
        if statement.startswith("CREATE TABLE [chokaq_jobs_"):
            for column, column_type in re.findall(r"\[(\w+)\] ([\w()]+)", statement):
                created.setdefault(column, column_type)
    added = {column: declaration for name in ("0012_error_columns", "0013_dlq_rate_key")
             for column, declaration in re.findall(r"ADD \[(\w+)\] (.*);", "\n".join(collect_sql(mssql_connection, name)))}
    synonyms = {"double precision": "float", "double": "float"}
    for column, declaration in sql._MOVED_TYPES.items():
        if column in added:
            assert declaration == added[column], column
        elif column in created:  # else a column another migration adds (e.g. the archive result)
            assert declaration.split()[0] == synonyms.get(created[column], created[column]), column
    assert {"error_class", "error_message", "rate_key"} <= set(added), "the columns 0012 and 0013 add to the DLQ"
    assert "rate_key" in sql.DIALECT.RESURRECT_SQL.split("INSERT INTO chokaq_jobs_hot")[1], "a resurrected job keeps it"


def test_0003_page_compresses_on_sql_server(mssql_connection: Any) -> None:
    statements = collect_sql(mssql_connection, "0003_sqlserver_storage")
    for table in ("chokaq_jobs_hot", "chokaq_jobs_archive", "chokaq_jobs_dlq", "chokaq_metric_buckets"):
        assert f"ALTER TABLE [{table}] REBUILD WITH (DATA_COMPRESSION = PAGE);" in statements
        assert f"ALTER INDEX ALL ON [{table}] REBUILD WITH (DATA_COMPRESSION = PAGE, FILLFACTOR = 80);" in statements
    assert len(statements) == 8


class _RecordingEditor:
    def __init__(self, vendor: str) -> None:
        self.connection = types.SimpleNamespace(vendor=vendor)
        self.executed: list[str] = []

    def quote_name(self, name: str) -> str:
        return f"[{name}]"

    def execute(self, sql_text: str, params: Any = None) -> None:
        self.executed.append(sql_text)


@pytest.mark.parametrize("vendor", ["sqlite", "postgresql", "microsoft"])
def test_the_vendor_operation_does_nothing_elsewhere(vendor: str) -> None:
    migration, state = _migration("0003_sqlserver_storage")
    editor = _RecordingEditor(vendor)
    for operation in migration.operations:
        assert isinstance(operation, vendor_ops.SqlServerPageCompression)
        operation.database_forwards("chokaq_core", editor, state, state)
        operation.database_backwards("chokaq_core", editor, state, state)
    if vendor == "microsoft":
        assert "ALTER TABLE [chokaq_jobs_hot] REBUILD WITH (DATA_COMPRESSION = NONE)" in editor.executed
        assert len(editor.executed) == 16
    else:
        assert editor.executed == []


def test_the_parity_test_covers_mssql() -> None:
    """Signatures and return annotations of every vendor, SQL Server's too: tests/unit/test_architecture.py."""
    assert "mssql" in importlib.import_module("tests.unit.test_architecture").VENDORS


def test_a_claim_under_rate_limits_skips_what_they_hold_inside_the_locked_read() -> None:
    cursor = Recorder([[]])
    sql.DIALECT.fetch_batch(cursor, "w1", 5, None, ClaimHold(("mail",), ("pay.v1",), (("queue", "bulk", "t1"),)))
    text, params = cursor.calls[0]
    eligible = text[text.index("WITH win AS"):text.index("active AS")]
    names = "IN (SELECT f.name FROM OPENJSON(%s) WITH (name nvarchar(4000) '$.name') AS f)"
    assert (f"AND NOT (h.queue {names} OR lower(h.type) {names} OR (h.queue = %s AND coalesce(h.rate_key, '') = %s))"
            in eligible)
    assert params == ["w1", 50, 5, '[{"name":"mail"}]', '[{"name":"pay.v1"}]', "bulk", "t1"]
    plain = Recorder([[]])
    sql.DIALECT.fetch_batch(plain, "w1", 5, None)
    assert "AND NOT (" not in plain.calls[0][0], "without a hold the claim skips nothing"


@pytest.mark.parametrize("script", [[[]], [[("type:pay.v1",)], []]], ids=["bucket-changed", "row-lost"])
def test_a_lease_spending_on_a_changed_bucket_or_a_lost_row_raises_so_the_transaction_rolls_back(
        script: list[Any]) -> None:
    spend = BucketSpend(RateBucket("type:pay.v1", "", 2.5, T0, T0, 7), RateBucket("type:pay.v1", "", 1.5, T0, T0, 8),
                        ("J1",))
    with pytest.raises(StaleBuckets):
        sql.DIALECT.lease_spending(Recorder(script), ["J1"], "w1", [spend], T0)


# ---------------------------------------------------------------- the shared rows' lock order

COUNTED_MOVES = ("archive_succeeded", "move_to_dlq", "reschedule_for_retry", "cancel_batch", "archive_zombies",
                 "resurrect", "resurrect_batch", "resurrect_dlq_by_filter", "purge_dlq_ids", "purge_dlq_by_filter",
                 "purge_archive_ids", "purge_dlq_older_than", "purge_archive")


def test_the_counter_rows_are_locked_one_by_one_smallest_queue_first() -> None:
    """SQL Server locks a row as it reads it, whatever a statement's ORDER BY: each counter row is its own
    equality seek, the queues taken from the smallest up (MIN, then the next greater), each lock held to commit."""
    lock = sql.counters_locked("@Rows")
    statements = [s.strip() for s in lock.split(";") if s.strip()]
    assert statements == [
        "DECLARE @LockQueue nvarchar(255) = (SELECT MIN(queue) FROM @Rows)",
        "DECLARE @Locked int",
        "WHILE @LockQueue IS NOT NULL\nBEGIN\n    SELECT @Locked = 1 FROM chokaq_stats_summary"
        " WITH (UPDLOCK, HOLDLOCK, ROWLOCK) WHERE queue = @LockQueue",
        "SET @LockQueue = (SELECT MIN(queue) FROM @Rows WHERE queue > @LockQueue)",
        "END"]


def test_every_move_locks_its_queues_counter_rows_in_key_order_before_it_counts() -> None:
    """Each move's batch (completions, sweeps, cancels, resurrections, purges): its rows into ``@Moved``, then the
    counter rows of their queues locked in key order, and only then the counters' MERGE or UPDATE and the buckets.
    An operator's move over several queues thus waits for a worker's completion instead of holding one of its
    counter rows (their plan-ordered UPDATE or MERGE took them in any order)."""
    lock = sql.counters_locked("@Moved")
    texts = _texts(COUNTED_MOVES)
    assert set(texts) == set(COUNTED_MOVES)
    for function, group in texts.items():
        for text in (t for t in group if "chokaq_stats_summary" in t):
            first_count = re.search(r"(?:MERGE|UPDATE) chokaq_stats_summary\b", text)
            assert first_count and text.count(lock) == 1, function
            assert text.index("INTO @Moved") < text.index(lock) < first_count.start(), function
            assert text.index(lock) < text.find("chokaq_metric_buckets") or "chokaq_metric_buckets" not in text


def test_a_completion_of_several_moves_opens_with_its_hot_rows_then_its_counter_rows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``begin_completion`` is one batch: the batch's Hot rows still this worker's (U locks to commit), then its
    queues' counter rows in key order, returning when the failed executions started. ``storage.complete`` sends it
    before the moves of a mixed batch (two completions over two queues in opposite orders took the counter rows
    move by move: a circle), and not for one move alone (its batch takes its rows in order by itself)."""
    from chokaq_core import storage

    [(text, params)] = _run(Case("begin_completion", ("w1", ["J3", "J1", "J1"], ["J3"]), [[("J3", T1)]]))[1].calls
    assert text == sql.BEGIN_COMPLETION_SQL and params == ["w1", '[{"id":"J1"},{"id":"J3"}]']
    assert re.search(r"FROM chokaq_jobs_hot AS h WITH \(UPDLOCK, ROWLOCK\)\nWHERE h\.id IN \(SELECT i\.id FROM "
                     r"OPENJSON\(%s\).*\(@WorkerId IS NULL OR h\.worker_id = @WorkerId\);", text)
    assert text.index("chokaq_jobs_hot") < text.index(sql.counters_locked("@Own")) < text.index(
        "SELECT id, started_at FROM @Own;")

    def sent(successes: list[Success], retries: list[Retry], failures: list[Failure]) -> list[str]:
        cursor = Recorder([[]] * 6)
        monkeypatch.setattr(storage, "dialect", lambda using=None: sql.DIALECT)
        monkeypatch.setattr(storage, "run", lambda operation, **kwargs: operation(cursor))
        storage.complete("w1", successes, retries, failures)
        return [text for text, _ in cursor.calls]

    mixed = sent([Success("J1", 1.0)], [], [Failure("J2", FailureReason.FATAL_ERROR, "boom")])
    assert mixed[:3] == [sql.BEGIN_COMPLETION_SQL, sql.DIALECT.ARCHIVE_SUCCEEDED_SQL, sql.DIALECT.MOVE_TO_DLQ_SQL]
    assert sql.BEGIN_COMPLETION_SQL not in sent([Success("J1", 1.0), Success("J2", 2.0)], [], [])
    failed = sent([], [], [Failure("J2", FailureReason.MAX_RETRIES_EXCEEDED, "tb", 3, ATTEMPT_ERROR)])
    assert failed[0] == sql.BEGIN_COMPLETION_SQL, "it reads when the failed execution started"
