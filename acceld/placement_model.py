"""What Placement should hold for each deployable, derived from the database's rows.

The conductor's Placement sync writes it (acceld.conductor.placement.sync) and audits it
(acceld.conductor.placement.audit); the API's explain (acceld.explain) judges providers
against it. It lives below both so the API never imports the conductor; so does the
ownership rule (what of a provider is acceld's and what the operator's:
acceld.conductor.placement.ownership says how it is used), which both judge by.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from typing import Any, Iterable

from sqlalchemy import Connection, or_, select

from acceld.clients import placement as pl
from acceld.db.models import agents, attributes, deployables, devices
from acceld.db.placement_flags import provider_uuid

LOG = logging.getLogger(__name__)

_NAME_RE = re.compile(r"^[A-Z0-9_]{1,255}$")
# Traits Placement gives every acceld provider although no driver reports them: a profile
# may require them, and a profile that forbids them can never be satisfied.
IMPLICIT_TRAITS = frozenset({pl.OWNER_TRAIT})


@dataclasses.dataclass(frozen=True)
class DesiredProvider:
    """What Placement should hold for one deployable."""

    rp_uuid: str
    name: str
    hostname: str
    resource_class: str | None
    total: int
    reserved: int
    traits: tuple[str, ...]

    @property
    def digest(self) -> str:
        payload = json.dumps(dataclasses.asdict(self), sort_keys=True).encode()
        return hashlib.sha256(payload).hexdigest()


def desired_providers(conn: Connection, hostnames: Iterable[str] | None,
                      reserve_down_agents: bool) -> dict[str, DesiredProvider]:
    """The providers the database asks for (all hosts when ``hostnames`` is None); 2 queries."""
    host_filter = [] if hostnames is None else [devices.c.hostname.in_(list(hostnames))]
    rows = conn.execute(
        select(deployables.c.id, deployables.c.name, deployables.c.rp_uuid,
               deployables.c.num_accelerators, devices.c.hostname, devices.c.status,
               devices.c.acc_status, devices.c.vanished, devices.c.quarantined,
               agents.c.state.label("agent_state"))
        .join(devices, deployables.c.device_id == devices.c.id)
        .outerjoin(agents, agents.c.hostname == devices.c.hostname)
        .where(*host_filter)).all()
    attrs: dict[int, dict[str, str]] = {}
    for dep_id, key, value in conn.execute(
            select(attributes.c.deployable_id, attributes.c.key, attributes.c.value)
            .join(deployables, attributes.c.deployable_id == deployables.c.id)
            .join(devices, deployables.c.device_id == devices.c.id)
            .where(*host_filter,
                   or_(attributes.c.key == "rc", attributes.c.key.like("trait%")))):
        attrs.setdefault(dep_id, {})[key] = value
    out: dict[str, DesiredProvider] = {}
    for row in rows:
        out_row = desired_provider(row, attrs.get(row.id, {}), reserve_down_agents)
        out[out_row.rp_uuid] = out_row
    return out


def desired_provider(row: Any, attrs: dict[str, str], reserve_down_agents: bool
                     ) -> DesiredProvider:
    """What Placement should hold for one deployable row (also explain's yardstick)."""
    rc = attrs.get("rc")
    if rc is not None and not _NAME_RE.match(rc):
        LOG.warning("Deployable %s: resource class %r is not a valid Placement name; "
                    "no inventory is offered", row.name, rc)
        rc = None
    traits = []
    for key in sorted(k for k in attrs if k.startswith("trait")):
        if _NAME_RE.match(attrs[key]):
            traits.append(attrs[key])
        else:
            LOG.warning("Deployable %s: trait %r is not a valid Placement name; skipped",
                        row.name, attrs[key])
    total = max(0, int(row.num_accelerators or 0))
    unavailable = (row.status == "maintaining" or row.acc_status != "ready"
                   or bool(row.vanished) or bool(row.quarantined)
                   or (reserve_down_agents and row.agent_state == "down"))
    return DesiredProvider(
        rp_uuid=row.rp_uuid or provider_uuid(row.name), name=row.name, hostname=row.hostname,
        resource_class=rc, total=total, reserved=total if unavailable else 0,
        traits=tuple(sorted(set(traits) | {pl.OWNER_TRAIT})))


# -- ownership: what of a provider is acceld's, what the operator's (docs/placement.md) --

@dataclasses.dataclass(frozen=True)
class Record:
    """What acceld remembers of a provider (a ``placement_sync`` row's ownership columns)."""

    reserved: int | None = None  # the inventory's reserved as acceld last wrote or read it
    operator_reserved: int = 0
    traits: frozenset[str] = frozenset()  # every trait acceld has written on the provider

    @classmethod
    def of(cls, row: Any) -> "Record":
        if row is None:
            return cls()
        return cls(reserved=row.reserved, operator_reserved=row.operator_reserved or 0,
                   traits=frozenset((row.traits or "").split()))


def own_traits(want: DesiredProvider) -> set[str]:
    return set(want.traits) | {pl.OWNER_TRAIT}


def operator_reserved(want: DesiredProvider, inventories: dict[str, dict[str, Any]],
                      record: Record) -> int:
    """The operator's reserved on the provider, from what Placement holds now."""
    current = inventories.get(want.resource_class or "")
    if current is None:
        return record.operator_reserved
    last = record.reserved if record.reserved is not None else want.reserved
    return int(current["reserved"]) if current["reserved"] != last else record.operator_reserved


def inventories_for(want: DesiredProvider, operator: int) -> dict[str, dict[str, Any]]:
    """The inventories the provider should hold: acceld's, with the operator's reserved."""
    if not want.resource_class or want.total <= 0:
        return {}
    return {want.resource_class: {
        "total": want.total, "max_unit": want.total, "min_unit": 1, "step_size": 1,
        "reserved": min(want.total, max(want.reserved, operator, 0)), "allocation_ratio": 1.0}}


def traits_for(want: DesiredProvider, current: set[str], record: Record) -> set[str]:
    """The traits the provider should hold: acceld's own and the operator's."""
    own = own_traits(want)
    return own | (current - own - record.traits)
