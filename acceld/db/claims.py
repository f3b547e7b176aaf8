"""Standalone claims (API 2.8): ARQs bound without Nova, and the Placement consumers acceld
allocates for them.

A claim's ARQs are inserted already ``BindStarted`` with the host and provider acceld chose,
``instance_uuid`` NULL and ``consumer_uuid`` set, each with a bind job: the conductor binds
them as it binds Nova's (acceld.conductor.binding.worker), writing the consumer's Placement
allocation first (acceld.conductor.placement.claim_allocations).

A consumer's allocation is never edited by difference: it is always :func:`desired`, the
sum of its ARQs that are ``BindStarted`` or ``Bound``, one unit of their provider's resource
class each. Writing it is therefore idempotent, and a change that shrinks it (a refused
bind, a release) only has to mark the consumer ``due`` in the transaction that made the
change; a conductor then writes it again (:func:`claim_due`, :func:`finish`), however many
times it crashes on the way.
"""

from __future__ import annotations

import uuid as uuidlib
from typing import Iterable, Sequence

from sqlalchemy import (Connection, Row, and_, delete, exists, func, insert, or_, select,
                        update)
from sqlalchemy.exc import IntegrityError

from acceld.db import device_events
from acceld.db.clock import sql_now
from acceld.db.engine import Database
from acceld.db.models import accelerator_requests as arqs
from acceld.db.models import attach_handles, attributes, claim_consumers, deployables, devices
from acceld.db.models import utcnow
from acceld.db.retry import retry_on_deadlock

# ARQ states whose provider the consumer's allocation covers (the bind may have written it).
HOLDING = ("BindStarted", "Bound")
BACKOFF_CAP = 300.0


class ConsumerTaken(Exception):
    """The consumer uuid is another project's, or a Nova instance's."""


def create_claimed(conn: Connection, *, profile_id: int,
                   targets: Sequence[tuple[int, str, str]], project_id: str | None,
                   consumer_uuid: str, uuid: str | None = None) -> list[dict]:
    """Insert one BindStarted ARQ per ``(group_id, hostname, rp_uuid)``; their values, ids
    included (for the bind jobs). ``uuid``: the ARQ's, when one target is given."""
    now = utcnow()
    rows = [{"uuid": uuid if uuid and len(targets) == 1 else str(uuidlib.uuid4()),
             "state": "BindStarted",
             "device_profile_id": profile_id, "device_profile_group_id": group,
             "project_id": project_id, "hostname": hostname, "device_rp_uuid": rp_uuid,
             "instance_uuid": None, "attach_handle_id": None, "deployable_id": None,
             "bind_failure_reason": None, "consumer_uuid": consumer_uuid, "created_at": now,
             "updated_at": None} for group, hostname, rp_uuid in targets]
    if not rows:
        return rows
    conn.execute(insert(arqs), rows)
    ids = dict(conn.execute(select(arqs.c.uuid, arqs.c.id).where(
        arqs.c.uuid.in_([r["uuid"] for r in rows]))).all())
    for row in rows:
        row["id"] = ids[row["uuid"]]
    return rows


