"""Mirror the accelerator inventory into Placement: one resource provider per deployable.

The database is the truth; Placement is made to match it. Per deployable the
conductor wants a provider named after the deployable (uuid
``uuid3(NAMESPACE_DNS, name)``) under the compute-node provider named after the
device's host (found by name; Nova creates it, acceld never does), with one
inventory of the deployable's ``rc`` attribute, ``total = max_unit =
num_accelerators``, and the ``trait*`` attributes plus ``OWNER_CYBORG`` as traits.
``reserved = total`` while the device is disabled (``maintaining``), quarantined for its
health, not ready (``acc_status``), vanished while in use, or its agent is down (optional).
That is all acceld owns on the provider: an operator's own ``reserved`` and traits are
read before each write and kept (:mod:`acceld.conductor.placement.ownership`), and each
write that changes something logs one line saying what.

Work is proportional to change. The ``placement_sync`` table keeps, per
provider, a digest of what was last written and a ``dirty`` flag.
``acceld.db.placement_flags.mark_dirty`` (reconcile, device enable/disable, agent liveness) flags a
host's or a device's providers; a pass every ``[placement] sync_interval``
writes the dirty hosts, and a full pass every ``full_sync_interval`` compares
every provider's digest with the database, so a change nobody flagged is still
caught. Neither pass reads Placement back: the audit
(:mod:`acceld.conductor.placement.audit`) does, a chunk of hosts per pass, every
``[placement] audit_interval`` and once at conductor start, and repairs what was
changed behind acceld's back.

Several conductors share the hosts: each syncs and audits only the hosts the
ring gives it (acceld.conductor.fleet.membership), and writes a host's providers (or
repairs them) only while it holds the host's lease (``placement:<host>``, a
row of ``leases``, :data:`HOST_LEASE_SECONDS`), taken after a read showed work
to do and followed by a fresh read: so while two conductors both think they own
a host during a rebalance, its writes are still done once. Nothing is lost on failure: a provider whose write did not finish stays
dirty (or keeps its old digest) and is written again.

Failures stay local. Placement unreachable or failing (5xx): the pass stops and
is retried with a doubling delay up to ``retry_max_delay``, the API is never
involved. A compute-node provider that does not exist yet: that host waits and
is retried with the same backoff, other hosts go on. A provider that has
allocations is not deleted when its deployable goes: it is reserved and held,
and deleted once the allocations are gone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import socket
import time
import uuid
from typing import Any, Iterable

from oslo_config import cfg
from sqlalchemy import select, update

from acceld.clients import placement as pl
from acceld.conductor.placement import ownership
from acceld.conductor.placement.audit import AuditResult, AuditWalk, audit_host
from acceld.conductor.fleet.membership import EVERYTHING, Ownership
from acceld.conductor.service import PeriodicTask
from acceld.db import leases
from acceld.db.engine import Database
from acceld.db.models import agents, deployables, devices, placement_sync, utcnow
from acceld.db.placement_flags import HELD, upsert
from acceld.placement_model import DesiredProvider, desired_providers
from acceld.metrics import record as metrics
from acceld.outages import PLACEMENT, process_log

LOG = logging.getLogger(__name__)

TASK_NAME = "placement-sync"
# How long a host's Placement writes may take before another conductor may write it:
# far above a host's few calls; also how long a host waits after a conductor died
# writing it.
HOST_LEASE_SECONDS = 60.0
# placement_sync's columns saying what on a provider is acceld's (ownership.Record).
OWNERSHIP = ("reserved", "operator_reserved", "traits")


# -- the component ----------------------------------------------------------------------------

class _HostBusy(Exception):
    """Another conductor holds the host's write lease."""


class _LeaseAtFirstWrite:
    """The Placement client during one host's audit: reads pass through; the first write
    takes the host's lease (:meth:`PlacementSync.host_lease`), or raises _HostBusy."""

    WRITES = frozenset({"update_provider", "ensure_provider", "delete_provider",
                        "ensure_resource_class", "ensure_trait", "set_inventory",
                        "set_traits"})

    def __init__(self, sync: "PlacementSync", hostname: str, client: Any) -> None:
        self._sync, self._hostname, self._client = sync, hostname, client
        self._lease: Any = None

    def __getattr__(self, name: str) -> Any:
        if name in self.WRITES and self._lease is None:
            lease = self._sync.host_lease(self._hostname)
            if not lease.__enter__():
                lease.__exit__(None, None, None)
                raise _HostBusy(self._hostname)
            self._lease = lease
        return getattr(self._client, name)

    def release(self) -> None:
        if self._lease is not None:
            self._lease.__exit__(None, None, None)
            self._lease = None


