"""The database's clock: what every conductor sharing a database agrees on.

Lease expiry (and anything else several conductors compare against "now") is
judged by this clock, read in the transaction that uses it, so a conductor whose
own clock drifts can neither take a lease that is still live for the others nor
hold one past its time. Naive UTC, like every timestamp column.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Connection, text

_NOW = {
    # strftime's %f gives milliseconds; CURRENT_TIMESTAMP only whole seconds.
    "sqlite": "SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')",
    # clock_timestamp(), not now(): now() is frozen at the start of the transaction.
    "postgresql": "SELECT CAST(timezone('UTC', clock_timestamp()) AS timestamp)",
    "mysql": "SELECT UTC_TIMESTAMP(6)",
}


def db_now(conn: Connection) -> dt.datetime:
    """The database server's current time, as naive UTC."""
    name = conn.dialect.name
    value = conn.execute(text(_NOW["mysql" if name == "mariadb" else name])).scalar_one()
    if isinstance(value, str):  # SQLite
        value = dt.datetime.fromisoformat(value)
    if value.tzinfo is not None:
        value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return value
