"""The database's clock: what every conductor sharing a database agrees on.

Lease expiry (and anything else several conductors compare against "now") is
judged by this clock, read in the transaction that uses it, so a conductor whose
own clock drifts can neither take a lease that is still live for the others nor
hold one past its time. Naive UTC, like every timestamp column.
"""

from __future__ import annotations

import datetime as dt
import functools

from sqlalchemy import (TIMESTAMP, BigInteger, ColumnElement, Connection, Float,
                        String, cast, func, literal, literal_column, text, type_coerce)

from acceld.db.models import Timestamp

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


def sql_now(dialect: str, plus: float | ColumnElement[int] = 0.0) -> ColumnElement[dt.datetime]:
    """The database's "now" (plus ``plus`` seconds) as an SQL expression of a timestamp column.

    For the hot paths (claims, renewals, heartbeats): the statement that compares or writes
    a lease reads the database's clock itself, so judging expiry by it costs no extra query.
    ``plus`` may be an SQL expression of whole seconds (a bound per row, e.g. from a
    column). ``dialect`` is ``conn.dialect.name`` / ``Database.backend``.
    """
    if isinstance(plus, ColumnElement):
        return _expression(dialect, plus)
    return _constant(dialect, float(plus))


@functools.lru_cache(maxsize=256)
def _constant(dialect: str, seconds: float) -> ColumnElement[dt.datetime]:
    """sql_now with a fixed offset, built once: building the expression was ~3% of a
    conductor's Python under heartbeats and registrations (the flush, every hello's
    heartbeat); an SQL expression is immutable and may serve any number of statements."""
    return _expression(dialect, seconds)


def _expression(dialect: str, plus: float | ColumnElement[int]) -> ColumnElement[dt.datetime]:
    per_row = isinstance(plus, ColumnElement)
    seconds = 0.0 if per_row else float(plus)  # type: ignore[arg-type]
    if dialect == "sqlite":
        # Stored the way SQLAlchemy stores a datetime on SQLite (six fraction digits), so
        # that text comparison with Python-written values orders them by time. 'now' is
        # one value for the whole statement.
        modifier = (cast(plus, String).concat(" seconds") if per_row
                    else literal(f"{seconds:+.6f} seconds"))
        expr = func.strftime("%Y-%m-%d %H:%M:%f", "now", modifier).op("||")(literal("000"))
    elif dialect == "postgresql":
        # statement_timestamp(): the statement's start, so one value for every row (and
        # usable as an index bound), unlike clock_timestamp(); not frozen at BEGIN like now().
        expr = cast(func.timezone("UTC", func.statement_timestamp()), TIMESTAMP()) + \
            func.make_interval(0, 0, 0, 0, 0, 0,
                               cast(plus, Float()) if per_row else literal(seconds, Float()))
    else:  # mysql, mariadb: UTC_TIMESTAMP is one value for the whole statement
        micro = (plus * 1_000_000 if per_row  # type: ignore[operator]
                 else literal(round(seconds * 1e6), BigInteger()))
        expr = func.timestampadd(literal_column("MICROSECOND"), micro, func.utc_timestamp(6))
    return type_coerce(expr, Timestamp)
