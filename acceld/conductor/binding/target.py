"""Is the bind target Nova named acceptable, and which attach handle does the ARQ get?

:func:`check_and_take` runs :data:`CHECKS` in order, inside the bind's write
transaction, then takes one free attach handle atomically. A check that fails
raises :class:`BindRefused` with a reason an administrator can act on (or
:class:`AgentDown`, an outage the bind waits out); that
reason becomes the ARQ's ``bind_failure_reason`` and a log line. To add a check
(agent liveness, the Placement allocation, FPGA programming), write a function
``(conn, target) -> None`` that raises ``BindRefused`` and insert it into
``CHECKS`` where it belongs; ``target`` carries what earlier checks found.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import orjson
from sqlalchemy import Connection, Row, bindparam, false, select, update

from acceld.db import deployables as dep_db
from acceld.db.clock import db_now
from acceld.db.models import attach_handles, attributes, deployables, devices, utcnow
from acceld.placement_model import IMPLICIT_TRAITS

LOG = logging.getLogger(__name__)

# How many free handles to try per round, and rounds, when binds race for the same ones.
_CANDIDATES = 16
_ROUNDS = 4


class BindRefused(Exception):
    """The target cannot take this ARQ; ``reason`` says why, for an administrator."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def target_of(row: Any) -> tuple[str, str, str]:
    """(hostname, device_rp_uuid, instance_uuid) of an ARQ row or of a verdict about one.

    A verdict decided before the bind transaction applies only while this is unchanged.
    """
    return (row.hostname, row.device_rp_uuid, row.instance_uuid)


@dataclass
class BindTarget:
    """What a bind asks for, and what the checks learn on the way."""

    arq_uuid: str
    hostname: str
    device_rp_uuid: str
    instance_uuid: str
    group: dict[str, str]  # the ARQ's device profile group
    deployable: Row | None = None  # deployable joined with its device
    resource_class: str | None = None
    traits: set[str] = field(default_factory=set)
    handle: Row | None = None  # the attach handle taken, once taken
    agent_up: bool = False  # check_agent_up saw the host's agent up


# The bind's statements, built once: every bind runs them in its write transaction, and
# building them (columns, clauses, cache keys) cost about as much as running them.
_DEPLOYABLE_OF_PROVIDER = select(
    deployables.c.id, deployables.c.uuid, deployables.c.name, deployables.c.rp_uuid,
    devices.c.uuid.label("device_uuid"), devices.c.hostname, devices.c.status,
    devices.c.acc_status, devices.c.vanished, devices.c.quarantined, devices.c.health,
    devices.c.health_reason).select_from(
    deployables.join(devices, devices.c.id == deployables.c.device_id)).where(
    deployables.c.rp_uuid == bindparam("rp_uuid"))
_DEVICE_LOCKED = select(
    devices.c.status, devices.c.acc_status, devices.c.vanished, devices.c.quarantined,
    devices.c.health, devices.c.health_reason).where(
    devices.c.uuid == bindparam("device_uuid")).with_for_update(read=True)
_DEPLOYABLE_EXISTS = select(deployables.c.id).where(deployables.c.id == bindparam("id"))
_DEPLOYABLE_LOCKED = select(
    deployables.c.bitstream_id, deployables.c.programming_owner,
    deployables.c.programming_until).where(
    deployables.c.id == bindparam("id")).with_for_update(read=True)
_ATTRIBUTES = select(attributes.c.key, attributes.c.value).where(
    attributes.c.deployable_id == bindparam("id"))
_FREE_HANDLES = select(
    attach_handles.c.id, attach_handles.c.uuid, attach_handles.c.attach_type,
    attach_handles.c.attach_info).where(
    attach_handles.c.deployable_id == bindparam("id"),
    attach_handles.c.in_use == false()).order_by(attach_handles.c.id).limit(_CANDIDATES)
_TAKE_HANDLE = update(attach_handles).where(
    attach_handles.c.id == bindparam("handle_id"), attach_handles.c.in_use == false()).values(
    in_use=True, updated_at=bindparam("at", type_=attach_handles.c.updated_at.type))