def ensure_consumer(conn: Connection, consumer_uuid: str, project_id: str | None,
                    user_id: str | None) -> None:
    """The consumer's row, made or taken over for this claim; ConsumerTaken when the uuid
    names a Nova instance's ARQs, or another project's claims hold (or are binding, or are
    being released) under it. A row of another project whose claims hold nothing (all failed
    or released, the release written) claims nothing: it is taken over, so that a claim
    refused for a consumer that was not its own never keeps that consumer from anyone."""
    if conn.execute(select(arqs.c.id).where(arqs.c.instance_uuid == consumer_uuid)
                    .limit(1)).first() is not None:
        raise ConsumerTaken(NOT_YOURS.format(consumer_uuid))
    row = conn.execute(select(claim_consumers.c.project_id, claim_consumers.c.due).where(
        claim_consumers.c.consumer_uuid == consumer_uuid).with_for_update()).first()
    if row is None:
        try:
            conn.execute(insert(claim_consumers).values(
                consumer_uuid=consumer_uuid, project_id=project_id, user_id=user_id,
                due=False, attempts=0, created_at=utcnow()))
        except IntegrityError:  # another project's claim made it first (its transaction ends)
            raise ConsumerTaken(f"consumer {consumer_uuid} was just taken by another "
                                "claim") from None
        return
    if row.project_id != project_id and (row.due or _holds(conn, consumer_uuid)):
        raise ConsumerTaken(NOT_YOURS.format(consumer_uuid))
    # A conductor finishing this consumer's previous write must not delete the row now that
    # a claim names it again: its lease is void (finish() checks the owner).
    owner_now = {} if row.project_id == project_id else {"project_id": project_id,
                                                         "user_id": user_id}
    conn.execute(update(claim_consumers).where(
        claim_consumers.c.consumer_uuid == consumer_uuid).values(
        lease_owner=None, updated_at=utcnow(), **owner_now))


# One message for every consumer that is not the caller's: which it is would tell another
# project's consumers and instances apart from free uuids.
NOT_YOURS = ("consumer {} is not this project's to claim under: it is another project's, or "
             "a Nova instance's (a standalone claim needs a consumer of its own)")


def _holds(conn: Connection, consumer_uuid: str) -> bool:
    """Does an ARQ hold, or bind, under the consumer (what its allocation is made of)?"""
    return conn.execute(select(arqs.c.id).where(
        arqs.c.consumer_uuid == consumer_uuid, arqs.c.state.in_(HOLDING)).limit(1)
    ).first() is not None


def mark_due(conn: Connection, consumer_uuids: Iterable[str | None]) -> int:
    """The consumers' allocations must be written again (in the caller's transaction). Any
    write in progress loses its lease, so it does not clear the mark it did not see."""
    wanted = sorted({c for c in consumer_uuids if c})
    if not wanted:
        return 0
    return conn.execute(update(claim_consumers).where(
        claim_consumers.c.consumer_uuid.in_(wanted)).values(
        due=True, lease_owner=None, lease_expires_at=None, updated_at=utcnow())).rowcount


def desired(conn: Connection, consumer_uuid: str) -> dict[str, dict[str, int]]:
    """The consumer's allocation: provider uuid -> {resource class: ARQs holding it}."""
    rc = select(attributes.c.deployable_id, attributes.c.value).where(
        attributes.c.key == "rc").subquery()
    rows = conn.execute(select(arqs.c.device_rp_uuid, rc.c.value, func.count()).select_from(
        arqs.join(deployables, deployables.c.rp_uuid == arqs.c.device_rp_uuid)
        .join(rc, rc.c.deployable_id == deployables.c.id)).where(
        arqs.c.consumer_uuid == consumer_uuid, arqs.c.state.in_(HOLDING)).group_by(
        arqs.c.device_rp_uuid, rc.c.value)).all()
    out: dict[str, dict[str, int]] = {}
    for rp_uuid, resource_class, count in rows:
        out.setdefault(rp_uuid, {})[resource_class] = int(count)
    return out


def owner(conn: Connection, consumer_uuid: str) -> Row | None:
    """The consumer's project and user (what its Placement allocation is written with)."""
    return conn.execute(select(claim_consumers.c.project_id, claim_consumers.c.user_id).where(
        claim_consumers.c.consumer_uuid == consumer_uuid)).first()


def acceld_providers(conn: Connection, rp_uuids: Iterable[str]) -> set[str]:
    """Which of these providers are acceld's deployables."""
    wanted = sorted(set(rp_uuids))
    if not wanted:
        return set()
    return set(conn.execute(select(deployables.c.rp_uuid).where(
        deployables.c.rp_uuid.in_(wanted))).scalars())


