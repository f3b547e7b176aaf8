"""Inventory gauges, read from the database at scrape time.

Every API replica reads the same database, so every replica shows the same
numbers, and nothing is cached that could go stale between processes. A scrape is
five aggregate queries in one read transaction (devices, attach handles, ARQs,
agents, conductors), however large the inventory: no query per row. A database that cannot be
reached makes the scrape show ``acceld_inventory_up 0`` (logged once per outage,
:mod:`acceld.outages`) instead of failing the whole page.
"""

from __future__ import annotations

import logging
import threading
from typing import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Connection, and_, func, select

from acceld.db import accelerator_requests as arq_db
from acceld.db.clock import sql_now
from acceld.db.engine import Database
from acceld.db import conductors as conductors_db
from acceld.db.models import accelerator_requests, agents, attach_handles, attributes, \
    deployables, devices
from acceld.outages import OutageLog

LOG = logging.getLogger(__name__)

ARQ_STATES = (arq_db.INITIAL, arq_db.BIND_STARTED, arq_db.BOUND, arq_db.BIND_FAILED,
              arq_db.UNBOUND, arq_db.UNBIND_FAILED, arq_db.DELETING)
AGENT_STATES = ("up", "down")
NO_RESOURCE_CLASS = "none"  # a deployable without an rc attribute

FAMILY_NAMES = ("acceld_inventory_up", "acceld_devices", "acceld_devices_quarantined",
                "acceld_attach_handles", "acceld_arqs", "acceld_agents", "acceld_agent_up",
                "acceld_agent_last_seen_seconds", "acceld_conductor_heartbeat_seconds",
                "acceld_conductor_heartbeats_written_seconds")

_DATABASE = "The database (metrics scrape)"


class InventoryCollector(Collector):
    """Yields the inventory families on each ``collect()`` (each scrape).

    ``guard`` is held for the whole read: the API's gunicorn master, which serves these,
    takes it around each fork so that no worker is forked while a scrape holds a database
    connection (acceld.metrics.serve)."""

    def __init__(self, db: Database, guard: threading.Lock | None = None) -> None:
        self.db = db
        self.guard = guard or threading.Lock()
        self.outages = OutageLog(LOG)

    def describe(self) -> list:
        return []  # collected on demand only: registering must not query the database

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily("acceld_inventory_up", "1 when this scrape read the inventory "
                               "from the database, 0 when the database could not be read.")
        try:
            with self.guard, self.db.read() as conn:
                families = read(conn)
        except Exception as exc:  # noqa: BLE001 - a scrape must answer, whatever happened
            if not self.db.outage.is_outage(exc):
                LOG.exception("Reading the inventory for metrics failed")
            self.outages.down(_DATABASE, str(exc).splitlines()[0][:300],
                              "inventory metrics are missing from scrapes")
            up.add_metric([], 0)
            yield up
            return
        self.outages.up(_DATABASE)
        up.add_metric([], 1)
        yield up
        yield from families


def read(conn: Connection) -> list[GaugeMetricFamily]:
    """The inventory families, from five aggregate queries on ``conn``."""
    return [*_devices(conn), _handles(conn), _arqs(conn), *_agents(conn), *_conductors(conn)]


def _devices(conn: Connection) -> list[GaugeMetricFamily]:
    by_all = GaugeMetricFamily("acceld_devices", "Devices in the inventory, by type, vendor, "
                               "host, status (enabled or maintaining) and health.",
                               labels=["type", "vendor", "host", "status", "health"])
    quarantined = GaugeMetricFamily("acceld_devices_quarantined", "Devices taken out of "
                                    "service for their health, by type and host.",
                                    labels=["type", "host"])
    c = devices.c
    rows = conn.execute(select(c.type, c.vendor, c.hostname, c.status, c.health, c.quarantined,
                               func.count()).group_by(c.type, c.vendor, c.hostname, c.status,
                                                      c.health, c.quarantined)).all()
    held: dict[tuple[str, str], int] = {}
    merged: dict[tuple[str, str, str, str, str], int] = {}
    for type_, vendor, host, status, health, is_quarantined, count in rows:
        key = (type_, vendor, host, status, health or "unknown")
        merged[key] = merged.get(key, 0) + count
        held.setdefault((type_, host), 0)
        if is_quarantined:
            held[(type_, host)] += count
    for key, count in sorted(merged.items()):
        by_all.add_metric(list(key), count)
    for key, count in sorted(held.items()):
        quarantined.add_metric(list(key), count)
    return [by_all, quarantined]


