"""The ``agents`` table: who reported, when, and whether they are considered alive.

State changes are compare-and-set (``WHERE state = ... AND last_seen_at = ...``)
so that a heartbeat racing the liveness sweep is never overwritten by it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (ColumnElement, Connection, String, any_, bindparam, case, func, insert,
                        literal, or_, select, update)
from sqlalchemy.dialects.postgresql import ARRAY

from acceld.db.clock import sql_now
from acceld.db.models import Timestamp, agents, devices, handle_releases


@dataclass
class Heartbeat:
    """The agent row before this heartbeat (None fields for a first hello)."""

    new: bool
    previous_state: str | None
    previous_seen: dt.datetime | None
    stored_digest: str | None
    # The hello announced a discovery not counted before (or carried no count): one more
    # health report of the node's devices (acceld.quarantine).
    new_discovery: bool = True


def record_heartbeat(conn: Connection, hostname: str, endpoint: str, interval: int,
                     now: dt.datetime | None = None,
                     discovery: int | None = None) -> Heartbeat:
    """Upsert the agent's row: up, seen now (the database's clock unless ``now`` is given,
    so that the conductor taking the heartbeat and the one judging it agree), and the
    agent's discovery count. Returns what it was before."""
    seen = now or sql_now(conn.dialect.name)
    row = conn.execute(select(agents).where(agents.c.hostname == hostname)
                       .with_for_update()).first()
    if row is None:
        conn.execute(insert(agents).values(hostname=hostname, endpoint=endpoint, state="up",
                                           heartbeat_interval=interval, last_seen_at=seen,
                                           hardware_digest=None, last_discovery=discovery))
        return Heartbeat(True, None, None, None)
    values: dict[str, Any] = {"last_seen_at": seen}
    if discovery is not None and row.last_discovery != discovery:
        values["last_discovery"] = discovery
    if row.state != "up":
        values["state"] = "up"
    if row.endpoint != endpoint:
        values["endpoint"] = endpoint
        values["hardware_digest"] = None  # a different agent process: pull its hardware
    if row.heartbeat_interval != interval:
        values["heartbeat_interval"] = interval
    conn.execute(update(agents).where(agents.c.id == row.id).values(**values))
    if row.state != "up" or "endpoint" in values:
        _releases_due_now(conn, [hostname])
    stored = None if "hardware_digest" in values else row.hardware_digest
    return Heartbeat(False, row.state, row.last_seen_at, stored,
                     discovery is None or "last_discovery" in values)


def _releases_due_now(conn: Connection, hostnames: list[str]) -> None:
    """An agent that is back (or restarted) can release at once: the hosts' queued releases
    that wait out a backoff from its outage (up to 5 minutes) are made due. A release in
    flight (leased) is left to its conductor. A steady heartbeat never runs this."""
    conn.execute(update(handle_releases).where(
        handle_releases.c.hostname.in_(hostnames), handle_releases.c.lease_owner.is_(None),
        handle_releases.c.lease_expires_at.is_not(None)).values(lease_expires_at=None))


def lock_agent(conn: Connection, hostname: str) -> Any:
    """The agent's row, locked for the rest of the transaction (serialises reconciles)."""
    return conn.execute(select(agents).where(agents.c.hostname == hostname)
                        .with_for_update()).first()


def set_digest(conn: Connection, hostname: str, digest: str | None) -> None:
    conn.execute(update(agents).where(agents.c.hostname == hostname)
                 .values(hardware_digest=digest))


def overdue(conn: Connection, down_intervals: int, behind: int = 0) -> list[Any]:
    """Agents marked up whose last contact is older than ``down_intervals`` of their interval
    plus ``behind`` whole seconds (how far the conductors' written heartbeats lag), by the
    database's clock (read in the same SELECT; each row carries it as ``db_now``)."""
    # The database filters (each conductor sweeps every agent_check_interval: reading every
    # agent's row to keep the few late ones cost more than the heartbeats themselves).
    dialect = conn.dialect.name
    return conn.execute(select(
        agents.c.id, agents.c.hostname, agents.c.last_seen_at, agents.c.heartbeat_interval,
        sql_now(dialect).label("db_now"),
    ).where(agents.c.state == "up", agents.c.last_seen_at < sql_now(
        dialect, -(agents.c.heartbeat_interval * down_intervals + behind)))).all()


def mark_down(conn: Connection, row: Any) -> bool:
    """Compare-and-set: only if nobody heard from the agent since ``row`` was read. The
    mark's time is the row's ``updated_at``, by the database's clock: a conductor's
    coalesced flush brings the host back only for a hello it heard after it
    (:func:`bring_up`)."""
    return bool(conn.execute(update(agents).where(
        agents.c.id == row.id, agents.c.state == "up",
        agents.c.last_seen_at == row.last_seen_at).values(
        state="down", updated_at=sql_now(conn.dialect.name))).rowcount)


