"""Rows for list endpoints straight from the driver's cursor.

A list of 100 profiles spent more time in SQLAlchemy's per-value result
processing (building Row objects, parsing SQLite's timestamp text into
datetimes that the API then formats back into text) than in SQLite. Lists
whose columns are text, numbers and timestamps read the driver's tuples
instead: values come as the driver gives them (timestamps as text on SQLite,
datetimes on PostgreSQL and MariaDB; acceld.api.wire.timestamp takes both).
Not for columns that need SQLAlchemy's conversion (booleans on SQLite, JSON types).
"""

from __future__ import annotations

from typing import Any, Mapping

from sqlalchemy import Connection, Executable


def driver_rows(conn: Connection, statement: Executable,
                params: Mapping[str, Any] | None = None) -> list[tuple]:
    """Execute ``statement`` and return the driver's row tuples, in column order."""
    result = conn.execute(statement, params or {})
    try:
        return result.cursor.fetchall()  # type: ignore[attr-defined]
    finally:
        result.close()