def _handles(conn: Connection) -> GaugeMetricFamily:
    family = GaugeMetricFamily("acceld_attach_handles", "Attach handles, by resource class of "
                               "their deployable and state (in_use or free).",
                               labels=["resource_class", "state"])
    rc = attributes.alias("rc")
    joined = attach_handles.join(deployables, deployables.c.id == attach_handles.c.deployable_id
                                 ).outerjoin(rc, and_(rc.c.deployable_id == deployables.c.id,
                                                      rc.c.key == "rc"))
    rows = conn.execute(select(rc.c.value, attach_handles.c.in_use, func.count())
                        .select_from(joined).group_by(rc.c.value, attach_handles.c.in_use)).all()
    counts: dict[str, dict[str, int]] = {}
    for value, in_use, count in rows:
        per_state = counts.setdefault(value or NO_RESOURCE_CLASS, {"in_use": 0, "free": 0})
        per_state["in_use" if in_use else "free"] += count
    for resource_class in sorted(counts):
        for state, count in counts[resource_class].items():
            family.add_metric([resource_class, state], count)
    return family


def _arqs(conn: Connection) -> GaugeMetricFamily:
    family = GaugeMetricFamily("acceld_arqs", "Accelerator requests, by state.",
                               labels=["state"])
    counts = dict.fromkeys(ARQ_STATES, 0)
    for state, count in conn.execute(select(accelerator_requests.c.state, func.count())
                                     .group_by(accelerator_requests.c.state)).all():
        counts[state] = counts.get(state, 0) + count
    for state, count in counts.items():
        family.add_metric([state], count)
    return family


def _agents(conn: Connection) -> list[GaugeMetricFamily]:
    by_state = GaugeMetricFamily("acceld_agents", "Node agents that reported, by liveness "
                                 "(up or down).", labels=["state"])
    per_host = GaugeMetricFamily("acceld_agent_up", "1 while a host's agent is up, 0 once the "
                                 "conductor marked it down.", labels=["host"])
    seen = GaugeMetricFamily("acceld_agent_last_seen_seconds", "Seconds since a host's agent "
                             "last reported, by the database's clock.", labels=["host"])
    now = sql_now(conn.dialect.name).label("db_now")
    rows = conn.execute(select(agents.c.hostname, agents.c.state, agents.c.last_seen_at, now)
                        .order_by(agents.c.hostname)).all()
    counts = dict.fromkeys(AGENT_STATES, 0)
    for row in rows:
        counts[row.state] = counts.get(row.state, 0) + 1
        per_host.add_metric([row.hostname], 1 if row.state == "up" else 0)
        seen.add_metric([row.hostname], max(0.0, (row.db_now - row.last_seen_at)
                                            .total_seconds()))
    for state, count in counts.items():
        by_state.add_metric([state], count)
    return [by_state, per_host, seen]


def _conductors(conn: Connection) -> list[GaugeMetricFamily]:
    beat = GaugeMetricFamily(
        "acceld_conductor_heartbeat_seconds", "Seconds since a conductor's last heartbeat in "
        "the conductors table, by the database's clock (its peers drop it from the ring "
        "after [conductor] member_dead_after).", labels=["conductor"])
    written = GaugeMetricFamily(
        "acceld_conductor_heartbeats_written_seconds", "Seconds since a conductor last wrote "
        "the agents' heartbeats it had answered (its heard_through mark, else its own "
        "heartbeat): the liveness sweep judges agents that much late, up to "
        "member_dead_after.", labels=["conductor"])
    for member in conductors_db.read_members(conn):
        beat.add_metric([member.name], member.age)
        written.add_metric([member.name], member.written_ago)
    return [beat, written]