def find_deployable(conn: Connection, target: BindTarget) -> None:
    row = conn.execute(_DEPLOYABLE_OF_PROVIDER, {"rp_uuid": target.device_rp_uuid}).first()
    if row is None:
        raise BindRefused(f"device_rp_uuid {target.device_rp_uuid} is not the resource "
                          "provider of any deployable acceld knows")
    target.deployable = row


def check_host(conn: Connection, target: BindTarget) -> None:
    dep = target.deployable
    if dep.hostname != target.hostname:
        raise BindRefused(f"deployable {dep.name} (provider {target.device_rp_uuid}) is on host "
                          f"{dep.hostname}, not on {target.hostname}")


class AgentDown(Exception):
    """The host's agent is marked down: an outage the bind waits out up to ``[conductor]
    bind_timeout`` (acceld.conductor.binding.outages), not a refusal."""

    def __init__(self, hostname: str) -> None:
        self.hostname = hostname
        self.detail = ("it is marked down (no heartbeat); its devices are not bound until "
                       "it reports again")
        super().__init__(f"the agent of host {hostname} is down")


def check_agent_up(conn: Connection, target: BindTarget) -> None:
    """No bind on a node whose agent is marked down (acceld.conductor.fleet.agents); the bind
    waits for it (:class:`AgentDown`)."""
    from acceld.conductor.fleet.agents import host_is_up

    if not host_is_up(conn, target.hostname):
        raise AgentDown(target.hostname)
    target.agent_up = True


def check_device_usable(conn: Connection, target: BindTarget) -> None:
    dep = target.deployable
    _refuse_unusable(dep.device_uuid, dep.hostname, dep)


def _refuse_unusable(device_uuid: str, hostname: str, device: Any) -> None:
    """BindRefused naming why ``device`` (a row with status, acc_status, vanished and the
    health columns) may not take a new bind."""
    if device.vanished:
        raise BindRefused(f"device {device_uuid} is no longer reported by host {hostname}")
    if device.status != "enabled":
        raise BindRefused(f"device {device_uuid} is disabled (status {device.status})")
    if device.quarantined:
        raise BindRefused(health_refusal(device_uuid, hostname, device.health,
                                         device.health_reason))
    if device.acc_status != "ready":
        raise BindRefused(f"device {device_uuid} is not ready (acc_status {device.acc_status})")


def health_refusal(device_uuid: str, hostname: str, health: str, reason: str | None) -> str:
    """Why a quarantined device takes no bind, naming its health (docs/devices.md)."""
    return (f"device {device_uuid} on host {hostname} is quarantined for its health "
            f"(health {health}{': ' + reason if reason else ''}); no new bind until it "
            "recovers")


def lock_device(conn: Connection, device_uuid: str, deployable_id: int, hostname: str) -> None:
    """Lock the device row (shared) and check it again as committed now; BindRefused if it
    was disabled, lost or removed since the checks read it.

    The checks read without locks, so an operator's disable (or a reconcile) may commit
    between them and the handle being taken. With this lock held until the bind commits, a
    disable either committed before it (and is seen here) or waits for the bind: once a
    disable has committed, no bind goes Bound on the device. Taken right before a handle,
    after the ARQ and job locks: device, then handle, the order reconciliation uses too
    (acceld.db.inventory).
    """
    device = conn.execute(_DEVICE_LOCKED, {"device_uuid": device_uuid}).first()
    if device is None or conn.execute(_DEPLOYABLE_EXISTS, {"id": deployable_id}).first() is None:
        raise BindRefused(f"device {device_uuid} was removed from host {hostname}'s "
                          "inventory while the bind was in progress")
    _refuse_unusable(device_uuid, hostname, device)


def lock_deployable(conn: Connection, deployable_id: int, name: str) -> Row:
    """Lock the deployable row (shared), after its device's; BindRefused while a program
    rewrites it. Its row as committed now (``bitstream_id`` cannot change until the bind
    commits).

    A program marks the row under an exclusive lock once it saw no handle in use and
    clears the mark with its result (acceld.conductor.programming), so a bind either
    committed its handle before that check (and the program is refused with 409) or sees
    the mark here: no bind takes a handle while the device is being programmed.
    """
    row = conn.execute(_DEPLOYABLE_LOCKED, {"id": deployable_id}).first()
    if row is None:
        raise BindRefused(f"deployable {name} was removed while the bind was in progress")
    if row.programming_owner is not None and dep_db.programming_now(row, db_now(conn)):
        raise BindRefused(f"deployable {name} is being programmed by another request; no bind "
                          "takes its handles until that program ends (ask again once it has)")
    return row