def record_claimed(conn: Connection, arq: object, handle_id: int) -> None:
    """A ``claimed`` device event when ``arq`` (a locked ARQ row) is a standalone claim that
    just went Bound on ``handle_id``, in the bind's transaction."""
    consumer = getattr(arq, "consumer_uuid", None)
    if not consumer:
        return
    row = conn.execute(select(devices.c.uuid, devices.c.hostname, attach_handles.c.uuid.label(
        "handle_uuid")).select_from(attach_handles.join(
            deployables, deployables.c.id == attach_handles.c.deployable_id).join(
            devices, devices.c.id == deployables.c.device_id)).where(
        attach_handles.c.id == handle_id)).first()
    if row is not None:
        device_events.record(conn, row.uuid, row.hostname, device_events.CLAIMED,
                             f"ARQ {getattr(arq, 'uuid')} (consumer {consumer}, project "
                             f"{getattr(arq, 'project_id')}) took attach handle "
                             f"{row.handle_uuid}")


def record_released(conn: Connection, rows: Sequence[Row], actor: str | None) -> None:
    """A ``released`` device event for each claimed ARQ of ``rows`` that holds a handle."""
    held = {r.attach_handle_id: r for r in rows if r.consumer_uuid and r.attach_handle_id}
    if not held:
        return
    for handle_id, device_uuid, hostname, handle_uuid in conn.execute(select(
            attach_handles.c.id, devices.c.uuid, devices.c.hostname, attach_handles.c.uuid)
            .select_from(attach_handles.join(
                deployables, deployables.c.id == attach_handles.c.deployable_id).join(
                devices, devices.c.id == deployables.c.device_id)).where(
            attach_handles.c.id.in_(sorted(held)))):
        row = held[handle_id]
        device_events.record(conn, device_uuid, hostname, device_events.RELEASED,
                             f"ARQ {row.uuid} (consumer {row.consumer_uuid}, project "
                             f"{row.project_id}) released attach handle {handle_uuid}",
                             actor=actor)


# -- the queue of consumers to write ------------------------------------------------------

def _claimable(now):  # type: ignore[no-untyped-def]
    return and_(claim_consumers.c.due.is_(True), or_(
        claim_consumers.c.lease_expires_at.is_(None), claim_consumers.c.lease_expires_at < now))


@retry_on_deadlock
def claim_due(db: Database, token: str, limit: int, lease_seconds: float) -> list[Row]:
    """Lease up to ``limit`` due consumers to ``token`` (compare-and-set, by the database's
    clock, as bind jobs are claimed); their rows."""
    now = sql_now(db.backend)
    with db.write() as conn:
        candidates = list(conn.execute(select(claim_consumers.c.consumer_uuid).where(
            _claimable(now)).order_by(claim_consumers.c.consumer_uuid).limit(limit)).scalars())
        if not candidates:
            return []
        conn.execute(update(claim_consumers).where(
            claim_consumers.c.consumer_uuid.in_(candidates), _claimable(now)).values(
            lease_owner=token, lease_expires_at=sql_now(db.backend, lease_seconds),
            attempts=claim_consumers.c.attempts + 1))
        return list(conn.execute(select(claim_consumers).where(
            claim_consumers.c.consumer_uuid.in_(candidates),
            claim_consumers.c.lease_owner == token)).all())


def any_due(db: Database) -> bool:
    with db.read() as conn:
        return conn.execute(select(claim_consumers.c.consumer_uuid).where(
            claim_consumers.c.due.is_(True)).limit(1)).first() is not None


