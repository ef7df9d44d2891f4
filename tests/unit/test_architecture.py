"""Layering rules of ARCHITECTURE.md §2, and the dialect modules' shared interface."""

from __future__ import annotations

import ast
import importlib
import inspect
import typing
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


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, here: str, known: set[str], is_package: bool = False) -> set[str]:
    """The modules of ``known`` that module ``here`` imports anywhere (module level, functions,
    TYPE_CHECKING): ``from package import name`` counts as the submodule ``package.name`` when there is one."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = here.split(".") if is_package else here.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != here:
                found.add(target)
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path) per strongly connected group of modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(group)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    cycles = []
    for group in groups:  # walk inside the group from its first module back to it
        start = min(group)
        path, seen = [start], {start}
        while True:
            step = next((t for t in sorted(graph[path[-1]]) if t in group and (t == start or t not in seen)), None)
            if step is None or step == start:
                break
            path.append(step)
            seen.add(step)
        cycles.append([*path, start])
    return cycles


def chokaq_import_graph() -> dict[str, set[str]]:
    paths = python_files("chokaq_core")
    known = {module_of(p) for p in paths}
    return {module_of(p): imported_modules(p.read_text(), module_of(p), known, p.name == "__init__.py")
            for p in paths}


def test_chokaq_core_has_no_import_cycles() -> None:
    graph = chokaq_import_graph()
    assert "chokaq_core.storage" in graph["chokaq_core.api"]  # the graph sees ``from chokaq_core import storage``
    assert not import_cycles(graph), "\n".join(" → ".join(c) for c in import_cycles(graph))


def test_the_cycle_check_finds_cycles_through_function_local_imports() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []
    known = {"pkg", "pkg.api", "pkg.handlers", "pkg.domain"}
    source = "from pkg.domain import X\ndef f():\n    from pkg import api\n    from . import domain, nothing\n"
    assert imported_modules(source, "pkg.handlers", known) == {"pkg.api", "pkg.domain", "pkg"}


# Function-local imports are kept only for optional dependencies and a feature's own parser (imported where the
# feature needs them: croniter and dateutil, ~0.5 MiB, only in a process whose project has schedules) and for
# Django's app-loading order (the app configuration's creation and ``ready()``, and the package's lazy public
# names so that importing ``chokaq_core`` from settings stays cheap), and for the debug-page reporters the settings name in ``redaction`` (Django's debug
# views, their template engine and tags, imported where an error report is written, not by every LOGGING set-up),
# and for the Prometheus exposition a worker loads only when it serves metrics (``--metrics-port``).
OPTIONAL_DEPENDENCIES = ("psycopg", "redis", "opentelemetry", "croniter")
APP_LOADING = {("chokaq_core/apps.py", "__init__"), ("chokaq_core/apps.py", "ready"),
               ("chokaq_core/__init__.py", "__getattr__"),
               ("chokaq_core/redaction.py", "__getattr__"), ("chokaq_core/redaction.py", "__new__"),
               ("chokaq_core/management/commands/chokaq_worker.py", "_serve_metrics")}


def test_function_local_imports_only_for_optional_dependencies_and_app_loading() -> None:
    offenders = []
    for path in python_files("chokaq_core"):
        where = str(path.relative_to(ROOT))
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                else:
                    continue
                if (where, function.name) in APP_LOADING:
                    continue
                offenders += [f"{where}:{node.lineno} {name}" for name in names
                              if name.split(".")[0] not in OPTIONAL_DEPENDENCIES]
    assert not offenders, offenders


def test_engine_never_imports_the_deck() -> None:
    for path in python_files("chokaq_core"):
        assert not any(n == "deck" or n.startswith("deck.") for n in imports_of(path)), path


def test_only_storage_imports_sql() -> None:
    for path in python_files("chokaq_core"):
        if path.parent.name == "sql" or path.name == "storage.py":
            continue
        offenders = {n for n in imports_of(path) if n.startswith("chokaq_core.sql")}
        assert not offenders, f"{path} imports {offenders}"


DRIVERS = ("psycopg", "psycopg2", "sqlite3", "pyodbc", "mssql", "redis")


def test_worker_knows_no_http_no_channels_and_no_driver() -> None:
    paths = list((ROOT / "chokaq_core/worker").glob("*.py"))
    assert paths
    for path in paths:
        names = imports_of(path)
        assert not any(n.startswith(("django.http", "channels", *DRIVERS)) for n in names), path


def test_deck_reaches_the_engine_only_through_service_events_domain_and_the_read_model() -> None:
    allowed = ("chokaq_core.service", "chokaq_core.events", "chokaq_core.domain", "chokaq_core.readmodel")
    for path in python_files("deck"):
        for name in imports_of(path):
            if name.startswith("chokaq_core"):
                assert name == "chokaq_core" or name.startswith(allowed), f"{path} imports {name}"


@pytest.mark.parametrize("vendor", VENDORS)
def test_every_vendor_defines_every_dialect_function_with_the_same_parameters(vendor: str) -> None:
    dialect = importlib.import_module(f"chokaq_core.sql.{vendor}").DIALECT
    for name in DIALECT_FUNCTIONS:
        function = getattr(dialect, name, None)
        assert callable(function), f"{vendor}.{name} is missing"
        expected = list(inspect.signature(getattr(Dialect, name)).parameters)[1:]  # drop self
        assert list(inspect.signature(function).parameters) == expected, f"{vendor}.{name}"
        assert typing.get_type_hints(function) == typing.get_type_hints(getattr(Dialect, name)), f"{vendor}.{name}"
    for capability in ("MOVES_IN_ONE_STATEMENT", "ENQUEUE_IN_ONE_STATEMENT", "PREPARES"):
        assert isinstance(getattr(dialect, capability), bool), f"{vendor}.{capability}"


def test_sql_text_lives_only_in_sql_modules() -> None:
    keywords = ("INSERT INTO", "DELETE FROM", "UPDATE chokaq", "SELECT id FROM")
    for path in python_files("chokaq_core") + python_files("deck"):
        if path.parent.name == "sql":
            continue
        text = path.read_text()
        assert not any(k in text for k in keywords), path


@pytest.mark.parametrize("vendor", ["postgresql", "sqlite", "microsoft"])
def test_a_connections_dialect_is_its_vendor_modules_and_another_vendor_is_a_configuration_error(vendor: str) -> None:
    from types import SimpleNamespace

    from django.core.exceptions import ImproperlyConfigured

    from chokaq_core.sql import dialect_for

    module = {"microsoft": "mssql"}.get(vendor, vendor)
    expected = importlib.import_module(f"chokaq_core.sql.{module}").DIALECT
    assert dialect_for(SimpleNamespace(vendor=vendor)) is expected
    assert dialect_for(SimpleNamespace(vendor=vendor)) is expected, "asked again"
    with pytest.raises(ImproperlyConfigured, match="does not support the 'mysql' database vendor"):
        dialect_for(SimpleNamespace(vendor="mysql"))