@dataclasses.dataclass
class PassResult:
    """What one pass did (for logs and tests)."""

    written: list[str] = dataclasses.field(default_factory=list)
    deleted: list[str] = dataclasses.field(default_factory=list)
    held: list[str] = dataclasses.field(default_factory=list)
    waiting_hosts: list[str] = dataclasses.field(default_factory=list)
    failed: list[str] = dataclasses.field(default_factory=list)
    audit: AuditResult | None = None  # the audit's chunk, when one ran in this pass


class _Backoff:
    """A doubling delay between retries, reset by a success."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial, self.maximum = initial, maximum
        self.delay = 0.0
        self.next_at = 0.0

    def ready(self, now: float) -> bool:
        return now >= self.next_at

    def failed(self, now: float) -> float:
        self.delay = min(self.maximum, max(self.initial, self.delay * 2))
        self.next_at = now + self.delay
        return self.delay

    def succeeded(self) -> bool:
        """Reset; True if this ended a run of failures."""
        was_failing = self.delay > 0
        self.delay, self.next_at = 0.0, 0.0
        return was_failing


class PlacementSync:
    """The conductor component that keeps Placement in step with the database."""

    def __init__(self, conf: cfg.ConfigOpts, db: Database,
                 client: pl.PlacementClient | None = None) -> None:
        self.conf = conf
        self.db = db
        self.client = client if client is not None else pl.from_conf(conf)
        opts = conf.placement
        self._backoff = _Backoff(opts.sync_interval, opts.retry_max_delay)
        self._hosts_waiting: dict[str, _Backoff] = {}
        self._next_full = 0.0
        # The audit walk: due at once, so a starting conductor reads Placement back.
        self._audit_walk = AuditWalk(opts.audit_interval, opts.audit_hosts_per_pass)
        self._clock = time.monotonic  # the audit's time budget (tests step it)
        # Agent states last synced, so that an agent going down or up is noticed at the
        # next pass even when nobody flagged its host.
        self._agent_states: dict[str, str] = {}
        # The process's outage log, shared with binding: one WARNING each way per outage.
        self.outages = process_log()
        self.ownership: Ownership = EVERYTHING
        self._lease_owner = f"{socket.gethostname()[:30]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        # What of the operator's this process last said it keeps, per provider (note_operator).
        self._operator_noted: dict[str, str] = {}

    def use_ownership(self, ownership: Ownership) -> None:
        """Sync and audit only the hosts the ring gives this conductor."""
        self.ownership = ownership

    def host_lease(self, hostname: str) -> Any:
        """The host's write lease (a context manager yielding whether it is ours)."""
        name = f"placement:{hostname}"
        if len(name) > 64:  # the lease name column; hostnames may be 255 long
            name = "placement:" + hashlib.sha256(hostname.encode()).hexdigest()[:54]
        return leases.held(self.db, name, self._lease_owner, HOST_LEASE_SECONDS)

    # Component protocol
    def routes(self) -> dict[str, dict[str, Any]]:
        return {}

    def periodic_tasks(self) -> list[PeriodicTask]:
        if self.client is None:
            return []
        return [PeriodicTask(TASK_NAME, self.conf.placement.sync_interval, self.run)]

    def start(self) -> None:
        if self.client is None:
            LOG.info("Placement is not configured ([placement] auth_type is unset): "
                     "accelerator inventory is not reported to Placement")

    def stop(self) -> None:
        pass

    # The periodic task
    def run(self) -> PassResult | None:
        """One scheduled pass: full when due, otherwise dirty hosts; skipped while backing off."""
        now = time.monotonic()
        if self.client is None or not self._backoff.ready(now):
            return None
        full = now >= self._next_full
        try:
            result = self.sync_once(full=full)
            result.audit = self._audit_step()
        except pl.PlacementUnavailable as exc:
            delay = self._backoff.failed(time.monotonic())
            # One WARNING per outage per process, shared with binding (acceld.outages);
            # the sync's retries are debug lines.
            self.outages.down(PLACEMENT, str(exc), "the inventory sync waits for it",
                              logger=LOG)
            LOG.debug("Placement sync paused; retrying in %.1f s", delay)
            return None
        if self._backoff.succeeded():  # only a pass that failed before ends the outage
            self.outages.up(PLACEMENT, LOG)
            LOG.info("Placement inventory sync resumed")
        if full:
            self._next_full = time.monotonic() + self.conf.placement.full_sync_interval
        return result

    @metrics.placement_pass
    def sync_once(self, full: bool = True) -> PassResult:
        """Write every host that needs it (all when ``full``); raises PlacementUnavailable."""
        result = PassResult()
        now = time.monotonic()
        hosts, dirty_hosts, agent_states = self._hosts_to_sync(full)
        for hostname in hosts:
            waiting = self._hosts_waiting.get(hostname)
            if waiting is not None and not waiting.ready(now):
                result.waiting_hosts.append(hostname)
                continue
            self._sync_host(hostname, full, hostname in dirty_hosts, result)
            if hostname in agent_states:
                self._agent_states[hostname] = agent_states[hostname]
        return result

    # -- the audit: read Placement back --------------------------------------------------------

    def audit_scope(self) -> list[str]:
        """The hosts the audit walks: every host acceld knows (agent, devices, providers)."""
        with self.db.read() as conn:
            hosts = set(conn.scalars(select(devices.c.hostname).distinct()
                                     .join(deployables,
                                           deployables.c.device_id == devices.c.id)))
            hosts.update(conn.scalars(select(placement_sync.c.hostname).distinct()))
            hosts.update(conn.scalars(select(agents.c.hostname)))
        return sorted(h for h in hosts if self.ownership.owns(h))

    def audit(self, hostnames: Iterable[str]) -> AuditResult:
        """Read these hosts' providers back from Placement and repair any drift.

        Raises PlacementUnavailable; the hosts audited before it are repaired.
        """
        result = AuditResult()
        for hostname in hostnames:
            self._audit_host(hostname, result)
        return result

    def _audit_host(self, hostname: str, result: AuditResult) -> None:
        """Audit one host; its first repair takes the host's write lease (an unchanged host
        costs no database write), and a host another conductor is writing is left to the
        next walk. A repair decided on reads older than the lease is still safe: each
        Placement write carries the generation it read (409 when another wrote since)."""
        real = self.client
        guard = _LeaseAtFirstWrite(self, hostname, real)
        self.client = guard  # type: ignore[assignment]
        try:
            audit_host(self, hostname, result)
        except _HostBusy:
            LOG.debug("Audit of host %s skipped: another conductor is writing it", hostname)
        finally:
            self.client = real
            guard.release()

    @metrics.placement_audit
    def _audit_step(self) -> AuditResult | None:
        """This pass's chunk of the audit walk (None when no walk is due).

        At most ``audit_hosts_per_pass`` hosts, and no more once ``sync_interval``
        seconds went on them (at least one host a pass), so that flagged writes never
        wait long behind an audit, however slow Placement answers.
        """
        started = self._clock()
        chunk = self._audit_walk.chunk(started, self.audit_scope)
        if not chunk:
            return None
        result = AuditResult()
        for hostname in chunk:
            self._audit_host(hostname, result)
            self._audit_walk.done(hostname)
            if self._clock() - started >= self.conf.placement.sync_interval:
                break
        return result

    def _hosts_to_sync(self, full: bool) -> tuple[list[str], set[str], dict[str, str]]:
        """Hosts to look at, those with flagged providers, and the agent states."""
        with self.db.read() as conn:
            dirty = set(conn.scalars(select(placement_sync.c.hostname).distinct()
                                     .where(placement_sync.c.dirty.is_(True))))
            hosts = set(dirty)
            agent_states: dict[str, str] = {}
            if self.conf.conductor.reserve_devices_of_down_agents:
                agent_states = {h: s for h, s in conn.execute(
                    select(agents.c.hostname, agents.c.state))}
                hosts.update(h for h, s in agent_states.items()
                             if self._agent_states.get(h, "up") != s)
            hosts.update(h for h, b in self._hosts_waiting.items()
                         if b.ready(time.monotonic()))
            if full:
                hosts.update(conn.scalars(select(devices.c.hostname).distinct()
                                          .join(deployables,
                                                deployables.c.device_id == devices.c.id)))
                hosts.update(conn.scalars(select(placement_sync.c.hostname).distinct()))
        return sorted(h for h in hosts if self.ownership.owns(h)), dirty, agent_states

    def _plan(self, hostname: str, full: bool, flagged: bool, claim: bool
              ) -> tuple[list[DesiredProvider], list[Any], dict[str, Any]]:
        """What the host needs written and removed, and its sync rows.

        With ``claim``, the host's dirty rows are cleared in the same transaction, so a
        change flagged after this point stays flagged for the next pass instead of being
        lost. Without (or with nothing flagged) it is only a read: no write lock for a
        comparison.
        """
        claimed: set[str] = set()
        with (self.db.write() if flagged and claim else self.db.read()) as conn:
            if flagged:
                claimed = set(conn.scalars(select(placement_sync.c.rp_uuid).where(
                    placement_sync.c.hostname == hostname,
                    placement_sync.c.dirty.is_(True))))
            if claimed and claim:
                conn.execute(update(placement_sync).where(
                    placement_sync.c.rp_uuid.in_(claimed)).values(dirty=False))
            desired = desired_providers(conn, [hostname],
                                        self.conf.conductor.reserve_devices_of_down_agents)
            rows = {r.rp_uuid: r for r in conn.execute(
                select(placement_sync).where(placement_sync.c.hostname == hostname))}
        to_write = [d for d in desired.values()
                    if d.rp_uuid in claimed or d.rp_uuid not in rows
                    or rows[d.rp_uuid].digest != d.digest]
        to_remove = [r for rp, r in rows.items() if rp not in desired
                     and (rp in claimed or full or r.digest != HELD)]
        return to_write, to_remove, rows

    def _sync_host(self, hostname: str, full: bool, flagged: bool, result: PassResult) -> None:
        to_write, to_remove, _ = self._plan(hostname, full, flagged, claim=False)
        if not to_write and not to_remove:
            self._hosts_waiting.pop(hostname, None)
            return
        # Work to do: under the host's lease, planned again (another conductor may have
        # written it since the look above), so no write is done twice.
        with self.host_lease(hostname) as mine:
            if not mine:
                LOG.debug("Host %s is being written by another conductor; its flags stay "
                          "for the next pass", hostname)
                return
            self._sync_host_leased(hostname, full, flagged, result)

    def _sync_host_leased(self, hostname: str, full: bool, flagged: bool,
                          result: PassResult) -> None:
        to_write, to_remove, rows = self._plan(hostname, full, flagged, claim=True)
        if not to_write and not to_remove:
            self._hosts_waiting.pop(hostname, None)
            return
        done: list[dict[str, Any]] = []
        try:
            if to_write:
                self._write_host(hostname, to_write, rows, done, result)
            for row in to_remove:
                self._remove(row, done, result)
        except Exception as exc:
            # Whatever stopped this host, what was not written stays flagged for the next pass.
            finished = {v["rp_uuid"] for v in done} | set(result.deleted)
            pending = [d.rp_uuid for d in to_write] + [r.rp_uuid for r in to_remove]
            unfinished = [rp for rp in pending if rp not in finished]
            self._record(done, unfinished, hostname)
            if isinstance(exc, pl.PlacementError) and \
                    not isinstance(exc, pl.PlacementUnavailable):
                # Placement refused one of this host's writes: other hosts go on.
                LOG.warning("Placement refused a write for host %s (retried next pass): %s",
                            hostname, exc)
                result.failed.extend(unfinished)
                return
            raise
        self._record(done, [], hostname)

    def _write_host(self, hostname: str, to_write: list[DesiredProvider], rows: dict[str, Any],
                    done: list[dict[str, Any]], result: PassResult) -> None:
        assert self.client is not None
        compute = self.client.find_provider_by_name(hostname)
        if compute is None:
            backoff = self._hosts_waiting.setdefault(
                hostname, _Backoff(self.conf.placement.sync_interval,
                                   self.conf.placement.retry_max_delay))
            first = backoff.delay == 0
            delay = backoff.failed(time.monotonic())
            (LOG.warning if first else LOG.debug)(
                "Compute-node provider %r not found in Placement: its %d accelerator "
                "provider(s) wait and are retried in %.1f s (Nova creates it when "
                "nova-compute starts on that host; [DEFAULT] host must match its name)",
                hostname, len(to_write), delay)
            result.waiting_hosts.append(hostname)
            self._record([], [d.rp_uuid for d in to_write], hostname)
            return
        if self._hosts_waiting.pop(hostname, None) is not None:
            LOG.info("Compute-node provider %r found in Placement (%s): writing its "
                     "accelerator providers", hostname, compute.uuid)
        for want in to_write:
            try:
                written = self._write_provider(want, compute.uuid, rows.get(want.rp_uuid))
            except pl.PlacementUnavailable:
                raise
            except pl.PlacementError as exc:
                # Refused (bad trait, inventory in use, name taken): the full pass retries it.
                LOG.error("Placement refused provider %s (%s): %s", want.name, want.rp_uuid, exc)
                done.append({"rp_uuid": want.rp_uuid, "hostname": hostname, "digest": None,
                             "generation": None})
                result.failed.append(want.rp_uuid)
                continue
            done.append(dict(written.record, rp_uuid=want.rp_uuid, hostname=hostname,
                             digest=want.digest, generation=written.generation))
            result.written.append(want.rp_uuid)
            kept = self.note_operator(want.rp_uuid, written.operator)
            if written.changes or kept:
                LOG.info("Placement provider %s (%s) written: %s", want.rp_uuid, want.name,
                         "; ".join(written.changes + ([f"kept the operator's {kept}"]
                                                      if kept else [])))

    def note_operator(self, rp_uuid: str, kept: str) -> str:
        """``kept`` (what of the operator's a write or audit kept on the provider) when this
        process has not said it yet, else "": said once, and again when it changes."""
        if self._operator_noted.get(rp_uuid, "") == kept:
            return ""
        self._operator_noted[rp_uuid] = kept
        return kept

    def _write_provider(self, want: DesiredProvider, parent_uuid: str,
                        row: Any) -> ownership.Written:
        """Create the provider if needed, then write acceld's part of its inventory and
        traits, keeping the operator's (acceld.conductor.placement.ownership)."""
        assert self.client is not None
        if row is None or row.generation is None:  # never written: it may exist (adopted)
            self.client.ensure_provider(want.rp_uuid, want.name, parent_uuid)
        try:
            return ownership.write(self.client, want, ownership.Record.of(row))
        except pl.PlacementError as exc:
            if exc.status != 404:
                raise
        # Deleted behind our back: create it again.
        self.client.ensure_provider(want.rp_uuid, want.name, parent_uuid)
        return ownership.write(self.client, want, ownership.Record.of(row))

    def _remove(self, row: Any, done: list[dict[str, Any]], result: PassResult) -> None:
        """Delete the provider of a deployable that is gone, or hold it while allocated."""
        assert self.client is not None
        allocations = self.client.provider_allocations(row.rp_uuid)
        if not allocations:
            try:
                self.client.delete_provider(row.rp_uuid)
            except pl.ProviderInUse:
                allocations = self.client.provider_allocations(row.rp_uuid) or {"?": {}}
        if allocations:
            if row.digest != HELD:
                self._reserve_all(row.rp_uuid)
                LOG.warning("Deployable of provider %s is gone but %d consumer(s) still hold "
                            "allocations (%s): provider kept, fully reserved, deleted once free",
                            row.rp_uuid, len(allocations), ", ".join(sorted(allocations)))
            done.append({"rp_uuid": row.rp_uuid, "hostname": row.hostname, "digest": HELD,
                         "generation": None})
            result.held.append(row.rp_uuid)
            return
        LOG.info("Deleted Placement provider %s: its deployable is gone", row.rp_uuid)
        with self.db.write() as conn:
            conn.execute(placement_sync.delete().where(
                placement_sync.c.rp_uuid == row.rp_uuid,
                placement_sync.c.dirty.is_(False)))
        result.deleted.append(row.rp_uuid)

    def _reserve_all(self, rp_uuid: str) -> None:
        """Stop new allocations on a held provider: reserved = total for each class."""
        assert self.client is not None
        for rc, inv in self.client.get_inventories(rp_uuid).items():
            if inv["reserved"] != inv["total"]:
                self.client.set_inventory(rp_uuid, rc, inv["total"], inv["total"])

    def _record(self, done: list[dict[str, Any]], retry: list[str], hostname: str) -> None:
        """Store what was written; flag what must be written again."""
        now = utcnow()
        owned = [v for v in done if "traits" in v]  # written: its ownership record too
        with self.db.write() as conn:
            upsert(conn, [dict(v, dirty=False, updated_at=now) for v in done
                          if "traits" not in v],
                    ["digest", "generation", "hostname", "updated_at"])
            upsert(conn, [dict(v, dirty=False, updated_at=now) for v in owned],
                    ["digest", "generation", "hostname", "updated_at", *OWNERSHIP])
            upsert(conn, [{"rp_uuid": rp, "hostname": hostname, "dirty": True,
                            "updated_at": now} for rp in retry],
                    ["dirty", "updated_at"])
        done.clear()
