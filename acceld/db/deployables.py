"""Deployable queries, with their attributes fetched in one more query (never per row)."""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import datetime as dt

from sqlalchemy import Connection, Row, Select, select, true, update

from acceld.db.attributes import deployable_exists
from acceld.db.clock import sql_now
from acceld.db.models import (accelerator_requests, attach_handles, attributes, deployables,
                              devices, utcnow)

_COLUMNS = (deployables.c.id, deployables.c.uuid, deployables.c.parent_id,
            deployables.c.root_id, deployables.c.name, deployables.c.num_accelerators,
            deployables.c.device_id, deployables.c.driver_name, deployables.c.rp_uuid,
            deployables.c.bitstream_id, deployables.c.created_at, deployables.c.updated_at,
            deployables.c.program_status, deployables.c.program_reason)

# Query parameter -> column; all equality filters on indexed or unique columns.
FILTERS = {"name": deployables.c.name, "device_id": deployables.c.device_id,
           "rp_uuid": deployables.c.rp_uuid, "driver_name": deployables.c.driver_name}


def _filtered(query: Select, filters: dict[str, object]) -> Select:
    for name, column in FILTERS.items():
        if name in filters:
            query = query.where(column == filters[name])
    return query


def list_deployables(conn: Connection, filters: dict[str, object]
                     ) -> tuple[Sequence[Row], dict[int, list[tuple[str, str]]]]:
    """Rows and, per deployable id, its (key, value) attributes: two queries in all."""
    rows = conn.execute(_filtered(select(*_COLUMNS), filters)
                        .order_by(deployables.c.id)).all()
    if not rows:
        return rows, {}
    ids = _filtered(select(deployables.c.id), filters).scalar_subquery()
    return rows, _attributes_where(conn, attributes.c.deployable_id.in_(ids))


def get_by_uuid(conn: Connection, uuid: str
                ) -> tuple[Row | None, list[tuple[str, str]]]:
    row = conn.execute(select(*_COLUMNS).where(deployables.c.uuid == uuid)).first()
    if row is None:
        return None, []
    return row, _attributes_where(conn, attributes.c.deployable_id == row.id).get(row.id, [])


def _attributes_where(conn: Connection, condition) -> dict[int, list[tuple[str, str]]]:  # type: ignore[no-untyped-def]
    found: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for dep_id, key, value in conn.execute(
            select(attributes.c.deployable_id, attributes.c.key, attributes.c.value)
            .where(condition).order_by(attributes.c.deployable_id, attributes.c.id)):
        found[dep_id].append((key, value))
    return found


def program_target(conn: Connection, uuid: str) -> Row | None:
    """What programming needs: the deployable, its driver, its node and its device status."""
    return conn.execute(
        select(deployables.c.id, deployables.c.uuid, deployables.c.name,
               deployables.c.driver_name, deployables.c.bitstream_id,
               devices.c.hostname, devices.c.uuid.label("device_uuid"))
        .join(devices, devices.c.id == deployables.c.device_id)
        .where(deployables.c.uuid == uuid)).first()


def record_bitstream(conn: Connection, deployable_id: int, bitstream_id: str) -> bool:
    """Set bitstream_id after a successful program; False if the deployable is gone."""
    return bool(conn.execute(update(deployables).where(deployables.c.id == deployable_id)
                             .values(bitstream_id=bitstream_id, updated_at=utcnow())).rowcount)


# The last API program of a deployable (microversion 2.5 shows status and reason).
# This bookkeeping leaves updated_at alone: it moves when the deployable itself changes
# (bitstream_id, ...), not when a program is asked for or fails.
PROGRAMMING, SUCCEEDED, FAILED = "PROGRAMMING", "SUCCEEDED", "FAILED"
_KEEP_UPDATED_AT = {"updated_at": deployables.c.updated_at}


def start_program(conn: Connection, deployable_id: int, request_id: str) -> bool:
    """Mark a program request as running: it is now the one the deployable shows."""
    return bool(conn.execute(
        update(deployables).where(deployables.c.id == deployable_id)
        .values(program_status=PROGRAMMING, program_reason=None,
                program_request_id=request_id,
                program_started_at=sql_now(conn.dialect.name),  # the stale sweep's clock
                **_KEEP_UPDATED_AT)).rowcount)


def program_begins(conn: Connection, deployable_id: int, request_id: str) -> None:
    """A queued request starts running: its age for the stale sweep counts from now."""
    conn.execute(update(deployables).where(deployables.c.id == deployable_id,
                                           deployables.c.program_request_id == request_id)
                 .values(program_started_at=sql_now(conn.dialect.name), **_KEEP_UPDATED_AT))


