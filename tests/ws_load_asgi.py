"""Test-only ASGI entry point: ``config.asgi.application`` plus a log of every SQL statement this process runs.

Used by the websocket load test and ``bench/ws_load.py`` to measure the web process's own database queries
(the push budget: ≤ 2 per second with 50 Deck tabs open under load). Production code is untouched: when
``CHOKAQ_WS_QUERY_LOG`` names a file, this module wraps psycopg's ``Cursor.execute`` / ``executemany`` in this
process only, so every statement counts — the ORM's (session/user/role look-ups, the console's operator
actions) and ``chokaq_core.storage``'s, which runs on the driver-level cursor and so bypasses Django's
``execute_wrapper`` hooks — and appends ``<unix time> <first 400 chars of SQL>`` per statement.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psycopg

from config.asgi import application as _application

_LOG_PATH = os.environ.get("CHOKAQ_WS_QUERY_LOG", "")
_lock = threading.Lock()


def _record(query: Any) -> None:
    text = query.decode(errors="replace") if isinstance(query, bytes) else str(query)
    with _lock, open(_LOG_PATH, "a", encoding="utf-8") as out:
        out.write(f"{time.time():.6f} {' '.join(text.split())[:400]}\n")


def _counting(original: Any) -> Any:
    def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        _record(query)
        return original(self, query, *args, **kwargs)

    return execute


if _LOG_PATH:
    psycopg.Cursor.execute = _counting(psycopg.Cursor.execute)  # type: ignore[method-assign]
    psycopg.Cursor.executemany = _counting(psycopg.Cursor.executemany)  # type: ignore[method-assign]

application = _application
