"""Retiring a host whose agent will never return: its inventory, queued releases and agent
row go in one transaction; its Placement providers are flagged for the conductor to remove.

Called by ``DELETE /v2/hosts/{hostname}`` (microversion 2.5) and ``acceld host delete``.
Refused (:class:`HostInUse`) while the host's agent is ``up`` or while ARQs are
``BindStarted`` or ``Bound`` there, unless forced. A forced retire fails those ARQs
(``BindFailed`` with a reason, instance kept so that Nova's delete-by-instance still finds
them; a ``BindStarted`` one's job moves to ``notify`` so Nova hears ``failed``).

Races are decided by row locks taken in the order every writer keeps (agent; ARQs, then
bind jobs; devices, then attach handles, then release rows):

* a hello of the agent and a reconcile lock the agent row first, so they wait for the
  retire or it waits for them and sees the agent ``up``;
* a bind locks its ARQ, then (shared) its device before taking a handle
  (acceld.conductor.binding.target); the retire locks the ARQs it read, then the host's
  devices and handles, and re-reads who holds a handle as committed now. A holder that
  committed after the ARQ read (a bind that took a handle meanwhile) is not locked by this
  transaction: it rolls back and starts again, so that the ARQ is seen, refused or failed
  like any other. A bind that waits for the device lock finds the device gone.

Placement is never called here (the API does not talk to Placement): the host's provider
rows in ``placement_sync`` stay, flagged, and the conductor's sync deletes the providers
(or holds them fully reserved while an instance still has allocations there), retrying
while Placement is unreachable. See docs/devices.md, "Retiring a host".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

from sqlalchemy import Connection, delete, func, or_, select, update

from acceld.db import accelerator_requests as arq_db
from acceld.db import agents as agents_db
from acceld.db import bind_jobs, claims
from acceld.db.engine import Database
from acceld.db.models import accelerator_requests as arqs
from acceld.db.models import (agents, attach_handles, attributes, controlpath_ids, deployables,
                              devices, handle_releases, placement_sync, utcnow)
from acceld.db.models import bind_jobs as jobs
from acceld.db.placement_flags import mark_dirty

LOG = logging.getLogger(__name__)

# ARQs in these states are bound (or being bound) there: they block an unforced retire.
BLOCKING = (arq_db.BIND_STARTED, arq_db.BOUND)
# Tries when binds keep taking handles between the ARQ read and the device locks.
MAX_TRIES = 5


class HostNotFound(Exception):
    """acceld knows nothing of the host: no agent, inventory, queued release or provider."""


class HostInUse(Exception):
    """The retire would take devices from under running work; ``message`` says what."""

    def __init__(self, message: str, arqs: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.arqs = list(arqs)


class _HolderAppeared(Exception):
    """A handle of the host is held by an ARQ this transaction did not lock: start again."""


@dataclass
class Retired:
    """What a retire removed or changed (for the CLI's summary and the logs)."""

    hostname: str
    agent: bool = False
    devices: int = 0
    deployables: int = 0
    attach_handles: int = 0
    handle_releases: int = 0
    providers: int = 0  # Placement providers the conductor will remove
    failed_arqs: list[tuple[str, str | None]] = field(default_factory=list)  # (arq, instance)


def reason(hostname: str) -> str:
    """The bind_failure_reason of an ARQ a forced retire took its device from."""
    return (f"host {hostname} was retired by an operator (acceld host delete --force) while "
            "this request was bound or being bound there; its devices are gone")


def retire(db: Database, hostname: str, force: bool = False) -> Retired:
    """Remove ``hostname`` from acceld, in one transaction (retried when a bind races it).

    Raises HostNotFound, or HostInUse unless ``force``.
    """
    for _ in range(MAX_TRIES):
        try:
            with db.write() as conn:
                out = _retire(conn, hostname, force)
        except _HolderAppeared:
            continue
        _log(out)
        return out
    raise HostInUse(f"Binds on host {hostname} kept taking its devices while it was being "
                    "retired; try again.")


def _log(out: Retired) -> None:
    LOG.warning("Host %s retired: agent record %s, %d device(s), %d deployable(s), %d attach "
                "handle(s), %d queued release(s) removed; %d Placement provider(s) left to "
                "the conductor's sync", out.hostname, "removed" if out.agent else "absent",
                out.devices, out.deployables, out.attach_handles, out.handle_releases,
                out.providers)
    for arq, instance in out.failed_arqs:
        LOG.warning("ARQ %s of instance %s is BindFailed: its host %s was retired", arq,
                    instance, out.hostname)


def _retire(conn: Connection, hostname: str, force: bool) -> Retired:
    agent = agents_db.lock_agent(conn, hostname)
    if agent is not None and agent.state == "up" and not force:
        raise HostInUse(
            f"The agent of host {hostname} is up (last contact "
            f"{agent.last_seen_at.isoformat(sep=' ', timespec='seconds')} UTC): stop it and "
            "wait until it is marked down, or force the delete.")
    held = lock_arqs(conn, hostname)
    blocking = [r for r in held if r.state in BLOCKING]
    if blocking and not force:
        raise HostInUse(_describe(hostname, blocking), blocking)
    device_ids, dep_ids, handle_ids = lock_inventory(conn, hostname)
    holders = set(conn.scalars(select(arqs.c.id).where(
        arqs.c.attach_handle_id.in_(handle_ids)))) if handle_ids else set()
    if holders - {r.id for r in held}:
        raise _HolderAppeared
    if agent is None and not device_ids and not _leftovers(conn, hostname):
        raise HostNotFound(f"Host {hostname} is unknown: no agent, device, queued release or "
                           "Placement provider.")
    out = Retired(hostname, agent=agent is not None, devices=len(device_ids),
                  deployables=len(dep_ids), attach_handles=len(handle_ids))
    _fail_bound(conn, hostname, blocking, out)
    _forget_references(conn, held, dep_ids, handle_ids)
    mark_dirty(conn, hostname=hostname)  # every provider of the host: the sync removes them
    out.providers = conn.execute(select(func.count()).select_from(placement_sync).where(
        placement_sync.c.hostname == hostname)).scalar_one()
    out.handle_releases = _delete_inventory(conn, hostname, device_ids, dep_ids, handle_ids)
    if agent is not None:
        conn.execute(delete(agents).where(agents.c.id == agent.id))
    return out


def lock_arqs(conn: Connection, hostname: str) -> Sequence[Any]:
    """Every ARQ bound or binding to the host, or holding one of its handles or deployables,
    locked (FOR UPDATE, id order) before any inventory row, as every ARQ writer does."""
    on_host = select(devices.c.id).where(devices.c.hostname == hostname)
    deps = select(deployables.c.id).where(deployables.c.device_id.in_(on_host))
    handles = select(attach_handles.c.id).where(attach_handles.c.deployable_id.in_(deps))
    return conn.execute(select(
        arqs.c.id, arqs.c.uuid, arqs.c.state, arqs.c.instance_uuid, arqs.c.attach_handle_id,
        arqs.c.deployable_id).where(or_(
            arqs.c.hostname == hostname, arqs.c.attach_handle_id.in_(handles),
            arqs.c.deployable_id.in_(deps))).order_by(arqs.c.id).with_for_update()).all()


def lock_inventory(conn: Connection, hostname: str) -> tuple[list[int], list[int], list[int]]:
    """Lock the host's devices (FOR UPDATE, so no bind takes a handle until the end: a bind
    locks its device first), then their handles; ids of devices, deployables and handles.

    MariaDB locks index entries: a bind's shared lock goes through the ``uuid`` index,
    then the row. Locking the rows only (through ``hostname``) would let a bind take the
    ``uuid`` entry and wait for the row while the delete waits for that entry: a
    deadlock. So the ``uuid`` entries are locked first, as the bind reaches them.
    """
    uuids = list(conn.scalars(select(devices.c.uuid).where(devices.c.hostname == hostname)))
    if uuids:
        conn.execute(select(devices.c.id).where(devices.c.uuid.in_(uuids))
                     .order_by(devices.c.uuid).with_for_update()).all()
    device_ids = list(conn.scalars(select(devices.c.id).where(
        devices.c.hostname == hostname).order_by(devices.c.id).with_for_update()))
    if not device_ids:
        return [], [], []
    dep_ids = list(conn.scalars(select(deployables.c.id).where(
        deployables.c.device_id.in_(device_ids)).order_by(deployables.c.id)))
    handle_ids = list(conn.scalars(select(attach_handles.c.id).where(
        attach_handles.c.deployable_id.in_(dep_ids)).order_by(attach_handles.c.id)
        .with_for_update())) if dep_ids else []
    return device_ids, dep_ids, handle_ids


def _describe(hostname: str, rows: Sequence[Any]) -> str:
    instances = sorted({r.instance_uuid for r in rows if r.instance_uuid})
    listed = ", ".join(f"{r.uuid} ({r.state}, instance {r.instance_uuid})" for r in rows)
    return (f"Host {hostname} has accelerator requests bound or being bound there, for "
            f"instance(s) {', '.join(instances) or 'none'}: {listed}. Delete or move those "
            "instances first, or force the delete (their requests then end BindFailed).")


def _fail_bound(conn: Connection, hostname: str, rows: Sequence[Any], out: Retired) -> None:
    """Forced: BindFailed with the reason; a pending bind's job turns into Nova's event."""
    if not rows:
        return
    ids = [r.id for r in rows]
    arq_db.transition(conn, ids, arq_db.BIND_FAILED, bind_failure_reason=reason(hostname),
                      attach_handle_id=None, deployable_id=None)
    # Standalone claims there: their Placement allocation is written again, without them.
    claims.mark_due(conn, conn.execute(select(arqs.c.consumer_uuid).where(
        arqs.c.id.in_(ids))).scalars())
    # A bind in flight finds its job no longer pending and rolls back; any conductor then
    # sends the 'failed' event (the state is read when the event is sent).
    conn.execute(update(jobs).where(jobs.c.arq_id.in_(ids),
                                    jobs.c.phase == bind_jobs.PENDING).values(
        phase=bind_jobs.NOTIFY, lease_owner=None, lease_expires_at=None, attempts=0,
        updated_at=utcnow()))
    out.failed_arqs = [(r.uuid, r.instance_uuid) for r in rows]


def _forget_references(conn: Connection, held: Sequence[Any], dep_ids: list[int],
                       handle_ids: list[int]) -> None:
    """Other ARQs (BindFailed, Unbound) that still point at the host's rows let go of them."""
    ids = [r.id for r in held if r.attach_handle_id in handle_ids or r.deployable_id in dep_ids]
    if ids:
        conn.execute(update(arqs).where(arqs.c.id.in_(ids)).values(
            attach_handle_id=None, deployable_id=None))


def _leftovers(conn: Connection, hostname: str) -> bool:
    """Queued releases or provider rows of a host with no agent and no device left."""
    return any(conn.execute(select(table.c.hostname).where(table.c.hostname == hostname)
                            .limit(1)).first() for table in (handle_releases, placement_sync))


def _delete_inventory(conn: Connection, hostname: str, device_ids: list[int],
                      dep_ids: list[int], handle_ids: list[int]) -> int:
    """Children first, so every backend (MariaDB checks foreign keys row by row) accepts it.
    Returns how many queued releases went."""
    queued = conn.execute(delete(handle_releases).where(or_(
        handle_releases.c.hostname == hostname,
        handle_releases.c.attach_handle_id.in_(handle_ids)))).rowcount
    if dep_ids:
        conn.execute(delete(attach_handles).where(attach_handles.c.deployable_id.in_(dep_ids)))
        conn.execute(delete(attributes).where(attributes.c.deployable_id.in_(dep_ids)))
        conn.execute(update(deployables).where(deployables.c.id.in_(dep_ids)).values(
            parent_id=None, root_id=None))
        conn.execute(delete(deployables).where(deployables.c.id.in_(dep_ids)))
    if device_ids:
        conn.execute(delete(controlpath_ids).where(controlpath_ids.c.device_id.in_(device_ids)))
        conn.execute(delete(devices).where(devices.c.id.in_(device_ids)))
    return queued
