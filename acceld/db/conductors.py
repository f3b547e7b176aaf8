"""Conductor membership: each conductor's heartbeat row, and who is live.

A conductor is live while its ``heartbeat_at`` is fresher than a bound, judged by
the database's clock (acceld.db.clock) in the statement that reads it: a
conductor whose own clock drifts neither keeps a dead peer alive nor drops a live
one. A clean stop deletes the row at once; a killed conductor's row goes stale and
is deleted by a peer once it is far past the bound (only to keep the table tidy:
a stale row counts for nothing).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import Connection, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from acceld.db.clock import sql_now
from acceld.db.engine import Database
from acceld.db.retry import retry_on_deadlock
from acceld.db.models import conductors

# A row silent for this many times the liveness bound is deleted by whoever sees it.
PRUNE_FACTOR = 10


@dataclass(frozen=True)
class Member:
    name: str
    url: str | None
    heartbeat_at: dt.datetime
    age: float  # seconds since its heartbeat, by the database's clock
    # Seconds since every heartbeat it had read was written (``heard_through``, else its
    # own heartbeat): how far the liveness sweep waits for it (acceld.conductor.fleet.liveness).
    written_ago: float = 0.0


@retry_on_deadlock
def beat(db: Database, name: str, url: str | None) -> None:
    """Record ``name``'s heartbeat now (registering it when it has no row)."""
    now = sql_now(db.backend)
    with db.write() as conn:
        if conn.execute(update(conductors).where(conductors.c.name == name).values(
                heartbeat_at=now, url=url)).rowcount:
            return
    try:
        with db.write() as conn:
            conn.execute(insert(conductors).values(name=name, url=url, started_at=now,
                                                   heartbeat_at=now))
    except IntegrityError:  # registered meanwhile (a second process of the same name)
        with db.write() as conn:
            conn.execute(update(conductors).where(conductors.c.name == name).values(
                heartbeat_at=now, url=url))


def members(db: Database) -> list[Member]:
    """Every row, with its ages by the database's clock (one query)."""
    with db.read() as conn:
        return read_members(conn)


def read_members(conn: Connection) -> list[Member]:
    """:func:`members` on an open connection (the sweep's and the metrics' read)."""
    rows = conn.execute(select(conductors, sql_now(conn.dialect.name).label("db_now"))
                        .order_by(conductors.c.name)).all()
    return [Member(r.name, r.url, r.heartbeat_at,
                   max(0.0, (r.db_now - r.heartbeat_at).total_seconds()),
                   max(0.0, (r.db_now - (r.heard_through or r.heartbeat_at)).total_seconds()))
            for r in rows]


def live(db: Database, dead_after: float) -> list[str]:
    """Names of the conductors heard from within ``dead_after`` seconds; prunes long-dead rows."""
    found = members(db)
    stale = [m for m in found if m.age > dead_after * PRUNE_FACTOR]
    if stale:
        prune(db, stale)
    return [m.name for m in found if m.age <= dead_after]


@retry_on_deadlock
def prune(db: Database, stale: list[Member]) -> int:
    """Delete rows that have not beaten since they were read (compare-and-set)."""
    deleted = 0
    with db.write() as conn:
        for member in stale:
            deleted += conn.execute(delete(conductors).where(
                conductors.c.name == member.name,
                conductors.c.heartbeat_at == member.heartbeat_at)).rowcount
    return deleted


@retry_on_deadlock
def leave(db: Database, name: str) -> bool:
    """Remove ``name`` at a clean stop, so that its peers take its hosts at their next beat."""
    with db.write() as conn:
        return bool(conn.execute(delete(conductors).where(conductors.c.name == name)).rowcount)


def record_heard(conn: Connection, name: str) -> None:
    """Every heartbeat ``name`` read before now is written (called first in its flush's
    transaction, before the flush takes the hosts it heard, so the mark is never ahead)."""
    conn.execute(update(conductors).where(conductors.c.name == name).values(
        heard_through=sql_now(conn.dialect.name)))


def furthest_behind(conn: Connection, dead_after: float) -> Member | None:
    """The live conductor whose written heartbeats are the oldest (None when every one is
    current, or there is none): the liveness sweep may judge an agent's silence only up to
    its ``written_ago``. A conductor that writes each heartbeat in its own transaction (no
    flush) has no mark: its last heartbeat stands for it."""
    live = [m for m in read_members(conn) if m.age <= dead_after and m.written_ago > 0]
    return max(live, key=lambda m: m.written_ago, default=None)
