"""Vendor-only migration operations.

``DropPatternOpsTwin`` removes, on PostgreSQL only, the ``varchar_pattern_ops`` index Django adds beside a
varchar primary key (``models.JobIdField`` keeps it from coming back); elsewhere there is no such index.

``SqlServerPageCompression`` is the SQL Server storage refinement of spec 01
§2 / spec 05 §6: PAGE compression for a table and all its indexes, which are
rebuilt with ``FILLFACTOR = 80``. The indexes themselves (filtered ones
included) come from the models; this only changes how SQL Server stores them.
On any other vendor it does nothing, and it emits its statements through the
schema editor, so ``manage.py sqlmigrate`` prints them for DBAs who apply the
SQL through their own pipeline.
"""

from __future__ import annotations

from typing import Any

from django.db.migrations.operations.base import Operation

SQL_SERVER_VENDOR = "microsoft"


class DropPatternOpsTwin(Operation):
    """``DROP INDEX`` of a varchar column's ``_like`` twin on PostgreSQL only; backwards, it is created again."""

    reduces_to_sql = True
    reversible = True

    def __init__(self, model_name: str, field_name: str) -> None:
        self.model_name = model_name
        self.field_name = field_name

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (self.__class__.__qualname__, [self.model_name, self.field_name], {})

    def state_forwards(self, app_label: str, state: Any) -> None:
        """Database only: the field's state is the migration's own ``AlterField``."""

    def _twin(self, app_label: str, schema_editor: Any, state: Any) -> tuple[str, str, str] | None:
        """(table, column, index name) on PostgreSQL; None elsewhere."""
        if schema_editor.connection.vendor != "postgresql":
            return None
        model = state.apps.get_model(app_label, self.model_name)
        column = model._meta.get_field(self.field_name).column
        table = model._meta.db_table
        return table, column, schema_editor._create_index_name(table, [column], suffix="_like")

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if twin := self._twin(app_label, schema_editor, from_state):
            schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(twin[2])}", params=None)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if twin := self._twin(app_label, schema_editor, to_state):
            table, column, name = (schema_editor.quote_name(part) for part in twin)
            schema_editor.execute(f"CREATE INDEX {name} ON {table} ({column} varchar_pattern_ops)", params=None)

    def describe(self) -> str:
        return f"PostgreSQL only: drop the pattern-ops twin index of {self.model_name}.{self.field_name}"

    @property
    def migration_name_fragment(self) -> str:
        return f"drop_{self.model_name.lower()}_{self.field_name}_like"


class SqlServerPageCompression(Operation):
    """``ALTER TABLE … REBUILD`` + ``ALTER INDEX ALL … REBUILD`` with PAGE compression on SQL Server only."""

    reduces_to_sql = True
    reversible = True

    def __init__(self, model_name: str, fillfactor: int = 80) -> None:
        if not 1 <= fillfactor <= 100:
            raise ValueError("fillfactor must be between 1 and 100")
        self.model_name = model_name
        self.fillfactor = fillfactor

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (self.__class__.__qualname__, [self.model_name], {"fillfactor": self.fillfactor})

    def state_forwards(self, app_label: str, state: Any) -> None:
        """Storage options only: the model state does not change."""

    def statements(self, quote_name: Any, table: str, *, compressed: bool = True) -> list[str]:
        """The DDL for ``table``; ``compressed=False`` returns SQL Server's defaults."""
        compression = "PAGE" if compressed else "NONE"
        fillfactor = self.fillfactor if compressed else 0  # 0 = the server default (full pages)
        name = quote_name(table)
        return [
            f"ALTER TABLE {name} REBUILD WITH (DATA_COMPRESSION = {compression})",
            f"ALTER INDEX ALL ON {name} REBUILD WITH (DATA_COMPRESSION = {compression}, FILLFACTOR = {fillfactor})",
        ]

    def _apply(self, app_label: str, schema_editor: Any, state: Any, compressed: bool) -> None:
        if schema_editor.connection.vendor != SQL_SERVER_VENDOR:
            return
        model = state.apps.get_model(app_label, self.model_name)
        for sql in self.statements(schema_editor.quote_name, model._meta.db_table, compressed=compressed):
            schema_editor.execute(sql, params=None)

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        self._apply(app_label, schema_editor, to_state, compressed=True)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        self._apply(app_label, schema_editor, from_state, compressed=False)

    def describe(self) -> str:
        return f"SQL Server only: PAGE compression and FILLFACTOR {self.fillfactor} for {self.model_name}"

    @property
    def migration_name_fragment(self) -> str:
        return f"sqlserver_page_{self.model_name.lower()}"
