"""Many new rows of one table at once: ``COPY ... FROM STDIN`` on PostgreSQL, executemany
elsewhere.

Why: a new node of 8 devices brings ~160 rows (128 attach handles, 22 attributes, 8
control paths), and psycopg's executemany sends each row as a prepared statement of its
own in a pipeline, ~12 us of the conductor's Python per row; a COPY streams them in one
command (128 handles: 1.6 -> 0.4 ms of CPU, measured in a transaction of their own). The
rows are what SQLAlchemy's INSERT would write: each column's Python-side default for a
key the rows lack, and each value through the column type's bind processor; the server
fills the rest (ids, server defaults). Inside the caller's transaction, as the INSERT
was; the engine's statement events fire around it, and an error goes through
SQLAlchemy's handling (wrapped as IntegrityError and the like, a lost connection
invalidated and marked by the engine's handlers).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Table, insert


def insert_rows(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    """INSERT ``rows`` (sharing their keys) into ``table`` in the caller's transaction."""
    if not rows:
        return
    if conn.dialect.name != "postgresql" or conn.dialect.driver != "psycopg":
        conn.execute(insert(table), rows)
        return
    _copy(conn, table, rows)


_FROM_ROW = object()  # the column's value is each row's own


def _copy(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    given = rows[0].keys()
    columns: list[Any] = []
    defaults: list[Any] = []
    processors: list[Any] = []
    for column in table.columns:
        default = column.default
        if column.key in given:
            defaults.append(_FROM_ROW)
        elif default is not None and (default.is_scalar or default.is_callable):
            # A callable default is wrapped by SQLAlchemy to take the execution context;
            # this module's tables only use ones that ignore it (utcnow).
            defaults.append(default.arg if default.is_scalar else default.arg(None))
        else:
            continue  # the server's: an id from its sequence, a server default, NULL
        columns.append(column)
        processors.append(column.type._cached_bind_processor(conn.dialect))
    names = [column.key for column in columns]
    statement = (f"COPY {table.name} ({', '.join(column.name for column in columns)}) "
                 "FROM STDIN")
    cursor = conn.connection.cursor()
    # The engine's statement listeners see it as they see an INSERT (the DEBUG call log,
    # tests counting statements); there is no execution context.
    conn.dispatch.before_cursor_execute(conn, cursor, statement, None, None, True)
    try:
        with cursor.copy(statement) as copy:  # type: ignore[attr-defined]
            for row in rows:
                values = []
                for name, fixed, process in zip(names, defaults, processors):
                    value = row[name] if fixed is _FROM_ROW else fixed
                    values.append(process(value) if process is not None else value)
                copy.write_row(values)
        conn.dispatch.after_cursor_execute(conn, cursor, statement, None, None, True)
    except conn.dialect.loaded_dbapi.Error as exc:
        conn._handle_dbapi_exception(exc, statement, None, cursor, None)
    finally:
        cursor.close()