def list_agents(conn: Connection, state: str | None = None) -> list[Any]:
    query = select(agents).order_by(agents.c.hostname)
    if state:
        query = query.where(agents.c.state == state)
    return conn.execute(query).all()


def get_agent(conn: Connection, hostname: str) -> Any:
    return conn.execute(select(agents).where(agents.c.hostname == hostname)).first()


def device_counts(conn: Connection, hostname: str | None = None) -> dict[str, int]:
    """Devices in the inventory per hostname (one query; only ``hostname`` when given)."""
    query = select(devices.c.hostname, func.count()).group_by(devices.c.hostname)
    if hostname is not None:
        query = query.where(devices.c.hostname == hostname)
    return dict(conn.execute(query).all())


def is_up(conn: Connection, hostname: str) -> bool:
    """False only for a node whose agent reported before and is now marked down.

    A node never heard from has no inventory of its own to bind; rows made by other
    means (tests, an operator) are not refused for lack of an agent.
    """
    state = conn.execute(_STATE_OF_HOST, {"hostname": hostname}).scalar()
    return state != "down"


# Built once: every bind runs it.
_STATE_OF_HOST = select(agents.c.state).where(agents.c.hostname == bindparam("hostname"))


def reachability(conn: Connection, hostname: str) -> Any:
    """The agent's ``endpoint`` and ``state`` (a row), or None when it never registered."""
    return conn.execute(select(agents.c.endpoint, agents.c.state).where(
        agents.c.hostname == hostname)).first()


def touch_up(conn: Connection, hostnames: list[str]) -> int:
    """Coalesced heartbeats (acceld.conductor.fleet.liveness): the agents of ``hostnames`` that
    are up were seen now, by the database's clock; one UPDATE for all of them."""
    if not hostnames:
        return 0
    return conn.execute(update(agents).where(
        _among(conn, hostnames), agents.c.state == "up").values(
        last_seen_at=sql_now(conn.dialect.name))).rowcount


def _among(conn: Connection, hostnames: list[str]) -> ColumnElement[bool]:
    """``hostname IN (...)`` for the flush's hundreds of hosts a second: on PostgreSQL one
    array parameter (``= ANY(...)``), so the statement is the same text whatever the count
    (an IN list of n parameters is expanded into the SQL at each call and parsed again by
    the driver: the flush's UPDATE was 8% of a conductor's Python under 2,000 agents)."""
    if conn.dialect.name == "postgresql":
        return agents.c.hostname == any_(bindparam("hostnames", hostnames,
                                                   type_=ARRAY(String)))
    return agents.c.hostname.in_(hostnames)


def bring_up(conn: Connection, heard: dict[str, dt.datetime]) -> list[str]:
    """Agents marked down that were heard again (a coalesced flush found them so): up and
    seen now, their waiting releases due, in two statements for all of them (three on
    MySQL/MariaDB). The cheap way back: a conductor behind on its heartbeats may find
    thousands at once.

    ``heard``: when each host's latest hello was received, by the database's clock. Only a
    host whose down mark (``updated_at``, :func:`mark_down`) is older comes back, decided
    in the UPDATE itself: a hello heard before the mark (by a conductor that froze or
    stalled before its flush) says nothing of the agent since. Returns the hosts brought
    up."""
    if not heard:
        return []
    dialect = conn.dialect.name
    received = case({host: literal(at, Timestamp) for host, at in heard.items()},
                    value=agents.c.hostname)
    where = (agents.c.hostname.in_(list(heard)), agents.c.state != "up",
             or_(agents.c.updated_at.is_(None), agents.c.updated_at < received))
    if dialect == "sqlite" or dialect == "postgresql":
        back = list(conn.execute(update(agents).where(*where).values(
            state="up", last_seen_at=sql_now(dialect)).returning(agents.c.hostname)).scalars())
    else:  # MySQL and MariaDB return no rows from an UPDATE: the rows it will change first
        back = list(conn.execute(select(agents.c.hostname).where(*where)
                                 .with_for_update()).scalars())
        if back:
            conn.execute(update(agents).where(agents.c.hostname.in_(back)).values(
                state="up", last_seen_at=sql_now(dialect)))
    if back:
        _releases_due_now(conn, back)
    return back


def rows_of(conn: Connection, hostnames: list[str]) -> list[Any]:
    """The agent rows of ``hostnames`` (those that exist), in one SELECT; each carries the
    database's clock as ``db_now`` (read by the same statement)."""
    if not hostnames:
        return []
    return conn.execute(select(agents, sql_now(conn.dialect.name).label("db_now")).where(
        _among(conn, hostnames))).all()
