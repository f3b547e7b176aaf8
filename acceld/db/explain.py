"""What explain (and a claim) reads from the database: the whole fleet (or one host) in four
queries.

``GET /v2/device_profiles/{ident}/explain`` must cost the same number of queries on
two hosts as on a thousand, so nothing here is read per host, per device or per
provider: one query for the deployables with their device, agent, Placement sync
row and count of binds in flight (``BindStarted`` ARQs that have not taken their handle
yet, so one of its free handles is promised to each), one for their ``rc``/``trait*`` attributes, one for their attach handles with the
ARQ or queued release holding each, and the database's clock (programming marks are
judged by it, as binds judge them). acceld.explain decides from these rows alone.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, func, or_, select

from acceld.db.clock import db_now
from acceld.db.models import (accelerator_requests, agents, attach_handles, attributes,
                              deployables, devices, handle_releases, placement_sync)


@dataclass
class Handle:
    """One attach handle, and who holds it when it is in use."""

    uuid: str
    in_use: bool
    arq_uuid: str | None = None
    arq_state: str | None = None
    instance_uuid: str | None = None
    consumer_uuid: str | None = None  # a standalone claim's Placement consumer (API 2.8)
    release_queued: bool = False  # unbound, its host step (release) not yet run


@dataclass
class Provider:
    """One deployable (one Placement provider) with everything that decides whether it can
    take a group: its device, its host's agent, its traits and handles, its sync state."""

    row: Any  # the deployable joined with its device, agent, placement_sync row, ``pending``
    resource_class: str | None = None
    traits: set[str] = field(default_factory=set)
    handles: list[Handle] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["row"], name)


@dataclass
class Fleet:
    providers: list[Provider]
    now: dt.datetime  # the database's clock, read in the same transaction


def read_fleet(conn: Connection, hostname: str | None = None) -> Fleet:
    """Every deployable acceld knows (only ``hostname``'s when given); four queries."""
    host_filter = [] if hostname is None else [devices.c.hostname == hostname]
    arqs = accelerator_requests
    in_flight = select(arqs.c.device_rp_uuid, func.count().label("n")).where(
        arqs.c.state == "BindStarted", arqs.c.attach_handle_id.is_(None),
        arqs.c.device_rp_uuid.is_not(None)).group_by(arqs.c.device_rp_uuid).subquery()
    rows = conn.execute(
        select(deployables.c.id, deployables.c.uuid, deployables.c.name,
               deployables.c.rp_uuid, deployables.c.num_accelerators,
               deployables.c.programming_owner, deployables.c.programming_until,
               deployables.c.program_status,
               devices.c.uuid.label("device_uuid"), devices.c.hostname, devices.c.type,
               devices.c.status, devices.c.status_reason, devices.c.acc_status,
               devices.c.vanished, devices.c.health, devices.c.health_reason,
               devices.c.health_since, devices.c.quarantined, devices.c.quarantined_at,
               agents.c.state.label("agent_state"),
               agents.c.last_seen_at.label("agent_last_seen"),
               placement_sync.c.rp_uuid.label("sync_rp"),
               placement_sync.c.digest.label("sync_digest"),
               placement_sync.c.dirty.label("sync_dirty"),
               placement_sync.c.reserved.label("sync_reserved"),
               placement_sync.c.operator_reserved.label("sync_operator_reserved"),
               placement_sync.c.traits.label("sync_traits"),
               func.coalesce(in_flight.c.n, 0).label("pending"))
        .join(devices, deployables.c.device_id == devices.c.id)
        .outerjoin(agents, agents.c.hostname == devices.c.hostname)
        .outerjoin(placement_sync, placement_sync.c.rp_uuid == deployables.c.rp_uuid)
        .outerjoin(in_flight, in_flight.c.device_rp_uuid == deployables.c.rp_uuid)
        .where(*host_filter)
        .order_by(devices.c.hostname, deployables.c.name)).all()
    providers = {row.id: Provider(row) for row in rows}
    for dep_id, key, value in conn.execute(
            select(attributes.c.deployable_id, attributes.c.key, attributes.c.value)
            .join(deployables, attributes.c.deployable_id == deployables.c.id)
            .join(devices, deployables.c.device_id == devices.c.id)
            .where(*host_filter, or_(attributes.c.key == "rc",
                                     attributes.c.key.like("trait%")))
            .order_by(attributes.c.key)):
        provider = providers.get(dep_id)
        if provider is None:
            continue
        if key == "rc":
            provider.resource_class = value
        else:
            provider.traits.add(value)
    for handle in conn.execute(
            select(attach_handles.c.deployable_id, attach_handles.c.uuid,
                   attach_handles.c.in_use, accelerator_requests.c.uuid.label("arq_uuid"),
                   accelerator_requests.c.state.label("arq_state"),
                   accelerator_requests.c.instance_uuid, accelerator_requests.c.consumer_uuid,
                   handle_releases.c.id.label("release_id"))
            .join(deployables, attach_handles.c.deployable_id == deployables.c.id)
            .join(devices, deployables.c.device_id == devices.c.id)
            .outerjoin(accelerator_requests,
                       accelerator_requests.c.attach_handle_id == attach_handles.c.id)
            .outerjoin(handle_releases,
                       handle_releases.c.attach_handle_id == attach_handles.c.id)
            .where(*host_filter).order_by(attach_handles.c.id)):
        provider = providers.get(handle.deployable_id)
        if provider is not None:
            provider.handles.append(Handle(
                uuid=handle.uuid, in_use=bool(handle.in_use), arq_uuid=handle.arq_uuid,
                arq_state=handle.arq_state, instance_uuid=handle.instance_uuid,
                consumer_uuid=handle.consumer_uuid, release_queued=handle.release_id is not None))
    return Fleet(providers=list(providers.values()), now=db_now(conn))
