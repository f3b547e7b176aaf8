"""`acceld conductor`: the internal API agents talk to, plus the conductor's background work.

The conductor is assembled from components. Each contributes internal routes
(served on ``[conductor] port``) and periodic tasks; a task marked ``exclusive``
runs on one conductor at a time when several share a database (a lease row
decides which): cloud-wide cheap sweeps. Per-host periodic work is divided among
the live conductors by a hash ring (acceld.conductor.fleet.membership): a component
with ``use_ownership`` is given this conductor's :class:`Membership` and skips
the hosts other conductors own. Components:

- binding (acceld.conductor.binding.worker): completes bind jobs, notifies Nova;
- agents and reconciliation (acceld.conductor.fleet.agents, acceld.conductor.reconcile): hello,
  heartbeats, inventory diffs, liveness;
- placement (acceld.conductor.placement.sync): mirrors inventory to Placement;
- handle release (acceld.conductor.binding.handle_release): runs queued attach-handle releases.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Protocol

from oslo_config import cfg

from acceld.conductor.fleet.membership import Membership, member_name
from acceld.db import leases
from acceld.db.nonces import DatabaseReplay
from acceld.internal.auth import CONDUCTOR, new_conductor_instance
from acceld.db.engine import Database
from acceld.internal.server import Handler, InternalServer, serve
from acceld.metrics.serve import serve as serve_metrics
from acceld.runtime.lifecycle import run_until_signalled
from acceld.runtime.secrets import cloud_keyring

LOG = logging.getLogger(__name__)

# The shortest lease of an exclusive task (the lease is three intervals, at least this).
LEASE_MIN_SECONDS = 10.0
# How long a graceful stop waits for each periodic task's pass in flight to end.
STOP_WAIT = 5.0


@dataclass
class PeriodicTask:
    name: str
    interval: float
    run: Callable[[], None]
    exclusive: bool = False  # one conductor at a time, by database lease


class Component(Protocol):
    def routes(self) -> dict[str, dict[str, Handler]]: ...
    def periodic_tasks(self) -> list[PeriodicTask]: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...


@dataclass
class Conductor:
    conf: cfg.ConfigOpts
    db: Database
    components: list[Component] = field(default_factory=list)
    instance_id: str = field(default_factory=lambda: f"conductor-{uuid.uuid4().hex[:12]}")

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.server: InternalServer | None = None
        self.membership = Membership(self.conf, self.db, member_name(self.conf))

    def start(self) -> None:
        routes: dict[str, dict[str, Handler]] = {}
        node_paths: list[str] = []  # what a node's key may call; the rest needs the cloud's
        for component in self.components:
            routes.update(component.routes())
            node_paths += getattr(component, "node_paths", list)()
        # One name for every conductor; the nonces they accept are shared in the database,
        # so a credential one accepted is refused by all (and by itself after a restart).
        # And a name of this process's own, which clients learn from its answers: only
        # this process accepts those credentials, so it remembers their nonces in memory
        # (no database write per call; acceld.internal.auth).
        self.server = serve(self.conf, cloud_keyring(self.conf, self.db), routes,
                            self.conf.conductor.host_ip, self.conf.conductor.port,
                            node_paths=node_paths, destination=CONDUCTOR,
                            replay=DatabaseReplay(self.db, self.conf.internal.credential_ttl),
                            own_destination=new_conductor_instance(),
                            outage=self.db.outage, database=self.db)
        # In the ring before any periodic task runs, so the first passes divide the hosts.
        self.membership.url = self.server.url
        try:
            self.membership.join()
        except Exception as exc:  # noqa: BLE001 - the heartbeat task joins once it can
            if not self.db.outage.is_outage(exc):
                raise
            self.db.outage.down(exc, "this conductor joins the ring once it is back")
        for component in self.components:
            if hasattr(component, "use_ownership"):
                component.use_ownership(self.membership)
            component.start()
        tasks = [PeriodicTask("conductor-heartbeat",
                              self.conf.conductor.member_heartbeat_interval,
                              self.membership.beat)]
        for component in self.components:
            tasks += component.periodic_tasks()
        for task in tasks:
            thread = threading.Thread(target=self._loop, args=(task,), daemon=True,
                                      name=f"periodic-{task.name}")
            thread.start()
            self._threads.append(thread)
        LOG.info("Conductor %s (%s in the ring) listening on %s", self.instance_id,
                 self.membership.name, self.server.url)

    def _loop(self, task: PeriodicTask) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                if not task.exclusive:
                    task.run()
                else:
                    self._run_exclusive(task)
            except Exception as exc:  # noqa: BLE001 - a failing task must not stop the others
                if self.db.outage.is_outage(exc):
                    # Logged once for the whole outage (and once when it ends), not per pass.
                    self.db.outage.down(exc, "periodic tasks retry at their intervals")
                else:
                    LOG.exception("Periodic task %s failed", task.name)
            self._stop.wait(max(0.0, task.interval - (time.monotonic() - started)))
        if task.exclusive:
            self._give_back(task.name)

    def _give_back(self, name: str) -> None:
        """Release an exclusive task's lease once its loop has ended (no pass in flight), so
        another conductor takes the task over now rather than when the lease lapses."""
        try:
            if leases.release(self.db, name, self.instance_id):
                LOG.info("Gave back lease %s", name)
        except Exception as exc:  # noqa: BLE001 - it lapses by itself
            LOG.warning("Could not give back lease %s (it lapses by itself): %s", name, exc)

    def _run_exclusive(self, task: PeriodicTask) -> None:
        """Run ``task`` only while this conductor holds its lease, renewing it meanwhile.

        A pass may outlast the lease (a placement sync over many hosts), so a renewal
        thread re-takes the lease every third of its duration until ``task.run()``
        returns; the task itself needs no knowledge of leases. The lease is kept, not
        released, after the pass: the holder renews it each interval and a crashed
        holder's lease lapses after LEASE_MIN_SECONDS at most (or three intervals).
        A renewal that finds the lease taken (the database was unreachable for longer
        than the lease) is logged; the pass cannot be interrupted, so it finishes.
        On a graceful stop the loop gives the lease back after its last pass.
        """
        seconds = max(task.interval * 3, LEASE_MIN_SECONDS)
        if not leases.acquire(self.db, task.name, self.instance_id, seconds):
            return
        done = threading.Event()

        def renew() -> None:
            while not done.wait(seconds / 3):
                try:
                    if not leases.acquire(self.db, task.name, self.instance_id, seconds):
                        LOG.error("Lease %s was lost while its task ran here; another "
                                  "conductor may run it too", task.name)
                        return
                except Exception as exc:  # noqa: BLE001 - retried at the next tick
                    if self.db.outage.is_outage(exc):  # logged once for the whole outage
                        self.db.outage.down(exc, f"lease {task.name} is renewed once it is "
                                            "back")
                    else:
                        LOG.exception("Could not renew lease %s", task.name)

        renewer = threading.Thread(target=renew, daemon=True, name=f"lease-{task.name}")
        renewer.start()
        try:
            task.run()
        finally:
            done.set()
            renewer.join()

    def stop(self) -> None:
        self._stop.set()
        # Out of the ring first: peers take this conductor's hosts at their next beat.
        self.membership.leave()
        for component in reversed(self.components):
            component.stop()
        if self.server:
            self.server.stop()
        for thread in self._threads:  # each exclusive loop gives its lease back as it ends
            thread.join(timeout=STOP_WAIT)

    def wait(self) -> None:
        """Block until SIGTERM or SIGINT, then stop."""
        run_until_signalled(self._stop, self.stop, conf=self.conf)


# The conductor's components, in start order, as "module:class"; each class takes
# (conf, db). Imported when the conductor is built: their modules import this one.
COMPONENTS: list[str] = [
    "acceld.conductor.binding.worker:BindingComponent",
    "acceld.conductor.placement.sync:PlacementSync",
    "acceld.conductor.programming:ProgrammingComponent",
    "acceld.conductor.fleet.agents:AgentsComponent",
    "acceld.conductor.binding.handle_release:HandleReleaseComponent",
    "acceld.conductor.placement.claim_allocations:ClaimAllocationComponent",
    "acceld.conductor.health.device_event_purge:DeviceEventPurge",
]


def _component(path: str, conf: cfg.ConfigOpts, db: Database) -> Component:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)(conf, db)


def build(conf: cfg.ConfigOpts, db: Database) -> Conductor:
    return Conductor(conf, db, [_component(path, conf, db) for path in COMPONENTS])


def run(conf: cfg.ConfigOpts) -> None:
    from acceld.db import migrate
    from acceld.db.engine import from_config
    from acceld.runtime.lifecycle import catch_hup_early

    catch_hup_early()
    db = from_config(conf)
    try:
        newer = migrate.check_current(db)  # a schema a newer release expanded is fine
    except migrate.SchemaNotCurrent as exc:
        raise SystemExit(f"acceld conductor: {exc}") from None
    if newer:
        LOG.warning("%s", migrate.ahead_warning(newer))
    conductor = build(conf, db)
    serve_metrics(conf, "conductor")
    conductor.start()
    conductor.wait()
