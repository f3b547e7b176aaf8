"""Rows for list endpoints straight from the driver's cursor.

A list of 100 profiles spent more time in SQLAlchemy's per-value result
processing (building Row objects, parsing SQLite's timestamp text into
datetimes that the API then formats back into text) than in SQLite. Lists
whose columns are text, numbers and timestamps read the driver's tuples
instead: values come as the driver gives them (timestamps as text on SQLite,
datetimes on PostgreSQL and MariaDB; acceld.api.wire.timestamp takes both).
Not for columns that need SQLAlchemy's conversion (booleans on SQLite, JSON types).
The longest lists read them in batches (:func:`driver_batches`), so that their rows never
exist all at once as Python objects.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from sqlalchemy import Connection, Executable


def driver_rows(conn: Connection, statement: Executable,
                params: Mapping[str, Any] | None = None) -> list[tuple]:
    """Execute ``statement`` and return the driver's row tuples, in column order."""
    result = conn.execute(statement, params or {})
    try:
        return result.cursor.fetchall()  # type: ignore[attr-defined]
    finally:
        result.close()


# Rows per batch: a device list's is ~0.1 MB of Python objects. The API worker's RSS after
# the bench's 20 lists of 10,000 devices: 79 MB at 100, 82 at 500, 93 at 2,000.
BATCH = 100


def driver_batches(conn: Connection, statement: Executable,
                   params: Mapping[str, Any] | None = None,
                   size: int = BATCH) -> Iterator[list[tuple]]:
    """Execute ``statement`` and yield the driver's row tuples ``size`` at a time (SQLite
    reads them as they are fetched; PostgreSQL's and MariaDB's drivers hold the result
    client-side either way). Consume it inside the transaction."""
    result = conn.execute(statement, params or {})
    try:
        cursor = result.cursor  # type: ignore[attr-defined]
        while batch := cursor.fetchmany(size):
            yield batch
    finally:
        result.close()
