"""The release queue: attach handles whose host step must run before they are free again.

Unbind and delete run in the API, which never talks to agents. A handle that
needs a step on its host after use (an mdev to remove, see
:func:`acceld.drivers.base.needs_attach_step`) therefore stays ``in_use`` and
gets a ``handle_releases`` row in the same transaction; a conductor claims the
row with a lease (as bind jobs are claimed), asks the node's agent to release
the handle, and only then frees the handle and deletes the row, in one
transaction. A conductor killed in between leaves the row, whose lease
expires (by the database's clock, as bind job leases) and which is retried; releases are idempotent on the agent. Handles
that need no step are freed at once.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import orjson
from sqlalchemy import Connection, Row, bindparam, delete, insert, or_, select, update

from acceld.db import fences
from acceld.db.clock import sql_now
from acceld.db.engine import Database
from acceld.db.retry import retry_on_deadlock
from acceld.db.models import attach_handles as handles
from acceld.db.models import deployables, devices, handle_releases, utcnow
from acceld.drivers.base import needs_attach_step

BACKOFF_CAP = 300.0  # seconds between tries of a release whose agent keeps failing
# Due rows a claim looks through for its conductor's hosts (the queue is short: releases
# wait only while their agents are away).
CLAIM_SCAN = 1000


# Every unbind and delete runs these: built once (the three joins cost more to build per
# call than to run).
_HANDLES_GIVEN_BACK = select(
    handles.c.id, handles.c.attach_type, handles.c.attach_info,
    deployables.c.driver_name, devices.c.hostname,
    handle_releases.c.id.label("queued")).select_from(
    handles.join(deployables, deployables.c.id == handles.c.deployable_id)
    .join(devices, devices.c.id == deployables.c.device_id)
    .outerjoin(handle_releases, handle_releases.c.attach_handle_id == handles.c.id)
).where(handles.c.id.in_(bindparam("ids", expanding=True)))
_FREE_HANDLES = update(handles).where(
    handles.c.id.in_(bindparam("ids", expanding=True))).values(
    in_use=False, updated_at=bindparam("now"))


def give_back(conn: Connection, handle_ids: Iterable[int | None]) -> tuple[int, int]:
    """Return handles after use, in the caller's transaction: free the ones that need no
    host step, queue the others. Returns (freed, queued). Two or three statements."""
    ids = sorted({h for h in handle_ids if h is not None})
    if not ids:
        return 0, 0
    rows = conn.execute(_HANDLES_GIVEN_BACK, {"ids": ids}).all()
    stepped = {r.id: r for r in rows
               if needs_attach_step(r.attach_type, orjson.loads(r.attach_info))}
    free = [i for i in ids if i not in stepped]
    now = utcnow()
    freed = 0
    if free:
        freed = conn.execute(_FREE_HANDLES, {"ids": free, "now": now}).rowcount
    new = [{"attach_handle_id": r.id, "hostname": r.hostname, "driver_name": r.driver_name,
            "lease_owner": None, "lease_expires_at": None, "attempts": 0, "last_error": None,
            "created_at": now, "updated_at": None}
           for r in stepped.values() if r.queued is None]
    if new:
        conn.execute(insert(handle_releases), new)
    return freed, len(stepped)


def free_now(conn: Connection, handle_ids: Sequence[int]) -> int:
    """Free handles whose host step is known not to have happened (a prepare the driver
    refused), without a release."""
    if not handle_ids:
        return 0
    return conn.execute(update(handles).where(handles.c.id.in_(list(handle_ids))).values(
        in_use=False, updated_at=utcnow())).rowcount


def _claimable(now):  # type: ignore[no-untyped-def]
    """Unclaimed, or the claim is over by ``now`` (the database's clock, as SQL)."""
    return or_(handle_releases.c.lease_expires_at.is_(None),
               handle_releases.c.lease_expires_at < now)


@retry_on_deadlock
def claim(db: Database, token: str, limit: int, lease_seconds: float,
          owns: Callable[[str], bool] | None = None) -> list[Row]:
    """Lease up to ``limit`` due releases to ``token``; each row carries the handle and the
    deployable's name. Compare-and-set like :func:`acceld.db.bind_jobs.claim`.

    ``owns``: only releases on the hosts it accepts (the conductor's share of the ring).

    Each claimed row's handle takes its next fencing token in this transaction
    (``fence_token`` on the rows returned; acceld.db.fences): the release is sent with it,
    and the agent refuses it once a later claim (another release, a bind's prepare) sent a
    newer one. The handles are locked first, in id order (handle, then release row: the
    order of every writer of both).
    """
    now = sql_now(db.backend)
    with db.write() as conn:
        if owns is None:
            candidates = list(conn.execute(select(handle_releases.c.id).where(
                _claimable(now)).order_by(handle_releases.c.id).limit(limit)).scalars())
        else:
            candidates = [row.id for row in conn.execute(
                select(handle_releases.c.id, handle_releases.c.hostname).where(
                    _claimable(now)).order_by(handle_releases.c.id).limit(CLAIM_SCAN))
                if owns(row.hostname)][:limit]
        if not candidates:
            return []
        handle_ids = sorted(conn.execute(select(handle_releases.c.attach_handle_id).where(
            handle_releases.c.id.in_(candidates))).scalars())
        conn.execute(select(handles.c.id).where(handles.c.id.in_(handle_ids))
                     .order_by(handles.c.id).with_for_update()).all()
        conn.execute(update(handle_releases).where(
            handle_releases.c.id.in_(candidates), _claimable(now)).values(
            lease_owner=token, lease_expires_at=sql_now(db.backend, lease_seconds),
            attempts=handle_releases.c.attempts + 1, updated_at=now))
        taken = list(conn.execute(select(handle_releases.c.attach_handle_id).where(
            handle_releases.c.id.in_(candidates),
            handle_releases.c.lease_owner == token)).scalars())
        if not taken:
            return []
        fences.take_handle_tokens(conn, taken)
        return list(conn.execute(select(
            handle_releases, handles.c.uuid.label("handle_uuid"), handles.c.fence_token,
            handles.c.attach_type,
            handles.c.attach_info, deployables.c.name.label("deployable_name")).select_from(
            handle_releases.join(handles, handles.c.id == handle_releases.c.attach_handle_id)
            .join(deployables, deployables.c.id == handles.c.deployable_id)).where(
            handle_releases.c.id.in_(candidates),
            handle_releases.c.lease_owner == token).order_by(handle_releases.c.id)).all())


def reclaim(conn: Connection, handle_id: int) -> str:
    """After a prepare of this handle that no bind wants any more (it was unbound, deleted or
    failed while the prepare ran): make sure a release follows it on the host.

    The release the unbind queued may already have run on the host, before the prepare
    did; freeing the handle then would leave the mdev behind. With the handle row locked
    (the order every writer of a handle and its release row keeps: handle, then release
    row), the answer is one of:

    - ``"rearmed"``: a release is queued, maybe running now: it is made due again and its
      claim void, so that a release that ran before the prepare does not free the handle;
    - ``"held"``: the handle is in use and not queued, so a bind holds it (Bound, or being
      prepared by it); that ARQ accounts for the host step, and its unbind releases it;
    - ``"queued"``: the handle was free (the early release already freed it): it is taken
      again and queued, so no bind gets it before the host is clean;
    - ``"gone"``: the handle is no longer in the inventory.
    """
    handle = conn.execute(select(handles.c.id, handles.c.in_use).where(
        handles.c.id == handle_id).with_for_update()).first()
    if handle is None:
        return "gone"
    queued = conn.execute(select(handle_releases.c.id).where(
        handle_releases.c.attach_handle_id == handle_id).with_for_update()).scalar()
    now = utcnow()
    if queued is not None:
        conn.execute(update(handle_releases).where(handle_releases.c.id == queued).values(
            lease_owner=None, lease_expires_at=None, updated_at=now))
        return "rearmed"
    if handle.in_use:
        return "held"
    conn.execute(update(handles).where(handles.c.id == handle_id).values(
        in_use=True, updated_at=now))
    give_back(conn, [handle_id])
    return "queued"


@retry_on_deadlock
def queue_orphans(db: Database, hostname: str,
                  steps: Sequence[tuple[str, str, dict[str, str]]]) -> dict[str, list[str]]:
    """Decide, against the database, which host-step resources an agent reported are
    orphans, and queue their release. ``steps`` are (driver_name, attach_type,
    attach_info) of resources acceld made on ``hostname`` that exist there now.

    A resource is an orphan when its attach handle is free: no Bound or BindStarted ARQ
    holds it and no release is queued (an ``in_use`` handle is exactly one of those). A
    read finds the candidates (handles free when read; in steady state there are none and
    the report costs one SELECT, no write transaction). Then, in one write transaction,
    each candidate is taken with ``in_use = true WHERE in_use = false``, so that a bind
    that took it after the read keeps it, and queued; the release worker then has the agent
    remove the resource and frees the handle. The read only ever skips (a handle in use when
    read waits for the next report); the compare-and-set alone releases. A resource no
    handle of the host names is left alone (``unknown``): nothing proves it unused.
    Returns handle uuids per outcome: ``queued``, ``in_use``, and ``unknown`` (as
    ``driver/type/info``)."""
    outcome: dict[str, list[str]] = {"queued": [], "in_use": [], "unknown": []}
    if not steps:
        return outcome
    with db.read() as conn:
        known = host_handles(conn, hostname, sorted({t for _, t, _ in steps}))
    free: dict[int, Row] = {}
    for driver_name, attach_type, info in steps:
        row = known.get((driver_name, attach_type, _canonical(info)))
        if row is None or not needs_attach_step(attach_type, info):
            outcome["unknown"].append(f"{driver_name}/{attach_type}/{_canonical(info)}")
        elif row.in_use:
            outcome["in_use"].append(row.uuid)
        else:
            free[row.id] = row
    if not free:
        return outcome
    with db.write() as conn:
        for row in (free[i] for i in sorted(free)):  # handles locked in id order
            taken = conn.execute(update(handles).where(
                handles.c.id == row.id, handles.c.in_use.is_(False)).values(
                in_use=True, updated_at=utcnow())).rowcount
            if taken != 1:  # a bind took it after the read: its ARQ accounts for it
                outcome["in_use"].append(row.uuid)
                continue
            give_back(conn, [row.id])
            outcome["queued"].append(row.uuid)
    return outcome


def host_handles(conn: Connection, hostname: str, types: list[str]) -> dict[tuple, Row]:
    """The host's handles of these attach types by (driver, type, canonical info)."""
    rows = conn.execute(select(
        handles.c.id, handles.c.uuid, handles.c.attach_type, handles.c.attach_info,
        handles.c.in_use, deployables.c.driver_name).select_from(
        handles.join(deployables, deployables.c.id == handles.c.deployable_id)
        .join(devices, devices.c.id == deployables.c.device_id)).where(
        devices.c.hostname == hostname, handles.c.attach_type.in_(types))).all()
    return {(r.driver_name, r.attach_type, _canonical(orjson.loads(r.attach_info))): r
            for r in rows}


def _canonical(info: dict[str, str]) -> str:
    return orjson.dumps(info, option=orjson.OPT_SORT_KEYS).decode()


@retry_on_deadlock
def finish(db: Database, release_id: int, handle_id: int, token: str) -> bool:
    """The agent released the handle: free it and drop the row, if the claim is still ours
    (a prepare that landed after the release voids the claim, see :func:`reclaim`)."""
    with db.write() as conn:
        conn.execute(select(handles.c.id).where(handles.c.id == handle_id).with_for_update())
        gone = conn.execute(delete(handle_releases).where(
            handle_releases.c.id == release_id,
            handle_releases.c.lease_owner == token)).rowcount
        if gone != 1:
            return False
        conn.execute(update(handles).where(handles.c.id == handle_id).values(
            in_use=False, updated_at=utcnow()))
        return True


def still_ours(db: Database, release_id: int, token: str, handle_id: int,
               fence_token: int) -> bool:
    """Right before the agent call: the claim is still ``token``'s, its lease has not run
    out by the database's clock, and no later claim took a newer token on the handle. The
    agent's fence covers a stall after this read; this one spares the call."""
    with db.read() as conn:
        row = conn.execute(select(handle_releases.c.id).select_from(
            handle_releases.join(handles, handles.c.id == handle_releases.c.attach_handle_id))
            .where(handle_releases.c.id == release_id, handle_releases.c.lease_owner == token,
                   handle_releases.c.lease_expires_at > sql_now(db.backend),
                   handles.c.id == handle_id, handles.c.fence_token == fence_token)).first()
    return row is not None


@retry_on_deadlock
def retry_later(db: Database, release_id: int, token: str, delay: float, error: str) -> None:
    """Give the lease up; the release is due again after ``delay`` seconds (0: now)."""
    with db.write() as conn:
        conn.execute(update(handle_releases).where(
            handle_releases.c.id == release_id, handle_releases.c.lease_owner == token).values(
            lease_owner=None,
            lease_expires_at=sql_now(db.backend, delay) if delay > 0 else None,
            last_error=error[:4000], updated_at=sql_now(db.backend)))


def backoff(attempts: int) -> float:
    """2 s, 4 s, 8 s, ... up to :data:`BACKOFF_CAP`."""
    return min(BACKOFF_CAP, 2.0 ** max(1, min(attempts, 9)))


def pending(conn: Connection) -> Sequence[Row]:
    """Every queued release (status and tests)."""
    return conn.execute(select(handle_releases).order_by(handle_releases.c.id)).all()
