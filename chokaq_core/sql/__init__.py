"""The dialect interface: every storage transition, one function per name (``DIALECT_FUNCTIONS``).

``chokaq_core/sql/<vendor>.py`` are the only modules with SQL text; each
holds a dialect class (a ``sql.base.BaseDialect``, which is the typed
interface ``Dialect``: every function written once over vendor hooks) and
exports its instance as ``DIALECT``; ``storage`` is their only caller. The
Deck's reads (``reads.READ_FUNCTIONS``) are written once in ``reads.Reads`` over
a dialect's hooks and reached through ``reads_for``: a worker never loads them.
Rules shared by every vendor:

* ``cursor`` is a DB-API cursor that takes ``%s`` placeholders (the inner
  cursor of a Django connection). The caller owns the transaction: each
  function runs inside ``transaction.atomic()`` opened by ``storage`` and never
  commits or rolls back itself.
* Timestamps come from the database clock on PostgreSQL and SQL Server; the
  SQLite module takes ``datetime.now(UTC)`` in Python and writes Django's text
  format (spec 01 §1.2).
* Every move between pillars deletes with its guard, inserts exactly the
  deleted rows and bumps ``chokaq_stats_summary`` / ``chokaq_metric_buckets``
  in the same transaction (spec 01 §3). Mutations report what they actually
  changed, never the requested count.
* Reads and the single-row commands are one statement on every vendor;
  the capabilities (``BaseDialect.MOVES_IN_ONE_STATEMENT`` …) say what else is, so storage may run it without
  ``BEGIN``/``COMMIT`` round trips when no transaction is open.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from chokaq_core.sql.base import DIALECT_FUNCTIONS, Cursor, Moved, json_rows
from chokaq_core.sql.base import BaseDialect as Dialect

if TYPE_CHECKING:
    from chokaq_core.sql.reads import Reads

__all__ = ["DIALECT_FUNCTIONS", "Cursor", "Dialect", "Moved", "dialect_for", "json_rows", "reads_for"]

_VENDOR_MODULES = {"postgresql": "postgresql", "sqlite": "sqlite", "microsoft": "mssql"}
_DIALECTS: dict[str, Dialect] = {}  # by vendor, once its module is imported: every transition asks, several times
_READS: dict[Dialect, Reads] = {}  # by dialect, once the read side is imported


def dialect_for(connection: Any) -> Dialect:
    """The dialect of a Django connection's vendor (its module's ``DIALECT``); any other vendor is a configuration
    error."""
    dialect = _DIALECTS.get(connection.vendor)
    if dialect is None:
        if connection.vendor not in _VENDOR_MODULES:
            raise ImproperlyConfigured(f"ChokaQ does not support the {connection.vendor!r} database vendor"
                                       " (supported: postgresql, sqlite, microsoft)")
        module = importlib.import_module(f"chokaq_core.sql.{_VENDOR_MODULES[connection.vendor]}")
        dialect = _DIALECTS.setdefault(connection.vendor, module.DIALECT)
    return dialect


def reads_for(dialect: Dialect) -> Reads:
    """The Deck's reads over ``dialect`` (``sql.reads``). Its module, and the read model it builds, are imported
    on the first read: a worker, which never reads them, does not load them."""
    reads = _READS.get(dialect)
    if reads is None:
        reads = _READS.setdefault(dialect, importlib.import_module("chokaq_core.sql.reads").Reads(dialect))
    return reads