def finish_program(conn: Connection, deployable_id: int, request_id: str, status: str,
                   reason: str | None) -> bool:
    """Record a request's outcome, unless a later request has replaced it meanwhile."""
    return bool(conn.execute(
        update(deployables).where(deployables.c.id == deployable_id,
                                  deployables.c.program_request_id == request_id,
                                  deployables.c.program_status == PROGRAMMING)
        .values(program_status=status, program_reason=reason, **_KEEP_UPDATED_AT)).rowcount)


def fail_stale_programs(conn: Connection, older_than: float, reason: str) -> int:
    """FAILED for programs still PROGRAMMING that began over ``older_than`` seconds ago by
    the database's clock (which stamped them): the conductor that ran them stopped (no
    live program outlasts its timeouts)."""
    return conn.execute(
        update(deployables).where(deployables.c.program_status == PROGRAMMING,
                                  deployables.c.program_started_at
                                  < sql_now(conn.dialect.name, -older_than))
        .values(program_status=FAILED, program_reason=reason, **_KEEP_UPDATED_AT)).rowcount


# While a program rewrites a deployable, no bind takes its handles; while one of its handles is
# in use or being taken, it is not programmed. Both sides meet on the deployable row: a program
# marks it (programming_owner/until) under an exclusive lock after seeing no handle in use; a
# bind locks it shared before taking a handle and refuses while the mark holds.
# docs/architecture.md, "Programming and binds".


def lock_for_program(conn: Connection, deployable_id: int) -> Row | None:
    """Lock the device row (shared), then the deployable row (exclusive), the bind's order;
    the deployable as committed now, or None if it is gone.

    A bind that is taking one of its handles holds the deployable row shared until it
    commits, so this waits for it and the handles read afterwards are committed ones.
    """
    device_id = conn.execute(select(deployables.c.device_id).where(
        deployables.c.id == deployable_id)).scalar()
    if device_id is None:
        return None
    conn.execute(select(devices.c.id).where(devices.c.id == device_id)
                 .with_for_update(read=True))
    return conn.execute(select(deployables.c.id, deployables.c.name,
                               deployables.c.bitstream_id).where(
        deployables.c.id == deployable_id).with_for_update()).first()


def holders(conn: Connection, deployable_id: int) -> list[Row]:
    """The deployable's attach handles in use, each with the ARQ holding it (None for a
    handle whose release is still queued): (handle_uuid, arq_uuid, instance_uuid, state)."""
    return conn.execute(
        select(attach_handles.c.uuid.label("handle_uuid"),
               accelerator_requests.c.uuid.label("arq_uuid"),
               accelerator_requests.c.instance_uuid, accelerator_requests.c.state)
        .select_from(attach_handles.outerjoin(
            accelerator_requests,
            accelerator_requests.c.attach_handle_id == attach_handles.c.id))
        .where(attach_handles.c.deployable_id == deployable_id,
               attach_handles.c.in_use == true())
        .order_by(attach_handles.c.id)).all()


def describe_holders(rows: Sequence[Row]) -> str:
    """'ARQ <uuid> (instance <uuid>, Bound), ...' for a 409 or a bind's failure reason."""
    parts = [f"ARQ {r.arq_uuid} (instance {r.instance_uuid}, {r.state})" if r.arq_uuid
             else f"attach handle {r.handle_uuid} (its release is still pending)"
             for r in rows]
    return ", ".join(parts)


def begin_programming(conn: Connection, deployable_id: int, owner: str,
                      until: dt.datetime) -> None:
    """Mark the deployable as being programmed by ``owner`` (under lock_for_program's lock)."""
    conn.execute(update(deployables).where(deployables.c.id == deployable_id)
                 .values(programming_owner=owner, programming_until=until,
                         **_KEEP_UPDATED_AT))


def end_programming(conn: Connection, deployable_id: int, owner: str,
                    bitstream_id: str | None) -> bool:
    """Record the bitstream written (when given) and clear ``owner``'s mark; False if the
    deployable is gone."""
    if bitstream_id is not None and not record_bitstream(conn, deployable_id, bitstream_id):
        return False
    conn.execute(update(deployables).where(
        deployables.c.id == deployable_id, deployables.c.programming_owner == owner)
        .values(programming_owner=None, programming_until=None, **_KEEP_UPDATED_AT))
    return bitstream_id is not None or deployable_exists(conn, deployable_id)


def extend_programming(conn: Connection, deployable_id: int, owner: str,
                       until: dt.datetime) -> None:
    """Keep ``owner``'s mark until ``until``: its program's outcome is unknown (timed out)."""
    conn.execute(update(deployables).where(
        deployables.c.id == deployable_id, deployables.c.programming_owner == owner)
        .values(programming_until=until, **_KEEP_UPDATED_AT))


def programming_now(row: Row, now: dt.datetime) -> bool:
    """Whether a deployable row (with programming_owner/until) is being programmed at ``now``
    (the database's clock)."""
    return row.programming_owner is not None and row.programming_until is not None \
        and row.programming_until > now
