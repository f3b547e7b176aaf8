"""Read Placement back and repair what drifted from the database: the audit.

The sync (:mod:`acceld.conductor.placement.sync`) writes what the database
changed and trusts that Placement still holds what it wrote. Placement can
change behind acceld's back: an operator deletes or edits a provider by hand,
Placement's database is restored from a backup or wiped. The audit reads back,
per host, what Placement holds for acceld and writes only what differs:

- our providers of the host's tree, in one call (``GET /resource_providers?in_tree=
  <compute node>&required=OWNER_CYBORG``), then each one's inventories and traits
  (Placement has no call that returns those for a whole tree); a wanted provider
  that lost ``OWNER_CYBORG`` or left the tree is looked up by uuid;
- a provider missing is created; a wrong name or parent is put back (1.37); what
  differs of acceld's part of the inventory (class, total, its own reservation, units)
  or of its traits is rewritten, with the generation just read; the operator's part
  (a ``reserved`` of their own, traits acceld did not write:
  :mod:`acceld.conductor.placement.ownership`) is kept and named in one line, not drift;
- a provider of ours (``OWNER_CYBORG``) that the database does not want (a
  backup's leftover) is deleted, or, while consumers hold allocations on it,
  kept fully reserved, as the sync does with the provider of a deployable that
  went away;
- a host whose compute-node provider is gone has its providers flagged: the
  sync then waits for Nova to register the node again, as for a new host.

An unchanged host costs two reads plus two per provider, and no write to
Placement or to the database. The audit takes the hosts to look at as a list
(:meth:`PlacementSync.audit`), so that conductors can later share them out;
:class:`AuditWalk` spreads the whole list over passes, a bounded chunk at a time.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from sqlalchemy import delete, select

from acceld.clients import placement as pl
from acceld.conductor.placement import ownership
from acceld.db.models import deployables, placement_sync
from acceld.db.placement_flags import HELD, mark_dirty

if TYPE_CHECKING:
    from oslo_config import cfg

    from acceld.db.engine import Database
    from acceld.placement_model import DesiredProvider

LOG = logging.getLogger(__name__)


class PlacementSync(Protocol):
    """What an audit uses of the sync that runs it (acceld.conductor.placement.sync's
    PlacementSync, which imports this module: the audit names it only by this shape)."""

    conf: cfg.ConfigOpts
    db: Database
    client: pl.PlacementClient | None
    _hosts_waiting: Mapping[str, Any]  # hosts whose compute node the sync waits for

    def _record(self, done: list[dict[str, Any]], retry: list[str], hostname: str) -> None: ...

    def _write_provider(self, want: DesiredProvider, parent_uuid: str,
                        generation: int | None) -> int: ...

    def note_operator(self, rp_uuid: str, kept: str) -> str: ...

    def _reserve_all(self, rp_uuid: str) -> None: ...


@dataclasses.dataclass
class AuditResult:
    """What an audit looked at and what it repaired (for logs and tests)."""

    audited: list[str] = dataclasses.field(default_factory=list)
    # host -> one line per difference found (and repaired)
    repaired: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    waiting_hosts: list[str] = dataclasses.field(default_factory=list)
    failed: list[str] = dataclasses.field(default_factory=list)  # providers Placement refused


# -- scheduling -------------------------------------------------------------------------------

class AuditWalk:
    """A walk over the audited hosts, ``per_pass`` hosts per pass, one walk per interval.

    A walk starts when ``interval`` seconds have passed since the previous one started
    (at once for a new conductor) and goes on over as many passes as it needs; a host
    whose audit was cut short (Placement went away) is first again at the next pass.
    """

    def __init__(self, interval: float, per_pass: int) -> None:
        self.interval, self.per_pass = interval, per_pass
        self.next_at = 0.0
        self.queue: list[str] | None = None

    def chunk(self, now: float, scope: Callable[[], list[str]]) -> list[str]:
        """The hosts this pass audits (empty when no walk is due)."""
        if self.queue is None:
            if now < self.next_at:
                return []
            self.queue = list(scope())
            self.next_at = now + self.interval
            LOG.debug("Placement audit started over %d host(s)", len(self.queue))
        return self.queue[:self.per_pass]

    def done(self, hostname: str) -> None:
        """``hostname`` was audited: take it off the walk; end the walk when empty."""
        if self.queue and self.queue[0] == hostname:
            self.queue.pop(0)
        if not self.queue:
            self.queue = None


# -- auditing one host --------------------------------------------------------------------------

def audit_host(sync: PlacementSync, hostname: str, result: AuditResult) -> None:
    """Compare ``hostname``'s providers in Placement with the database; repair differences.

    Raises PlacementUnavailable (the caller backs off). A refusal by Placement is logged
    and that provider is left to the next full sync pass; the host's other providers go on.
    """
    from acceld.placement_model import desired_providers

    client = sync.client
    assert client is not None
    result.audited.append(hostname)
    if hostname in sync._hosts_waiting:  # the sync already waits for its compute node
        result.waiting_hosts.append(hostname)
        return
    with sync.db.read() as conn:
        desired = desired_providers(conn, [hostname],
                                    sync.conf.conductor.reserve_devices_of_down_agents)
        known = {r.rp_uuid: r for r in conn.execute(
            select(placement_sync).where(placement_sync.c.hostname == hostname))}
    compute = client.find_provider_by_name(hostname)
    if compute is None:
        if desired or known:
            with sync.db.write() as conn:
                mark_dirty(conn, hostname=hostname)
            result.waiting_hosts.append(hostname)
            LOG.info("Placement audit: compute-node provider %r is gone; its accelerator "
                     "providers are written again once Nova registers it", hostname)
        return
    owned = {p.uuid: p for p in client.owned_in_tree(compute.uuid)}
    leftovers = [p for p in owned.values() if p.uuid not in desired and p.uuid != compute.uuid]
    if leftovers:  # one the database wants on another host is that host's audit's to move
        with sync.db.read() as conn:
            elsewhere = set(conn.scalars(select(deployables.c.rp_uuid).where(
                deployables.c.rp_uuid.in_([p.uuid for p in leftovers]))))
        leftovers = [p for p in leftovers if p.uuid not in elsewhere]
    drift: list[str] = []
    kept: list[str] = []
    done: list[dict[str, Any]] = []
    try:
        for want in desired.values():
            _audit_provider(sync, want, owned.get(want.rp_uuid), compute.uuid,
                            known.get(want.rp_uuid), (drift, kept), done, result)
        for provider in leftovers:
            _audit_leftover(sync, provider, hostname, provider.uuid in known, drift, done)
    finally:  # keep what was written, even when Placement went away half-way
        if done:
            sync._record(done, [], hostname)
    if drift:  # (cut short, the host is audited again when Placement is back)
        result.repaired[hostname] = drift
        LOG.info("Placement drift repaired on host %s: %s", hostname, "; ".join(drift))
    if kept:  # not drift: the operator's part of providers acceld manages (ownership)
        LOG.info("Placement audit of host %s kept the operator's settings: %s", hostname,
                 "; ".join(kept))


def _audit_provider(sync: PlacementSync, want: DesiredProvider, provider: pl.Provider | None,
                    root_uuid: str, row: Any, lines: tuple[list[str], list[str]],
                    done: list[dict[str, Any]], result: AuditResult) -> None:
    """Read one wanted provider back and rewrite what differs of acceld's part; the
    operator's part (acceld.conductor.placement.ownership) is kept and named, not drift."""
    client = sync.client
    assert client is not None
    drift, kept = lines
    if provider is None:  # not ours in this tree: gone, moved, or lost OWNER_CYBORG
        provider = client.get_provider(want.rp_uuid)
    found: list[str] = []
    try:
        if provider is None:
            found.append(f"{want.rp_uuid} ({want.name}) missing: created")
            written = sync._write_provider(want, root_uuid, None)
        else:
            if provider.name != want.name or provider.parent_uuid != root_uuid:
                if provider.name != want.name:
                    found.append(f"{want.rp_uuid} name {provider.name!r} (want {want.name!r})")
                if provider.parent_uuid != root_uuid:
                    found.append(f"{want.rp_uuid} parent {provider.parent_uuid} "
                                 f"(want {root_uuid})")
                client.update_provider(want.rp_uuid, want.name, root_uuid)
            written = ownership.write(client, want, ownership.Record.of(row))
            found.extend(written.changes)
    except pl.PlacementUnavailable:
        raise
    except pl.PlacementError as exc:
        LOG.error("Placement refused the repair of provider %s (%s); the next full sync "
                  "pass writes it again: %s", want.name, want.rp_uuid, exc)
        done.append({"rp_uuid": want.rp_uuid, "hostname": want.hostname, "digest": None,
                     "generation": None})
        result.failed.append(want.rp_uuid)
        return
    note = sync.note_operator(want.rp_uuid, written.operator)
    if note:
        kept.append(f"{want.rp_uuid} ({want.name}) {note}")
    if found:
        drift.extend(found)
    if found or row is None or any(getattr(row, k) != v for k, v in written.record.items()):
        done.append(dict(written.record, rp_uuid=want.rp_uuid, hostname=want.hostname,
                         digest=want.digest, generation=written.generation))


