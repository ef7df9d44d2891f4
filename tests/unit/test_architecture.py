"""Layering rules of ARCHITECTURE.md §2, and the dialect modules' shared interface."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from chokaq_core.sql import DIALECT_FUNCTIONS, Dialect

ROOT = Path(__file__).resolve().parents[2]
VENDORS = ["sqlite", "postgresql"] + (["mssql"] if (ROOT / "chokaq_core/sql/mssql.py").exists() else [])


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def python_files(package: str) -> list[Path]:
    return [p for p in (ROOT / package).rglob("*.py") if "migrations" not in p.parts]


def test_engine_never_imports_the_deck() -> None:
    for path in python_files("chokaq_core"):
        assert not any(n == "deck" or n.startswith("deck.") for n in imports_of(path)), path


def test_only_storage_imports_sql() -> None:
    for path in python_files("chokaq_core"):
        if path.parent.name == "sql" or path.name == "storage.py":
            continue
        names = imports_of(path)
        offenders = {n for n in names if n.startswith("chokaq_core.sql")}
        if path.name == "worker.py":
            # the PostgreSQL LISTEN loop reads the channel name constant, nothing else
            offenders -= {"chokaq_core.sql.postgresql", "chokaq_core.sql.postgresql.NOTIFY_CHANNEL"}
        assert not offenders, f"{path} imports {offenders}"


def test_worker_knows_no_http_and_no_channels() -> None:
    names = imports_of(ROOT / "chokaq_core/worker.py")
    assert not any(n.startswith(("django.http", "channels")) for n in names)


def test_deck_reaches_the_engine_only_through_service_events_domain() -> None:
    allowed = ("chokaq_core.service", "chokaq_core.events", "chokaq_core.domain")
    for path in python_files("deck"):
        for name in imports_of(path):
            if name.startswith("chokaq_core"):
                assert name == "chokaq_core" or name.startswith(allowed), f"{path} imports {name}"


@pytest.mark.parametrize("vendor", VENDORS)
def test_every_vendor_defines_every_dialect_function_with_the_same_parameters(vendor: str) -> None:
    module = importlib.import_module(f"chokaq_core.sql.{vendor}")
    for name in DIALECT_FUNCTIONS:
        function = getattr(module, name, None)
        assert callable(function), f"{vendor}.{name} is missing"
        expected = list(inspect.signature(getattr(Dialect, name)).parameters)[1:]  # drop self
        assert list(inspect.signature(function).parameters) == expected, f"{vendor}.{name}"
    assert set(module.AUTOCOMMIT_SAFE) <= set(DIALECT_FUNCTIONS)


def test_sql_text_lives_only_in_sql_modules() -> None:
    keywords = ("INSERT INTO", "DELETE FROM", "UPDATE chokaq", "SELECT id FROM")
    for path in python_files("chokaq_core") + python_files("deck"):
        if path.parent.name == "sql":
            continue
        text = path.read_text()
        assert not any(k in text for k in keywords), path
