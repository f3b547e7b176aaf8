"""Device events: each device's history (health, quarantine, operator, programs, vanish,
standalone claims).

Written in the transaction that makes the change, so an event exists exactly when its change
committed. Stamped by the database's clock (acceld.db.clock) so that events written by
several conductors and API workers order truthfully; listed newest first by id (the order
of insertion) through the ``(device_uuid, id)`` index; purged by time through the
``created_at`` index (acceld.conductor.health.device_event_purge).
"""

from __future__ import annotations

import uuid as uuidlib
from typing import Sequence

from sqlalchemy import Connection, Row, delete, insert, select

from acceld.db.clock import sql_now
from acceld.db.models import device_events

HEALTH_CHANGED = "health_changed"
QUARANTINED = "quarantined"
RECOVERED = "recovered"
ENABLED = "enabled"
DISABLED = "disabled"
PROGRAM_SUCCEEDED = "program_succeeded"
PROGRAM_FAILED = "program_failed"
VANISHED = "vanished"
REAPPEARED = "reappeared"
# A standalone claim (API 2.8) took one of the device's handles, or gave it back.
CLAIMED = "claimed"
RELEASED = "released"
KINDS = (HEALTH_CHANGED, QUARANTINED, RECOVERED, ENABLED, DISABLED, PROGRAM_SUCCEEDED,
         PROGRAM_FAILED, VANISHED, REAPPEARED, CLAIMED, RELEASED)
CONDUCTOR = "conductor"
MAX_DETAIL = 4000

COLUMNS = (device_events.c.id, device_events.c.uuid, device_events.c.device_uuid,
           device_events.c.hostname, device_events.c.created_at, device_events.c.kind,
           device_events.c.detail, device_events.c.actor)


def record(conn: Connection, device_uuid: str, hostname: str | None, kind: str,
           detail: str | None, actor: str | None = CONDUCTOR) -> str:
    """Add one event in the caller's transaction; returns its uuid."""
    event_uuid = str(uuidlib.uuid4())
    conn.execute(insert(device_events).values(
        uuid=event_uuid, device_uuid=device_uuid, hostname=hostname,
        created_at=sql_now(conn.dialect.name), kind=kind,
        detail=detail[:MAX_DETAIL] if detail else detail, actor=actor))
    return event_uuid


def marker_id(conn: Connection, device_uuid: str, marker: str) -> int | None:
    """The id of the event ``marker`` names among ``device_uuid``'s; None if none."""
    return conn.execute(select(device_events.c.id).where(
        device_events.c.uuid == marker, device_events.c.device_uuid == device_uuid)).scalar()


def newest_first(conn: Connection, device_uuid: str, limit: int,
                 before_id: int | None = None) -> Sequence[Row]:
    """Up to ``limit`` events of the device, newest first, older than ``before_id``."""
    query = select(*COLUMNS).where(device_events.c.device_uuid == device_uuid)
    if before_id is not None:
        query = query.where(device_events.c.id < before_id)
    return conn.execute(query.order_by(device_events.c.id.desc()).limit(limit)).all()


def purge(conn: Connection, older_than_seconds: float, batch: int | None = None) -> int:
    """Delete events older than ``older_than_seconds`` by the database's clock (at most
    ``batch`` of them, oldest first, when given); how many."""
    cutoff = sql_now(conn.dialect.name, plus=-float(older_than_seconds))
    old = device_events.c.created_at < cutoff
    if batch is None:
        return conn.execute(delete(device_events).where(old)).rowcount
    ids = conn.execute(select(device_events.c.id).where(old)
                       .order_by(device_events.c.created_at).limit(batch)).scalars().all()
    if not ids:
        return 0
    return conn.execute(delete(device_events).where(device_events.c.id.in_(ids))).rowcount