def check_profile_group(conn: Connection, target: BindTarget) -> None:
    """The deployable's resource class and traits (attributes ``rc``, ``trait*``) satisfy the
    ARQ's profile group (``resources:RC``, ``trait:T = required|forbidden``)."""
    dep = target.deployable
    for key, value in conn.execute(_ATTRIBUTES, {"id": dep.id}):
        if key == "rc":
            target.resource_class = value
        elif key.startswith("trait"):
            target.traits.add(value)
    wanted = sorted(k.split(":", 1)[1] for k in target.group if k.startswith("resources:"))
    if target.resource_class not in wanted:
        offered = target.resource_class or "no resource class"
        raise BindRefused(f"deployable {dep.name} offers {offered}; the profile group asks "
                          f"for {', '.join(wanted) or 'no resources'}")
    present = target.traits | IMPLICIT_TRAITS
    for key, value in sorted(target.group.items()):
        if not key.startswith("trait:"):
            continue
        trait = key.split(":", 1)[1]
        if value == "required" and trait not in present:
            raise BindRefused(f"deployable {dep.name} lacks trait {trait}, which the profile "
                              "group requires")
        if value == "forbidden" and trait in present:
            raise BindRefused(f"deployable {dep.name} has trait {trait}, which the profile "
                              "group forbids")


def device_refusal(conn: Connection, handle_id: int, hostname: str) -> str | None:
    """Why a bind holding ``handle_id`` may no longer go Bound (its device was disabled, lost
    or removed meanwhile), checked under :func:`lock_device`'s lock; None when it may.

    For a handle prepared on its host between the bind's two transactions
    (acceld.conductor.binding.attach): a disable may commit while the agent works.
    """
    row = conn.execute(select(devices.c.uuid, deployables.c.id).select_from(
        attach_handles.join(deployables, deployables.c.id == attach_handles.c.deployable_id)
        .join(devices, devices.c.id == deployables.c.device_id)).where(
        attach_handles.c.id == handle_id)).first()
    if row is None:
        return (f"attach handle id {handle_id} was removed from host {hostname}'s inventory "
                "while the bind was in progress")
    try:
        lock_device(conn, row.uuid, row.id, hostname)
    except BindRefused as refused:
        return refused.reason
    return None


def take_handle(conn: Connection, target: BindTarget) -> None:
    """Take one free attach handle of the deployable, atomically.

    Portable compare-and-set: ``UPDATE ... SET in_use = true WHERE id = :id AND in_use =
    false``; a rowcount of 1 means this transaction won the handle (MySQL reports matched
    rows, which the ``in_use = false`` condition makes the same). A loser tries the next.
    The device and then the deployable are locked and checked again first
    (:func:`lock_device`, :func:`lock_deployable`).
    """
    dep = target.deployable
    lock_device(conn, dep.device_uuid, dep.id, dep.hostname)
    lock_deployable(conn, dep.id, dep.name)
    for _ in range(_ROUNDS):
        candidates = conn.execute(_FREE_HANDLES, {"id": dep.id}).all()
        if not candidates:
            break
        for handle in candidates:
            won = conn.execute(_TAKE_HANDLE, {"handle_id": handle.id, "at": utcnow()}).rowcount
            if won == 1:
                target.handle = handle
                return
    raise BindRefused(f"no free attach handle on deployable {dep.name}: all are in use")


Check = Callable[[Connection, BindTarget], None]

# The checks, in order; each may rely on what the ones before it found.
CHECKS: list[Check] = [find_deployable, check_host, check_agent_up, check_device_usable,
                        check_profile_group]


def check_and_take(conn: Connection, target: BindTarget) -> BindTarget:
    """Run every check, then take a handle; raises BindRefused with the first reason."""
    for check in CHECKS:
        check(conn, target)
    take_handle(conn, target)
    return target


def group_of(profile_json: str, index: int) -> dict[str, str]:
    """Group ``index`` of a profile's stored groups (empty if the index is out of range)."""
    groups = orjson.loads(profile_json)
    return groups[index] if 0 <= index < len(groups) else {}
