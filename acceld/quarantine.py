"""Device health: quarantine an unhealthy device, return it with hysteresis.

The conductor applies these rules to each reconciled report, and the API to an operator's
return of a device; they live below both (the API never imports the conductor). Each
reconciled report carries every device's health (acceld.drivers.health). Applied here, in
the report's transaction:

* ``unhealthy`` quarantines the device: no new bind (acceld.conductor.binding.target), its
  Placement providers ``reserved = total`` (acceld.conductor.placement.sync), one WARNING
  naming device, host and reason. ARQs already bound stay bound.
* A quarantined device returns after ``[conductor] health_recovery_reports`` healthy reports
  *in a row*; any other report (degraded, unknown, unhealthy) starts the count again, so a
  device flapping between states is not returned on each good report. With
  ``health_recovery = manual`` only an operator returns it (:func:`release_by_operator`).
* A "report" is one discovery of the node's agent: a pull whose hello announced a new
  discovery, or a hello with a new discovery count and an unchanged digest (the node still
  reports what was reconciled; :func:`count_unchanged_report`). Heartbeats between two
  discoveries repeat the same observation and do not count.

Health is its own dimension beside the operator's ``status``: nothing here reads or writes
``status``, so an operator's disable is never undone by health and health never enables
a device an operator disabled.

Locking: every change locks the device row exclusively (through its ``uuid`` index, as
reconciliation does), so a bind holding it shared either committed first (its ARQ stays
bound) or sees the quarantine; an operator's return and a report's quarantine serialise.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from oslo_config import cfg
from sqlalchemy import Connection, Row, select, true, update

from acceld.db import device_events as events
from acceld.db import placement_flags
from acceld.db.clock import sql_now
from acceld.db.models import deployables, devices
from acceld.drivers.health import HEALTHY, UNHEALTHY, UNKNOWN, Health

LOG = logging.getLogger(__name__)

AUTO = "auto"
MANUAL = "manual"


@dataclass(frozen=True)
class HealthPolicy:
    """How quarantined devices come back: ``auto`` after ``recovery_reports``, or ``manual``."""

    recovery: str = AUTO
    recovery_reports: int = 3

    @classmethod
    def from_conf(cls, conf: cfg.ConfigOpts) -> "HealthPolicy":
        return cls(conf.conductor.health_recovery, conf.conductor.health_recovery_reports)


@dataclass
class DeviceHealth:
    """The health columns of one device row."""

    health: str = UNKNOWN
    reason: str | None = None
    ok_reports: int = 0
    quarantined: bool = False

    @classmethod
    def of(cls, row: Any) -> "DeviceHealth":
        return cls(row.health, row.health_reason, row.health_ok_reports, bool(row.quarantined))


@dataclass
class Transition:
    """What one report does to one device: its new columns and the events to record."""

    after: DeviceHealth
    health_changed: bool = False
    quarantined: bool = False
    recovered: bool = False
    awaiting_operator: bool = False  # reached the count under manual recovery just now
    events: list[tuple[str, str]] = field(default_factory=list)  # (kind, detail)


def next_state(before: DeviceHealth, reported: Health, counted: bool,
               policy: HealthPolicy) -> Transition:
    """The device's health after ``reported``; pure, so the rules are tested on their own.

    ``counted`` says whether this report is a new observation (a new discovery); a repeat
    of the same one changes no count.
    """
    after = DeviceHealth(reported.state, reported.reason, before.ok_reports, before.quarantined)
    out = Transition(after)
    if (reported.state, reported.reason) != (before.health, before.reason):
        out.health_changed = True
        out.events.append((events.HEALTH_CHANGED, _describe_change(before, reported)))
    if reported.state == UNHEALTHY:
        after.ok_reports = 0
        if not before.quarantined:
            after.quarantined = True
            out.quarantined = True
            out.events.append((events.QUARANTINED,
                               f"Quarantined: health unhealthy: {reported.reason or 'no reason given'}"))
        return out
    if not before.quarantined:
        after.ok_reports = 0
        return out
    if reported.state != HEALTHY:
        after.ok_reports = 0  # degraded or unknown: not a healthy report, the count restarts
        return out
    if counted:
        after.ok_reports = before.ok_reports + 1
        if policy.recovery == MANUAL:
            after.ok_reports = min(after.ok_reports, policy.recovery_reports)
    if after.ok_reports >= policy.recovery_reports:
        if policy.recovery == AUTO:
            after.quarantined = False
            after.ok_reports = 0
            out.recovered = True
            out.events.append((events.RECOVERED,
                               f"Returned to service after {policy.recovery_reports} healthy "
                               "reports in a row"))
        elif before.ok_reports < policy.recovery_reports:
            out.awaiting_operator = True
    return out


def _describe_change(before: DeviceHealth, reported: Health) -> str:
    text = f"Health {before.health} -> {reported.state}"
    return text + (f": {reported.reason}" if reported.reason else "")


def lock_device_row(conn: Connection, device_id: int) -> Row | None:
    """The device row, locked exclusively through its ``uuid`` index and then the row: the
    order reconciliation and host retirement use (MariaDB locks index entries; see
    acceld.db.inventory._lock_device)."""
    uuid = conn.execute(select(devices.c.uuid).where(devices.c.id == device_id)).scalar()
    if uuid is None:
        return None
    conn.execute(select(devices.c.id).where(devices.c.uuid == uuid).with_for_update())
    return conn.execute(select(devices).where(devices.c.id == device_id)
                        .with_for_update()).first()


def _needs_write(row: Any, reported: Health, counted: bool) -> bool:
    """Whether a report may change anything, judged on the unlocked read (cheap path: an
    unchanged healthy node locks nothing and writes nothing)."""
    if (reported.state, reported.reason) != (row.health, row.health_reason):
        return True
    if reported.state == UNHEALTHY:
        return not row.quarantined
    if not row.quarantined:
        return False
    return (reported.state == HEALTHY and counted) or (
        reported.state != HEALTHY and row.health_ok_reports != 0)


def apply_reported(conn: Connection, hostname: str,
                   reported: Iterable[tuple[Any, int, Health]], counted: bool,
                   policy: HealthPolicy, inserted: Mapping[int, Any] | None = None) -> set[str]:
    """Apply each ``(row read by the diff or None, device id, health)`` of one node's report,
    in the caller's transaction; returns the Placement providers to flag.

    ``inserted`` holds the rows of devices this transaction added, by id: no other
    transaction sees them before it commits, so they are neither locked nor read again."""
    dirty: set[str] = set()
    for row, device_id, health in reported:
        new = inserted.get(device_id) if inserted else None
        if new is not None:
            if _needs_write(new, health, counted):
                dirty |= _apply_one(conn, hostname, new, health, counted, policy)
            continue
        if row is not None and not _needs_write(row, health, counted):
            continue
        locked = lock_device_row(conn, device_id)
        if locked is None:
            continue
        dirty |= _apply_one(conn, hostname, locked, health, counted, policy)
    return dirty


def _apply_one(conn: Connection, hostname: str, row: Any, reported: Health, counted: bool,
               policy: HealthPolicy) -> set[str]:
    change = next_state(DeviceHealth.of(row), reported, counted, policy)
    after = change.after
    values: dict[str, Any] = {}
    if change.health_changed:
        values.update(health=after.health, health_reason=after.reason,
                      health_since=sql_now(conn.dialect.name))
    if after.ok_reports != row.health_ok_reports:
        values["health_ok_reports"] = after.ok_reports
    if after.quarantined != bool(row.quarantined):
        values["quarantined"] = after.quarantined
        values["quarantined_at"] = sql_now(conn.dialect.name) if after.quarantined else None
    if values:
        conn.execute(update(devices).where(devices.c.id == row.id).values(**values))
    for kind, detail in change.events:
        events.record(conn, row.uuid, hostname, kind, detail)
    if change.quarantined:
        LOG.warning("Device %s on host %s quarantined: health unhealthy: %s; no new bind "
                    "takes it, its bound ARQs stay bound", row.uuid, hostname,
                    reported.reason or "no reason given")
    elif change.recovered:
        LOG.info("Device %s on host %s returned to service after %d healthy reports in a "
                 "row", row.uuid, hostname, policy.recovery_reports)
    elif change.awaiting_operator:
        LOG.info("Device %s on host %s has been healthy for %d reports; quarantined until an "
                 "operator returns it ([conductor] health_recovery = manual)", row.uuid,
                 hostname, policy.recovery_reports)
    elif change.health_changed:
        LOG.info("Device %s on host %s health %s -> %s%s", row.uuid, hostname, row.health,
                 after.health, f": {after.reason}" if after.reason else "")
    if change.quarantined or change.recovered:
        return _providers(conn, row.id)
    return set()


def _providers(conn: Connection, device_id: int) -> set[str]:
    return {rp for rp in conn.execute(select(deployables.c.rp_uuid).where(
        deployables.c.device_id == device_id)).scalars() if rp}


def count_unchanged_report(conn: Connection, hostname: str, policy: HealthPolicy) -> None:
    """A new discovery whose hardware (and so health) is what was reconciled: one more
    healthy report for the host's quarantined healthy devices. A host without any costs one
    indexed SELECT."""
    ids = conn.execute(select(devices.c.id).where(
        devices.c.hostname == hostname, devices.c.quarantined == true(),
        devices.c.health == HEALTHY).order_by(devices.c.id)).scalars().all()
    dirty: set[str] = set()
    for device_id in ids:
        row = lock_device_row(conn, device_id)
        if row is None or not row.quarantined or row.health != HEALTHY:
            continue
        dirty |= _apply_one(conn, hostname, row, Health(row.health, row.health_reason),
                            True, policy)
    if dirty:
        placement_flags.flag_providers(conn, hostname, dirty)


class NotQuarantined(Exception):
    """An operator asked to return a device that is not quarantined."""


class StillUnhealthy(Exception):
    """An operator asked to return a device whose last report is still unhealthy."""


def release_by_operator(conn: Connection, device_id: int, actor: str | None,
                        reason: str | None) -> None:
    """Return a quarantined device to service (the operator's word, any recovery mode),
    under the device row's lock; refused while its last report is unhealthy (the next
    report would quarantine it again)."""
    row = lock_device_row(conn, device_id)
    if row is None or not row.quarantined:
        raise NotQuarantined()
    if row.health == UNHEALTHY:
        raise StillUnhealthy(row.health_reason)
    conn.execute(update(devices).where(devices.c.id == row.id).values(
        quarantined=False, quarantined_at=None, health_ok_reports=0))
    detail = "Returned to service by an operator" + (f": {reason}" if reason else "")
    events.record(conn, row.uuid, row.hostname, events.RECOVERED, detail, actor=actor)
    placement_flags.flag_providers(conn, row.hostname, _providers(conn, row.id))
    LOG.info("Device %s on host %s returned to service by an operator (%s)", row.uuid,
             row.hostname, actor or "unknown user")