@retry_on_deadlock
def finish(db: Database, consumer_uuid: str, token: str) -> bool:
    """The consumer's allocation was written as :func:`desired` said: clear ``due``, or drop
    the row when no ARQ names the consumer any more. False when the lease was lost (the
    consumer was marked due again meanwhile: it is written again)."""
    mine = and_(claim_consumers.c.consumer_uuid == consumer_uuid,
                claim_consumers.c.lease_owner == token)
    with db.write() as conn:
        gone = conn.execute(delete(claim_consumers).where(mine, ~exists().where(
            arqs.c.consumer_uuid == consumer_uuid))).rowcount
        if gone:
            return True
        return conn.execute(update(claim_consumers).where(mine).values(
            due=False, lease_owner=None, lease_expires_at=None, attempts=0, last_error=None,
            updated_at=utcnow())).rowcount == 1


def retry_later(db: Database, consumer_uuid: str, token: str, delay: float,
                error: str) -> None:
    """Keep the consumer due, tried again after ``delay`` seconds; ``error`` says why."""
    with db.write() as conn:
        conn.execute(update(claim_consumers).where(
            claim_consumers.c.consumer_uuid == consumer_uuid,
            claim_consumers.c.lease_owner == token).values(
            lease_owner=None, lease_expires_at=sql_now(db.backend, delay),
            last_error=error[:4000], updated_at=utcnow()))


# -- the audit: consumers whose allocation changed without a mark ---------------------------

def settled(db: Database, after: str | None, limit: int) -> list[str]:
    """Up to ``limit`` consumers not due, in uuid order after ``after``: the audit's page."""
    query = select(claim_consumers.c.consumer_uuid).where(claim_consumers.c.due.is_(False))
    if after is not None:
        query = query.where(claim_consumers.c.consumer_uuid > after)
    with db.read() as conn:
        return list(conn.execute(query.order_by(claim_consumers.c.consumer_uuid)
                                 .limit(limit)).scalars())


@retry_on_deadlock
def mark_due_if_not(db: Database, consumer_uuid: str,
                    held: dict[str, dict[str, int]]) -> bool:
    """Mark the consumer due when ``held`` (its Placement allocation, read before this) is not
    what the database wants of it; True if marked. A mark too many only costs a write (the
    drain writes what the database says), so a bind or release racing the audit is safe."""
    with db.write() as conn:
        if desired(conn, consumer_uuid) == held:
            return False
        return conn.execute(update(claim_consumers).where(
            claim_consumers.c.consumer_uuid == consumer_uuid,
            claim_consumers.c.due.is_(False)).values(
            due=True, lease_owner=None, lease_expires_at=None,
            updated_at=utcnow())).rowcount == 1


def audit_scope(db: Database) -> tuple[list[str], set[str]]:
    """acceld's providers, and the Placement consumers the database accounts for (claims'
    consumer rows, Nova's instances with ARQs): where the audit looks for strays."""
    with db.read() as conn:
        providers = sorted(conn.execute(select(deployables.c.rp_uuid).where(
            deployables.c.rp_uuid.is_not(None))).scalars())
        known = set(conn.execute(select(claim_consumers.c.consumer_uuid)).scalars())
        known.update(conn.execute(select(arqs.c.instance_uuid).where(
            arqs.c.instance_uuid.is_not(None)).distinct()).scalars())
    return providers, known


@retry_on_deadlock
def adopt(db: Database, consumer_uuid: str, project_id: str | None,
          user_id: str | None) -> bool:
    """A due row for a standalone claim's consumer that Placement holds and the database
    has no row for (left by a writer that died after a write Placement could not refuse):
    the drain then writes what the database wants of it. False when a row exists."""
    try:
        with db.write() as conn:
            if conn.execute(select(claim_consumers.c.consumer_uuid).where(
                    claim_consumers.c.consumer_uuid == consumer_uuid)).first() is not None:
                return False
            conn.execute(insert(claim_consumers).values(
                consumer_uuid=consumer_uuid, project_id=project_id, user_id=user_id,
                due=True, attempts=0, created_at=utcnow()))
    except IntegrityError:  # a claim made it meanwhile: its writes account for it
        return False
    return True


def backoff(attempts: int) -> float:
    return min(BACKOFF_CAP, 2.0 * 2 ** max(0, attempts - 1))
