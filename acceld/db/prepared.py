"""INSERTs compiled once per database dialect, for the hottest write paths.

``conn.execute(insert(table), values)`` looks its compiled form up in
SQLAlchemy's statement cache and builds an execution context around it on
every call: about 40 us, more than SQLite takes to run the INSERT. A
``PreparedInsert`` compiles its statement once per dialect, converts the
values with the columns' own bind processors (so SQLite gets the same
timestamp text as through ``execute``) and runs it with ``exec_driver_sql``:
still inside the caller's transaction and through SQLAlchemy's connection, so
cursor events fire and driver errors arrive wrapped (``IntegrityError`` and
the rest) exactly as before.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from sqlalchemy import Connection, Table, insert
from sqlalchemy.engine import Dialect

_Processor = Callable[[Any], Any] | None


class PreparedInsert:
    """``INSERT INTO table (keys...) VALUES (...)`` for one row at a time."""

    def __init__(self, table: Table, keys: Sequence[str]) -> None:
        self.table = table
        self.keys = tuple(keys)
        self._plans: dict[tuple[str, str], tuple[str, bool, tuple[tuple[str, _Processor], ...]]] = {}

    def _plan(self, dialect: Dialect) -> tuple[str, bool, tuple[tuple[str, _Processor], ...]]:
        compiled = insert(self.table).compile(dialect=dialect, column_keys=list(self.keys))
        # Positional paramstyles (SQLite's qmark) take values in the compiled order; named
        # ones (pyformat) take a mapping by bind name, which is the column key here.
        order = tuple(compiled.positiontup) if compiled.positional else self.keys  # type: ignore[arg-type]
        plan = (compiled.string, compiled.positional, tuple(
            (key, self.table.c[key].type.dialect_impl(dialect).bind_processor(dialect))
            for key in order))
        self._plans[(dialect.name, dialect.driver)] = plan
        return plan

    def execute(self, conn: Connection, values: Mapping[str, Any]) -> None:
        """Insert one row; ``values`` must hold every key (None for NULL)."""
        dialect = conn.dialect
        plan = self._plans.get((dialect.name, dialect.driver)) or self._plan(dialect)
        sql, positional, params = plan
        converted = [(key, values[key] if proc is None else proc(values[key]))
                     for key, proc in params]
        if positional:
            conn.exec_driver_sql(sql, tuple(value for _, value in converted))
        else:
            conn.exec_driver_sql(sql, dict(converted))
