"""The statements the engine really sends, and their PostgreSQL plans: a recording cursor captures a dialect call's
statements and parameters on any vendor (no SQL text copied into a test), and ``explain`` shows a statement's plan
in a transaction that is rolled back."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.db import connection, transaction


class RecordingCursor:
    """Wraps a driver cursor and keeps every (sql, params) it executes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.executed: list[tuple[str, Any]] = []

    def execute(self, sql: str, params: Any = None) -> Any:
        self.executed.append((sql, params))
        return self.inner.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Rollback(Exception):
    pass


def captured[T](call: Callable[[RecordingCursor], T], *, keep: bool = False) -> tuple[T, list[tuple[str, Any]]]:
    """Run ``call`` on a recording cursor in a transaction (rolled back unless ``keep``): its result and the
    statements it sent."""
    recorder: RecordingCursor | None = None
    result: Any = None
    try:
        with transaction.atomic(), connection.cursor() as wrapper:
            recorder = RecordingCursor(wrapper.cursor)
            result = call(recorder)
            if not keep:
                raise Rollback
    except Rollback:
        pass
    assert recorder is not None
    return result, recorder.executed


def explain(sql: str, params: Sequence[Any] | Any | None) -> str:
    """``EXPLAIN`` of ``sql`` with ``params``, in a transaction that is rolled back."""
    lines: list[str] = []
    try:
        with transaction.atomic(), connection.cursor() as wrapper:
            wrapper.cursor.execute("EXPLAIN " + sql, params)
            lines = [row[0] for row in wrapper.cursor.fetchall()]
            raise Rollback
    except Rollback:
        pass
    return "\n".join(lines)