def _audit_leftover(sync: PlacementSync, provider: pl.Provider, hostname: str, recorded: bool,
                    drift: list[str], done: list[dict[str, Any]]) -> None:
    """A provider of ours the database does not want: delete it, or hold it while in use."""
    client = sync.client
    assert client is not None
    allocations = client.provider_allocations(provider.uuid)
    if not allocations:
        try:
            client.delete_provider(provider.uuid)
        except pl.ProviderInUse:
            allocations = client.provider_allocations(provider.uuid) or {"?": {}}
    if not allocations:
        drift.append(f"{provider.uuid} ({provider.name}) is not in the database: deleted")
        with sync.db.write() as conn:
            conn.execute(delete(placement_sync).where(
                placement_sync.c.rp_uuid == provider.uuid,
                placement_sync.c.dirty.is_(False)))
        return
    inventories = client.get_inventories(provider.uuid)
    unreserved = any(inv["reserved"] != inv["total"] for inv in inventories.values())
    if unreserved:
        drift.append(f"{provider.uuid} ({provider.name}) is not in the database and held by "
                     f"{len(allocations)} consumer(s), but "
                     f"{ownership.inventory_text(inventories)}: "
                     "reserved again")
        sync._reserve_all(provider.uuid)
    if unreserved or not recorded:  # held: the full sync pass deletes it once it is free
        done.append({"rp_uuid": provider.uuid, "hostname": hostname, "digest": HELD,
                     "generation": None})
